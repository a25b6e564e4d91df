//! Batch size as the allocator's decision in the engine (issue 32, Saxena et al.): a job
//! with a batch range (`Event::BatchRange`) whose rate is measured at a known batch
//! (`Event::JobBatch`) gets batch curves from `alloc::efficiency`, and the decision
//! picks its nodes and batch together.

mod engine_common;

use bftrainer_core::alloc::{Curve, EfficiencyModel};
use bftrainer_core::engine::{Engine, EngineConfig, Event, Exact, JobSnap};
use engine_common::{idle_nodes, spec};

/// Four idle nodes and job 0 (1 to 4 nodes) with `objective`; no fair share.
fn one_job(objective: Curve) -> Engine<Exact> {
    let cfg = EngineConfig {
        fair_share: false,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(cfg, Exact::default());
    idle_nodes(&mut e, 4);
    let mut a = spec("a", 1, 4, 1.0);
    a.objective = objective;
    e.on_event(&Event::JobSubmitted { job: 0, spec: a }, 0.0)
        .unwrap();
    e
}

/// Job 0 scales badly at its measured batch of 32 (synchronisation-bound: 100 samples/s
/// on one node, 160 on four), job 1 linearly (60 per node); four idle nodes.
fn engine(range: Option<(u32, u32)>) -> Engine<Exact> {
    let mut e = one_job(Curve::new(vec![(1, 100.0), (4, 160.0)]));
    let mut b = spec("b", 1, 4, 60.0);
    b.objective = Curve::new(vec![(1, 60.0), (4, 240.0)]);
    e.on_event(&Event::JobSubmitted { job: 1, spec: b }, 0.0)
        .unwrap();
    e.on_event(&Event::BatchRange { job: 0, range }, 0.0)
        .unwrap();
    e
}

#[test]
fn a_batch_range_lets_a_sync_bound_job_take_more_nodes_at_a_larger_batch() {
    // Without a range: one node for job 0 (its second is worth 20, job 1's third 60).
    let mut fixed = engine(None);
    fixed
        .on_event(&Event::JobBatch { job: 0, batch: 32 }, 0.0)
        .unwrap();
    fixed.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!((fixed.job_nodes(0).len(), fixed.job_nodes(1).len()), (1, 3));
    assert_eq!(fixed.decided_batch(0), None);

    // With 32..512: at 512 its steps amortise the synchronisation (model: 192 samples/s
    // on 2 nodes, 366 on 4), so it takes the nodes and the largest batch.
    let mut joint = engine(Some((32, 512)));
    // No measured batch yet: no batch decision, the plain curve decides.
    joint.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(joint.decided_batch(0), None);
    assert_eq!(joint.job_nodes(0).len(), 1);
    joint
        .on_event(&Event::JobBatch { job: 0, batch: 32 }, 1.0)
        .unwrap();
    joint.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(joint.decided_batch(0), Some(512));
    assert!(joint.job_nodes(0).len() > 1, "{:?}", joint.job_nodes(0));
    assert_eq!(joint.job_batch(0), (Some((32, 512)), Some(32)));
    // Job 1 never gets a batch.
    assert_eq!(joint.decided_batch(1), None);
}

#[test]
fn rates_at_another_batch_are_rebased_by_the_model_and_the_range_can_go() {
    let mut e = engine(Some((32, 512)));
    e.on_event(&Event::JobBatch { job: 0, batch: 32 }, 0.0)
        .unwrap();
    e.on_event(&Event::Tick, 0.0).unwrap();
    let n = e.job_nodes(0).len() as u32;
    e.on_event(
        &Event::Progress {
            job: 0,
            samples_per_s: 150.0,
            remaining: None,
            nodes: Some(n),
        },
        1.0,
    )
    .unwrap();
    let measured = |e: &Engine<Exact>| match &e.state().jobs[0] {
        JobSnap::Live {
            measured,
            batch_now,
            ..
        } => (measured.len(), *batch_now),
        JobSnap::Forgotten { .. } => unreachable!(),
    };
    assert_eq!(measured(&e), (1, Some(32)));
    // The workers took the decided batch: the rate at 32 becomes the model's
    // prediction at 512 (more samples per synchronisation: higher).
    e.on_event(&Event::JobBatch { job: 0, batch: 512 }, 2.0)
        .unwrap();
    assert_eq!(measured(&e).1, Some(512));
    let rate = |e: &Engine<Exact>| match &e.state().jobs[0] {
        JobSnap::Live { measured, .. } => measured[0].1,
        JobSnap::Forgotten { .. } => unreachable!(),
    };
    let predicted = rate(&e);
    // Measured 150 at 32 on n nodes; the model, over the curve scaled to it
    // (93.75 on one node), at 512.
    let want = EfficiencyModel::new(32).throughput(
        &Curve::new(vec![(1, 100.0 * 150.0 / 160.0), (4, 150.0)]),
        n,
        512,
    );
    assert!(
        n == 1 || (predicted - want).abs() < 1e-9,
        "{predicted} {want}"
    );
    assert!(predicted >= 150.0, "{predicted}");
    // Same batch again: nothing dropped.
    e.on_event(
        &Event::Progress {
            job: 0,
            samples_per_s: 300.0,
            remaining: None,
            nodes: Some(n),
        },
        3.0,
    )
    .unwrap();
    e.on_event(&Event::JobBatch { job: 0, batch: 512 }, 3.0)
        .unwrap();
    assert_eq!(measured(&e), (1, Some(512)));
    assert_eq!(rate(&e), 300.0);
    // The snapshot keeps range and batch.
    let mut again = Engine::new(EngineConfig::default(), Exact::default());
    again.load_state(&e.state()).unwrap();
    assert_eq!(again.job_batch(0), (Some((32, 512)), Some(512)));
    // The range taken away (or an empty one): no batch decision any more.
    e.on_event(
        &Event::BatchRange {
            job: 0,
            range: Some((64, 32)),
        },
        4.0,
    )
    .unwrap();
    e.on_event(&Event::Tick, 4.0).unwrap();
    assert_eq!(e.decided_batch(0), None);
    assert_eq!(e.job_batch(0).0, None);
}

/// A job whose batches the model cannot tell apart (its curve scales better than
/// linearly: no synchronisation part to amortise, every batch the same goodput) keeps
/// the batch it runs at. Ties went to the smallest batch: a job moved to 64 was sent
/// back to 16 at the next decision, then up again when a rate measured in another
/// regime tipped the model (the live test saw 64, 16, 64, 16 every 30 s).
#[test]
fn a_tie_between_batches_keeps_the_batch_the_job_runs_at() {
    let mut e = one_job(Curve::new(vec![(1, 100.0), (4, 500.0)]));
    e.on_event(
        &Event::BatchRange {
            job: 0,
            range: Some((16, 64)),
        },
        0.0,
    )
    .unwrap();
    e.on_event(&Event::JobBatch { job: 0, batch: 64 }, 0.0)
        .unwrap();
    for t in 1..5 {
        e.on_event(&Event::Tick, t as f64).unwrap();
        assert_eq!(e.decided_batch(0), Some(64), "decision at t={t}");
    }
    assert_eq!(e.job_nodes(0).len(), 4);
}

/// The margin itself: another batch must promise more than 10% over the current one.
#[test]
fn a_batch_change_needs_more_than_the_switch_gain() {
    use bftrainer_core::alloc::{batch_to_run, BatchCurve, JobInput, BATCH_SWITCH_GAIN};
    let job = |at_64: f64| {
        let mut j = JobInput::new("j", 1, 4, 1.0, 1.0, Curve::new(Vec::new()));
        j.batch_curves = vec![
            BatchCurve {
                batch_size: 16,
                curve: Curve::new(vec![(1, 100.0), (4, 100.0)]),
            },
            BatchCurve {
                batch_size: 64,
                curve: Curve::new(vec![(1, 100.0), (4, at_64)]),
            },
        ];
        j
    };
    let gain = 100.0 * (1.0 + BATCH_SWITCH_GAIN);
    // Within the margin: stays at 16; a fresh job (no current batch) takes the best.
    assert_eq!(batch_to_run(&job(gain - 1.0), 4, Some(16)), Some(16));
    assert_eq!(batch_to_run(&job(gain - 1.0), 4, None), Some(64));
    // Past it: moves.
    assert_eq!(batch_to_run(&job(gain + 1.0), 4, Some(16)), Some(64));
    // Running at 64 and 64 is still the best: stays.
    assert_eq!(batch_to_run(&job(gain + 1.0), 4, Some(64)), Some(64));
    // A current batch that is no candidate: the best one.
    assert_eq!(batch_to_run(&job(gain - 1.0), 4, Some(32)), Some(64));
    // On one node the two tie: the current one stays either way.
    assert_eq!(batch_to_run(&job(gain + 1.0), 1, Some(64)), Some(64));
    assert_eq!(batch_to_run(&job(gain + 1.0), 1, Some(16)), Some(16));
}
