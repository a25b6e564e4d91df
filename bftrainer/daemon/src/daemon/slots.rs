//! Node names interned once per node table, so that observe's per-cycle work looks
//! nodes up by index instead of hashing and cloning their names.
//!
//! A slot is a node's index in the node table (the first of its name, should a name be
//! listed twice), then one per name that only host expressions carry (a job on a node
//! the table no longer has). Host expressions are expanded once and kept as slots while
//! a job in the snapshot still shows them.

use super::cluster::Cluster;
use bftrainer_core::engine::NodeId;
use bftrainer_slurm::Node;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Names only host expressions carry, beyond which the index starts again (a bound on
/// what expressions naming nodes outside the table can make it hold).
const MAX_EXTRA: usize = 100_000;

#[derive(Debug, Default)]
pub(super) struct Slots {
    /// The node table's names, in its order, as last synced.
    names: Vec<String>,
    /// Slot of each node of the table (its index, or that of the first of its name).
    table: Vec<u32>,
    /// Name -> slot.
    by_name: FxHashMap<String, u32>,
    /// Engine id of each slot's name, if the engine knows it.
    engine: Vec<Option<NodeId>>,
    /// Whether each node of the table is in one of `parts`.
    elastic: Vec<bool>,
    /// Host expressions expanded, with the last sync (cycle) that used each: dropped
    /// when a whole cycle passes without them. One map, looked up once per use.
    exprs: FxHashMap<String, (Arc<[u32]>, u64)>,
    /// Syncs so far.
    epoch: u64,
    /// The node table's indices in the order of their names.
    order: Vec<u32>,
    /// The engine ids must be read again from the daemon's name map.
    stale: bool,
    /// Rebuilds so far: slots of one generation name the same nodes.
    generation: u64,
}

impl Slots {
    /// Brings the index in step with the node table, the engine's names and the elastic
    /// partitions; once per cycle, before any lookup. The names are compared in order
    /// (a string compare per node); the index is rebuilt only when they differ.
    pub fn sync(&mut self, nodes: &[Node], node_ids: &FxHashMap<String, NodeId>, parts: &[String]) {
        let same = self.names.len() == nodes.len()
            && self.names.iter().zip(nodes).all(|(a, n)| *a == n.name);
        if !same || self.stale || self.by_name.len() > nodes.len() + MAX_EXTRA {
            self.names = nodes.iter().map(|n| n.name.clone()).collect();
            self.by_name.clear();
            self.exprs.clear();
            self.table.clear();
            self.engine.clear();
            for (i, name) in self.names.iter().enumerate() {
                let slot = *self.by_name.entry(name.clone()).or_insert(i as u32);
                self.table.push(slot);
                self.engine.push(node_ids.get(name).copied());
            }
            let mut order: Vec<u32> = (0..self.names.len() as u32).collect();
            order.sort_by(|&a, &b| self.names[a as usize].cmp(&self.names[b as usize]));
            self.order = order;
            self.stale = false;
            self.generation += 1;
        }
        // Expressions unused for a whole cycle are dropped.
        self.epoch += 1;
        let epoch = self.epoch;
        self.exprs.retain(|_, (_, used)| *used + 1 >= epoch);
        self.elastic.clear();
        let mut last: Option<(&[String], bool)> = None;
        for n in nodes {
            let e = match last {
                Some((p, e)) if p == n.partitions.as_slice() => e,
                _ => {
                    let e = n.partitions.iter().any(|p| parts.contains(p));
                    last = Some((&n.partitions, e));
                    e
                }
            };
            self.elastic.push(e);
        }
    }

    /// Rebuilds of the index so far: a slot names the same node while this stays.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Keeps every expression expanded so far through this sync, as if used: a cycle
    /// that reuses what an earlier one found from them (`scan`) does not expand them.
    pub fn keep_exprs(&mut self) {
        let epoch = self.epoch;
        for (_, used) in self.exprs.values_mut() {
            *used = epoch;
        }
    }

    /// The engine ids must be read again (the daemon's name map was rebuilt).
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    /// The engine learnt node `name` as `id`.
    pub fn node_added(&mut self, name: &str, id: NodeId) {
        if let Some(&s) = self.by_name.get(name) {
            self.engine[s as usize] = Some(id);
        }
    }

    /// Nodes of the table as last synced.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }

    /// Slots in use (table nodes and names beyond it).
    pub fn len(&self) -> usize {
        self.engine.len()
    }

    /// The node table's indices in the order of their names (given back with
    /// `put_order`).
    pub fn take_order(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.order)
    }

    pub fn put_order(&mut self, order: Vec<u32>) {
        self.order = order;
    }

    /// The slot of the `i`th node of the table.
    pub fn of_node(&self, i: usize) -> u32 {
        self.table[i]
    }

    /// Whether the `i`th node of the table is in an elastic partition.
    pub fn elastic(&self, i: usize) -> bool {
        self.elastic[i]
    }

    /// The engine id of slot `s`.
    pub fn engine(&self, s: u32) -> Option<NodeId> {
        self.engine[s as usize]
    }

    /// The slot of `name`, given one if it has none.
    pub fn slot(&mut self, name: &str, node_ids: &FxHashMap<String, NodeId>) -> u32 {
        if let Some(&s) = self.by_name.get(name) {
            return s;
        }
        let s = self.engine.len() as u32;
        self.by_name.insert(name.to_string(), s);
        self.engine.push(node_ids.get(name).copied());
        s
    }

    /// The slots of host expression `expr`, in its order (a name listed twice twice).
    pub fn expand<C: Cluster>(
        &mut self,
        expr: &str,
        cluster: &C,
        node_ids: &FxHashMap<String, NodeId>,
    ) -> Arc<[u32]> {
        if let Some((v, used)) = self.exprs.get_mut(expr) {
            *used = self.epoch;
            return v.clone();
        }
        let v: Arc<[u32]> = cluster
            .expand(expr)
            .iter()
            .map(|n| self.slot(n, node_ids))
            .collect();
        self.exprs.insert(expr.to_string(), (v.clone(), self.epoch));
        v
    }
}

/// Per-slot flags for one cycle, grown on demand (slots may be added while scanning).
#[derive(Debug, Default, Clone)]
pub(super) struct Marks(Vec<bool>);

impl Marks {
    pub fn reset(&mut self, len: usize) {
        self.0.clear();
        self.0.resize(len, false);
    }
    pub fn set(&mut self, s: u32) {
        let s = s as usize;
        if s >= self.0.len() {
            self.0.resize(s + 1, false);
        }
        self.0[s] = true;
    }
    pub fn get(&self, s: u32) -> bool {
        self.0.get(s as usize).copied().unwrap_or(false)
    }
    /// The slots set, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.0.len() as u32).filter(|&s| self.0[s as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::gen::{node, GenCluster};

    fn table(names: &[&str], parts: &[&str]) -> Vec<Node> {
        names.iter().map(|n| node(n.to_string(), parts)).collect()
    }

    #[test]
    fn slots_follow_the_table_and_expressions() {
        let parts = vec!["elastic".to_string()];
        let mut ids: FxHashMap<String, NodeId> = FxHashMap::default();
        ids.insert("b".into(), 7);
        let nodes = table(&["b", "a", "b"], &["elastic"]);
        let c = GenCluster::new(nodes.clone(), Vec::new(), Vec::new());
        let mut s = Slots::default();
        s.sync(&nodes, &ids, &parts);
        // A name listed twice has one slot, the first's; engine ids by name.
        assert_eq!((s.of_node(0), s.of_node(1), s.of_node(2)), (0, 1, 0));
        assert_eq!((s.engine(0), s.engine(1)), (Some(7), None));
        assert!(s.elastic(0) && s.elastic(2));
        assert_eq!(s.take_order(), vec![1, 0, 2]);
        // Names only an expression carries get slots past the table, in its order.
        assert_eq!(&*s.expand("a,zz,b,zz", &c, &ids), &[1, 3, 0, 3]);
        assert_eq!(s.len(), 4);
        s.node_added("a", 9);
        assert_eq!(s.engine(1), Some(9));
        // Another table (a node renamed): rebuilt, the extra names gone.
        let nodes = table(&["a", "c"], &["batch"]);
        s.sync(&nodes, &ids, &parts);
        assert_eq!((s.len(), s.of_node(1), s.engine(0)), (2, 1, None));
        assert!(!s.elastic(0) && !s.elastic(1));
        assert_eq!(&*s.expand("c", &c, &ids), &[1]);
        // The same table with the daemon's names rebuilt (a snapshot restored).
        ids.insert("c".into(), 3);
        s.invalidate();
        s.sync(&nodes, &ids, &parts);
        assert_eq!(s.engine(1), Some(3));
    }

    #[test]
    fn expressions_unused_for_a_cycle_are_dropped() {
        let parts: Vec<String> = Vec::new();
        let ids = FxHashMap::default();
        let nodes = table(&["a", "b"], &[]);
        let c = GenCluster::new(nodes.clone(), Vec::new(), Vec::new());
        let mut s = Slots::default();
        s.sync(&nodes, &ids, &parts);
        s.expand("a,b", &c, &ids);
        s.expand("b", &c, &ids);
        s.sync(&nodes, &ids, &parts);
        s.expand("a,b", &c, &ids);
        s.sync(&nodes, &ids, &parts);
        assert!(s.exprs.contains_key("a,b") && !s.exprs.contains_key("b"));
        s.sync(&nodes, &ids, &parts);
        assert!(s.exprs.is_empty());
    }

    #[test]
    fn marks_grow_on_demand() {
        let mut m = Marks::default();
        m.reset(2);
        m.set(5);
        assert!(m.get(5) && !m.get(1) && !m.get(100));
        m.reset(2);
        assert!(!m.get(5));
    }
}
