//! Reclaim-aware extension: the expected loss of holding nodes that a regular job takes
//! back within Tfwd, and a local improvement of the BFTrainer optimum against it.

use super::model::JobFn;
use super::objective::reclaim_coeffs;
use super::{Instance, NodeIdx};

/// Loss of one job holding node set `set`: each node reclaimed at t < Tfwd costs one
/// forced scale-down (Tdw_j * R_j) plus the per-node rate lost for the rest of the window
/// ((Tfwd - t) * R_j / n_ref).
fn job_loss(inst: &Instance, j: usize, set: &[NodeIdx]) -> f64 {
    if inst.reclaim_in_s.is_empty() {
        return 0.0;
    }
    let (a, b) = reclaim_coeffs(&inst.jobs[j]);
    set.iter()
        .filter_map(|&i| inst.reclaim_in_s[i as usize])
        .filter(|&t| t < inst.t_fwd_s)
        .map(|t| a + (inst.t_fwd_s - t) * b)
        .sum()
}

pub(crate) fn loss(inst: &Instance, alloc: &[Vec<NodeIdx>]) -> f64 {
    alloc
        .iter()
        .enumerate()
        .map(|(j, s)| job_loss(inst, j, s))
        .sum()
}

/// Starting from the count-optimal allocation, let each growing job give back its
/// newest short-lived nodes when that raises the extended objective. Not exact in
/// general; docs/design.md and docs/benchmarks.md give the measured gap.
pub(crate) fn improve(
    inst: &Instance,
    fns: &[JobFn<'_>],
    mut jobs: Vec<Vec<NodeIdx>>,
) -> Vec<Vec<NodeIdx>> {
    if inst.reclaim_in_s.is_empty() {
        return jobs;
    }
    let t = |i: NodeIdx| inst.reclaim_in_s[i as usize].unwrap_or(f64::INFINITY);
    for (j, f) in fns.iter().enumerate() {
        let cur = &inst.jobs[j].current;
        let n = jobs[j].len() as u32;
        if n <= f.c {
            continue;
        }
        // New nodes, best (longest-lived) first; the job can drop a suffix of them.
        let mut new: Vec<NodeIdx> = jobs[j]
            .iter()
            .copied()
            .filter(|i| !cur.contains(i))
            .collect();
        new.sort_by(|&x, &y| t(y).total_cmp(&t(x)).then(x.cmp(&y)));
        let base_loss = job_loss(inst, j, cur);
        let mut best = (f.value(n) - job_loss(inst, j, &jobs[j]), n);
        let mut acc = base_loss;
        let mut cand: Vec<(u32, f64)> = vec![(f.c, acc)];
        for (k, &i) in new.iter().enumerate() {
            acc += job_loss(inst, j, &[i]);
            cand.push((f.c + k as u32 + 1, acc));
        }
        for &(m, l) in &cand {
            if m < n && f.allowed(m) {
                let v = f.value(m) - l;
                if v > best.0 {
                    best = (v, m);
                }
            }
        }
        if best.1 < n {
            let keep = (best.1 - f.c) as usize;
            let mut set: Vec<NodeIdx> = cur.clone();
            set.extend_from_slice(&new[..keep]);
            set.sort_unstable();
            jobs[j] = set;
        }
    }
    jobs
}
