//! What bftrainerd costs slurmctld (docs/benchmarks.md, "Load on slurmctld"): `sdiag`'s
//! RPC counts per minute, by message type and by user, over the same window without
//! and with bftrainerd, under a queue of 10,000 pending jobs plus one running elastic
//! job, on the 4-node test cluster; and slurmctld's CPU over each window.
//!
//!   cargo build --release -p job_submit_bftrainer -p spank_bftrainer -p bftrainer-daemon
//!   cargo bench -p bftrainer-daemon --bench sdiag_load -- [--jobs N] [--window S] [--poll-ms MS]
//!
//! The queue is real jobs, one record each (not an array): held (`--hold`), waiting for
//! a start time a week away (`--begin`) and waiting on a held job (`--dependency`), in
//! equal parts, of two users. None can run, so the four nodes stay the elastic job's to
//! borrow. bftrainerd runs with the shipped defaults (conf/bftrainer.toml: poll every
//! 1 s, a full job load every 30 s) unless `--poll-ms` says otherwise. sdiag's counters
//! are reset (`sdiag -r`) at the start of each window and read once at its end; nothing
//! else talks to slurmctld in between, so the difference is bftrainerd's.

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use bftrainer_testcluster::{Cluster, Options};
use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One window's sdiag: (count, total_time in µs) per message type and per user.
#[derive(Default)]
struct Stats {
    by_type: BTreeMap<String, (u64, u64)>,
    by_user: BTreeMap<String, (u64, u64)>,
}

impl Stats {
    fn total(&self) -> (u64, u64) {
        self.by_type
            .values()
            .fold((0, 0), |(c, t), (c1, t1)| (c + c1, t + t1))
    }
}

/// Parses the two RPC tables of `sdiag`'s output (the same format in 22.05, 24.11 and
/// 26.05): `\tNAME ( ID) count:N ave_time:A total_time:T` under each table's heading.
fn parse_sdiag(text: &str) -> Stats {
    let mut s = Stats::default();
    let mut table = 0;
    for line in text.lines() {
        if line.starts_with("Remote Procedure Call statistics by message type") {
            table = 1;
            continue;
        }
        if line.starts_with("Remote Procedure Call statistics by user") {
            table = 2;
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            if !line.trim().is_empty() {
                table = 0;
            }
            continue;
        }
        let (Some(name), Some(count), Some(total)) = (
            line.split_whitespace().next(),
            field(line, "count:"),
            field(line, "total_time:"),
        ) else {
            continue;
        };
        let into = match table {
            1 => &mut s.by_type,
            2 => &mut s.by_user,
            _ => continue,
        };
        let e = into.entry(name.to_string()).or_default();
        e.0 += count;
        e.1 += total;
    }
    s
}

fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    (f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0))
        / tick
}

/// Resets sdiag, waits `window`, reads it: the window's RPCs and slurmctld's CPU share.
fn measure(c: &Cluster, window: Duration) -> (Stats, f64) {
    let ctld = c.daemon_pid("slurmctld").expect("slurmctld's pid");
    c.run("sdiag", &["-r"]).expect("sdiag -r");
    let (t, cpu) = (Instant::now(), cpu_seconds(ctld));
    std::thread::sleep(window);
    let text = c.run("sdiag", &[] as &[&str]).expect("sdiag");
    let share = (cpu_seconds(ctld) - cpu) / t.elapsed().as_secs_f64() * 100.0;
    (parse_sdiag(&text), share)
}

fn running_satellites(c: &Cluster, parent: u32) -> usize {
    let name = format!("bftsat-{parent}");
    c.run("squeue", &["-h", "-t", "R", "-n", &name, "-o", "%i"])
        .unwrap_or_default()
        .lines()
        .count()
}

fn main() {
    let jobs = live::arg("--jobs", 10_000);
    let window = Duration::from_secs(live::arg("--window", 120) as u64);
    let poll_ms = live::arg("--poll-ms", 1000);
    let threads = live::arg("--submitters", 8);
    let per_min = |n: u64| n as f64 * 60.0 / window.as_secs_f64();

    let setup = live::setup("bftsdiag", "", "", "");
    // The shipped poll interval, not the tests' quick one.
    let text = std::fs::read_to_string(&setup.conf).unwrap();
    let text = text.replace(
        "poll_interval = 0.5",
        &format!("poll_interval = {}", poll_ms as f64 / 1000.0),
    );
    std::fs::write(&setup.conf, text).unwrap();
    let c = Cluster::start(Options {
        nodes: 4,
        plugins: Some(setup.plugins.clone()),
        bftrainer_conf: Some(setup.conf.clone()),
        name: Some("bench-sdiag-load".into()),
        ..Default::default()
    })
    .expect("test cluster");
    // Slurm's default MaxJobCount (10,000) would refuse the queue's last jobs, and
    // slurmctld reads it only at start.
    c.stop_daemon("slurmctld", false).expect("stop slurmctld");
    let conf = std::fs::read_to_string(c.slurm_conf()).unwrap();
    std::fs::write(
        c.slurm_conf(),
        format!("{conf}\nMaxJobCount={}\n", jobs + 1000),
    )
    .unwrap();
    c.start_daemon("slurmctld").expect("start slurmctld");
    let version = c.slurm_version().unwrap_or_default();

    // The elastic job first: held by job_submit/bftrainer until bftrainerd admits it.
    let out = c
        .command_as_test_user("sbatch")
        .unwrap()
        .args([
            "--parsable",
            "--elastic=1:4",
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 3600",
        ])
        .output()
        .unwrap();
    let elastic: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("elastic job: {}", String::from_utf8_lossy(&out.stderr)));

    // The queue: a held anchor each dependent job waits on, then the rest in parallel.
    let anchor = c
        .sbatch(&["--hold", "-p", "batch", "-o", "/dev/null", "--wrap", "true"])
        .expect("anchor job");
    let t0 = Instant::now();
    let next = AtomicUsize::new(1);
    let failed = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    break;
                }
                let user = if i % 2 == 0 { "bftuser" } else { "bftuser2" };
                let why = match i % 3 {
                    0 => "--hold".to_string(),
                    1 => "--begin=now+7days".to_string(),
                    _ => format!("--dependency=afterok:{anchor}"),
                };
                let ok = c
                    .command_as(user, "sbatch")
                    .unwrap()
                    .args([
                        "--parsable",
                        "-p",
                        "batch",
                        "-o",
                        "/dev/null",
                        &why,
                        "--wrap",
                        "true",
                    ])
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false);
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let failed = failed.into_inner();
    assert_eq!(failed, 0, "{failed} submissions failed");
    let submit_s = t0.elapsed().as_secs_f64();
    let pending = c
        .run("squeue", &["-h", "-t", "PD", "-o", "%i"])
        .unwrap()
        .lines()
        .count();
    eprintln!("queue: {pending} pending jobs, submitted in {submit_s:.0} s");

    // Without bftrainerd: the queue and the elastic job waiting for its admission.
    std::thread::sleep(Duration::from_secs(5));
    let (without, cpu_without) = measure(&c, window);

    // With bftrainerd, once the elastic job holds all four nodes.
    let log = std::fs::File::create(setup.dir.join("bftrainerd.log")).unwrap();
    let mut daemon: Child = c
        .command(env!("CARGO_BIN_EXE_bftrainerd"))
        .arg("--config")
        .arg(&setup.conf)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let t = Instant::now();
    while running_satellites(&c, elastic) < 3 {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the elastic job did not grow onto the 4 nodes in 300 s (log: {})",
            setup.dir.join("bftrainerd.log").display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let grown_s = t.elapsed().as_secs_f64();
    // Past the start-up's first full loads into the steady state.
    std::thread::sleep(Duration::from_secs(10));
    let (with, cpu_with) = measure(&c, window);
    let daemon_cpu = {
        let s = cpu_seconds(daemon.id());
        s / Instant::now().duration_since(t).as_secs_f64() * 100.0
    };

    println!(
        "slurmctld load, Slurm {version}, 4-node test cluster, {pending} pending jobs (held, \
         --begin, --dependency; 2 users) + 1 elastic job (4 nodes with bftrainerd), \
         bftrainerd poll {:.1} s, window {} s each; submitted in {submit_s:.0} s; grown in {grown_s:.1} s",
        poll_ms as f64 / 1000.0,
        window.as_secs()
    );
    println!(
        "{:<44} {:>12} {:>12} {:>10} {:>14} {:>14}",
        "RPC type", "without/min", "with/min", "diff/min", "ms/min without", "ms/min with"
    );
    let mut types: Vec<&String> = without.by_type.keys().chain(with.by_type.keys()).collect();
    types.sort();
    types.dedup();
    for ty in types {
        let (a, at) = without.by_type.get(ty).copied().unwrap_or_default();
        let (b, bt) = with.by_type.get(ty).copied().unwrap_or_default();
        println!(
            "{ty:<44} {:>12.1} {:>12.1} {:>+10.1} {:>14.2} {:>14.2}",
            per_min(a),
            per_min(b),
            per_min(b) - per_min(a),
            per_min(at) / 1000.0,
            per_min(bt) / 1000.0
        );
    }
    println!("{:<44} {:>12} {:>12}", "user", "without/min", "with/min");
    let mut users: Vec<&String> = without.by_user.keys().chain(with.by_user.keys()).collect();
    users.sort();
    users.dedup();
    for u in users {
        let (a, _) = without.by_user.get(u).copied().unwrap_or_default();
        let (b, _) = with.by_user.get(u).copied().unwrap_or_default();
        println!("{u:<44} {:>12.1} {:>12.1}", per_min(a), per_min(b));
    }
    let (a, at) = without.total();
    let (b, bt) = with.total();
    println!(
        "all RPCs: without {:.1}/min ({:.1} ms of slurmctld's RPC time/min), with {:.1}/min \
         ({:.1} ms/min): {:.2}x the count, {:.2}x the time",
        per_min(a),
        per_min(at) / 1000.0,
        per_min(b),
        per_min(bt) / 1000.0,
        b as f64 / a.max(1) as f64,
        bt as f64 / at.max(1) as f64
    );
    println!(
        "slurmctld CPU: {cpu_without:.2}% of a core without, {cpu_with:.2}% with; \
         bftrainerd's own CPU {daemon_cpu:.2}% of a core since its start"
    );

    // A yardstick an admin knows: what one user's plain `squeue` of this queue costs.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM bftrainerd");
    daemon.wait().unwrap();
    let runs = 5;
    c.run("sdiag", &["-r"]).expect("sdiag -r");
    for _ in 0..runs {
        c.command_as_test_user("squeue")
            .unwrap()
            .stdout(Stdio::null())
            .status()
            .expect("squeue");
    }
    let sq = parse_sdiag(&c.run("sdiag", &[] as &[&str]).expect("sdiag"));
    let (n, t) = sq
        .by_type
        .get("REQUEST_JOB_INFO")
        .copied()
        .unwrap_or_default();
    let per_squeue = t as f64 / n.max(1) as f64 / 1000.0;
    // bftrainerd's part: the window with it less the window without.
    let with_t = with.total().1.saturating_sub(without.total().1);
    println!(
        "yardstick: one `squeue` of this queue costs slurmctld {per_squeue:.1} ms of RPC time \
         ({n} REQUEST_JOB_INFO in {runs} runs); bftrainerd's {:.1} ms/min = {:.1} such squeue per minute",
        per_min(with_t) / 1000.0,
        per_min(with_t) / 1000.0 / per_squeue.max(1e-9)
    );
    c.stop().unwrap();
}
