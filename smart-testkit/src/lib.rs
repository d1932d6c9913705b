//! # smart-testkit
//!
//! Test helpers shared by every Smart-rs crate (a dev-dependency only):
//!
//! * [`backends`]: the backend matrix (embedded, embedded with chaos, a real
//!   memory-blade server on loopback TCP in this process, and real RDMA
//!   where a device is named), so every application's tests run on all of
//!   them;
//! * [`die`]: a client killed in process at a chosen await point;
//! * [`lin`]: a linearizability checker for register histories;
//! * [`oracle`]: operation sequences checked against a `BTreeMap` for any
//!   [`KvIndex`](smart_core::KvIndex).

pub mod backends;
pub mod die;
pub mod lin;
pub mod oracle;

pub use backends::Backend;
