//! The `bftrainer` command: offline tools and (later) the daemon's client.

use bftrainer_daemon::cmd;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bftrainer",
    version,
    about = "BFTrainer for Slurm: harvest idle nodes for elastic training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Solve one allocation instance read from stdin; print the allocation as JSON.
    Solve(cmd::solve::Args),
    /// Measure allocator decision latency on generated instances; print a table.
    BenchAlloc(cmd::bench_alloc::Args),
    /// Replay a node-event trace or job log through the engine; print a harvest report.
    Replay(Box<cmd::replay::Args>),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let res = match &cli.command {
        Command::Solve(a) => cmd::solve::run(a),
        Command::BenchAlloc(a) => cmd::bench_alloc::run(a),
        Command::Replay(a) => cmd::replay::run(a),
    };
    if let Err(e) = res {
        eprintln!("bftrainer: error: {e:#}");
        std::process::exit(1);
    }
}
