//! Admission order by Slurm's own priority factors. An elastic job waits held until
//! bftrainerd admits it, and Slurm gives a held job priority 0 and computes none for
//! it (priority/multifactor skips held jobs), so the daemon computes, for each waiting
//! job, the part of Slurm's multifactor priority that applies before a job runs, with
//! the site's weights: PriorityWeightFairshare x the fairshare factor of the job's
//! association + PriorityWeightQOS x its QOS's normalised priority +
//! PriorityWeightAge x its age (since submission, up to PriorityMaxAge). The engine
//! admits the highest first; among equal numbers (priority/basic gives everyone 0) the
//! user with the fewest active elastic jobs, then submit order.
//!
//! The factors are read from slurmctld at start and then every PriorityCalcPeriod
//! (at least every 30 s, at most every 10 min); a failed read keeps the last ones.

use super::*;
use bftrainer_slurm::{FairshareTable, PriorityWeights};

/// What the waiting jobs' priorities are computed from.
#[derive(Debug, Default, Clone)]
pub struct Inputs {
    pub weights: PriorityWeights,
    pub table: FairshareTable,
    /// When they were last read (cycle time), and whether a failure was logged.
    pub read_at: Option<f64>,
    pub warned: bool,
}

impl Inputs {
    /// Seconds between two reads: Slurm's PriorityCalcPeriod, within [30 s, 600 s].
    pub fn period_s(&self) -> f64 {
        f64::from(self.weights.calc_period_s).clamp(30.0, 600.0)
    }
}

/// The admission priority of the waiting (held) job `j` at `now`: 0 unless the site
/// runs priority/multifactor.
pub fn admission_priority(j: &Job, inputs: &Inputs, now: f64) -> u32 {
    let w = &inputs.weights;
    if !w.multifactor {
        return 0;
    }
    let age = match j.submit_time {
        Some(s) if w.max_age_s > 0 => ((now - s as f64) / f64::from(w.max_age_s)).clamp(0.0, 1.0),
        Some(_) => 1.0,
        None => 0.0,
    };
    let fs = inputs
        .table
        .fairshare(j.account.as_deref(), j.user_name.as_deref());
    let qos = inputs.table.qos_norm(j.qos.as_deref());
    let p = f64::from(w.age) * age + f64::from(w.fairshare) * fs + f64::from(w.qos) * qos;
    // Slurm's priority is a u32 too; 0 is kept for "no number" (held).
    p.round().clamp(1.0, f64::from(u32::MAX - 1)) as u32
}

impl<C: Cluster> Daemon<C> {
    /// Re-reads the priority factors when due, and sends the engine the new
    /// priority of every waiting job whose number changed.
    pub(super) fn refresh_priorities(&mut self, now: f64) {
        let due = match self.prio.read_at {
            None => true,
            Some(t) => now - t >= self.prio.period_s() || now < t,
        };
        if !due {
            return;
        }
        self.prio.read_at = Some(now);
        match self.cluster.priority_inputs() {
            Ok((weights, table)) => {
                if self.prio.warned {
                    log::info!("Slurm's priority factors can be read again");
                }
                self.prio.weights = weights;
                self.prio.table = table;
                self.prio.warned = false;
            }
            Err(e) => {
                self.stats.slurm_errors += 1;
                if !self.prio.warned {
                    self.prio.warned = true;
                    self.error(format!(
                        "cannot read Slurm's priority factors ({e}); waiting jobs keep their last priority"
                    ));
                }
                return;
            }
        }
        if !self.prio.weights.multifactor {
            return;
        }
        self.send_user_weights();
        let waiting: Vec<(u32, JobId)> = self
            .cores
            .iter()
            .filter(|(_, c)| !c.ended && self.engine.job_status(c.jid) == JobStatus::Queued)
            .map(|(&id, c)| (id, c.jid))
            .collect();
        for (id, jid) in waiting {
            let Some(j) = self.cluster.jobs().iter().find(|j| j.job_id == id) else {
                continue;
            };
            if !j.is_held() {
                continue;
            }
            let p = admission_priority(j, &self.prio, now);
            if self.engine.job_spec(jid).priority != p {
                self.emit(Event::JobPriority {
                    job: jid,
                    priority: p,
                });
            }
        }
    }

    /// Sends the engine each elastic user's share weight (docs/admin.md, "Fair
    /// shares"): the fairshare factor of the user's association, the highest over the
    /// accounts their live elastic jobs charge, where it changed. A user whose factor
    /// Slurm does not know weighs `fair::MIN_WEIGHT`, as a factor of 0 does.
    fn send_user_weights(&mut self) {
        let mut weights: HashMap<u32, f64> = HashMap::new();
        for j in self.cluster.jobs() {
            let live = self.cores.get(&j.job_id).is_some_and(|c| {
                !c.ended
                    && !matches!(
                        self.engine.job_status(c.jid),
                        JobStatus::Finished | JobStatus::Cancelled
                    )
            });
            if !live {
                continue;
            }
            let fs = self
                .prio
                .table
                .fairshare(j.account.as_deref(), j.user_name.as_deref());
            let w = weights.entry(j.user_id).or_insert(fs);
            *w = w.max(fs);
        }
        let mut changed: Vec<(u32, f64)> = weights
            .into_iter()
            .filter(|&(u, w)| self.engine.user_weight(u) != Some(w))
            .collect();
        changed.sort_by_key(|x| x.0);
        for (user, weight) in changed {
            self.emit(Event::UserWeight { user, weight });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::gen;

    fn inputs() -> Inputs {
        let mut t = FairshareTable::default();
        t.users.insert(("proj".into(), "ann".into()), 0.9);
        t.users.insert(("proj".into(), "bob".into()), 0.1);
        t.qos.insert("normal".into(), 0);
        t.qos.insert("high".into(), 100);
        Inputs {
            weights: PriorityWeights {
                multifactor: true,
                age: 1000,
                fairshare: 10_000,
                qos: 5000,
                max_age_s: 7 * 86_400,
                calc_period_s: 300,
            },
            table: t,
            read_at: None,
            warned: false,
        }
    }

    fn held(user: &str, qos: &str, submit: i64) -> Job {
        let mut j = gen::job(1, "elastic", JobBase::Pending);
        j.priority = 0;
        j.user_name = Some(user.into());
        j.account = Some("proj".into());
        j.qos = Some(qos.into());
        j.submit_time = Some(submit);
        j
    }

    #[test]
    fn fairshare_qos_and_age_with_the_sites_weights() {
        let i = inputs();
        let now = 1_000_000.0;
        let ann = admission_priority(&held("ann", "normal", 1_000_000), &i, now);
        let bob = admission_priority(&held("bob", "normal", 1_000_000), &i, now);
        assert_eq!((ann, bob), (9000, 1000), "fairshare x its weight");
        // Bob's QOS outweighs Ann's fairshare lead; a week of waiting adds the age weight.
        assert_eq!(
            admission_priority(&held("bob", "high", 1_000_000), &i, now),
            6000
        );
        let week = 7.0 * 86_400.0;
        assert_eq!(
            admission_priority(&held("bob", "normal", 1_000_000), &i, now + 2.0 * week),
            2000,
            "the age factor stops at PriorityMaxAge"
        );
        // Unknown association or QOS: those terms are 0, never a failure.
        assert_eq!(
            admission_priority(&held("eve", "gold", 1_000_000), &i, now),
            1
        );
        // priority/basic: no number, submit order decides.
        let basic = Inputs {
            weights: PriorityWeights::default(),
            ..inputs()
        };
        assert_eq!(admission_priority(&held("ann", "high", 0), &basic, now), 0);
    }

    #[test]
    fn the_read_period_follows_priority_calc_period_within_bounds() {
        let mut i = inputs();
        assert_eq!(i.period_s(), 300.0);
        i.weights.calc_period_s = 1;
        assert_eq!(i.period_s(), 30.0);
        i.weights.calc_period_s = 86_400;
        assert_eq!(i.period_s(), 600.0);
    }
}
