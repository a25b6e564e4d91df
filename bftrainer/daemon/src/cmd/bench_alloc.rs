//! `bftrainer bench-alloc`: decision latency of the exact allocator on generated
//! instances (alloc::gen), p50/p99 per size, as a table.

use bftrainer_core::alloc::gen::{generate, GenParams};
use bftrainer_core::alloc::{solve_with_stats, Objective, Options};
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sizes as NODESxJOBS, comma-separated.
    #[arg(long, default_value = "64x10,512x10,4734x10,4734x100,10000x1000")]
    pub sizes: String,
    /// Instances per size (each a different seed).
    #[arg(long, default_value_t = 200)]
    pub instances: usize,
    /// Objective to solve.
    #[arg(long, default_value = "bftrainer")]
    pub objective: String,
    /// Share of nodes with a predicted reclaim time.
    #[arg(long, default_value_t = 0.0)]
    pub reclaim_share: f64,
    /// Share of jobs with per-batch-size curves.
    #[arg(long, default_value_t = 0.0)]
    pub batch_share: f64,
    /// Cold instances (random current allocations) instead of event-driven ones.
    #[arg(long)]
    pub cold: bool,
    /// Solves per instance; an instance's latency is the fastest of them, so that other
    /// load on the machine does not pass for solver time.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// GPUs per node: above 1, each size is also solved in GPU slots (NODES x this
    /// many units, packed by host), after its whole-node instance of the same seeds as
    /// the baseline, and the ratio of their p99 is printed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus_per_node: u32,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn parse_size(s: &str) -> anyhow::Result<(u32, usize)> {
    let (n, j) = s
        .trim()
        .split_once('x')
        .ok_or_else(|| anyhow::anyhow!("size {s:?}: expected NODESxJOBS, e.g. 4734x100"))?;
    Ok((
        n.parse()
            .map_err(|e| anyhow::anyhow!("size {s:?}: nodes: {e}"))?,
        j.parse()
            .map_err(|e| anyhow::anyhow!("size {s:?}: jobs: {e}"))?,
    ))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let objective: Objective = args.objective.parse()?;
    anyhow::ensure!(args.instances > 0, "--instances must be >= 1");
    let sizes = args
        .sizes
        .split(',')
        .map(parse_size)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opts = Options::new(objective);
    println!(
        "objective {objective}; {} {} instances per size, latency = fastest of {} solves; seeds from {}",
        args.instances,
        if args.cold { "cold" } else { "event-driven" },
        args.repeat.max(1),
        args.seed
    );
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>12}",
        "nodes x jobs", "p50 ms", "p99 ms", "max ms", "mean value"
    );
    let kinds: &[u32] = if args.gpus_per_node > 1 {
        &[1, args.gpus_per_node]
    } else {
        &[1]
    };
    for (n, j) in sizes {
        let mut p99 = Vec::new();
        for &gpus in kinds {
            p99.push(bench_size(args, &opts, n, j, gpus)?);
        }
        if let [node, slots] = p99[..] {
            println!(
                "{:>12} p99 GPU slots / whole nodes: {:.2}",
                format!("{n}x{j}"),
                slots / node
            );
        }
    }
    Ok(())
}

/// One row: `instances` instances of n nodes x j jobs, in GPU slots when `gpus` > 1;
/// returns the p99 in ms.
fn bench_size(args: &Args, opts: &Options, n: u32, j: usize, gpus: u32) -> anyhow::Result<f64> {
    {
        let mut times = Vec::with_capacity(args.instances);
        let mut value = 0.0;
        let mut units = 0u64;
        for k in 0..args.instances {
            let mut p = GenParams::new(n, j, args.seed + k as u64);
            p.reclaim_share = args.reclaim_share;
            p.batch_share = args.batch_share;
            p.warm = !args.cold;
            p.gpus_per_node = gpus;
            let inst = generate(&p);
            units += u64::from(inst.n_nodes);
            let mut ms = f64::INFINITY;
            let mut out = None;
            for _ in 0..args.repeat.max(1) {
                let t = Instant::now();
                let r = solve_with_stats(&inst, opts)?;
                ms = ms.min(t.elapsed().as_secs_f64() * 1e3);
                out = Some(r);
            }
            let (sol, st) = out.expect("at least one solve");
            times.push(ms);
            log::debug!(
                "{n}x{gpus}x{j} seed {}: {ms:.3} ms, value {}, {st:?}",
                args.seed + k as u64,
                sol.objective_value
            );
            value += sol.objective_value;
        }
        times.sort_by(f64::total_cmp);
        let label = if gpus > 1 {
            format!("{n}x{gpus}x{j}")
        } else {
            format!("{n}x{j}")
        };
        println!(
            "{:>12} {:>10.3} {:>10.3} {:>10.3} {:>12.4e}{}",
            label,
            pct(&times, 0.5),
            pct(&times, 0.99),
            times[times.len() - 1],
            value / args.instances as f64,
            if gpus > 1 {
                format!("  ({} GPU slots on average)", units / args.instances as u64)
            } else {
                String::new()
            }
        );
        Ok(pct(&times, 0.99))
    }
}
