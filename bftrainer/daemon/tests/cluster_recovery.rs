//! bftrainerd's recovery on a real Slurm cluster does not depend on the config: with
//! three elastic jobs running on the four nodes, the daemon is stopped and started
//! again under each changed `[engine]` key; every core and satellite keeps running
//! where it ran (no requeue, no cancel, no new satellite), and the journal's decisions
//! are restored as they were made.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use live::{Live, Row};

/// `bftrainer status --json` as root.
fn status(l: &Live) -> serde_json::Value {
    l.cli_json("status")
}

/// The elastic jobs' cores and satellites as Slurm has them, sorted.
fn elastic_rows(l: &Live, jobs: &[u32]) -> Vec<Row> {
    let mut v: Vec<Row> = l
        .squeue()
        .into_iter()
        .filter(|r| jobs.contains(&r.id) || jobs.iter().any(|j| r.name == format!("bftsat-{j}")))
        .collect();
    v.sort_by_key(|r| r.id);
    v
}

#[test]
fn cluster_daemon_restarts_under_a_changed_engine_config_without_requeues() {
    let mut l = Live::start("", "", "");
    let jobs: Vec<u32> = ["1:2", "1:1", "1:1"]
        .iter()
        .map(|s| l.submit_elastic(s))
        .collect();
    // Four nodes for three jobs: all run at their maximum, one on two nodes (a core
    // and a satellite).
    l.wait(120, "three elastic jobs running on the four nodes", || {
        let running = jobs.iter().all(|&j| l.state_of(j) == "RUNNING");
        let size: usize = jobs.iter().map(|&j| l.elastic_size(j)).sum();
        (running && size == 4).then_some(())
    });
    let before = elastic_rows(&l, &jobs);
    assert!(before.iter().all(|r| r.state == "RUNNING"), "{before:#?}");
    let good = std::fs::read_to_string(&l.conf).unwrap();
    assert!(good.contains("[engine]\nt_fwd = 600\n"), "{good}");
    for key in [
        "max_jobs = 1",
        "t_fwd = 5",
        "min_rescale_interval = 3600",
        "lend_after_idle = 3600",
        "objective = \"fairness\"",
        "max_jobs_per_user = 1\nmax_nodes_per_user = 4",
    ] {
        let mut d = l.daemon.take().unwrap();
        unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
        assert!(d.wait().unwrap().success());
        let conf = if key.starts_with("t_fwd") {
            good.replace("t_fwd = 600", key)
        } else {
            good.replace("t_fwd = 600", &format!("t_fwd = 600\n{key}"))
        };
        std::fs::write(&l.conf, conf).unwrap();
        let starts = l.log_text().matches("rebuilt from the journal").count();
        l.spawn();
        l.wait(30, "the restart", || {
            (l.log_text().matches("rebuilt from the journal").count() > starts).then_some(())
        });
        // Cycles of the new daemon (its counter starts at 0), each deciding under the
        // new config.
        l.wait(30, "five cycles after the restart", || {
            (status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 5).then_some(())
        });
        let after = elastic_rows(&l, &jobs);
        assert_eq!(after, before, "[engine] {key}: Slurm's jobs changed");
        let st = status(&l);
        assert_eq!(st["stats"]["requeues"], 0, "[engine] {key}: {st:#}");
        assert_eq!(st["stats"]["journal_skipped"], 0, "[engine] {key}");
        assert_eq!(st["stats"]["refused_decisions"], 0, "[engine] {key}");
    }
    let log = l.log_text();
    assert!(!log.contains("requeue job"), "{log}");
    assert!(!log.contains("skipped:"), "{log}");
}
