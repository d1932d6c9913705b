//! Online resizing under load and through stale caches.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use race_ht::RaceHt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_bench::harness::{self as driver, RunConfig};
use smart_core::smart::SmartConfig;
use smart_core::{Runtime, RuntimeConfig, Transport};
use smart_testkit::backends;

use crate::{race_ht_scan, tiny, value, wrap};

#[test]
fn a_one_group_table_grows_under_chaos_while_operations_continue() {
    // 3 threads × 6 coroutines on two blades, from a 21-slot table: each
    // coroutine inserts its own 150 fresh keys (so the table splits all
    // through the run), updates and reads back its earlier keys, deletes
    // every fifth one, and meanwhile updates and reads 32 shared keys.
    // Every read must find its key (unless deleted) with its latest value;
    // at the end every surviving key is present once, in the right subtable.
    let chaos = backends::chaos_sized(2, 64 << 20, 23);
    let t = &*chaos.transport;
    let mut setup = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = setup.ctx();
    let before = setup.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
        for k in 0..32u64 {
            assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
        }
        ht.current_shape().await.unwrap().splits
    });
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let cfg = RunConfig {
        threads: 3,
        coroutines: 6,
        duration: Duration::from_secs(120),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig { smart: SmartConfig::parse("all").unwrap(), ..RuntimeConfig::default() },
        progress: false,
        ..RunConfig::default()
    };
    let r = driver::run(t, &cfg, |w| {
        let bad = bad.clone();
        async move {
            let mut ht = RaceHt::open(w.ctx(), "stress").await.map_err(wrap)?;
            let me = (w.thread() * 6 + w.coroutine()) as u64;
            let mut rng = SmallRng::seed_from_u64(me);
            let mut out = Vec::new();
            let mut mine: Vec<(u64, u64)> = Vec::new(); // (key, version); version u64::MAX = deleted
            let report = |m: String| bad.lock().unwrap().push(m);
            for i in 0..150u64 {
                let k = 1000 + me * 1000 + i;
                if !ht.insert(&k.to_le_bytes(), &value(k, 0)).await.map_err(wrap)? {
                    report(format!("fresh key {k} reported present"));
                }
                mine.push((k, 0));
                // One of this coroutine's keys: update, read back, or delete.
                let j = rng.random_range(0..mine.len());
                let (old, v) = mine[j];
                match rng.random_range(0..5) {
                    0 if v != u64::MAX => {
                        assert!(ht.delete(&old.to_le_bytes()).await.map_err(wrap)?, "key {old} deleted once");
                        mine[j].1 = u64::MAX;
                    }
                    1 | 2 if v != u64::MAX => {
                        if !ht.update(&old.to_le_bytes(), &value(old, i + 1)).await.map_err(wrap)? {
                            report(format!("update of present key {old} found nothing"));
                        }
                        mine[j].1 = i + 1;
                    }
                    _ => {
                        let found = ht.get(&old.to_le_bytes(), &mut out).await.map_err(wrap)?;
                        match (found, v) {
                            (false, u64::MAX) => {}
                            (true, u64::MAX) => report(format!("deleted key {old} found")),
                            (false, _) => report(format!("key {old} lost")),
                            (true, v) if out[..] != value(old, v)[..] => {
                                report(format!("key {old} read {:?}, expected version {v}", &out[..16]))
                            }
                            _ => {}
                        }
                    }
                }
                // A shared key, racing with the other coroutines.
                let s = rng.random_range(0..32u64);
                if rng.random_bool(0.5) {
                    if !ht.update(&s.to_le_bytes(), &value(s, me << 32 | i)).await.map_err(wrap)? {
                        report(format!("shared key {s} missing on update"));
                    }
                } else if !ht.get(&s.to_le_bytes(), &mut out).await.map_err(wrap)? || out[..8] != s.to_le_bytes() {
                    report(format!("shared key {s} missing or wrong"));
                }
            }
            // Final check of this coroutine's keys, after everybody's splits.
            for &(k, v) in &mine {
                let found = ht.get(&k.to_le_bytes(), &mut out).await.map_err(wrap)?;
                if found != (v != u64::MAX) || (found && out[..] != value(k, v)[..]) {
                    report(format!("key {k}: found {found}, expected version {v}"));
                }
            }
            Ok(())
        }
    })
    .unwrap();
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "{} violations, first: {:?}", bad.len(), bad.first());
    let mut check = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = check.ctx();
    check.block_on(async move {
        let keys = race_ht_scan(&ctx).await;
        let mut seen = HashSet::new();
        for k in &keys {
            assert!(seen.insert(*k), "key {k} is in two slots");
        }
        assert!((0..32).all(|k| seen.contains(&k)), "a shared key was lost");
        let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
        let shape = ht.current_shape().await.unwrap();
        assert!(
            shape.depth >= 6 && shape.splits >= before + 100,
            "grew during the run (from {before} splits): {shape:?}"
        );
        assert_eq!(shape.subtables, shape.per_blade.iter().sum::<usize>());
        assert!(
            shape.per_blade.iter().all(|&n| n >= shape.subtables / 3),
            "subtables spread over both blades: {shape:?}"
        );
        assert!(keys.len() > 2000, "{} keys", keys.len());
    });
}

#[test]
fn a_client_with_a_stale_directory_still_finds_every_key() {
    // Client A caches the directory of a one-group table; client B (another
    // thread) then grows it to thousands of keys. A, its cache many splits
    // and doublings old, must find every key, update and insert, and must
    // have re-read its directory to do so.
    let t: Arc<dyn Transport> = backends::chaos_sized(2, 64 << 20, 3).transport;
    let mut a = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let ctx_a = a.ctx();
    let mut stale = a.block_on(async move { RaceHt::create(&ctx_a, "grow", tiny()).await.unwrap() });
    assert_eq!(stale.shape(), (0, 1));
    let t2 = t.clone();
    std::thread::spawn(move || {
        let mut b = Runtime::new(&*t2, 1, RuntimeConfig::default()).unwrap();
        let ctx = b.ctx();
        b.block_on(async move {
            let mut ht = RaceHt::open(&ctx, "grow").await.unwrap();
            for k in 0..3000u64 {
                assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
            }
            assert!(ht.shape().0 >= 6, "B's table grew: {:?}", ht.shape());
        });
    })
    .join()
    .unwrap();
    let ctx_a = a.ctx();
    a.block_on(async move {
        assert_eq!(stale.shape(), (0, 1), "A's cache is still the one-subtable directory");
        let mut out = Vec::new();
        for k in 0..3000u64 {
            assert!(stale.get(&k.to_le_bytes(), &mut out).await.unwrap(), "key {k} not found through a stale cache");
            assert_eq!(out, value(k, 0));
        }
        assert!(stale.resize_stats().refreshes >= 1 && stale.shape().0 >= 6, "A re-read the directory");
        // A fresh handle of A's thread and A itself write after the growth.
        let mut other = RaceHt::open(&ctx_a, "grow").await.unwrap();
        assert!(other.update(&5u64.to_le_bytes(), &value(5, 1)).await.unwrap());
        assert!(stale.insert(&9999u64.to_le_bytes(), &value(9999, 0)).await.unwrap());
        assert!(stale.get(&5u64.to_le_bytes(), &mut out).await.unwrap());
        assert_eq!(out, value(5, 1));
        let keys = stale.keys().await.unwrap();
        assert_eq!(keys.len(), 3001);
    });
}
