//! `bftrainer acct` over a month of generated accounting records (docs/benchmarks.md):
//! the command's own conversion, aggregation and output code on 100,000 records, against
//! a baseline measured in the same run (serialising the records to JSON, the least any
//! reader of them does), and the process's peak RSS. With `--fetch N`, also the real
//! slurmdbd read on a test cluster holding N finished jobs.
//!
//!   cargo bench -p bftrainer-daemon --bench acct -- [--records N] [--runs N] [--fetch N]

use bftrainer_core::acct::{aggregate, Filter, Params};
use bftrainer_daemon::cmd::acct::{record_from, render, Format};
use bftrainer_slurm::{AcctJob, JobBase, JobState};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

#[path = "../tests/live/mod.rs"]
mod live;
#[path = "../../../plugin/job_submit/tests/support/mod.rs"]
mod support;
use live::{arg, peak_rss_mb};

const MONTH: i64 = 30 * 86_400;
const T0: i64 = 1_793_491_200; // 2026-11-01T00:00:00Z
const NODES: u32 = 1_000;

fn record(id: u32, name: String, user: u32, nodes: u32, start: i64, end: i64) -> AcctJob {
    let first = (start as u32) % NODES + 1;
    let node_list = if nodes == 1 {
        format!("c{first:04}")
    } else {
        let last = (first + nodes - 1).min(NODES);
        format!("c[{first:04}-{last:04}]")
    };
    AcctJob {
        job_id: id,
        array_job_id: None,
        array_task_id: None,
        het_job_id: None,
        het_job_offset: None,
        cluster: Some("bench".into()),
        name,
        user: Some(format!("user{user:03}")),
        user_id: 10_000 + user,
        group_id: 10_000 + user,
        account: Some(format!("proj{:02}", user % 17)),
        partition: Some("batch".into()),
        nodes: Some(node_list),
        alloc_nodes: nodes,
        state: JobState::from_base(JobBase::Complete),
        submit_time: Some(start - 600),
        eligible_time: Some(start - 600),
        start_time: Some(start),
        end_time: Some(end),
        elapsed_s: (end - start) as u32,
        time_limit: None,
        exit_code: 0,
        requested_by_uid: None,
        admin_comment: None,
        system_comment: None,
        work_dir: Some("/home/x".into()),
        tres_alloc: Some(format!("1={},2={},4={nodes}", 32 * nodes, 128_000 * nodes)),
    }
}

/// A month of records: a third elastic (cores, some requeued with a PREEMPTED first
/// run, each with satellites, some preempted by the regular job that starts on their
/// node), the rest plain jobs; a few jobs still run at the month's end.
fn generate(n: usize, seed: u64) -> Vec<AcctJob> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    let mut id = 1u32;
    while out.len() < n {
        let user = rng.gen_range(0..300);
        let start = T0 + rng.gen_range(0..MONTH);
        if rng.gen_bool(0.08) {
            // An elastic job: 1-2 core runs, 0-8 satellites.
            let core = id;
            id += 1;
            let runs = if rng.gen_bool(0.1) { 2 } else { 1 };
            let mut t = start;
            for run in 0..runs {
                let end = t + rng.gen_range(600..14_400);
                let mut r = record(core, "train".into(), user, rng.gen_range(1..4), t, end);
                r.partition = Some("elastic".into());
                r.admin_comment = Some("bftrainer:v1 1:8,role=core".into());
                if run + 1 < runs {
                    r.state = JobState::from_base(JobBase::Preempted);
                }
                out.push(r);
                for _ in 0..rng.gen_range(0..9) {
                    let s = rng.gen_range(t..end);
                    let e = rng.gen_range(s..=end);
                    let mut sat = record(id, format!("bftsat-{core}"), user, 1, s, e);
                    sat.partition = Some("elastic-sat".into());
                    if !rng.gen_bool(0.03) {
                        sat.admin_comment =
                            Some(format!("bftrainer:v1 1:1,role=satellite,parent={core}"));
                    }
                    let node = sat.nodes.clone().unwrap();
                    out.push(sat);
                    id += 1;
                    if rng.gen_bool(0.2) {
                        // The regular job that took the satellite's node.
                        let mut reg =
                            record(id, "sim".into(), rng.gen_range(0..300), 1, e + 2, e + 3600);
                        reg.nodes = Some(node);
                        reg.eligible_time = Some(e - 30);
                        out.push(reg);
                        id += 1;
                    }
                }
                t = end + rng.gen_range(60..3600);
            }
        } else {
            let nodes = *[1, 1, 1, 2, 4, 8, 16, 64].get(rng.gen_range(0..8)).unwrap();
            let end = start + rng.gen_range(60..86_400);
            let mut r = record(id, "job".into(), user, nodes, start, end);
            if end > T0 + MONTH {
                r.end_time = None;
                r.state = JobState::from_base(JobBase::Running);
            }
            out.push(r);
            id += 1;
        }
    }
    out.truncate(n);
    out
}

fn best(runs: usize, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut size = 0;
    for _ in 0..runs {
        let t = Instant::now();
        size = std::hint::black_box(f());
        best = best.min(t.elapsed());
    }
    (best, size)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let n = arg("--records", 100_000);
    let runs = arg("--runs", 5);
    let fetch_n = arg("--fetch", 0);
    let t_gen = Instant::now();
    let jobs = generate(n, 11);
    let rss_gen = peak_rss_mb();
    println!(
        "{} records over 30 days generated in {:.0} ms (peak RSS {rss_gen:.1} MB)",
        jobs.len(),
        ms(t_gen.elapsed())
    );
    let p = Params {
        start: T0,
        end: T0 + MONTH,
        now: T0 + MONTH,
        preempt_slack_s: 60,
    };
    let filter = Filter::default();
    let (base_t, base_b) = best(runs, || serde_json::to_string(&jobs).unwrap().len());
    let (conv_t, _) = best(runs, || jobs.iter().map(record_from).count());
    let records: Vec<_> = jobs.iter().map(record_from).collect();
    let (agg_t, njobs) = best(runs, || aggregate(&records, &p, &filter).jobs.len());
    let report = aggregate(&records, &p, &filter);
    let mut rows = vec![
        (
            "baseline: serde_json of the records".to_string(),
            base_t,
            base_b,
        ),
        (
            "convert AcctJob -> UsageRecord".to_string(),
            conv_t,
            records.len(),
        ),
        (
            "aggregate (group, clip, sweep, preemptions)".to_string(),
            agg_t,
            njobs,
        ),
    ];
    for (name, fmt) in [
        ("table", Format::Table),
        ("json", Format::Json),
        ("csv", Format::Csv),
    ] {
        let (t, b) = best(runs, || render(&report, &p, fmt).len());
        rows.push((format!("render --{name}"), t, b));
        let (t, b) = best(runs, || {
            let r: Vec<_> = jobs.iter().map(record_from).collect();
            render(&aggregate(&r, &p, &filter), &p, fmt).len()
        });
        rows.push((format!("whole command after the fetch, --{name}"), t, b));
    }
    println!(
        "{} elastic jobs, {} elastic records, {} node-hours, {} preemptions",
        report.jobs.len(),
        report.elastic_records,
        report.total.node_seconds / 3600,
        report.total.preemptions
    );
    println!(
        "{:<46} {:>10} {:>10} {:>12}",
        "step (best of runs)", "ms", "x baseline", "items/bytes"
    );
    for (name, t, b) in &rows {
        println!(
            "{name:<46} {:>10.1} {:>10.2} {b:>12}",
            ms(*t),
            t.as_secs_f64() / base_t.as_secs_f64()
        );
    }
    println!(
        "peak RSS: {:.1} MB (after generating the records: {rss_gen:.1} MB)",
        peak_rss_mb()
    );
    if fetch_n > 0 {
        fetch(fetch_n);
    }
}

/// The real slurmdbd read: N finished jobs (one array job) on a 4-node test cluster.
fn fetch(n: usize) {
    let c = bftrainer_testcluster::Cluster::start(bftrainer_testcluster::Options {
        nodes: 4,
        ..Default::default()
    })
    .expect("test cluster");
    std::env::set_var("SLURM_CONF", c.slurm_conf());
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        - 1;
    let t = Instant::now();
    let array = format!("--array=1-{n}");
    let id = c
        .sbatch(&[&array, "-o", "/dev/null", "--wrap", "true"])
        .unwrap();
    let mut got = 0;
    while t.elapsed() < Duration::from_secs(900) {
        let out = c
            .run(
                "sacct",
                &["-n", "-X", "-P", "-j", &id.to_string(), "-o", "State"],
            )
            .unwrap_or_default();
        got = out.lines().filter(|l| l.trim() == "COMPLETED").count();
        if got >= n {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    println!(
        "{got} of {n} array tasks completed in accounting after {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let end = t0 + t.elapsed().as_secs() as i64 + 2;
    std::thread::sleep(Duration::from_secs(2));
    let mut fetches = Vec::new();
    let mut count = 0;
    for _ in 0..5 {
        let t = Instant::now();
        count = bftrainer_daemon::cmd::acct::fetch(t0, end).unwrap().len();
        fetches.push(t.elapsed());
    }
    let f = *fetches.iter().min().unwrap();
    let sacct_t = {
        let s = bftrainer_daemon::cmd::acct::local_time(t0);
        let e = bftrainer_daemon::cmd::acct::local_time(end);
        let mut best = Duration::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            c.run(
                "sacct",
                &[
                    "-a",
                    "-D",
                    "-X",
                    "-P",
                    "-n",
                    "-S",
                    &s,
                    "-E",
                    &e,
                    "-o",
                    "JobID,JobName,NNodes,ElapsedRaw,CPUTimeRAW,AdminComment",
                ],
            )
            .unwrap();
            best = best.min(t.elapsed());
        }
        best
    };
    println!(
        "slurmdbd fetch of {count} records: {:.1} ms best of 5 ({:.0} records/s); `sacct -D -X -P` of the same window: {:.1} ms",
        ms(f),
        count as f64 / f.as_secs_f64(),
        ms(sacct_t)
    );
}
