//! Submitting a job on behalf of another user, as root may: the job runs as that
//! user, with the environment we gave it.

mod common;

use bftrainer_slurm::{BatchJob, JobBase};
use common::{wait_state, TestCluster};

#[test]
fn cluster_jobs_submit_on_behalf_of_another_user() {
    let c = TestCluster::start();
    let s = c.slurm;
    let (uid, gid) = bftrainer_testcluster::user_ids(bftrainer_testcluster::TEST_USER).unwrap();
    // The job writes its output as bftuser, so into the world-writable work dir.
    let out = c.work_dir().join("behalf.out");
    let sub = s
        .submit_batch(&BatchJob {
            script: "#!/bin/sh\nid -un\necho \"$BFT_GREETING\"\n".into(),
            name: Some("behalf".into()),
            run_as: Some((uid, gid)),
            work_dir: Some("/tmp".into()),
            output: Some(out.to_str().unwrap().into()),
            env: vec![
                ("BFT_GREETING".into(), "hello".into()),
                ("PATH".into(), "/usr/bin:/bin".into()),
            ],
            ..Default::default()
        })
        .unwrap();
    let j = wait_state(&s, sub.job_id, JobBase::Complete, 60);
    assert_eq!(j.user_id, uid);
    assert_eq!(j.group_id, gid);
    assert_eq!(j.user_name.as_deref(), Some("bftuser"));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text, "bftuser\nhello\n");

    // Slurm's own tools see it as bftuser's job too.
    let q = c
        .command("squeue")
        .args(["-h", "-t", "all", "-o", "%u", "-j"])
        .arg(sub.job_id.to_string())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&q.stdout).trim(), "bftuser");

    // The other direction: bftuser may not submit as root (slurmctld answers
    // ESLURM_USER_ID_MISSING, "Invalid user id"). This test binary runs
    // itself as bftuser (the ignored test below) and reports what Slurm said.
    use std::os::unix::process::CommandExt;
    // Run a copy from the cluster's work dir: bftuser may not reach the build tree
    // (a checkout under /root, mode 0700, is the usual case on a CI machine).
    let exe = c.work_dir().join("behalf-child");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    let child = std::process::Command::new(&exe)
        .args(["--ignored", "--exact", "--nocapture", CHILD])
        .env(CHILD_ENV, c.cluster.slurm_conf())
        .current_dir(c.work_dir())
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(
        text.contains("CHILD-REFUSED:"),
        "child did not run:\n{text}"
    );
    assert!(
        text.contains("Invalid user id (Slurm error 2010)"),
        "{text}"
    );
}

const CHILD: &str = "cluster_behalf_child_as_test_user";
const CHILD_ENV: &str = "BFT_CHILD_SLURM_CONF";

/// Run by the test above as bftuser: submitting as root must be refused by slurmctld.
/// Does nothing when run on its own.
#[test]
#[ignore]
fn cluster_behalf_child_as_test_user() {
    let Some(conf) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let s = bftrainer_slurm::Slurm::init_with_config(std::path::Path::new(&conf)).unwrap();
    let e = s
        .submit_batch(&BatchJob {
            script: "#!/bin/sh\ntrue\n".into(),
            run_as: Some((0, 0)),
            work_dir: Some("/tmp".into()),
            output: Some("/dev/null".into()),
            ..Default::default()
        })
        .unwrap_err();
    println!("CHILD-REFUSED: {e}");
}
