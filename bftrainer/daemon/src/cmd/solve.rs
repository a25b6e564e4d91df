//! `bftrainer solve`: read one allocation instance (JSON, docs/solve.md) from stdin and
//! print the optimal allocation as JSON on stdout.

use anyhow::Context;
use bftrainer_core::alloc::{evaluate, io, solve, Objective, Options, Solution};
use bftrainer_core::engine::fair;
use std::io::Read;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to maximise: bftrainer, efficiency, fairness, remaining-work, reclaim-aware.
    #[arg(long, default_value = "bftrainer")]
    pub objective: String,
    /// Forward-looking time Tfwd in seconds; overrides the instance's `t_fwd_s`.
    #[arg(long = "t-fwd", value_name = "S")]
    pub t_fwd: Option<f64>,
    /// Print the JSON on one line instead of pretty-printed.
    #[arg(long)]
    pub compact: bool,
    /// Solve the instance as given: declared curves weigh against each other as they
    /// are, with no per-user shares (bftrainerd with `fair_share = false`).
    #[arg(long)]
    pub no_fair_share: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let objective: Objective = args.objective.parse()?;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the instance from stdin")?;
    let mut named = io::parse_instance(&text)?;
    if let Some(t) = args.t_fwd {
        named.instance.t_fwd_s = t;
    }
    let started = std::time::Instant::now();
    let sol = if args.no_fair_share {
        solve(&named.instance, &Options::new(objective))?
    } else {
        // bftrainerd's rule (docs/design.md, "Fair shares"): normalised curves, each
        // user's jobs within the user's share; a job with no share gets no nodes.
        let mut fair = named.instance.clone();
        let keep = fair::fair_instance(&mut fair, &named.users, &named.user_weights);
        fair.validate(objective)?;
        let mut sub = fair.clone();
        sub.jobs = fair
            .jobs
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(j, _)| j.clone())
            .collect();
        let part = solve(&sub, &Options::new(objective))?;
        let (mut sets, mut batches) = (part.jobs.into_iter(), part.batch_sizes.into_iter());
        let mut sol = Solution {
            objective_value: 0.0,
            jobs: Vec::new(),
            batch_sizes: Vec::new(),
            fairness_level: part.fairness_level,
        };
        for &k in &keep {
            sol.jobs.push(if k {
                sets.next().unwrap_or_default()
            } else {
                Vec::new()
            });
            sol.batch_sizes
                .push(if k { batches.next().flatten() } else { None });
        }
        // Scored on the instance the allocator saw (normalised curves, shares).
        sol.objective_value = evaluate(&fair, objective, &sol.jobs).unwrap_or(part.objective_value);
        sol
    };
    log::info!(
        "solved {} nodes x {} jobs ({objective}) in {:.3} ms",
        named.instance.n_nodes,
        named.instance.jobs.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let out = io::solution_json(&named, objective, &sol);
    let text = if args.compact {
        serde_json::to_string(&out)?
    } else {
        serde_json::to_string_pretty(&out)?
    };
    println!("{text}");
    Ok(())
}
