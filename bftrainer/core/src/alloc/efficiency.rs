//! Batch size as a decision: turns a job's measured rate per node count at one global
//! batch, and the global batch range it allows, into the allocator's `batch_curves`.
//!
//! # The model and where it comes from
//!
//! Effective Elastic Scaling (Saxena, Jayaram, Basu, Sabharwal, Verma, MASCOTS 2020,
//! arXiv 2006.13878) makes the global batch a decision taken with the resources. It rests
//! on two statements, which this module turns into numbers:
//!
//! - **Statistical efficiency.** "DL jobs can be run with a range of batch sizes without
//!   affecting their final accuracy" (the paper's abstract): inside the range the job
//!   declares, a sample trained at any batch is worth a sample trained at the base batch.
//!   That is [`EfficiencyModel::noise_scale`] = `None`, the default. As far as its
//!   abstract shows (its body was not at hand), the paper does not build on the gradient
//!   noise scale, nor on Pollux/AdaptDL (later: arXiv August 2020, OSDI 2021). Because its premise is optimistic for batches far above a model's
//!   critical batch, the model can instead weigh each sample by the statistical
//!   efficiency of the gradient noise scale B_noise of McCandlish, Kaplan, Amodei et al.,
//!   "An Empirical Model of Large-Batch Training" (arXiv 1812.06162, 2018): reaching a
//!   given loss takes `E_min * (1 + B / B_noise)` samples at batch B, so relative to the
//!   base batch B0 a sample at B is worth `(B_noise + B0) / (B_noise + B)`. Pollux (Qiao
//!   et al., OSDI 2021) uses the same formula as its EFFICIENCY term. Set `noise_scale`.
//! - **Throughput.** The paper chooses the batch by each job's scaling efficiency over
//!   the resources, which it profiles per job; its abstract gives no closed form, so the
//!   form here is ours, stated so that it can be checked: a step on n nodes costs
//!   per-node compute proportional to the per-node batch B/n, plus a part that does not
//!   depend on the batch (synchronisation, per-step overhead), `t(n, B) = c * B / n +
//!   s(n)`. That is Pollux's iteration-time model (T_grad linear in the per-replica
//!   batch, T_sync by replica count) with its overlap exponent γ = 1. A larger batch
//!   amortises s(n), which is why it scales better. Both parts are read off the one
//!   measured curve r0 at the base batch B0 (no other measurement is needed): one node
//!   is taken not to synchronise, so `c = 1 / r0(1)` seconds per sample, and
//!   `s(n) = B0 / r0(n) - c * B0 / n` is what the measured step time has beyond compute.
//!   Where a curve scales better than linearly (s would be negative) the compute part
//!   takes the whole step: `c = n / r0(n)`, `s(n) = 0`. Throughput is `B / t(n, B)`
//!   samples/s; at B0 it is r0(n) exactly, and on one node the batch changes nothing.
//!
//! The allocator maximises **goodput**, throughput times statistical efficiency, in
//! base-batch samples per second: with the default (Saxena's) assumption, throughput
//! itself. Then the best batch is the largest one allowed (more samples per
//! synchronisation), and how much it gains grows with the node count; with a noise scale,
//! the best batch lies inside the range and grows with the node count (tested below).
//!
//! ```
//! use bftrainer_core::alloc::{Curve, EfficiencyModel};
//!
//! // 1,000 samples/s on one node, 3,200 on four, at a global batch of 256.
//! let rate = Curve::new(vec![(1, 1000.0), (4, 3200.0)]);
//! let model = EfficiencyModel::new(256);
//! let curves = model.batch_curves(&rate, (256, 1024), 4)?;
//! assert_eq!(curves.iter().map(|b| b.batch_size).collect::<Vec<_>>(), vec![256, 512, 1024]);
//! assert_eq!(curves[0].curve.eval(4), 3200.0); // the base batch is the measured curve
//! assert!(curves[2].curve.eval(4) > 3200.0); // a larger batch syncs less often
//! # Ok::<(), bftrainer_core::alloc::AllocError>(())
//! ```

use super::{invalid, AllocError, BatchCurve, Curve};

/// Node counts up to this get a point each in the curves [`EfficiencyModel::batch_curves`]
/// makes; above it points are spaced geometrically ([`GEOMETRIC_STEP`]), so a job allowed
/// 10,000 nodes costs the solver ~350 points per batch, not 10,000.
pub const DENSE_NODES: u32 = 128;
/// Ratio between successive node counts past [`DENSE_NODES`]; the curves are linear in
/// between, within 0.2% of the model for the measured Summit curves (tested).
pub const GEOMETRIC_STEP: f64 = 1.02;

/// How a job's rate depends on its global batch; see the module's documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct EfficiencyModel {
    /// The global batch (samples per step, all nodes together) at which the job's rate
    /// curve was measured; its goodput curve is the measured one.
    pub base_batch: u32,
    /// The gradient noise scale B_noise in samples (McCandlish et al. 2018). `None`:
    /// Saxena et al.'s assumption, every batch in the range as sample-efficient as the
    /// base one.
    pub noise_scale: Option<f64>,
}

impl EfficiencyModel {
    /// Saxena et al.'s model for a rate measured at global batch `base_batch`.
    pub fn new(base_batch: u32) -> Self {
        EfficiencyModel {
            base_batch,
            noise_scale: None,
        }
    }

    /// The same, each sample weighed by the statistical efficiency of noise scale
    /// `b_noise` (samples).
    pub fn with_noise_scale(self, b_noise: f64) -> Self {
        EfficiencyModel {
            noise_scale: Some(b_noise),
            ..self
        }
    }

    /// Check the parameters; the error names the field and the allowed values.
    pub fn validate(&self) -> Result<(), AllocError> {
        if self.base_batch == 0 {
            return Err(invalid("efficiency.base_batch", "is 0; must be >= 1"));
        }
        if let Some(b) = self.noise_scale {
            if !b.is_finite() || b <= 0.0 {
                return Err(invalid(
                    "efficiency.noise_scale",
                    format!("is {b}; must be a finite number of samples > 0"),
                ));
            }
        }
        Ok(())
    }

    /// Statistical efficiency of global batch `batch` relative to the base batch: what a
    /// sample trained at `batch` is worth in samples at the base batch. 1 at the base
    /// batch, and everywhere without a noise scale.
    pub fn efficiency(&self, batch: u32) -> f64 {
        match self.noise_scale {
            None => 1.0,
            Some(bn) => (bn + f64::from(self.base_batch)) / (bn + f64::from(batch)),
        }
    }

    /// Samples per second on `n` nodes at global batch `batch`, from the rate curve
    /// measured at the base batch (0 where that rate is 0, and at n = 0).
    pub fn throughput(&self, rate_at_base: &Curve, n: u32, batch: u32) -> f64 {
        let r0 = rate_at_base.eval(n);
        if n == 0 || r0 <= 0.0 || batch == 0 {
            return 0.0;
        }
        let r1 = rate_at_base.eval(1);
        let (nf, b0, b) = (f64::from(n), f64::from(self.base_batch), f64::from(batch));
        let step0 = b0 / r0;
        // Seconds of compute per sample on one node: the one-node step, which has no
        // synchronisation, unless this node count scales better than that allows.
        let c = if r1 > 0.0 {
            (1.0 / r1).min(nf / r0)
        } else {
            nf / r0
        };
        let sync = (step0 - c * b0 / nf).max(0.0);
        b / (c * b / nf + sync)
    }

    /// Throughput times statistical efficiency: base-batch samples per second, the
    /// quantity the allocator maximises and a job's progress is counted in.
    pub fn goodput(&self, rate_at_base: &Curve, n: u32, batch: u32) -> f64 {
        self.throughput(rate_at_base, n, batch) * self.efficiency(batch)
    }

    /// The global batches tried inside `range` (inclusive): its two ends, the powers of
    /// two strictly between them, and the base batch when it lies inside. Ascending.
    pub fn candidate_batches(&self, range: (u32, u32)) -> Result<Vec<u32>, AllocError> {
        check_range(range)?;
        let (lo, hi) = range;
        let mut out = vec![lo, hi];
        let mut p = lo.checked_next_power_of_two();
        while let Some(x) = p.filter(|&x| x < hi) {
            out.push(x);
            p = x.checked_mul(2);
        }
        if (lo..=hi).contains(&self.base_batch) {
            out.push(self.base_batch);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The allocator's `batch_curves` for a job allowed global batches in `range` and at
    /// most `max_nodes` nodes: one goodput curve per [`Self::candidate_batches`].
    pub fn batch_curves(
        &self,
        rate_at_base: &Curve,
        range: (u32, u32),
        max_nodes: u32,
    ) -> Result<Vec<BatchCurve>, AllocError> {
        let batches = self.candidate_batches(range)?;
        self.batch_curves_for(rate_at_base, &batches, max_nodes)
    }

    /// The same for the given global batches (each >= 1, no repeats); e.g. one batch, for
    /// a job whose batch is fixed.
    pub fn batch_curves_for(
        &self,
        rate_at_base: &Curve,
        batches: &[u32],
        max_nodes: u32,
    ) -> Result<Vec<BatchCurve>, AllocError> {
        self.validate()?;
        if rate_at_base.points.first().map(|p| p.0) != Some(1) {
            return Err(invalid(
                "efficiency.rate_at_base",
                "curve must start at 1 node; give at least the point [1, value]",
            ));
        }
        if max_nodes == 0 {
            return Err(invalid("efficiency.max_nodes", "is 0; must be >= 1"));
        }
        for (i, &b) in batches.iter().enumerate() {
            if b == 0 {
                return Err(invalid(
                    format!("efficiency.batches[{i}]"),
                    "is 0; must be >= 1",
                ));
            }
            if batches[..i].contains(&b) {
                return Err(invalid(
                    format!("efficiency.batches[{i}]"),
                    format!("batch size {b} appears twice"),
                ));
            }
        }
        let nodes = node_points(rate_at_base, max_nodes);
        Ok(batches
            .iter()
            .map(|&b| BatchCurve {
                batch_size: b,
                curve: Curve::new(
                    nodes
                        .iter()
                        .map(|&n| (n, self.goodput(rate_at_base, n, b)))
                        .collect(),
                ),
            })
            .collect())
    }
}

fn check_range((lo, hi): (u32, u32)) -> Result<(), AllocError> {
    if lo == 0 || lo > hi {
        return Err(invalid(
            "efficiency.range",
            format!("is {lo}:{hi}; need 1 <= low <= high"),
        ));
    }
    Ok(())
}

/// Node counts at which the curves get a point: every count up to [`DENSE_NODES`], then a
/// geometric grid, plus the measured curve's own points, up to `max_nodes`.
fn node_points(rate: &Curve, max_nodes: u32) -> Vec<u32> {
    let mut out: Vec<u32> = (1..=max_nodes.min(DENSE_NODES)).collect();
    let mut x = f64::from(DENSE_NODES);
    while x < f64::from(max_nodes) {
        x = (x * GEOMETRIC_STEP).max(x + 1.0);
        out.push((x as u32).min(max_nodes));
    }
    out.extend(rate.points.iter().map(|p| p.0).filter(|&n| n <= max_nodes));
    out.push(max_nodes);
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // resnet18 on Summit at 1..64 nodes (alloc::gen::MODELS), at its measured batch.
    fn resnet() -> Curve {
        let r = super::super::gen::MODELS[2].3;
        Curve::new(
            [1u32, 2, 4, 8, 16, 32, 64]
                .iter()
                .zip(r)
                .map(|(&n, y)| (n, y))
                .collect(),
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn base_batch_gives_the_measured_curve_at_every_node_count() {
        let rate = resnet();
        for m in [
            EfficiencyModel::new(256),
            EfficiencyModel::new(256).with_noise_scale(4096.0),
        ] {
            let curves = m.batch_curves(&rate, (64, 8192), 100).unwrap();
            let base = curves.iter().find(|b| b.batch_size == 256).unwrap();
            for n in 1..=100 {
                assert!(
                    close(base.curve.eval(n), rate.eval(n)),
                    "n={n}: {} vs {}",
                    base.curve.eval(n),
                    rate.eval(n)
                );
            }
        }
    }

    #[test]
    fn superlinear_curves_still_match_at_the_base_batch() {
        // 2 nodes more than twice as fast as one (cache effects): no negative sync.
        let rate = Curve::new(vec![(1, 100.0), (2, 250.0), (4, 300.0)]);
        let m = EfficiencyModel::new(128);
        for n in 1..=6 {
            assert!(close(m.throughput(&rate, n, 128), rate.eval(n)));
            for b in [64, 256, 1024] {
                let t = m.throughput(&rate, n, b);
                assert!(t.is_finite() && t > 0.0, "n={n} b={b}: {t}");
            }
        }
    }

    #[test]
    fn throughput_grows_with_the_batch_and_saturates_at_pure_compute() {
        let rate = resnet();
        let m = EfficiencyModel::new(256);
        for n in [1, 2, 8, 33, 64, 200] {
            let mut prev = 0.0;
            for b in [32, 64, 128, 256, 512, 1024, 4096, 1 << 20] {
                let t = m.throughput(&rate, n, b);
                assert!(t >= prev * (1.0 - 1e-12), "n={n} b={b}: {t} < {prev}");
                // Never faster than n nodes computing without synchronising.
                assert!(t <= f64::from(n) * rate.eval(1) * (1.0 + 1e-9) || t <= rate.eval(n));
                prev = t;
            }
        }
        // One node has nothing to synchronise: the batch does not change its speed.
        assert!(close(m.throughput(&rate, 1, 4096), rate.eval(1)));
    }

    #[test]
    fn the_gain_of_a_larger_batch_grows_with_the_node_count() {
        let rate = resnet();
        let m = EfficiencyModel::new(256);
        let gain = |n| m.throughput(&rate, n, 2048) / rate.eval(n);
        assert!(close(gain(1), 1.0));
        assert!(gain(8) > 1.0);
        assert!(gain(64) > gain(8), "{} vs {}", gain(64), gain(8));
    }

    #[test]
    fn efficiency_follows_the_noise_scale_formula_and_is_one_without_it() {
        let m = EfficiencyModel::new(256);
        assert_eq!(m.efficiency(1 << 20), 1.0);
        let m = m.with_noise_scale(1000.0);
        assert_eq!(m.efficiency(256), 1.0);
        assert!(close(m.efficiency(1000), 1256.0 / 2000.0));
        assert!(m.efficiency(128) > 1.0);
        let mut prev = f64::INFINITY;
        for b in [1, 64, 256, 1024, 65536] {
            let e = m.efficiency(b);
            assert!(e < prev && e > 0.0);
            prev = e;
        }
    }

    #[test]
    fn with_a_noise_scale_the_best_batch_is_interior_and_grows_with_nodes() {
        let rate = resnet();
        let m = EfficiencyModel::new(256).with_noise_scale(2048.0);
        let batches = m.candidate_batches((32, 65536)).unwrap();
        let best = |n| {
            *batches
                .iter()
                .max_by(|&&a, &&b| m.goodput(&rate, n, a).total_cmp(&m.goodput(&rate, n, b)))
                .unwrap()
        };
        assert_eq!(
            best(1),
            32,
            "one node: no sync to amortise, smallest batch wins"
        );
        assert!(best(64) > best(4), "{} vs {}", best(64), best(4));
        assert!(best(64) < 65536);
        // Without a noise scale the largest batch is best wherever there is sync.
        let s = EfficiencyModel::new(256);
        for n in [2, 16, 64] {
            let g: Vec<f64> = batches.iter().map(|&b| s.goodput(&rate, n, b)).collect();
            assert!(g.windows(2).all(|w| w[1] >= w[0]), "n={n}: {g:?}");
        }
    }

    #[test]
    fn curves_are_valid_solver_input_and_bounded() {
        let rate = resnet();
        let m = EfficiencyModel::new(512).with_noise_scale(3000.0);
        for max in [1, 7, 64, 129, 10_000] {
            let curves = m.batch_curves(&rate, (100, 3000), max).unwrap();
            let bs: Vec<u32> = curves.iter().map(|b| b.batch_size).collect();
            assert_eq!(bs, vec![100, 128, 256, 512, 1024, 2048, 3000]);
            for bc in &curves {
                let p = &bc.curve.points;
                assert_eq!(p[0].0, 1);
                assert_eq!(p.last().unwrap().0, max);
                assert!(p.windows(2).all(|w| w[1].0 > w[0].0));
                assert!(p.iter().all(|&(_, y)| y.is_finite() && y >= 0.0));
            }
            if max == 10_000 {
                assert!(curves[0].curve.points.len() < 400);
            }
            let job = super::super::JobInput {
                batch_curves: curves,
                curve: Curve::default(),
                ..super::super::JobInput::new("j", 1, max, 1.0, 1.0, Curve::default())
            };
            let inst = super::super::Instance {
                t_fwd_s: 10.0,
                n_nodes: max,
                reclaim_in_s: Vec::new(),
                host_of: Vec::new(),
                jobs: vec![job],
            };
            inst.validate(super::super::Objective::Bftrainer).unwrap();
        }
    }

    #[test]
    fn geometric_points_interpolate_the_model_closely() {
        let rate = resnet();
        let m = EfficiencyModel::new(256);
        let curves = m.batch_curves_for(&rate, &[4096], 5000).unwrap();
        for n in (129..5000).step_by(37) {
            let (got, want) = (curves[0].curve.eval(n), m.goodput(&rate, n, 4096));
            assert!((got - want).abs() <= 2e-3 * want, "n={n}: {got} vs {want}");
        }
    }

    #[test]
    fn bad_parameters_are_refused_with_the_field_named() {
        let rate = resnet();
        let err = |r: Result<Vec<BatchCurve>, AllocError>| r.unwrap_err().to_string();
        let m = EfficiencyModel::new(256);
        assert!(err(m.batch_curves(&rate, (0, 8), 4)).contains("efficiency.range"));
        assert!(err(m.batch_curves(&rate, (9, 8), 4)).contains("1 <= low <= high"));
        assert!(err(m.batch_curves(&rate, (8, 8), 0)).contains("efficiency.max_nodes"));
        assert!(err(EfficiencyModel::new(0).batch_curves(&rate, (8, 8), 4)).contains("base_batch"));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let m = EfficiencyModel::new(256).with_noise_scale(bad);
            assert!(err(m.batch_curves(&rate, (8, 8), 4)).contains("noise_scale"));
        }
        assert!(err(m.batch_curves_for(&rate, &[8, 8], 4)).contains("appears twice"));
        assert!(err(m.batch_curves_for(&rate, &[0], 4)).contains("batches[0]"));
        let empty = Curve::default();
        assert!(err(m.batch_curves(&empty, (8, 8), 4)).contains("rate_at_base"));
    }

    #[test]
    fn candidates_cover_the_range_ends_powers_of_two_and_the_base() {
        let m = EfficiencyModel::new(300);
        assert_eq!(m.candidate_batches((256, 256)).unwrap(), vec![256]);
        assert_eq!(
            m.candidate_batches((200, 1000)).unwrap(),
            vec![200, 256, 300, 512, 1000]
        );
        assert_eq!(m.candidate_batches((1, 4)).unwrap(), vec![1, 2, 4]);
        let top = m.candidate_batches((u32::MAX - 1, u32::MAX)).unwrap();
        assert_eq!(top, vec![u32::MAX - 1, u32::MAX]);
    }
}
