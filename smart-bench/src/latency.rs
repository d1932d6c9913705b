//! Latency histograms: recorded per thread in a log-linear histogram of our
//! own (the cheapest record on the operation's path), merged at the end of
//! a run, and handed to the `hdrhistogram` crate for percentiles and for
//! the record, which carries HdrHistogram's standard compressed V2
//! encoding (base64): HistogramLogAnalyzer, `hdr-plot` and the Java,
//! Python and Go HdrHistogram libraries read it.

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Significant decimal digits of the HdrHistogram a [`Latency`] becomes
/// (values within 0.1% are equivalent, as in our buckets).
pub const HDR_DIGITS: u8 = 3;

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
/// range checks and bookkeeping: 20 instructions per record against the
/// `hdrhistogram` crate's 49 (callgrind, 10^6 records of 2–202 µs). The
/// merged histogram becomes an HdrHistogram ([`Latency::hdr`]: each
/// bucket's count at its midpoint, exact below 512 ns, within 0.1% above),
/// which gives the percentiles; the maximum is kept exactly.
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

/// The encoding a [`LatencyHistogram`] names: HdrHistogram's compressed V2
/// (DEFLATE) serialization, in standard base64.
pub const HDR_ENCODING: &str = "hdrhistogram-v2-compressed-base64";

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

/// A latency histogram as the result record carries it, so that the
/// records of several processes merge exactly (percentiles of the merged
/// histogram, not averages of percentiles), and any HdrHistogram tool
/// reads it: an HdrHistogram ([`HDR_DIGITS`] significant digits) in its
/// standard compressed V2 encoding, base64.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Values are nanoseconds.
    pub unit: String,
    /// [`HDR_ENCODING`].
    pub encoding: String,
    /// Samples.
    pub count: u64,
    /// The largest sample, exactly (the HdrHistogram's is its bucket's top).
    pub max: u64,
    /// The histogram.
    pub hdr: String,
}

impl LatencyHistogram {
    /// `h` (whose largest sample was exactly `max`) as the record carries it.
    pub fn of(h: &Histogram<u64>, max: u64) -> LatencyHistogram {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new().serialize(h, &mut bytes).expect("serializing into memory");
        LatencyHistogram {
            unit: "ns".into(),
            encoding: HDR_ENCODING.into(),
            count: h.len(),
            max,
            hdr: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    /// The HdrHistogram back.
    ///
    /// # Errors
    /// Another unit or encoding, bad base64 or HdrHistogram data, or a
    /// count that differs from the histogram's.
    pub fn decode(&self) -> Result<Histogram<u64>, BadHistogram> {
        if self.unit != "ns" || self.encoding != HDR_ENCODING {
            return Err(BadHistogram(format!(
                "unit {:?} in encoding {:?}; this build reads \"ns\" in {HDR_ENCODING:?}",
                self.unit, self.encoding
            )));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.hdr)
            .map_err(|e| BadHistogram(format!("not base64: {e}")))?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| BadHistogram(format!("not an HdrHistogram V2 encoding: {e:?}")))?;
        if h.len() != self.count {
            return Err(BadHistogram(format!("the histogram holds {} samples, count says {}", h.len(), self.count)));
        }
        Ok(h)
    }
}

/// An empty HdrHistogram as [`Latency::hdr`] makes them ([`HDR_DIGITS`],
/// growing to any value): what merged histograms are added into.
pub fn empty_hdr() -> Histogram<u64> {
    Histogram::new(HDR_DIGITS).expect("3 significant digits are valid")
}

/// Percentiles of `h`, whose largest sample was exactly `max`, in
/// microseconds (a percentile is its bucket's highest equivalent value,
/// as HdrHistogram reports it, but never above `max`).
pub fn summary_of(h: &Histogram<u64>, max: u64) -> LatencySummary {
    let us = |q: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(q).min(max) as f64 / 1000.0 };
    LatencySummary { p50: us(0.5), p99: us(0.99), p999: us(0.999), max: max as f64 / 1000.0 }
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
    /// The samples as an HdrHistogram ([`HDR_DIGITS`] significant digits):
    /// each bucket's count at its midpoint (exact below 512 ns, within
    /// 0.1% above).
    pub fn hdr(&self) -> Histogram<u64> {
        let mut h = empty_hdr();
        for (i, &c) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            h.record_n(midpoint(i).min(self.max), c).expect("an auto-resizing histogram takes any value");
        }
        h
    }

    /// The largest sample.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The histogram as the record carries it.
    pub fn to_histogram(&self) -> LatencyHistogram {
        LatencyHistogram::of(&self.hdr(), self.max)
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

    /// Percentiles over all samples, in microseconds, from the
    /// HdrHistogram ([`summary_of`]).
    pub fn summary(&self) -> LatencySummary {
        summary_of(&self.hdr(), self.max)
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
        let back = h.decode().unwrap();
        assert_eq!(back, a.hdr());
        assert_eq!(summary_of(&back, h.max), a.summary());
        assert_eq!(LatencyHistogram::of(&back, h.max), h);
        // HdrHistogram's percentiles agree with our buckets' within 0.1%.
        for q in [0.1, 0.5, 0.9, 0.99] {
            let (ours, hdr) = (a.quantile(q), back.value_at_quantile(q).min(a.max()));
            assert!(ours.abs_diff(hdr) as f64 <= 0.001 * ours.max(1) as f64 + 1.0, "{q}: {ours} {hdr}");
        }
        let mut wrong = h.clone();
        wrong.count += 1;
        assert!(wrong.decode().is_err());
        let mut wrong = h.clone();
        wrong.hdr.insert(3, '!');
        assert!(wrong.decode().is_err());
        let mut wrong = h.clone();
        wrong.hdr = base64::engine::general_purpose::STANDARD.encode(b"not a histogram");
        assert!(wrong.decode().is_err());
        let mut wrong = h;
        wrong.encoding = "buckets".into();
        assert!(wrong.decode().is_err());
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
