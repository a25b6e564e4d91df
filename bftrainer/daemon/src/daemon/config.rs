//! bftrainerd's settings: `[daemon]`, `[engine]` and `[runtime]` of bftrainer.toml,
//! plus the few `[policy]` keys it shares with the job_submit plugin (which partitions
//! are elastic). Read with the same key readers as the plugin; any wrong key, type or
//! value stops the daemon with the file, key and allowed values.

use bftrainer_core::alloc::{Curve, Objective};
use bftrainer_core::config::{parse_doc, partition_name_ok, ConfigError, Table};
use bftrainer_core::engine::EngineConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DAEMON_KEYS: [&str; 19] = [
    "poll_interval",
    "state_dir",
    "socket",
    "shrink_grace",
    "shrink_grace_max",
    "admit_timeout",
    "grow_timeout",
    "release_before",
    "plan_refresh",
    "node_backoff",
    "job_backoff",
    "node_blame_users",
    "satellite_min_runtime",
    "reclaim_hold",
    "cycle_budget",
    "job_retention",
    "query_listen",
    "lease_dir",
    "lease",
];
pub const ENGINE_KEYS: [&str; 15] = [
    "objective",
    "t_fwd",
    "max_jobs",
    "min_rescale_interval",
    "lend_after_idle",
    "max_jobs_per_user",
    "max_nodes_per_user",
    "fair_share",
    "min_scale_up",
    "min_scale_down",
    "max_scale_up",
    "max_scale_down",
    "default_up",
    "default_down",
    "default_curve",
];
/// `[runtime]`: the satellites' command and output, and the workers' network settings
/// that bft-run reads (checked here too, so that a wrong one stops the daemon at once).
pub const RUNTIME_KEYS: [&str; 6] = [
    "join_command",
    "satellite_output",
    "nccl_socket_ifname",
    "gloo_socket_ifname",
    "nccl_ib_hca",
    "pg_timeout",
];
pub const METRICS_KEYS: [&str; 1] = ["listen"];

/// Everything bftrainerd reads from bftrainer.toml.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub path: PathBuf,
    pub poll_interval: Duration,
    pub state_dir: PathBuf,
    /// Where the cluster-wide lease lives (`lease`): a directory every candidate host
    /// of bftrainerd sees. None: no lease (one daemon, guarded by `state_dir`'s lock).
    pub lease_dir: Option<PathBuf>,
    /// How long a term lasts unrenewed before a standby may take over.
    pub lease_s: f64,
    /// The control socket (`bftrainer status` and friends).
    pub socket: PathBuf,
    /// Where the Prometheus endpoint listens; None: off.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Where the read-only, MUNGE-authenticated query endpoint for login nodes
    /// listens (`bftrainer jobs --server`); None: off.
    pub query_listen: Option<std::net::SocketAddr>,
    /// From SIGTERM to a satellite being shrunk until it is cancelled, plus two of the
    /// job's measured steps (see `shrink_deadline`).
    pub shrink_grace_s: f64,
    /// The most that the job's steps may stretch `shrink_grace_s` to.
    pub shrink_grace_max_s: f64,
    /// How long a released core job may take to start before it is held again.
    pub admit_timeout_s: f64,
    /// How long a satellite may take to start before it is cancelled.
    pub grow_timeout_s: f64,
    /// A lent node that the backfill plan gives a regular job within this many seconds
    /// is taken back before the regular job has to preempt.
    pub release_before_s: f64,
    /// Jobs are loaded in full at least this often, for the backfill plan (expected
    /// starts and SchedNodes, which Slurm changes without bumping the jobs' update time).
    pub plan_refresh_s: f64,
    /// First set-aside time of a node blamed for failed satellites; doubles per
    /// failure, at most 3600 s.
    pub node_backoff_s: f64,
    /// First pause of a job whose growth failed for reasons of its own; doubles per
    /// failure, at most 3600 s.
    pub job_backoff_s: f64,
    /// A node is blamed (set aside) only after satellites of this many different users
    /// failed there; until then each failure pauses its job.
    pub node_blame_users: u32,
    /// A satellite that ends by itself sooner than this after starting counts as a
    /// failed growth (of its job, or of its node: `node_blame_users`).
    pub satellite_min_runtime_s: f64,
    /// A node taken from an elastic job by preemption is not lent again for this long
    /// (the regular job that preempted it is about to start there).
    pub reclaim_hold_s: f64,
    /// Calls that lend nodes (admissions, satellites) stop after a cycle has run this
    /// long (a slow slurmctld); calls that give nodes back always run. The rest waits
    /// for the next cycle.
    pub cycle_budget_s: f64,
    /// An ended elastic job is forgotten this long after its end (`bftrainer jobs`
    /// stops showing it; the journal and accounting keep its history).
    pub job_retention_s: f64,
    pub engine: EngineConfig,
    pub objective: Objective,
    pub default_up_s: f64,
    pub default_down_s: f64,
    /// Throughput per node count used when a job names no profile: `None` is linear
    /// (n nodes do n times the work of one).
    pub default_curve: Option<Curve>,
    /// Command satellites run (through srun); `{parent}` is the core job's id.
    pub join_command: String,
    /// Satellites' stdout/stderr, in the parent's working directory (Slurm patterns).
    pub satellite_output: String,
    // From [policy]:
    pub partition: String,
    pub satellite_partition: String,
    /// The QOS satellites are submitted with (`satellite_qos`); None: the core job's.
    /// Under `preempt/qos` it must be set, a QOS ranked below the cores' (docs/admin.md).
    pub satellite_qos: Option<String>,
    /// The QOS the job_submit plugin puts core jobs in (`core_qos`); None: their own.
    pub core_qos: Option<String>,
    pub allowed_partitions: Vec<String>,
    pub profile_dir: Option<PathBuf>,
    // From [gpu_lending]:
    /// Regular partitions whose nodes' free GPUs are lent one at a time (empty: off).
    pub gpu_partitions: Vec<String>,
    /// Where the GPU satellites go (set when `gpu_partitions` is not empty).
    pub gpu_satellite_partition: Option<String>,
}

impl Config {
    /// Partitions whose nodes bftrainerd lends: the core, satellite and allowed ones.
    pub fn elastic_partitions(&self) -> Vec<&str> {
        let mut v = vec![self.partition.as_str()];
        for p in std::iter::once(&self.satellite_partition).chain(&self.allowed_partitions) {
            if !v.contains(&p.as_str()) {
                v.push(p);
            }
        }
        v
    }

    /// Core jobs may live in these.
    pub fn core_partition_ok(&self, p: &str) -> bool {
        p == self.partition || self.allowed_partitions.iter().any(|a| a == p)
    }

    /// Satellites bftrainerd wrote live in one of these: whole nodes' and GPUs'.
    pub fn satellite_partition_ok(&self, p: &str) -> bool {
        p == self.satellite_partition || self.gpu_satellite_partition.as_deref() == Some(p)
    }
}

/// Checks slurmctld's PreemptType (read with the partitions): without preemption no
/// regular job can take a lent node back, so lending stops. `preempt/partition_prio`
/// is what conf/slurm.conf.fragment sets and the tests run; `preempt/qos` is the site
/// alternative docs/admin.md describes.
pub fn check_preempt_type(cfg: &Config, preempt_type: Option<&str>) -> Result<(), String> {
    const ALLOWED: [&str; 2] = ["preempt/partition_prio", "preempt/qos"];
    match preempt_type.map(str::trim) {
        // Under preempt/qos Slurm ranks preemptees by their own QOS, not by partition:
        // satellites in the core's QOS could be preempted after the core (a requeue of
        // the whole job), so they need a QOS of their own, ranked below the cores'.
        Some("preempt/qos") if cfg.satellite_qos.is_none() => Err(format!(
            "{}: slurmctld runs PreemptType=preempt/qos but [policy] satellite_qos is not set: satellites would share their core's QOS, so a regular job could preempt a core before its satellites; create a QOS for satellites ranked below the cores' (docs/admin.md, \"Sites on preempt/qos\") and set satellite_qos to it",
            cfg.path.display()
        )),
        // And the cores need one regular jobs preempt: the plugin puts every core in it.
        Some("preempt/qos") if cfg.core_qos.is_none() => Err(format!(
            "{}: slurmctld runs PreemptType=preempt/qos but [policy] core_qos is not set: core jobs would keep the QOS they were submitted in, and one in a QOS that regular jobs cannot preempt would keep its nodes from them; set core_qos to the cores' QOS (docs/admin.md, \"Sites on preempt/qos\")",
            cfg.path.display()
        )),
        Some(t) if ALLOWED.contains(&t) => Ok(()),
        other => Err(format!(
            "{}: slurmctld runs PreemptType={}: regular jobs could not preempt elastic jobs on lent nodes; set PreemptType={} (or {}) in slurm.conf (conf/slurm.conf.fragment) and `scontrol reconfigure`",
            cfg.path.display(),
            other.filter(|t| !t.is_empty()).unwrap_or("preempt/none"),
            ALLOWED[0],
            ALLOWED[1]
        )),
    }
}

/// Checks that no partition of ours (the cores', the satellites', the allowed ones, the
/// GPU satellites') is left without preemption by slurm.conf's global PreemptMode
/// (`global`, read with PreemptType): a partition with no PreemptMode of its own takes
/// it, and a global PreemptMode=OFF would keep regular jobs behind elastic ones there.
pub fn check_global_preempt_mode(
    cfg: &Config,
    global: u16,
    parts: &[bftrainer_slurm::Partition],
) -> Result<(), String> {
    let ours = std::iter::once(cfg.partition.as_str())
        .chain(std::iter::once(cfg.satellite_partition.as_str()))
        .chain(cfg.allowed_partitions.iter().map(String::as_str))
        .chain(cfg.gpu_satellite_partition.as_deref());
    for name in ours {
        let Some(p) = parts.iter().find(|p| p.name == name) else {
            continue; // check_partitions names a missing one
        };
        let mode = p.effective_preempt_mode(global);
        if mode == bftrainer_slurm::Partition::PREEMPT_OFF {
            let whose = if p.preempt_mode == bftrainer_slurm::Partition::PREEMPT_INHERIT {
                "has no PreemptMode of its own and slurm.conf's global PreemptMode is OFF"
            } else {
                "has PreemptMode=OFF"
            };
            return Err(format!(
                "{}: partition '{name}' {whose}: regular jobs could not preempt the elastic jobs there; set PreemptMode=REQUEUE (cores) or CANCEL (satellites) on it (conf/slurm.conf.fragment), or a global PreemptMode other than OFF, and `scontrol reconfigure`",
                cfg.path.display()
            ));
        }
    }
    Ok(())
}

/// Checks the config's partitions against slurmctld's (at start, at SIGHUP and whenever
/// slurmctld's partitions change): they exist, none has PreemptMode=OFF, and the
/// satellites' partition is a PriorityTier below the core jobs' (else a regular job's
/// preemption may take a core's node before a satellite's, requeueing the whole job).
pub fn check_partitions(cfg: &Config, parts: &[bftrainer_slurm::Partition]) -> Result<(), String> {
    let find = |name: &str| parts.iter().find(|p| p.name == name);
    let known = || {
        let mut v: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        v.sort_unstable();
        v.join(", ")
    };
    let missing = |key: &str, name: &str| {
        format!(
            "{}: [policy] {key}: slurmctld has no partition '{name}'; it has: {}. Define it in slurm.conf (conf/slurm.conf.fragment) or fix the key",
            cfg.path.display(),
            known()
        )
    };
    let core = find(&cfg.partition).ok_or_else(|| missing("partition", &cfg.partition))?;
    let sat = find(&cfg.satellite_partition)
        .ok_or_else(|| missing("satellite_partition", &cfg.satellite_partition))?;
    for a in &cfg.allowed_partitions {
        find(a).ok_or_else(|| missing("allowed_partitions", a))?;
    }
    // PreemptMode=OFF on a partition of ours: Slurm never preempts its jobs, so a
    // regular job waits behind satellites and cores (NO_VAL16: the partition takes
    // slurm.conf's global PreemptMode).
    for p in std::iter::once(core)
        .chain(std::iter::once(sat))
        .chain(cfg.allowed_partitions.iter().filter_map(|a| find(a)))
    {
        if p.preempt_off() {
            return Err(format!(
                "{}: partition '{}' has PreemptMode=OFF: regular jobs could not preempt the elastic jobs there; set PreemptMode=REQUEUE (cores) or CANCEL (satellites) (conf/slurm.conf.fragment)",
                cfg.path.display(),
                p.name
            ));
        }
    }
    if sat.name != core.name && sat.priority_tier >= core.priority_tier {
        return Err(format!(
            "{}: [policy] satellite_partition '{}' has PriorityTier={} but the core jobs' partition '{}' has {}: the satellites' partition must be a lower tier, so that regular jobs preempt satellites before cores (conf/slurm.conf.fragment)",
            cfg.path.display(),
            sat.name,
            sat.priority_tier,
            core.name,
            core.priority_tier
        ));
    }
    check_gpu_partitions(cfg, parts)
}

/// `[gpu_lending]` against slurmctld's partitions: each lending partition and the GPU
/// satellites' exist; the satellites' partition has every node of the lending ones and
/// a PriorityTier below each (else a regular job would not preempt a GPU satellite);
/// no lending partition is an elastic one (those nodes are lent whole).
fn check_gpu_partitions(cfg: &Config, parts: &[bftrainer_slurm::Partition]) -> Result<(), String> {
    let Some(sat_name) = cfg.gpu_satellite_partition.as_deref() else {
        return Ok(());
    };
    let file = cfg.path.display();
    let find = |name: &str| parts.iter().find(|p| p.name == name);
    let known = || {
        let mut v: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        v.sort_unstable();
        v.join(", ")
    };
    let sat = find(sat_name).ok_or_else(|| {
        format!(
            "{file}: [gpu_lending] satellite_partition: slurmctld has no partition '{sat_name}'; it has: {}",
            known()
        )
    })?;
    let elastic = cfg.elastic_partitions();
    for name in &cfg.gpu_partitions {
        let p = find(name).ok_or_else(|| {
            format!(
                "{file}: [gpu_lending] partitions: slurmctld has no partition '{name}'; it has: {}",
                known()
            )
        })?;
        if elastic.contains(&name.as_str()) {
            return Err(format!(
                "{file}: [gpu_lending] partitions: '{name}' is one of the elastic partitions, whose nodes are lent whole; name the regular partitions whose nodes jobs share"
            ));
        }
        if sat.priority_tier >= p.priority_tier {
            return Err(format!(
                "{file}: [gpu_lending] satellite_partition '{sat_name}' has PriorityTier={} but the lending partition '{name}' has {}: the GPU satellites' partition must be a lower tier, so that regular jobs there preempt them",
                sat.priority_tier, p.priority_tier
            ));
        }
        if let Some(n) = p.node_names.iter().find(|n| !sat.node_names.contains(n)) {
            return Err(format!(
                "{file}: [gpu_lending] satellite_partition '{sat_name}' lacks node {n} of the lending partition '{name}'; give it the same nodes"
            ));
        }
    }
    Ok(())
}

/// Reads and checks the file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "{}: cannot read the bftrainer config: {e}; write it (see conf/bftrainer.toml) \
             or pass --config FILE",
            path.display()
        ))
    })?;
    let cfg = parse(&text, path)?;
    match std::fs::metadata(&cfg.state_dir) {
        Ok(m) if m.is_dir() => Ok(cfg),
        Ok(_) => Err(ConfigError(format!(
            "{}: [daemon] state_dir: '{}' is not a directory; expected an existing directory \
             writable by bftrainerd",
            path.display(),
            cfg.state_dir.display()
        ))),
        Err(e) => Err(ConfigError(format!(
            "{}: [daemon] state_dir: '{}': {e}; expected an existing directory writable by \
             bftrainerd (create it, e.g. install -d -m 0700 {})",
            path.display(),
            cfg.state_dir.display(),
            cfg.state_dir.display()
        ))),
    }
}

/// Checks config text; `path` is used in messages and to resolve relative paths.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let doc = parse_doc(text, &file)?;
    let base = path.parent().unwrap_or(Path::new("/"));
    let d = Table::new(&doc, "daemon", &file);
    d.check_keys(&DAEMON_KEYS)?;
    let e = Table::new(&doc, "engine", &file);
    e.check_keys(&ENGINE_KEYS)?;
    let r = Table::new(&doc, "runtime", &file);
    r.check_keys(&RUNTIME_KEYS)?;
    bftrainer_core::config::runtime_net(&doc, &file)?;
    let p = Table::new(&doc, "policy", &file);
    p.check_keys(&bftrainer_core::config::POLICY_KEYS)?;
    let m = Table::new(&doc, "metrics", &file);
    m.check_keys(&METRICS_KEYS)?;
    let metrics_listen = match m.opt_string("listen")? {
        None => None,
        Some(a) => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
            m.err(
                "listen",
                format!("'{a}' is not an address and port; expected e.g. \"127.0.0.1:9464\" or \"[::]:9464\""),
            )
        })?),
    };
    let query_listen = match d.opt_string("query_listen")? {
        None => None,
        Some(a) => Some(a.parse::<std::net::SocketAddr>().map_err(|_| {
            d.err(
                "query_listen",
                format!("'{a}' is not an address and port; expected e.g. \"0.0.0.0:6820\" or \"[::]:6820\""),
            )
        })?),
    };
    let poll = d.seconds("poll_interval", 0.05..=60.0, 1.0)?;
    let state_dir = base.join(d.string("state_dir", "/var/lib/bftrainer")?);
    let lease_dir = match d.opt_string("lease_dir")? {
        Some(s) if s.trim().is_empty() => {
            return Err(d.err(
                "lease_dir",
                "is empty; expected a directory every candidate host sees",
            ))
        }
        s => s.map(|s| base.join(s)),
    };
    let lease_s = d.seconds("lease", 1.0..=600.0, 15.0)?;
    // A holder renews once per cycle and stops acting at two thirds of its lease.
    if lease_s < 3.0 * poll {
        return Err(d.err(
            "lease",
            format!(
                "{lease_s} s is less than 3 poll intervals ({poll} s each); expected at least {} s",
                3.0 * poll
            ),
        ));
    }
    if state_dir.as_os_str().is_empty() {
        return Err(d.err("state_dir", "is empty; expected a directory path"));
    }
    let names = Objective::ALL.map(Objective::name);
    let objective = e.choice("objective", &names, "bftrainer")?;
    if objective == "remaining-work" {
        // The live runtime reports rates, not the work a job has left: the allocator
        // would refuse every decision.
        return Err(e.err(
            "objective",
            "'remaining-work' needs each job's remaining work, which live jobs do not report; use it with `bftrainer replay`, or pick bftrainer, efficiency, fairness or reclaim-aware",
        ));
    }
    let objective = Objective::ALL
        .into_iter()
        .find(|o| o.name() == objective)
        .unwrap_or_default();
    let max_jobs = e.uint("max_jobs", 1..=100_000)?.unwrap_or(10) as usize;
    let engine = EngineConfig {
        t_fwd_s: e.seconds("t_fwd", 1.0..=86_400.0, 600.0)?,
        max_jobs,
        min_rescale_interval_s: e.seconds("min_rescale_interval", 0.0..=86_400.0, 0.0)?,
        lend_after_idle_s: e.seconds("lend_after_idle", 0.0..=86_400.0, 0.0)?,
        // Half the places by default, so one user's jobs never take every place
        // (docs/admin.md, "Fair shares"); 0 turns the cap off.
        max_jobs_per_user: e
            .uint("max_jobs_per_user", 0..=100_000)?
            .map_or(max_jobs.div_ceil(2), |v| v as usize),
        max_nodes_per_user: e.uint("max_nodes_per_user", 0..=1_000_000)?.unwrap_or(0) as u32,
        fair_share: e.boolean("fair_share", true)?,
        min_scale_up_s: e.seconds(
            "min_scale_up",
            0.0..=86_400.0,
            bftrainer_core::engine::DEFAULT_MIN_SCALE_UP_S,
        )?,
        min_scale_down_s: e.seconds(
            "min_scale_down",
            0.0..=86_400.0,
            bftrainer_core::engine::DEFAULT_MIN_SCALE_DOWN_S,
        )?,
        max_scale_up_s: e.seconds(
            "max_scale_up",
            0.0..=86_400.0,
            bftrainer_core::engine::DEFAULT_MAX_SCALE_UP_S,
        )?,
        max_scale_down_s: e.seconds(
            "max_scale_down",
            0.0..=86_400.0,
            bftrainer_core::engine::DEFAULT_MAX_SCALE_DOWN_S,
        )?,
    };
    engine
        .validate()
        .map_err(|m| ConfigError(format!("{file}: [engine] {m}")))?;
    let default_curve = match doc.get("engine").and_then(|t| t.get("default_curve")) {
        None => None,
        Some(v) => Some(curve_from_toml(v).map_err(|m| e.err("default_curve", m))?),
    };
    let join_command = r.string("join_command", "bft-run --join {parent}")?;
    if join_command.trim().is_empty() {
        return Err(r.err(
            "join_command",
            "is empty; expected a command line such as \"bft-run --join {parent}\"",
        ));
    }
    let partition = p.string("partition", "elastic")?;
    let satellite_partition = p.string("satellite_partition", &partition)?;
    for (k, v) in [
        ("partition", &partition),
        ("satellite_partition", &satellite_partition),
    ] {
        if !partition_name_ok(v) {
            return Err(p.err(
                k,
                format!("'{v}' is not a partition name; expected letters, digits, '.', '_' or '-'"),
            ));
        }
    }
    let qos_name = |key: &str| -> Result<Option<String>, ConfigError> {
        let q = p.opt_string(key)?;
        match q.as_deref() {
            Some(v) if !partition_name_ok(v) => Err(p.err(
                key,
                format!("'{v}' is not a QOS name; expected letters, digits, '.', '_' or '-'"),
            )),
            _ => Ok(q),
        }
    };
    let satellite_qos = qos_name("satellite_qos")?;
    let core_qos = qos_name("core_qos")?;
    let (gpu_partitions, gpu_satellite_partition) =
        bftrainer_core::config::gpu_lending(&doc, &file)?;
    Ok(Config {
        gpu_partitions,
        gpu_satellite_partition,
        path: path.to_path_buf(),
        poll_interval: Duration::from_secs_f64(poll),
        socket: match d.opt_string("socket")? {
            Some(s) => base.join(s),
            None => super::control::default_socket(&state_dir),
        },
        metrics_listen,
        query_listen,
        state_dir,
        lease_dir,
        lease_s,
        shrink_grace_s: d.seconds("shrink_grace", 0.0..=3600.0, 10.0)?,
        shrink_grace_max_s: d.seconds("shrink_grace_max", 0.0..=86_400.0, 600.0)?,
        admit_timeout_s: d.seconds("admit_timeout", 1.0..=3600.0, 30.0)?,
        grow_timeout_s: d.seconds("grow_timeout", 1.0..=3600.0, 30.0)?,
        release_before_s: d.seconds("release_before", 0.0..=3600.0, 30.0)?,
        plan_refresh_s: d.seconds("plan_refresh", 0.0..=3600.0, 30.0)?,
        node_backoff_s: d.seconds("node_backoff", 1.0..=3600.0, 60.0)?,
        job_backoff_s: d.seconds("job_backoff", 1.0..=3600.0, 60.0)?,
        node_blame_users: d.uint("node_blame_users", 1..=1000)?.unwrap_or(2) as u32,
        satellite_min_runtime_s: d.seconds("satellite_min_runtime", 0.0..=3600.0, 10.0)?,
        reclaim_hold_s: d.seconds("reclaim_hold", 0.0..=3600.0, 10.0)?,
        cycle_budget_s: d.seconds("cycle_budget", 0.1..=3600.0, 5.0)?,
        job_retention_s: d.seconds("job_retention", 0.0..=2_592_000.0, 3600.0)?,
        engine,
        objective,
        default_up_s: e.seconds("default_up", 0.0..=86_400.0, 30.0)?,
        default_down_s: e.seconds("default_down", 0.0..=86_400.0, 10.0)?,
        default_curve,
        join_command,
        satellite_output: r.string("satellite_output", "bftrainer-sat-%j.out")?,
        partition,
        satellite_partition,
        satellite_qos,
        core_qos,
        allowed_partitions: p.strings("allowed_partitions")?,
        profile_dir: p.opt_string("profile_dir")?.map(|s| base.join(s)),
    })
}

/// A curve written as `[[nodes, value], ...]` (TOML), checked: node counts strictly
/// increasing from 1, values finite and >= 0.
pub fn curve_from_toml(v: &toml::Value) -> Result<Curve, String> {
    const EXPECTED: &str = "expected a list of [nodes, value] pairs such as [[1, 100.0], [4, 350.0]], nodes strictly increasing from 1, values >= 0";
    let arr = v
        .as_array()
        .ok_or_else(|| format!("{EXPECTED}, found {}", v.type_str()))?;
    let mut points = Vec::new();
    for item in arr {
        let pair = item.as_array().filter(|a| a.len() == 2).ok_or(EXPECTED)?;
        let n = pair[0]
            .as_integer()
            .filter(|&n| n >= 1 && n <= i64::from(u32::MAX))
            .ok_or(EXPECTED)? as u32;
        let y = pair[1]
            .as_float()
            .or_else(|| pair[1].as_integer().map(|i| i as f64))
            .filter(|y| y.is_finite() && *y >= 0.0)
            .ok_or(EXPECTED)?;
        if points.last().is_some_and(|&(m, _)| m >= n) || (points.is_empty() && n != 1) {
            return Err(EXPECTED.to_string());
        }
        points.push((n, y));
    }
    if points.is_empty() {
        return Err(EXPECTED.to_string());
    }
    Ok(Curve::new(points))
}

/// A profile file `DIR/NAME.toml`: `points = [[1, 100.0], ...]`, optional `up` and
/// `down` seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub curve: Curve,
    pub up_s: Option<f64>,
    pub down_s: Option<f64>,
}

pub fn load_profile(dir: &Path, name: &str) -> Result<Profile, String> {
    let path = dir.join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        format!("{}: not valid TOML: {}", path.display(), e.message().trim())
    })?;
    let curve = doc
        .get("points")
        .ok_or_else(|| format!("{}: no `points`", path.display()))
        .and_then(|v| curve_from_toml(v).map_err(|m| format!("{}: points: {m}", path.display())))?;
    let secs = |k: &str| -> Result<Option<f64>, String> {
        match doc.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Some)
                .ok_or_else(|| format!("{}: {k}: expected seconds >= 0", path.display())),
        }
    };
    Ok(Profile {
        curve,
        up_s: secs("up")?,
        down_s: secs("down")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Config, String> {
        parse(text, Path::new("/etc/slurm/bftrainer.toml")).map_err(|e| e.0)
    }

    #[test]
    fn defaults_and_policy_partitions() {
        let c = p("[policy]\nsatellite_partition = \"elastic-sat\"\n").unwrap();
        assert_eq!(c.poll_interval, Duration::from_secs(1));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/bftrainer"));
        assert_eq!(c.join_command, "bft-run --join {parent}");
        assert_eq!(c.elastic_partitions(), ["elastic", "elastic-sat"]);
        assert!(c.core_partition_ok("elastic") && !c.core_partition_ok("elastic-sat"));
        assert_eq!(c.objective, Objective::Bftrainer);
        assert_eq!((c.shrink_grace_s, c.shrink_grace_max_s), (10.0, 600.0));
        let c = p("[daemon]\nshrink_grace = 3\nshrink_grace_max = 86400\n").unwrap();
        assert_eq!((c.shrink_grace_s, c.shrink_grace_max_s), (3.0, 86_400.0));
        let c = p("[daemon]\nstate_dir = \"state\"\n[engine]\ndefault_curve = [[1, 10], [4, 30.5]]\nobjective = \"fairness\"\n").unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/etc/slurm/state"));
        assert_eq!(c.default_curve.unwrap().points, [(1, 10.0), (4, 30.5)]);
        assert_eq!(c.objective, Objective::Fairness);
        assert_eq!(c.socket, PathBuf::from("/etc/slurm/state/bftrainerd.sock"));
        assert_eq!(c.metrics_listen, None);
        let c = p("[daemon]\nsocket = \"/run/bft.sock\"\n[metrics]\nlisten = \"127.0.0.1:9464\"\n")
            .unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/bft.sock"));
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.query_listen, None);
        let c = p("[daemon]\nquery_listen = \"[::]:6820\"\n").unwrap();
        assert_eq!(c.query_listen, Some("[::]:6820".parse().unwrap()));
    }

    #[test]
    fn errors_name_file_key_and_allowed_values() {
        let cases = [
            ("[daemon]\npoll = 1", "/etc/slurm/bftrainer.toml: [daemon] poll: unknown key; allowed keys: poll_interval, state_dir"),
            ("[daemon]\npoll_interval = \"fast\"", "[daemon] poll_interval: expected seconds from 0.05 to 60, found string"),
            ("[daemon]\npoll_interval = 0", "[daemon] poll_interval: 0 is out of range; expected seconds from 0.05 to 60"),
            ("[daemon]\nshrink_grace_max = 86401", "[daemon] shrink_grace_max: 86401 is out of range; expected seconds from 0 to 86400"),
            ("[daemon]\nshrink_grace_max = -1", "[daemon] shrink_grace_max: -1 is out of range"),
            ("[engine]\nmax_jobs = 0", "[engine] max_jobs: 0 is out of range; expected a whole number from 1 to 100000"),
            ("[engine]\nobjective = \"best\"", "[engine] objective: 'best' is not allowed; expected one of: bftrainer, efficiency, fairness, remaining-work, reclaim-aware"),
            ("[engine]\nobjective = \"remaining-work\"", "'remaining-work' needs each job's remaining work"),
            ("[engine]\ndefault_curve = [[2, 1.0]]", "[engine] default_curve: expected a list of [nodes, value] pairs"),
            ("[runtime]\njoin_command = \" \"", "[runtime] join_command: is empty"),
            ("[demon]\n", "unknown table or key 'demon' at top level"),
            ("[metrics]\nlisten = \"9464\"", "[metrics] listen: '9464' is not an address and port; expected e.g. \"127.0.0.1:9464\""),
            ("[daemon]\nquery_listen = \"login:6820\"", "[daemon] query_listen: 'login:6820' is not an address and port; expected e.g. \"0.0.0.0:6820\""),
            ("[daemon]\nquery_listen = 6820", "[daemon] query_listen: expected"),
            ("[metrics]\nport = 1", "[metrics] port: unknown key; allowed keys: listen"),
            ("[policy]\nsatellite_partition = \"a b\"", "[policy] satellite_partition: 'a b' is not a partition name"),
            // A typo must not fall back to the default (satellites in the core partition).
            ("[policy]\nsatelite_partition = \"elastic-sat\"", "[policy] satelite_partition: unknown key; allowed keys: partition, satellite_partition"),
            ("[daemon]\nnode_backoff = 86400", "[daemon] node_backoff: 86400 is out of range; expected seconds from 1 to 3600"),
            ("[daemon]\nlease = 0.5", "[daemon] lease: 0.5 is out of range; expected seconds from 1 to 600"),
            ("[daemon]\npoll_interval = 2\nlease = 5", "[daemon] lease: 5 s is less than 3 poll intervals (2 s each); expected at least 6 s"),
            ("[daemon]\nlease_dir = \"\"", "[daemon] lease_dir: is empty"),
            ("[daemon]\nnode_blame_users = 0", "[daemon] node_blame_users: 0 is out of range; expected a whole number from 1 to 1000"),
        ];
        for (text, want) in cases {
            let e = p(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = load(Path::new("/nonexistent/bftrainer.toml"))
            .unwrap_err()
            .0;
        assert!(
            e.starts_with("/nonexistent/bftrainer.toml: cannot read"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("b.toml");
        std::fs::write(&f, "[daemon]\nstate_dir = \"missing\"\n").unwrap();
        let e = load(&f).unwrap_err().0;
        assert!(
            e.contains("[daemon] state_dir: '") && e.contains("missing': No such file"),
            "{e}"
        );
    }

    /// A partition as Slurm reports it, for the start-up checks.
    fn test_partition(name: &str, tier: u16, nodes: &[&str]) -> bftrainer_slurm::Partition {
        bftrainer_slurm::Partition {
            name: name.into(),
            nodes: None,
            node_names: nodes.iter().map(|n| n.to_string()).collect(),
            priority_tier: tier,
            priority_job_factor: 1,
            preempt_mode: bftrainer_slurm::Partition::PREEMPT_REQUEUE,
            grace_time_s: 0,
            max_time: None,
            default_time: None,
            total_cpus: 0,
            total_nodes: 0,
            up: true,
            is_default: false,
        }
    }

    #[test]
    fn partitions_must_exist_with_satellites_a_tier_below() {
        let part = |name: &str, tier: u16| test_partition(name, tier, &[]);
        let c = p("[policy]\nsatellite_partition = \"elastic-sat\"\n").unwrap();
        let good = [
            part("batch", 10),
            part("elastic", 2),
            part("elastic-sat", 1),
        ];
        check_partitions(&c, &good).unwrap();
        check_preempt_type(&c, Some("preempt/partition_prio")).unwrap();
        // preempt/qos ranks preemptees by QOS: satellites need a QOS of their own.
        let e = check_preempt_type(&c, Some("preempt/qos")).unwrap_err();
        assert!(e.contains("[policy] satellite_qos is not set"), "{e}");
        let q = p(
            "[policy]\nsatellite_partition = \"elastic-sat\"\nsatellite_qos = \"elastic-sat\"\n",
        )
        .unwrap();
        assert_eq!(q.satellite_qos.as_deref(), Some("elastic-sat"));
        // And the cores a QOS regular jobs preempt, which the plugin puts them in.
        let e = check_preempt_type(&q, Some("preempt/qos")).unwrap_err();
        assert!(e.contains("[policy] core_qos is not set"), "{e}");
        let q = p(
            "[policy]\nsatellite_partition = \"elastic-sat\"\nsatellite_qos = \"elastic-sat\"\ncore_qos = \"elastic\"\n",
        )
        .unwrap();
        assert_eq!(q.core_qos.as_deref(), Some("elastic"));
        check_preempt_type(&q, Some("preempt/qos")).unwrap();
        check_preempt_type(&q, Some("preempt/partition_prio")).unwrap();
        let e = p("[policy]\nsatellite_qos = \"a b\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[policy] satellite_qos: 'a b' is not a QOS name"),
            "{e}"
        );
        // A partition with no PreemptMode of its own takes the global one.
        let off = bftrainer_slurm::Partition::PREEMPT_OFF;
        let requeue = bftrainer_slurm::Partition::PREEMPT_REQUEUE;
        check_global_preempt_mode(&c, requeue, &good).unwrap();
        check_global_preempt_mode(&c, off, &good).unwrap();
        let mut inheriting = good.clone();
        inheriting[2].preempt_mode = bftrainer_slurm::Partition::PREEMPT_INHERIT;
        check_global_preempt_mode(&c, requeue, &inheriting).unwrap();
        let e = check_global_preempt_mode(&c, off, &inheriting).unwrap_err();
        assert!(
            e.contains("partition 'elastic-sat' has no PreemptMode of its own")
                && e.contains("global PreemptMode is OFF"),
            "{e}"
        );
        // A regular partition of the cluster inheriting OFF is not ours to check.
        let mut batch_off = good.clone();
        batch_off[0].preempt_mode = bftrainer_slurm::Partition::PREEMPT_INHERIT;
        check_global_preempt_mode(&c, off, &batch_off).unwrap();
        for bad in [None, Some(""), Some("preempt/none")] {
            let e = check_preempt_type(&c, bad).unwrap_err();
            assert!(
                e.contains("PreemptType=preempt/none") && e.contains("preempt/partition_prio"),
                "{e}"
            );
        }
        let e = check_partitions(&c, &good[..2]).unwrap_err();
        assert!(
            e.contains("[policy] satellite_partition: slurmctld has no partition 'elastic-sat'; it has: batch, elastic"),
            "{e}"
        );
        let e = check_partitions(&c, &[part("elastic", 2), part("elastic-sat", 2)]).unwrap_err();
        assert!(
            e.contains("has PriorityTier=2 but the core jobs' partition 'elastic' has 2"),
            "{e}"
        );
        // One partition for both: no tier to compare.
        let one = p("[policy]\npartition = \"elastic\"\n").unwrap();
        check_partitions(&one, &[part("elastic", 1)]).unwrap();
    }

    #[test]
    fn the_example_config_parses_with_gpu_lending_off() {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../conf/bftrainer.toml"
        ));
        let c = p(text).unwrap();
        assert!(c.gpu_partitions.is_empty() && c.gpu_satellite_partition.is_none());
        // Turned on as its comments say.
        let on = text
            .replace("\npartitions = []\n", "\npartitions = [\"shared\"]\n")
            .replace(
                "#satellite_partition = \"shared-sat\"",
                "satellite_partition = \"shared-sat\"",
            );
        let c = p(&on).unwrap();
        assert_eq!(c.gpu_partitions, ["shared"]);
        assert_eq!(c.gpu_satellite_partition.as_deref(), Some("shared-sat"));
        assert!(c.allowed_partitions.is_empty());
    }

    #[test]
    fn gpu_lending_keys_and_partitions() {
        let part = test_partition;
        // Off by default, and a satellite partition alone turns nothing on.
        let c = p("[policy]\nsatellite_partition = \"elastic-sat\"\n").unwrap();
        assert!(c.gpu_partitions.is_empty() && c.gpu_satellite_partition.is_none());
        let c = p("[gpu_lending]\nsatellite_partition = \"shared-sat\"\n").unwrap();
        assert!(c.gpu_satellite_partition.is_none());
        let text = "[policy]\nsatellite_partition = \"elastic-sat\"\n[gpu_lending]\npartitions = [\"shared\"]\nsatellite_partition = \"shared-sat\"\n";
        let c = p(text).unwrap();
        assert_eq!(c.gpu_partitions, ["shared"]);
        assert_eq!(c.gpu_satellite_partition.as_deref(), Some("shared-sat"));
        assert!(c.satellite_partition_ok("shared-sat") && c.satellite_partition_ok("elastic-sat"));
        assert!(!c.satellite_partition_ok("shared"));
        // Bad keys and values, each named.
        for (bad, says) in [
            (
                "[gpu_lending]\npartitions = [\"shared\"]\n",
                "[gpu_lending] satellite_partition: is missing",
            ),
            (
                "[gpu_lending]\npartitions = [\"a b\"]\nsatellite_partition = \"s\"\n",
                "[gpu_lending] partitions: 'a b' is not a partition name",
            ),
            (
                "[gpu_lending]\npartitions = [\"s\"]\nsatellite_partition = \"s\"\n",
                "'s' is also in [gpu_lending] partitions",
            ),
            (
                "[gpu_lending]\npartitions = \"shared\"\n",
                "[gpu_lending] partitions",
            ),
            (
                "[gpu_lending]\npartition = [\"shared\"]\n",
                "[gpu_lending] partition: unknown key",
            ),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let nodes = ["n3", "n4"];
        let good = [
            part("batch", 10, &["n1", "n2"]),
            part("elastic", 2, &["n1", "n2"]),
            part("elastic-sat", 1, &["n1", "n2"]),
            part("shared", 10, &nodes),
            part("shared-sat", 1, &nodes),
        ];
        check_partitions(&c, &good).unwrap();
        let mut v = good.to_vec();
        v[4] = part("shared-sat", 10, &nodes);
        let e = check_partitions(&c, &v).unwrap_err();
        assert!(
            e.contains(
                "'shared-sat' has PriorityTier=10 but the lending partition 'shared' has 10"
            ),
            "{e}"
        );
        v[4] = part("shared-sat", 1, &["n3"]);
        let e = check_partitions(&c, &v).unwrap_err();
        assert!(
            e.contains("'shared-sat' lacks node n4 of the lending partition 'shared'"),
            "{e}"
        );
        let e = check_partitions(&c, &good[..4]).unwrap_err();
        assert!(
            e.contains(
                "[gpu_lending] satellite_partition: slurmctld has no partition 'shared-sat'"
            ),
            "{e}"
        );
        let e = check_partitions(
            &c,
            &[
                good[0].clone(),
                good[1].clone(),
                good[2].clone(),
                good[4].clone(),
            ],
        )
        .unwrap_err();
        assert!(
            e.contains("[gpu_lending] partitions: slurmctld has no partition 'shared'"),
            "{e}"
        );
        let el = p("[policy]\nsatellite_partition = \"elastic-sat\"\n[gpu_lending]\npartitions = [\"elastic\"]\nsatellite_partition = \"shared-sat\"\n").unwrap();
        let e = check_partitions(&el, &good).unwrap_err();
        assert!(
            e.contains("'elastic' is one of the elastic partitions"),
            "{e}"
        );
    }

    #[test]
    fn profiles() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("resnet.toml"),
            "points = [[1, 100], [2, 190.0]]\nup = 20\n",
        )
        .unwrap();
        let pr = load_profile(dir.path(), "resnet").unwrap();
        assert_eq!(pr.curve.points, [(1, 100.0), (2, 190.0)]);
        assert_eq!((pr.up_s, pr.down_s), (Some(20.0), None));
        std::fs::write(dir.path().join("bad.toml"), "points = 3\n").unwrap();
        assert!(load_profile(dir.path(), "bad")
            .unwrap_err()
            .contains("points: expected a list"));
        assert!(load_profile(dir.path(), "none").is_err());
    }
}
