//! Recovery and anchors: a journal of observations plus decisions (`Event::Decided`)
//! restores an engine's state under any config or allocator (`Mode::Restore`); a live
//! engine ignores `Decided`; a refused decision applies nothing; a job's core always
//! counts `min_nodes` real nodes, and a job below its minimum is not left running.

use bftrainer_core::alloc::{Instance, Objective, Options, Solution};
use bftrainer_core::engine::{
    Action, Allocator, ElasticSpec, Engine, EngineConfig, Event, Exact, JobStatus, Lending, Mode,
    NodeState, Record, EVENT_FORMAT_VERSION,
};
use engine_common::{idle_nodes, spec};
use rand::{Rng, SeedableRng};

mod engine_common;

/// Drives a live engine and keeps its journal as bftrainerd writes it: every event,
/// and after each Tick the decision it made.
struct Journaled<A> {
    e: Engine<A>,
    journal: Vec<Record>,
}

impl<A: Allocator> Journaled<A> {
    fn new(cfg: EngineConfig, alloc: A) -> Self {
        Journaled {
            e: Engine::new(cfg, alloc),
            journal: Vec::new(),
        }
    }

    fn ev(&mut self, event: Event, t: f64) -> Vec<Action> {
        let actions = self.e.on_event(&event, t).unwrap();
        let tick = matches!(event, Event::Tick);
        self.journal.push(Record {
            v: EVENT_FORMAT_VERSION,
            t,
            event,
        });
        if tick {
            self.journal.push(Record {
                v: EVENT_FORMAT_VERSION,
                t,
                event: Event::Decided {
                    activated: self.e.take_activated(),
                    actions: actions.clone(),
                },
            });
        }
        actions
    }
}

/// An allocator a restore must never call.
struct Never;

impl Allocator for Never {
    fn allocate(&mut self, _inst: &Instance) -> Result<Option<Solution>, String> {
        panic!("a restore decided instead of applying the journal's decisions");
    }
}

/// A run with admissions, growth, a shrink for a newcomer, confirmations, a loss and
/// progress: the strict events (JobStarted, WorkerJoined) follow the decisions.
fn history() -> Journaled<Exact> {
    let mut j = Journaled::new(
        EngineConfig {
            max_jobs: 3,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
    for n in 0..8 {
        j.ev(
            Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        );
    }
    for n in 0..6 {
        j.ev(
            Event::NodeIdle {
                node: n,
                reclaim_at: None,
            },
            0.0,
        );
    }
    j.ev(
        Event::JobSubmitted {
            job: 0,
            spec: spec("a", 2, 4, 1.0),
        },
        1.0,
    );
    j.ev(
        Event::JobSubmitted {
            job: 1,
            spec: spec("b", 1, 3, 2.0),
        },
        1.0,
    );
    let first = j.ev(Event::Tick, 1.0);
    assert!(!first.is_empty());
    for a in &first {
        if let Action::Admit { job, nodes } = a {
            j.ev(Event::JobStarted { job: *job }, 2.0);
            for &n in nodes {
                j.ev(Event::WorkerJoined { job: *job, node: n }, 2.0);
            }
        }
    }
    j.ev(
        Event::JobSubmitted {
            job: 2,
            spec: spec("c", 1, 2, 3.0),
        },
        3.0,
    );
    for n in 6..8 {
        j.ev(
            Event::NodeIdle {
                node: n,
                reclaim_at: None,
            },
            3.0,
        );
    }
    let second = j.ev(Event::Tick, 3.0);
    for a in &second {
        match a {
            Action::Admit { job, nodes } => {
                j.ev(Event::JobStarted { job: *job }, 4.0);
                for &n in nodes {
                    j.ev(Event::WorkerJoined { job: *job, node: n }, 4.0);
                }
            }
            Action::Grow { job, nodes } => {
                for &n in nodes {
                    j.ev(Event::WorkerJoined { job: *job, node: n }, 4.0);
                }
            }
            _ => {}
        }
    }
    j.ev(
        Event::Progress {
            job: 0,
            samples_per_s: 3.5,
            remaining: None,
            nodes: None,
        },
        5.0,
    );
    // Job a loses one of its core nodes: the core is refilled from its others.
    let core = j.e.job_anchors(0)[0];
    j.ev(Event::NodeClaimed { node: core }, 6.0);
    j.ev(Event::Tick, 6.0);
    j.ev(Event::JobFinished { job: 1 }, 7.0);
    j.ev(Event::Tick, 7.0);
    j
}

fn restore<A: Allocator>(cfg: EngineConfig, alloc: A, journal: &[Record]) -> Engine<A> {
    let mut e = Engine::new(cfg, alloc);
    e.set_mode(Mode::Restore);
    for r in journal {
        e.on_event(&r.event, r.t).unwrap();
    }
    assert!(e.take_warnings().is_empty());
    e
}

#[test]
fn a_restore_rebuilds_the_state_under_any_config_without_deciding() {
    let j = history();
    let want = j.e.state();
    assert!(j.e.job_nodes(0).len() >= 2);
    let changed = [
        EngineConfig {
            max_jobs: 1,
            ..EngineConfig::default()
        },
        EngineConfig {
            t_fwd_s: 10_000.0,
            ..EngineConfig::default()
        },
        EngineConfig {
            min_rescale_interval_s: 3600.0,
            ..EngineConfig::default()
        },
        EngineConfig {
            lend_after_idle_s: 3600.0,
            ..EngineConfig::default()
        },
        EngineConfig {
            max_jobs_per_user: 1,
            max_nodes_per_user: 1,
            ..EngineConfig::default()
        },
    ];
    for cfg in changed {
        // Another allocator too: the restore never calls it.
        let e = restore(cfg.clone(), Never, &j.journal);
        assert_eq!(e.state(), want, "{cfg:?}");
        assert_eq!(e.mode(), Mode::Restore);
    }
    // Leaving restore mode, the next Tick decides under the current config.
    let mut e = restore(
        EngineConfig::default(),
        Exact {
            opts: Options::new(Objective::Fairness),
        },
        &j.journal,
    );
    e.set_mode(Mode::Live);
    e.on_event(&Event::Tick, 8.0).unwrap();
    assert!(e.stats.decisions > 0);
}

#[test]
fn re_deciding_the_same_journal_under_another_config_is_refused_where_a_restore_is_not() {
    // Why decisions are journaled: a live engine fed the same journal under max_jobs = 1
    // re-decides, and the confirmations of the jobs it no longer admits are refused.
    let j = history();
    let mut e = Engine::new(
        EngineConfig {
            max_jobs: 1,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
    let refused = j
        .journal
        .iter()
        .filter(|r| e.on_event(&r.event, r.t).is_err())
        .count();
    assert!(refused > 0);
}

#[test]
fn a_live_engine_ignores_decided_records() {
    let j = history();
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    let mut with = Vec::new();
    for r in &j.journal {
        with.push(e.on_event(&r.event, r.t).unwrap());
    }
    let mut plain = Engine::new(EngineConfig::default(), Exact::default());
    let mut without = Vec::new();
    for r in &j.journal {
        if !matches!(r.event, Event::Decided { .. }) {
            without.push(plain.on_event(&r.event, r.t).unwrap());
        }
    }
    assert_eq!(e.state(), plain.state());
    with.retain(|a| !a.is_empty());
    without.retain(|a| !a.is_empty());
    assert_eq!(with, without);
}

#[test]
fn journaled_actions_that_do_not_fit_are_skipped_with_a_warning() {
    let mut e = Engine::new(EngineConfig::default(), Never);
    e.set_mode(Mode::Restore);
    for n in 0..3 {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        )
        .unwrap();
    }
    e.on_event(
        &Event::NodeIdle {
            node: 0,
            reclaim_at: None,
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::NodeIdle {
            node: 1,
            reclaim_at: None,
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("a", 2, 3, 1.0),
        },
        0.0,
    )
    .unwrap();
    let bad = [
        // Node 2 is busy.
        Action::Admit {
            job: 0,
            nodes: vec![0, 2],
        },
        // Fewer than min_nodes.
        Action::Admit {
            job: 0,
            nodes: vec![0],
        },
        // Holds nothing to grow from or shrink.
        Action::Grow {
            job: 0,
            nodes: vec![1],
        },
        Action::Shrink {
            job: 0,
            nodes: vec![1],
        },
        // Unknown job and node.
        Action::Admit {
            job: 7,
            nodes: vec![0, 1],
        },
        Action::Admit {
            job: 0,
            nodes: vec![0, 9],
        },
    ];
    let applied = e
        .on_event(
            &Event::Decided {
                activated: vec![0],
                actions: bad.to_vec(),
            },
            1.0,
        )
        .unwrap();
    assert!(applied.is_empty());
    let w = e.take_warnings();
    assert_eq!(w.len(), bad.len(), "{w:#?}");
    assert!(w[0].contains("node 2 is Busy, not idle"), "{}", w[0]);
    assert!(w[1].contains("1 nodes, allowed 2..3"), "{}", w[1]);
    assert_eq!(e.stats.skipped_actions, bad.len() as u64);
    assert_eq!(e.job_status(0), JobStatus::Active);
    assert!(e.job_nodes(0).is_empty());
    // A fitting one after them is applied.
    let ok = Action::Admit {
        job: 0,
        nodes: vec![0, 1],
    };
    let applied = e
        .on_event(
            &Event::Decided {
                activated: vec![],
                actions: vec![ok.clone()],
            },
            1.0,
        )
        .unwrap();
    assert_eq!(applied, vec![ok]);
    assert_eq!(e.node_state(1), NodeState::Held(0));
    assert_eq!(e.job_anchors(0), [0, 1]);
}

#[test]
fn decided_records_are_serde_additive_to_format_1() {
    let r = Record {
        v: EVENT_FORMAT_VERSION,
        t: 1.0,
        event: Event::Decided {
            activated: vec![],
            actions: vec![Action::Admit {
                job: 0,
                nodes: vec![1, 2],
            }],
        },
    };
    let s = serde_json::to_string(&r).unwrap();
    assert_eq!(
        s,
        r#"{"v":1,"t":1.0,"event":{"type":"decided","actions":[{"type":"admit","job":0,"nodes":[1,2]}]}}"#
    );
    assert_eq!(Record::from_json_line(&s).unwrap(), r);
    // A job spec of an older journal (no user, no priority) still reads.
    let old = r#"{"v":1,"t":0,"event":{"type":"job_submitted","job":0,"spec":{"name":"J","min_nodes":1,"max_nodes":1,"scale_up_s":0.0,"scale_down_s":0.0,"objective":{"points":[[1,1.0]]}}}}"#;
    let r = Record::from_json_line(old).unwrap();
    let Event::JobSubmitted { spec, .. } = &r.event else {
        panic!()
    };
    assert_eq!((spec.user, spec.priority), (None, 0));
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        old.replace("\"t\":0,", "\"t\":0.0,")
    );
}

/// An allocator that replays scripted answers.
struct Scripted(Vec<Result<Option<Solution>, String>>);

impl Allocator for Scripted {
    fn allocate(&mut self, _inst: &Instance) -> Result<Option<Solution>, String> {
        self.0.remove(0)
    }
}

fn sol(jobs: Vec<Vec<u32>>) -> Solution {
    let n = jobs.len();
    Solution {
        objective_value: 0.0,
        jobs,
        batch_sizes: vec![None; n],
        fairness_level: None,
    }
}

fn setup<A: Allocator>(e: &mut Engine<A>, nodes: u32, jobs: &[ElasticSpec]) {
    idle_nodes(e, nodes);
    for (j, s) in jobs.iter().enumerate() {
        e.on_event(
            &Event::JobSubmitted {
                job: j as u32,
                spec: s.clone(),
            },
            0.0,
        )
        .unwrap();
    }
}

#[test]
fn a_refused_decision_applies_nothing() {
    let mut e = Engine::new(
        EngineConfig::default(),
        Scripted(vec![
            Ok(Some(sol(vec![vec![0, 1], vec![]]))),
            Err("solver exploded".into()),
            // Node 2 twice.
            Ok(Some(sol(vec![vec![0, 1, 2], vec![2]]))),
            // Migration: job 0 trades node 1 for node 3.
            Ok(Some(sol(vec![vec![0, 3], vec![2]]))),
            // Job 1 below its minimum.
            Ok(Some(sol(vec![vec![0, 1], vec![2]]))),
            Ok(Some(sol(vec![vec![0, 1], vec![2, 3]]))),
        ]),
    );
    setup(&mut e, 4, &[spec("a", 2, 3, 1.0), spec("b", 2, 2, 1.0)]);
    e.on_event(&Event::Tick, 1.0).unwrap();
    for t in [2.0, 3.0, 4.0, 5.0] {
        // Something changed: the engine decides.
        e.on_event(
            &Event::Progress {
                job: 0,
                samples_per_s: 1.0,
                remaining: Some(t),
                nodes: None,
            },
            t,
        )
        .unwrap();
        let before = e.state();
        assert!(e.on_event(&Event::Tick, t).is_err(), "t={t}");
        assert_eq!(e.state(), before, "t={t}");
        // Not decided again until something changes.
        assert!(e.on_event(&Event::Tick, t).unwrap().is_empty());
    }
    assert_eq!(e.stats.refused, 4);
    e.on_event(
        &Event::Progress {
            job: 0,
            samples_per_s: 1.0,
            remaining: None,
            nodes: None,
        },
        6.0,
    )
    .unwrap();
    let a = e.on_event(&Event::Tick, 6.0).unwrap();
    assert_eq!(
        a,
        vec![Action::Admit {
            job: 1,
            nodes: vec![2, 3]
        }]
    );
}

#[test]
fn a_lost_core_node_is_replaced_from_the_jobs_other_nodes() {
    let mut e = Engine::new(
        EngineConfig::default(),
        Scripted(vec![Ok(Some(sol(vec![vec![0, 1, 2, 3, 4]])))]),
    );
    setup(&mut e, 5, &[spec("a", 3, 5, 1.0)]);
    assert_eq!(
        e.on_event(&Event::Tick, 1.0).unwrap(),
        vec![Action::Admit {
            job: 0,
            nodes: vec![0, 1, 2, 3, 4]
        }]
    );
    assert_eq!(e.job_anchors(0), [0, 1, 2]);
    e.on_event(&Event::NodeClaimed { node: 1 }, 2.0).unwrap();
    let mut a = e.job_anchors(0).to_vec();
    a.sort_unstable();
    assert_eq!(a.len(), 3);
    assert!(a.contains(&0) && a.contains(&2), "{a:?}");
    for n in &a {
        assert_eq!(e.node_state(*n), NodeState::Held(0));
    }
    e.on_event(&Event::NodeLost { node: 0 }, 2.0).unwrap();
    assert_eq!(e.job_anchors(0).len(), 3);
    // Below its minimum: the core keeps what is left, and the next decision does not
    // leave the job there (here, lending paused: requeued all the same).
    e.on_event(
        &Event::Lending {
            mode: Lending::Paused,
        },
        3.0,
    )
    .unwrap();
    let left = e.job_nodes(0).to_vec();
    e.on_event(&Event::NodeClaimed { node: left[0] }, 3.0)
        .unwrap();
    assert_eq!(e.job_nodes(0).len(), 2);
    let a = e.on_event(&Event::Tick, 3.0).unwrap();
    assert_eq!(a.len(), 1);
    assert!(matches!(&a[0], Action::Requeue { job: 0, nodes } if nodes.len() == 2));
    assert!(e.job_nodes(0).is_empty() && e.job_anchors(0).is_empty());
    assert_eq!(e.job_status(0), JobStatus::Active);
}

#[test]
fn a_kept_allocation_does_not_leave_a_job_below_its_minimum() {
    let mut e = Engine::new(
        EngineConfig::default(),
        Scripted(vec![Ok(Some(sol(vec![vec![0, 1]]))), Ok(None)]),
    );
    setup(&mut e, 3, &[spec("a", 2, 2, 1.0)]);
    e.on_event(&Event::Tick, 1.0).unwrap();
    e.on_event(&Event::NodeClaimed { node: 0 }, 2.0).unwrap();
    let a = e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(
        a,
        vec![Action::Requeue {
            job: 0,
            nodes: vec![1]
        }]
    );
}

/// Random runs with the exact allocator: an admission never carries fewer than
/// `min_nodes` nodes, and a job holding at least `min_nodes` has exactly `min_nodes`
/// anchors, all nodes it holds.
#[test]
fn admissions_and_anchors_always_count_min_nodes() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20);
    for run in 0..20 {
        let mut e = Engine::new(EngineConfig::default(), Exact::default());
        let n_nodes = 12u32;
        for n in 0..n_nodes {
            e.on_event(
                &Event::NodeAdded {
                    node: n,
                    name: format!("n{n}"),
                },
                0.0,
            )
            .unwrap();
        }
        let mut jobs = 0u32;
        for step in 0..200 {
            let t = f64::from(step);
            match rng.gen_range(0..10) {
                0 if jobs < 8 => {
                    let min = rng.gen_range(1..=4);
                    let max = min + rng.gen_range(0..4);
                    e.on_event(
                        &Event::JobSubmitted {
                            job: jobs,
                            spec: spec(&format!("j{jobs}"), min, max, rng.gen_range(1.0..4.0)),
                        },
                        t,
                    )
                    .unwrap();
                    jobs += 1;
                }
                1..=3 => {
                    let n = rng.gen_range(0..n_nodes);
                    e.on_event(
                        &Event::NodeIdle {
                            node: n,
                            reclaim_at: None,
                        },
                        t,
                    )
                    .unwrap();
                }
                4 | 5 => {
                    let n = rng.gen_range(0..n_nodes);
                    e.on_event(&Event::NodeClaimed { node: n }, t).unwrap();
                }
                6 if jobs > 0 => {
                    let j = rng.gen_range(0..jobs);
                    if e.job_status(j) == JobStatus::Active && rng.gen_bool(0.2) {
                        e.on_event(&Event::JobFinished { job: j }, t).unwrap();
                    }
                }
                _ => {}
            }
            for a in e.on_event(&Event::Tick, t).unwrap() {
                let min = e.job_spec(a.job()).min_nodes as usize;
                if let Action::Admit { nodes, .. } = &a {
                    assert!(nodes.len() >= min, "run {run} step {step}: {a:?}");
                }
            }
            for j in 0..jobs {
                if e.job_status(j) != JobStatus::Active {
                    continue;
                }
                let nodes = e.job_nodes(j);
                let anchors = e.job_anchors(j);
                let min = e.job_spec(j).min_nodes as usize;
                assert!(
                    nodes.is_empty() || nodes.len() >= min,
                    "run {run} step {step}: job {j} left below its minimum after a decision: {nodes:?}"
                );
                if nodes.len() >= min {
                    assert_eq!(anchors.len(), min, "run {run} step {step}: job {j}");
                }
                assert!(anchors.iter().all(|a| nodes.contains(a)));
            }
        }
    }
}

#[test]
fn a_snapshot_restores_the_state_and_refuses_an_inconsistent_one() {
    let j = history();
    let st = j.e.state();
    let snap = Event::Snapshot {
        state: Box::new(st.clone()),
        nodes: Vec::new(),
        jobs: Vec::new(),
    };
    let text = serde_json::to_string(&snap).unwrap();
    let snap: Event = serde_json::from_str(&text).unwrap();
    // In either mode: a replay under another policy starts from it too.
    for mode in [Mode::Live, Mode::Restore] {
        let mut e = Engine::new(EngineConfig::default(), Exact::default());
        e.set_mode(mode);
        e.on_event(&snap, st.t.unwrap()).unwrap();
        assert_eq!(e.state(), st);
        e.set_mode(Mode::Live);
        // It goes on from there.
        e.on_event(&Event::JobFinished { job: 0 }, 8.0).unwrap();
        e.on_event(&Event::Tick, 8.0).unwrap();
        assert_eq!(e.job_status(0), JobStatus::Finished);
    }
    let mut bad = st.clone();
    let held = bad
        .nodes
        .iter()
        .position(|n| matches!(n.state, NodeState::Held(_)))
        .unwrap();
    bad.nodes[held].state = NodeState::Idle;
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    let err = e.load_state(&bad).unwrap_err();
    assert!(err.contains("which is not held by it"), "{err}");
    assert_eq!(e.n_nodes(), 0, "nothing loaded");
}

#[test]
fn forgetting_a_job_is_an_event_a_restore_repeats() {
    let mut j = history();
    assert!(j.e.on_event(&Event::JobForgotten { job: 0 }, 8.0).is_err());
    j.ev(Event::JobForgotten { job: 1 }, 8.0);
    j.ev(Event::JobForgotten { job: 1 }, 8.0);
    assert_eq!(j.e.job_status(1), JobStatus::Finished);
    let e = restore(EngineConfig::default(), Never, &j.journal);
    assert_eq!(e.state(), j.e.state());
    assert!(matches!(
        e.state().jobs[1],
        bftrainer_core::engine::JobSnap::Forgotten { .. }
    ));
}
