//! Helpers shared by the engine's tests: a job spec with a linear curve, and nodes
//! declared and reported idle.

#![allow(dead_code)]

use bftrainer_core::alloc::Curve;
use bftrainer_core::engine::{Allocator, ElasticSpec, Engine, Event};

/// A job of `min..=max` nodes worth `per_node` per node, no owner, priority 0.
pub fn spec(name: &str, min: u32, max: u32, per_node: f64) -> ElasticSpec {
    ElasticSpec {
        name: name.into(),
        min_nodes: min,
        max_nodes: max,
        scale_up_s: 1.0,
        scale_down_s: 1.0,
        objective: Curve {
            points: vec![(1, per_node), (8, 8.0 * per_node)],
        },
        user: None,
        priority: 0,
    }
}

/// Node `n` reported idle at `t`.
pub fn idle<A: Allocator>(e: &mut Engine<A>, n: u32, t: f64) {
    e.on_event(
        &Event::NodeIdle {
            node: n,
            reclaim_at: None,
        },
        t,
    )
    .unwrap();
}

/// Declares nodes `n0..n{nodes-1}` at time 0, all idle.
pub fn idle_nodes<A: Allocator>(e: &mut Engine<A>, nodes: u32) {
    for n in 0..nodes {
        e.on_event(
            &Event::NodeAdded {
                node: n,
                name: format!("n{n}"),
            },
            0.0,
        )
        .unwrap();
        idle(e, n, 0.0);
    }
}
