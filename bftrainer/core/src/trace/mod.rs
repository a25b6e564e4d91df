//! Input parsers, pure over `BufRead`: node-event traces (`time,node,idle`), elastic job
//! files (`jobs-*.csv`) and SWF job logs. Every rejection names the line and the problem.

pub mod fragments;
pub mod jobs;
pub mod swf;

use crate::error::{Error, Result};
use crate::timefmt::parse_time;
use std::collections::HashMap;
use std::io::BufRead;

/// One change of a node's state as seen by the main scheduler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeChange {
    /// Unix seconds.
    pub t: i64,
    /// Index into `NodeTrace::names`.
    pub node: u32,
    /// true: the node became idle (or its reclaim prediction changed); false: a regular
    /// job took it.
    pub idle: bool,
    /// Predicted time (Unix seconds) at which a regular job takes the idle node back.
    pub reclaim_at: Option<i64>,
}

/// Which nodes are idle when: an initial state at `start` and the changes after it,
/// sorted by time. Produced by the node-event parser, the EASY model and the sacct
/// fragment builder alike.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeTrace {
    pub names: Vec<String>,
    pub start: i64,
    /// Last time covered by the trace (the last change, or the window's end).
    pub end: i64,
    pub initial_idle: Vec<bool>,
    pub changes: Vec<NodeChange>,
    /// Plan-wide reclaim forecasts `(t, reclaim_at)`: from `t` on, every node idle at `t`
    /// (after the changes of `t`) is forecast to be reclaimed at `reclaim_at` (`None`:
    /// no forecast). The EASY model emits these instead of one update per idle node.
    pub forecasts: Vec<(i64, Option<i64>)>,
}

impl NodeTrace {
    /// Time-weighted mean number of idle nodes over [start, end].
    pub fn mean_idle(&self) -> f64 {
        let span = (self.end - self.start) as f64;
        if span <= 0.0 {
            return self.initial_idle.iter().filter(|&&b| b).count() as f64;
        }
        let mut idle = self.initial_idle.clone();
        let mut count = idle.iter().filter(|&&b| b).count() as i64;
        let (mut last, mut area) = (self.start, 0.0);
        for c in &self.changes {
            area += count as f64 * (c.t - last) as f64;
            last = c.t;
            let i = c.node as usize;
            if idle[i] != c.idle {
                count += if c.idle { 1 } else { -1 };
                idle[i] = c.idle;
            }
        }
        area += count as f64 * (self.end - last) as f64;
        area / span
    }
}

/// Window and subset of a node-event trace.
#[derive(Debug, Clone, Default)]
pub struct TraceWindow {
    /// Replay from this time (Unix seconds): earlier changes only shape the initial state.
    pub start: Option<i64>,
    /// Stop after this time.
    pub end: Option<i64>,
    /// Keep only the first N nodes in file order.
    pub node_limit: Option<usize>,
}

/// Reads lines with a running line number, turning reader errors (a truncated gzip
/// stream, invalid UTF-8) into `Error::Read` with the position reached.
pub(crate) struct Lines<R> {
    reader: R,
    pub what: String,
    pub line: u64,
    pub buf: String,
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R, what: &str) -> Self {
        Self {
            reader,
            what: what.to_string(),
            line: 0,
            buf: String::new(),
        }
    }

    /// Reads the next line into `buf`; false at end of input.
    pub fn advance(&mut self) -> Result<bool> {
        self.buf.clear();
        match self.reader.read_line(&mut self.buf) {
            Ok(0) => Ok(false),
            Ok(_) => {
                self.line += 1;
                let n = self.buf.trim_end_matches(['\n', '\r']).len();
                self.buf.truncate(n);
                Ok(true)
            }
            Err(source) => Err(Error::Read {
                what: self.what.clone(),
                line: self.line,
                source,
            }),
        }
    }

    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::Parse {
            what: self.what.clone(),
            line: self.line,
            msg: msg.into(),
        }
    }
}

/// Parses a node-event trace: header `time,node,idle`; the rows at the first timestamp
/// give every node's initial state (and define the node set, in file order); each later
/// row is a change. Times must not decrease; a change for a node missing from the first
/// timestamp is rejected.
pub fn parse_node_events<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
) -> Result<NodeTrace> {
    let mut lines = Lines::new(reader, what);
    if !lines.advance()? {
        return Err(lines.err("empty input: expected header \"time,node,idle\""));
    }
    if lines.buf.trim() != "time,node,idle" {
        return Err(lines.err(format!(
            "expected header \"time,node,idle\", found {:?}",
            lines.buf
        )));
    }
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut idle: Vec<bool> = Vec::new();
    let mut changes: Vec<NodeChange> = Vec::new();
    let mut first_t: Option<i64> = None;
    let mut in_initial = true;
    let mut last_t = i64::MIN;
    // Cache the last timestamp's text: rows come in groups sharing one timestamp.
    let mut last_ts = String::new();
    let limit = win.node_limit.unwrap_or(usize::MAX);
    let start = win.start;
    let mut start_applied = false;
    let mut initial_at_start: Vec<bool> = Vec::new();
    let mut last_seen = i64::MIN;
    loop {
        if !lines.advance()? {
            break;
        }
        let line = lines.buf.as_str();
        if line.trim().is_empty() {
            continue;
        }
        let mut it = line.split(',');
        let (Some(ts), Some(node), Some(flag), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            let n = line.split(',').count();
            return Err(lines.err(format!(
                "expected 3 comma-separated fields time,node,idle, found {n}"
            )));
        };
        let t = if ts == last_ts {
            last_t
        } else {
            let t = parse_time(ts).map_err(|m| lines.err(m))?;
            if t < last_t {
                return Err(lines.err(format!(
                    "time {ts} is earlier than the previous row's {}: rows must be sorted by time",
                    crate::timefmt::format_time(last_t)
                )));
            }
            last_ts.clear();
            last_ts.push_str(ts);
            t
        };
        let st = match flag.trim() {
            "1" => true,
            "0" => false,
            f => return Err(lines.err(format!("idle must be 0 or 1, found {f:?}"))),
        };
        if node.is_empty() {
            return Err(lines.err("empty node name"));
        }
        if first_t.is_none() {
            first_t = Some(t);
        }
        if in_initial && Some(t) != first_t {
            in_initial = false;
        }
        if in_initial {
            if index.contains_key(node) {
                return Err(lines.err(format!("node {node} appears twice in the initial state")));
            }
            index.insert(node.to_string(), names.len() as u32);
            names.push(node.to_string());
            idle.push(st);
            last_t = t;
            continue;
        }
        let Some(&n) = index.get(node) else {
            return Err(lines.err(format!(
                "unknown node {node}: every node must appear in the initial state at the first timestamp"
            )));
        };
        last_t = t;
        if let Some(end) = win.end {
            if t > end {
                last_seen = end;
                break;
            }
        }
        last_seen = t;
        if (n as usize) >= limit {
            continue;
        }
        match start {
            Some(s) if t <= s => idle[n as usize] = st,
            _ => {
                if !start_applied {
                    start_applied = true;
                    initial_at_start = idle.clone();
                }
                changes.push(NodeChange {
                    t,
                    node: n,
                    idle: st,
                    reclaim_at: None,
                });
            }
        }
    }
    let Some(first) = first_t else {
        return Err(lines.err("no rows after the header"));
    };
    if !start_applied {
        initial_at_start = idle;
    }
    let n = names.len().min(limit);
    names.truncate(n);
    initial_at_start.truncate(n);
    let t0 = start.unwrap_or(first).max(first);
    if let Some(s) = start {
        if last_seen != i64::MIN && s > last_seen {
            return Err(Error::Config(format!(
                "--start {} is after the trace's last event at {}",
                crate::timefmt::format_time(s),
                crate::timefmt::format_time(last_seen)
            )));
        }
    }
    let end = win.end.unwrap_or(last_seen.max(t0)).max(t0);
    Ok(NodeTrace {
        names,
        start: t0,
        end,
        initial_idle: initial_at_start,
        changes,
        forecasts: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "time,node,idle\n\
        2021-01-01T00:00:00,a,0\n2021-01-01T00:00:00,b,1\n2021-01-01T00:00:00,c,0\n\
        2021-01-01T00:00:10,a,1\n2021-01-01T00:00:20,b,0\n2021-01-01T00:00:30,c,1\n";

    #[test]
    fn parses_initial_state_and_changes() {
        let tr = parse_node_events(T.as_bytes(), "t", &TraceWindow::default()).unwrap();
        assert_eq!(tr.names, ["a", "b", "c"]);
        assert_eq!(tr.initial_idle, [false, true, false]);
        assert_eq!(tr.changes.len(), 3);
        assert_eq!(tr.end - tr.start, 30);
        // idle: b for 20 s, a for 20 s (10..30), c 0 s => 40/30
        assert!((tr.mean_idle() - 40.0 / 30.0).abs() < 1e-12);
    }

    #[test]
    fn window_and_node_limit() {
        let s = parse_time("2021-01-01T00:00:15").unwrap();
        let w = TraceWindow {
            start: Some(s),
            end: None,
            node_limit: Some(2),
        };
        let tr = parse_node_events(T.as_bytes(), "t", &w).unwrap();
        assert_eq!(tr.names, ["a", "b"]);
        assert_eq!(tr.initial_idle, [true, true]);
        assert_eq!(
            tr.changes,
            vec![NodeChange {
                t: s + 5,
                node: 1,
                idle: false,
                reclaim_at: None
            }]
        );
        assert_eq!(tr.start, s);
    }

    fn err(input: &str) -> String {
        parse_node_events(input.as_bytes(), "x.csv", &TraceWindow::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn rejects_malformed_with_line_numbers() {
        let h = "time,node,idle\n2021-01-01T00:00:00,a,0\n";
        assert_eq!(err(&format!("{h}2021-01-01T00:00:05,zz,1\n")), "x.csv:3: unknown node zz: every node must appear in the initial state at the first timestamp");
        assert!(err(&format!("{h}2021-01-01T00:0:05,a,1\n")).starts_with("x.csv:3: bad timestamp"));
        assert!(err(&format!(
            "{h}2021-01-01T00:00:05,a,1\n2021-01-01T00:00:04,a,0\n"
        ))
        .starts_with("x.csv:4: time 2021-01-01T00:00:04 is earlier"));
        assert!(err(&format!("{h}2021-01-01T00:00:05,a,2\n")).contains(":3: idle must be 0 or 1"));
        assert!(err(&format!("{h}2021-01-01T00:00:05,a\n"))
            .contains(":3: expected 3 comma-separated fields"));
        assert!(err("time,node\n").starts_with("x.csv:1: expected header"));
        assert!(err("time,node,idle\n").contains("no rows"));
    }
}
