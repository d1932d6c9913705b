//! Many threads × coroutines under chaos (torn READs and WRITEs, reordered
//! completions): growth from an empty tree, and Sherman's three known
//! races as named regressions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sherman_bt::ShermanStats;
use smart_core::IndexStats;
use smart_testkit::backends::{self, Backend};
use smart_testkit::lin::{linearizable, Event};

use crate::{checked_keys, holds_key, on_tree, run_tree, value};

/// `blades` chaos blades of 64 MiB (see `smart_testkit::backends::chaos_seed`).
fn chaos(blades: usize, seed: u64) -> Backend {
    backends::chaos_sized(blades, 64 << 20, seed)
}

/// Sherman's issue #26: concurrent inserts into a small tree tripped its
/// root-split assertions. Here 3 threads × 8 coroutines grow trees from a
/// single empty leaf, again and again (so root splits race other splits and
/// other root splits), each coroutine reading its own keys back as it goes;
/// then every tree's whole structure is checked.
#[test]
fn sherman_26_concurrent_growth_from_an_empty_tree() {
    const NAMES: [&str; 12] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8", "g9", "g10", "g11"];
    let mut total = ShermanStats::default();
    for (round, name) in NAMES.into_iter().enumerate() {
        let smart = if round % 2 == 0 { "none" } else { "conflict-avoid,spec-lookup" };
        let backend = chaos(2, 26 + round as u64);
        let t = &*backend.transport;
        let per = if round == 0 { 250u64 } else { 60 };
        let (_, stats) = run_tree(t, 3, 8, smart, name, |w, mut tree| {
            let me = (w.thread() * 8 + w.coroutine()) as u64;
            async move {
                let mut rng = SmallRng::seed_from_u64(me + round as u64 * 100);
                for i in 0..per {
                    // Interleaved key ranges: every coroutine inserts all
                    // over the key space.
                    let k = i * 24 + me;
                    assert!(tree.insert_u64(k, value(k, 0)).await?, "key {k} was new");
                    let back = rng.random_range(0..=i) * 24 + me;
                    let v = tree.get_u64(back).await?;
                    assert_eq!(v, Some(value(back, 0)), "coroutine {me} lost its key {back}");
                }
                Ok(())
            }
        });
        let (shape, keys) = checked_keys(t, name);
        assert_eq!(keys, (0..24 * per).collect::<Vec<_>>(), "{name}: every key once");
        assert_eq!(shape.unlinked, 0, "{name}: {shape:?}");
        assert!(shape.depth >= 2, "{name}: {shape:?}");
        assert_eq!(stats.root_grows, u64::from(shape.depth - 1), "{name}: one new root per level");
        total.merge(&stats);
    }
    let s = total;
    assert!(s.leaf_splits > 500, "{s:?}");
    assert!(s.lock_retries > 0 && s.handovers > 0, "writers met on locks, across and within threads: {s:?}");
}

/// Sherman's issue #27: lookups returned "not found" during a concurrent
/// update. Readers look up keys that are present all along while writers
/// update them and inserters split their leaves.
#[test]
fn sherman_27_lookups_never_miss_a_present_key_during_updates() {
    let backend = chaos(2, 27);
    let t = &*backend.transport;
    on_tree(t, 0, "none", "upd", |mut tree| async move {
        for k in 0..600u64 {
            tree.insert_u64(k * 4, value(k * 4, 0)).await.unwrap();
        }
    });
    let reads = Arc::new(AtomicU64::new(0));
    run_tree(t, 3, 6, "spec-lookup", "upd", |w, mut tree| {
        let me = (w.thread() * 6 + w.coroutine()) as u64;
        let reads = reads.clone();
        async move {
            let mut rng = SmallRng::seed_from_u64(me + 100);
            for i in 0..400u64 {
                let k = rng.random_range(0..600u64) * 4;
                match me % 3 {
                    0 => assert!(tree.update_u64(k, value(k, me << 20 | i)).await?),
                    1 => {
                        // New keys between the present ones: splits.
                        let n = k + 1 + me % 3;
                        tree.upsert_u64(n, value(n, 0)).await?;
                    }
                    _ => {
                        let v = tree.get_u64(k).await?;
                        assert!(v.is_some_and(|v| holds_key(v, k)), "key {k} read {v:?}");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        }
    });
    assert_eq!(reads.load(Ordering::Relaxed), 6 * 400);
    let (shape, keys) = checked_keys(t, "upd");
    assert!((0..600u64).all(|k| keys.binary_search(&(k * 4)).is_ok()), "{shape:?}");
}

/// Sherman's issue #18: range scans missed keys under concurrent inserts.
/// Even keys are present all along; inserters add odd keys (splitting the
/// leaves under the scans); every scan must return, in order, every even
/// key from its start up to where it stopped, and must stop only at its
/// count or at the end of the tree.
#[test]
fn sherman_18_scans_never_miss_a_key_present_for_the_whole_scan() {
    let backend = chaos(2, 18);
    let t = &*backend.transport;
    let n = 2000u64;
    on_tree(t, 0, "none", "scan", move |mut tree| async move {
        for k in 0..n {
            tree.insert_u64(2 * k, value(2 * k, 0)).await.unwrap();
        }
    });
    let scans = Arc::new(AtomicU64::new(0));
    run_tree(t, 3, 6, "none", "scan", |w, mut tree| {
        let me = (w.thread() * 6 + w.coroutine()) as u64;
        let scans = scans.clone();
        async move {
            let mut rng = SmallRng::seed_from_u64(me + 1000);
            let mut out = Vec::new();
            for _ in 0..150 {
                if me % 2 == 0 {
                    let k = rng.random_range(0..n) * 2 + 1;
                    tree.upsert_u64(k, value(k, 1)).await?;
                    continue;
                }
                let start = rng.random_range(0..2 * n + 10);
                let count = rng.random_range(1..=100usize);
                tree.scan_u64(start, count, &mut out).await?;
                assert!(out.len() <= count);
                assert!(out.windows(2).all(|p| p[0].0 < p[1].0), "scan out of order: {out:?}");
                assert!(out.iter().all(|(k, v)| *k >= start && holds_key(*v, *k)), "scan from {start}: {out:?}");
                let evens: Vec<u64> = out.iter().map(|e| e.0).filter(|k| k % 2 == 0).collect();
                let first_even = start.next_multiple_of(2);
                let last = if out.len() == count { out.last().map_or(first_even, |e| e.0 + 1) } else { 2 * n };
                let want: Vec<u64> = (first_even..last.min(2 * n)).step_by(2).collect();
                assert_eq!(evens, want, "scan from {start} for {count} missed a present key");
                scans.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    });
    assert_eq!(scans.load(Ordering::Relaxed), 9 * 150);
    let (shape, _) = checked_keys(t, "scan");
    assert_eq!(shape.unlinked, 0);
}

/// Torn reads happen under chaos and are caught: writers rewrite the pages
/// of a few keys while readers read them; readers re-read torn copies (the
/// counter shows it) and never return a value of another key or a mix.
#[test]
fn torn_page_reads_are_caught_and_read_again() {
    let backend = chaos(1, 99);
    let t = &*backend.transport;
    on_tree(t, 0, "none", "torn", |mut tree| async move {
        for k in 0..40u64 {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
    });
    let (_, s) = run_tree(t, 2, 8, "none", "torn", |w, mut tree| {
        let me = (w.thread() * 8 + w.coroutine()) as u64;
        async move {
            let mut rng = SmallRng::seed_from_u64(me + 7);
            for i in 0..1500u64 {
                let k = rng.random_range(0..40u64);
                if me % 2 == 0 {
                    assert!(tree.update_u64(k, value(k, i)).await?);
                } else {
                    let v = tree.get_u64(k).await?;
                    assert!(v.is_some_and(|v| holds_key(v, k)), "key {k} read {v:?}");
                }
            }
            Ok(())
        }
    });
    assert!(s.torn > 0, "no torn read was seen, so none was caught: {s:?}");
}

/// Per-key histories are linearizable while leaves split under them, with
/// speculative lookup off and on.
#[test]
fn per_key_histories_are_linearizable_during_splits() {
    let backend = chaos(2, 31);
    let t = &*backend.transport;
    on_tree(t, 0, "none", "lin", |mut tree| async move {
        for k in 0..6u64 {
            tree.insert_u64(k * 1_000_000, 0).await.unwrap();
        }
    });
    let t0 = std::time::Instant::now();
    let mut last = [0u64; 6];
    for (round, smart) in ["none", "spec-lookup,conflict-avoid"].into_iter().enumerate() {
        let history: Arc<Mutex<Vec<(u64, Event)>>> = Arc::default();
        run_tree(t, 2, 4, smart, "lin", |w, mut tree| {
            let me = (w.thread() * 4 + w.coroutine() + 1) as u64;
            let history = history.clone();
            async move {
                if w.coroutine() == 3 {
                    // Fresh keys around the six: their leaves split.
                    for i in 0..400u64 {
                        let k = (i % 6) * 1_000_000 + 1 + (round as u64 * 8 + me) * 1000 + i;
                        tree.insert_u64(k, 1).await?;
                    }
                    return Ok(());
                }
                let mut rng = SmallRng::seed_from_u64(me + 50 * round as u64);
                let mut mine = Vec::new();
                for seq in 0..200u64 {
                    let k = rng.random_range(0..6u64);
                    let start = t0.elapsed().as_nanos();
                    let ev = if rng.random_bool(0.5) {
                        let version = (round as u64 + 1) << 48 | me << 32 | (seq + 1);
                        assert!(tree.update_u64(k * 1_000_000, version).await?);
                        Event { start, end: t0.elapsed().as_nanos(), write: true, value: version }
                    } else {
                        let v = tree.get_u64(k * 1_000_000).await?.expect("present all along");
                        Event { start, end: t0.elapsed().as_nanos(), write: false, value: v }
                    };
                    mine.push((k, ev));
                }
                history.lock().unwrap().extend(mine);
                Ok(())
            }
        });
        let h = history.lock().unwrap();
        assert_eq!(h.len(), 6 * 200);
        for k in 0..6u64 {
            let ops: Vec<Event> = h.iter().filter(|(key, _)| *key == k).map(|(_, e)| *e).collect();
            if let Err(e) = linearizable(&ops, last[k as usize]) {
                panic!("{smart}: key {k}: {e}");
            }
        }
        for (k, l) in last.iter_mut().enumerate() {
            *l = on_tree(t, 9, "none", "lin", move |mut tree| async move {
                tree.get_u64(k as u64 * 1_000_000).await.unwrap().unwrap()
            });
        }
    }
    let (shape, _) = checked_keys(t, "lin");
    assert!(shape.pages_per_level[0] >= 20, "the leaves split: {shape:?}");
}

/// Where an RNIC writes a failing CAS's word back, not atomically with a
/// WRITE (Soft-RoCE in Linux 6.1; `ChaosConfig::write_back_atomics`), an
/// unlock by WRITE of 0 that lands during a waiter's CAS is undone and the
/// lock stays held until its lease runs out. Unlocks are CASes: no lock is
/// ever taken over from a live holder.
#[test]
fn no_release_is_lost_where_failing_cases_write_back() {
    let b = smart_testkit::backends::chaos_write_back(2, 64 << 20, 61);
    let t = &*b.transport;
    let per = 150u64;
    let (_, stats) = run_tree(t, 3, 8, "none", "wb", |w, mut tree| {
        let me = (w.thread() * 8 + w.coroutine()) as u64;
        async move {
            for i in 0..per {
                let k = i * 24 + me;
                assert!(tree.insert_u64(k, value(k, 0)).await?, "key {k} was new");
            }
            Ok(())
        }
    });
    let (_, keys) = checked_keys(t, "wb");
    assert_eq!(keys, (0..24 * per).collect::<Vec<_>>(), "every key once");
    assert!(stats.lock_retries > 0, "writers met on locks: {stats:?}");
    assert_eq!(stats.lock_steals, 0, "a live holder's lock was taken over after its lease: {stats:?}");
}
