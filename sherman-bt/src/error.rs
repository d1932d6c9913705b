//! Errors of the tree.

use smart_core::GlobalAddr;

/// Errors of the tree.
#[derive(Debug, thiserror::Error)]
pub enum ShermanError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// A key or value of a size the tree does not store.
    #[error(
        "this B+tree stores keys of up to {key_max} bytes and values of up to {value_max} (asked {key} and \
         {value} bytes); its sizes are set when it is created"
    )]
    Size {
        /// Key bytes asked.
        key: usize,
        /// Value bytes asked.
        value: usize,
        /// The tree's longest key.
        key_max: usize,
        /// The tree's longest value.
        value_max: usize,
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
    /// The tree was dropped (`compute-blade table drop`).
    #[error("the B+tree was dropped")]
    Dropped,
    /// The remote structure is not what the tree expects.
    #[error("B+tree corrupt: {0}")]
    Corrupt(String),
}

/// Result with [`ShermanError`].
pub type Result<T, E = ShermanError> = std::result::Result<T, E>;
