//! One module per `bftrainer` subcommand; each exposes `Args` (clap) and `run`.

pub mod acct;
pub mod bench_alloc;
pub mod ctl;
pub mod replay;
pub mod solve;
