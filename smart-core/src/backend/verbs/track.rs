//! Exactly one completion per batch, from the CQEs of one RC QP.
//!
//! Only a batch's last WR is signalled, so a batch that succeeds yields one
//! CQE. A batch whose WR `i` fails yields more: the error CQE of `i`, then,
//! the QP having entered the error state, a *flushed* CQE for each later WR
//! of the batch, signalled or not, and for every WR posted after it (the
//! InfiniBand specification has every WR of an errored QP complete with a
//! completion; Soft-RoCE reports e.g. `index 1 code 10`, then `index 2 code 5`).
//!
//! [`QpTrack`] keeps one QP's batches in posting order (an RC QP completes
//! in order) and turns its CQE stream into one [`Completion`] per batch: the
//! first CQE of a batch completes it, with the first error and that WR's
//! index; the batch is forgotten at its last WR's CQE. Error counters above
//! it therefore count batches, not CQEs. A device that did not flush the
//! unsignalled rest of a failed batch is handled too: a CQE of a later batch
//! ends the earlier, already reported ones.

use std::collections::VecDeque;

use super::status;
use crate::verbs::Completion;

/// A posted batch whose last CQE has not arrived.
#[derive(Clone, Copy, Debug)]
struct Posted {
    batch: u64,
    wrs: u16,
    /// Its completion was handed out (by its first CQE).
    reported: bool,
}

/// What one CQE meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cqe {
    /// The first CQE of a batch: its one completion.
    Completes(Completion),
    /// A later CQE of a batch already completed (flushed rest of a failed batch).
    Trailing,
    /// A CQE for no batch this QP has outstanding (logged by the caller).
    Stray,
}

/// The outstanding batches of one QP.
#[derive(Debug)]
pub(crate) struct QpTrack {
    fifo: VecDeque<Posted>,
    /// WRs posted whose send-queue entries are not known free yet.
    wrs: usize,
}

impl QpTrack {
    /// Room for `batches` outstanding batches without reallocating.
    pub(crate) fn with_capacity(batches: usize) -> QpTrack {
        QpTrack { fifo: VecDeque::with_capacity(batches), wrs: 0 }
    }

    /// A batch of `wrs` WRs was posted.
    pub(crate) fn posted(&mut self, batch: u64, wrs: u16) {
        debug_assert!(wrs > 0);
        self.fifo.push_back(Posted { batch, wrs, reported: false });
        self.wrs += usize::from(wrs);
    }

    /// WRs holding send-queue entries.
    pub(crate) fn wrs(&self) -> usize {
        self.wrs
    }

    /// Whether a batch still waits for its completion.
    pub(crate) fn in_flight(&self) -> bool {
        self.fifo.iter().any(|p| !p.reported)
    }

    /// Whether every CQE of every posted batch has arrived.
    pub(crate) fn drained(&self) -> bool {
        self.fifo.is_empty()
    }

    /// One CQE of WR `index` of `batch`, with libibverbs status `code`.
    pub(crate) fn cqe(&mut self, batch: u64, index: u16, code: u32) -> Cqe {
        // Earlier batches already reported whose flushed rest never came.
        while let Some(p) = self.fifo.front() {
            if p.batch == batch || !p.reported {
                break;
            }
            self.pop();
        }
        let Some(p) = self.fifo.front_mut() else { return Cqe::Stray };
        if p.batch != batch {
            return Cqe::Stray;
        }
        let seen = if p.reported {
            Cqe::Trailing
        } else {
            p.reported = true;
            Cqe::Completes(Completion { wr_id: batch, status: status::map(code).map_err(|s| (s, index)) })
        };
        if index + 1 >= p.wrs {
            self.pop();
        }
        seen
    }

    /// Forgets every batch; returns the completions of those not yet
    /// reported (as flushed), for a QP destroyed before its CQEs arrived.
    pub(crate) fn abandon(&mut self, out: &mut Vec<Completion>) {
        for p in self.fifo.drain(..) {
            if !p.reported {
                out.push(Completion { wr_id: p.batch, status: Err((crate::WcStatus::Flushed, 0)) });
            }
        }
        self.wrs = 0;
    }

    fn pop(&mut self) {
        if let Some(p) = self.fifo.pop_front() {
            self.wrs -= usize::from(p.wrs);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::status::{REM_ACCESS_ERR, SUCCESS, WR_FLUSH_ERR};
    use super::*;
    use crate::WcStatus;

    fn done(batch: u64, status: Result<(), (WcStatus, u16)>) -> Cqe {
        Cqe::Completes(Completion { wr_id: batch, status })
    }

    #[test]
    fn a_successful_batch_completes_at_its_signalled_last_wr() {
        let mut t = QpTrack::with_capacity(4);
        t.posted(7, 3);
        t.posted(8, 1);
        assert_eq!(t.wrs(), 4);
        assert_eq!(t.cqe(7, 2, SUCCESS), done(7, Ok(())));
        assert_eq!(t.wrs(), 1);
        assert!(t.in_flight());
        assert_eq!(t.cqe(8, 0, SUCCESS), done(8, Ok(())));
        assert!(t.drained() && !t.in_flight());
        assert_eq!(t.wrs(), 0);
    }

    #[test]
    fn a_failed_batch_completes_once_with_its_first_error_and_later_batches_once_as_flushed() {
        // What Soft-RoCE did: [good, bad, good] then [good, good] on an errored QP.
        let mut t = QpTrack::with_capacity(4);
        t.posted(1, 3);
        t.posted(2, 2);
        assert_eq!(t.cqe(1, 1, REM_ACCESS_ERR), done(1, Err((WcStatus::RemoteAccess, 1))));
        assert!(t.in_flight(), "batch 2 is still out");
        assert_eq!(t.cqe(1, 2, WR_FLUSH_ERR), Cqe::Trailing);
        assert_eq!(t.cqe(2, 0, WR_FLUSH_ERR), done(2, Err((WcStatus::Flushed, 0))));
        assert!(!t.in_flight() && !t.drained(), "batch 2's last WR is still to flush");
        assert_eq!(t.cqe(2, 1, WR_FLUSH_ERR), Cqe::Trailing);
        assert!(t.drained());
        assert_eq!(t.wrs(), 0);
    }

    #[test]
    fn a_device_that_does_not_flush_the_rest_of_a_failed_batch_is_handled() {
        let mut t = QpTrack::with_capacity(4);
        t.posted(1, 3);
        t.posted(2, 1);
        assert_eq!(t.cqe(1, 0, REM_ACCESS_ERR), done(1, Err((WcStatus::RemoteAccess, 0))));
        // No flushed CQEs for indexes 1 and 2: the next batch's CQE ends batch 1.
        assert_eq!(t.cqe(2, 0, WR_FLUSH_ERR), done(2, Err((WcStatus::Flushed, 0))));
        assert!(t.drained());
        assert_eq!(t.wrs(), 0);
    }

    #[test]
    fn stray_cqes_complete_nothing() {
        let mut t = QpTrack::with_capacity(4);
        assert_eq!(t.cqe(5, 0, SUCCESS), Cqe::Stray, "nothing outstanding");
        t.posted(1, 1);
        t.posted(2, 1);
        assert_eq!(t.cqe(2, 0, SUCCESS), Cqe::Stray, "batch 1 has not completed");
        assert_eq!(t.cqe(1, 0, SUCCESS), done(1, Ok(())));
        assert_eq!(t.cqe(2, 0, SUCCESS), done(2, Ok(())));
    }

    #[test]
    fn abandoning_flushes_only_what_was_not_reported() {
        let mut t = QpTrack::with_capacity(4);
        t.posted(1, 2);
        t.posted(2, 1);
        assert_eq!(t.cqe(1, 0, REM_ACCESS_ERR), done(1, Err((WcStatus::RemoteAccess, 0))));
        let mut out = Vec::new();
        t.abandon(&mut out);
        assert_eq!(out, [Completion { wr_id: 2, status: Err((WcStatus::Flushed, 0)) }]);
        assert!(t.drained());
        assert_eq!(t.wrs(), 0);
    }
}
