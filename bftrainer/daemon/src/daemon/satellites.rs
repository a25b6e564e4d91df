//! Satellites: one Slurm job per node a job holds beyond its core. Their lives
//! (joined, preempted, failed) become engine events; failures are charged by `blame`;
//! they are submitted (grow) and signalled then cancelled (shrink) here.

use super::*;

impl<C: Cluster> Daemon<C> {
    pub(super) fn observe_satellite(&mut self, j: &observe::SatJob, parent: u32, now: f64) {
        let node_name = &j.node;
        let node = self.satellite_node(j.job_id, node_name);
        let jid = self.cores.get(&parent).map(|c| c.jid);
        let memo = self.sats.entry(j.job_id).or_default();
        memo.parent = parent;
        memo.node.clone_from(node_name);
        let held = |d: &Self| match (jid, node) {
            (Some(jid), Some(n)) => d.engine.node_state(n) == NodeState::Held(jid),
            _ => false,
        };
        if memo.done {
            return;
        }
        if !j.state.is_active() {
            memo.done = true;
            let ending = memo.ending;
            let was_preempted = memo.preempted;
            if ending || was_preempted {
                return;
            }
            let (Some(jid), Some(n)) = (jid, node) else {
                return;
            };
            if j.state.base() == JobBase::Preempted || j.preempt_time.is_some() {
                self.reclaimed.insert(n, now);
                if held(self) {
                    log::info!(
                        "satellite {} of job {parent} on {node_name}: preempted by a regular job",
                        j.job_id
                    );
                    self.stats.preemptions += 1;
                    self.emit(Event::WorkerPreempted { job: jid, node: n });
                }
                return;
            }
            if j.state.base() == JobBase::NodeFail {
                // Slurm took the node down; it decides when it returns (no set-aside).
                if held(self) {
                    log::info!(
                        "satellite {} of job {parent} on {node_name}: the node failed",
                        j.job_id
                    );
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
                return;
            }
            let ran = match (j.start_time, j.end_time) {
                (Some(s), Some(e)) if s > 0 => (e - s) as f64,
                _ => 0.0,
            };
            // A failure of the node: the satellite failed, or ended at once. Cancelled
            // (by its owner or an admin) is not the node's fault, nor is an end while its
            // parent is over, done training or no longer running (the runtime's agents
            // stop then), nor
            // the end of one whose node the allocation no longer gives its parent (a
            // shrink that a restart interrupted: the memo of it is gone, the journal's
            // allocation is not).
            let parent_running = self
                .cores
                .get(&parent)
                .is_some_and(|c| !c.ended && !c.trained)
                && self.engine.job_status(jid) == JobStatus::Active;
            let failed = parent_running
                && held(self)
                && match j.state.base() {
                    JobBase::Cancelled => false,
                    JobBase::Complete => ran < self.cfg.satellite_min_runtime_s,
                    _ => true,
                };
            if failed {
                let reason = format!(
                    "satellite {} of job {parent} ended {} after {ran:.0} s",
                    j.job_id,
                    j.state.name()
                );
                self.satellite_failed(parent, j.user_id, n, reason, now);
            }
            if held(self) {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
            return;
        }
        if matches!(j.state.base(), JobBase::Running | JobBase::Suspended) {
            if j.preempt_time.is_some() {
                if !memo.preempted {
                    memo.preempted = true;
                    if let (Some(jid), Some(n)) = (jid, node) {
                        if held(self) {
                            log::info!(
                                "satellite {} of job {parent} on {node_name}: preempted by a regular job",
                                j.job_id
                            );
                            self.stats.preemptions += 1;
                            self.emit(Event::WorkerPreempted { job: jid, node: n });
                        }
                    }
                }
                return;
            }
            if !memo.joined {
                memo.joined = true;
                if let (Some(jid), Some(n)) = (jid, node) {
                    if held(self) {
                        self.emit(Event::WorkerJoined { job: jid, node: n });
                    }
                }
            }
            if let (Some(n), Some(start)) = (node, j.start_time) {
                if now - self.slurm_t(start) >= self.cfg.satellite_min_runtime_s {
                    self.blame.ran(parent, n, now);
                    if let Some(sa) = self.set_aside.get_mut(&n) {
                        if sa.until <= now {
                            sa.failures = 0;
                        }
                    }
                }
            }
            return;
        }
        // Pending too long: this growth failed. A satellite pinned to an idle node
        // that does not start waits on its job (held by its owner, its QOS or
        // association limits, a request the node cannot meet), never on the node
        // alone: the job is paused, the node stays in the pool. One that waited through
        // a slurmctld outage is nobody's fault.
        // Counted from when this daemon first saw it pending, not from Slurm's
        // SubmitTime: a clock stepped or skewed against slurmctld's would cancel and
        // charge it at once (the daemon submits it itself: the two differ by a poll).
        let submitted = *memo.pending_seen.get_or_insert(now);
        let waited = now - submitted;
        if !memo.ending && waited > self.cfg.grow_timeout_s {
            memo.ending = true;
            let why = j.reason.as_deref().unwrap_or("no reason").to_string();
            log::warn!(
                "satellite {} of job {parent} did not start on {node_name} within {} s ({why}); cancelling it",
                j.job_id,
                self.cfg.grow_timeout_s,
            );
            memo.signalled_at = Some(now);
            self.call(|c| c.cancel(j.job_id), "cancel", j.job_id);
            // Slurm's reasons that name the partition, not the job: any job's satellite
            // would wait alike.
            let cluster_wide = matches!(
                why.as_str(),
                "PartitionDown" | "PartitionInactive" | "SystemFailure"
            );
            if cluster_wide {
                self.stats.cluster_refusals += 1;
                self.hold_growth(format!("a satellite waited on {node_name} ({why})"), now);
            } else if self.outage_ended >= submitted || self.outage_since.is_some() {
                log::info!(
                    "satellite {} of job {parent} waited through a slurmctld outage: not charged",
                    j.job_id
                );
            } else {
                self.job_failed(
                    parent,
                    format!(
                        "satellite {} did not start on {node_name} within {} s ({why})",
                        j.job_id, self.cfg.grow_timeout_s
                    ),
                    now,
                );
            }
            if let (Some(jid), Some(n)) = (jid, node) {
                if self.engine.node_state(n) == NodeState::Held(jid) {
                    self.emit(Event::WorkerLeft { job: jid, node: n });
                }
            }
        }
    }

    pub(super) fn blame_cfg(&self) -> blame::BlameConfig {
        blame::BlameConfig {
            job_backoff_s: self.cfg.job_backoff_s,
            node_blame_users: self.cfg.node_blame_users,
            max_backoff_s: MAX_BACKOFF_S,
            memory_s: MAX_BACKOFF_S,
        }
    }

    /// A growth of core job `parent` failed for reasons of its own: pause the job
    /// (it keeps what it holds; the pool goes to others), never a node.
    pub(super) fn job_failed(&mut self, parent: u32, reason: String, now: f64) {
        self.stats.satellite_failures += 1;
        let cfg = self.blame_cfg();
        let v = self.blame.job_failed(&cfg, parent, reason, now);
        self.apply_verdict(parent, None, v, now);
    }

    /// A satellite of `parent` (owner `uid`) ran on `n` and failed: its job's fault,
    /// or the node's once several users failed there.
    pub(super) fn satellite_failed(
        &mut self,
        parent: u32,
        uid: u32,
        n: NodeId,
        reason: String,
        now: f64,
    ) {
        self.stats.satellite_failures += 1;
        let cfg = self.blame_cfg();
        let v = self
            .blame
            .satellite_failed(&cfg, parent, uid, n, reason.clone(), now);
        self.apply_verdict(parent, Some((n, reason)), v, now);
    }

    pub(super) fn apply_verdict(
        &mut self,
        parent: u32,
        node: Option<(NodeId, String)>,
        v: blame::Verdict,
        now: f64,
    ) {
        match v {
            blame::Verdict::Node { users } => {
                if let Some((n, reason)) = node {
                    self.node_failed(
                        n,
                        format!("satellites of {users} users failed there, the last: {reason}"),
                        now,
                    );
                }
            }
            blame::Verdict::Job { until, renewed } => {
                let Some(jid) = self.cores.get(&parent).map(|c| c.jid) else {
                    return;
                };
                if renewed {
                    let s = self.blame.paused(parent, now);
                    log::warn!(
                        "elastic job {parent}: growth paused for {:.0} s (failure {}): {}",
                        until - now,
                        s.map_or(0, |s| s.failures),
                        s.map_or("", |s| s.reason.as_str())
                    );
                    self.stats.job_pauses += 1;
                }
                if self.engine.job_status(jid) != JobStatus::Finished {
                    self.emit(Event::JobPaused {
                        job: jid,
                        until: Some(until),
                    });
                }
            }
        }
    }

    pub(super) fn node_failed(&mut self, n: NodeId, reason: String, now: f64) {
        let e = self.set_aside.entry(n).or_insert(SetAside {
            failures: 0,
            until: f64::NEG_INFINITY,
            reason: String::new(),
        });
        e.failures += 1;
        let wait =
            (self.cfg.node_backoff_s * 2f64.powi(e.failures.min(30) as i32 - 1)).min(MAX_BACKOFF_S);
        e.until = now + wait;
        e.reason = reason;
        log::warn!(
            "node {}: set aside for {wait:.0} s (failure {}): {}",
            self.nodes[n as usize].name,
            e.failures,
            e.reason
        );
    }

    /// Holds every job's growth after a cluster-wide refusal: from `job_backoff`,
    /// doubling per refusal in a row, at most `GROWTH_HOLD_MAX_S`.
    pub(super) fn hold_growth(&mut self, reason: String, now: f64) {
        let refusals = self.growth_held.as_ref().map_or(0, |g| g.refusals) + 1;
        let wait = (self.cfg.job_backoff_s * 2f64.powi(refusals.min(30) as i32 - 1))
            .min(GROWTH_HOLD_MAX_S);
        self.error(format!(
            "{reason}: a refusal of the cluster, charged to no job; growth held for {wait:.0} s (refusal {refusals} in a row)"
        ));
        self.growth_held = Some(view::GrowthHeld {
            until: now + wait,
            refusals,
            reason,
        });
    }

    /// Whether growth is held now (cluster-wide refusals).
    pub(super) fn growth_is_held(&self, now: f64) -> bool {
        self.growth_held.as_ref().is_some_and(|g| g.until > now)
    }

    pub(super) fn end_satellite(
        &mut self,
        s: &Job,
        parent: u32,
        node: &str,
        grace: &HashMap<String, f64>,
        now: f64,
    ) -> usize {
        let id = s.job_id;
        let step = self.cores.get(&parent).map_or(0.0, |c| c.step_s);
        let deadline = shrink_deadline(self.cfg.shrink_grace_s, self.cfg.shrink_grace_max_s, step);
        let memo = self.sats.entry(id).or_default();
        if s.state.base() == JobBase::Pending {
            if memo.ending && memo.signalled_at.is_some_and(|t| now - t < 5.0) {
                return 0;
            }
            memo.ending = true;
            memo.signalled_at = Some(now);
            log::info!("cancel pending satellite {id} of job {parent} on {node}");
            self.call(|c| c.cancel(id), "cancel", id);
            return 1;
        }
        if s.preempt_time.is_some() {
            // Slurm preempts it: cancel at the end of the grace time, not at its
            // next periodic pass (up to 30 s later). The grace counts from when this
            // daemon saw the preemption (at most a poll after Slurm's PreemptTime),
            // not from Slurm's clock.
            let pt = *memo.preempt_seen.get_or_insert(now);
            memo.ending = true;
            let g = s
                .partition
                .as_deref()
                .and_then(|p| grace.get(p))
                .copied()
                .unwrap_or(0.0);
            if now >= pt + g && memo.signalled_at.map_or(true, |t| now - t >= 2.0) {
                memo.signalled_at = Some(now);
                log::info!("cancel satellite {id} of job {parent} on {node}: its preemption grace time is over");
                self.call(|c| c.cancel(id), "cancel", id);
                return 1;
            }
            return 0;
        }
        match memo.signalled_at {
            None => {
                memo.signalled_at = Some(now);
                memo.cancel_after = Some(deadline);
                memo.ending = true;
                self.stats.shrinks += 1;
                let why = if step > 0.0 {
                    format!(" (steps of {} s)", round1(step))
                } else {
                    String::new()
                };
                log::info!(
                    "shrink job {parent} off {node}: SIGTERM to satellite {id}, cancelled after {} s{why}",
                    round1(deadline)
                );
                self.call(
                    |c| c.signal(id, libc::SIGTERM, SignalTarget::StepsOnly),
                    "signal",
                    id,
                );
                1
            }
            Some(t) if now - t >= memo.cancel_after.unwrap_or(self.cfg.shrink_grace_s) => {
                memo.signalled_at = Some(now);
                log::info!("cancel satellite {id} of job {parent} on {node} (shrink grace over)");
                self.call(|c| c.cancel(id), "cancel", id);
                1
            }
            Some(_) => 0,
        }
    }

    pub(super) fn submit_satellite(
        &mut self,
        parent: u32,
        core_job: &Job,
        node: &str,
        n: NodeId,
        now: f64,
    ) {
        let (uid, gid) = {
            let c = &self.cores[&parent];
            (c.uid, c.gid)
        };
        let join = self
            .cfg
            .join_command
            .replace("{parent}", &parent.to_string());
        // The work runs in a step, so a preemption's SIGTERM (Slurm signals steps, not
        // the batch shell) reaches it and this shell follows it out at once. A step
        // ended by SIGTERM (shrink, preemption) is a clean end of a satellite. The step
        // takes every CPU and GPU the satellite holds on its node (a step gets no GPU
        // unless it asks), as the core job's agents' step does. No --kill-on-bad-exit
        // (one task: nothing else to kill): with it, srun answers the task's death by
        // SIGTERM with a SIG_TERM_KILL cancel of the step, whose handler in slurmstepd
        // sleeps KillWait, and slurmstepd then lingers up to 3 s
        // (STEPD_MESSAGE_COMP_WAIT) waiting for that handler; when slurmd's terminate
        // of the job sees it, the node stays COMPLETING that long and the regular job
        // that preempted the satellite waits (measured 2-3 s in half the rounds;
        // docs/benchmarks.md, "What harvesting costs a regular job").
        let script = format!(
            "#!/bin/sh\n# bftrainer satellite of job {parent} on {node}\n\
             srun --ntasks=1 --nodes=1 \
             ${{SLURM_CPUS_ON_NODE:+--cpus-per-task=$SLURM_CPUS_ON_NODE}} \
             ${{SLURM_GPUS_ON_NODE:+--gres=gpu:$SLURM_GPUS_ON_NODE}} {join}\n\
             rc=$?\n\
             if [ $rc -eq 0 ] || [ $rc -eq 143 ]; then exit 0; fi\n\
             exit $rc\n"
        );
        // Other SPANK plugins' options of the core (its container image...), which
        // job_submit/bftrainer put into its tag: the satellite gets them as sbatch would
        // have set them, so those plugins act on the grown node as on the core's. A tag
        // whose options cannot be read (written by hand) grows nothing: workers would run
        // outside the core's container.
        let carried = match core_job
            .admin_comment
            .as_deref()
            .map(bftrainer_core::spankopt::from_tag)
            .unwrap_or(Ok(Vec::new()))
        {
            Ok(c) => c,
            Err(e) => {
                self.error(format!(
                    "grow job {parent} onto {node}: not submitting its satellite: {e}"
                ));
                self.job_failed(parent, format!("its tag's SPANK options: {e}"), now);
                return;
            }
        };
        let (carried_spank, carried_env) = bftrainer_core::spankopt::satellite_entries(&carried);
        let tag_spec = format!("1:1,role=satellite,parent={parent}");
        let mut env = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            (spec::env::PARENT_JOB_ID.into(), parent.to_string()),
            (spec::env::ROLE.into(), "satellite".into()),
        ];
        env.extend(carried_env);
        let mut spank_env = vec![(spec::JOB_ENV_NAME.to_string(), tag_spec)];
        spank_env.extend(carried_spank);
        let mut job = BatchJob {
            script,
            name: Some(satellite_name(parent)),
            partition: Some(self.cfg.satellite_partition.clone()),
            // Charged like the core job (sacct, sreport, QOS limits, fairshare).
            account: core_job.account.clone(),
            min_nodes: Some(1),
            max_nodes: Some(1),
            node_list: Some(node.to_string()),
            time_limit: core_job.time_limit,
            admin_comment: Some(satellite_tag(parent)),
            comment: Some(format!("bftrainer: satellite of elastic job {parent}")),
            env,
            work_dir: core_job
                .work_dir
                .clone()
                .map(Into::into)
                .or_else(|| Some("/tmp".into())),
            output: Some(self.cfg.satellite_output.clone()),
            run_as: Some((uid, gid)),
            requeue: Some(false),
            exclusive: true,
            spank_env,
            // The core job's per-node request, as Slurm holds it: the satellite gets on
            // its node what the core's nodes have (GPUs with the job's GRES, its
            // constraint, memory, QOS and task shape).
            qos: self
                .cfg
                .satellite_qos
                .clone()
                .or_else(|| core_job.qos.clone()),
            constraint: core_job.constraint.clone(),
            mem_per_node_mb: core_job.mem_per_node_mb,
            mem_per_cpu_mb: core_job.mem_per_cpu_mb,
            tres_per_node: core_job.tres_per_node.clone(),
            tres_per_task: core_job.tres_per_task.clone(),
            ntasks_per_node: core_job.ntasks_per_node,
            cpus_per_task: core_job.cpus_per_task,
            ..Default::default()
        };
        let slot = self.is_gpu_slot(n);
        if slot {
            // One GPU of a node regular jobs share (`gpulend`).
            self.gpu_satellite_shape(node, core_job, &mut job);
        }
        match self.cluster.submit(&job) {
            Ok(sid) => {
                if let Some(g) = self.growth_held.take() {
                    log::info!(
                        "Slurm takes satellites again: growth resumes after {} cluster-wide refusals",
                        g.refusals
                    );
                }
                self.stats.grows += 1;
                self.sats.insert(
                    sid,
                    SatMemo {
                        parent,
                        node: job.node_list.clone().unwrap_or_default(),
                        slot: slot.then_some(n),
                        ..Default::default()
                    },
                );
                log::info!("grow job {parent} onto {node}: satellite {sid}");
            }
            Err(e) if e.is_cluster_wide() => {
                // Refused for a reason of the cluster (MaxJobCount, the satellite
                // partition down or inactive, slurmdbd unreachable...): any job's
                // satellite would be refused alike. No job is charged; growth holds,
                // with backoff, for every job.
                self.stats.slurm_errors += 1;
                self.stats.cluster_refusals += 1;
                self.hold_growth(format!("Slurm refused a satellite on {node}: {e}"), now);
            }
            Err(e) if e.is_unreachable() => {
                // slurmctld did not answer: nobody's fault; the next cycle retries.
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "grow job {parent} onto {node}: slurmctld did not take the satellite ({e}); retrying next cycle"
                ));
            }
            Err(e) => {
                // Refused by Slurm: the job's QOS or limits (MaxSubmitJobs, a time limit
                // over the satellite partition's MaxTime...), or the config (a missing
                // partition): the job's growth pauses; the node stays in the pool.
                self.stats.slurm_errors += 1;
                self.error(format!(
                    "grow job {parent} onto {node}: Slurm refused the satellite: {e}"
                ));
                self.job_failed(parent, format!("Slurm refused its satellite: {e}"), now);
                let _ = n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::tests::four_nodes_one_held_core;

    fn grow(d: &mut Daemon<gen::GenCluster>, cycles: u32) -> f64 {
        let mut now = 3_000_000_000.0;
        for _ in 0..cycles {
            now += 1.0;
            d.cluster.start_pending_elastic(now as i64);
            d.cycle(now).unwrap();
        }
        now
    }

    #[test]
    fn satellites_carry_the_options_of_other_spank_plugins_in_the_core_tag() {
        let (mut cluster, cfg, _state) = four_nodes_one_held_core("");
        cluster.jobs[0].admin_comment = Some(
            "bftrainer:v1 spank:pyxis_container_image=nvcr.io%23nvidia/pytorch%3A24.01,pyxis_container_mount_home= 1:4,role=core".into(),
        );
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        grow(&mut d, 10);
        assert!(d.stats.grows >= 1, "no satellite submitted");
        let (spank, env) = d.cluster.last_submit_env.clone().unwrap();
        let image = "nvcr.io#nvidia/pytorch:24.01".to_string();
        assert_eq!(
            spank,
            vec![
                (
                    "BFTRAINER_ELASTIC".into(),
                    "1:1,role=satellite,parent=1".into()
                ),
                (
                    "_SLURM_SPANK_OPTION_pyxis_container_image".into(),
                    image.clone()
                ),
                (
                    "_SLURM_SPANK_OPTION_pyxis_container_mount_home".into(),
                    String::new()
                ),
            ]
        );
        for var in [
            "_SLURM_SPANK_OPTION_pyxis_container_image",
            "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image",
        ] {
            assert!(
                env.contains(&(var.into(), image.clone())),
                "{var} not in {env:?}"
            );
        }
        // The satellite's own tag and identity are bftrainerd's, whatever is carried.
        let sat = d
            .cluster
            .jobs
            .iter()
            .find(|j| j.name == satellite_name(1))
            .unwrap();
        assert_eq!(
            sat.admin_comment.as_deref(),
            Some(satellite_tag(1).as_str())
        );
        assert_eq!(sat.partition.as_deref(), Some("elastic-sat"));
    }

    #[test]
    fn a_tag_whose_spank_options_do_not_read_grows_nothing_and_pauses_the_job() {
        let (mut cluster, cfg, _state) = four_nodes_one_held_core("");
        // Written by hand (only privileged uids write tags): a raw control byte.
        cluster.jobs[0].admin_comment =
            Some("bftrainer:v1 spank:pyxis_container_image=a%0Ab 1:4,role=core".into());
        let mut d = Daemon::new(cfg, cluster, None, &[]).unwrap();
        let now = grow(&mut d, 10);
        assert_eq!(d.stats.grows, 0, "a satellite was submitted");
        assert!(d.cluster.jobs.iter().all(|j| j.name != satellite_name(1)));
        assert!(d.stats.job_pauses >= 1);
        let why = d
            .blame
            .paused(1, now)
            .map(|s| s.reason.clone())
            .unwrap_or_default();
        assert!(
            why.contains("its tag's SPANK options: SPANK option pyxis_container_image: its value holds a control character"),
            "{why}"
        );
        // The core itself was admitted and runs.
        assert_eq!(d.cluster.jobs[0].state.base(), JobBase::Running);
    }
}
