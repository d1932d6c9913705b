//! Integration tests of smart-core through its public API (one binary).

mod alloc;
mod auth;
mod blade;
mod chaos;
mod concurrency;
mod fence;
mod frames;
mod reclaim;
mod semantics;
mod techniques;
#[cfg(feature = "verbs")]
mod verbs;
