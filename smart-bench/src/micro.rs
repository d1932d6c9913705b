//! The verbs micro-benchmark (`compute-blade micro`).
//!
//! The area is found again through the blade's named root
//! `micro-area-<bytes>`, so repeated runs against one memory blade reuse it.
//! A contended run's counter is its own (taken from the root
//! `micro-counters`), so runs in several processes against one blade at the
//! same time do not disturb each other's check.
//!
//! Every coroutine posts batches of `batch` WRs of one kind, as fast as
//! completions return, to random `size`-aligned places in an area allocated
//! on each blade — or, with `contended`, all to one 8-byte word:
//!
//! * READ / WRITE: one operation per WR.
//! * FAA: adds 1; contended, the final counter must equal the number of FAAs
//!   that completed (any difference is a violation).
//! * CAS: uncontended, a CAS 0 → 0 (changes nothing); contended, a
//!   CAS-increment: read the counter, CAS old → old+1, and on failure retry
//!   with the value the CAS returned (each failure is a retry, reported to
//!   ConflictAvoid through [`OpGuard::retry`](smart_core::runtime::OpGuard::retry), which
//!   backs off when the technique is on). One operation is one successful
//!   increment; the final counter must equal their number.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use smart_core::backend::Transport;
use smart_core::runtime::{Runtime, MAX_BATCH};
use smart_core::verbs::Opcode;
use smart_core::{Error, GlobalAddr, Result};

use crate::below;
use crate::harness::{self, InPhase, RunConfig, RunReport, Tally};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroConfig {
    /// The verb.
    pub op: Opcode,
    /// Bytes per READ or WRITE (atomics are always 8).
    pub size: u32,
    /// WRs per batch.
    pub batch: usize,
    /// All coroutines target one word.
    pub contended: bool,
    /// Bytes of the area on each blade that uncontended WRs spread over.
    pub area: u64,
    /// A changing workload (the paper's table 1): every this many ms, a new
    /// number of threads is drawn (37.5% to 100% of them, as the paper's
    /// 36 to 95 of 96) and only the first that many post WRs; the others
    /// idle until the next phase. `None`: every thread always works.
    pub phase_ms: Option<u64>,
    /// Latency is sampled: one batch in this many (on average, drawn at
    /// random, so independently of how long batches take) is timed; every
    /// batch is counted. 1 times every batch. Reading the clock and filing
    /// the sample cost about a fifth of an 8-byte READ on the embedded
    /// backend; sampling keeps that probe effect off the throughput.
    pub latency_every: u32,
    /// Posts in rounds, as the Smart artifact's `test_rdma` does: each
    /// coroutine posts this many batches (each its own doorbell) and waits
    /// for all of them before the next round. `None`: each coroutine posts
    /// its next batch as soon as its last one completed.
    pub depth: Option<usize>,
}

/// Posts every batch of `round` (each its own doorbell, all rung before any
/// completion is awaited) and waits for all of them. The coroutine yields
/// after each post, as a thread that posts in a loop lets others reach a
/// shared doorbell between its posts (a simulated thread is interleaved
/// with the others at its coroutines' yields).
async fn post_round(round: &mut [smart_core::Batch<'_>]) -> Result<()> {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    let mut posts: Vec<_> = round.iter_mut().map(|b| Some(b.post())).collect();
    let mut first_error = None;
    let mut next = 0;
    std::future::poll_fn(|cx| {
        let mut pending = false;
        // The ones posted already: done yet?
        for p in posts[..next].iter_mut() {
            if let Some(post) = p {
                match Pin::new(post).poll(cx) {
                    Poll::Ready(r) => {
                        *p = None;
                        if let Err(e) = r {
                            first_error.get_or_insert(e);
                        }
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        // The next one: posted now (or refused).
        if next < posts.len() {
            if let Some(post) = &mut posts[next] {
                if let Poll::Ready(r) = Pin::new(post).poll(cx) {
                    posts[next] = None;
                    if let Err(e) = r {
                        first_error.get_or_insert(e);
                    }
                }
            }
            next += 1;
            if next < posts.len() {
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    first_error.map_or(Ok(()), Err)
}

/// Threads active in phase `phase` of a run with `threads` threads and
/// seed `seed` (see [`MicroConfig::phase_ms`]): the same for every thread.
pub fn active_threads(seed: u64, phase: u64, threads: usize) -> usize {
    let lo = (threads * 3).div_ceil(8).max(1);
    // Every phase an independent-looking draw.
    let x = smart_core::hash::mix64(seed ^ phase.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    lo + below(x, (threads - lo + 1) as u64) as usize
}

/// The report of a micro run.
#[derive(Clone, Debug)]
pub struct MicroReport {
    /// Throughput, latency, verbs.
    pub run: RunReport,
    /// Contended FAA/CAS: successful increments over the whole run
    /// (warmup included), to compare with the counter.
    pub increments: u64,
    /// Contended FAA/CAS: the counter's final value.
    pub counter: u64,
    /// Counter mismatches (must be 0).
    pub violations: u64,
}

/// The contended CAS-increment loop: read the counter, CAS old → old+1, and
/// on failure retry with the value the CAS returned, backing off through
/// ConflictAvoid when it is on.
async fn cas_increments(w: &harness::Worker, counter: GlobalAddr, mut done: Tally<'_>) -> Result<()> {
    let ctx = w.ctx();
    let mut expected = ctx.read_u64(counter).await?;
    while w.running() {
        w.idle().await;
        let t0 = w.now();
        let mut op = ctx.op().await;
        loop {
            let old = ctx.cas(counter, expected, expected + 1).await?;
            if old == expected {
                expected += 1;
                break;
            }
            // Retry with the value the CAS saw, after backing off when
            // conflict avoidance is on.
            expected = old;
            op.retry().await;
        }
        drop(op);
        done.n += 1;
        w.record(t0, 1);
    }
    Ok(())
}

/// Counters that contended runs on one blade take in turn.
const COUNTERS: u64 = 1023;

/// A counter for this run alone, zeroed: runs against one blade at the same
/// time (several processes) each take their own (the next of [`COUNTERS`],
/// claimed by FAA), so none zeroes another's or counts its increments.
async fn own_counter(ctx: smart_core::Ctx) -> Result<GlobalAddr> {
    let name = "micro-counters";
    let area = match ctx.root(0, name).await? {
        Some(a) => a,
        None => {
            let fresh = ctx.alloc(0, 64 * (COUNTERS + 1), 4096).await?;
            ctx.set_root(0, name, fresh).await?
        }
    };
    let n = ctx.faa(area, 1).await?;
    let counter = area.add(64 * (1 + n % COUNTERS));
    ctx.write(counter, &0u64.to_le_bytes()).await?;
    Ok(counter)
}

/// A configuration that cannot run.
fn unusable(source: Error) -> InPhase {
    InPhase { phase: "checking the configuration".into(), source }
}

/// Runs the micro-benchmark.
///
/// # Errors
/// Bad parameters, allocation or connection failures, in the phase they
/// happened in.
pub fn run(transport: &dyn Transport, cfg: &RunConfig, m: &MicroConfig) -> Result<MicroReport, InPhase> {
    let size = if m.op.is_atomic() { 8 } else { m.size };
    if size == 0 {
        return Err(unusable(Error::Unsupported("a READ or WRITE must move at least 1 byte".into())));
    }
    if m.batch == 0 || m.batch > MAX_BATCH {
        return Err(unusable(Error::Unsupported(format!("a batch holds 1 to {MAX_BATCH} WRs, not {}", m.batch))));
    }
    if m.contended && m.op == Opcode::Cas && m.batch != 1 {
        return Err(unusable(Error::Unsupported(
            "a contended CAS-increment is one CAS at a time: a batch of 1".into(),
        )));
    }
    if u64::from(size) * m.batch as u64 > cfg.runtime.slot_bytes as u64 {
        return Err(unusable(Error::Unsupported(format!(
            "{} WRs of {size} bytes exceed the {} local bytes of a slot",
            m.batch, cfg.runtime.slot_bytes
        ))));
    }
    let stride = u64::from(size).next_multiple_of(8);
    if m.area < stride {
        return Err(unusable(Error::Unsupported("the area must hold at least one WR".into())));
    }
    // Set up on the driving thread: an area per blade, and a counter of
    // this run's own, zeroed.
    let nblades = transport.blades().len();
    let setting_up = || "setting up".to_string();
    let mut setup = InPhase::of(setting_up, Runtime::new(transport, 0, cfg.runtime.clone()))?;
    let ctx = setup.ctx();
    let counter = InPhase::of(setting_up, setup.block_on(own_counter(ctx.clone())))?;
    let area = m.area;
    let areas = setup.block_on(async move {
        let mut v = Vec::with_capacity(nblades);
        for b in 0..nblades as u16 {
            ctx.check_blade(b).await?;
            // Reuse the area of an earlier run on this blade (blade memory is
            // never freed, so a long-lived blade would fill up otherwise).
            let name = format!("micro-area-{area}");
            let a = match ctx.root(b, &name).await? {
                Some(a) => a,
                None => {
                    let fresh = smart_core::reclaim::alloc_anywhere(&ctx, b, area, 4096).await?;
                    ctx.set_root(b, &name, fresh).await?
                }
            };
            v.push(a);
        }
        Ok::<_, Error>(v)
    });
    let areas: Vec<GlobalAddr> = InPhase::of(setting_up, areas)?;
    let slots = m.area / stride;
    let increments = Arc::new(AtomicU64::new(0));
    let m = *m;
    let areas: Arc<[GlobalAddr]> = areas.into();
    // The phases' common start: the host's clock, or the simulation's
    // virtual time (a simulated thread's raw clock is absolute virtual ns).
    let virtual_start = transport.simulation().map(|s| s.now_ns());
    let (start, threads, seed) = (std::time::Instant::now(), cfg.threads, cfg.seed);
    let run = harness::run(transport, cfg, |w| {
        let areas = areas.clone();
        let increments = increments.clone();
        async move {
            let ctx = w.ctx().clone();
            let mut rng = SmallRng::seed_from_u64(w.seed());
            let payload = vec![0xa5u8; size as usize];
            // Adds the increments to the shared total when the coroutine
            // ends, by the stop or by an error (no nested future per op).
            let done = Tally::new(&increments);
            if m.contended && m.op == Opcode::Cas {
                return cas_increments(&w, counter, done).await;
            }
            let mut done = done;
            // A timed batch starts where the last one was recorded (one
            // clock read serves both) or, after untimed ones or a wait, at a
            // fresh clock read; `untimed` batches go before the next timed
            // one (see `MicroConfig::latency_every`).
            let mut t0 = w.now();
            let mut untimed = 0u32;
            while w.running() {
                if let Some(ms) = m.phase_ms {
                    let now = match virtual_start {
                        Some(v) => ctx.clock().raw().saturating_sub(v),
                        None => start.elapsed().as_nanos() as u64,
                    };
                    let phase_ns = ms * 1_000_000;
                    if w.thread() >= active_threads(seed, now / phase_ns, threads) {
                        // Idle to the next phase (in steps, to notice the stop).
                        ctx.sleep_ns((phase_ns - now % phase_ns).min(5_000_000)).await;
                        t0 = w.now();
                        continue;
                    }
                }
                if w.idles() {
                    w.idle().await;
                    t0 = w.now();
                }
                if let Some(depth) = m.depth {
                    // A round of `depth` doorbells, then a wait for all.
                    let mut round: Vec<smart_core::Batch<'_>> = (0..depth).map(|_| ctx.batch()).collect();
                    for b in &mut round {
                        let r = rng.next_u64();
                        let area = areas[below(r, areas.len() as u64) as usize];
                        for _ in 0..m.batch {
                            let at =
                                if m.contended { counter } else { area.add(below(rng.next_u64(), slots) * stride) };
                            match m.op {
                                Opcode::Read => {
                                    b.read(at, size as usize);
                                }
                                Opcode::Write => b.write(at, &payload),
                                Opcode::Cas => {
                                    b.cas(at, 0, 0);
                                }
                                Opcode::Faa => {
                                    b.faa(at, 1);
                                }
                            }
                        }
                    }
                    post_round(&mut round).await?;
                    if m.contended && m.op == Opcode::Faa {
                        done.n += (depth * m.batch) as u64;
                    }
                    t0 = w.lap(t0, (depth * m.batch) as u64);
                    continue;
                }
                let mut b = ctx.batch();
                // A batch is one doorbell to one QP, so all its WRs go to one
                // blade; the blade is drawn per batch.
                let mut r = rng.next_u64();
                let area = areas[below(r, areas.len() as u64) as usize];
                for i in 0..m.batch {
                    // The blade is drawn from the high half of the first
                    // draw, the first place from its low half (rotated up).
                    if i > 0 {
                        r = rng.next_u64();
                    }
                    let at = if m.contended { counter } else { area.add(below(r.rotate_left(32), slots) * stride) };
                    match m.op {
                        Opcode::Read => {
                            b.read(at, size as usize);
                        }
                        Opcode::Write => b.write(at, &payload),
                        Opcode::Cas => {
                            b.cas(at, 0, 0);
                        }
                        Opcode::Faa => {
                            b.faa(at, 1);
                        }
                    }
                }
                b.post().await?;
                if m.contended && m.op == Opcode::Faa {
                    done.n += m.batch as u64;
                }
                if untimed == 0 {
                    t0 = w.lap(t0, m.batch as u64);
                    if m.latency_every > 1 {
                        untimed = below(rng.next_u64(), u64::from(2 * m.latency_every - 1)) as u32;
                    }
                } else {
                    w.count(m.batch as u64);
                    untimed -= 1;
                    if untimed == 0 {
                        t0 = w.now();
                    }
                }
            }
            Ok(())
        }
    });
    let run = InPhase::of(|| "during the timed run".into(), run)?;
    let checked = m.contended && m.op.is_atomic();
    // Read back only when it is checked (a blade that stopped answering
    // then adds no wait to the run's error).
    let ctx = setup.ctx();
    let final_counter = if checked {
        let read = setup.block_on(async move { ctx.read_u64(counter).await });
        InPhase::of(|| harness::after_run("reading the shared counter", &run), read)?
    } else {
        0
    };
    let increments = increments.load(Ordering::Relaxed);
    let violations = u64::from(checked && final_counter != increments);
    Ok(MicroReport { run, increments, counter: if checked { final_counter } else { 0 }, violations })
}

#[cfg(test)]
mod phase_tests {
    use super::active_threads;

    #[test]
    fn active_threads_span_three_eighths_to_all_and_change_by_phase() {
        let got: Vec<usize> = (0..400).map(|p| active_threads(7, p, 96)).collect();
        assert!(got.iter().all(|&n| (36..=96).contains(&n)), "{got:?}");
        assert!(got.iter().any(|&n| n < 50) && got.iter().any(|&n| n > 85), "{got:?}");
        assert!((0..100).all(|p| (1..=2).contains(&active_threads(3, p, 2))));
        assert_eq!(active_threads(1, 0, 1), 1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use smart_core::{EmbeddedTransport, RuntimeConfig};

    use super::*;

    #[test]
    fn batches_over_several_blades_never_span_two() {
        // Uncontended WRs spread over every blade, but a batch is one
        // doorbell to one QP: each batch must stay on one blade.
        let t = EmbeddedTransport::new(3, 32 << 20).unwrap();
        for op in [Opcode::Read, Opcode::Write, Opcode::Cas, Opcode::Faa] {
            let cfg = RunConfig {
                threads: 1,
                coroutines: 4,
                duration: Duration::from_millis(150),
                warmup: Duration::ZERO,
                runtime: RuntimeConfig::default(),
                progress: false,
                ..RunConfig::default()
            };
            let m = MicroConfig {
                op,
                size: 64,
                batch: 8,
                contended: false,
                area: 1 << 20,
                phase_ms: None,
                latency_every: 1,
                depth: None,
            };
            let r = run(&t, &cfg, &m).unwrap();
            assert_eq!(r.run.errors, 0, "{op:?}: {:?}", r.run.first_error);
            assert!(r.run.ops > 0, "{op:?}");
            assert_eq!(r.run.verbs.wrs, 8 * r.run.verbs.doorbells, "{op:?}: 8 WRs per doorbell");
        }
    }

    #[test]
    fn sampled_latency_times_about_one_batch_in_n_and_counts_every_one() {
        let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
        for every in [1u32, 8] {
            let cfg = RunConfig {
                threads: 1,
                coroutines: 4,
                duration: Duration::from_millis(200),
                warmup: Duration::from_millis(20),
                progress: false,
                ..RunConfig::default()
            };
            let m = MicroConfig {
                op: Opcode::Read,
                size: 8,
                batch: 2,
                contended: false,
                area: 1 << 20,
                phase_ms: None,
                latency_every: every,
                depth: None,
            };
            let r = run(&t, &cfg, &m).unwrap().run;
            assert_eq!(r.errors, 0);
            // Every batch counted: at most the batches in flight at the
            // phase changes fall on the other side of the verb counters.
            assert!(r.ops.abs_diff(2 * r.verbs.doorbells) <= 2 * 2 * 4, "{} ops, {} batches", r.ops, r.verbs.doorbells);
            let (timed, batches) = (r.latency.len(), r.ops / 2);
            if every == 1 {
                assert_eq!(timed, batches);
            } else {
                assert!(batches > 1000, "{batches}");
                // Gaps drawn uniformly from 0..15 untimed batches: 1 in 8.
                let share = timed as f64 / batches as f64;
                assert!((0.1..0.15).contains(&share), "{timed} of {batches} timed");
            }
        }
    }
}
