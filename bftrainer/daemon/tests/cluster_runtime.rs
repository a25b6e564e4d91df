//! The elastic runtime end to end on a real Slurm cluster with bftrainerd: an elastic
//! job submitted with `sbatch --elastic=1:4` running `bft-run -- python train.py` (real
//! torch, gloo on CPU) starts on 1 node, grows to 4 as nodes are idle, loses 2 to a
//! regular job (preemption with GraceTime), grows back, survives a worker killed with
//! -9, and finishes: the loss ends low and every sample was used exactly once per
//! epoch, and its steps took the same samples, with the same losses, as a static run
//! of the same training on 2 workers. Forged joins (another uid, a replayed or
//! misdirected credential) are refused.
//!
//! A second test is another user's attack on that job: after a requeue the Comment
//! still names the old coordinator's address; bftuser2 listens there, floods the new
//! coordinator and writes to its store without authenticating; the requeued job's
//! satellites never reach the impostor and the job trains on unharmed.
//!
//! Needs the virtualenv of scripts/python-env (`make test` makes it; BFT_VENV names it).

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use bftrainer_core::runtime::RunComment;
use bftrainer_core::spec;
use live::{same, Live, Other, GRACE_TIME_S};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SAMPLES: usize = 4096;
// Enough epochs that the job cannot finish before the last phase (at the decided batch
// of 64 it once did, in a root under load); the phases over, `--fast-file` ends it fast.
const EPOCHS: usize = 30;
/// The main test's elastic run against a static one, per step (relative): it trains in
/// float64, where the order of a step's sums (other worlds) stays far below this over
/// the whole run. In fp32 that drift alone, between static runs on 1 and 2 workers,
/// passes 1e-3 within 1,000 steps of this training (docs/benchmarks.md).
const LOSS_RTOL_F64: &str = "1e-8";

/// The main test's step time and data: 0.05 s steps (at the script's batch of 16 on one
/// node) by default; `BFT_TEST_STEP=5` runs it with 5 s steps (and less data, one epoch:
/// a few minutes), as issue 19 asks. `--step-sleep` and `--sample-sleep` arguments: 40%
/// of a step does not depend on the batch (synchronisation), 60% is compute that nodes
/// share. With a fixed sleep only, more nodes added nothing, and bftrainerd rightly did
/// not regrow the job once it had measured that (CI saw it stay on 3 nodes).
fn step_and_data() -> (String, usize, usize) {
    let (step, samples, epochs) = match std::env::var("BFT_TEST_STEP") {
        Ok(s) if s.parse::<f64>().is_ok_and(|v| v >= 1.0) => (s.parse().unwrap(), 2048, 1),
        _ => (0.05, SAMPLES, EPOCHS),
    };
    let sleeps = format!(
        "--step-sleep {} --sample-sleep {}",
        step * 0.4,
        step * 0.6 / 16.0
    );
    (sleeps, samples, epochs)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// target/<profile>/bft-run, built with the workspace (`make test` builds it first).
fn bft_run() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("bft-run");
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (make test does)",
        p.display()
    );
    p
}

fn venv() -> PathBuf {
    let v =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let ok = Command::new(v.join("bin/python"))
        .args(["-c", "import torch"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "no Python with torch at {}: run scripts/python-env (make test does) or set BFT_VENV",
        v.display()
    );
    v
}

fn comment(l: &Live, job: u32) -> Option<RunComment> {
    let out =
        l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
            .ok()?;
    let c = out.split(" Comment=").nth(1)?;
    // The Comment runs to the next " Key=" field.
    let end = c
        .find(" StdErr=")
        .or_else(|| c.find(" StdIn="))
        .unwrap_or(c.len());
    RunComment::parse(&c[..end])
}

fn job_out(work: &Path) -> String {
    std::fs::read_to_string(work.join("job.out")).unwrap_or_default()
}

/// Worker processes (train.py) of satellites, not of the core job `core`, of this
/// test's job: they run in `work` (other tests' clusters number their jobs from 1 too).
/// Once the job has stayed in one generation of 4 nodes for 3 s, kills (-9) a
/// worker of `script` in one of its satellites; returns that generation's Comment.
fn kill_a_satellite_worker_when_steady(
    l: &Live,
    job: u32,
    work: &Path,
    script: &str,
) -> RunComment {
    let steady = l.wait(60, "a generation that stays for 3 s", || {
        let a = comment(l, job)?;
        std::thread::sleep(Duration::from_secs(3));
        let b = comment(l, job)?;
        (a.gen == b.gen && b.nodes == 4).then_some(b)
    });
    let victims = satellite_workers_of(job, work, script);
    assert!(!victims.is_empty(), "no satellite worker found");
    let rc = Command::new("kill")
        .args(["-9", &victims[0].to_string()])
        .status()
        .unwrap();
    assert!(rc.success());
    steady
}

/// Worker processes running `script` of satellites of `core`, in `work`.
fn satellite_workers_of(core: u32, work: &Path, script: &str) -> Vec<u32> {
    let work = work.canonicalize().unwrap();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/cwd")).ok() != Some(work.clone()) {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(script) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(ppid) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
        else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{ppid}/environ")).unwrap_or_default();
        let job = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"SLURM_JOB_ID="))
            .map(|v| String::from_utf8_lossy(v).to_string());
        if job.is_some_and(|j| j != core.to_string()) {
            pids.push(pid);
        }
    }
    pids
}

/// One agent-side handshake by hand: read the challenge, send `hello` with
/// `cred(nonce, run)`, return the coordinator's answer line.
fn handshake(addr: &str, cred: impl FnOnce(&str, &str) -> String) -> serde_json::Value {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let ch: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ch["t"], "challenge", "{line}");
    let cred = cred(ch["nonce"].as_str().unwrap(), ch["run"].as_str().unwrap());
    let hello = serde_json::json!({
        "t": "hello", "proto": ch["proto"], "cred": cred, "anonce": "a1",
        "host": "127.0.0.1", "slurm_job": null, "nproc": 1,
    });
    (&s).write_all(format!("{hello}\n").as_bytes()).unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?}: {e}"))
}

fn munge_as(user: &str, socket: &Path, payload: &str) -> String {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", user, "--", "munge", "-S"])
        .arg(socket)
        .args(["-s", payload]);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "munge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Writes `work`/train.sbatch (bft-run over examples/train.py with `train_args`, more
/// `#SBATCH` lines in `sbatch_lines`) and submits it as bftuser with `elastic`.
fn submit_training(
    l: &Live,
    work: &Path,
    elastic: &str,
    sbatch_lines: &str,
    train_args: &str,
) -> u32 {
    submit_example(l, work, elastic, sbatch_lines, "", "train.py", train_args)
}

/// As `submit_training`, for examples/`example` with bft-run's options `bft_args`.
fn submit_example(
    l: &Live,
    work: &Path,
    elastic: &str,
    sbatch_lines: &str,
    bft_args: &str,
    example: &str,
    train_args: &str,
) -> u32 {
    let script = work.join("train.sbatch");
    let repo = repo();
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#SBATCH -J train\n#SBATCH -o {work}/job.out\n{sbatch_lines}\
             export PYTHONPATH={repo}/wrappers/python/src\n\
             exec {bft} {bft_args} -- {venv}/bin/python {repo}/wrappers/python/examples/{example} {train_args}\n",
            work = work.display(),
            repo = repo.display(),
            bft = bft_run().display(),
            venv = venv().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    l.sbatch_as_user(&[elastic, script.to_str().unwrap()], Some(work))
}

/// check_samples.py over a run's sample logs: every sample once per epoch. Its report.
fn check_samples(dir: &Path, samples: usize, epochs: usize) -> String {
    run_check(&[
        dir.as_os_str(),
        samples.to_string().as_ref(),
        epochs.to_string().as_ref(),
    ])
}

/// check_samples.py with `args`; its report (it must succeed).
fn run_check(args: &[&std::ffi::OsStr]) -> String {
    let check = Command::new(venv().join("bin/python"))
        .arg(repo().join("wrappers/python/tests/check_samples.py"))
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(
        check.status.success(),
        "check_samples.py {args:?} failed: {said}"
    );
    said
}

/// Prints the job's output if the test fails (the directory goes with the test).
struct ShowOutput(PathBuf);

impl Drop for ShowOutput {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- job output ---\n{}", job_out(&self.0));
        }
    }
}

/// The measured rate bftrainerd has recorded for `job` (its status file), once above 0.
fn daemon_rate(l: &Live, job: u32) -> Option<f64> {
    let st = std::fs::read_to_string(l.dir.join("state/status.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&st).ok()?;
    v["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["job_id"] == job)
        .and_then(|j| j["rate"].as_f64())
        .filter(|r| *r > 0.0)
}

/// A regular job of `nodes` nodes in `batch` that holds them (`srun sleep 600`) until
/// the test cancels it, started within GraceTime (Slurm preempts satellites for it):
/// its id. A job that ended by itself could let the elastic job regrow before the
/// test saw it shrink.
fn regular_holding(l: &Live, nodes: u32) -> u32 {
    let t0 = Instant::now();
    let n = nodes.to_string();
    let reg =
        l.c.sbatch(&["-p", "batch", "-N", &n, "--wrap", "srun sleep 600"])
            .unwrap();
    l.wait(GRACE_TIME_S + 5, "the regular job to start", || {
        (l.state_of(reg) == "RUNNING").then_some(())
    });
    eprintln!(
        "regular job running {:.1} s after submission",
        t0.elapsed().as_secs_f64()
    );
    reg
}

#[test]
fn cluster_runtime_trains_through_grow_preemption_regrow_and_kill_9() {
    venv(); // fails at once, naming scripts/python-env, when torch is missing
    let bft = bft_run();
    let setup = live::setup_join("bftrt", "", "", &|_| {
        format!("{} --join {{parent}}", bft.display())
    });
    let mut l = Live::from_setup(setup);
    l.spawn();
    let user = bftrainer_testcluster::TEST_USER.to_string();
    let work = l.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let status = Command::new("chown")
        .arg(&user)
        .arg(&work)
        .status()
        .unwrap();
    assert!(status.success());
    let _show = ShowOutput(work.clone());
    let (sleeps, samples, epochs) = step_and_data();
    // A fixed global batch of 16 that bftrainerd may raise to 64 (issue 32, Saxena):
    // part of each step's sleep does not depend on the batch, so a larger batch wins
    // once its rates at two sizes show it. A regular job holds 3 nodes until bftrainerd
    // has the job's rate on 1 node, so its next rate is measured after it grew. (It
    // held them for a fixed 20 s once: on a loaded CI machine the elastic job was
    // admitted only after they had ended, grew onto all 4 at once, and its batch was
    // never decided: one size measured.)
    let first = regular_holding(&l, 3);
    let job = submit_training(
        &l,
        &work,
        "--elastic=1:4,batch=16:64,lr=sqrt",
        "",
        &format!(
            "--samples {samples} --global-batch 16 --dtype float64 --epochs {epochs} {sleeps} --log-dir {}/samples --fast-file {}/fast",
            work.display(),
            work.display()
        ),
    );

    let one = l.wait(180, "the runtime's rate on 1 node", || {
        comment(&l, job).filter(|c| c.nodes == 1 && c.rate > 0.0)
    });
    l.wait(60, "bftrainerd to record the rate on 1 node", || {
        daemon_rate(&l, job)
    });
    eprintln!("on 1 node: {one}");
    l.c.run("scancel", &[&first.to_string()]).unwrap();

    // 1. Starts on 1 node, grows to 4: the runtime publishes 4 nodes in generation.
    let c = l.wait(120, "the runtime to train on 4 nodes", || {
        comment(&l, job).filter(|c| c.nodes == 4)
    });
    eprintln!("grown: {c}");
    // bftrainerd reads the measured rate from the Comment: a Progress event.
    let rate = l.wait(60, "bftrainerd to record the job's measured rate", || {
        daemon_rate(&l, job)
    });
    eprintln!("bftrainerd sees {rate:.1} samples/s");

    // 1b. With rates at two sizes, bftrainerd decides the batch: 64, written into the
    //     core's tag; bft-run hands it to the workers, whose next step takes it.
    let t_batch = Instant::now();
    l.wait(120, "the workers to run at the decided batch of 64", || {
        let show =
            l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
                .ok()?;
        let tag = show.split(" AdminComment=").nth(1)?;
        // The tag is two words ("bftrainer:v1 SPEC"); the next field follows.
        let decided = spec::batch_now(&tag.split(' ').take(2).collect::<Vec<_>>().join(" "));
        (decided == Some(64) && comment(&l, job)?.batch == 64).then_some(())
    });
    eprintln!(
        "batch 64 decided and applied {:.1} s after the grow",
        t_batch.elapsed().as_secs_f64()
    );

    // 2. Forged joins are refused while the job runs.
    // Root on a node of the cluster, with the cluster's munged.
    let munge_socket = l.c.work_dir().parent().unwrap().join("munge/munge.socket");
    let bad = Command::new(&bft)
        .env("BFT_MUNGE_SOCKET", &munge_socket)
        .args(["--agent", "--coord", &c.coord])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("uid"),
        "root's agent joined bftuser's job: {err}"
    );
    let mut stolen = String::new();
    let a = handshake(&c.coord, |nonce, run| {
        // A credential of the right user made for another connection's nonce.
        stolen = munge_as(
            &user,
            &munge_socket,
            &format!(
                "bftrainer-run:v2 agent job={job} run={run} to={} nonce={nonce}0 anonce=a1",
                c.coord
            ),
        );
        stolen.clone()
    });
    assert_eq!(a["t"], "error", "{a}");
    let b = handshake(&c.coord, |_, _| stolen.clone());
    assert_eq!(b["t"], "error", "a replayed credential was accepted: {b}");
    assert!(b.to_string().contains("replay"), "{b}");

    // 3. A regular job takes 2 nodes: Slurm preempts 2 satellites with GraceTime; the
    //    workers there leave at a step boundary; the regular job starts in time.
    //    It runs until the test has seen the job on 2 nodes (then it is cancelled).
    let reg = regular_holding(&l, 2);
    l.wait(60, "the runtime to train on 2 nodes", || {
        comment(&l, job).filter(|c| c.nodes == 2)
    });

    // 4. It ends; the daemon grows the job back to 4.
    l.c.run("scancel", &[&reg.to_string()]).unwrap();
    l.wait(120, "the runtime to train on 4 nodes again", || {
        comment(&l, job).filter(|c| c.nodes == 4 && l.state_of(reg) != "RUNNING")
    });

    // 5. A satellite's worker killed with -9 while the world is steady (a kill in the
    //    middle of a switch has no step to roll back): a rollback, not the job.
    kill_a_satellite_worker_when_steady(&l, job, &work, "examples/train.py");
    // The phases are over: the job runs out its epochs without the step sleep.
    std::fs::write(work.join("fast"), "").unwrap();

    // 6. It finishes: loss low, every sample exactly once per epoch.
    l.wait(400, "the elastic job to complete", || {
        let s = l.state_of(job);
        (!["RUNNING", "PENDING", "CONFIGURING", "COMPLETING"].contains(&s.as_str())).then_some(())
    });
    let text = job_out(&work);
    assert_eq!(l.state_of(job), "COMPLETED", "job output:\n{text}");
    // bft-run's last word: this run's training finished (bftrainerd counts a core
    // ended under preemption as finished only then).
    let last = comment(&l, job).expect("the runtime's Comment");
    assert!(
        last.done,
        "the Comment does not say done: {last:?}\njob output:\n{text}"
    );
    assert!(
        text.contains("rolling back"),
        "no rollback after kill -9:\n{text}"
    );
    let loss: f64 = text
        .lines()
        .find_map(|l| l.split("final loss ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no final loss in the output:\n{text}"));
    // One short epoch (the 5 s variant) does not get as far as ten.
    let good = if epochs > 1 { 0.1 } else { 0.5 };
    assert!(loss < good, "final loss {loss}:\n{text}");
    let said = check_samples(&work.join("samples"), samples, epochs);
    assert!(
        said.contains(&format!("{} samples", samples * epochs)),
        "{said}"
    );
    eprintln!("{said}");
    let batches = check_batches(&work.join("samples"), &text, samples);

    // 7. The same training run statically on 2 workers (`bft-run --local 2` on this
    //    machine, no Slurm, no sleeps), with the elastic run's batch decision at the step
    //    where its committed lineage took it, up to 50 steps after its last change of
    //    world (after that it is a static run on 4 workers): in every step the same
    //    samples and the same loss (issue 32).
    let t_ref = Instant::now();
    let logs = work.join("samples");
    let last_change: u64 = run_check(&["--last-change".as_ref(), logs.as_os_str()])
        .trim()
        .parse()
        .unwrap();
    let reference = static_reference(
        &l,
        &munge_socket,
        samples,
        epochs,
        &batches,
        last_change + 50,
    );
    let said = run_check(&[
        "--compare".as_ref(),
        logs.as_os_str(),
        reference.as_os_str(),
        LOSS_RTOL_F64.as_ref(),
    ]);
    eprintln!(
        "{} (the static reference: {:.1} s for steps 1-{}, the last change of world at step {last_change})",
        said.trim(),
        t_ref.elapsed().as_secs_f64(),
        last_change + 50
    );
}

/// The HSDP job's data: epochs of 256 sequences (16 steps on 4 nodes of 2 workers at
/// 2 per rank), as many as the phases take; `--stop-file` ends it at the next epoch
/// boundary, so the run's tail is under one short epoch whatever the load.
const HSDP_SAMPLES: usize = 256;

/// FSDP2 HSDP (`fully_shard(..., mesh=bftrainer.device_mesh())`, examples/train_hsdp.py)
/// with 2 workers per node under bftrainerd: grows 1 -> 4 nodes, loses 2 to a regular
/// job, grows back, survives a satellite worker killed with -9 (its replacement takes
/// its shards from a live replica), and every sample is used once per epoch.
#[test]
fn cluster_runtime_hsdp_through_grow_preemption_regrow_and_kill_9() {
    venv();
    let t_all = Instant::now();
    let (l, work, _show) = joining_cluster("bfthsdp");
    let (stop, loss_log) = (work.join("stop"), work.join("loss"));
    let job = submit_example(
        &l,
        &work,
        "--elastic=1:4",
        "",
        "--nproc-per-node 2",
        "train_hsdp.py",
        &format!(
            "--samples {HSDP_SAMPLES} --batch 2 --epochs 100000 --seq 8 --dim 32 --layers 1 \
             --step-sleep 0.1 --log-dir {w}/samples --loss-log {w}/loss --stop-file {w}/stop",
            w = work.display()
        ),
    );

    // A step rank 0 committed in a world of `world` workers after `after` (Unix
    // seconds), from its loss log ("step loss world gen time"): its generation. (The
    // Comment counts nodes with a worker; HSDP trains only generations of whole nodes.)
    let trained = |world: u64, after: f64| -> Option<u64> {
        let text = std::fs::read_to_string(&loss_log).ok()?;
        text.lines().rev().find_map(|r| {
            let f: Vec<&str> = r.split_whitespace().collect();
            let w = f.get(2)?.parse::<u64>().ok()?;
            let gen = f.get(3)?.parse::<u64>().ok()?;
            let at = f.get(4)?.parse::<f64>().ok()?;
            (w == world && at > after).then_some(gen)
        })
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };

    // 1. 1 -> 4 nodes (8 workers).
    l.wait(180, "the HSDP job to train on 4 nodes (8 workers)", || {
        trained(8, 0.0)
    });
    eprintln!("grown to 4 nodes at {:.1} s", t_all.elapsed().as_secs_f64());

    // 2. A regular job takes 2 nodes: 2 satellites leave whole, as replicas, at a step
    //    boundary. It holds them until the shrink is seen (then it is cancelled).
    let reg = regular_holding(&l, 2);
    let t_reg = now();
    l.wait(60, "the HSDP job to train on 2 nodes (4 workers)", || {
        comment(&l, job)
            .filter(|c| c.nodes == 2)
            .and_then(|_| trained(4, t_reg))
    });

    // 3. It ends; the job grows back to 4.
    l.c.run("scancel", &[&reg.to_string()]).unwrap();
    let t_cancel = now();
    l.wait(180, "the HSDP job to train on 4 nodes again", || {
        trained(8, t_cancel)
    });

    // 4. A satellite's worker killed with -9 in a steady world: a rollback; its agent
    //    restarts it and it takes its shards from its local rank in a live replica.
    let steady = kill_a_satellite_worker_when_steady(&l, job, &work, "examples/train_hsdp.py");
    let t_kill = now();
    let g = l.wait(
        180,
        "the HSDP job to train on 8 workers after the kill",
        || trained(8, t_kill).filter(|g| *g > steady.gen),
    );
    eprintln!(
        "trained on 8 workers in generation {g} after the kill, {:.1} s in",
        t_all.elapsed().as_secs_f64()
    );
    std::fs::write(&stop, "").unwrap();

    // 5. It ends at the next epoch boundary: every sample once per epoch.
    l.wait(300, "the HSDP job to complete", || {
        let s = l.state_of(job);
        (!["RUNNING", "PENDING", "CONFIGURING", "COMPLETING"].contains(&s.as_str())).then_some(())
    });
    let text = job_out(&work);
    assert_eq!(l.state_of(job), "COMPLETED", "job output:\n{text}");
    let last = comment(&l, job).expect("the runtime's Comment");
    assert!(last.done, "the Comment does not say done: {last:?}\n{text}");
    assert!(
        text.contains("rolling back"),
        "no rollback after kill -9:\n{text}"
    );
    // "final loss L after N steps, M samples"
    let (loss, samples) = text
        .lines()
        .find_map(|l| {
            let r = l.split("final loss ").nth(1)?;
            let f: Vec<&str> = r.split_whitespace().collect();
            Some((
                f.first()?.parse::<f64>().ok()?,
                f.get(4)?.parse::<usize>().ok()?,
            ))
        })
        .unwrap_or_else(|| panic!("no final loss in the output:\n{text}"));
    assert!(
        samples > 0 && samples % HSDP_SAMPLES == 0,
        "{samples} samples: not whole epochs of {HSDP_SAMPLES}"
    );
    let epochs = samples / HSDP_SAMPLES;
    // From ln(64) = 4.16 at the start; the bigram data allow about 0.7.
    assert!(loss < 2.0, "final loss {loss}:\n{text}");
    let said = check_samples(&work.join("samples"), HSDP_SAMPLES, epochs);
    assert!(said.contains(&format!("{samples} samples")), "{said}");
    // 2 workers per node: worlds of 8 (4 nodes) and 4 (2 nodes) trained.
    let worlds: std::collections::BTreeSet<u64> = std::fs::read_to_string(&loss_log)
        .unwrap()
        .lines()
        .filter_map(|r| r.split_whitespace().nth(2)?.parse().ok())
        .collect();
    assert!(
        worlds.contains(&8) && worlds.contains(&4) && worlds.last() == Some(&8),
        "trained in worlds {worlds:?}"
    );
    eprintln!(
        "{said}final loss {loss} after {epochs} epochs, worlds {worlds:?}; {:.1} s in all",
        t_all.elapsed().as_secs_f64()
    );
}

/// Kills a process group when dropped (a test that fails leaves no workers behind).
struct KillGroup(u32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a process group this test started.
        unsafe { libc::kill(-(self.0 as i32), libc::SIGKILL) };
    }
}

/// Runs examples/train.py statically up to step `stop_at`: `bft-run --local 2` on this
/// machine with the cluster's munged, the main test's data, seed, dtype and global batch
/// of 16, the job's learning-rate rule (sqrt, as spank/bftrainer exports it), and
/// `--batch-at` for each later entry of `batches` ((batch, first step), from
/// check_batches). Returns its sample logs' directory.
fn static_reference(
    l: &Live,
    munge_socket: &Path,
    samples: usize,
    epochs: usize,
    batches: &[(u64, u64)],
    stop_at: u64,
) -> PathBuf {
    let dir = l.dir.join("static");
    std::fs::create_dir_all(&dir).unwrap();
    let logs = dir.join("samples");
    let mut cmd = Command::new(bft_run());
    cmd.args(["--local", "2", "--"])
        .arg(venv().join("bin/python"))
        .arg(repo().join("wrappers/python/examples/train.py"))
        .args(["--samples", &samples.to_string(), "--global-batch", "16"])
        .args(["--dtype", "float64", "--epochs", &epochs.to_string()])
        .args(["--stop-at", &stop_at.to_string(), "--log-dir"])
        .arg(&logs);
    for (batch, step) in &batches[1..] {
        cmd.args(["--batch-at", &format!("{step}:{batch}")]);
    }
    let out = dir.join("out");
    let file = std::fs::File::create(&out).unwrap();
    let child = cmd
        .current_dir(&dir)
        .env("BFT_MUNGE_SOCKET", munge_socket)
        .env("PYTHONPATH", repo().join("wrappers/python/src"))
        .env("BFT_LR_RULE", "sqrt")
        // One intra-op thread: torch's pool of one per core spins on a loaded machine
        // (7 s against 52 s for 1,111 steps alone, at a load of 10 on 2 cores).
        .env("OMP_NUM_THREADS", "1")
        .env_remove("SLURM_JOB_ID")
        .stderr(file.try_clone().unwrap())
        .stdout(file)
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = KillGroup(child.id());
    let mut child = child;
    let rc = l.wait(300, "the static reference run", || {
        child.try_wait().unwrap()
    });
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(rc.success(), "the static reference failed ({rc}):\n{text}");
    assert!(
        text.contains(&format!(" after {stop_at} steps,")),
        "the static reference did not run {stop_at} steps:\n{text}"
    );
    logs
}

/// The committed lineage's steps (the highest generation that ran each, from
/// examples/train.py's `B gen step batch lr` and `S gen step epoch rank ids...` lines):
/// they start at the script's 16 and turn to 64 at one step, once, which rank 0 announced
/// ("global batch 64 from step K-1"); every step took its batch (but an epoch's last)
/// with lr = 0.05 * sqrt(G / 16). Returns (batch, first step) of each stretch.
fn check_batches(dir: &Path, out: &str, samples: usize) -> Vec<(u64, u64)> {
    use std::collections::BTreeMap;
    let mut b: BTreeMap<u64, (u64, u64, f64)> = BTreeMap::new();
    let mut took: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let p: Vec<&str> = line.split_whitespace().collect();
            match p.first() {
                Some(&"B") if p.len() == 5 => {
                    let (gen, step): (u64, u64) = (p[1].parse().unwrap(), p[2].parse().unwrap());
                    if b.get(&step).map_or(true, |x| x.0 <= gen) {
                        b.insert(step, (gen, p[3].parse().unwrap(), p[4].parse().unwrap()));
                    }
                }
                Some(&"S") if p.len() >= 5 => {
                    let key = (p[2].parse().unwrap(), p[1].parse().unwrap());
                    *took.entry(key).or_default() += p.len() - 5;
                }
                _ => {}
            }
        }
    }
    let mut order: Vec<(u64, u64)> = Vec::new();
    let mut consumed = 0usize;
    for (&step, &(gen, batch, lr)) in &b {
        let want = 0.05 * (batch as f64 / 16.0).sqrt();
        assert!(
            (lr - want).abs() < 1e-12,
            "step {step}: lr {lr} at batch {batch}, want {want}"
        );
        let n = took.get(&(step, gen)).copied().unwrap_or(0);
        consumed = (consumed + n) % samples;
        assert!(
            n == batch as usize || consumed == 0,
            "step {step} (generation {gen}) took {n} samples at batch {batch}"
        );
        if order.last().map_or(true, |o| o.0 != batch) {
            order.push((batch, step));
        }
    }
    assert_eq!(order.first().map(|o| o.0), Some(16), "{order:?}");
    // Once: under Saxena's model a larger batch never does worse, so nothing may send
    // the job back to 16 (ties did, every 30 s, before the switch needed a 10% gain).
    assert!(
        order.len() <= 2,
        "the batch moved back and forth: {order:?}"
    );
    let first64 = order
        .iter()
        .find(|o| o.0 == 64)
        .unwrap_or_else(|| panic!("never at 64: {order:?}"));
    assert!(
        out.contains(&format!("global batch 64 from step {}", first64.1 - 1)),
        "rank 0 did not announce the switch before step {}",
        first64.1
    );
    eprintln!("batches by first step: {order:?}");
    order
}

/// bftuser2's stand-in coordinator at a stale address: answers every connection with a
/// challenge for `job` and `run` and logs what the peer sent (a hello would mean an
/// agent of the job followed the stale address).
const IMPOSTOR: &str = r#"
import json, os, socket, sys, time
host, port, job, run, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t = time.time()
while True:
    try:
        s.bind((host, port)); break
    except OSError:
        if time.time() - t > 60: raise
        time.sleep(0.2)
s.listen(16)
open(log, "a").write("listening\n")
while True:
    c, _ = s.accept()
    c.settimeout(5)
    c.sendall((json.dumps({"t": "challenge", "proto": 2, "nonce": "ab", "job": job, "run": run}) + "\n").encode())
    try:
        line = c.makefile().readline()
    except OSError:
        line = ""
    open(log, "a").write(("hello " if line else "nothing ") + line[:80].strip() + "\n")
    c.close()
"#;

#[test]
fn cluster_runtime_another_user_cannot_reach_a_requeued_job_through_its_old_address() {
    venv(); // fails at once, naming scripts/python-env, when torch is missing
    let bft = bft_run();
    let setup = live::setup_join("bftatk", "", "", &|_| {
        format!("{} --join {{parent}}", bft.display())
    });
    let mut l = Live::from_setup(setup);
    l.spawn();
    let user = bftrainer_testcluster::TEST_USER.to_string();
    let attacker = bftrainer_testcluster::OTHER_USER.to_string();
    let work = l.dir.join("work");
    let lair = l.dir.join("attacker");
    for (d, who) in [(&work, &user), (&lair, &attacker)] {
        std::fs::create_dir_all(d).unwrap();
        assert!(Command::new("chown")
            .arg(who)
            .arg(d)
            .status()
            .unwrap()
            .success());
    }
    let _show = ShowOutput(work.clone());
    let job = submit_training(
        &l,
        &work,
        "--elastic=1:2",
        "#SBATCH --open-mode=append\n",
        &format!(
            "--samples 2048 --batch 16 --epochs 4 --step-sleep 0.1 --log-dir {}/samples.${{SLURM_RESTART_COUNT:-0}}",
            work.display()
        ),
    );
    let first = l.wait(120, "the runtime to train on 2 nodes", || {
        comment(&l, job).filter(|c| c.nodes == 2)
    });
    assert!(!first.run.is_empty() && first.start > 0, "{first}");

    // The job is requeued: its Comment keeps the old coordinator's address until the
    // next run publishes its own. bftuser2 takes that address.
    let rc = l.c.run("scontrol", &["requeue", &job.to_string()]);
    assert!(rc.is_ok(), "{rc:?}");
    let (host, port) = first.coord.rsplit_once(':').unwrap();
    let log = lair.join("impostor.log");
    let mut impostor = Command::new("runuser")
        .args(["-u", &attacker, "--", "python3", "-c", IMPOSTOR, host, port])
        .arg(job.to_string())
        .arg(&first.run)
        .arg(&log)
        .process_group(0)
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            // SAFETY: signalling the process group we made for runuser and python.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
    let _k = Kill(&mut impostor);
    l.wait(90, "the impostor to hold the old address", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|s| s.contains("listening"))
    });

    // The next run: a new run id and start time; it grows to 2 nodes again.
    let second = l.wait(
        240,
        "the requeued job to train on 2 nodes in a new run",
        || comment(&l, job).filter(|c| c.run != first.run && c.nodes == 2),
    );
    assert_ne!(second.start, first.start, "{second}");

    // bftuser2 against the new coordinator: a store write and a flood, unauthenticated.
    let s = TcpStream::connect(&second.coord).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    (&s).write_all(b"{\"t\":\"kv\",\"op\":\"set\",\"key\":\"g1/decision\",\"value\":\"00\",\"worker\":\"1.0\",\"id\":1}\n")
        .unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("expected a hello"), "{line}");
    let flood = Command::new("runuser")
        .args(["-u", &attacker, "--", "python3", "-c"])
        .arg(
            "import socket,sys\nh,p=sys.argv[1].rsplit(':',1)\nsocks=[]\nfor i in range(300):\n    try:\n        socks.append(socket.create_connection((h,int(p)),timeout=2))\n    except OSError:\n        pass\nimport time; time.sleep(3)\nprint(len(socks))",
        )
        .arg(&second.coord)
        .output()
        .unwrap();
    assert!(
        flood.status.success(),
        "{}",
        String::from_utf8_lossy(&flood.stderr)
    );

    // The job is unharmed: it finishes, every sample once per epoch in the last run.
    l.wait(400, "the elastic job to complete", || {
        let s = l.state_of(job);
        (![
            "RUNNING",
            "PENDING",
            "CONFIGURING",
            "COMPLETING",
            "REQUEUED",
        ]
        .contains(&s.as_str()))
        .then_some(())
    });
    let text = job_out(&work);
    assert_eq!(l.state_of(job), "COMPLETED", "job output:\n{text}");
    let said = check_samples(&work.join("samples.1"), 2048, 4);
    let seen = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !seen.contains("hello "),
        "an agent of the job followed the stale address to the impostor:\n{seen}"
    );
    assert!(
        text.contains("closing connections from"),
        "the flood was not capped:\n{text}"
    );
    eprintln!("impostor saw: {seen:?}\n{said}");
}

/// The last progress line of tests/ddp_torchrun.py (rank 0's): a world of `world`
/// holding at `step`, in a restart later than `after`; its restart count.
fn torchrun_holding(logs: &Path, world: u64, step: u64, after: Option<u64>) -> Option<u64> {
    let text = std::fs::read_to_string(logs.join("progress")).ok()?;
    let last: serde_json::Value = serde_json::from_str(text.lines().last()?).ok()?;
    let r = last["restart"].as_u64()?;
    (last["world"] == world
        && last["step"] == step
        && last["hold"] == true
        && after.map_or(true, |a| r > a))
    .then_some(r)
}

/// `bft-run hosts --job JOB` as the job's owner, outside the job: its lines.
fn hosts_of(l: &Live, job: u32) -> String {
    let out =
        l.c.command_as_test_user(bft_run())
            .unwrap()
            .args(["hosts", "--job", &job.to_string()])
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "bft-run hosts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `bft-run hosts --job J` once it lists `n` hosts: it reads Slurm's view of the job's
/// satellites, which may lag the world the workers already formed by a poll (a
/// satellite preempted a moment ago still ending), so it is waited for, not sampled.
fn wait_hosts(l: &Live, job: u32, n: usize) -> String {
    l.wait(60, &format!("bft-run hosts to list {n} hosts"), || {
        let hosts = hosts_of(l, job);
        (hosts.lines().count() == n).then_some(hosts)
    })
}

/// A live cluster whose satellites run `bft-run --join` (bftrainerd running), and a
/// work directory of the test user's in it (its files shown if the test fails).
fn joining_cluster(name: &str) -> (Live, PathBuf, ShowOutput) {
    let bft = bft_run();
    let setup = live::setup_join(name, "", "", &|_| {
        format!("{} --join {{parent}}", bft.display())
    });
    let mut l = Live::from_setup(setup);
    l.spawn();
    let work = l.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    chown_to_test_user(&work);
    let show = ShowOutput(work.clone());
    (l, work, show)
}

fn chown_to_test_user(path: &Path) {
    assert!(Command::new("chown")
        .arg(bftrainer_testcluster::TEST_USER)
        .arg(path)
        .status()
        .unwrap()
        .success());
}

/// Submits, as the test user, an elastic job `1:4` whose batch script runs `bft-run
/// ARGS` with the virtualenv first on PATH, its output in `work/job.out`.
fn submit_bft_run_job(l: &Live, work: &Path, args: &str) -> u32 {
    submit_elastic_bft_run_job(l, work, "1:4", args)
}

/// A batch decision of `g` in core job `job`'s tag, written as root the way bftrainerd
/// writes its own (`batch_now`): these tests' scripts do not call
/// `bftrainer.report_progress`, so bftrainerd has no rate to decide from, and the test
/// stands in for it. The time bft-run takes to read it: waited for in `job.out`.
fn decide_batch(l: &Live, work: &Path, job: u32, g: u32) {
    let show =
        l.c.run("scontrol", &["show", "job", "-o", &job.to_string()])
            .unwrap();
    let tag = show.split(" AdminComment=").nth(1).unwrap();
    // The tag is two words ("bftrainer:v1 SPEC"); the next field follows.
    let tag = tag.split(' ').take(2).collect::<Vec<_>>().join(" ");
    let with = spec::with_batch_now(&tag, Some(g)).unwrap_or_else(|| panic!("{tag:?}"));
    l.c.run(
        "scontrol",
        &[
            "update",
            &format!("jobid={job}"),
            &format!("admincomment={with}"),
        ],
    )
    .unwrap();
    let line = format!("global batch decided by bftrainerd: {g}");
    l.wait(60, "bft-run to read the decided batch", || {
        job_out(work).contains(&line).then_some(())
    });
}

fn submit_elastic_bft_run_job(l: &Live, work: &Path, elastic: &str, args: &str) -> u32 {
    let script = work.join("train.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#SBATCH -J train\n#SBATCH -o {work}/job.out\n\
             export PATH={venv}/bin:$PATH\n\
             # Open MPI's daemons, several on this one machine: see tests/mpi.rs.\n\
             export OMPI_MCA_rtc_hwloc_vmhole=none\n\
             exec {bft} {args}\n",
            work = work.display(),
            venv = venv().display(),
            bft = bft_run().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    l.sbatch_as_user(
        &[&format!("--elastic={elastic}"), script.to_str().unwrap()],
        Some(work),
    )
}

#[test]
fn cluster_runtime_torchrun_script_through_grow_preemption_and_regrow() {
    venv();
    let (l, work, _show) = joining_cluster("bfttr");
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    chown_to_test_user(&logs);
    // The script steps only up to the number in this file: each change below lands at
    // a known step, whatever the machine's load.
    let limit = work.join("limit");
    let set_limit = |n: u64| std::fs::write(&limit, n.to_string()).unwrap();
    set_limit(20);
    let budget = 60;
    let job = submit_elastic_bft_run_job(
        &l,
        &work,
        "1:4,batch=8:64",
        &format!(
            "--mode torchrun --settle 2 --leave-timeout 20 -- \
             {repo}/wrappers/bft-run/tests/ddp_torchrun.py --ckpt {work}/ckpt.pt \
             --steps {budget} --log {logs} --limit-file {limit}",
            repo = repo().display(),
            work = work.display(),
            logs = logs.display(),
            limit = limit.display(),
        ),
    );

    // 1. Grows to 4 nodes: a world of 4 (one worker a node) at step 20.
    let r = l.wait(240, "a world of 4 at step 20", || {
        torchrun_holding(&logs, 4, 20, None)
    });
    let hosts = wait_hosts(&l, job, 4);
    assert!(hosts.lines().all(|h| h.ends_with(":1")), "{hosts}");
    set_limit(40);
    // A batch decision: the running world keeps its batch; the worlds started after
    // it get the decision (checked at the end).
    let t_batch = Instant::now();
    decide_batch(&l, &work, job, 32);
    eprintln!(
        "bft-run read the decided batch {:.1} s after it was written",
        t_batch.elapsed().as_secs_f64()
    );
    l.wait(120, "step 40 in the world of 4", || {
        torchrun_holding(&logs, 4, 40, Some(r - 1))
    });

    // 2. A regular job takes 2 nodes: 2 satellites are preempted (SIGTERM with
    //    GraceTime), the world is stopped and restarted on the 2 nodes left. The
    //    regular job runs until the test has seen that world (a 10 s job once ended,
    //    and the job was regrown, before the restarted world of 2 reached step 40 on
    //    a loaded machine).
    let reg = regular_holding(&l, 2);
    let r2 = l.wait(120, "a world of 2 at step 40", || {
        torchrun_holding(&logs, 2, 40, Some(r))
    });
    wait_hosts(&l, job, 2);

    // 3. The regular job ends; bftrainerd grows the job back to 4.
    l.c.run("scancel", &[&reg.to_string()]).unwrap();
    let r3 = l.wait(240, "a world of 4 at step 40 again", || {
        torchrun_holding(&logs, 4, 40, Some(r2))
    });
    wait_hosts(&l, job, 4);
    set_limit(budget);

    // 4. It finishes at the budget, learned, every step once.
    l.wait(300, "the elastic job to complete", || {
        let s = l.state_of(job);
        (!["RUNNING", "PENDING", "CONFIGURING", "COMPLETING"].contains(&s.as_str())).then_some(())
    });
    let text = job_out(&work);
    assert_eq!(l.state_of(job), "COMPLETED", "job output:\n{text}");
    assert!(comment(&l, job).is_some_and(|c| c.done), "{text}");
    let fin = text
        .lines()
        .find_map(|l| l.split_once("final step=").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no final line:\n{text}"));
    let (steps, loss) = fin.split_once(" loss=").unwrap();
    assert_eq!(steps.parse::<u64>().unwrap(), budget, "{text}");
    let loss: f64 = loss.trim().parse().unwrap();
    assert!(loss < 0.01, "loss {loss}:\n{text}");
    let progress = std::fs::read_to_string(logs.join("progress")).unwrap();
    let stepped: Vec<u64> = progress
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["hold"] == false)
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(stepped, (1..=budget).collect::<Vec<_>>(), "{progress}");

    // Every world: ranks 0..W, one worker per node, rank 0's address shared.
    let decided_in = r;
    let mut worlds: std::collections::BTreeMap<u64, Vec<serde_json::Value>> = Default::default();
    for e in std::fs::read_dir(&logs).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix("env-r")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let (r, _) = rest.split_once("-k").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
        worlds.entry(r.parse().unwrap()).or_default().push(v);
    }
    let n = |v: &serde_json::Value, k: &str| -> u64 {
        v[k].as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let mut sizes = Vec::new();
    for (r, ranks) in &worlds {
        let w = n(&ranks[0], "WORLD_SIZE");
        let mut seen: Vec<u64> = ranks.iter().map(|v| n(v, "RANK")).collect();
        seen.sort();
        assert_eq!(seen, (0..w).collect::<Vec<_>>(), "restart {r}: {ranks:?}");
        for v in ranks {
            assert_eq!(n(v, "WORLD_SIZE"), w, "{v}");
            assert_eq!(n(v, "TORCHELASTIC_RESTART_COUNT"), *r, "{v}");
            assert_eq!(
                (n(v, "LOCAL_RANK"), n(v, "LOCAL_WORLD_SIZE")),
                (0, 1),
                "{v}"
            );
            assert_eq!(n(v, "GROUP_RANK"), n(v, "RANK"), "{v}");
            assert_eq!(v["MASTER_ADDR"], ranks[0]["MASTER_ADDR"], "{v}");
            assert_eq!(v["MASTER_PORT"], ranks[0]["MASTER_PORT"], "{v}");
            assert_eq!(v["TORCHELASTIC_RUN_ID"], job.to_string(), "{v}");
            assert!(
                v["GLOO_SOCKET_IFNAME"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{v}"
            );
            // The decided batch: in every world started after it, in none before.
            let batch = if *r > decided_in { "32" } else { "" };
            assert_eq!(v["BFT_GLOBAL_BATCH"].as_str().unwrap_or(""), batch, "{v}");
        }
        sizes.push(w);
    }
    assert_eq!(sizes.last(), Some(&4), "{sizes:?}");
    assert!(sizes.contains(&2), "{sizes:?}");
    assert!(r3 > r2 && r2 > r, "{sizes:?}");
    eprintln!("worlds by restart: {sizes:?}");
    for l in text
        .lines()
        .filter(|l| l.contains("generation") || l.contains("leaves"))
    {
        eprintln!("{l}");
    }
}

/// The last line of tests/mpi_sum.py's log (rank 0's): a world of `world` holding at
/// `step`, started after the line numbered `after`; its line number.
fn mpi_holding(log: &Path, world: u64, step: u64, after: Option<usize>) -> Option<usize> {
    let text = std::fs::read_to_string(log).ok()?;
    let n = text.lines().count();
    let last: serde_json::Value = serde_json::from_str(text.lines().last()?).ok()?;
    (last["world"] == world
        && last["step"] == step
        && last["hold"] == true
        && after.map_or(true, |a| n > a))
    .then_some(n)
}

/// MPI mode on the real cluster under bftrainerd: an mpi4py program (an allreduced
/// sum, checkpointed on SIGUSR1) grows onto satellites, loses two to a regular job's
/// preemption, grows back and finishes with the exact sum, every step once, its
/// remote ranks started by `bft-run rsh` inside the satellites' allocations.
#[test]
fn cluster_runtime_mpi_program_through_grow_preemption_and_regrow() {
    let py = venv().join("bin/python");
    let mpi = Command::new(&py)
        .args(["-c", "import mpi4py"])
        .status()
        .is_ok_and(|s| s.success());
    let mpirun = Command::new("mpirun").arg("--version").output().is_ok();
    if let (false, Ok(release)) = (mpirun, std::env::var("BFT_SLURM_ROOT_VERSION")) {
        // The Debian roots of other Slurm releases (scripts/slurm-root) carry Slurm, not
        // Open MPI: MPI mode's live test runs on the host's Slurm; its local tests
        // (wrappers/bft-run/tests/mpi.rs) do not depend on the release.
        eprintln!(
            "SKIPPED: no mpirun in the Slurm {release} root; MPI mode is tested live on the host's Slurm"
        );
        return;
    }
    assert!(
        mpi && mpirun,
        "MPI mode's test needs mpirun (scripts/install-deps: openmpi-bin) and mpi4py \
         (scripts/python-env)"
    );
    let (l, work, _show) = joining_cluster("bftmpi");
    let limit = work.join("limit");
    let set_limit = |n: u64| std::fs::write(&limit, n.to_string()).unwrap();
    set_limit(10);
    let log = work.join("mpi.log");
    let budget = 30;
    let job = submit_elastic_bft_run_job(
        &l,
        &work,
        "1:4,batch=8:64",
        &format!(
            "--mode mpi --settle 2 --leave-timeout 20 -- \
             python {repo}/wrappers/bft-run/tests/mpi_sum.py --ckpt {work}/ckpt.json \
             --steps {budget} --log {log} --limit-file {limit}",
            repo = repo().display(),
            work = work.display(),
            log = log.display(),
            limit = limit.display(),
        ),
    );

    // 1. Grows to 4 nodes: a world of 4 ranks (one a node) holding at step 10.
    let a = l.wait(240, "a world of 4 at step 10", || {
        mpi_holding(&log, 4, 10, None)
    });
    wait_hosts(&l, job, 4);
    set_limit(20);
    // A batch decision: the worlds started after it get it, on every rank (remote
    // ranks through mpirun's -x); checked at the end.
    let t_batch = Instant::now();
    decide_batch(&l, &work, job, 32);
    eprintln!(
        "bft-run read the decided batch {:.1} s after it was written",
        t_batch.elapsed().as_secs_f64()
    );
    let decided_at = std::fs::read_to_string(&log).unwrap().lines().count();
    let b = l.wait(120, "step 20 in the world of 4", || {
        mpi_holding(&log, 4, 20, Some(a))
    });

    // 2. A regular job takes 2 nodes: the world is stopped and restarted on 2. It
    //    runs until the test has seen that world (then it is cancelled).
    let reg = regular_holding(&l, 2);
    let c = l.wait(120, "a world of 2 at step 20", || {
        mpi_holding(&log, 2, 20, Some(b))
    });
    wait_hosts(&l, job, 2);

    // 3. The regular job ends; the job grows back to 4 and finishes.
    l.c.run("scancel", &[&reg.to_string()]).unwrap();
    l.wait(240, "a world of 4 at step 20 again", || {
        mpi_holding(&log, 4, 20, Some(c))
    });
    set_limit(budget);
    l.wait(300, "the elastic job to complete", || {
        let s = l.state_of(job);
        (!["RUNNING", "PENDING", "CONFIGURING", "COMPLETING"].contains(&s.as_str())).then_some(())
    });
    let text = job_out(&work);
    assert_eq!(l.state_of(job), "COMPLETED", "job output:\n{text}");
    let want = budget * (budget + 1) / 2;
    assert!(
        text.contains(&format!("final steps={budget} total={want}")),
        "job output:\n{text}"
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    let stepped: Vec<u64> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["hold"] == false)
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(stepped, (1..=budget).collect::<Vec<_>>(), "{lines}");
    let hosts: std::collections::BTreeSet<String> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["start"] == true)
        .map(|v| format!("{}@{}", v["world"], v["host"]))
        .collect();
    eprintln!("worlds started: {hosts:?}");
    // Every world started after the decision ran every rank with it; none before.
    let starts: Vec<(usize, serde_json::Value)> = lines
        .lines()
        .enumerate()
        .filter_map(|(i, l)| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .map(|v| (i, v))
        })
        .filter(|(_, v)| v["start"] == true)
        .collect();
    assert!(starts.iter().any(|(i, _)| *i >= decided_at), "{lines}");
    for (i, v) in &starts {
        let ranks = v["batch"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(ranks.len() as u64, v["world"].as_u64().unwrap(), "{v}");
        let want = if *i >= decided_at {
            serde_json::json!("32")
        } else {
            serde_json::Value::Null
        };
        assert!(ranks.iter().all(|b| *b == want), "line {i}: {v}");
        // Each rank has its own node's agent's BFT_PROGRESS_FILE (bftrainer.report_progress
        // writes rank 0's there, whichever node it runs on). One rank a node: as many
        // files as ranks.
        let files: std::collections::BTreeSet<&str> = v["progress_file"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|f| f.as_str().unwrap_or_else(|| panic!("line {i}: {v}")))
            .collect();
        assert_eq!(
            files.len() as u64,
            v["world"].as_u64().unwrap(),
            "line {i}: {v}"
        );
    }
}

/// A core job that Slurm requeues while bftrainerd is down, and then starts again by
/// itself once its BeginTime passes (no plugin is called on a requeue), does not train
/// where Slurm put it: the batch step finds no admission for this run in the Comment
/// and requeues the job held with its note (spank/bftrainer, before bft-run starts; a
/// node without the plugin leaves it to bft-run, which makes the same check), and
/// bftrainerd, back, admits it again (not taking it for a site's `scontrol
/// requeuehold`), after which bft-run runs the training. A plain script's core:
/// cluster_daemon.rs.
#[test]
fn cluster_runtime_core_requeued_while_the_daemon_is_down_waits_for_its_admission() {
    let (mut l, work, _show) = joining_cluster("bftua");
    let job = submit_bft_run_job(&l, &work, "--mode torchrun -- sleep 600");
    let show = |l: &Live| {
        l.c.run("scontrol", &["show", "job", &job.to_string()])
            .unwrap()
    };
    let admissions = |l: &Live| {
        l.log_text()
            .matches(&format!("admit job {job} (user"))
            .count()
    };
    // Admitted and running: bft-run found the admission note and replaced it.
    let first = l.wait(120, "bft-run's Comment on the running job", || {
        comment(&l, job).filter(|c| c.start != 0)
    });
    assert_eq!(admissions(&l), 1, "{}", l.log_text());
    assert!(
        !job_out(&work).contains("without bftrainerd's admission"),
        "{}",
        job_out(&work)
    );

    // bftrainerd down; Slurm requeues the core (as after a node failure, or an
    // administrator's requeue) and starts it again by itself.
    l.kill9();
    l.c.run("scontrol", &["requeue", &job.to_string()]).unwrap();
    l.wait(300, "the start Slurm made by itself requeued held", || {
        let f = show(&l);
        (f.contains("JobState=PENDING")
            && f.contains("Priority=0 ")
            && f.contains("Comment=bftrainer: started without bftrainerd's admission (run 1"))
        .then_some(())
    });
    // Said by the plugin, before bft-run started: bft-run never ran for run 1. The line
    // is written just after the requeue: waited for, not read once.
    let said = format!(
        "spank/bftrainer: job {job} was started by Slurm without bftrainerd's admission (run 1)"
    );
    l.wait(60, "the gate's line in the job's output", || {
        job_out(&work).contains(&said).then_some(())
    });
    let out = job_out(&work);
    assert!(
        !out.contains(&format!("bft-run: job {job} was started by Slurm")),
        "{out}"
    );

    // bftrainerd back: admitted again, once, and bft-run trains.
    l.spawn();
    let again = l.wait(300, "bft-run running the admitted start", || {
        comment(&l, job).filter(|c| c.start != 0 && c.start != first.start)
    });
    assert!(again.start > first.start, "{again:?} {first:?}");
    let log = l.log_text();
    assert_eq!(admissions(&l), 2, "{log}");
    // Restarted, bftrainerd adopts the job as it finds it (held, waiting to be
    // admitted), not as a requeue with hold by someone, which it would not admit.
    assert!(
        !log.contains(&format!("elastic job {job} came back held")),
        "{log}"
    );
    let f = show(&l);
    assert!(
        f.contains("JobState=RUNNING") && f.contains("Restarts=2"),
        "{f}"
    );
}

#[test]
fn cluster_runtime_job_is_kept_by_a_second_daemon_an_empty_journal_and_an_ha_takeover() {
    // A bft-run job grown to 4 nodes (its satellites run `bft-run --join`), its core off n1 (a fresh engine's first pick, which
    // requeued it before adoption). Then, each while it runs: (1) a second daemon
    // with another state_dir; (2) a restart on an empty journal; (3) an HA pair under
    // one lease, its active daemon killed -9. The job's Restarts stay 0 and its
    // satellites are the same jobs throughout.
    let (mut l, work, _show) = joining_cluster("bftha");
    let blocker = l.regular(1, 600);
    l.wait(60, "a regular job on one node", || {
        (l.state_of(blocker) == "RUNNING").then_some(())
    });
    let job = submit_bft_run_job(&l, &work, "--mode torchrun -- sleep 600");
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
    // 10 s: the active daemon gives its term up when a cycle leaves it unrenewed for
    // two thirds of the lease, and a loaded 2-core CI machine running two clusters can
    // stall a cycle for seconds (3 s was measured too, docs/benchmarks.md).
    let lease = format!("lease_dir = \"{}\"\nlease = 10", lease_dir.display());
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
        err.contains("Lease: term 1 held by") && err.contains("(valid, lease 10 s)"),
        "{err}"
    );
    same(&l, job, &sats, "an HA pair");
    active.stop(libc::SIGKILL);
    let t0 = std::time::Instant::now();
    l.wait(60, "the standby's first cycle", || {
        (standby.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 1).then_some(())
    });
    let took = t0.elapsed().as_secs_f64();
    println!("HA takeover: {took:.2} s from kill -9 to the standby's first cycle (lease 10 s, poll 0.5 s)");
    l.wait(30, "ten cycles of the new active daemon", || {
        (standby.status(&l)["stats"]["cycles"].as_u64().unwrap_or(0) >= 10).then_some(())
    });
    same(&l, job, &sats, "an HA takeover");
    let st = standby.status(&l);
    assert_eq!(st["stats"]["requeues"], 0, "{st:#}");
    assert!(standby.log_text().contains("won term 2"));
}
