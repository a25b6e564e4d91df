//! bft-run without Slurm (`--local`), against a private munged: clear errors, a
//! worker's exit code and stderr tail, and the coordinator refusing forged agents
//! (another uid, a credential made for another connection, a replayed one, another
//! protocol version, garbage).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BFT: &str = env!("CARGO_BIN_EXE_bft-run");

/// A munged of our own, in a directory other users can reach (bftuser makes
/// credentials too).
struct Munged {
    dir: tempfile::TempDir,
    child: Child,
}

impl Munged {
    fn start() -> Munged {
        let dir = tempfile::Builder::new()
            .prefix("bftrun-munge")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.path().join("key");
        let bytes: Vec<u8> = (0..1024).map(|_| rand_byte()).collect();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
        let child = Command::new("munged")
            .args([
                "--foreground",
                "--force",
                &format!("--socket={}", p("sock")),
                &format!("--key-file={}", p("key")),
                &format!("--pid-file={}", p("pid")),
                &format!("--log-file={}", p("log")),
                &format!("--seed-file={}", p("seed")),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("munged (the munge package) is needed");
        let m = Munged { dir, child };
        let t = Instant::now();
        while !m.socket().exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "munged did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn cred(&self, user: Option<&str>, payload: &str) -> String {
        let mut c = match user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--", "munge"]);
                c
            }
            None => Command::new("munge"),
        };
        let out = c
            .arg("-S")
            .arg(self.socket())
            .args(["-s", payload])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "munge: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn bft(&self) -> Command {
        let mut c = Command::new(BFT);
        c.env("BFT_MUNGE_SOCKET", self.socket())
            .env_remove("SLURM_JOB_ID");
        c
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_byte() -> u8 {
    let mut b = [0u8; 1];
    // SAFETY: b is writable for its length.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 1, 0) };
    b[0]
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
    let m = Munged::start();
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
    let t = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&f) {
            if s.ends_with('\n') {
                return Coord {
                    child,
                    addr: s.trim().to_string(),
                };
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no coordinator address"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Conn {
    s: TcpStream,
    r: BufReader<TcpStream>,
    nonce: String,
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
        let h = serde_json::json!({"t": "hello", "proto": proto, "cred": cred, "host": "127.0.0.1", "nproc": 1});
        self.send(&h.to_string())
    }
}

fn payload(nonce: &str) -> String {
    format!("bftrainer-run:v1 job=local nonce={nonce}")
}

#[test]
fn forged_agents_are_refused_and_the_coordinator_keeps_serving() {
    let m = Munged::start();
    let tmp = tempfile::tempdir().unwrap();
    let c = sleeping_coordinator(&m, tmp.path());

    // Another user's credential, made for this very connection.
    let mut a = connect(&c.addr);
    let cred = m.cred(Some("bftuser"), &payload(&a.nonce));
    let r = a.hello(&cred, a.proto);
    assert_eq!(r["t"], "error", "{r}");
    assert!(
        r["msg"].as_str().unwrap().contains("credential of uid"),
        "{r}"
    );

    // Our own credential, made for another connection's nonce, then replayed on that one.
    let mut a = connect(&c.addr);
    let mut b = connect(&c.addr);
    let cred = m.cred(None, &payload(&a.nonce));
    let r = b.hello(&cred, b.proto);
    assert!(
        r["msg"]
            .as_str()
            .unwrap()
            .contains("another job or connection"),
        "{r}"
    );
    let r = a.hello(&cred, a.proto);
    assert!(
        r["msg"].as_str().unwrap().contains("replayed credential"),
        "{r}"
    );

    // Another protocol version, and garbage.
    let mut d = connect(&c.addr);
    let cred = m.cred(None, &payload(&d.nonce));
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

    // A genuine one is still welcome.
    let mut f = connect(&c.addr);
    let cred = m.cred(None, &payload(&f.nonce));
    let r = f.hello(&cred, f.proto);
    assert_eq!(r["t"], "welcome", "{r}");
    assert_eq!(r["argv"][0], "sleep");
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
        text(&o).contains("protocol 99, this agent 1"),
        "{}",
        text(&o)
    );
}
