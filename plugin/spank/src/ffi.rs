//! The exported SPANK symbols; every hook and the option callback go through guard().
//! Compiled out of unit tests: spank_* only resolve inside Slurm's commands and stepd.

#![allow(non_upper_case_globals)]

use std::ffi::{c_char, c_int, CStr};
use std::io::Write as _;
use std::sync::Mutex;

use bftrainer_core::spec::{self, ElasticSpec, Role};
use bftrainer_plugin_common::{self as common, guard, Level, Logger};
use slurm_sys as sys;

use crate::{exports, gate};

#[no_mangle]
pub static plugin_name: [u8; 10] = *b"bftrainer\0";
#[no_mangle]
pub static plugin_type: [u8; 6] = *b"spank\0";
#[no_mangle]
pub static plugin_version: u32 = sys::SLURM_VERSION_NUMBER;
#[no_mangle]
pub static spank_plugin_version: u32 = 0;

const LOG: Logger = Logger("spank/bftrainer");
const ERR: c_int = -1;
const OK: c_int = 0;

/// The request as given on this command line (local) or forwarded to this stepd
/// (remote); one process handles one job.
static REQUEST: Mutex<Option<ElasticSpec>> = Mutex::new(None);

const USAGE: &CStr = c"elastic job on MIN to MAX nodes, grown onto idle nodes and shrunk by bftrainerd; keys: up=SECONDS, down=SECONDS (rescale costs), profile=NAME (throughput curve). Example: --elastic=2:16,up=30";

/// Runs when the host (sbatch, srun, salloc, slurmstepd) dlopens the plugin, before
/// Slurm compares plugin_version's major.minor with its own and refuses a mismatch
/// with a terse line: says which releases differ and how to fix it. The hooks then
/// refuse too (slurm_spank_init), for a host that lets the plugin through.
extern "C" fn on_load() {
    guard(LOG, "load", ERR, || {
        common::release_ok(LOG, sys::SLURM_VERSION_NUMBER_BUILT);
        OK
    });
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

fn request() -> std::sync::MutexGuard<'static, Option<ElasticSpec>> {
    REQUEST.lock().unwrap_or_else(|e| e.into_inner())
}

fn context() -> sys::spank_context_t {
    // SAFETY: spank_context has no arguments and may be called from any hook.
    unsafe { sys::spank_context() }
}

extern "C" fn elastic_cb(_val: c_int, optarg: *const c_char, remote: c_int) -> c_int {
    guard(LOG, "--elastic", ERR, || {
        // SAFETY: Slurm passes the option's argument as a NUL-terminated string.
        let raw = unsafe { common::bytes(optarg) }.unwrap_or(b"");
        match spec::parse_bytes(raw) {
            Ok(s) => {
                *request() = Some(s);
                OK
            }
            Err(e) if remote == 0 => {
                // Shown to the user as `sbatch: error: --elastic=...: ...`: no plugin
                // prefix, the message names the option itself.
                common::log(Level::Error, &e.to_string());
                ERR
            }
            Err(e) => {
                // job_submit/bftrainer already accepted this job; do not kill its steps
                // over a request that only an edited environment can have broken.
                LOG.error(&format!("ignoring the forwarded elastic request: {e}"));
                OK
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn slurm_spank_init(sp: sys::spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard(LOG, "slurm_spank_init", ERR, || {
        if !common::release_ok(LOG, sys::SLURM_VERSION_NUMBER_BUILT) {
            return ERR;
        }
        let ctx = context();
        if ctx != sys::S_CTX_LOCAL && ctx != sys::S_CTX_ALLOCATOR && ctx != sys::S_CTX_REMOTE {
            return OK;
        }
        let mut opt = sys::spank_option {
            name: c"elastic".as_ptr() as *mut c_char,
            arginfo: c"MIN[:MAX][,key=value...]".as_ptr() as *mut c_char,
            usage: USAGE.as_ptr() as *mut c_char,
            has_arg: 1,
            val: 0,
            cb: Some(elastic_cb),
        };
        // SAFETY: Slurm copies the option (and its strings) during the call.
        let rc = unsafe { sys::spank_option_register(sp, &mut opt) };
        if rc != sys::ESPANK_SUCCESS as sys::spank_err_t {
            LOG.error(&format!("cannot register --elastic (spank error {rc})"));
            return ERR;
        }
        OK
    })
}

#[no_mangle]
pub extern "C" fn slurm_spank_init_post_opt(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guard(LOG, "slurm_spank_init_post_opt", ERR, || {
        let ctx = context();
        if ctx != sys::S_CTX_LOCAL && ctx != sys::S_CTX_ALLOCATOR {
            return OK;
        }
        let Some(spec) = request().clone() else {
            return OK;
        };
        let name = common::c_string(spec::JOB_ENV_NAME);
        let value = common::c_string(&spec.to_string());
        // SAFETY: valid handle and NUL-terminated strings, copied by Slurm.
        let rc = unsafe { sys::spank_job_control_setenv(sp, name.as_ptr(), value.as_ptr(), 1) };
        if rc != sys::ESPANK_SUCCESS as sys::spank_err_t {
            // srun inside an existing allocation starts a step, not a job: nothing to pass.
            LOG.verbose(&format!(
                "--elastic not passed to slurmctld here (spank error {rc})"
            ));
        }
        OK
    })
}

/// Remote side, as the job's user, before the tasks exec: export what bft-run needs.
#[no_mangle]
pub extern "C" fn slurm_spank_user_init(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guard(LOG, "slurm_spank_user_init", ERR, || {
        if context() != sys::S_CTX_REMOTE {
            return OK;
        }
        let spec = request().clone().or_else(|| from_job_env(sp));
        let Some(spec) = spec else {
            return OK;
        };
        let job_id = item_u32(sp, sys::S_JOB_ID).filter(|&j| j != 0);
        for (k, v) in exports::task_env(&spec, job_id) {
            let (k, v) = (common::c_string(k), common::c_string(&v));
            // SAFETY: valid handle and NUL-terminated strings, copied by Slurm.
            let rc = unsafe { sys::spank_setenv(sp, k.as_ptr(), v.as_ptr(), 1) };
            if rc != sys::ESPANK_SUCCESS as sys::spank_err_t {
                LOG.error(&format!("cannot export {k:?} (spank error {rc})"));
            }
        }
        OK
    })
}

/// Remote side, in the task that is about to exec the batch script of an elastic core
/// job: a start that bftrainerd did not admit (Slurm requeued the job while bftrainerd
/// was down and started it again by itself) is requeued held for bftrainerd to admit,
/// and the script does not run (`gate`). slurmstepd calls this hook in the forked task
/// after it has set the real and effective uid to the job's user, so the RPCs are the
/// user's own (only their own job can be read or requeued); the uid is checked anyway.
///
/// The script is kept from running by ending the task with status 0 here. Slurm's own
/// path for a `required` plugin whose task_init fails is `_exit(1)` at this same point
/// (exec_task in src/slurmd/slurmstepd/task.c, 22.05, 24.11 and 26.05): the task ends,
/// the stepd's launch succeeded, so the node is not drained (only a non-zero launch rc
/// in batch_finish drains it), and slurmctld ignores the exit status of a job it has
/// already requeued (COMPLETING). Ending it here does the same whether plugstack.conf
/// says `required` or `optional` (an error from an optional plugin is ignored and the
/// script would run), without logging a plugin failure. On any error the check is
/// logged and the script runs, as bft-run does when its own requeue fails.
#[no_mangle]
pub extern "C" fn slurm_spank_task_init(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guard(LOG, "slurm_spank_task_init", OK, || {
        if context() != sys::S_CTX_REMOTE
            || item_u32(sp, sys::S_JOB_STEPID) != Some(sys::SLURM_BATCH_SCRIPT)
        {
            return OK;
        }
        // The forwarded request decides only whether to look: the job's tag, which only
        // the plugin and privileged users write, decides whether it is a core (gate).
        let core = request()
            .clone()
            .or_else(|| from_job_env(sp))
            .is_some_and(|s| s.role == Role::Core);
        if !core {
            return OK;
        }
        let Some(job_id) = item_u32(sp, sys::S_JOB_ID).filter(|&j| j != 0) else {
            LOG.error("elastic core batch step without a job id: its admission is not checked");
            return OK;
        };
        // SAFETY: getuid and geteuid cannot fail.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        if item_u32(sp, sys::S_JOB_UID) != Some(uid) || euid != uid {
            LOG.error(&format!(
                "job {job_id}: the batch task runs as uid {uid} (effective {euid}), not as the job's user: bftrainerd's admission is not checked"
            ));
            return OK;
        }
        match gate::unadmitted_start_requeued(job_id) {
            Ok(None) => OK,
            Ok(Some(run)) => {
                let msg = format!(
                    "job {job_id} was started by Slurm without bftrainerd's admission (run {run}): requeued held until bftrainerd admits it; the batch script does not run for this start"
                );
                LOG.info(&msg);
                // The task's stderr is the job's: the owner reads why in its output.
                let _ = writeln!(std::io::stderr(), "spank/bftrainer: {msg}");
                // SAFETY: ends this forked task before it execs the script (see above);
                // nothing of the task's own needs flushing.
                unsafe { libc::_exit(0) }
            }
            Err(e) => {
                LOG.error(&format!(
                    "job {job_id}: cannot check or enforce bftrainerd's admission of this start ({e}); the batch script runs"
                ));
                OK
            }
        }
    })
}

/// A uint32_t (or uid_t) item of the step, when Slurm has it here.
fn item_u32(sp: sys::spank_t, item: sys::spank_item) -> Option<u32> {
    let mut v: u32 = 0;
    // SAFETY: the items asked for (S_JOB_ID, S_JOB_STEPID, S_JOB_UID) write one
    // uint32_t (uid_t is one) through the pointer.
    let rc = unsafe { sys::spank_get_item(sp, item, &mut v as *mut u32) };
    (rc == sys::ESPANK_SUCCESS as sys::spank_err_t).then_some(v)
}

/// Jobs that bftrainerd submits through the API carry the request only in their
/// environment (sbatch's copy of the SPANK job environment).
fn from_job_env(sp: sys::spank_t) -> Option<ElasticSpec> {
    let mut buf = vec![0 as c_char; spec::MAX_SPEC_LEN + 1];
    let name = common::c_string(spec::JOB_ENV_COPY);
    // SAFETY: buf is writable for its length; Slurm NUL-terminates within it.
    let rc = unsafe { sys::spank_getenv(sp, name.as_ptr(), buf.as_mut_ptr(), buf.len() as c_int) };
    if rc != sys::ESPANK_SUCCESS as sys::spank_err_t {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated string.
    let raw = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes();
    match spec::parse_bytes(raw) {
        Ok(s) => Some(s),
        Err(e) => {
            LOG.error(&format!(
                "ignoring the elastic request in the job environment: {e}"
            ));
            None
        }
    }
}
