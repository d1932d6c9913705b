//! Pages merged and freed after deletes: alone, under concurrent readers
//! and writers on chaos, and after a merger that stops half-way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sherman_bt::layout::{self, PageBuf};
use sherman_bt::{Format, ShermanBt};
use smart_core::{EmbeddedTransport, GlobalAddr, Runtime, RuntimeConfig};
use smart_testkit::backends;

use crate::{checked_keys, heap_used, holds_key, on_tree, read_page, run_tree, tree_meta, value};

#[test]
fn deletes_merge_leaves_and_inner_pages_and_free_them() {
    let t = EmbeddedTransport::new(2, 128 << 20).unwrap();
    let n = 30_000u64;
    let (before, stats) = on_tree(&t, 0, "spec-lookup", "merge", move |mut tree| async move {
        for k in 0..n {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
        let (before, _) = tree.walk().await.unwrap();
        // Keep every 40th key: most leaves, and then their parents, empty.
        for k in (0..n).filter(|k| k % 40 != 0) {
            assert!(tree.delete_u64(k).await.unwrap(), "key {k}");
        }
        for k in 0..n {
            let want = (k % 40 == 0).then(|| value(k, 0));
            assert_eq!(tree.get_u64(k).await.unwrap(), want, "key {k}");
        }
        let mut out = Vec::new();
        tree.scan_u64(0, n as usize, &mut out).await.unwrap();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), (0..n).step_by(40).collect::<Vec<_>>());
        tree.close().await.unwrap();
        (before, tree.counters())
    });
    let (after, keys) = checked_keys(&t, "merge");
    assert_eq!(keys, (0..n).step_by(40).collect::<Vec<_>>());
    assert_eq!((after.dead_named, after.merging, after.unlinked), (0, 0, 0), "{after:?}");
    assert!(stats.merges > 500 && stats.pages_freed == stats.merges, "{stats:?}");
    assert!(after.pages_per_level[0] * 5 < before.pages_per_level[0], "leaves {before:?} → {after:?}");
    assert!(after.pages_per_level[1] * 3 < before.pages_per_level[1], "inner pages merged too: {after:?}");
    assert!(after.leaf_fill > 0.25, "{after:?}");
}

/// A window of `W` keys slides over 10 × `W` keys (insert the newest,
/// delete the oldest): at the paper's sizes, and with 24-byte keys and
/// 1000-byte values out of line. The heap stays within twice what the
/// first window took (plus two reclaimer spans), where without merging and
/// freeing it grows with every key ever inserted (at 8/8, 13 MiB of leaves
/// for 200 000 keys against a bound of about 8).
#[test]
fn a_sliding_window_of_deletes_runs_in_bounded_memory() {
    const W: u64 = 20_000;
    for (k, v) in [(8, 8), (24, 1000)] {
        let t = EmbeddedTransport::new(1, 512 << 20).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        let mut tree = rt.block_on(async move {
            ShermanBt::open_or_create_with(&ctx, "window", Format::new(k, v).unwrap()).await.unwrap().0
        });
        let key = move |n: u64| {
            let mut b = n.to_be_bytes().to_vec();
            b.resize(k, b'k');
            b
        };
        let val = move |n: u64| {
            let mut b = n.to_le_bytes().to_vec();
            b.resize(v, 7);
            b
        };
        let (mut first, mut peak) = (0, 0);
        for round in 0..10u64 {
            let ctx = rt.ctx();
            let (t2, got) = rt.block_on(async move {
                for n in round * W..(round + 1) * W {
                    assert!(tree.insert(&key(n), &val(n)).await.unwrap());
                    if n >= W {
                        assert!(tree.delete(&key(n - W)).await.unwrap());
                    }
                }
                // Let the epoch move on (a refresh every 2 ms).
                ctx.sleep_ns(10_000_000).await;
                let mut out = Vec::new();
                let present = tree.get(&key((round + 1) * W - 1), &mut out).await.unwrap();
                (tree, present && out == val((round + 1) * W - 1))
            });
            tree = t2;
            assert!(got);
            let ctx = rt.ctx();
            let used = rt.block_on(async move { heap_used(&ctx).await });
            if round == 0 {
                first = used;
            }
            peak = peak.max(used);
        }
        let stats = tree.counters();
        let spans = 2 * smart_core::reclaim::SPAN;
        assert!(peak <= 2 * first + spans, "{k}/{v}: heap {first} after one window, {peak} at its peak: {stats:?}");
        assert!(stats.pages_freed > 0, "{k}/{v}: {stats:?}");
        eprintln!("{k}/{v}: heap {first} bytes after one window, {peak} at the peak over 10 windows; {stats:?}");
    }
}

/// Readers and scans find every key that is present throughout, on chaos,
/// while writers delete and re-insert the keys between them (merging and
/// splitting leaves all along).
#[test]
fn merges_under_concurrent_readers_never_hide_a_present_key() {
    let b = backends::chaos_sized(2, 128 << 20, 4242);
    let t = &*b.transport;
    let n = 6_000u64;
    on_tree(t, 0, "none", "churn", move |mut tree| async move {
        for k in 0..n {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
        tree.close().await.unwrap();
    });
    let checked = Arc::new(AtomicU64::new(0));
    let (_, stats) = run_tree(t, 2, 4, "spec-lookup", "churn", |w, mut tree| {
        let me = (w.thread() * 4 + w.coroutine()) as u64;
        let checked = checked.clone();
        async move {
            let mut rng = SmallRng::seed_from_u64(me);
            let mut out = Vec::new();
            for _ in 0..1_500 {
                // Keys ≡ 0 mod 10 stay; the nine after one are deleted if
                // present, else put back (by whichever coroutine comes).
                let base = rng.random_range(0..n / 10) * 10;
                match rng.random_range(0..4) {
                    0 => {
                        let span = rng.random_range(1..=30) * 10;
                        for k in (base..(base + span).min(n)).filter(|k| k % 10 != 0) {
                            if !tree.delete_u64(k).await? {
                                tree.insert_u64(k, value(k, me)).await?;
                            }
                        }
                    }
                    1 => {
                        tree.scan_u64(base, 30, &mut out).await?;
                        let stable: Vec<u64> = out.iter().map(|e| e.0).filter(|k| k % 10 == 0).collect();
                        let want: Vec<u64> = (base..n).step_by(10).take(stable.len()).collect();
                        assert_eq!(stable, want, "a scan from {base} missed a key present throughout");
                        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
                    }
                    _ => {
                        let v = tree.get_u64(base).await?;
                        assert!(v.is_some_and(|v| holds_key(v, base)), "key {base} present throughout: {v:?}");
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            tree.close().await?;
            Ok(())
        }
    });
    assert!(checked.load(Ordering::Relaxed) > 2_000);
    assert!(stats.merges > 0 && stats.leaf_splits > 0, "{stats:?}");
    let (shape, keys) = checked_keys(t, "churn");
    assert!(keys.iter().filter(|k| *k % 10 == 0).count() == (n / 10) as usize);
    assert_eq!((shape.merging, shape.dead_named), (0, 0), "{shape:?}");
}

/// A merger that stopped after any of its steps (it died, or stalled and
/// lost its locks) leaves pages marked; readers meanwhile read every key,
/// and the next writer to lock a marked page finishes the merge (or undoes
/// it if the left page took inserts since), so the tree ends whole.
#[test]
fn a_merge_left_half_done_is_finished_by_the_next_writer() {
    for stop_after in 1..=3 {
        let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut tree, _) = ShermanBt::open_or_create(&ctx, "half").await.unwrap();
            // Two leaves (15 + 16 keys), thinned to 8 each: not underfull,
            // so no merge runs, and together they fit one leaf.
            for k in 0..31u64 {
                tree.insert_u64(k, value(k, 0)).await.unwrap();
            }
            for k in (0..8u64).chain(15..23) {
                assert!(tree.delete_u64(k).await.unwrap());
            }
            assert_eq!(tree.counters().merges, 0);
            let present: Vec<u64> = (8..15).chain(23..31).collect();
            let (m, f) = tree_meta(&ctx, "half").await;
            let page = |at: GlobalAddr| read_page(&ctx, f, at);
            let (level, root) = layout::unpack_root(m.root);
            assert_eq!(level, 1);
            let rootp = page(root).await;
            let (l, r) = (rootp.view().leftmost(), rootp.view().child(0));
            let (lp, rp) = (page(l).await, page(r).await);
            assert_eq!(lp.view().sibling(), Some(r), "two leaves");
            // The merge's steps as its client would have written them.
            let mut r1 = rp.clone();
            r1.set_merge(layout::FLAG_MERGING, l);
            r1.seal_next();
            ctx.write(r, &r1.b).await.unwrap();
            if stop_after >= 2 {
                let mut l1 = lp.clone();
                let (lv, rv) = (lp.view(), rp.view());
                let mut buf = [0u8; layout::INLINE_MAX];
                for i in rv.live() {
                    let slot = l1.view().free_slot().unwrap();
                    let layout::Value::Inline(v) = rv.value(i, &mut buf) else { unreachable!() };
                    l1.set_leaf(slot, rv.key(i).as_slice(), &layout::Field::inline(v));
                }
                assert!(lv.live().count() + rv.live().count() <= f.leaf.count);
                l1.set_highest(rv.highest().as_ref().map(|h| h.as_slice()));
                l1.set_sibling(rv.sibling());
                l1.set_merge(layout::FLAG_ABSORBING, r);
                l1.seal_next();
                ctx.write(l, &l1.b).await.unwrap();
            }
            if stop_after >= 3 {
                ctx.write(r, &dead_copy(f, r1.view(), l).b).await.unwrap();
            }
            // Readers see every key in either state.
            for k in 0..31u64 {
                let want = present.contains(&k).then(|| value(k, 0));
                assert_eq!(tree.get_u64(k).await.unwrap(), want, "stop after {stop_after}: key {k}");
            }
            let mut out = Vec::new();
            tree.scan_u64(0, 500, &mut out).await.unwrap();
            assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), present, "stop after {stop_after}");
            // The structural walk passes in either state, and counts the
            // pages in the merge: R merging; then L absorbing and R (off
            // the chain) merging; then L absorbing and R dead.
            let (shape, keys) = tree.walk().await.unwrap();
            assert_eq!(keys.len(), present.len(), "stop after {stop_after}");
            let want = [(1, 0), (2, 0), (1, 1)][stop_after - 1];
            assert_eq!((shape.merging, shape.dead_named), want, "stop after {stop_after}: {shape:?}");
            // A writer into either page finishes the merge first.
            tree.update_u64(25, value(25, 1)).await.unwrap();
            tree.update_u64(9, value(9, 1)).await.unwrap();
            assert!(tree.counters().merges_helped >= 1, "stop after {stop_after}: {:?}", tree.counters());
            let (shape, keys) = tree.walk().await.unwrap();
            assert_eq!(keys.len(), present.len(), "stop after {stop_after}");
            assert_eq!((shape.merging, shape.dead_named), (0, 0), "stop after {stop_after}: {shape:?}");
            assert_eq!(shape.pages_per_level[0], 1, "stop after {stop_after}: merged into one leaf: {shape:?}");
            assert_eq!(tree.get_u64(25).await.unwrap(), Some(value(25, 1)));
        });
    }
}

/// A page merged away whose separator is still in its parent (its merger
/// died before removing it), and whose link no longer leads to its keys
/// (the page it names was merged away in turn and its memory reused, as
/// another page or as a value block): the first descent that meets it
/// removes the separator (`dead_repairs`), and every key reads back, is
/// updated and scanned.
#[test]
fn a_dead_page_still_named_whose_link_went_stale_is_removed_from_its_parent() {
    for reused_as_block in [false, true] {
        dead_page_with_a_stale_link(reused_as_block);
    }
}

/// Page `v` (a leaf) as its merger leaves it: dead (empty, its range and
/// sibling kept), linked to `link`, sealed as its next version.
fn dead_copy(f: Format, v: layout::PageRef<'_>, link: GlobalAddr) -> PageBuf {
    let hi = v.highest();
    let mut dead = PageBuf::new(f, 0, v.lowest().as_slice(), hi.as_ref().map(|h| h.as_slice()), v.sibling());
    dead.set_merge(layout::FLAG_DEAD, link);
    dead.seal_after(v.seq());
    dead
}

/// A page's worth of memory reused as a block: bytes that never validate
/// as a page.
async fn junk_block(ctx: &smart_core::Ctx, f: Format) -> GlobalAddr {
    let junk = ctx.alloc(0, f.page as u64, 64).await.unwrap();
    ctx.write(junk, &vec![0xa5; f.page]).await.unwrap();
    junk
}

/// The keys of leaf `v`, as numbers.
fn keys_of(v: layout::PageRef<'_>) -> Vec<u64> {
    v.live().map(|i| u64::from_be_bytes(v.key(i).as_slice().try_into().unwrap())).collect()
}

fn dead_page_with_a_stale_link(reused_as_block: bool) {
    let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let (mut tree, _) = ShermanBt::open_or_create(&ctx, "stale").await.unwrap();
        for k in 0..60u64 {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
        let (m, f) = tree_meta(&ctx, "stale").await;
        let page = |at: GlobalAddr| read_page(&ctx, f, at);
        let (level, root) = layout::unpack_root(m.root);
        assert_eq!(level, 1);
        let rootp = page(root).await;
        assert!(rootp.view().count() >= 2, "three leaves at least");
        let (a, b, c) = (rootp.view().leftmost(), rootp.view().child(0), rootp.view().child(1));
        let (ap, bp) = (page(a).await, page(b).await);
        let (av, bv) = (ap.view(), bp.view());
        assert!(av.live().count() + bv.live().count() <= f.leaf.count);
        // A took B's entries and range; B is dead, linked to C (as if its
        // link target had been freed and reused), still named by the root.
        let mut a2 = ap.clone();
        let mut buf = [0u8; layout::INLINE_MAX];
        for i in bv.live() {
            let slot = a2.view().free_slot().unwrap();
            let layout::Value::Inline(v) = bv.value(i, &mut buf) else { unreachable!() };
            a2.set_leaf(slot, bv.key(i).as_slice(), &layout::Field::inline(v));
        }
        a2.set_highest(bv.highest().as_ref().map(|h| h.as_slice()));
        a2.set_sibling(bv.sibling());
        a2.seal_next();
        ctx.write(a, &a2.b).await.unwrap();
        let link = if reused_as_block { junk_block(&ctx, f).await } else { c };
        ctx.write(b, &dead_copy(f, bv, link).b).await.unwrap();
        let (mut fresh, _) = ShermanBt::open_or_create(&ctx, "stale").await.unwrap();
        for k in 0..60u64 {
            assert_eq!(fresh.get_u64(k).await.unwrap(), Some(value(k, 0)), "key {k}");
        }
        assert_eq!(fresh.counters().dead_repairs, 1, "{:?}", fresh.counters());
        let (shape, keys) = fresh.walk().await.unwrap();
        assert_eq!((keys.len(), shape.dead_named), (60, 0), "{shape:?}");
        // Writers and scans through the repaired parent.
        let k = *keys_of(bv).iter().min().unwrap();
        assert!(fresh.update_u64(k, value(k, 1)).await.unwrap());
        let mut out = Vec::new();
        fresh.scan_u64(0, 60, &mut out).await.unwrap();
        assert_eq!(out.len(), 60);
        assert!(out.contains(&(k, value(k, 1))));
    });
}

/// The same dead page met by a writer and a scan first (through a leaf
/// address of the index cache, not a descent): the link that never
/// validates sends them back to the root, whose descent repairs the
/// parent; nothing is reported torn.
#[test]
fn writers_and_scans_that_meet_a_link_reused_as_a_block_start_again() {
    let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let (mut tree, _) = ShermanBt::open_or_create(&ctx, "junk").await.unwrap();
        for k in 0..60u64 {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
        let (m, f) = tree_meta(&ctx, "junk").await;
        let (_, root) = layout::unpack_root(m.root);
        let rootp = read_page(&ctx, f, root).await;
        let b = rootp.view().child(0);
        let bp = read_page(&ctx, f, b).await;
        let bv = bp.view();
        let keys = keys_of(bv);
        // B dead (its keys gone: as if merged and then deleted), linked to
        // memory reused as a block, still named by the root; the tree's
        // index cache still names the root, so the first operation on B's
        // keys reaches B without a descent.
        let dead = dead_copy(f, bv, junk_block(&ctx, f).await);
        // A (left of B) takes B's range: B's keys are gone from the tree.
        let a = rootp.view().leftmost();
        let mut ap = read_page(&ctx, f, a).await;
        ap.set_highest(bv.highest().as_ref().map(|h| h.as_slice()));
        ap.set_sibling(bv.sibling());
        ap.seal_next();
        ctx.write(a, &ap.b).await.unwrap();
        ctx.write(b, &dead.b).await.unwrap();
        let (k, kmax) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
        assert!(!tree.update_u64(k, 1).await.unwrap(), "B's keys are gone");
        assert!(tree.insert_u64(k, value(k, 2)).await.unwrap(), "and go into A");
        let mut out = Vec::new();
        tree.scan_u64(k, 60, &mut out).await.unwrap();
        assert_eq!(out[0], (k, value(k, 2)));
        let want: Vec<u64> = std::iter::once(k).chain(kmax + 1..60).collect();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), want);
        let (shape, live) = tree.walk().await.unwrap();
        assert_eq!((live.len(), shape.dead_named), (60 - keys.len() + 1, 0), "{shape:?}");
    });
}
