//! Shared by the live daemon tests and the live benchmark: a directory other users can
//! enter (bftuser's jobs load the SPANK plugin and run the join script from it), the
//! staged plugins, a join script, and a bftrainer.toml for the test cluster's
//! partitions (`elastic`, `elastic-sat`).

#![allow(dead_code)]

use bftrainer_testcluster::{wait_until, Cluster, Options};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A satellite's join command for tests and benchmarks (bft-run is another issue):
/// logs where it runs and stays up until signalled; `BAD_NODE` makes it fail at once
/// on that node.
pub const JOIN: &str = r#"#!/bin/sh
echo "joined parent $1 on $SLURMD_NODENAME at $(date +%s.%N)"
if [ -n "$BAD_NODE" ] && [ "$SLURMD_NODENAME" = "$BAD_NODE" ]; then echo "broken node" >&2; exit 3; fi
if [ -n "$BAD_USER" ] && [ "$(id -un)" = "$BAD_USER" ]; then echo "broken environment" >&2; exit 3; fi
exec sleep 3600
"#;

pub struct Setup {
    /// Nodes of the cluster (`n1..nN`); also the largest MAX a request may ask for.
    pub nodes: usize,
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub plugins: PathBuf,
    pub state: PathBuf,
    pub conf: PathBuf,
}

/// Writes everything a live cluster with bftrainerd needs under a new /tmp directory.
/// `policy_extra` and `daemon_extra` are lines added to `[policy]` and `[daemon]`;
/// satellites fail on `bad_node` (empty: none).
pub fn setup(prefix: &str, policy_extra: &str, daemon_extra: &str, bad_node: &str) -> Setup {
    setup_join(
        prefix,
        policy_extra,
        daemon_extra,
        &|join: &std::path::Path| format!("env BAD_NODE={bad_node} {} {{parent}}", join.display()),
    )
}

/// As [`setup`], with the satellites' join command made from the path of the test
/// join script (a real runtime ignores it).
pub fn setup_join(
    prefix: &str,
    policy_extra: &str,
    daemon_extra: &str,
    join_command: &dyn Fn(&std::path::Path) -> String,
) -> Setup {
    setup_sized(prefix, 4, policy_extra, daemon_extra, join_command)
}

/// As [`setup_join`], for a cluster of `nodes` nodes (1 to 64; `max_nodes` follows).
pub fn setup_sized(
    prefix: &str,
    nodes: usize,
    policy_extra: &str,
    daemon_extra: &str,
    join_command: &dyn Fn(&std::path::Path) -> String,
) -> Setup {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = super::support::stage_plugins(&dir.join("plugins"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let join = dir.join("join.sh");
    std::fs::write(&join, JOIN).unwrap();
    std::fs::set_permissions(&join, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.join("bftrainer.toml");
    std::fs::write(
        &conf,
        format!(
            "[policy]\npartition = \"elastic\"\nsatellite_partition = \"elastic-sat\"\n\
             daemon_user = \"root\"\nmax_nodes = {nodes}\n{policy_extra}\n\
             [daemon]\nstate_dir = \"{}\"\npoll_interval = 0.5\nshrink_grace = 3\n\
             grow_timeout = 20\nnode_backoff = 120\n{daemon_extra}\n\
             [engine]\nt_fwd = 600\n\
             [runtime]\njoin_command = \"{}\"\n\
             satellite_output = \"/dev/null\"\n",
            state.display(),
            join_command(&join)
        ),
    )
    .unwrap();
    Setup {
        nodes,
        tmp,
        dir,
        plugins,
        state,
        conf,
    }
}

/// Builds the stand-in for another site's SPANK plugin (tests/cluster/stand_in_spank.c,
/// option `--stand-in-image=NAME`) into `dir` with cc, against the Slurm headers of the
/// release under test. Returns its plugstack.conf line and the directory its records go
/// to (one file per job prolog and per step: `prolog.J.0`, `step.J.S`).
pub fn stand_in_plugin(dir: &Path) -> (String, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/cluster/stand_in_spank.c");
    let so = dir.join("stand_in_spank.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).unwrap();
    let records = dir.join("standin");
    std::fs::create_dir_all(&records).unwrap();
    (
        format!("optional {} out={}", so.display(), records.display()),
        records,
    )
}

/// What the stand-in SPANK plugin recorded for job `id`: `(file name, image it was
/// given)` for its prolog and each of its steps.
pub fn stand_in_records(records: &Path, id: u32) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(records)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let mut parts = name.split('.');
            let (_, job) = (parts.next()?, parts.next()?);
            if job != id.to_string() {
                return None;
            }
            let text = std::fs::read_to_string(records.join(&name)).ok()?;
            let image = text.trim_end().split_once(" image=")?.1.to_string();
            Some((name, image))
        })
        .collect();
    v.sort();
    v
}

/// This process's peak RSS in MB (VmHWM), for the benchmarks.
pub fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `--name value` from the command line, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub const GRACE_TIME_S: u64 = 5;

/// A node that carries two running jobs in one `squeue` sample, if any ("node n3 holds
/// jobs 5 and 9").
pub fn double_allocation(rows: &[Row]) -> Option<String> {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.state == "RUNNING") {
        for n in bftrainer_slurm::hostlist_expand(&r.nodes).unwrap() {
            if let Some(other) = seen.insert(n.clone(), r.id) {
                return Some(format!("node {n} holds jobs {other} and {}", r.id));
            }
        }
    }
    None
}

/// A slow slurmctld for one client, with no kernel feature (no netem): a TCP proxy on
/// 127.0.0.1 that, for each connection it accepts, waits `delay`, then connects to
/// slurmctld and copies both ways until either side closes. libslurm opens a
/// connection per call, so every call through it takes `delay` more; clients using the
/// cluster's own slurm.conf (the tests' squeue, sbatch, the slurmds) are not slowed.
pub struct DelayProxy {
    pub port: u16,
    pub delay: Duration,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl DelayProxy {
    pub fn start(upstream: SocketAddr, delay: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the proxy");
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, quit) = (accepted.clone(), stop.clone());
        let acceptor = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if quit.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || relay(client, upstream, delay));
            }
        });
        DelayProxy {
            port,
            delay,
            accepted,
            stop,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which then sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// One proxied connection: the delay, then bytes both ways until either side closes.
/// If slurmctld cannot be reached the client sees its connection closed.
fn relay(client: TcpStream, upstream: SocketAddr, delay: Duration) {
    std::thread::sleep(delay);
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let pump = |mut from: TcpStream, mut to: TcpStream| {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    if to.write_all(&buf[..k]).is_err() {
                        break;
                    }
                }
            }
        }
        // Either side closed: close both, which ends the other direction too.
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    };
    let up = std::thread::spawn(move || pump(c2, s2));
    pump(server, client);
    let _ = up.join();
}

/// slurmctld's address from a cluster's slurm.conf (`SlurmctldPort`, on 127.0.0.1 as
/// `SlurmctldHost` names it in the test clusters).
pub fn slurmctld_addr(slurm_conf: &Path) -> SocketAddr {
    let text = std::fs::read_to_string(slurm_conf).unwrap();
    let port: u16 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("SlurmctldPort="))
        .and_then(|p| p.trim().parse().ok())
        .expect("SlurmctldPort in slurm.conf");
    assert!(
        text.lines()
            .any(|l| l.starts_with("SlurmctldHost=") && l.contains("(127.0.0.1)")),
        "the test cluster's slurmctld listens on 127.0.0.1"
    );
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A copy of `slurm_conf` beside it (same directory, so anything found relative to it
/// is the same) whose `SlurmctldPort` is `port`, everything else as it was: the
/// controller's address, the munge socket (`AuthInfo`, `AccountingStoragePass`), the
/// plugin directory and plugstack, the timeouts.
pub fn slurm_conf_via(slurm_conf: &Path, port: u16, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(slurm_conf).unwrap();
    let mut replaced = 0;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("SlurmctldPort=") {
                replaced += 1;
                format!("SlurmctldPort={port}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(
        replaced,
        1,
        "one SlurmctldPort line in {}",
        slurm_conf.display()
    );
    let path = slurm_conf.with_file_name(name);
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
    path
}

pub struct Live {
    pub c: Cluster,
    pub dir: PathBuf,
    pub conf: PathBuf,
    pub log: PathBuf,
    pub daemon: Option<Child>,
    /// The slurm.conf bftrainerd reads, when not the cluster's (a proxied slurmctld).
    pub daemon_slurm_conf: Option<PathBuf>,
    pub _tmp: tempfile::TempDir,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        if std::thread::panicking() || std::env::var_os("BFTD_TEST_SHOW_LOG").is_some() {
            eprintln!(
                "--- bftrainerd log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: u32,
    pub name: String,
    pub state: String,
    pub nodes: String,
    pub partition: String,
}

impl Live {
    pub fn start(policy_extra: &str, daemon_extra: &str, bad_node: &str) -> Live {
        let mut l = Live::start_without_daemon(policy_extra, daemon_extra, bad_node);
        l.spawn();
        l
    }

    pub fn start_without_daemon(policy_extra: &str, daemon_extra: &str, bad_node: &str) -> Live {
        Live::from_setup(setup("bftd", policy_extra, daemon_extra, bad_node))
    }

    pub fn from_setup(s: Setup) -> Live {
        Live::from_setup_with(s, Options::default())
    }

    /// As [`Live::from_setup`], with other cluster options (stand-in GPUs...); the
    /// plugins, bftrainer.toml and node count are the setup's (4 unless it was sized).
    pub fn from_setup_with(s: Setup, opts: Options) -> Live {
        let Setup {
            nodes,
            tmp,
            dir,
            plugins,
            conf,
            ..
        } = s;
        let c = Cluster::start(Options {
            nodes,
            plugins: Some(plugins),
            bftrainer_conf: Some(conf.clone()),
            ..opts
        })
        .expect("cluster with the plugins");
        let log = dir.join("bftrainerd.log");
        Live {
            c,
            dir,
            conf,
            log,
            daemon: None,
            daemon_slurm_conf: None,
            _tmp: tmp,
        }
    }

    pub fn daemon_cmd(&self) -> Command {
        let mut cmd = self.c.command(env!("CARGO_BIN_EXE_bftrainerd"));
        cmd.arg("--config").arg(&self.conf).env(
            "RUST_LOG",
            std::env::var("BFTD_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
        if let Some(conf) = &self.daemon_slurm_conf {
            cmd.env("SLURM_CONF", conf);
        }
        cmd
    }

    pub fn spawn(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let child = self
            .daemon_cmd()
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start bftrainerd");
        self.daemon = Some(child);
    }

    pub fn kill9(&mut self) {
        let mut d = self.daemon.take().expect("daemon running");
        d.kill().unwrap();
        d.wait().unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn squeue(&self) -> Vec<Row> {
        let out = self
            .c
            .run("squeue", &["-h", "-a", "-o", "%i|%j|%T|%N|%P"])
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                (f.len() == 5).then(|| Row {
                    id: f[0].trim().parse().unwrap_or(0),
                    name: f[1].to_string(),
                    state: f[2].to_string(),
                    nodes: f[3].to_string(),
                    partition: f[4].to_string(),
                })
            })
            .collect()
    }

    /// Running satellites of `parent`: node -> job id.
    pub fn satellites(&self, parent: u32) -> BTreeMap<String, u32> {
        self.squeue()
            .into_iter()
            .filter(|r| r.name == format!("bftsat-{parent}") && r.state == "RUNNING")
            .map(|r| (r.nodes, r.id))
            .collect()
    }

    pub fn active_satellites(&self, parent: u32) -> usize {
        self.squeue()
            .into_iter()
            .filter(|r| {
                r.name == format!("bftsat-{parent}")
                    && ["RUNNING", "PENDING", "CONFIGURING"].contains(&r.state.as_str())
            })
            .count()
    }

    pub fn state_of(&self, id: u32) -> String {
        // slurmctld's view first (works while slurmdbd is away), then accounting.
        let out = self
            .c
            .run("scontrol", &["show", "job", "-o", &id.to_string()])
            .unwrap_or_default();
        if let Some(st) = out
            .split_whitespace()
            .find_map(|f| f.strip_prefix("JobState="))
        {
            return st.to_string();
        }
        self.c.job_state(id).unwrap_or_default()
    }

    pub fn wait<T>(&self, secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        wait_until(what, Duration::from_secs(secs), || Ok(f()))
            .unwrap_or_else(|e| panic!("{e}\nsqueue: {:#?}", self.squeue()))
    }

    /// Running nodes of elastic job `job`: its core's plus its running satellites'.
    pub fn elastic_size(&self, job: u32) -> usize {
        self.squeue()
            .into_iter()
            .filter(|r| r.state == "RUNNING" && (r.id == job || r.name == format!("bftsat-{job}")))
            .map(|r| bftrainer_slurm::hostlist_expand(&r.nodes).unwrap().len())
            .sum()
    }

    /// A regular (root's, partition batch) exclusive job on `nodes` nodes running
    /// `sleep SECS`: what takes nodes back from elastic jobs in these tests.
    pub fn regular(&self, nodes: u32, secs: u32) -> u32 {
        let n = format!("-N{nodes}");
        let cmd = format!("sleep {secs}");
        self.c
            .sbatch(&[
                "-p",
                "batch",
                &n,
                "--exclusive",
                "-o",
                "/dev/null",
                "--wrap",
                &cmd,
            ])
            .unwrap()
    }

    /// An elastic job of bftuser that runs its work in a step.
    pub fn submit_elastic(&self, spec: &str) -> u32 {
        self.submit_elastic_with(spec, &[])
    }

    /// As [`Live::submit_elastic`], with more sbatch options (e.g. `-A ACCOUNT`).
    pub fn submit_elastic_with(&self, spec: &str, more: &[&str]) -> u32 {
        let elastic = format!("--elastic={spec}");
        let mut args = vec![elastic.as_str()];
        args.extend_from_slice(more);
        args.extend_from_slice(&["-J", "train", "-o", "/dev/null", "--wrap", "srun sleep 600"]);
        self.sbatch_as_user(&args, None)
    }

    /// As [`Live::submit_elastic`], as `user` (e.g. the second test user).
    pub fn submit_elastic_as(&self, user: &str, spec: &str) -> u32 {
        self.submit_elastic_as_with(user, spec, &[])
    }

    /// As [`Live::submit_elastic_as`], with more sbatch options (e.g. `--qos=high`).
    pub fn submit_elastic_as_with(&self, user: &str, spec: &str, more: &[&str]) -> u32 {
        let mut cmd = self.c.command_as(user, "sbatch").unwrap();
        cmd.current_dir("/tmp")
            .args(["--parsable", &format!("--elastic={spec}")])
            .args(more)
            .args(["-J", "train", "-o", "/dev/null", "--wrap", "srun sleep 600"]);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "sbatch as {user}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// `sbatch --parsable ARGS` as the test user (bftuser), in `dir` if given: the
    /// job id; a refusal fails the test with sbatch's message.
    pub fn sbatch_as_user(&self, args: &[&str], dir: Option<&std::path::Path>) -> u32 {
        let mut cmd = self.c.command_as_test_user("sbatch").unwrap();
        cmd.arg("--parsable").args(args);
        if let Some(d) = dir {
            cmd.current_dir(d);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "sbatch {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Every node of the cluster carries at most one running job (elastic jobs own
    /// whole nodes; no node in two elastic jobs).
    pub fn assert_no_double_allocation(&self) {
        let rows = self.squeue();
        if let Some(e) = double_allocation(&rows) {
            panic!("{e}: {rows:#?}");
        }
    }

    /// `bftrainer CMD --json` as root against this daemon (Null when it does not answer).
    pub fn cli_json(&self, cmd: &str) -> serde_json::Value {
        let out = self
            .c
            .command(env!("CARGO_BIN_EXE_bftrainer"))
            .args([cmd, "--json", "--config"])
            .arg(&self.conf)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    /// Waits until the daemon has run `n` more cycles than when it first answers
    /// `bftrainer status`.
    pub fn cycles_later(&self, n: u64) {
        let cycles = || self.cli_json("status")["stats"]["cycles"].as_u64();
        let c0 = self.wait(30, "bftrainer status", cycles);
        self.wait(30, &format!("{n} more daemon cycles"), || {
            cycles().filter(|&c| c >= c0 + n)
        });
    }

    pub fn grown_to_all(&self, job: u32) -> BTreeMap<String, u32> {
        self.grown_to_all_within(job, 60)
    }

    /// As [`Live::grown_to_all`], waiting at most `secs` seconds.
    pub fn grown_to_all_within(&self, job: u32, secs: u64) -> BTreeMap<String, u32> {
        self.wait(
            secs,
            &format!("job {job} to run on 1 node plus 3 satellites"),
            || {
                let sats = self.satellites(job);
                (self.state_of(job) == "RUNNING" && sats.len() == 3).then_some(sats)
            },
        )
    }
}

/// `Restarts=` of job `id` in slurmctld.
pub fn restarts(l: &Live, id: u32) -> String {
    let out =
        l.c.run("scontrol", &["show", "job", "-o", &id.to_string()])
            .unwrap_or_default();
    out.split_whitespace()
        .find_map(|f| f.strip_prefix("Restarts="))
        .unwrap_or("?")
        .to_string()
}

/// Job `job` runs as before (`sats`: its running satellites then), never requeued.
pub fn same(l: &Live, job: u32, sats: &std::collections::BTreeMap<String, u32>, what: &str) {
    assert_eq!(restarts(l, job), "0", "{what}: job {job} was requeued");
    assert_eq!(l.state_of(job), "RUNNING", "{what}");
    assert_eq!(&l.satellites(job), sats, "{what}: satellites changed");
    assert_eq!(l.active_satellites(job), 3, "{what}: a duplicate satellite");
}

/// A second bftrainerd beside the test's: its config (another state_dir, `extra` in
/// `[daemon]`) and its log.
pub struct Other {
    pub conf: std::path::PathBuf,
    pub log: std::path::PathBuf,
    pub child: Option<std::process::Child>,
}

impl Other {
    pub fn new(l: &Live, name: &str, daemon_extra: &str) -> Other {
        let state = l.dir.join(name);
        std::fs::create_dir_all(&state).unwrap();
        let conf = l.dir.join(format!("{name}.toml"));
        let text = std::fs::read_to_string(&l.conf).unwrap();
        let text = text
            .lines()
            .map(|line| {
                if line.starts_with("state_dir = ") {
                    format!("state_dir = \"{}\"\n{daemon_extra}", state.display())
                } else {
                    line.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&conf, text).unwrap();
        Other {
            conf,
            log: l.dir.join(format!("{name}.log")),
            child: None,
        }
    }

    pub fn spawn(&mut self, l: &Live) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let err = out.try_clone().unwrap();
        let child =
            l.c.command(env!("CARGO_BIN_EXE_bftrainerd"))
                .arg("--config")
                .arg(&self.conf)
                .env("RUST_LOG", "info")
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap();
        self.child = Some(child);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn status(&self, l: &Live) -> serde_json::Value {
        let out =
            l.c.command(env!("CARGO_BIN_EXE_bftrainer"))
                .args(["status", "--json", "--config"])
                .arg(&self.conf)
                .output()
                .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    pub fn stop(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, sig) };
            let _ = c.wait();
        }
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        self.stop(libc::SIGKILL);
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
    }
}
