//! The allocator against exhaustive enumeration on small random instances: zero gap for
//! every exact objective, valid allocations always, and the documented tie-breaking.

mod alloc_support;

use alloc_support::*;
use bftrainer_core::alloc::{solve, Objective, Options};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1200))]

    #[test]
    fn bftrainer_matches_enumeration(seed in any::<u64>()) {
        let inst = random_small(seed, 10, 4);
        let sol = solve(&inst, &Options::new(Objective::Bftrainer)).unwrap();
        check_solution(&inst, Objective::Bftrainer, &sol);
        let (best, best_counts) = exhaustive(&inst, Objective::Bftrainer);
        prop_assert!(close(best, sol.objective_value), "solver {} vs enumeration {best} ({best_counts:?} vs {:?})", sol.objective_value, sol.counts());
        // Values are multiples of 1/2 times small integers: ties are exact, so the
        // documented tie rule decides the counts.
        prop_assert_eq!(sol.counts(), best_counts.clone());
        let split = solve(&inst, &split_everywhere(Objective::Bftrainer)).unwrap();
        check_solution(&inst, Objective::Bftrainer, &split);
        prop_assert!(close(best, split.objective_value), "split search {} vs enumeration {best}", split.objective_value);
        prop_assert_eq!(split.counts(), best_counts);
    }

    #[test]
    fn weighted_objectives_match_enumeration(seed in any::<u64>()) {
        let inst = random_small(seed, 8, 4);
        for objective in [Objective::Efficiency, Objective::RemainingWork] {
            let sol = solve(&inst, &Options::new(objective)).unwrap();
            check_solution(&inst, objective, &sol);
            let (best, _) = exhaustive(&inst, objective);
            prop_assert!(close(best, sol.objective_value), "{objective}: solver {} vs enumeration {best}", sol.objective_value);
            let split = solve(&inst, &split_everywhere(objective)).unwrap();
            prop_assert!(close(best, split.objective_value), "{objective}: split search {} vs enumeration {best}", split.objective_value);
        }
    }

    #[test]
    fn fairness_matches_enumeration(seed in any::<u64>()) {
        let inst = random_small(seed, 8, 4);
        let sol = solve(&inst, &Options::new(Objective::Fairness)).unwrap();
        check_solution(&inst, Objective::Fairness, &sol);
        let (level, (best, _)) = exhaustive_fair(&inst);
        let reached = fair_level(&inst, &sol.counts());
        prop_assert!((reached - level).abs() <= 1e-9, "level {reached} vs enumeration {level}");
        prop_assert!((sol.fairness_level.unwrap() - level).abs() <= 1e-9);
        prop_assert!(close(best, sol.objective_value), "solver {} vs enumeration {best}", sol.objective_value);
        let split = solve(&inst, &split_everywhere(Objective::Fairness)).unwrap();
        prop_assert!(close(best, split.objective_value), "split search {} vs enumeration {best}", split.objective_value);
    }

    #[test]
    fn reclaim_aware_is_valid_and_never_above_optimum(seed in any::<u64>()) {
        let inst = random_small(seed, 5, 3);
        let sol = solve(&inst, &Options::new(Objective::ReclaimAware)).unwrap();
        check_solution(&inst, Objective::ReclaimAware, &sol);
        let best = exhaustive_reclaim(&inst);
        prop_assert!(sol.objective_value <= best + 1e-9 * (1.0 + best.abs()));
        if inst.reclaim_in_s.iter().all(|r| r.map_or(true, |t| t >= inst.t_fwd_s)) {
            prop_assert!(close(best, sol.objective_value), "no short-lived node, yet {} vs {best}", sol.objective_value);
        }
    }
}

/// Gap of the reclaim-aware heuristic on 600 tiny instances with reclaim predictions;
/// printed for docs/benchmarks.md (`cargo test -p bftrainer-core --test alloc_exact --
/// --nocapture reclaim_gap`), and bounded so a regression fails.
#[test]
fn reclaim_gap() {
    let (mut n, mut exact, mut sum_rel, mut worst) = (0, 0, 0.0, 0.0f64);
    for seed in 0..20_000u64 {
        let inst = random_small(seed, 5, 3);
        if inst.reclaim_in_s.is_empty() || inst.jobs.is_empty() {
            continue;
        }
        let sol = solve(&inst, &Options::new(Objective::ReclaimAware)).unwrap();
        let best = exhaustive_reclaim(&inst);
        let gap = best - sol.objective_value;
        // Against the value scale of the instance: Tfwd times every job's best rate.
        let scale: f64 = inst
            .jobs
            .iter()
            .map(|j| {
                (1..=j.max_nodes)
                    .map(|n| inst.t_fwd_s * obj_at(j, n))
                    .fold(0.0, f64::max)
            })
            .sum::<f64>()
            .max(1.0);
        let rel = gap / scale;
        n += 1;
        if close(best, sol.objective_value) {
            exact += 1;
        }
        sum_rel += rel;
        // SHOW_WORST=1 prints each new worst case, to study the heuristic.
        if rel > worst && std::env::var("SHOW_WORST").is_ok() {
            println!("seed {seed}: gap {gap} rel {rel}\n{inst:?}\n{sol:?}");
        }
        worst = worst.max(rel);
        if n == 600 {
            break;
        }
    }
    println!(
        "reclaim-aware: {n} instances, optimal on {exact}, mean gap {:.5} and worst {:.4} of Tfwd * sum of best rates",
        sum_rel / f64::from(n),
        worst
    );
    assert!(n == 600);
    assert!(
        f64::from(exact) >= 0.9 * f64::from(n),
        "optimal on only {exact} of {n}"
    );
}

/// At scale the search does split (cold states: one big job's rescale-cost bridge keeps
/// the bound loose), and neither splitting nor its threshold changes the answer: the
/// same counts as the search that never splits and as the one that always does.
#[test]
fn splits_leave_the_optimum_unchanged_at_scale() {
    use bftrainer_core::alloc::gen::{generate, GenParams};
    use bftrainer_core::alloc::solve_with_stats;
    let mut split_seen = 0;
    for seed in [1u64, 61, 7] {
        let mut p = GenParams::new(4734, 100, seed);
        p.warm = false;
        let inst = generate(&p);
        let (shipped, st) = solve_with_stats(&inst, &Options::new(Objective::Bftrainer)).unwrap();
        let never = Options {
            split_min_work: f64::INFINITY,
            ..Options::new(Objective::Bftrainer)
        };
        let (plain, pst) = solve_with_stats(&inst, &never).unwrap();
        assert_eq!(
            pst.nodes, 1,
            "seed {seed}: split_min_work = inf must not split"
        );
        let forced = solve(&inst, &split_everywhere(Objective::Bftrainer)).unwrap();
        assert_eq!(shipped.counts(), plain.counts(), "seed {seed}");
        assert_eq!(forced.counts(), plain.counts(), "seed {seed}");
        check_solution(&inst, Objective::Bftrainer, &shipped);
        if st.nodes > 1 {
            split_seen += 1;
        }
    }
    assert!(
        split_seen >= 2,
        "the shipped search split on {split_seen} of 3 cold instances"
    );
}

/// The counts of the documented rule by a plain DP over every job's whole domain: the
/// best value of the first k jobs on exactly y nodes, then the fewest nodes in total
/// that reach the optimum, then from the last job back the fewest nodes that still
/// reach it. Values here are sums of halves times small integers, so ties are exact.
fn plain_dp(inst: &bftrainer_core::alloc::Instance) -> Vec<u32> {
    let b = inst.n_nodes as usize;
    let neg = f64::NEG_INFINITY;
    let dom = |j: usize| {
        let job = &inst.jobs[j];
        (0..=inst.n_nodes.min(job.max_nodes)).filter(move |&n| allowed(inst, job, n))
    };
    let mut best = vec![vec![neg; b + 1]];
    best[0][0] = 0.0;
    for j in 0..inst.jobs.len() {
        let prev = &best[j];
        let mut next = vec![neg; b + 1];
        for n in dom(j) {
            let t = term(inst, &inst.jobs[j], n);
            for y in n as usize..=b {
                if prev[y - n as usize] > neg {
                    next[y] = next[y].max(prev[y - n as usize] + t);
                }
            }
        }
        best.push(next);
    }
    let last = &best[inst.jobs.len()];
    let top = last.iter().copied().fold(neg, f64::max);
    let mut y = (0..=b)
        .find(|&y| last[y] > neg && close(last[y], top))
        .unwrap();
    let mut counts = vec![0; inst.jobs.len()];
    for j in (0..inst.jobs.len()).rev() {
        let target = best[j + 1][y];
        let n = dom(j)
            .find(|&n| {
                (n as usize) <= y
                    && best[j][y - n as usize] > neg
                    && close(
                        best[j][y - n as usize] + term(inst, &inst.jobs[j], n),
                        target,
                    )
            })
            .unwrap();
        counts[j] = n;
        y -= n as usize;
    }
    counts
}

/// Past 32 jobs the search first runs its DP on a fraction of the gap and prunes states
/// that cannot reach the incumbent, leaving dead prefixes the DP skips: the counts
/// (not only the value) must still be those of the documented rule, on instances too
/// big to enumerate. Half of them are daemon-like: every job a twin of the first (one
/// curve, one range), so that the bound is met at once and the DP decides among ties.
#[test]
fn many_jobs_match_a_plain_dp() {
    use bftrainer_core::alloc::solve_with_stats;
    let (mut cases, mut wide) = (0, 0);
    for seed in 0..240u64 {
        let mut inst = random_small(seed, 150, 90);
        if inst.jobs.len() <= 32 {
            continue;
        }
        if seed % 2 == 0 {
            let first = inst.jobs[0].clone();
            for (k, j) in inst.jobs.iter_mut().enumerate().skip(1) {
                let current = std::mem::take(&mut j.current);
                *j = first.clone();
                j.id = format!("j{k}");
                j.current = current;
            }
        }
        let (sol, st) = solve_with_stats(&inst, &Options::new(Objective::Bftrainer)).unwrap();
        check_solution(&inst, Objective::Bftrainer, &sol);
        assert_eq!(sol.counts(), plain_dp(&inst), "seed {seed}");
        cases += 1;
        if st.open_jobs > 32 && st.dp_width > 8 {
            wide += 1;
        }
    }
    assert!(cases >= 100, "only {cases} instances of more than 32 jobs");
    assert!(wide >= 50, "only {wide} DPs over more than 32 open jobs");
}
