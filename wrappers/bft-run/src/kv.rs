//! The job's key-value store, held by the coordinator: what torch.distributed's
//! rendezvous (process-group setup, the generation's go/abandon decision) needs,
//! reached by workers only through their agent's authenticated connection. No port
//! of its own, so no other user can read or write a key (docs/design.md, "Trust").
//!
//! The operations follow c10d's `Store` (TCPStore's semantics): `set`, `get` (waits
//! for the key), `add`, `compare_set`, `wait`, `check`, `delete`, `num_keys`. Values
//! are bytes; on the wire they travel as hex.

use std::collections::HashMap;

/// Who asked, to route the answer: (agent id, worker id, request id).
pub type Asker = (u64, String, u64);

/// The most the store holds, keys and values together: a worker filling it hurts only
/// its own job, but must not exhaust the coordinator's memory.
pub const MAX_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Set(String, Vec<u8>),
    Get(String),
    Add(String, i64),
    CompareSet(String, Vec<u8>, Vec<u8>),
    Wait(Vec<String>),
    Check(Vec<String>),
    Delete(String),
    NumKeys,
}

/// An answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Done,
    Value(Vec<u8>),
    Int(i64),
    Bool(bool),
    Error(String),
}

struct Waiter {
    asker: Asker,
    keys: Vec<String>,
    /// For `get`: answer with the value of keys[0].
    get: bool,
    deadline: f64,
}

#[derive(Default)]
pub struct Kv {
    map: HashMap<String, Vec<u8>>,
    bytes: usize,
    waiters: Vec<Waiter>,
    /// Generations below this one are abandoned (a member failed after they were
    /// announced), and these too (aborted): a request on their keys fails at once.
    abandoned_below: u64,
    aborted: std::collections::BTreeSet<u64>,
}

impl Kv {
    /// Runs `op` for `asker` at time `now`; a `get` or `wait` of a missing key is held
    /// until the key appears or `timeout` seconds pass. Returns the answers due now
    /// (this request's, and those of waiters the op released).
    pub fn apply(&mut self, asker: Asker, op: Op, now: f64, timeout: f64) -> Vec<(Asker, Reply)> {
        let mut out = Vec::new();
        if let Some(g) = self.gone_gen(&op) {
            out.push((
                asker,
                Reply::Error(format!("generation {g} was abandoned (a member failed)")),
            ));
            return out;
        }
        // A generation that formed: every member has left the setups of the earlier
        // ones, whose keys can go.
        let formed = match &op {
            Op::CompareSet(k, _, d) if d.as_slice() == b"go" => k
                .strip_suffix("/decision")
                .and_then(|g| key_gen(&format!("{g}/"))),
            _ => None,
        };
        let wrote = match op {
            Op::Set(k, v) => match self.put(k, v) {
                Ok(()) => {
                    out.push((asker, Reply::Done));
                    true
                }
                Err(e) => {
                    out.push((asker, Reply::Error(e)));
                    false
                }
            },
            Op::Get(k) => {
                match self.map.get(&k) {
                    Some(v) => out.push((asker, Reply::Value(v.clone()))),
                    None => self.waiters.push(Waiter {
                        asker,
                        keys: vec![k],
                        get: true,
                        deadline: now + timeout,
                    }),
                }
                false
            }
            Op::Add(k, d) => {
                let cur = match self.map.get(&k) {
                    None => Ok(0),
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                        .ok_or_else(|| format!("add: the value of key {k:?} is not a number")),
                };
                match cur {
                    Ok(c) => {
                        let n = c.saturating_add(d);
                        match self.put(k, n.to_string().into_bytes()) {
                            Ok(()) => {
                                out.push((asker, Reply::Int(n)));
                                true
                            }
                            Err(e) => {
                                out.push((asker, Reply::Error(e)));
                                false
                            }
                        }
                    }
                    Err(e) => {
                        out.push((asker, Reply::Error(e)));
                        false
                    }
                }
            }
            Op::CompareSet(k, expected, desired) => {
                // TCPStore's rule: a missing key is set only when `expected` is empty;
                // the answer is the value after the operation (or `expected` when a
                // missing key was not set).
                let cur = self.map.get(&k).cloned();
                let (set, answer) = match cur {
                    None if expected.is_empty() => (true, desired.clone()),
                    None => (false, expected),
                    Some(c) if c == expected => (true, desired.clone()),
                    Some(c) => (false, c),
                };
                if set {
                    if let Err(e) = self.put(k, desired) {
                        out.push((asker, Reply::Error(e)));
                        return out;
                    }
                }
                out.push((asker, Reply::Value(answer)));
                set
            }
            Op::Wait(keys) => {
                if keys.iter().all(|k| self.map.contains_key(k)) {
                    out.push((asker, Reply::Done));
                } else {
                    self.waiters.push(Waiter {
                        asker,
                        keys,
                        get: false,
                        deadline: now + timeout,
                    });
                }
                false
            }
            Op::Check(keys) => {
                let all = keys.iter().all(|k| self.map.contains_key(k));
                out.push((asker, Reply::Bool(all)));
                false
            }
            Op::Delete(k) => {
                let had = self.remove(&k);
                out.push((asker, Reply::Bool(had)));
                false
            }
            Op::NumKeys => {
                out.push((asker, Reply::Int(self.map.len() as i64)));
                false
            }
        };
        if wrote {
            self.release(&mut out);
        }
        if let Some(g) = formed.filter(|_| wrote) {
            self.prune_before(g);
        }
        out
    }

    /// The abandoned generation whose key (a `get` or `wait`) `op` asks for.
    fn gone_gen(&self, op: &Op) -> Option<u64> {
        let keys: Vec<&String> = match op {
            Op::Get(k) => vec![k],
            Op::Wait(ks) => ks.iter().collect(),
            _ => return None,
        };
        keys.iter()
            .filter_map(|k| key_gen(k))
            .find(|g| *g < self.abandoned_below || self.aborted.contains(g))
    }

    /// Marks generation `gen` aborted and answers the waiters on its keys.
    pub fn abort(&mut self, gen: u64) -> Vec<(Asker, Reply)> {
        self.aborted.insert(gen);
        while self.aborted.len() > 64 {
            self.aborted.pop_first();
        }
        self.abandon(|g| g == gen)
    }

    /// Marks every generation below `gen` abandoned and answers their waiters.
    pub fn abandon_below(&mut self, gen: u64) -> Vec<(Asker, Reply)> {
        self.abandoned_below = self.abandoned_below.max(gen);
        self.abandon(|g| g < gen)
    }

    fn put(&mut self, k: String, v: Vec<u8>) -> Result<(), String> {
        let old = self.map.get(&k).map_or(0, |o| k.len() + o.len());
        let new = k.len() + v.len();
        if self.bytes - old + new > MAX_BYTES {
            return Err(format!(
                "the job's store is full ({} MiB); keys of old generations are removed as new ones form",
                MAX_BYTES >> 20
            ));
        }
        self.bytes = self.bytes - old + new;
        self.map.insert(k, v);
        Ok(())
    }

    fn remove(&mut self, k: &str) -> bool {
        match self.map.remove(k) {
            Some(v) => {
                self.bytes -= k.len() + v.len();
                true
            }
            None => false,
        }
    }

    fn release(&mut self, out: &mut Vec<(Asker, Reply)>) {
        let map = &self.map;
        self.waiters.retain(|w| {
            if !w.keys.iter().all(|k| map.contains_key(k)) {
                return true;
            }
            let reply = if w.get {
                Reply::Value(map[&w.keys[0]].clone())
            } else {
                Reply::Done
            };
            out.push((w.asker.clone(), reply));
            false
        });
    }

    /// Waiters past their deadline, answered with a timeout error.
    pub fn expire(&mut self, now: f64) -> Vec<(Asker, Reply)> {
        let mut out = Vec::new();
        self.waiters.retain(|w| {
            if now < w.deadline {
                return true;
            }
            out.push((
                w.asker.clone(),
                Reply::Error(format!("timed out waiting for key(s) {:?}", w.keys)),
            ));
            false
        });
        out
    }

    /// Answers with an error the waiters on keys of the generations `gone` says are
    /// abandoned (a member failed): a process-group setup blocked on a dead member's
    /// key gives up at once instead of at its timeout.
    fn abandon(&mut self, gone: impl Fn(u64) -> bool) -> Vec<(Asker, Reply)> {
        let mut out = Vec::new();
        self.waiters.retain(|w| {
            let Some(g) = w.keys.iter().find_map(|k| key_gen(k)).filter(|g| gone(*g)) else {
                return true;
            };
            out.push((
                w.asker.clone(),
                Reply::Error(format!("generation {g} was abandoned (a member failed)")),
            ));
            false
        });
        out
    }

    /// Forgets the waiters of an agent that is gone.
    pub fn forget_agent(&mut self, agent: u64) {
        self.waiters.retain(|w| w.asker.0 != agent);
    }

    /// Removes the keys of generations before `gen` (keys `g{N}/...`), once no
    /// member can still be entering them.
    pub fn prune_before(&mut self, gen: u64) {
        let old: Vec<String> = self
            .map
            .keys()
            .filter(|k| key_gen(k).is_some_and(|g| g < gen))
            .cloned()
            .collect();
        for k in old {
            self.remove(&k);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// The generation a key belongs to: `g12/...` is 12's.
fn key_gen(k: &str) -> Option<u64> {
    k.strip_prefix('g')?.split('/').next()?.parse().ok()
}

pub fn to_hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err("a hex value of odd length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(s.get(i..i + 2).unwrap_or("?"), 16)
                .map_err(|_| "a value that is not hex".to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(id: u64) -> Asker {
        (1, "1.0".into(), id)
    }

    fn one(mut v: Vec<(Asker, Reply)>) -> Reply {
        assert_eq!(v.len(), 1, "{v:?}");
        v.pop().unwrap().1
    }

    #[test]
    fn set_get_add_and_compare_set_follow_tcpstore() {
        let mut kv = Kv::default();
        assert_eq!(
            one(kv.apply(who(1), Op::Set("a".into(), b"x".to_vec()), 0.0, 5.0)),
            Reply::Done
        );
        assert_eq!(
            one(kv.apply(who(2), Op::Get("a".into()), 0.0, 5.0)),
            Reply::Value(b"x".to_vec())
        );
        assert_eq!(
            one(kv.apply(who(3), Op::Add("n".into(), 2), 0.0, 5.0)),
            Reply::Int(2)
        );
        assert_eq!(
            one(kv.apply(who(4), Op::Add("n".into(), 0), 0.0, 5.0)),
            Reply::Int(2)
        );
        let e = one(kv.apply(who(5), Op::Add("a".into(), 1), 0.0, 5.0));
        assert!(matches!(e, Reply::Error(m) if m.contains("not a number")));
        let cas = |kv: &mut Kv, e: &[u8], d: &[u8]| {
            one(kv.apply(
                who(6),
                Op::CompareSet("d".into(), e.to_vec(), d.to_vec()),
                0.0,
                5.0,
            ))
        };
        assert_eq!(
            cas(&mut kv, b"q", b"go"),
            Reply::Value(b"q".to_vec()),
            "missing, not set"
        );
        assert_eq!(cas(&mut kv, b"", b"go"), Reply::Value(b"go".to_vec()));
        assert_eq!(
            cas(&mut kv, b"", b"abandon"),
            Reply::Value(b"go".to_vec()),
            "first wins"
        );
        assert_eq!(
            one(kv.apply(who(7), Op::Check(vec!["a".into(), "zz".into()]), 0.0, 5.0)),
            Reply::Bool(false)
        );
        assert_eq!(one(kv.apply(who(8), Op::NumKeys, 0.0, 5.0)), Reply::Int(3));
        assert_eq!(
            one(kv.apply(who(9), Op::Delete("a".into()), 0.0, 5.0)),
            Reply::Bool(true)
        );
        assert_eq!(kv.len(), 2);
    }

    #[test]
    fn get_and_wait_are_held_until_the_key_or_the_deadline() {
        let mut kv = Kv::default();
        assert!(kv.apply(who(1), Op::Get("k".into()), 0.0, 5.0).is_empty());
        assert!(kv
            .apply(who(2), Op::Wait(vec!["k".into(), "j".into()]), 0.0, 5.0)
            .is_empty());
        let out = kv.apply(who(3), Op::Set("k".into(), b"v".to_vec()), 1.0, 5.0);
        assert_eq!(
            out,
            vec![(who(3), Reply::Done), (who(1), Reply::Value(b"v".to_vec()))]
        );
        assert!(kv.expire(4.9).is_empty());
        let out = kv.expire(5.0);
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0].1, Reply::Error(m) if m.contains("timed out")));
        kv.apply(who(4), Op::Wait(vec!["x".into()]), 0.0, 5.0);
        kv.forget_agent(1);
        assert!(kv.expire(100.0).is_empty());
        // A setup waiting on a key of an abandoned generation is told at once, and so
        // is one that asks later.
        kv.apply(who(5), Op::Get("g3/pg/rank1".into()), 0.0, 5.0);
        kv.apply(who(6), Op::Get("g4/pg/rank1".into()), 0.0, 5.0);
        let out = kv.abandon_below(4);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, who(5));
        assert!(matches!(&out[0].1, Reply::Error(m) if m.contains("generation 3 was abandoned")));
        let late = one(kv.apply(who(7), Op::Wait(vec!["g2/x".into()]), 0.0, 5.0));
        assert!(matches!(late, Reply::Error(m) if m.contains("generation 2 was abandoned")));
        let out = kv.abort(4);
        assert_eq!(out.len(), 1, "the waiter on g4");
        let late = one(kv.apply(who(8), Op::Get("g4/y".into()), 0.0, 5.0));
        assert!(matches!(late, Reply::Error(_)));
        assert!(
            kv.apply(who(9), Op::Get("g5/y".into()), 0.0, 5.0)
                .is_empty(),
            "g5 is alive"
        );
    }

    #[test]
    fn old_generations_are_pruned_once_a_newer_one_formed_and_size_is_capped() {
        let mut kv = Kv::default();
        for k in ["g1/a", "g2/pg/x", "g3/b", "other"] {
            kv.apply(who(1), Op::Set(k.into(), vec![0; 10]), 0.0, 5.0);
        }
        // "abandon" decides nothing: nothing goes.
        kv.apply(
            who(2),
            Op::CompareSet("g3/decision".into(), vec![], b"abandon".to_vec()),
            0.0,
            5.0,
        );
        assert_eq!(kv.len(), 5);
        kv.apply(
            who(2),
            Op::CompareSet("g4/decision".into(), vec![], b"go".to_vec()),
            0.0,
            5.0,
        );
        assert_eq!(kv.len(), 2, "g4/decision and other");
        let big = vec![0u8; MAX_BYTES];
        let e = one(kv.apply(who(2), Op::Set("big".into(), big), 0.0, 5.0));
        assert!(matches!(e, Reply::Error(m) if m.contains("full")));
        assert_eq!(
            from_hex(&to_hex(&[0, 1, 254, 255])),
            Ok(vec![0, 1, 254, 255])
        );
        assert!(from_hex("abc").is_err() && from_hex("zz").is_err());
    }
}
