//! Atomics of the lock-free pieces: std's, or loom's under `--cfg loom` so
//! the same code is model-checked (the crossbeam pattern).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
