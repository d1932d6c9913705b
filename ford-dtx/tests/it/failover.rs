//! A backup promoted while a memory blade is out of the configuration
//! (`Db::without`): transactions go on over the other blades and leave the
//! lost one untouched; the transactions of the earlier view are settled
//! first (`recovery::settle`), wherever they died; a rebuild of the lost
//! blade from the promoted copies then leaves a database whose audit is
//! clean.

use std::sync::Arc;

use ford_dtx::db::Db;
use ford_dtx::recovery::settle;
use ford_dtx::Registration;
use smart_core::{Ctx, GlobalAddr, Runtime, Transport};
use smart_testkit::backends;
use smart_testkit::die::Die;

use crate::{insert_one, join, open, spec, u};

const ACCOUNTS: u64 = 6;
const START: u64 = 1_000;

/// Three embedded blades with database `name` of three tables of 8-byte
/// values, k = 2 (table i on blades i and i + 1 mod 3: blade 1 holds table
/// 0's backup and table 1's primary), rows `rows` (table, key) at START
/// (inserted by a registration closed since): the transport (keep it: it
/// holds the blades), a runtime and the database.
fn three_tables(name: &str, rows: impl IntoIterator<Item = (u32, u64)>) -> (Arc<dyn Transport>, Runtime, Arc<Db>) {
    let t: Arc<dyn Transport> = backends::embedded(3).transport;
    let (mut rt, db, first) = open(&t, &spec(name, &[8, 8, 8], 16, 2), 1, 1);
    let dtx = first.open_thread(rt.ctx());
    let rows: Vec<_> = rows.into_iter().collect();
    rt.block_on(async move {
        for (table, key) in rows {
            insert_one(&dtx, table, key, START).await.unwrap();
        }
    });
    first.close(&*t).unwrap();
    (t, rt, db)
}

/// Every (table, key) of the three tables' `0..ACCOUNTS`.
fn accounts() -> impl Iterator<Item = (u32, u64)> {
    (0..3).flat_map(|table| (0..ACCOUNTS).map(move |k| (table, k)))
}

/// Every bucket array on blade `b` (the copies a failover of `b` must not
/// touch), as bytes.
async fn arrays_on(ctx: &Ctx, db: &Db, b: u16) -> Vec<(GlobalAddr, Vec<u8>)> {
    let mut out = Vec::new();
    for t in &db.tables {
        for r in (0..db.replicas).filter(|r| t.base[*r].blade() == b) {
            let mut bytes = vec![0u8; (t.buckets * t.bucket_bytes()) as usize];
            ctx.read_all(t.base[r], &mut bytes).await.unwrap();
            out.push((t.base[r], bytes));
        }
    }
    out
}

/// A transfer of 7 from `(ta, a)` to `(tb, b)`.
async fn transfer(dtx: &ford_dtx::Dtx, (ta, a): (u32, u64), (tb, b): (u32, u64)) -> Result<(), ford_dtx::TxnError> {
    let mut tx = dtx.txn(0);
    tx.begin();
    let (x, y) = (tx.update(ta, a), tx.update(tb, b));
    tx.execute().await?;
    let (vx, vy) = (u(tx.value(x)), u(tx.value(y)));
    tx.write(x, &(vx - 7).to_le_bytes());
    tx.write(y, &(vy + 7).to_le_bytes());
    tx.commit().await
}

/// `n` transfers across the three tables, then the sum of every balance
/// (each read in a transaction of its own).
async fn transfers_then_sum(dtx: &ford_dtx::Dtx, n: u64) -> u64 {
    for i in 0..n {
        let (ta, tb) = ((i % 3) as u32, ((i + 1) % 3) as u32);
        transfer(dtx, (ta, i % ACCOUNTS), (tb, (i * 5 + 1) % ACCOUNTS)).await.unwrap();
    }
    let mut sum = 0;
    for table in 0..3 {
        for k in 0..ACCOUNTS {
            sum += crate::read_one(dtx, table, k).await.unwrap();
        }
    }
    sum
}

/// The lost blade's copies written again from the others (zeroed first, as
/// a fresh blade's), then the whole database audited: no violation, and
/// the sum of every balance.
async fn rebuild_and_audit(ctx: &Ctx, db: &Db, lost: u16, what: &str) -> (u64, ford_dtx::rebuild::Rebuilt) {
    for (at, bytes) in arrays_on(ctx, db, lost).await {
        ctx.write_all(at, &vec![0u8; bytes.len()]).await.unwrap();
    }
    let rebuilt = ford_dtx::rebuild::rebuild(ctx, db, &[lost]).await.unwrap();
    let sum = crate::audited(ctx, db, what).await;
    (sum, rebuilt)
}

#[test]
fn transactions_go_on_with_a_backup_promoted_and_leave_the_lost_blade_untouched() {
    let (t, mut rt, db) = three_tables("promote", accounts());
    let (ctx, d) = (rt.ctx(), db.clone());
    let before = rt.block_on(async move { arrays_on(&ctx, &d, 1).await });
    assert!(db.without(&[0]).is_err(), "blade 0 holds the registry");
    let view = Arc::new(db.without(&[1]).unwrap());
    assert_eq!((view.table(1).order[0], view.table(1).live, view.table(0).live), (1, 1, 1));
    assert_eq!((view.table(2).order, view.table(2).live), ([0, 1, 2, 3], 2), "table 2 keeps both");
    let reg = Registration::register(t.clone(), view.clone(), 1, 1, std::time::Duration::from_secs(30)).unwrap();
    assert!(reg.info.logs.iter().all(|l| l.is_null() || l.blade() != 1), "no undo log copy on the lost blade");
    let dtx = reg.open_thread(rt.ctx());
    let (ctx, d) = (rt.ctx(), db.clone());
    rt.block_on(async move {
        // Reads through the promoted copies see the writes.
        assert_eq!(transfers_then_sum(&dtx, 30).await, 3 * ACCOUNTS * START);
        assert!(arrays_on(&ctx, &d, 1).await == before, "a copy on the lost blade was written");
        // Inserts that fill table 1's chains (2 buckets of 22 slots): its
        // new overflow buckets have no copy on the lost blade.
        for k in 100..160 {
            insert_one(&dtx, 1, k, 0).await.unwrap();
        }
        assert!(dtx.stats().chains_extended > 0, "the chains grew");
        for k in (100..160).step_by(7) {
            assert_eq!(crate::read_one(&dtx, 1, k).await, Some(0));
        }
        transfer(&dtx, (1, 150), (1, 0)).await.unwrap();
        transfer(&dtx, (1, 0), (1, 150)).await.unwrap();
        assert!(arrays_on(&ctx, &d, 1).await == before, "a copy on the lost blade was written");
    });
    reg.close(&*t).unwrap();
    let (ctx, d) = (rt.ctx(), db.clone());
    let (sum, rebuilt) = rt.block_on(async move { rebuild_and_audit(&ctx, &d, 1, "after the promoted run").await });
    assert_eq!(sum, 3 * ACCOUNTS * START, "money conserved through the promotion and the rebuild");
    assert!(rebuilt.added > 0, "the buckets added without blade 1 get a copy there: {rebuilt:?}");
}

#[test]
fn a_transaction_cut_short_by_a_failover_is_settled_before_the_next_epoch() {
    // Across tables 1 (its primary on the lost blade) and 2; and within
    // table 1 alone (every primary lost: decided by the promoted copies).
    for (from, to) in [((1, 2), (2, 3)), ((1, 2), (1, 4))] {
        cut_short_by_failover(from, to);
    }
}

fn cut_short_by_failover(from: (u32, u64), to: (u32, u64)) {
    let mut outcomes = [0u32; 2];
    for polls in 1..14 {
        let (t, mut rt, db) = three_tables("settle", accounts());
        // The earlier epoch's compute blade dies in a transfer between
        // table 1 (primary on blade 1, which is lost) and table 2.
        let old = join(&t, &db);
        let nonce = old.fence_tag();
        let dtx = old.open_thread(rt.ctx());
        let died = rt.block_on(Die::after(polls, async move { transfer(&dtx, from, to).await }));
        drop(old);
        let view = Arc::new(db.without(&[1]).unwrap());
        let (ctx, v) = (rt.ctx(), view.clone());
        let rec = rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
        let what = format!(
            "{from:?} to {to:?}, died after {polls} polls ({})",
            if died.is_some() { "finished" } else { "cut short" }
        );
        assert_eq!(rec.len(), 1, "{what}: {rec:?}");
        // A compute blade of the promoted view dies the same way (its locks
        // on the promoted primaries), and is settled as well.
        let again = Registration::register(t.clone(), view.clone(), 1, 1, std::time::Duration::from_secs(30)).unwrap();
        let nonce = again.fence_tag();
        let dtx = again.open_thread(rt.ctx());
        let died_again = rt.block_on(Die::after(polls, async move { transfer(&dtx, from, to).await }));
        drop(again);
        let (ctx, v) = (rt.ctx(), view.clone());
        let rec = rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
        assert_eq!(rec.len(), 1, "{what}, then in the promoted view: {rec:?}");
        // The next epoch: no lock of the dead transactions is left on a
        // primary in use, and each one's effect is wholly there or wholly
        // not.
        let reg = Registration::register(t.clone(), view.clone(), 1, 1, std::time::Duration::from_secs(30)).unwrap();
        let dtx = reg.open_thread(rt.ctx());
        let got = rt.block_on(async move {
            let a = crate::read_one(&dtx, from.0, from.1).await.unwrap();
            let c = crate::read_one(&dtx, to.0, to.1).await.unwrap();
            transfer(&dtx, to, from).await.unwrap();
            (a, c)
        });
        let n = (START - got.0) / 7;
        assert!(got.0 <= START && n <= 2 && got == (START - 7 * n, START + 7 * n), "{what}: {got:?}");
        outcomes[usize::from(n > 0)] += 1;
        let acknowledged = u64::from(died.is_some()) + u64::from(died_again.is_some());
        assert!(n >= acknowledged, "{what}: an acknowledged transfer was lost ({got:?})");
        reg.close(&*t).unwrap();
        let (ctx, d) = (rt.ctx(), db.clone());
        let w = what.clone();
        let (sum, _) = rt.block_on(async move { rebuild_and_audit(&ctx, &d, 1, &w).await });
        assert_eq!(sum, 3 * ACCOUNTS * START, "{what}");
    }
    // Both outcomes happened (deaths before the log, and after the writes).
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[test]
fn a_settling_that_another_compute_blade_holds_is_waited_for_and_taken_over_once_its_hold_ran_out() {
    use ford_dtx::layout::registry::RECOVERING;
    let (t, mut rt, db) = three_tables("takeover", []);
    let old = join(&t, &db);
    let (nonce, slot) = (old.fence_tag(), old.slot());
    drop(old);
    let view = Arc::new(db.without(&[1]).unwrap());
    let (ctx, v) = (rt.ctx(), view.clone());
    rt.block_on(async move {
        let at = v.registry_slot(slot);
        let now = ford_dtx::registry::now_ms(&ctx);
        // Another compute blade began settling it, and holds it.
        assert_eq!(ctx.cas(at, nonce, nonce | RECOVERING).await.unwrap(), nonce);
        ctx.write(at.add(8), &(now + ford_dtx::recovery::HOLD_MS).to_le_bytes()).await.unwrap();
        let e = settle(&ctx, &v, &[nonce], 300).await.unwrap_err();
        assert!(e.to_string().contains("still claimed"), "{e}");
        // It died: its hold ran out. The settling is taken over.
        ctx.write(at.add(8), &(now - ford_dtx::recovery::GRACE_MS - 1).to_le_bytes()).await.unwrap();
        let rec = settle(&ctx, &v, &[nonce], 5_000).await.unwrap();
        assert_eq!(rec.iter().map(|r| r.slot).collect::<Vec<_>>(), [slot]);
        let s = ford_dtx::registry::slots(&ctx, &v).await.unwrap();
        assert_eq!(s.iter().find(|s| s.slot == slot).unwrap().claim, 0, "freed");
    });
}

#[test]
fn a_transaction_cut_short_in_a_bucket_added_without_the_blade_is_settled_where_its_copies_are() {
    // Table 1's primary (replica 0) is on the lost blade 1: buckets added
    // without it have no copy there, and transactions in them name none.
    for polls in 1..14 {
        let (t, mut rt, db) = three_tables("added", []);
        let view = Arc::new(db.without(&[1]).unwrap());
        let reg = Registration::register(t.clone(), view.clone(), 1, 1, std::time::Duration::from_secs(30)).unwrap();
        let dtx = reg.open_thread(rt.ctx());
        let (ctx, v) = (rt.ctx(), view.clone());
        // Keys of table 1 in overflow buckets (past its array), and the
        // first 2 KiB of blade 0 (its superblock and roots).
        let (keys, head) = rt.block_on(async move {
            for k in 0..70 {
                insert_one(&dtx, 1, k, START).await.unwrap();
            }
            let t1 = v.table(1);
            let array = t1.vbase[0].offset()..t1.vbase[0].offset() + t1.buckets * t1.bucket_bytes();
            let mut keys = Vec::new();
            ford_dtx::recovery::scan(&ctx, &t1.primary_only(), 1, |s| {
                if !array.contains(&s.at[0].offset()) {
                    keys.push(ford_dtx::layout::key_of(s.recs[0]).0);
                }
            })
            .await
            .unwrap();
            let mut head = vec![0u8; 2048];
            ctx.read(GlobalAddr::new(0, 0), &mut head).await.unwrap();
            (keys, head)
        });
        assert!(keys.len() >= 2, "keys in added buckets: {keys:?}");
        reg.close(&*t).unwrap();
        let dying = Registration::register(t.clone(), view.clone(), 1, 1, std::time::Duration::from_secs(30)).unwrap();
        let nonce = dying.fence_tag();
        let dtx = dying.open_thread(rt.ctx());
        let (x, y) = ((1, keys[0]), (1, keys[1]));
        let died = rt.block_on(Die::after(polls, async move { transfer(&dtx, x, y).await }));
        drop(dying);
        let (ctx, v) = (rt.ctx(), view.clone());
        let (rec, after) = rt.block_on(async move {
            let rec = settle(&ctx, &v, &[nonce], 5_000).await.unwrap();
            let mut after = vec![0u8; 2048];
            ctx.read(GlobalAddr::new(0, 0), &mut after).await.unwrap();
            (rec, after)
        });
        let what = format!("died after {polls} polls ({})", if died.is_some() { "finished" } else { "cut short" });
        assert!(after == head, "{what}: the settling wrote into blade 0's superblock or roots: {rec:?}");
        let (ctx, d) = (rt.ctx(), db.clone());
        let w = what.clone();
        let (sum, rebuilt) = rt.block_on(async move { rebuild_and_audit(&ctx, &d, 1, &w).await });
        assert_eq!(sum, 70 * START, "{what}");
        assert!(rebuilt.added > 0, "{what}: {rebuilt:?}");
    }
}

#[test]
fn a_transaction_that_failed_its_validation_is_not_rolled_back_over_later_commits() {
    let (t, mut rt, db) = three_tables("voided", [(0, 5), (1, 0), (1, 3)]);
    // A reads (0, 5) and updates (1, 0) and (1, 3), whose primaries are on
    // blade 1; B changes (0, 5) under it, so A's validation fails after its
    // log entry landed; then C adds 10 to (1, 0). A's compute blade dies.
    let (a, other) = (join(&t, &db), join(&t, &db));
    let nonce = a.fence_tag();
    let (da, db_) = (a.open_thread(rt.ctx()), other.open_thread(rt.ctx()));
    rt.block_on(async move {
        let mut ta = da.txn(0);
        ta.begin();
        let _ = ta.read(0, 5);
        let (x, y) = (ta.update(1, 0), ta.update(1, 3));
        ta.execute().await.unwrap();
        ta.write(x, &(START + 1).to_le_bytes());
        ta.write(y, &(START + 1).to_le_bytes());
        let mut tb = db_.txn(0);
        tb.begin();
        let z = tb.update(0, 5);
        tb.execute().await.unwrap();
        tb.write(z, &(START + 1).to_le_bytes());
        tb.commit().await.unwrap();
        assert_eq!(crate::abort_of(ta.commit().await), ford_dtx::Abort::Validation);
        tb.begin();
        let w = tb.update(1, 0);
        tb.execute().await.unwrap();
        let v = u(tb.value(w));
        tb.write(w, &(v + 10).to_le_bytes());
        tb.commit().await.unwrap();
    });
    drop(a);
    other.close(&*t).unwrap();
    // Blade 1 lost: A's entry names only lost primaries; its surviving
    // copy of (1, 3) still has the old version.
    let view = Arc::new(db.without(&[1]).unwrap());
    let (ctx, v) = (rt.ctx(), view.clone());
    rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
    let reg = join(&t, &view);
    let dtx = reg.open_thread(rt.ctx());
    let got = rt.block_on(async move { (crate::read_one(&dtx, 1, 0).await, crate::read_one(&dtx, 1, 3).await) });
    assert_eq!(got, (Some(START + 10), Some(START)), "C's commit was undone");
    reg.close(&*t).unwrap();
}

/// Blade 0 out (blade 1 standing for it through its mirror), the lost
/// copies zeroed as a fresh blade's and the registry and catalog written
/// back from that mirror, as `compute-blade rebuild --lost 0` does; then
/// the copies rebuilt, the dead compute blades recovered, and the whole
/// database audited: the sum of every balance.
async fn rebuild_blade0_and_audit(ctx: &Ctx, db: &Db, what: &str) -> u64 {
    for (at, bytes) in arrays_on(ctx, db, 0).await {
        ctx.write_all(at, &vec![0u8; bytes.len()]).await.unwrap();
    }
    let registry = vec![0u8; (ford_dtx::layout::registry::SLOTS * ford_dtx::layout::registry::SLOT) as usize];
    ctx.write_all(db.registry, &registry).await.unwrap();
    let m = ford_dtx::mirror::list(ctx, 1).await.unwrap().into_iter().find(|m| m.db.name == db.name).unwrap();
    ford_dtx::mirror::restore(ctx, &m).await.unwrap();
    ford_dtx::rebuild::rebuild(ctx, db, &[0]).await.unwrap();
    ford_dtx::recovery::recover_after_loss(ctx, db, &[0], ford_dtx::recovery::Which::Expired).await.unwrap();
    crate::audited(ctx, db, what).await
}

#[test]
fn without_blade_0_its_mirror_stands_for_the_catalog_and_the_registry() {
    use ford_dtx::layout::{mirror, registry};
    // Transfers between table 0 (its primary on blade 0) and table 2 (its
    // backup there), cut short at several points.
    let mut outcomes = [0u32; 2];
    for polls in [2, 5, 8, 11] {
        let (t, mut rt, db) = three_tables("blade0", accounts());
        let old = join(&t, &db);
        let nonce = old.fence_tag();
        let dtx = old.open_thread(rt.ctx());
        let died = rt.block_on(Die::after(polls, async move { transfer(&dtx, (0, 1), (2, 4)).await }));
        drop(old);
        let what = format!("died after {polls} polls ({})", if died.is_some() { "finished" } else { "cut short" });
        let (ctx, d) = (rt.ctx(), db.clone());
        let (view, before) = rt.block_on(async move {
            let before = arrays_on(&ctx, &d, 0).await;
            (Db::open_view(&ctx, "blade0", &[0], &[]).await.unwrap().unwrap(), before)
        });
        let view = Arc::new(view);
        let m = view.mirror.expect("opened from the mirror");
        assert_eq!((m.blade(), view.registry), (1, m.add(mirror::REGISTRY as u64)), "{what}");
        assert_eq!((view.table(0).vbase[0].blade(), view.table(0).live), (1, 1), "{what}: table 0's backup promoted");
        assert!(view.without(&[0]).is_ok() && db.view(&[0], &[]).is_err(), "only a view opened from a mirror");
        // The earlier epoch's registration, in the mirror, is settled there.
        let (ctx, v) = (rt.ctx(), view.clone());
        let rec = rt.block_on(async move { settle(&ctx, &v, &[nonce], 5_000).await }).unwrap();
        assert_eq!(rec.len(), 1, "{what}: {rec:?}");
        // A registration in the mirror: no undo log copy on blade 0, a lease
        // length in place of an expiry, never renewed.
        let lease = std::time::Duration::from_millis(400);
        let reg = Registration::register(t.clone(), view.clone(), 1, 1, lease).unwrap();
        assert!(reg.info.logs.iter().all(|l| l.is_null() || l.blade() != 0), "{what}");
        let second = view.registry_slot(reg.slot()).add(8);
        std::thread::sleep(lease * 2);
        assert!(!reg.lease_lost(), "{what}: nothing renews, nothing expires");
        let dtx = reg.open_thread(rt.ctx());
        let (ctx, d, what2) = (rt.ctx(), db.clone(), what.clone());
        let n = rt.block_on(async move {
            let what = what2;
            assert_eq!(ctx.read_u64(second).await.unwrap(), 400, "{what}: the lease's length, not renewed");
            // The transfer cut short is wholly there or wholly not.
            let (a, c) = (crate::read_one(&dtx, 0, 1).await.unwrap(), crate::read_one(&dtx, 2, 4).await.unwrap());
            let n = (START - a) / 7;
            assert!(n <= 1 && (a, c) == (START - 7 * n, START + 7 * n), "{what}: {a} {c}");
            assert_eq!(transfers_then_sum(&dtx, 24).await, 3 * ACCOUNTS * START, "{what}");
            assert!(arrays_on(&ctx, &d, 0).await == before, "{what}: a copy on blade 0 was written");
            n
        });
        outcomes[usize::from(n > 0)] += 1;
        assert!(n >= u64::from(died.is_some()), "{what}: an acknowledged transfer was lost");
        // A compute blade of this view dies mid-transfer too: settled in
        // the mirror, its slot freed there and in the other mirror.
        let dying = Registration::register(t.clone(), view.clone(), 1, 1, lease).unwrap();
        let (nonce, slot) = (dying.fence_tag(), dying.slot());
        let dtx = dying.open_thread(rt.ctx());
        rt.block_on(Die::after(polls, async move { transfer(&dtx, (0, 2), (1, 3)).await }));
        drop(dying);
        reg.close(&*t).unwrap();
        let (ctx, v, w) = (rt.ctx(), view.clone(), what.clone());
        rt.block_on(async move {
            let what = w;
            assert_eq!(settle(&ctx, &v, &[nonce], 5_000).await.unwrap().len(), 1, "{what}");
            let other = ford_dtx::mirror::find(&ctx, 2, "blade0").await.unwrap().unwrap();
            let off = mirror::REGISTRY as u64 + u64::from(slot) * registry::SLOT;
            let claims =
                (ctx.read_u64(v.registry_slot(slot)).await.unwrap(), ctx.read_u64(other.add(off)).await.unwrap());
            assert_eq!(claims, (0, 0), "{what}: the slot freed in both mirrors");
        });
        let (ctx, d) = (rt.ctx(), db.clone());
        let w = what.clone();
        let sum = rt.block_on(async move { rebuild_blade0_and_audit(&ctx, &d, &w).await });
        assert_eq!(sum, 3 * ACCOUNTS * START, "{what}: money conserved through blade 0's failover and rebuild");
    }
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "both outcomes of the first transfer: {outcomes:?}");
}
