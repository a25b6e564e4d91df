//! Property tests of the per-node CPU and memory split (`alloc::synergy`, issue 34): it
//! never exceeds the node's free CPUs, memory or GPUs; it never goes below a job's own
//! request; with equal sensitivities it is exactly the GPU-proportional split; and its
//! value lies within its stated bound (checked against brute force on small nodes).

use bftrainer_core::alloc::synergy::{
    proportional, rate, share_node, NodeFree, Sensitivity, ShareJob,
};
use proptest::prelude::*;

/// A concave nondecreasing curve through the origin: 1-5 points, x steps of a quarter to
/// 4, slopes drawn and sorted descending (the last may be 0: saturation).
fn curve(x_scale: f64) -> impl Strategy<Value = Vec<(f64, f64)>> {
    prop::collection::vec((1u32..=16, 0u32..=400), 1..=5).prop_map(move |v| {
        let mut slopes: Vec<u32> = v.iter().map(|p| p.1).collect();
        slopes.sort_unstable_by(|a, b| b.cmp(a));
        let (mut x, mut y) = (0.0, 0.0);
        v.iter()
            .zip(slopes)
            .map(|(p, s)| {
                let dx = f64::from(p.0) / 4.0 * x_scale;
                x += dx;
                y += f64::from(s) / 4.0 * dx / x_scale;
                (x, y)
            })
            .collect()
    })
}

fn mem_curve() -> impl Strategy<Value = Vec<(f64, f64)>> {
    prop_oneof![
        Just(Vec::new()),
        curve(4096.0).prop_filter("ends above 0", |c| c.last().unwrap().1 > 0.0),
    ]
}

fn job(cpu: Vec<(f64, f64)>, mem: Vec<(f64, f64)>) -> impl Strategy<Value = ShareJob> {
    (1u32..=3, 0u32..=4, 0u64..=8192).prop_flat_map(move |(gpus, cpt, mpt)| {
        let (cpu, mem) = (cpu.clone(), mem.clone());
        (1..=gpus).prop_map(move |tasks| ShareJob {
            gpus,
            tasks,
            cpus_per_task: cpt,
            mem_mib_per_task: mpt,
            sensitivity: Sensitivity {
                cpu: cpu.clone(),
                mem: mem.clone(),
            },
        })
    })
}

fn any_job() -> impl Strategy<Value = ShareJob> {
    (curve(1.0), mem_curve()).prop_flat_map(|(c, m)| job(c, m))
}

fn floors(jobs: &[ShareJob]) -> (u64, u64, u32) {
    let c = jobs
        .iter()
        .map(|j| u64::from(j.tasks * j.cpus_per_task))
        .sum();
    let m = jobs
        .iter()
        .map(|j| u64::from(j.tasks) * j.mem_mib_per_task)
        .sum();
    (c, m, jobs.iter().map(|j| j.gpus).sum())
}

/// A node the jobs' requests fit on, with 0-48 CPUs and 0-200 GiB more free.
fn node_for(jobs: Vec<ShareJob>) -> impl Strategy<Value = (NodeFree, Vec<ShareJob>)> {
    let (c, m, g) = floors(&jobs);
    (0u32..=48, 0u64..=200 * 1024, 0u32..=2).prop_map(move |(dc, dm, dg)| {
        let node = NodeFree {
            cpus: c as u32 + dc,
            mem_mib: m + dm,
            gpus: g + dg,
        };
        (node, jobs.clone())
    })
}

fn any_node() -> impl Strategy<Value = (NodeFree, Vec<ShareJob>)> {
    prop::collection::vec(any_job(), 1..=4).prop_flat_map(node_for)
}

/// Jobs with one sensitivity (`with_mem`: a memory curve too).
fn equal_jobs(with_mem: bool) -> impl Strategy<Value = Vec<ShareJob>> {
    let mem = if with_mem {
        mem_curve().boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    (curve(1.0), mem, 1usize..=4).prop_flat_map(|(c, m, n)| prop::collection::vec(job(c, m), n))
}

fn check_limits(
    node: &NodeFree,
    jobs: &[ShareJob],
    shares: &[bftrainer_core::alloc::synergy::Share],
) {
    assert_eq!(shares.len(), jobs.len());
    let cpus: u64 = shares.iter().map(|s| u64::from(s.cpus)).sum();
    let mem: u64 = shares.iter().map(|s| s.mem_mib).sum();
    let gpus: u32 = jobs.iter().map(|j| j.gpus).sum();
    assert!(
        cpus <= u64::from(node.cpus),
        "{cpus} CPUs on a node with {}",
        node.cpus
    );
    assert!(
        mem <= node.mem_mib,
        "{mem} MiB on a node with {}",
        node.mem_mib
    );
    assert!(
        gpus <= node.gpus,
        "{gpus} GPUs on a node with {}",
        node.gpus
    );
    for (j, (job, s)) in jobs.iter().zip(shares).enumerate() {
        assert!(
            s.cpus >= job.tasks * job.cpus_per_task,
            "job {j}: {s:?} under its request"
        );
        assert!(
            s.mem_mib >= u64::from(job.tasks) * job.mem_mib_per_task,
            "job {j}: {s:?} under its request"
        );
    }
}

/// The steepest slope of a job's CPU curve: what one CPU less can cost it at most.
fn max_slope(j: &ShareJob) -> f64 {
    j.sensitivity.cpu[0].1 / j.sensitivity.cpu[0].0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Never over the node's free CPUs, memory or GPUs; never under a job's request.
    #[test]
    fn within_the_node_and_above_every_request((node, jobs) in any_node()) {
        for r in [share_node(&node, &jobs).unwrap(), proportional(&node, &jobs).unwrap()] {
            check_limits(&node, &jobs, &r.shares);
        }
    }

    /// Equal sensitivities, any requests: exactly the GPU-proportional split.
    #[test]
    fn equal_sensitivities_give_the_proportional_split(
        (node, jobs) in equal_jobs(false).prop_flat_map(node_for)
    ) {
        let s = share_node(&node, &jobs).unwrap();
        let p = proportional(&node, &jobs).unwrap();
        prop_assert_eq!(&s.shares, &p.shares);
    }

    /// Equal sensitivities over CPUs and memory: the proportional split again, where no
    /// request is above its proportional share. (A request above it, on the rising part of
    /// the memory curve, makes that job faster per CPU, and the rule rightly gives it more
    /// CPUs: the same sensitivity, a different state.)
    #[test]
    fn equal_cpu_and_memory_sensitivities_give_the_proportional_split(
        jobs in equal_jobs(true),
        dc in 0u32..=48,
        dm in 0u64..=200 * 1024,
    ) {
        let g: u64 = jobs.iter().map(|j| u64::from(j.gpus)).sum();
        // Capacity at which every request is at most its share: request * G / g_j.
        let need = |f: &dyn Fn(&ShareJob) -> u64| {
            jobs.iter().map(|j| (f(j) * g).div_ceil(u64::from(j.gpus))).max().unwrap()
        };
        let node = NodeFree {
            cpus: need(&|j| u64::from(j.tasks * j.cpus_per_task)) as u32 + dc,
            mem_mib: need(&|j| u64::from(j.tasks) * j.mem_mib_per_task) + dm,
            gpus: g as u32,
        };
        let s = share_node(&node, &jobs).unwrap();
        let p = proportional(&node, &jobs).unwrap();
        prop_assert_eq!(&s.shares, &p.shares);
    }

    /// The value is within the stated bound: at most `upper_bound`; with no memory curves,
    /// at least `upper_bound` less one CPU's steepest gain per job.
    #[test]
    fn value_within_its_bound((node, jobs) in any_node()) {
        let s = share_node(&node, &jobs).unwrap();
        let eps = 1e-9 * s.upper_bound.max(1.0);
        prop_assert!(s.value <= s.upper_bound + eps, "{} > {}", s.value, s.upper_bound);
        let p = proportional(&node, &jobs).unwrap();
        prop_assert!(p.value <= s.upper_bound + eps);
        if jobs.iter().all(|j| j.sensitivity.mem.is_empty()) {
            let slack: f64 = jobs.iter().map(max_slope).sum();
            prop_assert!(s.value >= s.upper_bound - slack - eps,
                "{} < {} - {slack}", s.value, s.upper_bound);
        }
    }

    /// Against brute force over every integer CPU split of a small node (no memory
    /// curves): the optimum is within the bound, and the rule within one CPU per job of it.
    #[test]
    fn near_the_brute_force_optimum(
        (node, jobs) in prop::collection::vec(
            curve(1.0).prop_flat_map(|c| job(c, Vec::new())), 1..=3
        ).prop_flat_map(node_for)
    ) {
        let s = share_node(&node, &jobs).unwrap();
        let floor: Vec<u32> = jobs.iter().map(|j| j.tasks * j.cpus_per_task).collect();
        let mut best = 0.0f64;
        let mut c = floor.clone();
        // Odometer over c_j in floor_j..=cpus with sum <= cpus.
        loop {
            if c.iter().sum::<u32>() <= node.cpus {
                let v: f64 = jobs.iter().zip(&c)
                    .map(|(j, &c)| rate(&j.sensitivity, j.gpus, f64::from(c), 1.0))
                    .sum();
                best = best.max(v);
            }
            let mut k = 0;
            while k < c.len() {
                c[k] += 1;
                if c[k] <= node.cpus { break; }
                c[k] = floor[k];
                k += 1;
            }
            if k == c.len() { break; }
        }
        let eps = 1e-9 * best.max(1.0);
        prop_assert!(best <= s.upper_bound + eps, "optimum {best} above the bound {}", s.upper_bound);
        let slack: f64 = jobs.iter().map(max_slope).sum();
        prop_assert!(s.value >= best - slack - eps, "{} vs optimum {best}", s.value);
        prop_assert!(s.value <= best + eps, "{} above the optimum {best}", s.value);
    }
}

/// Any f64 (NaN, infinities, subnormals, huge) and any integer.
fn wild_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(1e-300),
        Just(1e300),
        0.0f64..100.0,
    ]
}

fn wild_job() -> impl Strategy<Value = ShareJob> {
    (
        prop_oneof![0u32..=4, any::<u32>()],
        prop_oneof![0u32..=4, any::<u32>()],
        prop_oneof![0u32..=4, any::<u32>()],
        prop_oneof![0u64..=8192, any::<u64>()],
        prop::collection::vec((wild_f64(), wild_f64()), 0..=4),
        prop::collection::vec((wild_f64(), wild_f64()), 0..=3),
    )
        .prop_map(|(gpus, tasks, cpt, mpt, cpu, mem)| ShareJob {
            gpus,
            tasks,
            cpus_per_task: cpt,
            mem_mib_per_task: mpt,
            sensitivity: Sensitivity { cpu, mem },
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Hostile input: never a panic (or a hang); an error, or a split within the node
    /// and above every request.
    #[test]
    fn any_input_is_refused_or_split_within_limits(
        jobs in prop::collection::vec(wild_job(), 0..=4),
        cpus in prop_oneof![0u32..=64, any::<u32>()],
        mem in prop_oneof![0u64..=1 << 20, any::<u64>()],
        gpus in prop_oneof![0u32..=8, any::<u32>()],
    ) {
        let node = NodeFree { cpus, mem_mib: mem, gpus };
        for r in [share_node(&node, &jobs), proportional(&node, &jobs)].into_iter().flatten() {
            check_limits(&node, &jobs, &r.shares);
        }
    }
}
