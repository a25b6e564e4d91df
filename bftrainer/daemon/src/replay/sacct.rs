//! `--from-sacct`: reads the cluster's node list (slurmctld) and the job records of a
//! window (slurmdbd), and rebuilds the idle fragments with `bftrainer_core::sacct`.

use anyhow::Context;
use bftrainer_core::sacct::{fragments_from_usage, JobUsage};
use bftrainer_core::trace::NodeTrace;
use bftrainer_slurm::{AcctQuery, ClusterView, Slurm, SlurmDb};

/// Idle trace of every node of the cluster over [from, to) (Unix seconds), from the
/// accounting records of the jobs that ran then, leaving out jobs of `exclude`
/// partitions (e.g. the elastic partition, whose nodes were idle to the main scheduler).
pub fn trace_from_sacct(from: i64, to: i64, exclude: &[String]) -> anyhow::Result<NodeTrace> {
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
    let q = AcctQuery {
        start: from,
        end: Some(to),
        duplicates: true,
        clusters: vec![cluster],
        ..Default::default()
    };
    let jobs = db
        .jobs(&q)
        .context("cannot read job records from slurmdbd")?;
    let usage: Vec<JobUsage> = jobs
        .iter()
        .filter(|j| {
            !j.partition
                .as_ref()
                .is_some_and(|p| exclude.iter().any(|e| e == p))
        })
        .map(|j| JobUsage {
            job_id: j.job_id.to_string(),
            start: j.start_time,
            end: j.end_time,
            nodelist: j.nodes.clone().unwrap_or_default(),
        })
        .collect();
    log::info!(
        "{} job records ({} used) on {} nodes",
        jobs.len(),
        usage.len(),
        nodes.len()
    );
    Ok(fragments_from_usage(&nodes, &usage, from, to)?)
}
