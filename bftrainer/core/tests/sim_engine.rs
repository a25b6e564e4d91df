//! Engine contract tests: what the engine does with allocator answers that break the
//! contract, with "no proven answer", with claims of lent nodes; and golden replays
//! with the exact allocator where the optimum is worked out by hand.

mod sim_common;

use bftrainer_core::alloc::{Curve, Instance, Solution};
use bftrainer_core::engine::{
    Action, ElasticSpec, Engine, EngineConfig, Event, Exact, JobStatus, NodeState,
};
use bftrainer_core::sim::SimConfig;
use bftrainer_core::Error;
use sim_common::*;

fn spec(name: &str, min: u32, max: u32) -> ElasticSpec {
    ElasticSpec {
        name: name.into(),
        min_nodes: min,
        max_nodes: max,
        scale_up_s: 1.0,
        scale_down_s: 1.0,
        objective: Curve {
            points: vec![(1, 1.0), (8, 8.0)],
        },
        user: None,
        priority: 0,
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

/// An allocator that replays scripted answers.
struct Scripted(Vec<Result<Option<Solution>, String>>);

impl bftrainer_core::engine::Allocator for Scripted {
    fn allocate(&mut self, _inst: &Instance) -> Result<Option<Solution>, String> {
        self.0.remove(0)
    }
}

fn engine(
    nodes: u32,
    idle: &[u32],
    jobs: &[ElasticSpec],
    answers: Vec<Result<Option<Solution>, String>>,
) -> Engine<Scripted> {
    engine_with(Scripted(answers), nodes, idle, jobs)
}

/// An engine over `alloc` with `nodes` nodes, `idle` of them idle and `jobs` submitted,
/// all at time 0.
fn engine_with<A: bftrainer_core::engine::Allocator>(
    alloc: A,
    nodes: u32,
    idle: &[u32],
    jobs: &[ElasticSpec],
) -> Engine<A> {
    let mut e = Engine::new(EngineConfig::default(), alloc);
    for n in 0..nodes {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        )
        .unwrap();
    }
    for &n in idle {
        e.on_event(
            &Event::NodeIdle {
                node: n,
                reclaim_at: None,
            },
            0.0,
        )
        .unwrap();
    }
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
    e
}

#[test]
fn contract_violations_are_rejected() {
    let cases: Vec<(Vec<Vec<u32>>, &str)> = vec![
        (vec![vec![0, 1], vec![1]], "given to two jobs"),
        (
            vec![vec![0, 1, 2], vec![]],
            "given 3 nodes, allowed 0 or 1..2",
        ),
        (vec![vec![9], vec![]], "out of range"),
        (vec![vec![0]], "1 node sets for 2 jobs"),
    ];
    for (answer, msg) in cases {
        let mut e = engine(
            3,
            &[0, 1, 2],
            &[spec("a", 1, 2), spec("b", 1, 2)],
            vec![Ok(Some(sol(answer)))],
        );
        let err = e.on_event(&Event::Tick, 5.0).unwrap_err();
        assert!(
            matches!(err, Error::Alloc { .. }) && err.to_string().contains(msg),
            "{err}"
        );
    }
}

#[test]
fn migration_is_rejected() {
    // Pool order is idle order: node 0 -> index 0, node 1 -> index 1, node 2 -> index 2.
    let mut e = engine(
        3,
        &[0, 1, 2],
        &[spec("a", 1, 2)],
        vec![
            Ok(Some(sol(vec![vec![0, 1]]))),
            Ok(Some(sol(vec![vec![1, 2]]))),
        ],
    );
    let a = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(
        a,
        vec![Action::Admit {
            job: 0,
            nodes: vec![0, 1]
        }]
    );
    e.on_event(
        &Event::NodeIdle {
            node: 2,
            reclaim_at: Some(50.0),
        },
        1.0,
    )
    .unwrap();
    let err = e.on_event(&Event::Tick, 1.0).unwrap_err().to_string();
    assert!(err.contains("both grows and shrinks"), "{err}");
}

#[test]
fn shrinks_come_before_grows_and_claims_take_nodes_away() {
    let answers = vec![
        Ok(Some(sol(vec![vec![0, 1, 2], vec![]]))),
        Ok(Some(sol(vec![vec![0], vec![1]]))),
    ];
    let mut e = engine(4, &[0, 1, 2], &[spec("a", 1, 3), spec("b", 1, 3)], answers);
    e.on_event(&Event::Tick, 0.0).unwrap();
    // A regular job takes node 1 from a: no action, the engine just forgets it.
    assert!(e
        .on_event(&Event::NodeClaimed { node: 1 }, 2.0)
        .unwrap()
        .is_empty());
    assert_eq!(e.node_state(1), NodeState::Busy);
    assert_eq!(e.job_nodes(0), &[0, 2]);
    // Pool after the claim: [0, 2] (swap-removed): index 0 -> node 0, 1 -> node 2.
    // a keeps node 0 and gives node 2 to b: the shrink is listed first.
    let a = e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(
        a,
        vec![
            Action::Shrink {
                job: 0,
                nodes: vec![2]
            },
            Action::Admit {
                job: 1,
                nodes: vec![2]
            }
        ]
    );
    assert_eq!(e.node_state(2), NodeState::Held(1));
}

#[test]
fn no_proven_answer_keeps_the_allocation() {
    let mut e = engine(
        3,
        &[0, 1],
        &[spec("a", 1, 3)],
        vec![Ok(Some(sol(vec![vec![0, 1]]))), Ok(None)],
    );
    e.on_event(&Event::Tick, 0.0).unwrap();
    e.on_event(
        &Event::NodeIdle {
            node: 2,
            reclaim_at: None,
        },
        1.0,
    )
    .unwrap();
    assert!(e.on_event(&Event::Tick, 1.0).unwrap().is_empty());
    assert_eq!(e.stats.kept, 1);
    assert_eq!(e.node_state(2), NodeState::Idle);
    // Nothing changed since: no third decision (the script would panic if asked).
    assert!(e.on_event(&Event::Tick, 2.0).unwrap().is_empty());
    assert_eq!(e.stats.decisions, 2);
}

#[test]
fn bad_events_are_rejected() {
    let mut e = engine(2, &[], &[], vec![]);
    assert!(e
        .on_event(
            &Event::NodeIdle {
                node: 7,
                reclaim_at: None
            },
            0.0
        )
        .unwrap_err()
        .to_string()
        .contains("unknown node 7"));
    assert!(e
        .on_event(
            &Event::NodeAdded {
                node: 5,
                name: "x".into()
            },
            0.0
        )
        .unwrap_err()
        .to_string()
        .contains("out of order"));
    assert!(e
        .on_event(&Event::JobFinished { job: 0 }, 0.0)
        .unwrap_err()
        .to_string()
        .contains("unknown job 0"));
    assert!(e
        .on_event(
            &Event::JobSubmitted {
                job: 0,
                spec: spec("z", 3, 2)
            },
            0.0
        )
        .is_err());
}

/// Exact allocator, one job (1..4 nodes, 10 samples/s per node, Tup 10 s): a, b idle at
/// 0; c idle at 10. Admission costs nothing (rate 0 before). Growing 2 -> 3 at t=10
/// gains Tfwd * 10 and costs Tup * 20 = 200: with Tfwd = 10 (gain 100) the job stays on
/// 2 nodes; with Tfwd = 100 (gain 1000) it grows.
#[test]
fn exact_allocator_weighs_growth_against_rescale_cost() {
    let tr = trace(&["a", "b", "c"], &[true, true, false], &[(10, 2, true)], 60);
    let jobs = [job("J", 0, 1, 4, 10.0, 5.0, 1e9, &[(1, 10.0), (4, 40.0)])];
    for (t_fwd, grows, samples) in [
        (10.0, 0, 20.0 * 60.0),
        (100.0, 1, 200.0 - 200.0 + 30.0 * 50.0),
    ] {
        let cfg = SimConfig {
            engine: EngineConfig {
                t_fwd_s: t_fwd,
                max_jobs: 10,
                ..EngineConfig::default()
            },
            ..Default::default()
        };
        let r = run(&tr, &jobs, Exact::default(), &cfg).report;
        assert_eq!(r.actions.grows, grows, "t_fwd {t_fwd}");
        assert!(close(r.samples, samples), "t_fwd {t_fwd}: {}", r.samples);
    }
}

/// What the allocator saw, call by call: pool size and reclaim forecasts.
type Seen = std::rc::Rc<std::cell::RefCell<Vec<(u32, Vec<Option<f64>>)>>>;

/// Records what the allocator sees, then fills like FillInOrder.
struct Spy(Seen);

impl bftrainer_core::engine::Allocator for Spy {
    fn allocate(&mut self, inst: &Instance) -> Result<Option<Solution>, String> {
        self.0
            .borrow_mut()
            .push((inst.n_nodes, inst.reclaim_in_s.clone()));
        FillInOrder.allocate(inst)
    }
}

/// The EASY schedule of easy::tests: at t=52 n2, n3 turn idle while B waits for its
/// reservation at 100, so the allocator sees both nodes with reclaim_in_s = 48. At 150,
/// with the queue empty, forecasts are gone (empty vector).
#[test]
fn backfill_forecasts_reach_the_allocator() {
    use bftrainer_core::easy::{schedule, SchedConfig};
    let (tr, _) = schedule(&easy_example_log(), &SchedConfig::default()).unwrap();
    // The job arrives at 52, when n2 and n3 are idle.
    let jobs = [job("J", 52, 1, 4, 0.0, 0.0, 1e12, &[(1, 1.0), (4, 4.0)])];
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    run(&tr, &jobs, Spy(seen.clone()), &SimConfig::default());
    let seen = seen.borrow();
    assert_eq!(seen[0], (2, vec![Some(48.0), Some(48.0)]));
    assert!(
        seen.iter().any(|(n, r)| *n == 3 && r.is_empty()),
        "{seen:?}"
    );
}

/// The simulator's journal replays into a fresh engine with the same allocator and
/// yields the same actions: what the daemon journals, the simulator can re-run.
#[test]
fn journal_replays_to_the_same_actions() {
    use bftrainer_core::engine::Record;
    let tr = grow_preempt_trace(&[(40, 3, true), (50, 1, false)]);
    // K: submitted at 5, 2..4 nodes, J's rates.
    let r = [(1, 10.0), (2, 20.0), (4, 40.0)];
    let jobs = [grow_preempt_job(), job("K", 5, 2, 4, 1.0, 1.0, 900.0, &r)];
    let cfg = SimConfig {
        journal: true,
        engine: EngineConfig {
            t_fwd_s: 100.0,
            max_jobs: 10,
            ..EngineConfig::default()
        },
        ..Default::default()
    };
    let out = run(&tr, &jobs, Exact::default(), &cfg);
    assert!(out.actions.len() >= 3);
    let text: String = out
        .journal
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    let mut e = Engine::new(cfg.engine.clone(), Exact::default());
    let mut again = Vec::new();
    for line in text.lines() {
        let rec = Record::from_json_line(line).unwrap();
        again.extend(
            e.on_event(&rec.event, rec.t)
                .unwrap()
                .into_iter()
                .map(|a| (rec.t, a)),
        );
    }
    assert_eq!(again, out.actions);
}

#[test]
fn events_must_come_in_time_order() {
    let mut e = engine(1, &[0], &[], vec![]);
    e.on_event(&Event::Tick, 10.0).unwrap();
    let err = e.on_event(&Event::Tick, 9.5).unwrap_err().to_string();
    assert!(
        err.contains("time 9.5 is earlier than the previous event's 10"),
        "{err}"
    );
    let err = e.on_event(&Event::Tick, f64::NAN).unwrap_err().to_string();
    assert!(err.contains("not a finite number"), "{err}");
    // An equal time is fine.
    e.on_event(&Event::Tick, 10.0).unwrap();
}

#[test]
fn a_shrink_keeps_the_core_nodes() {
    // Job a (min 1) is admitted on nodes 0..4; node 0 is its core (anchor). The
    // allocator then takes nodes 0 and 3 from it for job b: the engine trades node 0
    // for node 1, so a keeps its core and b gets node 1 instead.
    let mut e = engine(
        4,
        &[0, 1, 2, 3],
        &[spec("a", 1, 4)],
        vec![
            Ok(Some(sol(vec![vec![0, 1, 2, 3]]))),
            Ok(Some(sol(vec![vec![1, 2], vec![0, 3]]))),
        ],
    );
    let a = e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(
        a,
        vec![Action::Admit {
            job: 0,
            nodes: vec![0, 1, 2, 3]
        }]
    );
    assert_eq!(e.job_anchors(0), [0]);
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            spec: spec("b", 2, 2),
        },
        2.0,
    )
    .unwrap();
    let a = e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(
        a,
        vec![
            Action::Shrink {
                job: 0,
                nodes: vec![1, 3]
            },
            Action::Admit {
                job: 1,
                nodes: vec![1, 3]
            },
        ]
    );
    assert_eq!(e.node_state(0), NodeState::Held(0));
    assert_eq!(e.job_anchors(0), [0]);
    assert_eq!(e.job_anchors(1), [1, 3]);
    // Losing the core node refills the core from the job's other nodes (min_nodes
    // real nodes); losing every node clears the anchors.
    e.on_event(&Event::WorkerPreempted { job: 0, node: 0 }, 3.0)
        .unwrap();
    assert_eq!(e.job_anchors(0), [2]);
    e.on_event(&Event::WorkerPreempted { job: 0, node: 2 }, 3.0)
        .unwrap();
    assert!(e.job_nodes(0).is_empty() && e.job_anchors(0).is_empty());
}

#[test]
fn nodes_are_lent_only_after_the_idle_wait() {
    let mut e = Engine::new(
        EngineConfig {
            lend_after_idle_s: 30.0,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
    for n in 0..2 {
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
        20.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("a", 1, 2),
        },
        20.0,
    )
    .unwrap();
    assert!(e.on_event(&Event::Tick, 20.0).unwrap().is_empty());
    assert_eq!(e.wake_at(), Some(30.0));
    // Nothing observed, but node 0's wait is over at 30 s: a tick then admits on it.
    assert_eq!(
        e.on_event(&Event::Tick, 30.0).unwrap(),
        vec![Action::Admit {
            job: 0,
            nodes: vec![0]
        }]
    );
    assert_eq!(e.wake_at(), Some(50.0));
    assert!(e.on_event(&Event::Tick, 49.0).unwrap().is_empty());
    assert_eq!(
        e.on_event(&Event::Tick, 50.0).unwrap(),
        vec![Action::Grow {
            job: 0,
            nodes: vec![1]
        }]
    );
}

#[test]
fn a_job_keeps_its_size_within_the_rescale_interval() {
    let mut e = Engine::new(
        EngineConfig {
            min_rescale_interval_s: 60.0,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
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
        &Event::JobSubmitted {
            job: 0,
            spec: spec("a", 1, 3),
        },
        0.0,
    )
    .unwrap();
    assert_eq!(
        e.on_event(&Event::Tick, 0.0).unwrap(),
        vec![Action::Admit {
            job: 0,
            nodes: vec![0]
        }]
    );
    e.on_event(
        &Event::NodeIdle {
            node: 1,
            reclaim_at: None,
        },
        10.0,
    )
    .unwrap();
    e.on_event(
        &Event::NodeIdle {
            node: 2,
            reclaim_at: None,
        },
        10.0,
    )
    .unwrap();
    assert!(
        e.on_event(&Event::Tick, 10.0).unwrap().is_empty(),
        "admitted 10 s ago"
    );
    assert_eq!(e.wake_at(), Some(60.0));
    assert_eq!(
        e.on_event(&Event::Tick, 60.0).unwrap(),
        vec![Action::Grow {
            job: 0,
            nodes: vec![1, 2]
        }]
    );
    // A loss below MIN is never frozen: a job of min 2 that lost a node is re-decided.
    let mut e = Engine::new(
        EngineConfig {
            min_rescale_interval_s: 60.0,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
    for n in 0..2 {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        )
        .unwrap();
        e.on_event(
            &Event::NodeIdle {
                node: n,
                reclaim_at: None,
            },
            0.0,
        )
        .unwrap();
    }
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("a", 2, 2),
        },
        0.0,
    )
    .unwrap();
    e.on_event(&Event::Tick, 0.0).unwrap();
    e.on_event(&Event::NodeClaimed { node: 1 }, 5.0).unwrap();
    assert_eq!(
        e.on_event(&Event::Tick, 5.0).unwrap(),
        vec![Action::Requeue {
            job: 0,
            nodes: vec![0]
        }]
    );
}

/// `bftrainer pause|drain|resume` as the engine sees them: paused admits and grows
/// nothing and keeps what jobs hold; drained shrinks every job to its core nodes;
/// reopened, the allocator decides again. With the exact allocator and linear curves
/// the optimum is every idle node.
#[test]
fn lending_pause_drain_resume() {
    use bftrainer_core::engine::Lending;
    let ex = Exact {
        opts: bftrainer_core::alloc::Options::new(bftrainer_core::alloc::Objective::Bftrainer),
    };
    let mut e = engine_with(ex, 6, &[0, 1, 2], &[spec("a", 2, 6)]);
    let idle = |e: &mut Engine<Exact>, n: u32, t: f64| {
        e.on_event(
            &Event::NodeIdle {
                node: n,
                reclaim_at: None,
            },
            t,
        )
        .unwrap();
    };
    let a = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(
        a,
        vec![Action::Admit {
            job: 0,
            nodes: vec![0, 1, 2]
        }]
    );
    assert_eq!(e.job_anchors(0), &[0, 1]);

    // Paused: a new idle node and a new job get nothing.
    e.on_event(
        &Event::Lending {
            mode: Lending::Paused,
        },
        1.0,
    )
    .unwrap();
    assert_eq!(e.lending(), Lending::Paused);
    idle(&mut e, 3, 1.0);
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            // Faster per node than a: the optimum admits it when lending reopens.
            spec: ElasticSpec {
                objective: Curve {
                    points: vec![(1, 10.0), (2, 20.0)],
                },
                ..spec("b", 1, 2)
            },
        },
        1.0,
    )
    .unwrap();
    assert!(e.on_event(&Event::Tick, 1.0).unwrap().is_empty());
    assert_eq!(e.job_nodes(0), &[0, 1, 2]);
    assert!(e.job_nodes(1).is_empty());
    // A regular job still takes a lent node back while paused.
    e.on_event(&Event::NodeClaimed { node: 2 }, 2.0).unwrap();
    assert!(e.on_event(&Event::Tick, 2.0).unwrap().is_empty());
    assert_eq!(e.job_nodes(0), &[0, 1]);
    idle(&mut e, 2, 2.5);
    idle(&mut e, 4, 2.5);

    // Drained: job a first grows back to 4 nodes when reopened, then is cut to its core.
    e.on_event(
        &Event::Lending {
            mode: Lending::Open,
        },
        3.0,
    )
    .unwrap();
    let a = e.on_event(&Event::Tick, 3.0).unwrap();
    let held: usize = (0..2).map(|j| e.job_nodes(j).len()).sum();
    assert_eq!(held, 5, "reopened, every idle node is used: {a:?}");
    assert_eq!(e.job_nodes(1).len(), 2, "b admitted on reopening: {a:?}");
    let before_b = e.job_nodes(1).to_vec();
    e.on_event(
        &Event::Lending {
            mode: Lending::Drained,
        },
        4.0,
    )
    .unwrap();
    let a = e.on_event(&Event::Tick, 4.0).unwrap();
    assert!(
        a.iter().all(|x| matches!(x, Action::Shrink { .. })),
        "drain only shrinks: {a:?}"
    );
    assert_eq!(e.job_nodes(0), &[0, 1], "job a keeps its core");
    assert_eq!(e.job_nodes(1).len(), 1, "job b keeps its one core node");
    assert!(before_b.contains(&e.job_nodes(1)[0]));
    // Still drained: idle nodes are not lent.
    idle(&mut e, 5, 5.0);
    assert!(e.on_event(&Event::Tick, 5.0).unwrap().is_empty());
    // Resume: everything idle is lent again.
    e.on_event(
        &Event::Lending {
            mode: Lending::Open,
        },
        6.0,
    )
    .unwrap();
    let a = e.on_event(&Event::Tick, 6.0).unwrap();
    assert!(a.iter().all(|x| matches!(x, Action::Grow { .. })), "{a:?}");
    let held: usize = (0..2).map(|j| e.job_nodes(j).len()).sum();
    assert_eq!(held, 6);
    // The mode round-trips through the journal format.
    let r = bftrainer_core::engine::Record {
        v: bftrainer_core::engine::EVENT_FORMAT_VERSION,
        t: 7.0,
        event: Event::Lending {
            mode: Lending::Drained,
        },
    };
    let line = serde_json::to_string(&r).unwrap();
    assert_eq!(
        line,
        r#"{"v":1,"t":7.0,"event":{"type":"lending","mode":"drained"}}"#
    );
    assert_eq!(
        bftrainer_core::engine::Record::from_json_line(&line).unwrap(),
        r
    );
}

/// A finished job can be forgotten (a replay of years keeps only live jobs): its status
/// stays, an event naming it is refused as "forgotten", and a live job is not forgotten.
#[test]
fn finished_jobs_can_be_forgotten() {
    let mut e = engine_with(
        Exact::default(),
        2,
        &[0, 1],
        &[spec("a", 1, 2), spec("b", 1, 2)],
    );
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(e.job_status(0), JobStatus::Active);
    assert!(!e.forget_job(0), "an active job is kept");
    e.on_event(&Event::JobFinished { job: 0 }, 2.0).unwrap();
    assert!(e.forget_job(0));
    assert!(!e.forget_job(0), "forgotten once");
    assert_eq!(e.job_status(0), JobStatus::Finished);
    assert_eq!(e.n_jobs(), 2);
    let err = e
        .on_event(&Event::JobFinished { job: 0 }, 3.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("forgotten job 0"), "{err}");
    // The other job goes on: it gets the freed nodes.
    e.on_event(&Event::Tick, 4.0).unwrap();
    assert_eq!(e.job_nodes(1).len(), 2);
}

/// The simulator admits by priority and under per-user caps as the daemon does; with
/// neither (job files have no owners or priorities) it admits in submit order.
#[test]
fn the_simulator_admits_by_priority_and_per_user_caps() {
    let tr = trace(&["a", "b"], &[true, true], &[], 2000);
    // One node each, 300 s of work at 10 samples/s.
    let mk = |name: &str, submit: i64, user: u32, priority: u32| {
        bftrainer_core::trace::jobs::JobRecord {
            user: Some(user),
            priority,
            ..job(name, submit, 1, 1, 0.0, 0.0, 3000.0, &[(1, 10.0)])
        }
    };
    let first = |out: &bftrainer_core::sim::Outcome, j: u32| {
        out.sizes
            .iter()
            .find(|s| s.job == j && s.nodes > 0)
            .map(|s| s.t)
            .unwrap()
    };
    let sim = |jobs: &[bftrainer_core::trace::jobs::JobRecord], engine: EngineConfig| {
        let cfg = SimConfig {
            engine,
            record: true,
            ..SimConfig::default()
        };
        run(&tr, jobs, Exact::default(), &cfg)
    };
    let jobs = [
        mk("a0", 0, 1, 0),
        mk("a1", 0, 1, 0),
        mk("a2", 0, 1, 0),
        mk("b", 10, 2, 0),
    ];
    let two = EngineConfig {
        max_jobs: 2,
        ..EngineConfig::default()
    };
    // No cap: user 1's jobs take both slots; b waits for them.
    let out = sim(&jobs, two.clone());
    assert!(first(&out, 3) >= 300.0, "{:?}", out.sizes);
    // One active job per user: b starts at its submission.
    let out = sim(
        &jobs,
        EngineConfig {
            max_jobs_per_user: 1,
            ..two
        },
    );
    assert_eq!(first(&out, 3), 10.0, "{:?}", out.sizes);
    assert!(first(&out, 1) >= 300.0);
    // By priority, one slot: b (submitted last) runs right after a0, before a1 and a2.
    let jobs = [
        mk("a0", 0, 1, 0),
        mk("a1", 0, 1, 0),
        mk("a2", 0, 1, 0),
        mk("b", 10, 2, 7),
    ];
    let out = sim(
        &jobs,
        EngineConfig {
            max_jobs: 1,
            ..EngineConfig::default()
        },
    );
    assert!(first(&out, 3) < first(&out, 1), "{:?}", out.sizes);
    assert!(first(&out, 1) < first(&out, 2));
}
