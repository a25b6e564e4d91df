//! job_submit/bftrainer: routes `--elastic` jobs to the elastic partition, tags and holds
//! them for bftrainerd, enforces the admin's policy, and leaves every other job alone.
//!
//! `config`, `policy` and `watch` (reloads and NSS retries, off the hooks) are free of
//! Slurm and unit-tested; `ffi` is the thin Slurm-facing layer.

pub mod config;
pub mod policy;
pub mod stats;
pub mod watch;

#[cfg(not(test))]
mod ffi;
