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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use index::LinearProbe;
use rand::{Rng, SeedableRng};
use smart_bench::harness::{self, RunConfig};
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
        value_size: 8,
        verify: true,
        capacity: args.ops,
        load: ycsb::bench::LoadMode::Load,
    };
    let r = ycsb::bench::run::<LinearProbe>(&*transport, &cfg, &y).context("YCSB over the index")?;
    let run = r.run.expect("a timed run");
    println!("ycsb a: {}", run.summary_line());
    println!(
        "ycsb a: {} violations, {} keys lost, {} stored twice; {} lost CASes",
        r.violations, r.lost, r.duplicates, r.stats.cas_lost
    );
    if r.violations > 0 || run.first_error.is_some() {
        bail!("YCSB found violations ({:?})", run.first_error);
    }

    // 2. The oracle: 20 sequences of 120 steps over 12 keys (values of 1 to
    //    300 bytes) on a table of 64 slots, so that probes run into each other.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    for case in 0..20 {
        let steps: Vec<oracle::Step> = (0..120)
            .map(|_| {
                let (k, len) = (rng.random_range(0..12u8), [1, 8, 40, 100, 300][rng.random_range(0..5)]);
                match rng.random_range(0..5) {
                    0 => oracle::Step::Insert(k, len),
                    1 => oracle::Step::Update(k, len),
                    2 => oracle::Step::Upsert(k, len),
                    3 => oracle::Step::Delete(k),
                    _ => oracle::Step::Get(k),
                }
            })
            .collect();
        let name = format!("oracle-{seed}-{case}");
        oracle::check_against_model::<LinearProbe, _, _>(&*transport, runtime.clone(), &steps, |ctx| async move {
            LinearProbe::open_or_create(&ctx, &name, 32).await.expect("open").0
        })
        .map_err(|e| anyhow::anyhow!("oracle case {case}: {e}"))?;
    }
    println!("oracle: 20 sequences of 120 steps agree with a BTreeMap");

    // 3. Linearizability of one register, under chaos when embedded.
    let chaos: Arc<dyn Transport> = if args.blades.is_empty() {
        Arc::new(EmbeddedTransport::new(1, 64 << 20)?.with_chaos(ChaosConfig::new(seed)))
    } else {
        transport.clone()
    };
    let name = format!("lin-{seed}");
    let history = Arc::new(Mutex::new(Vec::new()));
    let (h, t0) = (history.clone(), Instant::now());
    let lin_cfg = RunConfig { duration: Duration::from_secs(3600), warmup: Duration::ZERO, ..cfg.clone() };
    let report = harness::run(&*chaos, &lin_cfg, move |w| {
        let (h, name) = (h.clone(), name.clone());
        async move {
            let (mut ix, _) = LinearProbe::open_or_create(w.ctx(), &name, 64).await?;
            let mut out = Vec::new();
            for i in 0..100u64 {
                // Unique values: thread, coroutine and step in one word.
                let value = (w.thread() as u64) << 40 | (w.coroutine() as u64) << 20 | (i + 1);
                let start = t0.elapsed().as_nanos();
                let (write, v) = if i % 3 == 0 {
                    ix.upsert(b"the-key", &value.to_le_bytes()).await?;
                    (true, value)
                } else {
                    let found = ix.get(b"the-key", &mut out).await?;
                    (false, if found { u64::from_le_bytes(out[..8].try_into().unwrap()) } else { 0 })
                };
                let end = t0.elapsed().as_nanos();
                h.lock().unwrap().push(lin::Event { start, end, write, value: v });
            }
            Ok(())
        }
    })?;
    if let Some(e) = report.first_error {
        bail!("linearizability run: {e}");
    }
    let history = history.lock().unwrap();
    lin::linearizable(&history, 0).map_err(|e| anyhow::anyhow!("not linearizable: {e}"))?;
    println!("linearizable: {} operations on one key", history.len());
    println!("ok");
    Ok(())
}
