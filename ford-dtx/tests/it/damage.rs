//! A damaged database (memory changed behind its back: a backing file
//! edited or half-restored, a stray writer) is reported as corrupt where the
//! damage is read, naming what is wrong: never a crash, an allocation sized
//! by garbage, or a verb sent to a blade that does not exist.

use std::sync::Arc;

use ford_dtx::db::Db;
use ford_dtx::error::DtxError;
use ford_dtx::layout::{self, catalog};
use ford_dtx::recovery::{audit, recover, Which};
use ford_dtx::{Registration, TxnError};
use smart_core::{Ctx, GlobalAddr, Runtime, Transport};
use smart_testkit::backends;

use crate::{insert_one, insert_rows, join, open, spec, u};

/// An address on a blade that the two-blade databases here do not have.
const NOWHERE: u64 = GlobalAddr::new(9, 4096).raw();

fn corrupt_message<T: std::fmt::Debug>(r: Result<T, DtxError>) -> String {
    match r {
        Err(DtxError::Corrupt(m)) => m,
        other => panic!("expected a corrupt database, got {other:?}"),
    }
}

fn put(rt: &mut Runtime, at: GlobalAddr, v: u64) {
    let ctx = rt.ctx();
    rt.block_on(async move { ctx.write(at, &v.to_le_bytes()).await }).unwrap();
}

fn get(rt: &mut Runtime, at: GlobalAddr) -> u64 {
    let ctx = rt.ctx();
    rt.block_on(async move { ctx.read_u64(at).await }).unwrap()
}

fn open_again(rt: &mut Runtime, name: &'static str) -> Result<Option<Db>, DtxError> {
    let ctx = rt.ctx();
    rt.block_on(async move { Db::open(&ctx, name).await })
}

#[test]
fn a_damaged_catalog_is_refused_as_corrupt_naming_the_entry() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, _db, reg) = open(&t, &spec("cat", &[8, 16], 16, 2), 1, 1);
    let ctx = rt.ctx();
    let at = rt.block_on(async move { ctx.root(0, "ford:cat").await }).unwrap().expect("the catalog's root");
    let entry = |table: usize, word: usize| at.add((catalog::HEADER + table * catalog::TABLE + word) as u64);
    let cases: [(GlobalAddr, u64, &str); 6] = [
        // Table 1's replica 1 on a blade the database does not have.
        (entry(1, 32 + 8), NOWHERE, "table 1, replica 1: address"),
        // Table 0's primary array running past the end of blade 0.
        (entry(0, 32), GlobalAddr::new(0, (256 << 20) - 64).raw(), "pass the end of memory blade 0"),
        // Table 1's primary on blade 0, where it belongs on blade 1.
        (entry(1, 32), GlobalAddr::new(0, 8192).raw(), "table 1's replica 0 is on blade 0; it belongs on blade 1"),
        // A table with values of 0 bytes.
        (entry(1, 8), 0, "entry 1 names table 1 of"),
        // No registry.
        (at.add(32), 0, "the registry: address"),
        // More replicas than blades.
        (at.add(16), 3, "3 replicas over 2 memory blades"),
    ];
    for (word, bad, says) in cases {
        let good = get(&mut rt, word);
        put(&mut rt, word, bad);
        let m = corrupt_message(open_again(&mut rt, "cat"));
        assert!(m.contains(says), "{m:?} should say {says:?}");
        put(&mut rt, word, good);
        assert!(open_again(&mut rt, "cat").unwrap().is_some(), "repaired, it opens");
    }
    reg.close(&*t).unwrap();
}

#[test]
fn a_registry_slot_with_a_damaged_shape_is_reported_and_never_reused() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, live) = open(&t, &spec("reg", &[8], 16, 2), 1, 1);
    // A compute blade that dies: recovery reads its log area, whose size
    // its slot gives (threads × coroutines rings).
    let dead = join(&t, &db);
    let (dead_slot, slot) = (dead.slot(), db.registry_slot(dead.slot()));
    drop(dead);
    let recover_it = |rt: &mut Runtime| {
        let (ctx, d) = (rt.ctx(), db.clone());
        rt.block_on(async move { recover(&ctx, &d, Which::Slot(dead_slot)).await })
    };
    // 2^40 threads: a log area of garbage size, once allocated as such.
    let threads = get(&mut rt, slot.add(24));
    put(&mut rt, slot.add(24), 1 << 40);
    let m = corrupt_message(recover_it(&mut rt));
    assert!(m.contains("1099511627776 threads × 1 coroutines"), "{m}");
    put(&mut rt, slot.add(24), threads);
    // A log area on no blade.
    let log = get(&mut rt, slot.add(16));
    put(&mut rt, slot.add(16), NOWHERE);
    let m = corrupt_message(recover_it(&mut rt));
    assert!(m.contains("the log area: address") && m.contains("memory blade 9"), "{m}");
    // Repaired, the same slot recovers.
    put(&mut rt, slot.add(16), log);
    let rec = recover_it(&mut rt).unwrap();
    assert_eq!(rec.len(), 1, "{rec:?}");

    // A free slot's old log area is reused by the next registration only
    // if the slot names it whole on a blade.
    let again = join(&t, &db);
    let s = again.slot();
    again.close(&*t).unwrap();
    let slot = db.registry_slot(s);
    put(&mut rt, slot.add(16), NOWHERE);
    let fresh = join(&t, &db);
    assert_eq!(fresh.slot(), s, "the first free slot again");
    assert_ne!(get(&mut rt, slot.add(16)), NOWHERE, "a new log area");
    let dtx = fresh.open_thread(rt.ctx());
    rt.block_on(async move { insert_one(&dtx, 0, 7, 70).await }).expect("it logs and commits");
    fresh.close(&*t).unwrap();
    live.close(&*t).unwrap();
}

/// Keys 0..30 in a table of one bucket: 22 in the bucket, 8 in its one
/// overflow bucket.
fn chained(name: &'static str) -> (backends::Backend, Runtime, Arc<Db>, Registration) {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, reg) = open(&t, &spec(name, &[8], 1, 2), 1, 1);
    assert_eq!(db.table(0).buckets, 1);
    let dtx = reg.open_thread(rt.ctx());
    rt.block_on(async move { insert_rows(&dtx, 0..30, |k| k * 10).await });
    (b, rt, db, reg)
}

/// Runs `f` on a new compute blade (an empty address cache: reads walk the
/// chain from the bucket), which leaves after.
fn on_fresh<T: 'static, F: std::future::Future<Output = T> + 'static>(
    rt: &mut Runtime,
    t: &Arc<dyn Transport>,
    db: &Arc<Db>,
    f: impl FnOnce(ford_dtx::Dtx) -> F,
) -> T {
    let other = join(t, db);
    let r = rt.block_on(f(other.open_thread(rt.ctx())));
    other.close(&**t).unwrap();
    r
}

/// Reads `key` on a new compute blade.
fn read_fresh(rt: &mut Runtime, t: &Arc<dyn Transport>, db: &Arc<Db>, key: u64) -> Result<u64, TxnError> {
    on_fresh(rt, t, db, |dtx| async move {
        let mut tx = dtx.txn(0);
        tx.begin();
        let i = tx.read(0, key);
        tx.execute().await?;
        tx.commit().await?;
        Ok(u(tx.value(i)))
    })
}

fn audit_of(ctx: Ctx, db: Arc<Db>, rt: &mut Runtime) -> Result<ford_dtx::recovery::AuditReport, DtxError> {
    rt.block_on(async move { audit(&ctx, &db, |_, _, _| {}).await })
}

#[test]
fn a_damaged_overflow_chain_is_reported_as_corrupt_by_reads_and_audits_and_counted_by_recovery() {
    let (b, mut rt, db, reg) = chained("chain");
    let t: Arc<dyn Transport> = b.transport.clone();
    assert_eq!(read_fresh(&mut rt, &t, &db, 29).unwrap(), 290, "through the chain");
    let home = db.table(0).base[0];
    let next = GlobalAddr::from_raw(get(&mut rt, home));
    assert!(!next.is_null(), "30 keys overflow a bucket of {} slots", layout::SLOTS);

    // The bucket's link to the next names no blade.
    put(&mut rt, home, NOWHERE);
    let says = "the next bucket after";
    match read_fresh(&mut rt, &t, &db, 29) {
        Err(TxnError::Dtx(DtxError::Corrupt(m))) => assert!(m.contains(says) && m.contains("memory blade 9"), "{m}"),
        other => panic!("expected a corrupt chain, got {other:?}"),
    }
    assert_eq!(read_fresh(&mut rt, &t, &db, 3).unwrap(), 30, "keys before the damage still read");
    let m = corrupt_message(audit_of(rt.ctx(), db.clone(), &mut rt));
    assert!(m.contains(says), "{m}");
    // Recovery of a dead compute blade scans every chain for its locks, up
    // to the damage, and says how many it could not finish.
    let dead = join(&t, &db);
    let (ctx, d, s) = (rt.ctx(), db.clone(), dead.slot());
    drop(dead);
    let rec = rt.block_on(async move { recover(&ctx, &d, Which::Slot(s)).await }).unwrap();
    assert_eq!(rec[0].chains_cut, 1, "{rec:?}");
    put(&mut rt, home, next.raw());

    // The overflow bucket names no backup of itself.
    let mirror = next.add(8);
    let good = get(&mut rt, mirror);
    put(&mut rt, mirror, 0);
    let says = "replica 1 of overflow bucket";
    match read_fresh(&mut rt, &t, &db, 29) {
        Err(TxnError::Dtx(DtxError::Corrupt(m))) => assert!(m.contains(says) && m.contains("is null"), "{m}"),
        other => panic!("expected a corrupt chain, got {other:?}"),
    }
    let m = corrupt_message(audit_of(rt.ctx(), db.clone(), &mut rt));
    assert!(m.contains(says), "{m}");
    put(&mut rt, mirror, good);

    // Repaired: everything reads, the audit is clean.
    assert_eq!(read_fresh(&mut rt, &t, &db, 29).unwrap(), 290);
    let rep = audit_of(rt.ctx(), db.clone(), &mut rt).unwrap();
    assert_eq!((rep.live[0], rep.locks_held, rep.replica_mismatches, rep.torn), (30, 0, 0, 0));
    reg.close(&*t).unwrap();
}

#[test]
fn a_chain_damaged_into_a_cycle_is_reported_not_walked_forever() {
    // 50 keys in one bucket: it and its first overflow bucket are full.
    let b = backends::embedded_sized(2, 32 << 20);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, reg) = open(&t, &spec("cycle", &[8], 1, 2), 1, 1);
    let dtx = reg.open_thread(rt.ctx());
    rt.block_on(async move { insert_rows(&dtx, 0..50, |k| k).await });
    let first = GlobalAddr::from_raw(get(&mut rt, db.table(0).base[0]));
    let second = get(&mut rt, first);
    assert_ne!(second, 0, "50 keys need a second overflow bucket");
    // The first overflow bucket now links to itself.
    put(&mut rt, first, first.raw());
    match read_fresh(&mut rt, &t, &db, 999) {
        Err(TxnError::Dtx(DtxError::Corrupt(m))) => assert!(m.contains("does not end"), "{m}"),
        other => panic!("expected a chain that does not end, got {other:?}"),
    }
    let m = corrupt_message(audit_of(rt.ctx(), db.clone(), &mut rt));
    assert!(m.contains("does not end"), "{m}");
    put(&mut rt, first, second);
    assert_eq!(read_fresh(&mut rt, &t, &db, 49).unwrap(), 49);
    reg.close(&*t).unwrap();
}

/// Updates `key` (8-byte values) to `value` on a new compute blade.
fn update_fresh(rt: &mut Runtime, t: &Arc<dyn Transport>, db: &Arc<Db>, key: u64, value: u64) -> Result<(), TxnError> {
    on_fresh(rt, t, db, |dtx| async move {
        let mut tx = dtx.txn(0);
        tx.begin();
        let i = tx.update(0, key);
        tx.execute().await?;
        tx.write(i, &value.to_le_bytes());
        tx.commit().await
    })
}

#[test]
fn damaged_lock_words_that_no_compute_blade_can_hold_are_released_and_no_other() {
    use ford_dtx::layout::{slot_offset, Owner, LOCK};
    use ford_dtx::recovery::release_orphans;

    let (b, mut rt, db, reg) = chained("orphans");
    let t: Arc<dyn Transport> = b.transport.clone();
    // Keys 0..22 fill the home bucket in order, 22..30 its overflow bucket.
    let home = db.table(0).base[0];
    let overflow = GlobalAddr::from_raw(get(&mut rt, home));
    let lock_of = |key: u64| match key {
        0..22 => home.add(slot_offset(8, key as usize) + LOCK),
        _ => overflow.add(slot_offset(8, key as usize - 22) + LOCK),
    };
    let live = reg.slot();
    // A compute blade that died a moment ago: its lease still runs.
    let dead = join(&t, &db);
    let dead_slot = dead.slot();
    drop(dead);
    let owner = |blade, thread| Owner { blade, thread, coroutine: 0 };
    let words = [
        (0, 0xdead_beef_0000_u64, true),              // not a lock word (LOCKED clear)
        (1, owner(200, 0).lock_word(5), true),        // a slot nobody holds
        (2, owner(live, 7).lock_word(5), true),       // a thread the live blade does not have
        (25, owner(live, 0).lock_word(9), false),     // could be the live blade's (in the chain)
        (3, owner(dead_slot, 0).lock_word(2), false), // the dead blade's: recovery's
    ];
    for (key, w, _) in words {
        put(&mut rt, lock_of(key), w);
    }
    // What damage did: the row cannot be written, and the audit counts it.
    match update_fresh(&mut rt, &t, &db, 1, 11) {
        Err(TxnError::Abort(ford_dtx::Abort::Locked)) => {}
        other => panic!("expected the damaged lock to read as held, got {other:?}"),
    }
    assert_eq!(audit_of(rt.ctx(), db.clone(), &mut rt).unwrap().locks_held, 5);

    let release = |rt: &mut Runtime| {
        let (ctx, d) = (rt.ctx(), db.clone());
        rt.block_on(async move { release_orphans(&ctx, &d).await }).unwrap()
    };
    let o = release(&mut rt);
    assert_eq!((o.held, o.released), (5, 3), "{o:?}");
    let mut shown: Vec<u64> = o.shown.iter().map(|h| h.word).collect();
    shown.sort_unstable();
    let mut want: Vec<u64> = words.iter().filter(|w| w.2).map(|w| w.1).collect();
    want.sort_unstable();
    assert_eq!(shown, want);
    for (key, w, orphan) in words {
        assert_eq!(get(&mut rt, lock_of(key)), if orphan { 0 } else { w }, "key {key}");
    }
    update_fresh(&mut rt, &t, &db, 1, 11).expect("the released row is written again");
    assert_eq!(read_fresh(&mut rt, &t, &db, 1).unwrap(), 11);
    // Again: nothing more to release; the dead blade's lock is recovery's.
    assert_eq!(release(&mut rt).released, 0);
    let (ctx, d) = (rt.ctx(), db.clone());
    let rec = rt.block_on(async move { recover(&ctx, &d, Which::Slot(dead_slot)).await }).unwrap();
    assert_eq!(rec[0].released, 1, "{rec:?}");
    // The live blade's: still held until it releases it.
    assert_eq!(audit_of(rt.ctx(), db.clone(), &mut rt).unwrap().locks_held, 1);
    put(&mut rt, lock_of(25), 0);
    let rep = audit_of(rt.ctx(), db.clone(), &mut rt).unwrap();
    assert_eq!((rep.live[0], rep.locks_held, rep.replica_mismatches, rep.torn), (30, 0, 0, 0));
    reg.close(&*t).unwrap();
}

/// Where copy `replica` (0: the primary) of key `key` of a [`chained`]
/// table is: keys 0..22 in the home bucket, 22..30 in its overflow bucket.
fn copy_at(rt: &mut Runtime, db: &Db, key: u64, replica: usize) -> GlobalAddr {
    let t = db.table(0);
    let (bucket, slot) = match key {
        0..22 => (t.base[replica], key as usize),
        _ => {
            let next = GlobalAddr::from_raw(get(rt, t.base[0]));
            let b = if replica == 0 { next } else { GlobalAddr::from_raw(get(rt, next.add(8 * replica as u64))) };
            (b, key as usize - 22)
        }
    };
    bucket.add(layout::slot_offset(8, slot))
}

fn read_rec(rt: &mut Runtime, at: GlobalAddr) -> Vec<u8> {
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut b = vec![0u8; layout::record_bytes(8)];
        ctx.read(at, &mut b).await.unwrap();
        b
    })
}

fn write_rec(rt: &mut Runtime, at: GlobalAddr, rec: Vec<u8>) {
    let ctx = rt.ctx();
    rt.block_on(async move { ctx.write(at, &rec).await }).unwrap();
}

/// A valid record of key `key` at `version` with `value`, whose primary is
/// at `home` (the lock word 0).
fn rec_of(key: u64, home: GlobalAddr, version: u64, value: u64) -> Vec<u8> {
    let mut rec = vec![0u8; layout::record_bytes(8)];
    layout::encode(&mut rec, 8, 0, key, home, version, 0, layout::state::LIVE, &value.to_le_bytes());
    rec
}

fn repair_with(rt: &mut Runtime, t: &Arc<dyn Transport>, db: &Arc<Db>) -> ford_dtx::repair::Repaired {
    let reg = join(t, db);
    let (ctx, d) = (rt.ctx(), db.clone());
    let (r, reg) = rt.block_on(async move { (ford_dtx::repair::repair(&ctx, &d, &reg).await, reg) });
    reg.close(&**t).unwrap();
    r.unwrap()
}

#[test]
fn damaged_records_are_repaired_from_the_copy_that_wins_and_the_rest_reported() {
    use ford_dtx::layout::{Owner, LOCK, RECORD_HEADER};

    let (b, mut rt, db, reg) = chained("repair");
    let t: Arc<dyn Transport> = b.transport.clone();
    let at = |rt: &mut Runtime, key, r| copy_at(rt, &db, key, r);
    let version = |rec: &[u8]| layout::decode(rec, 8).unwrap().version;
    // Key 3: the primary's copy zeroed (it looks free). Before scans visited
    // every slot, the audit stopped at it and missed the 26 keys after it.
    let p3 = at(&mut rt, 3, 0);
    write_rec(&mut rt, p3, vec![0; LOCK as usize]);
    write_rec(&mut rt, p3.add(RECORD_HEADER as u64), vec![0; layout::record_bytes(8) - RECORD_HEADER]);
    // Key 7: a byte of the backup's value flipped (its CRC fails).
    let b7 = at(&mut rt, 7, 1);
    let mut r = read_rec(&mut rt, b7);
    r[RECORD_HEADER] ^= 0x40;
    write_rec(&mut rt, b7, r);
    // Key 10: the backup holds an older version (as from an old backing file).
    let (p10, b10) = (at(&mut rt, 10, 0), at(&mut rt, 10, 1));
    let v10 = version(&read_rec(&mut rt, p10));
    write_rec(&mut rt, b10, rec_of(10, p10, v10 - 1, 1));
    // Key 12: the primary does.
    let p12 = at(&mut rt, 12, 0);
    let v12 = version(&read_rec(&mut rt, p12));
    write_rec(&mut rt, p12, rec_of(12, p12, v12 - 1, 2));
    // Key 25, in the overflow bucket: the primary's CRC fails.
    let p25 = at(&mut rt, 25, 0);
    let mut r = read_rec(&mut rt, p25);
    r[8] ^= 1;
    write_rec(&mut rt, p25, r);
    // Key 14: the backup holds key 16's record (another slot's).
    let (b14, b16) = (at(&mut rt, 14, 1), at(&mut rt, 16, 1));
    let r16 = read_rec(&mut rt, b16);
    write_rec(&mut rt, b14, r16);
    // Key 15: both copies fail: lost.
    for r in 0..2 {
        let a = at(&mut rt, 15, r);
        put(&mut rt, a.add(RECORD_HEADER as u64), 0xbad);
    }
    // Key 18: both copies valid, of one version, with different values.
    let (p18, b18) = (at(&mut rt, 18, 0), at(&mut rt, 18, 1));
    let v18 = version(&read_rec(&mut rt, p18));
    write_rec(&mut rt, b18, rec_of(18, p18, v18, 7));
    // Key 20: the backup damaged, and the primary locked by a live compute
    // blade's transaction.
    let (p20, b20) = (at(&mut rt, 20, 0), at(&mut rt, 20, 1));
    put(&mut rt, b20.add(16), 12345);
    let held = Owner { blade: reg.slot(), thread: 0, coroutine: 0 }.lock_word(77);
    put(&mut rt, p20.add(LOCK), held);
    // The slot after the last key: the backup's garbage, the primary free.
    let b30 = at(&mut rt, 30, 1);
    put(&mut rt, b30.add(16), 0xfeed);
    // Key 9: the backup's lock word (a backup's is always 0).
    let b9 = at(&mut rt, 9, 1);
    put(&mut rt, b9.add(LOCK), 0x1234);
    // Key 11: the primary's trailer, between its state and its CRC (bytes
    // the CRC does not cover).
    let p11 = at(&mut rt, 11, 0);
    let trailer = p11.add(RECORD_HEADER as u64 + 8);
    let w = get(&mut rt, trailer);
    put(&mut rt, trailer, w | 1 << 8);
    // A free slot further on: both copies damaged, in other words.
    let (p34, b34) = (at(&mut rt, 34, 0), at(&mut rt, 34, 1));
    put(&mut rt, p34.add(16), 0xabc);
    put(&mut rt, b34.add(RECORD_HEADER as u64), 0xdef);

    let before = audit_of(rt.ctx(), db.clone(), &mut rt).unwrap();
    assert_eq!(
        (before.live[0], before.replica_mismatches, before.torn, before.locks_held, before.gaps),
        (26, 12, 4, 1, 0),
        "keys 3, 11, 15 and 25 read as no row on their primary; 15's copies fail alike: {before:?}"
    );
    // The overflow bucket's link (it has free slots: it is the chain's last).
    let overflow = GlobalAddr::from_raw(get(&mut rt, db.table(0).base[0]));
    put(&mut rt, overflow, NOWHERE);
    corrupt_message(audit_of(rt.ctx(), db.clone(), &mut rt));

    let rep = repair_with(&mut rt, &t, &db);
    assert_eq!(
        (rep.damaged, rep.repaired, rep.copies_rewritten, rep.links_repaired, rep.busy, rep.unrepairable, rep.gaps),
        (13, 10, 11, 1, 1, 2, 0),
        "{rep:?}"
    );
    assert_eq!(get(&mut rt, overflow), 0, "the chain ends at its bucket with free slots");
    let mut why: Vec<(Option<u64>, &str)> = rep.left.iter().map(|l| (l.key, l.why.as_str())).collect();
    why.sort();
    assert_eq!(why.len(), 3, "{why:?}");
    assert!(why[0].0.is_none() && why[0].1.contains("lock is held"), "{why:?}");
    assert!(why[1].0.is_none() && why[1].1.contains("no copy passes"), "{why:?}");
    assert_eq!(why[2].0, Some(18));
    assert!(why[2].1.contains(&format!("version {v18}")), "{why:?}");

    // Each repaired key reads its winner's value; both copies are equal.
    for (key, want) in [(3, 30), (7, 70), (10, 100), (12, 120), (25, 250), (14, 140), (16, 160)] {
        assert_eq!(read_fresh(&mut rt, &t, &db, key).unwrap(), want, "key {key}");
        let (p, b) = (at(&mut rt, key, 0), at(&mut rt, key, 1));
        let (rp, rb) = (read_rec(&mut rt, p), read_rec(&mut rt, b));
        assert_eq!((&rp[..40], &rp[48..]), (&rb[..40], &rb[48..]), "key {key}");
    }
    for (what, a) in [("the tail slot", b30), ("a free slot's primary", p34), ("its backup", b34)] {
        assert_eq!(read_rec(&mut rt, a), vec![0; layout::record_bytes(8)], "{what} made free again");
    }
    assert_eq!(get(&mut rt, b9.add(LOCK)), 0);
    assert_eq!(read_fresh(&mut rt, &t, &db, 11).unwrap(), 110);
    let after = audit_of(rt.ctx(), db.clone(), &mut rt).unwrap();
    assert_eq!(
        (after.live[0], after.replica_mismatches, after.torn, after.locks_held),
        (29, 2, 1, 1),
        "keys 15, 18 and 20 left: {after:?}"
    );
    // Once the lock is released, key 20 is repaired too; 15 and 18 stay.
    put(&mut rt, p20.add(LOCK), 0);
    let rep = repair_with(&mut rt, &t, &db);
    assert_eq!((rep.damaged, rep.repaired, rep.unrepairable), (3, 1, 2), "{rep:?}");
    assert_eq!(read_fresh(&mut rt, &t, &db, 20).unwrap(), 200);

    // A gap: both copies of key 28 zeroed. Key 29 is after it: no search
    // finds it, the audit counts it, and the repair cannot restore the row
    // before it.
    for r in 0..2 {
        let a = at(&mut rt, 28, r);
        write_rec(&mut rt, a, vec![0; layout::record_bytes(8)]);
    }
    let gap = audit_of(rt.ctx(), db.clone(), &mut rt).unwrap();
    assert_eq!(gap.gaps, 1, "{gap:?}");
    match read_fresh(&mut rt, &t, &db, 29) {
        Err(TxnError::Abort(ford_dtx::Abort::NotFound)) => {}
        other => panic!("a search stops at the free slot: {other:?}"),
    }
    let rep = repair_with(&mut rt, &t, &db);
    assert_eq!((rep.gaps, rep.repaired), (1, 0), "{rep:?}");
    assert!(rep.left.iter().any(|l| l.key == Some(29) && l.why.contains("free slot comes before")), "{rep:?}");
    reg.close(&*t).unwrap();
}

#[test]
fn chains_are_kept_on_every_replica_and_a_damaged_link_or_copy_word_repaired_from_the_others() {
    let (b, mut rt, db, reg) = chained("chains");
    let t: Arc<dyn Transport> = b.transport.clone();
    let (home, home1) = (db.table(0).base[0], db.table(0).base[1]);
    let n0 = GlobalAddr::from_raw(get(&mut rt, home));
    let n1 = GlobalAddr::from_raw(get(&mut rt, home1));
    // The backup's chain: its home bucket links to the overflow bucket's
    // copy on its replica, and each copy names the other.
    assert!(!n1.is_null() && n1.blade() == 1, "{n1}");
    assert_eq!((get(&mut rt, n0.add(8)), get(&mut rt, n1.add(8))), (n1.raw(), n0.raw()));
    let clean = |rt: &mut Runtime| {
        let rep = audit_of(rt.ctx(), db.clone(), rt).unwrap();
        assert_eq!((rep.violations(), rep.live[0]), (0, 30), "{rep:?}");
        assert_eq!(read_fresh(rt, &t, &db, 29).unwrap(), 290);
    };
    // Each damage alone, what the audit says of it (None: the database is
    // corrupt; else the backup chain words that differ and are missing),
    // then the repair: (word, damage, audit, repaired, filled).
    let cases = [
        ("the full home bucket's primary link, naming no blade", home, NOWHERE, None, 1, 0),
        ("the same link zeroed (a search then ends there)", home, 0, Some((1, 0)), 1, 0),
        ("the overflow primary's word naming its backup", n0.add(8), NOWHERE, None, 1, 0),
        ("the backup's link", home1, NOWHERE, Some((1, 0)), 1, 0),
        ("the backup overflow's word naming its primary", n1.add(8), 12345, Some((1, 0)), 1, 0),
        ("the backup's link out of the chain's last bucket, naming no blade", n1, NOWHERE, Some((1, 0)), 1, 0),
        ("the backup's link missing (a database of before, or a cut extension)", home1, 0, Some((0, 1)), 0, 1),
    ];
    for (what, at, w, audit, repaired, filled) in cases {
        put(&mut rt, at, w);
        match audit_of(rt.ctx(), db.clone(), &mut rt) {
            Ok(a) => assert_eq!(Some((a.chain_words.differ, a.chain_words.missing)), audit, "{what}: {a:?}"),
            Err(DtxError::Corrupt(_)) => assert_eq!(audit, None, "{what}"),
            Err(e) => panic!("{what}: {e}"),
        }
        let rep = repair_with(&mut rt, &t, &db);
        assert_eq!(
            (rep.links_repaired, rep.links_filled, rep.chains_cut, rep.damaged, rep.left_damaged()),
            (repaired, filled, 0, 0, 0),
            "{what}: {rep:?}"
        );
        clean(&mut rt);
        assert_eq!((get(&mut rt, home), get(&mut rt, home1)), (n0.raw(), n1.raw()), "{what}");
        assert_eq!((get(&mut rt, n0.add(8)), get(&mut rt, n1.add(8))), (n1.raw(), n0.raw()), "{what}");
        assert_eq!(get(&mut rt, n1), 0, "{what}: the chain ends there on the backup too");
    }
    // A database made before chains were kept on every replica: the backup
    // neither links nor names.
    put(&mut rt, home1, 0);
    put(&mut rt, n1.add(8), 0);
    let rep = repair_with(&mut rt, &t, &db);
    assert_eq!((rep.links_repaired, rep.links_filled, rep.left_damaged()), (0, 2, 0), "{rep:?}");
    assert_eq!((get(&mut rt, home1), get(&mut rt, n1.add(8))), (n1.raw(), n0.raw()));
    // Both links of the full bucket: nothing says where the chain went on.
    // (The backup's, naming no bucket, is cleared; the chain is cut.)
    put(&mut rt, home, NOWHERE);
    put(&mut rt, home1, NOWHERE);
    let rep = repair_with(&mut rt, &t, &db);
    assert_eq!((rep.links_repaired, rep.chains_cut), (1, 1), "{rep:?}");
    assert_eq!(get(&mut rt, home1), 0);
    assert!(rep.left[0].why.contains("the next bucket after"), "{rep:?}");
    reg.close(&*t).unwrap();
}
