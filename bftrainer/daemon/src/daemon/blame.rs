//! Who a failed growth is charged to: the job first, a node only on evidence from
//! several users.
//!
//! A satellite can fail for reasons of its job (a bogus coordinator address in the
//! Comment, a broken environment, its QOS or limits, a satellite its owner holds) or of
//! its node (a broken node). Charging the node sets it aside for every job, so a single
//! user could close the pool to everyone by making their own satellites fail. Here a
//! failure pauses the growth of *that job* (it keeps what it holds; doubling backoff),
//! and a node is set aside only when satellites of `node_blame_users` different users
//! failed on it without a success there in between. Failures that are nobody's (slurmctld
//! unreachable, an outage while a satellite waited) are not charged at all.
//!
//! A user's failure is evidence against a node only when their job is not the
//! explanation: one of its satellites ran elsewhere (`ran`) and it failed on no other
//! node, both within `memory_s`. A job whose satellites fail everywhere, or that never
//! ran one, explains its own failures (its Comment, its environment, its script), so
//! two users with broken jobs, or one user with two accounts and jobs that never
//! worked, cannot close a node. What remains (docs/admin.md, "Who is charged"): users
//! whose jobs run elsewhere and fail on purpose on one chosen node (a script that
//! checks its host name), from `node_blame_users` accounts, can still set that node
//! aside, each time for the node's backoff, while their own jobs' growth pauses.

use bftrainer_core::engine::NodeId;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The settings (from `[daemon]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlameConfig {
    /// First pause of a job whose growth failed; doubles per failure.
    pub job_backoff_s: f64,
    /// A node is set aside after failures of this many different users' satellites.
    pub node_blame_users: u32,
    /// The longest pause and the longest set-aside.
    pub max_backoff_s: f64,
    /// A user's failure on a node is forgotten after this long.
    pub memory_s: f64,
}

/// A job's growth failures.
#[derive(Debug, Clone, Serialize)]
pub struct JobStrikes {
    pub failures: u32,
    /// Growth paused until then.
    pub until: f64,
    pub reason: String,
}

/// What a satellite failure led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The job's growth is paused until `until` (the same pause again when `renewed` is
    /// false: failures already charged in this pause do not double it).
    Job { until: f64, renewed: bool },
    /// Enough users failed there: the node is at fault (set it aside).
    Node { users: usize },
}

/// Where a job's satellites ran and failed lately: whether its failures on a node
/// can be the node's.
#[derive(Debug, Default)]
struct Record {
    ran_on: HashMap<NodeId, f64>,
    failed_on: HashMap<NodeId, f64>,
}

impl Record {
    fn forget_before(&mut self, t: f64) {
        self.ran_on.retain(|_, s| *s > t);
        self.failed_on.retain(|_, s| *s > t);
    }

    /// Its failure on `node` is no evidence against the node: it never ran elsewhere,
    /// or it failed elsewhere too.
    fn explains_failure_on(&self, node: NodeId) -> bool {
        !self.ran_on.keys().any(|&n| n != node) || self.failed_on.keys().any(|&n| n != node)
    }
}

#[derive(Debug, Default)]
pub struct Blame {
    /// By Slurm job id of the core job.
    jobs: HashMap<u32, JobStrikes>,
    /// By Slurm job id of the core job: where its satellites ran and failed.
    records: HashMap<u32, Record>,
    /// Per node: the users whose satellites failed there, and when last.
    nodes: HashMap<NodeId, BTreeMap<u32, f64>>,
}

impl Blame {
    /// A failure that is the job's own, never the node's: its satellite could not be
    /// submitted (QOS, limits, partition) or did not start in time.
    pub fn job_failed(&mut self, cfg: &BlameConfig, job: u32, reason: String, now: f64) -> Verdict {
        let s = self.jobs.entry(job).or_insert(JobStrikes {
            failures: 0,
            until: f64::NEG_INFINITY,
            reason: String::new(),
        });
        s.reason = reason;
        if s.until > now {
            // Already paused: the satellites of one growth failing together are one
            // failure.
            return Verdict::Job {
                until: s.until,
                renewed: false,
            };
        }
        s.failures += 1;
        let wait =
            (cfg.job_backoff_s * 2f64.powi(s.failures.min(30) as i32 - 1)).min(cfg.max_backoff_s);
        s.until = now + wait;
        Verdict::Job {
            until: s.until,
            renewed: true,
        }
    }

    /// A satellite of `job` (owned by `uid`) ran and failed on `node`: the node's fault
    /// once `node_blame_users` different users failed there with jobs that do not
    /// explain their failures (`Record::explains_failure_on`), else the job's. With
    /// `node_blame_users = 1` (an administrator who trusts every user) any failure is
    /// the node's.
    pub fn satellite_failed(
        &mut self,
        cfg: &BlameConfig,
        job: u32,
        uid: u32,
        node: NodeId,
        reason: String,
        now: f64,
    ) -> Verdict {
        let rec = self.records.entry(job).or_default();
        rec.forget_before(now - cfg.memory_s);
        let explained = rec.explains_failure_on(node);
        rec.failed_on.insert(node, now);
        if explained && cfg.node_blame_users > 1 {
            return self.job_failed(cfg, job, reason, now);
        }
        let users = self.nodes.entry(node).or_default();
        users.retain(|_, t| now - *t < cfg.memory_s);
        users.insert(uid, now);
        let n = users.len();
        if n >= cfg.node_blame_users.max(1) as usize {
            users.clear();
            return Verdict::Node { users: n };
        }
        self.job_failed(cfg, job, reason, now)
    }

    /// A satellite of `job` ran long enough on `node`: both work. The job's failures
    /// start over (its current pause, if any, runs out), and so do the node's.
    pub fn ran(&mut self, job: u32, node: NodeId, now: f64) {
        if let Some(s) = self.jobs.get_mut(&job) {
            s.failures = 0;
        }
        self.records
            .entry(job)
            .or_default()
            .ran_on
            .insert(node, now);
        self.nodes.remove(&node);
    }

    /// The job's strikes while it is paused.
    pub fn paused(&self, job: u32, now: f64) -> Option<&JobStrikes> {
        self.jobs.get(&job).filter(|s| s.until > now)
    }

    /// Users whose satellites failed on `node` and are still remembered.
    pub fn node_users(&self, node: NodeId) -> usize {
        self.nodes.get(&node).map_or(0, BTreeMap::len)
    }

    /// Jobs paused now (for metrics).
    pub fn paused_jobs(&self, now: f64) -> usize {
        self.jobs.values().filter(|s| s.until > now).count()
    }

    /// Forgets an ended job.
    pub fn forget(&mut self, job: u32) {
        self.jobs.remove(&job);
        self.records.remove(&job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: BlameConfig = BlameConfig {
        job_backoff_s: 60.0,
        node_blame_users: 2,
        max_backoff_s: 3600.0,
        memory_s: 3600.0,
    };

    #[test]
    fn one_users_failures_pause_their_job_never_the_node() {
        let mut b = Blame::default();
        // Job 7 of uid 1000 fails on nodes 0, 1, 2 in one growth: one pause of 60 s.
        for n in 0..3 {
            let v = b.satellite_failed(&CFG, 7, 1000, n, "exit 3".into(), 10.0);
            assert_eq!(
                v,
                Verdict::Job {
                    until: 70.0,
                    renewed: n == 0
                }
            );
        }
        // Another job of the same user on node 0: still that user's, still not the node's.
        let v = b.satellite_failed(&CFG, 8, 1000, 0, "exit 3".into(), 11.0);
        assert!(matches!(v, Verdict::Job { .. }), "{v:?}");
        // Job 7 never ran a satellite: its failures are no evidence against a node.
        assert_eq!(b.node_users(0), 0);
        // After the pause, job 7 fails again: the pause doubles.
        let v = b.satellite_failed(&CFG, 7, 1000, 0, "exit 3".into(), 80.0);
        assert_eq!(
            v,
            Verdict::Job {
                until: 200.0,
                renewed: true
            }
        );
        assert!(b.paused(7, 100.0).is_some() && b.paused(7, 200.0).is_none());
        // A satellite of job 7 runs: its failures start over.
        b.ran(7, 3, 290.0);
        let v = b.satellite_failed(&CFG, 7, 1000, 0, "exit 3".into(), 300.0);
        assert_eq!(
            v,
            Verdict::Job {
                until: 360.0,
                renewed: true
            }
        );
    }

    #[test]
    fn a_node_is_blamed_on_two_users_failures_and_forgiven_on_a_success() {
        let mut b = Blame::default();
        // Jobs 1 and 2 (two users) ran satellites on node 100: healthy jobs.
        b.ran(1, 100, 0.0);
        b.ran(2, 100, 0.0);
        b.ran(3, 100, 0.0);
        assert!(matches!(
            b.satellite_failed(&CFG, 1, 1000, 5, "x".into(), 0.0),
            Verdict::Job { .. }
        ));
        assert_eq!(
            b.satellite_failed(&CFG, 2, 1001, 5, "x".into(), 1.0),
            Verdict::Node { users: 2 }
        );
        // A success on the node clears its strikes.
        let mut b = Blame::default();
        b.ran(1, 100, 0.0);
        b.ran(2, 100, 0.0);
        b.satellite_failed(&CFG, 1, 1000, 6, "x".into(), 2.0);
        b.ran(3, 6, 2.5);
        assert!(matches!(
            b.satellite_failed(&CFG, 2, 1001, 6, "x".into(), 3.0),
            Verdict::Job { .. }
        ));
        // Strikes older than the memory are forgotten.
        let mut b = Blame::default();
        b.ran(1, 100, 0.0);
        b.ran(2, 100, 3000.0);
        b.satellite_failed(&CFG, 1, 1000, 7, "x".into(), 0.0);
        assert!(matches!(
            b.satellite_failed(&CFG, 2, 1001, 7, "x".into(), 4000.0),
            Verdict::Job { .. }
        ));
        // With node_blame_users = 1 a node is blamed at once (the old behaviour).
        let one = BlameConfig {
            node_blame_users: 1,
            ..CFG
        };
        assert_eq!(
            b.satellite_failed(&one, 9, 1000, 8, "x".into(), 0.0),
            Verdict::Node { users: 1 }
        );
    }

    #[test]
    fn jobs_that_explain_their_own_failures_never_set_a_node_aside() {
        // An attacker with two accounts (uids 1000 and 1001) whose jobs never ran a
        // satellite anywhere: their failures on node 5 are theirs.
        let mut b = Blame::default();
        for (job, uid) in [(1, 1000), (2, 1001), (3, 1002)] {
            let v = b.satellite_failed(&CFG, job, uid, 5, "exit 1".into(), 10.0);
            assert!(matches!(v, Verdict::Job { .. }), "job {job}: {v:?}");
        }
        assert_eq!(b.node_users(5), 0);
        // Jobs that ran elsewhere but fail everywhere (nodes 6 and 5): theirs too.
        let mut b = Blame::default();
        for (job, uid) in [(1, 1000), (2, 1001)] {
            b.ran(job, 9, 0.0);
            b.satellite_failed(&CFG, job, uid, 6, "exit 1".into(), 10.0);
        }
        for (job, uid) in [(1, 1000), (2, 1001)] {
            let v = b.satellite_failed(&CFG, job, uid, 5, "exit 1".into(), 20.0);
            assert!(matches!(v, Verdict::Job { .. }), "job {job}: {v:?}");
        }
        // A success long ago is no evidence: forgotten after memory_s.
        let mut b = Blame::default();
        for (job, uid) in [(1, 1000), (2, 1001)] {
            b.ran(job, 9, 0.0);
            let v = b.satellite_failed(&CFG, job, uid, 5, "exit 1".into(), 5000.0);
            assert!(matches!(v, Verdict::Job { .. }), "job {job}: {v:?}");
        }
        // Two users' jobs that run elsewhere and fail only on node 5: the node's.
        let mut b = Blame::default();
        b.ran(1, 9, 0.0);
        b.ran(2, 8, 0.0);
        assert!(matches!(
            b.satellite_failed(&CFG, 1, 1000, 5, "x".into(), 10.0),
            Verdict::Job { .. }
        ));
        assert_eq!(
            b.satellite_failed(&CFG, 2, 1001, 5, "x".into(), 11.0),
            Verdict::Node { users: 2 }
        );
    }

    #[test]
    fn pauses_are_capped() {
        let mut b = Blame::default();
        let mut t = 0.0;
        let mut last = 0.0;
        for _ in 0..40 {
            if let Verdict::Job { until, .. } = b.job_failed(&CFG, 1, "x".into(), t) {
                last = until - t;
                t = until;
            }
        }
        assert_eq!(last, 3600.0);
    }
}
