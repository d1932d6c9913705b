//! A coroutine's handle on its thread's runtime, and the single-verb and
//! multi-piece helpers every application uses.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{RawWakerVTable, Waker};

use super::batch::{Batch, Staging};
use super::config::{RuntimeConfig, SmartState, MAX_BATCH};
use super::keygate::KeyGates;
use super::slot::Slots;
use super::timer::Timers;
use super::waiting::Fifo;
use crate::backend::{BladeInfo, Endpoint, LocalMem};
use crate::clock::Clock;
use crate::smart::{Backoff, CreditThrottle, Tuner};
use crate::stats::VerbStats;
use crate::{GlobalAddr, Result};

/// A thread's runtime state, shared by its coroutines through [`Ctx`].
pub(super) struct Inner {
    pub(super) ep: RefCell<Box<dyn Endpoint>>,
    pub(super) local: Arc<LocalMem>,
    pub(super) blades: Vec<BladeInfo>,
    /// The transport's silent blades, if it keeps track.
    pub(super) silence: Option<Arc<crate::backend::Silence>>,
    pub(super) cfg: RuntimeConfig,
    pub(super) slots: RefCell<Slots>,
    /// Staging areas of batches being built.
    #[allow(clippy::vec_box, reason = "a batch takes the box itself: the pool hands out pointers, never copies")]
    pub(super) staging: RefCell<Vec<Box<Staging>>>,
    /// Counted in place (no copy of the whole record per post).
    pub(super) stats: RefCell<VerbStats>,
    /// Per blade: the rest of the chunk this thread took from its heap.
    pub(super) chunks: RefCell<Vec<(u64, u64)>>,
    /// Per blade: whole chunks that coroutines of this thread fetched while
    /// another one's refill had already landed, for the next refills.
    pub(super) spare_chunks: RefCell<Vec<Vec<(u64, u64)>>>,
    pub(super) thread: usize,
    pub(super) clock: Clock,
    /// WorkReqThrot.
    pub(super) credits: Option<CreditThrottle>,
    pub(super) credit_fifo: Fifo,
    pub(super) tuner: RefCell<Option<Tuner>>,
    pub(super) completed_wrs: Cell<u64>,
    /// ConflictAvoid.
    pub(super) backoff: RefCell<Option<Backoff>>,
    pub(super) in_op: Cell<usize>,
    pub(super) op_fifo: Fifo,
    /// ConflictAvoid's key gate (`None` when ConflictAvoid or the gate is off).
    pub(super) key_gates: Option<KeyGates>,
    pub(super) rng: Cell<u64>,
    /// Whether to time batches (for ConflictAvoid's C0), and the smoothed
    /// round trip in ns.
    pub(super) measure_rtt: bool,
    pub(super) rtt_ns: Cell<u64>,
    /// Sleeping coroutines.
    pub(super) timers: Timers,
    /// The task being polled: its index and its waker's identity (data and
    /// vtable pointers), so that a batch it posts can name it directly.
    pub(super) polling: Cell<(u32, *const (), *const RawWakerVTable)>,
    /// The executor's clock, read once per round (ns since start): the
    /// posting time of batches, for the request time-out.
    pub(super) coarse_now: Cell<u64>,
    /// Tasks made ready by this thread's own completions (no atomics; the
    /// executor drains them with the cross-thread ready set).
    pub(super) local_ready: Box<[Cell<u64>]>,
    /// Set when a batch was posted, for a preempting executor round.
    pub(super) posted: Cell<bool>,
}

impl Inner {
    /// The local task `waker` wakes, if it is the waker of the task being
    /// polled (then marking that task ready is what waking it would do).
    #[inline]
    pub(super) fn local_task(&self, waker: &Waker) -> Option<u32> {
        let (i, data, vtable) = self.polling.get();
        (waker.data() == data && std::ptr::eq(waker.vtable(), vtable)).then_some(i)
    }

    /// Marks local task `t` ready.
    #[inline]
    pub(super) fn ready_local(&self, t: u32) {
        let w = &self.local_ready[t as usize / 64];
        w.set(w.get() | 1 << (t % 64));
    }

    #[inline]
    pub(super) fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    pub(super) fn random(&self) -> u64 {
        // xorshift64*: per-thread, no allocation, good enough for jitter.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A coroutine's handle on its thread's runtime: cheap to clone, not `Send`.
#[derive(Clone)]
pub struct Ctx(pub(super) Rc<Inner>);

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").field("thread", &self.0.thread).field("blades", &self.0.blades.len()).finish()
    }
}

impl Ctx {
    /// An empty batch.
    #[inline]
    pub fn batch(&self) -> Batch<'_> {
        Batch::new(self)
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

    /// The clock this thread's runtime reads (see [`crate::clock`]).
    pub fn clock(&self) -> &Clock {
        &self.0.clock
    }

    /// Counters of this thread so far.
    pub fn stats(&self) -> VerbStats {
        *self.0.stats.borrow()
    }

    /// Nanoseconds since this thread's runtime started, from the calibrated
    /// cycle counter (cheap: no syscall), or from the simulation's virtual
    /// time under a simulated transport.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.0.now_ns()
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

    /// WRITEs each `(address, bytes)`, batched per blade (in order), up to
    /// a slot's bytes and [`MAX_BATCH`] WRs per doorbell: the helper for
    /// writing many pieces (a page, directory entries, copied blocks) with
    /// few doorbells.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn write_many(&self, items: &[(GlobalAddr, &[u8])]) -> Result<()> {
        let room = self.0.cfg.slot_bytes;
        let mut i = 0;
        while i < items.len() {
            let blade = items[i].0.blade();
            let mut b = self.batch();
            let mut bytes = 0;
            while i < items.len()
                && b.len() < MAX_BATCH
                && items[i].0.blade() == blade
                && (b.is_empty() || bytes + items[i].1.len() <= room)
            {
                b.write(items[i].0, items[i].1);
                bytes += items[i].1.len();
                i += 1;
            }
            b.post().await?;
        }
        Ok(())
    }

    /// WRITEs `data` at `at`, however long, in pieces of half a slot, two
    /// per doorbell.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn write_all(&self, at: GlobalAddr, data: &[u8]) -> Result<()> {
        let chunk = self.0.cfg.slot_bytes / 2;
        let pieces: Vec<(GlobalAddr, &[u8])> =
            data.chunks(chunk).enumerate().map(|(i, c)| (at.add((i * chunk) as u64), c)).collect();
        self.write_many(&pieces).await
    }

    /// READs `out.len()` bytes at `at`, however many, in pieces that fit a
    /// slot.
    ///
    /// # Errors
    /// As [`Batch::post`].
    pub async fn read_all(&self, at: GlobalAddr, out: &mut [u8]) -> Result<()> {
        let chunk = self.0.cfg.slot_bytes / 2;
        for (i, c) in out.chunks_mut(chunk).enumerate() {
            self.read(at.add((i * chunk) as u64), c).await?;
        }
        Ok(())
    }

    /// Brings this thread's QP to `blade` back from the error state.
    ///
    /// # Errors
    /// [`Error::QpBusy`](crate::Error::QpBusy) while batches are in flight
    /// on it.
    pub fn reset_qp(&self, blade: u16) -> Result<()> {
        self.0.ep.borrow_mut().reset_qp(blade)
    }

    /// Makes every memory blade refuse the threads whose
    /// [`RuntimeConfig::fence_tag`] is `tag`, in any process (see
    /// [`crate::fence`] and [`Endpoint::revoke`]): once it returns
    /// [`Fencing::Enforced`](crate::Fencing::Enforced), none of their verbs
    /// runs on a blade. Blocks this thread for a round trip per blade.
    ///
    /// # Errors
    /// A blade that cannot be reached; tag 0.
    pub fn revoke(&self, tag: u64) -> Result<crate::Fencing> {
        if tag == 0 {
            return Err(crate::Error::Unsupported("fence tag 0 names no owner".into()));
        }
        self.0.ep.borrow_mut().revoke(tag)
    }
}
