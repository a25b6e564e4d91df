//! Integration tests of the test cluster itself: each brings up a real Slurm cluster
//! and checks it through Slurm's own commands (sbatch, squeue, sinfo, sacct).

use std::path::Path;
use std::time::Duration;

use bftrainer_testcluster::{Cluster, Error, Options, TEST_USER};

fn script(args: &[&str]) -> std::process::Output {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/cluster");
    std::process::Command::new(path)
        .args(args)
        .output()
        .unwrap()
}

fn start(nodes: usize) -> Cluster {
    Cluster::start(Options {
        nodes,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("cluster did not start: {e}"))
}

/// sacct rows (JobID, User, Partition, State, NodeList) of every run of `job`, once
/// accounting has them complete: slurmctld sends the partition and node list a few
/// seconds after the job itself, so early rows have them empty.
fn sacct(c: &Cluster, job: u32) -> Vec<Vec<String>> {
    let query = || -> Vec<Vec<String>> {
        // -D: every run of a requeued job, not just the last.
        let id = job.to_string();
        let args = [
            "-n",
            "-P",
            "-X",
            "-D",
            "-j",
            &id,
            "-o",
            "JobID,User,Partition,State,NodeList",
        ];
        c.run("sacct", &args)
            .unwrap()
            .lines()
            .map(|l| l.split('|').map(str::to_string).collect())
            .collect()
    };
    bftrainer_testcluster::wait_until(
        &format!("accounting of job {job}"),
        Duration::from_secs(30),
        || {
            let rows = query();
            Ok((!rows.is_empty() && rows.iter().all(|r| !r[2].is_empty())).then_some(rows))
        },
    )
    .unwrap_or_else(|e| panic!("{e}; last rows: {:?}", query()))
}

#[test]
fn cluster_runs_a_job_through_sbatch_squeue_sacct() {
    let c = start(2);
    assert_eq!(c.nodes(), ["n1", "n2"]);
    let sinfo = c.run("sinfo", &["-h", "-o", "%P %a %D %T"]).unwrap();
    assert_eq!(
        sinfo.lines().collect::<Vec<_>>(),
        [
            "batch* up 2 idle",
            "elastic up 2 idle",
            "elastic-sat up 2 idle"
        ]
    );

    // The job holds its nodes until it sees its own file, so squeue must show it running.
    let gate = c.work_dir().join("gate");
    let script = format!(
        "srun -l hostname; while [ ! -e {} ]; do sleep 0.1; done; echo done",
        gate.display()
    );
    let job = c
        .sbatch(&["-N2", "-J", "probe", "--wrap", &script])
        .unwrap();
    c.wait_for_state(job, &["RUNNING"], Duration::from_secs(30))
        .unwrap();
    let sq = c.run("squeue", &["-h", "-o", "%i %j %P %T %D %N"]).unwrap();
    assert_eq!(sq.trim(), format!("{job} probe batch RUNNING 2 n[1-2]"));
    std::fs::write(&gate, "").unwrap();
    c.wait_for_state(job, &["COMPLETED"], Duration::from_secs(30))
        .unwrap();

    // Both nodes ran a task (their hostname is the host's, so count the labelled lines).
    let out = std::fs::read_to_string(c.work_dir().join(format!("slurm-{job}.out"))).unwrap();
    let labels: Vec<&str> = out.lines().filter_map(|l| l.split(':').next()).collect();
    assert!(labels.contains(&"0") && labels.contains(&"1"), "{out}");
    assert!(out.ends_with("done\n"), "{out}");

    // Accounting recorded it, attributed to root, on both nodes.
    let rows = sacct(&c, job);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][1..], ["root", "batch", "COMPLETED", "n[1-2]"]);
}

#[test]
fn cluster_elastic_job_is_preempted_and_requeued_by_a_batch_job() {
    let c = start(2);
    // `exec` so the grace-time SIGTERM reaches sleep itself, not a shell waiting on it.
    let elastic = c
        .sbatch(&[
            "-p",
            "elastic",
            "-N2",
            "--exclusive",
            "--wrap",
            "exec sleep 600",
        ])
        .unwrap();
    c.wait_for_state(elastic, &["RUNNING"], Duration::from_secs(30))
        .unwrap();
    let batch = c
        .sbatch(&["-p", "batch", "-N1", "--exclusive", "--wrap", "true"])
        .unwrap();
    // Slurm acts on expired grace times from a 30 s periodic pass: allow for it.
    c.wait_for_state(batch, &["COMPLETED"], Duration::from_secs(90))
        .unwrap();
    let state = c.job_state(elastic).unwrap();
    assert!(
        ["PENDING", "REQUEUED", "RUNNING"].contains(&state.as_str()),
        "elastic job after preemption: {state}"
    );
    let rows = sacct(&c, elastic);
    assert!(
        rows.iter()
            .any(|r| r[3] == "PREEMPTED" || r[3] == "REQUEUED"),
        "sacct of the preempted job: {rows:?}"
    );
    let log = std::fs::read_to_string(c.log_dir().join("slurmctld.log")).unwrap();
    assert!(
        log.contains(&format!("preempted JobId={elastic} has been requeued")),
        "slurmctld.log does not mention the preemption"
    );
}

#[test]
fn cluster_runs_jobs_of_the_test_user() {
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(conf.path(), "# bftrainer.toml of this test\n").unwrap();
    let c = Cluster::start(Options {
        nodes: 1,
        bftrainer_conf: Some(conf.path().to_path_buf()),
        ..Default::default()
    })
    .unwrap();
    // --bftrainer-conf lands beside slurm.conf, where the job_submit plugin looks.
    let copied = c.slurm_conf().with_file_name("bftrainer.toml");
    assert_eq!(
        std::fs::read_to_string(copied).unwrap(),
        "# bftrainer.toml of this test\n"
    );
    let out = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args(["--parsable", "-p", "elastic", "--wrap", "id -un"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    c.wait_for_state(job, &["COMPLETED"], Duration::from_secs(30))
        .unwrap();
    let text = std::fs::read_to_string(c.work_dir().join(format!("slurm-{job}.out"))).unwrap();
    assert_eq!(text.trim(), TEST_USER);
    let rows = sacct(&c, job);
    assert_eq!(rows[0][1..4], [TEST_USER, "elastic", "COMPLETED"]);
}

/// The release a cluster started with default options runs: inside a Debian root (as
/// `make test` runs the integration tests for 24.11 and 26.05) the root's, else the
/// host's. `BFT_SLURM_ROOT_VERSION` is set by scripts/slurm-root.
fn expected_release() -> String {
    if let Ok(v) = std::env::var("BFT_SLURM_ROOT_VERSION") {
        return v;
    }
    let out = std::process::Command::new("slurmctld")
        .arg("-V")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().nth(1).unwrap_or_default();
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// Every cluster runs the release its test was built for: a test built in the 26.05
/// root must not meet a 22.05 slurmctld, or "passed on 26.05" would mean nothing.
#[test]
fn cluster_runs_the_release_of_its_tests() {
    let c = start(1);
    let v = c.slurm_version().unwrap();
    assert!(
        v.starts_with(&format!("{}.", expected_release())),
        "cluster runs Slurm {v}, the tests run with {}",
        expected_release()
    );
    let out = c.run("scontrol", &["-V"]).unwrap();
    assert!(
        out.contains(&v),
        "scontrol -V says {out:?}, cluster.json {v}"
    );
}

/// A cluster of another release started from the host (`cluster up --slurm`): its
/// daemons run inside that release's Debian root, and the host's shell reaches it through
/// DIR/bin, that release's client commands run by its own loader, as any user. Only on
/// the host: a root reaches no other root. The release is the last of
/// `BFT_TEST_RELEASES` (`make test`), 26.05 if unset; with it set but empty (host only),
/// no root is wanted and this test checks nothing more than the one above.
#[test]
fn cluster_of_another_release_from_the_host() {
    if std::env::var_os("BFT_SLURM_ROOT_VERSION").is_some() {
        return;
    }
    let release = match std::env::var("BFT_TEST_RELEASES") {
        Ok(list) => match list.split_whitespace().last() {
            Some(r) => r.to_string(),
            None => return,
        },
        Err(_) => "26.05".to_string(),
    };
    let c = Cluster::start(Options {
        nodes: 2,
        slurm: Some(release.clone()),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("a Slurm {release} cluster did not start: {e}"));
    let v = c.slurm_version().unwrap();
    assert!(
        v.starts_with(&format!("{release}.")),
        "asked for {release}, runs {v}"
    );
    // The wrappers, not the host's 22.05 commands, answer.
    let out = c.run("sbatch", &["--version"]).unwrap();
    assert!(out.contains(&v), "sbatch --version: {out:?}");
    let out = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args(["--parsable", "-N2", "--wrap", "srun -l id -un"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    c.wait_for_state(job, &["COMPLETED"], Duration::from_secs(60))
        .unwrap();
    let text = std::fs::read_to_string(c.work_dir().join(format!("slurm-{job}.out"))).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [format!("0: {TEST_USER}"), format!("1: {TEST_USER}")]
    );
    let rows = sacct(&c, job);
    assert_eq!(rows[0][1..], [TEST_USER, "batch", "COMPLETED", "n[1-2]"]);
}

#[test]
fn cluster_two_at_once_are_independent() {
    let a = start(1);
    let b = start(2);
    assert_ne!(a.slurm_conf(), b.slurm_conf());
    let job = a.sbatch(&["--hold", "--wrap", "true"]).unwrap();
    assert_eq!(a.job_state(job).unwrap(), "PENDING");
    assert_eq!(b.run("squeue", &["-h"]).unwrap().trim(), "");
    assert_eq!(
        b.run("sinfo", &["-h", "-p", "batch", "-o", "%D"])
            .unwrap()
            .trim(),
        "2"
    );
    assert_eq!(
        a.run("sinfo", &["-h", "-p", "batch", "-o", "%D"])
            .unwrap()
            .trim(),
        "1"
    );
    // Their slurmctld listen on different ports.
    let port = |c: &Cluster| {
        std::fs::read_to_string(c.slurm_conf())
            .unwrap()
            .lines()
            .find(|l| l.starts_with("SlurmctldPort="))
            .unwrap()
            .to_string()
    };
    assert_ne!(port(&a), port(&b));
    let status = script(&["status", "--dir", a.dir().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    assert!(
        text.contains("slurmctld") && text.contains("running"),
        "{text}"
    );
    assert!(text.contains("batch*") && text.contains("idle"), "{text}");
}

/// Pids (and their start times) of the daemons cluster.json records.
fn recorded_daemons(dir: &Path) -> Vec<(u32, String)> {
    let text = std::fs::read_to_string(dir.join("cluster.json")).unwrap();
    // Each daemon record holds `"pid": N`; no JSON crate needed for that.
    text.split("\"pid\": ")
        .skip(1)
        .map(|s| {
            let pid: u32 = s[..s.find(',').unwrap()].trim().parse().unwrap();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

/// No pid of `daemons` runs its recorded command any more (a reused pid runs another).
fn assert_all_gone(daemons: &[(u32, String)]) {
    for (pid, cmd) in daemons {
        assert!(!cmd.is_empty(), "pid {pid}: no command was recorded");
        let now = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&now).replace('\0', " ") != *cmd,
            "pid {pid} ({cmd}) still running"
        );
    }
}

fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&env).contains(needle) && !cmd.is_empty() {
            found.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
        }
    }
    found
}

#[test]
fn cluster_stop_leaves_no_process_behind() {
    let c = start(2);
    let dir = c.dir().to_path_buf();
    let daemons = recorded_daemons(&dir);
    assert_eq!(
        daemons.len(),
        6,
        "munged, mariadbd, slurmdbd, slurmctld, 2 slurmd: {daemons:?}"
    );
    assert!(
        daemons.iter().all(|(_, cmd)| !cmd.is_empty()),
        "{daemons:?}"
    );
    // A running job leaves slurmstepd and the job's processes: down must end them too.
    let job = c.sbatch(&["-N2", "--wrap", "srun sleep 600"]).unwrap();
    c.wait_for_state(job, &["RUNNING"], Duration::from_secs(30))
        .unwrap();
    let conf = format!("SLURM_CONF={}", c.slurm_conf().display());
    bftrainer_testcluster::wait_until("the job's steps to start", Duration::from_secs(30), || {
        Ok((processes_mentioning(&conf)
            .iter()
            .filter(|c| c.contains("sleep 600"))
            .count()
            >= 2)
            .then_some(()))
    })
    .unwrap();
    // A second `up` on a running cluster's directory must refuse, naming the daemons.
    let again = script(&["up", "--dir", dir.to_str().unwrap()]);
    assert!(!again.status.success());
    let msg = String::from_utf8_lossy(&again.stderr);
    assert!(
        msg.contains("already up") && msg.contains("slurmctld (pid"),
        "{msg}"
    );
    c.stop().unwrap();
    assert_all_gone(&daemons);
    let left = processes_mentioning(&conf);
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(!dir.exists(), "{} not removed", dir.display());
}

#[test]
fn cluster_start_failure_names_the_daemon_and_keeps_its_log() {
    // Files with the plugins' names that are no plugins: slurmctld must refuse to start.
    let fake = tempfile::tempdir().unwrap();
    for so in ["job_submit_bftrainer.so", "spank_bftrainer.so"] {
        std::fs::write(fake.path().join(so), "not an ELF file").unwrap();
    }
    let err = Cluster::start(Options {
        nodes: 1,
        plugins: Some(fake.path().to_path_buf()),
        name: Some("cluster_expected_start_failure".into()),
        ..Default::default()
    })
    .unwrap_err();
    let Error::Up { stderr, logs, .. } = &err else {
        panic!("expected Error::Up, got {err}");
    };
    assert!(stderr.contains("slurmctld"), "{stderr}");
    assert!(stderr.contains("end of"), "no log tail in: {stderr}");
    let kept = Path::new(logs);
    assert!(kept.join("log/slurmctld.log").is_file(), "{err}");
    std::fs::remove_dir_all(kept).unwrap();
}

#[test]
fn cluster_rejects_a_plugins_dir_without_the_plugins() {
    let empty = tempfile::tempdir().unwrap();
    let err = Cluster::start(Options {
        nodes: 1,
        plugins: Some(empty.path().to_path_buf()),
        name: Some("cluster_expected_bad_plugins".into()),
        ..Default::default()
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("job_submit_bftrainer.so is missing"), "{msg}");
    // Nothing was started, so there are no logs to keep.
    assert!(msg.contains("(none: no daemon was started)"), "{msg}");
}

#[test]
fn cluster_logs_of_a_failed_test_are_kept() {
    let name = "cluster_kept_logs_probe";
    let result = std::panic::catch_unwind(|| {
        let _c = Cluster::start(Options {
            nodes: 1,
            name: Some(name.into()),
            ..Default::default()
        })
        .unwrap();
        panic!("deliberate failure to exercise log keeping");
    });
    assert!(result.is_err());
    let kept =
        bftrainer_testcluster::kept_logs_root().join(format!("{name}-{}", std::process::id()));
    let ctld = std::fs::read_to_string(kept.join("log/slurmctld.log")).unwrap();
    assert!(
        ctld.contains(&format!("slurmctld version {}", expected_release())),
        "{}",
        kept.display()
    );
    assert!(kept.join("etc/slurm.conf").is_file());
    assert!(kept.join("log/slurmd-n1.log").is_file());
    std::fs::remove_dir_all(&kept).unwrap();
}

/// Set by `cluster_watchdog_stops_the_cluster_of_a_killed_test` for its child process.
const CHILD_ENV: &str = "BFTC_TEST_WATCHDOG_CHILD";

#[test]
#[ignore = "child process of cluster_watchdog_stops_the_cluster_of_a_killed_test"]
fn cluster_watchdog_child() {
    let Some(report) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let c = start(1);
    std::fs::write(&report, c.dir().as_os_str().as_encoded_bytes()).unwrap();
    // Wait to be killed: Drop never runs.
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn cluster_watchdog_stops_the_cluster_of_a_killed_test() {
    let report = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(report.path(), "").unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cluster_watchdog_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, report.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dir =
        bftrainer_testcluster::wait_until("the child's cluster", Duration::from_secs(60), || {
            let text = std::fs::read_to_string(report.path()).unwrap();
            Ok((!text.is_empty()).then(|| std::path::PathBuf::from(text)))
        })
        .unwrap();
    let daemons = recorded_daemons(&dir);
    assert_eq!(daemons.len(), 5, "{daemons:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    bftrainer_testcluster::wait_until(
        "the watchdog to remove the cluster",
        Duration::from_secs(30),
        || Ok((!dir.exists()).then_some(())),
    )
    .unwrap();
    assert_all_gone(&daemons);
}

#[test]
fn cluster_script_rejects_bad_input_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let d = dir.to_str().unwrap();
    let fails = |args: &[&str], want: &str| {
        let out = script(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("Traceback"), "{args:?}: {err}");
    };
    fails(
        &["up", "--dir", d, "--nodes", "0"],
        "--nodes 0: allowed are 1 to 64",
    );
    fails(
        &["up", "--dir", d, "--bftrainer-conf", "/no/such.toml"],
        "no such file",
    );
    fails(&["sideways"], "invalid choice");
    let long = tmp.path().join("x".repeat(100));
    fails(&["up", "--dir", long.to_str().unwrap()], "is too long");
    assert!(!long.exists());
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("precious"), "").unwrap();
    fails(&["up", "--dir", d], "is not empty and holds no cluster");
    assert!(dir.join("precious").exists());
    std::fs::remove_file(dir.join("precious")).unwrap();
    // A taken port with --port-base: named, no retry elsewhere. The test holds
    // slurmctld's port; other tests' clusters may hold a neighbour of it by chance, so
    // the message may name that one instead (seen once in make test: slurmdbd's).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = listener.local_addr().unwrap().port();
    let base = taken - 2;
    let out = script(&[
        "up",
        "--dir",
        d,
        "--nodes",
        "1",
        "--port-base",
        &base.to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "up with a taken port succeeded");
    let named = (base..base + 8).any(|p| err.contains(&format!("port {p} (for ")));
    assert!(
        named && err.contains("is taken by another process; choose another --port-base"),
        "{err}"
    );
    assert!(!err.contains("Traceback"), "{err}");
    // `down` of a directory without a cluster is a no-op, not an error.
    assert!(script(&["down", "--dir", d]).status.success());
}

#[test]
fn cluster_interrupted_up_leaves_nothing_running() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let conf = format!("SLURM_CONF={}", dir.join("etc/slurm.conf").display());
    let state = dir.join("cluster.json");
    // SIGTERM once right after munged is started, once right after slurmctld is (the
    // 4th daemon): `up` still has daemons to start or wait for, so it is interrupted
    // with some of its daemons running, and must stop them.
    for started in [1, 4] {
        let mut up = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/cluster"),
        )
        .args(["up", "--nodes", "2", "--dir", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        // A safety net only, longer than `up`'s own waits (MariaDB 60 s, slurmdbd 120 s):
        // an `up` that fails ends first, and says why.
        let deadline = std::time::Instant::now() + Duration::from_secs(400);
        loop {
            let text = std::fs::read_to_string(&state).unwrap_or_default();
            if text.matches("\"pid\": ").count() >= started {
                break;
            }
            if up.try_wait().unwrap().is_some() {
                let out = up.wait_with_output().unwrap();
                panic!(
                    "`up` ended ({}) before it had started {started} daemons:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { kill(up.id() as i32, 15) };
                let out = up.wait_with_output().unwrap();
                panic!(
                    "`up` did not start {started} daemons in 400 s ({text}):\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            // Finer than the fixture's 100 ms polls: the interrupt must land mid-`up`.
            std::thread::sleep(Duration::from_millis(5));
        }
        let running = processes_mentioning(&conf);
        assert!(
            running.len() >= started,
            "{started} daemons recorded, running: {running:?}"
        );
        // SAFETY: kill(2) on our own child's pid.
        unsafe { kill(up.id() as i32, 15) };
        let out = up.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "`up` finished before the interrupt at {started} daemons"
        );
        assert!(err.contains("interrupted (SIGTERM)"), "{err}");
        let left = processes_mentioning(&conf);
        assert!(
            left.is_empty(),
            "after SIGTERM at {started} daemons: {left:?}"
        );
    }
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn cluster_with_stand_in_gpus_allocates_them_by_type_and_node() {
    // Two typed classes and a node without GPUs, in the same partitions.
    let c = Cluster::start(Options {
        nodes: 3,
        gpus: Some("1=a100:2,2=v100:1".into()),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("cluster did not start: {e}"));
    let gres = c
        .run("sinfo", &["-h", "-N", "-p", "batch", "-o", "%N %G"])
        .unwrap();
    let gres: Vec<&str> = gres.lines().map(str::trim).collect();
    assert!(
        gres.iter().any(|l| l.starts_with("n1 gpu:a100:2")),
        "{gres:?}"
    );
    assert!(
        gres.iter().any(|l| l.starts_with("n2 gpu:v100:1")),
        "{gres:?}"
    );
    assert!(gres.contains(&"n3 (null)"), "{gres:?}");
    let dir = tempfile::Builder::new()
        .prefix("bftc-gpu")
        .tempdir_in("/tmp")
        .unwrap();
    let out = |name: &str| dir.path().join(name).display().to_string();
    let run = |gres: &str, name: &str| {
        let o = out(name);
        let id = c
            .sbatch(&[
                &format!("--gres={gres}"),
                "-o",
                o.as_str(),
                "--wrap",
                "echo $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}",
            ])
            .unwrap();
        c.wait_for_state(id, &["COMPLETED"], Duration::from_secs(60))
            .unwrap();
        std::fs::read_to_string(o).unwrap().trim().to_string()
    };
    assert_eq!(run("gpu:a100:2", "a"), "n1 0,1");
    assert_eq!(run("gpu:v100:1", "v"), "n2 0");
    // The partitions are OverSubscribe=EXCLUSIVE: a job holds every GPU of its node
    // whatever it asked (measured on 22.05), as a whole-node allocation does.
    let any = run("gpu:1", "any");
    assert!(any == "n1 0,1" || any == "n2 0", "{any}");
    // More than any node has: Slurm refuses it at submission.
    let refused = c.sbatch(&["--gres=gpu:a100:3", "--wrap", "true"]);
    assert!(refused.is_err(), "{refused:?}");
}

#[test]
fn cluster_refuses_a_bad_gpu_spec_and_says_what_is_allowed() {
    for bad in ["0", "a100:x", "5=2", "2-1=2", "a-1:2", "17"] {
        let err = Cluster::start(Options {
            nodes: 2,
            gpus: Some(bad.into()),
            name: Some("cluster_expected_bad_gpus".into()),
            ..Default::default()
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&format!("--gpus {bad}")), "{bad}: {msg}");
        assert!(msg.contains("allowed:"), "{bad}: {msg}");
    }
    // Shared GPU nodes: indices of nodes with GPUs, not every node.
    for (gpus, bad, says) in [
        ("a100:4", "3", "not within 1..2"),
        ("a100:4", "x", "bad node range"),
        ("1=a100:4", "2", "node n2 has no GPUs"),
        ("a100:4", "1-2", "every node would be shared"),
    ] {
        let err = Cluster::start(Options {
            nodes: 2,
            gpus: Some(gpus.into()),
            shared_gpus: Some(bad.into()),
            name: Some("cluster_expected_bad_shared_gpus".into()),
            ..Default::default()
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("--shared-gpus {bad}")) && msg.contains(says),
            "{bad}: {msg}"
        );
    }
}

#[test]
fn cluster_with_shared_gpu_nodes_lets_jobs_share_them_and_preempts_gpu_satellites() {
    // n2's 4 GPUs are shared (`--shared-gpus 2`): partitions shared and shared-sat over
    // n2 only, not batch; 4 CPUs there. Two jobs share it, each with its own GPUs; a
    // job of shared asking the GPUs a shared-sat job holds preempts it.
    let c = Cluster::start(Options {
        nodes: 2,
        gpus: Some("a100:4".into()),
        shared_gpus: Some("2".into()),
        ..Default::default()
    })
    .unwrap();
    let parts = c.run("sinfo", &["-h", "-o", "%P %N"]).unwrap();
    for want in ["batch* n1", "shared n2", "shared-sat n2"] {
        assert!(parts.lines().any(|l| l.trim() == want), "{want}: {parts}");
    }
    let out = |name: &str| c.work_dir().join(name);
    let job = |part: &str, name: &str| {
        let o = out(name);
        // The work in a step: a preemption's SIGTERM reaches it, and the job ends.
        let cmd = format!(
            "echo $CUDA_VISIBLE_DEVICES > {}; srun sleep 300",
            o.display()
        );
        c.sbatch(&[
            "-p",
            part,
            "-w",
            "n2",
            "-n1",
            "--gres=gpu:a100:2",
            "-o",
            "/dev/null",
            "--wrap",
            &cmd,
        ])
        .unwrap()
    };
    let read = |name: &str| {
        bftrainer_testcluster::wait_until(
            &format!("{name} to write its GPUs"),
            Duration::from_secs(60),
            || {
                Ok(std::fs::read_to_string(out(name))
                    .ok()
                    .filter(|t| t.ends_with('\n')))
            },
        )
        .unwrap()
        .trim()
        .to_string()
    };
    let regular = job("shared", "regular");
    let sat = job("shared-sat", "sat");
    let (a, b) = (read("regular"), read("sat"));
    let mut both = [a.as_str(), b.as_str()];
    both.sort_unstable();
    assert_eq!(both, ["0,1", "2,3"], "each job its own GPUs of n2");
    let claim = job("shared", "claim");
    c.wait_for_state(claim, &["RUNNING"], Duration::from_secs(60))
        .unwrap();
    assert_eq!(read("claim"), b, "the preempted job's GPUs");
    c.wait_for_state(
        sat,
        &["FAILED", "CANCELLED", "PREEMPTED", "COMPLETED"],
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(c.job_state(regular).unwrap(), "RUNNING");
}
