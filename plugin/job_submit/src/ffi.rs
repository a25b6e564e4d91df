//! The exported job_submit/bftrainer symbols (the contract of the Slurm release built
//! against: 22.05, 24.11 or 26.05) and the copying of fields between Slurm's structs
//! and the pure policy. Everything enters through guard().
//!
//! Compiled out of unit tests: these symbols only resolve inside slurmctld.
//!
//! Threads: from 23.02 slurmctld may run job_submit/job_modify of different RPCs at
//! once. All shared state is behind a Mutex (STATE, STATS) or a OnceLock; no lock is
//! held while another is taken, none across a call into Slurm other than its logger
//! and allocator (which take only their own locks), and a poisoned lock is recovered
//! (the data is whole: every write is a single assignment).

#![allow(non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use bftrainer_plugin_common::{self as common, guard, Logger, SLURM_ERROR, SLURM_SUCCESS};
use slurm_sys::job_desc_msg_t;

use crate::config::{self, Policy};
use crate::policy::{self, Code, Modification, ModifyDenied, Submission, Verdict};
use crate::stats::STATS;

#[no_mangle]
pub static plugin_name: [u8; 36] = *b"BFTrainer elastic job submit plugin\0";
#[no_mangle]
pub static plugin_type: [u8; 21] = *b"job_submit/bftrainer\0";
/// Slurm loads a job_submit plugin only if this equals its own SLURM_VERSION_NUMBER,
/// micro version included, so it comes from the headers we were built against.
#[no_mangle]
pub static plugin_version: u32 = slurm_sys::SLURM_VERSION_NUMBER;

const LOG: Logger = Logger("job_submit/bftrainer");

/// Slurm's JOB_MAGIC (src/slurmctld/slurmctld.h up to 23.11, src/common/job_record.h
/// from 24.05; the same value in 22.05, 24.11, 26.05): checked before trusting the
/// layout.
const JOB_MAGIC: u32 = 0xf0b7_392c;

/// The first fields of slurmctld's private `struct job_record` (magic, account,
/// admin_comment), which the header marks "DO NOT ALPHABETIZE"; checked against
/// slurm-22-05-8-1's src/slurmctld/slurmctld.h and slurm-24-11-5-1's
/// src/common/job_record.h. Only admin_comment is read, and only after the magic
/// matches.
#[cfg(not(slurm_ge_25_11))]
#[repr(C)]
struct JobRecordPrefix {
    magic: u32,
    account: *mut c_char,
    admin_comment: *mut c_char,
}

/// From 25.11 (checked against the slurm-26.05 branch's src/common/job_record.h) the
/// record opens with `slurm_step_id_t step_id` ("DO NOT REORDER": slurmctld casts the
/// record to it), then magic, account, admin_comment. step_id.job_id names the job.
#[cfg(slurm_ge_25_11)]
#[repr(C)]
struct JobRecordPrefix {
    step_id: slurm_sys::slurm_step_id_t,
    magic: u32,
    account: *mut c_char,
    admin_comment: *mut c_char,
}

impl JobRecordPrefix {
    /// "job 42 (tagged '...')" where the record holds the id, else "the job tagged '...'".
    fn describe(&self, tag: &str) -> String {
        #[cfg(slurm_ge_25_11)]
        return format!("job {} (tagged '{tag}')", self.step_id.job_id);
        // 22.05 fills neither job_id nor job_id_str of the update for `scontrol
        // update`, and job_id sits deep in its private job record.
        #[cfg(not(slurm_ge_25_11))]
        return format!("the job tagged '{tag}'");
    }
}

/// Runs when slurmctld dlopens the plugin, before Slurm compares plugin_version with
/// its own (and so before a refused plugin could say why): logs a clear error when
/// the running Slurm is another release than the one this was built for. init() then
/// refuses, for the case Slurm's check lets through.
extern "C" fn on_load() {
    guard(LOG, "load", SLURM_ERROR, || {
        common::release_ok(LOG, slurm_sys::SLURM_VERSION_NUMBER_BUILT);
        SLURM_SUCCESS
    });
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

struct State {
    policy: Policy,
    /// slurm_conf.last_update when the policy was read: `scontrol reconfigure` bumps
    /// it, and 22.05 does not re-init job_submit plugins on reconfigure unless the
    /// plugin list changed, so the reload is triggered from here.
    conf_stamp: i64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    // A panic while holding the lock poisons it; the data is still a whole Policy.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// slurmctld's global configuration (public layout from slurm.h). The address is looked
/// up once: dlsym walks every loaded object, which costs microseconds per call.
fn slurm_conf() -> Option<&'static slurm_sys::slurm_conf_t> {
    static ADDR: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym on a NUL-terminated name.
    let p = *ADDR
        .get_or_init(|| unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"slurm_conf".as_ptr()) } as usize)
        as *const slurm_sys::slurm_conf_t;
    // SAFETY: inside slurmctld this is `slurm_conf_t slurm_conf`, which lives for the
    // whole process; its layout is the one of the headers we were built against.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn conf_stamp() -> i64 {
    slurm_conf().map(|c| c.last_update).unwrap_or(0)
}

fn config_path() -> std::path::PathBuf {
    let env = std::env::var("BFTRAINER_CONFIG").ok();
    let from_global = slurm_conf()
        // SAFETY: slurm_conf.slurm_conf is null or the path slurmctld read its config from.
        .and_then(|c| unsafe { common::bytes(c.slurm_conf) })
        .map(|b| std::path::PathBuf::from(String::from_utf8_lossy(b).into_owned()));
    let slurm_conf_path = std::env::var_os("SLURM_CONF")
        .map(std::path::PathBuf::from)
        .or(from_global);
    config::locate(env.as_deref(), slurm_conf_path.as_deref())
}

/// slurmctld's StateSaveLocation, where the last good policy is kept.
fn state_dir() -> Option<std::path::PathBuf> {
    slurm_conf()
        // SAFETY: state_save_location is null or slurmctld's configured path.
        .and_then(|c| unsafe { common::bytes(c.state_save_location) })
        .filter(|b| !b.is_empty())
        .map(|b| std::path::PathBuf::from(String::from_utf8_lossy(b).into_owned()))
}

/// The policy, falling back to the last good copy when the file is broken.
fn load() -> Result<(State, config::Loaded), config::ConfigError> {
    let path = config_path();
    let loaded = config::load_or_last_good(&path, state_dir().as_deref(), &config::uid_of)?;
    let st = State {
        policy: loaded.policy.clone(),
        conf_stamp: conf_stamp(),
    };
    if let Some(w) = &loaded.warning {
        LOG.error(&format!("{w}"));
    }
    Ok((st, loaded))
}

fn describe(p: &Policy) -> String {
    format!(
        "loaded {}: partition={} allowed_partitions=[{}] max_nodes={} daemon_user={} ({}) users={} accounts={} profiles={} exclusive={} hold={}",
        p.path.display(),
        p.partition,
        p.allowed_partitions.join(","),
        p.max_nodes.map(|n| n.to_string()).unwrap_or_else(|| "none".into()),
        p.daemon_user,
        p.daemon_uid,
        if p.allowed_users.is_empty() { "all".into() } else { p.allowed_users.join(",") },
        if p.allowed_accounts.is_empty() { "all".into() } else { p.allowed_accounts.join(",") },
        p.profiles.len(),
        p.exclusive,
        p.hold
    )
}

#[no_mangle]
pub extern "C" fn init() -> c_int {
    guard(LOG, "init", SLURM_ERROR, || {
        if !common::release_ok(LOG, slurm_sys::SLURM_VERSION_NUMBER_BUILT) {
            return SLURM_ERROR;
        }
        init_inner()
    })
}

fn init_inner() -> c_int {
    match load() {
        Ok((st, loaded)) => {
            if let Some(why) = loaded.fell_back {
                // From 23.11, `scontrol reconfigure` runs init() in a new slurmctld, and a
                // failed init() there is fatal: keep running on the last good policy.
                LOG.error(&format!(
                    "init: {why}; using the last policy that loaded on this controller (kept \
                     in StateSaveLocation) until the file is fixed and `scontrol reconfigure` is run"
                ));
            }
            LOG.info(&describe(&st.policy));
            *state() = Some(st);
            SLURM_SUCCESS
        }
        Err(e) => {
            LOG.error(&format!("init failed: {e}"));
            SLURM_ERROR
        }
    }
}

#[no_mangle]
pub extern "C" fn fini() -> c_int {
    guard(LOG, "fini", SLURM_ERROR, || {
        {
            let mut stats = STATS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = stats.take_summary() {
                LOG.info(&s);
            }
            stats.reset();
        }
        // Never both locks at once: no lock order to get wrong.
        *state() = None;
        SLURM_SUCCESS
    })
}

/// Re-reads the policy after `scontrol reconfigure`. A broken file keeps the previous
/// policy (slurmctld is already running; refusing every job would be worse).
fn refresh(st: &mut State) {
    let stamp = conf_stamp();
    if stamp == st.conf_stamp {
        return;
    }
    match load() {
        Ok((
            _,
            config::Loaded {
                fell_back: Some(why),
                ..
            },
        )) => {
            LOG.error(&format!("reconfigure: keeping the previous policy: {why}"));
            st.conf_stamp = stamp;
        }
        // slurmctld also bumps the stamp once right after start-up, so an unchanged
        // policy is only worth a verbose line.
        Ok((new, _)) if new.policy == st.policy => {
            LOG.verbose("reconfigure: policy unchanged");
            *st = new;
        }
        Ok((new, _)) => {
            LOG.info(&format!("reconfigure: {}", describe(&new.policy)));
            *st = new;
        }
        Err(e) => {
            LOG.error(&format!("reconfigure: keeping the previous policy: {e}"));
            st.conf_stamp = stamp;
        }
    }
}

fn code(c: Code) -> c_int {
    match c {
        Code::Invalid => SLURM_ERROR,
        Code::Denied => slurm_sys::ESLURM_ACCESS_DENIED as c_int,
        Code::Partition => slurm_sys::ESLURM_INVALID_PARTITION_NAME as c_int,
    }
}

/// # Safety
/// Called by slurmctld with a valid job_desc and err_msg (22.05 signature).
#[no_mangle]
pub unsafe extern "C" fn job_submit(
    job_desc: *mut job_desc_msg_t,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    guard(LOG, "job_submit", SLURM_ERROR, || {
        let started = Instant::now();
        // SAFETY: per the contract above.
        let rc = unsafe { submit_inner(job_desc, submit_uid, err_msg) };
        let ns = started.elapsed().as_nanos() as u64;
        let mut stats = STATS.lock().unwrap_or_else(|e| e.into_inner());
        stats.record(ns);
        if stats.due() {
            if let Some(line) = stats.take_summary() {
                LOG.info(&line);
            }
        }
        rc
    })
}

unsafe fn submit_inner(
    job_desc: *mut job_desc_msg_t,
    uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    let Some(jd) = (unsafe { job_desc.as_mut() }) else {
        LOG.error("job_submit called without a job description");
        return SLURM_ERROR;
    };
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        LOG.error("job_submit called before init succeeded");
        return SLURM_ERROR;
    };
    refresh(st);
    // SAFETY: the pointers are fields of a valid job_desc_msg_t owned by slurmctld.
    let verdict = unsafe {
        let sub = Submission {
            uid,
            account: common::bytes(jd.account),
            partition: common::bytes(jd.partition),
            min_nodes: jd.min_nodes,
            max_nodes: jd.max_nodes,
            admin_comment: common::bytes(jd.admin_comment),
            comment: common::bytes(jd.comment),
            array: common::bytes(jd.array_inx),
            het_offset: jd.het_job_offset,
            spank_env: common::string_array(jd.spank_job_env, jd.spank_job_env_size),
            environment: common::string_array(jd.environment, jd.env_size),
        };
        policy::submit(&st.policy, &sub)
    };
    match verdict {
        Verdict::Untouched => SLURM_SUCCESS,
        Verdict::Reject(msg, c) => {
            LOG.info(&format!("rejected a job of uid {uid}: {msg}"));
            // SAFETY: err_msg is Slurm's out-parameter (job_submit's contract).
            unsafe { tell_user(err_msg, &msg) };
            code(c)
        }
        Verdict::Elastic(r) => {
            // SAFETY: string fields of job_desc are xmalloc'd and owned by it.
            let applied = unsafe {
                common::set_field(&mut jd.partition, &r.partition)
                    .and_then(|()| common::set_field(&mut jd.admin_comment, &r.admin_comment))
                    .and_then(|()| match &r.comment {
                        Some(c) => common::set_field(&mut jd.comment, c),
                        None => Ok(()),
                    })
            };
            if let Err(e) = applied {
                LOG.error(&format!("cannot rewrite the job: {e}"));
                return SLURM_ERROR;
            }
            jd.min_nodes = r.nodes;
            jd.max_nodes = r.nodes;
            jd.requeue = u16::from(r.requeue);
            if let Some(p) = r.priority {
                jd.priority = p;
            }
            if let Some(s) = r.shared {
                jd.shared = s;
            }
            LOG.verbose(&format!(
                "elastic job of uid {uid}: partition={} nodes={} tag='{}'{}",
                r.partition,
                r.nodes,
                r.admin_comment,
                if r.priority == Some(0) {
                    " held for bftrainerd"
                } else {
                    ""
                }
            ));
            SLURM_SUCCESS
        }
    }
}

/// # Safety
/// Called by slurmctld with a valid job_desc and job record (22.05 signature: no
/// err_msg; src/slurmctld/job_submit.c).
#[cfg(not(slurm_ge_23_02))]
#[no_mangle]
pub unsafe extern "C" fn job_modify(
    job_desc: *mut job_desc_msg_t,
    job_ptr: *mut c_void,
    submit_uid: u32,
) -> c_int {
    guard(LOG, "job_modify", SLURM_ERROR, || {
        // SAFETY: per the contract above.
        unsafe { modify_inner(job_desc, job_ptr, submit_uid, std::ptr::null_mut()) }
    })
}

/// # Safety
/// Called by slurmctld with a valid job_desc, job record and err_msg (23.02 added
/// `char **err_msg`, which slurmctld xfrees and shows the user; the same in 24.11 and
/// 26.05's src/interfaces/job_submit.c).
#[cfg(slurm_ge_23_02)]
#[no_mangle]
pub unsafe extern "C" fn job_modify(
    job_desc: *mut job_desc_msg_t,
    job_ptr: *mut c_void,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    guard(LOG, "job_modify", SLURM_ERROR, || {
        // SAFETY: per the contract above.
        unsafe { modify_inner(job_desc, job_ptr, submit_uid, err_msg) }
    })
}

/// Hands `msg` to the user through Slurm's `err_msg` out-parameter (NULL: none).
///
/// # Safety
/// `err_msg` is NULL or Slurm's out-parameter, holding NULL or an xmalloc'd string.
unsafe fn tell_user(err_msg: *mut *mut c_char, msg: &str) {
    if err_msg.is_null() {
        return;
    }
    if let Some(p) = common::xstrdup(msg) {
        // SAFETY: per the contract above; Slurm xfrees what we put there.
        unsafe {
            common::xfree(&mut *err_msg);
            *err_msg = p;
        }
    }
}

unsafe fn modify_inner(
    job_desc: *mut job_desc_msg_t,
    job_ptr: *mut c_void,
    uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    let Some(jd) = (unsafe { job_desc.as_ref() }) else {
        return SLURM_SUCCESS;
    };
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        LOG.error("job_modify called before init succeeded");
        return SLURM_ERROR;
    };
    refresh(st);
    let record = job_ptr as *const JobRecordPrefix;
    // SAFETY: job_ptr is slurmctld's job_record_t; the prefix is read only after the
    // magic cookie confirms the layout.
    let (current, record) = unsafe {
        match record.as_ref() {
            Some(r) if r.magic == JOB_MAGIC => (common::bytes(r.admin_comment), Some(r)),
            Some(r) => {
                LOG.error(&format!("job_modify: job record magic {:#x} is not {JOB_MAGIC:#x}; not checking this update", r.magic));
                return SLURM_SUCCESS;
            }
            None => (None, None),
        }
    };
    // SAFETY: fields of a valid job_desc_msg_t.
    let m = unsafe {
        Modification {
            uid,
            current_admin_comment: current,
            admin_comment: common::bytes(jd.admin_comment),
            partition: common::bytes(jd.partition),
            min_nodes: jd.min_nodes,
            max_nodes: jd.max_nodes,
            priority: jd.priority,
            requeue: jd.requeue,
        }
    };
    match policy::modify(&st.policy, &m) {
        Ok(()) => SLURM_SUCCESS,
        Err(why) => {
            let (what, rc) = match why {
                ModifyDenied::Access(what) => (what, slurm_sys::ESLURM_ACCESS_DENIED as c_int),
                ModifyDenied::Partition => (
                    "moves an elastic job to a partition closed to elastic jobs",
                    slurm_sys::ESLURM_INVALID_PARTITION_NAME as c_int,
                ),
            };
            let tag = current
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            let job = match record {
                Some(r) => r.describe(&tag),
                None => format!("the job tagged '{tag}'"),
            };
            LOG.info(&format!(
                "refused an update by uid {uid} of {job}: it {what}"
            ));
            // SAFETY: err_msg is NULL (22.05) or Slurm's out-parameter.
            unsafe {
                tell_user(
                    err_msg,
                    &format!("job_submit/bftrainer: refused: this update {what}"),
                )
            };
            rc
        }
    }
}
