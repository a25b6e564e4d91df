//! `bft-run rsh HOST CMD...`: the remote launcher of `--mode mpi` (Open MPI's
//! `plm_rsh_agent`). It asks the job's coordinator to have the agent of HOST run CMD
//! (an orted command line, run by `/bin/sh -c` as ssh would) inside that agent's
//! allocation, and relays its output and exit status. Only the running MPI world's
//! mpirun can ask: the coordinator checks this user's MUNGE credential and the
//! world's token (BFT_RSH_TOKEN, in mpirun's environment only); this side takes
//! answers only from a party proving to be the job's coordinator.

use crate::hosts::{self, Target};
use crate::proto::{self, brief};
use bftrainer_slurm::munge::Munge;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

/// Runs the command; the remote command's exit status (255 when the session is
/// lost, as ssh says it).
pub async fn run(host: String, cmd: Vec<String>) -> i32 {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(token), Some(coord), Some(job), Some(run)) = (
        env("BFT_RSH_TOKEN"),
        env("BFT_COORD"),
        env("BFT_JOB"),
        env("BFT_COORD_RUN"),
    ) else {
        say!("bft-run rsh: only the mpirun that bft-run --mode mpi starts can launch through it (BFT_RSH_TOKEN, BFT_COORD, BFT_JOB or BFT_COORD_RUN is not set)");
        return 2;
    };
    if !proto::is_id(&token) {
        say!("bft-run rsh: BFT_RSH_TOKEN is not a token");
        return 2;
    }
    let cmd = cmd.join(" ");
    if cmd.trim().is_empty() {
        say!("bft-run rsh: no command to run on {}", brief(&host));
        return 2;
    }
    let t = Target { coord, job, run };
    let munge = Munge::from_auth_info(env("BFT_MUNGE_SOCKET"), None);
    let extra = json!({"query": "rsh", "target": host, "token": token, "cmd": cmd});
    let opened =
        tokio::time::timeout(Duration::from_secs(30), hosts::handshake(&t, &munge, extra)).await;
    let (mut rd, _wr, answer) = match opened {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            say!("bft-run rsh: {e}");
            return 255;
        }
        Err(_) => {
            say!(
                "bft-run rsh: the coordinator at {} did not answer within 30 s",
                t.coord
            );
            return 255;
        }
    };
    if proto::t(&answer) != "rsh_ok" {
        say!(
            "bft-run rsh: unexpected answer {:?}",
            brief(proto::t(&answer))
        );
        return 255;
    }
    loop {
        let m = match proto::read_msg(&mut rd).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                say!(
                    "bft-run rsh: the coordinator closed the session on {}",
                    brief(&host)
                );
                return 255;
            }
            Err(e) => {
                say!("bft-run rsh: {e}");
                return 255;
            }
        };
        match proto::t(&m) {
            "rsh_out" => {
                let line = m.get("line").and_then(Value::as_str).unwrap_or("");
                let mut l = line.to_string();
                l.push('\n');
                if m.get("err").and_then(Value::as_bool).unwrap_or(false) {
                    let _ = std::io::stderr().lock().write_all(l.as_bytes());
                } else {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(l.as_bytes());
                    let _ = o.flush();
                }
            }
            "rsh_exit" => {
                let code = m.get("code").and_then(Value::as_i64).unwrap_or(255);
                return if code < 0 {
                    (128 - code).min(255) as i32
                } else {
                    code.min(255) as i32
                };
            }
            "error" => {
                let why = m.get("msg").and_then(Value::as_str).unwrap_or("?");
                say!("bft-run rsh: the coordinator says: {}", brief(why));
                return 255;
            }
            _ => {}
        }
    }
}
