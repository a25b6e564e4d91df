//! Shared builders for the simulator tests: hand-built traces and a predictable test
//! allocator (keeps every job's nodes, fills jobs up to max in order, lowest pool index
//! first), so golden results can be worked out by hand.

#![allow(dead_code)]

use bftrainer_core::alloc::{Curve, Instance, Solution};
use bftrainer_core::engine::Allocator;
use bftrainer_core::sim::{simulate, Hooks, Outcome, SimConfig};
use bftrainer_core::trace::jobs::JobRecord;
use bftrainer_core::trace::swf::{SwfJob, SwfLog};
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
        user: None,
        priority: 0,
        needs: Default::default(),
    }
}

/// The grow-and-preempt trace: nodes a, b, c, d over 100 s; a and b idle from 0, c idle
/// from 10, a claimed at 30; then the `later` changes (time, node, idle).
pub fn grow_preempt_trace(later: &[(i64, u32, bool)]) -> NodeTrace {
    let mut changes = vec![(10, 2, true), (30, 0, false)];
    changes.extend_from_slice(later);
    trace(
        &["a", "b", "c", "d"],
        &[true, true, false, false],
        &changes,
        100,
    )
}

/// Job J of the grow-and-preempt trace: submitted at 0, 1..4 nodes, Tup 10 s, Tdw 5 s,
/// 10 samples/s per node, 1500 samples.
pub fn grow_preempt_job() -> JobRecord {
    job(
        "J",
        0,
        1,
        4,
        10.0,
        5.0,
        1500.0,
        &[(1, 10.0), (2, 20.0), (4, 40.0)],
    )
}

/// The SWF log of easy::tests' hand-worked schedule: 4 nodes, jobs (submit, run, nodes)
/// (0, 100, 2), (1, 50, 4), (2, 50, 2), (3, 200, 1), each asking for exactly its run time.
pub fn easy_example_log() -> SwfLog {
    SwfLog {
        max_nodes: Some(4),
        max_procs: Some(4),
        unix_start: Some(0),
        jobs: [(0, 100, 2), (1, 50, 4), (2, 50, 2), (3, 200, 1)]
            .iter()
            .enumerate()
            .map(|(i, &(submit, run, procs))| SwfJob {
                id: i as i64,
                submit,
                wait: None,
                run,
                procs: Some(procs),
                req_time: Some(run),
            })
            .collect(),
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
