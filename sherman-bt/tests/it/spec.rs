//! Speculative lookup: one 64-byte READ when it hits; stale guesses (after
//! splits, updates, deletes and reuse of an entry) never return a wrong
//! value.

use sherman_bt::ShermanBt;
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};

/// Runs `f` on `rt` with `tree` and hands the tree back.
fn phase<T: 'static, Fut: std::future::Future<Output = (ShermanBt, T)> + 'static>(
    rt: &mut Runtime,
    tree: ShermanBt,
    f: impl FnOnce(ShermanBt) -> Fut,
) -> (ShermanBt, T) {
    rt.block_on(f(tree))
}

fn client(t: &EmbeddedTransport, thread: usize, smart: &str) -> (Runtime, ShermanBt) {
    let cfg = RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() };
    let mut rt = Runtime::new(t, thread, cfg).unwrap();
    let ctx = rt.ctx();
    let tree = rt.block_on(async move { ShermanBt::open_or_create(&ctx, "spec").await.unwrap().0 });
    (rt, tree)
}

#[test]
fn stale_guesses_after_splits_updates_deletes_and_reuse_never_return_a_wrong_value() {
    let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
    let (mut ra, a) = client(&t, 0, "spec-lookup");
    let (mut rb, b) = client(&t, 1, "none");
    // B loads 40 keys (one leaf); A looks each up twice: the second time
    // speculatively, reading 64 bytes.
    let (b, ()) = phase(&mut rb, b, |mut b| async move {
        for k in 0..40u64 {
            b.insert_u64(k * 10, k).await.unwrap();
        }
        (b, ())
    });
    let (a, ()) = phase(&mut ra, a, |mut a| async move {
        for k in 0..40u64 {
            assert_eq!(a.get_u64(k * 10).await.unwrap(), Some(k));
        }
        let before = a.counters();
        for k in 0..40u64 {
            assert_eq!(a.get_u64(k * 10).await.unwrap(), Some(k));
        }
        let s = a.counters();
        assert_eq!(s.spec_hits - before.spec_hits, 40, "{s:?}");
        assert_eq!(s.lookup_bytes - before.lookup_bytes, 40 * 64, "a hit reads one line");
        (a, ())
    });
    // B changes everything under A's guesses: updates, deletes, a deleted
    // key's entry reused by another key, and splits (keys move to new
    // leaves, the kept half is compacted).
    let (_b, ()) = phase(&mut rb, b, |mut b| async move {
        for k in (0..40u64).filter(|k| k % 4 == 0) {
            assert!(b.update_u64(k * 10, 1000 + k).await.unwrap());
        }
        for k in (0..40u64).filter(|k| k % 4 == 1) {
            assert!(b.delete_u64(k * 10).await.unwrap());
        }
        // Reuse freed entries with keys A never asked for.
        for k in 0..10u64 {
            b.insert_u64(k * 10 + 5, 5).await.unwrap();
        }
        // Splits.
        for k in 0..400u64 {
            b.insert_u64(k * 10 + 3, 3).await.unwrap();
        }
        (b, ())
    });
    phase(&mut ra, a, |mut a| async move {
        let before = a.counters();
        for k in 0..40u64 {
            let want = match k % 4 {
                0 => Some(1000 + k),
                1 => None,
                _ => Some(k),
            };
            assert_eq!(a.get_u64(k * 10).await.unwrap(), want, "key {}", k * 10);
        }
        let s = a.counters();
        assert!(s.spec_misses > before.spec_misses, "stale guesses were refused: {s:?}");
        // Refreshed guesses hit again.
        let before = a.counters();
        for k in (0..40u64).filter(|k| k % 4 != 1) {
            a.get_u64(k * 10).await.unwrap();
        }
        assert_eq!(a.counters().spec_hits - before.spec_hits, 30);
        (a, ())
    });
}

#[test]
fn without_the_technique_nothing_is_speculated() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let (mut r, a) = client(&t, 0, "none");
    phase(&mut r, a, |mut a| async move {
        for k in 0..100u64 {
            a.insert_u64(k, k).await.unwrap();
        }
        for k in 0..100u64 {
            a.get_u64(k).await.unwrap();
        }
        let s = a.counters();
        assert_eq!((s.spec_hits, s.spec_misses), (0, 0));
        assert_eq!(s.lookup_bytes, 100 * 1024, "with the index cache warm, a lookup reads one leaf");
        (a, ())
    });
}
