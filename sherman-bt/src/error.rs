//! Errors of the tree.

use smart_core::GlobalAddr;

/// Errors of the tree.
#[derive(Debug, thiserror::Error)]
pub enum ShermanError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// A key or value of a size the tree does not store.
    #[error("the B+tree stores 8-byte keys and 8-byte values (asked {key} and {value} bytes)")]
    Size {
        /// Key bytes asked.
        key: usize,
        /// Value bytes asked.
        value: usize,
    },
    /// A page stayed torn over every re-read.
    #[error("page at {0} failed its line checks on every one of {n} reads: damaged, or left half-written by a writer that died", n = crate::TORN_RETRIES)]
    Torn(GlobalAddr),
    /// The tree cannot be used as asked.
    #[error("{0}")]
    Config(String),
    /// A page lock this client held was taken over by a waiter elsewhere
    /// (this client stalled for a lease and was taken for dead): nothing
    /// was written under it; the operation starts over.
    #[error("the lock of page {0} was taken over while this client stalled (lease lost)")]
    LeaseLost(GlobalAddr),
    /// The remote structure is not what the tree expects.
    #[error("B+tree corrupt: {0}")]
    Corrupt(String),
}

/// Result with [`ShermanError`].
pub type Result<T, E = ShermanError> = std::result::Result<T, E>;
