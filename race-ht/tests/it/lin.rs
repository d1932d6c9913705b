//! Per-key histories are linearizable while subtables split under them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use race_ht::RaceHt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_bench::harness::{self as driver, RunConfig};
use smart_core::smart::SmartConfig;
use smart_core::{Runtime, RuntimeConfig};
use smart_testkit::backends;
use smart_testkit::lin::{linearizable, Event};

use crate::{tiny, value, wrap};

#[test]
fn per_key_histories_under_chaos_are_linearizable() {
    // 2 threads × 3 coroutines update and read 4 keys concurrently (no
    // inserts or deletes of them, so no duplicate removal is involved);
    // every write is unique. Meanwhile a fourth coroutine per thread
    // inserts fresh keys into the one-group table, so the subtables of the
    // 4 keys split under the readers and writers. Each key's recorded
    // history must be linearizable.
    let chaos = backends::chaos_sized(1, 32 << 20, 17);
    let t = &*chaos.transport;
    let mut setup = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = setup.ctx();
    setup.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "lin", tiny()).await.unwrap();
        for k in 0..4u64 {
            ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap();
        }
    });
    let t0 = std::time::Instant::now();
    let history: Arc<Mutex<Vec<(u64, Event)>>> = Arc::default();
    for (round, smart) in ["none", "spec-lookup,conflict-avoid"].into_iter().enumerate() {
        let cfg = RunConfig {
            threads: 2,
            coroutines: 4,
            duration: Duration::from_secs(60),
            warmup: Duration::ZERO,
            runtime: RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() },
            progress: false,
            ..RunConfig::default()
        };
        history.lock().unwrap().clear();
        let r = driver::run(t, &cfg, |w| {
            let history = history.clone();
            async move {
                let mut ht = RaceHt::open(w.ctx(), "lin").await.map_err(wrap)?;
                let me = (w.thread() * 4 + w.coroutine() + 1) as u64;
                if w.coroutine() == 3 {
                    for i in 0..300u64 {
                        let k = (round as u64 + 1) << 40 | me << 20 | i;
                        ht.insert(&k.to_le_bytes(), &value(k, 0)).await.map_err(wrap)?;
                    }
                    SPLITS.fetch_add(ht.resize_stats().splits, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
                let mut rng = SmallRng::seed_from_u64(me);
                let mut out = Vec::new();
                let mut mine = Vec::new();
                for seq in 0..150u64 {
                    let k = rng.random_range(0..4u64);
                    let start = t0.elapsed().as_nanos();
                    let ev = if rng.random_bool(0.5) {
                        // Unique across rounds too: round | coroutine | sequence.
                        let version = (round as u64 + 1) << 48 | me << 32 | (seq + 1);
                        let ok = ht.update(&k.to_le_bytes(), &value(k, version)).await;
                        assert!(ok.map_err(wrap)?);
                        Event { start, end: t0.elapsed().as_nanos(), write: true, value: version }
                    } else {
                        let found = ht.get(&k.to_le_bytes(), &mut out).await;
                        assert!(found.map_err(wrap)?);
                        assert_eq!(out[..8], k.to_le_bytes());
                        let v = u64::from_le_bytes(out[8..16].try_into().unwrap());
                        Event { start, end: t0.elapsed().as_nanos(), write: false, value: v }
                    };
                    mine.push((k, ev));
                }
                history.lock().unwrap().extend(mine);
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(r.errors, 0, "{smart}: {:?}", r.first_error);
        let h = history.lock().unwrap();
        assert_eq!(h.len(), 6 * 150);
        for k in 0..4u64 {
            let ops: Vec<Event> = h.iter().filter(|(key, _)| *key == k).map(|(_, e)| *e).collect();
            // A round starts from the value the previous round left.
            let init = if round == 0 { 0 } else { LAST.lock().unwrap()[k as usize] };
            if let Err(e) = linearizable(&ops, init) {
                panic!("{smart}: key {k}: {e}");
            }
        }
        // Remember each key's final value for the next round.
        let mut last = LAST.lock().unwrap();
        for k in 0..4u64 {
            let mut check = Runtime::new(t, 9, RuntimeConfig::default()).unwrap();
            let ctx = check.ctx();
            last[k as usize] = check.block_on(async move {
                let mut ht = RaceHt::open(&ctx, "lin").await.unwrap();
                let mut out = Vec::new();
                assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap());
                u64::from_le_bytes(out[8..16].try_into().unwrap())
            });
        }
    }
    assert!(SPLITS.load(std::sync::atomic::Ordering::Relaxed) >= 10, "the table split during the histories");
}

static LAST: Mutex<[u64; 4]> = Mutex::new([0; 4]);
static SPLITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
