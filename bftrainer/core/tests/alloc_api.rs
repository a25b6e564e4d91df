//! The allocator's API contract: validation errors name what and where, node choice is
//! deterministic and follows the documented preference, objectives parse by name.

use bftrainer_core::alloc::{
    solve, AllocError, BatchCurve, Curve, Instance, JobInput, Objective, Options,
};

fn job(id: &str, min: u32, max: u32, current: Vec<u32>) -> JobInput {
    JobInput {
        current,
        ..JobInput::new(
            id,
            min,
            max,
            1.0,
            1.0,
            Curve::new(vec![(1, 100.0), (8, 800.0)]),
        )
    }
}

fn inst(n: u32, jobs: Vec<JobInput>) -> Instance {
    Instance {
        t_fwd_s: 10.0,
        n_nodes: n,
        reclaim_in_s: Vec::new(),
        host_of: Vec::new(),
        jobs,
    }
}

fn err_at(i: &Instance) -> String {
    match solve(i, &Options::default()) {
        Err(AllocError::Invalid { location, message }) => format!("{location}: {message}"),
        other => panic!("expected an invalid-instance error, got {other:?}"),
    }
}

#[test]
fn validation_names_the_place() {
    let mut i = inst(4, vec![job("a", 1, 4, vec![])]);
    i.reclaim_in_s = vec![None; 3];
    assert!(err_at(&i).starts_with("reclaim_in_s: has 3 entries for 4 nodes"));

    let mut i = inst(4, vec![job("a", 1, 4, vec![])]);
    i.jobs[0].batch_curves = vec![BatchCurve {
        batch_size: 64,
        curve: Curve::new(vec![(1, 1.0)]),
    }];
    assert!(err_at(&i).contains("either curve or batch_curves"));

    let mut i = inst(4, vec![job("a", 1, 4, vec![])]);
    i.jobs[0].curve = Curve::new(vec![(1, f64::NAN)]);
    assert!(err_at(&i).starts_with("jobs[0] (id \"a\").curve[0]: value NaN is not a finite number"));

    let i = inst(4, vec![job("a", 1, 4, vec![0]), job("a", 1, 4, vec![])]);
    assert!(err_at(&i).contains("the same id appears twice"));

    let i = inst(4, vec![job("a", 1, 4, vec![4])]);
    assert!(err_at(&i).contains("node 4 is not one of the 4 nodes"));

    let mut i = inst(4, vec![job("a", 1, 4, vec![])]);
    i.t_fwd_s = 0.0;
    assert!(err_at(&i).starts_with("t_fwd_s:"));

    assert!(matches!(
        "nope".parse::<Objective>(),
        Err(AllocError::UnknownObjective(_))
    ));
    for o in Objective::ALL {
        assert_eq!(o.name().parse::<Objective>().unwrap(), o);
    }
}

#[test]
fn growing_jobs_get_the_lowest_free_nodes_in_job_order() {
    // Two identical new jobs and 8 nodes, node 2 held by "b": "a" (first) takes the
    // lowest free indices, "b" keeps node 2 and grows onto the next ones.
    let i = inst(8, vec![job("a", 1, 4, vec![]), job("b", 1, 4, vec![2])]);
    let s = solve(&i, &Options::default()).unwrap();
    assert_eq!(s.jobs, vec![vec![0, 1, 3, 4], vec![2, 5, 6, 7]]);
    // Same input, same output.
    assert_eq!(solve(&i, &Options::default()).unwrap(), s);
}

#[test]
fn long_lived_nodes_are_preferred() {
    let mut i = inst(6, vec![job("a", 1, 3, vec![])]);
    i.reclaim_in_s = vec![Some(5.0), None, Some(100.0), Some(1.0), None, Some(50.0)];
    let s = solve(&i, &Options::default()).unwrap();
    // Unknown (never reclaimed) first, then the latest reclaim time.
    assert_eq!(s.jobs[0], vec![1, 2, 4]);
}

#[test]
fn shrinking_job_keeps_a_subset_and_the_freed_node_is_reused() {
    // "a" holds 4 nodes but may now hold at most 2; "b" can use the rest.
    let i = inst(
        4,
        vec![job("a", 1, 2, vec![0, 1, 2, 3]), job("b", 1, 2, vec![])],
    );
    let s = solve(&i, &Options::default()).unwrap();
    assert_eq!(s.jobs, vec![vec![0, 1], vec![2, 3]]);
}

#[test]
fn reclaim_aware_gives_long_lived_nodes_to_costly_jobs() {
    // Both jobs grow by one node; one free node dies in 2 s, one lives on. The job with
    // the larger scale-down cost gets the long-lived node.
    let mut cheap = job("cheap", 1, 2, vec![0]);
    cheap.scale_down_s = 1.0;
    let mut costly = job("costly", 1, 2, vec![1]);
    costly.scale_down_s = 30.0;
    let mut i = inst(4, vec![cheap, costly]);
    i.t_fwd_s = 100.0;
    i.reclaim_in_s = vec![None, None, Some(2.0), None];
    let s = solve(&i, &Options::new(Objective::ReclaimAware)).unwrap();
    assert_eq!(s.jobs[1], vec![1, 3], "{s:?}");
}

#[test]
fn fairness_lifts_the_worst_job() {
    // 4 nodes, a fast and a slow job: BFTrainer gives all to the fast one, fairness
    // splits so that both reach the same share of their best throughput.
    let fast = JobInput::new(
        "fast",
        1,
        4,
        0.0,
        0.0,
        Curve::new(vec![(1, 1000.0), (4, 4000.0)]),
    );
    let slow = JobInput::new(
        "slow",
        1,
        4,
        0.0,
        0.0,
        Curve::new(vec![(1, 10.0), (4, 40.0)]),
    );
    let i = inst(4, vec![fast, slow]);
    let b = solve(&i, &Options::default()).unwrap();
    assert_eq!(b.counts(), vec![4, 0]);
    let f = solve(&i, &Options::new(Objective::Fairness)).unwrap();
    assert_eq!(f.counts(), vec![2, 2]);
    assert_eq!(f.fairness_level, Some(0.5));
}
