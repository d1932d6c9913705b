//! Clients that die in the middle of a split (in process: the inserting
//! future is dropped at an await point, as a SIGKILL would stop it) are
//! finished by the next client within the lease: every acknowledged key is
//! found once, no slot of a live subtable stays frozen, the resize lock
//! and the split intent end clear.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use race_ht::RaceHt;
use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};
use smart_testkit::die::Die;

use crate::{race_ht_scan, tiny, value};

const LEASE: Duration = Duration::from_millis(30);

#[test]
fn a_client_killed_anywhere_in_a_growing_load_is_finished_by_the_next() {
    let (mut takeovers, mut recovered, mut deaths) = (0, 0, 0);
    for (round, polls) in (5..900).step_by(13).enumerate() {
        // Two blades: splits copy blocks across them.
        let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
        let mut a = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = a.ctx();
        let acked = Rc::new(Cell::new(0u64));
        let n = acked.clone();
        let body = async move {
            let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
            for k in 0..300u64 {
                assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
                n.set(k + 1);
            }
        };
        deaths += u32::from(a.block_on(Die::after(polls, body)).is_none());
        let acked = acked.get();

        // The next client: reads every acknowledged key (meeting the dead
        // client's frozen subtable, if any), inserts more (needing splits,
        // so the resize lock), then repairs whatever is left.
        let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
        let ctx = b.ctx();
        let stats = b.block_on(async move {
            // (Created here if the dead client died creating it.)
            let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
            ht.set_lease(LEASE);
            let mut out = Vec::new();
            for k in 0..acked {
                assert!(ht.get(&k.to_le_bytes(), &mut out).await.unwrap(), "round {round}: acknowledged key {k} lost");
                assert_eq!(out, value(k, 0));
            }
            for k in 1000..1200u64 {
                ht.upsert(&k.to_le_bytes(), &value(k, 1)).await.unwrap();
            }
            ht.repair().await.unwrap();
            ht.resize_stats()
        });
        takeovers += stats.takeovers;
        recovered += stats.recovered;
        // Every key once; the lock and the intent clear.
        let ctx = b.ctx();
        let (keys, lock, intent) = b.block_on(async move {
            let keys = race_ht_scan(&ctx).await;
            let table = ctx.root(0, "race-ht:stress").await.unwrap().unwrap();
            let lock = ctx.read_u64(table.add(race_ht::layout::LOCK_WORD)).await.unwrap();
            let intent = ctx.read_u64(table.add(race_ht::layout::INTENT_WORD)).await.unwrap();
            (keys, lock, intent)
        });
        assert_eq!((lock, intent), (0, 0), "round {round} (death after {polls} polls)");
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "round {round}: a key stored twice");
        assert!((0..acked).chain(1000..1200).all(|k| sorted.binary_search(&k).is_ok()), "round {round}");
    }
    eprintln!("{deaths} deaths, {takeovers} takeovers, {recovered} splits finished");
    // The deaths fell inside splits often enough to test their recovery.
    assert!(deaths > 40, "{deaths} deaths");
    assert!(takeovers >= 3 && recovered >= 3, "{takeovers} takeovers, {recovered} splits finished");
}
