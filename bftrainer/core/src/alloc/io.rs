//! The JSON edge of the allocator (`bftrainer solve`): instances with node names in,
//! allocations with node names out. Schema in docs/solve.md.

use super::{invalid, AllocError, BatchCurve, Curve, Instance, JobInput, Objective, Solution};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum NodeJson {
    Name(String),
    Full {
        name: String,
        #[serde(default)]
        reclaim_in_s: Option<f64>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchJson {
    batch_size: u32,
    curve: Vec<(u32, f64)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobJson {
    id: String,
    min_nodes: u32,
    max_nodes: u32,
    scale_up_s: f64,
    scale_down_s: f64,
    #[serde(default)]
    curve: Vec<(u32, f64)>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    batch_curves: Vec<BatchJson>,
    #[serde(default)]
    current_batch: Option<u32>,
    #[serde(default)]
    remaining_work: Option<f64>,
    #[serde(default)]
    user: Option<u32>,
    #[serde(default)]
    user_weight: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceJson {
    #[serde(default)]
    t_fwd_s: Option<f64>,
    nodes: Vec<NodeJson>,
    jobs: Vec<JobJson>,
}

/// Forward-looking time when neither the instance nor the caller gives one (BFTrainer's).
pub const DEFAULT_T_FWD_S: f64 = 10.0;

/// An instance plus the names of its nodes (`node_names[i]` is node `i`).
#[derive(Debug, Clone, PartialEq)]
pub struct NamedInstance {
    pub instance: Instance,
    pub node_names: Vec<String>,
    /// Each job's user (`jobs[].user`), for fair shares; `None`: a user of its own.
    pub users: Vec<Option<u32>>,
    /// Users' share weights (`jobs[].user_weight`), by user.
    pub user_weights: HashMap<u32, f64>,
}

/// Parse and resolve names; the instance is not yet validated (see [`Instance::validate`]).
pub fn parse_instance(json: &str) -> Result<NamedInstance, AllocError> {
    let raw: InstanceJson =
        serde_json::from_str(json).map_err(|e| AllocError::Parse(e.to_string()))?;
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(raw.nodes.len());
    let mut node_names = Vec::with_capacity(raw.nodes.len());
    let mut reclaim = Vec::with_capacity(raw.nodes.len());
    for (i, n) in raw.nodes.iter().enumerate() {
        let (name, r) = match n {
            NodeJson::Name(s) => (s.as_str(), None),
            NodeJson::Full { name, reclaim_in_s } => (name.as_str(), *reclaim_in_s),
        };
        if name.is_empty() {
            return Err(invalid(format!("nodes[{i}]"), "node name is empty"));
        }
        if let Some(prev) = index.insert(name, i as u32) {
            return Err(invalid(
                format!("nodes[{i}]"),
                format!("node {name:?} is listed twice (also nodes[{prev}])"),
            ));
        }
        node_names.push(name.to_string());
        reclaim.push(r);
    }
    let mut jobs = Vec::with_capacity(raw.jobs.len());
    let mut users = Vec::with_capacity(raw.jobs.len());
    let mut user_weights: HashMap<u32, f64> = HashMap::new();
    for (j, job) in raw.jobs.into_iter().enumerate() {
        let loc = || format!("jobs[{j}] (id {:?})", job.id);
        if let Some(w) = job.user_weight {
            let Some(u) = job.user else {
                return Err(invalid(loc() + ".user_weight", "needs the job's `user`"));
            };
            if !w.is_finite() || w < 0.0 {
                return Err(invalid(
                    loc() + ".user_weight",
                    format!("is {w}; must be a finite number >= 0"),
                ));
            }
            if let Some(prev) = user_weights.insert(u, w) {
                if prev != w {
                    return Err(invalid(loc() + ".user_weight", format!("is {w}, but another job of user {u} gives {prev}; give one weight per user")));
                }
            }
        }
        users.push(job.user);
        let mut current = Vec::with_capacity(job.nodes.len());
        for (k, name) in job.nodes.iter().enumerate() {
            let i = index.get(name.as_str()).ok_or_else(|| {
                invalid(
                    format!("jobs[{j}] (id {:?}).nodes[{k}]", job.id),
                    format!("node {name:?} is not in the top-level nodes"),
                )
            })?;
            current.push(*i);
        }
        jobs.push(JobInput {
            id: job.id,
            min_nodes: job.min_nodes,
            max_nodes: job.max_nodes,
            scale_up_s: job.scale_up_s,
            scale_down_s: job.scale_down_s,
            curve: Curve::new(job.curve),
            current,
            batch_curves: job
                .batch_curves
                .into_iter()
                .map(|b| BatchCurve {
                    batch_size: b.batch_size,
                    curve: Curve::new(b.curve),
                })
                .collect(),
            current_batch: job.current_batch,
            remaining_work: job.remaining_work,
        });
    }
    let any_reclaim = reclaim.iter().any(Option::is_some);
    // GPU-slot units (`host/gpuK`) share their host; whole nodes are each their own.
    let host_of = if node_names.iter().any(|n| n.contains('/')) {
        let mut hosts: HashMap<&str, u32> = HashMap::new();
        node_names
            .iter()
            .map(|n| {
                let next = hosts.len() as u32;
                *hosts.entry(crate::placement::slot_host(n)).or_insert(next)
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(NamedInstance {
        instance: Instance {
            t_fwd_s: raw.t_fwd_s.unwrap_or(DEFAULT_T_FWD_S),
            n_nodes: node_names.len() as u32,
            reclaim_in_s: if any_reclaim { reclaim } else { Vec::new() },
            host_of,
            jobs,
        },
        node_names,
        users,
        user_weights,
    })
}

#[derive(Debug, Serialize)]
struct JobOut<'a> {
    id: &'a str,
    nodes: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_size: Option<u32>,
}

#[derive(Debug, Serialize)]
struct SolutionOut<'a> {
    objective: &'static str,
    objective_value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    fairness_level: Option<f64>,
    jobs: Vec<JobOut<'a>>,
}

/// The allocation with node names, as `bftrainer solve` prints it.
pub fn solution_json(
    named: &NamedInstance,
    objective: Objective,
    sol: &Solution,
) -> serde_json::Value {
    let out = SolutionOut {
        objective: objective.name(),
        objective_value: sol.objective_value,
        fairness_level: sol.fairness_level,
        jobs: named
            .instance
            .jobs
            .iter()
            .zip(&sol.jobs)
            .zip(&sol.batch_sizes)
            .map(|((job, set), &b)| JobOut {
                id: &job.id,
                nodes: set
                    .iter()
                    .map(|&i| named.node_names[i as usize].as_str())
                    .collect(),
                batch_size: b,
            })
            .collect(),
    };
    serde_json::to_value(out).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_slot_names_are_packed_by_host() {
        // a has 3 free GPUs, b 2: a job of exactly 2 gets b's two, not a/gpu0 and a/gpu1.
        let named = parse_instance(
            r#"{"nodes": ["a/gpu0", "a/gpu1", "a/gpu2", "b/gpu0", "b/gpu1", "c"],
                "jobs": [{"id": "j", "min_nodes": 2, "max_nodes": 2, "scale_up_s": 0,
                          "scale_down_s": 0, "curve": [[1, 1], [2, 2]]}]}"#,
        )
        .unwrap();
        assert_eq!(named.instance.host_of, vec![0, 0, 0, 1, 1, 2]);
        let sol = super::super::solve(&named.instance, &Default::default()).unwrap();
        let out = solution_json(&named, Objective::Bftrainer, &sol);
        assert_eq!(
            out["jobs"][0]["nodes"],
            serde_json::json!(["b/gpu0", "b/gpu1"])
        );
        // Whole nodes only: no hosts.
        let flat = parse_instance(
            r#"{"nodes": ["n1", "n2"], "jobs": [{"id": "j", "min_nodes": 1, "max_nodes": 1,
                "scale_up_s": 0, "scale_down_s": 0, "curve": [[1, 1]]}]}"#,
        )
        .unwrap();
        assert!(flat.instance.host_of.is_empty());
    }
}
