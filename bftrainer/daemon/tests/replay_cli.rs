//! The real `bftrainer replay` binary on the embedded sample (no Slurm): plot formats,
//! `--compare` with policy files and repeated `--t-fwd`, and their errors.

use std::path::Path;
use std::process::{Command, Output};

fn replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .arg("replay")
        .args(args)
        .output()
        .expect("run bftrainer")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_plot_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = replay(&[
        "--hours",
        "1",
        "--plots",
        dir.path().to_str().unwrap(),
        "--plot-format",
        "gif",
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("--plot-format: 'gif' is not a plot format; expected svg, png or both"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // --plot-format needs --plots.
    let o = replay(&["--hours", "1", "--plot-format", "png"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("--plots"), "{}", text(&o).1);
}

#[test]
fn plots_in_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = replay(&["--hours", "2", "--plots", d, "--plot-format", "both"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for stem in [
        "idle_vs_harvested",
        "nodes_per_job",
        "cumulative_samples",
        "idle_fragments",
    ] {
        for ext in ["svg", "png"] {
            let p = dir.path().join(format!("{stem}.{ext}"));
            assert!(out.contains(&format!("plot: {}", p.display())), "{out}");
            let bytes = std::fs::read(&p).unwrap();
            if ext == "png" {
                assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", p.display());
            } else {
                assert!(bytes.starts_with(b"<svg"), "{}", p.display());
            }
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// The value of a table row, split into its columns.
fn row(table: &str, label: &str) -> Vec<String> {
    let l = table
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label} in\n{table}"));
    l.trim_start()[label.len()..]
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Two policy files: one table, a column per policy, each column's figures those of
/// the policy replayed alone (its JSON report).
#[test]
fn compare_two_policy_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "now.toml", "name = \"now\"\nt_fwd = 10\n");
    let b = write(
        dir.path(),
        "patient.toml",
        "t_fwd = 600\nobjective = \"efficiency\"\n",
    );
    let o = replay(&["--hours", "3", "--compare", &a, &b]);
    let (table, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(table.starts_with("BFTrainer replay: 2 policies on the same input\n"));
    assert_eq!(row(&table, "policy"), ["now", "patient"]);
    assert_eq!(row(&table, "t-fwd"), ["10 s", "600 s"]);
    assert_eq!(row(&table, "objective"), ["bftrainer", "efficiency"]);
    // Without thousands separators, as JSON has them.
    let harvested: Vec<String> = row(&table, "harvested node-hours")
        .iter()
        .map(|v| v.replace(',', ""))
        .collect();
    let completed = row(&table, "jobs completed");
    for (i, args) in [
        ["--t-fwd", "10", "--objective", "bftrainer"],
        ["--t-fwd", "600", "--objective", "efficiency"],
    ]
    .iter()
    .enumerate()
    {
        let mut all = vec!["--hours", "3", "--json"];
        all.extend_from_slice(args);
        let o = replay(&all);
        assert!(o.status.success(), "{}", text(&o).1);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let r = &v["report"];
        assert_eq!(
            harvested[i],
            format!("{:.1}", r["harvested_node_h"].as_f64().unwrap())
        );
        assert_eq!(
            completed[i],
            format!("{} of {}", r["jobs_completed"], r["jobs_submitted"])
        );
    }
    // --json: a list, one entry per policy.
    let o = replay(&["--hours", "3", "--compare", &a, &b, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1]["policy"], "patient");
    assert_eq!(list[1]["settings"]["t_fwd_s"], 600.0);
    assert_eq!(
        format!(
            "{:.1}",
            list[0]["report"]["harvested_node_h"].as_f64().unwrap()
        ),
        harvested[0]
    );
}

#[test]
fn repeated_t_fwd_compares() {
    let o = replay(&["--hours", "2", "--t-fwd", "10", "--t-fwd", "600"]);
    let (table, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(row(&table, "policy"), ["t-fwd 10", "t-fwd 600"]);
    let o = replay(&[
        "--hours",
        "2",
        "--t-fwd",
        "10,600",
        "--objective",
        "bftrainer,fairness",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert_eq!(row(&text(&o).0, "policy").len(), 4);
}

#[test]
fn compare_errors_name_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.toml", "t_fwd = 60\n");
    let bad = write(dir.path(), "bad.toml", "t_fwd = 60\ntfwd = 600\n");
    let o = replay(&["--hours", "1", "--compare", &good, &bad]);
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(
        err.contains(&format!(
            "{bad}: tfwd: unknown key; allowed keys: name, objective, t_fwd, max_jobs, grace, curve, steps, release_before, reclaim_hold, start_latency, core_loss"
        )),
        "{err}"
    );
    let o = replay(&["--hours", "1", "--compare", &good, "/nonexistent/p.toml"]);
    assert!(
        text(&o).1.contains("cannot read /nonexistent/p.toml"),
        "{}",
        text(&o).1
    );
    let o = replay(&["--hours", "1", "--compare", &good, &good]);
    assert!(
        text(&o).1.contains("already the name of another policy"),
        "{}",
        text(&o).1
    );
    let o = replay(&["--compare", &good, "--t-fwd", "10,20"]);
    assert!(
        text(&o)
            .1
            .contains("--compare takes each policy from its file"),
        "{}",
        text(&o).1
    );
    let o = replay(&["--compare", &good, "--csv", "/tmp/x.csv"]);
    assert!(!o.status.success());
    let o = replay(&["--journal", "/nonexistent.jsonl", "--t-fwd", "10,20"]);
    assert!(
        text(&o).1.contains("--journal replays under one policy"),
        "{}",
        text(&o).1
    );
}

/// A font that cannot be used stops `--plots` before the replay, naming it.
#[test]
fn plot_font_errors_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    let junk = write(dir.path(), "junk.ttf", "not a font");
    for (font, msg) in [
        (
            "/nonexistent.ttf".to_string(),
            "BFTRAINER_PLOT_FONT=/nonexistent.ttf: cannot read the font".to_string(),
        ),
        (
            junk.clone(),
            format!("{junk}: not a TrueType/OpenType font"),
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_bftrainer"))
            .args(["replay", "--hours", "1", "--plots"])
            .arg(&plots)
            .env("BFTRAINER_PLOT_FONT", &font)
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert!(!o.status.success());
        assert!(err.contains(&msg), "{err}");
        assert!(!out.contains("BFTrainer replay"), "{out}");
        assert!(!plots.exists());
    }
}

/// bftrainerd's rules: on by default and named in the report; each flag changes its
/// rule, `--no-daemon-rules` turns all off (and refuses to be mixed with them); a
/// journal replay refuses them (it has no job model).
#[test]
fn daemon_rules_are_on_by_default_and_switchable() {
    let rules_line = |args: &[&str]| {
        let o = replay(args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        out.lines()
            .find(|l| l.trim_start().starts_with("daemon rules "))
            .unwrap_or_else(|| panic!("no rules line in {out}"))
            .split_whitespace()
            .skip(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        rules_line(&["--hours", "1"]),
        "release-before 30 s, reclaim-hold 10 s, start-latency 1 s, core-loss job"
    );
    assert_eq!(
        rules_line(&[
            "--hours",
            "1",
            "--release-before",
            "0",
            "--reclaim-hold",
            "5",
            "--start-latency",
            "2.5",
            "--core-loss",
            "node"
        ]),
        "release-before off, reclaim-hold 5 s, start-latency 2.5 s, core-loss node"
    );
    assert!(rules_line(&["--hours", "1", "--no-daemon-rules"]).starts_with("none"));
    let json = |args: &[&str]| -> serde_json::Value {
        let o = replay(args);
        assert!(o.status.success(), "{}", text(&o).1);
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let on = json(&["--hours", "3", "--json"]);
    let off = json(&["--hours", "3", "--json", "--no-daemon-rules"]);
    assert_eq!(on["settings"]["daemon_rules"]["release_before_s"], 30.0);
    assert_eq!(off["settings"]["daemon_rules"]["core_loss"], "node");
    let h = |v: &serde_json::Value| v["report"]["harvested_node_h"].as_f64().unwrap();
    assert!(h(&on) < h(&off), "{} {}", h(&on), h(&off));
    assert!(on["report"]["released_nodes"].as_u64().unwrap() > 0);
    assert_eq!(off["report"]["released_nodes"], 0);
    for bad in [
        vec!["--no-daemon-rules", "--reclaim-hold", "3"],
        vec!["--journal", "j.jsonl", "--start-latency", "2"],
    ] {
        let o = replay(&bad);
        assert!(!o.status.success());
        assert!(text(&o).1.contains("cannot be used with"), "{}", text(&o).1);
    }
    let o = replay(&["--hours", "1", "--release-before=-5"]);
    assert!(!o.status.success());
    assert!(
        text(&o)
            .1
            .contains("release-before must be seconds from 0 to 86400, found -5"),
        "{}",
        text(&o).1
    );
}
