//! Byte-string keys and long values: every operation at several sizes
//! against a model, value blocks reused, and torn reads at 256-byte keys
//! and 1 KiB values under chaos.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sherman_bt::{Format, ShermanBt};
use smart_core::index::Pairs;
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig, Transport};
use smart_testkit::backends;

use crate::{heap_used, run_tree};

/// Sizes covered: the paper's, YCSB's key with one field and with a whole
/// record, and the largest keys with values out of line.
const SIZES: [(usize, usize); 5] = [(8, 8), (24, 100), (24, 1000), (64, 1000), (256, 4096)];

/// The key of number `n` in a tree of keys up to `max` bytes: its
/// distinct head (8 bytes, or 16 hex digits) then `x`s to a length drawn
/// from `n`, so keys of many lengths, and keys that are prefixes of
/// others' heads, meet.
fn key(n: u64, max: usize) -> Vec<u8> {
    let h = smart_core::hash::mix64(n);
    if max < 16 {
        return h.to_be_bytes()[..8.min(max)].to_vec();
    }
    let mut k = format!("{h:016x}").into_bytes();
    let len = 16 + (h >> 7) as usize % (max - 15);
    k.resize(len, b'x');
    k
}

/// A value of `len` bytes that names key `n` and version `v` in its first
/// 16 bytes (when it has them) and repeats a pattern of both after.
fn value(n: u64, v: u64, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = n.to_le_bytes().iter().chain(&v.to_le_bytes()).copied().cycle().take(len).collect();
    b.truncate(len);
    b
}

/// Whether `b` is a whole value of key `n` (any version): returns it.
fn version_of(b: &[u8], n: u64) -> Option<u64> {
    if b.len() < 16 || b[..8] != n.to_le_bytes() {
        return None;
    }
    let v = u64::from_le_bytes(b[8..16].try_into().ok()?);
    (value(n, v, b.len()) == b).then_some(v)
}

fn open(t: &dyn Transport, thread: usize, smart: &str, name: &str, f: Format) -> (Runtime, ShermanBt) {
    let cfg = RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() };
    let mut rt = Runtime::new(t, thread, cfg).unwrap();
    let ctx = rt.ctx();
    let name = name.to_string();
    let tree = rt.block_on(async move { ShermanBt::open_or_create_with(&ctx, &name, f).await.unwrap().0 });
    (rt, tree)
}

#[test]
fn every_operation_agrees_with_a_model_at_every_size() {
    for (round, (k, v)) in SIZES.into_iter().enumerate() {
        let f = Format::new(k, v).unwrap();
        let t = EmbeddedTransport::new(2, 256 << 20).unwrap();
        let smart = if round % 2 == 0 { "spec-lookup" } else { "none" };
        let (mut rt, mut tree) = open(&t, 0, smart, "model", f);
        let (shape, stats) = rt.block_on(async move {
            let mut rng = SmallRng::seed_from_u64(round as u64);
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let (mut out, mut pairs) = (Vec::new(), Pairs::default());
            let keys = 1_500u64;
            // Values of every length class: empty-ish, inline, and (where
            // the tree takes them) out of line up to the longest.
            let len = |rng: &mut SmallRng| match rng.random_range(0..4) {
                0 => rng.random_range(0..=v.min(8)),
                1 => rng.random_range(0..=v.min(128)),
                _ => rng.random_range(0..=v),
            };
            for i in 0..12_000u64 {
                let n = rng.random_range(0..keys);
                let kb = key(n, k);
                let l = len(&mut rng);
                let what = rng.random_range(0..12);
                let ctx = format!("{k}/{v} step {i} (key {n}, op {what})");
                match what {
                    0..=3 => {
                        let new = !model.contains_key(&kb);
                        assert_eq!(tree.insert(&kb, &value(n, i, l)).await.unwrap(), new, "{ctx}");
                        model.entry(kb).or_insert(value(n, i, l));
                    }
                    4 => {
                        let had = model.contains_key(&kb);
                        assert_eq!(tree.update(&kb, &value(n, i, l)).await.unwrap(), had, "{ctx}");
                        if had {
                            model.insert(kb, value(n, i, l));
                        }
                    }
                    5 => {
                        tree.upsert(&kb, &value(n, i, l)).await.unwrap();
                        model.insert(kb, value(n, i, l));
                    }
                    6 | 7 => {
                        let had = model.remove(&kb).is_some();
                        assert_eq!(tree.delete(&kb).await.unwrap(), had, "{ctx}");
                    }
                    8..=10 => {
                        let found = tree.get(&kb, &mut out).await.unwrap();
                        assert_eq!(found.then_some(&out), model.get(&kb), "{ctx}");
                    }
                    _ => {
                        // From a key, or from a prefix of one (between keys).
                        let start = &kb[..rng.random_range(1..=kb.len())];
                        let count = rng.random_range(0..60);
                        let got = tree.scan(start, count, &mut pairs).await.unwrap();
                        let want: Vec<_> =
                            model.range::<[u8], _>((Bound::Included(start), Bound::Unbounded)).take(count).collect();
                        assert_eq!(got, want.len(), "{ctx}");
                        for ((gk, gv), (wk, wv)) in pairs.iter().zip(&want) {
                            assert_eq!((gk, gv), (&wk[..], &wv[..]), "{ctx}");
                        }
                    }
                }
            }
            for (kb, vb) in &model {
                assert!(tree.get(kb, &mut out).await.unwrap());
                assert_eq!(&out, vb);
            }
            let (shape, mut keys) = tree.walk().await.unwrap();
            keys.sort();
            assert_eq!(keys, model.keys().cloned().collect::<Vec<_>>(), "{k}/{v}: the walk's keys are the model's");
            // What the tree holds: its pages and its values' blocks.
            let pages: u64 = shape.pages_per_level.iter().sum();
            let blocks: u64 = model
                .iter()
                .filter(|(_, vb)| f.out_of_line(vb.len()))
                .map(|(kb, vb)| smart_core::kvblock::block_len(kb.len(), vb.len()) as u64)
                .sum();
            assert_eq!(shape.live_bytes, pages * f.page as u64 + blocks, "{k}/{v}");
            tree.close().await.unwrap();
            (shape, tree.counters())
        });
        assert!(shape.depth >= 2, "{k}/{v}: {shape:?}");
        if f.value_max > f.inline {
            assert!(stats.blocks_written > 1000 && stats.blocks_retired > 500, "{k}/{v}: {stats:?}");
        } else {
            assert_eq!(stats.blocks_written, 0, "{k}/{v}: every value inline");
        }
        if smart == "spec-lookup" {
            assert!(stats.spec_hits > 0, "{k}/{v}: {stats:?}");
        }
    }
}

/// Values out of line are written anew at every update: the blocks they
/// replace come back through the reclaimer, so rewriting the same keys
/// many times does not grow the heap with the number of rewrites.
#[test]
fn replaced_value_blocks_are_reused() {
    let f = Format::new(24, 1000).unwrap();
    let t = EmbeddedTransport::new(1, 256 << 20).unwrap();
    let (mut rt, mut tree) = open(&t, 0, "none", "reuse", f);
    let ctx = rt.ctx();
    let (first, last, stats) = rt.block_on(async move {
        let keys = 200u64;
        let mut first = 0;
        for round in 0..40u64 {
            for n in 0..keys {
                tree.upsert(&key(n, 24), &value(n, round, 1000)).await.unwrap();
            }
            // Let the epoch move on (a refresh every 2 ms).
            ctx.sleep_ns(5_000_000).await;
            if round == 1 {
                first = heap_used(&ctx).await;
            }
        }
        let mut out = Vec::new();
        for n in 0..keys {
            assert!(tree.get(&key(n, 24), &mut out).await.unwrap());
            assert_eq!(version_of(&out, n), Some(39));
        }
        (first, heap_used(&ctx).await, tree.counters())
    });
    // 40 rounds × 200 blocks of 1 KiB written: 8 MiB without reuse.
    assert_eq!(stats.blocks_written, 8_000);
    assert_eq!(stats.blocks_retired, 7_800, "{stats:?}");
    assert!(last < first + (2 << 20), "the heap grew from {first} to {last} bytes over 38 rounds of rewrites");
}

/// Torn reads at the largest keys: 256-byte keys (entries over five lines)
/// and 1 KiB values (out of line) while writers update, delete and
/// re-insert, and insert new keys (leaves split and merge), under chaos
/// (READs and WRITEs torn word by word). Every value read is whole and its
/// key's; every coroutine's reads of a key never go back in version (one
/// writer per key: each key a register, read in real-time order); keys
/// never deleted are found by every lookup and every scan that passes
/// them; scans come in byte order.
#[test]
fn torn_reads_at_256_byte_keys_and_1_kib_values_never_return_a_wrong_value() {
    let f = Format::new(256, 1024).unwrap();
    let b = backends::chaos_sized(2, 128 << 20, 256);
    let t = &*b.transport;
    let keys = 300u64;
    let (mut rt, mut tree) = open(t, 0, "none", "torn", f);
    rt.block_on(async move {
        for n in 0..keys {
            assert!(tree.insert(&key(n, 256), &value(n, 0, 16 + (n as usize * 37) % 1008)).await.unwrap());
        }
        tree.close().await.unwrap();
    });
    drop(rt);
    let checked = Arc::new(AtomicU64::new(0));
    // Keys with (n / 8) odd are deleted and put back; the others stay.
    let churned = |n: u64| (n / 8) % 2 == 1;
    let mut stable: Vec<Vec<u8>> = (0..keys).filter(|&n| !churned(n)).map(|n| key(n, 256)).collect();
    stable.sort();
    let stable = Arc::new(stable);
    // The tree exists: every handle opens it with its sizes.
    let (_, stats) = run_tree(t, 2, 4, "spec-lookup", "torn", |w, mut tree| {
        let me = (w.thread() * 4 + w.coroutine()) as u64;
        let (checked, stable) = (checked.clone(), stable.clone());
        async move {
            let mut rng = SmallRng::seed_from_u64(me);
            let (mut out, mut pairs) = (Vec::new(), Pairs::default());
            let mut seen = vec![0u64; keys as usize];
            let mut version = 0;
            for i in 0..400u64 {
                let n = rng.random_range(0..keys);
                match rng.random_range(0..10) {
                    // Coroutine `me` writes the keys ≡ me mod 8 only.
                    0..=2 => {
                        let n = n - n % 8 + me % 8;
                        if n < keys {
                            version += 1;
                            let len = rng.random_range(16..=1024);
                            let v = value(n, version << 8 | me, len);
                            if churned(n) && rng.random_bool(0.5) {
                                // Out and back in (absent meanwhile).
                                assert!(tree.delete(&key(n, 256)).await?, "key {n} was not there to delete");
                                assert!(tree.insert(&key(n, 256), &v).await?, "key {n} was back before its insert");
                            } else {
                                assert!(tree.upsert(&key(n, 256), &v).await.is_ok());
                            }
                        }
                    }
                    3 => {
                        // New keys split leaves under the readers.
                        let n = keys + me * 1000 + i;
                        tree.insert(&key(n, 256), &value(n, 0, 300)).await?;
                    }
                    4 => {
                        let start = key(n, 256);
                        tree.scan(&start, 20, &mut pairs).await?;
                        let ks: Vec<&[u8]> = pairs.iter().map(|(k, _)| k).collect();
                        assert!(ks.windows(2).all(|w| w[0] < w[1]), "a scan out of order");
                        if let Some(last) = ks.last() {
                            // Every key never deleted in [start, last] came.
                            let from = stable.partition_point(|k| k.as_slice() < start.as_slice());
                            let to = stable.partition_point(|k| k.as_slice() <= *last);
                            for k in &stable[from..to] {
                                assert!(ks.contains(&k.as_slice()), "a scan passed a key present throughout");
                            }
                        }
                    }
                    _ => {
                        if !tree.get(&key(n, 256), &mut out).await? {
                            assert!(churned(n), "key {n} was lost");
                            continue;
                        }
                        let v = version_of(&out, n).unwrap_or_else(|| panic!("key {n}: a torn or foreign value"));
                        let (ver, writer) = (v >> 8, v & 0xff);
                        if v != 0 {
                            assert_eq!(writer, n % 8, "key {n} written by coroutine {writer}");
                        }
                        assert!(ver >= seen[n as usize], "key {n} went back from {} to {ver}", seen[n as usize]);
                        seen[n as usize] = ver;
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            tree.close().await?;
            Ok(())
        }
    });
    assert!(checked.load(Ordering::Relaxed) > 1000);
    assert!(stats.torn > 0, "chaos tore no page read: the test checks nothing: {stats:?}");
    assert!(stats.leaf_splits > 0 && stats.blocks_retired > 0, "{stats:?}");
}
