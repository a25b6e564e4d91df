//! Prometheus metrics (`[metrics] listen`): gauges and counters read from the last
//! published snapshot at scrape time, latency histograms fed by the main loop, all
//! encoded by prometheus-client; served over plain HTTP/1.x on GET /metrics.
//! conf/bftrainer-alerts.yml holds sample alerting rules over these series.

use super::view::Snapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Largest request head accepted, bytes.
const MAX_HEAD: usize = 8 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_CLIENTS: usize = 64;
/// Latency buckets: 0.1 ms doubling to ~105 s. A poll against a slow slurmctld takes
/// a MessageTimeout (10 s by default) per call, several calls per poll; buckets that
/// stopped at 3.3 s put every slow poll in +Inf and the p99 out of sight.
const BUCKET_START_S: f64 = 0.0001;
const BUCKETS: u16 = 21;

/// The registry and the histograms the main loop observes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub poll_seconds: Histogram,
    pub decision_seconds: Histogram,
}

impl Metrics {
    /// Metrics without `bftrainer_journal_bytes` (see [`Metrics::with_journal`]).
    pub fn new(snapshot: watch::Receiver<Arc<Snapshot>>) -> Metrics {
        Metrics::with_journal(snapshot, None)
    }

    /// As [`Metrics::new`], also reporting the size of `journal`
    /// (`state_dir/journal.jsonl`), read from the file system at each scrape.
    pub fn with_journal(
        snapshot: watch::Receiver<Arc<Snapshot>>,
        journal: Option<PathBuf>,
    ) -> Metrics {
        let mut registry = Registry::with_prefix("bftrainer");
        let poll_seconds = Histogram::new(exponential_buckets(BUCKET_START_S, 2.0, BUCKETS));
        let decision_seconds = Histogram::new(exponential_buckets(BUCKET_START_S, 2.0, BUCKETS));
        registry.register_with_unit(
            "poll",
            "Time to read Slurm's nodes, partitions and jobs, per cycle",
            Unit::Seconds,
            poll_seconds.clone(),
        );
        registry.register_with_unit(
            "decision",
            "Time to turn a snapshot into events and decide (engine), per cycle",
            Unit::Seconds,
            decision_seconds.clone(),
        );
        registry.register_collector(Box::new(SnapshotCollector { snapshot, journal }));
        Metrics {
            registry,
            poll_seconds,
            decision_seconds,
        }
    }

    /// The exposition text (Prometheus/OpenMetrics text format).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            log::warn!("metrics: encoding failed: {e}");
        }
        out
    }
}

/// Reads the last snapshot, and the journal's size, at each scrape.
#[derive(Debug)]
struct SnapshotCollector {
    snapshot: watch::Receiver<Arc<Snapshot>>,
    journal: Option<PathBuf>,
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, f64)],
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(0.0f64);
    let mut fam = e.encode_descriptor(name, help, None, g.metric_type())?;
    for &(l, v) in values {
        let labels = [(label, l)];
        ConstGauge::new(v).encode(fam.encode_family(&labels)?)?;
    }
    Ok(())
}

fn single_gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit, g.metric_type())?)
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit, c.metric_type())?)
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.snapshot.borrow().clone();
        let c = &s.counts;
        gauge(
            &mut e,
            "nodes",
            "Nodes of the elastic partitions by state: idle (open to elastic jobs), lent, reserved (idle but kept for regular jobs), busy (regular jobs), unavailable",
            "state",
            &[
                ("idle", f64::from(c.idle)),
                ("lent", f64::from(c.lent)),
                ("reserved", f64::from(c.reserved)),
                ("busy", f64::from(c.busy)),
                ("unavailable", f64::from(c.unavailable)),
            ],
        )?;
        let j = &s.jobs_by_state;
        gauge(
            &mut e,
            "elastic_jobs",
            "Elastic jobs by state",
            "state",
            &[
                ("pending", f64::from(j.pending)),
                ("running", f64::from(j.running)),
                ("waiting", f64::from(j.waiting)),
                ("finished", f64::from(j.finished)),
                ("cancelled", f64::from(j.cancelled)),
            ],
        )?;
        gauge(
            &mut e,
            "lending",
            "1 for the current lending mode (bftrainer pause|drain|resume)",
            "mode",
            &[
                ("open", f64::from(u8::from(s.lending == "open"))),
                ("paused", f64::from(u8::from(s.lending == "paused"))),
                ("drained", f64::from(u8::from(s.lending == "drained"))),
            ],
        )?;
        single_gauge(
            &mut e,
            "partitions_ok",
            "0 while slurmctld's partitions break a check (tiers, PreemptMode, existence): nothing new is lent",
            None,
            f64::from(u8::from(s.partition_fault.is_none())),
        )?;
        single_gauge(
            &mut e,
            "slurm_up",
            "1 while slurmctld answers",
            None,
            f64::from(u8::from(s.slurm_reachable)),
        )?;
        // Counted from the node list: a set-aside node is also in nodes{state=...}.
        let aside = s
            .nodes
            .iter()
            .filter(|n| n.set_aside.as_ref().is_some_and(|a| a.until > s.time))
            .count();
        single_gauge(
            &mut e,
            "nodes_set_aside",
            "Nodes set aside now after satellites of several users failed there (bftrainer nodes shows why and until when)",
            None,
            aside as f64,
        )?;
        let paused = s
            .jobs
            .iter()
            .filter(|j| j.paused_until.is_some_and(|t| t > s.time))
            .count();
        single_gauge(
            &mut e,
            "jobs_paused",
            "Elastic jobs whose growth is paused now after failures of their own",
            None,
            paused as f64,
        )?;
        single_gauge(
            &mut e,
            "started",
            "When this bftrainerd started (Unix time)",
            Some(&Unit::Seconds),
            s.started_at,
        )?;
        single_gauge(
            &mut e,
            "snapshot_time",
            "When the last cycle published its state (Unix time); stale while a cycle is stuck",
            Some(&Unit::Seconds),
            s.time,
        )?;
        if let Some(path) = &self.journal {
            // Absent (not 0) when it cannot be read: no false "the journal is small".
            if let Ok(m) = std::fs::metadata(path) {
                single_gauge(
                    &mut e,
                    "journal",
                    "Size of state_dir/journal.jsonl",
                    Some(&Unit::Bytes),
                    m.len() as f64,
                )?;
            }
        }
        let st = &s.stats;
        for (name, help, v) in [
            ("admits", "Elastic jobs admitted onto nodes", st.admits),
            (
                "grows",
                "Satellites submitted to grow elastic jobs",
                st.grows,
            ),
            ("shrinks", "Satellites shrunk off elastic jobs", st.shrinks),
            ("requeues", "Core jobs requeued", st.requeues),
            (
                "preemptions",
                "Elastic jobs' nodes taken by regular jobs",
                st.preemptions,
            ),
            (
                "slurm_errors",
                "Slurm calls that failed, and polls slurmctld did not answer",
                st.slurm_errors,
            ),
            ("cycles", "Poll cycles run", st.cycles),
            (
                "satellite_failures",
                "Growths that failed: satellites Slurm refused, that timed out pending or that ended early",
                st.satellite_failures,
            ),
            (
                "job_pauses",
                "Times an elastic job's growth was paused after failures of its own",
                st.job_pauses,
            ),
            (
                "not_adopted",
                "Jobs carrying a bftrainer tag that bftrainerd refused to manage (logged once each)",
                st.not_adopted,
            ),
            (
                "released_cores",
                "Elastic jobs released to Slurm (tag off, bftrainerd's hold lifted) after leaving the elastic partitions",
                st.released,
            ),
            (
                "deferred_calls",
                "Lending calls left for the next cycle when a cycle ran over cycle_budget",
                st.deferred_calls,
            ),
            (
                "limit_pauses",
                "Elastic jobs paused and shrunk to their cores for a regular job waiting on a limit their satellites count against",
                st.limit_pauses,
            ),
            (
                "cluster_refusals",
                "Satellites Slurm refused for reasons of the whole cluster (charged to no job; growth held)",
                st.cluster_refusals,
            ),
            (
                "progress_deferred",
                "Changes of a job's published rate or size (its Comment) left for later by the rate limit",
                st.progress_deferred,
            ),
            (
                "journal_skipped",
                "Journal records skipped at start-up (damaged, unknown or refused by the engine)",
                st.journal_skipped,
            ),
            (
                "refused_decisions",
                "Engine decisions refused (an allocator or contract error), logged and skipped",
                st.refused_decisions,
            ),
        ] {
            counter(&mut e, name, help, None, v as f64)?;
        }
        counter(
            &mut e,
            "harvested_node",
            "Node-seconds elastic jobs held, since the journal began",
            Some(&Unit::Seconds),
            s.node_seconds_harvested,
        )?;
        Ok(())
    }
}

/// Serves `GET /metrics` on `addr` until the listener fails.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                log::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue; // dropped: too many scrapers at once
        };
        let m = metrics.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(IO_TIMEOUT * 2, http(stream, &m)).await;
            drop(permit);
        });
    }
}

async fn http(mut stream: TcpStream, m: &Metrics) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = tokio::time::timeout(IO_TIMEOUT, stream.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head too large\n",
            )
            .await;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = m.encode();
            reply(
                &mut stream,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                &body,
            )
            .await
        }
        ("GET", "/") => {
            reply(
                &mut stream,
                "200 OK",
                "text/plain",
                "bftrainerd: metrics at /metrics\n",
            )
            .await
        }
        ("GET", _) => {
            reply(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "not found; metrics are at /metrics\n",
            )
            .await
        }
        _ => {
            reply(
                &mut stream,
                "405 Method Not Allowed",
                "text/plain",
                "only GET\n",
            )
            .await
        }
    }
}

async fn reply(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::view::{JobView, NodeView};
    use crate::daemon::{SetAside, Why};

    fn node(name: &str, aside_until: Option<f64>) -> NodeView {
        NodeView {
            name: name.into(),
            state: "unavailable".into(),
            why: Why::SetAside,
            holder: None,
            reclaim_at: None,
            set_aside: aside_until.map(|until| SetAside {
                failures: 2,
                until,
                reason: "satellites of 2 users failed there".into(),
            }),
        }
    }

    fn job(id: u32, paused_until: Option<f64>) -> JobView {
        JobView {
            job_id: id,
            user: Some("alice".into()),
            uid: 1001,
            min_nodes: 1,
            max_nodes: 4,
            state: "running".into(),
            nodes: "n1".into(),
            size: 1,
            core_nodes: "n1".into(),
            satellites: Vec::new(),
            rate: None,
            batch: None,
            batch_range: None,
            sensitivity: None,
            held_per_gpu: None,
            measurements: 0,
            admits: 1,
            grows: 0,
            shrinks: 0,
            requeues: 0,
            preemptions: 0,
            largest: 1,
            node_hours: 0.0,
            submitted_at: 0.0,
            ended_at: None,
            history: None,
            history_dropped: 0,
            paused_until,
            pause_reason: paused_until.map(|_| "Slurm refused its satellite".into()),
            unservable: None,
        }
    }

    /// The exposition of a sample snapshot, with a 12,345-byte journal.
    fn sample() -> String {
        let mut s = Snapshot {
            lending: "paused".into(),
            lease: None,
            slurm_reachable: true,
            node_seconds_harvested: 7200.5,
            time: 1000.0,
            started_at: 900.0,
            ..Default::default()
        };
        s.counts.lent = 3;
        s.counts.idle = 1;
        s.jobs_by_state.running = 2;
        s.stats.grows = 5;
        s.stats.satellite_failures = 4;
        s.stats.job_pauses = 3;
        s.stats.not_adopted = 2;
        s.stats.deferred_calls = 6;
        s.stats.refused_decisions = 1;
        s.stats.journal_skipped = 2;
        // Set aside until later, one whose time ran out, one never.
        s.nodes = vec![
            node("n1", Some(1100.0)),
            node("n2", Some(999.0)),
            node("n3", None),
        ];
        s.jobs = vec![job(7, Some(1060.0)), job(8, None), job(9, Some(10.0))];
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal.jsonl");
        std::fs::write(&journal, vec![b'x'; 12_345]).unwrap();
        let (_tx, rx) = watch::channel(Arc::new(s));
        let m = Metrics::with_journal(rx, Some(journal));
        m.poll_seconds.observe(0.002);
        m.poll_seconds.observe(42.0);
        m.decision_seconds.observe(0.0005);
        m.encode()
    }

    #[test]
    fn exposition_carries_the_snapshot() {
        let text = sample();
        for want in [
            "# TYPE bftrainer_nodes gauge",
            "bftrainer_nodes{state=\"lent\"} 3",
            "bftrainer_nodes{state=\"idle\"} 1",
            "bftrainer_elastic_jobs{state=\"running\"} 2",
            "bftrainer_lending{mode=\"paused\"} 1",
            "bftrainer_lending{mode=\"open\"} 0",
            "bftrainer_grows_total 5",
            "bftrainer_harvested_node_seconds_total 7200.5",
            "bftrainer_nodes_set_aside 1.0\n",
            "bftrainer_jobs_paused 1.0\n",
            "bftrainer_satellite_failures_total 4",
            "bftrainer_job_pauses_total 3",
            "bftrainer_not_adopted_total 2",
            "bftrainer_deferred_calls_total 6",
            "bftrainer_refused_decisions_total 1",
            "bftrainer_journal_skipped_total 2",
            "bftrainer_journal_bytes 12345",
            "# UNIT bftrainer_journal_bytes bytes",
            "bftrainer_started_seconds 900",
            "bftrainer_snapshot_time_seconds 1000",
            "# TYPE bftrainer_poll_seconds histogram",
            "bftrainer_poll_seconds_count 2",
            "bftrainer_decision_seconds_bucket{le=\"0.0008\"} 1",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
    }

    /// A 42-s poll (a slurmctld timing out) lands in a finite bucket, and the buckets
    /// reach past a minute.
    #[test]
    fn latency_buckets_cover_a_slow_slurmctld() {
        let text = sample();
        let les: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("bftrainer_poll_seconds_bucket{le=\""))
            .filter_map(|l| l.split('"').next())
            .filter(|le| *le != "+Inf")
            .map(|le| le.parse().unwrap())
            .collect();
        let top = les.iter().copied().fold(0.0, f64::max);
        assert!(top >= 60.0, "largest bucket {top} s");
        let below = text
            .lines()
            .find(|l| l.starts_with("bftrainer_poll_seconds_bucket{le=\"52.4288\"}"))
            .unwrap_or_else(|| panic!("no 52.4288 bucket:\n{text}"));
        assert!(below.ends_with(" 2"), "{below}");
    }

    /// Without a journal path there is no journal series (rather than a false 0).
    #[test]
    fn no_journal_no_journal_series() {
        let (_tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let text = Metrics::new(rx).encode();
        assert!(!text.contains("bftrainer_journal_bytes"), "{text}");
        let (_tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let m = Metrics::with_journal(rx, Some("/nonexistent/journal.jsonl".into()));
        assert!(!m.encode().contains("bftrainer_journal_bytes"));
    }

    /// Every `bftrainer_*` name in `expr` names a series of `text` (a histogram's
    /// `_bucket`/`_sum`/`_count` included); returns how many it checked.
    fn check_exported(text: &str, expr: &str, place: &str) -> usize {
        let mut used = 0;
        let mut rest = expr;
        while let Some(i) = rest.find("bftrainer_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name} "))
                        || l.starts_with(&format!("{name}{{"))),
                "{place} uses {name}, which bftrainerd does not export"
            );
            used += 1;
            rest = &rest[i + name.len()..];
        }
        used
    }

    /// conf/grafana-bftrainer.json asks only for series the daemon exports.
    #[test]
    fn the_sample_dashboard_uses_exported_metrics() {
        let text = sample();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../conf/grafana-bftrainer.json"
        );
        let dash: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut used = 0;
        for p in dash["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                used += check_exported(&text, expr, &format!("panel {:?}", p["title"]));
            }
        }
        assert!(used >= 10, "{used}");
    }

    /// One rule of conf/bftrainer-alerts.yml, as [`alert_rules`] reads it.
    #[derive(Debug, Default)]
    struct Rule {
        alert: String,
        expr: String,
        for_: String,
        severity: String,
        summary: String,
    }

    /// Reads the rules file's one shape (groups: - name, rules: - alert, expr, for,
    /// labels.severity, annotations.summary|description) without a YAML crate: block
    /// scalars (`|`, `>`) by indentation, plain and quoted scalars on one line. Refuses
    /// tabs and keys it does not know, so a typo does not pass unread.
    fn alert_rules(yaml: &str) -> Vec<Rule> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut section = "";
        let mut rule_indent = 0;
        let lines: Vec<&str> = yaml.lines().collect();
        let indent = |l: &str| l.len() - l.trim_start().len();
        let mut i = 0;
        while i < lines.len() {
            let raw = lines[i];
            i += 1;
            assert!(!raw.contains('\t'), "line {i}: a tab");
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let item = line.strip_prefix("- ");
            let kv = item.unwrap_or(line);
            let (key, value) = kv
                .split_once(':')
                .unwrap_or_else(|| panic!("line {i}: not `key: value`: {raw}"));
            let mut value = value.trim().to_string();
            if value == "|" || value == ">" || value == "|-" || value == ">-" {
                let base = indent(raw) + item.map_or(0, |_| 2);
                let mut block = Vec::new();
                while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > base) {
                    block.push(lines[i].trim());
                    i += 1;
                }
                value = block.join(" ").trim().to_string();
            } else if let Some(q) = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            {
                value = q.to_string();
            }
            let at = indent(raw) + item.map_or(0, |_| 2);
            match key {
                "groups" | "rules" => assert!(value.is_empty(), "line {i}: {raw}"),
                "name" | "interval" if rules.is_empty() || at < rule_indent => {}
                "alert" => {
                    rules.push(Rule {
                        alert: value,
                        ..Default::default()
                    });
                    rule_indent = at;
                    section = "";
                }
                _ => {
                    let r = rules
                        .last_mut()
                        .unwrap_or_else(|| panic!("line {i}: {key} outside a rule"));
                    if at == rule_indent {
                        section = "";
                    }
                    match (section, key) {
                        ("", "expr") => r.expr = value,
                        ("", "for") => r.for_ = value,
                        ("", "labels" | "annotations") if value.is_empty() => section = key,
                        ("labels", "severity") => r.severity = value,
                        ("labels", _) => {}
                        ("annotations", "summary") => r.summary = value,
                        ("annotations", "description" | "runbook_url") => {}
                        _ => panic!("line {i}: unknown key {key:?} in {section:?}: {raw}"),
                    }
                }
            }
        }
        rules
    }

    /// conf/bftrainer-alerts.yml: each rule complete, waits before it fires, and asks
    /// only for series bftrainerd exports (or Prometheus's own `up`).
    #[test]
    fn the_sample_alert_rules_use_exported_metrics() {
        let text = sample();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../conf/bftrainer-alerts.yml"
        );
        let rules = alert_rules(&std::fs::read_to_string(path).unwrap());
        let names: Vec<&str> = rules.iter().map(|r| r.alert.as_str()).collect();
        for want in [
            "BftrainerdDown",
            "BftrainerSlurmUnreachable",
            "BftrainerNodesSetAside",
            "BftrainerSatelliteFailures",
            "BftrainerJobsNotAdopted",
            "BftrainerJournalLarge",
            "BftrainerDecisionSlow",
        ] {
            assert!(names.contains(&want), "no rule {want}: {names:?}");
        }
        for r in &rules {
            assert!(!r.expr.is_empty(), "{} has no expr", r.alert);
            let n = r.for_.trim_end_matches(['s', 'm', 'h']);
            assert!(
                n.parse::<u32>().is_ok_and(|n| n > 0) && r.for_.len() > n.len(),
                "{}: for {:?}",
                r.alert,
                r.for_
            );
            assert!(
                ["critical", "warning", "info"].contains(&r.severity.as_str()),
                "{}: severity {:?}",
                r.alert,
                r.severity
            );
            assert!(!r.summary.is_empty(), "{} has no summary", r.alert);
            assert_eq!(
                r.expr.matches('(').count(),
                r.expr.matches(')').count(),
                "{}: {}",
                r.alert,
                r.expr
            );
            let used = check_exported(&text, &r.expr, &format!("alert {}", r.alert));
            assert!(
                used > 0 || r.expr.starts_with("up{"),
                "{}: asks for no bftrainerd series: {}",
                r.alert,
                r.expr
            );
        }
    }

    #[test]
    fn the_rules_reader_reads_blocks_and_refuses_typos() {
        let rules = alert_rules(
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: |\n          up{job=\"x\"}\n            == 0\n        for: 2m\n        labels:\n          severity: critical\n        annotations:\n          summary: \"down: {{ $labels.instance }}\"\n",
        );
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].expr, "up{job=\"x\"} == 0");
        assert_eq!(rules[0].for_, "2m");
        assert_eq!(rules[0].summary, "down: {{ $labels.instance }}");
        let typo = std::panic::catch_unwind(|| {
            alert_rules("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        fro: 2m\n")
        });
        assert!(typo.is_err());
    }
}
