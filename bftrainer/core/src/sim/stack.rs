//! Node count per job as a stacked area: one band per job, stacked in job order, so the
//! top band's edge is the sum of all jobs' node counts, i.e. the harvested nodes.

use super::{SizeRecord, StepRecord};

/// One job's band: `(interval, bottom, top)` for each interval where it holds nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub job: u32,
    pub cells: Vec<(u32, f64, f64)>,
}

/// Piecewise-constant series over intervals `[edges[k], edges[k+1])`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stack {
    /// Interval edges, Unix seconds (one more than intervals; none without steps).
    pub edges: Vec<f64>,
    /// Jobs that held nodes at some time, in job order (bottom to top).
    pub bands: Vec<Band>,
    /// Per interval: the sum of all bands (the top band's edge).
    pub top: Vec<f64>,
    /// Per interval: `StepRecord::harvested_nodes`, bucketed the same way.
    pub harvested: Vec<f64>,
    /// false: one interval per step, exact values; true: the steps were more than the
    /// intervals asked for, so the window is cut into equal buckets and every series is
    /// its time-weighted mean over each bucket (means of bands add up to the mean top).
    pub averaged: bool,
}

/// Stacks the jobs' node counts (`sizes`, sorted by time, as the simulator records
/// them) at the step times of `steps`, up to `end` (Unix seconds), in at most
/// `max_intervals` intervals. A job's count includes nodes it keeps during a preemption
/// grace period, so with grace the top exceeds the harvested nodes by those.
pub fn stack(sizes: &[SizeRecord], steps: &[StepRecord], end: f64, max_intervals: usize) -> Stack {
    let mut b = StackBuilder::new(end, max_intervals);
    let mut si = 0;
    for st in steps {
        while let Some(s) = sizes.get(si).filter(|s| s.t <= st.t) {
            b.size(s);
            si += 1;
        }
        b.step(st.t, st.harvested_nodes);
    }
    b.finish()
}

/// Builds the [`Stack`] of a replay as its records come (a step's sizes before the
/// step), in memory bounded by the intervals asked for, not by the replay's length:
/// the records are kept while they are few enough for exact intervals; past that they
/// go into equal buckets as they come.
pub struct StackBuilder {
    end: f64,
    max: usize,
    /// The records in arrival order while the intervals may still be exact.
    raw: Vec<Raw>,
    /// Intervals so far (steps with a later step after them).
    intervals: usize,
    /// Once the intervals are more than `max`: the equal buckets and the jobs' state.
    avg: Option<(Buckets, Tracker)>,
}

#[derive(Clone, Copy)]
enum Raw {
    Size(SizeRecord),
    Step(f64, u32),
}

impl StackBuilder {
    /// A stack of the window up to `end` (Unix seconds) in at most `max_intervals`.
    pub fn new(end: f64, max_intervals: usize) -> Self {
        Self {
            end,
            max: max_intervals.max(1),
            raw: Vec::new(),
            intervals: 0,
            avg: None,
        }
    }

    /// A job's count changed (before the step of its time).
    pub fn size(&mut self, s: &SizeRecord) {
        match &mut self.avg {
            Some((_, track)) => track.pending.push(*s),
            None => self.raw.push(Raw::Size(*s)),
        }
    }

    /// A step at `t` (Unix seconds) with `harvested` nodes: the state until the next.
    pub fn step(&mut self, t: f64, harvested: u32) {
        if let Some((b, track)) = &mut self.avg {
            track.step(t, harvested, b);
            return;
        }
        let last = self.raw.iter().rev().find_map(|r| match *r {
            Raw::Step(t, _) => Some(t),
            Raw::Size(_) => None,
        });
        if last.is_some_and(|a| t > a) {
            self.intervals += 1;
        }
        self.raw.push(Raw::Step(t, harvested));
        if self.intervals > self.max {
            self.average();
        }
    }

    /// Turns the kept records into equal buckets over the window, from the first step.
    fn average(&mut self) {
        let Some(t0) = self.raw.iter().find_map(|r| match *r {
            Raw::Step(t, _) => Some(t),
            Raw::Size(_) => None,
        }) else {
            return;
        };
        let mut b = Buckets::new(equal_edges(t0, self.end.max(t0), self.max));
        let track = replay(std::mem::take(&mut self.raw), &mut b);
        self.avg = Some((b, track));
    }

    pub fn finish(mut self) -> Stack {
        if self.avg.is_none() {
            let last = self.raw.iter().rev().find_map(|r| match *r {
                Raw::Step(t, _) => Some(t),
                Raw::Size(_) => None,
            });
            let Some(last) = last else {
                return Stack::default();
            };
            if self.end > last {
                self.intervals += 1;
            }
            if self.intervals == 0 {
                return Stack::default();
            }
            if self.intervals > self.max {
                self.average();
            } else {
                // Few steps: one interval per step, exact values.
                let mut edges: Vec<f64> = Vec::with_capacity(self.intervals + 1);
                for r in &self.raw {
                    if let Raw::Step(t, _) = *r {
                        if edges.last().map_or(true, |&e| t > e) {
                            edges.push(t);
                        }
                    }
                }
                if self.end > last {
                    edges.push(self.end);
                }
                let mut exact = Buckets::new(edges);
                let mut track = replay(std::mem::take(&mut self.raw), &mut exact);
                track.finish(self.end, &mut exact);
                return exact.close();
            }
        }
        let (mut b, mut track) = self.avg.take().expect("averaged");
        track.finish(self.end, &mut b);
        let mut st = b.close();
        st.averaged = true;
        st
    }
}

/// Feeds kept records into `b`; returns the jobs' state after them.
fn replay(raw: Vec<Raw>, b: &mut Buckets) -> Tracker {
    let mut track = Tracker::default();
    for r in raw {
        match r {
            Raw::Size(s) => track.pending.push(s),
            Raw::Step(t, h) => track.step(t, h, b),
        }
    }
    track
}

/// `n` equal buckets from `t0` to `t1` (the last edge exactly `t1`).
fn equal_edges(t0: f64, t1: f64, n: usize) -> Vec<f64> {
    let w = (t1 - t0) / n as f64;
    (0..=n)
        .map(|o| if o == n { t1 } else { t0 + o as f64 * w })
        .collect()
}

/// The jobs' node counts as of the last step, and the sizes recorded since.
#[derive(Default)]
struct Tracker {
    cur: Vec<u32>,
    active: Vec<u32>,
    pending: Vec<SizeRecord>,
    /// The last step: (time, harvested nodes).
    last: Option<(f64, u32)>,
}

impl Tracker {
    /// A step at t: the state since the last step goes into `b` up to t; then the
    /// sizes of this step apply.
    fn step(&mut self, t: f64, h: u32, b: &mut Buckets) {
        if let Some((a, ha)) = self.last {
            if t > a {
                b.add(a, t, &self.active, &self.cur, f64::from(ha));
            }
        }
        for s in self.pending.drain(..) {
            let j = s.job as usize;
            if j >= self.cur.len() {
                self.cur.resize(j + 1, 0);
            }
            if self.cur[j] == 0 && s.nodes > 0 {
                self.active.push(s.job);
            } else if self.cur[j] > 0 && s.nodes == 0 {
                self.active.retain(|&x| x != s.job);
            }
            self.cur[j] = s.nodes;
        }
        self.last = Some((t, h));
    }

    /// The last step's state holds to `end`; sizes after the last step are not shown.
    fn finish(&mut self, end: f64, b: &mut Buckets) {
        if let Some((a, ha)) = self.last {
            if end > a {
                b.add(a, end, &self.active, &self.cur, f64::from(ha));
            }
        }
    }
}

/// Time-weighted sums over buckets `[edges[o], edges[o+1])`, closed in order.
struct Buckets {
    edges: Vec<f64>,
    o: usize,
    /// Node-seconds per job in the open bucket, and which jobs have some.
    acc: Vec<f64>,
    touched: Vec<u32>,
    acc_h: f64,
    st: Stack,
}

impl Buckets {
    fn new(edges: Vec<f64>) -> Self {
        Self {
            edges,
            o: 0,
            acc: Vec::new(),
            touched: Vec::new(),
            acc_h: 0.0,
            st: Stack::default(),
        }
    }

    fn n_out(&self) -> usize {
        self.edges.len().saturating_sub(1)
    }

    /// The state `cur` of the `active` jobs and `h` harvested nodes held over [a, b).
    fn add(&mut self, a: f64, b: f64, active: &[u32], cur: &[u32], h: f64) {
        let n_out = self.n_out();
        if n_out == 0 {
            return;
        }
        if let Some(&m) = active.iter().max() {
            if m as usize >= self.acc.len() {
                self.acc.resize(m as usize + 1, 0.0);
            }
        }
        let mut x = a;
        while x < b {
            while self.o + 1 < n_out && self.edges[self.o + 1] <= x {
                self.finish();
            }
            let y = if self.o + 1 == n_out {
                b
            } else {
                b.min(self.edges[self.o + 1])
            };
            let w = y - x;
            for &j in active {
                if self.acc[j as usize] == 0.0 {
                    self.touched.push(j);
                }
                self.acc[j as usize] += w * f64::from(cur[j as usize]);
            }
            self.acc_h += w * h;
            x = y;
        }
    }

    /// Closes the open bucket: its bands stacked in job order, its top and harvested
    /// means.
    fn finish(&mut self) {
        let o = self.o;
        let w = self.edges[o + 1] - self.edges[o];
        self.touched.sort_unstable();
        let mut bottom = 0.0;
        for &j in &self.touched {
            let v = self.acc[j as usize] / w;
            self.acc[j as usize] = 0.0;
            if v > 0.0 {
                let bands = &mut self.st.bands;
                if j as usize >= bands.len() {
                    let from = bands.len() as u32;
                    bands.extend((from..=j).map(|job| Band {
                        job,
                        cells: Vec::new(),
                    }));
                }
                bands[j as usize].cells.push((o as u32, bottom, bottom + v));
                bottom += v;
            }
        }
        self.touched.clear();
        self.st.top.push(bottom);
        self.st.harvested.push(self.acc_h / w);
        self.acc_h = 0.0;
        self.o += 1;
    }

    fn close(mut self) -> Stack {
        while self.o < self.n_out() {
            self.finish();
        }
        self.st.bands.retain(|b| !b.cells.is_empty());
        self.st.edges = self.edges;
        self.st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(t: f64, harvested: u32) -> StepRecord {
        StepRecord {
            t,
            idle_nodes: 10,
            harvested_nodes: harvested,
            active_jobs: 0,
            queued_jobs: 0,
            finished_jobs: 0,
            grown_nodes: 0,
            shrunk_nodes: 0,
            preempted_nodes: 0,
            samples: 0.0,
            decision_s: 0.0,
        }
    }

    fn size(t: f64, job: u32, nodes: u32) -> SizeRecord {
        SizeRecord { t, job, nodes }
    }

    /// Job 0: 2 nodes at 0, 3 at 20, none at 30; job 2: 4 nodes at 10..40; job 1 never
    /// held nodes. Steps at 0, 10, 20, 30, 40; window ends at 50.
    fn fixture() -> (Vec<SizeRecord>, Vec<StepRecord>) {
        let sizes = vec![
            size(0.0, 0, 2),
            size(10.0, 2, 4),
            size(20.0, 0, 3),
            size(30.0, 0, 0),
            size(40.0, 2, 0),
        ];
        let steps = vec![
            step(0.0, 2),
            step(10.0, 6),
            step(20.0, 7),
            step(30.0, 4),
            step(40.0, 0),
        ];
        (sizes, steps)
    }

    #[test]
    fn exact_bands_stack_in_job_order_and_top_is_harvested() {
        let (sizes, steps) = fixture();
        let s = stack(&sizes, &steps, 50.0, 100);
        assert!(!s.averaged);
        assert_eq!(s.edges, vec![0.0, 10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(s.top, vec![2.0, 6.0, 7.0, 4.0, 0.0]);
        assert_eq!(s.top, s.harvested);
        assert_eq!(s.bands.len(), 2);
        assert_eq!(s.bands[0].job, 0);
        assert_eq!(
            s.bands[0].cells,
            vec![(0, 0.0, 2.0), (1, 0.0, 2.0), (2, 0.0, 3.0)]
        );
        assert_eq!(s.bands[1].job, 2);
        assert_eq!(
            s.bands[1].cells,
            vec![(1, 2.0, 6.0), (2, 3.0, 7.0), (3, 0.0, 4.0)]
        );
    }

    /// Two buckets of 25 s: the first holds job 0 at 2 nodes for 20 s and 3 for 5 s
    /// (mean 55/25), job 2 at 4 nodes for 15 s (60/25); the second job 0 at 3 for 5 s
    /// (15/25), job 2 at 4 for 15 s (60/25).
    #[test]
    fn averaged_buckets_keep_node_seconds() {
        let (sizes, steps) = fixture();
        let s = stack(&sizes, &steps, 50.0, 2);
        assert!(s.averaged);
        assert_eq!(s.edges, vec![0.0, 25.0, 50.0]);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(near(s.bands[0].cells[0].2, 55.0 / 25.0));
        assert!(near(
            s.bands[1].cells[0].2 - s.bands[1].cells[0].1,
            60.0 / 25.0
        ));
        assert!(near(s.bands[0].cells[1].2, 15.0 / 25.0));
        assert!(near(s.bands[1].cells[1].1, 15.0 / 25.0));
        assert!(near(s.top[1], 75.0 / 25.0));
        assert!(near(s.top[0], 115.0 / 25.0));
        for (t, h) in s.top.iter().zip(&s.harvested) {
            assert!(near(*t, *h), "{t} vs {h}");
        }
        // Node-seconds are kept: sum of mean x width equals the exact area.
        let area: f64 = s.top.iter().map(|v| v * 25.0).sum();
        assert!(near(
            area,
            2.0 * 10.0 + 6.0 * 10.0 + 7.0 * 10.0 + 4.0 * 10.0
        ));
    }

    #[test]
    fn no_steps_no_intervals() {
        let s = stack(&[], &[], 10.0, 5);
        assert!(s.edges.is_empty() && s.top.is_empty() && s.bands.is_empty());
        // A single step at the window's end has no width.
        let s = stack(&[], &[step(10.0, 0)], 10.0, 5);
        assert!(s.top.is_empty());
    }
}
