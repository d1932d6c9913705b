//! The table's shape and timing parameters.

use std::time::Duration;

/// Shape of a new table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaceConfig {
    /// Initial global depth: 2^depth subtables.
    pub depth: u32,
    /// Bucket groups per subtable (2 main buckets each), fixed for the
    /// table's life.
    pub groups: u64,
}

impl RaceConfig {
    /// A table sized for about `keys` keys at ~50% slot load (it grows
    /// beyond that by splitting subtables).
    pub fn for_keys(keys: u64) -> RaceConfig {
        // 3 buckets × 7 slots per group; aim for 2× headroom.
        let groups_total = keys.saturating_mul(2).div_ceil(21).max(16);
        let depth = (groups_total / 4096).next_power_of_two().trailing_zeros().min(12);
        RaceConfig { depth, groups: groups_total.div_ceil(1 << depth).max(4) }
    }
}

/// How long a split lock or the directory lock may stay exactly the same
/// (holder and beat) before a waiter concludes that its holder died, takes
/// it over and finishes (or redoes) the split. A live holder renews it
/// between the steps of a split, which take milliseconds.
pub const RESIZE_LEASE: Duration = Duration::from_secs(2);

/// Longest gap between two observations of a lock that still counts as
/// watching it: a waiter that was itself stalled for longer (descheduled,
/// or a whole emulated machine paused) restarts its lease clock, since its
/// holder may have been stalled just as long.
pub(crate) const WATCH_GAP: Duration = Duration::from_millis(250);

/// How long an operation waits for frozen subtables in all before it fails
/// (a holder that keeps renewing its lease yet never finishes).
pub const SPLIT_STALL: Duration = Duration::from_secs(30);

/// First pause after meeting a frozen subtable (doubling to [`PAUSE_MAX_NS`]).
pub(crate) const PAUSE_NS: u64 = 10_000;
pub(crate) const PAUSE_MAX_NS: u64 = 1_000_000;

/// Most fingerprint-matching blocks read in one doorbell.
pub(crate) const READ_CHUNK: usize = 12;
/// Re-reads of a torn KV block before giving up.
pub(crate) const TORN_RETRIES: usize = 16;
