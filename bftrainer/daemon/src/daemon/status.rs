//! The daemon's state for the control socket, the metrics and `status.json`.

use super::*;

impl<C: Cluster> Daemon<C> {
    /// What the daemon holds and has done, for the control socket, the metrics and
    /// `state_dir/status.json` (`view::Snapshot`).
    pub fn snapshot(&self, now: f64) -> view::Snapshot {
        // In engine time, as every time the daemon keeps (set-asides, pauses): the
        // same as the wall clock's but after the clock stepped back.
        let now = now + self.wall_offset;
        let mut counts = view::NodeCounts::default();
        let nodes: Vec<view::NodeView> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let holder = match self.engine.node_state(id) {
                    NodeState::Held(j) => Some(self.jobs[j as usize]),
                    _ => None,
                };
                let aside = self.set_aside.get(&id).filter(|s| s.until > now);
                let state = if holder.is_some() {
                    counts.lent += 1;
                    "lent"
                } else {
                    match (n.class, n.why) {
                        (Class::Available { .. }, _) => {
                            counts.idle += 1;
                            "idle"
                        }
                        (Class::Claimed, Why::RegularJob) => {
                            counts.busy += 1;
                            "busy"
                        }
                        (Class::Claimed, _) => {
                            counts.reserved += 1;
                            "reserved"
                        }
                        (Class::Lost, _) => {
                            counts.unavailable += 1;
                            "unavailable"
                        }
                    }
                };
                counts.total += 1;
                view::NodeView {
                    name: n.name.clone(),
                    state: state.to_string(),
                    why: n.why,
                    holder,
                    reclaim_at: match n.class {
                        Class::Available { reclaim_at } => reclaim_at,
                        _ => None,
                    },
                    set_aside: aside.cloned(),
                }
            })
            .collect();
        let mut by_state = view::JobCounts::default();
        let mut sats_of: HashMap<u32, Vec<view::SatelliteView>> = HashMap::new();
        for (&sid, m) in &self.sats {
            if !m.done && !m.ending {
                sats_of
                    .entry(m.parent)
                    .or_default()
                    .push(view::SatelliteView {
                        job_id: sid,
                        node: m.node.clone(),
                    });
            }
        }
        let jobs: Vec<view::JobView> = self
            .cores
            .iter()
            .map(|(&id, c)| {
                let held = self.engine.job_nodes(c.jid);
                let state = match self.engine.job_status(c.jid) {
                    JobStatus::Queued => {
                        by_state.pending += 1;
                        "pending"
                    }
                    JobStatus::Active if held.is_empty() => {
                        by_state.waiting += 1;
                        "waiting"
                    }
                    JobStatus::Active => {
                        by_state.running += 1;
                        "running"
                    }
                    JobStatus::Finished => {
                        by_state.finished += 1;
                        "finished"
                    }
                    JobStatus::Cancelled => {
                        by_state.cancelled += 1;
                        "cancelled"
                    }
                };
                let spec = self.engine.job_spec(c.jid);
                let b = self.book.get(c.jid);
                let mut satellites = sats_of.remove(&id).unwrap_or_default();
                satellites.sort_by_key(|s| s.job_id);
                view::JobView {
                    job_id: id,
                    user: c.user.clone(),
                    uid: c.uid,
                    min_nodes: spec.min_nodes,
                    max_nodes: spec.max_nodes,
                    state: state.to_string(),
                    nodes: self.names(held),
                    size: held.len() as u32,
                    core_nodes: self.names(self.engine.job_anchors(c.jid)),
                    satellites,
                    rate: self.engine.measured_rate(c.jid),
                    batch: self
                        .engine
                        .decided_batch(c.jid)
                        .or(self.engine.job_batch(c.jid).1),
                    batch_range: self.engine.job_batch(c.jid).0,
                    sensitivity: self.measured.get(&id).and_then(|m| m.fit.clone()),
                    held_per_gpu: self.measured.get(&id).and_then(|m| m.held),
                    measurements: self.measured.get(&id).map_or(0, |m| m.count() as u32),
                    admits: b.map_or(0, |b| b.admits),
                    grows: b.map_or(0, |b| b.grows),
                    shrinks: b.map_or(0, |b| b.shrinks),
                    requeues: b.map_or(0, |b| b.requeues),
                    preemptions: b.map_or(0, |b| b.preemptions),
                    largest: b.map_or(0, |b| b.largest),
                    node_hours: b.map_or(0.0, |b| b.node_seconds_at(now) / 3600.0),
                    submitted_at: b.map_or(now, |b| b.submitted_at),
                    ended_at: b.and_then(|b| b.ended_at),
                    history: b.map(|b| b.history.iter().copied().collect()),
                    history_dropped: b.map_or(0, |b| b.history_dropped),
                    paused_until: self.blame.paused(id, now).map(|p| p.until),
                    pause_reason: self.blame.paused(id, now).map(|p| p.reason.clone()),
                    unservable: self.unservable.get(&id).cloned(),
                }
            })
            .collect();
        view::Snapshot {
            schema: view::SCHEMA.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            time: now,
            started_at: self.started_at.unwrap_or(now),
            lending: self.engine.lending().as_str().to_string(),
            lease: self.lease.as_ref().map(|l| match l.term() {
                Some(t) => format!(
                    "ACTIVE Holder={} Term={t} Lease={:.0}s RenewedEachCycle",
                    l.id, l.duration_s
                ),
                None => format!("LOST Holder={} Lease={:.0}s", l.id, l.duration_s),
            }),
            partition_fault: self.partition_fault.clone(),
            slurm_reachable: self.outage_since.is_none(),
            last_error: self.last_error.clone(),
            growth_held: self.growth_held.clone().filter(|g| g.until > now),
            poll: self.poll_times.latency(),
            decision: self.decide_times.latency(),
            counts,
            jobs_by_state: by_state,
            node_seconds_harvested: self.book.harvested_node_seconds(now),
            stats: self.stats.clone(),
            nodes,
            jobs,
            listen_problems: Vec::new(),
        }
    }
}
