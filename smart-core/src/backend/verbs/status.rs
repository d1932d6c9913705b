//! Work-completion status codes of libibverbs and what they mean here.
//!
//! The values are those of `enum ibv_wc_status` in `<infiniband/verbs.h>`;
//! with the `verbs` feature a test checks them against rdma-sys.

use crate::WcStatus;

/// `IBV_WC_SUCCESS`.
pub const SUCCESS: u32 = 0;
/// `IBV_WC_LOC_LEN_ERR`.
pub const LOC_LEN_ERR: u32 = 1;
/// `IBV_WC_LOC_QP_OP_ERR`.
pub const LOC_QP_OP_ERR: u32 = 2;
/// `IBV_WC_LOC_PROT_ERR`.
pub const LOC_PROT_ERR: u32 = 4;
/// `IBV_WC_WR_FLUSH_ERR`.
pub const WR_FLUSH_ERR: u32 = 5;
/// `IBV_WC_REM_INV_REQ_ERR`.
pub const REM_INV_REQ_ERR: u32 = 9;
/// `IBV_WC_REM_ACCESS_ERR`.
pub const REM_ACCESS_ERR: u32 = 10;
/// `IBV_WC_REM_OP_ERR`.
pub const REM_OP_ERR: u32 = 11;
/// `IBV_WC_RETRY_EXC_ERR`.
pub const RETRY_EXC_ERR: u32 = 12;
/// `IBV_WC_RNR_RETRY_EXC_ERR`.
pub const RNR_RETRY_EXC_ERR: u32 = 13;

/// Maps an `ibv_wc_status` to the runtime's status; `Ok` for success.
///
/// Remote access and invalid-request errors keep their meaning; a flushed
/// WR is `Flushed`; retry exhaustion (the peer is gone or unreachable) is
/// `Transport`; local errors mean a WR the runtime built wrongly, reported
/// as `RemoteInvalidRequest` with the code in the log.
pub fn map(code: u32) -> Result<(), WcStatus> {
    match code {
        SUCCESS => Ok(()),
        REM_ACCESS_ERR | LOC_PROT_ERR => Err(WcStatus::RemoteAccess),
        WR_FLUSH_ERR => Err(WcStatus::Flushed),
        RETRY_EXC_ERR | RNR_RETRY_EXC_ERR => Err(WcStatus::Transport),
        _ => Err(WcStatus::RemoteInvalidRequest),
    }
}

/// A name for logs.
pub fn name(code: u32) -> &'static str {
    match code {
        SUCCESS => "success",
        LOC_LEN_ERR => "local length error",
        LOC_QP_OP_ERR => "local QP operation error",
        LOC_PROT_ERR => "local protection error",
        WR_FLUSH_ERR => "work request flushed",
        REM_INV_REQ_ERR => "remote invalid request",
        REM_ACCESS_ERR => "remote access error",
        REM_OP_ERR => "remote operation error",
        RETRY_EXC_ERR => "transport retry counter exceeded",
        RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        _ => "other work-completion error",
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_runtime_errors() {
        assert_eq!(map(SUCCESS), Ok(()));
        assert_eq!(map(REM_ACCESS_ERR), Err(WcStatus::RemoteAccess));
        assert_eq!(map(WR_FLUSH_ERR), Err(WcStatus::Flushed));
        assert_eq!(map(RETRY_EXC_ERR), Err(WcStatus::Transport));
        assert_eq!(map(REM_INV_REQ_ERR), Err(WcStatus::RemoteInvalidRequest));
        assert_eq!(map(LOC_LEN_ERR), Err(WcStatus::RemoteInvalidRequest));
        assert_eq!(name(RNR_RETRY_EXC_ERR), "RNR retry counter exceeded");
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn codes_match_libibverbs() {
        use rdma_sys::ibv_wc_status as s;
        assert_eq!(SUCCESS, s::IBV_WC_SUCCESS);
        assert_eq!(LOC_LEN_ERR, s::IBV_WC_LOC_LEN_ERR);
        assert_eq!(LOC_QP_OP_ERR, s::IBV_WC_LOC_QP_OP_ERR);
        assert_eq!(LOC_PROT_ERR, s::IBV_WC_LOC_PROT_ERR);
        assert_eq!(WR_FLUSH_ERR, s::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(REM_INV_REQ_ERR, s::IBV_WC_REM_INV_REQ_ERR);
        assert_eq!(REM_ACCESS_ERR, s::IBV_WC_REM_ACCESS_ERR);
        assert_eq!(REM_OP_ERR, s::IBV_WC_REM_OP_ERR);
        assert_eq!(RETRY_EXC_ERR, s::IBV_WC_RETRY_EXC_ERR);
        assert_eq!(RNR_RETRY_EXC_ERR, s::IBV_WC_RNR_RETRY_EXC_ERR);
    }
}
