//! Test fixture: a real Slurm cluster on localhost for integration tests.
//! Wraps `tests/cluster/cluster`: [`Cluster::start`] runs `up`, dropping the value runs `down`.
//!
//! ```no_run
//! let c = bftrainer_testcluster::Cluster::start(bftrainer_testcluster::Options {
//!     nodes: 2,
//!     ..Default::default()
//! })?;
//! let id = c.sbatch(&["-N2", "--wrap", "hostname"])?;
//! c.wait_for_state(id, &["COMPLETED"], std::time::Duration::from_secs(30))?;
//! # Ok::<(), bftrainer_testcluster::Error>(())
//! ```
//!
//! Tests that use it need root (the daemons run as root) and should have `cluster` in
//! their name or live in a test binary whose name starts with `cluster`, so nextest caps
//! how many run at once (docs/testing.md).

pub mod man;

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The non-root user every cluster has, for tests that submit on behalf of someone.
pub const TEST_USER: &str = "bftuser";
/// A second ordinary user (`cluster up` creates it): the attacker of tests where one
/// user must not reach another's jobs.
pub const OTHER_USER: &str = "bftuser2";

/// Set to `1` to leave the cluster of each test running after it ends (to poke at it
/// with sinfo/sacct); the fixture prints its `SLURM_CONF` and how to stop it.
pub const KEEP_ENV: &str = "BFTRAINER_KEEP_CLUSTER";

/// Overrides the path of the `cluster` script (default: `tests/cluster/cluster` of
/// this repository).
pub const SCRIPT_ENV: &str = "BFTRAINER_CLUSTER_SCRIPT";

/// What went wrong starting, using or stopping a test cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("test clusters need root (the Slurm daemons run as root); run the tests as root")]
    NotRoot,
    #[error("bad cluster option: {0}")]
    BadOption(String),
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`cluster up` failed (exit {code}); logs kept in {logs}:\n{stderr}")]
    Up {
        code: i32,
        logs: String,
        stderr: String,
    },
    #[error("`cluster down` failed (exit {code}): {stderr}")]
    Down { code: i32, stderr: String },
    #[error("`{command}` failed (exit {code}): {stderr}")]
    Command {
        command: String,
        code: i32,
        stderr: String,
    },
    #[error("unexpected output of `{command}`: {output:?}")]
    Output { command: String, output: String },
    #[error("timed out after {waited:?} waiting for {what}; last seen: {last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How to start a cluster. `Options { nodes: 4, ..Default::default() }` is the usual one.
#[derive(Debug, Clone)]
pub struct Options {
    /// Number of nodes `n1..nN` (1 to 64), 2 CPUs each.
    pub nodes: usize,
    /// Directory holding `job_submit_bftrainer.so` and `spank_bftrainer.so`: loads them.
    pub plugins: Option<PathBuf>,
    /// A `bftrainer.toml` to place beside slurm.conf.
    pub bftrainer_conf: Option<PathBuf>,
    /// Names the cluster's directory and kept logs; default: the running test's name.
    pub name: Option<String>,
    /// Longest wait for all nodes to become idle.
    pub up_timeout: Duration,
    /// The Slurm release to run (`cluster up --slurm`): "22.05" (the host's packages),
    /// "24.11" or "26.05" (Debian roots, scripts/slurm-root). Default: `BFT_SLURM_RELEASE`
    /// if set, else the release this process runs with (the root's when the tests run
    /// inside one, as `make test` does for 24.11 and 26.05).
    pub slurm: Option<String>,
    /// Stand-in GPUs as GRES `gpu` (`cluster up --gpus`): "4", "a100:4", or per node
    /// "1-2=a100:4,3=v100:2". Each is a character device like /dev/null under the
    /// cluster's `dev/nK/`; Slurm allocates them and sets CUDA_VISIBLE_DEVICES.
    pub gpus: Option<String>,
    /// Confine each job to its GPUs (`cluster up --constrain-devices`: task/cgroup with
    /// `ConstrainDevices=yes`, cgroup v1). The stand-in GPUs then have device numbers of
    /// their own (major 195): opening one the job holds fails with ENXIO (no driver),
    /// one it does not hold with EPERM. Needs `gpus`.
    pub constrain_devices: bool,
    /// GPU nodes that regular jobs share (`cluster up --shared-gpus`), e.g. "3-4": in
    /// partitions `shared` (regular jobs, OverSubscribe=NO) and `shared-sat` (GPU
    /// satellites, a lower PriorityTier, PreemptMode=CANCEL), with a CPU per GPU.
    pub shared_gpus: Option<String>,
    /// Further plugstack.conf lines (`cluster up --plugstack-line`), after ours: other
    /// SPANK plugins, such as a test's stand-in for pyxis.
    pub plugstack_lines: Vec<String>,
    /// slurm.conf's `PreemptType=preempt/qos` instead of `preempt/partition_prio`
    /// (`cluster up --preempt-type qos`): the test makes the QOS with sacctmgr.
    pub preempt_qos: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 4,
            plugins: None,
            bftrainer_conf: None,
            name: None,
            up_timeout: Duration::from_secs(60),
            slurm: std::env::var("BFT_SLURM_RELEASE")
                .ok()
                .filter(|v| !v.is_empty()),
            gpus: None,
            constrain_devices: false,
            shared_gpus: None,
            plugstack_lines: Vec::new(),
            preempt_qos: false,
        }
    }
}

/// A running cluster; stopped (and its directory removed) on drop. If the thread is
/// panicking at that point, its logs are first copied to `target/cluster-logs/`.
pub struct Cluster {
    dir: PathBuf,
    slurm_conf: PathBuf,
    nodes: Vec<String>,
    name: String,
    stopped: bool,
    /// Stops the cluster if this process dies without dropping it (a test killed by
    /// nextest's timeout, SIGKILL): otherwise its daemons would run on forever.
    watchdog: Option<Child>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("nodes", &self.nodes)
            .finish()
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    /// Brings up a cluster (about 2 s) and waits until all its nodes are idle.
    pub fn start(opts: Options) -> Result<Cluster, Error> {
        // Options first: a bad one is the caller's mistake whoever runs the test.
        if opts.nodes == 0 || opts.nodes > 64 {
            return Err(Error::BadOption(format!(
                "nodes = {}; allowed are 1 to 64",
                opts.nodes
            )));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { geteuid() } != 0 {
            return Err(Error::NotRoot);
        }
        let name = sanitize(&opts.name.clone().unwrap_or_else(test_name));
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        // /tmp, not target/ or $TMPDIR: unix socket paths must stay under 108 bytes, and
        // jobs of bftuser must be able to enter the directory.
        let tmp = Path::new("/tmp");
        let dir = tempfile::Builder::new()
            .prefix(&format!("bftc-{}-{seq}-", short(&name, 24)))
            .tempdir_in(tmp)
            .map_err(|source| Error::Io {
                what: "cannot create a cluster directory in",
                path: tmp.to_path_buf(),
                source,
            })?
            .keep();
        let mut cmd = Command::new(script());
        cmd.arg("up")
            .arg("--dir")
            .arg(&dir)
            .arg("--nodes")
            .arg(opts.nodes.to_string())
            .arg("--timeout")
            .arg(opts.up_timeout.as_secs_f64().to_string());
        if let Some(p) = &opts.plugins {
            cmd.arg("--plugins").arg(p);
        }
        if let Some(p) = &opts.bftrainer_conf {
            cmd.arg("--bftrainer-conf").arg(p);
        }
        if let Some(v) = &opts.slurm {
            cmd.arg("--slurm").arg(v);
        }
        if let Some(g) = &opts.gpus {
            cmd.arg("--gpus").arg(g);
        }
        if opts.constrain_devices {
            cmd.arg("--constrain-devices");
        }
        if let Some(g) = &opts.shared_gpus {
            cmd.arg("--shared-gpus").arg(g);
        }
        if opts.preempt_qos {
            cmd.arg("--preempt-type").arg("qos");
        }
        for line in &opts.plugstack_lines {
            cmd.arg("--plugstack-line").arg(line);
        }
        let out = run_script(&mut cmd)?;
        if !out.status.success() {
            // `up` has already stopped what it started; keep its logs for the reader,
            // if it got as far as starting a daemon.
            let started = std::fs::read_dir(dir.join("log")).is_ok_and(|mut d| d.next().is_some());
            let logs = if started {
                keep_logs(&dir, &format!("{name}-start"))
                    .map_or_else(|e| format!("(not kept: {e})"), |p| p.display().to_string())
            } else {
                "(none: no daemon was started)".to_string()
            };
            let _ = std::fs::remove_dir_all(&dir);
            return Err(Error::Up {
                code: out.status.code().unwrap_or(-1),
                logs,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(slurm_conf) = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export SLURM_CONF="))
            .map(PathBuf::from)
        else {
            let _ = down(&dir);
            return Err(Error::Output {
                command: "cluster up".into(),
                output: stdout.to_string(),
            });
        };
        let watchdog = if keep_requested() {
            None
        } else {
            match spawn_watchdog(&dir) {
                Ok(w) => Some(w),
                Err(e) => {
                    let _ = down(&dir);
                    return Err(e);
                }
            }
        };
        Ok(Cluster {
            dir,
            slurm_conf,
            nodes: (1..=opts.nodes).map(|i| format!("n{i}")).collect(),
            name,
            stopped: false,
            watchdog,
        })
    }

    /// slurm.conf of this cluster: set `SLURM_CONF` to it before `slurm_init`.
    pub fn slurm_conf(&self) -> &Path {
        &self.slurm_conf
    }

    /// Node names, `n1..nN`.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The cluster's directory; daemon logs are under `log/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Daemon logs: slurmctld.log, slurmd-nK.log, slurmdbd.log, mariadb.log, munged.log.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// A directory every user may write to (mode 1777); commands run there, so jobs'
    /// `slurm-%j.out` land in it.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// `program` with `SLURM_CONF` set and the work dir as its working directory. For a
    /// cluster of another release started from the host, `DIR/bin` (that release's client
    /// commands, run through its root's loader) comes first on `PATH`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.slurm_conf)
            .current_dir(self.work_dir());
        let bin = self.dir.join("bin");
        if bin.is_dir() {
            let mut path = std::ffi::OsString::from(&bin);
            if let Some(old) = std::env::var_os("PATH") {
                path.push(":");
                path.push(old);
            }
            c.env("PATH", path);
        }
        c
    }

    /// `cluster.json`, what `cluster up` recorded.
    fn state(&self) -> Result<(PathBuf, serde_json::Value), Error> {
        let path = self.dir.join("cluster.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            what: "cannot read",
            path: path.clone(),
            source,
        })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Output {
            command: format!("reading {}", path.display()),
            output: e.to_string(),
        })?;
        Ok((path, v))
    }

    /// The pid of one of the cluster's daemons (`slurmctld`, `slurmd-n1`, ...), for
    /// fault injection a test does itself (SIGSTOP/SIGCONT: a controller that hangs).
    pub fn daemon_pid(&self, name: &str) -> Result<u32, Error> {
        let (path, v) = self.state()?;
        v["daemons"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .filter(|d| d["name"] == name)
            .find_map(|d| d["pid"].as_u64())
            .map(|p| p as u32)
            .ok_or_else(|| Error::Output {
                command: format!("reading {}", path.display()),
                output: format!("no daemon named {name}"),
            })
    }

    /// The Slurm version the cluster runs (`24.11.5`), as `cluster up` recorded it.
    pub fn slurm_version(&self) -> Result<String, Error> {
        let (path, v) = self.state()?;
        v.get("slurm")
            .and_then(|s| s.as_str())
            .map(str::to_string)
            .ok_or_else(|| Error::Output {
                command: format!("reading {}", path.display()),
                output: "no \"slurm\" field".into(),
            })
    }

    /// Like [`Cluster::command`], but run as [`TEST_USER`].
    pub fn command_as_test_user(&self, program: impl AsRef<OsStr>) -> Result<Command, Error> {
        self.command_as(TEST_USER, program)
    }

    /// Like [`Cluster::command`], but run as `user` (its uid, gid, USER and LOGNAME).
    pub fn command_as(&self, user: &str, program: impl AsRef<OsStr>) -> Result<Command, Error> {
        use std::os::unix::process::CommandExt;
        let (uid, gid) = user_ids(user)?;
        let mut c = self.command(program);
        c.uid(uid).gid(gid).env("USER", user).env("LOGNAME", user);
        Ok(c)
    }

    /// Runs a Slurm command on this cluster; its stdout, or an error carrying stderr.
    pub fn run<S: AsRef<OsStr>>(&self, program: &str, args: &[S]) -> Result<String, Error> {
        let mut c = self.command(program);
        c.args(args);
        checked(&mut c)
    }

    /// `sbatch --parsable ARGS`: the new job's id.
    pub fn sbatch<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<u32, Error> {
        let mut c = self.command("sbatch");
        c.arg("--parsable").args(args);
        parse_job_id(&checked(&mut c)?)
    }

    /// The job's state as slurmctld reports it (`PENDING`, `RUNNING`, ...), or from
    /// accounting once slurmctld has forgotten it.
    pub fn job_state(&self, job: u32) -> Result<String, Error> {
        let id = job.to_string();
        let out = self.run("squeue", &["-h", "-j", &id, "-o", "%T"])?;
        if let Some(s) = out.lines().next().filter(|s| !s.trim().is_empty()) {
            return Ok(s.trim().to_string());
        }
        let out = self.run("sacct", &["-n", "-X", "-P", "-j", &id, "-o", "State"])?;
        // sacct appends "by UID" to CANCELLED; keep the bare state.
        Ok(out
            .lines()
            .last()
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("UNKNOWN")
            .to_string())
    }

    /// Polls [`Cluster::job_state`] until it is one of `states`; returns it.
    pub fn wait_for_state(
        &self,
        job: u32,
        states: &[&str],
        timeout: Duration,
    ) -> Result<String, Error> {
        let mut last = String::new();
        wait_until(
            &format!("job {job} to reach {}", states.join("|")),
            timeout,
            || {
                last = self.job_state(job)?;
                Ok(states.contains(&last.as_str()).then(|| last.clone()))
            },
        )
        .map_err(|e| match e {
            Error::Timeout { what, waited, .. } => Error::Timeout {
                what,
                waited,
                last: last.clone(),
            },
            e => e,
        })
    }

    /// Stops one of the cluster's daemons (`slurmctld`, `slurmdbd`, `slurmd-nK`, ...):
    /// SIGTERM, or SIGKILL with `kill`. For fault tests; [`Cluster::start_daemon`]
    /// starts it again with the same command line.
    pub fn stop_daemon(&self, name: &str, kill: bool) -> Result<(), Error> {
        let mut cmd = Command::new(script());
        cmd.arg("stop-daemon").arg(name).arg("--dir").arg(&self.dir);
        if kill {
            cmd.arg("--kill");
        }
        self.daemon_cmd(cmd, "stop-daemon")
    }

    /// Starts a daemon stopped by [`Cluster::stop_daemon`] and waits for its port.
    pub fn start_daemon(&self, name: &str) -> Result<(), Error> {
        let mut cmd = Command::new(script());
        cmd.arg("start-daemon")
            .arg(name)
            .arg("--dir")
            .arg(&self.dir);
        self.daemon_cmd(cmd, "start-daemon")
    }

    fn daemon_cmd(&self, mut cmd: Command, what: &str) -> Result<(), Error> {
        let out = run_script(&mut cmd)?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("cluster {what}"),
                code: out.status.code().unwrap_or(-1),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Stops the cluster now and removes its directory; errors if a daemon stays up.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stopped = true;
        let r = down(&self.dir);
        self.end_watchdog();
        r
    }

    fn end_watchdog(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if keep_requested() {
            eprintln!(
                "bftrainer-testcluster: {KEEP_ENV}=1: left running; export SLURM_CONF={}; \
                 stop with: {} down --dir {} --purge",
                self.slurm_conf.display(),
                script().display(),
                self.dir.display()
            );
            return;
        }
        let panicking = std::thread::panicking();
        // A failed test's cluster stops cleanly first, so its kept logs include the
        // daemons' shutdown; a passed test's is killed and deleted at once (~0.3 s
        // instead of ~2 s, mostly slurmctld's shutdown).
        let stopped = down_only(&self.dir, !panicking);
        if panicking {
            match keep_logs(&self.dir, &self.name) {
                Ok(p) => eprintln!(
                    "bftrainer-testcluster: test failed; cluster logs kept in {}",
                    p.display()
                ),
                Err(e) => eprintln!("bftrainer-testcluster: could not keep the logs: {e}"),
            }
        }
        match stopped {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Err(e) => eprintln!(
                "bftrainer-testcluster: stopping {} failed: {e}",
                self.dir.display()
            ),
        }
        self.end_watchdog();
    }
}

/// Calls `f` every 100 ms until it returns `Some`, an error, or `timeout` passes.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    let start = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                what: what.to_string(),
                waited: start.elapsed(),
                last: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where `target/cluster-logs/` is: beside the test binary's profile directory.
pub fn kept_logs_root() -> PathBuf {
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("cluster-logs");
    }
    // Test binaries live in target/<profile>/deps/.
    if let Ok(exe) = std::env::current_exe() {
        if let Some(target) = exe
            .ancestors()
            .skip_while(|p| p.file_name() != Some(OsStr::new("deps")))
            .nth(2)
        {
            return target.join("cluster-logs");
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/cluster-logs")
}

fn keep_requested() -> bool {
    std::env::var(KEEP_ENV).is_ok_and(|v| v == "1")
}

/// A shell that waits for this process to end, then runs `down --fast --purge`. In its own
/// process group, so that a kill of the test's group does not take it along.
fn spawn_watchdog(dir: &Path) -> Result<Child, Error> {
    use std::os::unix::process::CommandExt;
    let me = std::process::id().to_string();
    Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down --dir "$3" --fast --purge"#)
        .arg("bftc-watchdog")
        .arg(me)
        .arg(script())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: "/bin/sh (cluster watchdog)".into(),
            source,
        })
}

fn script() -> PathBuf {
    std::env::var_os(SCRIPT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/cluster"))
}

fn down_only(dir: &Path, fast: bool) -> Result<(), Error> {
    let mut cmd = Command::new(script());
    cmd.arg("down").arg("--dir").arg(dir);
    if fast {
        cmd.args(["--fast", "--purge"]);
    }
    let out = run_script(&mut cmd)?;
    if !out.status.success() {
        return Err(Error::Down {
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn down(dir: &Path) -> Result<(), Error> {
    down_only(dir, false)?;
    std::fs::remove_dir_all(dir).map_err(|source| Error::Io {
        what: "cannot remove the cluster directory",
        path: dir.to_path_buf(),
        source,
    })
}

/// Copies logs, configs and cluster.json of `dir` to target/cluster-logs/<name>-<pid>/.
fn keep_logs(dir: &Path, name: &str) -> Result<PathBuf, Error> {
    let dest = kept_logs_root().join(format!("{name}-{}", std::process::id()));
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    std::fs::create_dir_all(&dest).map_err(io("cannot create", &dest))?;
    for sub in ["log", "etc"] {
        let from = dir.join(sub);
        let Ok(entries) = std::fs::read_dir(&from) else {
            continue;
        };
        let to = dest.join(sub);
        std::fs::create_dir_all(&to).map_err(io("cannot create", &to))?;
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let target = to.join(e.file_name());
                std::fs::copy(e.path(), &target).map_err(io("cannot copy to", &target))?;
            }
        }
    }
    let state = dir.join("cluster.json");
    if state.exists() {
        std::fs::copy(&state, dest.join("cluster.json")).map_err(io("cannot copy", &state))?;
    }
    Ok(dest)
}

fn run_output(cmd: &mut Command) -> Result<Output, Error> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: format!("{:?}", cmd.get_program()),
            source,
        })
}

/// Runs the cluster script. Its exec fails with "not found" when its interpreter
/// (python3) is missing although the script itself exists: say which.
fn run_script(cmd: &mut Command) -> Result<Output, Error> {
    run_output(cmd).map_err(|e| match e {
        Error::Spawn { program, source }
            if source.kind() == std::io::ErrorKind::NotFound
                && Path::new(cmd.get_program()).is_file() =>
        {
            Error::Spawn {
                program: format!(
                    "{program} (it exists: its interpreter, python3, is missing? \
                     `scripts/install-deps --system` installs it)"
                ),
                source,
            }
        }
        e => e,
    })
}

fn checked(cmd: &mut Command) -> Result<String, Error> {
    let out = run_output(cmd)?;
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    if !out.status.success() {
        return Err(Error::Command {
            command,
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn parse_job_id(out: &str) -> Result<u32, Error> {
    // --parsable prints "ID" or "ID;CLUSTER".
    out.trim()
        .split(';')
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Output {
            command: "sbatch --parsable".into(),
            output: out.to_string(),
        })
}

/// uid and primary gid of a local user (from /etc/passwd), e.g. [`TEST_USER`]'s.
pub fn user_ids(user: &str) -> Result<(u32, u32), Error> {
    let passwd = Path::new("/etc/passwd");
    let text = std::fs::read_to_string(passwd).map_err(|source| Error::Io {
        what: "cannot read",
        path: passwd.to_path_buf(),
        source,
    })?;
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == user)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .ok_or_else(|| {
            Error::BadOption(format!(
                "user {user} not in /etc/passwd (`cluster up` creates it)"
            ))
        })
}

/// libtest runs each test on a thread named after it (nextest too, one per process).
fn test_name() -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_string(),
        _ => "cluster".to_string(),
    }
}

fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.trim_matches('_').chars().take(100).collect()
}

fn short(s: &str, n: usize) -> String {
    // The tail of a test path (`module::test_name`) tells tests apart best.
    let chars: Vec<char> = s.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

extern "C" {
    fn geteuid() -> u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_parsable_sbatch_output() {
        assert_eq!(parse_job_id("42\n").unwrap(), 42);
        assert_eq!(parse_job_id("7;bftest\n").unwrap(), 7);
        assert!(matches!(
            parse_job_id("Submitted batch job 3"),
            Err(Error::Output { .. })
        ));
    }

    #[test]
    fn sanitizes_test_names_for_paths() {
        assert_eq!(sanitize("mod::a_test"), "mod__a_test");
        assert_eq!(short("abcdef", 3), "def");
        assert_eq!(short("ab", 3), "ab");
    }

    #[test]
    fn finds_the_test_user_or_says_why_not() {
        let err = user_ids("no-such-user-here").unwrap_err().to_string();
        assert!(err.contains("no-such-user-here"), "{err}");
        assert_eq!(user_ids("root").unwrap(), (0, 0));
    }

    #[test]
    fn rejects_bad_node_counts_before_starting_anything() {
        for nodes in [0, 65] {
            let err = Cluster::start(Options {
                nodes,
                ..Default::default()
            })
            .unwrap_err();
            assert!(matches!(err, Error::BadOption(_)), "{nodes}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("nodes = {nodes}")) && msg.contains("1 to 64"),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_missing_script_interpreter_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("cluster");
        std::fs::write(&script, "#!/nonexistent/python3\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let err = run_script(Command::new(&script).arg("up")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Spawn { .. }), "{msg}");
        assert!(msg.contains("python3, is missing"), "{msg}");
        // A script that is not there at all is reported as such, without the hint.
        let gone = dir.path().join("nothing-here");
        let msg = run_script(&mut Command::new(&gone))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("nothing-here") && !msg.contains("python3"),
            "{msg}"
        );
    }

    #[test]
    fn kept_logs_go_under_target() {
        let root = kept_logs_root();
        assert!(root.ends_with("cluster-logs"), "{}", root.display());
    }
}
