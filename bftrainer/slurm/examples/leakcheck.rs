//! Drives every call of the safe layer, success and error paths, N times against the
//! cluster of $SLURM_CONF, so valgrind can show whether lost memory grows with N.
//! Usage: leakcheck N   (see docs/design.md, "Slurm bindings and the safe layer").

use bftrainer_slurm::{
    hostlist_expand, AcctQuery, BatchJob, ClusterView, JobUpdate, SignalTarget, Slurm, SlurmDb,
};

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let s = Slurm::init().expect("slurm_init");
    let mut db = SlurmDb::connect(&s).expect("slurmdb connection");
    let job = |partition: &str| BatchJob {
        script: "#!/bin/sh\nsleep 60\n".into(),
        partition: Some(partition.into()),
        work_dir: Some("/tmp".into()),
        output: Some("/dev/null".into()),
        comment: Some("leakcheck".into()),
        env: vec![("A".into(), "B".into())],
        hold: true,
        ..Default::default()
    };
    let mut errors = 0;
    for _ in 0..n {
        let mut view = ClusterView::default();
        view.refresh(&s).unwrap();
        view.refresh(&s).unwrap();
        view.refresh_with(&s, true).unwrap();
        // Success paths that allocate in libslurm.
        let id = s.submit_batch(&job("batch")).unwrap().job_id;
        s.load_job(id).unwrap();
        s.update_job(
            id,
            &JobUpdate {
                comment: Some("x".into()),
                ..Default::default()
            },
        )
        .unwrap();
        s.will_run(&BatchJob {
            hold: false,
            ..job("batch")
        })
        .unwrap();
        s.cancel_job(id).unwrap();
        db.jobs(&AcctQuery {
            start: 1,
            duplicates: true,
            ..Default::default()
        })
        .unwrap();
        hostlist_expand("n[1-4]").unwrap();
        // Error paths.
        errors += s.cancel_job(999_999).is_err() as u32;
        errors += s.load_job(999_999).is_err() as u32;
        errors += s.signal_job(999_999, 10, SignalTarget::BatchShell).is_err() as u32;
        errors += s.requeue(999_999, false).is_err() as u32;
        errors += s.hold(999_999).is_err() as u32;
        errors += s.submit_batch(&job("nosuch")).is_err() as u32;
        errors += s.will_run(&job("nosuch")).is_err() as u32;
        errors += hostlist_expand("n[5-2]").is_err() as u32;
        errors += db
            .jobs(&AcctQuery {
                start: 10,
                end: Some(5),
                ..Default::default()
            })
            .is_err() as u32;
    }
    db.close().unwrap();
    println!(
        "leakcheck: {n} rounds, {errors} errors (expected {})",
        9 * n
    );
    assert_eq!(errors, 9 * n);
}
