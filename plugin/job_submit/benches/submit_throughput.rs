//! Submission throughput through real sbatch with and without the bftrainer plugins, in
//! one run on one cluster: blocks of submissions alternate (ABBA) between the plugins
//! loaded and not loaded, switched by editing slurm.conf and `scontrol reconfigure`
//! (slurmctld unloads/reloads job_submit plugins when JobSubmitPlugins changes; sbatch
//! re-reads PlugStackConfig on every run). Two separate clusters differ by up to 15% on
//! this machine with identical configs (A/A test), so both sides share one cluster.
//!
//! Streams: `plain` (the cost every non-elastic job pays: sbatch loads the SPANK plugin,
//! slurmctld calls job_submit) and `elastic` (`--elastic=2:4` with the plugins vs. the
//! hand-written equivalent without them). Prints submissions/s per side, their ratio,
//! the ratio of median latencies, and the plugin's own p50/p99 per job_submit call as
//! measured inside slurmctld.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Instant;

use bftrainer_testcluster::{Cluster, Options};

struct Args {
    blocks: usize,
    block: usize,
}

fn args() -> Args {
    let mut a = Args {
        blocks: 20,
        block: 50,
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
            "--bench" => {}
            other => {
                panic!("unknown argument {other}; expected --blocks N (per side), --block JOBS")
            }
        }
    }
    a
}

/// Switches the cluster between plugins loaded (`on`) and not, and waits until
/// slurmctld runs with the new JobSubmitPlugins.
fn plugins(c: &Cluster, with_text: &str, without_text: &str, on: bool) {
    std::fs::write(c.slurm_conf(), if on { with_text } else { without_text }).unwrap();
    c.run("scontrol", &["reconfigure"])
        .expect("scontrol reconfigure");
    let want = if on { "bftrainer" } else { "(null)" };
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
    let with_text = std::fs::read_to_string(c.slurm_conf()).unwrap();
    let empty_stack = c.dir().join("etc/plugstack-empty.conf");
    std::fs::write(&empty_stack, "").unwrap();
    let without_text: String = with_text
        .lines()
        .map(|l| {
            if l.starts_with("JobSubmitPlugins=") {
                "#JobSubmitPlugins=".to_string()
            } else if l.starts_with("PlugStackConfig=") {
                format!("PlugStackConfig={}", empty_stack.display())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    assert_ne!(
        with_text, without_text,
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
    println!(
        "submit_throughput: one cluster, {} blocks of {} submissions per side and stream, ABBA",
        a.blocks, a.block
    );
    println!(
        "{:<8} {:>14} {:>14} {:>8} {:>12} {:>12} {:>10} {:>11} {:>11}",
        "stream",
        "with (jobs/s)",
        "without",
        "ratio",
        "p50 with",
        "p50 without",
        "p50 ratio",
        "cpu with",
        "cpu without"
    );
    // Warm-up, discarded: page cache, munge credentials, slurmctld's first RPCs.
    for on in [true, false, false, true] {
        plugins(&c, &with_text, &without_text, on);
        for _ in 0..a.block {
            submit(&c, streams[0].1);
        }
    }
    let _ = c.command("scancel").args(["-u", "root"]).output();
    for (name, with_args, without_args) in streams {
        let (mut lat_with, mut lat_without) = (Vec::new(), Vec::new());
        let (mut cpu_with, mut cpu_without) = (Vec::new(), Vec::new());
        for b in 0..2 * a.blocks {
            // A B B A A B B A ...: drifts in machine load cancel out.
            let on = matches!(b % 4, 0 | 3);
            plugins(&c, &with_text, &without_text, on);
            let args = if on { with_args } else { without_args };
            // The first submission after a switch pays for loading the plugins.
            submit(&c, args);
            let (lat, cpu) = if on {
                (&mut lat_with, &mut cpu_with)
            } else {
                (&mut lat_without, &mut cpu_without)
            };
            for _ in 0..a.block {
                let (wall, used) = submit(&c, args);
                lat.push(wall);
                cpu.push(used);
            }
            let _ = c.command("scancel").args(["-u", "root"]).output();
        }
        let rate = |v: &[f64]| v.len() as f64 / v.iter().sum::<f64>();
        let (r_with, r_without) = (rate(&lat_with), rate(&lat_without));
        let (m_with, m_without) = (median(&mut lat_with), median(&mut lat_without));
        let (c_with, c_without) = (median(&mut cpu_with), median(&mut cpu_without));
        println!(
            "{name:<8} {r_with:>14.1} {r_without:>14.1} {:>8.3} {:>10.2}ms {:>10.2}ms {:>10.3} {:>9.2}ms {:>9.2}ms",
            r_with / r_without,
            m_with * 1e3,
            m_without * 1e3,
            m_without / m_with,
            c_with * 1e3,
            c_without * 1e3,
        );
    }

    // The plugin's own time: a fresh load (fini resets its counters), then 1000 plain
    // and 1000 elastic submissions; it logs one summary per 1000 calls.
    plugins(&c, &with_text, &without_text, false);
    let log_path = c.log_dir().join("slurmctld.log");
    let skip = std::fs::read_to_string(&log_path).unwrap_or_default().len();
    plugins(&c, &with_text, &without_text, true);
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
