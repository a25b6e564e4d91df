//! Worlds restarted whole at each generation (`--mode torchrun` and `--mode mpi`): which nodes form the next static-size world, when to stop the running
//! one (a node joined, left or was lost; a worker failed) and when the job is over.
//! A pure state machine (no I/O, time passed in); the coordinator carries out its acts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Debug, Clone, PartialEq)]
pub struct WorldCfg {
    /// Worker slots the first world waits for (the core allocation's).
    pub min_slots: usize,
    /// Seconds a joining node waits to be taken in: others joining meanwhile come
    /// with it, and worlds are not restarted for growth more often than that.
    pub settle: f64,
    /// World restarts after a worker failure within `restart_window` seconds; one
    /// more failure ends the job. Membership changes never count.
    pub max_restarts: u32,
    pub restart_window: f64,
    /// One launcher runs the whole world (MPI mode: one mpirun, reported as local
    /// worker 0 of the first part's agent): its clean exit ends the job.
    pub one_launcher: bool,
}

/// One node's part of a world: its agent, its place (GROUP_RANK), its first global
/// rank and its worker count.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub agent: u64,
    pub group_rank: usize,
    pub rank_base: usize,
    pub slots: usize,
}

/// A world to start: every part, the size, and how many worlds were started before
/// it (TORCHELASTIC_RESTART_COUNT). Rank 0 is on `parts[0]`'s node, whose agent chose
/// `master_port`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub gen: u64,
    pub parts: Vec<Part>,
    pub world_size: usize,
    pub restarts: u64,
    pub master_port: u16,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// Ask this agent (rank 0's node) for a free port for the world's store.
    AskPort {
        gen: u64,
        agent: u64,
    },
    /// Start the world: each part's agent starts its workers.
    Start(Plan),
    /// Stop the world: SIGTERM every worker, SIGKILL after the grace; each agent
    /// answers `stopped` once its workers are gone.
    Stop {
        gen: u64,
        agents: Vec<u64>,
        why: String,
    },
    End {
        code: i32,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// No world: too few slots yet, or every node is gone.
    Waiting,
    /// Planned, waiting for rank 0's node to name a port.
    Port,
    Running,
    /// Stopped, waiting for these agents' workers to be gone.
    Stopping(BTreeSet<u64>),
    Over,
}

#[derive(Debug)]
pub struct World {
    cfg: WorldCfg,
    /// Nodes present and not leaving, by agent id (ids grow with the joining order),
    /// with their worker slots.
    nodes: BTreeMap<u64, usize>,
    phase: Phase,
    gen: u64,
    plan: Option<Plan>,
    started: u64,
    started_at: f64,
    /// When the first node not in the world joined (a growth to come).
    grow_since: Option<f64>,
    /// A member was lost or left during this world (its failures are not the job's).
    lost_member: bool,
    /// The first failure of this world: its exit code and what to say.
    failure: Option<(i32, String)>,
    /// Workers (agent, local rank) of this world that exited 0.
    finished: BTreeSet<(u64, usize)>,
    /// Failure restarts within the window.
    restarts: VecDeque<f64>,
}

impl World {
    pub fn new(cfg: WorldCfg) -> World {
        World {
            cfg,
            nodes: BTreeMap::new(),
            phase: Phase::Waiting,
            gen: 0,
            plan: None,
            started: 0,
            started_at: 0.0,
            grow_since: None,
            lost_member: false,
            failure: None,
            finished: BTreeSet::new(),
            restarts: VecDeque::new(),
        }
    }

    /// The current world's generation (0 before the first).
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// The world now running, if one is.
    pub fn running(&self) -> Option<&Plan> {
        (self.phase == Phase::Running)
            .then_some(self.plan.as_ref())
            .flatten()
    }

    #[cfg(test)]
    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    fn is_member(&self, agent: u64) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.parts.iter().any(|x| x.agent == agent))
    }

    /// A node's agent came in with `slots` workers.
    pub fn join(&mut self, agent: u64, slots: usize, now: f64) -> Vec<Act> {
        if self.phase == Phase::Over {
            return Vec::new();
        }
        self.nodes.insert(agent, slots.max(1));
        match self.phase {
            Phase::Waiting => {
                let total: usize = self.nodes.values().sum();
                if total >= self.cfg.min_slots || self.started > 0 {
                    return self.begin();
                }
                Vec::new()
            }
            Phase::Running if self.finished.is_empty() => {
                self.grow_since.get_or_insert(now);
                Vec::new()
            }
            // A world being planned or stopped takes every node present when it
            // starts; a finishing one takes nobody.
            _ => Vec::new(),
        }
    }

    /// A node's agent left (SIGTERM: its workers stop by themselves) or was lost.
    pub fn leave(&mut self, agent: u64, now: f64) -> Vec<Act> {
        if self.nodes.remove(&agent).is_none() || self.phase == Phase::Over {
            return Vec::new();
        }
        if !self.is_member(agent) {
            return Vec::new();
        }
        self.lost_member = true;
        match &mut self.phase {
            Phase::Port => self.begin(),
            Phase::Running => self.stop(Some(agent), format!("agent {agent} left"), now),
            Phase::Stopping(waiting) => {
                waiting.remove(&agent);
                if waiting.is_empty() {
                    return self.next(now);
                }
                Vec::new()
            }
            Phase::Waiting | Phase::Over => Vec::new(),
        }
    }

    /// Rank 0's node named the port of world `gen`.
    pub fn port(&mut self, agent: u64, gen: u64, port: u16, now: f64) -> Vec<Act> {
        let Some(plan) = self.plan.as_mut() else {
            return Vec::new();
        };
        if self.phase != Phase::Port || plan.gen != gen || plan.parts[0].agent != agent {
            return Vec::new();
        }
        plan.master_port = port;
        plan.restarts = self.started;
        let plan = plan.clone();
        self.started += 1;
        self.started_at = now;
        self.phase = Phase::Running;
        // Nodes that came while this world was planned wait for the next growth.
        let outside = self.nodes.keys().any(|a| !self.is_member(*a));
        self.grow_since = outside.then_some(now);
        vec![Act::Start(plan)]
    }

    /// A worker of world `gen` ended by itself with `code` (the exit status, or minus
    /// the signal); `what` names it for the log. Exits after a stop are not news.
    pub fn exited(
        &mut self,
        agent: u64,
        gen: u64,
        local: usize,
        code: i32,
        what: &str,
        now: f64,
    ) -> Vec<Act> {
        if self.phase != Phase::Running || gen != self.gen || !self.is_member(agent) {
            return Vec::new();
        }
        if code == 0 {
            if self.cfg.one_launcher {
                let first = self.plan.as_ref().map(|p| p.parts[0].agent);
                if first != Some(agent) || local != 0 {
                    return Vec::new();
                }
                self.phase = Phase::Over;
                return vec![Act::End {
                    code: 0,
                    reason: format!("training finished in generation {}", self.gen),
                }];
            }
            self.finished.insert((agent, local));
            self.grow_since = None;
            let size = self.plan.as_ref().map_or(0, |p| p.world_size);
            if self.finished.len() >= size {
                self.phase = Phase::Over;
                return vec![Act::End {
                    code: 0,
                    reason: format!("training finished in generation {}", self.gen),
                }];
            }
            return Vec::new();
        }
        let how = if code < 0 {
            format!("was killed by signal {}", -code)
        } else {
            format!("exited with code {code}")
        };
        let what = format!("{what} {how}");
        self.failure = Some((if code < 0 { 128 - code } else { code }, what.clone()));
        self.stop(None, what, now)
    }

    /// An agent's workers of world `gen` are all gone.
    pub fn stopped(&mut self, agent: u64, gen: u64, now: f64) -> Vec<Act> {
        if gen != self.gen {
            return Vec::new();
        }
        if let Phase::Stopping(waiting) = &mut self.phase {
            waiting.remove(&agent);
            if waiting.is_empty() {
                return self.next(now);
            }
        }
        Vec::new()
    }

    /// Growth once the settle time has passed (since the first newcomer and since
    /// the world started).
    pub fn tick(&mut self, now: f64) -> Vec<Act> {
        match self.grow_since {
            Some(t)
                if self.phase == Phase::Running
                    && now - t >= self.cfg.settle
                    && now - self.started_at >= self.cfg.settle =>
            {
                let n = self.nodes.keys().filter(|a| !self.is_member(**a)).count();
                self.stop(None, format!("{n} node(s) joined"), now)
            }
            _ => Vec::new(),
        }
    }

    /// Nothing can run any more (the coordinator ends the job).
    pub fn end(&mut self) {
        self.phase = Phase::Over;
    }

    /// Stops the running world (`gone`: a member already gone, not waited for).
    fn stop(&mut self, gone: Option<u64>, why: String, now: f64) -> Vec<Act> {
        let agents: Vec<u64> = self
            .plan
            .as_ref()
            .map(|p| p.parts.iter().map(|x| x.agent).collect())
            .unwrap_or_default();
        let waiting: BTreeSet<u64> = agents
            .iter()
            .copied()
            .filter(|a| Some(*a) != gone && self.nodes.contains_key(a))
            .collect();
        self.grow_since = None;
        if waiting.is_empty() {
            self.phase = Phase::Stopping(waiting);
            return self.next(now);
        }
        self.phase = Phase::Stopping(waiting.clone());
        vec![Act::Stop {
            gen: self.gen,
            agents: waiting.into_iter().collect(),
            why,
        }]
    }

    /// The world stopped: a failure is charged (unless a member was lost with it:
    /// then the failure was that loss's); then the next world.
    fn next(&mut self, now: f64) -> Vec<Act> {
        if let Some((code, what)) = self.failure.take() {
            if !self.lost_member {
                let window = self.cfg.restart_window;
                while self.restarts.front().is_some_and(|t| now - t > window) {
                    self.restarts.pop_front();
                }
                if self.restarts.len() >= self.cfg.max_restarts as usize {
                    self.phase = Phase::Over;
                    return vec![Act::End {
                        code,
                        reason: format!(
                            "{what}; not restarted: {} restarts within {} s already (--max-restarts, --restart-window)",
                            self.restarts.len(),
                            self.cfg.restart_window
                        ),
                    }];
                }
                self.restarts.push_back(now);
            }
        }
        self.begin()
    }

    /// Plans a world of every node present, in joining order (rank 0 stays on the
    /// earliest node still here).
    fn begin(&mut self) -> Vec<Act> {
        self.lost_member = false;
        self.failure = None;
        self.finished.clear();
        self.grow_since = None;
        if self.nodes.is_empty() {
            self.phase = Phase::Waiting;
            self.plan = None;
            return Vec::new();
        }
        self.gen += 1;
        let mut parts = Vec::new();
        let mut base = 0;
        for (i, (agent, slots)) in self.nodes.iter().enumerate() {
            parts.push(Part {
                agent: *agent,
                group_rank: i,
                rank_base: base,
                slots: *slots,
            });
            base += slots;
        }
        let master = parts[0].agent;
        self.plan = Some(Plan {
            gen: self.gen,
            parts,
            world_size: base,
            restarts: self.started,
            master_port: 0,
        });
        self.phase = Phase::Port;
        vec![Act::AskPort {
            gen: self.gen,
            agent: master,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(min: usize) -> World {
        World::new(WorldCfg {
            min_slots: min,
            settle: 5.0,
            max_restarts: 2,
            restart_window: 100.0,
            one_launcher: false,
        })
    }

    #[test]
    fn with_one_launcher_its_clean_exit_ends_the_job_and_nobody_elses_does() {
        let mut w = World::new(WorldCfg {
            one_launcher: true,
            ..world(3).cfg
        });
        w.join(1, 2, 0.0);
        let p = join_start(&mut w, 2, 1, 0.0);
        assert_eq!(p.world_size, 3);
        assert!(w.exited(2, 1, 0, 0, "not the launcher", 0.0).is_empty());
        assert!(w.exited(1, 1, 1, 0, "not the launcher", 0.0).is_empty());
        assert!(w.exited(1, 0, 0, 0, "an older world", 0.0).is_empty());
        assert_eq!(
            w.exited(1, 1, 0, 0, "mpirun", 0.0),
            vec![Act::End {
                code: 0,
                reason: "training finished in generation 1".into()
            }]
        );
    }

    /// Answers the port request and returns the started plan.
    fn start(w: &mut World, acts: Vec<Act>, now: f64) -> Plan {
        let Some(Act::AskPort { gen, agent }) = acts.first().cloned() else {
            panic!("expected a port request, got {acts:?}");
        };
        match w.port(agent, gen, 29500 + gen as u16, now).as_slice() {
            [Act::Start(p)] => p.clone(),
            other => panic!("expected a start, got {other:?}"),
        }
    }

    fn join_start(w: &mut World, agent: u64, slots: usize, now: f64) -> Plan {
        let acts = w.join(agent, slots, now);
        start(w, acts, now)
    }

    /// Every agent of the stop acknowledges, and the next world starts.
    fn restart(w: &mut World, acts: Vec<Act>, now: f64) -> Plan {
        let acts = stop_all(w, acts, now);
        start(w, acts, now)
    }

    fn stop_all(w: &mut World, acts: Vec<Act>, now: f64) -> Vec<Act> {
        let Some(Act::Stop { gen, agents, .. }) = acts.first().cloned() else {
            panic!("expected a stop, got {acts:?}");
        };
        let mut out = Vec::new();
        for a in agents {
            out = w.stopped(a, gen, now);
        }
        out
    }

    #[test]
    fn the_first_world_waits_for_the_core_slots_and_ranks_follow_the_joining_order() {
        let mut w = world(4);
        assert!(w.join(1, 2, 0.0).is_empty());
        let p = join_start(&mut w, 2, 2, 0.1);
        assert_eq!((p.gen, p.world_size, p.restarts), (1, 4, 0));
        assert_eq!(
            p.parts,
            vec![
                Part {
                    agent: 1,
                    group_rank: 0,
                    rank_base: 0,
                    slots: 2
                },
                Part {
                    agent: 2,
                    group_rank: 1,
                    rank_base: 2,
                    slots: 2
                },
            ]
        );
        assert_eq!(p.master_port, 29501);
        // A port from another agent or for another generation is ignored.
        assert!(w.port(2, 1, 1, 0.3).is_empty());
    }

    #[test]
    fn nodes_joining_within_the_settle_time_come_in_one_restart() {
        let mut w = world(1);
        join_start(&mut w, 1, 1, 0.0);
        for (a, t) in [(2, 10.0), (3, 11.0), (4, 14.9)] {
            assert!(w.join(a, 1, t).is_empty());
            assert!(w.tick(t).is_empty());
        }
        let acts = w.tick(15.0);
        assert!(
            matches!(acts.as_slice(), [Act::Stop { gen, agents, .. }] if *gen == 1 && *agents == vec![1]),
            "{acts:?}"
        );
        let p = restart(&mut w, acts, 15.5);
        assert_eq!((p.gen, p.world_size, p.restarts), (2, 4, 1));
        // The next newcomer waits for the settle time after that world's start too.
        assert!(w.join(5, 1, 16.5).is_empty());
        assert!(w.tick(20.9).is_empty());
        assert!(!w.tick(21.5).is_empty());
    }

    #[test]
    fn a_lost_member_restarts_the_world_without_it_and_is_not_a_failure() {
        let mut w = world(3);
        w.join(1, 1, 0.0);
        w.join(2, 1, 0.0);
        join_start(&mut w, 3, 1, 0.0);
        let acts = w.leave(2, 1.0);
        assert!(
            matches!(acts.as_slice(), [Act::Stop { gen, agents, .. }] if *gen == 1 && *agents == vec![1, 3]),
            "{acts:?}"
        );
        // The survivors fail on the broken collective before they are stopped: the
        // loss's doing, not charged.
        for _ in 0..5 {
            assert!(w.exited(1, 1, 0, 1, "worker", 0.0).is_empty());
        }
        let p = restart(&mut w, acts, 2.0);
        assert_eq!((p.gen, p.world_size), (2, 2));
        assert_eq!(
            p.parts[1],
            Part {
                agent: 3,
                group_rank: 1,
                rank_base: 1,
                slots: 1
            }
        );
        // Failures that follow the loss within the world being stopped are not charged.
        assert_eq!(w.restarts.len(), 0);
    }

    #[test]
    fn failures_restart_the_world_until_max_restarts_then_end_the_job() {
        let mut w = world(2);
        w.join(1, 1, 0.0);
        let mut p = join_start(&mut w, 2, 1, 0.0);
        for n in 0..2 {
            let acts = w.exited(2, p.gen, 0, 3, "worker 2.0", 0.0);
            assert!(
                matches!(acts.as_slice(), [Act::Stop { gen, agents, .. }] if *gen == p.gen && *agents == vec![1, 2]),
                "{acts:?}"
            );
            // A second failure while stopping is not news.
            assert!(w.exited(1, p.gen, 0, -9, "worker 1.0", 0.0).is_empty());
            p = restart(&mut w, acts, 1.0 + n as f64);
            assert_eq!(p.restarts, n + 1);
        }
        let acts = w.exited(1, p.gen, 0, -9, "worker 1.0 (rank 0)", 0.0);
        match stop_all(&mut w, acts, 3.0).as_slice() {
            [Act::End { code, reason }] => {
                assert_eq!(*code, 137);
                assert!(
                    reason.contains("worker 1.0 (rank 0) was killed by signal 9"),
                    "{reason}"
                );
                assert!(reason.contains("2 restarts within 100 s"), "{reason}");
            }
            other => panic!("expected the end, got {other:?}"),
        }
        assert!(w.is_over());
        // Failures older than the window are forgotten.
        let mut w = world(1);
        let mut p = join_start(&mut w, 1, 1, 0.0);
        for t in [0.0, 150.0, 300.0, 450.0] {
            let acts = w.exited(1, p.gen, 0, 1, "w", 0.0);
            p = restart(&mut w, acts, t);
        }
        assert_eq!(p.gen, 5);
    }

    #[test]
    fn the_job_ends_when_every_worker_of_a_world_exits_zero_and_finishing_stops_growth() {
        let mut w = world(3);
        w.join(1, 2, 0.0);
        let p = join_start(&mut w, 2, 1, 0.0);
        assert_eq!(p.world_size, 3);
        assert!(w.exited(1, 1, 0, 0, "w", 0.0).is_empty());
        assert!(
            w.exited(1, 1, 0, 0, "w", 0.0).is_empty(),
            "the same worker twice"
        );
        // A node joining a finishing world is not taken in.
        assert!(w.join(3, 1, 1.0).is_empty());
        assert!(w.tick(100.0).is_empty());
        assert!(w.exited(1, 1, 1, 0, "w", 0.0).is_empty());
        assert_eq!(
            w.exited(2, 1, 0, 0, "w", 0.0),
            vec![Act::End {
                code: 0,
                reason: "training finished in generation 1".into()
            }]
        );
        assert!(w.join(4, 1, 2.0).is_empty());
    }

    #[test]
    fn exits_of_an_older_world_and_stragglers_while_planning_change_nothing() {
        let mut w = world(1);
        let p = join_start(&mut w, 1, 1, 0.0);
        let acts = w.leave(1, 1.0);
        assert!(acts.is_empty(), "nobody left to stop: {acts:?}");
        assert_eq!(w.gen(), 1);
        assert!(w.running().is_none());
        // Back to waiting; a node that comes later starts a world at once.
        let p2 = join_start(&mut w, 2, 1, 5.0);
        assert_eq!((p2.gen, p2.restarts), (2, 1));
        assert!(w.exited(2, p.gen, 0, 1, "old", 0.0).is_empty());
        // rank 0's node leaves before it named the port: a new plan without it.
        w.join(3, 1, 6.0);
        let acts = w.tick(20.0);
        let acts = stop_all(&mut w, acts, 20.0);
        let Some(Act::AskPort { gen, agent }) = acts.first().cloned() else {
            panic!("{acts:?}")
        };
        assert_eq!(agent, 2);
        match w.leave(2, 21.0).as_slice() {
            [Act::AskPort { gen: g, agent: 3 }] => assert!(*g > gen),
            other => panic!("{other:?}"),
        }
    }
}
