//! What bft-run's test binaries share: a private munged (bft-run authenticates with
//! MUNGE), a child killed on drop, waiting for a condition. Each test binary compiles
//! this module for itself and uses part of it.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BFT: &str = env!("CARGO_BIN_EXE_bft-run");

/// A munged of our own (the socket in a private directory), stopped on drop.
pub struct Munged {
    dir: tempfile::TempDir,
    child: Child,
}

impl Munged {
    /// Starts one; None (the test says it is skipped, and why) where munged is missing.
    pub fn try_start() -> Option<Munged> {
        let found = Command::new("munged")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            eprintln!("SKIPPED: munged (the munge package) is not installed");
            return None;
        }
        Some(Munged::start())
    }

    pub fn start() -> Munged {
        let dir = tempfile::Builder::new()
            .prefix("bftrun-munge")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.path().join("key");
        let mut bytes = vec![0u8; 1024];
        // SAFETY: bytes is writable for its length.
        unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
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
        wait_until("munged's socket", Duration::from_secs(10), &mut || {
            m.socket().exists()
        });
        m
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// A credential for `payload`, encoded by `user` (None: this process's user).
    pub fn cred(&self, user: Option<&str>, payload: &str) -> String {
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

    /// bft-run, talking to this munged, outside any Slurm job or MPI world.
    pub fn bft(&self) -> Command {
        let mut c = Command::new(BFT);
        c.env("BFT_MUNGE_SOCKET", self.socket())
            .env_remove("SLURM_JOB_ID")
            .env_remove("BFT_RSH_TOKEN");
        c
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed if the test fails before it was waited for.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `f()` holds, failing the test after `limit`.
pub fn wait_until(what: &str, limit: Duration, f: &mut dyn FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The steps a test program took, in order, from its JSON log lines (lines with
/// `"hold": true` say where it waited, not a step).
pub fn steps_taken(lines: &[serde_json::Value]) -> Vec<u64> {
    lines
        .iter()
        .filter(|l| l["hold"] == false)
        .map(|l| l["step"].as_u64().unwrap())
        .collect()
}

/// The `rate=` of the Comment that bft-run's `--comment-file` holds, if any.
#[allow(dead_code)] // not every test binary that includes this module asks
pub fn comment_rate(path: &std::path::Path) -> Option<f64> {
    let c = std::fs::read_to_string(path).ok()?;
    c.split_whitespace()
        .find_map(|w| w.strip_prefix("rate="))?
        .parse()
        .ok()
}
