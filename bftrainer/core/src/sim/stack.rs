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
    // Raw intervals: each step's state holds until the next step (the last, to `end`).
    let raw: Vec<(f64, f64, usize)> = steps
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let b = steps.get(k + 1).map_or(end.max(s.t), |n| n.t);
            (s.t, b, k)
        })
        .filter(|&(a, b, _)| b > a)
        .collect();
    if raw.is_empty() {
        return Stack::default();
    }
    let max_intervals = max_intervals.max(1);
    let averaged = raw.len() > max_intervals;
    let edges: Vec<f64> = if averaged {
        let (t0, t1) = (raw[0].0, raw[raw.len() - 1].1);
        let w = (t1 - t0) / max_intervals as f64;
        (0..=max_intervals)
            .map(|o| {
                if o == max_intervals {
                    t1
                } else {
                    t0 + o as f64 * w
                }
            })
            .collect()
    } else {
        raw.iter()
            .map(|r| r.0)
            .chain(std::iter::once(raw[raw.len() - 1].1))
            .collect()
    };
    let n_jobs = sizes.iter().map(|s| s.job as usize + 1).max().unwrap_or(0);
    let n_out = edges.len() - 1;
    let mut st = Stack {
        bands: (0..n_jobs as u32)
            .map(|job| Band {
                job,
                cells: Vec::new(),
            })
            .collect(),
        top: Vec::with_capacity(n_out),
        harvested: Vec::with_capacity(n_out),
        averaged,
        edges: Vec::new(),
    };
    let mut cur = vec![0u32; n_jobs];
    let mut active: Vec<u32> = Vec::new();
    // Node-seconds per job in the open bucket, and which jobs have some.
    let mut acc = vec![0.0f64; n_jobs];
    let mut touched: Vec<u32> = Vec::new();
    let mut acc_h = 0.0;
    let (mut si, mut o) = (0usize, 0usize);
    for &(a, b, k) in &raw {
        let t = steps[k].t;
        while let Some(s) = sizes.get(si).filter(|s| s.t <= t) {
            si += 1;
            let j = s.job as usize;
            if cur[j] == 0 && s.nodes > 0 {
                active.push(s.job);
            } else if cur[j] > 0 && s.nodes == 0 {
                active.retain(|&x| x != s.job);
            }
            cur[j] = s.nodes;
        }
        let h = f64::from(steps[k].harvested_nodes);
        let mut x = a;
        while x < b {
            while o + 1 < n_out && edges[o + 1] <= x {
                finish(o, &edges, &mut st, &mut acc, &mut touched, &mut acc_h);
                o += 1;
            }
            let y = if o + 1 == n_out {
                b
            } else {
                b.min(edges[o + 1])
            };
            let w = y - x;
            for &j in &active {
                if acc[j as usize] == 0.0 {
                    touched.push(j);
                }
                acc[j as usize] += w * f64::from(cur[j as usize]);
            }
            acc_h += w * h;
            x = y;
        }
    }
    while o < n_out {
        finish(o, &edges, &mut st, &mut acc, &mut touched, &mut acc_h);
        o += 1;
    }
    st.bands.retain(|b| !b.cells.is_empty());
    st.edges = edges;
    st
}

/// Closes bucket `o`: its bands stacked in job order, its top and harvested means.
fn finish(
    o: usize,
    edges: &[f64],
    st: &mut Stack,
    acc: &mut [f64],
    touched: &mut Vec<u32>,
    acc_h: &mut f64,
) {
    let w = edges[o + 1] - edges[o];
    touched.sort_unstable();
    let mut bottom = 0.0;
    for &j in touched.iter() {
        let v = acc[j as usize] / w;
        acc[j as usize] = 0.0;
        if v > 0.0 {
            st.bands[j as usize]
                .cells
                .push((o as u32, bottom, bottom + v));
            bottom += v;
        }
    }
    touched.clear();
    st.top.push(bottom);
    st.harvested.push(*acc_h / w);
    *acc_h = 0.0;
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
