//! Placement: the engine admits and grows a job only onto nodes that serve it
//! (`Event::NodeAttrs` against `Event::JobNeeds`), trading a node the allocator chose
//! for one nobody was given, or giving fewer; nodes and jobs without them are placed
//! as before. A snapshot keeps both.

mod engine_common;

use bftrainer_core::engine::{Action, Engine, EngineConfig, Event, Exact};
use bftrainer_core::placement::{Gpus, Needs, NodeAttrs};
use engine_common::{idle_nodes, spec};

fn gpu_node(typ: &str, count: u32) -> NodeAttrs {
    NodeAttrs {
        features: vec!["gpu".into()],
        gpus: vec![Gpus {
            typ: Some(typ.into()),
            count,
        }],
        mem_mb: 1000,
        gpu_slot: false,
    }
}

fn cpu_node() -> NodeAttrs {
    NodeAttrs {
        features: vec!["cpu".into()],
        gpus: Vec::new(),
        mem_mb: 1000,
        gpu_slot: false,
    }
}

fn a100s(count: u32) -> Needs {
    Needs {
        gpus: Some(Gpus {
            typ: Some("a100".into()),
            count,
        }),
        ..Default::default()
    }
}

fn nodes_of(acts: &[Action], job: u32) -> Vec<u32> {
    let mut v: Vec<u32> = acts
        .iter()
        .filter(|a| a.job() == job)
        .flat_map(|a| a.nodes().to_vec())
        .collect();
    v.sort_unstable();
    v
}

/// Six idle nodes: n0..n3 without GPUs (first in the pool, so an unconstrained
/// choice takes them), n4 and n5 with two a100 each.
fn engine() -> Engine<Exact> {
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    idle_nodes(&mut e, 6);
    for n in 0..6 {
        let attrs = if n >= 4 {
            gpu_node("a100", 2)
        } else {
            cpu_node()
        };
        e.on_event(&Event::NodeAttrs { node: n, attrs }, 0.0)
            .unwrap();
    }
    e
}

#[test]
fn a_gpu_job_gets_only_gpu_nodes_and_no_more_than_there_are() {
    let mut e = engine();
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("g", 1, 6, 10.0),
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobNeeds {
            job: 0,
            needs: a100s(2),
        },
        0.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(nodes_of(&acts, 0), vec![4, 5], "{acts:?}");
    assert_eq!(e.job_nodes(0).len(), 2);
    // A snapshot keeps what nodes offer and what jobs ask.
    let st = e.state();
    let mut back = Engine::new(EngineConfig::default(), Exact::default());
    back.load_state(&st).unwrap();
    assert_eq!(back.state(), st);
    assert_eq!(back.node_attrs(5), Some(&gpu_node("a100", 2)));
    assert_eq!(back.job_needs(0), Some(&a100s(2)));
}

#[test]
fn a_job_no_node_serves_is_not_admitted_and_others_are_placed_as_before() {
    let mut e = engine();
    // Asks 4 a100 per node: none has them.
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("big", 1, 6, 10.0),
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobNeeds {
            job: 0,
            needs: a100s(4),
        },
        0.0,
    )
    .unwrap();
    // A job with no needs.
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            spec: spec("any", 1, 6, 1.0),
        },
        0.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert!(nodes_of(&acts, 0).is_empty(), "{acts:?}");
    assert!(e.job_nodes(0).is_empty());
    assert!(!nodes_of(&acts, 1).is_empty(), "{acts:?}");
    // A constraint: only the cpu-featured nodes, and never a node job 1 holds.
    let mut e = engine();
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("c", 2, 6, 10.0),
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobNeeds {
            job: 0,
            needs: Needs {
                constraint: Some("gpu".into()),
                ..Default::default()
            },
        },
        0.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(nodes_of(&acts, 0), vec![4, 5], "{acts:?}");
}

#[test]
fn attributes_of_unknown_nodes_and_jobs_are_refused() {
    let mut e = engine();
    assert!(e
        .on_event(
            &Event::NodeAttrs {
                node: 9,
                attrs: cpu_node()
            },
            0.0
        )
        .is_err());
    assert!(e
        .on_event(
            &Event::JobNeeds {
                job: 3,
                needs: a100s(1)
            },
            0.0
        )
        .is_err());
}

/// Declares GPU-slot units `host/gpuK` in order, all idle at time 0.
fn slot_engine(hosts: &[(&str, u32)]) -> Engine<Exact> {
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    let mut n = 0;
    for &(h, k) in hosts {
        for g in 0..k {
            e.on_event(
                &Event::NodeAdded {
                    node: n,
                    name: bftrainer_core::placement::gpu_slot_name(h, g),
                },
                0.0,
            )
            .unwrap();
            engine_common::idle(&mut e, n, 0.0);
            n += 1;
        }
    }
    e
}

#[test]
fn gpu_slot_units_of_one_host_go_to_one_job() {
    // a has 3 free GPUs (units 0-2), b has 2 (units 3-4): a job of exactly 2 takes b's
    // two (best fit), not units 0 and 1; then a job of 3 takes a's three.
    let mut e = slot_engine(&[("a", 3), ("b", 2)]);
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("two", 2, 2, 10.0),
        },
        0.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(nodes_of(&acts, 0), vec![3, 4], "{acts:?}");
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            spec: spec("three", 3, 3, 10.0),
        },
        1.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(nodes_of(&acts, 1), vec![0, 1, 2], "{acts:?}");
    // A snapshot keeps the hosts: the restored engine packs the same way.
    let st = e.state();
    let mut back = Engine::new(EngineConfig::default(), Exact::default());
    back.load_state(&st).unwrap();
    assert_eq!(back.state(), st);
    assert_eq!(st.nodes[0].host.as_deref(), Some("a"));
    // Whole nodes named without a '/' have no host: the old choice, lowest first.
    let mut w = Engine::new(EngineConfig::default(), Exact::default());
    engine_common::idle_nodes(&mut w, 5);
    w.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("two", 2, 2, 10.0),
        },
        0.0,
    )
    .unwrap();
    let acts = w.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(nodes_of(&acts, 0), vec![0, 1], "{acts:?}");
}

#[test]
fn gpu_slots_go_only_to_jobs_asking_gpus() {
    // Two whole CPU nodes (0, 1) and host g's two GPU slots (2, 3), marked as slots. A
    // job asking no GPU (1 to 4 nodes) gets the two whole nodes only: a slot would hold a
    // GPU it does not use. A job asking one a100 per node then gets the two slots.
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    engine_common::idle_nodes(&mut e, 2);
    for (n, k) in [(2u32, 0u32), (3, 1)] {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: bftrainer_core::placement::gpu_slot_name("g", k),
            },
            0.0,
        )
        .unwrap();
        engine_common::idle(&mut e, n, 0.0);
    }
    let slot = NodeAttrs {
        gpu_slot: true,
        ..gpu_node("a100", 1)
    };
    for n in [2, 3] {
        e.on_event(
            &Event::NodeAttrs {
                node: n,
                attrs: slot.clone(),
            },
            0.0,
        )
        .unwrap();
    }
    e.on_event(
        &Event::JobSubmitted {
            job: 0,
            spec: spec("cpu", 1, 4, 10.0),
        },
        0.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 0.0).unwrap();
    assert_eq!(nodes_of(&acts, 0), vec![0, 1], "{acts:?}");
    e.on_event(
        &Event::JobSubmitted {
            job: 1,
            spec: spec("gpu", 1, 4, 10.0),
        },
        1.0,
    )
    .unwrap();
    e.on_event(
        &Event::JobNeeds {
            job: 1,
            needs: a100s(1),
        },
        1.0,
    )
    .unwrap();
    let acts = e.on_event(&Event::Tick, 1.0).unwrap();
    assert_eq!(nodes_of(&acts, 1), vec![2, 3], "{acts:?}");
}
