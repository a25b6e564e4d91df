//! bftrainerd: watches Slurm, feeds the engine, and makes Slurm follow its decisions.
//!
//! One cycle (`Daemon::cycle`), every `[daemon] poll_interval`:
//! 1. **observe**: refresh the cluster view; turn what Slurm shows into engine events
//!    (nodes idle / claimed / lost with reclaim forecasts; elastic core jobs submitted,
//!    started, ended, preempted; satellites joined, preempted, failed);
//! 2. **decide**: journal each event and feed it to the engine, then one `Tick`;
//!    the journal is synced before anything is acted on;
//! 3. **reconcile**: compare what the engine holds (per job: core nodes and the rest)
//!    with the core and satellite jobs Slurm has, and make idempotent Slurm calls to
//!    close the gap: pin and release a core job (admit), submit a satellite per extra
//!    node (grow), SIGTERM then cancel a satellite (shrink), requeue and hold a core
//!    job (requeue), cancel orphans. Every call is re-derived from state each cycle, so
//!    a failed or lost call is retried and a restart after `kill -9` converges too.
//!
//! Slurm is the source of truth for who holds what; the journal keeps what Slurm does
//! not (node and job ids, the engine's decisions), replayed into the engine at start.

pub mod blame;
pub mod book;
pub mod cluster;
pub mod config;
pub mod control;
pub mod gen;
pub mod journal;
pub mod metrics;
pub mod run;
pub mod view;

use bftrainer_core::alloc::Curve;
use bftrainer_core::constraint::Constraint;
use bftrainer_core::engine::{
    ElasticSpec, Engine, Event, Exact, JobId, JobStatus, Lending, Mode, NodeId, NodeState, Record,
    EVENT_FORMAT_VERSION,
};
use bftrainer_core::runtime::RunComment;
use bftrainer_core::spec::{self, Role};
use bftrainer_slurm::{BatchJob, Job, JobBase, JobUpdate, SignalTarget};
use cluster::Cluster;
use config::Config;
use journal::Journal;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What the daemon believes a node is, as last told to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Open to elastic jobs (idle, or held by one), with the backfill plan's forecast.
    Available { reclaim_at: Option<f64> },
    /// A regular job holds it or is about to.
    Claimed,
    /// Down, drained, failing, reserved, in maintenance, or set aside by the daemon.
    Lost,
}

#[derive(Debug)]
struct NodeRec {
    name: String,
    /// The forecast last sent with `NodeIdle`.
    sent_forecast: Option<f64>,
    class: Class,
    /// Why the node has its class, as last observed (for `bftrainer nodes`).
    why: Why,
}

/// Why a node is or is not open to elastic jobs, as the last observation decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Idle or held by an elastic job: open to elastic jobs.
    Open,
    /// A regular job holds it.
    RegularJob,
    /// Idle, but the backfill plan gives it to a regular job within `release_before`.
    Planned,
    /// Idle after a regular job left while regular jobs wait in its partitions.
    QueueWaits,
    /// Taken from an elastic job by preemption moments ago (`reclaim_hold`).
    Reclaimed,
    /// Down, drained, in a reservation or maintenance.
    Unavailable,
    /// Set aside by bftrainerd after failed satellites.
    SetAside,
    /// slurmctld has not decided (restart, missed pings).
    NotResponding,
}

impl Why {
    /// The name in `--json` and in `bftrainer nodes`.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Open => "open",
            Why::RegularJob => "regular_job",
            Why::Planned => "planned",
            Why::QueueWaits => "queue_waits",
            Why::Reclaimed => "reclaimed",
            Why::Unavailable => "unavailable",
            Why::SetAside => "set_aside",
            Why::NotResponding => "not_responding",
        }
    }
}

/// A node whose satellites keep failing: set aside until `until`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SetAside {
    pub failures: u32,
    pub until: f64,
    pub reason: String,
}

/// A core job the daemon manages.
#[derive(Debug)]
struct Core {
    jid: JobId,
    uid: u32,
    gid: u32,
    /// When the daemon released it onto its nodes (admit in flight).
    admit_at: Option<f64>,
    /// The nodes it was pinned to at that admission (host expression).
    pinned: Option<String>,
    /// JobStarted sent for the current run.
    started: bool,
    /// Preemption of the current run seen (nodes given up in the engine).
    preempting: bool,
    /// Restart count last seen: a higher one means Slurm requeued it.
    restarts: u16,
    /// When the daemon last asked Slurm to requeue or hold it (not more than once per
    /// few seconds).
    asked_at: f64,
    ended: bool,
    /// When the daemon saw it end (for `[daemon] job_retention`).
    ended_at: f64,
    /// The runtime's last published rate (samples/s) and size, from the job's Comment.
    rate: Option<(f64, u32)>,
    /// The runtime's last measured seconds per training step, from the job's Comment
    /// (0: never measured). Sets how long a shrunk satellite gets to leave.
    step_s: f64,
    user: Option<String>,
}

/// What the daemon remembers of one satellite job.
#[derive(Debug, Default)]
struct SatMemo {
    parent: u32,
    node: String,
    joined: bool,
    signalled_at: Option<f64>,
    /// Shrunk: cancelled this long after its SIGTERM (`shrink_deadline`).
    cancel_after: Option<f64>,
    /// The daemon ended it (shrink, orphan, timeout): its end is not a failure.
    ending: bool,
    preempted: bool,
    done: bool,
}

/// Counters since start.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Stats {
    pub cycles: u64,
    pub admits: u64,
    pub grows: u64,
    pub shrinks: u64,
    pub requeues: u64,
    pub preemptions: u64,
    pub satellite_failures: u64,
    pub slurm_errors: u64,
    pub events: u64,
    pub not_adopted: u64,
    /// Decisions the engine refused (an allocator or contract error): logged and
    /// skipped, the loop goes on.
    #[serde(default)]
    pub refused_decisions: u64,
    /// Journal records refused at start-up (logged and skipped).
    #[serde(default)]
    pub journal_skipped: u64,
    /// Jobs whose growth was paused after failures of their own (`blame`).
    #[serde(default)]
    pub job_pauses: u64,
    /// Lending calls left for the next cycle when one ran over `cycle_budget`.
    #[serde(default)]
    pub deferred_calls: u64,
}

/// What one cycle did (for logs, tests and the benchmark).
#[derive(Debug, Clone, Default)]
pub struct CycleReport {
    pub slurm_ok: bool,
    pub changed: bool,
    pub events: usize,
    pub actions: usize,
    pub calls: usize,
    /// Seconds spent reading Slurm, and observing + deciding.
    pub poll_s: f64,
    pub decide_s: f64,
}

pub struct Daemon<C: Cluster> {
    pub cfg: Config,
    pub cluster: C,
    engine: Engine<Exact>,
    journal: Option<Journal>,
    nodes: Vec<NodeRec>,
    node_ids: HashMap<String, NodeId>,
    /// Engine job -> Slurm job id of its core job.
    jobs: Vec<u32>,
    cores: BTreeMap<u32, Core>,
    sats: HashMap<u32, SatMemo>,
    set_aside: HashMap<NodeId, SetAside>,
    /// Failed growths charged to jobs, and users' failures per node (`blame`).
    blame: blame::Blame,
    /// Waiting jobs no lent node can serve, and why (`unservable_why`).
    unservable: HashMap<u32, String>,
    /// When slurmctld last answered again after an outage: a satellite that waited
    /// through one is not charged to anyone.
    outage_ended: f64,
    /// Jobs with a tag the daemon refused to adopt (logged once each).
    refused: HashSet<u32>,
    last_t: f64,
    last_full: f64,
    outage_since: Option<f64>,
    expand_cache: HashMap<String, Vec<String>>,
    /// Nodes taken from elastic jobs by preemption, and when: not lent again for
    /// `reclaim_hold_s` unless a regular job shows up there first.
    reclaimed: HashMap<NodeId, f64>,
    /// Nodes whose hold after a regular job left has run during this idle period: not
    /// held again until a job runs there (else a long queue of regular jobs that do not
    /// fit would keep the node from ever being lent).
    held_after_job: HashSet<NodeId>,
    /// The first cycle's time.
    started_at: Option<f64>,
    pub stats: Stats,
    pending: Vec<Event>,
    /// Per-job history for `bftrainer jobs`.
    book: book::Book,
    /// The last error logged, for `bftrainer status`.
    last_error: Option<view::LastError>,
    /// The current cycle's time (for `last_error`).
    clock: f64,
    /// When the current cycle began (for `[daemon] cycle_budget`).
    cycle_t0: Option<std::time::Instant>,
    /// Recent cycle timings: the Slurm refresh, and observe + decide.
    pub poll_times: view::Window,
    pub decide_times: view::Window,
}

/// The longest pause of a job's growth and the longest set-aside of a node.
pub const MAX_BACKOFF_S: f64 = 3600.0;
/// The pause of a job no lent node can serve, lifted as soon as one can (a year).
const UNSERVABLE_PAUSE_S: f64 = 365.0 * 86_400.0;

fn record(t: f64, event: Event) -> Record {
    Record {
        v: EVENT_FORMAT_VERSION,
        t,
        event,
    }
}

/// The tag, name and partition of the satellite of `parent` that bftrainerd writes; a
/// satellite that differs from them in any way is not adopted.
pub fn satellite_tag(parent: u32) -> String {
    spec::ElasticSpec {
        min: 1,
        max: Some(1),
        role: Role::Satellite,
        parent: Some(parent),
        ..Default::default()
    }
    .to_tag()
}

pub fn satellite_name(parent: u32) -> String {
    format!("bftsat-{parent}")
}

fn is_running(j: &Job) -> bool {
    matches!(j.state.base(), JobBase::Running | JobBase::Suspended)
}

impl<C: Cluster> Daemon<C> {
    /// A daemon over `cluster`, its engine rebuilt from `records` (the journal).
    pub fn new(
        cfg: Config,
        cluster: C,
        journal: Option<Journal>,
        records: &[Record],
    ) -> anyhow::Result<Self> {
        cfg.engine
            .validate()
            .map_err(|m| anyhow::anyhow!("{}: [engine] {m}", cfg.path.display()))?;
        let engine = Engine::new(
            cfg.engine.clone(),
            Exact {
                opts: bftrainer_core::alloc::Options::new(cfg.objective),
            },
        );
        let mut d = Daemon {
            cfg,
            cluster,
            engine,
            journal,
            nodes: Vec::new(),
            node_ids: HashMap::new(),
            jobs: Vec::new(),
            cores: BTreeMap::new(),
            sats: HashMap::new(),
            set_aside: HashMap::new(),
            blame: blame::Blame::default(),
            unservable: HashMap::new(),
            outage_ended: f64::NEG_INFINITY,
            refused: HashSet::new(),
            last_t: f64::NEG_INFINITY,
            last_full: f64::NEG_INFINITY,
            outage_since: None,
            expand_cache: HashMap::new(),
            reclaimed: HashMap::new(),
            held_after_job: HashSet::new(),
            started_at: None,
            stats: Stats::default(),
            pending: Vec::new(),
            book: book::Book::default(),
            last_error: None,
            clock: 0.0,
            cycle_t0: None,
            poll_times: view::Window::default(),
            decide_times: view::Window::default(),
        };
        d.restore(records);
        Ok(d)
    }

    /// Feeds one event to the engine and books what it did (`book`).
    fn feed(
        &mut self,
        ev: &Event,
        t: f64,
    ) -> bftrainer_core::Result<Vec<bftrainer_core::engine::Action>> {
        let taken = book::Book::taken_from(&self.engine, ev);
        let actions = self.engine.on_event(ev, t)?;
        self.book.event(&self.engine, ev, taken, &actions, t);
        Ok(actions)
    }

    /// Keeps the daemon's maps in step with an event the engine accepted.
    fn learn(&mut self, ev: &Event) -> anyhow::Result<()> {
        match ev {
            Event::NodeAdded { node, name } => {
                self.node_ids.insert(name.clone(), *node);
                self.nodes.push(NodeRec {
                    name: name.clone(),
                    sent_forecast: None,
                    class: Class::Claimed,
                    why: Why::RegularJob,
                });
            }
            Event::NodeIdle { node, reclaim_at } => {
                let n = &mut self.nodes[*node as usize];
                n.sent_forecast = *reclaim_at;
                n.class = Class::Available {
                    reclaim_at: *reclaim_at,
                };
            }
            Event::NodeClaimed { node } => self.nodes[*node as usize].class = Class::Claimed,
            Event::NodeLost { node } => self.nodes[*node as usize].class = Class::Lost,
            Event::JobForgotten { job } => self.book.forget(*job),
            Event::JobSubmitted { spec, .. } => {
                let id: u32 = spec.name.parse().map_err(|_| {
                    anyhow::anyhow!("journal: job name '{}' is not a Slurm job id", spec.name)
                })?;
                self.jobs.push(id);
            }
            _ => {}
        }
        Ok(())
    }

    pub fn engine(&self) -> &Engine<Exact> {
        &self.engine
    }

    /// Applies the new config (SIGHUP). The state directory cannot change while running.
    pub fn reconfigure(&mut self, cfg: Config) {
        if cfg.state_dir != self.cfg.state_dir {
            log::warn!(
                "reload: [daemon] state_dir changed to {}; it takes effect at the next start",
                cfg.state_dir.display()
            );
        }
        self.engine.set_config(cfg.engine.clone());
        self.engine.allocator_mut().opts = bftrainer_core::alloc::Options::new(cfg.objective);
        let state_dir = self.cfg.state_dir.clone();
        self.cfg = cfg;
        self.cfg.state_dir = state_dir;
        log::info!("reloaded {}", self.cfg.path.display());
    }

    /// An event with Slurm's names instead of engine ids, for logs.
    fn describe(&self, ev: &Event) -> String {
        let node = |n: &NodeId| {
            self.nodes
                .get(*n as usize)
                .map_or("?", |r| r.name.as_str())
                .to_string()
        };
        let job = |j: &JobId| {
            self.jobs
                .get(*j as usize)
                .map_or("?".into(), u32::to_string)
        };
        match ev {
            Event::NodeIdle {
                node: n,
                reclaim_at,
            } => format!("node {} idle (reclaim {reclaim_at:?})", node(n)),
            Event::NodeClaimed { node: n } => format!("node {} claimed", node(n)),
            Event::NodeLost { node: n } => format!("node {} lost", node(n)),
            Event::WorkerJoined { job: j, node: n } => {
                format!("job {} joined on {}", job(j), node(n))
            }
            Event::WorkerLeft { job: j, node: n } => format!("job {} left {}", job(j), node(n)),
            Event::WorkerPreempted { job: j, node: n } => {
                format!("job {} preempted on {}", job(j), node(n))
            }
            Event::JobStarted { job: j } => format!("job {} started", job(j)),
            Event::JobFinished { job: j } => format!("job {} finished", job(j)),
            Event::JobCancelled { job: j } => format!("job {} cancelled", job(j)),
            Event::Progress {
                job: j,
                samples_per_s,
                ..
            } => format!("job {} measures {samples_per_s:.1} samples/s", job(j)),
            other => format!("{other:?}"),
        }
    }

    /// Logs an error and keeps it for `bftrainer status`.
    pub fn error(&mut self, message: String) {
        log::error!("{message}");
        self.last_error = Some(view::LastError {
            time: self.clock,
            message,
        });
    }

    /// Opens, pauses or drains lending (`bftrainer resume|pause|drain`): journaled, so
    /// it holds across restarts; the next cycle acts on it.
    pub fn set_lending(&mut self, mode: Lending, now: f64) -> anyhow::Result<()> {
        let now = now.max(self.last_t);
        let ev = Event::Lending { mode };
        self.feed(&ev, now)
            .map_err(|e| anyhow::anyhow!("engine: {e}"))?;
        self.last_t = now;
        if let Some(j) = self.journal.as_mut() {
            j.push(&record(now, ev));
            j.flush()?;
        }
        log::info!(
            "lending {} (asked through the control socket)",
            mode.as_str()
        );
        Ok(())
    }

    fn node_name(&self, n: NodeId) -> &str {
        &self.nodes[n as usize].name
    }

    fn names(&self, nodes: &[NodeId]) -> String {
        let mut v: Vec<String> = nodes
            .iter()
            .map(|&n| self.node_name(n).to_string())
            .collect();
        v.sort_unstable();
        self.cluster.compress(&v)
    }

    fn expand(&mut self, expr: &str) -> Vec<String> {
        if let Some(v) = self.expand_cache.get(expr) {
            return v.clone();
        }
        if self.expand_cache.len() > 100_000 {
            self.expand_cache.clear();
        }
        let v = self.cluster.expand(expr);
        self.expand_cache.insert(expr.to_string(), v.clone());
        v
    }

    fn emit(&mut self, ev: Event) {
        self.pending.push(ev);
    }

    /// One poll: observe, decide, reconcile. `now` is Unix time in seconds.
    pub fn cycle(&mut self, now: f64) -> anyhow::Result<CycleReport> {
        let now = now.max(self.last_t);
        self.clock = now;
        let mut rep = CycleReport::default();
        self.stats.cycles += 1;
        // plan_refresh 0: never force a full job load (node-table changes still do).
        let full = self.cfg.plan_refresh_s > 0.0 && now - self.last_full >= self.cfg.plan_refresh_s;
        let t0 = std::time::Instant::now();
        self.cycle_t0 = Some(t0);
        let refreshed = self.cluster.refresh(full);
        rep.poll_s = t0.elapsed().as_secs_f64();
        // What was observed is as of the end of the refresh, not its start (a slow
        // slurmctld can take seconds).
        let now = now + rep.poll_s;
        self.clock = now;
        self.poll_times.push(rep.poll_s);
        match refreshed {
            Err(e) => {
                if self.outage_since.is_none() {
                    self.error(format!(
                        "slurmctld does not answer ({e}); retrying every {:?}, logged once per outage",
                        self.cfg.poll_interval
                    ));
                    self.outage_since = Some(now);
                }
                self.stats.slurm_errors += 1;
                return Ok(rep);
            }
            Ok(r) => {
                if let Some(t0) = self.outage_since.take() {
                    log::info!("slurmctld answers again after {:.1} s", now - t0);
                    self.outage_ended = now;
                }
                if full {
                    self.last_full = now;
                }
                rep.changed = r.any();
            }
        }
        rep.slurm_ok = true;
        let t0 = std::time::Instant::now();
        self.observe(now);
        rep.events = self.pending.len();
        let actions = self.decide(now)?;
        rep.decide_s = t0.elapsed().as_secs_f64();
        self.decide_times.push(rep.decide_s);
        rep.actions = actions;
        rep.calls = self.reconcile(now);
        self.last_t = now;
        Ok(rep)
    }

    /// Feeds pending events and a Tick to the engine, journaling what it accepts, and
    /// syncs the journal. Returns the number of actions the engine decided.
    fn decide(&mut self, now: f64) -> anyhow::Result<usize> {
        let events = std::mem::take(&mut self.pending);
        let mut accepted = 0usize;
        for ev in events {
            match self.feed(&ev, now) {
                Ok(_) => {
                    log::debug!("event {}", self.describe(&ev));
                    accepted += 1;
                    self.learn(&ev)?;
                    if let Some(j) = self.journal.as_mut() {
                        j.push(&record(now, ev));
                    }
                }
                Err(e) => log::warn!("engine refused {ev:?}: {e}"),
            }
        }
        self.stats.events += accepted as u64;
        let decisions = self.engine.stats.decisions;
        let actions = match self.feed(&Event::Tick, now) {
            Ok(a) => a,
            Err(e) => {
                // Never fatal (a restart would make the same decision): the engine
                // applied none of it, and decides again at the next change.
                self.stats.refused_decisions += 1;
                self.error(format!("decision refused, skipped: {e}"));
                Vec::new()
            }
        };
        // The decision is journaled with its Tick, so that a restart restores it as
        // it was made instead of deciding again under another config.
        let activated = self.engine.take_activated();
        if accepted > 0
            || self.engine.stats.decisions != decisions
            || !activated.is_empty()
            || !actions.is_empty()
        {
            if let Some(j) = self.journal.as_mut() {
                j.push(&record(now, Event::Tick));
                j.push(&record(
                    now,
                    Event::Decided {
                        activated,
                        actions: actions.clone(),
                    },
                ));
            }
        }
        if let Some(j) = self.journal.as_mut() {
            j.flush()?;
        }
        if self.journal.as_ref().is_some_and(|j| j.compact_due()) {
            self.compact_journal()?;
        }
        for a in &actions {
            let what = match a {
                bftrainer_core::engine::Action::Admit { .. } => "admit",
                bftrainer_core::engine::Action::Grow { .. } => "grow",
                bftrainer_core::engine::Action::Shrink { .. } => "shrink",
                bftrainer_core::engine::Action::Requeue { .. } => "requeue",
            };
            log::info!(
                "decision: {what} job {} {} {}",
                self.jobs[a.job() as usize],
                if what == "admit" || what == "grow" {
                    "onto"
                } else {
                    "off"
                },
                self.names(a.nodes())
            );
        }
        Ok(actions.len())
    }

    // ------------------------------------------------------------------ observe

    fn observe(&mut self, now: f64) {
        let parts = self.cfg.elastic_partitions();
        let parts: Vec<String> = parts.into_iter().map(str::to_string).collect();
        // Which jobs are ours, and which hold or will take which nodes.
        let mut foreign_busy: HashSet<String> = HashSet::new();
        let mut forecast: HashMap<String, f64> = HashMap::new();
        let mut our_nodes: HashSet<String> = HashSet::new();
        // Partitions where regular jobs wait.
        let mut pending_parts: HashSet<String> = HashSet::new();
        let mut cores_seen: HashMap<u32, usize> = HashMap::new();
        let mut sats: Vec<(usize, u32)> = Vec::new(); // (index in jobs, parent)
        let mut modified_sats: Vec<(u32, u32)> = Vec::new(); // (job id, parent)
                                                             // One pass over the snapshot without copying it: tagged jobs are cloned (few),
                                                             // of the others only the node expressions are kept.
        let mut jobs: Vec<Job> = Vec::new();
        let mut foreign_holding: Vec<String> = Vec::new();
        let mut foreign_planned: Vec<(String, i64)> = Vec::new();
        for j in self.cluster.jobs() {
            if j.admin_comment.as_deref().is_some_and(spec::looks_like_tag) {
                jobs.push(j.clone());
            } else if is_running(j) || j.state.is_completing() {
                if let Some(e) = &j.nodes {
                    foreign_holding.push(e.clone());
                }
            } else if j.state.base() == JobBase::Pending && !j.is_held() {
                if let Some(p) = &j.partition {
                    for p in p.split(',') {
                        if !pending_parts.contains(p) {
                            pending_parts.insert(p.to_string());
                        }
                    }
                }
                if let (Some(e), Some(start)) = (&j.sched_nodes, j.expected_start()) {
                    foreign_planned.push((e.clone(), start));
                }
            }
        }
        for expr in foreign_holding {
            for n in self.expand(&expr) {
                // A regular job is there: a hold after a preemption has served.
                if let Some(id) = self.node_ids.get(&n) {
                    self.reclaimed.remove(id);
                }
                foreign_busy.insert(n);
            }
        }
        // Each pending regular job's planned nodes, kept whole: a plan that runs over a
        // core's node is not acted on early (below).
        let mut plans: Vec<Vec<String>> = Vec::new();
        for (expr, start) in foreign_planned {
            let nodes = self.expand(&expr);
            for n in &nodes {
                let e = forecast.entry(n.clone()).or_insert(start as f64);
                *e = e.min(start as f64);
            }
            plans.push(nodes);
        }
        let uid_of: HashMap<u32, u32> = jobs.iter().map(|j| (j.job_id, j.user_id)).collect();
        for (i, j) in jobs.iter().enumerate() {
            let tag = j.admin_comment.as_deref().and_then(spec::parse_tag);
            let ours = match tag {
                Some(Ok(s)) if s.role == Role::Core => {
                    if j.partition
                        .as_deref()
                        .is_some_and(|p| self.cfg.core_partition_ok(p))
                    {
                        cores_seen.insert(j.job_id, i);
                        true
                    } else {
                        self.refuse(j, "a core tag outside the elastic partitions");
                        false
                    }
                }
                Some(Ok(s)) if s.role == Role::Satellite => {
                    let parent = s.parent.unwrap_or(0);
                    let consistent = j.admin_comment.as_deref() == Some(&satellite_tag(parent))
                        && j.name == satellite_name(parent)
                        && j.partition.as_deref() == Some(self.cfg.satellite_partition.as_str())
                        && uid_of.get(&parent).map_or(true, |&u| u == j.user_id)
                        && self.cores.get(&parent).map_or(true, |c| c.uid == j.user_id);
                    // One of ours that its owner changed since (renamed, moved to
                    // another partition...; the plugin refuses that, this is for a
                    // change made around it): it no longer counts as a satellite, so it
                    // is cancelled rather than left running unmanaged.
                    let modified = !consistent
                        && self
                            .cores
                            .get(&parent)
                            .is_some_and(|c| c.uid == j.user_id && !c.ended)
                        && uid_of.get(&parent).map_or(true, |&u| u == j.user_id);
                    if consistent {
                        sats.push((i, parent));
                        true
                    } else if modified {
                        if j.state.is_active() {
                            modified_sats.push((j.job_id, parent));
                        }
                        false
                    } else {
                        self.refuse(
                            j,
                            "a satellite tag, name, partition or owner bftrainerd did not write",
                        );
                        false
                    }
                }
                Some(_) => {
                    if j.state.is_active() {
                        self.refuse(j, "a malformed bftrainer tag");
                    }
                    false
                }
                None => false,
            };
            let holding = is_running(j) || j.state.is_completing();
            if holding {
                if let Some(expr) = j.nodes.clone() {
                    for n in self.expand(&expr) {
                        if ours {
                            // A satellite or core being preempted goes to a regular job.
                            if j.preempt_time.is_some() {
                                if let Some(&id) = self.node_ids.get(&n) {
                                    self.reclaimed.insert(id, now);
                                }
                                foreign_busy.insert(n);
                            } else {
                                our_nodes.insert(n);
                            }
                        } else {
                            foreign_busy.insert(n);
                        }
                    }
                }
            } else if !ours && j.state.base() == JobBase::Pending && !j.is_held() {
                // A job with a bftrainer-looking tag that is not ours counts as regular.
                if let Some(p) = &j.partition {
                    pending_parts.extend(p.split(',').map(str::to_string));
                }
                if let (Some(expr), Some(start)) = (j.sched_nodes.clone(), j.expected_start()) {
                    let nodes = self.expand(&expr);
                    for n in &nodes {
                        let e = forecast.entry(n.clone()).or_insert(start as f64);
                        *e = e.min(start as f64);
                    }
                    plans.push(nodes);
                }
            }
        }

        // Core nodes are not released early on a forecast: losing one requeues the
        // whole job, and a pending job's planned nodes may change (measured: a 1-node
        // job planned on a core's node while Slurm preempted a satellite for it).
        let mut core_nodes: HashSet<String> = self
            .cores
            .values()
            .filter(|c| !c.ended)
            .flat_map(|c| self.engine.job_anchors(c.jid).iter())
            .map(|&n| self.nodes[n as usize].name.clone())
            .collect();
        // ... and where Slurm says the cores run, whatever the engine holds.
        for &i in cores_seen.values() {
            if is_running(&jobs[i]) {
                if let Some(e) = &jobs[i].nodes {
                    core_nodes.extend(self.expand(e));
                }
            }
        }
        // Nor are the other nodes of a plan that includes a core's node: freeing them
        // would only help Slurm start the job there, requeueing the core. Slurm's own
        // preemption picks satellites first (their partition's lower PriorityTier);
        // measured on 24.11 and 26.05, whose plan for a 2-node job named a satellite's
        // node and the core's while Slurm was preempting two other satellites for it.
        // A plan that cannot fit beside the cores (a job as large as the partition) has
        // to preempt one anyway: its other nodes are released ahead as usual.
        let non_core = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| n.partitions.iter().any(|p| parts.contains(p)))
            .filter(|n| !core_nodes.contains(&n.name))
            .count();
        // While Slurm preempts elastic jobs for a regular job (or just did: their nodes
        // are reclaimed), it has chosen the nodes; the pending job's plan can still name
        // others (24.11 and 26.05 keep it pending until the preempted jobs completed),
        // and releasing those too would only shrink the elastic job for nothing.
        let preempting = !self.reclaimed.is_empty()
            || jobs
                .iter()
                .any(|j| is_running(j) && j.preempt_time.is_some());
        let steers = |p: &[String]| p.len() <= non_core && p.iter().any(|n| core_nodes.contains(n));
        let mut steered: HashSet<String> =
            plans.into_iter().filter(|p| steers(p)).flatten().collect();
        // Nodes backfill flagged PLANNED without a plan we can read (sched_nodes unset)
        // count as one plan.
        let flagged: Vec<String> = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| n.state.is_planned() && !forecast.contains_key(&n.name))
            .map(|n| n.name.clone())
            .collect();
        if steers(&flagged) {
            steered.extend(flagged);
        }
        // Nodes.
        let mut cluster_nodes: Vec<(String, Option<Class>, Why)> = Vec::new();
        for n in self.cluster.nodes() {
            if !n.partitions.iter().any(|p| parts.contains(p)) {
                continue;
            }
            let st = n.state;
            let uncertain =
                st.is_not_responding() || st.base() == bftrainer_slurm::NodeBase::Unknown;
            let reclaimed = self
                .node_ids
                .get(&n.name)
                .and_then(|id| self.reclaimed.get(id))
                .is_some_and(|&t| now - t < self.cfg.reclaim_hold_s);
            let node_id = self.node_ids.get(&n.name).copied();
            let busy = foreign_busy.contains(&n.name)
                || (!our_nodes.contains(&n.name) && st.base() != bftrainer_slurm::NodeBase::Idle)
                || our_nodes.contains(&n.name);
            if busy {
                if let Some(id) = node_id {
                    self.held_after_job.remove(&id);
                }
            }
            let (class, why) = if uncertain
                && !st.is_drain()
                && st.base() != bftrainer_slurm::NodeBase::Down
            {
                // slurmctld just restarted, or the node misses pings: Slurm has not
                // decided; neither have we (no event until it does).
                (None, Why::NotResponding)
            } else if st.is_drain()
                && !st.is_unavailable()
                && !st.is_reserved()
                && our_nodes.contains(&n.name)
                && core_nodes.contains(&n.name)
            {
                // Draining under a running core job: drain lets running jobs finish,
                // and losing the node would requeue the whole job. It keeps the node,
                // with a forecast of now so nothing more is lent there; the node is lost
                // once the core leaves it (drained).
                (
                    Some(Class::Available {
                        reclaim_at: Some(now),
                    }),
                    Why::Unavailable,
                )
            } else if st.is_unavailable() || st.is_drain() || st.is_reserved() {
                (Some(Class::Lost), Why::Unavailable)
            } else if foreign_busy.contains(&n.name) {
                (Some(Class::Claimed), Why::RegularJob)
            } else if !our_nodes.contains(&n.name) && st.base() != bftrainer_slurm::NodeBase::Idle {
                // Allocated to something not in our snapshot (a job just started).
                (Some(Class::Claimed), Why::RegularJob)
            } else if !our_nodes.contains(&n.name)
                && n.partitions.iter().any(|p| pending_parts.contains(p))
                && self
                    .node_ids
                    .get(&n.name)
                    .is_some_and(|&id| self.nodes[id as usize].class == Class::Claimed)
                && !reclaimed
                && !node_id.is_some_and(|id| self.held_after_job.contains(&id))
            {
                // A regular job just left while regular jobs wait in its partitions:
                // Slurm's scheduler is about to fill it; lend it only if it stays idle.
                if let Some(id) = node_id {
                    self.reclaimed.insert(id, now);
                    self.held_after_job.insert(id);
                }
                (Some(Class::Claimed), Why::QueueWaits)
            } else if reclaimed && !our_nodes.contains(&n.name) {
                // Taken from an elastic job by preemption moments ago: the regular job
                // that preempted it is about to start there; do not lend it back.
                (Some(Class::Claimed), Why::Reclaimed)
            } else {
                let mut r = forecast.get(&n.name).copied();
                if r.is_none() && st.is_planned() {
                    r = Some(now);
                }
                match r {
                    Some(t)
                        if t <= now + self.cfg.release_before_s
                            && !core_nodes.contains(&n.name)
                            && !steered.contains(&n.name)
                            && !preempting =>
                    {
                        (Some(Class::Claimed), Why::Planned)
                    }
                    _ => (Some(Class::Available { reclaim_at: r }), Why::Open),
                }
            };
            cluster_nodes.push((n.name.clone(), class, why));
        }
        self.reclaimed
            .retain(|_, t| now - *t < self.cfg.reclaim_hold_s);
        for (id, parent) in modified_sats {
            let memo = self.sats.entry(id).or_default();
            if memo.signalled_at.is_some_and(|t| now - t < 5.0) {
                continue;
            }
            memo.signalled_at = Some(now);
            memo.ending = true;
            log::warn!(
                "satellite {id} of job {parent} no longer has the name, partition or tag bftrainerd gave it (changed by its owner?): cancelling it"
            );
            self.call(|c| c.cancel(id), "cancel", id);
        }
        // Nodes the engine knows that left the elastic partitions (removed from them,
        // renamed, deleted from slurm.conf): lost until they come back.
        let listed: HashSet<&str> = cluster_nodes.iter().map(|c| c.0.as_str()).collect();
        let vanished: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&id| !listed.contains(self.nodes[id as usize].name.as_str()))
            .collect();
        for id in vanished {
            if self.nodes[id as usize].class != Class::Lost {
                log::info!(
                    "node {}: no longer in the elastic partitions; not lent until it is back",
                    self.nodes[id as usize].name
                );
            }
            self.nodes[id as usize].why = Why::Unavailable;
            self.observe_node(id, Class::Lost);
        }
        cluster_nodes.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut class, mut why) in cluster_nodes {
            let id = match self.node_ids.get(&name) {
                Some(&id) => id,
                None => {
                    let id = self.nodes.len() as NodeId;
                    // Declared at once (the engine needs the id for later events).
                    let ev = Event::NodeAdded {
                        node: id,
                        name: name.clone(),
                    };
                    if self.feed(&ev, now).is_ok() {
                        self.learn(&ev).ok();
                        if let Some(j) = self.journal.as_mut() {
                            j.push(&record(now, ev));
                        }
                    }
                    id
                }
            };
            if let Some(sa) = self.set_aside.get(&id) {
                if sa.until > now {
                    class = Some(Class::Lost);
                    why = Why::SetAside;
                } else {
                    log::info!(
                        "node {name}: back in the pool after being set aside ({})",
                        sa.reason
                    );
                    let failures = sa.failures;
                    self.set_aside.insert(
                        id,
                        SetAside {
                            failures,
                            until: f64::NEG_INFINITY,
                            reason: String::new(),
                        },
                    );
                }
            }
            self.nodes[id as usize].why = why;
            if let Some(class) = class {
                self.observe_node(id, class);
            }
        }

        // Core jobs.
        let known: Vec<u32> = self.cores.keys().copied().collect();
        for id in known {
            let job = cores_seen.get(&id).map(|&i| &jobs[i]);
            self.observe_core(id, job, now);
        }
        // An ended core that Slurm shows active again: a new job under the same id.
        let reborn: Vec<u32> = cores_seen
            .iter()
            .filter(|(id, &i)| {
                jobs[i].state.is_active() && self.cores.get(id).is_some_and(|c| c.ended)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in reborn {
            log::info!(
                "elastic job {id} is active again after its end (requeued, or a job id that wrapped): adopting it as a new job"
            );
            self.cores.remove(&id);
            self.blame.forget(id);
        }
        let mut new: Vec<usize> = cores_seen
            .iter()
            .filter(|(id, _)| !self.cores.contains_key(id))
            .map(|(_, &i)| i)
            .collect();
        new.sort_by_key(|&i| (jobs[i].submit_time, jobs[i].job_id));
        for i in new {
            self.adopt_core(&jobs[i], now);
        }
        // A job waiting for admission whose constraint or memory no node bftrainerd
        // lends can meet is not admitted (it would only time out, again and again),
        // and says why in `bftrainer jobs`.
        let waiting: Vec<(u32, usize)> = cores_seen
            .iter()
            .filter(|(id, _)| {
                self.cores
                    .get(id)
                    .is_some_and(|c| !c.ended && self.engine.job_nodes(c.jid).is_empty())
            })
            .map(|(&id, &i)| (id, i))
            .collect();
        for (id, i) in waiting {
            let why = self.unservable_why(&jobs[i], &parts);
            self.set_unservable(id, why, now);
        }
        // Jobs the journal knows as queued or active that slurmctld no longer has
        // (they ended while the daemon was down and aged out): finished. Only the
        // engine's live jobs are looked at, not every job ever.
        let live: Vec<JobId> = self
            .engine
            .active()
            .iter()
            .copied()
            .chain(self.engine.queue())
            .collect();
        for jid in live {
            let id = self.jobs[jid as usize];
            if self.cores.get(&id).is_some_and(|c| c.jid == jid) {
                continue;
            }
            log::warn!("elastic job {id} is gone from slurmctld; counted finished");
            self.pending.push(Event::JobFinished { job: jid });
        }
        // Ended jobs are forgotten after `job_retention` (their history stays in the
        // journal and in accounting): the daemon's per-poll work and memory follow the
        // live jobs, not every job ever run.
        let retention = self.cfg.job_retention_s;
        let old: Vec<u32> = self
            .cores
            .iter()
            .filter(|(_, c)| c.ended && now - c.ended_at > retention)
            .map(|(&id, _)| id)
            .collect();
        for id in old {
            if let Some(c) = self.cores.remove(&id) {
                self.blame.forget(id);
                self.unservable.remove(&id);
                // Journaled, so a restart forgets it too (`learn` drops its history).
                self.emit(Event::JobForgotten { job: c.jid });
            }
        }

        // Satellites. An ended one is news only if it is the newest of its parent on
        // its node and it ended while this daemon ran; older ones are history (handled
        // before a restart, or replaced since).
        let started = *self.started_at.get_or_insert(now);
        let mut newest: HashMap<(u32, String), u32> = HashMap::new();
        for &(i, parent) in &sats {
            let j = &jobs[i];
            let node = j
                .nodes
                .clone()
                .or_else(|| j.req_nodes.clone())
                .unwrap_or_default();
            let e = newest.entry((parent, node)).or_insert(j.job_id);
            *e = (*e).max(j.job_id);
        }
        let mut live: HashSet<u32> = HashSet::new();
        for (i, parent) in sats {
            let j = &jobs[i];
            live.insert(j.job_id);
            if !j.state.is_active() {
                let node = j
                    .nodes
                    .clone()
                    .or_else(|| j.req_nodes.clone())
                    .unwrap_or_default();
                let old = newest.get(&(parent, node)).is_some_and(|&n| n > j.job_id)
                    || j.end_time.is_some_and(|e| (e as f64) < started.floor());
                if old {
                    self.sats.entry(j.job_id).or_default().done = true;
                    continue;
                }
            }
            self.observe_satellite(j, parent, now);
        }
        self.sats.retain(|id, _| live.contains(id));
    }

    /// Why the idle nodes bftrainerd may lend cannot serve waiting job `j` (its
    /// `--constraint` against their features, its `--mem` against their memory), if
    /// fewer than its minimum can.
    fn unservable_why(&self, j: &Job, parts: &[String]) -> Option<String> {
        let constraint = match j.constraint.as_deref().map(Constraint::parse) {
            Some(Ok(c)) => Some(c),
            // Slurm accepted it; an expression we cannot read is left to Slurm.
            Some(Err(_)) | None => None,
        };
        let mem = j.mem_per_node_mb;
        if constraint.is_none() && mem.is_none() {
            return None;
        }
        let min = match j.admin_comment.as_deref().and_then(spec::parse_tag) {
            Some(Ok(s)) => s.min,
            _ => 1,
        };
        // The nodes open to it now: idle, in the elastic partitions, lendable.
        let open = self
            .cluster
            .nodes()
            .iter()
            .filter(|n| n.partitions.iter().any(|p| parts.contains(p)))
            .filter(|n| {
                self.node_ids.get(&n.name).is_some_and(|&id| {
                    matches!(self.nodes[id as usize].class, Class::Available { .. })
                        && self.engine.node_state(id) == NodeState::Idle
                })
            });
        let fit = open
            .filter(|n| constraint.as_ref().map_or(true, |c| c.matches(&n.features)))
            .filter(|n| mem.map_or(true, |m| n.real_memory_mb >= m))
            .count() as u32;
        if fit >= min {
            return None;
        }
        let mut asks = Vec::new();
        if let Some(c) = &j.constraint {
            asks.push(format!("--constraint={c}"));
        }
        if let Some(m) = mem {
            asks.push(format!("--mem={m}M"));
        }
        Some(format!(
            "it asks {} and {fit} of the idle nodes bftrainerd may lend meet that (it needs at least {min}); it waits for such nodes",
            asks.join(" ")
        ))
    }

    /// Keeps a waiting job out of admission while no lent node can serve it, and lets
    /// it back when one can (a pause the engine journals; a blame pause stays).
    fn set_unservable(&mut self, id: u32, why: Option<String>, now: f64) {
        let Some(jid) = self.cores.get(&id).map(|c| c.jid) else {
            return;
        };
        match why {
            Some(why) => {
                if self.unservable.insert(id, why.clone()).is_none() {
                    log::warn!("elastic job {id} is not admitted: {why}");
                    self.emit(Event::JobPaused {
                        job: jid,
                        until: Some(now + UNSERVABLE_PAUSE_S),
                    });
                }
            }
            None => {
                if self.unservable.remove(&id).is_some() {
                    log::info!("elastic job {id}: lent nodes can serve it now");
                    let until = self.blame.paused(id, now).map(|p| p.until);
                    self.emit(Event::JobPaused { job: jid, until });
                }
            }
        }
    }

    fn refuse(&mut self, j: &Job, why: &str) {
        if self.refused.insert(j.job_id) {
            self.stats.not_adopted += 1;
            log::warn!(
                "not adopting job {} (user {}, partition {}): {why}; admin comment {:?}",
                j.job_id,
                j.user_id,
                j.partition.as_deref().unwrap_or("-"),
                j.admin_comment.as_deref().unwrap_or("")
            );
        }
    }

    fn observe_node(&mut self, id: NodeId, class: Class) {
        let st = self.engine.node_state(id);
        let rec = &self.nodes[id as usize];
        let ev = match class {
            Class::Lost if st != NodeState::Lost => Some(Event::NodeLost { node: id }),
            Class::Claimed if matches!(st, NodeState::Idle | NodeState::Held(_)) => {
                Some(Event::NodeClaimed { node: id })
            }
            Class::Available { reclaim_at }
                if matches!(st, NodeState::Busy | NodeState::Lost)
                    || rec.sent_forecast != reclaim_at =>
            {
                Some(Event::NodeIdle {
                    node: id,
                    reclaim_at,
                })
            }
            _ => None,
        };
        self.nodes[id as usize].class = class;
        if let Some(ev) = ev {
            self.emit(ev);
        }
    }

    fn job_spec(&self, j: &Job, s: &spec::ElasticSpec) -> ElasticSpec {
        let cap = self.nodes.len().max(1) as u32;
        let max = s.max.unwrap_or(cap).max(s.min);
        let mut up = self.cfg.default_up_s;
        let mut down = self.cfg.default_down_s;
        let mut curve = self.cfg.default_curve.clone();
        if let (Some(name), Some(dir)) = (&s.profile, &self.cfg.profile_dir) {
            match config::load_profile(dir, name) {
                Ok(p) => {
                    curve = Some(p.curve);
                    up = p.up_s.unwrap_or(up);
                    down = p.down_s.unwrap_or(down);
                }
                Err(e) => log::warn!(
                    "job {}: profile '{name}' unusable ({e}); using the default curve",
                    j.job_id
                ),
            }
        }
        if let Some(v) = s.up {
            up = f64::from(v);
        }
        if let Some(v) = s.down {
            down = f64::from(v);
        }
        // Linear speed-up by default; a job that can only ever use one node has a
        // one-point curve (the allocator refuses repeated node counts).
        let objective = curve.unwrap_or_else(|| {
            Curve::new(if max > 1 {
                vec![(1, 1.0), (max, f64::from(max))]
            } else {
                vec![(1, 1.0)]
            })
        });
        ElasticSpec {
            name: j.job_id.to_string(),
            min_nodes: s.min,
            max_nodes: max,
            scale_up_s: up,
            scale_down_s: down,
            objective,
            user: Some(j.user_id),
            // Slurm's priority where it has one; a core job held until admission has
            // none (0), and then submit order decides among one user's jobs.
            priority: if j.is_held() { 0 } else { j.priority },
        }
    }

    fn adopt_core(&mut self, j: &Job, now: f64) {
        // An ended job is adopted only if the journal knows it (it ended while the
        // daemon was down): observe_core then tells an end from a preemption.
        if !j.state.is_active() && !self.jobs.contains(&j.job_id) {
            return;
        }
        let s = match j.admin_comment.as_deref().and_then(spec::parse_tag) {
            Some(Ok(s)) => s,
            _ => return,
        };
        // The journal may know it already (restart): find its engine id. One the engine
        // has ended that Slurm shows active again (requeued after its end, or a job id
        // that wrapped onto it) is a new job.
        let known = self
            .jobs
            .iter()
            .rposition(|&x| x == j.job_id)
            .map(|k| k as JobId)
            .filter(|&k| {
                !(j.state.is_active()
                    && matches!(
                        self.engine.job_status(k),
                        JobStatus::Finished | JobStatus::Cancelled
                    ))
            });
        let jid = match known {
            Some(k) => k,
            None => {
                let jid = self.engine.n_jobs() as JobId;
                let spec = self.job_spec(j, &s);
                log::info!(
                    "elastic job {} of user {} ({}:{} nodes) found {}",
                    j.job_id,
                    j.user_name.as_deref().unwrap_or("?"),
                    spec.min_nodes,
                    spec.max_nodes,
                    if j.is_held() {
                        "held, queued for admission"
                    } else {
                        "not held"
                    }
                );
                // Declared at once: later events of this cycle name it.
                let ev = Event::JobSubmitted { job: jid, spec };
                match self.feed(&ev, now) {
                    Ok(_) => {
                        self.learn(&ev).ok();
                        if let Some(jr) = self.journal.as_mut() {
                            jr.push(&record(now, ev));
                        }
                    }
                    Err(e) => {
                        log::warn!("engine refused elastic job {}: {e}", j.job_id);
                        return;
                    }
                }
                jid
            }
        };
        let status = self.engine.job_status(jid);
        if matches!(status, JobStatus::Finished | JobStatus::Cancelled) {
            // It ended in the journal's view, yet runs or waits in Slurm: not ours now.
            return;
        }
        self.cores.insert(
            j.job_id,
            Core {
                jid,
                uid: j.user_id,
                gid: j.group_id,
                admit_at: None,
                pinned: None,
                started: is_running(j),
                preempting: false,
                restarts: j.restart_count,
                asked_at: f64::NEG_INFINITY,
                rate: None,
                step_s: 0.0,
                ended: false,
                ended_at: f64::INFINITY,
                user: j.user_name.clone(),
            },
        );
        if is_running(j) && self.engine.job_nodes(jid).is_empty() {
            log::warn!(
                "elastic job {} runs on {} without an admission on record; it will be requeued and held for admission",
                j.job_id,
                j.nodes.as_deref().unwrap_or("?")
            );
        }
    }

    /// Gives up the engine's nodes of a core job: core nodes lost to a regular job,
    /// the rest back to the pool (its satellites are cancelled by reconcile).
    fn job_lost_nodes(&mut self, jid: JobId) {
        let anchors: Vec<NodeId> = self.engine.job_anchors(jid).to_vec();
        let nodes: Vec<NodeId> = self.engine.job_nodes(jid).to_vec();
        for n in nodes {
            if anchors.contains(&n) {
                self.emit(Event::WorkerPreempted { job: jid, node: n });
            } else {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
        }
    }

    fn observe_core(&mut self, id: u32, job: Option<&Job>, now: f64) {
        let Some(core) = self.cores.get(&id) else {
            return;
        };
        if core.ended {
            return;
        }
        let jid = core.jid;
        let status = self.engine.job_status(jid);
        let Some(j) = job else {
            log::warn!("elastic job {id} is gone from slurmctld; counted finished");
            self.emit(Event::JobFinished { job: jid });
            if let Some(c) = self.cores.get_mut(&id) {
                c.ended = true;
                c.ended_at = now;
            }
            return;
        };
        let base = j.state.base();
        if !j.state.is_active() {
            // A run that ended while being preempted (the runtime left within the
            // grace time, or PreemptMode=CANCEL) is a preemption, not an end.
            let preempted = base == JobBase::Preempted
                || (j.preempt_time.is_some()
                    && matches!(base, JobBase::Complete | JobBase::Failed));
            if preempted && status == JobStatus::Active {
                let core = self.cores.get_mut(&id).unwrap();
                if now - core.asked_at < 5.0 {
                    return;
                }
                core.asked_at = now;
                if !core.preempting {
                    self.stats.preemptions += 1;
                }
                core.preempting = false;
                core.started = false;
                core.admit_at = None;
                log::info!(
                    "elastic job {id} ended {} during its preemption: requeueing it held (a preemption, not an end)",
                    j.state.name()
                );
                core.restarts = j.restart_count.saturating_add(1);
                self.job_lost_nodes(jid);
                match self.cluster.requeue(id, true) {
                    Ok(()) => self.stats.requeues += 1,
                    Err(e) => {
                        self.stats.slurm_errors += 1;
                        self.error(format!("requeue of preempted elastic job {id} failed: {e}"));
                    }
                }
                return;
            }
            let ev = if base == JobBase::Cancelled {
                Event::JobCancelled { job: jid }
            } else {
                Event::JobFinished { job: jid }
            };
            log::info!("elastic job {id} ended: {}", j.state.name());
            self.emit(ev);
            let c = self.cores.get_mut(&id).unwrap();
            c.ended = true;
            c.ended_at = now;
            return;
        }
        let core = self.cores.get_mut(&id).unwrap();
        if j.restart_count > core.restarts {
            // Slurm requeued it (preemption): whatever it held is gone.
            core.restarts = j.restart_count;
            core.started = false;
            core.admit_at = None;
            if !core.preempting {
                self.stats.preemptions += 1;
            }
            core.preempting = false;
            log::info!(
                "elastic job {id} was requeued by Slurm (restart {})",
                j.restart_count
            );
            self.job_lost_nodes(jid);
            return;
        }
        if is_running(j) {
            if j.preempt_time.is_some() {
                if !core.preempting {
                    core.preempting = true;
                    self.stats.preemptions += 1;
                    log::info!(
                        "elastic job {id}: Slurm preempts its core on {}; giving up its nodes",
                        j.nodes.as_deref().unwrap_or("?")
                    );
                    self.job_lost_nodes(jid);
                }
                return;
            }
            core.admit_at = None;
            if !core.started
                && status == JobStatus::Active
                && !self.engine.job_nodes(jid).is_empty()
            {
                core.started = true;
                log::info!(
                    "elastic job {id} runs on {}",
                    j.nodes.as_deref().unwrap_or("?")
                );
                self.emit(Event::JobStarted { job: jid });
            }
            self.observe_progress(id, j);
            return;
        }
        // Pending.
        core.preempting = false;
        if let Some(t) = core.admit_at {
            if now - t > self.cfg.admit_timeout_s {
                core.admit_at = None;
                let why = j.reason.as_deref().unwrap_or("no reason given").to_string();
                log::warn!(
                    "elastic job {id} did not start within {} s of its admission ({why}); holding it again and re-planning",
                    self.cfg.admit_timeout_s,
                );
                // The nodes are idle (not claimed): back to the pool for a new plan.
                for n in self.engine.job_nodes(jid).to_vec() {
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
                // Its own request, limits or begin time keep it from starting: it
                // waits out a pause before the next admission, the nodes go to others.
                if self.outage_ended < t && self.outage_since.is_none() {
                    self.job_failed(
                        id,
                        format!(
                            "it did not start within {} s of its admission ({why})",
                            self.cfg.admit_timeout_s
                        ),
                        now,
                    );
                }
            }
        }
    }

    /// The runtime publishes its measured rate in the core job's Comment
    /// ([`RunComment`]): a change of more than 1% (or of size) is a `Progress` event.
    /// Its measured step time is kept for shrinks (a new run's unmeasured 0 keeps the
    /// previous run's: the same script).
    fn observe_progress(&mut self, id: u32, j: &Job) {
        let Some(rc) = j.comment.as_deref().and_then(RunComment::parse) else {
            return;
        };
        let Some(core) = self.cores.get_mut(&id) else {
            return;
        };
        if rc.step > 0.0 {
            core.step_s = rc.step;
        }
        if !core.started || rc.rate <= 0.0 {
            return;
        }
        let changed = core.rate.map_or(true, |(r, n)| {
            n != rc.nodes || (rc.rate - r).abs() > 0.01 * r.max(f64::MIN_POSITIVE)
        });
        if changed {
            core.rate = Some((rc.rate, rc.nodes));
            let jid = core.jid;
            self.emit(Event::Progress {
                job: jid,
                samples_per_s: rc.rate,
                remaining: None,
            });
        }
    }

    fn observe_satellite(&mut self, j: &Job, parent: u32, now: f64) {
        let node_name = j
            .nodes
            .clone()
            .or_else(|| j.req_nodes.clone())
            .unwrap_or_default();
        let node = self.node_ids.get(&node_name).copied();
        let jid = self.cores.get(&parent).map(|c| c.jid);
        let memo = self.sats.entry(j.job_id).or_default();
        memo.parent = parent;
        memo.node.clone_from(&node_name);
        let held = |d: &Self| match (jid, node) {
            (Some(jid), Some(n)) => d.engine.node_state(n) == NodeState::Held(jid),
            _ => false,
        };
        if memo.done {
            return;
        }
        if !j.state.is_active() {
            memo.done = true;
            let ending = memo.ending;
            let was_preempted = memo.preempted;
            if ending || was_preempted {
                return;
            }
            let (Some(jid), Some(n)) = (jid, node) else {
                return;
            };
            if j.state.base() == JobBase::Preempted || j.preempt_time.is_some() {
                self.reclaimed.insert(n, now);
                if held(self) {
                    log::info!(
                        "satellite {} of job {parent} on {node_name}: preempted by a regular job",
                        j.job_id
                    );
                    self.stats.preemptions += 1;
                    self.emit(Event::WorkerPreempted { job: jid, node: n });
                }
                return;
            }
            if j.state.base() == JobBase::NodeFail {
                // Slurm took the node down; it decides when it returns (no set-aside).
                if held(self) {
                    log::info!(
                        "satellite {} of job {parent} on {node_name}: the node failed",
                        j.job_id
                    );
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
                return;
            }
            let ran = match (j.start_time, j.end_time) {
                (Some(s), Some(e)) if s > 0 => (e - s) as f64,
                _ => 0.0,
            };
            // A failure of the node: the satellite failed, or ended at once. Cancelled
            // (by its owner or an admin) is not the node's fault, nor is an end while its
            // parent is over or no longer running (the runtime's agents stop then), nor
            // the end of one whose node the allocation no longer gives its parent (a
            // shrink that a restart interrupted: the memo of it is gone, the journal's
            // allocation is not).
            let parent_running = self.cores.get(&parent).is_some_and(|c| !c.ended)
                && self.engine.job_status(jid) == JobStatus::Active;
            let failed = parent_running
                && held(self)
                && match j.state.base() {
                    JobBase::Cancelled => false,
                    JobBase::Complete => ran < self.cfg.satellite_min_runtime_s,
                    _ => true,
                };
            if failed {
                let reason = format!(
                    "satellite {} of job {parent} ended {} after {ran:.0} s",
                    j.job_id,
                    j.state.name()
                );
                self.satellite_failed(parent, j.user_id, n, reason, now);
            }
            if held(self) {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
            return;
        }
        if is_running(j) {
            if j.preempt_time.is_some() {
                if !memo.preempted {
                    memo.preempted = true;
                    if let (Some(jid), Some(n)) = (jid, node) {
                        if held(self) {
                            log::info!(
                                "satellite {} of job {parent} on {node_name}: preempted by a regular job",
                                j.job_id
                            );
                            self.stats.preemptions += 1;
                            self.emit(Event::WorkerPreempted { job: jid, node: n });
                        }
                    }
                }
                return;
            }
            if !memo.joined {
                memo.joined = true;
                if let (Some(jid), Some(n)) = (jid, node) {
                    if held(self) {
                        self.emit(Event::WorkerJoined { job: jid, node: n });
                    }
                }
            }
            if let (Some(n), Some(start)) = (node, j.start_time) {
                if now - start as f64 >= self.cfg.satellite_min_runtime_s {
                    self.blame.ran(parent, n);
                    if let Some(sa) = self.set_aside.get_mut(&n) {
                        if sa.until <= now {
                            sa.failures = 0;
                        }
                    }
                }
            }
            return;
        }
        // Pending too long: this growth failed. A satellite pinned to an idle node
        // that does not start waits on its job (held by its owner, its QOS or
        // association limits, a request the node cannot meet), never on the node
        // alone: the job is paused, the node stays in the pool. One that waited through
        // a slurmctld outage is nobody's fault.
        let submitted = j.submit_time.unwrap_or(now as i64) as f64;
        let waited = now - submitted;
        if !memo.ending && waited > self.cfg.grow_timeout_s {
            memo.ending = true;
            let why = j.reason.as_deref().unwrap_or("no reason").to_string();
            log::warn!(
                "satellite {} of job {parent} did not start on {node_name} within {} s ({why}); cancelling it",
                j.job_id,
                self.cfg.grow_timeout_s,
            );
            memo.signalled_at = Some(now);
            self.call(|c| c.cancel(j.job_id), "cancel", j.job_id);
            if self.outage_ended >= submitted || self.outage_since.is_some() {
                log::info!(
                    "satellite {} of job {parent} waited through a slurmctld outage: not charged",
                    j.job_id
                );
            } else {
                self.job_failed(
                    parent,
                    format!(
                        "satellite {} did not start on {node_name} within {} s ({why})",
                        j.job_id, self.cfg.grow_timeout_s
                    ),
                    now,
                );
            }
            if let (Some(jid), Some(n)) = (jid, node) {
                if self.engine.node_state(n) == NodeState::Held(jid) {
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
            }
        }
    }

    fn blame_cfg(&self) -> blame::BlameConfig {
        blame::BlameConfig {
            job_backoff_s: self.cfg.job_backoff_s,
            node_blame_users: self.cfg.node_blame_users,
            max_backoff_s: MAX_BACKOFF_S,
            memory_s: MAX_BACKOFF_S,
        }
    }

    /// A growth of core job `parent` failed for reasons of its own: pause the job
    /// (it keeps what it holds; the pool goes to others), never a node.
    fn job_failed(&mut self, parent: u32, reason: String, now: f64) {
        self.stats.satellite_failures += 1;
        let cfg = self.blame_cfg();
        let v = self.blame.job_failed(&cfg, parent, reason, now);
        self.apply_verdict(parent, None, v, now);
    }

    /// A satellite of `parent` (owner `uid`) ran on `n` and failed: its job's fault,
    /// or the node's once several users failed there.
    fn satellite_failed(&mut self, parent: u32, uid: u32, n: NodeId, reason: String, now: f64) {
        self.stats.satellite_failures += 1;
        let cfg = self.blame_cfg();
        let v = self
            .blame
            .satellite_failed(&cfg, parent, uid, n, reason.clone(), now);
        self.apply_verdict(parent, Some((n, reason)), v, now);
    }

    fn apply_verdict(
        &mut self,
        parent: u32,
        node: Option<(NodeId, String)>,
        v: blame::Verdict,
        now: f64,
    ) {
        match v {
            blame::Verdict::Node { users } => {
                if let Some((n, reason)) = node {
                    self.node_failed(
                        n,
                        format!("satellites of {users} users failed there, the last: {reason}"),
                        now,
                    );
                }
            }
            blame::Verdict::Job { until, renewed } => {
                let Some(jid) = self.cores.get(&parent).map(|c| c.jid) else {
                    return;
                };
                if renewed {
                    let s = self.blame.paused(parent, now);
                    log::warn!(
                        "elastic job {parent}: growth paused for {:.0} s (failure {}): {}",
                        until - now,
                        s.map_or(0, |s| s.failures),
                        s.map_or("", |s| s.reason.as_str())
                    );
                    self.stats.job_pauses += 1;
                }
                if self.engine.job_status(jid) != JobStatus::Finished {
                    self.emit(Event::JobPaused {
                        job: jid,
                        until: Some(until),
                    });
                }
            }
        }
    }

    fn node_failed(&mut self, n: NodeId, reason: String, now: f64) {
        let e = self.set_aside.entry(n).or_insert(SetAside {
            failures: 0,
            until: f64::NEG_INFINITY,
            reason: String::new(),
        });
        e.failures += 1;
        let wait =
            (self.cfg.node_backoff_s * 2f64.powi(e.failures.min(30) as i32 - 1)).min(MAX_BACKOFF_S);
        e.until = now + wait;
        e.reason = reason;
        log::warn!(
            "node {}: set aside for {wait:.0} s (failure {}): {}",
            self.nodes[n as usize].name,
            e.failures,
            e.reason
        );
    }

    /// Whether this cycle has used up `[daemon] cycle_budget`: calls that lend nodes
    /// wait for the next cycle (counted); calls that give nodes back still run.
    fn over_budget(&mut self) -> bool {
        let over = self
            .cycle_t0
            .is_some_and(|t| t.elapsed().as_secs_f64() > self.cfg.cycle_budget_s);
        if over {
            self.stats.deferred_calls += 1;
        }
        over
    }

    /// Runs one Slurm call, logging and counting a failure (the next cycle retries).
    fn call(
        &mut self,
        f: impl FnOnce(&mut C) -> cluster::Result<()>,
        what: &str,
        job: u32,
    ) -> bool {
        match f(&mut self.cluster) {
            Ok(()) => true,
            Err(e) => {
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "{what} of job {job} failed: {e}; retrying next cycle"
                ));
                false
            }
        }
    }

    // ---------------------------------------------------------------- reconcile

    fn reconcile(&mut self, now: f64) -> usize {
        let mut calls = 0usize;
        // Only the daemon's own jobs matter here (tagged; few).
        let jobs: Vec<Job> = self
            .cluster
            .jobs()
            .iter()
            .filter(|j| j.admin_comment.as_deref().is_some_and(spec::looks_like_tag))
            .cloned()
            .collect();
        let by_id: HashMap<u32, &Job> = jobs.iter().map(|j| (j.job_id, j)).collect();
        let grace: HashMap<&str, f64> = self
            .cluster
            .partitions()
            .iter()
            .map(|p| (p.name.as_str(), f64::from(p.grace_time_s)))
            .collect();
        let grace: HashMap<String, f64> =
            grace.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        // Active satellites per parent, by node name.
        let mut sats: HashMap<u32, Vec<&Job>> = HashMap::new();
        for j in &jobs {
            if !j.state.is_active() || !self.sats.contains_key(&j.job_id) {
                continue;
            }
            if let Some(Ok(s)) = j.admin_comment.as_deref().and_then(spec::parse_tag) {
                sats.entry(s.parent.unwrap_or(0)).or_default().push(j);
            }
        }
        let core_ids: Vec<u32> = self.cores.keys().copied().collect();
        for id in core_ids {
            let (jid, ended) = {
                let c = &self.cores[&id];
                (c.jid, c.ended)
            };
            let active = !ended
                && matches!(
                    self.engine.job_status(jid),
                    JobStatus::Active | JobStatus::Queued
                );
            let want: Vec<NodeId> = if active {
                self.engine.job_nodes(jid).to_vec()
            } else {
                Vec::new()
            };
            let anchors: Vec<NodeId> = if active {
                self.engine.job_anchors(jid).to_vec()
            } else {
                Vec::new()
            };
            let core_job = by_id.get(&id).copied();
            let mut core_running = false;
            if let (true, Some(j)) = (active, core_job) {
                calls += self.reconcile_core(id, j, &want, &anchors, &grace, now);
                core_running =
                    is_running(j) && j.preempt_time.is_none() && self.on_anchors(j, &anchors);
            }
            // Satellites: one per wanted non-core node, once the core runs.
            let mine = sats.remove(&id).unwrap_or_default();
            let mut have: HashMap<String, u32> = HashMap::new();
            for s in &mine {
                let node = s
                    .nodes
                    .clone()
                    .or_else(|| s.req_nodes.clone())
                    .unwrap_or_default();
                let n = self.node_ids.get(&node).copied();
                let wanted = n.is_some_and(|n| want.contains(&n) && !anchors.contains(&n));
                let memo_ending = self.sats.get(&s.job_id).is_some_and(|m| m.ending);
                if wanted && !memo_ending && !have.contains_key(&node) {
                    have.insert(node, s.job_id);
                    continue;
                }
                if wanted && have.contains_key(&node) && !memo_ending {
                    log::warn!(
                        "satellite {} duplicates {} on {node}; cancelling it",
                        s.job_id,
                        have[&node]
                    );
                }
                calls += self.end_satellite(s, id, &node, &grace, now);
            }
            if !core_running {
                continue;
            }
            let Some(core_job) = core_job else { continue };
            for &n in &want {
                if anchors.contains(&n) {
                    continue;
                }
                let name = self.nodes[n as usize].name.clone();
                if have.contains_key(&name) {
                    continue;
                }
                if self.set_aside.get(&n).is_some_and(|s| s.until > now) {
                    continue;
                }
                if self.over_budget() {
                    continue;
                }
                calls += 1;
                self.submit_satellite(id, core_job, &name, n, now);
            }
        }
        // Satellites of parents the daemon does not manage (ended, gone, refused).
        for (parent, list) in sats {
            for s in list {
                let node = s
                    .nodes
                    .clone()
                    .or_else(|| s.req_nodes.clone())
                    .unwrap_or_default();
                if self.sats.get(&s.job_id).is_some_and(|m| !m.ending) {
                    log::info!(
                        "satellite {} on {node}: its parent job {parent} is gone",
                        s.job_id
                    );
                }
                calls += self.end_satellite(s, parent, &node, &grace, now);
            }
        }
        calls
    }

    fn reconcile_core(
        &mut self,
        id: u32,
        j: &Job,
        want: &[NodeId],
        anchors: &[NodeId],
        grace: &HashMap<String, f64>,
        now: f64,
    ) -> usize {
        let core = &self.cores[&id];
        let recently = now - core.asked_at < 5.0;
        let anchor_names = self.names(anchors);
        // Where an admission pins the core: its anchors, or with none (the engine
        // re-planned this cycle) the first of its nodes, never an empty list, which would
        // let Slurm start the core anywhere, on a node the engine lends as a satellite's
        // (seen on 24.11 and 26.05: a regular job then requeued the unprotected core).
        let pin: &[NodeId] = if anchors.is_empty() && !want.is_empty() {
            &want[..1]
        } else {
            anchors
        };
        let pin_names = self.names(pin);
        if j.state.base() == JobBase::Pending {
            // Re-planned while its admission is in flight: take it back before Slurm
            // starts it on nodes the engine has since given elsewhere.
            let stale =
                core.admit_at.is_some() && core.pinned.as_deref() != Some(pin_names.as_str());
            if want.is_empty() || core.admit_at.is_none() && !j.is_held() || stale {
                let c = self.cores.get_mut(&id).unwrap();
                if stale {
                    c.admit_at = None;
                    c.pinned = None;
                }
                if !j.is_held() && (!recently || stale) {
                    c.asked_at = now;
                    c.admit_at = None;
                    c.pinned = None;
                    log::info!(
                        "hold elastic job {id} ({})",
                        if stale {
                            "its admission was re-planned"
                        } else {
                            "pending, not admitted"
                        }
                    );
                    self.call(|c| c.hold(id), "hold", id);
                    return 1;
                }
                return 0;
            }
            if core.admit_at.is_none() && j.is_held() {
                if self.over_budget() {
                    return 0;
                }
                let names = pin_names;
                let up = JobUpdate {
                    node_list: Some(names.clone()),
                    ..Default::default()
                };
                log::info!(
                    "admit job {id} (user {}) on {names}{}",
                    j.user_name.as_deref().unwrap_or("?"),
                    if want.len() > pin.len() {
                        format!(
                            ", {} more node(s) by satellites once it runs",
                            want.len() - pin.len()
                        )
                    } else {
                        String::new()
                    }
                );
                let pinned = self.cluster.update(id, &up);
                if let Err(e) = &pinned {
                    self.stats.slurm_errors += 1;
                    self.error(format!("pin of job {id} to {names} failed: {e}"));
                    if !e.is_unreachable() {
                        // Slurm refuses the job on those nodes (its request does not fit
                        // them, its limits): the job waits out a pause, not re-pinned at
                        // every cycle.
                        let jid = self.cores[&id].jid;
                        for n in self.engine.job_nodes(jid).to_vec() {
                            self.emit(Event::WorkerLeft { job: jid, node: n });
                        }
                        self.job_failed(
                            id,
                            format!("Slurm refused to pin it to {names}: {e}"),
                            now,
                        );
                    }
                }
                let ok = pinned.is_ok() && self.call(|c| c.release(id), "release", id);
                if ok {
                    self.stats.admits += 1;
                    let c = self.cores.get_mut(&id).unwrap();
                    c.admit_at = Some(now);
                    c.pinned = Some(names);
                }
                return 2;
            }
            return 0;
        }
        if !is_running(j) {
            return 0;
        }
        if !want.is_empty() {
            // Started on other nodes than the engine holds for its core (a race between
            // a re-plan and the start): the engine's view must match Slurm's, so the
            // job goes back and is admitted again on what the engine holds.
            if j.preempt_time.is_some() || recently || self.on_anchors(j, anchors) {
                return 0;
            }
            self.cores.get_mut(&id).unwrap().asked_at = now;
            log::warn!(
                "elastic job {id} runs on {} but its core should be on {anchor_names}; requeueing it held to admit it again",
                j.nodes.as_deref().unwrap_or("?")
            );
            if self.call(|c| c.requeue(id, true), "requeue", id) {
                self.stats.requeues += 1;
                self.cores.get_mut(&id).unwrap().restarts = j.restart_count.saturating_add(1);
            }
            return 1;
        }
        // Running but the engine gave it no nodes: requeue it held. While Slurm
        // preempts it, wait out the partition's grace time first.
        if let Some(pt) = j.preempt_time {
            let g = j
                .partition
                .as_deref()
                .and_then(|p| grace.get(p))
                .copied()
                .unwrap_or(0.0);
            if (now as i64) < pt + g as i64 {
                return 0;
            }
        }
        if recently {
            return 0;
        }
        self.cores.get_mut(&id).unwrap().asked_at = now;
        log::info!(
            "requeue job {id} off {}: held until it is admitted again",
            j.nodes.as_deref().unwrap_or("?")
        );
        if self.call(|c| c.requeue(id, true), "requeue", id) {
            self.stats.requeues += 1;
            // Our own requeue: not a preemption when the restart count moves.
            self.cores.get_mut(&id).unwrap().restarts = j.restart_count.saturating_add(1);
        }
        1
    }

    /// Whether the running core job `j` is on exactly the engine's core nodes.
    fn on_anchors(&self, j: &Job, anchors: &[NodeId]) -> bool {
        if anchors.is_empty() {
            return true;
        }
        let mut actual = j
            .nodes
            .as_deref()
            .map(|e| self.cluster.expand(e))
            .unwrap_or_default();
        let mut expected: Vec<String> = anchors
            .iter()
            .map(|&n| self.nodes[n as usize].name.clone())
            .collect();
        actual.sort();
        expected.sort();
        actual == expected
    }

    fn end_satellite(
        &mut self,
        s: &Job,
        parent: u32,
        node: &str,
        grace: &HashMap<String, f64>,
        now: f64,
    ) -> usize {
        let id = s.job_id;
        let step = self.cores.get(&parent).map_or(0.0, |c| c.step_s);
        let deadline = shrink_deadline(self.cfg.shrink_grace_s, self.cfg.shrink_grace_max_s, step);
        let memo = self.sats.entry(id).or_default();
        if s.state.base() == JobBase::Pending {
            if memo.ending && memo.signalled_at.is_some_and(|t| now - t < 5.0) {
                return 0;
            }
            memo.ending = true;
            memo.signalled_at = Some(now);
            log::info!("cancel pending satellite {id} of job {parent} on {node}");
            self.call(|c| c.cancel(id), "cancel", id);
            return 1;
        }
        if let Some(pt) = s.preempt_time {
            // Slurm preempts it: cancel at the end of the grace time, not at its
            // next periodic pass (up to 30 s later).
            memo.ending = true;
            let g = s
                .partition
                .as_deref()
                .and_then(|p| grace.get(p))
                .copied()
                .unwrap_or(0.0);
            if now >= (pt as f64) + g && memo.signalled_at.map_or(true, |t| now - t >= 2.0) {
                memo.signalled_at = Some(now);
                log::info!("cancel satellite {id} of job {parent} on {node}: its preemption grace time is over");
                self.call(|c| c.cancel(id), "cancel", id);
                return 1;
            }
            return 0;
        }
        match memo.signalled_at {
            None => {
                memo.signalled_at = Some(now);
                memo.cancel_after = Some(deadline);
                memo.ending = true;
                self.stats.shrinks += 1;
                let why = if step > 0.0 {
                    format!(" (steps of {} s)", round1(step))
                } else {
                    String::new()
                };
                log::info!(
                    "shrink job {parent} off {node}: SIGTERM to satellite {id}, cancelled after {} s{why}",
                    round1(deadline)
                );
                self.call(
                    |c| c.signal(id, libc::SIGTERM, SignalTarget::StepsOnly),
                    "signal",
                    id,
                );
                1
            }
            Some(t) if now - t >= memo.cancel_after.unwrap_or(self.cfg.shrink_grace_s) => {
                memo.signalled_at = Some(now);
                log::info!("cancel satellite {id} of job {parent} on {node} (shrink grace over)");
                self.call(|c| c.cancel(id), "cancel", id);
                1
            }
            Some(_) => 0,
        }
    }

    fn submit_satellite(&mut self, parent: u32, core_job: &Job, node: &str, n: NodeId, now: f64) {
        let (uid, gid) = {
            let c = &self.cores[&parent];
            (c.uid, c.gid)
        };
        let join = self
            .cfg
            .join_command
            .replace("{parent}", &parent.to_string());
        // The work runs in a step, so a preemption's SIGTERM (Slurm signals steps, not
        // the batch shell) reaches it and this shell follows it out at once. A step
        // ended by SIGTERM (shrink, preemption) is a clean end of a satellite.
        let script = format!(
            "#!/bin/sh\n# bftrainer satellite of job {parent} on {node}\n\
             srun --ntasks=1 --nodes=1 --kill-on-bad-exit=1 {join}\n\
             rc=$?\n\
             if [ $rc -eq 0 ] || [ $rc -eq 143 ]; then exit 0; fi\n\
             exit $rc\n"
        );
        let tag_spec = format!("1:1,role=satellite,parent={parent}");
        let job = BatchJob {
            script,
            name: Some(satellite_name(parent)),
            partition: Some(self.cfg.satellite_partition.clone()),
            // Charged like the core job (sacct, sreport, QOS limits, fairshare).
            account: core_job.account.clone(),
            min_nodes: Some(1),
            max_nodes: Some(1),
            node_list: Some(node.to_string()),
            time_limit: core_job.time_limit,
            admin_comment: Some(satellite_tag(parent)),
            comment: Some(format!("bftrainer: satellite of elastic job {parent}")),
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                (spec::env::PARENT_JOB_ID.into(), parent.to_string()),
                (spec::env::ROLE.into(), "satellite".into()),
            ],
            work_dir: core_job
                .work_dir
                .clone()
                .map(Into::into)
                .or_else(|| Some("/tmp".into())),
            output: Some(self.cfg.satellite_output.clone()),
            run_as: Some((uid, gid)),
            requeue: Some(false),
            exclusive: true,
            spank_env: vec![(spec::JOB_ENV_NAME.into(), tag_spec)],
            ..Default::default()
        };
        match self.cluster.submit(&job) {
            Ok(sid) => {
                self.stats.grows += 1;
                self.sats.insert(
                    sid,
                    SatMemo {
                        parent,
                        node: node.to_string(),
                        ..Default::default()
                    },
                );
                log::info!("grow job {parent} onto {node}: satellite {sid}");
            }
            Err(e) if e.is_unreachable() => {
                // slurmctld did not answer: nobody's fault; the next cycle retries.
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "grow job {parent} onto {node}: slurmctld did not take the satellite ({e}); retrying next cycle"
                ));
            }
            Err(e) => {
                // Refused by Slurm: the job's QOS or limits (MaxSubmitJobs, a time limit
                // over the satellite partition's MaxTime...), or the config (a missing
                // partition): the job's growth pauses; the node stays in the pool.
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "grow job {parent} onto {node}: Slurm refused the satellite: {e}"
                ));
                self.job_failed(parent, format!("Slurm refused its satellite: {e}"), now);
                let _ = n;
            }
        }
    }

    // ------------------------------------------------------------------ status

    /// What the daemon holds and has done, for the control socket, the metrics and
    /// `state_dir/status.json` (`view::Snapshot`).
    pub fn snapshot(&self, now: f64) -> view::Snapshot {
        let mut counts = view::NodeCounts::default();
        let nodes: Vec<view::NodeView> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let holder = match self.engine.node_state(id) {
                    NodeState::Held(j) => Some(self.jobs[j as usize]),
                    _ => None,
                };
                let aside = self.set_aside.get(&id).filter(|s| s.until > now);
                let state = if holder.is_some() {
                    counts.lent += 1;
                    "lent"
                } else {
                    match (n.class, n.why) {
                        (Class::Available { .. }, _) => {
                            counts.idle += 1;
                            "idle"
                        }
                        (Class::Claimed, Why::RegularJob) => {
                            counts.busy += 1;
                            "busy"
                        }
                        (Class::Claimed, _) => {
                            counts.reserved += 1;
                            "reserved"
                        }
                        (Class::Lost, _) => {
                            counts.unavailable += 1;
                            "unavailable"
                        }
                    }
                };
                counts.total += 1;
                view::NodeView {
                    name: n.name.clone(),
                    state: state.to_string(),
                    why: n.why,
                    holder,
                    reclaim_at: match n.class {
                        Class::Available { reclaim_at } => reclaim_at,
                        _ => None,
                    },
                    set_aside: aside.cloned(),
                }
            })
            .collect();
        let mut by_state = view::JobCounts::default();
        let mut sats_of: HashMap<u32, Vec<view::SatelliteView>> = HashMap::new();
        for (&sid, m) in &self.sats {
            if !m.done && !m.ending {
                sats_of
                    .entry(m.parent)
                    .or_default()
                    .push(view::SatelliteView {
                        job_id: sid,
                        node: m.node.clone(),
                    });
            }
        }
        let jobs: Vec<view::JobView> = self
            .cores
            .iter()
            .map(|(&id, c)| {
                let held = self.engine.job_nodes(c.jid);
                let state = match self.engine.job_status(c.jid) {
                    JobStatus::Queued => {
                        by_state.pending += 1;
                        "pending"
                    }
                    JobStatus::Active if held.is_empty() => {
                        by_state.waiting += 1;
                        "waiting"
                    }
                    JobStatus::Active => {
                        by_state.running += 1;
                        "running"
                    }
                    JobStatus::Finished => {
                        by_state.finished += 1;
                        "finished"
                    }
                    JobStatus::Cancelled => {
                        by_state.cancelled += 1;
                        "cancelled"
                    }
                };
                let spec = self.engine.job_spec(c.jid);
                let b = self.book.jobs.get(c.jid as usize);
                let mut satellites = sats_of.remove(&id).unwrap_or_default();
                satellites.sort_by_key(|s| s.job_id);
                view::JobView {
                    job_id: id,
                    user: c.user.clone(),
                    uid: c.uid,
                    min_nodes: spec.min_nodes,
                    max_nodes: spec.max_nodes,
                    state: state.to_string(),
                    nodes: self.names(held),
                    size: held.len() as u32,
                    core_nodes: self.names(self.engine.job_anchors(c.jid)),
                    satellites,
                    rate: self.engine.measured_rate(c.jid),
                    admits: b.map_or(0, |b| b.admits),
                    grows: b.map_or(0, |b| b.grows),
                    shrinks: b.map_or(0, |b| b.shrinks),
                    requeues: b.map_or(0, |b| b.requeues),
                    preemptions: b.map_or(0, |b| b.preemptions),
                    largest: b.map_or(0, |b| b.largest),
                    node_hours: b.map_or(0.0, |b| b.node_seconds_at(now) / 3600.0),
                    submitted_at: b.map_or(now, |b| b.submitted_at),
                    ended_at: b.and_then(|b| b.ended_at),
                    history: b.map(|b| b.history.iter().copied().collect()),
                    history_dropped: b.map_or(0, |b| b.history_dropped),
                    paused_until: self.blame.paused(id, now).map(|p| p.until),
                    pause_reason: self.blame.paused(id, now).map(|p| p.reason.clone()),
                    unservable: self.unservable.get(&id).cloned(),
                }
            })
            .collect();
        view::Snapshot {
            schema: view::SCHEMA.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            time: now,
            started_at: self.started_at.unwrap_or(now),
            lending: self.engine.lending().as_str().to_string(),
            slurm_reachable: self.outage_since.is_none(),
            last_error: self.last_error.clone(),
            poll: self.poll_times.latency(),
            decision: self.decide_times.latency(),
            counts,
            jobs_by_state: by_state,
            node_seconds_harvested: self.book.harvested_node_seconds(now),
            stats: self.stats.clone(),
            nodes,
            jobs,
        }
    }

    // recovery
    /// Rebuilds the engine from the journal without deciding again: each journaled
    /// decision (`Event::Decided`, written right after its Tick) is applied as it was
    /// made, whatever the config or build is now (`Mode::Restore`); a Tick without one
    /// (a journal of an older bftrainerd) is decided again under the current config.
    /// A record the engine refuses is logged and skipped: the journal's content never
    /// keeps the daemon from starting. The config takes effect from the first decision.
    fn restore(&mut self, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        let t0 = std::time::Instant::now();
        self.engine.set_mode(Mode::Restore);
        let mut redecided = 0u64;
        let mut i = 0;
        while i < records.len() {
            let r = &records[i];
            if matches!(r.event, Event::Tick) {
                if let Some(next) = records
                    .get(i + 1)
                    .filter(|n| matches!(n.event, Event::Decided { .. }))
                {
                    // The decision first, then its Tick (the book settles sizes on Ticks).
                    self.restore_record(next, i + 2);
                    self.restore_record(r, i + 1);
                    i += 2;
                    continue;
                }
                redecided += 1;
                self.engine.set_mode(Mode::Live);
                self.restore_record(r, i + 1);
                self.engine.set_mode(Mode::Restore);
            } else {
                self.restore_record(r, i + 1);
            }
            i += 1;
        }
        for w in self.engine.take_warnings() {
            log::warn!("journal: {w}");
        }
        self.engine.set_mode(Mode::Live);
        self.engine.take_activated();
        let st = &self.engine.stats;
        log::info!(
            "rebuilt from the journal in {:.2} s: {} records, {} nodes, {} elastic jobs; {} decisions restored as made, {} skipped, {} decided again (older journal), {} records skipped",
            t0.elapsed().as_secs_f64(),
            records.len(),
            self.nodes.len(),
            self.jobs.len(),
            st.restored_actions,
            st.skipped_actions,
            redecided,
            self.stats.journal_skipped
        );
    }

    // recovery
    /// Feeds one journal record (line `line`) at start-up; refused: logged, skipped.
    fn restore_record(&mut self, r: &Record, line: usize) {
        match self.feed(&r.event, r.t) {
            Ok(_) => {
                self.last_t = self.last_t.max(r.t);
                if let Event::Snapshot { state, nodes, jobs } = &r.event {
                    self.learn_snapshot(state, nodes, jobs, r.t);
                    return;
                }
                if let Err(e) = self.learn(&r.event) {
                    log::warn!("journal record {line}: {e}");
                    if matches!(r.event, Event::JobSubmitted { .. }) {
                        // Keeps engine ids and Slurm ids aligned; 0 names no Slurm job.
                        self.jobs.push(0);
                    }
                }
            }
            Err(e) => {
                self.stats.journal_skipped += 1;
                log::warn!("journal record {line} skipped: {e}");
            }
        }
    }

    // recovery
    /// Rebuilds the daemon's maps from a snapshot the engine loaded: node names and
    /// classes, the Slurm id of every engine job, and the book of `bftrainer jobs`,
    /// which starts again at the snapshot (the sizes before it are in the history of
    /// the journal it replaced, and in accounting).
    fn learn_snapshot(
        &mut self,
        state: &bftrainer_core::engine::EngineState,
        nodes: &[String],
        jobs: &[String],
        t: f64,
    ) {
        self.nodes.clear();
        self.node_ids.clear();
        for (i, name) in nodes.iter().enumerate() {
            let ev = Event::NodeAdded {
                node: i as NodeId,
                name: name.clone(),
            };
            self.learn(&ev).ok();
            let Some(ns) = state.nodes.get(i) else {
                continue;
            };
            let rec = &mut self.nodes[i];
            match ns.state {
                NodeState::Idle | NodeState::Held(_) => {
                    rec.sent_forecast = ns.reclaim_at;
                    rec.class = Class::Available {
                        reclaim_at: ns.reclaim_at,
                    };
                    rec.why = Why::Open;
                }
                NodeState::Lost => {
                    rec.class = Class::Lost;
                    rec.why = Why::Unavailable;
                }
                NodeState::Busy => {}
            }
        }
        self.jobs = jobs.iter().map(|j| j.parse().unwrap_or(0)).collect();
        self.book = book::Book::default();
        let placeholder = ElasticSpec {
            name: String::new(),
            min_nodes: 1,
            max_nodes: 1,
            scale_up_s: 0.0,
            scale_down_s: 0.0,
            objective: Curve::default(),
            user: None,
            priority: 0,
        };
        for j in 0..self.engine.n_jobs() {
            let ev = Event::JobSubmitted {
                job: j as JobId,
                spec: placeholder.clone(),
            };
            self.book.event(&self.engine, &ev, None, &[], t);
        }
        self.book.event(&self.engine, &Event::Tick, None, &[], t);
    }

    // recovery
    /// Rewrites the journal as one snapshot of the engine's state, with the names the
    /// daemon maps nodes and jobs by (`Event::Snapshot`), atomically: the journal stays
    /// bounded and a start-up reads one record instead of the whole history. Called
    /// when the journal outgrows `journal::COMPACT_AFTER` records.
    pub fn compact_journal(&mut self) -> anyhow::Result<()> {
        let Some(j) = self.journal.as_mut() else {
            return Ok(());
        };
        j.flush()?;
        let state = self.engine.state();
        let t = state.t.unwrap_or(self.last_t);
        let ev = Event::Snapshot {
            state: Box::new(state),
            nodes: self.nodes.iter().map(|n| n.name.clone()).collect(),
            jobs: self.jobs.iter().map(u32::to_string).collect(),
        };
        let before = j.records;
        let t0 = std::time::Instant::now();
        j.rewrite(&[record(t, ev)])?;
        log::info!(
            "journal compacted: {before} records rewritten as one snapshot in {:.3} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// How long a satellite being shrunk gets from its SIGTERM to leave before it is
/// cancelled: `shrink_grace` plus two training steps, at most `shrink_grace_max` (never
/// less than `shrink_grace`). The leave flag rides the next gradient all-reduce, so a
/// SIGTERM just after one is seen at the end of the following step: up to two steps to
/// the boundary, then `shrink_grace` to commit and exit. `step` 0 (not measured) or not
/// finite: `shrink_grace` alone.
fn shrink_deadline(shrink_grace: f64, shrink_grace_max: f64, step: f64) -> f64 {
    let step = if step.is_finite() && step > 0.0 {
        step
    } else {
        0.0
    };
    (shrink_grace + 2.0 * step).min(shrink_grace_max.max(shrink_grace))
}

/// Seconds for a log line: to 0.1 s, no trailing ".0".
fn round1(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_deadline_follows_the_step_time_up_to_the_cap() {
        // Not measured: shrink_grace alone.
        assert_eq!(shrink_deadline(10.0, 600.0, 0.0), 10.0);
        assert_eq!(shrink_deadline(10.0, 600.0, f64::NAN), 10.0);
        assert_eq!(shrink_deadline(10.0, 600.0, -1.0), 10.0);
        // 3 s steps: up to two steps to the boundary, then the grace.
        assert_eq!(shrink_deadline(10.0, 600.0, 3.0), 16.0);
        // A 1-hour step: the cap.
        assert_eq!(shrink_deadline(10.0, 600.0, 3600.0), 600.0);
        assert_eq!(shrink_deadline(10.0, 600.0, f64::INFINITY), 10.0);
        // A cap below shrink_grace never shortens shrink_grace.
        assert_eq!(shrink_deadline(30.0, 10.0, 5.0), 30.0);
        assert_eq!(shrink_deadline(0.0, 0.0, 5.0), 0.0);
        assert_eq!(
            (round1(16.0), round1(12.468), round1(0.5)),
            (16.0, 12.5, 0.5)
        );
        assert_eq!(format!("{}", round1(16.0)), "16");
    }
}
