//! `--from-sacct`: reads the cluster's node list (slurmctld) and, as the replay goes,
//! the job records of its window from slurmdbd a month at a time, and rebuilds the idle
//! fragments with `bftrainer_core::sacct::Sweep`: only one month of records is held.

use anyhow::Context;
use bftrainer_core::placement::NodeAttrs;
use bftrainer_core::sacct::{JobUsage, Sweep};
use bftrainer_core::trace::{Head, NodeChange, NodeEvents, NodeTrace, TraceItem};
use bftrainer_slurm::{AcctQuery, ClusterView, Slurm, SlurmDb};
use std::collections::VecDeque;

/// Longest slurmdbd read: a month.
pub const WINDOW_S: i64 = 30 * 86_400;

/// Job records one read aims at: the next read's window is scaled to the last one's
/// density (from an hour to [`WINDOW_S`]), so that a busy cluster's month is read in
/// parts. libslurm hands a read back as one list of full job records (the replay's
/// peak memory, about 2 KB a record), so this bounds the replay's memory.
pub const READ_RECORDS: usize = 20_000;

/// The first read's window, before the records' density is known.
const FIRST_WINDOW_S: i64 = 86_400;

/// Idle trace of every node of the cluster over [from, to) (Unix seconds), from the
/// accounting records of the jobs that ran then, leaving out jobs of `exclude`
/// partitions (e.g. the elastic partition, whose nodes were idle to the main scheduler),
/// whole in memory.
pub fn trace_from_sacct(from: i64, to: i64, exclude: &[String]) -> anyhow::Result<NodeTrace> {
    trace_from_sacct_windows(from, to, exclude, WINDOW_S)
}

/// As [`trace_from_sacct`], reading slurmdbd `window_s` seconds at a time.
pub fn trace_from_sacct_windows(
    from: i64,
    to: i64,
    exclude: &[String],
    window_s: i64,
) -> anyhow::Result<NodeTrace> {
    let src = SacctSource::new(from, to, exclude.to_vec(), window_s)?;
    Ok(NodeTrace::collect(&mut src.events()?)?)
}

/// The cluster and window of a `--from-sacct` replay; [`SacctSource::events`] reads the
/// records each time the trace is read.
pub struct SacctSource {
    slurm: Slurm,
    nodes: Vec<String>,
    /// What each node offers, as bftrainerd reads it (features, GRES, RealMemory).
    attrs: Vec<NodeAttrs>,
    /// One slurmdbd often serves several clusters: without naming ours, another
    /// cluster's jobs would come back on nodes this one does not have.
    cluster: String,
    from: i64,
    to: i64,
    exclude: Vec<String>,
    window_s: i64,
}

impl SacctSource {
    /// Reads the node list and the cluster's name from slurmctld.
    pub fn new(from: i64, to: i64, exclude: Vec<String>, window_s: i64) -> anyhow::Result<Self> {
        anyhow::ensure!(window_s > 0, "the read window must be > 0 s");
        let slurm =
            Slurm::init().context("--from-sacct needs libslurm and a readable slurm.conf")?;
        let mut view = ClusterView::default();
        view.refresh(&slurm)
            .context("cannot read the node list from slurmctld")?;
        let nodes = view.nodes().iter().map(|n| n.name.clone()).collect();
        let attrs = view
            .nodes()
            .iter()
            .map(crate::daemon::placement::node_attrs)
            .collect();
        let cluster = slurm
            .cluster_name()
            .context("cannot read ClusterName from slurmctld")?;
        Ok(Self {
            slurm,
            nodes,
            attrs,
            cluster,
            from,
            to,
            exclude,
            window_s,
        })
    }

    /// The cluster's node names and what each offers, in slurmctld's order.
    pub fn names(&self) -> &[String] {
        &self.nodes
    }
    pub fn attrs(&self) -> &[NodeAttrs] {
        &self.attrs
    }

    /// The window [from, to) and the cluster's node count.
    pub fn window(&self) -> (i64, i64, usize) {
        (self.from, self.to, self.nodes.len())
    }

    /// The trace from its start: connects to slurmdbd and reads the first window (for
    /// the state at the start); later windows are read when the replay reaches them.
    pub fn events(&self) -> anyhow::Result<SacctEvents<'_>> {
        let mut db = SlurmDb::connect(&self.slurm).context("cannot connect to slurmdbd")?;
        let len = FIRST_WINDOW_S.min(self.window_s);
        let first_end = self.from.saturating_add(len).min(self.to);
        let first = self.read(&mut db, self.from, first_end)?;
        let mut sweep = Sweep::new(&self.nodes, self.from, self.to, &first)?;
        let mut changes = Vec::new();
        sweep.window(&first, self.from, first_end, &mut changes)?;
        Ok(SacctEvents {
            src: self,
            db,
            sweep,
            next_w: first_end,
            len: self.next_len(len, first.len()),
            buf: changes.into(),
        })
    }

    /// The next read's window length after a read of `len` seconds gave `n` records.
    fn next_len(&self, len: i64, n: usize) -> i64 {
        let scaled = (len as f64 * READ_RECORDS as f64 / n.max(1) as f64) as i64;
        scaled.clamp(3600.min(self.window_s), self.window_s)
    }

    /// The runs overlapping [w, w_end), less the excluded partitions' jobs. The query
    /// reaches a second further on either side: a run that ends at `w` or starts just
    /// before `w_end` is in it whether slurmdbd compares times inclusively or not (the
    /// sweep uses only the events inside the window).
    fn read(&self, db: &mut SlurmDb, w: i64, w_end: i64) -> anyhow::Result<Vec<JobUsage>> {
        let q = AcctQuery {
            start: w.saturating_sub(1),
            end: Some(w_end.saturating_add(1)),
            duplicates: true,
            clusters: vec![self.cluster.clone()],
            ..Default::default()
        };
        let jobs = db
            .jobs(&q)
            .context("cannot read job records from slurmdbd")?;
        log::debug!("{} job records for [{w}, {w_end})", jobs.len());
        Ok(jobs
            .into_iter()
            .filter(|j| {
                !j.partition
                    .as_ref()
                    .is_some_and(|p| self.exclude.iter().any(|e| e == p))
            })
            .map(|j| JobUsage {
                job_id: j.job_id.to_string(),
                start: j.start_time,
                end: j.end_time,
                nodelist: j.nodes.unwrap_or_default(),
            })
            .collect())
    }
}

/// The idle trace of a [`SacctSource`], a window of records at a time.
pub struct SacctEvents<'a> {
    src: &'a SacctSource,
    db: SlurmDb,
    sweep: Sweep,
    /// The next window to read, and its length.
    next_w: i64,
    len: i64,
    buf: VecDeque<NodeChange>,
}

impl NodeEvents for SacctEvents<'_> {
    fn head(&self) -> Head<'_> {
        Head {
            names: &self.src.nodes,
            initial_idle: &self.sweep.initial_idle,
            start: self.src.from,
            end: self.src.to,
        }
    }

    fn peek(&mut self) -> bftrainer_core::Result<Option<TraceItem>> {
        while self.buf.is_empty() && self.next_w < self.src.to {
            let (w, w_end) = (
                self.next_w,
                self.next_w.saturating_add(self.len).min(self.src.to),
            );
            let recs = self.src.read(&mut self.db, w, w_end).map_err(|e| {
                bftrainer_core::Error::Input {
                    what: "slurm accounting".into(),
                    msg: format!("{e:#}"),
                }
            })?;
            let mut changes = Vec::new();
            self.sweep.window(&recs, w, w_end, &mut changes)?;
            self.buf.extend(changes);
            self.next_w = w_end;
            self.len = self.src.next_len(w_end - w, recs.len());
        }
        Ok(self.buf.front().copied().map(TraceItem::Change))
    }

    fn next(&mut self) -> bftrainer_core::Result<Option<TraceItem>> {
        let item = self.peek()?;
        self.buf.pop_front();
        Ok(item)
    }
}
