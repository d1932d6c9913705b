//! # smart-core
//!
//! One-sided RDMA verbs (READ, WRITE, CAS, FAA) with a coroutine API, on
//! interchangeable backends, for memory-disaggregated applications: the
//! framework of Smart (Ren et al., ASPLOS '24) re-implemented in Rust.
//!
//! * [`GlobalAddr`] names a byte on a memory blade.
//! * A [`Transport`] connects to the memory blades (embedded in this process,
//!   a `memory-blade` over TCP, or RDMA verbs); each worker thread opens an
//!   [`Endpoint`](backend::Endpoint): its CQ, a QP per blade, registered
//!   local memory.
//! * A [`Runtime`] per worker thread runs many coroutines (futures) on that
//!   endpoint; they build [`Batch`]es of WRs (one batch = one doorbell to one
//!   QP) and await their completion. When no coroutine can run, the runtime
//!   polls the CQ and wakes the coroutines whose batches completed.
//! * [`KvIndex`] is what every key-value index (the RACE hash table, the
//!   Sherman B+tree) offers the workloads.
//! * [`layout`] fixes the blade's superblock (heap pointer, named roots);
//!   [`Ctx::alloc`] sub-allocates chunks taken from it by FAA.
//!
//! ```
//! use std::sync::Arc;
//! use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig, Transport};
//!
//! let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(1, 1 << 20).unwrap());
//! let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
//! let ctx = rt.ctx();
//! let v = rt.block_on(async move {
//!     let a = ctx.alloc(0, 64, 8).await.unwrap();
//!     ctx.write(a, &7u64.to_le_bytes()).await.unwrap();
//!     ctx.faa(a, 5).await.unwrap();
//!     ctx.read_u64(a).await.unwrap()
//! });
//! assert_eq!(v, 12);
//! ```
//!
//! Consistency model (as on an RNIC; Ziegler et al., SIGMOD '23): only 8-byte aligned CAS
//! and FAA are atomic; a READ or WRITE of more than 8 bytes may tear at
//! 8-byte granularity; WRs of one QP execute in order; nothing is ordered
//! across QPs or blades.

#![warn(missing_docs)]

pub mod addr;
pub mod backend;
pub mod barrier;
pub mod blade;
pub mod clock;
pub mod crc;
mod error;
pub mod fence;
pub mod hash;
pub mod index;
pub mod kvblock;
pub mod layout;
mod primitive;
pub mod reclaim;
pub mod region;
pub mod runtime;
pub mod secret;
pub mod smart;
pub mod stats;
pub mod verbs;
pub mod wire;

pub use addr::GlobalAddr;
pub use backend::{
    BladeInfo, ChaosConfig, EmbeddedTransport, Fencing, Simulation, TcpTransport, ThreadSpec, Transport,
};
pub use error::{Error, Result};
pub use index::{Audit, IndexStats, KvIndex};
pub use runtime::{Batch, Ctx, Done, Runtime, RuntimeConfig};
pub use verbs::{Completion, Opcode, WcStatus, WorkRequest};
