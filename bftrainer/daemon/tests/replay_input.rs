//! The real `bftrainer replay` binary on bad and unsorted inputs (no Slurm): records out
//! of time order are sorted with one warning (refused with --strict), SWF jobs the
//! model cannot use are skipped and named, a truncated gzip is refused with its line,
//! --repeat / --arrivals generate work or refuse what cannot, and no output file is
//! left behind by an error.

use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};

fn replay(args: &[&str]) -> Output {
    replay_env(args, &[])
}

/// A replay with these environment variables set.
fn replay_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .arg("replay")
        .arg("--quiet")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run bftrainer")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// The JSON report without what varies from run to run (wall and decision times) and
/// without the input's name.
fn report(o: &Output) -> Value {
    let (out, err) = text(o);
    assert!(o.status.success(), "{err}");
    let mut v: Value = serde_json::from_str(&out).unwrap();
    let r = v["report"].as_object_mut().unwrap();
    for k in [
        "decision_total_s",
        "decision_mean_ms",
        "decision_p99_ms",
        "decision_max_ms",
    ] {
        r.remove(k);
    }
    serde_json::json!({ "report": v["report"], "scheduler": v["scheduler"] })
}

/// One SWF data line: job id, submit, run time, processors.
fn swf(id: i64, submit: i64, run: i64, procs: i64) -> String {
    format!("{id} {submit} -1 {run} {procs} -1 -1 {procs} {run} -1 1 1 -1 1 -1 1 -1 -1\n")
}

const HEAD: &str = "; MaxNodes: 4\n; MaxProcs: 4\n; UnixStartTime: 1000\n";

#[test]
fn unsorted_swf_is_sorted_with_one_warning_and_refused_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let sorted: String = [(1, 0, 100, 2), (2, 1, 50, 4), (3, 2, 50, 2), (4, 3, 200, 1)]
        .iter()
        .map(|&(i, s, r, p)| swf(i, s, r, p))
        .collect();
    let lines: Vec<&str> = sorted.lines().collect();
    // Jobs 3 and 2 swapped, 1 moved last: 2 and 1 are earlier than the line before.
    let unsorted = format!(
        "{HEAD}{}\n{}\n{}\n{}\n",
        lines[2], lines[1], lines[3], lines[0]
    );
    let a = write(dir.path(), "sorted.swf", &format!("{HEAD}{sorted}"));
    let b = write(dir.path(), "unsorted.swf", &unsorted);
    let oa = replay(&["--swf", &a, "--json"]);
    let ob = replay(&["--swf", &b, "--json"]);
    assert_eq!(report(&oa), report(&ob));
    assert_eq!(text(&oa).1, "");
    assert_eq!(
        text(&ob).1,
        format!("warning: {b}: 2 of 4 records were out of submit-time order; sorted (use --strict to refuse such a file)\n")
    );
    let v: Value = serde_json::from_str(&text(&ob).0).unwrap();
    assert_eq!(v["warnings"].as_array().unwrap().len(), 1);
    let o = replay(&["--swf", &b, "--strict"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o),
        (
            String::new(),
            format!("bftrainer: error: {b}:5: submit time 1 is earlier than the previous job's 2: SWF jobs must be sorted by submit time\n")
        )
    );
}

#[test]
fn unsorted_node_events_are_sorted_and_refused_with_strict() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        "2021-01-01T00:00:00,a,1",
        "2021-01-01T00:00:00,b,0",
        "2021-01-01T00:10:00,b,1",
        "2021-01-01T00:20:00,a,0",
        "2021-01-01T00:30:00,a,1",
        "2021-01-01T01:00:00,b,0",
    ];
    let file = |order: &[usize]| {
        let mut s = String::from("time,node,idle\n");
        for &i in order {
            s.push_str(rows[i]);
            s.push('\n');
        }
        s
    };
    let a = write(dir.path(), "s.csv", &file(&[0, 1, 2, 3, 4, 5]));
    let b = write(dir.path(), "u.csv", &file(&[4, 0, 2, 1, 5, 3]));
    let oa = replay(&["--trace", &a, "--json"]);
    let ob = replay(&["--trace", &b, "--json"]);
    assert_eq!(report(&oa), report(&ob));
    assert_eq!(
        text(&ob).1,
        format!("warning: {b}: 3 of 6 records were out of time order; sorted (use --strict to refuse such a file)\n")
    );
    let o = replay(&["--trace", &b, "--strict"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o).1,
        format!("bftrainer: error: {b}:3: time 2021-01-01T00:00:00 is earlier than the previous row's 2021-01-01T00:30:00: rows must be sorted by time\n")
    );
}

/// A few hundred lines of the LLNL Atlas log (data/swf/, as the replay unit tests
/// use) moved out of order: the replay equals the sorted file's. The moved jobs have
/// submit times no other job has, so sorting restores exactly the original order.
#[test]
fn shuffled_llnl_lines_replay_as_the_sorted_log() {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/swf/LLNL-Atlas-2006-2.1-cln.swf.gz");
    let mut text_all = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(&p).expect("the LLNL log in data/swf"))
        .read_to_string(&mut text_all)
        .unwrap();
    let (head, jobs): (Vec<&str>, Vec<&str>) = text_all.lines().partition(|l| l.starts_with(';'));
    let jobs = &jobs[..3000];
    let submit = |l: &str| l.split_whitespace().nth(1).unwrap().parse::<i64>().unwrap();
    let mut n_at = std::collections::HashMap::new();
    for l in jobs {
        *n_at.entry(submit(l)).or_insert(0) += 1;
    }
    // Every 7th job with a unique submit time, 300 of them, reversed among their slots.
    let slots: Vec<usize> = (0..jobs.len())
        .filter(|&i| n_at[&submit(jobs[i])] == 1)
        .step_by(7)
        .take(300)
        .collect();
    assert_eq!(slots.len(), 300);
    let mut shuffled = jobs.to_vec();
    for (k, &i) in slots.iter().enumerate() {
        shuffled[i] = jobs[slots[slots.len() - 1 - k]];
    }
    let out_of_order = shuffled
        .windows(2)
        .filter(|w| submit(w[1]) < submit(w[0]))
        .count();
    let dir = tempfile::tempdir().unwrap();
    let body = |j: &[&str]| format!("{}\n{}\n", head.join("\n"), j.join("\n"));
    let a = write(dir.path(), "atlas.swf", &body(jobs));
    let b = write(dir.path(), "atlas-shuffled.swf", &body(&shuffled));
    let args = |f: &str| ["--swf", f, "--hours", "48", "--json"].map(String::from);
    let oa = replay(&args(&a).iter().map(String::as_str).collect::<Vec<_>>());
    let ob = replay(&args(&b).iter().map(String::as_str).collect::<Vec<_>>());
    let (ra, rb) = (report(&oa), report(&ob));
    assert!(ra["report"]["harvested_node_h"].as_f64().unwrap() > 0.0);
    assert_eq!(ra, rb);
    assert_eq!(
        text(&ob).1,
        format!("warning: {b}: {out_of_order} of 3,000 records were out of submit-time order; sorted (use --strict to refuse such a file)\n")
    );
    assert!(out_of_order > 100, "{out_of_order}");
    // Sorted in 31 runs of 97 jobs on disk (BFT_SORT_CHUNK, a test knob): the same.
    let oc = replay_env(
        &args(&b).iter().map(String::as_str).collect::<Vec<_>>(),
        &[("BFT_SORT_CHUNK", "97")],
    );
    assert_eq!(report(&oc), ra);
    assert_eq!(text(&oc).1, text(&ob).1);
}

/// With a chunk of 2 records (BFT_SORT_CHUNK, a test knob) an unsorted SWF log and an
/// unsorted node-event file are sorted in runs on an anonymous temporary file: the
/// replays equal the sorted files', with the same one warning. That the runs go to disk
/// shows in a temporary directory that does not exist: the error names the input and
/// $TMPDIR. A small file without the knob never touches the temporary directory.
#[test]
fn unsorted_inputs_sorted_in_runs_on_disk_replay_as_the_sorted_files() {
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<String> = [
        (1, 0, 100, 2),
        (2, 1, 50, 4),
        (3, 2, 50, 2),
        (4, 3, 200, 1),
        (5, 3, 70, 3),
        (6, 9, 20, 4),
    ]
    .iter()
    .map(|&(i, s, r, p)| swf(i, s, r, p))
    .collect();
    let pick = |order: &[usize]| order.iter().map(|&i| jobs[i].as_str()).collect::<String>();
    let sa = write(
        dir.path(),
        "s.swf",
        &format!("{HEAD}{}", pick(&[0, 1, 2, 3, 4, 5])),
    );
    let sb = write(
        dir.path(),
        "u.swf",
        &format!("{HEAD}{}", pick(&[5, 2, 4, 1, 3, 0])),
    );
    let rows = [
        "2021-01-01T00:00:00,a,1",
        "2021-01-01T00:00:00,b,0",
        "2021-01-01T00:00:00,c,1",
        "2021-01-01T00:10:00,b,1",
        "2021-01-01T00:20:00,a,0",
        "2021-01-01T00:20:00,c,0",
        "2021-01-01T00:30:00,a,1",
        "2021-01-01T01:00:00,b,0",
        "2021-01-01T02:00:00,c,1",
    ];
    let csv = |order: &[usize]| {
        let body: Vec<&str> = order.iter().map(|&i| rows[i]).collect();
        format!("time,node,idle\n{}\n", body.join("\n"))
    };
    let ca = write(dir.path(), "s.csv", &csv(&[0, 1, 2, 3, 4, 5, 6, 7, 8]));
    let cb = write(dir.path(), "u.csv", &csv(&[8, 4, 0, 3, 7, 1, 6, 5, 2]));
    let spill = [("BFT_SORT_CHUNK", "2")];
    for (flag, a, b, what) in [
        (
            "--swf",
            &sa,
            &sb,
            "3 of 6 records were out of submit-time order",
        ),
        ("--trace", &ca, &cb, "5 of 9 records were out of time order"),
    ] {
        let oa = replay(&[flag, a, "--json"]);
        let ob = replay_env(&[flag, b, "--json"], &spill);
        assert_eq!(report(&oa), report(&ob), "{flag}");
        assert_eq!(
            text(&ob).1,
            format!("warning: {b}: {what}; sorted (use --strict to refuse such a file)\n")
        );
        let nowhere = dir.path().join("no-such-dir");
        let nowhere = nowhere.to_str().unwrap();
        let o = replay_env(&[flag, b], &[spill[0], ("TMPDIR", nowhere)]);
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o).1;
        assert!(
            err.starts_with(&format!("bftrainer: error: {b}: sorting in a temporary file failed (it needs a writable $TMPDIR, else /tmp")),
            "{err}"
        );
        let o = replay_env(&[flag, b, "--json"], &[("TMPDIR", nowhere)]);
        assert_eq!(report(&o), report(&oa), "{flag}");
    }
    let o = replay_env(&["--swf", &sb], &[("BFT_SORT_CHUNK", "0")]);
    assert_eq!(
        text(&o).1,
        "bftrainer: error: BFT_SORT_CHUNK must be a number of records >= 1, found \"0\"\n"
    );
}

#[test]
fn swf_jobs_wider_than_the_header_or_with_bad_run_times_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let body: String = [
        swf(1, 0, 100, 2),
        swf(2, 1, 50, 8),
        swf(3, 2, -7, 2),
        swf(4, 3, 99_999_999_999, 1),
        swf(5, 4, 50, 6),
        swf(6, 5, -1, 2),
    ]
    .concat();
    let f = write(dir.path(), "w.swf", &format!("{HEAD}{body}"));
    let o = replay(&["--swf", &f]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        err,
        format!(
            "warning: {f}: 2 jobs skipped as wider than the machine (4 nodes, the MaxNodes header); the first, line 5: job 2 needs 8 nodes (8 processors at 1 per node) but the machine has 4 (the MaxNodes header); allowed: at most 4 nodes (--nodes sets the machine size) (--strict refuses such a log)\n\
             warning: {f}: 2 jobs skipped for a bad run time; the first, line 6: job 3 has run time -7 s; allowed: -1 (unknown) or 0 to 31536000 s (365 days) (--strict refuses such a log)\n"
        )
    );
    // Counted by cause in the table; -1 (unknown) is SWF's own: an empty job.
    assert!(
        out.contains("jobs scheduled           1 (skipped: 1 empty, 2 too wide, 2 bad run time)"),
        "{out}"
    );
    let o = replay(&["--swf", &f, "--strict"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o).1,
        format!("bftrainer: error: {f}:5: job 2 needs 8 nodes (8 processors at 1 per node) but the machine has 4 (the MaxNodes header); allowed: at most 4 nodes (--nodes sets the machine size)\n")
    );
    // With the machine made large enough, the run time is what --strict refuses.
    let o = replay(&["--swf", &f, "--strict", "--nodes", "8"]);
    assert_eq!(
        text(&o).1,
        format!("bftrainer: error: {f}:6: job 3 has run time -7 s; allowed: -1 (unknown) or 0 to 31536000 s (365 days)\n")
    );
}

/// A gzip cut in the middle of a record: refused with the file and the line it broke
/// in; none of the outputs asked for is written.
#[test]
fn truncated_gzip_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let body: String = (0..20_000).map(|i| swf(i, i, 100, 1)).collect();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(format!("{HEAD}{body}").as_bytes()).unwrap();
    let mut z = e.finish().unwrap();
    z.truncate(z.len() / 2);
    let f = dir.path().join("cut.swf.gz");
    std::fs::write(&f, z).unwrap();
    let f = f.to_str().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let csv = out.join("steps.csv");
    let plots = out.join("plots");
    let o = replay(&[
        "--swf",
        f,
        "--csv",
        csv.to_str().unwrap(),
        "--sizes-csv",
        out.join("sizes.csv").to_str().unwrap(),
        "--plots",
        plots.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let (stdout, err) = text(&o);
    assert_eq!(stdout, "");
    let prefix = format!("bftrainer: error: {f}: read failed after line ");
    let rest = err.strip_prefix(&prefix).unwrap_or_else(|| panic!("{err}"));
    let (n, msg) = rest.split_once(':').unwrap();
    let n: u64 = n.parse().unwrap();
    assert!(n > 3 && n < 20_003, "{err}");
    assert!(
        msg.starts_with(&format!(
            " line {} is cut short or unreadable (a truncated or damaged file?): ",
            n + 1
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

/// An output whose directory does not exist is refused before the replay runs:
/// nothing printed, nothing written.
#[test]
fn outputs_are_checked_before_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = dir.path().join("sizes.csv");
    let missing = dir.path().join("no/such/dir/steps.csv");
    let o = replay(&[
        "--hours",
        "1",
        "--sizes-csv",
        sizes.to_str().unwrap(),
        "--csv",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o),
        (
            String::new(),
            format!(
                "bftrainer: error: --csv {}: directory {} does not exist\n",
                missing.display(),
                missing.parent().unwrap().display()
            )
        )
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // A good run leaves the files and no temporary file beside them.
    let plots = dir.path().join("plots");
    let o = replay(&[
        "--hours",
        "1",
        "--sizes-csv",
        sizes.to_str().unwrap(),
        "--plots",
        plots.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(dir.path()), ["plots", "sizes.csv"]);
    assert_eq!(
        names(&plots),
        [
            "cumulative_samples.svg",
            "idle_fragments.svg",
            "idle_vs_harvested.svg",
            "nodes_per_job.svg"
        ]
    );
    // --plots naming a file is refused before the replay.
    let o = replay(&["--hours", "1", "--plots", sizes.to_str().unwrap()]);
    assert_eq!(
        text(&o).1,
        format!(
            "bftrainer: error: --plots {}: exists and is not a directory\n",
            sizes.display()
        )
    );
}

const JOBS_HEADER: &str = "id,submit,min_nodes,max_nodes,scale_up_s,scale_down_s,total_samples,curve_nodes,curve_samples_per_s,curve_objective\n";

/// --repeat with a job file of one job: the job is resubmitted each time it finishes,
/// under a new name, until the window ends; the report states the harvest capacity.
#[test]
fn repeat_cycles_a_single_job() {
    let dir = tempfile::tempdir().unwrap();
    // 1..8 nodes at 100 samples/s per node: 10 min on 8 nodes.
    let jobs = write(
        dir.path(),
        "one.csv",
        &format!("{JOBS_HEADER}E1,2021-02-10T20:21:15,1,8,5,5,480000,1 8,100 800,1 8\n"),
    );
    let sizes = dir.path().join("sizes.csv");
    let sizes_arg = sizes.to_str().unwrap();
    let o = replay(&[
        "--jobs",
        &jobs,
        "--hours",
        "3",
        "--repeat",
        "--json",
        "--sizes-csv",
        sizes_arg,
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let r = &v["report"];
    let done = r["jobs_completed"].as_u64().unwrap();
    assert!(done >= 10, "{done}");
    assert_eq!(r["jobs_submitted"].as_u64().unwrap(), done + 1);
    // The report: one row for the file's job, over its copies.
    let rows = r["jobs"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "E1");
    assert_eq!(rows[0]["copies"], r["jobs_submitted"]);
    assert_eq!(rows[0]["status"], "running");
    // Each copy under its own name, in the sizes written as the replay went.
    let csv = std::fs::read_to_string(&sizes).unwrap();
    let mut names: Vec<&str> = Vec::new();
    for l in csv.lines().skip(1) {
        let name = l.split(',').nth(2).unwrap();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    assert_eq!(&names[..3], ["E1", "E1#1", "E1#2"]);
    assert_eq!(names.len() as u64, done + 1);
    assert_eq!(v["settings"]["workload"]["mode"], "repeat");
    let h = |k: &str| r[k].as_f64().unwrap();
    assert!(h("harvestable_node_h") <= h("idle_node_h"));
    assert!(h("harvested_node_h") <= h("usable_node_h") + 1e-9);
    // One job of at most 8 nodes: the capacity is bounded by its maximum.
    assert!(
        h("usable_node_h") <= 8.0 * 3.0 + 1e-9,
        "{}",
        h("usable_node_h")
    );
    let o = replay(&["--jobs", &jobs, "--hours", "3", "--repeat"]);
    let table = text(&o).0;
    assert!(
        table.contains("each resubmitted when it finishes (--repeat)"),
        "{table}"
    );
    assert!(
        table.contains("\n  harvest capacity           idle "),
        "{table}"
    );
    // A job that takes no time cannot be cycled.
    let short = write(
        dir.path(),
        "short.csv",
        &format!("{JOBS_HEADER}S,2021-02-10T20:21:15,1,8,5,5,10,1 8,100 800,1 8\n"),
    );
    let o = replay(&["--jobs", &short, "--hours", "3", "--repeat"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o).1,
        "bftrainer: error: invalid setting: --repeat: job S takes 1.250e-2 s at its best rate (10 samples at 800 samples/s on 8 nodes); a cycled job must take at least 1 s\n"
    );
}

#[test]
fn arrivals_need_a_positive_rate_and_exclude_repeat() {
    for rate in ["0", "-3"] {
        let o = replay(&["--hours", "1", "--arrivals", rate]);
        assert_eq!(o.status.code(), Some(1));
        assert_eq!(
            text(&o),
            (
                String::new(),
                format!("bftrainer: error: --arrivals RATE must be a number of jobs per hour > 0, found {rate}\n")
            )
        );
    }
    let o = replay(&["--hours", "1", "--arrivals", "5", "--repeat"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("cannot be used with"), "{}", text(&o).1);
    // Seeded: the same seed gives the same replay, another seed another one.
    let run = |seed: &str| {
        report(&replay(&[
            "--hours",
            "2",
            "--arrivals",
            "20",
            "--seed",
            seed,
            "--json",
        ]))
    };
    let (a, b, c) = (run("3"), run("3"), run("4"));
    assert_eq!(a, b);
    assert_ne!(a["report"]["jobs"], c["report"]["jobs"]);
    let n = a["report"]["jobs_submitted"].as_u64().unwrap();
    assert!((20..=70).contains(&n), "{n}");
}
