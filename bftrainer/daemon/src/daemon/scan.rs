//! What the job table says apart from bftrainerd's own jobs: the nodes regular jobs
//! hold, the backfill plan, where regular jobs wait, and where the tagged jobs are.
//!
//! It depends on the job table and the slots alone, so it is kept from one cycle to the
//! next while the cluster reports every table unchanged (`Cluster::refresh`), and made
//! again in one pass over the whole job table when one changed.

use super::observe::plan_at;
use super::slots::Marks;
use super::*;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

#[derive(Debug, Default)]
pub(super) struct Regular {
    /// Slots regular jobs hold (running or completing).
    pub busy: Marks,
    /// Earliest planned start of a pending regular job per slot.
    pub forecast: Vec<Option<f64>>,
    /// Partitions where regular jobs wait.
    pub pending_parts: FxHashSet<String>,
    /// Each pending regular job's planned nodes, whole.
    pub plans: Vec<Arc<[u32]>>,
    /// The jobs with a tag (or what looks like one): their indices in the job table, in
    /// order.
    pub tagged: Vec<usize>,
    /// Their owners, by Slurm id.
    pub uid_of: FxHashMap<u32, u32>,
    /// Regular jobs waiting on an association or QOS limit that satellites can feed
    /// (`limits`).
    pub limited: Vec<super::limits::Limited>,
    /// The table it was made from: its length, and the slots' generation then.
    len: usize,
    generation: u64,
}

impl Regular {
    /// Whether it was made from a job table of `len` jobs under the slots of `generation`.
    pub fn fits(&self, len: usize, generation: u64) -> bool {
        self.len == len && self.generation == generation
    }
}

impl<C: Cluster> Daemon<C> {
    /// The job table in one pass (the slots synced): of the tagged jobs the index is
    /// kept, of the others what they hold or are planned onto.
    pub(super) fn scan_regular(&mut self) -> Regular {
        let mut busy = Marks::default();
        busy.reset(self.slots.len());
        let mut forecast: Vec<Option<f64>> = vec![None; self.slots.len()];
        let mut pending_parts: FxHashSet<String> = FxHashSet::default();
        let mut plans: Vec<Arc<[u32]>> = Vec::new();
        let mut tagged: Vec<usize> = Vec::new();
        let jobs = self.cluster.jobs();
        let mut last_part: Option<&str> = None;
        let mut limited = Vec::new();
        let mut limited_keys = FxHashSet::default();
        for (i, j) in jobs.iter().enumerate() {
            if j.admin_comment.as_deref().is_some_and(spec::looks_like_tag) {
                tagged.push(i);
            } else if is_running(j) || j.state.is_completing() {
                if let Some(e) = &j.nodes {
                    for &s in self.slots.expand(e, &self.cluster, &self.node_ids).iter() {
                        busy.set(s);
                    }
                }
            } else if j.state.base() == JobBase::Pending && !j.is_held() {
                if let Some(l) = super::limits::Limited::of(j) {
                    // One of each (scope, user, account, QOS): thousands of jobs
                    // waiting on one limit are one test per core job.
                    if limited_keys.insert(l.key()) {
                        limited.push(l);
                    }
                }
                if let Some(p) = j.partition.as_deref() {
                    // Most waiting jobs name the same partitions as the one before.
                    if last_part != Some(p) {
                        for p in p.split(',') {
                            if !pending_parts.contains(p) {
                                pending_parts.insert(p.to_string());
                            }
                        }
                        last_part = Some(p);
                    }
                }
                if let (Some(e), Some(start)) = (&j.sched_nodes, j.expected_start()) {
                    let nodes = self.slots.expand(e, &self.cluster, &self.node_ids);
                    for &s in nodes.iter() {
                        plan_at(&mut forecast, s, start as f64);
                    }
                    plans.push(nodes);
                }
            }
        }
        let uid_of: FxHashMap<u32, u32> = tagged
            .iter()
            .map(|&i| (jobs[i].job_id, jobs[i].user_id))
            .collect();
        Regular {
            busy,
            forecast,
            pending_parts,
            plans,
            tagged,
            uid_of,
            limited,
            len: jobs.len(),
            generation: self.slots.generation(),
        }
    }
}
