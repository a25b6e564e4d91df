//! `bftrainer status|jobs|nodes|pause|drain|resume`: the daemon's client over its
//! control socket, or from a login node over its query endpoint (`--server`; read-only,
//! MUNGE-authenticated). Tables in the style of squeue/scontrol for people, `--json`
//! (the daemon's schema, docs/admin.md) for programs; the same whichever the door.

use crate::daemon::book::SizeChange;
use crate::daemon::control::{self, Op};
use crate::daemon::view::{JobView, NodeView, Snapshot};
use anyhow::{anyhow, Context};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Where the daemon is; shared by every client subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// bftrainerd's query endpoint, HOST:PORT (its `[daemon] query_listen`), for use
    /// from login nodes: status, jobs and nodes of your own jobs, authenticated with
    /// MUNGE; also $BFTRAINER_SERVER. Takes precedence over the socket.
    #[arg(long, value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// bftrainerd's control socket [default: `[daemon] socket` of the config, else
    /// STATE_DIR/bftrainerd.sock]; also $BFTRAINER_SOCKET.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The config that names the socket; also $BFTRAINER_CONFIG.
    #[arg(long, value_name = "FILE", default_value = "/etc/slurm/bftrainer.toml")]
    pub config: PathBuf,
    /// Print the daemon's answer as JSON (schema bftrainer.status/1).
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the daemon.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
}

impl Conn {
    fn socket(&self) -> anyhow::Result<PathBuf> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        if let Some(s) = std::env::var_os("BFTRAINER_SOCKET") {
            return Ok(s.into());
        }
        let path = std::env::var_os("BFTRAINER_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.config.clone());
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} to find bftrainerd's socket; pass --socket PATH",
                path.display()
            )
        })?;
        let cfg = crate::daemon::config::parse(&text, &path).map_err(|e| anyhow!("{e}"))?;
        Ok(cfg.socket)
    }

    /// The query endpoint to use: `--server`, else $BFTRAINER_SERVER unless `--socket`
    /// names a socket.
    fn server(&self) -> Option<String> {
        if self.server.is_some() {
            return self.server.clone();
        }
        if self.socket.is_some() {
            return None;
        }
        std::env::var("BFTRAINER_SERVER")
            .ok()
            .filter(|s| !s.trim().is_empty())
    }

    /// The cluster-wide lease as its directory shows it, when the config sets
    /// `[daemon] lease_dir` (a standby answers no status: this says who is active).
    fn lease_state(&self) -> Option<String> {
        let path = std::env::var_os("BFTRAINER_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.config.clone());
        let text = std::fs::read_to_string(&path).ok()?;
        let cfg = crate::daemon::config::parse(&text, &path).ok()?;
        let dir = cfg.lease_dir?;
        let l = crate::daemon::lease::Lease::new(&dir, "bftrainer-cli".into(), cfg.lease_s);
        Some(match l.and_then(|l| l.state()) {
            Ok(s) => format!("{} ({})", s.describe(), dir.display()),
            Err(e) => format!("cannot read the lease in {}: {e:#}", dir.display()),
        })
    }

    fn call(&self, op: Op) -> anyhow::Result<serde_json::Value> {
        let timeout = Duration::from_secs(self.timeout.max(1));
        if let Some(server) = self.server() {
            let munge = bftrainer_slurm::munge::Munge::for_this_host();
            return control::call_query(server.trim(), op, timeout, &munge).map_err(|e| anyhow!(e));
        }
        let socket = self.socket()?;
        control::call(&socket, op, timeout).map_err(|e| anyhow!(e))
    }
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Only this user's jobs (name or uid).
    #[arg(short = 'u', long)]
    pub user: Option<String>,
    /// Print each job's size over time (one line per change).
    #[arg(long)]
    pub history: bool,
    /// Only these jobs.
    pub job_ids: Vec<u32>,
}

#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub conn: Conn,
}

pub fn status(a: &StatusArgs) -> anyhow::Result<()> {
    let v = match a.conn.call(Op::Status) {
        Ok(v) => v,
        // Not answering here: on a standby of an HA pair, say who is active.
        Err(e) => match a.conn.lease_state() {
            Some(l) => anyhow::bail!("{e}\nLease: {l}"),
            None => return Err(e),
        },
    };
    if a.conn.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let s: Snapshot = serde_json::from_value(v).context("the daemon's status")?;
    print!("{}", status_text(&s));
    Ok(())
}

pub fn jobs(a: &JobsArgs) -> anyhow::Result<()> {
    let v = a.conn.call(Op::Jobs {
        user: a.user.clone(),
        job_ids: a.job_ids.clone(),
        history: a.history,
    })?;
    if a.conn.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let jobs: Vec<JobView> = serde_json::from_value(v).context("the daemon's job list")?;
    for id in &a.job_ids {
        if !jobs.iter().any(|j| j.job_id == *id) {
            eprintln!("bftrainer: job {id}: not an elastic job bftrainerd knows, or not yours");
        }
    }
    print!("{}", jobs_text(&jobs, a.history));
    if !a.job_ids.is_empty() && jobs.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

pub fn nodes(a: &NodesArgs) -> anyhow::Result<()> {
    let v = a.conn.call(Op::Nodes)?;
    if a.conn.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let nodes: Vec<NodeView> = serde_json::from_value(v).context("the daemon's node list")?;
    print!("{}", nodes_text(&nodes, crate::daemon::run::unix_now()));
    Ok(())
}

pub fn admin(a: &AdminArgs, op: Op) -> anyhow::Result<()> {
    let v = a.conn.call(op)?;
    if a.conn.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", v["message"].as_str().unwrap_or("done"));
    }
    Ok(())
}

/// Seconds as Slurm prints durations: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
pub fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{sec:02}")
    } else {
        format!("{m}:{sec:02}")
    }
}

/// Local time, as squeue and sacct print it.
fn time(t: f64) -> String {
    super::acct::local_time(t as i64)
}

/// `bftrainer status`, in scontrol's `Key=Value` style.
pub fn status_text(s: &Snapshot) -> String {
    let mut o = String::new();
    let c = &s.counts;
    let j = &s.jobs_by_state;
    let st = &s.stats;
    let _ = writeln!(
        o,
        "bftrainerd {} Uptime={} Lending={} Slurm={}",
        s.version,
        duration(s.time - s.started_at),
        s.lending.to_uppercase(),
        if s.slurm_reachable {
            "UP"
        } else {
            "NOT_RESPONDING"
        }
    );
    if let Some(g) = &s.growth_held {
        let _ = writeln!(
            o,
            "   GrowthHeld={}s Refusals={} Reason={}",
            (g.until - s.time).max(0.0).round(),
            g.refusals,
            g.reason
        );
    }
    if let Some(l) = &s.lease {
        let _ = writeln!(o, "   Lease: {l}");
    }
    if let Some(f) = &s.partition_fault {
        let _ = writeln!(o, "   LendingStopped: {f}");
    }
    let _ = writeln!(
        o,
        "   Nodes={} Idle={} Lent={} Reserved={} Busy={} Unavailable={}",
        c.total, c.idle, c.lent, c.reserved, c.busy, c.unavailable
    );
    let _ = writeln!(
        o,
        "   ElasticJobs Pending={} Running={} Waiting={} Finished={} Cancelled={}",
        j.pending, j.running, j.waiting, j.finished, j.cancelled
    );
    let _ = writeln!(
        o,
        "   Poll last={:.2}ms p50={:.2}ms p99={:.2}ms  Decision last={:.2}ms p50={:.2}ms p99={:.2}ms ({} cycles)",
        s.poll.last_ms,
        s.poll.p50_ms,
        s.poll.p99_ms,
        s.decision.last_ms,
        s.decision.p50_ms,
        s.decision.p99_ms,
        s.poll.samples
    );
    let _ = writeln!(
        o,
        "   Admits={} Grows={} Shrinks={} Requeues={} Preemptions={} SlurmErrors={} Harvested={:.2}node-h",
        st.admits,
        st.grows,
        st.shrinks,
        st.requeues,
        st.preemptions,
        st.slurm_errors,
        s.node_seconds_harvested / 3600.0
    );
    for p in &s.listen_problems {
        let _ = writeln!(o, "   NotListening: {p}");
    }
    match &s.last_error {
        Some(e) => {
            let _ = writeln!(o, "   LastError={} {}", time(e.time), e.message);
        }
        None => {
            let _ = writeln!(o, "   LastError=(none)");
        }
    }
    o
}

/// Left-aligned columns, squeue style: widths from the content, one space apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let mut o = String::new();
    let line = |o: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let _ = write!(l, "{c:<width$} ", width = w[i]);
        }
        let _ = writeln!(o, "{}", l.trim_end());
    };
    line(&mut o, &mut header.iter().copied());
    for r in rows {
        line(&mut o, &mut r.iter().map(String::as_str));
    }
    o
}

/// The BATCH cell: the global batch (decided, else reported), with the job's range:
/// `512(256:4096)`; `-` when neither is known.
fn batch_cell(batch: Option<u32>, range: Option<(u32, u32)>) -> String {
    match (batch, range) {
        (Some(b), Some((lo, hi))) => format!("{b}({lo}:{hi})"),
        (None, Some((lo, hi))) => format!("-({lo}:{hi})"),
        (Some(b), None) => b.to_string(),
        (None, None) => "-".into(),
    }
}

/// `bftrainer jobs`: one row per elastic job; with `history`, its size changes below.
/// A GPU job's measured sensitivity in one line: what its parts hold per GPU, and its
/// fitted rate per GPU at each CPU count (and memory level) measured.
fn sensitivity_line(j: &JobView) -> Option<String> {
    let s = j.sensitivity.as_ref()?;
    let mut line = format!("Job {}: per GPU", j.job_id);
    if let Some((cpus, mem)) = j.held_per_gpu {
        let _ = write!(line, " holds {cpus:.1} CPUs");
        // 1 MiB per GPU stands for "Slurm does not count memory" (no memory curve).
        if mem > 1.0 {
            let _ = write!(line, ", {mem:.0} MiB");
        }
        line.push(';');
    }
    let cpu: Vec<String> = s
        .cpu
        .iter()
        .map(|(x, r)| format!("{r:.1}/s at {x:.1} CPUs"))
        .collect();
    let _ = write!(line, " measured rate {}", cpu.join(", "));
    if !s.mem.is_empty() {
        let last = s.mem.last().map_or(1.0, |p| p.1);
        let mem: Vec<String> = s
            .mem
            .iter()
            .map(|(x, r)| format!("{:.0}% at {x:.0} MiB", 100.0 * r / last))
            .collect();
        let _ = write!(line, "; memory: {}", mem.join(", "));
    }
    let _ = write!(line, " ({} measurements)", j.measurements);
    Some(line)
}

pub fn jobs_text(jobs: &[JobView], history: bool) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.job_id.to_string(),
                j.user.clone().unwrap_or_else(|| j.uid.to_string()),
                j.state.to_uppercase(),
                format!("{}:{}", j.min_nodes, j.max_nodes),
                j.size.to_string(),
                j.rate.map_or("-".into(), |r| format!("{r:.1}")),
                batch_cell(j.batch, j.batch_range),
                j.grows.to_string(),
                j.shrinks.to_string(),
                j.preemptions.to_string(),
                format!("{:.2}", j.node_hours),
                if j.nodes.is_empty() {
                    "(none)".into()
                } else {
                    j.nodes.clone()
                },
                if j.satellites.is_empty() {
                    "-".into()
                } else {
                    j.satellites
                        .iter()
                        .map(|s| format!("{}@{}", s.job_id, s.node))
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ]
        })
        .collect();
    let mut o = table(
        &[
            "JOBID",
            "USER",
            "STATE",
            "MIN:MAX",
            "NODES",
            "RATE/S",
            "BATCH",
            "GROWS",
            "SHRINKS",
            "PREEMPT",
            "NODE-H",
            "NODELIST",
            "SATELLITES",
        ],
        &rows,
    );
    for j in jobs {
        if let Some(why) = &j.unservable {
            let _ = writeln!(o, "Job {}: not admitted: {why}", j.job_id);
        }
        if let Some(line) = sensitivity_line(j) {
            let _ = writeln!(o, "{line}");
        }
        if let (Some(until), Some(why)) = (j.paused_until, &j.pause_reason) {
            let _ = writeln!(
                o,
                "Job {}: growth paused until {} after failures of its own: {why}",
                j.job_id,
                time(until)
            );
        }
    }
    if history {
        for j in jobs {
            let h: &[SizeChange] = j.history.as_deref().unwrap_or(&[]);
            let _ = writeln!(
                o,
                "\nJob {} size history ({} changes{}):",
                j.job_id,
                h.len(),
                if j.history_dropped > 0 {
                    format!(", {} older ones dropped", j.history_dropped)
                } else {
                    String::new()
                }
            );
            let rows: Vec<Vec<String>> = h
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let until = h.get(i + 1).map(|n| n.t).or(j.ended_at);
                    let last_of_ended = i + 1 == h.len() && j.ended_at.is_some();
                    vec![
                        time(c.t),
                        c.nodes.to_string(),
                        if last_of_ended {
                            format!("({})", j.state)
                        } else {
                            until.map_or("(now)".into(), |u| duration(u - c.t))
                        },
                    ]
                })
                .collect();
            o.push_str(&table(&["TIME", "NODES", "FOR"], &rows));
        }
    }
    o
}

/// `bftrainer nodes`: one row per node of the elastic partitions.
pub fn nodes_text(nodes: &[NodeView], now: f64) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                n.state.to_uppercase(),
                n.holder.map_or("-".into(), |h| h.to_string()),
                n.reclaim_at.map_or("-".into(), |t| {
                    format!("{} (in {})", time(t), duration(t - now))
                }),
                match &n.set_aside {
                    Some(s) => format!("set aside until {}: {}", time(s.until), s.reason),
                    None => n.why.as_str().to_string(),
                },
            ]
        })
        .collect();
    table(&["NODE", "STATE", "HOLDER", "RECLAIM", "REASON"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_show_rate_and_batch() {
        let v: JobView = serde_json::from_value(serde_json::json!({
            "job_id": 7, "user": "ann", "uid": 1001, "min_nodes": 1, "max_nodes": 16,
            "state": "running", "nodes": "n[1-4]", "size": 4, "core_nodes": "n1",
            "satellites": [], "rate": 1234.56, "batch": 1024, "batch_range": [256, 4096],
            "admits": 1, "grows": 3, "shrinks": 0, "requeues": 0, "preemptions": 0,
            "largest": 4, "node_hours": 0.5, "submitted_at": 0.0, "ended_at": null
        }))
        .unwrap();
        let text = jobs_text(std::slice::from_ref(&v), false);
        let mut lines = text.lines();
        let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let col = |name: &str| row[head.iter().position(|h| *h == name).unwrap()];
        assert_eq!((col("RATE/S"), col("BATCH")), ("1234.6", "1024(256:4096)"));
        // Not decided yet, no range, nothing known.
        assert_eq!(batch_cell(None, Some((256, 4096))), "-(256:4096)");
        assert_eq!(batch_cell(Some(64), None), "64");
        let plain = JobView {
            rate: None,
            batch: None,
            batch_range: None,
            sensitivity: None,
            held_per_gpu: None,
            measurements: 0,
            ..v
        };
        let text = jobs_text(std::slice::from_ref(&plain), false);
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(&row[5..7], &["-", "-"]);
        assert_eq!(
            text.lines().count(),
            2,
            "no sensitivity line without a fit: {text}"
        );

        // A GPU job's measured sensitivity, one line under the table.
        let measured = JobView {
            sensitivity: Some(bftrainer_core::alloc::synergy::Sensitivity {
                cpu: vec![(2.0, 50.0), (4.0, 90.0)],
                mem: vec![(8192.0, 0.5), (16384.0, 1.0)],
            }),
            held_per_gpu: Some((4.0, 16384.0)),
            measurements: 5,
            ..plain.clone()
        };
        let text = jobs_text(&[measured], false);
        assert_eq!(
            text.lines().nth(2).unwrap(),
            "Job 7: per GPU holds 4.0 CPUs, 16384 MiB; measured rate 50.0/s at 2.0 CPUs, 90.0/s at 4.0 CPUs; memory: 50% at 8192 MiB, 100% at 16384 MiB (5 measurements)"
        );
        // Slurm not counting memory (1 MiB per GPU stands for it): no MiB shown.
        let no_mem = JobView {
            sensitivity: Some(bftrainer_core::alloc::synergy::Sensitivity {
                cpu: vec![(8.0, 120.0)],
                mem: vec![],
            }),
            held_per_gpu: Some((8.0, 1.0)),
            measurements: 1,
            ..plain
        };
        let text = jobs_text(&[no_mem], false);
        assert_eq!(
            text.lines().nth(2).unwrap(),
            "Job 7: per GPU holds 8.0 CPUs; measured rate 120.0/s at 8.0 CPUs (1 measurements)"
        );
    }
}
