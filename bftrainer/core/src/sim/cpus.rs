//! CPUs per job on shared GPU hosts in a replay (Synergy, issue 34): the jobs that hold
//! GPU slots of one host split its free CPUs by `alloc::synergy`, GPU-proportionally or
//! by sensitivity, and each job's rate follows its CPU curve.
//!
//! The job file's curve is taken as the job's rate at the reference CPUs per GPU (the
//! host's CPUs over its GPUs: the GPU-proportional share of a full host). On a host
//! where a job holds `g` GPUs and `c` CPUs, its GPUs run at `f(c/g) / f(ref)` of that
//! rate; a job's factor is the GPU-weighted mean over its hosts (work split by speed
//! across replicas, as the rule's objective assumes; a synchronous job without such a
//! split would run at its slowest host's rate).

use crate::alloc::synergy::{self, NodeFree, Observation, Sensitivity, ShareJob};
use crate::error::{Error, Result};

/// How the CPUs of a shared host are split between the jobs holding its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuPolicy {
    /// In proportion to GPUs (`synergy::proportional`): the baseline.
    Proportional,
    /// By each job's CPU curve (`synergy::share_node`).
    Sensitivity,
}

impl std::str::FromStr for CpuPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "proportional" => Ok(Self::Proportional),
            "sensitivity" => Ok(Self::Sensitivity),
            _ => Err(Error::Config(format!(
                "CPU allocation '{s}' is unknown; allowed: proportional, sensitivity"
            ))),
        }
    }
}

/// The CPU model of a replay on GPU slots (`SimConfig::cpus`).
#[derive(Debug, Clone)]
pub struct CpuModel {
    pub policy: CpuPolicy,
    /// CPUs of each host (every host alike).
    pub cpus_per_host: u32,
    /// Job record `i` (file order) has profile `i mod len` (at least one).
    pub profiles: Vec<Sensitivity>,
}

/// Normalised throughput per GPU at 1, 2, 3, 4, 5, 6, 9, 12 and 24 CPUs per GPU (1.0 at
/// 3, the GPU-proportional share of Synergy's 8-GPU, 24-CPU servers), as Synergy's
/// authors measured them: the `tput` tables of their artifact's simulator
/// (github.com/msr-fiddle/synergy, `simulator/models/*.py`, rows `cpu_val` of
/// `simulator/jobs/job.py`), at the largest memory column (memory ample). `None`: not
/// measured there (their language models stop at 9).
pub const SYNERGY_PROFILES: [(&str, &str, [Option<f64>; 9]); 10] = {
    const fn s(v: [f64; 9]) -> [Option<f64>; 9] {
        [
            Some(v[0]),
            Some(v[1]),
            Some(v[2]),
            Some(v[3]),
            Some(v[4]),
            Some(v[5]),
            Some(v[6]),
            Some(v[7]),
            Some(v[8]),
        ]
    }
    const fn upto9(v: [f64; 7]) -> [Option<f64>; 9] {
        [
            Some(v[0]),
            Some(v[1]),
            Some(v[2]),
            Some(v[3]),
            Some(v[4]),
            Some(v[5]),
            Some(v[6]),
            None,
            None,
        ]
    }
    [
        (
            "res18",
            "image",
            s([0.37, 0.72, 1.0, 1.3, 1.53, 1.75, 2.4, 2.4, 2.4]),
        ),
        (
            "transformer",
            "language",
            upto9([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ),
        (
            "res50",
            "image",
            s([0.4, 0.74, 1.0, 1.15, 1.15, 1.15, 1.15, 1.15, 1.15]),
        ),
        (
            "lstm",
            "language",
            upto9([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ),
        (
            "alexnet",
            "image",
            s([0.3, 0.66, 1.0, 1.25, 1.53, 1.75, 2.0, 2.94, 2.94]),
        ),
        (
            "m5",
            "speech",
            s([0.3, 0.66, 1.0, 1.2, 1.4, 2.5, 2.5, 2.5, 2.5]),
        ),
        (
            "gnmt",
            "language",
            upto9([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ),
        (
            "mobilenet",
            "image",
            s([0.37, 0.72, 1.0, 1.3, 1.49, 1.55, 1.55, 1.55, 1.55]),
        ),
        (
            "deepspeech",
            "speech",
            upto9([0.3, 0.66, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ),
        (
            "shufflenet",
            "image",
            s([0.3, 0.66, 1.0, 1.25, 1.53, 1.75, 2.0, 2.89, 2.89]),
        ),
    ]
};

/// CPUs per GPU of the rows of [`SYNERGY_PROFILES`].
pub const SYNERGY_CPUS: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0, 12.0, 24.0];

/// Profile `k` of [`SYNERGY_PROFILES`] as a curve: its points fitted by
/// `synergy::fit` (nondecreasing and concave, the engine's own fit of measurements; the
/// measured points are not all concave, and the fit lies on or above each of them).
pub fn synergy_profile(k: usize) -> Sensitivity {
    let (_, _, pts) = SYNERGY_PROFILES[k % SYNERGY_PROFILES.len()];
    let obs: Vec<Observation> = SYNERGY_CPUS
        .iter()
        .zip(pts)
        .filter_map(|(&c, r)| {
            r.map(|rate| Observation {
                cpus_per_gpu: c,
                mem_mib_per_gpu: 1.0,
                rate,
            })
        })
        .collect();
    synergy::fit(&obs).expect("the built-in profiles are valid measurements")
}

/// The mixed workload's profiles, [`SYNERGY_PROFILES`] in order: with
/// [`CpuModel::profiles`]' rule, job `i` of the file gets profile `i mod 10`, so 5 image,
/// 2 speech and 3 language models in turn.
pub fn mixed_profiles() -> Vec<Sensitivity> {
    (0..SYNERGY_PROFILES.len()).map(synergy_profile).collect()
}

/// One host's GPUs held by jobs, for [`split_host`].
pub struct HostJob<'a> {
    pub gpus: u32,
    pub profile: &'a Sensitivity,
}

/// The CPU factor of each job on one host (its rate per GPU there over its rate per GPU
/// at `ref_per_gpu`), with `free_cpus` split by `policy`. Every job gets at least 1 CPU
/// per GPU (its request): `free_cpus` must be at least the GPUs held.
pub fn split_host(
    policy: CpuPolicy,
    free_cpus: u32,
    host_gpus: u32,
    ref_per_gpu: f64,
    jobs: &[HostJob<'_>],
) -> Result<Vec<f64>> {
    let share: Vec<ShareJob> = jobs
        .iter()
        .map(|j| ShareJob {
            gpus: j.gpus,
            tasks: j.gpus,
            cpus_per_task: 1,
            mem_mib_per_task: 0,
            sensitivity: j.profile.clone(),
        })
        .collect();
    let node = NodeFree {
        cpus: free_cpus,
        mem_mib: 0,
        gpus: host_gpus,
    };
    let split = match policy {
        CpuPolicy::Proportional => synergy::proportional(&node, &share),
        CpuPolicy::Sensitivity => synergy::share_node(&node, &share),
    }
    .map_err(|e| Error::Config(format!("CPU split of a host: {e}")))?;
    Ok(jobs
        .iter()
        .zip(&split.shares)
        .map(|(j, s)| {
            let g = f64::from(j.gpus);
            let at_ref = synergy::eval(&j.profile.cpu, ref_per_gpu);
            if at_ref > 0.0 {
                synergy::eval(&j.profile.cpu, f64::from(s.cpus) / g) / at_ref
            } else {
                1.0
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_fit_the_measurements_and_differ_by_kind() {
        for (k, &(name, _, pts)) in SYNERGY_PROFILES.iter().enumerate() {
            let p = synergy_profile(k);
            for (&c, r) in SYNERGY_CPUS.iter().zip(pts) {
                if let Some(r) = r {
                    let f = synergy::eval(&p.cpu, c);
                    // The concave fit lies on or above each point: within 20% (AlexNet and
                    // ShuffleNet at 9 CPUs, 2.0 measured, jump to 2.9 at 12), but for M5,
                    // whose rate jumps from 1.4 at 5 CPUs to 2.5 at 6 (the majorant
                    // lifts the points below: 2.08 at 5 CPUs against 1.4 measured).
                    let slack = if name == "m5" { 1.5 } else { 1.2 };
                    assert!(
                        f >= r - 1e-9 && f <= r * slack + 1e-9,
                        "{name} at {c}: {f} vs {r}"
                    );
                }
            }
        }
        // An image model gains from CPUs past 3 per GPU; a language model does not.
        let res18 = synergy_profile(0);
        let transformer = synergy_profile(1);
        assert!(synergy::eval(&res18.cpu, 9.0) > 2.0 * synergy::eval(&res18.cpu, 3.0));
        assert_eq!(
            synergy::eval(&transformer.cpu, 1.0),
            synergy::eval(&transformer.cpu, 9.0)
        );
    }

    #[test]
    fn a_shared_host_gives_the_image_model_the_cpus_the_language_model_does_not_use() {
        let (img, lang) = (synergy_profile(0), synergy_profile(1));
        let jobs = [
            HostJob {
                gpus: 3,
                profile: &img,
            },
            HostJob {
                gpus: 3,
                profile: &lang,
            },
        ];
        // 6 GPUs, 18 CPUs: 3 per GPU, Synergy's servers' ratio.
        let p = split_host(CpuPolicy::Proportional, 18, 6, 3.0, &jobs).unwrap();
        assert_eq!(p, vec![1.0, 1.0]);
        let s = split_host(CpuPolicy::Sensitivity, 18, 6, 3.0, &jobs).unwrap();
        // The language model keeps 1 CPU per GPU (its request, all it needs); the image
        // model gets 15 CPUs, 5 per GPU.
        assert_eq!(s[1], 1.0);
        let want = synergy::eval(&img.cpu, 5.0) / synergy::eval(&img.cpu, 3.0);
        assert!((s[0] - want).abs() < 1e-9, "{s:?}");
        assert!(s[0] > 1.5, "{s:?}");
    }

    #[test]
    fn policy_names_parse_and_others_are_refused() {
        assert_eq!(
            "sensitivity".parse::<CpuPolicy>().unwrap(),
            CpuPolicy::Sensitivity
        );
        let e = "greedy".parse::<CpuPolicy>().unwrap_err().to_string();
        assert!(e.contains("allowed: proportional, sensitivity"), "{e}");
    }
}
