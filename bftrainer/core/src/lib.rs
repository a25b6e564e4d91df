//! Pure engine of BFTrainer for Slurm: model, elastic-spec grammar, allocator and
//! replay simulator. No I/O, no clock, no Slurm: time is passed in, so the daemon and
//! the simulator drive exactly the same code.

pub mod acct;
pub mod alloc;
pub mod config;
pub mod constraint;
pub mod easy;
pub mod engine;
pub mod error;
pub mod hostlist;
pub mod placement;
pub mod runtime;
pub mod sacct;
pub mod sim;
pub mod spankopt;
pub mod spec;
pub mod timefmt;
pub mod trace;

pub use error::{Error, Result};
