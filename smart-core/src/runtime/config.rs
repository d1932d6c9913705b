//! The sizes of a thread's runtime and the state of its Smart techniques.

use crate::smart::SmartConfig;

/// Most WRs in one batch.
pub const MAX_BATCH: usize = 16;

/// Sizes of a thread's runtime, and the Smart techniques it applies.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// Most batches in flight at once on this thread (a coroutine waits for a
    /// free slot when all are taken).
    pub slots: usize,
    /// Local bytes per slot: bounds the READ and WRITE bytes of one batch.
    pub slot_bytes: usize,
    /// Bytes taken from a blade's heap at a time by
    /// [`Ctx::alloc`](super::Ctx::alloc).
    pub chunk_bytes: u64,
    /// Coroutines the thread will run (the ceiling of `n_max`).
    pub coroutines: usize,
    /// The Smart techniques.
    pub smart: SmartConfig,
    /// A batch with no completion after this long fails with
    /// [`Error::Timeout`](crate::Error::Timeout) (its slot stays reserved
    /// for a late completion); `None`: wait forever.
    pub request_timeout: Option<std::time::Duration>,
    /// The owner this thread's connections name to the memory blades (0:
    /// none), so that [`Ctx::revoke`](super::Ctx::revoke) of it elsewhere
    /// makes the blades refuse them (see [`crate::fence`]).
    pub fence_tag: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            slots: 256,
            slot_bytes: 16 << 10,
            chunk_bytes: 1 << 20,
            coroutines: 8,
            smart: SmartConfig::default(),
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
            fence_tag: 0,
        }
    }
}

/// The adaptive state of the Smart techniques on one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SmartState {
    /// WorkReqThrot: the credit limit in force.
    pub credit_limit: Option<u32>,
    /// ConflictAvoid: the backoff cap in nanoseconds.
    pub backoff_cap_ns: Option<u64>,
    /// ConflictAvoid: coroutines allowed inside an operation.
    pub n_max: Option<usize>,
    /// ConflictAvoid: C0 in nanoseconds (the measured round trip when
    /// calibrated).
    pub backoff_base_ns: Option<u64>,
}

/// The default request time-out: far above any round trip, short enough
/// that a frozen blade is noticed.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often the executor looks for batches past the request time-out.
pub(super) const EXPIRE_EVERY_NS: u64 = 20_000_000;

/// How often the executor ticks the tuner and the backoff controller.
pub(super) const TICK_NS: u64 = 50_000;
