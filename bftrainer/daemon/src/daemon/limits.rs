//! Satellites count against their owner's association and QOS limits (MaxJobs,
//! GrpTRES, ...) like any job, and Slurm never preempts a job for a limit: a regular job
//! of the owner (or of an account-mate) that waits on such a limit would wait behind
//! the satellites. When one does, the elastic jobs whose satellites count against that
//! limit stop growing and give their satellites back (their cores stay); growth resumes
//! when no regular job waits on the limit any more.

use super::*;
use rustc_hash::FxHashSet;

/// How long a limit pause lasts before it is looked at again (renewed while a regular
/// job still waits on the limit; lifted as soon as none does).
pub const LIMIT_PAUSE_S: f64 = 300.0;

/// Whose jobs a limit counts: Slurm's pending reasons (job_reason_string) name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Scope {
    /// The association's per-user limits (AssocMax*): the same user and account.
    UserAccount,
    /// The association's group limits (AssocGrp*): every job of the account.
    Account,
    /// A QOS's per-user limits (QOSMax*PerUser*): the same user and QOS.
    UserQos,
    /// A QOS's per-account limits (QOSMax*PerAccount*): the same account and QOS.
    AccountQos,
    /// A QOS's group limits (QOSGrp*): every job of the QOS.
    Qos,
}

/// The scope of a pending reason that satellites can feed, or `None` (per-job limits,
/// and every other reason, which satellites do not affect).
pub(super) fn limit_scope(reason: &str) -> Option<Scope> {
    if reason.ends_with("PerJob") || reason.ends_with("PerJobLimit") {
        return None;
    }
    if reason.starts_with("AssocGrp") {
        Some(Scope::Account)
    } else if reason.starts_with("AssocMax") {
        Some(Scope::UserAccount)
    } else if reason.starts_with("QOSGrp") {
        Some(Scope::Qos)
    } else if reason.starts_with("QOSMax") && reason.contains("PerUser") {
        Some(Scope::UserQos)
    } else if reason.starts_with("QOSMax") && reason.contains("PerAcc") {
        Some(Scope::AccountQos)
    } else {
        None
    }
}

/// A regular job waiting on a limit that satellites can feed.
#[derive(Debug, Clone)]
pub(super) struct Limited {
    pub job_id: u32,
    pub uid: u32,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub reason: String,
    pub scope: Scope,
}

impl Limited {
    pub fn of(j: &Job) -> Option<Limited> {
        let reason = j.reason.as_deref()?;
        let scope = limit_scope(reason)?;
        Some(Limited {
            job_id: j.job_id,
            uid: j.user_id,
            account: j.account.clone(),
            qos: j.qos.clone(),
            reason: reason.to_string(),
            scope,
        })
    }

    /// What decides which core jobs it counts (the same for every job waiting on the
    /// same limit of the same user, account and QOS).
    pub fn key(&self) -> (Scope, u32, Option<String>, Option<String>) {
        (self.scope, self.uid, self.account.clone(), self.qos.clone())
    }

    /// Whether core job `c`'s satellites (its user and account, and `sat_qos`, the QOS
    /// they are submitted in: `[policy] satellite_qos`, else the core's) count against
    /// this limit. An unknown account or QOS matches: better a pause too many than a
    /// regular job kept waiting.
    pub fn counts(&self, c: &Job, sat_qos: Option<&str>) -> bool {
        let same = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let user = self.uid == c.user_id;
        let account = same(&self.account, &c.account);
        let qos = same(
            &self.qos,
            &sat_qos.map(str::to_string).or_else(|| c.qos.clone()),
        );
        match self.scope {
            Scope::UserAccount => user && account,
            Scope::Account => account,
            Scope::UserQos => user && qos,
            Scope::AccountQos => account && qos,
            Scope::Qos => qos,
        }
    }
}

impl<C: Cluster> Daemon<C> {
    /// Pauses and shrinks to their cores the elastic jobs whose satellites count against
    /// a limit a regular job waits on; lifts the pause once none waits. Reads the core
    /// jobs observe kept (`observe_copies`) and the regular jobs' scan.
    pub(super) fn observe_limits(&mut self, now: f64) {
        let limited: &[Limited] = self.regular.as_ref().map_or(&[], |r| &r.limited);
        if limited.is_empty() && self.limit_paused.is_empty() {
            return;
        }
        let mut hits: Vec<(u32, String)> = Vec::new();
        for c in &self.observe_copies {
            let Some(core) = self.cores.get(&c.job_id) else {
                continue;
            };
            if core.ended || !c.state.is_active() {
                continue;
            }
            let sat_qos = self.cfg.satellite_qos.as_deref();
            if let Some(l) = limited.iter().find(|l| l.counts(c, sat_qos)) {
                hits.push((
                    c.job_id,
                    format!("regular job {} waits on {}", l.job_id, l.reason),
                ));
            }
        }
        let hit_ids: FxHashSet<u32> = hits.iter().map(|(id, _)| *id).collect();
        // Lifted: no regular job waits on a limit it feeds any more.
        let lifted: Vec<u32> = self
            .limit_paused
            .keys()
            .copied()
            .filter(|id| !hit_ids.contains(id))
            .collect();
        for id in lifted {
            self.limit_paused.remove(&id);
            let Some(jid) = self.cores.get(&id).filter(|c| !c.ended).map(|c| c.jid) else {
                continue;
            };
            log::info!("elastic job {id}: no regular job waits on its owner's limits any more; it may grow again");
            // A pause of its own (`blame`) stays.
            let until = self.blame.paused(id, now).map(|s| s.until);
            if self.engine.job_status(jid) != JobStatus::Finished {
                self.emit(Event::JobPaused { job: jid, until });
            }
        }
        for (id, why) in hits {
            let Some(jid) = self.cores.get(&id).map(|c| c.jid) else {
                continue;
            };
            let renew = self.limit_paused.get(&id).map_or(true, |&u| u <= now);
            if renew {
                let until =
                    (now + LIMIT_PAUSE_S).max(self.blame.paused(id, now).map_or(now, |s| s.until));
                if !self.limit_paused.contains_key(&id) {
                    self.stats.limit_pauses += 1;
                    log::warn!(
                        "elastic job {id}: growth paused and satellites given back: {why} (its satellites count against that limit)"
                    );
                }
                self.limit_paused.insert(id, until);
                if self.engine.job_status(jid) != JobStatus::Finished {
                    self.emit(Event::JobPaused {
                        job: jid,
                        until: Some(until),
                    });
                }
            }
            // Its satellites go (reconcile ends what the engine no longer gives it);
            // the core stays.
            let anchors = self.engine.job_anchors(jid).to_vec();
            let extra: Vec<NodeId> = self
                .engine
                .job_nodes(jid)
                .iter()
                .copied()
                .filter(|n| !anchors.contains(n))
                .collect();
            for n in extra {
                self.emit(Event::WorkerLeft { job: jid, node: n });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_reasons_name_whose_jobs_a_limit_counts() {
        for (reason, scope) in [
            ("AssocMaxJobsLimit", Some(Scope::UserAccount)),
            ("AssocMaxCpuMinutesPerJobLimit", None),
            ("AssocMaxWallDurationPerJobLimit", None),
            ("AssocGrpCpuLimit", Some(Scope::Account)),
            ("AssocGrpJobsLimit", Some(Scope::Account)),
            ("AssocGrpNodeLimit", Some(Scope::Account)),
            ("QOSMaxJobsPerUserLimit", Some(Scope::UserQos)),
            ("QOSMaxCpuPerUserLimit", Some(Scope::UserQos)),
            ("QOSMaxJobsPerAccountLimit", Some(Scope::AccountQos)),
            ("QOSGrpNodeLimit", Some(Scope::Qos)),
            ("QOSMaxNodePerJobLimit", None),
            ("Resources", None),
            ("Priority", None),
            ("PartitionNodeLimit", None),
        ] {
            assert_eq!(limit_scope(reason), scope, "{reason}");
        }
    }

    #[test]
    fn a_limit_counts_the_jobs_of_its_scope() {
        let mut regular = gen::job(10, "batch", JobBase::Pending);
        regular.user_id = 1001;
        regular.account = Some("physics".into());
        regular.qos = Some("normal".into());
        regular.reason = Some("AssocMaxJobsLimit".into());
        let l = Limited::of(&regular).unwrap();
        let core = |uid: u32, account: &str| {
            let mut c = gen::job(1, "elastic", JobBase::Running);
            c.user_id = uid;
            c.account = Some(account.into());
            c.qos = Some("normal".into());
            c
        };
        assert!(l.counts(&core(1001, "physics"), None));
        assert!(
            !l.counts(&core(1001, "chemistry"), None),
            "another association"
        );
        assert!(!l.counts(&core(1002, "physics"), None), "another user");
        regular.reason = Some("AssocGrpCpuLimit".into());
        let l = Limited::of(&regular).unwrap();
        assert!(l.counts(&core(1002, "physics"), None), "an account-mate");
        assert!(!l.counts(&core(1002, "chemistry"), None));
        // A QOS limit: satellites count in the QOS they are submitted in, which under
        // `[policy] satellite_qos` is not the core's.
        regular.reason = Some("QOSGrpCpuLimit".into());
        let l = Limited::of(&regular).unwrap();
        assert!(
            l.counts(&core(1002, "chemistry"), None),
            "the core's QOS, normal"
        );
        assert!(!l.counts(&core(1002, "chemistry"), Some("elastic-sat")));
        regular.qos = Some("elastic-sat".into());
        let l = Limited::of(&regular).unwrap();
        assert!(l.counts(&core(1002, "chemistry"), Some("elastic-sat")));
        assert!(
            !l.counts(&core(1002, "chemistry"), None),
            "satellites in normal"
        );
        regular.reason = Some("Resources".into());
        assert!(Limited::of(&regular).is_none());
    }
}
