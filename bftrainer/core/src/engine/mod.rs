//! The engine: one state machine for the daemon and the simulator. Events (observations
//! of the cluster, journaled) go in with the time; actions (admit, grow, shrink, requeue) come out.

mod event;
pub mod fair;

pub use event::{Action, ElasticSpec, Event, Lending, Record, EVENT_FORMAT_VERSION};

use crate::alloc::{BatchCurve, Curve, EfficiencyModel, Instance, JobInput, Options, Solution};
use crate::error::{Error, Result};
use crate::placement::{self, Needs, NodeAttrs};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, VecDeque};

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

#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// BFTrainer's forward-looking time Tfwd, seconds.
    pub t_fwd_s: f64,
    /// At most this many elastic jobs take part in allocation at once; later ones wait
    /// in submit order.
    pub max_jobs: usize,
    /// A job that was admitted, grown or shrunk less than this many seconds ago keeps
    /// its nodes in decisions (losses to regular jobs still apply). 0: no limit.
    pub min_rescale_interval_s: f64,
    /// A node is lent only after it has been idle this many seconds. 0: at once.
    pub lend_after_idle_s: f64,
    /// At most this many active jobs per user (`ElasticSpec::user`); a user at the cap
    /// does not hold back other users' queued jobs. 0: no cap.
    pub max_jobs_per_user: usize,
    /// At most this many nodes held by one user's jobs together; decisions give a
    /// user's jobs no more (their node ranges are cut to the user's budget). 0: no cap.
    pub max_nodes_per_user: u32,
    /// Fair shares (docs/design.md, "Fair shares"): curves are normalised to each job's
    /// speed-up against its own minimum, and each user's jobs together get at most the
    /// user's weighted max-min share of the lent nodes (`Event::UserWeight`); a job
    /// without a known user is a user of its own. Off: declared curves weigh against
    /// each other as they are (BFTrainer's objective alone).
    pub fair_share: bool,
    /// Floors of the rescale costs the allocator uses, seconds: a declared `up`/`down`
    /// below them counts as them (a rescale at least finishes a step and rebuilds the
    /// process group), as does a measured one (`Event::RescaleCost`) above them.
    pub min_scale_up_s: f64,
    pub min_scale_down_s: f64,
    /// Ceilings of a *measured* rescale cost, seconds (`fair::rescale_cost`): the
    /// measurement is the owner's word (bft-run's Comment), and a cost inflated without
    /// bound would keep the job from ever being shrunk within its user's share.
    pub max_scale_up_s: f64,
    pub max_scale_down_s: f64,
}

/// bftrainerd's default floors of the rescale costs (`EngineConfig::min_scale_up_s`,
/// `_down_s`; `[engine] min_scale_up`, `min_scale_down`). The engine's own default is no
/// floor, so that a simulation or test states the costs it models.
pub const DEFAULT_MIN_SCALE_UP_S: f64 = 10.0;
pub const DEFAULT_MIN_SCALE_DOWN_S: f64 = 5.0;
/// bftrainerd's default ceilings of a measured rescale cost (`[engine] max_scale_up`,
/// `max_scale_down`); the engine's own default too.
pub const DEFAULT_MAX_SCALE_UP_S: f64 = 300.0;
pub const DEFAULT_MAX_SCALE_DOWN_S: f64 = 120.0;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            t_fwd_s: 10.0,
            max_jobs: 10,
            min_rescale_interval_s: 0.0,
            lend_after_idle_s: 0.0,
            max_jobs_per_user: 0,
            max_nodes_per_user: 0,
            fair_share: true,
            min_scale_up_s: 0.0,
            min_scale_down_s: 0.0,
            max_scale_up_s: DEFAULT_MAX_SCALE_UP_S,
            max_scale_down_s: DEFAULT_MAX_SCALE_DOWN_S,
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
        for (name, v) in [
            ("min-rescale-interval", self.min_rescale_interval_s),
            ("lend-after-idle", self.lend_after_idle_s),
            ("min-scale-up", self.min_scale_up_s),
            ("min-scale-down", self.min_scale_down_s),
            ("max-scale-up", self.max_scale_up_s),
            ("max-scale-down", self.max_scale_down_s),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{name} must be >= 0 seconds, found {v}"));
            }
        }
        for (dir, floor, ceiling) in [
            ("up", self.min_scale_up_s, self.max_scale_up_s),
            ("down", self.min_scale_down_s, self.max_scale_down_s),
        ] {
            if ceiling < floor {
                return Err(format!(
                    "max-scale-{dir} ({ceiling} s) must be >= min-scale-{dir} ({floor} s)"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Declared but not (yet) reported idle, or taken by a regular job.
    Busy,
    Idle,
    Held(JobId),
    /// Down or removed.
    Lost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// When the node last became idle (for `lend_after_idle_s`).
    idle_since: f64,
    /// Position in the last decision's view of the pool, or NONE.
    vpos: u32,
    /// What it offers (`Event::NodeAttrs`); `None`: serves every job.
    attrs: Option<Box<NodeAttrs>>,
    /// For a GPU-slot unit (`host/gpuK`), its host in `Engine::hosts`; NONE for a
    /// whole node.
    host: u32,
}

struct JobSlot {
    spec: ElasticSpec,
    status: JobStatus,
    nodes: Vec<NodeId>,
    measured_rate: Option<f64>,
    /// Measured rates by size (nodes, samples/s), sorted by size: they replace the
    /// declared curve there (`fair::effective_curve`).
    measured: Vec<(u32, f64)>,
    /// Measured rescale costs, seconds (`Event::RescaleCost`; 0: not measured).
    measured_up_s: f64,
    measured_down_s: f64,
    /// The global batches the allocator may choose from (`Event::BatchRange`).
    batch_range: Option<(u32, u32)>,
    /// The global batch the job runs at, at which `measured` was taken (`Event::JobBatch`).
    batch_now: Option<u32>,
    /// The batch the last decision chose for it (with a range and a known `batch_now`).
    decided_batch: Option<u32>,
    /// `measured` or the measured costs changed since the job's curve and costs were
    /// last given to the allocator.
    curve_stale: bool,
    remaining: Option<f64>,
    /// The core allocation, which decisions take last (only by a requeue): the first
    /// `min_nodes` nodes of its admission, a lost one replaced from its other nodes
    /// (`refill_anchors`).
    anchors: Vec<NodeId>,
    /// When the job was last admitted, grown or shrunk by a decision.
    last_rescale: Option<f64>,
    /// Takes part in the current decision (not inside its rescale interval).
    in_decision: bool,
    /// Sits decisions out until then (`Event::JobPaused`).
    paused_until: Option<f64>,
    /// The most nodes the current decision may give it (`max_nodes`, or less under
    /// its user's node cap).
    budget: u32,
    /// What it asks of each node (`Event::JobNeeds`), and that compiled.
    needs: Option<Box<(Needs, placement::Compiled)>>,
}

/// The engine's jobs by id. A finished or cancelled job may be forgotten
/// ([`Engine::forget_job`]): its slot is freed and only its status kept, and the
/// forgotten jobs below every live one are dropped altogether, so that a replay that
/// submits jobs for years holds about the live ones only.
#[derive(Default)]
struct Jobs {
    /// Jobs from id `base` on.
    slots: VecDeque<Entry>,
    base: usize,
    /// Dropped jobs (ids below `base`) that were cancelled; the others finished.
    cancelled: std::collections::BTreeSet<usize>,
}

enum Entry {
    Live(Box<JobSlot>),
    Forgotten(JobStatus),
}

impl Jobs {
    fn len(&self) -> usize {
        self.base + self.slots.len()
    }

    fn push(&mut self, slot: JobSlot) {
        self.slots.push_back(Entry::Live(Box::new(slot)));
    }

    fn entry(&self, j: usize) -> Option<&Entry> {
        j.checked_sub(self.base).and_then(|k| self.slots.get(k))
    }

    /// The job's slot; `None` for an unknown or forgotten job.
    fn get(&self, j: usize) -> Option<&JobSlot> {
        match self.entry(j) {
            Some(Entry::Live(s)) => Some(s),
            _ => None,
        }
    }

    fn status(&self, j: usize) -> JobStatus {
        match self.entry(j) {
            Some(Entry::Live(s)) => s.status,
            Some(Entry::Forgotten(st)) => *st,
            None if j < self.base && self.cancelled.contains(&j) => JobStatus::Cancelled,
            None if j < self.base => JobStatus::Finished,
            None => panic!("unknown job {j}"),
        }
    }

    /// Forgets a finished or cancelled job; false for a live or unknown one.
    fn forget(&mut self, j: usize) -> bool {
        let Some(k) = j.checked_sub(self.base) else {
            return false;
        };
        match self.slots.get(k) {
            Some(Entry::Live(s))
                if matches!(s.status, JobStatus::Finished | JobStatus::Cancelled) =>
            {
                self.slots[k] = Entry::Forgotten(s.status);
            }
            _ => return false,
        }
        while let Some(Entry::Forgotten(st)) = self.slots.front() {
            if *st == JobStatus::Cancelled {
                self.cancelled.insert(self.base);
            }
            self.slots.pop_front();
            self.base += 1;
        }
        true
    }
}

impl std::ops::Index<usize> for Jobs {
    type Output = JobSlot;
    fn index(&self, j: usize) -> &JobSlot {
        match self.entry(j) {
            Some(Entry::Live(s)) => s,
            _ => panic!("job {j} is unknown or forgotten"),
        }
    }
}

impl std::ops::IndexMut<usize> for Jobs {
    fn index_mut(&mut self, j: usize) -> &mut JobSlot {
        let k = j.checked_sub(self.base);
        match k.and_then(|k| self.slots.get_mut(k)) {
            Some(Entry::Live(s)) => s,
            _ => panic!("job {j} is unknown or forgotten"),
        }
    }
}

/// Counters of the engine's own work.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub decisions: u64,
    /// Decisions where the allocator gave no proven answer and the allocation was kept.
    pub kept: u64,
    /// Decisions refused (an allocator error or an answer that breaks its contract):
    /// nothing of them was applied.
    pub refused: u64,
    /// `Event::Decided` actions applied at a restore, and those skipped because they
    /// did not fit the state (each with a warning, `Engine::take_warnings`).
    pub restored_actions: u64,
    pub skipped_actions: u64,
}

/// The engine's state, without what each decision derives again (the allocator's
/// instance, the pool's view): what a restore must rebuild, and what a journal
/// snapshot holds. Two engines in the same state compare equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    /// The time of the last event.
    pub t: Option<f64>,
    pub lending: Lending,
    pub nodes: Vec<NodeSnap>,
    /// Nodes open to elastic jobs, in the engine's order.
    pub pool: Vec<NodeId>,
    /// Jobs below this id are dropped (finished, or cancelled when in `cancelled`).
    pub jobs_base: usize,
    pub cancelled: Vec<usize>,
    /// Jobs from `jobs_base` on.
    pub jobs: Vec<JobSnap>,
    /// Queued jobs in admission order.
    pub queue: Vec<JobId>,
    /// Active jobs in admission order.
    pub active: Vec<JobId>,
    /// Users' share weights (`Event::UserWeight`), by uid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_weights: Vec<(u32, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSnap {
    pub state: NodeState,
    pub reclaim_at: Option<f64>,
    pub idle_since: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attrs: Option<NodeAttrs>,
    /// The host of a GPU-slot unit (`host/gpuK`); absent for a whole node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

// A snapshot is written once per dump and read once per start: boxing the live
// variant would only add an allocation per job there.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobSnap {
    Live {
        spec: ElasticSpec,
        status: JobStatus,
        nodes: Vec<NodeId>,
        anchors: Vec<NodeId>,
        measured_rate: Option<f64>,
        remaining: Option<f64>,
        last_rescale: Option<f64>,
        paused_until: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        needs: Option<Needs>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        measured: Vec<(u32, f64)>,
        #[serde(default, skip_serializing_if = "is_zero")]
        measured_up_s: f64,
        #[serde(default, skip_serializing_if = "is_zero")]
        measured_down_s: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_range: Option<(u32, u32)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_now: Option<u32>,
    },
    Forgotten {
        status: JobStatus,
    },
}

/// How the engine treats `Tick` and `Event::Decided`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Ticks decide (the allocator runs); `Decided` records are ignored.
    #[default]
    Live,
    /// Rebuilding from a journal: Ticks decide nothing and `Decided` records are
    /// applied as they were decided, whatever the config or allocator is now; an action
    /// that does not fit the state is skipped with a warning. Leaving this mode makes
    /// the next `Tick` decide under the current config.
    Restore,
}

pub struct Engine<A> {
    cfg: EngineConfig,
    alloc: A,
    nodes: Vec<NodeSlot>,
    /// Nodes open to elastic jobs: idle or held. `inst.nodes[i]` describes `pool[i]`.
    pool: Vec<NodeId>,
    inst: Instance,
    jobs: Jobs,
    /// Queued jobs in admission order: higher priority first, then submit order.
    queue: BTreeSet<(Reverse<u32>, JobId)>,
    active: Vec<JobId>,
    /// `inst.jobs` no longer matches `active`.
    active_changed: bool,
    /// Something changed since the last decision.
    dirty: bool,
    mark: Vec<u32>,
    /// Nodes with a reclaim forecast.
    forecasts: usize,
    /// Nodes whose attributes mark them GPU slots (`NodeAttrs::gpu_slot`): while there
    /// are some, jobs without needs are placed too (slots serve only GPU jobs).
    gpu_slots: usize,
    /// The time of the last event: events come in time order.
    last_t: Option<f64>,
    /// The pool as the last decision saw it: without nodes idle for less than
    /// `lend_after_idle_s` and without the nodes of jobs inside `min_rescale_interval_s`.
    view: Vec<NodeId>,
    /// Jobs of the last decision's instance, in `inst.jobs` order.
    deciding: Vec<JobId>,
    /// The earliest time a waiting node or job becomes usable: re-decide then.
    wake_at: Option<f64>,
    /// Whether nodes are lent (`Event::Lending`).
    lending: Lending,
    mode: Mode,
    /// Jobs the last `Tick` took from the queue into allocation (`Event::Decided`).
    activated: Vec<JobId>,
    /// Restore warnings not yet taken (`take_warnings`).
    warnings: Vec<String>,
    /// Hosts of GPU-slot units, by number (`NodeSlot::host`), and their numbers.
    hosts: Vec<String>,
    host_ids: std::collections::HashMap<String, u32>,
    /// GPU-slot units declared: when none, the allocator sees no hosts.
    slot_units: usize,
    /// Users' share weights (`Event::UserWeight`); absent: 1.
    user_weights: HashMap<u32, f64>,
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
                host_of: Vec::new(),
                jobs: Vec::new(),
            },
            jobs: Jobs::default(),
            queue: BTreeSet::new(),
            active: Vec::new(),
            active_changed: false,
            dirty: false,
            mark: Vec::new(),
            forecasts: 0,
            gpu_slots: 0,
            last_t: None,
            view: Vec::new(),
            deciding: Vec::new(),
            wake_at: None,
            lending: Lending::Open,
            mode: Mode::Live,
            activated: Vec::new(),
            warnings: Vec::new(),
            hosts: Vec::new(),
            host_ids: std::collections::HashMap::new(),
            slot_units: 0,
            user_weights: HashMap::new(),
            stats: EngineStats::default(),
        }
    }

    /// The number of host `h` of a GPU-slot unit, numbered on first sight.
    fn intern_host(&mut self, h: &str) -> u32 {
        self.slot_units += 1;
        if let Some(&k) = self.host_ids.get(h) {
            return k;
        }
        let k = self.hosts.len() as u32;
        self.hosts.push(h.to_string());
        self.host_ids.insert(h.to_string(), k);
        k
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Enters or leaves `Mode::Restore`. Leaving it marks the state changed, so the
    /// next `Tick` decides under the current config (the allocator's caches are rebuilt).
    pub fn set_mode(&mut self, mode: Mode) {
        if self.mode == Mode::Restore && mode == Mode::Live {
            self.dirty = true;
            self.active_changed = true;
            self.deciding.clear();
        }
        self.mode = mode;
    }

    /// The jobs the last `Tick` took from the queue into allocation, in that order;
    /// with its actions they make the `Event::Decided` a journal keeps after the Tick.
    /// Emptied by the call and at the next `Tick`.
    pub fn take_activated(&mut self) -> Vec<JobId> {
        std::mem::take(&mut self.activated)
    }

    /// The engine's state (for comparisons and snapshots).
    pub fn state(&self) -> EngineState {
        EngineState {
            t: self.last_t,
            lending: self.lending,
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeSnap {
                    state: n.state,
                    reclaim_at: n.reclaim_at,
                    idle_since: n.idle_since,
                    attrs: n.attrs.as_deref().cloned(),
                    host: (n.host != NONE).then(|| self.hosts[n.host as usize].clone()),
                })
                .collect(),
            pool: self.pool.clone(),
            jobs_base: self.jobs.base,
            cancelled: self.jobs.cancelled.iter().copied().collect(),
            jobs: self
                .jobs
                .slots
                .iter()
                .map(|e| match e {
                    Entry::Live(s) => JobSnap::Live {
                        spec: s.spec.clone(),
                        status: s.status,
                        nodes: s.nodes.clone(),
                        anchors: s.anchors.clone(),
                        measured_rate: s.measured_rate,
                        remaining: s.remaining,
                        last_rescale: s.last_rescale,
                        paused_until: s.paused_until,
                        needs: s.needs.as_ref().map(|n| n.0.clone()),
                        measured: s.measured.clone(),
                        measured_up_s: s.measured_up_s,
                        measured_down_s: s.measured_down_s,
                        batch_range: s.batch_range,
                        batch_now: s.batch_now,
                    },
                    Entry::Forgotten(st) => JobSnap::Forgotten { status: *st },
                })
                .collect(),
            queue: self.queue().collect(),
            active: self.active.clone(),
            user_weights: {
                let mut w: Vec<(u32, f64)> =
                    self.user_weights.iter().map(|(&u, &w)| (u, w)).collect();
                w.sort_by_key(|x| x.0);
                w
            },
        }
    }

    /// Replaces the whole state with `st` (an `Event::Snapshot`), after checking that
    /// it holds together; on an error nothing is changed.
    pub fn load_state(&mut self, st: &EngineState) -> std::result::Result<(), String> {
        let n_nodes = st.nodes.len();
        let live = |j: JobId| match (j as usize)
            .checked_sub(st.jobs_base)
            .and_then(|k| st.jobs.get(k))
        {
            Some(JobSnap::Live { status, nodes, .. }) => Some((*status, nodes)),
            _ => None,
        };
        let mut pos = vec![NONE; n_nodes];
        for (i, &n) in st.pool.iter().enumerate() {
            match pos.get_mut(n as usize) {
                Some(p) if *p == NONE => *p = i as u32,
                _ => return Err(format!("pool node {n} unknown or listed twice")),
            }
        }
        for (n, ns) in st.nodes.iter().enumerate() {
            let open = matches!(ns.state, NodeState::Idle | NodeState::Held(_));
            if open != (pos[n] != NONE) {
                return Err(format!(
                    "node {n} is {:?} but {}in the pool",
                    ns.state,
                    if open { "not " } else { "" }
                ));
            }
            if let NodeState::Held(j) = ns.state {
                if !live(j).is_some_and(|(_, nodes)| nodes.contains(&(n as NodeId))) {
                    return Err(format!("node {n} held by job {j}, which does not hold it"));
                }
            }
        }
        for (k, js) in st.jobs.iter().enumerate() {
            if let JobSnap::Live { nodes, anchors, .. } = js {
                let j = (st.jobs_base + k) as NodeId;
                for &n in nodes {
                    if st.nodes.get(n as usize).map(|x| x.state) != Some(NodeState::Held(j)) {
                        return Err(format!("job {j} holds node {n}, which is not held by it"));
                    }
                }
                if !anchors.iter().all(|a| nodes.contains(a)) {
                    return Err(format!("job {j} has anchors it does not hold"));
                }
            }
        }
        for (list, want) in [
            (&st.queue, JobStatus::Queued),
            (&st.active, JobStatus::Active),
        ] {
            for &j in list.iter() {
                if live(j).map(|x| x.0) != Some(want) {
                    return Err(format!("job {j} listed as {want:?} but it is not"));
                }
            }
        }
        let statuses = st.jobs.iter().filter_map(|js| match js {
            JobSnap::Live { status, .. } => Some(*status),
            _ => None,
        });
        let (q, a) = statuses.fold((0, 0), |(q, a), s| match s {
            JobStatus::Queued => (q + 1, a),
            JobStatus::Active => (q, a + 1),
            _ => (q, a),
        });
        if q != st.queue.len() || a != st.active.len() {
            return Err("queued or active jobs missing from their lists".into());
        }
        self.hosts.clear();
        self.host_ids.clear();
        self.slot_units = 0;
        let mut nodes = Vec::with_capacity(st.nodes.len());
        for (ns, pos) in st.nodes.iter().zip(pos) {
            let host = match &ns.host {
                Some(h) => self.intern_host(h),
                None => NONE,
            };
            nodes.push(NodeSlot {
                state: ns.state,
                reclaim_at: ns.reclaim_at,
                pos,
                idle_since: ns.idle_since,
                vpos: NONE,
                attrs: ns.attrs.clone().map(Box::new),
                host,
            });
        }
        self.nodes = nodes;
        self.forecasts = st.nodes.iter().filter(|n| n.reclaim_at.is_some()).count();
        self.gpu_slots = self.nodes.iter().filter(|n| is_gpu_slot(n)).count();
        self.pool = st.pool.clone();
        self.jobs = Jobs {
            slots: st
                .jobs
                .iter()
                .map(|js| match js {
                    JobSnap::Live {
                        spec,
                        status,
                        nodes,
                        anchors,
                        measured_rate,
                        remaining,
                        last_rescale,
                        paused_until,
                        needs,
                        measured,
                        measured_up_s,
                        measured_down_s,
                        batch_range,
                        batch_now,
                    } => Entry::Live(Box::new(JobSlot {
                        batch_range: *batch_range,
                        batch_now: *batch_now,
                        decided_batch: None,
                        spec: spec.clone(),
                        status: *status,
                        nodes: nodes.clone(),
                        measured_rate: *measured_rate,
                        measured: measured.clone(),
                        measured_up_s: *measured_up_s,
                        measured_down_s: *measured_down_s,
                        curve_stale: false,
                        remaining: *remaining,
                        anchors: anchors.clone(),
                        last_rescale: *last_rescale,
                        in_decision: false,
                        paused_until: *paused_until,
                        budget: spec.max_nodes,
                        needs: needs.as_ref().map(|n| Box::new((n.clone(), n.compile()))),
                    })),
                    JobSnap::Forgotten { status } => Entry::Forgotten(*status),
                })
                .collect(),
            base: st.jobs_base,
            cancelled: st.cancelled.iter().copied().collect(),
        };
        self.queue = st
            .queue
            .iter()
            .map(|&j| (Reverse(self.jobs[j as usize].spec.priority), j))
            .collect();
        self.active = st.active.clone();
        self.lending = st.lending;
        self.user_weights = st.user_weights.iter().copied().collect();
        self.last_t = st.t;
        self.view.clear();
        self.deciding.clear();
        self.inst.jobs.clear();
        self.active_changed = true;
        self.dirty = true;
        self.wake_at = None;
        self.activated.clear();
        Ok(())
    }

    /// Warnings of the restore (`Decided` actions that did not fit), emptied by the call.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Replaces the settings (bftrainerd's SIGHUP); the next `Tick` re-decides with them.
    /// The caller validates `cfg` first.
    pub fn set_config(&mut self, cfg: EngineConfig) {
        self.inst.t_fwd_s = cfg.t_fwd_s;
        self.cfg = cfg;
        // Curves and rescale floors depend on the settings.
        self.active_changed = true;
        self.dirty = true;
    }

    /// The nodes the job's core allocation holds: `min_nodes` nodes it holds (the first
    /// of its admission; one lost is replaced by another of its nodes), or those left
    /// while a loss leaves it below `min_nodes` (until the next decision grows it back
    /// or requeues it); empty when it holds none. Decisions shrink these last.
    pub fn job_anchors(&self, j: JobId) -> &[NodeId] {
        &self.jobs[j as usize].anchors
    }

    /// Number of declared nodes and jobs.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn n_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// The earliest time at which a `Tick` will re-decide although nothing was
    /// observed (a node's idle wait or a job's rescale interval ends).
    pub fn wake_at(&self) -> Option<f64> {
        self.wake_at
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
        self.jobs.status(j as usize)
    }

    /// Frees a finished or cancelled job's slot, keeping its status: afterwards only
    /// [`Engine::job_status`] may be asked about it, and an event naming it is refused.
    /// Returns false (and forgets nothing) for a job still queued or active.
    pub fn forget_job(&mut self, j: JobId) -> bool {
        self.jobs.forget(j as usize)
    }

    /// What node `n` offers, as the last `Event::NodeAttrs` said.
    pub fn node_attrs(&self, n: NodeId) -> Option<&NodeAttrs> {
        self.nodes.get(n as usize).and_then(|s| s.attrs.as_deref())
    }

    /// What job `j` asks of each node, as the last `Event::JobNeeds` said.
    pub fn job_needs(&self, j: JobId) -> Option<&Needs> {
        self.jobs
            .get(j as usize)
            .and_then(|s| s.needs.as_ref())
            .map(|b| &b.0)
    }

    pub fn job_spec(&self, j: JobId) -> &ElasticSpec {
        &self.jobs[j as usize].spec
    }

    /// The share weight last given for `user` (`Event::UserWeight`).
    pub fn user_weight(&self, user: u32) -> Option<f64> {
        self.user_weights.get(&user).copied()
    }

    pub fn measured_rate(&self, j: JobId) -> Option<f64> {
        self.jobs[j as usize].measured_rate
    }

    /// The global batch the last decision chose for a job with a batch range
    /// (`Event::BatchRange`) whose rate was measured at a known batch (`Event::JobBatch`);
    /// `None` before that, and for other jobs.
    pub fn decided_batch(&self, j: JobId) -> Option<u32> {
        let s = &self.jobs[j as usize];
        s.batch_range.and(s.decided_batch)
    }

    /// The job's batch range and the batch it runs at (`Event::BatchRange`, `JobBatch`).
    pub fn job_batch(&self, j: JobId) -> (Option<(u32, u32)>, Option<u32>) {
        let s = &self.jobs[j as usize];
        (s.batch_range, s.batch_now)
    }

    /// Jobs taking part in allocation, in admission order.
    pub fn active(&self) -> &[JobId] {
        &self.active
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Queued jobs in admission order (priority, then submit order).
    pub fn queue(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queue.iter().map(|&(_, j)| j)
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
        self.jobs.get(j as usize).ok_or_else(|| {
            let what = if (j as usize) < self.jobs.len() {
                "forgotten"
            } else {
                "unknown"
            };
            Self::err(now, format!("{what} job {j}"))
        })
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
                let job = &mut self.jobs[j as usize];
                if let Some(i) = job.nodes.iter().position(|&x| x == n) {
                    job.nodes.swap_remove(i);
                }
                job.anchors.retain(|&x| x != n);
                self.refill_anchors(j);
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

    fn release_job(&mut self, j: JobId, status: JobStatus, now: f64) {
        let nodes = std::mem::take(&mut self.jobs[j as usize].nodes);
        self.jobs[j as usize].anchors.clear();
        for n in nodes {
            self.nodes[n as usize].state = NodeState::Idle;
            self.nodes[n as usize].idle_since = now;
        }
        let job = &mut self.jobs[j as usize];
        let was = std::mem::replace(&mut job.status, status);
        match was {
            JobStatus::Active => {
                self.active.retain(|&x| x != j);
                self.active_changed = true;
            }
            JobStatus::Queued => {
                let p = self.jobs[j as usize].spec.priority;
                self.queue.remove(&(Reverse(p), j));
            }
            _ => {}
        }
        self.dirty = true;
    }

    /// Applies one event at time `now` (seconds; Unix time in replays). Observations
    /// return no actions; `Event::Tick` runs a decision when anything changed.
    pub fn on_event(&mut self, event: &Event, now: f64) -> Result<Vec<Action>> {
        if !now.is_finite() {
            return Err(Self::err(now, format!("time {now} is not a finite number")));
        }
        if let Some(last) = self.last_t {
            if now < last {
                return Err(Self::err(
                    now,
                    format!("time {now} is earlier than the previous event's {last}: events come in time order"),
                ));
            }
        }
        self.last_t = Some(now);
        match event {
            Event::NodeAdded { node, name } => {
                if *node as usize != self.nodes.len() {
                    return Err(Self::err(
                        now,
                        format!(
                            "node {node} declared out of order: next id is {}",
                            self.nodes.len()
                        ),
                    ));
                }
                let host = if name.contains('/') {
                    self.intern_host(crate::placement::slot_host(name))
                } else {
                    NONE
                };
                self.nodes.push(NodeSlot {
                    state: NodeState::Busy,
                    reclaim_at: None,
                    pos: NONE,
                    idle_since: now,
                    vpos: NONE,
                    attrs: None,
                    host,
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
                    self.nodes[*node as usize].idle_since = now;
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
                    batch_range: None,
                    batch_now: None,
                    decided_batch: None,
                    spec: spec.clone(),
                    status: JobStatus::Queued,
                    nodes: Vec::new(),
                    measured_rate: None,
                    measured: Vec::new(),
                    measured_up_s: 0.0,
                    measured_down_s: 0.0,
                    curve_stale: false,
                    remaining: None,
                    anchors: Vec::new(),
                    last_rescale: None,
                    in_decision: false,
                    paused_until: None,
                    budget: spec.max_nodes,
                    needs: None,
                });
                self.queue.insert((Reverse(spec.priority), *job));
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
                self.release_job(*job, JobStatus::Finished, now);
            }
            Event::JobCancelled { job } => {
                self.job(*job, now)?;
                self.release_job(*job, JobStatus::Cancelled, now);
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
                    self.nodes[*node as usize].idle_since = now;
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
                nodes,
            } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                slot.measured_rate = Some(*samples_per_s);
                // A rate is a point of the job's curve at the size it was measured on;
                // a bad one (not finite, negative, or at a size outside the job's own
                // range: the size comes from the owner's Comment) is no measurement, so
                // a job keeps at most `max - min + 1` points.
                let n = nodes.unwrap_or(slot.nodes.len() as u32);
                let r = *samples_per_s;
                let in_range = (slot.spec.min_nodes..=slot.spec.max_nodes).contains(&n);
                if in_range && r.is_finite() && r >= 0.0 {
                    match slot.measured.binary_search_by_key(&n, |m| m.0) {
                        Ok(i) if slot.measured[i].1 == r => {}
                        Ok(i) => {
                            slot.measured[i].1 = r;
                            slot.curve_stale = true;
                            self.dirty = true;
                        }
                        Err(i) => {
                            slot.measured.insert(i, (n, r));
                            slot.curve_stale = true;
                            self.dirty = true;
                        }
                    }
                }
                let slot = &mut self.jobs[*job as usize];
                if slot.remaining != *remaining {
                    slot.remaining = *remaining;
                    self.dirty = true;
                }
            }
            Event::RescaleCost { job, up_s, down_s } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                // The owner's word, through bft-run's Comment: a bad value (not finite,
                // negative) is no measurement; the ceilings apply where it is used.
                let ok = |v: f64| if v.is_finite() && v >= 0.0 { v } else { 0.0 };
                let (up, down) = (ok(*up_s), ok(*down_s));
                if (slot.measured_up_s, slot.measured_down_s) != (up, down) {
                    slot.measured_up_s = up;
                    slot.measured_down_s = down;
                    slot.curve_stale = true;
                    self.dirty = true;
                }
            }
            Event::Tick => {
                self.activated.clear();
                if self.mode == Mode::Restore {
                    return Ok(Vec::new());
                }
                return self.decide(now);
            }
            Event::Decided { activated, actions } => {
                if self.mode == Mode::Restore {
                    return Ok(self.restore_decision(activated, actions, now));
                }
            }
            Event::JobForgotten { job } => {
                if *job as usize >= self.jobs.len() {
                    return Err(Self::err(now, format!("unknown job {job}")));
                }
                let st = self.jobs.status(*job as usize);
                if matches!(st, JobStatus::Queued | JobStatus::Active) {
                    return Err(Self::err(
                        now,
                        format!("job {job} cannot be forgotten: it is {st:?}"),
                    ));
                }
                self.jobs.forget(*job as usize);
            }
            Event::Snapshot { state, .. } => {
                self.load_state(state)
                    .map_err(|m| Self::err(now, format!("snapshot: {m}")))?;
            }
            Event::NodeAttrs { node, attrs } => {
                self.node(*node, now)?;
                let slot = &mut self.nodes[*node as usize];
                if slot.attrs.as_deref() != Some(attrs) {
                    let was = is_gpu_slot(slot);
                    slot.attrs = Some(Box::new(attrs.clone()));
                    self.gpu_slots =
                        self.gpu_slots + usize::from(attrs.gpu_slot) - usize::from(was);
                    self.dirty = true;
                }
            }
            Event::JobNeeds { job, needs } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                let new = (!needs.is_empty()).then(|| Box::new((needs.clone(), needs.compile())));
                if slot.needs.as_ref().map(|n| &n.0) != new.as_ref().map(|n| &n.0) {
                    slot.needs = new;
                    self.dirty = true;
                }
            }
            Event::BatchRange { job, range } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                // A range from the owner's tag, checked there; an empty one is none.
                let range = range.filter(|&(lo, hi)| lo >= 1 && lo <= hi);
                if slot.batch_range != range {
                    slot.batch_range = range;
                    slot.decided_batch = None;
                    slot.curve_stale = true;
                    self.dirty = true;
                }
            }
            Event::JobBatch { job, batch } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                if *batch >= 1 && slot.batch_now != Some(*batch) {
                    // Rates measured at another batch are not this batch's: each becomes
                    // what the model predicts at the new batch (from the whole curve
                    // they were part of), until the new batch's own rate replaces it.
                    if let (Some(old), false) = (slot.batch_now, slot.measured.is_empty()) {
                        let s = &slot.spec;
                        let curve = fair::effective_curve(&s.objective, &slot.measured, 1, false);
                        let model = EfficiencyModel::new(old);
                        for m in &mut slot.measured {
                            m.1 = model.throughput(&curve, m.0, *batch);
                        }
                    }
                    slot.batch_now = Some(*batch);
                    slot.curve_stale = true;
                    self.dirty = true;
                }
            }
            Event::JobPriority { job, priority } => {
                let st = self.job(*job, now)?.status;
                let slot = &mut self.jobs[*job as usize];
                let old = std::mem::replace(&mut slot.spec.priority, *priority);
                if old != *priority {
                    if self.queue.remove(&(Reverse(old), *job)) {
                        self.queue.insert((Reverse(*priority), *job));
                    }
                    // Orders the per-user node budgets of active jobs.
                    if st == JobStatus::Active
                        && (self.cfg.max_nodes_per_user > 0 || self.cfg.fair_share)
                    {
                        self.dirty = true;
                    }
                }
            }
            Event::Lending { mode } => {
                if *mode != self.lending {
                    self.lending = *mode;
                    self.dirty = true;
                }
            }
            Event::UserWeight { user, weight } => {
                if !weight.is_finite() || *weight < 0.0 {
                    return Err(Self::err(
                        now,
                        format!("user {user}: weight {weight} must be a finite number >= 0"),
                    ));
                }
                if self.user_weights.insert(*user, *weight) != Some(*weight) && self.cfg.fair_share
                {
                    self.dirty = true;
                }
            }
            Event::JobPaused { job, until } => {
                self.job(*job, now)?;
                let slot = &mut self.jobs[*job as usize];
                if slot.paused_until != *until {
                    slot.paused_until = *until;
                    self.dirty = true;
                }
            }
        }
        Ok(Vec::new())
    }

    /// Whether nodes are lent, as the last `Event::Lending` set it (open by default).
    pub fn lending(&self) -> Lending {
        self.lending
    }

    /// Keeps a job's anchors (its core allocation) at `min_nodes` real nodes it holds:
    /// those it has, topped up from its other nodes in the order it got them. A job
    /// holding fewer than `min_nodes` keeps what it has; the next decision grows it back
    /// to its minimum or requeues it.
    fn refill_anchors(&mut self, j: JobId) {
        let job = &mut self.jobs[j as usize];
        let min = job.spec.min_nodes as usize;
        let JobSlot { nodes, anchors, .. } = job;
        anchors.retain(|a| nodes.contains(a));
        if nodes.len() < min {
            return;
        }
        for &n in nodes.iter() {
            if anchors.len() >= min {
                break;
            }
            if !anchors.contains(&n) {
                anchors.push(n);
            }
        }
        anchors.truncate(min);
    }

    /// Of `jobs`, those holding some nodes but fewer than their minimum (a loss left
    /// them there): they cannot run as they are and are requeued.
    fn below_min(&self, jobs: &[JobId]) -> Vec<JobId> {
        jobs.iter()
            .copied()
            .filter(|&j| {
                let job = &self.jobs[j as usize];
                !job.nodes.is_empty() && job.nodes.len() < job.spec.min_nodes as usize
            })
            .collect()
    }

    /// Takes queued jobs into allocation while fewer than `max_jobs` are active:
    /// highest priority first; among equal priorities the job of the user with the
    /// fewest active jobs (one user's many jobs do not starve another's), then submit
    /// order. A job whose user already has `max_jobs_per_user` active jobs is passed
    /// over, and so is a paused one (`Event::JobPaused`): neither holds back others,
    /// nor takes a slot it could not use.
    fn admit_from_queue(&mut self, now: f64) {
        if self.active.len() >= self.cfg.max_jobs || self.queue.is_empty() {
            return;
        }
        let room = self.cfg.max_jobs - self.active.len();
        let cap = self.cfg.max_jobs_per_user;
        // FxHash: both are looked up once per queued job per pick (a queue of 1,000
        // jobs and as much room costs a million lookups), and neither is iterated.
        let mut per_user: rustc_hash::FxHashMap<u32, usize> = Default::default();
        for &j in &self.active {
            if let Some(u) = self.jobs[j as usize].spec.user {
                *per_user.entry(u).or_default() += 1;
            }
        }
        let mut picked: Vec<(Reverse<u32>, JobId)> = Vec::new();
        let mut taken: rustc_hash::FxHashSet<JobId> = Default::default();
        while picked.len() < room {
            // The best candidate: the queue is in priority order, so the first
            // eligible job sets the priority; later ones of that priority compete on
            // their user's active jobs.
            let mut best: Option<((Reverse<u32>, JobId), usize)> = None;
            for &(p, j) in &self.queue {
                if best.as_ref().is_some_and(|b| p > b.0 .0) {
                    break;
                }
                if taken.contains(&j) {
                    continue;
                }
                let job = &self.jobs[j as usize];
                if job.paused_until.is_some_and(|u| u > now) {
                    continue;
                }
                let load = job
                    .spec
                    .user
                    .map_or(0, |u| per_user.get(&u).copied().unwrap_or(0));
                if cap > 0 && job.spec.user.is_some() && load >= cap {
                    continue;
                }
                if best.as_ref().map_or(true, |b| load < b.1) {
                    best = Some(((p, j), load));
                }
            }
            let Some((k, _)) = best else {
                break;
            };
            taken.insert(k.1);
            if let Some(u) = self.jobs[k.1 as usize].spec.user {
                *per_user.entry(u).or_default() += 1;
            }
            picked.push(k);
        }
        for k in picked {
            self.queue.remove(&k);
            self.activate(k.1);
        }
    }

    fn activate(&mut self, j: JobId) {
        self.jobs[j as usize].status = JobStatus::Active;
        self.active.push(j);
        self.activated.push(j);
        self.active_changed = true;
        self.dirty = true;
    }

    fn decide(&mut self, now: f64) -> Result<Vec<Action>> {
        self.admit_from_queue(now);
        if self.wake_at.is_some_and(|w| w <= now) {
            self.dirty = true;
        }
        if !self.dirty || self.active.is_empty() {
            return Ok(Vec::new());
        }
        // Paused: nothing is decided (losses still apply as they come); the pending
        // change is decided when lending reopens. A job that a loss left below its
        // minimum cannot run there and is requeued all the same.
        if self.lending == Lending::Paused {
            let below = self.below_min(&self.active);
            return Ok(self.requeue_jobs(&below, now));
        }
        let drained = self.lending == Lending::Drained;
        self.dirty = false;
        let mut wake: Option<f64> = None;
        let soonest = |w: &mut Option<f64>, t: f64| *w = Some(w.map_or(t, |x| x.min(t)));
        // Jobs inside their rescale interval keep what they hold and sit this decision
        // out, unless a loss left them outside their bounds.
        let interval = self.cfg.min_rescale_interval_s;
        let mut deciding = Vec::with_capacity(self.active.len());
        for &j in &self.active {
            let job = &mut self.jobs[j as usize];
            let n = job.nodes.len() as u32;
            let until = job.last_rescale.map(|t| t + interval);
            let in_bounds = (job.spec.min_nodes..=job.spec.max_nodes).contains(&n);
            let frozen =
                !drained && interval > 0.0 && n > 0 && in_bounds && until.is_some_and(|u| u > now);
            // Paused (its own failures): keeps what it holds, or none, until the pause
            // ends; a loss below its minimum is still decided.
            let paused =
                !drained && (n == 0 || in_bounds) && job.paused_until.is_some_and(|u| u > now);
            job.in_decision = !frozen && !paused;
            if paused {
                soonest(&mut wake, job.paused_until.unwrap_or(now));
            }
            if frozen {
                soonest(&mut wake, until.unwrap_or(now));
            }
            if job.in_decision {
                deciding.push(j);
            }
            job.budget = job.spec.max_nodes;
        }
        // Per-user node caps cut the deciding jobs' ranges to their user's budget; a
        // job left without a budget sits out, and one that holds nodes it has no budget
        // for (the cap was lowered) is requeued after the decision.
        let fair = self.cfg.fair_share && !drained;
        let evict = if (self.cfg.max_nodes_per_user > 0 || fair) && !drained {
            self.user_budgets(&mut deciding, now)
        } else {
            Vec::new()
        };
        let rebuild = self.active_changed || deciding != self.deciding;
        if rebuild {
            self.active_changed = false;
            self.inst.jobs.clear();
            self.deciding = deciding;
        }
        for k in 0..self.deciding.len() {
            let j = self.deciding[k];
            let job = &mut self.jobs[j as usize];
            if !rebuild && !job.curve_stale {
                continue;
            }
            job.curve_stale = false;
            let s = &job.spec;
            let curve = if fair || !job.measured.is_empty() {
                fair::effective_curve(&s.objective, &job.measured, s.min_nodes, fair)
            } else {
                s.objective.clone()
            };
            let c = &self.cfg;
            let mut input = JobInput::new(
                &s.name,
                s.min_nodes,
                s.max_nodes,
                fair::rescale_cost(
                    s.scale_up_s,
                    c.min_scale_up_s,
                    job.measured_up_s,
                    c.max_scale_up_s,
                ),
                fair::rescale_cost(
                    s.scale_down_s,
                    c.min_scale_down_s,
                    job.measured_down_s,
                    c.max_scale_down_s,
                ),
                curve,
            );
            if let Some((curves, current)) = batch_curves(job, &input.curve) {
                input.curve = Curve::default();
                input.batch_curves = curves;
                input.current_batch = current;
            }
            if rebuild {
                self.inst.jobs.push(input);
            } else {
                let k = &mut self.inst.jobs[k];
                k.curve = input.curve;
                k.batch_curves = input.batch_curves;
                k.current_batch = input.current_batch;
                k.scale_up_s = input.scale_up_s;
                k.scale_down_s = input.scale_down_s;
            }
        }
        // The nodes this decision may use: the pool without nodes idle for less than
        // `lend_after_idle_s` and without the nodes of jobs sitting it out. With neither
        // setting in use this is the pool itself, in the same order.
        let lend_after = self.cfg.lend_after_idle_s;
        self.view.clear();
        for &n in &self.pool {
            let slot = &self.nodes[n as usize];
            let usable = match slot.state {
                NodeState::Idle if lend_after > 0.0 && slot.idle_since + lend_after > now => {
                    soonest(&mut wake, slot.idle_since + lend_after);
                    false
                }
                NodeState::Idle => true,
                NodeState::Held(j) => self.jobs[j as usize].in_decision,
                NodeState::Busy | NodeState::Lost => false,
            };
            let vpos = if usable {
                self.view.push(n);
                self.view.len() as u32 - 1
            } else {
                NONE
            };
            self.nodes[n as usize].vpos = vpos;
        }
        self.wake_at = wake;
        if self.deciding.is_empty() {
            return Ok(self.requeue_jobs(&evict, now));
        }
        let slots = self.gpu_slots > 0;
        for (k, &j) in self.deciding.iter().enumerate() {
            // A job with needs is offered no more nodes than serve it (`place` then
            // picks those); fewer than its minimum, and `place` gives it none.
            let serving = match &self.jobs[j as usize].needs {
                None if !slots => u32::MAX,
                _ => {
                    let n = self.view.iter().filter(|&&n| self.serves(n, j)).count() as u32;
                    n.max(self.jobs[j as usize].spec.min_nodes)
                }
            };
            self.inst.jobs[k].max_nodes = self.jobs[j as usize].budget.min(serving);
            let cur = &mut self.inst.jobs[k].current;
            cur.clear();
            cur.extend(
                self.jobs[j as usize]
                    .nodes
                    .iter()
                    .map(|&n| self.nodes[n as usize].vpos),
            );
            cur.sort_unstable();
            self.inst.jobs[k].remaining_work = self.jobs[j as usize].remaining;
        }
        self.inst.n_nodes = self.view.len() as u32;
        self.inst.reclaim_in_s.clear();
        self.inst.host_of.clear();
        // GPU-slot units are packed by host; a whole node beside them is a host of its
        // own (numbered past the slots' hosts). No slots: no hosts, as before.
        if self.slot_units > 0 {
            let (nodes, base) = (&self.nodes, self.hosts.len() as u32);
            self.inst.host_of.extend(self.view.iter().map(|&n| {
                let h = nodes[n as usize].host;
                if h == NONE {
                    base.saturating_add(n)
                } else {
                    h
                }
            }));
        }
        // An empty vector means "no forecasts" to the allocator: skip the per-node work
        // when no node has one (node-event traces).
        if self.forecasts > 0 {
            let nodes = &self.nodes;
            self.inst.reclaim_in_s.extend(
                self.view
                    .iter()
                    .map(|&n| nodes[n as usize].reclaim_at.map(|r| (r - now).max(0.0))),
            );
        }
        self.stats.decisions += 1;
        let sol = if drained {
            Some(self.core_only())
        } else {
            match self.alloc.allocate(&self.inst) {
                Ok(sol) => sol,
                Err(msg) => {
                    self.stats.refused += 1;
                    return Err(Error::Alloc { t: now, msg });
                }
            }
        };
        let mut actions = match sol {
            Some(sol) => self
                .apply(sol, now)
                .inspect_err(|_| self.stats.refused += 1)?,
            None => {
                // Kept allocation: a job a loss left below its minimum is not left there.
                self.stats.kept += 1;
                let below = self.below_min(&self.deciding);
                self.requeue_jobs(&below, now)
            }
        };
        // The batch of each job with batch curves: the best one at the nodes it holds
        // now (the solver's choice where it moved them; a kept allocation may still
        // have new curves), unless the one it was last given (else runs at) is within
        // `BATCH_SWITCH_GAIN` of it. No nodes, no batch to run at: the last one is kept.
        for (k, &j) in self.deciding.iter().enumerate() {
            let slot = &mut self.jobs[j as usize];
            let n = slot.nodes.len() as u32;
            if n > 0 && !self.inst.jobs[k].batch_curves.is_empty() {
                let current = slot.decided_batch.or(slot.batch_now);
                slot.decided_batch = crate::alloc::batch_to_run(&self.inst.jobs[k], n, current);
            }
        }
        let mut forced = self.requeue_jobs(&evict, now);
        forced.append(&mut actions);
        Ok(forced)
    }

    /// Requeues active jobs outside a decision (below their minimum, or over their
    /// user's node cap): all their nodes go back to the pool, and the next decision may
    /// use them.
    fn requeue_jobs(&mut self, jobs: &[JobId], now: f64) -> Vec<Action> {
        let mut out = Vec::with_capacity(jobs.len());
        for &j in jobs {
            let nodes = self.jobs[j as usize].nodes.clone();
            if nodes.is_empty() {
                continue;
            }
            let a = Action::Requeue { job: j, nodes };
            self.apply_action(&a, now);
            self.dirty = true;
            out.push(a);
        }
        out
    }

    /// The user a job's share is counted for: its owner; under fair shares a job
    /// without a known owner is a user of its own; else it has no user (no cap).
    fn user_key(&self, j: JobId) -> Option<u64> {
        match self.jobs[j as usize].spec.user {
            Some(u) => Some(u64::from(u)),
            None if self.cfg.fair_share => Some(1 << 32 | u64::from(j)),
            None => None,
        }
    }

    /// Each user's node budget in this decision, split among that user's deciding jobs.
    /// The budget is the user's fixed cap (`max_nodes_per_user`) and, under fair shares,
    /// the user's weighted max-min share of the lendable nodes (`fair::water_fill`;
    /// a share a user's jobs cannot use, a minimum too big for it, goes to the others).
    /// A user's budget is split as `fair::split` says. Sets each job's `budget` (its
    /// node range's top in this decision), takes jobs without one out of `deciding`, and
    /// returns those of them that hold nodes (to be requeued).
    fn user_budgets(&mut self, deciding: &mut Vec<JobId>, now: f64) -> Vec<JobId> {
        let cap = self.cfg.max_nodes_per_user;
        let fair = self.cfg.fair_share;
        let mut index: HashMap<u64, usize> = HashMap::new();
        // Per user: fixed cap, nodes held by jobs sitting out, and the fair claim.
        let mut caps: Vec<u32> = Vec::new();
        let mut held_out: Vec<u32> = Vec::new();
        let mut claims: Vec<fair::Claim> = Vec::new();
        for &j in &self.active {
            let Some(key) = self.user_key(j) else {
                continue;
            };
            let job = &self.jobs[j as usize];
            let u = *index.entry(key).or_insert_with(|| {
                let user = job.spec.user;
                caps.push(if cap > 0 && user.is_some() {
                    cap
                } else {
                    u32::MAX
                });
                held_out.push(0);
                let weight = user.and_then(|u| self.user_weights.get(&u).copied());
                claims.push(fair::Claim {
                    weight: weight.unwrap_or(1.0),
                    floor: 0,
                    demand: 0,
                });
                caps.len() - 1
            });
            let h = job.nodes.len() as u32;
            let c = &mut claims[u];
            if job.in_decision {
                if h >= job.spec.min_nodes {
                    c.floor += job.spec.min_nodes;
                }
                c.demand = c.demand.saturating_add(job.spec.max_nodes);
            } else {
                held_out[u] += h;
                c.floor += h;
                c.demand = c.demand.saturating_add(h);
            }
        }
        let mut order: Vec<(JobId, usize)> = deciding
            .iter()
            .filter_map(|&j| self.user_key(j).map(|k| (j, index[&k])))
            .collect();
        if order.is_empty() {
            return Vec::new();
        }
        order.sort_by_key(|&(j, _)| (Reverse(self.jobs[j as usize].spec.priority), j));
        let jobs: Vec<fair::JobClaim> = order
            .iter()
            .map(|&(j, u)| {
                let s = &self.jobs[j as usize];
                fair::JobClaim {
                    user: u,
                    min: s.spec.min_nodes,
                    max: s.spec.max_nodes,
                    held: s.nodes.len() as u32,
                }
            })
            .collect();
        let n = if fair {
            let lend_after = self.cfg.lend_after_idle_s;
            let count = self
                .pool
                .iter()
                .filter(|&&n| {
                    let s = &self.nodes[n as usize];
                    match s.state {
                        NodeState::Held(_) => true,
                        NodeState::Idle => !(lend_after > 0.0 && s.idle_since + lend_after > now),
                        _ => false,
                    }
                })
                .count();
            Some(count as u32)
        } else {
            None
        };
        let give = fair::budgets(&jobs, &mut claims, &caps, &held_out, n);
        let mut evict = Vec::new();
        for (k, &(j, _)) in order.iter().enumerate() {
            let job = &mut self.jobs[j as usize];
            job.budget = give[k].min(job.spec.max_nodes);
            if give[k] == 0 {
                job.in_decision = false;
                if !job.nodes.is_empty() {
                    evict.push(j);
                }
            }
        }
        deciding.retain(|&j| self.jobs[j as usize].in_decision);
        evict
    }

    /// The drained allocation: every deciding job keeps its core nodes (anchors), topped
    /// up with others it holds when losses left fewer than `min_nodes` anchors; a job
    /// that holds fewer than `min_nodes` is requeued, one that holds none stays at none.
    fn core_only(&self) -> Solution {
        let jobs = self
            .deciding
            .iter()
            .map(|&j| {
                let job = &self.jobs[j as usize];
                let min = job.spec.min_nodes as usize;
                if job.nodes.len() < min {
                    return Vec::new();
                }
                let mut keep: Vec<NodeId> = job
                    .anchors
                    .iter()
                    .copied()
                    .filter(|n| job.nodes.contains(n))
                    .collect();
                for &n in &job.nodes {
                    if keep.len() >= min {
                        break;
                    }
                    if !keep.contains(&n) {
                        keep.push(n);
                    }
                }
                let mut set: Vec<u32> = keep.iter().map(|&n| self.nodes[n as usize].vpos).collect();
                set.sort_unstable();
                set
            })
            .collect();
        Solution {
            objective_value: 0.0,
            jobs,
            batch_sizes: vec![None; self.deciding.len()],
            fairness_level: None,
        }
    }

    /// A shrinking job gives up its core (anchor) nodes last: where the allocator took
    /// an anchor and kept another of the job's nodes, the two trade places (and a job
    /// that received the anchor gets the other node instead). Counts, and so every
    /// count-based objective's value, are unchanged.
    fn keep_anchors(&mut self, sets: &mut [Vec<u32>]) {
        for k in 0..sets.len() {
            let j = self.deciding[k];
            if sets[k].is_empty() || self.jobs[j as usize].anchors.is_empty() {
                continue;
            }
            for ai in 0..self.jobs[j as usize].anchors.len() {
                let a = self.jobs[j as usize].anchors[ai];
                let av = self.nodes[a as usize].vpos;
                if self.mark[av as usize] == k as u32 {
                    continue;
                }
                // A kept node of this job that is not an anchor.
                let anchors = &self.jobs[j as usize].anchors;
                let Some(si) = sets[k].iter().position(|&v| {
                    let n = self.view[v as usize];
                    self.nodes[n as usize].state == NodeState::Held(j) && !anchors.contains(&n)
                }) else {
                    continue;
                };
                let sv = sets[k][si];
                sets[k][si] = av;
                let other = self.mark[av as usize];
                if other != NONE {
                    let o = other as usize;
                    if let Some(p) = sets[o].iter().position(|&v| v == av) {
                        sets[o][p] = sv;
                    }
                }
                self.mark[sv as usize] = other;
                self.mark[av as usize] = k as u32;
            }
        }
    }

    /// Whether node `n` serves job `j` (its needs against the node's attributes). A job
    /// without needs is served by every node but GPU slots (`NodeAttrs::gpu_slot`).
    fn serves(&self, n: NodeId, j: JobId) -> bool {
        let attrs = self.nodes[n as usize].attrs.as_deref();
        match &self.jobs[j as usize].needs {
            None => !attrs.is_some_and(|a| a.gpu_slot),
            Some(b) => b.1.served_by(attrs),
        }
    }

    /// A job is given only nodes that serve it: a new node of a job's set (one it does
    /// not hold) that does not serve it is traded for a node of the view no job was
    /// given that does, or dropped; an admission left with fewer than its minimum is
    /// not made. Nodes a job holds stay; the allocator's other choices are kept.
    /// Counts only go down, so the answer stays within the contract.
    fn place(&mut self, sets: &mut [Vec<u32>]) {
        let slots = self.gpu_slots > 0;
        if !slots
            && self
                .deciding
                .iter()
                .all(|&j| self.jobs[j as usize].needs.is_none())
        {
            return;
        }
        for (k, set) in sets.iter_mut().enumerate() {
            let j = self.deciding[k];
            if !slots && self.jobs[j as usize].needs.is_none() {
                continue;
            }
            // Replacements are searched from where the last one was found: nodes before
            // it are taken or do not serve the job, so one job's repair walks the view
            // once, not once per node it replaces.
            let mut from = 0u32;
            let mut i = 0;
            while i < set.len() {
                let v = set[i];
                let n = self.view[v as usize];
                if self.nodes[n as usize].state == NodeState::Held(j) || self.serves(n, j) {
                    i += 1;
                    continue;
                }
                let free = (from..self.view.len() as u32).find(|&w| {
                    self.mark[w as usize] == NONE && self.serves(self.view[w as usize], j)
                });
                from = free.map_or(self.view.len() as u32, |w| w + 1);
                self.mark[v as usize] = NONE;
                match free {
                    Some(w) => {
                        self.mark[w as usize] = k as u32;
                        set[i] = w;
                        i += 1;
                    }
                    None => {
                        set.remove(i);
                    }
                }
            }
            let job = &self.jobs[j as usize];
            if job.nodes.is_empty() && (set.len() as u32) < job.spec.min_nodes {
                for &v in set.iter() {
                    self.mark[v as usize] = NONE;
                }
                set.clear();
            }
            set.sort_unstable();
        }
    }

    /// Checks the allocator's answer against its contract, then turns it into actions:
    /// shrinks first, so the environment frees nodes before others grow onto them.
    fn apply(&mut self, mut sol: Solution, now: f64) -> Result<Vec<Action>> {
        let bad = |msg: String| Err(Error::Alloc { t: now, msg });
        if sol.jobs.len() != self.deciding.len() {
            return bad(format!(
                "{} node sets for {} jobs",
                sol.jobs.len(),
                self.deciding.len()
            ));
        }
        self.mark.clear();
        self.mark.resize(self.view.len(), NONE);
        for (k, set) in sol.jobs.iter().enumerate() {
            let spec = &self.jobs[self.deciding[k] as usize].spec;
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
                            self.view.len()
                        ))
                    }
                    Some(&m) if m != NONE => {
                        return bad(format!("node index {i} given to two jobs"))
                    }
                    _ => self.mark[i as usize] = k as u32,
                }
            }
        }
        self.keep_anchors(&mut sol.jobs);
        self.place(&mut sol.jobs);
        let mut shrinks = Vec::new();
        let mut grows = Vec::new();
        for (k, set) in sol.jobs.iter().enumerate() {
            let j = self.deciding[k];
            let old = &self.jobs[j as usize].nodes;
            let added: Vec<NodeId> = set
                .iter()
                .map(|&i| self.view[i as usize])
                .filter(|&n| self.nodes[n as usize].state != NodeState::Held(j))
                .collect();
            let removed: Vec<NodeId> = old
                .iter()
                .copied()
                .filter(|&n| self.mark[self.nodes[n as usize].vpos as usize] != k as u32)
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
            self.apply_action(a, now);
        }
        shrinks.extend(grows);
        Ok(shrinks)
    }

    /// Applies one checked action to the state (a decision's, or a journaled one at a
    /// restore): the job's nodes, anchors and last rescale, and the nodes' states.
    fn apply_action(&mut self, a: &Action, now: f64) {
        let j = a.job();
        let job = &mut self.jobs[j as usize];
        match a {
            Action::Shrink { nodes, .. } | Action::Requeue { nodes, .. } => {
                job.nodes.retain(|n| !nodes.contains(n));
                job.last_rescale = (!job.nodes.is_empty()).then_some(now);
                for &n in nodes {
                    self.nodes[n as usize].state = NodeState::Idle;
                    self.nodes[n as usize].idle_since = now;
                }
            }
            Action::Admit { nodes, .. } | Action::Grow { nodes, .. } => {
                if job.nodes.is_empty() {
                    let m = (job.spec.min_nodes as usize).min(nodes.len());
                    job.anchors = nodes[..m].to_vec();
                }
                job.nodes.extend_from_slice(nodes);
                job.last_rescale = Some(now);
                for &n in nodes {
                    self.nodes[n as usize].state = NodeState::Held(j);
                }
            }
        }
        self.refill_anchors(j);
    }

    /// Applies a journaled decision (`Event::Decided`) in `Mode::Restore`: the jobs it
    /// took into allocation, then each action that fits the state (an action that does
    /// not, e.g. onto a node that is not idle or for a job that is not active, is
    /// skipped with a warning). Returns the actions applied.
    fn restore_decision(
        &mut self,
        activated: &[JobId],
        actions: &[Action],
        now: f64,
    ) -> Vec<Action> {
        for &j in activated {
            match self
                .jobs
                .get(j as usize)
                .map(|s| (s.status, s.spec.priority))
            {
                Some((JobStatus::Queued, p)) => {
                    self.queue.remove(&(Reverse(p), j));
                    self.activate(j);
                }
                Some((JobStatus::Active, _)) => {}
                st => {
                    self.stats.skipped_actions += 1;
                    self.warnings.push(format!(
                        "t={now}: journaled decision takes job {j} into allocation, but it is {}",
                        st.map_or("unknown or forgotten".into(), |s| format!("{:?}", s.0))
                    ));
                }
            }
        }
        let mut applied = Vec::with_capacity(actions.len());
        for a in actions {
            match self.restore_check(a) {
                Ok(()) => {
                    if self.jobs[a.job() as usize].status == JobStatus::Queued {
                        let p = self.jobs[a.job() as usize].spec.priority;
                        self.queue.remove(&(Reverse(p), a.job()));
                        self.activate(a.job());
                    }
                    self.apply_action(a, now);
                    self.stats.restored_actions += 1;
                    applied.push(a.clone());
                }
                Err(why) => {
                    self.stats.skipped_actions += 1;
                    self.warnings.push(format!(
                        "t={now}: journaled decision {} job {} on nodes {:?} skipped: {why}",
                        a.kind(),
                        a.job(),
                        a.nodes()
                    ));
                }
            }
        }
        self.dirty = true;
        applied
    }

    /// Whether a journaled action fits the current state.
    fn restore_check(&self, a: &Action) -> std::result::Result<(), String> {
        let j = a.job();
        let Some(job) = self.jobs.get(j as usize) else {
            return Err("the job is unknown or forgotten".into());
        };
        let nodes = a.nodes();
        if nodes.is_empty() {
            return Err("no nodes".into());
        }
        let mut seen = std::collections::HashSet::with_capacity(nodes.len());
        for &n in nodes {
            if n as usize >= self.nodes.len() {
                return Err(format!("node {n} is unknown"));
            }
            if !seen.insert(n) {
                return Err(format!("node {n} is listed twice"));
            }
        }
        let status_ok = match a {
            Action::Admit { .. } => matches!(job.status, JobStatus::Queued | JobStatus::Active),
            _ => job.status == JobStatus::Active,
        };
        if !status_ok {
            return Err(format!("the job is {:?}", job.status));
        }
        let held = job.nodes.len();
        let (min, max) = (job.spec.min_nodes as usize, job.spec.max_nodes as usize);
        match a {
            Action::Admit { .. } | Action::Grow { .. } => {
                if let Some(&n) = nodes
                    .iter()
                    .find(|&&n| self.nodes[n as usize].state != NodeState::Idle)
                {
                    return Err(format!(
                        "node {n} is {:?}, not idle",
                        self.nodes[n as usize].state
                    ));
                }
                let after = held + nodes.len();
                if matches!(a, Action::Admit { .. }) && held != 0 {
                    return Err(format!("the job holds {held} nodes already"));
                }
                if matches!(a, Action::Grow { .. }) && held == 0 {
                    return Err("the job holds no nodes to grow from".into());
                }
                if after < min || after > max {
                    return Err(format!("{after} nodes, allowed {min}..{max}"));
                }
            }
            Action::Shrink { .. } | Action::Requeue { .. } => {
                if let Some(&n) = nodes
                    .iter()
                    .find(|&&n| self.nodes[n as usize].state != NodeState::Held(j))
                {
                    return Err(format!(
                        "node {n} is {:?}, not held by the job",
                        self.nodes[n as usize].state
                    ));
                }
                let after = held - nodes.len();
                if matches!(a, Action::Shrink { .. }) && after == 0 {
                    return Err("the shrink would leave the job no node".into());
                }
                if matches!(a, Action::Requeue { .. }) && after != 0 {
                    return Err(format!(
                        "the job would keep {after} nodes after its requeue"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether a node's attributes mark it a GPU slot (`NodeAttrs::gpu_slot`).
fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_gpu_slot(n: &NodeSlot) -> bool {
    n.attrs.as_deref().is_some_and(|a| a.gpu_slot)
}

/// The allocator's batch curves of a job with a batch range whose rate is measured at a
/// known batch: Saxena et al.'s model ([`EfficiencyModel`]) over `curve`, the job's rate
/// at that batch, with the batch it runs at as the current one where the range holds it.
/// `None` (plain curve, no batch decision) otherwise, or where the model refuses the
/// curve.
fn batch_curves(job: &JobSlot, curve: &Curve) -> Option<(Vec<BatchCurve>, Option<u32>)> {
    let (range, base) = (job.batch_range?, job.batch_now?);
    let model = EfficiencyModel::new(base);
    let batches = model.candidate_batches(range).ok()?;
    let curves = model
        .batch_curves_for(curve, &batches, job.spec.max_nodes)
        .ok()?;
    Some((curves, batches.contains(&base).then_some(base)))
}
