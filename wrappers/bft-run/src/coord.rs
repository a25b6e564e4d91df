//! The per-job coordinator: authenticates agents, keeps the membership, announces
//! generations, publishes the measured rate, and decides when the job is over.

use crate::membership::{Gen, Membership, Outcome};
use crate::munge::Munge;
use crate::proto::{self, PROTO};
use bftrainer_core::runtime::RunComment;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// The Slurm job id, or "local".
    pub job: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    /// Workers per node (0: each agent decides: its GPUs, else 1).
    pub nproc: usize,
    pub min_workers: usize,
    pub broken_timeout: f64,
    pub munge: Munge,
    /// The job owner's uid: every agent must prove it.
    pub uid: u32,
    /// Where the coordinator can be reached (published in the Comment).
    pub advertised: String,
    /// Give up if no worker is ready after this long.
    pub ready_timeout: Duration,
}

struct AgentRec {
    tx: mpsc::UnboundedSender<String>,
    workers: BTreeSet<String>,
}

struct Progress {
    gen: u64,
    first: Option<(Instant, u64)>,
    rate: f64,
}

struct Shared {
    m: Membership,
    agents: HashMap<u64, AgentRec>,
    next_agent: u64,
    progress: Progress,
    nodes: u32,
    start: Instant,
}

/// What the coordinator publishes; the caller writes it to the job's Comment.
pub type CommentTx = std::sync::mpsc::Sender<RunComment>;

pub struct Coordinator {
    cfg: CoordConfig,
    shared: Mutex<Shared>,
    end_tx: watch::Sender<Option<(i32, String)>>,
    comment: Option<Mutex<CommentTx>>,
}

fn ts() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", now.as_secs(), now.subsec_millis())
}

impl Coordinator {
    pub fn new(cfg: CoordConfig, comment: Option<CommentTx>) -> Arc<Coordinator> {
        let (end_tx, _) = watch::channel(None);
        let m = Membership::new(cfg.min_workers, cfg.broken_timeout);
        Arc::new(Coordinator {
            shared: Mutex::new(Shared {
                m,
                agents: HashMap::new(),
                next_agent: 1,
                progress: Progress {
                    gen: 0,
                    first: None,
                    rate: 0.0,
                },
                nodes: 0,
                start: Instant::now(),
            }),
            cfg,
            end_tx,
            comment: comment.map(Mutex::new),
        })
    }

    pub fn ended(&self) -> watch::Receiver<Option<(i32, String)>> {
        self.end_tx.subscribe()
    }

    /// Ends the job from outside (the core step died, a signal): tells the agents.
    pub fn end(&self, code: i32, reason: String) {
        let mut s = self.shared.lock().unwrap();
        s.m.end();
        self.finish(&mut s, code, reason);
    }

    fn finish(&self, s: &mut Shared, code: i32, reason: String) {
        if self.end_tx.borrow().is_some() {
            return;
        }
        let line = proto::line(&json!({"t": "end", "code": code, "reason": reason}));
        for a in s.agents.values() {
            let _ = a.tx.send(line.clone());
        }
        self.end_tx.send_replace(Some((code, reason)));
    }

    fn publish(&self, s: &Shared) {
        if let Some(c) = &self.comment {
            let _ = c.lock().unwrap().send(RunComment {
                coord: self.cfg.advertised.clone(),
                gen: s.m.gen(),
                nodes: s.nodes,
                rate: s.progress.rate,
            });
        }
    }

    fn apply(&self, s: &mut Shared, out: Outcome) {
        match out {
            Outcome::Nothing => {}
            Outcome::Announce(g) => self.announce(s, g),
            Outcome::End { code, reason } => {
                if code == 0 {
                    eprintln!("bft-run: {} {reason}", ts());
                }
                self.finish(s, code, reason);
            }
        }
    }

    fn announce(&self, s: &mut Shared, g: Gen) {
        let owner = |w: &str| w.split('.').next().unwrap_or("").to_string();
        let nodes: BTreeSet<String> = g.members.iter().map(|w| owner(w)).collect();
        s.nodes = nodes.len() as u32;
        eprintln!(
            "bft-run: {} generation {}: {} workers on {} nodes [{}]",
            ts(),
            g.gen,
            g.members.len(),
            s.nodes,
            g.members.join(" ")
        );
        let line = proto::line(&json!({
            "t": "gen", "gen": g.gen, "members": g.members, "store": g.store,
        }));
        for a in s.agents.values() {
            let _ = a.tx.send(line.clone());
        }
        self.publish(s);
    }

    fn progress(&self, s: &mut Shared, gen: u64, samples: u64) {
        let now = Instant::now();
        if s.progress.gen != gen {
            s.progress.gen = gen;
            s.progress.first = None;
        }
        match s.progress.first {
            None => s.progress.first = Some((now, samples)),
            Some((t0, s0)) => {
                let dt = now.duration_since(t0).as_secs_f64();
                if dt >= 2.0 && samples >= s0 {
                    s.progress.rate = (samples - s0) as f64 / dt;
                    self.publish(s);
                }
            }
        }
    }

    /// Called twice a second: members silent after a failure are dropped; no worker
    /// ready in time ends the job.
    pub fn tick(&self) {
        let mut s = self.shared.lock().unwrap();
        let now = s.start.elapsed().as_secs_f64();
        let (silent, out) = s.m.tick(now);
        if !silent.is_empty() {
            eprintln!(
                "bft-run: {} dropping {} (silent {} s after a failure)",
                ts(),
                silent.join(" "),
                self.cfg.broken_timeout
            );
        }
        self.apply(&mut s, out);
        if s.m.gen() == 0 && s.start.elapsed() > self.cfg.ready_timeout {
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
                Ok((sock, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.connection(sock).await });
                }
                Err(e) => {
                    eprintln!("bft-run: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, sock: TcpStream) {
        let peer = sock
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let (rd, mut wr) = sock.into_split();
        let mut rd = BufReader::new(rd);
        let nonce = format!("{:032x}", rand::random::<u128>());
        let challenge =
            json!({"t": "challenge", "proto": PROTO, "nonce": nonce, "job": self.cfg.job});
        if wr
            .write_all(proto::line(&challenge).as_bytes())
            .await
            .is_err()
        {
            return;
        }
        let hello =
            match tokio::time::timeout(Duration::from_secs(10), proto::read_msg(&mut rd)).await {
                Ok(Ok(Some(v))) => v,
                Ok(Ok(None)) => return,
                Ok(Err(e)) => return refuse(&mut wr, &peer, &e).await,
                Err(_) => return refuse(&mut wr, &peer, "no hello within 10 s").await,
            };
        let (host, nproc) = match self.check_hello(&hello, &nonce).await {
            Ok(x) => x,
            Err(e) => return refuse(&mut wr, &peer, &e).await,
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let id = {
            let mut s = self.shared.lock().unwrap();
            let id = s.next_agent;
            s.next_agent += 1;
            s.agents.insert(
                id,
                AgentRec {
                    tx: tx.clone(),
                    workers: BTreeSet::new(),
                },
            );
            id
        };
        eprintln!(
            "bft-run: {} agent {id} joined from {host} ({nproc} workers)",
            ts()
        );
        let welcome = json!({
            "t": "welcome", "proto": PROTO, "agent": id, "argv": self.cfg.argv,
            "cwd": self.cfg.cwd, "env": self.cfg.env, "nproc": self.cfg.nproc,
        });
        let _ = tx.send(proto::line(&welcome));
        if let Some((code, reason)) = self.end_tx.borrow().clone() {
            let _ = tx.send(proto::line(
                &json!({"t": "end", "code": code, "reason": reason}),
            ));
        }
        let writer = tokio::spawn(async move {
            while let Some(l) = rx.recv().await {
                if wr.write_all(l.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        loop {
            let msg = match proto::read_msg(&mut rd).await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(proto::error(&e));
                    eprintln!("bft-run: agent {id} ({host}): {e}; dropping it");
                    break;
                }
            };
            if let Err(e) = self.agent_msg(id, &host, &msg) {
                let _ = tx.send(proto::error(&e));
                eprintln!("bft-run: agent {id} ({host}): {e}; dropping it");
                break;
            }
        }
        {
            let mut s = self.shared.lock().unwrap();
            if let Some(a) = s.agents.remove(&id) {
                let gone: Vec<String> = a.workers.into_iter().collect();
                if self.end_tx.borrow().is_none() {
                    eprintln!("bft-run: {} agent {id} ({host}) is gone", ts());
                }
                let out = s.m.drop_workers(&gone);
                self.apply(&mut s, out);
            }
        }
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    }

    async fn check_hello(&self, hello: &Value, nonce: &str) -> Result<(String, u64), String> {
        if proto::t(hello) != "hello" {
            return Err(format!("expected a hello, got {:?}", proto::t(hello)));
        }
        let proto_v = proto::u64_field(hello, "proto")?;
        if proto_v != PROTO {
            return Err(format!(
                "version mismatch: this coordinator (bft-run {}) speaks protocol {PROTO}, the agent {proto_v}; use the same bft-run on every node",
                env!("CARGO_PKG_VERSION")
            ));
        }
        let cred = proto::str_field(hello, "cred")?.to_string();
        let host = proto::str_field(hello, "host")?.to_string();
        let nproc = hello.get("nproc").and_then(Value::as_u64).unwrap_or(0);
        let munge = self.cfg.munge.clone();
        let d = tokio::task::spawn_blocking(move || munge.decode(&cred))
            .await
            .map_err(|e| format!("credential check failed: {e}"))??;
        if d.uid != self.cfg.uid {
            return Err(format!(
                "refused: a credential of uid {}, this job belongs to uid {}",
                d.uid, self.cfg.uid
            ));
        }
        if d.payload != proto::cred_payload(&self.cfg.job, nonce) {
            return Err("refused: the credential was made for another job or connection".into());
        }
        Ok((host, nproc))
    }

    fn agent_msg(&self, id: u64, host: &str, msg: &Value) -> Result<(), String> {
        let mut s = self.shared.lock().unwrap();
        let worker = || -> Result<String, String> {
            let w = proto::str_field(msg, "worker")?;
            if w.split('.').next() != Some(id.to_string().as_str()) {
                return Err(format!("worker id {w:?} is not one of agent {id}'s"));
            }
            Ok(w.to_string())
        };
        let out = match proto::t(msg) {
            "ready" => {
                let w = worker()?;
                let store = proto::str_field(msg, "store")?.to_string();
                if let Some(a) = s.agents.get_mut(&id) {
                    a.workers.insert(w.clone());
                }
                s.m.ready(&w, &store)
            }
            "progress" => {
                worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                let samples = proto::u64_field(msg, "samples")?;
                self.progress(&mut s, gen, samples);
                Outcome::Nothing
            }
            "broken" => {
                let w = worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                let now = s.start.elapsed().as_secs_f64();
                s.m.broken(&w, gen, now)
            }
            "done" => {
                let w = worker()?;
                let gen = proto::u64_field(msg, "gen")?;
                s.m.done(&w, gen)
            }
            "exit" => {
                let w = worker()?;
                let code = msg.get("code").and_then(Value::as_i64).unwrap_or(1) as i32;
                if let Some(a) = s.agents.get_mut(&id) {
                    a.workers.remove(&w);
                }
                let out = s.m.exited(&w, code, &format!("on {host}"));
                if let Outcome::End { code, reason } = &out {
                    let tail = msg.get("stderr_tail").and_then(Value::as_str).unwrap_or("");
                    eprintln!(
                        "bft-run: {reason}; last lines of its stderr:\n{}",
                        if tail.is_empty() { "(none)" } else { tail }
                    );
                    let _ = code;
                } else if code < 0 {
                    eprintln!(
                        "bft-run: {} worker {w} on {host} was killed by signal {}",
                        ts(),
                        -code
                    );
                }
                out
            }
            "leaving" => {
                let gone: Vec<String> = s
                    .agents
                    .get(&id)
                    .map(|a| a.workers.iter().cloned().collect())
                    .unwrap_or_default();
                eprintln!("bft-run: {} agent {id} ({host}) leaves", ts());
                s.m.drop_workers(&gone)
            }
            other => return Err(format!("unknown message type {other:?}")),
        };
        self.apply(&mut s, out);
        Ok(())
    }
}

async fn refuse(wr: &mut tokio::net::tcp::OwnedWriteHalf, peer: &str, why: &str) {
    eprintln!("bft-run: {} refused a connection from {peer}: {why}", ts());
    let _ = wr.write_all(proto::error(why).as_bytes()).await;
    let _ = wr.shutdown().await;
}
