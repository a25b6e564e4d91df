//! Shared builders for the simulator tests: hand-built traces and a predictable test
//! allocator (keeps every job's nodes, fills jobs up to max in order, lowest pool index
//! first), so golden results can be worked out by hand.

#![allow(dead_code)]

use bftrainer_core::alloc::{Curve, Instance, Solution};
use bftrainer_core::engine::Allocator;
use bftrainer_core::sim::{simulate, Hooks, Outcome, SimConfig};
use bftrainer_core::trace::jobs::JobRecord;
use bftrainer_core::trace::{NodeChange, NodeTrace};

/// Fills jobs in order; never shrinks. Not the BFTrainer optimum: a fixture.
pub struct FillInOrder;

impl Allocator for FillInOrder {
    fn allocate(&mut self, inst: &Instance) -> Result<Option<Solution>, String> {
        let mut used = vec![false; inst.n_nodes as usize];
        for j in &inst.jobs {
            for &n in &j.current {
                used[n as usize] = true;
            }
        }
        let mut free = (0..inst.n_nodes).filter(|&n| !used[n as usize]);
        let mut jobs = Vec::new();
        for j in &inst.jobs {
            let mut set = j.current.clone();
            while (set.len() as u32) < j.max_nodes {
                match free.next() {
                    Some(n) => set.push(n),
                    None => break,
                }
            }
            if !set.is_empty() && (set.len() as u32) < j.min_nodes {
                set = j.current.clone();
            }
            set.sort_unstable();
            jobs.push(set);
        }
        let n = jobs.len();
        Ok(Some(Solution {
            objective_value: 0.0,
            jobs,
            batch_sizes: vec![None; n],
            fairness_level: None,
        }))
    }
}

pub fn trace(
    names: &[&str],
    initial_idle: &[bool],
    changes: &[(i64, u32, bool)],
    end: i64,
) -> NodeTrace {
    NodeTrace {
        names: names.iter().map(|s| s.to_string()).collect(),
        start: 0,
        end,
        initial_idle: initial_idle.to_vec(),
        changes: changes
            .iter()
            .map(|&(t, node, idle)| NodeChange {
                t,
                node,
                idle,
                reclaim_at: None,
            })
            .collect(),
        forecasts: Vec::new(),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn job(
    name: &str,
    submit: i64,
    min: u32,
    max: u32,
    up: f64,
    down: f64,
    total: f64,
    rate: &[(u32, f64)],
) -> JobRecord {
    JobRecord {
        name: name.into(),
        submit,
        min_nodes: min,
        max_nodes: max,
        scale_up_s: up,
        scale_down_s: down,
        total_samples: total,
        rate: Curve {
            points: rate.to_vec(),
        },
        objective: Curve {
            points: rate.to_vec(),
        },
    }
}

pub fn run<A: Allocator>(tr: &NodeTrace, jobs: &[JobRecord], alloc: A, cfg: &SimConfig) -> Outcome {
    let mut clock = || 0.0;
    let mut progress = |_f: f64| {};
    let mut hooks = Hooks {
        clock: &mut clock,
        progress: &mut progress,
    };
    simulate(tr, jobs, alloc, cfg, &mut hooks).unwrap()
}

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}
