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
        // latency), which keep some idle time from the job on purpose, and without the
        // floors of rescale costs that come with fair shares (the job declares none).
        .args(["--json", "--quiet", "--no-daemon-rules", "--no-fair-share"])
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

/// `--from-sacct` takes what the nodes offer from slurmctld, as bftrainerd does: on a
/// cluster whose n1 and n2 have 4 A100s (stand-ins), n3 2 V100s and n4 no GPU, a job
/// asking 2 A100s per node is given only n1 and n2, one asking V100s only n3, and one
/// asking a type no node has waits and is named, before and after the replay.
#[test]
fn cluster_replay_from_sacct_places_jobs_by_the_nodes_gres() {
    let c = Cluster::start(Options {
        nodes: 4,
        gpus: Some("1-2=a100:4,3=v100:2".into()),
        ..Default::default()
    })
    .expect("start a test cluster");
    // A window of the past with no job in it: every node idle throughout.
    let t1 = now();
    let t0 = t1 - 600;
    let dir = c.work_dir();
    let jobs = dir.join("jobs.csv");
    std::fs::write(
        &jobs,
        "id,submit,min_nodes,max_nodes,scale_up_s,scale_down_s,total_samples,curve_nodes,curve_samples_per_s,curve_objective,gpus_per_node,gpu_type\n\
         A,2021-02-10T20:21:15,1,4,0,0,1e12,1 4,1 4,1 4,2,a100\n\
         V,2021-02-10T20:21:15,1,4,0,0,1e12,1 4,1 4,1 4,2,v100\n\
         H,2021-02-10T20:21:15,1,4,0,0,1e12,1 4,1 4,1 4,1,h100\n",
    )
    .unwrap();
    let (journal, actions) = (dir.join("j.jsonl"), dir.join("a.csv"));
    let out = c
        .command(env!("CARGO_BIN_EXE_bftrainer"))
        .args(["replay", "--from-sacct", &t0.to_string(), &t1.to_string()])
        .arg("--jobs")
        .arg(&jobs)
        .arg("--write-journal")
        .arg(&journal)
        .arg("--actions-csv")
        .arg(&actions)
        .args(["--json", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bftrainer replay failed: {stderr}");
    assert!(
        stderr.contains("job H asks --gpus-per-node=h100:1 on at least 1 nodes, but 0 of the 4 nodes serve it (slurmctld's node table)"),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["node_attributes"], "slurmctld's node table");
    let r = &v["report"];
    let offers: Vec<(String, u64)> = r["node_classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["offers"].as_str().unwrap().to_string(),
                c["nodes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        offers
            .iter()
            .any(|(o, n)| o.starts_with("gpu:a100:4") && *n == 2),
        "{offers:?}"
    );
    assert!(
        offers
            .iter()
            .any(|(o, n)| o.starts_with("gpu:v100:2") && *n == 1),
        "{offers:?}"
    );
    assert!(
        offers
            .iter()
            .any(|(o, n)| o.starts_with("no GPUs") && *n == 1),
        "{offers:?}"
    );
    assert_eq!(r["jobs_unservable"], 1, "{r}");
    assert_eq!(r["jobs"][2]["status"], "queued");
    // Which node each admission or grow gave, by name.
    let mut node_names = std::collections::HashMap::new();
    for line in std::fs::read_to_string(&journal).unwrap().lines() {
        let rec: Value = serde_json::from_str(line).unwrap();
        if rec["event"]["type"] == "node_added" {
            node_names.insert(
                rec["event"]["node"].as_u64().unwrap(),
                rec["event"]["name"].as_str().unwrap().to_string(),
            );
        }
    }
    let nodes = c.nodes();
    let mut given: Vec<(u64, String)> = Vec::new();
    for line in std::fs::read_to_string(&actions).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[1] == "admit" || f[1] == "grow" {
            for n in f[3].split(' ') {
                given.push((
                    f[2].parse().unwrap(),
                    node_names[&n.parse().unwrap()].clone(),
                ));
            }
        }
    }
    assert!(
        given.iter().any(|(j, _)| *j == 0) && given.iter().any(|(j, _)| *j == 1),
        "{given:?}"
    );
    for (j, n) in &given {
        match j {
            0 => assert!(*n == nodes[0] || *n == nodes[1], "A on {n}"),
            1 => assert_eq!(*n, nodes[2], "V on {n}"),
            _ => panic!("job {j} given {n}"),
        }
    }
}
