//! Idle fragments from accounting records (slurmdbd via `sacct`): which nodes regular
//! jobs held when, turned into a node trace. Pure over records; the daemon reads them.

use crate::error::{Error, Result};
use crate::trace::{NodeChange, NodeTrace};
use std::collections::HashMap;

/// One regular job's tenure on its nodes, as accounting recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobUsage {
    pub job_id: String,
    /// Unix seconds; `None` for jobs that never started.
    pub start: Option<i64>,
    /// Unix seconds; `None` while still running (counts as running until the window's end).
    pub end: Option<i64>,
    /// Slurm hostlist expression (`node[01-03,07],gpu1`), or `None assigned`.
    pub nodelist: String,
}

/// Expands a Slurm hostlist expression: `a[1-3,05],b` -> a1 a2 a3 a05 b. Zero padding
/// of a range's bounds is kept. Returns a message naming the bad part on failure.
pub fn expand_hostlist(expr: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let e = expr.trim();
    if e.is_empty() || e == "None assigned" || e == "(null)" {
        return Ok(out);
    }
    // Split on commas outside brackets.
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = e.as_bytes();
    let mut parts = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(&e[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced ']' in hostlist {expr:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '[' in hostlist {expr:?}"));
    }
    parts.push(&e[start..]);
    for p in parts {
        if p.is_empty() {
            return Err(format!("empty host name in hostlist {expr:?}"));
        }
        expand_one(p, &mut out).map_err(|m| format!("{m} in hostlist {expr:?}"))?;
    }
    Ok(out)
}

fn expand_one(p: &str, out: &mut Vec<String>) -> std::result::Result<(), String> {
    let Some(open) = p.find('[') else {
        out.push(p.to_string());
        return Ok(());
    };
    let close = p[open..].find(']').map(|c| c + open).ok_or("missing ']'")?;
    let (prefix, body, rest) = (&p[..open], &p[open + 1..close], &p[close + 1..]);
    let mut tails = Vec::new();
    expand_one(rest, &mut tails).or_else(|e| if rest.is_empty() { Ok(()) } else { Err(e) })?;
    if rest.is_empty() {
        tails = vec![String::new()];
    }
    for r in body.split(',') {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        let lo: u64 = a.parse().map_err(|_| format!("bad range {r:?}"))?;
        let hi: u64 = b.parse().map_err(|_| format!("bad range {r:?}"))?;
        if hi < lo || hi - lo > 1_000_000 {
            return Err(format!("bad range {r:?}"));
        }
        let width = a.len();
        for v in lo..=hi {
            for t in &tails {
                out.push(format!("{prefix}{v:0width$}{t}"));
            }
        }
    }
    Ok(())
}

/// Builds the idle trace of `nodes` over [from, to) from job records: a node is idle
/// whenever no record covers it. Records on nodes not in `nodes` are rejected (the
/// node list should come from the same cluster). Overlapping records on a node (shared
/// nodes, job steps) are counted, so a node is idle only when all have ended.
pub fn fragments_from_usage(
    nodes: &[String],
    records: &[JobUsage],
    from: i64,
    to: i64,
) -> Result<NodeTrace> {
    let mut sweep = Sweep::new(nodes, from, to, records)?;
    let mut changes = Vec::new();
    sweep.window(records, from, to, &mut changes)?;
    Ok(NodeTrace {
        names: nodes.to_vec(),
        start: from,
        end: to,
        initial_idle: sweep.initial_idle,
        changes,
        forecasts: Vec::new(),
    })
}

/// The idle trace of [`fragments_from_usage`] built a read window at a time, so that a
/// year of accounting is never held: [`Sweep::new`] takes the records of the first
/// window for the state at `from`; [`Sweep::window`] takes each window's records (every
/// record overlapping it, read a second wider on either side so that a run ending or
/// starting on an edge is not lost to how the database compares times; a record that
/// spans windows comes in each) and emits the changes whose time lies in it. Each event lies in one window, so none is counted
/// twice, and the changes are those of the whole window at once.
pub struct Sweep {
    index: HashMap<String, u32>,
    from: i64,
    to: i64,
    /// Records covering each node now.
    busy: Vec<i32>,
    /// Whether each node is idle, as last emitted.
    state: Vec<bool>,
    pub initial_idle: Vec<bool>,
    deltas: Vec<(i64, u32, i32)>,
    touched: Vec<u32>,
}

impl Sweep {
    /// The state at `from` from the records of the first window.
    pub fn new(nodes: &[String], from: i64, to: i64, first: &[JobUsage]) -> Result<Self> {
        if to <= from {
            return Err(Error::Config(format!(
                "window end {to} must be after its start {from}"
            )));
        }
        let mut sw = Sweep {
            index: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u32))
                .collect(),
            from,
            to,
            busy: vec![0; nodes.len()],
            state: Vec::new(),
            initial_idle: Vec::new(),
            deltas: Vec::new(),
            touched: Vec::new(),
        };
        // Runs that started by `from` and go on after it hold their nodes at the start.
        sw.deltas_of(first, |s, _| s <= from, |_| false)?;
        for &(_, n, d) in &sw.deltas {
            sw.busy[n as usize] += d;
        }
        sw.deltas.clear();
        sw.initial_idle = sw.busy.iter().map(|&b| b == 0).collect();
        sw.state = sw.initial_idle.clone();
        Ok(sw)
    }

    /// Appends to `out` the changes with a time in [lo, hi) (and after `from`), from
    /// every record overlapping that window.
    pub fn window(
        &mut self,
        records: &[JobUsage],
        lo: i64,
        hi: i64,
        out: &mut Vec<NodeChange>,
    ) -> Result<()> {
        let from = self.from;
        let inside = move |t: i64| t > from && t >= lo && t < hi;
        self.deltas_of(records, move |t, _| inside(t), inside)?;
        // Releases before claims at the same time, so back-to-back jobs leave no gap.
        self.deltas.sort_unstable_by_key(|&(t, n, d)| (t, d, n));
        let mut i = 0;
        while i < self.deltas.len() {
            let t = self.deltas[i].0;
            while i < self.deltas.len() && self.deltas[i].0 == t {
                let (_, n, d) = self.deltas[i];
                self.busy[n as usize] += d;
                self.touched.push(n);
                i += 1;
            }
            self.touched.sort_unstable();
            self.touched.dedup();
            for &n in &self.touched {
                let idle = self.busy[n as usize] == 0;
                if idle != self.state[n as usize] {
                    self.state[n as usize] = idle;
                    out.push(NodeChange {
                        t,
                        node: n,
                        idle,
                        reclaim_at: None,
                    });
                }
            }
            self.touched.clear();
        }
        self.deltas.clear();
        Ok(())
    }

    /// The claims (+1 at a run's start, from `from` on) for which `claim(start, end)`
    /// holds and the releases (-1 at its end, before `to`) for which `release(end)`
    /// holds, of the runs that overlap [from, to).
    fn deltas_of(
        &mut self,
        records: &[JobUsage],
        claim: impl Fn(i64, i64) -> bool,
        release: impl Fn(i64) -> bool,
    ) -> Result<()> {
        let (from, to) = (self.from, self.to);
        for (k, r) in records.iter().enumerate() {
            let Some(s) = r.start else { continue };
            let e = r.end.unwrap_or(to);
            if e < s {
                return Err(Error::Parse {
                    what: "accounting records".into(),
                    line: k as u64 + 1,
                    msg: format!("job {} ends ({e}) before it starts ({s})", r.job_id),
                });
            }
            if e <= from || s >= to || e == s {
                continue;
            }
            let (c, rel) = (claim(s.max(from), e), e < to && release(e));
            if !c && !rel {
                continue;
            }
            let hosts = expand_hostlist(&r.nodelist).map_err(|msg| Error::Parse {
                what: "accounting records".into(),
                line: k as u64 + 1,
                msg: format!("job {}: {msg}", r.job_id),
            })?;
            for h in hosts {
                let Some(&n) = self.index.get(h.as_str()) else {
                    return Err(Error::Parse {
                        what: "accounting records".into(),
                        line: k as u64 + 1,
                        msg: format!("job {} ran on unknown node {h}", r.job_id),
                    });
                };
                if c {
                    self.deltas.push((s.max(from), n, 1));
                }
                if rel {
                    self.deltas.push((e, n, -1));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists() {
        assert_eq!(
            expand_hostlist("c[01-03],d7").unwrap(),
            ["c01", "c02", "c03", "d7"]
        );
        assert_eq!(expand_hostlist("n[1,3-4]x").unwrap(), ["n1x", "n3x", "n4x"]);
        assert_eq!(
            expand_hostlist("None assigned").unwrap(),
            Vec::<String>::new()
        );
        assert!(expand_hostlist("c[1-").is_err());
        assert!(expand_hostlist("c[3-1]").is_err());
    }

    /// Nodes a,b,c over [0,100): j1 on a,b [10,50); j2 on b [50,80) (back to back with
    /// j1 on b); j3 on c from -5, still running. Hand-worked: a idle [0,10) and
    /// [50,100); b idle [0,10) and [80,100); c never idle.
    #[test]
    fn fragments_hand_worked() {
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let u = |id: &str, s, e, nl: &str| JobUsage {
            job_id: id.into(),
            start: s,
            end: e,
            nodelist: nl.into(),
        };
        let recs = [
            u("1", Some(10), Some(50), "a,b"),
            u("2", Some(50), Some(80), "b"),
            u("3", Some(-5), None, "c"),
            u("4", None, None, "None assigned"),
        ];
        let tr = fragments_from_usage(&nodes, &recs, 0, 100).unwrap();
        assert_eq!(tr.initial_idle, [true, true, false]);
        let ch: Vec<(i64, u32, bool)> = tr.changes.iter().map(|c| (c.t, c.node, c.idle)).collect();
        assert_eq!(
            ch,
            vec![(10, 0, false), (10, 1, false), (50, 0, true), (80, 1, true)]
        );
        // (10 + 50) + (10 + 20) node-seconds idle over 100 s.
        assert!((tr.mean_idle() - 0.9).abs() < 1e-12);
        // Read a window at a time (each window gets the records overlapping it and a
        // second either side, as the replay asks slurmdbd): the same trace, for any
        // window length and start.
        for from in [0, 30, 50] {
            let whole = fragments_from_usage(&nodes, &recs, from, 100).unwrap();
            for len in [1, 3, 10, 20, 100] {
                let overlapping = |w: i64, e: i64| -> Vec<JobUsage> {
                    let (w, e) = (w - 1, e + 1);
                    recs.iter()
                        .filter(|r| r.start.is_some_and(|s| s < e) && r.end.map_or(true, |x| x > w))
                        .cloned()
                        .collect()
                };
                let first = overlapping(from, (from + len).min(100));
                let mut sw = Sweep::new(&nodes, from, 100, &first).unwrap();
                let mut changes = Vec::new();
                let mut w = from;
                while w < 100 {
                    let e = (w + len).min(100);
                    sw.window(&overlapping(w, e), w, e, &mut changes).unwrap();
                    w = e;
                }
                assert_eq!(
                    sw.initial_idle, whole.initial_idle,
                    "from {from}, windows of {len}"
                );
                assert_eq!(changes, whole.changes, "from {from}, windows of {len}");
            }
        }
        let bad = [u("9", Some(1), Some(2), "zz")];
        assert!(fragments_from_usage(&nodes, &bad, 0, 100)
            .unwrap_err()
            .to_string()
            .contains("unknown node zz"));
    }
}
