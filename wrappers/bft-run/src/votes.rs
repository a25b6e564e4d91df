//! The agent's commit decision for a node's workers (sharded training, HSDP).
//!
//! Under HSDP a node's workers each hold one shard of the same replica, and each
//! shard's gradients are all-reduced with the same shard of the other nodes: in its
//! own process group. When a peer dies mid-step, the group of its shard fails while
//! another shard's group may complete. Without a decision, the node's worker of the
//! failed shard rolls back to step N-1 while its mate steps to N: the node holds no
//! whole replica any more, and if that happened on every node the state is lost.
//!
//! So a sharded step is committed all-or-none per node, by its agent (one process,
//! one decision, as in two-phase commit): each worker, once its step's collectives
//! completed and before its optimizer steps, sends `vote` {`gen`, `k`} (the k-th
//! optimizer step of this worker in generation `gen`) and waits for `decide`
//! {`gen`, `k`, `commit`}. The agent decides `commit: true` when every local member
//! of `gen` voted for `k`, and `commit: false` once `gen` cannot complete here: the
//! coordinator aborted it, a local member of it reported it `broken`, exited, or is
//! listed dead by a newer generation. A decision is final: a late voter gets the same
//! answer. Workers never vote when they are their node's only member.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Generations kept (older ones are forgotten: nobody votes in them any more).
const KEEP: usize = 16;

#[derive(Default)]
pub struct Votes {
    /// This node's members of each generation.
    local: BTreeMap<u64, BTreeSet<String>>,
    /// Generations that cannot commit another step here.
    failed: BTreeSet<u64>,
    /// Voters waiting, per (generation, step index).
    pending: BTreeMap<(u64, u64), BTreeSet<String>>,
    decided: BTreeMap<(u64, u64), bool>,
}

/// A `decide` for one worker: (worker, message).
pub type Reply = (String, Value);

impl Votes {
    /// A `gen` message: `local` are its members on this node.
    pub fn generation(&mut self, gen: u64, local: BTreeSet<String>, dead: &[String]) -> Vec<Reply> {
        let mut out = Vec::new();
        let hit: Vec<u64> = self
            .local
            .iter()
            .filter(|(_, m)| dead.iter().any(|d| m.contains(d)))
            .map(|(g, _)| *g)
            .collect();
        for g in hit {
            out.extend(self.fail(g));
        }
        self.local.insert(gen, local);
        while self.local.len() > KEEP {
            let (old, _) = self.local.pop_first().expect("not empty");
            self.failed.remove(&old);
            self.pending.retain(|(g, _), _| *g != old);
            self.decided.retain(|(g, _), _| *g != old);
        }
        out
    }

    /// Generation `gen` cannot complete here: every vote of it still open is lost.
    pub fn fail(&mut self, gen: u64) -> Vec<Reply> {
        self.failed.insert(gen);
        let open: Vec<(u64, u64)> = self
            .pending
            .range((gen, 0)..=(gen, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for key in open {
            let voters = self.pending.remove(&key).unwrap_or_default();
            self.decided.insert(key, false);
            out.extend(voters.into_iter().map(|w| (w.clone(), decide(key, false))));
        }
        out
    }

    /// A local worker reported generation `gen` broken.
    pub fn broken(&mut self, worker: &str, gen: u64) -> Vec<Reply> {
        if self.local.get(&gen).is_some_and(|m| m.contains(worker)) {
            self.fail(gen)
        } else {
            Vec::new()
        }
    }

    /// A local worker exited: the generations it is a member of cannot commit here.
    pub fn exited(&mut self, worker: &str) -> Vec<Reply> {
        let gens: Vec<u64> = self
            .local
            .iter()
            .filter(|(_, m)| m.contains(worker))
            .map(|(g, _)| *g)
            .collect();
        gens.into_iter().flat_map(|g| self.fail(g)).collect()
    }

    /// `worker` votes to commit its `k`-th step of generation `gen`.
    pub fn vote(&mut self, worker: &str, gen: u64, k: u64) -> Vec<Reply> {
        let key = (gen, k);
        let one = |c: bool| vec![(worker.to_string(), decide(key, c))];
        if let Some(&c) = self.decided.get(&key) {
            return one(c);
        }
        let Some(members) = self.local.get(&gen) else {
            // Not a generation this agent knows (long gone, or never announced).
            return one(false);
        };
        if self.failed.contains(&gen) || !members.contains(worker) {
            self.decided.insert(key, false);
            return one(false);
        }
        let voters = self.pending.entry(key).or_default();
        voters.insert(worker.to_string());
        if !members.is_subset(voters) {
            return Vec::new();
        }
        let voters = self.pending.remove(&key).unwrap_or_default();
        self.decided.insert(key, true);
        // Earlier steps of the generation were decided too (every member voted k).
        self.decided.retain(|(g, i), _| *g != gen || *i >= k);
        voters.into_iter().map(|w| (w, decide(key, true))).collect()
    }
}

fn decide((gen, k): (u64, u64), commit: bool) -> Value {
    json!({"t": "decide", "gen": gen, "k": k, "commit": commit})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ws: &[&str]) -> BTreeSet<String> {
        ws.iter().map(|s| s.to_string()).collect()
    }

    fn said(out: &[Reply]) -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = out
            .iter()
            .map(|(w, m)| (w.clone(), m["commit"].as_bool().unwrap()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_step_commits_once_every_local_member_voted() {
        let mut v = Votes::default();
        v.generation(3, set(&["a.0", "a.1"]), &[]);
        assert!(v.vote("a.0", 3, 0).is_empty());
        assert_eq!(
            said(&v.vote("a.1", 3, 0)),
            vec![("a.0".into(), true), ("a.1".into(), true)]
        );
        // The next step is a new vote.
        assert!(v.vote("a.1", 3, 1).is_empty());
    }

    #[test]
    fn a_mate_that_failed_the_step_makes_the_waiting_voter_roll_back_too() {
        // The defect this exists for: a.1's shard completed step N, a.0's failed.
        let mut v = Votes::default();
        v.generation(3, set(&["a.0", "a.1"]), &[]);
        assert!(v.vote("a.1", 3, 7).is_empty());
        assert_eq!(said(&v.broken("a.0", 3)), vec![("a.1".into(), false)]);
        // A decision is final, and the generation commits nothing more here.
        assert_eq!(said(&v.vote("a.0", 3, 7)), vec![("a.0".into(), false)]);
        assert_eq!(said(&v.vote("a.1", 3, 8)), vec![("a.1".into(), false)]);
    }

    #[test]
    fn an_abort_an_exit_or_a_dead_mate_decides_no() {
        let mut v = Votes::default();
        v.generation(1, set(&["a.0", "a.1"]), &[]);
        v.vote("a.0", 1, 0);
        assert_eq!(said(&v.fail(1)), vec![("a.0".into(), false)]);

        v.generation(2, set(&["a.0", "a.1"]), &[]);
        v.vote("a.1", 2, 0);
        assert_eq!(said(&v.exited("a.0")), vec![("a.1".into(), false)]);

        v.generation(4, set(&["a.2", "a.3"]), &[]);
        v.vote("a.2", 4, 0);
        // A newer generation lists a.3 dead: its generations cannot commit here.
        assert_eq!(
            said(&v.generation(5, set(&["a.2"]), &["a.3".into()])),
            vec![("a.2".into(), false)]
        );
        // Another node's death is not this node's business: a.2 alone commits in 5.
        assert_eq!(said(&v.vote("a.2", 5, 0)), vec![("a.2".into(), true)]);
        assert!(v.generation(6, set(&["a.2"]), &["b.0".into()]).is_empty());
    }

    #[test]
    fn a_decided_commit_stands_against_a_later_failure() {
        let mut v = Votes::default();
        v.generation(1, set(&["a.0", "a.1"]), &[]);
        v.vote("a.0", 1, 0);
        v.vote("a.1", 1, 0);
        assert!(v.broken("a.0", 1).is_empty());
        assert_eq!(said(&v.vote("a.0", 1, 0)), vec![("a.0".into(), true)]);
    }

    #[test]
    fn strangers_and_unknown_generations_are_refused() {
        let mut v = Votes::default();
        v.generation(1, set(&["a.0", "a.1"]), &[]);
        assert_eq!(said(&v.vote("a.9", 1, 0)), vec![("a.9".into(), false)]);
        assert_eq!(said(&v.vote("a.0", 2, 0)), vec![("a.0".into(), false)]);
        // A broken report of a non-member changes nothing.
        assert!(v.broken("a.9", 1).is_empty());
        v.vote("a.0", 1, 1);
        assert_eq!(said(&v.vote("a.1", 1, 1)).len(), 2);
    }

    #[test]
    fn old_generations_are_forgotten() {
        let mut v = Votes::default();
        for g in 0..100 {
            v.generation(g, set(&["a.0"]), &[]);
            v.vote("a.0", g, 0);
        }
        assert_eq!(v.local.len(), KEEP);
        assert!(v.decided.len() <= KEEP);
    }
}
