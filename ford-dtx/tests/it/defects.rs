//! Each defect of FORD / Smart-DTX that this crate fixes, with a test that
//! fails on the defective behaviour.

use std::sync::Arc;

use ford_dtx::layout::{self, log, Owner};
use ford_dtx::recovery::{audit, recover, Which};
use ford_dtx::Abort;
use smart_core::{Runtime, RuntimeConfig, Transport};
use smart_testkit::backends;

use crate::{abort_of, insert_rows, join, open, spec, u};

#[test]
fn an_abort_releases_only_the_locks_it_acquired() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, _db, reg) = open(&t, &spec("locks", &[8], 64, 2), 1, 2);
    let dtx = reg.open_thread(rt.ctx());
    let ctx = rt.ctx();
    rt.block_on(async move {
        insert_rows(&dtx, 0..2, |k| k).await;
        let (mut t1, mut t2) = (dtx.txn(0), dtx.txn(1));
        t1.begin();
        t1.update(0, 0);
        t1.execute().await.unwrap();
        // T2 locks y, fails on x (held by T1), and aborts.
        t2.begin();
        t2.update(0, 1);
        t2.update(0, 0);
        assert_eq!(abort_of(t2.execute().await), Abort::Locked);
        // x is still T1's; y is free again.
        let mut probe = dtx.txn(1);
        probe.begin();
        let addr_x = {
            probe.read(0, 0);
            probe.execute().await.unwrap();
            probe.footprint().next().unwrap()
        };
        assert_eq!(addr_x.key, 0);
        let mut t3 = dtx.txn(1);
        t3.begin();
        t3.update(0, 1);
        t3.execute().await.expect("y was released");
        t3.abort().await.unwrap();
        t3.begin();
        t3.update(0, 0);
        assert_eq!(abort_of(t3.execute().await), Abort::Locked, "x must still be held by T1");
        // T1 commits with its lock intact.
        let _ = ctx;
        t1.abort().await.unwrap();
    });
    reg.close(&*t).unwrap();
}

#[test]
fn write_skew_cannot_commit_both() {
    // T1 reads x and y and writes x; T2 reads x and y and writes y. With
    // FORD's version-only validation both commit (each validates the item
    // the other holds locked, whose version has not moved yet).
    for order in [[0usize, 1], [1, 0]] {
        let b = backends::embedded(2);
        let t: Arc<dyn Transport> = b.transport.clone();
        let (mut rt, _db, reg) = open(&t, &spec("skew", &[8], 64, 2), 1, 2);
        let dtx = reg.open_thread(rt.ctx());
        let committed = rt.block_on(async move {
            insert_rows(&dtx, 0..2, |k| k).await;
            let mut txs = [dtx.txn(0), dtx.txn(1)];
            for (i, tx) in txs.iter_mut().enumerate() {
                tx.begin();
                let (mine, other) = (i as u64, 1 - i as u64);
                let w = tx.update(0, mine);
                tx.read(0, other);
                tx.execute().await.unwrap();
                tx.write(w, &100u64.to_le_bytes());
            }
            let mut committed = 0;
            for i in order {
                if txs[i].commit().await.is_ok() {
                    committed += 1;
                }
            }
            committed
        });
        assert_eq!(committed, 1, "order {order:?}: exactly one of the write-skewed pair commits");
        reg.close(&*t).unwrap();
    }
}

#[test]
fn overflow_buckets_have_right_backup_addresses() {
    // One bucket of 22 slots for 100 keys: a chain of 5 buckets on every
    // replica, over 3 blades with 3 replicas.
    for b in [backends::embedded(3), backends::chaos(3, 11)] {
        let t: Arc<dyn Transport> = b.transport.clone();
        let (mut rt, db, reg) = open(&t, &spec("chain", &[8], 1, 3), 1, 1);
        assert_eq!(db.table(0).buckets, 1);
        let dtx = reg.open_thread(rt.ctx());
        let ctx = rt.ctx();
        let rep = rt.block_on(async move {
            insert_rows(&dtx, 0..100, |k| k).await;
            assert!(dtx.stats().chains_extended >= 4);
            let mut tx = dtx.txn(0);
            for k in 0..100u64 {
                tx.begin();
                let a = tx.update(0, k);
                tx.execute().await.unwrap();
                let v = u(tx.value(a));
                tx.write(a, &(v + 1000).to_le_bytes());
                tx.commit().await.unwrap();
            }
            let mut sum = 0;
            let rep = audit(&ctx, &db, |_, _, v| sum += u(v)).await.unwrap();
            assert_eq!(sum, (0..100).map(|k| k + 1000).sum::<u64>());
            rep
        });
        assert_eq!(rep.replica_mismatches, 0, "{}: backups of overflow buckets must get the commits", b.name);
        assert_eq!(rep.violations(), 0, "{rep:?}");
        assert_eq!(rep.live, vec![100]);
        reg.close(&*t).unwrap();
    }
}

#[test]
fn versions_are_unique_across_compute_blades() {
    // Two compute blades (registrations) update the same row in turn: each
    // commit writes the version it read + 1, so no version repeats (FORD
    // drew versions from per-process counters, which repeat across
    // processes).
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, reg1) = open(&t, &spec("ver", &[8], 8, 2), 1, 1);
    let reg2 = join(&t, &db);
    assert_ne!(reg1.slot(), reg2.slot());
    let (d1, d2) = (reg1.open_thread(rt.ctx()), reg2.open_thread(rt.ctx()));
    rt.block_on(async move {
        insert_rows(&d1, 0..1, |k| k).await;
        let (mut a, mut b) = (d1.txn(0), d2.txn(0));
        let mut seen = Vec::new();
        for i in 0..20 {
            let tx = if i % 2 == 0 { &mut a } else { &mut b };
            tx.begin();
            let x = tx.update(0, 0);
            tx.execute().await.unwrap();
            seen.push(tx.footprint().next().unwrap().version + 1);
            tx.write(x, &(i as u64).to_le_bytes());
            tx.commit().await.unwrap();
        }
        assert_eq!(seen, (2..22).collect::<Vec<u64>>());
    });
    reg1.close(&*t).unwrap();
    reg2.close(&*t).unwrap();
}

#[test]
fn a_single_read_of_a_locked_record_aborts() {
    // A transaction of one read item is not validated. A record whose lock
    // is held may show its holder's new image before the holder releases
    // the lock, and if the holder's compute blade dies then, recovery rolls
    // that image back: so the read aborts rather than return it. Through
    // the address cache (the same compute blade) and through the bucket
    // (another one, with no cache yet).
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, reg) = open(&t, &spec("held", &[8], 64, 2), 1, 2);
    let other = join(&t, &db);
    let (dtx, dtx2) = (reg.open_thread(rt.ctx()), other.open_thread(rt.ctx()));
    rt.block_on(async move {
        insert_rows(&dtx, 0..2, |k| k + 10).await;
        let (mut w, mut r) = (dtx.txn(0), dtx.txn(1));
        w.begin();
        let wi = w.update(0, 0);
        w.execute().await.unwrap();
        w.write(wi, &20u64.to_le_bytes());
        for (d, c) in [(&dtx, 1), (&dtx2, 0)] {
            let mut r = d.txn(c);
            r.begin();
            r.read(0, 0);
            r.execute().await.unwrap();
            assert_eq!(abort_of(r.commit().await), Abort::Locked);
        }
        // An unlocked row reads as before.
        r.begin();
        let one = r.read(0, 1);
        r.execute().await.unwrap();
        r.commit().await.unwrap();
        assert_eq!(u(r.value(one)), 11);
        w.commit().await.unwrap();
        for (d, c) in [(&dtx, 1), (&dtx2, 0)] {
            let mut r = d.txn(c);
            r.begin();
            let zero = r.read(0, 0);
            r.execute().await.unwrap();
            r.commit().await.expect("the lock was released");
            assert_eq!(u(r.value(zero)), 20);
        }
    });
    other.close(&*t).unwrap();
    reg.close(&*t).unwrap();
}

#[test]
fn single_reads_are_self_verifying_under_tearing() {
    // A writer thread rewrites a 200-byte row whose 25 words all equal its
    // version; a reader thread runs single-read transactions (no
    // validation round) on the chaos backend, which tears READs that race
    // with WRITEs from another QP. Every committed read must see 25
    // equal words, equal to the record's version.
    let b = backends::chaos(1, 5);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, _db, reg) = open(&t, &spec("torn", &[200], 8, 1), 2, 1);
    let dtx = reg.open_thread(rt.ctx());
    rt.block_on(async move {
        let mut tx = dtx.txn(0);
        tx.begin();
        let a = tx.insert(0, 1);
        tx.execute().await.unwrap();
        tx.write(a, &[0u8; 200]);
        tx.commit().await.unwrap();
    });
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (reads, torn) = std::thread::scope(|s| {
        let (reg, t) = (&reg, &t);
        let d2 = done.clone();
        s.spawn(move || {
            let mut rt = Runtime::new(&**t, 0, RuntimeConfig::default()).unwrap();
            let dtx = reg.open_thread(rt.ctx());
            rt.block_on(async move {
                let mut tx = dtx.txn(0);
                // Until the reader has seen enough (bounded in time).
                let start = std::time::Instant::now();
                while !d2.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed().as_secs() < 30 {
                    tx.begin();
                    let a = tx.update(0, 1);
                    if tx.execute().await.is_err() {
                        continue;
                    }
                    let v = tx.footprint().next().unwrap().version + 1;
                    let mut val = [0u8; 200];
                    for w in val.chunks_mut(8) {
                        w.copy_from_slice(&v.to_le_bytes());
                    }
                    tx.write(a, &val);
                    tx.commit().await.unwrap();
                    // A pause after each write: without one, nearly every
                    // read races with a write and is torn (thousands per
                    // clean one), and the reader's clean reads depend on
                    // how the two threads are scheduled.
                    dtx.ctx().sleep_ns(20_000).await;
                }
            });
        });
        let done = done.clone();
        s.spawn(move || {
            let mut rt = Runtime::new(&**t, 1, RuntimeConfig::default()).unwrap();
            let dtx = reg.open_thread(rt.ctx());
            rt.block_on(async move {
                let (mut reads, mut torn) = (0u64, 0u64);
                let mut tx = dtx.txn(0);
                let start = std::time::Instant::now();
                while (reads < 200 || torn == 0) && start.elapsed().as_secs() < 30 {
                    tx.begin();
                    let a = tx.read(0, 1);
                    match tx.execute().await {
                        Ok(()) => {}
                        Err(ford_dtx::TxnError::Abort(Abort::Torn)) => {
                            torn += 1;
                            continue;
                        }
                        Err(e) => panic!("{e}"),
                    }
                    let v = tx.footprint().next().unwrap().version;
                    match tx.commit().await {
                        Ok(()) => {}
                        // Read while the writer held its lock (see
                        // `a_single_read_of_a_locked_record_aborts`).
                        Err(ford_dtx::TxnError::Abort(Abort::Locked)) => continue,
                        Err(e) => panic!("{e}"),
                    }
                    let words: Vec<u64> = tx.value(a).chunks(8).map(u).collect();
                    let want = if v == 1 { 0 } else { v };
                    assert!(words.iter().all(|w| *w == want), "version {v} read words {words:?}");
                    reads += 1;
                }
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                (reads, torn)
            })
        })
        .join()
        .unwrap()
    });
    eprintln!("single reads: {reads} clean, {torn} torn");
    assert!(reads >= 200, "{reads} reads");
    assert!(torn > 0, "chaos should have torn some reads (caught by the CRC); {reads} clean");
    reg.close(&*t).unwrap();
}

#[test]
fn the_log_is_a_bounded_ring() {
    // 50 transactions of one coroutine leave at most ENTRIES entries in its
    // ring (the ring is reused, never grown), none of them live: recovery
    // finds nothing to undo.
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, reg) = open(&t, &spec("ring", &[8], 16, 2), 1, 1);
    let slot = reg.slot();
    let dtx = reg.open_thread(rt.ctx());
    let ctx = rt.ctx();
    let rec = rt.block_on(async move {
        insert_rows(&dtx, 0..50, |k| k).await;
        recover(&ctx, &db, Which::Slot(slot)).await.unwrap()
    });
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].entries, log::ENTRIES);
    assert_eq!((rec[0].rolled_back, rec[0].rolled_forward, rec[0].released), (0, 0, 0));
    // The lock word format the log names.
    let o = Owner { blade: slot, thread: 0, coroutine: 0 };
    assert_eq!(Owner::of(o.lock_word(50)), Some(o));
    let _ = (Runtime::new(&*t, 0, RuntimeConfig::default()), layout::SLOTS);
}

#[test]
fn every_qp_that_carried_a_commit_write_is_flushed() {
    // Two items on tables 0 and 1 over 3 blades with 2 replicas: the
    // commit writes to blades {0, 1} and {1, 2}, so three QPs carry commit
    // WRITEs and each needs its flush READ (FORD flushed only the last
    // item's QP). Writes-only transactions READ nothing else in commit().
    let b = backends::embedded(3);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, _db, reg) = open(&t, &spec("flush", &[8, 8], 16, 2), 1, 1);
    let dtx = reg.open_thread(rt.ctx());
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut tx = dtx.txn(0);
        tx.begin();
        let (a, c) = (tx.insert(0, 1), tx.insert(1, 1));
        tx.execute().await.unwrap();
        tx.write(a, &1u64.to_le_bytes());
        tx.write(c, &1u64.to_le_bytes());
        tx.commit().await.unwrap();
        tx.begin();
        let (a, c) = (tx.update(0, 1), tx.update(1, 1));
        tx.execute().await.unwrap();
        tx.write(a, &2u64.to_le_bytes());
        tx.write(c, &2u64.to_le_bytes());
        let before = ctx.stats();
        tx.commit().await.unwrap();
        let after = ctx.stats();
        assert_eq!(after.reads - before.reads, 3, "one flush READ per blade written");
        // The log (a copy per replica: 2) + 2 items × 2 replicas; the
        // unlocks are CASes (2).
        assert_eq!(after.writes - before.writes, 2 + 4);
        assert_eq!(after.cas - before.cas, 2, "one unlock CAS per written item");
    });
    reg.close(&*t).unwrap();
}
