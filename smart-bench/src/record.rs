//! The result record: what every run reports, as JSON.

use serde::Serialize;
use smart_core::runtime::SmartState;
use smart_core::stats::VerbStats;

use crate::latency::{LatencyHistogram, LatencySummary};

/// One per-second sample of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the measured phase began.
    pub t_s: f64,
    /// Million operations per second over the last interval.
    pub mops: f64,
    /// Mean WorkReqThrot credit limit over threads.
    pub credit_limit: Option<f64>,
    /// Mean ConflictAvoid backoff cap over threads, in microseconds.
    pub backoff_cap_us: Option<f64>,
    /// Mean ConflictAvoid `n_max` over threads.
    pub n_max: Option<f64>,
}

/// The measured fields every result record carries.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Measured seconds.
    pub duration_s: f64,
    /// Operations.
    pub ops: u64,
    /// Million operations per second.
    pub throughput_mops: f64,
    /// Latency percentiles in microseconds.
    pub latency_us: LatencySummary,
    /// The latency histogram they were read from (records of several
    /// processes merge through it).
    pub latency_hist: LatencyHistogram,
    /// Work requests per operation.
    pub verbs_per_op: f64,
    /// Doorbells (batches) per operation.
    pub doorbells_per_op: f64,
    /// Retries per operation.
    pub retries_per_op: f64,
    /// Bytes READ per operation.
    pub bytes_read_per_op: f64,
    /// Bytes written per operation.
    pub bytes_written_per_op: f64,
    /// Failed coroutines plus error completions.
    pub errors: u64,
    /// Verb counters of the measured phase.
    pub verbs: VerbStats,
    /// Per thread at the end: WorkReqThrot's credit limit, ConflictAvoid's
    /// backoff cap and `n_max` (null where the technique is off).
    pub smart_state: Vec<SmartState>,
    /// One sample per second of the measured phase.
    pub timeline: Vec<Sample>,
    /// Seconds of the timeline in which no operation completed (a stall
    /// that the run's average would hide).
    pub zero_seconds: usize,
}
