//! bftrainerd: the live harvester beside slurmctld. Runs in the foreground (systemd:
//! conf/bftrainerd.service); docs/admin.md explains its config, logs and recovery.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "bftrainerd",
    version,
    about = "BFTrainer for Slurm: lends idle nodes to elastic jobs"
)]
struct Args {
    /// bftrainer.toml (default: $BFTRAINER_CONFIG, else bftrainer.toml beside slurm.conf,
    /// else /etc/slurm/bftrainer.toml; the same file the job_submit plugin reads).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Check the config file and exit.
    #[arg(long)]
    check_config: bool,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let args = Args::parse();
    let path = args.config.unwrap_or_else(default_config);
    if args.check_config {
        match bftrainer_daemon::daemon::config::load(&path) {
            Ok(_) => println!("{}: ok", path.display()),
            Err(e) => {
                eprintln!("bftrainerd: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    if let Err(e) = bftrainer_daemon::daemon::run::run(&path) {
        log::error!("{e:#}");
        eprintln!("bftrainerd: {e:#}");
        std::process::exit(1);
    }
}

fn default_config() -> PathBuf {
    if let Some(p) = std::env::var_os("BFTRAINER_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let conf = bftrainer_slurm::config_path();
    if let Some(dir) = conf.parent() {
        let p = dir.join("bftrainer.toml");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from("/etc/slurm/bftrainer.toml")
}
