//! `bft-run --mode mpi` without Slurm (`--local`), against a private munged, with an
//! mpi4py program (tests/mpi_sum.py: an allreduced sum over a step budget,
//! checkpointed when stopped: SIGUSR1, which mpirun forwards) under Debian's Open MPI: every generation is one mpirun
//! whose daemons start through `bft-run rsh` under each node's agent. The job grows
//! 2 -> 3 nodes (an agent started by hand, as a satellite's is), shrinks (that agent
//! gets SIGTERM), loses a node without warning (another agent killed with SIGKILL),
//! and finishes with every step run once and the sum exact. `bft-run rsh` without
//! the world's token is refused.
//!
//! The program steps only up to the number in a file the test raises, so every change
//! lands at a known step whatever the machine's load: the test waits for conditions
//! (the program's log lines), never for a time.
//!
//! It needs mpirun (openmpi-bin) and mpi4py in the virtualenv (`BFT_VENV`, default
//! /opt/bftrainer-venv): scripts/install-deps and scripts/python-env install them
//! (make test runs both); where either is missing the test says so and does nothing.

use serde_json::Value;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{comment_rate, steps_taken, Guard, Munged};

const PROGRAM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mpi_sum.py");

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// BFT_RSH_TOKEN from the environment of the mpirun running the program with its
/// files under `dir`.
fn mpirun_token(dir: &Path) -> Option<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.starts_with("mpirun ") || !cmd.contains(&dir) {
            return None;
        }
        let env = std::fs::read(e.path().join("environ")).ok()?;
        env.split(|b| *b == 0).find_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.strip_prefix("BFT_RSH_TOKEN=").map(str::to_string)
        })
    })
}

/// The venv's python when it and mpirun are there and mpi4py imports; else what
/// is missing.
/// The python to run MPI programs with, or None after saying the test is skipped.
fn mpi_python_or_skip() -> Option<PathBuf> {
    mpi_python()
        .map_err(|missing| eprintln!("SKIPPED: bft-run --mode mpi's test needs {missing}"))
        .ok()
}

fn mpi_python() -> Result<PathBuf, String> {
    let venv =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let python = venv.join("bin/python");
    if Command::new("mpirun")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        return Err("mpirun (Debian's openmpi-bin: scripts/install-deps)".into());
    }
    let ok = Command::new(&python)
        .args(["-c", "import mpi4py"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return Err(format!(
            "mpi4py in {} (scripts/python-env)",
            python.display()
        ));
    }
    Ok(python)
}

/// The program's log lines (rank 0's).
fn lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The last line says: a world of `world` in a generation after `after`, holding
/// at `step`. Returns that generation.
fn holding(log: &Path, world: u64, step: u64, after: u64) -> Option<u64> {
    let l = lines(log);
    let last = l.last()?;
    let g: u64 = last["gen"].as_str()?.parse().ok()?;
    (last["world"] == world && last["step"] == step && last["hold"] == true && g > after)
        .then_some(g)
}

/// Open MPI's settings for the test: as root where the test runs as root, TCP over
/// loopback (the "nodes" share this machine), and idle ranks yield the 2 CPUs.
fn mpi_env(c: &mut Command) -> &mut Command {
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        // Several Open MPI daemons starting at once on one machine (the test's "nodes")
        // were seen to crash in hwloc's shared-memory topology (SIGSEGV in
        // hwloc_shmem_topology_write), costing the world an unplanned restart.
        .env("OMPI_MCA_rtc_hwloc_vmhole", "none")
}

#[test]
fn mpi_program_grows_shrinks_loses_a_node_and_finishes_with_the_exact_sum() {
    let Some(python) = mpi_python_or_skip() else {
        return;
    };
    let m = Munged::start();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let limit = tmp.path().join("limit");
    let set_limit = |n: u64| std::fs::write(&limit, n.to_string()).unwrap();
    set_limit(10);
    let coord_file = tmp.path().join("coord");
    let out_path = tmp.path().join("out");
    let err_path = tmp.path().join("err");
    let budget = 40u64;
    let core = Guard(
        mpi_env(&mut m.bft())
            .args(["--local", "2", "--nproc-per-node", "1", "--mode", "mpi"])
            .args(["--settle", "1", "--leave-timeout", "20", "--coord-file"])
            .arg(&coord_file)
            .arg("--")
            .arg(&python)
            .args([PROGRAM, "--ckpt"])
            .arg(tmp.path().join("ckpt.json"))
            .args(["--steps", &budget.to_string(), "--log"])
            .arg(&log)
            .arg("--limit-file")
            .arg(&limit)
            .stdout(File::create(&out_path).unwrap())
            .stderr(Stdio::from(File::create(&err_path).unwrap()))
            .spawn()
            .unwrap(),
    );
    let out = || {
        std::fs::read_to_string(&err_path).unwrap_or_default()
            + &std::fs::read_to_string(&out_path).unwrap_or_default()
    };
    let minutes = Duration::from_secs(180);
    let wait = |what: &str, world: u64, step: u64, after: u64| -> u64 {
        let t = Instant::now();
        loop {
            if let Some(g) = holding(&log, world, step, after) {
                return g;
            }
            assert!(
                t.elapsed() < minutes,
                "waited {minutes:?} for {what}; the program's log: {:?}\nthe job's output:\n{}",
                lines(&log),
                out()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let g0 = wait("the first world at step 10", 2, 10, 0);
    let (addr, job, run) = {
        let s = std::fs::read_to_string(&coord_file).unwrap();
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        (v[0].clone(), v[1].clone(), v[2].clone())
    };

    // Only the world's mpirun may launch: a party of the same user that knows the
    // coordinator, job and run (they are in the job's Comment) but not the token is
    // refused, and nothing runs.
    let marker = tmp.path().join("rsh-ran");
    let touch = format!("touch {}", marker.display());
    let rsh = |token: Option<&str>, host: &str, cmd: &str| {
        let mut c = m.bft();
        c.args(["rsh", host, cmd])
            .env("BFT_COORD", &addr)
            .env("BFT_JOB", &job)
            .env("BFT_COORD_RUN", &run);
        if let Some(t) = token {
            c.env("BFT_RSH_TOKEN", t);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, _, err) = rsh(Some("0123456789abcdef0123456789abcdef"), "local-1", &touch);
    assert_eq!(code, Some(255), "{err}");
    assert!(
        err.contains("rsh refused: not the running MPI world's launcher"),
        "{err}"
    );
    let (code, _, err) = rsh(None, "local-1", &touch);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("only the mpirun that bft-run --mode mpi starts"),
        "{err}"
    );
    assert!(!marker.exists());
    // The world's own token (read from its mpirun's environment, as only the owner
    // can): a host outside the world is refused; a host of it runs the command, with
    // its output and exit status relayed.
    let token = mpirun_token(tmp.path()).expect("the world's mpirun and its token");
    let (code, _, err) = rsh(Some(&token), "elsewhere", &touch);
    assert_eq!(code, Some(255), "{err}");
    assert!(err.contains("is not a host of generation"), "{err}");
    let (code, said, err) = rsh(
        Some(&token),
        "local-1",
        "echo on $BFT_NODE_NAME; echo to stderr >&2; exit 3",
    );
    assert_eq!((code, said.as_str()), (Some(3), "on local-1\n"), "{err}");
    assert!(err.contains("to stderr"), "{err}");

    // Grow: an agent joins, as a satellite's does.
    let agent = |node: &str| {
        Guard(
            mpi_env(&mut m.bft())
                .args([
                    "--agent",
                    "--coord",
                    &addr,
                    "--coord-job",
                    &job,
                    "--coord-run",
                    &run,
                ])
                .args(["--node-name", node, "--nproc-per-node", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut grow = agent("grow");
    let g1 = wait("a world of 3 at step 10", 3, 10, g0);
    // The stopped world's token launches nothing any more.
    let (code, _, err) = rsh(Some(&token), "local-1", &touch);
    assert_eq!(code, Some(255), "{err}");
    assert!(
        err.contains("rsh refused: not the running MPI world's launcher"),
        "{err}"
    );
    assert!(!marker.exists());
    set_limit(20);
    wait("step 20 in the world of 3", 3, 20, g1 - 1);

    // Shrink: the agent is told to leave (bftrainerd's shrink, a preemption's grace).
    // SAFETY: signalling our own child.
    unsafe { libc::kill(grow.0.id() as i32, libc::SIGTERM) };
    let st = grow.0.wait().unwrap();
    assert_eq!(st.code(), Some(0), "the leaving agent");
    let g2 = wait("a world of 2 at step 20", 2, 20, g1);

    // A node lost without warning.
    let mut lost = agent("lost");
    let g3 = wait("a world of 3 at step 20 again", 3, 20, g2);
    set_limit(30);
    wait("step 30 in the world of 3", 3, 30, g3 - 1);
    let killed_at = unix_now();
    lost.0.kill().unwrap();
    lost.0.wait().unwrap();
    wait("a world of 2 at step 30", 2, 30, g3);
    set_limit(budget);
    let mut core = core;
    let st = core.0.wait().unwrap();
    let all = out();
    assert_eq!(st.code(), Some(0), "{all}");

    // The sum: every step once, to the budget.
    let want = budget * (budget + 1) / 2;
    assert!(
        all.contains(&format!("final steps={budget} total={want}")),
        "{all}"
    );
    let l = lines(&log);
    let stepped = steps_taken(&l);
    assert_eq!(
        stepped,
        (1..=budget).collect::<Vec<_>>(),
        "each step once: {l:?}"
    );
    // The worlds, and the stops (SIGUSR1) that reached the program (growth, shrink).
    let sizes: Vec<u64> = l
        .iter()
        .filter(|x| x["start"] == true)
        .map(|x| x["world"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![2, 3, 2, 3, 2], "{all}");
    let stopped: Vec<u64> = l
        .iter()
        .filter(|x| x["stopped"] == true)
        .map(|x| x["step"].as_u64().unwrap())
        .collect();
    assert!(
        stopped.starts_with(&[10, 20, 20]),
        "checkpoints on the stop signal at the growth, the shrink and the next growth: {stopped:?}"
    );
    // What each change cost (printed, not asserted: a figure for docs/user.md):
    // from the old world's stop (its checkpoint line; the kill for the lost node)
    // to the new world's start line (MPI up, the checkpoint read and broadcast).
    let t = |x: &Value| x["t"].as_f64().unwrap();
    let starts: Vec<f64> = l.iter().filter(|x| x["start"] == true).map(t).collect();
    let stops: Vec<f64> = l.iter().filter(|x| x["stopped"] == true).map(t).collect();
    assert!(starts.len() == 5 && stops.len() >= 3, "{l:?}");
    eprintln!(
        "MPI mode, stop to the next world's start: grow 2->3 {:.2} s, shrink 3->2 {:.2} s, grow 2->3 {:.2} s; kill -9 to the next start {:.2} s",
        starts[1] - stops[0],
        starts[2] - stops[1],
        starts[3] - stops[2],
        starts[4] - killed_at
    );
    for s in [
        "1 node(s) joined",
        "agent 3 (127.0.0.1) leaves",
        "agent 4 (127.0.0.1) is gone",
        "training finished in generation",
    ] {
        assert!(all.contains(s), "{s:?} missing: {all}");
    }
    for l in all
        .lines()
        .filter(|l| l.contains("generation") || l.contains("leaves") || l.contains("is gone"))
    {
        eprintln!("{l}");
    }
    // Nothing of the job stays running: no rank (the daemons' children) outlives
    // the job for long (they exit once their daemon is gone).
    let dir = tmp.path().to_string_lossy().into_owned();
    let left = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&dir) && c.contains("mpi_sum.py"))
            .collect()
    };
    let t = Instant::now();
    while !left().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "left running: {:?}",
            left()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `bftrainer.report_progress` in an MPI program: every rank calls it, rank 0 writes
/// into its own node's agent's file (each rank's BFT_PROGRESS_FILE is its node's
/// agent's, through mpirun's environment or an rsh session daemon's), and bft-run
/// publishes the measured rate in what would be the job's Comment, as for a
/// native program: bftrainerd's node and batch decisions need it.
#[test]
fn an_mpi_program_that_reports_progress_gets_its_rate_published() {
    let Some(python) = mpi_python_or_skip() else {
        return;
    };
    let m = Munged::start();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let limit = tmp.path().join("limit");
    std::fs::write(&limit, "1000000").unwrap();
    let comment = tmp.path().join("comment");
    let err_path = tmp.path().join("err");
    let _core = Guard(
        mpi_env(&mut m.bft())
            .args(["--local", "2", "--nproc-per-node", "1", "--mode", "mpi"])
            .arg("--comment-file")
            .arg(&comment)
            .arg("--")
            .arg(&python)
            .args([PROGRAM, "--ckpt"])
            .arg(tmp.path().join("ckpt.json"))
            .args(["--steps", "1000000", "--log"])
            .arg(&log)
            .arg("--limit-file")
            .arg(&limit)
            .args(["--report-progress", "--step-sleep", "0.02"])
            .env(
                "PYTHONPATH",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../python/src"),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(&err_path).unwrap()))
            .spawn()
            .unwrap(),
    );
    let rate = || comment_rate(&comment);
    let t = Instant::now();
    while !rate().is_some_and(|r| r > 0.0) {
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "no measured rate in the Comment: {:?}\nthe program's log (last 3): {:?}\nthe job's output:\n{}",
            std::fs::read_to_string(&comment),
            lines(&log).iter().rev().take(3).collect::<Vec<_>>(),
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 2 samples a step (one per rank), as the program reports its batch.
    let c = std::fs::read_to_string(&comment).unwrap();
    assert!(c.contains("batch=2"), "{c}");
    // Each rank was given its own node's agent's file: two agents, two files.
    let l = lines(&log);
    let start = l.iter().find(|x| x["start"] == true).expect("a start line");
    let files: Vec<&str> = start["progress_file"]
        .as_array()
        .expect("progress_file")
        .iter()
        .map(|f| f.as_str().expect("BFT_PROGRESS_FILE set on every rank"))
        .collect();
    assert_eq!(files.len(), 2, "{start}");
    assert_ne!(files[0], files[1], "one file per node's agent: {start}");
    for f in &files {
        let dir = Path::new(f).parent().unwrap().file_name().unwrap();
        assert!(
            dir.to_string_lossy().starts_with("bft-agent-"),
            "an agent's directory: {f}"
        );
    }
}
