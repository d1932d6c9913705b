//! The Smart techniques as the runtime applies them.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smart_bench::harness::RunConfig;
use smart_bench::micro::{self, MicroConfig};
use smart_core::backend::{BladeInfo, Endpoint, LocalMem, ThreadSpec, Transport};
use smart_core::smart::{BackoffConfig, DoorbellConfig, Search, SmartConfig, TunerConfig};
use smart_core::{Completion, EmbeddedTransport, GlobalAddr, Opcode, Runtime, RuntimeConfig, WorkRequest};

use smart_testkit::backends;

/// Wraps a transport and records the most WRs ever outstanding on a thread,
/// and the batches posted and the CQ polls that followed posts.
///
/// With `cache`, it also models an RNIC whose WQE cache holds that many WRs:
/// each completion costs 300 ns of the polling thread's time, times
/// 1 + 4 × (outstanding − cache) / cache once more WRs are outstanding than
/// the cache holds (thrashing).
#[derive(Debug)]
struct Counting {
    inner: EmbeddedTransport,
    max: Arc<AtomicUsize>,
    /// (batches posted, polls with posts before them).
    burst: Arc<(AtomicUsize, AtomicUsize)>,
    cache: Option<Arc<AtomicUsize>>,
}

impl Counting {
    fn new(cache: Option<Arc<AtomicUsize>>) -> Counting {
        Counting {
            inner: EmbeddedTransport::new(1, 8 << 20).unwrap(),
            max: Arc::default(),
            burst: Arc::default(),
            cache,
        }
    }
}

#[derive(Debug)]
struct CountingEp {
    inner: Box<dyn Endpoint>,
    max: Arc<AtomicUsize>,
    outstanding: usize,
    sizes: std::collections::HashMap<u64, usize>,
    burst: Arc<(AtomicUsize, AtomicUsize)>,
    since_poll: usize,
    cache: Option<Arc<AtomicUsize>>,
}

impl Transport for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn blades(&self) -> &[BladeInfo] {
        self.inner.blades()
    }
    fn open_thread(&self, thread: usize, spec: ThreadSpec) -> smart_core::Result<Box<dyn Endpoint>> {
        let inner = self.inner.open_thread(thread, spec)?;
        Ok(Box::new(CountingEp {
            inner,
            max: self.max.clone(),
            outstanding: 0,
            sizes: Default::default(),
            burst: self.burst.clone(),
            since_poll: 0,
            cache: self.cache.clone(),
        }))
    }
}

impl Endpoint for CountingEp {
    fn local(&self) -> &Arc<LocalMem> {
        self.inner.local()
    }
    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> smart_core::Result<()> {
        self.inner.post(qp, wr_id, wrs)?;
        self.outstanding += wrs.len();
        self.sizes.insert(wr_id, wrs.len());
        self.max.fetch_max(self.outstanding, Ordering::Relaxed);
        self.since_poll += 1;
        self.burst.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        if self.since_poll > 0 {
            self.burst.1.fetch_add(1, Ordering::Relaxed);
        }
        self.since_poll = 0;
        let before = out.len();
        let n = self.inner.poll(out);
        if let Some(cache) = &self.cache {
            let cache = cache.load(Ordering::Relaxed).max(1);
            let over = self.outstanding.saturating_sub(cache) as f64 / cache as f64;
            let cost = Duration::from_nanos((300.0 * (1.0 + 4.0 * over)) as u64 * n as u64);
            let t0 = Instant::now();
            while t0.elapsed() < cost {
                std::hint::spin_loop();
            }
        }
        for c in &out[before..] {
            self.outstanding -= self.sizes.remove(&c.wr_id).unwrap();
        }
        n
    }
    fn reset_qp(&mut self, qp: u16) -> smart_core::Result<()> {
        self.inner.reset_qp(qp)
    }

    fn revoke(&mut self, tag: u64) -> smart_core::Result<smart_core::Fencing> {
        self.inner.revoke(tag)
    }
}

/// Runs 16 coroutines × 50 batches of 2 WRs, plus one batch of 5 WRs;
/// returns the most WRs outstanding at once.
fn max_outstanding(throttle: Option<TunerConfig>) -> usize {
    outstanding_and_burst(throttle).0
}

/// As [`max_outstanding`], and the mean number of batches posted between
/// two CQ polls (over the polls that had posts before them).
fn outstanding_and_burst(throttle: Option<TunerConfig>) -> (usize, f64) {
    let t = Counting::new(None);
    let (max, burst) = (t.max.clone(), t.burst.clone());
    let cfg = RuntimeConfig {
        smart: SmartConfig { work_req_throt: throttle, ..SmartConfig::default() },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::new(&t, 0, cfg).unwrap();
    let done = Rc::new(Cell::new(0));
    for c in 0..16u64 {
        let (ctx, done) = (rt.ctx(), done.clone());
        rt.spawn(async move {
            let a = GlobalAddr::new(0, 8192 + 64 * c);
            for _ in 0..50 {
                let mut b = ctx.batch();
                b.faa(a, 1);
                b.read(a, 8);
                b.post().await.unwrap();
            }
            if c == 0 {
                // Larger than the whole limit: must go (alone), not stall.
                let mut b = ctx.batch();
                for _ in 0..5 {
                    b.faa(a, 1);
                }
                b.post().await.unwrap();
            }
            done.set(done.get() + 1);
        });
    }
    rt.run();
    assert_eq!(done.get(), 16, "a coroutine stalled");
    let (posts, rounds) = (burst.0.load(Ordering::Relaxed), burst.1.load(Ordering::Relaxed));
    (max.load(Ordering::Relaxed), posts as f64 / rounds.max(1) as f64)
}

#[test]
fn credits_bound_outstanding_wrs_and_never_stall_large_batches() {
    let fixed = TunerConfig::fixed;
    assert!(max_outstanding(None) >= 16, "without throttling every coroutine has WRs out");
    assert_eq!(max_outstanding(Some(fixed(4))), 5, "limit 4: pairs up to 4, the lone 5-WR batch");
    assert_eq!(max_outstanding(Some(fixed(6))), 6);
}

#[test]
fn credit_waiters_whose_turn_comes_post_in_the_same_round() {
    // With 8 credits and batches of 2, the waiters admitted one after
    // another (first come, first served) must all post before the CQ is
    // polled again, so their batches share a round (one `write` over TCP),
    // not one batch per round.
    let fixed = TunerConfig::fixed(8);
    let (max, burst) = outstanding_and_burst(Some(fixed));
    assert_eq!(max, 8);
    assert!(burst >= 2.5, "{burst:.2} batches per round on average");
}

#[test]
fn backoff_waits_yield_to_other_coroutines() {
    let b = backends::embedded(1);
    let long = BackoffConfig { base_ns: 20_000_000, limit_shift: 0, no_wait_level: false, ..BackoffConfig::default() };
    let cfg = RuntimeConfig {
        smart: SmartConfig { conflict_avoid: Some(long), ..SmartConfig::default() },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::new(&*b.transport, 0, cfg).unwrap();
    let order = Rc::new(std::cell::RefCell::new(Vec::new()));
    let (ctx, o) = (rt.ctx(), order.clone());
    rt.spawn(async move {
        let mut op = ctx.op().await;
        // Keep retrying until a wait of at least 1 ms was drawn (20 ms cap).
        loop {
            let t0 = Instant::now();
            op.retry().await;
            if t0.elapsed() >= Duration::from_millis(1) {
                break;
            }
        }
        o.borrow_mut().push("backoff done");
        assert!(ctx.stats().backoff_ns >= 1_000_000);
    });
    let (ctx, o) = (rt.ctx(), order.clone());
    rt.spawn(async move {
        for _ in 0..100 {
            ctx.faa(GlobalAddr::new(0, 8192), 1).await.unwrap();
        }
        o.borrow_mut().push("reads done");
    });
    rt.run();
    assert_eq!(*order.borrow(), ["reads done", "backoff done"], "the backoff blocked the thread");
}

/// 8 coroutines of one thread increment 4 counters (read, then CAS) with
/// the counter as the operation's key: with the key gate (ConflictAvoid's
/// default), siblings on one counter wait for each other, so no CAS fails;
/// with the paper's controller (no gate) they collide. Either way the
/// counters are exact. With `commit`, the CAS goes through
/// [`OpGuard::commit`](smart_core::runtime::OpGuard::commit), which passes
/// the gate on once the CAS is posted.
fn key_gated_increments(cfg: BackoffConfig, commit: bool) -> (u64, u64, u64, [u64; 4]) {
    let b = backends::embedded(1);
    let rcfg = RuntimeConfig {
        smart: SmartConfig { conflict_avoid: Some(cfg), ..SmartConfig::default() },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::new(&*b.transport, 0, rcfg).unwrap();
    let ctx = rt.ctx();
    let base = rt.block_on(async move { ctx.alloc(0, 32, 8).await.unwrap() });
    // The most coroutines ever inside an operation on counter 0 at once.
    let inside = Rc::new(Cell::new((0u32, 0u32)));
    for c in 0..8u64 {
        let (ctx, inside) = (rt.ctx(), inside.clone());
        rt.spawn(async move {
            for i in 0..200u64 {
                let k = (c + i) % 4;
                let at = base.add(8 * k);
                let mut op = ctx.op_on(k).await;
                if k == 0 {
                    let (now, most) = inside.get();
                    inside.set((now + 1, most.max(now + 1)));
                }
                let mut seen = ctx.read_u64(at).await.unwrap();
                loop {
                    let cas = ctx.cas(at, seen, seen + 1);
                    let old = if commit { op.commit(cas).await } else { cas.await }.unwrap();
                    if old == seen {
                        break;
                    }
                    seen = old;
                    op.retry().await;
                }
                if k == 0 {
                    let (now, most) = inside.get();
                    inside.set((now - 1, most));
                }
            }
        });
    }
    rt.run();
    let ctx = rt.ctx();
    let counters = rt.block_on(async move {
        let mut v = [0; 4];
        for (k, x) in v.iter_mut().enumerate() {
            *x = ctx.read_u64(base.add(8 * k as u64)).await.unwrap();
        }
        v
    });
    let stats = rt.ctx().stats();
    (stats.retries, stats.key_waits, u64::from(inside.get().1), counters)
}

#[test]
fn the_key_gate_runs_a_threads_operations_on_one_key_one_at_a_time() {
    let (retries, waits, most, counters) = key_gated_increments(BackoffConfig::default(), false);
    assert_eq!(counters, [400; 4]);
    assert_eq!(most, 1, "two coroutines inside an operation on one key");
    assert_eq!(retries, 0, "siblings on one key collided");
    assert!(waits > 0, "no operation waited at the gate");
    // The paper's controller has no gate: the same run collides, which is
    // what the gate removes (and shows this test can fail).
    let (retries, waits, most, counters) = key_gated_increments(BackoffConfig::paper(), false);
    assert_eq!(counters, [400; 4]);
    assert!(most > 1 && retries > 0, "without the gate: {most} inside at once, {retries} retries");
    assert_eq!(waits, 0);
}

/// With the CAS as the operation's commit, the next sibling on the key
/// enters as soon as the CAS is posted (so two are inside at once), yet its
/// READ goes out behind the CAS on the QP and sees its result: still no
/// CAS fails.
#[test]
fn a_committed_cas_passes_the_key_gate_on_when_posted_and_siblings_still_never_collide() {
    let (retries, waits, most, counters) = key_gated_increments(BackoffConfig::default(), true);
    assert_eq!(counters, [400; 4]);
    assert!(most > 1, "the gate was not passed on before the CAS completed");
    assert_eq!(retries, 0, "a sibling read before the CAS it waited for");
    assert!(waits > 0, "no operation waited at the gate");
}

/// A commit that fails after passing the gate on queues at the gate again,
/// behind the sibling that entered meanwhile.
#[test]
fn a_failed_commit_queues_at_the_key_gate_again() {
    let b = backends::embedded(1);
    let rcfg = RuntimeConfig {
        smart: SmartConfig { conflict_avoid: Some(BackoffConfig::default()), ..SmartConfig::default() },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::new(&*b.transport, 0, rcfg).unwrap();
    let ctx = rt.ctx();
    let at = rt.block_on(async move { ctx.alloc(0, 8, 8).await.unwrap() });
    let order = Rc::new(std::cell::RefCell::new(Vec::new()));
    let (ctx, o) = (rt.ctx(), order.clone());
    rt.spawn(async move {
        let mut op = ctx.op_on(1).await;
        o.borrow_mut().push("A in");
        // Expects a value the word does not hold: the commit fails.
        assert_eq!(op.commit(ctx.cas(at, 99, 100)).await.unwrap(), 0);
        o.borrow_mut().push("A failed");
        op.retry().await;
        o.borrow_mut().push("A back");
    });
    let (ctx, o) = (rt.ctx(), order.clone());
    rt.spawn(async move {
        let op = ctx.op_on(1).await;
        o.borrow_mut().push("B in");
        // Holds the gate until A has seen its failure, and a while longer.
        for _ in 0..10_000 {
            if o.borrow().contains(&"A failed") {
                break;
            }
            smart_core::runtime::yield_now().await;
        }
        for _ in 0..5 {
            smart_core::runtime::yield_now().await;
        }
        o.borrow_mut().push("B out");
        drop(op);
    });
    rt.run();
    assert_eq!(*order.borrow(), ["A in", "B in", "A failed", "B out", "A back"]);
}

#[test]
fn contended_cas_counter_is_exact_under_every_toggle_and_policy() {
    let toggles = [
        ("none", None),
        ("conflict-avoid", None),
        ("work-req-throt", None),
        ("all", None),
        ("none", Some("shared")),
        ("none", Some("multiplexed:2")),
        ("work-req-throt,conflict-avoid", Some("multiplexed:2")),
        ("none", Some("per-thread-db")),
        ("none", Some("shared-cq")),
        ("conflict-avoid", Some("multiplexed:2+shared-cq")),
    ];
    for b in backends::all(1) {
        for (s, policy) in toggles {
            let mut smart = SmartConfig::parse(s).unwrap();
            if let Some(p) = policy {
                let (p, cq) = p.split_once('+').map_or((p, ""), |(a, b)| (a, b));
                if p == "shared-cq" || cq == "shared-cq" {
                    smart.shared_cq = true;
                }
                if p != "shared-cq" {
                    smart.qp_policy = p.parse().unwrap();
                }
            }
            let (backoff, credits) = (smart.conflict_avoid.is_some(), smart.work_req_throt.is_some());
            let cfg = RunConfig {
                threads: 2,
                coroutines: 8,
                duration: Duration::from_millis(300),
                warmup: Duration::from_millis(50),
                runtime: RuntimeConfig { smart, ..RuntimeConfig::default() },
                progress: false,
                ..RunConfig::default()
            };
            let m = MicroConfig {
                op: Opcode::Cas,
                size: 8,
                batch: 1,
                contended: true,
                area: 4096,
                phase_ms: None,
                latency_every: 1,
                depth: None,
            };
            let r = micro::run(&*b.transport, &cfg, &m).unwrap();
            let s = format!("{s} {policy:?}");
            assert_eq!(r.run.errors, 0, "{} {s}: {:?}", b.name, r.run.first_error);
            assert!(r.increments > 0, "{} {s}: no progress", b.name);
            assert_eq!(r.counter, r.increments, "{} {s}: counter vs successful increments", b.name);
            assert_eq!(r.violations, 0);
            assert_eq!(r.run.smart.len(), 2);
            assert_eq!(r.run.smart[0].backoff_cap_ns.is_some(), backoff, "{s}");
            assert_eq!(r.run.smart[0].credit_limit.is_some(), credits, "{s}");
        }
    }
}

/// Runs `threads` threads posting FAAs under `policy` on 2 blades with
/// 2 + 2 doorbells; returns how often each doorbell rang.
fn rings(b: &smart_testkit::backends::Backend, policy: &str, threads: usize) -> Vec<u64> {
    let smart = SmartConfig {
        qp_policy: policy.parse().unwrap(),
        doorbells: DoorbellConfig { low_latency: 2, medium: 2 },
        ..SmartConfig::default()
    };
    let cfg = RunConfig {
        threads,
        coroutines: 4,
        duration: Duration::from_secs(30),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig { smart, ..RuntimeConfig::default() },
        progress: false,
        ..RunConfig::default()
    };
    let before = b.transport.doorbell_rings();
    let r = smart_bench::harness::run(&*b.transport, &cfg, |w| async move {
        for i in 0..50u64 {
            let blade = ((i + w.coroutine() as u64) % 2) as u16;
            w.ctx().faa(GlobalAddr::new(blade, 4096 + 8 * w.thread() as u64), 1).await?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    let after = b.transport.doorbell_rings();
    after.iter().enumerate().map(|(i, a)| a - before.get(i).copied().unwrap_or(0)).collect()
}

#[test]
fn doorbells_ring_where_the_plan_binds_them() {
    for mk in [backends::embedded as fn(usize) -> smart_testkit::backends::Backend, backends::tcp] {
        // 3 threads × 4 coroutines × 50 posts = 600 rings, 100 per (thread, blade).
        let b = mk(2);
        let per_thread_db = rings(&b, "per-thread-db", 3);
        assert_eq!(&per_thread_db[..3], &[200, 200, 200], "{}: one doorbell per thread", b.name);
        assert!(per_thread_db[3..].iter().all(|r| *r == 0));
        let b = mk(2);
        // per-thread-qp: QPs 0,1 (thread 0) on the low-latency doorbells 0,1;
        // QPs 2..5 round-robin on medium doorbells 2,3.
        let per_thread_qp = rings(&b, "per-thread-qp", 3);
        assert_eq!(&per_thread_qp[..4], &[100, 100, 200, 200], "{}", b.name);
        let b = mk(2);
        // shared: QP 0 (blade 0) and QP 1 (blade 1) for everyone.
        let shared = rings(&b, "shared", 3);
        assert_eq!(&shared[..2], &[300, 300], "{}", b.name);
        assert!(shared[2..].iter().all(|r| *r == 0));
    }
}

/// Runs `threads` threads × 16 coroutines with 4 credits per thread until
/// they completed 40 000 reads in all; returns each coroutine's share.
fn credit_shares(threads: usize) -> Vec<u64> {
    let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
    let fixed = TunerConfig::fixed(4);
    let cfg = RunConfig {
        threads,
        coroutines: 16,
        duration: Duration::from_secs(60),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig {
            smart: SmartConfig { work_req_throt: Some(fixed), ..SmartConfig::default() },
            ..RuntimeConfig::default()
        },
        progress: false,
        ..RunConfig::default()
    };
    let total = Arc::new(AtomicUsize::new(0));
    let shares = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = smart_bench::harness::run(&t, &cfg, |w| {
        let (total, shares) = (total.clone(), shares.clone());
        async move {
            let mut mine = 0u64;
            while total.fetch_add(1, Ordering::Relaxed) < 40_000 {
                w.ctx().read_u64(GlobalAddr::new(0, 4096)).await?;
                mine += 1;
            }
            shares.lock().unwrap().push(mine);
            Ok(())
        }
    })
    .unwrap();
    assert_eq!(r.errors, 0);
    let v = shares.lock().unwrap().clone();
    v
}

#[test]
fn credits_are_granted_first_come_first_served() {
    // Without FIFO admission, coroutines whose batches just completed took
    // the freed credits again before woken waiters ran, and a waiter could
    // starve until the tuner next raised the limit (~0.5 s stalls).
    for threads in [1, 2] {
        let shares = credit_shares(threads);
        let avg = shares.iter().sum::<u64>() / shares.len() as u64;
        let min = *shares.iter().min().unwrap();
        assert!(min * 4 >= avg, "{threads} thread(s): a coroutine got {min} of {avg} on average: {shares:?}");
    }
}

#[test]
fn a_queue_formed_while_credits_were_scarce_dissolves_once_they_are_plentiful() {
    // 5 ms at a limit of 1 WR (every coroutine queues for credits), then
    // 4096 for good. Afterwards the 32 coroutines must post together again,
    // one batch each per CQ poll, not trickle through the old queue one
    // wake at a time (a convoy that cost 0.6× on 8-byte READs).
    // The tuner picks 4096 by measured completions; a thread descheduled
    // through the 4096 epoch on a busy machine can make 1 look better, so
    // the scenario is run up to 8 times, 50 ms apart (a burst of other
    // tests' load can span several back-to-back attempts: a soak run saw 3
    // in a row fail so), until its premise (4096) holds.
    const ATTEMPTS: usize = 8;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let tc = TunerConfig {
            search: Search::Fixed(vec![1, 4096]),
            delta_ns: 5_000_000,
            stable_deltas: 100_000,
            ..TunerConfig::default()
        };
        let t = Counting::new(None);
        let burst = t.burst.clone();
        let cfg = RuntimeConfig {
            smart: SmartConfig { work_req_throt: Some(tc), ..SmartConfig::default() },
            ..RuntimeConfig::default()
        };
        let mut rt = Runtime::new(&t, 0, cfg).unwrap();
        let start = Instant::now();
        let reset = Rc::new(Cell::new(false));
        for c in 0..32u64 {
            let (ctx, burst, reset) = (rt.ctx(), burst.clone(), reset.clone());
            rt.spawn(async move {
                let a = GlobalAddr::new(0, 8192 + 64 * c);
                while start.elapsed() < Duration::from_millis(80) {
                    if start.elapsed() > Duration::from_millis(40) && !reset.replace(true) {
                        // Past both update steps: count from here on.
                        burst.0.store(0, Ordering::Relaxed);
                        burst.1.store(0, Ordering::Relaxed);
                    }
                    ctx.read_u64(a).await.unwrap();
                }
            });
        }
        rt.run();
        if rt.ctx().smart_state().credit_limit != Some(4096) && attempt + 1 < ATTEMPTS {
            continue;
        }
        assert_eq!(rt.ctx().smart_state().credit_limit, Some(4096));
        let b = burst.0.load(Ordering::Relaxed) as f64 / burst.1.load(Ordering::Relaxed).max(1) as f64;
        assert!(b > 28.0, "{b:.1} batches per CQ poll after the limit rose (32 coroutines)");
        return;
    }
}

/// Timing-sensitive (it measures throughput per Δ like the tuner does), so
/// it is not run among the parallel tests: `.ci/run` runs it alone with
/// `cargo test --release -p smart-core --test it -- --ignored --exact
/// techniques::the_tuner_follows_the_best_depth_when_the_workload_changes`.
#[test]
#[ignore = "timing-sensitive: .ci/run runs it alone (see its doc comment)"]
fn the_tuner_follows_the_best_depth_when_the_workload_changes() {
    // A busy machine can spoil one epoch's measurement, and the tuner then
    // spends a re-exploration period at a wrong limit (seen once in CI: 500
    // ms at 4096 while the cache held 8). The scenario runs up to 3 times;
    // one run that settles near each best depth passes, and a tuner that
    // does not follow fails all three.
    let mut failures = Vec::new();
    for attempt in 1..=3 {
        match tuner_scenario() {
            Ok(()) => {
                if !failures.is_empty() {
                    println!("passed on attempt {attempt} after: {failures:?}");
                }
                return;
            }
            Err(e) => {
                println!("attempt {attempt}: {e}");
                failures.push(e);
            }
        }
    }
    panic!("the tuner did not follow the workload in 3 runs: {failures:?}");
}

fn tuner_scenario() -> Result<(), &'static str> {
    // 32 coroutines keep one READ each in flight over a modelled thrashing
    // RNIC (`Counting` with a cache). For 1.5 s the modelled cache holds 64 WRs (no limit helps), then 8 for 1.5 s (a limit near 8
    // wins by ~10×), then 64 again for 3 s. The per-100 ms timeline of the
    // credit limit is printed; the tuner must settle near each best depth.
    let cache = Arc::new(AtomicUsize::new(64));
    let t = Counting::new(Some(cache.clone()));
    let cfg = RuntimeConfig {
        smart: SmartConfig { work_req_throt: Some(TunerConfig::default()), ..SmartConfig::default() },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::new(&t, 0, cfg).unwrap();
    let start = Instant::now();
    let end = Duration::from_millis(6000);
    for c in 0..32u64 {
        let ctx = rt.ctx();
        rt.spawn(async move {
            let a = GlobalAddr::new(0, 8192 + 64 * c);
            while start.elapsed() < end {
                ctx.read_u64(a).await.unwrap();
            }
        });
    }
    let timeline = Rc::new(std::cell::RefCell::new(Vec::new()));
    {
        let (ctx, timeline) = (rt.ctx(), timeline.clone());
        rt.spawn(async move {
            let mut last = 0;
            while start.elapsed() < end {
                ctx.sleep_ns(100_000_000).await;
                let ms = start.elapsed().as_millis() as u64;
                cache.store(if (1500..3000).contains(&ms) { 8 } else { 64 }, Ordering::Relaxed);
                let done = ctx.stats().reads;
                timeline.borrow_mut().push((ms, ctx.smart_state().credit_limit.unwrap(), done - last));
                last = done;
            }
        });
    }
    rt.run();
    let tl = timeline.borrow();
    for (ms, limit, reads) in tl.iter() {
        println!("{ms:>5} ms  credit limit {limit:>5}  reads {reads}");
    }
    let share = |from: u64, to: u64, ok: &dyn Fn(u32) -> bool| {
        let w: Vec<_> = tl.iter().filter(|s| s.0 >= from && s.0 < to).collect();
        w.iter().filter(|s| ok(s.1)).count() as f64 / w.len().max(1) as f64
    };
    if share(500, 1500, &|l| l >= 32) <= 0.7 {
        return Err("unthrottled while nothing thrashes");
    }
    if share(1800, 3000, &|l| l <= 12) <= 0.7 {
        return Err("near 8 while the cache holds 8");
    }
    if share(4500, 6000, &|l| l >= 32) <= 0.7 {
        return Err("back up once it holds 64 again");
    }
    Ok(())
}
