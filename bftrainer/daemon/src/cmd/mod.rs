//! One module per `bftrainer` subcommand; each exposes `Args` (clap) and `run`.

pub mod bench_alloc;
pub mod replay;
pub mod solve;
