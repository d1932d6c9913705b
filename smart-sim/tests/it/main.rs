//! Integration tests of the simulator through the run harness: the same
//! seed gives the same run, bit for bit; another seed another one; virtual
//! time is what the harness measures.

use std::time::Duration;

use smart_bench::harness::{run, RunConfig, RunReport};
use smart_core::smart::SmartConfig;
use smart_core::{GlobalAddr, RuntimeConfig};
use smart_sim::{SimConfig, SimTransport};

/// 32 simulated threads × 8 coroutines: random 8-byte READs and FAAs on a
/// few hot words, drawn from each coroutine's seed, all techniques on.
fn contended_run(seed: u64) -> (RunReport, smart_sim::SimCounters, u64) {
    let sim = SimTransport::new(SimConfig { threads_per_blade: 32, seed, ..SimConfig::default() }).unwrap();
    let cfg = RunConfig {
        threads: 32,
        coroutines: 8,
        warmup: Duration::from_micros(200),
        duration: Duration::from_micros(800),
        runtime: RuntimeConfig { smart: SmartConfig::parse("all").unwrap(), ..RuntimeConfig::default() },
        seed,
        ..RunConfig::default()
    };
    let base = GlobalAddr::new(0, 1 << 20);
    let r = run(&sim, &cfg, move |w| async move {
        let mut x = w.seed() | 1;
        while w.running() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = base.add(8 * (x % 64));
            let t0 = w.now();
            let mut op = w.ctx().op().await;
            if x % 3 == 0 {
                // A CAS increment: retries where others got there first.
                loop {
                    let old = w.ctx().read_u64(at).await?;
                    if w.ctx().cas(at, old, old + 1).await? == old {
                        break;
                    }
                    op.retry().await;
                }
            } else {
                w.ctx().read_u64(at).await?;
            }
            drop(op);
            w.record(t0, 1);
        }
        Ok(())
    })
    .unwrap();
    let c = sim.counters();
    let now = smart_core::Simulation::now_ns(&sim);
    (r, c, now)
}

fn fingerprint(r: &RunReport) -> String {
    // Every count, every latency bucket, every sample of the timeline, the
    // techniques' state per thread.
    format!("{:?} {:?} {:?} {:?} {:?} {}", r.ops, r.verbs, r.latency.to_histogram(), r.timeline, r.smart, r.duration_s)
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit_and_another_seed_another() {
    let (a, ca, na) = contended_run(7);
    let (b, cb, nb) = contended_run(7);
    assert!(a.ops > 10_000 && a.verbs.retries > 0, "a contended run: {}", a.summary_line());
    assert_eq!(fingerprint(&a), fingerprint(&b), "same seed: same record");
    assert_eq!((ca, na), (cb, nb), "same seed: same events, same virtual time");
    let (c, cc, _) = contended_run(8);
    assert_ne!(fingerprint(&a), fingerprint(&c), "another seed: another schedule");
    assert_ne!(ca.events, cc.events);
}

#[test]
fn the_measured_time_is_virtual_whatever_the_host_does() {
    let (r, _, now) = contended_run(3);
    assert!((r.duration_s - 0.0008).abs() < 1e-12, "{}", r.duration_s);
    assert!(now >= 1_000_000, "warm-up and measured time passed in virtual time: {now} ns");
    // Ten samples of the measured time, by the virtual clock.
    assert_eq!(r.timeline.len(), 10, "{:?}", r.timeline);
}

/// A READ spanning several cache lines can see half of a concurrent
/// WRITE (RC promises atomicity only within an aligned 8-byte word), so
/// the applications' version and CRC checks meet torn reads here as on an
/// RNIC; each 8-byte word is still whole.
#[test]
fn reads_over_several_lines_can_be_torn_but_never_within_a_word() {
    use std::cell::Cell;
    use std::rc::Rc;
    let sim = SimTransport::new(SimConfig { threads_per_blade: 16, seed: 5, ..SimConfig::default() }).unwrap();
    let cfg = RunConfig {
        threads: 16,
        coroutines: 4,
        warmup: Duration::from_micros(50),
        duration: Duration::from_micros(1500),
        seed: 5,
        ..RunConfig::default()
    };
    const WORDS: usize = 64; // 512 bytes: 8 lines
    let at = GlobalAddr::new(0, 1 << 20);
    let torn = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (t2, r2) = (torn.clone(), reads.clone());
    run(&sim, &cfg, move |w| {
        let (torn, reads) = (t2.clone(), r2.clone());
        async move {
            // Writers fill the block with one value, `thread << 32 | n`;
            // readers check that every word holds a value some writer wrote
            // whole, and count blocks of mixed values.
            let writer = w.coroutine() % 2 == 0;
            let n = Rc::new(Cell::new(0u64));
            let mut buf = vec![0u8; WORDS * 8];
            while w.running() {
                let t0 = w.now();
                if writer {
                    n.set(n.get() + 1);
                    let v = (w.thread() as u64) << 32 | n.get();
                    for c in buf.chunks_mut(8) {
                        c.copy_from_slice(&v.to_le_bytes());
                    }
                    w.ctx().write(at, &buf).await?;
                } else {
                    w.ctx().read(at, &mut buf).await?;
                    let words: Vec<u64> = buf.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
                    for &x in &words {
                        assert!(x == 0 || (x >> 32) < 16 && x as u32 > 0, "a word no writer wrote: {x:#x}");
                    }
                    if words.iter().any(|&x| x != words[0]) {
                        torn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                w.record(t0, 1);
            }
            Ok(())
        }
    })
    .unwrap();
    let (torn, reads) =
        (torn.load(std::sync::atomic::Ordering::Relaxed), reads.load(std::sync::atomic::Ordering::Relaxed));
    eprintln!("{torn} torn reads of {reads}");
    assert!(reads > 1000, "{reads} reads");
    assert!(torn > 0, "no torn read in {reads}: multi-line WRs must not be atomic");
    assert!(torn < reads / 2, "{torn} torn reads of {reads}: most see one write");
}
