//! bft-run in real Slurm jobs on nodes with stand-in GPUs: each node of the test
//! cluster gets GRES `gpu:4` backed by four character devices (like /dev/null) in the
//! cluster's directory (`cluster up --gpus 4`), so that Slurm allocates them and sets CUDA_VISIBLE_DEVICES as
//! on a GPU cluster. The core job's agents' step must see every GPU the job holds on
//! each node (as its batch script does), whatever the job asked and inherits, and start
//! one worker per GPU, each seeing all of them with its own LOCAL_RANK. The workers are
//! the stand-in of tests/worker.py (no torch).

use bftrainer_testcluster::{Cluster, Options};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const BFT: &str = env!("CARGO_BIN_EXE_bft-run");
const WORKER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/worker.py");
const GPUS: usize = 4;

/// A cluster of `nodes` nodes with `gpu:4` each (`cluster up --gpus 4`; the
/// partitions are exclusive, so a job holds all four GPUs of its nodes whatever it
/// asked).
fn gpu_cluster(nodes: usize) -> Cluster {
    Cluster::start(Options {
        nodes,
        gpus: Some(GPUS.to_string()),
        ..Default::default()
    })
    .unwrap()
}

/// Submits `bft-run -- python3 worker.py` with `args` and `env` (`--export`), waits
/// for it to end; returns its state, its output and the workers' logs by worker id.
fn run_job(
    c: &Cluster,
    dir: &Path,
    args: &[&str],
    env: &str,
) -> (String, String, BTreeMap<String, String>) {
    let logs = dir.join("workers");
    std::fs::create_dir_all(&logs).unwrap();
    let out = dir.join("job.out");
    let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    a.extend([
        "-o".into(),
        out.to_string_lossy().into_owned(),
        format!(
            "--export=ALL,TEST_DIR={},TEST_FINISH_AT=1,{env}",
            logs.display()
        ),
        "--wrap".into(),
        format!("exec {BFT} -- python3 {WORKER}"),
    ]);
    let job = c.sbatch(&a).unwrap();
    let state = c
        .wait_for_state(
            job,
            &["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"],
            Duration::from_secs(120),
        )
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let workers = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    (state, text, workers)
}

/// Each worker of each node: all of the node's GPUs, its slot as LOCAL_RANK.
fn check_workers(workers: &BTreeMap<String, String>, agents: usize, all: &str) {
    assert_eq!(workers.len(), agents * GPUS, "{workers:?}\n{all}");
    for agent in 1..=agents {
        for slot in 0..GPUS {
            let id = format!("{agent}.{slot}");
            let want = format!(
                "start local_rank={slot} cuda=0,1,2,3 LOCAL_RANK={slot} LOCAL_WORLD_SIZE={GPUS}\n"
            );
            assert!(
                workers.get(&id).is_some_and(|l| l.contains(&want)),
                "{id}: want {want:?} in {workers:?}\n{all}"
            );
        }
    }
}

#[test]
fn cluster_gpu_job_starts_one_worker_per_gpu_the_job_holds_on_each_node() {
    let c = gpu_cluster(2);
    let tmp = tempfile::tempdir().unwrap();
    // Two tasks per node asked by the user (the agents' step must still be one task
    // per node), 2 GPUs per node asked, 4 held (exclusive nodes), as the batch script
    // sees them.
    let (state, all, workers) = run_job(
        &c,
        tmp.path(),
        &["-N2", "--gpus-per-node=2", "--ntasks-per-node=2"],
        "TEST_FINISH_SIZE=8",
    );
    assert_eq!(state, "COMPLETED", "{all}\n{workers:?}");
    assert!(all.contains("generation 1: 8 workers on 2 nodes"), "{all}");
    check_workers(&workers, 2, &all);
}

#[test]
fn cluster_gpu_job_steps_ignore_inherited_variables_that_narrow_the_gpus() {
    let c = gpu_cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    // GPUs asked per task, and SLURM_STEP_GRES=none in the job's environment: srun
    // would give the agents' step one GPU, or none.
    let (state, all, workers) = run_job(
        &c,
        tmp.path(),
        &[
            "-N1",
            "--gpus-per-task=1",
            "--ntasks-per-node=2",
            "--gpu-bind=single:1",
        ],
        "SLURM_STEP_GRES=none,TEST_FINISH_SIZE=4",
    );
    assert_eq!(state, "COMPLETED", "{all}\n{workers:?}");
    assert!(all.contains("generation 1: 4 workers on 1 nodes"), "{all}");
    check_workers(&workers, 1, &all);
}
