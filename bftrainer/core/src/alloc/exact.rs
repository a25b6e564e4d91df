//! Exact maximisation of a sum of per-job terms f_j(n_j) under sum n_j <= budget:
//! Lagrangian bound from the concave envelopes, reduced-cost fixing, then a DP over node
//! counts on the few jobs whose count is still open. Nodes of one kind are
//! interchangeable, so counts are all that matters here.

use super::model::JobFn;

/// Pre-pruning statistics, for benchmarks and docs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Jobs left open after reduced-cost fixing.
    pub open_jobs: usize,
    /// Width of the DP over node counts.
    pub dp_width: usize,
    /// Candidate counts summed over open jobs.
    pub candidates: usize,
    /// Lagrangian upper bound and the feasible value the search started from.
    pub upper_bound: f64,
    pub lower_bound: f64,
    /// Value of the returned counts.
    pub optimum: f64,
}

/// Upper concave hull of the job's (n, f(n)) at its breakpoints, as (n, f(n)).
fn hull(f: &JobFn<'_>, vals: &[f64]) -> Vec<(u32, f64)> {
    let mut h: Vec<(u32, f64)> = Vec::with_capacity(f.bps.len() + 1);
    let zero = f.zero.then(|| (0u32, f.value(0)));
    for p in zero
        .into_iter()
        .chain(f.bps.iter().copied().zip(vals.iter().copied()))
    {
        while h.len() >= 2 {
            let (x0, y0) = h[h.len() - 2];
            let (x1, y1) = h[h.len() - 1];
            // Drop the middle point when it lies on or below the chord: slopes must
            // strictly decrease along the hull.
            let cross = f64::from(x1 - x0) * (p.1 - y0) - (y1 - y0) * f64::from(p.0 - x0);
            if cross >= 0.0 {
                h.pop();
            } else {
                break;
            }
        }
        h.push(p);
    }
    h
}

/// Counts maximising sum_j f_j(n_j) with sum n_j <= budget. `None` when even the smallest
/// allowed counts do not fit. Ties: fewest nodes in total, then reverse-lexicographically
/// smallest (the last job with the fewest nodes first).
pub(crate) fn solve_counts(fns: &[JobFn<'_>], budget: u32) -> Option<(Vec<u32>, Stats)> {
    let nj = fns.len();
    let vals: Vec<Vec<f64>> = fns
        .iter()
        .map(|f| f.bps.iter().map(|&n| f.value(n)).collect())
        .collect();
    let hulls: Vec<Vec<(u32, f64)>> = fns.iter().zip(&vals).map(|(f, v)| hull(f, v)).collect();
    if hulls.iter().any(|h| h.is_empty()) {
        return None;
    }
    let base: u64 = hulls.iter().map(|h| u64::from(h[0].0)).sum();
    if base > u64::from(budget) {
        return None;
    }

    // LP relaxation over the envelopes: hull segments by decreasing slope.
    let mut segs: Vec<(f64, u32, u32)> = Vec::new();
    for (j, h) in hulls.iter().enumerate() {
        for k in 0..h.len() - 1 {
            let s = (h[k + 1].1 - h[k].1) / f64::from(h[k + 1].0 - h[k].0);
            if s > 0.0 {
                segs.push((s, j as u32, k as u32));
            }
        }
    }
    segs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut pos: Vec<usize> = vec![0; nj];
    let mut left = u64::from(budget) - base;
    let mut lambda = 0.0;
    let mut crit: Option<usize> = None;
    for (si, &(s, j, k)) in segs.iter().enumerate() {
        let (j, k) = (j as usize, k as usize);
        let len = u64::from(hulls[j][k + 1].0 - hulls[j][k].0);
        if len <= left {
            left -= len;
            pos[j] = k + 1;
        } else {
            lambda = s;
            crit = Some(si);
            break;
        }
    }

    // Feasible solution (lower bound): the greedy's vertices, then the remaining nodes
    // poured into the following segments in slope order, each job as far as its true
    // value (not the envelope) still rises. Many jobs share a model, hence a slope, so
    // this usually closes the gap to the bound at once.
    let mut lb_counts: Vec<u32> = (0..nj).map(|j| hulls[j][pos[j]].0).collect();
    let mut partial = vec![false; nj];
    for &(_, j, k) in segs.iter().skip(crit.unwrap_or(segs.len())) {
        if left == 0 {
            break;
        }
        let (j, k) = (j as usize, k as usize);
        if partial[j] || pos[j] != k {
            continue;
        }
        let f = &fns[j];
        let from = lb_counts[j];
        let end = hulls[j][k + 1].0;
        let to = u64::from(end).min(u64::from(from) + left) as u32;
        let mut best = (f.value(from), from);
        for n in f.bps.iter().copied().filter(|&n| n > from && n < to).chain([to]) {
            if f.allowed(n) {
                let v = f.value(n);
                if v > best.0 {
                    best = (v, n);
                }
            }
        }
        if best.1 == end {
            pos[j] = k + 1;
        } else {
            partial[j] = true;
        }
        left -= u64::from(best.1 - from);
        lb_counts[j] = best.1;
    }
    if std::env::var("ALLOC_DEBUG").is_ok() {
        if let Some(ci) = crit {
            let (sl, j, k) = segs[ci];
            let (j, k) = (j as usize, k as usize);
            eprintln!("lambda {sl} crit job {j} seg {k} hull {:?} c {} lo {} hi {} left {left}", hulls[j], fns[j].c, fns[j].lo, fns[j].hi);
        }
    }
    let lb: f64 = lb_counts.iter().zip(fns).map(|(&n, f)| f.value(n)).sum();

    let lj: Vec<f64> = hulls
        .iter()
        .map(|h| {
            h.iter()
                .map(|&(x, y)| y - lambda * f64::from(x))
                .fold(f64::NEG_INFINITY, f64::max)
        })
        .collect();
    let ub = lambda * f64::from(budget) + lj.iter().sum::<f64>();
    let scale =
        lambda * f64::from(budget) + lj.iter().map(|v| v.abs()).sum::<f64>() + lb.abs() + 1.0;
    let tol = 1e-9 * scale;
    // Values closer than this are ties (rounding noise), broken by the documented rule.
    let tie = 1e-12 * scale;
    let gap = (ub - lb).max(0.0) + tol;

    // Reduced-cost fixing: a job's count n can be in an optimal solution only if
    // L_j - (f_j(n) - lambda n) <= UB - LB.
    let mut cands: Vec<Vec<(u32, u32)>> = Vec::with_capacity(nj);
    for (j, f) in fns.iter().enumerate() {
        let thr = lj[j] - gap;
        let g = |n: u32, v: f64| v - lambda * f64::from(n);
        let mut iv: Vec<(u32, u32)> = Vec::new();
        let mut push = |a: u32, b: u32| match iv.last_mut() {
            Some(last) if last.1 + 1 >= a => last.1 = last.1.max(b),
            _ => iv.push((a, b)),
        };
        if f.zero && g(0, f.value(0)) >= thr {
            push(0, 0);
        }
        let v = &vals[j];
        let b = &f.bps;
        if b.len() == 1 && g(b[0], v[0]) >= thr {
            push(b[0], b[0]);
        }
        for i in 0..b.len().saturating_sub(1) {
            let (x0, x1) = (b[i], b[i + 1]);
            let (g0, g1) = (g(x0, v[i]), g(x1, v[i + 1]));
            if f.range_of(x0) != f.range_of(x1) {
                // A gap in the domain between them: only the end points themselves.
                if g0 >= thr {
                    push(x0, x0);
                }
                if g1 >= thr {
                    push(x1, x1);
                }
                continue;
            }
            match (g0 >= thr, g1 >= thr) {
                (true, true) => push(x0, x1),
                (true, false) => {
                    let t = (g0 - thr) / (g0 - g1) * f64::from(x1 - x0);
                    push(
                        x0,
                        (f64::from(x0) + t.floor() + 1.0).min(f64::from(x1)) as u32,
                    );
                }
                (false, true) => {
                    let t = (g1 - thr) / (g1 - g0) * f64::from(x1 - x0);
                    push(
                        (f64::from(x1) - t.floor() - 1.0).max(f64::from(x0)) as u32,
                        x1,
                    );
                }
                (false, false) => {}
            }
        }
        if iv.is_empty() {
            // Only reachable through rounding; fall back to the feasible count.
            iv.push((lb_counts[j], lb_counts[j]));
        }
        cands.push(iv);
    }

    let mut counts = lb_counts;
    let open: Vec<usize> = (0..nj)
        .filter(|&j| cands[j].len() > 1 || cands[j][0].0 != cands[j][0].1)
        .collect();
    for j in 0..nj {
        if !open.contains_sorted(j) {
            counts[j] = cands[j][0].0;
        }
    }
    let mut stats = Stats {
        open_jobs: open.len(),
        upper_bound: ub,
        lower_bound: lb,
        ..Stats::default()
    };
    if open.is_empty() {
        return Some((counts, stats));
    }
    let fixed: u64 = (0..nj)
        .filter(|&j| !open.contains_sorted(j))
        .map(|j| u64::from(counts[j]))
        .sum();
    let lows: Vec<u32> = open.iter().map(|&j| cands[j][0].0).collect();
    let sum_low: u64 = lows.iter().map(|&x| u64::from(x)).sum();
    let span: u64 = open
        .iter()
        .map(|&j| u64::from(cands[j].last().unwrap().1 - cands[j][0].0))
        .sum();
    let room = u64::from(budget).saturating_sub(fixed + sum_low);
    let width = room.min(span) as usize;
    stats.dp_width = width;

    // DP over y = sum over open jobs of (n_j - low_j).
    let neg = f64::NEG_INFINITY;
    let mut dp = vec![neg; width + 1];
    let mut next = vec![neg; width + 1];
    dp[0] = 0.0;
    let mut reach = 0usize;
    let mut choice: Vec<Vec<u32>> = Vec::with_capacity(open.len());
    let mut cn: Vec<u32> = Vec::new();
    let mut cv: Vec<f64> = Vec::new();
    for (oi, &j) in open.iter().enumerate() {
        let f = &fns[j];
        cn.clear();
        cv.clear();
        for &(a, b) in &cands[j] {
            for n in a..=b {
                if f.allowed(n) && ((n - lows[oi]) as usize) <= width {
                    cn.push(n - lows[oi]);
                    cv.push(f.value(n));
                }
            }
        }
        stats.candidates += cn.len();
        let new_reach = (reach + *cn.last().unwrap_or(&0) as usize).min(width);
        let mut ch = vec![u32::MAX; new_reach + 1];
        for y in 0..=new_reach {
            let mut best = neg;
            let mut arg = u32::MAX;
            for (i, &d) in cn.iter().enumerate() {
                let d = d as usize;
                if d > y {
                    break;
                }
                if y - d > reach {
                    continue;
                }
                let v = dp[y - d] + cv[i];
                if v > best + tie {
                    best = v;
                    arg = d as u32;
                }
            }
            next[y] = best;
            ch[y] = arg;
        }
        reach = new_reach;
        std::mem::swap(&mut dp, &mut next);
        choice.push(ch);
    }
    let top = dp[..=reach].iter().copied().fold(neg, f64::max);
    let mut y = (0..=reach).find(|&y| dp[y] >= top - tie).unwrap_or(0);
    for (oi, &j) in open.iter().enumerate().rev() {
        let d = choice[oi][y];
        debug_assert!(d != u32::MAX, "DP backtrack through an unreachable state");
        counts[j] = lows[oi] + d;
        y -= d as usize;
    }
    stats.optimum = counts.iter().zip(fns).map(|(&n, f)| f.value(n)).sum();
    Some((counts, stats))
}

trait ContainsSorted {
    fn contains_sorted(&self, x: usize) -> bool;
}

impl ContainsSorted for Vec<usize> {
    fn contains_sorted(&self, x: usize) -> bool {
        self.binary_search(&x).is_ok()
    }
}
