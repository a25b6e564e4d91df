//! Exact maximisation of a sum of per-job terms f_j(n_j) under sum n_j <= budget:
//! Lagrangian bound from the concave envelopes, splits of the one job whose envelope
//! bridges a dip (a rescale-cost jump, a kink) so that the bound tightens, reduced-cost
//! fixing, and a DP over node counts on the jobs still open. Nodes of one kind are interchangeable, so counts
//! are all that matters here.

use super::model::JobFn;

/// How much work the exact search did, for benchmarks and docs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Most jobs left open after reduced-cost fixing in any DP pass.
    pub open_jobs: usize,
    /// Widest DP over node counts that ran.
    pub dp_width: usize,
    /// Linear pieces of candidate counts the DP swept (one sliding window each).
    pub pieces: usize,
    /// Lagrangian upper bound and the best feasible value before any DP (root).
    pub upper_bound: f64,
    pub lower_bound: f64,
    /// Value of the returned counts.
    pub optimum: f64,
    /// Nodes of the search over split domains (1: the root was solved as a leaf).
    pub nodes: usize,
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
/// allowed counts do not fit. Ties (values within 1e-12 of the value scale): fewest nodes
/// in total, then reverse-lexicographically smallest (the last job with the fewest nodes
/// first).
pub(crate) fn solve_counts(
    fns: &[JobFn<'_>],
    budget: u32,
    split_min_work: f64,
) -> Option<(Vec<u32>, Stats)> {
    let mut st = Search {
        budget,
        split_min_work,
        best: None,
        stats: Stats::default(),
        tie: 0.0,
        tol: 0.0,
    };
    st.run(fns);
    let (v, counts) = st.best?;
    st.stats.optimum = v;
    Some((counts, st.stats))
}

struct Search {
    budget: u32,
    /// See [`SPLIT_MIN_WORK`].
    split_min_work: f64,
    best: Option<(f64, Vec<u32>)>,
    stats: Stats,
    /// Values closer than this are ties (rounding noise), broken by the documented rule.
    tie: f64,
    /// Slack on every pruning test, so rounding never removes an optimum.
    tol: f64,
}

fn tie_better(a: &[u32], b: &[u32]) -> bool {
    let (sa, sb): (u64, u64) = (
        a.iter().map(|&x| u64::from(x)).sum(),
        b.iter().map(|&x| u64::from(x)).sum(),
    );
    if sa != sb {
        return sa < sb;
    }
    a.iter().rev().lt(b.iter().rev())
}

impl Search {
    fn offer(&mut self, fns: &[JobFn<'_>], counts: Vec<u32>) {
        let used: u64 = counts.iter().map(|&n| u64::from(n)).sum();
        if used > u64::from(self.budget) || counts.iter().zip(fns).any(|(&n, f)| !f.allowed(n)) {
            return; // a heuristic start that does not fit
        }
        let v: f64 = counts.iter().zip(fns).map(|(&n, f)| f.value(n)).sum();
        let better = match &self.best {
            None => true,
            Some((bv, bc)) => v > bv + self.tie || (v >= bv - self.tie && tie_better(&counts, bc)),
        };
        if better {
            self.best = Some((v, counts));
        }
    }

    fn run(&mut self, fns: &[JobFn<'_>]) {
        let Some(lp) = Lp::new(fns, self.budget) else {
            return;
        };
        let scale =
            lp.lambda * f64::from(self.budget) + lp.lj.iter().map(|v| v.abs()).sum::<f64>() + 1.0;
        self.tol = 1e-9 * scale;
        self.tie = 1e-12 * scale;
        self.stats.upper_bound = lp.ub;
        // "Everyone keeps its size, free nodes to the best value per node", blind to the
        // envelope: with rescale costs of ~1-2 Tfwd this is often the optimum, and a
        // strong incumbent is what makes pruning bite.
        let keep = keep_start(fns, self.budget);
        self.offer(fns, keep);
        // The root's LP roundings; split() offers its children's before it recurses.
        for start in lp.rounded_starts(fns, self.budget) {
            self.offer(fns, start);
        }
        self.stats.lower_bound = self.incumbent();
        self.node(fns, &lp, 0);
    }

    /// One node of the search over restricted domains (its rounded LP solutions were
    /// offered already): prune by its bound, then either split the job whose envelope
    /// bridge makes the bound loose (branch) or fix by reduced cost and run the DP (leaf).
    fn node(&mut self, fns: &[JobFn<'_>], lp: &Lp, depth: usize) {
        self.stats.nodes += 1;
        if lp.ub < self.incumbent() - self.tol {
            return;
        }
        if self.split(fns, lp, depth) {
            return;
        }
        // Leaf. Reduced-cost fixing: a count n of job j can be in a solution at least as
        // good as the incumbent V only if L_j - (f_j(n) - lambda n) <= UB - V. When that
        // gap is wide, first solve with a fraction g of it: the result is a better
        // incumbent, and optimal as soon as UB - V <= g (every solution within the
        // tolerance of V then lies inside the restricted sets). Otherwise widen g and
        // repeat.
        let inc = self.incumbent();
        let full = (lp.ub - inc).max(0.0) + self.tol;
        let mut g = if fns.len() > 32 {
            full / 64.0 + self.tol
        } else {
            full
        };
        let mut before = inc;
        loop {
            self.fixed_dp(fns, lp, g);
            let inc = self.incumbent();
            let need = (lp.ub - inc).max(0.0) + self.tol;
            if need <= g {
                return;
            }
            // No better incumbent: the bound is what is loose, go to the full gap.
            g = if inc > before + self.tie {
                (g * 8.0).min(need)
            } else {
                need
            };
            before = inc;
        }
    }

    /// Split the node at its critical bridge and search the parts, when the DP over
    /// the node would be costly, the bridge dips below the envelope by more than the gap
    /// between bound and incumbent, and the best part's bound closes at least half of
    /// that gap (after the parts' LP roundings have improved the incumbent): then the
    /// bridge, not the incumbent, was what kept the bound loose. `false`: not split, the
    /// caller goes on. With `split_min_work = 0` (the tests' setting) every loose bridge
    /// is split.
    fn split(&mut self, fns: &[JobFn<'_>], lp: &Lp, depth: usize) -> bool {
        if depth >= MAX_DEPTH || self.stats.nodes >= MAX_NODES {
            return false;
        }
        let forced = self.split_min_work <= 0.0;
        let gap = (lp.ub - self.incumbent()).max(0.0) + self.tol;
        // The bridge looks at one job, the DP's cost at all of them: cheap test first.
        let min_dip = if forced { gap / 4.0 } else { gap };
        let Some((j, parts)) = lp.bridge(fns, min_dip) else {
            return false;
        };
        let costly = Cands::new(fns, lp, gap, self.budget)
            .is_some_and(|c| c.dp_work(fns) > self.split_min_work);
        if !costly {
            return false;
        }
        let mut children: Vec<(Vec<JobFn<'_>>, Lp)> = parts
            .into_iter()
            .filter_map(|(a, b)| {
                let mut child = fns.to_vec();
                child[j].restrict(a, b);
                let clp = Lp::new(&child, self.budget)?;
                Some((child, clp))
            })
            .collect();
        for (child, clp) in &children {
            for start in clp.rounded_starts(child, self.budget) {
                self.offer(child, start);
            }
        }
        // Most promising first: its optimum prunes the others.
        children.sort_by(|a, b| b.1.ub.total_cmp(&a.1.ub));
        let top = children.first().map_or(f64::NEG_INFINITY, |c| c.1.ub);
        let gap = (lp.ub - self.incumbent()).max(0.0) + self.tol;
        if !forced && top > lp.ub - gap / 2.0 {
            return false;
        }
        for (child, clp) in &children {
            self.node(child, clp, depth + 1);
        }
        true
    }

    fn incumbent(&self) -> f64 {
        self.best.as_ref().map_or(f64::NEG_INFINITY, |b| b.0)
    }

    /// Candidate sets at gap `g`, then the DP over them.
    fn fixed_dp(&mut self, fns: &[JobFn<'_>], lp: &Lp, g: f64) {
        let Some(c) = Cands::new(fns, lp, g, self.budget) else {
            return;
        };
        self.stats.open_jobs = self.stats.open_jobs.max(c.open.len());
        self.dp(fns, &c, lp);
    }

    /// DP over y = sum over open jobs of (n_j - low_j). Each linear piece of a job's
    /// candidates is one sliding-window maximum (monotone deque), so a job costs
    /// O(width x pieces), not O(width x candidates); states that cannot reach the
    /// incumbent even with the Lagrangian bound on the jobs still to come are dropped.
    /// The backtrack re-evaluates every candidate with the exact term and applies the
    /// tie rule.
    fn dp(&mut self, fns: &[JobFn<'_>], c: &Cands, lp: &Lp) {
        let (cands, open, lows, fixed_val, width) =
            (&c.sets, &c.open, &c.lows, c.fixed_val, c.width);
        let (lambda, lj) = (lp.lambda, &lp.lj);
        self.stats.dp_width = self.stats.dp_width.max(width);
        let neg = f64::NEG_INFINITY;
        let tie = self.tie;
        let inc = self.incumbent();
        // rest[k]: bound on the open jobs k.. in offset terms (see prune below).
        let mut rest = vec![0.0; open.len() + 1];
        for k in (0..open.len()).rev() {
            let j = open[k];
            rest[k] = rest[k + 1] + lj[j] + lambda * f64::from(lows[k]);
        }
        // Per-state factors the loops below need for every state of every layer, made
        // once per DP: `at[y]` is y as f64, `slack[y]` the bound's lambda term for state
        // y. The same operations on the same values as computing them in place, so the
        // same results to the bit; converting an index to f64 in the inner loops was a
        // large part of their cost.
        let at: Vec<f64> = (0..=width).map(|y| y as f64).collect();
        let slack: Vec<f64> = (0..=width)
            .map(|y| lambda * (width - y.min(width)) as f64)
            .collect();
        let mut layers: Vec<Vec<f64>> = Vec::with_capacity(open.len() + 1);
        layers.push(vec![0.0]);
        // First state of the last layer that pruning left alive.
        let mut first_live = 0usize;
        let mut pieces: Vec<(usize, usize, f64, f64)> = Vec::new();
        // Scratch for the sliding-window maxima.
        let (mut pbuf, mut gbuf, mut hbuf): (Vec<f64>, Vec<f64>, Vec<f64>) =
            (Vec::new(), Vec::new(), Vec::new());
        for (k, &j) in open.iter().enumerate() {
            let f = &fns[j];
            let low = lows[k];
            pieces.clear();
            for &(a, b) in &cands[j] {
                if f.allowed(a) {
                    pieces.push(((a - low) as usize, (a - low) as usize, f.value(a), 0.0));
                }
                // Linear stretches between consecutive breakpoints inside [a, b].
                let mut x = a;
                for &bp in f.bps_in(a, b).iter().chain(std::iter::once(&b)) {
                    if bp > x && f.allowed(x) && f.allowed(bp) && f.range_of(x) == f.range_of(bp) {
                        let (vx, vb) = (f.value(x), f.value(bp));
                        let s = (vb - vx) / f64::from(bp - x);
                        // From x + 1: x itself is already a piece of its own or the end
                        // of the previous stretch.
                        pieces.push(((x + 1 - low) as usize, (bp - low) as usize, vx + s, s));
                    }
                    x = x.max(bp);
                }
            }
            pieces.retain(|p| p.0 <= width);
            let prev = &layers[k];
            let reach = prev.len() - 1;
            // Pruning leaves a dead prefix of states too; skip it.
            let first = first_live.min(reach);
            let max_d = pieces.iter().map(|p| p.1.min(width)).max().unwrap_or(0);
            let new_reach = (reach + max_d).min(width);
            let mut next = vec![neg; new_reach + 1];
            for &(da, db, va, s) in &pieces {
                let db = db.min(width);
                let w = db - da + 1;
                if w <= 8 {
                    // Short stretch: one shifted max-add per count, which vectorises.
                    for t in 0..w {
                        let d = da + t;
                        if d > new_reach {
                            break;
                        }
                        let val = va + s * t as f64;
                        let zmax = reach.min(new_reach - d);
                        if first > zmax {
                            continue;
                        }
                        for (nx, &pz) in next[d + first..=d + zmax]
                            .iter_mut()
                            .zip(&prev[first..=zmax])
                        {
                            // A select and an unconditional store (not a conditional
                            // store) so that the loop vectorises; same values.
                            let v = pz + val;
                            *nx = if v > *nx { v } else { *nx };
                        }
                    }
                    continue;
                }
                // next[da + e] = va + s e + max over z in [e - (w - 1), e] of prev[z] - s z:
                // a sliding-window maximum, by van Herk / Gil-Werman block prefix and
                // suffix maxima (three branch-free passes).
                let emax = new_reach - da;
                let plen = emax + w;
                pbuf.clear();
                pbuf.resize(plen, neg);
                let top = reach.min(emax);
                if first <= top {
                    for ((o, &p), &zf) in pbuf[first + w - 1..=top + w - 1]
                        .iter_mut()
                        .zip(&prev[first..=top])
                        .zip(&at[first..=top])
                    {
                        *o = p - s * zf;
                    }
                }
                // Every slot read below is written first, so the scratch only grows.
                if gbuf.len() < plen {
                    gbuf.resize(plen, neg);
                    hbuf.resize(plen, neg);
                }
                let lo = first.min(emax);
                // Block by block rather than testing `i % w` per element: the integer
                // division dominated this loop.
                let mut bs = lo - lo % w;
                while bs < plen {
                    let be = (bs + w).min(plen);
                    let mut m = neg;
                    for (g, &p) in gbuf[bs..be].iter_mut().zip(&pbuf[bs..be]) {
                        m = m.max(p);
                        *g = m;
                    }
                    let hs = bs.max(lo);
                    let mut m = neg;
                    for (h, &p) in hbuf[hs..be].iter_mut().zip(&pbuf[hs..be]).rev() {
                        m = m.max(p);
                        *h = m;
                    }
                    bs = be;
                }
                for (((nx, &h), &g), &ef) in next[da + lo..=da + emax]
                    .iter_mut()
                    .zip(&hbuf[lo..=emax])
                    .zip(&gbuf[lo + w - 1..=emax + w - 1])
                    .zip(&at[lo..=emax])
                {
                    let v = h.max(g) + va + s * ef;
                    *nx = if v > *nx { v } else { *nx };
                }
            }
            // Prune: even the bound on the remaining jobs cannot reach the incumbent.
            if inc > neg {
                let (r, cut) = (rest[k + 1], inc - self.tol);
                for (v, &sl) in next.iter_mut().zip(&slack) {
                    let bound = fixed_val + *v + r + sl;
                    *v = if bound < cut { neg } else { *v };
                }
            }
            first_live = next.iter().position(|&v| v > neg).unwrap_or(next.len() - 1);
            let last = next.iter().rposition(|&v| v > neg).unwrap_or(0);
            next.truncate(last + 1);
            self.stats.pieces += pieces.len();
            layers.push(next);
        }
        let fin = &layers[open.len()];
        let top = fin.iter().copied().fold(neg, f64::max);
        if top == neg {
            return;
        }
        let Some(mut y) = (0..fin.len()).find(|&y| fin[y] >= top - tie) else {
            return;
        };
        let mut counts: Vec<u32> = (0..fns.len()).map(|j| cands[j][0].0).collect();
        for k in (0..open.len()).rev() {
            let j = open[k];
            let f = &fns[j];
            let target = layers[k + 1][y];
            let prev = &layers[k];
            // Smallest candidate count that reaches this state's value (exact terms).
            let mut chosen = None;
            'search: for &(a, b) in &cands[j] {
                for n in a..=b {
                    let d = (n - lows[k]) as usize;
                    if d > y {
                        break 'search;
                    }
                    if y - d < prev.len()
                        && prev[y - d] > neg
                        && f.allowed(n)
                        && prev[y - d] + f.value(n) >= target - tie
                    {
                        chosen = Some(n);
                        break 'search;
                    }
                }
            }
            let Some(n) = chosen else {
                debug_assert!(false, "DP backtrack found no candidate");
                return;
            };
            counts[j] = n;
            y -= (n - lows[k]) as usize;
        }
        self.offer(fns, counts);
    }
}

/// Reduced-cost fixing at gap `g`: each job's candidate counts, the jobs left open and
/// the DP's width.
struct Cands {
    sets: Vec<Vec<(u32, u32)>>,
    open: Vec<usize>,
    lows: Vec<u32>,
    fixed_val: f64,
    width: usize,
}

impl Cands {
    /// `None` when some job has no candidate or the fixed counts do not fit.
    fn new(fns: &[JobFn<'_>], lp: &Lp, g: f64, budget: u32) -> Option<Cands> {
        let nj = fns.len();
        let mut sets: Vec<Vec<(u32, u32)>> = Vec::with_capacity(nj);
        for (j, f) in fns.iter().enumerate() {
            let iv = candidates(f, &lp.vals[j], lp.lambda, lp.lj[j] - g);
            if iv.is_empty() {
                return None;
            }
            sets.push(iv);
        }
        let open: Vec<usize> = (0..nj)
            .filter(|&j| sets[j].len() > 1 || sets[j][0].0 != sets[j][0].1)
            .collect();
        let fixed: u64 = (0..nj)
            .filter(|j| open.binary_search(j).is_err())
            .map(|j| u64::from(sets[j][0].0))
            .sum();
        let lows: Vec<u32> = open.iter().map(|&j| sets[j][0].0).collect();
        let sum_low: u64 = lows.iter().map(|&x| u64::from(x)).sum();
        if fixed + sum_low > u64::from(budget) {
            return None;
        }
        let span: u64 = open
            .iter()
            .map(|&j| u64::from(sets[j].last().unwrap().1 - sets[j][0].0))
            .sum();
        let width = (u64::from(budget) - fixed - sum_low).min(span) as usize;
        let fixed_val: f64 = (0..nj)
            .filter(|j| open.binary_search(j).is_err())
            .map(|j| fns[j].value(sets[j][0].0))
            .sum();
        Some(Cands {
            sets,
            open,
            lows,
            fixed_val,
            width,
        })
    }

    /// Work of the DP over these sets, in (state x linear stretch) steps.
    fn dp_work(&self, fns: &[JobFn<'_>]) -> f64 {
        let stretches: usize = self
            .open
            .iter()
            .map(|&j| {
                self.sets[j]
                    .iter()
                    .map(|&(a, b)| 1 + fns[j].bps_in(a, b).len())
                    .sum::<usize>()
            })
            .sum();
        stretches as f64 * self.width as f64
    }
}

/// Deepest chain of domain splits, and most nodes in all; past them a node is solved
/// as a leaf (still exactly: a leaf's DP covers its whole domain).
const MAX_DEPTH: usize = 24;
const MAX_NODES: usize = 256;
/// A node whose DP over the full gap would take fewer steps (open jobs' linear
/// stretches x width) than this is a leaf: a split costs about as much (an LP over
/// every job's envelope per part).
pub(crate) const SPLIT_MIN_WORK: f64 = 1e6;

/// The LP relaxation over the jobs' concave envelopes (hulls), solved greedily, and the
/// Lagrangian bound it gives.
struct Lp {
    vals: Vec<Vec<f64>>,
    hulls: Vec<Vec<(u32, f64)>>,
    /// Hull segments with positive slope, by decreasing slope: (slope, job, index).
    segs: Vec<(f64, u32, u32)>,
    /// Hull vertex each job reached before the critical segment.
    pos: Vec<usize>,
    /// Nodes left for the critical segment.
    left: u64,
    crit: Option<usize>,
    lambda: f64,
    /// L_j = max_n f_j(n) - lambda n.
    lj: Vec<f64>,
    ub: f64,
}

impl Lp {
    /// `None` when some job has no allowed count or the smallest ones do not fit.
    fn new(fns: &[JobFn<'_>], budget: u32) -> Option<Lp> {
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
        let lj: Vec<f64> = hulls
            .iter()
            .map(|h| {
                h.iter()
                    .map(|&(x, y)| y - lambda * f64::from(x))
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect();
        let ub = lambda * f64::from(budget) + lj.iter().sum::<f64>();
        Some(Lp {
            vals,
            hulls,
            segs,
            pos,
            left,
            crit,
            lambda,
            lj,
            ub,
        })
    }

    /// Feasible counts from the LP solution. (1) The greedy's vertices, then the
    /// remaining nodes poured into the following segments in slope order, each job as
    /// far as its true value (not the envelope) still rises; many jobs share a model,
    /// hence a slope, so this often reaches the bound at once. (2) The knapsack
    /// "critical item" rounding: take the critical segment whole and make room by
    /// undoing the flattest segments taken before it.
    fn rounded_starts(&self, fns: &[JobFn<'_>], budget: u32) -> Vec<Vec<u32>> {
        let (hulls, segs, pos) = (&self.hulls, &self.segs, &self.pos);
        let nj = fns.len();
        let start = self.crit.unwrap_or(segs.len());
        let mut lb_counts: Vec<u32> = (0..nj).map(|j| hulls[j][pos[j]].0).collect();
        pour(
            fns,
            hulls,
            &segs[start..],
            &mut pos.clone(),
            &mut lb_counts,
            self.left,
        );
        let mut out = vec![lb_counts];
        if let Some(ci) = self.crit {
            let (_, cj, ck) = segs[ci];
            let (cj, ck) = (cj as usize, ck as usize);
            let len = u64::from(hulls[cj][ck + 1].0 - hulls[cj][ck].0);
            let mut need = len - self.left;
            let mut p2 = pos.clone();
            for &(_, j, k) in segs[..ci].iter().rev() {
                if need == 0 {
                    break;
                }
                let (j, k) = (j as usize, k as usize);
                if j == cj {
                    continue;
                }
                let l = u64::from(hulls[j][k + 1].0 - hulls[j][k].0);
                p2[j] = k;
                // Surplus freed here is poured back below.
                need = need.saturating_sub(l);
            }
            if need == 0 {
                p2[cj] = ck + 1;
                let mut counts: Vec<u32> = (0..nj).map(|j| hulls[j][p2[j]].0).collect();
                let used: u64 = counts.iter().map(|&n| u64::from(n)).sum();
                if used <= u64::from(budget) {
                    let rest = u64::from(budget) - used;
                    pour(fns, hulls, &segs[ci + 1..], &mut p2, &mut counts, rest);
                    out.push(counts);
                }
            }
        }
        out
    }

    /// The critical segment, when it bridges counts whose true value lies below it by
    /// more than `min_loss` (a rescale-cost jump, the gap below a minimum, a convex kink
    /// in the curve): the job and its domain cut into the counts up to the deepest point
    /// of the dip and those above it. Neither part's envelope spans the dip any more
    /// (next to a jump at c the cut falls at c - 1 or c + 1; at a kink, on it), so the
    /// bound tightens.
    fn bridge(&self, fns: &[JobFn<'_>], min_loss: f64) -> Option<(usize, [(u32, u32); 2])> {
        let (_, j, k) = self.segs[self.crit?];
        let (j, k) = (j as usize, k as usize);
        let f = &fns[j];
        let ((x0, y0), (x1, y1)) = (self.hulls[j][k], self.hulls[j][k + 1]);
        if x1 <= x0 + 1 {
            return None;
        }
        let s = (y1 - y0) / f64::from(x1 - x0);
        // chord - f is linear between breakpoints and between the ends of disallowed
        // stretches, so its maximum is at one of these counts. Where a count is not
        // allowed, the job can at best stay at x0.
        let loss = |x: u32| {
            let chord = s * f64::from(x - x0);
            if f.allowed(x) {
                y0 + chord - f.value(x)
            } else {
                chord
            }
        };
        let (worst, at) = f
            .bps
            .iter()
            .filter(|&&b| b > x0 && b < x1)
            .flat_map(|&b| [b - 1, b, b + 1])
            .chain([x0 + 1, x1 - 1])
            .filter(|&x| x > x0 && x < x1)
            .map(|x| (loss(x), x))
            .fold((0.0, x0), |a, b| if b.0 > a.0 { b } else { a });
        (worst > min_loss).then_some((j, [(0, at), (at + 1, u32::MAX)]))
    }
}

/// Pour `left` nodes into `segs` in order: each job whose count sits at the segment's
/// start moves as far along it as its true value (not the envelope) still rises.
fn pour(
    fns: &[JobFn<'_>],
    hulls: &[Vec<(u32, f64)>],
    segs: &[(f64, u32, u32)],
    pos: &mut [usize],
    counts: &mut [u32],
    mut left: u64,
) {
    let mut partial = vec![false; fns.len()];
    for &(_, j, k) in segs {
        if left == 0 {
            break;
        }
        let (j, k) = (j as usize, k as usize);
        if partial[j] || pos[j] != k {
            continue;
        }
        let f = &fns[j];
        let from = counts[j];
        let end = hulls[j][k + 1].0;
        let to = u64::from(end).min(u64::from(from) + left) as u32;
        let mut best = (f.value(from), from);
        for n in f
            .bps
            .iter()
            .copied()
            .filter(|&n| n > from && n < to)
            .chain([to])
        {
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
        counts[j] = best.1;
    }
}

/// Everyone at its current size (clamped to its domain), then the remaining nodes in one
/// pass to the jobs with the best value gained per extra node.
fn keep_start(fns: &[JobFn<'_>], budget: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = fns
        .iter()
        .map(|f| {
            if f.allowed(f.c) {
                f.c
            } else if f.c > f.hi && f.allowed(f.hi) {
                f.hi
            } else if f.zero {
                0
            } else {
                f.lo
            }
        })
        .collect();
    let used: u64 = counts.iter().map(|&n| u64::from(n)).sum();
    let Some(mut left) = u64::from(budget).checked_sub(used) else {
        return counts;
    };
    let best_step = |f: &JobFn<'_>, n0: u32, left: u64| -> Option<(f64, u32)> {
        let v0 = f.value(n0);
        let cap = (u64::from(n0) + left).min(u64::from(f.hi)) as u32;
        let mut best: Option<(f64, u32)> = None;
        for n in f
            .bps
            .iter()
            .copied()
            .filter(|&n| n > n0 && n < cap)
            .chain([cap, f.lo.max(n0 + 1)])
        {
            if n > n0 && n <= cap && f.allowed(n) {
                let r = (f.value(n) - v0) / f64::from(n - n0);
                if r > 0.0 && best.map_or(true, |b| r > b.0) {
                    best = Some((r, n));
                }
            }
        }
        best
    };
    let mut order: Vec<(f64, usize)> = (0..fns.len())
        .filter_map(|j| best_step(&fns[j], counts[j], left).map(|(r, _)| (r, j)))
        .collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, j) in order {
        if left == 0 {
            break;
        }
        if let Some((_, n)) = best_step(&fns[j], counts[j], left) {
            left -= u64::from(n - counts[j]);
            counts[j] = n;
        }
    }
    counts
}

/// Counts of job f whose reduced value f(n) - lambda n reaches `thr`, as sorted disjoint
/// intervals (a superset: the DP evaluates each exactly).
fn candidates(f: &JobFn<'_>, vals: &[f64], lambda: f64, thr: f64) -> Vec<(u32, u32)> {
    let g = |n: u32, v: f64| v - lambda * f64::from(n);
    let mut iv: Vec<(u32, u32)> = Vec::new();
    let mut push = |a: u32, b: u32| match iv.last_mut() {
        Some(last) if last.1 + 1 >= a => last.1 = last.1.max(b),
        _ => iv.push((a, b)),
    };
    if f.zero && g(0, f.value(0)) >= thr {
        push(0, 0);
    }
    let b = &f.bps;
    if b.len() == 1 && g(b[0], vals[0]) >= thr {
        push(b[0], b[0]);
    }
    for i in 0..b.len().saturating_sub(1) {
        let (x0, x1) = (b[i], b[i + 1]);
        let (g0, g1) = (g(x0, vals[i]), g(x1, vals[i + 1]));
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
    iv
}
