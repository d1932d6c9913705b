//! Your own index on smart-core: a linear-probing hash table (`index.rs`)
//! that implements `KvIndex`, so that the YCSB harness drives it and the
//! test kit checks it, with no run loop of its own.
//!
//! ```sh
//! cargo run --release --example own_index                      # embedded (+ chaos)
//! cargo run --release --example own_index -- --blades 127.0.0.1:7000
//! ```
//!
//! Three checks, each of which fails the program:
//! 1. YCSB workload A (Zipf 0.99) with `verify`: every value read holds its
//!    own key, every key is there afterwards, and none is stored twice;
//! 2. the test kit's oracle: random operations against the index and a
//!    `BTreeMap` must agree, step by step;
//! 3. linearizability of one key written and read by every coroutine
//!    (on the chaos backend when embedded: torn, delayed, reordered verbs).

#[path = "../common/mod.rs"]
mod common;
mod index;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use index::LinearProbe;
use smart_bench::harness::RunConfig;
use smart_core::{ChaosConfig, EmbeddedTransport, KvIndex, RuntimeConfig, Transport};
use smart_testkit::{lin, oracle};

fn main() -> anyhow::Result<()> {
    let args = common::Args::parse(20_000)?;
    let transport = args.transport()?;
    let seed = std::process::id() as u64; // a fresh table name on shared blades
    let runtime = RuntimeConfig { smart: args.smart.clone(), ..RuntimeConfig::default() };
    let cfg = RunConfig {
        threads: args.threads,
        coroutines: args.coroutines,
        // Short: the table never frees a replaced block (see index.rs).
        duration: Duration::from_millis(500),
        warmup: Duration::from_millis(100),
        runtime: runtime.clone(),
        seed,
        ..RunConfig::default()
    };

    // 1. YCSB, verified.
    let y = ycsb::bench::YcsbConfig {
        table: format!("ycsb-{seed}"),
        keys: args.ops,
        workload: ycsb::Workload::parse("a").map_err(anyhow::Error::msg)?,
        chooser: ycsb::KeyChooser::zipfian(args.ops, 0.99),
        key_size: 8,
        key_format: ycsb::bench::KeyFormat::Binary,
        value_size: 8,
        verify: true,
        capacity: args.ops,
        load: ycsb::bench::LoadMode::Load,
    };
    let r = ycsb::bench::run::<LinearProbe>(&*transport, &cfg, &y).context("YCSB over the index")?;
    let run = r.run.expect("a timed run");
    println!("ycsb a: {}", run.summary_line());
    println!("ycsb a: {} violations, {} keys lost, {} stored twice", r.violations, r.lost, r.duplicates);
    if r.violations > 0 || run.first_error.is_some() {
        bail!("YCSB found violations ({:?})", run.first_error);
    }

    // 2. The oracle: 20 sequences of 120 steps over 12 keys (values of 1 to
    //    300 bytes) on a table of 64 slots, so that probes run into each other.
    for (case, steps) in oracle::random_steps(seed, 20, 120, 12).iter().enumerate() {
        let name = format!("oracle-{seed}-{case}");
        oracle::check_against_model::<LinearProbe, _, _>(&*transport, runtime.clone(), steps, |ctx| async move {
            LinearProbe::open_or_create(&ctx, &name, 32).await.expect("open").0
        })
        .map_err(|e| anyhow::anyhow!("oracle case {case}: {e}"))?;
    }
    println!("oracle: 20 sequences of 120 steps agree with a BTreeMap");

    // 3. Linearizability of one key written and read by every coroutine,
    //    under chaos when embedded.
    let chaos: Arc<dyn Transport> = if args.blades.is_empty() {
        Arc::new(EmbeddedTransport::new(1, 64 << 20)?.with_chaos(ChaosConfig::new(seed)))
    } else {
        transport.clone()
    };
    let history = lin::register_history::<LinearProbe>(&*chaos, &cfg, &format!("lin-{seed}"), 64, 100)
        .map_err(|e| anyhow::anyhow!("linearizability run: {e}"))?;
    lin::linearizable(&history, 0).map_err(|e| anyhow::anyhow!("not linearizable: {e}"))?;
    println!("linearizable: {} operations on one key", history.len());
    println!("ok");
    Ok(())
}
