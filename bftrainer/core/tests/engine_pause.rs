//! `Event::JobPaused`: a job whose growth failed for reasons of its own keeps what it
//! holds and sits decisions out, so the pool goes to the other jobs; when the pause
//! ends it takes part again.

mod engine_common;

use bftrainer_core::engine::{Action, ElasticSpec, Engine, EngineConfig, Event, Exact};
use engine_common::{idle, idle_nodes, spec};

#[test]
fn a_paused_job_keeps_its_nodes_and_the_pool_goes_to_others() {
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    for n in 0..6 {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        )
        .unwrap();
    }
    for n in 0..2 {
        idle(&mut e, n, 0.0);
    }
    // Job a is worth more per node than b: unpaused, it takes every idle node.
    let a = spec("a", 1, 8, 10.0);
    e.on_event(&Event::JobSubmitted { job: 0, spec: a }, 0.0)
        .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(
        acts,
        vec![Action::Admit {
            job: 0,
            nodes: vec![0, 1]
        }]
    );
    // A satellite of a failed on its own account: a is paused until t=100.
    e.on_event(
        &Event::JobPaused {
            job: 0,
            until: Some(100.0),
        },
        1.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            spec: spec("b", 1, 8, 1.0),
        },
        1.0,
    )
    .unwrap();
    for n in 2..5 {
        idle(&mut e, n, 1.0);
    }
    let acts = e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(
        acts,
        vec![Action::Admit {
            job: 1,
            nodes: vec![2, 3, 4]
        }],
        "the paused job neither grows nor shrinks; b gets the new nodes"
    );
    assert_eq!(e.job_nodes(0), &[0, 1]);
    assert_eq!(e.wake_at(), Some(100.0));
    // Still paused at 50: a new idle node goes to b.
    idle(&mut e, 5, 50.0);
    let acts = e.on_event(&Event::Tick, 50.0).unwrap();
    assert_eq!(
        acts,
        vec![Action::Grow {
            job: 1,
            nodes: vec![5]
        }]
    );
    // The pause ends: a takes part again and, worth more per node, takes nodes of b.
    let acts = e.on_event(&Event::Tick, 100.0).unwrap();
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Grow { job: 0, .. })),
        "{acts:?}"
    );
    assert!(e.job_nodes(0).len() > 2);
}

#[test]
fn a_pause_can_be_lifted_and_a_loss_below_min_is_still_decided() {
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    idle_nodes(&mut e, 3);
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("a", 2, 3, 1.0),
        },
        0.0,
    )
    .unwrap();
    e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(e.job_nodes(0).len(), 3);
    e.on_event(
        &Event::JobPaused {
            job: 0,
            until: Some(1e9),
        },
        1.0,
    )
    .unwrap();
    // Two nodes lost: below its minimum, the paused job is requeued all the same.
    e.on_event(&Event::NodeClaimed { node: 0 }, 2.0).unwrap();
    e.on_event(&Event::NodeClaimed { node: 1 }, 2.0).unwrap();
    let acts = e.on_event(&Event::Tick, 2.0).unwrap();
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Requeue { job: 0, .. })),
        "{acts:?}"
    );
    // Paused with no nodes: not admitted again until lifted.
    idle(&mut e, 0, 3.0);
    idle(&mut e, 1, 3.0);
    assert!(e.on_event(&Event::Tick, 3.0).unwrap().is_empty());
    e.on_event(
        &Event::JobPaused {
            job: 0,
            until: None,
        },
        4.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 4.0).unwrap();
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Admit { job: 0, .. })),
        "{acts:?}"
    );
}

fn engine_with(max_jobs: usize, nodes: u32) -> Engine<Exact> {
    let mut e = Engine::new(
        EngineConfig {
            max_jobs,
            ..EngineConfig::default()
        },
        Exact::default(),
    );
    idle_nodes(&mut e, nodes);
    e
}

fn submit(e: &mut Engine<Exact>, job: u32, user: u32, t: f64) {
    e.on_event(
        &Event::JobSubmitted {
            job,
            spec: ElasticSpec {
                user: Some(user),
                ..spec(&format!("j{job}"), 1, 1, 1.0)
            },
        },
        t,
    )
    .unwrap();
}

#[test]
fn one_users_many_jobs_do_not_starve_another_user() {
    // Two slots; user 1 submitted three jobs before user 2's one: user 2 gets the
    // second slot (fewest active jobs first among equal priorities).
    let mut e = engine_with(2, 4);
    for j in 0..3 {
        submit(&mut e, j, 1, 0.0);
    }
    submit(&mut e, 3, 2, 0.0);
    e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(e.active(), &[0, 3]);
    // A slot frees: user 1's next job (user 2 has nothing queued).
    e.on_event(&Event::JobFinished { job: 3 }, 1.0).unwrap();
    e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(e.active(), &[0, 1]);
}

#[test]
fn a_paused_queued_job_takes_no_slot() {
    let mut e = engine_with(1, 2);
    submit(&mut e, 0, 1, 0.0);
    submit(&mut e, 1, 2, 0.0);
    // Job 0 cannot be served (say, its constraint): paused before its admission.
    e.on_event(
        &Event::JobPaused {
            job: 0,
            until: Some(1e9),
        },
        0.0,
    )
    .unwrap();
    e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(e.active(), &[1], "the slot goes to the job that can use it");
    assert!(e.queue().any(|j| j == 0));
}
