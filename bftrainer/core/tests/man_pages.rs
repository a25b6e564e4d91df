//! job_submit_bftrainer(8) (docs/man, hand-written: the plugins have no clap definition
//! to generate it from) names every `--elastic=` key the parser accepts and every
//! `[policy]` key the plugin reads, so that a new key cannot ship undocumented.

use bftrainer_core::config::POLICY_KEYS;
use bftrainer_core::spec::KEYS;

fn page() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/man/job_submit_bftrainer.8"
    );
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn plugin_man_page_names_every_elastic_key_and_policy_key() {
    let page = page();
    // Each key is the start of a tagged paragraph: `.BI up= SECONDS`, `.BR role= ...`.
    let tagged = |key: &str, sep: &str| {
        page.lines().any(|l| {
            [".B ", ".BI ", ".BR "]
                .iter()
                .any(|m| l.starts_with(&format!("{m}{key}{sep}")))
        })
    };
    let missing: Vec<&str> = KEYS
        .iter()
        .filter(|k| !tagged(k, "=") && !page.contains(&format!(" {k}= ")))
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "--elastic= keys not in job_submit_bftrainer(8): {missing:?}"
    );
    let missing: Vec<&str> = POLICY_KEYS
        .iter()
        .filter(|k| !tagged(k, " "))
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "[policy] keys not in job_submit_bftrainer(8): {missing:?}"
    );
}
