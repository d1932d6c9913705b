//! race-ht against an oracle and under concurrency (one test binary).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use race_ht::{RaceConfig, RaceHt, ResizeStats};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_core::driver::{self, RunConfig};
use smart_core::smart::SmartConfig;
use smart_core::{ChaosConfig, EmbeddedTransport, Runtime, RuntimeConfig, Transport};

fn small() -> RaceConfig {
    RaceConfig { depth: 2, groups: 16, grace: Duration::from_millis(1) }
}

/// One subtable of one group (21 slots): grows by splitting almost at once.
fn tiny() -> RaceConfig {
    RaceConfig { depth: 0, groups: 1, grace: Duration::from_millis(1) }
}

/// One step of an oracle sequence.
#[derive(Clone, Debug)]
enum Step {
    Insert(u8, usize),
    Update(u8, usize),
    Upsert(u8, usize),
    Delete(u8),
    Get(u8),
}

fn step() -> impl Strategy<Value = Step> {
    // Few keys (so operations collide on them), values from 1 byte to
    // multi-line blocks.
    let key = 0u8..40;
    let len = prop::sample::select(vec![1usize, 8, 40, 100, 300]);
    prop_oneof![
        (key.clone(), len.clone()).prop_map(|(k, l)| Step::Insert(k, l)),
        (key.clone(), len.clone()).prop_map(|(k, l)| Step::Update(k, l)),
        (key.clone(), len).prop_map(|(k, l)| Step::Upsert(k, l)),
        key.clone().prop_map(Step::Delete),
        key.prop_map(Step::Get),
    ]
}

/// Runs `steps` against the table and a `HashMap`; every result must agree.
fn check_against_hashmap(steps: &[Step], spec: bool, shape: RaceConfig) -> Result<ResizeStats, TestCaseError> {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let smart = SmartConfig { spec_lookup: spec, ..SmartConfig::default() };
    let mut rt = Runtime::new(&t, 0, RuntimeConfig { smart, ..RuntimeConfig::default() }).unwrap();
    let ctx = rt.ctx();
    let steps = steps.to_vec();
    rt.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "oracle", shape).await.unwrap();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut out = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            let k = |k: &u8| format!("key-{k}").into_bytes();
            let v = |l: &usize| (0..*l).map(|j| (i * 7 + j) as u8).collect::<Vec<u8>>();
            match s {
                Step::Insert(key, l) => {
                    let present = model.contains_key(&k(key));
                    prop_assert_eq!(ht.insert(&k(key), &v(l)).await.unwrap(), !present, "step {}: {:?}", i, s);
                    model.entry(k(key)).or_insert(v(l));
                }
                Step::Update(key, l) => {
                    let present = model.contains_key(&k(key));
                    prop_assert_eq!(ht.update(&k(key), &v(l)).await.unwrap(), present, "step {}: {:?}", i, s);
                    if present {
                        model.insert(k(key), v(l));
                    }
                }
                Step::Upsert(key, l) => {
                    ht.upsert(&k(key), &v(l)).await.unwrap();
                    model.insert(k(key), v(l));
                }
                Step::Delete(key) => {
                    prop_assert_eq!(
                        ht.delete(&k(key)).await.unwrap(),
                        model.remove(&k(key)).is_some(),
                        "step {}: {:?}",
                        i,
                        s
                    );
                }
                Step::Get(key) => {
                    let found = ht.get(&k(key), &mut out).await.unwrap();
                    prop_assert_eq!(found.then_some(&out), model.get(&k(key)), "step {}: {:?}", i, s);
                }
            }
        }
        for (key, val) in &model {
            prop_assert!(ht.get(key, &mut out).await.unwrap());
            prop_assert_eq!(&out, val);
        }
        let mut keys = ht.scan().await.unwrap();
        keys.sort();
        let mut want: Vec<Vec<u8>> = model.keys().cloned().collect();
        want.sort();
        prop_assert_eq!(keys, want, "the slots hold exactly the model's keys, once each");
        Ok(ht.resize_stats())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn operation_sequences_match_a_hashmap(
        steps in prop::collection::vec(step(), 1..400),
        spec in any::<bool>(),
        grow in any::<bool>(),
    ) {
        // `grow`: a one-group table that splits as keys arrive.
        check_against_hashmap(&steps, spec, if grow { tiny() } else { small() })?;
    }
}

#[test]
fn a_long_seeded_sequence_matches_a_hashmap() {
    // One long sequence (20 000 steps) beyond what the proptest cases cover.
    let mut rng = SmallRng::seed_from_u64(11);
    let steps: Vec<Step> = (0..20_000)
        .map(|_| {
            let k = rng.random_range(0..255u8);
            let l = [8, 40, 100, 300][rng.random_range(0..4)];
            match rng.random_range(0..5) {
                0 => Step::Insert(k, l),
                1 => Step::Update(k, l),
                2 => Step::Upsert(k, l),
                3 => Step::Delete(k),
                _ => Step::Get(k),
            }
        })
        .collect();
    for spec in [false, true] {
        check_against_hashmap(&steps, spec, small()).unwrap();
        let st = check_against_hashmap(&steps, spec, tiny()).unwrap();
        assert!(st.splits >= 8 && st.doublings >= 3, "the one-group table grew: {st:?}");
    }
}

/// Value of `key` at `version`: both encoded, then padding.
fn value(key: u64, version: u64) -> [u8; 24] {
    let mut v = [0xee; 24];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

#[test]
fn concurrent_mixed_operations_under_chaos_keep_the_invariants() {
    // Keys 0..64 are inserted first and only updated (never deleted): they
    // must all be present at the end. Keys 64..128 are inserted, updated
    // and deleted concurrently. Every value read must carry its own key,
    // and no key may end up in two slots.
    let t = EmbeddedTransport::new(2, 64 << 20).unwrap().with_chaos(ChaosConfig::new(5));
    let mut setup = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
        };
        let r = driver::run(&t, &cfg, |w| {
            let (bad, done) = (bad.clone(), done.clone());
            async move {
                let mut ht =
                    RaceHt::open(w.ctx(), "stress").await.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
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
                    res.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
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
    let mut check = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
    // 4 threads × 8 coroutines insert the same 40 fresh keys at once, each
    // with its own value; afterwards every key is in exactly one slot and
    // reads return one of the inserted values.
    let t = EmbeddedTransport::new(1, 64 << 20).unwrap().with_chaos(ChaosConfig::new(9));
    let mut setup = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
    };
    let r = driver::run(&t, &cfg, |w| {
        let wins = wins.clone();
        async move {
            let mut ht =
                RaceHt::open(w.ctx(), "stress").await.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
            let me = (w.thread() * 8 + w.coroutine()) as u64;
            for k in 0..40u64 {
                let ok = ht
                    .insert(&k.to_le_bytes(), &value(k, me))
                    .await
                    .map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
                wins.fetch_add(u64::from(ok), std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .unwrap();
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    // At least one insert per key succeeded; races may let several "win".
    assert!(wins.load(std::sync::atomic::Ordering::Relaxed) >= 40);
    let mut check = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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

/// Every key stored in table "stress", by reading all of its buckets.
async fn race_ht_scan(ctx: &smart_core::Ctx) -> Vec<u64> {
    let mut ht = RaceHt::open(ctx, "stress").await.unwrap();
    ht.scan().await.unwrap().iter().map(|k| u64::from_le_bytes(k[..8].try_into().unwrap())).collect()
}

#[test]
fn a_second_client_opens_the_same_table() {
    let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(1, 16 << 20).unwrap());
    let mut a = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let ctx = a.ctx();
    a.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "shared", small()).await.unwrap();
        ht.insert(b"x", b"1").await.unwrap();
    });
    let mut b = Runtime::new(&*t, 1, RuntimeConfig::default()).unwrap();
    let ctx = b.ctx();
    b.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "shared", small()).await.unwrap(); // exists: opens it
        let mut out = Vec::new();
        assert!(ht.get(b"x", &mut out).await.unwrap());
        assert_eq!(out, b"1");
        assert!(RaceHt::open(&ctx, "missing").await.is_err());
    });
}

#[test]
fn speculative_lookups_hit_with_one_doorbell() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let smart = SmartConfig { spec_lookup: true, ..SmartConfig::default() };
    let mut rt = Runtime::new(&t, 0, RuntimeConfig { smart, ..RuntimeConfig::default() }).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "spec", small()).await.unwrap();
        let mut out = Vec::new();
        for k in 0..100u64 {
            ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap();
        }
        for k in 0..100u64 {
            assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap()); // fills the cache
        }
        let before = ctx.stats();
        for k in 0..100u64 {
            assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap());
            assert_eq!(out, value(k, 0));
        }
        let d = ctx.stats().since(&before);
        // Keys whose cache entries collided (direct-mapped) take the normal
        // path: 2 doorbells, 3 READs. Every cached one hits.
        let (hits, misses) = ht.spec_stats();
        assert!(hits >= 90 && misses == 0, "{hits} hits, {misses} misses");
        let normal = 100 - hits;
        assert_eq!((d.doorbells, d.reads), (hits + 2 * normal, 2 * hits + 3 * normal), "one doorbell per hit");
        // An update through another handle changes the slot: the cached
        // word no longer matches, the lookup falls back and still returns
        // the new value.
        let mut other = RaceHt::open(&ctx, "spec").await.unwrap();
        other.update(&7u64.to_le_bytes(), &value(7, 9)).await.unwrap();
        assert!(ht.get(&7u64.to_le_bytes(), &mut out).await.unwrap());
        assert_eq!(out, value(7, 9));
        let (h2, m2) = ht.spec_stats();
        assert!(h2 == hits && m2 <= 1, "the stale entry missed (unless 7's entry had collided away)");
        assert!(other.delete(&8u64.to_le_bytes()).await.unwrap());
        assert!(!ht.get(&8u64.to_le_bytes(), &mut out).await.unwrap(), "a deleted key is not found speculatively");
    });
}

/// One completed operation on a register, with real-time bounds (ns).
#[derive(Clone, Copy, Debug)]
struct Event {
    start: u128,
    end: u128,
    write: bool,
    /// The value written, or the value read.
    value: u64,
}

/// Whether a history of one register with unique written values is
/// linearizable (Gibbons & Korach's zone test). The initial value `init`
/// counts as written before everything.
///
/// Group each write with the reads that returned its value (a *cluster*).
/// A cluster's zone runs from its earliest response to its latest
/// invocation: *forward* when the earliest response comes first, else
/// *backward*. The history is linearizable iff no read ends before its
/// write starts, no read returns a value never written, no two forward
/// zones overlap, and no backward zone lies inside a forward zone.
fn linearizable(history: &[Event], init: u64) -> Result<(), String> {
    let mut clusters: HashMap<u64, (u128, u128)> = HashMap::new(); // value → (min end, max start)
    let writes: HashMap<u64, Event> = history.iter().filter(|e| e.write).map(|e| (e.value, *e)).collect();
    clusters.insert(init, (0, 0));
    for w in writes.values() {
        clusters.insert(w.value, (w.end, w.start));
    }
    for r in history.iter().filter(|e| !e.write) {
        let c = clusters.get_mut(&r.value).ok_or_else(|| format!("read {r:?} returned a value never written"))?;
        if let Some(w) = writes.get(&r.value) {
            if r.end < w.start {
                return Err(format!("read {r:?} ended before its write {w:?} began"));
            }
        }
        c.0 = c.0.min(r.end);
        c.1 = c.1.max(r.start);
    }
    let forward: Vec<(u128, u128)> = clusters.values().filter(|(e, s)| e < s).copied().collect();
    let backward: Vec<(u128, u128)> = clusters.values().filter(|(e, s)| e >= s).map(|(e, s)| (*s, *e)).collect();
    for (i, a) in forward.iter().enumerate() {
        for b in &forward[i + 1..] {
            if a.0 < b.1 && b.0 < a.1 {
                return Err(format!("forward zones {a:?} and {b:?} overlap"));
            }
        }
        for b in &backward {
            if a.0 < b.0 && b.1 < a.1 {
                return Err(format!("backward zone {b:?} lies inside forward zone {a:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn the_linearizability_checker_rejects_what_it_should() {
    // Real events start after time 0, where the initial value was "written".
    let ev = |start, end, write, value| Event { start, end, write, value };
    // Sequential and overlapping, fine.
    assert!(
        linearizable(&[ev(1, 10, true, 1), ev(20, 30, false, 1), ev(25, 40, true, 2), ev(35, 50, false, 2)], 0).is_ok()
    );
    assert!(
        linearizable(&[ev(1, 10, true, 1), ev(5, 6, false, 0)], 0).is_ok(),
        "a read overlapping a write may see the old value"
    );
    // A read of a value written only after the read ended.
    assert!(linearizable(&[ev(1, 10, false, 1), ev(20, 30, true, 1)], 0).is_err());
    // New then old: two sequential reads see 2 and then 1, after both writes ended.
    let h = [ev(1, 10, true, 1), ev(20, 30, true, 2), ev(40, 50, false, 2), ev(60, 70, false, 1)];
    assert!(linearizable(&h, 0).is_err());
    // A stale read of the initial value after a completed write.
    assert!(linearizable(&[ev(1, 10, true, 1), ev(20, 30, false, 0)], 0).is_err());
    assert!(linearizable(&[ev(1, 10, false, 9)], 0).is_err());
}

#[test]
fn per_key_histories_under_chaos_are_linearizable() {
    // 2 threads × 3 coroutines update and read 4 keys concurrently (no
    // inserts or deletes of them, so no duplicate removal is involved);
    // every write is unique. Meanwhile a fourth coroutine per thread
    // inserts fresh keys into the one-group table, so the subtables of the
    // 4 keys split under the readers and writers. Each key's recorded
    // history must be linearizable.
    let t = EmbeddedTransport::new(1, 32 << 20).unwrap().with_chaos(ChaosConfig::new(17));
    let mut setup = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
        };
        history.lock().unwrap().clear();
        let r = driver::run(&t, &cfg, |w| {
            let history = history.clone();
            async move {
                let mut ht =
                    RaceHt::open(w.ctx(), "lin").await.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
                let me = (w.thread() * 4 + w.coroutine() + 1) as u64;
                if w.coroutine() == 3 {
                    for i in 0..300u64 {
                        let k = (round as u64 + 1) << 40 | me << 20 | i;
                        ht.insert(&k.to_le_bytes(), &value(k, 0))
                            .await
                            .map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
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
                        assert!(ok.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?);
                        Event { start, end: t0.elapsed().as_nanos(), write: true, value: version }
                    } else {
                        let found = ht.get(&k.to_le_bytes(), &mut out).await;
                        assert!(found.map_err(|e| smart_core::Error::Unsupported(e.to_string()))?);
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
            let mut check = Runtime::new(&t, 9, RuntimeConfig::default()).unwrap();
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

/// Maps a table error into the driver's error type.
fn wrap(e: race_ht::RaceError) -> smart_core::Error {
    smart_core::Error::Unsupported(e.to_string())
}

#[test]
fn a_one_group_table_grows_under_chaos_while_operations_continue() {
    // 3 threads × 6 coroutines on two blades, from a 21-slot table: each
    // coroutine inserts its own 150 fresh keys (so the table splits all
    // through the run), updates and reads back its earlier keys, deletes
    // every fifth one, and meanwhile updates and reads 32 shared keys.
    // Every read must find its key (unless deleted) with its latest value;
    // at the end every surviving key is present once, in the right subtable.
    let t = EmbeddedTransport::new(2, 64 << 20).unwrap().with_chaos(ChaosConfig::new(23));
    let mut setup = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
    };
    let r = driver::run(&t, &cfg, |w| {
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
    let mut check = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
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
    let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(2, 64 << 20).unwrap().with_chaos(ChaosConfig::new(3)));
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
        let keys = stale.scan().await.unwrap();
        assert_eq!(keys.len(), 3001);
    });
}
