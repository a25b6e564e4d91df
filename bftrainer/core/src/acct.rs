//! Elastic accounting: groups accounting records into elastic jobs (core runs plus the
//! satellites linked to them by the tag) and sums their usage inside a time window.
//! Pure over records: the daemon reads them from slurmdbd, the benchmark generates them.
//!
//! Rules, each chosen to agree with `sacct -D -X --truncate` over the same window:
//! - A record's time is `[start, end)` clipped to the window; a running record (no end)
//!   runs until `now`. Node time is that length times its node count, CPU time that
//!   length times its allocated CPUs (sacct's `ElapsedRaw * NNodes` and `CPUTimeRAW`).
//!   Suspended time is not subtracted: elastic partitions preempt by REQUEUE or CANCEL.
//! - A core job is a record whose admin comment is a `role=core` tag; every run of a
//!   requeued core (every record with its id) counts. A satellite is a record with a
//!   `role=satellite,parent=J` tag, or, without any admin comment (slurmdbd may not have
//!   it for a satellite cancelled before it ran), named `bftsat-J` and of the same user
//!   as J's core when that core is among the records.
//! - A preemption is a record of the elastic job that lost its nodes to a regular job
//!   inside the window: its state is PREEMPTED (Slurm ended or requeued it at the end of
//!   the grace time), or it ended and a job that is no part of any elastic job, already
//!   eligible when it ended, started on one of its nodes at most `preempt_slack_s` later.
//!   The second case is needed because a satellite whose work leaves at the grace time's
//!   SIGTERM ends COMPLETED, exactly like one shrunk by bftrainerd (measured on the
//!   test cluster); only the job that took the node tells them apart. bftrainerd giving a
//!   node back ahead of the backfill plan counts too: the node went to a regular job.

use crate::sacct::expand_hostlist;
use crate::spec::{self, Role};
use std::collections::{BTreeMap, HashMap};

/// Default of [`Params::preempt_slack_s`]: a freed node is normally taken by the main
/// scheduler at once, by the backfill scheduler within `bf_interval` (30 s by default).
pub const DEFAULT_PREEMPT_SLACK_S: i64 = 60;

/// One accounting record (one run of a job), as much of it as accounting needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageRecord {
    pub job_id: u32,
    pub name: String,
    /// User name, or the uid in decimal when accounting has no name.
    pub user: String,
    pub user_id: u32,
    pub account: String,
    pub admin_comment: Option<String>,
    /// Nodes allocated (sacct's NNodes); 0 for a job that never ran.
    pub nodes: u32,
    /// CPUs allocated (sacct's AllocCPUS).
    pub cpus: u32,
    /// Host list it ran on; `None` if it never ran.
    pub node_list: Option<String>,
    pub eligible: Option<i64>,
    pub start: Option<i64>,
    /// `None` while it runs.
    pub end: Option<i64>,
    /// Ended by Slurm's preemption (state PREEMPTED).
    pub preempted: bool,
}

/// The window and the rules' one knob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Window `[start, end)`, Unix seconds.
    pub start: i64,
    pub end: i64,
    /// The present: where running records end (the window's end is never later).
    pub now: i64,
    /// How long after a record's end a regular job starting on its node still counts
    /// as having taken it.
    pub preempt_slack_s: i64,
}

/// Which elastic jobs to report; empty lists keep all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub user_ids: Vec<u32>,
    pub accounts: Vec<String>,
}

/// One elastic job's usage inside the window.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobUsage {
    /// The core job's id (the parent of the satellites).
    pub job_id: u32,
    /// The core's job name; empty when no run of the core is among the records.
    pub name: String,
    pub user: String,
    pub user_id: u32,
    pub account: String,
    /// Runs of the core job among the records (more than one when requeued); 0 for
    /// satellites whose core lies outside the window.
    pub core_runs: u32,
    /// Satellites that held a node inside the window.
    pub satellites: u32,
    pub node_seconds: u64,
    pub cpu_seconds: u64,
    /// Seconds during which the job held at least one node.
    pub held_seconds: u64,
    /// Most nodes held at once (core and satellites together).
    pub max_nodes: u32,
    /// node_seconds / held_seconds (0 when it held nothing).
    pub mean_nodes: f64,
    pub preemptions: u32,
    /// First start and last end inside the window (clipped); `last_end` is `None` when
    /// a record of the job was still running at the window's end.
    pub first_start: Option<i64>,
    pub last_end: Option<i64>,
}

/// Sums over elastic jobs (per user, per account, or all).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    pub jobs: u32,
    pub satellites: u32,
    pub node_seconds: u64,
    pub cpu_seconds: u64,
    pub preemptions: u32,
}

impl Totals {
    fn add(&mut self, j: &JobUsage) {
        self.jobs += 1;
        self.satellites += j.satellites;
        self.node_seconds += j.node_seconds;
        self.cpu_seconds += j.cpu_seconds;
        self.preemptions += j.preemptions;
    }
}

/// The whole answer, jobs in id order and totals in name order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub jobs: Vec<JobUsage>,
    pub by_user: BTreeMap<String, Totals>,
    pub by_account: BTreeMap<String, Totals>,
    pub total: Totals,
    /// Records read, and how many of them belong to an elastic job (before the filter).
    pub records: usize,
    pub elastic_records: usize,
}

/// What a record is to accounting.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    Core,
    Satellite(u32),
    Plain,
}

fn part_of(r: &UsageRecord) -> Part {
    match r.admin_comment.as_deref().map(str::trim) {
        Some(c) if !c.is_empty() => match spec::parse_tag(c) {
            Some(Ok(s)) => match (s.role, s.parent) {
                (Role::Satellite, Some(p)) => Part::Satellite(p),
                _ => Part::Core,
            },
            // Another site's admin comment, or a tag this version cannot read.
            _ => Part::Plain,
        },
        _ => satellite_name_parent(&r.name).map_or(Part::Plain, Part::Satellite),
    }
}

/// `bftsat-J` -> J (bftrainerd's satellite name).
pub fn satellite_name_parent(name: &str) -> Option<u32> {
    let id = name.strip_prefix("bftsat-")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok().filter(|&p| p > 0)
}

/// `[start, end)` of a record clipped to the window; `None` if it never ran in it.
fn clipped(r: &UsageRecord, p: &Params) -> Option<(i64, i64)> {
    let s = r.start?.max(p.start);
    let e = r.end.unwrap_or(p.now).min(p.end);
    (e > s).then_some((s, e))
}

/// Node name -> (start, eligible) of regular jobs that started on it, sorted by start.
type Takers = HashMap<String, Vec<(i64, i64)>>;

fn takers(records: &[UsageRecord], parts: &[Part]) -> Takers {
    let mut t: Takers = HashMap::new();
    for (r, part) in records.iter().zip(parts) {
        let (Part::Plain, Some(start), Some(list)) = (part, r.start, r.node_list.as_deref()) else {
            continue;
        };
        let eligible = r.eligible.unwrap_or(start);
        for n in expand_hostlist(list).unwrap_or_default() {
            t.entry(n).or_default().push((start, eligible));
        }
    }
    for v in t.values_mut() {
        v.sort_unstable();
    }
    t
}

fn lost_to_regular_job(r: &UsageRecord, p: &Params, takers: &Takers) -> bool {
    let (Some(end), Some(list)) = (r.end, r.node_list.as_deref()) else {
        return false;
    };
    if end < p.start || end >= p.end {
        return false;
    }
    if r.preempted {
        return true;
    }
    expand_hostlist(list).unwrap_or_default().iter().any(|n| {
        let Some(v) = takers.get(n) else {
            return false;
        };
        let from = v.partition_point(|&(s, _)| s < end);
        v[from..]
            .iter()
            .take_while(|&&(s, _)| s <= end + p.preempt_slack_s)
            .any(|&(_, eligible)| eligible <= end)
    })
}

/// Groups `records` into elastic jobs and sums their usage inside the window.
pub fn aggregate(records: &[UsageRecord], p: &Params, filter: &Filter) -> Report {
    let parts: Vec<Part> = records.iter().map(part_of).collect();
    // Core owners, to keep a plain job named like a satellite out of another's job.
    let mut owner: HashMap<u32, u32> = HashMap::new();
    for (r, part) in records.iter().zip(&parts) {
        if *part == Part::Core {
            owner.insert(r.job_id, r.user_id);
        }
    }
    let takers = takers(records, &parts);
    // Per elastic job: indices of its core runs and satellites.
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, (r, part)) in records.iter().zip(&parts).enumerate() {
        let key = match *part {
            Part::Core => r.job_id,
            Part::Satellite(parent) => {
                let by_name = !r
                    .admin_comment
                    .as_deref()
                    .is_some_and(|c| !c.trim().is_empty());
                if by_name && owner.get(&parent).is_some_and(|&u| u != r.user_id) {
                    continue;
                }
                parent
            }
            Part::Plain => continue,
        };
        groups.entry(key).or_default().push(i);
    }
    let mut report = Report {
        records: records.len(),
        elastic_records: groups.values().map(Vec::len).sum(),
        ..Default::default()
    };
    let mut edges: Vec<(i64, i64)> = Vec::new();
    for (&id, idx) in &groups {
        let mut u = JobUsage {
            job_id: id,
            name: String::new(),
            user: String::new(),
            user_id: 0,
            account: String::new(),
            core_runs: 0,
            satellites: 0,
            node_seconds: 0,
            cpu_seconds: 0,
            held_seconds: 0,
            max_nodes: 0,
            mean_nodes: 0.0,
            preemptions: 0,
            first_start: None,
            last_end: None,
        };
        // Owner from the latest core run, else from the first satellite.
        let core_rec = idx
            .iter()
            .filter(|&&i| parts[i] == Part::Core)
            .max_by_key(|&&i| records[i].start.unwrap_or(i64::MIN))
            .map(|&i| &records[i]);
        if let Some(w) = core_rec.or_else(|| idx.first().map(|&i| &records[i])) {
            u.user.clone_from(&w.user);
            u.user_id = w.user_id;
            u.account.clone_from(&w.account);
        }
        if let Some(c) = core_rec {
            u.name.clone_from(&c.name);
        }
        edges.clear();
        let mut running = false;
        let mut last_end = i64::MIN;
        for &i in idx {
            let r = &records[i];
            if parts[i] == Part::Core {
                u.core_runs += 1;
            }
            if lost_to_regular_job(r, p, &takers) {
                u.preemptions += 1;
            }
            let Some((s, e)) = clipped(r, p) else {
                continue;
            };
            if matches!(parts[i], Part::Satellite(_)) {
                u.satellites += 1;
            }
            let d = (e - s) as u64;
            u.node_seconds += d * u64::from(r.nodes);
            u.cpu_seconds += d * u64::from(r.cpus);
            u.first_start = Some(u.first_start.map_or(s, |f| f.min(s)));
            if r.end.is_none() && e == p.now.min(p.end) {
                running = true;
            }
            last_end = last_end.max(e);
            if r.nodes > 0 {
                edges.push((s, i64::from(r.nodes)));
                edges.push((e, -i64::from(r.nodes)));
            }
        }
        u.last_end = (!running && last_end > i64::MIN).then_some(last_end);
        // Sweep: ends before starts at the same second, so back-to-back satellites on
        // one node count once.
        edges.sort_unstable();
        let (mut cur, mut since) = (0i64, 0i64);
        for &(t, d) in &edges {
            if cur > 0 {
                u.held_seconds += (t - since) as u64;
            }
            cur += d;
            since = t;
            u.max_nodes = u.max_nodes.max(cur as u32);
        }
        if u.held_seconds > 0 {
            u.mean_nodes = u.node_seconds as f64 / u.held_seconds as f64;
        }
        let keep = (filter.user_ids.is_empty() || filter.user_ids.contains(&u.user_id))
            && (filter.accounts.is_empty() || filter.accounts.contains(&u.account));
        if keep {
            report.by_user.entry(u.user.clone()).or_default().add(&u);
            report
                .by_account
                .entry(u.account.clone())
                .or_default()
                .add(&u);
            report.total.add(&u);
            report.jobs.push(u);
        }
    }
    report
}

/// Whole seconds to hours for display.
pub fn hours(s: u64) -> f64 {
    s as f64 / 3600.0
}

/// A point in time as `bftrainer acct` accepts it, before the local time zone is
/// applied (the caller does that: the core has no clock and no zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSpec {
    /// A civil date and time; `utc` when written with a trailing `Z`.
    Civil {
        y: i64,
        mo: i64,
        d: i64,
        h: i64,
        mi: i64,
        s: i64,
        utc: bool,
    },
    /// `now` plus this many seconds (negative: in the past).
    Now(i64),
    /// Midnight (local) of today plus this many days (`today`, `yesterday`).
    Today(i64),
    /// `@N` or a bare integer: Unix seconds.
    Unix(i64),
}

/// What [`parse_time_spec`] accepts, for error messages.
pub const TIME_FORMATS: &str = "YYYY-MM-DD, YYYY-MM-DDTHH:MM or YYYY-MM-DDTHH:MM:SS (local \
time, as sacct; a trailing Z for UTC), now, now-N or now+N with a unit seconds, minutes, \
hours, days or weeks (e.g. now-7days, now-3hours), today, yesterday, or Unix seconds";

/// Parses a time as sacct's `-S`/`-E` do (the common forms), plus Unix seconds.
pub fn parse_time_spec(text: &str) -> Result<TimeSpec, String> {
    let s = text.trim();
    let bad = || format!("{text:?} is not a time; allowed: {TIME_FORMATS}");
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "now" => return Ok(TimeSpec::Now(0)),
        "today" | "midnight" => return Ok(TimeSpec::Today(0)),
        "yesterday" => return Ok(TimeSpec::Today(-1)),
        "tomorrow" => return Ok(TimeSpec::Today(1)),
        _ => {}
    }
    if let Some(rest) = lower.strip_prefix("now") {
        let (sign, rest) = match rest.as_bytes().first() {
            Some(b'-') => (-1, &rest[1..]),
            Some(b'+') => (1, &rest[1..]),
            _ => return Err(bad()),
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: i64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = match &rest[digits..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => return Err(bad()),
        };
        return n
            .checked_mul(unit)
            .map(|v| TimeSpec::Now(sign * v))
            .ok_or_else(bad);
    }
    let unix = s.strip_prefix('@').unwrap_or(s);
    if !unix.is_empty() && unix.bytes().all(|b| b.is_ascii_digit()) {
        return unix.parse().map(TimeSpec::Unix).map_err(|_| bad());
    }
    let (body, utc) = match s.strip_suffix('Z') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let b = body.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = b.get(r).ok_or_else(bad)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        std::str::from_utf8(part)
            .ok()
            .and_then(|p| p.parse().ok())
            .ok_or_else(bad)
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = match b.len() {
        10 => (0, 0, 0),
        16 | 19 if b[10] == b'T' || b[10] == b' ' => {
            if b[13] != b':' || (b.len() == 19 && b[16] != b':') {
                return Err(bad());
            }
            let sec = if b.len() == 19 { num(17..19)? } else { 0 };
            (num(11..13)?, num(14..16)?, sec)
        }
        _ => return Err(bad()),
    };
    if !crate::timefmt::civil_ok(y, mo, d, h, mi, sec) {
        return Err(format!(
            "{text:?}: a field is out of range; allowed: {TIME_FORMATS}"
        ));
    }
    Ok(TimeSpec::Civil {
        y,
        mo,
        d,
        h,
        mi,
        s: sec,
        utc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3600;

    fn rec(id: u32, comment: &str, nodes: u32, start: i64, end: Option<i64>) -> UsageRecord {
        UsageRecord {
            job_id: id,
            name: "train".into(),
            user: "alice".into(),
            user_id: 1000,
            account: "ml".into(),
            admin_comment: (!comment.is_empty()).then(|| comment.to_string()),
            nodes,
            cpus: nodes * 8,
            node_list: Some(format!("n{id}")),
            eligible: Some(start - 10),
            start: Some(start),
            end,
            preempted: false,
        }
    }

    fn core(id: u32, start: i64, end: Option<i64>) -> UsageRecord {
        rec(id, "bftrainer:v1 1:4,role=core", 1, start, end)
    }

    fn sat(id: u32, parent: u32, start: i64, end: Option<i64>) -> UsageRecord {
        let mut r = rec(
            id,
            &format!("bftrainer:v1 1:1,role=satellite,parent={parent}"),
            1,
            start,
            end,
        );
        r.name = format!("bftsat-{parent}");
        r
    }

    fn params(start: i64, end: i64) -> Params {
        Params {
            start,
            end,
            now: end,
            preempt_slack_s: DEFAULT_PREEMPT_SLACK_S,
        }
    }

    #[test]
    fn core_and_satellites_sum_and_size() {
        // Core 0-4h on 1 node; satellites 1-3h and 2-3h: size 1,2,3,1.
        let rs = vec![
            core(10, 0, Some(4 * H)),
            sat(11, 10, H, Some(3 * H)),
            sat(12, 10, 2 * H, Some(3 * H)),
            rec(13, "", 2, 0, Some(H)), // a plain job: not counted
        ];
        let r = aggregate(&rs, &params(0, 10 * H), &Filter::default());
        assert_eq!(r.jobs.len(), 1);
        let j = &r.jobs[0];
        assert_eq!((j.job_id, j.core_runs, j.satellites), (10, 1, 2));
        assert_eq!(j.node_seconds, 7 * H as u64);
        assert_eq!(j.cpu_seconds, 56 * H as u64);
        assert_eq!(j.held_seconds, 4 * H as u64);
        assert_eq!(j.max_nodes, 3);
        assert!((j.mean_nodes - 1.75).abs() < 1e-12);
        assert_eq!((j.first_start, j.last_end), (Some(0), Some(4 * H)));
        assert_eq!(r.total.node_seconds, 7 * H as u64);
        assert_eq!(r.by_user["alice"].jobs, 1);
        assert_eq!(r.by_account["ml"].cpu_seconds, 56 * H as u64);
        assert_eq!((r.records, r.elastic_records), (4, 3));
    }

    #[test]
    fn back_to_back_satellites_do_not_overlap() {
        let rs = vec![
            core(1, 0, Some(3 * H)),
            sat(2, 1, 0, Some(H)),
            sat(3, 1, H, Some(2 * H)),
        ];
        let j = &aggregate(&rs, &params(0, 3 * H), &Filter::default()).jobs[0];
        assert_eq!(j.max_nodes, 2);
    }

    #[test]
    fn every_run_of_a_requeued_core_counts() {
        let mut first = core(5, 0, Some(H));
        first.preempted = true;
        let rs = vec![
            first,
            core(5, 2 * H, Some(3 * H)),
            sat(6, 5, 2 * H, Some(3 * H)),
        ];
        let j = &aggregate(&rs, &params(0, 4 * H), &Filter::default()).jobs[0];
        assert_eq!(j.core_runs, 2);
        assert_eq!(j.node_seconds, 3 * H as u64);
        assert_eq!(j.held_seconds, 2 * H as u64);
        assert_eq!(j.preemptions, 1);
        assert!((j.mean_nodes - 1.5).abs() < 1e-12);
    }

    #[test]
    fn window_clips_and_running_records_run_until_now() {
        // Window [1h, 3h); now = 2.5h. Core started before it, satellite still runs.
        let rs = vec![core(1, 0, None), sat(2, 1, 2 * H, None)];
        let p = Params {
            start: H,
            end: 3 * H,
            now: 5 * H / 2,
            preempt_slack_s: 60,
        };
        let j = &aggregate(&rs, &p, &Filter::default()).jobs[0];
        assert_eq!(j.node_seconds, (3 * H / 2 + H / 2) as u64);
        assert_eq!(j.first_start, Some(H));
        assert_eq!(j.last_end, None, "still running");
        assert_eq!(j.max_nodes, 2);
        // A window that ends before the satellite started.
        let j = &aggregate(&rs, &params(H, 2 * H), &Filter::default()).jobs[0];
        assert_eq!((j.node_seconds, j.satellites), (H as u64, 0));
        assert_eq!(j.last_end, None, "still running at the window's end");
        // Ended records end where they ended.
        let rs = vec![core(1, 0, Some(3 * H / 2)), sat(2, 1, 2 * H, None)];
        let j = &aggregate(&rs, &params(H, 2 * H), &Filter::default()).jobs[0];
        assert_eq!(j.last_end, Some(3 * H / 2));
    }

    #[test]
    fn orphan_satellite_and_name_only_satellite() {
        // The core (99) is outside the window; one satellite lost its admin comment.
        let mut untagged = sat(8, 99, 0, Some(H));
        untagged.admin_comment = None;
        let rs = vec![sat(7, 99, 0, Some(H)), untagged];
        let r = aggregate(&rs, &params(0, 2 * H), &Filter::default());
        let j = &r.jobs[0];
        assert_eq!((j.job_id, j.core_runs, j.satellites), (99, 0, 2));
        assert_eq!(j.name, "");
        assert_eq!(j.user, "alice");
        assert_eq!(j.node_seconds, 2 * H as u64);
        // A plain job of another user named like a satellite of a known core is not one.
        let mut mallory = sat(9, 1, 0, Some(H));
        mallory.admin_comment = None;
        mallory.user_id = 2000;
        let r = aggregate(
            &[core(1, 0, Some(H)), mallory],
            &params(0, H),
            &Filter::default(),
        );
        assert_eq!(r.jobs[0].satellites, 0);
        assert_eq!(r.jobs[0].node_seconds, H as u64);
    }

    #[test]
    fn a_node_taken_by_a_regular_job_is_a_preemption_a_shrink_is_not() {
        let mut s1 = sat(2, 1, 0, Some(H));
        s1.node_list = Some("n7".into());
        let mut s2 = sat(3, 1, 0, Some(H));
        s2.node_list = Some("n8".into());
        // A regular job waiting since before the satellite ended, started on n7 5 s later.
        let mut regular = rec(50, "", 2, H + 5, Some(2 * H));
        regular.node_list = Some("n[6-7]".into());
        regular.eligible = Some(H - 30);
        // One submitted after s2 ended does not count, nor one starting too late.
        let mut later = rec(51, "", 1, H + 5, Some(2 * H));
        later.node_list = Some("n8".into());
        later.eligible = Some(H + 1);
        let mut late = rec(52, "", 1, H + 600, Some(2 * H));
        late.node_list = Some("n8".into());
        late.eligible = Some(0);
        let rs = vec![core(1, 0, Some(2 * H)), s1, s2, regular, later, late];
        let r = aggregate(&rs, &params(0, 3 * H), &Filter::default());
        assert_eq!(r.jobs.len(), 1);
        assert_eq!(r.jobs[0].preemptions, 1);
        // An ending outside the window is not counted in it.
        let r = aggregate(&rs, &params(0, H), &Filter::default());
        assert_eq!(r.jobs[0].preemptions, 0);
    }

    #[test]
    fn filters_and_totals() {
        let mut b = core(2, 0, Some(H));
        b.user = "bob".into();
        b.user_id = 1001;
        b.account = "phys".into();
        let rs = vec![core(1, 0, Some(H)), b, sat(3, 2, 0, Some(H))];
        let all = aggregate(&rs, &params(0, H), &Filter::default());
        assert_eq!(all.jobs.len(), 2);
        assert_eq!(all.total.node_seconds, 3 * H as u64);
        assert_eq!(all.by_user["bob"].node_seconds, 2 * H as u64);
        assert_eq!(all.by_account["ml"].jobs, 1);
        let f = Filter {
            user_ids: vec![1001],
            ..Default::default()
        };
        let r = aggregate(&rs, &params(0, H), &f);
        assert_eq!(r.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(), [2]);
        let f = Filter {
            accounts: vec!["ml".into()],
            ..Default::default()
        };
        let r = aggregate(&rs, &params(0, H), &f);
        assert_eq!(r.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(), [1]);
        assert_eq!(r.total.node_seconds, H as u64);
    }

    #[test]
    fn never_started_and_foreign_comments() {
        let mut pending = sat(2, 1, 0, None);
        pending.start = None;
        pending.end = Some(10);
        let mut foreign = core(3, 0, Some(H));
        foreign.admin_comment = Some("billing:project-7".into());
        let r = aggregate(
            &[core(1, 0, Some(H)), pending, foreign],
            &params(0, H),
            &Filter::default(),
        );
        assert_eq!(r.jobs.len(), 1);
        assert_eq!(
            (r.jobs[0].satellites, r.jobs[0].node_seconds),
            (0, H as u64)
        );
    }

    #[test]
    fn time_specs() {
        assert_eq!(parse_time_spec("now"), Ok(TimeSpec::Now(0)));
        assert_eq!(parse_time_spec("now-7days"), Ok(TimeSpec::Now(-7 * 86_400)));
        assert_eq!(parse_time_spec("now-3hours"), Ok(TimeSpec::Now(-3 * 3600)));
        assert_eq!(parse_time_spec("NOW+90"), Ok(TimeSpec::Now(90)));
        assert_eq!(parse_time_spec("today"), Ok(TimeSpec::Today(0)));
        assert_eq!(
            parse_time_spec("@1700000000"),
            Ok(TimeSpec::Unix(1_700_000_000))
        );
        assert_eq!(
            parse_time_spec("2026-11-24"),
            Ok(TimeSpec::Civil {
                y: 2026,
                mo: 11,
                d: 24,
                h: 0,
                mi: 0,
                s: 0,
                utc: false
            })
        );
        assert_eq!(
            parse_time_spec("2026-11-24T10:05"),
            Ok(TimeSpec::Civil {
                y: 2026,
                mo: 11,
                d: 24,
                h: 10,
                mi: 5,
                s: 0,
                utc: false
            })
        );
        assert_eq!(
            parse_time_spec("2026-11-24T10:05:09Z"),
            Ok(TimeSpec::Civil {
                y: 2026,
                mo: 11,
                d: 24,
                h: 10,
                mi: 5,
                s: 9,
                utc: true
            })
        );
        for bad in [
            "",
            "yesterdayish",
            "now-",
            "now-3fortnights",
            "2026-02-30",
            "2026-11-24T25:00",
            "24/11/2026",
            "2026-11-24T10",
            "soon",
        ] {
            let e = parse_time_spec(bad).unwrap_err();
            assert!(e.contains("allowed: YYYY-MM-DD"), "{bad}: {e}");
        }
    }
}
