//! The real `bftrainer replay --from-sacct START END` against a test cluster: a few
//! regular jobs run, then the CLI rebuilds the idle fragments from slurmdbd and replays
//! an elastic job on them; the report is checked against figures worked out from the
//! accounting records themselves.

use bftrainer_core::sacct::expand_hostlist;
use bftrainer_testcluster::{Cluster, Options};
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// (start, end, nodes) of a finished job, from `sacct` once its end is recorded
/// (accounting is written asynchronously).
fn record(c: &Cluster, id: u32) -> (i64, i64, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = c
            .command("sacct")
            .env("SLURM_TIME_FORMAT", "%s")
            .args(["-n", "-X", "-P", "-o", "Start,End,NodeList", "-j"])
            .arg(id.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(l) = text.lines().next() {
            let f: Vec<&str> = l.split('|').collect();
            if let [s, e, nodes] = f[..] {
                if let (Ok(s), Ok(e)) = (s.parse(), e.parse()) {
                    return (s, e, expand_hostlist(nodes).unwrap());
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no accounting record with an end for job {id}: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn cluster_replay_from_sacct_cli_reports_the_recorded_idle_time() {
    let c = Cluster::start(Options {
        nodes: 4,
        ..Default::default()
    })
    .expect("start a test cluster");
    let t0 = now() - 1;
    // Back to back, so the elastic job's nodes are claimed by each in turn.
    let mut ids = Vec::new();
    for (n, secs) in [(2, 3), (1, 2), (4, 2)] {
        let id = c
            .sbatch(&[format!("-N{n}"), "--wrap".into(), format!("sleep {secs}")])
            .unwrap();
        c.wait_for_state(id, &["COMPLETED"], Duration::from_secs(60))
            .unwrap();
        ids.push(id);
    }
    let recs: Vec<(i64, i64, Vec<String>)> = ids.iter().map(|&id| record(&c, id)).collect();
    let t1 = now() + 2;
    // One elastic job: 1..4 nodes, 1 sample/s per node, no rescale cost, more work
    // than the window holds: it takes every idle node at every decision.
    let dir = c.work_dir();
    let jobs = dir.join("jobs.csv");
    std::fs::write(
        &jobs,
        "id,submit,min_nodes,max_nodes,scale_up_s,scale_down_s,total_samples,curve_nodes,curve_samples_per_s,curve_objective\n\
         E1,2021-02-10T20:21:15,1,4,0,0,1e12,1 4,1 4,1 4\n",
    )
    .unwrap();
    let out = c
        .command(env!("CARGO_BIN_EXE_bftrainer"))
        .args(["replay", "--from-sacct", &t0.to_string(), &t1.to_string()])
        .arg("--jobs")
        .arg(&jobs)
        // The identity below (every idle node-second harvested) is the model's without
        // bftrainerd's own rules (release before a planned start, reclaim hold, start
        // latency), which keep some idle time from the job on purpose.
        .args(["--json", "--quiet", "--no-daemon-rules"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bftrainer replay failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let r = &v["report"];
    assert_eq!(r["nodes"], 4, "{r}");
    assert_eq!(r["start"], bftrainer_core::timefmt::format_time(t0));
    assert_eq!(r["end"], bftrainer_core::timefmt::format_time(t1));
    // Hand-worked from the records: 4 nodes over the window, less each job's nodes
    // over its run.
    let busy: i64 = recs.iter().map(|(s, e, n)| n.len() as i64 * (e - s)).sum();
    let idle_s = 4 * (t1 - t0) - busy;
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
    assert!(
        (f("idle_node_h") * 3600.0 - idle_s as f64).abs() < 1e-6,
        "idle {} node-s, records say {idle_s} ({recs:?})",
        f("idle_node_h") * 3600.0
    );
    // The elastic job holds every idle node all the time: all harvested, nothing
    // unused, and with no rescale cost every node-second is one sample.
    assert!(
        (f("harvested_node_h") - f("idle_node_h")).abs() < 1e-9,
        "{r}"
    );
    assert!(f("unused_node_h").abs() < 1e-9, "{r}");
    assert!((f("samples") - idle_s as f64).abs() < 1e-6, "{r}");
    assert!((f("efficiency") - 1.0).abs() < 1e-12, "{r}");
    // Every regular job took nodes the elastic job held, except a node handed over
    // from one regular job to the next within the same second (never idle).
    let claimed = recs
        .iter()
        .flat_map(|(s, _, nodes)| nodes.iter().map(move |n| (*s, n)))
        .filter(|&(s, n)| !recs.iter().any(|(_, e, m)| *e == s && m.contains(n)))
        .count() as u64;
    assert!(claimed >= 5, "{recs:?}");
    assert_eq!(r["preempted_nodes"], claimed, "{r}");
    assert_eq!(r["jobs_submitted"], 1);
    assert_eq!(r["jobs_completed"], 0);
    assert!(v["trace"].as_str().unwrap().starts_with("slurm accounting"));
}
