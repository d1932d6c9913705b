//! Backends: the one interface that every transport implements.
//!
//! A [`Transport`] is the process-wide part (an RNIC context with its
//! protection domain and connections to the memory blades); each worker
//! thread opens an [`Endpoint`] from it (its CQ, its QPs — one per memory
//! blade — and its registered local memory). The runtime only talks to the
//! `Endpoint` trait, so the embedded, TCP and verbs backends are
//! interchangeable at start-up.

pub mod embedded;
pub mod tcp;

pub(crate) mod softnic;
pub mod verbs;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use memmap2::MmapMut;

use crate::smart::{QpPlan, QpPolicy};
use crate::verbs::{Completion, WorkRequest};
use crate::{Error, Result};

pub use embedded::{ChaosConfig, EmbeddedTransport};
pub use tcp::TcpTransport;

/// What a compute blade knows of one memory blade after connecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BladeInfo {
    /// Bytes in the blade's registered region.
    pub size: u64,
    /// The region's remote key; WRs with another key fail.
    pub rkey: u32,
}

/// What one thread's endpoint must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadSpec {
    /// Bytes of registered local memory.
    pub local_bytes: usize,
    /// The most WRs the thread has in flight at once over all its QPs (the
    /// runtime's slots × [`MAX_BATCH`](crate::runtime::MAX_BATCH)). The
    /// verbs backend sizes its send queues and CQ from it, so that neither
    /// can overflow, not even when every WR of an errored QP comes back as
    /// a flushed completion.
    pub max_wrs: usize,
    /// The owner its connections name to the memory blades (0: none), for
    /// [`Endpoint::revoke`]: e.g. a compute blade's registration nonce.
    pub fence_tag: u64,
}

/// What the memory blades do about a revoked owner ([`Endpoint::revoke`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fencing {
    /// These many blades refuse the owner's connections from now on: no
    /// verb of theirs runs there after the call returned.
    Enforced(usize),
    /// The backend's blades cannot refuse them (why): the embedded one,
    /// whose blades live in the compute process.
    NotEnforced(&'static str),
}

/// The process-wide part of a backend.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Short name for reports ("embedded", "tcp", "verbs").
    fn name(&self) -> &'static str;

    /// The memory blades, indexed by [`GlobalAddr::blade`](crate::GlobalAddr::blade).
    fn blades(&self) -> &[BladeInfo];

    /// Opens the endpoint of one worker thread, sized by `spec`. Call it on
    /// the thread that will use it.
    ///
    /// # Errors
    /// If connecting to a blade or registering memory fails.
    fn open_thread(&self, thread: usize, spec: ThreadSpec) -> Result<Box<dyn Endpoint>>;

    /// Sets the QP and doorbell plan (ThdResAlloc) for the threads opened
    /// afterwards. The default accepts only the plain per-thread-QP plan.
    ///
    /// # Errors
    /// If the backend cannot realize the plan's policy.
    fn configure(&self, plan: QpPlan) -> Result<()> {
        if plan.policy == QpPolicy::PerThreadQp && !plan.shared_cq {
            Ok(())
        } else {
            Err(Error::Unsupported(format!(
                "the {} backend supports only per-thread QPs and CQs (asked {}, shared CQ {})",
                self.name(),
                plan.policy,
                plan.shared_cq
            )))
        }
    }

    /// How often each (emulated) doorbell was rung, if the backend counts.
    fn doorbell_rings(&self) -> Vec<u64> {
        Vec::new()
    }

    /// The blades that this transport's runtimes found silent (see
    /// [`Silence`]), if it keeps track: the TCP backend does. (Over RDMA a
    /// time-out does not mean a silent blade: one-sided verbs never wait
    /// for the blade's CPU, and the QP of a revoked owner drops its verbs
    /// while the blade's other QPs work, so the verbs backend keeps none.)
    fn silence(&self) -> Option<Arc<Silence>> {
        None
    }

    /// The simulation behind a simulated transport (`smart-sim`), which the
    /// run harness hands its worker threads' runtimes to drive in virtual
    /// time instead of running an OS thread per worker. `None` (the
    /// default) for real backends.
    fn simulation(&self) -> Option<&dyn Simulation> {
        None
    }
}

/// A transport whose blades, network and NICs are simulated in virtual
/// time: it runs many simulated threads' runtimes on the calling OS thread,
/// deterministically (see the `smart-sim` crate).
pub trait Simulation: Send + Sync {
    /// Runs `runtimes` (each a simulated thread opened on this transport)
    /// until every coroutine of every one of them has finished. `control`
    /// is called with the virtual time (ns) first and then whenever the
    /// time it last returned is reached, before anything later happens; it
    /// returns the next virtual time it wants to be called at (`u64::MAX`:
    /// never again). The harness uses it to start and stop the measured
    /// phase and to print progress.
    ///
    /// # Errors
    /// If a runtime was not opened on this simulation.
    fn drive(&self, runtimes: &mut [crate::Runtime], control: &mut dyn FnMut(u64) -> u64) -> Result<()>;

    /// The simulation's virtual time now, in ns (the latest any simulated
    /// thread has reached).
    fn now_ns(&self) -> u64;

    /// What the simulation is and did so far, for the result record.
    fn summary(&self) -> SimSummary;

    /// Runs `task` on a simulated thread of its own (thread index `thread`,
    /// runtime `cfg`) in the background: every [`Simulation::drive`] on
    /// this OS thread runs it beside the runtimes it drives, until the task
    /// ends or [`Simulation::stop_background`]. For work that a real
    /// compute blade does on a thread of its own, such as renewing a lease.
    /// Returns the task's id.
    ///
    /// # Errors
    /// If its runtime cannot be opened.
    fn spawn_background(&self, thread: usize, cfg: crate::RuntimeConfig, task: BackgroundTask) -> Result<u64>;

    /// Stops background task `id` (dropping its runtime), from the OS
    /// thread that spawned it. Unknown ids are ignored.
    fn stop_background(&self, id: u64);

    /// The harness says that a timed run (not a load) starts at virtual
    /// time `now_ns`: the instants of injected faults count from there
    /// (default: nothing to do).
    fn timed_run_started(&self, now_ns: u64) {
        let _ = now_ns;
    }
}

/// The work of a background simulated thread ([`Simulation::spawn_background`]).
pub type BackgroundTask = Box<dyn FnOnce(crate::Ctx) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>;

/// What a simulation reports about itself ([`Simulation::summary`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimSummary {
    /// The hardware profile's name.
    pub profile: String,
    /// Simulated compute blades.
    pub compute_blades: usize,
    /// Threads per simulated compute blade.
    pub threads_per_compute_blade: usize,
    /// Simulated memory blades.
    pub memory_blades: usize,
    /// Virtual seconds simulated.
    pub virtual_s: f64,
    /// Wall-clock seconds since the simulation was built.
    pub wall_s: f64,
    /// Events run.
    pub events: u64,
    /// WRs simulated.
    pub verbs: u64,
    /// WRs simulated per wall-clock second: the simulator's own speed.
    pub verbs_per_wall_s: f64,
}

/// One thread's view of a backend: a CQ, one QP per blade, local memory.
///
/// Contract: WRs of one `post` go to one QP, execute in order, and complete
/// with exactly one [`Completion`] carrying `wr_id`; batches on one QP
/// complete in posting order; nothing is ordered across QPs. After a failed
/// WR the QP is in the error state: later batches complete with
/// [`WcStatus::Flushed`](crate::WcStatus::Flushed) until [`Endpoint::reset_qp`].
pub trait Endpoint: fmt::Debug {
    /// The thread's registered local memory.
    fn local(&self) -> &Arc<LocalMem>;

    /// Posts one batch to the QP of blade `qp` (one doorbell).
    ///
    /// # Errors
    /// [`Error::InvalidWr`] if a WR's local range is outside local memory or
    /// it targets another blade; I/O errors of the transport. Remote errors
    /// (bounds, rkey) are reported as error completions instead.
    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()>;

    /// Moves finished completions into `out` (appending); returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize;

    /// Called when the executor has nothing to run and `poll` found nothing
    /// several times in a row: a backend whose completions arrive from
    /// elsewhere may block here briefly instead of spinning.
    fn idle(&mut self) {}

    /// The clock the runtime on this endpoint reads: `None` (the default)
    /// for the host's cycle counter; a simulated backend gives its thread's
    /// virtual time (see [`crate::clock`]).
    fn clock(&self) -> Option<crate::clock::Clock> {
        None
    }

    /// Whether the executor ends a round right after a coroutine that
    /// posted, so that a simulation can interleave its threads at every
    /// post in virtual-time order (default false).
    fn preempts(&self) -> bool {
        false
    }

    /// Brings an errored QP back to a working state (RESET → RTS).
    ///
    /// # Errors
    /// [`Error::QpBusy`] if batches are still in flight on that QP.
    fn reset_qp(&mut self, qp: u16) -> Result<()>;

    /// Makes every memory blade refuse the connections whose
    /// [`ThreadSpec::fence_tag`] is `tag` (see [`crate::fence`]), from any
    /// process: once it returns `Enforced`, none of their verbs runs on a
    /// blade any more. A control operation that blocks the thread for a
    /// round trip per blade (recovery calls it once per dead compute blade).
    ///
    /// # Errors
    /// A blade that cannot be reached or does not answer; tag 0.
    fn revoke(&mut self, tag: u64) -> Result<Fencing>;
}

/// A thread's registered local memory: the buffers WRs read from and
/// land in.
///
/// Backends write into it when WRs complete while the runtime holds other
/// parts of it, so it hands out raw views; the runtime's slot discipline
/// (each in-flight batch owns a disjoint range until its completion) is what
/// makes those views exclusive.
pub struct LocalMem {
    ptr: NonNull<u8>,
    len: usize,
    _map: Arc<MmapMut>,
}

// SAFETY: `LocalMem` is plain registered memory reached only through raw
// views whose exclusivity the runtime's slot discipline guarantees: a range
// is written by a backend (on whichever thread completes the WR, as an RNIC
// DMA would) only while its batch is in flight, and read by the owning
// runtime only after the completion was handed over through a
// synchronizing queue. The mapping itself is never moved or resized.
unsafe impl Send for LocalMem {}
// SAFETY: as above.
unsafe impl Sync for LocalMem {}

impl fmt::Debug for LocalMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalMem").field("len", &self.len).finish()
    }
}

impl LocalMem {
    /// Allocates `len` zeroed bytes (page-aligned).
    ///
    /// # Errors
    /// If the mapping fails.
    pub fn new(len: usize) -> Result<Arc<LocalMem>> {
        let map = MmapMut::map_anon(len.max(1)).map_err(|e| Error::Io { peer: "local memory".into(), cause: e })?;
        Ok(Self::within(Arc::new(map), 0, len))
    }

    /// `len` bytes at `off` of a mapping shared with other threads' local
    /// memory (one registration for all).
    ///
    /// # Panics
    /// If the range is outside the mapping.
    pub(crate) fn within(map: Arc<MmapMut>, off: usize, len: usize) -> Arc<LocalMem> {
        assert!(off.checked_add(len).is_some_and(|e| e <= map.len()), "local memory inside its mapping");
        let base = map.as_ptr().cast_mut();
        // SAFETY: in bounds (checked above) of a live mapping, never null.
        let ptr = unsafe { NonNull::new_unchecked(base.add(off)) };
        Arc::new(LocalMem { ptr, len, _map: map })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address (for registration with an RNIC).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether `[off, off+len)` lies inside.
    pub fn contains(&self, off: u32, len: u32) -> bool {
        (off as usize).checked_add(len as usize).is_some_and(|e| e <= self.len)
    }

    /// A shared view of `[off, off+len)`.
    ///
    /// # Safety
    /// The range must be inside, and nothing may write it while the view
    /// lives (no WR in flight lands there, no `bytes_mut` view overlaps).
    pub unsafe fn bytes(&self, off: u32, len: u32) -> &[u8] {
        debug_assert!(self.contains(off, len));
        // SAFETY: in bounds and unaliased by writers, per the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off as usize), len as usize) }
    }

    /// An exclusive view of `[off, off+len)`.
    ///
    /// # Safety
    /// The range must be inside and no other view of it may exist while this
    /// one lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: u32, len: u32) -> &mut [u8] {
        debug_assert!(self.contains(off, len));
        // SAFETY: in bounds and exclusive, per the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off as usize), len as usize) }
    }
}

/// Checks a batch before it is posted, the same way on every backend: the
/// local ranges, the blade, and the shape of atomics (CAS and FAA act on
/// exactly 8 bytes at an 8-byte aligned remote address, as RDMA requires;
/// an RNIC refuses other atomics at post time, so they are refused here
/// for every backend alike).
#[inline]
pub fn validate_batch(local: &LocalMem, qp: u16, wrs: &[WorkRequest]) -> Result<()> {
    if wrs.is_empty() {
        return Err(Error::InvalidWr("empty batch"));
    }
    let atomic_ok = |wr: &WorkRequest| !wr.op.is_atomic() || (wr.len == 8 && wr.remote.offset() % 8 == 0);
    if wrs.iter().all(|wr| wr.remote.blade() == qp && local.contains(wr.local_off, wr.len) && atomic_ok(wr)) {
        return Ok(());
    }
    for wr in wrs {
        if !local.contains(wr.local_off, wr.len) {
            return Err(Error::InvalidWr("local range outside registered local memory"));
        }
        if wr.remote.blade() != qp {
            return Err(Error::InvalidWr("WR targets another blade than its QP"));
        }
        if wr.op.is_atomic() && wr.len != 8 {
            return Err(Error::InvalidWr("an atomic (CAS/FAA) acts on exactly 8 bytes"));
        }
        if wr.op.is_atomic() && wr.remote.offset() % 8 != 0 {
            return Err(Error::InvalidWr("an atomic (CAS/FAA) needs an 8-byte aligned remote address"));
        }
    }
    Ok(())
}

/// The memory blades that a batch timed out on and that have sent nothing
/// since, shared by every runtime of one transport.
///
/// Once a blade is silent, nothing waits for it again: a new batch to it,
/// or a new thread's connection, fails at once with [`Error::Silent`]
/// instead of waiting another request time-out (a process that meets a
/// frozen blade then stops within one time-out, whatever it does after
/// the first). The first bytes the blade sends again (TCP) make it
/// answering again.
#[derive(Debug)]
pub struct Silence {
    /// Per blade: how long its batch waited, in ms; 0 while it answers.
    waited_ms: Box<[std::sync::atomic::AtomicU64]>,
}

impl Silence {
    /// Nothing silent among `blades` blades.
    pub fn new(blades: usize) -> Arc<Silence> {
        Arc::new(Silence { waited_ms: (0..blades).map(|_| std::sync::atomic::AtomicU64::new(0)).collect() })
    }

    /// Blade `blade` did not answer a batch within `waited_ms`.
    pub fn mark(&self, blade: u16, waited_ms: u64) {
        if let Some(w) = self.waited_ms.get(usize::from(blade)) {
            w.store(waited_ms.max(1), std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// `Err(`[`Error::Silent`]`)` if `blade` is silent.
    ///
    /// # Errors
    /// As said.
    #[inline]
    pub fn check(&self, blade: u16) -> Result<()> {
        match self.waited_ms.get(usize::from(blade)).map(|w| w.load(std::sync::atomic::Ordering::Relaxed)) {
            Some(w) if w != 0 => Err(Error::Silent { blade, waited_ms: w }),
            _ => Ok(()),
        }
    }

    /// Blade `blade` sent something: it answers again.
    #[inline]
    pub fn heard(&self, blade: u16) {
        if let Some(w) = self.waited_ms.get(usize::from(blade)) {
            if w.load(std::sync::atomic::Ordering::Relaxed) != 0 {
                w.store(0, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}
