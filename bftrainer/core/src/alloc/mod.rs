//! The allocation decision: given the nodes open to elastic jobs and the elastic jobs,
//! choose each job's node set, exactly optimal for the chosen objective (docs/design.md).
//!
//! Nodes are addressed by their index `0..Instance::n_nodes`; names exist only at the I/O
//! edge ([`io`], used by `bftrainer solve`), so a caller that decides thousands of times
//! per second (the replay simulator) builds no strings per call. A decision at 400 nodes
//! x 10 jobs takes ~0.04 ms (`bftrainer bench-alloc --sizes 400x10`; docs/benchmarks.md
//! for the other sizes); `reclaim-aware` adds a heuristic search costing ~1 ms there.
//!
//! ```
//! use bftrainer_core::alloc::{solve, Curve, Instance, JobInput, Objective, Options};
//!
//! let job = |id: &str, current: Vec<u32>| JobInput {
//!     current,
//!     ..JobInput::new(id, 1, 4, 1.0, 1.0, Curve::new(vec![(1, 100.0), (4, 350.0)]))
//! };
//! let inst = Instance {
//!     t_fwd_s: 10.0,
//!     n_nodes: 6,               // nodes 0..6: idle ones and those the jobs hold now
//!     reclaim_in_s: Vec::new(), // or one Option<f64> per node
//!     host_of: Vec::new(),      // or each unit's host, for GPU-slot units
//!     jobs: vec![job("a", vec![0, 1]), job("b", vec![])],
//! };
//! let sol = solve(&inst, &Options::new(Objective::Bftrainer))?;
//! // "a" keeps its two nodes (growing would cost 1 s at its current rate), "b" starts on
//! // the lowest free ones.
//! assert_eq!(sol.counts(), vec![2, 4]);
//! assert_eq!(sol.jobs[1], vec![2, 3, 4, 5]);
//! # Ok::<(), bftrainer_core::alloc::AllocError>(())
//! ```

mod assign;
pub mod efficiency;
mod exact;
pub use efficiency::EfficiencyModel;
pub use exact::Stats;
pub mod gen;
pub mod io;
mod model;
mod objective;
mod reclaim;
pub mod synergy;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Index of a node, `0..Instance::n_nodes`.
pub type NodeIdx = u32;

/// A job's objective curve: piecewise linear through (nodes, value) points with strictly
/// increasing node counts starting at 1; O(0) = 0; constant past the last point.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub points: Vec<(u32, f64)>,
}

impl Curve {
    pub fn new(points: Vec<(u32, f64)>) -> Self {
        Curve { points }
    }

    /// O(n): linear interpolation between points, 0 at n = 0, constant past the last one.
    /// Assumes a validated curve (see [`Instance::validate`]).
    pub fn eval(&self, n: u32) -> f64 {
        let p = &self.points;
        if n == 0 || p.is_empty() {
            return 0.0;
        }
        // Past-the-end and exact hits are the common cases in the solver.
        let i = p.partition_point(|&(x, _)| x <= n);
        if i == p.len() {
            return p[i - 1].1;
        }
        if i == 0 {
            // n below the first point (which is 1): only n = 0, handled above.
            return p[0].1;
        }
        let (x0, y0) = p[i - 1];
        if x0 == n {
            return y0;
        }
        let (x1, y1) = p[i];
        y0 + (y1 - y0) * f64::from(n - x0) / f64::from(x1 - x0)
    }
}

/// The objective at one allowed global batch size (Effective Elastic Scaling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchCurve {
    pub batch_size: u32,
    pub curve: Curve,
}

/// One elastic job as the allocator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInput {
    pub id: String,
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// Rescale costs in seconds of lost progress at the current rate.
    pub scale_up_s: f64,
    pub scale_down_s: f64,
    /// Objective per node count. Must be empty when `batch_curves` is not.
    pub curve: Curve,
    /// Nodes the job holds now (indices, each in at most one job).
    pub current: Vec<NodeIdx>,
    /// Batch-size-aware scaling: one curve per allowed global batch size; the solver
    /// picks nodes and batch size together. Empty: `curve` is used.
    pub batch_curves: Vec<BatchCurve>,
    /// The batch size the job runs with now (its current rate is read on that curve);
    /// `None`: the best allowed one.
    pub current_batch: Option<u32>,
    /// Work left (in the curve's units times seconds, e.g. samples); needed by
    /// [`Objective::RemainingWork`] only.
    pub remaining_work: Option<f64>,
}

impl JobInput {
    /// A job with a plain curve, holding no nodes.
    pub fn new(
        id: &str,
        min_nodes: u32,
        max_nodes: u32,
        scale_up_s: f64,
        scale_down_s: f64,
        curve: Curve,
    ) -> Self {
        JobInput {
            id: id.to_string(),
            min_nodes,
            max_nodes,
            scale_up_s,
            scale_down_s,
            curve,
            current: Vec::new(),
            batch_curves: Vec::new(),
            current_batch: None,
            remaining_work: None,
        }
    }
}

/// One decision's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// Forward-looking time Tfwd, seconds.
    pub t_fwd_s: f64,
    /// Nodes open to elastic jobs (idle ones and those elastic jobs hold now) are
    /// `0..n_nodes`.
    pub n_nodes: u32,
    /// Predicted time (seconds from now) at which a regular job reclaims each node,
    /// `None` when unknown. Empty, or exactly `n_nodes` long. Used by
    /// [`Objective::ReclaimAware`] and to pick which nodes a growing job receives.
    pub reclaim_in_s: Vec<Option<f64>>,
    /// The host of each unit, for GPU-slot units (one GPU each, `host/gpuK`): a job's
    /// new units go on as few hosts as possible, hosts whose reclaim is latest first
    /// (docs/design.md, "Which nodes"). Any numbers; units with the same number share
    /// a host. Empty, or exactly `n_nodes` long; empty: every unit is its own host
    /// (whole-node lending), which decides exactly as before hosts existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_of: Vec<u32>,
    pub jobs: Vec<JobInput>,
}

/// What the allocator maximises; formulas in docs/design.md ("Allocator").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// BFTrainer: sum of Tfwd*O_j(n_j) minus rescale costs.
    #[default]
    Bftrainer,
    /// Same with every curve divided by its one-node value: sum of speed-ups, so a node
    /// goes where it adds the most single-node equivalents, whatever the model's speed.
    Efficiency,
    /// Max-min of throughput normalised by the job's best; then BFTrainer among the
    /// allocations that reach that minimum.
    Fairness,
    /// BFTrainer with each job's term divided by its remaining work: fraction of the
    /// remaining work done in Tfwd, so jobs near completion come first.
    RemainingWork,
    /// BFTrainer minus the expected loss of growing onto nodes that are reclaimed
    /// within Tfwd; long-lived nodes go to the jobs with the highest rescale costs.
    ReclaimAware,
}

impl Objective {
    pub const ALL: [Objective; 5] = [
        Objective::Bftrainer,
        Objective::Efficiency,
        Objective::Fairness,
        Objective::RemainingWork,
        Objective::ReclaimAware,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Objective::Bftrainer => "bftrainer",
            Objective::Efficiency => "efficiency",
            Objective::Fairness => "fairness",
            Objective::RemainingWork => "remaining-work",
            Objective::ReclaimAware => "reclaim-aware",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Objective {
    type Err = AllocError;
    fn from_str(s: &str) -> Result<Self, AllocError> {
        Objective::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| AllocError::UnknownObjective(s.to_string()))
    }
}

/// Solver options. Construct with [`Options::new`] or `Options { objective,
/// ..Options::default() }`: fields may be added.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub objective: Objective,
    /// Tuning of the exact search, not of the result: a node of the search whose DP
    /// would take more steps than this splits a job's domain first (docs/design.md).
    /// Tests set 0 to force the split path; any value gives the same optimum.
    #[doc(hidden)]
    pub split_min_work: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            objective: Objective::Bftrainer,
            split_min_work: exact::SPLIT_MIN_WORK,
        }
    }
}

impl Options {
    /// Default options for `objective`.
    pub fn new(objective: Objective) -> Self {
        Options {
            objective,
            ..Options::default()
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// The chosen objective's value (for `fairness`: the BFTrainer value of the chosen
    /// allocation; the reached minimum is `fairness_level`).
    pub objective_value: f64,
    /// `jobs[j]`: node set of `Instance::jobs[j]`, ascending.
    pub jobs: Vec<Vec<NodeIdx>>,
    /// `batch_sizes[j]`: chosen batch size for jobs with `batch_curves`, else `None`.
    pub batch_sizes: Vec<Option<u32>>,
    /// For `fairness`: the max-min normalised throughput reached; else `None`.
    pub fairness_level: Option<f64>,
}

impl Solution {
    /// Node count per job.
    pub fn counts(&self) -> Vec<u32> {
        self.jobs.iter().map(|s| s.len() as u32).collect()
    }
}

/// Why an instance could not be solved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// The instance breaks the schema; `location` says where (e.g. `jobs[3].curve[2]`).
    #[error("invalid instance at {location}: {message}")]
    Invalid { location: String, message: String },
    #[error("unknown objective {0:?}; allowed: bftrainer, efficiency, fairness, remaining-work, reclaim-aware")]
    UnknownObjective(String),
    /// JSON that does not parse (I/O edge only).
    #[error("cannot parse instance: {0}")]
    Parse(String),
}

pub(crate) fn invalid(location: impl Into<String>, message: impl Into<String>) -> AllocError {
    AllocError::Invalid {
        location: location.into(),
        message: message.into(),
    }
}

/// Solve one decision exactly. Errors only on invalid instances.
pub fn solve(inst: &Instance, opts: &Options) -> Result<Solution, AllocError> {
    inst.validate(opts.objective)?;
    objective::solve_validated(inst, opts, &mut Stats::default())
}

/// [`solve`], also returning how much of the instance the exact search had to open.
pub fn solve_with_stats(inst: &Instance, opts: &Options) -> Result<(Solution, Stats), AllocError> {
    inst.validate(opts.objective)?;
    let mut stats = Stats::default();
    let sol = objective::solve_validated(inst, opts, &mut stats)?;
    Ok((sol, stats))
}

/// Value of a given allocation (node counts per job) under `objective`, node choice
/// ignored except for `reclaim-aware`, where `alloc` must be full node sets. Used by
/// tests and the `bftrainer solve` output; `None` if the counts break a job's bounds.
pub fn evaluate(inst: &Instance, objective: Objective, alloc: &[Vec<NodeIdx>]) -> Option<f64> {
    objective::evaluate(inst, objective, alloc)
}

/// The batch size at which `job` reaches its best objective on `n` nodes (ties: the
/// smallest); `None` for a job without `batch_curves`.
pub fn best_batch(job: &JobInput, n: u32) -> Option<u32> {
    model::Obj::of(job).best_batch(n)
}

/// How much more goodput on its nodes another batch must promise before a job running
/// at one is moved to it: 10%. Each change re-forms the job's workers and moves its
/// learning rate, and a model fed rates from two regimes (a curve rebased from another
/// batch, a step-bound job whose batches it cannot tell apart) would otherwise flip the
/// decision back and forth on noise.
pub const BATCH_SWITCH_GAIN: f64 = 0.10;

/// The batch `job` should run at on `n` nodes when it runs at `current` now: `current`
/// while no other batch beats it by more than [`BATCH_SWITCH_GAIN`] (ties included),
/// else [`best_batch`]. `None` for a job without `batch_curves`.
pub fn batch_to_run(job: &JobInput, n: u32, current: Option<u32>) -> Option<u32> {
    let best = best_batch(job, n)?;
    let Some(cur) = current.filter(|&c| c != best) else {
        return Some(best);
    };
    let Some(now) = job.batch_curves.iter().find(|b| b.batch_size == cur) else {
        return Some(best); // not a candidate (outside the range, or between its steps)
    };
    let top = model::Obj::of(job).eval(n);
    Some(if top > now.curve.eval(n) * (1.0 + BATCH_SWITCH_GAIN) {
        best
    } else {
        cur
    })
}
