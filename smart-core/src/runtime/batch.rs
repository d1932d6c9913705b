//! Batches of WRs to one blade (one doorbell), their posting, and the view
//! of a completed batch.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::config::MAX_BATCH;
use super::slot::Failure;
use super::Ctx;
use crate::verbs::{Opcode, WorkRequest};
use crate::{Error, GlobalAddr, Result};

/// Where a READ's data will be in a [`Done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRef {
    off: u32,
    len: u32,
}

/// Where a CAS's or FAA's old value will be in a [`Done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicRef {
    off: u32,
}

const EMPTY_WR: WorkRequest =
    WorkRequest { op: Opcode::Read, local_off: 0, len: 0, remote: GlobalAddr::NULL, rkey: 0, compare_add: 0, swap: 0 };

/// A batch of WRs to one memory blade: one doorbell, executed in order.
///
/// ```
/// # use smart_core::*;
/// # let t = EmbeddedTransport::new(1, 1 << 20).unwrap();
/// # let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
/// # let ctx = rt.ctx();
/// rt.block_on(async move {
///     let a = ctx.alloc(0, 16, 8).await.unwrap();
///     let one = 1u64.to_le_bytes();
///     let mut b = ctx.batch();
///     b.write(a, &one);
///     let cas = b.cas(a, 1, 2);
///     let rd = b.read(a, 16);
///     let done = b.post().await.unwrap();
///     assert_eq!(done.old(cas), 1);
///     assert_eq!(&done.bytes(rd)[..8], &2u64.to_le_bytes());
/// });
/// ```
pub struct Batch<'a> {
    ctx: &'a Ctx,
    /// The WRs and payloads, in a pooled staging area: building a batch
    /// neither initializes nor moves them.
    /// Returned to the pool on drop (taken out exactly once there).
    staging: ManuallyDrop<Box<Staging>>,
    n: usize,
    bytes: u32,
    blade: Option<u16>,
    error: Option<Error>,
    /// The WRITE payloads borrowed until the post.
    _payloads: PhantomData<&'a [u8]>,
}

/// Where a batch's WRs and WRITE payloads wait for the post. A thread keeps
/// a pool of these (one per batch being built at once, so about one per
/// coroutine), taken by [`Ctx::batch`] and returned when the batch drops.
pub(super) struct Staging {
    wrs: [WorkRequest; MAX_BATCH],
    /// WRITE payloads as (pointer, length): borrowed for the batch's `'a`,
    /// which outlives every use (the post copies them into the slot).
    payloads: [(*const u8, usize); MAX_BATCH],
}

impl Staging {
    pub(super) fn new() -> Box<Staging> {
        Box::new(Staging { wrs: [EMPTY_WR; MAX_BATCH], payloads: [(std::ptr::null(), 0); MAX_BATCH] })
    }
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").field("wrs", &&self.staged().wrs[..self.n]).field("error", &self.error).finish()
    }
}

impl<'a> Batch<'a> {
    #[inline]
    pub(super) fn new(ctx: &'a Ctx) -> Self {
        let staging = ctx.0.staging.borrow_mut().pop().unwrap_or_else(Staging::new);
        Batch {
            ctx,
            staging: ManuallyDrop::new(staging),
            n: 0,
            bytes: 0,
            blade: None,
            error: None,
            _payloads: PhantomData,
        }
    }

    #[inline]
    fn staged(&self) -> &Staging {
        &self.staging
    }

    #[inline]
    fn push(
        &mut self,
        op: Opcode,
        remote: GlobalAddr,
        len: u32,
        compare_add: u64,
        swap: u64,
        payload: &'a [u8],
    ) -> u32 {
        let off = self.bytes;
        let end = u64::from(off) + u64::from(len).next_multiple_of(8);
        let n = self.n;
        let blade = remote.blade();
        let inner = &self.ctx.0;
        // Every refusal is recorded out of line: the usual push stays small
        // enough to inline where a WR is added.
        if self.error.is_some()
            || n >= MAX_BATCH
            || end > inner.cfg.slot_bytes as u64
            || self.blade.is_some_and(|b| b != blade)
            || blade as usize >= inner.blades.len()
        {
            self.refuse(remote, end);
            return 0;
        }
        self.blade = Some(blade);
        let rkey = inner.blades[blade as usize].rkey;
        let st = &mut **self.staging;
        st.wrs[n] = WorkRequest { op, local_off: off, len, remote, rkey, compare_add, swap };
        if op == Opcode::Write {
            // Only a WRITE's entry is ever read (by the post).
            st.payloads[n] = (payload.as_ptr(), payload.len());
        }
        self.n = n + 1;
        self.bytes = end as u32;
        off
    }

    /// Records why a WR to `remote` ending at local byte `end` cannot join
    /// the batch (the first reason only; the post reports it).
    #[cold]
    #[inline(never)]
    fn refuse(&mut self, remote: GlobalAddr, end: u64) {
        if self.error.is_some() {
            return;
        }
        self.error = Some(match self.blade {
            Some(b) if b != remote.blade() => Error::BatchSpansBlades(b, remote.blade()),
            _ if self.ctx.0.blades.get(remote.blade() as usize).is_none() => {
                Error::NoSuchBlade(remote.blade(), self.ctx.0.blades.len())
            }
            _ if self.n == MAX_BATCH => {
                Error::BatchTooLarge { what: format!("more than {MAX_BATCH} WRs"), knob: "slots (MAX_BATCH is fixed)" }
            }
            _ => Error::BatchTooLarge {
                what: format!("{end} local bytes, a slot holds {}", self.ctx.0.cfg.slot_bytes),
                knob: "slot_bytes",
            },
        });
    }

    /// Adds a READ of `len` bytes at `addr`.
    #[inline]
    pub fn read(&mut self, addr: GlobalAddr, len: usize) -> ReadRef {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        ReadRef { off: self.push(Opcode::Read, addr, len, 0, 0, &[]), len }
    }

    /// Adds a WRITE of `data` at `addr` (copied into registered memory at post).
    #[inline]
    pub fn write(&mut self, addr: GlobalAddr, data: &'a [u8]) {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.push(Opcode::Write, addr, len, 0, 0, data);
    }

    /// Adds a CAS of the 8-byte word at `addr`: `expected` → `new`.
    #[inline]
    pub fn cas(&mut self, addr: GlobalAddr, expected: u64, new: u64) -> AtomicRef {
        AtomicRef { off: self.push(Opcode::Cas, addr, 8, expected, new, &[]) }
    }

    /// Adds an FAA of `add` to the 8-byte word at `addr`.
    #[inline]
    pub fn faa(&mut self, addr: GlobalAddr, add: u64) -> AtomicRef {
        AtomicRef { off: self.push(Opcode::Faa, addr, 8, add, 0, &[]) }
    }

    /// WRs in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the batch has no WR.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Posts the batch with one doorbell and waits for its completion.
    /// The batch is empty afterwards and may be refilled.
    ///
    /// # Errors
    /// [`Error::Wc`] if a WR completed with an error (the QP is then in the
    /// error state, see [`Ctx::reset_qp`]); errors of building the batch
    /// (too large, two blades, unknown blade); transport errors.
    #[inline]
    pub fn post(&mut self) -> Post<'_, 'a> {
        Post { batch: self, slot: None, credit_ticket: None }
    }

    fn clear(&mut self) {
        self.n = 0;
        self.bytes = 0;
        self.blade = None;
    }
}

impl Drop for Batch<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `staging` is taken once, here, and never used after.
        let st = unsafe { ManuallyDrop::take(&mut self.staging) };
        self.ctx.0.staging.borrow_mut().push(st);
    }
}

/// The future of [`Batch::post`].
#[must_use = "a batch is posted only when the future is awaited"]
pub struct Post<'b, 'a> {
    batch: &'b mut Batch<'a>,
    slot: Option<u16>,
    /// Place in the FIFO for WorkReqThrot credits, while waiting for them.
    credit_ticket: Option<u64>,
}

impl fmt::Debug for Post<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Post").field("slot", &self.slot).finish()
    }
}

impl<'a> Future for Post<'_, 'a> {
    type Output = Result<Done<'a>>;

    // Always inlined into the awaiting future: it is only a branch to the
    // out-of-line post or the short completion check, polled twice per
    // batch.
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.slot {
            // Posted already: wait for the completion (the small, hot half).
            Some(slot) => self.poll_completion(slot, cx),
            None => self.post_now(cx),
        }
    }
}

impl<'a> Post<'_, 'a> {
    #[inline]
    fn poll_completion(&mut self, slot: u16, cx: &mut Context<'_>) -> Poll<Result<Done<'a>>> {
        let inner = &self.batch.ctx.0;
        let task = inner.local_task(cx.waker());
        let status = inner.slots.borrow_mut().poll_done(slot, task, cx.waker(), inner.coarse_now.get());
        match status {
            Poll::Pending => Poll::Pending,
            Poll::Ready(status) => {
                self.slot = None;
                Poll::Ready(match status {
                    Ok(()) => Ok(Done { ctx: self.batch.ctx, slot, base: slot_base(inner, slot) }),
                    Err(Failure::Wc(status, index)) => Err(Error::Wc { status, index }),
                    Err(Failure::TimedOut { qp, waited_ns }) => {
                        let waited_ms = waited_ns / 1_000_000;
                        if let Some(s) = &inner.silence {
                            s.mark(qp, waited_ms);
                        }
                        Err(Error::Timeout { blade: qp, waited_ms })
                    }
                })
            }
        }
    }

    /// Takes credits (WorkReqThrot) and a slot, copies the WRITE payloads,
    /// and rings the doorbell.
    #[inline(never)]
    fn post_now(&mut self, cx: &mut Context<'_>) -> Poll<Result<Done<'a>>> {
        let this = self;
        let inner = &this.batch.ctx.0;
        let b = &mut *this.batch;
        if let Some(e) = b.error.take() {
            b.clear();
            return Poll::Ready(Err(e));
        }
        if b.n == 0 {
            return Poll::Ready(Err(Error::InvalidWr("empty batch")));
        }
        if let (Some(s), Some(blade)) = (&inner.silence, b.blade) {
            // A blade found silent is not waited for again.
            if let Err(e) = s.check(blade) {
                b.clear();
                return Poll::Ready(Err(e));
            }
        }
        let nwr = b.n as u32;
        if let Some(c) = &inner.credits {
            // Credits are handed out first come, first served; a newcomer
            // goes at once when they also suffice for a full batch of each
            // ticket ahead (see `Fifo::newcomer_fits`).
            let fifo = &inner.credit_fifo;
            let plenty =
                this.credit_ticket.is_none() && fifo.newcomer_fits(c.available(), i64::from(nwr), MAX_BATCH as i64);
            if !(plenty && c.try_acquire(nwr)) {
                let t = *this.credit_ticket.get_or_insert_with(|| fifo.ticket());
                if !fifo.is_turn(t) || !c.try_acquire(nwr) {
                    fifo.wait(t, cx.waker());
                    return Poll::Pending;
                }
                this.credit_ticket = None;
                fifo.entered(t);
            }
        }
        // One borrow of the slots for take → post → InFlight (the backend
        // never calls back into the runtime).
        let mut slots = inner.slots.borrow_mut();
        let Some(slot) = slots.take(cx.waker()) else {
            drop(slots);
            // Woken when a slot frees; the credits go back meanwhile.
            if let Some(c) = &inner.credits {
                c.release(nwr);
                inner.credit_fifo.wake_turn();
            }
            return Poll::Pending;
        };
        let base = slot_base(inner, slot);
        let staged = &mut **b.staging;
        {
            let mut st = inner.stats.borrow_mut();
            for (wr, &(ptr, len)) in staged.wrs[..b.n].iter_mut().zip(&staged.payloads[..b.n]) {
                wr.local_off += base;
                match wr.op {
                    Opcode::Read => {
                        st.reads += 1;
                        st.bytes_read += u64::from(wr.len);
                    }
                    Opcode::Write => {
                        // SAFETY: the payload was borrowed for the batch's
                        // lifetime `'a`, which `self.batch` still holds.
                        let payload = unsafe { std::slice::from_raw_parts(ptr, len) };
                        // SAFETY: the slot was just taken, so no WR is in
                        // flight into it and no `Done` views it.
                        unsafe { inner.local.bytes_mut(wr.local_off, wr.len) }.copy_from_slice(payload);
                        st.writes += 1;
                        st.bytes_written += u64::from(wr.len);
                    }
                    Opcode::Cas => st.cas += 1,
                    Opcode::Faa => st.faa += 1,
                }
            }
            st.wrs += u64::from(nwr);
            st.doorbells += 1;
        }
        let wr_id = slots.wr_id(slot);
        let blade = b.blade.expect("a non-empty batch has a blade");
        let posted = inner.ep.borrow_mut().post(blade, wr_id, &staged.wrs[..b.n]);
        inner.posted.set(true);
        b.clear();
        if let Err(e) = posted {
            slots.release(slot);
            drop(slots);
            if let Some(c) = &inner.credits {
                c.release(nwr);
                inner.credit_fifo.wake_turn();
            }
            return Poll::Ready(Err(e));
        }
        let posted_ns = if inner.measure_rtt { inner.now_ns() } else { inner.coarse_now.get() };
        slots.posted(slot, blade, nwr as u16, posted_ns, inner.local_task(cx.waker()), cx.waker());
        this.slot = Some(slot);
        Poll::Pending
    }
}

/// Posts every batch in `batches` (each one doorbell, to any blades, all
/// rung before any completion is awaited) and waits for all of them: the
/// way to overlap the round trips to several blades. Result `i` is that of
/// `batches[i]` (`None` where there is no batch). `N` is small (a
/// transaction's blades): the futures and results live in arrays of `N`.
pub async fn post_all<'b, 'a, const N: usize>(
    batches: &'b mut [Option<Batch<'a>>; N],
) -> [Option<Result<Done<'a>>>; N] {
    let mut it = batches.iter_mut();
    let posts: [Option<Post<'_, 'a>>; N] = std::array::from_fn(|_| it.next().and_then(|b| b.as_mut()).map(Batch::post));
    PostAll { posts, out: std::array::from_fn(|_| None) }.await
}

struct PostAll<'b, 'a, const N: usize> {
    posts: [Option<Post<'b, 'a>>; N],
    out: [Option<Result<Done<'a>>>; N],
}

impl<'a, const N: usize> Future for PostAll<'_, 'a, N> {
    type Output = [Option<Result<Done<'a>>>; N];

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut pending = false;
        for (p, o) in this.posts.iter_mut().zip(this.out.iter_mut()) {
            if let Some(post) = p {
                match Pin::new(post).poll(cx) {
                    Poll::Ready(r) => {
                        *o = Some(r);
                        *p = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(std::mem::replace(&mut this.out, std::array::from_fn(|_| None)))
        }
    }
}

impl Drop for Post<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        // A post awaited to its end holds neither (the usual drop).
        if self.credit_ticket.is_some() || self.slot.is_some() {
            self.cancel();
        }
    }
}

impl Post<'_, '_> {
    /// A post dropped while waiting: gives up its place for credits, and
    /// its slot.
    #[cold]
    #[inline(never)]
    fn cancel(&mut self) {
        let inner = &self.batch.ctx.0;
        if let Some(t) = self.credit_ticket.take() {
            inner.credit_fifo.abandon(t);
        }
        if let Some(slot) = self.slot.take() {
            // The backend may still write into the slot: it stays Orphaned
            // until the completion arrives (or is freed now if it came).
            inner.slots.borrow_mut().abandon(slot);
        }
    }
}

fn slot_base(inner: &super::ctx::Inner, slot: u16) -> u32 {
    (slot as usize * inner.cfg.slot_bytes) as u32
}

/// A completed batch: read results and old values of atomics. Holds its slot
/// until dropped.
pub struct Done<'a> {
    ctx: &'a Ctx,
    slot: u16,
    base: u32,
}

impl fmt::Debug for Done<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Done").field("slot", &self.slot).finish()
    }
}

impl Done<'_> {
    /// The bytes a READ fetched.
    #[inline]
    pub fn bytes(&self, r: ReadRef) -> &[u8] {
        assert!(r.off as usize + r.len as usize <= self.ctx.0.cfg.slot_bytes, "ReadRef of another batch");
        // SAFETY: the slot's batch completed and this `Done` owns the slot
        // until it is dropped, so nothing writes the range meanwhile.
        unsafe { self.ctx.0.local.bytes(self.base + r.off, r.len) }
    }

    /// The old value returned by a CAS or FAA (a CAS succeeded iff it equals
    /// the expected value).
    #[inline]
    pub fn old(&self, a: AtomicRef) -> u64 {
        assert!(a.off as usize + 8 <= self.ctx.0.cfg.slot_bytes, "AtomicRef of another batch");
        // SAFETY: as in `bytes`.
        let b = unsafe { self.ctx.0.local.bytes(self.base + a.off, 8) };
        u64::from_ne_bytes(b.try_into().expect("8 bytes"))
    }
}

impl Drop for Done<'_> {
    #[inline]
    fn drop(&mut self) {
        // Held → Free.
        self.ctx.0.slots.borrow_mut().release(self.slot);
    }
}
