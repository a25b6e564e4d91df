//! Golden replays on hand-built traces; every expected figure is worked out by hand in
//! the comment above it. The invariant checker runs on every replay (SimConfig::check).

mod sim_common;

use bftrainer_core::easy::{schedule, SchedConfig};
use bftrainer_core::engine::EngineConfig;
use bftrainer_core::sim::{SimConfig, Steps};
use sim_common::*;

fn cfg(max_jobs: usize, grace_s: f64) -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            t_fwd_s: 10.0,
            max_jobs,
            ..EngineConfig::default()
        },
        grace_s,
        record: true,
        ..Default::default()
    }
}

/// Nodes a,b,c,d; a,b idle at 0, c idle at 10, a claimed at 30, window 100 s.
/// Job J: 1..4 nodes, Tup 10 s, Tdw 5 s, 10 samples/s per node, 1500 samples.
/// t=0 admit on a,b (charge Tup * rate(0) = 0), 20/s: 200 by t=10.
/// t=10 grow to 3: charge 10 * 20 = 200 -> 0; 30/s: 600 by t=30.
/// t=30 a preempted: charge 5 * rate(3) = 150 -> 450; 2 nodes, 20/s;
///      1050 left -> done at t = 30 + 52.5 = 82.5.
/// Idle node-s: 2*10 + 3*20 + 2*70 = 220; harvested: 2*10 + 3*20 + 2*52.5 = 185.
#[test]
fn one_job_grow_preempt_finish() {
    let tr = grow_preempt_trace(&[]);
    let jobs = [grow_preempt_job()];
    let out = run(&tr, &jobs, FillInOrder, &cfg(10, 0.0));
    let r = &out.report;
    assert_eq!(r.jobs_completed, 1);
    assert!(close(r.jct_mean_s.unwrap(), 82.5), "{:?}", r.jct_mean_s);
    assert!(close(r.idle_node_h * 3600.0, 220.0));
    assert!(close(r.harvested_node_h * 3600.0, 185.0));
    assert!(close(r.unused_node_h * 3600.0, 35.0));
    assert!(close(r.samples, 1500.0));
    assert!(close(r.samples_dedicated, 1850.0));
    assert!(close(r.rescale_loss_samples, 200.0));
    assert!(close(r.preemption_loss_samples, 150.0));
    assert_eq!(
        (
            r.actions.admits,
            r.actions.grows,
            r.actions.shrinks,
            r.preempted_nodes
        ),
        (1, 1, 0, 1)
    );
    let sizes: Vec<(f64, u32)> = out.sizes.iter().map(|s| (s.t, s.nodes)).collect();
    assert_eq!(sizes, vec![(0.0, 2), (10.0, 3), (30.0, 2), (82.5, 0)]);
}

/// Same trace, grace 3 s: at t=30 the job keeps a for 3 s (3 nodes, 30/s) and pays
/// (5 - 3) * 30 = 60. Progress: 600 - 60 = 540 at 30, +90 by 33 = 630, then 20/s:
/// 870 left -> done at 33 + 43.5 = 76.5. Grace node-s: 3; harvested (idle nodes
/// only): 20 + 60 + 2 * 46.5 = 173.
#[test]
fn grace_keeps_the_node_and_reduces_the_charge() {
    let tr = grow_preempt_trace(&[]);
    let jobs = [grow_preempt_job()];
    let r = run(&tr, &jobs, FillInOrder, &cfg(10, 3.0)).report;
    assert!(close(r.jct_mean_s.unwrap(), 76.5), "{:?}", r.jct_mean_s);
    assert!(close(r.preemption_loss_samples, 60.0));
    assert!(close(r.grace_node_h * 3600.0, 3.0));
    assert!(close(r.harvested_node_h * 3600.0, 173.0));
}

/// max_jobs = 1: K (submitted at 0) waits until J ends. Two idle nodes all along,
/// 100 s. J: 2 nodes at 10/s each, 400 samples -> done at 20. K admitted at 20 on
/// both (charge 0), 400 samples -> done at 40: JCT 40. J's JCT 20: mean 30.
/// Harvested 2 * 40 = 80 of 200 idle node-s.
#[test]
fn admission_waits_for_a_slot() {
    let tr = trace(&["a", "b"], &[true, true], &[], 100);
    let r1 = [(1, 10.0), (2, 20.0)];
    let jobs = [
        job("J", 0, 1, 2, 1.0, 1.0, 400.0, &r1),
        job("K", 0, 1, 2, 1.0, 1.0, 400.0, &r1),
    ];
    let out = run(&tr, &jobs, FillInOrder, &cfg(1, 0.0));
    let r = &out.report;
    assert_eq!(r.jobs_completed, 2);
    assert!(close(r.jct_mean_s.unwrap(), 30.0));
    assert_eq!(r.jobs[1].first_admit_s, Some(20.0));
    assert!(close(r.harvested_node_h * 3600.0, 80.0));
    assert!(close(r.idle_node_h * 3600.0, 200.0));
    // One step per distinct time: 0, 20, 40, and the window's last step is not a step.
    assert_eq!(
        out.steps.iter().map(|s| s.t).collect::<Vec<_>>(),
        vec![0.0, 20.0, 40.0]
    );
}

/// A job below its minimum makes no progress: min 2, one idle node -> FillInOrder
/// cannot admit it (would be below min) and the job stays queued at 0 samples.
#[test]
fn below_minimum_is_never_admitted() {
    let tr = trace(&["a", "b"], &[true, false], &[], 50);
    let jobs = [job("J", 0, 2, 2, 1.0, 1.0, 100.0, &[(1, 10.0), (2, 20.0)])];
    let r = run(&tr, &jobs, FillInOrder, &cfg(10, 0.0)).report;
    assert_eq!((r.jobs_admitted, r.jobs_completed), (0, 0));
    assert_eq!(r.harvested_node_h, 0.0);
    assert!(close(r.unused_node_h * 3600.0, 50.0));
}

/// EASY schedule of easy::tests (4 nodes): idle n2,n3 on [0,2) and [52,100), n1..n3
/// on [150,350), n0 never after 0 until 350 (end). Idle node-s: 4 + 96 + 600 = 700 =
/// 4 * 350 - busy 700. One elastic job on 1..4 nodes that never finishes harvests all.
#[test]
fn easy_trace_feeds_the_simulator() {
    let (tr, m) = schedule(&easy_example_log(), &SchedConfig::default()).unwrap();
    assert!(close(m.utilisation, 0.5));
    let jobs = [job("J", 0, 1, 4, 0.0, 0.0, 1e12, &[(1, 1.0), (4, 4.0)])];
    let r = run(&tr, &jobs, FillInOrder, &cfg(10, 0.0)).report;
    assert!(close(r.idle_node_h * 3600.0, 700.0));
    assert!(close(r.harvested_node_h * 3600.0, 700.0));
    // 1 sample/s per node, no charges.
    assert!(close(r.samples, 700.0));
    // Claims of lent nodes: n2,n3 at 2 and at 100.
    assert_eq!(r.preempted_nodes, 4);
}

/// BFTrainer's stepping (`Steps::Trace`) on the trace of `one_job_grow_preempt_finish`
/// plus d turning idle at 90: the job reaches 1500 at 82.5 but is seen done at the
/// next event, 90, holding b and c until then: progress 450 + 20 * 60 = 1650, overrun
/// 150, JCT 90. Harvested 2*10 + 3*20 + 2*60 = 200 node-s; idle adds b, c, d over
/// [90,100): 200 + 30 = 230, unused 30. Dedicated 200 + 600 + 1200 = 2000 = 1500 +
/// 200 rescale + 150 preemption + 150 overrun.
#[test]
fn trace_steps_finish_at_the_next_event() {
    let tr = grow_preempt_trace(&[(90, 3, true)]);
    let jobs = [grow_preempt_job()];
    let c = SimConfig {
        steps: Steps::Trace,
        ..cfg(10, 0.0)
    };
    let out = run(&tr, &jobs, FillInOrder, &c);
    let r = &out.report;
    assert_eq!(r.jobs_completed, 1);
    assert!(close(r.jct_mean_s.unwrap(), 90.0), "{:?}", r.jct_mean_s);
    assert!(close(r.idle_node_h * 3600.0, 230.0));
    assert!(close(r.harvested_node_h * 3600.0, 200.0));
    assert!(close(r.unused_node_h * 3600.0, 30.0));
    assert!(close(r.samples, 1500.0));
    assert!(close(r.samples_dedicated, 2000.0));
    assert!(close(r.rescale_loss_samples, 200.0));
    assert!(close(r.preemption_loss_samples, 150.0));
    assert!(close(r.overrun_loss_samples, 150.0));
    assert!(close(r.efficiency, 0.75));
    let sizes: Vec<(f64, u32)> = out.sizes.iter().map(|s| (s.t, s.nodes)).collect();
    assert_eq!(sizes, vec![(0.0, 2), (10.0, 3), (30.0, 2), (90.0, 0)]);
    // The same run with exact steps: done at 82.5, no overrun.
    let e = run(&tr, &jobs, FillInOrder, &cfg(10, 0.0)).report;
    assert!(close(e.jct_mean_s.unwrap(), 82.5));
    assert_eq!(e.overrun_loss_samples, 0.0);
}

/// With `Steps::Trace` a submission waits for the next trace event: a idle from 0, b
/// from 20, J submitted at 5 -> admitted at 20 on a and b (first admission 15 s after
/// submission); with exact steps at 5 on a. One job that never finishes, 10/s per
/// node: trace 2 * 10 * 80 = 1600 samples by 100; exact 10 * 15 + 20 * 80 = 1750.
#[test]
fn trace_steps_submissions_wait_for_the_next_event() {
    let tr = trace(&["a", "b"], &[true, false], &[(20, 1, true)], 100);
    let jobs = [job("J", 5, 1, 2, 0.0, 0.0, 1e9, &[(1, 10.0), (2, 20.0)])];
    let t = run(
        &tr,
        &jobs,
        FillInOrder,
        &SimConfig {
            steps: Steps::Trace,
            ..cfg(10, 0.0)
        },
    )
    .report;
    assert_eq!(t.jobs[0].first_admit_s, Some(15.0));
    assert!(close(t.samples, 1600.0));
    let e = run(&tr, &jobs, FillInOrder, &cfg(10, 0.0)).report;
    assert_eq!(e.jobs[0].first_admit_s, Some(0.0));
    assert!(close(e.samples, 1750.0));
}
