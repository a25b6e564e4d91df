//! `bftrainer acct` on a live cluster with bftrainerd: an elastic job that grows onto
//! every node, loses two satellites to a regular job and grows back; its node and CPU
//! seconds must equal the sum over `sacct -D -X --truncate` rows of the same window,
//! for the whole run and for two clipped halves. Plain jobs must not count. Bad input
//! (inverted, unparsable window; slurmdbd stopped) must fail clearly. One test per
//! binary: libslurm reads one slurm.conf per process.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use live::Live;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Local `YYYY-MM-DDTHH:MM:SS`, the form both sacct and `bftrainer acct` take.
fn local(t: i64) -> String {
    bftrainer_daemon::cmd::acct::local_time(t)
}

/// One `sacct -P` row.
#[derive(Debug)]
struct Row {
    id: u32,
    name: String,
    nnodes: u64,
    elapsed: u64,
    cputime: u64,
    comment: String,
    state: String,
    end: String,
    partition: String,
}

fn sacct(l: &Live, start: i64, end: i64) -> Vec<Row> {
    let out =
        l.c.run(
            "sacct",
            &[
                "-a",
                "-D",
                "-X",
                "-P",
                "-n",
                "--truncate",
                "-S",
                &local(start),
                "-E",
                &local(end),
                "-o",
                "JobID,JobName,NNodes,ElapsedRaw,CPUTimeRAW,AdminComment,State,End,Partition",
            ],
        )
        .unwrap();
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 9, "{l}");
            Row {
                id: f[0].parse().unwrap(),
                name: f[1].into(),
                nnodes: f[2].parse().unwrap(),
                elapsed: f[3].parse().unwrap(),
                cputime: f[4].parse().unwrap(),
                comment: f[5].into(),
                state: f[6].into(),
                end: f[7].into(),
                partition: f[8].into(),
            }
        })
        .collect()
}

/// Rows of elastic job `job` by the tag (or the satellite name, for one cancelled
/// before slurmdbd had its admin comment).
fn of_job(rows: &[Row], job: u32) -> Vec<&Row> {
    rows.iter()
        .filter(|r| {
            (r.id == job && r.comment.contains("role=core"))
                || r.comment.ends_with(&format!("role=satellite,parent={job}"))
                || (r.comment.is_empty() && r.name == format!("bftsat-{job}"))
        })
        .collect()
}

fn acct(l: &Live, args: &[&str]) -> std::process::Output {
    l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
        .arg("acct")
        .args(args)
        .output()
        .unwrap()
}

fn acct_json(l: &Live, start: i64, end: i64) -> serde_json::Value {
    let out = acct(l, &["-S", &local(start), "-E", &local(end), "--json"]);
    assert!(
        out.status.success(),
        "bftrainer acct: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The JSON's figures for `job` against the sacct rows of the same window.
fn check_window(l: &Live, job: u32, start: i64, end: i64) -> (u64, u64) {
    let rows = sacct(l, start, end);
    let mine = of_job(&rows, job);
    let node_s: u64 = mine.iter().map(|r| r.nnodes * r.elapsed).sum();
    let cpu_s: u64 = mine.iter().map(|r| r.cputime).sum();
    let v = acct_json(l, start, end);
    assert_eq!(v["schema"], "bftrainer.acct/1");
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(
        jobs.iter()
            .map(|j| j["job_id"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [u64::from(job)],
        "only the elastic job, not the plain ones: {v:#}\nsacct: {rows:#?}"
    );
    let j = &jobs[0];
    assert_eq!(j["node_seconds"], node_s, "{j:#}\nsacct: {mine:#?}");
    assert_eq!(j["cpu_seconds"], cpu_s, "{j:#}\nsacct: {mine:#?}");
    assert_eq!(v["total"]["node_seconds"], node_s);
    assert_eq!(v["users"][0]["user"], "bftuser");
    assert_eq!(v["users"][0]["cpu_seconds"], cpu_s);
    assert_eq!(v["accounts"][0]["account"], "bft");
    assert_eq!(v["elastic_records"], mine.len());
    assert_eq!(v["records"], rows.len());
    eprintln!(
        "window {} - {}: {} rows, {} of job {job}: {node_s} node-s, {cpu_s} CPU-s, acct and sacct agree",
        local(start),
        local(end),
        rows.len(),
        mine.len()
    );
    (node_s, cpu_s)
}

#[test]
fn cluster_acct_equals_sacct_and_refuses_bad_input() {
    let l = Live::start("", "", "");
    let t0 = now() - 1;
    // A plain job of the same user and account: must not count.
    let plain = l.sbatch_as_user(
        &["-p", "batch", "-N1", "-o", "/dev/null", "--wrap", "sleep 2"],
        None,
    );
    let job = l.submit_elastic("1:4");
    let first = l.grown_to_all(job);
    std::thread::sleep(Duration::from_secs(2));
    let mid = now();
    // A regular job takes two satellites' nodes: two preemptions.
    let regular = l.regular(2, 8);
    l.wait(30, "the regular job to start", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    l.wait(60, "the regular job to end", || {
        (l.state_of(regular) == "COMPLETED").then_some(())
    });
    l.grown_to_all(job);
    std::thread::sleep(Duration::from_secs(3));
    l.c.run("scancel", &[&job.to_string()]).unwrap();
    l.wait(30, "satellites cancelled with their parent", || {
        (l.active_satellites(job) == 0 && l.state_of(job) != "RUNNING").then_some(())
    });
    // Accounting lags: wait until every job of the window, as slurmctld knows them (the
    // plain, regular and elastic jobs and every satellite the daemon submitted, however
    // many the run needed), is in accounting with its end and partition. No count of rows:
    // how many satellites a run takes depends on where the plain job was at admission.
    let expected: BTreeSet<u32> = {
        let out =
            l.c.run("squeue", &["-h", "-a", "-t", "all", "-o", "%i|%j"])
                .unwrap();
        let sat = format!("bftsat-{job}");
        out.lines()
            .filter_map(|r| r.split_once('|'))
            .filter(|(_, name)| *name == sat)
            .filter_map(|(id, _)| id.trim().parse().ok())
            .chain([plain, job, regular])
            .collect()
    };
    let t1 = l.wait(60, "every job of the window ended in accounting", || {
        let t = now();
        let rows = sacct(&l, t0, t);
        let ended = |id: u32| {
            rows.iter().any(|r| {
                r.id == id
                    && r.end != "Unknown"
                    && (!r.partition.is_empty() || r.state.starts_with("CANCELLED"))
            })
        };
        let done = expected.iter().all(|&id| ended(id))
            && rows.iter().all(|r| {
                r.end != "Unknown" && (!r.partition.is_empty() || r.state.starts_with("CANCELLED"))
            });
        done.then_some(t)
    });
    std::thread::sleep(Duration::from_secs(1));
    let rows = sacct(&l, t0, t1);
    eprintln!("sacct rows of the window:\n{rows:#?}");
    assert!(rows.iter().any(|r| r.id == plain) && rows.iter().any(|r| r.id == regular));

    let (node_s, cpu_s) = check_window(&l, job, t0, t1);
    let v = acct_json(&l, t0, t1);
    let j = &v["jobs"][0];
    assert_eq!(j["max_nodes"], 4, "{j:#}");
    // The regular job took satellites' nodes only: the core ran once.
    assert_eq!(
        j["core_runs"],
        1,
        "{j:#}\nbftrainerd's log:\n{}",
        l.log_text()
    );
    // Satellites that held a node: sacct's satellite rows with time in the window (the
    // 3 of the first growth and those of the growth back, at least 5).
    let sats = of_job(&rows, job)
        .iter()
        .filter(|r| r.id != job && r.elapsed > 0)
        .count();
    assert!(sats >= 5, "{rows:#?}");
    assert_eq!(j["satellites"], sats, "{j:#}");
    // The regular job took two satellites' nodes. From 24.11 it can end up on a third:
    // Slurm keeps it pending until the two preempted satellites have completed, and
    // meanwhile its plan may name another satellite's node, which bftrainerd then gives
    // back ahead of it; acct counts that satellite too (a regular job took its node).
    let p = j["preemptions"].as_u64().unwrap();
    assert!(
        p == 2 || (p == 3 && !l.c.slurm_version().unwrap().starts_with("22.")),
        "the regular job took two satellites' nodes: {j:#}\n{rows:#?}"
    );
    let mean = j["mean_nodes"].as_f64().unwrap();
    assert!(mean > 1.0 && mean <= 4.0, "{j:#}");
    assert!(first.len() == 3);

    // Clipped windows: each half agrees with sacct --truncate, and they add up.
    let (a_node, a_cpu) = check_window(&l, job, t0, mid);
    let (b_node, b_cpu) = check_window(&l, job, mid, t1);
    assert_eq!((a_node + b_node, a_cpu + b_cpu), (node_s, cpu_s));

    // The other formats, for people and spreadsheets (shown in docs/admin.md).
    for fmt in [None, Some("--csv")] {
        let mut args = vec!["-S", "today"];
        args.extend(fmt);
        let out = acct(&l, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("$ bftrainer acct {}\n{text}", args.join(" "));
        assert!(
            text.contains(&job.to_string()) && text.contains("bftuser"),
            "{text}"
        );
    }
    let out = acct(&l, &["-u", "root", "-S", &local(t0), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["jobs"].as_array().unwrap().len(),
        0,
        "root has no elastic job"
    );
    let out = acct(
        &l,
        &["-u", "bftuser", "-A", "bft", "-S", &local(t0), "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1);

    // Bad input: a clear message on stderr, exit code 1.
    let cases: [(&[&str], &str); 4] = [
        (&["-S", "now", "-E", "now-1hour"], "inverted"),
        (
            &["-S", "yesterdayish"],
            "is not a time; allowed: YYYY-MM-DD",
        ),
        (
            &["-E", "2026-02-30"],
            "--end \"2026-02-30\": a field is out of range",
        ),
        (&["-u", "no-such-user-xyz"], "no such user"),
    ];
    for (args, want) in cases {
        let out = acct(&l, args);
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("$ bftrainer acct {}\n{err}", args.join(" "));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("bftrainer: error: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
    l.c.stop_daemon("slurmdbd", false).unwrap();
    let t = std::time::Instant::now();
    let out = acct(&l, &["-S", &local(t0)]);
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "$ bftrainer acct (slurmdbd stopped, {:.1} s)\n{err}",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot reach slurmdbd"), "{err}");
    assert!(out.stdout.is_empty());
    let ids: BTreeSet<u32> = rows.iter().map(|r| r.id).collect();
    assert!(ids.contains(&job));
}
