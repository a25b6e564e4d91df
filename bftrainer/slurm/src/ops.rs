//! Acting on jobs: submit a batch job (also for another user, as root), update it,
//! hold/release, signal, cancel, requeue, and ask when it would start.

use std::ffi::CString;
use std::os::raw::c_char;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{check, clear_errno, last_error, Error, Result};
use crate::ffi::{c_arg, for_each_borrowed, opt_string, opt_time, owned_msg};
use crate::state::TimeLimit;
use crate::Slurm;

/// A batch job to submit (or to ask `will_run` about). `Default` gives an empty
/// script: set at least `script`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchJob {
    /// The script; must start with "#!" (Slurm refuses others).
    pub script: String,
    /// Arguments passed to the script.
    pub args: Vec<String>,
    pub name: Option<String>,
    pub partition: Option<String>,
    /// Account to charge (default: the user's default account).
    pub account: Option<String>,
    /// Minimum / maximum node count.
    pub min_nodes: Option<u32>,
    pub max_nodes: Option<u32>,
    /// Nodes the job must run on (host expression, e.g. "n[1-2]").
    pub node_list: Option<String>,
    /// Nodes the job must not run on.
    pub exclude: Option<String>,
    pub ntasks: Option<u32>,
    pub cpus_per_task: Option<u16>,
    pub time_limit: Option<TimeLimit>,
    pub comment: Option<String>,
    /// Needs an administrator (root or SlurmUser) to be accepted.
    pub admin_comment: Option<String>,
    /// The job's environment. Slurm refuses a batch job without one, so an empty list
    /// sends only `PATH=/usr/local/bin:/usr/bin:/bin`.
    pub env: Vec<(String, String)>,
    /// Working directory; default: this process's current directory.
    pub work_dir: Option<PathBuf>,
    /// stdout / stderr paths (Slurm patterns such as %j allowed).
    pub output: Option<String>,
    pub error: Option<String>,
    /// Run as this uid/gid instead of ours; only root (or SlurmUser) may.
    pub run_as: Option<(u32, u32)>,
    /// Submit held (priority 0), to be released later.
    pub hold: bool,
    /// Allow (true) or forbid (false) requeue; None keeps the cluster default.
    pub requeue: Option<bool>,
    /// Whole nodes only (`--exclusive`).
    pub exclusive: bool,
    /// Entries of the job's SPANK environment (`spank_job_env`), as a SPANK option
    /// sets them: what job_submit plugins read (e.g. `BFTRAINER_ELASTIC`).
    pub spank_env: Vec<(String, String)>,
    /// QOS (`--qos`).
    #[serde(default)]
    pub qos: Option<String>,
    /// Required node features (`--constraint`).
    #[serde(default)]
    pub constraint: Option<String>,
    /// Memory per node in MB (`--mem`); exclusive with `mem_per_cpu_mb`.
    #[serde(default)]
    pub mem_per_node_mb: Option<u64>,
    /// Memory per CPU in MB (`--mem-per-cpu`).
    #[serde(default)]
    pub mem_per_cpu_mb: Option<u64>,
    /// Trackable resources per node, in slurmctld's own form (as [`crate::Job`] reads it).
    #[serde(default)]
    pub tres_per_node: Option<String>,
    /// Trackable resources per task (`--gpus-per-task`).
    #[serde(default)]
    pub tres_per_task: Option<String>,
    #[serde(default)]
    pub ntasks_per_node: Option<u16>,
}

/// What `submit_batch` got back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Submitted {
    pub job_id: u32,
    /// A message from a job_submit plugin to the user, if any.
    pub user_message: Option<String>,
}

/// When and where slurmctld would start a job (`slurm_job_will_run2`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WillRun {
    pub start_time: Option<i64>,
    /// Nodes it would start on (host expression).
    pub node_list: Option<String>,
    pub partition: Option<String>,
    /// Jobs that would be preempted to start it.
    pub preemptees: Vec<u32>,
    pub cpus: u32,
}

/// Fields to change on an existing job; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobUpdate {
    /// Required nodes (ReqNodeList) of a pending job, e.g. to pin it.
    pub node_list: Option<String>,
    pub min_nodes: Option<u32>,
    pub max_nodes: Option<u32>,
    pub comment: Option<String>,
    pub admin_comment: Option<String>,
    pub time_limit: Option<TimeLimit>,
    pub partition: Option<String>,
    /// Priority; 0 holds the job, `slurm_sys::INFINITE` releases it with a computed
    /// priority (what `scontrol hold/release` do); prefer [`Slurm::hold`]/[`Slurm::release`].
    pub priority: Option<u32>,
    pub requeue: Option<bool>,
}

/// Which processes of a job a signal goes to (`slurm_kill_job` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SignalTarget {
    /// Only the batch shell (KILL_JOB_BATCH, `scancel -b`).
    BatchShell,
    /// All steps and the batch shell (KILL_FULL_JOB, `scancel -f`).
    Everything,
    /// All steps but not the batch shell (KILL_STEPS_ONLY).
    StepsOnly,
}

/// Owns a job_desc_msg_t's pointed-to data for the duration of one call. Slurm only
/// reads (and packs) these fields in our process, so Rust-owned memory is fine here.
struct Desc {
    msg: slurm_sys::job_desc_msg_t,
    _strings: Vec<CString>,
    _env: Vec<*mut c_char>,
    _argv: Vec<*mut c_char>,
    _spank: Vec<*mut c_char>,
}

struct DescBuilder {
    msg: slurm_sys::job_desc_msg_t,
    strings: Vec<CString>,
}

impl std::fmt::Debug for Desc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Desc(job {})",
            slurm_sys::compat::job_desc_job_id(&self.msg)
        )
    }
}

impl DescBuilder {
    fn new() -> DescBuilder {
        let mut msg: slurm_sys::job_desc_msg_t = Default::default();
        // SAFETY: fills a caller-owned struct with Slurm's "unset" values.
        unsafe { slurm_sys::slurm_init_job_desc_msg(&mut msg) };
        DescBuilder {
            msg,
            strings: Vec::new(),
        }
    }

    /// Keeps a CString alive in the builder and returns its pointer.
    fn s(&mut self, what: &'static str, v: &str) -> Result<*mut c_char> {
        let c = c_arg(what, v)?;
        let p = c.as_ptr() as *mut c_char;
        self.strings.push(c);
        Ok(p)
    }

    fn opt(&mut self, what: &'static str, v: &Option<String>) -> Result<*mut c_char> {
        match v {
            Some(v) => self.s(what, v),
            None => Ok(std::ptr::null_mut()),
        }
    }

    fn array(&mut self, what: &'static str, items: &[String]) -> Result<Vec<*mut c_char>> {
        let mut v = Vec::with_capacity(items.len() + 1);
        for it in items {
            v.push(self.s(what, it)?);
        }
        v.push(std::ptr::null_mut());
        Ok(v)
    }
}

fn batch_desc(job: &BatchJob) -> Result<Desc> {
    if !job.script.starts_with("#!") {
        return Err(Error::invalid(
            "script",
            "must start with an interpreter line such as `#!/bin/sh`",
        ));
    }
    if let (Some(lo), Some(hi)) = (job.min_nodes, job.max_nodes) {
        if lo > hi {
            return Err(Error::invalid(
                "node count",
                format!("min_nodes {lo} is above max_nodes {hi}"),
            ));
        }
    }
    if job.min_nodes == Some(0) {
        return Err(Error::invalid("min_nodes", "must be at least 1"));
    }
    if job.mem_per_node_mb.is_some() && job.mem_per_cpu_mb.is_some() {
        return Err(Error::invalid(
            "memory",
            "give memory per node or per CPU, not both",
        ));
    }
    for (what, mb) in [
        ("mem_per_node_mb", job.mem_per_node_mb),
        ("mem_per_cpu_mb", job.mem_per_cpu_mb),
    ] {
        if mb.is_some_and(|m| m == 0 || m >= 1u64 << 62) {
            return Err(Error::invalid(what, "must be between 1 and 2^62 - 1 MB"));
        }
    }
    for (k, _) in job.env.iter().chain(&job.spank_env) {
        if k.is_empty() || k.contains('=') {
            return Err(Error::invalid(
                "env",
                format!("variable name `{k}` must be non-empty and contain no `=`"),
            ));
        }
    }
    let mut b = DescBuilder::new();
    b.msg.script = b.s("script", &job.script)?;
    b.msg.name = b.opt("name", &job.name)?;
    b.msg.partition = b.opt("partition", &job.partition)?;
    b.msg.account = b.opt("account", &job.account)?;
    b.msg.req_nodes = b.opt("node_list", &job.node_list)?;
    b.msg.exc_nodes = b.opt("exclude", &job.exclude)?;
    b.msg.comment = b.opt("comment", &job.comment)?;
    b.msg.admin_comment = b.opt("admin_comment", &job.admin_comment)?;
    b.msg.std_out = b.opt("output", &job.output)?;
    b.msg.std_err = b.opt("error", &job.error)?;
    b.msg.qos = b.opt("qos", &job.qos)?;
    b.msg.features = b.opt("constraint", &job.constraint)?;
    b.msg.tres_per_node = b.opt("tres_per_node", &job.tres_per_node)?;
    b.msg.tres_per_task = b.opt("tres_per_task", &job.tres_per_task)?;
    if let Some(m) = job.mem_per_node_mb {
        b.msg.pn_min_memory = m;
    }
    if let Some(m) = job.mem_per_cpu_mb {
        // MEM_PER_CPU: the top bit (slurm.h).
        b.msg.pn_min_memory = m | (1u64 << 63);
    }
    if let Some(n) = job.ntasks_per_node {
        b.msg.ntasks_per_node = n;
    }
    if let Some(n) = job.min_nodes {
        b.msg.min_nodes = n;
    }
    if let Some(n) = job.max_nodes {
        b.msg.max_nodes = n;
    }
    if let Some(n) = job.ntasks {
        b.msg.num_tasks = n;
    }
    if let Some(c) = job.cpus_per_task {
        b.msg.cpus_per_task = c;
    }
    if let Some(t) = job.time_limit {
        b.msg.time_limit = t.to_raw();
    }
    if job.hold {
        b.msg.priority = 0;
    }
    if let Some(r) = job.requeue {
        b.msg.requeue = u16::from(r);
    }
    if job.exclusive {
        b.msg.shared = slurm_sys::JOB_SHARED_NONE as u16;
    }
    let work_dir = match &job.work_dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| {
            Error::invalid(
                "work_dir",
                format!("not given and the current directory is unusable: {e}"),
            )
        })?,
    };
    let work_dir = work_dir
        .to_str()
        .ok_or_else(|| Error::invalid("work_dir", "must be valid UTF-8"))?
        .to_string();
    b.msg.work_dir = b.s("work_dir", &work_dir)?;
    let (uid, gid) = match job.run_as {
        Some(ids) => ids,
        // SAFETY: getuid/getgid cannot fail.
        None => unsafe { (libc::getuid(), libc::getgid()) },
    };
    b.msg.user_id = uid;
    b.msg.group_id = gid;

    let env: Vec<String> = if job.env.is_empty() {
        vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_string()]
    } else {
        job.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    };
    let mut env_ptrs = b.array("env", &env)?;
    b.msg.environment = env_ptrs.as_mut_ptr();
    b.msg.env_size = env.len() as u32;
    let mut argv = vec!["script".to_string()];
    argv.extend(job.args.iter().cloned());
    let mut argv_ptrs = b.array("args", &argv)?;
    b.msg.argv = argv_ptrs.as_mut_ptr();
    b.msg.argc = argv.len() as u32;
    let spank: Vec<String> = job
        .spank_env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut spank_ptrs = if spank.is_empty() {
        Vec::new()
    } else {
        b.array("spank_env", &spank)?
    };
    if !spank.is_empty() {
        b.msg.spank_job_env = spank_ptrs.as_mut_ptr();
        b.msg.spank_job_env_size = spank.len() as u32;
    }
    Ok(Desc {
        msg: b.msg,
        _strings: b.strings,
        _env: env_ptrs,
        _argv: argv_ptrs,
        _spank: spank_ptrs,
    })
}

fn update_desc(job_id: u32, u: &JobUpdate) -> Result<Desc> {
    let mut b = DescBuilder::new();
    slurm_sys::compat::set_job_desc_job_id(&mut b.msg, job_id);
    b.msg.req_nodes = b.opt("node_list", &u.node_list)?;
    b.msg.comment = b.opt("comment", &u.comment)?;
    b.msg.admin_comment = b.opt("admin_comment", &u.admin_comment)?;
    b.msg.partition = b.opt("partition", &u.partition)?;
    if let Some(n) = u.min_nodes {
        b.msg.min_nodes = n;
    }
    if let Some(n) = u.max_nodes {
        b.msg.max_nodes = n;
    }
    if let Some(t) = u.time_limit {
        b.msg.time_limit = t.to_raw();
    }
    if let Some(p) = u.priority {
        b.msg.priority = p;
    }
    if let Some(r) = u.requeue {
        b.msg.requeue = u16::from(r);
    }
    Ok(Desc {
        msg: b.msg,
        _strings: b.strings,
        _env: Vec::new(),
        _argv: Vec::new(),
        _spank: Vec::new(),
    })
}

owned_msg!(
    /// Owns a submit_response_msg_t from slurm_submit_batch_job.
    SubmitResp, submit_response_msg_t, slurm_free_submit_response_response_msg
);
owned_msg!(
    /// Owns a will_run_response_msg_t from slurm_job_will_run2.
    WillRunResp, will_run_response_msg_t, slurm_free_will_run_response_msg
);

impl Slurm {
    /// Submits a batch job (`slurm_submit_batch_job`).
    pub fn submit_batch(&self, job: &BatchJob) -> Result<Submitted> {
        let mut d = batch_desc(job)?;
        let mut resp = SubmitResp(std::ptr::null_mut());
        clear_errno();
        // SAFETY: d.msg's pointers are kept alive by `d` for the call; resp is owned
        // by its guard whether the call fails or not.
        let rc = unsafe { slurm_sys::slurm_submit_batch_job(&mut d.msg, &mut resp.0) };
        if rc != slurm_sys::SLURM_SUCCESS as i32 {
            return Err(last_error("slurm_submit_batch_job", rc));
        }
        // SAFETY: valid until the guard drops.
        let r = unsafe { resp.0.as_ref() }
            .ok_or_else(|| Error::from_code("slurm_submit_batch_job", slurm_sys::SLURM_ERROR))?;
        Ok(Submitted {
            job_id: slurm_sys::compat::submit_response_job_id(r),
            // SAFETY: NULL or a valid string in the response.
            user_message: unsafe { opt_string(r.job_submit_user_msg) },
        })
    }

    /// When and where the job would start now (`slurm_job_will_run2`); nothing is
    /// submitted. `hold` is ignored: the question is when it could start.
    pub fn will_run(&self, job: &BatchJob) -> Result<WillRun> {
        let mut d = batch_desc(job)?;
        d.msg.priority = slurm_sys::NO_VAL;
        let mut resp = WillRunResp(std::ptr::null_mut());
        clear_errno();
        // SAFETY: as in submit_batch.
        let rc = unsafe { slurm_sys::slurm_job_will_run2(&mut d.msg, &mut resp.0) };
        if rc != slurm_sys::SLURM_SUCCESS as i32 {
            return Err(last_error("slurm_job_will_run2", rc));
        }
        // SAFETY: valid until the guard drops.
        let r = unsafe { resp.0.as_ref() }
            .ok_or_else(|| Error::from_code("slurm_job_will_run2", slurm_sys::SLURM_ERROR))?;
        let mut preemptees = Vec::new();
        // SAFETY: the list (of uint32_t*) lives in the response.
        unsafe {
            for_each_borrowed(r.preemptee_job_id, |p| preemptees.push(*p.cast::<u32>()));
        }
        Ok(WillRun {
            start_time: opt_time(r.start_time),
            // SAFETY: NULL or valid strings in the response.
            node_list: unsafe { opt_string(r.node_list) },
            partition: unsafe { opt_string(r.part_name) },
            preemptees,
            cpus: r.proc_cnt,
        })
    }

    /// Changes fields of a job (`slurm_update_job`).
    pub fn update_job(&self, job_id: u32, update: &JobUpdate) -> Result<()> {
        if update == &JobUpdate::default() {
            return Err(Error::invalid(
                "job update",
                "sets no field; set at least one",
            ));
        }
        let mut d = update_desc(job_id, update)?;
        clear_errno();
        // SAFETY: d keeps the pointed-to data alive for the call.
        check("slurm_update_job", unsafe {
            slurm_sys::slurm_update_job(&mut d.msg)
        })
    }

    /// Holds a pending job (priority 0), as `scontrol hold`.
    pub fn hold(&self, job_id: u32) -> Result<()> {
        self.update_job(
            job_id,
            &JobUpdate {
                priority: Some(0),
                ..Default::default()
            },
        )
    }

    /// Releases a held job, as `scontrol release`.
    pub fn release(&self, job_id: u32) -> Result<()> {
        self.update_job(
            job_id,
            &JobUpdate {
                priority: Some(slurm_sys::INFINITE),
                ..Default::default()
            },
        )
    }

    /// Sends `signal` to the job's processes (`slurm_kill_job` with a flag for
    /// `target`); the job is not cancelled unless the signal ends it.
    pub fn signal_job(&self, job_id: u32, signal: i32, target: SignalTarget) -> Result<()> {
        let sig = u16::try_from(signal)
            .ok()
            .filter(|s| (1..=64).contains(s))
            .ok_or_else(|| {
                Error::invalid("signal", format!("{signal} is not a signal number (1-64)"))
            })?;
        let flags = match target {
            SignalTarget::BatchShell => slurm_sys::KILL_JOB_BATCH,
            SignalTarget::Everything => slurm_sys::KILL_FULL_JOB,
            SignalTarget::StepsOnly => slurm_sys::KILL_STEPS_ONLY,
        } as u16;
        clear_errno();
        // SAFETY: plain values.
        check("slurm_kill_job", unsafe {
            slurm_sys::compat::kill_job(job_id, sig, flags)
        })
    }

    /// Cancels a job (`slurm_kill_job` with SIGKILL, as `scancel`).
    pub fn cancel_job(&self, job_id: u32) -> Result<()> {
        clear_errno();
        // SAFETY: plain values.
        check("slurm_kill_job", unsafe {
            slurm_sys::compat::kill_job(job_id, libc::SIGKILL as u16, 0)
        })
    }

    /// Requeues a batch job (`slurm_requeue`), terminating it first if it runs; with
    /// `hold` it comes back held (JOB_REQUEUE_HOLD).
    pub fn requeue(&self, job_id: u32, hold: bool) -> Result<()> {
        let flags = if hold {
            slurm_sys::JOB_REQUEUE_HOLD as u32
        } else {
            0
        };
        clear_errno();
        // SAFETY: plain values.
        check("slurm_requeue", unsafe {
            slurm_sys::compat::requeue(job_id, flags)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_jobs_are_refused_before_any_rpc() {
        let e = batch_desc(&BatchJob {
            script: "echo hi".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("#!"), "{e}");
        let ok = BatchJob {
            script: "#!/bin/sh\n".into(),
            ..Default::default()
        };
        let e = batch_desc(&BatchJob {
            min_nodes: Some(3),
            max_nodes: Some(2),
            ..ok.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("min_nodes 3"), "{e}");
        let e = batch_desc(&BatchJob {
            env: vec![("A=B".into(), "x".into())],
            ..ok.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("A=B"), "{e}");
        let e = batch_desc(&BatchJob {
            name: Some("a\0b".into()),
            ..ok
        })
        .unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
    }

    #[test]
    fn descriptor_carries_every_field() {
        let job = BatchJob {
            script: "#!/bin/sh\ntrue\n".into(),
            args: vec!["a1".into()],
            name: Some("n".into()),
            partition: Some("elastic".into()),
            min_nodes: Some(2),
            max_nodes: Some(3),
            node_list: Some("n[1-2]".into()),
            time_limit: Some(TimeLimit::Minutes(5)),
            env: vec![("K".into(), "V".into())],
            work_dir: Some("/tmp".into()),
            run_as: Some((1234, 99)),
            hold: true,
            requeue: Some(true),
            exclusive: true,
            spank_env: vec![("BFTRAINER_ELASTIC".into(), "1:1".into())],
            qos: Some("high".into()),
            constraint: Some("a100&ib".into()),
            mem_per_cpu_mb: Some(4096),
            tres_per_node: Some("gres/gpu:2".into()),
            tres_per_task: Some("gres/gpu:1".into()),
            ntasks_per_node: Some(2),
            ..Default::default()
        };
        let d = batch_desc(&job).unwrap();
        unsafe {
            assert_eq!(opt_string(d.msg.qos).as_deref(), Some("high"));
            assert_eq!(opt_string(d.msg.features).as_deref(), Some("a100&ib"));
            assert_eq!(
                opt_string(d.msg.tres_per_node).as_deref(),
                Some("gres/gpu:2")
            );
            assert_eq!(
                opt_string(d.msg.tres_per_task).as_deref(),
                Some("gres/gpu:1")
            );
        }
        assert_eq!(d.msg.pn_min_memory, 4096 | (1 << 63));
        assert_eq!(d.msg.ntasks_per_node, 2);
        let both = BatchJob {
            mem_per_node_mb: Some(1),
            ..job.clone()
        };
        assert!(batch_desc(&both)
            .unwrap_err()
            .to_string()
            .contains("not both"));
        assert_eq!(d.msg.shared, slurm_sys::JOB_SHARED_NONE as u16);
        assert_eq!(d.msg.spank_job_env_size, 1);
        unsafe {
            assert_eq!(
                opt_string(*d.msg.spank_job_env).as_deref(),
                Some("BFTRAINER_ELASTIC=1:1")
            );
        }
        unsafe {
            assert_eq!(opt_string(d.msg.partition).as_deref(), Some("elastic"));
            assert_eq!(opt_string(d.msg.req_nodes).as_deref(), Some("n[1-2]"));
            assert_eq!(opt_string(d.msg.work_dir).as_deref(), Some("/tmp"));
            assert_eq!(opt_string(*d.msg.environment).as_deref(), Some("K=V"));
            assert!((*d.msg.environment.add(1)).is_null());
            assert_eq!(opt_string(*d.msg.argv.add(1)).as_deref(), Some("a1"));
        }
        assert_eq!(
            (d.msg.min_nodes, d.msg.max_nodes, d.msg.time_limit),
            (2, 3, 5)
        );
        assert_eq!(
            (d.msg.user_id, d.msg.group_id, d.msg.priority, d.msg.requeue),
            (1234, 99, 0, 1)
        );
        assert_eq!((d.msg.env_size, d.msg.argc), (1, 2));
        // Unset fields keep Slurm's "unset" markers from slurm_init_job_desc_msg.
        assert_eq!(d.msg.num_tasks, slurm_sys::NO_VAL);
    }

    #[test]
    fn empty_update_is_refused() {
        let s = Slurm { _initialised: () };
        let e = s.update_job(1, &JobUpdate::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }));
        let e = s.signal_job(1, 0, SignalTarget::Everything).unwrap_err();
        assert!(e.to_string().contains("signal"));
    }
}
