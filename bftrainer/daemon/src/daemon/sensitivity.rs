//! Each GPU job's measured sensitivity to CPUs and memory per GPU (Synergy, issue 34):
//! every rate the runtime publishes in the core job's Comment is paired with what the
//! job's running parts hold, read from Slurm's own job records (not from the job: the
//! CPUs and memory Slurm allocated cannot be forged), and the job's curves are fitted
//! with `alloc::synergy::fit`.
//!
//! A synchronous data-parallel job runs at the pace of its slowest worker, so a
//! measurement is taken at the fewest CPUs (and MiB) per GPU among its parts; the rate
//! is per GPU (the job's rate over all its GPUs). A rate is paired only while the parts
//! Slurm runs hold as many nodes as the runtime says it trains on: during a grow or a
//! shrink the two disagree, and the pair would be wrong.
//!
//! The rates are the job's own words (its Comment), as for the node decision: a job
//! that lies misleads the split of its own nodes first. Measurements live in memory;
//! after a restart a job's curve is fitted again from new ones.

use super::*;
use bftrainer_core::alloc::synergy::{self, Observation, Sensitivity};
use std::collections::VecDeque;

/// Measurements kept per job (the oldest dropped first): enough for a curve of a dozen
/// CPU counts measured several times each.
pub const MAX_OBSERVATIONS: usize = 256;

/// What one job's measurements say.
#[derive(Debug, Default)]
pub(super) struct Measured {
    obs: VecDeque<Observation>,
    /// The curves fitted to `obs` (None until the first measurement).
    pub fit: Option<Sensitivity>,
    /// CPUs and MiB per GPU the job's parts held at its last measurement.
    pub held: Option<(f64, f64)>,
    /// The rate and size last read in the Comment.
    seen: Option<(f64, u32)>,
}

impl Measured {
    /// Adds a measurement and fits again. An unchanged one (the same rate read again at
    /// the next poll) is not counted twice.
    pub fn add(&mut self, o: Observation) {
        if self.obs.back() == Some(&o) {
            return;
        }
        if self.obs.len() == MAX_OBSERVATIONS {
            self.obs.pop_front();
        }
        self.obs.push_back(o);
        self.held = Some((o.cpus_per_gpu, o.mem_mib_per_gpu));
        let all: Vec<Observation> = self.obs.iter().copied().collect();
        match synergy::fit(&all) {
            Ok(s) => self.fit = Some(s),
            // `part_point` admits only what fit accepts; kept for safety, never fatal.
            Err(e) => log::warn!("fitting a job's sensitivity failed: {e}"),
        }
    }

    pub fn count(&self) -> usize {
        self.obs.len()
    }
}

/// What one running part of a job holds: its GPUs, CPUs and memory (MiB; 0 when Slurm
/// does not count memory). None for a part without GPUs.
pub(super) fn part_holds(j: &Job) -> Option<(u32, u32, u64)> {
    let per_node = j
        .tres_per_node
        .as_deref()
        .and_then(bftrainer_slurm::gpus_per_node)?
        .1;
    let nodes = j.num_nodes.max(1);
    let gpus = per_node.checked_mul(nodes).filter(|&g| g > 0)?;
    let mem = match (j.mem_per_node_mb, j.mem_per_cpu_mb) {
        (Some(m), _) if m > 0 => m.saturating_mul(u64::from(nodes)),
        (_, Some(m)) if m > 0 => m.saturating_mul(u64::from(j.num_cpus)),
        _ => 0,
    };
    Some((gpus, j.num_cpus, mem))
}

/// The measurement a job's running parts and its published rate make: per GPU, the
/// fewest CPUs and MiB of any part. None when a part has no GPUs or no CPUs, or the
/// rate is not a positive finite number. Without a memory figure (Slurm not counting
/// memory) every measurement says 1 MiB per GPU: one level, so no memory curve.
pub(super) fn point(parts: &[(u32, u32, u64)], rate: f64) -> Option<Observation> {
    if parts.is_empty() || !rate.is_finite() || rate <= 0.0 {
        return None;
    }
    let mut gpus = 0u64;
    let mut cpus = f64::INFINITY;
    let mut mem = f64::INFINITY;
    let mut mem_known = true;
    for &(g, c, m) in parts {
        if g == 0 || c == 0 {
            return None;
        }
        gpus += u64::from(g);
        cpus = cpus.min(f64::from(c) / f64::from(g));
        mem_known &= m > 0;
        mem = mem.min(m as f64 / f64::from(g));
    }
    Some(Observation {
        cpus_per_gpu: cpus,
        mem_mib_per_gpu: if mem_known { mem } else { 1.0 },
        rate: rate / gpus as f64,
    })
}

impl<C: Cluster> Daemon<C> {
    /// Pairs the rate of core job `id` (its Comment, `rc`) with what its running parts
    /// hold (the core `j` and its running satellites, from Slurm).
    pub(super) fn observe_sensitivity(&mut self, id: u32, j: &Job, rc: &RunComment) {
        if rc.rate <= 0.0 || !is_running(j) {
            return;
        }
        // Read again only when the runtime publishes another rate or size: a poll of
        // an unchanged Comment costs one comparison.
        let m = self.measured.entry(id).or_default();
        if m.seen == Some((rc.rate, rc.nodes)) {
            return;
        }
        m.seen = Some((rc.rate, rc.nodes));
        let Some(core_part) = part_holds(j) else {
            return;
        };
        let mut parts = vec![core_part];
        let mut nodes = j.num_nodes.max(1);
        let jobs = self.cluster.jobs();
        for &i in self.sat_parts.get(&id).map_or(&[][..], |v| v.as_slice()) {
            let Some(s) = jobs.get(i) else {
                continue;
            };
            let live = self
                .sats
                .get(&s.job_id)
                .is_some_and(|m| m.parent == id && !m.done && !m.ending);
            if !live || !is_running(s) {
                continue;
            }
            let Some(p) = part_holds(s) else {
                return;
            };
            parts.push(p);
            nodes += s.num_nodes.max(1);
        }
        if nodes != rc.nodes {
            return;
        }
        if let Some(o) = point(&parts, rc.rate) {
            if let Some(m) = self.measured.get_mut(&id) {
                m.add(o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_job(gpus: u32, nodes: u32, cpus: u32, mem_node: Option<u64>) -> Job {
        let mut j = super::super::gen::job(7, "batch", JobBase::Running);
        j.tres_per_node = Some(format!("gres/gpu:{gpus}"));
        j.num_nodes = nodes;
        j.num_cpus = cpus;
        j.mem_per_node_mb = mem_node;
        j.mem_per_cpu_mb = None;
        j
    }

    #[test]
    fn the_daemon_pairs_published_rates_with_the_cpus_slurm_gave_and_fits_them() {
        let (cluster, cfg, _state) = super::super::tests::four_nodes_one_held_core("");
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        let mut now = 3_000_000_000.0;
        super::super::tests::grow_to_four(&mut d, &mut now);
        let start = d.cluster.jobs[0].start_time.unwrap();
        // Each part holds one GPU; the core 8 CPUs, each satellite `sat_cpus`, and
        // 16 GiB per node; the runtime says it trains on `nodes` at `rate`.
        let mut measure =
            |d: &mut Daemon<gen::GenCluster>, sat_cpus: u32, nodes: u32, rate: f64| {
                for j in d.cluster.jobs.iter_mut() {
                    j.tres_per_node = Some("gres/gpu:1".into());
                    j.mem_per_node_mb = Some(16384);
                    j.num_cpus = if j.job_id == 1 { 8 } else { sat_cpus };
                }
                d.cluster.jobs[0].comment = Some(
                    RunComment {
                        coord: "n1:29400".into(),
                        run: "ab".into(),
                        start,
                        gen: 2,
                        nodes,
                        rate,
                        step: 0.5,
                        ..Default::default()
                    }
                    .to_string(),
                );
                d.cluster.dirty = true;
                now += 1.0;
                d.cycle(now).unwrap();
                d.snapshot(now)
                    .jobs
                    .into_iter()
                    .find(|j| j.job_id == 1)
                    .unwrap()
            };
        // 400 samples/s over 4 GPUs, the slowest part at 4 CPUs per GPU.
        let v = measure(&mut d, 4, 4, 400.0);
        assert_eq!(v.held_per_gpu, Some((4.0, 16384.0)));
        assert_eq!(v.sensitivity.as_ref().unwrap().cpu, vec![(4.0, 100.0)]);
        // The same rate read again adds nothing; a rate while the runtime trains on 3
        // of the 4 nodes Slurm runs (a change under way) is not paired.
        let v = measure(&mut d, 4, 4, 400.0);
        assert_eq!(v.measurements, 1);
        let v = measure(&mut d, 6, 3, 900.0);
        assert_eq!(v.measurements, 1);
        // At 8 CPUs per GPU: 600 samples/s.
        let v = measure(&mut d, 8, 4, 600.0);
        assert_eq!(v.measurements, 2);
        let s = v.sensitivity.unwrap();
        assert_eq!(s.cpu, vec![(4.0, 100.0), (8.0, 150.0)]);
        assert!(s.mem.is_empty(), "one memory level: no memory curve");
        // `bftrainer jobs` shows it.
        let text = crate::cmd::ctl::jobs_text(&d.snapshot(now).jobs, false);
        assert!(
            text.contains("Job 1: per GPU holds 8.0 CPUs, 16384 MiB; measured rate 100.0/s at 4.0 CPUs, 150.0/s at 8.0 CPUs (2 measurements)"),
            "{text}"
        );
    }

    #[test]
    fn a_part_holds_its_gpus_cpus_and_memory_per_node_times_nodes() {
        assert_eq!(
            part_holds(&gpu_job(2, 2, 16, Some(8192))),
            Some((4, 16, 16384))
        );
        let mut j = gpu_job(1, 1, 4, None);
        j.mem_per_cpu_mb = Some(1000);
        assert_eq!(part_holds(&j), Some((1, 4, 4000)));
        assert_eq!(part_holds(&gpu_job(1, 1, 4, Some(0))), Some((1, 4, 0)));
        let mut none = gpu_job(1, 1, 4, None);
        none.tres_per_node = None;
        assert_eq!(part_holds(&none), None);
        none.tres_per_node = Some("gres/gpu:0".into());
        assert_eq!(part_holds(&none), None);
    }

    #[test]
    fn a_measurement_is_per_gpu_at_the_slowest_part() {
        // A core of 2 GPUs with 16 CPUs, a satellite of 1 GPU with 4: the job runs at
        // the satellite's 4 CPUs per GPU; 300 samples/s over 3 GPUs.
        let o = point(&[(2, 16, 32768), (1, 4, 8192)], 300.0).unwrap();
        assert_eq!(o.cpus_per_gpu, 4.0);
        assert_eq!(o.mem_mib_per_gpu, 8192.0);
        assert_eq!(o.rate, 100.0);
        // Memory not counted by Slurm: one level for every measurement.
        let o = point(&[(2, 16, 0), (1, 4, 8192)], 300.0).unwrap();
        assert_eq!(o.mem_mib_per_gpu, 1.0);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(point(&[(1, 4, 1)], bad), None, "{bad}");
        }
        assert_eq!(point(&[(1, 0, 1)], 10.0), None);
        assert_eq!(point(&[], 10.0), None);
    }

    #[test]
    fn measurements_at_more_cpus_fit_a_rising_curve_and_repeats_count_once() {
        let mut m = Measured::default();
        for (c, r) in [(2.0, 50.0), (2.0, 50.0), (4.0, 90.0), (8.0, 120.0)] {
            m.add(Observation {
                cpus_per_gpu: c,
                mem_mib_per_gpu: 1.0,
                rate: r,
            });
        }
        assert_eq!(m.count(), 3);
        assert_eq!(m.held, Some((8.0, 1.0)));
        let s = m.fit.clone().unwrap();
        assert_eq!(s.cpu, vec![(2.0, 50.0), (4.0, 90.0), (8.0, 120.0)]);
        assert!(s.mem.is_empty());
        for i in 0..MAX_OBSERVATIONS + 10 {
            m.add(Observation {
                cpus_per_gpu: 1.0 + (i % 7) as f64,
                mem_mib_per_gpu: 1.0,
                rate: 10.0 * (1.0 + (i % 7) as f64),
            });
        }
        assert_eq!(m.count(), MAX_OBSERVATIONS);
    }
}
