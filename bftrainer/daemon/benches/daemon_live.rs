//! bftrainerd live on a 4-node test cluster (docs/benchmarks.md): node idle -> satellite
//! running, node claimed -> regular job running (against GraceTime), the daemon's CPU
//! and RSS at rest and under churn, and the same claim without the daemon (an
//! elastic-partition job doing its work in the batch shell, and in a step).
//!
//!   cargo build --release -p job_submit_bftrainer -p spank_bftrainer -p bftrainer-daemon
//!   cargo bench -p bftrainer-daemon --bench daemon_live -- [--rounds N]

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use bftrainer_daemon::daemon::control;
use bftrainer_testcluster::{Cluster, Options};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn squeue(c: &Cluster) -> Vec<(u32, String, String, String)> {
    c.run("squeue", &["-h", "-a", "-o", "%i|%j|%T|%N"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() == 4).then(|| {
                (
                    f[0].parse().unwrap_or(0),
                    f[1].into(),
                    f[2].into(),
                    f[3].into(),
                )
            })
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

fn wait(secs: f64, what: &str, mut f: impl FnMut() -> bool) -> f64 {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed().as_secs_f64() < secs,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed().as_secs_f64()
}

/// utime + stime of `pid` in seconds, and its RSS in MB.
fn usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    let cpu = (f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0))
        / tick;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0;
    (cpu, rss)
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Calls `status` on the control socket and scrapes the metrics every 100 ms in a
/// thread, recording each round trip, until stopped.
struct Probe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<f64>, Vec<f64>)>,
}

impl Probe {
    fn start(socket: std::path::PathBuf, port: u16) -> Probe {
        use std::io::{Read, Write};
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut status, mut scrape) = (Vec::new(), Vec::new());
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                control::call(&socket, control::Op::Status, Duration::from_secs(5))
                    .expect("status");
                status.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n")
                    .unwrap();
                let mut out = String::new();
                c.read_to_string(&mut out).unwrap();
                assert!(out.contains("bftrainer_nodes"));
                scrape.push(t.elapsed().as_secs_f64());
                std::thread::sleep(Duration::from_millis(100));
            }
            (status, scrape)
        });
        Probe { stop, thread }
    }

    fn stop(self) -> (Vec<f64>, Vec<f64>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

fn main() {
    let rounds = live::arg("--rounds", 10);
    let setup = live::setup("bftbench", "", "", "");
    let (dir, plugins, conf) = (setup.dir.clone(), setup.plugins.clone(), setup.conf.clone());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(
        &conf,
        format!("{text}[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let socket = setup.state.join("bftrainerd.sock");
    let c = Cluster::start(Options {
        nodes: 4,
        plugins: Some(plugins),
        bftrainer_conf: Some(conf.clone()),
        name: Some("bench-daemon-live".into()),
        ..Default::default()
    })
    .expect("test cluster");
    let log = std::fs::File::create(dir.join("bftrainerd.log")).unwrap();
    let mut daemon: Child = c
        .command(env!("CARGO_BIN_EXE_bftrainerd"))
        .arg("--config")
        .arg(&conf)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let pid = daemon.id();

    // An elastic job 1:4 of bftuser: submission -> all four nodes.
    let t0 = Instant::now();
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
    let job: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("elastic job id");
    let sat = format!("bftsat-{job}");
    let running_sats = |c: &Cluster| -> Vec<String> {
        squeue(c)
            .into_iter()
            .filter(|r| r.1 == sat && r.2 == "RUNNING")
            .map(|r| r.3)
            .collect()
    };
    wait(60.0, "the elastic job to grow onto all nodes", || {
        running_sats(&c).len() == 3
    });
    let grown = t0.elapsed().as_secs_f64();

    // At rest (status and scrapes probed every 100 ms, as under churn).
    let (cpu0, _) = usage(pid);
    let probe = Probe::start(socket.clone(), port);
    std::thread::sleep(Duration::from_secs(20));
    let (rest_status, rest_scrape) = probe.stop();
    let (cpu1, rss_rest) = usage(pid);
    let rest_cpu = (cpu1 - cpu0) / 20.0 * 100.0;

    // Churn: a 1-node regular job claims a node, ends, the node is lent again.
    let mut claim = Vec::new();
    let mut regrow = Vec::new();
    let (cpu2, _) = usage(pid);
    let t_churn = Instant::now();
    let mut rss_churn: f64 = 0.0;
    let probe = Probe::start(socket.clone(), port);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = c
            .sbatch(&[
                "-p",
                "batch",
                "-N1",
                "--exclusive",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 3",
            ])
            .unwrap();
        wait(30.0, "the regular job to start", || {
            state(&c, r) == "RUNNING"
        });
        claim.push(t.elapsed().as_secs_f64());
        let node = squeue(&c)
            .into_iter()
            .find(|x| x.0 == r)
            .map(|x| x.3)
            .unwrap_or_default();
        wait(30.0, "the regular job to end", || {
            state(&c, r) == "COMPLETED"
        });
        let t = Instant::now();
        wait(60.0, "the node to be lent again", || {
            running_sats(&c).contains(&node)
        });
        regrow.push(t.elapsed().as_secs_f64());
        rss_churn = rss_churn.max(usage(pid).1);
    }
    let (churn_status, churn_scrape) = probe.stop();
    // The command itself (a process start, config read, one round trip).
    let mut cli = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let o = c
            .command(env!("CARGO_BIN_EXE_bftrainer"))
            .args(["status", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        assert!(o.status.success());
        cli.push(t.elapsed().as_secs_f64());
    }
    let (cpu3, _) = usage(pid);
    let churn_cpu = (cpu3 - cpu2) / t_churn.elapsed().as_secs_f64() * 100.0;

    println!("bftrainerd live, 4-node test cluster, GraceTime 5 s, poll 0.5 s, {rounds} rounds");
    println!("elastic job 1:4 submitted -> on all 4 nodes: {grown:.1} s");
    println!("node claimed -> regular job running (1 node, with bftrainerd): p50 {:.2} s, p99 {:.2} s, max {:.2} s", pct(&claim, 0.5), pct(&claim, 0.99), pct(&claim, 1.0));
    println!(
        "node idle -> satellite running on it: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        pct(&regrow, 0.5),
        pct(&regrow, 0.99),
        pct(&regrow, 1.0)
    );
    println!("bftrainerd CPU: {rest_cpu:.2}% of a core at rest (20 s), {churn_cpu:.2}% under churn; RSS {rss_rest:.1} MB at rest, {rss_churn:.1} MB under churn (control socket and metrics probed every 100 ms)");
    for (what, rest, churn) in [
        (
            "status round trip over the socket",
            &rest_status,
            &churn_status,
        ),
        (
            "metrics scrape (HTTP GET /metrics)",
            &rest_scrape,
            &churn_scrape,
        ),
    ] {
        println!(
            "{what}: at rest p50 {:.2} ms, p99 {:.2} ms ({} calls, baseline); under churn p50 {:.2} ms, p99 {:.2} ms ({} calls) = {:.2}x / {:.2}x rest",
            pct(rest, 0.5) * 1e3,
            pct(rest, 0.99) * 1e3,
            rest.len(),
            pct(churn, 0.5) * 1e3,
            pct(churn, 0.99) * 1e3,
            churn.len(),
            pct(churn, 0.5) / pct(rest, 0.5),
            pct(churn, 0.99) / pct(rest, 0.99)
        );
    }
    println!(
        "`bftrainer status` command (process start + round trip), 20 runs: p50 {:.1} ms, max {:.1} ms",
        pct(&cli, 0.5) * 1e3,
        pct(&cli, 1.0) * 1e3
    );

    // Without the daemon: the same claim of 2 nodes held by an elastic-partition job.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    daemon.wait().unwrap();
    c.run("scancel", &[&job.to_string()]).unwrap();
    c.run("scancel", &["-n", &sat]).unwrap();
    wait(30.0, "the cluster to drain", || {
        squeue(&c).iter().all(|r| r.2 != "RUNNING")
    });
    std::thread::sleep(Duration::from_secs(2));
    let mut without = Vec::new();
    for (what, wrap) in [
        ("work in the batch shell", "sleep 3600"),
        ("work in an srun step", "srun sleep 3600"),
    ] {
        let e = c
            .sbatch(&[
                "-p",
                "elastic",
                "-N4",
                "--exclusive",
                "-o",
                "/dev/null",
                "--wrap",
                wrap,
            ])
            .unwrap();
        wait(30.0, "the elastic-partition job to run", || {
            state(&c, e) == "RUNNING"
        });
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
        wait(120.0, "the regular job to start", || {
            matches!(
                state(&c, r).as_str(),
                "RUNNING" | "COMPLETED" | "COMPLETING"
            )
        });
        without.push((what, t.elapsed().as_secs_f64()));
        c.run("scancel", &[&e.to_string()]).unwrap();
        wait(60.0, "the cluster to drain", || {
            squeue(&c).iter().all(|x| x.2 != "RUNNING")
        });
        std::thread::sleep(Duration::from_secs(3));
    }

    for (what, t) in &without {
        println!("without bftrainerd, a 2-node regular job onto an elastic-partition job ({what}): {t:.1} s");
    }
    c.stop().unwrap();
}
