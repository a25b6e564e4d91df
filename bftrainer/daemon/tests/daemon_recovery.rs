//! bftrainerd's recovery does not depend on the config: the daemon runs three elastic
//! jobs (cores and satellites) on an in-memory cluster, stops, and starts again from its
//! journal under each changed `[engine]` key. The engine's state after the restart is
//! the one before it, and no requeue or cancel follows; a journal of an older build
//! (no decisions in it) still loads, re-decided leniently.
//!
//! The cluster is the generated one of the cycle benchmark (`daemon::gen`): it starts
//! released cores and satellites on their pinned nodes as slurmctld would. What Slurm
//! itself does is tested on real clusters (tests/cluster_daemon.rs).

use bftrainer_core::engine::{EngineState, Event, JobStatus};
use bftrainer_daemon::daemon::gen::{held_cores, GenCluster};
use bftrainer_daemon::daemon::journal::{Journal, JOURNAL_FILE};
use bftrainer_daemon::daemon::{config, Daemon};
use bftrainer_slurm::JobBase;
use std::path::Path;

/// Six idle nodes and three held elastic core jobs of 1 to 2 nodes each.
fn cluster() -> GenCluster {
    held_cores(6, 3, "1:2")
}

fn cfg(dir: &Path, engine: &str) -> config::Config {
    config::parse(
        &format!(
            "[policy]\nsatellite_partition = \"elastic-sat\"\n[daemon]\nstate_dir = \"{}\"\n[engine]\n{engine}\n",
            dir.display()
        ),
        Path::new("/test/bftrainer.toml"),
    )
    .unwrap()
}

fn start(dir: &Path, engine: &str, cluster: GenCluster) -> Daemon<GenCluster> {
    let (journal, records) = Journal::open(dir).unwrap();
    Daemon::new(cfg(dir, engine), cluster, Some(journal), &records).unwrap()
}

/// Cycles as bftrainerd does, Slurm starting what was released between two polls.
fn run(d: &mut Daemon<GenCluster>, now: &mut f64, cycles: usize) {
    for _ in 0..cycles {
        *now += 1.0;
        d.cluster.start_pending_elastic(*now as i64);
        d.cycle(*now).unwrap();
    }
}

/// The state without the time of the last event (a cycle that observed nothing feeds
/// its Tick to the engine but does not journal it).
fn state(d: &Daemon<GenCluster>) -> EngineState {
    EngineState {
        t: None,
        ..d.engine().state()
    }
}

fn copy_cluster(c: &GenCluster) -> GenCluster {
    GenCluster::new(c.nodes.clone(), c.partitions.clone(), c.jobs.clone())
}

/// Runs the three jobs to two nodes each (a core and a satellite) and stops; returns
/// the cluster as Slurm has it then, the engine's state and the time.
fn first_run(dir: &Path) -> (GenCluster, EngineState, f64) {
    let mut now = 3_000_000_000.0;
    let mut d = start(dir, "max_jobs = 3", cluster());
    run(&mut d, &mut now, 8);
    for j in 0..3 {
        assert_eq!(d.engine().job_status(j), JobStatus::Active);
        assert_eq!(d.engine().job_nodes(j).len(), 2, "job {j}");
        assert_eq!(d.engine().job_anchors(j).len(), 1, "job {j}");
    }
    let running = d
        .cluster
        .jobs
        .iter()
        .filter(|j| j.state.base() == JobBase::Running)
        .count();
    assert_eq!(running, 6, "three cores and three satellites run");
    let st = state(&d);
    let c = copy_cluster(&d.cluster);
    drop(d);
    (c, st, now)
}

#[test]
fn a_restart_under_a_changed_engine_config_restores_the_state_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (slurm, before, now) = first_run(dir.path());
    let journal = std::fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
    assert!(
        String::from_utf8_lossy(&journal).contains("\"type\":\"decided\""),
        "decisions are journaled"
    );
    for engine in [
        "max_jobs = 1",
        "t_fwd = 86400",
        "min_rescale_interval = 3600",
        "lend_after_idle = 3600",
        "objective = \"fairness\"",
        "objective = \"efficiency\"",
        "max_jobs = 1\nt_fwd = 1\nmin_rescale_interval = 86400\nlend_after_idle = 86400\nobjective = \"reclaim-aware\"",
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), &journal).unwrap();
        let mut d = start(dir.path(), engine, copy_cluster(&slurm));
        assert_eq!(state(&d), before, "[engine] {engine}");
        assert_eq!(d.stats.journal_skipped, 0);
        let mut t = now;
        run(&mut d, &mut t, 5);
        let calls = &d.cluster.calls;
        assert_eq!(
            (calls.requeues, calls.cancels, calls.submits),
            (0, 0, 0),
            "[engine] {engine}: the restart made Slurm calls: {calls:?}"
        );
        assert_eq!(d.stats.refused_decisions, 0);
        for j in 0..3 {
            assert_eq!(
                d.engine().job_nodes(j),
                before_nodes(&before, j as usize),
                "[engine] {engine}: job {j}"
            );
        }
    }
}

fn before_nodes(s: &EngineState, j: usize) -> &[u32] {
    match &s.jobs[j] {
        bftrainer_core::engine::JobSnap::Live { nodes, .. } => nodes,
        other => panic!("job {j}: {other:?}"),
    }
}

#[test]
fn a_journal_without_decisions_still_loads() {
    // An older bftrainerd's journal: the same records without the decisions. Started
    // under another config, its Ticks are decided again; what no longer fits is
    // logged and skipped, never fatal.
    let dir = tempfile::tempdir().unwrap();
    let (slurm, _before, now) = first_run(dir.path());
    let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    let old: String = text
        .lines()
        .filter(|l| !l.contains("\"type\":\"decided\""))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(old.len() < text.len());
    for engine in ["max_jobs = 3", "max_jobs = 1"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(JOURNAL_FILE), &old).unwrap();
        let mut d = start(dir.path(), engine, copy_cluster(&slurm));
        if engine == "max_jobs = 1" {
            // Jobs 2 and 3 were never admitted in this replay: their confirmations
            // (started, joined) were refused and skipped.
            assert!(d.stats.journal_skipped > 0);
        }
        let mut t = now;
        run(&mut d, &mut t, 3);
    }
}

#[test]
fn a_journaled_decision_that_does_not_fit_is_skipped() {
    // A journal's Decided record naming an impossible action is skipped with a
    // warning at the restart; the daemon then runs on.
    let dir = tempfile::tempdir().unwrap();
    let (slurm, before, now) = first_run(dir.path());
    let p = dir.path().join(JOURNAL_FILE);
    let mut text = std::fs::read_to_string(&p).unwrap();
    let bogus = serde_json::to_string(&bftrainer_core::engine::Record {
        v: bftrainer_core::engine::EVENT_FORMAT_VERSION,
        t: now,
        event: Event::Decided {
            activated: vec![],
            actions: vec![bftrainer_core::engine::Action::Grow {
                job: 0,
                nodes: vec![1],
            }],
        },
    })
    .unwrap();
    text.push_str(&bogus);
    text.push('\n');
    std::fs::write(&p, text).unwrap();
    let mut d = start(dir.path(), "max_jobs = 3", slurm);
    assert_eq!(state(&d).jobs, before.jobs);
    assert_eq!(d.engine().stats.skipped_actions, 1);
    let mut t = now;
    run(&mut d, &mut t, 2);
    assert_eq!(d.cluster.calls.requeues + d.cluster.calls.cancels, 0);
}

#[test]
fn a_refused_decision_is_counted_and_the_loop_goes_on() {
    // remaining-work needs every job's remaining work, which live jobs do not report:
    // the allocator refuses each decision. The cycle goes on, nothing is applied.
    let dir = tempfile::tempdir().unwrap();
    let (slurm, before, now) = first_run(dir.path());
    let (journal, records) = Journal::open(dir.path()).unwrap();
    let mut c = cfg(dir.path(), "max_jobs = 3");
    c.objective = bftrainer_core::alloc::Objective::RemainingWork;
    let mut d = Daemon::new(c, slurm, Some(journal), &records).unwrap();
    let mut t = now;
    run(&mut d, &mut t, 3);
    assert_eq!(
        d.stats.refused_decisions, 1,
        "decided again at the next change only"
    );
    assert_eq!(d.engine().stats.refused, 1);
    assert_eq!(state(&d).jobs, before.jobs);
    assert_eq!(d.cluster.calls.requeues + d.cluster.calls.cancels, 0);
    // A node leaves: decided again, refused again, still running.
    d.cluster.node_mut("n1").unwrap().state =
        bftrainer_slurm::NodeState::from_base(bftrainer_slurm::NodeBase::Down);
    d.cluster.dirty = true;
    run(&mut d, &mut t, 2);
    assert_eq!(d.stats.refused_decisions, 2);
}

#[test]
fn a_replay_of_the_daemons_journal_ignores_its_decisions_and_decides_again() {
    use bftrainer_core::engine::{EngineConfig, Exact};
    use bftrainer_daemon::replay::journal::replay_journal;
    let dir = tempfile::tempdir().unwrap();
    first_run(dir.path());
    let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    let decided = text.lines().filter(|l| l.contains("\"decided\"")).count();
    assert!(decided > 0);
    // The daemon's policy: the same admissions as the journal records.
    let r = replay_journal(
        text.as_bytes(),
        "journal",
        EngineConfig {
            max_jobs: 3,
            ..EngineConfig::default()
        },
        Exact::default(),
        true,
    )
    .unwrap();
    assert_eq!(r.counts.admits, 3);
    // The actions are the replay's own: as many as the journal's decisions hold, not
    // those applied on top of them.
    let journaled: usize = text
        .lines()
        .filter_map(|l| bftrainer_core::engine::Record::from_json_line(l).ok())
        .map(|r| match r.event {
            Event::Decided { actions, .. } => actions.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(r.actions.len(), journaled);
    // Another objective: decided by it (the engine's decisions counter moves).
    let r = replay_journal(
        text.as_bytes(),
        "journal",
        EngineConfig {
            max_jobs: 3,
            ..EngineConfig::default()
        },
        Exact {
            opts: bftrainer_core::alloc::Options::new(bftrainer_core::alloc::Objective::Fairness),
        },
        false,
    )
    .unwrap();
    assert!(r.decisions > 0);
}

#[test]
fn a_compacted_journal_restores_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let (slurm, before, now) = first_run(dir.path());
    let mut d = start(dir.path(), "max_jobs = 3", copy_cluster(&slurm));
    let books: Vec<u32> = d.snapshot(now).jobs.iter().map(|j| j.size).collect();
    d.compact_journal().unwrap();
    drop(d);
    let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    assert_eq!(text.lines().count(), 1, "one snapshot record");
    assert!(text.contains("\"type\":\"snapshot\""));
    // Under another config too; then the daemon runs on and appends after it.
    let mut d = start(dir.path(), "max_jobs = 1\nt_fwd = 5", copy_cluster(&slurm));
    assert_eq!(state(&d), before);
    assert_eq!(
        d.snapshot(now)
            .jobs
            .iter()
            .map(|j| j.size)
            .collect::<Vec<_>>(),
        books
    );
    let mut t = now;
    run(&mut d, &mut t, 3);
    let calls = &d.cluster.calls;
    assert_eq!((calls.requeues, calls.cancels, calls.submits), (0, 0, 0));
    d.cluster.jobs[0].state = bftrainer_slurm::JobState::from_base(JobBase::Complete);
    d.cluster.dirty = true;
    run(&mut d, &mut t, 2);
    assert_eq!(d.engine().job_status(0), JobStatus::Finished);
    let after = state(&d);
    drop(d);
    let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    assert!(text.lines().count() > 1);
    let d = start(dir.path(), "max_jobs = 3", copy_cluster(&slurm));
    assert_eq!(state(&d), after);
}

#[test]
fn a_rate_its_owner_changes_at_every_poll_is_journaled_at_most_every_30_s() {
    // The runtime's rate comes from the job's Comment, which its owner may write: one
    // that changes at every poll must not put a record in the journal at every poll.
    let dir = tempfile::tempdir().unwrap();
    let mut now = 3_000_000_000.0;
    let mut d = start(dir.path(), "max_jobs = 3", cluster());
    run(&mut d, &mut now, 8);
    for k in 0..300 {
        now += 1.0;
        let j = d.cluster.jobs.iter_mut().find(|j| j.job_id == 1).unwrap();
        j.comment = Some(format!(
            "bftrainer-run:v1 coord=h:1 run=ab start=0 gen=1 nodes=2 rate={} step=1",
            100.0 + f64::from(k % 2) * 50.0
        ));
        d.cluster.dirty = true;
        d.cycle(now).unwrap();
    }
    drop(d);
    let (_, records) = Journal::open(dir.path()).unwrap();
    let progress = records
        .iter()
        .filter(|r| matches!(r.event, Event::Progress { .. }))
        .count();
    assert!(
        (9..=12).contains(&progress),
        "{progress} Progress records for 300 polls of a changing rate"
    );
}

/// A core job that Slurm ends COMPLETED while it preempts it (its batch script left
/// within the grace time) is counted finished only when its runtime wrote, for this
/// run, that the training is done; otherwise it is a preemption, requeued held. The
/// second job's runtime wrote `done=1` for an earlier run (its Comment survives a
/// requeue): that says nothing about this run.
#[test]
fn a_core_ended_under_preemption_is_finished_only_when_its_run_said_done() {
    use bftrainer_core::runtime::RunComment;
    use bftrainer_slurm::JobState;
    let dir = tempfile::tempdir().unwrap();
    let mut now = 3_000_000_000.0;
    let mut d = start(dir.path(), "max_jobs = 3", cluster());
    run(&mut d, &mut now, 8);
    let comment = |start: i64, done: bool| {
        RunComment {
            coord: "n1:4000".into(),
            run: "ab12".into(),
            start,
            gen: 3,
            nodes: 2,
            rate: 10.0,
            step: 1.0,
            batch: 0,
            done,
            ..RunComment::default()
        }
        .to_string()
    };
    for (id, done_for) in [(1u32, Some(0i64)), (2, Some(-100)), (3, None)] {
        let j = d.cluster.jobs.iter_mut().find(|j| j.job_id == id).unwrap();
        let start = j.start_time.expect("the core runs");
        j.state = JobState::from_base(JobBase::Complete);
        j.preempt_time = Some(now as i64);
        j.comment = Some(match done_for {
            Some(shift) => comment(start + shift, true),
            None => comment(start, false),
        });
    }
    d.cluster.dirty = true;
    let requeues_before = d.cluster.calls.requeues;
    run(&mut d, &mut now, 8);
    // The engine's job whose spec names Slurm's job id.
    let status = |d: &Daemon<GenCluster>, id: u32| {
        let k = (0..d.engine().n_jobs() as u32)
            .find(|&k| d.engine().job_spec(k).name == id.to_string())
            .unwrap();
        d.engine().job_status(k)
    };
    assert_eq!(
        status(&d, 1),
        JobStatus::Finished,
        "its run said done: finished"
    );
    let core = |d: &Daemon<GenCluster>, id: u32| {
        d.cluster
            .jobs
            .iter()
            .find(|j| j.job_id == id)
            .unwrap()
            .clone()
    };
    assert_eq!(core(&d, 1).state.base(), JobBase::Complete, "not requeued");
    for id in [2, 3] {
        assert!(
            core(&d, id).restart_count >= 1,
            "job {id}: a done of another run, or none, is a preemption: requeued"
        );
        assert_ne!(status(&d, id), JobStatus::Finished, "job {id}");
    }
    assert_eq!(
        d.cluster.calls.requeues - requeues_before,
        2,
        "jobs 2 and 3 only"
    );
}

#[test]
fn a_damaged_record_mid_journal_is_skipped_and_the_daemon_runs_on() {
    // One unknown record and one line of garbage in the middle of the journal: the
    // daemon starts (it used to exit 1 here, and systemd restarted it forever), counts
    // them, keeps the journal as found aside, and restores the same state.
    let dir = tempfile::tempdir().unwrap();
    let (slurm, before, now) = first_run(dir.path());
    let text = std::fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // After a NodeAdded (whose effect a later poll restores), never inside the
    // decisions: what the damage cost is then nothing.
    let at = lines.len() / 2;
    lines.insert(at, "{\"v\":1,\"t\":6,\"event\":{\"type\":\"nap\"}}".into());
    lines.insert(at + 1, "\u{0}\u{0}garbage{".into());
    let damaged: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let dir2 = tempfile::tempdir().unwrap();
    std::fs::write(dir2.path().join(JOURNAL_FILE), &damaged).unwrap();
    let mut d = start(dir2.path(), "max_jobs = 3", copy_cluster(&slurm));
    assert_eq!(d.stats.journal_skipped, 2);
    assert_eq!(state(&d), before);
    let copies: Vec<_> = std::fs::read_dir(dir2.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("journal.jsonl.damaged-"))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let kept = std::fs::read_to_string(dir2.path().join(&copies[0])).unwrap();
    assert_eq!(kept, damaged);
    let mut t = now;
    run(&mut d, &mut t, 5);
    let calls = &d.cluster.calls;
    assert_eq!((calls.requeues, calls.cancels, calls.submits), (0, 0, 0));
}
