//! Timers: coroutines sleeping until a deadline on the runtime's clock
//! (backoff waits, pauses while a structure is being changed).
//!
//! A dropped [`Sleep`] removes its timer, so a cancelled wait leaves nothing
//! behind for the executor to fire.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::ctx::Inner;
use super::Ctx;

#[derive(Debug)]
struct Timer {
    deadline: u64,
    id: u64,
    waker: Waker,
}

/// The sleeping coroutines of a thread (few: a small vector beats a heap).
#[derive(Debug, Default)]
pub(super) struct Timers {
    armed: RefCell<Vec<Timer>>,
    next_id: Cell<u64>,
}

impl Timers {
    pub(super) fn with_capacity(n: usize) -> Timers {
        Timers { armed: RefCell::new(Vec::with_capacity(n)), next_id: Cell::new(0) }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.armed.borrow().is_empty()
    }

    fn arm(&self, deadline: u64, waker: &Waker) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.armed.borrow_mut().push(Timer { deadline, id, waker: waker.clone() });
        id
    }

    fn disarm(&self, id: u64) {
        let mut t = self.armed.borrow_mut();
        if let Some(i) = t.iter().position(|t| t.id == id) {
            t.swap_remove(i);
        }
    }

    /// Wakes the coroutines whose deadline passed by `now`.
    pub(super) fn fire(&self, now: u64) {
        let mut t = self.armed.borrow_mut();
        let mut i = 0;
        while i < t.len() {
            if t[i].deadline <= now {
                t.swap_remove(i).waker.wake();
            } else {
                i += 1;
            }
        }
    }

    /// The earliest deadline armed.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.armed.borrow().iter().map(|t| t.deadline).min()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.armed.borrow().len()
    }
}

/// Sleeps until `deadline` (ns since the runtime started); see
/// [`Ctx::sleep_ns`].
pub(super) struct Sleep<'a> {
    inner: &'a Inner,
    deadline: u64,
    /// The armed timer's id.
    timer: Option<u64>,
}

impl<'a> Sleep<'a> {
    pub(super) fn new(inner: &'a Inner, ns: u64) -> Self {
        Sleep { inner, deadline: inner.now_ns().saturating_add(ns), timer: None }
    }
}

impl Future for Sleep<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.now_ns() >= self.deadline {
            if let Some(id) = self.timer.take() {
                self.inner.timers.disarm(id);
            }
            return Poll::Ready(());
        }
        if self.timer.is_none() {
            self.timer = Some(self.inner.timers.arm(self.deadline, cx.waker()));
        }
        Poll::Pending
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.timer {
            self.inner.timers.disarm(id);
        }
    }
}

impl Ctx {
    /// Sleeps for `ns` nanoseconds, letting the thread's other coroutines run.
    pub async fn sleep_ns(&self, ns: u64) {
        Sleep::new(&self.0, ns).await;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::pin::pin;

    use super::*;
    use crate::{EmbeddedTransport, Runtime, RuntimeConfig};

    #[test]
    fn a_dropped_sleep_removes_its_timer_and_a_finished_one_leaves_none() {
        let t = EmbeddedTransport::new(1, 1 << 20).unwrap();
        let rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        let mut cx = Context::from_waker(Waker::noop());
        {
            let mut long = pin!(Sleep::new(&ctx.0, 60_000_000_000));
            assert!(long.as_mut().poll(&mut cx).is_pending());
            assert!(long.as_mut().poll(&mut cx).is_pending());
            assert_eq!(ctx.0.timers.len(), 1, "armed once");
        }
        assert_eq!(ctx.0.timers.len(), 0, "dropped: disarmed");
        let mut short = pin!(Sleep::new(&ctx.0, 1));
        while short.as_mut().poll(&mut cx).is_pending() {}
        assert_eq!(ctx.0.timers.len(), 0, "finished: nothing left to fire");
    }

    #[test]
    fn a_sleeper_wakes_on_time_while_its_thread_only_idles() {
        // Nothing but the sleep: every round is idle, and the executor reads
        // the clock on every 16th of them only; the timer must still fire.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t = EmbeddedTransport::new(1, 1 << 20).unwrap();
            let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
            let ctx = rt.ctx();
            let t0 = std::time::Instant::now();
            rt.block_on(async move { ctx.sleep_ns(2_000_000).await });
            tx.send(t0.elapsed()).unwrap();
        });
        let slept = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the sleep ended");
        assert!(slept >= std::time::Duration::from_millis(2), "{slept:?}");
    }
}
