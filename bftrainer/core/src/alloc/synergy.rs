//! CPUs and memory per job on one shared node, by measured sensitivity (Synergy, issue 34).
//!
//! The node decision ([`super::solve`]) chooses which GPU slots each elastic job holds;
//! this module then splits what regular jobs leave free on a shared node (Slurm's CPUs
//! less CPUAlloc, memory less AllocMem, the free GPUs of its GRES) between the elastic jobs
//! that hold GPU slots there. Synergy (Mohan et al., "Synergy: Resource Sensitive DNN
//! Scheduling in Multi-Tenant Clusters", arXiv 2110.06073) showed that giving CPUs and
//! memory by each job's measured sensitivity, instead of in proportion to its GPUs, cuts
//! mean JCT; its sensitivity comes from optimistic profiling. The per-node rule here is
//! our own (docs/design.md, "CPUs and memory on shared nodes"): each job's throughput is
//!
//! ```text
//! rate_j = g_j * f_j(c_j / g_j) * phi_j(m_j / g_j)
//! ```
//!
//! with `g_j` its GPUs on the node, `f_j` its rate per GPU over CPUs per GPU and `phi_j`
//! its memory curve over MiB per GPU divided by its last value (1 for a job with no memory
//! curve), both piecewise linear, nondecreasing and concave (through the origin). The rule
//! maximises the sum of the rates with every job at or above its own Slurm request
//! (tasks x `--cpus-per-task`, tasks x `--mem-per-cpu`/`--mem` per task) and the sums
//! within the node's free CPUs and memory; it hands out the whole free pool.
//!
//! - For one resource with the other fixed, the problem is a separable concave one; its
//!   continuous optimum is found exactly by filling the curves' linear pieces in order of
//!   slope (a fractional knapsack), with equal slopes filled to an equal level per GPU.
//! - CPUs and memory are optimised alternately from the GPU-proportional split (each step
//!   exact, so the value never falls), at most [`MAX_ROUNDS`] rounds.
//! - The continuous split is rounded to whole CPUs and MiB by largest remainder
//!   ([`round_shares`]), the same rounding as the GPU-proportional baseline
//!   ([`proportional`]); so equal sensitivities give exactly the GPU-proportional split.
//! - Optimality: [`NodeShares::upper_bound`] is a proven upper bound on any split's value
//!   (the continuous CPU optimum with memory ignored, or the memory optimum with every job
//!   at its best CPU rate, whichever is lower). With no memory curves it is the exact
//!   continuous optimum, and the rounded split is within one CPU's best marginal rate per
//!   job of the integer optimum (tests: `synergy_props`).

use super::{invalid, AllocError};
use serde::{Deserialize, Serialize};

/// Points a sensitivity curve may have.
pub const MAX_POINTS: usize = 64;
/// Alternating CPU/memory rounds at most (each is exact for one resource).
pub const MAX_ROUNDS: usize = 4;
/// Free memory a node may report at most (MiB); keeps the float arithmetic exact to the MiB.
pub const MAX_MEM_MIB: u64 = 1 << 40;
/// Probes a newly admitted job may be given at most ([`probe_plan`]).
pub const MAX_PROBES: u32 = 8;

/// A job's measured sensitivity. Curves are `(per GPU, rate per GPU)` points: x strictly
/// increasing and positive, rate finite, nondecreasing and concave, with the origin as an
/// implicit first point (0 resources, rate 0); constant past the last point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    /// Rate per GPU over CPUs per GPU. At least one point.
    pub cpu: Vec<(f64, f64)>,
    /// Rate over MiB of memory per GPU; only its shape counts (it is divided by its last
    /// value). Empty: the job's rate does not depend on memory.
    #[serde(default)]
    pub mem: Vec<(f64, f64)>,
}

/// What regular jobs leave free on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFree {
    pub cpus: u32,
    pub mem_mib: u64,
    pub gpus: u32,
}

/// One elastic job holding GPU slots on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareJob {
    /// Its GPUs on this node (chosen by the node decision).
    pub gpus: u32,
    /// Its tasks on this node.
    pub tasks: u32,
    /// Its own Slurm request per task: the floor, never gone under.
    pub cpus_per_task: u32,
    pub mem_mib_per_task: u64,
    pub sensitivity: Sensitivity,
}

/// One job's share of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub cpus: u32,
    pub mem_mib: u64,
}

/// The split of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeShares {
    /// One per job, in input order.
    pub shares: Vec<Share>,
    /// Sum of the jobs' rates at `shares`.
    pub value: f64,
    /// No split of this node has a larger value (module doc).
    pub upper_bound: f64,
}

// ---------------------------------------------------------------------------------------
// Curves

fn check_curve(points: &[(f64, f64)], loc: &dyn Fn() -> String) -> Result<(), AllocError> {
    if points.len() > MAX_POINTS {
        return Err(invalid(
            loc(),
            format!("has {} points; at most {MAX_POINTS} allowed", points.len()),
        ));
    }
    let mut prev = (0.0_f64, 0.0_f64);
    let mut prev_slope = f64::INFINITY;
    for (i, &(x, y)) in points.iter().enumerate() {
        let at = || format!("{}[{i}]", loc());
        if !x.is_finite() || x <= 0.0 {
            return Err(invalid(
                at(),
                format!("x {x} is not allowed; x must be a finite number above 0"),
            ));
        }
        if !y.is_finite() || y < 0.0 {
            return Err(invalid(
                at(),
                format!("rate {y} is not allowed; rates must be finite and >= 0"),
            ));
        }
        if x <= prev.0 {
            return Err(invalid(
                at(),
                format!("x must increase strictly; {x} follows {}", prev.0),
            ));
        }
        if y < prev.1 {
            return Err(invalid(
                at(),
                format!(
                    "rate {y} falls below {}; a curve must be nondecreasing (fit measurements \
                     with synergy::fit)",
                    prev.1
                ),
            ));
        }
        let slope = (y - prev.1) / (x - prev.0);
        if !slope.is_finite() {
            return Err(invalid(
                at(),
                format!(
                    "slope from the point before is {slope}; points this close must have \
                     rates closer (a finite slope)"
                ),
            ));
        }
        if slope > prev_slope * (1.0 + 1e-9) + 1e-12 {
            return Err(invalid(
                at(),
                format!(
                    "curve is not concave: slope {slope} after {prev_slope} (the origin is its \
                     first point); fit measurements with synergy::fit, which returns a concave \
                     curve"
                ),
            ));
        }
        prev = (x, y);
        prev_slope = slope;
    }
    Ok(())
}

/// Rate per GPU at `x` per GPU on a validated curve: linear from the origin to the first
/// point, constant past the last.
pub fn eval(points: &[(f64, f64)], x: f64) -> f64 {
    if x <= 0.0 || points.is_empty() {
        return 0.0;
    }
    let i = points.partition_point(|&(px, _)| px <= x);
    if i == points.len() {
        return points[i - 1].1;
    }
    let (x0, y0) = if i == 0 { (0.0, 0.0) } else { points[i - 1] };
    let (x1, y1) = points[i];
    y0 + (y1 - y0) * (x - x0) / (x1 - x0)
}

/// `phi`: the memory curve divided by its last value; 1 for a job without one.
fn phi(mem: &[(f64, f64)], y: f64) -> f64 {
    match mem.last() {
        None => 1.0,
        Some(&(_, top)) => eval(mem, y) / top,
    }
}

/// A job's total rate on the node with `cpus` and `mem_mib` (the objective's term).
pub fn rate(s: &Sensitivity, gpus: u32, cpus: f64, mem_mib: f64) -> f64 {
    let g = f64::from(gpus);
    g * eval(&s.cpu, cpus / g) * phi(&s.mem, mem_mib / g)
}

// ---------------------------------------------------------------------------------------
// Validation

struct Floors {
    cpus: Vec<u64>,
    mem: Vec<u64>,
}

fn validate(node: &NodeFree, jobs: &[ShareJob]) -> Result<Floors, AllocError> {
    let mut gpus = 0u64;
    let mut floors = Floors {
        cpus: Vec::with_capacity(jobs.len()),
        mem: Vec::with_capacity(jobs.len()),
    };
    for (j, job) in jobs.iter().enumerate() {
        let loc = |f: &str| format!("jobs[{j}].{f}");
        if job.gpus == 0 {
            return Err(invalid(
                loc("gpus"),
                "is 0; a job shares a node only where it holds at least 1 GPU",
            ));
        }
        if job.tasks == 0 {
            return Err(invalid(loc("tasks"), "is 0; at least 1 task per node"));
        }
        gpus += u64::from(job.gpus);
        let s = &job.sensitivity;
        if s.cpu.is_empty() {
            return Err(invalid(
                loc("sensitivity.cpu"),
                "is empty; give at least one (cpus per GPU, rate per GPU) point",
            ));
        }
        check_curve(&s.cpu, &|| loc("sensitivity.cpu"))?;
        check_curve(&s.mem, &|| loc("sensitivity.mem"))?;
        if let Some(&(_, top)) = s.mem.last() {
            if top <= 0.0 {
                return Err(invalid(
                    loc("sensitivity.mem"),
                    "never rises above rate 0; a memory curve must end at a positive rate \
                     (or be empty for a job insensitive to memory)",
                ));
            }
        }
        floors
            .cpus
            .push(u64::from(job.tasks) * u64::from(job.cpus_per_task));
        floors.mem.push(
            u64::from(job.tasks)
                .checked_mul(job.mem_mib_per_task)
                .ok_or_else(|| invalid(loc("mem_mib_per_task"), "overflows with tasks"))?,
        );
    }
    if node.mem_mib > MAX_MEM_MIB {
        return Err(invalid(
            "node.mem_mib",
            format!(
                "{} is not allowed; at most {MAX_MEM_MIB} (2^40 MiB)",
                node.mem_mib
            ),
        ));
    }
    if gpus > u64::from(node.gpus) {
        return Err(invalid(
            "jobs",
            format!(
                "hold {gpus} GPUs on the node; only {} are free there",
                node.gpus
            ),
        ));
    }
    // Sums in u128: each floor fits u64, their sum need not.
    let need_c: u128 = floors.cpus.iter().map(|&c| u128::from(c)).sum();
    if need_c > u128::from(node.cpus) {
        return Err(invalid(
            "jobs",
            format!(
                "request {need_c} CPUs in all (tasks x cpus_per_task) on a node with {} free; \
                 the requests must fit what regular jobs leave",
                node.cpus
            ),
        ));
    }
    let need_m: u128 = floors.mem.iter().map(|&m| u128::from(m)).sum();
    if need_m > u128::from(node.mem_mib) {
        return Err(invalid(
            "jobs",
            format!(
                "request {need_m} MiB in all (tasks x mem_mib_per_task) on a node with {} MiB \
                 free; the requests must fit what regular jobs leave",
                node.mem_mib
            ),
        ));
    }
    Ok(floors)
}

// ---------------------------------------------------------------------------------------
// One resource: the exact continuous fill

/// A linear piece of one job's curve above its current level: per-GPU levels `lo..hi`,
/// value `slope` per unit of the resource (already times the job's weight).
#[derive(Clone, Copy)]
struct Piece {
    slope: f64,
    job: usize,
    lo: f64,
    hi: f64,
}

/// Water level `lam` (per GPU) at which `sum_j g_j clamp(lam, lo_j, hi_j)` over `cand`
/// plus the others' amounts `a` uses exactly `cap`; sets the candidates' amounts.
///
/// `lam` is computed by one canonical expression, `(cap - sum of the amounts of jobs not at
/// the level, in index order) / (sum of the GPUs of jobs at the level, in index order)`, so
/// two calls that reach the same set of jobs at the level get bit-identical amounts: what
/// makes equal sensitivities round exactly like the GPU-proportional split.
fn water_fill(cap: f64, g: &[f64], a: &mut [f64], cand: &[(usize, f64, f64)]) {
    // Breakpoints of the piecewise-linear use(lam); find the segment where it crosses cap.
    let mut bps: Vec<f64> = Vec::with_capacity(cand.len() * 2);
    for &(_, lo, hi) in cand {
        bps.push(lo);
        if hi.is_finite() {
            bps.push(hi);
        }
    }
    bps.sort_by(f64::total_cmp);
    let others: f64 = (0..a.len())
        .filter(|j| !cand.iter().any(|c| c.0 == *j))
        .map(|j| a[j])
        .sum();
    let used = |lam: f64| -> f64 {
        others
            + cand
                .iter()
                .map(|&(j, lo, hi)| g[j] * lam.clamp(lo, hi))
                .sum::<f64>()
    };
    // The largest breakpoint at which use <= cap; the level lies above it.
    let mut base = bps[0];
    for &b in &bps {
        if used(b) <= cap {
            base = b;
        } else {
            break;
        }
    }
    // At the level: candidates whose range extends above `base`.
    let at_level = |&(_, lo, hi): &(usize, f64, f64)| lo <= base && hi > base;
    let mut fixed_sum = 0.0;
    let mut g_sum = 0.0;
    for (j, aj) in a.iter_mut().enumerate() {
        match cand.iter().find(|c| c.0 == j) {
            Some(c) if at_level(c) => g_sum += g[j],
            Some(&(_, _, hi)) => {
                // Clamped at its top, or left where it is (below the level).
                if hi <= base {
                    *aj = g[j] * hi;
                }
                fixed_sum += *aj;
            }
            None => fixed_sum += *aj,
        }
    }
    if g_sum == 0.0 {
        return;
    }
    let mut lam = (cap - fixed_sum) / g_sum;
    // A level beyond a candidate's top can only come from rounding: clamp, never exceed cap.
    for c in cand.iter().filter(|c| at_level(c)) {
        lam = lam.min(c.2);
    }
    for c in cand.iter().filter(|c| at_level(c)) {
        a[c.0] = (g[c.0] * lam).max(g[c.0] * c.1);
    }
}

/// Maximise `sum_j w_j g_j f_j(a_j / g_j)` over `a_j >= floor_j`, `sum a_j = cap` (all of
/// it handed out), exactly, for concave `f_j`. Returns the amounts and the value.
fn fill(cap: f64, floor: &[f64], g: &[f64], curves: &[&[(f64, f64)]], w: &[f64]) -> Vec<f64> {
    let n = floor.len();
    let mut a = floor.to_vec();
    let mut pieces: Vec<Piece> = Vec::new();
    for j in 0..n {
        let level = floor[j] / g[j];
        let mut prev = (0.0, 0.0);
        let mut slope_cap = f64::INFINITY;
        for &(x, y) in curves[j] {
            // Validation allows 1e-9 of non-concavity; a running minimum keeps each job's
            // pieces in order.
            let s = ((y - prev.1) / (x - prev.0)).min(slope_cap);
            slope_cap = s;
            let lo = prev.0.max(level);
            if x > lo && s * w[j] > 0.0 {
                pieces.push(Piece {
                    slope: s * w[j],
                    job: j,
                    lo,
                    hi: x,
                });
            }
            prev = (x, y);
        }
    }
    // Steepest first; a job's own pieces in curve order.
    pieces.sort_by(|p, q| {
        q.slope
            .total_cmp(&p.slope)
            .then(p.job.cmp(&q.job))
            .then(p.lo.total_cmp(&q.lo))
    });
    let mut k = 0;
    let mut cand: Vec<(usize, f64, f64)> = Vec::new();
    while k < pieces.len() {
        let mut e = k;
        // Equal to 1e-9: weights computed per job (phi at each job's level) differ in
        // the last bits where the levels are equal.
        while e < pieces.len() && pieces[e].slope >= pieces[k].slope * (1.0 - 1e-9) {
            e += 1;
        }
        // One group of equal slope; a job's adjacent pieces in it merge.
        pieces[k..e].sort_by(|p, q| p.job.cmp(&q.job).then(p.lo.total_cmp(&q.lo)));
        cand.clear();
        for p in &pieces[k..e] {
            match cand.last_mut() {
                Some(c) if c.0 == p.job => c.2 = p.hi,
                _ => cand.push((p.job, a[p.job] / g[p.job], p.hi)),
            }
        }
        let need: f64 = cand.iter().map(|&(j, lo, hi)| g[j] * (hi - lo)).sum();
        let used: f64 = a.iter().sum();
        if used + need <= cap {
            for &(j, _, hi) in &cand {
                a[j] = g[j] * hi;
            }
        } else {
            water_fill(cap, g, &mut a, &cand);
            return a;
        }
        k = e;
    }
    // What no curve gains from is still handed out, equally per GPU.
    cand.clear();
    cand.extend((0..n).map(|j| (j, a[j] / g[j], f64::INFINITY)));
    water_fill(cap, g, &mut a, &cand);
    a
}

/// Continuous amounts to whole units (CPUs, MiB) summing to `cap`: each rounded down (never
/// below its floor), the units left over one each by largest fractional part (to 1e-6,
/// so float noise cannot reorder equal remainders), ties to the lower index.
pub fn round_shares(cap: u64, floor: &[u64], a: &[f64]) -> Vec<u64> {
    let mut out: Vec<u64> = a
        .iter()
        .zip(floor)
        .map(|(&x, &f)| ((x + 1e-9).floor().max(0.0) as u64).max(f))
        .collect();
    let key = |j: usize, o: &[u64]| -> i64 { ((a[j] - o[j] as f64) * 1e6).round() as i64 };
    let mut order: Vec<usize> = (0..a.len()).collect();
    order.sort_by(|&i, &j| key(j, &out).cmp(&key(i, &out)).then(i.cmp(&j)));
    let mut total: u64 = out.iter().sum();
    // Float noise leaves the sum a unit or two off either way; the deficit is handed out
    // in whole rounds plus one each for the first, so even a huge one (a curve so steep
    // that its weights overflow) costs O(jobs), never a loop per unit.
    if total < cap && !order.is_empty() {
        let n = order.len() as u64;
        let d = cap - total;
        for (k, &j) in order.iter().enumerate() {
            out[j] += d / n + u64::from((k as u64) < d % n);
        }
        total = cap;
    }
    // Taken back from the smallest remainders first; the floors sum to at most cap, so
    // a job above its floor is always found.
    let mut idx = 0;
    while total > cap {
        let j = order[order.len() - 1 - idx % order.len()];
        if out[j] > floor[j] {
            out[j] -= 1;
            total -= 1;
        }
        idx += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// The rule

fn value_of(jobs: &[ShareJob], shares: &[Share]) -> f64 {
    jobs.iter()
        .zip(shares)
        .map(|(j, s)| rate(&j.sensitivity, j.gpus, f64::from(s.cpus), s.mem_mib as f64))
        .sum()
}

fn finish(
    node: &NodeFree,
    jobs: &[ShareJob],
    fl: &Floors,
    c: &[f64],
    m: &[f64],
    upper_bound: f64,
) -> NodeShares {
    let cpus = round_shares(u64::from(node.cpus), &fl.cpus, c);
    let mem = round_shares(node.mem_mib, &fl.mem, m);
    let shares: Vec<Share> = cpus
        .iter()
        .zip(&mem)
        .map(|(&c, &m)| Share {
            cpus: c as u32,
            mem_mib: m,
        })
        .collect();
    let value = value_of(jobs, &shares);
    NodeShares {
        shares,
        value,
        upper_bound,
    }
}

/// The GPU-proportional split (the baseline): CPUs and memory in proportion to GPUs,
/// jobs whose request is above their share keep their request and the rest is split over
/// the others (an equal level per GPU), rounded by [`round_shares`].
/// `upper_bound` is the value itself (no claim of optimality).
pub fn proportional(node: &NodeFree, jobs: &[ShareJob]) -> Result<NodeShares, AllocError> {
    let fl = validate(node, jobs)?;
    if jobs.len() <= 1 {
        let mut out = alone(node, jobs);
        out.upper_bound = out.value;
        return Ok(out);
    }
    let g: Vec<f64> = jobs.iter().map(|j| f64::from(j.gpus)).collect();
    let c = level_split(f64::from(node.cpus), &fl.cpus, &g);
    let m = level_split(node.mem_mib as f64, &fl.mem, &g);
    let mut out = finish(node, jobs, &fl, &c, &m, 0.0);
    out.upper_bound = out.value;
    Ok(out)
}

fn level_split(cap: f64, floor: &[u64], g: &[f64]) -> Vec<f64> {
    let mut a: Vec<f64> = floor.iter().map(|&f| f as f64).collect();
    let cand: Vec<(usize, f64, f64)> = (0..a.len())
        .map(|j| (j, a[j] / g[j], f64::INFINITY))
        .collect();
    water_fill(cap, g, &mut a, &cand);
    a
}

/// No job, or one: it gets the whole free pool (rates never fall with more), which is
/// both the optimum and the proportional split. Half the shared nodes of a cluster hold
/// one elastic job; this skips the fills for them.
fn alone(node: &NodeFree, jobs: &[ShareJob]) -> NodeShares {
    let shares: Vec<Share> = jobs
        .iter()
        .map(|_| Share {
            cpus: node.cpus,
            mem_mib: node.mem_mib,
        })
        .collect();
    let value = value_of(jobs, &shares);
    NodeShares {
        shares,
        value,
        upper_bound: value,
    }
}

/// The sensitivity-aware split of one node (module doc). Errors name the bad input and
/// what is allowed; nothing panics on any input.
pub fn share_node(node: &NodeFree, jobs: &[ShareJob]) -> Result<NodeShares, AllocError> {
    let fl = validate(node, jobs)?;
    if jobs.len() <= 1 {
        return Ok(alone(node, jobs));
    }
    let n = jobs.len();
    let g: Vec<f64> = jobs.iter().map(|j| f64::from(j.gpus)).collect();
    let cap_c = f64::from(node.cpus);
    let cap_m = node.mem_mib as f64;
    let floor_c: Vec<f64> = fl.cpus.iter().map(|&f| f as f64).collect();
    let floor_m: Vec<f64> = fl.mem.iter().map(|&f| f as f64).collect();
    let cpu_curves: Vec<&[(f64, f64)]> = jobs.iter().map(|j| &j.sensitivity.cpu[..]).collect();
    let mem_curves: Vec<&[(f64, f64)]> = jobs.iter().map(|j| &j.sensitivity.mem[..]).collect();

    // Upper bound 1: phi <= 1, so no split beats the CPU optimum with memory ignored.
    let ones = vec![1.0; n];
    let c_free = fill(cap_c, &floor_c, &g, &cpu_curves, &ones);
    let ub_c: f64 = (0..n)
        .map(|j| g[j] * eval(cpu_curves[j], c_free[j] / g[j]))
        .sum();
    if mem_curves.iter().all(|m| m.is_empty()) {
        let m = level_split(cap_m, &fl.mem, &g);
        return Ok(finish(node, jobs, &fl, &c_free, &m, ub_c));
    }
    // Upper bound 2: f_j <= its last value, so no split beats the memory optimum with every
    // job at its best CPU rate.
    let best: Vec<f64> = cpu_curves.iter().map(|c| c[c.len() - 1].1).collect();
    // The fill weighs the memory curve as given; phi is that curve over its last value.
    let top: Vec<f64> = mem_curves
        .iter()
        .map(|m| m.last().map_or(1.0, |p| p.1))
        .collect();
    let per_top = |w: Vec<f64>| -> Vec<f64> { w.iter().zip(&top).map(|(w, t)| w / t).collect() };
    let m_best = fill(cap_m, &floor_m, &g, &mem_curves, &per_top(best.clone()));
    let ub_m: f64 = (0..n)
        .map(|j| g[j] * best[j] * phi(mem_curves[j], m_best[j] / g[j]))
        .sum();

    // Alternate from the proportional memory split. Each step is the exact optimum of one
    // resource given the other, so the value never falls; stop when a step gives back
    // what it was given (or after MAX_ROUNDS).
    let phis =
        |m: &[f64]| -> Vec<f64> { (0..n).map(|j| phi(mem_curves[j], m[j] / g[j])).collect() };
    let mut m = level_split(cap_m, &fl.mem, &g);
    let w = phis(&m);
    // Equal weights order the pieces as no weights do: the memory-blind split is the one.
    let mut c = if w.iter().all(|&x| x == w[0]) {
        c_free
    } else {
        fill(cap_c, &floor_c, &g, &cpu_curves, &w)
    };
    for _ in 0..MAX_ROUNDS {
        let w: Vec<f64> = (0..n).map(|j| eval(cpu_curves[j], c[j] / g[j])).collect();
        let m2 = fill(cap_m, &floor_m, &g, &mem_curves, &per_top(w));
        if m2 == m {
            break;
        }
        m = m2;
        let c2 = fill(cap_c, &floor_c, &g, &cpu_curves, &phis(&m));
        if c2 == c {
            break;
        }
        c = c2;
    }
    Ok(finish(node, jobs, &fl, &c, &m, ub_c.min(ub_m)))
}

// ---------------------------------------------------------------------------------------
// Sensitivity from measurements

/// One measurement of a job: its rate per GPU while its workers held `cpus_per_gpu` CPUs
/// and `mem_mib_per_gpu` MiB per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub cpus_per_gpu: f64,
    pub mem_mib_per_gpu: f64,
    pub rate: f64,
}

/// Points `(x, value, weight)` with distinct x, sorted: pool-adjacent-violators
/// (least squares, weighted) to a nondecreasing sequence.
fn isotonic(pts: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    // Blocks of (value, weight, count).
    let mut blocks: Vec<(f64, f64, usize)> = Vec::new();
    for &(_, y, w) in pts {
        blocks.push((y, w, 1));
        while blocks.len() > 1 {
            let (y1, w1, n1) = blocks[blocks.len() - 1];
            let (y0, w0, n0) = blocks[blocks.len() - 2];
            if y0 <= y1 {
                break;
            }
            blocks.pop();
            *blocks.last_mut().unwrap() = ((y0 * w0 + y1 * w1) / (w0 + w1), w0 + w1, n0 + n1);
        }
    }
    let mut out = Vec::with_capacity(pts.len());
    let mut i = 0;
    for (y, _, n) in blocks {
        for _ in 0..n {
            out.push((pts[i].0, y));
            i += 1;
        }
    }
    out
}

/// The least concave majorant through the origin (the upper hull of the origin and the
/// points), origin dropped: concave, above every point, through the extreme ones.
fn concave_majorant(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut hull: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    for &p in pts {
        while hull.len() >= 2 {
            let a = hull[hull.len() - 2];
            let b = hull[hull.len() - 1];
            // b on or under the line a-p: not a hull vertex.
            if (b.1 - a.1) * (p.0 - a.0) <= (p.1 - a.1) * (b.0 - a.0) {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull.remove(0);
    hull
}

/// Median of each distinct x (to 1e-6), sorted by x, weighted by the count.
fn medians(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut e = i;
        while e < v.len() && (v[e].0 - v[i].0).abs() <= 1e-6 * v[i].0.max(1.0) {
            e += 1;
        }
        let group = &v[i..e];
        let mut ys: Vec<f64> = group.iter().map(|p| p.1).collect();
        ys.sort_by(f64::total_cmp);
        let k = ys.len();
        let med = if k % 2 == 1 {
            ys[k / 2]
        } else {
            (ys[k / 2 - 1] + ys[k / 2]) / 2.0
        };
        out.push((v[i].0, med, k as f64));
        i = e;
    }
    out
}

/// Fit a job's [`Sensitivity`] to its measurements.
///
/// - CPU curve: from the measurements at the largest memory per GPU seen (within 1%),
///   where memory limits least (Synergy profiles CPUs with ample memory, "optimistic"),
///   the median rate at each CPU count, made nondecreasing (isotonic least squares) and
///   then concave (the least concave majorant through the origin).
/// - Memory curve: only when at least two memory levels were seen: each measurement's
///   rate over the CPU curve's value at its CPUs, median per memory level, made
///   nondecreasing and concave the same way. Otherwise empty: no evidence that memory
///   matters, so the rule splits memory by GPUs.
///
/// The majorant can lie above noisy middle points (never below any); the curve passes the
/// rule's validation by construction.
pub fn fit(obs: &[Observation]) -> Result<Sensitivity, AllocError> {
    if obs.is_empty() {
        return Err(invalid(
            "observations",
            "is empty; give at least one (cpus_per_gpu, mem_mib_per_gpu, rate) measurement",
        ));
    }
    for (i, o) in obs.iter().enumerate() {
        let at = format!("observations[{i}]");
        if !o.cpus_per_gpu.is_finite() || o.cpus_per_gpu <= 0.0 {
            return Err(invalid(
                at,
                format!(
                    "cpus_per_gpu {} is not allowed; a finite number above 0",
                    o.cpus_per_gpu
                ),
            ));
        }
        if !o.mem_mib_per_gpu.is_finite() || o.mem_mib_per_gpu <= 0.0 {
            return Err(invalid(
                at,
                format!(
                    "mem_mib_per_gpu {} is not allowed; a finite number above 0",
                    o.mem_mib_per_gpu
                ),
            ));
        }
        if !o.rate.is_finite() || o.rate < 0.0 {
            return Err(invalid(
                at,
                format!("rate {} is not allowed; finite and >= 0", o.rate),
            ));
        }
    }
    let top_mem = obs.iter().map(|o| o.mem_mib_per_gpu).fold(0.0, f64::max);
    let at_top: Vec<(f64, f64)> = obs
        .iter()
        .filter(|o| o.mem_mib_per_gpu >= top_mem * 0.99)
        .map(|o| (o.cpus_per_gpu, o.rate))
        .collect();
    let mut cpu = concave_majorant(&isotonic(&medians(at_top)));
    cpu.truncate(MAX_POINTS);
    let mem_levels = medians(obs.iter().map(|o| (o.mem_mib_per_gpu, 0.0)).collect());
    let mut mem = Vec::new();
    if mem_levels.len() >= 2 {
        let ratios: Vec<(f64, f64)> = obs
            .iter()
            .filter_map(|o| {
                let f = eval(&cpu, o.cpus_per_gpu);
                (f > 0.0).then(|| (o.mem_mib_per_gpu, o.rate / f))
            })
            .collect();
        if !ratios.is_empty() {
            mem = concave_majorant(&isotonic(&medians(ratios)));
            mem.truncate(MAX_POINTS);
            if mem.last().map_or(true, |p| p.1 <= 0.0) {
                mem.clear();
            }
        }
    }
    Ok(Sensitivity { cpu, mem })
}

/// The CPU counts per GPU to give a newly admitted job's first GPU slots, one per slot
/// (Synergy's optimistic profiling adapted to harvested slots: each probe with ample
/// memory, so the CPU curve is measured where memory is not the limit). At most
/// `max_probes` distinct counts from the job's request `floor` to `max` (the node's CPUs
/// per GPU), spaced geometrically (rates saturate, so the low end needs more points),
/// ascending; both ends always included when `max_probes >= 2`.
pub fn probe_plan(floor: u32, max: u32, max_probes: u32) -> Result<Vec<u32>, AllocError> {
    if floor == 0 {
        return Err(invalid(
            "probe.floor",
            "is 0; the job's CPUs per GPU request is at least 1",
        ));
    }
    if max < floor {
        return Err(invalid(
            "probe.max",
            format!("{max} is below the job's request {floor}; it must be at least the request"),
        ));
    }
    if max_probes == 0 || max_probes > MAX_PROBES {
        return Err(invalid(
            "probe.max_probes",
            format!("{max_probes} is not allowed; 1 to {MAX_PROBES}"),
        ));
    }
    let k = max_probes.min(max - floor + 1);
    if k == 1 {
        return Ok(vec![max]);
    }
    let ratio = f64::from(max) / f64::from(floor);
    let mut out: Vec<u32> = (0..k)
        .map(|i| {
            let v = f64::from(floor) * ratio.powf(f64::from(i) / f64::from(k - 1));
            (v.round() as u32).clamp(floor, max)
        })
        .collect();
    out.dedup();
    // Geometric rounding can merge neighbours at the low end; fill with the unused counts
    // nearest the request so the plan has k distinct points.
    let mut c = floor;
    while (out.len() as u32) < k && c <= max {
        if let Err(pos) = out.binary_search(&c) {
            out.insert(pos, c);
        }
        c += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(gpus: u32, cpus_per_task: u32, mem: u64, cpu: Vec<(f64, f64)>) -> ShareJob {
        ShareJob {
            gpus,
            tasks: gpus,
            cpus_per_task,
            mem_mib_per_task: mem,
            sensitivity: Sensitivity {
                cpu,
                mem: Vec::new(),
            },
        }
    }

    /// An image model: its loader needs ~12 CPUs per GPU to keep the GPU busy.
    fn data_bound() -> Vec<(f64, f64)> {
        vec![(1.0, 100.0), (4.0, 350.0), (12.0, 600.0)]
    }
    /// A language model: saturated at 2 CPUs per GPU.
    fn compute_bound() -> Vec<(f64, f64)> {
        vec![(1.0, 300.0), (2.0, 310.0)]
    }

    const NODE: NodeFree = NodeFree {
        cpus: 32,
        mem_mib: 256 * 1024,
        gpus: 4,
    };

    #[test]
    fn data_bound_job_gets_more_cpus_per_gpu() {
        let jobs = vec![
            job(2, 1, 4096, compute_bound()),
            job(2, 1, 4096, data_bound()),
        ];
        let s = share_node(&NODE, &jobs).unwrap();
        let p = proportional(&NODE, &jobs).unwrap();
        assert_eq!(p.shares[0].cpus, 16);
        assert_eq!(p.shares[1].cpus, 16);
        // The compute-bound job keeps 2 per GPU (where it saturates); the rest goes to the
        // data-bound one, up to its 12 per GPU; the 4 no one gains from raise the lowest
        // level per GPU (the compute-bound job's).
        assert_eq!(s.shares[0].cpus, 8);
        assert_eq!(s.shares[1].cpus, 24);
        assert!(s.shares[1].cpus / 2 > s.shares[0].cpus / 2);
        assert!(s.value > p.value * 1.05, "{} vs {}", s.value, p.value);
        assert!(s.value <= s.upper_bound + 1e-9);
        assert_eq!(
            s.shares.iter().map(|x| x.mem_mib).sum::<u64>(),
            NODE.mem_mib
        );
    }

    #[test]
    fn request_is_kept_even_when_it_gains_nothing() {
        // The compute-bound job asks for 10 CPUs per task: it keeps them.
        let jobs = vec![
            job(2, 10, 4096, compute_bound()),
            job(2, 1, 4096, data_bound()),
        ];
        let s = share_node(&NODE, &jobs).unwrap();
        assert_eq!(s.shares[0].cpus, 20);
        assert_eq!(s.shares[1].cpus, 12);
    }

    #[test]
    fn memory_sensitive_job_gets_more_memory() {
        let mut cache = job(2, 1, 1024, compute_bound());
        // Its dataset cache: rate rises until 96 GiB per GPU.
        cache.sensitivity.mem = vec![(16384.0, 0.5), (98304.0, 1.0)];
        let jobs = vec![job(2, 1, 1024, compute_bound()), cache];
        let s = share_node(&NODE, &jobs).unwrap();
        assert_eq!(s.shares[1].mem_mib, 2 * 98304);
        assert_eq!(s.shares[0].mem_mib, NODE.mem_mib - 2 * 98304);
        let p = proportional(&NODE, &jobs).unwrap();
        assert!(s.value > p.value);
        assert!(s.value <= s.upper_bound + 1e-9);
    }

    #[test]
    fn empty_node_is_fine() {
        let s = share_node(&NODE, &[]).unwrap();
        assert!(s.shares.is_empty());
    }

    fn refused(node: NodeFree, jobs: Vec<ShareJob>, loc: &str, says: &str) {
        for r in [share_node(&node, &jobs), proportional(&node, &jobs)] {
            match r {
                Err(AllocError::Invalid { location, message }) => {
                    assert_eq!(location, loc, "{message}");
                    assert!(message.contains(says), "{location}: {message}");
                }
                other => panic!("{loc}: expected an error, got {other:?}"),
            }
        }
    }

    #[test]
    fn every_bad_input_is_refused_with_what_is_allowed() {
        let ok = || job(1, 1, 1024, compute_bound());
        let with_cpu = |c: Vec<(f64, f64)>| job(1, 1, 1024, c);
        let cpu = "jobs[0].sensitivity.cpu";
        refused(
            NODE,
            vec![job(0, 1, 1, compute_bound())],
            "jobs[0].gpus",
            "at least 1 GPU",
        );
        let mut t = ok();
        t.tasks = 0;
        refused(NODE, vec![t], "jobs[0].tasks", "at least 1 task");
        refused(
            NODE,
            vec![job(5, 1, 1, compute_bound())],
            "jobs",
            "only 4 are free",
        );
        refused(
            NODE,
            vec![ok(), job(3, 11, 1, compute_bound())],
            "jobs",
            "34 CPUs in all",
        );
        refused(
            NODE,
            vec![job(1, 1, 300 * 1024, compute_bound())],
            "jobs",
            "MiB in all",
        );
        let mut m = ok();
        m.mem_mib_per_task = u64::MAX;
        m.tasks = 2;
        refused(NODE, vec![m], "jobs[0].mem_mib_per_task", "overflows");
        let big = NodeFree {
            mem_mib: u64::MAX,
            ..NODE
        };
        refused(big, vec![ok()], "node.mem_mib", "at most");
        refused(NODE, vec![with_cpu(vec![])], cpu, "at least one");
        let at0 = format!("{cpu}[0]");
        let at1 = format!("{cpu}[1]");
        refused(NODE, vec![with_cpu(vec![(f64::NAN, 1.0)])], &at0, "above 0");
        refused(NODE, vec![with_cpu(vec![(-1.0, 1.0)])], &at0, "above 0");
        refused(NODE, vec![with_cpu(vec![(0.0, 1.0)])], &at0, "above 0");
        refused(
            NODE,
            vec![with_cpu(vec![(f64::INFINITY, 1.0)])],
            &at0,
            "above 0",
        );
        refused(NODE, vec![with_cpu(vec![(1.0, f64::NAN)])], &at0, ">= 0");
        refused(NODE, vec![with_cpu(vec![(1.0, -1.0)])], &at0, ">= 0");
        refused(
            NODE,
            vec![with_cpu(vec![(2.0, 1.0), (1.0, 2.0)])],
            &at1,
            "increase strictly",
        );
        refused(
            NODE,
            vec![with_cpu(vec![(1.0, 1.0), (1.0, 2.0)])],
            &at1,
            "increase strictly",
        );
        refused(
            NODE,
            vec![with_cpu(vec![(1.0, 2.0), (2.0, 1.0)])],
            &at1,
            "nondecreasing",
        );
        refused(
            NODE,
            vec![with_cpu(vec![(1.0, 1.0), (2.0, 5.0)])],
            &at1,
            "not concave",
        );
        refused(
            NODE,
            vec![with_cpu(vec![(1e-300, 1e300)])],
            &at0,
            "finite slope",
        );
        let many: Vec<(f64, f64)> = (1..=65).map(|i| (f64::from(i), 1.0)).collect();
        refused(NODE, vec![with_cpu(many)], cpu, "at most 64");
        let mut z = ok();
        z.sensitivity.mem = vec![(1.0, 0.0), (2.0, 0.0)];
        refused(NODE, vec![z], "jobs[0].sensitivity.mem", "positive rate");
        let mut z = ok();
        z.sensitivity.mem = vec![(1.0, 1.0), (2.0, 3.0)];
        refused(NODE, vec![z], "jobs[0].sensitivity.mem[1]", "not concave");
    }

    fn obs(c: f64, m: f64, r: f64) -> Observation {
        Observation {
            cpus_per_gpu: c,
            mem_mib_per_gpu: m,
            rate: r,
        }
    }

    #[test]
    fn fit_is_monotone_concave_and_close() {
        // The data-bound curve, measured twice per count with +-3% noise, and one outlier
        // dip; memory ample in all of them.
        let truth = data_bound();
        let mut o = Vec::new();
        for c in [1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0] {
            let r = eval(&truth, c);
            o.push(obs(c, 65536.0, r * 1.03));
            o.push(obs(c, 65536.0, r * 0.97));
        }
        o.push(obs(6.0, 65536.0, 10.0));
        let s = fit(&o).unwrap();
        assert!(s.mem.is_empty(), "one memory level: no memory curve");
        let j = ShareJob {
            gpus: 1,
            tasks: 1,
            cpus_per_task: 1,
            mem_mib_per_task: 1,
            sensitivity: s.clone(),
        };
        validate(&NODE, &[j]).unwrap();
        for c in [1.0, 2.0, 4.0, 8.0, 12.0, 16.0] {
            let (f, t) = (eval(&s.cpu, c), eval(&truth, c));
            assert!((f - t).abs() <= 0.05 * t, "at {c}: fitted {f}, truth {t}");
        }
    }

    #[test]
    fn fit_finds_memory_sensitivity() {
        let mut o = Vec::new();
        for c in [1.0, 2.0, 4.0] {
            o.push(obs(c, 65536.0, eval(&compute_bound(), c)));
        }
        // At 2 CPUs, less memory: a cache that no longer holds the dataset.
        o.push(obs(2.0, 16384.0, 155.0));
        o.push(obs(2.0, 32768.0, 250.0));
        let s = fit(&o).unwrap();
        assert_eq!(s.mem.len(), 3);
        assert!((phi(&s.mem, 16384.0) - 0.5).abs() < 1e-9);
        assert!((phi(&s.mem, 65536.0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn fit_refuses_bad_measurements() {
        let bad = |o: Observation, says: &str| match fit(&[obs(1.0, 1.0, 1.0), o]) {
            Err(AllocError::Invalid { location, message }) => {
                assert_eq!(location, "observations[1]");
                assert!(message.contains(says), "{message}");
            }
            r => panic!("expected an error, got {r:?}"),
        };
        bad(obs(f64::NAN, 1.0, 1.0), "cpus_per_gpu");
        bad(obs(0.0, 1.0, 1.0), "cpus_per_gpu");
        bad(obs(1.0, -1.0, 1.0), "mem_mib_per_gpu");
        bad(obs(1.0, f64::INFINITY, 1.0), "mem_mib_per_gpu");
        bad(obs(1.0, 1.0, -2.0), "rate");
        bad(obs(1.0, 1.0, f64::NAN), "rate");
        assert!(matches!(fit(&[]), Err(AllocError::Invalid { .. })));
    }

    #[test]
    fn probes_are_distinct_bounded_and_span_the_range() {
        assert_eq!(probe_plan(1, 12, 4).unwrap(), vec![1, 2, 5, 12]);
        assert_eq!(probe_plan(2, 3, 4).unwrap(), vec![2, 3]);
        assert_eq!(probe_plan(3, 3, 4).unwrap(), vec![3]);
        assert_eq!(probe_plan(1, 42, 1).unwrap(), vec![42]);
        for (f, m, k) in [(1, 7, 8), (1, 42, 8), (4, 9, 5), (1, 100, 3)] {
            let p = probe_plan(f, m, k).unwrap();
            assert_eq!(p.len() as u32, k.min(m - f + 1), "{p:?}");
            assert!(p.windows(2).all(|w| w[0] < w[1]), "{p:?}");
            assert_eq!((p[0], *p.last().unwrap()), (f, m), "{p:?}");
        }
        for (f, m, k, loc) in [
            (0, 4, 2, "probe.floor"),
            (5, 4, 2, "probe.max"),
            (1, 4, 0, "probe.max_probes"),
            (1, 4, 9, "probe.max_probes"),
        ] {
            match probe_plan(f, m, k) {
                Err(AllocError::Invalid { location, .. }) => assert_eq!(location, loc),
                r => panic!("expected an error, got {r:?}"),
            }
        }
    }
}
