//! The RDMA verbs backend (cargo feature `verbs`, through `rdma-sys`).
//!
//! Real RC QPs on an RNIC (ConnectX, or Soft-RoCE `rxe` on any Linux host
//! whose kernel has it). The layout follows Smart (its thread-aware resource allocation):
//!
//! * One device context, protection domain and memory registration shared
//!   by all threads: the compute side's local buffers are one registered
//!   pool (2 MiB huge pages when available), each thread using a slice.
//! * Per thread: its own CQ, and with `per-thread-db` a *thread domain*
//!   (`ibv_alloc_td` + `ibv_alloc_parent_domain`), which gives its QPs a
//!   doorbell of their own with no lock. Where the provider lacks thread
//!   domains, QPs are created in the order the provider binds doorbells
//!   (see [`QpPlan`](crate::smart::QpPlan)).
//! * One RC QP per (thread, blade), INIT → RTR → RTS. Connection data
//!   (QPN, PSN, LID, GID) is exchanged over the memory blade's TCP port, with
//!   the same versioned handshake as the TCP backend ([`crate::wire::conn`]).
//! * A batch is one `ibv_post_send` of a chained WR list with only the last
//!   WR signalled ([`plan`]); small WRITEs go inline. The CQ is polled by the
//!   runtime's executor, and completion errors map to [`WcStatus`](crate::WcStatus)
//!   ([`status`]). A failed batch yields several CQEs (its later WRs, and
//!   all WRs posted after it, come back flushed); `track` turns them into
//!   exactly one completion per batch.
//!
//! Everything that needs no device (connection data, WR planning, status
//! mapping, device and GID choice, completion tracking) is in modules compiled and tested without
//! the feature. The FFI lives in `ffi` (feature `verbs` only), the one
//! module with `unsafe` calls into libibverbs.

pub mod device;
pub mod plan;
pub mod status;
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
mod track;

#[cfg(feature = "verbs")]
mod ffi;
#[cfg(feature = "verbs")]
mod transport;

#[cfg(feature = "verbs")]
pub use transport::{probe, VerbsBlade, VerbsConfig, VerbsTransport};

/// How to say that this build has no verbs backend.
pub const NOT_BUILT: &str =
    "this build has no RDMA verbs backend: rebuild with `cargo build --release --features verbs` \
     (needs libibverbs-dev, librdmacm-dev, libclang-dev, pkg-config), or use the embedded backend (omit --blades) \
     or --transport tcp against a memory-blade";

/// What to say when no RDMA device is present.
pub const NO_DEVICE_HELP: &str = "no RDMA device found. Alternatives: the embedded backend (omit --blades), \
     --transport tcp against a memory-blade, or Soft-RoCE on a Linux host whose kernel has rdma_rxe: \
     `sudo rdma link add rxe0 type rxe netdev IFACE` (see README, 'RDMA verbs')";
