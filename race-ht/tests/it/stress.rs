//! Many coroutines on few keys, under chaos: invariants hold.

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
fn concurrent_mixed_operations_under_chaos_keep_the_invariants() {
    // Keys 0..64 are inserted first and only updated (never deleted): they
    // must all be present at the end. Keys 64..128 are inserted, updated
    // and deleted concurrently. Every value read must carry its own key,
    // and no key may end up in two slots.
    let chaos = backends::chaos_sized(2, 64 << 20, 5);
    let t = &*chaos.transport;
    let mut setup = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = setup.ctx();
    setup.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
        for k in 0..64u64 {
            assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
        }
    });
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for smart in ["none", "conflict-avoid", "spec-lookup"] {
        let cfg = RunConfig {
            threads: 3,
            coroutines: 6,
            duration: Duration::from_secs(60),
            warmup: Duration::ZERO,
            runtime: RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() },
            progress: false,
            ..RunConfig::default()
        };
        let r = driver::run(t, &cfg, |w| {
            let (bad, done) = (bad.clone(), done.clone());
            async move {
                let mut ht = RaceHt::open(w.ctx(), "stress").await.map_err(wrap)?;
                let mut rng = SmallRng::seed_from_u64((w.thread() * 100 + w.coroutine()) as u64);
                let mut out = Vec::new();
                for i in 0..300u64 {
                    let k = rng.random_range(0..128u64);
                    let key = k.to_le_bytes();
                    let v = value(k, i + 1);
                    let res = match rng.random_range(0..4) {
                        0 => ht.update(&key, &v).await.map(drop),
                        1 if k >= 64 => ht.insert(&key, &v).await.map(drop),
                        2 if k >= 64 => ht.delete(&key).await.map(drop),
                        _ => ht.get(&key, &mut out).await.map(|found| {
                            if found && out[..8] != key {
                                bad.lock().unwrap().push(format!("key {k} read a value of key {:?}", &out[..8]));
                            }
                            if !found && k < 64 {
                                bad.lock().unwrap().push(format!("key {k} missing during the run"));
                            }
                        }),
                    };
                    res.map_err(wrap)?;
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(r.errors, 0, "{smart}: {:?}", r.first_error);
    }
    assert_eq!(done.load(std::sync::atomic::Ordering::Relaxed), 3 * 3 * 6 * 300, "every operation completed");
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "{} violations, first: {:?}", bad.len(), bad.first());
    // Afterwards: all stable keys present with their own key inside, and no
    // key in two slots (scan every bucket of every subtable).
    let mut check = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = check.ctx();
    check.block_on(async move {
        let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
        let mut out = Vec::new();
        for k in 0..64u64 {
            assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap(), "stable key {k} lost");
            assert_eq!(out[..8], k.to_le_bytes());
        }
        let keys = race_ht_scan(&ctx).await;
        let mut seen = HashSet::new();
        for k in &keys {
            assert!(seen.insert(*k), "key {k} is in two slots");
        }
        assert!((0..64).all(|k| seen.contains(&k)));
    });
}

#[test]
fn racing_inserts_of_one_key_leave_one_slot() {
    // Under chaos, and over a real memory-blade server on loopback TCP.
    // 128 MiB blades: each of the 32 coroutines opens its own table
    // handle, and each handle's reclaimer takes fresh memory in spans of
    // 1 MiB (`smart_core::reclaim::SPAN`), one or two per handle here: the
    // blade's heap ended at 41-63 MiB, and a 64 MiB blade sometimes ran out.
    for b in [backends::chaos_sized(1, 128 << 20, 9), backends::tcp_sized(1, 128 << 20)] {
        racing_inserts(&*b.transport);
    }
}

/// 4 threads × 8 coroutines insert the same 40 fresh keys at once, each
/// with its own value; afterwards every key is in exactly one slot and reads
/// return one of the inserted values.
fn racing_inserts(t: &dyn Transport) {
    let mut setup = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = setup.ctx();
    setup.block_on(async move {
        RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
    });
    let wins = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cfg = RunConfig {
        threads: 4,
        coroutines: 8,
        duration: Duration::from_secs(60),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig::default(),
        progress: false,
        ..RunConfig::default()
    };
    let r = driver::run(t, &cfg, |w| {
        let wins = wins.clone();
        async move {
            let mut ht = RaceHt::open(w.ctx(), "stress").await.map_err(wrap)?;
            let me = (w.thread() * 8 + w.coroutine()) as u64;
            for k in 0..40u64 {
                let ok = ht.insert(&k.to_le_bytes(), &value(k, me)).await.map_err(wrap)?;
                wins.fetch_add(u64::from(ok), std::sync::atomic::Ordering::Relaxed);
            }
            // What is left of the handle's spans goes back to the blade.
            ht.close().await.map_err(wrap)?;
            Ok(())
        }
    })
    .unwrap();
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    // At least one insert per key succeeded; races may let several "win".
    assert!(wins.load(std::sync::atomic::Ordering::Relaxed) >= 40);
    let mut check = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = check.ctx();
    check.block_on(async move {
        let mut keys = race_ht_scan(&ctx).await;
        keys.sort_unstable();
        assert_eq!(keys, (0..40).collect::<Vec<u64>>(), "each key in exactly one slot");
        let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
        let mut out = Vec::new();
        for k in 0..40u64 {
            assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap());
            assert_eq!(out[..8], k.to_le_bytes());
            assert!(u64::from_le_bytes(out[8..16].try_into().unwrap()) < 32);
        }
    });
}
