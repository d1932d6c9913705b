//! Per-thread verb counters, merged at the end of a run.

use serde::Serialize;

/// Counters of what one thread posted (kept per thread, merged at the end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerbStats {
    /// READ work requests.
    pub reads: u64,
    /// WRITE work requests.
    pub writes: u64,
    /// CAS work requests.
    pub cas: u64,
    /// FAA work requests.
    pub faa: u64,
    /// All work requests.
    pub wrs: u64,
    /// Doorbells rung (= batches posted).
    pub doorbells: u64,
    /// Bytes fetched by READs.
    pub bytes_read: u64,
    /// Bytes sent by WRITEs.
    pub bytes_written: u64,
    /// Batches that completed with an error.
    pub error_completions: u64,
    /// Unsuccessful attempts reported with `OpGuard::retry`.
    pub retries: u64,
    /// Nanoseconds of backoff drawn for those retries.
    pub backoff_ns: u64,
    /// Operations that waited at ConflictAvoid's key gate for another of
    /// the thread's operations on the same key.
    pub key_waits: u64,
    /// Operations (ended [`OpGuard`](crate::runtime::OpGuard)s) by their
    /// retries: 0, 1, 2, 3–4, 5–8, 9–16, 17–32, more (the distribution
    /// behind `retries`).
    pub ops_by_retries: [u64; RETRY_BUCKETS],
}

/// Buckets of [`VerbStats::ops_by_retries`].
pub const RETRY_BUCKETS: usize = 8;

/// The bucket of an operation that retried `n` times.
#[inline]
pub fn retry_bucket(n: u32) -> usize {
    match n {
        0 => 0,
        1 => 1,
        n => (1 + (32 - (n - 1).leading_zeros()) as usize).min(RETRY_BUCKETS - 1),
    }
}

impl VerbStats {
    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &VerbStats) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.cas += o.cas;
        self.faa += o.faa;
        self.wrs += o.wrs;
        self.doorbells += o.doorbells;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.error_completions += o.error_completions;
        self.retries += o.retries;
        self.backoff_ns += o.backoff_ns;
        self.key_waits += o.key_waits;
        for (a, b) in self.ops_by_retries.iter_mut().zip(o.ops_by_retries) {
            *a += b;
        }
    }

    /// What happened after the snapshot `earlier` was taken.
    pub fn since(&self, earlier: &VerbStats) -> VerbStats {
        VerbStats {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            cas: self.cas - earlier.cas,
            faa: self.faa - earlier.faa,
            wrs: self.wrs - earlier.wrs,
            doorbells: self.doorbells - earlier.doorbells,
            bytes_read: self.bytes_read - earlier.bytes_read,
            bytes_written: self.bytes_written - earlier.bytes_written,
            error_completions: self.error_completions - earlier.error_completions,
            retries: self.retries - earlier.retries,
            backoff_ns: self.backoff_ns - earlier.backoff_ns,
            key_waits: self.key_waits - earlier.key_waits,
            ops_by_retries: std::array::from_fn(|i| self.ops_by_retries[i] - earlier.ops_by_retries[i]),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_a_snapshot() {
        let a = VerbStats { reads: 5, wrs: 7, doorbells: 3, ops_by_retries: [1; 8], ..Default::default() };
        let b = VerbStats { reads: 9, wrs: 12, doorbells: 4, ops_by_retries: [3; 8], ..Default::default() };
        let d = b.since(&a);
        assert_eq!((d.reads, d.wrs, d.doorbells, d.ops_by_retries), (4, 5, 1, [2; 8]));
        let mut m = a;
        m.merge(&d);
        assert_eq!(m, b);
    }

    #[test]
    fn retry_buckets_are_powers_of_two() {
        let got: Vec<usize> = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 1000].iter().map(|&n| retry_bucket(n)).collect();
        assert_eq!(got, [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]);
    }
}
