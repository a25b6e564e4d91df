//! Recovery: the engine rebuilt from the journal without deciding again, and the
//! journal compacted to one snapshot.

use super::*;

impl<C: Cluster> Daemon<C> {
    /// Rebuilds the engine from the journal without deciding again: each journaled
    /// decision (`Event::Decided`, written right after its Tick) is applied as it was
    /// made, whatever the config or build is now (`Mode::Restore`); a Tick without one
    /// (a journal of an older bftrainerd) is decided again under the current config.
    /// A record the engine refuses is logged and skipped: the journal's content never
    /// keeps the daemon from starting. The config takes effect from the first decision.
    pub(super) fn restore(&mut self, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        let t0 = std::time::Instant::now();
        self.engine.set_mode(Mode::Restore);
        let mut redecided = 0u64;
        let mut i = 0;
        while i < records.len() {
            let r = &records[i];
            if matches!(r.event, Event::Tick) {
                if let Some(next) = records
                    .get(i + 1)
                    .filter(|n| matches!(n.event, Event::Decided { .. }))
                {
                    // The decision first, then its Tick (the book settles sizes on Ticks).
                    self.restore_record(next, i + 2);
                    self.restore_record(r, i + 1);
                    i += 2;
                    continue;
                }
                redecided += 1;
                self.engine.set_mode(Mode::Live);
                self.restore_record(r, i + 1);
                self.engine.set_mode(Mode::Restore);
            } else {
                self.restore_record(r, i + 1);
            }
            i += 1;
        }
        for w in self.engine.take_warnings() {
            log::warn!("journal: {w}");
        }
        self.engine.set_mode(Mode::Live);
        self.engine.take_activated();
        let st = &self.engine.stats;
        log::info!(
            "rebuilt from the journal in {:.2} s: {} records, {} nodes, {} elastic jobs; {} decisions restored as made, {} skipped, {} decided again (older journal), {} records skipped",
            t0.elapsed().as_secs_f64(),
            records.len(),
            self.nodes.len(),
            self.jobs.len(),
            st.restored_actions,
            st.skipped_actions,
            redecided,
            self.stats.journal_skipped
        );
    }

    // recovery
    /// Feeds one journal record (line `line`) at start-up; refused: logged, skipped.
    pub(super) fn restore_record(&mut self, r: &Record, line: usize) {
        match self.feed(&r.event, r.t) {
            Ok(_) => {
                self.last_t = self.last_t.max(r.t);
                if let Event::Snapshot { state, nodes, jobs } = &r.event {
                    self.learn_snapshot(state, nodes, jobs, r.t);
                    return;
                }
                if let Err(e) = self.learn(&r.event) {
                    log::warn!("journal record {line}: {e}");
                    if matches!(r.event, Event::JobSubmitted { .. }) {
                        // Keeps engine ids and Slurm ids aligned; 0 names no Slurm job.
                        self.jobs.push(0);
                    }
                }
            }
            Err(e) => {
                self.stats.journal_skipped += 1;
                log::warn!("journal record {line} skipped: {e}");
            }
        }
    }

    // recovery
    /// Rebuilds the daemon's maps from a snapshot the engine loaded: node names and
    /// classes, the Slurm id of every engine job, and the book of `bftrainer jobs`,
    /// which starts again at the snapshot (the sizes before it are in the history of
    /// the journal it replaced, and in accounting).
    pub(super) fn learn_snapshot(
        &mut self,
        state: &bftrainer_core::engine::EngineState,
        nodes: &[String],
        jobs: &[String],
        t: f64,
    ) {
        self.nodes.clear();
        self.node_ids.clear();
        self.slots.invalidate();
        for (i, name) in nodes.iter().enumerate() {
            let ev = Event::NodeAdded {
                node: i as NodeId,
                name: name.clone(),
            };
            self.learn(&ev).ok();
            let Some(ns) = state.nodes.get(i) else {
                continue;
            };
            let rec = &mut self.nodes[i];
            match ns.state {
                NodeState::Idle | NodeState::Held(_) => {
                    rec.sent_forecast = ns.reclaim_at;
                    rec.class = Class::Available {
                        reclaim_at: ns.reclaim_at,
                    };
                    rec.why = Why::Open;
                }
                NodeState::Lost => {
                    rec.class = Class::Lost;
                    rec.why = Why::Unavailable;
                }
                NodeState::Busy => {}
            }
        }
        self.jobs = jobs.iter().map(|j| j.parse().unwrap_or(0)).collect();
        self.book = book::Book::default();
        let placeholder = ElasticSpec {
            name: String::new(),
            min_nodes: 1,
            max_nodes: 1,
            scale_up_s: 0.0,
            scale_down_s: 0.0,
            objective: Curve::default(),
            user: None,
            priority: 0,
        };
        for j in 0..self.engine.n_jobs() {
            let ev = Event::JobSubmitted {
                job: j as JobId,
                spec: placeholder.clone(),
            };
            self.book.event(&self.engine, &ev, None, &[], t);
        }
        self.book.event(&self.engine, &Event::Tick, None, &[], t);
    }

    // recovery
    /// Rewrites the journal as one snapshot of the engine's state, with the names the
    /// daemon maps nodes and jobs by (`Event::Snapshot`), atomically: the journal stays
    /// bounded and a start-up reads one record instead of the whole history. Called
    /// when the journal outgrows `journal::COMPACT_AFTER` records.
    pub fn compact_journal(&mut self) -> anyhow::Result<()> {
        let Some(j) = self.journal.as_mut() else {
            return Ok(());
        };
        j.flush()?;
        let state = self.engine.state();
        let t = state.t.unwrap_or(self.last_t);
        let ev = Event::Snapshot {
            state: Box::new(state),
            nodes: self.nodes.iter().map(|n| n.name.clone()).collect(),
            jobs: self.jobs.iter().map(u32::to_string).collect(),
        };
        let before = j.records;
        let t0 = std::time::Instant::now();
        j.rewrite(&[record(t, ev)])?;
        log::info!(
            "journal compacted: {before} records rewritten as one snapshot in {:.3} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
