//! Reconcile (act): compare what the engine holds with the core and satellite jobs
//! Slurm has and make idempotent calls to close the gap: pin and release (admit),
//! submit satellites (grow), end them (shrink), requeue and hold cores.

use super::*;
use rustc_hash::{FxHashMap, FxHashSet};

impl<C: Cluster> Daemon<C> {
    pub(super) fn reconcile(&mut self, now: f64) -> usize {
        let mut calls = 0usize;
        // Only the daemon's own jobs matter here (tagged; few), and of those the ones
        // still pending or running: an ended core or satellite calls for nothing below.
        // Core jobs are copied: a call on one may change it in the snapshot, and what is
        // decided after the call reads it as it was. Satellites, one per lent node, are
        // not: each is read in place (by its index in the snapshot) before any call on
        // it, and copied only when it is ended. The copies are kept from the cycle
        // before and copied again only where the snapshot's record differs.
        let mut core_jobs: Vec<Job> = std::mem::take(&mut self.reconcile_copies);
        let mut n_cores = 0usize;
        let mut sat_refs: Vec<(usize, u32)> = Vec::new();
        // The tagged jobs observe found this cycle, where the table is the one it
        // scanned (no call since added or removed a job); else a pass over the table.
        let scanned = self.tagged_of.take();
        #[cfg(test)]
        let scanned = scanned.filter(|_| !self.afresh);
        let jobs = self.cluster.jobs();
        let all: Vec<usize>;
        let candidates: &[usize] = match &self.regular {
            Some(r) if scanned == Some(jobs.len()) => &r.tagged,
            _ => {
                all = (0..jobs.len()).collect();
                &all
            }
        };
        // Tagged jobs that ended but whose nodes Slurm still cleans up (COMPLETING): no
        // new satellite or core goes there until they are gone, else it waits behind
        // them and its job is charged for that wait.
        let mut completing: Vec<usize> = Vec::new();
        for &i in candidates {
            let j = &jobs[i];
            if !j.admin_comment.as_deref().is_some_and(spec::looks_like_tag) {
                continue;
            }
            if !j.state.is_active() {
                if j.state.is_completing() {
                    completing.push(i);
                }
                continue;
            }
            if self.cores.contains_key(&j.job_id) {
                observe::keep_copy(&mut core_jobs, n_cores, j);
                n_cores += 1;
            }
            if self.sats.contains_key(&j.job_id) {
                if let Some(parent) = observe::tag_parent(&self.tags, j) {
                    sat_refs.push((i, parent));
                }
            }
        }
        core_jobs.truncate(n_cores);
        // The last copy of an id wins, as a map built from the job table in order does.
        let by_id: FxHashMap<u32, usize> = core_jobs
            .iter()
            .enumerate()
            .map(|(k, j)| (j.job_id, k))
            .collect();
        let grace: HashMap<String, f64> = self
            .cluster
            .partitions()
            .iter()
            .map(|p| (p.name.clone(), f64::from(p.grace_time_s)))
            .collect();
        // Active satellites per parent: (index in the snapshot, engine node). Their node
        // names are read in the snapshot where needed (no call changes a satellite's).
        let mut sats: FxHashMap<u32, Vec<(usize, Option<NodeId>)>> = FxHashMap::default();
        {
            let jobs = self.cluster.jobs();
            for &(i, parent) in &sat_refs {
                let n = self.satellite_node(jobs[i].job_id, observe::sat_node(&jobs[i]));
                sats.entry(parent).or_default().push((i, n));
            }
        }
        // Nodes a new satellite or core would wait on: satellites still there (active:
        // a shrunk one leaving, another job's) or completing, and completing cores. A
        // job's own wanted satellites are `have` below, never waited on.
        let mut occupied: FxHashSet<NodeId> = FxHashSet::default();
        {
            let jobs = self.cluster.jobs();
            for list in sats.values() {
                occupied.extend(list.iter().filter_map(|&(_, n)| n));
            }
            for &i in &completing {
                if let Some(e) = jobs[i].nodes.as_deref() {
                    for name in self.cluster.expand(e) {
                        if let Some(&n) = self.node_ids.get(&name) {
                            occupied.insert(n);
                        }
                    }
                }
            }
        }
        self.occupied = occupied;
        let core_ids: Vec<u32> = self.cores.keys().copied().collect();
        let mut want: Vec<NodeId> = Vec::new();
        let mut anchors: Vec<NodeId> = Vec::new();
        let mut have: FxHashMap<NodeId, u32> = FxHashMap::default();
        for id in core_ids {
            let (jid, ended) = {
                let c = &self.cores[&id];
                (c.jid, c.ended)
            };
            let active = !ended
                && matches!(
                    self.engine.job_status(jid),
                    JobStatus::Active | JobStatus::Queued
                );
            want.clear();
            anchors.clear();
            if active {
                want.extend_from_slice(self.engine.job_nodes(jid));
                anchors.extend_from_slice(self.engine.job_anchors(jid));
            }
            let core_job = by_id.get(&id).map(|&k| &core_jobs[k]);
            let mut core_running = false;
            if let (true, Some(j)) = (active, core_job) {
                calls += self.reconcile_core(id, j, &want, &anchors, &grace, now);
                core_running =
                    is_running(j) && j.preempt_time.is_none() && self.on_anchors(j, &anchors);
            }
            // Satellites: one per wanted non-core node, once the core runs. Kept by
            // engine node (a wanted satellite's node is one the engine knows).
            let mine = sats.remove(&id).unwrap_or_default();
            have.clear();
            for (i, n) in mine {
                let sid = self.cluster.jobs()[i].job_id;
                let wanted = n.is_some_and(|n| want.contains(&n) && !anchors.contains(&n));
                let memo_ending = self.sats.get(&sid).is_some_and(|m| m.ending);
                if let (true, false, Some(n)) = (wanted, memo_ending, n) {
                    if let Some(&first) = have.get(&n) {
                        log::warn!(
                            "satellite {sid} duplicates {first} on {}; cancelling it",
                            observe::sat_node(&self.cluster.jobs()[i])
                        );
                    } else {
                        have.insert(n, sid);
                        continue;
                    }
                }
                let s = self.cluster.jobs()[i].clone();
                calls += self.end_satellite(&s, id, observe::sat_node(&s), &grace, now);
            }
            if !core_running {
                continue;
            }
            let Some(core_job) = core_job else { continue };
            for &n in &want {
                if anchors.contains(&n) || have.contains_key(&n) {
                    continue;
                }
                if self.set_aside.get(&n).is_some_and(|s| s.until > now) {
                    continue;
                }
                if self.over_budget() || self.growth_is_held(now) || self.partition_fault.is_some()
                {
                    continue;
                }
                if self.occupied.contains(&n) {
                    // The previous satellite there is still leaving: submitted now,
                    // this one would pend behind it and be charged for the wait.
                    continue;
                }
                calls += 1;
                let name = self.nodes[n as usize].name.clone();
                self.submit_satellite(id, core_job, &name, n, now);
            }
        }
        // Satellites of parents the daemon does not manage (ended, gone, refused), in
        // parent order.
        let mut rest: Vec<_> = sats.into_iter().collect();
        rest.sort_unstable_by_key(|&(parent, _)| parent);
        for (parent, list) in rest {
            for (i, _) in list {
                let s = self.cluster.jobs()[i].clone();
                let node = observe::sat_node(&s);
                if self.sats.get(&s.job_id).is_some_and(|m| !m.ending) {
                    log::info!(
                        "satellite {} on {node}: its parent job {parent} is gone",
                        s.job_id
                    );
                }
                calls += self.end_satellite(&s, parent, node, &grace, now);
            }
        }
        self.reconcile_copies = core_jobs;
        calls
    }

    pub(super) fn reconcile_core(
        &mut self,
        id: u32,
        j: &Job,
        want: &[NodeId],
        anchors: &[NodeId],
        grace: &HashMap<String, f64>,
        now: f64,
    ) -> usize {
        let core = &self.cores[&id];
        let recently = now - core.asked_at < 5.0;
        // Where an admission pins the core: its anchors, or with none (the engine
        // re-planned this cycle) the first of its nodes, never an empty list, which would
        // let Slurm start the core anywhere, on a node the engine lends as a satellite's
        // (seen on 24.11 and 26.05: a regular job then requeued the unprotected core).
        let pin: &[NodeId] = if anchors.is_empty() && !want.is_empty() {
            &want[..1]
        } else {
            anchors
        };
        if j.state.base() == JobBase::Pending && pin.iter().any(|&n| self.is_gpu_slot(n)) {
            // A core job holds whole nodes of its own partition, never a GPU slot of a
            // shared node: the slots the engine made its core go back, and the engine
            // takes the core from the job's other nodes (or waits for whole ones).
            let slots: Vec<NodeId> = pin
                .iter()
                .copied()
                .filter(|&n| self.is_gpu_slot(n))
                .collect();
            let jid = core.jid;
            log::info!(
                "elastic job {id}: its core cannot be GPU slots ({}); giving them back",
                self.names(&slots)
            );
            for n in slots {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
            return 0;
        }
        if j.state.base() == JobBase::Pending {
            // Host expressions are built only for a waiting core (most are running).
            let pin_names = self.names(pin);
            // Re-planned while its admission is in flight: take it back before Slurm
            // starts it on nodes the engine has since given elsewhere.
            let stale =
                core.admit_at.is_some() && core.pinned.as_deref() != Some(pin_names.as_str());
            if want.is_empty() || core.admit_at.is_none() && !j.is_held() || stale {
                let c = self.cores.get_mut(&id).unwrap();
                if stale {
                    c.admit_at = None;
                    c.pinned = None;
                }
                if !j.is_held() && (!recently || stale) {
                    c.asked_at = now;
                    c.admit_at = None;
                    c.pinned = None;
                    log::info!(
                        "hold elastic job {id} ({})",
                        if stale {
                            "its admission was re-planned"
                        } else {
                            "pending, not admitted"
                        }
                    );
                    let tag = j.admin_comment.clone().unwrap_or_default();
                    self.call(|c| c.hold(id, &tag), "hold", id);
                    return 1;
                }
                return 0;
            }
            if core.admit_at.is_none() && j.is_held() {
                if self.over_budget()
                    || self.partition_fault.is_some()
                    || pin.iter().any(|n| self.occupied.contains(n))
                {
                    // A partition check fails (nothing new is lent), or a satellite is
                    // still leaving a pinned node: admitted now, the core would wait
                    // behind it past its admission timeout.
                    return 0;
                }
                let names = pin_names;
                let up = JobUpdate {
                    node_list: Some(names.clone()),
                    ..Default::default()
                };
                log::info!(
                    "admit job {id} (user {}) on {names}{}",
                    j.user_name.as_deref().unwrap_or("?"),
                    if want.len() > pin.len() {
                        format!(
                            ", {} more node(s) by satellites once it runs",
                            want.len() - pin.len()
                        )
                    } else {
                        String::new()
                    }
                );
                let pinned = self.cluster.update(id, &up);
                if let Err(e) = &pinned {
                    self.stats.slurm_errors += 1;
                    self.error(format!("pin of job {id} to {names} failed: {e}"));
                    if !e.is_unreachable() {
                        // Slurm refuses the job on those nodes (its request does not fit
                        // them, its limits): the job waits out a pause, not re-pinned at
                        // every cycle.
                        let jid = self.cores[&id].jid;
                        for n in self.engine.job_nodes(jid).to_vec() {
                            self.emit(Event::WorkerLeft { job: jid, node: n });
                        }
                        self.job_failed(
                            id,
                            format!("Slurm refused to pin it to {names}: {e}"),
                            now,
                        );
                    }
                }
                let tag = j.admin_comment.clone().unwrap_or_default();
                // The note says which start is this admission's: bft-run requeues a
                // start held that Slurm made on its own (a requeue while bftrainerd
                // was down), for bftrainerd to admit.
                let note = spec::admitted_note(j.restart_count);
                let ok = pinned.is_ok() && self.call(|c| c.release(id, &tag, &note), "release", id);
                if ok {
                    self.stats.admits += 1;
                    let c = self.cores.get_mut(&id).unwrap();
                    c.admit_at = Some(now);
                    c.pinned = Some(names);
                }
                return 2;
            }
            return 0;
        }
        if !is_running(j) {
            return 0;
        }
        if self.is_adopting(id) {
            // Slurm runs it and its adoption waits (`adopt`): left running as is.
            return 0;
        }
        if !want.is_empty() {
            // Started on other nodes than the engine holds for its core (a race between
            // a re-plan and the start): the engine's view must match Slurm's, so the
            // job goes back and is admitted again on what the engine holds.
            if j.preempt_time.is_some() || recently || self.on_anchors(j, anchors) {
                return 0;
            }
            self.cores.get_mut(&id).unwrap().asked_at = now;
            log::warn!(
                "elastic job {id} runs on {} but its core should be on {}; requeueing it held to admit it again",
                j.nodes.as_deref().unwrap_or("?"),
                self.names(anchors)
            );
            if self.call(|c| c.requeue(id, true), "requeue", id) {
                self.stats.requeues += 1;
                self.cores.get_mut(&id).unwrap().restarts = j.restart_count.saturating_add(1);
            }
            return 1;
        }
        // Running but the engine gave it no nodes: requeue it held. While Slurm
        // preempts it, wait out the partition's grace time first.
        if let Some(pt) = j.preempt_time {
            let g = j
                .partition
                .as_deref()
                .and_then(|p| grace.get(p))
                .copied()
                .unwrap_or(0.0);
            // Counted from when this daemon first saw this preemption, not from
            // Slurm's PreemptTime: a clock stepped or skewed against slurmctld's would
            // requeue the core without its grace.
            let c = self.cores.get_mut(&id).unwrap();
            let seen = match c.preempt_seen {
                Some((p, t)) if p == pt => t,
                _ => {
                    c.preempt_seen = Some((pt, now));
                    now
                }
            };
            if now < seen + g {
                return 0;
            }
        }
        if recently {
            return 0;
        }
        self.cores.get_mut(&id).unwrap().asked_at = now;
        log::info!(
            "requeue job {id} off {}: held until it is admitted again",
            j.nodes.as_deref().unwrap_or("?")
        );
        if self.call(|c| c.requeue(id, true), "requeue", id) {
            self.stats.requeues += 1;
            // Our own requeue: not a preemption when the restart count moves.
            self.cores.get_mut(&id).unwrap().restarts = j.restart_count.saturating_add(1);
        }
        1
    }

    /// Whether the running core job `j` is on exactly the engine's core nodes.
    pub(super) fn on_anchors(&self, j: &Job, anchors: &[NodeId]) -> bool {
        if anchors.is_empty() {
            return true;
        }
        let mut actual = j
            .nodes
            .as_deref()
            .map(|e| self.cluster.expand(e))
            .unwrap_or_default();
        let mut expected: Vec<String> = anchors
            .iter()
            .map(|&n| self.nodes[n as usize].name.clone())
            .collect();
        actual.sort();
        expected.sort();
        actual == expected
    }
}
