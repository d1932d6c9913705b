//! The per-thread coroutine runtime.
//!
//! One [`Runtime`] per worker thread owns that thread's
//! [`Endpoint`](crate::backend::Endpoint) and runs its coroutines (futures)
//! on a single-threaded executor. A coroutine builds a [`Batch`] and awaits
//! [`Batch::post`]; when no coroutine can run, the executor polls the CQ and
//! wakes the coroutines whose batches completed: the Smart coroutine model.
//!
//! **Slots.** Every in-flight batch occupies a *slot*: a fixed range of the
//! thread's registered local memory holding its WRITE payloads and receiving
//! its READ data and atomic results, plus the waker of its coroutine. Its
//! lifecycle (Free → Taken → InFlight → Done → Held → Free, or Orphaned when
//! the awaiting future is dropped while the batch is in flight, freed only
//! by its completion) lives in one place, the `slot` module. Slots and local
//! memory are allocated once when the runtime starts; posting allocates
//! nothing and takes no lock.
//!
//! The modules, one idea each:
//!
//! | module | what |
//! |---|---|
//! | `config` | [`RuntimeConfig`], [`SmartState`], [`MAX_BATCH`] |
//! | `slot` | slots and their lifecycle |
//! | `batch` | [`Batch`], its posting ([`Post`]) and its results ([`Done`]) |
//! | `ctx` | [`Ctx`]: the coroutine's handle, single verbs, multi-piece READ/WRITE |
//! | `heap` | chunk allocation and named roots on a blade |
//! | `executor` | [`Runtime`]: tasks, the ready set, CQ polling, the techniques' tick |
//! | `waiting` | first-come-first-served admission (credits, operation permits, key-gate queues) |
//! | `timer` | sleeping coroutines |
//! | `conflict` | ConflictAvoid's operation guard ([`OpGuard`]) |
//! | `keygate` | ConflictAvoid's key gate: a thread's operations on one key, one at a time |
//! | `ready` | the lock-free ready set wakers set (model-checked with loom) |

mod batch;
mod blade_set;
mod config;
mod conflict;
mod ctx;
mod executor;
mod heap;
mod keygate;
mod ready;
mod slot;
mod timer;
mod waiting;

/// A waker that counts its wakes, for the unit tests of the runtime's parts.
#[cfg(all(test, not(loom)))]
mod test_waker {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    pub(super) struct Count(pub(super) AtomicUsize);

    /// `n` counting wakers and their counts.
    pub(super) fn wakers(n: usize) -> (Vec<Arc<Count>>, Vec<std::task::Waker>) {
        let counts: Vec<Arc<Count>> = (0..n).map(|_| Arc::new(Count(AtomicUsize::new(0)))).collect();
        let wakers = counts.iter().map(|c| std::task::Waker::from(c.clone())).collect();
        (counts, wakers)
    }

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub use batch::{post_all, AtomicRef, Batch, Done, Post, ReadRef};
pub use config::{RuntimeConfig, SmartState, DEFAULT_REQUEST_TIMEOUT, MAX_BATCH};
pub use conflict::OpGuard;
pub use ctx::Ctx;
pub use executor::{prefetch_local, yield_now, Round, Runtime, YieldNow, MAX_TASKS};
