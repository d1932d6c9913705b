//! The mirrors on the other blades of what only blade 0 holds: the catalog,
//! the load mark and every registration that may hold a lock.

use std::sync::Arc;
use std::time::Duration;

use ford_dtx::mirror::{self, Mirror};
use ford_dtx::recovery::{recover, Which};
use ford_dtx::Registration;
use smart_core::{Ctx, Runtime, Transport};
use smart_testkit::backends;

use crate::{open, spec};

/// The one mirror on each blade but blade 0, all saying the same: the one
/// on blade 1.
fn the_mirror(rt: &mut Runtime) -> Mirror {
    let ctx = rt.ctx();
    let mut each = rt
        .block_on(async move {
            let mut each = Vec::new();
            for b in mirror::blades(&ctx) {
                each.push(mirror::list(&ctx, b).await?);
            }
            Ok::<_, ford_dtx::DtxError>(each)
        })
        .unwrap();
    assert!(!each.is_empty());
    for all in &each {
        assert_eq!(all.len(), 1, "{all:?}");
        let (a, b) = (&all[0], &each[0][0]);
        assert_eq!((&a.db, a.catalog_at, a.loaded, claimed(a)), (&b.db, b.catalog_at, b.loaded, claimed(b)));
    }
    each.remove(0).remove(0)
}

/// The claimed slots of a mirror: (slot, claim, lease ms, log area copies).
fn claimed(m: &Mirror) -> Vec<(u16, u64, u64, [smart_core::GlobalAddr; 4])> {
    m.slots.iter().filter(|s| s.claim != 0).map(|s| (s.slot, s.claim, s.expiry_ms, s.logs)).collect()
}

#[test]
fn the_mirror_follows_the_catalog_the_load_and_every_registration() {
    let b = backends::embedded(3);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, live) = open(&t, &spec("mirrored", &[8, 16], 64, 2), 1, 2);
    let m = the_mirror(&mut rt);
    assert_eq!(m.db, *db, "the catalog's copy is the catalog");
    assert!(!m.loaded);
    assert_eq!(claimed(&m), vec![(live.slot(), live.info.claim, 30_000, live.info.logs)], "the live registration");
    let ctx = rt.ctx();
    let d = db.clone();
    rt.block_on(async move { d.mark_loaded(&ctx).await }).unwrap();
    assert!(the_mirror(&mut rt).loaded, "the load mark");
    // A clean exit clears its slot's copy.
    let other = Registration::register(t.clone(), db.clone(), 1, 1, Duration::from_millis(300)).unwrap();
    assert_eq!(claimed(&the_mirror(&mut rt)).len(), 2);
    other.close(&*t).unwrap();
    assert_eq!(claimed(&the_mirror(&mut rt)).len(), 1, "closed: cleared");
    // A dead one's stays until recovery frees its slot.
    let dead = Registration::register(t.clone(), db.clone(), 1, 1, Duration::from_millis(300)).unwrap();
    let dead_slot = dead.slot();
    drop(dead);
    assert!(claimed(&the_mirror(&mut rt)).iter().any(|c| c.0 == dead_slot), "dead, not yet recovered");
    std::thread::sleep(Duration::from_millis(300 + ford_dtx::recovery::GRACE_MS + 200));
    let (ctx, d) = (rt.ctx(), db.clone());
    let rec = rt.block_on(async move { recover(&ctx, &d, Which::Expired).await }).unwrap();
    assert_eq!(rec.len(), 1);
    assert_eq!(claimed(&the_mirror(&mut rt)).len(), 1, "recovered: cleared");
    assert_eq!(claimed(&the_mirror(&mut rt))[0].0, live.slot(), "the live one stays");
    live.close(&*t).unwrap();
}

#[test]
fn a_database_without_a_mirror_gets_one_with_its_live_registrations() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, live) = open(&t, &spec("older", &[8], 16, 2), 1, 1);
    // As a database made before mirrors were kept.
    let ctx: Ctx = rt.ctx();
    let d = db.clone();
    let written = rt.block_on(async move {
        ctx.drop_root(1, "ford:older").await.unwrap();
        assert_eq!(mirror::find(&ctx, 1, "older").await.unwrap(), None);
        let w = mirror::ensure(&ctx, &d).await.unwrap();
        (w, mirror::ensure(&ctx, &d).await.unwrap())
    });
    assert_eq!(written, (true, false), "written once");
    let m = the_mirror(&mut rt);
    let c = claimed(&m);
    assert_eq!((c.len(), c[0].0, c[0].1, c[0].3), (1, live.slot(), live.info.claim, live.info.logs));
    assert!((1..=30_000).contains(&c[0].2), "the time its lease has left: {}", c[0].2);
    live.close(&*t).unwrap();
}

#[test]
fn a_database_over_one_blade_has_no_mirror() {
    let b = backends::embedded(1);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, live) = open(&t, &spec("alone", &[8], 16, 1), 1, 1);
    let ctx = rt.ctx();
    let d = db.clone();
    assert!(mirror::blades(&ctx).is_empty());
    let c = rt.block_on(async move { mirror::ensure(&ctx, &d).await }).unwrap();
    assert!(!c, "none written");
    let (ctx, d) = (rt.ctx(), db.clone());
    let c = rt.block_on(async move { mirror::check(&ctx, &d).await }).unwrap();
    assert_eq!((c.present, c.violations()), (None, 0));
    live.close(&*t).unwrap();
}

#[test]
fn the_audit_finds_a_wrong_mirror_and_a_rewrite_mends_it() {
    let b = backends::embedded(2);
    let t: Arc<dyn Transport> = b.transport.clone();
    let (mut rt, db, live) = open(&t, &spec("checked", &[8], 16, 2), 1, 1);
    let ctx = rt.ctx();
    let d = db.clone();
    let nonce = live.info.claim;
    let slot = u64::from(live.slot());
    rt.block_on(async move {
        let audit = |ctx: Ctx, d: Arc<ford_dtx::db::Db>| async move {
            ford_dtx::recovery::audit(&ctx, &d, |_, _, _| {}).await.unwrap()
        };
        let clean = audit(ctx.clone(), d.clone()).await;
        assert_eq!((clean.mirror.present, clean.violations()), (Some(true), 0), "{clean:?}");
        let at = mirror::find(&ctx, 1, &d.name).await.unwrap().unwrap();
        let reg = at.add(ford_dtx::layout::mirror::REGISTRY as u64 + slot * ford_dtx::layout::registry::SLOT);
        // A word of the catalog's copy, and the live registration's copy.
        ctx.write(at.add(ford_dtx::layout::mirror::CATALOG as u64 + 8), &7u64.to_le_bytes()).await.unwrap();
        ctx.write(reg, &0u64.to_le_bytes()).await.unwrap();
        let bad = audit(ctx.clone(), d.clone()).await;
        assert!(bad.mirror.catalog_differs, "{bad:?}");
        assert_eq!((bad.mirror.registrations_missing, bad.violations()), (1, 2), "{bad:?}");
        assert!(mirror::rewrite(&ctx, &d).await.unwrap());
        let at2 = mirror::find(&ctx, 1, &d.name).await.unwrap().unwrap();
        assert_ne!(at2, at, "a new mirror");
        assert_eq!(
            ctx.read_u64(at2.add(ford_dtx::layout::mirror::REGISTRY as u64 + slot * ford_dtx::layout::registry::SLOT))
                .await
                .unwrap(),
            nonce
        );
        assert_eq!(audit(ctx.clone(), d.clone()).await.violations(), 0);
        // A mirror whose root names no mirror is damaged: replaced.
        ctx.write(at2, &0u64.to_le_bytes()).await.unwrap();
        let damaged = mirror::check(&ctx, &d).await.unwrap();
        assert!(damaged.catalog_differs && damaged.violations() == 1, "{damaged:?}");
        assert!(mirror::ensure(&ctx, &d).await.unwrap(), "replaced");
        assert_eq!(mirror::check(&ctx, &d).await.unwrap().violations(), 0);
        // Without a mirror: no violation, but the audit says so.
        ctx.drop_root(1, "ford:checked").await.unwrap();
        let none = audit(ctx.clone(), d.clone()).await;
        assert_eq!((none.mirror.present, none.violations()), (Some(false), 0));
    });
    live.close(&*t).unwrap();
}
