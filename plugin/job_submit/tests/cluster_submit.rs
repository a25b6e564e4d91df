//! job_submit/bftrainer and spank/bftrainer on a real Slurm 22.05 cluster: every bad
//! input of issue 3 through real sbatch, the happy path, job_modify guards, the task
//! environment, `scontrol reconfigure`, and plain jobs left untouched field for field.
//!
//! Needs root and the built plugins (`cargo build -p job_submit_bftrainer -p spank_bftrainer`).

mod support;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::Duration;

use bftrainer_testcluster::{wait_until, Cluster, Options};

const POLICY: &str = "[policy]\npartition = \"elastic\"\nmax_nodes = 4\ndaemon_user = \"root\"\n";

/// A cluster with the plugins and POLICY plus `extra` lines of `[policy]`.
fn elastic_cluster_with(tmp: &Path, extra: &str) -> Cluster {
    let plugins = support::stage_plugins(&tmp.join("plugins"));
    let conf = tmp.join("bftrainer.toml");
    std::fs::write(&conf, format!("{POLICY}{extra}")).unwrap();
    Cluster::start(Options {
        nodes: 4,
        plugins: Some(plugins),
        bftrainer_conf: Some(conf),
        ..Default::default()
    })
    .expect("cluster with the bftrainer plugins")
}

/// Runs sbatch as the unprivileged test user; (exit code, stderr).
fn sbatch_as_user(c: &Cluster, args: &[OsString]) -> (i32, String, String) {
    let out = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args(args)
        .output()
        .expect("run sbatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_controller_up(c: &Cluster) {
    let ping = c.run("scontrol", &["ping"]).expect("scontrol ping");
    assert!(ping.contains("is UP"), "slurmctld is not up: {ping}");
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

fn ctld_log(c: &Cluster) -> String {
    std::fs::read_to_string(c.log_dir().join("slurmctld.log")).unwrap_or_default()
}

/// Waits until slurmctld's log satisfies `pred` (the plugin's watcher thread applies a
/// reconfigure within a second of it, outside the hooks).
fn wait_for_log(c: &Cluster, what: &str, pred: impl Fn(&str) -> bool) {
    wait_until(what, Duration::from_secs(30), || {
        Ok(pred(&ctld_log(c)).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Whether the cluster's Slurm hands job_modify's err_msg to the user (23.02 and later).
fn modify_says_why(c: &Cluster) -> bool {
    let v = c.slurm_version().expect("slurm version");
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (23, 2)
}

/// `scontrol ARGS` as bftuser: (success, stderr).
fn scontrol_as_user(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = c
        .command_as_test_user("scontrol")
        .unwrap()
        .args(args)
        .output()
        .expect("run scontrol");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cluster_bad_inputs_are_rejected_with_clear_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let c = elastic_cluster_with(tmp.path(), "satellite_partition = \"elastic-sat\"\n");
    let wrap = os("--wrap=true");
    let el = |v: &str| os(&format!("--elastic={v}"));
    let mut non_utf8 = b"--elastic=2:".to_vec();
    non_utf8.extend_from_slice(&[0xff, 0xfe]);
    let huge = format!("--elastic={}", "1".repeat(100 * 1024));

    // (what, sbatch arguments, text that must appear on stderr)
    let table: Vec<(&str, Vec<OsString>, &str)> = vec![
        ("empty value", vec![el("")], "--elastic=: the value is empty"),
        ("zero", vec![el("0")], "--elastic=0: MIN (0) must be at least 1; expected --elastic=MIN[:MAX] with 1 <= MIN <= MAX"),
        ("negative", vec![el("-2:4")], "--elastic=-2:4: MIN (-2) is negative"),
        ("MIN > MAX", vec![el("8:2")], "--elastic=8:2: MAX (2) is smaller than MIN (8); expected --elastic=MIN[:MAX] with 1 <= MIN <= MAX"),
        ("past 2^32", vec![el("1:4294967296")], "MAX (4294967296) is too large; the most is 4294967295"),
        ("non-numeric", vec![el("two:four")], "MIN (two) is not a whole number"),
        ("unknown key", vec![el("2:4,speed=3")], "unknown key 'speed'; known keys: up, down, profile, batch, lr, role, parent"),
        ("batch MIN > MAX", vec![el("1:4,batch=4096:256")], "batch=4096:256: MIN (4096) is larger than MAX (256)"),
        ("batch past its bound", vec![el("1:4,batch=1:99999999")], "batch=1:99999999: expected batch=MIN:MAX (or batch=G), whole numbers of samples per step with 1 <= MIN <= MAX <= 16777216"),
        ("unknown lr rule", vec![el("1:4,batch=64:512,lr=cubic")], "lr=cubic: expected lr=linear, lr=sqrt or lr=none"),
        ("lr without batch", vec![el("1:4,lr=linear")], "lr= needs batch=MIN:MAX"),
        ("the daemon's batch_now", vec![el("1:4,batch=64:512,batch_now=512")], "unknown key 'batch_now'"),
        ("duplicate key", vec![el("2:4,up=10,up=20")], "key 'up' is given twice"),
        ("bad key value", vec![el("2:4,profile=../../etc/passwd")], "expected a profile name"),
        ("MAX over the admin's limit", vec![el("2:64")], "--elastic=2:64: MAX (64) is over this cluster's limit of 4 nodes"),
        ("MIN over the admin's limit (open MAX)", vec![el("6")], "MIN (6) is over this cluster's limit of 4 nodes"),
        ("100 kB value", vec![os(&huge)], "the value is 102400 bytes long; at most 256 bytes are allowed"),
        ("non-UTF-8 bytes", vec![OsString::from_vec(non_utf8)], "byte 2 (0xff) is not printable ASCII"),
        (
            "forged request through --export",
            vec![os("--export=ALL,SLURM_SPANK_BFTRAINER_ELASTIC=1:1,role=satellite,parent=1")],
            "environment variable SLURM_SPANK_BFTRAINER_ELASTIC is reserved for bftrainer",
        ),
        (
            "forged option through --export",
            vec![os("--export=ALL,_SLURM_SPANK_OPTION_bftrainer_elastic=2:4")],
            "environment variable _SLURM_SPANK_OPTION_bftrainer_elastic is reserved for bftrainer",
        ),
        (
            "forged option copy through --export",
            vec![os("--export=ALL,SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic=1:1,role=satellite,parent=1")],
            "environment variable SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic is reserved for bftrainer",
        ),
        (
            "user job forging the satellite role",
            vec![el("1:1,role=satellite,parent=1")],
            "role=satellite is reserved for bftrainerd (user 'root')",
        ),
        (
            "elastic job sent to a forbidden partition",
            vec![el("2:4"), os("--partition=batch")],
            "partition 'batch' is closed to elastic jobs by this cluster's policy; elastic jobs may use: elastic",
        ),
        ("job array", vec![el("1:2"), os("--array=1-3")], "job arrays cannot be elastic (--array=1-3)"),
        (
            "plain job sent to the elastic partition ([policy] plain_jobs = \"refuse\", the default)",
            vec![os("--partition=elastic")],
            "partition 'elastic' is for elastic jobs, which bftrainerd places on idle nodes",
        ),
        ("--nodes disagreeing with MIN", vec![el("2:4"), os("--nodes=3")], "--nodes conflicts with the elastic request"),
    ];

    // sbatch has no --admin-comment; the other way to plant the satellite tag is an
    // update of a plain job, which must fail too.
    let plain = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args(["--parsable", "--hold", "--wrap=true"])
        .output()
        .unwrap();
    let plain = String::from_utf8_lossy(&plain.stdout).trim().to_string();
    let out = c
        .command_as_test_user("scontrol")
        .unwrap()
        .args([
            "update",
            &format!("jobid={plain}"),
            "admincomment=bftrainer:v1 1:1,role=satellite,parent=1",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "user planted the satellite tag on job {plain}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("Access/permission denied"));
    // Issue 33, item 12: nor may the user move their held plain job into the core or
    // satellite partition (then release it, skipping admission, caps and billing),
    // whatever the spelling or inside a list.
    let says_why = modify_says_why(&c);
    for part in [
        "elastic",
        "elastic-sat",
        "batch,elastic",
        "batch, elastic-sat",
        "ELASTIC",
    ] {
        let (ok, stderr) = scontrol_as_user(
            &c,
            &[
                "update",
                &format!("jobid={plain}"),
                &format!("partition={part}"),
            ],
        );
        assert!(!ok, "user moved plain job {plain} to {part:?}");
        if says_why && part != "ELASTIC" {
            assert!(
                stderr.contains("plain jobs may be moved between regular partitions only"),
                "{part}: {stderr}"
            );
        }
    }
    let where_now = c.run("squeue", &["-h", "-j", &plain, "-o", "%P"]).unwrap();
    assert_eq!(where_now.trim(), "batch", "the plain job left batch");
    let log = ctld_log(&c);
    for part in ["elastic", "elastic-sat"] {
        assert!(
            log.contains(&format!("it moves a plain job into partition '{part}'")),
            "the move to {part} was not refused by the plugin"
        );
    }
    c.run("scancel", &[&plain]).unwrap();

    let mut failures = Vec::new();
    for (what, mut args, expected) in table {
        args.push(wrap.clone());
        let (code, stdout, stderr) = sbatch_as_user(&c, &args);
        if code == 0 || !stderr.contains(expected) {
            failures.push(format!(
                "{what}: exit {code}, stdout {stdout:?}\n  expected stderr to contain {expected:?}\n  got {:?}",
                stderr.chars().take(600).collect::<String>()
            ));
        }
        assert_controller_up(&c);
    }
    assert!(
        failures.is_empty(),
        "{} bad inputs not rejected as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Nothing slipped through.
    let queue = c
        .run("squeue", &["-h", "-t", "all", "-o", "%i %u %P %T"])
        .unwrap();
    let queue: Vec<&str> = queue.lines().filter(|l| !l.contains("CANCELLED")).collect();
    assert!(queue.is_empty(), "jobs were created: {queue:?}");
}

#[test]
fn cluster_elastic_job_is_routed_tagged_held_and_guarded() {
    let tmp = tempfile::tempdir().unwrap();
    let c = elastic_cluster_with(tmp.path(), "allowed_accounts = [\"bft\"]\n");

    let (code, stdout, stderr) = sbatch_as_user(
        &c,
        &[
            os("--parsable"),
            os("--account=bft"),
            os("--elastic=2:4,up=30,batch=64:512,lr=sqrt"),
            os("-o"),
            os("env-%j.out"),
            os("--wrap=env; srun -N1 -n1 env | grep BFT_ROLE"),
        ],
    );
    assert_eq!(code, 0, "sbatch --elastic=2:4 failed: {stderr}");
    let id: u32 = stdout.trim().parse().expect("job id");
    let show = |id: u32| {
        support::job_fields(
            &c.run("scontrol", &["show", "job", "-o", &id.to_string()])
                .unwrap(),
        )
    };
    let f = show(id);
    assert_eq!(f["Partition"], "elastic");
    assert_eq!(f["NumNodes"], "2-2");
    assert_eq!(f["Requeue"], "1");
    assert_eq!(f["Priority"], "0");
    assert_eq!(f["Reason"], "JobHeldUser");
    assert_eq!(f["JobState"], "PENDING");
    assert_eq!(f["OverSubscribe"], "NO");
    assert_eq!(f["AdminComment"], "bftrainer:v1");
    let full = c
        .run("scontrol", &["show", "job", &id.to_string()])
        .unwrap();
    assert!(
        full.contains("AdminComment=bftrainer:v1 2:4,up=30,batch=64:512,lr=sqrt,role=core"),
        "{full}"
    );
    assert!(
        full.contains(
            "Comment=bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it"
        ),
        "{full}"
    );
    let squeue = c
        .run("squeue", &["-h", "-j", &id.to_string(), "-o", "%P|%r|%k"])
        .unwrap();
    assert_eq!(
        squeue.trim(),
        "elastic|JobHeldUser|bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it"
    );

    // The user may not reprioritise, resize, move or re-tag it; the daemon's user
    // (root) may.
    let id_s = id.to_string();
    for args in [
        vec!["update", "jobid", id_s.as_str(), "priority=5"],
        vec!["update", "jobid", id_s.as_str(), "numnodes=4"],
        vec!["update", "jobid", id_s.as_str(), "partition=batch"],
        vec!["update", "jobid", id_s.as_str(), "requeue=0"],
        vec!["update", "jobid", id_s.as_str(), "reqnodelist=n1"],
        vec!["update", "jobid", id_s.as_str(), "excnodelist=n1"],
        // Issue 33, item 15: allowed_accounts holds after submission too.
        vec!["update", "jobid", id_s.as_str(), "account=other"],
        // Issue 32: the batch bftrainerd decides is root's to write.
        vec![
            "update",
            "jobid",
            id_s.as_str(),
            "admincomment=bftrainer:v1 2:4,up=30,batch=64:512,lr=sqrt,role=core,batch_now=512",
        ],
    ] {
        let out = c
            .command_as_test_user("scontrol")
            .unwrap()
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "user could run scontrol {args:?}");
    }
    assert_eq!(show(id)["Priority"], "0", "still held");
    let log = std::fs::read_to_string(c.log_dir().join("slurmctld.log")).unwrap();
    assert!(
        log.contains("refused an update by uid")
            && log.contains("it releases or reprioritises an elastic job"),
        "no refusal logged"
    );
    assert!(
        log.contains("it moves an elastic job to account 'other', which may not run elastic jobs; allowed accounts: bft"),
        "account change not refused in the log"
    );
    assert_eq!(show(id)["Account"], "bft");
    for field in ["ReqNodeList", "ExcNodeList"] {
        assert!(
            log.contains(&format!(
                "it changes {field} of an elastic job (bftrainerd pins it to the nodes it admits it on)"
            )),
            "{field} change not refused in the log"
        );
    }
    // The user may still hold their own job, which the plugin notes in its Comment for
    // bftrainerd; their release only lifts that hold: the job stays held for bftrainerd.
    let as_user = |args: &[&str]| {
        let out = c
            .command_as_test_user("scontrol")
            .unwrap()
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "user {args:?} refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    as_user(&["hold", &id_s]);
    let comment = |c: &Cluster| {
        c.run("squeue", &["-h", "-j", &id_s, "-o", "%k"])
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(
        comment(&c),
        "bftrainer: held by its owner; `scontrol release` hands it back to bftrainerd"
    );
    as_user(&["release", &id_s]);
    assert_eq!(
        show(id)["Priority"],
        "0",
        "the owner's release started the job"
    );
    assert_eq!(
        comment(&c),
        "bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it"
    );
    // bftrainerd (root) writes the batch it decided after role=core.
    c.run(
        "scontrol",
        &[
            "update",
            &format!("jobid={id}"),
            "AdminComment=bftrainer:v1 2:4,up=30,batch=64:512,lr=sqrt,role=core,batch_now=128",
        ],
    )
    .unwrap();
    // root's hold is an administrator's: the tag says so until root releases it, and
    // that release leaves the job held for bftrainerd (the decided batch kept).
    c.run("scontrol", &["hold", &id_s]).unwrap();
    let full = c.run("scontrol", &["show", "job", &id_s]).unwrap();
    assert!(
        full.contains("AdminComment=bftrainer:v1 2:4,up=30,batch=64:512,lr=sqrt,role=core,batch_now=128,hold=admin"),
        "{full}"
    );
    c.run("scontrol", &["release", &id_s]).unwrap();
    let full = c.run("scontrol", &["show", "job", &id_s]).unwrap();
    assert!(
        full.contains("AdminComment=bftrainer:v1 2:4,up=30,batch=64:512,lr=sqrt,role=core")
            && !full.contains("hold=admin"),
        "{full}"
    );
    assert_eq!(
        show(id)["Priority"],
        "0",
        "root's release of its hold started the job"
    );

    // root's plain release starts the job, but not by bftrainerd's admission (no
    // bftrainerd here): spank/bftrainer's gate requeues that start held, with its note,
    // before the script runs, for bftrainerd to admit.
    c.run("scontrol", &["release", &id_s])
        .expect("root (daemon_user) releases");
    let gated = wait_until(
        "the gate to requeue the unadmitted start held",
        Duration::from_secs(120),
        || {
            let full = c.run("scontrol", &["show", "job", &id_s])?;
            Ok((full.contains("JobState=PENDING")
                && full.contains("Restarts=1")
                && full
                    .contains("Comment=bftrainer: started without bftrainerd's admission (run 0"))
            .then_some(full))
        },
    )
    .expect("the gate held the start");
    assert!(gated.contains("Priority=0"), "{gated}");
    // To run it outside bftrainerd, an administrator takes the tag off, then releases.
    c.run(
        "scontrol",
        &["update", &format!("jobid={id}"), "AdminComment="],
    )
    .expect("root clears the tag");
    c.run("scontrol", &["release", &id_s])
        .expect("root releases the untagged job");
    // After Slurm's requeue delay (its BeginTime).
    c.wait_for_state(id, &["COMPLETED"], Duration::from_secs(400))
        .expect("elastic job runs to completion");
    let env = std::fs::read_to_string(c.work_dir().join(format!("env-{id}.out"))).unwrap();
    for line in [
        "BFT_ELASTIC=2:4,up=30,batch=64:512,lr=sqrt".to_string(),
        "BFT_BATCH_MIN=64".into(),
        "BFT_BATCH_MAX=512".into(),
        "BFT_LR_RULE=sqrt".into(),
        "BFT_ELASTIC_MIN=2".into(),
        "BFT_ELASTIC_MAX=4".into(),
        "BFT_ROLE=core".into(),
        format!("BFT_PARENT_JOB_ID={id}"),
        "BFT_UP_SECONDS=30".into(),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from the batch step's env:\n{env}"
        );
    }
    assert_eq!(
        env.lines().filter(|l| *l == "BFT_ROLE=core").count(),
        2,
        "srun step lacks BFT_ROLE"
    );

    // A satellite from the daemon's user: not held, tagged with its parent, and its
    // tasks learn their role and parent.
    let spec = format!("--elastic=1:1,role=satellite,parent={id}");
    let sat = c
        .sbatch(&[spec.as_str(), "-o", "sat-%j.out", "--wrap=env"])
        .expect("root submits a satellite");
    let full = c
        .run("scontrol", &["show", "job", &sat.to_string()])
        .unwrap();
    assert!(
        full.contains(&format!(
            "AdminComment=bftrainer:v1 1:1,role=satellite,parent={id}"
        )),
        "{full}"
    );
    assert!(
        !full.contains("Reason=JobHeldUser"),
        "satellite held: {full}"
    );
    c.wait_for_state(sat, &["COMPLETED"], Duration::from_secs(60))
        .expect("satellite runs");
    let env = std::fs::read_to_string(c.work_dir().join(format!("sat-{sat}.out"))).unwrap();
    for line in [
        "BFT_ROLE=satellite".to_string(),
        format!("BFT_PARENT_JOB_ID={id}"),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from the satellite's env:\n{env}"
        );
    }

    // scontrol reconfigure re-reads bftrainer.toml: a tighter limit applies at once.
    let conf = c.dir().join("etc/bftrainer.toml");
    std::fs::write(&conf, POLICY.replace("max_nodes = 4", "max_nodes = 2")).unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure");
    assert_controller_up(&c);
    // 22.05: the plugin's watcher applies it within a second; 23.11+: the new
    // slurmctld's init() has.
    wait_for_log(&c, "the policy with max_nodes=2 loaded", |log| {
        log.lines().any(|l| {
            l.contains("job_submit/bftrainer: ")
                && l.contains("loaded")
                && l.contains("max_nodes=2 ")
        })
    });
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=2:4"), os("--wrap=true")]);
    assert!(
        code != 0 && stderr.contains("limit of 2 nodes"),
        "new limit not applied: {stderr}"
    );
    // A broken file on reconfigure keeps the last good policy and says why in the log.
    // slurm_conf.last_update, the plugin's reload trigger, counts whole seconds.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&conf, "[policy]\nmax_nodes = -1\n").unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure with a broken file");
    assert_controller_up(&c);
    wait_for_log(&c, "the broken file reported", |log| {
        log.contains("[policy] max_nodes: -1 is out of range")
    });
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=1:2"), os("--wrap=true")]);
    assert_eq!(code, 0, "previous policy should still accept 1:2: {stderr}");
    let log = std::fs::read_to_string(c.log_dir().join("slurmctld.log")).unwrap();
    // 22.05 keeps the plugin loaded and reloads from job_submit ("reconfigure: loaded
    // ..."); from 23.11 reconfigure starts a new slurmctld, whose init() loads the file.
    assert!(
        log.lines().any(|l| l.contains("job_submit/bftrainer: ")
            && l.contains("loaded")
            && l.contains("max_nodes=2 ")),
        "no reload logged"
    );
    // ... and a broken file keeps the last good policy either way: in memory (22.05) or
    // from the copy in StateSaveLocation (init() must not fail: that kills slurmctld).
    assert!(
        (log.contains("reconfigure: keeping the previous policy")
            || log.contains("using the last policy that loaded on this controller"))
            && log.contains("[policy] max_nodes: -1 is out of range"),
        "broken config not reported"
    );
}

/// Fields that differ between any two submissions (times, paths under the cluster dir).
fn comparable(fields: &std::collections::BTreeMap<String, String>, dir: &Path) -> Vec<String> {
    const VOLATILE: [&str; 10] = [
        "SubmitTime",
        "EligibleTime",
        "AccrueTime",
        "StartTime",
        "EndTime",
        "LastSchedEval",
        "AllocNode:Sid",
        "RunTime",
        "Deadline",
        "SuspendTime",
    ];
    fields
        .iter()
        .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={}", v.replace(&dir.display().to_string(), "<DIR>")))
        .collect()
}

#[test]
fn cluster_plain_jobs_are_untouched_field_for_field() {
    let tmp = tempfile::tempdir().unwrap();
    // Scavenger policy: plain jobs may use the elastic partition, untouched.
    let with = elastic_cluster_with(tmp.path(), "plain_jobs = \"scavenger\"\n");
    let without = Cluster::start(Options {
        nodes: 4,
        ..Default::default()
    })
    .expect("plain cluster");
    let jobs: [&[&str]; 3] = [
        &["--hold", "--wrap=sleep 1"],
        &[
            "--hold",
            "-N",
            "2",
            "-p",
            "batch",
            "--comment=mine",
            "--requeue",
            "-t",
            "5",
            "--wrap=sleep 1",
        ],
        &[
            "--hold",
            "-p",
            "elastic",
            "-n",
            "3",
            "--no-requeue",
            "--exclusive",
            "--wrap=hostname",
        ],
    ];
    for args in jobs {
        let mut seen = Vec::new();
        for c in [&with, &without] {
            let out = c
                .command_as_test_user("sbatch")
                .unwrap()
                .arg("--parsable")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "sbatch {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let show = c.run("scontrol", &["show", "job", "-o", &id]).unwrap();
            seen.push(comparable(&support::job_fields(&show), c.dir()));
        }
        assert!(seen[0].len() > 30, "too few fields parsed: {:?}", seen[0]);
        assert_eq!(
            seen[0], seen[1],
            "sbatch {args:?}: the plugin changed a plain job"
        );
    }
    assert_controller_up(&with);
}

/// Satellites are bftrainerd's (issue 20): their owner may hold, release and cancel
/// them, nothing else. Each refused update names the field, in slurmctld's log (22.05)
/// and to the user (23.02+, job_modify's err_msg).
#[test]
fn cluster_satellite_owner_may_only_hold_release_or_cancel() {
    let tmp = tempfile::tempdir().unwrap();
    let c = elastic_cluster_with(tmp.path(), "satellite_partition = \"elastic-sat\"\n");
    // The parent: bftuser's elastic job, held for bftrainerd.
    let (code, stdout, stderr) = sbatch_as_user(
        &c,
        &[os("--parsable"), os("--elastic=1:4"), os("--wrap=sleep 60")],
    );
    assert_eq!(code, 0, "{stderr}");
    let parent: u32 = stdout.trim().parse().expect("job id");
    // A satellite as bftrainerd submits it: by root (daemon_user), for the owner's uid
    // and gid. It waits for its begin time, so that it stays pending and the user's own
    // hold and release are ordinary user holds.
    let spec = format!("--elastic=1:1,role=satellite,parent={parent}");
    let sat = c
        .sbatch(&[
            spec.as_str(),
            "--uid=bftuser",
            "--gid=bftuser",
            "--begin=now+3600",
            "--job-name",
            &format!("bftsat-{parent}"),
            "--wrap=sleep 60",
        ])
        .expect("root submits a satellite for bftuser");
    let s = sat.to_string();
    let show = || support::job_fields(&c.run("scontrol", &["show", "job", "-o", &s]).unwrap());
    let before = show();
    assert_eq!(before["UserId"].split('(').next(), Some("bftuser"));
    assert_eq!(before["Partition"], "elastic-sat");

    let rule = "satellites are bftrainerd's: you may cancel or hold them, nothing else";
    let says_why = modify_says_why(&c);
    let jobid = format!("jobid={s}");
    let refused: [(&str, &str); 7] = [
        ("name=x", "Name"),
        ("partition=elastic", "Partition"),
        ("reqnodelist=n2", "ReqNodeList"),
        ("excnodelist=n2", "ExcNodeList"),
        ("account=bft", "Account"),
        ("requeue=1", "Requeue"),
        ("timelimit=5", "TimeLimit"),
    ];
    let mut failures = Vec::new();
    for (update, field) in refused {
        let (ok, stderr) = scontrol_as_user(&c, &["update", &jobid, update]);
        eprintln!("scontrol update {update} as bftuser: {}", stderr.trim());
        let want = format!("sets {field} on a satellite of job {parent}; {rule}");
        if ok {
            failures.push(format!("{update}: accepted"));
        } else if !stderr.contains("Access/permission denied") {
            failures.push(format!("{update}: {stderr}"));
        } else if says_why
            && !stderr.contains(&format!(
                "job_submit/bftrainer: refused: this update {want}"
            ))
        {
            failures.push(format!("{update}: the user is not told why: {stderr}"));
        }
        wait_for_log(&c, &format!("{update} refused in the log"), |log| {
            log.contains("refused an update by uid") && log.contains(&want)
        });
    }
    // `reqnodelist=` (clearing the list) is a change too.
    let (ok, _) = scontrol_as_user(&c, &["update", &jobid, "reqnodelist="]);
    if ok {
        failures.push("reqnodelist=: accepted".into());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let after = show();
    for key in [
        "JobName",
        "Partition",
        "ReqNodeList",
        "ExcNodeList",
        "Account",
        "Requeue",
        "TimeLimit",
    ] {
        assert_eq!(after.get(key), before.get(key), "{key} changed");
    }

    // Hold and release are the owner's.
    let (ok, stderr) = scontrol_as_user(&c, &["hold", &s]);
    assert!(ok, "user hold refused: {stderr}");
    assert_eq!(show()["Priority"], "0");
    let (ok, stderr) = scontrol_as_user(&c, &["release", &s]);
    assert!(ok, "user release refused: {stderr}");
    assert_ne!(show()["Priority"], "0");
    let (ok, stderr) = scontrol_as_user(&c, &["uhold", &s]);
    assert!(ok, "user uhold refused: {stderr}");
    let (ok, stderr) = scontrol_as_user(&c, &["release", &s]);
    assert!(ok, "user release after uhold refused: {stderr}");
    // root (daemon_user) may still change it.
    c.run("scontrol", &["update", &jobid, "timelimit=7"])
        .expect("root updates a satellite");
    // Cancel is not an update: allowed.
    let out = c
        .command_as_test_user("scancel")
        .unwrap()
        .arg(&s)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait_for_state(sat, &["CANCELLED"], Duration::from_secs(30))
        .expect("satellite cancelled by its owner");
    assert_controller_up(&c);
}

/// NSS never stops slurmctld (issue 20): with a name in allowed_users that does not
/// resolve, slurmctld starts and stays up, plain jobs run untouched, and elastic jobs are
/// refused with the reason. Nor does a missing bftrainer.toml at its start (issue 35).
#[test]
fn cluster_unresolvable_user_keeps_slurmctld_up_and_refuses_elastic_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let c = elastic_cluster_with(
        tmp.path(),
        "allowed_users = [\"bftuser\", \"no-such-user-bft\"]\n",
    );
    assert_controller_up(&c);
    let log = ctld_log(&c);
    assert!(
        log.contains(
            "init: elastic jobs are refused (plain jobs run as usual) until this is mended"
        ) && log.contains("[policy] allowed_users 'no-such-user-bft'"),
        "no reason logged at init"
    );
    let (code, stdout, stderr) = sbatch_as_user(&c, &[os("--parsable"), os("--wrap=true")]);
    assert_eq!(code, 0, "plain job refused: {stderr}");
    let plain: u32 = stdout.trim().parse().unwrap();
    c.wait_for_state(plain, &["COMPLETED"], Duration::from_secs(60))
        .expect("plain job runs");
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=1:2"), os("--wrap=true")]);
    assert_ne!(code, 0, "elastic job accepted");
    for part in [
        "--elastic=1:2: elastic jobs are unavailable on this cluster for now: ",
        "names [policy] allowed_users 'no-such-user-bft' that cannot be looked up",
        "plain jobs are not affected",
        "Access/permission denied",
    ] {
        assert!(stderr.contains(part), "{part:?} not in {stderr:?}");
    }
    // root's satellites (bftrainerd's growth of jobs already running) still go through.
    c.sbatch(&[
        "--elastic=1:1,role=satellite,parent=1",
        "--hold",
        "--wrap=true",
    ])
    .expect("root's satellite accepted");
    assert_controller_up(&c);

    // Mended and reconfigured: elastic jobs are accepted again.
    let conf = c.dir().join("etc/bftrainer.toml");
    std::fs::write(&conf, format!("{POLICY}allowed_users = [\"bftuser\"]\n")).unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure");
    wait_for_log(&c, "the mended policy loaded", |log| {
        log.lines()
            .any(|l| l.contains("job_submit/bftrainer: ") && l.contains(" users=bftuser accounts="))
    });
    assert_controller_up(&c);
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=1:2"), os("--wrap=true")]);
    assert_eq!(code, 0, "elastic job refused after the fix: {stderr}");

    // No readable bftrainer.toml at slurmctld's start and no last good copy (a first
    // install in the wrong order): slurmctld starts all the same, plain jobs run, every
    // elastic request is refused with the reason, root's too.
    std::fs::remove_file(&conf).unwrap();
    std::fs::remove_file(
        c.dir()
            .join("state/slurmctld/bftrainer-job_submit.last-good.toml"),
    )
    .expect("the last good copy is kept in StateSaveLocation");
    c.stop_daemon("slurmctld", false).expect("stop slurmctld");
    c.start_daemon("slurmctld")
        .expect("slurmctld starts without bftrainer.toml");
    assert_controller_up(&c);
    wait_for_log(&c, "the reason at init", |log| {
        log.contains(
            "init: elastic jobs are refused (plain jobs run as usual) until this is mended: ",
        ) && log.contains("cannot read the bftrainer config")
    });
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=1:2"), os("--wrap=true")]);
    assert_ne!(code, 0, "elastic job accepted without a config");
    assert!(
        stderr.contains("elastic jobs are unavailable on this cluster for now: ")
            && stderr.contains("cannot read the bftrainer config"),
        "{stderr}"
    );
    assert!(
        c.sbatch(&[
            "--elastic=1:1,role=satellite,parent=1",
            "--hold",
            "--wrap=true"
        ])
        .is_err(),
        "root's elastic request accepted without a config"
    );
    let (code, stdout, stderr) = sbatch_as_user(&c, &[os("--parsable"), os("--wrap=true")]);
    assert_eq!(code, 0, "plain job refused without a config: {stderr}");
    let plain: u32 = stdout.trim().parse().unwrap();
    c.wait_for_state(plain, &["COMPLETED"], Duration::from_secs(60))
        .expect("plain job runs without a config");
    // Written beside slurm.conf afterwards (the default path was read at the start):
    // a reconfigure finds it and elastic jobs are accepted.
    std::fs::write(&conf, format!("{POLICY}allowed_users = [\"bftuser\"]\n")).unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure");
    let loaded = format!("loaded {}: ", conf.display());
    wait_for_log(&c, "the written policy loaded", |log| {
        log.rfind(&loaded) > log.rfind("cannot read the bftrainer config")
    });
    let (code, _, stderr) = sbatch_as_user(&c, &[os("--elastic=1:2"), os("--wrap=true")]);
    assert_eq!(
        code, 0,
        "elastic job refused once the config was written: {stderr}"
    );
    assert_controller_up(&c);
}
