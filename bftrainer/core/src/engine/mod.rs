//! The engine: one state machine for the daemon and the simulator. Events (observations
//! of the cluster, journaled) go in with the time; actions (admit, grow, shrink, requeue) come out.

mod event;

pub use event::{Action, ElasticSpec, Event, Record, EVENT_FORMAT_VERSION};

use crate::alloc::{Instance, JobInput, Options, Solution};
use crate::error::{Error, Result};
use std::collections::VecDeque;

/// Dense node number, declared by `Event::NodeAdded`.
pub type NodeId = u32;
/// Dense elastic-job number, declared by `Event::JobSubmitted`.
pub type JobId = u32;

const NONE: u32 = u32::MAX;

/// The allocation policy seen from the engine. The exact BFTrainer optimum lives in
/// `crate::alloc`; tests and what-if studies may plug in others.
pub trait Allocator {
    /// Decides every job's node set. `Ok(None)` means no proven decision within the
    /// allocator's time limit: the engine keeps the old allocation and newly idle nodes
    /// stay unused until the next decision (BFTrainer's rule).
    fn allocate(&mut self, inst: &Instance) -> std::result::Result<Option<Solution>, String>;
}

impl<A: Allocator + ?Sized> Allocator for Box<A> {
    fn allocate(&mut self, inst: &Instance) -> std::result::Result<Option<Solution>, String> {
        (**self).allocate(inst)
    }
}

/// The exact BFTrainer allocator of `crate::alloc` with its options (objective).
#[derive(Debug, Clone, Default)]
pub struct Exact {
    pub opts: Options,
}

impl Allocator for Exact {
    fn allocate(&mut self, inst: &Instance) -> std::result::Result<Option<Solution>, String> {
        crate::alloc::solve(inst, &self.opts)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// BFTrainer's forward-looking time Tfwd, seconds.
    pub t_fwd_s: f64,
    /// At most this many elastic jobs take part in allocation at once; later ones wait
    /// in submit order.
    pub max_jobs: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            t_fwd_s: 10.0,
            max_jobs: 10,
        }
    }
}

impl EngineConfig {
    /// Checks the settings; the message names the setting and what is allowed. Every
    /// driver of an engine (simulator, journal replay, bftrainerd) calls this first.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_jobs == 0 {
            return Err("max-jobs must be >= 1".into());
        }
        if !(self.t_fwd_s > 0.0 && self.t_fwd_s.is_finite()) {
            return Err(format!("t-fwd must be > 0 seconds, found {}", self.t_fwd_s));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Declared but not (yet) reported idle, or taken by a regular job.
    Busy,
    Idle,
    Held(JobId),
    /// Down or removed.
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Queued,
    /// Taking part in allocation (possibly on zero nodes).
    Active,
    Finished,
    Cancelled,
}

struct NodeSlot {
    state: NodeState,
    reclaim_at: Option<f64>,
    /// Position in `Engine::pool`, or NONE.
    pos: u32,
}

struct JobSlot {
    spec: ElasticSpec,
    status: JobStatus,
    nodes: Vec<NodeId>,
    measured_rate: Option<f64>,
    remaining: Option<f64>,
}

/// Counters of the engine's own work.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub decisions: u64,
    /// Decisions where the allocator gave no proven answer and the allocation was kept.
    pub kept: u64,
}

pub struct Engine<A> {
    cfg: EngineConfig,
    alloc: A,
    nodes: Vec<NodeSlot>,
    /// Nodes open to elastic jobs: idle or held. `inst.nodes[i]` describes `pool[i]`.
    pool: Vec<NodeId>,
    inst: Instance,
    jobs: Vec<JobSlot>,
    queue: VecDeque<JobId>,
    active: Vec<JobId>,
    /// `inst.jobs` no longer matches `active`.
    active_changed: bool,
    /// Something changed since the last decision.
    dirty: bool,
    mark: Vec<u32>,
    /// Nodes with a reclaim forecast.
    forecasts: usize,
    pub stats: EngineStats,
}

impl<A: Allocator> Engine<A> {
    pub fn new(cfg: EngineConfig, alloc: A) -> Self {
        let t_fwd_s = cfg.t_fwd_s;
        Self {
            cfg,
            alloc,
            nodes: Vec::new(),
            pool: Vec::new(),
            inst: Instance {
                t_fwd_s,
                n_nodes: 0,
                reclaim_in_s: Vec::new(),
                jobs: Vec::new(),
            },
            jobs: Vec::new(),
            queue: VecDeque::new(),
            active: Vec::new(),
            active_changed: false,
            dirty: false,
            mark: Vec::new(),
            forecasts: 0,
            stats: EngineStats::default(),
        }
    }

    pub fn allocator_mut(&mut self) -> &mut A {
        &mut self.alloc
    }

    pub fn node_state(&self, n: NodeId) -> NodeState {
        self.nodes[n as usize].state
    }

    pub fn job_nodes(&self, j: JobId) -> &[NodeId] {
        &self.jobs[j as usize].nodes
    }

    pub fn job_status(&self, j: JobId) -> JobStatus {
        self.jobs[j as usize].status
    }

    pub fn job_spec(&self, j: JobId) -> &ElasticSpec {
        &self.jobs[j as usize].spec
    }

    pub fn measured_rate(&self, j: JobId) -> Option<f64> {
        self.jobs[j as usize].measured_rate
    }

    /// Jobs taking part in allocation, in admission order.
    pub fn active(&self) -> &[JobId] {
        &self.active
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Nodes open to elastic jobs (idle or held).
    pub fn pool(&self) -> &[NodeId] {
        &self.pool
    }

    fn err(t: f64, msg: String) -> Error {
        Error::Engine { t, msg }
    }

    fn node(&self, n: NodeId, now: f64) -> Result<&NodeSlot> {
        self.nodes
            .get(n as usize)
            .ok_or_else(|| Self::err(now, format!("unknown node {n}")))
    }

    fn job(&self, j: JobId, now: f64) -> Result<&JobSlot> {
        self.jobs
            .get(j as usize)
            .ok_or_else(|| Self::err(now, format!("unknown job {j}")))
    }

    fn pool_add(&mut self, n: NodeId) {
        let slot = &mut self.nodes[n as usize];
        if slot.pos != NONE {
            return;
        }
        slot.pos = self.pool.len() as u32;
        self.pool.push(n);
    }

    fn pool_remove(&mut self, n: NodeId) {
        let pos = std::mem::replace(&mut self.nodes[n as usize].pos, NONE);
        if pos == NONE {
            return;
        }
        self.pool.swap_remove(pos as usize);
        if let Some(&moved) = self.pool.get(pos as usize) {
            self.nodes[moved as usize].pos = pos;
        }
    }

    /// Takes a node away from the elastic pool (claimed, lost); returns the job that held it.
    fn take_node(&mut self, n: NodeId, to: NodeState) -> Option<JobId> {
        let prev = std::mem::replace(&mut self.nodes[n as usize].state, to);
        if self.nodes[n as usize].reclaim_at.take().is_some() {
            self.forecasts -= 1;
        }
        self.pool_remove(n);
        match prev {
            NodeState::Held(j) => {
                let nodes = &mut self.jobs[j as usize].nodes;
                if let Some(i) = nodes.iter().position(|&x| x == n) {
                    nodes.swap_remove(i);
                }
                self.dirty = true;
                Some(j)
            }
            NodeState::Idle => {
                self.dirty = true;
                None
            }
            _ => None,
        }
    }

    fn release_job(&mut self, j: JobId, status: JobStatus) {
        let nodes = std::mem::take(&mut self.jobs[j as usize].nodes);
        for n in nodes {
            self.nodes[n as usize].state = NodeState::Idle;
        }
        let job = &mut self.jobs[j as usize];
        let was = std::mem::replace(&mut job.status, status);
        match was {
            JobStatus::Active => {
                self.active.retain(|&x| x != j);
                self.active_changed = true;
            }
            JobStatus::Queued => self.queue.retain(|&x| x != j),
            _ => {}
        }
        self.dirty = true;
    }

    /// Applies one event at time `now` (seconds; Unix time in replays). Observations
    /// return no actions; `Event::Tick` runs a decision when anything changed.
    pub fn on_event(&mut self, event: &Event, now: f64) -> Result<Vec<Action>> {
        match event {
            Event::NodeAdded { node, name: _ } => {
                if *node as usize != self.nodes.len() {
                    return Err(Self::err(
                        now,
                        format!(
                            "node {node} declared out of order: next id is {}",
                            self.nodes.len()
                        ),
                    ));
                }
                self.nodes.push(NodeSlot {
                    state: NodeState::Busy,
                    reclaim_at: None,
                    pos: NONE,
                });
            }
            Event::NodeIdle { node, reclaim_at } => {
                let slot = self.node(*node, now)?;
                let st = slot.state;
                if slot.reclaim_at != *reclaim_at {
                    self.forecasts = self.forecasts + usize::from(reclaim_at.is_some())
                        - usize::from(slot.reclaim_at.is_some());
                    self.nodes[*node as usize].reclaim_at = *reclaim_at;
                    self.dirty = true;
                }
                if matches!(st, NodeState::Busy | NodeState::Lost) {
                    self.nodes[*node as usize].state = NodeState::Idle;
                    self.pool_add(*node);
                    self.dirty = true;
                }
            }
            Event::NodeClaimed { node } => {
                self.node(*node, now)?;
                if self.nodes[*node as usize].state != NodeState::Lost {
                    self.take_node(*node, NodeState::Busy);
                }
            }
            Event::NodeLost { node } => {
                self.node(*node, now)?;
                self.take_node(*node, NodeState::Lost);
            }
            Event::JobSubmitted { job, spec } => {
                if *job as usize != self.jobs.len() {
                    return Err(Self::err(
                        now,
                        format!(
                            "job {job} submitted out of order: next id is {}",
                            self.jobs.len()
                        ),
                    ));
                }
                if spec.min_nodes == 0 || spec.max_nodes < spec.min_nodes {
                    return Err(Self::err(
                        now,
                        format!("job {}: need 1 <= min_nodes <= max_nodes", spec.name),
                    ));
                }
                self.jobs.push(JobSlot {
                    spec: spec.clone(),
                    status: JobStatus::Queued,
                    nodes: Vec::new(),
                    measured_rate: None,
                    remaining: None,
                });
                self.queue.push_back(*job);
                self.dirty = true;
            }
            Event::JobStarted { job } => {
                let st = self.job(*job, now)?.status;
                if st != JobStatus::Active {
                    return Err(Self::err(
                        now,
                        format!("job {job} reported started but it is {st:?}"),
                    ));
                }
            }
            Event::JobFinished { job } => {
                self.job(*job, now)?;
                self.release_job(*job, JobStatus::Finished);
            }
            Event::JobCancelled { job } => {
                self.job(*job, now)?;
                self.release_job(*job, JobStatus::Cancelled);
            }
            Event::WorkerJoined { job, node } => {
                self.job(*job, now)?;
                if self.node(*node, now)?.state != NodeState::Held(*job) {
                    return Err(Self::err(now, format!("worker of job {job} joined on node {node}, which the engine did not give it")));
                }
            }
            Event::WorkerLeft { job, node } => {
                self.job(*job, now)?;
                if self.node(*node, now)?.state == NodeState::Held(*job) {
                    // Left on its own: the node is idle again.
                    self.take_node(*node, NodeState::Busy);
                    self.nodes[*node as usize].state = NodeState::Idle;
                    self.pool_add(*node);
                }
            }
            Event::WorkerPreempted { job, node } => {
                self.job(*job, now)?;
                if self.node(*node, now)?.state == NodeState::Held(*job) {
                    self.take_node(*node, NodeState::Busy);
                }
            }
            Event::Progress {
                job,
                samples_per_s,
                remaining,
            } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                slot.measured_rate = Some(*samples_per_s);
                if slot.remaining != *remaining {
                    slot.remaining = *remaining;
                    self.dirty = true;
                }
            }
            Event::Tick => return self.decide(now),
        }
        Ok(Vec::new())
    }

    fn admit_from_queue(&mut self) {
        while self.active.len() < self.cfg.max_jobs {
            let Some(j) = self.queue.pop_front() else {
                break;
            };
            self.jobs[j as usize].status = JobStatus::Active;
            self.active.push(j);
            self.active_changed = true;
            self.dirty = true;
        }
    }

    fn decide(&mut self, now: f64) -> Result<Vec<Action>> {
        self.admit_from_queue();
        if !self.dirty || self.active.is_empty() {
            return Ok(Vec::new());
        }
        self.dirty = false;
        if self.active_changed {
            self.active_changed = false;
            self.inst.jobs.clear();
            for &j in &self.active {
                let s = &self.jobs[j as usize].spec;
                self.inst.jobs.push(JobInput::new(
                    &s.name,
                    s.min_nodes,
                    s.max_nodes,
                    s.scale_up_s,
                    s.scale_down_s,
                    s.objective.clone(),
                ));
            }
        }
        for (k, &j) in self.active.iter().enumerate() {
            let cur = &mut self.inst.jobs[k].current;
            cur.clear();
            cur.extend(
                self.jobs[j as usize]
                    .nodes
                    .iter()
                    .map(|&n| self.nodes[n as usize].pos),
            );
            cur.sort_unstable();
            self.inst.jobs[k].remaining_work = self.jobs[j as usize].remaining;
        }
        self.inst.n_nodes = self.pool.len() as u32;
        self.inst.reclaim_in_s.clear();
        // An empty vector means "no forecasts" to the allocator: skip the per-node work
        // when no node has one (node-event traces).
        if self.forecasts > 0 {
            let nodes = &self.nodes;
            self.inst.reclaim_in_s.extend(
                self.pool
                    .iter()
                    .map(|&n| nodes[n as usize].reclaim_at.map(|r| (r - now).max(0.0))),
            );
        }
        self.stats.decisions += 1;
        let sol = self
            .alloc
            .allocate(&self.inst)
            .map_err(|msg| Error::Alloc { t: now, msg })?;
        let Some(sol) = sol else {
            self.stats.kept += 1;
            return Ok(Vec::new());
        };
        self.apply(sol, now)
    }

    /// Checks the allocator's answer against its contract, then turns it into actions:
    /// shrinks first, so the environment frees nodes before others grow onto them.
    fn apply(&mut self, sol: Solution, now: f64) -> Result<Vec<Action>> {
        let bad = |msg: String| Err(Error::Alloc { t: now, msg });
        if sol.jobs.len() != self.active.len() {
            return bad(format!(
                "{} node sets for {} jobs",
                sol.jobs.len(),
                self.active.len()
            ));
        }
        self.mark.clear();
        self.mark.resize(self.pool.len(), NONE);
        for (k, set) in sol.jobs.iter().enumerate() {
            let spec = &self.jobs[self.active[k] as usize].spec;
            let n = set.len() as u32;
            if n != 0 && (n < spec.min_nodes || n > spec.max_nodes) {
                return bad(format!(
                    "job {} given {n} nodes, allowed 0 or {}..{}",
                    spec.name, spec.min_nodes, spec.max_nodes
                ));
            }
            for &i in set {
                match self.mark.get(i as usize) {
                    None => {
                        return bad(format!(
                            "node index {i} out of range (pool of {})",
                            self.pool.len()
                        ))
                    }
                    Some(&m) if m != NONE => {
                        return bad(format!("node index {i} given to two jobs"))
                    }
                    _ => self.mark[i as usize] = k as u32,
                }
            }
        }
        let mut shrinks = Vec::new();
        let mut grows = Vec::new();
        for (k, set) in sol.jobs.iter().enumerate() {
            let j = self.active[k];
            let old = &self.jobs[j as usize].nodes;
            let added: Vec<NodeId> = set
                .iter()
                .map(|&i| self.pool[i as usize])
                .filter(|&n| self.nodes[n as usize].state != NodeState::Held(j))
                .collect();
            let removed: Vec<NodeId> = old
                .iter()
                .copied()
                .filter(|&n| self.mark[self.nodes[n as usize].pos as usize] != k as u32)
                .collect();
            if !added.is_empty() && !removed.is_empty() {
                return bad(format!(
                    "job {} both grows and shrinks in one decision (migration)",
                    self.jobs[j as usize].spec.name
                ));
            }
            if !removed.is_empty() {
                shrinks.push(if set.is_empty() {
                    Action::Requeue {
                        job: j,
                        nodes: removed,
                    }
                } else {
                    Action::Shrink {
                        job: j,
                        nodes: removed,
                    }
                });
            } else if !added.is_empty() {
                grows.push(if old.is_empty() {
                    Action::Admit {
                        job: j,
                        nodes: added,
                    }
                } else {
                    Action::Grow {
                        job: j,
                        nodes: added,
                    }
                });
            }
        }
        for a in shrinks.iter().chain(&grows) {
            match a {
                Action::Shrink { job, nodes } | Action::Requeue { job, nodes } => {
                    for &n in nodes {
                        self.nodes[n as usize].state = NodeState::Idle;
                    }
                    let keep = &mut self.jobs[*job as usize].nodes;
                    keep.retain(|n| !nodes.contains(n));
                }
                Action::Admit { job, nodes } | Action::Grow { job, nodes } => {
                    for &n in nodes {
                        self.nodes[n as usize].state = NodeState::Held(*job);
                    }
                    self.jobs[*job as usize].nodes.extend_from_slice(nodes);
                }
            }
        }
        shrinks.extend(grows);
        Ok(shrinks)
    }
}
