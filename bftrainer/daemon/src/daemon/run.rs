//! Running bftrainerd as a service: lock, journal, the tokio poll loop, signals.
//! SIGTERM/SIGINT stop it cleanly (satellites stay: the next start adopts them);
//! SIGHUP re-reads the config (a bad one is logged and the old one kept).

use super::cluster::SlurmCluster;
use super::config;
use super::journal::{Journal, Lock};
use super::Daemon;
use anyhow::Context;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{signal, SignalKind};

pub const STATUS_FILE: &str = "status.json";

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs the daemon in the foreground until SIGTERM/SIGINT.
pub fn run(config_path: &Path) -> anyhow::Result<()> {
    let cfg = config::load(config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lock = Lock::acquire(&cfg.state_dir)?;
    let slurm = bftrainer_slurm::Slurm::init().context("libslurm")?;
    let (journal, records) = Journal::open(&cfg.state_dir)?;
    log::info!(
        "bftrainerd {} starting: config {}, state in {}, partitions {}, poll every {:?}",
        env!("CARGO_PKG_VERSION"),
        cfg.path.display(),
        cfg.state_dir.display(),
        cfg.elastic_partitions().join(","),
        cfg.poll_interval
    );
    let daemon = Daemon::new(cfg, SlurmCluster::new(slurm), Some(journal), &records)?;
    drop(records);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let r = rt.block_on(main_loop(daemon, config_path.to_path_buf()));
    drop(lock);
    r
}

async fn main_loop(
    mut daemon: Daemon<SlurmCluster>,
    config_path: std::path::PathBuf,
) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut interval = tokio::time::interval(daemon.cfg.poll_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status_path = daemon.cfg.state_dir.join(STATUS_FILE);
    loop {
        tokio::select! {
            _ = term.recv() => { log::info!("SIGTERM: stopping; satellites and jobs stay, the next start adopts them"); break; }
            _ = int.recv() => { log::info!("SIGINT: stopping"); break; }
            _ = hup.recv() => {
                match config::load(&config_path) {
                    Ok(cfg) => {
                        let poll = cfg.poll_interval;
                        daemon.reconfigure(cfg);
                        if poll != interval.period() {
                            interval = tokio::time::interval(poll);
                            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                    }
                    Err(e) => log::error!("SIGHUP: {e}; keeping the previous config"),
                }
            }
            _ = interval.tick() => {
                // Slurm calls block: run the cycle off the async thread.
                let status_path = status_path.clone();
                let (d, r) = tokio::task::spawn_blocking(move || {
                    let t0 = std::time::Instant::now();
                    let now = unix_now();
                    let r = daemon.cycle(now);
                    if let Ok(rep) = &r {
                        if rep.slurm_ok {
                            write_status(&daemon, now, &status_path);
                        }
                        let took = t0.elapsed();
                        if took > Duration::from_secs(1) {
                            log::warn!("a cycle took {took:?}");
                        }
                    }
                    (daemon, r)
                })
                .await
                .context("cycle task")?;
                daemon = d;
                // An engine or journal failure is fatal: acting on a state the journal
                // does not hold would break recovery.
                r?;
            }
        }
    }
    Ok(())
}

fn write_status(d: &Daemon<SlurmCluster>, now: f64, path: &Path) {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(&d.status(now)).unwrap_or_default();
    if std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .is_err()
    {
        log::debug!("could not write {}", path.display());
    }
}
