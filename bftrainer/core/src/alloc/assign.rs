//! Which nodes: from per-job counts to node sets, deterministically and without
//! migration (a growing job keeps all its nodes, a shrinking one keeps a subset).

use super::objective::reclaim_coeffs;
use super::{Instance, NodeIdx, Objective};

/// Nodes from most to least preferred: latest predicted reclaim first (unknown = never),
/// then lowest index. Without reclaim predictions this is index order.
pub(crate) fn node_rank(inst: &Instance) -> Option<Vec<u32>> {
    if inst.reclaim_in_s.iter().all(Option::is_none) {
        return None;
    }
    let mut order: Vec<u32> = (0..inst.n_nodes).collect();
    let t = |i: u32| inst.reclaim_in_s[i as usize].unwrap_or(f64::INFINITY);
    order.sort_by(|&a, &b| t(b).total_cmp(&t(a)).then(a.cmp(&b)));
    let mut rank = vec![0u32; inst.n_nodes as usize];
    for (r, &i) in order.iter().enumerate() {
        rank[i as usize] = r as u32;
    }
    Some(rank)
}

/// Order in which growing jobs pick nodes: by job index, or for `reclaim-aware` by
/// decreasing loss per reclaimed node (then job index), so the jobs that lose most get
/// the longest-lived nodes.
pub(crate) fn grow_order(inst: &Instance, objective: Objective) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inst.jobs.len()).collect();
    if objective == Objective::ReclaimAware {
        let k: Vec<f64> = inst
            .jobs
            .iter()
            .map(|j| {
                let (a, b) = reclaim_coeffs(j);
                a + inst.t_fwd_s * b
            })
            .collect();
        order.sort_by(|&x, &y| k[y].total_cmp(&k[x]).then(x.cmp(&y)));
    }
    order
}

/// Node sets for the given counts. A shrinking job keeps its most preferred nodes; the
/// free nodes (idle or released) go to growing jobs, most preferred first.
pub(crate) fn assign(inst: &Instance, counts: &[u32], objective: Objective) -> Vec<Vec<NodeIdx>> {
    let rank = node_rank(inst);
    let key = |i: NodeIdx| rank.as_ref().map_or(i, |r| r[i as usize]);
    let mut used = vec![false; inst.n_nodes as usize];
    let mut sets: Vec<Vec<NodeIdx>> = Vec::with_capacity(counts.len());
    for (job, &n) in inst.jobs.iter().zip(counts) {
        let mut keep = job.current.clone();
        if (n as usize) < keep.len() {
            keep.sort_unstable_by_key(|&i| key(i));
            keep.truncate(n as usize);
        }
        for &i in &keep {
            used[i as usize] = true;
        }
        sets.push(keep);
    }
    let mut free: Vec<NodeIdx> = (0..inst.n_nodes).filter(|&i| !used[i as usize]).collect();
    if rank.is_some() {
        free.sort_unstable_by_key(|&i| key(i));
    }
    let mut next = 0usize;
    for j in grow_order(inst, objective) {
        let want = counts[j] as usize;
        let have = sets[j].len();
        if want > have {
            sets[j].extend_from_slice(&free[next..next + want - have]);
            next += want - have;
        }
    }
    for s in &mut sets {
        s.sort_unstable();
    }
    sets
}
