//! Which nodes can serve which job: a node's features, GPUs and memory against a job's
//! `--constraint`, GPUs per node and memory per node. The engine gives a job only
//! nodes that serve it (`Event::NodeAttrs`, `Event::JobNeeds`); nodes and jobs without
//! them are served by and serve everything, as before.

use crate::constraint::Constraint;
use serde::{Deserialize, Serialize};

/// GPUs of one type (`None`: untyped), or a job's request of them per node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    pub count: u32,
}

/// What a node offers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAttrs {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpus>,
    /// Real memory in MB (0: unknown, serves any memory request).
    #[serde(default)]
    pub mem_mb: u64,
    /// One GPU of a node lent GPU by GPU (`host/gpuK`): it serves only jobs that ask
    /// for GPUs (a job asking none would hold a GPU it does not use).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gpu_slot: bool,
}

impl NodeAttrs {
    /// GPUs of type `typ` (any type for `None`).
    pub fn gpus_of(&self, typ: Option<&str>) -> u32 {
        self.gpus
            .iter()
            .filter(|g| typ.is_none() || g.typ.as_deref() == typ)
            .map(|g| g.count)
            .fold(0u32, u32::saturating_add)
    }
}

/// What a job asks of each of its nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    /// Slurm's `--constraint` expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Gpus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mb: Option<u64>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self.constraint.is_none() && self.gpus.is_none() && self.mem_mb.is_none()
    }

    /// The needs with the constraint parsed once (an expression that does not parse
    /// is left to Slurm: it restricts nothing here).
    pub fn compile(&self) -> Compiled {
        Compiled {
            constraint: self
                .constraint
                .as_deref()
                .and_then(|c| Constraint::parse(c).ok()),
            gpus: self.gpus.clone(),
            mem_mb: self.mem_mb,
        }
    }
}

/// [`Needs`] ready to test nodes against.
#[derive(Debug, Clone)]
pub struct Compiled {
    constraint: Option<Constraint>,
    gpus: Option<Gpus>,
    mem_mb: Option<u64>,
}

impl Compiled {
    /// Whether a node with `attrs` serves the job; a node of unknown attributes does.
    pub fn served_by(&self, attrs: Option<&NodeAttrs>) -> bool {
        let Some(a) = attrs else { return true };
        if a.gpu_slot && self.gpus.is_none() {
            return false;
        }
        if let Some(c) = &self.constraint {
            if !c.matches(&a.features) {
                return false;
            }
        }
        if let Some(g) = &self.gpus {
            if a.gpus_of(g.typ.as_deref()) < g.count {
                return false;
            }
        }
        if let Some(m) = self.mem_mb {
            if a.mem_mb != 0 && a.mem_mb < m {
                return false;
            }
        }
        true
    }
}

/// GPU-granular lending: each lendable GPU of a node is one unit of the engine, an engine
/// node named `host/gpuK` (K counts the node's lendable GPUs from 0; a Slurm node name
/// never holds a `/`). The daemon lends such a unit as a satellite of one GPU on `host`;
/// the allocator keeps a job's units on as few hosts as it can.
pub fn gpu_slot_name(host: &str, k: u32) -> String {
    format!("{host}/gpu{k}")
}

/// The host of an engine node: `n1` for `n1/gpu0`, the name itself for a whole node.
pub fn slot_host(name: &str) -> &str {
    name.split_once('/').map_or(name, |(h, _)| h)
}

/// The GPU slot index of an engine node named by [`gpu_slot_name`]; `None` for a whole
/// node (or a name of another shape).
pub fn gpu_slot_index(name: &str) -> Option<u32> {
    let (_, rest) = name.split_once('/')?;
    rest.strip_prefix("gpu")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(features: &[&str], gpus: &[(Option<&str>, u32)], mem: u64) -> NodeAttrs {
        NodeAttrs {
            features: features.iter().map(|s| s.to_string()).collect(),
            gpus: gpus
                .iter()
                .map(|(t, c)| Gpus {
                    typ: t.map(str::to_string),
                    count: *c,
                })
                .collect(),
            mem_mb: mem,
            gpu_slot: false,
        }
    }

    #[test]
    fn features_gpus_and_memory() {
        let a100 = node(&["rack1", "ib"], &[(Some("a100"), 4)], 512_000);
        let cpu = node(&["rack2"], &[], 256_000);
        let needs = Needs {
            constraint: Some("ib".into()),
            gpus: Some(Gpus {
                typ: Some("a100".into()),
                count: 2,
            }),
            mem_mb: Some(300_000),
        }
        .compile();
        assert!(needs.served_by(Some(&a100)));
        assert!(!needs.served_by(Some(&cpu)));
        assert!(needs.served_by(None), "unknown attributes serve");
        let any_gpu = Needs {
            gpus: Some(Gpus {
                typ: None,
                count: 5,
            }),
            ..Default::default()
        }
        .compile();
        assert!(!any_gpu.served_by(Some(&a100)), "4 < 5");
        let v100 = Needs {
            gpus: Some(Gpus {
                typ: Some("v100".into()),
                count: 1,
            }),
            ..Default::default()
        }
        .compile();
        assert!(!v100.served_by(Some(&a100)), "wrong type");
        assert!(Needs::default().compile().served_by(Some(&cpu)));
        assert!(Needs::default().is_empty());
        // An expression Slurm accepted but we cannot read restricts nothing.
        let odd = Needs {
            constraint: Some("[rack1*2&rack2*2]".into()),
            ..Default::default()
        };
        let _ = odd.compile().served_by(Some(&cpu));
    }

    #[test]
    fn a_gpu_slot_serves_only_jobs_asking_gpus() {
        let slot = NodeAttrs {
            gpu_slot: true,
            ..node(&["ib"], &[(Some("a100"), 1)], 0)
        };
        let one = |typ: Option<&str>, count| Needs {
            gpus: Some(Gpus {
                typ: typ.map(str::to_string),
                count,
            }),
            ..Default::default()
        };
        assert!(one(Some("a100"), 1).compile().served_by(Some(&slot)));
        assert!(one(None, 1).compile().served_by(Some(&slot)));
        assert!(!one(None, 2).compile().served_by(Some(&slot)), "2 per node");
        let cpu_only = Needs {
            constraint: Some("ib".into()),
            ..Default::default()
        };
        assert!(!cpu_only.compile().served_by(Some(&slot)));
        assert!(!Needs::default().compile().served_by(Some(&slot)));
    }

    #[test]
    fn gpu_slot_names() {
        let n = gpu_slot_name("node-7", 3);
        assert_eq!(n, "node-7/gpu3");
        assert_eq!(slot_host(&n), "node-7");
        assert_eq!(gpu_slot_index(&n), Some(3));
        assert_eq!(slot_host("node-7"), "node-7");
        assert_eq!(gpu_slot_index("node-7"), None);
        assert_eq!(gpu_slot_index("node-7/cpu1"), None);
    }
}
