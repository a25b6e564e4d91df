//! bftrainerd's memory after many finished elastic jobs (docs/benchmarks.md): 100,000
//! elastic jobs are submitted, admitted, grown, run and finished through
//! `Daemon::cycle` against the generated cluster, which forgets ended jobs after
//! MinJobAge as slurmctld does; the daemon forgets them after `job_retention`. Prints
//! the process's RSS (VmRSS, and the peak VmHWM) after the first `--probe` jobs and
//! after all of them, and what the daemon still holds.
//!
//!   cargo bench -p bftrainer-daemon --bench daemon_memory -- [--nodes N] [--jobs N] [--per-round N] [--probe N]

use bftrainer_daemon::daemon::config;
use bftrainer_daemon::daemon::gen::{job, node, partition, GenCluster};
use bftrainer_daemon::daemon::Daemon;
use bftrainer_slurm::{JobBase, JobState};
use std::path::Path;

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;
use live::arg;

/// VmRSS and VmHWM of this process, MB.
fn rss_mb() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Seconds between polls of the run (one round each).
const ROUND_S: f64 = 30.0;
/// Rounds an elastic job runs before it ends.
const RUN_ROUNDS: usize = 3;
/// slurmctld's MinJobAge (default 300 s), in rounds.
const MIN_JOB_AGE_ROUNDS: usize = 10;

fn main() {
    let n_nodes = arg("--nodes", 10_000);
    let total = arg("--jobs", 100_000);
    let per_round = arg("--per-round", 100).max(1);
    let probe = arg("--probe", 1_000).min(total);
    let names: Vec<String> = (1..=n_nodes).map(|i| format!("g{i:05}")).collect();
    let parts = ["batch", "elastic", "elastic-sat"];
    let nodes: Vec<_> = names.iter().map(|n| node(n.clone(), &parts)).collect();
    let partitions = vec![
        partition("batch", &names, 10),
        partition("elastic", &names, 2),
        partition("elastic-sat", &names, 1),
    ];
    let dir = std::env::temp_dir();
    let cfg = config::parse(
        &format!(
            "[policy]\nsatellite_partition = \"elastic-sat\"\n[daemon]\nstate_dir = \"{}\"\njob_retention = 60\n[engine]\nmax_jobs = 1000\n",
            dir.display()
        ),
        Path::new("/bench/bftrainer.toml"),
    )
    .unwrap();
    let mut d = Daemon::new(
        cfg,
        GenCluster::new(nodes, partitions, Vec::new()),
        None,
        &[],
    )
    .unwrap();
    let mut now = 3_000_000_000.0f64;
    let (rss0, _) = rss_mb();
    // (Slurm id, round at which it ends) of the cores submitted.
    let mut running: std::collections::VecDeque<(u32, usize)> = Default::default();
    let (mut submitted, mut ended, mut round) = (0usize, 0usize, 0usize);
    let mut at_probe = None;
    let t0 = std::time::Instant::now();
    while ended < total {
        round += 1;
        now += ROUND_S;
        for _ in 0..per_round.min(total - submitted) {
            let mut j = job(0, "elastic", JobBase::Pending);
            j.admin_comment = Some("bftrainer:v1 1:4,role=core".into());
            j.priority = 0;
            j.submit_time = Some(now as i64);
            let id = d.cluster.add_job(j);
            running.push_back((id, round + RUN_ROUNDS));
            submitted += 1;
        }
        // Jobs end in submission order once they ran their rounds (started or not:
        // one that never started is cancelled by its owner).
        while running.front().is_some_and(|&(_, r)| r <= round) {
            let (id, _) = running.pop_front().unwrap();
            if let Some(j) = d.cluster.jobs.iter_mut().find(|j| j.job_id == id) {
                let base = if j.state.base() == JobBase::Running {
                    JobBase::Complete
                } else {
                    JobBase::Cancelled
                };
                j.state = JobState::from_base(base);
                j.end_time = Some(now as i64);
                d.cluster.dirty = true;
            }
            ended += 1;
        }
        if round % MIN_JOB_AGE_ROUNDS == 0 {
            d.cluster.purge_ended();
        }
        d.cycle(now).unwrap();
        // slurmctld starts what the daemon released, before the next poll.
        d.cluster.start_pending_elastic(now as i64);
        if at_probe.is_none() && ended >= probe {
            at_probe = Some(rss_mb());
        }
    }
    // The last jobs' retention runs out; the generator forgets them.
    for _ in 0..2 * MIN_JOB_AGE_ROUNDS {
        round += 1;
        now += ROUND_S;
        if round % MIN_JOB_AGE_ROUNDS == 0 {
            d.cluster.purge_ended();
        }
        d.cycle(now).unwrap();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let (rss, hwm) = rss_mb();
    let (p_rss, p_hwm) = at_probe.unwrap_or((0.0, 0.0));
    let snap = d.snapshot(now);
    let s = &d.stats;
    println!("bftrainerd memory on a generated cluster: {n_nodes} nodes, {total} elastic jobs of 1:4 nodes, {per_round} submitted per {ROUND_S} s poll, each ending {RUN_ROUNDS} polls later; job_retention 60 s, MinJobAge {} s", MIN_JOB_AGE_ROUNDS as f64 * ROUND_S);
    println!(
        "ran {round} cycles in {elapsed:.1} s: {} admits, {} grows, {} shrinks, {} requeues, {} events; engine jobs ever {}",
        s.admits,
        s.grows,
        s.shrinks,
        s.requeues,
        s.events,
        d.engine().n_jobs()
    );
    println!(
        "left in the daemon's state: {} elastic jobs, {} nodes lent; left in the generator's job table: {} jobs",
        snap.jobs.len(),
        snap.counts.lent,
        d.cluster.jobs.len()
    );
    println!("RSS before the first job: {rss0:.1} MB");
    println!("RSS after {probe} finished jobs: {p_rss:.1} MB (peak {p_hwm:.1} MB)");
    println!("RSS after {ended} finished jobs: {rss:.1} MB (peak {hwm:.1} MB); target <= 64 MB");
}
