//! ConflictAvoid's side of an application operation: coroutine throttling
//! (at most `n_max` of a thread's coroutines inside operations that may
//! retry, admitted first come, first served) and backoff between retries.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::ctx::Inner;
use super::timer::Sleep;
use super::Ctx;
use crate::smart::Backoff;

impl Ctx {
    /// Starts an application-level operation that may retry (ConflictAvoid).
    /// With coroutine throttling on, waits until fewer than `n_max` of this
    /// thread's coroutines are inside one. Report failed attempts with
    /// [`OpGuard::retry`]; dropping the guard ends it.
    ///
    /// ```
    /// # use smart_core::*;
    /// # let t = EmbeddedTransport::new(1, 1 << 20).unwrap();
    /// # let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    /// # let ctx = rt.ctx();
    /// rt.block_on(async move {
    ///     let counter = ctx.alloc(0, 8, 8).await.unwrap();
    ///     let mut op = ctx.op().await;
    ///     let mut seen = ctx.read_u64(counter).await.unwrap();
    ///     loop {
    ///         let old = ctx.cas(counter, seen, seen + 1).await.unwrap();
    ///         if old == seen {
    ///             break;
    ///         }
    ///         seen = old;
    ///         op.retry().await; // backs off when conflict avoidance is on
    ///     }
    /// });
    /// ```
    pub async fn op(&self) -> OpGuard<'_> {
        EnterOp { inner: &self.0, ticket: None, entered: false }.await;
        OpGuard { ctx: self, attempts: 0 }
    }
}

/// Waits for a free place among the `n_max` coroutines inside an operation,
/// first come, first served.
struct EnterOp<'a> {
    inner: &'a Inner,
    ticket: Option<u64>,
    entered: bool,
}

impl Future for EnterOp<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let inner = self.inner;
        let fifo = &inner.op_fifo;
        let n_max = inner.backoff.borrow().as_ref().map_or(usize::MAX, Backoff::n_max);
        // Room for this one and for every ticket ahead: enter at once
        // (see `Fifo::newcomer_fits`).
        let free = n_max.saturating_sub(inner.in_op.get()).min(i64::MAX as usize) as i64;
        if self.ticket.is_none() && fifo.newcomer_fits(free, 1, 1) {
            inner.in_op.set(inner.in_op.get() + 1);
            self.entered = true;
            return Poll::Ready(());
        }
        let t = *self.ticket.get_or_insert_with(|| fifo.ticket());
        if fifo.is_turn(t) && inner.in_op.get() < n_max {
            inner.in_op.set(inner.in_op.get() + 1);
            self.entered = true;
            fifo.entered(t);
            Poll::Ready(())
        } else {
            fifo.wait(t, cx.waker());
            Poll::Pending
        }
    }
}

impl Drop for EnterOp<'_> {
    fn drop(&mut self) {
        if let (Some(t), false) = (self.ticket, self.entered) {
            self.inner.op_fifo.abandon(t);
        }
    }
}

/// One application-level operation (e.g. an update) in progress; see
/// [`Ctx::op`]. Dropping it ends the operation.
pub struct OpGuard<'a> {
    ctx: &'a Ctx,
    attempts: u32,
}

impl fmt::Debug for OpGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpGuard").field("attempts", &self.attempts).finish()
    }
}

impl OpGuard<'_> {
    /// Reports an unsuccessful attempt (a failed CAS, a conflict) and waits
    /// before the next one: with ConflictAvoid a random time up to
    /// min(cap, C0 · 2^k) for the k-th retry, yielding to the thread's other
    /// coroutines; without it, no wait (the baseline's immediate retry).
    pub async fn retry(&mut self) {
        self.attempts += 1;
        let inner = &*self.ctx.0;
        let bound = inner.backoff.borrow_mut().as_mut().map(|b| b.on_retry(self.attempts));
        inner.stats.borrow_mut().retries += 1;
        if let Some(bound) = bound {
            let wait = inner.random() % (bound + 1);
            inner.stats.borrow_mut().backoff_ns += wait;
            if wait > 0 {
                Sleep::new(inner, wait).await;
            }
        }
    }

    /// Retries reported so far.
    pub fn retries(&self) -> u32 {
        self.attempts
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let inner = &*self.ctx.0;
        if let Some(b) = inner.backoff.borrow_mut().as_mut() {
            b.on_op();
        }
        inner.stats.borrow_mut().ops_by_retries[crate::stats::retry_bucket(self.attempts)] += 1;
        inner.in_op.set(inner.in_op.get() - 1);
        // A permit freed: the waiter whose turn it is may enter.
        inner.op_fifo.wake_turn();
    }
}
