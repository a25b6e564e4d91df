//! The admission gate of a core job's batch step: asks slurmctld, as the job's user,
//! whether bftrainerd admitted this start, and if not requeues the job held for it.
//!
//! Slurm calls no plugin on a requeue, so a core job requeued while bftrainerd is down
//! starts again by itself once its BeginTime passes, on nodes bftrainerd did not
//! choose. The decision ([`spec::unadmitted`]) is the one bft-run makes as the script;
//! here it is made before any script runs, whatever the script is. Every call is one
//! of Slurm's RPCs, bounded by Slurm's own MessageTimeout; any failure is returned for
//! the hook to log, and the script then runs, as it did before the check existed.

use std::ffi::{c_int, CString};

use bftrainer_core::spec;
use bftrainer_plugin_common as common;
use slurm_sys as sys;

/// Owns a job_info_msg_t from slurm_load_job.
struct JobMsg(*mut sys::job_info_msg_t);

impl Drop for JobMsg {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the message came from slurm_load_job and is freed once.
            unsafe { sys::slurm_free_job_info_msg(self.0) };
        }
    }
}

/// The fields of the job's record the decision reads. Comment is the owner's to write:
/// it is read only through the shared parsers in [`spec`].
struct Seen {
    admin_comment: Option<String>,
    comment: Option<String>,
    restarts: u16,
    start: Option<i64>,
    /// The job is running: this start is still its current one.
    running: bool,
}

fn clear_errno() {
    // SAFETY: writes this thread's errno.
    unsafe { *libc::__errno_location() = 0 };
}

/// `call` failed with `rc`: Slurm's text for the errno it left.
fn failed(call: &str, rc: c_int) -> String {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: slurm_strerror returns NULL or a static NUL-terminated string.
    let text = unsafe { common::bytes(sys::slurm_strerror(errno)) }
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_else(|| "unknown error".into());
    format!("{call} returned {rc}: {text} (errno {errno})")
}

fn text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: p is NULL or a NUL-terminated string inside the live message.
    unsafe { common::bytes(p) }.map(|b| String::from_utf8_lossy(b).into_owned())
}

fn load(job_id: u32) -> Result<Seen, String> {
    let mut msg = JobMsg(std::ptr::null_mut());
    clear_errno();
    // SAFETY: msg.0 receives a message that the guard frees.
    let rc = unsafe { sys::compat::load_job(&mut msg.0, job_id, sys::SHOW_ALL as u16) };
    if rc != sys::SLURM_SUCCESS as c_int {
        return Err(failed("slurm_load_job", rc));
    }
    // SAFETY: NULL or the message slurm_load_job returned, alive until msg drops.
    let Some(m) = (unsafe { msg.0.as_ref() }) else {
        return Err("slurm_load_job returned no message".into());
    };
    let records = if m.job_array.is_null() {
        &[][..]
    } else {
        // SAFETY: the message holds record_count records at job_array.
        unsafe { std::slice::from_raw_parts(m.job_array, m.record_count as usize) }
    };
    let j = records
        .iter()
        .find(|j| j.job_id == job_id)
        .ok_or_else(|| format!("slurm_load_job returned no record of job {job_id}"))?;
    Ok(Seen {
        admin_comment: text(j.admin_comment),
        comment: text(j.comment),
        restarts: j.restart_cnt,
        start: (j.start_time != 0).then_some(j.start_time),
        running: j.job_state & sys::JOB_STATE_BASE == sys::JOB_RUNNING,
    })
}

/// Writes the unadmitted note into the job's Comment and requeues it held, in the
/// order bft-run does (the note first, so bftrainerd never sees the hold without it).
fn requeue_held(job_id: u32, restarts: u16, seen_comment: Option<&str>) -> Result<(), String> {
    set_comment(job_id, &spec::unadmitted_note(restarts))?;
    clear_errno();
    // SAFETY: plain values.
    let rc = unsafe { sys::compat::requeue(job_id, sys::JOB_REQUEUE_HOLD as u32) };
    if rc != sys::SLURM_SUCCESS as c_int {
        let why = failed("slurm_requeue (hold)", rc);
        // Requeued by someone else since the lookup (Slurm refuses a pending job): the
        // note must not turn their requeue into an "admit me" for bftrainerd.
        let restored = match set_comment(job_id, seen_comment.unwrap_or("")) {
            Ok(()) => "its Comment restored".to_string(),
            Err(e) => format!("its Comment not restored: {e}"),
        };
        return Err(format!("{why}; {restored}"));
    }
    Ok(())
}

/// Sets the job's Comment (as the job's user: the owner may).
fn set_comment(job_id: u32, comment: &str) -> Result<(), String> {
    let text = CString::new(comment).map_err(|_| "a Comment with a NUL byte".to_string())?;
    let mut desc: sys::job_desc_msg_t = Default::default();
    // SAFETY: fills a caller-owned struct with Slurm's "unset" values.
    unsafe { sys::slurm_init_job_desc_msg(&mut desc) };
    sys::compat::set_job_desc_job_id(&mut desc, job_id);
    desc.comment = text.as_ptr().cast_mut();
    clear_errno();
    // SAFETY: desc and the text it points to live across the call; Slurm only reads them.
    let rc = unsafe { sys::slurm_update_job(&mut desc) };
    if rc != sys::SLURM_SUCCESS as c_int {
        return Err(failed("slurm_update_job (Comment)", rc));
    }
    Ok(())
}

/// Checks the start of core job `job_id` that this batch step is: `Ok(None)` when
/// bftrainerd admitted it (the script runs), `Ok(Some(run))` when it did not and the job
/// is now requeued held with the note for Slurm's run (restart count) `run` (the script
/// must not run), `Err` when the check or the requeue failed.
pub fn unadmitted_start_requeued(job_id: u32) -> Result<Option<u16>, String> {
    let seen = load(job_id)?;
    if !spec::unadmitted(
        seen.admin_comment.as_deref(),
        seen.comment.as_deref(),
        seen.restarts,
        seen.start,
        seen.running,
    ) {
        return Ok(None);
    }
    requeue_held(job_id, seen.restarts, seen.comment.as_deref())?;
    Ok(Some(seen.restarts))
}
