//! First-come-first-served admission to a scarce resource (WorkReqThrot's
//! credits, ConflictAvoid's operation permits and the queues of its key gates).
//!
//! Waiters take tickets and enter in ticket order, so a coroutine that just
//! finished cannot barge ahead of ones already waiting (which starves them
//! when the resource is scarce). Only the waiter whose turn it is can
//! enter, so only it is ever woken: when the turn passes, when a ticket is
//! abandoned, or when the resource frees up ([`Fifo::wake_turn`]). A wake
//! costs O(1) however many wait, instead of every waiter re-polling.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::Waker;

/// A ticket queue (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Fifo {
    next: Cell<u64>,
    serving: Cell<u64>,
    /// Tickets given up by dropped waiters, not yet reached.
    abandoned: RefCell<Vec<u64>>,
    /// Registered waiters, in ticket order, one entry per ticket.
    waiters: RefCell<VecDeque<(u64, Waker)>>,
}

impl Fifo {
    /// A new ticket (the caller should try to enter at once).
    #[inline]
    pub(super) fn ticket(&self) -> u64 {
        let t = self.next.get();
        self.next.set(t + 1);
        t
    }

    #[inline]
    pub(super) fn is_turn(&self, t: u64) -> bool {
        t == self.serving.get()
    }

    /// Whether a newcomer needing `need` of the resource, with `free` of
    /// it left, may enter at once without a ticket: only if `free` also
    /// covers a full claim (`per_ticket`) of every ticket issued and not
    /// yet entered (waiting, woken, or abandoned and not yet skipped), so
    /// it takes nothing a waiter needs.
    ///
    /// Without this, once a queue has formed (the resource was scarce for a
    /// while), every later entrant queues behind it and is admitted one
    /// wake at a time, even after the resource has become plentiful: a
    /// convoy that measured 0.6× throughput on 8-byte READs after
    /// WorkReqThrot's limit rose back.
    #[inline]
    pub(super) fn newcomer_fits(&self, free: i64, need: i64, per_ticket: i64) -> bool {
        let pending = (self.next.get() - self.serving.get()).min(i64::MAX as u64) as i64;
        free.saturating_sub(need) >= pending.saturating_mul(per_ticket)
    }

    /// Ticket `t` could not enter yet: wake `waker` when it may.
    pub(super) fn wait(&self, t: u64, waker: &Waker) {
        let mut w = self.waiters.borrow_mut();
        match w.binary_search_by_key(&t, |e| e.0) {
            Ok(i) => {
                if !w[i].1.will_wake(waker) {
                    w[i].1 = waker.clone();
                }
            }
            Err(i) => w.insert(i, (t, waker.clone())),
        }
    }

    /// Ticket `t` (whose turn it was) entered: the next one's turn. Its
    /// waiter is woken, since what is left may suffice for it too.
    #[inline]
    pub(super) fn entered(&self, t: u64) {
        self.pass(t);
        self.wake_turn();
    }

    /// [`Fifo::entered`] for a resource that one holds at a time (a key
    /// gate): the next turn is woken only when the holder leaves
    /// ([`Fifo::wake_turn`]), not to find it held.
    #[inline]
    pub(super) fn entered_alone(&self, t: u64) {
        self.pass(t);
    }

    fn pass(&self, t: u64) {
        debug_assert!(self.is_turn(t));
        {
            // It may have entered on a poll that its registration did not
            // cause (another wake): drop the registration, which would
            // otherwise sit at the front and hide the next turn's waiter.
            let mut w = self.waiters.borrow_mut();
            if w.front().is_some_and(|e| e.0 == t) {
                w.pop_front();
            }
        }
        self.serving.set(t + 1);
        self.skip_abandoned();
    }

    /// Whether every ticket issued has entered or been abandoned.
    #[inline]
    pub(super) fn is_idle(&self) -> bool {
        self.next.get() == self.serving.get()
    }

    /// Ticket `t` will never enter.
    pub(super) fn abandon(&self, t: u64) {
        {
            let mut w = self.waiters.borrow_mut();
            if let Ok(i) = w.binary_search_by_key(&t, |e| e.0) {
                w.remove(i);
            }
        }
        if t >= self.serving.get() {
            self.abandoned.borrow_mut().push(t);
        }
        self.skip_abandoned();
        self.wake_turn();
    }

    /// Wakes the waiter whose turn it is, if it is registered (the resource
    /// may have freed up, or the turn just passed to it).
    #[inline]
    pub(super) fn wake_turn(&self) {
        let mut w = self.waiters.borrow_mut();
        // Every earlier ticket entered (its registration dropped there) or
        // was abandoned (removed there): the front is the turn or later.
        debug_assert!(w.front().is_none_or(|e| e.0 >= self.serving.get()));
        if w.front().is_some_and(|e| e.0 == self.serving.get()) {
            let (_, waker) = w.pop_front().expect("checked");
            drop(w);
            waker.wake();
        }
    }

    fn skip_abandoned(&self) {
        let mut ab = self.abandoned.borrow_mut();
        while let Some(i) = ab.iter().position(|t| *t == self.serving.get()) {
            ab.swap_remove(i);
            self.serving.set(self.serving.get() + 1);
        }
    }

    /// Registered waiters (for tests).
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.waiters.borrow().len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::runtime::test_waker::wakers;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_newcomer_fits_only_beside_a_full_claim_of_every_ticket_ahead() {
        let f = Fifo::default();
        assert!(f.newcomer_fits(1, 1, 16), "no queue: what it needs is enough");
        assert!(!f.newcomer_fits(0, 1, 16));
        let (a, b) = (f.ticket(), f.ticket());
        assert!(!f.newcomer_fits(32, 1, 16), "31 left cannot cover two claims of 16");
        assert!(f.newcomer_fits(33, 1, 16));
        f.entered(a);
        assert!(f.newcomer_fits(17, 1, 16), "one ticket ahead");
        f.abandon(b);
        assert!(f.newcomer_fits(1, 1, 16), "the queue is gone");
    }

    #[test]
    fn only_the_turn_is_woken_and_abandoned_tickets_are_skipped() {
        let f = Fifo::default();
        let (counts, wakers) = wakers(4);
        let woken = |i: usize| counts[i].0.load(Ordering::Relaxed);
        let t: Vec<u64> = (0..4).map(|_| f.ticket()).collect();
        // Ticket 0 holds the turn but the resource is taken: everyone waits.
        for i in 0..4 {
            f.wait(t[i], &wakers[i]);
            f.wait(t[i], &wakers[i]); // re-registering keeps one entry
        }
        assert_eq!(f.waiting(), 4);
        f.wake_turn();
        assert_eq!((woken(0), woken(1), woken(2), woken(3)), (1, 0, 0, 0), "only the turn");
        // 1 gives up; 0 enters: the turn skips to 2, which alone is woken.
        f.abandon(t[1]);
        assert_eq!(woken(1), 0);
        f.entered(t[0]);
        assert!(f.is_turn(t[2]));
        assert_eq!((woken(2), woken(3)), (1, 0));
        f.entered(t[2]);
        assert_eq!(woken(3), 1);
        f.entered(t[3]);
        assert_eq!(f.waiting(), 0);
        // The turn-holder registers, then enters on a poll caused by something
        // else (its registration is still there): the next waiter must still
        // be woken when the turn passes to it.
        let a = f.ticket();
        let b = f.ticket();
        f.wait(a, &wakers[0]);
        f.wait(b, &wakers[1]);
        let before = woken(1);
        f.entered(a);
        assert_eq!(woken(1), before + 1, "the next turn is woken past a stale registration");
        f.entered(b);
        assert_eq!(f.waiting(), 0);
        // A ticket abandoned after its turn passed leaves nothing behind.
        let late = f.ticket();
        f.entered(late);
        f.abandon(late);
        assert!(f.abandoned.borrow().is_empty());
    }
}
