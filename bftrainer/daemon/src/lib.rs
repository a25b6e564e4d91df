//! bftrainerd and the `bftrainer` CLI: the Slurm observer/actuator around the pure
//! engine, and the offline tools (solve, bench-alloc, replay) that share it.

pub mod cmd;
pub mod daemon;
pub mod replay;
