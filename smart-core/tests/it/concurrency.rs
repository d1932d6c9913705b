//! Many threads × coroutines at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smart_bench::harness::{self as driver, RunConfig};
use smart_core::{GlobalAddr, Runtime, RuntimeConfig};

use smart_testkit::backends;

fn cfg(threads: usize, coroutines: usize, slots: usize) -> RunConfig {
    RunConfig {
        threads,
        coroutines,
        duration: Duration::from_secs(30),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig { slots, slot_bytes: 4096, chunk_bytes: 64 << 10, ..RuntimeConfig::default() },
        progress: false,
        ..RunConfig::default()
    }
}

#[test]
fn every_thread_and_coroutine_faa_one_counter_exactly() {
    const PER: u64 = 300;
    for b in backends::all(1) {
        let t = &*b.transport;
        let mut setup = Runtime::new(t, 99, RuntimeConfig::default()).unwrap();
        let ctx = setup.ctx();
        let counter = setup.block_on(async move { ctx.alloc(0, 8, 8).await.unwrap() });
        // Few slots, so coroutines also wait for slots; bounded bodies end the run.
        let report = driver::run(t, &cfg(3, 16, 8), |w| async move {
            for _ in 0..PER {
                let t0 = w.now();
                w.ctx().faa(counter, 1).await?;
                w.record(t0, 1);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(report.errors, 0, "{}: {:?}", b.name, report.first_error);
        let ctx = setup.ctx();
        let v = setup.block_on(async move { ctx.read_u64(counter).await.unwrap() });
        assert_eq!(v, 3 * 16 * PER, "{}", b.name);
    }
}

#[test]
fn concurrent_chunk_allocation_never_overlaps() {
    for b in backends::all(2) {
        let t = &*b.transport;
        let got: Arc<Mutex<Vec<(GlobalAddr, u64)>>> = Arc::default();
        let report = driver::run(t, &cfg(3, 8, 64), |w| {
            let got = got.clone();
            async move {
                let mut mine = Vec::new();
                for i in 0..90u64 {
                    // Mixed sizes, including "large" ones that take their own FAA.
                    let size = [8, 24, 64, 200, 3000, 20_000][(i as usize + w.coroutine()) % 6];
                    let blade = (i % 2) as u16;
                    let a = w.ctx().alloc(blade, size, 8).await?;
                    assert_eq!(a.offset() % 8, 0);
                    // Stamp the whole range with our identity; overlap would show.
                    let stamp = vec![(w.thread() * 16 + w.coroutine()) as u8; size as usize];
                    w.ctx().write(a, &stamp[..size.min(4096) as usize]).await?;
                    mine.push((a, size));
                }
                got.lock().unwrap().extend(mine);
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(report.errors, 0, "{}: {:?}", b.name, report.first_error);
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 3 * 8 * 90);
        let mut by_blade: BTreeMap<u16, Vec<(u64, u64)>> = BTreeMap::new();
        for (a, s) in got.iter() {
            by_blade.entry(a.blade()).or_default().push((a.offset(), *s));
        }
        for (blade, mut v) in by_blade {
            v.sort_unstable();
            assert!(v[0].0 >= smart_core::layout::HEAP_START, "{}: allocation inside the superblock", b.name);
            for w in v.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "{}: blade {blade}: {:?} overlaps {:?}", b.name, w[0], w[1]);
            }
        }
    }
}

#[test]
fn coroutines_that_refill_at_once_leave_no_chunk_unused() {
    // 8 coroutines of one thread allocate 1 KiB blocks and write each, 4 MiB
    // in all, from 1 MiB chunks (a 64 MiB blade): all of a round's
    // coroutines find the chunk used up at once and each fetches one. Those fetched beyond the
    // first serve later refills instead of being left unused, so the heap
    // grows by the 4 chunks needed plus at most one per coroutine.
    for b in backends::all_sized(1, 64 << 20) {
        let t = &*b.transport;
        let heap = GlobalAddr::new(0, smart_core::layout::OFF_HEAP);
        let mut setup = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
        let ctx = setup.ctx();
        let before = setup.block_on(async move { ctx.read_u64(heap).await.unwrap() });
        let mut run = cfg(1, 8, 64);
        run.runtime.chunk_bytes = 1 << 20;
        let report = driver::run(t, &run, |w| async move {
            for _ in 0..512 {
                // A verb per block, as an application writes what it
                // allocated: the coroutines go round by round.
                let a = w.ctx().alloc(0, 1024, 8).await?;
                w.ctx().write(a, &[1u8; 8]).await?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(report.errors, 0, "{}: {:?}", b.name, report.first_error);
        let ctx = setup.ctx();
        let after = setup.block_on(async move { ctx.read_u64(heap).await.unwrap() });
        let chunks = (after - before).div_ceil(1 << 20);
        assert!(chunks <= 4 + 8, "{}: the heap grew by {chunks} chunks for 4 chunks of blocks", b.name);
    }
}

#[test]
fn allocation_reports_out_of_memory() {
    let b = backends::embedded(1);
    let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let e = ctx.alloc(0, 64 << 20, 8).await.unwrap_err();
        // A request larger than the blade itself: the message says so in
        // numbers, not that a heap ran out.
        let m = e.to_string();
        assert!(m.contains("out of memory") && m.contains("asked 67108864 bytes"), "{m}");
        assert!(m.contains(&format!("of a {}-byte blade", backends::DEFAULT_BLADE_BYTES)), "{m}");
        // Sizes whose page-rounded length overflows 64 bits are refused
        // too (rounded, they wrapped to 0 and were granted).
        for size in [u64::MAX, u64::MAX - 4095, (u64::MAX - 4095) + 1] {
            let e = ctx.alloc(0, size, 8).await.unwrap_err();
            assert!(e.to_string().contains(&format!("asked {size} bytes")), "{size}: {e}");
        }
        let mut n = 0u64;
        while ctx.alloc(0, 4096, 8).await.is_ok() {
            n += 1;
        }
        assert!(n > 1000, "the 8 MiB blade held only {n} pages before running out");
    });
}
