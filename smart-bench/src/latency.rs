//! Latency histograms (HDR), kept per thread and merged at the end of a run.

use hdrhistogram::Histogram;
use serde::Serialize;

/// A latency histogram in nanoseconds (1 ns to 100 s, 3 significant digits).
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds"))
    }
}

/// Latency percentiles in microseconds, as the result record reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Latency {
    /// Records one latency in nanoseconds (clamped into range).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }

    /// Adds all samples of `o`.
    pub fn merge(&mut self, o: &Latency) {
        self.0.add(&o.0).expect("histograms with equal bounds merge");
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Drops all samples.
    pub fn clear(&mut self) {
        self.0.reset();
    }

    /// Percentiles over all samples, in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |q: f64| self.0.value_at_quantile(q) as f64 / 1000.0;
        LatencySummary { p50: us(0.5), p99: us(0.99), p999: us(0.999), max: self.0.max() as f64 / 1000.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_percentiles_cover_all_threads() {
        // Percentiles of the merged histogram, not averages of per-thread ones.
        let mut a = Latency::default();
        let mut b = Latency::default();
        for _ in 0..99 {
            a.record(1_000);
        }
        for _ in 0..99 {
            b.record(100_000);
        }
        b.record(5_000_000);
        a.merge(&b);
        let s = a.summary();
        assert_eq!(a.len(), 199);
        assert!((s.p50 - 1.0).abs() < 0.01 || (s.p50 - 100.0).abs() < 0.1, "{s:?}");
        assert!((s.p99 - 100.0).abs() < 0.1, "{s:?}");
        assert!((s.max - 5000.0).abs() < 5.0, "{s:?}");
    }
}
