//! Latency of the per-node CPU and memory split (`alloc::synergy`, issue 34) over a whole
//! Summit-sized cluster of shared nodes, against the GPU-proportional split in the same
//! run. Ignored (it prints figures, asserts nothing about time); docs/benchmarks.md has the
//! command and the figures:
//!
//! ```text
//! cargo test -p bftrainer-core --test synergy_bench \
//!   --config 'profile.dev.package.bftrainer-core.opt-level=3' \
//!   --config 'profile.dev.package.bftrainer-core.debug-assertions=false' \
//!   --config 'profile.dev.package.bftrainer-core.overflow-checks=false' \
//!   -- --ignored --nocapture
//! ```
//!
//! The profile overrides compile this crate (engine and bench) at opt-level 3 without
//! building the release profile's HiGHS dev-dependency; its other dependencies are not on
//! the measured path.
//!
//! Cluster: 4,734 nodes x 6 GPUs, 42 CPUs (`SYNERGY_BENCH_CPUS`) and 512 GiB each (Summit); regular jobs hold
//! 0-5 GPUs of each node with their share of CPUs and memory (and a little more or less),
//! so every node is shared; 100 elastic jobs, each holding the free GPUs of its nodes in
//! 1-3 jobs per node. Half the jobs are data-bound (rate rising to 6-12 CPUs per GPU, a
//! dataset cache that gains up to 64 GiB per GPU), half compute-bound (saturated at 1-2
//! CPUs per GPU, no memory curve). Requests: 1-2 CPUs and 4-16 GiB per task, a task per GPU.

use bftrainer_core::alloc::synergy::{
    proportional, share_node, NodeFree, NodeShares, Sensitivity, ShareJob,
};
use rand::{Rng, SeedableRng};
use std::time::Instant;

const NODES: usize = 4734;
const GPUS: u32 = 6;
/// Summit's 42 cores; `SYNERGY_BENCH_CPUS` sets another count (fewer: CPUs scarcer).
fn cpus_per_node() -> u32 {
    std::env::var("SYNERGY_BENCH_CPUS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42)
}
const MEM_MIB: u64 = 512 * 1024;
const JOBS: usize = 100;

struct JobKind {
    sens: Sensitivity,
    cpus_per_task: u32,
    mem_mib_per_task: u64,
}

fn jobs(rng: &mut impl Rng) -> Vec<JobKind> {
    (0..JOBS)
        .map(|j| {
            let sens = if j % 2 == 0 {
                let top: f64 = rng.gen_range(6.0..12.0);
                let r: f64 = rng.gen_range(200.0..800.0);
                let cache: f64 = rng.gen_range(16.0..64.0) * 1024.0;
                Sensitivity {
                    cpu: vec![(1.0, r / top * 2.5), (top / 2.0, r * 0.8), (top, r)],
                    mem: vec![(4096.0, 0.6), (cache, 1.0)],
                }
            } else {
                let top: f64 = rng.gen_range(1.0..2.0);
                let r: f64 = rng.gen_range(100.0..400.0);
                Sensitivity {
                    cpu: vec![(top, r)],
                    mem: Vec::new(),
                }
            };
            JobKind {
                sens,
                cpus_per_task: rng.gen_range(1..=2),
                mem_mib_per_task: rng.gen_range(4..=16) * 1024,
            }
        })
        .collect()
}

fn cluster(seed: u64) -> Vec<(NodeFree, Vec<ShareJob>)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let all_cpus = cpus_per_node();
    let kinds = jobs(&mut rng);
    (0..NODES)
        .map(|_| {
            let regular = rng.gen_range(0..GPUS);
            let gpus = GPUS - regular;
            let share = f64::from(regular) / f64::from(GPUS);
            let noise: f64 = rng.gen_range(0.7..1.3);
            let cpus = all_cpus - ((f64::from(all_cpus) * share * noise) as u32).min(all_cpus);
            let mem = MEM_MIB - ((MEM_MIB as f64 * share * noise) as u64).min(MEM_MIB);
            let n_jobs = rng.gen_range(1..=gpus.min(3));
            // Split the free GPUs among n_jobs distinct jobs, each at least 1.
            let mut split = vec![1u32; n_jobs as usize];
            for _ in 0..gpus - n_jobs {
                split[rng.gen_range(0..n_jobs as usize)] += 1;
            }
            let mut picked: Vec<usize> = Vec::new();
            while picked.len() < n_jobs as usize {
                let j = rng.gen_range(0..JOBS);
                if !picked.contains(&j) {
                    picked.push(j);
                }
            }
            let jobs: Vec<ShareJob> = picked
                .iter()
                .zip(&split)
                .map(|(&j, &g)| ShareJob {
                    gpus: g,
                    tasks: g,
                    cpus_per_task: kinds[j].cpus_per_task,
                    mem_mib_per_task: kinds[j].mem_mib_per_task,
                    sensitivity: kinds[j].sens.clone(),
                })
                .collect();
            // Regular jobs that left less than the elastic requests: the requests win here
            // (the node decision would not have placed them otherwise).
            let need_c: u32 = jobs.iter().map(|j| j.tasks * j.cpus_per_task).sum();
            let need_m: u64 = jobs
                .iter()
                .map(|j| u64::from(j.tasks) * j.mem_mib_per_task)
                .sum();
            let node = NodeFree {
                cpus: cpus.max(need_c),
                mem_mib: mem.max(need_m),
                gpus,
            };
            (node, jobs)
        })
        .collect()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

type Rule = fn(&NodeFree, &[ShareJob]) -> Result<NodeShares, bftrainer_core::alloc::AllocError>;

/// One whole-cluster decision: fastest of `repeat` passes (ms), per-node times of the
/// fastest pass (us), and the summed value.
fn decide(c: &[(NodeFree, Vec<ShareJob>)], rule: Rule, repeat: usize) -> (f64, Vec<f64>, f64) {
    let mut best = f64::INFINITY;
    let mut best_nodes = Vec::new();
    let mut value = 0.0;
    for _ in 0..repeat {
        let mut nodes = Vec::with_capacity(c.len());
        let mut v = 0.0;
        let t0 = Instant::now();
        for (node, jobs) in c {
            let t = Instant::now();
            let r = rule(node, jobs).expect("valid instance");
            nodes.push(t.elapsed().as_secs_f64() * 1e6);
            v += r.value;
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if ms < best {
            best = ms;
            best_nodes = nodes;
            value = v;
        }
    }
    (best, best_nodes, value)
}

#[test]
#[ignore = "benchmark: prints figures (docs/benchmarks.md)"]
fn synergy_split_at_summit_scale() {
    let instances: u64 = std::env::var("SYNERGY_BENCH_INSTANCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let repeat = 5;
    let mut rows: Vec<(&str, Rule)> = vec![
        ("gpu-proportional", proportional as Rule),
        ("sensitivity", share_node as Rule),
    ];
    let mut out = Vec::new();
    let clusters: Vec<_> = (1..=instances).map(cluster).collect();
    let jobs_per_node: f64 = clusters
        .iter()
        .flat_map(|c| c.iter().map(|n| n.1.len() as f64))
        .sum::<f64>()
        / (instances as f64 * NODES as f64);
    println!(
        "{instances} clusters of {NODES} shared nodes x {GPUS} GPUs and {} CPUs, {JOBS} elastic \
         jobs ({jobs_per_node:.2} per node on average); a decision = every node split, \
         fastest of {repeat} passes",
        cpus_per_node()
    );
    println!(
        "{:>18} {:>10} {:>10} {:>10} {:>14} {:>14} {:>12}",
        "rule", "p50 ms", "p99 ms", "max ms", "node p50 us", "node p99 us", "mean value"
    );
    for (name, rule) in rows.drain(..) {
        let mut ms = Vec::new();
        let mut node_us = Vec::new();
        let mut value = 0.0;
        for c in &clusters {
            let (t, n, v) = decide(c, rule, repeat);
            ms.push(t);
            node_us.extend(n);
            value += v;
        }
        let (p50, p99, max) = (pct(&mut ms, 0.5), pct(&mut ms, 0.99), pct(&mut ms, 1.0));
        let (n50, n99) = (pct(&mut node_us, 0.5), pct(&mut node_us, 0.99));
        let mean = value / instances as f64;
        println!(
            "{name:>18} {p50:>10.3} {p99:>10.3} {max:>10.3} {n50:>14.3} {n99:>14.3} {mean:>12.5e}"
        );
        out.push((p99, mean));
    }
    println!(
        "p99 sensitivity / gpu-proportional: {:.2}; value sensitivity / gpu-proportional: {:.3}",
        out[1].0 / out[0].0,
        out[1].1 / out[0].1
    );
}
