//! bftrainerd's control socket: one JSON request per connection, one JSON answer, over
//! a Unix socket whose peer credentials (SO_PEERCRED) decide what the caller sees.
//! Root and SlurmUser see everything and may pause, drain and resume lending; any other
//! user sees only their own jobs, and no other user's job id anywhere (a node lent to
//! someone else shows as lent, without its holder). Answers come from the last
//! published snapshot, so a slow cycle or an unreachable slurmctld never blocks
//! `bftrainer status`.
//!
//! The query endpoint (`[daemon] query_listen`, TCP) serves users on login nodes: the
//! one line a client sends is a MUNGE credential whose payload is the request
//! (`bftrainer-query:v1 {"v":1,"op":"jobs"}`), so the op is signed with the uid and a
//! captured credential is good for nothing else; munged refuses it a second time and
//! past its TTL. The uid comes from the credential only, and the answer is the one the
//! socket gives a user of that uid (root and SlurmUser included: the endpoint is
//! read-only and never shows more than the caller's own jobs); pause, drain and resume
//! are refused. Both doors share one dispatch ([`dispatch`]).
//!
//! Robustness: a request is at most `MAX_REQUEST` bytes and must arrive within
//! `IO_TIMEOUT`; at most `MAX_CLIENTS` connections are served at once, of which
//! `ADMIN_RESERVED` only to root and SlurmUser (so no user can lock `pause` out), and
//! at most `PER_UID` to one other user (so no user can lock the others out); a
//! connection over a limit gets an answer saying which and is closed; garbage gets an
//! error answer. The query endpoint has its own slots (its users never take the
//! socket's): `MAX_CLIENTS - ADMIN_RESERVED` connections, `PER_PEER` from one address
//! until the credential is checked and `PER_UID` per uid after, `MAX_DECODES`
//! credential checks at once, each off the async threads. None of it stops the daemon.

use super::view::{JobView, NodeView, Snapshot};
use bftrainer_core::engine::Lending;
use bftrainer_slurm::munge::{Decoded, Munge};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

/// Version of the request/answer format. A request of another version is refused with
/// a message naming both.
pub const PROTOCOL: u32 = 1;
/// Largest request accepted, bytes (a request is a few dozen).
pub const MAX_REQUEST: usize = 64 * 1024;
/// Time a client has to send its request, and to take its answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once, all users together.
pub const MAX_CLIENTS: usize = 256;
/// Of `MAX_CLIENTS`, the connections only root and SlurmUser may use: users other than
/// those hold at most `MAX_CLIENTS - ADMIN_RESERVED` together.
pub const ADMIN_RESERVED: usize = 32;
/// Connections one user other than root and SlurmUser may hold at once (a `bftrainer`
/// command holds one for a few milliseconds).
pub const PER_UID: usize = 16;
/// Refused connections answered at once; past this, more are closed unanswered.
const MAX_REFUSALS: usize = 64;
/// Time a refused client has to send its request before it hears why it is refused
/// (read first, so that the answer is not lost to a connection reset).
const REFUSAL_READ: Duration = Duration::from_millis(500);
/// Default socket name inside `[daemon] state_dir`.
pub const SOCKET_NAME: &str = "bftrainerd.sock";
/// Connections one address may hold on the query endpoint before its credential is
/// checked (a login node's users share its address: a quarter of the slots).
pub const PER_PEER: usize = (MAX_CLIENTS - ADMIN_RESERVED) / 4;
/// Credential checks (`unmunge` processes) the query endpoint runs at once.
pub const MAX_DECODES: usize = 8;
/// What a query credential's payload starts with; the request's JSON line follows.
/// A credential made for anything else (bft-run's, Slurm's own RPCs) is refused.
pub const QUERY_PAYLOAD: &str = "bftrainer-query:v1 ";
/// The uid a query credential is made for (`munge -u`): bftrainerd runs as root, and
/// no user's process can decode what a user sends it. (slurmctld could, with
/// SlurmUser=root; what keeps it from taking one as an RPC's credential is Slurm's
/// check that a credential carries the hash of its message.)
pub const QUERY_DECODER_UID: u32 = 0;
/// A client's first line: it asks the server to prove it is bftrainerd (root) before
/// it sends its own credential; a random nonce (hex) follows.
pub const HELLO: &str = "bftrainer-hello:v2 ";
/// What the server's proof (a MUNGE credential made by root, for anyone to decode)
/// carries: the client's nonce and the address the client reached, so that a proof
/// obtained from the genuine daemon elsewhere cannot be relayed from another port.
pub const PROOF_PAYLOAD: &str = "bftrainer-server:v2 ";
/// Hex digits of a client's nonce (128 bits).
const NONCE_HEX: usize = 32;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// The daemon's state: version, uptime, latencies, node and job counts, errors.
    Status,
    /// Elastic jobs, optionally of one user (name or uid) or with these ids.
    Jobs {
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        job_ids: Vec<u32>,
        /// Include each job's size history.
        #[serde(default)]
        history: bool,
    },
    /// Nodes of the elastic partitions.
    Nodes,
    /// Stop lending: no admissions, no growth (admin).
    Pause,
    /// Stop lending and shrink every elastic job to its core nodes (admin).
    Drain,
    /// Lend again (admin).
    Resume,
}

impl Op {
    /// The op's name on the wire: `status`, `pause`...
    pub fn name(&self) -> &'static str {
        match self {
            Op::Status => "status",
            Op::Jobs { .. } => "jobs",
            Op::Nodes => "nodes",
            Op::Pause => "pause",
            Op::Drain => "drain",
            Op::Resume => "resume",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    #[serde(flatten)]
    pub op: Op,
}

/// The answer: `ok` with `data`, or an `error` message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub v: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    fn ok(data: serde_json::Value) -> Response {
        Response {
            v: PROTOCOL,
            ok: true,
            data: Some(data),
            error: None,
        }
    }
    fn err(msg: impl Into<String>) -> Response {
        Response {
            v: PROTOCOL,
            ok: false,
            data: None,
            error: Some(msg.into()),
        }
    }
}

/// An admin verb for the main loop, which applies it between cycles and answers.
#[derive(Debug)]
pub struct AdminCmd {
    pub mode: Lending,
    pub by_uid: u32,
    pub reply: oneshot::Sender<Result<String, String>>,
}

/// What the server needs from the daemon.
#[derive(Debug, Clone)]
pub struct Shared {
    pub snapshot: watch::Receiver<Arc<Snapshot>>,
    pub admin: mpsc::Sender<AdminCmd>,
    /// Uids allowed everything: root and SlurmUser.
    pub admins: Vec<u32>,
}

/// The socket path: `[daemon] socket`, else `state_dir/bftrainerd.sock`.
pub fn default_socket(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_NAME)
}

/// Binds the socket at `path`, replacing a stale file (the daemon's lock guarantees no
/// other bftrainerd serves it), world-connectable: access is decided per request.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            anyhow::bail!(
                "control socket {}: a file that is not a socket is in the way; remove it or set [daemon] socket",
                path.display()
            );
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("control socket {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// How many connections the server takes at once (tests use small ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub admin_reserved: usize,
    pub per_uid: usize,
    /// Query endpoint: connections of one address whose credential is not checked yet.
    pub per_peer: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            total: MAX_CLIENTS,
            admin_reserved: ADMIN_RESERVED,
            per_uid: PER_UID,
            per_peer: PER_PEER,
        }
    }
}

/// What connections are counted by: a uid (socket; query endpoint once the
/// credential is checked) or an address (query endpoint before).
pub trait SlotKey: Eq + Hash + Copy + std::fmt::Debug + Send + Sync + 'static {
    /// `uid 1001`, `address 10.0.0.5`.
    fn who(&self) -> String;
    /// Whose share the cap is: `one user`.
    const ONE: &'static str;
}

impl SlotKey for u32 {
    fn who(&self) -> String {
        format!("uid {self}")
    }
    const ONE: &'static str = "one user";
}

impl SlotKey for IpAddr {
    fn who(&self) -> String {
        format!("address {self}")
    }
    const ONE: &'static str = "one address";
}

#[derive(Debug)]
struct Counts<K> {
    total: usize,
    /// Held by users other than root and SlurmUser.
    users: usize,
    by_uid: HashMap<K, usize>,
}

/// The connections in progress, by uid (or address): who may open another.
#[derive(Debug)]
pub struct Slots<K: SlotKey = u32> {
    limits: Limits,
    /// The cap per key: `per_uid`, or `per_peer` for addresses.
    per_key: usize,
    counts: Mutex<Counts<K>>,
}

/// One connection's place; given back when dropped.
#[derive(Debug)]
pub struct Slot<K: SlotKey = u32> {
    slots: Arc<Slots<K>>,
    uid: K,
    admin: bool,
}

impl<K: SlotKey> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut c = self.slots.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if !self.admin {
            c.users -= 1;
        }
        if let Some(n) = c.by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.by_uid.remove(&self.uid);
            }
        }
    }
}

impl Slots<u32> {
    /// Slots by uid, `limits.per_uid` each.
    pub fn new(limits: Limits) -> Arc<Slots<u32>> {
        Slots::with_cap(limits, limits.per_uid)
    }
}

impl Slots<IpAddr> {
    /// Slots by address, `limits.per_peer` each.
    pub fn by_peer(limits: Limits) -> Arc<Slots<IpAddr>> {
        Slots::with_cap(limits, limits.per_peer)
    }
}

impl<K: SlotKey> Slots<K> {
    fn with_cap(limits: Limits, per_key: usize) -> Arc<Slots<K>> {
        Arc::new(Slots {
            limits,
            per_key,
            counts: Mutex::new(Counts {
                total: 0,
                users: 0,
                by_uid: HashMap::new(),
            }),
        })
    }

    /// A place for a connection of `uid`, or why there is none (the client's answer).
    pub fn take(self: &Arc<Self>, uid: K, admin: bool) -> Result<Slot<K>, String> {
        let l = self.limits;
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.by_uid.get(&uid).copied().unwrap_or(0);
        if c.total >= l.total {
            return Err(format!(
                "busy: {} requests in progress, the most bftrainerd serves at once; try again",
                c.total
            ));
        }
        if !admin {
            if mine >= self.per_key {
                return Err(format!(
                    "too many connections: {} has {mine} requests in progress, the most {} may have at once; wait for them to end",
                    uid.who(),
                    K::ONE
                ));
            }
            if c.users >= l.total.saturating_sub(l.admin_reserved) {
                return Err(format!(
                    "busy: {} requests of users in progress (the rest are kept for root and SlurmUser); try again",
                    c.users
                ));
            }
            c.users += 1;
        }
        c.total += 1;
        *c.by_uid.entry(uid).or_default() += 1;
        Ok(Slot {
            slots: self.clone(),
            uid,
            admin,
        })
    }
}

/// Serves until the listener fails for good.
pub async fn serve(listener: UnixListener, shared: Shared) {
    serve_with(listener, shared, Limits::default()).await
}

/// As [`serve`], with these limits.
pub async fn serve_with(listener: UnixListener, shared: Shared, limits: Limits) {
    let slots = Slots::new(limits);
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                log::warn!("control socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // The kernel recorded the peer at connect(): who it is costs no read.
        let uid = match stream.peer_cred() {
            Ok(c) => c.uid(),
            Err(e) => {
                log::debug!("control socket: no peer credentials: {e}");
                continue;
            }
        };
        let admin = shared.admins.contains(&uid);
        match slots.take(uid, admin) {
            Ok(slot) => {
                let shared = shared.clone();
                tokio::spawn(async move {
                    handle(stream, uid, &shared).await;
                    drop(slot);
                });
            }
            Err(why) => {
                log::debug!("control socket: uid {uid} refused: {why}");
                // Bounded: a flood of refused connections costs at most MAX_REFUSALS
                // tasks; past that they are closed unanswered.
                let Ok(permit) = refusals.clone().try_acquire_owned() else {
                    continue;
                };
                tokio::spawn(async move {
                    refuse(stream, &Response::err(why)).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Answers a connection that gets no slot: reads what the client sends first (briefly),
/// so that closing does not reset the connection under the answer.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(stream: S, r: &Response) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(REFUSAL_READ, async {
        (&mut reader)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
    })
    .await;
    write(reader.into_inner(), r).await;
}

async fn write<S: AsyncWrite + Unpin>(mut stream: S, r: &Response) {
    let mut text = serde_json::to_vec(r).unwrap_or_default();
    text.push(b'\n');
    // A client that does not read its answer is dropped after IO_TIMEOUT.
    let _ = tokio::time::timeout(IO_TIMEOUT, async {
        stream.write_all(&text).await?;
        stream.shutdown().await
    })
    .await;
}

/// The one request line of a connection, bounded in size and time: the line, an
/// answer saying what is wrong with it (`Err(Some)`), or nothing to answer (the client
/// left: `Err(None)`).
async fn read_request<S: AsyncRead + Unpin>(
    reader: &mut BufReader<S>,
    what: &str,
) -> Result<Vec<u8>, Option<Response>> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(IO_TIMEOUT, async {
        reader
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut buf)
            .await
    })
    .await;
    match read {
        Err(_) => Err(Some(Response::err(format!(
            "no complete request within {} s; send {what}",
            IO_TIMEOUT.as_secs()
        )))),
        Ok(Err(e)) => {
            log::debug!("control: read failed: {e}");
            Err(None)
        }
        Ok(Ok(_)) if buf.len() > MAX_REQUEST => Err(Some(Response::err(format!(
            "request too large: over {MAX_REQUEST} bytes (a request is {what})"
        )))),
        Ok(Ok(0)) => Err(None),
        Ok(Ok(_)) => Ok(buf),
    }
}

async fn handle(stream: UnixStream, uid: u32, shared: &Shared) {
    let mut reader = BufReader::new(stream);
    let answer = match read_request(&mut reader, "one JSON line").await {
        Ok(line) => answer(&line, uid, shared).await,
        Err(Some(r)) => r,
        Err(None) => return,
    };
    write(reader.into_inner(), &answer).await;
}

/// Who asks, through which door: what decides the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// On the control socket, uid from SO_PEERCRED: root and SlurmUser are admins.
    Local { uid: u32 },
    /// On the query endpoint, uid from a MUNGE credential: read-only, and answered as
    /// the socket answers a user who is no admin, whatever the uid.
    Remote { uid: u32 },
}

/// Parses one request from the control socket and answers it as `uid` may be
/// answered.
pub async fn answer(line: &[u8], uid: u32, shared: &Shared) -> Response {
    match parse(line) {
        Ok(req) => dispatch(req, Caller::Local { uid }, shared).await,
        Err(e) => Response::err(e),
    }
}

/// Answers a parsed request as `caller` may be answered; both doors come here.
pub async fn dispatch(req: Request, caller: Caller, shared: &Shared) -> Response {
    let (uid, admin) = match caller {
        Caller::Local { uid } => (uid, shared.admins.contains(&uid)),
        Caller::Remote { uid } => (uid, false),
    };
    let snap = shared.snapshot.borrow().clone();
    let who = (!admin).then_some(uid);
    match req.op {
        Op::Status => {
            let mut v = status_view_for(&snap, who);
            v.listen_problems = super::listen::problems();
            Response::ok(json(&v))
        }
        Op::Jobs {
            user,
            job_ids,
            history,
        } => {
            let jobs = jobs_view(&snap, who, user.as_deref(), &job_ids, history);
            Response::ok(json(&jobs))
        }
        Op::Nodes => Response::ok(json(&nodes_view(&snap, who))),
        op @ (Op::Pause | Op::Drain | Op::Resume) if matches!(caller, Caller::Remote { .. }) => {
            Response::err(format!(
                "refused: the query endpoint is read-only (status, jobs, nodes); {} is for root and SlurmUser on bftrainerd's host, through its control socket",
                op.name()
            ))
        }
        Op::Pause | Op::Drain | Op::Resume if !admin => Response::err(format!(
            "permission denied: pause, drain and resume are for root and SlurmUser; you are uid {uid}"
        )),
        op @ (Op::Pause | Op::Drain | Op::Resume) => {
            let mode = match op {
                Op::Pause => Lending::Paused,
                Op::Drain => Lending::Drained,
                _ => Lending::Open,
            };
            let (tx, rx) = oneshot::channel();
            let cmd = AdminCmd {
                mode,
                by_uid: uid,
                reply: tx,
            };
            if shared.admin.send(cmd).await.is_err() {
                return Response::err("bftrainerd is stopping");
            }
            match rx.await {
                Ok(Ok(msg)) => Response::ok(serde_json::json!({ "lending": mode.as_str(), "message": msg })),
                Ok(Err(e)) => Response::err(e),
                Err(_) => Response::err("bftrainerd is stopping"),
            }
        }
    }
}

/// Checks a query credential: who made it and what it says. `unmunge` through the
/// cluster's munged in the daemon ([`munge_decoder`]); a stand-in in tests. Blocking:
/// called off the async threads.
pub type Decoder = Arc<dyn Fn(&str) -> Result<Decoded, String> + Send + Sync>;

/// The daemon's decoder: munged's answer, replay and TTL checks included.
pub fn munge_decoder(munge: Munge) -> Decoder {
    Arc::new(move |cred| munge.decode(cred))
}

/// Makes the server's proof: a credential of this process's uid (root) carrying the
/// payload, that any uid may decode. Blocking: called off the async threads.
pub type Prover = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// The daemon's prover: `munge` through the cluster's munged.
pub fn munge_prover(munge: Munge) -> Prover {
    Arc::new(move |payload| munge.encode_for_anyone(payload))
}

/// The payload of the server's proof for `nonce`, reached at `addr`.
pub fn proof_payload(nonce: &str, addr: std::net::SocketAddr) -> String {
    format!("{PROOF_PAYLOAD}{nonce} {}", canonical(addr))
}

/// `addr` with an IPv4-mapped IPv6 address written as IPv4 (a server listening on
/// `[::]` sees an IPv4 client's connection so).
fn canonical(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    std::net::SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// A query credential's payload for `op`: [`QUERY_PAYLOAD`] and the request's JSON.
pub fn query_payload(op: Op) -> String {
    let req = serde_json::to_string(&Request { v: PROTOCOL, op }).unwrap_or_default();
    format!("{QUERY_PAYLOAD}{req}")
}

/// The query endpoint's state: its slots, by address then by uid, and its credential
/// checks.
struct Query {
    shared: Shared,
    decoder: Decoder,
    prover: Prover,
    users: Arc<Slots<u32>>,
    decodes: Arc<Semaphore>,
}

/// Serves the query endpoint until the listener fails for good. Only the snapshot is
/// needed: nothing here reaches the main loop.
pub async fn serve_query(
    listener: TcpListener,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    munge: Munge,
) {
    let limits = Limits {
        total: MAX_CLIENTS - ADMIN_RESERVED,
        admin_reserved: 0,
        ..Limits::default()
    };
    serve_query_with(
        listener,
        snapshot,
        munge_decoder(munge.clone()),
        munge_prover(munge),
        limits,
    )
    .await
}

/// As [`serve_query`], with this decoder, prover and these limits.
pub async fn serve_query_with(
    listener: TcpListener,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    decoder: Decoder,
    prover: Prover,
    limits: Limits,
) {
    // Admin verbs never reach the main loop from here: a channel nobody reads.
    let (admin, _) = mpsc::channel(1);
    let q = Arc::new(Query {
        shared: Shared {
            snapshot,
            admin,
            admins: Vec::new(),
        },
        decoder,
        prover,
        users: Slots::new(limits),
        decodes: Arc::new(Semaphore::new(MAX_DECODES)),
    });
    let peers = Slots::by_peer(limits);
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                log::warn!("query endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Who it is is known only once its credential is checked: until then it
        // counts against its address.
        match peers.take(peer.ip(), false) {
            Ok(slot) => {
                let q = q.clone();
                tokio::spawn(async move {
                    let mut reader = BufReader::new(stream);
                    let what = "one line: a MUNGE credential";
                    let mut first = read_request(&mut reader, what).await;
                    // A client of this release first asks the server to prove itself;
                    // one of the first release sends its credential at once.
                    if let Ok(line) = &first {
                        if line.starts_with(HELLO.as_bytes()) {
                            let local = reader.get_ref().local_addr();
                            first = match prove(line, local, &q).await {
                                Ok(proof) => {
                                    let sent = tokio::time::timeout(
                                        IO_TIMEOUT,
                                        reader.get_mut().write_all(proof.as_bytes()),
                                    )
                                    .await;
                                    if !matches!(sent, Ok(Ok(()))) {
                                        return;
                                    }
                                    read_request(&mut reader, what).await
                                }
                                Err(r) => Err(Some(r)),
                            };
                        }
                    }
                    let (answer, uid_slot) = match first {
                        Ok(line) => query_answer(&line, &q).await,
                        Err(Some(r)) => (r, None),
                        Err(None) => return,
                    };
                    write(reader.into_inner(), &answer).await;
                    drop((uid_slot, slot));
                });
            }
            Err(why) => {
                log::debug!("query endpoint: {peer} refused: {why}");
                let Ok(permit) = refusals.clone().try_acquire_owned() else {
                    continue;
                };
                tokio::spawn(async move {
                    refuse(stream, &Response::err(why)).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Answers one query line, with the slot of the uid it came from (held while the
/// answer is written, so one user's unread answers are capped too).
async fn query_answer(line: &[u8], q: &Query) -> (Response, Option<Slot<u32>>) {
    let cred = match credential(line) {
        Ok(c) => c,
        Err(e) => return (Response::err(e), None),
    };
    let d = match decode(cred, q).await {
        Ok(d) => d,
        Err(why) => {
            log::debug!("query endpoint: credential refused: {why}");
            return (Response::err(format!("credential refused: {why}")), None);
        }
    };
    let req = match query_request(&d.payload) {
        Ok(r) => r,
        Err(e) => return (Response::err(e), None),
    };
    let slot = match q.users.take(d.uid, false) {
        Ok(s) => s,
        Err(why) => return (Response::err(why), None),
    };
    let r = dispatch(req, Caller::Remote { uid: d.uid }, &q.shared).await;
    (r, Some(slot))
}

/// The server's proof line for a client's hello: a root-made credential binding the
/// client's nonce to the address it reached. Made off the async threads, within the
/// same bound as credential checks (a `munge` process each).
async fn prove(
    hello: &[u8],
    local: std::io::Result<std::net::SocketAddr>,
    q: &Query,
) -> Result<String, Response> {
    let nonce = std::str::from_utf8(hello)
        .ok()
        .and_then(|l| l.trim().strip_prefix(HELLO.trim_end()))
        .map(str::trim)
        .filter(|n| n.len() == NONCE_HEX && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            Response::err(format!(
                "bad hello: expected {:?} and {NONCE_HEX} hex digits",
                HELLO.trim_end()
            ))
        })?
        .to_string();
    let local = local.map_err(|e| Response::err(format!("cannot prove this server: {e}")))?;
    let permit = tokio::time::timeout(IO_TIMEOUT, q.decodes.clone().acquire_owned())
        .await
        .map_err(|_| Response::err("busy: too many credential checks waiting; try again"))?
        .map_err(|_| Response::err("bftrainerd is stopping"))?;
    let prover = q.prover.clone();
    let payload = proof_payload(&nonce, local);
    let task = tokio::task::spawn_blocking(move || {
        let r = prover(&payload);
        drop(permit);
        r
    });
    match tokio::time::timeout(IO_TIMEOUT, task).await {
        Ok(Ok(Ok(cred))) => Ok(format!("{cred}\n")),
        Ok(Ok(Err(e))) => {
            log::warn!("query endpoint: cannot make the server's proof: {e}");
            Err(Response::err(format!(
                "bftrainerd cannot prove itself (munge failed: {e})"
            )))
        }
        _ => Err(Response::err(
            "bftrainerd cannot prove itself: munge did not answer in time; try again",
        )),
    }
}

/// The credential on a query line; garbage is refused before it costs an `unmunge`.
fn credential(line: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(line).unwrap_or("").trim();
    let ok = text.len() > "MUNGE:".len()
        && text.starts_with("MUNGE:")
        && text.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(text.to_string())
    } else {
        Err("bad request: the query endpoint takes one line holding a MUNGE credential whose payload is the request (`bftrainer status|jobs|nodes --server HOST:PORT` makes it)".into())
    }
}

/// Decodes `cred` off the async threads, at most `MAX_DECODES` at once; a munged that
/// does not answer within `IO_TIMEOUT` is an error for the client (its check keeps
/// its place until it ends, so a hung munged cannot pile up threads).
async fn decode(cred: String, q: &Query) -> Result<Decoded, String> {
    let permit = tokio::time::timeout(IO_TIMEOUT, q.decodes.clone().acquire_owned())
        .await
        .map_err(|_| "busy: too many credential checks waiting; try again".to_string())?
        .map_err(|_| "bftrainerd is stopping".to_string())?;
    let decoder = q.decoder.clone();
    let task = tokio::task::spawn_blocking(move || {
        let r = decoder(&cred);
        drop(permit);
        r
    });
    match tokio::time::timeout(IO_TIMEOUT, task).await {
        Err(_) => Err(format!(
            "munged did not check it within {} s; try again",
            IO_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("the check failed: {e}")),
        Ok(Ok(r)) => r,
    }
}

/// The request a query credential's payload carries; the op is what was signed.
pub fn query_request(payload: &str) -> Result<Request, String> {
    let Some(line) = payload.strip_prefix(QUERY_PAYLOAD) else {
        return Err(format!(
            "credential refused: it was not made for a bftrainerd query (its payload does not start with {:?}); use `bftrainer status|jobs|nodes --server HOST:PORT`",
            QUERY_PAYLOAD.trim_end()
        ));
    };
    parse(line.as_bytes())
}

fn json<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn parse(line: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(line)
        .map_err(|_| "bad request: not UTF-8 text; send one JSON line".to_string())?;
    let text = text.trim();
    if text.is_empty() {
        return Err(
            "bad request: empty; send one JSON line such as {\"v\":1,\"op\":\"status\"}".into(),
        );
    }
    // The version first, so an old or new client hears about versions, not fields.
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!("bad request: not JSON ({e}); send one line such as {{\"v\":1,\"op\":\"status\"}}")
    })?;
    match v.get("v").and_then(serde_json::Value::as_u64) {
        Some(n) if n == u64::from(PROTOCOL) => {}
        Some(n) => {
            return Err(format!(
                "protocol version {n} is not spoken here: bftrainerd {} speaks version {PROTOCOL}; use the bftrainer command of the same release",
                env!("CARGO_PKG_VERSION")
            ))
        }
        None => return Err("bad request: no protocol version \"v\"; expected \"v\": 1".into()),
    }
    // Fields an op does not take are refused, not ignored (a mistyped "histroy").
    if let (Some(obj), Some(op)) = (v.as_object(), v.get("op").and_then(|o| o.as_str())) {
        let takes: &[&str] = if op == "jobs" {
            &["user", "job_ids", "history"]
        } else {
            &[]
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !["v", "op"].contains(&k.as_str()) && !takes.contains(&k.as_str()))
        {
            return Err(format!(
                "bad request: unknown field `{k}` for op {op}; {}",
                if takes.is_empty() {
                    "it takes none".to_string()
                } else {
                    format!("allowed: {}", takes.join(", "))
                }
            ));
        }
    }
    serde_json::from_value(v).map_err(|e| {
        format!("bad request: {e}; expected op one of status, jobs, nodes, pause, drain, resume")
    })
}

/// `status`: the snapshot without its node and job lists.
pub fn status_view(s: &Snapshot) -> Snapshot {
    s.clone_summary()
}

/// `status` as `who` may see it (None: all): the last error names no other user's job.
pub fn status_view_for(s: &Snapshot, who: Option<u32>) -> Snapshot {
    let mut v = s.clone_summary();
    if let (Some(uid), Some(e)) = (who, v.last_error.as_mut()) {
        e.message = redact(&e.message, &own_ids(s, uid));
    }
    v
}

/// The job ids `uid` owns: its elastic jobs and their satellites.
fn own_ids(s: &Snapshot, uid: u32) -> HashSet<u32> {
    s.jobs
        .iter()
        .filter(|j| j.uid == uid)
        .flat_map(|j| std::iter::once(j.job_id).chain(j.satellites.iter().map(|s| s.job_id)))
        .collect()
}

/// `text` with each job id not in `mine` replaced by `*`: a user learns that some job
/// failed somewhere, not which (another user's). A job id is a number after the word
/// job, jobs, jobid, job_id, satellite, satellites, parent or bftsat (any case; `=`,
/// `#`, `-`, `:` or spaces between), the way bftrainerd and Slurm write them.
pub fn redact(text: &str, mine: &HashSet<u32>) -> String {
    const WORDS: [&str; 8] = [
        "bftsat",
        "job",
        "jobs",
        "jobid",
        "job_id",
        "satellite",
        "satellites",
        "parent",
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let len = from
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(from.len());
        let (digits, after) = from.split_at(len);
        // The word before the number, past separators; a number inside a word (n12) is
        // a node name, not an id.
        let head = out.trim_end_matches([' ', '=', '#', ':', '-']);
        let word: String = head
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let inside_word = out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let is_id = !inside_word && WORDS.contains(&word.to_ascii_lowercase().as_str());
        if is_id && !digits.parse().is_ok_and(|n: u32| mine.contains(&n)) {
            out.push('*');
        } else {
            out.push_str(digits);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `jobs`: the jobs `who` may see (None: all), filtered by user and ids.
pub fn jobs_view(
    s: &Snapshot,
    who: Option<u32>,
    user: Option<&str>,
    ids: &[u32],
    history: bool,
) -> Vec<JobView> {
    s.jobs
        .iter()
        .filter(|j| who.map_or(true, |u| j.uid == u))
        .filter(|j| {
            user.map_or(true, |u| {
                j.user.as_deref() == Some(u) || u.parse::<u32>().is_ok_and(|n| n == j.uid)
            })
        })
        .filter(|j| ids.is_empty() || ids.contains(&j.job_id))
        .map(|j| {
            let mut j = j.clone();
            if !history {
                j.history = None;
            }
            j
        })
        .collect()
}

/// `nodes`: every node; the holder is shown only for jobs `who` may see (another
/// user's node is lent, without the id), and why a node is set aside names no other
/// user's job.
pub fn nodes_view(s: &Snapshot, who: Option<u32>) -> Vec<NodeView> {
    let Some(uid) = who else {
        return s.nodes.clone();
    };
    let mine = own_ids(s, uid);
    s.nodes
        .iter()
        .map(|n| {
            let mut n = n.clone();
            if n.holder.is_some_and(|h| !mine.contains(&h)) {
                n.holder = None;
            }
            if let Some(a) = n.set_aside.as_mut() {
                a.reason = redact(&a.reason, &mine);
            }
            n
        })
        .collect()
}

/// A client's call: sends `op`, returns the answer's data or its error message.
pub fn call(socket: &Path, op: Op, timeout: Duration) -> Result<serde_json::Value, String> {
    let s = std::os::unix::net::UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "bftrainerd is not running: nothing listens on {} ({e}); start it (systemctl start bftrainerd) or name its socket with --socket",
            socket.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "cannot reach {}: {e}; the socket and its directory must be reachable by all users (see docs/admin.md)",
            socket.display()
        ),
        _ => format!("cannot connect to {}: {e}", socket.display()),
    })?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    let mut line = serde_json::to_vec(&Request { v: PROTOCOL, op }).map_err(|e| e.to_string())?;
    line.push(b'\n');
    exchange(
        s,
        &line,
        timeout,
        &socket.display().to_string(),
        "a bftrainerd socket of this release",
    )
}

/// A client's call to the query endpoint at `server` (HOST:PORT): makes a credential
/// for `op` with `munge` (for root only: [`QUERY_DECODER_UID`]), sends it, returns
/// the answer's data or its error message.
pub fn call_query(
    server: &str,
    op: Op,
    timeout: Duration,
    munge: &Munge,
) -> Result<serde_json::Value, String> {
    call_query_with(
        server,
        op,
        timeout,
        &|payload| munge.encode(payload, QUERY_DECODER_UID),
        &|cred| munge.decode(cred),
    )
}

/// As [`call_query`], with this credential maker (for root only) and decoder.
///
/// The server proves itself first: the client sends a fresh nonce, and sends its own
/// credential only once the server's answer decodes (through munged) as a credential
/// made by uid 0 that binds this nonce to the address the client reached. Anyone else
/// on that port (a user who bound it first) cannot make such a credential, and one the
/// genuine daemon made for another connection names another nonce or address; the
/// client then stops with nothing of its own sent.
pub fn call_query_with(
    server: &str,
    op: Op,
    timeout: Duration,
    encode: &dyn Fn(&str) -> Result<String, String>,
    decode: &dyn Fn(&str) -> Result<Decoded, String>,
) -> Result<serde_json::Value, String> {
    use std::io::{BufRead, Read, Write};
    use std::net::ToSocketAddrs;
    let addrs: Vec<std::net::SocketAddr> = server
        .to_socket_addrs()
        .map_err(|e| {
            format!("--server {server}: not a reachable HOST:PORT ({e}); expected e.g. bftrainer-host:6820")
        })?
        .collect();
    let cred = encode(&query_payload(op))
        .map_err(|e| format!("cannot make a MUNGE credential to ask {server}: {e}"))?;
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let s = stream.ok_or_else(|| {
        let e = last.map_or("no address".to_string(), |e| e.to_string());
        format!(
            "cannot reach bftrainerd's query endpoint at {server} ({e}); is [daemon] query_listen set there, and its port open to this host?"
        )
    })?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    let peer = s.peer_addr().map_err(|e| format!("{server}: {e}"))?;
    let nonce = nonce()?;
    let mut s = s;
    s.write_all(format!("{HELLO}{nonce}\n").as_bytes())
        .map_err(|e| format!("sending to {server}: {e}"))?;
    let mut proof = Vec::new();
    let mut reader = std::io::BufReader::new(&mut s);
    (&mut reader)
        .take(MAX_REQUEST as u64)
        .read_until(b'\n', &mut proof)
        .map_err(|e| {
            format!(
                "no answer from {server} within {} s ({e}); nothing was sent",
                timeout.as_secs()
            )
        })?;
    check_proof(&proof, &nonce, peer, decode).map_err(|why| {
        format!(
            "refused to send your credential to {server}: it did not prove it is bftrainerd (root): {why}. Someone else may hold that port; tell your admin (bftrainerd logs who holds it)"
        )
    })?;
    drop(reader);
    let mut line = cred.into_bytes();
    line.push(b'\n');
    exchange(
        s,
        &line,
        timeout,
        server,
        "bftrainerd's query endpoint ([daemon] query_listen) of this release",
    )
}

/// 128 random bits, hex.
fn nonce() -> Result<String, String> {
    use std::io::Read;
    let mut b = [0u8; NONCE_HEX / 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("cannot read /dev/urandom for a nonce: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Whether `line` (the server's first answer) proves the server: a credential made by
/// uid 0 whose payload is [`proof_payload`] of `nonce` and `peer`.
pub fn check_proof(
    line: &[u8],
    nonce: &str,
    peer: std::net::SocketAddr,
    decode: &dyn Fn(&str) -> Result<Decoded, String>,
) -> Result<(), String> {
    let text = std::str::from_utf8(line).unwrap_or("").trim();
    if text.is_empty() {
        return Err("it answered nothing".into());
    }
    if let Ok(r) = serde_json::from_str::<Response>(text) {
        let error = r.error.unwrap_or_else(|| "no error given".into());
        // A bftrainerd of the first release takes the hello for a bad credential.
        let older = if error.contains("one line holding a MUNGE credential") {
            "; a bftrainerd older than this client does not prove itself: use the bftrainer command of the daemon's release"
        } else {
            ""
        };
        return Err(format!("it answered without a proof ({error}){older}"));
    }
    if !text.starts_with("MUNGE:") || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("its answer is not a MUNGE credential".into());
    }
    let d = decode(text).map_err(|e| format!("its credential does not check out: {e}"))?;
    if d.uid != 0 {
        return Err(format!(
            "its credential was made by uid {}, not root",
            d.uid
        ));
    }
    if d.payload != proof_payload(nonce, peer) {
        return Err(format!(
            "its credential is root's but not for this connection to {} (it says {:?}): a relayed proof",
            canonical(peer),
            d.payload
        ));
    }
    Ok(())
}

/// Sends one line, reads the one answer: its data, or why there is none.
fn exchange(
    mut s: impl std::io::Read + std::io::Write,
    line: &[u8],
    timeout: Duration,
    place: &str,
    what: &str,
) -> Result<serde_json::Value, String> {
    // A refused connection may be answered and closed before the request is through:
    // its answer says why, so it is read whatever the write did.
    let sent = s.write_all(line);
    let mut out = Vec::new();
    let read = s.read_to_end(&mut out);
    let r: Response = match serde_json::from_slice(&out) {
        Ok(r) => r,
        Err(e) => {
            return Err(if let Err(w) = sent {
                format!("sending the request to {place}: {w}")
            } else if let Err(r) = read {
                format!(
                    "no answer from bftrainerd within {} s on {place}: {r}",
                    timeout.as_secs(),
                )
            } else {
                format!("bftrainerd's answer is not understood ({e}); is {place} {what}?")
            })
        }
    };
    if r.v != PROTOCOL {
        return Err(format!(
            "bftrainerd answers with protocol {} and this command speaks {PROTOCOL}: use the bftrainer command of the daemon's release",
            r.v
        ));
    }
    if r.ok {
        Ok(r.data.unwrap_or(serde_json::Value::Null))
    } else {
        Err(r
            .error
            .unwrap_or_else(|| "bftrainerd refused the request".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::view::{JobView, NodeView};
    use crate::daemon::Why;

    fn job(id: u32, uid: u32, user: &str) -> JobView {
        JobView {
            job_id: id,
            user: Some(user.into()),
            uid,
            min_nodes: 1,
            max_nodes: 4,
            state: "running".into(),
            nodes: "n1".into(),
            size: 1,
            core_nodes: "n1".into(),
            satellites: Vec::new(),
            rate: None,
            batch: None,
            batch_range: None,
            sensitivity: None,
            held_per_gpu: None,
            measurements: 0,
            admits: 1,
            grows: 0,
            shrinks: 0,
            requeues: 0,
            preemptions: 0,
            largest: 1,
            node_hours: 0.0,
            submitted_at: 0.0,
            ended_at: None,
            history: Some(vec![]),
            history_dropped: 0,
            paused_until: None,
            pause_reason: None,
            unservable: None,
        }
    }

    fn node(name: &str, holder: Option<u32>) -> NodeView {
        NodeView {
            name: name.into(),
            state: if holder.is_some() { "lent" } else { "idle" }.into(),
            why: Why::Open,
            holder,
            reclaim_at: None,
            set_aside: None,
        }
    }

    fn snap() -> Snapshot {
        Snapshot {
            jobs: vec![job(7, 1001, "alice"), job(9, 1002, "bob")],
            nodes: vec![node("n1", Some(7)), node("n2", Some(9)), node("n3", None)],
            ..Default::default()
        }
    }

    #[test]
    fn requests_parse_or_say_what_is_wrong() {
        let ok = parse(br#"{"v":1,"op":"jobs","user":"alice","history":true}"#).unwrap();
        assert_eq!(
            ok.op,
            Op::Jobs {
                user: Some("alice".into()),
                job_ids: vec![],
                history: true
            }
        );
        assert_eq!(
            parse(b"{\"v\":1,\"op\":\"drain\"}\n").unwrap().op,
            Op::Drain
        );
        for (line, want) in [
            (&b"\xff"[..], "not UTF-8"),
            (b"  ", "empty"),
            (b"{\"v\":1,", "not JSON"),
            (b"[1,2]", "no protocol version"),
            (
                b"{\"v\":3,\"op\":\"status\"}",
                "protocol version 3 is not spoken here",
            ),
            (
                b"{\"v\":1,\"op\":\"halt\"}",
                "expected op one of status, jobs, nodes, pause, drain, resume",
            ),
            (b"{\"v\":1,\"op\":\"status\",\"x\":1}", "unknown field"),
            (b"{\"v\":1,\"op\":\"jobs\",\"job_ids\":[-1]}", "bad request"),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(want), "{line:?}: {e}");
        }
    }

    #[test]
    fn users_see_their_own_jobs_and_holders_only() {
        let s = snap();
        let all = jobs_view(&s, None, None, &[], false);
        assert_eq!(all.len(), 2);
        assert!(
            all.iter().all(|j| j.history.is_none()),
            "history only when asked"
        );
        let alice = jobs_view(&s, Some(1001), None, &[], true);
        assert_eq!(alice.iter().map(|j| j.job_id).collect::<Vec<_>>(), [7]);
        assert!(alice[0].history.is_some());
        assert!(jobs_view(&s, Some(1001), None, &[9], false).is_empty());
        assert!(jobs_view(&s, Some(1001), Some("bob"), &[], false).is_empty());
        assert_eq!(jobs_view(&s, None, Some("1002"), &[], false)[0].job_id, 9);
        assert_eq!(jobs_view(&s, None, Some("bob"), &[], false)[0].job_id, 9);
        let nodes = nodes_view(&s, Some(1001));
        let holders: Vec<Option<u32>> = nodes.iter().map(|n| n.holder).collect();
        assert_eq!(holders, [Some(7), None, None]);
        assert_eq!(nodes_view(&s, None)[1].holder, Some(9));
        let st = status_view(&s);
        assert!(st.jobs.is_empty() && st.nodes.is_empty());
    }

    #[tokio::test]
    async fn admin_verbs_need_an_admin() {
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let (atx, mut arx) = mpsc::channel(1);
        let shared = Shared {
            snapshot: rx,
            admin: atx,
            admins: vec![0, 64030],
        };
        let r = answer(b"{\"v\":1,\"op\":\"pause\"}", 1001, &shared).await;
        assert!(!r.ok && r.error.unwrap().contains("permission denied"));
        assert!(arx.try_recv().is_err(), "nothing reached the main loop");
        let main = tokio::spawn(async move {
            let c = arx.recv().await.unwrap();
            assert_eq!((c.mode, c.by_uid), (Lending::Drained, 64030));
            c.reply.send(Ok("drained".into())).unwrap();
        });
        let r = answer(b"{\"v\":1,\"op\":\"drain\"}", 64030, &shared).await;
        assert!(r.ok, "{r:?}");
        assert_eq!(r.data.unwrap()["lending"], "drained");
        main.await.unwrap();
        let r = answer(b"{\"v\":1,\"op\":\"jobs\"}", 1002, &shared).await;
        assert_eq!(r.data.unwrap().as_array().unwrap().len(), 1);
    }

    #[test]
    fn slots_keep_room_for_admins_and_cap_each_user() {
        let slots = Slots::new(Limits {
            total: 6,
            admin_reserved: 2,
            per_uid: 2,
            per_peer: 1,
        });
        let a: Vec<Slot> = (0..2).map(|_| slots.take(1001, false).unwrap()).collect();
        let e = slots.take(1001, false).unwrap_err();
        assert!(
            e.contains("too many connections: uid 1001 has 2 requests in progress"),
            "{e}"
        );
        let b: Vec<Slot> = (0..2).map(|_| slots.take(1002, false).unwrap()).collect();
        // Users hold 4 of 6: the last 2 are root's and SlurmUser's.
        let e = slots.take(1003, false).unwrap_err();
        assert!(e.contains("kept for root and SlurmUser"), "{e}");
        let r1 = slots.take(0, true).unwrap();
        let r2 = slots.take(64030, true).unwrap();
        let e = slots.take(0, true).unwrap_err();
        assert!(e.contains("busy: 6 requests in progress"), "{e}");
        // Slots come back when their connections end.
        drop(a);
        let c = slots.take(1003, false).unwrap();
        drop((b, c, r1, r2));
        let counts = slots.counts.lock().unwrap();
        assert_eq!((counts.total, counts.users), (0, 0));
        assert!(counts.by_uid.is_empty());
    }

    #[test]
    fn redaction_hides_other_users_job_ids_only() {
        let mine: HashSet<u32> = [7, 70].into_iter().collect();
        for (text, want) in [
            (
                "grow job 9 onto n12: Slurm refused the satellite: QOS",
                "grow job * onto n12: Slurm refused the satellite: QOS",
            ),
            (
                "satellites of 2 users failed there, the last: satellite 345 of job 9 ended FAILED after 0 s",
                "satellites of 2 users failed there, the last: satellite * of job * ended FAILED after 0 s",
            ),
            ("pin of job 7 to n[1-2] failed", "pin of job 7 to n[1-2] failed"),
            ("satellite 70 of Job 7", "satellite 70 of Job 7"),
            ("JobId=123 bftsat-9 bftsat-7", "JobId=* bftsat-* bftsat-7"),
            ("slurmctld does not answer (timeout 10 s)", "slurmctld does not answer (timeout 10 s)"),
        ] {
            assert_eq!(redact(text, &mine), want, "{text}");
        }
    }

    #[test]
    fn users_see_no_other_users_job_ids_in_status_or_nodes() {
        let mut s = snap();
        s.last_error = Some(crate::daemon::view::LastError {
            time: 1.0,
            message: "grow job 9 onto n2: Slurm refused the satellite".into(),
        });
        s.nodes[2].set_aside = Some(crate::daemon::SetAside {
            failures: 1,
            until: 10.0,
            reason: "satellites of 2 users failed there, the last: satellite 11 of job 9 ended"
                .into(),
        });
        let alice = serde_json::to_string(&status_view_for(&s, Some(1001))).unwrap();
        assert!(alice.contains("grow job * onto n2"), "{alice}");
        let bob = serde_json::to_string(&status_view_for(&s, Some(1002))).unwrap();
        assert!(bob.contains("grow job 9 onto n2"), "{bob}");
        let root = serde_json::to_string(&status_view_for(&s, None)).unwrap();
        assert!(root.contains("grow job 9 onto n2"), "{root}");
        let nodes = nodes_view(&s, Some(1001));
        assert_eq!(nodes[1].state, "lent", "lent, without the holder");
        assert_eq!(nodes[1].holder, None);
        let reason = &nodes[2].set_aside.as_ref().unwrap().reason;
        assert!(reason.ends_with("satellite * of job * ended"), "{reason}");
        assert!(nodes_view(&s, None)[2]
            .set_aside
            .as_ref()
            .unwrap()
            .reason
            .contains("job 9"));
    }

    /// Over the socket: a user past its cap hears why (through `call`, as
    /// `bftrainer` does), while an admin is still served; slots come back.
    #[tokio::test]
    async fn a_user_over_the_cap_is_told_and_an_admin_still_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let me = nix::unistd::geteuid().as_raw();
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let (atx, _arx) = mpsc::channel(1);
        let limits = Limits {
            total: 4,
            admin_reserved: 1,
            per_uid: 2,
            per_peer: 4,
        };
        // As a plain user: this process's uid is no admin.
        let user = Shared {
            snapshot: rx.clone(),
            admin: atx.clone(),
            admins: vec![me + 1],
        };
        tokio::spawn(serve_with(bind(&path).unwrap(), user, limits));
        let idle: Vec<UnixStream> = {
            let mut v = Vec::new();
            for _ in 0..2 {
                v.push(UnixStream::connect(&path).await.unwrap());
            }
            v
        };
        let p = path.clone();
        let e = tokio::task::spawn_blocking(move || {
            // The idle ones are accepted in order: wait until both hold their slots.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match call(&p, Op::Status, Duration::from_secs(5)) {
                    Err(e) if e.contains("too many connections") => return e,
                    r if std::time::Instant::now() > deadline => panic!("{r:?}"),
                    _ => std::thread::yield_now(),
                }
            }
        })
        .await
        .unwrap();
        assert!(
            e.contains(&format!("uid {me} has 2 requests in progress")),
            "{e}"
        );
        drop(idle);
        let p = path.clone();
        let ok = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match call(&p, Op::Status, Duration::from_secs(5)) {
                    Ok(v) => return v,
                    r if std::time::Instant::now() > deadline => panic!("{r:?}"),
                    _ => std::thread::yield_now(),
                }
            }
        })
        .await
        .unwrap();
        assert!(ok.get("counts").is_some(), "{ok}");

        // As an admin: served past the per-uid cap, up to the total.
        let apath = dir.path().join("a.sock");
        let admin = Shared {
            snapshot: rx,
            admin: atx,
            admins: vec![me],
        };
        tokio::spawn(serve_with(bind(&apath).unwrap(), admin, limits));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(UnixStream::connect(&apath).await.unwrap());
        }
        let p = apath.clone();
        let v = tokio::task::spawn_blocking(move || call(&p, Op::Status, Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(v.is_ok(), "{v:?}");
        drop(held);
    }

    #[test]
    fn a_query_credential_carries_its_request_and_nothing_else_passes() {
        let jobs = Op::Jobs {
            user: None,
            job_ids: vec![7],
            history: true,
        };
        let payload = query_payload(jobs.clone());
        assert_eq!(
            payload,
            r#"bftrainer-query:v1 {"v":1,"op":"jobs","user":null,"job_ids":[7],"history":true}"#
        );
        assert_eq!(query_request(&payload).unwrap().op, jobs);
        assert_eq!(
            query_request(&query_payload(Op::Pause)).unwrap().op,
            Op::Pause
        );
        // Credentials made for something else: Slurm's RPCs (no payload), bft-run's
        // handshake, another version of this protocol, a bare request.
        for p in [
            "",
            "bftrainer-run:v2 agent job=7 run=r to=h:1 nonce=n anonce=a",
            r#"bftrainer-query:v2 {"v":1,"op":"status"}"#,
            r#"{"v":1,"op":"status"}"#,
        ] {
            let e = query_request(p).unwrap_err();
            assert!(e.contains("not made for a bftrainerd query"), "{p:?}: {e}");
        }
        let e = query_request(r#"bftrainer-query:v1 {"v":1,"op":"halt"}"#).unwrap_err();
        assert!(e.contains("expected op one of"), "{e}");
        for line in [
            &b""[..],
            b"   \n",
            b"\xff\xfe",
            b"{\"v\":1,\"op\":\"status\"}",
            b"MUNGE:",
            b"MUNGE:ab cd",
        ] {
            let e = credential(line).unwrap_err();
            assert!(
                e.contains("one line holding a MUNGE credential"),
                "{line:?}: {e}"
            );
        }
        assert_eq!(credential(b"MUNGE:AwQDAAB=:\n").unwrap(), "MUNGE:AwQDAAB=:");
    }

    #[tokio::test]
    async fn over_the_query_endpoint_admin_verbs_are_refused_and_admins_are_users() {
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let (atx, mut arx) = mpsc::channel(1);
        let shared = Shared {
            snapshot: rx,
            admin: atx,
            admins: vec![0, 64030],
        };
        for op in [Op::Pause, Op::Drain, Op::Resume] {
            let req = Request { v: PROTOCOL, op };
            let r = dispatch(req, Caller::Remote { uid: 0 }, &shared).await;
            let e = r.error.unwrap();
            assert!(
                !r.ok && e.contains("the query endpoint is read-only"),
                "{e}"
            );
        }
        assert!(arx.try_recv().is_err(), "nothing reached the main loop");
        // Root over the network: only root's jobs (none), no holder of another's node.
        let jobs = Request {
            v: PROTOCOL,
            op: Op::Jobs {
                user: None,
                job_ids: vec![],
                history: false,
            },
        };
        let r = dispatch(jobs.clone(), Caller::Remote { uid: 0 }, &shared).await;
        assert_eq!(r.data.unwrap(), serde_json::json!([]));
        let r = dispatch(jobs.clone(), Caller::Local { uid: 0 }, &shared).await;
        assert_eq!(r.data.unwrap().as_array().unwrap().len(), 2);
        // A user: the same answer through both doors.
        for op in [jobs.op.clone(), Op::Nodes, Op::Status] {
            let req = Request { v: PROTOCOL, op };
            let local = dispatch(req.clone(), Caller::Local { uid: 1001 }, &shared).await;
            let remote = dispatch(req, Caller::Remote { uid: 1001 }, &shared).await;
            assert_eq!(local.data, remote.data);
        }
        let req = Request {
            v: PROTOCOL,
            op: Op::Nodes,
        };
        let nodes = dispatch(req, Caller::Remote { uid: 0 }, &shared)
            .await
            .data
            .unwrap();
        assert!(
            nodes
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["holder"].is_null()),
            "{nodes}"
        );
    }

    /// A stand-in for munged: `MUNGE:<uid>:<payload>`, each decoded once.
    fn fake_decoder() -> Decoder {
        let seen = Mutex::new(HashSet::new());
        Arc::new(move |cred: &str| {
            if !seen.lock().unwrap().insert(cred.to_string()) {
                return Err("replayed credential".into());
            }
            let (uid, payload) = cred
                .strip_prefix("MUNGE:")
                .and_then(|r| r.split_once(':'))
                .ok_or("invalid credential (munge status 8)")?;
            Ok(Decoded {
                uid: uid.parse().map_err(|_| "invalid credential")?,
                payload: payload.replace('~', " "),
            })
        })
    }

    /// A stand-in for `munge` run by `uid`: `MUNGE:<uid>:<payload>`.
    fn fake_prover(uid: u32) -> Prover {
        Arc::new(move |payload: &str| Ok(format!("MUNGE:{uid}:{}", payload.replace(' ', "~"))))
    }

    /// Issue 33, item 14: the client asks the server to prove it is root before it
    /// sends its credential. The genuine endpoint passes; a squatter's own credential
    /// (any uid but root's), a genuine proof relayed from another connection, a
    /// server that answers without a proof and one that answers nothing are refused,
    /// and none of them receives anything of the client's but its hello.
    #[tokio::test]
    async fn the_client_sends_its_credential_only_to_a_server_proven_root() {
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let genuine = l.local_addr().unwrap();
        tokio::spawn(serve_query_with(
            l,
            rx,
            fake_decoder(),
            fake_prover(0),
            Limits::default(),
        ));
        let decoder = fake_decoder();
        let ask = |server: String| {
            let decoder = decoder.clone();
            tokio::task::spawn_blocking(move || {
                call_query_with(
                    &server,
                    Op::Status,
                    Duration::from_secs(5),
                    &|p| Ok(format!("MUNGE:1001:{}", p.replace(' ', "~"))),
                    &|c| decoder(c),
                )
            })
        };
        let v = ask(genuine.to_string()).await.unwrap().unwrap();
        assert!(v.get("counts").is_some(), "{v}");

        // Squatters: each records what it received, answers its way, then waits for
        // whatever else the client sends.
        let relay_nonce = "00112233445566778899aabbccddeeff";
        let relayed = fake_prover(0)(&proof_payload(relay_nonce, genuine)).unwrap();
        type Answer = Box<dyn Fn(&str, std::net::SocketAddr) -> String + Send + Sync>;
        let answers: [(&str, Answer); 6] = [
            (
                "made by uid 1000, not root",
                Box::new(|nonce, local| fake_prover(1000)(&proof_payload(nonce, local)).unwrap()),
            ),
            (
                "not for this connection",
                Box::new(move |nonce, _| fake_prover(0)(&proof_payload(nonce, genuine)).unwrap()),
            ),
            (
                "not for this connection",
                Box::new(move |_, _| relayed.clone()),
            ),
            (
                "a bftrainerd older than this client",
                Box::new(|_, _| {
                    r#"{"v":1,"ok":false,"error":"bad request: the query endpoint takes one line holding a MUNGE credential"}"#.into()
                }),
            ),
            (
                "answered without a proof (busy)",
                Box::new(|_, _| r#"{"v":1,"ok":false,"error":"busy"}"#.into()),
            ),
            ("answered nothing", Box::new(|_, _| String::new())),
        ];
        for (want, answer) in answers {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let squatter = std::thread::spawn(move || {
                use std::io::{BufRead, Read, Write};
                let (mut s, _) = l.accept().unwrap();
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut hello = String::new();
                r.read_line(&mut hello).unwrap();
                let nonce = hello
                    .trim()
                    .strip_prefix(HELLO.trim_end())
                    .unwrap()
                    .trim()
                    .to_string();
                let a = answer(&nonce, s.local_addr().unwrap());
                if !a.is_empty() {
                    s.write_all(format!("{a}\n").as_bytes()).unwrap();
                } else {
                    s.shutdown(std::net::Shutdown::Write).unwrap();
                }
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                (hello, rest)
            });
            let e = ask(addr.to_string()).await.unwrap().unwrap_err();
            assert!(
                e.contains("did not prove it is bftrainerd (root)") && e.contains(want),
                "{want}: {e}"
            );
            let (hello, rest) = squatter.join().unwrap();
            assert!(hello.starts_with(HELLO), "{hello}");
            assert!(rest.is_empty(), "{want}: the client sent {rest:?}");
        }
    }

    fn fake_cred(uid: u32, op: Op) -> String {
        format!("MUNGE:{uid}:{}", query_payload(op).replace(' ', "~"))
    }

    /// One line to the endpoint at `addr`, its answer.
    async fn ask(addr: std::net::SocketAddr, line: &str) -> Response {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    #[tokio::test]
    async fn the_query_endpoint_answers_the_credentials_uid_once() {
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve_query_with(
            l,
            rx,
            fake_decoder(),
            fake_prover(0),
            Limits::default(),
        ));
        let jobs = Op::Jobs {
            user: None,
            job_ids: vec![],
            history: false,
        };
        let cred = fake_cred(1002, jobs.clone());
        let r = ask(addr, &cred).await;
        assert!(r.ok, "{r:?}");
        let ids: Vec<u64> = r
            .data
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [9], "bob's job only");
        // The same line again: munged says replay.
        let r = ask(addr, &cred).await;
        assert_eq!(
            r.error.as_deref(),
            Some("credential refused: replayed credential")
        );
        // Admin verbs, garbage, a plain JSON request, a credential for another purpose.
        let r = ask(addr, &fake_cred(0, Op::Drain)).await;
        assert!(r.error.unwrap().contains("read-only"));
        for (line, want) in [
            ("hello", "one line holding a MUNGE credential"),
            (
                r#"{"v":1,"op":"status"}"#,
                "one line holding a MUNGE credential",
            ),
            ("MUNGE:garbage", "credential refused: invalid credential"),
            (
                "MUNGE:1001:bftrainer-run:v2~agent",
                "not made for a bftrainerd query",
            ),
        ] {
            let r = ask(addr, line).await;
            let e = r.error.unwrap_or_default();
            assert!(!r.ok && e.contains(want), "{line}: {e}");
        }
        let r = ask(addr, &fake_cred(1001, Op::Status)).await;
        assert!(r.ok && r.data.unwrap().get("counts").is_some());
    }

    #[tokio::test]
    async fn the_query_endpoint_caps_an_address_before_its_credential_is_checked() {
        let (_tx, rx) = watch::channel(Arc::new(snap()));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = Limits {
            total: 8,
            admin_reserved: 0,
            per_uid: 2,
            per_peer: 2,
        };
        tokio::spawn(serve_query_with(
            l,
            rx,
            fake_decoder(),
            fake_prover(0),
            limits,
        ));
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        let e = loop {
            n += 1;
            let r = ask(addr, &fake_cred(1001, Op::Status)).await;
            match r.error {
                Some(e) if e.contains("too many connections") => break e,
                _ if std::time::Instant::now() > deadline => panic!("{r:?}"),
                _ => tokio::task::yield_now().await,
            }
        };
        assert!(
            e.contains(
                "address 127.0.0.1 has 2 requests in progress, the most one address may have"
            ),
            "{e}"
        );
        drop(idle);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            n += 1;
            let r = ask(addr, &fake_cred(1001, Op::Nodes)).await;
            if r.ok {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{r:?} after {n}");
            // Each credential is decoded once: a new one per try.
            let _ = ask(addr, &fake_cred(1001 + n, Op::Status)).await;
        }
    }
}
