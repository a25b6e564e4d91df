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

mod adopt;
pub mod blame;
pub mod book;
pub mod cluster;
pub mod config;
pub mod control;
pub mod gen;
mod gpulend;
pub mod journal;
pub mod lease;
mod limits;
pub mod listen;
pub mod metrics;
mod observe;
pub(crate) mod placement;
pub mod priority;
mod reconcile;
mod recovery;
pub mod run;
mod satellites;
mod scan;
mod sensitivity;
mod slots;
mod status;
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
    /// Its features, GRES and memory as last compared with the engine's (`placement`).
    seen_attrs: Option<(Vec<String>, Option<String>, u64)>,
    /// A GPU slot (`host/gpuK`, `gpulend`), not a whole node.
    gpu_slot: bool,
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
    /// It came back from a requeue held, a requeue the daemon did not ask for
    /// (`scontrol requeuehold`): not admitted until the hold is lifted; the note
    /// ([`spec::requeue_hold_note`]) is still to be written into its Comment.
    requeue_hold: bool,
    /// When writing that note was last tried.
    hold_tried: f64,
    ended: bool,
    /// When the daemon saw it end (for `[daemon] job_retention`).
    ended_at: f64,
    /// The runtime's last published rate (samples/s) and size, from the job's Comment.
    rate: Option<(f64, u32)>,
    /// When that rate or the costs were last journaled (`Event::Progress`,
    /// `Event::RescaleCost`), for the rate limit.
    rate_at: f64,
    /// The runtime's last published rescale costs (up, down seconds), from the Comment.
    costs: Option<(f64, f64)>,
    /// The `batch_now` last written into its tag, and when (`publish_batch`).
    batch_asked: Option<(u32, f64)>,
    /// The runtime's last measured seconds per training step, from the job's Comment
    /// (0: never measured). Sets how long a shrunk satellite gets to leave.
    step_s: f64,
    user: Option<String>,
    /// Slurm's PreemptTime of the run being preempted and when this daemon first saw
    /// it (engine time): the grace time counts from the latter.
    preempt_seen: Option<(i64, f64)>,
    /// Its partition when adopted: one it has left was moved by an administrator.
    partition: Option<String>,
    /// The current run's runtime wrote that its training finished (`done=1` in the
    /// Comment, for this start time): it is paused, so that the nodes its
    /// leaving workers free go to others, not to satellites that could only fail.
    trained: bool,
    /// The end of that pause (engine time), renewed while the Comment says `done=1`.
    trained_until: f64,
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
    /// When this daemon first saw it pending, and its preemption (engine time): its
    /// timeouts count from these, not from Slurm's timestamps (a clock stepped or
    /// skewed against slurmctld's would fire them at once).
    pending_seen: Option<f64>,
    preempt_seen: Option<f64>,
    /// The GPU slot a GPU satellite stands for (`gpulend`).
    slot: Option<NodeId>,
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
    /// Cores released to Slurm because they left the elastic partitions.
    pub released: u64,
    /// Decisions the engine refused (an allocator or contract error): logged and
    /// skipped, the loop goes on.
    #[serde(default)]
    pub refused_decisions: u64,
    /// Journal records refused at start-up (damaged lines and records the engine
    /// refused; logged and skipped).
    #[serde(default)]
    pub journal_skipped: u64,
    /// Jobs whose growth was paused after failures of their own (`blame`).
    #[serde(default)]
    pub job_pauses: u64,
    /// Lending calls left for the next cycle when one ran over `cycle_budget`.
    #[serde(default)]
    pub deferred_calls: u64,
    /// Elastic jobs paused and shrunk to their cores because a regular job waited on an
    /// association or QOS limit their satellites count against (`limits`).
    #[serde(default)]
    pub limit_pauses: u64,
    /// Satellites Slurm refused for reasons of the whole cluster (charged to no job;
    /// growth held with backoff).
    #[serde(default)]
    pub cluster_refusals: u64,
    /// Changes of a job's published rate or size (its Comment) not journaled because
    /// the last one was less than `PROGRESS_EVERY_S` ago.
    #[serde(default)]
    pub progress_deferred: u64,
    /// Running cores adopted from Slurm without an admission on record (`adopt`).
    #[serde(default)]
    pub adopted_running: u64,
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

/// A monotonic clock in seconds (`Daemon::use_elapsed_clock`).
pub type ElapsedClock = Box<dyn FnMut() -> f64 + Send>;

pub struct Daemon<C: Cluster> {
    pub cfg: Config,
    pub cluster: C,
    engine: Engine<Exact>,
    journal: Option<Journal>,
    nodes: Vec<NodeRec>,
    /// Node name -> engine id (FxHash: looked up per satellite and node every cycle).
    node_ids: rustc_hash::FxHashMap<String, NodeId>,
    /// Engine job -> Slurm job id of its core job.
    jobs: Vec<u32>,
    /// Slurm job id -> its newest engine job, for `jobs[..indexed]` (`engine_job`);
    /// forgotten jobs leave it.
    job_index: rustc_hash::FxHashMap<u32, JobId>,
    indexed: usize,
    cores: BTreeMap<u32, Core>,
    sats: rustc_hash::FxHashMap<u32, SatMemo>,
    set_aside: HashMap<NodeId, SetAside>,
    /// Failed growths charged to jobs, and users' failures per node (`blame`).
    blame: blame::Blame,
    /// Waiting jobs no lent node can serve, and why (`unservable_why`).
    unservable: HashMap<u32, String>,
    /// Each GPU job's measured sensitivity to CPUs and memory per GPU (`sensitivity`).
    measured: HashMap<u32, sensitivity::Measured>,
    /// This cycle's satellites by parent: indices in the job table (`observe_cores`).
    sat_parts: rustc_hash::FxHashMap<u32, Vec<usize>>,
    /// When slurmctld last answered again after an outage: a satellite that waited
    /// through one is not charged to anyone.
    outage_ended: f64,
    /// Jobs with a tag the daemon refused to adopt (logged once each).
    refused: HashSet<u32>,
    last_t: f64,
    /// The wall-clock time (`now` as given) that `last_t` stands for: engine time
    /// advances by the wall clock's steps forward from it, never back (`engine_now`).
    last_wall: f64,
    /// A monotonic clock (seconds on its own scale) and its reading that `last_t`
    /// stands for: set, engine time advances by it instead of the wall clock's steps
    /// forward, so a clock stepped forward shortens no timer either
    /// (`use_elapsed_clock`; bftrainerd sets it, tests drive wall time alone).
    elapsed_clock: Option<(ElapsedClock, f64)>,
    /// Engine time minus the wall clock's, as of the last cycle: what turns Slurm's
    /// timestamps (wall-clock) into engine time (`slurm_t`).
    wall_offset: f64,
    last_full: f64,
    outage_since: Option<f64>,
    /// Node names interned per node table, host expressions expanded (`slots`).
    slots: slots::Slots,
    /// Tagged jobs' parsed tags, by Slurm id (`observe`).
    tags: rustc_hash::FxHashMap<u32, observe::TagMemo>,
    /// Copies of the core jobs that observe and reconcile read, kept from one cycle to
    /// the next and copied again only where the snapshot's record differs
    /// (`observe::keep_copy`).
    observe_copies: Vec<Job>,
    reconcile_copies: Vec<Job>,
    /// What the job table says of regular jobs, and where the tagged jobs are
    /// (`scan`), kept while no table changes.
    regular: Option<scan::Regular>,
    /// The last refresh reloaded a table (jobs, nodes or partitions).
    tables_reloaded: bool,
    /// The length of the job table observe scanned this cycle: reconcile then reads
    /// the tagged jobs it found (`regular`) instead of passing over the whole table
    /// again. Taken by reconcile, so never used a cycle late.
    tagged_of: Option<usize>,
    /// Nodes taken from elastic jobs by preemption, and when: not lent again for
    /// `reclaim_hold_s` unless a regular job shows up there first.
    reclaimed: rustc_hash::FxHashMap<NodeId, f64>,
    /// Nodes whose hold after a regular job left has run during this idle period: not
    /// held again until a job runs there (else a long queue of regular jobs that do not
    /// fit would keep the node from ever being lent).
    held_after_job: rustc_hash::FxHashSet<NodeId>,
    /// The cluster-wide lease (`[daemon] lease_dir`), checked before each cycle's
    /// actions; `fenced` once it is lost (the daemon then acts no more).
    pub lease: Option<lease::Lease>,
    pub fenced: bool,
    /// Running cores to adopt as Slurm runs them, at the next decision (`adopt`).
    adopting: std::collections::BTreeSet<u32>,
    /// The first cycle's time.
    started_at: Option<f64>,
    pub stats: Stats,
    pending: Vec<Event>,
    /// Per-job history for `bftrainer jobs`.
    book: book::Book,
    /// The last error logged, for `bftrainer status`.
    last_error: Option<view::LastError>,
    /// Satellites not submitted until then, after cluster-wide refusals.
    growth_held: Option<view::GrowthHeld>,
    /// Elastic jobs paused because a regular job waits on a limit their satellites
    /// count against (`limits`), and until when.
    limit_paused: rustc_hash::FxHashMap<u32, f64>,
    /// Nodes where a satellite (or an ended core) is still leaving, found by reconcile:
    /// nothing new is placed there until Slurm is done with them.
    occupied: rustc_hash::FxHashSet<NodeId>,
    /// The partition rule slurmctld's partitions break now (`config::check_partitions`,
    /// run at start, at SIGHUP and whenever they change): while set, nothing new is
    /// lent (no decision, admission or satellite); what runs is left to Slurm.
    pub partition_fault: Option<String>,
    /// Check the partitions at the next cycle (start, SIGHUP).
    recheck_partitions: bool,
    /// The current cycle's time (for `last_error`).
    clock: f64,
    /// When the current cycle's calls began (for `[daemon] cycle_budget`), and
    /// whether one of them lent nodes yet.
    calls_t0: Option<std::time::Instant>,
    lent_in_cycle: bool,
    /// Recent cycle timings: the Slurm refresh, and observe + decide.
    pub poll_times: view::Window,
    pub decide_times: view::Window,
    /// Slurm's priority factors, for the waiting jobs' admission order (`priority`).
    prio: priority::Inputs,
    /// Tests that run two daemons side by side count the refresh as taking no time, so
    /// that both see the same clock.
    #[cfg(test)]
    still_clock: bool,
    /// Tests that run two daemons side by side make one of them derive everything
    /// afresh each cycle: observe scans the whole job table every cycle, and reconcile
    /// passes over it again itself.
    #[cfg(test)]
    afresh: bool,
}

/// A job's measured rate at an unchanged size is journaled at most this often (its
/// owner writes the Comment it comes from).
pub const PROGRESS_EVERY_S: f64 = 30.0;

/// The longest pause of a job's growth and the longest set-aside of a node.
pub const MAX_BACKOFF_S: f64 = 3600.0;
/// The longest hold of all growth after cluster-wide refusals: the cause (MaxJobCount,
/// a partition down, slurmdbd) is an administrator's to mend, and growth should
/// resume soon after.
pub const GROWTH_HOLD_MAX_S: f64 = 300.0;
/// The pause of a job no lent node can serve, lifted as soon as one can (a year).
const UNSERVABLE_PAUSE_S: f64 = 365.0 * 86_400.0;
/// How long a job whose training finished is paused, renewed while its Comment says so
/// (it ends meanwhile); short, so that a pause a restart or a requeue leaves behind ends
/// by itself.
const TRAINED_PAUSE_S: f64 = 60.0;
/// A core job back from a requeue within this many seconds of the daemon asking for
/// one is taken for the daemon's own requeue, even when the call reported an error.
const OWN_REQUEUE_S: f64 = 60.0;

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

#[inline]
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
            node_ids: Default::default(),
            jobs: Vec::new(),
            job_index: Default::default(),
            indexed: 0,
            cores: BTreeMap::new(),
            sats: Default::default(),
            set_aside: HashMap::new(),
            blame: blame::Blame::default(),
            unservable: HashMap::new(),
            measured: HashMap::new(),
            sat_parts: Default::default(),
            outage_ended: f64::NEG_INFINITY,
            refused: HashSet::new(),
            last_t: f64::NEG_INFINITY,
            last_wall: f64::NAN,
            elapsed_clock: None,
            wall_offset: 0.0,
            last_full: f64::NEG_INFINITY,
            outage_since: None,
            slots: slots::Slots::default(),
            tags: rustc_hash::FxHashMap::default(),
            observe_copies: Vec::new(),
            reconcile_copies: Vec::new(),
            regular: None,
            tables_reloaded: true,
            tagged_of: None,
            reclaimed: Default::default(),
            held_after_job: Default::default(),
            adopting: Default::default(),
            lease: None,
            fenced: false,
            started_at: None,
            stats: Stats::default(),
            pending: Vec::new(),
            book: book::Book::default(),
            last_error: None,
            growth_held: None,
            occupied: Default::default(),
            limit_paused: Default::default(),
            partition_fault: None,
            recheck_partitions: true,
            clock: 0.0,
            calls_t0: None,
            lent_in_cycle: false,
            poll_times: view::Window::default(),
            decide_times: view::Window::default(),
            prio: priority::Inputs::default(),
            #[cfg(test)]
            still_clock: false,
            #[cfg(test)]
            afresh: false,
        };
        d.cluster.set_node_detail(!d.cfg.gpu_partitions.is_empty());
        // Damaged lines the journal skipped count with the records the engine refuses.
        d.stats.journal_skipped = d.journal.as_ref().map_or(0, |j| j.skipped);
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
                self.slots.node_added(name, *node);
                self.nodes.push(NodeRec {
                    name: name.clone(),
                    sent_forecast: None,
                    class: Class::Claimed,
                    why: Why::RegularJob,
                    seen_attrs: None,
                    gpu_slot: bftrainer_core::placement::gpu_slot_index(name).is_some(),
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
            Event::JobForgotten { job } => {
                self.book.forget(*job);
                if let Some(&id) = self.jobs.get(*job as usize) {
                    if self.job_index.get(&id) == Some(job) {
                        self.job_index.remove(&id);
                    }
                }
            }
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
        self.cluster.set_node_detail(!cfg.gpu_partitions.is_empty());
        self.cfg = cfg;
        self.cfg.state_dir = state_dir;
        self.recheck_partitions = true;
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

    /// `config::check_partitions` against slurmctld's partitions now: lending stops
    /// while a rule is broken (logged once, in `bftrainer status` and the metrics) and
    /// resumes once it holds again.
    fn check_partitions(&mut self) {
        self.recheck_partitions = false;
        let mut fault = config::check_partitions(&self.cfg, self.cluster.partitions()).err();
        if fault.is_none() {
            // PreemptType and the global PreemptMode are slurmctld's config: read when
            // the partitions change (a reconfigure rebuilds them), at start and at
            // SIGHUP. Unknown now (an error): the partitions' verdict stands.
            match self.cluster.preemption() {
                Ok(p) => {
                    fault = config::check_preempt_type(&self.cfg, p.preempt_type.as_deref())
                        .and_then(|()| {
                            config::check_global_preempt_mode(
                                &self.cfg,
                                p.preempt_mode,
                                self.cluster.partitions(),
                            )
                        })
                        .err()
                }
                Err(e) => log::warn!("cannot read slurmctld's PreemptType now ({e})"),
            }
        }
        match (&self.partition_fault, &fault) {
            (None, Some(f)) => self.error(format!(
                "lending stopped: {f}; running elastic jobs are left to Slurm until the partitions are fixed"
            )),
            (Some(_), None) => log::info!("the partitions pass the checks again: lending resumes"),
            (Some(a), Some(b)) if a != b => self.error(format!("lending still stopped: {b}")),
            _ => {}
        }
        self.partition_fault = fault;
    }

    /// Logs an error and keeps it for `bftrainer status`.
    pub fn error(&mut self, message: String) {
        log::error!("{message}");
        self.last_error = Some(view::LastError {
            time: self.clock,
            message,
        });
    }

    /// Engine time at wall-clock time `wall`. It moves on by the wall clock's steps
    /// forward since the last call and never back: a clock stepped back (NTP, an
    /// administrator) leaves it where it was and it goes on from there, so every timer
    /// (set-asides, holds, pauses, retries, grace times) expires on elapsed time. At
    /// the first call it is the later of `wall` and the journal's last time, then runs
    /// from there: a journal written under a clock ahead (future timestamps) is not
    /// waited out.
    fn engine_now(&mut self, wall: f64) -> f64 {
        let elapsed = match self.elapsed_clock.as_mut() {
            Some((clock, last)) => {
                let m = clock();
                let e = (m - *last).max(0.0);
                *last = m;
                e
            }
            None => (wall - self.last_wall).max(0.0),
        };
        let t = if self.last_wall.is_nan() {
            wall.max(self.last_t)
        } else {
            self.last_t + elapsed
        };
        let t = if t.is_finite() { t } else { wall };
        self.last_t = t;
        self.last_wall = wall;
        self.wall_offset = t - wall;
        t
    }

    /// Makes engine time advance by `clock` (seconds, monotonic: bftrainerd passes
    /// CLOCK_MONOTONIC's) between calls instead of by the wall clock's steps forward:
    /// then neither a clock stepped back nor one stepped forward changes how long a
    /// timer runs. Slurm's timestamps are still mapped through the wall clock
    /// (`slurm_t`).
    pub fn use_elapsed_clock(&mut self, clock: ElapsedClock) {
        self.elapsed_clock = Some((clock, f64::NAN));
    }

    /// A Slurm timestamp (slurmctld's wall clock) in engine time.
    fn slurm_t(&self, t: i64) -> f64 {
        t as f64 + self.wall_offset
    }

    /// Opens, pauses or drains lending (`bftrainer resume|pause|drain`): journaled, so
    /// it holds across restarts; the next cycle acts on it.
    pub fn set_lending(&mut self, mode: Lending, now: f64) -> anyhow::Result<()> {
        let now = self.engine_now(now);
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

    /// The newest engine job of Slurm job `id` that is not forgotten (Slurm may reuse
    /// an id), without a scan of every job ever.
    fn engine_job(&mut self, id: u32) -> Option<JobId> {
        self.index_jobs();
        self.job_index.get(&id).copied()
    }

    /// Brings `job_index` up to the engine's jobs.
    fn index_jobs(&mut self) {
        if self.indexed > self.jobs.len() {
            self.job_index.clear();
            self.indexed = 0;
        }
        while self.indexed < self.jobs.len() {
            let k = self.indexed;
            // One the book has forgotten already (a journal replayed at start) is not
            // indexed: only its status is left, which the scan this replaces found
            // ended, as `adopt_core` does without it.
            if self.book.get(k as JobId).is_some() {
                self.job_index.insert(self.jobs[k], k as JobId);
            }
            self.indexed += 1;
        }
    }

    fn emit(&mut self, mut ev: Event) {
        // A job whose training finished stays paused whatever lifts or shortens its
        // other pauses (blame, limits, holds): it has no use for more nodes.
        if let Event::JobPaused { job, until } = &mut ev {
            if let Some(c) = self.cores.values().find(|c| c.jid == *job && c.trained) {
                *until = Some(until.map_or(c.trained_until, |u| u.max(c.trained_until)));
            }
        }
        self.pending.push(ev);
    }

    /// One poll: observe, decide, reconcile. `now` is Unix time in seconds.
    pub fn cycle(&mut self, now: f64) -> anyhow::Result<CycleReport> {
        let wall = now;
        let now = self.engine_now(wall);
        self.clock = now;
        let mut rep = CycleReport::default();
        self.stats.cycles += 1;
        // plan_refresh 0: never force a full job load (node-table changes still do).
        let full = self.cfg.plan_refresh_s > 0.0 && now - self.last_full >= self.cfg.plan_refresh_s;
        let t0 = std::time::Instant::now();
        let refreshed = self.cluster.refresh(full);
        rep.poll_s = t0.elapsed().as_secs_f64();
        // What was observed is as of the end of the refresh, not its start (a slow
        // slurmctld can take seconds).
        let poll_s = rep.poll_s;
        #[cfg(test)]
        let poll_s = if self.still_clock { 0.0 } else { poll_s };
        let now = now + poll_s;
        self.last_wall = wall + poll_s;
        if let Some((_, last)) = self.elapsed_clock.as_mut() {
            *last += poll_s;
        }
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
                self.tables_reloaded = r.any();
                if r.partitions || self.recheck_partitions {
                    self.check_partitions();
                }
            }
        }
        rep.slurm_ok = true;
        // Observing acts too (a preempted core requeued, a changed satellite cancelled).
        if !self.lease_held() {
            return Ok(rep);
        }
        let t0 = std::time::Instant::now();
        self.observe(now);
        self.sync_node_attrs();
        self.refresh_priorities(now);
        rep.events = self.pending.len();
        let actions = self.decide(now)?;
        rep.decide_s = t0.elapsed().as_secs_f64();
        self.decide_times.push(rep.decide_s);
        rep.actions = actions;
        self.calls_t0 = Some(std::time::Instant::now());
        self.lent_in_cycle = false;
        // Fencing: a daemon paused since the check above (SIGSTOP, a frozen VM, a slow
        // slurmctld) may have lost the lease meanwhile.
        if !self.lease_held() {
            return Ok(rep);
        }
        rep.calls = self.reconcile(now);
        self.last_t = now;
        Ok(rep)
    }

    /// Whether this daemon may act now: no lease configured, or it holds (and has just
    /// renewed) the lease. Once lost, `fenced` stays set and nothing more is done.
    fn lease_held(&mut self) -> bool {
        if self.fenced {
            return false;
        }
        let Some(l) = self.lease.as_mut() else {
            return true;
        };
        match l.hold() {
            Ok(true) => true,
            Ok(false) => {
                self.fenced = true;
                false
            }
            Err(e) => {
                // Unreadable lease: not acting is the safe side; the holder's term runs
                // out and a daemon that can read it takes over.
                self.fenced = true;
                self.error(format!("lease: {e:#}; acting no more"));
                false
            }
        }
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
        self.apply_adoptions(now);
        let decisions = self.engine.stats.decisions;
        let tick = if self.partition_fault.is_some() {
            // Nothing new is decided while a partition check fails; the events are
            // applied, and the next decision after the fix sees them.
            Ok(Vec::new())
        } else {
            self.feed(&Event::Tick, now)
        };
        let actions = match tick {
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

    /// Whether this cycle's calls have used up `[daemon] cycle_budget`: further calls
    /// that lend nodes wait for the next cycle (counted); calls that give nodes back
    /// still run. The budget counts the calls, not the refresh before them, and the
    /// first lending call of a cycle always runs: with a slurmctld slower per call than
    /// the whole budget, lending goes on one call per cycle (counting the refresh, a
    /// refresh of three slow calls used the budget up and nothing was ever lent).
    /// `false` means the caller makes the call.
    fn over_budget(&mut self) -> bool {
        let over = self.lent_in_cycle
            && self
                .calls_t0
                .is_some_and(|t| t.elapsed().as_secs_f64() > self.cfg.cycle_budget_s);
        if over {
            self.stats.deferred_calls += 1;
        } else {
            self.lent_in_cycle = true;
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
    use bftrainer_slurm::{
        BatchJob, FairshareTable, JobUpdate, Node, Partition, PriorityWeights, Refresh,
        SignalTarget,
    };
    use std::time::Duration;

    /// The tests' config: satellites in `elastic-sat`, state in `state`, then
    /// `daemon_extra` (more `[daemon]` keys).
    pub(super) fn test_config(state: &std::path::Path, daemon_extra: &str) -> config::Config {
        config::parse(
            &format!(
                "[policy]\nsatellite_partition = \"elastic-sat\"\n\
                 [daemon]\nstate_dir = \"{}\"\n{daemon_extra}",
                state.display()
            ),
            std::path::Path::new("/test/bftrainer.toml"),
        )
        .unwrap()
    }

    /// A slurmctld that answers every call `delay` late: the generated cluster behind a
    /// sleep.
    struct Slow {
        inner: gen::GenCluster,
        delay: Duration,
    }

    impl Slow {
        fn wait(&self) {
            std::thread::sleep(self.delay);
        }
    }

    impl Cluster for Slow {
        fn refresh(&mut self, full_jobs: bool) -> cluster::Result<Refresh> {
            self.wait();
            self.inner.refresh(full_jobs)
        }
        fn nodes(&self) -> &[Node] {
            self.inner.nodes()
        }
        fn partitions(&self) -> &[Partition] {
            self.inner.partitions()
        }
        fn jobs(&self) -> &[Job] {
            self.inner.jobs()
        }
        fn submit(&mut self, job: &BatchJob) -> cluster::Result<u32> {
            self.wait();
            self.inner.submit(job)
        }
        fn update(&mut self, job_id: u32, update: &JobUpdate) -> cluster::Result<()> {
            self.wait();
            self.inner.update(job_id, update)
        }
        fn hold(&mut self, job_id: u32, tag: &str) -> cluster::Result<()> {
            self.wait();
            self.inner.hold(job_id, tag)
        }
        fn release(&mut self, job_id: u32, tag: &str, comment: &str) -> cluster::Result<()> {
            self.wait();
            self.inner.release(job_id, tag, comment)
        }
        fn signal(
            &mut self,
            job_id: u32,
            signal: i32,
            target: SignalTarget,
        ) -> cluster::Result<()> {
            self.wait();
            self.inner.signal(job_id, signal, target)
        }
        fn cancel(&mut self, job_id: u32) -> cluster::Result<()> {
            self.wait();
            self.inner.cancel(job_id)
        }
        fn requeue(&mut self, job_id: u32, hold: bool) -> cluster::Result<()> {
            self.wait();
            self.inner.requeue(job_id, hold)
        }
        fn compress(&self, names: &[String]) -> String {
            self.inner.compress(names)
        }
        fn expand(&self, expr: &str) -> Vec<String> {
            self.inner.expand(expr)
        }
        fn priority_inputs(&mut self) -> cluster::Result<(PriorityWeights, FairshareTable)> {
            self.wait();
            self.inner.priority_inputs()
        }
        fn preemption(&mut self) -> cluster::Result<bftrainer_slurm::Preemption> {
            self.wait();
            self.inner.preemption()
        }
    }

    /// The generated cluster, refusing satellites with Slurm error `refuse` while set.
    struct Refusing {
        inner: gen::GenCluster,
        refuse: Option<i32>,
        tries: u64,
    }

    impl Cluster for Refusing {
        fn refresh(&mut self, full_jobs: bool) -> cluster::Result<Refresh> {
            self.inner.refresh(full_jobs)
        }
        fn nodes(&self) -> &[Node] {
            self.inner.nodes()
        }
        fn partitions(&self) -> &[Partition] {
            self.inner.partitions()
        }
        fn jobs(&self) -> &[Job] {
            self.inner.jobs()
        }
        fn submit(&mut self, job: &BatchJob) -> cluster::Result<u32> {
            self.tries += 1;
            match self.refuse {
                Some(code) => Err(bftrainer_slurm::Error::Slurm {
                    call: "slurm_submit_batch_job",
                    code,
                    message: bftrainer_slurm::strerror(code),
                }),
                None => self.inner.submit(job),
            }
        }
        fn update(&mut self, job_id: u32, update: &JobUpdate) -> cluster::Result<()> {
            self.inner.update(job_id, update)
        }
        fn hold(&mut self, job_id: u32, tag: &str) -> cluster::Result<()> {
            self.inner.hold(job_id, tag)
        }
        fn release(&mut self, job_id: u32, tag: &str, comment: &str) -> cluster::Result<()> {
            self.inner.release(job_id, tag, comment)
        }
        fn signal(
            &mut self,
            job_id: u32,
            signal: i32,
            target: SignalTarget,
        ) -> cluster::Result<()> {
            self.inner.signal(job_id, signal, target)
        }
        fn cancel(&mut self, job_id: u32) -> cluster::Result<()> {
            self.inner.cancel(job_id)
        }
        fn requeue(&mut self, job_id: u32, hold: bool) -> cluster::Result<()> {
            self.inner.requeue(job_id, hold)
        }
        fn compress(&self, names: &[String]) -> String {
            self.inner.compress(names)
        }
        fn expand(&self, expr: &str) -> Vec<String> {
            self.inner.expand(expr)
        }
        fn priority_inputs(&mut self) -> cluster::Result<(PriorityWeights, FairshareTable)> {
            self.inner.priority_inputs()
        }
        fn preemption(&mut self) -> cluster::Result<bftrainer_slurm::Preemption> {
            self.inner.preemption()
        }
    }

    #[test]
    fn a_refusal_of_the_cluster_holds_growth_and_charges_no_job() {
        let size = |d: &Daemon<Refusing>| {
            d.cluster
                .jobs()
                .iter()
                .filter(|j| {
                    j.state.base() == JobBase::Running
                        && (j.job_id == 1 || j.name == satellite_name(1))
                })
                .count()
        };
        // The satellite partition is down: no job is charged, growth holds with
        // backoff (few tries), and resumes once Slurm takes satellites again.
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let mut d = Daemon::new(
            cfg,
            Refusing {
                inner: cluster,
                refuse: Some(2101 /* ESLURM_PARTITION_DOWN */),
                tries: 0,
            },
            None,
            &[],
        )
        .unwrap();
        let mut now = 3_000_000_000.0;
        for _ in 0..120 {
            now += 1.0;
            d.cluster.inner.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        assert_eq!(size(&d), 1, "only the core runs");
        assert_eq!(d.stats.job_pauses, 0, "no job charged");
        assert!(d.blame.paused(1, now).is_none());
        assert!(d.stats.cluster_refusals >= 1);
        assert!(d.growth_is_held(now) || d.growth_held.is_some());
        // Backoff from job_backoff (60 s): a try at 0, 60 and 180 s at most, each of
        // one satellite (the hold stops the rest of the cycle's).
        assert!(d.cluster.tries <= 3, "{} tries in 120 s", d.cluster.tries);
        assert!(d.snapshot(now).growth_held.is_some());
        d.cluster.refuse = None;
        for cycle in 0.. {
            assert!(cycle < 400, "growth did not resume");
            now += 1.0;
            d.cluster.inner.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if size(&d) == 4 {
                break;
            }
        }
        assert!(d.growth_held.is_none());
        assert_eq!(d.stats.job_pauses, 0);

        // The job's own refusal (its association's limits) pauses that job.
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let mut d = Daemon::new(
            cfg,
            Refusing {
                inner: cluster,
                refuse: Some(2050 /* ESLURM_ACCOUNTING_POLICY */),
                tries: 0,
            },
            None,
            &[],
        )
        .unwrap();
        for _ in 0..20 {
            now += 1.0;
            d.cluster.inner.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        assert_eq!(d.stats.job_pauses, 1);
        assert!(d.blame.paused(1, now).is_some());
        assert_eq!(d.stats.cluster_refusals, 0);
        assert!(d.growth_held.is_none());
    }

    /// Nodes n1-n4 in `batch`, `elastic` and `elastic-sat`, and one held core job
    /// (1, `1:4`); a config with `daemon_extra` added to `[daemon]`, whose state dir
    /// lives as long as the returned guard.
    pub(super) fn four_nodes_one_held_core(
        daemon_extra: &str,
    ) -> (gen::GenCluster, config::Config, tempfile::TempDir) {
        let names: Vec<String> = (1..=4).map(|i| format!("n{i}")).collect();
        let parts = ["batch", "elastic", "elastic-sat"];
        let nodes = names.iter().map(|n| gen::node(n.clone(), &parts)).collect();
        let partitions = vec![
            gen::partition("batch", &names, 10),
            gen::partition("elastic", &names, 2),
            gen::partition("elastic-sat", &names, 1),
        ];
        let mut core = gen::job(1, "elastic", JobBase::Pending);
        core.admin_comment = Some("bftrainer:v1 1:4,role=core".into());
        core.priority = 0;
        let state = tempfile::tempdir().unwrap();
        let cfg = test_config(state.path(), daemon_extra);
        (
            gen::GenCluster::new(nodes, partitions, vec![core]),
            cfg,
            state,
        )
    }

    /// Satellites Slurm runs now.
    pub(super) fn running_satellites(d: &Daemon<gen::GenCluster>) -> usize {
        d.cluster
            .jobs
            .iter()
            .filter(|j| {
                j.partition.as_deref() == Some("elastic-sat") && j.state.base() == JobBase::Running
            })
            .count()
    }

    /// Cycles (a second each, Slurm starting what was submitted) until the job of
    /// [`four_nodes_one_held_core`] runs on all 4 nodes: its core and 3 satellites.
    pub(super) fn grow_to_four(d: &mut Daemon<gen::GenCluster>, now: &mut f64) {
        for cycle in 0.. {
            assert!(cycle < 60, "the job did not grow to 4 nodes");
            *now += 1.0;
            d.cluster.start_pending_elastic(*now as i64);
            d.cycle(*now).unwrap();
            if running_satellites(d) == 3 {
                break;
            }
        }
    }

    #[test]
    fn a_slurmctld_slower_than_the_cycle_budget_still_gets_nodes_lent() {
        // Every call takes longer than the whole cycle_budget. The budget counts the
        // cycle's calls, not its refresh, and the first lending call of a cycle always
        // runs: the job is admitted and grows, one lending call per cycle, the others
        // deferred. (When the budget counted the refresh, nothing was ever lent.)
        let (cluster, cfg, _state) = four_nodes_one_held_core("cycle_budget = 0.1\n");
        let slow = Slow {
            inner: cluster,
            delay: Duration::from_millis(150),
        };
        let mut d = Daemon::new(cfg, slow, None, &[]).unwrap();
        let size = |d: &Daemon<Slow>| {
            d.cluster
                .jobs()
                .iter()
                .filter(|j| {
                    j.state.base() == JobBase::Running
                        && (j.job_id == 1 || j.name == satellite_name(1))
                })
                .count()
        };
        let mut now = 3_000_000_000.0;
        // Admission (pin and release), then three satellites: 4 lending steps, with
        // room for cycles that only observe.
        for cycle in 0.. {
            assert!(
                cycle < 40,
                "not grown onto 4 nodes after {cycle} cycles: {} running, {} calls deferred",
                size(&d),
                d.stats.deferred_calls
            );
            now += 1.0;
            d.cluster.inner.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if size(&d) == 4 {
                break;
            }
        }
        assert!(
            d.stats.deferred_calls > 0,
            "satellites beyond the first of a cycle wait for the next one"
        );
    }

    #[test]
    fn a_comment_alternating_its_size_costs_a_bounded_number_of_fsyncs() {
        // The owner writes the Comment: `nodes=` alternating at every poll used to
        // journal a Progress record, and fsync it, at every poll.
        let (cluster, cfg, state) = four_nodes_one_held_core("");
        let (journal, records) = journal::Journal::open(state.path()).unwrap();
        let mut d = Daemon::new(cfg, cluster, Some(journal), &records).unwrap();
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "the core did not start");
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if d.cores.get(&1).is_some_and(|c| c.started) {
                break;
            }
        }
        // Let the growth settle, so that only the Comment changes.
        for _ in 0..20 {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        let syncs0 = d.journal.as_ref().unwrap().syncs;
        let progress = || {
            std::fs::read_to_string(state.path().join(journal::JOURNAL_FILE))
                .unwrap()
                .lines()
                .filter(|l| l.contains("\"type\":\"progress\""))
                .count()
        };
        let polls = 300;
        for i in 0..polls {
            now += 1.0;
            let rc = RunComment {
                coord: "n1:29400".into(),
                run: "ab".into(),
                start: 0,
                gen: 1,
                nodes: if i % 2 == 0 { 1 } else { 4 },
                rate: 100.0,
                step: 0.5,
                batch: 0,
                done: false,
                // Measured rescale costs alternate too, in the same window.
                up: if i % 3 == 0 { 40.0 } else { 20.0 },
                down: 0.0,
            };
            d.cluster
                .jobs
                .iter_mut()
                .find(|j| j.job_id == 1)
                .unwrap()
                .comment = Some(rc.to_string());
            d.cluster.dirty = true;
            d.cycle(now).unwrap();
        }
        let syncs = d.journal.as_ref().unwrap().syncs - syncs0;
        // One change journaled per PROGRESS_EVERY_S, the first at once.
        let bound = (polls as f64 / PROGRESS_EVERY_S) as u64 + 1;
        assert!(
            syncs <= bound,
            "{syncs} fsyncs in {polls} polls (bound {bound}); {} progress records",
            progress()
        );
        assert!(progress() >= 2, "changes are still journaled");
        let costs = std::fs::read_to_string(state.path().join(journal::JOURNAL_FILE))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"type\":\"rescale_cost\""))
            .count();
        assert!(costs >= 2, "measured costs are journaled too ({costs})");
        // Half the polls show the value last journaled: no change to defer.
        assert!(d.stats.progress_deferred >= polls as u64 / 2 - bound);
    }

    #[test]
    fn a_job_whose_training_finished_gets_no_more_satellites() {
        // Seen in `make demo`: bft-run wrote done=1 into the Comment, its satellites
        // left, and before the core ended bftrainerd granted 3 new satellites, which
        // FAILED at once (the coordinator was over) and stayed in sacct.
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        let mut now = 3_000_000_000.0;
        grow_to_four(&mut d, &mut now);
        // The satellites ran long enough not to count as failures.
        now += 600.0;
        let start = d.cluster.jobs[0].start_time.unwrap();
        let comment = |start: i64, done: bool| {
            RunComment {
                coord: "n1:29400".into(),
                run: "ab".into(),
                start,
                gen: 2,
                nodes: 4,
                rate: 100.0,
                step: 0.5,
                done,
                up: 0.0,
                down: 0.0,
                batch: 0,
            }
            .to_string()
        };
        d.cluster.jobs[0].comment = Some(comment(start, false));
        d.cluster.dirty = true;
        d.cycle(now).unwrap();
        // The training finishes: the runtime's last word, then its satellites leave
        // while the core's batch script is still running.
        d.cluster.jobs[0].comment = Some(comment(start, true));
        for j in d.cluster.jobs.iter_mut() {
            if j.partition.as_deref() == Some("elastic-sat") {
                j.state = bftrainer_slurm::JobState::from_base(JobBase::Complete);
                j.end_time = Some(now as i64);
            }
        }
        d.cluster.dirty = true;
        let submits = d.cluster.calls.submits;
        // Longer than the pause: it is renewed while the Comment says so.
        for _ in 0..(3.0 * TRAINED_PAUSE_S) as usize {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        assert_eq!(
            d.cluster.calls.submits - submits,
            0,
            "satellites submitted for a job whose training finished"
        );
        assert_eq!(
            d.stats.satellite_failures, 0,
            "its leaving satellites are no failures"
        );
        // Slurm requeues it (a REQUEUE preemption just before its end): the next run
        // is admitted at once, not after the pause.
        {
            let core = &mut d.cluster.jobs[0];
            core.state = bftrainer_slurm::JobState::from_base(JobBase::Pending);
            core.restart_count += 1;
            core.nodes = None;
            core.start_time = None;
            core.priority = 0;
        }
        d.cluster.dirty = true;
        for cycle in 0.. {
            assert!(
                (cycle as f64) < TRAINED_PAUSE_S / 4.0,
                "the requeued job was not admitted again"
            );
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if d.cluster.jobs[0].state.base() == JobBase::Running {
                break;
            }
        }
        // Its Comment still says done=1, of the earlier run (a Comment survives a
        // requeue): that says nothing about this run, which grows again.
        for cycle in 0.. {
            assert!(cycle < 60, "the job did not grow again");
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if running_satellites(&d) == 3 {
                break;
            }
        }
    }

    #[test]
    fn a_batch_range_job_is_handed_its_decided_batch_in_its_tag_once() {
        // Job 1 declares batch=32:256; a second run without the range gets none.
        for ranged in [true, false] {
            let (mut cluster, cfg, _state) = four_nodes_one_held_core("");
            if ranged {
                cluster.jobs[0].admin_comment =
                    Some("bftrainer:v1 1:4,batch=32:256,lr=linear,role=core".into());
            }
            let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
            let mut now = 3_000_000_000.0;
            let tag = |d: &Daemon<gen::GenCluster>| {
                d.cluster
                    .jobs
                    .iter()
                    .find(|j| j.job_id == 1)
                    .unwrap()
                    .admin_comment
                    .clone()
                    .unwrap_or_default()
            };
            // The rate at `nodes` nodes: 100 samples/s on one, 160 on four (bound by
            // synchronisation at a batch of 32).
            let comment = |d: &mut Daemon<gen::GenCluster>, nodes: u32, batch: u32| {
                let rc = RunComment {
                    coord: "n1:29400".into(),
                    run: "ab".into(),
                    start: 0,
                    gen: 1,
                    nodes,
                    rate: if nodes == 1 { 100.0 } else { 160.0 },
                    step: 0.5,
                    up: 0.0,
                    down: 0.0,
                    batch,
                    done: false,
                };
                let j = d.cluster.jobs.iter_mut().find(|j| j.job_id == 1).unwrap();
                j.comment = Some(rc.to_string());
                d.cluster.dirty = true;
            };
            // Started and grown; no batch is decided before a rate at a known batch.
            for _ in 0..30 {
                now += 1.0;
                d.cluster.start_pending_elastic(now as i64);
                d.cycle(now).unwrap();
            }
            assert!(d.cores[&1].started);
            assert_eq!(spec::batch_now(&tag(&d)), None);
            // The runtime reports its rates at its script's batch of 32.
            for nodes in [1, 4] {
                comment(&mut d, nodes, 32);
                now += PROGRESS_EVERY_S;
                d.cycle(now).unwrap();
            }
            for _ in 0..3 {
                now += 1.0;
                d.cycle(now).unwrap();
            }
            if !ranged {
                assert_eq!(spec::batch_now(&tag(&d)), None, "{}", tag(&d));
                assert_eq!(d.engine.job_batch(d.cores[&1].jid), (None, None));
                continue;
            }
            // Saxena's model: a larger batch amortises the synchronisation.
            assert_eq!(
                tag(&d),
                "bftrainer:v1 1:4,batch=32:256,lr=linear,role=core,batch_now=256"
            );
            // Once written, no more updates while the decision stands: neither while
            // the workers still run at 32 nor once they report 256.
            let calls = d.cluster.calls.updates;
            for batch in [32, 32, 256, 256, 256] {
                comment(&mut d, 4, batch);
                now += PROGRESS_EVERY_S;
                d.cycle(now).unwrap();
            }
            assert_eq!(d.cluster.calls.updates, calls, "{}", tag(&d));
            assert_eq!(
                d.engine.job_batch(d.cores[&1].jid),
                (Some((32, 256)), Some(256))
            );
            assert_eq!(d.engine.decided_batch(d.cores[&1].jid), Some(256));
            // `bftrainer jobs` shows it with the range and the rate.
            let v = &d.snapshot(now).jobs[0];
            assert_eq!(
                (v.batch, v.batch_range, v.rate),
                (Some(256), Some((32, 256)), Some(160.0))
            );
            // The Comment is the job's to write: a batch outside its declared range is
            // not believed (it would rebase the job's rates through the model).
            for forged in [1, 16, 257, 1 << 24, u32::MAX] {
                comment(&mut d, 4, forged);
                now += PROGRESS_EVERY_S;
                d.cycle(now).unwrap();
                assert_eq!(
                    d.engine.job_batch(d.cores[&1].jid),
                    (Some((32, 256)), Some(256)),
                    "a Comment's batch of {forged} was believed"
                );
                assert_eq!(d.cluster.calls.updates, calls, "{}", tag(&d));
            }
        }
    }

    #[test]
    fn no_satellite_or_core_goes_where_a_satellite_is_still_completing() {
        // A satellite of job 99 on n2, still leaving (running out the SIGTERM grace of
        // its shrink: bftrainerd does not manage job 99, so it ends it), or ended with
        // n2 still COMPLETING in Slurm; a core of job 1 wanting 4 nodes. Job 1's
        // satellite on n2 used to be submitted at once, to pend behind it, and job 1
        // was charged when it did not start in time.
        for completing in [true, false] {
            let (mut cluster, cfg, _state) = four_nodes_one_held_core("");
            let mut old = gen::job(99, "elastic-sat", JobBase::Running);
            if completing {
                old.state = bftrainer_slurm::JobState(
                    bftrainer_slurm::JobState::from_base(JobBase::Cancelled).0 | 0x8000, /* JOB_COMPLETING */
                );
            }
            old.admin_comment = Some(satellite_tag(99));
            old.name = satellite_name(99);
            old.nodes = Some("n2".into());
            old.req_nodes = Some("n2".into());
            old.start_time = Some(0);
            cluster.jobs.insert(0, old);
            let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
            let on = |d: &Daemon<gen::GenCluster>, node: &str| {
                d.cluster
                    .jobs
                    .iter()
                    .any(|j| j.name == satellite_name(1) && j.req_nodes.as_deref() == Some(node))
            };
            let leaving = |d: &Daemon<gen::GenCluster>| {
                let j = d.cluster.jobs.iter().find(|j| j.job_id == 99).unwrap();
                j.state.is_active() || j.state.is_completing()
            };
            let mut now = 3_000_000_000.0;
            let mut grown = false;
            for _ in 0..20 {
                now += 1.0;
                d.cluster.start_pending_elastic(now as i64);
                d.cycle(now).unwrap();
                grown |=
                    leaving(&d) && ["n1", "n3", "n4"].iter().filter(|n| on(&d, n)).count() >= 2;
                let core_on_n2 = d.cluster.jobs.iter().any(|j| {
                    j.job_id == 1 && j.req_nodes.as_deref() == Some("n2") && j.priority != 0
                });
                assert!(
                    !leaving(&d) || !on(&d, "n2") && !core_on_n2,
                    "completing={completing}: a job placed on n2 while job 99 leaves it"
                );
            }
            assert!(
                grown,
                "completing={completing}: the other nodes are used while job 99 leaves n2"
            );
            if completing {
                // Slurm is done with n2.
                let old = d.cluster.jobs.iter_mut().find(|j| j.job_id == 99).unwrap();
                old.state = bftrainer_slurm::JobState::from_base(JobBase::Cancelled);
                d.cluster.dirty = true;
            }
            // bftrainerd cancels the leaving one after its grace; then job 1 grows there.
            for cycle in 0.. {
                assert!(
                    cycle < 120,
                    "completing={completing}: job 1 did not grow onto n2"
                );
                now += 1.0;
                d.cluster.start_pending_elastic(now as i64);
                d.cycle(now).unwrap();
                if on(&d, "n2") {
                    break;
                }
                assert!(!leaving(&d) || !on(&d, "n2"));
            }
            assert_eq!(d.stats.job_pauses, 0);
        }
    }

    #[test]
    fn a_regular_job_of_the_owner_waiting_on_its_limit_gets_the_satellites_back() {
        // Satellites count against the owner's MaxJobs; Slurm never preempts them for a
        // limit. A regular job of the same user waiting on AssocMaxJobsLimit: the
        // elastic job stops growing and gives its satellites back (its core stays).
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        let sats = |d: &Daemon<gen::GenCluster>| {
            d.cluster
                .jobs
                .iter()
                .filter(|j| j.name == satellite_name(1) && j.state.is_active())
                .count()
        };
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown onto 4 nodes");
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if sats(&d) == 3 && d.engine.job_nodes(0).len() == 4 {
                break;
            }
        }
        let mut regular = gen::job(51, "batch", JobBase::Pending);
        assert_eq!(regular.user_id, d.cluster.jobs[0].user_id, "the owner's");
        regular.reason = Some("AssocMaxJobsLimit".into());
        let rid = d.cluster.add_job(regular);
        d.cluster.dirty = true;
        for cycle in 0.. {
            assert!(cycle < 200, "satellites not given back: {} left", sats(&d));
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if sats(&d) == 0 {
                break;
            }
        }
        assert_eq!(d.engine.job_nodes(0).len(), 1, "the core stays");
        assert_eq!(d.stats.limit_pauses, 1);
        // It does not grow back while the regular job waits.
        for _ in 0..30 {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            assert_eq!(sats(&d), 0);
        }
        // The regular job runs (its limit now lets it): growth resumes.
        let r = d.cluster.jobs.iter_mut().find(|j| j.job_id == rid).unwrap();
        r.state = bftrainer_slurm::JobState::from_base(JobBase::Running);
        r.reason = None;
        r.nodes = None;
        d.cluster.dirty = true;
        for cycle in 0.. {
            assert!(cycle < 60, "growth did not resume");
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if sats(&d) == 3 {
                break;
            }
        }
        // Another user's job on its own limit changes nothing.
        let mut other = gen::job(52, "batch", JobBase::Pending);
        other.reason = Some("AssocMaxJobsLimit".into());
        assert_ne!(other.user_id, d.cluster.jobs[0].user_id);
        d.cluster.add_job(other);
        d.cluster.dirty = true;
        for _ in 0..10 {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        assert_eq!(sats(&d), 3);
        assert_eq!(d.stats.limit_pauses, 1);
    }

    #[test]
    fn a_second_satellite_on_a_node_is_ended_and_the_first_kept() {
        // Reconcile keeps one satellite per wanted node (keyed by engine node) and ends
        // any other of the same job there: the one later in the job table.
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        let running_sats = |d: &Daemon<gen::GenCluster>| -> Vec<(u32, String)> {
            d.cluster
                .jobs()
                .iter()
                .filter(|j| j.state.base() == JobBase::Running && j.name == satellite_name(1))
                .map(|j| (j.job_id, j.nodes.clone().unwrap_or_default()))
                .collect()
        };
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown onto 4 nodes: {:?}", running_sats(&d));
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if running_sats(&d).len() == 3 {
                break;
            }
        }
        let before = running_sats(&d);
        // A copy of the first satellite, on the same node, later in the table.
        let first = d
            .cluster
            .jobs
            .iter()
            .find(|j| j.job_id == before[0].0)
            .unwrap()
            .clone();
        let mut dup = first.clone();
        dup.job_id = 100_000;
        d.cluster.jobs.push(dup);
        d.cluster.dirty = true;
        for cycle in 0.. {
            assert!(cycle < 60, "duplicate not ended: {:?}", running_sats(&d));
            now += 1.0;
            d.cycle(now).unwrap();
            if !running_sats(&d).iter().any(|s| s.0 == 100_000) {
                break;
            }
        }
        assert_eq!(
            running_sats(&d),
            before,
            "the first satellite of the node and the others kept"
        );
    }

    /// A generated cluster for two daemons side by side: 48 nodes, most of them busy
    /// with regular jobs, regular jobs waiting (some planned by backfill, soon or
    /// later), and 8 held elastic cores of various sizes.
    fn side_by_side_cluster() -> gen::GenCluster {
        let names: Vec<String> = (1..=48).map(|i| format!("n{i:02}")).collect();
        let parts = ["batch", "elastic", "elastic-sat"];
        let mut nodes: Vec<Node> = names.iter().map(|n| gen::node(n.clone(), &parts)).collect();
        let partitions = vec![
            gen::partition("batch", &names, 10),
            gen::partition("elastic", &names, 2),
            gen::partition("elastic-sat", &names, 1),
        ];
        let mut jobs = Vec::new();
        let mut id = 1;
        // Regular jobs of 1-3 nodes on the first 30 nodes.
        let mut at = 0;
        while at < 30 {
            let k = 1 + (id as usize % 3).min(29 - at);
            let mut j = gen::job(id, "batch", JobBase::Running);
            j.nodes = Some(names[at..at + k].join(","));
            j.num_nodes = k as u32;
            j.start_time = Some(0);
            for n in &mut nodes[at..at + k] {
                n.state =
                    bftrainer_slurm::NodeState::from_base(bftrainer_slurm::NodeBase::Allocated);
            }
            jobs.push(j);
            id += 1;
            at += k;
        }
        for k in 0..8u32 {
            let mut j = gen::job(id, "elastic", JobBase::Pending);
            j.admin_comment = Some(format!("bftrainer:v1 1:{},role=core", 2 + k % 5));
            j.priority = 0;
            jobs.push(j);
            id += 1;
        }
        for k in 0..20u32 {
            let mut j = gen::job(id, "batch", JobBase::Pending);
            if k % 4 == 0 {
                let at = 30 + (k as usize * 3) % 15;
                j.sched_nodes = Some(names[at..at + 2].join(","));
                // Planned soon (within release_before) or in an hour.
                j.start_time = Some(if k % 8 == 0 {
                    3_000_000_030
                } else {
                    3_000_003_600
                });
            }
            jobs.push(j);
            id += 1;
        }
        gen::GenCluster::new(nodes, partitions, jobs)
    }

    /// What Slurm does between two polls, drawn from `rng`: released elastic jobs and
    /// satellites start, regular jobs end and start, a satellite is preempted, a core
    /// reports progress, is requeued by Slurm or cancelled, a new core is submitted.
    fn side_by_side_churn(c: &mut gen::GenCluster, rng: &mut rand_chacha::ChaCha8Rng, now: f64) {
        use bftrainer_slurm::{JobState, NodeBase, NodeState};
        use rand::Rng;
        let t = now as i64;
        c.start_pending_elastic(t);
        let set_nodes = |c: &mut gen::GenCluster, expr: &str, base: NodeBase| {
            for n in expr.split(',') {
                if let Some(nd) = c.node_mut(n) {
                    nd.state = NodeState::from_base(base);
                }
            }
        };
        let tagged = |j: &Job, role: &str| {
            j.admin_comment
                .as_deref()
                .is_some_and(|a| a.contains(&format!("role={role}")))
        };
        let running = |c: &gen::GenCluster, f: &dyn Fn(&Job) -> bool| -> Vec<usize> {
            (0..c.jobs.len())
                .filter(|&i| c.jobs[i].state.base() == JobBase::Running && f(&c.jobs[i]))
                .collect()
        };
        // Regular jobs end.
        let regular = running(c, &|j| j.partition.as_deref() == Some("batch"));
        for _ in 0..rng.gen_range(0..3) {
            if regular.is_empty() {
                break;
            }
            let i = regular[rng.gen_range(0..regular.len())];
            if c.jobs[i].state.base() != JobBase::Running {
                continue;
            }
            c.jobs[i].state = JobState::from_base(JobBase::Complete);
            c.jobs[i].end_time = Some(t);
            let e = c.jobs[i].nodes.clone().unwrap_or_default();
            set_nodes(c, &e, NodeBase::Idle);
        }
        // Regular jobs start on idle nodes (lent ones too: the elastic job is shrunk).
        let idle: Vec<String> = c
            .nodes
            .iter()
            .filter(|n| n.state.base() == NodeBase::Idle)
            .map(|n| n.name.clone())
            .collect();
        for _ in 0..rng.gen_range(0..3) {
            let Some(i) = c.jobs.iter().position(|j| {
                j.state.base() == JobBase::Pending && j.partition.as_deref() == Some("batch")
            }) else {
                break;
            };
            // A node held by one of ours, at times: Slurm preempts for it.
            let ours = running(c, &|j| tagged(j, "satellite"));
            let node = if !ours.is_empty() && rng.gen_bool(0.3) {
                let s = ours[rng.gen_range(0..ours.len())];
                c.jobs[s].preempt_time = Some(t);
                c.jobs[s].state = JobState::from_base(JobBase::Preempted);
                c.jobs[s].end_time = Some(t);
                c.jobs[s].nodes.clone().unwrap_or_default()
            } else if !idle.is_empty() {
                idle[rng.gen_range(0..idle.len())].clone()
            } else {
                break;
            };
            c.jobs[i].state = JobState::from_base(JobBase::Running);
            c.jobs[i].nodes = Some(node.clone());
            c.jobs[i].start_time = Some(t);
            set_nodes(c, &node, NodeBase::Allocated);
        }
        let cores = running(c, &|j| tagged(j, "core"));
        if !cores.is_empty() {
            let i = cores[rng.gen_range(0..cores.len())];
            match rng.gen_range(0..10) {
                // Progress in the Comment, as bft-run writes it.
                0..=4 => {
                    let rc = RunComment {
                        coord: "n01:4000".into(),
                        run: "ab12".into(),
                        start: c.jobs[i].start_time.unwrap_or(0),
                        gen: rng.gen_range(1..5),
                        nodes: rng.gen_range(1..4),
                        rate: f64::from(rng.gen_range(10u32..20)) * 10.0,
                        step: 0.5,
                        batch: 0,
                        done: false,
                        up: 0.0,
                        down: 0.0,
                    };
                    c.jobs[i].comment = Some(rc.to_string());
                }
                // Requeued by Slurm (a preemption of its core).
                5 => {
                    let j = &mut c.jobs[i];
                    j.state = JobState::from_base(JobBase::Pending);
                    j.restart_count += 1;
                    let e = j.nodes.take().unwrap_or_default();
                    set_nodes(c, &e, NodeBase::Idle);
                }
                // Cancelled by its owner.
                6 => {
                    let j = &mut c.jobs[i];
                    j.state = JobState::from_base(JobBase::Cancelled);
                    j.end_time = Some(t);
                    let e = j.nodes.clone().unwrap_or_default();
                    set_nodes(c, &e, NodeBase::Idle);
                }
                _ => {}
            }
        }
        if rng.gen_bool(0.1) {
            let mut j = gen::job(0, "elastic", JobBase::Pending);
            j.admin_comment = Some("bftrainer:v1 2:6,role=core".into());
            j.priority = 0;
            j.submit_time = Some(t);
            c.add_job(j);
        }
        c.dirty = true;
    }

    #[test]
    fn kept_copies_observe_and_decide_as_copies_made_afresh() {
        // Observe and reconcile keep their copies of the core jobs from one cycle to
        // the next and copy a record again only where the snapshot's differs, and
        // reconcile reads the tagged jobs observe found instead of the whole job table,
        // and observe keeps what the job table says of regular jobs while no table
        // changes.
        // Two daemons on the same cluster and the same changes between polls, one that
        // keeps what it can and one that drops its copies before every cycle and passes
        // over the job table in reconcile (everything made afresh, as every cycle did
        // before): the same journal, calls, counters and cluster, cycle by cycle.
        use rand::SeedableRng;
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut ds: Vec<Daemon<gen::GenCluster>> = dirs
            .iter()
            .map(|dir| {
                let cfg = test_config(dir.path(), "");
                let (journal, records) = journal::Journal::open(dir.path()).unwrap();
                let mut d =
                    Daemon::new(cfg, side_by_side_cluster(), Some(journal), &records).unwrap();
                d.still_clock = true;
                d
            })
            .collect();
        ds[1].afresh = true;
        let mut rngs = [
            rand_chacha::ChaCha8Rng::seed_from_u64(11),
            rand_chacha::ChaCha8Rng::seed_from_u64(11),
        ];
        let mut now = 3_000_000_000.0;
        let (mut kept, mut unchanged) = (0, 0);
        for cycle in 0..200 {
            now += 1.0;
            // Every fourth poll finds the cluster as the last one left it (unless the
            // daemon's own calls changed it): observe keeps what the job table says of
            // regular jobs.
            if cycle % 4 != 3 {
                for (d, rng) in ds.iter_mut().zip(&mut rngs) {
                    side_by_side_churn(&mut d.cluster, rng, now);
                }
            }
            kept += ds[0].observe_copies.len();
            ds[1].observe_copies.clear();
            ds[1].reconcile_copies.clear();
            for d in &mut ds {
                d.cycle(now).unwrap();
            }
            if !ds[0].tables_reloaded {
                unchanged += 1;
            }
            let (a, b) = (&ds[0], &ds[1]);
            let journal = |d: &Daemon<gen::GenCluster>| {
                std::fs::read_to_string(d.journal.as_ref().unwrap().path()).unwrap()
            };
            assert_eq!(
                (format!("{:?}", a.stats), format!("{:?}", a.cluster.calls)),
                (format!("{:?}", b.stats), format!("{:?}", b.cluster.calls)),
                "cycle {cycle}"
            );
            assert!(
                a.cluster.jobs == b.cluster.jobs,
                "cycle {cycle}: job tables differ"
            );
            assert!(
                a.cluster.nodes == b.cluster.nodes,
                "cycle {cycle}: node tables differ"
            );
            assert!(journal(a) == journal(b), "cycle {cycle}: journals differ");
        }
        // The run did what it is meant to check: copies kept across cycles, jobs
        // admitted, grown, shrunk, preempted and requeued.
        let s = &ds[0].stats;
        assert!(
            kept > 0 && unchanged > 0 && s.admits > 0 && s.grows > 0 && s.shrinks > 0,
            "{s:?}, {unchanged} polls unchanged"
        );
        assert!(s.preemptions > 0 && s.requeues > 0, "{s:?}");
    }

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
