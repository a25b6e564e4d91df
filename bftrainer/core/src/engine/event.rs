//! The engine's event and action vocabulary: one versioned serde enum that bftrainerd
//! journals and the simulator replays, so a real cluster's history can be re-run.

use super::{EngineState, JobId, NodeId};
use crate::alloc::Curve;
use crate::placement::{Needs, NodeAttrs};
use serde::{Deserialize, Serialize};

/// Version of the journal format written in every `Record`. Bump it when a variant's
/// meaning or fields change; readers reject versions they do not know.
pub const EVENT_FORMAT_VERSION: u32 = 1;

/// One journal line: the format version, the time the engine saw the event (seconds,
/// Unix time on a real cluster) and the event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    pub t: f64,
    pub event: Event,
}

impl Record {
    /// Parses one journal line, rejecting format versions this build does not know.
    pub fn from_json_line(line: &str) -> Result<Record, String> {
        let r: Record =
            serde_json::from_str(line).map_err(|e| format!("not a journal record: {e}"))?;
        if r.v != EVENT_FORMAT_VERSION {
            return Err(format!("journal format version {} is not supported (this build reads {EVENT_FORMAT_VERSION})", r.v));
        }
        Ok(r)
    }
}

/// What an elastic job asks for: its node range, its rescale costs and the objective
/// curve the allocator maximises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElasticSpec {
    pub name: String,
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// Seconds of work lost when the job grows (BFTrainer's Tup).
    pub scale_up_s: f64,
    /// Seconds of work lost when the job shrinks or is preempted (Tdw).
    pub scale_down_s: f64,
    pub objective: Curve,
    /// The owner's uid, for the per-user caps (`EngineConfig::max_jobs_per_user`,
    /// `max_nodes_per_user`); `None`: unknown, no cap applies. Added to format 1
    /// without a version bump: absent in older journals, omitted when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<u32>,
    /// Admission priority (Slurm's job priority: fairshare, QOS, age...): queued jobs
    /// are admitted highest first, ties in submit order. 0 by default (omitted when 0),
    /// so jobs without one are admitted in submit order. `Event::JobPriority` updates it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Everything the engine observes. Nodes and jobs are addressed by dense numbers
/// declared once (`NodeAdded`, `JobSubmitted`), so the hot events carry no strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Declares node `node` (ids are dense, from 0, in declaration order) with its
    /// Slurm name. The node starts busy: unusable until reported idle.
    NodeAdded { node: NodeId, name: String },
    /// The node is idle, i.e. no regular job holds it and it may be lent to elastic
    /// jobs. Repeated for an idle or lent node, it updates the forecast only.
    /// `reclaim_at`: when the main scheduler's plan (backfill reservation) will take it
    /// back, seconds on the engine's clock; `None` when no reservation covers it.
    NodeIdle {
        node: NodeId,
        reclaim_at: Option<f64>,
    },
    /// A regular job took the node. If an elastic job held it, that job has lost it
    /// (Slurm preempts at once or after GraceTime); no action is returned for it.
    NodeClaimed { node: NodeId },
    /// The node went down, was drained or removed; like `NodeClaimed` until it is
    /// reported idle again.
    NodeLost { node: NodeId },
    /// A new elastic job (ids dense, from 0, in submit order). It waits in the queue
    /// until fewer than `max_jobs` jobs are active.
    JobSubmitted { job: JobId, spec: ElasticSpec },
    /// Slurm started the core job of an admitted job (confirmation; no state change).
    JobStarted { job: JobId },
    /// The job completed its work; its nodes return to the idle pool.
    JobFinished { job: JobId },
    /// The job was cancelled by its user or an admin; its nodes return to the pool.
    JobCancelled { job: JobId },
    /// A worker of `job` is up on `node` (confirms a grow or admit).
    WorkerJoined { job: JobId, node: NodeId },
    /// A worker of `job` left `node` on its own (not asked to): the node is idle again.
    /// After a shrink the engine already counts the node idle; then this is a no-op.
    WorkerLeft { job: JobId, node: NodeId },
    /// A worker was killed by Slurm's preemption on `node`; the node is busy.
    WorkerPreempted { job: JobId, node: NodeId },
    /// Measured throughput of `job` (samples/s) on `nodes` nodes (its current size when
    /// `None`), and the work it has left in its objective curve's units times seconds
    /// (samples for a throughput curve), when known. The rate replaces the declared
    /// curve's value at that size in the allocator's terms (`fair::effective_curve`);
    /// the remaining work feeds objectives that use it (remaining-work). `nodes` was
    /// added to format 1 without a version bump (absent: the current size).
    Progress {
        job: JobId,
        samples_per_s: f64,
        remaining: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nodes: Option<u32>,
    },
    /// Measured rescale costs of `job`, seconds (0: not measured): `up_s` what its last
    /// grow cost (from a newcomer's start until it contributed a step), `down_s` the
    /// pause of its last shrink (from the new generation's announcement to its first
    /// step). bft-run measures them and writes them in the job's Comment, so they are
    /// the owner's word: the allocator takes `max(declared, floor, min(measured,
    /// ceiling))` (`fair::rescale_cost`). Added to format 1 without a version bump.
    RescaleCost { job: JobId, up_s: f64, down_s: f64 },
    /// The weight of `user`'s share of the lent nodes (Slurm's fairshare factor of the
    /// user, 0..1; floored at `fair::MIN_WEIGHT`). Users never weighed weigh 1. Added
    /// to format 1 without a version bump.
    UserWeight { user: u32, weight: f64 },
    /// The observations up to `now` are complete: re-plan if anything changed. The
    /// daemon sends one per poll, the simulator one per distinct timestamp.
    Tick,
    /// An operator changed whether nodes are lent (`bftrainer pause|drain|resume`).
    /// Journaled like any observation, so a restart or a replay keeps the mode. Added
    /// to format 1 without a version bump: journals without it read as before.
    Lending { mode: Lending },
    /// The job keeps what it holds and sits decisions out until `until` (engine clock;
    /// `None` lifts a pause): its growth failed for reasons of its own (a satellite it
    /// could not start, its limits, its environment), so the pool goes to others
    /// meanwhile. A loss that leaves it below its minimum is still decided (requeue).
    /// Added to format 1 without a version bump: journals without it read as before.
    JobPaused { job: JobId, until: Option<f64> },
    /// The job's admission priority changed (Slurm recomputes fairshare and age as time
    /// goes); reorders the queue. For an active job it only orders the per-user node
    /// budget. Added to format 1 without a version bump.
    JobPriority { job: JobId, priority: u32 },
    /// The job may run at any global batch in `min..=max` (`--elastic=...,batch=MIN:MAX`):
    /// the allocator chooses its batch with its nodes (Effective Elastic Scaling,
    /// `alloc::efficiency`) once its rate was measured at a known batch (`JobBatch`).
    /// Declared after `JobSubmitted`; `None` takes the range away. Added to format 1
    /// without a version bump.
    BatchRange {
        job: JobId,
        range: Option<(u32, u32)>,
    },
    /// The job's workers run at global batch `batch` now (bft-run's Comment says so):
    /// its measured rates are at that batch, and earlier ones, at another, are dropped.
    /// Added to format 1 without a version bump.
    JobBatch { job: JobId, batch: u32 },
    /// What the engine decided at the `Tick` just before (same time): the jobs it took
    /// from the queue into allocation (`activated`, in that order) and the actions it
    /// returned. bftrainerd journals one after every `Tick` it journals, so a restart
    /// restores the decisions as they were made, whatever the config or build is now
    /// (`Mode::Restore`). A live engine ignores it (it made the decision itself), so a
    /// replay under another policy re-decides. Added to format 1 without a version bump:
    /// a `Tick` not followed by one (an older journal) is re-decided at restore.
    Decided {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        activated: Vec<JobId>,
        actions: Vec<Action>,
    },
    /// What node `node` offers (features, GPUs, memory), at its declaration and when it
    /// changes: the engine lends it only to jobs it serves (`JobNeeds`). A node without
    /// it serves every job. Added to format 1 without a version bump.
    NodeAttrs { node: NodeId, attrs: NodeAttrs },
    /// What job `job` asks of each node (`--constraint`, GPUs per node, memory): the
    /// engine admits and grows it only onto nodes that serve it. Added to format 1
    /// without a version bump.
    JobNeeds { job: JobId, needs: Needs },
    /// A finished or cancelled job is forgotten (`Engine::forget_job`): journaled, so a
    /// restart forgets it too. A job still queued or active, or unknown, is refused;
    /// one forgotten already is a no-op. Added to format 1 without a version bump.
    JobForgotten { job: JobId },
    /// The engine's whole state at this time, replacing whatever came before: the
    /// first record of a compacted journal (bftrainerd rewrites its journal as this
    /// snapshot once it outgrows its bound, and appends from there). `nodes` and
    /// `jobs` are the names every node and job was declared with (`NodeAdded`,
    /// `JobSubmitted`), in id order, for the driver's own maps. Added to format 1
    /// without a version bump.
    Snapshot {
        state: Box<EngineState>,
        #[serde(default)]
        nodes: Vec<String>,
        #[serde(default)]
        jobs: Vec<String>,
    },
}

/// Whether the engine lends nodes to elastic jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lending {
    /// Normal operation: admit, grow, shrink as the allocator decides.
    #[default]
    Open,
    /// No admissions and no growth; running jobs keep what they hold (regular jobs
    /// still take nodes back). No decisions are made until lending reopens.
    Paused,
    /// As paused, and every job is shrunk to its core nodes at the next decision.
    Drained,
}

impl Lending {
    pub fn as_str(self) -> &'static str {
        match self {
            Lending::Open => "open",
            Lending::Paused => "paused",
            Lending::Drained => "drained",
        }
    }
}

/// What the engine asks the environment (Slurm, or the simulator's model) to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Action {
    /// Start the job (its core Slurm job) on these nodes; it held none before.
    Admit { job: JobId, nodes: Vec<NodeId> },
    /// Add these nodes to a running job.
    Grow { job: JobId, nodes: Vec<NodeId> },
    /// Take these nodes from a job that keeps at least one.
    Shrink { job: JobId, nodes: Vec<NodeId> },
    /// Take all of the job's remaining nodes (these); it waits for a later admission.
    Requeue { job: JobId, nodes: Vec<NodeId> },
}

impl Action {
    /// The action's name as it appears in journals and CSV output (`admit`, `grow`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Admit { .. } => "admit",
            Action::Grow { .. } => "grow",
            Action::Shrink { .. } => "shrink",
            Action::Requeue { .. } => "requeue",
        }
    }

    pub fn job(&self) -> JobId {
        match self {
            Action::Admit { job, .. }
            | Action::Grow { job, .. }
            | Action::Shrink { job, .. }
            | Action::Requeue { job, .. } => *job,
        }
    }

    pub fn nodes(&self) -> &[NodeId] {
        match self {
            Action::Admit { nodes, .. }
            | Action::Grow { nodes, .. }
            | Action::Shrink { nodes, .. }
            | Action::Requeue { nodes, .. } => nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_lines_round_trip() {
        let r = Record {
            v: EVENT_FORMAT_VERSION,
            t: 12.5,
            event: Event::NodeIdle {
                node: 3,
                reclaim_at: Some(99.0),
            },
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(
            s,
            r#"{"v":1,"t":12.5,"event":{"type":"node_idle","node":3,"reclaim_at":99.0}}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&s).unwrap(), r);
        let tick: Record =
            serde_json::from_str(r#"{"v":1,"t":0,"event":{"type":"tick"}}"#).unwrap();
        assert_eq!(tick.event, Event::Tick);
        assert!(
            Record::from_json_line(r#"{"v":2,"t":0,"event":{"type":"tick"}}"#)
                .unwrap_err()
                .contains("version 2")
        );
        assert!(Record::from_json_line(r#"{"v":1,"t":0,"event":{"type":"nap"}}"#).is_err());
    }

    #[test]
    fn action_kind_is_the_serde_tag() {
        let nodes = vec![1];
        for a in [
            Action::Admit {
                job: 0,
                nodes: nodes.clone(),
            },
            Action::Grow {
                job: 0,
                nodes: nodes.clone(),
            },
            Action::Shrink {
                job: 0,
                nodes: nodes.clone(),
            },
            Action::Requeue { job: 0, nodes },
        ] {
            let v = serde_json::to_value(&a).unwrap();
            assert_eq!(v["type"], a.kind(), "{a:?}");
        }
    }
}
