//! Slots: an in-flight batch's place in the thread's registered memory, and
//! its lifecycle, kept in this one file (as monoio keeps an operation's).
//!
//! ```text
//!            take                posted              completion
//!   Free ──────────▶ Taken ──────────────▶ InFlight ───────────▶ Done ──poll──▶ Held
//!                                            │ request time-out     ▲
//!                                            ▼                      │ late completion
//!                                         TimedOut ─────────────────┘
//!                                            │ owner polls (learns the time-out)
//!                                            ▼
//!                                         Orphaned (below)
//!    ▲                 │ post failed          │                    │ (error:      │
//!    │                 ▼                      │ future dropped     │  freed at    │ Done view
//!    ├─────────────────┘                      ▼                    │  poll)       │ dropped
//!    │                                    Orphaned                 │              │
//!    │◀──────── completion ───────────────────┘                    │              │
//!    │◀──────── future dropped after the completion ───────────────┘              │
//!    └◀───────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! A slot's local bytes belong to its batch from `take` until it is Free
//! again: the backend writes READ data and atomic results there until the
//! completion, and a [`Done`](super::Done) views them after. A future
//! dropped while its batch is in flight leaves the slot Orphaned, so the
//! backend never writes into memory that someone else already reuses; the
//! completion frees it. Each reuse bumps the slot's generation, carried in
//! the WR id, so a completion can never be taken for a later batch's.

use std::collections::VecDeque;
use std::task::{Poll, Waker};

use crate::verbs::WcStatus;

/// A batch's outcome: `Err((status, index of the failed WR))`.
pub(super) type Status = Result<(), (WcStatus, u16)>;

/// Why a batch failed, as its owner learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// A WR completed with an error.
    Wc(WcStatus, u16),
    /// No completion came from QP `qp` within the request time-out.
    TimedOut {
        /// The QP (blade) it was posted to.
        qp: u16,
        /// How long it had been in flight.
        waited_ns: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// Taken for a batch being posted.
    Taken,
    InFlight,
    Done(Status),
    /// Completed and viewed by a live `Done`.
    Held,
    /// Its future was dropped while the batch was in flight.
    Orphaned,
    /// In flight past the request time-out: the owner will be told; the
    /// slot stays the backend's until the completion comes (if ever).
    TimedOut,
}

#[derive(Debug)]
struct Slot {
    state: State,
    generation: u32,
    /// WRs of the batch: the credits it returns on completion.
    wrs: u16,
    /// When it was posted (ns since start, the executor's coarse clock
    /// unless round trips are measured), for round trips and time-outs.
    posted_ns: u64,
    /// The QP (blade) it was posted to.
    qp: u16,
    /// The owner, when it is a task of this runtime polled with its own
    /// waker: its completion sets the task's ready bit directly (no waker
    /// call, no atomic). [`NO_TASK`] otherwise.
    task: u32,
    /// The owner's waker, when `task` is [`NO_TASK`]. Kept when the slot is
    /// freed: the coroutine that frees a slot usually takes it again for its
    /// next batch (the free list is LIFO), and then its waker need not be
    /// cloned (no reference-count traffic per batch).
    waker: Option<Waker>,
}

/// No local task owns the slot: wake its waker.
const NO_TASK: u32 = u32::MAX;

impl Slot {
    #[inline]
    fn set_owner(&mut self, task: Option<u32>, waker: &Waker) {
        match task {
            Some(t) => self.task = t,
            None => {
                self.task = NO_TASK;
                if !self.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    self.waker = Some(waker.clone());
                }
            }
        }
    }
}

/// What a completion did to its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Completed {
    /// Not for a live batch (an old generation): ignored.
    Stale,
    /// The batch's `wrs` WRs, posted at `posted_ns`, are done; its owner
    /// was woken, or is the local `task` to mark ready, or (orphaned) the
    /// slot was freed.
    Batch { wrs: u16, posted_ns: u64, task: Option<u32> },
}

/// Every slot of a thread.
#[derive(Debug)]
pub(super) struct Slots {
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Coroutines waiting for a free slot.
    waiters: VecDeque<Waker>,
}

impl Slots {
    pub(super) fn new(n: usize) -> Slots {
        Slots {
            slots: (0..n)
                .map(|_| Slot {
                    state: State::Free,
                    generation: 0,
                    wrs: 0,
                    posted_ns: 0,
                    qp: 0,
                    task: NO_TASK,
                    waker: None,
                })
                .collect(),
            free: (0..n as u16).rev().collect(),
            waiters: VecDeque::with_capacity(64),
        }
    }

    /// Free → Taken; or, with none free, registers `waker` for the next
    /// slot freed.
    #[inline]
    pub(super) fn take(&mut self, waker: &Waker) -> Option<u16> {
        let i = self.free.pop();
        match i {
            Some(i) => self.slots[i as usize].state = State::Taken,
            None => {
                if !self.waiters.iter().any(|w| w.will_wake(waker)) {
                    self.waiters.push_back(waker.clone());
                }
            }
        }
        i
    }

    /// Slots not free (batches in flight, or held by their owners).
    pub(super) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The WR id that names slot `i`'s current batch.
    #[inline]
    pub(super) fn wr_id(&self, i: u16) -> u64 {
        u64::from(self.slots[i as usize].generation) << 16 | u64::from(i)
    }

    /// Taken → InFlight, owned by local task `task` if it is one, else by
    /// `waker`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn posted(&mut self, i: u16, qp: u16, wrs: u16, posted_ns: u64, task: Option<u32>, waker: &Waker) {
        let s = &mut self.slots[i as usize];
        debug_assert_eq!(s.state, State::Taken);
        s.state = State::InFlight;
        s.wrs = wrs;
        s.qp = qp;
        s.posted_ns = posted_ns;
        s.set_owner(task, waker);
    }

    /// A completion for `wr_id`: InFlight → Done (waking the owner),
    /// Orphaned → Free.
    #[inline]
    pub(super) fn complete(&mut self, wr_id: u64, status: Status) -> Completed {
        let i = (wr_id & 0xffff) as u16;
        let Some(s) = self.slots.get_mut(i as usize) else { return Completed::Stale };
        if s.generation != (wr_id >> 16) as u32 {
            return Completed::Stale;
        }
        let (wrs, posted_ns) = (s.wrs, s.posted_ns);
        match s.state {
            // Late but before its owner learned of the time-out: the real
            // outcome replaces it.
            State::InFlight | State::TimedOut => {
                s.state = State::Done(status);
                let task = (s.task != NO_TASK).then_some(s.task);
                if task.is_none() {
                    if let Some(w) = &s.waker {
                        w.wake_by_ref();
                    }
                }
                Completed::Batch { wrs, posted_ns, task }
            }
            State::Orphaned => {
                self.free(i);
                Completed::Batch { wrs, posted_ns, task: None }
            }
            State::Free | State::Taken | State::Done(_) | State::Held => Completed::Stale,
        }
    }

    /// The owner polls: Done(ok) → Held, Done(error) → Free (the error is
    /// returned), else the owner (local task or waker) is kept for the
    /// completion.
    #[inline]
    pub(super) fn poll_done(
        &mut self,
        i: u16,
        task: Option<u32>,
        waker: &Waker,
        now_ns: u64,
    ) -> Poll<Result<(), Failure>> {
        let s = &mut self.slots[i as usize];
        match s.state {
            State::Done(Ok(())) => {
                s.state = State::Held;
                Poll::Ready(Ok(()))
            }
            State::Done(Err((status, index))) => {
                self.free(i);
                Poll::Ready(Err(Failure::Wc(status, index)))
            }
            State::TimedOut => {
                // The owner gives up; a late completion frees the slot.
                s.state = State::Orphaned;
                Poll::Ready(Err(Failure::TimedOut { qp: s.qp, waited_ns: now_ns.saturating_sub(s.posted_ns) }))
            }
            _ => {
                s.set_owner(task, waker);
                Poll::Pending
            }
        }
    }

    /// The owner's future was dropped: InFlight → Orphaned (freed by its
    /// completion), Done → Free.
    pub(super) fn abandon(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        match s.state {
            State::Done(_) => self.free(i),
            _ => s.state = State::Orphaned,
        }
    }

    /// InFlight → TimedOut for every batch posted before `before_ns`; wakes
    /// their owners (local tasks through `mark`). Returns how many.
    pub(super) fn expire(&mut self, before_ns: u64, mut mark: impl FnMut(u32)) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if s.state == State::InFlight && s.posted_ns < before_ns {
                s.state = State::TimedOut;
                n += 1;
                if s.task != NO_TASK {
                    mark(s.task);
                } else if let Some(w) = &s.waker {
                    w.wake_by_ref();
                }
            }
        }
        n
    }

    /// Taken (its post failed) or Held (its view dropped) → Free.
    #[inline]
    pub(super) fn release(&mut self, i: u16) {
        debug_assert!(matches!(self.slots[i as usize].state, State::Taken | State::Held));
        self.free(i);
    }

    fn free(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        s.state = State::Free;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(i);
        if let Some(w) = self.waiters.pop_front() {
            w.wake();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::runtime::test_waker::Count;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn an_orphaned_slot_is_freed_only_by_its_completion() {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(c.clone());
        let mut s = Slots::new(1);
        let i = s.take(&w).unwrap();
        let id = s.wr_id(i);
        s.posted(i, 0, 2, 0, None, &w);
        s.abandon(i);
        assert!(s.take(&w).is_none(), "orphaned: not reusable before its completion");
        assert_eq!(s.complete(id, Ok(())), Completed::Batch { wrs: 2, posted_ns: 0, task: None });
        assert_eq!(c.0.load(Ordering::Relaxed), 1, "the slot waiter was woken");
        let j = s.take(&w).unwrap();
        assert_eq!(j, i);
        assert_ne!(s.wr_id(j), id, "a new generation");
        assert_eq!(s.complete(id, Ok(())), Completed::Stale, "the old id no longer matches");
    }

    #[test]
    fn a_batch_past_its_deadline_times_out_and_its_slot_waits_for_the_completion() {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(c.clone());
        let mut s = Slots::new(2);
        let (i, j) = (s.take(&w).unwrap(), s.take(&w).unwrap());
        s.posted(i, 3, 1, 100, None, &w);
        s.posted(j, 0, 1, 900, None, &w);
        assert_eq!(s.expire(500, |_| {}), 1, "only the batch posted before the deadline");
        assert_eq!(c.0.load(Ordering::Relaxed), 1, "its owner was woken");
        assert_eq!(s.poll_done(i, None, &w, 700), Poll::Ready(Err(Failure::TimedOut { qp: 3, waited_ns: 600 })));
        assert!(s.take(&w).is_none(), "the timed-out slot is not reusable yet");
        let id = s.wr_id(i);
        assert!(matches!(s.complete(id, Ok(())), Completed::Batch { .. }), "a late completion frees it");
        assert_eq!(s.take(&w), Some(i));
        // A completion that beats the owner's poll delivers the real result.
        let jd = s.wr_id(j);
        s.expire(1000, |_| {});
        s.complete(jd, Ok(()));
        assert_eq!(s.poll_done(j, None, &w, 1100), Poll::Ready(Ok(())));
    }

    #[test]
    fn done_then_held_then_free() {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(c.clone());
        let mut s = Slots::new(2);
        let i = s.take(&w).unwrap();
        s.posted(i, 0, 1, 0, None, &w);
        assert!(s.poll_done(i, None, &w, 0).is_pending());
        s.complete(s.wr_id(i), Err((WcStatus::RemoteAccess, 0)));
        assert_eq!(c.0.load(Ordering::Relaxed), 1, "the owner was woken");
        assert_eq!(s.poll_done(i, None, &w, 0), Poll::Ready(Err(Failure::Wc(WcStatus::RemoteAccess, 0))));
        assert_eq!(s.free.len(), 2, "an error frees the slot at once");
        let i = s.take(&w).unwrap();
        s.posted(i, 0, 1, 0, Some(3), &w);
        let n = c.0.load(Ordering::Relaxed);
        assert_eq!(s.complete(s.wr_id(i), Ok(())), Completed::Batch { wrs: 1, posted_ns: 0, task: Some(3) });
        assert_eq!(c.0.load(Ordering::Relaxed), n, "a local task is marked ready by the executor, not woken");
        assert_eq!(s.poll_done(i, Some(3), &w, 0), Poll::Ready(Ok(())));
        assert_eq!(s.free.len(), 1, "held while viewed");
        s.release(i);
        assert_eq!(s.free.len(), 2);
    }
}
