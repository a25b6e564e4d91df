//! The per-node agent: joins the coordinator with a MUNGE credential, starts and
//! watches the node's workers, relays messages, and turns SIGTERM into a graceful leave.

use crate::munge::Munge;
use crate::proto::{self, PROTO};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub coord: String,
    pub node_name: String,
    pub munge: Munge,
    pub slurm_job: Option<String>,
    /// Workers on this node when the coordinator leaves it to the agent.
    pub local_nproc: usize,
    pub max_restarts: u32,
    pub leave_timeout: Duration,
}

const TAIL_LINES: usize = 20;

enum Ev {
    Coord(Result<Option<Value>, String>),
    Worker(String, Value),
    WorkerConn(String, mpsc::UnboundedSender<String>),
    Exited(String, i32, String),
    Term,
}

struct Worker {
    pid: i32,
    /// In a generation the agent forwarded (it holds state; leaves at a boundary).
    member: bool,
}

/// Runs the agent; returns the process exit code.
pub async fn run(o: AgentOptions) -> i32 {
    match agent(o).await {
        Ok(code) => code,
        Err((code, msg)) => {
            eprintln!("bft-run: {msg}");
            code
        }
    }
}

async fn agent(o: AgentOptions) -> Result<i32, (i32, String)> {
    let sock = TcpStream::connect(&o.coord)
        .await
        .map_err(|e| (2, format!("coordinator unreachable at {}: {e}", o.coord)))?;
    let host = sock
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let lost = |e: String| (2, format!("coordinator at {}: {e}", o.coord));
    let ch = tokio::time::timeout(Duration::from_secs(20), proto::read_msg(&mut rd))
        .await
        .map_err(|_| lost("no challenge within 20 s".into()))?
        .map_err(lost)?
        .ok_or_else(|| lost("closed the connection".into()))?;
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
    let nonce = proto::str_field(&ch, "nonce").map_err(lost)?.to_string();
    let munge = o.munge.clone();
    let payload = proto::cred_payload(&job, &nonce);
    let cred = tokio::task::spawn_blocking(move || munge.encode(&payload))
        .await
        .map_err(|e| (2, e.to_string()))?
        .map_err(|e| (2, e))?;
    let hello = json!({
        "t": "hello", "proto": PROTO, "cred": cred, "host": host,
        "node": o.node_name, "slurm_job": o.slurm_job, "nproc": o.local_nproc,
    });
    wr.write_all(proto::line(&hello).as_bytes())
        .await
        .map_err(|e| lost(e.to_string()))?;
    let welcome = tokio::time::timeout(Duration::from_secs(60), proto::read_msg(&mut rd))
        .await
        .map_err(|_| lost("no answer to hello within 60 s".into()))?
        .map_err(lost)?
        .ok_or_else(|| lost("closed the connection".into()))?;
    if proto::t(&welcome) == "error" {
        let why = welcome.get("msg").and_then(Value::as_str).unwrap_or("?");
        return Err((
            2,
            format!("the coordinator at {} refused this agent: {why}", o.coord),
        ));
    }
    let agent_id = proto::u64_field(&welcome, "agent").map_err(lost)?;
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
    let live: Arc<Mutex<HashMap<String, ()>>> = Arc::new(Mutex::new(HashMap::new()));
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
        sock: sock_path.to_string_lossy().into_owned(),
        host: host.clone(),
        node: o.node_name.clone(),
        nproc,
    };
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut conns: HashMap<String, mpsc::UnboundedSender<String>> = HashMap::new();
    let mut next_local = 0usize;
    for _ in 0..nproc {
        let id = format!("{agent_id}.{next_local}");
        let pid = spawn_worker(&spawn_cfg, &id, next_local, &ev_tx).map_err(|e| (1, e))?;
        live.lock().unwrap().insert(id.clone(), ());
        workers.insert(id, Worker { pid, member: false });
        next_local += 1;
    }
    let mut restarts = 0u32;
    let mut last_gen: Option<String> = None;
    let mut ending = false;
    let mut leaving = false;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut coord_open = true;

    loop {
        if (ending || leaving || !coord_open) && workers.is_empty() {
            break;
        }
        let ev = match deadline {
            Some(d) => match tokio::time::timeout_at(d, ev_rx.recv()).await {
                Ok(e) => e,
                Err(_) => {
                    for (id, w) in &workers {
                        eprintln!("bft-run: worker {id} did not leave in time; killing it");
                        kill(w.pid, libc::SIGKILL);
                    }
                    deadline = None;
                    continue;
                }
            },
            None => ev_rx.recv().await,
        };
        let Some(ev) = ev else { break };
        match ev {
            Ev::Coord(Ok(Some(m))) => match proto::t(&m) {
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
                    last_gen = Some(line);
                }
                "end" => {
                    ending = true;
                    let line = proto::line(&m);
                    for c in conns.values() {
                        let _ = c.send(line.clone());
                    }
                    // Workers exit on their own at `end`; the stragglers are killed.
                    deadline.get_or_insert(tokio::time::Instant::now() + Duration::from_secs(5));
                }
                "error" => eprintln!(
                    "bft-run: the coordinator says: {}",
                    m.get("msg").and_then(Value::as_str).unwrap_or("?")
                ),
                _ => {}
            },
            Ev::Coord(Ok(None)) | Ev::Coord(Err(_)) => {
                coord_open = false;
                if !ending {
                    if !workers.is_empty() {
                        eprintln!(
                            "bft-run: lost the coordinator at {}; stopping the workers",
                            o.coord
                        );
                    }
                    for w in workers.values() {
                        kill(w.pid, libc::SIGKILL);
                    }
                    if !workers.is_empty() {
                        ending = true;
                        deadline = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                        // Exit 1 once they are reaped.
                        restarts = u32::MAX;
                    }
                }
            }
            Ev::WorkerConn(id, tx) => {
                if let Some(g) = &last_gen {
                    let _ = tx.send(g.clone());
                }
                conns.insert(id, tx);
            }
            Ev::Worker(id, m) => {
                if matches!(proto::t(&m), "ready" | "progress" | "broken" | "done") {
                    let mut m = m;
                    m["worker"] = Value::String(id);
                    let _ = wr.write_all(proto::line(&m).as_bytes()).await;
                }
            }
            Ev::Exited(id, code, tail) => {
                conns.remove(&id);
                live.lock().unwrap().remove(&id);
                workers.remove(&id);
                let msg = json!({"t": "exit", "worker": id, "code": code, "stderr_tail": tail});
                let _ = wr.write_all(proto::line(&msg).as_bytes()).await;
                let killed = code < 0;
                if killed && !ending && !leaving && coord_open && restarts < o.max_restarts {
                    restarts += 1;
                    let nid = format!("{agent_id}.{next_local}");
                    eprintln!(
                        "bft-run: worker {id} was killed by signal {}; starting {nid} in its place ({restarts} of {} restarts)",
                        -code,
                        o.max_restarts
                    );
                    match spawn_worker(&spawn_cfg, &nid, next_local, &ev_tx) {
                        Ok(pid) => {
                            live.lock().unwrap().insert(nid.clone(), ());
                            workers.insert(nid, Worker { pid, member: false });
                        }
                        Err(e) => eprintln!("bft-run: {e}"),
                    }
                    next_local += 1;
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
                        kill(w.pid, if w.member { libc::SIGTERM } else { libc::SIGKILL });
                    }
                    deadline = Some(tokio::time::Instant::now() + o.leave_timeout);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(if restarts == u32::MAX { 1 } else { 0 })
}

struct SpawnCfg {
    argv: Vec<String>,
    cwd: String,
    env: BTreeMap<String, String>,
    sock: String,
    host: String,
    node: String,
    nproc: usize,
}

fn spawn_worker(
    c: &SpawnCfg,
    id: &str,
    local: usize,
    ev: &mpsc::UnboundedSender<Ev>,
) -> Result<i32, String> {
    let mut cmd = tokio::process::Command::new(&c.argv[0]);
    cmd.args(&c.argv[1..])
        .current_dir(&c.cwd)
        .env_clear()
        .envs(&c.env)
        .env("BFT_AGENT_SOCK", &c.sock)
        .env("BFT_WORKER_ID", id)
        .env("BFT_LOCAL_RANK", local.to_string())
        .env("BFT_NODE_ADDR", &c.host)
        .env("BFT_NODE_NAME", &c.node)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the worker {:?} in {}: {e}", c.argv[0], c.cwd))?;
    let pid = child.id().map_or(-1, |p| p as i32);
    let tail: Arc<Mutex<VecDeque<String>>> = Arc::new(Mutex::new(VecDeque::new()));
    let out = child.stdout.take().map(|o| {
        let id = id.to_string();
        tokio::spawn(async move {
            let mut lines = BufReader::new(o).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                println!("[{id}] {l}");
            }
        })
    });
    let err = child.stderr.take().map(|e| {
        let id = id.to_string();
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(e).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("[{id}] {l}");
                let mut t = tail.lock().unwrap();
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(l);
            }
        })
    });
    let ev = ev.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        let status = child.wait().await;
        for h in [out, err].into_iter().flatten() {
            let _ = tokio::time::timeout(Duration::from_secs(1), h).await;
        }
        let code = match status {
            Ok(s) => s.code().unwrap_or_else(|| -s.signal().unwrap_or(9)),
            Err(_) => -9,
        };
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

async fn worker_conn(
    c: UnixStream,
    ev: mpsc::UnboundedSender<Ev>,
    live: Arc<Mutex<HashMap<String, ()>>>,
) {
    let (rd, mut wr) = c.into_split();
    let mut rd = BufReader::new(rd);
    let id = match proto::read_msg(&mut rd).await {
        Ok(Some(m)) if proto::t(&m) == "hello" => match m.get("worker").and_then(Value::as_str) {
            Some(w) if live.lock().unwrap().contains_key(w) => w.to_string(),
            other => {
                let _ = wr
                    .write_all(
                        proto::error(&format!("worker {other:?} was not started by this agent"))
                            .as_bytes(),
                    )
                    .await;
                return;
            }
        },
        Ok(Some(_)) => {
            let _ = wr
                .write_all(proto::error("expected hello first").as_bytes())
                .await;
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
                eprintln!("bft-run: worker {id}: {e}");
                return;
            }
        }
    }
}

fn kill(pid: i32, sig: i32) {
    if pid > 0 {
        // SAFETY: signalling a process group we created (setpgid in the child).
        unsafe {
            libc::kill(-pid, sig);
        }
    }
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
