//! Running bftrainerd as a service: lock, journal, the tokio poll loop, the control
//! socket and metrics endpoint, signals. SIGTERM/SIGINT stop it cleanly (satellites
//! stay: the next start adopts them); SIGHUP re-reads the config (a bad one is logged
//! and the old one kept).

use super::cluster::SlurmCluster;
use super::config;
use super::control::{self, AdminCmd, Shared};
use super::journal::{Journal, Lock};
use super::metrics::Metrics;
use super::view::Snapshot;
use super::Daemon;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

pub const STATUS_FILE: &str = "status.json";
/// `status.json` is rewritten at least this often (seconds), and after any cycle that
/// saw or did something.
pub const STATUS_EVERY_S: f64 = 5.0;

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Refuses to start against a slurmctld of another release than the libslurm we were
/// built with: struct layouts and the protocol are per release. A controller that
/// cannot be reached now is only a warning (the poll loop reports it as it goes).
fn check_controller_release(slurm: &bftrainer_slurm::Slurm) -> anyhow::Result<()> {
    match slurm.check_controller_release() {
        Ok(()) => Ok(()),
        Err(e @ bftrainer_slurm::Error::Release(_)) => Err(anyhow::anyhow!("{e}")),
        Err(e) if e.is_protocol_error() => Err(anyhow::anyhow!("{e}")),
        Err(e) => {
            log::warn!(
                "cannot check slurmctld's release now ({e}); built against Slurm {}",
                bftrainer_slurm::built_release()
            );
            Ok(())
        }
    }
}

/// Runs the daemon in the foreground until SIGTERM/SIGINT.
pub fn run(config_path: &Path) -> anyhow::Result<()> {
    let cfg = config::load(config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lock = Lock::acquire(&cfg.state_dir)?;
    let slurm = bftrainer_slurm::Slurm::init().context("libslurm")?;
    check_controller_release(&slurm)?;
    // The partitions must exist, satellites a tier below cores; a controller that does
    // not answer now is only a warning (the poll loop reports it as it goes).
    match slurm.load_partitions(None) {
        Ok(bftrainer_slurm::Loaded::Changed(p)) => {
            config::check_partitions(&cfg, &p.partitions).map_err(|m| anyhow::anyhow!(m))?
        }
        Ok(_) => {}
        Err(e) => log::warn!("cannot check the partitions now ({e}); slurmctld will be polled"),
    }
    // Root and SlurmUser may use the admin verbs.
    let mut admins = vec![0u32];
    match slurm.slurm_user_id() {
        Ok(u) if u != 0 => admins.push(u),
        Ok(_) => {}
        Err(e) => log::warn!(
            "SlurmUser unknown ({e}): only root may pause, drain or resume until the next start"
        ),
    }
    let lease = match &cfg.lease_dir {
        Some(dir) => Some(wait_for_lease(dir, cfg.lease_s, cfg.poll_interval)?),
        None => {
            log::warn!(
                "no [daemon] lease_dir: nothing keeps a second bftrainerd of this cluster (another \
                 host or state_dir) from acting too; running cores are adopted, not requeued, but \
                 two daemons contend for nodes. Set lease_dir to a directory every candidate host \
                 sees (slurmctld's StateSaveLocation) for one active daemon and a standby"
            );
            None
        }
    };
    let (journal, records) = Journal::open(&cfg.state_dir)?;
    log::info!(
        "bftrainerd {} starting: config {}, state in {}, partitions {}, poll every {:?}",
        env!("CARGO_PKG_VERSION"),
        cfg.path.display(),
        cfg.state_dir.display(),
        cfg.elastic_partitions().join(","),
        cfg.poll_interval
    );
    let mut daemon = Daemon::new(cfg, SlurmCluster::new(slurm), Some(journal), &records)?;
    daemon.lease = lease;
    // Timers run on elapsed time: a wall clock stepped either way shortens none.
    let started = std::time::Instant::now();
    daemon.use_elapsed_clock(Box::new(move || started.elapsed().as_secs_f64()));
    drop(records);
    if daemon.engine().lending() != bftrainer_core::engine::Lending::Open {
        log::warn!(
            "lending is {} (from the journal): run `bftrainer resume` to lend nodes again",
            daemon.engine().lending().as_str()
        );
    }
    let socket = daemon.cfg.socket.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let r = rt.block_on(main_loop(daemon, config_path.to_path_buf(), admins));
    // Tasks still holding connections go with the runtime, and a cycle still waiting on
    // slurmctld is not waited for (its journal is synced before it acts; the next start
    // takes over as after kill -9); then the socket file.
    rt.shutdown_background();
    let _ = std::fs::remove_file(&socket);
    drop(lock);
    r
}

async fn main_loop(
    daemon: Daemon<SlurmCluster>,
    config_path: std::path::PathBuf,
    admins: Vec<u32>,
) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut interval = tokio::time::interval(daemon.cfg.poll_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status_path = daemon.cfg.state_dir.join(STATUS_FILE);
    let mut status_written = f64::NEG_INFINITY;

    let (snap_tx, snap_rx) = watch::channel(Arc::new(daemon.snapshot(unix_now())));
    let (admin_tx, mut admin_rx) = mpsc::channel::<AdminCmd>(16);
    let listener = control::bind(&daemon.cfg.socket)?;
    log::info!("control socket {}", daemon.cfg.socket.display());
    tokio::spawn(control::serve(
        listener,
        Shared {
            snapshot: snap_rx.clone(),
            admin: admin_tx,
            admins,
        },
    ));
    if let Some(addr) = daemon.cfg.query_listen {
        // Clients make their credentials for root only (control::QUERY_DECODER_UID),
        // and bftrainerd proves to them that it runs as root before they send one.
        if nix::unistd::geteuid().as_raw() != control::QUERY_DECODER_UID {
            anyhow::bail!(
                "[daemon] query_listen = \"{addr}\": the query endpoint needs bftrainerd to run as root (clients make their MUNGE credentials for root only); run it as root or remove the key"
            );
        }
        // A port someone else holds (any user may bind it first) is waited for, not
        // fatal: the daemon lends meanwhile, and says who holds it (listen.rs).
        let snap = snap_rx.clone();
        tokio::spawn(async move {
            let l = super::listen::bind_or_wait("[daemon] query_listen", addr).await;
            let munge = bftrainer_slurm::munge::Munge::for_this_host();
            log::info!(
                "query endpoint on {addr} (read-only; MUNGE credentials checked by munged at {})",
                munge.socket.as_deref().unwrap_or("its default socket")
            );
            control::serve_query(l, snap, munge).await
        });
    }
    let metrics = Arc::new(Metrics::with_journal(
        snap_rx,
        Some(daemon.cfg.state_dir.join(super::journal::JOURNAL_FILE)),
    ));
    if let Some(addr) = daemon.cfg.metrics_listen {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let l = super::listen::bind_or_wait("[metrics] listen", addr).await;
            log::info!("metrics on http://{addr}/metrics");
            super::metrics::serve(l, metrics).await
        });
    }

    // The cycle runs off the async thread (Slurm calls block). While one is in flight
    // the daemon is with it: signals and admin verbs are still answered at once (a
    // slow or stopped slurmctld must not make `bftrainer pause` or SIGTERM wait for it);
    // what needs the daemon waits for the cycle's end, briefly, or is queued.
    let mut idle: Option<Daemon<SlurmCluster>> = Some(daemon);
    let mut cycle: Option<tokio::task::JoinHandle<CycleOut>> = None;
    let mut cycle_started = std::time::Instant::now();
    let mut queued: Vec<(bftrainer_core::engine::Lending, u32)> = Vec::new();
    let mut reload = false;
    loop {
        tokio::select! {
            _ = term.recv() => {
                log::info!("SIGTERM: stopping; satellites and jobs stay, the next start adopts them");
                if cycle.is_some() {
                    log::info!("a cycle was under way ({:.1} s, waiting on slurmctld): the next start takes over from the journal", cycle_started.elapsed().as_secs_f64());
                }
                break;
            }
            _ = int.recv() => { log::info!("SIGINT: stopping"); break; }
            _ = hup.recv() => {
                match idle.as_mut() {
                    Some(d) => reconfigure(d, &config_path, &mut interval),
                    None => {
                        log::info!("SIGHUP: the config is re-read when the current cycle ends");
                        reload = true;
                    }
                }
            }
            Some(cmd) = admin_rx.recv() => {
                // A cycle under way: give it a moment, else queue the change.
                if let Some(h) = cycle.as_mut() {
                    if let Ok(out) = tokio::time::timeout(ADMIN_WAIT, h).await {
                        cycle = None;
                        let d = finish_cycle(out.context("cycle task")?, &metrics, &snap_tx, &mut status_written)?;
                        idle = Some(d);
                    }
                }
                match idle.as_mut() {
                    Some(d) => admin(d, cmd, &snap_tx)?,
                    None => {
                        let mode = cmd.mode;
                        let msg = format!(
                            "accepted: lending becomes {} when the current cycle ends (it has waited {:.1} s on slurmctld); `bftrainer status` shows it then",
                            mode.as_str(),
                            cycle_started.elapsed().as_secs_f64()
                        );
                        log::info!("uid {} asked to {} during a cycle: queued", cmd.by_uid, mode.as_str());
                        queued.push((mode, cmd.by_uid));
                        let _ = cmd.reply.send(Ok(msg));
                    }
                }
            }
            out = async { cycle.as_mut().expect("a cycle in flight").await }, if cycle.is_some() => {
                cycle = None;
                let mut d = finish_cycle(out.context("cycle task")?, &metrics, &snap_tx, &mut status_written)?;
                if std::mem::take(&mut reload) {
                    reconfigure(&mut d, &config_path, &mut interval);
                }
                for (mode, by_uid) in queued.drain(..) {
                    set_lending(&mut d, mode, by_uid, &snap_tx)?;
                }
                idle = Some(d);
            }
            _ = interval.tick(), if cycle.is_none() => {
                let mut daemon = idle.take().expect("the daemon is idle between cycles");
                let status_path = status_path.clone();
                let mut written = status_written;
                cycle_started = std::time::Instant::now();
                cycle = Some(tokio::task::spawn_blocking(move || {
                    let t0 = std::time::Instant::now();
                    let now = unix_now();
                    let r = daemon.cycle(now);
                    let mut snap = None;
                    if let Ok(rep) = &r {
                        let s = daemon.snapshot(unix_now());
                        // The socket serves the snapshot live; the file is for people and
                        // scripts without it: rewritten when the cycle saw or did
                        // something, else every STATUS_EVERY_S (1.6 MB at 10,000 nodes / 1,000 jobs).
                        let news = rep.events > 0 || rep.actions > 0 || rep.calls > 0;
                        if rep.slurm_ok && (news || now - written >= STATUS_EVERY_S) {
                            write_status(&s, &status_path);
                            written = now;
                        }
                        snap = Some(s);
                        let took = t0.elapsed();
                        if took > Duration::from_secs(1) {
                            log::warn!("a cycle took {took:?}");
                        }
                    }
                    (daemon, r, snap, written)
                }));
            }
        }
    }
    Ok(())
}

/// Waits as a standby until this daemon wins the cluster-wide lease in `dir`
/// (`lease`), logging who holds it whenever that changes. The journal is read only
/// after the win: what it misses, the first cycle adopts from Slurm.
fn wait_for_lease(dir: &Path, lease_s: f64, poll: Duration) -> anyhow::Result<super::lease::Lease> {
    let mut l = super::lease::Lease::new(dir, super::lease::Lease::default_id(), lease_s)?;
    let mut said: Option<Option<(u64, String)>> = None;
    let t0 = std::time::Instant::now();
    loop {
        if l.hold()? {
            if said.is_some() {
                log::info!(
                    "lease: taking over after {:.1} s as standby",
                    t0.elapsed().as_secs_f64()
                );
            }
            return Ok(l);
        }
        let st = l.state()?;
        if said.as_ref() != Some(&st.term) {
            log::info!("standby: {} ({})", st.describe(), dir.display());
            said = Some(st.term.clone());
        }
        std::thread::sleep(poll);
    }
}

/// How long an admin verb waits for a cycle under way before it is queued.
const ADMIN_WAIT: Duration = Duration::from_millis(500);

type CycleOut = (
    Daemon<SlurmCluster>,
    anyhow::Result<super::CycleReport>,
    Option<Snapshot>,
    f64,
);

/// Takes a finished cycle's daemon back, publishes its snapshot and figures; an error
/// of the cycle (a journal that cannot be written) is fatal.
fn finish_cycle(
    out: CycleOut,
    metrics: &Metrics,
    snap_tx: &watch::Sender<Arc<Snapshot>>,
    status_written: &mut f64,
) -> anyhow::Result<Daemon<SlurmCluster>> {
    let (d, r, snap, written) = out;
    *status_written = written;
    if let Ok(rep) = &r {
        metrics.poll_seconds.observe(rep.poll_s);
        if rep.slurm_ok {
            metrics.decision_seconds.observe(rep.decide_s);
        }
    }
    if let Some(s) = snap {
        let _ = snap_tx.send(Arc::new(s));
    }
    // A journal failure is fatal: acting on a state the journal does not hold would
    // break recovery.
    r?;
    // Another daemon holds the lease now: this one stops (systemd starts it again, and
    // it waits as a standby).
    anyhow::ensure!(
        !d.fenced,
        "lease lost to another bftrainerd: stopping without acting again; started again, this daemon waits as a standby"
    );
    Ok(d)
}

/// SIGHUP: re-reads the config; a bad one is logged and the old one kept.
fn reconfigure(
    daemon: &mut Daemon<SlurmCluster>,
    config_path: &Path,
    interval: &mut tokio::time::Interval,
) {
    match config::load(config_path) {
        Ok(cfg) => {
            let poll = cfg.poll_interval;
            for (what, changed) in [
                ("[daemon] socket", cfg.socket != daemon.cfg.socket),
                (
                    "[metrics] listen",
                    cfg.metrics_listen != daemon.cfg.metrics_listen,
                ),
                (
                    "[daemon] query_listen",
                    cfg.query_listen != daemon.cfg.query_listen,
                ),
            ] {
                if changed {
                    log::warn!("reload: {what} changed; it takes effect at the next start");
                }
            }
            let (socket, listen, query) = (
                daemon.cfg.socket.clone(),
                daemon.cfg.metrics_listen,
                daemon.cfg.query_listen,
            );
            daemon.reconfigure(cfg);
            daemon.cfg.socket = socket;
            daemon.cfg.metrics_listen = listen;
            daemon.cfg.query_listen = query;
            if poll != interval.period() {
                *interval = tokio::time::interval(poll);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
        }
        Err(e) => daemon.error(format!("SIGHUP: {e}; keeping the previous config")),
    }
}

/// `bftrainer pause|drain|resume`: journaled and answered.
fn admin(
    daemon: &mut Daemon<SlurmCluster>,
    cmd: AdminCmd,
    snap_tx: &watch::Sender<Arc<Snapshot>>,
) -> anyhow::Result<()> {
    let (answer, r) = lending(daemon, cmd.mode, cmd.by_uid, snap_tx);
    let _ = cmd.reply.send(answer);
    r
}

/// A lending change queued during a cycle (its asker already had an answer).
fn set_lending(
    daemon: &mut Daemon<SlurmCluster>,
    mode: bftrainer_core::engine::Lending,
    by_uid: u32,
    snap_tx: &watch::Sender<Arc<Snapshot>>,
) -> anyhow::Result<()> {
    lending(daemon, mode, by_uid, snap_tx).1
}

fn lending(
    daemon: &mut Daemon<SlurmCluster>,
    mode: bftrainer_core::engine::Lending,
    by_uid: u32,
    snap_tx: &watch::Sender<Arc<Snapshot>>,
) -> (Result<String, String>, anyhow::Result<()>) {
    let now = unix_now();
    let before = daemon.engine().lending();
    let r = daemon.set_lending(mode, now);
    let answer = match &r {
        Ok(()) => Ok(lending_message(before, mode)),
        Err(e) => Err(format!("could not change lending: {e}")),
    };
    log::info!(
        "uid {by_uid} asked to {}: {}",
        mode.as_str(),
        answer.as_deref().unwrap_or_else(|e| e)
    );
    let _ = snap_tx.send(Arc::new(daemon.snapshot(now)));
    // A journal that cannot be written is fatal, as in a cycle.
    (answer, r)
}

fn lending_message(
    before: bftrainer_core::engine::Lending,
    now: bftrainer_core::engine::Lending,
) -> String {
    use bftrainer_core::engine::Lending::*;
    match (before, now) {
        (a, b) if a == b => format!("lending was already {}", b.as_str()),
        (_, Paused) => "lending paused: no admissions and no growth; running elastic jobs keep their nodes".into(),
        (_, Drained) => "lending drained: every elastic job is shrunk to its core nodes at the next cycle; no admissions and no growth".into(),
        (_, Open) => "lending resumed: idle nodes are lent again from the next cycle".into(),
    }
}

fn write_status(s: &Snapshot, path: &Path) {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec(s).unwrap_or_default();
    // Root's view of every user's jobs: readable by the daemon only (users ask the socket).
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&text)?;
        std::fs::rename(&tmp, path)
    };
    if write().is_err() {
        log::debug!("could not write {}", path.display());
    }
}
