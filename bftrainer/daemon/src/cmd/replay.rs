//! `bftrainer replay`: replay a node-event trace, an SWF log (through the EASY model) or
//! Slurm accounting through the engine; print the harvest report. No arguments: the sample.

use crate::replay::batch::BatchOptions;
use crate::replay::{self, compare, Input, Options};
use bftrainer_core::alloc::EfficiencyModel;
use bftrainer_core::easy::{Backfill, StartTimes};
use bftrainer_core::sim::cpus::CpuPolicy;
use bftrainer_core::sim::{CoreLoss, DaemonRules, Objective as CurveChoice, Steps, Workload};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "With no input option, replays the committed sample: one day of the Summit \
trace (2021-02-10T20:21:15 + 24 h, 4,734 nodes) with the first 200 ImageNet jobs of BFTrainer."
)]
pub struct Args {
    /// Node-event trace, `time,node,idle` (plain or gzip).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["swf", "from_sacct"])]
    pub trace: Option<PathBuf>,
    /// SWF job log (plain or gzip): the main scheduler is simulated (FCFS + backfilling)
    /// unless the log has wait times.
    #[arg(long, value_name = "PATH", conflicts_with = "from_sacct")]
    pub swf: Option<PathBuf>,
    /// Rebuild idle fragments from Slurm accounting (slurmdbd) between START and END
    /// (YYYY-MM-DDTHH:MM:SS UTC or Unix seconds), on this cluster's nodes.
    #[arg(long, num_args = 2, value_names = ["START", "END"])]
    pub from_sacct: Option<Vec<String>>,
    /// Replay an engine journal (JSON lines of `Record`, as `--write-journal` writes and
    /// bftrainerd will journal) into a fresh engine with the policy options given here;
    /// prints what the engine decided.
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with_all = ["trace", "swf", "from_sacct", "jobs", "node_classes", "start", "end", "hours", "node_limit", "steps", "grace", "curve", "seed", "no_check", "csv", "sizes_csv", "plots", "write_journal", "strict", "repeat", "arrivals", "release_before", "reclaim_hold", "start_latency", "core_loss", "no_daemon_rules", "batch_range"]
    )]
    pub journal: Option<PathBuf>,
    /// Write every event the replay sent to the engine as a journal (JSON lines).
    #[arg(long, value_name = "PATH")]
    pub write_journal: Option<PathBuf>,
    /// Write every action the engine returned as CSV (`t,action,job,nodes`); with
    /// --journal, the actions of the journal's replay.
    #[arg(long, value_name = "PATH")]
    pub actions_csv: Option<PathBuf>,
    /// With --from-sacct: leave out jobs of this partition (e.g. the elastic one);
    /// repeatable.
    #[arg(long, value_name = "NAME", requires = "from_sacct")]
    pub exclude_partition: Vec<String>,
    /// GPUs per node: also report the harvest in GPU-hours (K per node-hour).
    #[arg(long, value_name = "K")]
    pub gpus_per_node: Option<u32>,
    /// GPU-granular harvest (DeepBoot): each GPU of an idle node is a unit lent on its
    /// own (`host/gpuK`); a job's curve in GPUs is its node curve at g/K nodes, its
    /// minimum and maximum K times the file's. Needs --gpus-per-node.
    #[arg(long, requires = "gpus_per_node")]
    pub gpu_granular: bool,
    /// SWF: a model of shared nodes. Each job's processors are placed on the lowest-
    /// numbered free processors, --gpus-per-node of them per node (give the log's
    /// processors per node), each a GPU slot; a node is idle for whole-node harvest
    /// only when all its slots are. Needs --swf and --gpus-per-node.
    #[arg(long, requires_all = ["swf", "gpus_per_node"])]
    pub shared_nodes: bool,
    /// How each host's CPUs are split between the jobs holding its GPU slots (Synergy):
    /// proportional (to GPUs) or sensitivity (by each job's CPU curve, alloc::synergy);
    /// both, comma-separated, compare them in one table. Job i of the file has Synergy's
    /// measured profile i mod 10 (docs/replay.md). Needs --gpu-granular and
    /// --cpus-per-node.
    #[arg(
        long,
        value_name = "POLICY",
        value_delimiter = ',',
        requires_all = ["gpu_granular", "cpus_per_node"]
    )]
    pub cpu_alloc: Vec<CpuAllocArg>,
    /// CPUs of each GPU host, for --cpu-alloc (the GPU-proportional share of a full
    /// host, CPUs / --gpus-per-node, is where the job file's curves hold).
    #[arg(long, value_name = "C", requires = "cpu_alloc")]
    pub cpus_per_node: Option<u32>,
    /// Elastic job file in BFTrainer's jobs-*.csv format; default: the sample's. Optional
    /// columns after its ten: gpus_per_node, gpu_type, constraint, mem_per_node.
    #[arg(long, value_name = "PATH")]
    pub jobs: Option<PathBuf>,
    /// What the nodes offer: a TOML file of [[class]] tables (nodes = HOSTLIST or
    /// index = RANGES; features, gres, mem). Jobs with needs get only nodes that serve
    /// them. With --from-sacct, slurmctld's node table is used without it.
    #[arg(long, value_name = "TOML")]
    pub node_classes: Option<PathBuf>,
    /// Replay from this time (YYYY-MM-DDTHH:MM:SS UTC or Unix seconds); earlier events
    /// only shape the initial state.
    #[arg(long, value_name = "TIME")]
    pub start: Option<String>,
    /// Stop at this time.
    #[arg(long, value_name = "TIME", conflicts_with = "hours")]
    pub end: Option<String>,
    /// Stop this many hours after the start.
    #[arg(long, value_name = "H")]
    pub hours: Option<f64>,
    /// Keep only the first N nodes of the trace, in file order.
    #[arg(long, value_name = "N")]
    pub node_limit: Option<usize>,
    /// Backfilling of the SWF scheduler model.
    #[arg(long, value_enum, default_value = "easy")]
    pub backfill: BackfillArg,
    /// SWF: simulate the scheduler, or use the log's start times (auto: when it has them).
    #[arg(long, value_enum, default_value = "auto")]
    pub start_times: StartTimesArg,
    /// SWF: machine size in nodes (default: the log's MaxNodes).
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// SWF: processors per node (default: MaxProcs / MaxNodes).
    #[arg(long, value_name = "P")]
    pub procs_per_node: Option<u32>,
    /// At most this many elastic jobs at once (admitted in submit order).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub max_jobs: usize,
    /// Forward-looking time Tfwd of the allocator, seconds. Several (repeated, or
    /// comma-separated): one replay per value, compared in one table.
    #[arg(long, default_value = "10", value_name = "S", value_delimiter = ',')]
    pub t_fwd: Vec<f64>,
    /// When the replay steps. exact: also at each submission and at the exact time a
    /// job completes; trace: only at the trace's event times, as BFTrainer's replayer
    /// (submissions wait for the next event, a done job keeps its nodes until it).
    #[arg(long, value_enum, default_value = "exact")]
    pub steps: StepsArg,
    /// Preemption grace period, seconds (Slurm GraceTime).
    #[arg(long, default_value_t = 0.0, value_name = "S")]
    pub grace: f64,
    /// Allocator objective: bftrainer, efficiency, fairness, remaining-work, reclaim-aware.
    /// Several (repeated, or comma-separated): one replay per objective (per objective and
    /// --t-fwd value when both are several), compared in one table.
    #[arg(
        long,
        default_value = "bftrainer",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub objective: Vec<String>,
    /// Compare policies: each TOML file names one (keys name, objective, t_fwd,
    /// max_jobs, grace, curve, steps; a key left out takes this command line's value).
    /// The input is loaded once and replayed once per file; one table, a column each.
    #[arg(
        long,
        value_name = "TOML",
        num_args = 1..,
        conflicts_with_all = ["journal", "csv", "sizes_csv", "plots", "write_journal", "actions_csv"]
    )]
    pub compare: Vec<PathBuf>,
    /// Which job-file curve the allocator maximises: the `curve_objective` column, or
    /// throughput in samples/s.
    #[arg(long, value_enum, default_value = "objective")]
    pub curve: CurveArg,
    /// 0: nodes enter the idle pool in trace order; otherwise the initial idle pool is
    /// shuffled with this seed (changes the allocator's tie-breaks). Also seeds
    /// --arrivals. Same seed, same result.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Refuse a trace or SWF log whose records are out of time order, or an SWF log
    /// with jobs the model cannot use (wider than the machine, bad run times), instead
    /// of sorting it / skipping them with a warning.
    #[arg(long)]
    pub strict: bool,
    /// Cycle the job file: each job is submitted again (a new job, NAME#k) each time it
    /// finishes, so the workload never runs dry.
    #[arg(long, conflicts_with = "arrivals")]
    pub repeat: bool,
    /// Poisson arrivals of RATE jobs per hour (> 0) from the window's start, each drawn
    /// from the job file (its submit times are ignored); seeded by --seed.
    #[arg(long, value_name = "RATE", allow_negative_numbers = true)]
    pub arrivals: Option<f64>,
    /// bftrainerd's rule: a node the backfill plan gives a regular job within S seconds
    /// is taken back (not lent, or shrunk off its job) that long before; a job's core
    /// nodes are kept. The trace's own claim times stand for the plan. 0: off.
    #[arg(long, default_value_t = DaemonRules::DAEMON.release_before_s, value_name = "S")]
    pub release_before: f64,
    /// bftrainerd's rule: a node a regular job leaves, or a core node freed when its job
    /// is requeued, is lent only S seconds later. 0: off.
    #[arg(long, default_value_t = DaemonRules::DAEMON.reclaim_hold_s, value_name = "S")]
    pub reclaim_hold: f64,
    /// Seconds from an admission (grow) to the core job (satellite) running; its nodes
    /// are held but do no work meanwhile. 0: at once.
    #[arg(long, default_value_t = DaemonRules::DAEMON.start_latency_s, value_name = "S")]
    pub start_latency: f64,
    /// What losing a core node to a regular job costs: job (as bftrainerd: the whole job
    /// is requeued) or node (that node only).
    #[arg(long, value_enum, default_value = "job")]
    pub core_loss: CoreLossArg,
    /// None of bftrainerd's rules (--release-before 0 --reclaim-hold 0 --start-latency 0
    /// --core-loss node): the plain job model, as replays before they were modelled.
    #[arg(long, conflicts_with_all = ["release_before", "reclaim_hold", "start_latency", "core_loss"])]
    pub no_daemon_rules: bool,
    /// Without fair shares: declared curves weigh against each other as they are and
    /// declared rescale costs have no floor (bftrainerd before fair shares).
    #[arg(long)]
    pub no_fair_share: bool,
    /// Batch size as the allocator's decision (Saxena et al. 2020): replay twice, every
    /// job at --fixed-batch, then nodes and global batch chosen together from LO:HI, and
    /// print the gain. Model: docs/replay.md, "Batch size as a decision".
    #[arg(long, value_name = "LO:HI", value_parser = crate::replay::batch::parse_range,
          conflicts_with_all = ["csv", "sizes_csv", "plots", "write_journal", "actions_csv"])]
    pub batch_range: Option<(u32, u32)>,
    /// The global batch at which the job file's throughput curves were measured.
    #[arg(
        long,
        default_value_t = 256,
        value_name = "B",
        requires = "batch_range"
    )]
    pub base_batch: u32,
    /// The fixed run's global batch (default: --base-batch).
    #[arg(long, value_name = "B", requires = "batch_range")]
    pub fixed_batch: Option<u32>,
    /// Weigh samples by the statistical efficiency of this gradient noise scale
    /// (samples; McCandlish et al. 2018) instead of Saxena's assumption that every batch
    /// of the range is as sample-efficient as the base one.
    #[arg(
        long,
        value_name = "B_NOISE",
        requires = "batch_range",
        allow_negative_numbers = true
    )]
    pub noise_scale: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the per-step log (one row per event time) as CSV.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
    /// Write each elastic job's node count over time as CSV (`t,time,job,nodes`, one
    /// row per change).
    #[arg(long, value_name = "PATH")]
    pub sizes_csv: Option<PathBuf>,
    /// Write plots here: idle vs harvested, nodes per job (stacked), cumulative samples,
    /// idle fragments by duration.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Format of the plots: svg, png or both.
    #[arg(long, default_value = "svg", value_name = "FORMAT", requires = "plots")]
    pub plot_format: String,
    /// Skip the invariant checker (up to 1.5x less replay time on the full Summit trace).
    #[arg(long)]
    pub no_check: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackfillArg {
    Easy,
    Conservative,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StartTimesArg {
    Auto,
    Simulate,
    Log,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StepsArg {
    Exact,
    Trace,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CpuAllocArg {
    Proportional,
    Sensitivity,
}

impl From<CpuAllocArg> for CpuPolicy {
    fn from(a: CpuAllocArg) -> Self {
        match a {
            CpuAllocArg::Proportional => CpuPolicy::Proportional,
            CpuAllocArg::Sensitivity => CpuPolicy::Sensitivity,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CoreLossArg {
    Job,
    Node,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CurveArg {
    Objective,
    Samples,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let input = if let Some(p) = &args.journal {
        Input::Journal(p.clone())
    } else if let Some(p) = &args.trace {
        Input::Trace(p.clone())
    } else if let Some(p) = &args.swf {
        Input::Swf(p.clone())
    } else if let Some(w) = &args.from_sacct {
        Input::Sacct {
            start: w[0].clone(),
            end: w[1].clone(),
            exclude: args.exclude_partition.clone(),
        }
    } else {
        Input::Sample
    };
    let opts = Options {
        gpus_per_node: args.gpus_per_node,
        gpu_granular: args.gpu_granular,
        shared_nodes: args.shared_nodes,
        cpu_alloc: match (args.cpu_alloc.first(), args.cpus_per_node) {
            (Some(&p), Some(c)) => Some(replay::CpuAlloc {
                policy: p.into(),
                cpus_per_node: c,
            }),
            _ => None,
        },
        input,
        jobs: args.jobs.clone(),
        node_classes: args.node_classes.clone(),
        start: args.start.clone(),
        end: args.end.clone(),
        hours: args.hours,
        node_limit: args.node_limit,
        backfill: match args.backfill {
            BackfillArg::Easy => Backfill::Easy,
            BackfillArg::Conservative => Backfill::Conservative,
        },
        start_times: match args.start_times {
            StartTimesArg::Auto => StartTimes::Auto,
            StartTimesArg::Simulate => StartTimes::Simulate,
            StartTimesArg::Log => StartTimes::Log,
        },
        nodes: args.nodes,
        procs_per_node: args.procs_per_node,
        max_jobs: args.max_jobs,
        t_fwd: args.t_fwd[0],
        steps: match args.steps {
            StepsArg::Exact => Steps::Exact,
            StepsArg::Trace => Steps::Trace,
        },
        grace: args.grace,
        objective: args.objective[0].clone(),
        curve: match args.curve {
            CurveArg::Objective => CurveChoice::File,
            CurveArg::Samples => CurveChoice::Samples,
        },
        seed: args.seed,
        json: args.json,
        csv: args.csv.clone(),
        sizes_csv: args.sizes_csv.clone(),
        write_journal: args.write_journal.clone(),
        actions_csv: args.actions_csv.clone(),
        plots: args.plots.clone(),
        plot_format: args.plot_format.parse()?,
        policies: Vec::new(),
        check: !args.no_check,
        progress: !args.quiet && !args.json,
        strict: args.strict,
        workload: match (args.repeat, args.arrivals) {
            (_, Some(per_hour)) => Workload::Arrivals { per_hour },
            (true, None) => Workload::Repeat,
            (false, None) => Workload::File,
        },
        fair_share: !args.no_fair_share,
        rules: if args.no_daemon_rules {
            DaemonRules::NONE
        } else {
            DaemonRules {
                release_before_s: args.release_before,
                reclaim_hold_s: args.reclaim_hold,
                start_latency_s: args.start_latency,
                core_loss: match args.core_loss {
                    CoreLossArg::Job => CoreLoss::Job,
                    CoreLossArg::Node => CoreLoss::Node,
                },
            }
        },
        batch: args.batch_range.map(|range| BatchOptions {
            model: EfficiencyModel {
                base_batch: args.base_batch,
                noise_scale: args.noise_scale,
            },
            range,
            fixed: args.fixed_batch.unwrap_or(args.base_batch),
        }),
    };
    let several = args.objective.len() > 1 || args.t_fwd.len() > 1;
    let policies = if !args.compare.is_empty() {
        if several {
            anyhow::bail!("--compare takes each policy from its file: give --objective and --t-fwd once (a default for keys the files leave out) or not at all");
        }
        compare::policy_files(&args.compare, &opts)?
    } else if several {
        compare::product(&args.objective, &args.t_fwd, &opts)?
    } else {
        Vec::new()
    };
    let policies = compare::batch_pair(policies, &opts)?;
    let cpu: Vec<CpuPolicy> = args.cpu_alloc.iter().map(|&c| c.into()).collect();
    let policies = compare::cpu_pair(policies, &opts, &cpu)?;
    replay::run(&replay::Options { policies, ..opts })
}
