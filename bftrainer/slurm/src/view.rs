//! A cached view of the cluster refreshed with update times: when nothing changed,
//! a refresh is three SLURM_NO_CHANGE_IN_DATA answers and no copying.

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
}

impl ClusterView {
    /// Reloads whatever changed since the last refresh. On error the previous
    /// snapshots are kept as they were.
    pub fn refresh(&mut self, slurm: &Slurm) -> Result<Refresh> {
        let since = |t: i64| if self.loaded { Some(t) } else { None };
        let parts = slurm.load_partitions(since(self.partitions.last_update))?;
        let nodes = slurm.load_nodes(since(self.nodes.last_update))?;
        let jobs = slurm.load_jobs(since(self.jobs.last_update))?;
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
            self.jobs = j;
            r.jobs = true;
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
