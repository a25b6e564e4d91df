//! Acting on jobs of a real cluster through the safe layer: submit, hold/release, pin
//! to nodes, update, signal, requeue, will-run, cancel, and submission as another user.

mod common;

use bftrainer_slurm::{BatchJob, JobBase, JobUpdate, SignalTarget, TimeLimit};
use common::{wait_for, wait_state, TestCluster, SLEEP_SCRIPT};

#[test]
fn cluster_jobs_submit_hold_pin_update_signal_requeue_cancel() {
    let c = TestCluster::start();
    let s = c.slurm;

    // Submitted held, pinned to n3, with comments and a time limit.
    let sub = s
        .submit_batch(&BatchJob {
            script: SLEEP_SCRIPT.into(),
            name: Some("pinned".into()),
            partition: Some("batch".into()),
            node_list: Some("n3".into()),
            comment: Some("user note".into()),
            admin_comment: Some("bftrainer:core".into()),
            time_limit: Some(TimeLimit::Minutes(10)),
            work_dir: Some("/tmp".into()),
            output: Some("/dev/null".into()),
            env: vec![("BFT_TEST".into(), "1".into())],
            hold: true,
            requeue: Some(true),
            ..Default::default()
        })
        .unwrap();
    let j = s.load_job(sub.job_id).unwrap();
    assert_eq!(j.state.base(), JobBase::Pending);
    assert!(j.is_held(), "priority {}", j.priority);
    // Held at submission is a user hold (as `sbatch -H`).
    assert_eq!(j.reason.as_deref(), Some("JobHeldUser"));
    assert_eq!(j.name, "pinned");
    assert_eq!(j.partition.as_deref(), Some("batch"));
    assert_eq!(j.req_nodes.as_deref(), Some("n3"));
    assert_eq!(j.comment.as_deref(), Some("user note"));
    assert_eq!(j.admin_comment.as_deref(), Some("bftrainer:core"));
    assert_eq!(j.time_limit, Some(TimeLimit::Minutes(10)));
    assert!(j.requeue);
    assert!(j.nodes.is_none() && j.batch_host.is_none());
    assert!(j.submit_time.is_some());

    // Re-pin to n2 and change the comments while held, then release.
    s.update_job(
        sub.job_id,
        &JobUpdate {
            node_list: Some("n2".into()),
            comment: Some("moved".into()),
            admin_comment: Some("bftrainer:core gen=2".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let j = s.load_job(sub.job_id).unwrap();
    assert_eq!(j.req_nodes.as_deref(), Some("n2"));
    assert_eq!(j.comment.as_deref(), Some("moved"));
    assert_eq!(j.admin_comment.as_deref(), Some("bftrainer:core gen=2"));
    s.release(sub.job_id).unwrap();
    let j = wait_state(&s, sub.job_id, JobBase::Running, 30);
    assert_eq!(j.nodes.as_deref(), Some("n2"));
    assert_eq!(j.batch_host.as_deref(), Some("n2"));
    assert_eq!(j.num_nodes, 1);
    assert!(j.start_time.is_some() && j.expected_start().is_none());
    let n2 = s.load_nodes(None).unwrap().changed().unwrap();
    let n2 = n2.get("n2").unwrap();
    assert!(n2.alloc_cpus.unwrap_or(0) > 0, "n2 shows the allocation");

    // An admin hold of a pending job (pinned to the busy n2), then its release.
    let waiting = s
        .submit_batch(&BatchJob {
            script: SLEEP_SCRIPT.into(),
            node_list: Some("n2".into()),
            work_dir: Some("/tmp".into()),
            output: Some("/dev/null".into()),
            ..Default::default()
        })
        .unwrap();
    s.hold(waiting.job_id).unwrap();
    let w = s.load_job(waiting.job_id).unwrap();
    assert!(w.is_held());
    assert_eq!(w.reason.as_deref(), Some("JobHeldAdmin"));
    s.release(waiting.job_id).unwrap();
    let w = s.load_job(waiting.job_id).unwrap();
    assert!(!w.is_held(), "released: priority {}", w.priority);
    assert_eq!(w.state.base(), JobBase::Pending);
    s.cancel_job(waiting.job_id).unwrap();

    // A signal that the script ignores does not end the job.
    s.signal_job(sub.job_id, libc::SIGCONT, SignalTarget::Everything)
        .unwrap();
    assert_eq!(
        s.load_job(sub.job_id).unwrap().state.base(),
        JobBase::Running
    );

    // Will-run: 3 whole nodes (2 CPUs each) fit now, without the busy n2; all 4
    // only when the pinned job's 10-minute limit frees n2.
    let whole = |n| BatchJob {
        script: SLEEP_SCRIPT.into(),
        min_nodes: Some(n),
        ntasks: Some(n),
        cpus_per_task: Some(2),
        work_dir: Some("/tmp".into()),
        ..Default::default()
    };
    let now = common::now();
    let wr = s.will_run(&whole(3)).unwrap();
    let nodes = bftrainer_slurm::hostlist_expand(wr.node_list.as_deref().unwrap()).unwrap();
    assert_eq!(nodes, ["n1", "n3", "n4"], "{wr:?}");
    assert!(wr.start_time.unwrap() <= now + 5, "{wr:?}");
    let wr = s.will_run(&whole(4)).unwrap();
    let start = wr.start_time.unwrap();
    assert!(
        start >= j.start_time.unwrap() + 9 * 60,
        "starts when n2 frees: {wr:?}"
    );
    assert_eq!(wr.node_list.as_deref(), Some("n[1-4]"));
    assert!(
        wr.preemptees.is_empty(),
        "batch does not preempt batch: {wr:?}"
    );

    // Requeue: the job goes back to pending (held, as asked) with a restart counted.
    s.requeue(sub.job_id, true).unwrap();
    let j = wait_for(30, "requeued job to be pending again", || {
        let j = s.load_job(sub.job_id).ok()?;
        (j.state.base() == JobBase::Pending && !j.state.is_completing()).then_some(j)
    });
    assert_eq!(j.restart_count, 1);
    assert!(j.is_held());

    // Cancel: the job ends CANCELLED; a second cancel says it is already done.
    s.cancel_job(sub.job_id).unwrap();
    let j = wait_state(&s, sub.job_id, JobBase::Cancelled, 30);
    assert_eq!(j.state.name(), "CANCELLED");
    let e = s.cancel_job(sub.job_id).unwrap_err();
    assert!(e.is_already_done(), "{e}");
}
