//! Observing a real cluster through the safe layer: nodes, partitions, the no-change
//! path of the loads, and how errors come back.

mod common;

use std::time::{Duration, Instant};

use bftrainer_slurm::{ClusterView, Loaded, NodeBase, SignalTarget, Slurm};
use common::TestCluster;

#[test]
fn cluster_observe_nodes_partitions_errors_and_no_change() {
    let c = TestCluster::start();
    let s = c.slurm;
    // One process, one cluster: a second configuration is refused, the same one is fine.
    let e =
        bftrainer_slurm::Slurm::init_with_config(std::path::Path::new("/etc/hosts")).unwrap_err();
    assert!(e.to_string().contains("already initialised"), "{e}");
    bftrainer_slurm::Slurm::init_with_config(c.cluster.slurm_conf()).unwrap();
    bftrainer_slurm::Slurm::init().unwrap();
    assert_eq!(
        std::env::var_os("SLURM_CONF").as_deref(),
        Some(c.cluster.slurm_conf().as_os_str())
    );

    let mut view = ClusterView::default();
    let first = view.refresh(&s).unwrap();
    assert!(
        first.nodes && first.partitions && first.jobs,
        "first refresh loads all"
    );

    let names: Vec<&str> = view.nodes().iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n1", "n2", "n3", "n4"]);
    for n in view.nodes() {
        assert_eq!(
            n.state.base(),
            NodeBase::Idle,
            "{} is {}",
            n.name,
            n.state.name()
        );
        assert!(!n.state.is_drain() && !n.state.is_planned());
        assert_eq!(n.cpus, 2);
        assert!(n.real_memory_mb > 0);
        assert_eq!(
            n.partitions,
            ["batch", "elastic", "elastic-sat"],
            "node {}",
            n.name
        );
        assert_eq!(n.gpus, 0);
        assert_eq!(n.alloc_cpus, Some(0));
        // The test cluster gives every node `Features=bft,rackK`, K = ceil(i / 2).
        let i: u32 = n.name[1..].parse().unwrap();
        let rack = format!("rack{}", i.div_ceil(2));
        assert_eq!(n.features, ["bft", rack.as_str()], "node {}", n.name);
        assert_eq!(n.active_features, n.features, "node {}", n.name);
    }

    let batch = view
        .partitions()
        .iter()
        .find(|p| p.name == "batch")
        .unwrap();
    let elastic = view
        .partitions()
        .iter()
        .find(|p| p.name == "elastic")
        .unwrap();
    assert!(batch.is_default && !elastic.is_default);
    assert!(batch.priority_tier > elastic.priority_tier);
    assert!(elastic.preempt_requeues());
    assert!(elastic.grace_time_s > 0);
    assert_eq!(elastic.node_names, ["n1", "n2", "n3", "n4"]);
    assert_eq!(elastic.total_cpus, 8);
    assert!(batch.up && elastic.up);
    // Satellites one tier below core jobs: Slurm preempts them first.
    let sat = view
        .partitions()
        .iter()
        .find(|p| p.name == "elastic-sat")
        .unwrap();
    assert!(sat.priority_tier < elastic.priority_tier && !sat.preempt_requeues());

    // No change: each load answers SLURM_NO_CHANGE_IN_DATA. The controller may still
    // touch node records right after start-up (registrations), so allow it to settle.
    common::wait_for(20, "an unchanged refresh", || {
        let r = view.refresh(&s).unwrap();
        (!r.any()).then_some(())
    });

    measure_refresh(&s, &mut view, "no jobs");

    // A change shows up: a submitted job makes the job snapshot change.
    let sub = s
        .submit_batch(&bftrainer_slurm::BatchJob {
            script: common::SLEEP_SCRIPT.into(),
            name: Some("observe".into()),
            hold: true,
            work_dir: Some("/tmp".into()),
            ..Default::default()
        })
        .unwrap();
    let r = view.refresh(&s).unwrap();
    assert!(r.jobs, "the new job changes the job snapshot");
    let j = view.jobs().iter().find(|j| j.job_id == sub.job_id).unwrap();
    assert_eq!(j.name, "observe");
    assert_eq!(j.user_name.as_deref(), Some("root"));
    assert!(j.is_held());

    assert_eq!(s.cluster_name().unwrap(), "bftest");

    // Errors carry Slurm's own text.
    let e = s.cancel_job(999_999).unwrap_err();
    assert!(e.is_invalid_job_id(), "{e}");
    assert!(e.to_string().contains("Invalid job id specified"), "{e}");
    assert!(e.to_string().contains("slurm_kill_job"), "{e}");
    let e = s.load_job(999_999).unwrap_err();
    assert!(e.is_invalid_job_id(), "{e}");
    let e = s
        .signal_job(999_999, libc::SIGUSR1, SignalTarget::Everything)
        .unwrap_err();
    assert!(e.is_invalid_job_id(), "{e}");
    let e = s.hold(999_999).unwrap_err();
    assert!(e.is_invalid_job_id(), "{e}");
    let e = s.requeue(999_999, false).unwrap_err();
    assert!(e.is_invalid_job_id(), "{e}");
    // A partition that does not exist is refused by slurmctld with its own message.
    let e = s
        .submit_batch(&bftrainer_slurm::BatchJob {
            script: common::SLEEP_SCRIPT.into(),
            partition: Some("nosuch".into()),
            work_dir: Some("/tmp".into()),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        e.to_string().contains("Invalid partition name specified"),
        "{e}"
    );

    // Concurrent calls from several threads, as a tokio daemon's blocking pool makes
    // them: successes stay consistent and each thread gets its own error (errno is
    // per thread).
    std::thread::scope(|scope| {
        for t in 0..4 {
            scope.spawn(move || {
                for _ in 0..25 {
                    let nodes = s.load_nodes(None).unwrap().changed().unwrap();
                    assert_eq!(nodes.nodes.len(), 4);
                    let e = s.load_job(900_000 + t).unwrap_err();
                    assert!(e.is_invalid_job_id(), "thread {t}: {e}");
                    let jobs = s.load_jobs(None).unwrap().changed().unwrap();
                    assert!(jobs.get(sub.job_id).is_some());
                    assert_eq!(bftrainer_slurm::hostlist_expand("n[1-2]").unwrap().len(), 2);
                }
            });
        }
    });

    // With a queue of held jobs the unchanged path saves packing and copying them.
    for i in 0..200 {
        s.submit_batch(&bftrainer_slurm::BatchJob {
            script: common::SLEEP_SCRIPT.into(),
            name: Some(format!("queued-{i}")),
            hold: true,
            work_dir: Some("/tmp".into()),
            ..Default::default()
        })
        .unwrap();
    }
    common::wait_for(20, "an unchanged refresh", || {
        let r = view.refresh(&s).unwrap();
        (!r.any()).then_some(())
    });
    assert_eq!(view.jobs().len(), 201);
    measure_refresh(&s, &mut view, "201 pending jobs");

    // A job array submitted with Slurm's own sbatch: its pending tasks are one record.
    let array = c
        .cluster
        .sbatch(&["--array=1-3", "-H", "-o", "/dev/null", "--wrap", "sleep 60"])
        .unwrap();
    let j = s.load_job(array).unwrap();
    assert_eq!(j.array_job_id, Some(array));
    assert_eq!(j.array_task_str.as_deref(), Some("1-3"));
    assert_eq!(j.array_task_id, None, "pending tasks are not split yet");
    assert!(j.het_job_id.is_none() && j.het_job_offset.is_none());

    s.cancel_job(sub.job_id).unwrap();
}

/// The cost of the unchanged path against full loads with a long queue, where the
/// payload matters more than the round trip. Slow to set up (one RPC per job), so run
/// on demand: `BFT_JOBS=2000 cargo nextest run -p bftrainer-slurm --run-ignored
/// ignored-only --no-capture -E 'test(refresh_cost)'`.
#[test]
#[ignore]
fn cluster_observe_refresh_cost_with_a_long_queue() {
    let c = TestCluster::start();
    let s = c.slurm;
    let n: u32 = std::env::var("BFT_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    for i in 0..n {
        s.submit_batch(&bftrainer_slurm::BatchJob {
            script: common::SLEEP_SCRIPT.into(),
            name: Some(format!("queued-{i}")),
            hold: true,
            work_dir: Some(c.work_dir()),
            ..Default::default()
        })
        .unwrap();
    }
    let mut view = ClusterView::default();
    common::wait_for(60, "an unchanged refresh", || {
        let r = view.refresh(&s).unwrap();
        (!r.any()).then_some(())
    });
    assert_eq!(view.jobs().len(), n as usize);
    measure_refresh(&s, &mut view, &format!("{n} pending jobs"));
}

/// Times the unchanged path against full loads and prints it (not asserted); rounds
/// alternate so both see the same machine load. A round in which the controller did
/// change something (the scheduler touches pending jobs on each of its passes, more
/// often seen on a loaded machine) is not counted: rounds go on until 100 quiet ones
/// are counted or 20 s have passed. The figure is information, so a busy controller
/// that leaves too few quiet rounds is reported, not failed (CI once saw 30 of 100).
fn measure_refresh(s: &Slurm, view: &mut ClusterView, what: &str) {
    let want = 100u32;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut unchanged, mut full, mut counted, mut rounds) =
        (Duration::ZERO, Duration::ZERO, 0u32, 0u32);
    while counted < want && Instant::now() < deadline {
        rounds += 1;
        let (nodes, parts, jobs) = view.snapshots();
        let (nt, pt, jt) = (nodes.last_update, parts.last_update, jobs.last_update);
        let t = Instant::now();
        let a = s.load_nodes(Some(nt)).unwrap();
        let b = s.load_partitions(Some(pt)).unwrap();
        let c = s.load_jobs(Some(jt)).unwrap();
        let u = t.elapsed();
        let t = Instant::now();
        s.load_nodes(None).unwrap();
        s.load_partitions(None).unwrap();
        s.load_jobs(None).unwrap();
        let f = t.elapsed();
        if a == Loaded::Unchanged && b == Loaded::Unchanged && c == Loaded::Unchanged {
            unchanged += u;
            full += f;
            counted += 1;
        } else {
            view.refresh(s).unwrap();
        }
    }
    if counted < 10 {
        eprintln!(
            "MEASURED refresh, 4 nodes, {what}: not measured, only {counted} of {rounds} \
             rounds were quiet within 20 s (the controller kept changing)"
        );
    } else {
        eprintln!(
            "MEASURED refresh, 4 nodes, {what}: unchanged {:?}/round, full {:?}/round, \
             ratio full/unchanged {:.2} ({counted} quiet of {rounds} rounds)",
            unchanged / counted,
            full / counted,
            full.as_secs_f64() / unchanged.as_secs_f64()
        );
    }
    view.refresh(s).unwrap();
}
