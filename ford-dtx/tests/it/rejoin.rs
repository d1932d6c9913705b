//! Re-replication while transactions run (`ford_dtx::rejoin`): a blade
//! joins (`Db::view`), buckets added while it was out get a copy there, and
//! every slot is copied under its lock while another thread's transactions
//! write on; in the next view, with the blade read again, the audit (which
//! compares every replica) is clean.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ford_dtx::db::Db;
use ford_dtx::layout::Owner;
use ford_dtx::recovery::settle;
use ford_dtx::rejoin::{self, Copied, Copier};
use ford_dtx::{Registration, TxnError};
use smart_core::{Runtime, RuntimeConfig, Transport};
use smart_testkit::backends;
use smart_testkit::die::Die;

use crate::{audited, insert_one, open, spec, u};

const ACCOUNTS: u64 = 6;
const START: u64 = 1_000;
const LEASE: Duration = Duration::from_secs(30);

/// The accounts of every table at START, and keys 100..160 of tables 0 and
/// 1 at 0, past their arrays (2 buckets of 22 slots): overflow buckets.
async fn load(dtx: &ford_dtx::Dtx) {
    for table in 0..3 {
        for k in 0..ACCOUNTS {
            insert_one(dtx, table, k, START).await.unwrap();
        }
    }
    for k in 100..160 {
        insert_one(dtx, 0, k, 0).await.unwrap();
        insert_one(dtx, 1, k, 0).await.unwrap();
    }
}

/// Three embedded blades with database `name` of three tables (k = 2),
/// [`load`]ed by a registration closed since: the transport (keep it: it
/// holds the blades), a runtime and the database.
fn loaded(name: &str) -> (Arc<dyn Transport>, Runtime, Arc<Db>) {
    let t: Arc<dyn Transport> = backends::embedded(3).transport;
    let (mut rt, db, first) = open(&t, &spec(name, &[8, 8, 8], 16, 2), 1, 1);
    let dtx = first.open_thread(rt.ctx());
    rt.block_on(async move { load(&dtx).await });
    first.close(&*t).unwrap();
    (t, rt, db)
}

/// Three embedded blades, three tables, k = 2 (blade 1 holds table 0's
/// backup and table 1's primary). Blade 1 goes out; transactions go on
/// without it and add overflow buckets to tables 0 and 1 (none there); then
/// its bucket arrays are zeroed (a fresh blade's). Returns the transport,
/// a runtime, the database and the sum of its balances.
fn after_a_failover(name: &str) -> (Arc<dyn Transport>, Runtime, Arc<Db>, u64) {
    let t: Arc<dyn Transport> = backends::embedded(3).transport;
    let (mut rt, db, first) = open(&t, &spec(name, &[8, 8, 8], 16, 2), 1, 1);
    first.close(&*t).unwrap();
    let without = Arc::new(db.without(&[1]).unwrap());
    let reg = Registration::register(t.clone(), without, 1, 1, LEASE).unwrap();
    let dtx = reg.open_thread(rt.ctx());
    let (ctx, d) = (rt.ctx(), db.clone());
    rt.block_on(async move {
        load(&dtx).await;
        assert!(dtx.stats().chains_extended >= 2, "the chains grew");
        for t in &d.tables {
            for r in (0..d.replicas).filter(|r| t.base[*r].blade() == 1) {
                ctx.write_all(t.base[r], &vec![0u8; (t.buckets * t.bucket_bytes()) as usize]).await.unwrap();
            }
        }
    });
    reg.close(&*t).unwrap();
    (t, rt, db, 3 * ACCOUNTS * START)
}

/// Transfers of 7 between keys of every table, the overflow ones (keys
/// 100..160 of tables 0 and 1) among them, aborts retried, until `stop`;
/// returns how many committed, and how many aborted for want of the
/// joining blade's copy.
async fn transfers(dtx: &ford_dtx::Dtx, stop: &AtomicBool, at_least: u64) -> (u64, u64) {
    let (mut done, mut i) = (0u64, 0u64);
    while !stop.load(Ordering::SeqCst) || done < at_least {
        i += 1;
        let key = |j: u64| if j % 3 == 2 { j % ACCOUNTS } else { 100 + j % 60 };
        let (ta, tb) = ((i % 3) as u32, ((i / 3) % 3) as u32);
        let (a, b) = (key(i * 7 + 1), key(i * 11 + 5));
        if (ta, a) == (tb, b) {
            continue;
        }
        let mut tx = dtx.txn(0);
        tx.begin();
        let (x, y) = (tx.update(ta, a), tx.update(tb, b));
        let r = async {
            tx.execute().await?;
            let (vx, vy) = (u(tx.value(x)), u(tx.value(y)));
            tx.write(x, &vx.wrapping_sub(7).to_le_bytes());
            tx.write(y, &vy.wrapping_add(7).to_le_bytes());
            tx.commit().await
        }
        .await;
        match r {
            Ok(()) => done += 1,
            Err(TxnError::Abort(_)) => {}
            Err(e) => panic!("transfer {i}: {e}"),
        }
        assert!(i < 200_000, "transfers do not get through");
    }
    (done, dtx.stats().copies_unknown)
}

fn copier(reg: &Registration) -> Copier {
    let lock = Owner { blade: reg.slot(), thread: 0, coroutine: 0 }.lock_word(0);
    Copier { lock, patience_ms: 200, give_up_ms: 20_000 }
}

#[test]
fn a_blade_copied_while_transactions_write_on_is_whole_in_the_next_view() {
    let (t, _rt, db, money) = after_a_failover("rejoin");
    let joining = Arc::new(db.view(&[], &[1]).unwrap());
    assert_eq!((joining.table(1).order[0], joining.table(1).live, joining.table(1).writes), (1, 1, 2));
    assert_eq!((joining.table(0).live, joining.table(0).writes), (1, 2));
    assert_eq!((joining.table(2).live, joining.table(2).writes), (2, 2));
    let workers = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
    assert!(workers.info.logs.iter().all(|l| l.is_null() || l.blade() != 1), "no undo log on a joining blade");
    let copy = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
    let who = copier(&copy);
    let stop = Arc::new(AtomicBool::new(false));
    let (moved, copied) = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut rt = Runtime::new(&*t, 0, workers.runtime_config(&RuntimeConfig::default())).unwrap();
            let dtx = workers.open_thread(rt.ctx());
            let stop = stop.clone();
            rt.block_on(async move { transfers(&dtx, &stop, 50).await })
        });
        let c = s.spawn(|| {
            let mut rt = Runtime::new(&*t, 1, copy.runtime_config(&RuntimeConfig::default())).unwrap();
            let ctx = rt.ctx();
            let v = joining.clone();
            let r = rt.block_on(async move {
                // Give the transactions a head start (some meet the
                // buckets without a copy yet).
                ctx.sleep_ns(20_000_000).await;
                let added = rejoin::add_copies(&ctx, &v, 1).await?;
                let mut c = rejoin::copy(&ctx, &v, 1, who, |_| Ok(())).await?;
                c.added = added;
                Ok::<_, ford_dtx::DtxError>(c)
            });
            stop.store(true, Ordering::SeqCst);
            r
        });
        let copied: Copied = c.join().unwrap().unwrap();
        (w.join().unwrap(), copied)
    });
    let (done, unknown) = moved;
    assert!(done >= 50, "transfers committed: {done}");
    assert!(copied.added >= 2 && copied.rehomed > 0 && copied.slots > 0, "{copied:?} ({unknown} waited for a copy)");
    workers.close(&*t).unwrap();
    copy.close(&*t).unwrap();
    // The next view reads blade 1 again: every replica the same, money
    // conserved, homes right.
    let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let (ctx, d) = (rt.ctx(), db.clone());
    let sum = rt.block_on(async move { audited(&ctx, &d, "the next view").await });
    assert_eq!(sum, money.wrapping_add(0), "money conserved ({done} transfers, {copied:?})");
}

#[test]
fn a_copier_killed_mid_copy_leaves_no_lock_and_the_copy_made_again_is_whole() {
    for polls in [3, 30, 100] {
        let (t, mut rt, db, money) = after_a_failover("rejoin-die");
        let joining = Arc::new(db.view(&[], &[1]).unwrap());
        let dying = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
        let (who, nonce) = (copier(&dying), dying.fence_tag());
        let (ctx, v) = (rt.ctx(), joining.clone());
        let died = rt.block_on(Die::after(polls, async move {
            rejoin::add_copies(&ctx, &v, 1).await.unwrap();
            rejoin::copy(&ctx, &v, 1, who, |_| Ok(())).await.unwrap()
        }));
        assert!(died.is_none(), "{polls} polls: the copy finished");
        drop(dying);
        // Its locks go with its settling; a transaction then gets through,
        // and the copy made again is whole.
        let (ctx, v) = (rt.ctx(), joining.clone());
        let rec = rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
        assert_eq!(rec.len(), 1);
        let again = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
        let who = copier(&again);
        let dtx = again.open_thread(rt.ctx());
        let (ctx, v) = (rt.ctx(), joining.clone());
        let copied = rt.block_on(async move {
            let stop = Arc::new(AtomicBool::new(true));
            transfers(&dtx, &stop, 10).await;
            rejoin::add_copies(&ctx, &v, 1).await.unwrap();
            rejoin::copy(&ctx, &v, 1, who, |_| Ok(())).await.unwrap()
        });
        assert_eq!(copied.busy, 0, "{polls} polls: a lock was left ({copied:?})");
        again.close(&*t).unwrap();
        let (ctx, d) = (rt.ctx(), db.clone());
        let w = format!("{polls} polls");
        assert_eq!(rt.block_on(async move { audited(&ctx, &d, &w).await }), money, "{polls} polls");
    }
}

/// Blade 0 joins again while compute blades run from its mirror on blade
/// 1 (`Db::open_view`): a fresh blade 0 gets its catalog and roots back
/// with an empty registry (`mirror::restore_joining`), its copies are made
/// as any joining blade's, and a compute blade of that epoch dies
/// mid-transfer, registered in the mirror. Once blade 0 is taken in, a
/// registration on its registry leaves the slot that the mirror still
/// records (so the dead one is still found and settled, in the view the
/// compute blades settle the earlier epoch in: blade 0 joining), and then
/// takes it; the whole database audits clean.
#[test]
fn blade_0_joining_keeps_its_mirror_as_the_registry_until_the_mirror_s_registrations_are_settled() {
    for polls in [4, 9, 14] {
        let (t, mut rt, db) = loaded("rejoin0");
        let money = 3 * ACCOUNTS * START;
        // Blade 0 fresh: its copies and its registry zeroed, then the
        // catalog and the roots written back with the registry empty.
        let (ctx, d) = (rt.ctx(), db.clone());
        let joining = rt.block_on(async move {
            for t in &d.tables {
                for r in (0..d.replicas).filter(|r| t.base[*r].blade() == 0) {
                    ctx.write_all(t.base[r], &vec![0u8; (t.buckets * t.bucket_bytes()) as usize]).await.unwrap();
                }
            }
            // (Its overflow buckets keep their bytes: the copy writes every
            // bucket there again.)
            let slots = ford_dtx::layout::registry::SLOTS * ford_dtx::layout::registry::SLOT;
            ctx.write_all(d.registry, &vec![0u8; slots as usize]).await.unwrap();
            let m = ford_dtx::mirror::list(&ctx, 1).await.unwrap().into_iter().find(|m| m.db.name == d.name).unwrap();
            ford_dtx::mirror::restore_joining(&ctx, &m).await.unwrap();
            Arc::new(Db::open_view(&ctx, "rejoin0", &[], &[0]).await.unwrap().unwrap())
        });
        let m = joining.mirror.expect("blade 0 joins in the database as its mirror stands for it");
        assert_eq!(m.blade(), 1, "{polls} polls");
        assert!(db.view(&[], &[0]).is_err(), "blade 0 joins only through its mirror");
        // Its copies made under their locks.
        let copy = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
        let (ctx, v, who) = (rt.ctx(), joining.clone(), copier(&copy));
        rt.block_on(async move {
            rejoin::add_copies(&ctx, &v, 0).await.unwrap();
            rejoin::copy(&ctx, &v, 0, who, |_| Ok(())).await.unwrap()
        });
        copy.close(&*t).unwrap();
        // A compute blade of the joining epoch dies mid-transfer.
        let dying = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
        let (nonce, slot) = (dying.fence_tag(), dying.slot());
        let dtx = dying.open_thread(rt.ctx());
        rt.block_on(Die::after(polls, async move {
            let mut tx = dtx.txn(0);
            tx.begin();
            let (x, y) = (tx.update(0, 1), tx.update(2, 4));
            tx.execute().await.unwrap();
            let (vx, vy) = (u(tx.value(x)), u(tx.value(y)));
            tx.write(x, &(vx - 7).to_le_bytes());
            tx.write(y, &(vy + 7).to_le_bytes());
            tx.commit().await
        }));
        drop(dying);
        // Taken in: registrations claim blade 0's registry again, but not
        // the slot the mirror still records.
        let ctx = rt.ctx();
        let whole = Arc::new(rt.block_on(async move { Db::open(&ctx, "rejoin0").await }).unwrap().unwrap());
        assert!(whole.mirror.is_none());
        let next = Registration::register(t.clone(), whole.clone(), 1, 1, LEASE).unwrap();
        assert_ne!(next.slot(), slot, "{polls} polls: a slot the mirror records was claimed on blade 0");
        let (ctx, v) = (rt.ctx(), joining.clone());
        let rec = rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
        assert_eq!(rec.len(), 1, "{polls} polls: the dead registration settled in the mirror");
        let again = Registration::register(t.clone(), whole.clone(), 1, 1, LEASE).unwrap();
        assert_eq!(again.slot(), slot, "{polls} polls: the slot settled is free again");
        let dtx = again.open_thread(rt.ctx());
        rt.block_on(async move { transfers(&dtx, &AtomicBool::new(true), 10).await });
        next.close(&*t).unwrap();
        again.close(&*t).unwrap();
        let (ctx, d) = (rt.ctx(), db.clone());
        let w = format!("{polls} polls");
        assert_eq!(rt.block_on(async move { audited(&ctx, &d, &w).await }), money, "{polls} polls");
    }
}

/// A compute blade dies mid-transfer while blade 0 joins, registered in the
/// mirror, where nothing expires: the copy waits on its locks, recovery of
/// expired registrations frees nothing, and the copy fails; told it is dead
/// (`copy_reaping`, as the coordinator's lapsed membership tells it), the
/// copy settles it and goes through, and the database audits clean.
#[test]
fn a_compute_blade_dead_in_the_mirror_is_settled_by_the_copy_it_blocks() {
    let (t, mut rt, db) = loaded("reap0");
    let ctx = rt.ctx();
    let joining = Arc::new(rt.block_on(async move { Db::open_view(&ctx, "reap0", &[], &[0]).await }).unwrap().unwrap());
    // Dies holding its locks: every item locked, nothing written yet.
    let dying = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
    let nonce = dying.fence_tag();
    let dtx = dying.open_thread(rt.ctx());
    rt.block_on(async move {
        let mut tx = dtx.txn(0);
        tx.begin();
        let _ = (tx.update(0, 1), tx.update(2, 4));
        tx.execute().await.unwrap();
        // Dropped holding its locks, as a process killed there.
        drop(tx);
    });
    drop(dying);
    let copy = Registration::register(t.clone(), joining.clone(), 1, 1, LEASE).unwrap();
    let who = Copier { give_up_ms: 300, patience_ms: 50, ..copier(&copy) };
    let (ctx, v) = (rt.ctx(), joining.clone());
    let blocked = rt.block_on(async move { rejoin::copy(&ctx, &v, 0, who, |_| Ok(())).await });
    assert!(matches!(&blocked, Err(ford_dtx::DtxError::Config(m)) if m.contains("stayed locked")), "{blocked:?}");
    let (ctx, v) = (rt.ctx(), joining.clone());
    let copied = rt
        .block_on(async move {
            rejoin::add_copies(&ctx, &v, 0).await?;
            rejoin::copy_reaping(&ctx, &v, 0, who, |_| Ok(()), || vec![nonce]).await
        })
        .unwrap();
    assert_eq!(copied.reaped, 1, "{copied:?}");
    copy.close(&*t).unwrap();
    let (ctx, d) = (rt.ctx(), db.clone());
    assert_eq!(rt.block_on(async move { audited(&ctx, &d, "after the copy").await }), 3 * ACCOUNTS * START);
}
