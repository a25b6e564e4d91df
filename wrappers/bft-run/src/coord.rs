//! The per-job coordinator: authenticates agents, keeps the membership, announces
//! generations, publishes the measured rate, and decides when the job is over.

use crate::membership::{Gen, Membership, Outcome};
use crate::munge::{Decoded, Munge};
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

/// The job's rate in samples/s: from rank 0's cumulative `progress` reports within one
/// generation (an average since its first report there, once 2 s apart); 0 until then.
#[derive(Debug, Default)]
struct RateMeter {
    gen: u64,
    first: Option<(f64, u64)>,
    rate: f64,
}

impl RateMeter {
    /// A new generation: a new size, nothing measured at it yet.
    fn reset(&mut self, gen: u64) {
        *self = RateMeter {
            gen,
            ..Default::default()
        };
    }

    /// A report at time `now` (seconds); the new rate when there is one to publish.
    fn report(&mut self, gen: u64, samples: u64, now: f64) -> Option<f64> {
        if gen != self.gen {
            return None; // late, from a generation already replaced
        }
        let Some((t0, s0)) = self.first else {
            self.first = Some((now, samples));
            return None;
        };
        let dt = now - t0;
        if dt < 2.0 || samples < s0 {
            return None;
        }
        self.rate = (samples - s0) as f64 / dt;
        Some(self.rate)
    }
}

struct Shared {
    m: Membership,
    agents: HashMap<u64, AgentRec>,
    next_agent: u64,
    progress: RateMeter,
    nodes: u32,
    /// The members of the last generation announced (for the log's +joined -left).
    last_members: Vec<String>,
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
                agents: HashMap::new(),
                next_agent: 1,
                progress: RateMeter::default(),
                nodes: 0,
                last_members: Vec::new(),
                start: Instant::now(),
            }),
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
                    say!("bft-run: {} {reason}", ts());
                }
                self.finish(s, code, reason);
            }
        }
    }

    fn announce(&self, s: &mut Shared, g: Gen) {
        let nodes: BTreeSet<Option<u64>> = g.members.iter().map(|w| agent_of(w)).collect();
        s.nodes = nodes.len() as u32;
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
        let line = proto::line(&json!({
            "t": "gen", "gen": g.gen, "members": g.members, "store": g.store,
        }));
        for a in s.agents.values() {
            let _ = a.tx.send(line.clone());
        }
        self.publish(s);
    }

    fn progress(&self, s: &mut Shared, gen: u64, samples: u64) {
        let now = s.start.elapsed().as_secs_f64();
        if s.progress.report(gen, samples, now).is_some() {
            self.publish(s);
        }
    }

    /// Called twice a second: members silent after a failure are dropped; no worker
    /// ready in time ends the job.
    pub fn tick(&self) {
        let mut s = self.shared.lock().unwrap();
        let now = s.start.elapsed().as_secs_f64();
        let (silent, out) = s.m.tick(now);
        if !silent.is_empty() {
            say!(
                "bft-run: {} dropping {} (silent {} s after a failure); their agents kill them",
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
                    say!("bft-run: accept failed: {e}");
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
        say!(
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
        check_cred(&d, self.cfg.uid, &self.cfg.job, nonce)?;
        Ok((host, nproc))
    }

    fn agent_msg(&self, id: u64, host: &str, msg: &Value) -> Result<(), String> {
        if proto::verbose() {
            say!("bft-run: {} agent {id} ({host}): {msg}", ts());
        }
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
                    say!(
                        "bft-run: {reason}; last lines of its stderr:\n{}",
                        if tail.is_empty() { "(none)" } else { tail }
                    );
                    let _ = code;
                } else if code < 0 && self.end_tx.borrow().is_none() {
                    say!(
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
                say!("bft-run: {} agent {id} ({host}) leaves", ts());
                s.m.drop_workers(&gone)
            }
            other => return Err(format!("unknown message type {other:?}")),
        };
        self.apply(&mut s, out);
        Ok(())
    }
}

/// A decoded credential is acceptable when it is the job owner's and was made for
/// this job and this connection's nonce.
fn check_cred(d: &Decoded, uid: u32, job: &str, nonce: &str) -> Result<(), String> {
    if d.uid != uid {
        return Err(format!(
            "refused: a credential of uid {}, this job belongs to uid {uid}",
            d.uid
        ));
    }
    if d.payload != proto::cred_payload(job, nonce) {
        return Err(
            "refused: the credential was made for another job or connection (its payload is not this connection's challenge)"
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
    fn the_rate_is_measured_within_the_current_generation() {
        let mut r = RateMeter::default();
        r.reset(3);
        assert_eq!(r.report(3, 1000, 10.0), None);
        assert_eq!(r.report(3, 1100, 11.0), None, "under 2 s");
        assert_eq!(
            r.report(2, 9999, 12.5),
            None,
            "a late report of generation 2"
        );
        assert_eq!(r.report(3, 1500, 14.0), Some(125.0));
        r.reset(4);
        assert_eq!(r.rate, 0.0, "a new size is not measured yet");
        assert_eq!(r.report(4, 1600, 15.0), None);
        assert_eq!(r.report(4, 1500, 18.0), None, "counts never go back");
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
            store: "h:1".into(),
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
    fn credentials_must_be_the_owners_and_for_this_connection() {
        let d = |uid, payload: &str| Decoded {
            uid,
            payload: payload.into(),
        };
        let good = proto::cred_payload("42", "ab12");
        assert_eq!(check_cred(&d(1000, &good), 1000, "42", "ab12"), Ok(()));
        let e = check_cred(&d(0, &good), 1000, "42", "ab12").unwrap_err();
        assert!(
            e.contains("credential of uid 0, this job belongs to uid 1000"),
            "{e}"
        );
        for other in [
            proto::cred_payload("42", "ffff"),
            proto::cred_payload("43", "ab12"),
            format!("{good} "),
            String::new(),
        ] {
            let e = check_cred(&d(1000, &other), 1000, "42", "ab12").unwrap_err();
            assert!(e.contains("another job or connection"), "{other:?}: {e}");
        }
    }
}
