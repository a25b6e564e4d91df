//! Which nodes: from per-job counts to node sets, deterministically and without
//! migration (a growing job keeps all its nodes, a shrinking one keeps a subset). With
//! GPU-slot units (`Instance::host_of`) a job's units are packed onto few hosts.

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
    if !inst.host_of.is_empty() {
        return assign_hosts(inst, counts, objective);
    }
    let rank = node_rank(inst);
    let key = |i: NodeIdx| rank.as_ref().map_or(i, |r| r[i as usize]);
    let mut used = vec![false; inst.n_nodes as usize];
    let mut sets: Vec<Vec<NodeIdx>> = Vec::with_capacity(counts.len());
    for (j, (job, &n)) in inst.jobs.iter().zip(counts).enumerate() {
        let mut keep = job.current.clone();
        if (n as usize) < keep.len() {
            if objective == Objective::ReclaimAware && rank.is_some() {
                // Keep the nodes this job would lose least on; among equal ones the
                // shortest-lived, so the long-lived go back to the pool for others.
                let loss = super::reclaim::node_losses(inst, j, &keep);
                let mut order: Vec<(f64, u32, NodeIdx)> = keep
                    .iter()
                    .zip(&loss)
                    .map(|(&i, &l)| (l, key(i), i))
                    .collect();
                order.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
                keep = order.into_iter().map(|x| x.2).collect();
            } else {
                keep.sort_unstable_by_key(|&i| key(i));
            }
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

/// Predicted reclaim time of unit `i`, +inf when none.
fn t_of(inst: &Instance, i: NodeIdx) -> f64 {
    inst.reclaim_in_s
        .get(i as usize)
        .copied()
        .flatten()
        .unwrap_or(f64::INFINITY)
}

/// Dense host numbers `0..h` for `inst.host_of` (any u32 there), in order of first unit.
pub(crate) fn dense_hosts(inst: &Instance) -> (Vec<u32>, usize) {
    let n = inst.host_of.len();
    let mut map: std::collections::HashMap<u32, u32> =
        std::collections::HashMap::with_capacity(n / 4 + 1);
    let dense: Vec<u32> = inst
        .host_of
        .iter()
        .map(|&h| {
            let next = map.len() as u32;
            *map.entry(h).or_insert(next)
        })
        .collect();
    (dense, map.len())
}

/// Job `j`'s current units, the ones it keeps first when it shrinks. Host-aware: a
/// shrinking job keeps whole hosts of its own, hosts where it holds most first, and
/// releases the hosts it holds least of, so that freed slots come back in whole hosts.
/// Before that: reclaim-aware keeps the units it would lose least on, and among equal
/// losses the shortest-lived (the long-lived go back to the pool for others); the
/// other objectives keep the latest-reclaimed.
pub(crate) fn keep_order_hosts(
    inst: &Instance,
    j: usize,
    objective: Objective,
    hosts: &[u32],
    held: &mut [u32],
) -> Vec<NodeIdx> {
    let cur = &inst.jobs[j].current;
    for &i in cur {
        held[hosts[i as usize] as usize] += 1;
    }
    let loss = if objective == Objective::ReclaimAware {
        super::reclaim::node_losses(inst, j, cur)
    } else {
        vec![0.0; cur.len()]
    };
    let mut order: Vec<(f64, f64, u32, u32, NodeIdx)> = cur
        .iter()
        .zip(&loss)
        .map(|(&i, &l)| {
            let t = t_of(inst, i);
            let h = hosts[i as usize];
            // Later reclaim first, except under reclaim-aware (shortest-lived first
            // among equal losses, as for whole nodes).
            let tk = if objective == Objective::ReclaimAware {
                t
            } else {
                -t
            };
            (l, tk, u32::MAX - held[h as usize], h, i)
        })
        .collect();
    order.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(a.1.total_cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
            .then(a.4.cmp(&b.4))
    });
    for &i in cur {
        held[hosts[i as usize] as usize] = 0;
    }
    order.into_iter().map(|x| x.4).collect()
}

/// Free units of one host with one reclaim time, lowest index first.
struct Group {
    units: Vec<NodeIdx>,
    /// Units given away so far (taken from the front).
    taken: usize,
}

impl Group {
    fn free(&self) -> u32 {
        (self.units.len() - self.taken) as u32
    }
}

/// [`assign`] for GPU-slot units. Shrinking jobs keep by [`keep_order_hosts`]. The free
/// units are grouped by host and reclaim time; reclaim time decides first (latest
/// first, unknown = never), so a job gets the same reclaim times, hence the same loss,
/// as unit by unit, which the reclaim-aware search scores. Within one reclaim time a
/// growing job takes (1) free slots of hosts it already holds, (2) the host with the
/// fewest free slots that covers what it still needs (best fit: whole hosts stay whole
/// for others), else (3) the host with the most free slots, all of them, and repeats.
/// Taking the largest first and the best fit last reaches the fewest hosts for one job.
fn assign_hosts(inst: &Instance, counts: &[u32], objective: Objective) -> Vec<Vec<NodeIdx>> {
    use std::collections::BTreeSet;
    let n = inst.n_nodes as usize;
    let (hosts, n_hosts) = dense_hosts(inst);
    let mut held = vec![0u32; n_hosts];
    let mut used = vec![false; n];
    let mut sets: Vec<Vec<NodeIdx>> = Vec::with_capacity(counts.len());
    for (j, &c) in counts.iter().enumerate() {
        let cur = &inst.jobs[j].current;
        let keep = if (c as usize) < cur.len() {
            let mut k = keep_order_hosts(inst, j, objective, &hosts, &mut held);
            k.truncate(c as usize);
            k
        } else {
            cur.clone()
        };
        for &i in &keep {
            used[i as usize] = true;
        }
        sets.push(keep);
    }
    // Groups of free units by (reclaim time, host), in order of their first unit. A
    // host's units nearly always share one reclaim time: its groups are found by a scan
    // of its own few, no hashing.
    let mut host_groups: Vec<Vec<u32>> = vec![Vec::new(); n_hosts];
    let mut groups: Vec<Group> = Vec::new();
    let mut gt: Vec<f64> = Vec::new();
    for i in 0..n as u32 {
        if used[i as usize] {
            continue;
        }
        let t = t_of(inst, i);
        let h = hosts[i as usize];
        let hg = &mut host_groups[h as usize];
        let g = match hg
            .iter()
            .find(|&&g| gt[g as usize].to_bits() == t.to_bits())
        {
            Some(&g) => g,
            None => {
                groups.push(Group {
                    units: Vec::new(),
                    taken: 0,
                });
                gt.push(t);
                let g = groups.len() as u32 - 1;
                hg.push(g);
                g
            }
        };
        groups[g as usize].units.push(i);
    }
    // Classes: groups of equal reclaim time, latest first, each keyed by
    // (free, u32::MAX - group): the largest is the last key, the best fit a range query.
    let mut order: Vec<u32> = (0..groups.len() as u32).collect();
    order.sort_by(|&a, &b| gt[b as usize].total_cmp(&gt[a as usize]).then(a.cmp(&b)));
    let mut classes: Vec<(u64, BTreeSet<(u32, u32)>)> = Vec::new();
    let mut class_of = vec![0u32; groups.len()];
    for &g in &order {
        let tb = gt[g as usize].to_bits();
        if classes.last().map_or(true, |c| c.0 != tb) {
            classes.push((tb, BTreeSet::new()));
        }
        class_of[g as usize] = classes.len() as u32 - 1;
        let free = groups[g as usize].free();
        classes.last_mut().unwrap().1.insert((free, u32::MAX - g));
    }
    let take = |groups: &mut [Group],
                set: &mut BTreeSet<(u32, u32)>,
                g: u32,
                k: u32,
                out: &mut Vec<NodeIdx>| {
        let gr = &mut groups[g as usize];
        let f = gr.free();
        set.remove(&(f, u32::MAX - g));
        out.extend_from_slice(&gr.units[gr.taken..gr.taken + k as usize]);
        gr.taken += k as usize;
        if f > k {
            set.insert((f - k, u32::MAX - g));
        }
    };
    // The first group of the largest free count up to `f` (inclusive).
    let first_of = |set: &BTreeSet<(u32, u32)>, f: u32| -> Option<(u32, u32)> {
        let &(f, r) = set.range(..=(f, u32::MAX)).next_back()?;
        Some((f, u32::MAX - r))
    };
    let mut ci = 0usize;
    // The groups of the hosts a growing job holds, by class: (class, group).
    let mut mine: Vec<(u32, u32)> = Vec::new();
    for j in grow_order(inst, objective) {
        let want = counts[j] as usize;
        let have = sets[j].len();
        if want <= have {
            continue;
        }
        let mut need = (want - have) as u32;
        mine.clear();
        for &i in &sets[j] {
            for &g in &host_groups[hosts[i as usize] as usize] {
                mine.push((class_of[g as usize], g));
            }
        }
        mine.sort_unstable();
        mine.dedup();
        let mut m = 0usize;
        let mut out: Vec<NodeIdx> = Vec::with_capacity(need as usize);
        while need > 0 {
            while ci < classes.len() && classes[ci].1.is_empty() {
                ci += 1;
            }
            let Some((_, set)) = classes.get_mut(ci) else {
                break; // cannot happen: the counts fit the units
            };
            // (1) hosts it holds, in host order (earlier classes are used up). Hosts it
            // takes below are taken whole but the last, which ends the need.
            while need > 0 && m < mine.len() && mine[m].0 as usize <= ci {
                let g = mine[m].1;
                let f = groups[g as usize].free();
                if f > 0 {
                    let k = f.min(need);
                    take(&mut groups, set, g, k, &mut out);
                    need -= k;
                }
                if groups[g as usize].free() == 0 {
                    m += 1;
                }
            }
            if need == 0 {
                break;
            }
            // (2) best fit: the fewest free slots >= need; else (3) the most, whole.
            let pick = match set.range((need, 0)..).next() {
                Some(&(f, _)) => first_of(set, f).map(|(_, g)| (g, need)),
                None => set
                    .iter()
                    .next_back()
                    .and_then(|&(f, _)| first_of(set, f))
                    .map(|(f, g)| (g, f)),
            };
            let Some((g, k)) = pick else { continue };
            take(&mut groups, set, g, k, &mut out);
            need -= k;
        }
        sets[j].extend_from_slice(&out);
    }
    for s in &mut sets {
        s.sort_unstable();
    }
    sets
}

#[cfg(test)]
mod tests {
    use crate::alloc::{solve, Curve, Instance, JobInput, Objective, Options};

    /// A job that wants exactly `n` units (and more would add nothing).
    fn job(id: &str, n: u32, current: Vec<u32>) -> JobInput {
        JobInput {
            current,
            ..JobInput::new(
                id,
                n,
                n,
                0.0,
                0.0,
                Curve::new(vec![(1, 1.0), (n, 10.0 * f64::from(n))]),
            )
        }
    }

    fn inst(host_of: Vec<u32>, reclaim: Vec<Option<f64>>, jobs: Vec<JobInput>) -> Instance {
        Instance {
            t_fwd_s: 10.0,
            n_nodes: host_of.len() as u32,
            reclaim_in_s: reclaim,
            host_of,
            jobs,
        }
    }

    fn sets(i: &Instance, objective: Objective) -> Vec<Vec<u32>> {
        solve(i, &Options::new(objective)).unwrap().jobs
    }

    // Hosts: 7 has units 0-1, 8 has 2-4, 9 has 5-10.
    fn three_hosts() -> Vec<u32> {
        vec![7, 7, 8, 8, 8, 9, 9, 9, 9, 9, 9]
    }

    #[test]
    fn a_job_of_three_units_gets_one_host_that_fits() {
        let i = inst(three_hosts(), vec![], vec![job("a", 3, vec![])]);
        // Not the lowest indices 0, 1, 2 (two hosts), and not 3 of host 9's 6 (best fit).
        assert_eq!(sets(&i, Objective::Bftrainer), vec![vec![2, 3, 4]]);
        // Without hosts the old choice is unchanged: lowest indices.
        let mut flat = i.clone();
        flat.host_of.clear();
        assert_eq!(sets(&flat, Objective::Bftrainer), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn more_than_any_host_takes_the_largest_then_the_best_fit() {
        // 8 units: host 9's 6, then 2 more from the host that fits them best (host 7).
        let i = inst(three_hosts(), vec![], vec![job("a", 8, vec![])]);
        assert_eq!(
            sets(&i, Objective::Bftrainer),
            vec![vec![0, 1, 5, 6, 7, 8, 9, 10]]
        );
    }

    #[test]
    fn held_units_are_kept_and_their_host_filled_first() {
        // Holds unit 10 (host 9); grows to 3 on host 9, though host 8 would fit 3.
        let i = inst(three_hosts(), vec![], vec![job("a", 3, vec![10])]);
        assert_eq!(sets(&i, Objective::Bftrainer), vec![vec![5, 6, 10]]);
        // Two jobs: the one holding a unit of host 8 keeps it and fills host 8; the
        // newcomer takes the best fit of what is left (host 7's 2 units).
        let i = inst(
            three_hosts(),
            vec![],
            vec![job("a", 2, vec![]), job("b", 3, vec![3])],
        );
        assert_eq!(
            sets(&i, Objective::Bftrainer),
            vec![vec![0, 1], vec![2, 3, 4]]
        );
    }

    #[test]
    fn soon_reclaimed_hosts_are_used_last() {
        // Host 8 (the best fit for 3) is reclaimed in 5 s, host 9 in 100 s, host 7
        // never: the job takes host 7's 2 units, then 1 of host 9's.
        let mut r = vec![None; 11];
        for u in r.iter_mut().take(5).skip(2) {
            *u = Some(5.0);
        }
        for u in r.iter_mut().skip(5) {
            *u = Some(100.0);
        }
        for objective in [Objective::Bftrainer, Objective::ReclaimAware] {
            let i = inst(three_hosts(), r.clone(), vec![job("a", 3, vec![])]);
            assert_eq!(sets(&i, objective), vec![vec![0, 1, 5]], "{objective}");
        }
    }

    #[test]
    fn a_shrinking_job_keeps_the_hosts_it_holds_most_of() {
        // Holds 0 (host 7) and 5, 6, 7 (host 9); shrinks to 3: keeps host 9's, frees
        // host 7 whole.
        let mut a = job("a", 3, vec![0, 5, 6, 7]);
        a.max_nodes = 3;
        let i = inst(three_hosts(), vec![], vec![a]);
        assert_eq!(sets(&i, Objective::Bftrainer), vec![vec![5, 6, 7]]);
    }

    #[test]
    fn hosts_change_which_units_never_how_many() {
        use crate::alloc::gen::{generate, GenParams};
        for seed in 1..40 {
            for objective in Objective::ALL {
                let mut p = GenParams::new(120, 8, seed);
                p.reclaim_share = if seed % 2 == 0 { 0.3 } else { 0.0 };
                let flat = generate(&p);
                let mut packed = flat.clone();
                // Hosts of 1 to 6 units, in index order.
                let mut h = 0u32;
                let mut left = 0u32;
                packed.host_of = (0..flat.n_nodes)
                    .map(|i| {
                        if left == 0 {
                            h += 1;
                            left = 1 + (i * 7 + seed as u32) % 6;
                        }
                        left -= 1;
                        h * 1000
                    })
                    .collect();
                let opts = Options::new(objective);
                let (a, b) = (solve(&flat, &opts).unwrap(), solve(&packed, &opts).unwrap());
                if objective != Objective::ReclaimAware {
                    assert_eq!(a.counts(), b.counts(), "seed {seed} {objective}");
                    assert_eq!(
                        a.objective_value, b.objective_value,
                        "seed {seed} {objective}"
                    );
                }
                // Every job keeps what it holds (or a subset when it shrinks); no unit
                // twice.
                let mut seen = vec![false; packed.n_nodes as usize];
                for (job, set) in packed.jobs.iter().zip(&b.jobs) {
                    for &u in set {
                        assert!(!seen[u as usize], "seed {seed} {objective}: unit {u} twice");
                        seen[u as usize] = true;
                    }
                    let kept = job.current.iter().filter(|u| set.contains(u)).count();
                    assert_eq!(
                        kept,
                        job.current.len().min(set.len()),
                        "seed {seed} {objective}"
                    );
                }
            }
        }
    }
}
