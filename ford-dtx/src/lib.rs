//! FORD distributed transactions (Zhang et al., "FORD: Fast One-sided
//! RDMA-based Distributed Transactions for Disaggregated Persistent
//! Memory", FAST '22) on smart-core: Smart-DTX when the Smart techniques are
//! on, the FORD+ baseline with `--smart none`, on the same runtime.
//!
//! | module | what |
//! |---|---|
//! | [`layout`] | records, buckets, lock words, the undo log, the catalog and registry, declared once |
//! | [`db`] | a database's tables over n ≥ k blades with k replicas, its catalog |
//! | [`registry`] | compute blades' leases, log areas and owner ids |
//! | [`dtx`] | a compute thread's handle: its view of the address cache, counters |
//! | `cache` | the address cache: key prints per bucket slot, shared by a process's threads |
//! | [`txn`] | the protocol: execute, undo log + validation, commit with flushes, unlock |
//! | `round` | a round trip: one batch per blade, posted together |
//! | [`recovery`] | rolling dead compute blades' transactions back or forward; the audit |
//! | [`repair`] | damaged records restored from their other replicas |
//! | [`rebuild`] | a lost memory blade's copies written again from the other replicas |
//! | [`mirror`] | the mirrors on the other blades of what blade 0 alone holds (catalog, load mark, registrations), for a rebuild of blade 0 |
//! | [`error`] | errors and abort causes |
//!
//! Addresses read from the blades (the catalog's replicas and registry, a
//! registry slot's log area, an overflow chain's links and mirrors) are
//! checked to name a place on one of the database's blades before they are
//! used ([`db::stored_addr`]): damaged memory is reported as
//! [`error::DtxError::Corrupt`] where it is read.
//!
//! ```
//! # use std::sync::Arc;
//! # use std::time::Duration;
//! # use smart_core::*;
//! use ford_dtx::{db::{Db, DbSpec, TableSpec}, Registration};
//! let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(2, 8 << 20).unwrap());
//! let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
//! let ctx = rt.ctx();
//! let spec = DbSpec {
//!     name: "doc".into(),
//!     tables: vec![TableSpec { name: "accounts".into(), value_size: 8, rows: 100 }],
//!     replicas: 2,
//! };
//! let c = ctx.clone();
//! let db = Arc::new(rt.block_on(async move { Db::create(&c, &spec).await }).unwrap().0);
//! let reg = Registration::register(t.clone(), db, 1, 1, Duration::from_secs(5)).unwrap();
//! let dtx = reg.open_thread(ctx);
//! rt.block_on(async move {
//!     let mut tx = dtx.txn(0);
//!     tx.begin();
//!     let a = tx.insert(0, 42);
//!     tx.execute().await.unwrap();
//!     tx.write(a, &100u64.to_le_bytes());
//!     tx.commit().await.unwrap();
//!
//!     tx.begin();
//!     let a = tx.update(0, 42);
//!     tx.execute().await.unwrap();
//!     let v = u64::from_le_bytes(tx.value(a).try_into().unwrap());
//!     tx.write(a, &(v + 1).to_le_bytes());
//!     tx.commit().await.unwrap();
//! });
//! reg.close(&*t).unwrap();
//! ```

#![warn(missing_docs)]

mod cache;
pub mod db;
pub mod dtx;
pub mod error;
pub mod layout;
pub mod mirror;
pub mod rebuild;
pub mod recovery;
pub mod registry;
pub mod rejoin;
pub mod repair;
mod round;
pub mod txn;

pub use dtx::{Dtx, DtxStats};
pub use error::{Abort, DtxError, TxnError};
pub use registry::Registration;
pub use txn::{ItemId, Kind, Txn};
