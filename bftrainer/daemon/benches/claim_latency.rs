//! What harvesting costs a regular job (issue 20, "Performance"): the same 2-node
//! regular job submitted, in one run on one 4-node test cluster with bftrainerd, onto
//! nodes lent to an elastic job (its satellites; Slurm preempts them) and onto idle
//! nodes (lending drained: the elastic job keeps only its core), the two kinds of round
//! alternating. Prints submit -> RUNNING for each kind, p50/p99/max and the
//! difference, measured twice: by this process (sbatch started -> `scontrol` shows it
//! RUNNING, polled every 20 ms) and by slurmctld's log (the submit RPC -> the
//! allocation, milliseconds), and for the lent rounds where the time went (satellites'
//! batch scripts done, then the allocation).
//!
//!   cargo build --release -p job_submit_bftrainer -p spank_bftrainer -p bftrainer-daemon
//!   cargo bench -p bftrainer-daemon --bench claim_latency -- [--rounds N] [--no-epilog]
//!
//! `--rounds N`: N submissions of each kind (default 20). `--no-epilog`: the test
//! cluster without its `Epilog=/bin/true` (docs/admin.md, "How long a regular job
//! waits for lent nodes"), to see that lever alone. `--keep-logs DIR`: slurmctld at
//! debug2 with DebugFlags=Backfill,Steps,TraceJobs (every preemption and scheduling
//! pass, in milliseconds), its log and bftrainerd's copied to DIR at the end.
//! `--daemon PATH`: another build of bftrainerd (e.g. main's, for a before/after
//! with the same benchmark).
//!
//! slurmctld's scheduling passes run on 1-s ticks (its background loop, backfill's
//! bf_interval=1), and the rounds' rhythm would otherwise fix the phase at which each
//! kind is submitted: every submission waits first for a fraction of a second from a
//! low-discrepancy sequence (round k: frac(k x 0.618...)), the same for both kinds.

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use bftrainer_daemon::daemon::control;
use bftrainer_testcluster::{Cluster, Options};
use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

struct Row {
    id: u32,
    name: String,
    state: String,
    nodes: String,
}

fn squeue(c: &Cluster) -> Vec<Row> {
    c.run("squeue", &["-h", "-a", "-o", "%i|%j|%T|%N"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() == 4).then(|| Row {
                id: f[0].parse().unwrap_or(0),
                name: f[1].into(),
                state: f[2].into(),
                nodes: f[3].into(),
            })
        })
        .collect()
}

/// Node -> Slurm's short state (`idle`, `alloc`, `comp`, `mix`, ...).
fn node_states(c: &Cluster) -> BTreeMap<String, String> {
    c.run("sinfo", &["-h", "-N", "-p", "batch", "-o", "%N %t"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (n, s) = l.split_once(' ')?;
            Some((n.to_string(), s.trim().to_string()))
        })
        .collect()
}

fn state(c: &Cluster, id: u32) -> String {
    let out = c
        .run("scontrol", &["show", "job", "-o", &id.to_string()])
        .unwrap_or_default();
    out.split_whitespace()
        .find_map(|f| f.strip_prefix("JobState="))
        .unwrap_or("")
        .to_string()
}

fn wait(secs: f64, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed().as_secs_f64() < secs,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Seconds since the epoch of a slurmctld log line's `[YYYY-MM-DDTHH:MM:SS.mmm]`
/// (iso8601_ms, Slurm's default; the test cluster runs in UTC or local time alike,
/// only differences are used).
fn log_time(line: &str) -> Option<f64> {
    let ts = line.strip_prefix('[')?.split(']').next()?;
    let (date, time) = ts.split_once('T')?;
    let d: Vec<i64> = date.split('-').filter_map(|x| x.parse().ok()).collect();
    let (hms, ms) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').filter_map(|x| x.parse().ok()).collect();
    if d.len() != 3 || t.len() != 3 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms: f64 = format!("0.{ms}").parse().ok()?;
    Some((days * 86400 + t[0] * 3600 + t[1] * 60 + t[2]) as f64 + ms)
}

/// When slurmctld logged `needle` (the first line containing it), from its log.
fn logged(log: &str, needle: &str) -> Option<f64> {
    log.lines().find(|l| l.contains(needle)).and_then(log_time)
}

struct Sub {
    lent: bool,
    id: u32,
    client_s: f64,
    /// The satellites whose nodes the regular job took (lent rounds).
    sats: Vec<u32>,
}

fn main() {
    let rounds = live::arg("--rounds", 20);
    let no_epilog = std::env::args().any(|a| a == "--no-epilog");
    let args: Vec<String> = std::env::args().collect();
    let keep_logs = args
        .iter()
        .position(|a| a == "--keep-logs")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let daemon_bin = args
        .iter()
        .position(|a| a == "--daemon")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_bftrainerd").to_string());
    let setup = live::setup("bftclaim", "", "", "");
    let (dir, plugins, conf) = (setup.dir.clone(), setup.plugins.clone(), setup.conf.clone());
    let socket = setup.state.join("bftrainerd.sock");
    let c = Cluster::start(Options {
        nodes: 4,
        plugins: Some(plugins),
        bftrainer_conf: Some(conf.clone()),
        name: Some("bench-claim-latency".into()),
        ..Default::default()
    })
    .expect("test cluster");
    if no_epilog {
        let text = std::fs::read_to_string(c.slurm_conf()).unwrap();
        assert!(
            text.contains("\nEpilog="),
            "the test cluster has no Epilog line"
        );
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("Epilog=") {
                    format!("#{l}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(c.slurm_conf(), text).unwrap();
        c.run("scontrol", &["reconfigure"]).unwrap();
        wait(30.0, "the new config", || {
            c.run("scontrol", &["show", "config"])
                .unwrap_or_default()
                .lines()
                .any(|l| l.starts_with("Epilog ") && l.contains("(null)"))
        });
    }
    if keep_logs.is_some() {
        c.run("scontrol", &["setdebug", "debug2"]).unwrap();
        c.run("scontrol", &["setdebugflags", "+Backfill,Steps,TraceJobs"])
            .unwrap();
    }
    let epilog = c
        .run("scontrol", &["show", "config"])
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Epilog "))
        .map(|l| l.split('=').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_default();
    let log = std::fs::File::create(dir.join("bftrainerd.log")).unwrap();
    let mut daemon: Child = c
        .command(&daemon_bin)
        .arg("--config")
        .arg(&conf)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let admin = |op: control::Op| {
        control::call(&socket, op, Duration::from_secs(10)).expect("control socket");
    };

    let out = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args([
            "--parsable",
            "--elastic=1:4",
            "-J",
            "train",
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 36000",
        ])
        .output()
        .unwrap();
    let job: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("elastic job id");
    let sat = format!("bftsat-{job}");
    wait(60.0, "bftrainerd's control socket", || socket.exists());

    let mut subs: Vec<Sub> = Vec::new();
    for i in 0..2 * rounds {
        let lent = i % 2 == 0;
        // Settle: nothing but the elastic job, its satellites on every other node
        // (lent) or none and the other nodes idle (idle).
        let mut held: BTreeMap<String, u32> = BTreeMap::new();
        wait(120.0, "the cluster to settle", || {
            let q = squeue(&c);
            let others = q.iter().any(|r| r.id != job && r.name != sat);
            let sats: BTreeMap<String, u32> = q
                .iter()
                .filter(|r| r.name == sat && r.state == "RUNNING")
                .map(|r| (r.nodes.clone(), r.id))
                .collect();
            let pending_sats = q.iter().any(|r| r.name == sat && r.state != "RUNNING");
            let core_running = q.iter().any(|r| r.id == job && r.state == "RUNNING");
            let nodes = node_states(&c);
            let idle = nodes.values().filter(|s| s.as_str() == "idle").count();
            let busy = nodes.values().filter(|s| s.as_str() == "alloc").count();
            let ok = !others
                && !pending_sats
                && core_running
                && if lent {
                    sats.len() == 3 && busy == 4
                } else {
                    sats.is_empty() && idle == 3 && busy == 1
                };
            if ok {
                held = sats;
            }
            ok
        });
        // The same phase offsets for both kinds (round k of each waits the same).
        let k = (i / 2 + 1) as f64;
        std::thread::sleep(Duration::from_secs_f64((k * 0.618_033_988_75).fract()));
        let t = Instant::now();
        let r = c
            .sbatch(&[
                "-p",
                "batch",
                "-N2",
                "--exclusive",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 1",
            ])
            .unwrap();
        loop {
            let s = state(&c, r);
            if matches!(s.as_str(), "RUNNING" | "COMPLETING" | "COMPLETED") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "regular job {r} not running after 120 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let client_s = t.elapsed().as_secs_f64();
        let got = squeue(&c)
            .into_iter()
            .find(|x| x.id == r)
            .map(|x| x.nodes)
            .unwrap_or_default();
        let got = bftrainer_slurm::hostlist_expand(&got).unwrap_or_default();
        let sats: Vec<u32> = got.iter().filter_map(|n| held.get(n).copied()).collect();
        if lent {
            assert_eq!(
                sats.len(),
                2,
                "the regular job took {got:?}, satellites were on {held:?}"
            );
        }
        eprintln!(
            "round {:2} {}: job {r} running after {client_s:.3} s on {got:?}",
            i / 2 + 1,
            if lent { "lent" } else { "idle" }
        );
        subs.push(Sub {
            lent,
            id: r,
            client_s,
            sats,
        });
        wait(60.0, "the regular job to end", || {
            state(&c, r) == "COMPLETED"
        });
        // The next round is the other kind.
        admin(if lent {
            control::Op::Drain
        } else {
            control::Op::Resume
        });
    }

    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    daemon.wait().unwrap();
    let ctld_log = std::fs::read_to_string(c.log_dir().join("slurmctld.log")).unwrap();
    let mut by_kind: BTreeMap<bool, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let (mut to_sats_done, mut sats_done_to_start) = (Vec::new(), Vec::new());
    for s in &subs {
        let submit = logged(
            &ctld_log,
            &format!("_slurm_rpc_submit_batch_job: JobId={} ", s.id),
        );
        let start = logged(&ctld_log, &format!("Allocate JobId={} ", s.id))
            .or_else(|| logged(&ctld_log, &format!("Started JobId={} ", s.id)));
        let (Some(submit), Some(start)) = (submit, start) else {
            panic!("job {} not found in slurmctld's log", s.id);
        };
        let e = by_kind.entry(s.lent).or_default();
        e.0.push(s.client_s);
        e.1.push(start - submit);
        if s.lent {
            let done = s
                .sats
                .iter()
                .filter_map(|id| logged(&ctld_log, &format!("_job_complete: JobId={id} done")))
                .fold(f64::NEG_INFINITY, f64::max);
            if done.is_finite() {
                to_sats_done.push(done - submit);
                sats_done_to_start.push(start - done);
            }
        }
    }
    if let Some(d) = &keep_logs {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("slurmctld.log"), &ctld_log).unwrap();
        std::fs::copy(dir.join("bftrainerd.log"), d.join("bftrainerd.log")).unwrap();
        for n in c.nodes() {
            let f = format!("slurmd-{n}.log");
            let _ = std::fs::copy(c.log_dir().join(&f), d.join(&f));
        }
    }
    c.stop().unwrap();

    println!(
        "claim latency: 2-node regular job, submit -> RUNNING, 4-node test cluster, GraceTime {} s, bftrainerd polling 0.5 s, {rounds} rounds of each kind alternating, Epilog={epilog}, bftrainerd {daemon_bin}",
        live::GRACE_TIME_S
    );
    let (idle, lent) = (&by_kind[&false], &by_kind[&true]);
    for (what, i, l) in [
        (
            "sbatch started -> RUNNING seen (client, 20 ms polls)",
            &idle.0,
            &lent.0,
        ),
        (
            "submit RPC -> allocation (slurmctld's log)",
            &idle.1,
            &lent.1,
        ),
    ] {
        println!("{what}:");
        for (kind, v) in [("idle nodes", i), ("lent nodes", l)] {
            println!(
                "  {kind}: p50 {:.3} s, p99 {:.3} s, max {:.3} s, min {:.3} s (n={})",
                pct(v, 0.5),
                pct(v, 0.99),
                pct(v, 1.0),
                pct(v, 0.0),
                v.len()
            );
        }
        println!(
            "  lent - idle: p50 {:+.3} s, p99 {:+.3} s",
            pct(l, 0.5) - pct(i, 0.5),
            pct(l, 0.99) - pct(i, 0.99)
        );
    }
    if !to_sats_done.is_empty() {
        println!(
            "lent rounds, slurmctld's log: submit -> both satellites' batch scripts done p50 {:.3} s, p99 {:.3} s; -> allocation p50 {:.3} s, p99 {:.3} s",
            pct(&to_sats_done, 0.5),
            pct(&to_sats_done, 0.99),
            pct(&sats_done_to_start, 0.5),
            pct(&sats_done_to_start, 0.99)
        );
    }
}
