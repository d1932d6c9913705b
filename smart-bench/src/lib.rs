//! # smart-bench
//!
//! What every Smart-rs benchmark shares, kept out of the framework
//! (`smart-core`) and out of the applications:
//!
//! * [`harness`]: T worker threads × C coroutines on one transport, a warmup,
//!   a timed run with a progress line per second, and a report merged over
//!   all threads; benchmarks implement [`harness::Bench`].
//! * [`record`] and [`latency`]: the result record's measured fields and the
//!   HDR latency histograms behind its percentiles.
//! * [`size`]: byte sizes with suffixes, as the command line takes them.
//! * [`micro`]: the verbs micro-benchmark (`compute-blade micro`).
//!
//! Dependencies point down: the binaries and the workloads (`ycsb`) use this
//! crate; the applications (`race-ht`, …) do not.
//!
//! ## Example
//!
//! Two threads × four coroutines, each doing 100 FAAs on one word, with the
//! harness's report:
//!
//! ```
//! use std::time::Duration;
//! use smart_bench::harness::{run, RunConfig};
//! use smart_core::{EmbeddedTransport, GlobalAddr};
//! let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
//! let cfg = RunConfig { threads: 2, coroutines: 4, warmup: Duration::ZERO, ..RunConfig::default() };
//! let word = GlobalAddr::new(0, 4096); // the heap's first word, unused here
//! let report = run(&t, &cfg, move |w| async move {
//!     for _ in 0..100 {
//!         let t0 = w.now();
//!         w.ctx().faa(word, 1).await?;
//!         w.record(t0, 1);
//!     }
//!     Ok(())
//! })
//! .unwrap();
//! assert_eq!(report.errors, 0);
//! assert!(report.ops <= 800);
//! ```

#![warn(missing_docs)]

pub mod harness;
pub mod latency;
pub mod micro;
pub mod record;
pub mod size;

pub use harness::{run, run_bench, Bench, RunConfig, RunReport, Worker};

/// A number in `0..n` from 64 random bits (multiply-shift: one multiply,
/// no division or rejection loop; its bias, below n / 2^64, is nil for the
/// workloads' ranges). Per-operation draws use it instead of `random_range`.
#[inline]
pub fn below(r: u64, n: u64) -> u64 {
    ((u128::from(r) * u128::from(n)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::below;

    #[test]
    fn below_stays_in_range_and_spreads() {
        let mut seen = [0u32; 5];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            seen[below(x, 5) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 1500), "{seen:?}");
        assert_eq!(below(u64::MAX, 7), 6);
        assert_eq!(below(0, 7), 0);
    }
}
