//! GPU-granular lending (DeepBoot): on the nodes of `[gpu_lending] partitions`, which
//! regular jobs share, each GPU is an engine node of its own, `host/gpuK`
//! (`bftrainer_core::placement::gpu_slot_name`), lent as a satellite of one GPU in
//! `[gpu_lending] satellite_partition` and taken back when a regular job claims it.
//!
//! The slots of a host are interchangeable (Slurm, not bftrainerd, picks which GPU a
//! satellite gets): a host of G GPUs of which regular jobs use F has G - F slots open,
//! the slots the engine lends kept first. Each GPU satellite is bound to one slot of
//! its job on its host (`SatMemo::slot`) when it is submitted, or, after a restart,
//! when it is first seen.

use super::*;
use bftrainer_core::placement::{gpu_slot_index, gpu_slot_name, slot_host, Gpus, NodeAttrs};
use rustc_hash::{FxHashMap, FxHashSet};

/// One GPU satellite as observing slots reads it.
struct GpuSat {
    id: u32,
    parent: u32,
    host: String,
    /// Runs and is not being preempted: it holds one of the host's GPUs for us.
    holds: bool,
    preempted: bool,
}

impl<C: Cluster> Daemon<C> {
    /// Whether engine node `n` is a GPU slot.
    pub(super) fn is_gpu_slot(&self, n: NodeId) -> bool {
        self.nodes.get(n as usize).is_some_and(|r| r.gpu_slot)
    }

    /// The engine id of `name`, declared to the engine first if it is new.
    fn engine_node(&mut self, name: &str, now: f64) -> Option<NodeId> {
        if let Some(&id) = self.node_ids.get(name) {
            return Some(id);
        }
        let id = self.nodes.len() as NodeId;
        let ev = Event::NodeAdded {
            node: id,
            name: name.to_string(),
        };
        match self.feed(&ev, now) {
            Ok(_) => {
                self.learn(&ev).ok();
                if let Some(j) = self.journal.as_mut() {
                    j.push(&record(now, ev));
                }
                Some(id)
            }
            Err(e) => {
                log::warn!("engine refused GPU slot {name}: {e}");
                None
            }
        }
    }

    /// The GPU slots of the lending partitions' nodes, classed and told to the engine,
    /// and each GPU satellite bound to a slot. `sats` are the satellites observe found
    /// (index in the job table, parent).
    pub(super) fn observe_gpu_slots(&mut self, sats: &[(usize, u32)], now: f64) {
        let any_slot = self.nodes.iter().any(|r| r.gpu_slot);
        let Some(sat_part) = self.cfg.gpu_satellite_partition.clone() else {
            if any_slot {
                self.lose_slots_except(&FxHashSet::default());
            }
            return;
        };
        // The GPU satellites, by host.
        let mut gsats: Vec<GpuSat> = Vec::new();
        {
            let jobs = self.cluster.jobs();
            for &(i, parent) in sats {
                let j = &jobs[i];
                if j.partition.as_deref() != Some(sat_part.as_str()) || !j.state.is_active() {
                    continue;
                }
                let running = is_running(j);
                gsats.push(GpuSat {
                    id: j.job_id,
                    parent,
                    host: observe::sat_node(j).to_string(),
                    holds: running && j.preempt_time.is_none(),
                    preempted: j.preempt_time.is_some(),
                });
            }
        }
        // By host, each host's satellites in job id order: one range per host.
        gsats.sort_unstable_by(|a, b| a.host.cmp(&b.host).then(a.id.cmp(&b.id)));
        let mut by_host: FxHashMap<&str, std::ops::Range<usize>> = FxHashMap::default();
        for (i, s) in gsats.iter().enumerate() {
            by_host.entry(s.host.as_str()).or_insert(i..i).end = i + 1;
        }
        // A satellite being preempted gives its slot back to a regular job.
        for s in gsats.iter().filter(|s| s.preempted) {
            if let Some(slot) = self.sats.get(&s.id).and_then(|m| m.slot) {
                self.reclaimed.entry(slot).or_insert(now);
            }
        }
        let mut ours: FxHashMap<&str, u32> = FxHashMap::default();
        for s in &gsats {
            if s.holds {
                *ours.entry(s.host.as_str()).or_default() += 1;
            }
        }
        // Hosts whose GPUs are lent: in a lending partition, not an elastic one (those
        // are lent whole), with GPUs.
        struct Host {
            name: String,
            gpus: u32,
            typ: Option<String>,
            /// GPUs regular jobs (and satellites being preempted) hold.
            foreign: u32,
            state: Option<Class>,
            features: Vec<String>,
            mem_mb: u64,
        }
        let mut hosts: Vec<Host> = Vec::new();
        for (i, n) in self.cluster.nodes().iter().enumerate() {
            if self.slots.elastic(i)
                || !n
                    .partitions
                    .iter()
                    .any(|p| self.cfg.gpu_partitions.contains(p))
            {
                continue;
            }
            let entries = n
                .gres
                .as_deref()
                .map(bftrainer_slurm::gpu_entries)
                .unwrap_or_default();
            let gpus = entries.iter().map(|e| e.1).fold(0u32, u32::saturating_add);
            if gpus == 0 {
                continue;
            }
            // One type for every slot where the node has one; else untyped.
            let typ = match entries.as_slice() {
                [(t, _)] => t.clone(),
                _ => None,
            };
            let used = n.gres_used.as_deref().map_or(0, bftrainer_slurm::gpu_count);
            let foreign = used.saturating_sub(ours.get(n.name.as_str()).copied().unwrap_or(0));
            let st = n.state;
            let state = if st.is_unavailable() || st.is_drain() || st.is_reserved() {
                Some(Class::Lost)
            } else if st.is_not_responding() || st.base() == bftrainer_slurm::NodeBase::Unknown {
                // Slurm has not decided; neither have we.
                None
            } else {
                Some(Class::Available { reclaim_at: None })
            };
            hosts.push(Host {
                name: n.name.clone(),
                gpus: gpus.min(MAX_GPUS_PER_HOST),
                typ,
                foreign,
                state,
                features: n.features.clone(),
                mem_mb: n.real_memory_mb / u64::from(gpus),
            });
        }
        let mut seen: FxHashSet<NodeId> = FxHashSet::default();
        let mut attrs_events = Vec::new();
        for h in &hosts {
            let mine = by_host
                .get(h.name.as_str())
                .map_or(&gsats[..0], |r| &gsats[r.clone()]);
            let mut ids: Vec<NodeId> = Vec::with_capacity(h.gpus as usize);
            for k in 0..h.gpus {
                if let Some(id) = self.engine_node(&gpu_slot_name(&h.name, k), now) {
                    ids.push(id);
                    seen.insert(id);
                }
            }
            // Each slot offers the host's features and one of its GPUs.
            let attrs = NodeAttrs {
                features: h.features.clone(),
                gpus: vec![Gpus {
                    typ: h.typ.clone(),
                    count: 1,
                }],
                mem_mb: h.mem_mb,
                gpu_slot: true,
            };
            for &id in &ids {
                if self.engine.node_attrs(id) != Some(&attrs) {
                    attrs_events.push(Event::NodeAttrs {
                        node: id,
                        attrs: attrs.clone(),
                    });
                }
            }
            self.bind_satellites(mine, &h.name, &ids);
            let Some(state) = h.state else {
                for &id in &ids {
                    self.nodes[id as usize].why = Why::NotResponding;
                }
                continue;
            };
            if state == Class::Lost {
                for &id in &ids {
                    self.nodes[id as usize].why = Why::Unavailable;
                    self.observe_node(id, Class::Lost);
                }
                continue;
            }
            // Open: the GPUs regular jobs do not hold, less those taken back by a
            // preemption moments ago (`reclaim_hold`: the regular job that preempted a
            // satellite is about to start there; which GPU it gets is Slurm's choice).
            // Kept open first: slots whose satellite holds its GPU, then slots the
            // engine lends whose satellite is still to start, then free ones; slots
            // whose satellite Slurm preempts close first.
            let holding: FxHashSet<NodeId> = mine
                .iter()
                .filter(|s| s.holds)
                .filter_map(|s| self.sats.get(&s.id).and_then(|m| m.slot))
                .collect();
            let preempted: FxHashSet<NodeId> = mine
                .iter()
                .filter(|s| s.preempted)
                .filter_map(|s| self.sats.get(&s.id).and_then(|m| m.slot))
                .collect();
            let rank = |d: &Self, id: NodeId| -> u8 {
                match d.engine.node_state(id) {
                    _ if preempted.contains(&id) => 3,
                    NodeState::Held(_) if holding.contains(&id) => 0,
                    NodeState::Held(_) => 1,
                    _ => 2,
                }
            };
            let mut order = ids.clone();
            order.sort_by_key(|&id| rank(self, id));
            let reclaimed = ids
                .iter()
                .filter(|id| {
                    self.reclaimed
                        .get(id)
                        .is_some_and(|&t| now - t < self.cfg.reclaim_hold_s)
                })
                .count() as u32;
            let mut open = h.gpus.saturating_sub(h.foreign).saturating_sub(reclaimed);
            for id in order {
                let (class, why) = if open == 0 {
                    let why = if reclaimed > 0 {
                        Why::Reclaimed
                    } else {
                        Why::RegularJob
                    };
                    (Class::Claimed, why)
                } else {
                    open -= 1;
                    (Class::Available { reclaim_at: None }, Why::Open)
                };
                self.nodes[id as usize].why = why;
                self.observe_node(id, class);
            }
        }
        for ev in attrs_events {
            self.emit(ev);
        }
        self.lose_slots_except(&seen);
    }

    /// Every GPU slot not in `keep` is lost (its host left the lending partitions, lost
    /// GPUs, or lending was turned off).
    fn lose_slots_except(&mut self, keep: &FxHashSet<NodeId>) {
        let gone: Vec<NodeId> = (0..self.nodes.len() as NodeId)
            .filter(|&id| self.nodes[id as usize].gpu_slot && !keep.contains(&id))
            .collect();
        for id in gone {
            if self.nodes[id as usize].class != Class::Lost {
                log::info!(
                    "GPU slot {}: no longer lendable (its node left [gpu_lending] partitions, or lending is off)",
                    self.nodes[id as usize].name
                );
            }
            self.nodes[id as usize].why = Why::Unavailable;
            self.observe_node(id, Class::Lost);
        }
    }

    /// Binds each GPU satellite on `host` (`gsats`: that host's, in job id order) that
    /// has no slot yet to a slot of `ids` its job holds and no other of its satellites
    /// has.
    fn bind_satellites(&mut self, gsats: &[GpuSat], host: &str, ids: &[NodeId]) {
        let mut taken: FxHashSet<NodeId> = FxHashSet::default();
        for s in gsats {
            if let Some(slot) = self.sats.get(&s.id).and_then(|m| m.slot) {
                taken.insert(slot);
            }
        }
        let unbound: Vec<&GpuSat> = gsats
            .iter()
            .filter(|s| !s.preempted)
            .filter(|s| {
                self.sats
                    .get(&s.id)
                    .map_or(true, |m| m.slot.is_none() && !m.ending)
            })
            .collect();
        for s in unbound {
            // After a restart the core is adopted later in this cycle: its engine job
            // is known from the journal already.
            let jid = match self.cores.get(&s.parent) {
                Some(c) => Some(c.jid),
                None => self.engine_job(s.parent),
            };
            let Some(jid) = jid else {
                continue;
            };
            let free = ids.iter().copied().find(|&id| {
                !taken.contains(&id) && self.engine.node_state(id) == NodeState::Held(jid)
            });
            if let Some(slot) = free {
                taken.insert(slot);
                let memo = self.sats.entry(s.id).or_default();
                memo.parent = s.parent;
                memo.slot = Some(slot);
                log::info!(
                    "satellite {} of job {} on {host}: GPU slot {}",
                    s.id,
                    s.parent,
                    self.nodes[slot as usize].name
                );
            }
        }
    }

    /// The engine node a satellite stands for: its GPU slot, else its node.
    pub(super) fn satellite_node(&self, sat: u32, node: &str) -> Option<NodeId> {
        self.sats
            .get(&sat)
            .and_then(|m| m.slot)
            .or_else(|| self.node_ids.get(node).copied())
    }

    /// The satellite request for GPU slot `slot` of core job `core_job`: partition,
    /// host, one GPU (of the type the job asks), one task with the host's CPUs per GPU
    /// (or the job's CPUs per task), sharing the host.
    pub(super) fn gpu_satellite_shape(&self, slot: &str, core_job: &Job, job: &mut BatchJob) {
        let host = slot_host(slot);
        job.partition = self.cfg.gpu_satellite_partition.clone();
        job.node_list = Some(host.to_string());
        job.exclusive = false;
        let typ = core_job
            .tres_per_node
            .as_deref()
            .and_then(bftrainer_slurm::gpus_per_node)
            .and_then(|(t, _)| t);
        job.tres_per_node = Some(bftrainer_slurm::gpu_tres_request(typ.as_deref(), 1));
        job.tres_per_task = None;
        job.ntasks_per_node = Some(1);
        job.ntasks = Some(1);
        let per_gpu = self
            .cluster
            .nodes()
            .iter()
            .find(|n| n.name == host)
            .map(|n| {
                let g = n
                    .gres
                    .as_deref()
                    .map_or(0, bftrainer_slurm::gpu_count)
                    .max(1);
                (u32::from(n.cpus) / g).max(1)
            })
            .unwrap_or(1);
        job.cpus_per_task = Some(
            core_job
                .cpus_per_task
                .filter(|&c| c > 0)
                .unwrap_or(per_gpu.min(u32::from(u16::MAX)) as u16),
        );
        debug_assert!(gpu_slot_index(slot).is_some());
    }
}

/// Slots per host at most (a GRES count is the node's admin's to write).
const MAX_GPUS_PER_HOST: u32 = 1024;
