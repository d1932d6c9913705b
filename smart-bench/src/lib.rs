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

pub mod harness;
pub mod latency;
pub mod micro;
pub mod record;
pub mod size;

pub use harness::{run, run_bench, Bench, RunConfig, RunReport, Worker};
