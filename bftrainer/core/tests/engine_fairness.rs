//! Admission order and per-user caps: queued jobs are admitted by priority (Slurm's:
//! fairshare, QOS), ties in submit order; a user at `max_jobs_per_user` does not hold
//! back other users; a user's jobs together never hold more than `max_nodes_per_user`.

mod engine_common;

use bftrainer_core::engine::{
    Action, ElasticSpec, Engine, EngineConfig, Event, Exact, JobId, JobStatus,
};

fn spec(name: &str, user: u32, priority: u32, min: u32, max: u32) -> ElasticSpec {
    ElasticSpec {
        user: Some(user),
        priority,
        ..engine_common::spec(name, min, max, 1.0)
    }
}

fn engine(cfg: EngineConfig, nodes: u32) -> Engine<Exact> {
    let mut e = Engine::new(cfg, Exact::default());
    engine_common::idle_nodes(&mut e, nodes);
    e
}

fn submit(e: &mut Engine<Exact>, s: ElasticSpec, t: f64) -> JobId {
    let job = e.n_jobs() as JobId;
    e.on_event(&Event::JobSubmitted { job, spec: s }, t)
        .unwrap();
    job
}

fn active(e: &Engine<Exact>) -> Vec<JobId> {
    let mut v = e.active().to_vec();
    v.sort_unstable();
    v
}

#[test]
fn queued_jobs_are_admitted_by_priority_then_submit_order() {
    let mut e = engine(
        EngineConfig {
            max_jobs: 1,
            ..EngineConfig::default()
        },
        2,
    );
    let low = submit(&mut e, spec("low", 1, 1, 1, 1), 1.0);
    let high = submit(&mut e, spec("high", 2, 5, 1, 1), 1.0);
    let high2 = submit(&mut e, spec("high2", 3, 5, 1, 1), 1.0);
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(active(&e), [high]);
    assert_eq!(e.queue().collect::<Vec<_>>(), [high2, low]);
    // Slurm raises the old job's priority (age, fairshare): it goes first.
    e.on_event(
        &Event::JobPriority {
            job: low,
            priority: 9,
        },
        2.0,
    )
    .unwrap();
    assert_eq!(e.queue().collect::<Vec<_>>(), [low, high2]);
    e.on_event(&Event::JobFinished { job: high }, 3.0).unwrap();
    let a = e.on_event(&Event::Tick, 3.0).unwrap();
    assert_eq!(active(&e), [low]);
    assert!(matches!(a[..], [Action::Admit { job, .. }] if job == low));
    e.on_event(&Event::JobCancelled { job: low }, 4.0).unwrap();
    e.on_event(&Event::Tick, 4.0).unwrap();
    assert_eq!(active(&e), [high2]);
    assert_eq!(e.queued(), 0);
}

#[test]
fn without_priorities_or_caps_admission_stays_in_submit_order() {
    let mut e = engine(
        EngineConfig {
            max_jobs: 2,
            ..EngineConfig::default()
        },
        4,
    );
    let ids: Vec<JobId> = (0..5)
        .map(|k| {
            let mut s = spec(&format!("j{k}"), 1, 0, 1, 1);
            s.user = None;
            submit(&mut e, s, 1.0)
        })
        .collect();
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(active(&e), ids[..2]);
    assert_eq!(e.queue().collect::<Vec<_>>(), ids[2..]);
}

/// Ten jobs of user A and one of user B, `max_jobs` = 10: B's job is admitted at the
/// first decision after a slot frees, by priority (fairshare favours B) or by A's cap.
#[test]
fn another_user_is_admitted_within_one_decision_of_a_free_slot() {
    // By priority: A's jobs filled every slot and A has an eleventh queued first.
    let mut e = engine(EngineConfig::default(), 4);
    let a: Vec<JobId> = (0..11)
        .map(|k| submit(&mut e, spec(&format!("a{k}"), 100, 10, 1, 1), 1.0))
        .collect();
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(active(&e), a[..10]);
    let b = submit(&mut e, spec("b", 200, 50, 1, 1), 2.0);
    e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(e.job_status(b), JobStatus::Queued);
    e.on_event(&Event::JobFinished { job: a[0] }, 3.0).unwrap();
    e.on_event(&Event::Tick, 3.0).unwrap();
    assert_eq!(e.job_status(b), JobStatus::Active);
    assert_eq!(e.job_status(a[10]), JobStatus::Queued);

    // By A's cap, with equal priorities: A holds its cap of slots, and A's queued jobs
    // (submitted before B's) do not hold B back.
    let mut e = engine(
        EngineConfig {
            max_jobs_per_user: 9,
            ..EngineConfig::default()
        },
        4,
    );
    let a: Vec<JobId> = (0..10)
        .map(|k| submit(&mut e, spec(&format!("a{k}"), 100, 0, 1, 1), 1.0))
        .collect();
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(active(&e), a[..9]);
    let b = submit(&mut e, spec("b", 200, 0, 1, 1), 2.0);
    e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(e.job_status(b), JobStatus::Active);
    assert_eq!(e.job_status(a[9]), JobStatus::Queued);
    // A slot freed by A goes to A's next job (A is under its cap again).
    e.on_event(&Event::JobFinished { job: a[0] }, 3.0).unwrap();
    e.on_event(&Event::Tick, 3.0).unwrap();
    assert_eq!(e.job_status(a[9]), JobStatus::Active);
}

fn user_nodes(e: &Engine<Exact>, jobs: &[JobId]) -> usize {
    jobs.iter().map(|&j| e.job_nodes(j).len()).sum()
}

#[test]
fn a_users_jobs_hold_at_most_max_nodes_per_user() {
    let mut e = engine(
        EngineConfig {
            max_nodes_per_user: 5,
            ..EngineConfig::default()
        },
        12,
    );
    // A's jobs could use all twelve nodes; B's one at most four.
    let a = [
        submit(&mut e, spec("a0", 1, 0, 2, 8), 1.0),
        submit(&mut e, spec("a1", 1, 0, 2, 8), 1.0),
    ];
    let b = submit(&mut e, spec("b", 2, 0, 1, 4), 1.0);
    for a in e.on_event(&Event::Tick, 1.0).unwrap() {
        if let Action::Admit { job, nodes } = a {
            assert!(nodes.len() >= e.job_spec(job).min_nodes as usize);
        }
    }
    assert_eq!(
        user_nodes(&e, &a),
        5,
        "{:?}",
        a.map(|j| e.job_nodes(j).to_vec())
    );
    // Both of A's jobs run: the budget went to each at its minimum first.
    assert!(a.iter().all(|&j| e.job_nodes(j).len() >= 2));
    assert_eq!(e.job_nodes(b).len(), 4);
    // Nodes free up: A still gets none beyond its cap.
    let freed = e.job_nodes(b).to_vec();
    e.on_event(&Event::JobFinished { job: b }, 2.0).unwrap();
    e.on_event(&Event::Tick, 2.0).unwrap();
    assert_eq!(user_nodes(&e, &a), 5);
    assert!(freed
        .iter()
        .all(|&n| e.node_state(n) == bftrainer_core::engine::NodeState::Idle));
    // The cap lowered (SIGHUP): A's jobs are cut to it, the lower priority one first.
    e.set_config(EngineConfig {
        max_nodes_per_user: 2,
        ..EngineConfig::default()
    });
    let acts = e.on_event(&Event::Tick, 3.0).unwrap();
    assert_eq!(user_nodes(&e, &a), 2, "{acts:?}");
    assert_eq!(e.job_nodes(a[0]).len(), 2);
    assert!(acts
        .iter()
        .any(|x| matches!(x, Action::Requeue { job, .. } if *job == a[1])));
}
