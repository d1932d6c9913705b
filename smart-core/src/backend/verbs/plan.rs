//! Turning a batch of [`WorkRequest`]s into the WR list of one
//! `ibv_post_send`, without a device.
//!
//! * Opcodes map to RDMA READ, RDMA WRITE, ATOMIC CMP_AND_SWP and
//!   FETCH_AND_ADD.
//! * The local side is the thread's slice of the registered pool:
//!   `local_base + local_off` under the pool's lkey.
//! * The remote side is `blade base + offset` under the blade's rkey. The
//!   RNIC checks bounds and keys, and faults come back as error completions.
//! * Only the last WR is signalled (one CQE per batch, as Smart does). An
//!   error completion arrives even for an unsignalled WR, so every WR
//!   carries the batch's `wr_id` plus its index in bits 48..56, and the
//!   failing index can be reported.
//! * WRITEs of at most `max_inline` bytes are sent inline.

use crate::verbs::{Opcode, WorkRequest};
use crate::wire::conn::BladeVerbsInfo;

/// `IBV_WR_RDMA_WRITE`.
pub const WR_RDMA_WRITE: u32 = 0;
/// `IBV_WR_RDMA_READ`.
pub const WR_RDMA_READ: u32 = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const WR_ATOMIC_CMP_AND_SWP: u32 = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
/// `IBV_SEND_SIGNALED`.
pub const SEND_SIGNALED: u32 = 2;
/// `IBV_SEND_INLINE`.
pub const SEND_INLINE: u32 = 8;

/// Bits of a verbs `wr_id` that hold the runtime's batch id.
pub const BATCH_ID_BITS: u32 = 48;

/// One WR ready for `ibv_send_wr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PlannedWr {
    /// Batch id | index << 48.
    pub wr_id: u64,
    /// `ibv_wr_opcode`.
    pub opcode: u32,
    /// `ibv_send_flags`.
    pub send_flags: u32,
    /// Local virtual address.
    pub local_addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the pool.
    pub lkey: u32,
    /// Remote virtual address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// CAS expected value / FAA addend.
    pub compare_add: u64,
    /// CAS new value.
    pub swap: u64,
}

/// Splits a verbs `wr_id` into the batch id and the WR's index.
pub fn split_wr_id(wr_id: u64) -> (u64, u16) {
    (wr_id & ((1 << BATCH_ID_BITS) - 1), (wr_id >> BATCH_ID_BITS) as u16)
}

/// Plans `wrs` into `out` (which must be at least as long); returns how many.
///
/// # Panics
/// If `wr_id` uses bits above 48, or `out` is too short.
pub fn plan_batch(
    wrs: &[WorkRequest],
    wr_id: u64,
    local_base: u64,
    lkey: u32,
    blade: &BladeVerbsInfo,
    max_inline: u32,
    out: &mut [PlannedWr],
) -> usize {
    assert!(wr_id >> BATCH_ID_BITS == 0, "batch ids fit 48 bits");
    assert!(out.len() >= wrs.len(), "room for every WR");
    let last = wrs.len().saturating_sub(1);
    for (i, (w, p)) in wrs.iter().zip(out.iter_mut()).enumerate() {
        let opcode = match w.op {
            Opcode::Read => WR_RDMA_READ,
            Opcode::Write => WR_RDMA_WRITE,
            Opcode::Cas => WR_ATOMIC_CMP_AND_SWP,
            Opcode::Faa => WR_ATOMIC_FETCH_AND_ADD,
        };
        let mut send_flags = if i == last { SEND_SIGNALED } else { 0 };
        if w.op == Opcode::Write && w.len <= max_inline {
            send_flags |= SEND_INLINE;
        }
        *p = PlannedWr {
            wr_id: wr_id | (i as u64) << BATCH_ID_BITS,
            opcode,
            send_flags,
            local_addr: local_base + u64::from(w.local_off),
            length: w.len,
            lkey,
            // Wrapping: a bad offset yields an address outside the MR,
            // which the RNIC rejects with a remote access error.
            remote_addr: blade.base.wrapping_add(w.remote.offset()),
            rkey: w.rkey,
            compare_add: w.compare_add,
            swap: w.swap,
        };
    }
    wrs.len()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::GlobalAddr;

    fn wr(op: Opcode, off: u64, local_off: u32, len: u32) -> WorkRequest {
        WorkRequest { op, local_off, len, remote: GlobalAddr::new(1, off), rkey: 77, compare_add: 5, swap: 6 }
    }

    #[test]
    fn batches_map_opcodes_addresses_and_signalling() {
        let blade = BladeVerbsInfo { base: 0x1000_0000, size: 1 << 20, rkey: 77, lid: 1, mtu: 5, gid: [0; 16] };
        let wrs = [
            wr(Opcode::Write, 64, 0, 32),
            wr(Opcode::Write, 128, 32, 512),
            wr(Opcode::Cas, 8, 544, 8),
            wr(Opcode::Faa, 16, 552, 8),
            wr(Opcode::Read, 4096, 560, 1024),
        ];
        let mut out = [PlannedWr::default(); 8];
        let n = plan_batch(&wrs, 0xabc, 0x7000_0000, 9, &blade, 64, &mut out);
        assert_eq!(n, 5);
        let ops: Vec<u32> = out[..n].iter().map(|p| p.opcode).collect();
        assert_eq!(ops, [WR_RDMA_WRITE, WR_RDMA_WRITE, WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD, WR_RDMA_READ]);
        let flags: Vec<u32> = out[..n].iter().map(|p| p.send_flags).collect();
        assert_eq!(flags, [SEND_INLINE, 0, 0, 0, SEND_SIGNALED], "small WRITE inline; only the last signalled");
        assert_eq!(out[4].remote_addr, 0x1000_1000);
        assert_eq!(out[4].local_addr, 0x7000_0230);
        assert_eq!((out[4].lkey, out[4].rkey, out[4].length), (9, 77, 1024));
        assert_eq!((out[2].compare_add, out[2].swap), (5, 6));
        assert_eq!(split_wr_id(out[3].wr_id), (0xabc, 3));
        assert_eq!(split_wr_id(out[0].wr_id), (0xabc, 0));
    }

    #[test]
    fn a_single_wr_is_signalled() {
        let blade = BladeVerbsInfo { base: 0, size: 1 << 20, rkey: 1, lid: 0, mtu: 1, gid: [0; 16] };
        let mut out = [PlannedWr::default(); 1];
        plan_batch(&[wr(Opcode::Write, 0, 0, 8)], 1, 0, 0, &blade, 0, &mut out);
        assert_eq!(out[0].send_flags, SEND_SIGNALED, "inline off when max_inline is 0");
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn constants_match_libibverbs() {
        use rdma_sys::{ibv_send_flags, ibv_wr_opcode};
        assert_eq!(WR_RDMA_WRITE, ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(WR_RDMA_READ, ibv_wr_opcode::IBV_WR_RDMA_READ);
        assert_eq!(WR_ATOMIC_CMP_AND_SWP, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP);
        assert_eq!(WR_ATOMIC_FETCH_AND_ADD, ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD);
        assert_eq!(SEND_SIGNALED, ibv_send_flags::IBV_SEND_SIGNALED.0);
        assert_eq!(SEND_INLINE, ibv_send_flags::IBV_SEND_INLINE.0);
    }
}
