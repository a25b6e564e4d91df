//! Submission throughput through real sbatch with and without the bftrainer plugins, in
//! one run on one cluster: blocks of submissions alternate (A B C C B A ...) between the
//! plugins loaded, not loaded, and a floor, switched by editing slurm.conf and `scontrol
//! reconfigure` (slurmctld unloads/reloads job_submit plugins when JobSubmitPlugins
//! changes; sbatch re-reads PlugStackConfig on every run). Two separate clusters differ
//! by up to 15% on this machine with identical configs (A/A test), so all sides share one
//! cluster.
//!
//! The floor side loads a trivial C SPANK plugin (benches/fixtures/floor_spank.c, compiled here
//! with cc: it registers one option and does nothing else) and no job_submit plugin: what
//! loading any SPANK plugin costs sbatch, so `with/floor` is the cost that is ours.
//!
//! Streams: `plain` (the cost every non-elastic job pays: sbatch loads the SPANK plugin,
//! slurmctld calls job_submit) and `elastic` (`--elastic=2:4` with the plugins vs. the
//! hand-written equivalent without them). Prints submissions/s per side, the headline
//! ratio with/without with its 95% interval over paired blocks, the floor's ratios,
//! median latencies and sbatch CPU per side, and the plugin's own p50/p99 per
//! job_submit call as measured inside slurmctld.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use bftrainer_testcluster::{Cluster, Options};

struct Args {
    blocks: usize,
    block: usize,
    client_runs: usize,
}

fn args() -> Args {
    let mut a = Args {
        blocks: 20,
        block: 50,
        client_runs: 600,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut num = |what: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or_else(|| panic!("{what} needs a whole number >= 1"))
        };
        match k.as_str() {
            "--blocks" => a.blocks = num("--blocks"),
            "--block" => a.block = num("--block"),
            "--client-runs" => a.client_runs = num("--client-runs"),
            "--bench" => {}
            other => {
                panic!("unknown argument {other}; expected --blocks N (per side), --block JOBS, --client-runs N")
            }
        }
    }
    a
}

/// The three configurations compared; `side as usize` indexes the per-side arrays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// job_submit/bftrainer and spank_bftrainer loaded.
    With,
    /// No job_submit plugin, an empty plugstack.
    Without,
    /// No job_submit plugin, the trivial C SPANK plugin.
    Floor,
}

/// Per side: blocks in the order A B C C B A, so a linear drift in machine load
/// weighs the same on every side.
const ORDER: [Side; 6] = [
    Side::With,
    Side::Without,
    Side::Floor,
    Side::Floor,
    Side::Without,
    Side::With,
];

const SIDES: [(Side, &str); 3] = [
    (Side::With, "with"),
    (Side::Without, "without"),
    (Side::Floor, "floor"),
];

/// Full slurm.conf text per side, indexed by `Side as usize`.
struct Confs([String; 3]);

/// Compiles the floor plugin; cc and the Slurm headers are needed anyway to build
/// slurm-sys, so a failure here names the command to check.
fn build_floor_plugin(into: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fixtures/floor_spank.c");
    let out = into.join("spank_floor.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc} to build the floor plugin: {e}"));
    assert!(
        status.success(),
        "`{cc} -O2 -shared -fPIC -o {} {}` failed (needs <slurm/spank.h>)",
        out.display(),
        src.display()
    );
    out
}

/// Switches the cluster to `side` and waits until slurmctld runs with its
/// JobSubmitPlugins.
fn plugins(c: &Cluster, confs: &Confs, side: Side) {
    std::fs::write(c.slurm_conf(), &confs.0[side as usize]).unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure");
    let want = if side == Side::With {
        "bftrainer"
    } else {
        "(null)"
    };
    let shown = c.run("scontrol", &["show", "config"]).unwrap();
    let line = shown
        .lines()
        .find(|l| l.starts_with("JobSubmitPlugins"))
        .unwrap_or("");
    assert!(
        line.trim_end().ends_with(want),
        "JobSubmitPlugins did not switch: {line}"
    );
}

/// CPU seconds (user + system) of all waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One `sbatch ARGS`: its wall time and the CPU time sbatch itself used. The CPU time
/// isolates the client side (SPANK plugin load) from scheduling noise.
fn submit(c: &Cluster, args: &[&str]) -> (f64, f64) {
    let cpu0 = children_cpu();
    let start = Instant::now();
    let out = c.command("sbatch").args(args).output().expect("run sbatch");
    let took = start.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "sbatch {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (took, children_cpu() - cpu0)
}

/// sbatch's own CPU per side, without slurmctld in the loop: `sbatch --nodes=abc` loads
/// the SPANK stack, runs slurm_spank_init, then fails in option parsing. Each side has
/// its own slurm.conf copy (SLURM_CONF per run), so the sides interleave run by run
/// (order reversed every round) and no reconfigure is needed.
fn client_side(c: &Cluster, confs: &Confs, runs: usize) {
    let etc = c.slurm_conf().parent().expect("slurm.conf has a directory");
    let paths: Vec<_> = SIDES
        .iter()
        .map(|&(side, name)| {
            let p = etc.join(format!("slurm-client-{name}.conf"));
            std::fs::write(&p, &confs.0[side as usize]).unwrap();
            p
        })
        .collect();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..runs + 1 {
        let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for i in order {
            let cpu0 = children_cpu();
            let out = c
                .command("sbatch")
                .env("SLURM_CONF", &paths[i])
                .args(["--nodes=abc", "--wrap=true"])
                .output()
                .expect("run sbatch");
            let used = children_cpu() - cpu0;
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains("abc"),
                "sbatch --nodes=abc ({} side) should fail on the node count: {err}",
                SIDES[i].1
            );
            // Round 0 warms the page cache for every side.
            if round > 0 {
                cpu[i].push(used);
            }
        }
    }
    let u = cpu.each_mut().map(|v| median(v) * 1e6);
    println!(
        "client side: sbatch --nodes=abc --wrap=true (loads the SPANK stack, fails in option parsing), {runs} runs per side, interleaved"
    );
    println!(
        "  sbatch CPU p50: with {:.0} us, without {:.0} us, floor {:.0} us; SPANK cost: ours {:+.0} us, floor {:+.0} us, ours over floor {:+.0} us",
        u[0],
        u[1],
        u[2],
        u[0] - u[1],
        u[2] - u[1],
        u[0] - u[2]
    );
}

/// 95% interval of the with/without ratio from paired blocks: the k-th block of each
/// side ran within one A B C C B A round of the other, so their ratio cancels the
/// machine's slow drift; mean of the per-pair ratios +- 1.96 standard errors.
fn paired_interval(with: &[f64], without: &[f64]) -> (f64, f64) {
    let q: Vec<f64> = with.iter().zip(without).map(|(a, b)| a / b).collect();
    let n = q.len() as f64;
    if q.len() < 2 {
        return (f64::NAN, f64::NAN);
    }
    let mean = q.iter().sum::<f64>() / n;
    let var = q.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half = 1.96 * (var / n).sqrt();
    (mean - half, mean + half)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let a = args();
    let tmp = tempfile::tempdir().unwrap();
    let plugins_dir = support::stage_plugins(&tmp.path().join("plugins"));
    let conf = tmp.path().join("bftrainer.toml");
    std::fs::write(&conf, "[policy]\npartition = \"elastic\"\nmax_nodes = 4\n").unwrap();
    let c = Cluster::start(Options {
        nodes: 4,
        plugins: Some(plugins_dir),
        bftrainer_conf: Some(conf),
        name: Some("bench-submit".into()),
        ..Default::default()
    })
    .expect("cluster with plugins");
    // Cancelled jobs count against MaxJobCount (10000) until MinJobAge has passed; a run
    // submits more than that within the default 300 s, so purge them soon (every side
    // alike; slurmctld takes the new value at the first reconfigure).
    let with_text: String = std::fs::read_to_string(c.slurm_conf())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("MinJobAge="))
        .chain(["MinJobAge=10"])
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    let empty_stack = c.dir().join("etc/plugstack-empty.conf");
    std::fs::write(&empty_stack, "").unwrap();
    let floor_stack = c.dir().join("etc/plugstack-floor.conf");
    let floor_so = build_floor_plugin(tmp.path());
    std::fs::write(&floor_stack, format!("required {}\n", floor_so.display())).unwrap();
    let no_plugins = |stack: &Path| -> String {
        with_text
            .lines()
            .map(|l| {
                if l.starts_with("JobSubmitPlugins=") {
                    "#JobSubmitPlugins=".to_string()
                } else if l.starts_with("PlugStackConfig=") {
                    format!("PlugStackConfig={}", stack.display())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    };
    // In `Side` order: with, without, floor.
    let (without, floor) = (no_plugins(&empty_stack), no_plugins(&floor_stack));
    let confs = Confs([with_text, without, floor]);
    assert_ne!(
        confs.0[Side::With as usize],
        confs.0[Side::Without as usize],
        "slurm.conf has no plugin lines to switch"
    );

    // (stream, args with the plugins, args without them). The elastic baseline is what
    // job_submit/bftrainer turns `--elastic=2:4` into.
    // Plain runs again last: the first stream of a young cluster has shown a bias
    // (slurmdbd still busy), and the repeat tells drift from cost.
    let streams: [(&str, &[&str], &[&str]); 3] = [
        (
            "plain",
            &["--hold", "--wrap=true"],
            &["--hold", "--wrap=true"],
        ),
        (
            "elastic",
            &["--elastic=2:4", "--wrap=true"],
            &[
                "-p",
                "elastic",
                "-N",
                "2",
                "--requeue",
                "--exclusive",
                "--hold",
                "--comment=elastic",
                "--wrap=true",
            ],
        ),
        (
            "plain",
            &["--hold", "--wrap=true"],
            &["--hold", "--wrap=true"],
        ),
    ];
    client_side(&c, &confs, a.client_runs);

    println!(
        "submit_throughput: one cluster, {} blocks of {} submissions per side and stream, order A B C C B A",
        a.blocks, a.block
    );
    println!(
        "sides: with = both bftrainer plugins; without = no plugins; floor = a trivial C SPANK plugin, no job_submit plugin"
    );
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>13} {:>13} {:>10} {:>26} {:>26} {:>15}",
        "stream",
        "with/s",
        "without/s",
        "floor/s",
        "with/without",
        "floor/without",
        "with/floor",
        "p50 ms with/without/floor",
        "cpu ms with/without/floor",
        "w/wo 95% CI"
    );
    // Warm-up, discarded: page cache, munge credentials, slurmctld's first RPCs.
    for side in ORDER {
        plugins(&c, &confs, side);
        for _ in 0..a.block {
            submit(&c, streams[0].1);
        }
    }
    let _ = c.command("scancel").args(["-u", "root"]).output();
    for (name, with_args, without_args) in streams {
        // Per side (With, Without, Floor): latencies and sbatch CPU times.
        let mut lat: [Vec<f64>; 3] = Default::default();
        let mut cpu: [Vec<f64>; 3] = Default::default();
        // Submissions per second of each block, per side, for the paired interval.
        let mut blocks: [Vec<f64>; 3] = Default::default();
        for b in 0..3 * a.blocks {
            let side = ORDER[b % ORDER.len()];
            plugins(&c, &confs, side);
            let i = side as usize;
            let args = if side == Side::With {
                with_args
            } else {
                without_args
            };
            // The first submission after a switch pays for loading the plugins.
            submit(&c, args);
            let mut spent = 0.0;
            for _ in 0..a.block {
                let (wall, used) = submit(&c, args);
                lat[i].push(wall);
                cpu[i].push(used);
                spent += wall;
            }
            blocks[i].push(a.block as f64 / spent);
            let _ = c.command("scancel").args(["-u", "root"]).output();
        }
        let rate = |v: &[f64]| v.len() as f64 / v.iter().sum::<f64>();
        let r = [rate(&lat[0]), rate(&lat[1]), rate(&lat[2])];
        let ms = |v: &mut Vec<f64>| median(v) * 1e3;
        let m = lat.each_mut().map(ms);
        let u = cpu.each_mut().map(ms);
        let (lo, hi) = paired_interval(&blocks[0], &blocks[1]);
        println!(
            "{name:<8} {:>9.1} {:>9.1} {:>9.1} {:>13.3} {:>13.3} {:>10.3} {:>26} {:>26} {:>15}",
            r[0],
            r[1],
            r[2],
            r[0] / r[1],
            r[2] / r[1],
            r[0] / r[2],
            format!("{:.2}/{:.2}/{:.2}", m[0], m[1], m[2]),
            format!("{:.2}/{:.2}/{:.2}", u[0], u[1], u[2]),
            format!("{lo:.3}-{hi:.3}"),
        );
    }

    // The plugin's own time: a fresh load (fini resets its counters), then 1000 plain
    // and 1000 elastic submissions; it logs one summary per 1000 calls.
    plugins(&c, &confs, Side::Without);
    let log_path = c.log_dir().join("slurmctld.log");
    let skip = std::fs::read_to_string(&log_path).unwrap_or_default().len();
    plugins(&c, &confs, Side::With);
    for (name, with_args, _) in &streams[..2] {
        for _ in 0..1000 {
            submit(&c, with_args);
        }
        let _ = c.command("scancel").args(["-u", "root"]).output();
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        match log
            .get(skip..)
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.split("job_submit timing: ").nth(1))
            .next_back()
        {
            Some(l) => println!(
                "plugin's own time per job_submit call, {name} jobs (inside slurmctld): {l}"
            ),
            None => println!("plugin's own time, {name} jobs: no summary logged"),
        }
    }
}
