//! Handles: a second client, speculative lookups.

use std::sync::Arc;

use race_ht::RaceHt;
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig, Transport};

use crate::{small, value};

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
fn a_table_too_large_to_address_is_refused_with_a_message() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        // Sized for 2^64 - 1 keys: no overflow on the way, and subtables
        // larger than a blade's 40-bit offsets reach are refused.
        let cfg = race_ht::RaceConfig::for_keys(u64::MAX);
        let e = RaceHt::create(&ctx, "huge", cfg).await.unwrap_err().to_string();
        assert!(e.contains("groups per subtable: more than the 1099511627776 bytes a blade addresses"), "{e}");
        assert!(RaceHt::open(&ctx, "huge").await.is_err(), "nothing was created");
    });
}

/// A runtime on `t` with speculative search (and updates) on.
fn speculating(t: &EmbeddedTransport) -> Runtime {
    let smart = SmartConfig { spec_lookup: true, ..SmartConfig::default() };
    Runtime::new(t, 0, RuntimeConfig { smart, ..RuntimeConfig::default() }).unwrap()
}

#[test]
fn speculative_lookups_hit_with_one_doorbell() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let mut rt = speculating(&t);
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
        // A window in which the reclaimer refreshed (at most every 2 ms, a
        // few verbs of its own: a slow or loaded machine) is measured again.
        let mut windows = 0;
        let (d, h0, m0) = loop {
            let refreshes = ht.reclaim_stats().refreshes;
            let before = ctx.stats();
            let (h0, m0) = ht.spec_stats();
            for k in 0..100u64 {
                assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap());
                assert_eq!(out, value(k, 0));
            }
            let d = ctx.stats().since(&before);
            if ht.reclaim_stats().refreshes == refreshes {
                break (d, h0, m0);
            }
            windows += 1;
            assert!(windows < 50, "the reclaimer refreshed in each of 50 windows of 100 lookups");
        };
        // Keys whose cache entries collided (direct-mapped) take the normal
        // path: 2 doorbells, 3 READs, and count as misses. Every cached one
        // hits.
        let (hits, misses) = ht.spec_stats();
        let (hits, misses) = (hits - h0, misses - m0);
        assert!(hits >= 90 && hits + misses == 100, "{hits} hits, {misses} misses");
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
        assert!(h2 - h0 == hits && m2 - m0 == misses + 1, "the stale entry (or 7's collided one) missed");
        assert!(other.delete(&8u64.to_le_bytes()).await.unwrap());
        assert!(!ht.get(&8u64.to_le_bytes(), &mut out).await.unwrap(), "a deleted key is not found speculatively");
    });
}

#[test]
fn entries_up_to_the_maximum_fit_and_larger_ones_are_refused() {
    let t = EmbeddedTransport::new(1, 64 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "big", small()).await.unwrap();
        let max = RaceHt::max_kv_bytes(ctx.config().slot_bytes);
        assert!(max > 16_000, "{max}");
        let key = b"key".to_vec();
        let v = vec![7u8; max - key.len()];
        assert!(ht.insert(&key, &v).await.unwrap());
        let mut out = Vec::new();
        assert!(ht.get(&key, &mut out).await.unwrap());
        assert_eq!(out, v, "the largest entry reads back whole");
        let too = vec![8u8; max - key.len() + 1];
        let e = ht.upsert(&key, &too).await.unwrap_err();
        assert!(matches!(e, race_ht::RaceError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains(&max.to_string()), "{e}");
        assert!(ht.get(&key, &mut out).await.unwrap());
        assert_eq!(out, v, "a refused write changes nothing");
    });
}

/// The blade's heap pointer.
async fn heap(ctx: &smart_core::Ctx) -> u64 {
    ctx.read_u64(smart_core::GlobalAddr::new(0, smart_core::layout::OFF_HEAP)).await.unwrap()
}

#[test]
fn a_dropped_table_gives_its_memory_back_and_its_clients_a_clean_error() {
    let t: Arc<dyn Transport> = Arc::new(EmbeddedTransport::new(1, 64 << 20).unwrap());
    let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let load = |name: &'static str| {
            let ctx = ctx.clone();
            async move {
                let mut ht = RaceHt::create(&ctx, name, small()).await.unwrap();
                for k in 0..3000u64 {
                    assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
                }
                ht.close().await.unwrap();
            }
        };
        let h0 = heap(&ctx).await;
        load("gone").await;
        let h1 = heap(&ctx).await;
        // A client holds the table while it is dropped.
        let mut other = RaceHt::open(&ctx, "gone").await.unwrap();
        let mut out = Vec::new();
        assert!(other.get(&7u64.to_le_bytes(), &mut out).await.unwrap());
        let d = RaceHt::drop_table(&ctx, "gone").await.unwrap().expect("it exists");
        assert_eq!(d.blocks, 3000, "{d:?}");
        assert!(d.subtables >= 4 && d.bytes > 3000 * 64, "{d:?}");
        assert!(!RaceHt::exists(&ctx, "gone").await.unwrap());
        assert!(RaceHt::drop_table(&ctx, "gone").await.unwrap().is_none());
        assert!(matches!(RaceHt::open(&ctx, "gone").await, Err(race_ht::RaceError::Corrupt(_))));
        // The holder's next operations fail cleanly once its epoch moves.
        let mut failed = None;
        for _ in 0..200 {
            ctx.sleep_ns(1_000_000).await;
            match other.get(&7u64.to_le_bytes(), &mut out).await {
                Ok(_) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(failed, Some(race_ht::RaceError::Dropped)), "{failed:?}");
        assert!(matches!(other.insert(b"new", b"v").await, Err(race_ht::RaceError::Dropped)));
        other.close().await.unwrap();
        // The same load again takes its memory from the dropped table's.
        load("again").await;
        let h2 = heap(&ctx).await;
        assert!(h2 - h1 < (h1 - h0) / 4, "first load took {} bytes, the second {}", h1 - h0, h2 - h1);
        let mut ht = RaceHt::open(&ctx, "again").await.unwrap();
        assert_eq!(ht.keys().await.unwrap().len(), 3000);
    });
}

#[test]
fn speculative_updates_take_two_doorbells_and_fall_back_when_stale() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let mut rt = speculating(&t);
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut ht = RaceHt::create(&ctx, "specup", small()).await.unwrap();
        let mut out = Vec::new();
        // Refreshes of the reclaimer since `since`: a window of updates is
        // measured again when one happened in it or in the stretch before
        // it. A refresh is a few verbs of its own, and the next allocation
        // after one looks at the blade's free list again (a READ).
        let mut since = ht.reclaim_stats().refreshes;
        let keys: Vec<[u8; 8]> = (0..50u64).map(u64::to_le_bytes).collect();
        for (i, k) in keys.iter().enumerate() {
            ht.insert(k, &value(i as u64, 0)).await.unwrap();
            assert!(ht.get(k, &mut out).await.unwrap()); // remembered
        }
        // (The values written are the same in every window.)
        let mut windows = 0;
        let (d, h0, m0) = loop {
            let start = ht.reclaim_stats().refreshes;
            let (h0, m0) = ht.spec_stats();
            let before = ctx.stats();
            for (i, k) in keys.iter().enumerate() {
                assert!(ht.update(k, &value(i as u64, 1)).await.unwrap());
            }
            let d = ctx.stats().since(&before);
            if ht.reclaim_stats().refreshes == since {
                break (d, h0, m0);
            }
            since = start;
            windows += 1;
            assert!(windows < 50, "the reclaimer refreshed in each of 50 windows of 50 updates");
        };
        // [WRITE new block, READ the slot word, READ the remembered block]
        // and a CAS: two doorbells, where the normal path takes three
        // (buckets and the block WRITE, the key check, the CAS).
        assert_eq!((d.doorbells, d.reads, d.writes, d.cas), (100, 100, 50, 50), "{d:?}");
        assert_eq!(d.retries, 0);
        for (i, k) in keys.iter().enumerate() {
            assert!(ht.get(k, &mut out).await.unwrap());
            assert_eq!(out, value(i as u64, 1));
        }
        assert_eq!(ht.spec_stats(), (h0 + 50, m0), "lookups of the updated slots hit");
        // Another handle changes key 0 and deletes key 1: the remembered
        // words are stale, the CAS (or the key check) fails, and the normal
        // path decides.
        let mut other = RaceHt::open(&ctx, "specup").await.unwrap();
        other.update(&keys[0], &value(0, 7)).await.unwrap();
        assert!(other.delete(&keys[1]).await.unwrap());
        let before = ctx.stats();
        assert!(ht.update(&keys[0], &value(0, 8)).await.unwrap());
        assert!(!ht.update(&keys[1], &value(1, 8)).await.unwrap(), "a deleted key is not updated");
        assert!(ctx.stats().since(&before).doorbells > 4, "both fell back to the normal path");
        assert!(other.get(&keys[0], &mut out).await.unwrap());
        assert_eq!(out, value(0, 8));
        assert!(!other.get(&keys[1], &mut out).await.unwrap());
        // A block reused for another key fails the key check: key 2's
        // remembered block is retired by an update through the other handle
        // and may be reused; the update still lands on key 2 alone.
        other.update(&keys[2], &value(2, 7)).await.unwrap();
        for k in 50..80u64 {
            other.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap();
        }
        assert!(ht.update(&keys[2], &value(2, 9)).await.unwrap());
        assert!(other.get(&keys[2], &mut out).await.unwrap());
        assert_eq!(out, value(2, 9));
        for k in 50..80u64 {
            assert!(other.get(&k.to_le_bytes(), &mut out).await.unwrap());
            assert_eq!(out, value(k, 0), "key {k} untouched");
        }
    });
}
