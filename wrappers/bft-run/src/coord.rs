//! The per-job coordinator: authenticates agents (and proves itself to them), keeps
//! the membership, watches the agents' heartbeats, holds the job's store, announces
//! generations, publishes the measured rate, and decides when the job is over.

use crate::kv::{self, Kv, Op, Reply};
use crate::membership::{Gen, Membership, Outcome};
use crate::proto::{self, brief, PROTO};
use crate::world::{Act, World, WorldCfg};
use bftrainer_core::runtime::RunComment;
use bftrainer_slurm::munge::{Decoded, Munge};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

/// Connections not authenticated yet, at most: in all, and from one address. Each one
/// costs an `unmunge`; more wait for others to finish or are closed at once.
pub const MAX_UNAUTH: usize = 64;
pub const MAX_UNAUTH_PER_PEER: usize = 8;
/// Credential checks (`unmunge` processes) running at once.
const MAX_DECODES: usize = 4;

/// What every agent runs with, satellites included: sent in the welcome, so the
/// options given to the core's bft-run reach every node.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentOpts {
    pub max_restarts: u32,
    pub restart_window: f64,
    pub leave_timeout: f64,
    pub hang_timeout: f64,
    pub verbose: bool,
}

impl AgentOpts {
    pub fn to_json(&self) -> Value {
        json!({
            "max_restarts": self.max_restarts, "restart_window": self.restart_window,
            "leave_timeout": self.leave_timeout, "hang_timeout": self.hang_timeout,
            "verbose": self.verbose,
        })
    }

    /// The welcome's options; a missing or malformed field is an error (the same
    /// bft-run runs on every node).
    pub fn from_json(v: &Value) -> Result<AgentOpts, String> {
        let num = |k: &str| {
            v.get(k)
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("the welcome's options lack a valid {k:?}"))
        };
        Ok(AgentOpts {
            max_restarts: num("max_restarts")?.min(f64::from(u32::MAX)) as u32,
            restart_window: num("restart_window")?,
            leave_timeout: num("leave_timeout")?,
            hang_timeout: num("hang_timeout")?.max(1.0),
            verbose: v.get("verbose").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// The Slurm job id, or "local".
    pub job: String,
    /// This run's identifier (published in the Comment; bound into every credential).
    pub run: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    /// Workers per node (0: each agent decides: its GPUs, else 1).
    pub nproc: usize,
    pub min_workers: usize,
    pub broken_timeout: f64,
    /// Options for every agent; `hang_timeout` is also how long an agent may be
    /// silent before it is dropped (frozen node or agent).
    pub opts: AgentOpts,
    /// The job's start time this run saw (Unix seconds; 0 outside Slurm).
    pub start: i64,
    pub munge: Munge,
    /// The job owner's uid: every agent must prove it.
    pub uid: u32,
    /// Where the coordinator can be reached (published in the Comment).
    pub advertised: String,
    /// Give up if no worker is ready after this long.
    pub ready_timeout: Duration,
    /// How workers run: with the library (native), or restarted whole at each
    /// generation (torchrun).
    pub mode: Mode,
    /// torchrun mode: seconds a joining node waits so that others come with it.
    pub settle: f64,
}

/// How the job's workers are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Workers use the bftrainer library: they stay up across generations.
    Native,
    /// Unmodified torchrun-style scripts: every generation is a new static-size
    /// world (torchrun's environment), the old one stopped with SIGTERM first.
    Torchrun,
    /// MPI programs: every generation is one new `mpirun` on the members' hosts, run
    /// by the first member's agent; its remote daemons start through `bft-run rsh`,
    /// each under its node's agent.
    Mpi,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Torchrun => "torchrun",
            Mode::Mpi => "mpi",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "native" => Some(Mode::Native),
            "torchrun" => Some(Mode::Torchrun),
            "mpi" => Some(Mode::Mpi),
            _ => None,
        }
    }
}

struct AgentRec {
    tx: mpsc::UnboundedSender<String>,
    workers: BTreeSet<String>,
    host: String,
    /// Its node's name (for `bft-run hosts`), and its worker slots.
    node: String,
    slots: usize,
    /// It said it leaves (SIGTERM): no longer one of the job's hosts.
    leaving: bool,
    /// When it was last heard from (seconds since the start).
    seen: f64,
    /// When its process started (seconds since the coordinator's start; its hello
    /// states its age), and whether it joined a running job (a grow) and has not yet
    /// contributed a step: its grow's cost is measured then.
    born: f64,
    newcomer: bool,
    /// Closes its connection (it froze or fell silent).
    kick: Arc<Notify>,
}

/// The job's rate in samples/s and its step time: from rank 0's cumulative `progress`
/// reports within one generation (an average since its first report there, once 2 s
/// apart); 0 until then. The step time is kept across generations (it is the
/// leaving deadline's measure, not a size's).
#[derive(Debug, Default)]
struct RateMeter {
    gen: u64,
    first: Option<(f64, u64, u64)>,
    rate: f64,
    step: f64,
}

impl RateMeter {
    /// A new generation: a new size, nothing measured at it yet.
    fn reset(&mut self, gen: u64) {
        *self = RateMeter {
            gen,
            step: self.step,
            ..Default::default()
        };
    }

    /// A report at time `now` (seconds) of the samples and steps so far; the new rate
    /// when there is one to publish.
    fn report(&mut self, gen: u64, samples: u64, steps: u64, now: f64) -> Option<f64> {
        if gen != self.gen {
            return None; // late, from a generation already replaced
        }
        let Some((t0, s0, n0)) = self.first else {
            self.first = Some((now, samples, steps));
            return None;
        };
        let dt = now - t0;
        if dt < 2.0 || samples < s0 {
            return None;
        }
        self.rate = (samples - s0) as f64 / dt;
        if steps > n0 {
            self.step = dt / (steps - n0) as f64;
        }
        Some(self.rate)
    }
}

/// What the job's rescales cost, measured here and published in the Comment (`up=`,
/// `down=`; bftrainerd takes them as floors of the costs it weighs, docs/design.md):
/// a grow, from a newcomer's start until the first step of a generation it is a member
/// of; a shrink (a generation with fewer members, none lost to a failure), from its
/// announcement to its first step. Native mode only: there the first step of each
/// generation is reported at once.
#[derive(Debug, Default)]
struct RescaleMeter {
    /// A shrink's generation and when it was announced, until its first step.
    shrink: Option<(u64, f64)>,
    up: f64,
    down: f64,
}

impl RescaleMeter {
    /// Generation `gen` was announced at `now`; `shrink`: it only lost members, to
    /// their leaving.
    fn announced(&mut self, gen: u64, shrink: bool, now: f64) {
        self.shrink = shrink.then_some((gen, now));
    }

    /// A progress report of generation `gen` (the current one) at `now`, with the start
    /// times of its members that had not contributed yet; whether a cost changed.
    fn stepped(&mut self, gen: u64, now: f64, newcomers: &[f64]) -> bool {
        let before = (self.up, self.down);
        if let Some((g, at)) = self.shrink {
            if g == gen {
                self.down = (now - at).max(0.0);
                self.shrink = None;
            }
        }
        // Several newcomers of one grow: the slowest is the grow's cost.
        if let Some(born) = newcomers.iter().copied().reduce(f64::min) {
            self.up = (now - born).max(0.0);
        }
        (self.up, self.down) != before
    }
}

struct Shared {
    m: Membership,
    /// torchrun mode: the worlds restarted at each generation.
    world: Option<World>,
    agents: HashMap<u64, AgentRec>,
    next_agent: u64,
    progress: RateMeter,
    rescale: RescaleMeter,
    nodes: u32,
    /// The members of the last generation announced (for the log's +joined -left).
    last_members: Vec<String>,
    start: Instant,
    kv: Kv,
    /// MPI mode: the running world's launch rights (`bft-run rsh`).
    rsh: Option<RshWorld>,
    /// Open `bft-run rsh` sessions: id -> (the agent running it, the client's line).
    rsh_clients: HashMap<u64, (u64, mpsc::UnboundedSender<(bool, String)>)>,
    next_rsh: u64,
    /// The global batch bftrainerd decided for the job (its tag's `batch_now`, or the
    /// local override of `--batch-file`); every generation carries it to the workers.
    batch: Option<u32>,
    /// The global batch the workers report they run at (0: unknown), for the Comment.
    run_batch: u32,
}

/// What an MPI world's `bft-run rsh` may do: its mpirun holds `token` (a fresh secret
/// per world, in its environment only), and may start daemons on these hosts (the
/// names of the world's --host list -> agent ids).
#[derive(Debug, Clone)]
struct RshWorld {
    gen: u64,
    token: String,
    hosts: HashMap<String, u64>,
}

/// Whether a secret matches, in a time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Longest command `bft-run rsh` may ask to run (an orted/prted command line).
const MAX_RSH_CMD: usize = 8 << 10;

/// The host names of an MPI world, by part: the node's name where it is a plain
/// host name and no other part has it, else `bft-agent-ID` (the name only has to
/// reach `bft-run rsh`; mpirun does not resolve it).
fn mpi_host_names(nodes: &[(u64, String)]) -> Vec<String> {
    nodes
        .iter()
        .map(|(id, n)| {
            let unique = nodes.iter().filter(|(_, m)| m == n).count() == 1;
            if unique && proto::is_node_name(n) && !n.starts_with("bft-agent-") {
                n.clone()
            } else {
                format!("bft-agent-{id}")
            }
        })
        .collect()
}

impl Shared {
    /// The current generation, in either mode.
    fn gen(&self) -> u64 {
        self.world.as_ref().map_or_else(|| self.m.gen(), World::gen)
    }
}

/// The global batch a progress report's rate is measured at (the owner's word, as the
/// rate is); 0 when absent or out of range: unknown.
fn reported_batch(msg: &Value) -> u32 {
    msg.get("batch")
        .and_then(Value::as_u64)
        .filter(|b| *b <= u64::from(bftrainer_core::spec::MAX_BATCH))
        .unwrap_or(0) as u32
}

/// A torchrun-mode agent's message: what the world must do about it.
fn world_msg(
    s: &mut Shared,
    id: u64,
    host: &str,
    msg: &Value,
    now: f64,
) -> Result<Vec<Act>, String> {
    let gen = || proto::u64_field(msg, "gen");
    let Some(w) = s.world.as_mut() else {
        return Ok(Vec::new());
    };
    Ok(match proto::t(msg) {
        "hb" | "started" => Vec::new(),
        "port" => {
            let port = proto::u64_field(msg, "port")?;
            let port = u16::try_from(port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{port} is not a port number"))?;
            w.port(id, gen()?, port, now)
        }
        "wexit" => {
            let g = gen()?;
            let local = proto::u64_field(msg, "local")?.min(1 << 20) as usize;
            let code = msg
                .get("code")
                .and_then(Value::as_i64)
                .ok_or("a wexit without a whole-number \"code\"")?
                .clamp(-255, 255) as i32;
            if msg.get("stopped").and_then(Value::as_bool).unwrap_or(false) {
                return Ok(Vec::new());
            }
            let rank = w
                .running()
                .filter(|p| p.gen == g)
                .and_then(|p| p.parts.iter().find(|x| x.agent == id))
                .map(|x| format!(" (rank {})", x.rank_base + local))
                .unwrap_or_default();
            let what = format!("worker {id}.{local}{rank} of generation {g} on {host}");
            if code != 0 && w.running().is_some_and(|p| p.gen == g) {
                let tail = proto::clip(
                    msg.get("stderr_tail").and_then(Value::as_str).unwrap_or(""),
                    16 << 10,
                );
                say!(
                    "bft-run: {} {what} ended ({}); last lines of its stderr:\n{}",
                    ts(),
                    if code < 0 {
                        format!("signal {}", -code)
                    } else {
                        format!("code {code}")
                    },
                    if tail.is_empty() { "(none)" } else { &tail }
                );
            }
            w.exited(id, g, local, code, &what, now)
        }
        "stopped" => w.stopped(id, gen()?, now),
        "leaving" => {
            say!("bft-run: {} agent {id} ({host}) leaves", ts());
            if let Some(a) = s.agents.get_mut(&id) {
                a.leaving = true;
            }
            s.world.as_mut().map_or_else(Vec::new, |w| w.leave(id, now))
        }
        other => {
            return Err(format!(
                "unknown message type {:?} in torchrun mode",
                brief(other)
            ))
        }
    })
}

/// Unauthenticated connections now, oldest first: over a cap, the oldest (of that
/// address, or in all) is closed to make room, so that idle connections cannot keep a
/// genuine agent out.
#[derive(Default)]
struct Gate {
    open: std::collections::VecDeque<(u64, IpAddr, Arc<Notify>)>,
    next: u64,
    /// When an eviction was last logged (one line per 10 s).
    logged: Option<Instant>,
}

/// The longest an agent's stated age counts, seconds: an agent waits for its
/// coordinator at most a few minutes, so more is no grow's cost.
const MAX_AGENT_AGE_S: f64 = 3600.0;

/// What the coordinator publishes; the caller writes it to the job's Comment.
pub type CommentTx = std::sync::mpsc::Sender<RunComment>;

pub struct Coordinator {
    cfg: CoordConfig,
    shared: Mutex<Shared>,
    gate: Mutex<Gate>,
    decodes: Semaphore,
    end_tx: watch::Sender<Option<(i32, String)>>,
    comment: Option<Mutex<CommentTx>>,
}

fn ts() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    utc(now.as_secs(), now.subsec_millis())
}

/// `2026-11-24T04:57:56.123Z` (UTC, for logs; days to a civil date as in
/// Howard Hinnant's `civil_from_days`).
fn utc(secs: u64, millis: u32) -> String {
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        tod / 3600,
        tod / 60 % 60,
        tod % 60
    )
}

/// The log line of a new generation: sizes, then who joined and who left since the
/// previous one (the same members again: a re-formation after a failure).
fn describe_gen(g: &Gen, nodes: u32, prev: &[String]) -> String {
    let joined: Vec<String> = g
        .members
        .iter()
        .filter(|m| !prev.contains(m))
        .map(|m| format!("+{m}"))
        .collect();
    let left: Vec<String> = prev
        .iter()
        .filter(|m| !g.members.contains(m))
        .map(|m| format!("-{m}"))
        .collect();
    let change = match (joined.is_empty(), left.is_empty()) {
        (true, true) => "same members, re-formed after a failure".to_string(),
        (false, true) => joined.join(" "),
        (true, false) => left.join(" "),
        (false, false) => format!("{}, {}", joined.join(" "), left.join(" ")),
    };
    format!(
        "generation {}: {} workers on {} nodes ({change})",
        g.gen,
        g.members.len(),
        nodes
    )
}

/// The agent a worker id `A.L` belongs to.
fn agent_of(worker: &str) -> Option<u64> {
    worker.split('.').next()?.parse().ok()
}

impl Coordinator {
    pub fn new(cfg: CoordConfig, comment: Option<CommentTx>) -> Arc<Coordinator> {
        let (end_tx, _) = watch::channel(None);
        let m = Membership::new(cfg.min_workers, cfg.broken_timeout);
        let c = Arc::new(Coordinator {
            shared: Mutex::new(Shared {
                m,
                world: (cfg.mode != Mode::Native).then(|| {
                    World::new(WorldCfg {
                        min_slots: cfg.min_workers,
                        settle: cfg.settle,
                        max_restarts: cfg.opts.max_restarts,
                        restart_window: cfg.opts.restart_window,
                        one_launcher: cfg.mode == Mode::Mpi,
                    })
                }),
                agents: HashMap::new(),
                next_agent: 1,
                progress: RateMeter::default(),
                rescale: RescaleMeter::default(),
                nodes: 0,
                last_members: Vec::new(),
                start: Instant::now(),
                kv: Kv::default(),
                rsh: None,
                rsh_clients: HashMap::new(),
                next_rsh: 1,
                batch: None,
                run_batch: 0,
            }),
            gate: Mutex::new(Gate::default()),
            decodes: Semaphore::new(MAX_DECODES),
            cfg,
            end_tx,
            comment: comment.map(Mutex::new),
        });
        // At once: satellites find the coordinator's address there (gen=0 until the
        // first generation forms).
        c.publish(&c.shared.lock().unwrap());
        c
    }

    pub fn ended(&self) -> watch::Receiver<Option<(i32, String)>> {
        self.end_tx.subscribe()
    }

    /// Ends the job from outside (the core step died, a signal): tells the agents.
    pub fn end(&self, code: i32, reason: String) {
        let mut s = self.shared.lock().unwrap();
        s.m.end();
        if let Some(w) = s.world.as_mut() {
            w.end();
        }
        self.finish(&mut s, code, reason);
    }

    fn finish(&self, s: &mut Shared, code: i32, reason: String) {
        if self.end_tx.borrow().is_some() {
            return;
        }
        s.rsh = None;
        let line = proto::line(&json!({"t": "end", "code": code, "reason": reason}));
        for a in s.agents.values() {
            let _ = a.tx.send(line.clone());
        }
        if code == 0 {
            // The run's last word in the Comment: its training is finished (bftrainerd
            // then counts a core that Slurm ends while preempting it as finished).
            self.send_comment(s, true);
        }
        self.end_tx.send_replace(Some((code, reason)));
    }

    fn publish(&self, s: &Shared) {
        self.send_comment(s, false);
    }

    fn send_comment(&self, s: &Shared, done: bool) {
        // Once the training finished, every later comment says so too.
        let done = done
            || self
                .end_tx
                .borrow()
                .as_ref()
                .is_some_and(|(code, _)| *code == 0);
        if let Some(c) = &self.comment {
            let _ = c.lock().unwrap().send(RunComment {
                coord: self.cfg.advertised.clone(),
                run: self.cfg.run.clone(),
                start: self.cfg.start,
                gen: s.gen(),
                nodes: s.nodes,
                rate: s.progress.rate,
                step: s.progress.step,
                up: s.rescale.up,
                down: s.rescale.down,
                batch: s.run_batch,
                done,
            });
        }
    }

    fn apply(&self, s: &mut Shared, out: Outcome) {
        match out {
            Outcome::Nothing => {}
            Outcome::Announce(g) => self.announce(s, g),
            Outcome::Abort(gen) => {
                let line = proto::line(&json!({"t": "abort", "gen": gen}));
                for a in s.agents.values() {
                    let _ = a.tx.send(line.clone());
                }
                let failed = s.kv.abort(gen);
                self.answer(s, failed);
            }
            Outcome::End { code, reason } => {
                if code == 0 {
                    say!("bft-run: {} {reason}", ts());
                }
                self.finish(s, code, reason);
            }
        }
    }

    /// Carries out what the world decided (torchrun mode).
    fn world_acts(&self, s: &mut Shared, acts: Vec<Act>) {
        for act in acts {
            match act {
                Act::AskPort { gen, agent } => {
                    if let Some(a) = s.agents.get(&agent) {
                        let _ = a.tx.send(proto::line(&json!({"t": "port", "gen": gen})));
                    }
                }
                Act::Start(plan) => {
                    let master = s
                        .agents
                        .get(&plan.parts[0].agent)
                        .map(|a| a.host.clone())
                        .unwrap_or_default();
                    let nodes: Vec<String> = plan
                        .parts
                        .iter()
                        .map(|p| {
                            let node = s.agents.get(&p.agent).map_or("?", |a| a.node.as_str());
                            format!("{node}:{}", p.slots)
                        })
                        .collect();
                    say!(
                        "bft-run: {} generation {}: world of {} workers on {} nodes ({}), rank 0 at {master}:{}, restart {}",
                        ts(),
                        plan.gen,
                        plan.world_size,
                        plan.parts.len(),
                        nodes.join(" "),
                        plan.master_port,
                        plan.restarts
                    );
                    // MPI mode: the first part's agent runs mpirun on these hosts.
                    let mpi = (self.cfg.mode == Mode::Mpi).then(|| {
                        let nodes: Vec<(u64, String)> = plan
                            .parts
                            .iter()
                            .map(|p| {
                                let n = s.agents.get(&p.agent).map_or("", |a| a.node.as_str());
                                (p.agent, n.to_string())
                            })
                            .collect();
                        let names = mpi_host_names(&nodes);
                        let list: Vec<String> = names
                            .iter()
                            .zip(&plan.parts)
                            .map(|(n, p)| format!("{n}:{}", p.slots))
                            .collect();
                        let token = proto::fresh_id();
                        s.rsh = Some(RshWorld {
                            gen: plan.gen,
                            token: token.clone(),
                            hosts: names
                                .into_iter()
                                .zip(plan.parts.iter().map(|p| p.agent))
                                .collect(),
                        });
                        json!({"hosts": list.join(","), "np": plan.world_size, "token": token})
                    });
                    for p in &plan.parts {
                        if let Some(a) = s.agents.get(&p.agent) {
                            let mut m = json!({
                                "t": "world", "gen": plan.gen, "master_addr": master,
                                "master_port": plan.master_port, "group_rank": p.group_rank,
                                "rank_base": p.rank_base, "world_size": plan.world_size,
                                "nnodes": plan.parts.len(), "restarts": plan.restarts,
                                "run_id": self.cfg.job,
                            });
                            // The decided global batch, as it stands when this world
                            // starts: the world keeps it until its restart.
                            if let Some(b) = s.batch {
                                m["batch"] = json!(b);
                            }
                            if let (Some(mpi), 0) = (&mpi, p.group_rank) {
                                m["mpi"] = mpi.clone();
                            }
                            let _ = a.tx.send(proto::line(&m));
                        }
                    }
                    s.nodes = plan.parts.len() as u32;
                    s.progress.reset(plan.gen);
                    self.publish(s);
                }
                Act::Stop { gen, agents, why } => {
                    say!("bft-run: {} stopping generation {gen}: {why}", ts());
                    // No more daemons for a world being stopped.
                    s.rsh = None;
                    let line = proto::line(&json!({"t": "stop", "gen": gen}));
                    for id in agents {
                        if let Some(a) = s.agents.get(&id) {
                            let _ = a.tx.send(line.clone());
                        }
                    }
                }
                Act::End { code, reason } => {
                    if code == 0 {
                        say!("bft-run: {} {reason}", ts());
                    }
                    self.finish(s, code, reason);
                }
            }
        }
    }

    fn announce(&self, s: &mut Shared, g: Gen) {
        let nodes: BTreeSet<Option<u64>> = g.members.iter().map(|w| agent_of(w)).collect();
        s.nodes = nodes.len() as u32;
        let shrink = g.dead.is_empty()
            && g.members.len() < s.last_members.len()
            && g.members.iter().all(|w| s.last_members.contains(w));
        let now = s.start.elapsed().as_secs_f64();
        s.rescale.announced(g.gen, shrink, now);
        say!(
            "bft-run: {} {}",
            ts(),
            describe_gen(&g, s.nodes, &s.last_members)
        );
        s.last_members = g.members.clone();
        // The rate measured at the old size is not this size's: 0 (not measured yet)
        // until the new generation's progress reports give one; bftrainerd would
        // otherwise record it against the new node count.
        s.progress.reset(g.gen);
        if !g.dead.is_empty() {
            // Setups of the earlier generations wait for members that are gone.
            let failed = s.kv.abandon_below(g.gen);
            self.answer(s, failed);
        }
        let mut msg = json!({
            "t": "gen", "gen": g.gen, "members": g.members, "dead": g.dead,
        });
        if let Some(b) = s.batch {
            msg["batch"] = json!(b);
        }
        let line = proto::line(&msg);
        for a in s.agents.values() {
            let _ = a.tx.send(line.clone());
        }
        self.publish(s);
    }

    /// The decided global batch changed (`None`: no decision, the script's own): the
    /// workers take it at their next step boundary, all at the same step, through a new
    /// generation of the same members (native mode). The restarting modes (torchrun,
    /// MPI) hand it to each world they start (`BFT_GLOBAL_BATCH`), so a change reaches
    /// the script at its next restart: a world is not stopped for a batch alone (a
    /// restart costs seconds and the steps since the script's checkpoint).
    pub fn set_batch(&self, batch: Option<u32>) {
        let mut s = self.shared.lock().unwrap();
        if s.batch == batch {
            return;
        }
        say!(
            "bft-run: {} global batch decided by bftrainerd: {}",
            ts(),
            batch.map_or_else(|| "none (the script's own)".to_string(), |b| b.to_string())
        );
        s.batch = batch;
        if s.world.is_none() {
            let out = s.m.renew();
            self.apply(&mut s, out);
        }
    }

    fn progress(&self, s: &mut Shared, gen: u64, samples: u64, steps: u64) {
        let now = s.start.elapsed().as_secs_f64();
        let mut costs = false;
        if gen == s.m.gen() {
            let mut newcomers = Vec::new();
            for a in s.agents.values_mut() {
                if a.newcomer && a.workers.iter().any(|w| s.m.is_member(w)) {
                    a.newcomer = false;
                    newcomers.push(a.born);
                }
            }
            costs = s.rescale.stepped(gen, now, &newcomers);
        }
        if s.progress.report(gen, samples, steps, now).is_some() || costs {
            self.publish(s);
        }
    }

    /// Sends the store's answers to the workers that asked.
    fn answer(&self, s: &Shared, replies: Vec<(kv::Asker, Reply)>) {
        for ((agent, worker, id), r) in replies {
            let mut m = json!({"t": "kvr", "worker": worker, "id": id});
            match r {
                Reply::Done => {}
                Reply::Value(v) => m["value"] = Value::String(kv::to_hex(&v)),
                Reply::Int(n) => m["n"] = json!(n),
                Reply::Bool(b) => m["found"] = json!(b),
                Reply::Error(e) => m["err"] = Value::String(e),
            }
            if let Some(a) = s.agents.get(&agent) {
                let _ = a.tx.send(proto::line(&m));
            }
        }
    }

    /// Called twice a second: heartbeats out; agents silent longer than the hang
    /// timeout dropped (a frozen node or agent); members that did not acknowledge an
    /// abort dropped as hung; store waits past their deadline answered; no worker
    /// ready in time ends the job.
    pub fn tick(&self) {
        let mut s = self.shared.lock().unwrap();
        let now = s.start.elapsed().as_secs_f64();
        // The measured step time rides the heartbeat: a leaving agent gives its workers
        // two steps to reach their boundary, not less than --leave-timeout.
        let hb = proto::line(&json!({"t": "hb", "step": s.progress.step}));
        for a in s.agents.values() {
            let _ = a.tx.send(hb.clone());
        }
        let frozen: Vec<u64> = s
            .agents
            .iter()
            .filter(|(_, a)| now - a.seen > self.cfg.opts.hang_timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in frozen {
            if let Some(a) = s.agents.remove(&id) {
                say!(
                    "bft-run: {} agent {id} ({}) sent nothing for {:.1} s (frozen or cut off); dropping it and its workers",
                    ts(),
                    a.host,
                    now - a.seen
                );
                a.kick.notify_one();
                s.kv.forget_agent(id);
                // Its rsh sessions end (their clients exit 255, as ssh's do when the
                // connection is lost: mpirun then takes those daemons as failed).
                s.rsh_clients.retain(|_, (a, _)| *a != id);
                let gone: Vec<String> = a.workers.into_iter().collect();
                let out = s.m.drop_workers(&gone, true);
                self.apply(&mut s, out);
                if let Some(w) = s.world.as_mut() {
                    let acts = w.leave(id, now);
                    self.world_acts(&mut s, acts);
                }
            }
        }
        if let Some(w) = s.world.as_mut() {
            let acts = w.tick(now);
            self.world_acts(&mut s, acts);
        }
        let expired = s.kv.expire(now);
        self.answer(&s, expired);
        let (silent, out) = s.m.tick(now);
        if !silent.is_empty() {
            say!(
                "bft-run: {} dropping {} (no acknowledgement {} s after an abort: hung); their agents kill them",
                ts(),
                silent.join(" "),
                self.cfg.broken_timeout
            );
        }
        self.apply(&mut s, out);
        // A silent member is presumably hung in a collective: its agent kills it (and
        // restarts it, as after any death by a signal).
        for w in &silent {
            if let Some(a) = agent_of(w).and_then(|id| s.agents.get(&id)) {
                let _ = a.tx.send(proto::line(&json!({"t": "kill", "worker": w})));
            }
        }
        if s.gen() == 0 && s.start.elapsed() > self.cfg.ready_timeout {
            let why = format!(
                "no worker became ready within {} s of the start",
                self.cfg.ready_timeout.as_secs()
            );
            self.finish(&mut s, 1, why);
        }
    }

    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((sock, addr)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.connection(sock, addr.ip()).await });
                }
                Err(e) => {
                    say!("bft-run: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Counts a new unauthenticated connection; over a cap, closes the oldest one of
    /// the same address (or the oldest of all) to make room. Its id and the signal
    /// that closes it.
    fn admit(&self, ip: IpAddr) -> (u64, Arc<Notify>) {
        let mut g = self.gate.lock().unwrap();
        let mine = g.open.iter().filter(|(_, a, _)| *a == ip).count();
        let evict = if mine >= MAX_UNAUTH_PER_PEER {
            g.open.iter().position(|(_, a, _)| *a == ip)
        } else if g.open.len() >= MAX_UNAUTH {
            Some(0)
        } else {
            None
        };
        if let Some(i) = evict {
            if let Some((_, who, kick)) = g.open.remove(i) {
                kick.notify_one();
                if g.logged
                    .map_or(true, |t| t.elapsed() > Duration::from_secs(10))
                {
                    g.logged = Some(Instant::now());
                    say!(
                        "bft-run: {} closing connections from {who} that did not authenticate: over {} unauthenticated connections (at most {MAX_UNAUTH} in all, {MAX_UNAUTH_PER_PEER} from one address)",
                        ts(),
                        if mine >= MAX_UNAUTH_PER_PEER { mine } else { g.open.len() + 1 }
                    );
                }
            }
        }
        g.next += 1;
        let id = g.next;
        let kick = Arc::new(Notify::new());
        g.open.push_back((id, ip, kick.clone()));
        (id, kick)
    }

    fn unadmit(&self, id: u64) {
        self.gate.lock().unwrap().open.retain(|(i, _, _)| *i != id);
    }

    async fn connection(self: Arc<Self>, sock: TcpStream, ip: IpAddr) {
        let peer = sock
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let (rd, mut wr) = sock.into_split();
        let mut rd = BufReader::new(rd);
        let (gate_id, evicted) = self.admit(ip);
        // The whole greeting (the credential checks' queue included) within 10 s.
        let greeted = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(10), self.greet(&mut rd, &mut wr)) => {
                r.unwrap_or_else(|_| Err("no hello within 10 s".into()))
            }
            _ = evicted.notified() => return,
        };
        self.unadmit(gate_id);
        let (host, node, nproc, age, mut welcome) = match greeted {
            Ok(Greeted::Agent {
                host,
                node,
                nproc,
                age,
                welcome,
            }) => (host, node, nproc, age, welcome),
            Ok(Greeted::Query(answer)) => {
                let _ = wr.write_all(proto::line(&answer).as_bytes()).await;
                let _ = wr.shutdown().await;
                return;
            }
            Ok(Greeted::Rsh {
                agent,
                gen,
                cmd,
                answer,
            }) => {
                return self.rsh_session(agent, gen, cmd, answer, rd, wr).await;
            }
            Err(why) => return refuse(&mut wr, &peer, &why).await,
        };
        // Every node of the job runs the same number of workers when the core's
        // bft-run says how many; else each agent its own.
        let slots = match self.cfg.nproc {
            0 => (nproc as usize).max(1),
            n => n,
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let kick = Arc::new(Notify::new());
        let id = {
            let mut s = self.shared.lock().unwrap();
            let id = s.next_agent;
            s.next_agent += 1;
            let seen = s.start.elapsed().as_secs_f64();
            let newcomer = s.world.is_none() && s.m.gen() > 0;
            s.agents.insert(
                id,
                AgentRec {
                    tx: tx.clone(),
                    workers: BTreeSet::new(),
                    host: host.clone(),
                    node,
                    slots,
                    leaving: false,
                    seen,
                    born: seen - age,
                    newcomer,
                    kick: kick.clone(),
                },
            );
            id
        };
        say!(
            "bft-run: {} agent {id} joined from {host} ({nproc} workers)",
            ts()
        );
        welcome["agent"] = json!(id);
        let _ = tx.send(proto::line(&welcome));
        if let Some((code, reason)) = self.end_tx.borrow().clone() {
            let _ = tx.send(proto::line(
                &json!({"t": "end", "code": code, "reason": reason}),
            ));
        } else {
            let mut s = self.shared.lock().unwrap();
            let now = s.start.elapsed().as_secs_f64();
            if let Some(w) = s.world.as_mut() {
                let acts = w.join(id, slots, now);
                self.world_acts(&mut s, acts);
            }
        }
        let writer = tokio::spawn(async move {
            while let Some(l) = rx.recv().await {
                if wr.write_all(l.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        loop {
            let msg = tokio::select! {
                m = proto::read_msg(&mut rd) => m,
                _ = kick.notified() => break,
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(proto::error(&e));
                    say!("bft-run: agent {id} ({host}): {e}; dropping it");
                    break;
                }
            };
            if let Err(e) = self.agent_msg(id, &host, &msg) {
                let _ = tx.send(proto::error(&e));
                say!("bft-run: agent {id} ({host}): {e}; dropping it");
                break;
            }
        }
        {
            let mut s = self.shared.lock().unwrap();
            if let Some(a) = s.agents.remove(&id) {
                let gone: Vec<String> = a.workers.into_iter().collect();
                if self.end_tx.borrow().is_none() {
                    say!("bft-run: {} agent {id} ({host}) is gone", ts());
                }
                s.kv.forget_agent(id);
                // Its rsh sessions end (their clients exit 255, as ssh's do when the
                // connection is lost: mpirun then takes those daemons as failed).
                s.rsh_clients.retain(|_, (a, _)| *a != id);
                let out = s.m.drop_workers(&gone, true);
                self.apply(&mut s, out);
                let now = s.start.elapsed().as_secs_f64();
                if let Some(w) = s.world.as_mut() {
                    let acts = w.leave(id, now);
                    self.world_acts(&mut s, acts);
                }
            }
        }
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    }

    /// Challenge, hello, the agent's credential checked, the welcome made (with this
    /// coordinator's own credential for the agent to check); the agent's host, its
    /// worker count and the welcome (without the agent id) when it may come in.
    async fn greet(
        &self,
        rd: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
        wr: &mut tokio::net::tcp::OwnedWriteHalf,
    ) -> Result<Greeted, String> {
        let nonce = proto::fresh_id();
        let challenge = json!({
            "t": "challenge", "proto": PROTO, "nonce": nonce,
            "job": self.cfg.job, "run": self.cfg.run,
        });
        wr.write_all(proto::line(&challenge).as_bytes())
            .await
            .map_err(|e| format!("write failed: {e}"))?;
        let hello = match proto::read_msg_max(rd, proto::MAX_HELLO).await {
            Ok(Some(v)) => v,
            Ok(None) => return Err("closed before its hello".into()),
            Err(e) => return Err(e),
        };
        let kind = hello.get("query").and_then(Value::as_str);
        let query = matches!(kind, Some("hosts" | "rsh"));
        let (host, nproc, anonce) = self.check_hello(&hello, &nonce, query).await?;
        let node = hello
            .get("node")
            .and_then(Value::as_str)
            .filter(|n| proto::is_node_name(n))
            .unwrap_or(&host)
            .to_string();
        let munge = self.cfg.munge.clone();
        let payload = proto::coord_payload(&self.cfg.job, &self.cfg.run, &anonce);
        let owner = self.cfg.uid;
        let cred = tokio::task::spawn_blocking(move || munge.encode(&payload, owner))
            .await
            .map_err(|e| format!("credential failed: {e}"))?
            .map_err(|e| format!("cannot prove this coordinator to the agent: {e}"))?;
        if kind == Some("rsh") {
            return self.rsh_grant(&hello, cred);
        }
        if query {
            return Ok(Greeted::Query(json!({
                "t": "hosts", "proto": PROTO, "cred": cred, "job": self.cfg.job,
                "run": self.cfg.run, "hosts": self.hosts(),
            })));
        }
        let welcome = json!({
            "t": "welcome", "proto": PROTO, "cred": cred, "job": self.cfg.job,
            "run": self.cfg.run, "argv": self.cfg.argv, "cwd": self.cfg.cwd,
            "env": self.cfg.env, "nproc": self.cfg.nproc, "opts": self.cfg.opts.to_json(),
            "mode": self.cfg.mode.name(),
        });
        // The agent's own word (the owner's): bounded, as what it feeds is.
        let age = hello
            .get("age")
            .and_then(Value::as_f64)
            .filter(|a| a.is_finite() && *a >= 0.0)
            .map_or(0.0, |a| a.min(MAX_AGENT_AGE_S));
        Ok(Greeted::Agent {
            host,
            node,
            nproc,
            age,
            welcome,
        })
    }

    /// A `bft-run rsh` request (its credential already checked: the job owner's, for
    /// this run and connection): granted only with the running MPI world's token and
    /// for one of its hosts; the agent to run it, and the answer carrying this
    /// coordinator's credential.
    fn rsh_grant(&self, hello: &Value, cred: String) -> Result<Greeted, String> {
        let target = proto::str_field(hello, "target")?;
        let token = proto::id_field(hello, "token")?;
        let cmd = proto::str_field(hello, "cmd")?;
        if cmd.is_empty() || cmd.len() > MAX_RSH_CMD || cmd.contains('\0') {
            return Err(format!(
                "an rsh command must be 1 to {MAX_RSH_CMD} bytes without NUL"
            ));
        }
        let s = self.shared.lock().unwrap();
        let Some(w) = s.rsh.as_ref().filter(|w| same_secret(&w.token, token)) else {
            return Err(
                "rsh refused: not the running MPI world's launcher (no such world now, or it was stopped)"
                    .into(),
            );
        };
        let Some(&agent) = w.hosts.get(target) else {
            return Err(format!(
                "rsh refused: {:?} is not a host of generation {}",
                brief(target),
                w.gen
            ));
        };
        Ok(Greeted::Rsh {
            agent,
            gen: w.gen,
            cmd: cmd.to_string(),
            answer: json!({
                "t": "rsh_ok", "proto": PROTO, "cred": cred, "job": self.cfg.job,
                "run": self.cfg.run,
            }),
        })
    }

    /// Relays a granted `bft-run rsh` session: the command to its agent, the
    /// agent's output and exit status back; the client gone, the agent kills it.
    async fn rsh_session(
        &self,
        agent: u64,
        gen: u64,
        cmd: String,
        answer: Value,
        mut rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
        mut wr: tokio::net::tcp::OwnedWriteHalf,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<(bool, String)>();
        let id = {
            let mut s = self.shared.lock().unwrap();
            let id = s.next_rsh;
            s.next_rsh += 1;
            match s.agents.get(&agent) {
                Some(a) => {
                    let _ = a.tx.send(proto::line(
                        &json!({"t": "rsh", "id": id, "gen": gen, "cmd": cmd}),
                    ));
                    s.rsh_clients.insert(id, (agent, tx));
                    Some(id)
                }
                None => None,
            }
        };
        let Some(id) = id else {
            let _ = wr
                .write_all(proto::error("rsh refused: that host's agent is gone").as_bytes())
                .await;
            return;
        };
        if proto::verbose() {
            say!(
                "bft-run: {} rsh {id} on agent {agent}: {}",
                ts(),
                brief(&cmd)
            );
        }
        let mut exited = false;
        if wr.write_all(proto::line(&answer).as_bytes()).await.is_ok() {
            loop {
                tokio::select! {
                    m = proto::read_msg(&mut rd) => {
                        // The client sends nothing after its hello: anything else,
                        // or its end, ends the session.
                        let _ = m;
                        break;
                    }
                    l = rx.recv() => {
                        let Some((last, l)) = l else { break };
                        if wr.write_all(l.as_bytes()).await.is_err() {
                            break;
                        }
                        if last {
                            exited = true;
                            break;
                        }
                    }
                }
            }
        }
        let mut s = self.shared.lock().unwrap();
        s.rsh_clients.remove(&id);
        if !exited {
            if let Some(a) = s.agents.get(&agent) {
                let _ = a.tx.send(proto::line(&json!({"t": "rsh_kill", "id": id})));
            }
        }
    }

    /// An agent's `rsh_out`/`rsh_exit` for session `id`: checked, rebuilt and
    /// passed to that session's client when the session is this agent's.
    fn rsh_relay(&self, agent: u64, msg: &Value) -> Result<(), String> {
        let id = proto::u64_field(msg, "id")?;
        let last = proto::t(msg) == "rsh_exit";
        let out = if !last {
            let line = proto::clip(proto::str_field(msg, "line")?, 64 << 10);
            let err = msg.get("err").and_then(Value::as_bool).unwrap_or(false);
            json!({"t": "rsh_out", "err": err, "line": line})
        } else {
            let code = msg
                .get("code")
                .and_then(Value::as_i64)
                .ok_or("an rsh_exit without a whole-number \"code\"")?
                .clamp(-255, 255);
            json!({"t": "rsh_exit", "code": code})
        };
        let s = self.shared.lock().unwrap();
        if let Some((a, tx)) = s.rsh_clients.get(&id) {
            if *a == agent {
                let _ = tx.send((last, proto::line(&out)));
            }
        }
        Ok(())
    }

    /// The job's hosts now: each agent's node and worker slots, in joining order,
    /// without those leaving.
    fn hosts(&self) -> Value {
        let s = self.shared.lock().unwrap();
        let mut ids: Vec<&u64> = s.agents.keys().collect();
        ids.sort();
        let hosts: Vec<Value> = ids
            .into_iter()
            .filter_map(|id| s.agents.get(id).map(|a| (id, a)))
            .filter(|(_, a)| !a.leaving)
            .map(|(id, a)| json!({"agent": id, "node": a.node, "addr": a.host, "slots": a.slots}))
            .collect();
        Value::Array(hosts)
    }

    async fn check_hello(
        &self,
        hello: &Value,
        nonce: &str,
        query: bool,
    ) -> Result<(String, u64, String), String> {
        if proto::t(hello) != "hello" {
            return Err(format!(
                "expected a hello, got {:?}",
                brief(proto::t(hello))
            ));
        }
        let proto_v = proto::u64_field(hello, "proto")?;
        if proto_v != PROTO {
            return Err(format!(
                "version mismatch: this coordinator (bft-run {}) speaks protocol {PROTO}, the agent {proto_v}; use the same bft-run on every node",
                env!("CARGO_PKG_VERSION")
            ));
        }
        let cred = proto::str_field(hello, "cred")?.to_string();
        let host = proto::str_field(hello, "host")?;
        if host.len() > 255 || !host.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the hello's host is not a host name or address".into());
        }
        let host = host.to_string();
        let anonce = proto::id_field(hello, "anonce")?.to_string();
        let nproc = hello
            .get("nproc")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(1024);
        let munge = self.cfg.munge.clone();
        let d = {
            let _permit = self
                .decodes
                .acquire()
                .await
                .map_err(|e| format!("credential check failed: {e}"))?;
            tokio::task::spawn_blocking(move || munge.decode(&cred))
                .await
                .map_err(|e| format!("credential check failed: {e}"))??
        };
        let payload = if query {
            proto::query_payload
        } else {
            proto::agent_payload
        };
        let want = payload(
            &self.cfg.job,
            &self.cfg.run,
            &self.cfg.advertised,
            nonce,
            &anonce,
        );
        check_cred(&d, self.cfg.uid, &want)?;
        Ok((host, nproc, anonce))
    }

    fn agent_msg(&self, id: u64, host: &str, msg: &Value) -> Result<(), String> {
        if proto::verbose() && proto::t(msg) != "hb" {
            say!("bft-run: {} agent {id} ({host}): {msg}", ts());
        }
        let mut s = self.shared.lock().unwrap();
        let now = s.start.elapsed().as_secs_f64();
        if let Some(a) = s.agents.get_mut(&id) {
            a.seen = now;
        }
        if matches!(proto::t(msg), "rsh_out" | "rsh_exit") {
            drop(s);
            return self.rsh_relay(id, msg);
        }
        if proto::t(msg) == "wprogress" {
            // A restarting mode's progress (the script's bftrainer.report_progress,
            // relayed by its agent): measured as native mode's, for the world running
            // now and from one of its agents only.
            let gen = proto::u64_field(msg, "gen")?;
            let samples = proto::u64_field(msg, "samples")?;
            let steps = msg.get("steps").and_then(Value::as_u64).unwrap_or(0);
            let ours = s
                .world
                .as_ref()
                .and_then(World::running)
                .is_some_and(|p| p.gen == gen && p.parts.iter().any(|x| x.agent == id));
            if ours {
                let batch = reported_batch(msg);
                if batch != s.run_batch {
                    s.run_batch = batch;
                    self.publish(&s);
                }
                if s.progress.report(gen, samples, steps, now).is_some() {
                    self.publish(&s);
                }
            }
            return Ok(());
        }
        if s.world.is_some() {
            let acts = world_msg(&mut s, id, host, msg, now)?;
            self.world_acts(&mut s, acts);
            return Ok(());
        }
        let worker = || -> Result<String, String> {
            let w = proto::str_field(msg, "worker")?;
            if w.split('.').next() != Some(id.to_string().as_str()) || w.len() > 64 {
                return Err(format!(
                    "worker id {:?} is not one of agent {id}'s",
                    brief(w)
                ));
            }
            Ok(w.to_string())
        };
        let out = match proto::t(msg) {
            "hb" => Outcome::Nothing,
            "ready" => {
                let w = worker()?;
                if let Some(a) = s.agents.get_mut(&id) {
                    a.workers.insert(w.clone());
                }
                s.m.ready(&w)
            }
            "progress" => {
                worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                let samples = proto::u64_field(msg, "samples")?;
                let steps = msg.get("steps").and_then(Value::as_u64).unwrap_or(0);
                let batch = reported_batch(msg);
                if gen == s.m.gen() && batch != s.run_batch {
                    s.run_batch = batch;
                    self.publish(&s);
                }
                self.progress(&mut s, gen, samples, steps);
                Outcome::Nothing
            }
            "broken" => {
                let w = worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                s.m.broken(&w, gen, now)
            }
            "done" => {
                let w = worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                s.m.done(&w, gen)
            }
            "kv" => {
                let w = worker()?;
                let rid = proto::u64_field(msg, "id")?;
                let timeout = msg
                    .get("timeout")
                    .and_then(Value::as_f64)
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .unwrap_or(300.0)
                    .min(86_400.0);
                let asker = (id, w, rid);
                let replies = match kv_op(msg) {
                    Ok(op) => s.kv.apply(asker, op, now, timeout),
                    Err(e) => vec![(asker, Reply::Error(e))],
                };
                self.answer(&s, replies);
                Outcome::Nothing
            }
            "exit" => {
                let w = worker()?;
                let code = msg.get("code").and_then(Value::as_i64).unwrap_or(1) as i32;
                if let Some(a) = s.agents.get_mut(&id) {
                    a.workers.remove(&w);
                }
                let out = s.m.exited(&w, code, &format!("on {host}"));
                if let Outcome::End { reason, .. } = &out {
                    let tail = proto::clip(
                        msg.get("stderr_tail").and_then(Value::as_str).unwrap_or(""),
                        16 << 10,
                    );
                    say!(
                        "bft-run: {reason}; last lines of its stderr:\n{}",
                        if tail.is_empty() { "(none)" } else { &tail }
                    );
                } else if code < 0 && self.end_tx.borrow().is_none() {
                    let why = msg
                        .get("why")
                        .and_then(Value::as_str)
                        .map(|w| format!(" ({})", brief(w)))
                        .unwrap_or_default();
                    say!(
                        "bft-run: {} worker {w} on {host} was killed by signal {}{why}",
                        ts(),
                        -code
                    );
                }
                out
            }
            "leave" => {
                // A worker leaves by itself (it got SIGTERM): at its step boundary,
                // like a leaving node.
                let w = worker()?;
                say!("bft-run: {} worker {w} on {host} leaves", ts());
                s.m.drop_workers(&[w], false)
            }
            "leaving" => {
                let gone: Vec<String> = s
                    .agents
                    .get(&id)
                    .map(|a| a.workers.iter().cloned().collect())
                    .unwrap_or_default();
                say!("bft-run: {} agent {id} ({host}) leaves", ts());
                if let Some(a) = s.agents.get_mut(&id) {
                    a.leaving = true;
                }
                s.m.drop_workers(&gone, false)
            }
            "give_up" => {
                let why = proto::str_field(msg, "why")?;
                let why = format!("on {host}: {}", why.chars().take(400).collect::<String>());
                say!("bft-run: {} {why}", ts());
                s.m.gave_up(why)
            }
            other => return Err(format!("unknown message type {:?}", brief(other))),
        };
        self.apply(&mut s, out);
        Ok(())
    }
}

/// What a greeting let in: an agent, or a query answered at once.
enum Greeted {
    Agent {
        host: String,
        node: String,
        nproc: u64,
        /// Seconds since its process started, as it says (bounded).
        age: f64,
        welcome: Value,
    },
    Query(Value),
    /// `bft-run rsh`, granted: run `cmd` under `agent` for world `gen`.
    Rsh {
        agent: u64,
        gen: u64,
        cmd: String,
        answer: Value,
    },
}

/// A store request (`kv` message) as an operation.
fn kv_op(msg: &Value) -> Result<Op, String> {
    let key = || proto::str_field(msg, "key").map(str::to_string);
    let bytes = |k: &str| proto::str_field(msg, k).and_then(kv::from_hex);
    let keys = || -> Result<Vec<String>, String> {
        msg.get("keys")
            .and_then(Value::as_array)
            .ok_or("a kv request lacks \"keys\"")?
            .iter()
            .map(|k| {
                k.as_str()
                    .map(str::to_string)
                    .ok_or("a key that is not a string".into())
            })
            .collect()
    };
    Ok(match proto::str_field(msg, "op")? {
        "set" => Op::Set(key()?, bytes("value")?),
        "get" => Op::Get(key()?),
        "add" => Op::Add(
            key()?,
            msg.get("delta")
                .and_then(Value::as_i64)
                .ok_or("an add without a whole-number \"delta\"")?,
        ),
        "cas" => Op::CompareSet(key()?, bytes("expected")?, bytes("desired")?),
        "wait" => Op::Wait(keys()?),
        "check" => Op::Check(keys()?),
        "delete" => Op::Delete(key()?),
        "num_keys" => Op::NumKeys,
        other => return Err(format!("unknown store operation {:?}", brief(other))),
    })
}

/// A decoded credential is acceptable when it is the job owner's and its payload is
/// exactly `want`: this job, this run, this coordinator's address and this
/// connection's nonce.
fn check_cred(d: &Decoded, uid: u32, want: &str) -> Result<(), String> {
    if d.uid != uid {
        return Err(format!(
            "refused: a credential of uid {}, this job belongs to uid {uid}",
            d.uid
        ));
    }
    if d.payload != want {
        return Err(
            "refused: the credential was made for another job, run, address or connection (its payload is not this connection's challenge)"
                .into(),
        );
    }
    Ok(())
}

async fn refuse(wr: &mut tokio::net::tcp::OwnedWriteHalf, peer: &str, why: &str) {
    say!("bft-run: {} refused a connection from {peer}: {why}", ts());
    let _ = wr.write_all(proto::error(why).as_bytes()).await;
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescale_costs_are_measured_to_the_first_step_of_the_new_generation() {
        let mut r = RescaleMeter::default();
        // A grow: generation 2 announced at 100 s; its newcomers started at 60 and
        // 70 s; its first step at 103 s: the slower newcomer took 43 s.
        r.announced(2, false, 100.0);
        assert!(r.stepped(2, 103.0, &[70.0, 60.0]));
        assert_eq!((r.up, r.down), (43.0, 0.0));
        assert!(!r.stepped(2, 104.0, &[]), "later steps change nothing");
        // A shrink: generation 3 announced at 200 s, first step at 202.5 s.
        r.announced(3, true, 200.0);
        assert!(!r.stepped(2, 201.0, &[]), "a late report of generation 2");
        assert!(r.stepped(3, 202.5, &[]));
        assert_eq!((r.up, r.down), (43.0, 2.5));
        assert!(!r.stepped(3, 210.0, &[]), "measured once");
        // A generation that is no shrink (a failure's, a grow) measures no pause.
        r.announced(4, false, 300.0);
        assert!(!r.stepped(4, 330.0, &[]));
        assert_eq!(r.down, 2.5);
    }

    #[test]
    fn the_rate_is_measured_within_the_current_generation() {
        let mut r = RateMeter::default();
        r.reset(3);
        assert_eq!(r.report(3, 1000, 10, 10.0), None);
        assert_eq!(r.report(3, 1100, 11, 11.0), None, "under 2 s");
        assert_eq!(
            r.report(2, 9999, 99, 12.5),
            None,
            "a late report of generation 2"
        );
        assert_eq!(r.report(3, 1500, 12, 14.0), Some(125.0));
        assert_eq!(r.step, 2.0, "4 s for 2 steps");
        r.reset(4);
        assert_eq!(r.rate, 0.0, "a new size is not measured yet");
        assert_eq!(r.step, 2.0, "the step time is kept");
        assert_eq!(r.report(4, 1600, 13, 15.0), None);
        assert_eq!(r.report(4, 1500, 14, 18.0), None, "counts never go back");
    }

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(utc(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(utc(1_795_496_276, 123), "2026-11-24T04:57:56.123Z");
    }

    #[test]
    fn generation_lines_name_who_joined_and_left() {
        let g = |gen, m: &[&str]| Gen {
            gen,
            members: m.iter().map(|s| s.to_string()).collect(),
            dead: Vec::new(),
        };
        let prev: Vec<String> = vec!["1.0".into(), "2.0".into()];
        assert_eq!(
            describe_gen(&g(1, &["1.0", "2.0"]), 2, &[]),
            "generation 1: 2 workers on 2 nodes (+1.0 +2.0)"
        );
        assert_eq!(
            describe_gen(&g(2, &["2.0", "3.0", "3.1"]), 2, &prev),
            "generation 2: 3 workers on 2 nodes (+3.0 +3.1, -1.0)"
        );
        assert_eq!(
            describe_gen(&g(3, &["1.0"]), 1, &prev),
            "generation 3: 1 workers on 1 nodes (-2.0)"
        );
        assert!(describe_gen(&g(4, &["1.0", "2.0"]), 2, &prev).contains("re-formed"));
        assert_eq!(agent_of("12.3"), Some(12));
        assert_eq!(agent_of("x"), None);
    }

    #[test]
    fn mpi_host_names_are_the_nodes_unless_unfit_or_shared_and_secrets_compare_whole() {
        let n = |v: &[(u64, &str)]| -> Vec<String> {
            mpi_host_names(
                &v.iter()
                    .map(|(i, s)| (*i, s.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(n(&[(1, "n1"), (2, "n2")]), vec!["n1", "n2"]);
        assert_eq!(
            n(&[(1, "n1"), (2, "n1"), (3, "a,b:9"), (4, "bft-agent-1")]),
            vec!["bft-agent-1", "bft-agent-2", "bft-agent-3", "bft-agent-4"]
        );
        assert!(same_secret("ab12", "ab12"));
        assert!(!same_secret("ab12", "ab13"));
        assert!(!same_secret("ab12", "ab1"));
        assert!(!same_secret("", "a"));
    }

    #[test]
    fn credentials_must_be_the_owners_and_for_this_connection() {
        let d = |uid, payload: &str| Decoded {
            uid,
            payload: payload.into(),
        };
        let good = proto::agent_payload("42", "r1", "h:7", "ab12", "cd");
        assert_eq!(check_cred(&d(1000, &good), 1000, &good), Ok(()));
        let e = check_cred(&d(0, &good), 1000, &good).unwrap_err();
        assert!(
            e.contains("credential of uid 0, this job belongs to uid 1000"),
            "{e}"
        );
        for other in [
            proto::agent_payload("42", "r1", "h:7", "ffff", "cd"),
            proto::agent_payload("43", "r1", "h:7", "ab12", "cd"),
            proto::agent_payload("42", "r0", "h:7", "ab12", "cd"),
            proto::agent_payload("42", "r1", "relay:9", "ab12", "cd"),
            proto::coord_payload("42", "r1", "cd"),
            format!("{good} "),
            String::new(),
        ] {
            let e = check_cred(&d(1000, &other), 1000, &good).unwrap_err();
            assert!(e.contains("another job, run"), "{other:?}: {e}");
        }
    }

    #[test]
    fn options_travel_in_the_welcome() {
        let o = AgentOpts {
            max_restarts: 5,
            restart_window: 600.0,
            leave_timeout: 30.0,
            hang_timeout: 10.0,
            verbose: true,
        };
        assert_eq!(AgentOpts::from_json(&o.to_json()), Ok(o));
        let e = AgentOpts::from_json(&json!({"max_restarts": -1})).unwrap_err();
        assert!(e.contains("max_restarts"), "{e}");
    }

    #[test]
    fn store_requests_parse_and_bad_ones_say_why() {
        let op = |v: Value| kv_op(&v);
        assert_eq!(
            op(json!({"op": "set", "key": "k", "value": "00ff"})),
            Ok(Op::Set("k".into(), vec![0, 255]))
        );
        assert_eq!(
            op(json!({"op": "wait", "keys": ["a", "b"]})),
            Ok(Op::Wait(vec!["a".into(), "b".into()]))
        );
        assert!(op(json!({"op": "add", "key": "k"}))
            .unwrap_err()
            .contains("delta"));
        assert!(op(json!({"op": "set", "key": "k", "value": "0"})).is_err());
        assert!(op(json!({"op": "rm -rf"}))
            .unwrap_err()
            .contains("unknown store operation"));
    }
}
