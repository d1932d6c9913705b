//! ConflictAvoid's side of an application operation: coroutine throttling
//! (at most `n_max` of a thread's coroutines inside operations that may
//! retry, admitted first come, first served) and backoff between retries.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::ctx::Inner;
use super::keygate::Entry;
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
        OpGuard { ctx: self, attempts: 0, gate: None, holds_gate: false, entered: true }
    }

    /// [`Ctx::op`] for an operation whose conflicts are on one key, named
    /// by `key` (a hash of it: equal keys must give equal values; a rare
    /// collision only makes two operations wait for each other). With
    /// ConflictAvoid's key gate on, the thread's operations on the same key
    /// first wait for each other, in arrival order, instead of colliding
    /// (see the `keygate` module); then the operation enters as with
    /// [`Ctx::op`]. The gate is held until the guard drops, or until the
    /// attempt's commit is posted ([`OpGuard::commit`]).
    ///
    /// A coroutine must not start an operation while it holds another
    /// (that could wait for itself).
    pub async fn op_on(&self, key: u64) -> OpGuard<'_> {
        let gated = self.0.key_gates.is_some();
        if gated {
            EnterKey { inner: &self.0, key, ticket: None, entered: false }.await;
        }
        // From here the guard releases the gate, also if this coroutine is
        // dropped while it waits for a permit.
        let gate = gated.then_some(key);
        let mut guard = OpGuard { ctx: self, attempts: 0, gate, holds_gate: gated, entered: false };
        EnterOp { inner: &self.0, ticket: None, entered: false }.await;
        guard.entered = true;
        guard
    }
}

/// Waits for `key`'s gate (see the `keygate` module).
struct EnterKey<'a> {
    inner: &'a Inner,
    key: u64,
    ticket: Option<u64>,
    entered: bool,
}

impl Future for EnterKey<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let gates = self.inner.key_gates.as_ref().expect("only awaited with the key gate on");
        match gates.enter(self.key, self.ticket, cx.waker()) {
            Entry::Entered => {
                self.entered = true;
                Poll::Ready(())
            }
            Entry::Waiting(t) => {
                if self.ticket.is_none() {
                    self.inner.stats.borrow_mut().key_waits += 1;
                }
                self.ticket = Some(t);
                Poll::Pending
            }
        }
    }
}

impl Drop for EnterKey<'_> {
    fn drop(&mut self) {
        if let (Some(t), false) = (self.ticket, self.entered) {
            if let Some(g) = &self.inner.key_gates {
                g.abandon(self.key, t);
            }
        }
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
    /// The operation's key, with the key gate on.
    gate: Option<u64>,
    /// Whether it holds that key's gate (from entry until the commit is
    /// posted, and again after a failed commit's retry).
    holds_gate: bool,
    /// Whether it holds an operation permit (it does once returned).
    entered: bool,
}

impl fmt::Debug for OpGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpGuard")
            .field("attempts", &self.attempts)
            .field("gate", &self.gate)
            .field("holds_gate", &self.holds_gate)
            .finish()
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
        if let (Some(key), false) = (self.gate, self.holds_gate) {
            // The commit failed after it passed the gate on: queue at the
            // gate again, behind the operations that entered meanwhile.
            // Gates come before permits (as in `Ctx::op_on`), so the permit
            // is given up while waiting: nobody waits for a gate while
            // holding a permit, and nothing waits in a cycle.
            self.leave();
            EnterKey { inner, key, ticket: None, entered: false }.await;
            self.holds_gate = true;
            EnterOp { inner, ticket: None, entered: false }.await;
            self.entered = true;
        }
    }

    /// Gives up the operation permit.
    fn leave(&mut self) {
        let inner = &*self.ctx.0;
        if std::mem::take(&mut self.entered) {
            inner.in_op.set(inner.in_op.get() - 1);
            // A permit freed: the waiter whose turn it is may enter.
            inner.op_fifo.wake_turn();
        }
    }

    /// Retries reported so far.
    pub fn retries(&self) -> u32 {
        self.attempts
    }

    /// Whether this operation holds its key's gate, so that its
    /// [`commit`](OpGuard::commit) passes the gate on as soon as it is
    /// posted: the key's next operation on this thread may then start
    /// before the commit completes. Without the key gate, `false`.
    pub fn gated(&self) -> bool {
        self.holds_gate
    }

    /// Awaits `fut`, the attempt's commit (e.g. the CAS that publishes an
    /// update), and passes the key's gate on (see [`Ctx::op_on`]) as soon
    /// as `fut` has rung its doorbell, not when it completes. The next
    /// waiter's verbs then go out behind the commit, and a QP executes its
    /// WRs in order, so they see its outcome: it spends no extra round trip
    /// waiting for the completion, and does not collide with the commit if
    /// it succeeds. If it fails, [`OpGuard::retry`] queues at the gate
    /// again. Without a gate this is just `fut.await`.
    ///
    /// `fut` must post at most one batch, the commit's, and only its own.
    pub async fn commit<F: Future>(&mut self, fut: F) -> F::Output {
        PassOnPost { guard: self, fut: std::pin::pin!(fut) }.await
    }
}

/// The future of [`OpGuard::commit`].
struct PassOnPost<'g, 'a, F> {
    guard: &'g mut OpGuard<'a>,
    fut: Pin<&'g mut F>,
}

impl<F: Future> Future for PassOnPost<'_, '_, F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let (Some(key), true) = (this.guard.gate, this.guard.holds_gate) else {
            return this.fut.as_mut().poll(cx);
        };
        let inner = &*this.guard.ctx.0;
        // Only this coroutine runs during the poll: a doorbell rung meanwhile is its own.
        let rung = inner.stats.borrow().doorbells;
        let r = this.fut.as_mut().poll(cx);
        if inner.stats.borrow().doorbells != rung {
            this.guard.holds_gate = false;
            if let Some(g) = &inner.key_gates {
                g.release(key);
            }
        }
        r
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let inner = &*self.ctx.0;
        if self.entered {
            if let Some(b) = inner.backoff.borrow_mut().as_mut() {
                b.on_op();
            }
            inner.stats.borrow_mut().ops_by_retries[crate::stats::retry_bucket(self.attempts)] += 1;
            self.leave();
        }
        if let (Some(key), true, Some(g)) = (self.gate, self.holds_gate, &inner.key_gates) {
            g.release(key);
        }
    }
}
