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

/// `Restarts=` of job `id` in slurmctld.
fn restarts(l: &Live, id: u32) -> String {
    let out =
        l.c.run("scontrol", &["show", "job", "-o", &id.to_string()])
            .unwrap_or_default();
    out.split_whitespace()
        .find_map(|f| f.strip_prefix("Restarts="))
        .unwrap_or("?")
        .to_string()
}

/// Job `job` runs as before (`sats`: its running satellites then), never requeued.
fn same(l: &Live, job: u32, sats: &std::collections::BTreeMap<String, u32>, what: &str) {
    assert_eq!(restarts(l, job), "0", "{what}: job {job} was requeued");
    assert_eq!(l.state_of(job), "RUNNING", "{what}");
    assert_eq!(&l.satellites(job), sats, "{what}: satellites changed");
    assert_eq!(l.active_satellites(job), 3, "{what}: a duplicate satellite");
}

/// A second bftrainerd beside the test's: its config (another state_dir, `extra` in
/// `[daemon]`) and its log.
struct Other {
    conf: std::path::PathBuf,
    log: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl Other {
    fn new(l: &Live, name: &str, daemon_extra: &str) -> Other {
        let state = l.dir.join(name);
        std::fs::create_dir_all(&state).unwrap();
        let conf = l.dir.join(format!("{name}.toml"));
        let text = std::fs::read_to_string(&l.conf).unwrap();
        let text = text
            .lines()
            .map(|line| {
                if line.starts_with("state_dir = ") {
                    format!("state_dir = \"{}\"\n{daemon_extra}", state.display())
                } else {
                    line.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&conf, text).unwrap();
        Other {
            conf,
            log: l.dir.join(format!("{name}.log")),
            child: None,
        }
    }

    fn spawn(&mut self, l: &Live) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let child =
            l.c.command(env!("CARGO_BIN_EXE_bftrainerd"))
                .arg("--config")
                .arg(&self.conf)
                .env("RUST_LOG", "info")
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap();
        self.child = Some(child);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn status(&self, l: &Live) -> serde_json::Value {
        let out =
            l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
                .args(["status", "--json", "--config"])
                .arg(&self.conf)
                .output()
                .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    fn stop(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, sig) };
            let _ = c.wait();
        }
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        self.stop(libc::SIGKILL);
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
    }
}

#[test]
fn cluster_daemon_adopts_running_cores_and_hands_over_its_lease() {
    // A job grown to 4 nodes, its core off n1 (a fresh engine's first pick, which
    // requeued it before adoption). Then, each while it runs: (1) a second daemon
    // with another state_dir; (2) a restart on an empty journal; (3) an HA pair under
    // one lease, its active daemon killed -9. The job's Restarts stay 0 and its
    // satellites are the same jobs throughout.
    let mut l = Live::start("", "", "");
    let blocker = l.regular(1, 600);
    l.wait(60, "a regular job on one node", || {
        (l.state_of(blocker) == "RUNNING").then_some(())
    });
    let job = l.submit_elastic("1:4");
    l.wait(120, "the core running beside the regular job", || {
        (l.state_of(job) == "RUNNING").then_some(())
    });
    l.c.run("scancel", &[&blocker.to_string()]).unwrap();
    let sats = l.grown_to_all(job);
    let core_node = l.squeue().into_iter().find(|r| r.id == job).unwrap().nodes;
    assert_ne!(core_node, "n1", "the core runs off n1: {sats:?}");
    // (1) A second daemon, another state_dir, no lease: it adopts, requeues nothing.
    let mut second = Other::new(&l, "second", "");
    second.spawn(&l);
    l.wait(60, "the second daemon to adopt the job", || {
        second
            .log_text()
            .contains(&format!("elastic job {job} adopted as running"))
            .then_some(())
    });
    l.wait(30, "ten cycles of the second daemon", || {
        (second.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 10).then_some(())
    });
    same(&l, job, &sats, "a second daemon");
    assert_eq!(second.status(&l)["stats"]["requeues"], 0);
    second.stop(libc::SIGTERM);

    // (2) The first daemon again, on an empty journal.
    l.kill9();
    std::fs::remove_file(l.dir.join("state/journal.jsonl")).unwrap();
    let starts = l.log_text().matches("adopted as running").count();
    l.spawn();
    l.wait(60, "the restart to adopt the job", || {
        (l.log_text().matches("adopted as running").count() > starts).then_some(())
    });
    l.cycles_later(10);
    same(&l, job, &sats, "a restart on an empty journal");

    // (3) An HA pair: each with its own state_dir, one lease directory.
    let lease_dir = l.dir.join("lease");
    std::fs::create_dir_all(&lease_dir).unwrap();
    let lease = format!("lease_dir = \"{}\"\nlease = 3", lease_dir.display());
    l.kill9();
    let mut active = Other::new(&l, "ha-a", &lease);
    let mut standby = Other::new(&l, "ha-b", &lease);
    active.spawn(&l);
    l.wait(60, "the first of the pair to win the lease", || {
        active.log_text().contains("won term 1").then_some(())
    });
    standby.spawn(&l);
    l.wait(60, "the second of the pair to wait as a standby", || {
        standby.log_text().contains("standby: term 1").then_some(())
    });
    l.wait(30, "ten cycles of the active daemon", || {
        (active.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 10).then_some(())
    });
    let st = active.status(&l);
    assert!(
        st["lease"]
            .as_str()
            .is_some_and(|s| s.starts_with("ACTIVE")),
        "{st:#}"
    );
    assert!(
        standby.status(&l).is_null(),
        "the standby does not serve yet"
    );
    // There `bftrainer status` says who is active.
    let out =
        l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
            .args(["status", "--config"])
            .arg(&standby.conf)
            .output()
            .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Lease: term 1 held by") && err.contains("(valid, lease 3 s)"),
        "{err}"
    );
    same(&l, job, &sats, "an HA pair");
    active.stop(libc::SIGKILL);
    let t0 = std::time::Instant::now();
    l.wait(30, "the standby's first cycle", || {
        (standby.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 1).then_some(())
    });
    let took = t0.elapsed().as_secs_f64();
    println!("HA takeover: {took:.2} s from kill -9 to the standby's first cycle (lease 3 s, poll 0.5 s)");
    l.wait(30, "ten cycles of the new active daemon", || {
        (standby.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 10).then_some(())
    });
    same(&l, job, &sats, "an HA takeover");
    let st = standby.status(&l);
    assert_eq!(st["stats"]["requeues"], 0, "{st:#}");
    assert!(standby.log_text().contains("won term 2"));
}
