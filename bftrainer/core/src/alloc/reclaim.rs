//! Reclaim-aware extension: the expected loss of holding nodes that a regular job takes
//! back within Tfwd, and the search for allocations that avoid it.

use super::assign::assign;
use super::model::JobFn;
use super::objective::reclaim_coeffs;
use super::{Instance, NodeIdx, Objective};

/// Per-node loss of job j holding each node of `set`: a node reclaimed at t < Tfwd costs
/// one forced scale-down (Tdw_j * R_j) plus the per-node rate lost for the rest of the
/// window ((Tfwd - t) * R_j / n_ref_j).
pub(crate) fn node_losses(inst: &Instance, j: usize, set: &[NodeIdx]) -> Vec<f64> {
    if inst.reclaim_in_s.is_empty() {
        return vec![0.0; set.len()];
    }
    let (a, b) = reclaim_coeffs(&inst.jobs[j]);
    set.iter()
        .map(|&i| match inst.reclaim_in_s[i as usize] {
            Some(t) if t < inst.t_fwd_s => a + (inst.t_fwd_s - t) * b,
            _ => 0.0,
        })
        .collect()
}

pub(crate) fn loss(inst: &Instance, alloc: &[Vec<NodeIdx>]) -> f64 {
    alloc
        .iter()
        .enumerate()
        .map(|(j, s)| node_losses(inst, j, s).iter().sum::<f64>())
        .sum()
}

/// Jobs up to which the search also tries moves that take nodes from a second job.
const PAIR_MOVES_UP_TO: usize = 64;

fn value(inst: &Instance, fns: &[JobFn<'_>], sets: &[Vec<NodeIdx>]) -> f64 {
    fns.iter()
        .zip(sets)
        .map(|(f, s)| f.value(s.len() as u32))
        .sum::<f64>()
        - loss(inst, sets)
}

/// From the counts that are optimal with the kept-node loss (exact, separable), move one
/// job's count at a time while the extended objective improves, node choice by
/// [`assign`]. Not exact in general: the loss of new nodes depends on which job gets
/// which; docs/benchmarks.md gives the measured gap.
pub(crate) fn local_search(inst: &Instance, mut counts: Vec<u32>) -> Vec<Vec<NodeIdx>> {
    let fns: Vec<JobFn<'_>> = inst
        .jobs
        .iter()
        .map(|j| JobFn::new(j, inst.t_fwd_s, inst.n_nodes, 1.0))
        .collect();
    let mut sets = assign(inst, &counts, Objective::ReclaimAware);
    if inst.reclaim_in_s.is_empty() {
        return sets;
    }
    let mut best = value(inst, &fns, &sets);
    let tie = 1e-12 * (1.0 + best.abs());
    let mut used: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    for _round in 0..20 {
        let mut improved = false;
        for (j, f) in fns.iter().enumerate() {
            let n = counts[j];
            let mut cand: Vec<u32> = vec![
                0,
                f.c,
                f.lo,
                f.hi,
                n.saturating_sub(1),
                n + 1,
                n.saturating_sub(2),
                n + 2,
            ];
            cand.extend(f.bps.iter().copied());
            cand.sort_unstable();
            cand.dedup();
            for m in cand {
                if m == n || !f.allowed(m) {
                    continue;
                }
                let need =
                    (used - u64::from(n) + u64::from(m)).saturating_sub(u64::from(inst.n_nodes));
                counts[j] = m;
                // A move that does not fit may still pay off if another job makes room
                // (pair moves, on small instances only: each is a full evaluation).
                let partners: Vec<usize> = if need == 0 {
                    vec![usize::MAX]
                } else if fns.len() <= PAIR_MOVES_UP_TO {
                    (0..fns.len()).filter(|&k| k != j).collect()
                } else {
                    Vec::new()
                };
                let mut moved = false;
                for k in partners {
                    let old_k = if k == usize::MAX { 0 } else { counts[k] };
                    if k != usize::MAX {
                        let target = u64::from(old_k).checked_sub(need);
                        let Some(room) = (0..=target.unwrap_or(0) as u32)
                            .rev()
                            .find(|&x| fns[k].allowed(x))
                            .filter(|_| target.is_some())
                        else {
                            continue;
                        };
                        counts[k] = room;
                    }
                    let s = assign(inst, &counts, Objective::ReclaimAware);
                    let v = value(inst, &fns, &s);
                    if v > best + tie {
                        best = v;
                        sets = s;
                        used = counts.iter().map(|&c| u64::from(c)).sum();
                        moved = true;
                        break;
                    }
                    if k != usize::MAX {
                        counts[k] = old_k;
                    }
                }
                if moved {
                    improved = true;
                    break;
                }
                counts[j] = n;
            }
        }
        if !improved {
            break;
        }
    }
    sets
}
