//! The backfill plan as the daemon reads it: a pending job's expected start and
//! SchedNodes, and the PLANNED flag on idle nodes the plan holds for it.

mod common;

use bftrainer_slurm::{BatchJob, ClusterView, JobBase, NodeBase, TimeLimit};
use common::{wait_for, wait_state, TestCluster, SLEEP_SCRIPT};

#[test]
fn cluster_plan_pending_job_expected_start_sched_nodes_and_planned_nodes() {
    let c = TestCluster::start();
    let s = c.slurm;
    let whole = |n: u32, minutes| BatchJob {
        script: SLEEP_SCRIPT.into(),
        min_nodes: Some(n),
        ntasks: Some(n),
        cpus_per_task: Some(2),
        time_limit: Some(TimeLimit::Minutes(minutes)),
        work_dir: Some(c.work_dir()),
        output: Some("/dev/null".into()),
        ..Default::default()
    };
    // Three whole nodes busy for up to 10 minutes; n4 stays idle.
    let busy = s.submit_batch(&whole(3, 10)).unwrap().job_id;
    let b = wait_state(&s, busy, JobBase::Running, 60);
    assert_eq!(b.nodes.as_deref(), Some("n[1-3]"));

    // A 4-node job must wait for them: backfill plans it at the busy job's end.
    let big = s.submit_batch(&whole(4, 10)).unwrap().job_id;
    let mut view = ClusterView::default();
    let planned = wait_for(60, "backfill to plan the 4-node job", || {
        view.refresh(&s).unwrap();
        let j = view.jobs().iter().find(|j| j.job_id == big)?;
        (j.sched_nodes.is_some() && j.expected_start().is_some()).then(|| j.clone())
    });
    assert_eq!(planned.state.base(), JobBase::Pending);
    assert_eq!(planned.sched_nodes.as_deref(), Some("n[1-4]"));
    let end_of_busy = b.start_time.unwrap() + 10 * 60;
    let start = planned.expected_start().unwrap();
    assert!(
        (end_of_busy - 5..=end_of_busy + 60).contains(&start),
        "{start} vs {end_of_busy}"
    );

    // n4 is idle but held for it: IDLE+PLANNED, the signal that it will be reclaimed.
    let n4 = wait_for(30, "n4 to be marked PLANNED", || {
        view.refresh(&s).unwrap();
        let n = view.nodes().iter().find(|n| n.name == "n4")?.clone();
        n.state.is_planned().then_some(n)
    });
    assert_eq!(n4.state.base(), NodeBase::Idle);
    assert_eq!(n4.state.name(), "IDLE+PLANNED");
    let n1 = view.nodes().iter().find(|n| n.name == "n1").unwrap();
    assert_eq!(n1.state.base(), NodeBase::Allocated);
    assert_eq!(n1.alloc_cpus, Some(2));

    s.cancel_job(big).unwrap();
    s.cancel_job(busy).unwrap();
}
