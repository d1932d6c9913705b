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
//! This goes beyond the paper's ConflictAvoid (backoff and `n_max`); it is
//! the compute-side serialisation of Sherman's local lock table (Wang et
//! al., SIGMOD '22), applied to any operation that names its key. Only
//! conflicts between threads and between compute blades remain, and the
//! backoff handles those. [`BackoffConfig::paper`](crate::smart::BackoffConfig::paper)
//! turns it off.
//!
//! A gate exists while its key is held; it is handed directly to the next
//! waiter on release (no barging), and a waiter that is dropped before it
//! entered gives up its place, or passes the gate on if it had been handed
//! it. Gates are looked up by a linear scan: there are at most as many as
//! the thread's coroutines inside operations. They live in the thread's
//! own memory, so a client that dies leaves nothing of them on the blades.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::Waker;

/// The gates of one thread.
#[derive(Debug, Default)]
pub(super) struct KeyGates {
    gates: RefCell<Vec<Gate>>,
    /// Waiter queues of closed gates, for reuse (no allocation once warm).
    spare: RefCell<Vec<VecDeque<(u64, Waker)>>>,
    next_id: Cell<u64>,
}

#[derive(Debug)]
struct Gate {
    key: u64,
    /// The waiter the gate was handed to on release, until it polls.
    granted: Option<u64>,
    /// Waiters (id, waker), in arrival order.
    queue: VecDeque<(u64, Waker)>,
}

/// What [`KeyGates::enter`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Entry {
    /// The caller holds the key's gate; it must [`KeyGates::release`] it.
    Entered,
    /// The caller waits as this id: it is woken when the gate is handed to
    /// it, and must call `enter` again with the id (or `abandon` it).
    Waiting(u64),
}

impl KeyGates {
    /// Enters `key`'s gate, or queues behind its holder. `id` is `None` on
    /// the first call and the id that call returned afterwards.
    pub(super) fn enter(&self, key: u64, id: Option<u64>, waker: &Waker) -> Entry {
        let mut gates = self.gates.borrow_mut();
        let Some(g) = gates.iter_mut().find(|g| g.key == key) else {
            debug_assert!(id.is_none(), "a waiter's gate is open until it enters or abandons");
            let queue = self.spare.borrow_mut().pop().unwrap_or_default();
            gates.push(Gate { key, granted: None, queue });
            return Entry::Entered;
        };
        if let Some(id) = id {
            if g.granted == Some(id) {
                g.granted = None;
                return Entry::Entered;
            }
            if let Some(w) = g.queue.iter_mut().find(|w| w.0 == id) {
                if !w.1.will_wake(waker) {
                    w.1 = waker.clone();
                }
            }
            return Entry::Waiting(id);
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        g.queue.push_back((id, waker.clone()));
        Entry::Waiting(id)
    }

    /// The holder of `key`'s gate is done: the gate goes to the first
    /// waiter, or closes.
    pub(super) fn release(&self, key: u64) {
        let mut gates = self.gates.borrow_mut();
        let Some(i) = gates.iter().position(|g| g.key == key) else {
            debug_assert!(false, "released a key gate that is not held");
            return;
        };
        let g = &mut gates[i];
        debug_assert!(g.granted.is_none(), "the holder entered, so no grant is pending");
        if let Some((id, waker)) = g.queue.pop_front() {
            g.granted = Some(id);
            drop(gates);
            waker.wake();
        } else {
            let g = gates.swap_remove(i);
            self.spare.borrow_mut().push(g.queue);
        }
    }

    /// Waiter `id` on `key` is dropped before it entered: it leaves the
    /// queue, or, if the gate had been handed to it, passes it on.
    pub(super) fn abandon(&self, key: u64, id: u64) {
        let mut gates = self.gates.borrow_mut();
        let Some(g) = gates.iter_mut().find(|g| g.key == key) else {
            debug_assert!(false, "a waiter's gate is open until it enters or abandons");
            return;
        };
        if g.granted == Some(id) {
            g.granted = None;
            drop(gates);
            self.release(key);
        } else if let Some(i) = g.queue.iter().position(|w| w.0 == id) {
            g.queue.remove(i);
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
    use crate::runtime::test_waker::Count;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn one_holder_per_key_handed_on_in_arrival_order() {
        let g = KeyGates::default();
        let counts: Vec<Arc<Count>> = (0..4).map(|_| Arc::new(Count(AtomicUsize::new(0)))).collect();
        let wakers: Vec<Waker> = counts.iter().map(|c| Waker::from(c.clone())).collect();
        let woken = |i: usize| counts[i].0.load(Ordering::Relaxed);
        assert_eq!(g.enter(7, None, &wakers[0]), Entry::Entered);
        assert_eq!(g.enter(8, None, &wakers[3]), Entry::Entered, "another key is not held back");
        let Entry::Waiting(a) = g.enter(7, None, &wakers[1]) else { panic!("7 is held") };
        let Entry::Waiting(b) = g.enter(7, None, &wakers[2]) else { panic!("7 is held") };
        assert_eq!(g.enter(7, Some(b), &wakers[2]), Entry::Waiting(b), "a re-poll keeps its place");
        assert_eq!(g.enter(7, Some(a), &wakers[1]), Entry::Waiting(a), "not handed to it yet");
        g.release(7);
        assert_eq!((woken(1), woken(2)), (1, 0), "only the first waiter is woken");
        assert_eq!(g.enter(7, Some(b), &wakers[2]), Entry::Waiting(b), "no barging past the grant");
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
        let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::new(Count(AtomicUsize::new(0)))).collect();
        let wakers: Vec<Waker> = counts.iter().map(|c| Waker::from(c.clone())).collect();
        let woken = |i: usize| counts[i].0.load(Ordering::Relaxed);
        assert_eq!(g.enter(1, None, &wakers[0]), Entry::Entered);
        let Entry::Waiting(a) = g.enter(1, None, &wakers[1]) else { panic!() };
        let Entry::Waiting(b) = g.enter(1, None, &wakers[2]) else { panic!() };
        // a is handed the gate but dropped before it polls: b gets it.
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
