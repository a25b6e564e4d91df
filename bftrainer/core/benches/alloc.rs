//! Allocator decision latency, and the HiGHS MILP on the same instances for comparison.
//! `cargo bench -p bftrainer-core --bench alloc` prints the side-by-side table first
//! (ALLOC_BENCH_SIZES=64x10,512x10 to narrow it), then runs the criterion benchmarks.

#[path = "../tests/alloc_support/mod.rs"]
mod alloc_support;

use bftrainer_core::alloc::gen::{generate, GenParams};
use bftrainer_core::alloc::{solve, Instance, Objective, Options};
use criterion::{BenchmarkId, Criterion};
use std::time::Instant;

const SIZES: &str = "64x10,512x10,4734x10,4734x100,10000x1000";
/// BFTrainer's own per-event MILP time limit.
const MILP_LIMIT_S: f64 = 10.0;

fn sizes() -> Vec<(u32, usize)> {
    std::env::var("ALLOC_BENCH_SIZES")
        .unwrap_or_else(|_| SIZES.to_string())
        .split(',')
        .map(|s| {
            let (n, j) = s.split_once('x').expect("size as NODESxJOBS");
            (n.parse().expect("nodes"), j.parse().expect("jobs"))
        })
        .collect()
}

fn instance(n: u32, j: usize, seed: u64) -> Instance {
    generate(&GenParams::new(n, j, seed))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

fn table() {
    let opts = Options::default();
    let ours_n: usize = std::env::var("ALLOC_BENCH_INSTANCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let milp_n: usize = std::env::var("ALLOC_BENCH_MILP_INSTANCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!(
        "event-driven instances (alloc::gen), ours: {ours_n} per size, best of 5 solves each;"
    );
    println!(
        "HiGHS MILP (1 thread, {MILP_LIMIT_S} s limit): first {milp_n} of them, one solve each"
    );
    println!(
        "{:>12} {:>10} {:>10} {:>12} {:>12} {:>10} {:>12}",
        "nodes x jobs", "ours p50", "ours p99", "MILP p50", "MILP solved", "ratio", "same value"
    );
    for (n, j) in sizes() {
        let mut ours = Vec::new();
        let mut values = Vec::new();
        for k in 0..ours_n {
            let inst = instance(n, j, 1 + k as u64);
            let mut best = f64::INFINITY;
            let mut v = 0.0;
            for _ in 0..5 {
                let t = Instant::now();
                v = solve(&inst, &opts).unwrap().objective_value;
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            ours.push(best);
            values.push(v);
        }
        let mut milp = Vec::new();
        let mut same = 0;
        for (k, &ours_value) in values.iter().enumerate().take(milp_n) {
            let inst = instance(n, j, 1 + k as u64);
            let t = Instant::now();
            let r = alloc_support::milp(&inst, Objective::Bftrainer, MILP_LIMIT_S);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if let Some(v) = r {
                milp.push(ms);
                if (v - ours_value).abs() <= 1e-6 * (1.0 + v.abs()) {
                    same += 1;
                }
            }
        }
        let (o50, o99) = (pct(&mut ours.clone(), 0.5), pct(&mut ours, 0.99));
        let (m50, ratio) = if milp.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let m = pct(&mut milp, 0.5);
            (format!("{m:.1}"), format!("{:.0}x", m / o50))
        };
        println!(
            "{:>12} {:>10.3} {:>10.3} {:>12} {:>12} {:>10} {:>12}",
            format!("{n}x{j}"),
            o50,
            o99,
            m50,
            format!("{}/{}", milp.len(), milp_n.min(ours_n)),
            ratio,
            format!("{same}/{}", milp.len())
        );
    }
}

fn criterion_benches(c: &mut Criterion) {
    let opts = Options::default();
    let mut g = c.benchmark_group("alloc_solve");
    for (n, j) in sizes() {
        let insts: Vec<Instance> = (0..8).map(|k| instance(n, j, 1 + k)).collect();
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{n}x{j}")),
            &insts,
            |b, insts| {
                let mut k = 0;
                b.iter(|| {
                    k = (k + 1) % insts.len();
                    solve(&insts[k], &opts).unwrap()
                })
            },
        );
    }
    g.finish();
}

fn main() {
    if std::env::var("ALLOC_BENCH_SKIP_TABLE").is_err() {
        table();
    }
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
}
