//! `bftrainerd --check-config`, the preflight of docs/admin.md: it checks the file as
//! bftrainerd and as job_submit/bftrainer read it, so that a file slurmctld's plugin
//! would refuse is caught before slurmctld reads it.

use std::process::Command;

fn check(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("bftrainer.toml");
    let text = text.replace("STATE", &dir.path().display().to_string());
    std::fs::write(&conf, text).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_bftrainerd"))
        .arg("--check-config")
        .arg("--config")
        .arg(&conf)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), out)
}

#[test]
fn check_config_checks_the_plugins_policy_too() {
    // The example, with a state directory that exists.
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conf/bftrainer.toml"
    ))
    .unwrap()
    .replace("/var/lib/bftrainer", "STATE");
    let (code, out) = check(&example);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok (job_submit/bftrainer: partition=elastic satellite_partition=elastic-sat"),
        "{out}"
    );
    // Keys only the plugin checks: refused, with the plugin's message.
    let daemon = "[daemon]\nstate_dir = \"STATE\"\n";
    let (code, out) = check(&format!("[policy]\nmax_nodes = 0\n{daemon}"));
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("job_submit/bftrainer would refuse this file: ")
            && out.contains("[policy] max_nodes: 0 is out of range"),
        "{out}"
    );
    let (code, out) = check(&format!(
        "[policy]\nallowed_users = [\"root\", \"no-such-user-bft\"]\n{daemon}"
    ));
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("would refuse elastic jobs: ")
            && out.contains("[policy] allowed_users 'no-such-user-bft' that cannot be looked up"),
        "{out}"
    );
}
