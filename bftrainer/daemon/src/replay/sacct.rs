//! `--from-sacct`: reads the cluster's node list (slurmctld) and the job records of a
//! window (slurmdbd, a month per read), and rebuilds the idle fragments with
//! `bftrainer_core::sacct`.

use anyhow::Context;
use bftrainer_core::sacct::{fragments_from_usage, JobUsage};
use bftrainer_core::trace::NodeTrace;
use bftrainer_slurm::{AcctQuery, ClusterView, Slurm, SlurmDb};
use std::collections::HashSet;

/// Length of one slurmdbd read: records are fetched a month at a time and reduced at
/// once to what the fragments need, so a year of accounting never sits in memory whole.
pub const WINDOW_S: i64 = 30 * 86_400;

/// Idle trace of every node of the cluster over [from, to) (Unix seconds), from the
/// accounting records of the jobs that ran then, leaving out jobs of `exclude`
/// partitions (e.g. the elastic partition, whose nodes were idle to the main scheduler).
pub fn trace_from_sacct(from: i64, to: i64, exclude: &[String]) -> anyhow::Result<NodeTrace> {
    trace_from_sacct_windows(from, to, exclude, WINDOW_S)
}

/// As [`trace_from_sacct`], reading slurmdbd `window_s` seconds at a time. A job that
/// spans windows comes back in each; its runs are kept once (job id and start time).
pub fn trace_from_sacct_windows(
    from: i64,
    to: i64,
    exclude: &[String],
    window_s: i64,
) -> anyhow::Result<NodeTrace> {
    anyhow::ensure!(window_s > 0, "the read window must be > 0 s");
    let slurm = Slurm::init().context("--from-sacct needs libslurm and a readable slurm.conf")?;
    let mut view = ClusterView::default();
    view.refresh(&slurm)
        .context("cannot read the node list from slurmctld")?;
    let nodes: Vec<String> = view.nodes().iter().map(|n| n.name.clone()).collect();
    // One slurmdbd often serves several clusters: without naming ours, another
    // cluster's jobs would come back on nodes this one does not have.
    let cluster = slurm
        .cluster_name()
        .context("cannot read ClusterName from slurmctld")?;
    let mut db = SlurmDb::connect(&slurm).context("cannot connect to slurmdbd")?;
    let mut seen: HashSet<(u32, Option<i64>)> = HashSet::new();
    let (mut records, mut windows) = (0usize, 0u32);
    let mut usage: Vec<JobUsage> = Vec::new();
    let mut w = from;
    while w < to {
        let w_end = w.saturating_add(window_s).min(to);
        let q = AcctQuery {
            start: w,
            end: Some(w_end),
            duplicates: true,
            clusters: vec![cluster.clone()],
            ..Default::default()
        };
        let jobs = db
            .jobs(&q)
            .context("cannot read job records from slurmdbd")?;
        records += jobs.len();
        windows += 1;
        for j in jobs {
            if j.partition
                .as_ref()
                .is_some_and(|p| exclude.iter().any(|e| e == p))
                || !seen.insert((j.job_id, j.start_time))
            {
                continue;
            }
            usage.push(JobUsage {
                job_id: j.job_id.to_string(),
                start: j.start_time,
                end: j.end_time,
                nodelist: j.nodes.unwrap_or_default(),
            });
        }
        w = w_end;
    }
    log::info!(
        "{records} job records in {windows} reads ({} runs used) on {} nodes",
        usage.len(),
        nodes.len()
    );
    Ok(fragments_from_usage(&nodes, &usage, from, to)?)
}
