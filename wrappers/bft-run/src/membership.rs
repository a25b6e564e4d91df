//! Who is in which generation: the coordinator's decisions, as a pure state machine
//! (no I/O, time passed in). docs/design.md, "Generations", states the rules.

use std::collections::{BTreeMap, BTreeSet};

/// A generation as announced: members in rank order, and the members of the
/// previous generation lost to a failure (their collectives will never complete: the
/// survivors abort them at once instead of waiting).
#[derive(Debug, Clone, PartialEq)]
pub struct Gen {
    pub gen: u64,
    pub members: Vec<String>,
    pub dead: Vec<String>,
}

/// What the coordinator must do after an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Nothing,
    Announce(Gen),
    /// A member's collective failed in this generation: every member must abort its
    /// collectives of it and roll back (each acknowledges with `broken`).
    Abort(u64),
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
    /// Members of recent generations (for the end: "every member of the generation
    /// that finished").
    history: BTreeMap<u64, Vec<String>>,
    broken: BTreeSet<String>,
    /// When the current generation was aborted (the first `broken` report).
    aborted_at: Option<f64>,
    /// Members lost to failures since the last announcement.
    dead: BTreeSet<String>,
    done: BTreeSet<String>,
    finished_gen: Option<u64>,
    /// Why an agent stopped restarting its workers (ends the job once nobody is left).
    gave_up: Option<String>,
    /// Generations aborted so far (each is aborted once).
    aborted: BTreeSet<u64>,
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
            history: BTreeMap::new(),
            broken: BTreeSet::new(),
            aborted_at: None,
            dead: BTreeSet::new(),
            done: BTreeSet::new(),
            finished_gen: None,
            gave_up: None,
            aborted: BTreeSet::new(),
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
            // Nobody left to form a world with; wait for workers to become ready,
            // unless an agent gave up restarting them.
            self.members.clear();
            if self.pending.is_empty() {
                if let Some(why) = self.gave_up.take() {
                    self.ended = true;
                    return Outcome::End {
                        code: 1,
                        reason: why,
                    };
                }
            }
            return Outcome::Nothing;
        }
        self.gen += 1;
        self.members = members.clone();
        self.history.insert(self.gen, members.clone());
        while self.history.len() > 64 {
            self.history.pop_first();
        }
        self.broken.clear();
        self.aborted_at = None;
        Outcome::Announce(Gen {
            gen: self.gen,
            members,
            dead: std::mem::take(&mut self.dead).into_iter().collect(),
        })
    }

    /// A new generation of the same members (and any newcomers waiting): the workers
    /// switch to it at their next step boundary, all at the same step, and take what
    /// changed with it (the global batch bftrainerd decided). Nothing before the first
    /// generation, after the end, or while an abort is under way (the re-formation
    /// that follows carries the change).
    pub fn renew(&mut self) -> Outcome {
        if self.ended
            || self.finished_gen.is_some()
            || self.gen == 0
            || self.members.is_empty()
            || self.aborted_at.is_some()
        {
            return Outcome::Nothing;
        }
        let mut members = self.members.clone();
        members.append(&mut self.pending);
        self.announce(members)
    }

    /// A worker finished warming up and waits to be admitted (or, dropped earlier,
    /// asks to be admitted again). While the current generation is aborted the
    /// newcomer waits for the re-formation, which takes it in.
    pub fn ready(&mut self, w: &str) -> Outcome {
        if self.ended || self.finished_gen.is_some() {
            return Outcome::Nothing;
        }
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
        if self.aborted_at.is_some() {
            return Outcome::Nothing;
        }
        let mut members = self.members.clone();
        members.append(&mut self.pending);
        self.announce(members)
    }

    /// Workers gone: `dead` when they failed (exited by a signal, their agent
    /// vanished or froze, dropped as hung), else they left at a step boundary. A new
    /// generation without them if any was a member.
    pub fn drop_workers(&mut self, gone: &[String], dead: bool) -> Outcome {
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
        if dead {
            let lost: Vec<String> = gone.iter().filter(|w| self.is_member(w)).cloned().collect();
            self.dead.extend(lost);
        }
        let mut members: Vec<String> = self
            .members
            .iter()
            .filter(|m| !gone.contains(m))
            .cloned()
            .collect();
        if self.aborted_at.is_some() {
            // Re-forming anyway: take the newcomers in now.
            members.append(&mut self.pending);
        }
        self.announce(members)
    }

    /// A member's collective failed in `gen`, or it acknowledged an abort of `gen`:
    /// it rolls back and waits. The first report aborts the generation; once every
    /// member has reported, the members (and the newcomers) form a new generation.
    pub fn broken(&mut self, w: &str, gen: u64, now: f64) -> Outcome {
        if self.ended || self.finished_gen.is_some() {
            return Outcome::Nothing;
        }
        if gen < self.gen {
            // A failure in an older generation some members may still be in (a newer
            // one was announced meanwhile): they must give it up too.
            return self.abort_old(w, gen);
        }
        if gen != self.gen || !self.is_member(w) {
            return Outcome::Nothing;
        }
        self.broken.insert(w.to_string());
        let first = self.aborted_at.is_none();
        self.aborted_at.get_or_insert(now);
        if self.members.iter().all(|m| self.broken.contains(m)) {
            let mut members = self.members.clone();
            members.append(&mut self.pending);
            return self.announce(members);
        }
        if first {
            self.aborted.insert(gen);
            Outcome::Abort(gen)
        } else {
            Outcome::Nothing
        }
    }

    /// An abort of the older generation `gen`, once, if `w` was one of its members.
    fn abort_old(&mut self, w: &str, gen: u64) -> Outcome {
        let was = self
            .history
            .get(&gen)
            .is_some_and(|m| m.iter().any(|x| x == w));
        if was && self.aborted.insert(gen) {
            while self.aborted.len() > 64 {
                self.aborted.pop_first();
            }
            Outcome::Abort(gen)
        } else {
            Outcome::Nothing
        }
    }

    /// Members that did not acknowledge an abort within `broken_timeout` seconds are
    /// dropped as hung (the acknowledgement comes from the worker library's
    /// background thread, so the step time does not matter: only a frozen or wedged
    /// process misses it); returns them with the outcome.
    pub fn tick(&mut self, now: f64) -> (Vec<String>, Outcome) {
        match self.aborted_at {
            Some(t) if now - t >= self.broken_timeout && !self.ended => {
                let silent: Vec<String> = self
                    .members
                    .iter()
                    .filter(|m| !self.broken.contains(*m))
                    .cloned()
                    .collect();
                let out = self.drop_workers(&silent, true);
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
            return self.drop_workers(&[w.to_string()], false);
        }
        if code > 0 && !self.done.contains(w) {
            self.ended = true;
            return Outcome::End {
                code,
                reason: format!("worker {w} {what} exited with code {code}"),
            };
        }
        // Killed by a signal: a rollback for the others; its agent may restart it.
        if !self.is_member(w) {
            // A leaver that died before its step boundary: the generation it was
            // leaving is still in its last collectives, which will not complete.
            let last = self
                .history
                .iter()
                .rev()
                .find(|(_, m)| m.iter().any(|x| x == w))
                .map(|(g, _)| *g);
            if let Some(g) = last.filter(|g| *g < self.gen) {
                self.pending.retain(|p| p != w);
                return self.abort_old(w, g);
            }
        }
        self.drop_workers(&[w.to_string()], true)
    }

    /// An agent will not restart its workers any more (`why`): the job ends with that
    /// reason once no member and no newcomer is left.
    pub fn gave_up(&mut self, why: String) -> Outcome {
        if self.ended {
            return Outcome::Nothing;
        }
        if self.members.is_empty() && self.pending.is_empty() {
            self.ended = true;
            return Outcome::End {
                code: 1,
                reason: why,
            };
        }
        self.gave_up = Some(why);
        Outcome::Nothing
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

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn first_generation_waits_for_the_core_workers_then_newcomers_append() {
        let mut m = Membership::new(2, 5.0);
        assert_eq!(m.ready("1.0"), Outcome::Nothing);
        let g1 = ann(m.ready("2.0"));
        assert_eq!((g1.gen, names(&g1)), (1, vec!["1.0", "2.0"]));
        let g2 = ann(m.ready("3.0"));
        assert_eq!(names(&g2), vec!["1.0", "2.0", "3.0"]);
        assert!(g2.dead.is_empty());
        // A duplicate ready of a member changes nothing.
        assert_eq!(m.ready("3.0"), Outcome::Nothing);
    }

    #[test]
    fn leavers_are_not_dead_the_killed_are() {
        let mut m = Membership::new(1, 5.0);
        ann(m.ready("1.0"));
        ann(m.ready("2.0"));
        ann(m.ready("3.0"));
        let g = ann(m.drop_workers(&ids(&["1.0"]), false));
        assert_eq!(names(&g), vec!["2.0", "3.0"]);
        assert!(
            g.dead.is_empty(),
            "a leaver at a step boundary is no failure"
        );
        let g = ann(m.exited("3.0", -9, "on n3"));
        assert_eq!((names(&g), g.dead.clone()), (vec!["2.0"], ids(&["3.0"])));
        // A leaver exiting 0 after it was dropped is no event.
        assert_eq!(m.exited("1.0", 0, "on n1"), Outcome::Nothing);
        assert_eq!(m.drop_workers(&ids(&["9.9"]), true), Outcome::Nothing);
    }

    #[test]
    fn a_broken_report_aborts_acknowledgements_reform_and_the_silent_are_dropped() {
        let mut m = Membership::new(3, 5.0);
        for w in ["a.0", "b.0", "c.0"] {
            m.ready(w);
        }
        assert_eq!(m.gen(), 1);
        assert_eq!(m.broken("a.0", 1, 10.0), Outcome::Abort(1));
        assert_eq!(
            m.broken("b.0", 0, 10.0),
            Outcome::Nothing,
            "old generation ignored"
        );
        // A newcomer during the abort waits for the re-formation.
        assert_eq!(m.ready("d.0"), Outcome::Nothing);
        assert_eq!(m.broken("b.0", 1, 10.5), Outcome::Nothing);
        assert_eq!(m.tick(14.0), (vec![], Outcome::Nothing));
        let (silent, out) = m.tick(15.0);
        assert_eq!(silent, ids(&["c.0"]));
        let g = ann(out);
        assert_eq!(names(&g), vec!["a.0", "b.0", "d.0"]);
        assert_eq!(g.dead, ids(&["c.0"]));
        // Everyone acknowledges: the same members again, a new number, nobody dead.
        assert_eq!(m.broken("a.0", 2, 20.0), Outcome::Abort(2));
        m.broken("b.0", 2, 20.1);
        let g = ann(m.broken("d.0", 2, 20.1));
        assert_eq!(
            (g.gen, names(&g), g.dead.len()),
            (3, vec!["a.0", "b.0", "d.0"], 0)
        );
    }

    #[test]
    fn failures_in_an_older_generation_abort_it_once() {
        let mut m = Membership::new(1, 5.0);
        ann(m.ready("a.0"));
        ann(m.ready("b.0")); // gen 2: a b
        ann(m.ready("c.0")); // gen 3: a b c, while a and b may still be in gen 2
        assert_eq!(m.broken("a.0", 2, 1.0), Outcome::Abort(2));
        assert_eq!(m.broken("b.0", 2, 1.0), Outcome::Nothing, "once");
        assert_eq!(
            m.broken("c.0", 1, 1.0),
            Outcome::Nothing,
            "c was not in gen 1"
        );
        assert_eq!(m.gen(), 3, "no change of membership");
        // b leaves (gen 4: a c) and dies before its step boundary: gen 3 is aborted.
        ann(m.drop_workers(&ids(&["b.0"]), false));
        assert_eq!(m.exited("b.0", -9, "on b"), Outcome::Abort(3));
    }

    #[test]
    fn a_newcomer_never_makes_members_look_broken() {
        // The old rule dropped every member that was still in a long step when a
        // waiting newcomer reported broken: newcomers now never report, and a tick at
        // any time later drops nobody.
        let mut m = Membership::new(1, 5.0);
        ann(m.ready("1.0"));
        let g = ann(m.ready("2.0"));
        assert_eq!(m.broken("2.0", g.gen - 1, 1.0), Outcome::Nothing);
        for t in [10.0, 100.0, 1000.0] {
            assert_eq!(m.tick(t), (vec![], Outcome::Nothing));
        }
        assert_eq!(m.gen(), 2);
    }

    #[test]
    fn the_job_ends_when_the_finishing_generation_is_done_or_a_worker_fails() {
        let mut m = Membership::new(2, 5.0);
        m.ready("a.0");
        m.ready("b.0");
        m.ready("c.0"); // gen 2: c joined ...
        assert_eq!(m.gen(), 2);
        // ... but a and b finished in gen 1 before switching; c is stopped.
        assert_eq!(m.done("a.0", 1), Outcome::Nothing);
        assert_eq!(
            m.ready("d.0"),
            Outcome::Nothing,
            "no growth while finishing"
        );
        assert!(matches!(m.done("b.0", 1), Outcome::End { code: 0, .. }));

        let mut m = Membership::new(1, 5.0);
        m.ready("a.0");
        let out = m.exited("a.0", 3, "on n1");
        assert_eq!(
            out,
            Outcome::End {
                code: 3,
                reason: "worker a.0 on n1 exited with code 3".into()
            }
        );
        assert_eq!(m.ready("b.0"), Outcome::Nothing);
    }

    #[test]
    fn members_exiting_zero_finish_the_job_and_pending_workers_drop_silently() {
        let mut m = Membership::new(2, 5.0);
        m.ready("a.0");
        // A pending worker that goes away before any generation: no generation.
        assert_eq!(m.drop_workers(&ids(&["a.0"]), true), Outcome::Nothing);
        assert_eq!(m.gen(), 0);
        m.ready("a.1");
        let g = ann(m.ready("b.0"));
        assert_eq!((g.gen, names(&g)), (1, vec!["a.1", "b.0"]));
        m.ready("c.0");
        // Exit 0 without `done` (the script ended outside the wrapper) counts as done.
        assert_eq!(m.exited("a.1", 0, "on a"), Outcome::Nothing);
        assert_eq!(m.exited("b.0", 0, "on b"), Outcome::Nothing);
        assert!(matches!(
            m.exited("c.0", 0, "on c"),
            Outcome::End { code: 0, .. }
        ));
        // Nothing after the end.
        assert_eq!(m.ready("d.0"), Outcome::Nothing);
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
        check(m.ready("a.0"));
        check(m.ready("b.0"));
        check(m.broken("a.0", 2, 1.0));
        check(m.tick(3.0).1);
        check(m.exited("a.0", -9, "on a"));
        check(m.ready("a.1"));
        check(m.drop_workers(&ids(&["b.0", "a.1"]), true));
        check(m.ready("b.1"));
        // 1 [a] 2 [a b] 3 [a] (b silent) - (nobody left) 4 [a.1] - (nobody) 5 [b.1]
        assert_eq!(m.gen(), 5);
    }

    #[test]
    fn renewal_keeps_the_members_in_a_new_generation_only_when_one_is_formed() {
        let mut m = Membership::new(2, 5.0);
        m.ready("a.0");
        // Nothing formed yet.
        assert_eq!(m.renew(), Outcome::Nothing);
        let g = ann(m.ready("b.0"));
        assert_eq!(g.gen, 1);
        let g = ann(m.renew());
        assert_eq!((g.gen, names(&g), g.dead.len()), (2, vec!["a.0", "b.0"], 0));
        // While an abort is under way the re-formation carries the change.
        assert_eq!(m.broken("a.0", 2, 1.0), Outcome::Abort(2));
        assert_eq!(m.renew(), Outcome::Nothing);
        assert_eq!(m.gen(), 2);
        let mut m = Membership::new(1, 5.0);
        m.ready("a.0");
        assert!(matches!(
            m.exited("a.0", 0, "on a"),
            Outcome::End { code: 0, .. }
        ));
        assert_eq!(m.renew(), Outcome::Nothing);
    }

    #[test]
    fn everyone_lost_then_a_restarted_worker_forms_a_new_world() {
        let mut m = Membership::new(1, 5.0);
        m.ready("a.0");
        assert_eq!(m.exited("a.0", -9, "on n1"), Outcome::Nothing);
        let g = ann(m.ready("a.1"));
        assert_eq!((g.gen, names(&g)), (2, vec!["a.1"]));
    }

    #[test]
    fn an_agent_giving_up_ends_the_job_once_nobody_is_left() {
        let mut m = Membership::new(1, 5.0);
        m.ready("a.0");
        m.ready("b.0");
        // b's agent gives up while a still trains: the job goes on.
        assert_eq!(m.exited("b.0", -11, "on b").clone(), ann_ok(&mut m));
        assert_eq!(m.gave_up("b gave up".into()), Outcome::Nothing);
        // a dies too and nobody is left: the job ends with the reason.
        assert_eq!(
            m.exited("a.0", -9, "on a"),
            Outcome::End {
                code: 1,
                reason: "b gave up".into()
            }
        );
        let mut m = Membership::new(1, 5.0);
        m.ready("a.0");
        m.exited("a.0", -11, "on a");
        assert!(matches!(
            m.gave_up("x".into()),
            Outcome::End { code: 1, .. }
        ));
    }

    fn ann_ok(m: &mut Membership) -> Outcome {
        Outcome::Announce(Gen {
            gen: m.gen(),
            members: ids(&["a.0"]),
            dead: ids(&["b.0"]),
        })
    }
}
