//! The crate's one error type: every failed libslurm call becomes `Error::Slurm` with
//! the errno Slurm reported and its `slurm_strerror` text.

use std::ffi::CStr;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to Slurm.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libslurm / libslurmdb call failed; `message` is `slurm_strerror(code)`.
    #[error("{call} failed: {message} (Slurm error {code})")]
    Slurm {
        /// The libslurm function that failed, e.g. `slurm_kill_job`.
        call: &'static str,
        /// Slurm's errno (an `ESLURM_*`, `SLURM_*` or plain errno value).
        code: i32,
        /// `slurm_strerror(code)`.
        message: String,
    },
    /// Slurm's configuration cannot be used (checked before `slurm_init`, which
    /// would otherwise exit the process on a missing file).
    #[error("Slurm configuration: {0}")]
    Config(String),
    /// An argument we refuse to send to Slurm; says what was wrong and what is allowed.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// The argument, e.g. `script`.
        what: &'static str,
        /// What was wrong with it and what is allowed.
        why: String,
    },
}

impl Error {
    /// Slurm's error code, for the `Slurm` variant.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::Slurm { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when Slurm said the job id does not exist (ESLURM_INVALID_JOB_ID).
    pub fn is_invalid_job_id(&self) -> bool {
        self.code() == Some(slurm_sys::ESLURM_INVALID_JOB_ID as i32)
    }

    /// True when the job already finished (ESLURM_ALREADY_DONE).
    pub fn is_already_done(&self) -> bool {
        self.code() == Some(slurm_sys::ESLURM_ALREADY_DONE as i32)
    }

    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Error {
        Error::InvalidArgument {
            what,
            why: why.into(),
        }
    }

    /// Builds the error for `code` with Slurm's own text.
    pub(crate) fn from_code(call: &'static str, code: i32) -> Error {
        Error::Slurm {
            call,
            code,
            message: strerror(code),
        }
    }
}

/// `slurm_strerror(code)` as an owned string; never fails.
pub fn strerror(code: i32) -> String {
    // SAFETY: slurm_strerror returns a pointer to a static table entry or to
    // strerror()'s buffer; we copy it at once. NULL is handled.
    unsafe {
        let p = slurm_sys::slurm_strerror(code);
        if p.is_null() {
            format!("unknown Slurm error {code}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// Clears errno before a call, so a failure that does not set it is not blamed on a
/// stale value from an earlier call on this thread.
pub(crate) fn clear_errno() {
    // SAFETY: errno is thread-local; writing it is always allowed.
    unsafe { *libc::__errno_location() = 0 };
}

/// The error of a call that returned `rc != SLURM_SUCCESS`. Most calls return -1 and
/// set errno; some return the error code itself.
pub(crate) fn last_error(call: &'static str, rc: i32) -> Error {
    // SAFETY: reads this thread's errno.
    let errno = unsafe { slurm_sys::slurm_get_errno() };
    let code = if errno != 0 {
        errno
    } else if rc > 0 {
        rc
    } else {
        slurm_sys::SLURM_ERROR
    };
    Error::from_code(call, code)
}

/// Maps a libslurm return code to `Ok(())` or the error Slurm reported.
pub(crate) fn check(call: &'static str, rc: i32) -> Result<()> {
    if rc == slurm_sys::SLURM_SUCCESS as i32 {
        Ok(())
    } else {
        Err(last_error(call, rc))
    }
}
