//! What the engine needs to place jobs only on nodes that serve them
//! (`bftrainer_core::placement`): each node's features, GPUs and memory
//! (`Event::NodeAttrs`, sent when they change) and each job's `--constraint`, GPUs per
//! node and memory per node (`Event::JobNeeds`, at adoption).

use super::*;
use bftrainer_core::placement::{Gpus, Needs, NodeAttrs};
use bftrainer_slurm::Node;

/// A node's attributes as the engine takes them.
pub fn node_attrs(n: &Node) -> NodeAttrs {
    NodeAttrs {
        features: n.features.clone(),
        gpus: n
            .gres
            .as_deref()
            .map(bftrainer_slurm::gpu_entries)
            .unwrap_or_default()
            .into_iter()
            .map(|(typ, count)| Gpus { typ, count })
            .collect(),
        mem_mb: n.real_memory_mb,
        gpu_slot: false,
    }
}

/// What a job asks of each of its nodes, from what Slurm holds for it.
pub fn job_needs(j: &Job) -> Needs {
    Needs {
        constraint: j.constraint.clone(),
        gpus: j
            .tres_per_node
            .as_deref()
            .and_then(bftrainer_slurm::gpus_per_node)
            .map(|(typ, count)| Gpus { typ, count }),
        mem_mb: j.mem_per_node_mb,
    }
}

impl<C: Cluster> Daemon<C> {
    /// Sends the engine the attributes of every node whose features, GRES or memory
    /// changed since the last look (all of them at first); per poll, a comparison of
    /// what the node table holds, nothing allocated while nothing changes.
    pub(super) fn sync_node_attrs(&mut self) {
        let mut events = Vec::new();
        // The slots index is in step with this node table (observe synced it).
        for (i, n) in self.cluster.nodes().iter().enumerate() {
            if i >= self.slots.table_len() {
                break;
            }
            let Some(id) = self.slots.engine(self.slots.of_node(i)) else {
                continue;
            };
            let rec = &mut self.nodes[id as usize];
            let same = rec.seen_attrs.as_ref().is_some_and(|(f, g, m)| {
                *f == n.features && *g == n.gres && *m == n.real_memory_mb
            });
            if same {
                continue;
            }
            rec.seen_attrs = Some((n.features.clone(), n.gres.clone(), n.real_memory_mb));
            let attrs = node_attrs(n);
            if self.engine.node_attrs(id) != Some(&attrs) {
                events.push(Event::NodeAttrs { node: id, attrs });
            }
        }
        for ev in events {
            self.emit(ev);
        }
    }
}
