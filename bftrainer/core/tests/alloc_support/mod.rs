//! Independent references for the allocator: the objective re-implemented from the
//! statement in docs/design.md, exhaustive enumeration, and a MILP solved by HiGHS.
#![allow(dead_code)]

use bftrainer_core::alloc::{Instance, JobInput, NodeIdx, Objective, Options, Solution};
use good_lp::{
    constraint, highs, variable, Expression, ProblemVariables, Solution as _, SolverModel,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn curve_at(points: &[(u32, f64)], n: u32) -> f64 {
    if n == 0 || points.is_empty() {
        return 0.0;
    }
    let mut prev = points[0];
    if n <= prev.0 {
        return prev.1;
    }
    for &p in &points[1..] {
        if n <= p.0 {
            let t = f64::from(n - prev.0) / f64::from(p.0 - prev.0);
            return if n == p.0 {
                p.1
            } else {
                prev.1 + (p.1 - prev.1) * t
            };
        }
        prev = p;
    }
    prev.1
}

pub fn obj_at(job: &JobInput, n: u32) -> f64 {
    if job.batch_curves.is_empty() {
        curve_at(&job.curve.points, n)
    } else {
        job.batch_curves
            .iter()
            .map(|b| curve_at(&b.curve.points, n))
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

pub fn rate(job: &JobInput) -> f64 {
    let c = job.current.len() as u32;
    if c == 0 || c < job.min_nodes {
        return 0.0;
    }
    match job.current_batch {
        Some(b) => curve_at(
            &job.batch_curves
                .iter()
                .find(|x| x.batch_size == b)
                .unwrap()
                .curve
                .points,
            c,
        ),
        None => obj_at(job, c),
    }
}

pub fn weight(job: &JobInput, objective: Objective) -> f64 {
    match objective {
        Objective::Efficiency if obj_at(job, 1) > 0.0 => 1.0 / obj_at(job, 1),
        Objective::RemainingWork => 1.0 / job.remaining_work.unwrap(),
        _ => 1.0,
    }
}

pub fn allowed(inst: &Instance, job: &JobInput, n: u32) -> bool {
    n == 0 || (n >= job.min_nodes.max(1) && n <= job.max_nodes && n <= inst.n_nodes)
}

/// One job's BFTrainer term, straight from the statement.
pub fn term(inst: &Instance, job: &JobInput, n: u32) -> f64 {
    let c = job.current.len() as u32;
    let r = rate(job);
    let cost = if n > c {
        job.scale_up_s * r
    } else if n < c {
        job.scale_down_s * r
    } else {
        0.0
    };
    inst.t_fwd_s * obj_at(job, n) - cost
}

pub fn value(inst: &Instance, objective: Objective, counts: &[u32]) -> Option<f64> {
    let mut v = 0.0;
    for (job, &n) in inst.jobs.iter().zip(counts) {
        if !allowed(inst, job, n) {
            return None;
        }
        v += weight(job, objective) * term(inst, job, n);
    }
    Some(v)
}

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

fn domain(inst: &Instance, job: &JobInput) -> Vec<u32> {
    (0..=inst.n_nodes.min(job.max_nodes))
        .filter(|&n| allowed(inst, job, n))
        .collect()
}

/// Every feasible count vector (sum <= nodes).
pub fn for_each_alloc(inst: &Instance, mut f: impl FnMut(&[u32])) {
    let doms: Vec<Vec<u32>> = inst.jobs.iter().map(|j| domain(inst, j)).collect();
    let mut idx = vec![0usize; doms.len()];
    let mut counts: Vec<u32> = doms.iter().map(|d| d[0]).collect();
    loop {
        if counts.iter().map(|&x| u64::from(x)).sum::<u64>() <= u64::from(inst.n_nodes) {
            f(&counts);
        }
        let mut k = 0;
        loop {
            if k == doms.len() {
                return;
            }
            idx[k] += 1;
            if idx[k] < doms[k].len() {
                counts[k] = doms[k][idx[k]];
                break;
            }
            idx[k] = 0;
            counts[k] = doms[k][0];
            k += 1;
        }
    }
}

/// Tie order of the statement: fewer nodes in total, then the last job with fewer nodes,
/// then the one before it, ...
pub fn tie_better(a: &[u32], b: &[u32]) -> bool {
    let (sa, sb): (u32, u32) = (a.iter().sum(), b.iter().sum());
    if sa != sb {
        return sa < sb;
    }
    a.iter().rev().lt(b.iter().rev())
}

/// Optimum by enumeration: (value, counts) with the tie rule (ties up to 1e-9 relative).
pub fn exhaustive(inst: &Instance, objective: Objective) -> (f64, Vec<u32>) {
    if objective == Objective::Fairness {
        return exhaustive_fair(inst).1;
    }
    let mut best: Option<(f64, Vec<u32>)> = None;
    for_each_alloc(inst, |c| {
        let v = value(inst, objective, c).unwrap();
        best = match best.take() {
            None => Some((v, c.to_vec())),
            Some((bv, bc)) => {
                if (v > bv && !close(v, bv)) || (close(v, bv) && tie_better(c, &bc)) {
                    Some((v, c.to_vec()))
                } else {
                    Some((bv, bc))
                }
            }
        };
    });
    best.unwrap()
}

pub fn fair_level(inst: &Instance, counts: &[u32]) -> f64 {
    let mut level: f64 = 1.0;
    for (job, &n) in inst.jobs.iter().zip(counts) {
        let top = domain(inst, job)
            .into_iter()
            .filter(|&m| m > 0)
            .map(|m| obj_at(job, m))
            .fold(0.0, f64::max);
        if top > 0.0 {
            level = level.min(obj_at(job, n) / top);
        }
    }
    level
}

/// (level, (BFTrainer value, counts)) of max-min fairness then BFTrainer.
pub fn exhaustive_fair(inst: &Instance) -> (f64, (f64, Vec<u32>)) {
    let mut t = 0.0f64;
    for_each_alloc(inst, |c| t = t.max(fair_level(inst, c)));
    let mut best: Option<(f64, Vec<u32>)> = None;
    for_each_alloc(inst, |c| {
        if fair_level(inst, c) >= t - 1e-12 {
            let v = value(inst, Objective::Bftrainer, c).unwrap();
            if best.as_ref().map_or(true, |b| v > b.0 && !close(v, b.0)) {
                best = Some((v, c.to_vec()));
            }
        }
    });
    (t, best.unwrap())
}

/// Checks every solution must pass: node ranges, one job per node, counts allowed, no
/// migration, and the reported value equals the statement's value of the node sets.
pub fn check_solution(inst: &Instance, objective: Objective, sol: &Solution) {
    assert_eq!(sol.jobs.len(), inst.jobs.len());
    let mut owner = vec![usize::MAX; inst.n_nodes as usize];
    for (j, (job, set)) in inst.jobs.iter().zip(&sol.jobs).enumerate() {
        assert!(
            allowed(inst, job, set.len() as u32),
            "job {j}: {} nodes not allowed",
            set.len()
        );
        assert!(
            set.windows(2).all(|w| w[0] < w[1]),
            "job {j}: nodes not ascending/unique"
        );
        for &i in set {
            assert!(i < inst.n_nodes);
            assert_eq!(owner[i as usize], usize::MAX, "node {i} in two jobs");
            owner[i as usize] = j;
        }
        let kept = job.current.iter().filter(|i| set.contains(i)).count();
        if set.len() >= job.current.len() {
            assert_eq!(
                kept,
                job.current.len(),
                "job {j} grew but dropped a node (migration)"
            );
        } else {
            assert_eq!(
                kept,
                set.len(),
                "job {j} shrank onto a node it did not hold (migration)"
            );
        }
    }
    let counts: Vec<u32> = sol.jobs.iter().map(|s| s.len() as u32).collect();
    if objective != Objective::ReclaimAware {
        let obj = if objective == Objective::Fairness {
            Objective::Bftrainer
        } else {
            objective
        };
        let v = value(inst, obj, &counts).unwrap();
        assert!(
            close(v, sol.objective_value),
            "reported {} but the allocation is worth {v}",
            sol.objective_value
        );
    } else {
        let v = value(inst, Objective::Bftrainer, &counts).unwrap() - reclaim_loss(inst, &sol.jobs);
        assert!(
            close(v, sol.objective_value),
            "reported {} but the allocation is worth {v}",
            sol.objective_value
        );
    }
}

/// The reclaim-aware loss, from the statement in docs/design.md.
pub fn reclaim_loss(inst: &Instance, sets: &[Vec<NodeIdx>]) -> f64 {
    if inst.reclaim_in_s.is_empty() {
        return 0.0;
    }
    let mut total = 0.0;
    for (job, set) in inst.jobs.iter().zip(sets) {
        let c = job.current.len() as u32;
        let n = c.max(job.min_nodes).max(1);
        let r = if c >= job.min_nodes && c > 0 {
            rate(job)
        } else {
            obj_at(job, n)
        };
        for &i in set {
            if let Some(t) = inst.reclaim_in_s[i as usize] {
                if t < inst.t_fwd_s {
                    total += job.scale_down_s * r + (inst.t_fwd_s - t) * r / f64::from(n);
                }
            }
        }
    }
    total
}

/// Best reclaim-aware value over every node assignment without migration (tiny only).
pub fn exhaustive_reclaim(inst: &Instance) -> f64 {
    let nn = inst.n_nodes as usize;
    let nj = inst.jobs.len();
    let mut owner = vec![0usize; nn]; // 0 = free, k = job k-1
    let mut best = f64::NEG_INFINITY;
    loop {
        let mut sets: Vec<Vec<NodeIdx>> = vec![Vec::new(); nj];
        for (i, &o) in owner.iter().enumerate() {
            if o > 0 {
                sets[o - 1].push(i as NodeIdx);
            }
        }
        let ok = inst.jobs.iter().zip(&sets).all(|(job, s)| {
            let kept = job.current.iter().filter(|i| s.contains(i)).count();
            allowed(inst, job, s.len() as u32)
                && if s.len() >= job.current.len() {
                    kept == job.current.len()
                } else {
                    kept == s.len()
                }
        });
        if ok {
            let counts: Vec<u32> = sets.iter().map(|s| s.len() as u32).collect();
            let v = value(inst, Objective::Bftrainer, &counts).unwrap() - reclaim_loss(inst, &sets);
            best = best.max(v);
        }
        let mut k = 0;
        loop {
            if k == nn {
                return best;
            }
            owner[k] += 1;
            if owner[k] <= nj {
                break;
            }
            owner[k] = 0;
            k += 1;
        }
    }
}

/// The same optimum as a MILP (HiGHS): per job one binary per linear piece of each of its
/// curves (or the zero count), an integer offset inside the piece.
pub fn milp(inst: &Instance, objective: Objective, time_limit_s: f64) -> Option<f64> {
    if inst.jobs.is_empty() {
        return Some(0.0); // HiGHS refuses an empty model
    }
    let mut vars = ProblemVariables::new();
    let mut obj = Expression::from(0.0);
    let mut total_nodes = Expression::from(0.0);
    let mut rows: Vec<Expression> = Vec::new();
    let mut links: Vec<(good_lp::Variable, good_lp::Variable, f64)> = Vec::new();
    for job in &inst.jobs {
        let w = weight(job, objective);
        let lo = job.min_nodes.max(1);
        let hi = job.max_nodes.min(inst.n_nodes);
        let c = job.current.len() as u32;
        let z0 = vars.add(variable().binary());
        let mut choose = Expression::from(z0);
        obj += w * term(inst, job, 0) * z0;
        if lo <= hi {
            let curves: Vec<&Vec<(u32, f64)>> = if job.batch_curves.is_empty() {
                vec![&job.curve.points]
            } else {
                job.batch_curves.iter().map(|b| &b.curve.points).collect()
            };
            for pts in curves {
                let mut bps: Vec<u32> = pts
                    .iter()
                    .map(|p| p.0)
                    .chain([lo, hi, c.saturating_sub(1), c, c + 1])
                    .collect();
                bps.retain(|&x| x >= lo && x <= hi);
                bps.sort_unstable();
                bps.dedup();
                let one_batch = |n: u32| {
                    let cost = inst.t_fwd_s * obj_at(job, n) - term(inst, job, n);
                    w * (inst.t_fwd_s * curve_at(pts, n) - cost)
                };
                let pieces: Vec<(u32, u32)> = if bps.len() == 1 {
                    vec![(bps[0], bps[0])]
                } else {
                    bps.windows(2).map(|w| (w[0], w[1])).collect()
                };
                for (a, b) in pieces {
                    let z = vars.add(variable().binary());
                    let d = vars.add(variable().integer().min(0).max(f64::from(b - a)));
                    let (fa, fb) = (one_batch(a), one_batch(b));
                    let slope = if b > a {
                        (fb - fa) / f64::from(b - a)
                    } else {
                        0.0
                    };
                    obj += fa * z + slope * d;
                    total_nodes += f64::from(a) * z + d;
                    choose += z;
                    links.push((d, z, f64::from(b - a)));
                }
            }
        }
        rows.push(choose);
    }
    let mut model = vars.maximise(obj.clone()).using(highs);
    model.set_verbose(false);
    let mut model = model
        .set_time_limit(time_limit_s)
        .set_mip_rel_gap(0.0)
        .ok()?
        .set_threads(1);
    model = model.set_mip_abs_gap(0.0).ok()?;
    for r in rows {
        model = model.with(constraint!(r == 1));
    }
    for (d, z, w) in links {
        model = model.with(constraint!(d <= w * z));
    }
    model = model.with(constraint!(total_nodes <= f64::from(inst.n_nodes)));
    let sol = match model.solve() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("HiGHS: {e}");
            return None;
        }
    };
    // GapLimit with a zero gap limit is a proven optimum too.
    if !matches!(
        sol.status(),
        good_lp::SolutionStatus::Optimal | good_lp::SolutionStatus::GapLimit
    ) {
        eprintln!("HiGHS status: {:?}", sol.status());
        return None;
    }
    Some(sol.eval(&obj))
}

/// Small random instances hitting the edge cases: non-concave and flat curves, zero
/// rates, identical jobs (ties), min = max, more minimum nodes than nodes, jobs below
/// their minimum, jobs whose minimum exceeds the machine, batch curves, zero nodes.
pub fn random_small(seed: u64, max_nodes: u32, max_jobs: usize) -> Instance {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n_nodes = rng.gen_range(0..=max_nodes);
    let n_jobs = rng.gen_range(0..=max_jobs);
    let mut jobs: Vec<JobInput> = Vec::new();
    let curve = |rng: &mut ChaCha8Rng| -> Vec<(u32, f64)> {
        let k = rng.gen_range(1..=5);
        let mut x = 1u32;
        let mut pts = Vec::new();
        let flat = rng.gen_bool(0.1);
        for _ in 0..k {
            let y = if flat {
                0.0
            } else {
                f64::from(rng.gen_range(0..40u32)) * 0.5
            };
            pts.push((x, y));
            x += rng.gen_range(1..=3);
        }
        pts
    };
    for j in 0..n_jobs {
        if j > 0 && rng.gen_bool(0.15) {
            let mut twin = jobs[0].clone();
            twin.id = format!("j{j}");
            twin.current.clear();
            jobs.push(twin);
            continue;
        }
        let top = if rng.gen_bool(0.1) { max_nodes + 2 } else { 4 };
        let min = rng.gen_range(1..=top);
        let max = if rng.gen_bool(0.2) {
            min
        } else {
            min + rng.gen_range(0..=6)
        };
        let mut job = JobInput::new(
            &format!("j{j}"),
            min,
            max,
            f64::from(rng.gen_range(0..=25u32)),
            f64::from(rng.gen_range(0..=25u32)),
            bftrainer_core::alloc::Curve::new(curve(&mut rng)),
        );
        if rng.gen_bool(0.15) {
            let nb = rng.gen_range(2..=3);
            job.batch_curves = (0..nb)
                .map(|b| bftrainer_core::alloc::BatchCurve {
                    batch_size: 64 << b,
                    curve: bftrainer_core::alloc::Curve::new(curve(&mut rng)),
                })
                .collect();
            job.curve = Default::default();
            if rng.gen_bool(0.5) {
                job.current_batch = Some(64);
            }
        }
        job.remaining_work = Some(f64::from(rng.gen_range(1..=100u32)));
        jobs.push(job);
    }
    if !jobs.is_empty() {
        for i in 0..n_nodes {
            if rng.gen_bool(0.5) {
                let j = rng.gen_range(0..jobs.len());
                jobs[j].current.push(i);
            }
        }
    }
    let reclaim_in_s = if rng.gen_bool(0.3) {
        (0..n_nodes)
            .map(|_| {
                rng.gen_bool(0.5)
                    .then(|| f64::from(rng.gen_range(0..15u32)))
            })
            .collect()
    } else {
        Vec::new()
    };
    Instance {
        t_fwd_s: f64::from(rng.gen_range(1..=10u32)),
        n_nodes,
        reclaim_in_s,
        host_of: Vec::new(),
        jobs,
    }
}

/// The search splitting job domains at every node where an envelope bridge is loose,
/// instead of only where the DP would be costly: the split path on small instances.
pub fn split_everywhere(objective: Objective) -> Options {
    Options {
        split_min_work: 0.0,
        ..Options::new(objective)
    }
}
