//! The I/O around `bftrainer_core::sim`: opening (gzip) inputs, the embedded sample,
//! the allocator, progress bar, and the outputs (table, JSON, per-step CSV, plots).

pub mod batch;
pub mod compare;
pub mod journal;
mod output;
mod plot;
mod record;
pub mod sacct;

use anyhow::{bail, Context};
use bftrainer_core::alloc::{Objective, Options as AllocOptions};
use bftrainer_core::easy::{
    self, Backfill, JobPass, JobSource, Plan, SchedConfig, SchedMetrics, StartTimes,
};
use bftrainer_core::engine::{
    EngineConfig, Exact, DEFAULT_MIN_SCALE_DOWN_S, DEFAULT_MIN_SCALE_UP_S,
};
use bftrainer_core::sim::cpus::{CpuModel, CpuPolicy};
use bftrainer_core::sim::nodes::{self, NodeTable};
use bftrainer_core::sim::{
    self, DaemonRules, Hooks, Objective as CurveChoice, Outcome, SimConfig, Steps, Workload,
};
use bftrainer_core::timefmt::parse_time;
use bftrainer_core::trace::jobs::{parse_jobs, JobRecord};
use bftrainer_core::trace::swf::{sort_swf, SwfHeader, SwfReader, SORT_CHUNK};
use bftrainer_core::trace::{
    scan_node_events, sort_node_events, CsvEvents, Cut, NodeEvents, NodeTrace, Order, Sorted,
    SortedTrace, TraceWindow, Windowed, SORT_CHUNK_ROWS,
};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub use output::print_table;
pub use plot::Format as PlotFormat;

/// The committed sample, embedded so that `bftrainer replay` works from any directory.
pub const SAMPLE_TRACE: &[u8] = include_bytes!("../../../../data/sample/summit-day.csv.gz");
pub const SAMPLE_JOBS: &[u8] = include_bytes!("../../../../data/sample/jobs-imagenet-200.csv");
pub const SAMPLE_TRACE_NAME: &str = "data/sample/summit-day.csv.gz";
pub const SAMPLE_JOBS_NAME: &str = "data/sample/jobs-imagenet-200.csv";

#[derive(Debug, Clone)]
pub enum Input {
    Sample,
    Trace(PathBuf),
    Swf(PathBuf),
    /// An engine journal: replayed into a fresh engine, not through the job model.
    Journal(PathBuf),
    /// Slurm accounting over [START, END), leaving out these partitions' jobs.
    Sacct {
        start: String,
        end: String,
        exclude: Vec<String>,
    },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub input: Input,
    pub jobs: Option<PathBuf>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub hours: Option<f64>,
    pub node_limit: Option<usize>,
    pub backfill: Backfill,
    pub start_times: StartTimes,
    pub nodes: Option<u32>,
    pub procs_per_node: Option<u32>,
    pub max_jobs: usize,
    pub t_fwd: f64,
    pub steps: Steps,
    pub grace: f64,
    pub objective: String,
    pub curve: CurveChoice,
    pub seed: u64,
    pub json: bool,
    pub csv: Option<PathBuf>,
    pub sizes_csv: Option<PathBuf>,
    pub write_journal: Option<PathBuf>,
    pub actions_csv: Option<PathBuf>,
    pub plots: Option<PathBuf>,
    /// What `--plots` writes: SVG, PNG or both.
    pub plot_format: PlotFormat,
    /// `--compare` or repeated `--objective`/`--t-fwd`: one replay per policy, one
    /// table; empty: the single replay of the options above.
    pub policies: Vec<compare::Policy>,
    pub check: bool,
    pub progress: bool,
    /// `--strict`: refuse inputs out of time order and SWF jobs the model cannot use.
    pub strict: bool,
    /// `--repeat` / `--arrivals RATE`: the job file cycled or drawn from.
    pub workload: Workload,
    /// bftrainerd's rules the replay models (`--release-before`, `--reclaim-hold`,
    /// `--start-latency`, `--core-loss`, `--no-daemon-rules`).
    pub rules: DaemonRules,
    /// Fair shares and rescale-cost floors as bftrainerd applies them (off:
    /// `--no-fair-share`, the plain BFTrainer objective on declared curves).
    pub fair_share: bool,
    /// `--node-classes FILE`: what the nodes offer (features, GPUs, memory), by class.
    pub node_classes: Option<PathBuf>,
    /// `--gpus-per-node K`: harvest reported in GPU-hours, K GPUs per node.
    pub gpus_per_node: Option<u32>,
    /// `--gpu-granular`: each GPU a unit of the engine (`host/gpuK`) instead of each
    /// node, and the jobs' node counts in GPUs.
    pub gpu_granular: bool,
    /// `--shared-nodes` (SWF only): the scheduler model places each job's processors
    /// on the lowest-numbered free ones, `--gpus-per-node` per node, so regular jobs
    /// leave slots of their nodes idle.
    pub shared_nodes: bool,
    /// `--cpu-alloc` with `--cpus-per-node`: CPUs of each host split between the jobs
    /// holding its GPU slots (Synergy), each job's rate scaled by its CPU profile.
    pub cpu_alloc: Option<CpuAlloc>,
    /// `--batch-range` (with `--base-batch`, `--noise-scale`, `--fixed-batch`): the
    /// batch model of the fixed-versus-joint comparison; its runs are `policies`.
    pub batch: Option<batch::BatchOptions>,
}

/// `--cpu-alloc POLICY --cpus-per-node C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CpuAlloc {
    pub policy: CpuPolicy,
    pub cpus_per_node: u32,
}

/// Wraps a byte stream, decompressing it when it starts with the gzip magic.
pub fn maybe_gzip<'a, R: Read + 'a>(r: R) -> std::io::Result<Box<dyn BufRead + 'a>> {
    let mut br = BufReader::with_capacity(1 << 16, r);
    let head = br.fill_buf()?;
    if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::MultiGzDecoder::new(br),
        )))
    } else {
        Ok(Box::new(br))
    }
}

fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(maybe_gzip(f)?)
}

fn time_opt(s: &Option<String>, what: &str) -> anyhow::Result<Option<i64>> {
    s.as_deref()
        .map(|v| parse_time(v).map_err(|m| anyhow::anyhow!("--{what}: {m}")))
        .transpose()
}

/// Where a replay's node trace comes from. Every source is read again for each replay
/// of it, as the replay goes, so that no replay holds a whole log: a sorted file from
/// the file; one that had to be sorted from its sorted runs (on disk past one chunk);
/// Slurm accounting from slurmdbd, a month at a time.
enum Source {
    /// A node-event file out of time order, sorted.
    Sorted(SortedTrace),
    /// A sorted node-event file; `head` is its first pass (nodes, initial state, window).
    Csv {
        input: Reopen,
        name: String,
        win: TraceWindow,
        head: NodeTrace,
    },
    /// Slurm accounting, read from slurmdbd a month at a time on every pass.
    Sacct(sacct::SacctSource),
    /// An SWF log through the scheduler model, planned by a first pass.
    Swf {
        jobs: Box<dyn JobSource>,
        plan: Plan,
    },
}

/// An input file (or the embedded sample) that can be opened again.
#[derive(Debug, Clone)]
enum Reopen {
    Sample,
    Path(PathBuf),
}

impl Reopen {
    fn open(&self) -> anyhow::Result<Box<dyn BufRead>> {
        match self {
            Reopen::Sample => Ok(maybe_gzip(SAMPLE_TRACE)?),
            Reopen::Path(p) => open(p),
        }
    }
}

/// The jobs of a sorted SWF file, read from it on each pass.
struct SwfPath {
    path: PathBuf,
    name: String,
    header: SwfHeader,
}

impl JobSource for SwfPath {
    fn header(&self) -> SwfHeader {
        self.header
    }
    fn jobs(&self) -> bftrainer_core::Result<JobPass<'_>> {
        use bftrainer_core::Error;
        let f = std::fs::File::open(&self.path).map_err(|cause| Error::Open {
            what: self.name.clone(),
            cause,
        })?;
        let r = maybe_gzip(f).map_err(|cause| Error::Read {
            what: self.name.clone(),
            line: 0,
            cause,
        })?;
        // The first pass found the file sorted: a job out of order now means it changed.
        let mut rd = SwfReader::new(r, &self.name, Order::Strict);
        Ok(Box::new(std::iter::from_fn(move || {
            rd.next_job().transpose()
        })))
    }
}

/// Everything a replay was fed, ready for the simulator: [`Loaded::events`] reads the
/// trace.
pub struct Loaded {
    source: Source,
    cut: Cut,
    /// The trace's window (Unix seconds) and nodes, as the replay sees them.
    pub start: i64,
    pub end: i64,
    pub nodes: usize,
    pub trace_name: String,
    pub jobs: Vec<JobRecord>,
    pub jobs_name: String,
    pub sched: Option<SchedMetrics>,
    /// What was sorted or skipped in the inputs; `load` prints each on stderr once.
    pub warnings: Vec<String>,
    /// What each node offers (`--node-classes`, or slurmctld's node table with
    /// `--from-sacct`), and where that came from; `None`: every node serves every job.
    pub node_table: Option<Arc<NodeTable>>,
    pub nodes_from: Option<String>,
    /// `--gpus-per-node K` and whether the harvest is GPU-granular.
    pub gpus: Option<(u32, bool)>,
    /// `--shared-nodes`: the trace's units are processors, this many per node.
    pub shared: Option<u32>,
}

/// `1234567` as `1,234,567`.
fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The warning for an input that had to be sorted; none when it was in order.
fn sorted_warning(name: &str, s: &Sorted, what: &str) -> Option<String> {
    (s.out_of_order > 0).then(|| {
        format!(
            "{name}: {} of {} records {} out of {what} order; sorted (use --strict to refuse such a file)",
            count(s.out_of_order),
            count(s.records),
            if s.out_of_order == 1 { "was" } else { "were" }
        )
    })
}

/// SWF jobs the scheduler model left out for a cause the log should not have (empty
/// jobs are SWF's own -1 and 0 values, counted but not warned about): a warning per
/// cause naming the first such line, or with `--strict` an error naming it.
fn swf_skips(
    name: &str,
    m: &SchedMetrics,
    o: &Options,
    warnings: &mut Vec<String>,
) -> anyhow::Result<()> {
    use bftrainer_core::easy::{SkipCause, MAX_RUN_S};
    let size = if o.nodes.is_some() {
        "--nodes"
    } else {
        "the MaxNodes header"
    };
    for s in &m.first_skipped {
        let line = s.line;
        let (n, cause, what, allowed) = match s.cause {
            SkipCause::TooWide => (
                m.jobs_skipped_too_wide,
                format!("as wider than the machine ({} nodes, {size})", m.nodes),
                format!(
                    "job {} needs {} nodes ({} processors at {} per node) but the machine has {} ({size})",
                    s.id,
                    s.value,
                    s.procs.unwrap_or(0),
                    m.procs_per_node,
                    m.nodes
                ),
                format!(
                    "at most {} nodes (--nodes sets the machine size)",
                    m.nodes
                ),
            ),
            SkipCause::BadRunTime => (
                m.jobs_skipped_bad_run_time,
                "for a bad run time".to_string(),
                format!("job {} has run time {} s", s.id, s.value),
                format!("-1 (unknown) or 0 to {MAX_RUN_S} s (365 days)"),
            ),
        };
        if o.strict {
            bail!("{name}:{line}: {what}; allowed: {allowed}");
        }
        let jobs = if n == 1 { "job" } else { "jobs" };
        warnings.push(format!(
            "{name}: {} {jobs} skipped {cause}; the first, line {line}: {what}; allowed: {allowed} (--strict refuses such a log)",
            count(n)
        ));
    }
    Ok(())
}

/// Records sorted in memory at once for an input out of time order: SWF jobs, and
/// node-event rows. `BFT_SORT_CHUNK=N` sets both to N, a knob for tests and benchmarks
/// (forcing runs on disk with a small file), not an option for users.
fn sort_chunks() -> anyhow::Result<(usize, usize)> {
    match std::env::var("BFT_SORT_CHUNK") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok((n, n)),
            _ => bail!("BFT_SORT_CHUNK must be a number of records >= 1, found {v:?}"),
        },
        Err(_) => Ok((SORT_CHUNK, SORT_CHUNK_ROWS)),
    }
}

/// Reads and windows the inputs.
pub fn load(o: &Options) -> anyhow::Result<Loaded> {
    let start = time_opt(&o.start, "start")?;
    let mut end = time_opt(&o.end, "end")?;
    if let Some(h) = o.hours {
        if !(h > 0.0 && h.is_finite()) {
            bail!("--hours must be > 0, found {h}");
        }
    }
    if let Workload::Arrivals { per_hour } = o.workload {
        if !(per_hour > 0.0 && per_hour.is_finite()) {
            bail!("--arrivals RATE must be a number of jobs per hour > 0, found {per_hour}");
        }
    }
    // A mistake in the node classes is told before the trace is read (minutes, for
    // a long one); they are resolved against its node names after.
    let classes = match &o.node_classes {
        Some(p) => {
            let name = p.display().to_string();
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("--node-classes: cannot read {name}"))?;
            let c = nodes::parse_classes(&text, &name).map_err(anyhow::Error::msg)?;
            Some((c, name))
        }
        None => None,
    };
    let order = if o.strict { Order::Strict } else { Order::Sort };
    let (swf_chunk, row_chunk) = sort_chunks()?;
    let mut warnings = Vec::new();
    let mut cut = Cut::default();
    let (source, trace_name, sched) = match &o.input {
        Input::Sample | Input::Trace(_) => {
            let (input, name) = match &o.input {
                Input::Trace(p) => (Reopen::Path(p.clone()), p.display().to_string()),
                _ => (Reopen::Sample, SAMPLE_TRACE_NAME.to_string()),
            };
            // --hours needs the start: resolve it against the trace's first time below.
            let win = TraceWindow {
                start,
                end,
                node_limit: o.node_limit,
            };
            // A sorted trace is checked in a first pass and then read as the replay
            // goes; an unsorted one is read again and sorted in bounded memory.
            let (source, sorted) = match scan_node_events(input.open()?, &name, &win, order)? {
                Some((head, sorted)) => (
                    Source::Csv {
                        input,
                        name: name.clone(),
                        win,
                        head,
                    },
                    sorted,
                ),
                None => {
                    let (tr, sorted) = sort_node_events(
                        input.open()?,
                        &name,
                        &win,
                        row_chunk,
                        &record::TempScratch::make,
                    )?;
                    (Source::Sorted(tr), sorted)
                }
            };
            warnings.extend(sorted_warning(&name, &sorted, "time"));
            if let Some(h) = o.hours {
                let head = match &source {
                    Source::Csv { head, .. } => head,
                    Source::Sorted(tr) => tr.head(),
                    Source::Swf { .. } | Source::Sacct(_) => unreachable!("a node-event file"),
                };
                let e = head.start.saturating_add((h * 3600.0) as i64);
                if e < head.end {
                    cut.end = Some(e);
                }
            }
            (source, name, None)
        }
        Input::Swf(p) => {
            let name = p.display().to_string();
            // First pass: the header, the order and the job lines' format. A sorted
            // log is read again on every pass; an unsorted one is sorted in bounded
            // memory, its runs merged again on every pass.
            let mut scan = SwfReader::new(open(p)?, &name, order);
            while scan.next_job()?.is_some() {}
            let sorted = scan.finish()?;
            warnings.extend(sorted_warning(&name, &sorted, "submit-time"));
            let jobs: Box<dyn JobSource> = if sorted.out_of_order == 0 {
                Box::new(SwfPath {
                    path: p.clone(),
                    name: name.clone(),
                    header: scan.header,
                })
            } else {
                Box::new(sort_swf(
                    open(p)?,
                    &name,
                    swf_chunk,
                    &record::TempScratch::make,
                )?)
            };
            let mut cfg = SchedConfig {
                backfill: o.backfill,
                start_times: o.start_times,
                nodes: o.nodes,
                procs_per_node: o.procs_per_node,
                epoch: None,
            };
            if o.shared_nodes {
                // Every processor a unit of the model: the machine's nodes x K of them.
                let Some(k) = o.gpus_per_node else {
                    bail!("--shared-nodes needs --gpus-per-node K (the processors of a node, each a slot)");
                };
                if o.procs_per_node.is_some() {
                    bail!("--shared-nodes: give the slots per node with --gpus-per-node, not --procs-per-node");
                }
                let h = jobs.header();
                let n = o.nodes.map(i64::from).or(h.max_nodes).filter(|&n| n > 0);
                let Some(n) = n else {
                    bail!(
                        "{name}: the log has no MaxNodes header: give the machine size (--nodes)"
                    );
                };
                let units = u32::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_mul(k))
                    .ok_or_else(|| {
                        anyhow::anyhow!("--shared-nodes: {n} nodes x {k} slots is too many")
                    })?;
                cfg.nodes = Some(units);
                cfg.procs_per_node = Some(1);
            }
            let plan = easy::plan(&*jobs, &cfg)?;
            swf_skips(&name, &plan.metrics, o, &mut warnings)?;
            cut.start = start.filter(|&s| s > plan.start);
            if let Some(h) = o.hours {
                let s = cut.start.unwrap_or(plan.start);
                end = Some(s.saturating_add((h * 3600.0) as i64));
            }
            cut.end = end;
            cut.node_limit = o.node_limit;
            let m = plan.metrics.clone();
            (Source::Swf { jobs, plan }, name, Some(m))
        }
        Input::Journal(p) => bail!(
            "{}: a journal replays into the engine alone; it has no idle trace to load",
            p.display()
        ),
        Input::Sacct {
            start: a,
            end: b,
            exclude,
        } => {
            if o.start.is_some() || o.end.is_some() || o.hours.is_some() {
                bail!("--from-sacct START END is the window: --start, --end and --hours do not apply to it");
            }
            let from = parse_time(a).map_err(|m| anyhow::anyhow!("--from-sacct START: {m}"))?;
            let to = parse_time(b).map_err(|m| anyhow::anyhow!("--from-sacct END: {m}"))?;
            if to <= from {
                bail!("--from-sacct: END ({b}) must be after START ({a})");
            }
            let src = sacct::SacctSource::new(from, to, exclude.clone(), sacct::WINDOW_S)?;
            cut.node_limit = o.node_limit;
            (
                Source::Sacct(src),
                format!("slurm accounting {a} .. {b}"),
                None,
            )
        }
    };
    if let Some(n) = o.node_limit {
        if n == 0 {
            bail!("--node-limit must be >= 1");
        }
    }
    let (start, end, nodes) = {
        let (s, e, n) = source.window();
        cut.window_of(s, e, n)
    };
    if nodes == 0 {
        bail!("the trace has no nodes");
    }
    let (mut jobs, jobs_name) = match &o.jobs {
        Some(p) => (
            parse_jobs(open(p)?, &p.display().to_string())?,
            p.display().to_string(),
        ),
        None => (
            parse_jobs(SAMPLE_JOBS, SAMPLE_JOBS_NAME)?,
            SAMPLE_JOBS_NAME.to_string(),
        ),
    };
    // Jobs of the original replayer are stamped from its start time; a trace from
    // another time (an SWF log, sacct) gets them shifted to its own start, keeping
    // their spacing.
    if let Some(first) = jobs.first().map(|j| j.submit) {
        if first > end || jobs.last().is_some_and(|l| l.submit < start) {
            let shift = start - first;
            for j in &mut jobs {
                j.submit += shift;
            }
            log::info!("job submit times shifted by {shift} s to the trace's start");
        }
    }
    let mut loaded = Loaded {
        source,
        cut,
        start,
        end,
        nodes,
        trace_name,
        jobs,
        jobs_name,
        sched,
        warnings,
        nodes_from: None,
        node_table: None,
        gpus: None,
        shared: None,
    };
    if o.shared_nodes {
        if !matches!(o.input, Input::Swf(_)) {
            bail!("--shared-nodes models the SWF log's jobs on shared nodes; it needs --swf");
        }
        loaded.shared = o.gpus_per_node;
    }
    node_table(classes, &mut loaded)?;
    match (o.gpus_per_node, o.gpu_granular) {
        (None, true) => bail!("--gpu-granular needs --gpus-per-node K"),
        (Some(k), granular) => {
            if granular {
                if let Some(from) = &loaded.nodes_from {
                    bail!("--gpu-granular does not model node attributes per GPU; replay without them (they come from {from})");
                }
                loaded.jobs = sim::gpus::slot_jobs(&loaded.jobs, k)?;
            } else if !(1..=sim::gpus::MAX_GPUS_PER_NODE).contains(&k) {
                bail!(
                    "--gpus-per-node must be 1 to {}, found {k}",
                    sim::gpus::MAX_GPUS_PER_NODE
                );
            }
            loaded.gpus = Some((k, granular));
        }
        (None, false) => {}
    }
    if let Some(c) = o.cpu_alloc {
        let Some((k, true)) = loaded.gpus else {
            bail!("--cpu-alloc splits the CPUs of hosts between the jobs holding their GPU slots; it needs --gpu-granular (and --gpus-per-node K)");
        };
        if c.cpus_per_node < k {
            bail!(
                "--cpus-per-node {}: every GPU slot needs at least 1 CPU; allowed: at least --gpus-per-node ({k})",
                c.cpus_per_node
            );
        }
    }
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    Ok(loaded)
}

/// What the nodes offer: `--node-classes FILE` resolved against the trace's node names,
/// else with `--from-sacct` slurmctld's own node table (features, GRES, RealMemory, as
/// bftrainerd reads them). Warns of jobs that no node of the cluster can serve, and of
/// needs without node attributes (every node then serves every job).
fn node_table(
    classes: Option<(Vec<nodes::NodeClass>, String)>,
    l: &mut Loaded,
) -> anyhow::Result<()> {
    let (table, from) = match (classes, &l.source) {
        (Some((classes, name)), _) => {
            let names = l.node_names()?;
            let (t, warnings) =
                nodes::resolve(&classes, &names, &name).map_err(anyhow::Error::msg)?;
            l.warnings.extend(warnings);
            (t, name)
        }
        (None, Source::Sacct(s)) => {
            let mut attrs = s.attrs().to_vec();
            attrs.truncate(l.nodes);
            (
                NodeTable::from_attrs(attrs),
                "slurmctld's node table".to_string(),
            )
        }
        (None, _) => {
            if let Some(j) = l.jobs.iter().find(|j| !j.needs.is_empty()) {
                l.warnings.push(format!(
                    "{}: job {} asks {}, but the nodes have no attributes: every node serves every job (give --node-classes FILE)",
                    l.jobs_name,
                    j.name,
                    sim::asks(&j.needs)
                ));
            }
            return Ok(());
        }
    };
    for j in l.jobs.iter().filter(|j| !j.needs.is_empty()) {
        let c = j.needs.compile();
        let serve = table
            .class_of
            .iter()
            .filter(|&&k| c.served_by(Some(&table.classes[k as usize].1)))
            .count();
        if (serve as u64) < u64::from(j.min_nodes) {
            l.warnings.push(format!(
                "{}: job {} asks {} on at least {} nodes, but {serve} of the {} nodes serve it ({from}): it will wait for ever",
                l.jobs_name,
                j.name,
                sim::asks(&j.needs),
                j.min_nodes,
                table.class_of.len()
            ));
        }
    }
    l.node_table = Some(Arc::new(table));
    l.nodes_from = Some(from);
    Ok(())
}

impl Source {
    /// The trace's window and node count before any cut, as the first pass found them
    /// (no input is read again for them).
    fn window(&self) -> (i64, i64, usize) {
        match self {
            Source::Sorted(tr) => (tr.head().start, tr.head().end, tr.head().names.len()),
            Source::Csv { head, .. } => (head.start, head.end, head.names.len()),
            Source::Sacct(s) => s.window(),
            Source::Swf { plan, .. } => (plan.start, plan.end, plan.nodes()),
        }
    }
}

impl Loaded {
    /// The trace's node names, in its order, as the replay sees them (cut by
    /// `--node-limit`); slurmdbd is not read for them.
    pub fn node_names(&self) -> anyhow::Result<Vec<String>> {
        // GPU slots and shared nodes rename and regroup the units: as the events say.
        if self.shared.is_some() || matches!(self.gpus, Some((_, true))) {
            return Ok(self.events()?.names().to_vec());
        }
        let mut names = match &self.source {
            Source::Sacct(s) => s.names().to_vec(),
            _ => self.events()?.names().to_vec(),
        };
        names.truncate(self.nodes);
        Ok(names)
    }

    /// The trace, read from its start as the replay asks for it.
    pub fn events(&self) -> anyhow::Result<Box<dyn NodeEvents + '_>> {
        let raw: Box<dyn NodeEvents + '_> = match &self.source {
            Source::Sorted(tr) => Box::new(tr.events()?),
            Source::Sacct(s) => Box::new(s.events()?),
            Source::Csv {
                input,
                name,
                win,
                head,
            } => Box::new(CsvEvents::new(input.open()?, name, win, head.clone())?),
            Source::Swf { jobs, plan } => Box::new(easy::events(&**jobs, plan)?),
        };
        let w = Windowed::new(raw, self.cut)?;
        Ok(match (self.shared, self.gpus) {
            // Slots of shared nodes: each lent on its own, or a node when all are idle.
            (Some(k), Some((_, true))) => Box::new(sim::gpus::SharedNodes::new(w, k)?),
            (Some(k), _) => Box::new(sim::gpus::WholeHosts::new(sim::gpus::SharedNodes::new(
                w, k,
            )?)),
            (None, Some((k, true))) => Box::new(sim::gpus::GpuSlots::new(w, k)?),
            (None, _) => Box::new(w),
        })
    }

    /// The whole trace in memory (tests, small inputs).
    pub fn trace(&self) -> anyhow::Result<NodeTrace> {
        Ok(NodeTrace::collect(&mut *self.events()?)?)
    }
}

/// `alloc::Options` may gain fields; its docs ask for `..Default::default()`.
#[allow(clippy::needless_update)]
fn alloc_options(objective: Objective) -> AllocOptions {
    AllocOptions {
        objective,
        ..AllocOptions::default()
    }
}

/// `--journal`: replays an engine journal under the policy options and reports what
/// the engine decided.
fn run_journal(o: &Options, p: &Path, objective: Objective) -> anyhow::Result<()> {
    let alloc = Exact {
        opts: alloc_options(objective),
    };
    let name = p.display().to_string();
    let rep = journal::replay_journal(
        open(p)?,
        &name,
        engine_config(o),
        alloc,
        o.actions_csv.is_some(),
    )?;
    if o.json {
        let v = serde_json::json!({
            "journal": name,
            "settings": { "max_jobs": o.max_jobs, "t_fwd_s": o.t_fwd, "objective": o.objective },
            "report": rep,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let t = |x: Option<f64>| {
            x.map_or("-".into(), |t| {
                bftrainer_core::timefmt::format_time(t.floor() as i64)
            })
        };
        println!("BFTrainer journal replay");
        println!("  journal     {name}");
        println!(
            "  records     {} ({} .. {})",
            rep.records,
            t(rep.first_t),
            t(rep.last_t)
        );
        println!("  nodes       {}", rep.nodes);
        println!("  jobs        {} submitted", rep.jobs_submitted);
        println!(
            "  settings    max-jobs {}, t-fwd {} s, objective {}",
            o.max_jobs, o.t_fwd, o.objective
        );
        println!(
            "  decisions   {} ({} kept the old allocation), {:.3} s",
            rep.decisions, rep.decisions_kept, rep.replay_s
        );
        let c = &rep.counts;
        println!(
            "  actions     {} admits, {} grows, {} shrinks, {} requeues; {} nodes given, {} taken",
            c.admits, c.grows, c.shrinks, c.requeues, c.grown_nodes, c.shrunk_nodes
        );
        if rep.skipped_confirmations > 0 {
            println!(
                "  skipped     {} starts the journal confirms that this policy did not decide",
                rep.skipped_confirmations
            );
        }
    }
    if let Some(a) = &o.actions_csv {
        write_whole(a, |w| Ok(journal::write_actions_csv(w, &rep.actions)?))?;
    }
    Ok(())
}

/// The engine's settings for these options (`--t-fwd`, `--max-jobs`).
fn engine_config(o: &Options) -> EngineConfig {
    EngineConfig {
        t_fwd_s: o.t_fwd,
        max_jobs: o.max_jobs,
        fair_share: o.fair_share,
        // bftrainerd's floors of the rescale costs come with its fair shares.
        min_scale_up_s: if o.fair_share {
            DEFAULT_MIN_SCALE_UP_S
        } else {
            0.0
        },
        min_scale_down_s: if o.fair_share {
            DEFAULT_MIN_SCALE_DOWN_S
        } else {
            0.0
        },
        ..EngineConfig::default()
    }
}

/// Writes an output file whole or not at all: into a hidden temporary file beside it,
/// renamed over `p` once complete; on an error the temporary file is removed and `p`
/// is left as it was.
fn write_whole(
    p: &Path,
    f: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut s = record::Spool::create(p)?;
    f(s.w()).with_context(|| format!("cannot write {}", p.display()))?;
    s.commit()
}

/// Writes files into `dir` all or none: `write` makes them in a hidden temporary
/// directory inside `dir` and returns their paths; they are then renamed into `dir`.
/// On an error the temporary directory is removed and `dir` is left as it was.
fn write_dir_whole(
    dir: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<Vec<PathBuf>>,
) -> anyhow::Result<Vec<PathBuf>> {
    let tmp = dir.join(format!(".bftrainer.tmp-{}", std::process::id()));
    let result = (|| -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let made = write(&tmp)?;
        let mut out = Vec::with_capacity(made.len());
        for f in made {
            let name = f
                .file_name()
                .with_context(|| format!("{}: not a file name", f.display()))?;
            let to = dir.join(name);
            std::fs::rename(&f, &to)
                .with_context(|| format!("cannot move {} to {}", f.display(), to.display()))?;
            out.push(to);
        }
        Ok(out)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Checks, before anything runs, that every output file can be made: its directory
/// exists and the path is not a directory (a replay can take minutes; a typo should not
/// cost them, nor leave some outputs written and others not).
fn check_outputs(o: &Options) -> anyhow::Result<()> {
    let files = [
        ("--csv", &o.csv),
        ("--sizes-csv", &o.sizes_csv),
        ("--write-journal", &o.write_journal),
        ("--actions-csv", &o.actions_csv),
    ];
    for (opt, p) in files {
        let Some(p) = p else { continue };
        if p.is_dir() {
            bail!("{opt} {}: is a directory; give a file name", p.display());
        }
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir.filter(|d| !d.is_dir()) {
            bail!(
                "{opt} {}: directory {} does not exist",
                p.display(),
                d.display()
            );
        }
    }
    if let Some(d) = o.plots.as_ref().filter(|d| d.exists() && !d.is_dir()) {
        bail!("--plots {}: exists and is not a directory", d.display());
    }
    if o.plots.is_some() {
        // The plots' text needs a font: say so before the replay, not after it.
        plot::font()?;
    }
    Ok(())
}

/// The simulator's settings for these options: checks, recording and journal as asked.
fn sim_config(o: &Options, objective: Objective) -> SimConfig {
    SimConfig {
        engine: engine_config(o),
        steps: o.steps,
        grace_s: o.grace,
        objective: o.curve,
        check: o.check,
        record: o.csv.is_some() || o.sizes_csv.is_some() || o.plots.is_some(),
        seed: o.seed,
        report_progress: objective == Objective::RemainingWork,
        journal: o.write_journal.is_some() || o.actions_csv.is_some(),
        workload: o.workload,
        rules: o.rules,
        nodes: None,
        cpus: o.cpu_alloc.map(|c| {
            Arc::new(CpuModel {
                policy: c.policy,
                cpus_per_host: c.cpus_per_node,
                profiles: bftrainer_core::sim::cpus::mixed_profiles(),
            })
        }),
    }
}

/// Runs the replay and writes every requested output.
/// One simulation of the loaded input with the exact allocator, timed by the wall
/// clock; `progress` hears the share done (0 to 1).
fn simulate_loaded(
    loaded: &Loaded,
    cfg: &SimConfig,
    objective: Objective,
    progress: &mut dyn FnMut(f64),
    rec: &mut dyn sim::Recorder,
) -> anyhow::Result<Outcome> {
    let origin = Instant::now();
    let mut clock = move || origin.elapsed().as_secs_f64();
    let mut events = loaded.events()?;
    let cfg = SimConfig {
        nodes: loaded.node_table.clone(),
        ..cfg.clone()
    };
    Ok(sim::simulate_into(
        &mut *events,
        &loaded.jobs,
        Exact {
            opts: alloc_options(objective),
        },
        &cfg,
        &mut Hooks {
            clock: &mut clock,
            progress,
        },
        rec,
    )?)
}

pub fn run(o: &Options) -> anyhow::Result<()> {
    let objective: Objective = o.objective.parse()?;
    check_outputs(o)?;
    if let Input::Journal(p) = &o.input {
        if !o.policies.is_empty() {
            bail!("--journal replays under one policy: --compare and repeated --objective/--t-fwd do not apply to it");
        }
        return run_journal(o, p, objective);
    }
    if !o.policies.is_empty() {
        return compare::run_compare(o);
    }
    let t_load = Instant::now();
    let loaded = load(o)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let cfg = sim_config(o, objective);
    let bar = if o.progress && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(1000);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "replay [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
            )
            .expect("static template"),
        );
        Some(b)
    } else {
        None
    };
    let mut progress = |f: f64| {
        if let Some(b) = &bar {
            b.set_position((f * 1000.0) as u64);
        }
    };
    let mut outputs = record::Outputs::open(o, &loaded)?;
    let t_sim = Instant::now();
    let out = simulate_loaded(&loaded, &cfg, objective, &mut progress, &mut outputs)?;
    let sim_s = t_sim.elapsed().as_secs_f64();
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if o.json {
        let mut v = serde_json::json!({
            "trace": loaded.trace_name,
            "jobs_file": loaded.jobs_name,
            "settings": { "max_jobs": o.max_jobs, "t_fwd_s": o.t_fwd, "steps": o.steps, "grace_s": o.grace, "objective": o.objective, "curve": o.curve, "seed": o.seed, "workload": o.workload, "strict": o.strict, "daemon_rules": o.rules },
            "warnings": loaded.warnings,
            "scheduler": loaded.sched,
            "report": out.report,
            "wall_s": { "load": load_s, "simulate": sim_s },
        });
        // Only where set: replays without it print what they always did.
        if let Some(c) = &o.cpu_alloc {
            v["settings"]["cpu_alloc"] = serde_json::json!(c);
        }
        if let Some(from) = &loaded.nodes_from {
            v["node_attributes"] = serde_json::json!(from);
        }
        if let Some((k, granular)) = loaded.gpus {
            let per = if granular { 1.0 } else { f64::from(k) };
            v["gpus"] = serde_json::json!({
                "per_node": k,
                "granular": granular,
                "idle_gpu_h": per * out.report.idle_node_h,
                "harvested_gpu_h": per * out.report.harvested_node_h,
            });
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_table(
            &mut std::io::stdout().lock(),
            &loaded,
            o,
            &out.report,
            load_s,
            sim_s,
        )?;
    }
    let plot = outputs.plot.take();
    outputs.commit()?;
    if let (Some(dir), Some(data)) = (&o.plots, plot) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let files = write_dir_whole(dir, |tmp| {
            plot::write_all(tmp, data, &out.report, o.plot_format)
        })?;
        if !o.json {
            for f in files {
                println!("plot: {}", f.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::trace::parse_node_events;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn truncated_gzip_is_rejected_with_position() {
        let text: String = std::iter::once("time,node,idle\n".to_string())
            .chain((0..20000).map(|i| format!("2021-01-01T00:00:00,n{i},0\n")))
            .collect();
        let mut z = gz(text.as_bytes());
        z.truncate(z.len() / 2);
        let r = maybe_gzip(&z[..]).unwrap();
        let e = parse_node_events(r, "cut.csv.gz", &TraceWindow::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cut.csv.gz: read failed after line "), "{e}");
    }

    #[test]
    fn plain_and_gzip_read_alike() {
        let text = b"time,node,idle\n2021-01-01T00:00:00,a,1\n2021-01-01T00:00:10,a,0\n";
        let a = parse_node_events(maybe_gzip(&text[..]).unwrap(), "p", &TraceWindow::default())
            .unwrap();
        let z = gz(text);
        let b =
            parse_node_events(maybe_gzip(&z[..]).unwrap(), "p", &TraceWindow::default()).unwrap();
        assert_eq!(a, b);
    }

    /// The full Summit trace parses to the facts data/README.md gives:
    /// 851,590 rows, 4,734 nodes, 2021-02-10T00:08:52 .. 2021-02-24T22:19:29,
    /// time-weighted mean 391 idle nodes.
    #[test]
    fn summit_trace_matches_its_readme() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/bftrainer-summit/node-events.csv.gz");
        let tr = parse_node_events(open(&p).unwrap(), "summit", &TraceWindow::default()).unwrap();
        assert_eq!(tr.names.len(), 4734);
        assert_eq!(tr.names.len() + tr.changes.len(), 851_590);
        assert_eq!(
            bftrainer_core::timefmt::format_time(tr.start),
            "2021-02-10T00:08:52"
        );
        assert_eq!(
            bftrainer_core::timefmt::format_time(tr.end),
            "2021-02-24T22:19:29"
        );
        assert!((tr.mean_idle() - 391.0).abs() < 1.0, "{}", tr.mean_idle());
    }

    #[test]
    fn sample_parses() {
        let tr = parse_node_events(
            maybe_gzip(SAMPLE_TRACE).unwrap(),
            SAMPLE_TRACE_NAME,
            &TraceWindow::default(),
        )
        .unwrap();
        assert_eq!(tr.names.len(), 4734);
        assert!(tr.end - tr.start > 23 * 3600);
        assert_eq!(
            parse_jobs(SAMPLE_JOBS, SAMPLE_JOBS_NAME).unwrap().len(),
            200
        );
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;
    use bftrainer_core::sim::Report;

    pub(super) fn opts() -> Options {
        Options {
            input: Input::Sample,
            jobs: None,
            start: None,
            end: None,
            hours: None,
            node_limit: None,
            backfill: Backfill::Easy,
            start_times: StartTimes::Auto,
            nodes: None,
            procs_per_node: None,
            max_jobs: 10,
            t_fwd: 10.0,
            steps: Steps::Exact,
            grace: 0.0,
            objective: "bftrainer".into(),
            curve: CurveChoice::File,
            seed: 0,
            json: false,
            csv: None,
            sizes_csv: None,
            write_journal: None,
            actions_csv: None,
            plots: None,
            plot_format: PlotFormat::Svg,
            policies: Vec::new(),
            check: true,
            progress: false,
            strict: false,
            workload: Workload::File,
            rules: DaemonRules::DAEMON,
            fair_share: true,
            node_classes: None,
            gpus_per_node: None,
            gpu_granular: false,
            shared_nodes: false,
            cpu_alloc: None,
            batch: None,
        }
    }

    /// Replays with the invariant checker on and the exact allocator.
    fn replay(o: &Options) -> (Loaded, Outcome) {
        let l = load(o).unwrap();
        let objective: Objective = o.objective.parse().unwrap();
        let cfg = SimConfig {
            check: true,
            record: true,
            journal: false,
            ..sim_config(o, objective)
        };
        let alloc = Exact {
            opts: alloc_options(objective),
        };
        let (mut c, mut p) = (|| 0.0, |_f: f64| {});
        let out = sim::simulate_events(
            &mut *l.events().unwrap(),
            &l.jobs,
            alloc,
            &cfg,
            &mut Hooks {
                clock: &mut c,
                progress: &mut p,
            },
        )
        .unwrap();
        (l, out)
    }

    fn conserved(r: &Report) {
        assert!(
            (r.idle_node_h - r.harvested_node_h - r.unused_node_h).abs() < 1e-6 * r.idle_node_h
        );
        assert!(r.samples <= r.samples_dedicated);
        assert!(
            (r.samples_dedicated - r.samples - r.rescale_loss_samples - r.preemption_loss_samples)
                .abs()
                < 1e-6 * r.samples_dedicated
        );
        // Exact steps finish jobs when they reach their total: no overrun.
        assert!(r.overrun_loss_samples < 1e-6 * r.samples_dedicated);
    }

    /// BFTrainer's stepping on the sample: jobs finish at trace events only, so they
    /// hold their nodes longer and lose the excess (overrun); the losses still add up.
    #[test]
    fn trace_steps_keep_invariants_and_lose_overrun() {
        let o = Options {
            hours: Some(6.0),
            ..opts()
        };
        let (_, exact) = replay(&o);
        let (_, tr) = replay(&Options {
            steps: Steps::Trace,
            ..o
        });
        let (e, t) = (&exact.report, &tr.report);
        assert!(
            t.jobs_completed > 0 && t.overrun_loss_samples > 0.0,
            "{t:?}"
        );
        assert!(
            (t.samples_dedicated
                - t.samples
                - t.rescale_loss_samples
                - t.preemption_loss_samples
                - t.overrun_loss_samples)
                .abs()
                < 1e-6 * t.samples_dedicated
        );
        assert!(t.samples <= t.samples_dedicated);
        assert!((t.idle_node_h - e.idle_node_h).abs() < 1e-9);
        assert!(
            (t.idle_node_h - t.harvested_node_h - t.unused_node_h).abs() < 1e-6 * t.idle_node_h
        );
        // No decision at submissions or completions: fewer decisions.
        assert!(
            t.decisions < e.decisions,
            "{} vs {}",
            t.decisions,
            e.decisions
        );
    }

    #[test]
    fn sample_six_hours_every_objective_keeps_invariants() {
        for obj in [
            "bftrainer",
            "efficiency",
            "fairness",
            "remaining-work",
            "reclaim-aware",
        ] {
            let o = Options {
                hours: Some(6.0),
                objective: obj.into(),
                ..opts()
            };
            let (l, out) = replay(&o);
            let r = &out.report;
            assert_eq!(l.end - l.start, 6 * 3600);
            assert!(r.harvested_node_h > 0.0, "{obj}: nothing harvested");
            assert!(r.jobs_completed > 0, "{obj}: no job completed");
            conserved(r);
            // Progress per step never exceeds the idle pool.
            assert!(out.steps.iter().all(|s| s.harvested_nodes <= s.idle_nodes));
        }
    }

    #[test]
    fn same_seed_same_result_and_grace_runs() {
        let o = Options {
            hours: Some(3.0),
            seed: 7,
            ..opts()
        };
        let (_, a) = replay(&o);
        let (_, b) = replay(&o);
        assert_eq!(a.report, b.report);
        assert_eq!(a.sizes, b.sizes);
        // Another seed changes which nodes jobs get, hence which are preempted.
        let (_, c) = replay(&Options {
            seed: 0,
            ..o.clone()
        });
        assert_ne!(a.report.preempted_nodes, c.report.preempted_nodes);
        let (_, g) = replay(&Options { grace: 30.0, ..o });
        conserved(&g.report);
        assert!(g.report.grace_node_h > 0.0);
    }

    /// The idle fragments the plots count while the replay takes the trace's changes are
    /// those of the trace read on its own, for both inputs and both stepping modes.
    #[test]
    fn fragments_counted_during_the_replay_are_the_traces() {
        use bftrainer_core::engine::{Action, Record};
        use bftrainer_core::sim::{Recorder, SizeRecord, StepRecord};
        use bftrainer_core::trace::fragments::{idle_fragments_of, FragmentCounter};
        use bftrainer_core::trace::{Head, NodeChange};
        #[derive(Default)]
        struct Count(Option<FragmentCounter>);
        impl Recorder for Count {
            fn step(&mut self, _: &StepRecord) {}
            fn size(&mut self, _: &SizeRecord, _: &str) {}
            fn journal(&mut self, _: &Record, _: &[Action]) {}
            fn trace_head(&mut self, head: Head<'_>) {
                self.0 = Some(FragmentCounter::new(head));
            }
            fn change(&mut self, c: &NodeChange) {
                self.0.as_mut().unwrap().change(c);
            }
        }
        let swf = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/swf/LLNL-Atlas-2006-2.1-cln.swf.gz");
        for (input, start) in [
            (Input::Sample, Some("2021-02-11T01:00:00")),
            (Input::Swf(swf), Some("2007-01-15T00:00:00")),
        ] {
            for steps in [Steps::Exact, Steps::Trace] {
                let o = Options {
                    input: input.clone(),
                    start: start.map(String::from),
                    hours: Some(5.0),
                    node_limit: Some(900),
                    steps,
                    ..opts()
                };
                let l = load(&o).unwrap();
                let mut rec = Count::default();
                simulate_loaded(
                    &l,
                    &sim_config(&o, Objective::Bftrainer),
                    Objective::Bftrainer,
                    &mut |_| {},
                    &mut rec,
                )
                .unwrap();
                let got = rec.0.unwrap().finish();
                let want = idle_fragments_of(&mut *l.events().unwrap()).unwrap();
                assert!(want.fragments > 100, "{input:?}: {}", want.fragments);
                assert_eq!(got, want, "{input:?} {steps:?}");
            }
        }
    }

    #[test]
    fn swf_with_node_limit_and_hours() {
        let dir = std::env::temp_dir().join(format!("bft-replay-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.swf");
        // 4 nodes; jobs of the hand-worked EASY schedule in easy::tests.
        std::fs::write(&p, "; MaxNodes: 4\n; MaxProcs: 4\n; UnixStartTime: 1000\n1 0 -1 100 2 -1 -1 2 100 -1 1 1 -1 1 -1 1 -1 -1\n2 1 -1 50 4 -1 -1 4 50 -1 1 1 -1 1 -1 1 -1 -1\n3 2 -1 50 2 -1 -1 2 50 -1 1 1 -1 1 -1 1 -1 -1\n4 3 -1 200 1 -1 -1 1 200 -1 1 1 -1 1 -1 1 -1 -1\n").unwrap();
        let l = load(&Options {
            input: Input::Swf(p.clone()),
            ..opts()
        })
        .unwrap();
        // Replays under the reclaim-aware objective: the backfill plan's forecasts reach
        // the exact allocator; invariants hold.
        let (_, out) = replay(&Options {
            input: Input::Swf(p.clone()),
            objective: "reclaim-aware".into(),
            ..opts()
        });
        conserved(&out.report);
        assert!((out.report.idle_node_h * 3600.0 - 700.0).abs() < 1e-6);
        assert_eq!((l.start, l.end), (1000, 1350));
        assert!((l.trace().unwrap().mean_idle() - 2.0).abs() < 1e-12);
        // The sample jobs (2021) are shifted to the log's start (1970).
        assert_eq!(l.jobs[0].submit, 1000);
        let l2 = load(&Options {
            input: Input::Swf(p),
            node_limit: Some(2),
            hours: Some(0.05),
            ..opts()
        })
        .unwrap();
        assert_eq!(l2.nodes, 2);
        assert_eq!(l2.end, 1000 + 180);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn swf_on_shared_nodes_leaves_partial_nodes_to_gpu_slots() {
        let dir = std::env::temp_dir().join(format!("bft-replay-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.swf");
        // 2 nodes of 2 processors; two 1-processor jobs from 0, for 100 and 200 s: on
        // shared nodes both sit on node 0 (lowest-numbered processors first), node 1 is
        // idle throughout and node 0's first slot from 100 s.
        std::fs::write(&p, "; MaxNodes: 2\n; MaxProcs: 4\n; UnixStartTime: 1000\n1 0 -1 100 1 -1 -1 1 100 -1 1 1 -1 1 -1 1 -1 -1\n2 0 -1 200 1 -1 -1 1 200 -1 1 1 -1 1 -1 1 -1 -1\n").unwrap();
        let o = Options {
            input: Input::Swf(p.clone()),
            gpus_per_node: Some(2),
            shared_nodes: true,
            ..opts()
        };
        let (lw, whole) = replay(&o);
        let (lg, gran) = replay(&Options {
            gpu_granular: true,
            ..o.clone()
        });
        conserved(&whole.report);
        conserved(&gran.report);
        assert_eq!(lw.node_names().unwrap(), ["node0000", "node0001"]);
        assert_eq!(lg.node_names().unwrap()[1], "node0000/gpu1");
        // The GPU slots see node 0's free slot for the 100 s node 0 is partly busy.
        let w = whole.report.idle_node_h * 3600.0;
        let g = gran.report.idle_node_h * 3600.0;
        assert!(w > 0.0);
        assert!(
            (g - (2.0 * w + 100.0)).abs() < 1e-6,
            "whole {w} node-s, slots {g} GPU-s"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_written() {
        let dir = std::env::temp_dir().join(format!("bft-replay-out-{}", std::process::id()));
        let o = Options {
            hours: Some(2.0),
            csv: Some(dir.join("steps.csv")),
            sizes_csv: Some(dir.join("sizes.csv")),
            plots: Some(dir.clone()),
            progress: false,
            ..opts()
        };
        std::fs::create_dir_all(&dir).unwrap();
        run(&o).unwrap();
        let csv = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
        assert!(csv.starts_with("t,time,idle_nodes,harvested_nodes"));
        assert!(csv.lines().count() > 10);
        let sizes = std::fs::read_to_string(dir.join("sizes.csv")).unwrap();
        assert!(sizes.starts_with("t,time,job,nodes\n"));
        assert!(sizes.lines().nth(1).unwrap().contains(",J00000-AlexNet,"));
        for f in [
            "idle_vs_harvested.svg",
            "nodes_per_job.svg",
            "cumulative_samples.svg",
        ] {
            let s = std::fs::read_to_string(dir.join(f)).unwrap();
            assert!(s.starts_with("<svg") && s.contains("polyline"), "{f}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_options_are_rejected() {
        let e = |o: Options| load(&o).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e(Options {
            start: Some("yesterday".into()),
            ..opts()
        })
        .starts_with("--start: bad timestamp"));
        assert!(e(Options {
            hours: Some(-1.0),
            ..opts()
        })
        .contains("--hours must be > 0"));
        // A huge --hours means "to the end of the trace", not an overflow.
        let l = load(&Options {
            hours: Some(1e300),
            ..opts()
        })
        .unwrap();
        assert_eq!(l.end - l.start, 24 * 3600 - 15);
        assert!(e(Options {
            start: Some("2030-01-01T00:00:00".into()),
            ..opts()
        })
        .contains("after the trace's last event"));
        assert!(e(Options {
            input: Input::Trace("/nonexistent.csv".into()),
            ..opts()
        })
        .contains("cannot open /nonexistent.csv"));
    }

    /// The sample's GPU-slot replay with hosts' CPUs split by sensitivity differs from
    /// the GPU-proportional one (the rule is not a no-op where slots of a host are
    /// shared), and bad combinations are refused with what is allowed.
    #[test]
    fn cpu_alloc_on_the_sample_differs_from_proportional() {
        let with = |policy| Options {
            hours: Some(3.0),
            gpus_per_node: Some(6),
            gpu_granular: true,
            cpu_alloc: Some(CpuAlloc {
                policy,
                cpus_per_node: 18,
            }),
            ..opts()
        };
        let (_, prop) = replay(&with(CpuPolicy::Proportional));
        let (_, sens) = replay(&with(CpuPolicy::Sensitivity));
        conserved(&prop.report);
        conserved(&sens.report);
        assert_ne!(prop.report.samples, sens.report.samples);
        let e = |o: Options| load(&o).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e(Options {
            gpu_granular: false,
            ..with(CpuPolicy::Sensitivity)
        })
        .contains("--cpu-alloc splits the CPUs of hosts"));
        assert!(e(Options {
            cpu_alloc: Some(CpuAlloc {
                policy: CpuPolicy::Sensitivity,
                cpus_per_node: 5,
            }),
            ..with(CpuPolicy::Sensitivity)
        })
        .contains("--cpus-per-node 5: every GPU slot needs at least 1 CPU; allowed: at least --gpus-per-node (6)"));
    }

    #[test]
    fn gpu_granular_replay_of_the_sample() {
        let o = Options {
            hours: Some(3.0),
            gpus_per_node: Some(6),
            ..opts()
        };
        let (lw, whole) = replay(&o);
        let (lg, gran) = replay(&Options {
            gpu_granular: true,
            ..o.clone()
        });
        conserved(&whole.report);
        conserved(&gran.report);
        assert_eq!(lw.gpus, Some((6, false)));
        assert_eq!(gran.report.nodes, 6 * whole.report.nodes);
        // Whole idle nodes: the same idle GPU-hours either way; the slots' jobs ask 6
        // times the nodes' counts.
        let idle = 6.0 * whole.report.idle_node_h;
        assert!((gran.report.idle_node_h - idle).abs() < 1e-6 * idle);
        assert_eq!(lg.jobs[0].min_nodes, 6 * lw.jobs[0].min_nodes);
        assert_eq!(
            lg.node_names().unwrap()[7],
            bftrainer_core::placement::gpu_slot_name(&lw.node_names().unwrap()[1], 1)
        );
        let e = |o: Options| load(&o).err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e(Options {
            gpu_granular: true,
            gpus_per_node: None,
            ..opts()
        })
        .contains("--gpu-granular needs --gpus-per-node"));
        assert!(e(Options {
            gpus_per_node: Some(0),
            ..opts()
        })
        .contains("--gpus-per-node must be 1 to 64, found 0"));
        assert!(e(Options {
            gpu_granular: true,
            gpus_per_node: Some(65),
            ..opts()
        })
        .contains("GPUs per node must be 1 to 64, found 65"));
        assert!(e(Options {
            shared_nodes: true,
            gpus_per_node: Some(8),
            ..opts()
        })
        .contains("it needs --swf"));
    }
}

#[cfg(test)]
mod journal_tests {
    use super::replay_tests::opts;
    use super::*;

    /// Round trip: a replay writes its journal and its actions; replaying the journal
    /// into a fresh engine with the same policy gives the same actions, byte for byte.
    /// Under another policy (Tfwd 300 s) the same journal gives other actions.
    #[test]
    fn journal_replays_to_the_same_actions() {
        let dir = std::env::temp_dir().join(format!("bft-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (j, a1, a2, a3) = (
            dir.join("j.jsonl"),
            dir.join("a1.csv"),
            dir.join("a2.csv"),
            dir.join("a3.csv"),
        );
        run(&Options {
            hours: Some(2.0),
            write_journal: Some(j.clone()),
            actions_csv: Some(a1.clone()),
            ..opts()
        })
        .unwrap();
        run(&Options {
            input: Input::Journal(j.clone()),
            actions_csv: Some(a2.clone()),
            ..opts()
        })
        .unwrap();
        let (x, y) = (
            std::fs::read_to_string(&a1).unwrap(),
            std::fs::read_to_string(&a2).unwrap(),
        );
        assert!(x.lines().count() > 50, "{x}");
        assert!(x.lines().any(|l| l.contains(",admit,")));
        assert!(x.lines().any(|l| l.contains(",grow,")));
        assert_eq!(x, y);
        run(&Options {
            input: Input::Journal(j),
            actions_csv: Some(a3.clone()),
            t_fwd: 300.0,
            ..opts()
        })
        .unwrap();
        assert_ne!(x, std::fs::read_to_string(&a3).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
