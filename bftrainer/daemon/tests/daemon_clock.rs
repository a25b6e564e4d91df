//! bftrainerd's timers against a wall clock that steps back, and a journal written
//! under a clock ahead (issue 33, finding 4), on the in-memory cluster of the cycle
//! benchmark (`daemon::gen`). The daemon is told the wall clock (`cycle(now)`);
//! Slurm's timestamps come from slurmctld's own clock, which the tests keep apart.

use bftrainer_core::engine::{JobStatus, Lending};
use bftrainer_daemon::daemon::gen::{held_cores, GenCluster};
use bftrainer_daemon::daemon::journal::Journal;
use bftrainer_daemon::daemon::{config, Daemon};
use bftrainer_slurm::JobBase;
use std::path::Path;

const HOUR: f64 = 3600.0;

/// Four idle nodes and one held elastic core job of 1 to 4 nodes.
fn cluster() -> GenCluster {
    cluster_of(4)
}

/// `n` idle nodes and one held elastic core job of 1 to 4 nodes.
fn cluster_of(n: usize) -> GenCluster {
    held_cores(n, 1, "1:4")
}

fn daemon(dir: Option<&Path>, c: GenCluster) -> Daemon<GenCluster> {
    let state = dir.map_or(String::new(), |d| {
        format!("[daemon]\nstate_dir = \"{}\"\n", d.display())
    });
    let cfg = config::parse(
        &format!("[policy]\nsatellite_partition = \"elastic-sat\"\n{state}"),
        Path::new("/test/bftrainer.toml"),
    )
    .unwrap();
    match dir {
        Some(d) => {
            let (journal, records) = Journal::open(d).unwrap();
            Daemon::new(cfg, c, Some(journal), &records).unwrap()
        }
        None => Daemon::new(cfg, c, None, &[]).unwrap(),
    }
}

/// The two clocks: the daemon's host's (`wall`, what `cycle` is told) and
/// slurmctld's (`slurm`, its timestamps). A second passes on both per cycle.
struct Clocks {
    wall: f64,
    slurm: f64,
}

thread_local! {
    /// A monotonic clock for `Daemon::use_elapsed_clock` (bftrainerd's is
    /// CLOCK_MONOTONIC): a second passes on it per cycle, whatever the wall clock does.
    static MONO: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// `n` cycles; Slurm starts the released jobs (satellites too unless `hold_sats`).
fn run(d: &mut Daemon<GenCluster>, c: &mut Clocks, n: usize, hold_sats: bool) {
    for _ in 0..n {
        c.wall += 1.0;
        c.slurm += 1.0;
        MONO.with(|m| m.set(m.get() + 1.0));
        if hold_sats {
            // Only the core starts: its satellites wait (their request is not met).
            let sats: Vec<u32> = d
                .cluster
                .jobs
                .iter()
                .filter(|j| j.name.starts_with("bftsat") && j.state.base() == JobBase::Pending)
                .map(|j| j.job_id)
                .collect();
            for j in d
                .cluster
                .jobs
                .iter_mut()
                .filter(|j| sats.contains(&j.job_id))
            {
                j.priority = 0;
            }
            d.cluster.start_pending_elastic(c.slurm as i64);
            for j in d
                .cluster
                .jobs
                .iter_mut()
                .filter(|j| sats.contains(&j.job_id))
            {
                j.priority = 1000;
            }
        } else {
            d.cluster.start_pending_elastic(c.slurm as i64);
        }
        d.cycle(c.wall).unwrap();
    }
}

fn running_sats(d: &Daemon<GenCluster>) -> usize {
    d.cluster
        .jobs
        .iter()
        .filter(|j| j.name.starts_with("bftsat") && j.state.is_active())
        .count()
}

/// Cycles until `done`, at most `max`; the number run.
fn until(
    d: &mut Daemon<GenCluster>,
    c: &mut Clocks,
    max: usize,
    hold_sats: bool,
    done: impl Fn(&Daemon<GenCluster>) -> bool,
) -> usize {
    for k in 0..max {
        if done(d) {
            return k;
        }
        run(d, c, 1, hold_sats);
    }
    max
}

fn grown(dir: Option<&Path>, c: &mut Clocks) -> Daemon<GenCluster> {
    let mut d = daemon(dir, cluster());
    run(&mut d, c, 8, false);
    assert_eq!(d.engine().job_status(0), JobStatus::Active);
    assert_eq!(running_sats(&d), 3);
    d
}

/// A drain (every job shrinks to its core): the satellites are SIGTERMed, then
/// cancelled after `shrink_grace` (10 s) of elapsed time, whatever the wall clock
/// does in between (`step`, once the SIGTERMs are out).
fn shrink_with_a_step(d: &mut Daemon<GenCluster>, c: &mut Clocks, step: f64) {
    d.set_lending(Lending::Drained, c.wall).unwrap();
    let signals = d.cluster.calls.signals;
    until(d, c, 5, false, |d| d.cluster.calls.signals > signals);
    assert!(d.cluster.calls.signals > signals, "no SIGTERM");
    c.wall += step;
    let k = until(d, c, 60, false, |d| running_sats(d) == 0);
    assert!(k >= 8, "cancelled after {k} s, before the grace");
    assert!(k < 60, "the shrunk satellites were never cancelled");
}

#[test]
fn a_clock_stepped_back_mid_shrink_cancels_after_the_grace() {
    let mut c = Clocks {
        wall: 3_000_000_000.0,
        slurm: 3_000_000_000.0,
    };
    let mut d = grown(None, &mut c);
    shrink_with_a_step(&mut d, &mut c, -HOUR);
}

#[test]
fn with_the_elapsed_clock_a_clock_stepped_forward_mid_shrink_cancels_after_the_grace() {
    // Without a monotonic clock a step forward is time passed (it cannot be told from
    // a long pause); bftrainerd runs its timers on CLOCK_MONOTONIC, so it is not.
    let mut c = Clocks {
        wall: 3_000_000_000.0,
        slurm: 3_000_000_000.0,
    };
    let mut d = grown(None, &mut c);
    d.use_elapsed_clock(Box::new(|| MONO.with(|m| m.get())));
    shrink_with_a_step(&mut d, &mut c, HOUR);
}

/// Slurm preempts the running core (PreemptTime on slurmctld's clock): the daemon
/// gives up its nodes and requeues it held only after the partition's GraceTime (30 s)
/// of elapsed time.
fn preempt_with_a_step(d: &mut Daemon<GenCluster>, c: &mut Clocks, step: f64) {
    d.cluster.jobs[0].preempt_time = Some(c.slurm as i64);
    d.cluster.dirty = true;
    run(d, c, 2, false);
    c.wall += step;
    assert_eq!(d.cluster.calls.requeues, 0, "requeued at once");
    let k = until(d, c, 90, false, |d| d.cluster.calls.requeues > 0);
    assert!(k >= 25, "requeued after {k} s, within its grace time");
    assert!(k < 90, "never requeued");
}

#[test]
fn a_clock_stepped_back_mid_preemption_requeues_the_core_after_its_grace() {
    let mut c = Clocks {
        wall: 3_000_000_000.0,
        slurm: 3_000_000_000.0,
    };
    // One node: once the core's is taken, the engine has none to give it again, and
    // the daemon requeues it itself.
    let mut d = daemon(None, cluster_of(1));
    run(&mut d, &mut c, 5, false);
    assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running);
    preempt_with_a_step(&mut d, &mut c, -HOUR);
}

/// The core runs, its satellites stay pending: they are cancelled after
/// `grow_timeout` (30 s) of elapsed time, not at once and not never.
fn pending_with_a_step(d: &mut Daemon<GenCluster>, c: &mut Clocks, step: f64) {
    let cancels = d.cluster.calls.cancels;
    run(d, c, 3, true);
    assert!(running_sats(d) > 0, "no satellite submitted");
    c.wall += step;
    let k = until(d, c, 90, true, |d| d.cluster.calls.cancels > cancels);
    assert!(k >= 20, "a pending satellite cancelled after {k} s");
    assert!(k < 90, "pending satellites never cancelled");
}

#[test]
fn a_clock_stepped_back_while_satellites_pend_cancels_them_after_the_timeout() {
    let mut c = Clocks {
        wall: 3_000_000_000.0,
        slurm: 3_000_000_000.0,
    };
    let mut d = daemon(None, cluster());
    run(&mut d, &mut c, 2, true);
    pending_with_a_step(&mut d, &mut c, -HOUR);
}

#[test]
fn after_a_restart_from_a_journal_with_future_timestamps_timers_run_on_elapsed_time() {
    // The daemon's host ran an hour ahead of slurmctld and wrote its journal so; its
    // clock is then corrected and the daemon restarted. Each scenario starts from that
    // journal.
    let dir = tempfile::tempdir().unwrap();
    let mut c = Clocks {
        wall: 3_000_000_000.0 + HOUR,
        slurm: 3_000_000_000.0,
    };
    let d = grown(Some(dir.path()), &mut c);
    let slurm = GenCluster::new(
        d.cluster.nodes.clone(),
        d.cluster.partitions.clone(),
        d.cluster.jobs.clone(),
    );
    drop(d);
    let journal = std::fs::read(dir.path().join("journal.jsonl")).unwrap();
    let copy =
        |c: &GenCluster| GenCluster::new(c.nodes.clone(), c.partitions.clone(), c.jobs.clone());
    let restart = |c: &mut Clocks| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("journal.jsonl"), &journal).unwrap();
        c.wall = c.slurm;
        let mut d = daemon(Some(dir.path()), copy(&slurm));
        run(&mut d, c, 2, false);
        assert_eq!(d.cluster.calls.requeues, 0);
        assert_eq!(running_sats(&d), 3, "the restart changed the satellites");
        (d, dir)
    };
    let mut c1 = Clocks {
        wall: 0.0,
        slurm: c.slurm,
    };
    let (mut d, _keep) = restart(&mut c1);
    shrink_with_a_step(&mut d, &mut c1, 0.0);
    // Satellites pending at the restart (submitted by Slurm's clock an hour before
    // the journal's last time).
    let mut c3 = Clocks {
        wall: 0.0,
        slurm: c.slurm,
    };
    let (mut d, _keep) = restart(&mut c3);
    for j in d
        .cluster
        .jobs
        .iter_mut()
        .filter(|j| j.name.starts_with("bftsat"))
    {
        j.state = bftrainer_slurm::JobState::from_base(JobBase::Pending);
        j.nodes = None;
        j.submit_time = Some(c3.slurm as i64);
    }
    d.cluster.dirty = true;
    pending_with_a_step(&mut d, &mut c3, 0.0);
}

#[test]
fn after_a_restart_from_a_journal_with_future_timestamps_a_preempted_core_keeps_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Clocks {
        wall: 3_000_000_000.0 + HOUR,
        slurm: 3_000_000_000.0,
    };
    let mut d = daemon(Some(dir.path()), cluster_of(1));
    run(&mut d, &mut c, 5, false);
    assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running);
    let slurm = GenCluster::new(
        d.cluster.nodes.clone(),
        d.cluster.partitions.clone(),
        d.cluster.jobs.clone(),
    );
    drop(d);
    c.wall = c.slurm;
    let mut d = daemon(Some(dir.path()), slurm);
    run(&mut d, &mut c, 2, false);
    assert_eq!(d.cluster.calls.requeues, 0);
    preempt_with_a_step(&mut d, &mut c, 0.0);
}
