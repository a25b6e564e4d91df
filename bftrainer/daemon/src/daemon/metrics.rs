//! Prometheus metrics (`[metrics] listen`): gauges and counters read from the last
//! published snapshot at scrape time, latency histograms fed by the main loop, all
//! encoded by prometheus-client; served over plain HTTP/1.x on GET /metrics.

use super::view::Snapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Largest request head accepted, bytes.
const MAX_HEAD: usize = 8 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_CLIENTS: usize = 64;

/// The registry and the histograms the main loop observes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub poll_seconds: Histogram,
    pub decision_seconds: Histogram,
}

impl Metrics {
    pub fn new(snapshot: watch::Receiver<Arc<Snapshot>>) -> Metrics {
        let mut registry = Registry::with_prefix("bftrainer");
        // 0.1 ms to ~3.3 s, doubling.
        let poll_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let decision_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
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
        registry.register_collector(Box::new(SnapshotCollector(snapshot)));
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

/// Reads the last snapshot at each scrape.
#[derive(Debug)]
struct SnapshotCollector(watch::Receiver<Arc<Snapshot>>);

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
        let s = self.0.borrow().clone();
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
        let up = ConstGauge::new(f64::from(u8::from(s.slurm_reachable)));
        up.encode(e.encode_descriptor(
            "slurm_up",
            "1 while slurmctld answers",
            None,
            up.metric_type(),
        )?)?;
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

    fn sample() -> String {
        let mut s = Snapshot {
            lending: "paused".into(),
            slurm_reachable: true,
            node_seconds_harvested: 7200.5,
            ..Default::default()
        };
        s.counts.lent = 3;
        s.counts.idle = 1;
        s.jobs_by_state.running = 2;
        s.stats.grows = 5;
        let (_tx, rx) = watch::channel(Arc::new(s));
        let m = Metrics::new(rx);
        m.poll_seconds.observe(0.002);
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
            "# TYPE bftrainer_poll_seconds histogram",
            "bftrainer_poll_seconds_count 1",
            "bftrainer_decision_seconds_bucket{le=\"0.0008\"} 1",
            "# EOF",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
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
                let mut rest = expr;
                while let Some(i) = rest.find("bftrainer_") {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        text.lines().any(|l| l.starts_with(&format!("{name} "))
                            || l.starts_with(&format!("{name}{{"))),
                        "panel {:?} uses {name}, which bftrainerd does not export",
                        p["title"]
                    );
                    used += 1;
                    rest = &rest[i + name.len()..];
                }
            }
        }
        assert!(used >= 10, "{used}");
    }
}
