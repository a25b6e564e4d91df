//! What the elastic runtime (`bft-run`) publishes in its core job's Comment, and the
//! daemon reads at each poll: the coordinator's address (satellites find it there) and
//! the measured throughput (the engine's `Progress` events). Only the job's owner, the
//! Slurm user and root can set a job's Comment, so this needs no new port.
//!
//! `bftrainer-run:v1 coord=HOST:PORT run=ID start=T gen=G nodes=N rate=R step=S`
//!
//! `run` names one run of the job's batch script (a requeued job gets a new one) and
//! `start` is the job's start time that run saw: a satellite follows `coord` only when
//! `start` is the job's current start time, and then proves over MUNGE that the
//! coordinator it reached is this run's (docs/design.md, "Trust"). `step` is the
//! measured seconds per training step (0: not measured): bftrainerd waits that long,
//! at least, for a leaving satellite to reach its step boundary. `done=1` is written
//! last, once the training itself has finished (its workers exited 0): a core job
//! that Slurm ends COMPLETED while preempting it is then counted finished by bftrainerd,
//! not requeued to run its finished work again. Only the job's own fate depends on it
//! (its owner could write it; it can only end their job).
//!
//! `up=U down=D` (written once measured) are the seconds the job's last grow and last
//! shrink cost it: a newcomer's start until it contributed a step, and the pause from a
//! shrunk generation's announcement to its first step. They are the owner's word:
//! at most [`MAX_RESCALE_S`], and bftrainerd clamps them again by its ceilings.

use std::fmt;

pub const PREFIX: &str = "bftrainer-run:v1";

/// The largest rescale cost (`up=`, `down=`) a Comment may state, seconds: a day.
pub const MAX_RESCALE_S: f64 = 86_400.0;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunComment {
    /// `host:port` of the job's coordinator.
    pub coord: String,
    /// The run's identifier (hex; empty: a bft-run before run ids).
    pub run: String,
    /// The job's start time (Unix seconds) when this run began (0: unknown).
    pub start: i64,
    /// The current generation (0 before the first).
    pub gen: u64,
    /// Nodes with a worker in the current generation.
    pub nodes: u32,
    /// Measured samples per second at that size (0: not measured yet).
    pub rate: f64,
    /// Measured seconds per training step (0: not measured yet).
    pub step: f64,
    /// Measured seconds the last grow cost (0: none measured yet).
    pub up: f64,
    /// Measured seconds the last shrink paused the job (0: none measured yet).
    pub down: f64,
    /// The training has finished (written once, as the run's last word).
    pub done: bool,
    /// The global batch the workers run at, at which `rate` is measured (0: unknown,
    /// or a script without a global batch).
    pub batch: u32,
}

impl fmt::Display for RunComment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX} coord={} run={} start={} gen={} nodes={} rate={:.1} step={:.3}",
            self.coord, self.run, self.start, self.gen, self.nodes, self.rate, self.step
        )?;
        if self.up > 0.0 {
            write!(f, " up={:.1}", self.up)?;
        }
        if self.down > 0.0 {
            write!(f, " down={:.1}", self.down)?;
        }
        if self.batch > 0 {
            write!(f, " batch={}", self.batch)?;
        }
        if self.done {
            f.write_str(" done=1")?;
        }
        Ok(())
    }
}

impl RunComment {
    /// `None` when the comment is not the runtime's (a user's own comment, the
    /// plugin's "waiting" note); unknown keys are ignored (a newer bft-run).
    pub fn parse(comment: &str) -> Option<RunComment> {
        let mut words = comment.split_ascii_whitespace();
        if words.next()? != PREFIX {
            return None;
        }
        let mut c = RunComment::default();
        let non_negative = |v: &str| v.parse().ok().filter(|r: &f64| r.is_finite() && *r >= 0.0);
        let seconds = |v: &str| non_negative(v).filter(|s| *s <= MAX_RESCALE_S);
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "coord" => c.coord = v.to_string(),
                "gen" => c.gen = v.parse().ok()?,
                "nodes" => c.nodes = v.parse().ok()?,
                "run" if v.len() <= 64 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    c.run = v.to_string()
                }
                "run" => return None,
                "start" => c.start = v.parse().ok()?,
                "rate" => c.rate = non_negative(v)?,
                "step" => c.step = non_negative(v)?,
                "up" => c.up = seconds(v)?,
                "down" => c.down = seconds(v)?,
                // The owner's word, as the rate is: weighs only against its own options.
                "batch" => c.batch = v.parse().ok().filter(|b| *b <= crate::spec::MAX_BATCH)?,
                "done" => {
                    c.done = match v {
                        "1" => true,
                        "0" => false,
                        _ => return None,
                    }
                }
                _ => {}
            }
        }
        (!c.coord.is_empty()).then_some(c)
    }

    /// Whether this comment says that the run which began at the job's current start
    /// time (`job_start`, Slurm's) finished its training. A `done` of an earlier run
    /// (the Comment survives a requeue) or with no start says nothing.
    pub fn finished_run(&self, job_start: Option<i64>) -> bool {
        self.done && self.start != 0 && job_start == Some(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_comments() {
        let c = RunComment {
            coord: "10.0.0.7:41234".into(),
            run: "0a1b".into(),
            start: 1_795_000_000,
            gen: 12,
            nodes: 3,
            rate: 1234.56,
            step: 2.5,
            ..RunComment::default()
        };
        let s = c.to_string();
        assert_eq!(
            s,
            "bftrainer-run:v1 coord=10.0.0.7:41234 run=0a1b start=1795000000 gen=12 nodes=3 rate=1234.6 step=2.500"
        );
        let back = RunComment::parse(&s).unwrap();
        assert_eq!(
            (
                back.coord.as_str(),
                back.run.as_str(),
                back.start,
                back.gen,
                back.nodes
            ),
            ("10.0.0.7:41234", "0a1b", 1_795_000_000, 12, 3)
        );
        assert!((back.rate - 1234.6).abs() < 1e-9);
        assert!((back.step - 2.5).abs() < 1e-9);
        assert!(!back.done);
        // The run's last word: done, for this start time only.
        let fin = RunComment {
            batch: 512,
            done: true,
            ..c.clone()
        };
        let text = fin.to_string();
        assert!(text.ends_with(" batch=512 done=1"), "{text}");
        let back = RunComment::parse(&text).unwrap();
        assert_eq!(back.batch, 512);
        // A batch past the largest allowed is no comment of ours.
        assert!(RunComment::parse("bftrainer-run:v1 coord=h:1 batch=16777217").is_none());
        assert_eq!(
            RunComment::parse("bftrainer-run:v1 coord=h:1").map(|c| c.batch),
            Some(0)
        );
        assert!(back.finished_run(Some(1_795_000_000)));
        assert!(
            !back.finished_run(Some(1_795_000_100)),
            "a later run (requeued) is not done"
        );
        assert!(!back.finished_run(None));
        assert!(!RunComment {
            start: 0,
            ..back.clone()
        }
        .finished_run(Some(0)));
        assert!(!RunComment::parse(&s)
            .unwrap()
            .finished_run(Some(1_795_000_000)));
        // Measured rescale costs: written once measured, read back.
        let costs = RunComment {
            up: 42.25,
            down: 3.0,
            ..c.clone()
        };
        let text = costs.to_string();
        assert!(text.ends_with(" up=42.2 down=3.0"), "{text}");
        let back = RunComment::parse(&text).unwrap();
        assert_eq!((back.up, back.down), (42.2, 3.0));
        assert_eq!(
            RunComment::parse("bftrainer-run:v1 coord=h:1 up=86400").map(|c| c.up),
            Some(86_400.0)
        );
        // An older bft-run's comment: no run, start or step.
        let old = RunComment::parse("bftrainer-run:v1 coord=h:1 gen=2 nodes=1 rate=3.0").unwrap();
        assert_eq!((old.run.as_str(), old.start, old.step), ("", 0, 0.0));
        assert_eq!(
            RunComment::parse("bftrainer-run:v1 coord=h:1 future=x").map(|c| c.gen),
            Some(0)
        );
        for bad in [
            "",
            "bftrainer: elastic job (1-4 nodes) waiting for bftrainerd to admit it",
            "bftrainer-run:v1",
            "bftrainer-run:v1 gen=1",
            "bftrainer-run:v1 coord=h:1 rate=-3",
            "bftrainer-run:v1 coord=h:1 rate=NaN",
            "bftrainer-run:v1 coord=h:1 step=-1",
            "bftrainer-run:v1 coord=h:1 up=-1",
            "bftrainer-run:v1 coord=h:1 up=inf",
            "bftrainer-run:v1 coord=h:1 up=86400.1",
            "bftrainer-run:v1 coord=h:1 down=NaN",
            "bftrainer-run:v1 coord=h:1 down=1e9",
            "bftrainer-run:v1 coord=h:1 down=",
            "bftrainer-run:v1 coord=h:1 run=zz",
            "bftrainer-run:v1 coord=h:1 start=x",
            "bftrainer-run:v1 coord=h:1 gen=x",
            "bftrainer-run:v1 coord=h:1 done=yes",
            "bftrainer-run:v1 coord=h:1 done=",
            "bftrainer-run:v1 coord=h:1 junk",
            "bftrainer-run:v2 coord=h:1",
        ] {
            assert_eq!(RunComment::parse(bad), None, "{bad:?}");
        }
    }
}
