//! bftrainerd live on a real Slurm cluster (both plugins loaded, four nodes): grow onto
//! every idle node, give nodes to a regular job within GraceTime + 5 s, grow back;
//! kill -9 and restart without orphans or duplicates; one daemon per state directory;
//! a failing node set aside; forged satellites not adopted; plain jobs by policy.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use live::{Live, GRACE_TIME_S};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn cluster_daemon_grows_yields_to_a_regular_job_and_grows_back() {
    // Another SPANK plugin beside ours (a stand-in for pyxis' --container-image), whose
    // options satellites carry: the job's workers on grown nodes must run in the same
    // image as on the core's.
    let s = live::setup("bftd", "satellite_spank_options = [\"standin\"]", "", "");
    let (line, records) = live::stand_in_plugin(&s.dir);
    let mut l = Live::from_setup_with(
        s,
        bftrainer_testcluster::Options {
            plugstack_lines: vec![line],
            ..Default::default()
        },
    );
    l.spawn();
    // Characters the tag must encode (',', '#', ':', ' ').
    let image = "reg.example#team/train:1.0,ro x";
    let job = l.submit_elastic_with("1:4", &[&format!("--stand-in-image={image}")]);
    let sats = l.grown_to_all(job);
    l.assert_no_double_allocation();
    // The core's prolog and steps, and each satellite's prolog, batch step (the
    // satellite's environment) and srun step (srun reads SLURM_SPANK_* from it): the
    // plugin saw the same image everywhere.
    for id in std::iter::once(job).chain(sats.values().copied()) {
        let seen = l.wait(30, "the stand-in plugin's records of the job", || {
            let r = live::stand_in_records(&records, id);
            let prolog = r.iter().any(|(f, _)| f.starts_with("prolog."));
            let steps = r.iter().filter(|(f, _)| f.starts_with("step.")).count();
            (prolog && steps >= 2).then_some(r)
        });
        eprintln!("job {id}: the stand-in plugin saw {seen:?}");
        for (file, got) in &seen {
            assert_eq!(
                got, image,
                "job {id}: the stand-in plugin's {file}: {seen:?}"
            );
        }
    }
    let core_node = l.squeue().into_iter().find(|r| r.id == job).unwrap().nodes;
    assert!(
        !sats.contains_key(&core_node),
        "a satellite on the core's node {core_node}"
    );

    // A regular job asking 2 nodes: Slurm preempts two satellites (their partition is
    // one tier below the core's), the core runs on.
    let t0 = Instant::now();
    let regular = l.regular(2, 12);
    l.wait(30, "the regular job to start", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    let waited = t0.elapsed();
    eprintln!(
        "regular job started {:.1} s after submission (GraceTime {GRACE_TIME_S} s)",
        waited.as_secs_f64()
    );
    assert!(
        waited <= Duration::from_secs(GRACE_TIME_S + 5),
        "the regular job waited {waited:?}, more than GraceTime + 5 s"
    );
    assert_eq!(
        l.state_of(job),
        "RUNNING",
        "the core job must not be preempted"
    );
    let left = l.wait(20, "the elastic job to keep its other node", || {
        let s = l.satellites(job);
        (s.len() == 1).then_some(s)
    });
    let regular_nodes = l
        .squeue()
        .into_iter()
        .find(|r| r.id == regular)
        .unwrap()
        .nodes;
    let regular_nodes: BTreeSet<String> = bftrainer_slurm::hostlist_expand(&regular_nodes)
        .unwrap()
        .into_iter()
        .collect();
    assert!(!regular_nodes.contains(&core_node));
    assert!(left.keys().all(|n| !regular_nodes.contains(n)));
    l.assert_no_double_allocation();

    // One more node asked: it takes the last satellite's node, not the core's (regression:
    // the daemon once released the core's node on the pending job's planned nodes).
    let t1 = Instant::now();
    let third = l.regular(1, 5);
    l.wait(30, "the 1-node job to start", || {
        (l.state_of(third) == "RUNNING").then_some(())
    });
    eprintln!(
        "1-node regular job started {:.1} s after submission",
        t1.elapsed().as_secs_f64()
    );
    assert!(t1.elapsed() <= Duration::from_secs(GRACE_TIME_S + 5));
    let third_node = l
        .squeue()
        .into_iter()
        .find(|r| r.id == third)
        .unwrap()
        .nodes;
    assert_eq!(left.keys().next(), Some(&third_node));
    assert_eq!(
        l.state_of(job),
        "RUNNING",
        "the core job must not be preempted"
    );
    l.wait(10, "no satellite left", || {
        l.satellites(job).is_empty().then_some(())
    });

    // When the regular jobs end, the elastic job grows back onto every node.
    l.wait(60, "the regular job to end", || {
        (l.state_of(regular) == "COMPLETED").then_some(())
    });
    l.grown_to_all(job);
    l.assert_no_double_allocation();
    let log = l.log_text();
    assert!(log.contains(&format!("admit job {job}")), "{log}");
    assert!(log.contains("preempted by a regular job"), "{log}");

    // Accounting: the core job and its satellites, linked by the tag.
    l.c.run("scancel", &[&job.to_string()]).unwrap();
    l.wait(30, "satellites cancelled with their parent", || {
        (l.active_satellites(job) == 0).then_some(())
    });
    let rows = l.wait(60, "accounting of the satellites", || {
        let out =
            l.c.run(
                "sacct",
                &[
                    "-a",
                    "-X",
                    "-n",
                    "-P",
                    "-o",
                    "JobID,JobName,Partition,State,NodeList,AdminComment,User",
                ],
            )
            .ok()?;
        let sat: Vec<String> = out
            .lines()
            .filter(|r| r.contains(&format!("bftsat-{job}")))
            .map(str::to_string)
            .collect();
        (sat.len() >= 6).then_some(sat)
    });
    eprintln!("satellites in sacct:\n{}", rows.join("\n"));
    // Satellites that ran carry the tag (one cancelled while pending may not: slurmdbd
    // records the admin comment when the job starts).
    for r in rows.iter().filter(|r| !r.contains("|None assigned|")) {
        assert!(
            r.contains(&format!("bftrainer:v1 1:1,role=satellite,parent={job}"))
                && r.contains("elastic-sat")
                && r.ends_with("bftuser"),
            "{r}"
        );
    }
}

#[test]
fn cluster_daemon_preempt_qos_recipe_preempts_satellites_before_cores() {
    // A site on PreemptType=preempt/qos, set up with docs/admin.md's commands ("Sites on
    // preempt/qos"): cores in QOS `elastic` (the plugin puts them there: `core_qos`),
    // satellites in `elastic-sat` (ranked below:
    // Slurm preempts the lowest QOS priority first), both added to `normal`'s preempt
    // list with `preempt+=`. A regular job of `normal` takes two nodes: Slurm preempts
    // satellites only, the core runs on, the job grows back when the nodes free.
    let s = live::setup(
        "bftq",
        "satellite_qos = \"elastic-sat\"\ncore_qos = \"elastic\"",
        "",
        "",
    );
    let mut l = Live::from_setup_with(
        s,
        bftrainer_testcluster::Options {
            preempt_qos: true,
            ..Default::default()
        },
    );
    let user = bftrainer_testcluster::TEST_USER;
    let grace = format!("GraceTime={GRACE_TIME_S}");
    for cmd in [
        vec![
            "add",
            "qos",
            "elastic",
            "Priority=1",
            "PreemptMode=REQUEUE",
            &grace,
        ],
        vec![
            "add",
            "qos",
            "elastic-sat",
            "Priority=0",
            "PreemptMode=CANCEL",
            &grace,
        ],
        vec![
            "modify",
            "qos",
            "normal",
            "set",
            "Preempt+=elastic,elastic-sat",
        ],
        // The site's scavenger tier ("Beside a scavenger partition", its QOS form):
        // it preempts bftrainer's two QOS, nothing preempts it here.
        vec![
            "add",
            "qos",
            "scavenger",
            "Priority=5",
            "PreemptMode=REQUEUE",
        ],
        vec![
            "modify",
            "qos",
            "scavenger",
            "set",
            "Preempt+=elastic,elastic-sat",
        ],
        vec![
            "modify",
            "user",
            user,
            "set",
            "QOS+=elastic,elastic-sat,scavenger",
        ],
    ] {
        let mut args = vec!["-i"];
        args.extend(cmd);
        l.c.run("sacctmgr", &args).unwrap();
    }
    // slurmctld hears of the QOS from slurmdbd (normal's new list comes with them; a
    // late one would only delay the regular job's start below, which is waited for).
    l.wait(60, "slurmctld to know the elastic QOS", || {
        l.c.run("scontrol", &["show", "assoc_mgr", "flags=qos"])
            .ok()
            .filter(|o| {
                ["QOS=elastic(", "QOS=elastic-sat(", "QOS=scavenger("]
                    .iter()
                    .all(|q| o.contains(q))
            })
    });
    l.spawn();
    // Submitted without --qos: core_qos puts it in `elastic`.
    let job = l.submit_elastic_with("1:4", &[]);
    let sats = l.grown_to_all(job);
    for id in std::iter::once(job).chain(sats.values().copied()) {
        let want = if id == job {
            "QOS=elastic"
        } else {
            "QOS=elastic-sat"
        };
        let text = show_job(&l, id);
        assert!(
            text.split_whitespace().any(|f| f == want),
            "job {id}: {text}"
        );
    }
    // Its owner cannot move it out of the QOS regular jobs preempt (running, Slurm
    // itself refuses that; pending, job_submit/bftrainer does: its unit test
    // `core_qos_puts_core_jobs_in_it_and_keeps_them_there`).
    let out = scontrol_as(&l, user, &["update", &format!("jobid={job}"), "qos=normal"]);
    assert!(
        !out.status.success(),
        "the owner moved the core to QOS normal"
    );
    assert!(
        show_job(&l, job)
            .split_whitespace()
            .any(|f| f == "QOS=elastic"),
        "{}",
        show_job(&l, job)
    );

    let t0 = Instant::now();
    let regular = l.regular(2, 12);
    l.wait(30, "the regular job to start", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    eprintln!(
        "preempt/qos: regular job started {:.1} s after submission (GraceTime {GRACE_TIME_S} s)",
        t0.elapsed().as_secs_f64()
    );
    let left = l.wait(
        20,
        "the elastic job to keep its core and one satellite",
        || {
            let s = l.satellites(job);
            (s.len() == 1).then_some(s)
        },
    );
    assert_eq!(
        l.state_of(job),
        "RUNNING",
        "the core job must not be preempted"
    );
    assert_eq!(live::restarts(&l, job), "0", "the core job was requeued");
    assert!(left.values().all(|id| sats.values().any(|s| s == id)));
    l.assert_no_double_allocation();

    l.wait(60, "the regular job to end", || {
        (l.state_of(regular) == "COMPLETED").then_some(())
    });
    l.grown_to_all(job);
    l.assert_no_double_allocation();
    assert!(l.log_text().contains("preempted by a regular job"));
    assert_eq!(live::restarts(&l, job), "0");

    // The scavenger tier: a scavenger job preempts satellites only, as a regular one
    // does, and bftrainer's jobs never preempt it (it runs on while bftrainerd lends
    // the other nodes).
    let scavenger = l.sbatch_as_user(
        &[
            "-p",
            "batch",
            "--qos=scavenger",
            "-N2",
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ],
        None,
    );
    l.wait(30, "the scavenger job to start", || {
        (l.state_of(scavenger) == "RUNNING").then_some(())
    });
    l.wait(
        20,
        "the elastic job to keep its core and one satellite beside the scavenger job",
        || (l.satellites(job).len() == 1).then_some(()),
    );
    assert_eq!(
        l.state_of(job),
        "RUNNING",
        "a scavenger job preempted the core"
    );
    assert_eq!(live::restarts(&l, job), "0", "the core job was requeued");
    l.assert_no_double_allocation();
    assert_eq!(l.state_of(scavenger), "RUNNING");
    assert_eq!(
        live::restarts(&l, scavenger),
        "0",
        "the scavenger job was requeued"
    );
    l.c.run("scancel", &[&scavenger.to_string()]).unwrap();
    l.grown_to_all(job);
}

#[test]
fn cluster_daemon_recovers_from_kill_9_without_orphans_or_duplicates() {
    let mut l = Live::start("", "", "");
    // A second daemon on the same state directory refuses to start, naming the pid.
    let pid = l.daemon.as_ref().unwrap().id();
    l.wait(10, "the lock to be taken", || {
        l.dir.join("state/bftrainerd.lock").exists().then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let out = l.daemon_cmd().output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("another bftrainerd (pid {pid})")),
        "{err}"
    );

    // SIGHUP re-reads the config; a broken one is refused and the old one kept.
    let good = std::fs::read_to_string(&l.conf).unwrap();
    std::fs::write(&l.conf, good.replace("t_fwd = 600", "t_fwd = -1")).unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    l.wait(10, "the broken config to be refused", || {
        l.log_text()
            .contains("[engine] t_fwd: -1 is out of range")
            .then_some(())
    });
    assert!(l.log_text().contains("keeping the previous config"));
    std::fs::write(&l.conf, &good).unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    l.wait(10, "the config to be reloaded", || {
        l.log_text().contains("reloaded").then_some(())
    });

    // Killed during the admit and grows: right after the first satellite appears.
    let job = l.submit_elastic("1:4");
    l.wait(60, "a first satellite", || {
        (l.active_satellites(job) >= 1).then_some(())
    });
    l.kill9();
    l.spawn();
    l.grown_to_all(job);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        l.active_satellites(job),
        3,
        "duplicate satellites: {:#?}",
        l.squeue()
    );
    l.assert_no_double_allocation();

    // Killed during a shrink: a regular job takes two nodes, the daemon dies at once.
    let regular = l.regular(2, 8);
    std::thread::sleep(Duration::from_millis(1500));
    l.kill9();
    std::thread::sleep(Duration::from_secs(2));
    l.spawn();
    l.wait(30, "the regular job to start", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    l.wait(30, "one satellite left", || {
        (l.satellites(job).len() == 1).then_some(())
    });
    l.wait(60, "the regular job to end", || {
        (l.state_of(regular) == "COMPLETED").then_some(())
    });
    l.grown_to_all(job);
    l.assert_no_double_allocation();
    assert_eq!(l.state_of(job), "RUNNING");

    // The journal replays: `bftrainer replay --journal` reads what the daemon wrote,
    // under the daemon's policy (t_fwd 600, the other settings at their defaults).
    let out = Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .args(["replay", "--t-fwd", "600", "--journal"])
        .arg(l.dir.join("state/journal.jsonl"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A clean stop leaves the satellites: the next start adopts them.
    let mut d = l.daemon.take().unwrap();
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    assert!(d.wait().unwrap().success());
    assert_eq!(l.satellites(job).len(), 3);
    l.spawn();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(l.active_satellites(job), 3);
    // The core job ends while the daemon is down: the next start cancels its satellites
    // and counts the job ended.
    l.kill9();
    l.c.run("scancel", &[&job.to_string()]).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        l.active_satellites(job),
        3,
        "satellites outlive their parent while the daemon is down"
    );
    l.spawn();
    l.wait(30, "no orphan satellite after the parent ends", || {
        (l.active_satellites(job) == 0).then_some(())
    });
    l.wait(10, "the job counted ended in status.json", || {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(l.dir.join("state/status.json")).ok()?)
                .ok()?;
        let j = v["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["job_id"] == job)?
            .clone();
        (j["state"] == "cancelled").then_some(())
    });
}

#[test]
fn cluster_daemon_sets_a_failing_node_aside_and_refuses_forged_satellites() {
    // One user's failures are charged to their job; the node is blamed at the first
    // failure only with node_blame_users = 1 (the default 2 needs two users: below).
    let l = Live::start("plain_jobs = \"scavenger\"", "node_blame_users = 1", "n3");
    // A plain job in the elastic partition (scavenger policy) holds n2: a regular claim.
    let plain =
        l.c.sbatch(&[
            "-p",
            "elastic",
            "-w",
            "n2",
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ])
        .unwrap();
    l.wait(30, "the scavenger job to run", || {
        (l.state_of(plain) == "RUNNING").then_some(())
    });
    let job = l.submit_elastic("1:4");
    // n3's satellites fail at once: n3 is set aside, n1 and n4 are used.
    let sats = l.wait(60, "satellites on the two good nodes", || {
        let s = l.satellites(job);
        (s.len() == 1 && l.state_of(job) == "RUNNING").then_some(s)
    });
    assert!(
        !sats.contains_key("n3") && !sats.contains_key("n2"),
        "{sats:?}"
    );
    let status = l.wait(30, "n3 set aside in status.json", || {
        let s = std::fs::read_to_string(l.dir.join("state/status.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&s).ok()?;
        let n3 = v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "n3")?
            .clone();
        (!n3["set_aside"].is_null()).then_some(n3)
    });
    assert!(
        status["set_aside"]["reason"]
            .as_str()
            .unwrap()
            .contains("satellite"),
        "{status}"
    );
    assert!(
        l.log_text().contains("node n3: set aside for 120 s"),
        "{}",
        l.log_text()
    );
    l.assert_no_double_allocation();

    // A satellite the daemon did not write (root may set any tag): never adopted.
    let forged =
        l.c.sbatch(&[
            "-p",
            "elastic-sat",
            "-J",
            "not-a-satellite",
            "--comment=x",
            "-o",
            "/dev/null",
            "--hold",
            "--wrap",
            "sleep 60",
        ])
        .unwrap();
    l.c.run(
        "scontrol",
        &[
            "update",
            &format!("jobid={forged}"),
            &format!("admincomment=bftrainer:v1 1:1,role=satellite,parent={job}"),
        ],
    )
    .unwrap();
    l.wait(20, "the forged satellite to be logged", || {
        l.log_text()
            .contains(&format!("not adopting job {forged}"))
            .then_some(())
    });
    assert_eq!(
        l.state_of(forged),
        "PENDING",
        "the daemon must leave a forged job alone"
    );
    assert_eq!(l.satellites(job).len(), 1);
}

/// The status file's nodes that are set aside (by name).
fn set_aside_nodes(l: &Live) -> Vec<String> {
    let s = std::fs::read_to_string(l.dir.join("state/status.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
    v["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|n| !n["set_aside"].is_null())
                .map(|n| n["name"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn cluster_daemon_charges_a_users_failing_satellites_to_their_job_not_the_pool() {
    // bftuser2's satellites fail wherever they run, for reasons of bftuser2's own (as a
    // bogus coordinator address written into their job's Comment makes them fail): only
    // that job's growth pauses; no node is set aside, and bftuser's job, submitted next,
    // grows onto every node bftuser2's core does not hold.
    let attacker_user = bftrainer_testcluster::OTHER_USER;
    let setup = live::setup_join(
        "bftblame",
        "",
        "job_backoff = 600",
        &|join: &std::path::Path| {
            format!("env BAD_USER={attacker_user} {} {{parent}}", join.display())
        },
    );
    let mut l = Live::from_setup(setup);
    l.spawn();
    let attacker = l.submit_elastic_as(attacker_user, "1:4");
    let paused = format!("elastic job {attacker}: growth paused");
    l.wait(
        60,
        "bftuser2's job paused after its satellites failed",
        || (l.state_of(attacker) == "RUNNING" && l.log_text().contains(&paused)).then_some(()),
    );
    let job = l.submit_elastic("1:4");
    let sats = l.wait(
        90,
        "bftuser's job to grow onto the other three nodes",
        || {
            let s = l.satellites(job);
            (l.state_of(job) == "RUNNING" && s.len() == 2).then_some(s)
        },
    );
    eprintln!("bftuser's satellites: {sats:?}");
    l.assert_no_double_allocation();
    // The attacker's core kept running; it grew no further; no node was set aside.
    assert_eq!(l.state_of(attacker), "RUNNING");
    assert_eq!(l.satellites(attacker).len(), 0);
    let log = l.log_text();
    assert!(set_aside_nodes(&l).is_empty(), "{log}");
    assert!(!log.contains(": set aside for"), "{log}");
    // The pause shows in `bftrainer jobs --json` (the owner's view).
    let out =
        l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
            .args(["jobs", "--json", "--config"])
            .arg(&l.conf)
            .output()
            .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let a = v
        .as_array()
        .and_then(|a| a.iter().find(|j| j["job_id"] == attacker).cloned())
        .unwrap_or_default();
    assert!(
        a["paused_until"].as_f64().is_some()
            && a["pause_reason"]
                .as_str()
                .is_some_and(|r| r.contains(&format!("of job {attacker} ended"))),
        "{v:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn daemon_refuses_bad_configs_naming_file_key_and_allowed_values() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let cases = [
        (
            "[daemon]\npoll_intervall = 1\n",
            "[daemon] poll_intervall: unknown key; allowed keys: poll_interval",
        ),
        (
            "[daemon]\npoll_interval = \"1s\"\n",
            "[daemon] poll_interval: expected seconds from 0.05 to 60, found string",
        ),
        (
            "[engine]\nmax_jobs = 0\n",
            "[engine] max_jobs: 0 is out of range; expected a whole number from 1 to 100000",
        ),
        (
            "[daemon]\nstate_dir = \"/nonexistent/bft\"\n",
            "[daemon] state_dir: '/nonexistent/bft': No such file or directory",
        ),
    ];
    for (text, want) in cases {
        let f = dir.path().join("bftrainer.toml");
        let body = if text.contains("state_dir") {
            text.to_string()
        } else {
            format!("{text}[policy]\n")
        };
        let body = if text.contains("state_dir") || text.starts_with("[daemon]") {
            body
        } else {
            format!("[daemon]\nstate_dir = \"{}\"\n{body}", state.display())
        };
        std::fs::write(&f, &body).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_bftrainerd"))
            .arg("--config")
            .arg(&f)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{body}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}: {want}", f.display())),
            "{body}\n{err}"
        );
    }
}

/// One user's two jobs split the nodes as `bftrainer solve` does; then Mallory
/// (bftuser2) submits with the largest profile and free rescales (`up=0,down=0`): Alice
/// (bftuser) keeps her fair share (half of the 4 nodes), no job of hers is requeued, and
/// `bftrainer solve` gives the same split.
#[test]
fn cluster_daemon_splits_nodes_between_two_jobs_as_solve_does() {
    let profiles = tempfile::Builder::new()
        .prefix("bftprof")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(profiles.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        profiles.path().join("fast.toml"),
        "points = [[1, 3.0], [3, 12.0]]\nup = 20\ndown = 5\n",
    )
    .unwrap();
    std::fs::write(
        profiles.path().join("huge.toml"),
        "points = [[1, 1.0e9], [4, 4.0e9]]\nup = 0\ndown = 0\n",
    )
    .unwrap();
    let mut l = Live::start_without_daemon(
        &format!("profile_dir = \"{}\"", profiles.path().display()),
        "",
        "",
    );
    // Both submitted before the daemon starts: one decision over both.
    let a = l.submit_elastic("1:4");
    let b = l.submit_elastic("1:3,profile=fast");
    l.spawn();
    let sizes = l.wait(60, "both jobs to settle on all 4 nodes", || {
        let (x, y) = (l.elastic_size(a), l.elastic_size(b));
        (x + y == 4 && x >= 1 && y >= 2).then_some((x, y))
    });
    // The same instance through `bftrainer solve`: linear default curve for a (default
    // costs 30/10 s), the profile for b, t_fwd 600, four nodes, nothing held yet; both
    // of one user, so the objective alone splits them.
    let instance = serde_json::json!({
        "t_fwd_s": 600,
        "nodes": ["n1", "n2", "n3", "n4"],
        "jobs": [
            {"id": a.to_string(), "user": 1, "min_nodes": 1, "max_nodes": 4, "scale_up_s": 30, "scale_down_s": 10, "curve": [[1, 1.0], [4, 4.0]]},
            {"id": b.to_string(), "user": 1, "min_nodes": 1, "max_nodes": 3, "scale_up_s": 20, "scale_down_s": 5, "curve": [[1, 3.0], [3, 12.0]]}
        ]
    });
    let solve = |instance: &serde_json::Value| -> serde_json::Value {
        let mut solve = Command::new(env!("CARGO_BIN_EXE_bftrainer"))
            .arg("solve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        solve
            .stdin
            .take()
            .unwrap()
            .write_all(instance.to_string().as_bytes())
            .unwrap();
        let out = solve.wait_with_output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let sol = solve(&instance);
    let count = |sol: &serde_json::Value, id: u32| {
        sol["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id.to_string().as_str())
            .unwrap()["nodes"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!((count(&sol, a), count(&sol, b)), (1, 3), "solve: {sol}");
    // Stable: the daemon's split equals the optimum and stays there.
    l.cycles_later(3);
    assert_eq!(
        sizes,
        (count(&sol, a), count(&sol, b)),
        "daemon split {sizes:?}, solve {sol}"
    );
    assert_eq!((l.elastic_size(a), l.elastic_size(b)), sizes);
    l.assert_no_double_allocation();

    // Mallory's declarations: the largest profile there is, rescales for free.
    let m = l.submit_elastic_as("bftuser2", "1:4,profile=huge,up=0,down=0");
    l.wait(
        120,
        "Mallory on her share (2 nodes) beside Alice's (2)",
        || (l.elastic_size(m) == 2 && l.elastic_size(a) + l.elastic_size(b) == 2).then_some(()),
    );
    l.cycles_later(3);
    let alice = l.elastic_size(a) + l.elastic_size(b);
    // Two users with demand share 4 nodes: 2 each, whatever Mallory declares.
    assert!(
        alice >= 2 && l.elastic_size(m) == 2,
        "alice {alice}, mallory {}\n{}",
        l.elastic_size(m),
        l.log_text()
    );
    for j in [a, b] {
        let show =
            l.c.run("scontrol", &["show", "job", "-o", &j.to_string()])
                .unwrap();
        assert!(
            show.contains("JobState=RUNNING") && show.contains("Restarts=0"),
            "Alice's job {j} was requeued for Mallory's: {show}\n{}",
            l.log_text()
        );
    }
    // `bftrainer solve` on that state gives the same split.
    let held = |j: u32| -> Vec<String> {
        l.squeue()
            .into_iter()
            .filter(|r| r.state == "RUNNING" && (r.id == j || r.name == format!("bftsat-{j}")))
            .flat_map(|r| bftrainer_slurm::hostlist_expand(&r.nodes).unwrap())
            .collect()
    };
    let now = serde_json::json!({
        "t_fwd_s": 600,
        "nodes": ["n1", "n2", "n3", "n4"],
        "jobs": [
            {"id": a.to_string(), "user": 1, "min_nodes": 1, "max_nodes": 4, "scale_up_s": 30, "scale_down_s": 10, "curve": [[1, 1.0], [4, 4.0]], "nodes": held(a)},
            {"id": b.to_string(), "user": 1, "min_nodes": 1, "max_nodes": 3, "scale_up_s": 20, "scale_down_s": 5, "curve": [[1, 3.0], [3, 12.0]], "nodes": held(b)},
            {"id": m.to_string(), "user": 2, "min_nodes": 1, "max_nodes": 4, "scale_up_s": 10, "scale_down_s": 5, "curve": [[1, 1.0e9], [4, 4.0e9]], "nodes": held(m)}
        ]
    });
    let sol = solve(&now);
    assert_eq!(
        (count(&sol, a) + count(&sol, b), count(&sol, m)),
        (alice, 2),
        "solve: {sol}"
    );
    l.assert_no_double_allocation();
}

#[test]
fn cluster_daemon_burst_of_regular_jobs_waits_no_longer_than_grace_plus_5s() {
    let l = Live::start("", "", "");
    // Start offsets of a burst of 50 one-node jobs (3 s each), in submission order.
    let burst = |tag: &str| -> Vec<f64> {
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let mut ids = Vec::new();
        for i in 0..50 {
            ids.push(
                l.c.sbatch(&[
                    "-p",
                    "batch",
                    "-N1",
                    "--exclusive",
                    "-J",
                    &format!("{tag}{i}"),
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "sleep 3",
                ])
                .unwrap(),
            );
        }
        let last = *ids.last().unwrap();
        l.wait(180, "the burst to finish", || {
            (l.state_of(last) == "COMPLETED").then_some(())
        });
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        let rows = l.wait(60, "accounting of the burst", || {
            let out =
                l.c.run(
                    "sacct",
                    &[
                        "-a",
                        "-X",
                        "-n",
                        "-P",
                        "-j",
                        &list.join(","),
                        "-o",
                        "JobID,Start",
                    ],
                )
                .ok()?;
            let starts: BTreeMap<u32, String> = out
                .lines()
                .filter_map(|r| r.split_once('|'))
                .map(|(i, s)| (i.parse().unwrap_or(0), s.to_string()))
                .collect();
            (starts.len() == 50 && starts.values().all(|s| s.contains('T'))).then_some(starts)
        });
        ids.iter()
            .map(|id| {
                let s = &rows[id];
                let out = Command::new("date")
                    .args(["-d", s, "+%s"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<f64>()
                    .unwrap()
                    - t0.floor()
            })
            .collect()
    };
    let idle = burst("idle");
    let job = l.submit_elastic("1:4");
    l.grown_to_all(job);
    let harvested = burst("busy");
    let mut worst: f64 = f64::NEG_INFINITY;
    for (i, (a, b)) in idle.iter().zip(&harvested).enumerate() {
        worst = worst.max(b - a);
        assert!(
            b - a <= (GRACE_TIME_S + 5) as f64,
            "job {i} of the burst started {b:.0} s after the burst with the elastic job, {a:.0} s on an idle cluster"
        );
    }
    eprintln!("burst of 50: worst start delay against the idle cluster {worst:.0} s (sacct's whole seconds)");
    // The elastic job is still there and grows back afterwards.
    l.grown_to_all(job);
    l.assert_no_double_allocation();
}

#[test]
fn cluster_daemon_rides_out_slurmctld_slurmdbd_and_slurmd_faults() {
    let l = Live::start("", "", "");
    let job = l.submit_elastic("1:4");
    l.grown_to_all(job);

    // slurmctld restarted under the daemon, away for longer than MessageTimeout (10 s;
    // libslurm retries a connection that long before it fails): logged once, back to
    // normal within 10 s of answering again.
    l.c.stop_daemon("slurmctld", false).unwrap();
    std::thread::sleep(Duration::from_secs(25));
    l.c.start_daemon("slurmctld").unwrap();
    let t = Instant::now();
    l.wait(10, "the daemon to see slurmctld again", || {
        l.log_text()
            .contains("slurmctld answers again")
            .then_some(())
    });
    // A satellite whose step was launching while slurmctld was away fails, and the
    // job's growth is then paused for `job_backoff` (60 s, docs/admin.md) before
    // its node is lent again: seen once in a clean-clone run in the 26.05 root.
    l.grown_to_all_within(job, 150);
    eprintln!(
        "back to normal {:.1} s after slurmctld answered",
        t.elapsed().as_secs_f64()
    );
    let log = l.log_text();
    assert_eq!(log.matches("slurmctld does not answer").count(), 1, "{log}");
    assert_eq!(l.active_satellites(job), 3);
    l.assert_no_double_allocation();

    // slurmdbd away: the daemon does not need it; a preemption and a grow go on.
    l.c.stop_daemon("slurmdbd", false).unwrap();
    let regular = l.regular(1, 4);
    l.wait(15, "the regular job to start without slurmdbd", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    l.wait(30, "the regular job to end", || {
        (l.state_of(regular) == "COMPLETED").then_some(())
    });
    l.grown_to_all(job);
    std::thread::sleep(Duration::from_secs(15));
    l.c.start_daemon("slurmdbd").unwrap();
    l.assert_no_double_allocation();

    // A slurmd killed while it runs a satellite: the node goes down, the job keeps the
    // others; when the slurmd returns, the job grows back onto it.
    let sats = l.satellites(job);
    let (node, _) = sats.iter().next().unwrap();
    let node = node.clone();
    l.c.stop_daemon(&format!("slurmd-{node}"), true).unwrap();
    l.wait(90, &format!("{node} to be given up"), || {
        let s = l.satellites(job);
        (!s.contains_key(&node) && l.state_of(job) == "RUNNING").then_some(())
    });
    l.assert_no_double_allocation();
    l.c.start_daemon(&format!("slurmd-{node}")).unwrap();
    l.grown_to_all(job);
    l.assert_no_double_allocation();
}

#[test]
fn cluster_daemon_gives_back_nodes_the_backfill_plan_needs_before_it_needs_them() {
    // Forecasts within 50 s release satellites' nodes (never a core's) early.
    let l = Live::start("", "release_before = 50\nplan_refresh = 1", "");
    // A regular job on n4 that ends by its 1-minute limit: a 4-node regular job then
    // cannot start before that, and backfill plans it on all four nodes.
    let blocker =
        l.c.sbatch(&[
            "-p",
            "batch",
            "-w",
            "n4",
            "-t",
            "1",
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ])
        .unwrap();
    l.wait(30, "the blocker to run", || {
        (l.state_of(blocker) == "RUNNING").then_some(())
    });
    let job = l.submit_elastic("1:4");
    l.wait(60, "the elastic job to grow onto the 3 free nodes", || {
        (l.state_of(job) == "RUNNING" && l.satellites(job).len() == 2).then_some(())
    });
    let big = l.regular(4, 2);
    // The plan (start about 60 s after the blocker's start, on n[1-4]) reaches the
    // daemon; it takes the satellites' nodes back while the big job still waits.
    l.wait(
        40,
        "the satellites to be given back ahead of the plan",
        || (l.satellites(job).is_empty() && l.state_of(big) == "PENDING").then_some(()),
    );
    assert_eq!(
        l.state_of(job),
        "RUNNING",
        "the core stays until the big job actually needs it"
    );
    let log = l.log_text();
    assert!(log.contains(&format!("shrink job {job} off")), "{log}");
    // The blocker ends early: the big job starts at once (it preempts the core only).
    let t = Instant::now();
    l.c.run("scancel", &[&blocker.to_string()]).unwrap();
    l.wait(30, "the big job to start", || {
        matches!(l.state_of(big).as_str(), "RUNNING" | "COMPLETED").then_some(())
    });
    eprintln!(
        "4-node job started {:.1} s after the blocker was cancelled",
        t.elapsed().as_secs_f64()
    );
    assert!(t.elapsed() <= Duration::from_secs(GRACE_TIME_S + 5));
    l.assert_no_double_allocation();
}

/// A job whose BeginTime is ahead (`--begin`, or Slurm's delay after a requeue) is not
/// admitted before it: pinned, it would hold idle nodes until its admission timed out.
#[test]
fn cluster_daemon_does_not_admit_a_job_before_its_begin_time() {
    let l = Live::start("", "", "");
    let job = l.sbatch_as_user(
        &[
            "--elastic=1:2",
            "--begin=now+600",
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 600",
        ],
        None,
    );
    let why = format!("elastic job {job} is not admitted: it may not start before");
    l.wait(30, "the job reported not yet eligible", || {
        l.log_text().contains(&why).then_some(())
    });
    l.cycles_later(5);
    assert!(
        !l.log_text().contains(&format!("admit job {job} (user")),
        "admitted before its BeginTime:\n{}",
        l.log_text()
    );
    assert_eq!(l.state_of(job), "PENDING");
}

#[test]
fn cluster_daemon_holds_an_admission_that_does_not_start_and_replans() {
    // A core job that cannot start when released (it depends on a job that runs for
    // 10 minutes; a BeginTime ahead would keep bftrainerd from admitting it at all):
    // after admit_timeout it is held again and its nodes go back to the pool.
    let l = Live::start("", "admit_timeout = 4\njob_backoff = 2", "");
    let blocker =
        l.c.sbatch(&["-p", "batch", "-o", "/dev/null", "--wrap", "sleep 600"])
            .unwrap();
    let after = format!("--dependency=afterany:{blocker}");
    let job = l.sbatch_as_user(
        &[
            "--elastic=1:4",
            &after,
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 600",
        ],
        None,
    );
    l.wait(30, "the admission to time out", || {
        l.log_text()
            .contains(&format!(
                "elastic job {job} did not start within 4 s of its admission"
            ))
            .then_some(())
    });
    l.wait(15, "the job to be held again", || {
        let out =
            l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
                .ok()?;
        out.contains(" Priority=0 ").then_some(())
    });
    assert_eq!(
        l.active_satellites(job),
        0,
        "no satellite for a core that never ran"
    );
    assert_eq!(l.state_of(job), "PENDING");
    // Its own dependency keeps it pending: the job, not a node, is charged (a pause of
    // job_backoff), and no node is set aside.
    l.wait(15, "the job's growth paused", || {
        l.log_text()
            .contains(&format!("elastic job {job}: growth paused for 2 s"))
            .then_some(())
    });
    assert!(set_aside_nodes(&l).is_empty());
    // Re-planned: admitted again later.
    l.wait(30, "a second admission", || {
        (l.log_text().matches(&format!("admit job {job} ")).count() >= 2).then_some(())
    });
}

/// Why `name` is or is not lent (`bftrainer nodes --json`).
fn node_why(l: &Live, name: &str) -> String {
    let v = l.cli_json("nodes");
    v.as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == name))
        .map(|n| n["why"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[test]
fn cluster_daemon_keeps_a_core_on_a_draining_node_and_drops_a_node_removed_from_the_partitions() {
    let l = Live::start("", "", "");
    let job = l.submit_elastic("1:4");
    let sats = l.grown_to_all(job);
    let core = l.squeue().into_iter().find(|r| r.id == job).unwrap().nodes;

    // An admin drains the core's node: running jobs may finish there, so the core is
    // not requeued (its satellites keep running); nothing new is lent there.
    l.c.run(
        "scontrol",
        &[
            "update",
            &format!("nodename={core}"),
            "state=drain",
            "reason=maintenance-later",
        ],
    )
    .unwrap();
    l.wait(30, "the draining node seen by bftrainerd", || {
        (node_why(&l, &core) == "unavailable").then_some(())
    });
    l.cycles_later(3);
    let show =
        l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
            .unwrap();
    assert!(
        show.contains("JobState=RUNNING") && show.contains("Restarts=0"),
        "the core was requeued off its draining node: {show}\n{}",
        l.log_text()
    );
    assert_eq!(l.satellites(job), sats, "{}", l.log_text());

    // The states in which Slurm keeps the job on the drained core node, each kept by
    // bftrainerd too (issue 33): Restarts stays 0 and the core runs on.
    let kept = |what: &str| {
        l.cycles_later(3);
        let show =
            l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
                .unwrap();
        assert!(
            show.contains("JobState=RUNNING") && show.contains("Restarts=0"),
            "the core was requeued off its node ({what}): {show}\n{}",
            l.log_text()
        );
    };
    let node_state = || l.c.run("scontrol", &["show", "node", "-o", &core]).unwrap();
    // Its slurmd misses pings, for less than SlurmdTimeout (30 s): DRAIN+NOT_RESPONDING,
    // not DOWN. slurmd is stopped, so that no answer clears the flag; the flag itself is
    // set at once (`state=noresp`, what a missed ping sets) rather than awaited from
    // slurmctld's next ping: on a loaded machine that ping's timeout (MessageTimeout,
    // 10 s, after up to SlurmdTimeout/3) raced the DOWN at SlurmdTimeout.
    let slurmd = l.c.daemon_pid(&format!("slurmd-{core}")).unwrap() as i32;
    // SAFETY: a signal to the cluster's own slurmd, which this test started.
    unsafe { libc::kill(slurmd, libc::SIGSTOP) };
    l.c.run(
        "scontrol",
        &["update", &format!("nodename={core}"), "state=noresp"],
    )
    .unwrap();
    l.wait(30, "the core's node not responding", || {
        node_state().contains("NOT_RESPONDING").then_some(())
    });
    let missed = node_state();
    kept("drained, not responding");
    let still = node_state();
    unsafe { libc::kill(slurmd, libc::SIGCONT) };
    assert!(!missed.contains("State=DOWN"), "{missed}");
    assert!(
        still.contains("NOT_RESPONDING"),
        "the flag went before bftrainerd's cycles saw it: {still}"
    );
    l.wait(120, "the core's node responding again", || {
        (!node_state().contains("NOT_RESPONDING")).then_some(())
    });
    // FAIL, then a maintenance reservation that ignores the running job.
    l.c.run(
        "scontrol",
        &[
            "update",
            &format!("nodename={core}"),
            "state=fail",
            "reason=failing-later",
        ],
    )
    .unwrap();
    kept("failing");
    l.c.run(
        "scontrol",
        &[
            "create",
            "reservation",
            "reservationname=bft-maint",
            &format!("nodes={core}"),
            "starttime=now",
            "duration=10",
            "users=root",
            "flags=maint,ignore_jobs",
        ],
    )
    .unwrap();
    l.wait(30, "the maintenance reservation on the core's node", || {
        node_state().contains("MAINT").then_some(())
    });
    kept("maintenance reservation");
    l.c.run("scontrol", &["delete", "reservation=bft-maint"])
        .unwrap();

    // A satellite's node leaves both elastic partitions: the job shrinks off it and it
    // is never lent again (it stays in `batch`).
    let (gone, sat) = sats.iter().next().map(|(n, s)| (n.clone(), *s)).unwrap();
    let rest: Vec<&str> =
        l.c.nodes()
            .iter()
            .map(String::as_str)
            .filter(|n| *n != gone)
            .collect();
    for p in ["elastic", "elastic-sat"] {
        l.c.run(
            "scontrol",
            &[
                "update",
                &format!("partitionname={p}"),
                &format!("nodes={}", rest.join(",")),
            ],
        )
        .unwrap();
    }
    l.wait(60, "the satellite on the removed node ended", || {
        (!l.satellites(job).contains_key(&gone)).then_some(())
    });
    assert!(
        l.log_text()
            .contains(&format!("node {gone}: no longer in the elastic partitions")),
        "{}",
        l.log_text()
    );
    l.cycles_later(3);
    assert!(!l.satellites(job).contains_key(&gone));
    assert_ne!(l.state_of(sat), "RUNNING");
    assert_eq!(node_why(&l, &gone), "unavailable");
}

#[test]
fn cluster_daemon_does_not_admit_a_job_whose_constraint_no_idle_node_meets() {
    // Nodes n1 and n2 carry feature rack1 (the harness's slurm.conf). A regular job
    // holds both; an elastic job asking --constraint=rack1 must not be admitted onto
    // n3/n4 (it would only time out there, again and again): it waits, and says why.
    let l = Live::start("", "", "");
    let (blocker, job) =
        unservable_while_n1_n2_are_taken(&l, "1:2", "--constraint=rack1", "--constraint=rack1");
    // rack1's nodes free up: the job may be admitted again.
    l.c.run("scancel", &[&blocker.to_string()]).unwrap();
    l.wait(30, "the job servable again", || {
        l.log_text()
            .contains(&format!("elastic job {job}: lent nodes can serve it now"))
            .then_some(())
    });
}

#[test]
fn cluster_daemon_gives_a_free_slot_to_the_user_with_fewer_jobs() {
    // Two slots (max_jobs = 2). bftuser's first two jobs hold them and a third waits;
    // then bftuser2 submits one. When a slot frees, bftuser2's job is admitted, not
    // bftuser's third, though it was submitted later. The per-user cap (by default half the
    // slots, 1 here) is lifted: the order alone is tested.
    let mut l = Live::start_without_daemon("", "", "");
    let conf = std::fs::read_to_string(&l.conf).unwrap();
    assert!(conf.contains("[engine]\n"));
    std::fs::write(
        &l.conf,
        conf.replace(
            "[engine]\n",
            "[engine]\nmax_jobs = 2\nmax_jobs_per_user = 0\n",
        ),
    )
    .unwrap();
    l.spawn();
    let a: Vec<u32> = (0..3).map(|_| l.submit_elastic("1:1")).collect();
    l.wait(60, "bftuser's first two jobs running", || {
        (l.state_of(a[0]) == "RUNNING" && l.state_of(a[1]) == "RUNNING").then_some(())
    });
    let b = l.submit_elastic_as(bftrainer_testcluster::OTHER_USER, "1:1");
    // Both wait: no slot.
    l.cycles_later(3);
    assert_eq!(l.state_of(a[2]), "PENDING");
    assert_eq!(l.state_of(b), "PENDING");
    l.c.run("scancel", &[&a[0].to_string()]).unwrap();
    l.wait(60, "bftuser2's job admitted to the free slot", || {
        (l.state_of(b) == "RUNNING").then_some(())
    });
    assert_eq!(l.state_of(a[2]), "PENDING", "{}", l.log_text());
}

#[test]
fn cluster_daemon_admits_waiting_jobs_by_slurms_priority_factors() {
    // Slurm gives held jobs no priority, so bftrainerd computes the one its multifactor
    // plugin would give them. One slot (max_jobs = 1), held by a job of bftuser; then
    // bftuser submits a job, and bftuser2 one later in QOS `high` (priority 100,
    // PriorityWeightQOS=1000). When the slot frees, bftuser2's job is admitted first.
    // Before this, both waited at priority 0 and submit order admitted bftuser's.
    let mut l = Live::start_without_daemon("", "", "");
    let conf = std::fs::read_to_string(&l.conf).unwrap();
    std::fs::write(
        &l.conf,
        conf.replace("[engine]\n", "[engine]\nmax_jobs = 1\n"),
    )
    .unwrap();
    let slurm_conf = l.c.slurm_conf().to_path_buf();
    let text = std::fs::read_to_string(&slurm_conf).unwrap();
    assert!(text.contains("PriorityType=priority/basic\n"));
    std::fs::write(
        &slurm_conf,
        text.replace(
            "PriorityType=priority/basic\n",
            "PriorityType=priority/multifactor\nPriorityWeightQOS=1000\nPriorityWeightFairshare=100\nPriorityWeightAge=0\n",
        ),
    )
    .unwrap();
    l.c.stop_daemon("slurmctld", false).unwrap();
    l.c.start_daemon("slurmctld").unwrap();
    l.c.run("sacctmgr", &["-i", "add", "qos", "high", "Priority=100"])
        .unwrap();
    l.c.run(
        "sacctmgr",
        &[
            "-i",
            "modify",
            "user",
            bftrainer_testcluster::OTHER_USER,
            "set",
            "qos+=high",
        ],
    )
    .unwrap();
    // slurmctld hears of the QOS from slurmdbd.
    l.wait(60, "slurmctld to know QOS high", || {
        l.c.run("scontrol", &["show", "assoc_mgr", "flags=qos"])
            .ok()
            .filter(|o| o.contains("QOS=high("))
    });
    // The safe layer reads the same table (bftrainerd's input).
    let slurm = bftrainer_slurm::Slurm::init_with_config(&slurm_conf).unwrap();
    let w = slurm.priority_weights().unwrap();
    assert!(w.multifactor, "{w:?}");
    assert_eq!((w.qos, w.fairshare, w.age), (1000, 100, 0));
    let table = slurm.fairshare_table().unwrap();
    assert_eq!(table.qos.get("high"), Some(&100), "{table:?}");
    assert!(
        table
            .users
            .keys()
            .any(|(_, u)| u == bftrainer_testcluster::OTHER_USER),
        "bftuser2's association: {table:?}"
    );
    assert!(table.users.values().all(|f| (0.0..=1.0).contains(f)));

    l.spawn();
    let first = l.submit_elastic("1:1");
    l.wait(60, "bftuser's first job running", || {
        (l.state_of(first) == "RUNNING").then_some(())
    });
    let a = l.submit_elastic("1:1");
    let b = l.submit_elastic_as_with(bftrainer_testcluster::OTHER_USER, "1:1", &["--qos=high"]);
    l.cycles_later(3);
    assert_eq!(l.state_of(a), "PENDING");
    assert_eq!(l.state_of(b), "PENDING");
    l.c.run("scancel", &[&first.to_string()]).unwrap();
    l.wait(
        60,
        "bftuser2's job (QOS high) admitted to the free slot",
        || (l.state_of(b) == "RUNNING").then_some(()),
    );
    assert_eq!(l.state_of(a), "PENDING", "{}", l.log_text());
}

#[test]
fn cluster_daemon_gives_satellites_the_core_jobs_gpus_per_node() {
    // Four nodes with four stand-in GPUs each, each job confined to its own GPUs by its
    // device cgroup (`cluster up --gpus 4 --constrain-devices`: task/cgroup,
    // ConstrainDevices=yes, as GPU clusters run). An elastic job asks --gres=gpu:2:
    // each satellite is submitted with the core job's per-node request as Slurm holds it
    // (TresPerNode). On the exclusive satellite partition Slurm gives the satellite every
    // GPU of its node, as it gives the core job (docs/admin.md, "Whole nodes get all
    // their GPUs"), and the step that runs the satellite's work sees all four in
    // CUDA_VISIBLE_DEVICES and may open exactly those. Exclusive alone grants no GRES:
    // a satellite without the request, or a step that does not ask for the GPUs, could
    // open none of them.
    let s = live::setup_join("bftd-gpu", "", "", &|join: &std::path::Path| {
        let seen = join.with_file_name("seen");
        std::fs::create_dir_all(&seen).unwrap();
        std::fs::set_permissions(&seen, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let script = join.with_file_name("join-gpu.sh");
        // Opening a stand-in GPU fails either way (no driver): ENXIO ("No such device or
        // address") where the cgroup lets the step in, EPERM where it does not.
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nseen={seen}\nout=$seen/.$SLURMD_NODENAME.$$\n\
                 echo \"${{CUDA_VISIBLE_DEVICES:-none}}\" > $out\n\
                 for f in $(cat $seen/../devdir)/$SLURMD_NODENAME/nvidia*; do\n\
                 echo \"$(basename $f) $( (: < $f) 2>&1 )\" >> $out\ndone\n\
                 mv $out $seen/$SLURMD_NODENAME\nexec sleep 3600\n",
                seen = seen.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        format!("{} {{parent}}", script.display())
    });
    let seen = s.dir.join("seen");
    let devdir = s.dir.join("devdir");
    // Confinement needs cgroup v1's device controller (Debian 12's hosts here have it);
    // elsewhere the GPUs are checked unconfined, and the test says so.
    let confined = std::path::Path::new("/sys/fs/cgroup/devices/devices.deny").exists();
    if !confined {
        eprintln!(
            "NOTE: no cgroup v1 device controller at /sys/fs/cgroup/devices: the satellites' \
             GPUs are checked without device confinement"
        );
    }
    let mut l = Live::from_setup_with(
        s,
        bftrainer_testcluster::Options {
            gpus: Some("4".into()),
            constrain_devices: confined,
            ..Default::default()
        },
    );
    std::fs::write(&devdir, l.c.dir().join("dev").display().to_string()).unwrap();
    l.spawn();
    let job = l.submit_elastic_with("1:4", &["--gres=gpu:2"]);
    let sats = l.grown_to_all(job);
    assert_eq!(sats.len(), 3, "{sats:?}");
    let core_tres =
        l.c.run("squeue", &["-h", "-j", &job.to_string(), "-o", "%b"])
            .unwrap();
    assert!(
        core_tres.contains("gpu:2"),
        "core's TresPerNode: {core_tres}"
    );
    for (node, sat) in &sats {
        let tres =
            l.c.run("squeue", &["-h", "-j", &sat.to_string(), "-o", "%b"])
                .unwrap();
        assert_eq!(tres.trim(), core_tres.trim(), "satellite {sat} on {node}");
        let report = l.wait(60, "the satellite's step to report its GPUs", || {
            std::fs::read_to_string(seen.join(node)).ok()
        });
        let mut lines = report.lines();
        let cvd = lines.next().unwrap_or_default();
        let gpus: Vec<&str> = cvd.trim().split(',').collect();
        assert_eq!(gpus.len(), 4, "satellite {sat} on {node} sees {report:?}");
        let opens: Vec<&str> = lines.collect();
        assert_eq!(opens.len(), 4, "the node's four devices: {report:?}");
        if !confined {
            continue;
        }
        let allowed = opens
            .iter()
            .filter(|l| l.contains("No such device or address"))
            .count();
        let denied = opens
            .iter()
            .filter(|l| l.contains("Operation not permitted"))
            .count();
        assert_eq!(
            (allowed, denied),
            (4, 0),
            "satellite {sat} on {node}: its step may open the 4 GPUs it holds: {report:?}"
        );
    }
    l.assert_no_double_allocation();
}

#[test]
fn cluster_daemon_places_a_gpu_job_only_on_nodes_with_its_gpus() {
    // n1 and n2 have two a100 GPUs each, n3 and n4 none. A regular job holds n1 and
    // n2; an elastic job asking --gres=gpu:a100:2 (1 to 4 nodes) is not admitted onto
    // n3/n4: it waits and says why, in the log and in `bftrainer jobs`. Once the GPU
    // nodes are free it is admitted onto one and grows onto the other, never onto n3
    // or n4 (the engine places it by the nodes' GRES).
    let s = live::setup("bftd-gpuwait", "", "", "");
    let mut l = Live::from_setup_with(
        s,
        bftrainer_testcluster::Options {
            gpus: Some("1-2=a100:2".into()),
            ..Default::default()
        },
    );
    l.spawn();
    let (blocker, job) = unservable_while_n1_n2_are_taken(
        &l,
        "1:4",
        "--gres=gpu:a100:2",
        "2 GPUs of type a100 per node",
    );
    l.c.run("scancel", &[&blocker.to_string()]).unwrap();
    let sats = l.wait(90, "the job on both GPU nodes", || {
        let sats = l.satellites(job);
        (l.state_of(job) == "RUNNING" && sats.len() == 1).then_some(sats)
    });
    let core =
        l.c.run("squeue", &["-h", "-j", &job.to_string(), "-o", "%N"])
            .unwrap();
    let mut on: Vec<String> = sats.keys().cloned().collect();
    on.push(core.trim().to_string());
    on.sort();
    assert_eq!(on, vec!["n1", "n2"], "core on {core}, satellites {sats:?}");
    // n3 and n4 stay idle: no admission or growth onto them.
    l.cycles_later(5);
    let log = l.log_text();
    for n in ["n3", "n4"] {
        assert!(
            !log.contains(&format!("grow job {job} onto {n}"))
                && !log.contains(&format!("admit job {job} (user bftuser) on {n}")),
            "lent {n} without GPUs:\n{log}"
        );
    }
    assert_eq!(l.satellites(job).len(), 1);
}

/// `scontrol` as bftuser; panics with its stderr when it fails.
fn scontrol_as_user(l: &Live, args: &[&str]) {
    let out = scontrol_as(l, bftrainer_testcluster::TEST_USER, args);
    assert!(
        out.status.success(),
        "scontrol {args:?} as bftuser: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `scontrol ARGS` as `user`; its output, whether it succeeded or not.
fn scontrol_as(l: &Live, user: &str, args: &[&str]) -> std::process::Output {
    l.c.command_as(user, "scontrol")
        .unwrap()
        .current_dir("/tmp")
        .args(args)
        .output()
        .unwrap()
}

/// What `bftrainer jobs` prints, as root.
fn jobs_text(l: &Live) -> String {
    let out =
        l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
            .args(["jobs", "--config"])
            .arg(&l.conf)
            .output()
            .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `scontrol show job` of `id`, as root.
fn show_job(l: &Live, id: u32) -> String {
    l.c.run("scontrol", &["show", "job", &id.to_string()])
        .unwrap()
}

/// The nodes of bftrainerd's admission of `job` ("admit job J (user U) on NODES...").
fn admitted_on(l: &Live, job: u32) -> Option<String> {
    let text = l.log_text();
    // The last one: an admission re-planned before it started is made again.
    let at = text.rfind(&format!("admit job {job} "))?;
    let line = text[at..].lines().next()?;
    let nodes = line.split(" on ").nth(1)?;
    Some(nodes.split(',').next()?.trim().to_string())
}

/// A hold placed by an administrator (root's `scontrol hold`, or a Slurm operator's:
/// AdminLevel=Operator in slurmdbd) or by the job's owner keeps a waiting elastic job from being admitted while nodes sit idle, and `bftrainer
/// jobs` says why; `scontrol release` hands it back and bftrainerd admits it onto the
/// nodes it chooses. bftrainerd's own holds and releases are not taken for either.
#[test]
fn cluster_daemon_honours_admin_and_owner_holds_of_waiting_jobs() {
    let mut l = Live::start_without_daemon("", "", "");
    let by_admin = l.submit_elastic("1:1");
    let by_owner = l.submit_elastic("1:1");
    let by_operator = l.submit_elastic("1:1");
    l.c.run("scontrol", &["hold", &by_admin.to_string()])
        .unwrap();
    scontrol_as_user(&l, &["hold", &by_owner.to_string()]);
    // bftuser2 may not touch bftuser's job (Slurm's rule) until slurmdbd makes it an
    // operator; then its hold is an administrator's, recorded as root's is (Slurm
    // lets an operator set no admin comment: the plugin writes it into the record).
    let other = bftrainer_testcluster::OTHER_USER;
    let denied = scontrol_as(&l, other, &["hold", &by_operator.to_string()]);
    assert!(!denied.status.success(), "bftuser2 held bftuser's job");
    l.c.run(
        "sacctmgr",
        &[
            "-i",
            "modify",
            "user",
            "where",
            &format!("name={other}"),
            "set",
            "adminlevel=Operator",
        ],
    )
    .unwrap();
    l.wait(
        60,
        &format!("slurmctld to know {other} as an operator"),
        || {
            l.c.run(
                "scontrol",
                &[
                    "show",
                    "assoc_mgr",
                    &format!("users={other}"),
                    "flags=users",
                ],
            )
            .ok()
            .filter(|o| o.contains("AdminLevel=Operator"))
            .map(|_| ())
        },
    );
    let held = scontrol_as(&l, other, &["hold", &by_operator.to_string()]);
    assert!(
        held.status.success(),
        "the operator's hold: {}",
        String::from_utf8_lossy(&held.stderr)
    );
    assert!(
        show_job(&l, by_operator).contains("AdminComment=bftrainer:v1 1:1,role=core,hold=admin"),
        "{}",
        show_job(&l, by_operator)
    );
    assert!(
        show_job(&l, by_admin).contains("AdminComment=bftrainer:v1 1:1,role=core,hold=admin"),
        "{}",
        show_job(&l, by_admin)
    );
    assert!(
        show_job(&l, by_owner).contains("Comment=bftrainer: held by its owner"),
        "{}",
        show_job(&l, by_owner)
    );
    l.spawn();
    let held_jobs = [
        (by_admin, "an administrator"),
        (by_owner, "its owner"),
        (by_operator, "an administrator"),
    ];
    for (id, who) in held_jobs {
        let why = format!("elastic job {id} is not admitted: held by {who}");
        l.wait(30, &format!("job {id} reported held by {who}"), || {
            l.log_text().contains(&why).then_some(())
        });
    }
    // Several cycles with every node idle: neither is admitted.
    l.cycles_later(5);
    for id in [by_admin, by_owner, by_operator] {
        assert!(
            admitted_on(&l, id).is_none(),
            "held job {id} admitted:\n{}",
            l.log_text()
        );
        assert_eq!(l.state_of(id), "PENDING");
    }
    let text = jobs_text(&l);
    for (id, who) in held_jobs {
        assert!(
            text.contains(&format!("Job {id}: not admitted: held by {who}")),
            "{text}"
        );
    }

    // Released: admitted where bftrainerd chose, and running there.
    let released = |id: u32| {
        let pinned = l.wait(30, &format!("job {id} admitted"), || admitted_on(&l, id));
        l.wait(30, &format!("job {id} running"), || {
            (l.state_of(id) == "RUNNING").then_some(())
        });
        let core = l
            .squeue()
            .into_iter()
            .find(|r| r.id == id)
            .map(|r| r.nodes)
            .unwrap_or_default();
        assert_eq!(core, pinned, "job {id} runs elsewhere:\n{}", l.log_text());
    };
    l.c.run("scontrol", &["release", &by_admin.to_string()])
        .unwrap();
    let after = show_job(&l, by_admin);
    assert!(
        after.contains("AdminComment=bftrainer:v1 1:1,role=core") && !after.contains("hold=admin"),
        "{after}"
    );
    released(by_admin);
    assert_eq!(l.state_of(by_owner), "PENDING", "{}", l.log_text());
    scontrol_as_user(&l, &["release", &by_owner.to_string()]);
    released(by_owner);
    let lifted = scontrol_as(&l, other, &["release", &by_operator.to_string()]);
    assert!(
        lifted.status.success(),
        "the operator's release: {}",
        String::from_utf8_lossy(&lifted.stderr)
    );
    let after = show_job(&l, by_operator);
    assert!(
        after.contains("AdminComment=bftrainer:v1 1:1,role=core") && !after.contains("hold=admin"),
        "{after}"
    );
    released(by_operator);
    for id in [by_admin, by_owner, by_operator] {
        assert!(
            l.log_text()
                .contains(&format!("elastic job {id}: its hold was lifted")),
            "{}",
            l.log_text()
        );
    }
}

/// `scontrol requeuehold` of a running elastic job (root's here; Slurm records it as
/// the owner's hold whoever gives it): bftrainerd did not ask for that requeue, so it
/// does not admit the job again, writes the hold into its Comment and says why in
/// `bftrainer jobs`; the owner's `scontrol release` hands it back and it runs again.
#[test]
fn cluster_daemon_honours_a_requeuehold_of_a_running_elastic_job() {
    let l = Live::start("", "", "");
    let job = l.submit_elastic("1:2");
    l.wait(60, "the elastic job running", || {
        (l.state_of(job) == "RUNNING").then_some(())
    });
    let admissions = || {
        l.log_text()
            .matches(&format!("admit job {job} (user"))
            .count()
    };
    assert_eq!(admissions(), 1, "{}", l.log_text());
    l.c.run("scontrol", &["requeuehold", &job.to_string()])
        .unwrap();
    l.wait(60, "the requeue hold seen", || {
        l.log_text()
            .contains(&format!("elastic job {job} came back held"))
            .then_some(())
    });
    l.wait(30, "the hold written into the Comment", || {
        show_job(&l, job)
            .contains("Comment=bftrainer: held by scontrol requeuehold")
            .then_some(())
    });
    // Several cycles with idle nodes: not admitted again.
    l.cycles_later(5);
    assert_eq!(l.state_of(job), "PENDING", "{}", l.log_text());
    assert_eq!(
        admissions(),
        1,
        "admitted again while held:\n{}",
        l.log_text()
    );
    let text = jobs_text(&l);
    assert!(
        text.contains(&format!(
            "Job {job}: not admitted: held by a requeue with hold (scontrol requeuehold)"
        )),
        "{text}"
    );
    // The owner's release: admitted again by bftrainerd, once Slurm's requeue delay
    // (its BeginTime) has passed and not before (an admission then would hold idle
    // nodes and time out), and running.
    scontrol_as_user(&l, &["release", &job.to_string()]);
    l.wait(300, "the job running again", || {
        (l.state_of(job) == "RUNNING").then_some(())
    });
    let log = l.log_text();
    assert_eq!(admissions(), 2, "{log}");
    assert!(!log.contains("did not start within"), "{log}");
}

/// A regular job takes n1 and n2; then an elastic job `spec` with sbatch option `arg`,
/// which only n1 and n2 can serve, waits: the log and `bftrainer jobs` say that it asks
/// `asks`, and it is not admitted for three cycles. The regular job's and the elastic
/// job's ids.
fn unservable_while_n1_n2_are_taken(l: &Live, spec: &str, arg: &str, asks: &str) -> (u32, u32) {
    let blocker =
        l.c.sbatch(&[
            "-p",
            "batch",
            "-w",
            "n1,n2",
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ])
        .unwrap();
    l.wait(30, "the regular job on n1,n2", || {
        (l.state_of(blocker) == "RUNNING").then_some(())
    });
    let job = l.submit_elastic_with(spec, &[arg]);
    let why = format!("elastic job {job} is not admitted: it asks {asks} and 0 of the idle nodes");
    l.wait(30, "the job reported unservable", || {
        l.log_text().contains(&why).then_some(())
    });
    l.cycles_later(3);
    assert_eq!(l.state_of(job), "PENDING", "{}", l.log_text());
    assert!(
        !l.log_text().contains(&format!("admit job {job} ")),
        "admitted onto a node that cannot serve it:\n{}",
        l.log_text()
    );
    let text = jobs_text(l);
    assert!(
        text.contains(&format!("Job {job}: not admitted: it asks {asks}")),
        "{text}"
    );
    (blocker, job)
}

/// A core job whose batch script is not bft-run (a plain shell script), requeued by
/// Slurm while bftrainerd is down (root's `scontrol requeue`, as after a node failure)
/// and started again by Slurm itself once its BeginTime passes: spank/bftrainer, in
/// the batch step before the script runs, finds no admission for this run in the
/// Comment, writes its note and requeues the job held, and the script does not run;
/// no node is drained. bftrainerd, back, admits the job (not taking it for a site's
/// requeue with hold) and the script runs. The script appends Slurm's restart count of
/// each start it runs in to a file: 0 (admitted), none for 1 (Slurm's own start), 2.
#[test]
fn cluster_daemon_plain_core_requeued_while_the_daemon_is_down_waits_for_its_admission() {
    let mut l = Live::start("", "", "");
    let work = l.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    assert!(Command::new("chown")
        .arg(bftrainer_testcluster::TEST_USER)
        .arg(&work)
        .status()
        .unwrap()
        .success());
    let starts = work.join("starts");
    let script = work.join("plain.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH -J plain\n#SBATCH -o {out}\n\
             echo \"${{SLURM_RESTART_COUNT:-0}}\" >> {starts}\n\
             exec sleep 600\n",
            out = work.join("job.out").display(),
            starts = starts.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = l.sbatch_as_user(&["--elastic=1:1", script.to_str().unwrap()], Some(&work));
    let runs = || -> Vec<String> {
        std::fs::read_to_string(&starts)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let admissions = |l: &Live| {
        l.log_text()
            .matches(&format!("admit job {job} (user"))
            .count()
    };
    l.wait(120, "the admitted start's script running", || {
        (runs() == ["0"] && l.state_of(job) == "RUNNING").then_some(())
    });
    assert_eq!(admissions(&l), 1, "{}", l.log_text());

    l.kill9();
    l.c.run("scontrol", &["requeue", &job.to_string()]).unwrap();
    l.wait(
        300,
        "Slurm's own start requeued held by spank/bftrainer",
        || {
            let f = show_job(&l, job);
            (f.contains("JobState=PENDING")
                && f.contains("Priority=0 ")
                && f.contains("Comment=bftrainer: started without bftrainerd's admission (run 1:"))
            .then_some(())
        },
    );
    // The script did not run for run 1; the start ended without draining its node.
    assert_eq!(runs(), ["0"], "{}", show_job(&l, job));
    // The job's owner reads why in the job's output (written just after the requeue:
    // waited for, not read once).
    let said = format!(
        "spank/bftrainer: job {job} was started by Slurm without bftrainerd's admission (run 1)"
    );
    l.wait(60, "the gate's line in the job's output", || {
        std::fs::read_to_string(work.join("job.out"))
            .ok()
            .filter(|out| out.contains(&said))
            .map(|_| ())
    });
    let nodes = l.c.run("sinfo", &["-h", "-N", "-o", "%N %T"]).unwrap();
    assert!(!nodes.to_lowercase().contains("drain"), "{nodes}");

    l.spawn();
    l.wait(
        300,
        "the script running in the start bftrainerd admitted",
        || (runs() == ["0", "2"] && l.state_of(job) == "RUNNING").then_some(()),
    );
    let log = l.log_text();
    assert_eq!(admissions(&l), 2, "{log}");
    assert!(
        !log.contains(&format!("elastic job {job} came back held")),
        "{log}"
    );
    let f = show_job(&l, job);
    assert!(f.contains("Restarts=2"), "{f}");
}

#[test]
fn cluster_daemon_gives_satellites_back_to_a_regular_job_waiting_on_the_owners_limit() {
    // Satellites run as their owner and count against the owner's association limits,
    // and Slurm never preempts a job for a limit. bftuser may run 3 jobs (MaxJobs=3,
    // enforced); bftuser's elastic job holds a core and two satellites, then bftuser
    // submits a regular job, which waits on AssocMaxJobsLimit. bftrainerd pauses the
    // elastic job and gives its satellites back; the regular job runs, the core stays.
    let mut l = Live::start_without_daemon("", "", "");
    let slurm_conf = l.c.slurm_conf().to_path_buf();
    let text = std::fs::read_to_string(&slurm_conf).unwrap();
    std::fs::write(
        &slurm_conf,
        text.replace(
            "AccountingStorageType=accounting_storage/slurmdbd\n",
            "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageEnforce=associations,limits\n",
        ),
    )
    .unwrap();
    l.c.stop_daemon("slurmctld", false).unwrap();
    l.c.start_daemon("slurmctld").unwrap();
    let user = bftrainer_testcluster::TEST_USER;
    l.c.run(
        "sacctmgr",
        &[
            "-i",
            "modify",
            "user",
            "where",
            &format!("name={user}"),
            "set",
            "MaxJobs=3",
        ],
    )
    .unwrap();
    l.wait(60, "slurmctld to know bftuser's MaxJobs", || {
        l.c.run(
            "scontrol",
            &["show", "assoc_mgr", &format!("users={user}"), "flags=assoc"],
        )
        .ok()
        .filter(|o| o.contains("MaxJobs=3("))
    });
    l.spawn();
    let job = l.submit_elastic("1:4");
    l.wait(90, "the elastic job on its core and two satellites", || {
        (l.state_of(job) == "RUNNING" && l.satellites(job).len() == 2).then_some(())
    });
    let regular = l.sbatch_as_user(
        &[
            "-p",
            "batch",
            "-N1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 600",
        ],
        Some(std::path::Path::new("/tmp")),
    );
    l.wait(90, "bftuser's regular job running", || {
        (l.state_of(regular) == "RUNNING").then_some(())
    });
    let log = l.log_text();
    assert!(
        log.contains(&format!("regular job {regular} waits on AssocMaxJobsLimit")),
        "{log}"
    );
    assert_eq!(l.state_of(job), "RUNNING", "the core stays");
    let restarts =
        l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
            .unwrap();
    assert!(restarts.contains("Restarts=0"), "{restarts}");
    // While the regular job runs the limit still binds: no regrowth past it.
    l.cycles_later(3);
    assert!(l.satellites(job).len() <= 1, "{:?}", l.satellites(job));
}
