//! bftrainerd's observe-decide-reconcile cycle on a generated 10,000-node cluster with
//! 20,000 jobs (docs/benchmarks.md). Prints per-cycle times (cold, under churn,
//! unchanged), the baseline of one copy of the job snapshot measured in the same run,
//! and the process's peak RSS. Each of these is timed twice: wall time, and the CPU time
//! of the thread that runs it (the cycle runs on the caller's thread only), which a loaded
//! machine does not inflate by the time the process waited to be scheduled.
//!
//! Then what operating it costs in that state: building the snapshot the control socket
//! and metrics read, a Prometheus scrape, and the JSON of `status`, `jobs` and `nodes`.
//!
//!   cargo bench -p bftrainer-daemon --bench daemon_cycle -- [--nodes N] [--jobs N] [--cycles N] [--elastic N] [--no-fair-share]
//!
//! `--no-fair-share` runs the engine without fair shares (`[engine] fair_share = false`:
//! the cycle as it was before them), for a before/after on the same binary.

use bftrainer_daemon::daemon::config;
use bftrainer_daemon::daemon::gen::{job, node, partition, GenCluster};
use bftrainer_daemon::daemon::metrics::Metrics;
use bftrainer_daemon::daemon::{control, Daemon};
use bftrainer_slurm::{JobBase, JobState, NodeBase, NodeState};
use rand::{Rng, SeedableRng};
use std::path::Path;

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;
use live::{arg, peak_rss_mb};
use std::time::Instant;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU time this thread has used, in ms (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// Wall and thread-CPU milliseconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (c0, t) = (thread_cpu_ms(), Instant::now());
    let v = f();
    let wall = t.elapsed().as_secs_f64() * 1e3;
    (v, wall, thread_cpu_ms() - c0)
}

/// Wall and CPU times of a series of runs.
#[derive(Default)]
struct Times {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Times {
    fn push(&mut self, (wall, cpu): (f64, f64)) {
        self.wall.push(wall);
        self.cpu.push(cpu);
    }
}

fn main() {
    let n_nodes = arg("--nodes", 10_000);
    let n_jobs = arg("--jobs", 20_000);
    let cycles = arg("--cycles", 200);
    let elastic = arg("--elastic", 100);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let names: Vec<String> = (1..=n_nodes).map(|i| format!("g{i:05}")).collect();
    let parts = ["batch", "elastic", "elastic-sat"];
    let mut nodes: Vec<_> = names.iter().map(|n| node(n.clone(), &parts)).collect();
    let partitions = vec![
        partition("batch", &names, 10),
        partition("elastic", &names, 2),
        partition("elastic-sat", &names, 1),
    ];
    // 90% of the nodes run regular jobs of 1-8 nodes; the rest is idle.
    let mut jobs = Vec::with_capacity(n_jobs);
    let mut id = 1u32;
    let mut next_node = 0usize;
    let busy = n_nodes * 9 / 10;
    while next_node < busy && jobs.len() < n_jobs / 4 {
        let k = rng.gen_range(1..=8).min(busy - next_node);
        let mut j = job(id, "batch", JobBase::Running);
        j.nodes = Some(names[next_node..next_node + k].join(","));
        j.num_nodes = k as u32;
        j.start_time = Some(0);
        for n in &mut nodes[next_node..next_node + k] {
            n.state = NodeState::from_base(NodeBase::Allocated);
        }
        jobs.push(j);
        id += 1;
        next_node += k;
    }
    // Elastic core jobs, held for admission.
    for _ in 0..elastic {
        let mut j = job(id, "elastic", JobBase::Pending);
        j.admin_comment = Some("bftrainer:v1 1:16,role=core".into());
        j.priority = 0;
        jobs.push(j);
        id += 1;
    }
    // Pending regular jobs; some planned by backfill on idle nodes in an hour.
    while jobs.len() < n_jobs {
        let mut j = job(id, "batch", JobBase::Pending);
        if id % 20 == 0 && next_node + 4 <= n_nodes {
            let at = rng.gen_range(busy..n_nodes - 4);
            j.sched_nodes = Some(names[at..at + 4].join(","));
            j.start_time = Some(4_000_000_000);
        }
        jobs.push(j);
        id += 1;
    }
    let regular_running = jobs
        .iter()
        .filter(|j| j.state.base() == JobBase::Running)
        .count();
    let dir = std::env::temp_dir();
    let fair = !std::env::args().any(|a| a == "--no-fair-share");
    println!(
        "fair shares: {}",
        if fair { "on" } else { "off (--no-fair-share)" }
    );
    // The generated elastic jobs belong to 50 users (gen.rs); the per-user job cap is
    // off so that both settings admit the same jobs.
    let cfg = config::parse(
        &format!(
            "[policy]\nsatellite_partition = \"elastic-sat\"\n[daemon]\nstate_dir = \"{}\"\n[engine]\nmax_jobs = {elastic}\nmax_jobs_per_user = 0\nfair_share = {fair}\n",
            dir.display()
        ),
        Path::new("/bench/bftrainer.toml"),
    )
    .unwrap();
    let mut d = Daemon::new(cfg, GenCluster::new(nodes, partitions, jobs), None, &[]).unwrap();
    let rss_before = peak_rss_mb();
    let mut now = 3_000_000_000.0f64;

    // Baseline in the same run: one copy of the job snapshot (what any consumer of
    // slurm_load_jobs pays at least once per load).
    let mut base = Times::default();
    for _ in 0..20 {
        let (v, wall, cpu) = timed(|| d.cluster.jobs.to_vec());
        std::hint::black_box(&v);
        drop(v);
        base.push((wall, cpu));
    }
    let base_ms = pct(&mut base.wall, 0.5);
    let base_cpu_ms = pct(&mut base.cpu, 0.5);

    // Partition assignment, which every cycle that sees a node-table change runs (the
    // churn cycles below do): the indexed pass against the scan per partition node it
    // replaced, on the same tables.
    let mut nodes = d.cluster.nodes.clone();
    let parts = d.cluster.partitions.clone();
    let t = Instant::now();
    bftrainer_slurm::assign_partitions(&mut nodes, &parts);
    let indexed_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for n in &mut nodes {
        n.partitions.clear();
    }
    for p in &parts {
        for name in &p.node_names {
            if let Some(n) = nodes.iter_mut().find(|n| &n.name == name) {
                n.partitions.push(p.name.clone());
            }
        }
    }
    let scan_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(nodes);

    let (_, cold, cold_cpu) = timed(|| d.cycle(now).unwrap());

    let mut churn = Times::default();
    let mut unchanged = Times::default();
    for c in 0..cycles {
        now += 1.0;
        // Slurm between polls: elastic jobs start where pinned; 10 regular jobs end
        // (their nodes go idle) and 10 pending ones start on idle nodes.
        d.cluster.start_pending_elastic(now as i64);
        let running: Vec<usize> = d
            .cluster
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| {
                j.state.base() == JobBase::Running && j.partition.as_deref() == Some("batch")
            })
            .map(|(i, _)| i)
            .collect();
        for _ in 0..10 {
            let i = running[rng.gen_range(0..running.len())];
            let j = &mut d.cluster.jobs[i];
            if j.state.base() != JobBase::Running {
                continue;
            }
            j.state = JobState::from_base(JobBase::Complete);
            let ns: Vec<String> = j
                .nodes
                .clone()
                .unwrap_or_default()
                .split(',')
                .map(str::to_string)
                .collect();
            for n in ns {
                if let Some(nd) = d.cluster.node_mut(&n) {
                    nd.state = NodeState::from_base(NodeBase::Idle);
                }
            }
        }
        let idle: Vec<String> = d
            .cluster
            .nodes
            .iter()
            .filter(|n| n.state.base() == NodeBase::Idle)
            .map(|n| n.name.clone())
            .collect();
        let mut started = 0;
        for j in d.cluster.jobs.iter_mut() {
            if started == 10 || idle.len() <= started {
                break;
            }
            if j.state.base() == JobBase::Pending
                && j.partition.as_deref() == Some("batch")
                && j.priority != 0
            {
                j.state = JobState::from_base(JobBase::Running);
                j.nodes = Some(idle[idle.len() - 1 - started].clone());
                started += 1;
            }
        }
        for k in 0..started {
            let n = idle[idle.len() - 1 - k].clone();
            if let Some(nd) = d.cluster.node_mut(&n) {
                nd.state = NodeState::from_base(NodeBase::Allocated);
            }
        }
        d.cluster.dirty = true;
        let (_, wall, cpu) = timed(|| d.cycle(now).unwrap());
        churn.push((wall, cpu));
        if c % 2 == 0 {
            // The same poll again with nothing changed.
            now += 0.5;
            let (_, wall, cpu) = timed(|| d.cycle(now).unwrap());
            unchanged.push((wall, cpu));
        }
    }
    let s = &d.stats;
    println!("bftrainerd cycle on a generated cluster: {n_nodes} nodes, {} jobs ({regular_running} regular running at start, {elastic} elastic)", d.cluster.jobs.len());
    println!(
        "baseline: one copy of the job snapshot  p50 {base_ms:.2} ms (CPU {base_cpu_ms:.2} ms)"
    );
    println!("partition assignment ({n_nodes} nodes, {} partitions): indexed {indexed_ms:.2} ms, per-node scan (before) {scan_ms:.0} ms, {:.0}x", d.cluster.partitions.len(), scan_ms / indexed_ms.max(1e-6));
    println!(
        "cold first cycle (adopt {elastic} jobs, first decision): {cold:.1} ms ({:.1}x baseline), CPU {cold_cpu:.1} ms ({:.1}x baseline CPU)",
        cold / base_ms,
        cold_cpu / base_cpu_ms
    );
    let three = |v: &mut Vec<f64>| (pct(v, 0.5), pct(v, 0.99), pct(v, 1.0));
    let (c50, c99, cmax) = three(&mut churn.wall);
    println!("churn ({} cycles, 10 regular ends + 10 starts each): p50 {c50:.2} ms, p99 {c99:.2} ms, max {cmax:.2} ms ({:.1}x / {:.1}x baseline)", churn.wall.len(), c50 / base_ms, c99 / base_ms);
    let (c50, c99, cmax) = three(&mut churn.cpu);
    println!("  CPU time: p50 {c50:.2} ms, p99 {c99:.2} ms, max {cmax:.2} ms ({:.1}x / {:.1}x baseline CPU)", c50 / base_cpu_ms, c99 / base_cpu_ms);
    let (u50, u99, umax) = three(&mut unchanged.wall);
    println!(
        "unchanged snapshot ({} cycles): p50 {u50:.2} ms, p99 {u99:.2} ms, max {umax:.2} ms ({:.1}x baseline)",
        unchanged.wall.len(),
        u50 / base_ms
    );
    let (u50, u99, umax) = three(&mut unchanged.cpu);
    println!("  CPU time: p50 {u50:.2} ms, p99 {u99:.2} ms, max {umax:.2} ms ({:.1}x / {:.1}x baseline CPU)", u50 / base_cpu_ms, u99 / base_cpu_ms);
    println!(
        "daemon work: {} admits, {} grows, {} shrinks, {} requeues, {} events; calls {:?}",
        s.admits, s.grows, s.shrinks, s.requeues, s.events, d.cluster.calls
    );
    // Operating it: the snapshot is built once per cycle; a scrape or a request reads it.
    let time_ms = |f: &mut dyn FnMut() -> usize| {
        let mut v = Vec::new();
        let mut size = 0;
        for _ in 0..30 {
            let t = Instant::now();
            size = f();
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        (pct(&mut v.clone(), 0.5), pct(&mut v, 0.99), size)
    };
    let snap = std::sync::Arc::new(d.snapshot(now));
    let running = snap.jobs.iter().filter(|j| j.size > 0).count();
    let (_tx, rx) = tokio::sync::watch::channel(snap.clone());
    let metrics = Metrics::new(rx);
    println!(
        "operating it: {} nodes ({} lent), {} elastic jobs in the daemon's state ({running} holding nodes)",
        snap.nodes.len(),
        snap.counts.lent,
        snap.jobs.len()
    );
    type Case<'a> = (&'static str, Box<dyn FnMut() -> usize + 'a>);
    let cases: Vec<Case> = vec![
        (
            "snapshot build (once per cycle)",
            Box::new(|| std::hint::black_box(d.snapshot(now)).jobs.len()),
        ),
        (
            "metrics scrape (encode)",
            Box::new(|| metrics.encode().len()),
        ),
        (
            "status.json text (JSON of the whole snapshot)",
            Box::new(|| serde_json::to_vec(&*snap).unwrap().len()),
        ),
        (
            "status answer (JSON)",
            Box::new(|| {
                serde_json::to_vec(&control::status_view(&snap))
                    .unwrap()
                    .len()
            }),
        ),
        (
            "jobs answer, all jobs (JSON)",
            Box::new(|| {
                serde_json::to_vec(&control::jobs_view(&snap, None, None, &[], false))
                    .unwrap()
                    .len()
            }),
        ),
        (
            "nodes answer, all nodes (JSON)",
            Box::new(|| {
                serde_json::to_vec(&control::nodes_view(&snap, None))
                    .unwrap()
                    .len()
            }),
        ),
    ];
    for (what, mut f) in cases {
        let (p50, p99, size) = time_ms(&mut *f);
        println!(
            "  {what}: p50 {p50:.3} ms, p99 {p99:.3} ms ({:.2}x / {:.2}x baseline), {size} {}",
            p50 / base_ms,
            p99 / base_ms,
            if what.starts_with("snapshot") {
                "jobs"
            } else {
                "bytes"
            }
        );
    }
    println!("peak RSS: {:.1} MB (after building the snapshot: {rss_before:.1} MB; the snapshot is the generator's, a real daemon holds one copy in its ClusterView)", peak_rss_mb());
}
