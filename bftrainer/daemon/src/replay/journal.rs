//! Engine journals: writing the events a replay sent to the engine (`--write-journal`),
//! and replaying a journal into a fresh engine under a chosen policy (`--journal`).

use anyhow::Context;
use bftrainer_core::engine::{Action, Allocator, Engine, EngineConfig, Record};
use bftrainer_core::sim::ActionCounts;
use serde::Serialize;
use std::io::{BufRead, Write};
use std::time::Instant;

/// One journal record: a JSON line.
pub fn journal_line(mut w: impl Write, r: &Record) -> std::io::Result<()> {
    serde_json::to_writer(&mut w, r)?;
    w.write_all(b"\n")
}

/// Writes actions as CSV, one row per action: time, kind, job, nodes (space-separated).
pub fn write_actions_csv(mut w: impl Write, actions: &[(f64, Action)]) -> std::io::Result<()> {
    writeln!(w, "{ACTIONS_HEADER}")?;
    for (t, a) in actions {
        action_row(&mut w, *t, a)?;
    }
    w.flush()
}

/// The header of the actions CSV.
pub const ACTIONS_HEADER: &str = "t,action,job,nodes";

/// One action: time, kind, job, nodes (space-separated).
pub fn action_row(mut w: impl Write, t: f64, a: &Action) -> std::io::Result<()> {
    let nodes: Vec<String> = a.nodes().iter().map(u32::to_string).collect();
    writeln!(w, "{t:.6},{},{},{}", a.kind(), a.job(), nodes.join(" "))
}

/// What replaying a journal produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JournalReport {
    pub records: u64,
    pub first_t: Option<f64>,
    pub last_t: Option<f64>,
    pub nodes: u64,
    pub jobs_submitted: u64,
    pub decisions: u64,
    pub decisions_kept: u64,
    #[serde(flatten)]
    pub counts: ActionCounts,
    pub replay_s: f64,
    /// Confirmations of the journal's own decisions (`JobStarted`, `WorkerJoined`) that
    /// do not fit this replay's (another policy decided otherwise): skipped.
    pub skipped_confirmations: u64,
    /// Every action with its time, when asked for (`keep_actions`); else empty.
    #[serde(skip)]
    pub actions: Vec<(f64, Action)>,
}

/// Feeds every record of `reader` (JSON lines; blank lines skipped) to a fresh engine
/// with `alloc`; a malformed line, an unknown format version or an event the engine
/// rejects (a time going backwards among them) stops the replay with the line number. The actions are
/// counted; they are also kept, with their times, only with `keep_actions` (a long
/// journal's actions need not sit in memory for a summary).
pub fn replay_journal<A: Allocator>(
    reader: impl BufRead,
    what: &str,
    cfg: EngineConfig,
    alloc: A,
    keep_actions: bool,
) -> anyhow::Result<JournalReport> {
    cfg.validate().map_err(|m| anyhow::anyhow!("--{m}"))?;
    let mut engine = Engine::new(cfg, alloc);
    let mut rep = JournalReport::default();
    let started = Instant::now();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{what}: read failed after line {i}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec = Record::from_json_line(&line).map_err(|m| anyhow::anyhow!("{what}:{n}: {m}"))?;
        rep.first_t.get_or_insert(rec.t);
        rep.last_t = Some(rec.t);
        rep.records += 1;
        match &rec.event {
            bftrainer_core::engine::Event::NodeAdded { .. } => rep.nodes += 1,
            bftrainer_core::engine::Event::JobSubmitted { .. } => rep.jobs_submitted += 1,
            _ => {}
        }
        let confirmation = matches!(
            rec.event,
            bftrainer_core::engine::Event::JobStarted { .. }
                | bftrainer_core::engine::Event::WorkerJoined { .. }
        );
        let actions = match engine.on_event(&rec.event, rec.t) {
            Ok(a) => a,
            // A start the journal's policy decided and this one did not: nothing to
            // confirm (the engine checks these and changes nothing).
            Err(_) if confirmation => {
                rep.skipped_confirmations += 1;
                continue;
            }
            Err(e) => return Err(anyhow::anyhow!("{what}:{n}: {e}")),
        };
        for a in actions {
            rep.counts.count(&a);
            if keep_actions {
                rep.actions.push((rec.t, a));
            }
        }
    }
    if rep.records == 0 {
        anyhow::bail!("{what}: no journal records");
    }
    rep.decisions = engine.stats.decisions;
    rep.decisions_kept = engine.stats.kept;
    rep.replay_s = started.elapsed().as_secs_f64();
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::engine::Exact;

    fn err(text: &str) -> String {
        replay_journal(
            text.as_bytes(),
            "j.jsonl",
            EngineConfig::default(),
            Exact::default(),
            false,
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn malformed_journals_are_rejected_with_the_line() {
        let ok = r#"{"v":1,"t":0,"event":{"type":"node_added","node":0,"name":"a"}}"#;
        assert!(err(&format!("{ok}\n{{\"v\":1,\"t\":0,\"ev"))
            .starts_with("j.jsonl:2: not a journal record"));
        assert!(err(&format!("{ok}\n{}", ok.replace("\"v\":1", "\"v\":9")))
            .starts_with("j.jsonl:2: journal format version 9 is not supported"));
        assert!(err(&format!(
            "{}\n{ok}",
            r#"{"v":1,"t":5,"event":{"type":"tick"}}"#
        ))
        .starts_with("j.jsonl:2: engine at t=0: time 0 is earlier than the previous event's 5"));
        assert!(
            err(r#"{"v":1,"t":0,"event":{"type":"node_idle","node":3,"reclaim_at":null}}"#)
                .contains("j.jsonl:1: engine at t=0: unknown node 3")
        );
        assert_eq!(err("\n\n"), "j.jsonl: no journal records");
    }

    #[test]
    fn counts_what_it_replays() {
        let text = [
            r#"{"v":1,"t":0,"event":{"type":"node_added","node":0,"name":"a"}}"#,
            r#"{"v":1,"t":0,"event":{"type":"node_idle","node":0,"reclaim_at":null}}"#,
            r#"{"v":1,"t":1,"event":{"type":"job_submitted","job":0,"spec":{"name":"J","min_nodes":1,"max_nodes":1,"scale_up_s":0.0,"scale_down_s":0.0,"objective":{"points":[[1,1.0]]}}}}"#,
            r#"{"v":1,"t":1,"event":{"type":"tick"}}"#,
        ]
        .join("\n");
        let r = replay_journal(
            text.as_bytes(),
            "j",
            EngineConfig::default(),
            Exact::default(),
            true,
        )
        .unwrap();
        assert_eq!((r.records, r.nodes, r.jobs_submitted), (4, 1, 1));
        assert_eq!(
            (r.decisions, r.counts.admits, r.counts.grown_nodes),
            (1, 1, 1)
        );
        assert_eq!(
            r.actions,
            vec![(
                1.0,
                Action::Admit {
                    job: 0,
                    nodes: vec![0]
                }
            )]
        );
        let mut csv = Vec::new();
        write_actions_csv(&mut csv, &r.actions).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "t,action,job,nodes\n1.000000,admit,0,0\n"
        );
    }

    /// A journal's confirmations of its own decisions (the simulator and bftrainerd
    /// send them) that another policy did not make are skipped and counted; those that
    /// fit are applied, and other refused events still stop the replay.
    #[test]
    fn confirmations_of_other_decisions_are_skipped() {
        let head = [
            r#"{"v":1,"t":0,"event":{"type":"node_added","node":0,"name":"a"}}"#,
            r#"{"v":1,"t":0,"event":{"type":"node_added","node":1,"name":"b"}}"#,
            r#"{"v":1,"t":0,"event":{"type":"node_idle","node":0,"reclaim_at":null}}"#,
            r#"{"v":1,"t":1,"event":{"type":"job_submitted","job":0,"spec":{"name":"J","min_nodes":1,"max_nodes":1,"scale_up_s":0.0,"scale_down_s":0.0,"objective":{"points":[[1,1.0]]}}}}"#,
            r#"{"v":1,"t":1,"event":{"type":"tick"}}"#,
            r#"{"v":1,"t":2,"event":{"type":"job_started","job":0}}"#,
            r#"{"v":1,"t":2,"event":{"type":"worker_joined","job":0,"node":0}}"#,
            r#"{"v":1,"t":2,"event":{"type":"worker_joined","job":0,"node":1}}"#,
        ]
        .join("\n");
        let r = replay_journal(
            head.as_bytes(),
            "j",
            EngineConfig::default(),
            Exact::default(),
            false,
        )
        .unwrap();
        assert_eq!((r.records, r.skipped_confirmations), (8, 1));
        assert!(err(&format!(
            "{head}\n{}",
            r#"{"v":1,"t":3,"event":{"type":"job_finished","job":7}}"#
        ))
        .contains("j.jsonl:9: engine at t=3: unknown job 7"));
    }
}
