//! Work requests and completions: the vocabulary every backend speaks.
//!
//! A *batch* is a list of [`WorkRequest`]s posted to one QP with one doorbell.
//! The WRs of a batch execute in order and the batch completes as a whole
//! (only its last WR is signalled, as Smart does), producing one
//! [`Completion`] that carries the batch's `wr_id`.

use crate::GlobalAddr;

/// The one-sided verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA READ of `len` bytes into local memory.
    Read = 1,
    /// RDMA WRITE of `len` bytes from local memory.
    Write = 2,
    /// 8-byte compare-and-swap; the old value lands in local memory.
    Cas = 3,
    /// 8-byte fetch-and-add; the old value lands in local memory.
    Faa = 4,
}

impl Opcode {
    /// Decodes the wire value.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            1 => Opcode::Read,
            2 => Opcode::Write,
            3 => Opcode::Cas,
            4 => Opcode::Faa,
            _ => return None,
        })
    }

    /// Whether this is an 8-byte atomic (CAS or FAA).
    pub fn is_atomic(self) -> bool {
        matches!(self, Opcode::Cas | Opcode::Faa)
    }
}

/// One work request, in the shape of an `ibv_send_wr` with one SGE.
///
/// `local_off` names bytes of the posting thread's registered local memory:
/// the destination of a READ, the source of a WRITE, the 8 bytes that receive
/// the old value of a CAS or FAA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Which verb.
    pub op: Opcode,
    /// Offset in the thread's local memory.
    pub local_off: u32,
    /// Length in bytes (8 for atomics).
    pub len: u32,
    /// Remote address.
    pub remote: GlobalAddr,
    /// Remote key of the blade's region.
    pub rkey: u32,
    /// CAS: the expected value; FAA: the addend.
    pub compare_add: u64,
    /// CAS: the new value.
    pub swap: u64,
}

/// Why a work request failed (the RC error completions we model).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum WcStatus {
    /// Remote access outside the region or with a wrong rkey
    /// (`IBV_WC_REM_ACCESS_ERR`).
    #[error("remote access error (bad rkey or out of bounds)")]
    RemoteAccess = 1,
    /// Misaligned or wrongly sized atomic, or a malformed WR
    /// (`IBV_WC_REM_INV_REQ_ERR`).
    #[error("remote invalid request (atomic must be 8 bytes, 8-byte aligned)")]
    RemoteInvalidRequest = 2,
    /// The QP was already in the error state; the WR was not executed
    /// (`IBV_WC_WR_FLUSH_ERR`).
    #[error("work request flushed: the queue pair is in the error state")]
    Flushed = 3,
    /// The connection to the memory blade failed (`IBV_WC_RETRY_EXC_ERR`).
    #[error("transport failure: the memory blade is unreachable")]
    Transport = 4,
    /// The memory blade refuses this connection's owner: its tag was
    /// revoked (a recovery took the compute blade for dead). The TCP
    /// transport's own status; an RNIC reports a QP its responder moved to
    /// the error state as a transport failure.
    #[error("fenced: {}", crate::fence::REFUSED)]
    Fenced = 5,
}

impl WcStatus {
    /// Decodes the wire value (0 is success and is not a `WcStatus`).
    pub fn from_u8(v: u8) -> Option<WcStatus> {
        Some(match v {
            1 => WcStatus::RemoteAccess,
            2 => WcStatus::RemoteInvalidRequest,
            3 => WcStatus::Flushed,
            4 => WcStatus::Transport,
            5 => WcStatus::Fenced,
            _ => return None,
        })
    }
}

/// The completion of one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The batch's `wr_id` as given to `post`.
    pub wr_id: u64,
    /// `Ok` if every WR of the batch succeeded, else the status of the first
    /// failing WR and its index in the batch. WRs before it took effect; it
    /// and those after it did not.
    pub status: Result<(), (WcStatus, u16)>,
}
