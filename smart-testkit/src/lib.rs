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
//!
//! ## Example
//!
//! A history of one register checked for linearizability:
//!
//! ```
//! use smart_testkit::lin::{linearizable, Event};
//! let w = |start, end, value| Event { start, end, write: true, value };
//! let r = |start, end, value| Event { start, end, write: false, value };
//! // A write of 1 overlaps a read that saw it: fine.
//! assert!(linearizable(&[w(0, 10, 1), r(5, 15, 1)], 0).is_ok());
//! // A read that saw 1 before the write of 1 began: not linearizable.
//! assert!(linearizable(&[r(0, 4, 1), w(5, 10, 1)], 0).is_err());
//! ```

#![warn(missing_docs)]

pub mod backends;
pub mod die;
pub mod etcd;
pub mod lin;
pub mod oracle;

pub use backends::Backend;
