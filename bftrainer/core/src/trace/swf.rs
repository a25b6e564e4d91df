//! Standard Workload Format job logs (Parallel Workloads Archive): `;` header lines with
//! machine facts, then 18 whitespace-separated fields per job, -1 meaning unknown.

use super::Lines;
use crate::error::Result;
use std::io::BufRead;

/// The fields of one SWF job the scheduler model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SwfJob {
    pub id: i64,
    /// Seconds since the log's start.
    pub submit: i64,
    /// Seconds in queue; `None` when the log does not know.
    pub wait: Option<i64>,
    pub run: i64,
    /// Allocated processors, or requested ones when allocation is unknown; `None` when
    /// both are unknown.
    pub procs: Option<i64>,
    /// User's runtime estimate (requested time); `None` when unknown.
    pub req_time: Option<i64>,
}

/// A parsed log: header facts and jobs in file order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SwfLog {
    pub max_nodes: Option<i64>,
    pub max_procs: Option<i64>,
    pub unix_start: Option<i64>,
    pub jobs: Vec<SwfJob>,
}

/// Parses an SWF log. Data lines must have exactly 18 integer fields.
pub fn parse_swf<R: BufRead>(reader: R, what: &str) -> Result<SwfLog> {
    let mut lines = Lines::new(reader, what);
    let mut log = SwfLog::default();
    let mut last_submit = i64::MIN;
    while lines.advance()? {
        let line = lines.buf.as_str();
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(h) = t.strip_prefix(';') {
            if let Some((k, v)) = h.split_once(':') {
                let v = v.trim().parse::<i64>().ok();
                match k.trim() {
                    "MaxNodes" => log.max_nodes = v,
                    "MaxProcs" => log.max_procs = v,
                    "UnixStartTime" => log.unix_start = v,
                    _ => {}
                }
            }
            continue;
        }
        let mut f = [0i64; 18];
        let mut n = 0;
        for tok in t.split_ascii_whitespace() {
            if n == 18 {
                return Err(lines
                    .err("more than 18 fields: SWF has 18 whitespace-separated fields per job"));
            }
            // Some archive logs write fields as decimals (e.g. average CPU time).
            f[n] = match tok.parse::<i64>() {
                Ok(v) => v,
                Err(_) => match tok.parse::<f64>() {
                    Ok(v) if v.is_finite() => v.round() as i64,
                    _ => {
                        return Err(lines.err(format!(
                            "field {} ({}) is not a number: {tok:?}",
                            n + 1,
                            FIELD_NAMES[n]
                        )))
                    }
                },
            };
            n += 1;
        }
        if n < 18 {
            return Err(lines.err(format!(
                "only {n} fields, SWF needs 18 (missing from field {}: {})",
                n + 1,
                FIELD_NAMES[n]
            )));
        }
        let opt = |v: i64| (v >= 0).then_some(v);
        let job = SwfJob {
            id: f[0],
            submit: f[1],
            wait: opt(f[2]),
            run: f[3],
            procs: opt(f[4])
                .filter(|&p| p > 0)
                .or(opt(f[7]).filter(|&p| p > 0)),
            req_time: opt(f[8]).filter(|&r| r > 0),
        };
        if job.submit < 0 {
            return Err(lines.err(format!(
                "field 2 (submit time) must be >= 0, found {}",
                job.submit
            )));
        }
        if job.submit < last_submit {
            return Err(lines.err(format!(
                "submit time {} is earlier than the previous job's {last_submit}: SWF jobs must be sorted by submit time",
                job.submit
            )));
        }
        last_submit = job.submit;
        log.jobs.push(job);
    }
    if log.jobs.is_empty() {
        return Err(lines.err("no job lines"));
    }
    Ok(log)
}

const FIELD_NAMES: [&str; 18] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job",
    "think time",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_and_jobs() {
        let s = "; MaxNodes: 4\n; MaxProcs: 32\n 1 0 -1 100 16 -1 -1 16 200 -1 1 1 -1 1 -1 1 -1 -1\n 2 5 3 50 -1 -1 -1 8 -1 -1 1 1 -1 1 -1 1 -1 -1\n";
        let l = parse_swf(s.as_bytes(), "a.swf").unwrap();
        assert_eq!((l.max_nodes, l.max_procs), (Some(4), Some(32)));
        assert_eq!(
            l.jobs[0],
            SwfJob {
                id: 1,
                submit: 0,
                wait: None,
                run: 100,
                procs: Some(16),
                req_time: Some(200)
            }
        );
        assert_eq!(
            l.jobs[1],
            SwfJob {
                id: 2,
                submit: 5,
                wait: Some(3),
                run: 50,
                procs: Some(8),
                req_time: None
            }
        );
    }

    #[test]
    fn rejects_missing_fields_and_garbage() {
        let e = |s: &str| parse_swf(s.as_bytes(), "a.swf").unwrap_err().to_string();
        assert_eq!(
            e("; x\n 1 0 -1 100 16 -1 -1 16\n"),
            "a.swf:2: only 8 fields, SWF needs 18 (missing from field 9: requested time)"
        );
        assert!(e(" 1 0 -1 1x0 16 -1 -1 16 200 -1 1 1 -1 1 -1 1 -1 -1\n")
            .starts_with("a.swf:1: field 4 (run time) is not a number"));
        assert!(e(" 1 9 -1 1 1 -1 -1 1 1 -1 1 1 -1 1 -1 1 -1 -1\n 2 3 -1 1 1 -1 -1 1 1 -1 1 1 -1 1 -1 1 -1 -1\n").starts_with("a.swf:2: submit time 3 is earlier"));
    }
}
