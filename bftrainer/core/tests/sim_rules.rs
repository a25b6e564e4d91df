//! bftrainerd's rules in the simulator (`SimConfig::rules`), one at a time on tiny
//! hand-built traces; every expected figure is worked out by hand in the comment above
//! it. The allocator is `FillInOrder` (keeps nodes, fills in pool order), so the first
//! node of an admission is the job's core node (its anchor) when `min_nodes` is 1.

mod sim_common;

use bftrainer_core::engine::{EngineConfig, Event};
use bftrainer_core::sim::{CoreLoss, DaemonRules, Outcome, SimConfig};
use bftrainer_core::trace::jobs::JobRecord;
use sim_common::*;

fn cfg(rules: DaemonRules) -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            t_fwd_s: 10.0,
            max_jobs: 10,
            ..EngineConfig::default()
        },
        record: true,
        journal: true,
        rules,
        ..Default::default()
    }
}

fn only(f: impl FnOnce(&mut DaemonRules)) -> DaemonRules {
    let mut r = DaemonRules::NONE;
    f(&mut r);
    r
}

/// J of the grow-and-preempt trace with `min` nodes at least.
fn j_min(min: u32) -> JobRecord {
    JobRecord {
        min_nodes: min,
        ..grow_preempt_job()
    }
}

/// (time, event) of the journal matching `f`.
fn events(out: &Outcome, f: impl Fn(&Event) -> bool) -> Vec<(f64, Event)> {
    out.journal
        .iter()
        .filter(|r| f(&r.event))
        .map(|r| (r.t, r.event.clone()))
        .collect()
}

fn node_s(h: f64) -> f64 {
    h * 3600.0
}

/// No rule: the figures of sim_golden's `one_job_grow_preempt_finish` (JCT 82.5 s,
/// harvested 185 of 220 idle node-s), whatever `DaemonRules::NONE` adds to the journal.
#[test]
fn no_rules_is_the_plain_job_model() {
    let out = run(
        &grow_preempt_trace(&[]),
        &[grow_preempt_job()],
        FillInOrder,
        &cfg(DaemonRules::NONE),
    );
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 82.5), "{:?}", r.jct_mean_s);
    assert!(close(node_s(r.harvested_node_h), 185.0));
    assert!(close(node_s(r.idle_node_h), 220.0));
    assert_eq!((r.released_nodes, r.core_loss_requeues), (0, 0));
    assert_eq!(r.starting_node_h, 0.0);
}

/// Core loss = requeue. J needs 2 nodes (core a, b: its admission's first two).
/// Reclaim hold 10 s. t=0 admit a,b: 20/s. c, left by a regular job at 10, is lent at
/// 20: (400 done) grow onto c: charge 10 * 20 = 200 -> 200; 30/s.
/// t=30 (500 done) a regular job takes a, a core node: the whole job is requeued:
///   charge 5 * 30 = 150 -> 350; b goes with the core job (claimed, held 10 s), c's
///   satellite leaves (c idle at once); c alone is below J's minimum: it waits.
/// t=40 b lent again: J admitted on b,c, 20/s; 1150 left -> done at 97.5.
/// Harvested: 2*20 + 3*10 + 0*10 + 2*57.5 = 185 node-s; 2 nodes preempted (a, b).
/// Without the hold (0 s), c is lent at 10 and b comes back at 30, where J is
/// re-admitted at once: as with `CoreLoss::Node` (J keeps b,c): done at 82.5.
#[test]
fn losing_a_core_node_requeues_the_whole_job() {
    let tr = grow_preempt_trace(&[]);
    let jobs = [j_min(2)];
    let rules = only(|r| {
        r.core_loss = CoreLoss::Job;
        r.reclaim_hold_s = 10.0;
    });
    let out = run(&tr, &jobs, FillInOrder, &cfg(rules));
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 97.5), "{:?}", r.jct_mean_s);
    assert!(
        close(node_s(r.harvested_node_h), 185.0),
        "{}",
        node_s(r.harvested_node_h)
    );
    assert!(close(node_s(r.idle_node_h), 220.0));
    assert!(close(r.preemption_loss_samples, 150.0));
    assert!(close(r.rescale_loss_samples, 200.0));
    assert_eq!(r.core_loss_requeues, 1);
    assert_eq!(r.preempted_nodes, 2);
    assert_eq!((r.actions.admits, r.actions.grows), (2, 1));
    // The daemon's events at the loss: both core nodes claimed, the satellite left.
    let at30 = events(&out, |e| {
        matches!(
            e,
            Event::NodeClaimed { .. } | Event::WorkerPreempted { .. } | Event::WorkerLeft { .. }
        )
    });
    assert_eq!(
        at30,
        vec![
            (30.0, Event::NodeClaimed { node: 0 }),
            (30.0, Event::NodeClaimed { node: 1 }),
            (30.0, Event::WorkerPreempted { job: 0, node: 0 }),
            (30.0, Event::WorkerPreempted { job: 0, node: 1 }),
            (30.0, Event::WorkerLeft { job: 0, node: 2 }),
        ]
    );
    let idle_b = events(&out, |e| matches!(e, Event::NodeIdle { node: 1, .. }));
    assert_eq!(idle_b.last().unwrap().0, 40.0);

    let no_hold = only(|r| r.core_loss = CoreLoss::Job);
    let r = run(&tr, &jobs, FillInOrder, &cfg(no_hold)).report;
    assert!(close(r.jct_mean_s.unwrap(), 82.5), "{:?}", r.jct_mean_s);
    assert_eq!((r.core_loss_requeues, r.actions.admits), (1, 2));

    let r = run(&tr, &jobs, FillInOrder, &cfg(DaemonRules::NONE)).report;
    assert!(close(r.jct_mean_s.unwrap(), 82.5), "{:?}", r.jct_mean_s);
    assert_eq!(
        (r.core_loss_requeues, r.actions.admits, r.preempted_nodes),
        (0, 1, 1)
    );
}

/// Reclaim hold, 10 s: c, left by a regular job at 10, is lent from 20.
/// t=0 admit a,b: 20/s; t=20 (400 done) grow onto c: charge 200 -> 200; 30/s.
/// t=30 (500) a taken (core loss = node): charge 150 -> 350; 20/s, 1150 left -> 87.5.
/// Harvested: 2*20 + 3*10 + 2*57.5 = 185 of 220 idle node-s.
#[test]
fn reclaim_hold_delays_lending_a_node_a_regular_job_left() {
    let tr = grow_preempt_trace(&[]);
    let out = run(
        &tr,
        &[grow_preempt_job()],
        FillInOrder,
        &cfg(only(|r| r.reclaim_hold_s = 10.0)),
    );
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 87.5), "{:?}", r.jct_mean_s);
    assert!(close(node_s(r.harvested_node_h), 185.0));
    assert!(close(node_s(r.unused_node_h), 35.0));
    assert!(close(r.rescale_loss_samples, 200.0));
    assert!(close(r.preemption_loss_samples, 150.0));
    let grows = events(&out, |e| matches!(e, Event::NodeIdle { node: 2, .. }));
    assert_eq!(
        grows,
        vec![(
            20.0,
            Event::NodeIdle {
                node: 2,
                reclaim_at: None
            }
        )]
    );
    // The nodes idle at the window's start are not held.
    assert_eq!(r.jobs[0].first_admit_s, Some(0.0));
}

/// Release before a planned start, 5 s. Nodes a, b idle at 0, c at 10; a regular job
/// takes b (a satellite of J: J's core is a) at 30; d is idle from 40 to 43.
/// t=0 admit a,b: 20/s; t=10 grow onto c: charge 200 -> 0; 30/s.
/// t=25 (450 done) b is released (a shrink's charge, 5 * 30 = 150 -> 300); 20/s on a,c,
///   1200 left -> done at 85. No preemption. d is never lent (taken 3 s after it idles).
/// Harvested: 2*10 + 3*15 + 2*60 = 185; idle 2*10 + 3*20 + 2*70 + 3 = 223.
/// The core node is not released: a regular job taking a at 30 preempts it there.
#[test]
fn release_before_a_planned_start_takes_satellites_back_not_cores() {
    let tr = trace(
        &["a", "b", "c", "d"],
        &[true, true, false, false],
        &[(10, 2, true), (30, 1, false), (40, 3, true), (43, 3, false)],
        100,
    );
    let rules = only(|r| r.release_before_s = 5.0);
    let out = run(&tr, &[grow_preempt_job()], FillInOrder, &cfg(rules));
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 85.0), "{:?}", r.jct_mean_s);
    assert!(
        close(node_s(r.harvested_node_h), 185.0),
        "{}",
        node_s(r.harvested_node_h)
    );
    assert!(close(node_s(r.idle_node_h), 223.0));
    assert!(close(r.rescale_loss_samples, 350.0));
    assert_eq!(r.preemption_loss_samples, 0.0);
    assert_eq!((r.released_nodes, r.preempted_nodes), (1, 0));
    assert_eq!(
        events(&out, |e| matches!(e, Event::NodeClaimed { .. })),
        vec![(25.0, Event::NodeClaimed { node: 1 })]
    );
    assert!(events(&out, |e| matches!(e, Event::NodeIdle { node: 3, .. })).is_empty());

    // J's core node a, taken at 30, stays lent until then (the grow-and-preempt trace).
    let out = run(
        &grow_preempt_trace(&[]),
        &[grow_preempt_job()],
        FillInOrder,
        &cfg(rules),
    );
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 82.5), "{:?}", r.jct_mean_s);
    assert_eq!((r.released_nodes, r.preempted_nodes), (0, 1));
}

/// Start latency, 1 s (the grow-and-preempt trace, core loss = node).
/// t=0 admit a,b; they work from 1 (20/s). t=10 (180) grow onto c: charge 200 -> -20;
/// c works from 11 (-20 + 20 = 0 at 11); 30/s. t=30 (570) a taken: charge 150 -> 420;
/// 20/s, 1080 left -> done at 84. Held 2*10 + 3*20 + 2*54 = 188 node-s, of which 3
/// waiting for starts (a, b for 1 s, c for 1 s): 185 did work.
/// The engine hears JobStarted at 1, WorkerJoined for b at 1 (a satellite of the
/// admission; a is the core) and for c at 11.
#[test]
fn start_latency_holds_nodes_without_work() {
    let out = run(
        &grow_preempt_trace(&[]),
        &[grow_preempt_job()],
        FillInOrder,
        &cfg(only(|r| r.start_latency_s = 1.0)),
    );
    let r = &out.report;
    assert!(close(r.jct_mean_s.unwrap(), 84.0), "{:?}", r.jct_mean_s);
    assert!(
        close(node_s(r.harvested_node_h), 188.0),
        "{}",
        node_s(r.harvested_node_h)
    );
    assert!(close(node_s(r.starting_node_h), 3.0));
    assert!(
        close(node_s(r.useful_node_h), 185.0),
        "{}",
        node_s(r.useful_node_h)
    );
    assert_eq!(
        events(&out, |e| matches!(
            e,
            Event::JobStarted { .. } | Event::WorkerJoined { .. }
        )),
        vec![
            (1.0, Event::JobStarted { job: 0 }),
            (1.0, Event::WorkerJoined { job: 0, node: 1 }),
            (11.0, Event::WorkerJoined { job: 0, node: 2 }),
        ]
    );
    // Without latency the same events come with the decision, and the work at once.
    let out = run(
        &grow_preempt_trace(&[]),
        &[grow_preempt_job()],
        FillInOrder,
        &cfg(DaemonRules::NONE),
    );
    assert_eq!(
        events(&out, |e| matches!(e, Event::JobStarted { .. })),
        vec![(0.0, Event::JobStarted { job: 0 })]
    );
}

/// All of the daemon's defaults at once on a busier trace: the replay runs with the
/// invariant checker, the engine accepts every event it is sent, and the journal
/// replays into a fresh engine with the same actions.
#[test]
fn daemon_defaults_keep_the_invariants_and_the_journal_replays() {
    // Each node flips between idle and busy every 37 s x 5, in turn.
    let initial = [true, true, true, false, true, false];
    let mut idle = initial;
    let mut changes = Vec::new();
    for k in 0..80i64 {
        let node = (k * 5 % 6) as usize;
        idle[node] = !idle[node];
        changes.push((100 + 37 * k, node as u32, idle[node]));
    }
    let tr = trace(&["a", "b", "c", "d", "e", "f"], &initial, &changes, 3600);
    let jobs = [
        job("A", 0, 2, 4, 10.0, 5.0, 1e9, &[(1, 10.0), (4, 40.0)]),
        job("B", 50, 1, 3, 10.0, 5.0, 5e3, &[(1, 10.0), (3, 30.0)]),
    ];
    let out = run(&tr, &jobs, FillInOrder, &cfg(DaemonRules::DAEMON));
    let r = &out.report;
    assert!(r.harvested_node_h <= r.idle_node_h);
    assert!(close(r.harvested_node_h + r.unused_node_h, r.idle_node_h));
    assert!(r.useful_node_h <= r.harvested_node_h);
    // Every rule took part.
    assert!(r.core_loss_requeues > 0 && r.released_nodes > 0, "{r:?}");
    assert!(r.starting_node_h > 0.0);
    let mut e = bftrainer_core::engine::Engine::new(cfg(DaemonRules::DAEMON).engine, FillInOrder);
    let mut actions = Vec::new();
    for rec in &out.journal {
        for a in e.on_event(&rec.event, rec.t).unwrap() {
            actions.push((rec.t, a));
        }
    }
    assert_eq!(actions, out.actions);
}

#[test]
fn rule_settings_are_checked() {
    let tr = grow_preempt_trace(&[]);
    for (rules, msg) in [
        (
            only(|r| r.release_before_s = -1.0),
            "invalid setting: release-before must be seconds from 0 to 86400, found -1",
        ),
        (
            only(|r| r.reclaim_hold_s = f64::NAN),
            "invalid setting: reclaim-hold must be seconds from 0 to 86400, found NaN",
        ),
        (
            only(|r| r.start_latency_s = 1e9),
            "invalid setting: start-latency must be seconds from 0 to 86400, found 1000000000",
        ),
    ] {
        let mut clock = || 0.0;
        let mut progress = |_f: f64| {};
        let mut hooks = bftrainer_core::sim::Hooks {
            clock: &mut clock,
            progress: &mut progress,
        };
        let e = bftrainer_core::sim::simulate(
            &tr,
            &[grow_preempt_job()],
            FillInOrder,
            &cfg(rules),
            &mut hooks,
        )
        .err()
        .unwrap();
        assert_eq!(e.to_string(), msg);
    }
}
