//! The one trait over the cluster at the daemon's edge: the real one talks to
//! slurmctld through bftrainer-slurm; the benchmark uses a generated one. Correctness
//! tests always use real Slurm.

use bftrainer_slurm::{
    BatchJob, ClusterView, FairshareTable, Job, JobUpdate, Node, Partition, PriorityWeights,
    Refresh, SignalTarget, Slurm,
};

pub type Result<T> = std::result::Result<T, bftrainer_slurm::Error>;

pub trait Cluster {
    /// Reloads what changed; `full_jobs` forces a full job load (backfill plan).
    fn refresh(&mut self, full_jobs: bool) -> Result<Refresh>;
    fn nodes(&self) -> &[Node];
    fn partitions(&self) -> &[Partition];
    fn jobs(&self) -> &[Job];
    fn submit(&mut self, job: &BatchJob) -> Result<u32>;
    fn update(&mut self, job_id: u32, update: &JobUpdate) -> Result<()>;
    /// Holds a core job. `tag` is its admin comment as the daemon read it, sent back in
    /// the same update: job_submit/bftrainer takes that for bftrainerd's own hold, where
    /// any other privileged hold is an administrator's (docs/admin.md, "Holds").
    fn hold(&mut self, job_id: u32, tag: &str) -> Result<()>;
    /// Releases a held core job, with the same marker as [`Cluster::hold`], and sets its
    /// Comment to `comment` in the same update (bftrainerd's admission note, which
    /// bft-run checks as the job starts: [`bftrainer_core::spec::admitted_note`]).
    fn release(&mut self, job_id: u32, tag: &str, comment: &str) -> Result<()>;
    fn signal(&mut self, job_id: u32, signal: i32, target: SignalTarget) -> Result<()>;
    fn cancel(&mut self, job_id: u32) -> Result<()>;
    fn requeue(&mut self, job_id: u32, hold: bool) -> Result<()>;
    /// A host expression for `names` ("n[1-3]").
    fn compress(&self, names: &[String]) -> String;
    /// The names of a host expression.
    fn expand(&self, expr: &str) -> Vec<String>;
    /// Slurm's priority weights and the fairshare factors and QOS priorities now.
    fn priority_inputs(&mut self) -> Result<(PriorityWeights, FairshareTable)>;
    /// Whether nodes are read with the GRES they have in use (`Node::gres_used`, which
    /// GPU lending needs); off by default.
    fn set_node_detail(&mut self, _on: bool) {}
    /// slurmctld's PreemptType and global PreemptMode now; an error: unknown now.
    fn preemption(&mut self) -> Result<bftrainer_slurm::Preemption>;
}

/// slurmctld through libslurm.
#[derive(Debug)]
pub struct SlurmCluster {
    slurm: Slurm,
    view: ClusterView,
}

impl SlurmCluster {
    pub fn new(slurm: Slurm) -> Self {
        SlurmCluster {
            slurm,
            view: ClusterView::default(),
        }
    }
}

impl Cluster for SlurmCluster {
    fn refresh(&mut self, full_jobs: bool) -> Result<Refresh> {
        self.view.refresh_with(&self.slurm, full_jobs)
    }
    fn set_node_detail(&mut self, on: bool) {
        self.view.set_node_detail(on);
    }
    fn nodes(&self) -> &[Node] {
        self.view.nodes()
    }
    fn partitions(&self) -> &[Partition] {
        self.view.partitions()
    }
    fn jobs(&self) -> &[Job] {
        self.view.jobs()
    }
    fn submit(&mut self, job: &BatchJob) -> Result<u32> {
        self.slurm.submit_batch(job).map(|s| s.job_id)
    }
    fn update(&mut self, job_id: u32, update: &JobUpdate) -> Result<()> {
        self.slurm.update_job(job_id, update)
    }
    fn hold(&mut self, job_id: u32, tag: &str) -> Result<()> {
        self.slurm.update_job(job_id, &marked(0, tag))
    }
    fn release(&mut self, job_id: u32, tag: &str, comment: &str) -> Result<()> {
        let up = JobUpdate {
            comment: Some(comment.to_string()),
            ..marked(INFINITE, tag)
        };
        self.slurm.update_job(job_id, &up)
    }
    fn signal(&mut self, job_id: u32, signal: i32, target: SignalTarget) -> Result<()> {
        self.slurm.signal_job(job_id, signal, target)
    }
    fn cancel(&mut self, job_id: u32) -> Result<()> {
        self.slurm.cancel_job(job_id)
    }
    fn requeue(&mut self, job_id: u32, hold: bool) -> Result<()> {
        self.slurm.requeue(job_id, hold)
    }
    fn compress(&self, names: &[String]) -> String {
        bftrainer_slurm::hostlist_compress(names).unwrap_or_else(|_| names.join(","))
    }
    fn expand(&self, expr: &str) -> Vec<String> {
        bftrainer_slurm::hostlist_expand(expr)
            .unwrap_or_else(|_| expr.split(',').map(str::to_string).collect())
    }
    fn preemption(&mut self) -> Result<bftrainer_slurm::Preemption> {
        self.slurm.preemption()
    }
    fn priority_inputs(&mut self) -> Result<(PriorityWeights, FairshareTable)> {
        let weights = self.slurm.priority_weights()?;
        // Under priority/basic there are no factors to read.
        let table = if weights.multifactor {
            self.slurm.fairshare_table()?
        } else {
            FairshareTable::default()
        };
        Ok((weights, table))
    }
}

/// A hold (priority 0) or release (INFINITE) carrying bftrainerd's marker.
fn marked(priority: u32, tag: &str) -> JobUpdate {
    JobUpdate {
        priority: Some(priority),
        admin_comment: Some(tag.to_string()),
        ..Default::default()
    }
}

/// Slurm's INFINITE, the priority `scontrol release` sends.
const INFINITE: u32 = u32::MAX;
