//! Input parsers, pure over `BufRead`: node-event traces (`time,node,idle`), elastic job
//! files (`jobs-*.csv`) and SWF job logs. Every rejection names the line and the problem.

mod extsort;
pub mod fragments;
pub mod jobs;
pub mod swf;

use crate::error::{Error, Result};
use crate::timefmt::parse_time;
pub use extsort::{MakeScratch, Scratch};
use extsort::{Record, Sorter, Store};
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

/// One event of a node trace: a node's change, or a plan-wide reclaim forecast
/// (see [`NodeTrace::forecasts`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TraceItem {
    Change(NodeChange),
    Forecast(i64, Option<i64>),
}

impl TraceItem {
    pub fn t(&self) -> i64 {
        match self {
            TraceItem::Change(c) => c.t,
            TraceItem::Forecast(t, _) => *t,
        }
    }
}

/// A node trace read in time order, so that a replay holds only what the present needs
/// (the nodes, the scheduler's running and queued jobs), never the whole log. The
/// facts a replay needs first (nodes, initial state, window) are known up front; the
/// events come on demand, in time order, a forecast before the changes of its time.
pub trait NodeEvents {
    /// The facts known up front.
    fn head(&self) -> Head<'_>;
    /// The next event, left in place.
    fn peek(&mut self) -> Result<Option<TraceItem>>;
    /// The next event, taken.
    fn next(&mut self) -> Result<Option<TraceItem>>;

    fn names(&self) -> &[String] {
        self.head().names
    }
    fn initial_idle(&self) -> &[bool] {
        self.head().initial_idle
    }
    fn start(&self) -> i64 {
        self.head().start
    }
    /// Last time covered (the last change, or the window's end).
    fn end(&self) -> i64 {
        self.head().end
    }
}

/// What a [`NodeEvents`] stream states before its events: the nodes, their initial
/// state and the window.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    pub names: &'a [String],
    pub initial_idle: &'a [bool],
    pub start: i64,
    pub end: i64,
}

impl<T: NodeEvents + ?Sized> NodeEvents for Box<T> {
    fn head(&self) -> Head<'_> {
        (**self).head()
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        (**self).peek()
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        (**self).next()
    }
}

impl NodeTrace {
    /// Its nodes, initial state and window.
    pub fn head(&self) -> Head<'_> {
        Head {
            names: &self.names,
            initial_idle: &self.initial_idle,
            start: self.start,
            end: self.end,
        }
    }

    /// The trace's events in time order (forecasts before the changes of their time).
    pub fn events(&self) -> TraceEvents<'_> {
        TraceEvents {
            tr: self,
            ci: 0,
            fi: 0,
        }
    }

    /// Reads a stream into memory: what a stream would replay, as one trace.
    pub fn collect(ev: &mut dyn NodeEvents) -> Result<NodeTrace> {
        let mut tr = NodeTrace {
            names: ev.names().to_vec(),
            start: ev.start(),
            end: ev.end(),
            initial_idle: ev.initial_idle().to_vec(),
            changes: Vec::new(),
            forecasts: Vec::new(),
        };
        while let Some(item) = ev.next()? {
            match item {
                TraceItem::Change(c) => tr.changes.push(c),
                TraceItem::Forecast(t, f) => tr.forecasts.push((t, f)),
            }
        }
        Ok(tr)
    }
}

/// [`NodeEvents`] over a trace in memory.
pub struct TraceEvents<'a> {
    tr: &'a NodeTrace,
    ci: usize,
    fi: usize,
}

impl NodeEvents for TraceEvents<'_> {
    fn head(&self) -> Head<'_> {
        self.tr.head()
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        let c = self.tr.changes.get(self.ci);
        let f = self.tr.forecasts.get(self.fi);
        Ok(match (c, f) {
            (Some(c), Some(&(t, r))) if t <= c.t => Some(TraceItem::Forecast(t, r)),
            (Some(&c), _) => Some(TraceItem::Change(c)),
            (None, Some(&(t, r))) => Some(TraceItem::Forecast(t, r)),
            (None, None) => None,
        })
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        let item = self.peek()?;
        match item {
            Some(TraceItem::Change(_)) => self.ci += 1,
            Some(TraceItem::Forecast(..)) => self.fi += 1,
            None => {}
        }
        Ok(item)
    }
}

/// What a replay keeps of a trace: from `start` (earlier events fold into the initial
/// state; the forecast then in force carries over to `start`), up to `end` (later
/// events are dropped and the trace ends there, even past its last event), and the
/// first `node_limit` nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub node_limit: Option<usize>,
}

impl Cut {
    /// The window (start, end) and node count that a stream of window `[start, end]`
    /// on `nodes` nodes has through this cut: what [`Windowed`] states, known without
    /// reading the stream.
    pub fn window_of(&self, start: i64, end: i64, nodes: usize) -> (i64, i64, usize) {
        let (mut start, mut end) = (start, end);
        if let Some(s) = self.start.filter(|&s| s > start) {
            start = s;
            end = end.max(s);
        }
        if let Some(e) = self.end {
            end = e.max(start);
        }
        let nodes = self.node_limit.unwrap_or(usize::MAX).min(nodes);
        (start, end.max(start), nodes)
    }
}

/// A [`NodeEvents`] stream seen through a [`Cut`].
pub struct Windowed<S> {
    inner: S,
    nodes: usize,
    initial: Vec<bool>,
    start: i64,
    end: i64,
    until: i64,
    /// The forecast in force at a moved start, handed out first.
    carried: Option<TraceItem>,
}

impl<S: NodeEvents> Windowed<S> {
    pub fn new(mut inner: S, cut: Cut) -> Result<Self> {
        let (start, end, nodes) = cut.window_of(inner.start(), inner.end(), inner.names().len());
        let mut initial = inner.initial_idle().to_vec();
        let mut carried = None;
        if start > inner.start() {
            while let Some(item) = inner.peek()?.filter(|i| i.t() <= start) {
                inner.next()?;
                match item {
                    TraceItem::Change(c) => initial[c.node as usize] = c.idle,
                    TraceItem::Forecast(_, f) => carried = Some(TraceItem::Forecast(start, f)),
                }
            }
        }
        let until = cut.end.unwrap_or(i64::MAX);
        carried = carried.filter(|f| f.t() <= until);
        initial.truncate(nodes);
        Ok(Self {
            inner,
            nodes,
            initial,
            start,
            end,
            until,
            carried,
        })
    }
}

impl<S: NodeEvents> NodeEvents for Windowed<S> {
    fn head(&self) -> Head<'_> {
        Head {
            names: &self.inner.names()[..self.nodes],
            initial_idle: &self.initial,
            start: self.start,
            end: self.end,
        }
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        if self.carried.is_some() {
            return Ok(self.carried);
        }
        while let Some(item) = self.inner.peek()? {
            if item.t() > self.until {
                return Ok(None);
            }
            match item {
                TraceItem::Change(c) if c.node as usize >= self.nodes => {
                    self.inner.next()?;
                }
                _ => return Ok(Some(item)),
            }
        }
        Ok(None)
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        if let Some(c) = self.carried.take() {
            return Ok(Some(c));
        }
        let item = self.peek()?;
        if item.is_some() {
            self.inner.next()?;
        }
        Ok(item)
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
            Err(cause) => Err(Error::Read {
                what: self.what.clone(),
                line: self.line,
                cause,
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

/// How a parser treats records out of time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Sort them (stable: records of one time keep their file order) and count them.
    #[default]
    Sort,
    /// Refuse the input at the first record out of order, naming its line.
    Strict,
}

/// What a parser found about the order of an input: how many records it read and how
/// many were earlier than the record before them (0: the file was sorted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sorted {
    pub records: u64,
    pub out_of_order: u64,
}

/// Parses a node-event trace that must be sorted by time, in one streaming pass; see
/// [`parse_node_events_with`].
pub fn parse_node_events<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
) -> Result<NodeTrace> {
    parse_node_events_with(reader, what, win, Order::Strict).map(|(tr, _)| tr)
}

/// One data row of a node-event trace, as read: 16 bytes, so that sorting an unsorted
/// file costs 16 bytes per row and no copy of the text. Ordered by (t, line): the line
/// breaks ties, so that sorting keeps file order among rows of one time.
#[derive(Clone, Copy, Debug)]
struct Row {
    t: i64,
    /// File line.
    line: u32,
    /// Interned node name; the top bit is the idle flag.
    node: u32,
}

const IDLE_BIT: u32 = 1 << 31;

impl Row {
    fn id(&self) -> usize {
        (self.node & !IDLE_BIT) as usize
    }
    fn idle(&self) -> bool {
        self.node & IDLE_BIT != 0
    }
}

impl PartialEq for Row {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.line) == (o.t, o.line)
    }
}
impl Eq for Row {}
impl PartialOrd for Row {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Row {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.t, self.line).cmp(&(o.t, o.line))
    }
}

impl Record for Row {
    const SIZE: usize = 16;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.t.to_le_bytes());
        out.extend_from_slice(&self.line.to_le_bytes());
        out.extend_from_slice(&self.node.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Self {
        Row {
            t: i64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            line: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            node: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// Parses a node-event trace: header `time,node,idle`; the rows at the first timestamp
/// give every node's initial state (and define the node set, in file order); each later
/// row is a change; a change for a node missing from the first timestamp is rejected.
/// Rows out of time order are refused (`Order::Strict`: one streaming pass that stops
/// at the first row past `win.end`) or sorted and counted (`Order::Sort`: the rows are
/// read into 16 bytes each, time, line, node and state, and sorted in place by time
/// and line, so rows of one time keep their file order).
pub fn parse_node_events_with<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
    order: Order,
) -> Result<(NodeTrace, Sorted)> {
    if order == Order::Strict {
        return Ok(
            stream(reader, what, win, true, true)?.expect("strict streaming refuses disorder")
        );
    }
    let mut rows: Vec<Row> = Vec::new();
    let (interned, sorted, last_line) = read_unsorted(reader, what, |r| {
        rows.push(r);
        Ok(())
    })?;
    if sorted.out_of_order > 0 {
        rows.sort_unstable_by_key(|r| (r.t, r.line));
    }
    let mut b = Builder::new(what, win);
    for r in &rows {
        if !b.push_keep(r.t, &interned[r.id()], r.idle(), u64::from(r.line), true)? {
            break;
        }
    }
    Ok((b.finish(last_line)?, sorted))
}

/// Reads the rows of a trace that may be out of time order into [`Row`]s, handed to
/// `push` in file order. Returns the node names by interned id, what was out of order,
/// and the last line read.
fn read_unsorted<R: BufRead>(
    reader: R,
    what: &str,
    mut push: impl FnMut(Row) -> Result<()>,
) -> Result<(Vec<String>, Sorted, u64)> {
    let mut intern: HashMap<String, u32> = HashMap::new();
    let mut interned: Vec<String> = Vec::new();
    let mut sorted = Sorted::default();
    let mut prev_t = i64::MIN;
    let last_line = read_rows(reader, what, |lines, t, node, st| {
        if t < prev_t {
            sorted.out_of_order += 1;
        }
        prev_t = t;
        let id = match intern.get(node) {
            Some(&id) => id,
            None => {
                let id = interned.len() as u32;
                if id >= IDLE_BIT {
                    return Err(lines.err("more than 2^31 distinct node names"));
                }
                intern.insert(node.to_string(), id);
                interned.push(node.to_string());
                id
            }
        };
        let line = u32::try_from(lines.line)
            .map_err(|_| lines.err("more than 4,294,967,295 lines: split the trace"))?;
        push(Row {
            t,
            line,
            node: id | if st { IDLE_BIT } else { 0 },
        })?;
        sorted.records += 1;
        Ok(true)
    })?;
    Ok((interned, sorted, last_line))
}

/// Rows sorted in memory at once by [`sort_node_events`]: 4 MiB of 16-byte rows per run.
pub const SORT_CHUNK_ROWS: usize = 1 << 18;

/// A node-event trace out of time order, sorted in bounded memory by
/// [`sort_node_events`]: its head (nodes, initial state, window, no changes) and its
/// rows, held or in sorted runs on disk; [`SortedTrace::events`] reads the changes.
pub struct SortedTrace {
    what: String,
    win: TraceWindow,
    /// Node names by interned id (file order of first appearance).
    interned: Vec<String>,
    rows: Store<Row>,
    head: NodeTrace,
}

/// Reads a node-event trace whose rows may be out of time order and sorts them as
/// [`parse_node_events_with`] (`Order::Sort`) does, by time and then file line, in
/// bounded memory: `chunk` rows at a time are sorted, and when the file holds more than
/// one chunk each is written as a sorted run to the scratch space `make` gives (the
/// replay's: an anonymous temporary file), 16 bytes a row. Only the node names stay in memory. A first pass over the sorted
/// rows checks them and finds the head (as [`scan_node_events`] does for a sorted file);
/// errors name each row's own file line.
pub fn sort_node_events<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
    chunk: usize,
    make: MakeScratch<'_>,
) -> Result<(SortedTrace, Sorted)> {
    let mut sorter = Sorter::new(what, chunk, make);
    let (interned, sorted, last_line) = read_unsorted(reader, what, |r| sorter.push(r))?;
    let rows = sorter.finish()?;
    let mut b = Builder::new(what, win);
    for r in rows.iter()? {
        let r = r?;
        if !b.push_keep(r.t, &interned[r.id()], r.idle(), u64::from(r.line), false)? {
            break;
        }
    }
    let head = b.finish(last_line)?;
    let tr = SortedTrace {
        what: what.to_string(),
        win: win.clone(),
        interned,
        rows,
        head,
    };
    Ok((tr, sorted))
}

impl SortedTrace {
    /// Nodes, initial state and window, with no changes.
    pub fn head(&self) -> &NodeTrace {
        &self.head
    }

    /// Sorted runs on disk; 0 when the rows fitted in one chunk and are held.
    pub fn runs(&self) -> usize {
        self.rows.runs()
    }

    /// The trace's changes, merged from the sorted rows as the replay asks for them.
    pub fn events(&self) -> Result<SortedEvents<'_>> {
        Ok(SortedEvents {
            rows: MergedRows {
                tr: self,
                rows: self.rows.iter()?,
                node: 0,
            },
            changes: Changes::new(Builder::new(&self.what, &self.win)),
        })
    }
}

/// [`NodeEvents`] over a [`SortedTrace`].
pub struct SortedEvents<'a> {
    rows: MergedRows<'a>,
    changes: Changes,
}

/// The rows of a [`SortedTrace`], merged in order.
struct MergedRows<'a> {
    tr: &'a SortedTrace,
    rows: extsort::Iter<'a, Row>,
    /// The last row's node.
    node: usize,
}

impl RowSource for MergedRows<'_> {
    fn next_row(&mut self) -> Result<Option<(i64, bool, u64)>> {
        let Some(r) = self.rows.next().transpose()? else {
            return Ok(None);
        };
        self.node = r.id();
        Ok(Some((r.t, r.idle(), u64::from(r.line))))
    }
    fn node(&self) -> &str {
        &self.tr.interned[self.node]
    }
}

impl NodeEvents for SortedEvents<'_> {
    fn head(&self) -> Head<'_> {
        self.rows.tr.head.head()
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        self.changes.peek(&mut self.rows)
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.changes.next(&mut self.rows)
    }
}

/// Rows in time order, one at a time: (time, idle, file line), and the row's node.
trait RowSource {
    fn next_row(&mut self) -> Result<Option<(i64, bool, u64)>>;
    fn node(&self) -> &str;
}

/// The changes that rows in time order make, built one ahead of the reader.
struct Changes {
    b: Builder,
    next: Option<NodeChange>,
    done: bool,
}

impl Changes {
    fn new(b: Builder) -> Self {
        Self {
            b,
            next: None,
            done: false,
        }
    }

    fn peek(&mut self, rows: &mut impl RowSource) -> Result<Option<TraceItem>> {
        while self.next.is_none() && !self.done {
            let Some((t, st, line)) = rows.next_row()? else {
                self.done = true;
                break;
            };
            match self.b.push(t, rows.node(), st, line)? {
                Push::Next => {}
                Push::Change(c) => self.next = Some(c),
                Push::Past => self.done = true,
            }
        }
        Ok(self.next.map(TraceItem::Change))
    }

    fn next(&mut self, rows: &mut impl RowSource) -> Result<Option<TraceItem>> {
        let item = self.peek(rows)?;
        self.next = None;
        Ok(item)
    }
}

/// Reads the data rows of a node-event trace one at a time, checking the header (when
/// made) and each row's format.
struct RowReader<R> {
    lines: Lines<R>,
    /// The last timestamp's text and value: rows come in groups sharing one timestamp.
    cached_ts: String,
    cached_t: i64,
}

impl<R: BufRead> RowReader<R> {
    fn new(reader: R, what: &str) -> Result<Self> {
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
        Ok(Self {
            lines,
            cached_ts: String::new(),
            cached_t: i64::MIN,
        })
    }

    /// The next row: its time, idle flag and where its node name lies in `lines.buf`.
    fn next(&mut self) -> Result<Option<(i64, bool, std::ops::Range<usize>)>> {
        let lines = &mut self.lines;
        while lines.advance()? {
            let line = lines.buf.as_str();
            if line.trim().is_empty() {
                continue;
            }
            let mut it = line.split(',');
            let (Some(ts), Some(node), Some(flag), None) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                let n = line.split(',').count();
                return Err(lines.err(format!(
                    "expected 3 comma-separated fields time,node,idle, found {n}"
                )));
            };
            let t = if ts == self.cached_ts {
                self.cached_t
            } else {
                let t = parse_time(ts).map_err(|m| lines.err(m))?;
                self.cached_ts.clear();
                self.cached_ts.push_str(ts);
                self.cached_t = t;
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
            let from = ts.len() + 1;
            return Ok(Some((t, st, from..from + node.len())));
        }
        Ok(None)
    }
}

/// Reads the data rows of a node-event trace, checking the header and each row's
/// format, and hands each to `row(lines, time, node, idle)` until it returns false.
/// Returns the last line number read.
fn read_rows<R: BufRead>(
    reader: R,
    what: &str,
    mut row: impl FnMut(&Lines<R>, i64, &str, bool) -> Result<bool>,
) -> Result<u64> {
    let mut rows = RowReader::new(reader, what)?;
    while let Some((t, st, node)) = rows.next()? {
        if !row(&rows.lines, t, &rows.lines.buf[node], st)? {
            break;
        }
    }
    Ok(rows.lines.line)
}

/// One pass over a trace in file order. `strict`: a row out of order is an error and
/// reading stops after the first row past the window's end. Otherwise (the first pass
/// of `Order::Sort`) the whole file is read and `None` returned at the first row out
/// of order. `keep`: the trace holds its changes; else only its nodes, initial state
/// and window (what a later streaming read needs up front).
fn stream<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
    strict: bool,
    keep: bool,
) -> Result<Option<(NodeTrace, Sorted)>> {
    let mut b = Builder::new(what, win);
    let (mut prev_t, mut records, mut unsorted, mut open) = (i64::MIN, 0u64, false, true);
    let last_line = read_rows(reader, what, |lines, t, node, st| {
        if t < prev_t {
            if strict {
                return Err(lines.err(format!(
                    "time {} is earlier than the previous row's {}: rows must be sorted by time",
                    lines.buf.split(',').next().unwrap_or_default(),
                    crate::timefmt::format_time(prev_t)
                )));
            }
            unsorted = true;
            return Ok(false);
        }
        prev_t = t;
        records += 1;
        if open {
            open = b.push_keep(t, node, st, lines.line, keep)?;
        }
        // A sorted file needs nothing past the window's end; the first pass of a sort
        // reads on, to see whether it is sorted.
        Ok(open || !strict)
    })?;
    if unsorted {
        return Ok(None);
    }
    let sorted = Sorted {
        records,
        out_of_order: 0,
    };
    Ok(Some((b.finish(last_line)?, sorted)))
}

/// The first pass of a streaming read: checks the whole trace (to the window's end
/// under `Order::Strict`) and returns its nodes, initial state and window with no
/// changes, in memory of the order of its nodes. `None`: the rows are out of time
/// order (`Order::Sort`); read the file with [`sort_node_events`] instead.
pub fn scan_node_events<R: BufRead>(
    reader: R,
    what: &str,
    win: &TraceWindow,
    order: Order,
) -> Result<Option<(NodeTrace, Sorted)>> {
    stream(reader, what, win, order == Order::Strict, false)
}

/// The changes of a sorted node-event trace, read from the file as the replay asks for
/// them: the second pass after [`scan_node_events`], whose trace is `head`.
pub struct CsvEvents<R> {
    head: NodeTrace,
    rows: FileRows<R>,
    changes: Changes,
}

/// The rows of a sorted file, read again: a row out of order means the file changed.
struct FileRows<R> {
    rows: RowReader<R>,
    node: std::ops::Range<usize>,
    prev_t: i64,
}

impl<R: BufRead> RowSource for FileRows<R> {
    fn next_row(&mut self) -> Result<Option<(i64, bool, u64)>> {
        let Some((t, st, node)) = self.rows.next()? else {
            return Ok(None);
        };
        if t < self.prev_t {
            return Err(self.rows.lines.err(
                "rows out of time order on the second read: the file changed during the replay",
            ));
        }
        self.prev_t = t;
        self.node = node;
        Ok(Some((t, st, self.rows.lines.line)))
    }
    fn node(&self) -> &str {
        &self.rows.lines.buf[self.node.clone()]
    }
}

impl<R: BufRead> CsvEvents<R> {
    pub fn new(reader: R, what: &str, win: &TraceWindow, head: NodeTrace) -> Result<Self> {
        Ok(Self {
            head,
            rows: FileRows {
                rows: RowReader::new(reader, what)?,
                node: 0..0,
                prev_t: i64::MIN,
            },
            changes: Changes::new(Builder::new(what, win)),
        })
    }
}

impl<R: BufRead> NodeEvents for CsvEvents<R> {
    fn head(&self) -> Head<'_> {
        self.head.head()
    }
    fn peek(&mut self) -> Result<Option<TraceItem>> {
        self.changes.peek(&mut self.rows)
    }
    fn next(&mut self) -> Result<Option<TraceItem>> {
        self.changes.next(&mut self.rows)
    }
}

/// What a row did to the trace being built.
enum Push {
    /// Nothing to hand on (initial state, before the window, a node left out).
    Next,
    Change(NodeChange),
    /// The row is past the window's end: the trace is complete.
    Past,
}

/// Builds a `NodeTrace` from rows in time order: the initial state, the window, the
/// node limit.
struct Builder {
    what: String,
    win: TraceWindow,
    first: Option<i64>,
    index: HashMap<String, u32>,
    names: Vec<String>,
    idle: Vec<bool>,
    changes: Vec<NodeChange>,
    in_initial: bool,
    start_applied: bool,
    initial_at_start: Vec<bool>,
    last_seen: i64,
}

impl Builder {
    fn new(what: &str, win: &TraceWindow) -> Self {
        Self {
            what: what.to_string(),
            win: win.clone(),
            first: None,
            index: HashMap::new(),
            names: Vec::new(),
            idle: Vec::new(),
            changes: Vec::new(),
            in_initial: true,
            start_applied: false,
            initial_at_start: Vec::new(),
            last_seen: i64::MIN,
        }
    }

    fn err(&self, line: u64, msg: String) -> Error {
        Error::Parse {
            what: self.what.clone(),
            line,
            msg,
        }
    }

    /// Takes the next row, keeping its change (`keep`); false once past the window's
    /// end (the row is not used).
    fn push_keep(&mut self, t: i64, node: &str, st: bool, line: u64, keep: bool) -> Result<bool> {
        match self.push(t, node, st, line)? {
            Push::Next => Ok(true),
            Push::Change(c) => {
                if keep {
                    self.changes.push(c);
                }
                Ok(true)
            }
            Push::Past => Ok(false),
        }
    }

    /// Takes the next row.
    fn push(&mut self, t: i64, node: &str, st: bool, line: u64) -> Result<Push> {
        let first = *self.first.get_or_insert(t);
        if self.in_initial && t != first {
            self.in_initial = false;
        }
        if self.in_initial {
            if self.index.contains_key(node) {
                return Err(self.err(
                    line,
                    format!("node {node} appears twice in the initial state"),
                ));
            }
            self.index.insert(node.to_string(), self.names.len() as u32);
            self.names.push(node.to_string());
            self.idle.push(st);
            return Ok(Push::Next);
        }
        let Some(&n) = self.index.get(node) else {
            return Err(self.err(
                line,
                format!(
                    "unknown node {node}: every node must appear in the initial state at the first timestamp"
                ),
            ));
        };
        if let Some(end) = self.win.end {
            if t > end {
                self.last_seen = end;
                return Ok(Push::Past);
            }
        }
        self.last_seen = t;
        if (n as usize) >= self.win.node_limit.unwrap_or(usize::MAX) {
            return Ok(Push::Next);
        }
        match self.win.start {
            Some(s) if t <= s => {
                self.idle[n as usize] = st;
                Ok(Push::Next)
            }
            _ => {
                if !self.start_applied {
                    self.start_applied = true;
                    self.initial_at_start = self.idle.clone();
                }
                Ok(Push::Change(NodeChange {
                    t,
                    node: n,
                    idle: st,
                    reclaim_at: None,
                }))
            }
        }
    }

    /// The trace; `last_line` is where the input ended (for "no rows").
    fn finish(self, last_line: u64) -> Result<NodeTrace> {
        let Some(first) = self.first else {
            return Err(self.err(last_line, "no rows after the header".into()));
        };
        let mut initial = if self.start_applied {
            self.initial_at_start
        } else {
            self.idle
        };
        let mut names = self.names;
        let n = names.len().min(self.win.node_limit.unwrap_or(usize::MAX));
        names.truncate(n);
        initial.truncate(n);
        let start = self.win.start;
        let t0 = start.unwrap_or(first).max(first);
        if let Some(s) = start {
            if self.last_seen != i64::MIN && s > self.last_seen {
                return Err(Error::Config(format!(
                    "--start {} is after the trace's last event at {}",
                    crate::timefmt::format_time(s),
                    crate::timefmt::format_time(self.last_seen)
                )));
            }
        }
        let end = self.win.end.unwrap_or(self.last_seen.max(t0)).max(t0);
        Ok(NodeTrace {
            names,
            start: t0,
            end,
            initial_idle: initial,
            changes: self.changes,
            forecasts: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use extsort::in_memory;

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

    /// Rows out of time order are sorted, counted, and rows of one time keep their file
    /// order; the result equals the sorted file's. `Order::Strict` refuses the file.
    #[test]
    fn unsorted_rows_are_sorted_stably_and_counted() {
        let sorted = "time,node,idle\n\
            0,a,0\n0,b,1\n0,c,0\n10,a,1\n10,a,0\n10,c,1\n20,b,0\n30,a,1\n";
        // Same rows, shuffled: 10,a,1 still before 10,a,0 (file order among equal times).
        let shuffled = "time,node,idle\n\
            10,a,1\n0,a,0\n30,a,1\n0,b,1\n10,a,0\n20,b,0\n0,c,0\n10,c,1\n";
        let w = TraceWindow::default();
        let (a, sa) = parse_node_events_with(sorted.as_bytes(), "s", &w, Order::Sort).unwrap();
        let (b, sb) = parse_node_events_with(shuffled.as_bytes(), "u", &w, Order::Sort).unwrap();
        assert_eq!(
            sa,
            Sorted {
                records: 8,
                out_of_order: 0
            }
        );
        // Earlier than the row before them: 0,a (after 10), 0,b (after 30), 0,c (after 20).
        assert_eq!(
            sb,
            Sorted {
                records: 8,
                out_of_order: 3
            }
        );
        assert_eq!(a, b);
        // a goes idle then busy at 10, in file order: the last change at 10 is busy.
        assert_eq!(
            b.changes[..2].iter().map(|c| c.idle).collect::<Vec<_>>(),
            [true, false]
        );
        let e = parse_node_events_with(shuffled.as_bytes(), "u.csv", &w, Order::Strict)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "u.csv:3: time 0 is earlier than the previous row's 1970-01-01T00:00:10: rows must be sorted by time"
        );
        // Errors found after sorting name the row's own line.
        let bad = "time,node,idle\n5,zz,1\n0,a,0\n";
        assert_eq!(
            parse_node_events_with(bad.as_bytes(), "b.csv", &w, Order::Sort)
                .unwrap_err()
                .to_string(),
            "b.csv:2: unknown node zz: every node must appear in the initial state at the first timestamp"
        );
        // A window cuts the sorted rows, wherever they were in the file.
        let win = TraceWindow {
            end: Some(15),
            ..Default::default()
        };
        let (c, _) = parse_node_events_with(shuffled.as_bytes(), "u", &win, Order::Sort).unwrap();
        assert_eq!((c.changes.len(), c.end), (3, 15));
        // The streaming first pass: the sorted file's nodes and window; the unsorted one
        // is handed back for sorting, even with a window that ends before its first row
        // out of order would matter.
        let (d, sd) = scan_node_events(sorted.as_bytes(), "s", &w, Order::Sort)
            .unwrap()
            .unwrap();
        assert_eq!(
            (d.start, d.end, &d.initial_idle, sd),
            (a.start, a.end, &a.initial_idle, sa)
        );
        let late = "time,node,idle\n0,a,0\n10,a,1\n30,a,0\n20,a,1\n";
        assert!(scan_node_events(late.as_bytes(), "l", &win, Order::Sort)
            .unwrap()
            .is_none());
        // With --strict the file is read only to the window's end: the row out of order
        // after it is not seen (as before sorting existed).
        let (e, _) = parse_node_events_with(late.as_bytes(), "l", &win, Order::Strict).unwrap();
        assert_eq!(e.changes.len(), 1);
    }

    /// Sorting in runs of 3 rows on disk gives the in-memory sort's trace under every
    /// window (start inside, end, node limit), on every pass, with the same counts;
    /// errors found after sorting still name the row's own file line.
    #[test]
    fn sorting_in_runs_equals_the_in_memory_sort() {
        // 5 nodes, 60 changes with ties in time, then shuffled by a fixed permutation.
        let mut rows: Vec<String> = (0..5).map(|n| format!("0,n{n},{}", n % 2)).collect();
        for i in 0..60 {
            rows.push(format!(
                "{},n{},{}",
                10 * (1 + i / 4),
                (i * 3) % 5,
                (i / 3) % 2
            ));
        }
        let k = rows.len();
        let shuffled: Vec<&str> = (0..k).map(|i| rows[(i * 37) % k].as_str()).collect();
        let text = format!("time,node,idle\n{}\n", shuffled.join("\n"));
        let wins = [
            TraceWindow::default(),
            TraceWindow {
                start: Some(55),
                end: Some(120),
                node_limit: Some(3),
            },
            TraceWindow {
                start: Some(30),
                end: None,
                node_limit: None,
            },
            TraceWindow {
                start: None,
                end: Some(1000),
                node_limit: Some(1),
            },
        ];
        for win in wins {
            let (want, sw) =
                parse_node_events_with(text.as_bytes(), "u", &win, Order::Sort).unwrap();
            assert!(sw.out_of_order > 10);
            for (chunk, runs) in [(3, 22), (k, 0)] {
                let (tr, sorted) =
                    sort_node_events(text.as_bytes(), "u", &win, chunk, &in_memory).unwrap();
                assert_eq!((tr.runs(), sorted), (runs, sw));
                let head = NodeTrace {
                    changes: Vec::new(),
                    ..want.clone()
                };
                assert_eq!(tr.head(), &head);
                for _ in 0..2 {
                    let got = NodeTrace::collect(&mut tr.events().unwrap()).unwrap();
                    assert_eq!(got, want, "{win:?} chunk {chunk}");
                }
            }
        }
        // An unknown node, sorted to the front of the changes from the file's end.
        let bad = "time,node,idle\n9,a,1\n0,a,0\n0,b,1\n7,b,0\n8,a,0\n5,zz,1\n";
        let w = TraceWindow::default();
        let e = sort_node_events(bad.as_bytes(), "b.csv", &w, 2, &in_memory)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "b.csv:7: unknown node zz: every node must appear in the initial state at the first timestamp"
        );
        let twice = "time,node,idle\n9,a,1\n0,a,0\n0,b,1\n7,b,0\n0,a,0\n";
        let e = sort_node_events(twice.as_bytes(), "t.csv", &w, 2, &in_memory)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "t.csv:6: node a appears twice in the initial state"
        );
        let late = TraceWindow {
            start: Some(50),
            ..TraceWindow::default()
        };
        let e = sort_node_events(twice.as_bytes(), "t.csv", &late, 2, &in_memory)
            .err()
            .unwrap();
        assert!(e.to_string().contains("appears twice"), "{e}");
        let ok = "time,node,idle\n9,a,1\n0,a,0\n0,b,1\n7,b,0\n";
        let e = sort_node_events(ok.as_bytes(), "t.csv", &late, 2, &in_memory)
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("invalid setting: --start"), "{e}");
    }

    /// The second, streaming read of a sorted file hands out exactly the changes the
    /// in-memory parser keeps, under every window; the first pass keeps none.
    #[test]
    fn streamed_csv_equals_the_parsed_trace() {
        let text = "time,node,idle\n\
            0,a,0\n0,b,1\n0,c,0\n10,a,1\n10,c,1\n20,b,0\n30,a,0\n30,c,0\n40,b,1\n";
        let wins = [
            TraceWindow::default(),
            TraceWindow {
                start: Some(15),
                end: Some(30),
                node_limit: Some(2),
            },
            TraceWindow {
                start: Some(10),
                end: None,
                node_limit: None,
            },
        ];
        for win in wins {
            let want = parse_node_events(text.as_bytes(), "t", &win).unwrap();
            for order in [Order::Sort, Order::Strict] {
                let (head, sorted) = scan_node_events(text.as_bytes(), "t", &win, order)
                    .unwrap()
                    .unwrap();
                assert!(head.changes.is_empty());
                assert_eq!(sorted.out_of_order, 0);
                let mut ev = CsvEvents::new(text.as_bytes(), "t", &win, head).unwrap();
                assert_eq!(NodeTrace::collect(&mut ev).unwrap(), want, "{win:?}");
            }
        }
        // An unsorted file is handed back to be sorted in memory.
        let late = "time,node,idle\n0,a,0\n10,a,1\n5,a,0\n";
        let w = TraceWindow::default();
        assert!(scan_node_events(late.as_bytes(), "l", &w, Order::Sort)
            .unwrap()
            .is_none());
        // A file that changed between the passes is refused, not replayed wrong.
        let (head, _) = scan_node_events(text.as_bytes(), "t", &w, Order::Sort)
            .unwrap()
            .unwrap();
        let mut ev = CsvEvents::new(late.as_bytes(), "t.csv", &w, head).unwrap();
        let e = NodeTrace::collect(&mut ev).unwrap_err().to_string();
        assert!(
            e.starts_with("t.csv:4: rows out of time order on the second read"),
            "{e}"
        );
    }

    /// A cut of a stream equals the same cut made on the trace in memory: earlier
    /// changes fold into the initial state, the forecast in force moves to the new
    /// start, later events go, and nodes past the limit drop out.
    #[test]
    fn windowed_stream_cuts_as_in_memory() {
        let ch = |t, node, idle| NodeChange {
            t,
            node,
            idle,
            reclaim_at: None,
        };
        let tr = NodeTrace {
            names: vec!["a".into(), "b".into(), "c".into()],
            start: 0,
            end: 100,
            initial_idle: vec![true, true, true],
            changes: vec![
                ch(0, 0, false),
                ch(10, 1, false),
                ch(20, 2, false),
                ch(30, 0, true),
                ch(50, 2, true),
                ch(70, 1, true),
            ],
            forecasts: vec![(0, Some(40)), (20, Some(90)), (60, None)],
        };
        // Items in time order, a forecast before the changes of its time.
        let all = NodeTrace::collect(&mut tr.events()).unwrap();
        assert_eq!(all, tr);
        let mut ev = tr.events();
        assert_eq!(ev.next().unwrap(), Some(TraceItem::Forecast(0, Some(40))));
        assert_eq!(ev.next().unwrap(), Some(TraceItem::Change(ch(0, 0, false))));
        let cut = Cut {
            start: Some(25),
            end: Some(60),
            node_limit: Some(2),
        };
        let got = NodeTrace::collect(&mut Windowed::new(tr.events(), cut).unwrap()).unwrap();
        assert_eq!(
            got,
            NodeTrace {
                names: vec!["a".into(), "b".into()],
                start: 25,
                end: 60,
                initial_idle: vec![false, false],
                changes: vec![ch(30, 0, true)],
                forecasts: vec![(25, Some(90)), (60, None)],
            }
        );
        // An end past the trace's extends it; a start before it changes nothing.
        let cut = Cut {
            start: Some(-5),
            end: Some(500),
            node_limit: None,
        };
        let got = NodeTrace::collect(&mut Windowed::new(tr.events(), cut).unwrap()).unwrap();
        assert_eq!(
            got,
            NodeTrace {
                end: 500,
                ..tr.clone()
            }
        );
        // A start past the end: an empty window at the start.
        let cut = Cut {
            start: Some(200),
            ..Cut::default()
        };
        let w = Windowed::new(tr.events(), cut).unwrap();
        assert_eq!(
            (w.start(), w.end(), w.initial_idle()),
            (200, 200, &[true; 3][..])
        );
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
