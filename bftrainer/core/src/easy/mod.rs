//! The main scheduler's model for SWF logs: FCFS with EASY (or conservative) backfilling
//! turns a job log into a node-idle trace plus the backfill plan's reclaim forecasts.

use crate::error::{Error, Result};
use crate::trace::swf::{SwfFile, SwfHeader, SwfJob, SwfLog};
use crate::trace::{Head, NodeChange, NodeEvents, NodeTrace, TraceItem};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// Backfilling flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backfill {
    /// Only the queue head holds a reservation; later jobs may start early if they do not
    /// delay it (Lifka's EASY).
    Easy,
    /// Every queued job holds a reservation; a job may start early only if it delays none.
    Conservative,
}

/// Whether to simulate the scheduler or trust the log's own start times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartTimes {
    /// Use the log's start times (submit + wait) when every job has a wait time.
    Auto,
    Simulate,
    Log,
}

#[derive(Debug, Clone)]
pub struct SchedConfig {
    pub backfill: Backfill,
    pub start_times: StartTimes,
    /// Machine size; default: the log's MaxNodes.
    pub nodes: Option<u32>,
    /// Processors per node; default MaxProcs / MaxNodes, else 1.
    pub procs_per_node: Option<u32>,
    /// Unix time of the log's time 0; default the log's UnixStartTime, else 0.
    pub epoch: Option<i64>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            backfill: Backfill::Easy,
            start_times: StartTimes::Auto,
            nodes: None,
            procs_per_node: None,
            epoch: None,
        }
    }
}

/// The scheduler's own figures, so its sanity can be judged.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SchedMetrics {
    pub policy: String,
    pub nodes: u32,
    pub procs_per_node: u32,
    pub jobs_scheduled: u64,
    /// Jobs without a size or with zero run time: they never hold a node.
    pub jobs_skipped_empty: u64,
    /// Jobs wider than the machine.
    pub jobs_skipped_too_wide: u64,
    /// Jobs whose run time SWF does not allow (negative other than -1, unknown) or
    /// above [`MAX_RUN_S`].
    pub jobs_skipped_bad_run_time: u64,
    /// The first skipped job of each cause but empty ones (which SWF allows): where the
    /// caller can point.
    #[serde(skip)]
    pub first_skipped: Vec<Skipped>,
    /// Log start mode only: jobs that started while fewer nodes were free than they
    /// needed (the log's machine was larger or nodes were shared).
    pub jobs_overcommitted: u64,
    /// Busy node-seconds over nodes x (last end - first submit).
    pub utilisation: f64,
    pub mean_wait_s: f64,
    pub max_wait_s: f64,
    /// Mean of max(1, (wait + run) / max(run, 10 s)).
    pub mean_bounded_slowdown: f64,
    pub makespan_s: i64,
}

/// Longest run time a job may have, seconds (365 days): beyond it the log is corrupt.
pub const MAX_RUN_S: i64 = 365 * 86_400;

/// Why a job of the log was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipCause {
    /// It needs more nodes than the machine has.
    TooWide,
    /// Run time below -1 or above [`MAX_RUN_S`].
    BadRunTime,
}

/// The first job left out for a cause: where it is in the log, and the nodes it needs
/// (`TooWide`) or its run time (`BadRunTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    pub cause: SkipCause,
    pub value: i64,
    /// The job's number, processors and file line.
    pub id: i64,
    pub procs: Option<i64>,
    pub line: u64,
}

/// A job ready for the model: sizes in nodes, times in log seconds.
#[derive(Debug, Clone, Copy)]
struct Job {
    submit: i64,
    run: i64,
    est: i64,
    need: u32,
    log_start: Option<i64>,
}

struct Running {
    est_end: i64,
    nodes: Vec<u32>,
}

/// One pass over a log's jobs: each with its file line, or the error that ended the pass.
pub type JobPass<'a> = Box<dyn Iterator<Item = Result<(SwfJob, u64)>> + 'a>;

/// The jobs of a log in submit order, with their file lines. A replay reads them more
/// than once (see [`plan`]), so a source hands out a fresh pass on each call: a file is
/// read again, never held.
pub trait JobSource {
    /// The log's header (known before the jobs are read again).
    fn header(&self) -> SwfHeader;
    /// One pass over the jobs, in submit order.
    fn jobs(&self) -> Result<JobPass<'_>>;
}

impl JobSource for SwfLog {
    fn header(&self) -> SwfHeader {
        SwfLog::header(self)
    }
    fn jobs(&self) -> Result<JobPass<'_>> {
        Ok(Box::new(
            self.jobs
                .iter()
                .enumerate()
                .map(|(i, j)| Ok((j.clone(), i as u64 + 1))),
        ))
    }
}

impl JobSource for SwfFile {
    fn header(&self) -> SwfHeader {
        self.log.header()
    }
    fn jobs(&self) -> Result<JobPass<'_>> {
        Ok(Box::new(
            self.log
                .jobs
                .iter()
                .zip(&self.lines)
                .map(|(j, &l)| Ok((j.clone(), l))),
        ))
    }
}

/// The machine the log is replayed on.
#[derive(Debug, Clone, Copy)]
struct Machine {
    nodes: u32,
    ppn: i64,
    /// Unix time of the log's time 0.
    epoch: i64,
}

fn machine(h: &SwfHeader, cfg: &SchedConfig) -> Result<Machine> {
    let nodes = cfg
        .nodes
        .map(i64::from)
        .or(h.max_nodes)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            Error::Config(
                "the SWF log has no MaxNodes header: give the machine size (--nodes)".into(),
            )
        })?;
    let nodes = u32::try_from(nodes)
        .map_err(|_| Error::Config(format!("machine size {nodes} too large")))?;
    let ppn = match (cfg.procs_per_node, h.max_procs, h.max_nodes) {
        (Some(p), _, _) if p > 0 => i64::from(p),
        (Some(_), _, _) => return Err(Error::Config("--procs-per-node must be >= 1".into())),
        (None, Some(p), Some(n)) if p > 0 && n > 0 && p % n == 0 => p / n,
        _ => 1,
    };
    Ok(Machine {
        nodes,
        ppn,
        epoch: cfg.epoch.or(h.unix_start).unwrap_or(0),
    })
}

/// The model's view of a log's job, or `None` (counted in `m`) when the model cannot
/// use it.
fn usable(j: &SwfJob, line: u64, mach: &Machine, m: &mut SchedMetrics) -> Option<Job> {
    let mut skip = |cause: SkipCause, value: i64| {
        if !m.first_skipped.iter().any(|s| s.cause == cause) {
            m.first_skipped.push(Skipped {
                cause,
                value,
                id: j.id,
                procs: j.procs,
                line,
            });
        }
    };
    if j.run < -1 || j.run > MAX_RUN_S {
        skip(SkipCause::BadRunTime, j.run);
        m.jobs_skipped_bad_run_time += 1;
        return None;
    }
    let Some(p) = j.procs.filter(|_| j.run > 0) else {
        m.jobs_skipped_empty += 1;
        return None;
    };
    let need = (p + mach.ppn - 1) / mach.ppn;
    if need > i64::from(mach.nodes) {
        skip(SkipCause::TooWide, need);
        m.jobs_skipped_too_wide += 1;
        return None;
    }
    Some(Job {
        submit: j.submit,
        run: j.run,
        est: j.req_time.unwrap_or(j.run).clamp(1, MAX_RUN_S),
        need: need as u32,
        log_start: j.wait.map(|w| j.submit + w),
    })
}

/// What the first passes over a log found: the scheduler's metrics and the window of
/// its idle trace. [`events`] then replays the same schedule as a stream.
#[derive(Debug, Clone)]
pub struct Plan {
    pub metrics: SchedMetrics,
    /// Unix seconds: the first job's submission and the last job's end.
    pub start: i64,
    pub end: i64,
    machine: Machine,
    backfill: Backfill,
    use_log: bool,
}

impl Plan {
    /// The machine's size in nodes (the trace's node count).
    pub fn nodes(&self) -> usize {
        self.machine.nodes as usize
    }
}

/// Runs the scheduler model over a log for its metrics and window, keeping no trace:
/// one pass decides the start times (the log's own when `cfg` allows and every job has
/// one), one runs the model.
pub fn plan(src: &dyn JobSource, cfg: &SchedConfig) -> Result<Plan> {
    let mach = machine(&src.header(), cfg)?;
    let use_log = match cfg.start_times {
        StartTimes::Simulate => false,
        StartTimes::Log | StartTimes::Auto => {
            let (mut any, mut missing) = (false, None);
            let mut m = SchedMetrics::default();
            for r in src.jobs()? {
                let (j, line) = r?;
                if let Some(job) = usable(&j, line, &mach, &mut m) {
                    any = true;
                    if job.log_start.is_none() {
                        missing = Some(j.id);
                        break;
                    }
                }
            }
            match (cfg.start_times, missing) {
                (StartTimes::Log, Some(id)) => {
                    return Err(Error::Config(format!(
                        "--start-times log: job {id} of the log has no wait time"
                    )))
                }
                (StartTimes::Log, None) => true,
                (_, missing) => any && missing.is_none(),
            }
        }
    };
    let mut st = Stepper::new(src.jobs()?, mach, cfg.backfill, use_log);
    while st.step()? {
        st.out.clear();
    }
    let (metrics, start, end) = st.finish();
    Ok(Plan {
        metrics,
        start,
        end,
        machine: mach,
        backfill: cfg.backfill,
        use_log,
    })
}

/// The idle trace of a planned log (node names `n0000`...), computed as the replay
/// reads it: the model holds only the running and queued jobs.
pub fn events<'a>(src: &'a dyn JobSource, plan: &Plan) -> Result<EasyEvents<'a>> {
    let nodes = plan.machine.nodes;
    Ok(EasyEvents {
        st: Stepper::new(src.jobs()?, plan.machine, plan.backfill, plan.use_log),
        names: (0..nodes).map(|i| format!("n{i:04}")).collect(),
        initial: vec![true; nodes as usize],
        start: plan.start,
        end: plan.end,
    })
}

/// Runs the scheduler model over a log; returns the idle trace (node names `n0000`...),
/// whole, and the scheduler's metrics.
pub fn schedule(log: &SwfLog, cfg: &SchedConfig) -> Result<(NodeTrace, SchedMetrics)> {
    let p = plan(log, cfg)?;
    let tr = NodeTrace::collect(&mut events(log, &p)?)?;
    Ok((tr, p.metrics))
}

/// The schedule of a log as [`NodeEvents`].
pub struct EasyEvents<'a> {
    st: Stepper<'a>,
    names: Vec<String>,
    initial: Vec<bool>,
    start: i64,
    end: i64,
}

impl NodeEvents for EasyEvents<'_> {
    fn head(&self) -> Head<'_> {
        Head {
            names: &self.names,
            initial_idle: &self.initial,
            start: self.start,
            end: self.end,
        }
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        while self.st.out.is_empty() && self.st.step()? {}
        Ok(self.st.out.front().copied())
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.peek()?;
        Ok(self.st.out.pop_front())
    }
}

/// A queued job (simulated start times).
struct Queued {
    /// Index among the model's jobs.
    idx: usize,
    job: Job,
    started: bool,
}

/// The scheduler's metrics summed in job order (so that float sums do not depend on the
/// order jobs start in): a job's figures wait here until every earlier job has started.
#[derive(Default)]
struct Acc {
    next: usize,
    held: BTreeMap<usize, (Job, i64)>,
    busy: f64,
    wait_sum: f64,
    bsld_sum: f64,
    max_wait: f64,
    last_end: Option<i64>,
}

impl Acc {
    fn add(&mut self, idx: usize, job: &Job, start: i64) {
        if idx != self.next {
            self.held.insert(idx, (*job, start));
            return;
        }
        self.fold(job, start);
        while let Some((j, s)) = self.held.remove(&self.next) {
            self.fold(&j, s);
        }
    }

    fn fold(&mut self, j: &Job, s: i64) {
        let w = (s - j.submit) as f64;
        self.busy += f64::from(j.need) * j.run as f64;
        self.wait_sum += w;
        self.max_wait = self.max_wait.max(w);
        self.bsld_sum += ((w + j.run as f64) / (j.run as f64).max(10.0)).max(1.0);
        self.last_end = Some(self.last_end.map_or(s + j.run, |e| e.max(s + j.run)));
        self.next += 1;
    }
}

/// The model stepping one event time at a time; its output for each time goes to `out`.
struct Stepper<'a> {
    jobs: JobPass<'a>,
    mach: Machine,
    use_log: bool,
    model: Model,
    /// The next usable job of the log (index among usable jobs), read ahead.
    ahead: Option<(usize, Job)>,
    read: usize,
    first_submit: Option<i64>,
    m: SchedMetrics,
    acc: Acc,
    /// Simulated start times: the queue in submit order.
    queue: Vec<Queued>,
    /// The log's start times: jobs submitted but not started, by (start, index).
    pending: BTreeMap<(i64, usize), Job>,
    out: VecDeque<TraceItem>,
    done: bool,
}

impl<'a> Stepper<'a> {
    fn new(jobs: JobPass<'a>, mach: Machine, backfill: Backfill, use_log: bool) -> Self {
        let m = SchedMetrics {
            policy: if use_log {
                "log start times".into()
            } else {
                match backfill {
                    Backfill::Easy => "fcfs+easy".into(),
                    Backfill::Conservative => "fcfs+conservative".into(),
                }
            },
            nodes: mach.nodes,
            procs_per_node: mach.ppn as u32,
            ..Default::default()
        };
        Self {
            jobs,
            mach,
            use_log,
            model: Model::new(mach.nodes, backfill),
            ahead: None,
            read: 0,
            first_submit: None,
            m,
            acc: Acc::default(),
            queue: Vec::new(),
            pending: BTreeMap::new(),
            out: VecDeque::new(),
            done: false,
        }
    }

    /// Reads the next usable job into `ahead` unless one is there.
    fn fill(&mut self) -> Result<()> {
        while self.ahead.is_none() {
            let Some(r) = self.jobs.next() else {
                return Ok(());
            };
            let (j, line) = r?;
            if let Some(job) = usable(&j, line, &self.mach, &mut self.m) {
                self.first_submit =
                    Some(self.first_submit.map_or(job.submit, |f| f.min(job.submit)));
                self.ahead = Some((self.read, job));
                self.read += 1;
            }
        }
        Ok(())
    }

    /// Runs the model's next event time; false when no event is left.
    fn step(&mut self) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let more = if self.use_log {
            self.step_log()?
        } else {
            self.step_simulated()?
        };
        self.done = !more;
        Ok(more)
    }

    fn next_end(&self) -> Option<i64> {
        self.model.ends.peek().map(|r| r.0 .0)
    }

    fn step_simulated(&mut self) -> Result<bool> {
        self.fill()?;
        let next_sub = self.ahead.map(|(_, j)| j.submit);
        let Some(t) = next_sub.into_iter().chain(self.next_end()).min() else {
            return Ok(false);
        };
        self.model.finish_until(t);
        while let Some((idx, job)) = self.ahead.filter(|(_, j)| j.submit == t) {
            self.queue.push(Queued {
                idx,
                job,
                started: false,
            });
            self.ahead = None;
            self.fill()?;
        }
        let starts = self.model.starts;
        let forecast = match self.model.backfill {
            Backfill::Easy => self.model.pass_easy(t, &mut self.queue, &mut self.acc),
            Backfill::Conservative => {
                self.model
                    .pass_conservative(t, &mut self.queue, &mut self.acc)
            }
        };
        if self.model.starts > starts {
            self.queue.retain(|q| !q.started);
        }
        self.model.emit(t, forecast, self.mach.epoch, &mut self.out);
        Ok(true)
    }

    fn step_log(&mut self) -> Result<bool> {
        // A job starts no earlier than its submission: every job that could start by
        // the next event time is read before that time is run.
        let t = loop {
            self.fill()?;
            let next_start = self.pending.keys().next().map(|k| k.0);
            let cand = next_start.into_iter().chain(self.next_end()).min();
            match self.ahead {
                Some((idx, job)) if cand.map_or(true, |c| job.submit <= c) => {
                    let start = job.log_start.unwrap_or(job.submit);
                    self.acc.add(idx, &job, start);
                    self.pending.insert((start, idx), job);
                    self.ahead = None;
                }
                _ => break cand,
            }
        };
        let Some(t) = t else {
            return Ok(false);
        };
        self.model.finish_until(t);
        while let Some(e) = self.pending.first_entry().filter(|e| e.key().0 == t) {
            let job = e.remove();
            if !self.model.start(t, &job) {
                self.m.jobs_overcommitted += 1;
            }
        }
        self.model.emit(t, None, self.mach.epoch, &mut self.out);
        Ok(true)
    }

    /// The metrics and the trace's window (Unix seconds), once every step has run.
    fn finish(mut self) -> (SchedMetrics, i64, i64) {
        debug_assert!(self.acc.held.is_empty() && self.acc.next == self.read);
        let m = &mut self.m;
        let a = &self.acc;
        let first_submit = self.first_submit.unwrap_or(0);
        let last_end = a.last_end.map_or(first_submit, |e| e.max(first_submit));
        let n = self.read.max(1) as f64;
        m.jobs_scheduled = self.read as u64;
        m.makespan_s = last_end - first_submit;
        m.utilisation = if m.makespan_s > 0 {
            a.busy / (f64::from(self.mach.nodes) * m.makespan_s as f64)
        } else {
            0.0
        };
        m.mean_wait_s = a.wait_sum / n;
        m.max_wait_s = a.max_wait;
        m.mean_bounded_slowdown = a.bsld_sum / n;
        let epoch = self.mach.epoch;
        (self.m, first_submit + epoch, last_end + epoch)
    }
}

/// The free nodes as a bit set: the lowest-numbered first, in a few word operations
/// per node (a year of a 4,000-node log allocates tens of millions of nodes).
struct FreeNodes {
    words: Vec<u64>,
    len: usize,
    /// No word below this one has a bit set.
    low: usize,
}

impl FreeNodes {
    fn all(nodes: u32) -> Self {
        let n = nodes as usize;
        let mut words = vec![u64::MAX; n.div_ceil(64)];
        if n % 64 != 0 {
            words[n / 64] = (1u64 << (n % 64)) - 1;
        }
        Self {
            words,
            len: n,
            low: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn pop_lowest(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        while self.words[self.low] == 0 {
            self.low += 1;
        }
        let w = &mut self.words[self.low];
        let bit = w.trailing_zeros();
        *w &= *w - 1;
        self.len -= 1;
        Some((self.low * 64) as u32 + bit)
    }

    fn insert(&mut self, n: u32) {
        let (i, bit) = (n as usize / 64, n % 64);
        debug_assert!(self.words[i] & (1 << bit) == 0, "node {n} freed twice");
        self.words[i] |= 1 << bit;
        self.len += 1;
        self.low = self.low.min(i);
    }
}

struct Model {
    backfill: Backfill,
    free: FreeNodes,
    /// Running jobs by slot; a slot is reused once its job ends.
    running: Vec<Option<Running>>,
    free_slots: Vec<usize>,
    /// (actual end, start sequence number, running slot): jobs ending together end in
    /// the order they started.
    ends: BinaryHeap<Reverse<(i64, u64, usize)>>,
    /// Jobs started so far.
    starts: u64,
    idle: Vec<bool>,
    emitted: Vec<bool>,
    touched: Vec<u32>,
    forecast: Option<i64>,
}

impl Model {
    fn new(nodes: u32, backfill: Backfill) -> Self {
        Self {
            backfill,
            free: FreeNodes::all(nodes),
            running: Vec::new(),
            free_slots: Vec::new(),
            ends: BinaryHeap::new(),
            starts: 0,
            idle: vec![true; nodes as usize],
            emitted: vec![true; nodes as usize],
            touched: Vec::new(),
            forecast: None,
        }
    }

    /// Starts a job on the lowest-numbered free nodes (at most `need`, fewer only when
    /// replaying an inconsistent log).
    fn start(&mut self, t: i64, j: &Job) -> bool {
        let k = (j.need as usize).min(self.free.len());
        let mut nodes = Vec::with_capacity(k);
        for _ in 0..k {
            let n = self.free.pop_lowest().expect("counted");
            self.idle[n as usize] = false;
            self.touched.push(n);
            nodes.push(n);
        }
        let r = Some(Running {
            est_end: t + j.est,
            nodes,
        });
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.running[s] = r;
                s
            }
            None => {
                self.running.push(r);
                self.running.len() - 1
            }
        };
        self.ends.push(Reverse((t + j.run, self.starts, slot)));
        self.starts += 1;
        k == j.need as usize
    }

    fn finish_until(&mut self, t: i64) {
        while let Some(&Reverse((e, _, slot))) = self.ends.peek() {
            if e > t {
                break;
            }
            self.ends.pop();
            let r = self.running[slot].take().expect("ends once");
            self.free_slots.push(slot);
            for n in r.nodes {
                self.idle[n as usize] = true;
                self.touched.push(n);
                self.free.insert(n);
            }
        }
    }

    /// Emits the net changes of time t (a node freed and retaken at t emits nothing),
    /// after the forecast when it changed; `epoch` makes log times Unix times.
    fn emit(&mut self, t: i64, forecast: Option<i64>, epoch: i64, out: &mut VecDeque<TraceItem>) {
        if forecast != self.forecast {
            self.forecast = forecast;
            out.push_back(TraceItem::Forecast(t + epoch, forecast.map(|f| f + epoch)));
        }
        for &n in &self.touched {
            let i = n as usize;
            if self.idle[i] != self.emitted[i] {
                self.emitted[i] = self.idle[i];
                out.push_back(TraceItem::Change(NodeChange {
                    t: t + epoch,
                    node: n,
                    idle: self.idle[i],
                    reclaim_at: None,
                }));
            }
        }
        self.touched.clear();
    }

    /// Running jobs' (estimated end, width), sorted; an overrunning job is expected to
    /// end now.
    fn release_profile(&self, t: i64) -> Vec<(i64, u32)> {
        let mut rel: Vec<(i64, u32)> = self
            .running
            .iter()
            .flatten()
            .map(|r| (r.est_end.max(t), r.nodes.len() as u32))
            .collect();
        rel.sort_unstable();
        rel
    }

    /// One EASY pass at t; returns the head's reservation time when it must wait. Jobs it
    /// starts are marked started (and counted in `acc`); the caller drops them from
    /// `queue`.
    fn pass_easy(&mut self, t: i64, queue: &mut Vec<Queued>, acc: &mut Acc) -> Option<i64> {
        let mut head = 0;
        while head < queue.len() && queue[head].job.need as usize <= self.free.len() {
            let q = &queue[head];
            acc.add(q.idx, &q.job, t);
            self.start(t, &q.job);
            head += 1;
        }
        queue.drain(..head);
        let need = queue.first()?.job.need;
        let mut avail = self.free.len() as u32;
        let (mut shadow, mut extra) = (i64::MAX, 0u32);
        for (e, w) in self.release_profile(t) {
            avail += w;
            if avail >= need {
                (shadow, extra) = (e, avail - need);
                break;
            }
        }
        for q in queue.iter_mut().skip(1) {
            if self.free.is_empty() {
                break;
            }
            let j = q.job;
            if j.need as usize > self.free.len() {
                continue;
            }
            let before_shadow = t + j.est <= shadow;
            if before_shadow || j.need <= extra {
                if !before_shadow {
                    extra -= j.need;
                }
                q.started = true;
                acc.add(q.idx, &j, t);
                self.start(t, &j);
            }
        }
        (shadow != i64::MAX).then_some(shadow)
    }

    /// One conservative pass: every queued job, in order, gets the earliest slot in the
    /// availability profile that fits it; jobs whose slot is now start (as in
    /// `pass_easy`). Returns the earliest future reservation.
    fn pass_conservative(&mut self, t: i64, queue: &mut [Queued], acc: &mut Acc) -> Option<i64> {
        // Step function: prof[i] = (from time, free nodes) until prof[i+1].0.
        let mut prof: Vec<(i64, i64)> = vec![(t, self.free.len() as i64)];
        for (e, w) in self.release_profile(t) {
            let last = *prof.last().expect("non-empty");
            if e == last.0 {
                prof.last_mut().expect("non-empty").1 += i64::from(w);
            } else {
                prof.push((e, last.1 + i64::from(w)));
            }
        }
        let mut first_res: Option<i64> = None;
        for q in queue.iter_mut() {
            let j = q.job;
            let need = i64::from(j.need);
            // Earliest breakpoint s such that free >= need on [s, s + est).
            let mut s_idx = None;
            'outer: for i in 0..prof.len() {
                if prof[i].1 < need {
                    continue;
                }
                let s = prof[i].0;
                for p in &prof[i + 1..] {
                    if p.0 >= s + j.est {
                        break;
                    }
                    if p.1 < need {
                        continue 'outer;
                    }
                }
                s_idx = Some(i);
                break;
            }
            let Some(i) = s_idx else { continue };
            let s = prof[i].0;
            let e = s + j.est;
            // Split the profile at e, then take `need` nodes over [s, e).
            let pos = prof.partition_point(|p| p.0 < e);
            if pos == prof.len() || prof[pos].0 != e {
                let v = prof[pos - 1].1;
                prof.insert(pos, (e, v));
            }
            for p in &mut prof[i..pos] {
                p.1 -= need;
            }
            if s == t && j.need as usize <= self.free.len() {
                q.started = true;
                acc.add(q.idx, &j, t);
                self.start(t, &j);
            } else if s > t {
                first_res = Some(first_res.map_or(s, |f: i64| f.min(s)));
            }
        }
        first_res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::swf::SwfJob;

    fn log(jobs: &[(i64, i64, i64, i64)]) -> SwfLog {
        SwfLog {
            max_nodes: Some(4),
            max_procs: Some(4),
            unix_start: Some(0),
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, &(submit, run, procs, req))| SwfJob {
                    id: i as i64 + 1,
                    submit,
                    wait: None,
                    run,
                    procs: Some(procs),
                    req_time: Some(req),
                })
                .collect(),
        }
    }

    /// Hand-worked schedule on 4 nodes (submit, run, nodes, estimate):
    /// A(0,100,2,100) starts at 0 on n0,n1. B(1,50,4,50) waits: shadow = 100 (A's end),
    /// extra = 0. C(2,50,2,50) ends at 52 <= 100: backfills at 2 on n2,n3.
    /// D(3,200,1,200) would end after 100 and extra = 0: waits. At 52 C ends; n2,n3 idle,
    /// forecast still 100. At 100 A ends, B starts on n0..n3 (ends 150), D starts at 150.
    /// Waits: A 0, B 99, C 0, D 147 => mean 61.5.
    #[test]
    fn easy_matches_hand_worked_schedule() {
        let l = log(&[
            (0, 100, 2, 100),
            (1, 50, 4, 50),
            (2, 50, 2, 50),
            (3, 200, 1, 200),
        ]);
        let (tr, m) = schedule(&l, &SchedConfig::default()).unwrap();
        assert_eq!(m.mean_wait_s, (99.0 + 147.0) / 4.0);
        assert_eq!(m.makespan_s, 350);
        // busy = 2*100 + 4*50 + 2*50 + 1*200 = 700 over 4 * 350.
        assert!((m.utilisation - 700.0 / 1400.0).abs() < 1e-12);
        let ch: Vec<(i64, u32, bool)> = tr.changes.iter().map(|c| (c.t, c.node, c.idle)).collect();
        assert_eq!(
            ch,
            vec![
                (0, 0, false),
                (0, 1, false),
                (2, 2, false),
                (2, 3, false),
                (52, 2, true),
                (52, 3, true),
                (100, 2, false),
                (100, 3, false),
                (150, 1, true),
                (150, 2, true),
                (150, 3, true),
                (350, 0, true),
            ]
        );
        // B waits from t=1 with reservation at 100; nothing queued after 150.
        assert_eq!(
            tr.forecasts,
            vec![(1, Some(100)), (100, Some(150)), (150, None)]
        );
    }

    /// Conservative on the same log: D must not delay B's reservation [100,150) nor
    /// anything else; D (1 node, 200 s) fits at 3 only if a node stays free over
    /// [3, 203): n2,n3 are taken by C until 52 and B needs all 4 at 100, so D waits
    /// until 150 like EASY. E(4, 40, 1, 40) ends at 44 < 100 and one node... none free
    /// at 4 (A: 2, C: 2), so it starts when C ends at 52 and ends at 92 < 100.
    #[test]
    fn conservative_matches_hand_worked_schedule() {
        let l = log(&[
            (0, 100, 2, 100),
            (1, 50, 4, 50),
            (2, 50, 2, 50),
            (3, 200, 1, 200),
            (4, 40, 1, 40),
        ]);
        let cfg = SchedConfig {
            backfill: Backfill::Conservative,
            ..Default::default()
        };
        let (_, m) = schedule(&l, &cfg).unwrap();
        // Waits: A 0, B 99, C 0, D 147, E 48.
        assert_eq!(m.mean_wait_s, (99.0 + 147.0 + 48.0) / 5.0);
        let (_, me) = schedule(&l, &SchedConfig::default()).unwrap();
        // EASY: E starts at 52 too (ends 92 <= shadow 100).
        assert_eq!(me.mean_wait_s, m.mean_wait_s);
    }

    /// The model streams in bounded memory: over 20,000 jobs on 4 nodes (a load of 3.3
    /// nodes, so the queue stays short) its running slots, its output buffer and the
    /// metrics waiting for earlier jobs stay small, and the streamed trace is the one
    /// collected whole.
    #[test]
    fn streaming_holds_only_the_present() {
        let jobs: Vec<(i64, i64, i64, i64)> = (0..20_000)
            .map(|i| (i * 15, 15 + (i * 7) % 21, 1 + (i % 3), 40))
            .collect();
        for backfill in [Backfill::Easy, Backfill::Conservative] {
            let l = log(&jobs);
            let cfg = SchedConfig {
                backfill,
                ..Default::default()
            };
            let p = plan(&l, &cfg).unwrap();
            assert_eq!(p.metrics.jobs_scheduled, 20_000);
            let mut ev = events(&l, &p).unwrap();
            let (mut items, mut most_out, mut most_held, mut most_queued) = (0, 0, 0, 0);
            while ev.next().unwrap().is_some() {
                items += 1;
                most_out = most_out.max(ev.st.out.len());
                most_held = most_held.max(ev.st.acc.held.len());
                most_queued = most_queued.max(ev.st.queue.len());
            }
            assert!(items > 20_000);
            assert!(
                ev.st.model.running.len() <= 4,
                "{}",
                ev.st.model.running.len()
            );
            assert!(most_out <= 2 * 4 + 1, "{most_out}");
            assert!(
                most_queued < 50 && most_held < 50,
                "{most_queued} {most_held}"
            );
            let (tr, m) = schedule(&l, &cfg).unwrap();
            assert_eq!(m, p.metrics);
            assert_eq!((tr.start, tr.end), (p.start, p.end));
        }
    }

    #[test]
    fn log_start_times_are_used_when_known() {
        let mut l = log(&[(0, 5, 4, 5), (0, 10, 4, 10)]);
        l.jobs[0].wait = Some(5);
        l.jobs[1].wait = Some(15);
        let (tr, m) = schedule(&l, &SchedConfig::default()).unwrap();
        assert_eq!(m.policy, "log start times");
        assert_eq!(m.mean_wait_s, 10.0);
        assert_eq!(
            tr.changes
                .iter()
                .filter(|c| !c.idle)
                .map(|c| c.t)
                .collect::<Vec<_>>(),
            vec![5, 5, 5, 5, 15, 15, 15, 15]
        );
    }
}
