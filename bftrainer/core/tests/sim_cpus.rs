//! The simulator with CPUs of shared GPU hosts split between jobs (Synergy, issue 34):
//! golden results worked out by hand on one 6-GPU host shared by an image model and a
//! language model.

mod sim_common;

use bftrainer_core::alloc::synergy;
use bftrainer_core::engine::EngineConfig;
use bftrainer_core::sim::cpus::{mixed_profiles, synergy_profile, CpuModel, CpuPolicy};
use bftrainer_core::sim::{simulate, Hooks, Outcome, SimConfig};
use bftrainer_core::trace::jobs::JobRecord;
use sim_common::{job, trace, FillInOrder};
use std::sync::Arc;

const SLOTS: [&str; 6] = ["h/gpu0", "h/gpu1", "h/gpu2", "h/gpu3", "h/gpu4", "h/gpu5"];

/// Two jobs of 1..3 GPUs at 100 samples/s per GPU, each 3,600 s of work on 3 GPUs at
/// the file's rate: job 0 has Synergy's ResNet-18 profile (profile 0), job 1 its
/// Transformer profile (profile 1).
fn jobs() -> Vec<JobRecord> {
    ["img", "lang"]
        .iter()
        .map(|n| {
            job(
                n,
                0,
                1,
                3,
                0.0,
                0.0,
                300.0 * 3600.0,
                &[(1, 100.0), (3, 300.0)],
            )
        })
        .collect()
}

fn run(policy: Option<CpuPolicy>, profiles: Vec<synergy::Sensitivity>) -> Outcome {
    let tr = trace(&SLOTS, &[true; 6], &[], 20_000);
    let cfg = SimConfig {
        engine: EngineConfig {
            max_jobs: 2,
            ..EngineConfig::default()
        },
        cpus: policy.map(|policy| {
            Arc::new(CpuModel {
                policy,
                // 3 CPUs per GPU, Synergy's servers' ratio: the file's rates hold there.
                cpus_per_host: 18,
                profiles,
            })
        }),
        ..SimConfig::default()
    };
    let (mut c, mut p) = (|| 0.0, |_f: f64| {});
    let mut hooks = Hooks {
        clock: &mut c,
        progress: &mut p,
    };
    simulate(&tr, &jobs(), FillInOrder, &cfg, &mut hooks).unwrap()
}

fn jct(out: &Outcome, j: usize) -> f64 {
    out.report.jobs[j].jct_s.expect("completed")
}

/// GPU-proportional: 9 CPUs each, 3 per GPU, the file's rate: both done at 3,600 s, as
/// without the CPU model. By sensitivity: the language model keeps its request (1 CPU
/// per GPU, all it gains from), the image model gets the other 15 (5 per GPU) and
/// finishes at 3,600 s / (f(5) / f(3)); then the language model alone is unchanged.
#[test]
fn the_image_model_gets_the_cpus_the_language_model_does_not_use() {
    let none = run(None, Vec::new());
    let prop = run(Some(CpuPolicy::Proportional), mixed_profiles());
    let sens = run(Some(CpuPolicy::Sensitivity), mixed_profiles());
    for out in [&none, &prop] {
        assert!((jct(out, 0) - 3600.0).abs() < 1e-6, "{}", jct(out, 0));
        assert!((jct(out, 1) - 3600.0).abs() < 1e-6, "{}", jct(out, 1));
    }
    let img = synergy_profile(0);
    let gain = synergy::eval(&img.cpu, 5.0) / synergy::eval(&img.cpu, 3.0);
    assert!(gain > 1.4, "{gain}");
    assert!(
        (jct(&sens, 0) - 3600.0 / gain).abs() < 1e-6,
        "{} vs {}",
        jct(&sens, 0),
        3600.0 / gain
    );
    assert!((jct(&sens, 1) - 3600.0).abs() < 1e-6, "{}", jct(&sens, 1));
    let mean = |o: &Outcome| o.report.jct_mean_s.unwrap();
    assert!(mean(&sens) < mean(&prop) * 0.9);
    // The same work in both; the image model's GPUs are free 1,200 s sooner.
    assert!((sens.report.samples - prop.report.samples).abs() < 1e-3);
}

/// With the same profile for both jobs the two rules give the same split, and the
/// replay is the proportional one to the last digit.
#[test]
fn equal_profiles_replay_as_proportional() {
    let same = vec![synergy_profile(0)];
    let prop = run(Some(CpuPolicy::Proportional), same.clone());
    let sens = run(Some(CpuPolicy::Sensitivity), same);
    assert_eq!(jct(&prop, 0), jct(&sens, 0));
    assert_eq!(jct(&prop, 1), jct(&sens, 1));
    assert_eq!(prop.report.samples, sens.report.samples);
}

/// Hosts need a CPU per GPU slot at least; the model is refused otherwise.
#[test]
fn too_few_cpus_per_host_are_refused() {
    let tr = trace(&SLOTS, &[true; 6], &[], 100);
    let cfg = SimConfig {
        cpus: Some(Arc::new(CpuModel {
            policy: CpuPolicy::Sensitivity,
            cpus_per_host: 5,
            profiles: mixed_profiles(),
        })),
        ..SimConfig::default()
    };
    let (mut c, mut p) = (|| 0.0, |_f: f64| {});
    let mut hooks = Hooks {
        clock: &mut c,
        progress: &mut p,
    };
    let Err(e) = simulate(&tr, &jobs(), FillInOrder, &cfg, &mut hooks) else {
        panic!("5 CPUs for 6 GPU slots was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("5 CPUs per host for hosts of 6 GPU slots"),
        "{e}"
    );
}
