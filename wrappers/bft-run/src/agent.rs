//! The per-node agent: joins the coordinator with a MUNGE credential and checks the
//! coordinator's in return, starts and watches the node's workers (heartbeats, a
//! stopped or silent worker is killed), relays messages, and turns SIGTERM into a
//! graceful leave.

use crate::coord::AgentOpts;
use crate::proto::{self, brief, PROTO};
use crate::votes::Votes;
use bftrainer_slurm::munge::Munge;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub coord: String,
    /// The elastic job whose coordinator this is, when known: the coordinator must
    /// answer for it.
    pub coord_job: Option<String>,
    /// The run of that job the agent means to join, when known (from the Comment, or
    /// given by the core's bft-run): the coordinator must answer for it.
    pub coord_run: Option<String>,
    pub node_name: String,
    pub munge: Munge,
    pub slurm_job: Option<String>,
    /// Workers on this node when the coordinator leaves it to the agent.
    pub local_nproc: usize,
    /// The node's GPUs (CUDA_VISIBLE_DEVICES values, or NVML's indices). Every
    /// worker sees all of them; the one in slot i (LOCAL_RANK i) uses the i-th.
    pub gpus: Vec<String>,
}

const TAIL_LINES: usize = 20;
const TAIL_LINE_MAX: usize = 400;

/// Variables that describe this node, not the job: the coordinator does not pass its
/// own to the workers; each agent gives its workers the node's, unchanged (every worker
/// of a node sees all of its GPUs and picks its own by LOCAL_RANK, as under torchrun).
pub const NODE_LOCAL_VARS: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
];

enum Ev {
    Coord(Result<Option<Value>, String>),
    Worker(String, Value),
    WorkerConn(String, mpsc::UnboundedSender<String>),
    Exited(String, i32, String),
    /// A worker's connection failed (a malformed line): it hears nothing more.
    WorkerGone(String, String),
    Term,
    /// Twice a second: heartbeats and the watchdog.
    Tick,
    /// MPI mode: a line of an rsh session's command (its id; stderr or stdout).
    RshOut(u64, bool, String),
}

struct Worker {
    pid: i32,
    /// When it was last heard from (any message; the library sends one a second).
    heard: Instant,
    /// It said hello: from then on it must keep sending.
    connected: bool,
    /// Since when /proc says it is stopped (SIGSTOP, a debugger).
    stopped_since: Option<Instant>,
    /// Why the agent killed it, for the coordinator's log.
    killed_why: Option<String>,
    /// In a generation the agent forwarded (it holds state; leaves at a boundary).
    member: bool,
    /// Its place on the node, 0..nproc: BFT_LOCAL_RANK and its GPU. A worker
    /// restarted after a signal takes the slot of the one it replaces.
    slot: usize,
    /// It sent `done`: its training function returned; the script may still be
    /// saving or printing its results, so the end of the job does not signal it.
    done: bool,
}

/// Runs the agent; returns the process exit code.
pub async fn run(o: AgentOptions) -> i32 {
    match agent(o).await {
        Ok(code) => code,
        Err((code, msg)) => {
            say!("bft-run: {msg}");
            code
        }
    }
}

async fn agent(o: AgentOptions) -> Result<i32, (i32, String)> {
    let lost = |e: String| (2, format!("coordinator at {}: {e}", o.coord));
    // A coordinator over its cap of unauthenticated connections (a flood) closes the
    // oldest of them, perhaps this one: try again for a while.
    let me = nix::unistd::getuid().as_raw();
    let mut tries = 0u32;
    // Closed without a word (before the challenge or the welcome): the coordinator is
    // busy or flooded and closed this unauthenticated connection; try again.
    let again = |tries: &mut u32| -> Option<Duration> {
        if *tries >= 100 {
            return None;
        }
        if *tries == 0 {
            say!(
                "bft-run: the coordinator at {} closed the connection before its welcome (busy, or flooded?); trying again for about 8 minutes",
                o.coord
            );
        }
        *tries += 1;
        // 0.2 s, doubling up to 5 s, 100 times: about 8 minutes of waits in all.
        Some(Duration::from_secs_f64(
            (0.1 * 2f64.powi((*tries).min(6) as i32)).min(5.0),
        ))
    };
    let (host, mut rd, mut wr, job, run, anonce, welcome) = loop {
        let sock = TcpStream::connect(&o.coord).await.map_err(|e| {
            let whose = match &o.coord_job {
                Some(j) => format!("coordinator of job {j}"),
                None => "coordinator".into(),
            };
            (2, format!("{whose} unreachable at {}: {e}", o.coord))
        })?;
        let host = sock
            .local_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".into());
        let (rd, mut wr) = sock.into_split();
        let mut rd = BufReader::new(rd);
        let ch = tokio::time::timeout(
            Duration::from_secs(20),
            proto::read_msg_max(&mut rd, proto::MAX_HELLO),
        )
        .await
        .map_err(|_| lost("no challenge within 20 s".into()))?;
        let ch = match ch {
            Ok(Some(ch)) => ch,
            Ok(None) | Err(_) => match again(&mut tries) {
                Some(p) => {
                    tokio::time::sleep(p).await;
                    continue;
                }
                None => return Err(lost("closed the connection".into())),
            },
        };
        let their = ch.get("proto").and_then(Value::as_u64).unwrap_or(0);
        if proto::t(&ch) != "challenge" || their != PROTO {
            return Err((
                2,
                format!(
                    "version mismatch: the coordinator at {} speaks protocol {their}, this agent {PROTO} (bft-run {}); use the same bft-run on every node",
                    o.coord,
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
        let job = proto::str_field(&ch, "job").map_err(lost)?.to_string();
        let run = proto::id_field(&ch, "run").map_err(lost)?.to_string();
        let nonce = proto::id_field(&ch, "nonce").map_err(lost)?.to_string();
        let meant = |what: &str, want: &Option<String>, got: &str| -> Result<(), (i32, String)> {
            match want {
                Some(w) if w != got => Err((
                    2,
                    format!(
                        "the party at {} answers for {what} {}, not {what} {w} (a stale address?); not joining it",
                        o.coord,
                        brief(got)
                    ),
                )),
                _ => Ok(()),
            }
        };
        meant("job", &o.coord_job, &job)?;
        meant("run", &o.coord_run, &run)?;
        let anonce = proto::fresh_id();
        let munge = o.munge.clone();
        let payload = proto::agent_payload(&job, &run, &o.coord, &nonce, &anonce);
        let cred = tokio::task::spawn_blocking(move || munge.encode(&payload, me))
            .await
            .map_err(|e| (2, e.to_string()))?
            .map_err(|e| (2, e))?;
        let hello = json!({
            "t": "hello", "proto": PROTO, "cred": cred, "host": host, "anonce": anonce,
            "node": o.node_name, "slurm_job": o.slurm_job, "nproc": o.local_nproc,
            "age": proto::process_age(),
        });
        if wr.write_all(proto::line(&hello).as_bytes()).await.is_err() {
            if let Some(p) = again(&mut tries) {
                tokio::time::sleep(p).await;
                continue;
            }
            return Err(lost("closed the connection".into()));
        }
        let welcome = tokio::time::timeout(Duration::from_secs(60), proto::read_msg(&mut rd))
            .await
            .map_err(|_| lost("no answer to hello within 60 s".into()))?;
        match welcome {
            Ok(Some(w)) => break (host, rd, wr, job, run, anonce, w),
            Ok(None) | Err(_) => match again(&mut tries) {
                Some(p) => {
                    tokio::time::sleep(p).await;
                    continue;
                }
                None => return Err(lost("closed the connection".into())),
            },
        }
    };
    if proto::t(&welcome) == "error" {
        let why = welcome.get("msg").and_then(Value::as_str).unwrap_or("?");
        return Err((
            2,
            format!(
                "the coordinator at {} refused this agent: {}",
                o.coord,
                brief(why)
            ),
        ));
    }
    // Nothing the welcome says is used before the coordinator has proved, with a
    // credential of this agent's own uid made for this job, run and connection, that
    // it is the job's coordinator.
    let their_cred = proto::str_field(&welcome, "cred")
        .map_err(lost)?
        .to_string();
    let munge = o.munge.clone();
    let decoded = tokio::task::spawn_blocking(move || munge.decode(&their_cred))
        .await
        .map_err(|e| (2, e.to_string()))?;
    let proof = decoded.and_then(|d| {
        if d.uid != me {
            Err(format!(
                "its credential is uid {}'s, not this job owner's ({me})",
                d.uid
            ))
        } else if d.payload != proto::coord_payload(&job, &run, &anonce) {
            Err("its credential was not made for this job, run and connection".into())
        } else {
            Ok(())
        }
    });
    if let Err(why) = proof {
        return Err((
            2,
            format!(
                "the party at {} is not the coordinator of job {job}: {why}; not running anything it sent",
                o.coord
            ),
        ));
    }
    let agent_id = proto::u64_field(&welcome, "agent").map_err(lost)?;
    let opts = AgentOpts::from_json(welcome.get("opts").unwrap_or(&Value::Null)).map_err(lost)?;
    proto::set_verbose(opts.verbose || proto::verbose());
    let argv: Vec<String> = welcome
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if argv.is_empty() {
        return Err(lost("the welcome carries no command".into()));
    }
    let cwd = proto::str_field(&welcome, "cwd").map_err(lost)?.to_string();
    let env: BTreeMap<String, String> = welcome
        .get("env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let nproc = match welcome.get("nproc").and_then(Value::as_u64).unwrap_or(0) {
        0 => o.local_nproc.max(1),
        n => n as usize,
    };
    if !o.gpus.is_empty() && nproc > o.gpus.len() {
        say!(
            "bft-run: {nproc} workers on {} GPU(s) of node {}: local ranks {} and up share a GPU (NCCL refuses two ranks on one GPU; the library then needs BFT_BACKEND=gloo)",
            o.gpus.len(),
            o.node_name,
            o.gpus.len()
        );
    }
    let hang = Duration::from_secs_f64(opts.hang_timeout);
    let leave_timeout = Duration::from_secs_f64(opts.leave_timeout);

    // The workers' socket, in a directory only this user can enter.
    let dir =
        tempdir().map_err(|e| (1, format!("cannot make the agent's socket directory: {e}")))?;
    let sock_path = dir.join("agent.sock");
    let listener = UnixListener::bind(&sock_path)
        .map_err(|e| (1, format!("cannot listen on {}: {e}", sock_path.display())))?;

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<Ev>();
    // Coordinator reader.
    {
        let tx = ev_tx.clone();
        tokio::spawn(async move {
            loop {
                let m = proto::read_msg(&mut rd).await;
                let end = !matches!(m, Ok(Some(_)));
                if tx.send(Ev::Coord(m)).is_err() || end {
                    break;
                }
            }
        });
    }
    let live: Live = Arc::new(Mutex::new(HashMap::new()));
    // Worker connections.
    {
        let tx = ev_tx.clone();
        let live = live.clone();
        tokio::spawn(async move {
            while let Ok((c, _)) = listener.accept().await {
                tokio::spawn(worker_conn(c, tx.clone(), live.clone()));
            }
        });
    }
    {
        let tx = ev_tx.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_millis(500));
            loop {
                t.tick().await;
                if tx.send(Ev::Tick).is_err() {
                    break;
                }
            }
        });
    }
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let tx = ev_tx.clone();
        if let Ok(mut s) = signal(kind) {
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    if tx.send(Ev::Term).is_err() {
                        break;
                    }
                }
            });
        }
    }

    let spawn_cfg = SpawnCfg {
        argv,
        cwd,
        env,
        node_env: NODE_LOCAL_VARS
            .iter()
            .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
            .collect(),
        sock: sock_path.to_string_lossy().into_owned(),
        host: host.clone(),
        node: o.node_name.clone(),
        job: job.clone(),
        nproc,
        native: true,
        coord: o.coord.clone(),
        run: run.clone(),
        ifname: iface_of(&host),
        extra: Vec::new(),
    };
    let mode = welcome.get("mode").and_then(Value::as_str);
    if matches!(mode, Some("torchrun" | "mpi")) {
        let ctx = WorldAgent {
            mpi: mode == Some("mpi"),
            exe: std::env::current_exe()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "bft-run".into()),
            agent_id,
            coord: o.coord.clone(),
            hang,
            leave_timeout,
            cfg: SpawnCfg {
                native: false,
                ..spawn_cfg
            },
            progress: dir.join("progress"),
        };
        let r = world_agent(ctx, wr, ev_tx, ev_rx).await;
        let _ = std::fs::remove_dir_all(&dir);
        return r;
    }
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut conns: HashMap<String, mpsc::UnboundedSender<String>> = HashMap::new();
    let mut next_local = 0usize;
    for slot in 0..nproc {
        let id = format!("{agent_id}.{next_local}");
        let pid = spawn_worker(&spawn_cfg, &id, slot, &ev_tx).map_err(|e| (1, e))?;
        live.lock().unwrap().insert(id.clone(), false);
        workers.insert(id, Worker::new(pid, slot));
        next_local += 1;
    }
    // Restarts within the last restart window.
    let mut restarts: VecDeque<Instant> = VecDeque::new();
    let mut heard_coord = Instant::now();
    // The job's measured seconds per step (from the coordinator's heartbeats).
    let mut step_time = 0.0f64;
    let mut last_gen: Option<String> = None;
    let mut end_line: Option<String> = None;
    let mut ending = false;
    let mut leaving = false;
    let mut deadline: Option<tokio::time::Instant> = None;
    // After `end`: until then, workers that sent `done` are left to exit on their own.
    let mut done_deadline: Option<tokio::time::Instant> = None;
    let mut coord_open = true;
    let mut lost = false;
    // Sharded steps commit all-or-none on this node (votes.rs).
    let mut votes = Votes::default();
    let mine = format!("{agent_id}.");
    macro_rules! answer {
        ($replies:expr) => {
            for (w, m) in $replies {
                if let Some(c) = conns.get(&w) {
                    let _ = c.send(proto::line(&m));
                }
            }
        };
    }

    loop {
        if (ending || leaving || !coord_open) && workers.is_empty() {
            break;
        }
        let ev = match deadline {
            Some(d) => match tokio::time::timeout_at(d, ev_rx.recv()).await {
                Ok(e) => e,
                Err(_) => {
                    let now = tokio::time::Instant::now();
                    let spare_done = done_deadline.is_some_and(|d| now < d);
                    for (id, w) in &workers {
                        if spare_done && w.done {
                            continue;
                        }
                        say!("bft-run: worker {id} did not stop in time; killing it");
                        kill(w.pid, Signal::SIGKILL);
                    }
                    deadline = done_deadline.filter(|_| spare_done);
                    continue;
                }
            },
            None => ev_rx.recv().await,
        };
        let Some(ev) = ev else { break };
        if let (true, Ev::Coord(Ok(Some(m)))) = (proto::verbose(), &ev) {
            if proto::t(m) != "hb" {
                say!("bft-run: coordinator -> agent {agent_id}: {m}");
            }
        }
        if let Ev::Coord(Ok(Some(_))) = &ev {
            heard_coord = Instant::now();
        }
        match ev {
            Ev::Tick => {
                let _ = wr
                    .write_all(proto::line(&json!({"t": "hb"})).as_bytes())
                    .await;
                if coord_open && !ending && heard_coord.elapsed() > 2 * hang {
                    say!(
                        "bft-run: heard nothing from the coordinator at {} for {:.0} s; taking it as lost",
                        o.coord,
                        heard_coord.elapsed().as_secs_f64()
                    );
                    let _ = ev_tx.send(Ev::Coord(Err("no heartbeat".into())));
                }
                watchdog(&mut workers, hang);
            }
            Ev::Coord(Ok(Some(m))) => match proto::t(&m) {
                "hb" => {
                    if let Some(x) = m.get("step").and_then(Value::as_f64) {
                        if x.is_finite() && x >= 0.0 {
                            step_time = x.min(86_400.0);
                        }
                    }
                }
                "abort" => {
                    let line = proto::line(&m);
                    for c in conns.values() {
                        let _ = c.send(line.clone());
                    }
                    if let Ok(gen) = proto::u64_field(&m, "gen") {
                        answer!(votes.fail(gen));
                    }
                }
                "kvr" => {
                    // A store answer for one worker.
                    let w = m.get("worker").and_then(Value::as_str).unwrap_or("");
                    if let Some(c) = conns.get(w) {
                        let _ = c.send(proto::line(&m));
                    }
                }
                "gen" => {
                    let line = proto::line(&m);
                    if let Some(members) = m.get("members").and_then(Value::as_array) {
                        for (id, w) in workers.iter_mut() {
                            w.member |= members.iter().any(|x| x.as_str() == Some(id));
                        }
                    }
                    for c in conns.values() {
                        let _ = c.send(line.clone());
                    }
                    if let Ok(gen) = proto::u64_field(&m, "gen") {
                        let names = |k: &str| -> Vec<String> {
                            m.get(k)
                                .and_then(Value::as_array)
                                .map(|a| {
                                    a.iter()
                                        .filter_map(Value::as_str)
                                        .map(String::from)
                                        .collect()
                                })
                                .unwrap_or_default()
                        };
                        let local = names("members")
                            .into_iter()
                            .filter(|w| w.starts_with(&mine))
                            .collect();
                        answer!(votes.generation(gen, local, &names("dead")));
                    }
                    last_gen = Some(line);
                }
                "end" => {
                    ending = true;
                    let line = proto::line(&m);
                    for c in conns.values() {
                        let _ = c.send(line.clone());
                    }
                    end_line = Some(line);
                    // The library stops at `end`; those still warming up never read it:
                    // SIGTERM, and SIGKILL after 5 s. Workers that finished (`done`) are
                    // left --leave-timeout to exit on their own (a final save).
                    for w in workers.values().filter(|w| !w.done) {
                        kill(w.pid, Signal::SIGTERM);
                    }
                    let now = tokio::time::Instant::now();
                    done_deadline = Some(now + leave_timeout);
                    deadline.get_or_insert(now + Duration::from_secs(5));
                }
                "kill" => {
                    // A member the coordinator dropped as hung (silent after a failure):
                    // it dies by a signal, so it is restarted like any such worker.
                    let w = m.get("worker").and_then(Value::as_str).unwrap_or("");
                    if let Some(w) = workers.get_mut(w) {
                        say!(
                            "bft-run: the coordinator dropped worker {} as hung; killing it",
                            m["worker"].as_str().unwrap_or("")
                        );
                        w.killed_why = Some("dropped by the coordinator as hung".into());
                        kill(w.pid, Signal::SIGKILL);
                    }
                }
                "error" => say!(
                    "bft-run: the coordinator says: {}",
                    brief(m.get("msg").and_then(Value::as_str).unwrap_or("?"))
                ),
                _ => {}
            },
            Ev::Coord(r) => {
                coord_open = false;
                if !ending {
                    // The job's coordinator is gone (the core job ended or its node
                    // died): nobody can form a world any more.
                    lost = true;
                    ending = true;
                    let why = match r {
                        Err(e) => format!(" ({e})"),
                        _ => String::new(),
                    };
                    say!(
                        "bft-run: lost the coordinator at {}{why}; stopping {} worker(s)",
                        o.coord,
                        workers.len()
                    );
                    for w in workers.values() {
                        kill(w.pid, Signal::SIGKILL);
                    }
                    deadline = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                }
            }
            Ev::WorkerConn(id, tx) => {
                if let Some(w) = workers.get_mut(&id) {
                    w.connected = true;
                    w.heard = Instant::now();
                }
                // A latecomer learns what the others were told.
                for l in [&last_gen, &end_line].into_iter().flatten() {
                    let _ = tx.send(l.clone());
                }
                conns.insert(id, tx);
            }
            Ev::WorkerGone(id, e) => {
                if let Some(tx) = conns.remove(&id) {
                    let _ = tx.send(proto::error(&e));
                }
            }
            Ev::RshOut(..) => {} // MPI mode only
            Ev::Worker(id, m) => {
                if proto::verbose() {
                    say!("bft-run: worker {id} -> coordinator: {m}");
                }
                if let Some(w) = workers.get_mut(&id) {
                    w.heard = Instant::now();
                    if proto::t(&m) == "done" {
                        w.done = true;
                    }
                }
                match (proto::t(&m), proto::u64_field(&m, "gen")) {
                    ("vote", Ok(gen)) => match proto::u64_field(&m, "k") {
                        Ok(k) => answer!(votes.vote(&id, gen, k)),
                        Err(e) => answer!([(
                            id.clone(),
                            json!({"t": "error", "msg": format!("vote: {e}")})
                        )]),
                    },
                    ("vote", Err(e)) => answer!([(
                        id.clone(),
                        json!({"t": "error", "msg": format!("vote: {e}")})
                    )]),
                    ("broken", Ok(gen)) => answer!(votes.broken(&id, gen)),
                    _ => {}
                }
                if matches!(
                    proto::t(&m),
                    "ready" | "progress" | "broken" | "done" | "kv" | "leave"
                ) {
                    let mut m = m;
                    m["worker"] = Value::String(id);
                    let _ = wr.write_all(proto::line(&m).as_bytes()).await;
                }
            }
            Ev::Exited(id, code, tail) => {
                conns.remove(&id);
                answer!(votes.exited(&id));
                live.lock().unwrap().remove(&id);
                let (slot, why) = workers
                    .remove(&id)
                    .map_or((0, None), |w| (w.slot, w.killed_why));
                let mut msg = json!({"t": "exit", "worker": id, "code": code, "stderr_tail": tail});
                if let Some(w) = &why {
                    msg["why"] = Value::String(w.clone());
                }
                let _ = wr.write_all(proto::line(&msg).as_bytes()).await;
                let killed = code < 0;
                let window = Duration::from_secs_f64(opts.restart_window);
                while restarts.front().is_some_and(|t| t.elapsed() > window) {
                    restarts.pop_front();
                }
                if killed && !ending && !leaving && restarts.len() < opts.max_restarts as usize {
                    restarts.push_back(Instant::now());
                    let nid = format!("{agent_id}.{next_local}");
                    say!(
                        "bft-run: worker {id} was killed by signal {}{}; starting {nid} in its place ({} of {} restarts within {} s)",
                        -code,
                        why.map(|w| format!(" ({w})")).unwrap_or_default(),
                        restarts.len(),
                        opts.max_restarts,
                        opts.restart_window
                    );
                    match spawn_worker(&spawn_cfg, &nid, slot, &ev_tx) {
                        Ok(pid) => {
                            live.lock().unwrap().insert(nid.clone(), false);
                            workers.insert(nid, Worker::new(pid, slot));
                        }
                        Err(e) => say!("bft-run: cannot restart worker {id}: {e}"),
                    }
                    next_local += 1;
                } else if killed && !ending && !leaving {
                    let why = format!(
                        "worker {id} was killed by signal {}; not restarted: {} restarts within {} s already (--max-restarts, --restart-window)",
                        -code,
                        restarts.len(),
                        opts.restart_window
                    );
                    say!("bft-run: {why}");
                    let _ = wr
                        .write_all(proto::line(&json!({"t": "give_up", "why": why})).as_bytes())
                        .await;
                }
            }
            Ev::Term => {
                if !leaving && !ending {
                    leaving = true;
                    let _ = wr
                        .write_all(proto::line(&json!({"t": "leaving"})).as_bytes())
                        .await;
                    // Members leave at the next step boundary (the coordinator's next
                    // generation excludes them; SIGTERM tells the library so); the
                    // others hold no state.
                    for w in workers.values() {
                        kill(
                            w.pid,
                            if w.member {
                                Signal::SIGTERM
                            } else {
                                Signal::SIGKILL
                            },
                        );
                    }
                    // Two steps (the flag rides the next all-reduce) and a margin, at
                    // least --leave-timeout.
                    let two_steps = Duration::from_secs_f64(2.0 * step_time + 5.0);
                    deadline = Some(tokio::time::Instant::now() + leave_timeout.max(two_steps));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if lost {
        return Err((1, format!("lost the coordinator at {}", o.coord)));
    }
    Ok(0)
}

impl Worker {
    fn new(pid: i32, slot: usize) -> Worker {
        Worker {
            pid,
            heard: Instant::now(),
            connected: false,
            stopped_since: None,
            killed_why: None,
            member: false,
            slot,
            done: false,
        }
    }
}

/// Kills the workers that are hung: stopped (SIGSTOP: state T in /proc) for longer than
/// `hang`, or running but silent (no heartbeat from the library's background thread)
/// for longer than 3 x `hang`. A
/// worker still starting (before its hello: importing torch, loading data) is judged
/// by its process state only.
fn watchdog(workers: &mut HashMap<String, Worker>, hang: Duration) {
    let now = Instant::now();
    for (id, w) in workers.iter_mut() {
        if w.killed_why.is_some() {
            continue;
        }
        if proc_stopped(w.pid) {
            w.stopped_since.get_or_insert(now);
        } else {
            w.stopped_since = None;
        }
        let silent = now - w.heard;
        let why = match w.stopped_since {
            Some(t) if now - t > hang || (w.connected && silent > hang) => Some(format!(
                "stopped (SIGSTOP?), silent for {:.0} s",
                silent.as_secs_f64()
            )),
            // Running but silent: its interpreter does not run the heartbeat thread
            // (wedged), or a loaded machine starves it. A longer bound than for a
            // stopped process, so that load alone does not kill a healthy worker.
            None if w.connected && silent > 3 * hang => Some(format!(
                "no heartbeat for {:.0} s (frozen or wedged)",
                silent.as_secs_f64()
            )),
            _ => None,
        };
        if let Some(why) = why {
            say!("bft-run: worker {id} is hung: {why}; killing it");
            w.killed_why = Some(why);
            kill(w.pid, Signal::SIGKILL);
        }
    }
}

/// Whether the process is stopped (`T`) or traced-stopped (`t`), from /proc/PID/stat.
fn proc_stopped(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name in parentheses, which may hold spaces.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|st| st == "T" || st == "t")
}

/// The workers this agent started and has not seen exit; true once one connected (an
/// id is accepted on one connection only).
type Live = Arc<Mutex<HashMap<String, bool>>>;

#[derive(Clone)]
struct SpawnCfg {
    argv: Vec<String>,
    cwd: String,
    env: BTreeMap<String, String>,
    /// This node's values of [`NODE_LOCAL_VARS`].
    node_env: Vec<(String, String)>,
    sock: String,
    host: String,
    node: String,
    /// The elastic job (BFT_JOB: checkpoints are bound to it).
    job: String,
    nproc: usize,
    /// Native mode: workers talk to this agent (BFT_AGENT_SOCK, BFT_WORKER_ID).
    native: bool,
    /// The coordinator and run (BFT_COORD, BFT_COORD_RUN: `bft-run hosts` asks it).
    coord: String,
    run: String,
    /// The interface of this node's address toward the coordinator: the default
    /// GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.
    ifname: Option<String>,
    /// More variables (torchrun mode: the world's).
    extra: Vec<(String, String)>,
}

fn spawn_worker(
    c: &SpawnCfg,
    id: &str,
    slot: usize,
    ev: &mpsc::UnboundedSender<Ev>,
) -> Result<i32, String> {
    let mut cmd = tokio::process::Command::new(&c.argv[0]);
    cmd.args(&c.argv[1..])
        .current_dir(&c.cwd)
        .env_clear()
        .envs(&c.env)
        .envs(c.node_env.iter().map(|(k, v)| (k, v)))
        // torchrun's names, and the library's own.
        .env("LOCAL_RANK", slot.to_string())
        .env("LOCAL_WORLD_SIZE", c.nproc.to_string())
        .env("BFT_LOCAL_RANK", slot.to_string())
        .env("BFT_NODE_ADDR", &c.host)
        .env("BFT_NODE_NAME", &c.node)
        .env("BFT_JOB", &c.job)
        .env("BFT_COORD", &c.coord)
        .env("BFT_COORD_RUN", &c.run)
        .envs(c.extra.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if c.native {
        cmd.env("BFT_AGENT_SOCK", &c.sock).env("BFT_WORKER_ID", id);
    }
    if let Some(m) = std::env::var_os("BFT_MUNGE_SOCKET") {
        cmd.env("BFT_MUNGE_SOCKET", m);
    }
    // The interface the coordinator is reached over, unless the job chose one
    // (--gloo-socket-ifname, --nccl-socket-ifname or its own environment).
    if let Some(ifname) = &c.ifname {
        for k in ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"] {
            if !c.env.contains_key(k) {
                cmd.env(k, ifname);
            }
        }
    }
    if !c.env.contains_key("OMP_NUM_THREADS") {
        let cpus = std::env::var("SLURM_CPUS_ON_NODE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        cmd.env(
            "OMP_NUM_THREADS",
            (cpus / c.nproc.max(1)).max(1).to_string(),
        );
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(new_group_dying_with_us);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the worker {:?} in {}: {e}", c.argv[0], c.cwd))?;
    let pid = child.id().map_or(-1, |p| p as i32);
    let tail: Arc<Mutex<VecDeque<String>>> = Arc::new(Mutex::new(VecDeque::new()));
    let out = child.stdout.take().map(|o| {
        let id = id.to_string();
        tokio::spawn(async move {
            each_line(o, |l| proto::write_out(format!("[{id}] {l}"))).await;
        })
    });
    let err = child.stderr.take().map(|e| {
        let id = id.to_string();
        let tail = tail.clone();
        tokio::spawn(async move {
            each_line(e, |l| {
                say!("[{id}] {l}");
                // The tail travels to the coordinator: each line at most TAIL_LINE_MAX
                // bytes, so that the message stays far under the line limit.
                let mut t = tail.lock().unwrap();
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(proto::clip(l, TAIL_LINE_MAX));
            })
            .await;
        })
    });
    let ev = ev.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        let code = exit_code(&mut child, [out, err]).await;
        let tail = tail
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        let _ = ev.send(Ev::Exited(id, code, tail));
    });
    Ok(pid)
}

async fn worker_conn(c: UnixStream, ev: mpsc::UnboundedSender<Ev>, live: Live) {
    let (rd, mut wr) = c.into_split();
    let mut rd = BufReader::new(rd);
    let id = match proto::read_msg(&mut rd).await {
        Ok(Some(m)) if proto::t(&m) == "hello" => {
            let w = m.get("worker").and_then(Value::as_str).unwrap_or("");
            match claim(&live, w) {
                Ok(()) => w.to_string(),
                Err(e) => {
                    let _ = wr.write_all(proto::error(&e).as_bytes()).await;
                    return;
                }
            }
        }
        Ok(Some(m)) => {
            let e = format!(
                "expected {{\"t\":\"hello\",\"worker\":ID}} first, got a {:?} message",
                proto::t(&m)
            );
            let _ = wr.write_all(proto::error(&e).as_bytes()).await;
            return;
        }
        Ok(None) => return,
        Err(e) => {
            let _ = wr.write_all(proto::error(&e).as_bytes()).await;
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    if ev.send(Ev::WorkerConn(id.clone(), tx)).is_err() {
        return;
    }
    tokio::spawn(async move {
        while let Some(l) = rx.recv().await {
            if wr.write_all(l.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    loop {
        match proto::read_msg(&mut rd).await {
            Ok(Some(m)) => {
                if ev.send(Ev::Worker(id.clone(), m)).is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                // A worker killed mid-line resets the connection: only news with -v
                // (its exit is reported anyway); a malformed line is always reported.
                if proto::verbose() || !e.starts_with("read failed") {
                    say!("bft-run: worker {id}: {e}");
                }
                let _ = ev.send(Ev::WorkerGone(id, e));
                return;
            }
        }
    }
}

/// A worker's first message names it: an id this agent started, not yet connected.
fn claim(live: &Live, w: &str) -> Result<(), String> {
    let mut live = live.lock().unwrap();
    match live.get_mut(w) {
        Some(connected) if !*connected => {
            *connected = true;
            Ok(())
        }
        Some(_) => Err(format!("worker {w:?} is already connected to this agent")),
        None => {
            let mut ids: Vec<&String> = live.keys().collect();
            ids.sort();
            Err(format!(
                "worker {w:?} was not started by this agent (its workers: {ids:?}); BFT_WORKER_ID names the worker"
            ))
        }
    }
}

/// The name of the network interface that holds `addr` (an IP address), if any.
pub fn iface_of(addr: &str) -> Option<String> {
    let want: std::net::IpAddr = addr.parse().ok()?;
    nix::ifaddrs::getifaddrs()
        .ok()?
        .find(|ifa| {
            let Some(a) = ifa.address.as_ref() else {
                return false;
            };
            let ip = a
                .as_sockaddr_in()
                .map(|s| std::net::IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| std::net::IpAddr::V6(s.ip())));
            ip == Some(want)
        })
        .map(|ifa| ifa.interface_name)
}

/// This node's part of a world, as the coordinator's `world` message gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorldPart {
    pub gen: u64,
    pub rank_base: u64,
    pub world_size: u64,
    pub group_rank: u64,
    pub nnodes: u64,
    pub restarts: u64,
    pub master_addr: String,
    pub master_port: u16,
    pub run_id: String,
    /// The global batch bftrainerd decided for the job when the world started
    /// (`BFT_GLOBAL_BATCH`); `None`: no decision, the script's own.
    pub batch: Option<u32>,
}

impl WorldPart {
    pub fn from_msg(m: &Value) -> Result<WorldPart, String> {
        let num = |k: &str| proto::u64_field(m, k);
        let master_addr = proto::str_field(m, "master_addr")?;
        if master_addr.parse::<std::net::IpAddr>().is_err() && !proto::is_node_name(master_addr) {
            return Err(format!("{:?} is not an address", brief(master_addr)));
        }
        let run_id = proto::str_field(m, "run_id")?;
        if !proto::is_node_name(run_id) {
            return Err(format!("{:?} is not a run id", brief(run_id)));
        }
        let part = WorldPart {
            gen: num("gen")?,
            rank_base: num("rank_base")?,
            world_size: num("world_size")?,
            group_rank: num("group_rank")?,
            nnodes: num("nnodes")?,
            restarts: num("restarts")?,
            master_addr: master_addr.to_string(),
            master_port: u16::try_from(num("master_port")?)
                .map_err(|_| "master_port is not a port".to_string())?,
            run_id: run_id.to_string(),
            batch: world_batch(m)?,
        };
        if part.rank_base >= part.world_size || part.group_rank >= part.nnodes {
            return Err("ranks outside the world".into());
        }
        Ok(part)
    }

    /// torchrun's environment for local rank `local` (torch's local_elastic_agent
    /// sets the same names); MPI mode gives none (mpirun sets its ranks').
    pub fn torchrun_env(&self, local: usize) -> Vec<(String, String)> {
        let rank = self.rank_base + local as u64;
        let v = |k: &str, x: String| (k.to_string(), x);
        vec![
            v("RANK", rank.to_string()),
            v("WORLD_SIZE", self.world_size.to_string()),
            v("GROUP_RANK", self.group_rank.to_string()),
            v("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            v("ROLE_RANK", rank.to_string()),
            v("ROLE_NAME", "default".into()),
            v("ROLE_WORLD_SIZE", self.world_size.to_string()),
            v("MASTER_ADDR", self.master_addr.clone()),
            v("MASTER_PORT", self.master_port.to_string()),
            v("TORCHELASTIC_RESTART_COUNT", self.restarts.to_string()),
            v("TORCHELASTIC_MAX_RESTARTS", "0".into()),
            v("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            v("TORCHELASTIC_USE_AGENT_STORE", "False".into()),
            v("BFT_GENERATION", self.gen.to_string()),
        ]
        .into_iter()
        .chain(self.batch_env())
        .collect()
    }

    /// The decided global batch for the world's workers (both restarting modes).
    pub fn batch_env(&self) -> Option<(String, String)> {
        self.batch.map(|b| (BATCH_VAR.to_string(), b.to_string()))
    }
}

/// The variable that hands a restarting mode's world the global batch bftrainerd
/// decided (the library's `bftrainer.apply_world_batch` reads it).
pub const BATCH_VAR: &str = "BFT_GLOBAL_BATCH";

/// The `batch` of a `world` message: absent (no decision) or a whole number of
/// samples from 1 to [`bftrainer_core::spec::MAX_BATCH`].
fn world_batch(m: &Value) -> Result<Option<u32>, String> {
    match m.get("batch") {
        None => Ok(None),
        Some(b) => b
            .as_u64()
            .filter(|b| (1..=u64::from(bftrainer_core::spec::MAX_BATCH)).contains(b))
            .map(|b| Some(b as u32))
            .ok_or_else(|| {
                format!(
                    "batch {} is not a global batch (1 to {})",
                    brief(&b.to_string()),
                    bftrainer_core::spec::MAX_BATCH
                )
            }),
    }
}

/// What a torchrun-mode agent works with.
struct WorldAgent {
    /// MPI mode: the first part's agent runs one mpirun for the world; every agent
    /// runs the daemons its `rsh` sessions ask for.
    mpi: bool,
    /// This bft-run's path (mpirun's rsh agent).
    exe: String,
    agent_id: u64,
    coord: String,
    hang: Duration,
    /// The grace of a stop: SIGTERM, then SIGKILL after this long.
    leave_timeout: Duration,
    cfg: SpawnCfg,
    /// Where a script's `bftrainer.report_progress` writes rank 0's progress
    /// (BFT_PROGRESS_FILE, in the agent's private directory), read each tick. Every
    /// process of the world this agent starts gets it: torchrun mode's workers, and in
    /// MPI mode mpirun (its node's ranks) and the rsh sessions' daemons (theirs), so
    /// that rank 0 writes into its own node's agent's file wherever it runs.
    progress: PathBuf,
}

/// The progress a restarting mode's script reported for world `gen`
/// (`bftrainer.report_progress`: one JSON object, `gen`, `samples`, `steps`, `batch`),
/// as the coordinator's `wprogress`; None for another world's. The file is the job's
/// own and untrusted: a plain file (not a link, FIFO or device: opened without
/// following a link and without blocking, so that nothing the script puts there can
/// hold the agent's loop), at most 4 KiB, whole numbers only.
fn read_progress(path: &std::path::Path, gen: u64) -> Result<Option<Value>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut buf = Vec::new();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "it is a symbolic link, not a plain file".to_string(),
            _ => format!("cannot read it: {e}"),
        })?;
    let meta = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.file_type().is_file() {
        return Err("it is not a plain file".into());
    }
    f.take(4097)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if buf.len() > 4096 {
        return Err("it is over 4 KiB".into());
    }
    let m: Value = serde_json::from_slice(&buf).map_err(|e| format!("not JSON: {e}"))?;
    let num = |k: &str, required: bool| -> Result<u64, String> {
        match m.get(k) {
            None | Some(Value::Null) if !required => Ok(0),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| format!("{k:?} is not a whole number >= 0")),
            None => Err(format!("it has no {k:?}")),
        }
    };
    let g = num("gen", true)?;
    let samples = num("samples", true)?;
    let (steps, batch) = (num("steps", false)?, num("batch", false)?);
    if g != gen {
        return Ok(None);
    }
    Ok(Some(
        json!({"t": "wprogress", "gen": g, "samples": samples, "steps": steps, "batch": batch}),
    ))
}

/// A torchrun-mode worker: its world, its local rank, and whether this agent
/// signalled it (its exit is then no failure).
struct WorldWorker {
    pid: i32,
    gen: u64,
    local: usize,
    signalled: bool,
    /// MPI mode: the launcher (mpirun), or the id of the rsh session this runs.
    launcher: bool,
    rsh: Option<u64>,
}

/// The torchrun-mode agent: starts the node's part of each world the coordinator
/// plans (torchrun's environment), stops it on request (SIGTERM, SIGKILL after the
/// grace) and reports every worker's exit; SIGTERM to the agent leaves the job.
async fn world_agent(
    mut ctx: WorldAgent,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    ev_tx: mpsc::UnboundedSender<Ev>,
    mut ev_rx: mpsc::UnboundedReceiver<Ev>,
) -> Result<i32, (i32, String)> {
    let id = ctx.agent_id;
    let mut workers: HashMap<String, WorldWorker> = HashMap::new();
    // The world this node runs (or last ran), and one whose stop awaits its workers.
    let mut gen = 0u64;
    let mut stopping: Option<u64> = None;
    let mut deadline: Option<Instant> = None;
    let mut heard_coord = Instant::now();
    let (mut leaving, mut ending, mut lost) = (false, false, false);
    // The progress file as last read (modified time, length), and whether a bad one
    // was said for this world.
    let mut progress_seen: Option<(std::time::SystemTime, u64)> = None;
    let mut progress_said = false;
    macro_rules! send {
        ($v:expr) => {{
            let _ = wr.write_all(proto::line(&$v).as_bytes()).await;
        }};
    }
    // MPI mode's stop is SIGUSR1 to mpirun alone, which forwards it to every rank
    // (the program's cue to checkpoint and exit 0; mpirun then ends cleanly). A
    // SIGTERM to mpirun would abort the job instead: its ranks get SIGTERM but
    // hang in MPI_Finalize until odls_base_sigkill_timeout's SIGKILL. The daemons
    // get only the grace's SIGKILL (they end with mpirun).
    let term = |workers: &mut HashMap<String, WorldWorker>, sig: Signal| {
        for w in workers.values_mut() {
            w.signalled = true;
            if sig == Signal::SIGTERM && w.launcher {
                kill_one(w.pid, Signal::SIGUSR1);
            } else if sig != Signal::SIGTERM || w.rsh.is_none() {
                kill(w.pid, sig);
            }
        }
    };
    loop {
        if (ending || leaving || lost) && workers.is_empty() {
            break;
        }
        let Some(ev) = ev_rx.recv().await else { break };
        if let Ev::Coord(Ok(Some(m))) = &ev {
            heard_coord = Instant::now();
            if proto::verbose() && proto::t(m) != "hb" {
                say!("bft-run: coordinator -> agent {id}: {m}");
            }
        }
        match ev {
            Ev::Tick => {
                send!(json!({"t": "hb"}));
                if !lost && !ending && heard_coord.elapsed() > 2 * ctx.hang {
                    say!(
                        "bft-run: heard nothing from the coordinator at {} for {:.0} s; taking it as lost",
                        ctx.coord,
                        heard_coord.elapsed().as_secs_f64()
                    );
                    let _ = ev_tx.send(Ev::Coord(Err("no heartbeat".into())));
                }
                let stamp = std::fs::symlink_metadata(&ctx.progress)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())));
                if stamp.is_some() && stamp != progress_seen && stopping.is_none() {
                    progress_seen = stamp;
                    match read_progress(&ctx.progress, gen) {
                        Ok(Some(m)) => send!(m),
                        Ok(None) => {}
                        Err(e) if !progress_said => {
                            progress_said = true;
                            say!(
                                "bft-run: ignoring the script's progress (BFT_PROGRESS_FILE): {e}"
                            );
                        }
                        Err(_) => {}
                    }
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    deadline = None;
                    for (wid, w) in &workers {
                        say!("bft-run: worker {wid} did not stop within the grace; killing it");
                        kill(w.pid, Signal::SIGKILL);
                    }
                }
            }
            Ev::Coord(Ok(Some(m))) => match proto::t(&m) {
                "port" => {
                    let g = proto::u64_field(&m, "gen").unwrap_or(0);
                    // A free port for rank 0's store (TCPStore listens on every
                    // interface); it is free again the moment this returns.
                    let port = std::net::TcpListener::bind("0.0.0.0:0")
                        .and_then(|l| l.local_addr())
                        .map(|a| a.port())
                        .map_err(|e| (1, format!("cannot find a free port: {e}")))?;
                    send!(json!({"t": "port", "gen": g, "port": port}));
                }
                "world" => {
                    let part = WorldPart::from_msg(&m)
                        .map_err(|e| (2, format!("a bad world message: {e}")))?;
                    if leaving || ending {
                        continue;
                    }
                    // Workers of an older world still here (never, unless a stop was
                    // missed): they must not share the node with the new one.
                    term(&mut workers, Signal::SIGKILL);
                    let g = part.gen;
                    gen = g;
                    stopping = None;
                    deadline = None;
                    // A new world reports afresh.
                    let _ = std::fs::remove_file(&ctx.progress);
                    progress_seen = None;
                    progress_said = false;
                    let progress_var = (
                        "BFT_PROGRESS_FILE".to_string(),
                        ctx.progress.to_string_lossy().into_owned(),
                    );
                    if ctx.mpi {
                        // This node's ranks, whether mpirun's own or an rsh session
                        // daemon's, write into this agent's file (never passed with -x:
                        // each node's is its agent's).
                        ctx.cfg.extra = vec![progress_var.clone()];
                        if let Some(mpi) = m.get("mpi") {
                            let launch = MpiLaunch::from_msg(mpi)
                                .map_err(|e| (2, format!("a bad MPI world: {e}")))?;
                            let mut cfg = ctx.cfg.clone();
                            cfg.argv = launch.argv(&ctx.exe, &ctx.cfg.argv, part.batch.is_some());
                            cfg.extra = vec![
                                ("BFT_GENERATION".into(), g.to_string()),
                                ("BFT_RSH_TOKEN".into(), launch.token.clone()),
                                progress_var,
                            ];
                            cfg.extra.extend(part.batch_env());
                            let wid = format!("{id}.mpirun.g{g}");
                            match spawn_worker(&cfg, &wid, 0, &ev_tx) {
                                Ok(pid) => {
                                    workers.insert(
                                        wid,
                                        WorldWorker {
                                            pid,
                                            gen: g,
                                            local: 0,
                                            signalled: false,
                                            launcher: true,
                                            rsh: None,
                                        },
                                    );
                                }
                                Err(e) => {
                                    say!("bft-run: {e}");
                                    send!(
                                        json!({"t": "wexit", "gen": g, "local": 0, "code": 127, "stderr_tail": e})
                                    );
                                }
                            }
                        }
                        send!(json!({"t": "started", "gen": g}));
                        continue;
                    }
                    for local in 0..ctx.cfg.nproc {
                        ctx.cfg.extra = part.torchrun_env(local);
                        ctx.cfg.extra.push(progress_var.clone());
                        let wid = format!("{id}.{local}.g{g}");
                        match spawn_worker(&ctx.cfg, &wid, local, &ev_tx) {
                            Ok(pid) => {
                                workers.insert(
                                    wid,
                                    WorldWorker {
                                        pid,
                                        gen: g,
                                        local,
                                        signalled: false,
                                        launcher: false,
                                        rsh: None,
                                    },
                                );
                            }
                            Err(e) => {
                                say!("bft-run: {e}");
                                send!(
                                    json!({"t": "wexit", "gen": g, "local": local, "code": 127, "stderr_tail": e})
                                );
                            }
                        }
                    }
                    send!(json!({"t": "started", "gen": g}));
                }
                "stop" => {
                    let g = proto::u64_field(&m, "gen").unwrap_or(0);
                    if g != gen || workers.is_empty() {
                        send!(json!({"t": "stopped", "gen": g}));
                    } else {
                        stopping = Some(g);
                        term(&mut workers, Signal::SIGTERM);
                        deadline = Some(Instant::now() + ctx.leave_timeout);
                    }
                }
                "rsh" if ctx.mpi => {
                    let rid = proto::u64_field(&m, "id").unwrap_or(0);
                    let rg = proto::u64_field(&m, "gen").unwrap_or(0);
                    let cmd = proto::str_field(&m, "cmd").unwrap_or("");
                    // Only for the world this node runs now, while it is not stopping.
                    if rg != gen || stopping.is_some() || leaving || ending || cmd.is_empty() {
                        send!(json!({"t": "rsh_exit", "id": rid, "code": 255}));
                        continue;
                    }
                    let wid = format!("{id}.rsh{rid}.g{rg}");
                    match spawn_rsh(&ctx.cfg, cmd, rid, &wid, &ev_tx) {
                        Ok(pid) => {
                            workers.insert(
                                wid,
                                WorldWorker {
                                    pid,
                                    gen: rg,
                                    local: 0,
                                    signalled: false,
                                    launcher: false,
                                    rsh: Some(rid),
                                },
                            );
                        }
                        Err(e) => {
                            say!("bft-run: {e}");
                            send!(json!({"t": "rsh_exit", "id": rid, "code": 127}));
                        }
                    }
                }
                "rsh_kill" => {
                    let rid = proto::u64_field(&m, "id").unwrap_or(0);
                    for w in workers.values_mut().filter(|w| w.rsh == Some(rid)) {
                        w.signalled = true;
                        kill(w.pid, Signal::SIGKILL);
                    }
                }
                "end" => {
                    ending = true;
                    if !workers.is_empty() {
                        term(&mut workers, Signal::SIGTERM);
                        deadline = Some(Instant::now() + ctx.leave_timeout);
                    }
                }
                "error" => say!(
                    "bft-run: the coordinator says: {}",
                    brief(m.get("msg").and_then(Value::as_str).unwrap_or("?"))
                ),
                _ => {}
            },
            Ev::Coord(r) => {
                if !ending && !lost {
                    lost = true;
                    let why = match r {
                        Err(e) => format!(" ({e})"),
                        _ => String::new(),
                    };
                    say!(
                        "bft-run: lost the coordinator at {}{why}; stopping {} worker(s)",
                        ctx.coord,
                        workers.len()
                    );
                    term(&mut workers, Signal::SIGKILL);
                }
            }
            Ev::Exited(wid, code, tail) => {
                let Some(w) = workers.remove(&wid) else {
                    continue;
                };
                if let Some(rid) = w.rsh {
                    send!(json!({"t": "rsh_exit", "id": rid, "code": code}));
                } else {
                    send!(json!({
                        "t": "wexit", "gen": w.gen, "local": w.local, "code": code,
                        "stopped": w.signalled, "stderr_tail": tail,
                    }));
                }
                if stopping == Some(w.gen) && !workers.values().any(|x| x.gen == w.gen) {
                    stopping = None;
                    deadline = None;
                    send!(json!({"t": "stopped", "gen": w.gen}));
                }
            }
            Ev::Term => {
                if !leaving && !ending {
                    leaving = true;
                    send!(json!({"t": "leaving"}));
                    term(&mut workers, Signal::SIGTERM);
                    deadline = Some(Instant::now() + ctx.leave_timeout);
                }
            }
            Ev::Worker(..) | Ev::WorkerConn(..) | Ev::WorkerGone(..) => {}
            Ev::RshOut(rid, err, line) => {
                send!(json!({"t": "rsh_out", "id": rid, "err": err, "line": line}));
            }
        }
    }
    if lost {
        return Err((1, format!("lost the coordinator at {}", ctx.coord)));
    }
    Ok(0)
}

/// Signals `pid` alone (not its process group).
fn kill_one(pid: i32, sig: Signal) {
    if pid > 0 {
        // A child that already exited (ESRCH) needs nothing more.
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// An MPI world's launch, as the coordinator's `world` message gives it to the
/// first part's agent: mpirun's --host list and -np, and the world's rsh token.
#[derive(Debug, Clone, PartialEq)]
pub struct MpiLaunch {
    pub hosts: String,
    pub np: u64,
    pub token: String,
}

impl MpiLaunch {
    pub fn from_msg(m: &Value) -> Result<MpiLaunch, String> {
        let hosts = proto::str_field(m, "hosts")?;
        let np = proto::u64_field(m, "np")?;
        let token = proto::id_field(m, "token")?;
        let mut total = 0u64;
        for h in hosts.split(',') {
            let (name, slots) = h
                .rsplit_once(':')
                .ok_or_else(|| format!("{:?} is not host:slots", brief(h)))?;
            let slots: u64 = slots
                .parse()
                .ok()
                .filter(|n| *n > 0 && *n <= 1 << 20)
                .ok_or_else(|| format!("{:?} is not host:slots", brief(h)))?;
            if !proto::is_node_name(name) {
                return Err(format!("{:?} is not a host name", brief(name)));
            }
            total += slots;
        }
        if np == 0 || np != total {
            return Err(format!("-np {np} is not the hosts' {total} slots"));
        }
        Ok(MpiLaunch {
            hosts: hosts.to_string(),
            np,
            token: token.to_string(),
        })
    }

    /// mpirun's command line: remote daemons through `EXE rsh` (no tree spawn, kept
    /// attached so that their agents see them end), then the program. (The stop's
    /// grace is the agent's: SIGUSR1 to mpirun, SIGKILL after it.) `batch`: the world
    /// carries a decided global batch ([`BATCH_VAR`]), which the ranks get too.
    pub fn argv(&self, exe: &str, cmd: &[String], batch: bool) -> Vec<String> {
        let mut v: Vec<String> = ["mpirun", "--host", &self.hosts, "-np"]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.push(self.np.to_string());
        // Remote ranks get their daemon's environment (the job's, from the agent
        // there): the world's generation must be passed.
        v.extend(["-x".to_string(), "BFT_GENERATION".to_string()]);
        if batch {
            v.extend(["-x".to_string(), BATCH_VAR.to_string()]);
        }
        let mca = [
            // Inside a Slurm job, Open MPI's ras/slurm takes the job's own allocation
            // as the only hosts and refuses satellites' nodes ("not enough slots").
            ("ras", "^slurm".to_string()),
            ("plm", "rsh".to_string()),
            ("plm_rsh_agent", format!("{exe} rsh")),
            ("plm_rsh_no_tree_spawn", "1".into()),
            ("orte_leave_session_attached", "1".into()),
        ];
        for (k, x) in mca {
            v.extend(["--mca".to_string(), k.to_string(), x]);
        }
        v.extend(cmd.iter().cloned());
        v
    }
}

/// An rsh command line with its last command run by `exec` (`A=1; export A; orted
/// ...` -> `A=1; export A; exec orted ...`): the daemon then is the process the agent
/// started, which dies with the agent (PDEATHSIG) and is the one it signals. Left as
/// it is where the last command is not a plain one (pipes, `&&`, `||`, background).
pub fn exec_last(line: &str) -> String {
    // The last `;` outside quotes (orted's arguments quote URIs holding `;`).
    // And whether an unquoted special character (a pipe, `&&`, a subshell, a
    // redirection, a background job) comes after it.
    let (mut quote, mut escaped, mut cut) = (None::<char>, false, None);
    let mut special = false;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            _ if escaped => escaped = false,
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            (_, '\\') => escaped = true,
            (Some('"'), '"') => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, ';') => {
                cut = Some(i);
                special = false;
            }
            (None, '&' | '|' | '`' | '\n' | '(' | ')' | '<' | '>' | '$') => special = true,
            (None, _) => {}
        }
    }
    if quote.is_some() {
        return line.to_string();
    }
    let (head, last) = match cut {
        Some(i) => (&line[..=i], &line[i + 1..]),
        None => ("", line),
    };
    // A shell builtin, keyword or bare assignment cannot be exec'ed.
    let first = last.split_whitespace().next().unwrap_or("");
    let builtin = first.contains('=')
        || [
            "exit", "return", "exec", "export", "cd", "set", "unset", "shift", "trap", "wait",
            "eval", "read", "umask", "ulimit", ".", ":", "if", "for", "while", "until", "case",
            "{", "}", "then", "do", "done", "else", "elif", "fi", "esac", "!",
        ]
        .contains(&first);
    let plain = !special && !first.is_empty() && !builtin;
    if !plain {
        return line.to_string();
    }
    format!("{head} exec {}", last.trim_start())
}

/// Starts an rsh session's command (`/bin/sh -c CMD`, as sshd would) with the job's
/// environment; its lines go to the coordinator as `rsh_out`, its exit as `Exited`.
fn spawn_rsh(
    c: &SpawnCfg,
    line: &str,
    rid: u64,
    wid: &str,
    ev: &mpsc::UnboundedSender<Ev>,
) -> Result<i32, String> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(exec_last(line))
        .current_dir(&c.cwd)
        .env_clear()
        .envs(&c.env)
        .envs(c.node_env.iter().map(|(k, v)| (k, v)))
        .env("BFT_NODE_NAME", &c.node)
        .env("BFT_JOB", &c.job)
        // MPI mode: BFT_PROGRESS_FILE, which the daemon's ranks inherit.
        .envs(c.extra.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(new_group_dying_with_us);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start an rsh command in {}: {e}", c.cwd))?;
    let pid = child.id().map_or(-1, |p| p as i32);
    let relay = |r: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>, err: bool| {
        let ev = ev.clone();
        r.map(|r| {
            tokio::spawn(each_line(r, move |l| {
                let _ = ev.send(Ev::RshOut(rid, err, proto::clip(l, 16 << 10)));
            }))
        })
    };
    let out = relay(
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        false,
    );
    let err = relay(
        child
            .stderr
            .take()
            .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        true,
    );
    let ev = ev.clone();
    let wid = wid.to_string();
    tokio::spawn(async move {
        let code = exit_code(&mut child, [out, err]).await;
        let _ = ev.send(Ev::Exited(wid, code, String::new()));
    });
    Ok(pid)
}

/// Signals the process group `pid` leads (made by [`new_group_dying_with_us`]).
fn kill(pid: i32, sig: Signal) {
    if pid > 0 {
        // A group that is already gone (ESRCH) needs nothing more.
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), sig);
    }
}

/// Run in a worker between fork and exec: a process group of its own (signalled whole
/// by [`kill`]), killed with SIGKILL if this agent dies. Both are single system calls,
/// async-signal-safe.
fn new_group_dying_with_us() -> std::io::Result<()> {
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    Ok(())
}

fn tempdir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    for _ in 0..16 {
        let p = base.join(format!("bft-agent-{:016x}", rand::random::<u64>()));
        match std::fs::create_dir(&p) {
            Ok(()) => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free name"))
}

/// Waits for `child` to end and its output `readers` to drain (1 s at the most each):
/// its exit code, or minus the signal that ended it (-9 when it cannot be waited for).
async fn exit_code(
    child: &mut tokio::process::Child,
    readers: [Option<tokio::task::JoinHandle<()>>; 2],
) -> i32 {
    let status = child.wait().await;
    for h in readers.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(1), h).await;
    }
    match status {
        Ok(s) => s.code().unwrap_or_else(|| -s.signal().unwrap_or(9)),
        Err(_) => -9,
    }
}

/// Calls `f` with each line `r` gives (its line end cut, decoded lossily) until its end
/// or an error. Bytes, not text: a line that is not UTF-8 must not stop the reading (the
/// writer's next write would then fail on a closed pipe).
async fn each_line<R: tokio::io::AsyncRead + Unpin>(r: R, mut f: impl FnMut(&str)) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        f(String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsh_commands_exec_their_last_plain_command() {
        assert_eq!(
            exec_last(" orted -mca ess \"env\""),
            " exec orted -mca ess \"env\""
        );
        assert_eq!(
            exec_last("PATH=/o/bin:$PATH ; export PATH ; /o/bin/orted -mca x \"1\""),
            "PATH=/o/bin:$PATH ; export PATH ; exec /o/bin/orted -mca x \"1\""
        );
        assert_eq!(
            exec_last("orted -mca orte_hnp_uri \"1.0;tcp://10.0.0.1:4\" -x 'a;b' -r \"n@0(2)\""),
            " exec orted -mca orte_hnp_uri \"1.0;tcp://10.0.0.1:4\" -x 'a;b' -r \"n@0(2)\""
        );
        for same in [
            "a | b",
            "a && b",
            "a; b &",
            "exec orted",
            "echo x; exit 3",
            "A=1",
            "cd /; if x; then y; fi",
            "a;",
            "(orted)",
            "a \"b;",
            "a $(b)",
        ] {
            assert_eq!(exec_last(same), same);
        }
    }

    #[test]
    fn an_mpi_launch_is_checked_and_makes_mpiruns_command_line() {
        let m = json!({"hosts": "n1:2,bft-agent-7:1", "np": 3, "token": "ab12"});
        let l = MpiLaunch::from_msg(&m).unwrap();
        let argv = l.argv("/x/bft-run", &["prog".into()], false);
        let s = argv.join(" ");
        assert!(!s.contains(BATCH_VAR), "no decision, nothing to pass: {s}");
        let with = l.argv("/x/bft-run", &["prog".into()], true).join(" ");
        assert!(
            with.contains("-x BFT_GENERATION -x BFT_GLOBAL_BATCH"),
            "remote ranks get the decided batch: {with}"
        );
        assert!(
            s.starts_with("mpirun --host n1:2,bft-agent-7:1 -np 3 -x BFT_GENERATION"),
            "{s}"
        );
        assert!(s.contains("--mca plm_rsh_agent /x/bft-run rsh"), "{s}");
        assert!(s.contains("--mca ras ^slurm"), "{s}");
        assert!(s.contains("--mca orte_leave_session_attached 1"), "{s}");
        assert_eq!(argv.last().unwrap(), "prog");
        for bad in [
            json!({"hosts": "n1:2", "np": 3, "token": "ab"}),
            json!({"hosts": "n1;rm -rf /:1", "np": 1, "token": "ab"}),
            json!({"hosts": "n1:0", "np": 0, "token": "ab"}),
            json!({"hosts": "n1", "np": 1, "token": "ab"}),
            json!({"hosts": "n1:1", "np": 1, "token": "not hex"}),
        ] {
            assert!(MpiLaunch::from_msg(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_world_message_gives_torchruns_environment_per_local_rank() {
        let m = json!({
            "t": "world", "gen": 7, "master_addr": "10.1.2.3", "master_port": 29511,
            "group_rank": 1, "rank_base": 4, "world_size": 12, "nnodes": 3, "restarts": 6,
            "run_id": "4242",
        });
        let p = WorldPart::from_msg(&m).unwrap();
        let env: BTreeMap<String, String> = p.torchrun_env(3).into_iter().collect();
        for (k, v) in [
            ("RANK", "7"),
            ("WORLD_SIZE", "12"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "3"),
            ("ROLE_RANK", "7"),
            ("ROLE_WORLD_SIZE", "12"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29511"),
            ("TORCHELASTIC_RESTART_COUNT", "6"),
            ("TORCHELASTIC_RUN_ID", "4242"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
            ("BFT_GENERATION", "7"),
        ] {
            assert_eq!(env[k], v, "{k}");
        }
        let bad = |k: &str, v: Value| {
            let mut x = m.clone();
            x[k] = v;
            WorldPart::from_msg(&x).unwrap_err()
        };
        assert!(bad("master_addr", json!("h; rm -rf /")).contains("not an address"));
        assert!(bad("master_port", json!(70000)).contains("not a port"));
        assert!(bad("rank_base", json!(12)).contains("outside"));
        assert!(bad("run_id", json!("a b")).contains("run id"));
        assert!(bad("gen", json!(-1)).contains("gen"));
    }

    #[test]
    fn a_world_hands_its_workers_the_decided_batch_and_refuses_a_bad_one() {
        let m = json!({
            "t": "world", "gen": 3, "master_addr": "10.1.2.3", "master_port": 29511,
            "group_rank": 0, "rank_base": 0, "world_size": 2, "nnodes": 1, "restarts": 1,
            "run_id": "42",
        });
        let p = WorldPart::from_msg(&m).unwrap();
        assert_eq!(p.batch, None);
        let env: BTreeMap<String, String> = p.torchrun_env(0).into_iter().collect();
        assert!(
            !env.contains_key(BATCH_VAR),
            "no decision: the script's own"
        );
        let mut with = m.clone();
        with["batch"] = json!(1024);
        let p = WorldPart::from_msg(&with).unwrap();
        assert_eq!(p.batch, Some(1024));
        for local in 0..2 {
            let env: BTreeMap<String, String> = p.torchrun_env(local).into_iter().collect();
            assert_eq!(env[BATCH_VAR], "1024");
        }
        assert_eq!(
            p.batch_env(),
            Some(("BFT_GLOBAL_BATCH".to_string(), "1024".to_string()))
        );
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!("64"),
            json!(bftrainer_core::spec::MAX_BATCH as u64 + 1),
        ] {
            let mut x = m.clone();
            x["batch"] = bad.clone();
            let e = WorldPart::from_msg(&x).unwrap_err();
            assert!(
                e.contains("is not a global batch (1 to 16777216)"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_scripts_progress_file_is_read_as_a_report_of_its_world_only() {
        let d = tempdir().unwrap();
        let p = d.join("progress");
        let read = |text: &str, gen: u64| {
            std::fs::write(&p, text).unwrap();
            read_progress(&p, gen)
        };
        let m = read(
            r#"{"gen": 3, "samples": 4096, "steps": 16, "batch": 256}"#,
            3,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            m,
            json!({"t": "wprogress", "gen": 3, "samples": 4096, "steps": 16, "batch": 256})
        );
        // Steps and batch may be left out; another world's report is not this one's.
        assert_eq!(
            read(r#"{"gen": 3, "samples": 1}"#, 3).unwrap().unwrap()["steps"],
            0
        );
        assert_eq!(read(r#"{"gen": 2, "samples": 1}"#, 3).unwrap(), None);
        for (bad, why) in [
            (
                r#"{"gen": 3, "samples": -1}"#,
                "\"samples\" is not a whole number",
            ),
            (
                r#"{"gen": 3, "samples": 1.5}"#,
                "\"samples\" is not a whole number",
            ),
            (r#"{"gen": 3}"#, "it has no \"samples\""),
            (
                r#"{"gen": 3, "samples": 1, "steps": "x"}"#,
                "\"steps\" is not",
            ),
            ("[1, 2]", "it has no \"gen\""),
            ("gen=3", "not JSON"),
        ] {
            let e = read(bad, 3).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = read(&" ".repeat(5000), 3).unwrap_err();
        assert!(e.contains("over 4 KiB"), "{e}");
        std::fs::remove_file(&p).unwrap();
        assert!(read_progress(&p, 3).unwrap_err().contains("cannot read"));
        // What the script may put there instead of a file: refused at once, never
        // followed nor waited on (a FIFO without a writer would block a plain open).
        let good = d.join("good");
        std::fs::write(&good, r#"{"gen": 3, "samples": 1}"#).unwrap();
        std::os::unix::fs::symlink(&good, &p).unwrap();
        let e = read_progress(&p, 3).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_progress(&p, 3).unwrap_err();
        assert!(e.contains("not a plain file"), "{e}");
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        let e = read_progress(&p, 3).unwrap_err();
        assert!(e.contains("not a plain file"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_interface_of_an_address() {
        assert_eq!(iface_of("127.0.0.1").as_deref(), Some("lo"));
        assert_eq!(iface_of("192.0.2.250"), None);
        assert_eq!(iface_of("not an address"), None);
    }
}
