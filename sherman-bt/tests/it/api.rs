//! The operations, one client at a time.

use sherman_bt::{ShermanBt, ShermanError};
use smart_core::{EmbeddedTransport, KvIndex};
use smart_testkit::backends;

use crate::{checked_keys, on_tree, value};

#[test]
fn a_tree_grows_from_one_leaf_and_finds_every_key_on_every_backend() {
    for b in backends::all_sized(2, 64 << 20) {
        let t = &*b.transport;
        let n = if b.name == "tcp" { 3_000u64 } else { 20_000 };
        on_tree(t, 0, "none", "grow", move |mut tree| async move {
            // Ascending, then a scattered half: splits at the right edge and
            // in the middle.
            for k in (0..n).step_by(2) {
                assert!(tree.insert_u64(k, value(k, 0)).await.unwrap());
            }
            for i in 0..n / 2 {
                let k = (i * 7919 % (n / 2)) * 2 + 1;
                assert!(tree.insert_u64(k, value(k, 0)).await.unwrap());
            }
            for k in 0..n {
                assert_eq!(tree.get_u64(k).await.unwrap(), Some(value(k, 0)), "key {k}");
            }
            assert_eq!(tree.get_u64(n).await.unwrap(), None);
            assert!(!tree.insert_u64(5, 1).await.unwrap(), "a present key is not inserted again");
            assert_eq!(tree.get_u64(5).await.unwrap(), Some(value(5, 0)));
        });
        let (shape, keys) = checked_keys(t, "grow");
        assert_eq!(keys, (0..n).collect::<Vec<_>>(), "{}", b.name);
        assert!(shape.depth >= 3, "{}: {shape:?}", b.name);
        assert_eq!(shape.unlinked, 0, "{}: {shape:?}", b.name);
        assert_eq!(shape.pages_per_level.len() as u32, shape.depth);
    }
}

#[test]
fn update_upsert_delete_and_reinsert() {
    let t = EmbeddedTransport::new(3, 32 << 20).unwrap();
    on_tree(&t, 0, "none", "ops", |mut tree| async move {
        for k in 0..500u64 {
            tree.insert_u64(k, value(k, 0)).await.unwrap();
        }
        assert!(tree.update_u64(7, value(7, 1)).await.unwrap());
        assert!(!tree.update_u64(900, 1).await.unwrap(), "an absent key is not updated");
        assert_eq!(tree.get_u64(900).await.unwrap(), None);
        tree.upsert_u64(900, value(900, 2)).await.unwrap();
        tree.upsert_u64(7, value(7, 3)).await.unwrap();
        assert_eq!(tree.get_u64(900).await.unwrap(), Some(value(900, 2)));
        assert_eq!(tree.get_u64(7).await.unwrap(), Some(value(7, 3)));
        for k in (0..500u64).filter(|k| k % 3 == 0) {
            assert!(tree.delete_u64(k).await.unwrap());
            assert!(!tree.delete_u64(k).await.unwrap(), "deleted twice");
            assert_eq!(tree.get_u64(k).await.unwrap(), None);
        }
        assert!(tree.insert_u64(3, value(3, 9)).await.unwrap(), "a deleted key can come back");
        assert_eq!(tree.get_u64(3).await.unwrap(), Some(value(3, 9)));
        // Value 0 is a value like any other.
        tree.upsert_u64(4, 0).await.unwrap();
        assert_eq!(tree.get_u64(4).await.unwrap(), Some(0));
        let mut out = Vec::new();
        tree.scan_u64(0, 10, &mut out).await.unwrap();
        let want: Vec<u64> = [1, 2, 3, 4, 5, 7, 8, 10, 11, 13].into();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), want);
        tree.scan_u64(495, 100, &mut out).await.unwrap();
        assert_eq!(out.iter().map(|e| e.0).collect::<Vec<_>>(), [496, 497, 499, 900]);
        tree.scan_u64(901, 5, &mut out).await.unwrap();
        assert!(out.is_empty());
        tree.scan_u64(0, 0, &mut out).await.unwrap();
        assert!(out.is_empty());
    });
    let (shape, keys) = checked_keys(&t, "ops");
    assert_eq!(keys.len(), 500 - 167 + 1 + 1, "{shape:?}");
}

#[test]
fn keys_and_values_beyond_the_trees_sizes_are_refused_clearly() {
    let t = EmbeddedTransport::new(1, 8 << 20).unwrap();
    on_tree(&t, 0, "none", "sizes", |mut tree| async move {
        // A tree made for the paper's sizes: up to 8-byte keys and values.
        let e = KvIndex::insert(&mut tree, &[0; 9], &[0; 8]).await.unwrap_err();
        assert!(matches!(e, ShermanError::Size { key: 9, value: 8, key_max: 8, value_max: 8 }), "{e}");
        let e = KvIndex::insert(&mut tree, &[0; 8], &[0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("keys of up to 8 bytes and values of up to 8"), "{e}");
        let mut out = Vec::new();
        assert!(KvIndex::get(&mut tree, &[1; 9], &mut out).await.is_err());
        assert!(KvIndex::insert(&mut tree, &[1; 8], &[2; 8]).await.unwrap());
        assert!(KvIndex::get(&mut tree, &[1; 8], &mut out).await.unwrap());
        assert_eq!(out, [2; 8]);
        // Shorter keys and values are byte strings like any other, in byte
        // order: "ab" sorts between "a" and "b" (a prefix before its
        // extensions), and bytes 0x01 before "a" (0x61).
        for k in [&b"b"[..], b"a", b"ab", b""] {
            assert!(KvIndex::insert(&mut tree, k, k).await.unwrap());
        }
        let mut pairs = smart_core::index::Pairs::default();
        assert_eq!(KvIndex::scan(&mut tree, b"", 10, &mut pairs).await.unwrap(), 5);
        let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [&b""[..], &[1; 8], b"a", b"ab", b"b"]);
        assert!(KvIndex::get(&mut tree, b"ab", &mut out).await.unwrap());
        assert_eq!(out, b"ab");
    });
}

#[test]
fn a_second_client_opens_the_same_tree_and_a_hash_table_name_is_refused() {
    let t = EmbeddedTransport::new(2, 16 << 20).unwrap();
    on_tree(&t, 0, "none", "shared", |mut tree| async move {
        for k in 0..200u64 {
            tree.insert_u64(k, k).await.unwrap();
        }
    });
    let existed = on_tree(&t, 1, "none", "shared", |mut tree| async move {
        assert_eq!(tree.get_u64(199).await.unwrap(), Some(199));
        true
    });
    assert!(existed);
    let mut rt = smart_core::Runtime::new(&t, 2, Default::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        assert!(ShermanBt::exists(&ctx, "shared").await.unwrap());
        assert!(!ShermanBt::exists(&ctx, "absent").await.unwrap());
        // Something else under the tree's root name.
        let junk = ctx.alloc(0, 256, 64).await.unwrap();
        ctx.set_root(0, "sherman:junk", junk).await.unwrap();
        let e = ShermanBt::open_or_create(&ctx, "junk").await.unwrap_err();
        assert!(e.to_string().contains("is not a B+tree"), "{e}");
    });
}

#[test]
fn a_lock_left_by_a_dead_client_is_taken_over_after_the_lease() {
    use sherman_bt::layout::{self, Meta};
    use sherman_bt::LOCK_LEASE;
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    on_tree(&t, 0, "none", "dead", |mut tree| async move {
        tree.insert_u64(1, 1).await.unwrap();
    });
    // A client that died holding the lock of the only leaf: its tag stays
    // in the lock word.
    let mut rt = smart_core::Runtime::new(&t, 1, Default::default()).unwrap();
    let ctx = rt.ctx();
    let word = rt.block_on(async move {
        let meta = ctx.root(0, "sherman:dead").await.unwrap().unwrap();
        let mut b = [0u8; layout::META];
        ctx.read(meta, &mut b).await.unwrap();
        let m = Meta::decode(&b).unwrap();
        let (_, leaf) = layout::unpack_root(m.root);
        let word = m.locks[usize::from(leaf.blade())].add(layout::lock_slot(leaf) * 8);
        assert_eq!(ctx.cas(word, 0, 0xdead_0000_0000_0001).await.unwrap(), 0);
        word
    });
    let t0 = std::time::Instant::now();
    let steals = on_tree(&t, 2, "none", "dead", |mut tree| async move {
        // Reads do not lock: they go on at once.
        assert_eq!(tree.get_u64(1).await.unwrap(), Some(1));
        assert!(tree.insert_u64(2, 2).await.unwrap());
        tree.counters().lock_steals
    });
    let waited = t0.elapsed();
    assert_eq!(steals, 1);
    assert!(waited >= LOCK_LEASE && waited < LOCK_LEASE * 3, "took over after {waited:?}");
    let ctx = rt.ctx();
    let after = rt.block_on(async move { ctx.read_u64(word).await.unwrap() });
    assert_eq!(after, 0, "the new holder released the lock");
    on_tree(&t, 3, "none", "dead", |mut tree| async move {
        assert_eq!(tree.get_u64(2).await.unwrap(), Some(2));
    });
}

/// `drop_tree` waits until every client has seen two epochs after the drop
/// (an idle one counts once its reclamation lease lapses), retires every
/// page, value block and lock table, and a client still holding the tree
/// is told at its next operation; a tree loaded again reuses the memory.
#[test]
fn a_dropped_tree_gives_its_memory_back_and_its_clients_are_told() {
    use sherman_bt::Format;
    use smart_core::{GlobalAddr, Runtime, RuntimeConfig};
    let t = EmbeddedTransport::new(1, 128 << 20).unwrap();
    let f = Format::new(24, 1000).unwrap();
    let load = |rt: &mut Runtime| {
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut tree, _) = ShermanBt::open_or_create_with(&ctx, "dropped", f).await.unwrap();
            for k in 0..3000u64 {
                tree.insert(format!("user{k:020}").as_bytes(), &[k as u8; 1000]).await.unwrap();
            }
            let heap = ctx.read_u64(GlobalAddr::new(0, smart_core::layout::OFF_HEAP)).await.unwrap();
            (tree, heap)
        })
    };
    let mut a = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let (mut held, first) = load(&mut a);
    let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
    let ctx = b.ctx();
    let d = b.block_on(async move { ShermanBt::drop_tree(&ctx, "dropped").await.unwrap().unwrap() });
    assert_eq!(d.blocks, 3000, "{d:?}");
    assert!(d.pages >= 100 && d.bytes > 3000 * 1000, "{d:?}");
    let ctx = b.ctx();
    assert!(!b.block_on(async move { ShermanBt::exists(&ctx, "dropped").await.unwrap() }));
    // The client that still held it learns at its next operation.
    let e = a.block_on(async move { held.get(b"user00000000000000000001", &mut Vec::new()).await.unwrap_err() });
    assert!(matches!(e, ShermanError::Dropped), "{e}");
    drop(a);
    // Loaded again by another client: the retired memory comes back.
    let mut c = Runtime::new(&t, 2, RuntimeConfig::default()).unwrap();
    let (tree, again) = load(&mut c);
    let ctx = c.ctx();
    c.block_on(async move { tree.close().await.unwrap() });
    let _ = ctx;
    // Without reuse the second load takes as much again (3.3 MB of blocks
    // alone); with it, at most the new client's fresh spans (it starts on
    // them while the dropped memory waits out its two epochs).
    let bound = first + 2 * smart_core::reclaim::SPAN + (1 << 18);
    assert!(again <= bound, "heap {first} after the first load, {again} after the second (bound {bound})");
}
