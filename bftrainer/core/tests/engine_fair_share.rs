//! Fair shares (docs/design.md, "Fair shares"): a job's declarations (curve, rescale
//! costs) weigh only against its own user's other options; each user's share of the
//! lent nodes is weighted max-min fair (Slurm's fairshare); measured rates replace
//! declared ones.

mod engine_common;

use bftrainer_core::alloc::Curve;
use bftrainer_core::engine::{
    Action, ElasticSpec, Engine, EngineConfig, Event, Exact, JobId, JobStatus,
};
use proptest::prelude::*;

fn spec(name: &str, user: u32, min: u32, max: u32) -> ElasticSpec {
    // Linear up to 100 nodes (engine_common's stops at 8).
    ElasticSpec {
        user: Some(user),
        objective: Curve::new(vec![(1, 1.0), (100, 100.0)]),
        ..engine_common::spec(name, min, max, 1.0)
    }
}

fn engine(cfg: EngineConfig, nodes: u32) -> Engine<Exact> {
    let mut e = Engine::new(cfg, Exact::default());
    engine_common::idle_nodes(&mut e, nodes);
    e
}

fn submit(e: &mut Engine<Exact>, s: ElasticSpec, t: f64) -> JobId {
    let job = e.n_jobs() as JobId;
    e.on_event(&Event::JobSubmitted { job, spec: s }, t)
        .unwrap();
    job
}

fn tick(e: &mut Engine<Exact>, t: f64) -> Vec<Action> {
    e.on_event(&Event::Tick, t).unwrap()
}

fn held(e: &Engine<Exact>, j: JobId) -> usize {
    e.job_nodes(j).len()
}

/// Mallory's job declares the largest curve there is and free rescales against Alice's
/// running job: Alice keeps her half of the pool, and is never requeued.
#[test]
fn declarations_cannot_take_nodes_from_another_users_job() {
    let mut e = engine(EngineConfig::default(), 8);
    let alice = submit(
        &mut e,
        ElasticSpec {
            scale_up_s: 30.0,
            scale_down_s: 10.0,
            ..spec("alice", 1, 1, 8)
        },
        0.0,
    );
    tick(&mut e, 0.0);
    assert_eq!(held(&e, alice), 8);
    let mallory = submit(
        &mut e,
        ElasticSpec {
            scale_up_s: 0.0,
            scale_down_s: 0.0,
            objective: Curve::new(vec![(1, 1e12), (8, 8e12)]),
            ..spec("mallory", 2, 1, 8)
        },
        1.0,
    );
    let actions = tick(&mut e, 1.0);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Requeue { job, .. } if *job == alice)),
        "{actions:?}"
    );
    assert_eq!(e.job_status(alice), JobStatus::Active);
    assert!(held(&e, alice) >= 4, "alice holds {}", held(&e, alice));
    assert_eq!(held(&e, mallory), 4);
    // Later decisions (Mallory's curve unchanged) do not move the split either.
    for t in 2..6 {
        e.on_event(
            &Event::NodeIdle {
                node: 0,
                reclaim_at: None,
            },
            f64::from(t),
        )
        .unwrap();
        tick(&mut e, f64::from(t));
        assert!(held(&e, alice) >= 4);
    }
}

/// The same instance without fair shares (bftrainerd before them): Mallory's
/// declarations take every node and Alice's running job is requeued. This is what the
/// test above guards against.
#[test]
fn without_fair_shares_declarations_take_the_pool() {
    let cfg = EngineConfig {
        fair_share: false,
        ..EngineConfig::default()
    };
    let mut e = engine(cfg, 8);
    let alice = submit(
        &mut e,
        ElasticSpec {
            scale_up_s: 30.0,
            scale_down_s: 10.0,
            ..spec("alice", 1, 1, 8)
        },
        0.0,
    );
    tick(&mut e, 0.0);
    submit(
        &mut e,
        ElasticSpec {
            scale_up_s: 0.0,
            scale_down_s: 0.0,
            objective: Curve::new(vec![(1, 1e12), (8, 8e12)]),
            ..spec("mallory", 2, 1, 8)
        },
        1.0,
    );
    let actions = tick(&mut e, 1.0);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Requeue { job, .. } if *job == alice)));
}

#[test]
fn equal_users_get_equal_shares() {
    let mut e = engine(EngineConfig::default(), 12);
    let jobs: Vec<JobId> = (0..3)
        .map(|u| submit(&mut e, spec(&format!("j{u}"), u, 1, 100), 0.0))
        .collect();
    tick(&mut e, 0.0);
    for &j in &jobs {
        assert_eq!(held(&e, j), 4);
    }
    // One user with two jobs still gets one user's share: 12 nodes over 3 users.
    let extra = submit(&mut e, spec("j0b", 0, 1, 100), 1.0);
    e.on_event(
        &Event::NodeIdle {
            node: 0,
            reclaim_at: None,
        },
        1.0,
    )
    .unwrap();
    tick(&mut e, 1.0);
    assert_eq!(held(&e, jobs[0]) + held(&e, extra), 4);
    assert_eq!(held(&e, jobs[1]), 4);
    assert_eq!(held(&e, jobs[2]), 4);
}

#[test]
fn fairshare_weights_shift_shares() {
    let mut e = engine(EngineConfig::default(), 12);
    let a = submit(&mut e, spec("a", 1, 1, 100), 0.0);
    let b = submit(&mut e, spec("b", 2, 1, 100), 0.0);
    e.on_event(
        &Event::UserWeight {
            user: 1,
            weight: 0.75,
        },
        0.0,
    )
    .unwrap();
    e.on_event(
        &Event::UserWeight {
            user: 2,
            weight: 0.25,
        },
        0.0,
    )
    .unwrap();
    tick(&mut e, 0.0);
    assert_eq!((held(&e, a), held(&e, b)), (9, 3));
    // Slurm recomputes fairshare: the shares follow at the next decision.
    e.on_event(
        &Event::UserWeight {
            user: 2,
            weight: 0.75,
        },
        1.0,
    )
    .unwrap();
    tick(&mut e, 1.0);
    assert_eq!((held(&e, a), held(&e, b)), (6, 6));
    // A bad weight is refused with its reason.
    let err = e
        .on_event(
            &Event::UserWeight {
                user: 2,
                weight: f64::NAN,
            },
            2.0,
        )
        .unwrap_err();
    assert!(err.to_string().contains("finite"), "{err}");
}

/// A user's share its jobs cannot use (a minimum bigger than it) goes to the others.
#[test]
fn an_unusable_share_goes_to_the_others() {
    let mut e = engine(EngineConfig::default(), 10);
    let big = submit(&mut e, spec("big", 1, 6, 8), 0.0);
    let small = submit(&mut e, spec("small", 2, 1, 10), 0.0);
    let other = submit(&mut e, spec("other", 3, 1, 10), 0.0);
    tick(&mut e, 0.0);
    // Three users of 10 nodes: 4/3/3 would leave `big` (min 6) out and its 4 idle.
    assert_eq!(held(&e, big), 0);
    assert_eq!(held(&e, small) + held(&e, other), 10);
}

/// Measured rates replace the declared curve: a job that declares super-linear scaling
/// but measures none past one node leaves the nodes to its user's job that scales.
#[test]
fn measured_rates_feed_the_allocator() {
    let run = |measure: bool| {
        let mut e = engine(EngineConfig::default(), 8);
        let flat = submit(
            &mut e,
            ElasticSpec {
                objective: Curve::new(vec![(1, 1.0), (8, 16.0)]),
                ..spec("flat", 1, 1, 8)
            },
            0.0,
        );
        let scales = submit(&mut e, spec("scales", 1, 1, 8), 0.0);
        if measure {
            for (nodes, rate) in [(1, 100.0), (8, 101.0)] {
                e.on_event(
                    &Event::Progress {
                        job: flat,
                        samples_per_s: rate,
                        remaining: None,
                        nodes: Some(nodes),
                    },
                    0.0,
                )
                .unwrap();
            }
        }
        tick(&mut e, 0.0);
        (held(&e, flat), held(&e, scales))
    };
    assert_eq!(run(false), (8, 0));
    assert_eq!(run(true), (1, 7));
}

/// The size of a measurement is the owner's word (bft-run's `nodes=` in the Comment):
/// one outside the job's own range is no measurement, so it neither bends the curve nor
/// grows the job's list of points.
#[test]
fn measured_rates_at_sizes_outside_the_jobs_range_are_ignored() {
    let mut e = engine(EngineConfig::default(), 8);
    let flat = submit(
        &mut e,
        ElasticSpec {
            objective: Curve::new(vec![(1, 1.0), (8, 16.0)]),
            ..spec("flat", 1, 1, 8)
        },
        0.0,
    );
    let scales = submit(&mut e, spec("scales", 1, 1, 8), 0.0);
    // A genuine point at 1 node keeps the declared shape; a claimed flat rate at 9
    // nodes (above the job's max of 8) would flatten the curve at 8 if it were taken.
    for (nodes, rate) in [(1, 100.0), (0, 1.0), (9, 100.5), (u32::MAX, 100.5)] {
        e.on_event(
            &Event::Progress {
                job: flat,
                samples_per_s: rate,
                remaining: None,
                nodes: Some(nodes),
            },
            0.0,
        )
        .unwrap();
    }
    tick(&mut e, 0.0);
    // The declared shape stands (`measured_rates_feed_the_allocator`: a flat curve
    // gives (1, 7)).
    assert_eq!((held(&e, flat), held(&e, scales)), (8, 0));
}

/// Rescale costs below the configured floors count as the floors.
#[test]
fn declared_rescale_costs_have_a_floor() {
    let run = |floor: f64| {
        let mut e = engine(
            EngineConfig {
                min_scale_up_s: floor,
                ..EngineConfig::default()
            },
            4,
        );
        let j = submit(
            &mut e,
            ElasticSpec {
                scale_up_s: 0.0,
                ..spec("j", 1, 1, 4)
            },
            0.0,
        );
        // Admitted on 1 node (3 busy), then 3 more become idle: grow by 3 gains
        // t_fwd (10 s) x 3 at the cost of up x 1 (its normalised rate).
        for n in 1..4 {
            e.on_event(&Event::NodeClaimed { node: n }, 0.0).unwrap();
        }
        tick(&mut e, 0.0);
        for n in 1..4 {
            e.on_event(
                &Event::NodeIdle {
                    node: n,
                    reclaim_at: None,
                },
                1.0,
            )
            .unwrap();
        }
        tick(&mut e, 1.0);
        held(&e, j)
    };
    assert_eq!(run(0.0), 4);
    assert_eq!(run(40.0), 1);
}

/// A measured grow cost (bft-run's, through `Event::RescaleCost`) above the declared
/// cost and the floor counts, up to the config's ceiling; one below them changes
/// nothing. The measurement arrives between two decisions, as it does live.
#[test]
fn measured_rescale_costs_count_above_the_floor_up_to_the_ceiling() {
    let run = |measured: f64, ceiling: f64| {
        let mut e = engine(
            EngineConfig {
                min_scale_up_s: 10.0,
                max_scale_up_s: ceiling,
                ..EngineConfig::default()
            },
            4,
        );
        let j = submit(
            &mut e,
            ElasticSpec {
                scale_up_s: 0.0,
                ..spec("j", 1, 1, 4)
            },
            0.0,
        );
        for n in 1..4 {
            e.on_event(&Event::NodeClaimed { node: n }, 0.0).unwrap();
        }
        tick(&mut e, 0.0);
        e.on_event(
            &Event::RescaleCost {
                job: j,
                up_s: measured,
                down_s: 0.0,
            },
            0.5,
        )
        .unwrap();
        for n in 1..4 {
            e.on_event(
                &Event::NodeIdle {
                    node: n,
                    reclaim_at: None,
                },
                1.0,
            )
            .unwrap();
        }
        tick(&mut e, 1.0);
        held(&e, j)
    };
    // Grow by 3 gains t_fwd (10 s) x 3 against up x 1: a cost of 10 s (the floor)
    // grows, 40 s does not.
    assert_eq!(run(0.0, 300.0), 4);
    assert_eq!(run(5.0, 300.0), 4, "a measurement below the floor");
    assert_eq!(run(40.0, 300.0), 1, "the measured cost counts");
    assert_eq!(
        run(1e9, 20.0),
        4,
        "an inflated measurement stops at the ceiling"
    );
    assert_eq!(run(f64::NAN, 300.0), 4, "a bad measurement is none");
}

/// One job: min, max, up, down, curve increments past its minimum.
type JobDraw = (u32, u32, f64, f64, Vec<f64>);

fn one_user_instance() -> impl Strategy<Value = (u32, Vec<JobDraw>)> {
    (
        2u32..16,
        prop::collection::vec(
            (
                1u32..4,
                0u32..8,
                0.0f64..20.0,
                0.0f64..20.0,
                prop::collection::vec(0.0f64..2.0, 1..4),
            ),
            1..5,
        ),
    )
        .prop_map(|(n, jobs)| {
            (
                n,
                jobs.into_iter()
                    .map(|(min, extra, up, down, incs)| (min, min + extra, up, down, incs))
                    .collect(),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// With one user, fair shares decide as before wherever normalisation changes no
    /// curve (each job's value at its minimum is 1): the same actions, decision by
    /// decision.
    #[test]
    fn one_user_decides_as_before((nodes, jobs) in one_user_instance()) {
        let run = |fair: bool| {
            let mut e = engine(EngineConfig { fair_share: fair, ..EngineConfig::default() }, nodes);
            let mut out = Vec::new();
            for (k, (min, max, up, down, incs)) in jobs.iter().enumerate() {
                // Value 1 at `min`, then increments per point.
                let mut pts = vec![(1, 1.0 / f64::from(*min)), (*min, 1.0)];
                pts.dedup_by_key(|p| p.0);
                let mut v = 1.0;
                for (i, d) in incs.iter().enumerate() {
                    v += d;
                    pts.push((min + 1 + i as u32, v));
                }
                let s = ElasticSpec {
                    scale_up_s: *up,
                    scale_down_s: *down,
                    objective: Curve::new(pts),
                    ..spec(&format!("j{k}"), 5, *min, *max)
                };
                submit(&mut e, s, k as f64);
                out.push(tick(&mut e, k as f64));
            }
            out
        };
        prop_assert_eq!(run(true), run(false));
    }
}
