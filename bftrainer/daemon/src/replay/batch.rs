//! `bftrainer replay --batch-range LO:HI`: the global batch as the allocator's decision
//! (Effective Elastic Scaling, Saxena et al. 2020) against a fixed batch, on one input.
//!
//! Both runs see each job through [`EfficiencyModel`] (alloc/efficiency.rs says which
//! model and where it comes from). The fixed run gives each job its goodput curve at one
//! batch. The joint run gives it, per node count, the best goodput over the batches
//! allowed: exactly what the solver maximises for a job with `batch_curves` whose batch
//! follows its node count (its current rate then lies on the same best curve), so the
//! engine needs no other input, and the job's progress accrues at that goodput. A batch
//! changes only when the node count does, at a rescale the job model already charges.

use anyhow::Context;
use bftrainer_core::alloc::{Curve, EfficiencyModel};
use bftrainer_core::trace::jobs::JobRecord;
use serde::Serialize;

/// The model and the batches of a `--batch-range` comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOptions {
    /// The global batch the job file's curves were measured at, and the noise scale.
    pub model: EfficiencyModel,
    /// Global batches the joint decision may choose from (inclusive).
    pub range: (u32, u32),
    /// The fixed run's global batch.
    pub fixed: u32,
}

/// How a run of the replay treats the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchChoice {
    /// The job file's curves as they are (no batch model).
    #[default]
    Plain,
    /// Every job at `BatchOptions::fixed`.
    Fixed,
    /// Nodes and batch chosen together.
    Joint,
}

impl BatchOptions {
    /// Checks the options; the message names the option and what is allowed.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.model
            .validate()
            .context("--base-batch/--noise-scale")?;
        self.model
            .candidate_batches(self.range)
            .context("--batch-range")?;
        if self.fixed == 0 {
            anyhow::bail!("--fixed-batch is 0; must be >= 1");
        }
        Ok(())
    }

    /// The job file's jobs as a run under `choice` sees them.
    pub fn jobs(&self, jobs: &[JobRecord], choice: BatchChoice) -> anyhow::Result<Vec<JobRecord>> {
        if choice == BatchChoice::Plain {
            return Ok(jobs.to_vec());
        }
        let batches = match choice {
            BatchChoice::Fixed => vec![self.fixed],
            _ => self.model.candidate_batches(self.range)?,
        };
        jobs.iter()
            .map(|j| {
                let curves = self
                    .model
                    .batch_curves_for(&j.rate, &batches, j.max_nodes)
                    .with_context(|| format!("job {}", j.name))?;
                // Every curve has the same node counts: the best one, point by point.
                let rate = Curve::new(
                    curves[0]
                        .curve
                        .points
                        .iter()
                        .enumerate()
                        .map(|(i, &(n, _))| {
                            let best = curves
                                .iter()
                                .map(|c| c.curve.points[i].1)
                                .fold(0.0, f64::max);
                            (n, best)
                        })
                        .collect(),
                );
                // The objective (samples/s or speed-up) scales as the rate does.
                let objective = Curve::new(
                    rate.points
                        .iter()
                        .map(|&(n, r)| {
                            let (r0, o0) = (j.rate.eval(n), j.objective.eval(n));
                            (n, if r0 > 0.0 { o0 * r / r0 } else { o0 })
                        })
                        .collect(),
                );
                Ok(JobRecord {
                    rate,
                    objective,
                    ..j.clone()
                })
            })
            .collect()
    }
}

/// `LO:HI` global batches, as `--batch-range` takes them.
pub fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let bad = || {
        format!("'{s}' is not a batch range; expected LO:HI, whole numbers 1 <= LO <= HI (e.g. 256:8192)")
    };
    let (lo, hi) = s.split_once(':').ok_or_else(bad)?;
    let (lo, hi): (u32, u32) = (
        lo.trim().parse().map_err(|_| bad())?,
        hi.trim().parse().map_err(|_| bad())?,
    );
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::placement::Needs;

    fn job(points: Vec<(u32, f64)>, max: u32) -> JobRecord {
        let rate = Curve::new(points);
        JobRecord {
            name: "j".into(),
            submit: 0,
            min_nodes: 1,
            max_nodes: max,
            scale_up_s: 10.0,
            scale_down_s: 5.0,
            total_samples: 1e9,
            objective: Curve::new(rate.points.iter().map(|&(n, y)| (n, y / 100.0)).collect()),
            rate,
            user: None,
            priority: 0,
            needs: Needs::default(),
        }
    }

    fn opts(noise: Option<f64>) -> BatchOptions {
        let mut model = EfficiencyModel::new(256);
        model.noise_scale = noise;
        BatchOptions {
            model,
            range: (128, 8192),
            fixed: 256,
        }
    }

    #[test]
    fn fixed_at_the_base_batch_is_the_job_file_and_joint_is_never_below_it() {
        let j = job(
            vec![(1, 1000.0), (2, 1900.0), (8, 6000.0), (64, 30000.0)],
            64,
        );
        for noise in [None, Some(500.0), Some(20000.0)] {
            let o = opts(noise);
            let fixed = &o
                .jobs(std::slice::from_ref(&j), BatchChoice::Fixed)
                .unwrap()[0];
            let joint = &o
                .jobs(std::slice::from_ref(&j), BatchChoice::Joint)
                .unwrap()[0];
            for n in 1..=64 {
                let (r, f, g) = (j.rate.eval(n), fixed.rate.eval(n), joint.rate.eval(n));
                assert!((f - r).abs() <= 1e-9 * r, "{noise:?} n={n}: {f} vs {r}");
                assert!(g >= f * (1.0 - 1e-12), "{noise:?} n={n}: {g} < {f}");
                // The objective keeps its ratio to the rate.
                let (go, ro) = (joint.objective.eval(n), j.objective.eval(n));
                assert!((go / g - ro / r).abs() < 1e-9, "n={n}");
            }
            assert_eq!(joint.total_samples, j.total_samples);
            assert_eq!(joint.max_nodes, 64);
        }
        // Saxena's assumption: at 64 nodes the largest batch, several times the sync saved.
        let joint = &opts(None)
            .jobs(std::slice::from_ref(&j), BatchChoice::Joint)
            .unwrap()[0];
        let m = EfficiencyModel::new(256);
        assert!((joint.rate.eval(64) - m.throughput(&j.rate, 64, 8192)).abs() < 1e-6);
        assert!(joint.rate.eval(64) > 1.5 * j.rate.eval(64));
        let plain = &opts(None)
            .jobs(std::slice::from_ref(&j), BatchChoice::Plain)
            .unwrap()[0];
        assert_eq!(plain, &j);
    }

    #[test]
    fn a_fixed_batch_off_the_base_moves_the_curve() {
        let j = job(vec![(1, 1000.0), (4, 3000.0)], 4);
        let o = BatchOptions {
            fixed: 1024,
            ..opts(None)
        };
        let fixed = &o
            .jobs(std::slice::from_ref(&j), BatchChoice::Fixed)
            .unwrap()[0];
        assert_eq!(fixed.rate.eval(1), 1000.0);
        assert!(fixed.rate.eval(4) > 3000.0);
    }

    #[test]
    fn ranges_parse_and_bad_ones_say_what_is_allowed() {
        assert_eq!(parse_range("256:8192"), Ok((256, 8192)));
        assert_eq!(parse_range("64:64"), Ok((64, 64)));
        for bad in ["", "256", "0:8", "9:8", "a:b", "-1:4", "1:2:3"] {
            let e = parse_range(bad).unwrap_err();
            assert!(e.contains("expected LO:HI"), "{bad}: {e}");
        }
        let o = BatchOptions {
            fixed: 0,
            ..opts(None)
        };
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--fixed-batch"));
        let o = opts(Some(-3.0));
        assert!(format!("{:#}", o.validate().unwrap_err()).contains("noise_scale"));
    }
}
