//! Reclaim-aware extension: the expected loss of holding nodes that a regular job takes
//! back within Tfwd, and the search for allocations that avoid it.

use super::assign::assign;
use super::model::JobFn;
use super::objective::reclaim_coeffs;
use super::{Instance, NodeIdx, Objective};

/// Per-node loss of job j holding each node of `set`: a node reclaimed at t < Tfwd costs
/// one forced scale-down (Tdw_j * R_j) plus the per-node rate lost for the rest of the
/// window ((Tfwd - t) * R_j / n_ref_j). With GPU-slot units (`host_of`), a host's slots
/// go back together, in one forced scale-down of the job: the set's units on one host
/// share that one charge, each paying its share.
pub(crate) fn node_losses(inst: &Instance, j: usize, set: &[NodeIdx]) -> Vec<f64> {
    if inst.reclaim_in_s.is_empty() {
        return vec![0.0; set.len()];
    }
    let (a, b) = reclaim_coeffs(&inst.jobs[j]);
    let mut per_host: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    if !inst.host_of.is_empty() {
        for &i in set {
            *per_host.entry(inst.host_of[i as usize]).or_default() += 1;
        }
    }
    set.iter()
        .map(|&i| match inst.reclaim_in_s[i as usize] {
            Some(t) if t < inst.t_fwd_s => {
                let share = per_host
                    .get(&inst.host_of.get(i as usize).copied().unwrap_or(0))
                    .map_or(1.0, |&k| 1.0 / f64::from(k));
                a * share + (inst.t_fwd_s - t) * b
            }
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
const PAIR_MOVES_UP_TO: usize = 16;
/// Improvement rounds at most (each visits every job once).
const ROUNDS: usize = 10;

/// Scores count vectors under the extended objective without building node sets: the
/// node choice of [`assign`] replayed on prefix data.
struct Scorer<'a> {
    fns: Vec<JobFn<'a>>,
    tfwd: f64,
    /// Predicted reclaim time per node, +inf when none.
    t: Vec<f64>,
    rank: Vec<u32>,
    alpha: Vec<f64>,
    beta: Vec<f64>,
    grow_order: Vec<usize>,
    /// Each unit's host (GPU slots); empty for whole nodes, each its own host.
    host: Vec<u32>,
    /// Nodes held by no job, most preferred first.
    idle: Vec<NodeIdx>,
    /// Each job's current nodes, most preferred first, and the loss of keeping a prefix.
    cur: Vec<Vec<NodeIdx>>,
    keep_loss: Vec<Vec<f64>>,
}

impl<'a> Scorer<'a> {
    fn new(inst: &'a Instance) -> Self {
        let n = inst.n_nodes as usize;
        let t: Vec<f64> = (0..n)
            .map(|i| inst.reclaim_in_s[i].unwrap_or(f64::INFINITY))
            .collect();
        let rank = super::assign::node_rank(inst).unwrap_or_else(|| (0..inst.n_nodes).collect());
        let mut held = vec![false; n];
        let mut cur = Vec::with_capacity(inst.jobs.len());
        let mut keep_loss = Vec::with_capacity(inst.jobs.len());
        let (mut alpha, mut beta) = (Vec::new(), Vec::new());
        // With GPU-slot units the keep order groups hosts too (assign_hosts).
        let mut hosts = (!inst.host_of.is_empty()).then(|| {
            let (h, nh) = super::assign::dense_hosts(inst);
            (h, vec![0u32; nh])
        });
        for (j, job) in inst.jobs.iter().enumerate() {
            // Same keep order as assign(): least own loss first, then shortest-lived.
            let order: Vec<(f64, u32, NodeIdx)> = match &mut hosts {
                Some((h, held)) => {
                    let keep =
                        super::assign::keep_order_hosts(inst, j, Objective::ReclaimAware, h, held);
                    let losses = node_losses(inst, j, &keep);
                    keep.iter()
                        .zip(&losses)
                        .map(|(&i, &l)| (l, rank[i as usize], i))
                        .collect()
                }
                None => {
                    let losses = node_losses(inst, j, &job.current);
                    let mut order: Vec<(f64, u32, NodeIdx)> = job
                        .current
                        .iter()
                        .zip(&losses)
                        .map(|(&i, &l)| (l, rank[i as usize], i))
                        .collect();
                    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
                    order
                }
            };
            let c: Vec<NodeIdx> = order.iter().map(|x| x.2).collect();
            for &i in &c {
                held[i as usize] = true;
            }
            let mut acc = vec![0.0];
            for x in &order {
                acc.push(acc[acc.len() - 1] + x.0);
            }
            keep_loss.push(acc);
            cur.push(c);
            let (a, b) = reclaim_coeffs(job);
            alpha.push(a);
            beta.push(b);
        }
        let mut idle: Vec<NodeIdx> = (0..inst.n_nodes).filter(|&i| !held[i as usize]).collect();
        idle.sort_unstable_by_key(|&i| rank[i as usize]);
        Scorer {
            fns: inst
                .jobs
                .iter()
                .map(|j| JobFn::new(j, inst.t_fwd_s, inst.n_nodes, 1.0))
                .collect(),
            tfwd: inst.t_fwd_s,
            t,
            rank,
            alpha,
            beta,
            grow_order: super::assign::grow_order(inst, Objective::ReclaimAware),
            host: inst.host_of.clone(),
            idle,
            cur,
            keep_loss,
        }
    }

    fn score(&self, counts: &[u32], released: &mut Vec<NodeIdx>) -> f64 {
        let mut v = 0.0;
        released.clear();
        for (j, f) in self.fns.iter().enumerate() {
            let n = counts[j] as usize;
            let c = self.cur[j].len();
            v += f.value(n as u32) - self.keep_loss[j][n.min(c)];
            if n < c {
                released.extend_from_slice(&self.cur[j][n..]);
            }
        }
        released.sort_unstable_by_key(|&i| self.rank[i as usize]);
        // Growing jobs take the free nodes (idle merged with released, by preference).
        let (mut a, mut b) = (0usize, 0usize);
        for &j in &self.grow_order {
            let n = counts[j] as usize;
            let c = self.cur[j].len();
            // One forced scale-down per reclaimed host: slots taken in a row on one host
            // (the preference order keeps a host's slots together) pay it once.
            let mut last_host = None;
            for _ in c..n.max(c) {
                let i = match (self.idle.get(a), released.get(b)) {
                    (Some(&x), Some(&y)) if self.rank[x as usize] < self.rank[y as usize] => {
                        a += 1;
                        x
                    }
                    (_, Some(&y)) => {
                        b += 1;
                        y
                    }
                    (Some(&x), None) => {
                        a += 1;
                        x
                    }
                    (None, None) => return f64::NEG_INFINITY,
                };
                let ti = self.t[i as usize];
                if ti < self.tfwd {
                    let h = self.host.get(i as usize).copied();
                    if h.is_none() || h != last_host {
                        v -= self.alpha[j];
                    }
                    last_host = h;
                    v -= (self.tfwd - ti) * self.beta[j];
                }
            }
        }
        v
    }
}

/// From the counts that are optimal with the kept-node loss (exact, separable), move one
/// job's count at a time (or two jobs', on small instances) while the extended objective
/// improves, node choice by [`assign`]. Not exact in general: the loss of new nodes
/// depends on which job gets which; docs/benchmarks.md gives the measured gap.
pub(crate) fn local_search(inst: &Instance, mut counts: Vec<u32>) -> Vec<Vec<NodeIdx>> {
    if inst.reclaim_in_s.is_empty() {
        return assign(inst, &counts, Objective::ReclaimAware);
    }
    let sc = Scorer::new(inst);
    let mut rel = Vec::new();
    let mut best = sc.score(&counts, &mut rel);
    let tie = 1e-12 * (1.0 + best.abs());
    let budget = u64::from(inst.n_nodes);
    let mut used: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    let nj = sc.fns.len();
    for _round in 0..ROUNDS {
        let mut improved = false;
        for j in 0..nj {
            let f = &sc.fns[j];
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
            'moves: for m in cand {
                if m == n || !f.allowed(m) {
                    continue;
                }
                let need = (used - u64::from(n) + u64::from(m)).saturating_sub(budget);
                counts[j] = m;
                if need == 0 {
                    let v = sc.score(&counts, &mut rel);
                    if v > best + tie {
                        best = v;
                        used = used - u64::from(n) + u64::from(m);
                        improved = true;
                        break 'moves;
                    }
                } else if nj <= PAIR_MOVES_UP_TO {
                    // Does not fit: let another job make room.
                    for k in (0..nj).filter(|&k| k != j) {
                        let old_k = counts[k];
                        let Some(target) = u64::from(old_k).checked_sub(need) else {
                            continue;
                        };
                        let Some(room) = (0..=target as u32).rev().find(|&x| sc.fns[k].allowed(x))
                        else {
                            continue;
                        };
                        counts[k] = room;
                        let v = sc.score(&counts, &mut rel);
                        if v > best + tie {
                            best = v;
                            used = counts.iter().map(|&c| u64::from(c)).sum();
                            improved = true;
                            break 'moves;
                        }
                        counts[k] = old_k;
                    }
                }
                counts[j] = n;
            }
        }
        if !improved {
            break;
        }
    }
    assign(inst, &counts, Objective::ReclaimAware)
}

#[cfg(test)]
mod tests {
    use super::node_losses;
    use crate::alloc::objective::reclaim_coeffs;
    use crate::alloc::{Curve, Instance, JobInput};

    #[test]
    fn a_hosts_slots_share_one_forced_scale_down() {
        // Host 7 has units 0-2, reclaimed in 4 s; host 8 has units 3-5, never. A job
        // holding all three slots of host 7 and one of host 8 loses one scale-down for
        // host 7 (not three) plus the rate of its three slots for the rest of the window.
        let job = JobInput {
            current: vec![0, 1, 2, 3],
            ..JobInput::new("a", 1, 6, 2.0, 3.0, Curve::new(vec![(1, 10.0), (6, 60.0)]))
        };
        let (a, b) = reclaim_coeffs(&job);
        assert!(a > 0.0 && b > 0.0);
        let r = Some(4.0);
        let mut inst = Instance {
            t_fwd_s: 10.0,
            n_nodes: 6,
            reclaim_in_s: vec![r, r, r, None, None, None],
            host_of: vec![7, 7, 7, 8, 8, 8],
            jobs: vec![job],
        };
        let l = node_losses(&inst, 0, &[0, 1, 2, 3]);
        let total: f64 = l.iter().sum();
        assert!((total - (a + 3.0 * 6.0 * b)).abs() < 1e-9, "{l:?}");
        assert_eq!(l[3], 0.0);
        // Whole nodes (no hosts): each reclaimed node is its own scale-down, as before.
        inst.host_of.clear();
        let total: f64 = node_losses(&inst, 0, &[0, 1, 2, 3]).iter().sum();
        assert!((total - 3.0 * (a + 6.0 * b)).abs() < 1e-9);
    }
}
