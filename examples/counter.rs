//! A remote counter: threads × coroutines increment one 8-byte word on a
//! memory blade with FAA, and the total is checked.
//!
//! ```sh
//! cargo run --release --example counter                        # embedded
//! cargo run --release --example counter -- --blades 127.0.0.1:7000
//! ```
//!
//! FAA is atomic on the blade (with respect to other atomics), so no
//! increment is lost however many threads race on the word: the counter ends
//! at exactly threads × coroutines × ops. The tutorial's first chapter walks
//! through this file.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use smart_bench::harness::{self, RunConfig};
use smart_core::{Runtime, RuntimeConfig};

fn main() -> anyhow::Result<()> {
    let args = common::Args::parse(20_000)?;
    let transport = args.transport()?;
    let runtime = RuntimeConfig { smart: args.smart.clone(), ..RuntimeConfig::default() };

    // Set-up on a runtime of its own: one word, allocated on blade 0, zeroed.
    let mut setup = Runtime::new(&*transport, 0, runtime.clone())?;
    let ctx = setup.ctx();
    let counter = setup.block_on(async move {
        let at = ctx.alloc(0, 8, 8).await?;
        ctx.write(at, &0u64.to_le_bytes()).await?;
        Ok::<_, smart_core::Error>(at)
    })?;
    drop(setup);

    // The run: every coroutine of every thread adds 1, `ops` times.
    let cfg = RunConfig {
        threads: args.threads,
        coroutines: args.coroutines,
        duration: Duration::from_secs(3600), // ends when every coroutine has finished
        warmup: Duration::ZERO,
        runtime,
        ..RunConfig::default()
    };
    let done = Arc::new(AtomicU64::new(0));
    let ops = args.ops;
    let counted = done.clone();
    let report = harness::run(&*transport, &cfg, move |w| {
        let counted = counted.clone();
        async move {
            for _ in 0..ops {
                let t0 = w.now();
                w.ctx().faa(counter, 1).await?;
                w.record(t0, 1);
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })?;
    if let Some(e) = report.first_error {
        bail!("a coroutine failed: {e}");
    }

    // The check: one READ of the word.
    let mut check = Runtime::new(&*transport, 0, RuntimeConfig::default())?;
    let ctx = check.ctx();
    let total = check.block_on(async move { ctx.read_u64(counter).await })?;
    let want = (args.threads * args.coroutines) as u64 * ops;
    println!("{}", report.summary_line());
    println!("counter = {total}, increments that completed = {}, expected {want}", done.load(Ordering::Relaxed));
    if total != want || done.load(Ordering::Relaxed) != want {
        bail!("the counter lost increments");
    }
    println!("ok: no increment lost");
    Ok(())
}
