//! The allocation decision: given the nodes open to elastic jobs and the elastic jobs,
//! choose each job's node set. See docs/design.md for the exact statement.
//!
//! API contract (shared by the simulator, the daemon and `bftrainer solve`): nodes are
//! addressed by their index in `Instance::nodes`; names are only for I/O.

use serde::{Deserialize, Serialize};

/// Index of a node in `Instance::nodes`.
pub type NodeIdx = u32;

/// A job's objective curve: piecewise linear through (nodes, value) points with
/// strictly increasing node counts starting at 1; O(0) = 0; constant past the last point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub points: Vec<(u32, f64)>,
}

/// A node open to elastic jobs (idle, or held by an elastic job now).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInput {
    pub name: String,
    /// Predicted time (seconds from now) at which a regular job reclaims the node;
    /// `None` when unknown.
    pub reclaim_in_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInput {
    pub id: String,
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub scale_up_s: f64,
    pub scale_down_s: f64,
    pub curve: Curve,
    /// Nodes the job holds now.
    pub current: Vec<NodeIdx>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub t_fwd_s: f64,
    pub nodes: Vec<NodeInput>,
    pub jobs: Vec<JobInput>,
}

/// The decision: `jobs[j]` is the node set of `Instance::jobs[j]` (sorted ascending).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    pub objective_value: f64,
    pub jobs: Vec<Vec<NodeIdx>>,
}
