//! The exported SPANK symbols; every hook and the option callback go through guard().
//! Compiled out of unit tests: spank_* only resolve inside Slurm's commands and stepd.

#![allow(non_upper_case_globals)]

use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

use bftrainer_core::spec::{self, ElasticSpec};
use bftrainer_plugin_common::{self as common, guard, Level, Logger};
use slurm_sys as sys;

use crate::exports;

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
        let mut job_id: u32 = 0;
        // SAFETY: S_JOB_ID writes one uint32_t through the pointer.
        let rc = unsafe { sys::spank_get_item(sp, sys::S_JOB_ID, &mut job_id as *mut u32) };
        let job_id =
            (rc == sys::ESPANK_SUCCESS as sys::spank_err_t && job_id != 0).then_some(job_id);
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
