//! Latency histograms (log-linear, as HDR histograms), kept per thread and
//! merged at the end of a run.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two: 2^9, so a bucket spans under 0.2% of its
/// values, and its midpoint is within 0.1% of any of them.
const SUB_BITS: u32 = 9;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below `SUB` exactly, then `SUB` per power of two up to
/// 2^64.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// A latency histogram in nanoseconds.
///
/// Recording is on every operation's path, so it is one log-linear bucket
/// increment (a leading-zero count, a shift, an add), the same structure as
/// an HDR histogram with 2^9 sub-buckets per power of two but without its
/// range checks and bookkeeping, which cost ~130 instructions per record
/// (measured with callgrind on `compute-blade micro`). Percentiles are
/// bucket midpoints: exact below 512 ns, within 0.1% above; the maximum is
/// exact.
#[derive(Debug, Clone)]
pub struct Latency {
    counts: Box<[u64]>,
    n: u64,
    max: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { counts: vec![0; BUCKETS].into_boxed_slice(), n: 0, max: 0 }
    }
}

#[inline]
fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // ≥ SUB_BITS
    let m = (v >> (e - SUB_BITS)) as usize & (SUB - 1);
    (e - SUB_BITS + 1) as usize * SUB + m
}

/// The middle of bucket `i`'s values.
fn midpoint(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let e = (i / SUB) as u32 + SUB_BITS - 1;
    let m = (i % SUB) as u64;
    let shift = e - SUB_BITS;
    let low = (SUB as u64 + m) << shift;
    low + ((1u64 << shift) >> 1)
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

/// A [`Latency`] histogram as the result record carries it, so that the
/// records of several processes merge exactly (percentiles of the merged
/// histogram, not averages of percentiles): its non-empty buckets as
/// `[index, count]` pairs, with the bucket scheme named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Values are nanoseconds.
    pub unit: String,
    /// Sub-buckets per power of two, as a power of two (the scheme: bucket
    /// `i < 2^sub_bits` holds value `i`; above, `2^sub_bits` buckets per
    /// power of two).
    pub sub_bits: u32,
    /// Samples.
    pub count: u64,
    /// The largest sample, exactly.
    pub max: u64,
    /// Non-empty buckets: `[index, count]`.
    pub buckets: Vec<[u64; 2]>,
}

/// Why a serialized histogram cannot be read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadHistogram(pub String);

impl std::fmt::Display for BadHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "latency histogram: {}", self.0)
    }
}

impl std::error::Error for BadHistogram {}

impl Latency {
    /// The histogram as the record carries it.
    pub fn to_histogram(&self) -> LatencyHistogram {
        let buckets = self.counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, c)| [i as u64, *c]).collect();
        LatencyHistogram { unit: "ns".into(), sub_bits: SUB_BITS, count: self.n, max: self.max, buckets }
    }

    /// Reads a serialized histogram back.
    ///
    /// # Errors
    /// Another unit or bucket scheme, a bucket out of range, or counts that
    /// do not add up to `count`.
    pub fn from_histogram(h: &LatencyHistogram) -> Result<Latency, BadHistogram> {
        if h.unit != "ns" || h.sub_bits != SUB_BITS {
            return Err(BadHistogram(format!(
                "unit {:?} with {} sub-bucket bits; this build reads \"ns\" with {SUB_BITS}",
                h.unit, h.sub_bits
            )));
        }
        let mut l = Latency::default();
        for &[i, c] in &h.buckets {
            let slot = l.counts.get_mut(i as usize).ok_or_else(|| BadHistogram(format!("bucket {i} out of range")))?;
            *slot += c;
            l.n += c;
        }
        if l.n != h.count {
            return Err(BadHistogram(format!("buckets hold {} samples, count says {}", l.n, h.count)));
        }
        l.max = h.max;
        Ok(l)
    }

    /// Records one latency in nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket(ns)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
    }

    /// Adds all samples of `o`.
    pub fn merge(&mut self, o: &Latency) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.n += o.n;
        self.max = self.max.max(o.max);
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Drops all samples.
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.n = 0;
        self.max = 0;
    }

    /// Percentiles over all samples, in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |q: f64| self.quantile(q) as f64 / 1000.0;
        LatencySummary { p50: us(0.5), p99: us(0.99), p999: us(0.999), max: self.max as f64 / 1000.0 }
    }

    /// The smallest recorded value (as its bucket's midpoint, at most the
    /// maximum) with at least a fraction `q` of the samples at or below it.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return midpoint(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_below_512_and_within_a_tenth_of_a_percent_above() {
        for v in (0..512).chain([512, 513, 1000, 12_345, 999_999, 1 << 40, u64::MAX]) {
            let mid = midpoint(bucket(v));
            let err = mid.abs_diff(v) as f64 / (v.max(1) as f64);
            assert!(err <= 0.001, "{v} → bucket {} → {mid}", bucket(v));
        }
        for v in 0..512 {
            assert_eq!(midpoint(bucket(v)), v);
        }
        assert!(bucket(u64::MAX) < BUCKETS);
        // Monotone: a larger value never lands in a lower bucket.
        let mut last = 0;
        for v in (0..100_000u64).step_by(7) {
            assert!(bucket(v) >= last);
            last = bucket(v);
        }
    }

    #[test]
    fn a_serialized_histogram_reads_back_the_same_and_bad_ones_are_refused() {
        let mut a = Latency::default();
        for v in [0, 5, 511, 512, 9_999, 1 << 33] {
            for _ in 0..=v % 7 {
                a.record(v);
            }
        }
        let h = a.to_histogram();
        let b = Latency::from_histogram(&h).unwrap();
        assert_eq!(b.to_histogram(), h);
        assert_eq!((b.summary(), b.len()), (a.summary(), a.len()));
        let mut wrong = h.clone();
        wrong.count += 1;
        assert!(Latency::from_histogram(&wrong).is_err());
        let mut wrong = h.clone();
        wrong.buckets.push([BUCKETS as u64, 1]);
        wrong.count += 1;
        assert!(Latency::from_histogram(&wrong).is_err());
        let mut wrong = h;
        wrong.sub_bits = 7;
        assert!(Latency::from_histogram(&wrong).is_err());
    }

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
