//! `bft-run --mode torchrun` without Slurm (`--local`), against a private munged, with
//! an unmodified torchrun-style DDP script (tests/ddp_torchrun.py, real torch on gloo):
//! the job grows (an agent started by hand, as a satellite's is), shrinks (that agent
//! gets SIGTERM), loses a node without warning (another agent killed with SIGKILL) and a
//! worker (SIGKILL: a failure, restarted), and finishes at its step budget with its loss
//! under a threshold; every world's torchrun environment is checked. `bft-run hosts`
//! tracks the membership meanwhile.
//!
//! The script steps only up to the number in a file the test raises, so every change
//! lands at a known step whatever the machine's load: the test waits for conditions
//! (the script's progress lines), never for a time.
//!
//! It needs the virtualenv with torch (`BFT_VENV`, default /opt/bftrainer-venv, made by
//! scripts/python-env) and munged.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;
use support::{comment_rate, steps_taken, wait_until, Guard, Munged};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ddp_torchrun.py");

fn venv_python() -> PathBuf {
    let venv =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: make it with scripts/python-env (make test does)",
        python.display()
    );
    python
}

/// The script's progress lines (rank 0's).
fn progress(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("progress"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The last progress line says: a world of `world` after restart `after`, holding at
/// `step`. Returns that world's restart count.
fn holding(dir: &Path, world: u64, step: u64, after: Option<u64>) -> Option<u64> {
    let p = progress(dir);
    let last = p.last()?;
    let r = last["restart"].as_u64()?;
    (last["world"] == world
        && last["step"] == step
        && last["hold"] == true
        && after.map_or(true, |a| r > a))
    .then_some(r)
}

/// Every world's environment files, by restart count and rank.
fn envs(dir: &Path) -> BTreeMap<u64, BTreeMap<u64, Value>> {
    let mut out: BTreeMap<u64, BTreeMap<u64, Value>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix("env-r")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let (r, k) = rest.split_once("-k").unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
        out.entry(r.parse().unwrap())
            .or_default()
            .insert(k.parse().unwrap(), v);
    }
    out
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// Checks one world's environment: ranks 0..W, torchrun's variables consistent.
fn check_world(r: u64, ranks: &BTreeMap<u64, Value>, per_node: u64) -> u64 {
    let any = ranks.values().next().unwrap();
    let w = num(any, "WORLD_SIZE");
    assert_eq!(
        ranks.keys().copied().collect::<Vec<_>>(),
        (0..w).collect::<Vec<_>>(),
        "restart {r}: ranks of a world of {w}: {ranks:?}"
    );
    for (k, v) in ranks {
        let ctx = format!("restart {r}, rank {k}: {v}");
        assert_eq!(num(v, "WORLD_SIZE"), w, "{ctx}");
        assert_eq!(num(v, "ROLE_WORLD_SIZE"), w, "{ctx}");
        assert_eq!(num(v, "ROLE_RANK"), *k, "{ctx}");
        assert_eq!(num(v, "LOCAL_WORLD_SIZE"), per_node, "{ctx}");
        assert_eq!(num(v, "GROUP_WORLD_SIZE"), w / per_node, "{ctx}");
        assert_eq!(
            num(v, "GROUP_RANK") * per_node + num(v, "LOCAL_RANK"),
            *k,
            "{ctx}"
        );
        assert_eq!(num(v, "TORCHELASTIC_RESTART_COUNT"), r, "{ctx}");
        assert!(num(v, "BFT_GENERATION") > r, "{ctx}");
        assert_eq!(v["MASTER_ADDR"], "127.0.0.1", "{ctx}");
        assert_eq!(v["MASTER_PORT"], any["MASTER_PORT"], "{ctx}");
        assert!(num(v, "MASTER_PORT") > 0, "{ctx}");
        assert_eq!(v["TORCHELASTIC_RUN_ID"], "local", "{ctx}");
        assert_eq!(v["TORCHELASTIC_USE_AGENT_STORE"], "False", "{ctx}");
        assert_eq!(v["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1", "{ctx}");
        // The interface of the address the agents reach the coordinator at.
        assert_eq!(v["GLOO_SOCKET_IFNAME"], "lo", "{ctx}");
        assert_eq!(v["NCCL_SOCKET_IFNAME"], "lo", "{ctx}");
        assert!(v["BFT_AGENT_SOCK"].is_null(), "no library socket: {ctx}");
    }
    w
}

/// `bft-run hosts` as a worker would run it (BFT_COORD from its environment).
/// `bft-run --local 1 --nproc-per-node 2 --mode torchrun`, with the virtualenv's
/// python first on PATH: a bare script path runs under it, as under torchrun.
fn torchrun_on_one_node(m: &Munged, python: &Path) -> Command {
    let path = format!(
        "{}:{}",
        python.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = m.bft();
    c.args([
        "--local",
        "1",
        "--nproc-per-node",
        "2",
        "--mode",
        "torchrun",
    ])
    .env("PATH", path);
    c
}

fn hosts(m: &Munged, addr: &str, job: &str, run: &str) -> (Option<i32>, String, String) {
    let o = m
        .bft()
        .arg("hosts")
        .env("BFT_COORD", addr)
        .env("BFT_JOB", job)
        .env("BFT_COORD_RUN", run)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn torchrun_script_grows_shrinks_loses_a_node_and_a_worker_and_finishes() {
    let m = Munged::start();
    let python = venv_python();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs");
    std::fs::create_dir(&dir).unwrap();
    let limit = tmp.path().join("limit");
    let set_limit = |n: u64| std::fs::write(&limit, n.to_string()).unwrap();
    set_limit(20);
    let coord_file = tmp.path().join("coord");
    let out_path = tmp.path().join("out");
    // The decided global batch (as bftrainerd's batch_now would be read): none at first.
    let batch_file = tmp.path().join("batch");
    let budget = 80;
    let core = Guard(
        torchrun_on_one_node(&m, &python)
            .args(["--settle", "1", "--leave-timeout", "20", "--coord-file"])
            .arg(&coord_file)
            .arg("--batch-file")
            .arg(&batch_file)
            .args(["--", SCRIPT, "--ckpt"])
            .arg(tmp.path().join("ckpt.pt"))
            .args(["--steps", &budget.to_string(), "--log"])
            .arg(&dir)
            .arg("--limit-file")
            .arg(&limit)
            .stdout(File::create(&out_path).unwrap())
            .stderr(Stdio::from(File::create(tmp.path().join("err")).unwrap()))
            .spawn()
            .unwrap(),
    );
    let out = || {
        std::fs::read_to_string(tmp.path().join("err")).unwrap_or_default()
            + &std::fs::read_to_string(&out_path).unwrap_or_default()
    };
    let minutes = Duration::from_secs(180);
    let wait = |what: &str, world: u64, step: u64, after: Option<u64>| -> u64 {
        let mut got = None;
        wait_until(what, minutes, &mut || {
            got = holding(&dir, world, step, after);
            got.is_some()
        });
        got.unwrap()
    };
    let r0 = wait("the first world at step 20", 2, 20, None);
    let (addr, job, run) = {
        let s = std::fs::read_to_string(&coord_file).unwrap();
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        (v[0].clone(), v[1].clone(), v[2].clone())
    };
    assert_eq!(hosts(&m, &addr, &job, &run).1, "local-0:2\n");

    // Grow: an agent joins, as a satellite's does.
    let agent = |node: &str| {
        Guard(
            m.bft()
                .args([
                    "--agent",
                    "--coord",
                    &addr,
                    "--coord-job",
                    &job,
                    "--coord-run",
                    &run,
                ])
                .args(["--node-name", node])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let mut grow = agent("grow");
    let r1 = wait("a world of 4 at step 20", 4, 20, Some(r0));
    assert_eq!(hosts(&m, &addr, &job, &run).1, "local-0:2\ngrow:2\n");
    set_limit(40);
    wait("step 40 in the world of 4", 4, 40, Some(r1 - 1));
    // A batch decision: it does not restart the world by itself; every world started
    // from now on gets it (checked below, from the worlds' environments).
    std::fs::write(&batch_file, "32").unwrap();
    wait_until("bft-run to read the decided batch", minutes, &mut || {
        out().contains("global batch decided by bftrainerd: 32")
    });

    // Shrink: the agent is told to leave (bftrainerd's shrink, a preemption's grace).
    // SAFETY: signalling our own child.
    unsafe { libc::kill(grow.0.id() as i32, libc::SIGTERM) };
    let st = grow.0.wait().unwrap();
    assert_eq!(st.code(), Some(0), "the leaving agent");
    let r2 = wait("a world of 2 at step 40", 2, 40, Some(r1));
    assert_eq!(hosts(&m, &addr, &job, &run).1, "local-0:2\n");

    // A node lost without warning.
    let mut lost = agent("lost");
    let r3 = wait("a world of 4 at step 40 again", 4, 40, Some(r2));
    set_limit(60);
    wait("step 60 in the world of 4", 4, 60, Some(r3 - 1));
    lost.0.kill().unwrap();
    lost.0.wait().unwrap();
    let r4 = wait("a world of 2 at step 60", 2, 60, Some(r3));

    // A worker killed: a failure, the world restarted (within --max-restarts).
    let pid = envs(&dir)[&r4][&1]["pid"].as_u64().unwrap() as i32;
    // SAFETY: a worker process of this test's job.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait("the world restarted after the failure", 2, 60, Some(r4));
    set_limit(budget);
    let mut core = core;
    let st = core.0.wait().unwrap();
    let all = out();
    assert_eq!(st.code(), Some(0), "{all}");

    // The training: every step once, to the budget, and learned.
    let fin = all
        .lines()
        .find_map(|l| l.split_once("final step=").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no final line: {all}"));
    let (steps, loss) = fin.split_once(" loss=").unwrap();
    assert_eq!(steps.parse::<u64>().unwrap(), budget, "{all}");
    let loss: f64 = loss.trim().parse().unwrap();
    assert!(loss < 0.01, "loss {loss}: {all}");
    let p = progress(&dir);
    let stepped = steps_taken(&p);
    assert_eq!(
        stepped,
        (1..=budget).collect::<Vec<_>>(),
        "each step once: {p:?}"
    );

    // What the coordinator said, and every world's environment.
    for s in [
        "1 node(s) joined",
        "agent 2 (127.0.0.1) leaves",
        "agent 3 (127.0.0.1) is gone",
        "(rank 1) of generation",
        "ended (signal 9)",
        "training finished in generation",
    ] {
        assert!(all.contains(s), "{s:?} missing: {all}");
    }
    assert!(!all.contains("not restarted"), "{all}");
    for l in all
        .lines()
        .filter(|l| l.contains("generation") || l.contains("leaves") || l.contains("is gone"))
    {
        eprintln!("{l}");
    }
    let e = envs(&dir);
    let sizes: Vec<u64> = e
        .iter()
        .map(|(r, ranks)| check_world(*r, ranks, 2))
        .collect();
    assert_eq!(
        e.keys().copied().collect::<Vec<_>>(),
        (0..e.len() as u64).collect::<Vec<_>>(),
        "a world with no worker started: {e:?}"
    );
    // A world after the sixth only as torchrun would start one too: the sixth had
    // finished the training (its rank 0 printed the final line) and then a rank
    // failed in torch's teardown, a failure that is restarted like any other.
    let (planned, after) = sizes.split_at(sizes.len().min(6));
    assert_eq!(planned, [2, 4, 2, 4, 2, 2], "{all}");
    // The decided batch reached every world started after it, and no earlier one.
    for (r, ranks) in &e {
        let want = if *r >= 2 {
            serde_json::json!("32")
        } else {
            Value::Null
        };
        for v in ranks.values() {
            assert_eq!(v["BFT_GLOBAL_BATCH"], want, "restart {r}: {v}");
        }
    }
    if !after.is_empty() {
        assert!(all.contains("[1.0.g6] final step="), "{all}");
        assert!(after.iter().all(|&n| n == 2), "{all}");
        eprintln!("note: {} world(s) after the training finished", after.len());
    }
}

#[test]
fn hosts_without_a_coordinator_or_from_an_impostor_prints_nothing() {
    let m = Munged::start();
    let o = m
        .bft()
        .arg("hosts")
        .env_remove("BFT_COORD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no coordinator to ask"), "{err}");
    // Nobody listening at the address.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let (code, out, err) = hosts(&m, &addr, "local", "0a");
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    assert!(err.contains("no coordinator at"), "{err}");

    // An impostor at the address: it knows the job and run (they are in the job's
    // Comment) but cannot make the owner's credential for this query.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap().to_string();
    let forged = {
        let o = Command::new("munge")
            .arg("-S")
            .arg(m.socket())
            .args(["-s", "bftrainer-run:v2 coord job=local run=0a anonce=00"])
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let (mut c, _) = fake.accept().unwrap();
        c.write_all(b"{\"t\":\"challenge\",\"proto\":2,\"nonce\":\"ab\",\"job\":\"local\",\"run\":\"0a\"}\n")
            .unwrap();
        let mut hello = String::new();
        BufReader::new(c.try_clone().unwrap())
            .read_line(&mut hello)
            .unwrap();
        let answer = serde_json::json!({
            "t": "hosts", "cred": forged,
            "hosts": [{"node": "evil", "addr": "6.6.6.6", "slots": 9}],
        });
        c.write_all(format!("{answer}\n").as_bytes()).unwrap();
        hello
    });
    let (code, out, err) = hosts(&m, &addr, "local", "0a");
    let hello = server.join().unwrap();
    assert!(hello.contains("\"query\":\"hosts\""), "{hello}");
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    assert!(err.contains("is not job local's coordinator"), "{err}");
}

/// `bftrainer.report_progress` in a torchrun-mode script: bft-run measures the job's
/// rate from it and publishes it in what would be the job's Comment (`rate=`), as for
/// a native script: bftrainerd's node and batch decisions need it.
#[test]
fn a_torchrun_script_that_reports_progress_gets_its_rate_published() {
    let m = Munged::start();
    let python = venv_python();
    let tmp = tempfile::tempdir().unwrap();
    let comment = tmp.path().join("comment");
    let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/src");
    let _core = Guard(
        torchrun_on_one_node(&m, &python)
            .arg("--comment-file")
            .arg(&comment)
            .args(["--", SCRIPT, "--ckpt"])
            .arg(tmp.path().join("ckpt.pt"))
            .args([
                "--steps",
                "1000000",
                "--step-sleep",
                "0.01",
                "--report-progress",
                "--log",
            ])
            .arg(tmp.path())
            .env("PYTHONPATH", lib)
            .stdout(Stdio::null())
            .stderr(Stdio::from(File::create(tmp.path().join("err")).unwrap()))
            .spawn()
            .unwrap(),
    );
    let rate = || comment_rate(&comment);
    wait_until(
        "a measured rate in the Comment",
        Duration::from_secs(180),
        &mut || rate().is_some_and(|r| r > 0.0),
    );
    // 256 samples a step: the rate is whole steps' samples per second.
    let c = std::fs::read_to_string(&comment).unwrap();
    assert!(c.contains("batch=256"), "{c}");
}

#[test]
fn a_failing_torchrun_worker_is_restarted_then_fails_the_job_with_its_code() {
    let m = Munged::start();
    let o = m
        .bft()
        .args(["--local", "2", "--mode", "torchrun", "--max-restarts", "2"])
        .args(["--", "python3", "-c"])
        .arg("import os, sys; print('boom in', os.environ['RANK'], file=sys.stderr); sys.exit(3 if os.environ['RANK'] == '1' else 0)")
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{all}");
    // Three worlds (the first and two restarts), then the end with the code and the tail.
    for g in ["restart 0", "restart 1", "restart 2"] {
        assert!(all.contains(g), "{g}: {all}");
    }
    assert!(!all.contains("restart 3"), "{all}");
    assert!(all.contains("(rank 1) of generation 3"), "{all}");
    assert!(
        all.contains("not restarted: 2 restarts within 600 s already"),
        "{all}"
    );
    assert!(all.contains("boom in 1"), "{all}");
}

#[test]
fn the_sites_runtime_settings_reach_the_workers_after_the_jobs_own() {
    let m = Munged::start();
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("bftrainer.toml");
    let run = |conf_text: &str, extra: &[(&str, &str)]| {
        std::fs::write(&conf, conf_text).unwrap();
        let o = m
            .bft()
            .args(["--local", "1", "--mode", "torchrun", "--", "python3", "-c"])
            .arg("import os; print('NET', os.environ.get('NCCL_SOCKET_IFNAME'), os.environ.get('NCCL_IB_HCA'), os.environ.get('GLOO_SOCKET_IFNAME'))")
            .env("BFTRAINER_CONFIG", &conf)
            .env_remove("NCCL_SOCKET_IFNAME")
            .env_remove("NCCL_IB_HCA")
            .env_remove("GLOO_SOCKET_IFNAME")
            .envs(extra.iter().copied())
            .output()
            .unwrap();
        let all =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{all}");
        let line = all
            .lines()
            .find_map(|l| l.split_once("NET ").map(|(_, r)| r.to_string()))
            .unwrap_or_else(|| panic!("{all}"));
        (line, all)
    };
    let site = "[runtime]\nnccl_socket_ifname = \"site0\"\nnccl_ib_hca = \"mlx5_0:1\"\n";
    assert_eq!(run(site, &[]).0, "site0 mlx5_0:1 lo");
    // The job's own environment comes first.
    assert_eq!(run(site, &[("NCCL_IB_HCA", "mine")]).0, "site0 mine lo");
    // A bad value: said, and the site's settings ignored.
    let (line, all) = run("[runtime]\nnccl_socket_ifname = \"a b\"\n", &[]);
    assert_eq!(line, "lo None lo");
    assert!(
        all.contains("ignoring the site's [runtime] network settings")
            && all.contains("[runtime] nccl_socket_ifname: 'a b' is not an interface"),
        "{all}"
    );
}
