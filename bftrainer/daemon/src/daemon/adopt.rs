//! Adoption of running cores: a core that Slurm runs but whose admission the journal
//! does not hold (a lost, replaced or old journal; another daemon's run) is taken as
//! Slurm shows it, never requeued for want of a record.
//!
//! What the journal would have had is rebuilt from Slurm: the core's nodes become its
//! anchors (an `Admit`), its running satellites (tag, name, partition and owner as
//! bftrainerd writes them) joined workers (a `Grow`). Both go to the engine as one
//! journaled decision applied as made (`Event::Decided` in `Mode::Restore`), so a
//! restart restores it like any other. Where the journal disagrees with Slurm (an old
//! backup: other nodes), Slurm wins: the journal's nodes are given up first.

use super::*;
use bftrainer_core::engine::Action;
use bftrainer_core::placement::slot_host;

impl<C: Cluster> Daemon<C> {
    /// Marks core `id` (running, already declared to the engine as `jid`) for adoption
    /// from Slurm at this cycle's decision, unless the engine already holds it exactly
    /// where Slurm runs it, or Slurm is preempting it (then the preemption path, which
    /// waits out the grace time, is what Slurm's state calls for).
    pub(super) fn mark_adoption(&mut self, id: u32, jid: JobId, j: &Job) {
        if j.preempt_time.is_some() {
            return;
        }
        // A start that no bftrainerd admitted (no admission note for this run, no
        // Comment bft-run wrote during it): Slurm started it on its own (a requeue while
        // bftrainerd was away, a plain release); the gate requeues such a start held,
        // and so does reconcile, to admit it in its turn.
        if spec::unadmitted(
            j.admin_comment.as_deref(),
            j.comment.as_deref(),
            j.restart_count,
            j.start_time,
            true,
        ) {
            log::warn!(
                "elastic job {id} runs on {} without an admission for this run (run {}): requeued held to be admitted in its turn",
                j.nodes.as_deref().unwrap_or("?"),
                j.restart_count
            );
            return;
        }
        let held = self.engine.job_nodes(jid);
        if !held.is_empty() && self.on_anchors(j, self.engine.job_anchors(jid)) {
            return;
        }
        log::warn!(
            "elastic job {id} runs on {} {}; adopting it as Slurm runs it (no requeue)",
            j.nodes.as_deref().unwrap_or("?"),
            if held.is_empty() {
                "without an admission on record"
            } else {
                "on other nodes than the journal holds for it"
            }
        );
        self.adopting.insert(id);
    }

    /// Whether core `id` waits for its adoption (reconcile leaves it running as is).
    pub(super) fn is_adopting(&self, id: u32) -> bool {
        self.adopting.contains(&id)
    }

    /// Applies the adoptions marked this cycle (called by `decide`, after the cycle's
    /// events and before its Tick, so that the engine decides with the adopted cores in
    /// place). One that cannot be applied yet (a core node the engine does not count
    /// idle, e.g. one not answering) is tried again next cycle; the core is left running
    /// meanwhile. One whose core stopped running or is being preempted is dropped.
    pub(super) fn apply_adoptions(&mut self, now: f64) {
        if self.adopting.is_empty() {
            return;
        }
        let ids: Vec<u32> = self.adopting.iter().copied().collect();
        for id in ids {
            let Some(core) = self.cores.get(&id).filter(|c| !c.ended) else {
                self.adopting.remove(&id);
                continue;
            };
            let (jid, uid) = (core.jid, core.uid);
            let Some(j) = self.cluster.jobs().iter().find(|j| j.job_id == id).cloned() else {
                self.adopting.remove(&id);
                continue;
            };
            if !is_running(&j) || j.preempt_time.is_some() {
                self.adopting.remove(&id);
                continue;
            }
            let core_nodes: Vec<NodeId> = self.node_ids_of(j.nodes.as_deref());
            let want = j.nodes.as_deref().map(|e| self.cluster.expand(e).len());
            if core_nodes.is_empty() || want != Some(core_nodes.len()) {
                log::warn!(
                    "elastic job {id}: its nodes {} are not all elastic nodes bftrainerd knows; adoption waits",
                    j.nodes.as_deref().unwrap_or("?")
                );
                continue;
            }
            // Its satellites as bftrainerd writes them (as `scan_jobs` checks them: tag
            // and name exact, a satellite partition, the core's owner), running, one
            // per node off the core's nodes.
            let (sat_tag, sat_name) = (satellite_tag(id), satellite_name(id));
            let mut sat_nodes: Vec<NodeId> = Vec::new();
            // GPU satellites (in `[gpu_lending] satellite_partition`): id and host; each
            // gets one GPU slot of its host below.
            let mut gpu_sats: Vec<(u32, String)> = Vec::new();
            let gpu_part = self.cfg.gpu_satellite_partition.as_deref();
            for s in self.cluster.jobs() {
                if !is_running(s)
                    || s.preempt_time.is_some()
                    || s.user_id != uid
                    || s.name != sat_name
                    || s.admin_comment.as_deref() != Some(sat_tag.as_str())
                    || !s
                        .partition
                        .as_deref()
                        .is_some_and(|p| self.cfg.satellite_partition_ok(p))
                {
                    continue;
                }
                if gpu_part.is_some() && s.partition.as_deref() == gpu_part {
                    gpu_sats.push((s.job_id, observe::sat_node(s).to_string()));
                    continue;
                }
                if let Some(&n) = self.node_ids.get(observe::sat_node(s)) {
                    if !core_nodes.contains(&n) && !sat_nodes.contains(&n) {
                        sat_nodes.push(n);
                    }
                }
            }
            // The journal's nodes for it (an old backup) lose to Slurm's.
            let held: Vec<NodeId> = self.engine.job_nodes(jid).to_vec();
            for &n in &held {
                let ev = Event::WorkerLeft { job: jid, node: n };
                if self.feed(&ev, now).is_ok() {
                    if let Some(jr) = self.journal.as_mut() {
                        jr.push(&record(now, ev));
                    }
                }
            }
            // Each GPU satellite takes one slot of its host that the engine lends to no
            // job: the one it is bound to if any, else the first such. Which GPU Slurm
            // gave it does not matter (a host's slots are interchangeable); that the
            // engine counts one slot per satellite does.
            let gpu_slots = self.adopt_gpu_slots(&gpu_sats);
            sat_nodes.extend(gpu_slots.iter().map(|&(_, slot)| slot));
            let max = self.engine.job_spec(jid).max_nodes as usize;
            sat_nodes.truncate(max.saturating_sub(core_nodes.len()));
            let mut actions = vec![Action::Admit {
                job: jid,
                nodes: core_nodes.clone(),
            }];
            if !sat_nodes.is_empty() {
                actions.push(Action::Grow {
                    job: jid,
                    nodes: sat_nodes.clone(),
                });
            }
            let ev = Event::Decided {
                activated: Vec::new(),
                actions,
            };
            self.engine.set_mode(Mode::Restore);
            let fed = self.feed(&ev, now);
            self.engine.set_mode(Mode::Live);
            let warnings = self.engine.take_warnings();
            let applied = fed.map(|a| a.len()).unwrap_or(0);
            if applied == 0 {
                log::warn!(
                    "elastic job {id}: adoption on {} waits: {}",
                    j.nodes.as_deref().unwrap_or("?"),
                    warnings.join("; ")
                );
                continue;
            }
            for w in warnings {
                log::warn!("elastic job {id}: adoption: {w}");
            }
            if let Some(jr) = self.journal.as_mut() {
                jr.push(&record(now, ev));
            }
            // Bound now, so that reconcile, later in this cycle, counts each one as the
            // worker on its slot (not as a satellite of no slot, nor a slot to lend).
            for &(sid, slot) in &gpu_slots {
                if !sat_nodes.contains(&slot)
                    || self.engine.node_state(slot) != NodeState::Held(jid)
                {
                    continue;
                }
                let memo = self.sats.entry(sid).or_default();
                memo.parent = id;
                memo.slot = Some(slot);
            }
            self.adopting.remove(&id);
            self.stats.adopted_running += 1;
            let restarts = j.restart_count;
            let start = j.start_time;
            let nodes = self.names(self.engine.job_nodes(jid));
            if let Some(c) = self.cores.get_mut(&id) {
                c.started = true;
                c.restarts = restarts;
            }
            log::info!(
                "elastic job {id} adopted as running on {nodes} (core {}, {} satellite(s); started at {})",
                self.names(&core_nodes),
                sat_nodes.len(),
                start.map_or("?".to_string(), |t| t.to_string())
            );
        }
    }

    /// One GPU slot for each GPU satellite `(id, host)` whose host's slots the engine
    /// knows: its bound slot if the engine lends it to no job, else the first slot of
    /// its host the engine lends to no job and no other satellite here took.
    fn adopt_gpu_slots(&self, gpu_sats: &[(u32, String)]) -> Vec<(u32, NodeId)> {
        let mut taken: Vec<(u32, NodeId)> = Vec::new();
        let free = |slot: NodeId, taken: &[(u32, NodeId)]| {
            self.engine.node_state(slot) == NodeState::Idle
                && !taken.iter().any(|&(_, t)| t == slot)
        };
        for (sid, host) in gpu_sats {
            let bound = self
                .sats
                .get(sid)
                .and_then(|m| m.slot)
                .filter(|&slot| slot_host(&self.nodes[slot as usize].name) == host);
            let pick = bound.filter(|&slot| free(slot, &taken)).or_else(|| {
                (0..self.nodes.len() as NodeId).find(|&slot| {
                    let r = &self.nodes[slot as usize];
                    r.gpu_slot && slot_host(&r.name) == host && free(slot, &taken)
                })
            });
            if let Some(slot) = pick {
                taken.push((*sid, slot));
            }
        }
        taken
    }

    /// Engine ids of the nodes of a host expression that the daemon knows.
    fn node_ids_of(&self, expr: Option<&str>) -> Vec<NodeId> {
        let Some(e) = expr else {
            return Vec::new();
        };
        self.cluster
            .expand(e)
            .iter()
            .filter_map(|n| self.node_ids.get(n.as_str()).copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::four_nodes_one_held_core;
    use super::*;
    use gen::GenCluster;

    fn running_sats(c: &GenCluster) -> Vec<(u32, String)> {
        let mut v: Vec<(u32, String)> = c
            .jobs
            .iter()
            .filter(|j| j.state.base() == JobBase::Running && j.name == satellite_name(1))
            .map(|j| (j.job_id, j.nodes.clone().unwrap_or_default()))
            .collect();
        v.sort();
        v
    }

    /// The core kept running (Restarts 0) and, since `calls`, nothing was requeued,
    /// cancelled or submitted.
    fn assert_untouched(c: &GenCluster, calls: &gen::Calls) {
        assert_eq!(core_of(c).restart_count, 0);
        assert_eq!(c.calls.requeues, calls.requeues, "no requeue");
        assert_eq!(c.calls.cancels, calls.cancels, "no satellite cancelled");
        assert_eq!(c.calls.submits, calls.submits, "no satellite again");
    }

    fn core_of(c: &GenCluster) -> &Job {
        c.jobs.iter().find(|j| j.job_id == 1).unwrap()
    }

    /// A daemon that grew core job 1 onto all four nodes (core on n1, satellites on
    /// n2-n4); returns the cluster as it left it, and the time.
    fn grown(extra: &str) -> (GenCluster, config::Config, tempfile::TempDir, f64) {
        let (cluster, cfg, state) = four_nodes_one_held_core(extra);
        let mut d = Daemon::new(cfg.clone(), cluster, None, &[]).unwrap();
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown: {:?}", running_sats(&d.cluster));
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
            if running_sats(&d.cluster).len() == 3 {
                break;
            }
        }
        (d.cluster, cfg, state, now)
    }

    /// Runs a fresh daemon (empty journal unless `records`) for `cycles` cycles on
    /// `cluster`; returns it.
    fn run_fresh(
        cluster: GenCluster,
        cfg: config::Config,
        records: &[Record],
        mut now: f64,
        cycles: usize,
    ) -> Daemon<GenCluster> {
        let mut d = Daemon::new(cfg, cluster, None, records).unwrap();
        for _ in 0..cycles {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        d
    }

    #[test]
    fn a_running_core_on_its_first_node_is_adopted_with_its_satellites() {
        // A daemon with an empty journal (a second daemon, a lost journal) finds job 1
        // running on n1 with satellites on n2-n4: the engine holds it there, nothing is
        // requeued, cancelled or submitted again.
        let (cluster, cfg, _state, now) = grown("");
        let before = running_sats(&cluster);
        let calls = cluster.calls.clone();
        let d = run_fresh(cluster, cfg, &[], now, 20);
        assert_untouched(&d.cluster, &calls);
        assert_eq!(running_sats(&d.cluster), before);
        assert_eq!(d.stats.adopted_running, 1);
        let jid = d.jobs.iter().position(|&j| j == 1).unwrap() as JobId;
        assert_eq!(d.engine.job_nodes(jid).len(), 4);
        assert_eq!(d.names(d.engine.job_anchors(jid)), "n1");
    }

    /// Running GPU satellites of job 1 (in `shared-sat`): ids.
    fn gpu_sats(c: &GenCluster) -> Vec<u32> {
        c.jobs
            .iter()
            .filter(|j| {
                j.state.base() == JobBase::Running
                    && j.name == satellite_name(1)
                    && j.partition.as_deref() == Some("shared-sat")
            })
            .map(|j| j.job_id)
            .collect()
    }

    /// What slurmctld does for g1's GPUs: in use, those of its running GPU satellites
    /// and `regular` more (GenCluster does not count them).
    fn keep_gres_used(c: &mut GenCluster, regular: u32) {
        let used = gpu_sats(c).len() as u32 + regular;
        let g1 = c.node_mut("g1").unwrap();
        let text = format!("gpu:a100:{used}");
        if g1.gres_used.as_deref() != Some(text.as_str()) {
            g1.gres_used = Some(text);
            c.dirty = true;
        }
    }

    /// A daemon with GPU lending on `shared` (host g1, 4 A100s) grows core job 1 (on
    /// the whole elastic node n1) onto g1's GPU slots, of which a regular job holds
    /// `regular`; returns the cluster as it left it, and the time.
    fn grown_onto_gpu_slots(regular: u32) -> (GenCluster, config::Config, tempfile::TempDir, f64) {
        let mut n1 = gen::node("n1".into(), &["batch", "elastic", "elastic-sat"]);
        n1.gres = Some("gpu:a100:4".into());
        let mut g1 = gen::node("g1".into(), &["shared", "shared-sat"]);
        g1.gres = Some("gpu:a100:4".into());
        g1.gres_used = Some(format!("gpu:a100:{regular}"));
        let (n1s, g1s) = (vec!["n1".to_string()], vec!["g1".to_string()]);
        let partitions = vec![
            gen::partition("batch", &n1s, 10),
            gen::partition("elastic", &n1s, 2),
            gen::partition("elastic-sat", &n1s, 1),
            gen::partition("shared", &g1s, 10),
            gen::partition("shared-sat", &g1s, 1),
        ];
        let mut core = gen::job(1, "elastic", JobBase::Pending);
        core.admin_comment = Some("bftrainer:v1 1:5,role=core".into());
        core.tres_per_node = Some("gres/gpu:a100:1".into());
        core.priority = 0;
        let mut jobs = vec![core];
        if regular > 0 {
            let mut r = gen::job(2, "shared", JobBase::Running);
            r.nodes = Some("g1".into());
            r.tres_per_node = Some(format!("gres/gpu:a100:{regular}"));
            r.start_time = Some(1);
            jobs.push(r);
        }
        let state = tempfile::tempdir().unwrap();
        let cfg = super::super::tests::test_config(
            state.path(),
            "[gpu_lending]\npartitions = [\"shared\"]\nsatellite_partition = \"shared-sat\"\n",
        );
        let mut cluster = GenCluster::new(vec![n1, g1], partitions, jobs);
        cluster.dirty = true;
        let mut d = Daemon::new(cfg.clone(), cluster, None, &[]).unwrap();
        let mut now = 3_000_000_000.0;
        let want = 4 - regular as usize;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown: {:?}", gpu_sats(&d.cluster));
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            keep_gres_used(&mut d.cluster, regular);
            d.cycle(now).unwrap();
            if gpu_sats(&d.cluster).len() == want {
                break;
            }
        }
        (d.cluster, cfg, state, now)
    }

    /// A fresh daemon (empty journal) on a cluster `grown_onto_gpu_slots(regular)` left:
    /// it adopts the core and every GPU satellite, each bound to a slot of the job,
    /// with no requeue, cancel or submit.
    fn adopts_gpu_satellites(regular: u32) {
        let (cluster, cfg, _state, mut now) = grown_onto_gpu_slots(regular);
        let before = gpu_sats(&cluster);
        assert_eq!(before.len(), 4 - regular as usize);
        let calls = cluster.calls.clone();
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        for _ in 0..20 {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            keep_gres_used(&mut d.cluster, regular);
            d.cycle(now).unwrap();
        }
        assert_untouched(&d.cluster, &calls);
        assert_eq!(gpu_sats(&d.cluster), before);
        assert_eq!(d.stats.adopted_running, 1);
        let jid = d.jobs.iter().position(|&j| j == 1).unwrap() as JobId;
        let held = d.engine.job_nodes(jid).to_vec();
        assert_eq!(d.names(d.engine.job_anchors(jid)), "n1");
        assert_eq!(held.len(), 1 + before.len(), "{}", d.names(&held));
        let mut slots = Vec::new();
        for id in &before {
            let slot = d.sats.get(id).and_then(|m| m.slot);
            let slot = slot.unwrap_or_else(|| panic!("satellite {id} is bound to no slot"));
            assert!(held.contains(&slot), "satellite {id}: slot not the job's");
            assert!(!slots.contains(&slot), "satellite {id}: slot bound twice");
            slots.push(slot);
        }
    }

    #[test]
    fn a_running_core_is_adopted_with_its_gpu_satellites() {
        adopts_gpu_satellites(0);
    }

    #[test]
    fn a_regular_job_keeps_its_gpus_when_gpu_satellites_are_adopted() {
        // A regular job holds 2 of g1's 4 GPUs, the core's satellites the other 2:
        // those 2 slots only are adopted.
        adopts_gpu_satellites(2);
    }

    /// Swaps the running jobs on n1 and n3 (the core and a satellite), as Slurm would
    /// have placed them after an earlier requeue; `pinned`: their node requests too.
    fn swap_n1_and_n3(cluster: &mut GenCluster, pinned: bool) {
        for j in cluster.jobs.iter_mut() {
            if j.state.base() != JobBase::Running {
                continue;
            }
            let moved = match j.nodes.as_deref() {
                Some("n1") => "n3",
                Some("n3") => "n1",
                _ => continue,
            };
            j.nodes = Some(moved.to_string());
            if pinned {
                j.req_nodes = Some(moved.to_string());
            }
        }
        cluster.dirty = true;
    }

    #[test]
    fn a_running_core_off_the_engines_first_pick_is_adopted_not_requeued() {
        // The case that requeued before adoption: the core runs on n3 (Slurm put it
        // there after an earlier requeue), the satellites on n1, n2 and n4. A fresh
        // engine admitted the job "onto n[1-4]" with its core on n1, and reconcile
        // requeued the core for running off its core nodes.
        let (mut cluster, cfg, _state, now) = grown("");
        swap_n1_and_n3(&mut cluster, true);
        let before = running_sats(&cluster);
        let calls = cluster.calls.clone();
        let d = run_fresh(cluster, cfg, &[], now, 20);
        assert_eq!(
            core_of(&d.cluster).restart_count,
            0,
            "the core kept running"
        );
        assert_eq!(d.cluster.calls.requeues, calls.requeues);
        assert_eq!(d.cluster.calls.cancels, calls.cancels);
        assert_eq!(running_sats(&d.cluster), before);
        let jid = d.jobs.iter().position(|&j| j == 1).unwrap() as JobId;
        assert_eq!(d.names(d.engine.job_anchors(jid)), "n3");
    }

    #[test]
    fn a_running_core_the_engine_cannot_admit_is_adopted_not_requeued() {
        // With lending drained from the journal on, a fresh engine admits nothing, and
        // reconcile requeued a running core that "the engine gave no nodes". Slurm runs
        // it: it is adopted (and drained like any other, by shrinking its satellites).
        let (cluster, cfg, _state, now) = grown("");
        let records = vec![record(
            now,
            Event::Lending {
                mode: Lending::Paused,
            },
        )];
        let calls = cluster.calls.clone();
        let d = run_fresh(cluster, cfg, &records, now, 20);
        assert_eq!(core_of(&d.cluster).restart_count, 0);
        assert_eq!(d.cluster.calls.requeues, calls.requeues);
        assert_eq!(d.stats.adopted_running, 1);
    }

    #[test]
    fn an_old_journal_that_places_the_core_elsewhere_loses_to_slurm() {
        // A journal restored from a backup made when job 1 ran on n1 (grown onto
        // n2-n4); since then Slurm runs its core on n3. The journal's record loses.
        let (cluster, cfg, state) = four_nodes_one_held_core("");
        let (jr, _) = journal::Journal::open(state.path()).unwrap();
        let mut d0 = Daemon::new(cfg.clone(), cluster, Some(jr), &[]).unwrap();
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown: {:?}", running_sats(&d0.cluster));
            now += 1.0;
            d0.cluster.start_pending_elastic(now as i64);
            d0.cycle(now).unwrap();
            if running_sats(&d0.cluster).len() == 3 {
                break;
            }
        }
        let mut cluster = d0.cluster;
        let (_, records) = journal::Journal::open(state.path()).unwrap();
        assert!(!records.is_empty());
        swap_n1_and_n3(&mut cluster, false);
        let before = running_sats(&cluster);
        let calls = cluster.calls.clone();
        let d = run_fresh(cluster, cfg, &records, now, 20);
        assert_eq!(core_of(&d.cluster).restart_count, 0);
        assert_eq!(d.cluster.calls.requeues, calls.requeues);
        assert_eq!(d.cluster.calls.cancels, calls.cancels);
        assert_eq!(running_sats(&d.cluster), before);
        let jid = d.jobs.iter().position(|&j| j == 1).unwrap() as JobId;
        assert_eq!(d.names(d.engine.job_anchors(jid)), "n3");
    }

    #[test]
    fn a_core_started_without_any_admission_for_its_run_is_still_requeued() {
        // Its Comment holds no admission note for this run (Slurm started it by itself,
        // and no gate stopped it): not adopted, handled as before adoption (here, off
        // the engine's first pick, requeued held to wait its turn).
        let (mut cluster, cfg, _state, now) = grown("");
        for j in cluster.jobs.iter_mut() {
            if j.state.base() == JobBase::Running {
                let moved = match j.nodes.as_deref() {
                    Some("n1") => "n3",
                    Some("n3") => "n1",
                    _ => "",
                };
                if !moved.is_empty() {
                    j.nodes = Some(moved.to_string());
                }
            }
            if j.job_id == 1 {
                j.restart_count = 1;
                j.comment = Some(spec::admitted_note(0));
            }
        }
        cluster.dirty = true;
        let calls = cluster.calls.clone();
        let d = run_fresh(cluster, cfg, &[], now, 5);
        assert_eq!(d.stats.adopted_running, 0);
        assert!(d.cluster.calls.requeues > calls.requeues);
    }

    #[test]
    fn a_core_slurm_is_preempting_is_still_requeued() {
        // Requeue is what Slurm's state calls for when it preempts the core: not
        // adopted, requeued held once its grace time is over (grace 0 here).
        let (mut cluster, cfg, _state, now) = grown("");
        for j in cluster.jobs.iter_mut() {
            if j.job_id == 1 {
                j.preempt_time = Some(now as i64 - 10);
            }
        }
        cluster.dirty = true;
        let calls = cluster.calls.clone();
        let mut d = run_fresh(cluster, cfg, &[], now, 5);
        assert_eq!(
            d.stats.adopted_running, 0,
            "not adopted while Slurm preempts it"
        );
        // Slurm ends it by the preemption: requeued held, as before.
        for j in d.cluster.jobs.iter_mut() {
            if j.job_id == 1 {
                j.state = bftrainer_slurm::JobState::from_base(JobBase::Preempted);
                j.end_time = Some(now as i64 + 5);
            }
        }
        d.cluster.dirty = true;
        let mut t = now + 10.0;
        for _ in 0..5 {
            t += 1.0;
            d.cycle(t).unwrap();
        }
        assert!(d.cluster.calls.requeues > calls.requeues);
    }

    #[test]
    fn a_daemon_that_lost_its_lease_acts_no_more_and_the_standby_adopts() {
        // Daemon a holds the lease and grows job 1; it is paused past the lease, and
        // b, a standby with its own state, takes over: a, back, makes no Slurm call
        // (another core waits to be admitted), and b adopts job 1 without a requeue.
        let (cluster, cfg, _state) = four_nodes_one_held_core("");
        let shared = tempfile::tempdir().unwrap();
        let mut a = Daemon::new(cfg.clone(), cluster, None, &[]).unwrap();
        a.lease = Some(lease::Lease::new(shared.path(), "a".into(), 10.0).unwrap());
        let mut now = 3_000_000_000.0;
        for cycle in 0.. {
            assert!(cycle < 40, "not grown: {:?}", running_sats(&a.cluster));
            now += 1.0;
            a.cluster.start_pending_elastic(now as i64);
            a.cycle(now).unwrap();
            if running_sats(&a.cluster).len() == 3 {
                break;
            }
        }
        assert!(!a.fenced);
        let mut b_lease = lease::Lease::new(shared.path(), "b".into(), 10.0).unwrap();
        assert!(!b_lease.hold().unwrap(), "a holds it");
        lease::age_terms(shared.path(), 30.0);
        assert!(b_lease.hold().unwrap(), "expired: b takes over");
        let mut other = gen::job(2, "elastic", JobBase::Pending);
        other.admin_comment = Some("bftrainer:v1 1:4,role=core".into());
        other.priority = 0;
        a.cluster.add_job(other);
        let calls = a.cluster.calls.clone();
        for _ in 0..5 {
            now += 1.0;
            a.cycle(now).unwrap();
        }
        assert!(a.fenced);
        let c = &a.cluster.calls;
        assert_eq!(
            (c.submits, c.updates, c.cancels, c.requeues, c.signals),
            (
                calls.submits,
                calls.updates,
                calls.cancels,
                calls.requeues,
                calls.signals
            ),
            "the fenced daemon made no call"
        );
        let before = running_sats(&a.cluster);
        let mut b = Daemon::new(cfg, a.cluster, None, &[]).unwrap();
        b.lease = Some(b_lease);
        for _ in 0..10 {
            now += 1.0;
            b.cycle(now).unwrap();
        }
        assert!(!b.fenced);
        assert_eq!(b.stats.adopted_running, 1);
        assert_eq!(b.cluster.calls.requeues, calls.requeues);
        assert_eq!(core_of(&b.cluster).restart_count, 0);
        assert_eq!(running_sats(&b.cluster), before);
    }
}
