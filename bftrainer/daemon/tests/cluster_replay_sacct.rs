//! `--from-sacct` on the test cluster: a known job on 2 of 4 nodes, read back from
//! slurmdbd, becomes the idle trace the simulator replays. One test per binary: libslurm
//! reads one slurm.conf per process.

use bftrainer_daemon::replay::sacct::{trace_from_sacct, trace_from_sacct_windows};
use bftrainer_slurm::{AcctQuery, Slurm, SlurmDb};
use bftrainer_testcluster::{Cluster, Options};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn cluster_sacct_fragments_match_the_job_record() {
    let c = Cluster::start(Options {
        nodes: 4,
        ..Default::default()
    })
    .expect("start a test cluster");
    std::env::set_var("SLURM_CONF", c.slurm_conf());
    let t0 = now() - 1;
    let id = c.sbatch(&["-N2", "--wrap", "sleep 4"]).unwrap();
    c.wait_for_state(id, &["COMPLETED"], Duration::from_secs(60))
        .unwrap();
    // Accounting is written asynchronously: wait for the record's end time.
    let slurm = Slurm::init().unwrap();
    let mut db = SlurmDb::connect(&slurm).unwrap();
    let q = AcctQuery {
        start: t0,
        job_ids: vec![id],
        ..Default::default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let rec = loop {
        if let Some(r) = db
            .jobs(&q)
            .unwrap()
            .into_iter()
            .find(|r| r.end_time.is_some())
        {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no accounting record for job {id}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    drop(db);
    let t1 = now() + 2;
    let tr = trace_from_sacct(t0, t1, &[]).unwrap();
    assert_eq!(tr.names, c.nodes());
    let (s, e) = (rec.start_time.unwrap(), rec.end_time.unwrap());
    // Hand-worked: 4 nodes idle all window except the job's 2 during [s, e).
    let busy = 2.0 * (e - s) as f64;
    let expect = (4.0 * (t1 - t0) as f64 - busy) / (t1 - t0) as f64;
    assert!(
        (tr.mean_idle() - expect).abs() < 1e-9,
        "mean idle {} != {expect}",
        tr.mean_idle()
    );
    assert_eq!(tr.changes.iter().filter(|ch| !ch.idle).count(), 2);
    assert!(tr.changes.iter().all(|ch| ch.t == s || ch.t == e));
    // Read in windows of 1 s (the job spans several): the same trace.
    let tr1 = trace_from_sacct_windows(t0, t1, &[], 1).unwrap();
    assert_eq!(tr1, tr, "windowed reads change the trace");
    // From inside the job (the replay's reads start there): its 2 nodes are busy at
    // the start and idle from its end, read whole or a second at a time.
    let mid = s + 1;
    assert!(mid < e, "the job ran [{s}, {e})");
    let trm = trace_from_sacct(mid, t1, &[]).unwrap();
    assert_eq!(trm.initial_idle.iter().filter(|&&idle| !idle).count(), 2);
    let ends: Vec<(i64, bool)> = trm.changes.iter().map(|c| (c.t, c.idle)).collect();
    assert_eq!(ends, [(e, true), (e, true)]);
    assert_eq!(trace_from_sacct_windows(mid, t1, &[], 1).unwrap(), trm);
    // Leaving out the job's partition leaves every node idle.
    let part = rec.partition.clone().unwrap();
    let tr2 = trace_from_sacct(t0, t1, &[part]).unwrap();
    assert!(tr2.changes.is_empty() && tr2.initial_idle.iter().all(|&b| b));
}
