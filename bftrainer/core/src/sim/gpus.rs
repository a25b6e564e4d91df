//! GPU-granular harvest in a replay (DeepBoot): each node of a trace as K GPU-slot
//! units `host/gpuK`, and elastic jobs whose curves count GPUs instead of nodes.

use crate::alloc::gen::slot_curve;
use crate::error::{Error, Result};
use crate::placement::gpu_slot_name;
use crate::trace::jobs::JobRecord;
use crate::trace::{Head, NodeChange, NodeEvents, TraceItem};
use std::collections::VecDeque;

/// Most GPUs per node a replay accepts (Slurm's GRES counts go higher; no node has
/// more GPUs than this, and each becomes a unit of the engine).
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// A node trace with every node split into `k` GPU slots (`host/gpu0` ..
/// `host/gpu{k-1}`, units `i*k .. i*k+k` of node `i`), each changing with its node:
/// the harvest whole nodes would give, now lendable GPU by GPU.
pub struct GpuSlots<E> {
    inner: E,
    k: u32,
    names: Vec<String>,
    initial: Vec<bool>,
    buf: VecDeque<TraceItem>,
}

impl<E: NodeEvents> GpuSlots<E> {
    pub fn new(inner: E, k: u32) -> Result<Self> {
        check_k(k)?;
        let h = inner.head();
        let n = h.names.len() * k as usize;
        let mut names = Vec::with_capacity(n);
        let mut initial = Vec::with_capacity(n);
        for (name, &idle) in h.names.iter().zip(h.initial_idle) {
            for g in 0..k {
                names.push(gpu_slot_name(name, g));
                initial.push(idle);
            }
        }
        Ok(GpuSlots {
            inner,
            k,
            names,
            initial,
            buf: VecDeque::new(),
        })
    }

    fn fill(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            return Ok(());
        }
        match self.inner.next()? {
            Some(TraceItem::Change(c)) => {
                for g in 0..self.k {
                    self.buf.push_back(TraceItem::Change(NodeChange {
                        node: c.node * self.k + g,
                        ..c
                    }));
                }
            }
            Some(f) => self.buf.push_back(f),
            None => {}
        }
        Ok(())
    }
}

impl<E: NodeEvents> NodeEvents for GpuSlots<E> {
    fn head(&self) -> Head<'_> {
        let h = self.inner.head();
        Head {
            names: &self.names,
            initial_idle: &self.initial,
            start: h.start,
            end: h.end,
        }
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        self.fill()?;
        Ok(self.buf.front().copied())
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.fill()?;
        Ok(self.buf.pop_front())
    }
}

fn check_k(k: u32) -> Result<()> {
    if !(1..=MAX_GPUS_PER_NODE).contains(&k) {
        return Err(Error::Config(format!(
            "GPUs per node must be 1 to {MAX_GPUS_PER_NODE}, found {k}"
        )));
    }
    Ok(())
}

/// The jobs with their node counts in GPUs of nodes of `k`: the rate and objective at
/// g GPUs are the file's at g/k nodes (linear from 0 below one node), the minimum and
/// maximum are k times the file's.
pub fn slot_jobs(jobs: &[JobRecord], k: u32) -> Result<Vec<JobRecord>> {
    check_k(k)?;
    jobs.iter()
        .map(|j| {
            let (Some(min), Some(max)) = (j.min_nodes.checked_mul(k), j.max_nodes.checked_mul(k))
            else {
                return Err(Error::Config(format!(
                    "job {}: {} nodes x {k} GPUs is too many units",
                    j.name, j.max_nodes
                )));
            };
            Ok(JobRecord {
                min_nodes: min,
                max_nodes: max,
                rate: slot_curve(&j.rate, k),
                objective: slot_curve(&j.objective, k),
                ..j.clone()
            })
        })
        .collect()
}

/// A trace whose units are processors, `k` per node in order (unit `i` on node
/// `i / k`), renamed `node{i/k}/gpu{i%k}`: the shared-node model, where regular jobs
/// hold processors (slots), not whole nodes, and a node's other slots stay idle.
pub struct SharedNodes<E> {
    inner: E,
    names: Vec<String>,
}

impl<E: NodeEvents> SharedNodes<E> {
    pub fn new(inner: E, k: u32) -> Result<Self> {
        check_k(k)?;
        let n = inner.head().names.len();
        let names = (0..n)
            .map(|i| {
                gpu_slot_name(
                    &format!("node{:04}", i / k as usize),
                    (i % k as usize) as u32,
                )
            })
            .collect();
        Ok(SharedNodes { inner, names })
    }
}

impl<E: NodeEvents> NodeEvents for SharedNodes<E> {
    fn head(&self) -> Head<'_> {
        Head {
            names: &self.names,
            ..self.inner.head()
        }
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        self.inner.peek()
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.inner.next()
    }
}

/// The whole-node view of a trace of GPU slots (names `host/gpuK`; a name without a
/// `/` is a host of one slot): a host is idle when every one of its slots is, as a
/// whole-node harvester sees a shared node. Its forecast is that of the change that
/// made it idle (or updated it since); plan-wide forecasts pass through.
pub struct WholeHosts<E> {
    inner: E,
    names: Vec<String>,
    initial: Vec<bool>,
    host_of: Vec<u32>,
    slot_idle: Vec<bool>,
    size: Vec<u32>,
    idle: Vec<u32>,
    buf: Option<TraceItem>,
}

impl<E: NodeEvents> WholeHosts<E> {
    pub fn new(inner: E) -> Self {
        let h = inner.head();
        let mut ids: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        let mut names = Vec::new();
        let mut host_of = Vec::with_capacity(h.names.len());
        for n in h.names {
            let host = crate::placement::slot_host(n);
            let k = *ids.entry(host).or_insert_with(|| {
                names.push(host.to_string());
                names.len() as u32 - 1
            });
            host_of.push(k);
        }
        let mut size = vec![0u32; names.len()];
        let mut idle = vec![0u32; names.len()];
        for (&k, &i) in host_of.iter().zip(h.initial_idle) {
            size[k as usize] += 1;
            idle[k as usize] += u32::from(i);
        }
        let initial = size.iter().zip(&idle).map(|(s, i)| s == i).collect();
        let slot_idle = h.initial_idle.to_vec();
        WholeHosts {
            inner,
            names,
            initial,
            host_of,
            slot_idle,
            size,
            idle,
            buf: None,
        }
    }

    fn fill(&mut self) -> Result<()> {
        while self.buf.is_none() {
            let Some(item) = self.inner.next()? else {
                return Ok(());
            };
            let c = match item {
                TraceItem::Change(c) => c,
                f => {
                    self.buf = Some(f);
                    return Ok(());
                }
            };
            let s = c.node as usize;
            let Some(&h) = self.host_of.get(s) else {
                return Err(Error::Config(format!("trace change of unknown node {s}")));
            };
            let h = h as usize;
            let was = self.idle[h] == self.size[h];
            if self.slot_idle[s] != c.idle {
                self.slot_idle[s] = c.idle;
                if c.idle {
                    self.idle[h] += 1;
                } else {
                    self.idle[h] -= 1;
                }
            }
            let now = self.idle[h] == self.size[h];
            // A host's change, or a forecast update of an idle host.
            if was != now || (now && c.idle) {
                self.buf = Some(TraceItem::Change(NodeChange {
                    node: h as u32,
                    idle: now,
                    ..c
                }));
            }
        }
        Ok(())
    }
}

impl<E: NodeEvents> NodeEvents for WholeHosts<E> {
    fn head(&self) -> Head<'_> {
        let h = self.inner.head();
        Head {
            names: &self.names,
            initial_idle: &self.initial,
            start: h.start,
            end: h.end,
        }
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        self.fill()?;
        Ok(self.buf)
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.fill()?;
        Ok(self.buf.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::NodeTrace;

    #[test]
    fn every_node_becomes_its_gpus_changing_with_it() {
        let tr = NodeTrace {
            names: vec!["a".into(), "b".into()],
            start: 0,
            end: 100,
            initial_idle: vec![true, false],
            changes: vec![NodeChange {
                t: 10,
                node: 1,
                idle: true,
                reclaim_at: Some(50),
            }],
            forecasts: vec![],
        };
        let mut s = GpuSlots::new(tr.events(), 3).unwrap();
        assert_eq!(
            s.names(),
            ["a/gpu0", "a/gpu1", "a/gpu2", "b/gpu0", "b/gpu1", "b/gpu2"]
        );
        assert_eq!(s.initial_idle(), [true, true, true, false, false, false]);
        let got = NodeTrace::collect(&mut s).unwrap();
        let nodes: Vec<u32> = got.changes.iter().map(|c| c.node).collect();
        assert_eq!(nodes, vec![3, 4, 5]);
        assert!(got
            .changes
            .iter()
            .all(|c| c.t == 10 && c.idle && c.reclaim_at == Some(50)));
        // And back: the whole-node view of the slots is the trace itself.
        let mut w = WholeHosts::new(GpuSlots::new(tr.events(), 3).unwrap());
        assert_eq!(NodeTrace::collect(&mut w).unwrap(), tr);
        assert!(GpuSlots::new(tr.events(), 0).is_err());
        assert!(GpuSlots::new(tr.events(), MAX_GPUS_PER_NODE + 1).is_err());
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;
    use crate::alloc::Curve;
    use crate::engine::Exact;
    use crate::sim::{simulate, simulate_events, Hooks, Outcome, SimConfig};
    use crate::trace::NodeTrace;

    fn hooks_run(f: impl FnOnce(&mut Hooks<'_>) -> Outcome) -> Outcome {
        let mut clock = || 0.0;
        let mut progress = |_f: f64| {};
        f(&mut Hooks {
            clock: &mut clock,
            progress: &mut progress,
        })
    }

    /// Hosts a and b of 2 GPUs, 3600 s. A regular job holds a/gpu0 until 1800 s, another
    /// b/gpu1 throughout: no host is idle before 1800, then only a.
    fn shared_trace() -> NodeTrace {
        NodeTrace {
            names: ["a/gpu0", "a/gpu1", "b/gpu0", "b/gpu1"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            start: 0,
            end: 3600,
            initial_idle: vec![false, true, true, false],
            changes: vec![NodeChange {
                t: 1800,
                node: 0,
                idle: true,
                reclaim_at: None,
            }],
            forecasts: vec![],
        }
    }

    /// One job of 1..2 nodes (2..4 GPUs), 100 samples/s per node, that never finishes.
    fn job() -> JobRecord {
        let c = Curve::new(vec![(1, 100.0), (2, 200.0)]);
        JobRecord {
            name: "J".into(),
            submit: 0,
            min_nodes: 1,
            max_nodes: 2,
            scale_up_s: 1.0,
            scale_down_s: 1.0,
            total_samples: 1e12,
            rate: c.clone(),
            objective: c,
            user: None,
            priority: 0,
            needs: Default::default(),
        }
    }

    #[test]
    fn idle_gpus_of_shared_hosts_are_harvested_only_gpu_by_gpu() {
        let cfg = SimConfig::default();
        let tr = shared_trace();
        // Whole nodes: host a from 1800 s, 1 node x 1800 s = 0.5 node-hours (1 GPU-hour).
        let whole = hooks_run(|h| {
            simulate_events(
                &mut WholeHosts::new(tr.events()),
                &[job()],
                Exact::default(),
                &cfg,
                h,
            )
            .unwrap()
        });
        assert!(
            (whole.report.harvested_node_h - 0.5).abs() < 1e-9,
            "{:?}",
            whole.report
        );
        assert!((whole.report.idle_node_h - 0.5).abs() < 1e-9);
        // GPU by GPU: a/gpu1 and b/gpu0 from 0 (the job's minimum of 2 GPUs), a/gpu0
        // too from 1800: 2 x 3600 + 1 x 1800 s = 2.5 GPU-hours, all of the idle ones.
        let jobs = slot_jobs(&[job()], 2).unwrap();
        assert_eq!((jobs[0].min_nodes, jobs[0].max_nodes), (2, 4));
        let gran = hooks_run(|h| simulate(&tr, &jobs, Exact::default(), &cfg, h).unwrap());
        assert!(
            (gran.report.harvested_node_h - 2.5).abs() < 1e-9,
            "{:?}",
            gran.report
        );
        assert!((gran.report.idle_node_h - 2.5).abs() < 1e-9);
        assert!(gran.report.harvested_node_h >= 2.0 * whole.report.harvested_node_h);
    }

    #[test]
    fn whole_idle_nodes_give_the_same_gpu_hours_either_way_here() {
        // Host a idle throughout, b from 1800 s. Whole nodes: 1 node x 0.5 h + 2 x 0.5 h
        // = 1.5 node-hours = 3 GPU-hours; GPU slots: 2 GPUs x 0.5 h + 4 x 0.5 h = 3
        // GPU-hours. Whole idle nodes leave no partial fragment to gain from.
        let tr = NodeTrace {
            names: vec!["a".into(), "b".into()],
            start: 0,
            end: 3600,
            initial_idle: vec![true, false],
            changes: vec![NodeChange {
                t: 1800,
                node: 1,
                idle: true,
                reclaim_at: None,
            }],
            forecasts: vec![],
        };
        let cfg = SimConfig::default();
        let whole = hooks_run(|h| simulate(&tr, &[job()], Exact::default(), &cfg, h).unwrap());
        assert!(
            (2.0 * whole.report.harvested_node_h - 3.0).abs() < 1e-9,
            "{:?}",
            whole.report
        );
        let jobs = slot_jobs(&[job()], 2).unwrap();
        let gran = hooks_run(|h| {
            simulate_events(
                &mut GpuSlots::new(tr.events(), 2).unwrap(),
                &jobs,
                Exact::default(),
                &cfg,
                h,
            )
            .unwrap()
        });
        assert!(
            (gran.report.harvested_node_h - 3.0).abs() < 1e-9,
            "{:?}",
            gran.report
        );
    }
}
