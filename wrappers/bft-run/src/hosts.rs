//! `bft-run hosts`: asks the job's coordinator for its hosts and prints them as
//! `host:slots` lines (Horovod elastic's --host-discovery-script format). The query
//! is authenticated both ways as an agent's join is: the list comes only from a party
//! that proves, with a MUNGE credential of this user's uid, to be the job's
//! coordinator of this run.

use crate::proto::{self, brief, PROTO};
use bftrainer_core::runtime::RunComment;
use bftrainer_slurm::munge::Munge;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Where the coordinator is: its address, job and run.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub coord: String,
    pub job: String,
    pub run: String,
}

/// Runs the command; the process exit code.
pub async fn run(job: Option<u32>, addresses: bool) -> i32 {
    let found = tokio::task::spawn_blocking(move || find(job)).await;
    let (target, munge) = match found {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            say!("bft-run hosts: {e}");
            return 2;
        }
        Err(e) => {
            say!("bft-run hosts: {e}");
            return 1;
        }
    };
    match tokio::time::timeout(Duration::from_secs(30), query(&target, &munge)).await {
        Ok(Ok(hosts)) => {
            let mut out = String::new();
            for h in hosts {
                let name = if addresses { &h.addr } else { &h.node };
                out.push_str(&format!("{name}:{}\n", h.slots));
            }
            print!("{out}");
            0
        }
        Ok(Err(e)) => {
            say!("bft-run hosts: {e}");
            1
        }
        Err(_) => {
            say!(
                "bft-run hosts: the coordinator at {} did not answer within 30 s",
                target.coord
            );
            1
        }
    }
}

/// The coordinator: a worker's environment (BFT_COORD, BFT_JOB, BFT_COORD_RUN) names
/// it; else the Comment of `job` (or of SLURM_JOB_ID), as satellites find it.
pub fn find(job: Option<u32>) -> Result<(Target, Munge), String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let munge_env = env("BFT_MUNGE_SOCKET");
    if job.is_none() {
        if let (Some(coord), Some(job), Some(run)) =
            (env("BFT_COORD"), env("BFT_JOB"), env("BFT_COORD_RUN"))
        {
            return Ok((
                Target { coord, job, run },
                Munge::from_auth_info(munge_env, None),
            ));
        }
    }
    let id = match job {
        Some(j) => j,
        None => match env("SLURM_JOB_ID").map(|j| j.parse::<u32>()) {
            Some(Ok(j)) => j,
            Some(Err(_)) => return Err("SLURM_JOB_ID is not a job id".into()),
            None => {
                return Err(
                    "no coordinator to ask: not in a bft-run worker (BFT_COORD is not set) nor in a Slurm job (SLURM_JOB_ID); name the elastic job with --job"
                        .into(),
                )
            }
        },
    };
    let slurm = bftrainer_slurm::Slurm::init()
        .map_err(|e| format!("cannot use Slurm to find job {id}'s coordinator: {e}"))?;
    let munge = Munge::from_auth_info(munge_env, slurm.auth_info().ok().flatten().as_deref());
    let j = slurm
        .load_job(id)
        .map_err(|e| format!("cannot look up job {id}: {e}"))?;
    let c = j
        .comment
        .as_deref()
        .and_then(RunComment::parse)
        .filter(|c| crate::fresh_comment(c, j.start_time))
        .ok_or_else(|| {
            format!(
                "no coordinator in job {id}: its Comment names none of this run (not an elastic job run by bft-run, or not started yet)"
            )
        })?;
    Ok((
        Target {
            coord: c.coord,
            job: id.to_string(),
            run: c.run,
        },
        munge,
    ))
}

/// One host as the coordinator lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub node: String,
    pub addr: String,
    pub slots: u64,
}

/// Challenge, hello with this user's credential for this connection, and the list
/// with the coordinator's credential, checked before anything in it is used.
pub async fn query(t: &Target, munge: &Munge) -> Result<Vec<Host>, String> {
    let (_, _, answer) = handshake(t, munge, json!({"query": "hosts"})).await?;
    parse_hosts(&answer).map_err(|e| format!("coordinator at {}: {e}", t.coord))
}

/// The connection to the coordinator: its challenge, this user's hello (with
/// `extra`'s fields), and its answer, taken only with the coordinator's credential
/// for this connection. The connection stays open for what follows.
pub async fn handshake(
    t: &Target,
    munge: &Munge,
    extra: Value,
) -> Result<
    (
        BufReader<tokio::net::tcp::OwnedReadHalf>,
        tokio::net::tcp::OwnedWriteHalf,
        Value,
    ),
    String,
> {
    let lost = |e: String| format!("coordinator at {}: {e}", t.coord);
    let sock = TcpStream::connect(&t.coord).await.map_err(|e| {
        format!(
            "no coordinator at {} (job {}): {e}; is the job still running?",
            t.coord, t.job
        )
    })?;
    let host = sock
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let ch = proto::read_msg_max(&mut rd, proto::MAX_HELLO)
        .await
        .map_err(lost)?
        .ok_or_else(|| lost("closed the connection".into()))?;
    let their = ch.get("proto").and_then(Value::as_u64).unwrap_or(0);
    if proto::t(&ch) != "challenge" || their != PROTO {
        return Err(lost(format!(
            "it speaks protocol {their}, this bft-run {PROTO}; use the job's bft-run"
        )));
    }
    let job = proto::str_field(&ch, "job").map_err(lost)?;
    let run = proto::id_field(&ch, "run").map_err(lost)?;
    if job != t.job || run != t.run {
        return Err(lost(format!(
            "it answers for job {} run {}, not job {} run {} (a stale address?)",
            brief(job),
            brief(run),
            t.job,
            t.run
        )));
    }
    let nonce = proto::id_field(&ch, "nonce").map_err(lost)?.to_string();
    let anonce = proto::fresh_id();
    let me = nix::unistd::getuid().as_raw();
    let payload = proto::query_payload(&t.job, &t.run, &t.coord, &nonce, &anonce);
    let m = munge.clone();
    let cred = tokio::task::spawn_blocking(move || m.encode(&payload, me))
        .await
        .map_err(|e| e.to_string())??;
    let mut hello = json!({
        "t": "hello", "proto": PROTO, "cred": cred, "host": host, "anonce": anonce,
    });
    if let (Some(h), Value::Object(x)) = (hello.as_object_mut(), extra) {
        h.extend(x);
    }
    wr.write_all(proto::line(&hello).as_bytes())
        .await
        .map_err(|e| lost(format!("write failed: {e}")))?;
    let answer = proto::read_msg(&mut rd)
        .await
        .map_err(lost)?
        .ok_or_else(|| lost("closed the connection".into()))?;
    if proto::t(&answer) == "error" {
        let why = answer.get("msg").and_then(Value::as_str).unwrap_or("?");
        return Err(lost(format!("refused the query: {}", brief(why))));
    }
    let their_cred = proto::str_field(&answer, "cred").map_err(lost)?.to_string();
    let m = munge.clone();
    let d = tokio::task::spawn_blocking(move || m.decode(&their_cred))
        .await
        .map_err(|e| e.to_string())?
        .map_err(lost)?;
    if d.uid != me || d.payload != proto::coord_payload(&t.job, &t.run, &anonce) {
        return Err(lost(format!(
            "the party there is not job {}'s coordinator (its credential is uid {}'s or not made for this query); not using its answer",
            t.job, d.uid
        )));
    }
    Ok((rd, wr, answer))
}

/// The list in a coordinator's answer; names and addresses as `host:slots` allows.
fn parse_hosts(answer: &Value) -> Result<Vec<Host>, String> {
    let list = answer
        .get("hosts")
        .and_then(Value::as_array)
        .ok_or("an answer without a host list")?;
    list.iter()
        .map(|h| {
            let node = proto::str_field(h, "node")?;
            let addr = proto::str_field(h, "addr")?;
            let slots = proto::u64_field(h, "slots")?;
            let addr_ok = addr.parse::<std::net::IpAddr>().is_ok() || proto::is_node_name(addr);
            if !proto::is_node_name(node) || !addr_ok || slots == 0 || slots > 1 << 20 {
                return Err(format!(
                    "a host entry that is not a host and slots: {}",
                    brief(&h.to_string())
                ));
            }
            Ok(Host {
                node: node.to_string(),
                addr: addr.to_string(),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_are_checked_before_they_are_printed() {
        let ok = json!({"hosts": [
            {"node": "n1", "addr": "10.0.0.1", "slots": 4},
            {"node": "local-1", "addr": "127.0.0.1", "slots": 1},
        ]});
        let h = parse_hosts(&ok).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!((h[0].node.as_str(), h[0].slots), ("n1", 4));
        for bad in [
            json!({"hosts": [{"node": "n1;rm -rf /", "addr": "10.0.0.1", "slots": 1}]}),
            json!({"hosts": [{"node": "n1\nevil:9", "addr": "10.0.0.1", "slots": 1}]}),
            json!({"hosts": [{"node": "n1", "addr": "10.0.0.1 x", "slots": 1}]}),
            json!({"hosts": [{"node": "n1", "addr": "10.0.0.1", "slots": 0}]}),
            json!({"hosts": [{"node": "n1", "addr": "10.0.0.1"}]}),
            json!({"hosts": "n1:1"}),
        ] {
            assert!(parse_hosts(&bad).is_err(), "{bad}");
        }
    }
}
