//! bft-run without Slurm (`--local`), against a private munged, with a stand-in worker
//! (tests/worker.py, plain python3): a job that forms, grows, loses a leaver, restarts
//! a killed worker, drops a hung one and finishes; clear errors; a worker's exit code
//! and stderr tail; and the coordinator refusing forged agents (another uid, a
//! credential made for another connection, a replayed one, another protocol version,
//! garbage).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{Munged, BFT};

/// A private munged, or None (the test is skipped, saying why) where munged cannot run.
fn munged() -> Option<Munged> {
    Munged::try_start()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn outside_slurm_and_without_a_command_it_says_what_to_do() {
    let o = Command::new(BFT)
        .env_remove("SLURM_JOB_ID")
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("not inside a Slurm job (SLURM_JOB_ID is not set)"),
        "{}",
        text(&o)
    );
    let o = Command::new(BFT).args(["--local", "1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no command"), "{}", text(&o));
    let o = Command::new(BFT)
        .env_remove("SLURM_JOB_ID")
        .args(["--agent", "--coord", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("coordinator unreachable at 127.0.0.1:1"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_failing_worker_fails_the_job_with_its_code_and_stderr_tail() {
    let Some(m) = munged() else { return };
    let t = Instant::now();
    let o = m
        .bft()
        .args(["--local", "2", "--", "python3", "-c"])
        .arg("import sys; print('line one', file=sys.stderr); print('boom: bad input', file=sys.stderr); sys.exit(3)")
        .output()
        .unwrap();
    let all = text(&o);
    assert_eq!(o.status.code(), Some(3), "{all}");
    assert!(
        all.contains("exited with code 3; last lines of its stderr:"),
        "{all}"
    );
    assert!(all.contains("boom: bad input"), "{all}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
}

struct Coord {
    child: Child,
    addr: String,
    run: String,
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A coordinator whose one local worker just sleeps (never ready).
fn sleeping_coordinator(m: &Munged, dir: &Path) -> Coord {
    let f = dir.join("coord");
    let child = m
        .bft()
        .args(["--local", "1", "--coord-file"])
        .arg(&f)
        .args(["--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut c = Coord {
        child,
        addr: String::new(),
        run: String::new(),
    };
    let t = Instant::now();
    loop {
        if let Some((addr, _job, run)) = read_coord_file(&f) {
            c.addr = addr;
            c.run = run;
            return c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no coordinator address"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--coord-file`: `HOST:PORT JOB RUN`, once written whole.
fn read_coord_file(f: &Path) -> Option<(String, String, String)> {
    let s = std::fs::read_to_string(f).ok()?;
    if !s.ends_with('\n') {
        return None;
    }
    let mut w = s.split_whitespace().map(str::to_string);
    Some((w.next()?, w.next()?, w.next()?))
}

struct Conn {
    s: TcpStream,
    r: BufReader<TcpStream>,
    nonce: String,
    run: String,
    addr: String,
    proto: u64,
}

fn connect(addr: &str) -> Conn {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["t"], "challenge");
    assert_eq!(v["job"], "local");
    Conn {
        s,
        r,
        nonce: v["nonce"].as_str().unwrap().to_string(),
        run: v["run"].as_str().unwrap().to_string(),
        addr: addr.to_string(),
        proto: v["proto"].as_u64().unwrap(),
    }
}

impl Conn {
    fn send(&mut self, line: &str) -> serde_json::Value {
        self.s.write_all(line.as_bytes()).unwrap();
        self.s.write_all(b"\n").unwrap();
        let mut back = String::new();
        self.r.read_line(&mut back).unwrap();
        serde_json::from_str(&back).unwrap_or_else(|e| panic!("answer {back:?}: {e}"))
    }

    fn hello(&mut self, cred: &str, proto: u64) -> serde_json::Value {
        let h = serde_json::json!({"t": "hello", "proto": proto, "cred": cred, "host": "127.0.0.1", "nproc": 1, "anonce": "a1"});
        self.send(&h.to_string())
    }

    /// The payload a genuine agent of this connection signs.
    fn payload(&self) -> String {
        payload(&self.run, &self.addr, &self.nonce)
    }
}

fn payload(run: &str, to: &str, nonce: &str) -> String {
    format!("bftrainer-run:v2 agent job=local run={run} to={to} nonce={nonce} anonce=a1")
}

#[test]
fn forged_agents_are_refused_and_the_coordinator_keeps_serving() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let c = sleeping_coordinator(&m, tmp.path());

    // Another user's credential, made for this very connection (root can make one).
    let other_user = Command::new("runuser")
        .args(["-u", "bftuser", "--", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if other_user {
        let mut a = connect(&c.addr);
        let cred = m.cred(Some("bftuser"), &a.payload());
        let r = a.hello(&cred, a.proto);
        assert_eq!(r["t"], "error", "{r}");
        assert!(
            r["msg"].as_str().unwrap().contains("credential of uid"),
            "{r}"
        );
    } else {
        eprintln!(
            "SKIPPED the other-uid case: cannot run munge as bftuser (needs root and that user)"
        );
    }

    // Our own credential, made for another connection's nonce, then replayed on that one.
    let mut a = connect(&c.addr);
    let mut b = connect(&c.addr);
    let cred = m.cred(None, &a.payload());
    let r = b.hello(&cred, b.proto);
    assert!(
        r["msg"].as_str().unwrap().contains("another job, run"),
        "{r}"
    );
    let r = a.hello(&cred, a.proto);
    assert!(
        r["msg"].as_str().unwrap().contains("replayed credential"),
        "{r}"
    );
    // A relayed challenge: the agent dialled another address (the relay's), or
    // joined an earlier run of the job (a stale address).
    for (run, to) in [(c.run.as_str(), "10.9.9.9:4444"), ("00ff", c.addr.as_str())] {
        let mut r_conn = connect(&c.addr);
        let cred = m.cred(None, &payload(run, to, &r_conn.nonce));
        let r = r_conn.hello(&cred, r_conn.proto);
        assert!(
            r["msg"]
                .as_str()
                .unwrap()
                .contains("another job, run, address"),
            "{r}"
        );
    }

    // Another protocol version, and garbage.
    let mut d = connect(&c.addr);
    let cred = m.cred(None, &d.payload());
    let r = d.hello(&cred, 99);
    assert!(
        r["msg"].as_str().unwrap().contains("version mismatch"),
        "{r}"
    );
    let mut e = connect(&c.addr);
    let r = e.send("\u{1}\u{2} not json");
    assert!(
        r["msg"].as_str().unwrap().contains("not a JSON line"),
        "{r}"
    );

    // A hello over the unauthenticated size limit.
    let mut big = connect(&c.addr);
    let r = big.send(&format!(
        "{{\"t\":\"hello\",\"x\":\"{}\"}}",
        "a".repeat(20_000)
    ));
    assert!(
        r["msg"].as_str().unwrap().contains("over 16384 bytes"),
        "{r}"
    );

    // A genuine one is still welcome, and the coordinator proves itself in it.
    let mut f = connect(&c.addr);
    let cred = m.cred(None, &f.payload());
    let r = f.hello(&cred, f.proto);
    assert_eq!(r["t"], "welcome", "{r}");
    assert_eq!(r["argv"][0], "sleep");
    assert!(
        r["cred"].as_str().is_some_and(|c| c.starts_with("MUNGE:")),
        "{r}"
    );
}

#[test]
fn a_flood_of_connections_is_capped_and_a_genuine_agent_still_gets_in() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let c = sleeping_coordinator(&m, tmp.path());
    // 200 connections that never say hello: at most 8 from one address stay open
    // (each would cost an unmunge); the oldest are closed to make room.
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(&c.addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut open = 0;
    for s in &flood {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        // The challenge, then end of stream when it was closed; a timeout when open.
        let _ = r.read_line(&mut line);
        line.clear();
        if matches!(r.read_line(&mut line), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut)
        {
            open += 1;
        }
    }
    assert!(open <= 8, "{open} flood connections are still open");
    // The genuine agent gets in while the flood's connections are held.
    let mut f = connect(&c.addr);
    let cred = m.cred(None, &f.payload());
    let r = f.hello(&cred, f.proto);
    assert_eq!(r["t"], "welcome", "{r}");
}

/// A fake coordinator at an address the agent was told about: its challenge names
/// `job`/`run` and its welcome carries `cred` and the command `touch PWNED`.
fn fake_coordinator(
    job: &str,
    run: &str,
    cred: impl FnOnce(&str) -> String + Send + 'static,
) -> (String, std::sync::mpsc::Receiver<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (job, run) = (job.to_string(), run.to_string());
    let (got, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((s, _)) = l.accept() else { return };
        let mut w = s.try_clone().unwrap();
        let ch = serde_json::json!({"t": "challenge", "proto": 2, "nonce": "ab", "job": job, "run": run});
        let _ = writeln!(w, "{ch}");
        let mut line = String::new();
        if BufReader::new(s).read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let hello: serde_json::Value = serde_json::from_str(&line).unwrap();
        let _ = got.send(hello["cred"].as_str().unwrap_or("").to_string());
        let anonce = hello["anonce"].as_str().unwrap_or("").to_string();
        let welcome = serde_json::json!({
            "t": "welcome", "proto": 2, "agent": 1, "cred": cred(&anonce),
            "argv": ["touch", "PWNED"], "cwd": "/tmp", "env": {}, "nproc": 1,
            "opts": {"max_restarts": 0, "restart_window": 1, "leave_timeout": 1, "hang_timeout": 10},
        });
        let _ = writeln!(w, "{welcome}");
        std::thread::sleep(Duration::from_secs(5));
    });
    (addr, heard)
}

#[test]
fn an_agent_runs_nothing_for_a_party_that_is_not_its_coordinator() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let pwned = Path::new("/tmp/PWNED");
    let _ = std::fs::remove_file(pwned);
    let agent = |addr: &str, job: &str, run: &str| {
        let o = agent_cmd(&m, addr, job, run)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        text(&o)
    };
    // Another user listens where the job's coordinator was (a stale address): it
    // cannot make a credential of the owner's uid; one of its own is refused.
    let other_user = Command::new("runuser")
        .args(["-u", "bftuser", "--", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if other_user {
        let sock = m.socket();
        let (addr, heard) = fake_coordinator("7", "0a", move |anonce| {
            let out = Command::new("runuser")
                .args(["-u", "bftuser", "--", "munge", "-S"])
                .arg(&sock)
                .args([
                    "-s",
                    &format!("bftrainer-run:v2 coord job=7 run=0a anonce={anonce}"),
                ])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        });
        let out = agent(&addr, "7", "0a");
        assert!(out.contains("is not the coordinator of job 7"), "{out}");
        assert!(out.contains("not this job owner's"), "{out}");
        // The credential the agent sent it is of no use to it: only the owner's uid
        // can decode it (not slurmctld either, which would take it for the owner's).
        let cred = heard.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut un = Command::new("runuser")
            .args(["-u", "bftuser", "--", "unmunge", "-S"])
            .arg(m.socket())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        un.stdin.take().unwrap().write_all(cred.as_bytes()).unwrap();
        let o = un.wait_with_output().unwrap();
        assert!(
            !o.status.success(),
            "another uid decoded the agent's credential: {}",
            text(&o)
        );
    } else {
        eprintln!("SKIPPED the other-uid coordinator: cannot run munge as bftuser");
    }
    // The owner's own credential, but made for another connection (replayed from a
    // real coordinator's welcome): refused.
    let sock = m.socket();
    let (addr, _) = fake_coordinator("7", "0a", move |_| {
        let out = Command::new("munge")
            .arg("-S")
            .arg(&sock)
            .args(["-s", "bftrainer-run:v2 coord job=7 run=0a anonce=ffff"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    });
    let out = agent(&addr, "7", "0a");
    assert!(
        out.contains("not made for this job, run and connection"),
        "{out}"
    );
    // A party answering for an earlier run (the stale Comment's) or another job: the
    // agent does not even send its credential.
    let (addr, _) = fake_coordinator("7", "0b", |_| String::new());
    let out = agent(&addr, "7", "0a");
    assert!(out.contains("answers for run 0b, not run 0a"), "{out}");
    let (addr, _) = fake_coordinator("8", "0a", |_| String::new());
    let out = agent(&addr, "7", "0a");
    assert!(out.contains("answers for job 8, not job 7"), "{out}");
    assert!(
        !pwned.exists() && !tmp.path().join("PWNED").exists(),
        "the fake coordinator's command ran"
    );
}

#[test]
fn an_agent_of_another_version_says_so() {
    // A fake coordinator speaking protocol 99.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ =
                s.write_all(b"{\"t\":\"challenge\",\"proto\":99,\"nonce\":\"x\",\"job\":\"1\"}\n");
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let o = Command::new(BFT)
        .args(["--agent", "--coord", &addr])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("version mismatch: the coordinator at"),
        "{}",
        text(&o)
    );
    assert!(
        text(&o).contains("protocol 99, this agent 2"),
        "{}",
        text(&o)
    );
}

/// A child process killed if the test fails before it was waited for.
struct Guard(Option<Child>);

impl Guard {
    fn get(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn take(mut self) -> Child {
        self.0.take().unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const WORKER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/worker.py");

/// What each stand-in worker logged, by worker id.
fn worker_logs(dir: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap_or_default(),
            )
        })
        .collect()
}

/// bft-run with the stand-in worker; `env`: its TEST_* settings.
fn run_local(m: &Munged, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = m.bft();
    c.args(args)
        .args(["--", "python3", WORKER])
        .env("TEST_DIR", dir)
        .envs(env.iter().copied());
    c
}

/// The run did not wait out a default timeout (minutes) where a short one was given: a
/// bound only such a fault reaches, not a speed check (these runs take 2-10 s alone and
/// much longer on a loaded 2-core machine).
fn check_quick(t: Instant) {
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn two_local_agents_form_a_generation_and_finish() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let o = run_local(
        &m,
        tmp.path(),
        &["--local", "2"],
        &[
            ("TEST_FINISH_AT", "1"),
            ("TEST_FINISH_SIZE", "2"),
            ("TEST_PROBE", "1"),
            ("TEST_AFTER_DONE", "1.5"),
        ],
    )
    .output()
    .unwrap();
    let all = text(&o);
    let logs = worker_logs(tmp.path());
    assert_eq!(o.status.code(), Some(0), "{all}\n{logs:?}");
    assert!(
        all.contains("generation 1: 2 workers on 2 nodes (+"),
        "{all}"
    );
    assert!(all.contains("training finished in generation 1"), "{all}");
    assert_eq!(logs.len(), 2, "{logs:?}");
    for (id, log) in &logs {
        assert!(log.contains("gen 1 "), "{id}: {log}");
        assert!(log.contains("done"), "{id}: {log}");
        assert!(
            log.contains("saved") && !log.contains("sigterm"),
            "a finished worker was stopped before it exited on its own: {id}: {log}"
        );
        assert!(log.contains("start local_rank=0"), "{id}: {log}");
        // The agent refuses ids it did not start, and a second connection of one.
        assert!(log.contains("not started by this agent"), "{id}: {log}");
        assert!(log.contains("already connected"), "{id}: {log}");
    }
    // Rank 0's store is the one announced.
    let g1 = logs
        .values()
        .next()
        .unwrap()
        .lines()
        .find(|l| l.starts_with("gen 1 "))
        .unwrap()
        .to_string();
    assert!(logs.values().all(|l| l.contains(&g1)), "{logs:?}");
    check_quick(t);
}

#[test]
fn a_worker_killed_by_a_signal_is_restarted_in_its_slot_and_rejoins() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let o = run_local(
        &m,
        tmp.path(),
        &["--local", "2"],
        &[
            ("TEST_FINISH_AT", "3"),
            ("TEST_FINISH_SIZE", "2"),
            ("TEST_SUICIDE", "1.0"),
        ],
    )
    .output()
    .unwrap();
    let all = text(&o);
    let logs = worker_logs(tmp.path());
    assert_eq!(o.status.code(), Some(0), "{all}\n{logs:?}");
    assert!(
        all.contains("worker 1.0 was killed by signal 9; starting 1.1"),
        "{all}"
    );
    assert!(
        all.contains("generation 2: 1 workers on 1 nodes (-1.0)"),
        "{all}"
    );
    assert!(
        all.contains("generation 3: 2 workers on 2 nodes (+1.1)"),
        "{all}"
    );
    let l = &logs["1.1"];
    assert!(
        l.contains("start local_rank=0"),
        "the replacement keeps slot 0: {l}"
    );
    assert!(
        l.contains("gen 3 2.0 1.1"),
        "survivor first, newcomer appended: {l}"
    );
    assert!(l.contains("done"), "{l}");
    check_quick(t);
}

/// A core bft-run of one local agent (min-workers 1; `more` arguments, the stand-in
/// worker finishing in generation 3) writing its address to a file; and that
/// address, job and run once written.
fn core_with_address(m: &Munged, logs: &Path, more: &[&str]) -> (Guard, String, String, String) {
    let coord_file = logs.parent().unwrap().join("coord");
    let mut args = vec![
        "--local",
        "1",
        "--min-workers",
        "1",
        "--coord-file",
        coord_file.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    let core = Guard(Some(
        run_local(
            m,
            logs,
            &args,
            &[("TEST_FINISH_AT", "3"), ("TEST_FINISH_SIZE", "1")],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    ));
    wait_until("the coordinator's address", &|| {
        read_coord_file(&coord_file).is_some()
    });
    let (addr, job, run) = read_coord_file(&coord_file).unwrap();
    (core, addr, job, run)
}

/// `bft-run --agent` for the coordinator at `addr` of `job`'s run `run`.
fn agent_cmd(m: &Munged, addr: &str, job: &str, run: &str) -> Command {
    let mut c = m.bft();
    c.args([
        "--agent",
        "--coord",
        addr,
        "--coord-job",
        job,
        "--coord-run",
        run,
    ]);
    c
}

/// An agent started by hand, as a satellite's is, named `node`.
fn hand_agent(m: &Munged, addr: &str, job: &str, run: &str, node: &str) -> Guard {
    Guard(Some(
        agent_cmd(m, addr, job, run)
            .args(["--node-name", node])
            .env_remove("TEST_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

fn wait_until(what: &str, f: &dyn Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "waited 30 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_hand_started_agent_grows_the_job_and_leaves_on_sigterm() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let t = Instant::now();
    let comment_file = tmp.path().join("comment");
    let (core, addr, job, run) = core_with_address(
        &m,
        &logs,
        &["--comment-file", comment_file.to_str().unwrap()],
    );
    let wait_for = wait_until;
    let comment = || {
        std::fs::read_to_string(&comment_file)
            .ok()
            .and_then(|c| bftrainer_core::runtime::RunComment::parse(&c))
    };
    wait_for("generation 1", &|| {
        worker_logs(&logs)
            .get("1.0")
            .is_some_and(|l| l.contains("gen 1 1.0 dead="))
    });
    // Started by hand, like a satellite's agent: its workers get the welcome's command
    // and environment (TEST_DIR and TEST_* came from the core's bft-run).
    let mut extra = hand_agent(&m, &addr, &job, &run, "extra");
    wait_for("generation 2 with the extra agent's worker", &|| {
        worker_logs(&logs)
            .get("2.0")
            .is_some_and(|l| l.contains("gen 2 1.0 2.0 dead="))
    });
    // The grow's measured cost is in the Comment once the newcomer contributed (its
    // generation's first progress report): at least the agent's own start-up.
    wait_for("the grow's cost in the Comment", &|| {
        comment().is_some_and(|c| c.up > 0.0)
    });
    let grown = comment().unwrap();
    assert!(grown.up < 30.0 && grown.down == 0.0, "{grown:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(extra.get().id() as i32, libc::SIGTERM) };
    let left = extra.take().wait_with_output().unwrap();
    assert_eq!(
        left.status.code(),
        Some(0),
        "the leaving agent: {}",
        text(&left)
    );
    let out = core.take().wait_with_output().unwrap();
    let all = text(&out);
    let wl = worker_logs(&logs);
    assert_eq!(out.status.code(), Some(0), "{all}\n{wl:?}");
    assert!(
        all.contains("generation 2: 2 workers on 2 nodes (+2.0)"),
        "{all}"
    );
    assert!(all.contains("agent 2 (127.0.0.1) leaves"), "{all}");
    assert!(
        all.contains("generation 3: 1 workers on 1 nodes (-2.0)"),
        "{all}"
    );
    assert!(
        wl["2.0"].contains("sigterm") || wl["2.0"].contains("left"),
        "{wl:?}"
    );
    assert!(wl["1.0"].contains("done"), "{wl:?}");
    check_quick(t);
}

#[test]
fn a_member_silent_after_a_failure_is_dropped_killed_and_restarted() {
    let Some(m) = munged() else { return };
    let (all, logs) = worker_2_0_replaced(
        &m,
        &["--broken-timeout", "1"],
        &[("TEST_BROKEN", "1.0"), ("TEST_SILENT", "2.0")],
    );
    assert!(
        all.contains("dropping 2.0 (no acknowledgement 1 s after an abort: hung)"),
        "{all}"
    );
    assert!(
        all.contains(
            "worker 2.0 was killed by signal 9 (dropped by the coordinator as hung); starting 2.1"
        ),
        "{all}"
    );
    assert!(logs["2.0"].contains("hanging"), "{logs:?}");
}

/// `--local 2` with the stand-in worker (finishing in generation 3 at 2 workers), more
/// `args` and `env`, where worker 2.0 is lost and replaced by 2.1: checks the job
/// finished through generation 2 without 2.0 and generation 3 with 2.1; its output
/// and the workers' logs.
fn worker_2_0_replaced(
    m: &Munged,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, std::collections::BTreeMap<String, String>) {
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let mut all_args = vec!["--local", "2"];
    all_args.extend_from_slice(args);
    let mut all_env = vec![("TEST_FINISH_AT", "3"), ("TEST_FINISH_SIZE", "2")];
    all_env.extend_from_slice(env);
    let o = run_local(m, tmp.path(), &all_args, &all_env)
        .output()
        .unwrap();
    let all = text(&o);
    let logs = worker_logs(tmp.path());
    assert_eq!(o.status.code(), Some(0), "{env:?}: {all}\n{logs:?}");
    assert!(
        all.contains("generation 2: 1 workers on 1 nodes (-2.0)"),
        "{all}"
    );
    assert!(
        all.contains("generation 3: 2 workers on 2 nodes (+2.1)"),
        "{all}"
    );
    assert!(logs["2.1"].contains("done"), "{logs:?}");
    check_quick(t);
    (all, logs)
}

/// bft-run --local 1 with the stand-in worker under this CUDA_VISIBLE_DEVICES (as Slurm
/// binds a step to GPUs); the workers' logs and bft-run's output.
fn under_visible_devices(
    m: &Munged,
    visible: &str,
    size: &str,
) -> (String, std::collections::BTreeMap<String, String>) {
    let tmp = tempfile::tempdir().unwrap();
    let o = run_local(
        m,
        tmp.path(),
        &["--local", "1"],
        &[("TEST_FINISH_AT", "1"), ("TEST_FINISH_SIZE", size)],
    )
    .env("CUDA_VISIBLE_DEVICES", visible)
    .env("LOCAL_RANK", "7")
    .env("RANK", "9")
    .output()
    .unwrap();
    let all = text(&o);
    let logs = worker_logs(tmp.path());
    assert_eq!(o.status.code(), Some(0), "{visible}: {all}\n{logs:?}");
    (all, logs)
}

#[test]
fn every_worker_sees_the_nodes_gpus_and_takes_the_one_of_its_local_rank() {
    let Some(m) = munged() else { return };
    // One worker per device, by default, and min-workers follows (1 node x 2); each
    // sees all of them (as under torchrun) with its own LOCAL_RANK; a LOCAL_RANK of
    // the batch script's environment does not leak through.
    for visible in [
        "3,5",
        "GPU-1f2e3d4c-aaaa-bbbb-cccc-000000000001,GPU-1f2e3d4c-aaaa-bbbb-cccc-000000000002",
    ] {
        let (all, logs) = under_visible_devices(&m, visible, "2");
        assert_eq!(logs.len(), 2, "{visible}: {logs:?}");
        for (id, rank) in [("1.0", 0), ("1.1", 1)] {
            let want = format!(
                "start local_rank={rank} cuda={visible} LOCAL_RANK={rank} LOCAL_WORLD_SIZE=2\n"
            );
            assert!(logs[id].contains(&want), "{visible}: {id}: {logs:?}");
        }
        assert!(all.contains("generation 1: 2 workers on 1 nodes"), "{all}");
        assert!(!all.contains("no GPUs on this node"), "{all}");
    }
    // Slurm's "no GPUs in this step": one worker, which sees it unchanged (CUDA finds
    // no device), and bft-run says why.
    let (all, logs) = under_visible_devices(&m, "NoDevFiles", "1");
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(
        logs["1.0"]
            .contains("start local_rank=0 cuda=NoDevFiles LOCAL_RANK=0 LOCAL_WORLD_SIZE=1\n"),
        "{logs:?}"
    );
    assert!(
        all.contains("bft-run: no GPUs on this node: CUDA_VISIBLE_DEVICES is \"NoDevFiles\""),
        "{all}"
    );
    // The same device twice is one device.
    let (_, logs) = under_visible_devices(&m, "0,0", "1");
    assert_eq!(logs.len(), 1, "{logs:?}");
}

/// The torch virtualenv (`BFT_VENV`, default /opt/bftrainer-venv), as faults.rs uses it.
fn venv_python() -> PathBuf {
    let venv =
        PathBuf::from(std::env::var("BFT_VENV").unwrap_or_else(|_| "/opt/bftrainer-venv".into()));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: make it with scripts/python-env (make test does)",
        python.display()
    );
    python
}

#[test]
fn torch_workers_on_two_stand_in_gpus_get_torchruns_variables_and_the_librarys_device() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env_worker.py");
    let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/src");
    let o = m
        .bft()
        .args(["--local", "1", "--"])
        .arg(venv_python())
        .arg(script)
        .env("TEST_DIR", tmp.path())
        .env("PYTHONPATH", lib)
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .env_remove("BFT_BACKEND")
        .output()
        .unwrap();
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    let mut ranks = Vec::new();
    for (id, local) in [("1.0", "0"), ("1.1", "1")] {
        let f = tmp.path().join(format!("{id}.json"));
        let seen: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}\n{all}", f.display())),
        )
        .unwrap();
        let s = |k: &str| seen[k].as_str().unwrap_or("-").to_string();
        assert_eq!(s("LOCAL_RANK"), local, "{seen}");
        assert_eq!(s("BFT_LOCAL_RANK"), local, "{seen}");
        assert_eq!(s("LOCAL_WORLD_SIZE"), "2", "{seen}");
        assert_eq!(s("CUDA_VISIBLE_DEVICES"), "0,1", "{seen}");
        assert_eq!(s("WORLD_SIZE"), "2", "{seen}");
        assert_eq!(s("RANK"), seen["rank"].to_string(), "{seen}");
        ranks.push(seen["rank"].as_u64().unwrap());
        if seen["cuda"].as_bool() == Some(true) {
            // A machine with GPUs: each worker on the GPU of its local rank.
            assert_eq!(s("device"), format!("cuda:{local}"), "{seen}");
            assert_eq!(s("backend"), "nccl", "{seen}");
        } else {
            // No CUDA device behind the stand-in ids: gloo on the CPU, and it says so.
            assert_eq!(
                (s("device"), s("backend")),
                ("cpu".into(), "gloo".into()),
                "{seen}"
            );
            assert!(
                all.contains(&format!(
                    "[{id}] bftrainer: worker {id}: no CUDA device (CUDA_VISIBLE_DEVICES '0,1'): gloo on the CPU"
                )),
                "{all}"
            );
        }
    }
    ranks.sort();
    assert_eq!(ranks, vec![0, 1], "{all}");
}

#[test]
fn stopped_and_silent_workers_are_killed_within_the_hang_timeout_and_restarted() {
    let Some(m) = munged() else { return };
    for (var, why) in [
        ("TEST_STOP", "stopped (SIGSTOP?)"),
        ("TEST_NO_HEARTBEAT", "no heartbeat for"),
    ] {
        let (all, _) = worker_2_0_replaced(&m, &["--hang-timeout", "2"], &[(var, "2.0")]);
        assert!(all.contains(&format!("worker 2.0 is hung: {why}")), "{all}");
        assert!(
            all.contains("worker 2.0 was killed by signal 9 ("),
            "the restart says why: {all}"
        );
    }
}

/// The pids whose parent is `parent`.
fn children(parent: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit(')')
                        .next()?
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
                == Some(parent)
        })
        .collect()
}

#[test]
fn a_frozen_node_is_dropped_within_the_hang_timeout() {
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let t = Instant::now();
    let (core, addr, job, run) = core_with_address(&m, &logs, &["--hang-timeout", "2"]);
    let wait_for = wait_until;
    let mut extra = hand_agent(&m, &addr, &job, &run, "frozen");
    // Either agent may be number 1 (they race to join; see below).
    wait_for("generation 2 with the extra node", &|| {
        worker_logs(&logs)
            .values()
            .any(|l| l.contains("gen 2 1.0 2.0") || l.contains("gen 2 2.0 1.0"))
    });
    // The whole node freezes: its agent and its worker (no TCP reset, no exit).
    let agent_pid = extra.get().id();
    let frozen = Instant::now();
    for pid in children(agent_pid).into_iter().chain([agent_pid as i32]) {
        // SAFETY: signalling processes this test started.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let out = core.take().wait_with_output().unwrap();
    let noticed = frozen.elapsed();
    for pid in children(agent_pid).into_iter().chain([agent_pid as i32]) {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = extra.get().wait();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    // The frozen agent is dropped. Its number is the order in which the two agents
    // joined, which they race for (both join within the same millisecond): read it from
    // the log. Had the other one been dropped, the frozen worker would be left and the
    // job could not finish (exit status above).
    let dropped = all
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("agent ")?;
            let (n, rest) = rest.split_once(' ')?;
            rest.starts_with("(127.0.0.1) sent nothing for")
                .then(|| n.parse::<u32>().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("no agent dropped for silence: {all}"));
    assert!(
        all.contains(&format!(
            "generation 3: 1 workers on 1 nodes (-{dropped}.0)"
        )),
        "{all}"
    );
    // The bound is 2 s (+ a tick); the job then finishes at once.
    assert!(
        noticed < Duration::from_secs(15),
        "noticed after {noticed:?}"
    );
    check_quick(t);
}

#[test]
fn two_agents_of_one_job_on_one_node_each_run_a_worker_on_their_own_gpu() {
    // GPU-granular lending (docs/admin.md, "GPU nodes") gives a job several satellites
    // of one GPU on one node: their agents join with the same node name, each with one
    // GPU in CUDA_VISIBLE_DEVICES (Slurm's binding of its step). Each starts one worker
    // on its GPU as local rank 0 of 1, and the three form one generation.
    let Some(m) = munged() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let coord_file = tmp.path().join("coord");
    let core = Guard(Some(
        run_local(
            &m,
            &logs,
            &[
                "--local",
                "1",
                "--min-workers",
                "1",
                "--coord-file",
                coord_file.to_str().unwrap(),
            ],
            &[("TEST_FINISH_AT", "2"), ("TEST_FINISH_SIZE", "3")],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    ));
    wait_until("the coordinator's address", &|| {
        read_coord_file(&coord_file).is_some()
    });
    let (addr, job, run) = read_coord_file(&coord_file).unwrap();
    let agent = |gpu: &str| {
        Guard(Some(
            agent_cmd(&m, &addr, &job, &run)
                .args(["--node-name", "n2"])
                .env_remove("TEST_DIR")
                .env("CUDA_VISIBLE_DEVICES", gpu)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ))
    };
    let a = agent("2");
    let b = agent("3");
    let out = core.take().wait_with_output().unwrap();
    let all = text(&out);
    let wl = worker_logs(&logs);
    assert_eq!(out.status.code(), Some(0), "{all}\n{wl:?}");
    for g in [a, b] {
        let o = g.take().wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "an agent on n2: {}", text(&o));
    }
    // The two agents' workers: one each, on its own GPU.
    let mut seen: Vec<String> = wl
        .iter()
        .filter(|(id, _)| id.as_str() != "1.0")
        .map(|(id, l)| {
            assert!(l.contains("done"), "{id}: {wl:?}");
            let start = l.lines().find(|x| x.starts_with("start ")).unwrap_or("");
            assert!(
                start.contains("local_rank=0") && start.contains("LOCAL_WORLD_SIZE=1"),
                "{id}: {start}"
            );
            start.to_string()
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 2, "{wl:?}");
    assert!(
        seen[0].contains("cuda=2 ") && seen[1].contains("cuda=3 "),
        "{seen:?}"
    );
    assert!(all.contains("3 workers on 3 nodes"), "{all}");
}
