//! What the elastic runtime (`bft-run`) publishes in its core job's Comment, and the
//! daemon reads at each poll: the coordinator's address (satellites find it there) and
//! the measured throughput (the engine's `Progress` events). Only the job's owner, the
//! Slurm user and root can set a job's Comment, so this needs no new port.
//!
//! `bftrainer-run:v1 coord=HOST:PORT gen=G nodes=N rate=R`

use std::fmt;

pub const PREFIX: &str = "bftrainer-run:v1";

#[derive(Debug, Clone, PartialEq)]
pub struct RunComment {
    /// `host:port` of the job's coordinator.
    pub coord: String,
    /// The current generation (0 before the first).
    pub gen: u64,
    /// Nodes with a worker in the current generation.
    pub nodes: u32,
    /// Measured samples per second at that size (0: not measured yet).
    pub rate: f64,
}

impl fmt::Display for RunComment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX} coord={} gen={} nodes={} rate={:.1}",
            self.coord, self.gen, self.nodes, self.rate
        )
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
        let mut c = RunComment {
            coord: String::new(),
            gen: 0,
            nodes: 0,
            rate: 0.0,
        };
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "coord" => c.coord = v.to_string(),
                "gen" => c.gen = v.parse().ok()?,
                "nodes" => c.nodes = v.parse().ok()?,
                "rate" => {
                    c.rate = v
                        .parse()
                        .ok()
                        .filter(|r: &f64| r.is_finite() && *r >= 0.0)?
                }
                _ => {}
            }
        }
        (!c.coord.is_empty()).then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_comments() {
        let c = RunComment {
            coord: "10.0.0.7:41234".into(),
            gen: 12,
            nodes: 3,
            rate: 1234.56,
        };
        let s = c.to_string();
        assert_eq!(
            s,
            "bftrainer-run:v1 coord=10.0.0.7:41234 gen=12 nodes=3 rate=1234.6"
        );
        let back = RunComment::parse(&s).unwrap();
        assert_eq!(
            (back.coord.as_str(), back.gen, back.nodes),
            ("10.0.0.7:41234", 12, 3)
        );
        assert!((back.rate - 1234.6).abs() < 1e-9);
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
            "bftrainer-run:v1 coord=h:1 gen=x",
            "bftrainer-run:v1 coord=h:1 junk",
            "bftrainer-run:v2 coord=h:1",
        ] {
            assert_eq!(RunComment::parse(bad), None, "{bad:?}");
        }
    }
}
