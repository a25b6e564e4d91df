//! Instance validation and each job's value as a function of its node count, the one
//! form every objective is reduced to before the exact solver runs.

use super::{invalid, AllocError, BatchCurve, Curve, Instance, JobInput, Objective};
use std::collections::HashSet;

fn loc_job(j: usize, job: &JobInput) -> String {
    format!("jobs[{j}] (id {:?})", job.id)
}

// The location of an error is only formatted when there is one: `validate` runs before
// every decision (bftrainerd's, at 10,000 nodes, with a node list per job), and
// formatting a location per job, point and held node cost more than the checks.

fn check_curve(curve: &Curve, loc: &dyn Fn() -> String) -> Result<(), AllocError> {
    if curve.points.is_empty() {
        return Err(invalid(
            loc(),
            "curve is empty; give at least the point [1, value]",
        ));
    }
    let mut prev: Option<u32> = None;
    for (i, &(x, y)) in curve.points.iter().enumerate() {
        let at = || format!("{}[{i}]", loc());
        match prev {
            None if x != 1 => {
                return Err(invalid(
                    at(),
                    format!("curve must start at 1 node, starts at {x}"),
                ))
            }
            Some(p) if x <= p => {
                return Err(invalid(
                    at(),
                    format!("node counts must increase strictly; {x} follows {p}"),
                ))
            }
            _ => {}
        }
        if !y.is_finite() {
            return Err(invalid(at(), format!("value {y} is not a finite number")));
        }
        if y < 0.0 {
            return Err(invalid(
                at(),
                format!("value {y} is negative; values must be >= 0"),
            ));
        }
        prev = Some(x);
    }
    Ok(())
}

fn check_nonneg(v: f64, loc: impl FnOnce() -> String, what: &str) -> Result<(), AllocError> {
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(
            loc(),
            format!("{what} is {v}; must be a finite number >= 0"),
        ));
    }
    Ok(())
}

impl Instance {
    /// Check everything the solver relies on; the error says what and where.
    pub fn validate(&self, objective: Objective) -> Result<(), AllocError> {
        if !self.t_fwd_s.is_finite() || self.t_fwd_s <= 0.0 {
            return Err(invalid(
                "t_fwd_s",
                format!("is {}; must be a finite number > 0", self.t_fwd_s),
            ));
        }
        if !self.reclaim_in_s.is_empty() && self.reclaim_in_s.len() != self.n_nodes as usize {
            return Err(invalid(
                "reclaim_in_s",
                format!(
                    "has {} entries for {} nodes; give none or one per node",
                    self.reclaim_in_s.len(),
                    self.n_nodes
                ),
            ));
        }
        if !self.host_of.is_empty() && self.host_of.len() != self.n_nodes as usize {
            return Err(invalid(
                "host_of",
                format!(
                    "has {} entries for {} nodes; give none or one per node",
                    self.host_of.len(),
                    self.n_nodes
                ),
            ));
        }
        for (i, r) in self.reclaim_in_s.iter().enumerate() {
            if let Some(t) = *r {
                check_nonneg(t, || format!("nodes[{i}].reclaim_in_s"), "reclaim time")?;
            }
        }
        let mut ids = HashSet::new();
        let mut owner: Vec<u32> = vec![u32::MAX; self.n_nodes as usize];
        for (j, job) in self.jobs.iter().enumerate() {
            let loc = || loc_job(j, job);
            if job.id.is_empty() {
                return Err(invalid(format!("jobs[{j}].id"), "is empty"));
            }
            if !ids.insert(job.id.as_str()) {
                return Err(invalid(
                    format!("{}.id", loc()),
                    "the same id appears twice",
                ));
            }
            if job.min_nodes > job.max_nodes {
                return Err(invalid(
                    loc(),
                    format!(
                        "min_nodes {} > max_nodes {}; need min_nodes <= max_nodes",
                        job.min_nodes, job.max_nodes
                    ),
                ));
            }
            if job.max_nodes == 0 {
                return Err(invalid(
                    format!("{}.max_nodes", loc()),
                    "is 0; must be >= 1",
                ));
            }
            check_nonneg(
                job.scale_up_s,
                || format!("{}.scale_up_s", loc()),
                "scale_up_s",
            )?;
            check_nonneg(
                job.scale_down_s,
                || format!("{}.scale_down_s", loc()),
                "scale_down_s",
            )?;
            if job.batch_curves.is_empty() {
                check_curve(&job.curve, &|| format!("{}.curve", loc()))?;
                if let Some(b) = job.current_batch {
                    return Err(invalid(
                        format!("{}.current_batch", loc()),
                        format!("is {b} but the job has no batch_curves"),
                    ));
                }
            } else {
                if !job.curve.points.is_empty() {
                    return Err(invalid(
                        format!("{}.curve", loc()),
                        "give either curve or batch_curves, not both",
                    ));
                }
                let mut seen = HashSet::new();
                for (b, bc) in job.batch_curves.iter().enumerate() {
                    let bl = || format!("{}.batch_curves[{b}]", loc());
                    if bc.batch_size == 0 {
                        return Err(invalid(
                            format!("{}.batch_size", bl()),
                            "is 0; must be >= 1",
                        ));
                    }
                    if !seen.insert(bc.batch_size) {
                        return Err(invalid(
                            format!("{}.batch_size", bl()),
                            format!("batch size {} appears twice", bc.batch_size),
                        ));
                    }
                    check_curve(&bc.curve, &|| format!("{}.curve", bl()))?;
                }
                if let Some(b) = job.current_batch {
                    if !seen.contains(&b) {
                        return Err(invalid(
                            format!("{}.current_batch", loc()),
                            format!("batch size {b} is not one of the job's batch_curves"),
                        ));
                    }
                }
            }
            match job.remaining_work {
                Some(w) if !w.is_finite() || w <= 0.0 => {
                    return Err(invalid(
                        format!("{}.remaining_work", loc()),
                        format!("is {w}; must be a finite number > 0"),
                    ))
                }
                None if objective == Objective::RemainingWork => {
                    return Err(invalid(
                        format!("{}.remaining_work", loc()),
                        "is missing; objective remaining-work needs it on every job",
                    ))
                }
                _ => {}
            }
            for (k, &n) in job.current.iter().enumerate() {
                let at = || format!("{}.nodes[{k}]", loc());
                if n >= self.n_nodes {
                    return Err(invalid(
                        at(),
                        format!("node {n} is not one of the {} nodes", self.n_nodes),
                    ));
                }
                let o = &mut owner[n as usize];
                if *o == j as u32 {
                    return Err(invalid(at(), format!("node {n} is listed twice")));
                }
                if *o != u32::MAX {
                    return Err(invalid(
                        at(),
                        format!(
                            "node {n} is also held by jobs[{}] (id {:?})",
                            *o, self.jobs[*o as usize].id
                        ),
                    ));
                }
                *o = j as u32;
            }
        }
        Ok(())
    }
}

/// The job's objective per node count: one curve, or the best of its batch-size curves.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Obj<'a> {
    Single(&'a Curve),
    Batch(&'a [BatchCurve]),
}

impl Obj<'_> {
    pub(crate) fn of(job: &JobInput) -> Obj<'_> {
        if job.batch_curves.is_empty() {
            Obj::Single(&job.curve)
        } else {
            Obj::Batch(&job.batch_curves)
        }
    }

    pub(crate) fn eval(&self, n: u32) -> f64 {
        match self {
            Obj::Single(c) => c.eval(n),
            Obj::Batch(bs) => bs
                .iter()
                .map(|b| b.curve.eval(n))
                .fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// Batch size reaching `eval(n)`; ties go to the smallest batch size.
    pub(crate) fn best_batch(&self, n: u32) -> Option<u32> {
        match self {
            Obj::Single(_) => None,
            Obj::Batch(bs) => {
                let best = self.eval(n);
                bs.iter()
                    .filter(|b| b.curve.eval(n) == best)
                    .map(|b| b.batch_size)
                    .min()
            }
        }
    }

    /// Node counts in [lo, hi] between which `eval` is linear on the integers.
    fn breakpoints(&self, lo: u32, hi: u32, out: &mut Vec<u32>) {
        match self {
            Obj::Single(c) => {
                out.extend(c.points.iter().map(|p| p.0).filter(|&x| x > lo && x < hi));
            }
            Obj::Batch(bs) => {
                let start = out.len();
                for b in bs.iter() {
                    out.extend(
                        b.curve
                            .points
                            .iter()
                            .map(|p| p.0)
                            .filter(|&x| x > lo && x < hi),
                    );
                }
                out.push(lo);
                out.push(hi);
                let mut xs: Vec<u32> = out[start..].to_vec();
                xs.sort_unstable();
                xs.dedup();
                // Between two curve breakpoints every batch curve is a line; the best one
                // changes only where two lines cross, so add the integers around each crossing.
                for w in xs.windows(2) {
                    let (p, q) = (w[0], w[1]);
                    for (a, ba) in bs.iter().enumerate() {
                        for bb in &bs[a + 1..] {
                            let d0 = ba.curve.eval(p) - bb.curve.eval(p);
                            let d1 = ba.curve.eval(q) - bb.curve.eval(q);
                            if (d0 < 0.0) != (d1 < 0.0) && d0 != d1 {
                                let x = f64::from(p) + d0 / (d0 - d1) * f64::from(q - p);
                                let f = x.floor().max(f64::from(p)) as u32;
                                out.push(f);
                                out.push((f + 1).min(q));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One job's term of the objective as a function of its node count n:
/// `w * (tfwd * O(n) - [n > c] * up_pen - [n < c] * down_pen)` on the domain
/// `{0 if zero} ∪ [lo, hi]`.
#[derive(Debug, Clone)]
pub(crate) struct JobFn<'a> {
    pub lo: u32,
    pub hi: u32,
    pub zero: bool,
    pub c: u32,
    pub w: f64,
    pub tfwd: f64,
    pub up_pen: f64,
    pub down_pen: f64,
    pub obj: Obj<'a>,
    /// When set, only counts inside these sorted disjoint ranges (within [lo, hi]) are
    /// allowed besides 0 (fairness on curves that are not monotone).
    pub ranges: Option<Vec<(u32, u32)>>,
    /// Reclaim-aware: `keep_loss[m]` is the loss of keeping the m least-lossy current
    /// nodes (prefix sums, length c + 1); empty otherwise.
    pub keep_loss: Vec<f64>,
    /// Sorted distinct node counts in [lo, hi], lo and hi included, between which the
    /// value is linear on the integers.
    pub bps: Vec<u32>,
}

impl<'a> JobFn<'a> {
    /// The BFTrainer term of `job` with weight `w`, node counts capped at `budget`.
    pub(crate) fn new(job: &'a JobInput, tfwd: f64, budget: u32, w: f64) -> Self {
        let obj = Obj::of(job);
        let c = job.current.len() as u32;
        let rate = current_rate(job);
        let lo = job.min_nodes.max(1);
        let hi = job.max_nodes.min(budget);
        let mut f = JobFn {
            lo,
            hi,
            zero: true,
            c,
            w,
            tfwd,
            up_pen: job.scale_up_s * rate,
            down_pen: job.scale_down_s * rate,
            obj,
            ranges: None,
            keep_loss: Vec::new(),
            bps: Vec::new(),
        };
        f.rebuild_bps();
        f
    }

    /// Restrict the domain to the counts with O(n) >= target (fairness); 0 stays
    /// allowed only when the target is 0.
    pub(crate) fn restrict_level(&mut self, target: f64) {
        if target <= 0.0 {
            return;
        }
        self.zero = false;
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        let b = self.bps.clone();
        let mut add = |a: u32, z: u32| match ranges.last_mut() {
            Some(last) if last.1 + 1 >= a => last.1 = last.1.max(z),
            _ => ranges.push((a, z)),
        };
        let ok = |n: u32| self.obj.eval(n) >= target;
        if b.len() == 1 && ok(b[0]) {
            add(b[0], b[0]);
        }
        for w in b.windows(2) {
            let (x0, x1) = (w[0], w[1]);
            // O is linear on [x0, x1]: the counts reaching the target form one range.
            match (ok(x0), ok(x1)) {
                (true, true) => add(x0, x1),
                (true, false) => {
                    let mut e = x0;
                    while e < x1 && ok(e + 1) {
                        e += 1;
                    }
                    add(x0, e);
                }
                (false, true) => {
                    let mut s = x1;
                    while s > x0 && ok(s - 1) {
                        s -= 1;
                    }
                    add(s, x1);
                }
                (false, false) => {}
            }
        }
        if let (Some(first), Some(last)) = (ranges.first(), ranges.last()) {
            self.lo = first.0;
            self.hi = last.1;
        } else {
            self.lo = 1;
            self.hi = 0;
        }
        self.ranges = Some(ranges);
        self.rebuild_bps();
    }

    /// Restrict the domain to the counts in [a, b] (a search branch).
    pub(crate) fn restrict(&mut self, a: u32, b: u32) {
        self.zero &= a == 0;
        self.lo = self.lo.max(a.max(1));
        self.hi = self.hi.min(b);
        self.rebuild_bps();
    }

    /// Subtract the loss of the current nodes the job keeps (reclaim-aware); `losses`
    /// are the per-node losses of its current nodes.
    pub(crate) fn set_keep_loss(&mut self, mut losses: Vec<f64>) {
        if losses.iter().all(|&l| l == 0.0) {
            return;
        }
        losses.sort_by(f64::total_cmp);
        let mut acc = vec![0.0];
        for l in losses {
            acc.push(acc[acc.len() - 1] + l);
        }
        self.keep_loss = acc;
        self.rebuild_bps();
    }

    /// The breakpoints in (a, b]: where the linear stretches inside [a, b] end.
    pub fn bps_in(&self, a: u32, b: u32) -> &[u32] {
        let from = self.bps.partition_point(|&x| x <= a);
        let to = self.bps.partition_point(|&x| x <= b);
        &self.bps[from..to.max(from)]
    }

    fn rebuild_bps(&mut self) {
        let mut b = Vec::new();
        if self.lo <= self.hi {
            b.push(self.lo);
            b.push(self.hi);
            for x in [self.c.wrapping_sub(1), self.c, self.c + 1] {
                if x > self.lo && x < self.hi {
                    b.push(x);
                }
            }
            self.obj.breakpoints(self.lo, self.hi, &mut b);
            // The kept-node loss changes slope wherever the sorted per-node loss does.
            let k = &self.keep_loss;
            for m in 1..k.len().saturating_sub(1) {
                if k[m + 1] - k[m] != k[m] - k[m - 1] {
                    b.push(m as u32);
                }
            }
            if let Some(r) = &self.ranges {
                b.extend(r.iter().flat_map(|&(a, z)| [a, z]));
            }
            b.retain(|&x| x >= self.lo && x <= self.hi && self.range_of(x).is_some());
            b.sort_unstable();
            b.dedup();
        }
        self.bps = b;
    }

    pub(crate) fn allowed(&self, n: u32) -> bool {
        (n == 0 && self.zero) || (n >= self.lo && n <= self.hi && self.range_of(n).is_some())
    }

    /// Index of the allowed range holding n (0 when unrestricted).
    pub(crate) fn range_of(&self, n: u32) -> Option<usize> {
        match &self.ranges {
            None => Some(0),
            Some(r) => {
                let i = r.partition_point(|&(_, z)| z < n);
                (i < r.len() && r[i].0 <= n).then_some(i)
            }
        }
    }

    /// The term's value; the one formula every part of the solver and its checks use.
    pub(crate) fn value(&self, n: u32) -> f64 {
        let cost = if n > self.c {
            self.up_pen
        } else if n < self.c {
            self.down_pen
        } else {
            0.0
        };
        let kept = match self.keep_loss.len() {
            0 => 0.0,
            len => self.keep_loss[(n as usize).min(len - 1)],
        };
        self.w * (self.tfwd * self.obj.eval(n) - cost) - kept
    }
}

/// r_j: the objective rate at the current node count (on the current batch size's curve
/// when given), 0 below min_nodes.
pub(crate) fn current_rate(job: &JobInput) -> f64 {
    let c = job.current.len() as u32;
    if c == 0 || c < job.min_nodes {
        return 0.0;
    }
    match job.current_batch {
        Some(b) => job
            .batch_curves
            .iter()
            .find(|bc| bc.batch_size == b)
            .map_or(0.0, |bc| bc.curve.eval(c)),
        None => Obj::of(job).eval(c),
    }
}
