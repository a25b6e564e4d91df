//! SPANK plugin `bftrainer`: adds `--elastic=MIN[:MAX][,key=value...]` to sbatch, salloc
//! and srun, checks it at the command line, and hands it to slurmctld and to bft-run.
//!
//! Local/allocator context: the option callback validates the value with the shared
//! grammar (errors print as `sbatch: error: --elastic=...: ...`), and init_post_opt puts
//! the canonical request into the job's SPANK environment (`BFTRAINER_ELASTIC`), where
//! job_submit/bftrainer finds it. Remote context (slurmstepd): the same request arrives
//! as the forwarded option (or the job environment for jobs bftrainerd submitted), and
//! user_init exports the `BFT_*` variables that bft-run reads. In a core job's batch
//! step, task_init (as the job's user, before the script runs) keeps a start that
//! bftrainerd did not admit from running: it requeues the job held for bftrainerd.

pub mod exports;

#[cfg(not(test))]
mod ffi;
#[cfg(not(test))]
mod gate;

#[cfg(all(bft_lazy_imports, not(test)))]
mod lazy_imports;
