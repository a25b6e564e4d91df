//! Human and machine outputs of a replay: the summary table and the per-step CSV.

use super::{Loaded, Options};
use bftrainer_core::sim::{CoreLoss, DaemonRules, Report, SizeRecord, StepRecord, Steps, Workload};
use bftrainer_core::timefmt::format_time;
use std::io::Write;

pub(super) fn thousands(v: f64, decimals: usize) -> String {
    let s = format!("{:.*}", decimals, v.abs());
    let (int, frac) = s.split_once('.').map_or((s.as_str(), ""), |(a, b)| (a, b));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    if v < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// The daemon's rules in force, as the options that set them.
pub fn rules_line(r: &DaemonRules) -> String {
    if *r == DaemonRules::NONE {
        return "none (--no-daemon-rules: lent while idle, work at once, a core loss costs one node)".into();
    }
    let s = |v: f64| {
        if v > 0.0 {
            format!("{v} s")
        } else {
            "off".into()
        }
    };
    format!(
        "release-before {}, reclaim-hold {}, start-latency {}, core-loss {}",
        s(r.release_before_s),
        s(r.reclaim_hold_s),
        s(r.start_latency_s),
        match r.core_loss {
            CoreLoss::Job => "job",
            CoreLoss::Node => "node",
        }
    )
}

fn dur(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 3600.0 => format!("{:.1} min", s / 60.0),
        Some(s) => format!("{:.2} h", s / 3600.0),
    }
}

/// Prints the report as an aligned two-column table.
pub fn print_table(
    w: &mut impl Write,
    l: &Loaded,
    o: &Options,
    r: &Report,
    load_s: f64,
    sim_s: f64,
) -> std::io::Result<()> {
    let pct = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
    row("trace", l.trace_name.clone());
    row(
        "window",
        format!("{} .. {} ({:.1} h)", r.start, r.end, r.hours),
    );
    row("nodes", format!("{}", r.nodes));
    if let Some((k, granular)) = l.gpus {
        row(
            "GPUs",
            if granular {
                format!("{k} per node, each lent on its own (--gpu-granular): the nodes and node-hours below are GPU slots and GPU-hours")
            } else {
                format!("{k} per node, lent with their node")
            },
        );
        if l.shared.is_some() {
            row(
                "shared nodes",
                format!("each job's processors on the lowest-numbered free ones, {k} per node, each a GPU slot (--shared-nodes; a model, see docs/replay.md)"),
            );
        }
    }
    if let Some(m) = &l.sched {
        row(
            "main scheduler",
            format!(
                "{} on {} nodes x {} procs",
                m.policy, m.nodes, m.procs_per_node
            ),
        );
        row(
            "  jobs scheduled",
            format!(
                "{} (skipped: {} empty, {} too wide{})",
                m.jobs_scheduled,
                m.jobs_skipped_empty,
                m.jobs_skipped_too_wide,
                if m.jobs_skipped_bad_run_time > 0 {
                    format!(", {} bad run time", m.jobs_skipped_bad_run_time)
                } else {
                    String::new()
                }
            ),
        );
        row("  utilisation", format!("{:.1}%", 100.0 * m.utilisation));
        row(
            "  mean wait",
            format!(
                "{:.2} h (max {:.1} h)",
                m.mean_wait_s / 3600.0,
                m.max_wait_s / 3600.0
            ),
        );
        row(
            "  mean bounded slowdown",
            format!("{:.2}", m.mean_bounded_slowdown),
        );
    }
    row(
        "elastic jobs",
        format!(
            "{} ({} in file){}",
            l.jobs_name,
            r.jobs_in_file,
            match o.workload {
                Workload::File => String::new(),
                Workload::Repeat => ", each resubmitted when it finishes (--repeat)".into(),
                Workload::Arrivals { per_hour } =>
                    format!(", drawn by Poisson arrivals at {per_hour} per hour (--arrivals)"),
            }
        ),
    );
    row(
        "settings",
        format!(
            "max-jobs {}, t-fwd {} s, grace {} s, objective {}, seed {}{}{}",
            o.max_jobs,
            o.t_fwd,
            o.grace,
            o.objective,
            o.seed,
            if o.fair_share { "" } else { ", no fair shares" },
            if o.steps == Steps::Trace {
                ", steps at trace events"
            } else {
                ""
            }
        ),
    );
    row("daemon rules", rules_line(&o.rules));
    if let Some(c) = o.cpu_alloc {
        row(
            "cpu allocation",
            format!(
                "{}, {} CPUs per host; CPU profiles: Synergy's measurements, 10 models in turn",
                match c.policy {
                    bftrainer_core::sim::cpus::CpuPolicy::Proportional => "proportional to GPUs",
                    bftrainer_core::sim::cpus::CpuPolicy::Sensitivity => "by sensitivity",
                },
                c.cpus_per_node
            ),
        );
    }
    row(
        "idle node-hours",
        format!(
            "{}  (mean {:.1} idle nodes)",
            thousands(r.idle_node_h, 1),
            r.mean_idle_nodes
        ),
    );
    row(
        "harvested node-hours",
        format!(
            "{}  ({:.1}% of idle)",
            thousands(r.harvested_node_h, 1),
            100.0 * r.harvest_share
        ),
    );
    row("  at or above job minimum", thousands(r.useful_node_h, 1));
    if let Some((k, granular)) = l.gpus {
        let per = if granular { 1.0 } else { f64::from(k) };
        row(
            "harvested GPU-hours",
            format!(
                "{} of {} idle",
                thousands(per * r.harvested_node_h, 1),
                thousands(per * r.idle_node_h, 1)
            ),
        );
    }
    if let Some(from) = &l.nodes_from {
        row("node classes", format!("{} ({from})", r.node_classes.len()));
        for c in &r.node_classes {
            row(
                &format!("  {}", c.name),
                format!(
                    "{} nodes ({}): idle {}, harvested {} node-hours ({:.1}%)",
                    c.nodes,
                    c.offers,
                    thousands(c.idle_node_h, 1),
                    thousands(c.harvested_node_h, 1),
                    pct(c.harvested_node_h, c.idle_node_h)
                ),
            );
        }
    }
    row("unused node-hours", thousands(r.unused_node_h, 1));
    if o.workload != Workload::File {
        // A workload that never runs dry: what bounds the harvest is the idle capacity.
        row(
            "harvest capacity",
            format!(
                "idle {}, harvestable {}, harvested {} node-hours",
                thousands(r.idle_node_h, 1),
                thousands(r.harvestable_node_h, 1),
                thousands(r.harvested_node_h, 1)
            ),
        );
        row(
            "  harvestable",
            format!(
                "{:.1}% of idle: {} within the active jobs' sizes, less {} lost to preemptions",
                pct(r.harvestable_node_h, r.idle_node_h),
                thousands(r.usable_node_h, 1),
                thousands(r.preemption_loss_node_h, 1)
            ),
        );
        row(
            "  harvested",
            format!("{:.1}% of harvestable", 100.0 * r.harvested_of_harvestable),
        );
    }
    if o.grace > 0.0 {
        row(
            "grace node-hours",
            format!("{}  (regular jobs waited)", thousands(r.grace_node_h, 1)),
        );
    }
    row("samples processed", format!("{:.4e}", r.samples));
    row(
        "efficiency",
        format!(
            "{:.1}%  (vs {:.4e} at dedicated rates)",
            100.0 * r.efficiency,
            r.samples_dedicated
        ),
    );
    row(
        "rescale loss",
        format!(
            "{:.4e} samples ({:.2}%)",
            r.rescale_loss_samples,
            pct(r.rescale_loss_samples, r.samples_dedicated)
        ),
    );
    row(
        "preemption loss",
        format!(
            "{:.4e} samples ({:.2}%)",
            r.preemption_loss_samples,
            pct(r.preemption_loss_samples, r.samples_dedicated)
        ),
    );
    if o.steps == Steps::Trace {
        row(
            "overrun loss",
            format!(
                "{:.4e} samples ({:.2}%, done jobs held until the next event)",
                r.overrun_loss_samples,
                pct(r.overrun_loss_samples, r.samples_dedicated)
            ),
        );
    }
    let a = &r.actions;
    row(
        "rescales",
        format!(
            "{} admits, {} grows, {} shrinks, {} requeues; {} nodes preempted",
            a.admits, a.grows, a.shrinks, a.requeues, r.preempted_nodes
        ),
    );
    if o.rules != DaemonRules::NONE {
        row(
            "daemon rules' cost",
            format!(
                "{} jobs requeued for a lost core node, {} nodes released before a planned start, {} node-hours waiting for starts",
                r.core_loss_requeues,
                r.released_nodes,
                thousands(r.starting_node_h, 1)
            ),
        );
    }
    row(
        "jobs",
        format!(
            "{} submitted, {} admitted, {} completed",
            r.jobs_submitted, r.jobs_admitted, r.jobs_completed
        ),
    );
    if r.jobs_unservable > 0 {
        let first = r.jobs.iter().find_map(|j| {
            j.unservable
                .as_ref()
                .map(|why| format!("{}: {why}", j.name))
        });
        row(
            "waiting for nodes",
            format!(
                "{} jobs wait at the end with fewer idle lendable nodes that serve them than they need; the first, {}",
                r.jobs_unservable,
                first.unwrap_or_default()
            ),
        );
    }
    row(
        "JCT mean / p50 / p95",
        format!(
            "{} / {} / {}",
            dur(r.jct_mean_s),
            dur(r.jct_p50_s),
            dur(r.jct_p95_s)
        ),
    );
    row(
        "decisions",
        format!(
            "{} ({} kept the old allocation)",
            r.decisions, r.decisions_kept
        ),
    );
    row(
        "decision time",
        format!(
            "{:.3} s total, mean {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            r.decision_total_s, r.decision_mean_ms, r.decision_p99_ms, r.decision_max_ms
        ),
    );
    row(
        "wall time",
        format!("{load_s:.2} s load, {sim_s:.2} s replay"),
    );
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    writeln!(w, "BFTrainer replay")?;
    for (k, v) in rows {
        writeln!(w, "  {k:<width$}  {v}")?;
    }
    Ok(())
}

/// The first two columns of both CSV logs, `t,time`: seconds, and the time in UTC.
fn time_columns(t: f64) -> String {
    format!("{t:.3},{}", format_time(t.floor() as i64))
}

/// The header of the per-step log.
pub const STEPS_HEADER: &str = "t,time,idle_nodes,harvested_nodes,active_jobs,queued_jobs,finished_jobs,grown_nodes,shrunk_nodes,preempted_nodes,samples,decision_ms";

/// One row of the per-step log (one per distinct event time).
pub fn step_row(mut w: impl Write, s: &StepRecord) -> std::io::Result<()> {
    writeln!(
        w,
        "{},{},{},{},{},{},{},{},{},{:.1},{:.4}",
        time_columns(s.t),
        s.idle_nodes,
        s.harvested_nodes,
        s.active_jobs,
        s.queued_jobs,
        s.finished_jobs,
        s.grown_nodes,
        s.shrunk_nodes,
        s.preempted_nodes,
        s.samples,
        s.decision_s * 1e3
    )
}

/// The header of the jobs' node counts.
pub const SIZES_HEADER: &str = "t,time,job,nodes";

/// One change of a job's node count; jobs by name (the report's, which names the
/// copies of `--repeat` and `--arrivals`).
pub fn size_row(mut w: impl Write, s: &SizeRecord, job: &str) -> std::io::Result<()> {
    writeln!(w, "{},{job},{}", time_columns(s.t), s.nodes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(1234567.891, 1), "1,234,567.9");
        assert_eq!(super::thousands(12.0, 0), "12");
        assert_eq!(super::thousands(-1000.0, 0), "-1,000");
    }
}
