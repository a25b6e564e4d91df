//! Operating bftrainerd live (four-node cluster, both plugins): `bftrainer status`,
//! `jobs`, `nodes` as root and as another user (who sees only their own jobs and may
//! not pause); `pause`, `drain` and `resume` acting on a real elastic job and holding
//! across a restart; the control socket and the metrics endpoint against garbage,
//! oversized, truncated, idle and vanishing clients; verbs and SIGTERM while slurmctld
//! hangs, and while it answers each of the daemon's calls 5 s late during a 20-node grow.

mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;

use live::Live;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bftrainer(l: &Live, args: &[&str]) -> Command {
    let mut c = l.c.command(env!("CARGO_BIN_EXE_bftrainer"));
    c.args(args).arg("--config").arg(&l.conf);
    c
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run bftrainer")
}

fn ok(l: &Live, args: &[&str]) -> String {
    let o = run(bftrainer(l, args));
    assert!(
        o.status.success(),
        "bftrainer {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(l: &Live, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(l, &a)).expect("--json output is JSON")
}

/// `bftrainer ARGS` as the test user (bftuser).
fn as_user(l: &Live, args: &[&str]) -> Output {
    let mut c =
        l.c.command_as_test_user(env!("CARGO_BIN_EXE_bftrainer"))
            .unwrap();
    c.args(args).arg("--config").arg(&l.conf);
    run(c)
}

fn socket(l: &Live) -> std::path::PathBuf {
    l.dir.join("state/bftrainerd.sock")
}

fn wait_socket(l: &Live) {
    l.wait(30, "the control socket", || {
        UnixStream::connect(socket(l)).ok().map(|_| ())
    });
}

#[test]
fn cluster_control_status_jobs_nodes_and_lending_verbs() {
    // The verbs are the subject: one user's job holds every node while root's job
    // waits, as without fair shares (which would split the four nodes 2/2; they have
    // their own live test in cluster_daemon).
    let mut l = Live::start_without_daemon("", "", "");
    let conf = std::fs::read_to_string(&l.conf).unwrap();
    assert!(conf.contains("[engine]\n"));
    std::fs::write(
        &l.conf,
        conf.replace("[engine]\n", "[engine]\nfair_share = false\n"),
    )
    .unwrap();
    l.spawn();
    wait_socket(&l);
    // bftuser charges this job to a second account: satellites must follow the core.
    l.c.run("sacctmgr", &["-i", "add", "account", "proj"])
        .unwrap();
    l.c.run(
        "sacctmgr",
        &["-i", "add", "user", "bftuser", "account=proj"],
    )
    .unwrap();
    let job = l.submit_elastic_with("1:4", &["-A", "proj"]);
    l.grown_to_all(job);
    let accounts = l.c.run("squeue", &["-h", "-a", "-o", "%j %a"]).unwrap();
    assert_eq!(
        accounts
            .lines()
            .filter(|r| *r == format!("bftsat-{job} proj"))
            .count(),
        3,
        "satellites are charged to the core's account: {accounts}"
    );
    // A job of another user (root): waits, as every node is lent.
    let other =
        l.c.sbatch(&[
            "--elastic=1:2",
            "-J",
            "roots",
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 600",
        ])
        .unwrap();
    let st = l.wait(20, "status to show 4 lent nodes and two jobs", || {
        let v = json(&l, &["status"]);
        let n = v["jobs_by_state"]["running"].as_u64()?
            + v["jobs_by_state"]["waiting"].as_u64()?
            + v["jobs_by_state"]["pending"].as_u64()?;
        (v["counts"]["lent"] == 4 && n == 2).then_some(v)
    });
    assert_eq!(st["schema"], "bftrainer.status/1");
    assert_eq!(st["lending"], "open");
    assert_eq!(st["slurm_reachable"], true);
    assert!(st["poll"]["samples"].as_u64().unwrap() > 0);
    assert!(
        st["jobs"].as_array().unwrap().is_empty(),
        "status carries no job list"
    );
    let text = ok(&l, &["status"]);
    eprintln!("$ bftrainer status\n{text}");
    assert!(
        text.contains("Lending=OPEN") && text.contains("Lent=4"),
        "{text}"
    );

    // Root sees both jobs; the elastic one on 4 nodes with 3 satellites and 3 grows.
    let text = ok(&l, &["jobs"]);
    eprintln!("$ bftrainer jobs\n{text}");
    let jobs = json(&l, &["jobs"]);
    let ids: Vec<u64> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_u64().unwrap())
        .collect();
    assert!(
        ids.contains(&u64::from(job)) && ids.contains(&u64::from(other)),
        "{ids:?}"
    );
    let mine = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == job)
        .unwrap();
    assert_eq!(mine["size"], 4);
    assert_eq!(mine["satellites"].as_array().unwrap().len(), 3);
    assert_eq!(mine["user"], "bftuser");
    assert_eq!(mine["admits"], 1, "{mine}");
    assert!(mine.get("history").is_none(), "history only when asked");
    let h = json(&l, &["jobs", "--history", &job.to_string()]);
    let hist = h[0]["history"].as_array().unwrap();
    assert_eq!(hist.last().unwrap()["nodes"], 4, "{hist:?}");
    assert!(hist[0]["t"].as_f64().unwrap() > 1e9, "{hist:?}");

    // bftuser sees only its own job, gets nothing about root's, may not pause.
    let o = as_user(&l, &["jobs", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![u64::from(job)]);
    let o = as_user(&l, &["jobs", &other.to_string()]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains(&other.to_string()), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("not yours"));
    let o = as_user(&l, &["jobs", "-u", "root", "--json"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    let o = as_user(&l, &["nodes", "--json"]);
    let nodes: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 4);
    for n in nodes.as_array().unwrap() {
        assert!(n["holder"].is_null() || n["holder"] == job, "{n}");
    }
    for verb in ["pause", "drain", "resume"] {
        let o = as_user(&l, &[verb]);
        assert!(!o.status.success(), "{verb} as bftuser succeeded");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            e.contains("permission denied") && e.contains("root and SlurmUser"),
            "{e}"
        );
    }
    let text = ok(&l, &["nodes"]);
    eprintln!("$ bftrainer nodes\n{text}");
    assert_eq!(text.matches("LENT").count(), 4, "{text}");
    let st = json(&l, &["status"]);
    assert_eq!(st["lending"], "open", "a refused verb changed nothing");

    // Pause: a node a regular job took and gave back is not lent again.
    let msg = ok(&l, &["pause"]);
    assert!(msg.contains("lending paused"), "{msg}");
    let regular = l.regular(1, 3);
    l.wait(30, "the regular job to run and end", || {
        matches!(l.state_of(regular).as_str(), "COMPLETED").then_some(())
    });
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(l.elastic_size(job), 3, "paused: the freed node stays idle");
    let st = json(&l, &["status"]);
    assert_eq!(st["lending"], "paused");
    assert_eq!(st["counts"]["lent"], 3);

    // Drain: shrunk to the core; holds across a restart of the daemon.
    let msg = ok(&l, &["drain"]);
    assert!(msg.contains("lending drained"), "{msg}");
    l.wait(30, "the job to shrink to its core", || {
        (l.elastic_size(job) == 1 && l.active_satellites(job) == 0).then_some(())
    });
    assert_eq!(l.state_of(job), "RUNNING");
    let mut d = l.daemon.take().unwrap();
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    d.wait().unwrap();
    assert!(
        !socket(&l).exists(),
        "the socket is removed at a clean stop"
    );
    let o = run(bftrainer(&l, &["status"]));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("bftrainerd is not running"),
        "{e}"
    );
    l.spawn();
    wait_socket(&l);
    let st = l.wait(10, "status after the restart", || {
        let v = json(&l, &["status"]);
        (v["poll"]["samples"].as_u64()? > 0).then_some(v)
    });
    assert_eq!(st["lending"], "drained", "the mode is journaled");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(l.elastic_size(job), 1, "still drained after the restart");
    let h = json(&l, &["jobs", "--history", &job.to_string()]);
    let sizes: Vec<u64> = h[0]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["nodes"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sizes.last(),
        Some(&1),
        "history rebuilt from the journal: {sizes:?}"
    );
    assert!(sizes.contains(&4) && sizes.contains(&3), "{sizes:?}");
    assert!(
        h[0]["shrinks"].as_u64().unwrap() >= 1 && h[0]["preemptions"].as_u64().unwrap() >= 1,
        "{}",
        h[0]
    );

    // Resume: grows back onto every idle node (the other job may take some).
    let msg = ok(&l, &["resume"]);
    assert!(msg.contains("lending resumed"), "{msg}");
    l.wait(60, "every node lent again", || {
        let v = json(&l, &["status"]);
        (v["counts"]["lent"] == 4).then_some(())
    });
    let text = ok(&l, &["jobs", "--history", &job.to_string()]);
    eprintln!("$ bftrainer jobs --history {job}\n{text}");
    l.assert_no_double_allocation();
}

/// Sends raw bytes, returns what came back (the connection closed by the daemon).
fn raw(path: &std::path::Path, bytes: &[u8], shutdown: bool) -> String {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    if shutdown {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// One status round trip over the socket, timed.
fn status_rtt(path: &std::path::Path) -> Duration {
    let t = Instant::now();
    let out = raw(path, b"{\"v\":1,\"op\":\"status\"}\n", false);
    let d = t.elapsed();
    assert!(out.contains("\"ok\":true"), "{out}");
    d
}

#[test]
fn cluster_control_socket_and_metrics_survive_bad_clients() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let metrics_conf = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let s = live::setup("bftctl", "", "", "");
    let conf = std::fs::read_to_string(&s.conf).unwrap() + &metrics_conf;
    std::fs::write(&s.conf, conf).unwrap();
    let mut l = Live::from_setup(s);
    l.spawn();
    wait_socket(&l);
    let path = socket(&l);
    let pid = l.daemon.as_ref().unwrap().id();
    let job = l.submit_elastic("1:4");
    l.grown_to_all(job);
    status_rtt(&path);
    let rss0 = rss_kb(pid);

    // Garbage, truncated, wrong version, unknown op, empty.
    let cases: [(&[u8], &str); 6] = [
        (b"\x00\xff\xfegarbage\n", "not UTF-8"),
        (b"{\"v\":1,\"op\":\"sta", "not JSON"),
        (
            b"{\"v\":2,\"op\":\"status\"}\n",
            "protocol version 2 is not spoken here",
        ),
        (
            b"{\"v\":1,\"op\":\"shutdown\"}\n",
            "expected op one of status, jobs, nodes, pause, drain, resume",
        ),
        (b"{\"op\":\"status\"}\n", "no protocol version"),
        (b"\n", "empty"),
    ];
    for (bytes, want) in cases {
        let out = raw(&path, bytes, true);
        assert!(
            out.contains("\"ok\":false") && out.contains(want),
            "{bytes:?}: {out}"
        );
    }
    // 10 MB in one request.
    let big = vec![b'x'; 10 << 20];
    let out = raw(&path, &big, true);
    assert!(out.contains("request too large"), "{out}");
    // 200 clients connect at once and say nothing: the next request is still served.
    let idle: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let t = status_rtt(&path);
    eprintln!(
        "MEASURED status round trip with 200 silent clients connected: {:.1} ms",
        t.as_secs_f64() * 1e3
    );
    assert!(
        t < Duration::from_millis(100),
        "served in {t:?} with 200 idle clients"
    );
    // Clients that vanish mid-answer, many times over.
    for _ in 0..300 {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"v\":1,\"op\":\"nodes\"}\n").unwrap();
        drop(s);
    }
    // The silent ones are dropped after the daemon's 5-s read timeout, with an answer.
    let mut first = idle.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut out = String::new();
    let _ = first.read_to_string(&mut out);
    assert!(out.contains("no complete request within 5 s"), "{out}");
    // Many bad requests later, memory is flat and answers are quick.
    for _ in 0..500 {
        raw(&path, b"{\"v\":1,\"op\":\"sta", true);
        raw(&path, &big[..100_000], true);
    }
    std::thread::sleep(Duration::from_secs(1));
    let t = status_rtt(&path);
    assert!(t < Duration::from_millis(100), "{t:?}");
    let rss1 = rss_kb(pid);
    eprintln!("MEASURED daemon RSS before the bad clients {rss0} kB, after {rss1} kB");
    assert!(
        rss1 < rss0 + 8 * 1024,
        "RSS grew from {rss0} kB to {rss1} kB"
    );
    assert_eq!(l.elastic_size(job), 4, "harvesting went on");

    // Metrics: exposition by prometheus-client, the daemon's numbers.
    let get = |req: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let m = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
    for want in [
        "bftrainer_nodes{state=\"lent\"} 4",
        "bftrainer_elastic_jobs{state=\"running\"} 1",
        "bftrainer_lending{mode=\"open\"} 1",
        "bftrainer_slurm_up 1",
        "# TYPE bftrainer_grows counter",
        "bftrainer_admits_total 1",
        "bftrainer_poll_seconds_bucket{le=",
        "bftrainer_decision_seconds_count ",
        "bftrainer_harvested_node_seconds_total ",
        "# EOF",
    ] {
        assert!(m.contains(want), "metrics lack {want:?}:\n{m}");
    }
    assert!(get("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(20_000));
    assert!(get(&huge).starts_with("HTTP/1.1 431"));
    assert!(
        l.daemon.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon is up"
    );
}

/// Resumes a stopped slurmctld when the test ends, whatever happens.
struct Frozen(i32);

impl Drop for Frozen {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn cluster_control_answers_while_slurmctld_hangs() {
    // slurmctld stopped (SIGSTOP: it accepts connections and never answers, as an
    // overloaded controller does): a cycle blocks on it for as long as libslurm's
    // MessageTimeout per call. `bftrainer pause` must still be answered (queued until
    // the cycle ends), and SIGTERM must still stop the daemon, while slurmctld hangs.
    let mut l = Live::start("", "", "");
    let job = l.submit_elastic("1:4");
    l.grown_to_all(job);
    wait_socket(&l);
    let pid = l.c.daemon_pid("slurmctld").unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let frozen = Frozen(pid);
    // Until a reply says a cycle was under way, each pause is answered within its 5 s
    // timeout (the old loop answered only after the cycle, 10 s or more per call).
    let reply = l.wait(60, "a pause answered during a blocked cycle", || {
        let t = Instant::now();
        let o = run(bftrainer(&l, &["pause", "--timeout", "5"]));
        let took = t.elapsed();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "pause while slurmctld hangs: {}{}",
            out,
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!(
            "pause answered in {:.3} s: {}",
            took.as_secs_f64(),
            out.trim()
        );
        out.contains("when the current cycle ends").then_some(out)
    });
    assert!(
        reply.contains("accepted: lending becomes paused"),
        "{reply}"
    );
    // status is served from the last snapshot, also at once.
    let o = run(bftrainer(&l, &["status", "--timeout", "5"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // slurmctld answers again: the queued pause takes effect.
    drop(frozen);
    l.wait(60, "lending paused after the cycle", || {
        (json(&l, &["status"])["lending"] == "paused").then_some(())
    });
    // SIGTERM while slurmctld hangs: the daemon stops without waiting for the cycle.
    let pid = l.c.daemon_pid("slurmctld").unwrap() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let frozen = Frozen(pid);
    l.wait(30, "a cycle blocked on slurmctld again", || {
        let o = run(bftrainer(&l, &["resume", "--timeout", "5"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .contains("when the current cycle ends")
            .then_some(())
    });
    let mut d = l.daemon.take().expect("daemon running");
    assert_eq!(unsafe { libc::kill(d.id() as i32, libc::SIGTERM) }, 0);
    let status = l.wait(
        30,
        "bftrainerd to stop on SIGTERM while slurmctld hangs",
        || d.try_wait().unwrap(),
    );
    assert!(status.success(), "{status:?}\n{}", l.log_text());
    drop(frozen);
    assert!(
        l.log_text().contains("a cycle was under way"),
        "{}",
        l.log_text()
    );
}

/// A timed `bftrainer ARGS` (the CLI, as an operator runs it): its output and how long
/// it took from start to exit.
fn timed(l: &Live, args: &[&str]) -> (String, Duration) {
    let t = Instant::now();
    let o = run(bftrainer(l, args));
    let took = t.elapsed();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "bftrainer {args:?}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (out, took)
}

/// The seconds a queued verb's answer says the cycle under way has waited on slurmctld
/// ("... (it has waited 12.3 s on slurmctld) ..."); None when it was not queued.
fn waited_s(reply: &str) -> Option<f64> {
    reply
        .split("it has waited ")
        .nth(1)?
        .split(" s on slurmctld")
        .next()?
        .parse()
        .ok()
}

#[test]
fn cluster_control_answers_under_a_slow_slurmctld_while_growing_to_20_nodes() {
    // Every call bftrainerd makes to slurmctld takes D more (a proxy in front of
    // slurmctld that only bftrainerd's slurm.conf names), while one elastic job grows
    // onto 20 nodes: a refresh alone (partitions, nodes, jobs) takes 3 D. The job must
    // still grow onto every node, each node lent once; `pause` and `status` must be
    // answered well within D (they never wait for a call), and SIGTERM obeyed within
    // D + 2 s. Figures are printed; the growth's duration is not asserted.
    const NODES: usize = 20;
    const D: Duration = Duration::from_secs(5);
    // A cycle may spend 120 s on calls: the 19 satellites go out in one cycle (95 s of
    // calls), during which pause and status must still answer; with the default 5 s
    // the growth takes one satellite a cycle (about 7 minutes).
    let setup = live::setup_sized("bftslow", NODES, "", "cycle_budget = 120", &|join| {
        format!("env BAD_NODE= {} {{parent}}", join.display())
    });
    let mut l = Live::from_setup(setup);
    let proxy = live::DelayProxy::start(live::slurmctld_addr(l.c.slurm_conf()), D);
    let slow = live::slurm_conf_via(l.c.slurm_conf(), proxy.port, "slurm-slow.conf");
    // The delay applies per call: one squeue through the proxy takes D or more.
    let t = Instant::now();
    let o =
        l.c.command("squeue")
            .env("SLURM_CONF", &slow)
            .arg("-h")
            .stdin(Stdio::null())
            .output()
            .unwrap();
    let took = t.elapsed();
    assert!(o.status.success(), "squeue through the proxy: {o:?}");
    eprintln!(
        "squeue through the proxy: {:.2} s ({} connection(s), delay {:.0} s each)",
        took.as_secs_f64(),
        proxy.accepted.load(std::sync::atomic::Ordering::SeqCst),
        D.as_secs_f64()
    );
    assert!(took >= D, "squeue took {took:?}, less than the delay");
    l.daemon_slurm_conf = Some(slow);
    let t0 = Instant::now();
    l.spawn();
    // Start-up itself calls slurmctld a few times before the socket opens.
    l.wait(180, "the control socket", || {
        UnixStream::connect(socket(&l)).ok().map(|_| ())
    });
    eprintln!(
        "control socket open {:.1} s after the start",
        t0.elapsed().as_secs_f64()
    );
    let job = l.submit_elastic(&format!("1:{NODES}"));
    let sat_name = format!("bftsat-{job}");
    let (mut samples, mut most_sats) = (0usize, 0usize);
    let mut pauses: Vec<f64> = Vec::new();
    let mut probed = false;
    let t_submit = Instant::now();
    l.wait(600, &format!("job {job} to run on {NODES} nodes"), || {
        let rows = l.squeue();
        samples += 1;
        if let Some(e) = live::double_allocation(&rows) {
            panic!("{e}: {rows:#?}");
        }
        let sats = rows
            .iter()
            .filter(|r| {
                r.name == sat_name
                    && ["RUNNING", "PENDING", "CONFIGURING"].contains(&r.state.as_str())
            })
            .count();
        most_sats = most_sats.max(sats);
        let size: usize = rows
            .iter()
            .filter(|r| r.state == "RUNNING" && (r.id == job || r.name == sat_name))
            .map(|r| bftrainer_slurm::hostlist_expand(&r.nodes).unwrap().len())
            .sum();
        if !probed && size >= 2 {
            // Mid-growth, a cycle waiting on slurmctld: pause until an answer says it
            // was queued behind such a cycle (an answer while the daemon was between
            // cycles applies at once), then status, then resume.
            probed = true;
            let reply = l.wait(120, "a pause answered during a slow cycle", || {
                let (out, took) = timed(&l, &["pause", "--timeout", "30"]);
                eprintln!(
                    "pause answered in {:.3} s: {}",
                    took.as_secs_f64(),
                    out.trim()
                );
                pauses.push(took.as_secs_f64());
                assert!(
                    took < D,
                    "pause took {took:?} while slurmctld is slow: {out}"
                );
                out.contains("when the current cycle ends").then_some(out)
            });
            assert!(
                reply.contains("accepted: lending becomes paused"),
                "{reply}"
            );
            let (out, took) = timed(&l, &["status", "--json", "--timeout", "30"]);
            eprintln!("status answered in {:.3} s", took.as_secs_f64());
            assert!(took < D, "status took {took:?} while slurmctld is slow");
            serde_json::from_str::<serde_json::Value>(&out).expect("status --json is JSON");
            let (out, took) = timed(&l, &["resume", "--timeout", "30"]);
            eprintln!(
                "resume answered in {:.3} s: {}",
                took.as_secs_f64(),
                out.trim()
            );
            assert!(took < D, "resume took {took:?} while slurmctld is slow");
        }
        (size == NODES).then_some(())
    });
    assert!(probed, "pause and status were tried during the growth");
    eprintln!(
        "grown onto {NODES} nodes {:.1} s after the submission; {} squeue samples, at most {most_sats} satellites; {} calls through the proxy so far",
        t_submit.elapsed().as_secs_f64(),
        samples,
        proxy.accepted.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(
        most_sats < NODES,
        "{most_sats} satellites at once for a job of at most {NODES} nodes"
    );
    l.assert_no_double_allocation();
    assert_eq!(json(&l, &["status"])["lending"], "open", "resumed");
    // SIGTERM during a cycle that has just begun (its refresh alone takes 3 D): the
    // daemon stops without waiting for it.
    let reply = l.wait(120, "a cycle under way for less than D", || {
        let (out, _) = timed(&l, &["resume", "--timeout", "30"]);
        waited_s(&out).filter(|w| *w < D.as_secs_f64()).map(|_| out)
    });
    eprintln!("before SIGTERM: {}", reply.trim());
    let mut d = l.daemon.take().expect("daemon running");
    let t = Instant::now();
    assert_eq!(unsafe { libc::kill(d.id() as i32, libc::SIGTERM) }, 0);
    let status = l.wait(60, "bftrainerd to stop on SIGTERM", || {
        d.try_wait().unwrap()
    });
    let took = t.elapsed();
    eprintln!("SIGTERM to exit: {:.3} s", took.as_secs_f64());
    assert!(status.success(), "{status:?}");
    assert!(
        took < D + Duration::from_secs(2),
        "stopped {took:?} after SIGTERM"
    );
    assert!(
        l.log_text().contains("a cycle was under way"),
        "{}",
        l.log_text()
    );
    eprintln!(
        "pause latencies: {:?} s",
        pauses
            .iter()
            .map(|p| (p * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    );
}

/// `bftrainer ARGS` as `user`.
fn as_named_user(l: &Live, user: &str, args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = bftrainer_testcluster::user_ids(user).unwrap();
    let mut c = bftrainer(l, args);
    c.uid(uid)
        .gid(gid)
        .env("USER", user)
        .env("LOGNAME", user)
        .current_dir("/tmp");
    run(c)
}

/// A process of bftuser (`sleep`) holding `n` connections to `path` open and silent,
/// as a slow or hostile client does: they are made between fork and exec, as bftuser,
/// so the daemon's SO_PEERCRED sees bftuser on each.
fn hold_connections(l: &Live, path: &std::path::Path, n: usize) -> std::process::Child {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "{}", path.display());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let mut c = l.c.command_as_test_user("sleep").unwrap();
    c.arg("600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Only async-signal-safe calls (socket, connect) run in the forked child; std
    // applies the uid before the closure. The sockets lack CLOEXEC: sleep keeps them.
    unsafe {
        c.pre_exec(move || {
            for _ in 0..n {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0
                    || libc::connect(
                        fd,
                        &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    c.spawn().expect("a process of bftuser holding connections")
}

/// Kills the connection holder when the test ends, whatever happens.
struct Holder(Option<std::process::Child>);

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn cluster_control_one_user_cannot_lock_out_root_or_others() {
    // bftuser holds connections up to and past its per-uid cap, saying nothing (as a
    // slow client, or one that wants `pause` locked out): bftuser's next request is
    // answered with why it is refused, while root's `bftrainer pause` and bftuser2's
    // `bftrainer status` are served. And bftuser's `nodes` and `status` name none of
    // bftuser2's jobs: the node lent to bftuser2 shows as lent, without its holder.
    let mut l = Live::start("", "", "");
    wait_socket(&l);
    let other_user = bftrainer_testcluster::OTHER_USER;
    let other = l.submit_elastic_as(other_user, "1:2");
    let job = l.submit_elastic("1:2");
    let held = |v: &serde_json::Value, id: u32| {
        v.as_array()?
            .iter()
            .find(|j| j["job_id"] == id)
            .filter(|j| j["state"] == "running")?["size"]
            .as_u64()
    };
    l.wait(90, "both users' jobs to run and hold nodes", || {
        let v = json(&l, &["jobs"]);
        (held(&v, other)? >= 1 && held(&v, job)? >= 1).then_some(())
    });

    // What bftuser sees of the nodes: its own holder, nobody else's.
    let all = json(&l, &["nodes"]);
    let others_nodes: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["holder"] == other)
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!others_nodes.is_empty(), "{all:#}");
    let o = as_user(&l, &["nodes", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let nodes: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for n in nodes.as_array().unwrap() {
        assert!(n["holder"].is_null() || n["holder"] == job, "{n}");
        if others_nodes.contains(&n["name"].as_str().unwrap().to_string()) {
            assert_eq!(n["state"], "lent", "{n}");
            assert!(n["holder"].is_null(), "{n}");
        }
    }
    let text = String::from_utf8_lossy(&o.stdout).into_owned()
        + &String::from_utf8_lossy(&as_user(&l, &["status", "--json"]).stdout);
    for needle in [format!("job {other}"), format!("\"holder\":{other}")] {
        assert!(
            !text.contains(&needle),
            "{needle:?} in bftuser's view: {text}"
        );
    }
    let o = as_user(&l, &["nodes"]);
    let table = String::from_utf8_lossy(&o.stdout);
    eprintln!("$ bftrainer nodes   # as bftuser\n{table}");
    assert!(
        !table.split_whitespace().any(|w| w == other.to_string()),
        "{table}"
    );

    // The cap. Each attempt starts a fresh holder: the daemon drops silent clients
    // after its 5-s read timeout, so everything is checked within one holder's life,
    // and bftuser's refusal checked again last proves the holder still held then.
    let cap = 16; // control::PER_UID
    let path = socket(&l);
    let mut holder = Holder(None);
    let refused = |what: &str| {
        let o = as_user(&l, &["status", "--timeout", "5"]);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        if o.status.success() {
            eprintln!("{what}: bftuser served (the holder's connections expired?)");
            return None;
        }
        assert!(
            e.contains("too many connections") && e.contains("requests in progress"),
            "{e}"
        );
        Some(e)
    };
    let (msg, took) = l.wait(
        60,
        "bftuser refused over its cap while root is served",
        || {
            if holder.0.is_some() {
                // The last attempt's holder goes first, and its slots come back.
                drop(std::mem::replace(&mut holder, Holder(None)));
                l.wait(30, "bftuser served again", || {
                    as_user(&l, &["status"]).status.success().then_some(())
                });
            }
            holder = Holder(Some(hold_connections(&l, &path, cap + 4)));
            let msg = refused("first")?;
            let t = Instant::now();
            let o = run(bftrainer(&l, &["pause", "--timeout", "5"]));
            let took = t.elapsed();
            assert!(
                o.status.success(),
                "root's pause while bftuser holds its cap: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let o = as_named_user(&l, other_user, &["status", "--json", "--timeout", "5"]);
            assert!(
                o.status.success(),
                "bftuser2's status while bftuser holds its cap: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            refused("last")?;
            Some((msg, took))
        },
    );
    eprintln!(
        "bftuser over its cap: {}\nroot's pause answered in {:.3} s meanwhile",
        msg.trim(),
        took.as_secs_f64()
    );
    let (uid, _) = bftrainer_testcluster::user_ids(bftrainer_testcluster::TEST_USER).unwrap();
    assert!(
        msg.contains(&format!("uid {uid} has {cap} requests in progress")),
        "{msg}"
    );
    assert_eq!(json(&l, &["status"])["lending"], "paused");
    // The holder gone, its slots come back.
    drop(holder);
    l.wait(30, "bftuser served again", || {
        as_user(&l, &["status"]).status.success().then_some(())
    });
    ok(&l, &["resume"]);
    assert!(
        l.daemon.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon is up"
    );
}

/// `cmd` (bftrainerd) inside as much of conf/bftrainerd.service's sandbox as a test can
/// build without systemd: a private mount namespace where everything but the state
/// directory is read-only (ProtectSystem=strict, ReadWritePaths), no new privileges,
/// and the unit's capability bounding set. Without mount namespaces (a container
/// without CAP_SYS_ADMIN) only the last two; says so.
fn sandboxed(cmd: &Command, state: &std::path::Path) -> Command {
    let can_unshare = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conf/bftrainerd.service"
    ))
    .unwrap();
    let caps: Vec<String> = unit
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_ascii_lowercase())
        .collect();
    let bounding = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let setpriv =
        format!("exec setpriv --no-new-privs --inh-caps=-all --bounding-set={bounding} -- \"$@\"");
    let mut c = if can_unshare {
        let mut c = Command::new("unshare");
        let script =
            format!("mount --bind \"$0\" \"$0\" && mount -o remount,bind,ro / && {setpriv}");
        c.args(["-m", "--propagation", "private", "sh", "-c", &script])
            .arg(state);
        c
    } else {
        eprintln!("no mount namespaces here: the daemon runs without a read-only root");
        let mut c = Command::new("sh");
        c.args(["-c", &setpriv, "sh"]);
        c
    };
    c.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

#[test]
fn cluster_control_daemon_works_inside_the_units_sandbox() {
    // conf/bftrainerd.service confines the daemon (read-only file system but its state
    // directory, no new privileges, CapabilityBoundingSet): under the same confinement
    // it still talks to slurmctld and munge, admits and grows a job, journals, serves
    // its socket and survives a restart.
    let mut l = Live::start_without_daemon("", "", "");
    let state = l.dir.join("state");
    let spawn = |l: &mut Live| {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&l.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let child = sandboxed(&l.daemon_cmd(), &state)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start bftrainerd sandboxed");
        l.daemon = Some(child);
    };
    spawn(&mut l);
    wait_socket(&l);
    let pid = l.daemon.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|x| x.strip_prefix(k))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    // CAP_DAC_READ_SEARCH (bit 2) and nothing else.
    assert_eq!(field("CapBnd:"), "0000000000000004", "{status}");
    assert!(l.log_text().is_empty() || !l.log_text().contains("Read-only file system"));

    let job = l.submit_elastic("1:4");
    l.grown_to_all(job);
    let msg = ok(&l, &["pause"]);
    assert!(msg.contains("lending paused"), "{msg}");
    let journal = std::fs::metadata(state.join("journal.jsonl"))
        .unwrap()
        .len();
    assert!(journal > 0);
    // A restart inside the sandbox adopts the job and keeps the journaled mode.
    let mut d = l.daemon.take().unwrap();
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    assert!(d.wait().unwrap().success(), "{}", l.log_text());
    spawn(&mut l);
    wait_socket(&l);
    let st = l.wait(30, "status after the restart", || {
        let v = json(&l, &["status"]);
        (v["poll"]["samples"].as_u64()? > 0).then_some(v)
    });
    assert_eq!(st["lending"], "paused", "{st}");
    ok(&l, &["resume"]);
    let jobs = json(&l, &["jobs"]);
    assert_eq!(jobs[0]["job_id"], job, "{jobs}");
    assert_eq!(l.elastic_size(job), 4);
    let log = l.log_text();
    assert!(
        !log.contains("Read-only file system") && !log.contains("Operation not permitted"),
        "{log}"
    );
}
