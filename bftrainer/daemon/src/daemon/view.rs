//! What bftrainerd shows of itself: one snapshot, taken after a cycle, that the control
//! socket (`bftrainer status|jobs|nodes`), the metrics endpoint and
//! `state_dir/status.json` all read, so none of them waits on a cycle or on Slurm.
//! The serde form is the `--json` schema (docs/admin.md); `SCHEMA` names its version.

use super::book::SizeChange;
use super::{Stats, Why};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Version of the snapshot's JSON form. Adding a field keeps it; renaming or removing
/// one, or changing a meaning, bumps it.
pub const SCHEMA: &str = "bftrainer.status/1";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    pub schema: String,
    pub version: String,
    /// When the snapshot was taken (Unix seconds).
    pub time: f64,
    pub started_at: f64,
    /// open, paused or drained.
    pub lending: String,
    /// Who is active under the cluster-wide lease and its term (`[daemon] lease_dir`);
    /// None: no lease configured.
    #[serde(default)]
    pub lease: Option<String>,
    /// The partition rule slurmctld's partitions break now: nothing new is lent
    /// while it is set (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_fault: Option<String>,
    pub slurm_reachable: bool,
    pub last_error: Option<LastError>,
    /// New satellites are not submitted until then: Slurm refused one for a reason of
    /// the whole cluster (`Error::is_cluster_wide`), charged to no job.
    #[serde(default)]
    pub growth_held: Option<GrowthHeld>,
    /// Reading Slurm (the refresh of nodes, partitions and jobs), per cycle.
    pub poll: Latency,
    /// Observe + engine decision, per cycle (no Slurm calls).
    pub decision: Latency,
    pub counts: NodeCounts,
    pub jobs_by_state: JobCounts,
    /// Node-seconds elastic jobs used since the journal began.
    pub node_seconds_harvested: f64,
    pub stats: Stats,
    pub nodes: Vec<NodeView>,
    pub jobs: Vec<JobView>,
    /// Endpoints bftrainerd cannot listen on yet ([`crate::daemon::listen`]): what, where,
    /// why and who holds the port. Filled in when a status is answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen_problems: Vec<String>,
}

/// Growth held after cluster-wide refusals (doubling from `[daemon] job_backoff`, at
/// most `GROWTH_HOLD_MAX_S`; ended by the next satellite Slurm takes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrowthHeld {
    pub until: f64,
    /// Refusals in a row.
    pub refusals: u32,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LastError {
    pub time: f64,
    pub message: String,
}

/// Latency over the last `samples` cycles, milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub last_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples: usize,
}

/// Nodes of the elastic partitions by what they are doing.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NodeCounts {
    pub total: u32,
    /// Open to elastic jobs and not lent.
    pub idle: u32,
    /// Held by elastic jobs.
    pub lent: u32,
    /// Idle in Slurm but kept for regular jobs (backfill plan, waiting queue, just
    /// preempted).
    pub reserved: u32,
    /// Held by regular jobs.
    pub busy: u32,
    /// Down, drained, reserved by an admin, set aside or not responding.
    pub unavailable: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobCounts {
    /// Submitted, waiting for admission.
    pub pending: u32,
    /// Admitted and holding nodes (or being admitted).
    pub running: u32,
    /// Taking part in allocation but on no node (waiting for idle nodes).
    pub waiting: u32,
    pub finished: u32,
    pub cancelled: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    /// idle, lent, reserved, busy or unavailable (as `NodeCounts`).
    pub state: String,
    pub why: Why,
    /// The Slurm job id of the elastic job holding it.
    pub holder: Option<u32>,
    /// When the backfill plan gives it to a regular job (Unix seconds).
    pub reclaim_at: Option<f64>,
    pub set_aside: Option<super::SetAside>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    pub job_id: u32,
    pub user: Option<String>,
    pub uid: u32,
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// pending, running, waiting, finished or cancelled (as `JobCounts`).
    pub state: String,
    /// Nodes held now, core and satellites (host expression; empty when none).
    pub nodes: String,
    pub size: u32,
    pub core_nodes: String,
    pub satellites: Vec<SatelliteView>,
    /// Measured samples/s at the current size, from the runtime.
    pub rate: Option<f64>,
    /// The global batch bftrainerd decided for it (`batch=MIN:MAX` jobs), else the one
    /// its runtime reports running at, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// Its `batch=MIN:MAX` range, if it declared one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_range: Option<(u32, u32)>,
    /// A GPU job's measured sensitivity (Synergy): its rate per GPU over CPUs per GPU
    /// (and over MiB per GPU where memory mattered), fitted to its measurements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<bftrainer_core::alloc::synergy::Sensitivity>,
    /// CPUs and MiB per GPU its parts held at its last measurement (the slowest part's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_per_gpu: Option<(f64, f64)>,
    /// Measurements behind `sensitivity`.
    #[serde(default)]
    pub measurements: u32,
    pub admits: u32,
    pub grows: u32,
    pub shrinks: u32,
    pub requeues: u32,
    /// Nodes lost to regular jobs.
    pub preemptions: u32,
    pub largest: u32,
    pub node_hours: f64,
    pub submitted_at: f64,
    pub ended_at: Option<f64>,
    /// Size changes, oldest first (`bftrainer jobs --history`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<SizeChange>>,
    /// Changes dropped from the front of a long history.
    #[serde(default)]
    pub history_dropped: u64,
    /// Growth paused until then (Unix seconds) after failures of the job's own, and why.
    #[serde(default)]
    pub paused_until: Option<f64>,
    #[serde(default)]
    pub pause_reason: Option<String>,
    /// Not admitted: no node bftrainerd lends meets its constraint or memory, or an
    /// administrator or its owner holds it (why).
    #[serde(default)]
    pub unservable: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SatelliteView {
    pub job_id: u32,
    pub node: String,
}

/// Recent per-cycle timings, for the status percentiles.
#[derive(Debug, Default)]
pub struct Window {
    v: VecDeque<f64>,
}

impl Window {
    const CAP: usize = 1000;

    pub fn push(&mut self, seconds: f64) {
        if self.v.len() == Self::CAP {
            self.v.pop_front();
        }
        self.v.push_back(seconds);
    }

    pub fn latency(&self) -> Latency {
        let mut s: Vec<f64> = self.v.iter().copied().collect();
        s.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if s.is_empty() {
                0.0
            } else {
                s[((s.len() - 1) as f64 * p).round() as usize] * 1e3
            }
        };
        Latency {
            last_ms: self.v.back().map_or(0.0, |x| x * 1e3),
            p50_ms: q(0.5),
            p99_ms: q(0.99),
            samples: s.len(),
        }
    }
}

impl Snapshot {
    /// A copy without the node and job lists (cheap at any cluster size).
    pub fn clone_summary(&self) -> Snapshot {
        Snapshot {
            schema: self.schema.clone(),
            version: self.version.clone(),
            time: self.time,
            started_at: self.started_at,
            lending: self.lending.clone(),
            lease: self.lease.clone(),
            partition_fault: self.partition_fault.clone(),
            slurm_reachable: self.slurm_reachable,
            last_error: self.last_error.clone(),
            growth_held: self.growth_held.clone(),
            poll: self.poll.clone(),
            decision: self.decision.clone(),
            counts: self.counts.clone(),
            jobs_by_state: self.jobs_by_state.clone(),
            node_seconds_harvested: self.node_seconds_harvested,
            stats: self.stats.clone(),
            nodes: Vec::new(),
            jobs: Vec::new(),
            listen_problems: self.listen_problems.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::daemon::Why;

    #[test]
    fn why_names_are_its_json_names() {
        for w in [
            Why::Open,
            Why::RegularJob,
            Why::Planned,
            Why::QueueWaits,
            Why::Reclaimed,
            Why::Unavailable,
            Why::SetAside,
            Why::NotResponding,
        ] {
            assert_eq!(serde_json::to_value(w).unwrap(), w.as_str());
        }
    }
}
