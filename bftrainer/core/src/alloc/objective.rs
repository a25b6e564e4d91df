//! Each objective reduced to the exact count solver (weights, floors) plus node choice;
//! and the evaluator that scores any allocation with the same formulas.

use super::assign::assign;
use super::exact::{solve_counts, Stats};
use super::model::{current_rate, JobFn, Obj};
use super::{invalid, AllocError, Instance, JobInput, NodeIdx, Objective, Options, Solution};

/// Per-job weight w_j applied to the whole BFTrainer term.
fn weight(job: &JobInput, objective: Objective) -> f64 {
    match objective {
        Objective::Efficiency => {
            let one = Obj::of(job).eval(1);
            if one > 0.0 {
                1.0 / one
            } else {
                1.0
            }
        }
        Objective::RemainingWork => 1.0 / job.remaining_work.unwrap_or(1.0),
        _ => 1.0,
    }
}

fn job_fns(inst: &Instance, objective: Objective) -> Vec<JobFn<'_>> {
    inst.jobs
        .iter()
        .map(|j| JobFn::new(j, inst.t_fwd_s, inst.n_nodes, weight(j, objective)))
        .collect()
}

pub(crate) fn solve_validated(
    inst: &Instance,
    opts: &Options,
    stats: &mut Stats,
) -> Result<Solution, AllocError> {
    let objective = opts.objective;
    let mut fns = job_fns(inst, objective);
    let mut level_out = None;
    if objective == Objective::Fairness {
        let (level, tops) = fairness_level(&fns, inst.n_nodes);
        for (f, &top) in fns.iter_mut().zip(&tops) {
            if top > 0.0 {
                // Slack for the rounding of level * top: the job defining the level must
                // still reach it.
                f.restrict_level(level * top * (1.0 - 1e-12));
            }
        }
        level_out = Some(level);
    }
    if objective == Objective::ReclaimAware {
        for (j, f) in fns.iter_mut().enumerate() {
            f.set_keep_loss(super::reclaim::node_losses(inst, j, &inst.jobs[j].current));
        }
    }
    let (counts, st) = solve_counts(&fns, inst.n_nodes, opts.split_min_work).ok_or_else(|| {
        invalid(
            "jobs",
            "no feasible allocation (internal: floors do not fit)",
        )
    })?;
    *stats = st;
    let jobs = if objective == Objective::ReclaimAware {
        super::reclaim::local_search(inst, counts)
    } else {
        assign(inst, &counts, objective)
    };
    let batch_sizes = inst
        .jobs
        .iter()
        .zip(&jobs)
        .map(|(j, s)| {
            if s.is_empty() {
                None
            } else {
                Obj::of(j).best_batch(s.len() as u32)
            }
        })
        .collect();
    // The solver's own terms are the evaluator's, except where fairness restricted them
    // or reclaim-aware added its loss: score with them rather than building them again.
    let objective_value = match objective {
        Objective::Fairness | Objective::ReclaimAware => evaluate(inst, objective, &jobs),
        _ => sum_terms(&fns, &jobs),
    }
    .unwrap_or(f64::NAN);
    Ok(Solution {
        objective_value,
        jobs,
        batch_sizes,
        fairness_level: level_out,
    })
}

pub(crate) fn evaluate(
    inst: &Instance,
    objective: Objective,
    alloc: &[Vec<NodeIdx>],
) -> Option<f64> {
    if alloc.len() != inst.jobs.len() {
        return None;
    }
    let obj = if objective == Objective::Fairness {
        Objective::Bftrainer
    } else {
        objective
    };
    let mut total = sum_terms(&job_fns(inst, obj), alloc)?;
    if objective == Objective::ReclaimAware {
        total -= super::reclaim::loss(inst, alloc);
    }
    Some(total)
}

/// Sum of the terms of the node sets' sizes; `None` when one is not allowed (or the
/// lengths differ).
fn sum_terms(fns: &[JobFn<'_>], alloc: &[Vec<NodeIdx>]) -> Option<f64> {
    if alloc.len() != fns.len() {
        return None;
    }
    let mut total = 0.0;
    for (f, s) in fns.iter().zip(alloc) {
        let n = s.len() as u32;
        if !f.allowed(n) {
            return None;
        }
        total += f.value(n);
    }
    Some(total)
}

/// Max-min fairness level: the largest t such that every job can reach
/// O_j(n)/max O_j >= t within the nodes; and each job's max O_j (0: the job is ignored).
fn fairness_level(fns: &[JobFn<'_>], budget: u32) -> (f64, Vec<f64>) {
    let tops: Vec<f64> = fns
        .iter()
        .map(|f| f.bps.iter().map(|&n| f.obj.eval(n)).fold(0.0, f64::max))
        .collect();
    let needs = |t: f64| -> Option<Vec<u32>> {
        let mut v = Vec::with_capacity(fns.len());
        let mut sum = 0u64;
        for (f, &top) in fns.iter().zip(&tops) {
            let n = if t <= 0.0 || top <= 0.0 {
                0
            } else {
                need(f, t * top)?
            };
            sum += u64::from(n);
            v.push(n);
        }
        (sum <= u64::from(budget)).then_some(v)
    };
    if needs(1.0).is_some() {
        return (1.0, tops);
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if needs(mid).is_some() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let floors = needs(lo).unwrap_or_else(|| vec![0; fns.len()]);
    if lo <= 0.0 {
        return (0.0, tops);
    }
    // Snap to the level actually reached by those counts (same counts, exact level).
    let level = fns
        .iter()
        .zip(&tops)
        .zip(&floors)
        .filter(|((_, &top), _)| top > 0.0)
        .map(|((f, &top), &n)| f.obj.eval(n) / top)
        .fold(1.0, f64::min);
    (level, tops)
}

/// Smallest allowed n >= 1 with O(n) >= target, if any.
fn need(f: &JobFn<'_>, target: f64) -> Option<u32> {
    let b = &f.bps;
    if b.is_empty() {
        return None;
    }
    if f.obj.eval(b[0]) >= target {
        return Some(b[0]);
    }
    for w in b.windows(2) {
        let (x0, x1) = (w[0], w[1]);
        let (y0, y1) = (f.obj.eval(x0), f.obj.eval(x1));
        if y1 >= target {
            // Linear on [x0, x1]: estimate, then settle on the exact integer.
            let est = f64::from(x0) + ((target - y0) / (y1 - y0) * f64::from(x1 - x0)).ceil();
            let mut n = (est.max(f64::from(x0 + 1)).min(f64::from(x1))) as u32;
            while n > x0 + 1 && f.obj.eval(n - 1) >= target {
                n -= 1;
            }
            while f.obj.eval(n) < target {
                n += 1;
            }
            return Some(n);
        }
    }
    None
}

/// Rate-weighted penalty coefficient of a job for the reclaim-aware objective.
pub(crate) fn reclaim_coeffs(job: &JobInput) -> (f64, f64) {
    let c = job.current.len() as u32;
    let n = c.max(job.min_nodes).max(1);
    let r = if c >= job.min_nodes && c > 0 {
        current_rate(job)
    } else {
        Obj::of(job).eval(n)
    };
    (job.scale_down_s * r, r / f64::from(n))
}
