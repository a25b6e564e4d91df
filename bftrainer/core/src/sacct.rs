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
    if to <= from {
        return Err(Error::Config(format!(
            "window end {to} must be after its start {from}"
        )));
    }
    let index: HashMap<&str, u32> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i as u32))
        .collect();
    // (time, node, +1 busy / -1 released)
    let mut deltas: Vec<(i64, u32, i32)> = Vec::new();
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
        let hosts = expand_hostlist(&r.nodelist).map_err(|msg| Error::Parse {
            what: "accounting records".into(),
            line: k as u64 + 1,
            msg: format!("job {}: {msg}", r.job_id),
        })?;
        for h in hosts {
            let Some(&n) = index.get(h.as_str()) else {
                return Err(Error::Parse {
                    what: "accounting records".into(),
                    line: k as u64 + 1,
                    msg: format!("job {} ran on unknown node {h}", r.job_id),
                });
            };
            deltas.push((s.max(from), n, 1));
            if e < to {
                deltas.push((e, n, -1));
            }
        }
    }
    // Releases before claims at the same time, so back-to-back jobs leave no gap.
    deltas.sort_unstable_by_key(|&(t, n, d)| (t, d, n));
    let mut busy = vec![0i32; nodes.len()];
    let mut i = 0;
    while i < deltas.len() && deltas[i].0 <= from {
        busy[deltas[i].1 as usize] += deltas[i].2;
        i += 1;
    }
    let initial_idle: Vec<bool> = busy.iter().map(|&b| b == 0).collect();
    let mut changes = Vec::new();
    let mut touched: Vec<u32> = Vec::new();
    let mut state = initial_idle.clone();
    while i < deltas.len() {
        let t = deltas[i].0;
        while i < deltas.len() && deltas[i].0 == t {
            let (_, n, d) = deltas[i];
            busy[n as usize] += d;
            touched.push(n);
            i += 1;
        }
        touched.sort_unstable();
        touched.dedup();
        for &n in &touched {
            let idle = busy[n as usize] == 0;
            if idle != state[n as usize] {
                state[n as usize] = idle;
                changes.push(NodeChange {
                    t,
                    node: n,
                    idle,
                    reclaim_at: None,
                });
            }
        }
        touched.clear();
    }
    Ok(NodeTrace {
        names: nodes.to_vec(),
        start: from,
        end: to,
        initial_idle,
        changes,
        forecasts: Vec::new(),
    })
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
        let bad = [u("9", Some(1), Some(2), "zz")];
        assert!(fragments_from_usage(&nodes, &bad, 0, 100)
            .unwrap_err()
            .to_string()
            .contains("unknown node zz"));
    }
}
