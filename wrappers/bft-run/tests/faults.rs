//! The failure matrix of the elastic runtime (issue 19), with real torch workers (gloo
//! on CPU) under `bft-run --local` and a private munged: tests/faults.py sends
//! SIGKILL, SIGSTOP or SIGTERM to a member of rank >= 1, to rank 0 and to a newcomer,
//! in the middle of a step, of a rebuild and of a state transfer, one fault after the
//! other, and checks that the job finishes with every sample used exactly once per
//! epoch, that no healthy worker was killed and that each fault was noticed within its
//! bound. At 0.05 s steps every signal meets every target in every phase (27 faults);
//! at 5 s steps each signal meets each target once and each phase once (9 faults).
//!
//! The SIGKILL matrix at 0.05 s trains with a fixed global batch and checks that every
//! step's loss equals that of the same training run alone; the SIGTERM one and the
//! SIGKILL one at 5 s steps read their samples through a DataLoader with worker
//! processes (issue 32).
//!
//! It needs the virtualenv with torch (`BFT_VENV`, default /opt/bftrainer-venv, made by
//! scripts/python-env, as `make test` does) and munged.

use std::path::PathBuf;
use std::process::Command;

const ALL: &[&str] = &[
    "worker:step",
    "worker:rebuild",
    "worker:transfer",
    "rank0:step",
    "rank0:rebuild",
    "rank0:transfer",
    "newcomer:step",
    "newcomer:rebuild",
    "newcomer:transfer",
];

fn matrix(step: &str, signal: &str, plan: &[&str]) {
    run_matrix(step, signal, plan, &[]);
}

/// The matrix with faults.py's options in `env`: FAULTS_GLOBAL_BATCH=G (a fixed global
/// batch; the per-step losses must then equal those of the same training run alone),
/// FAULTS_DATALOADER=1 (samples read from a file through a DataLoader with workers).
fn run_matrix(step: &str, signal: &str, plan: &[&str], env: &[(&str, &str)]) {
    let venv =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: make it with scripts/python-env (make test does)",
        python.display()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/faults.py");
    let o = Command::new(&python)
        .envs(env.iter().copied())
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_bft-run"))
        .args([step, signal])
        .args(plan)
        .env_remove("SLURM_JOB_ID")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.contains("MATRIX OK"),
        "the failure matrix failed ({step} s steps, SIG{signal}):\n{out}"
    );
    for l in out.lines().filter(|l| {
        l.starts_with("FAULT ") || l.starts_with("samples ok") || l.starts_with("losses as")
    }) {
        eprintln!("{l}");
    }
}

/// Also the reproducibility check of a fixed global batch: joins, graceful leaves of
/// the extra agents, nine kills and their rollbacks, and every step's loss against a
/// run alone.
#[test]
fn faults_at_50ms_steps_sigkill() {
    run_matrix("0.05", "KILL", ALL, &[("FAULTS_GLOBAL_BATCH", "32")]);
}

#[test]
fn faults_at_50ms_steps_sigstop() {
    matrix("0.05", "STOP", ALL);
}

/// The job reads its samples from a file through a DataLoader with prefetching worker
/// processes: nine graceful leaves and as many joins, every sample once.
#[test]
fn faults_at_50ms_steps_sigterm() {
    run_matrix("0.05", "TERM", ALL, &[("FAULTS_DATALOADER", "1")]);
}

/// Through a DataLoader too: three kills and their rollbacks discard what the loader
/// processes had prefetched.
#[test]
fn faults_at_5s_steps_sigkill() {
    run_matrix(
        "5",
        "KILL",
        &["worker:step", "rank0:rebuild", "newcomer:transfer"],
        &[("FAULTS_DATALOADER", "1")],
    );
}

#[test]
fn faults_at_5s_steps_sigstop() {
    matrix(
        "5",
        "STOP",
        &["rank0:step", "newcomer:rebuild", "worker:transfer"],
    );
}

#[test]
fn faults_at_5s_steps_sigterm() {
    matrix(
        "5",
        "TERM",
        &["newcomer:step", "worker:rebuild", "rank0:transfer"],
    );
}

// bftrainer.DistributedDataParallel (torch's DDP, no_sync() accumulation over 2
// micro-batches): a worker killed -9 in the middle of backward (its first bucket's
// reduction), a newcomer killed in its first step; each kill is followed by a join
// (the agent restarts the worker).
#[test]
fn ddp_faults_sigkill() {
    run_matrix(
        "0.05",
        "KILL",
        &["worker:step", "newcomer:step"],
        &[("FAULTS_DDP", "1")],
    );
}

// A member leaves on SIGTERM mid-step (graceful: at the step boundary), and a
// newcomer joins in its place.
#[test]
fn ddp_faults_sigterm() {
    run_matrix("0.05", "TERM", &["worker:step"], &[("FAULTS_DDP", "1")]);
}

// FSDP2 HSDP (tests/hsdp.py): `fully_shard(..., mesh=bftrainer.device_mesh())` under
// `--local 2 --nproc-per-node 2`; a third node joins, leaves on SIGTERM, and a worker
// is killed -9 in backward (its replacement takes its shards from a live replica).
// Every sample once; the final loss as a static run's.
#[test]
fn hsdp_faults() {
    let out = run_driver("hsdp.py", &[], "HSDP OK", "the HSDP matrix failed");
    for l in out.lines() {
        eprintln!("{l}");
    }
}

/// Runs the Python driver `script` (tests/) on this bft-run, outside any Slurm job;
/// asserts that it succeeds and prints `ok` (else panics with `failed` and its output);
/// returns its output.
fn run_driver(script: &str, args: &[&str], ok: &str, failed: &str) -> String {
    let venv =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let o = Command::new(venv.join("bin/python"))
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join(script),
        )
        .arg(env!("CARGO_BIN_EXE_bft-run"))
        .args(args)
        .env_remove("SLURM_JOB_ID")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && out.contains(ok), "{failed}:\n{out}");
    out
}

/// A global batch decided mid-run (issue 32): 32 -> 64 -> 48 through `--batch-file`,
/// lr=linear, a worker killed -9 after the first change (tests/batch_change.py): every
/// sample once, each step of the committed lineage at the batch in force, with its
/// learning rate, switched at one step for all ranks.
#[test]
fn batch_changes_at_a_step_boundary() {
    batch_change(&[]);
}

/// The same through `bftrainer.DistributedDataParallel` (torch's DDP, its reduction
/// weighted by each rank's samples, which the batch change moves), two micro-batches per
/// step under `no_sync()`.
#[test]
fn batch_changes_at_a_step_boundary_under_ddp() {
    batch_change(&["--ddp", "--accum", "2"]);
}

fn batch_change(args: &[&str]) {
    let out = run_driver(
        "batch_change.py",
        args,
        "BATCH OK",
        "the batch change failed",
    );
    for l in out
        .lines()
        .filter(|l| l.starts_with("samples ok") || l.starts_with("batches"))
    {
        eprintln!("{l}");
    }
}
