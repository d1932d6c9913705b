//! Errors of the table.

use smart_core::GlobalAddr;

use crate::layout;

/// Errors of the table.
#[derive(Debug, thiserror::Error)]
pub enum RaceError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// Both candidate buckets of the key are full and its subtable is at
    /// the largest depth.
    #[error("both buckets of the key are full and the table is at its largest depth ({})", layout::MAX_DEPTH)]
    Full,
    /// A KV block stayed torn or garbled over many re-reads.
    #[error("KV block at {0} failed its CRC on every re-read: it is damaged (blocks are written whole before they are published)")]
    Torn(GlobalAddr),
    /// The key and value do not fit one KV block that a batch can carry.
    #[error("a key of {key} bytes and a value of {value} bytes exceed the {max} bytes a KV block can hold")]
    TooLarge {
        /// Key bytes asked.
        key: usize,
        /// Value bytes asked.
        value: usize,
        /// Most key + value bytes (see [`crate::RaceHt::max_kv_bytes`]).
        max: usize,
    },
    /// The table was dropped (`RaceHt::drop_table`) while this client held
    /// it.
    #[error("the table was dropped (its memory is being reused)")]
    Dropped,
    /// A lock this client held (a split lock or the directory lock) was
    /// taken over while it worked (it stalled for longer than the lease
    /// between two renewals): it stops, having published nothing, and the
    /// taker finishes the split from the frozen subtable. The operation
    /// that was growing the table starts over.
    #[error("a split or directory lock was taken over while this client held it (now {0:#x}): a stall longer than the lease")]
    LeaseLost(u64),
    /// The remote structure is not what this table expects.
    #[error("table {0}")]
    Corrupt(String),
}

/// Result with [`RaceError`].
pub type Result<T, E = RaceError> = std::result::Result<T, E>;
