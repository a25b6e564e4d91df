//! What bftrainerd does with the nodes of its jobs when Slurm changes their state, and
//! with its jobs when partitions change, on the in-memory cluster of the cycle
//! benchmark (`daemon::gen`). What Slurm itself does with the jobs is tested on real
//! clusters (tests/cluster_daemon.rs).

use bftrainer_core::engine::JobStatus;
use bftrainer_daemon::daemon::gen::{held_cores, job, node, partition, GenCluster};
use bftrainer_daemon::daemon::{config, Daemon};
use bftrainer_slurm::{JobBase, NodeBase, NodeState};
use std::path::Path;

/// Four idle nodes and one held elastic core job of 1 to 4 nodes.
fn cluster() -> GenCluster {
    held_cores(4, 1, "1:4")
}

fn cfg(extra: &str) -> config::Config {
    config::parse(
        &format!("[policy]\nsatellite_partition = \"elastic-sat\"\n{extra}"),
        Path::new("/test/bftrainer.toml"),
    )
    .unwrap()
}

/// Cycles as bftrainerd does, Slurm starting what was released between two polls.
fn run(d: &mut Daemon<GenCluster>, now: &mut f64, cycles: usize) {
    for _ in 0..cycles {
        *now += 1.0;
        d.cluster.start_pending_elastic(*now as i64);
        d.cycle(*now).unwrap();
    }
}

/// The daemon with the core grown to all four nodes (the core on one, a satellite on
/// each other).
fn grown(extra: &str) -> (Daemon<GenCluster>, f64) {
    let mut now = 3_000_000_000.0;
    let mut d = Daemon::new(cfg(extra), cluster(), None, &[]).unwrap();
    run(&mut d, &mut now, 8);
    assert_eq!(d.engine().job_status(0), JobStatus::Active);
    assert_eq!(d.engine().job_nodes(0).len(), 4);
    assert_eq!(running(&d), 4, "the core and three satellites run");
    (d, now)
}

fn running(d: &Daemon<GenCluster>) -> usize {
    d.cluster
        .jobs
        .iter()
        .filter(|j| j.state.base() == JobBase::Running)
        .count()
}

/// The core job's node in Slurm.
fn core_node(d: &Daemon<GenCluster>) -> String {
    d.cluster.jobs[0].nodes.clone().expect("the core runs")
}

fn state(base: NodeBase, flags: &[u64]) -> NodeState {
    let mut s = NodeState::from_base(base);
    for f in flags {
        s.0 |= *f as u32;
    }
    s
}

#[test]
fn a_core_node_slurm_keeps_the_job_on_is_not_lost() {
    use slurm_sys::{
        NODE_STATE_DRAIN, NODE_STATE_FAIL, NODE_STATE_MAINT, NODE_STATE_NO_RESPOND, NODE_STATE_RES,
    };
    // The states in which Slurm lets the core run on: drained and then missing a
    // ping, failing, in a maintenance reservation (ignore_jobs), in a plain one.
    let cases = [
        (
            "drained, not responding",
            &[NODE_STATE_DRAIN, NODE_STATE_NO_RESPOND][..],
        ),
        ("not responding", &[NODE_STATE_NO_RESPOND][..]),
        ("failing", &[NODE_STATE_FAIL][..]),
        (
            "failing and drained",
            &[NODE_STATE_FAIL, NODE_STATE_DRAIN][..],
        ),
        ("maintenance", &[NODE_STATE_MAINT, NODE_STATE_RES][..]),
        ("reserved", &[NODE_STATE_RES][..]),
    ];
    for (what, flags) in cases {
        let (mut d, mut now) = grown("");
        let anchors = d.engine().job_anchors(0).to_vec();
        let n = core_node(&d);
        d.cluster.node_mut(&n).unwrap().state = state(NodeBase::Mixed, flags);
        d.cluster.dirty = true;
        run(&mut d, &mut now, 10);
        assert_eq!(d.cluster.calls.requeues, 0, "{what}: the core was requeued");
        assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running, "{what}");
        assert_eq!(
            d.engine().job_anchors(0),
            &anchors[..],
            "{what}: the anchor moved"
        );
        assert_eq!(d.engine().job_status(0), JobStatus::Active, "{what}");
    }
}

#[test]
fn a_core_node_slurm_sets_down_is_lost() {
    // DOWN is where Slurm itself kills or requeues the job: the node is lost.
    let (mut d, mut now) = grown("");
    let n = core_node(&d);
    d.cluster.node_mut(&n).unwrap().state = state(NodeBase::Down, &[]);
    d.cluster.dirty = true;
    run(&mut d, &mut now, 1);
    assert!(
        d.engine().job_nodes(0).len() < 4,
        "the core's DOWN node is still the job's"
    );
}

#[test]
fn satellites_leave_a_drained_failing_or_reserved_node() {
    use slurm_sys::{NODE_STATE_DRAIN, NODE_STATE_FAIL, NODE_STATE_MAINT, NODE_STATE_RES};
    // The administrator wants such a node emptied: the satellite on it (a lent node, not
    // the user's job) is shrunk off it; the core keeps running.
    for (what, flags) in [
        ("drained", &[NODE_STATE_DRAIN][..]),
        ("failing", &[NODE_STATE_FAIL][..]),
        ("maintenance", &[NODE_STATE_MAINT, NODE_STATE_RES][..]),
    ] {
        let (mut d, mut now) = grown("");
        let core = core_node(&d);
        let sat = d
            .cluster
            .jobs
            .iter()
            .find(|j| j.job_id != 1 && j.state.base() == JobBase::Running)
            .unwrap()
            .clone();
        let n = sat.nodes.clone().unwrap();
        assert_ne!(n, core);
        d.cluster.node_mut(&n).unwrap().state = state(NodeBase::Mixed, flags);
        d.cluster.dirty = true;
        run(&mut d, &mut now, 40);
        let after = d
            .cluster
            .jobs
            .iter()
            .find(|j| j.job_id == sat.job_id)
            .unwrap();
        assert!(!after.state.is_active(), "{what}: the satellite still runs");
        assert_eq!(d.cluster.calls.requeues, 0, "{what}");
        assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running, "{what}");
    }
}

/// A second core job, waiting held (the first takes every node: `max_jobs = 1`).
fn with_waiting(d: &mut Daemon<GenCluster>, partition: &str) -> u32 {
    let mut j = job(0, partition, JobBase::Pending);
    j.admin_comment = Some("bftrainer:v1 1:4,role=core".into());
    j.priority = 0;
    d.cluster.add_job(j)
}

fn slurm_job(d: &Daemon<GenCluster>, id: u32) -> &bftrainer_slurm::Job {
    d.cluster.jobs.iter().find(|j| j.job_id == id).unwrap()
}

fn satellites_running(d: &Daemon<GenCluster>) -> usize {
    d.cluster
        .jobs
        .iter()
        .filter(|j| j.job_id != 1 && j.state.base() == JobBase::Running)
        .count()
}

#[test]
fn a_changed_policy_partition_keeps_running_cores_and_releases_waiting_ones() {
    // SIGHUP moves `[policy] partition` from elastic to elastic2: the core running in
    // elastic stays bftrainerd's until it ends (no requeue, not counted finished, its
    // satellites kept); the one waiting held in elastic is released to Slurm with its
    // tag off, never left held.
    let (mut d, mut now) = grown("[engine]\nmax_jobs = 1\n");
    let waiting = with_waiting(&mut d, "elastic");
    run(&mut d, &mut now, 3);
    assert_eq!(slurm_job(&d, waiting).priority, 0, "held for admission");
    let names: Vec<String> = (1..=4).map(|i| format!("n{i}")).collect();
    d.cluster.partitions.push(partition("elastic2", &names, 2));
    d.reconfigure(cfg("partition = \"elastic2\"\n[engine]\nmax_jobs = 1\n"));
    run(&mut d, &mut now, 10);
    assert_eq!(
        d.engine().job_status(0),
        JobStatus::Active,
        "the running core"
    );
    assert_eq!(d.cluster.calls.requeues, 0);
    assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running);
    assert_eq!(satellites_running(&d), 3, "its satellites run on");
    let w = slurm_job(&d, waiting);
    assert_ne!(w.priority, 0, "the waiting core is left held");
    assert_eq!(w.admin_comment, None, "its tag is still on");
    assert_eq!(d.stats.released, 1);
}

#[test]
fn a_core_an_admin_moves_out_of_the_elastic_partitions_is_released_to_slurm() {
    // `scontrol update jobid=J partition=batch` by an administrator, on the running
    // core and on a held waiting one: each is released to Slurm (tag off, bftrainerd's
    // hold lifted), the running one keeps running and its satellites are cancelled.
    let (mut d, mut now) = grown("[engine]\nmax_jobs = 1\n");
    let waiting = with_waiting(&mut d, "elastic");
    run(&mut d, &mut now, 3);
    for id in [1, waiting] {
        d.cluster
            .jobs
            .iter_mut()
            .find(|j| j.job_id == id)
            .unwrap()
            .partition = Some("batch".into());
    }
    d.cluster.dirty = true;
    run(&mut d, &mut now, 40);
    let core = slurm_job(&d, 1);
    assert_eq!(
        core.state.base(),
        JobBase::Running,
        "the moved core runs on"
    );
    assert_eq!(core.admin_comment, None, "its tag is still on");
    assert_eq!(d.engine().job_status(0), JobStatus::Cancelled);
    assert_eq!(
        satellites_running(&d),
        0,
        "its satellites were left running"
    );
    let w = slurm_job(&d, waiting);
    assert_ne!(w.priority, 0, "the moved waiting core is left held");
    assert_eq!(w.admin_comment, None);
    assert_eq!(d.cluster.calls.requeues, 0);
    assert_eq!(d.stats.released, 2);
}

fn part_mut<'a>(d: &'a mut Daemon<GenCluster>, name: &str) -> &'a mut bftrainer_slurm::Partition {
    d.cluster.dirty = true;
    d.cluster
        .partitions
        .iter_mut()
        .find(|p| p.name == name)
        .unwrap()
}

/// Breaks (true) or mends (false) one partition rule.
type Breaks = fn(&mut Daemon<GenCluster>, bool);

#[test]
fn partitions_that_break_a_check_at_runtime_stop_lending_until_fixed() {
    let (mut d, mut now) = grown("");
    let cases: [(&str, Breaks); 5] = [
        ("PriorityTier", |d, broken| {
            part_mut(d, "elastic-sat").priority_tier = if broken { 5 } else { 1 };
        }),
        ("PreemptMode=OFF", |d, broken| {
            part_mut(d, "elastic-sat").preempt_mode = if broken {
                0
            } else {
                bftrainer_slurm::Partition::PREEMPT_REQUEUE
            };
        }),
        // A partition without a PreemptMode of its own takes slurm.conf's global one:
        // OFF there is OFF in the partition.
        ("global PreemptMode is OFF", |d, broken| {
            part_mut(d, "elastic-sat").preempt_mode = if broken {
                bftrainer_slurm::Partition::PREEMPT_INHERIT
            } else {
                bftrainer_slurm::Partition::PREEMPT_REQUEUE
            };
            d.cluster.preempt_mode = if broken {
                0
            } else {
                bftrainer_slurm::Partition::PREEMPT_REQUEUE
            };
        }),
        // slurmctld reconfigured without preemption (a reconfigure rebuilds the
        // partitions, which is when the daemon reads PreemptType again).
        ("PreemptType=preempt/none", |d, broken| {
            d.cluster.preempt_type = Some(
                if broken {
                    "preempt/none"
                } else {
                    "preempt/partition_prio"
                }
                .into(),
            );
            d.cluster.dirty = true;
        }),
        // SIGHUP: a config naming a partition slurmctld does not have.
        ("no partition 'ghost'", |d, broken| {
            d.reconfigure(cfg(if broken {
                "allowed_partitions = [\"ghost\"]\n"
            } else {
                ""
            }))
        }),
    ];
    for (k, (rule, set)) in cases.into_iter().enumerate() {
        // A new node appears, with a job that could be admitted onto it at once.
        let name = format!("n{}", 5 + k);
        d.cluster
            .nodes
            .push(node(name.clone(), &["batch", "elastic", "elastic-sat"]));
        for p in &mut d.cluster.partitions {
            p.node_names.push(name.clone());
        }
        let waiting = with_waiting(&mut d, "elastic");
        // A user of its own: under fair shares a second job of a user who already
        // holds its share would wait behind that user's running job, fault or not.
        d.cluster
            .jobs
            .iter_mut()
            .find(|j| j.job_id == waiting)
            .unwrap()
            .user_id = 2000 + k as u32;
        let sats = satellites_running(&d);
        let submits = d.cluster.calls.submits;
        set(&mut d, true);
        run(&mut d, &mut now, 10);
        let fault = d.partition_fault.clone().unwrap_or_default();
        assert!(fault.contains(rule), "case {k}: {fault:?}");
        let snap = d.snapshot(now);
        assert_eq!(snap.partition_fault.as_deref(), Some(fault.as_str()));
        assert_eq!(slurm_job(&d, waiting).priority, 0, "case {k}: admitted");
        assert_eq!(d.cluster.calls.submits, submits, "case {k}: lent");
        assert_eq!(satellites_running(&d), sats, "case {k}: satellites ended");
        assert_eq!(d.cluster.calls.requeues, 0);
        set(&mut d, false);
        run(&mut d, &mut now, 1);
        assert_eq!(d.partition_fault, None, "case {k}");
        // Fair shares give the waiting job (another user's) a node the running job
        // gives up first: its satellite leaves within its shrink grace. Waited for
        // until it runs and no satellite is left to start, so that the next case
        // starts from a settled cluster.
        for _ in 0..60 {
            let settled = d
                .cluster
                .jobs
                .iter()
                .all(|j| j.state.base() != JobBase::Pending || j.priority == 0);
            if slurm_job(&d, waiting).state.base() == JobBase::Running && settled {
                break;
            }
            run(&mut d, &mut now, 1);
        }
        assert_ne!(
            slurm_job(&d, waiting).priority,
            0,
            "case {k}: not admitted after the fix"
        );
    }
}

/// Slurm's fairshare factor of a running elastic job's user reaches the engine as
/// that user's share weight (`send_user_weights`, journaled as `UserWeight`), and a
/// change of it at the next read of the factors (every PriorityCalcPeriod, at least
/// 30 s) follows.
#[test]
fn slurms_fairshare_factors_reach_the_engine_as_user_weights() {
    let (mut d, mut now) = grown("");
    let core = &mut d.cluster.jobs[0];
    core.account = Some("proj".into());
    core.user_name = Some("ann".into());
    let uid = core.user_id;
    let mut table = bftrainer_slurm::FairshareTable::default();
    table.users.insert(("proj".into(), "ann".into()), 0.25);
    d.cluster.priority = (
        bftrainer_slurm::PriorityWeights {
            multifactor: true,
            fairshare: 1000,
            calc_period_s: 30,
            ..Default::default()
        },
        table.clone(),
    );
    let mut waited = 0;
    while d.engine().user_weight(uid) != Some(0.25) {
        assert!(waited < 120, "weight {:?}", d.engine().user_weight(uid));
        run(&mut d, &mut now, 1);
        waited += 1;
    }
    table.users.insert(("proj".into(), "ann".into()), 0.75);
    d.cluster.priority.1 = table;
    let mut waited = 0;
    while d.engine().user_weight(uid) != Some(0.75) {
        assert!(waited < 120, "weight {:?}", d.engine().user_weight(uid));
        run(&mut d, &mut now, 1);
        waited += 1;
    }
}
