//! `bftrainer replay` as the log grows (issue 13): the LLNL Atlas SWF log concatenated
//! 1, 2, 4 and 8 times, each copy shifted past the end of the one before, replayed by
//! the release binary as a child process. Prints the child's peak RSS and wall time
//! (median of `--runs`), as ratios against the one-copy run: the target is RSS flat
//! within 20% and wall time at most linear in the copies. Then the full Summit trace
//! against its target of 1 s and 64 MB.
//!
//!   cargo bench -p bftrainer-daemon --bench replay_scale -- [--runs N] [--copies 1,2,4,8]

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data");
const SWF: &str = "swf/LLNL-Atlas-2006-2.1-cln.swf.gz";
const SUMMIT: &str = "bftrainer-summit/node-events.csv.gz";
const JOBS: &str = "bftrainer-summit/jobs-imagenet-imgps-1001.csv";
/// Cargo builds the package's binaries, in the bench profile, before its benchmarks.
const BFTRAINER: &str = env!("CARGO_BIN_EXE_bftrainer");
/// The machine of issue 13's year-long target.
const YEAR_NODES: i64 = 4360;

/// The value after `name` on the command line.
fn arg(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next().and(args.next())
}

/// Calls `f` with each line of the gzipped file at `path`. The log is streamed, never
/// held: Linux carries this process's peak RSS into the child's ru_maxrss across exec
/// (the child starts as a copy of us), so ours must stay well below the replay's.
fn each_line(path: &Path, mut f: impl FnMut(&str) -> Result<()>) -> Result<()> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for line in BufReader::new(GzDecoder::new(file)).lines() {
        f(&line?)?;
    }
    Ok(())
}

/// The whitespace fields of an SWF job line; None for a header (`;`) or blank line.
fn job_fields(line: &str) -> Result<Option<Vec<&str>>> {
    if line.trim_start().starts_with(';') || line.trim().is_empty() {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != 18 {
        return Err(format!("SWF job line with {} fields: {line:?}", fields.len()).into());
    }
    Ok(Some(fields))
}

fn num(field: &str) -> Result<f64> {
    field
        .parse()
        .map_err(|e| format!("SWF field {field:?}: {e}").into())
}

/// What one copy of the log is moved by against the one before: one past the largest
/// job number, and the span from the first submit to the last end, plus one second.
fn steps(swf: &Path) -> Result<(i64, f64)> {
    let (mut max_id, mut first, mut last) = (0, f64::INFINITY, f64::NEG_INFINITY);
    each_line(swf, |line| {
        if let Some(f) = job_fields(line)? {
            max_id = max_id.max(
                f[0].parse::<i64>()
                    .map_err(|e| format!("job number {:?}: {e}", f[0]))?,
            );
            let submit = num(f[1])?;
            first = first.min(submit);
            last = last.max(submit + num(f[2])?.max(0.0) + num(f[3])?.max(0.0));
        }
        Ok(())
    })?;
    if first > last {
        return Err(format!("{}: no jobs", swf.display()).into());
    }
    Ok((max_id + 1, (last - first).ceil() + 1.0))
}

/// How a log is rewritten: onto a larger machine, and out of order.
#[derive(Clone, Copy)]
struct Rewrite {
    /// Machine size: `MaxNodes` becomes this, `MaxProcs` and every job's processor
    /// counts (fields 5 and 8) scale with it; `None` keeps the log's.
    nodes: Option<(i64, f64)>,
    /// Swap each pair of job lines (half the jobs out of submit order), streaming.
    swap_pairs: bool,
}

const AS_IS: Rewrite = Rewrite {
    nodes: None,
    swap_pairs: false,
};

/// `copies` back-to-back copies of the log at `swf`, the header once, gzipped into
/// `out`; returns the lines written.
fn write_copies(
    swf: &Path,
    (id_step, span): (i64, f64),
    copies: usize,
    rw: Rewrite,
    out: &Path,
) -> Result<usize> {
    let mut w = GzEncoder::new(BufWriter::new(File::create(out)?), Compression::fast());
    let mut lines = 0;
    let mut held: Option<String> = None;
    for k in 0..copies {
        each_line(swf, |line| {
            match job_fields(line)? {
                None if k == 0 => match rw.nodes {
                    Some((n, _)) if line.contains("MaxNodes:") => writeln!(w, "; MaxNodes: {n}")?,
                    Some((_, scale)) if line.contains("MaxProcs:") => {
                        let procs = num(line.split(':').nth(1).unwrap_or("").trim())?;
                        writeln!(w, "; MaxProcs: {}", (procs * scale).round() as i64)?;
                    }
                    _ => writeln!(w, "{line}")?,
                },
                None => return Ok(()),
                Some(f) => {
                    let id = f[0].parse::<i64>()? + k as i64 * id_step;
                    let submit = shift(f[1], k as f64 * span)?;
                    let mut rest: Vec<String> = f[2..].iter().map(|s| s.to_string()).collect();
                    if let Some((_, scale)) = rw.nodes {
                        // Fields 5 and 8 (processors): rest[2] and rest[5].
                        for i in [2, 5] {
                            let p = num(&rest[i])?;
                            if p > 0.0 {
                                rest[i] = ((p * scale).round() as i64).max(1).to_string();
                            }
                        }
                    }
                    let text = format!("{id} {submit} {}", rest.join(" "));
                    match held.take() {
                        Some(prev) => {
                            writeln!(w, "{text}")?;
                            writeln!(w, "{prev}")?;
                        }
                        None if rw.swap_pairs => held = Some(text),
                        None => writeln!(w, "{text}")?,
                    }
                }
            }
            lines += 1;
            Ok(())
        })?;
    }
    if let Some(prev) = held {
        writeln!(w, "{prev}")?;
    }
    w.finish()?.flush()?;
    Ok(lines)
}

/// `field + by`, an integer where the field was one.
fn shift(field: &str, by: f64) -> Result<String> {
    Ok(match field.parse::<i64>() {
        Ok(v) => (v + by as i64).to_string(),
        Err(_) => (field.parse::<f64>()? + by).to_string(),
    })
}

/// One replay's figures, from the child's rusage and its `--json` report.
#[derive(Clone, Copy)]
struct Run {
    rss_mb: f64,
    wall_s: f64,
    hours: f64,
    harvested_node_h: f64,
}

/// Runs `bftrainer replay <input> --jobs JOBS --json` once; stdout and stderr go to
/// files in `dir` so the child never blocks on a pipe while we sit in wait4.
fn replay(input: &[&str], dir: &Path) -> Result<Run> {
    let (out_path, err_path) = (dir.join("stdout.json"), dir.join("stderr.txt"));
    let jobs = Path::new(DATA).join(JOBS);
    let t = Instant::now();
    let child = Command::new(BFTRAINER)
        .arg("replay")
        .args(input)
        .arg("--jobs")
        .arg(&jobs)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(File::create(&out_path)?)
        .stderr(File::create(&err_path)?)
        .spawn()
        .map_err(|e| format!("{BFTRAINER}: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own unreaped child; both pointers are to live locals. Reaping
    // it here (not with Child::wait) is what gives us its rusage; dropping `child`
    // afterwards neither waits nor kills.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } < 0 {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()).into());
    }
    let wall_s = t.elapsed().as_secs_f64();
    drop(child);
    let status = ExitStatus::from_raw(status);
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        return Err(format!("bftrainer replay {} ({status}):\n{stderr}", input.join(" ")).into());
    }
    let v: serde_json::Value = serde_json::from_reader(BufReader::new(File::open(&out_path)?))?;
    let report = |key: &str| {
        v["report"][key]
            .as_f64()
            .ok_or_else(|| format!("no report.{key} in the replay's JSON"))
    };
    Ok(Run {
        // Linux reports ru_maxrss in KiB.
        rss_mb: usage.ru_maxrss as f64 / 1024.0,
        wall_s,
        hours: report("hours")?,
        harvested_node_h: report("harvested_node_h")?,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `runs` replays of the same input: median RSS and wall; the report of the last
/// (the replay is deterministic).
fn measure(input: &[&str], runs: usize, dir: &Path) -> Result<Run> {
    let all = (0..runs)
        .map(|_| replay(input, dir))
        .collect::<Result<Vec<_>>>()?;
    let last = *all.last().ok_or("--runs must be at least 1")?;
    Ok(Run {
        rss_mb: median(all.iter().map(|r| r.rss_mb).collect()),
        wall_s: median(all.iter().map(|r| r.wall_s).collect()),
        ..last
    })
}

/// This process's peak RSS in MB, a floor under the children's (see `each_line`).
fn own_peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn bench(dir: &Path) -> Result<()> {
    let runs = arg("--runs").map_or(Ok(3), |v| v.parse())?;
    let copies: Vec<usize> = arg("--copies")
        .unwrap_or_else(|| "1,2,4,8".into())
        .split(',')
        .map(|c| c.trim().parse())
        .collect::<std::result::Result<_, _>>()?;
    if copies.is_empty() || copies.contains(&0) {
        return Err("--copies takes positive counts, as in 1,2,4,8".into());
    }
    for p in [SWF, SUMMIT, JOBS] {
        let p = Path::new(DATA).join(p);
        if !p.exists() {
            return Err(format!("missing input {}", p.display()).into());
        }
    }
    println!("{BFTRAINER}, median of {runs} run(s)\n");
    let swf = Path::new(DATA).join(SWF);
    let steps = steps(&swf)?;
    println!(
        "{:>6} {:>9} {:>9} {:>7} {:>8} {:>7} {:>10} {:>9} {:>13}",
        "copies",
        "lines",
        "RSS MB",
        "RSS x",
        "wall s",
        "wall x",
        "wall/copy",
        "hours",
        "harvested n-h"
    );
    let mut base = None;
    let (mut rss_lo, mut rss_hi, mut worst) = (f64::INFINITY, 0.0f64, 0.0f64);
    for &k in &copies {
        let copy = dir.join(format!("atlas-x{k}.swf.gz"));
        let lines = write_copies(&swf, steps, k, AS_IS, &copy)?;
        let r = measure(
            &["--swf", copy.to_str().ok_or("non-UTF-8 temp dir")?],
            runs,
            dir,
        )?;
        std::fs::remove_file(&copy)?;
        let (k0, r0): (usize, Run) = *base.get_or_insert((k, r));
        let (rss_x, wall_x) = (r.rss_mb / r0.rss_mb, r.wall_s / r0.wall_s);
        let per_copy = wall_x * k0 as f64 / k as f64;
        println!(
            "{k:>6} {lines:>9} {:>9.1} {rss_x:>7.2} {:>8.3} {wall_x:>7.2} {per_copy:>10.2} {:>9.1} {:>13.1}",
            r.rss_mb, r.wall_s, r.hours, r.harvested_node_h
        );
        (rss_lo, rss_hi) = (rss_lo.min(r.rss_mb), rss_hi.max(r.rss_mb));
        worst = worst.max(per_copy);
    }
    let spread = rss_hi / rss_lo;
    println!(
        "\nRSS flat within 20%: {} (max/min = {spread:.2})",
        yes(spread <= 1.2)
    );
    println!(
        "wall at most linear: {} (largest wall/copy = {worst:.2})",
        yes(worst <= 1.0)
    );

    let summit = Path::new(DATA).join(SUMMIT);
    let r = measure(
        &["--trace", summit.to_str().ok_or("non-UTF-8 data path")?],
        runs,
        dir,
    )?;
    println!(
        "\nSummit trace: {:.1} MB, {:.3} s (target 1 s, 64 MB); {:.1} h, {:.1} harvested node-h",
        r.rss_mb, r.wall_s, r.hours, r.harvested_node_h
    );

    // No year-long log of a 4,000-node machine is at hand: the stand-in is the Atlas
    // log on a 4,360-node machine (every job's processors x 4360/1152, so the load is
    // Atlas's), two copies (386 days), replayed over 8,760 h.
    println!("\nA year of a 4,360-node machine (stand-in: Atlas x 4360/1152, two copies, --hours 8760; target 2 s, 128 MB)");
    let scale = (YEAR_NODES, YEAR_NODES as f64 / 1152.0);
    for (what, swap_pairs) in [("sorted", false), ("unsorted", true)] {
        let year = dir.join(format!("year-{what}.swf.gz"));
        let rw = Rewrite {
            nodes: Some(scale),
            swap_pairs,
        };
        write_copies(&swf, steps, 2, rw, &year)?;
        let path = year.to_str().ok_or("non-UTF-8 temp dir")?;
        let r = measure(&["--swf", path, "--hours", "8760"], runs, dir)?;
        println!(
            "  {what:<9} {:>7.1} MB {:>7.3} s; {:.1} h, {:.1} harvested node-h",
            r.rss_mb, r.wall_s, r.hours, r.harvested_node_h
        );
        std::fs::remove_file(&year)?;
    }
    println!(
        "(this process's own peak RSS: {:.1} MB, a floor under the figures)",
        own_peak_rss_mb()
    );
    Ok(())
}

fn main() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("bftrainer-replay-scale-{}", std::process::id()));
    let result = std::fs::create_dir_all(&dir)
        .map_err(Into::into)
        .and_then(|()| bench(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        eprintln!("replay_scale: {e}");
        std::process::exit(1);
    }
}
