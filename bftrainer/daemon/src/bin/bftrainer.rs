//! The `bftrainer` command: offline tools, accounting, and the daemon's client.

use bftrainer_daemon::cmd;
use bftrainer_daemon::daemon::control::Op;
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
    /// Elastic usage from slurmdbd: node- and CPU-hours per elastic job (core and
    /// satellites), per user and account.
    Acct(cmd::acct::Args),
    /// bftrainerd's state: uptime, latencies, idle / lent / reserved nodes, jobs, errors.
    Status(cmd::ctl::StatusArgs),
    /// Elastic jobs: bounds, nodes (core and satellites), rate, grows, shrinks,
    /// preemptions, node-hours; `--history` for their size over time.
    Jobs(cmd::ctl::JobsArgs),
    /// Nodes of the elastic partitions: state, holder, reclaim forecast.
    Nodes(cmd::ctl::NodesArgs),
    /// Stop lending (admin): no admissions, no growth; running jobs keep their nodes.
    Pause(cmd::ctl::AdminArgs),
    /// Stop lending and shrink every elastic job to its core nodes (admin).
    Drain(cmd::ctl::AdminArgs),
    /// Lend idle nodes again after pause or drain (admin).
    Resume(cmd::ctl::AdminArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let res = match &cli.command {
        Command::Solve(a) => cmd::solve::run(a),
        Command::BenchAlloc(a) => cmd::bench_alloc::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Acct(a) => cmd::acct::run(a),
        Command::Status(a) => cmd::ctl::status(a),
        Command::Jobs(a) => cmd::ctl::jobs(a),
        Command::Nodes(a) => cmd::ctl::nodes(a),
        Command::Pause(a) => cmd::ctl::admin(a, Op::Pause),
        Command::Drain(a) => cmd::ctl::admin(a, Op::Drain),
        Command::Resume(a) => cmd::ctl::admin(a, Op::Resume),
    };
    if let Err(e) = res {
        eprintln!("bftrainer: error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    /// bftrainer(1) in docs/man (installed by scripts/make-deb) says what the commands
    /// and their options are.
    #[test]
    fn man_page_matches_the_options() {
        use clap::CommandFactory;
        bftrainer_testcluster::man::check(super::Cli::command(), "1", "bftrainer");
    }
}
