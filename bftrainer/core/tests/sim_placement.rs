//! The simulator on a mixed cluster (A100 nodes, V100 nodes, CPU nodes): node
//! attributes and job needs reach the engine, a GPU job gets only nodes of its type,
//! and a job that no lendable node serves waits, paused, and says why.

mod sim_common;

use bftrainer_core::engine::{Action, EngineConfig, Event, Exact};
use bftrainer_core::placement::{Gpus, Needs, NodeAttrs};
use bftrainer_core::sim::nodes::{parse_classes, resolve, NodeTable};
use bftrainer_core::sim::{simulate, Hooks, Outcome, SimConfig};
use bftrainer_core::trace::jobs::JobRecord;
use bftrainer_core::trace::NodeTrace;
use sim_common::{job, trace};
use std::sync::Arc;

const CLASSES: &str = r#"
[[class]]
name = "a100"
nodes = "g[1-2]"
gres = "gpu:a100:4"
[[class]]
name = "v100"
nodes = "v[1-2]"
gres = "gpu:v100:4"
features = ["ib"]
[[class]]
name = "cpu"
nodes = "c[1-4]"
mem = "256G"
"#;

const NAMES: [&str; 8] = ["c1", "g1", "v1", "c2", "g2", "c3", "v2", "c4"];

fn table() -> Arc<NodeTable> {
    let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    let classes = parse_classes(CLASSES, "mixed.toml").unwrap();
    let (t, warnings) = resolve(&classes, &names, "mixed.toml").unwrap();
    assert!(warnings.is_empty());
    Arc::new(t)
}

fn gpus(typ: &str, count: u32) -> Needs {
    Needs {
        gpus: Some(Gpus {
            typ: Some(typ.into()),
            count,
        }),
        ..Needs::default()
    }
}

/// 1..8 nodes at 10 samples/s each; long enough to outlast the window.
fn wide(name: &str, submit: i64, needs: Needs) -> JobRecord {
    JobRecord {
        needs,
        ..job(name, submit, 1, 8, 10.0, 5.0, 1e9, &[(1, 10.0), (8, 80.0)])
    }
}

fn run(
    tr: &NodeTrace,
    jobs: &[JobRecord],
    nodes: Option<Arc<NodeTable>>,
    max_jobs: usize,
) -> Outcome {
    let cfg = SimConfig {
        engine: EngineConfig {
            max_jobs,
            ..EngineConfig::default()
        },
        record: true,
        journal: true,
        nodes,
        ..SimConfig::default()
    };
    let (mut c, mut p) = (|| 0.0, |_f: f64| {});
    let mut hooks = Hooks {
        clock: &mut c,
        progress: &mut p,
    };
    simulate(tr, jobs, Exact::default(), &cfg, &mut hooks).unwrap()
}

/// Names of the nodes each job (by id) was ever given.
fn given(out: &Outcome, job: u32) -> Vec<&'static str> {
    let mut v: Vec<&str> = out
        .actions
        .iter()
        .filter_map(|(_, a)| match a {
            Action::Admit { job: j, nodes } | Action::Grow { job: j, nodes } if *j == job => {
                Some(nodes.clone())
            }
            _ => None,
        })
        .flatten()
        .map(|n| NAMES[n as usize])
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// An A100 job, a V100 job and a CPU job on the mixed cluster: each GPU job grows only
/// onto the two nodes of its type, whatever the allocator would rather do; the job
/// without needs takes the rest. Without node attributes (the replay before this
/// change) the A100 job is lent CPU and V100 nodes.
#[test]
fn a_gpu_job_harvests_only_gpu_nodes_of_its_type() {
    let tr = trace(&NAMES, &[true; 8], &[], 7200);
    let jobs = [
        wide("A", 0, gpus("a100", 2)),
        wide("V", 0, gpus("v100", 4)),
        wide("C", 0, Needs::default()),
    ];
    let out = run(&tr, &jobs, Some(table()), 10);
    let (a, v) = (given(&out, 0), given(&out, 1));
    assert!(
        !a.is_empty() && a.iter().all(|n| ["g1", "g2"].contains(n)),
        "{a:?}"
    );
    assert!(
        !v.is_empty() && v.iter().all(|n| ["v1", "v2"].contains(n)),
        "{v:?}"
    );
    // The job without needs may take any node the GPU jobs were not given.
    let c = given(&out, 2);
    assert!(c.iter().all(|n| !a.contains(n) && !v.contains(n)), "{c:?}");
    // The engine heard what the daemon tells it: every node's attributes, each job's
    // needs (the CPU job has none).
    let attrs: Vec<&NodeAttrs> = out
        .journal
        .iter()
        .filter_map(|r| match &r.event {
            Event::NodeAttrs { attrs, .. } => Some(attrs),
            _ => None,
        })
        .collect();
    assert_eq!(attrs.len(), 8);
    assert_eq!(attrs[1].gpus_of(Some("a100")), 4);
    assert_eq!(attrs[0].mem_mb, 256 * 1024);
    let needs = out
        .journal
        .iter()
        .filter(|r| matches!(r.event, Event::JobNeeds { .. }))
        .count();
    assert_eq!(needs, 2);
    // Per class: idle and harvested node-hours, adding up to the totals.
    let r = &out.report;
    let names: Vec<&str> = r.node_classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a100", "v100", "cpu"]);
    for c in &r.node_classes {
        assert!(c.harvested_node_h <= c.idle_node_h + 1e-9, "{c:?}");
        assert!((c.idle_node_h - 2.0 * c.nodes as f64).abs() < 1e-9, "{c:?}");
    }
    assert!(r.node_classes[0].harvested_node_h > 0.0);
    assert_eq!(r.node_classes[0].nodes, 2);
    assert_eq!(r.node_classes[0].offers, "gpu:a100:4, no features");
    let sum: f64 = r.node_classes.iter().map(|c| c.harvested_node_h).sum();
    assert!((sum - r.harvested_node_h).abs() < 1e-9);
    assert_eq!(r.jobs_unservable, 0);

    // The same replay without node attributes: the A100 job is not confined.
    let plain = run(&tr, &jobs, None, 10);
    let a = given(&plain, 0);
    assert!(a.iter().any(|n| !n.starts_with('g')), "{a:?}");
    assert!(plain.report.node_classes.is_empty());
}

/// A job asking for GPUs no node has waits, paused, so that it does not take the one
/// slot (`max_jobs = 1`) from the CPU job behind it; the report says why it waits.
#[test]
fn a_job_no_node_serves_waits_and_says_why() {
    let tr = trace(&NAMES, &[true; 8], &[], 3600);
    let jobs = [
        wide("H", 0, gpus("h100", 1)),
        wide("C", 10, Needs::default()),
    ];
    let out = run(&tr, &jobs, Some(table()), 1);
    assert!(given(&out, 0).is_empty());
    assert_eq!(
        given(&out, 1).len(),
        8,
        "the CPU job takes the whole cluster"
    );
    let r = &out.report;
    assert_eq!(r.jobs_unservable, 1);
    assert_eq!(r.jobs[0].status, "queued");
    let why = r.jobs[0].unservable.as_deref().unwrap();
    assert_eq!(
        why,
        "asks --gpus-per-node=h100:1: 0 of the 8 nodes serve it, 0 of them idle and lendable at the last look; it needs 1"
    );
    assert!(r.jobs[1].unservable.is_none());
    // The pause is an engine event, journaled as bftrainerd journals it.
    assert!(out.journal.iter().any(|r| matches!(
        r.event,
        Event::JobPaused {
            job: 0,
            until: Some(_)
        }
    )));
}

/// The A100 nodes are busy until 1,000 s: the A100 job waits, paused, while the CPU
/// job has the rest; once they are idle it is resumed and admitted onto them, and the
/// report no longer calls it unservable.
#[test]
fn a_waiting_gpu_job_starts_when_its_nodes_come_free() {
    let idle: Vec<bool> = NAMES.iter().map(|n| !n.starts_with('g')).collect();
    let tr = trace(&NAMES, &idle, &[(1000, 1, true), (1000, 4, true)], 3600);
    let jobs = [
        wide("A", 0, gpus("a100", 4)),
        wide("C", 0, Needs::default()),
    ];
    let out = run(&tr, &jobs, Some(table()), 10);
    let paused: Vec<(f64, Option<f64>)> = out
        .journal
        .iter()
        .filter_map(|r| match r.event {
            Event::JobPaused { job: 0, until } => Some((r.t, until)),
            _ => None,
        })
        .collect();
    assert_eq!(paused.len(), 2, "{paused:?}");
    assert!(paused[0].0 == 0.0 && paused[0].1.is_some());
    assert_eq!(paused[1], (1000.0, None));
    assert_eq!(given(&out, 0), ["g1", "g2"]);
    let first = out.report.jobs[0].first_admit_s.unwrap();
    assert!((1000.0..1001.0).contains(&first), "{first}");
    assert!(out.report.jobs[0].unservable.is_none());
    assert_eq!(out.report.jobs_unservable, 0);
    // The CPU job never got a GPU node: it grew onto none of them after 1,000 s
    // because the A100 job, not it, took them.
    assert!(given(&out, 1).iter().all(|n| !n.starts_with('g')));
}

/// Node attributes that do not cover the trace are refused before the replay.
#[test]
fn a_node_table_of_another_trace_is_refused() {
    let tr = trace(&NAMES[..4], &[true; 4], &[], 3600);
    let cfg = SimConfig {
        nodes: Some(table()),
        ..SimConfig::default()
    };
    let (mut c, mut p) = (|| 0.0, |_f: f64| {});
    let mut hooks = Hooks {
        clock: &mut c,
        progress: &mut p,
    };
    let e = simulate(&tr, &[], Exact::default(), &cfg, &mut hooks)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node attributes for 8 nodes, but the trace has 4"),
        "{e}"
    );
}
