//! `bftrainer solve` end to end: the binary reads an instance on stdin, prints the
//! allocation, and rejects bad instances with what and where and a non-zero exit.

use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .arg("solve")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bftrainer");
    // The binary may exit before reading (bad flags): a broken pipe is fine here.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The example, completed: 6 nodes, J1 holds n3 and can grow, J2 is new.
fn example() -> Value {
    json!({
        "t_fwd_s": 10,
        "nodes": ["n1", "n2", "n3", "n4", "n5", "n6"],
        "jobs": [
            {"id": "J1", "min_nodes": 1, "max_nodes": 4, "scale_up_s": 18, "scale_down_s": 12,
             "curve": [[1, 2831.0], [2, 5259.0], [4, 9988.0]], "nodes": ["n3"]},
            {"id": "J2", "min_nodes": 2, "max_nodes": 2, "scale_up_s": 18, "scale_down_s": 12,
             "curve": [[1, 1000.0], [2, 1900.0]], "nodes": []}
        ]
    })
}

#[test]
fn solves_the_example() {
    // Two jobs of no named user are two users: J2 asks for 2 nodes at most, so J1's
    // share is the other 4 (max-min fair); the normalised objective is not the example's.
    let (code, out, err) = run(&[], &example().to_string());
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let sizes: Vec<usize> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["nodes"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [4, 2], "{v}");
    // The allocator on the instance as given.
    let (code, out, err) = run(&["--no-fair-share"], &example().to_string());
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["objective"], "bftrainer");
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs[0]["id"], "J1");
    let j1: Vec<&str> = jobs[0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let j2: Vec<&str> = jobs[1]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    // Growing J1 from 1 to 4 nodes gains 10*(9988-2831) and costs 18*2831; J2 takes 2.
    assert_eq!(j1.len(), 4);
    assert!(
        j1.contains(&"n3"),
        "J1 must keep its node (no migration): {j1:?}"
    );
    assert_eq!(j2.len(), 2);
    assert!(j1.iter().all(|n| !j2.contains(n)));
    let expected = 10.0 * 9988.0 - 18.0 * 2831.0 + 10.0 * 1900.0;
    assert!((v["objective_value"].as_f64().unwrap() - expected).abs() < 1e-6);
}

#[test]
fn t_fwd_flag_overrides_the_instance() {
    // With Tfwd = 2 s, growing J1 does not pay for its 18 s rescale.
    let (code, out, err) = run(&["--t-fwd", "2", "--compact"], &example().to_string());
    assert_eq!(code, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["jobs"][0]["nodes"], json!(["n3"]));
}

#[test]
fn every_objective_runs() {
    let mut inst = example();
    inst["jobs"][0]["remaining_work"] = json!(5e6);
    inst["jobs"][1]["remaining_work"] = json!(1e5);
    for o in [
        "bftrainer",
        "efficiency",
        "fairness",
        "remaining-work",
        "reclaim-aware",
    ] {
        let (code, out, err) = run(&["--objective", o], &inst.to_string());
        assert_eq!(code, 0, "{o}: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["objective"], o);
        assert!(v["objective_value"].is_number(), "{o}: {out}");
    }
}

#[test]
fn batch_sizes_are_chosen() {
    let inst = json!({
        "nodes": ["a", "b", "c", "d"],
        "jobs": [{"id": "E", "min_nodes": 1, "max_nodes": 4, "scale_up_s": 0, "scale_down_s": 0,
                  "batch_curves": [
                      {"batch_size": 256, "curve": [[1, 100.0], [4, 200.0]]},
                      {"batch_size": 1024, "curve": [[1, 50.0], [4, 380.0]]}]}]
    });
    let (code, out, err) = run(&[], &inst.to_string());
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["jobs"][0]["batch_size"], 1024);
    assert_eq!(v["jobs"][0]["nodes"].as_array().unwrap().len(), 4);
}

fn rejects(inst: Value, args: &[&str], needles: &[&str]) {
    let (code, out, err) = run(args, &inst.to_string());
    assert_ne!(code, 0, "accepted: {out}");
    assert!(
        out.is_empty(),
        "printed an allocation for a bad instance: {out}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn rejects_bad_instances_with_what_and_where() {
    let mut v = example();
    v["jobs"][1]["nodes"] = json!(["n9"]);
    rejects(
        v,
        &[],
        &["jobs[1]", "J2", "n9", "not in the top-level nodes"],
    );

    let mut v = example();
    v["jobs"][1]["nodes"] = json!(["n3"]);
    rejects(v, &[], &["jobs[1]", "nodes[0]", "also held by jobs[0]"]);

    let mut v = example();
    v["jobs"][0]["min_nodes"] = json!(5);
    rejects(v, &[], &["jobs[0]", "min_nodes 5 > max_nodes 4"]);

    let mut v = example();
    v["jobs"][0]["curve"] = json!([[2, 5259.0], [4, 9988.0]]);
    rejects(v, &[], &["jobs[0]", "curve[0]", "must start at 1"]);

    let mut v = example();
    v["jobs"][0]["curve"] = json!([[1, 2831.0], [4, 9988.0], [3, 9000.0]]);
    rejects(v, &[], &["jobs[0]", "curve[2]", "increase strictly"]);

    let mut v = example();
    v["jobs"][0]["curve"] = json!([[1, -1.0]]);
    rejects(v, &[], &["curve[0]", "negative"]);

    let mut v = example();
    v["jobs"][0]["scale_up_s"] = json!(-3);
    rejects(v, &[], &["jobs[0]", "scale_up_s", ">= 0"]);

    let mut v = example();
    v["nodes"] = json!(["n1", "n2", "n3", "n3"]);
    rejects(v, &[], &["nodes[3]", "listed twice"]);

    rejects(example(), &["--t-fwd", "NaN"], &["t_fwd_s", "NaN"]);
    rejects(
        example(),
        &["--objective", "fastest"],
        &["unknown objective", "bftrainer"],
    );

    let mut v = example();
    v["jobs"][0]["remaining_work"] = json!(1.0);
    rejects(
        v,
        &["--objective", "remaining-work"],
        &["jobs[1]", "remaining_work", "missing"],
    );

    let (code, _, err) = run(&[], "{\"nodes\": [], \"jobs\": [{\"id\": \"x\"}]}");
    assert_ne!(code, 0);
    assert!(err.contains("missing field"), "{err}");
    let (code, _, err) = run(&[], "{\"nodes\": [\"a\"], \"jobs\": [], \"t_fwd_s\": NaN}");
    assert_ne!(code, 0);
    assert!(err.contains("cannot parse"), "{err}");
}
