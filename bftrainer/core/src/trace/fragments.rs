//! Idle fragments of a node trace: each maximal span a node stays idle, bucketed by
//! duration on a log scale, weighted by node-minutes (can elastic jobs use them?).

use super::{Head, NodeChange, NodeEvents, NodeTrace, TraceItem};
use crate::error::Result;

/// Upper edges of the duration buckets, seconds; the last bucket is open.
pub const EDGES_S: [i64; 8] = [60, 120, 300, 600, 1800, 3600, 7200, 21600];

/// Labels of the buckets, in order (one more than `EDGES_S`).
pub const LABELS: [&str; 9] = [
    "<1 min",
    "1-2 min",
    "2-5 min",
    "5-10 min",
    "10-30 min",
    "30-60 min",
    "1-2 h",
    "2-6 h",
    ">6 h",
];

/// Fragments of one duration bucket, `[lo_s, hi_s)`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bucket {
    pub label: &'static str,
    pub lo_s: i64,
    /// `None`: open bucket.
    pub hi_s: Option<i64>,
    pub fragments: u64,
    pub node_min: f64,
}

/// The idle fragments of a trace window, by duration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fragments {
    pub buckets: Vec<Bucket>,
    pub fragments: u64,
    pub node_min: f64,
    /// Fragments cut by the window's start (the node was idle before it) or end (still
    /// idle after it); their length is the part inside the window.
    pub clipped_at_start: u64,
    pub clipped_at_end: u64,
    /// Median duration, seconds: by fragment count, and by node-minutes (half of the
    /// idle node-minutes lie in fragments at least this long).
    pub median_s: Option<f64>,
    pub weighted_median_s: Option<f64>,
}

fn bucket_of(d: i64) -> usize {
    EDGES_S.partition_point(|&e| e <= d)
}

/// Every maximal idle span of every node within `[trace.start, trace.end]`, clipped at
/// the window's ends, as (seconds, clipped at start, clipped at end). Repeated idle rows
/// (reclaim updates) do not split a fragment; zero-length fragments (idle and claimed at
/// the same second) are not counted.
pub fn fragment_lengths(trace: &mut dyn NodeEvents) -> Result<Vec<(i64, bool, bool)>> {
    let mut spans = Spans::new(trace.head());
    let mut out = Vec::new();
    while let Some(item) = trace.next()? {
        if let TraceItem::Change(c) = item {
            spans.change(&c, |d, s, e| out.push((d, s, e)));
        }
    }
    spans.finish(|d, s, e| out.push((d, s, e)));
    Ok(out)
}

/// The idle spans of a trace as its changes go by: each closed span goes to a callback
/// `f(seconds, clipped at start, clipped at end)`.
struct Spans {
    start: i64,
    end: i64,
    /// Since when each node has been idle (None: busy).
    since: Vec<Option<i64>>,
}

impl Spans {
    fn new(head: Head<'_>) -> Self {
        let start = head.start;
        Self {
            start,
            end: head.end.max(start),
            since: head
                .initial_idle
                .iter()
                .map(|&i| i.then_some(start))
                .collect(),
        }
    }

    fn change(&mut self, c: &NodeChange, mut f: impl FnMut(i64, bool, bool)) {
        let t = c.t.clamp(self.start, self.end);
        let Some(s) = self.since.get_mut(c.node as usize) else {
            return;
        };
        match (*s, c.idle) {
            (None, true) => *s = Some(t),
            (Some(from), false) => {
                *s = None;
                // A claim at the very end closes the fragment there: not clipped.
                if t > from {
                    f(t - from, from == self.start, false);
                }
            }
            _ => {}
        }
    }

    /// The spans still open at the window's end.
    fn finish(self, mut f: impl FnMut(i64, bool, bool)) {
        for from in self.since.into_iter().flatten() {
            if self.end > from {
                f(self.end - from, from == self.start, true);
            }
        }
    }
}

/// The histogram of `fragment_lengths` by duration (node-minutes per bucket), of a
/// trace in memory.
pub fn idle_fragments(trace: &NodeTrace) -> Fragments {
    idle_fragments_of(&mut trace.events()).expect("a trace in memory reads without error")
}

/// The histogram of `fragment_lengths` by duration (node-minutes per bucket), read as
/// the trace streams by.
pub fn idle_fragments_of(trace: &mut dyn NodeEvents) -> Result<Fragments> {
    let mut counter = FragmentCounter::new(trace.head());
    while let Some(item) = trace.next()? {
        if let TraceItem::Change(c) = item {
            counter.change(&c);
        }
    }
    Ok(counter.finish())
}

/// Fragment lengths up to a day are counted per second; longer ones by length.
const DAY_S: i64 = 86_400;

/// How many fragments have each length, in memory bounded by a day's seconds and the
/// distinct lengths beyond a day, not by the fragments.
struct Lengths {
    short: Vec<u64>,
    long: std::collections::BTreeMap<i64, u64>,
    n: u64,
}

impl Lengths {
    fn new() -> Self {
        Self {
            short: vec![0; DAY_S as usize],
            long: Default::default(),
            n: 0,
        }
    }

    fn add(&mut self, d: i64) {
        if d < DAY_S {
            self.short[d as usize] += 1;
        } else {
            *self.long.entry(d).or_default() += 1;
        }
        self.n += 1;
    }

    /// (length, count) in ascending length.
    fn iter(&self) -> impl Iterator<Item = (i64, u64)> + '_ {
        let short = self
            .short
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(d, &c)| (d as i64, c));
        short.chain(self.long.iter().map(|(&d, &c)| (d, c)))
    }

    /// The k-th smallest length (0-based).
    fn nth(&self, k: u64) -> i64 {
        let mut seen = 0;
        for (d, c) in self.iter() {
            seen += c;
            if seen > k {
                return d;
            }
        }
        unreachable!("k < n")
    }
}

/// The idle fragments of a trace counted by length as its changes go by (whoever reads
/// the trace hands them on: a replay counts them while it runs), in memory bounded by
/// the nodes and [`Lengths`].
pub struct FragmentCounter {
    spans: Spans,
    hist: Histogram,
}

/// The fragments seen so far, by bucket and by length.
struct Histogram {
    buckets: Vec<Bucket>,
    at_start: u64,
    at_end: u64,
    lens: Lengths,
    total: i64,
}

impl Histogram {
    fn add(&mut self, d: i64, s: bool, e: bool) {
        let b = &mut self.buckets[bucket_of(d)];
        b.fragments += 1;
        b.node_min += d as f64 / 60.0;
        self.at_start += u64::from(s);
        self.at_end += u64::from(e);
        self.lens.add(d);
        self.total += d;
    }
}

impl FragmentCounter {
    /// The fragments of a trace with this head (window and initial state).
    pub fn new(head: Head<'_>) -> Self {
        let buckets = LABELS
            .iter()
            .enumerate()
            .map(|(i, &label)| Bucket {
                label,
                lo_s: if i == 0 { 0 } else { EDGES_S[i - 1] },
                hi_s: EDGES_S.get(i).copied(),
                fragments: 0,
                node_min: 0.0,
            })
            .collect();
        Self {
            spans: Spans::new(head),
            hist: Histogram {
                buckets,
                at_start: 0,
                at_end: 0,
                lens: Lengths::new(),
                total: 0,
            },
        }
    }

    /// The trace's next change, in time order.
    pub fn change(&mut self, c: &NodeChange) {
        let h = &mut self.hist;
        self.spans.change(c, |d, s, e| h.add(d, s, e));
    }

    /// The histogram, once the trace has been read to its end.
    pub fn finish(self) -> Fragments {
        let mut h = self.hist;
        self.spans.finish(|d, s, e| h.add(d, s, e));
        let (n, total, lens) = (h.lens.n, h.total, &h.lens);
        let median_s = (n > 0).then(|| {
            let m = n / 2;
            if n % 2 == 1 {
                lens.nth(m) as f64
            } else {
                (lens.nth(m - 1) + lens.nth(m)) as f64 / 2.0
            }
        });
        // The shortest length at which the node-seconds of fragments up to it reach half.
        let weighted_median_s = (total > 0).then(|| {
            let mut acc = 0i64;
            let mut last = 0;
            for (d, c) in lens.iter() {
                acc += d * c as i64;
                last = d;
                if 2 * acc >= total {
                    return d as f64;
                }
            }
            last as f64
        });
        Fragments {
            fragments: n,
            node_min: total as f64 / 60.0,
            buckets: h.buckets,
            clipped_at_start: h.at_start,
            clipped_at_end: h.at_end,
            median_s,
            weighted_median_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counted lengths give the order statistics of the sorted lengths, on both sides
    /// of a day.
    #[test]
    fn counted_lengths_are_the_sorted_ones() {
        let mut x = 7u64;
        let mut all = Vec::new();
        let mut lens = Lengths::new();
        for _ in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let d = ((x >> 33) % (3 * DAY_S as u64)) as i64 + 1;
            all.push(d);
            lens.add(d);
        }
        all.sort_unstable();
        for k in [0, 1, 2499, 2500, 4999] {
            assert_eq!(lens.nth(k as u64), all[k]);
        }
        let back: Vec<i64> = lens
            .iter()
            .flat_map(|(d, c)| std::iter::repeat_n(d, c as usize))
            .collect();
        assert_eq!(back, all);
    }
    use crate::trace::NodeChange;

    fn tr(initial: &[bool], changes: &[(i64, u32, bool)], end: i64) -> NodeTrace {
        NodeTrace {
            names: (0..initial.len()).map(|i| format!("n{i}")).collect(),
            start: 1000,
            end,
            initial_idle: initial.to_vec(),
            changes: changes
                .iter()
                .map(|&(t, node, idle)| NodeChange {
                    t,
                    node,
                    idle,
                    reclaim_at: None,
                })
                .collect(),
            forecasts: Vec::new(),
        }
    }

    #[test]
    fn buckets_have_half_open_edges() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(59), 0);
        assert_eq!(bucket_of(60), 1);
        assert_eq!(bucket_of(299), 2);
        assert_eq!(bucket_of(300), 3);
        assert_eq!(bucket_of(21599), 7);
        assert_eq!(bucket_of(21600), 8);
        assert_eq!(bucket_of(i64::MAX), 8);
        assert_eq!(LABELS.len(), EDGES_S.len() + 1);
    }

    /// Node 0: idle from the start to 1090 (clipped at start, 90 s), idle again 1500 to
    /// the end 9000 (clipped at end, 7500 s). Node 1: busy, idle 2000..2030 with a
    /// repeated idle row at 2010 (one fragment of 30 s), idle and claimed at 3000
    /// (zero length: not counted), idle 4000..4600 (600 s). Node 2 never idle.
    #[test]
    fn hand_made_trace() {
        let t = tr(
            &[true, false, false],
            &[
                (1090, 0, false),
                (1500, 0, true),
                (2000, 1, true),
                (2010, 1, true),
                (2030, 1, false),
                (3000, 1, true),
                (3000, 1, false),
                (4000, 1, true),
                (4600, 1, false),
            ],
            9000,
        );
        let mut l = fragment_lengths(&mut t.events()).unwrap();
        l.sort();
        assert_eq!(
            l,
            vec![
                (30, false, false),
                (90, true, false),
                (600, false, false),
                (7500, false, true)
            ]
        );
        let f = idle_fragments(&t);
        assert_eq!(f.fragments, 4);
        assert_eq!((f.clipped_at_start, f.clipped_at_end), (1, 1));
        let per: Vec<(u64, f64)> = f
            .buckets
            .iter()
            .map(|b| (b.fragments, b.node_min))
            .collect();
        assert_eq!(
            per,
            vec![
                (1, 0.5),
                (1, 1.5),
                (0, 0.0),
                (0, 0.0),
                (1, 10.0),
                (0, 0.0),
                (0, 0.0),
                (1, 125.0),
                (0, 0.0)
            ]
        );
        assert!((f.node_min - 137.0).abs() < 1e-12);
        // Node-minutes add up to the trace's idle node-seconds.
        assert!((f.node_min * 60.0 - t.mean_idle() * 8000.0).abs() < 1e-6);
        assert_eq!(f.median_s, Some((90.0 + 600.0) / 2.0));
        assert_eq!(f.weighted_median_s, Some(7500.0));
    }

    #[test]
    fn idle_through_the_window_is_one_fragment_clipped_both_ends() {
        let f = idle_fragments(&tr(&[true], &[], 1000 + 7 * 3600));
        assert_eq!(f.fragments, 1);
        assert_eq!((f.clipped_at_start, f.clipped_at_end), (1, 1));
        assert_eq!(f.buckets[8].fragments, 1);
        assert!((f.buckets[8].node_min - 420.0).abs() < 1e-12);
        // An empty window has no fragments.
        let e = idle_fragments(&tr(&[true, false], &[], 1000));
        assert_eq!(e.fragments, 0);
        assert_eq!(e.median_s, None);
        assert_eq!(e.weighted_median_s, None);
    }
}
