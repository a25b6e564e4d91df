//! The replay's summary: harvest, work, losses, job completion times and decision cost,
//! as one serialisable struct (the CLI prints it as a table or JSON).

use crate::engine::Action;
use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct JobReport {
    pub name: String,
    pub submit: String,
    /// queued, running, finished or cancelled at the end of the window.
    pub status: String,
    /// Seconds from submission to its first nodes.
    pub first_admit_s: Option<f64>,
    /// Job completion time: submission (or window start) to completion, seconds.
    pub jct_s: Option<f64>,
    pub samples: f64,
    pub node_h: f64,
    pub rescale_loss_samples: f64,
    pub preemption_loss_samples: f64,
    /// Samples computed after the job's total was reached, before it was seen done
    /// (only with `Steps::Trace`).
    pub overrun_loss_samples: f64,
    /// `--repeat` and `--arrivals`: one row per job of the file, over its copies
    /// (`NAME#k`): how many were submitted; times are the copies' means, samples,
    /// node-hours and losses their sums, the status the last copy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies: Option<u64>,
    /// Not finished and waiting at the end for nodes that serve its needs (too few
    /// lendable idle nodes do): what it asks and how many nodes serve it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unservable: Option<String>,
}

/// One class of nodes (`SimConfig::nodes`): what it offers and what it gave.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ClassReport {
    pub name: String,
    /// `gpu:a100:4, features gpu,a100, 524288 MB`.
    pub offers: String,
    pub nodes: usize,
    pub idle_node_h: f64,
    pub harvested_node_h: f64,
}

/// Harvest report of one replay. Node-hours: `idle = harvested + unused` exactly.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    pub start: String,
    pub end: String,
    pub hours: f64,
    pub nodes: usize,
    pub mean_idle_nodes: f64,
    /// Node-hours the main scheduler left idle.
    pub idle_node_h: f64,
    /// Node-hours lent to elastic jobs.
    pub harvested_node_h: f64,
    /// harvested / idle.
    pub harvest_share: f64,
    /// Idle node-hours the active elastic jobs could hold: at each moment the idle
    /// count if it is at least the smallest `min_nodes` among them, capped at the sum
    /// of their `max_nodes`; 0 while no job is active.
    pub usable_node_h: f64,
    /// Node-hours of work lost to preemptions: per preemption of a job,
    /// max(0, Tdw - grace) x the nodes it held before.
    pub preemption_loss_node_h: f64,
    /// max(0, usable - preemption loss): the harvest capacity of this workload.
    pub harvestable_node_h: f64,
    /// harvested / harvestable (may exceed 1 by the preemption losses: harvested
    /// counts node-time whose work was later lost).
    pub harvested_of_harvestable: f64,
    /// Harvested node-hours of jobs at or above their minimum size (productive).
    pub useful_node_h: f64,
    pub unused_node_h: f64,
    /// Node-hours elastic jobs kept during preemption grace (regular jobs waited).
    pub grace_node_h: f64,
    /// Net samples processed (after rescale and preemption charges).
    pub samples: f64,
    /// Samples the same node-seconds yield at dedicated rates (no charges).
    pub samples_dedicated: f64,
    /// samples / samples_dedicated; samples_dedicated = samples + the three losses.
    pub efficiency: f64,
    pub rescale_loss_samples: f64,
    pub preemption_loss_samples: f64,
    /// Work past a job's total before a trace event saw it done (`Steps::Trace`).
    pub overrun_loss_samples: f64,
    #[serde(flatten)]
    pub actions: ActionCounts,
    /// Lent nodes taken back by the main scheduler (with `CoreLoss::Job`, a lost core
    /// counts each of its core nodes).
    pub preempted_nodes: u64,
    /// Lent nodes taken back before a planned start (`DaemonRules::release_before_s`).
    pub released_nodes: u64,
    /// Jobs requeued because a regular job took one of their core nodes
    /// (`CoreLoss::Job`); the engine's own requeues are in `requeues`.
    pub core_loss_requeues: u64,
    /// Node-hours held by elastic jobs before their work started there
    /// (`DaemonRules::start_latency_s`); part of the harvested node-hours.
    pub starting_node_h: f64,
    pub jobs_in_file: usize,
    pub jobs_submitted: usize,
    pub jobs_admitted: usize,
    pub jobs_completed: usize,
    pub jct_mean_s: Option<f64>,
    pub jct_p50_s: Option<f64>,
    pub jct_p95_s: Option<f64>,
    /// Allocator calls.
    pub decisions: u64,
    /// Decisions without a proven answer in time (old allocation kept).
    pub decisions_kept: u64,
    pub decision_total_s: f64,
    pub decision_mean_ms: f64,
    pub decision_p99_ms: f64,
    pub decision_max_ms: f64,
    /// Jobs waiting at the end for nodes that serve their needs (`JobReport::unservable`).
    #[serde(skip_serializing_if = "is_zero")]
    pub jobs_unservable: usize,
    /// Per node class, with node attributes (`SimConfig::nodes`); empty without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_classes: Vec<ClassReport>,
    pub jobs: Vec<JobReport>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The engine's actions by kind and the nodes they moved: admits and grows give nodes
/// (`grown_nodes`), shrinks and requeues take them (`shrunk_nodes`).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ActionCounts {
    pub admits: u64,
    pub grows: u64,
    pub shrinks: u64,
    pub requeues: u64,
    pub grown_nodes: u64,
    pub shrunk_nodes: u64,
}

impl ActionCounts {
    pub fn count(&mut self, a: &Action) {
        let k = a.nodes().len() as u64;
        let (kind, moved) = match a {
            Action::Admit { .. } => (&mut self.admits, &mut self.grown_nodes),
            Action::Grow { .. } => (&mut self.grows, &mut self.grown_nodes),
            Action::Shrink { .. } => (&mut self.shrinks, &mut self.shrunk_nodes),
            Action::Requeue { .. } => (&mut self.requeues, &mut self.shrunk_nodes),
        };
        *kind += 1;
        *moved += k;
    }
}

/// Nearest-rank percentile of sorted values; `None` when empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Wall times of decisions: count, sum and maximum exact, the distribution in
/// logarithmic bins 1% wide from 1 µs, so that a replay of years keeps no time per
/// decision; a quantile is its bin's upper edge (at most 1% above the exact one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Timings {
    pub n: u64,
    pub sum: f64,
    pub max: f64,
    bins: Vec<u64>,
}

const BIN_LO_S: f64 = 1e-6;
const BIN_RATIO: f64 = 1.01;

impl Timings {
    /// Bin 0 holds times up to 1 µs; bin k >= 1 holds (1 µs x 1.01^(k-1), 1 µs x 1.01^k].
    fn bin(x: f64) -> usize {
        if x <= BIN_LO_S {
            0
        } else {
            ((x / BIN_LO_S).ln() / BIN_RATIO.ln()).ceil() as usize
        }
    }

    pub fn add(&mut self, x: f64) {
        let b = Self::bin(x).min(100_000);
        if b >= self.bins.len() {
            self.bins.resize(b + 1, 0);
        }
        self.bins[b] += 1;
        self.n += 1;
        self.sum += x;
        self.max = self.max.max(x);
    }

    /// The nearest-rank quantile `q`, as its bin's upper edge (never above the maximum).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (k, &c) in self.bins.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some((BIN_LO_S * BIN_RATIO.powi(k as i32)).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    /// Binned quantiles lie within 1% above the exact nearest-rank ones.
    #[test]
    fn binned_quantiles_are_within_a_percent() {
        let mut t = super::Timings::default();
        let mut v = Vec::new();
        let mut x = 1u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let d = 1e-5 * (1.0 + (x >> 40) as f64 / 1e4);
            t.add(d);
            v.push(d);
        }
        v.sort_by(f64::total_cmp);
        for q in [0.5, 0.99, 1.0] {
            let exact = super::percentile(&v, q).unwrap();
            let got = t.quantile(q).unwrap();
            assert!(
                got >= exact && got <= exact * 1.0101,
                "{q}: {got} vs {exact}"
            );
        }
        assert_eq!(t.max, *v.last().unwrap());
        assert!(super::Timings::default().quantile(0.99).is_none());
    }

    #[test]
    fn nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(super::percentile(&v, 0.5), Some(2.0));
        assert_eq!(super::percentile(&v, 0.95), Some(4.0));
        assert_eq!(super::percentile(&[], 0.5), None);
    }
}
