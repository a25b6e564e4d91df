//! Standard Workload Format job logs (Parallel Workloads Archive): `;` header lines with
//! machine facts, then 18 whitespace-separated fields per job, -1 meaning unknown.

use super::extsort::{MakeScratch, Record, Sorter, Store};
use super::{Lines, Order, Sorted};
use crate::easy::{JobPass, JobSource};
use crate::error::Result;
use std::cmp::Ordering;
use std::io::BufRead;

/// The fields of one SWF job the scheduler model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Largest submit or wait time accepted, seconds (100 years): beyond it a log is
/// corrupt, and sums of times could overflow.
pub const MAX_TIME_S: i64 = 3_155_760_000;

/// A parsed log with where each job came from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SwfFile {
    /// Jobs sorted by submit time (stable: file order breaks ties).
    pub log: SwfLog,
    /// The file line of each job of `log.jobs`.
    pub lines: Vec<u64>,
    pub sorted: Sorted,
}

/// Parses an SWF log whose jobs must be sorted by submit time; see [`parse_swf_with`].
pub fn parse_swf<R: BufRead>(reader: R, what: &str) -> Result<SwfLog> {
    parse_swf_with(reader, what, Order::Strict).map(|f| f.log)
}

/// Parses an SWF log. Data lines must have exactly 18 integer fields. Jobs out of
/// submit-time order are sorted (`Order::Sort`; counted in `SwfFile::sorted`) or
/// refused (`Order::Strict`). Jobs submitted at the same second go in job-number order
/// (SWF numbers jobs in submission order), then file order: a shuffled log sorts back
/// to the original. The sort orders a permutation of job indices (4 bytes per job) and
/// applies it in place: no job is copied twice. A sorted log is not touched.
pub fn parse_swf_with<R: BufRead>(reader: R, what: &str, order: Order) -> Result<SwfFile> {
    let mut r = SwfReader::new(reader, what, order);
    let mut jobs = Vec::new();
    let mut at: Vec<u64> = Vec::new();
    while let Some((job, line)) = r.next_job()? {
        jobs.push(job);
        at.push(line);
    }
    let sorted = r.finish()?;
    let h = r.header;
    let mut log = SwfLog {
        max_nodes: h.max_nodes,
        max_procs: h.max_procs,
        unix_start: h.unix_start,
        jobs,
    };
    if sorted.out_of_order > 0 {
        let mut perm: Vec<u32> = (0..log.jobs.len() as u32).collect();
        perm.sort_unstable_by_key(|&i| {
            let j = &log.jobs[i as usize];
            (j.submit, j.id, i)
        });
        permute(&mut log.jobs, &mut at, &mut perm);
    }
    Ok(SwfFile {
        log,
        lines: at,
        sorted,
    })
}

/// Jobs sorted in memory at once by [`sort_swf`]: about 5 MiB of jobs per run.
pub const SORT_CHUNK: usize = 65_536;

/// A job and its file line as a sort record, 56 bytes in a run (-1 for `None`).
/// Ordered by (submit, job number, line): lines grow with file order, so this is
/// [`parse_swf_with`]'s order (submit, job number, file index).
#[derive(Debug, Clone)]
struct JobAt {
    job: SwfJob,
    line: u64,
}

impl JobAt {
    fn key(&self) -> (i64, i64, u64) {
        (self.job.submit, self.job.id, self.line)
    }
}

impl PartialEq for JobAt {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for JobAt {}
impl PartialOrd for JobAt {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for JobAt {
    fn cmp(&self, o: &Self) -> Ordering {
        self.key().cmp(&o.key())
    }
}

impl Record for JobAt {
    const SIZE: usize = 56;
    fn encode(&self, out: &mut Vec<u8>) {
        let j = &self.job;
        let none = |v: Option<i64>| v.unwrap_or(-1);
        for v in [
            j.id,
            j.submit,
            none(j.wait),
            j.run,
            none(j.procs),
            none(j.req_time),
            self.line as i64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    fn decode(b: &[u8]) -> Self {
        let f = |i: usize| i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        // The parser keeps only values >= 0 (wait) or > 0 (procs, req_time) as `Some`.
        let opt = |v: i64| (v >= 0).then_some(v);
        JobAt {
            job: SwfJob {
                id: f(0),
                submit: f(1),
                wait: opt(f(2)),
                run: f(3),
                procs: opt(f(4)),
                req_time: opt(f(5)),
            },
            line: f(6) as u64,
        }
    }
}

/// The jobs of an SWF log out of submit-time order, sorted in bounded memory (see
/// [`sort_swf`]); each pass merges the sorted runs again.
pub struct SortedSwf {
    pub header: SwfHeader,
    pub sorted: Sorted,
    jobs: Store<JobAt>,
}

impl SortedSwf {
    /// Sorted runs on disk; 0 when the log fitted in one chunk and is held in memory.
    pub fn runs(&self) -> usize {
        self.jobs.runs()
    }
}

impl JobSource for SortedSwf {
    fn header(&self) -> SwfHeader {
        self.header
    }
    fn jobs(&self) -> Result<JobPass<'_>> {
        Ok(Box::new(
            self.jobs.iter()?.map(|r| r.map(|j| (j.job, j.line))),
        ))
    }
}

/// Reads an SWF log whose jobs may be out of submit-time order and sorts them in the
/// order of [`parse_swf_with`] (`Order::Sort`) in bounded memory: `chunk` jobs at a time
/// are sorted, and when the log holds more than one chunk each is written as a sorted
/// run to the scratch space `make` gives (the replay's: an anonymous temporary file),
/// 56 bytes a job, and every pass over the jobs merges the runs. A log of one chunk
/// stays in memory.
pub fn sort_swf<R: BufRead>(
    reader: R,
    what: &str,
    chunk: usize,
    make: MakeScratch<'_>,
) -> Result<SortedSwf> {
    let mut r = SwfReader::new(reader, what, Order::Sort);
    let mut sorter = Sorter::new(what, chunk, make);
    while let Some((job, line)) = r.next_job()? {
        sorter.push(JobAt { job, line })?;
    }
    let sorted = r.finish()?;
    Ok(SortedSwf {
        header: r.header,
        sorted,
        jobs: sorter.finish()?,
    })
}

/// The machine facts of an SWF header (`; MaxNodes: N` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SwfHeader {
    pub max_nodes: Option<i64>,
    pub max_procs: Option<i64>,
    pub unix_start: Option<i64>,
}

impl SwfLog {
    pub fn header(&self) -> SwfHeader {
        SwfHeader {
            max_nodes: self.max_nodes,
            max_procs: self.max_procs,
            unix_start: self.unix_start,
        }
    }
}

/// Reads an SWF log one job at a time, in file order, in constant memory: header lines
/// update `header` as they come; each data line is checked as [`parse_swf_with`]
/// describes. With `Order::Strict` a job out of submit-time order is an error; with
/// `Order::Sort` it is counted (see [`SwfReader::finish`]) and handed out as read.
pub struct SwfReader<R> {
    lines: Lines<R>,
    order: Order,
    pub header: SwfHeader,
    sorted: Sorted,
    last_submit: i64,
}

impl<R: BufRead> SwfReader<R> {
    pub fn new(reader: R, what: &str, order: Order) -> Self {
        Self {
            lines: Lines::new(reader, what),
            order,
            header: SwfHeader::default(),
            sorted: Sorted::default(),
            last_submit: i64::MIN,
        }
    }

    /// The next job and its file line; `None` at the end of the log.
    pub fn next_job(&mut self) -> Result<Option<(SwfJob, u64)>> {
        while self.lines.advance()? {
            if let Some(job) = self.job_of_line()? {
                return Ok(Some((job, self.lines.line)));
            }
        }
        Ok(None)
    }

    /// What the whole log held: jobs read and jobs out of order. A log without jobs is
    /// an error.
    pub fn finish(&self) -> Result<Sorted> {
        if self.sorted.records == 0 {
            return Err(self.lines.err("no job lines"));
        }
        Ok(self.sorted)
    }

    /// The job of the current line; `None` for a blank or header line.
    fn job_of_line(&mut self) -> Result<Option<SwfJob>> {
        let lines = &self.lines;
        let t = lines.buf.trim();
        if t.is_empty() {
            return Ok(None);
        }
        if let Some(h) = t.strip_prefix(';') {
            if let Some((k, v)) = h.split_once(':') {
                let v = v.trim().parse::<i64>().ok();
                match k.trim() {
                    "MaxNodes" => self.header.max_nodes = v,
                    "MaxProcs" => self.header.max_procs = v,
                    "UnixStartTime" => self.header.unix_start = v,
                    _ => {}
                }
            }
            return Ok(None);
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
        if job.submit > MAX_TIME_S || job.wait.is_some_and(|w| w > MAX_TIME_S) {
            let (k, v) = if job.submit > MAX_TIME_S {
                ("2 (submit time)", job.submit)
            } else {
                ("3 (wait time)", f[2])
            };
            return Err(lines.err(format!(
                "field {k} must be at most {MAX_TIME_S} s (100 years), found {v}"
            )));
        }
        if job.submit < self.last_submit {
            if self.order == Order::Strict {
                return Err(lines.err(format!(
                    "submit time {} is earlier than the previous job's {}: SWF jobs must be sorted by submit time",
                    job.submit, self.last_submit
                )));
            }
            self.sorted.out_of_order += 1;
        }
        self.last_submit = job.submit;
        self.sorted.records += 1;
        Ok(Some(job))
    }
}

/// Puts `a[perm[k]]` (and `b[perm[k]]`) at position k, in place, following the
/// permutation's cycles; `perm` is used up (each visited entry is marked).
fn permute<A, B>(a: &mut [A], b: &mut [B], perm: &mut [u32]) {
    const DONE: u32 = u32::MAX;
    for start in 0..perm.len() {
        if perm[start] == DONE {
            continue;
        }
        // Position `k` takes the element at `perm[k]`: walk the cycle with swaps.
        let mut k = start;
        loop {
            let src = perm[k] as usize;
            perm[k] = DONE;
            if src == start {
                break;
            }
            a.swap(k, src);
            b.swap(k, src);
            k = src;
        }
    }
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
    use crate::trace::extsort::in_memory;

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

    fn line(id: i64, submit: i64, run: i64) -> String {
        format!("{id} {submit} -1 {run} 4 -1 -1 4 100 -1 1 1 -1 1 -1 1 -1 -1\n")
    }

    /// Jobs out of submit order are sorted stably (equal submit times keep job-number
    /// order, then file order),
    /// counted (10 after 50, 10 after 50, 0 after 10: 3 jobs earlier than the one
    /// before them) and keep their file lines; `Order::Strict` refuses the log.
    #[test]
    fn unsorted_jobs_are_sorted_with_their_lines() {
        let text = format!(
            "; MaxNodes: 4\n{}{}{}{}{}",
            line(1, 50, 10),
            line(2, 10, 10),
            line(3, 50, 10),
            line(4, 10, 10),
            line(5, 0, 10)
        );
        let f = parse_swf_with(text.as_bytes(), "u.swf", Order::Sort).unwrap();
        let ids: Vec<i64> = f.log.jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids, [5, 2, 4, 1, 3]);
        assert_eq!(f.lines, [6, 3, 5, 2, 4]);
        assert_eq!(
            f.sorted,
            Sorted {
                records: 5,
                out_of_order: 3
            }
        );
        assert_eq!(
            parse_swf_with(text.as_bytes(), "u.swf", Order::Strict)
                .unwrap_err()
                .to_string(),
            "u.swf:3: submit time 10 is earlier than the previous job's 50: SWF jobs must be sorted by submit time"
        );
        // A sorted log: nothing counted, file order and lines kept.
        let s = format!("{}{}", line(1, 0, 5), line(2, 0, 5));
        let f = parse_swf_with(s.as_bytes(), "s.swf", Order::Sort).unwrap();
        assert_eq!((f.sorted.out_of_order, f.lines.clone()), (0, vec![1, 2]));
        // Ties in submit time: job number first (the log's own order), then file order.
        let t = format!(
            "{}{}{}{}",
            line(2, 5, 1),
            line(1, 5, 1),
            line(7, 0, 1),
            line(1, 5, 2)
        );
        let f = parse_swf_with(t.as_bytes(), "t.swf", Order::Sort).unwrap();
        let got: Vec<(i64, i64)> = f.log.jobs.iter().map(|j| (j.id, j.run)).collect();
        assert_eq!(got, [(7, 1), (1, 1), (1, 2), (2, 1)]);
        assert_eq!(f.lines, [3, 2, 4, 1]);
    }

    /// Sorting in runs of 3 jobs on disk hands out exactly the jobs and lines of the
    /// in-memory sort, on every pass; a log of one chunk stays in memory.
    #[test]
    fn sorting_in_runs_equals_the_in_memory_sort() {
        let mut text = String::from("; MaxNodes: 4\n; MaxProcs: 16\n; UnixStartTime: 7\n");
        for i in 0..40i64 {
            // Submit times with many ties, job numbers repeated, unknown fields.
            let (id, submit) = ((i * 7) % 11, (i * 13) % 9 * 100);
            let wait = if i % 5 == 0 { -1 } else { i };
            let procs = if i % 7 == 0 { -1 } else { i % 4 + 1 };
            let req = if i % 3 == 0 { -1 } else { 1000 + i };
            text.push_str(&format!(
                "{id} {submit} {wait} {} {procs} -1 -1 {procs} {req} -1 1 1 -1 1 -1 1 -1 -1\n",
                i - 2
            ));
            if i % 10 == 0 {
                text.push_str("; comment\n\n");
            }
        }
        let want = parse_swf_with(text.as_bytes(), "u.swf", Order::Sort).unwrap();
        assert!(want.sorted.out_of_order > 10);
        let want_jobs: Vec<(SwfJob, u64)> = want
            .log
            .jobs
            .iter()
            .cloned()
            .zip(want.lines.clone())
            .collect();
        for (chunk, runs) in [(3, 14), (40, 0), (SORT_CHUNK, 0)] {
            let got = sort_swf(text.as_bytes(), "u.swf", chunk, &in_memory).unwrap();
            assert_eq!(got.runs(), runs);
            assert_eq!((got.header, got.sorted), (want.log.header(), want.sorted));
            for _ in 0..2 {
                let jobs: Vec<(SwfJob, u64)> = got.jobs().unwrap().map(Result::unwrap).collect();
                assert_eq!(jobs, want_jobs, "chunk {chunk}");
            }
        }
        // Errors of the read are the parser's.
        let e = sort_swf("; x\n 1 0 -1 100 16\n".as_bytes(), "a.swf", 3, &in_memory)
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("a.swf:2: only 5 fields"), "{e}");
    }

    #[test]
    fn permutation_is_applied_in_place() {
        let mut a = vec!['a', 'b', 'c', 'd', 'e'];
        let mut b = vec![0, 1, 2, 3, 4];
        let mut p = vec![3, 0, 4, 1, 2];
        permute(&mut a, &mut b, &mut p);
        assert_eq!(a, ['d', 'a', 'e', 'b', 'c']);
        assert_eq!(b, [3, 0, 4, 1, 2]);
    }

    #[test]
    fn absurd_times_are_refused() {
        let e = |s: &str| parse_swf(s.as_bytes(), "a.swf").unwrap_err().to_string();
        assert_eq!(
            e(&line(1, 4_000_000_000, 5)),
            "a.swf:1: field 2 (submit time) must be at most 3155760000 s (100 years), found 4000000000"
        );
        assert_eq!(
            e("1 0 9999999999 5 4 -1 -1 4 100 -1 1 1 -1 1 -1 1 -1 -1\n"),
            "a.swf:1: field 3 (wait time) must be at most 3155760000 s (100 years), found 9999999999"
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
