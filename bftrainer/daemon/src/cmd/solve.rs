//! `bftrainer solve`: read one allocation instance (JSON, docs/solve.md) from stdin and
//! print the optimal allocation as JSON on stdout.

use anyhow::Context;
use bftrainer_core::alloc::{io, solve, Objective, Options};
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
    let sol = solve(&named.instance, &Options::new(objective))?;
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
