//! Pure engine of BFTrainer for Slurm: model, elastic-spec grammar, allocator and
//! replay simulator. No I/O, no clock, no Slurm: time is passed in, so the daemon and
//! the simulator drive exactly the same code.

pub mod alloc;
pub mod spec;
