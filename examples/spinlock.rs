//! A remote spinlock: a lock word on a memory blade, taken by CAS, guards a
//! record of two counters that must stay equal. Coroutines that lose the
//! CAS retry through ConflictAvoid (`ctx.op()` / `op.retry()`), which backs
//! off and throttles them when retries pile up.
//!
//! ```sh
//! cargo run --release --example spinlock                       # embedded
//! cargo run --release --example spinlock -- --smart none       # retry at once
//! cargo run --release --example spinlock -- --blades 127.0.0.1:7000
//! ```
//!
//! Mutual exclusion is checked, not assumed: inside the critical section
//! each holder adds 1 to an occupancy word with FAA and must find it 0. At
//! the end both counters must equal the number of critical sections.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use smart_bench::harness::{self, RunConfig};
use smart_core::{GlobalAddr, Runtime, RuntimeConfig};

/// The record: [lock, occupancy, a, b], one 64-byte line.
const LOCK: u64 = 0;
const OCCUPANCY: u64 = 8;
const A: u64 = 16;

fn at(base: GlobalAddr, off: u64) -> GlobalAddr {
    GlobalAddr::new(base.blade(), base.offset() + off)
}

fn main() -> anyhow::Result<()> {
    let args = common::Args::parse(2_000)?;
    let transport = args.transport()?;
    let runtime = RuntimeConfig { smart: args.smart.clone(), ..RuntimeConfig::default() };

    let mut setup = Runtime::new(&*transport, 0, runtime.clone())?;
    let ctx = setup.ctx();
    let rec = setup.block_on(async move {
        let rec = ctx.alloc(0, 64, 64).await?;
        ctx.write(rec, &[0u8; 32]).await?;
        Ok::<_, smart_core::Error>(rec)
    })?;
    drop(setup);

    let cfg = RunConfig {
        threads: args.threads,
        coroutines: args.coroutines,
        duration: Duration::from_secs(3600),
        warmup: Duration::ZERO,
        runtime,
        ..RunConfig::default()
    };
    let overlaps = Arc::new(AtomicU64::new(0));
    let (ops, seen) = (args.ops, overlaps.clone());
    let report = harness::run(&*transport, &cfg, move |w| {
        let seen = seen.clone();
        async move {
            let ctx = w.ctx().clone();
            // Each holder's own tag: a lock word names who holds it.
            let tag = ((w.thread() as u64) << 32 | w.coroutine() as u64) + 1;
            for _ in 0..ops {
                let t0 = w.now();
                // Acquire: CAS 0 → tag; a lost CAS is a retry, which
                // ConflictAvoid may delay (and it may hold this coroutine at
                // `op()` while too many of the thread's coroutines retry).
                let mut op = ctx.op().await;
                while ctx.cas(at(rec, LOCK), 0, tag).await? != 0 {
                    op.retry().await;
                }
                // The critical section. Its verbs go to the same QP as the
                // CAS that took the lock and the CAS that frees it, so they
                // execute after the one and before the other.
                if ctx.faa(at(rec, OCCUPANCY), 1).await? != 0 {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
                let mut ab = [0u8; 16];
                ctx.read(at(rec, A), &mut ab).await?;
                let a = u64::from_le_bytes(ab[..8].try_into().unwrap()) + 1;
                let b = u64::from_le_bytes(ab[8..].try_into().unwrap()) + 1;
                ab[..8].copy_from_slice(&a.to_le_bytes());
                ab[8..].copy_from_slice(&b.to_le_bytes());
                ctx.write(at(rec, A), &ab).await?;
                ctx.faa(at(rec, OCCUPANCY), u64::MAX).await?; // − 1
                                                              // Release by CAS, not by a WRITE of 0: on an RNIC a WRITE is
                                                              // not atomic with respect to other clients' CASes on the word.
                let held = ctx.cas(at(rec, LOCK), tag, 0).await?;
                assert_eq!(held, tag, "the lock was ours");
                drop(op);
                w.record(t0, 1);
            }
            Ok(())
        }
    })?;
    if let Some(e) = report.first_error {
        bail!("a coroutine failed: {e}");
    }

    let mut check = Runtime::new(&*transport, 0, RuntimeConfig::default())?;
    let ctx = check.ctx();
    let (a, b) = check.block_on(async move {
        Ok::<_, smart_core::Error>((ctx.read_u64(at(rec, A)).await?, ctx.read_u64(at(rec, A + 8)).await?))
    })?;
    let want = (args.threads * args.coroutines) as u64 * ops;
    println!("{}", report.summary_line());
    println!(
        "a = {a}, b = {b}, expected {want}; holders that met another inside: {}",
        overlaps.load(Ordering::Relaxed)
    );
    if a != want || b != want || overlaps.load(Ordering::Relaxed) != 0 {
        bail!("mutual exclusion failed");
    }
    println!("ok: one holder at a time, no update lost");
    Ok(())
}
