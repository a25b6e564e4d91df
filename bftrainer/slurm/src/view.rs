//! A cached view of the cluster refreshed with update times: when nothing changed,
//! a refresh is three SLURM_NO_CHANGE_IN_DATA answers and no copying.
//!
//! Slurm 22.05's backfill scheduler writes a pending job's expected start and
//! SchedNodes without bumping the job table's update time (backfill.c), so a
//! no-change job load can hide a new plan. It does bump the node table's time when it
//! sets or clears PLANNED on nodes; so whenever nodes changed, jobs are loaded in full.

use crate::error::Result;
use crate::info::{Job, Jobs, Loaded, Node, Nodes, Partition, Partitions};
use crate::Slurm;

/// What one [`ClusterView::refresh`] found changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    pub nodes: bool,
    pub partitions: bool,
    pub jobs: bool,
}

impl Refresh {
    pub fn any(self) -> bool {
        self.nodes || self.partitions || self.jobs
    }
}

/// The last snapshots of nodes, partitions and jobs. Nodes carry their partitions.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    nodes: Nodes,
    partitions: Partitions,
    jobs: Jobs,
    loaded: bool,
    /// Nodes are loaded with their GRES in use (`Slurm::load_nodes_with`).
    node_detail: bool,
}

impl ClusterView {
    /// Reloads whatever changed since the last refresh. On error the previous
    /// snapshots are kept as they were.
    pub fn refresh(&mut self, slurm: &Slurm) -> Result<Refresh> {
        self.refresh_with(slurm, false)
    }

    /// Whether nodes are loaded with the GRES they have in use (`Node::gres_used`);
    /// turning it on reloads them at the next refresh.
    pub fn set_node_detail(&mut self, on: bool) {
        if on != self.node_detail {
            self.node_detail = on;
            self.nodes.last_update = 0;
        }
    }

    /// As [`ClusterView::refresh`]; with `full_jobs` the jobs are loaded in full even if
    /// their update time did not move, to pick up backfill's latest plan (expected
    /// start times, SchedNodes) — e.g. once every few backfill intervals.
    pub fn refresh_with(&mut self, slurm: &Slurm, full_jobs: bool) -> Result<Refresh> {
        let since = |t: i64| if self.loaded { Some(t) } else { None };
        let parts = slurm.load_partitions(since(self.partitions.last_update))?;
        let nodes = slurm.load_nodes_with(since(self.nodes.last_update), self.node_detail)?;
        let nodes_changed = matches!(nodes, Loaded::Changed(_));
        let jobs_since = if full_jobs || nodes_changed {
            None
        } else {
            since(self.jobs.last_update)
        };
        let jobs = slurm.load_jobs(jobs_since)?;
        let mut r = Refresh::default();
        if let Loaded::Changed(p) = parts {
            self.partitions = p;
            r.partitions = true;
        }
        if let Loaded::Changed(n) = nodes {
            self.nodes = n;
            r.nodes = true;
        }
        if r.nodes || r.partitions {
            self.nodes.assign_partitions(&self.partitions);
        }
        if let Loaded::Changed(j) = jobs {
            // A forced full load reports a change only if something differs.
            r.jobs = !self.loaded || jobs_since.is_some() || j.jobs != self.jobs.jobs;
            self.jobs = j;
        }
        self.loaded = true;
        Ok(r)
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes.nodes
    }

    pub fn partitions(&self) -> &[Partition] {
        &self.partitions.partitions
    }

    pub fn jobs(&self) -> &[Job] {
        &self.jobs.jobs
    }

    /// The snapshots with their update times.
    pub fn snapshots(&self) -> (&Nodes, &Partitions, &Jobs) {
        (&self.nodes, &self.partitions, &self.jobs)
    }
}
