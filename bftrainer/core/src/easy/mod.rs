//! The main scheduler's model for SWF logs: FCFS with EASY (or conservative) backfilling
//! turns a job log into a node-idle trace plus the backfill plan's reclaim forecasts.

use crate::error::{Error, Result};
use crate::trace::swf::SwfLog;
use crate::trace::{NodeChange, NodeTrace};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Backfilling flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backfill {
    /// Only the queue head holds a reservation; later jobs may start early if they do not
    /// delay it (Lifka's EASY).
    Easy,
    /// Every queued job holds a reservation; a job may start early only if it delays none.
    Conservative,
}

/// Whether to simulate the scheduler or trust the log's own start times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartTimes {
    /// Use the log's start times (submit + wait) when every job has a wait time.
    Auto,
    Simulate,
    Log,
}

#[derive(Debug, Clone)]
pub struct SchedConfig {
    pub backfill: Backfill,
    pub start_times: StartTimes,
    /// Machine size; default: the log's MaxNodes.
    pub nodes: Option<u32>,
    /// Processors per node; default MaxProcs / MaxNodes, else 1.
    pub procs_per_node: Option<u32>,
    /// Unix time of the log's time 0; default the log's UnixStartTime, else 0.
    pub epoch: Option<i64>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            backfill: Backfill::Easy,
            start_times: StartTimes::Auto,
            nodes: None,
            procs_per_node: None,
            epoch: None,
        }
    }
}

/// The scheduler's own figures, so its sanity can be judged.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SchedMetrics {
    pub policy: String,
    pub nodes: u32,
    pub procs_per_node: u32,
    pub jobs_scheduled: u64,
    /// Jobs without a size or with zero run time: they never hold a node.
    pub jobs_skipped_empty: u64,
    /// Jobs wider than the machine.
    pub jobs_skipped_too_wide: u64,
    /// Jobs whose run time SWF does not allow (negative other than -1, unknown) or
    /// above [`MAX_RUN_S`].
    pub jobs_skipped_bad_run_time: u64,
    /// The first skipped job of each cause but empty ones (which SWF allows): where the
    /// caller can point, as an index into the log's jobs.
    #[serde(skip)]
    pub first_skipped: Vec<Skipped>,
    /// Log start mode only: jobs that started while fewer nodes were free than they
    /// needed (the log's machine was larger or nodes were shared).
    pub jobs_overcommitted: u64,
    /// Busy node-seconds over nodes x (last end - first submit).
    pub utilisation: f64,
    pub mean_wait_s: f64,
    pub max_wait_s: f64,
    /// Mean of max(1, (wait + run) / max(run, 10 s)).
    pub mean_bounded_slowdown: f64,
    pub makespan_s: i64,
}

/// Longest run time a job may have, seconds (365 days): beyond it the log is corrupt.
pub const MAX_RUN_S: i64 = 365 * 86_400;

/// Why a job of the log was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipCause {
    /// It needs more nodes than the machine has.
    TooWide,
    /// Run time below -1 or above [`MAX_RUN_S`].
    BadRunTime,
}

/// The first job left out for a cause: index into `SwfLog::jobs`, and the nodes it
/// needs (`TooWide`) or its run time (`BadRunTime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    pub cause: SkipCause,
    pub index: usize,
    pub value: i64,
}

/// A job ready for the model: sizes in nodes, times in log seconds.
#[derive(Debug, Clone, Copy)]
struct Job {
    submit: i64,
    run: i64,
    est: i64,
    need: u32,
    log_start: Option<i64>,
}

struct Running {
    est_end: i64,
    nodes: Vec<u32>,
}

/// Runs the scheduler model over a log; returns the idle trace (node names `n0000`...)
/// and the scheduler's metrics.
pub fn schedule(log: &SwfLog, cfg: &SchedConfig) -> Result<(NodeTrace, SchedMetrics)> {
    let nodes = cfg
        .nodes
        .map(i64::from)
        .or(log.max_nodes)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            Error::Config(
                "the SWF log has no MaxNodes header: give the machine size (--nodes)".into(),
            )
        })?;
    let nodes = u32::try_from(nodes)
        .map_err(|_| Error::Config(format!("machine size {nodes} too large")))?;
    let ppn = match (cfg.procs_per_node, log.max_procs, log.max_nodes) {
        (Some(p), _, _) if p > 0 => i64::from(p),
        (Some(_), _, _) => return Err(Error::Config("--procs-per-node must be >= 1".into())),
        (None, Some(p), Some(n)) if p > 0 && n > 0 && p % n == 0 => p / n,
        _ => 1,
    };
    let epoch = cfg.epoch.or(log.unix_start).unwrap_or(0);
    let mut m = SchedMetrics {
        policy: match cfg.backfill {
            Backfill::Easy => "fcfs+easy".into(),
            Backfill::Conservative => "fcfs+conservative".into(),
        },
        nodes,
        procs_per_node: ppn as u32,
        ..Default::default()
    };
    let mut jobs = Vec::with_capacity(log.jobs.len());
    // Index into log.jobs of each job of `jobs`.
    let mut src = Vec::with_capacity(log.jobs.len());
    let skip = |m: &mut SchedMetrics, cause: SkipCause, index: usize, value: i64| {
        if !m.first_skipped.iter().any(|s| s.cause == cause) {
            m.first_skipped.push(Skipped {
                cause,
                index,
                value,
            });
        }
    };
    for (i, j) in log.jobs.iter().enumerate() {
        if j.run < -1 || j.run > MAX_RUN_S {
            m.jobs_skipped_bad_run_time += 1;
            skip(&mut m, SkipCause::BadRunTime, i, j.run);
            continue;
        }
        let Some(p) = j.procs.filter(|_| j.run > 0) else {
            m.jobs_skipped_empty += 1;
            continue;
        };
        let need = (p + ppn - 1) / ppn;
        if need > i64::from(nodes) {
            m.jobs_skipped_too_wide += 1;
            skip(&mut m, SkipCause::TooWide, i, need);
            continue;
        }
        src.push(i);
        jobs.push(Job {
            submit: j.submit,
            run: j.run,
            est: j.req_time.unwrap_or(j.run).clamp(1, MAX_RUN_S),
            need: need as u32,
            log_start: j.wait.map(|w| j.submit + w),
        });
    }
    let use_log = match cfg.start_times {
        StartTimes::Log => {
            if let Some(i) = jobs.iter().position(|j| j.log_start.is_none()) {
                return Err(Error::Config(format!(
                    "--start-times log: job {} of the log has no wait time",
                    log.jobs[src[i]].id
                )));
            }
            true
        }
        StartTimes::Simulate => false,
        StartTimes::Auto => !jobs.is_empty() && jobs.iter().all(|j| j.log_start.is_some()),
    };
    if use_log {
        m.policy = "log start times".into();
    }
    let mut sim = Model::new(nodes, cfg.backfill);
    let starts = if use_log {
        sim.replay_log(&jobs, &mut m)
    } else {
        sim.simulate(&jobs)
    };
    // Metrics over the jobs that ran.
    let (mut busy, mut wait_sum, mut bsld_sum, mut max_wait) = (0f64, 0f64, 0f64, 0f64);
    let first_submit = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
    let mut last_end = first_submit;
    for (j, &s) in jobs.iter().zip(&starts) {
        let w = (s - j.submit) as f64;
        busy += f64::from(j.need) * j.run as f64;
        wait_sum += w;
        max_wait = max_wait.max(w);
        bsld_sum += ((w + j.run as f64) / (j.run as f64).max(10.0)).max(1.0);
        last_end = last_end.max(s + j.run);
    }
    let n = jobs.len().max(1) as f64;
    m.jobs_scheduled = jobs.len() as u64;
    m.makespan_s = last_end - first_submit;
    m.utilisation = if m.makespan_s > 0 {
        busy / (f64::from(nodes) * m.makespan_s as f64)
    } else {
        0.0
    };
    m.mean_wait_s = wait_sum / n;
    m.max_wait_s = max_wait;
    m.mean_bounded_slowdown = bsld_sum / n;
    let mut trace = sim.out;
    trace.start = first_submit;
    trace.end = last_end;
    for c in &mut trace.changes {
        c.t += epoch;
        if let Some(r) = &mut c.reclaim_at {
            *r += epoch;
        }
    }
    for f in &mut trace.forecasts {
        f.0 += epoch;
        if let Some(r) = &mut f.1 {
            *r += epoch;
        }
    }
    trace.start += epoch;
    trace.end += epoch;
    Ok((trace.into_node_trace(nodes), m))
}

/// The model's output before conversion: changes plus plan-wide forecasts.
#[derive(Default)]
struct Out {
    start: i64,
    end: i64,
    changes: Vec<NodeChange>,
    /// (t, reclaim_at): from t on, every node idle at t is forecast to be reclaimed then.
    forecasts: Vec<(i64, Option<i64>)>,
}

impl Out {
    fn into_node_trace(self, nodes: u32) -> NodeTrace {
        NodeTrace {
            names: (0..nodes).map(|i| format!("n{i:04}")).collect(),
            start: self.start,
            end: self.end,
            initial_idle: vec![true; nodes as usize],
            changes: self.changes,
            forecasts: self.forecasts,
        }
    }
}

struct Model {
    backfill: Backfill,
    free: BinaryHeap<Reverse<u32>>,
    running: Vec<Option<Running>>,
    /// (actual end, running slot)
    ends: BinaryHeap<Reverse<(i64, usize)>>,
    idle: Vec<bool>,
    emitted: Vec<bool>,
    touched: Vec<u32>,
    forecast: Option<i64>,
    out: Out,
}

impl Model {
    fn new(nodes: u32, backfill: Backfill) -> Self {
        Self {
            backfill,
            free: (0..nodes).map(Reverse).collect(),
            running: Vec::new(),
            ends: BinaryHeap::new(),
            idle: vec![true; nodes as usize],
            emitted: vec![true; nodes as usize],
            touched: Vec::new(),
            forecast: None,
            out: Out::default(),
        }
    }

    /// Starts a job on the lowest-numbered free nodes (at most `need`, fewer only when
    /// replaying an inconsistent log).
    fn start(&mut self, t: i64, j: &Job) -> bool {
        let k = (j.need as usize).min(self.free.len());
        let mut nodes = Vec::with_capacity(k);
        for _ in 0..k {
            let Reverse(n) = self.free.pop().expect("counted");
            self.idle[n as usize] = false;
            self.touched.push(n);
            nodes.push(n);
        }
        let slot = self.running.len();
        self.running.push(Some(Running {
            est_end: t + j.est,
            nodes,
        }));
        self.ends.push(Reverse((t + j.run, slot)));
        k == j.need as usize
    }

    fn finish_until(&mut self, t: i64) {
        while let Some(&Reverse((e, slot))) = self.ends.peek() {
            if e > t {
                break;
            }
            self.ends.pop();
            let r = self.running[slot].take().expect("ends once");
            for n in r.nodes {
                self.idle[n as usize] = true;
                self.touched.push(n);
                self.free.push(Reverse(n));
            }
        }
    }

    /// Emits the net changes of time t (a node freed and retaken at t emits nothing).
    fn emit(&mut self, t: i64, forecast: Option<i64>) {
        if forecast != self.forecast {
            self.forecast = forecast;
            self.out.forecasts.push((t, forecast));
        }
        for &n in &self.touched {
            let i = n as usize;
            if self.idle[i] != self.emitted[i] {
                self.emitted[i] = self.idle[i];
                self.out.changes.push(NodeChange {
                    t,
                    node: n,
                    idle: self.idle[i],
                    reclaim_at: None,
                });
            }
        }
        self.touched.clear();
    }

    fn replay_log(&mut self, jobs: &[Job], m: &mut SchedMetrics) -> Vec<i64> {
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by_key(|&i| (jobs[i].log_start.unwrap_or(jobs[i].submit), i));
        let starts: Vec<i64> = jobs
            .iter()
            .map(|j| j.log_start.unwrap_or(j.submit))
            .collect();
        let mut k = 0;
        while k < order.len() || !self.ends.is_empty() {
            let next_start = order.get(k).map(|&i| starts[i]);
            let next_end = self.ends.peek().map(|r| r.0 .0);
            let Some(t) = next_start.into_iter().chain(next_end).min() else {
                break;
            };
            self.finish_until(t);
            while k < order.len() && starts[order[k]] == t {
                if !self.start(t, &jobs[order[k]]) {
                    m.jobs_overcommitted += 1;
                }
                k += 1;
            }
            self.emit(t, None);
        }
        starts
    }

    fn simulate(&mut self, jobs: &[Job]) -> Vec<i64> {
        let mut starts = vec![i64::MIN; jobs.len()];
        let mut queue: Vec<usize> = Vec::new();
        let mut k = 0;
        while k < jobs.len() || !self.ends.is_empty() {
            let next_sub = jobs.get(k).map(|j| j.submit);
            let next_end = self.ends.peek().map(|r| r.0 .0);
            let Some(t) = next_sub.into_iter().chain(next_end).min() else {
                break;
            };
            self.finish_until(t);
            while k < jobs.len() && jobs[k].submit == t {
                queue.push(k);
                k += 1;
            }
            let slots = self.running.len();
            let forecast = match self.backfill {
                Backfill::Easy => self.pass_easy(t, jobs, &mut queue, &mut starts),
                Backfill::Conservative => self.pass_conservative(t, jobs, &queue, &mut starts),
            };
            // Each start takes a running slot: when the pass started jobs, drop them.
            if self.running.len() > slots {
                queue.retain(|&q| starts[q] == i64::MIN);
            }
            self.emit(t, forecast);
        }
        starts
    }

    /// Running jobs' (estimated end, width), sorted; an overrunning job is expected to
    /// end now.
    fn release_profile(&self, t: i64) -> Vec<(i64, u32)> {
        let mut rel: Vec<(i64, u32)> = self
            .running
            .iter()
            .flatten()
            .map(|r| (r.est_end.max(t), r.nodes.len() as u32))
            .collect();
        rel.sort_unstable();
        rel
    }

    /// One EASY pass at t; returns the head's reservation time when it must wait. Jobs it
    /// starts get their start time in `starts`; the caller drops them from `queue`.
    fn pass_easy(
        &mut self,
        t: i64,
        jobs: &[Job],
        queue: &mut Vec<usize>,
        starts: &mut [i64],
    ) -> Option<i64> {
        let mut head = 0;
        while head < queue.len() && jobs[queue[head]].need as usize <= self.free.len() {
            starts[queue[head]] = t;
            self.start(t, &jobs[queue[head]]);
            head += 1;
        }
        queue.drain(..head);
        let &h = queue.first()?;
        let need = jobs[h].need;
        let mut avail = self.free.len() as u32;
        let (mut shadow, mut extra) = (i64::MAX, 0u32);
        for (e, w) in self.release_profile(t) {
            avail += w;
            if avail >= need {
                (shadow, extra) = (e, avail - need);
                break;
            }
        }
        for &q in queue.iter().skip(1) {
            if self.free.is_empty() {
                break;
            }
            let j = &jobs[q];
            if j.need as usize > self.free.len() {
                continue;
            }
            let before_shadow = t + j.est <= shadow;
            if before_shadow || j.need <= extra {
                if !before_shadow {
                    extra -= j.need;
                }
                starts[q] = t;
                self.start(t, j);
            }
        }
        (shadow != i64::MAX).then_some(shadow)
    }

    /// One conservative pass: every queued job, in order, gets the earliest slot in the
    /// availability profile that fits it; jobs whose slot is now start (as in
    /// `pass_easy`). Returns the earliest future reservation.
    fn pass_conservative(
        &mut self,
        t: i64,
        jobs: &[Job],
        queue: &[usize],
        starts: &mut [i64],
    ) -> Option<i64> {
        // Step function: prof[i] = (from time, free nodes) until prof[i+1].0.
        let mut prof: Vec<(i64, i64)> = vec![(t, self.free.len() as i64)];
        for (e, w) in self.release_profile(t) {
            let last = *prof.last().expect("non-empty");
            if e == last.0 {
                prof.last_mut().expect("non-empty").1 += i64::from(w);
            } else {
                prof.push((e, last.1 + i64::from(w)));
            }
        }
        let mut first_res: Option<i64> = None;
        for &q in queue.iter() {
            let j = &jobs[q];
            let need = i64::from(j.need);
            // Earliest breakpoint s such that free >= need on [s, s + est).
            let mut s_idx = None;
            'outer: for i in 0..prof.len() {
                if prof[i].1 < need {
                    continue;
                }
                let s = prof[i].0;
                for p in &prof[i + 1..] {
                    if p.0 >= s + j.est {
                        break;
                    }
                    if p.1 < need {
                        continue 'outer;
                    }
                }
                s_idx = Some(i);
                break;
            }
            let Some(i) = s_idx else { continue };
            let s = prof[i].0;
            let e = s + j.est;
            // Split the profile at e, then take `need` nodes over [s, e).
            let pos = prof.partition_point(|p| p.0 < e);
            if pos == prof.len() || prof[pos].0 != e {
                let v = prof[pos - 1].1;
                prof.insert(pos, (e, v));
            }
            for p in &mut prof[i..pos] {
                p.1 -= need;
            }
            if s == t && j.need as usize <= self.free.len() {
                starts[q] = t;
                self.start(t, j);
            } else if s > t {
                first_res = Some(first_res.map_or(s, |f: i64| f.min(s)));
            }
        }
        first_res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::swf::SwfJob;

    fn log(jobs: &[(i64, i64, i64, i64)]) -> SwfLog {
        SwfLog {
            max_nodes: Some(4),
            max_procs: Some(4),
            unix_start: Some(0),
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, &(submit, run, procs, req))| SwfJob {
                    id: i as i64 + 1,
                    submit,
                    wait: None,
                    run,
                    procs: Some(procs),
                    req_time: Some(req),
                })
                .collect(),
        }
    }

    /// Hand-worked schedule on 4 nodes (submit, run, nodes, estimate):
    /// A(0,100,2,100) starts at 0 on n0,n1. B(1,50,4,50) waits: shadow = 100 (A's end),
    /// extra = 0. C(2,50,2,50) ends at 52 <= 100: backfills at 2 on n2,n3.
    /// D(3,200,1,200) would end after 100 and extra = 0: waits. At 52 C ends; n2,n3 idle,
    /// forecast still 100. At 100 A ends, B starts on n0..n3 (ends 150), D starts at 150.
    /// Waits: A 0, B 99, C 0, D 147 => mean 61.5.
    #[test]
    fn easy_matches_hand_worked_schedule() {
        let l = log(&[
            (0, 100, 2, 100),
            (1, 50, 4, 50),
            (2, 50, 2, 50),
            (3, 200, 1, 200),
        ]);
        let (tr, m) = schedule(&l, &SchedConfig::default()).unwrap();
        assert_eq!(m.mean_wait_s, (99.0 + 147.0) / 4.0);
        assert_eq!(m.makespan_s, 350);
        // busy = 2*100 + 4*50 + 2*50 + 1*200 = 700 over 4 * 350.
        assert!((m.utilisation - 700.0 / 1400.0).abs() < 1e-12);
        let ch: Vec<(i64, u32, bool)> = tr.changes.iter().map(|c| (c.t, c.node, c.idle)).collect();
        assert_eq!(
            ch,
            vec![
                (0, 0, false),
                (0, 1, false),
                (2, 2, false),
                (2, 3, false),
                (52, 2, true),
                (52, 3, true),
                (100, 2, false),
                (100, 3, false),
                (150, 1, true),
                (150, 2, true),
                (150, 3, true),
                (350, 0, true),
            ]
        );
        // B waits from t=1 with reservation at 100; nothing queued after 150.
        assert_eq!(
            tr.forecasts,
            vec![(1, Some(100)), (100, Some(150)), (150, None)]
        );
    }

    /// Conservative on the same log: D must not delay B's reservation [100,150) nor
    /// anything else; D (1 node, 200 s) fits at 3 only if a node stays free over
    /// [3, 203): n2,n3 are taken by C until 52 and B needs all 4 at 100, so D waits
    /// until 150 like EASY. E(4, 40, 1, 40) ends at 44 < 100 and one node... none free
    /// at 4 (A: 2, C: 2), so it starts when C ends at 52 and ends at 92 < 100.
    #[test]
    fn conservative_matches_hand_worked_schedule() {
        let l = log(&[
            (0, 100, 2, 100),
            (1, 50, 4, 50),
            (2, 50, 2, 50),
            (3, 200, 1, 200),
            (4, 40, 1, 40),
        ]);
        let cfg = SchedConfig {
            backfill: Backfill::Conservative,
            ..Default::default()
        };
        let (_, m) = schedule(&l, &cfg).unwrap();
        // Waits: A 0, B 99, C 0, D 147, E 48.
        assert_eq!(m.mean_wait_s, (99.0 + 147.0 + 48.0) / 5.0);
        let (_, me) = schedule(&l, &SchedConfig::default()).unwrap();
        // EASY: E starts at 52 too (ends 92 <= shadow 100).
        assert_eq!(me.mean_wait_s, m.mean_wait_s);
    }

    #[test]
    fn log_start_times_are_used_when_known() {
        let mut l = log(&[(0, 5, 4, 5), (0, 10, 4, 10)]);
        l.jobs[0].wait = Some(5);
        l.jobs[1].wait = Some(15);
        let (tr, m) = schedule(&l, &SchedConfig::default()).unwrap();
        assert_eq!(m.policy, "log start times");
        assert_eq!(m.mean_wait_s, 10.0);
        assert_eq!(
            tr.changes
                .iter()
                .filter(|c| !c.idle)
                .map(|c| c.t)
                .collect::<Vec<_>>(),
            vec![5, 5, 5, 5, 15, 15, 15, 15]
        );
    }
}
