//! Who is in which generation: the coordinator's decisions, as a pure state machine
//! (no I/O, time passed in). docs/design.md, "Generations", states the rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A generation as announced: members in rank order and rank 0's store.
#[derive(Debug, Clone, PartialEq)]
pub struct Gen {
    pub gen: u64,
    pub members: Vec<String>,
    pub store: String,
}

/// What the coordinator must do after an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Nothing,
    Announce(Gen),
    /// The job is over with this exit code.
    End {
        code: i32,
        reason: String,
    },
}

#[derive(Debug)]
pub struct Membership {
    min_workers: usize,
    broken_timeout: f64,
    gen: u64,
    members: Vec<String>,
    /// Workers ready and not members yet, in the order they became ready.
    pending: Vec<String>,
    stores: HashMap<String, String>,
    /// Members of recent generations (for the end: "every member of the generation
    /// that finished").
    history: BTreeMap<u64, Vec<String>>,
    broken: BTreeSet<String>,
    broken_since: Option<f64>,
    done: BTreeSet<String>,
    finished_gen: Option<u64>,
    ended: bool,
}

impl Membership {
    pub fn new(min_workers: usize, broken_timeout: f64) -> Membership {
        Membership {
            min_workers: min_workers.max(1),
            broken_timeout,
            gen: 0,
            members: Vec::new(),
            pending: Vec::new(),
            stores: HashMap::new(),
            history: BTreeMap::new(),
            broken: BTreeSet::new(),
            broken_since: None,
            done: BTreeSet::new(),
            finished_gen: None,
            ended: false,
        }
    }

    pub fn gen(&self) -> u64 {
        self.gen
    }

    pub fn is_member(&self, w: &str) -> bool {
        self.members.iter().any(|m| m == w)
    }

    fn announce(&mut self, members: Vec<String>) -> Outcome {
        if members.is_empty() {
            // Nobody left to form a world with; wait for workers to become ready.
            self.members.clear();
            return Outcome::Nothing;
        }
        let Some(store) = self.stores.get(&members[0]).cloned() else {
            return Outcome::Nothing;
        };
        self.gen += 1;
        self.members = members.clone();
        self.history.insert(self.gen, members.clone());
        while self.history.len() > 64 {
            self.history.pop_first();
        }
        self.broken.clear();
        self.broken_since = None;
        Outcome::Announce(Gen {
            gen: self.gen,
            members,
            store,
        })
    }

    /// A worker finished warming up and waits to be admitted (or, dropped earlier,
    /// asks to be admitted again).
    pub fn ready(&mut self, w: &str, store: &str) -> Outcome {
        if self.ended || self.finished_gen.is_some() {
            return Outcome::Nothing;
        }
        self.stores.insert(w.to_string(), store.to_string());
        if self.is_member(w) {
            return Outcome::Nothing;
        }
        if !self.pending.iter().any(|p| p == w) {
            self.pending.push(w.to_string());
        }
        if self.gen == 0 || self.members.is_empty() {
            if self.pending.len() < self.min_workers && self.gen == 0 {
                return Outcome::Nothing;
            }
            let members = std::mem::take(&mut self.pending);
            return self.announce(members);
        }
        let mut members = self.members.clone();
        members.append(&mut self.pending);
        self.announce(members)
    }

    /// Workers gone (exited, their agent left or vanished): a new generation without
    /// them if any was a member.
    pub fn drop_workers(&mut self, gone: &[String]) -> Outcome {
        self.pending.retain(|p| !gone.contains(p));
        for w in gone {
            self.broken.remove(w);
        }
        if self.ended || !self.members.iter().any(|m| gone.contains(m)) {
            return Outcome::Nothing;
        }
        if self.finished_gen.is_some() {
            // Finishing: the others are leaving too; no new world.
            return self.check_finished();
        }
        let members: Vec<String> = self
            .members
            .iter()
            .filter(|m| !gone.contains(m))
            .cloned()
            .collect();
        self.announce(members)
    }

    /// A member's collective failed in `gen`: it rolled back and waits. Once every
    /// member still there has said so, the survivors form a new generation.
    pub fn broken(&mut self, w: &str, gen: u64, now: f64) -> Outcome {
        if gen != self.gen || !self.is_member(w) || self.ended {
            return Outcome::Nothing;
        }
        self.broken.insert(w.to_string());
        self.broken_since.get_or_insert(now);
        if self.members.iter().all(|m| self.broken.contains(m)) {
            let members = self.members.clone();
            return self.announce(members);
        }
        Outcome::Nothing
    }

    /// Members silent `broken_timeout` seconds after the first broken report are
    /// dropped (hung); returns them with the outcome.
    pub fn tick(&mut self, now: f64) -> (Vec<String>, Outcome) {
        match self.broken_since {
            Some(t) if now - t >= self.broken_timeout && !self.ended => {
                let silent: Vec<String> = self
                    .members
                    .iter()
                    .filter(|m| !self.broken.contains(*m))
                    .cloned()
                    .collect();
                let out = self.drop_workers(&silent);
                (silent, out)
            }
            _ => (Vec::new(), Outcome::Nothing),
        }
    }

    /// The training function returned on `w` in generation `gen`.
    pub fn done(&mut self, w: &str, gen: u64) -> Outcome {
        if self.ended {
            return Outcome::Nothing;
        }
        self.done.insert(w.to_string());
        self.finished_gen = Some(self.finished_gen.map_or(gen, |g| g.max(gen)));
        self.check_finished()
    }

    fn check_finished(&mut self) -> Outcome {
        let Some(g) = self.finished_gen else {
            return Outcome::Nothing;
        };
        let members = self.history.get(&g).cloned().unwrap_or_default();
        if members.iter().all(|m| self.done.contains(m)) {
            self.ended = true;
            return Outcome::End {
                code: 0,
                reason: format!("training finished in generation {g}"),
            };
        }
        Outcome::Nothing
    }

    /// A worker process ended with `code` (the exit status, or minus the signal).
    pub fn exited(&mut self, w: &str, code: i32, what: &str) -> Outcome {
        if self.ended {
            return Outcome::Nothing;
        }
        if code == 0 {
            if self.is_member(w) && self.finished_gen.is_none() {
                // A member that ended cleanly without saying done: its script ended
                // outside the run wrapper. Count it finished.
                return self.done(w, self.gen);
            }
            if self.finished_gen.is_some() {
                self.done.insert(w.to_string());
                return self.check_finished();
            }
            return self.drop_workers(&[w.to_string()]);
        }
        if code > 0 && !self.done.contains(w) {
            self.ended = true;
            return Outcome::End {
                code,
                reason: format!("worker {w} {what} exited with code {code}"),
            };
        }
        // Killed by a signal: a rollback for the others; its agent may restart it.
        self.drop_workers(&[w.to_string()])
    }

    pub fn end(&mut self) {
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(o: Outcome) -> Gen {
        match o {
            Outcome::Announce(g) => g,
            other => panic!("expected a generation, got {other:?}"),
        }
    }

    fn names(g: &Gen) -> Vec<&str> {
        g.members.iter().map(String::as_str).collect()
    }

    #[test]
    fn first_generation_waits_for_the_core_workers_then_newcomers_append() {
        let mut m = Membership::new(2, 5.0);
        assert_eq!(m.ready("1.0", "h:1"), Outcome::Nothing);
        let g1 = ann(m.ready("2.0", "h:2"));
        assert_eq!(
            (g1.gen, names(&g1), g1.store.as_str()),
            (1, vec!["1.0", "2.0"], "h:1")
        );
        let g2 = ann(m.ready("3.0", "h:3"));
        assert_eq!(names(&g2), vec!["1.0", "2.0", "3.0"]);
        // A duplicate ready of a member changes nothing.
        assert_eq!(m.ready("3.0", "h:3"), Outcome::Nothing);
    }

    #[test]
    fn leaving_and_dying_keep_survivor_order_and_rank0_store() {
        let mut m = Membership::new(1, 5.0);
        ann(m.ready("1.0", "h:1"));
        ann(m.ready("2.0", "h:2"));
        ann(m.ready("3.0", "h:3"));
        let g = ann(m.drop_workers(&["1.0".into()]));
        assert_eq!((names(&g), g.store.as_str()), (vec!["2.0", "3.0"], "h:2"));
        let g = ann(m.exited("3.0", -9, "on n3"));
        assert_eq!(names(&g), vec!["2.0"]);
        // A leaver exiting 0 after it was dropped is no event.
        assert_eq!(m.exited("1.0", 0, "on n1"), Outcome::Nothing);
        assert_eq!(m.drop_workers(&["9.9".into()]), Outcome::Nothing);
    }

    #[test]
    fn broken_reports_reform_the_world_and_silent_members_are_dropped() {
        let mut m = Membership::new(3, 5.0);
        for w in ["a.0", "b.0", "c.0"] {
            m.ready(w, &format!("{w}:1"));
        }
        assert_eq!(m.gen(), 1);
        assert_eq!(m.broken("a.0", 1, 10.0), Outcome::Nothing);
        assert_eq!(
            m.broken("b.0", 0, 10.0),
            Outcome::Nothing,
            "old generation ignored"
        );
        assert_eq!(m.broken("b.0", 1, 10.5), Outcome::Nothing);
        assert_eq!(m.tick(14.0), (vec![], Outcome::Nothing));
        let (silent, out) = m.tick(15.0);
        assert_eq!(silent, vec!["c.0".to_string()]);
        assert_eq!(names(&ann(out)), vec!["a.0", "b.0"]);
        // All members broken: the same members again, a new number.
        m.broken("a.0", 2, 20.0);
        let g = ann(m.broken("b.0", 2, 20.1));
        assert_eq!((g.gen, names(&g)), (3, vec!["a.0", "b.0"]));
    }

    #[test]
    fn the_job_ends_when_the_finishing_generation_is_done_or_a_worker_fails() {
        let mut m = Membership::new(2, 5.0);
        m.ready("a.0", "a:1");
        m.ready("b.0", "b:1");
        m.ready("c.0", "c:1"); // gen 2: c joined ...
        assert_eq!(m.gen(), 2);
        // ... but a and b finished in gen 1 before switching; c is stopped.
        assert_eq!(m.done("a.0", 1), Outcome::Nothing);
        assert_eq!(
            m.ready("d.0", "d:1"),
            Outcome::Nothing,
            "no growth while finishing"
        );
        assert!(matches!(m.done("b.0", 1), Outcome::End { code: 0, .. }));

        let mut m = Membership::new(1, 5.0);
        m.ready("a.0", "a:1");
        let out = m.exited("a.0", 3, "on n1");
        assert_eq!(
            out,
            Outcome::End {
                code: 3,
                reason: "worker a.0 on n1 exited with code 3".into()
            }
        );
        assert_eq!(m.ready("b.0", "b:1"), Outcome::Nothing);
    }

    #[test]
    fn members_exiting_zero_finish_the_job_and_pending_workers_drop_silently() {
        let mut m = Membership::new(2, 5.0);
        m.ready("a.0", "a:1");
        // A pending worker that goes away before any generation: no generation.
        assert_eq!(m.drop_workers(&["a.0".into()]), Outcome::Nothing);
        assert_eq!(m.gen(), 0);
        m.ready("a.1", "a:2");
        let g = ann(m.ready("b.0", "b:1"));
        assert_eq!(
            (g.gen, names(&g), g.store.as_str()),
            (1, vec!["a.1", "b.0"], "a:2")
        );
        m.ready("c.0", "c:1");
        // Exit 0 without `done` (the script ended outside the wrapper) counts as done.
        assert_eq!(m.exited("a.1", 0, "on a"), Outcome::Nothing);
        assert_eq!(m.exited("b.0", 0, "on b"), Outcome::Nothing);
        assert!(matches!(
            m.exited("c.0", 0, "on c"),
            Outcome::End { code: 0, .. }
        ));
        // Nothing after the end.
        assert_eq!(m.ready("d.0", "d:1"), Outcome::Nothing);
        assert_eq!(m.exited("d.0", 4, "on d"), Outcome::Nothing);
    }

    #[test]
    fn generation_numbers_only_grow() {
        let mut m = Membership::new(1, 1.0);
        let mut last = 0;
        let mut check = |o: Outcome| {
            if let Outcome::Announce(g) = o {
                assert!(g.gen > last, "{} after {last}", g.gen);
                assert!(!g.members.is_empty());
                last = g.gen;
            }
        };
        check(m.ready("a.0", "a:1"));
        check(m.ready("b.0", "b:1"));
        check(m.broken("a.0", 2, 1.0));
        check(m.tick(3.0).1);
        check(m.exited("a.0", -9, "on a"));
        check(m.ready("a.1", "a:2"));
        check(m.drop_workers(&["b.0".into(), "a.1".into()]));
        check(m.ready("b.1", "b:2"));
        // 1 [a] 2 [a b] 3 [a] (b silent) - (nobody left) 4 [a.1] - (nobody) 5 [b.1]
        assert_eq!(m.gen(), 5);
    }

    #[test]
    fn everyone_lost_then_a_restarted_worker_forms_a_new_world() {
        let mut m = Membership::new(1, 5.0);
        m.ready("a.0", "a:1");
        assert_eq!(m.exited("a.0", -9, "on n1"), Outcome::Nothing);
        let g = ann(m.ready("a.1", "a:2"));
        assert_eq!((g.gen, names(&g)), (2, vec!["a.1"]));
    }
}
