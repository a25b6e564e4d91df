//! bftrainerd's start-up from a long journal (docs/benchmarks.md): writes a journal of
//! `--records N` records (default 1,000,000) as bftrainerd writes them (512 nodes idling
//! and claimed, elastic jobs submitted, started, grown, shrunk and finished, every
//! decision journaled after its Tick), then prints the time to read it and to rebuild
//! the daemon from it (`Daemon::new`), and the same for the journal compacted to a
//! snapshot (what bftrainerd keeps once the journal outgrows its bound).
//!
//!   cargo bench -p bftrainer-daemon --bench journal_restore -- [--records N]

use bftrainer_core::alloc::Curve;
use bftrainer_core::engine::{
    Action, ElasticSpec, Engine, EngineConfig, Event, Exact, JobStatus, Record,
    EVENT_FORMAT_VERSION,
};
use bftrainer_daemon::daemon::gen::GenCluster;
use bftrainer_daemon::daemon::journal::{Journal, JOURNAL_FILE};
use bftrainer_daemon::daemon::{config, Daemon};
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;
use live::{arg, peak_rss_mb};

const NODES: u32 = 512;

/// Writes `n` records to `path` from a live engine, journaled as bftrainerd does.
fn generate(path: &Path, n: usize) -> usize {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20);
    let mut e = Engine::new(EngineConfig::default(), Exact::default());
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut count = 0usize;
    let mut t = 3_000_000_000.0f64;
    let mut feed = |e: &mut Engine<Exact>, ev: Event, t: f64, count: &mut usize| {
        let actions = e.on_event(&ev, t).unwrap();
        let tick = matches!(ev, Event::Tick);
        let mut line = serde_json::to_vec(&Record {
            v: EVENT_FORMAT_VERSION,
            t,
            event: ev,
        })
        .unwrap();
        line.push(b'\n');
        w.write_all(&line).unwrap();
        *count += 1;
        if tick {
            let ev = Event::Decided {
                activated: e.take_activated(),
                actions: actions.clone(),
            };
            serde_json::to_writer(&mut w, &Record { v: 1, t, event: ev }).unwrap();
            w.write_all(b"\n").unwrap();
            *count += 1;
        }
        actions
    };
    for node in 0..NODES {
        feed(
            &mut e,
            Event::NodeAdded {
                node,
                name: format!("g{node:04}"),
            },
            t,
            &mut count,
        );
    }
    let mut jobs = 0u32;
    let mut joins: Vec<(u32, u32)> = Vec::new();
    while count < n {
        t += 1.0;
        for (job, node) in joins.drain(..) {
            feed(&mut e, Event::WorkerJoined { job, node }, t, &mut count);
        }
        if e.queued() + e.active().len() < 30 && rng.gen_bool(0.1) {
            let min = rng.gen_range(1..=4);
            let spec = ElasticSpec {
                name: (1000 + jobs).to_string(),
                min_nodes: min,
                max_nodes: min + rng.gen_range(0..32),
                scale_up_s: 30.0,
                scale_down_s: 10.0,
                objective: Curve::new(vec![(1, 1.0), (64, rng.gen_range(20.0..64.0))]),
                user: Some(rng.gen_range(1000..1010)),
                priority: 0,
            };
            feed(
                &mut e,
                Event::JobSubmitted { job: jobs, spec },
                t,
                &mut count,
            );
            jobs += 1;
        }
        if rng.gen_bool(0.02) {
            if let Some(&j) = e.active().first() {
                feed(&mut e, Event::JobFinished { job: j }, t, &mut count);
            }
        }
        for _ in 0..4 {
            let node = rng.gen_range(0..NODES);
            let ev = if rng.gen_bool(0.5) {
                Event::NodeIdle {
                    node,
                    reclaim_at: rng.gen_bool(0.3).then(|| t + rng.gen_range(60.0..3600.0)),
                }
            } else {
                Event::NodeClaimed { node }
            };
            feed(&mut e, ev, t, &mut count);
        }
        if let Some(&j) = e.active().get(rng.gen_range(0..30)) {
            feed(
                &mut e,
                Event::Progress {
                    job: j,
                    samples_per_s: rng.gen_range(10.0..1000.0),
                    remaining: None,
                    nodes: None,
                },
                t,
                &mut count,
            );
        }
        for a in feed(&mut e, Event::Tick, t, &mut count) {
            match a {
                Action::Admit { job, nodes } => {
                    feed(&mut e, Event::JobStarted { job }, t, &mut count);
                    joins.extend(nodes.into_iter().map(|n| (job, n)));
                }
                Action::Grow { job, nodes } => joins.extend(nodes.into_iter().map(|n| (job, n))),
                _ => {}
            }
        }
        joins.retain(|&(j, n)| {
            e.job_status(j) == JobStatus::Active
                && e.node_state(n) == bftrainer_core::engine::NodeState::Held(j)
        });
    }
    w.flush().unwrap();
    count
}

/// Reads the journal in `dir` and rebuilds a daemon from it; returns (read s, rebuild
/// s, records, daemon).
fn start(dir: &Path) -> (f64, f64, usize, Daemon<GenCluster>) {
    let cfg = config::parse(
        &format!(
            "[policy]\nsatellite_partition = \"elastic-sat\"\n[daemon]\nstate_dir = \"{}\"\n",
            dir.display()
        ),
        Path::new("/bench/bftrainer.toml"),
    )
    .unwrap();
    let t0 = Instant::now();
    let (journal, records) = Journal::open(dir).unwrap();
    let read = t0.elapsed().as_secs_f64();
    let n = records.len();
    let t0 = Instant::now();
    let d = Daemon::new(
        cfg,
        GenCluster::new(Vec::new(), Vec::new(), Vec::new()),
        Some(journal),
        &records,
    )
    .unwrap();
    drop(records);
    (read, t0.elapsed().as_secs_f64(), n, d)
}

fn main() {
    let n = arg("--records", 1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(JOURNAL_FILE);
    let t0 = Instant::now();
    let written = generate(&path, n);
    let mb = std::fs::metadata(&path).unwrap().len() as f64 / 1e6;
    println!(
        "journal: {written} records, {mb:.1} MB, written in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let (read, rebuild, records, mut d) = start(tmp.path());
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10}",
        "start-up from", "records", "read s", "rebuild s", "total s"
    );
    println!(
        "{:<28} {records:>10} {read:>10.3} {rebuild:>10.3} {:>10.3}",
        "the whole journal",
        read + rebuild
    );
    let state = d.engine().state();
    let t0 = Instant::now();
    d.compact_journal().unwrap();
    let compact_s = t0.elapsed().as_secs_f64();
    drop(d);
    let kb = std::fs::metadata(&path).unwrap().len() as f64 / 1e3;
    let (read, rebuild, records, d) = start(tmp.path());
    println!(
        "{:<28} {records:>10} {read:>10.3} {rebuild:>10.3} {:>10.3}",
        "its snapshot",
        read + rebuild
    );
    println!("snapshot: {kb:.1} kB, written in {compact_s:.3} s");
    assert_eq!(
        d.engine().state(),
        state,
        "the snapshot restores the same state"
    );
    println!("peak RSS {:.0} MB", peak_rss_mb());
}
