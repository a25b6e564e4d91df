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
    /// slurmctld runs another Slurm release than the libslurm this was built against
    /// (the message names both and how to fix it).
    #[error("{0}")]
    Release(String),
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

    /// True when slurmctld could not read our messages or we its: it runs another
    /// release (the message says so).
    pub fn is_protocol_error(&self) -> bool {
        self.code().is_some_and(is_protocol_error)
    }

    /// True when the call failed on the way to or from slurmctld (connection, send,
    /// receive, socket timeouts, slurmctld in standby or shutting down): nobody's job
    /// or node is at fault, and the same call may work on the next try.
    pub fn is_unreachable(&self) -> bool {
        let Some(c) = self.code() else {
            return false;
        };
        let comm = [
            slurm_sys::SLURM_COMMUNICATIONS_CONNECTION_ERROR,
            slurm_sys::SLURM_COMMUNICATIONS_SEND_ERROR,
            slurm_sys::SLURM_COMMUNICATIONS_RECEIVE_ERROR,
            slurm_sys::SLURM_COMMUNICATIONS_SHUTDOWN_ERROR,
            slurm_sys::SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR,
            slurm_sys::SLURMCTLD_COMMUNICATIONS_SEND_ERROR,
            slurm_sys::SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR,
            slurm_sys::SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR,
            slurm_sys::ESLURM_IN_STANDBY_MODE,
        ];
        comm.iter().any(|&x| x as i32 == c)
            // The socket layer's codes (5000-5099: zero-length reads, timeouts ...).
            || (5000..5100).contains(&c)
            || [libc::ETIMEDOUT, libc::ECONNREFUSED, libc::ECONNRESET, libc::EAGAIN, libc::EINTR]
                .contains(&c)
    }

    /// True when Slurm refused a request for a reason of the whole cluster or of its
    /// configuration, not of the job that made it: no job may be charged for it (it
    /// would refuse any job's request alike). MaxJobCount reached and a busy slurmctld
    /// (EAGAIN), a partition that is missing, down, drained or inactive, submissions
    /// disabled, slurmdbd unreachable, a requested node outside the partition (the
    /// partitions' config), nodes or ports busy. Every other refusal (the job's limits,
    /// QOS, account, time limit, GRES, features) is the request's.
    pub fn is_cluster_wide(&self) -> bool {
        self.code().is_some_and(is_cluster_wide)
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

    /// Builds the error for `code` with Slurm's own text, plus what a protocol error
    /// usually means (a controller of another release).
    pub(crate) fn from_code(call: &'static str, code: i32) -> Error {
        let mut message = strerror(code);
        if let Some(hint) = protocol_hint(code, slurm_sys::SLURM_VERSION_NUMBER_BUILT) {
            message = format!("{message}; {hint}");
        }
        Error::Slurm {
            call,
            code,
            message,
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

/// The codes of [`Error::is_cluster_wide`].
fn is_cluster_wide(code: i32) -> bool {
    [
        slurm_sys::ESLURM_INVALID_PARTITION_NAME,
        slurm_sys::ESLURM_REQUESTED_NODES_NOT_IN_PARTITION,
        slurm_sys::ESLURM_PARTITION_NOT_AVAIL,
        slurm_sys::ESLURM_PARTITION_DOWN,
        slurm_sys::ESLURM_SUBMISSIONS_DISABLED,
        slurm_sys::ESLURM_DISABLED,
        slurm_sys::ESLURM_NODES_BUSY,
        slurm_sys::ESLURM_PORTS_BUSY,
        slurm_sys::ESLURM_REBOOT_IN_PROGRESS,
        slurm_sys::ESLURM_IN_STANDBY_MODE,
        slurm_sys::ESLURM_IN_STANDBY_USE_BACKUP,
        slurm_sys::ESLURM_DB_CONNECTION,
        slurm_sys::ESLURM_DB_CONNECTION_INVALID,
    ]
    .iter()
    .any(|&c| c as i32 == code)
        // MaxJobCount reached (slurmctld's _job_create answers EAGAIN), or slurmctld
        // too busy to take the job.
        || code == libc::EAGAIN
}

/// Slurm's codes for a message the other side could not read: what a client and a
/// slurmctld more than two releases apart get (or one built for a release that
/// changed the wire format within the protocol version window). "Unexpected message"
/// is what a 22.05 libslurm gets from a 24.11 slurmctld (measured): its auth plugin,
/// loaded from the cluster's PluginDir, is of the other release and refuses to load.
fn is_protocol_error(code: i32) -> bool {
    [
        slurm_sys::SLURM_PROTOCOL_VERSION_ERROR,
        slurm_sys::ESLURM_PROTOCOL_INCOMPLETE_PACKET,
        slurm_sys::SLURM_UNEXPECTED_MSG_ERROR,
    ]
    .iter()
    .any(|&c| c as i32 == code)
}

/// For a protocol error: names the release we were built for and the fix.
pub(crate) fn protocol_hint(code: i32, built: u32) -> Option<String> {
    is_protocol_error(code).then(|| {
        format!(
            "slurmctld does not speak the protocol of Slurm {} that this program was built \
             against: it runs another release; rebuild with `make install` against the \
             running release",
            slurm_sys::release::format(built)
        )
    })
}

/// Compares the release slurmctld reports (slurm_conf_t.version, e.g. "24.11.5") with
/// the one we were built against; `Err` names both when the major.minor differ (the
/// micro may differ: the protocol and the structs are those of the release series).
pub(crate) fn check_release(built: u32, controller: &str) -> Result<(), String> {
    let Some(running) = slurm_sys::release::parse(controller) else {
        return Err(format!(
            "slurmctld reports the version `{controller}`, which is not MAJOR.MINOR.MICRO; \
             this program was built against Slurm {}",
            slurm_sys::release::format(built)
        ));
    };
    if slurm_sys::release::same_series(built, running) {
        return Ok(());
    }
    Err(format!(
        "slurmctld runs Slurm {}, but this program was built against Slurm {} (libslurm of \
         {}): rebuild with `make install` against the running release {}",
        slurm_sys::release::format(running),
        slurm_sys::release::format(built),
        slurm_sys::release::series(built),
        slurm_sys::release::series(running),
    ))
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
    let errno = slurm_sys::compat::errno();
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

#[cfg(test)]
mod tests {
    use super::*;

    const V22_05_8: u32 = 0x16_05_08;

    #[test]
    fn same_series_passes_whatever_the_micro() {
        assert_eq!(check_release(V22_05_8, "22.05.8"), Ok(()));
        assert_eq!(check_release(V22_05_8, "22.05.11"), Ok(()));
    }

    #[test]
    fn another_series_names_both_releases_and_the_fix() {
        let e = check_release(V22_05_8, "24.11.5").unwrap_err();
        assert!(e.contains("slurmctld runs Slurm 24.11.5"), "{e}");
        assert!(e.contains("built against Slurm 22.05.8"), "{e}");
        assert!(e.contains("make install"), "{e}");
        let e = check_release(0x1a_05_05, "25.11.1").unwrap_err();
        assert!(e.contains("25.11.1") && e.contains("26.05.5"), "{e}");
    }

    #[test]
    fn unparsable_versions_are_refused_with_ours_named() {
        let e = check_release(V22_05_8, "garbage").unwrap_err();
        assert!(e.contains("`garbage`") && e.contains("22.05.8"), "{e}");
    }

    #[test]
    fn refusals_of_the_cluster_are_told_from_the_jobs_own() {
        let e = |c: u32| Error::from_code("slurm_submit_batch_job", c as i32);
        for c in [
            slurm_sys::ESLURM_INVALID_PARTITION_NAME,
            slurm_sys::ESLURM_PARTITION_NOT_AVAIL,
            slurm_sys::ESLURM_PARTITION_DOWN,
            slurm_sys::ESLURM_SUBMISSIONS_DISABLED,
            slurm_sys::ESLURM_DB_CONNECTION,
            slurm_sys::ESLURM_REQUESTED_NODES_NOT_IN_PARTITION,
            libc::EAGAIN as u32,
        ] {
            assert!(e(c).is_cluster_wide(), "{}", e(c));
        }
        // The job's own: its limits, QOS, account, time limit, GRES.
        for c in [
            slurm_sys::ESLURM_ACCOUNTING_POLICY,
            slurm_sys::ESLURM_INVALID_QOS,
            slurm_sys::ESLURM_INVALID_ACCOUNT,
            slurm_sys::ESLURM_INVALID_TIME_LIMIT,
            slurm_sys::ESLURM_INVALID_GRES,
            slurm_sys::ESLURM_QOS_THRES,
            slurm_sys::ESLURM_ACCESS_DENIED,
            slurm_sys::ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE,
        ] {
            assert!(!e(c).is_cluster_wide(), "{}", e(c));
        }
        assert!(!Error::invalid("script", "empty").is_cluster_wide());
    }

    #[test]
    fn protocol_errors_get_the_release_hint() {
        let code = slurm_sys::SLURM_PROTOCOL_VERSION_ERROR as i32;
        let hint = protocol_hint(code, 0x18_0b_05).unwrap();
        assert!(
            hint.contains("Slurm 24.11.5") && hint.contains("make install"),
            "{hint}"
        );
        assert_eq!(
            protocol_hint(slurm_sys::ESLURM_INVALID_JOB_ID as i32, 0x18_0b_05),
            None
        );
        let e = Error::from_code("slurm_load_ctl_conf", code);
        assert!(e.to_string().contains("another release"), "{e}");
    }
}
