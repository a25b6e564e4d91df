//! bft-run: the launcher of elastic jobs.
//!
//! - `bft-run [OPTIONS] -- CMD...` in the core job's batch script: the job's
//!   coordinator here, one agent per node of the core allocation in a job step;
//! - `bft-run --join PARENT` in a satellite (bftrainerd runs it): an agent that finds
//!   the parent's coordinator in the parent's Comment and joins it;
//! - `bft-run --local N -- CMD...`: coordinator and N agents on this machine, no Slurm;
//! - `bft-run hosts`: the job's hosts as `host:slots` lines (inside the job).
//!
//! `--mode torchrun` runs unmodified torchrun-style scripts, `--mode mpi` MPI
//! programs (one mpirun per generation, its daemons started by `bft-run rsh`): a new
//! world at each generation (world.rs), where the library's workers (native mode)
//! stay up.
//!
//! docs/design.md ("Elastic runtime") has the protocol, docs/user.md the user's view.

/// `eprintln!` as one write (see [`proto::write_err`]).
macro_rules! say {
    ($($arg:tt)*) => { $crate::proto::write_err(format!($($arg)*)) };
}

mod agent;
mod coord;
mod gpus;
mod hosts;
mod kv;
mod membership;
mod proto;
mod rsh;
mod votes;
mod world;

use bftrainer_core::runtime::RunComment;
use bftrainer_core::spec;
use bftrainer_slurm::munge::Munge;
use bftrainer_slurm::JobBase;
use clap::Parser;
use coord::{CoordConfig, Coordinator, Mode};
use std::collections::BTreeMap;
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "bft-run",
    version,
    about = "Run an elastic training job on the nodes bftrainerd lends it",
    after_help = "Inside an elastic job:  bft-run -- python train.py\n\
                  In a satellite:          bft-run --join PARENT_JOB_ID   (bftrainerd runs it)\n\
                  On this machine:         bft-run --local 2 -- python train.py\n\
                  A torchrun script:       bft-run --mode torchrun -- train.py ARGS\n\
                  An MPI program:          bft-run --mode mpi -- python train_mpi.py ARGS\n\
                  The job's hosts:         bft-run hosts\n\
                  The GPUs it would use:   bft-run --probe-gpus",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    /// How workers run: `native` (the bftrainer library: workers stay up and rebuild
    /// their process group at each generation), `torchrun` (unmodified
    /// torchrun-style scripts: at each generation the old world gets SIGTERM, and
    /// after at most --leave-timeout a new static-size world starts with torchrun's
    /// environment; the script resumes from its own checkpoint) or `mpi` (an MPI
    /// program: each generation one Open MPI mpirun over the job's nodes, whose
    /// remote daemons bft-run starts under each node's agent; the old world's ranks
    /// get SIGUSR1, SIGKILL after --leave-timeout; the program resumes from its own
    /// checkpoint).
    #[arg(long, default_value = "native", value_parser = mode)]
    mode: Mode,
    /// torchrun mode: seconds a joining node waits to be taken in (others joining
    /// meanwhile come with it, in one restart), and the least time between a world's
    /// start and a restart for growth. Losses and failures restart at once.
    #[arg(long, default_value_t = 5.0, value_parser = seconds)]
    settle: f64,
    /// NCCL_SOCKET_IFNAME for the workers (default: the job's own, else the
    /// interface of each node's address toward the coordinator).
    #[arg(long, value_name = "IFNAME", value_parser = net_name)]
    nccl_socket_ifname: Option<String>,
    /// GLOO_SOCKET_IFNAME for the workers (default as --nccl-socket-ifname).
    #[arg(long, value_name = "IFNAME", value_parser = net_name)]
    gloo_socket_ifname: Option<String>,
    /// NCCL_IB_HCA for the workers (e.g. mlx5_0:1,mlx5_1:1).
    #[arg(long, value_name = "HCA", value_parser = net_name)]
    nccl_ib_hca: Option<String>,
    /// Seconds a collective may take before it fails: BFT_PG_TIMEOUT for the
    /// library's process groups (a torchrun script may read it for
    /// init_process_group's timeout; torch itself reads no variable for it).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pg_timeout: Option<f64>,
    /// Print the GPUs of this node (NVML: index, name, UUID, memory; and
    /// CUDA_VISIBLE_DEVICES) and the workers per node they make, and exit.
    #[arg(long, conflicts_with_all = ["join", "local", "agent"])]
    probe_gpus: bool,
    /// Join the coordinator of this elastic job (in a satellite job).
    #[arg(long, value_name = "PARENT_JOB_ID", conflicts_with_all = ["local", "agent"])]
    join: Option<u32>,
    /// Run the coordinator and N agents on this machine, without Slurm.
    #[arg(long, value_name = "N")]
    local: Option<usize>,
    /// Workers per node (default: one per GPU of the node, else 1). Every worker of a
    /// node sees all of its GPUs and takes the one of its LOCAL_RANK.
    #[arg(long, value_name = "N")]
    nproc_per_node: Option<usize>,
    /// Workers that must be ready before the first generation (default: the core
    /// allocation's workers).
    #[arg(long, value_name = "N")]
    min_workers: Option<usize>,
    /// Restarts of workers killed by a signal, per agent, within --restart-window.
    #[arg(long, default_value_t = 3)]
    max_restarts: u32,
    /// The window of --max-restarts, in seconds: a worker that keeps dying by a
    /// signal more often than that is not restarted, and the job ends once nobody is
    /// left.
    #[arg(long, default_value_t = 600.0, value_parser = seconds)]
    restart_window: f64,
    /// Seconds a member may take to acknowledge an abort (its library's background
    /// thread answers at once, whatever the step time) before it is dropped as hung.
    #[arg(long, default_value_t = 5.0, value_parser = seconds)]
    broken_timeout: f64,
    /// Seconds of silence after which a worker (no heartbeat, or stopped) or an agent
    /// (a frozen or cut-off node) is taken as hung: the bound on noticing a frozen
    /// peer.
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    hang_timeout: f64,
    /// Seconds a leaving node's workers get to finish their step, and finished workers
    /// to exit (a final save) once the job is over; then they are killed.
    #[arg(long, default_value_t = 30.0, value_parser = seconds)]
    leave_timeout: f64,
    /// The address agents reach the coordinator at (default: this host's).
    #[arg(long, value_name = "HOST")]
    coord_host: Option<String>,
    /// Trace every protocol message on stderr (coordinator and agents).
    #[arg(short, long)]
    verbose: bool,
    /// Write the coordinator's HOST:PORT here once it listens.
    #[arg(long, value_name = "PATH")]
    coord_file: Option<String>,
    /// (internal, tests) Outside Slurm, write what would be the job's Comment here at
    /// each change (the measured rate and rescale costs).
    #[arg(long, hide = true, value_name = "PATH")]
    comment_file: Option<String>,
    /// Outside Slurm (`--local`), read the global batch to hand the workers from this
    /// file (a whole number; empty or absent: none), as bftrainerd's `batch_now` would
    /// be read from the job's tag: for tests and trying the library's batch changes.
    #[arg(long, value_name = "PATH", requires = "local")]
    batch_file: Option<String>,
    /// (internal) Run an agent that joins the coordinator at --coord.
    #[arg(long, hide = true, requires = "coord")]
    agent: bool,
    #[arg(long, hide = true, value_name = "HOST:PORT")]
    coord: Option<String>,
    /// (internal) The job and run the coordinator at --coord must answer for.
    #[arg(long, hide = true, value_name = "JOB")]
    coord_job: Option<String>,
    #[arg(long, hide = true, value_name = "RUN")]
    coord_run: Option<String>,
    #[arg(long, hide = true)]
    node_name: Option<String>,
    /// The training command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    cmd: Vec<String>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Print the job's hosts, `host:slots` one a line (slots: workers per node), as
    /// Horovod elastic's --host-discovery-script wants them. Run it inside the job:
    /// it asks the job's coordinator (BFT_COORD in a worker's environment, else the
    /// Comment of --job or of SLURM_JOB_ID), both sides proving themselves with MUNGE.
    Hosts {
        /// The elastic job (default: the job this runs in).
        #[arg(long, value_name = "JOB_ID")]
        job: Option<u32>,
        /// Print each node's address toward the coordinator instead of its name.
        #[arg(long)]
        addresses: bool,
    },
    /// (internal) `--mode mpi`'s remote launcher (mpirun's plm_rsh_agent): runs CMD
    /// on HOST under that node's agent, through the job's coordinator.
    #[command(hide = true)]
    Rsh {
        host: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
}

fn mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("{s:?} is not a mode: native, torchrun or mpi"))
}

/// An interface or HCA list as NCCL and Gloo take it (`eth0`, `^docker,lo`,
/// `=ib0`, `mlx5_0:1,mlx5_1:1`): nothing a shell or an environment would mangle.
fn net_name(s: &str) -> Result<String, String> {
    if bftrainer_core::config::net_name_ok(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{:?} is not an interface or HCA list (letters, digits and _.:,^=- only)",
            proto::brief(s)
        ))
    }
}

/// A number of seconds over 0.
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds over 0")),
    }
}

/// A number of seconds: finite and not negative.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds (0 or more)")),
    }
}

fn main() {
    proto::mark_start();
    let cli = Cli::parse();
    proto::set_verbose(cli.verbose);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(cli));
    rt.shutdown_timeout(Duration::from_millis(200));
    std::process::exit(code);
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    say!("bft-run: {msg}");
    code
}

async fn run(cli: Cli) -> i32 {
    if let Some(Sub::Hosts { job, addresses }) = &cli.sub {
        return hosts::run(*job, *addresses).await;
    }
    if let Some(Sub::Rsh { host, cmd }) = &cli.sub {
        return rsh::run(host.clone(), cmd.clone()).await;
    }
    if cli.probe_gpus {
        let (report, _) = gpus::probe_report();
        print!("{report}");
        return 0;
    }
    if cli.agent {
        let munge = Munge::from_auth_info(std::env::var("BFT_MUNGE_SOCKET").ok(), None);
        return agent::run(agent_options(
            &cli,
            cli.coord.clone().unwrap_or_default(),
            cli.coord_job.clone(),
            cli.coord_run.clone(),
            munge,
        ))
        .await;
    }
    if let Some(parent) = cli.join {
        return join(&cli, parent).await;
    }
    if cli.cmd.is_empty() {
        return fail(
            2,
            "no command: give the training command after --, e.g. bft-run -- python train.py",
        );
    }
    coordinate(&cli).await
}

fn node_name(cli: &Cli) -> String {
    cli.node_name
        .clone()
        .or_else(|| std::env::var("SLURMD_NODENAME").ok())
        .unwrap_or_else(hostname)
}

/// `coord_job`, `coord_run`: the elastic job and run whose coordinator the agent
/// means to join; the coordinator must answer for them.
fn agent_options(
    cli: &Cli,
    coord: String,
    coord_job: Option<String>,
    coord_run: Option<String>,
    munge: Munge,
) -> agent::AgentOptions {
    let gpus = gpus::node_gpus().devices;
    agent::AgentOptions {
        coord,
        coord_job,
        coord_run,
        node_name: node_name(cli),
        munge,
        slurm_job: std::env::var("SLURM_JOB_ID").ok(),
        local_nproc: cli.nproc_per_node.unwrap_or(gpus.len()).max(1),
        gpus,
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// This host's address for other nodes: the hostname's first non-loopback address,
/// else the address of the default route, else loopback.
fn own_address() -> String {
    let resolved = (hostname().as_str(), 0)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback());
    let routed = || {
        let s = UdpSocket::bind("0.0.0.0:0").ok()?;
        s.connect("192.0.2.1:9").ok()?;
        s.local_addr()
            .ok()
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified())
    };
    resolved
        .or_else(routed)
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
        .to_string()
}

/// Variables each agent sets for its own workers (or that belong to this bft-run):
/// never passed from the coordinator. The library's settings (BFT_PG_TIMEOUT,
/// BFT_BACKEND, BFT_TRACE...) are passed like any other variable of the user's.
const AGENT_SET_VARS: &[&str] = &[
    "BFT_AGENT_SOCK",
    "BFT_WORKER_ID",
    "BFT_LOCAL_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    // The library sets these for each generation; a value from the batch script's
    // environment would be stale.
    "RANK",
    "WORLD_SIZE",
    "BFT_NODE_ADDR",
    "BFT_NODE_NAME",
    "BFT_JOB",
    "BFT_MUNGE_SOCKET",
    "BFT_COORD",
    "BFT_COORD_RUN",
    "BFT_GENERATION",
    // The decided global batch of a restarting mode's world: only bft-run's, from the
    // job's tag (a value in the job's own environment would be the user's word).
    agent::BATCH_VAR,
    // torchrun mode's world, set per generation.
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
];

/// The environment workers get: ours without Slurm's and bft-run's own variables and
/// without the node's device binding (each agent sets its own node's).
fn worker_env(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.filter(|(k, _)| {
        (!k.starts_with("SLURM_") || k == "SLURM_CONF")
            && !k.starts_with("SLURMD_")
            && !AGENT_SET_VARS.contains(&k.as_str())
            && !agent::NODE_LOCAL_VARS.contains(&k.as_str())
    })
    .collect()
}

/// The site's `[runtime]` network settings from bftrainer.toml (`BFTRAINER_CONFIG`,
/// else beside `SLURM_CONF`, else /etc/slurm/bftrainer.toml, as the plugin and
/// bftrainerd find it): none when the file is absent or unreadable (it is the site's,
/// and optional for bft-run); a bad value is said and ignored (bftrainerd refuses the
/// same file, so the site hears of it).
fn site_runtime() -> bftrainer_core::config::RuntimeNet {
    let env = |k: &str| std::env::var(k).ok().filter(|p| !p.is_empty());
    let path = env("BFTRAINER_CONFIG").unwrap_or_else(|| {
        env("SLURM_CONF")
            .and_then(|c| {
                std::path::Path::new(&c)
                    .parent()
                    .map(|d| d.join("bftrainer.toml").to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "/etc/slurm/bftrainer.toml".into())
    });
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Default::default();
    };
    bftrainer_core::config::read_runtime_net(&text, &path).unwrap_or_else(|e| {
        say!("bft-run: ignoring the site's [runtime] network settings: {e}");
        Default::default()
    })
}

/// The communication libraries' settings: a flag, else the job's own environment
/// (`in_env`: left as it is), else the site's `[runtime]`; the default interface is
/// each agent's (agent.rs).
fn net_env(
    cli: &Cli,
    site: &bftrainer_core::config::RuntimeNet,
    in_env: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let mut set = |k: &str, flag: &Option<String>, site: &Option<String>| {
        if let Some(x) = flag {
            v.push((k.to_string(), x.clone()));
        } else if let Some(x) = site.as_ref().filter(|_| !in_env(k)) {
            v.push((k.to_string(), x.clone()));
        }
    };
    set(
        "NCCL_SOCKET_IFNAME",
        &cli.nccl_socket_ifname,
        &site.nccl_socket_ifname,
    );
    set(
        "GLOO_SOCKET_IFNAME",
        &cli.gloo_socket_ifname,
        &site.gloo_socket_ifname,
    );
    set("NCCL_IB_HCA", &cli.nccl_ib_hca, &site.nccl_ib_hca);
    set(
        "BFT_PG_TIMEOUT",
        &cli.pg_timeout.map(|t| t.to_string()),
        &site.pg_timeout.map(|t| t.to_string()),
    );
    if cli.mode == Mode::Torchrun && !in_env("TORCH_NCCL_ASYNC_ERROR_HANDLING") {
        // As torchrun: a failed or timed-out NCCL collective ends the process (which
        // the world's restart then handles) instead of hanging it.
        v.push(("TORCH_NCCL_ASYNC_ERROR_HANDLING".into(), "1".into()));
    }
    v
}

/// The workers' command: in torchrun mode a script path (`train.py`) runs under the
/// python on the workers' PATH, unbuffered, as torchrun runs it.
fn worker_argv(mode: Mode, cmd: &[String], path: Option<&str>) -> Vec<String> {
    let script = cmd.first().is_some_and(|c| c.ends_with(".py"));
    if mode == Mode::Native || !script {
        return cmd.to_vec();
    }
    let on_path = |name: &str| {
        path.unwrap_or("")
            .split(':')
            .filter(|d| !d.is_empty())
            .any(|d| std::path::Path::new(d).join(name).is_file())
    };
    let python = if on_path("python") {
        "python"
    } else {
        "python3"
    };
    let mut v = vec![python.to_string(), "-u".into()];
    v.extend(cmd.iter().cloned());
    v
}

async fn join(cli: &Cli, parent: u32) -> i32 {
    let slurm = match bftrainer_slurm::Slurm::init() {
        Ok(s) => s,
        Err(e) => return fail(2, format!("cannot use Slurm to find job {parent}: {e}")),
    };
    let munge = Munge::from_auth_info(
        std::env::var("BFT_MUNGE_SOCKET").ok(),
        slurm.auth_info().ok().flatten().as_deref(),
    );
    let start = Instant::now();
    let coord = loop {
        let why = match slurm.load_job(parent) {
            Ok(j) => match (j.state.base(), j.comment.as_deref().and_then(RunComment::parse)) {
                // Only this run's address: the Comment of a requeued job names the
                // previous run's coordinator until the new one publishes its own,
                // and another user may hold that address now.
                (JobBase::Running, Some(c)) if fresh_comment(&c, j.start_time) => break c,
                (JobBase::Running, Some(c)) if c.run.is_empty() => format!(
                    "elastic job {parent}'s Comment names a coordinator without a run id (a bft-run older than this one?); waiting for this run's"
                ),
                (JobBase::Running, Some(_)) => format!(
                    "elastic job {parent}'s Comment still names the coordinator of an earlier start; waiting for this run's"
                ),
                (JobBase::Running, None) => format!(
                    "elastic job {parent} has not published its coordinator (coord= in its Comment) yet"
                ),
                (JobBase::Pending | JobBase::Suspended, _) => {
                    format!("elastic job {parent} is {}", j.state.name())
                }
                _ => {
                    return fail(
                        2,
                        format!(
                            "elastic job {parent} is not running ({}); a satellite joins a running job",
                            j.state.name()
                        ),
                    )
                }
            },
            Err(e) if e.is_invalid_job_id() => {
                return fail(2, format!("elastic job {parent} not found: {e}"))
            }
            Err(e) => format!("cannot look up elastic job {parent}: {e}"),
        };
        if start.elapsed() > Duration::from_secs(60) {
            return fail(2, format!("{why} (gave up after 60 s)"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    agent::run(agent_options(
        cli,
        coord.coord,
        Some(parent.to_string()),
        Some(coord.run),
        munge,
    ))
    .await
}

/// Whether `j`, the job this bft-run coordinates, is an elastic core job that Slurm
/// started without bftrainerd's admission ([`spec::unadmitted`], the check
/// spank/bftrainer makes before the batch script runs; bft-run repeats it for nodes
/// without the plugin). Plain jobs are never unadmitted.
fn unadmitted_start(j: &bftrainer_slurm::Job) -> bool {
    spec::unadmitted(
        j.admin_comment.as_deref(),
        j.comment.as_deref(),
        j.restart_count,
        j.start_time,
        j.state.base() == JobBase::Running,
    )
}

/// Requeues an unadmitted start ([`unadmitted_start`]) held, with a note in the
/// Comment that bftrainerd reads as "admit me" (not as a site's requeue with hold):
/// the training waits for bftrainerd instead of running where Slurm put it. Slurm then
/// ends this start. A requeue that fails is an error to log, and the training runs
/// where it was started, as before bft-run checked (bftrainerd requeues it if the nodes
/// are not the ones it holds for the job).
fn requeue_unadmitted(
    slurm: &bftrainer_slurm::Slurm,
    j: &bftrainer_slurm::Job,
) -> Result<(), String> {
    let id = j.job_id;
    say!(
        "bft-run: job {id} was started by Slurm without bftrainerd's admission (run {}, Comment {:?}): requeueing it held until bftrainerd admits it",
        j.restart_count,
        j.comment.as_deref().unwrap_or("")
    );
    let note = bftrainer_slurm::JobUpdate {
        comment: Some(spec::unadmitted_note(j.restart_count)),
        ..Default::default()
    };
    slurm.update_job(id, &note).map_err(|e| {
        format!("cannot write the note into job {id}'s Comment ({e}); it runs without bftrainerd's admission")
    })?;
    slurm.requeue(id, true).map_err(|e| {
        // Requeued by someone else since the lookup (Slurm refuses a pending job): the
        // note must not turn their requeue into an "admit me" for bftrainerd.
        let back = bftrainer_slurm::JobUpdate {
            comment: Some(j.comment.clone().unwrap_or_default()),
            ..Default::default()
        };
        let restored = match slurm.update_job(id, &back) {
            Ok(()) => "its Comment restored".to_string(),
            Err(e2) => format!("its Comment not restored: {e2}"),
        };
        format!("cannot requeue job {id} held ({e}; {restored}); it runs without bftrainerd's admission")
    })
}

/// A Comment a satellite may follow: it carries a run id and was written by the run
/// that began at the job's current start time.
fn fresh_comment(c: &RunComment, job_start: Option<i64>) -> bool {
    !c.run.is_empty() && job_start.is_some_and(|s| s == c.start)
}

async fn coordinate(cli: &Cli) -> i32 {
    let local = cli.local;
    let job = match (local, std::env::var("SLURM_JOB_ID")) {
        (Some(_), _) => "local".to_string(),
        (None, Ok(j)) => j,
        (None, Err(_)) => {
            return fail(
                2,
                "not inside a Slurm job (SLURM_JOB_ID is not set); run it from an sbatch script, or try it on this machine with --local N",
            )
        }
    };
    let slurm = if local.is_none() {
        match bftrainer_slurm::Slurm::init() {
            Ok(s) => Some(s),
            Err(e) => return fail(2, format!("cannot use Slurm: {e}")),
        }
    } else {
        None
    };
    let munge = Munge::from_auth_info(
        std::env::var("BFT_MUNGE_SOCKET").ok(),
        slurm
            .as_ref()
            .and_then(|s| s.auth_info().ok().flatten())
            .as_deref(),
    );
    let bind = if local.is_some() {
        "127.0.0.1:0"
    } else {
        "0.0.0.0:0"
    };
    let listener = match tokio::net::TcpListener::bind(bind).await {
        Ok(l) => l,
        Err(e) => return fail(1, format!("cannot listen for agents: {e}")),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let host = cli.coord_host.clone().unwrap_or_else(|| {
        if local.is_some() {
            "127.0.0.1".into()
        } else {
            own_address()
        }
    });
    let advertised = format!("{host}:{port}");
    let run = proto::fresh_id();
    if let Some(f) = &cli.coord_file {
        if let Err(e) = std::fs::write(f, format!("{advertised} {job} {run}\n")) {
            return fail(1, format!("cannot write {f}: {e}"));
        }
    }
    // The start time of this run of the job: satellites follow only a Comment with it.
    let started = match (&slurm, job.parse::<u32>()) {
        (Some(s), Ok(id)) => match s.load_job(id) {
            Ok(j) if unadmitted_start(&j) => match requeue_unadmitted(s, &j) {
                Ok(()) => return 0,
                Err(e) => {
                    say!("bft-run: {e}");
                    j.start_time.unwrap_or(0)
                }
            },
            Ok(j) => j.start_time.unwrap_or(0),
            Err(e) => return fail(1, format!("cannot look up job {job}: {e}")),
        },
        _ => 0,
    };
    let opts = coord::AgentOpts {
        max_restarts: cli.max_restarts,
        restart_window: cli.restart_window,
        leave_timeout: cli.leave_timeout,
        hang_timeout: cli.hang_timeout.max(1.0),
        verbose: cli.verbose,
    };
    let nodes = match local {
        Some(n) => n,
        None => std::env::var("SLURM_JOB_NUM_NODES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
    };
    let per_node = cli
        .nproc_per_node
        .unwrap_or_else(|| gpus::node_gpus().devices.len())
        .max(1);
    let mut env = worker_env(std::env::vars());
    let site = site_runtime();
    for (k, v) in net_env(cli, &site, |k| std::env::var_os(k).is_some()) {
        env.insert(k, v);
    }
    let cfg = CoordConfig {
        job: job.clone(),
        argv: worker_argv(cli.mode, &cli.cmd, env.get("PATH").map(String::as_str)),
        cwd: std::env::current_dir()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into()),
        env,
        nproc: cli.nproc_per_node.unwrap_or(0),
        min_workers: cli.min_workers.unwrap_or(nodes * per_node),
        broken_timeout: cli.broken_timeout,
        opts,
        run: run.clone(),
        start: started,
        munge: munge.clone(),
        uid: nix::unistd::getuid().as_raw(),
        advertised: advertised.clone(),
        ready_timeout: Duration::from_secs(600),
        mode: cli.mode,
        settle: cli.settle,
    };
    // The decided batch is read only for jobs that declared a range (one cheap RPC
    // every 2 s for them, none for the others).
    let batch_job = slurm
        .filter(|_| std::env::var_os(spec::env::BATCH_MIN).is_some())
        .zip(job.parse::<u32>().ok());
    let (comment_tx, comment_done) =
        match slurm.map(|s| comment_writer(s, job.parse().unwrap_or(0))) {
            Some((tx, done)) => (Some(tx), Some(done)),
            None => (cli.comment_file.clone().map(comment_file_writer), None),
        };
    let c = Coordinator::new(cfg, comment_tx);
    say!(
        "bft-run: coordinator of job {job} listening on {advertised}; starting agents on {nodes} node(s)"
    );
    tokio::spawn(c.clone().serve(listener));

    // The agents: a job step over the core allocation, or local processes.
    let exe = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "bft-run".into());
    // The agents' options come in the welcome; these say whom to trust.
    let mut agent_args = vec![
        "--agent".to_string(),
        "--coord".into(),
        advertised.clone(),
        "--coord-job".into(),
        job.clone(),
        "--coord-run".into(),
        run.clone(),
    ];
    if let Some(n) = cli.nproc_per_node {
        agent_args.extend(["--nproc-per-node".into(), n.to_string()]);
    }
    if cli.verbose {
        agent_args.push("-v".into());
    }
    let mut children = Vec::new();
    let spawn = |mut cmd: tokio::process::Command| {
        if let Some(s) = &munge.socket {
            cmd.env("BFT_MUNGE_SOCKET", s);
        }
        cmd.stdin(std::process::Stdio::null()).spawn()
    };
    match local {
        Some(n) => {
            for i in 0..n {
                let mut cmd = tokio::process::Command::new(&exe);
                cmd.args(&agent_args)
                    .args(["--node-name", &format!("local-{i}")]);
                match spawn(cmd) {
                    Ok(ch) => children.push(ch),
                    Err(e) => return fail(1, format!("cannot start agent {i}: {e}")),
                }
            }
        }
        None => {
            let mut cmd = tokio::process::Command::new("srun");
            // One task per node, whatever the job asked for its own tasks.
            cmd.args([
                "--ntasks-per-node=1".to_string(),
                format!("--nodes={nodes}"),
                format!("--ntasks={nodes}"),
                "--kill-on-bad-exit=0".into(),
            ]);
            if let Ok(c) = std::env::var("SLURM_CPUS_ON_NODE") {
                cmd.arg(format!("--cpus-per-task={c}"));
            }
            // Every GPU the job holds on each node (as the batch script sees them, and
            // the coordinator counted), and nothing inherited that narrows it: the
            // agent starts one worker per GPU.
            if let Some(n) = gpus::step_gpus(std::env::var("SLURM_GPUS_ON_NODE").ok().as_deref()) {
                cmd.arg(format!("--gres=gpu:{n}"));
            }
            for v in gpus::STEP_NARROWING_VARS {
                cmd.env_remove(v);
            }
            cmd.arg(&exe).args(&agent_args);
            match spawn(cmd) {
                Ok(ch) => children.push(ch),
                Err(e) => return fail(1, format!("cannot run srun to start the agents: {e}")),
            }
        }
    }

    let mut ended = c.ended();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut running = children.len();
    let mut waits = Vec::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<std::process::ExitStatus>();
    for mut ch in children {
        let tx = done_tx.clone();
        let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel::<()>();
        waits.push(kill_tx);
        tokio::spawn(async move {
            let st = tokio::select! {
                st = ch.wait() => st,
                _ = &mut kill_rx => { let _ = ch.start_kill(); ch.wait().await }
            };
            if let Ok(st) = st {
                let _ = tx.send(st);
            }
        });
    }
    drop(done_tx);
    let mut ended_at: Option<Instant> = None;
    let leave_timeout = Duration::from_secs_f64(cli.leave_timeout.max(0.0));
    let mut ticks: u64 = 0;
    let mut batch_read: Option<tokio::task::JoinHandle<Option<Decided>>> = None;
    let mut refused: Option<String> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                c.tick();
                ticks += 1;
                // The decided batch: the local override each tick, the job's tag every
                // 2 s (off the loop: slurmctld may be slow). A failed read changes nothing.
                if let Some(f) = &cli.batch_file {
                    c.set_batch(read_batch_file(f));
                }
                if let Some(h) = batch_read.take_if(|h| h.is_finished()) {
                    match h.await {
                        Ok(Some(Ok(b))) => c.set_batch(b),
                        // Said once per value; the workers keep the batch they have.
                        Ok(Some(Err(e))) if refused.as_ref() != Some(&e) => {
                            say!("bft-run: {e}");
                            refused = Some(e);
                        }
                        _ => {}
                    }
                }
                if let (Some((s, id)), None, 0) = (batch_job, &batch_read, ticks % 4) {
                    batch_read = Some(tokio::task::spawn_blocking(move || {
                        s.load_job(id).ok().map(|j| decided_batch(j.admin_comment.as_deref().unwrap_or("")))
                    }));
                }
                if let Some(t) = ended_at {
                    // The agents' step: 10 s after a failure; after a success, the time
                    // its finished workers get to exit (a final save), and 10 s more.
                    let finished = ended.borrow().as_ref().is_some_and(|(code, _)| *code == 0);
                    let grace = Duration::from_secs(10)
                        + if finished { leave_timeout } else { Duration::ZERO };
                    if t.elapsed() > grace {
                        for k in waits.drain(..) {
                            let _ = k.send(());
                        }
                    }
                }
            }
            r = ended.changed() => {
                if r.is_err() { break; }
                if ended.borrow().is_some() { ended_at.get_or_insert_with(Instant::now); }
            }
            st = done_rx.recv() => {
                let Some(st) = st else { break };
                running -= 1;
                if running == 0 {
                    if ended.borrow().is_none() {
                        // Give a last message a moment to arrive.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        if ended.borrow().is_none() {
                            c.end(1, format!("the agents of the core allocation ended ({st}) before the training did"));
                        }
                    }
                    break;
                }
            }
        }
    }
    let (code, reason) = ended.borrow().clone().unwrap_or((1, "unknown".into()));
    if code != 0 {
        say!("bft-run: job failed: {reason}");
    } else if let Some(done) = comment_done {
        // Exit only once the Comment says the training finished (bounded: slurmctld
        // may be slow or away; the daemon then treats an end under preemption as one).
        let written =
            tokio::task::spawn_blocking(move || done.recv_timeout(Duration::from_secs(10)))
                .await
                .is_ok_and(|r| r.is_ok());
        if !written {
            say!("bft-run: the training finished but its Comment could not say so within 10 s");
        }
    }
    code
}

/// A decided global batch (`None`: no decision), or why the tag's was refused.
type Decided = Result<Option<u32>, String>;

/// The global batch bftrainerd decided, from the job's admin comment (its tag's
/// `batch_now`, which only root and bftrainerd write): `None` without one. A value
/// outside the range the tag declares (`batch=MIN:MAX`, checked at submission) is
/// refused, with what was wrong: no worker runs at a batch the job did not declare.
fn decided_batch(admin_comment: &str) -> Decided {
    let Some(g) = spec::batch_now(admin_comment) else {
        return Ok(None);
    };
    match spec::parse_tag(admin_comment) {
        Some(Ok(s)) => match s.batch {
            Some((lo, hi)) if (lo..=hi).contains(&g) => Ok(Some(g)),
            Some((lo, hi)) => Err(format!(
                "the job's tag decides a global batch of {g}, outside its declared batch={lo}:{hi}: refused, the workers keep their batch"
            )),
            None => Err(format!(
                "the job's tag decides a global batch of {g}, but the job declared no batch=MIN:MAX: refused, the workers keep their batch"
            )),
        },
        _ => Err(format!(
            "the job's admin comment decides a global batch of {g} but is not a bftrainer tag that reads: refused, the workers keep their batch"
        )),
    }
}

/// The local override of the decided batch (`--batch-file`): a whole number from 1 to
/// [`spec::MAX_BATCH`]; anything else (no file, empty, junk) is no decision.
fn read_batch_file(path: &str) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|g| (1..=spec::MAX_BATCH).contains(g))
}

/// Outside Slurm (tests): a thread that writes each Comment the coordinator publishes
/// into the file `path`, whole.
fn comment_file_writer(path: String) -> coord::CommentTx {
    let (tx, rx) = std::sync::mpsc::channel::<RunComment>();
    std::thread::spawn(move || {
        for c in rx {
            let tmp = format!("{path}.tmp");
            if std::fs::write(&tmp, format!("{c}\n")).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    });
    tx
}

/// A thread that writes the job's Comment: at once when the generation or size
/// changes or the training is done, at most every 5 s for a rate change over 5%. The
/// receiver hears once the `done` comment was written (or refused).
fn comment_writer(
    slurm: bftrainer_slurm::Slurm,
    job: u32,
) -> (coord::CommentTx, std::sync::mpsc::Receiver<()>) {
    let (tx, rx) = std::sync::mpsc::channel::<RunComment>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut written: Option<(RunComment, Instant)> = None;
        let mut pending: Option<RunComment> = None;
        let mut warned = false;
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(c) => pending = Some(c),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
            let Some(c) = pending.clone() else { continue };
            let due = match &written {
                None => true,
                Some((w, at)) => {
                    w.gen != c.gen
                        || w.done != c.done
                        || w.nodes != c.nodes
                        || w.coord != c.coord
                        || w.up != c.up
                        || w.down != c.down
                        || w.batch != c.batch
                        || (at.elapsed() >= Duration::from_secs(5)
                            && (c.rate - w.rate).abs() > 0.05 * w.rate.max(1e-9))
                }
            };
            if !due {
                continue;
            }
            let update = bftrainer_slurm::JobUpdate {
                comment: Some(c.to_string()),
                ..Default::default()
            };
            let done = c.done;
            match slurm.update_job(job, &update) {
                Ok(()) => {
                    written = Some((c, Instant::now()));
                    pending = None;
                }
                Err(e) => {
                    if !warned {
                        say!("bft-run: cannot publish the coordinator in job {job}'s Comment: {e}");
                        warned = true;
                    }
                    written = Some((c, Instant::now()));
                }
            }
            if done {
                let _ = done_tx.send(());
            }
        }
    });
    (tx, done_rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_get_the_users_environment_without_slurms_ours_or_the_nodes() {
        let vars = [
            "PATH=/usr/bin",
            "PYTHONPATH=/src",
            "SLURM_JOB_ID=7",
            "SLURM_CONF=/etc/slurm.conf",
            "SLURMD_NODENAME=n1",
            "BFT_MUNGE_SOCKET=/m",
            "BFT_WORKER_ID=1.0",
            "LOCAL_RANK=3",
            "LOCAL_WORLD_SIZE=4",
            "RANK=9",
            "WORLD_SIZE=16",
            "BFT_PG_TIMEOUT=90",
            "CUDA_VISIBLE_DEVICES=0,1",
            "ROCR_VISIBLE_DEVICES=0",
        ]
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        });
        let env = worker_env(vars.into_iter());
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec!["BFT_PG_TIMEOUT", "PATH", "PYTHONPATH", "SLURM_CONF"]
        );
    }

    #[test]
    fn the_decided_batch_is_believed_only_inside_the_declared_range() {
        let tag = spec::parse("1:4,batch=16:64").unwrap().to_tag();
        let with = |g| spec::with_batch_now(&tag, Some(g)).unwrap();
        assert_eq!(decided_batch(&tag), Ok(None));
        assert_eq!(decided_batch(""), Ok(None));
        assert_eq!(decided_batch(&with(16)), Ok(Some(16)));
        assert_eq!(decided_batch(&with(64)), Ok(Some(64)));
        for g in [8, 65, 4096] {
            let e = decided_batch(&with(g)).unwrap_err();
            assert!(
                e.contains(&format!(
                    "global batch of {g}, outside its declared batch=16:64: refused"
                )),
                "{e}"
            );
        }
        // A tag without a range (only bftrainerd writes batch_now, and only for a job
        // with one): refused too.
        let plain = spec::parse("1:4").unwrap().to_tag();
        let e = decided_batch(&spec::with_batch_now(&plain, Some(32)).unwrap()).unwrap_err();
        assert!(e.contains("declared no batch=MIN:MAX"), "{e}");
    }

    #[test]
    fn workers_never_inherit_a_global_batch_from_the_job_environment() {
        let vars = [("BFT_GLOBAL_BATCH", "999"), ("PATH", "/usr/bin")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = worker_env(vars.into_iter());
        assert_eq!(env.keys().collect::<Vec<_>>(), vec!["PATH"]);
    }

    #[test]
    fn torchrun_mode_runs_a_bare_script_under_the_python_on_path() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dir = tempfile_dir();
        std::fs::write(dir.join("python"), "").unwrap();
        let path = format!("/nonexistent:{}", dir.display());
        assert_eq!(
            worker_argv(Mode::Torchrun, &v(&["train.py", "--x"]), Some(&path)),
            v(&["python", "-u", "train.py", "--x"])
        );
        assert_eq!(
            worker_argv(Mode::Torchrun, &v(&["train.py"]), Some("/nonexistent")),
            v(&["python3", "-u", "train.py"])
        );
        for cmd in [v(&["python", "train.py"]), v(&["./a.out"])] {
            assert_eq!(worker_argv(Mode::Torchrun, &cmd, Some(&path)), cmd);
        }
        assert_eq!(
            worker_argv(Mode::Native, &v(&["train.py"]), Some(&path)),
            v(&["train.py"])
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("bft-run-test-{}", proto::fresh_id()));
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn network_flags_are_checked_and_reach_the_workers() {
        let cli = Cli::try_parse_from([
            "bft-run",
            "--mode",
            "torchrun",
            "--nccl-socket-ifname",
            "^docker,lo",
            "--gloo-socket-ifname",
            "ib0",
            "--nccl-ib-hca",
            "mlx5_0:1,mlx5_1:1",
            "--pg-timeout",
            "90",
            "--",
            "train.py",
        ])
        .unwrap();
        let site = bftrainer_core::config::RuntimeNet {
            nccl_socket_ifname: Some("site0".into()),
            gloo_socket_ifname: Some("site1".into()),
            nccl_ib_hca: Some("site_hca".into()),
            pg_timeout: Some(7.0),
        };
        let env: BTreeMap<String, String> = net_env(&cli, &site, |_| false).into_iter().collect();
        assert_eq!(env["NCCL_SOCKET_IFNAME"], "^docker,lo");
        assert_eq!(env["GLOO_SOCKET_IFNAME"], "ib0");
        assert_eq!(env["NCCL_IB_HCA"], "mlx5_0:1,mlx5_1:1");
        assert_eq!(env["BFT_PG_TIMEOUT"], "90");
        assert_eq!(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
        // Without flags: the job's environment first, then the site's [runtime].
        let plain = Cli::try_parse_from(["bft-run", "--", "x"]).unwrap();
        let env: BTreeMap<String, String> = net_env(&plain, &site, |k| k == "NCCL_IB_HCA")
            .into_iter()
            .collect();
        assert_eq!(env["NCCL_SOCKET_IFNAME"], "site0");
        assert_eq!(env["GLOO_SOCKET_IFNAME"], "site1");
        assert_eq!(env["BFT_PG_TIMEOUT"], "7");
        assert!(
            !env.contains_key("NCCL_IB_HCA"),
            "the job's own value stays"
        );
        assert!(
            !env.contains_key("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
            "native mode leaves it to the library"
        );
        for bad in ["eth0; rm -rf /", "", "a b", "eth0\n", "$(id)"] {
            let e = Cli::try_parse_from(["bft-run", "--nccl-socket-ifname", bad, "--", "x"])
                .unwrap_err();
            assert!(e.to_string().contains("not an interface"), "{bad:?}: {e}");
        }
        for bad in ["0", "-1", "inf", "x"] {
            assert!(Cli::try_parse_from(["bft-run", "--pg-timeout", bad, "--", "x"]).is_err());
        }
        let e = Cli::try_parse_from(["bft-run", "--mode", "mpich", "--", "x"]).unwrap_err();
        assert!(e.to_string().contains("native, torchrun or mpi"), "{e}");
        let cli = Cli::try_parse_from(["bft-run", "hosts", "--job", "42"]).unwrap();
        assert!(matches!(
            cli.sub,
            Some(Sub::Hosts {
                job: Some(42),
                addresses: false
            })
        ));
        // A command after -- is never taken for the subcommand.
        let cli = Cli::try_parse_from(["bft-run", "--", "hosts"]).unwrap();
        assert!(cli.sub.is_none());
        assert_eq!(cli.cmd, vec!["hosts"]);
    }

    #[test]
    fn satellites_follow_only_this_runs_comment() {
        let c = |run: &str, start| RunComment {
            coord: "h:1".into(),
            run: run.into(),
            start,
            gen: 1,
            nodes: 1,
            rate: 0.0,
            step: 0.0,
            batch: 0,
            done: false,
            up: 0.0,
            down: 0.0,
        };
        assert!(fresh_comment(&c("ab", 100), Some(100)));
        assert!(
            !fresh_comment(&c("ab", 100), Some(200)),
            "an earlier start's"
        );
        assert!(!fresh_comment(&c("", 100), Some(100)), "no run id");
        assert!(!fresh_comment(&c("ab", 100), None));
    }

    #[test]
    fn the_command_line() {
        let cli = Cli::try_parse_from(["bft-run", "--local", "2", "--", "python3", "-u", "x.py"])
            .unwrap();
        assert_eq!(cli.local, Some(2));
        assert_eq!(cli.cmd, vec!["python3", "-u", "x.py"]);
        assert_eq!((cli.max_restarts, cli.broken_timeout), (3, 5.0));
        assert_eq!((cli.hang_timeout, cli.restart_window), (10.0, 600.0));
        let e = Cli::try_parse_from(["bft-run", "--hang-timeout=-1", "--", "x"]).unwrap_err();
        assert!(e.to_string().contains("not a number of seconds"), "{e}");
        let e = Cli::try_parse_from(["bft-run", "--join", "5", "--local", "1"]).unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
        assert!(
            Cli::try_parse_from(["bft-run", "--agent"]).is_err(),
            "--agent needs --coord"
        );
        assert!(
            Cli::try_parse_from(["bft-run", "--probe-gpus"])
                .unwrap()
                .probe_gpus
        );
        let e = Cli::try_parse_from(["bft-run", "--probe-gpus", "--local", "1"]).unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
    }
}

#[cfg(test)]
mod man_page {
    /// bft-run(1) in docs/man (installed by scripts/make-deb) says what the options are.
    #[test]
    fn man_page_matches_the_options() {
        use clap::CommandFactory;
        bftrainer_testcluster::man::check(super::Cli::command(), "1", "bft-run");
    }
}
