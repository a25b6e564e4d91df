//! The plugin's own cost per job_submit call, measured inside slurmctld and logged as
//! p50/p99 every [`SUMMARY_EVERY`] calls and at fini (shutdown or plugin unload).
//!
//! Each summary covers the calls since the previous one (at most [`CAPACITY`] kept), so
//! memory and the cost of a summary (one sort, well under a millisecond) stay bounded.

use std::sync::Mutex;

/// Most samples kept between two summaries.
const CAPACITY: usize = 1 << 14;

/// A summary line goes to slurmctld's log after this many calls.
pub const SUMMARY_EVERY: u64 = 1000;

#[derive(Debug, Default)]
pub struct Stats {
    window_ns: Vec<u32>,
    /// Calls since the plugin was loaded (or since the last fini).
    total: u64,
}

impl Stats {
    pub const fn new() -> Self {
        Stats {
            window_ns: Vec::new(),
            total: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        if self.window_ns.len() < CAPACITY {
            self.window_ns.push(u32::try_from(ns).unwrap_or(u32::MAX));
        }
        self.total += 1;
    }

    /// Whether the call just recorded should log a summary.
    pub fn due(&self) -> bool {
        self.total % SUMMARY_EVERY == 0
    }

    /// "calls 1-1000: p50 X us, p99 Y us, max Z us" over the calls since the last
    /// summary, which starts a new window. `None` when there were none.
    pub fn take_summary(&mut self) -> Option<String> {
        if self.window_ns.is_empty() {
            return None;
        }
        let mut v = std::mem::take(&mut self.window_ns);
        v.sort_unstable();
        let pct = |p: f64| {
            let i = ((v.len() as f64 - 1.0) * p).round() as usize;
            f64::from(v[i]) / 1000.0
        };
        let first = self.total + 1 - v.len() as u64;
        Some(format!(
            "job_submit timing: calls {first}-{}: p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            self.total,
            pct(0.50),
            pct(0.99),
            pct(1.0)
        ))
    }

    /// Forget everything (fini: the next init starts counting afresh, whether or not
    /// slurmctld unloads the library in between).
    pub fn reset(&mut self) {
        *self = Stats::new();
    }
}

pub static STATS: Mutex<Stats> = Mutex::new(Stats::new());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_percentiles() {
        let mut s = Stats::new();
        assert_eq!(s.take_summary(), None);
        for ns in 1..=1000u64 {
            s.record(ns * 1000);
        }
        assert!(s.due());
        assert_eq!(
            s.take_summary().unwrap(),
            "job_submit timing: calls 1-1000: p50 501.0 us, p99 990.0 us, max 1000.0 us"
        );
        s.record(u64::MAX);
        assert!(!s.due());
        assert_eq!(
            s.take_summary().unwrap(),
            "job_submit timing: calls 1001-1001: p50 4294967.3 us, p99 4294967.3 us, max 4294967.3 us"
        );
        s.reset();
        s.record(2000);
        assert!(s
            .take_summary()
            .unwrap()
            .starts_with("job_submit timing: calls 1-1: p50 2.0 us"));
    }
}
