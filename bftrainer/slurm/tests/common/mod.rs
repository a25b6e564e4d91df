//! Shared helpers of the cluster tests: bring up a cluster (one per test process, as
//! libslurm reads one slurm.conf per process), and wait for conditions with a deadline.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bftrainer_slurm::{Job, JobBase, Slurm};
use bftrainer_testcluster::{Cluster, Options};

/// A running test cluster (the `bftrainer-testcluster` fixture: stopped on drop, logs
/// kept under target/cluster-logs/ if the test panicked) with libslurm pointed at it.
pub struct TestCluster {
    pub cluster: Cluster,
    pub slurm: Slurm,
}

impl TestCluster {
    /// Starts a 4-node cluster and initialises libslurm on it. One per test process:
    /// libslurm reads one slurm.conf per process, so each cluster test is the only
    /// test of its binary.
    pub fn start() -> TestCluster {
        let cluster = Cluster::start(Options {
            nodes: 4,
            ..Default::default()
        })
        .expect("start a test cluster");
        let slurm =
            Slurm::init_with_config(cluster.slurm_conf()).expect("slurm_init on the test cluster");
        TestCluster { cluster, slurm }
    }

    pub fn dir(&self) -> &Path {
        self.cluster.dir()
    }

    /// A directory every user may write to.
    pub fn work_dir(&self) -> PathBuf {
        self.cluster.work_dir()
    }

    /// A Slurm command-line tool with this cluster's SLURM_CONF.
    pub fn command(&self, tool: &str) -> Command {
        self.cluster.command(tool)
    }
}

/// How much longer than its nominal `secs` a wait may last before it fails: `secs` is
/// what the condition takes on a quiet machine, and a 2-core CI machine running two
/// clusters (slurmdbd's agent among them) can take several times that. Only a failing
/// wait pays for the margin.
const DEADLINE_SCALE: u64 = 4;

/// Polls `f` every 200 ms until it returns Some, or panics after `DEADLINE_SCALE * secs`
/// naming `what`.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let secs = secs * DEADLINE_SCALE;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the job reaches `base` and returns its record.
pub fn wait_state(slurm: &Slurm, job_id: u32, base: JobBase, secs: u64) -> Job {
    let what = format!("job {job_id} to reach {base:?}");
    wait_for(secs, &what, || {
        let j = slurm.load_job(job_id).ok()?;
        assert!(
            j.state.is_active() || j.state.base() == base,
            "job {job_id} ended {} ({:?}) while waiting for {base:?}",
            j.state.name(),
            j.reason
        );
        (j.state.base() == base && !j.state.is_completing()).then_some(j)
    })
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub const SLEEP_SCRIPT: &str = "#!/bin/sh\nsleep 600\n";
