//! The run harness: T worker threads × C coroutines on one transport, a
//! warmup, a timed run with a progress line per second, and a report merged
//! over all threads.
//!
//! A benchmark implements [`Bench`]: each worker thread builds its own
//! [`Runtime`], opens its per-thread state once ([`Bench::open_thread`],
//! e.g. a table handle whose caches the thread's coroutines share), and
//! spawns the coroutines ([`Bench::coroutine`]); each receives a [`Worker`]
//! through which it asks whether to go on and records its operations. The
//! harness is generic over the benchmark's error type, so applications keep
//! their own errors. [`run`] is the short form for a closure over
//! smart-core verbs only.
//! Only operations finished during the measured phase count;
//! verb counters are taken as the difference between a snapshot when the
//! thread first saw the measured phase and one when it first saw the stop.
//! Latencies go to a per-thread HDR histogram; the report merges the
//! histograms (percentiles over all operations, not averages).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use smart_core::backend::{Simulation, Transport};
use smart_core::clock::Clock;
use smart_core::runtime::{Ctx, Runtime, RuntimeConfig, SmartState};
use smart_core::smart::QpPlan;
use smart_core::stats::VerbStats;
use smart_core::{Error, Result};

use crate::latency::Latency;
use crate::record::{Record, Sample};

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// How to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Worker threads.
    pub threads: usize,
    /// Coroutines per thread.
    pub coroutines: usize,
    /// Measured time.
    pub duration: Duration,
    /// Time before measuring.
    pub warmup: Duration,
    /// Sizes of each thread's runtime.
    pub runtime: RuntimeConfig,
    /// Print a line per second on stderr.
    pub progress: bool,
    /// Seeds every coroutine's random choices ([`Worker::seed`]); recorded,
    /// so a run can be replayed.
    pub seed: u64,
    /// When set (e.g. by SIGINT), the run stops as if its time were up:
    /// coroutines finish their current operation, and the report says so.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Called once before the worker threads start (after any load): e.g. a
    /// barrier with other processes ([`smart_core::barrier`]). Its error
    /// fails the run before anything is measured.
    pub gate: Option<StartGate>,
    /// Idle time of each coroutine between its operations (zero: none), to
    /// offer less than the full load ([`Worker::idle`]).
    pub idle: Duration,
    /// Where the timed run keeps the operations its threads have completed
    /// in its measured time so far (all threads; as the per-second lines
    /// count them, within 16 operations a thread), updated every few
    /// milliseconds by the thread that samples the timeline, never by the
    /// workers: for a reader outside the run (e.g. a ford-dtx registration
    /// that publishes it on its blade, for an online copy to throttle by).
    /// Not kept under a simulation.
    pub published: Option<Arc<AtomicU64>>,
}

/// The duration of a load phase: bounded by its work, not by time.
const LOAD_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The function behind a [`StartGate`].
pub type GateFn = dyn Fn(&dyn Transport) -> Result<()> + Send + Sync;

/// What [`RunConfig::gate`] calls, with the run's transport.
#[derive(Clone)]
pub struct StartGate(pub Arc<GateFn>);

impl fmt::Debug for StartGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StartGate")
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            threads: 1,
            coroutines: 8,
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            runtime: RuntimeConfig::default(),
            progress: false,
            seed: 0,
            interrupt: None,
            gate: None,
            idle: Duration::ZERO,
            published: None,
        }
    }
}

impl RunConfig {
    /// The configuration of a load phase before this run: the same threads,
    /// coroutines, runtime and interrupt, bounded by the work (not by time),
    /// with no warm-up, no start gate, no idling and nothing published
    /// (those belong to the timed run).
    pub fn for_load(&self) -> RunConfig {
        RunConfig {
            duration: LOAD_DURATION,
            warmup: Duration::ZERO,
            gate: None,
            idle: Duration::ZERO,
            published: None,
            ..self.clone()
        }
    }

    /// Whether this is a load's configuration ([`RunConfig::for_load`]).
    pub fn is_load(&self) -> bool {
        self.duration >= LOAD_DURATION
    }

    fn interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }
}

struct ThreadRec {
    hist: Latency,
    ops: u64,
    errors: u64,
    phase_seen: u8,
    at_measure: VerbStats,
    at_stop: VerbStats,
}

/// What a thread publishes for the per-second lines: its operation count
/// and the adaptive state of the Smart techniques (u64::MAX = off).
#[derive(Debug)]
struct Published {
    ops: AtomicU64,
    credit_limit: AtomicU64,
    backoff_cap_ns: AtomicU64,
    n_max: AtomicU64,
}

impl Published {
    fn new() -> Self {
        Published {
            ops: AtomicU64::new(0),
            credit_limit: AtomicU64::new(u64::MAX),
            backoff_cap_ns: AtomicU64::new(u64::MAX),
            n_max: AtomicU64::new(u64::MAX),
        }
    }

    fn publish(&self, s: &SmartState) {
        let put = |a: &AtomicU64, v: Option<u64>| a.store(v.unwrap_or(u64::MAX), Ordering::Relaxed);
        put(&self.credit_limit, s.credit_limit.map(u64::from));
        put(&self.backoff_cap_ns, s.backoff_cap_ns);
        put(&self.n_max, s.n_max.map(|n| n as u64));
    }
}

/// Mean over threads of a published value (None when the technique is off).
fn mean(ps: &[CachePadded<Published>], f: impl Fn(&Published) -> &AtomicU64) -> Option<f64> {
    let v: Vec<u64> = ps.iter().map(|p| f(p).load(Ordering::Relaxed)).filter(|v| *v != u64::MAX).collect();
    (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64 / v.len() as f64)
}

/// A coroutine's count of something (increments, violations), kept locally
/// and added to a shared total when dropped: when the coroutine ends by the
/// stop or by an error, with no shared write per operation.
#[derive(Debug)]
pub struct Tally<'a> {
    /// The count so far.
    pub n: u64,
    into: &'a AtomicU64,
}

impl<'a> Tally<'a> {
    /// A count of 0 that goes into `into`.
    pub fn new(into: &'a AtomicU64) -> Self {
        Tally { n: 0, into }
    }
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        self.into.fetch_add(self.n, Ordering::Relaxed);
    }
}

/// splitmix64 of the run's seed, thread and coroutine.
fn mix(seed: u64, thread: u64, coroutine: u64) -> u64 {
    smart_core::hash::mix64(
        seed ^ thread.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ coroutine.wrapping_mul(0xd1b5_4a32_d192_ed03),
    )
}

/// A worker thread's arrival at the start barrier and at the end, counted
/// when it leaves by any path (an error or a panic too).
struct Arrival<'a> {
    ready: &'a AtomicUsize,
    finished: &'a AtomicUsize,
    failed: &'a AtomicBool,
    readied: bool,
    done: bool,
}

impl Arrival<'_> {
    fn ready(&mut self) {
        self.readied = true;
        self.ready.fetch_add(1, Ordering::Release);
    }

    fn finished(&mut self) {
        self.done = true;
        self.finished.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Stops the run: the main thread ends the measured phase.
            self.failed.store(true, Ordering::Relaxed);
        }
        if !self.readied {
            self.ready();
        }
        if !self.done {
            self.finished();
        }
    }
}

/// A start time taken with [`Worker::now`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

/// A coroutine's link to the harness.
#[derive(Clone)]
pub struct Worker {
    ctx: Ctx,
    coroutine: usize,
    phase: Arc<AtomicU8>,
    /// The phase this coroutine saw last (the thread's record is updated
    /// only on a change).
    seen: Cell<u8>,
    seed: u64,
    rec: Rc<RefCell<ThreadRec>>,
    progress: Arc<[CachePadded<Published>]>,
    clock: Clock,
    idle_ns: u64,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("thread", &self.ctx.thread()).field("coroutine", &self.coroutine).finish()
    }
}

impl Worker {
    /// The thread's runtime handle.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Index of the worker thread.
    pub fn thread(&self) -> usize {
        self.ctx.thread()
    }

    /// Index of the coroutine within its thread.
    pub fn coroutine(&self) -> usize {
        self.coroutine
    }

    /// Coroutines per thread in this run.
    pub fn coroutines(&self) -> usize {
        self.ctx.config().coroutines
    }

    /// This coroutine's seed: the run's seed mixed with the thread and
    /// coroutine, so every coroutine draws its own sequence and a run with
    /// the same seed draws the same ones.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Waits [`RunConfig::idle`] (letting the thread's other coroutines
    /// run), or not at all when it is zero: benchmarks call it before each
    /// operation, so that the offered load can be set below the maximum
    /// (latency against throughput).
    #[inline]
    pub async fn idle(&self) {
        if self.idle_ns > 0 {
            self.ctx.sleep_ns(self.idle_ns).await;
        }
    }

    /// Whether the run goes on (false once the measured time is over).
    #[inline]
    pub fn running(&self) -> bool {
        self.observe() != STOP
    }

    /// Whether the run is in its measured phase (not warming up, not
    /// stopped): for counters the benchmark keeps itself, beside
    /// [`Worker::record`]'s.
    #[inline]
    pub fn measuring(&self) -> bool {
        self.observe() == MEASURE
    }

    /// A timestamp from the thread's clock (the cycle counter, or virtual
    /// time under a simulated transport), to pass to [`Worker::record`]
    /// (raw: scaled to nanoseconds once, for the difference).
    #[inline]
    pub fn now(&self) -> Stamp {
        Stamp(self.clock.raw())
    }

    #[inline]
    fn observe(&self) -> u8 {
        let p = self.phase.load(Ordering::Relaxed);
        if p == self.seen.get() {
            return p;
        }
        self.seen.set(p);
        let mut r = self.rec.borrow_mut();
        if p != r.phase_seen {
            let now = self.ctx.stats();
            if r.phase_seen == WARMUP {
                r.at_measure = now;
            }
            if p == STOP {
                if r.phase_seen == WARMUP {
                    r.at_measure = now;
                }
                r.at_stop = now;
            }
            r.phase_seen = p;
        }
        p
    }

    /// Records `n` operations that started at `start` (latency per call).
    #[inline]
    pub fn record(&self, start: Stamp, n: u64) {
        let measuring = self.observe() == MEASURE;
        self.record_if(measuring, start, n);
    }

    /// Records `n` operations that started at `start`, like
    /// [`Worker::record`], and returns the time it read to do so: the start
    /// of the next operation of a closed loop that goes on at once. One
    /// clock read serves as one operation's end and the next one's start
    /// (a cycle-counter read costs tens of cycles, a tenth of a cached
    /// 8-byte READ on the embedded backend). A loop that waits between
    /// operations (idle time, a sleep) takes a fresh [`Worker::now`] after
    /// the wait instead.
    #[inline]
    pub fn lap(&self, start: Stamp, n: u64) -> Stamp {
        let now = self.clock.raw();
        if self.observe() == MEASURE {
            self.record_at(start, now, n);
        }
        Stamp(now)
    }

    /// Whether [`Worker::idle`] waits (a nonzero idle time).
    #[inline]
    pub fn idles(&self) -> bool {
        self.idle_ns > 0
    }

    /// Records like [`Worker::record`] when `measuring`, the caller's own
    /// reading of [`Worker::measuring`]: so that counters the benchmark
    /// keeps beside the harness's agree exactly with them, even when the
    /// phase changes between the two.
    #[inline]
    pub fn record_if(&self, measuring: bool, start: Stamp, n: u64) {
        if !measuring {
            return;
        }
        self.record_at(start, self.clock.raw(), n);
    }

    /// Counts `n` operations without a latency sample, for a loop that
    /// times only some of its operations (chosen independently of how long
    /// they take), as [`Worker::record`] counts them otherwise.
    #[inline]
    pub fn count(&self, n: u64) {
        if self.observe() == MEASURE {
            let mut r = self.rec.borrow_mut();
            r.ops += n;
            self.publish(&r, n);
        }
    }

    #[inline]
    fn record_at(&self, start: Stamp, end: u64, n: u64) {
        let ns = self.clock.delta_ns(start.0, end);
        let mut r = self.rec.borrow_mut();
        r.ops += n;
        r.hist.record(ns);
        self.publish(&r, n);
    }

    /// The per-second lines read this; publishing every 16 operations keeps
    /// them current and the store off most operations.
    #[inline]
    fn publish(&self, r: &ThreadRec, n: u64) {
        if r.ops % 16 < n {
            let p = &self.progress[self.ctx.thread()];
            p.ops.store(r.ops, Ordering::Relaxed);
            if r.ops % 256 < n {
                p.publish(&self.ctx.smart_state());
            }
        }
    }
}

/// The merged outcome of a run.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Worker threads.
    pub threads: usize,
    /// Coroutines per thread.
    pub coroutines: usize,
    /// Measured seconds.
    pub duration_s: f64,
    /// Operations finished in the measured phase.
    pub ops: u64,
    /// Verbs posted in the measured phase.
    pub verbs: VerbStats,
    /// Latency of operations.
    pub latency: Latency,
    /// The adaptive state of the Smart techniques per thread, at the end.
    pub smart: Vec<SmartState>,
    /// One sample per second of the measured phase.
    pub timeline: Vec<Sample>,
    /// Coroutines that ended with an error.
    pub errors: u64,
    /// The first such error.
    pub first_error: Option<String>,
    /// Whether the run was stopped by [`RunConfig::interrupt`].
    pub interrupted: bool,
}

impl RunReport {
    /// Million operations per second.
    pub fn mops(&self) -> f64 {
        self.ops as f64 / self.duration_s.max(1e-9) / 1e6
    }

    fn per_op(&self, x: u64) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            x as f64 / self.ops as f64
        }
    }

    /// The common fields of the result record.
    pub fn record(&self) -> Record {
        // One HdrHistogram for the percentiles and the record's copy.
        let hdr = self.latency.hdr();
        Record {
            duration_s: self.duration_s,
            ops: self.ops,
            throughput_mops: self.mops(),
            latency_us: crate::latency::summary_of(&hdr, self.latency.max()),
            latency_hist: crate::latency::LatencyHistogram::of(&hdr, self.latency.max()),
            verbs_per_op: self.per_op(self.verbs.wrs),
            doorbells_per_op: self.per_op(self.verbs.doorbells),
            retries_per_op: self.per_op(self.verbs.retries),
            bytes_read_per_op: self.per_op(self.verbs.bytes_read),
            bytes_written_per_op: self.per_op(self.verbs.bytes_written),
            errors: self.errors + self.verbs.error_completions,
            verbs: self.verbs,
            smart_state: self.smart.clone(),
            timeline: self.timeline.clone(),
            zero_seconds: self.timeline.iter().filter(|s| s.mops == 0.0).count(),
        }
    }

    /// A one-line human summary.
    pub fn summary_line(&self) -> String {
        let l = self.latency.summary();
        format!(
            "{:.3} Mop/s over {:.1}s ({} ops) | latency us p50 {:.1} p99 {:.1} p999 {:.1} max {:.1} | verbs/op {:.2} doorbells/op {:.2} retries/op {:.3} | errors {}",
            self.mops(),
            self.duration_s,
            self.ops,
            l.p50,
            l.p99,
            l.p999,
            l.max,
            self.per_op(self.verbs.wrs),
            self.per_op(self.verbs.doorbells),
            self.per_op(self.verbs.retries),
            self.errors + self.verbs.error_completions
        )
    }
}

/// A benchmark the harness runs: what each worker thread opens once, and
/// what each of its coroutines does.
///
/// The coroutine futures are spawned on the thread's single-threaded
/// runtime, so neither they nor the per-thread state need be `Send`; the
/// `Bench` itself is shared by all threads (`Sync`) and is where results
/// that outlive a thread are gathered ([`Bench::close_thread`]).
pub trait Bench: Sync {
    /// The benchmark's own error (the harness only prints it).
    type Error: fmt::Display + 'static;
    /// Per-thread state shared by the thread's coroutines (cloned to each).
    type Thread: Clone + 'static;

    /// Opens worker thread `ctx.thread()`'s state, before any coroutine
    /// starts (e.g. a table handle and its caches).
    ///
    /// # Errors
    /// Whatever opening fails with; the run then fails.
    fn open_thread(&self, ctx: Ctx) -> impl Future<Output = std::result::Result<Self::Thread, Self::Error>> + 'static;

    /// Coroutine `w.coroutine()` of a thread: loops while
    /// [`Worker::running`], calling [`Worker::record`] per operation.
    fn coroutine(
        &self,
        w: Worker,
        thread: Self::Thread,
    ) -> impl Future<Output = std::result::Result<(), Self::Error>> + 'static;

    /// Run on the worker thread after its coroutines finished, before
    /// [`Bench::close_thread`]: hand back what the thread holds on the
    /// blades (the default does nothing). Its verbs are not counted in the
    /// run.
    ///
    /// # Errors
    /// Whatever it fails with; the run then reports an error.
    fn finish_thread(
        &self,
        thread: &Self::Thread,
    ) -> impl Future<Output = std::result::Result<(), Self::Error>> + 'static {
        let _ = thread;
        std::future::ready(Ok(()))
    }

    /// Called on the worker thread after its coroutines finished, with its
    /// state: fold per-thread counters into `self` here.
    fn close_thread(&self, thread: Self::Thread) {
        let _ = thread;
    }
}

/// A [`Bench`] from a closure with no per-thread state (see [`run`]).
struct FnBench<F>(F);

impl<F, Fut> Bench for FnBench<F>
where
    F: Fn(Worker) -> Fut + Sync,
    Fut: Future<Output = Result<()>> + 'static,
{
    type Error = Error;
    type Thread = ();

    fn open_thread(&self, _: Ctx) -> impl Future<Output = Result<()>> + 'static {
        std::future::ready(Ok(()))
    }

    fn coroutine(&self, w: Worker, _: ()) -> impl Future<Output = Result<()>> + 'static {
        (self.0)(w)
    }
}

/// Runs `body` on `cfg.threads` × `cfg.coroutines` coroutines: the short
/// form of [`run_bench`] for bodies that use smart-core verbs only.
///
/// `body` is called once per coroutine on its worker thread and should loop
/// while [`Worker::running`], calling [`Worker::record`] per operation.
///
/// # Errors
/// If a worker thread cannot open its endpoint.
pub fn run<F, Fut>(transport: &dyn Transport, cfg: &RunConfig, body: F) -> Result<RunReport>
where
    F: Fn(Worker) -> Fut + Sync,
    Fut: Future<Output = Result<()>> + 'static,
{
    run_bench(transport, cfg, &FnBench(body))
}

/// Runs `bench` on `cfg.threads` × `cfg.coroutines` coroutines.
///
/// A thread whose [`Bench::open_thread`] fails runs no coroutine; the
/// failure is counted in [`RunReport::errors`] like a failed coroutine.
///
/// # Errors
/// If a worker thread cannot open its endpoint, or the config is empty.
pub fn run_bench<B: Bench>(transport: &dyn Transport, cfg: &RunConfig, bench: &B) -> Result<RunReport> {
    if cfg.threads == 0 || cfg.coroutines == 0 {
        return Err(Error::Unsupported("need at least one thread and one coroutine".into()));
    }
    let smart = &cfg.runtime.smart;
    let plan = QpPlan::new(smart.qp_policy, cfg.threads, transport.blades().len(), smart.doorbells);
    transport.configure(plan.with_shared_cq(smart.shared_cq))?;
    if let Some(gate) = &cfg.gate {
        (gate.0)(transport)?;
    }
    if let Some(sim) = transport.simulation() {
        return run_simulated(transport, sim, cfg, bench);
    }
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let progress: Arc<[CachePadded<Published>]> =
        (0..cfg.threads).map(|_| CachePadded::new(Published::new())).collect();
    let ready = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let (report, measured, timeline) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (phase, progress, ready, finished, failed, first_error) =
                    (phase.clone(), progress.clone(), &ready, &finished, &failed, first_error.clone());
                std::thread::Builder::new()
                    .name(format!("worker-{t}"))
                    .spawn_scoped(s, move || -> Result<ThreadOut> {
                        // Counts this thread as ready and finished however it
                        // leaves, a panic included, so nobody waits for it.
                        let mut arrival = Arrival { ready, finished, failed, readied: false, done: false };
                        let rcfg = RuntimeConfig { coroutines: cfg.coroutines, ..cfg.runtime.clone() };
                        let mut rt = match Runtime::new(transport, t, rcfg) {
                            Ok(rt) => rt,
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        };
                        let (rec, state) = open_thread(&mut rt, bench, cfg, t, &phase, &progress, &first_error);
                        arrival.ready();
                        while ready.load(Ordering::Acquire) < cfg.threads {
                            std::thread::yield_now();
                        }
                        rt.run();
                        arrival.finished();
                        Ok(close_thread(&mut rt, bench, t, rec, state, &first_error))
                    })
                    .expect("spawn worker thread")
            })
            .collect();
        while ready.load(Ordering::Acquire) < cfg.threads {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut measured = Duration::ZERO;
        let mut timeline = Vec::new();
        if !failed.load(Ordering::Relaxed) {
            if cfg.progress && !cfg.warmup.is_zero() {
                eprintln!("warming up for {:.1}s", cfg.warmup.as_secs_f64());
            }
            let warm_until = Instant::now() + cfg.warmup;
            // The operations so far, for a reader outside the run.
            let publish = |progress: &[CachePadded<Published>]| {
                if let Some(p) = &cfg.published {
                    p.store(progress.iter().map(|p| p.ops.load(Ordering::Relaxed)).sum(), Ordering::Relaxed);
                }
            };
            while Instant::now() < warm_until && !cfg.interrupted() {
                std::thread::sleep(warm_until.saturating_duration_since(Instant::now()).min(Duration::from_millis(5)));
                publish(&progress);
            }
            phase.store(MEASURE, Ordering::Relaxed);
            let t0 = Instant::now();
            let mut last = 0u64;
            let mut tick = 1u64;
            loop {
                let next = t0 + Duration::from_secs(tick).min(cfg.duration);
                // Sleep to the next tick, but end early once every thread's
                // coroutines have returned.
                while Instant::now() < next
                    && finished.load(Ordering::Acquire) < cfg.threads
                    && !failed.load(Ordering::Relaxed)
                    && !cfg.interrupted()
                {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()).min(Duration::from_millis(5)));
                    publish(&progress);
                }
                let total: u64 = progress.iter().map(|p| p.ops.load(Ordering::Relaxed)).sum();
                let elapsed = t0.elapsed();
                let span = elapsed.as_secs_f64() - (tick - 1) as f64;
                let sample = Sample {
                    t_s: elapsed.as_secs_f64(),
                    mops: (total - last) as f64 / span.max(1e-9) / 1e6,
                    credit_limit: mean(&progress, |p| &p.credit_limit),
                    backoff_cap_us: mean(&progress, |p| &p.backoff_cap_ns).map(|ns| ns / 1000.0),
                    n_max: mean(&progress, |p| &p.n_max),
                };
                if cfg.progress {
                    let mut line = format!("[{:>5.1}s] {:>8.3} Mop/s  ({total} ops)", sample.t_s, sample.mops);
                    if let Some(c) = sample.credit_limit {
                        line += &format!("  credit limit {c:.1}");
                    }
                    if let (Some(cap), Some(n)) = (sample.backoff_cap_us, sample.n_max) {
                        line += &format!("  backoff cap {cap:.0} us, n_max {n:.1}");
                    }
                    eprintln!("{line}");
                }
                timeline.push(sample);
                last = total;
                tick += 1;
                // A worker that panicked ends the run at once.
                if elapsed >= cfg.duration
                    || finished.load(Ordering::Acquire) == cfg.threads
                    || failed.load(Ordering::Relaxed)
                    || cfg.interrupted()
                {
                    break;
                }
            }
            phase.store(STOP, Ordering::Relaxed);
            measured = t0.elapsed();
        } else {
            phase.store(STOP, Ordering::Relaxed);
        }
        // Every thread is joined; a panic becomes the run's error.
        let results: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(t, h)| {
                h.join().unwrap_or_else(|p| {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".into());
                    Err(Error::WorkerPanicked(format!("thread {t}: {what}")))
                })
            })
            .collect();
        (results, measured, timeline)
    });
    let mut out = RunReport {
        threads: cfg.threads,
        coroutines: cfg.coroutines,
        duration_s: measured.as_secs_f64(),
        ops: 0,
        verbs: VerbStats::default(),
        latency: Latency::default(),
        smart: Vec::with_capacity(cfg.threads),
        timeline,
        errors: 0,
        first_error: None,
        interrupted: cfg.interrupted(),
    };
    for r in report {
        let (verbs, hist, ops, errors, smart) = r?;
        out.verbs.merge(&verbs);
        out.latency.merge(&hist);
        out.ops += ops;
        out.errors += errors;
        out.smart.push(smart);
    }
    out.first_error = first_error.lock().expect("no poisoned lock").take();
    Ok(out)
}

/// What a thread hands back when its coroutines are done: its verbs in the
/// measured phase, latencies, operations, errors, the techniques' state.
type ThreadOut = (VerbStats, Latency, u64, u64, SmartState);

/// Opens worker thread `t`'s state on its runtime and spawns its
/// coroutines (not started until the runtime runs).
#[allow(clippy::too_many_arguments)]
fn open_thread<B: Bench>(
    rt: &mut Runtime,
    bench: &B,
    cfg: &RunConfig,
    t: usize,
    phase: &Arc<AtomicU8>,
    progress: &Arc<[CachePadded<Published>]>,
    first_error: &Arc<Mutex<Option<String>>>,
) -> (Rc<RefCell<ThreadRec>>, Option<B::Thread>) {
    let rec = Rc::new(RefCell::new(ThreadRec {
        hist: Latency::default(),
        ops: 0,
        errors: 0,
        phase_seen: WARMUP,
        at_measure: VerbStats::default(),
        at_stop: VerbStats::default(),
    }));
    let state = match rt.block_on(bench.open_thread(rt.ctx())) {
        Ok(s) => Some(s),
        Err(e) => {
            note(&rec, first_error, format!("thread {t}: opening: {e}"));
            None
        }
    };
    for c in 0..cfg.coroutines {
        let Some(state) = &state else { break };
        let w = Worker {
            ctx: rt.ctx(),
            coroutine: c,
            phase: phase.clone(),
            seen: Cell::new(WARMUP),
            seed: mix(cfg.seed, t as u64, c as u64),
            rec: rec.clone(),
            progress: progress.clone(),
            clock: rt.clock().clone(),
            idle_ns: cfg.idle.as_nanos() as u64,
        };
        let fut = bench.coroutine(w.clone(), state.clone());
        let first_error = first_error.clone();
        rt.spawn(async move {
            if let Err(e) = fut.await {
                w.rec.borrow_mut().errors += 1;
                let mut fe = first_error.lock().expect("no panics while holding it");
                fe.get_or_insert_with(|| format!("thread {} coroutine {}: {e}", w.thread(), w.coroutine));
            }
        });
    }
    (rec, state)
}

fn note(rec: &RefCell<ThreadRec>, first_error: &Mutex<Option<String>>, what: String) {
    rec.borrow_mut().errors += 1;
    first_error.lock().expect("no panics while holding it").get_or_insert(what);
}

/// After thread `t`'s coroutines finished: its counts, then the bench's
/// `finish_thread` and `close_thread`.
fn close_thread<B: Bench>(
    rt: &mut Runtime,
    bench: &B,
    t: usize,
    rec: Rc<RefCell<ThreadRec>>,
    state: Option<B::Thread>,
    first_error: &Mutex<Option<String>>,
) -> ThreadOut {
    let ctx = rt.ctx();
    {
        let mut r = rec.borrow_mut();
        if r.phase_seen != STOP {
            // Every coroutine ended before the stop (errors or a bounded
            // body): count up to now.
            let now = ctx.stats();
            if r.phase_seen == WARMUP {
                r.at_measure = now;
            }
            r.at_stop = now;
        }
    }
    if let Some(state) = state {
        if let Err(e) = rt.block_on(bench.finish_thread(&state)) {
            note(&rec, first_error, format!("thread {t}: finishing: {e}"));
        }
        bench.close_thread(state);
    }
    let mut r = rec.borrow_mut();
    let verbs = r.at_stop.since(&r.at_measure);
    (verbs, std::mem::take(&mut r.hist), r.ops, r.errors, ctx.smart_state())
}

/// The interval of the timeline's samples in a simulated run: a virtual
/// second for runs of 5 s or more, else a tenth of the measured time
/// (simulated runs are short in virtual time).
fn sample_every(duration: Duration) -> u64 {
    if duration >= Duration::from_secs(5) {
        1_000_000_000
    } else {
        (duration.as_nanos() as u64 / 10).max(1_000)
    }
}

/// [`run_bench`] on a simulated transport: every worker thread's runtime on
/// this OS thread, driven by the simulation in virtual time; the warm-up,
/// the measured time and the timeline's samples are virtual.
fn run_simulated<B: Bench>(
    transport: &dyn Transport,
    sim: &dyn Simulation,
    cfg: &RunConfig,
    bench: &B,
) -> Result<RunReport> {
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let progress: Arc<[CachePadded<Published>]> =
        (0..cfg.threads).map(|_| CachePadded::new(Published::new())).collect();
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let mut rts = Vec::with_capacity(cfg.threads);
    let mut threads = Vec::with_capacity(cfg.threads);
    for t in 0..cfg.threads {
        let rcfg = RuntimeConfig { coroutines: cfg.coroutines, ..cfg.runtime.clone() };
        let mut rt = Runtime::new(transport, t, rcfg)?;
        threads.push(open_thread(&mut rt, bench, cfg, t, &phase, &progress, &first_error));
        rts.push(rt);
    }
    // The threads opened one after the other, each at the simulation's time
    // then: they start together, at the latest (as the threaded harness's
    // threads wait for each other before they run).
    let together = rts.iter().map(|rt| rt.clock().raw()).max().unwrap_or(0);
    for rt in &rts {
        if let Clock::Virtual { time, .. } = rt.clock() {
            time.set(together);
        }
    }
    let (warmup, duration) = (cfg.warmup.as_nanos() as u64, cfg.duration.as_nanos() as u64);
    let every = sample_every(cfg.duration);
    let mut t0 = None::<u64>;
    let mut end = None::<u64>;
    let mut timeline = Vec::new();
    let mut last = 0u64;
    let mut start = None::<u64>;
    let wall = std::time::Instant::now();
    let stop = |phase: &AtomicU8, now: u64, t0: u64, end: &mut Option<u64>| {
        phase.store(STOP, Ordering::Relaxed);
        *end = Some(now.max(t0));
    };
    let mut control = |now: u64| -> u64 {
        if start.is_none() && !cfg.is_load() {
            sim.timed_run_started(now);
        }
        let s = *start.get_or_insert(now);
        if end.is_some() {
            return u64::MAX;
        }
        let Some(m) = t0 else {
            if now >= s + warmup {
                phase.store(MEASURE, Ordering::Relaxed);
                t0 = Some(now);
                return now + every.min(duration);
            }
            return s + warmup;
        };
        // A sample of the interval that ends now.
        let total: u64 = progress.iter().map(|p| p.ops.load(Ordering::Relaxed)).sum();
        let t_s = (now - m) as f64 / 1e9;
        let span = (now - m) as f64 / 1e9 - timeline.last().map_or(0.0, |x: &Sample| x.t_s);
        let sample = Sample {
            t_s,
            mops: (total - last) as f64 / span.max(1e-12) / 1e6,
            credit_limit: mean(&progress, |p| &p.credit_limit),
            backoff_cap_us: mean(&progress, |p| &p.backoff_cap_ns).map(|ns| ns / 1000.0),
            n_max: mean(&progress, |p| &p.n_max),
        };
        if cfg.progress {
            eprintln!(
                "[{:>9.6}s virtual, {:>6.1}s wall] {:>8.3} Mop/s  ({total} ops)",
                sample.t_s,
                wall.elapsed().as_secs_f64(),
                sample.mops
            );
        }
        timeline.push(sample);
        last = total;
        if now >= m + duration || cfg.interrupted() {
            stop(&phase, now, m, &mut end);
            return u64::MAX;
        }
        (now + every).min(m + duration)
    };
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.drive(&mut rts, &mut control)));
    match driven {
        Ok(r) => r?,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            return Err(Error::WorkerPanicked(format!("a simulated thread: {what}")));
        }
    }
    // Coroutines that all ended before the stop end the measured phase there.
    let now = sim.now_ns();
    let t0 = t0.unwrap_or(now);
    let end = end.unwrap_or(now);
    phase.store(STOP, Ordering::Relaxed);
    let mut out = RunReport {
        threads: cfg.threads,
        coroutines: cfg.coroutines,
        duration_s: end.saturating_sub(t0) as f64 / 1e9,
        ops: 0,
        verbs: VerbStats::default(),
        latency: Latency::default(),
        smart: Vec::with_capacity(cfg.threads),
        timeline,
        errors: 0,
        first_error: None,
        interrupted: cfg.interrupted(),
    };
    for (t, (rt, (rec, state))) in rts.iter_mut().zip(threads).enumerate() {
        let (verbs, hist, ops, errors, smart) = close_thread(rt, bench, t, rec, state, &first_error);
        out.verbs.merge(&verbs);
        out.latency.merge(&hist);
        out.ops += ops;
        out.errors += errors;
        out.smart.push(smart);
    }
    out.first_error = first_error.lock().expect("no poisoned lock").take();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use smart_core::{Ctx, EmbeddedTransport, GlobalAddr};

    use super::*;

    fn cfg(threads: usize) -> RunConfig {
        RunConfig {
            threads,
            coroutines: 2,
            // Long: the run must end because of the failure, not the clock.
            duration: Duration::from_secs(600),
            warmup: Duration::ZERO,
            runtime: RuntimeConfig::default(),
            progress: false,
            ..RunConfig::default()
        }
    }

    #[test]
    fn a_coroutine_that_panics_stops_the_run_with_an_error() {
        let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
        let r = run(&t, &cfg(2), |w| async move {
            let at = GlobalAddr::new(0, 4096);
            if w.thread() == 1 && w.coroutine() == 1 {
                w.ctx().read_u64(at).await?;
                panic!("injected fault");
            }
            while w.running() {
                let t0 = w.now();
                w.ctx().read_u64(at).await?;
                w.record(t0, 1);
            }
            Ok(())
        });
        let e = r.unwrap_err();
        assert!(matches!(e, Error::WorkerPanicked(_)) && e.to_string().contains("injected fault"), "{e}");
    }

    /// Panics while opening its per-thread state, before the start barrier.
    struct PanicsOpening;

    // The futures must be 'static, so they cannot be `async fn`s borrowing
    // `&self`.
    #[allow(clippy::manual_async_fn)]
    impl Bench for PanicsOpening {
        type Error = Error;
        type Thread = ();

        fn open_thread(&self, ctx: Ctx) -> impl Future<Output = Result<()>> + 'static {
            async move {
                assert!(ctx.thread() != 0, "thread 0 cannot open");
                Ok(())
            }
        }

        fn coroutine(&self, w: Worker, _: ()) -> impl Future<Output = Result<()>> + 'static {
            async move {
                while w.running() {
                    let t0 = w.now();
                    smart_core::runtime::yield_now().await;
                    w.record(t0, 1);
                }
                Ok(())
            }
        }
    }

    #[test]
    fn a_thread_that_panics_before_the_start_does_not_hang_the_others() {
        let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
        let e = run_bench(&t, &cfg(3), &PanicsOpening).unwrap_err();
        assert!(e.to_string().contains("thread 0 cannot open"), "{e}");
    }
}

/// An error and the phase of a benchmark it happened in (set-up, load,
/// timed run, read-back), so that a failure says where it stopped.
#[derive(Debug)]
pub struct InPhase {
    /// What the benchmark was doing, e.g. "setting up".
    pub phase: String,
    /// The error.
    pub source: Error,
}

impl InPhase {
    /// Names `phase` for errors of `r`.
    ///
    /// # Errors
    /// `r`'s, in `phase`.
    pub fn of<T>(phase: impl FnOnce() -> String, r: Result<T>) -> std::result::Result<T, InPhase> {
        r.map_err(|source| InPhase { phase: phase(), source })
    }
}

impl std::fmt::Display for InPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.phase)
    }
}

impl std::error::Error for InPhase {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The phase after a timed run, naming the run's first error if it had
/// one (which a later failure usually follows from).
pub fn after_run(what: &str, run: &RunReport) -> String {
    match &run.first_error {
        Some(e) => format!("{what} after the timed run, whose first error was \"{e}\""),
        None => format!("{what} after the timed run"),
    }
}
