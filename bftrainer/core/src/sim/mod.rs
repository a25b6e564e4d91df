//! The trace-replay simulator: drives the engine with a node trace and BFTrainer's elastic
//! job model (progress, rescale and preemption charges), checks invariants, reports.

mod report;
pub mod stack;

pub use report::{percentile, ActionCounts, JobReport, Report};

use crate::engine::{
    Action, Allocator, ElasticSpec, Engine, EngineConfig, Event, JobId, JobStatus, Record,
    EVENT_FORMAT_VERSION,
};
use crate::error::{Error, Result};
use crate::timefmt::format_time;
use crate::trace::jobs::{curve_at, JobRecord};
use crate::trace::NodeTrace;
use serde::Serialize;

const NONE: u32 = u32::MAX;

/// Which curve the allocator maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The job file's `curve_objective` column (BFTrainer's replayer does this).
    File,
    /// Throughput in samples/s (`curve_samples_per_s`).
    Samples,
}

/// When the simulator steps (accounts, applies events and lets the engine decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Steps {
    /// At every trace event, at every submission and at the exact time a job reaches
    /// its `total_samples`, so its nodes are re-planned at once.
    #[default]
    Exact,
    /// As BFTrainer's replayer: only at the trace's event times (and the window's end).
    /// A job submitted between two events waits for the next one; a job that reaches
    /// `total_samples` between two events keeps its nodes until the next one, where
    /// it is finished and the samples beyond its total count as overrun loss.
    Trace,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub engine: EngineConfig,
    pub steps: Steps,
    /// Slurm's preemption GraceTime: a job keeps a claimed node this long (the regular
    /// job waits), and its preemption charge shrinks by as much.
    pub grace_s: f64,
    pub objective: Objective,
    /// Run the invariant checker at every step (cost O(nodes) per step).
    pub check: bool,
    /// Keep per-step and per-job-size records (for the CSV and the plots).
    pub record: bool,
    /// Send each active job's remaining work (`Event::Progress`) before every
    /// decision; objectives that use it (remaining-work) need this.
    pub report_progress: bool,
    /// 0: nodes enter the idle pool in trace order. Otherwise the initial idle nodes
    /// enter it in an order shuffled with this seed, which changes the allocator's
    /// choice among equivalent nodes (a sensitivity check); same seed, same result.
    pub seed: u64,
    /// Keep every event sent to the engine (`Outcome::journal`) and every action it
    /// returned (`Outcome::actions`): the journal replays into a fresh engine.
    pub journal: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            steps: Steps::Exact,
            grace_s: 0.0,
            objective: Objective::File,
            check: true,
            record: false,
            report_progress: false,
            journal: false,
            seed: 0,
        }
    }
}

/// One row of the per-step log (one per distinct event time), in the spirit of
/// BFTrainer's step log.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepRecord {
    /// Unix seconds.
    pub t: f64,
    pub idle_nodes: u32,
    pub harvested_nodes: u32,
    pub active_jobs: u32,
    pub queued_jobs: u32,
    pub finished_jobs: u32,
    pub grown_nodes: u32,
    pub shrunk_nodes: u32,
    pub preempted_nodes: u32,
    /// Net samples processed so far, all jobs.
    pub samples: f64,
    /// Wall time of this step's decision, seconds (0 without a decision).
    pub decision_s: f64,
}

/// A job's node count changed at `t` (Unix seconds) to `nodes`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SizeRecord {
    pub t: f64,
    pub job: u32,
    pub nodes: u32,
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub report: Report,
    pub steps: Vec<StepRecord>,
    pub sizes: Vec<SizeRecord>,
    /// With `SimConfig::journal`: the engine's input, as the daemon would journal it.
    pub journal: Vec<Record>,
    /// With `SimConfig::journal`: (time, action) as the engine returned them.
    pub actions: Vec<(f64, Action)>,
}

/// What the simulator needs from its caller's world: a clock to time decisions
/// (seconds, any origin) and a progress sink (fraction of the window done).
pub struct Hooks<'a> {
    pub clock: &'a mut dyn FnMut() -> f64,
    pub progress: &'a mut dyn FnMut(f64),
}

struct SimJob {
    progress: f64,
    /// Nodes the engine gives the job.
    n: u32,
    /// Claimed nodes it keeps for the grace period.
    draining: u32,
    submitted: bool,
    first_admit: Option<f64>,
    finished: Option<f64>,
    node_s: f64,
    gross: f64,
    rescale_loss: f64,
    preempt_loss: f64,
    /// Samples computed past `total_samples` before the job was seen done.
    overrun_loss: f64,
    last_size: u32,
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Throughput of a job on `n` nodes: 0 below its minimum.
fn rate(rec: &JobRecord, n: u32) -> f64 {
    if n < rec.min_nodes {
        0.0
    } else {
        curve_at(&rec.rate, n.min(rec.max_nodes))
    }
}

/// Replays `trace` with `jobs` (sorted by submit time) through an engine using `alloc`.
pub fn simulate<A: Allocator>(
    trace: &NodeTrace,
    jobs: &[JobRecord],
    alloc: A,
    cfg: &SimConfig,
    hooks: &mut Hooks<'_>,
) -> Result<Outcome> {
    Sim::new(trace, jobs, alloc, cfg)?.run(hooks)
}

struct Sim<'a, A> {
    trace: &'a NodeTrace,
    recs: &'a [JobRecord],
    cfg: &'a SimConfig,
    engine: Engine<A>,
    /// Unix time of relative time 0; the accounting runs in relative seconds so that
    /// completion times keep sub-microsecond precision.
    t0: f64,
    idle: Vec<bool>,
    idle_list: Vec<u32>,
    idle_pos: Vec<u32>,
    holder: Vec<u32>,
    jobs: Vec<SimJob>,
    held_total: u32,
    draining_total: u32,
    /// (until, job), relative seconds.
    draining: Vec<(f64, JobId)>,
    forecast: Option<f64>,
    scratch: Vec<JobId>,
    preempted: Vec<(JobId, f64)>,
    out: Outcome,
    // Accumulators (node-seconds, samples).
    idle_ns: f64,
    harvested_ns: f64,
    useful_ns: f64,
    unused_ns: f64,
    grace_ns: f64,
    counts: Counts,
    decision_s: Vec<f64>,
}

#[derive(Default)]
struct Counts {
    actions: ActionCounts,
    preempted_nodes: u64,
    finished: u32,
}

impl<'a, A: Allocator> Sim<'a, A> {
    fn new(
        trace: &'a NodeTrace,
        recs: &'a [JobRecord],
        alloc: A,
        cfg: &'a SimConfig,
    ) -> Result<Self> {
        let n = trace.names.len();
        if n == 0 {
            return Err(Error::Config("the trace has no nodes".into()));
        }
        if trace.initial_idle.len() != n {
            return Err(Error::Config(
                "trace initial state does not cover every node".into(),
            ));
        }
        if !(cfg.grace_s >= 0.0 && cfg.grace_s.is_finite()) {
            return Err(Error::Config(format!(
                "grace must be a finite number of seconds >= 0, found {}",
                cfg.grace_s
            )));
        }
        cfg.engine.validate().map_err(Error::Config)?;
        if recs.windows(2).any(|w| w[1].submit < w[0].submit) {
            return Err(Error::Config("jobs must be sorted by submit time".into()));
        }
        Ok(Self {
            trace,
            recs,
            cfg,
            engine: Engine::new(cfg.engine.clone(), alloc),
            t0: trace.start as f64,
            idle: vec![false; n],
            idle_list: Vec::new(),
            idle_pos: vec![NONE; n],
            holder: vec![NONE; n],
            jobs: Vec::new(),
            held_total: 0,
            draining_total: 0,
            draining: Vec::new(),
            forecast: None,
            scratch: Vec::new(),
            preempted: Vec::new(),
            out: Outcome::default(),
            idle_ns: 0.0,
            harvested_ns: 0.0,
            useful_ns: 0.0,
            unused_ns: 0.0,
            grace_ns: 0.0,
            counts: Counts::default(),
            decision_s: Vec::new(),
        })
    }

    fn abs(&self, t: f64) -> f64 {
        self.t0 + t
    }

    fn send(&mut self, ev: &Event, t: f64) -> Result<Vec<Action>> {
        let now = self.abs(t);
        let actions = self.engine.on_event(ev, now)?;
        if self.cfg.journal {
            self.out.journal.push(Record {
                v: EVENT_FORMAT_VERSION,
                t: now,
                event: ev.clone(),
            });
            self.out
                .actions
                .extend(actions.iter().map(|a| (now, a.clone())));
        }
        Ok(actions)
    }

    fn violation(&self, t: f64, msg: String) -> Error {
        Error::Invariant {
            t: self.abs(t),
            msg,
        }
    }

    fn set_idle(&mut self, node: u32, idle: bool) {
        let i = node as usize;
        if self.idle[i] == idle {
            return;
        }
        self.idle[i] = idle;
        if idle {
            self.idle_pos[i] = self.idle_list.len() as u32;
            self.idle_list.push(node);
        } else {
            let p = std::mem::replace(&mut self.idle_pos[i], NONE) as usize;
            self.idle_list.swap_remove(p);
            if let Some(&m) = self.idle_list.get(p) {
                self.idle_pos[m as usize] = p as u32;
            }
        }
    }

    fn run(mut self, hooks: &mut Hooks<'_>) -> Result<Outcome> {
        let tr = self.trace;
        let end = (tr.end - tr.start) as f64;
        for (i, name) in tr.names.iter().enumerate() {
            self.send(
                &Event::NodeAdded {
                    node: i as u32,
                    name: name.clone(),
                },
                0.0,
            )?;
        }
        let mut fi = 0;
        while fi < tr.forecasts.len() && tr.forecasts[fi].0 <= tr.start {
            self.forecast = tr.forecasts[fi].1.map(|r| r as f64);
            fi += 1;
        }
        let mut order: Vec<u32> = (0..tr.names.len() as u32).collect();
        if self.cfg.seed != 0 {
            let mut x = self.cfg.seed;
            for i in (1..order.len()).rev() {
                let k = (splitmix64(&mut x) % (i as u64 + 1)) as usize;
                order.swap(i, k);
            }
        }
        for i in order.into_iter().map(|i| i as usize) {
            if tr.initial_idle[i] {
                self.set_idle(i as u32, true);
                let ev = Event::NodeIdle {
                    node: i as u32,
                    reclaim_at: self.forecast,
                };
                self.send(&ev, 0.0)?;
            }
        }
        let (mut ci, mut ji) = (0usize, 0usize);
        let mut t = 0.0f64;
        let mut steps = 0u64;
        loop {
            self.step(t, &mut ci, &mut fi, &mut ji, hooks)?;
            steps += 1;
            if steps % 4096 == 0 {
                (hooks.progress)(if end > 0.0 { t / end } else { 1.0 });
            }
            let mut next = f64::INFINITY;
            if let Some(c) = tr.changes.get(ci) {
                next = next.min((c.t - tr.start) as f64);
            }
            if let Some(f) = tr.forecasts.get(fi) {
                next = next.min((f.0 - tr.start) as f64);
            }
            let exact = self.cfg.steps == Steps::Exact;
            if let Some(j) = self.recs.get(ji).filter(|_| exact) {
                next = next.min(((j.submit - tr.start) as f64).max(0.0));
            }
            for &(u, _) in &self.draining {
                next = next.min(u);
            }
            if exact {
                next = next.min(self.next_completion(t));
            }
            if next > end {
                self.account(t, end)?;
                t = end;
                if !exact {
                    // The window's end is the replayer's last event: jobs done by then
                    // count as completed.
                    self.complete_jobs(t)?;
                }
                break;
            }
            self.account(t, next)?;
            t = next;
        }
        (hooks.progress)(1.0);
        self.finish(t)
    }

    /// Remaining work goes to the engine in the objective curve's units: samples
    /// scaled by the curves' ratio at one node (1 for a throughput objective).
    fn objective_scale(&self, j: JobId) -> f64 {
        let rec = &self.recs[j as usize];
        let obj1 = match self.cfg.objective {
            Objective::File => curve_at(&rec.objective, 1),
            Objective::Samples => curve_at(&rec.rate, 1),
        };
        let r1 = curve_at(&rec.rate, 1);
        if r1 > 0.0 {
            obj1 / r1
        } else {
            1.0
        }
    }

    fn next_completion(&self, t: f64) -> f64 {
        let mut best = f64::INFINITY;
        for &j in self.engine.active() {
            let (s, rec) = (&self.jobs[j as usize], &self.recs[j as usize]);
            let r = rate(rec, s.n + s.draining);
            if r > 0.0 {
                best = best.min(t + ((rec.total_samples - s.progress) / r).max(0.0));
            }
        }
        best
    }

    fn account(&mut self, t: f64, t1: f64) -> Result<()> {
        let dt = t1 - t;
        if dt <= 0.0 {
            return Ok(());
        }
        let idle = self.idle_list.len() as f64;
        self.idle_ns += idle * dt;
        self.harvested_ns += f64::from(self.held_total) * dt;
        self.grace_ns += f64::from(self.draining_total) * dt;
        if self.cfg.check {
            // Counted independently of held_total: idle nodes that no job holds.
            let unused = self
                .idle_list
                .iter()
                .filter(|&&n| self.holder[n as usize] == NONE)
                .count() as u32;
            if unused + self.held_total != self.idle_list.len() as u32 {
                return Err(self.violation(
                    t,
                    format!(
                        "idle nodes {} != harvested {} + unused {unused}",
                        self.idle_list.len(),
                        self.held_total
                    ),
                ));
            }
            self.unused_ns += f64::from(unused) * dt;
        } else {
            self.unused_ns += (idle - f64::from(self.held_total)) * dt;
        }
        for k in 0..self.engine.active().len() {
            let j = self.engine.active()[k] as usize;
            let rec = &self.recs[j];
            let s = &mut self.jobs[j];
            let r = rate(rec, s.n + s.draining);
            let gross = r * dt;
            s.progress += gross;
            s.gross += gross;
            s.node_s += f64::from(s.n) * dt;
            if s.n + s.draining >= rec.min_nodes {
                self.useful_ns += f64::from(s.n) * dt;
            }
        }
        Ok(())
    }

    fn record_size(&mut self, t: f64, j: JobId) {
        let s = &mut self.jobs[j as usize];
        let n = s.n + s.draining;
        if self.cfg.record && n != s.last_size {
            s.last_size = n;
            self.out.sizes.push(SizeRecord {
                t: self.t0 + t,
                job: j,
                nodes: n,
            });
        }
    }

    /// Finishes the active jobs whose progress has reached their total at `t`: their
    /// nodes go back to the pool, samples past the total count as overrun loss.
    fn complete_jobs(&mut self, t: f64) -> Result<()> {
        self.scratch.clear();
        self.scratch.extend_from_slice(self.engine.active());
        for k in 0..self.scratch.len() {
            let j = self.scratch[k];
            let (s, rec) = (&self.jobs[j as usize], &self.recs[j as usize]);
            let rem = rec.total_samples - s.progress;
            let r = rate(rec, s.n + s.draining);
            if rem <= 1e-9 * rec.total_samples || (r > 0.0 && rem / r < 1e-6) {
                for &n in self.engine.job_nodes(j) {
                    self.holder[n as usize] = NONE;
                }
                let s = &mut self.jobs[j as usize];
                self.held_total -= s.n;
                self.draining_total -= s.draining;
                s.n = 0;
                s.draining = 0;
                s.overrun_loss += (-rem).max(0.0);
                s.progress = rec.total_samples;
                s.finished = Some(t);
                self.counts.finished += 1;
                self.draining.retain(|&(_, x)| x != j);
                self.send(&Event::JobFinished { job: j }, t)?;
                self.record_size(t, j);
            }
        }
        Ok(())
    }

    fn step(
        &mut self,
        t: f64,
        ci: &mut usize,
        fi: &mut usize,
        ji: &mut usize,
        hooks: &mut Hooks<'_>,
    ) -> Result<()> {
        let tr = self.trace;
        let tabs = tr.start + t.floor() as i64;
        let check = self.cfg.check;
        // 1. Completions (at their exact time: before this time's claims can charge them).
        if self.cfg.steps == Steps::Exact {
            self.complete_jobs(t)?;
        }
        // 2. Grace periods that end now.
        if !self.draining.is_empty() {
            let mut k = 0;
            while k < self.draining.len() {
                if self.draining[k].0 <= t {
                    let j = self.draining.swap_remove(k).1;
                    self.jobs[j as usize].draining -= 1;
                    self.draining_total -= 1;
                    self.record_size(t, j);
                } else {
                    k += 1;
                }
            }
        }
        // 3. Node changes.
        self.preempted.clear();
        let mut preempted_nodes = 0u32;
        while let Some(c) = tr.changes.get(*ci).filter(|c| c.t <= tabs) {
            *ci += 1;
            if c.idle {
                self.set_idle(c.node, true);
                let reclaim_at = c.reclaim_at.map(|r| r as f64).or(self.forecast);
                self.send(
                    &Event::NodeIdle {
                        node: c.node,
                        reclaim_at,
                    },
                    t,
                )?;
                continue;
            }
            self.set_idle(c.node, false);
            let h = std::mem::replace(&mut self.holder[c.node as usize], NONE);
            if h != NONE {
                let (rec, s) = (&self.recs[h as usize], &mut self.jobs[h as usize]);
                if !self.preempted.iter().any(|&(x, _)| x == h) {
                    self.preempted.push((h, rate(rec, s.n + s.draining)));
                }
                s.n -= 1;
                self.held_total -= 1;
                if self.cfg.grace_s > 0.0 {
                    s.draining += 1;
                    self.draining_total += 1;
                    self.draining.push((t + self.cfg.grace_s, h));
                }
                preempted_nodes += 1;
                self.counts.preempted_nodes += 1;
            }
            self.send(&Event::NodeClaimed { node: c.node }, t)?;
        }
        // 4. Plan-wide reclaim forecasts.
        while let Some(&(ft, f)) = tr.forecasts.get(*fi).filter(|f| f.0 <= tabs) {
            let _ = ft;
            *fi += 1;
            self.forecast = f.map(|r| r as f64);
            for k in 0..self.idle_list.len() {
                let ev = Event::NodeIdle {
                    node: self.idle_list[k],
                    reclaim_at: self.forecast,
                };
                self.send(&ev, t)?;
            }
        }
        // 5. Preemption charges: once per job per event, at the rate before the loss.
        for k in 0..self.preempted.len() {
            let (j, r) = self.preempted[k];
            let charge = (self.recs[j as usize].scale_down_s - self.cfg.grace_s).max(0.0) * r;
            let s = &mut self.jobs[j as usize];
            s.progress -= charge;
            s.preempt_loss += charge;
            self.record_size(t, j);
        }
        // 5b. Completions at trace events: after this event's preemption charges, as
        // BFTrainer's replayer accounts them.
        if self.cfg.steps == Steps::Trace {
            self.complete_jobs(t)?;
        }
        // 6. Submissions.
        while let Some(rec) = self.recs.get(*ji).filter(|r| r.submit <= tabs) {
            let spec = ElasticSpec {
                name: rec.name.clone(),
                min_nodes: rec.min_nodes,
                max_nodes: rec.max_nodes,
                scale_up_s: rec.scale_up_s,
                scale_down_s: rec.scale_down_s,
                objective: match self.cfg.objective {
                    Objective::File => rec.objective.clone(),
                    Objective::Samples => rec.rate.clone(),
                },
            };
            let job = *ji as JobId;
            self.jobs.push(SimJob {
                progress: 0.0,
                n: 0,
                draining: 0,
                submitted: true,
                first_admit: None,
                finished: None,
                node_s: 0.0,
                gross: 0.0,
                rescale_loss: 0.0,
                preempt_loss: 0.0,
                overrun_loss: 0.0,
                last_size: 0,
            });
            *ji += 1;
            self.send(&Event::JobSubmitted { job, spec }, t)?;
            if self.cfg.report_progress {
                let remaining =
                    Some(self.recs[job as usize].total_samples * self.objective_scale(job));
                self.send(
                    &Event::Progress {
                        job,
                        samples_per_s: 0.0,
                        remaining,
                    },
                    t,
                )?;
            }
        }
        // 7. Decide.
        if self.cfg.report_progress {
            self.scratch.clear();
            self.scratch.extend_from_slice(self.engine.active());
            for k in 0..self.scratch.len() {
                let j = self.scratch[k];
                let (s, rec) = (&self.jobs[j as usize], &self.recs[j as usize]);
                let scale = self.objective_scale(j);
                let ev = Event::Progress {
                    job: j,
                    samples_per_s: rate(rec, s.n + s.draining),
                    remaining: Some(((rec.total_samples - s.progress) * scale).max(0.0)),
                };
                self.send(&ev, t)?;
            }
        }
        let before = (self.engine.stats.decisions, self.engine.stats.kept);
        let c0 = (hooks.clock)();
        let actions = self.send(&Event::Tick, t)?;
        let took = (hooks.clock)() - c0;
        let decided = self.engine.stats.decisions > before.0;
        if decided {
            self.decision_s.push(took);
        }
        let (mut grown, mut shrunk) = (0u32, 0u32);
        for a in &actions {
            let j = a.job();
            let rec = &self.recs[j as usize];
            let s = &mut self.jobs[j as usize];
            let r = rate(rec, s.n + s.draining);
            let k = a.nodes().len() as u32;
            match a {
                Action::Admit { nodes, .. } | Action::Grow { nodes, .. } => {
                    for &n in nodes {
                        if check && (!self.idle[n as usize] || self.holder[n as usize] != NONE) {
                            return Err(self.violation(
                                t,
                                format!(
                                    "job {j} grows onto node {n}, which is {}",
                                    if self.idle[n as usize] {
                                        "held by another job"
                                    } else {
                                        "not idle"
                                    }
                                ),
                            ));
                        }
                        self.holder[n as usize] = j;
                    }
                    let s = &mut self.jobs[j as usize];
                    let charge = rec.scale_up_s * r;
                    s.progress -= charge;
                    s.rescale_loss += charge;
                    s.n += k;
                    s.first_admit.get_or_insert(t);
                    self.held_total += k;
                    grown += k;
                }
                Action::Shrink { nodes, .. } | Action::Requeue { nodes, .. } => {
                    for &n in nodes {
                        if check && self.holder[n as usize] != j {
                            return Err(self.violation(
                                t,
                                format!("job {j} shrinks off node {n}, which it does not hold"),
                            ));
                        }
                        self.holder[n as usize] = NONE;
                    }
                    let s = &mut self.jobs[j as usize];
                    let charge = rec.scale_down_s * r;
                    s.progress -= charge;
                    s.rescale_loss += charge;
                    s.n -= k;
                    self.held_total -= k;
                    shrunk += k;
                }
            }
            self.counts.actions.count(a);
            self.record_size(t, j);
        }
        if check {
            self.check_state(t, decided && self.engine.stats.kept == before.1)?;
        }
        if self.cfg.record {
            let samples = self.jobs.iter().map(|s| s.progress).sum();
            self.out.steps.push(StepRecord {
                t: self.t0 + t,
                idle_nodes: self.idle_list.len() as u32,
                harvested_nodes: self.held_total,
                active_jobs: self.engine.active().len() as u32,
                queued_jobs: self.engine.queued() as u32,
                finished_jobs: self.counts.finished,
                grown_nodes: grown,
                shrunk_nodes: shrunk,
                preempted_nodes,
                samples,
                decision_s: if decided { took } else { 0.0 },
            });
        }
        Ok(())
    }

    /// The checks that hold after every step; `fresh` when a decision was just applied.
    fn check_state(&self, t: f64, fresh: bool) -> Result<()> {
        let mut held = 0u32;
        for &j in self.engine.active() {
            let (s, rec) = (&self.jobs[j as usize], &self.recs[j as usize]);
            let nodes = self.engine.job_nodes(j);
            if nodes.len() as u32 != s.n {
                return Err(self.violation(
                    t,
                    format!(
                        "job {} holds {} nodes in the engine but {} in the model",
                        rec.name,
                        nodes.len(),
                        s.n
                    ),
                ));
            }
            if s.n > rec.max_nodes {
                return Err(self.violation(
                    t,
                    format!(
                        "job {} holds {} nodes, above its max {}",
                        rec.name, s.n, rec.max_nodes
                    ),
                ));
            }
            if fresh && s.n != 0 && s.n < rec.min_nodes {
                return Err(self.violation(
                    t,
                    format!(
                        "job {} left on {} nodes after a decision, below its min {}",
                        rec.name, s.n, rec.min_nodes
                    ),
                ));
            }
            for &n in nodes {
                if self.holder[n as usize] != j || !self.idle[n as usize] {
                    return Err(self.violation(
                        t,
                        format!(
                            "node {n} of job {} is not idle or is held by another job",
                            rec.name
                        ),
                    ));
                }
            }
            held += s.n;
        }
        if held != self.held_total {
            return Err(self.violation(
                t,
                format!(
                    "active jobs hold {held} nodes, model counts {}",
                    self.held_total
                ),
            ));
        }
        Ok(())
    }

    fn finish(mut self, t_end: f64) -> Result<Outcome> {
        let tr = self.trace;
        if self.cfg.check {
            let gap = self.idle_ns - self.harvested_ns - self.unused_ns;
            if gap.abs() > 1e-6 * self.idle_ns.max(1.0) {
                return Err(self.violation(
                    t_end,
                    format!(
                        "node-seconds not conserved: idle {} != harvested {} + unused {}",
                        self.idle_ns, self.harvested_ns, self.unused_ns
                    ),
                ));
            }
        }
        // A job past its total that no event saw done (Steps::Trace, cut windows): the
        // excess is overrun, not work.
        for (s, rec) in self.jobs.iter_mut().zip(self.recs) {
            if s.progress > rec.total_samples {
                s.overrun_loss += s.progress - rec.total_samples;
                s.progress = rec.total_samples;
            }
        }
        let mut per_job = Vec::with_capacity(self.jobs.len());
        let mut jcts = Vec::new();
        for (j, s) in self.jobs.iter().enumerate() {
            let rec = &self.recs[j];
            let submit_rel = ((rec.submit - tr.start) as f64).max(0.0);
            let jct = s.finished.map(|f| f - submit_rel);
            if let Some(x) = jct {
                jcts.push(x);
            }
            per_job.push(JobReport {
                name: rec.name.clone(),
                submit: format_time(rec.submit),
                status: match self.engine.job_status(j as u32) {
                    JobStatus::Queued => "queued",
                    JobStatus::Active => "running",
                    JobStatus::Finished => "finished",
                    JobStatus::Cancelled => "cancelled",
                }
                .into(),
                first_admit_s: s.first_admit.map(|a| a - submit_rel),
                jct_s: jct,
                samples: s.progress.max(0.0).min(rec.total_samples),
                node_h: s.node_s / 3600.0,
                rescale_loss_samples: s.rescale_loss,
                preemption_loss_samples: s.preempt_loss,
                overrun_loss_samples: s.overrun_loss,
            });
            let _ = s.submitted;
        }
        jcts.sort_by(f64::total_cmp);
        let samples: f64 = self.jobs.iter().map(|s| s.progress).sum();
        let gross: f64 = self.jobs.iter().map(|s| s.gross).sum();
        let mut ds = self.decision_s.clone();
        ds.sort_by(f64::total_cmp);
        let c = &self.counts;
        self.out.report = Report {
            start: format_time(tr.start),
            end: format_time(tr.start + t_end.round() as i64),
            hours: t_end / 3600.0,
            nodes: tr.names.len(),
            mean_idle_nodes: if t_end > 0.0 {
                self.idle_ns / t_end
            } else {
                0.0
            },
            idle_node_h: self.idle_ns / 3600.0,
            harvested_node_h: self.harvested_ns / 3600.0,
            harvest_share: if self.idle_ns > 0.0 {
                self.harvested_ns / self.idle_ns
            } else {
                0.0
            },
            useful_node_h: self.useful_ns / 3600.0,
            unused_node_h: self.unused_ns / 3600.0,
            grace_node_h: self.grace_ns / 3600.0,
            samples,
            samples_dedicated: gross,
            efficiency: if gross > 0.0 { samples / gross } else { 0.0 },
            rescale_loss_samples: self.jobs.iter().map(|s| s.rescale_loss).sum(),
            preemption_loss_samples: self.jobs.iter().map(|s| s.preempt_loss).sum(),
            overrun_loss_samples: self.jobs.iter().map(|s| s.overrun_loss).sum(),
            actions: c.actions,
            preempted_nodes: c.preempted_nodes,
            jobs_in_file: self.recs.len(),
            jobs_submitted: self.jobs.len(),
            jobs_admitted: self.jobs.iter().filter(|s| s.first_admit.is_some()).count(),
            jobs_completed: jcts.len(),
            jct_mean_s: (!jcts.is_empty()).then(|| jcts.iter().sum::<f64>() / jcts.len() as f64),
            jct_p50_s: percentile(&jcts, 0.50),
            jct_p95_s: percentile(&jcts, 0.95),
            decisions: self.engine.stats.decisions,
            decisions_kept: self.engine.stats.kept,
            decision_total_s: ds.iter().sum(),
            decision_mean_ms: if ds.is_empty() {
                0.0
            } else {
                1e3 * ds.iter().sum::<f64>() / ds.len() as f64
            },
            decision_p99_ms: percentile(&ds, 0.99).unwrap_or(0.0) * 1e3,
            decision_max_ms: ds.last().copied().unwrap_or(0.0) * 1e3,
            jobs: per_job,
        };
        Ok(self.out)
    }
}
