//! The protocol's operations on every backend, and placement over n ≥ k
//! blades.

use std::sync::Arc;

use ford_dtx::recovery::audit;
use ford_dtx::Abort;
use smart_core::Transport;
use smart_testkit::backends;

use crate::{abort_of, open, spec, u};

#[test]
fn insert_read_update_delete_on_every_backend() {
    for b in backends::all(2) {
        let t: Arc<dyn Transport> = b.transport.clone();
        let (mut rt, db, reg) = open(&t, &spec("api", &[8, 40], 64, 2), 1, 1);
        let dtx = reg.open_thread(rt.ctx());
        let ctx = rt.ctx();
        rt.block_on(async move {
            let mut tx = dtx.txn(0);
            tx.begin();
            let a = tx.insert(0, 7);
            let s = tx.insert(1, 7);
            tx.execute().await.unwrap();
            tx.write(a, &10u64.to_le_bytes());
            tx.write(s, &[3u8; 40]);
            tx.commit().await.unwrap();

            tx.begin();
            tx.insert(0, 7);
            assert_eq!(abort_of(tx.execute().await), Abort::Exists, "{}", b.name);

            tx.begin();
            let a = tx.update(0, 7);
            let s = tx.read(1, 7);
            tx.execute().await.unwrap();
            assert_eq!(u(tx.value(a)), 10);
            assert_eq!(tx.value(s), &[3u8; 40]);
            tx.write(a, &11u64.to_le_bytes());
            tx.commit().await.unwrap();

            tx.begin();
            tx.read(0, 8);
            assert_eq!(abort_of(tx.execute().await), Abort::NotFound);

            tx.begin();
            tx.delete(1, 7);
            tx.execute().await.unwrap();
            tx.commit().await.unwrap();
            tx.begin();
            tx.read(1, 7);
            assert_eq!(abort_of(tx.execute().await), Abort::NotFound, "deleted rows are invisible");
            tx.begin();
            tx.update(1, 7);
            assert_eq!(abort_of(tx.execute().await), Abort::NotFound);
            // Re-inserting a deleted key reuses its slot.
            tx.begin();
            let s = tx.insert(1, 7);
            tx.execute().await.unwrap();
            tx.write(s, &[4u8; 40]);
            tx.commit().await.unwrap();

            tx.begin();
            let a = tx.read(0, 7);
            let s = tx.read(1, 7);
            tx.execute().await.unwrap();
            assert_eq!((u(tx.value(a)), tx.value(s)[0]), (11, 4));
            let versions: Vec<u64> = tx.footprint().map(|f| f.version).collect();
            tx.commit().await.unwrap();
            // Insert (1), update (2); insert (1), delete (2), insert (3).
            assert_eq!(versions, vec![2, 3]);

            let rep = audit(&ctx, &db, |_, _, _| {}).await.unwrap();
            assert_eq!(rep.violations(), 0, "{rep:?}");
            assert_eq!(rep.live, vec![1, 1]);
        });
        reg.close(&*t).unwrap();
    }
}

#[test]
fn any_number_of_blades_at_least_the_replicas() {
    for (blades, replicas) in [(1, 1), (3, 2), (4, 3), (5, 4), (3, 1)] {
        let b = backends::embedded(blades);
        let t: Arc<dyn Transport> = b.transport.clone();
        let (mut rt, db, reg) = open(&t, &spec("n", &[8, 8, 8, 8, 8], 32, replicas), 1, 1);
        // Table t's replicas are on blades t, t+1, ... mod n.
        for tb in &db.tables {
            for r in 0..replicas {
                assert_eq!(tb.base[r].blade() as usize, (tb.id as usize + r) % blades);
            }
        }
        let dtx = reg.open_thread(rt.ctx());
        let ctx = rt.ctx();
        rt.block_on(async move {
            let mut tx = dtx.txn(0);
            for k in 0..40u64 {
                tx.begin();
                let ids: Vec<_> = (0..5).map(|t| tx.insert(t, k)).collect();
                tx.execute().await.unwrap();
                for id in ids {
                    tx.write(id, &k.to_le_bytes());
                }
                tx.commit().await.unwrap();
            }
            let mut sum = 0;
            let rep = audit(&ctx, &db, |_, _, v| sum += u(v)).await.unwrap();
            assert_eq!(rep.violations(), 0, "{blades} blades, {replicas} replicas: {rep:?}");
            assert_eq!(sum, 5 * (0..40).sum::<u64>());
        });
        drop(reg);
    }
    // More replicas than blades is refused, with a message.
    let b = backends::embedded(2);
    let mut rt = smart_core::Runtime::new(&*b.transport, 0, smart_core::RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let s = spec("k3", &[8], 8, 3);
    let e = rt.block_on(async move { ford_dtx::db::Db::create(&ctx, &s).await }).unwrap_err();
    assert!(e.to_string().contains("3 replicas over 2 memory blades"), "{e}");
    // So is a table whose bucket array's size does not fit 64 bits (an
    // error, not an overflow that would wrap to a small allocation).
    let s = spec("huge", &[8], u64::MAX, 1);
    let ctx = rt.ctx();
    let e = rt.block_on(async move { ford_dtx::db::Db::create(&ctx, &s).await }).unwrap_err();
    assert!(e.to_string().contains("table t0: 18446744073709551615 rows need more than 2^64 bytes"), "{e}");
}

#[test]
fn a_database_made_with_crc32_records_is_refused_with_a_message() {
    let b = backends::embedded(2);
    let mut rt = smart_core::Runtime::new(&*b.transport, 0, smart_core::RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let s = spec("v1", &[8], 8, 2);
    let e = rt
        .block_on(async move {
            ford_dtx::db::Db::create(&ctx, &s).await.unwrap();
            assert!(ford_dtx::db::Db::open(&ctx, "v1").await.unwrap().is_some(), "this version opens its own");
            // The catalog of a database made before records carried CRC-32C.
            let at = ctx.root(0, "ford:v1").await.unwrap().unwrap();
            ctx.write(at, b"FORDCAT1").await.unwrap();
            ford_dtx::db::Db::open(&ctx, "v1").await
        })
        .unwrap_err();
    assert!(e.to_string().contains("made by an older version"), "{e}");
}
