//! ConflictAvoid's key gate: a thread's operations on the same key run one
//! at a time, in arrival order.
//!
//! Two coroutines of one thread that update the same key at once cannot
//! both win: each reads the same old word, and the CAS of the second fails
//! and retries, having spent a round trip (two with its re-read) that the
//! first one's result makes useless. Under skew (Zipf 0.99 puts about 9% of
//! 50 000 keys' accesses on the hottest one) most of a thread's in-flight
//! operations collide this way with its own siblings. Waiting for the
//! sibling instead costs no verb, and the wait ends as soon as it finishes.
//! Unlike coroutine throttling (`n_max`), it takes no concurrency from
//! operations on other keys, so a transport that needs many WRs in flight
//! to be busy (TCP, a 20 µs round trip) keeps them.
//!
//! The gate is held until the operation ends or, when it names its commit
//! ([`OpGuard::commit`](crate::runtime::OpGuard::commit), e.g. the CAS that
//! publishes an update), until that commit is posted. A QP executes its WRs
//! in order, so the next waiter's READs go out behind the commit and see its
//! outcome; holding the gate until the commit's completion came back cost
//! the waiter a round trip, and YCSB a over TCP 3–6% against no gate. A
//! commit that fails queues at the gate again (giving up its operation
//! permit meanwhile, so that no coroutine waits for a gate while holding a
//! permit).
//!
//! This goes beyond the paper's ConflictAvoid (backoff and `n_max`); it is
//! the compute-side serialisation of Sherman's local lock table (Wang et
//! al., SIGMOD '22), applied to any operation that names its key. Only
//! conflicts between threads and between compute blades remain, and the
//! backoff handles those. [`BackoffConfig::paper`](crate::smart::BackoffConfig::paper)
//! turns it off.
//!
//! A gate exists while its key is held or waited for. Its waiters queue in
//! a [`Fifo`] (tickets, as for credits and operation permits): on release
//! the gate goes to the next ticket (no barging), and a waiter dropped
//! before it entered gives up its ticket, which passes the turn on. Gates
//! are looked up by a linear scan: there are at most as many as the
//! thread's coroutines inside operations. They live in the thread's own
//! memory, so a client that dies leaves nothing of them on the blades.

use std::cell::RefCell;
use std::task::Waker;

use super::waiting::Fifo;

/// The gates of one thread.
#[derive(Debug, Default)]
pub(super) struct KeyGates {
    gates: RefCell<Vec<Gate>>,
    /// Queues of closed gates, for reuse (no allocation once warm).
    spare: RefCell<Vec<Fifo>>,
}

#[derive(Debug)]
struct Gate {
    key: u64,
    held: bool,
    queue: Fifo,
}

/// What [`KeyGates::enter`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Entry {
    /// The caller holds the key's gate; it must [`KeyGates::release`] it.
    Entered,
    /// The caller waits with this ticket: it is woken when its turn comes,
    /// and must call `enter` again with the ticket (or `abandon` it).
    Waiting(u64),
}

impl KeyGates {
    /// Enters `key`'s gate, or queues behind its holder. `ticket` is `None`
    /// on the first call and the ticket that call returned afterwards.
    pub(super) fn enter(&self, key: u64, ticket: Option<u64>, waker: &Waker) -> Entry {
        let mut gates = self.gates.borrow_mut();
        let Some(g) = gates.iter_mut().find(|g| g.key == key) else {
            debug_assert!(ticket.is_none(), "a waiter's gate is open until it enters or abandons");
            let queue = self.spare.borrow_mut().pop().unwrap_or_default();
            gates.push(Gate { key, held: true, queue });
            return Entry::Entered;
        };
        let free = i64::from(!g.held);
        if ticket.is_none() && g.queue.newcomer_fits(free, 1, 1) {
            g.held = true;
            return Entry::Entered;
        }
        let t = ticket.unwrap_or_else(|| g.queue.ticket());
        if !g.held && g.queue.is_turn(t) {
            g.held = true;
            g.queue.entered_alone(t);
            return Entry::Entered;
        }
        g.queue.wait(t, waker);
        Entry::Waiting(t)
    }

    /// The holder of `key`'s gate is done: the next ticket's waiter is
    /// woken, or the gate closes.
    pub(super) fn release(&self, key: u64) {
        self.with_gate(key, |g| {
            g.held = false;
            g.queue.wake_turn();
        });
    }

    /// Ticket `t`'s waiter on `key` is dropped before it entered.
    pub(super) fn abandon(&self, key: u64, t: u64) {
        self.with_gate(key, |g| g.queue.abandon(t));
    }

    /// Runs `f` on `key`'s gate, then closes the gate if nobody holds it or
    /// waits for it.
    fn with_gate(&self, key: u64, f: impl FnOnce(&mut Gate)) {
        let mut gates = self.gates.borrow_mut();
        let Some(i) = gates.iter().position(|g| g.key == key) else {
            debug_assert!(false, "a gate is open while held or waited for");
            return;
        };
        // (Waking a waiter only marks its task ready: nothing re-enters
        // the gates meanwhile.)
        f(&mut gates[i]);
        if !gates[i].held && gates[i].queue.is_idle() {
            let g = gates.swap_remove(i);
            self.spare.borrow_mut().push(g.queue);
        }
    }

    /// Open gates (for tests).
    #[cfg(test)]
    pub(super) fn open(&self) -> usize {
        self.gates.borrow().len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::runtime::test_waker::wakers;
    use std::sync::atomic::Ordering;

    #[test]
    fn one_holder_per_key_handed_on_in_arrival_order() {
        let g = KeyGates::default();
        let (counts, wakers) = wakers(4);
        let woken = |i: usize| counts[i].0.load(Ordering::Relaxed);
        assert_eq!(g.enter(7, None, &wakers[0]), Entry::Entered);
        assert_eq!(g.enter(8, None, &wakers[3]), Entry::Entered, "another key is not held back");
        let Entry::Waiting(a) = g.enter(7, None, &wakers[1]) else { panic!("7 is held") };
        let Entry::Waiting(b) = g.enter(7, None, &wakers[2]) else { panic!("7 is held") };
        assert_eq!(g.enter(7, Some(b), &wakers[2]), Entry::Waiting(b), "a re-poll keeps its place");
        assert_eq!(g.enter(7, Some(a), &wakers[1]), Entry::Waiting(a), "not handed to it yet");
        g.release(7);
        assert_eq!((woken(1), woken(2)), (1, 0), "only the first waiter is woken");
        assert_eq!(g.enter(7, Some(b), &wakers[2]), Entry::Waiting(b), "no barging past the turn");
        assert_eq!(g.enter(7, Some(a), &wakers[1]), Entry::Entered);
        g.release(7);
        assert_eq!(woken(2), 1);
        assert_eq!(g.enter(7, Some(b), &wakers[2]), Entry::Entered);
        g.release(7);
        g.release(8);
        assert_eq!(g.open(), 0, "gates close when nobody holds or waits");
    }

    #[test]
    fn a_dropped_waiter_leaves_or_passes_the_gate_on() {
        let g = KeyGates::default();
        let (counts, wakers) = wakers(3);
        let woken = |i: usize| counts[i].0.load(Ordering::Relaxed);
        assert_eq!(g.enter(1, None, &wakers[0]), Entry::Entered);
        let Entry::Waiting(a) = g.enter(1, None, &wakers[1]) else { panic!() };
        let Entry::Waiting(b) = g.enter(1, None, &wakers[2]) else { panic!() };
        // a is woken for its turn but dropped before it polls: b gets it.
        g.release(1);
        g.abandon(1, a);
        assert_eq!(woken(2), 1);
        assert_eq!(g.enter(1, Some(b), &wakers[2]), Entry::Entered);
        // A waiter dropped while queued just leaves.
        let Entry::Waiting(c) = g.enter(1, None, &wakers[0]) else { panic!() };
        g.abandon(1, c);
        g.release(1);
        assert_eq!(g.open(), 0);
        assert_eq!(woken(0), 0, "the abandoned waiter is never woken");
    }
}
