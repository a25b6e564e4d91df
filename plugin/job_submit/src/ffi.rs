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
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bftrainer_plugin_common::{self as common, guard, Logger, SLURM_ERROR, SLURM_SUCCESS};
use slurm_sys::job_desc_msg_t;

use crate::config::{self, Policy};
use crate::policy::{self, Code, Modification, ModifyDenied, Submission, Verdict};
use crate::stats::STATS;
use crate::watch::Watch;

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

/// The policy the hooks use: an Arc swapped by init and the watcher thread, so a hook
/// only clones a pointer under the lock (no file, NSS or directory I/O while slurmctld
/// holds its job lock).
static POLICY: Mutex<Option<Arc<Policy>>> = Mutex::new(None);

fn policy_slot() -> MutexGuard<'static, Option<Arc<Policy>>> {
    // A panic while holding the lock poisons it; the data is still a whole Arc.
    POLICY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current policy, or `None` before init succeeded.
fn snapshot() -> Option<Arc<Policy>> {
    policy_slot().clone()
}

fn publish(mut p: Policy, slurm_uid: Option<u32>) {
    p.slurm_uid = slurm_uid;
    *policy_slot() = Some(Arc::new(p));
}

/// slurmctld's global configuration (public layout from slurm.h). The address is looked
/// up once: dlsym walks every loaded object, which costs microseconds per call.
fn slurm_conf_ptr() -> *const slurm_sys::slurm_conf_t {
    static ADDR: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym on a NUL-terminated name.
    *ADDR
        .get_or_init(|| unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"slurm_conf".as_ptr()) } as usize)
        as *const slurm_sys::slurm_conf_t
}

/// slurmctld's `bool validate_operator(uid_t)` (src/slurmctld/proc_req.c, exported by
/// slurmctld; 22.05 to 26.05): root, SlurmUser, or AdminLevel Operator or higher in the
/// association manager's cache (no RPC). `_update_job` calls it itself, with the same
/// locks held, just before job_modify, so calling it here adds no lock.
fn slurm_operator(uid: u32) -> bool {
    static ADDR: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym on a NUL-terminated name.
    let addr = *ADDR.get_or_init(|| {
        let a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"validate_operator".as_ptr()) } as usize;
        if a == 0 {
            LOG.error(
                "slurmctld exports no validate_operator: Slurm operators' holds of elastic jobs are not recorded (hold as root)",
            );
        }
        a
    });
    if addr == 0 {
        return false;
    }
    // SAFETY: the address is slurmctld's `extern bool validate_operator(uid_t uid)`.
    let f: extern "C" fn(libc::uid_t) -> bool = unsafe { std::mem::transmute(addr) };
    f(uid)
}

/// slurm_conf, for init() only: slurmctld rewrites its strings on reconfigure, so the
/// watcher thread never reads them (it reads the stamp alone, see conf_stamp).
fn slurm_conf() -> Option<&'static slurm_sys::slurm_conf_t> {
    let p = slurm_conf_ptr();
    // SAFETY: inside slurmctld this is `slurm_conf_t slurm_conf`, which lives for the
    // whole process; its layout is the one of the headers we were built against.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// slurm_conf.last_update: `scontrol reconfigure` bumps it. Read from the watcher
/// thread while slurmctld may write it: one aligned word, read volatile.
fn conf_stamp() -> i64 {
    let p = slurm_conf_ptr();
    if p.is_null() {
        return 0;
    }
    // SAFETY: p is slurmctld's live slurm_conf (see slurm_conf()).
    unsafe { std::ptr::addr_of!((*p).last_update).read_volatile() }
}

fn config_path() -> PathBuf {
    let env = std::env::var("BFTRAINER_CONFIG").ok();
    let from_global = slurm_conf()
        // SAFETY: slurm_conf.slurm_conf is null or the path slurmctld read its config from.
        .and_then(|c| unsafe { common::bytes(c.slurm_conf) })
        .map(|b| PathBuf::from(String::from_utf8_lossy(b).into_owned()));
    let slurm_conf_path = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .or(from_global);
    config::locate(env.as_deref(), slurm_conf_path.as_deref())
}

/// slurmctld's StateSaveLocation, where the last good policy is kept.
fn state_dir() -> Option<PathBuf> {
    slurm_conf()
        // SAFETY: state_save_location is null or slurmctld's configured path.
        .and_then(|c| unsafe { common::bytes(c.state_save_location) })
        .filter(|b| !b.is_empty())
        .map(|b| PathBuf::from(String::from_utf8_lossy(b).into_owned()))
}

/// How often the watcher looks at slurmctld's config stamp (and whether a retry of
/// names is due).
const TICK: Duration = Duration::from_secs(1);

/// The watcher thread and its stop flag; started by init(), stopped and joined by fini()
/// (Slurm unloads the .so after fini, so no thread may outlive it).
struct Watcher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: std::thread::JoinHandle<()>,
}

static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

fn start_watcher(mut w: Watch, slurm_uid: Option<u32>) -> std::io::Result<()> {
    stop_watcher();
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("bft_jobsubmit".into())
        .spawn(move || loop {
            {
                let (lock, cv) = &*flag;
                let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                let (stopped, _) = cv
                    .wait_timeout_while(stopped, TICK, |s| !*s)
                    .unwrap_or_else(|e| e.into_inner());
                if *stopped {
                    return;
                }
            }
            // A panic here is logged and the watcher carries on at the next tick.
            guard(LOG, "config watcher", SLURM_ERROR, || {
                if let Some(p) = w.tick(conf_stamp(), Instant::now()) {
                    publish(p, slurm_uid);
                }
                SLURM_SUCCESS
            });
        })?;
    *WATCHER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Watcher { stop, thread });
    Ok(())
}

fn stop_watcher() {
    let Some(w) = WATCHER.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    {
        let (lock, cv) = &*w.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
    if w.thread.join().is_err() {
        LOG.error("fini: the config watcher thread had panicked");
    }
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
    // slurmctld serves no RPC yet, so reading the file and asking NSS here blocks no
    // job; a name NSS cannot resolve is no error (Policy::unavailable).
    // A missing or broken file gives a policy that refuses elastic jobs: init() never
    // fails over it (that would stop slurmctld).
    let mut w = Watch::start(
        config_path(),
        state_dir(),
        config::uid_of,
        conf_stamp(),
        Instant::now(),
    );
    w.locate = Some(config_path);
    let slurm_uid = slurm_conf().map(|c| c.slurm_user_id);
    publish(w.policy().clone(), slurm_uid);
    if let Err(e) = start_watcher(w, slurm_uid) {
        // Without it the policy stays as loaded: no reload on reconfigure (22.05) and no
        // retry of names. Jobs still go through the policy; say so, do not fail.
        LOG.error(&format!(
            "init: cannot start the config watcher thread ({e}); `scontrol reconfigure` will not \
             re-read the policy and unresolved names are not retried until slurmctld restarts"
        ));
    }
    SLURM_SUCCESS
}

#[no_mangle]
pub extern "C" fn fini() -> c_int {
    guard(LOG, "fini", SLURM_ERROR, || {
        // Before anything else: the thread must be gone before Slurm unloads the code.
        stop_watcher();
        {
            let mut stats = STATS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = stats.take_summary() {
                LOG.info(&s);
            }
            stats.reset();
        }
        // Never two locks at once: no lock order to get wrong.
        *policy_slot() = None;
        SLURM_SUCCESS
    })
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
    let Some(pol) = snapshot() else {
        LOG.error("job_submit called before init succeeded");
        return SLURM_ERROR;
    };
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
        policy::submit(&pol, &sub)
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
                    .and_then(|()| match &r.qos {
                        Some(q) => common::set_field(&mut jd.qos, q),
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
                "elastic job of uid {uid}: partition={}{} nodes={} tag='{}'{}",
                r.partition,
                r.qos
                    .as_deref()
                    .map(|q| format!(" qos={q}"))
                    .unwrap_or_default(),
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
    let Some(jd) = (unsafe { job_desc.as_mut() }) else {
        return SLURM_SUCCESS;
    };
    let Some(pol) = snapshot() else {
        LOG.error("job_modify called before init succeeded");
        return SLURM_ERROR;
    };
    let record = job_ptr as *const JobRecordPrefix;
    // SAFETY: job_ptr is slurmctld's job_record_t; the prefix is read only after the
    // magic cookie confirms the layout.
    let (current, record) = unsafe {
        match record.as_ref() {
            Some(r) if r.magic == JOB_MAGIC => (common::bytes(r.admin_comment), Some(r)),
            Some(r) => {
                let verdict = policy::modify_unreadable(&pol, uid);
                let what = match &verdict {
                    Ok(()) => format!("letting privileged uid {uid} update the job unchecked"),
                    // Without the layout there is no tag to go by: this may be a satellite.
                    Err(_) => format!("refused an update by uid {uid}: its tag cannot be read"),
                };
                LOG.error(&format!(
                    "job_modify: job record magic {:#x} is not {JOB_MAGIC:#x} (a Slurm build \
                     this plugin does not know?); {what}",
                    r.magic
                ));
                return match verdict {
                    Ok(()) => SLURM_SUCCESS,
                    Err(ModifyDenied::Access(why)) => {
                        // err_msg is NULL (22.05) or Slurm's out-parameter (inside the
                        // unsafe block above).
                        tell_user(
                            err_msg,
                            &format!("job_submit/bftrainer: refused: this update {why}"),
                        );
                        slurm_sys::ESLURM_ACCESS_DENIED as c_int
                    }
                    Err(ModifyDenied::Partition) => slurm_sys::ESLURM_ACCESS_DENIED as c_int,
                };
            }
            None => (None, None),
        }
    };
    // SAFETY: fields of a valid job_desc_msg_t.
    // Asked only where it matters (an elastic job's update by someone not privileged
    // here), as Slurm asks it for every update anyway.
    let operator = current
        .is_some_and(|c| bftrainer_core::spec::looks_like_tag(&String::from_utf8_lossy(c)))
        && !pol.privileged(uid)
        && slurm_operator(uid);
    let m = unsafe {
        Modification {
            uid,
            operator,
            owner: jd.user_id,
            comment: common::bytes(jd.comment),
            current_admin_comment: current,
            admin_comment: common::bytes(jd.admin_comment),
            partition: common::bytes(jd.partition),
            account: common::bytes(jd.account),
            shared: jd.shared,
            min_nodes: jd.min_nodes,
            max_nodes: jd.max_nodes,
            req_nodes: common::bytes(jd.req_nodes),
            exc_nodes: common::bytes(jd.exc_nodes),
            priority: jd.priority,
            alloc_sid: jd.alloc_sid,
            requeue: jd.requeue,
            others: other_fields(jd),
        }
    };
    let verdict = policy::modify(&pol, &m);
    let tag = current
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    let job = match record {
        Some(r) => r.describe(&tag),
        None => format!("the job tagged '{tag}'"),
    };
    match verdict {
        Ok(edit) if edit.is_none() => SLURM_SUCCESS,
        Ok(edit) => {
            // SAFETY: string fields of job_desc are NULL or xmalloc'd and owned by it;
            // slurmctld applies them after this hook (_update_job, 22.05 to 26.05).
            let applied = unsafe {
                let admin = match (&edit.admin_comment, record) {
                    // Slurm lets only root, SlurmUser and AdminLevel Administrator set
                    // an admin comment (validate_super_user, checked again when the
                    // update is applied), so an operator's hold or release is written
                    // into the job record itself: job_modify runs under the job write
                    // lock, and the record's layout was checked above (magic).
                    (Some(c), Some(_)) if operator => {
                        let r = job_ptr as *mut JobRecordPrefix;
                        common::set_field(&mut (*r).admin_comment, c)
                    }
                    (Some(c), _) => common::set_field(&mut jd.admin_comment, c),
                    (None, _) => Ok(()),
                };
                admin.and_then(|()| match &edit.comment {
                    Some(c) => common::set_field(&mut jd.comment, c),
                    None => Ok(()),
                })
            };
            if let Err(e) = applied {
                LOG.error(&format!(
                    "job_modify: cannot rewrite the update of {job}: {e}"
                ));
                return SLURM_ERROR;
            }
            if edit.keep_held {
                jd.priority = NO_VAL;
            }
            LOG.info(&format!(
                "update by uid {uid} of {job}:{}{}{}",
                edit.admin_comment
                    .as_deref()
                    .map(|c| format!(" admin comment set to '{c}'"))
                    .unwrap_or_default(),
                edit.comment
                    .as_deref()
                    .map(|c| format!(" comment set to '{c}'"))
                    .unwrap_or_default(),
                if edit.keep_held {
                    " the release only lifts a hold: the job stays held until bftrainerd admits it"
                } else {
                    ""
                }
            ));
            SLURM_SUCCESS
        }
        Err(why) => {
            let (what, rc) = match why {
                ModifyDenied::Access(what) => (what, slurm_sys::ESLURM_ACCESS_DENIED as c_int),
                ModifyDenied::Partition => (
                    "moves an elastic job to a partition closed to elastic jobs".to_string(),
                    slurm_sys::ESLURM_INVALID_PARTITION_NAME as c_int,
                ),
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

const NO_VAL: u32 = slurm_sys::NO_VAL;
const NO_VAL16: u16 = slurm_sys::NO_VAL16 as u16;
const NO_VAL64: u64 = slurm_sys::NO_VAL64;
/// Bits of job_desc.bitflags that `_pack_job_desc_msg` sets on every message whose
/// account, partition, QOS or WCKey is NULL (22.05, 24.11, 26.05): not the user's.
const PACKED_FLAGS: u64 = slurm_sys::USE_DEFAULT_ACCT
    | slurm_sys::USE_DEFAULT_PART
    | slurm_sys::USE_DEFAULT_QOS
    | slurm_sys::USE_DEFAULT_WCKEY;

/// `scontrol` names of the fields an update sets beside those `Modification` has its
/// own member for, each compared with what slurm_init_job_desc_msg() leaves there (the
/// same in 22.05, 24.11 and 26.05: NULL, 0, NO_VAL, NO_VAL16 or NO_VAL64). The list is
/// every field slurmctld's `_update_job` acts on in those releases, less the job's
/// identity (job id, the user_id slurmctld fills in before calling us), fields
/// slurmctld computes itself (tres_req_cnt, licenses_tot), and job_size_str (24.11+,
/// sent only with min_nodes).
fn other_fields(jd: &job_desc_msg_t) -> Vec<&'static str> {
    let mut set: Vec<&'static str> = Vec::new();
    let mut add = |name: &'static str| {
        if !set.contains(&name) {
            set.push(name);
        }
    };
    macro_rules! strings {
        ($($field:ident => $name:literal),* $(,)?) => {
            $( if !jd.$field.is_null() { add($name); } )*
        };
    }
    macro_rules! values {
        ($($field:ident: $unset:expr => $name:literal),* $(,)?) => {
            $( if jd.$field != $unset { add($name); } )*
        };
    }
    strings! {
        name => "Name",
        account => "Account",
        qos => "QOS",
        comment => "Comment",
        reservation => "Reservation",
        features => "Features",
        prefer => "Prefer",
        cluster_features => "ClusterFeatures",
        clusters => "Clusters",
        dependency => "Dependency",
        licenses => "Licenses",
        wckey => "WCKey",
        work_dir => "WorkDir",
        std_out => "StdOut",
        std_err => "StdErr",
        std_in => "StdIn",
        mail_user => "MailUser",
        mcs_label => "MCSLabel",
        extra => "Extra",
        network => "Network",
        burst_buffer => "BurstBuffer",
        array_inx => "ArrayTaskThrottle",
        tres_per_job => "TresPerJob",
        tres_per_node => "TresPerNode",
        tres_per_socket => "TresPerSocket",
        tres_per_task => "TresPerTask",
        tres_bind => "TresBind",
        tres_freq => "TresFreq",
        cpus_per_tres => "CpusPerTres",
        mem_per_tres => "MemPerTres",
    }
    values! {
        time_limit: NO_VAL => "TimeLimit",
        time_min: NO_VAL => "TimeMin",
        begin_time: 0 => "StartTime",
        end_time: 0 => "EndTime",
        deadline: 0 => "Deadline",
        nice: NO_VAL => "Nice",
        site_factor: NO_VAL => "SiteFactor",
        num_tasks: NO_VAL => "NumTasks",
        min_cpus: NO_VAL => "NumCPUs",
        max_cpus: NO_VAL => "NumCPUs",
        pn_min_cpus: NO_VAL16 => "MinCPUsNode",
        pn_min_memory: NO_VAL64 => "MinMemory",
        pn_min_tmp_disk: NO_VAL => "MinTmpDiskNode",
        cpus_per_task: NO_VAL16 => "CPUsPerTask",
        ntasks_per_node: NO_VAL16 => "NTasksPerNode",
        ntasks_per_socket: NO_VAL16 => "NTasksPerSocket",
        ntasks_per_tres: NO_VAL16 => "NTasksPerTRES",
        sockets_per_node: NO_VAL16 => "ReqSockets",
        cores_per_socket: NO_VAL16 => "ReqCores",
        threads_per_core: NO_VAL16 => "ReqThreads",
        core_spec: NO_VAL16 => "CoreSpec",
        contiguous: NO_VAL16 => "Contiguous",
        shared: NO_VAL16 => "OverSubscribe",
        reboot: NO_VAL16 => "Reboot",
        mail_type: NO_VAL16 => "MailType",
        delay_boot: NO_VAL => "DelayBoot",
        req_switch: NO_VAL => "Switches",
        wait4switch: NO_VAL => "Switches",
        fed_siblings_viable: 0 => "FedSiblings",
    }
    // libslurm's pack sets USE_DEFAULT_* on every message without those strings.
    if jd.bitflags & !PACKED_FLAGS != 0 {
        add("Flags");
    }
    set
}
