//! Fairness that a job's declarations cannot game (docs/design.md, "Fair shares"): each
//! user's share of the lent nodes, and each job's curve as the allocator sees it.
//!
//! A share is fixed before the allocator runs, from who asks and Slurm's fairshare, so
//! no declared throughput or rescale cost can move nodes from one user to another; the
//! allocator then optimises inside each share.

use crate::alloc::{Curve, Instance};
use std::collections::HashMap;

/// The least weight a user with demand has: a fairshare factor of 0 (a user far over
/// their Slurm share) still gets nodes nobody else asks for, and a little besides.
pub const MIN_WEIGHT: f64 = 0.01;

/// One user's claim on the lent nodes in one decision (a job without a known owner is a
/// user of its own).
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Relative weight (Slurm's fairshare factor, at least [`MIN_WEIGHT`]).
    pub weight: f64,
    /// Nodes the user keeps whatever the others ask: the minimum of each of its running
    /// jobs and what its jobs sitting a decision out hold. Fairness shrinks a running
    /// job, it never requeues one.
    pub floor: u32,
    /// The most the user's jobs can use together (their maximum sizes).
    pub demand: u32,
}

/// Weighted max-min fair shares of `n` nodes (water-filling): claim `u` gets
/// `clamp(λ·weight_u, floor_u, demand_u)`, with λ the level at which the shares use
/// all `n` nodes (or every demand is met), then whole nodes by largest remainder (ties
/// to the earlier claim). Floors are kept even when they add up to more than `n`.
pub fn water_fill(claims: &[Claim], n: u32) -> Vec<u32> {
    let demand: u64 = claims.iter().map(|c| u64::from(c.demand)).sum();
    if demand <= u64::from(n) {
        return claims.iter().map(|c| c.demand).collect();
    }
    let floors: u64 = claims
        .iter()
        .map(|c| u64::from(c.floor.min(c.demand)))
        .sum();
    if floors >= u64::from(n) {
        return claims.iter().map(|c| c.floor.min(c.demand)).collect();
    }
    let w = |c: &Claim| c.weight.max(MIN_WEIGHT);
    let at =
        |l: f64, c: &Claim| (l * w(c)).clamp(f64::from(c.floor.min(c.demand)), f64::from(c.demand));
    let used = |l: f64| claims.iter().map(|c| at(l, c)).sum::<f64>();
    let mut hi = claims
        .iter()
        .map(|c| f64::from(c.demand) / w(c))
        .fold(0.0, f64::max);
    let mut lo = 0.0;
    let target = f64::from(n);
    // used() is continuous and non-decreasing in λ; 64 halvings reach f64's resolution.
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if used(mid) <= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let exact: Vec<f64> = claims.iter().map(|c| at(lo, c)).collect();
    let mut share: Vec<u32> = exact.iter().map(|x| x.floor() as u32).collect();
    let mut left = n.saturating_sub(share.iter().sum::<u32>());
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    while left > 0 {
        let mut gave = false;
        for &u in &order {
            if left == 0 {
                break;
            }
            if share[u] < claims[u].demand {
                share[u] += 1;
                left -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    share
}

/// The rescale cost (seconds) the allocator uses for a job: the largest of its declared
/// cost, the config's floor and its measured cost (0: none), the measured one clamped to
/// the config's ceiling. Declared and measured costs are both the owner's word: lying
/// low gains nothing below the floor, and lying high (a job that costs so much to shrink
/// that it keeps its nodes) gains at most the ceiling, and only within its user's
/// share, which fairness enforces whatever the cost.
pub fn rescale_cost(declared: f64, floor: f64, measured: f64, ceiling: f64) -> f64 {
    declared.max(floor).max(measured.min(ceiling))
}

/// The curve the allocator uses for a job: its declared curve, with the rates measured
/// at some sizes (`measured`: (nodes, samples/s), sorted by nodes) in place of the
/// declared values there and the declared shape scaled to the nearest measurement in
/// between; then, when `normalise`, divided by its value at `min_nodes` (the job's
/// speed-up against its own minimum), so that no declared scale weighs against another
/// job's.
pub fn effective_curve(
    declared: &Curve,
    measured: &[(u32, f64)],
    min_nodes: u32,
    normalise: bool,
) -> Curve {
    let mut c = if measured.is_empty() {
        declared.clone()
    } else {
        let mut xs: Vec<u32> = declared.points.iter().map(|p| p.0).collect();
        xs.extend(measured.iter().map(|m| m.0));
        xs.sort_unstable();
        xs.dedup();
        let points = xs
            .into_iter()
            .map(|x| {
                if let Ok(i) = measured.binary_search_by_key(&x, |m| m.0) {
                    return (x, measured[i].1);
                }
                // The nearest measured size (the smaller on a tie) whose declared value
                // can be scaled.
                let near = measured
                    .iter()
                    .filter(|m| declared.eval(m.0) > 0.0)
                    .min_by_key(|m| (m.0.abs_diff(x), m.0));
                let scale = near.map_or(1.0, |m| m.1 / declared.eval(m.0));
                (x, declared.eval(x) * scale)
            })
            .collect();
        Curve::new(points)
    };
    if normalise {
        let base = c.eval(min_nodes.max(1));
        let base = if base > 0.0 {
            base
        } else {
            c.points.iter().map(|p| p.1).fold(0.0, f64::max)
        };
        if base > 0.0 {
            for p in &mut c.points {
                p.1 /= base;
            }
        }
    }
    c
}

/// One job in a split of its user's budget.
#[derive(Debug, Clone, PartialEq)]
pub struct JobClaim {
    /// Index of its user's [`Claim`].
    pub user: usize,
    pub min: u32,
    pub max: u32,
    /// Nodes it holds now.
    pub held: u32,
}

/// Each job's node budget (the top of its range in this decision): its user's budget
/// is the user's fixed cap (`caps`, `u32::MAX` for none) and, when `n` (the lendable
/// nodes) is given, the user's weighted max-min share of them ([`water_fill`]; a share
/// the user's jobs cannot use, a minimum too big for it, goes to the others). A user
/// given every node is bounded by the pool alone (its jobs are split by the allocator,
/// as without shares). `held_out`: nodes each user's jobs outside the split hold (they
/// count against its budget); `jobs` come highest priority first. `users[u].demand`
/// is lowered where a share goes unused.
pub fn budgets(
    jobs: &[JobClaim],
    users: &mut [Claim],
    caps: &[u32],
    held_out: &[u32],
    n: Option<u32>,
) -> Vec<u32> {
    let Some(n) = n else {
        return split(jobs, caps, held_out);
    };
    for (c, &k) in users.iter_mut().zip(caps) {
        c.demand = c.demand.min(k);
    }
    let mut limit = caps.to_vec();
    // A user whose share its jobs cannot use asks for what they can use, and the rest
    // is shared again: each round settles at least one such user.
    for _ in 0..4 {
        let shares = water_fill(users, n);
        for u in 0..limit.len() {
            limit[u] = if shares[u] >= n {
                caps[u]
            } else {
                caps[u].min(shares[u])
            };
        }
        let give = split(jobs, &limit, held_out);
        let mut used = held_out.to_vec();
        for (k, j) in jobs.iter().enumerate() {
            used[j.user] = used[j.user].saturating_add(give[k]);
        }
        let mut again = false;
        for (u, c) in users.iter_mut().enumerate() {
            if used[u] < shares[u].min(c.demand) {
                c.demand = used[u];
                again = true;
            }
        }
        if !again {
            return give;
        }
    }
    let shares = water_fill(users, n);
    for u in 0..limit.len() {
        limit[u] = if shares[u] >= n {
            caps[u]
        } else {
            caps[u].min(shares[u])
        };
    }
    split(jobs, &limit, held_out)
}

/// Splits each user's budget (`limit` less `held_out`) among its jobs, highest priority
/// first: first each job that runs (holds at least its minimum) gets its minimum, then
/// what it holds (a shrink where the budget is short), then the rest a node at a time,
/// a job that holds none getting its minimum at once. A budget of `u32::MAX` is no cap:
/// its jobs get their maximum.
pub fn split(jobs: &[JobClaim], limit: &[u32], held_out: &[u32]) -> Vec<u32> {
    let mut left: Vec<u32> = limit
        .iter()
        .zip(held_out)
        .map(|(&l, &h)| {
            if l == u32::MAX {
                l
            } else {
                l.saturating_sub(h)
            }
        })
        .collect();
    let free: Vec<bool> = jobs.iter().map(|j| left[j.user] == u32::MAX).collect();
    let mut give: Vec<u32> = jobs
        .iter()
        .zip(&free)
        .map(|(j, &f)| if f { j.max } else { 0 })
        .collect();
    for (k, j) in jobs.iter().enumerate() {
        if !free[k] && j.held >= j.min && j.min <= left[j.user] {
            give[k] = j.min;
            left[j.user] -= j.min;
        }
    }
    for (k, j) in jobs.iter().enumerate() {
        if !free[k] && give[k] > 0 {
            let g = j.held.min(j.max).saturating_sub(give[k]).min(left[j.user]);
            give[k] += g;
            left[j.user] -= g;
        }
    }
    // Round robin over the jobs that can still grow; each pass gives every one of them
    // a node (or its minimum) or drops it, so the passes cost O(nodes + jobs).
    let mut open: Vec<usize> = (0..jobs.len()).filter(|&k| !free[k]).collect();
    while !open.is_empty() {
        open.retain(|&k| {
            let j = &jobs[k];
            let step = if give[k] == 0 {
                j.min
            } else if give[k] < j.max {
                1
            } else {
                return false;
            };
            if step <= left[j.user] {
                give[k] += step;
                left[j.user] -= step;
                true
            } else {
                false
            }
        });
    }
    give
}

/// The rule bftrainerd applies, on a bare allocation instance (`bftrainer solve`):
/// curves normalised (jobs with batch curves keep theirs), and each job's maximum cut
/// to its part of its user's share (`users[j]`, `None`: a user of its own; `weights`
/// by user, 1 when absent), jobs in instance order. Returns which jobs keep a budget:
/// one without (its user's share is below its minimum) must get no nodes.
pub fn fair_instance(
    inst: &mut Instance,
    users: &[Option<u32>],
    weights: &HashMap<u32, f64>,
) -> Vec<bool> {
    let mut index: HashMap<u64, usize> = HashMap::new();
    let mut claims: Vec<Claim> = Vec::new();
    let mut jobs = Vec::with_capacity(inst.jobs.len());
    for (j, job) in inst.jobs.iter_mut().enumerate() {
        if !job.curve.points.is_empty() {
            job.curve = effective_curve(&job.curve, &[], job.min_nodes, true);
        }
        let user = users.get(j).copied().flatten();
        let key = user.map_or(1 << 32 | j as u64, u64::from);
        let u = *index.entry(key).or_insert_with(|| {
            claims.push(Claim {
                weight: user.and_then(|u| weights.get(&u).copied()).unwrap_or(1.0),
                floor: 0,
                demand: 0,
            });
            claims.len() - 1
        });
        let held = job.current.len() as u32;
        if held >= job.min_nodes {
            claims[u].floor += job.min_nodes;
        }
        claims[u].demand = claims[u].demand.saturating_add(job.max_nodes);
        jobs.push(JobClaim {
            user: u,
            min: job.min_nodes,
            max: job.max_nodes,
            held,
        });
    }
    let caps = vec![u32::MAX; claims.len()];
    let held_out = vec![0; claims.len()];
    let give = budgets(&jobs, &mut claims, &caps, &held_out, Some(inst.n_nodes));
    inst.jobs
        .iter_mut()
        .zip(give)
        .map(|(job, g)| {
            if g > 0 {
                job.max_nodes = job.max_nodes.min(g);
            }
            g > 0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(weight: f64, floor: u32, demand: u32) -> Claim {
        Claim {
            weight,
            floor,
            demand,
        }
    }

    #[test]
    fn equal_users_get_equal_shares() {
        let s = water_fill(&[claim(1.0, 0, 100), claim(1.0, 0, 100)], 10);
        assert_eq!(s, [5, 5]);
        let s = water_fill(
            &[claim(1.0, 0, 100), claim(1.0, 0, 100), claim(1.0, 0, 100)],
            10,
        );
        assert_eq!(s, [4, 3, 3]);
    }

    #[test]
    fn a_small_demand_leaves_the_rest_to_others() {
        let s = water_fill(&[claim(1.0, 0, 2), claim(1.0, 0, 100)], 10);
        assert_eq!(s, [2, 8]);
        assert_eq!(
            water_fill(&[claim(1.0, 0, 2), claim(1.0, 0, 3)], 10),
            [2, 3]
        );
    }

    #[test]
    fn weights_shift_shares_and_floors_hold() {
        let s = water_fill(&[claim(0.75, 0, 100), claim(0.25, 0, 100)], 12);
        assert_eq!(s, [9, 3]);
        // A running job's minimum is kept even above the weighted share.
        let s = water_fill(&[claim(0.75, 0, 100), claim(0.25, 5, 100)], 12);
        assert_eq!(s, [7, 5]);
        // Weight 0 is raised to MIN_WEIGHT: the user still gets what others leave.
        assert_eq!(
            water_fill(&[claim(0.0, 0, 100), claim(1.0, 0, 4)], 10),
            [6, 4]
        );
    }

    #[test]
    fn normalised_curves_lose_their_scale() {
        let big = Curve::new(vec![(1, 1e9), (4, 4e9)]);
        let small = Curve::new(vec![(1, 1.0), (4, 4.0)]);
        assert_eq!(
            effective_curve(&big, &[], 1, true),
            effective_curve(&small, &[], 1, true)
        );
        assert_eq!(effective_curve(&big, &[], 2, true).eval(2), 1.0);
        assert_eq!(effective_curve(&big, &[], 1, false), big);
    }

    #[test]
    fn rescale_costs_are_the_largest_word_with_the_measured_one_capped() {
        // Declared 0 (a lie low): the floor, or a larger measurement.
        assert_eq!(rescale_cost(0.0, 10.0, 0.0, 300.0), 10.0);
        assert_eq!(rescale_cost(0.0, 10.0, 42.0, 300.0), 42.0);
        // A measurement below the declaration does not lower it.
        assert_eq!(rescale_cost(60.0, 10.0, 42.0, 300.0), 60.0);
        // An inflated measurement stops at the ceiling.
        assert_eq!(rescale_cost(0.0, 10.0, 1e9, 300.0), 300.0);
    }

    #[test]
    fn measured_rates_replace_the_declared_ones() {
        // Declared: perfectly linear and huge; measured: 100/s on 1 node, 120/s on 4.
        let declared = Curve::new(vec![(1, 1e9), (8, 8e9)]);
        let c = effective_curve(&declared, &[(1, 100.0), (4, 120.0)], 1, false);
        assert_eq!(c.eval(1), 100.0);
        assert_eq!(c.eval(4), 120.0);
        // Past the last measurement the declared shape, scaled to it: 8/4 x 120.
        assert!((c.eval(8) - 240.0).abs() < 1e-9);
        let n = effective_curve(&declared, &[(1, 100.0), (4, 120.0)], 1, true);
        assert!((n.eval(4) - 1.2).abs() < 1e-12);
    }
}
