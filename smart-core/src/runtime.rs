//! The per-thread coroutine runtime.
//!
//! One [`Runtime`] per worker thread owns that thread's
//! [`Endpoint`](crate::backend::Endpoint) and runs its coroutines (futures)
//! on a single-threaded executor. A coroutine builds a [`Batch`] and awaits
//! [`Batch::post`]; when no coroutine can run, the executor polls the CQ and
//! wakes the coroutines whose batches completed — the Smart coroutine model.
//!
//! **Slots.** Every in-flight batch occupies a *slot*: a fixed range of the
//! thread's registered local memory holding its WRITE payloads and receiving
//! its READ data and atomic results, plus the waker of its coroutine. A slot
//! moves Free → InFlight → Done → Free; if the awaiting future is dropped
//! while its batch is in flight the slot becomes Orphaned and is only freed
//! when the completion arrives, so the backend never writes into memory that
//! someone else already reuses. Slots and local memory are allocated once
//! when the runtime starts; posting allocates nothing and takes no lock.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::backend::{BladeInfo, Endpoint, LocalMem, Transport};
use crate::layout;
use crate::ready::ReadySet;
use crate::smart::{Backoff, CreditThrottle, SmartConfig, Tuner};
use crate::stats::VerbStats;
use crate::verbs::{Completion, Opcode, WcStatus, WorkRequest};
use crate::{Error, GlobalAddr, Result};

/// Most WRs in one batch.
pub const MAX_BATCH: usize = 16;

/// Sizes of a thread's runtime, and the Smart techniques it applies.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// Most batches in flight at once on this thread (a coroutine waits for a
    /// free slot when all are taken).
    pub slots: usize,
    /// Local bytes per slot: bounds the READ and WRITE bytes of one batch.
    pub slot_bytes: usize,
    /// Bytes taken from a blade's heap at a time by [`Ctx::alloc`].
    pub chunk_bytes: u64,
    /// Coroutines the thread will run (the ceiling of `n_max`).
    pub coroutines: usize,
    /// The Smart techniques.
    pub smart: SmartConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            slots: 256,
            slot_bytes: 16 << 10,
            chunk_bytes: 1 << 20,
            coroutines: 8,
            smart: SmartConfig::default(),
        }
    }
}

/// The adaptive state of the Smart techniques on one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SmartState {
    /// WorkReqThrot: the credit limit in force.
    pub credit_limit: Option<u32>,
    /// ConflictAvoid: the backoff cap in nanoseconds.
    pub backoff_cap_ns: Option<u64>,
    /// ConflictAvoid: coroutines allowed inside an operation.
    pub n_max: Option<usize>,
    /// ConflictAvoid: C0 in nanoseconds (the measured round trip when
    /// calibrated).
    pub backoff_base_ns: Option<u64>,
}

/// How often the executor ticks the tuner and the backoff controller.
const TICK_NS: u64 = 50_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    InFlight,
    Done(Result<(), (WcStatus, u16)>),
    /// Completed and viewed by a live [`Done`].
    Held,
    Orphaned,
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    generation: u32,
    /// WRs of the batch: the credits it returns on completion.
    wrs: u16,
    /// When it was posted (ns since start), to measure round trips.
    posted_ns: u64,
    waker: Option<Waker>,
}

#[derive(Debug)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<u16>,
    waiters: VecDeque<Waker>,
}

impl Slots {
    fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        s.state = SlotState::Free;
        s.waker = None;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(i);
        if let Some(w) = self.waiters.pop_front() {
            w.wake();
        }
    }
}

/// Wakers waiting for something (a slot, credits, an operation permit).
#[derive(Debug, Default)]
struct WaitQueue(RefCell<VecDeque<Waker>>);

impl WaitQueue {
    fn push(&self, w: &Waker) {
        self.0.borrow_mut().push_back(w.clone());
    }
    fn wake_all(&self) {
        loop {
            let w = self.0.borrow_mut().pop_front();
            match w {
                Some(w) => w.wake(),
                None => break,
            }
        }
    }
}

/// First-come-first-served admission: waiters take tickets and enter in
/// ticket order, so a coroutine that just finished cannot barge ahead of
/// ones already waiting (which starves them when the resource is scarce).
#[derive(Debug, Default)]
struct Fifo {
    next: Cell<u64>,
    serving: Cell<u64>,
    /// Tickets given up by dropped waiters.
    abandoned: RefCell<Vec<u64>>,
    waiters: WaitQueue,
}

impl Fifo {
    fn ticket(&self) -> u64 {
        let t = self.next.get();
        self.next.set(t + 1);
        t
    }

    fn is_turn(&self, t: u64) -> bool {
        t == self.serving.get()
    }

    /// Ticket `t` (whose turn it was) entered: the next one's turn.
    fn entered(&self, t: u64) {
        debug_assert!(self.is_turn(t));
        self.serving.set(t + 1);
        self.skip_abandoned();
        self.waiters.wake_all();
    }

    /// Ticket `t` will never enter.
    fn abandon(&self, t: u64) {
        self.abandoned.borrow_mut().push(t);
        self.skip_abandoned();
        self.waiters.wake_all();
    }

    fn skip_abandoned(&self) {
        let mut ab = self.abandoned.borrow_mut();
        while let Some(i) = ab.iter().position(|t| *t == self.serving.get()) {
            ab.swap_remove(i);
            self.serving.set(self.serving.get() + 1);
        }
    }
}

struct Inner {
    ep: RefCell<Box<dyn Endpoint>>,
    local: Arc<LocalMem>,
    blades: Vec<BladeInfo>,
    cfg: RuntimeConfig,
    slots: RefCell<Slots>,
    stats: Cell<VerbStats>,
    chunks: RefCell<Vec<(u64, u64)>>,
    thread: usize,
    clock: quanta::Clock,
    start: quanta::Instant,
    /// WorkReqThrot.
    credits: Option<CreditThrottle>,
    credit_fifo: Fifo,
    tuner: RefCell<Option<Tuner>>,
    completed_wrs: Cell<u64>,
    /// ConflictAvoid.
    backoff: RefCell<Option<Backoff>>,
    in_op: Cell<usize>,
    op_fifo: Fifo,
    rng: Cell<u64>,
    /// Whether to time batches (for ConflictAvoid's C0), and the smoothed
    /// round trip in ns.
    measure_rtt: bool,
    rtt_ns: Cell<u64>,
    /// Sleeping coroutines: (deadline in ns since `start`, waker).
    timers: RefCell<Vec<(u64, Waker)>>,
}

impl Inner {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock.now().saturating_duration_since(self.start).as_nanos() as u64
    }
}

/// A coroutine's handle on its thread's runtime: cheap to clone, not `Send`.
#[derive(Clone)]
pub struct Ctx(Rc<Inner>);

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").field("thread", &self.0.thread).field("blades", &self.0.blades.len()).finish()
    }
}

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
    wrs: [WorkRequest; MAX_BATCH],
    payloads: [&'a [u8]; MAX_BATCH],
    n: usize,
    bytes: u32,
    blade: Option<u16>,
    error: Option<Error>,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").field("wrs", &&self.wrs[..self.n]).field("error", &self.error).finish()
    }
}

impl<'a> Batch<'a> {
    fn push(
        &mut self,
        op: Opcode,
        remote: GlobalAddr,
        len: u32,
        compare_add: u64,
        swap: u64,
        payload: &'a [u8],
    ) -> u32 {
        if self.error.is_some() {
            return 0;
        }
        if let Some(b) = self.blade {
            if b != remote.blade() {
                self.error = Some(Error::BatchSpansBlades(b, remote.blade()));
                return 0;
            }
        }
        let Some(info) = self.ctx.0.blades.get(remote.blade() as usize) else {
            self.error = Some(Error::NoSuchBlade(remote.blade(), self.ctx.0.blades.len()));
            return 0;
        };
        let off = self.bytes;
        let end = u64::from(off) + u64::from(len).next_multiple_of(8);
        if self.n == MAX_BATCH {
            self.error = Some(Error::BatchTooLarge {
                what: format!("more than {MAX_BATCH} WRs"),
                knob: "slots (MAX_BATCH is fixed)",
            });
            return 0;
        }
        if end > self.ctx.0.cfg.slot_bytes as u64 {
            self.error = Some(Error::BatchTooLarge {
                what: format!("{end} local bytes, a slot holds {}", self.ctx.0.cfg.slot_bytes),
                knob: "slot_bytes",
            });
            return 0;
        }
        self.blade = Some(remote.blade());
        self.wrs[self.n] = WorkRequest { op, local_off: off, len, remote, rkey: info.rkey, compare_add, swap };
        self.payloads[self.n] = payload;
        self.n += 1;
        self.bytes = end as u32;
        off
    }

    /// Adds a READ of `len` bytes at `addr`.
    pub fn read(&mut self, addr: GlobalAddr, len: usize) -> ReadRef {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        ReadRef { off: self.push(Opcode::Read, addr, len, 0, 0, &[]), len }
    }

    /// Adds a WRITE of `data` at `addr` (copied into registered memory at post).
    pub fn write(&mut self, addr: GlobalAddr, data: &'a [u8]) {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.push(Opcode::Write, addr, len, 0, 0, data);
    }

    /// Adds a CAS of the 8-byte word at `addr`: `expected` → `new`.
    pub fn cas(&mut self, addr: GlobalAddr, expected: u64, new: u64) -> AtomicRef {
        AtomicRef { off: self.push(Opcode::Cas, addr, 8, expected, new, &[]) }
    }

    /// Adds an FAA of `add` to the 8-byte word at `addr`.
    pub fn faa(&mut self, addr: GlobalAddr, add: u64) -> AtomicRef {
        AtomicRef { off: self.push(Opcode::Faa, addr, 8, add, 0, &[]) }
    }

    /// WRs in the batch.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the batch has no WR.
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
    pub fn post(&mut self) -> Post<'_, 'a> {
        Post { batch: self, slot: None, credit_ticket: None }
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

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let inner = &this.batch.ctx.0;
        if let Some(slot) = this.slot {
            let mut slots = inner.slots.borrow_mut();
            let s = &mut slots.slots[slot as usize];
            return match s.state {
                SlotState::Done(status) => {
                    this.slot = None;
                    match status {
                        Ok(()) => {
                            s.state = SlotState::Held;
                            Poll::Ready(Ok(Done { ctx: this.batch.ctx, slot, base: slot_base(inner, slot) }))
                        }
                        Err((status, index)) => {
                            slots.release(slot);
                            Poll::Ready(Err(Error::Wc { status, index }))
                        }
                    }
                }
                _ => {
                    if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        s.waker = Some(cx.waker().clone());
                    }
                    Poll::Pending
                }
            };
        }
        let b = &mut *this.batch;
        if let Some(e) = b.error.take() {
            b.n = 0;
            b.bytes = 0;
            b.blade = None;
            return Poll::Ready(Err(e));
        }
        if b.n == 0 {
            return Poll::Ready(Err(Error::InvalidWr("empty batch")));
        }
        if let Some(c) = &inner.credits {
            // Credits are handed out first come, first served.
            let fifo = &inner.credit_fifo;
            let t = *this.credit_ticket.get_or_insert_with(|| fifo.ticket());
            if !fifo.is_turn(t) || !c.try_acquire(b.n as u32) {
                fifo.waiters.push(cx.waker());
                return Poll::Pending;
            }
            this.credit_ticket = None;
            fifo.entered(t);
        }
        let slot = {
            let mut slots = inner.slots.borrow_mut();
            match slots.free.pop() {
                Some(s) => s,
                None => {
                    slots.waiters.push_back(cx.waker().clone());
                    drop(slots);
                    if let Some(c) = &inner.credits {
                        c.release(b.n as u32);
                    }
                    return Poll::Pending;
                }
            }
        };
        let base = slot_base(inner, slot);
        let mut st = inner.stats.get();
        for (wr, payload) in b.wrs[..b.n].iter_mut().zip(&b.payloads[..b.n]) {
            wr.local_off += base;
            match wr.op {
                Opcode::Read => {
                    st.reads += 1;
                    st.bytes_read += u64::from(wr.len);
                }
                Opcode::Write => {
                    // SAFETY: the slot was just taken from the free list, so no
                    // WR is in flight into it and no `Done` views it.
                    unsafe { inner.local.bytes_mut(wr.local_off, wr.len) }.copy_from_slice(payload);
                    st.writes += 1;
                    st.bytes_written += u64::from(wr.len);
                }
                Opcode::Cas => st.cas += 1,
                Opcode::Faa => st.faa += 1,
            }
        }
        st.wrs += b.n as u64;
        st.doorbells += 1;
        let generation = inner.slots.borrow().slots[slot as usize].generation;
        let wr_id = u64::from(generation) << 16 | u64::from(slot);
        let blade = b.blade.expect("a non-empty batch has a blade");
        let posted = inner.ep.borrow_mut().post(blade, wr_id, &b.wrs[..b.n]);
        let nwr = b.n as u16;
        b.n = 0;
        b.bytes = 0;
        b.blade = None;
        let mut slots = inner.slots.borrow_mut();
        if let Err(e) = posted {
            slots.release(slot);
            if let Some(c) = &inner.credits {
                c.release(u32::from(nwr));
            }
            return Poll::Ready(Err(e));
        }
        inner.stats.set(st);
        let s = &mut slots.slots[slot as usize];
        s.state = SlotState::InFlight;
        s.wrs = nwr;
        if inner.measure_rtt {
            s.posted_ns = inner.now_ns();
        }
        s.waker = Some(cx.waker().clone());
        this.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for Post<'_, '_> {
    fn drop(&mut self) {
        if let Some(t) = self.credit_ticket {
            self.batch.ctx.0.credit_fifo.abandon(t);
        }
        if let Some(slot) = self.slot {
            // Dropped while in flight: the backend may still write into the
            // slot, so keep it until the completion arrives (or free it now if
            // the completion already came).
            let mut slots = self.batch.ctx.0.slots.borrow_mut();
            match slots.slots[slot as usize].state {
                SlotState::Done(_) => slots.release(slot),
                _ => {
                    slots.slots[slot as usize].state = SlotState::Orphaned;
                    slots.slots[slot as usize].waker = None;
                }
            }
        }
    }
}

fn slot_base(inner: &Inner, slot: u16) -> u32 {
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
    pub fn bytes(&self, r: ReadRef) -> &[u8] {
        assert!(r.off as usize + r.len as usize <= self.ctx.0.cfg.slot_bytes, "ReadRef of another batch");
        // SAFETY: the slot's batch completed and this `Done` owns the slot
        // until it is dropped, so nothing writes the range meanwhile.
        unsafe { self.ctx.0.local.bytes(self.base + r.off, r.len) }
    }

    /// The old value returned by a CAS or FAA (a CAS succeeded iff it equals
    /// the expected value).
    pub fn old(&self, a: AtomicRef) -> u64 {
        assert!(a.off as usize + 8 <= self.ctx.0.cfg.slot_bytes, "AtomicRef of another batch");
        // SAFETY: as in `bytes`.
        let b = unsafe { self.ctx.0.local.bytes(self.base + a.off, 8) };
        u64::from_ne_bytes(b.try_into().expect("8 bytes"))
    }
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.ctx.0.slots.borrow_mut().release(self.slot);
    }
}

impl Ctx {
    /// An empty batch.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            ctx: self,
            wrs: [EMPTY_WR; MAX_BATCH],
            payloads: [&[]; MAX_BATCH],
            n: 0,
            bytes: 0,
            blade: None,
            error: None,
        }
    }

    /// Index of this worker thread.
    pub fn thread(&self) -> usize {
        self.0.thread
    }

    /// The memory blades.
    pub fn blades(&self) -> &[BladeInfo] {
        &self.0.blades
    }

    /// The runtime's sizes.
    pub fn config(&self) -> &RuntimeConfig {
        &self.0.cfg
    }

    /// Counters of this thread so far.
    pub fn stats(&self) -> VerbStats {
        self.0.stats.get()
    }

    /// Starts an application-level operation that may retry (ConflictAvoid).
    /// With coroutine throttling on, waits until fewer than `n_max` of this
    /// thread's coroutines are inside one. Report failed attempts with
    /// [`Op::retry`]; dropping the `Op` ends it.
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
    pub async fn op(&self) -> Op<'_> {
        EnterOp { inner: &self.0, ticket: None, entered: false }.await;
        Op { ctx: self, attempts: 0 }
    }

    /// Sleeps for `ns` nanoseconds, letting the thread's other coroutines run.
    pub async fn sleep_ns(&self, ns: u64) {
        Sleep { inner: &self.0, deadline: self.0.now_ns() + ns, armed: false }.await;
    }

    /// The adaptive state of the Smart techniques on this thread.
    pub fn smart_state(&self) -> SmartState {
        let b = self.0.backoff.borrow();
        SmartState {
            credit_limit: self.0.credits.as_ref().map(CreditThrottle::limit),
            backoff_cap_ns: b.as_ref().map(Backoff::cap_ns),
            n_max: b.as_ref().map(Backoff::n_max),
            backoff_base_ns: b.as_ref().map(Backoff::base_ns),
        }
    }

    /// READs `dst.len()` bytes at `addr`.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn read(&self, addr: GlobalAddr, dst: &mut [u8]) -> Result<()> {
        let mut b = self.batch();
        let r = b.read(addr, dst.len());
        let done = b.post().await?;
        dst.copy_from_slice(done.bytes(r));
        Ok(())
    }

    /// READs the 8-byte little-endian word at `addr`.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn read_u64(&self, addr: GlobalAddr) -> Result<u64> {
        let mut w = [0u8; 8];
        self.read(addr, &mut w).await?;
        Ok(u64::from_le_bytes(w))
    }

    /// WRITEs `src` at `addr`.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn write(&self, addr: GlobalAddr, src: &[u8]) -> Result<()> {
        let mut b = self.batch();
        b.write(addr, src);
        b.post().await.map(drop)
    }

    /// CAS at `addr`; returns the old value (success iff it equals `expected`).
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn cas(&self, addr: GlobalAddr, expected: u64, new: u64) -> Result<u64> {
        let mut b = self.batch();
        let a = b.cas(addr, expected, new);
        let done = b.post().await?;
        Ok(done.old(a))
    }

    /// FAA at `addr`; returns the old value.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn faa(&self, addr: GlobalAddr, add: u64) -> Result<u64> {
        let mut b = self.batch();
        let a = b.faa(addr, add);
        let done = b.post().await?;
        Ok(done.old(a))
    }

    /// Brings this thread's QP to `blade` back from the error state.
    ///
    /// # Errors
    /// [`Error::QpBusy`] while batches are in flight on it.
    pub fn reset_qp(&self, blade: u16) -> Result<()> {
        self.0.ep.borrow_mut().reset_qp(blade)
    }

    /// Checks blade `blade`'s superblock (magic, layout version, size).
    ///
    /// # Errors
    /// [`Error::Layout`] naming what is wrong; verb errors.
    pub async fn check_blade(&self, blade: u16) -> Result<()> {
        let size = self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?.size;
        let mut sb = [0u8; 24];
        self.read(GlobalAddr::new(blade, 0), &mut sb).await?;
        let w = |i: usize| u64::from_le_bytes(sb[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        layout::check_words(w(0), w(1), w(2), size).map_err(|source| Error::Layout { blade, source })
    }

    /// Allocates `size` bytes aligned to `align` (a power of two ≤ 4096) on
    /// blade `blade`. Small allocations come from a chunk this thread took
    /// from the blade's heap with one FAA (the last chunk may be partial);
    /// large ones (over a quarter chunk) are cut with a CAS loop that never
    /// moves the heap pointer past the end, so a failed large request leaves
    /// the rest of the heap usable. Chunks are at most 1/64 of the blade.
    /// Memory is never returned to the blade (applications recycle it).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the blade's heap is exhausted.
    pub async fn alloc(&self, blade: u16, size: u64, align: u64) -> Result<GlobalAddr> {
        let info = *self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?;
        assert!(align.is_power_of_two() && align <= 4096, "align must be a power of two up to 4096");
        let size = size.max(1);
        let chunk = self.0.cfg.chunk_bytes.min(info.size / 64).next_multiple_of(4096);
        let oom = || Error::OutOfMemory { blade, bytes: size, size: info.size };
        let heap = GlobalAddr::new(blade, layout::OFF_HEAP);
        if size > chunk / 4 {
            let take = size.next_multiple_of(4096);
            let mut cur = self.read_u64(heap).await?;
            loop {
                let end = cur.checked_add(take).filter(|e| *e <= info.size).ok_or_else(oom)?;
                match self.cas(heap, cur, end).await? {
                    old if old == cur => return Ok(GlobalAddr::new(blade, cur)),
                    old => cur = old,
                }
            }
        }
        loop {
            {
                let mut chunks = self.0.chunks.borrow_mut();
                let (cur, end) = &mut chunks[blade as usize];
                let at = cur.next_multiple_of(align);
                if at + size <= *end {
                    // (`at` cannot overflow: chunks end inside the blade.)
                    *cur = at + size;
                    return Ok(GlobalAddr::new(blade, at));
                }
            }
            let off = self.faa(heap, chunk).await?;
            if off >= info.size {
                return Err(oom());
            }
            // Another coroutine of this thread may have refilled meanwhile;
            // the newest chunk wins and the rest of the older one is left.
            self.0.chunks.borrow_mut()[blade as usize] = (off, (off + chunk).min(info.size));
        }
    }

    /// Looks up the named root `name` on `blade`.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn root(&self, blade: u16, name: &str) -> Result<Option<GlobalAddr>> {
        let tag = layout::root_tag(name);
        let mut table = [0u8; (layout::ROOT_ENTRIES * layout::ROOT_ENTRY_SIZE) as usize];
        self.read(GlobalAddr::new(blade, layout::OFF_ROOTS), &mut table).await?;
        let word = |i: u64| u64::from_le_bytes(table[i as usize * 8..i as usize * 8 + 8].try_into().expect("8 bytes"));
        for probe in 0..layout::ROOT_ENTRIES {
            let e = (tag + probe) % layout::ROOT_ENTRIES;
            match word(2 * e) {
                0 => return Ok(None),
                t if t == tag => {
                    let a = word(2 * e + 1);
                    return Ok((a != 0).then(|| GlobalAddr::from_raw(a)));
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Sets the named root `name` on `blade` to `addr` unless it is set
    /// already; returns the root's value (the winner's, under a race).
    ///
    /// # Errors
    /// [`Error::RootsFull`]; verb errors.
    pub async fn set_root(&self, blade: u16, name: &str, addr: GlobalAddr) -> Result<GlobalAddr> {
        assert!(!addr.is_null(), "a root cannot be null");
        let tag = layout::root_tag(name);
        for probe in 0..layout::ROOT_ENTRIES {
            let e = layout::root_entry(tag + probe);
            let old = self.cas(GlobalAddr::new(blade, e), 0, tag).await?;
            if old == 0 || old == tag {
                let prev = self.cas(GlobalAddr::new(blade, e + 8), 0, addr.raw()).await?;
                return Ok(if prev == 0 { addr } else { GlobalAddr::from_raw(prev) });
            }
        }
        Err(Error::RootsFull(blade))
    }
}

/// Yields once to the thread's other coroutines.
pub fn yield_now() -> YieldNow {
    YieldNow(false)
}

/// The future of [`yield_now`].
#[derive(Debug)]
pub struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[derive(Debug)]
struct TaskWaker {
    ready: Arc<ReadySet>,
    idx: usize,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.wake(self.idx);
    }
}

/// Most tasks one runtime runs.
pub const MAX_TASKS: usize = 4096;

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// A single-threaded executor bound to one thread's endpoint.
pub struct Runtime {
    ctx: Ctx,
    tasks: Vec<Option<Task>>,
    wakers: Vec<Waker>,
    ready: Arc<ReadySet>,
    live: usize,
    cq: Vec<Completion>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("ctx", &self.ctx).field("live", &self.live).finish()
    }
}

impl Runtime {
    /// Opens worker thread `thread`'s endpoint on `transport` and builds its
    /// runtime. Call it on the thread that will run it.
    ///
    /// # Errors
    /// If the endpoint cannot be opened, or the config is out of range.
    pub fn new(transport: &dyn Transport, thread: usize, cfg: RuntimeConfig) -> Result<Runtime> {
        if let Some(tc) = &cfg.smart.work_req_throt {
            if tc.candidates.is_empty() || tc.candidates.contains(&0) || tc.delta_ns == 0 {
                return Err(Error::Unsupported("work-req-throt needs non-zero candidates and Δ".into()));
            }
        }
        if cfg.slots == 0 || cfg.slots >= 1 << 16 || cfg.slot_bytes < 64 || cfg.slot_bytes % 8 != 0 {
            return Err(Error::Unsupported(format!("runtime config out of range: {cfg:?}")));
        }
        if cfg.slots as u64 * cfg.slot_bytes as u64 > u64::from(u32::MAX) {
            return Err(Error::Unsupported("slots × slot_bytes must stay below 4 GiB".into()));
        }
        let ep = transport.open_thread(thread, cfg.slots * cfg.slot_bytes)?;
        let local = ep.local().clone();
        let slots = Slots {
            slots: (0..cfg.slots)
                .map(|_| Slot { state: SlotState::Free, generation: 0, wrs: 0, posted_ns: 0, waker: None })
                .collect(),
            free: (0..cfg.slots as u16).rev().collect(),
            waiters: VecDeque::with_capacity(64),
        };
        let blades = transport.blades().to_vec();
        let nslots = cfg.slots;
        let measure_rtt = cfg.smart.conflict_avoid.is_some_and(|b| b.calibrate_base);
        let clock = quanta::Clock::new();
        let start = clock.now();
        let (tuner, credits) = match &cfg.smart.work_req_throt {
            Some(tc) => {
                let (t, limit) = Tuner::new(tc.clone(), 0, 0);
                (Some(t), Some(CreditThrottle::new(limit)))
            }
            None => (None, None),
        };
        let backoff = cfg.smart.conflict_avoid.map(|bc| Backoff::new(bc, cfg.coroutines, 0));
        let inner = Inner {
            ep: RefCell::new(ep),
            local,
            chunks: RefCell::new(vec![(0, 0); blades.len()]),
            blades,
            cfg,
            slots: RefCell::new(slots),
            stats: Cell::new(VerbStats::default()),
            thread,
            clock,
            start,
            credits,
            credit_fifo: Fifo::default(),
            tuner: RefCell::new(tuner),
            completed_wrs: Cell::new(0),
            backoff: RefCell::new(backoff),
            in_op: Cell::new(0),
            op_fifo: Fifo::default(),
            rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ (thread as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1),
            timers: RefCell::new(Vec::with_capacity(64)),
            measure_rtt,
            rtt_ns: Cell::new(0),
        };
        Ok(Runtime {
            ctx: Ctx(Rc::new(inner)),
            tasks: Vec::new(),
            wakers: Vec::new(),
            ready: Arc::new(ReadySet::new(MAX_TASKS / 64)),
            live: 0,
            cq: Vec::with_capacity(nslots),
        })
    }

    /// A handle for coroutines of this runtime.
    pub fn ctx(&self) -> Ctx {
        self.ctx.clone()
    }

    /// Adds a coroutine; it starts at the next [`Runtime::run`].
    ///
    /// # Panics
    /// Past [`MAX_TASKS`] coroutines.
    pub fn spawn(&mut self, fut: impl Future<Output = ()> + 'static) {
        let idx = match self.tasks.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                assert!(self.tasks.len() < MAX_TASKS, "at most {MAX_TASKS} coroutines per runtime");
                self.tasks.push(None);
                self.wakers
                    .push(Waker::from(Arc::new(TaskWaker { ready: self.ready.clone(), idx: self.tasks.len() - 1 })));
                self.tasks.len() - 1
            }
        };
        self.tasks[idx] = Some(Box::pin(fut));
        self.live += 1;
        self.wakers[idx].wake_by_ref();
    }

    /// Runs until every spawned coroutine has finished.
    pub fn run(&mut self) {
        self.run_until(|| false);
    }

    /// Runs `fut` (and any other spawned coroutines meanwhile) to completion.
    pub fn block_on<F: Future + 'static>(&mut self, fut: F) -> F::Output {
        let out = Rc::new(RefCell::new(None));
        let slot = out.clone();
        self.spawn(async move {
            *slot.borrow_mut() = Some(fut.await);
        });
        self.run_until(|| out.borrow().is_some());
        let v = out.borrow_mut().take();
        v.expect("block_on future finished")
    }

    fn run_until(&mut self, done: impl Fn() -> bool) {
        let mut idle = 0u32;
        let adaptive = self.ctx.0.tuner.borrow().is_some() || self.ctx.0.backoff.borrow().is_some();
        let mut next_tick = 0u64;
        while self.live > 0 && !done() {
            if adaptive || !self.ctx.0.timers.borrow().is_empty() {
                let now = self.ctx.0.now_ns();
                self.ctx.0.fire_timers(now);
                if adaptive && now >= next_tick {
                    self.ctx.0.tick(now);
                    next_tick = now + TICK_NS;
                }
            }
            let mut ran = false;
            let used = self.tasks.len().div_ceil(64);
            for w in 0..used {
                let mut bits = self.ready.take(w);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    ran = true;
                    if let Some(task) = self.tasks[i].as_mut() {
                        let mut cx = Context::from_waker(&self.wakers[i]);
                        if task.as_mut().poll(&mut cx).is_ready() {
                            self.tasks[i] = None;
                            self.live -= 1;
                        }
                    }
                }
            }
            if self.poll_cq() > 0 || ran {
                idle = 0;
            } else {
                idle += 1;
                // Block only when no coroutine sleeps on a (short) timer.
                if idle >= 64 && self.ctx.0.timers.borrow().is_empty() {
                    self.ctx.0.ep.borrow_mut().idle();
                }
            }
        }
    }

    /// Polls the CQ once and wakes the owners of finished batches.
    fn poll_cq(&mut self) -> usize {
        self.cq.clear();
        let n = self.ctx.0.ep.borrow_mut().poll(&mut self.cq);
        if n == 0 {
            return 0;
        }
        let inner = &self.ctx.0;
        let mut slots = inner.slots.borrow_mut();
        let mut errors = 0;
        let mut returned = 0u32;
        let now = if inner.measure_rtt { inner.now_ns() } else { 0 };
        for c in &self.cq {
            let idx = (c.wr_id & 0xffff) as u16;
            let generation = (c.wr_id >> 16) as u32;
            let Some(s) = slots.slots.get_mut(idx as usize) else { continue };
            if s.generation != generation {
                continue;
            }
            errors += u64::from(c.status.is_err());
            if matches!(s.state, SlotState::InFlight | SlotState::Orphaned) {
                returned += u32::from(s.wrs);
                if inner.measure_rtt {
                    // EWMA with weight 1/16.
                    let rtt = now.saturating_sub(s.posted_ns);
                    let old = inner.rtt_ns.get();
                    inner.rtt_ns.set(if old == 0 { rtt } else { old - old / 16 + rtt / 16 });
                }
            }
            match s.state {
                SlotState::Orphaned => slots.release(idx),
                SlotState::InFlight => {
                    s.state = SlotState::Done(c.status);
                    if let Some(w) = s.waker.take() {
                        w.wake();
                    }
                }
                SlotState::Free | SlotState::Done(_) | SlotState::Held => {}
            }
        }
        drop(slots);
        if errors > 0 {
            let mut st = inner.stats.get();
            st.error_completions += errors;
            inner.stats.set(st);
        }
        inner.completed_wrs.set(inner.completed_wrs.get() + u64::from(returned));
        if let Some(c) = &inner.credits {
            c.release(returned);
            inner.credit_fifo.waiters.wake_all();
        }
        n
    }
}

impl Inner {
    /// Wakes the coroutines whose sleep ended.
    fn fire_timers(&self, now: u64) {
        let mut t = self.timers.borrow_mut();
        let mut i = 0;
        while i < t.len() {
            if t[i].0 <= now {
                t.swap_remove(i).1.wake();
            } else {
                i += 1;
            }
        }
    }

    /// Advances the tuner and the backoff controller.
    fn tick(&self, now: u64) {
        if let Some(t) = self.tuner.borrow_mut().as_mut() {
            if let Some(limit) = t.tick(now, self.completed_wrs.get()) {
                self.credits.as_ref().expect("credits exist with a tuner").set_limit(limit);
                self.credit_fifo.waiters.wake_all();
            }
        }
        if let Some(b) = self.backoff.borrow_mut().as_mut() {
            if self.rtt_ns.get() > 0 {
                b.calibrate(self.rtt_ns.get());
            }
            if b.tick(now) {
                self.op_fifo.waiters.wake_all();
            }
        }
    }

    fn random(&self) -> u64 {
        // xorshift64*: per-thread, no allocation, good enough for jitter.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Sleeps until `deadline` (ns since the runtime started).
struct Sleep<'a> {
    inner: &'a Inner,
    deadline: u64,
    armed: bool,
}

impl Future for Sleep<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.now_ns() >= self.deadline {
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            self.inner.timers.borrow_mut().push((self.deadline, cx.waker().clone()));
        }
        Poll::Pending
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
        let t = *self.ticket.get_or_insert_with(|| fifo.ticket());
        let n_max = inner.backoff.borrow().as_ref().map_or(usize::MAX, Backoff::n_max);
        if fifo.is_turn(t) && inner.in_op.get() < n_max {
            inner.in_op.set(inner.in_op.get() + 1);
            self.entered = true;
            fifo.entered(t);
            Poll::Ready(())
        } else {
            fifo.waiters.push(cx.waker());
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
pub struct Op<'a> {
    ctx: &'a Ctx,
    attempts: u32,
}

impl fmt::Debug for Op<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op").field("attempts", &self.attempts).finish()
    }
}

impl Op<'_> {
    /// Reports an unsuccessful attempt (a failed CAS, a conflict) and waits
    /// before the next one: with ConflictAvoid a random time up to
    /// min(cap, C0 · 2^k) for the k-th retry, yielding to the thread's other
    /// coroutines; without it, no wait (the baseline's immediate retry).
    pub async fn retry(&mut self) {
        self.attempts += 1;
        let inner = &*self.ctx.0;
        let bound = inner.backoff.borrow_mut().as_mut().map(|b| b.on_retry(self.attempts));
        let mut st = inner.stats.get();
        st.retries += 1;
        if let Some(bound) = bound {
            let wait = inner.random() % (bound + 1);
            st.backoff_ns += wait;
            inner.stats.set(st);
            if wait > 0 {
                Sleep { inner, deadline: inner.now_ns() + wait, armed: false }.await;
            }
        } else {
            inner.stats.set(st);
        }
    }

    /// Retries reported so far.
    pub fn retries(&self) -> u32 {
        self.attempts
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let inner = &*self.ctx.0;
        if let Some(b) = inner.backoff.borrow_mut().as_mut() {
            b.on_op();
        }
        inner.in_op.set(inner.in_op.get() - 1);
        inner.op_fifo.waiters.wake_all();
    }
}
