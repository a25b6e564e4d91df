//! The plugin's own cost per job_submit call, measured inside slurmctld and logged as
//! p50/p99 every [`SUMMARY_EVERY`] calls and at fini (shutdown or plugin reload).
//!
//! Samples go into a fixed-size ring of the latest calls, so memory and the cost of a
//! summary (one sort of at most 16384 numbers, ~1 ms) stay bounded on a busy controller.

use std::sync::Mutex;

/// Most recent samples kept for the percentiles.
const CAPACITY: usize = 1 << 14;

/// A summary line goes to slurmctld's log after this many calls.
pub const SUMMARY_EVERY: u64 = 1000;

#[derive(Debug, Default)]
pub struct Stats {
    samples_ns: Vec<u32>,
    next: usize,
    total: u64,
}

impl Stats {
    pub const fn new() -> Self {
        Stats {
            samples_ns: Vec::new(),
            next: 0,
            total: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        let ns = u32::try_from(ns).unwrap_or(u32::MAX);
        if self.samples_ns.len() < CAPACITY {
            self.samples_ns.push(ns);
        } else {
            self.samples_ns[self.next] = ns;
            self.next = (self.next + 1) % CAPACITY;
        }
        self.total += 1;
    }

    /// Whether the call just recorded should log a summary.
    pub fn due(&self) -> bool {
        self.total % SUMMARY_EVERY == 0
    }

    /// "N calls, p50 X us, p99 Y us, max Z us" over the kept samples.
    pub fn summary(&self) -> Option<String> {
        if self.samples_ns.is_empty() {
            return None;
        }
        let mut v = self.samples_ns.clone();
        v.sort_unstable();
        let pct = |p: f64| {
            let i = ((v.len() as f64 - 1.0) * p).round() as usize;
            f64::from(v[i]) / 1000.0
        };
        Some(format!(
            "job_submit timing: {} calls (last {} sampled), p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            self.total,
            v.len(),
            pct(0.50),
            pct(0.99),
            pct(1.0)
        ))
    }
}

pub static STATS: Mutex<Stats> = Mutex::new(Stats::new());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut s = Stats::new();
        assert_eq!(s.summary(), None);
        for ns in 1..=1000u64 {
            s.record(ns * 1000);
        }
        assert_eq!(
            s.summary().unwrap(),
            "job_submit timing: 1000 calls (last 1000 sampled), p50 501.0 us, p99 990.0 us, max 1000.0 us"
        );
        assert!(s.due());
        s.record(u64::MAX);
        assert!(!s.due());
        assert!(s.summary().unwrap().contains("max 4294967.3 us"));
        for _ in 0..2 * CAPACITY {
            s.record(5000);
        }
        assert!(s.summary().unwrap().contains(&format!(
            "(last {CAPACITY} sampled), p50 5.0 us, p99 5.0 us, max 5.0 us"
        )));
    }
}
