//! bftrainerd: the live harvester beside slurmctld. Runs in the foreground (systemd:
//! conf/bftrainerd.service); docs/admin.md explains its config, logs and recovery.

use clap::Parser;
use std::path::PathBuf;

/// job_submit/bftrainer's own reading of `[policy]`, the same source: the plugin is a
/// cdylib that nothing may link, and the preflight must check what slurmctld will read.
#[path = "../../../../plugin/job_submit/src/config.rs"]
#[allow(dead_code, unused_imports)]
mod plugin_policy;

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
    /// Check the config file as bftrainerd and as the job_submit plugin read it (users
    /// looked up), print what the plugin will enforce, and exit (2 on an error).
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
        if let Err(e) = bftrainer_daemon::daemon::config::load(&path) {
            eprintln!("bftrainerd: {e}");
            std::process::exit(2);
        }
        match plugin_policy::load(&path, &plugin_policy::uid_of) {
            Ok(p) => {
                if let Some(why) = p.unavailable() {
                    eprintln!("bftrainerd: job_submit/bftrainer would refuse elastic jobs: {why}");
                    std::process::exit(2);
                }
                let all = |v: &[String]| {
                    if v.is_empty() {
                        "all".to_string()
                    } else {
                        v.join(",")
                    }
                };
                println!(
                    "{}: ok (job_submit/bftrainer: partition={} satellite_partition={} max_nodes={} users={} accounts={} daemon_user={} hold={})",
                    path.display(),
                    p.partition,
                    p.satellite_partition,
                    p.max_nodes.map_or("none".to_string(), |n| n.to_string()),
                    all(&p.allowed_users),
                    all(&p.allowed_accounts),
                    p.daemon_user,
                    p.hold
                );
            }
            Err(e) => {
                eprintln!("bftrainerd: job_submit/bftrainer would refuse this file: {e}");
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

#[cfg(test)]
mod tests {
    /// bftrainerd(8) in docs/man (installed by scripts/make-deb) says what the options are.
    #[test]
    fn man_page_matches_the_options() {
        use clap::CommandFactory;
        bftrainer_testcluster::man::check(super::Args::command(), "8", "bftrainerd");
    }
}
