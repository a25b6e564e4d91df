//! Replay results held byte for byte: the `--json` reports of the real binary on fixed
//! inputs, less their wall-clock fields, against files committed in
//! `tests/golden/`. Any change of the simulator's results (a streaming rewrite must
//! not make one) shows here as a diff. After a deliberate change of results, rewrite
//! them with `BFT_BLESS=1 cargo nextest run -p bftrainer-daemon --test replay_golden`
//! and say why in the commit.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Fields that measure this machine, not the replay.
const TIMING: [&str; 5] = [
    "decision_max_ms",
    "decision_mean_ms",
    "decision_p99_ms",
    "decision_total_s",
    "wall_s",
];

fn strip(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for k in TIMING {
                m.remove(k);
            }
            m.values_mut().for_each(strip);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"))
}

/// Runs the replay in `dir` (inputs named relative to it, so that the report, which
/// names them, is the same in every checkout).
fn check_in(dir: &Path, name: &str, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .current_dir(dir)
        .arg("replay")
        .args(args)
        .arg("--json")
        .output()
        .expect("run bftrainer replay");
    assert!(
        out.status.success(),
        "bftrainer replay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    strip(&mut v);
    let text = serde_json::to_string_pretty(&v).unwrap() + "\n";
    let path = golden(name);
    if std::env::var_os("BFT_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; write it with BFT_BLESS=1", path.display()));
    if text != want {
        let line = text
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "replay {args:?} differs from {} from line {}:\n  now:    {}\n  golden: {}",
            path.display(),
            line + 1,
            text.lines().nth(line).unwrap_or("(end)"),
            want.lines().nth(line).unwrap_or("(end)")
        );
    }
}

fn check(name: &str, args: &[&str]) {
    check_in(Path::new(env!("CARGO_MANIFEST_DIR")), name, args);
}

#[test]
fn replay_sample_results_are_unchanged() {
    check("sample-6h", &["--hours", "6"]);
    check(
        "sample-6h-trace-steps-grace",
        &[
            "--hours", "6", "--steps", "trace", "--grace", "30", "--seed", "3",
        ],
    );
    check(
        "sample-3h-efficiency-repeat",
        &["--hours", "3", "--objective", "efficiency", "--repeat"],
    );
    // Batch size as a decision (Saxena; McCandlish's noise scale): fixed vs joint.
    check(
        "sample-3h-batch-noise-4096",
        &[
            "--hours",
            "3",
            "--batch-range",
            "256:8192",
            "--noise-scale",
            "4096",
        ],
    );
    check(
        "sample-3h-arrivals",
        &[
            "--hours",
            "3",
            "--arrivals",
            "40",
            "--seed",
            "5",
            "--node-limit",
            "2000",
        ],
    );
}

/// A real SWF log through the EASY model (forecasts, reclaim-aware objective).
#[test]
fn replay_swf_results_are_unchanged() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/swf");
    let log = "LLNL-Atlas-2006-2.1-cln.swf.gz";
    assert!(
        dir.join(log).exists(),
        "{}: the repository's data/ folder lacks the Atlas log (data/README.md)",
        dir.display()
    );
    check_in(
        &dir,
        "atlas-72h-reclaim-aware",
        &[
            "--swf",
            log,
            "--hours",
            "72",
            "--objective",
            "reclaim-aware",
        ],
    );
    check_in(
        &dir,
        "atlas-48h-conservative",
        &[
            "--swf",
            log,
            "--hours",
            "48",
            "--backfill",
            "conservative",
            "--max-jobs",
            "4",
        ],
    );
}

/// Windows on both inputs: a start inside the trace (earlier changes fold into the
/// initial state, the plan's forecast carries over), an end, and a node limit.
#[test]
fn replay_windows_are_unchanged() {
    check(
        "sample-window-limit",
        &[
            "--start",
            "2021-02-11T02:00:00",
            "--end",
            "2021-02-11T07:30:00",
            "--node-limit",
            "3000",
            "--objective",
            "reclaim-aware",
        ],
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/swf");
    check_in(
        &dir,
        "atlas-window-limit",
        &[
            "--swf",
            "LLNL-Atlas-2006-2.1-cln.swf.gz",
            "--start",
            "2007-01-15T00:00:00",
            "--hours",
            "30",
            "--node-limit",
            "700",
            "--objective",
            "reclaim-aware",
        ],
    );
}

/// The log's own start times (`--start-times log`): the Atlas log with a wait time
/// made up for every job (job number x 37 mod 3,600 s), so that jobs start when the
/// log says, overcommitting the machine at times.
#[test]
fn replay_log_start_times_are_unchanged() {
    use std::io::{BufRead, Write};
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/swf/LLNL-Atlas-2006-2.1-cln.swf.gz");
    let dir = std::env::temp_dir().join(format!("bft-golden-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let r = std::io::BufReader::new(flate2::read::MultiGzDecoder::new(
        std::fs::File::open(&src).unwrap(),
    ));
    let mut w =
        std::io::BufWriter::new(std::fs::File::create(dir.join("atlas-waits.swf")).unwrap());
    for line in r.lines() {
        let line = line.unwrap();
        let mut f: Vec<String> = line.split_ascii_whitespace().map(String::from).collect();
        if !line.starts_with(';') && f.len() == 18 {
            let id: i64 = f[0].parse().unwrap();
            f[2] = (id * 37 % 3600).to_string();
            writeln!(w, "{}", f.join(" ")).unwrap();
        } else {
            writeln!(w, "{line}").unwrap();
        }
    }
    w.flush().unwrap();
    drop(w);
    check_in(
        &dir,
        "atlas-log-starts",
        &[
            "--swf",
            "atlas-waits.swf",
            "--start-times",
            "log",
            "--start",
            "2007-02-01T00:00:00",
            "--hours",
            "24",
            "--objective",
            "reclaim-aware",
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
