//! What bftrainerd remembers per elastic job for `bftrainer jobs`: its size over time,
//! grows, shrinks, requeues, nodes lost to preemption and node-seconds used. Fed by the
//! same engine events and actions live and at start (journal replay), so a restarted
//! daemon shows the same history.

use bftrainer_core::engine::{Action, Engine, Event, Exact, JobId, JobStatus, NodeState};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Size changes kept per job; older ones are dropped (the counters keep counting).
pub const HISTORY_CAP: usize = 1024;

/// One job's record.
#[derive(Debug, Clone, Default)]
pub struct JobBook {
    pub submitted_at: f64,
    pub admits: u32,
    pub grows: u32,
    pub shrinks: u32,
    pub requeues: u32,
    /// Nodes lost to regular jobs (each satellite preempted, each core node claimed).
    pub preemptions: u32,
    /// Nodes held, as of `since`.
    pub size: u32,
    pub since: f64,
    pub largest: u32,
    /// Node-seconds up to `since`.
    pub node_seconds: f64,
    pub history: VecDeque<SizeChange>,
    /// Size changes dropped from the front of `history` (over `HISTORY_CAP`).
    pub history_dropped: u64,
    pub ended_at: Option<f64>,
}

/// The job held `nodes` nodes from `t` (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SizeChange {
    pub t: f64,
    pub nodes: u32,
}

impl JobBook {
    /// Node-seconds used up to `now`.
    pub fn node_seconds_at(&self, now: f64) -> f64 {
        self.node_seconds + f64::from(self.size) * (now - self.since).max(0.0)
    }
}

/// The books of the jobs not forgotten, by engine job id, and the harvest total.
#[derive(Debug, Default)]
pub struct Book {
    /// Books of jobs from engine id `base` on; `None` once forgotten. Forgotten ones at
    /// the front are dropped, so what is kept follows the jobs not forgotten, not every
    /// job ever.
    jobs: VecDeque<Option<JobBook>>,
    base: usize,
    /// Jobs whose size may still change (active or holding nodes).
    open: Vec<JobId>,
    /// Node-seconds of closed size intervals, all jobs.
    closed_node_seconds: f64,
}

impl Book {
    /// Job `j`'s book; `None` if unknown or forgotten.
    pub fn get(&self, j: JobId) -> Option<&JobBook> {
        (j as usize)
            .checked_sub(self.base)
            .and_then(|k| self.jobs.get(k))
            .and_then(Option::as_ref)
    }

    fn get_mut(&mut self, j: JobId) -> Option<&mut JobBook> {
        (j as usize)
            .checked_sub(self.base)
            .and_then(|k| self.jobs.get_mut(k))
            .and_then(Option::as_mut)
    }

    /// Jobs booked, forgotten ones included (the next engine id).
    fn len(&self) -> usize {
        self.base + self.jobs.len()
    }

    /// The elastic job a regular job takes a node from with `ev`, asked before the
    /// engine sees `ev` (it forgets who held the node once it has the event).
    pub fn taken_from(engine: &Engine<Exact>, ev: &Event) -> Option<JobId> {
        let held_by = |n| match engine.node_state(n) {
            NodeState::Held(j) => Some(j),
            _ => None,
        };
        match ev {
            Event::WorkerPreempted { job, node } => held_by(*node).filter(|j| j == job),
            Event::NodeClaimed { node } => held_by(*node),
            _ => None,
        }
    }

    /// Books an event the engine accepted at `t`, with the actions it returned and the
    /// job `taken_from` named.
    pub fn event(
        &mut self,
        engine: &Engine<Exact>,
        ev: &Event,
        taken: Option<JobId>,
        actions: &[Action],
        t: f64,
    ) {
        if let Event::JobSubmitted { job, .. } = ev {
            if *job as usize == self.len() {
                self.jobs.push_back(Some(JobBook {
                    submitted_at: t,
                    since: t,
                    ..Default::default()
                }));
                self.open.push(*job);
            }
        }
        if let Some(j) = taken.and_then(|j| self.get_mut(j)) {
            j.preemptions += 1;
        }
        for a in actions {
            let Some(b) = self.get_mut(a.job()) else {
                continue;
            };
            match a {
                Action::Admit { .. } => b.admits += 1,
                Action::Grow { .. } => b.grows += 1,
                Action::Shrink { .. } => b.shrinks += 1,
                Action::Requeue { .. } => b.requeues += 1,
            }
        }
        // Sizes settle at the end of each observation round, which ends with a Tick.
        if matches!(ev, Event::Tick) {
            self.sizes(engine, t);
        }
    }

    /// Records every open job's size as the engine has it at `t`.
    fn sizes(&mut self, engine: &Engine<Exact>, t: f64) {
        let (jobs, base) = (&mut self.jobs, self.base);
        let closed = &mut self.closed_node_seconds;
        self.open.retain(|&j| {
            let Some(b) = (j as usize)
                .checked_sub(base)
                .and_then(|k| jobs.get_mut(k))
                .and_then(Option::as_mut)
            else {
                return false;
            };
            let n = engine.job_nodes(j).len() as u32;
            if n != b.size || b.history.is_empty() {
                let used = f64::from(b.size) * (t - b.since).max(0.0);
                b.node_seconds += used;
                *closed += used;
                b.size = n;
                b.since = t;
                b.largest = b.largest.max(n);
                if b.history.len() >= HISTORY_CAP {
                    b.history.pop_front();
                    b.history_dropped += 1;
                }
                b.history.push_back(SizeChange { t, nodes: n });
            }
            let ended = matches!(
                engine.job_status(j),
                JobStatus::Finished | JobStatus::Cancelled
            );
            if ended && n == 0 {
                b.ended_at.get_or_insert(t);
                return false;
            }
            true
        });
    }

    /// Drops an ended job's book (its node-seconds stay in the harvest total).
    pub fn forget(&mut self, job: JobId) {
        if let Some(k) = (job as usize).checked_sub(self.base) {
            if let Some(b) = self.jobs.get_mut(k) {
                *b = None;
            }
        }
        while let Some(None) = self.jobs.front() {
            self.jobs.pop_front();
            self.base += 1;
        }
    }

    /// Node-seconds all elastic jobs used up to `now`.
    pub fn harvested_node_seconds(&self, now: f64) -> f64 {
        self.closed_node_seconds
            + self
                .open
                .iter()
                .filter_map(|&j| self.get(j))
                .map(|b| f64::from(b.size) * (now - b.since).max(0.0))
                .sum::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::engine::ElasticSpec;

    #[test]
    fn forgotten_jobs_leave_the_book_from_the_front() {
        let engine = Engine::new(
            Default::default(),
            Exact {
                opts: bftrainer_core::alloc::Options::new(Default::default()),
            },
        );
        let mut b = Book::default();
        let spec = ElasticSpec {
            name: "1".into(),
            min_nodes: 1,
            max_nodes: 1,
            scale_up_s: 0.0,
            scale_down_s: 0.0,
            objective: Default::default(),
            user: None,
            priority: 0,
        };
        for j in 0..3 {
            let ev = Event::JobSubmitted {
                job: j,
                spec: spec.clone(),
            };
            b.event(&engine, &ev, None, &[], f64::from(j));
        }
        // The middle one first: kept in place until the front goes.
        b.forget(1);
        assert!(b.get(1).is_none() && b.get(0).is_some() && b.get(2).is_some());
        assert_eq!((b.base, b.jobs.len()), (0, 3));
        b.forget(0);
        assert_eq!((b.base, b.jobs.len()), (2, 1));
        assert_eq!(b.get(2).map(|j| j.submitted_at), Some(2.0));
        // The next job is still booked under its id.
        let ev = Event::JobSubmitted { job: 3, spec };
        b.event(&engine, &ev, None, &[], 3.0);
        assert_eq!(b.get(3).map(|j| j.submitted_at), Some(3.0));
        assert!(b.get(7).is_none());
    }
}
