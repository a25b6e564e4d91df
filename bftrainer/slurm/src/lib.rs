//! Safe layer over slurm-sys: every call frees what Slurm allocated, maps errors to
//! [`Error`] with `slurm_strerror` text, and returns plain owned Rust values.
//!
//! # Use
//! ```no_run
//! let slurm = bftrainer_slurm::Slurm::init()?;          // reads $SLURM_CONF once
//! let mut view = bftrainer_slurm::ClusterView::default();
//! let changed = view.refresh(&slurm)?;                   // 3 cheap RPCs when nothing changed
//! for n in view.nodes() { println!("{} {}", n.name, n.state.name()); }
//! # Ok::<(), bftrainer_slurm::Error>(())
//! ```
//!
//! # Threads
//! libslurm keeps one process-wide configuration, read by `slurm_init` from
//! `$SLURM_CONF` (or /etc/slurm/slurm.conf) the first time [`Slurm::init`] runs; it
//! cannot be switched to another cluster later in the same process, and `slurm_init`
//! calls `setenv`, so call `Slurm::init` once, early, before other threads read the
//! environment. After that, the controller calls (`load_*`, submit, update, signal,
//! cancel, requeue, will-run, hostlists) are safe from any thread concurrently: each
//! opens its own connection to slurmctld and keeps no state in the library, so
//! [`Slurm`] is `Copy + Send + Sync`. They block on the network: from tokio, run them
//! in `spawn_blocking`. A [`SlurmDb`] connection is one persistent socket to slurmdbd:
//! it is `Send` but not `Sync`, and its calls take `&mut self`.
//! Not handled: Slurm's configless mode (a readable slurm.conf is required) and a
//! slurm.conf that Slurm cannot parse (slurm_init then exits the process, as every
//! Slurm command does; [`Slurm::init`] checks that the file exists and is readable
//! first, so the common mistakes give an [`Error::Config`] instead).

mod db;
mod error;
mod ffi;
mod info;
pub mod munge;
mod ops;
mod priority;
mod state;
mod view;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use db::{AcctJob, AcctQuery, SlurmDb};
pub use error::{strerror, Error, Result};
pub use ffi::{hostlist_compress, hostlist_expand};
pub use info::{
    assign_partitions, gpu_count, gpu_entries, gpu_tres_request, gpus_of_type, gpus_per_node, Job,
    Jobs, Loaded, Node, Nodes, Partition, Partitions, Preemption,
};
pub use ops::{BatchJob, JobUpdate, SignalTarget, Submitted, WillRun};
pub use priority::{FairshareTable, PriorityWeights};
pub use state::{JobBase, JobState, NodeBase, NodeState, TimeLimit};
pub use view::{ClusterView, Refresh};

/// Proof that libslurm was initialised; every controller call goes through it.
#[derive(Clone, Copy, Debug)]
pub struct Slurm {
    _initialised: (),
}

/// The slurm.conf libslurm was initialised with, once it was.
static INIT: Mutex<Option<PathBuf>> = Mutex::new(None);

impl Slurm {
    /// Initialises libslurm once per process with `$SLURM_CONF`, else
    /// /etc/slurm/slurm.conf (`slurm_init(NULL)`). Later calls return a handle at once.
    /// Fails, and may be retried, if the configuration file is missing or unreadable.
    /// (The run-time libslurm matches the headers' ABI through its soname,
    /// libslurm.so.38 for 22.05, which the dynamic loader enforces.)
    pub fn init() -> Result<Slurm> {
        Self::init_inner(None)
    }

    /// As [`Slurm::init`] with an explicit slurm.conf (`slurm_init(path)`, which also
    /// sets `$SLURM_CONF` for the rest of the process). Fails if libslurm was already
    /// initialised with another file: one process talks to one cluster.
    pub fn init_with_config(path: &Path) -> Result<Slurm> {
        Self::init_inner(Some(path))
    }

    fn init_inner(path: Option<&Path>) -> Result<Slurm> {
        let mut done = INIT.lock().unwrap_or_else(|p| p.into_inner());
        let conf = path.map_or_else(config_path, Path::to_path_buf);
        if let Some(current) = done.as_ref() {
            if path.is_some() && current != &conf {
                return Err(Error::Config(format!(
                    "libslurm is already initialised with {}; one process talks to one \
                     cluster, so {} cannot be used",
                    current.display(),
                    conf.display()
                )));
            }
            return Ok(Slurm { _initialised: () });
        }
        if let Err(e) = std::fs::File::open(&conf) {
            return Err(Error::Config(format!(
                "cannot read {} ({e}); set SLURM_CONF to the cluster's slurm.conf \
                 (configless mode is not supported)",
                conf.display()
            )));
        }
        let c_path = match path {
            Some(p) => Some(
                p.to_str()
                    .and_then(|s| std::ffi::CString::new(s).ok())
                    .ok_or_else(|| {
                        Error::Config(format!("{} is not a valid C string path", p.display()))
                    })?,
            ),
            None => None,
        };
        log::debug!("slurm_init with {}", conf.display());
        // SAFETY: once per process (guarded by INIT); NULL means "use $SLURM_CONF";
        // c_path outlives the call.
        unsafe { slurm_sys::slurm_init(c_path.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) };
        *done = Some(conf);
        Ok(Slurm { _initialised: () })
    }
}

/// The slurm.conf libslurm will read: `$SLURM_CONF`, else Debian's default path.
pub fn config_path() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
}

/// SLURM_VERSION_NUMBER of the headers this crate was built against (0xMMmmuu).
pub const SLURM_VERSION: u32 = slurm_sys::SLURM_VERSION_NUMBER;

/// The Slurm release this crate was built against, e.g. "24.11.5".
pub fn built_release() -> String {
    slurm_sys::release::format(slurm_sys::SLURM_VERSION_NUMBER_BUILT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_threads_as_documented() {
        fn send_sync<T: Send + Sync + Copy>() {}
        fn send<T: Send>() {}
        send_sync::<Slurm>();
        send::<SlurmDb>();
    }

    #[test]
    fn missing_configuration_is_an_error_not_an_exit() {
        // Runs before any other test of this binary could call slurm_init for real:
        // unit tests never point SLURM_CONF at a readable file.
        std::env::set_var("SLURM_CONF", "/nonexistent/slurm.conf");
        let e = Slurm::init().unwrap_err();
        assert!(e.to_string().contains("/nonexistent/slurm.conf"), "{e}");
        assert!(e.to_string().contains("SLURM_CONF"), "{e}");
    }
}
