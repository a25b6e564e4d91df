//! Shared helpers of the cluster tests: bring up a cluster (one per test process, as
//! libslurm reads one slurm.conf per process), and wait for conditions with a deadline.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bftrainer_slurm::{Job, JobBase, Slurm};

/// A running test cluster, stopped on drop; its logs are kept if the test panicked.
pub struct TestCluster {
    dir: PathBuf,
    script: PathBuf,
    pub slurm: Slurm,
}

impl TestCluster {
    /// Starts a 4-node cluster under a fresh directory and initialises libslurm on it.
    pub fn start(test: &str) -> TestCluster {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let script = repo.join("tests/cluster/cluster");
        let dir = std::env::temp_dir().join(format!("bft-{test}-{}", std::process::id()));
        let out = Command::new(&script)
            .args(["up", "--nodes", "4", "--dir"])
            .arg(&dir)
            .output()
            .expect("run tests/cluster/cluster");
        assert!(
            out.status.success(),
            "cluster up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = dir.join("etc/slurm.conf");
        // The only thread that touches the environment at this point.
        std::env::set_var("SLURM_CONF", &conf);
        let slurm = Slurm::init().expect("slurm_init on the test cluster");
        TestCluster { dir, script, slurm }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A Slurm command-line tool with this cluster's SLURM_CONF.
    pub fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.env("SLURM_CONF", self.dir.join("etc/slurm.conf"));
        c
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let mut cmd = Command::new(&self.script);
        cmd.args(["down", "--dir"]).arg(&self.dir);
        if !std::thread::panicking() {
            cmd.arg("--purge");
        } else {
            eprintln!(
                "test failed: cluster logs kept in {}",
                self.dir.join("log").display()
            );
        }
        let _ = cmd.output();
    }
}

/// Polls `f` every 200 ms until it returns Some, or panics after `secs` naming `what`.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
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

/// uid and gid of a local user.
pub fn ids_of(user: &str) -> (u32, u32) {
    let out = Command::new("id").args(["-u", user]).output().unwrap();
    let uid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("uid");
    let out = Command::new("id").args(["-g", user]).output().unwrap();
    let gid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("gid");
    (uid, gid)
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub const SLEEP_SCRIPT: &str = "#!/bin/sh\nsleep 600\n";
