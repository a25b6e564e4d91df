//! `bftrainer acct`: elastic usage from slurmdbd, per elastic job (core runs and their
//! satellites) and per user and account; the rules are in `bftrainer_core::acct`.

use anyhow::{bail, Context};
use bftrainer_core::acct::{
    aggregate, hours, parse_time_spec, Filter, JobUsage, Params, Report, TimeSpec, Totals,
    UsageRecord, DEFAULT_PREEMPT_SLACK_S,
};
use bftrainer_slurm::{AcctJob, AcctQuery, JobBase, Slurm, SlurmDb};
use std::fmt::Write as _;

/// The `schema` field of `--json`; bumped when a field changes meaning or goes away.
pub const SCHEMA: &str = "bftrainer.acct/1";

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Times as sacct takes them: YYYY-MM-DD[THH:MM[:SS]] in local time (a \
trailing Z for UTC), now, now-7days, now-3hours (seconds, minutes, hours, days, weeks), today, \
yesterday, or Unix seconds. The default window is sacct's: from midnight today to now. \
Every run of a requeued job counts (as `sacct -D`), clipped to the window (as `sacct --truncate`)."
)]
pub struct Args {
    /// Window start (default: midnight today, local time, as sacct).
    #[arg(short = 'S', long, value_name = "TIME")]
    pub start: Option<String>,
    /// Window end (default: now; a later time is taken as now).
    #[arg(short = 'E', long, value_name = "TIME")]
    pub end: Option<String>,
    /// Only elastic jobs of these users (names or uids, comma-separated).
    #[arg(
        short = 'u',
        long = "user",
        value_name = "USER[,USER...]",
        value_delimiter = ','
    )]
    pub users: Vec<String>,
    /// Only elastic jobs charged to these accounts (comma-separated).
    #[arg(
        short = 'A',
        long = "account",
        value_name = "ACCOUNT[,...]",
        value_delimiter = ','
    )]
    pub accounts: Vec<String>,
    /// Print JSON (schema bftrainer.acct/1, docs/admin.md).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV: one row per elastic job, then per user, per account and the total.
    #[arg(long)]
    pub csv: bool,
    /// A record that ended counts as preempted when a regular job, already waiting,
    /// started on its node at most this many seconds later.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_PREEMPT_SLACK_S)]
    pub preempt_slack: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

fn now() -> i64 {
    crate::daemon::run::unix_now() as i64
}

/// Local midnight of the day holding `t`, plus `days` days (mktime handles DST).
fn local_midnight(t: i64, days: i64) -> i64 {
    // SAFETY: tm is plain data filled by localtime_r; mktime reads and normalises it.
    unsafe {
        let tt = t as libc::time_t;
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&tt, &mut tm);
        tm.tm_hour = 0;
        tm.tm_min = 0;
        tm.tm_sec = 0;
        tm.tm_mday += days as i32;
        tm.tm_isdst = -1;
        libc::mktime(&mut tm) as i64
    }
}

/// Unix seconds of a time given on the command line (`what` names the option).
pub fn resolve_time(what: &str, text: &str, now: i64) -> anyhow::Result<i64> {
    let spec = parse_time_spec(text).map_err(|e| anyhow::anyhow!("{what} {e}"))?;
    Ok(match spec {
        TimeSpec::Now(off) => now + off,
        TimeSpec::Today(days) => local_midnight(now, days),
        TimeSpec::Unix(t) => t,
        TimeSpec::Civil {
            y,
            mo,
            d,
            h,
            mi,
            s,
            utc,
        } => {
            if utc {
                bftrainer_core::timefmt::parse_time(&format!(
                    "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}"
                ))
                .map_err(|e| anyhow::anyhow!("{what} {text:?}: {e}"))?
            } else {
                // SAFETY: plain data; mktime interprets it in the local zone.
                unsafe {
                    let mut tm: libc::tm = std::mem::zeroed();
                    tm.tm_year = (y - 1900) as i32;
                    tm.tm_mon = (mo - 1) as i32;
                    tm.tm_mday = d as i32;
                    tm.tm_hour = h as i32;
                    tm.tm_min = mi as i32;
                    tm.tm_sec = s as i32;
                    tm.tm_isdst = -1;
                    libc::mktime(&mut tm) as i64
                }
            }
        }
    })
}

/// `YYYY-MM-DDTHH:MM:SS` in local time, as sacct prints.
pub fn local_time(t: i64) -> String {
    // SAFETY: plain data filled by localtime_r.
    let tm = unsafe {
        let tt = t as libc::time_t;
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&tt, &mut tm);
        tm
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// The window `[start, end)` from the options, checked.
pub fn window(start: Option<&str>, end: Option<&str>, now: i64) -> anyhow::Result<(i64, i64)> {
    let s = match start {
        Some(t) => resolve_time("--start", t, now)?,
        None => local_midnight(now, 0),
    };
    let e = match end {
        Some(t) => resolve_time("--end", t, now)?.min(now),
        None => now,
    };
    if s <= 0 {
        bail!(
            "--start {}: before 1970; slurmdbd has no records then",
            local_time(s)
        );
    }
    if e <= s {
        bail!(
            "the window is empty or inverted: --start {} is not before --end {}{}; give a start \
             earlier than the end",
            local_time(s),
            local_time(e),
            if end.is_some() { "" } else { " (now)" }
        );
    }
    Ok((s, e))
}

/// A uid from a user name or a decimal uid.
fn uid_of(user: &str) -> anyhow::Result<u32> {
    if !user.is_empty() && user.bytes().all(|b| b.is_ascii_digit()) {
        return user
            .parse()
            .with_context(|| format!("-u {user}: not a valid uid"));
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => {
            bail!("-u {user}: no such user on this host; give a user name or a numeric uid")
        }
        Err(e) => bail!("-u {user}: cannot look the user up ({e}); give a numeric uid"),
    }
}

/// Allocated CPUs from a TRES string: `cpu=N` (names) or `1=N` (slurmdbd's ids; TRES 1
/// is always cpu).
fn cpus_of(tres: Option<&str>) -> u32 {
    tres.unwrap_or("")
        .split(',')
        .find_map(|kv| match kv.split_once('=') {
            Some(("cpu" | "1", v)) => v.trim().parse().ok(),
            _ => None,
        })
        .unwrap_or(0)
}

/// The core's view of one slurmdbd record.
pub fn record_from(j: &AcctJob) -> UsageRecord {
    UsageRecord {
        job_id: j.job_id,
        name: j.name.clone(),
        user: j.user.clone().unwrap_or_else(|| j.user_id.to_string()),
        user_id: j.user_id,
        account: j.account.clone().unwrap_or_default(),
        admin_comment: j.admin_comment.clone(),
        nodes: j.alloc_nodes,
        cpus: cpus_of(j.tres_alloc.as_deref()),
        node_list: j.nodes.clone(),
        eligible: j.eligible_time,
        start: j.start_time,
        end: j.end_time,
        preempted: j.state.base() == JobBase::Preempted,
    }
}

/// The cluster to read: slurmctld's ClusterName, else slurm.conf's (accounting must work
/// with slurmctld away); `None` reads every cluster of this slurmdbd.
fn local_cluster(slurm: &Slurm) -> Option<String> {
    if let Ok(n) = slurm.cluster_name() {
        return Some(n);
    }
    let text = std::fs::read_to_string(bftrainer_slurm::config_path()).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split('#').next()?.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("ClusterName")
            .then(|| v.trim().to_string())
    })
}

/// Reads the window's job records (every run) from slurmdbd.
pub fn fetch(start: i64, end: i64) -> anyhow::Result<Vec<AcctJob>> {
    let slurm = Slurm::init().context("cannot initialise libslurm (is slurm.conf readable?)")?;
    let cluster = local_cluster(&slurm);
    let mut db = SlurmDb::connect(&slurm).context(
        "cannot reach slurmdbd (AccountingStorageHost in slurm.conf); is slurmdbd running?",
    )?;
    let q = AcctQuery {
        start,
        end: Some(end),
        duplicates: true,
        clusters: cluster.into_iter().collect(),
        ..Default::default()
    };
    db.jobs(&q)
        .context("slurmdbd did not return the job records; is slurmdbd running?")
}

fn json_totals(key: &str, name: &str, t: &Totals) -> serde_json::Value {
    serde_json::json!({
        key: name,
        "jobs": t.jobs,
        "satellites": t.satellites,
        "node_seconds": t.node_seconds,
        "cpu_seconds": t.cpu_seconds,
        "node_hours": hours(t.node_seconds),
        "cpu_hours": hours(t.cpu_seconds),
        "preemptions": t.preemptions,
    })
}

fn json_job(j: &JobUsage) -> serde_json::Value {
    serde_json::json!({
        "job_id": j.job_id,
        "name": j.name,
        "user": j.user,
        "user_id": j.user_id,
        "account": j.account,
        "core_runs": j.core_runs,
        "satellites": j.satellites,
        "node_seconds": j.node_seconds,
        "cpu_seconds": j.cpu_seconds,
        "node_hours": hours(j.node_seconds),
        "cpu_hours": hours(j.cpu_seconds),
        "held_seconds": j.held_seconds,
        "max_nodes": j.max_nodes,
        "mean_nodes": j.mean_nodes,
        "preemptions": j.preemptions,
        "first_start": j.first_start,
        "last_end": j.last_end,
    })
}

/// The report in the chosen format, as printed (with a final newline).
pub fn render(r: &Report, p: &Params, fmt: Format) -> String {
    match fmt {
        Format::Json => {
            let v = serde_json::json!({
                "schema": SCHEMA,
                "window": {
                    "start": p.start,
                    "end": p.end,
                    "start_local": local_time(p.start),
                    "end_local": local_time(p.end),
                },
                "preempt_slack_s": p.preempt_slack_s,
                "records": r.records,
                "elastic_records": r.elastic_records,
                "jobs": r.jobs.iter().map(json_job).collect::<Vec<_>>(),
                "users": r.by_user.iter().map(|(k, t)| json_totals("user", k, t)).collect::<Vec<_>>(),
                "accounts": r.by_account.iter().map(|(k, t)| json_totals("account", k, t)).collect::<Vec<_>>(),
                "total": json_totals("total", "all", &r.total),
            });
            let mut s = serde_json::to_string_pretty(&v).expect("JSON of plain values");
            s.push('\n');
            s
        }
        Format::Csv => {
            let mut s = String::from(
                "kind,key,job_id,name,user,account,core_runs,satellites,node_seconds,cpu_seconds,\
                 node_hours,cpu_hours,max_nodes,mean_nodes,preemptions,first_start,last_end\n",
            );
            let q = |x: &str| {
                if x.contains([',', '"', '\n']) {
                    format!("\"{}\"", x.replace('"', "\"\""))
                } else {
                    x.to_string()
                }
            };
            let opt = |t: Option<i64>| t.map(local_time).unwrap_or_default();
            for j in &r.jobs {
                let _ = writeln!(
                    s,
                    "job,{},{},{},{},{},{},{},{},{},{:.4},{:.4},{},{:.3},{},{},{}",
                    j.job_id,
                    j.job_id,
                    q(&j.name),
                    q(&j.user),
                    q(&j.account),
                    j.core_runs,
                    j.satellites,
                    j.node_seconds,
                    j.cpu_seconds,
                    hours(j.node_seconds),
                    hours(j.cpu_seconds),
                    j.max_nodes,
                    j.mean_nodes,
                    j.preemptions,
                    opt(j.first_start),
                    opt(j.last_end),
                );
            }
            let mut tot = |kind: &str, key: &str, t: &Totals| {
                let _ = writeln!(
                    s,
                    "{kind},{},,,,,,{},{},{},{:.4},{:.4},,,{},,",
                    q(key),
                    t.satellites,
                    t.node_seconds,
                    t.cpu_seconds,
                    hours(t.node_seconds),
                    hours(t.cpu_seconds),
                    t.preemptions
                );
            };
            for (k, t) in &r.by_user {
                tot("user", k, t);
            }
            for (k, t) in &r.by_account {
                tot("account", k, t);
            }
            tot("total", "all", &r.total);
            s
        }
        Format::Table => table(r, p),
    }
}

fn table(r: &Report, p: &Params) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Elastic usage from {} to {} ({} elastic jobs, {} of {} records)",
        local_time(p.start),
        local_time(p.end),
        r.jobs.len(),
        r.elastic_records,
        r.records
    );
    let _ = writeln!(
        s,
        "{:>10} {:<12} {:<10} {:<10} {:>4} {:>5} {:>10} {:>10} {:>4} {:>6} {:>7} {:<19} End",
        "JobID",
        "JobName",
        "User",
        "Account",
        "Runs",
        "Sats",
        "NodeHours",
        "CPUHours",
        "Max",
        "Mean",
        "Preempt",
        "Start",
    );
    let cut = |x: &str, n: usize| -> String {
        if x.chars().count() > n {
            let mut c: String = x.chars().take(n - 1).collect();
            c.push('+');
            c
        } else {
            x.to_string()
        }
    };
    for j in &r.jobs {
        let _ = writeln!(
            s,
            "{:>10} {:<12} {:<10} {:<10} {:>4} {:>5} {:>10.2} {:>10.2} {:>4} {:>6.2} {:>7} {:<19} {}",
            j.job_id,
            cut(&j.name, 12),
            cut(&j.user, 10),
            cut(&j.account, 10),
            j.core_runs,
            j.satellites,
            hours(j.node_seconds),
            hours(j.cpu_seconds),
            j.max_nodes,
            j.mean_nodes,
            j.preemptions,
            j.first_start.map(local_time).unwrap_or_default(),
            j.last_end.map_or_else(|| "Running".into(), local_time),
        );
    }
    let mut tot = |title: &str, rows: &mut dyn Iterator<Item = (&String, &Totals)>| {
        let _ = writeln!(
            s,
            "\n{:<21} {:>5} {:>5} {:>10} {:>10} {:>7}",
            title, "Jobs", "Sats", "NodeHours", "CPUHours", "Preempt"
        );
        for (k, t) in rows {
            let _ = writeln!(
                s,
                "{:<21} {:>5} {:>5} {:>10.2} {:>10.2} {:>7}",
                cut(k, 21),
                t.jobs,
                t.satellites,
                hours(t.node_seconds),
                hours(t.cpu_seconds),
                t.preemptions
            );
        }
    };
    tot("User", &mut r.by_user.iter());
    tot("Account", &mut r.by_account.iter());
    let all = String::from("all");
    tot("Total", &mut std::iter::once((&all, &r.total)));
    s
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let now = now();
    let (start, end) = window(args.start.as_deref(), args.end.as_deref(), now)?;
    if args.preempt_slack < 0 {
        bail!(
            "--preempt-slack {}: must be 0 or more seconds",
            args.preempt_slack
        );
    }
    let filter = Filter {
        user_ids: args
            .users
            .iter()
            .map(|u| uid_of(u.trim()))
            .collect::<anyhow::Result<_>>()?,
        accounts: args.accounts.iter().map(|a| a.trim().to_string()).collect(),
    };
    let fmt = if args.json {
        Format::Json
    } else if args.csv {
        Format::Csv
    } else {
        Format::Table
    };
    let t0 = std::time::Instant::now();
    let jobs = fetch(start, end)?;
    log::info!(
        "{} records from slurmdbd in {:.3} s",
        jobs.len(),
        t0.elapsed().as_secs_f64()
    );
    let records: Vec<UsageRecord> = jobs.iter().map(record_from).collect();
    let p = Params {
        start,
        end,
        now,
        preempt_slack_s: args.preempt_slack,
    };
    let report = aggregate(&records, &p, &filter);
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(render(&report, &p, fmt).as_bytes())
        .and_then(|()| out.flush())
        .context("writing the report")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tres_cpus() {
        assert_eq!(cpus_of(Some("1=8,2=1000,4=1")), 8);
        assert_eq!(cpus_of(Some("cpu=4,mem=1G,node=1")), 4);
        assert_eq!(cpus_of(Some("2=100,4=1")), 0);
        assert_eq!(cpus_of(None), 0);
    }

    #[test]
    fn windows_are_checked() {
        let now = 1_800_000_000;
        assert_eq!(
            window(Some("now-2hours"), Some("now-1hours"), now).unwrap(),
            (now - 7200, now - 3600)
        );
        assert_eq!(
            window(Some("@100"), Some("now+5days"), now).unwrap(),
            (100, now)
        );
        let e = window(Some("now-1hours"), Some("now-2hours"), now).unwrap_err();
        assert!(e.to_string().contains("inverted"), "{e}");
        let e = window(Some("tomorrow"), None, now).unwrap_err();
        assert!(e.to_string().contains("(now)"), "{e}");
        let e = window(Some("last tuesday"), None, now).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--start \"last tuesday\" is not a time; allowed:"),
            "{e}"
        );
        let e = window(None, Some("2026-13-01"), now).unwrap_err();
        assert!(e.to_string().contains("--end"), "{e}");
        assert_eq!(
            window(Some("2026-11-24T10:00:00Z"), Some("2026-11-24T11:00Z"), now).unwrap(),
            (1_795_514_400, 1_795_518_000)
        );
    }
}
