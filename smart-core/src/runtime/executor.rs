//! The executor: one per worker thread, running that thread's coroutines
//! on its endpoint. When no coroutine can run, it polls the CQ and wakes the
//! coroutines whose batches completed (the Smart coroutine model).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use super::batch::Staging;
use super::config::{RuntimeConfig, EXPIRE_EVERY_NS, MAX_BATCH, TICK_NS};
use super::ctx::Inner;
use super::keygate::KeyGates;
use super::ready::ReadySet;
use super::slot::{Completed, Slots};
use super::timer::Timers;
use super::waiting::Fifo;
use super::Ctx;
use crate::backend::{ThreadSpec, Transport};
use crate::clock::Clock;
use crate::smart::{Backoff, CreditThrottle, Tuner};
use crate::stats::VerbStats;
use crate::verbs::Completion;
use crate::{Error, Result};

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

/// Passes over the ready tasks in one executor round before the CQ is
/// polled again (see `run_until`).
const SAME_ROUND_PASSES: usize = 16;

/// In a run of idle rounds (no completion, no task ran), the clock is read
/// on every this many-th round only. A clock read is tens of cycles with a
/// usable TSC, but a system call where the kernel's clocksource is not the
/// TSC (`hpet`, `acpi_pm`: in some VMs, and under emulation an emulated
/// device read): there, reading it on every spin of the poll loop
/// took the CPU from the work (a race-ht load over Soft-RoCE under qemu
/// ran ~30x slower than with the TSC). Timers and the request time-out see
/// a clock at most this many idle rounds old.
const CLOCK_EVERY_IDLE: u32 = 16;

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
    /// Whether rounds end after a coroutine that posted (a simulation).
    preempt: bool,
    /// The loop's bookkeeping between calls.
    sim_state: Option<LoopState>,
}

/// What one executor round did ([`Runtime::sim_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// A coroutine posted, and the round ended there (preempting endpoints).
    Preempted,
    /// Coroutines ran or completions arrived.
    Worked,
    /// Nothing could run and nothing completed.
    Idle,
}

/// The executor loop's bookkeeping.
#[derive(Clone, Copy, Debug)]
struct LoopState {
    /// Idle rounds in a row.
    idle: u32,
    /// Whether a technique needs the tick.
    adaptive: bool,
    next_tick: u64,
    timeout_ns: Option<u64>,
    next_expiry: u64,
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
        if cfg.slots == 0 || cfg.slots >= 1 << 16 || cfg.slot_bytes < 64 || cfg.slot_bytes % 8 != 0 {
            return Err(Error::Unsupported(format!("runtime config out of range: {cfg:?}")));
        }
        if cfg.slots as u64 * cfg.slot_bytes as u64 > u64::from(u32::MAX) {
            return Err(Error::Unsupported("slots × slot_bytes must stay below 4 GiB".into()));
        }
        let spec = ThreadSpec {
            local_bytes: cfg.slots * cfg.slot_bytes,
            max_wrs: cfg.slots * MAX_BATCH,
            fence_tag: cfg.fence_tag,
        };
        let ep = transport.open_thread(thread, spec)?;
        let local = ep.local().clone();
        let slots = Slots::new(cfg.slots);
        let blades = transport.blades().to_vec();
        let nslots = cfg.slots;
        let measure_rtt = cfg.smart.conflict_avoid.is_some_and(|b| b.calibrate_base);
        let preempt = ep.preempts();
        let clock = ep.clock().unwrap_or_else(Clock::host);
        let (tuner, credits) = match &cfg.smart.work_req_throt {
            Some(tc) => {
                // The range search's ceiling: every WR this thread can have in flight.
                let bound = u32::try_from(cfg.slots * MAX_BATCH).unwrap_or(u32::MAX);
                let tc = tc.clone().resolve(bound).map_err(Error::Unsupported)?;
                let (t, limit) = Tuner::new(tc, 0, 0);
                (Some(t), Some(CreditThrottle::new(limit)))
            }
            None => (None, None),
        };
        let backoff = cfg.smart.conflict_avoid.map(|bc| Backoff::new(bc, cfg.coroutines, 0));
        let key_gates = cfg.smart.conflict_avoid.filter(|bc| bc.key_gate).map(|_| KeyGates::default());
        let staging = (0..cfg.coroutines.min(MAX_TASKS)).map(|_| Staging::new()).collect();
        let inner = Inner {
            ep: RefCell::new(ep),
            local,
            chunks: RefCell::new(vec![(0, 0); blades.len()]),
            spare_chunks: RefCell::new(vec![Vec::new(); blades.len()]),
            silence: transport.silence(),
            blades,
            cfg,
            slots: RefCell::new(slots),
            // One staging area per coroutine up front; more on demand.
            staging: RefCell::new(staging),
            stats: RefCell::new(VerbStats::default()),
            thread,
            clock,
            credits,
            credit_fifo: Fifo::default(),
            tuner: RefCell::new(tuner),
            completed_wrs: Cell::new(0),
            backoff: RefCell::new(backoff),
            in_op: Cell::new(0),
            op_fifo: Fifo::default(),
            key_gates,
            rng: Cell::new(0x9e37_79b9_7f4a_7c15 ^ (thread as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1),
            timers: Timers::with_capacity(64),
            polling: Cell::new((u32::MAX, std::ptr::null(), std::ptr::null())),
            coarse_now: Cell::new(0),
            local_ready: (0..MAX_TASKS / 64).map(|_| Cell::new(0)).collect(),
            measure_rtt,
            rtt_ns: Cell::new(0),
            posted: Cell::new(false),
        };
        Ok(Runtime {
            ctx: Ctx(Rc::new(inner)),
            tasks: Vec::new(),
            wakers: Vec::new(),
            ready: Arc::new(ReadySet::new(MAX_TASKS / 64)),
            live: 0,
            cq: Vec::with_capacity(nslots),
            preempt,
            sim_state: None,
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
        let mut st = self.loop_state();
        while self.live > 0 && !done() {
            let read_clock = st.idle % CLOCK_EVERY_IDLE == 0;
            match self.round(&mut st, read_clock) {
                Round::Worked | Round::Preempted => st.idle = 0,
                Round::Idle => {
                    st.idle = st.idle.wrapping_add(1);
                    // Block only when no coroutine sleeps on a (short) timer.
                    if st.idle >= 64 && self.ctx.0.timers.is_empty() {
                        self.ctx.0.ep.borrow_mut().idle();
                    }
                }
            }
        }
        self.sim_state = Some(st);
    }

    /// The loop's bookkeeping, kept between calls (a simulation driver runs
    /// one round at a time).
    fn loop_state(&mut self) -> LoopState {
        self.sim_state.take().unwrap_or(LoopState {
            idle: 0,
            adaptive: self.ctx.0.tuner.borrow().is_some() || self.ctx.0.backoff.borrow().is_some(),
            next_tick: 0,
            timeout_ns: self.ctx.0.cfg.request_timeout.map(|t| t.as_nanos().min(u128::from(u64::MAX)) as u64),
            next_expiry: EXPIRE_EVERY_NS,
        })
    }

    /// One round of the executor: the clock and what depends on it (when
    /// `read_clock`), up to [`SAME_ROUND_PASSES`] passes over the ready
    /// coroutines, then one poll of the CQ. On a preempting endpoint (a
    /// simulation, see [`Endpoint::preempts`](crate::backend::Endpoint::preempts))
    /// the round ends right after the coroutine that posted, before the CQ
    /// poll; the next round goes on with the coroutines still ready, so the
    /// order of work is the same, only interleaved with other threads.
    #[inline(always)]
    fn round(&mut self, st: &mut LoopState, read_clock: bool) -> Round {
        let inner = &self.ctx.0;
        // The clock, timers and time-outs after a round that did work, and
        // on every CLOCK_EVERY_IDLE-th round of an idle run.
        if read_clock {
            let now = inner.now_ns();
            inner.coarse_now.set(now);
            if st.adaptive || !inner.timers.is_empty() {
                inner.timers.fire(now);
                if st.adaptive && now >= st.next_tick {
                    inner.tick(now);
                    st.next_tick = now + TICK_NS;
                }
            }
            if let Some(t) = st.timeout_ns {
                if now >= st.next_expiry {
                    st.next_expiry = now + EXPIRE_EVERY_NS;
                    inner.slots.borrow_mut().expire(now.saturating_sub(t), |task| inner.ready_local(task));
                }
            }
        }
        let mut ran = false;
        let used = self.tasks.len().div_ceil(64);
        // Coroutines woken by this round's polls (the next waiter of a
        // FIFO whose turn just came, a freed slot's waiter) run in this
        // round too, so their batches join this round's doorbells;
        // bounded, so that a coroutine that yields cannot keep the CQ
        // from being polled.
        for _ in 0..SAME_ROUND_PASSES {
            let mut any = false;
            for w in 0..used {
                let inner = &self.ctx.0;
                // Cross-thread wakes (an atomic swap only when there are
                // some), then this thread's own completions.
                let mut bits = if self.ready.peek(w) != 0 { self.ready.take(w) } else { 0 };
                bits |= inner.local_ready[w].replace(0);
                any |= bits != 0;
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if let Some(task) = self.tasks[i].as_mut() {
                        let waker = &self.wakers[i];
                        inner.polling.set((i as u32, waker.data(), waker.vtable()));
                        let mut cx = Context::from_waker(waker);
                        if task.as_mut().poll(&mut cx).is_ready() {
                            self.tasks[i] = None;
                            self.live -= 1;
                        }
                    }
                    if self.preempt && inner.posted.replace(false) {
                        // The coroutines not yet run this pass stay ready.
                        let w_bits = &inner.local_ready[w];
                        w_bits.set(w_bits.get() | bits);
                        return Round::Preempted;
                    }
                }
            }
            if !any {
                break;
            }
            ran = true;
        }
        if self.poll_cq() > 0 || ran {
            Round::Worked
        } else {
            Round::Idle
        }
    }

    /// For a simulation driver: runs one round of the executor (see
    /// [`Runtime::round`]), reading the clock first, and says what it did.
    #[doc(hidden)]
    pub fn sim_round(&mut self) -> Round {
        let mut st = self.loop_state();
        let r = self.round(&mut st, true);
        self.sim_state = Some(st);
        r
    }

    /// For a simulation driver: the earliest raw clock time (see
    /// [`Clock::raw`]) at which this runtime has something to do without a
    /// completion arriving: a timer, the techniques' tick, the request
    /// time-out's check. `None` when nothing but completions can wake it.
    #[doc(hidden)]
    pub fn next_wake_raw(&self) -> Option<u64> {
        let inner = &self.ctx.0;
        let mut at = inner.timers.next_deadline();
        if let Some(st) = &self.sim_state {
            if st.adaptive {
                at = Some(at.map_or(st.next_tick, |a| a.min(st.next_tick)));
            }
            if st.timeout_ns.is_some() && inner.slots.borrow().in_flight() > 0 {
                at = Some(at.map_or(st.next_expiry, |a| a.min(st.next_expiry)));
            }
        }
        let start = match &inner.clock {
            Clock::Virtual { start, .. } => *start,
            Clock::Host { .. } => 0,
        };
        at.map(|ns| ns.saturating_add(start))
    }

    /// Coroutines spawned and not yet finished.
    pub fn live_tasks(&self) -> usize {
        self.live
    }

    /// The clock this runtime reads.
    pub fn clock(&self) -> &Clock {
        &self.ctx.0.clock
    }

    /// Polls the CQ once and wakes the owners of finished batches.
    fn poll_cq(&mut self) -> usize {
        self.cq.clear();
        let n = self.ctx.0.ep.borrow_mut().poll(&mut self.cq);
        if n == 0 {
            return 0;
        }
        let inner = &self.ctx.0;
        let mut errors = 0;
        let mut returned = 0u32;
        let now = if inner.measure_rtt { inner.now_ns() } else { 0 };
        {
            let mut slots = inner.slots.borrow_mut();
            for c in &self.cq {
                let Completed::Batch { wrs, posted_ns, task } = slots.complete(c.wr_id, c.status) else { continue };
                if let Some(t) = task {
                    inner.ready_local(t);
                }
                errors += u64::from(c.status.is_err());
                returned += u32::from(wrs);
                if inner.measure_rtt {
                    // EWMA with weight 1/16.
                    let rtt = now.saturating_sub(posted_ns);
                    let old = inner.rtt_ns.get();
                    inner.rtt_ns.set(if old == 0 { rtt } else { old - old / 16 + rtt / 16 });
                }
            }
        }
        if errors > 0 {
            inner.stats.borrow_mut().error_completions += errors;
        }
        inner.completed_wrs.set(inner.completed_wrs.get() + u64::from(returned));
        if let Some(c) = &inner.credits {
            c.release(returned);
            inner.credit_fifo.wake_turn();
        }
        n
    }
}

impl Inner {
    /// Advances the tuner and the backoff controller.
    fn tick(&self, now: u64) {
        let mut limit_moved = false;
        if let Some(t) = self.tuner.borrow_mut().as_mut() {
            if let Some(limit) = t.tick(now, self.completed_wrs.get()) {
                let credits = self.credits.as_ref().expect("credits exist with a tuner");
                limit_moved = limit != credits.limit();
                credits.set_limit(limit);
                self.credit_fifo.wake_turn();
            }
        }
        if let Some(b) = self.backoff.borrow_mut().as_mut() {
            if limit_moved {
                // Goodput measured under the old limit says nothing of the levels now.
                b.restart_measurement();
            }
            if self.rtt_ns.get() > 0 {
                b.calibrate(self.rtt_ns.get());
            }
            if b.tick(now) {
                self.op_fifo.wake_turn();
            }
        }
    }
}

/// Hints the CPU to start loading the cache line that holds the start of
/// `value`, for a coroutine that will read it after yielding (a lookup in a
/// large local table, overlapped with the other coroutines' work). Does
/// nothing on other architectures.
#[inline]
pub fn prefetch_local<T: ?Sized>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the pointer is to a live value; a prefetch reads nothing
    // architecturally and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
