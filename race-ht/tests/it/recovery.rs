//! Clients that die in the middle of a split (in process: the inserting
//! future is dropped at an await point, as a SIGKILL would stop it) are
//! finished by the next client within the lease: every acknowledged key is
//! found once, no slot of a live subtable stays frozen, the directory lock,
//! the publication intent and every live subtable's split lock end clear.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use race_ht::layout::{self, DIR_WORD};
use race_ht::RaceHt;
use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};
use smart_testkit::die::{Die, Shared, Step};

use crate::{race_ht_scan, tiny, value};

const LEASE: Duration = Duration::from_millis(30);

/// The table's group count and each live subtable once, from the raw
/// table.
async fn live_subtables(ctx: &smart_core::Ctx, table: smart_core::GlobalAddr) -> (u64, Vec<smart_core::GlobalAddr>) {
    let groups = ctx.read_u64(table.add(16)).await.unwrap();
    let (depth, array, _) = layout::unpack_dir(ctx.read_u64(table.add(DIR_WORD)).await.unwrap());
    let mut raw = vec![0u8; 8 << depth];
    ctx.read_all(array, &mut raw).await.unwrap();
    let mut subtables: Vec<_> =
        raw.chunks(8).map(|c| layout::unpack_entry(u64::from_le_bytes(c.try_into().unwrap())).1).collect();
    subtables.sort_unstable_by_key(|a| a.raw());
    subtables.dedup();
    (groups, subtables)
}

/// Live subtables whose split lock is held, and those words.
async fn held_splits(ctx: &smart_core::Ctx, table: smart_core::GlobalAddr) -> Vec<(smart_core::GlobalAddr, u64)> {
    let (groups, subtables) = live_subtables(ctx, table).await;
    let mut held = Vec::new();
    for at in subtables {
        let w = ctx.read_u64(layout::split_lock(at, groups)).await.unwrap();
        if w != 0 {
            held.push((at, w));
        }
    }
    held
}

/// Live subtables whose split lock is held.
async fn split_locks_held(ctx: &smart_core::Ctx, table: smart_core::GlobalAddr) -> usize {
    held_splits(ctx, table).await.len()
}

/// A live subtable whose split lock is held, and that word.
async fn held_split(ctx: &smart_core::Ctx, table: smart_core::GlobalAddr) -> Option<(smart_core::GlobalAddr, u64)> {
    held_splits(ctx, table).await.into_iter().next()
}

/// Client A on thread 0 of `t`: creates table "stress" and inserts keys
/// 0..300 with the lock lease `lease`, as a future to be stepped (see
/// [`Step`]); it returns A's resize statistics.
fn stepped_loader(
    t: &EmbeddedTransport,
    lease: Duration,
) -> (Runtime, Shared<impl std::future::Future<Output = race_ht::ResizeStats>>) {
    let a = Runtime::new(t, 0, RuntimeConfig::default()).unwrap();
    let ctx = a.ctx();
    let body = async move {
        let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
        ht.set_lease(lease);
        for k in 0..300u64 {
            assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap(), "key {k}");
        }
        ht.resize_stats()
    };
    (a, smart_testkit::die::shared(body))
}

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
        // Whether it died publishing a split (its intent still set).
        let ctx = a.ctx();
        let left_intent = a.block_on(async move {
            match ctx.root(0, "race-ht:stress").await.unwrap() {
                Some(table) => ctx.read_u64(table.add(race_ht::layout::INTENT_WORD)).await.unwrap() != 0,
                None => false,
            }
        });

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
        // A publication left half done (or done but for its intent) is a
        // split the next client finished.
        assert!(!left_intent || stats.recovered >= 1, "round {round}: an intent left, {stats:?}");
        takeovers += stats.takeovers;
        recovered += stats.recovered;
        // Every key once; the lock and the intent clear.
        let ctx = b.ctx();
        let (keys, lock, intent, split_locks) = b.block_on(async move {
            let keys = race_ht_scan(&ctx).await;
            let table = ctx.root(0, "race-ht:stress").await.unwrap().unwrap();
            let lock = ctx.read_u64(table.add(race_ht::layout::LOCK_WORD)).await.unwrap();
            let intent = ctx.read_u64(table.add(race_ht::layout::INTENT_WORD)).await.unwrap();
            (keys, lock, intent, split_locks_held(&ctx, table).await)
        });
        assert_eq!((lock, intent, split_locks), (0, 0, 0), "round {round} (death after {polls} polls)");
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

#[test]
fn a_holder_stalled_past_its_lease_gives_up_its_split_and_the_taker_finishes_it() {
    let mut stalls = 0;
    for round in 0..12u64 {
        let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
        let (mut a, a_run) = stepped_loader(&t, LEASE);
        let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
        // Step A until it holds a split lock but not the directory lock (a
        // stall there is before its last renewal), skipping the first
        // `round` such moments; then stall it for longer than the lease
        // while B repairs the table.
        let (mut seen, mut stats_a) = (0, None);
        loop {
            if let Some(s) = a.block_on(Step { inner: a_run.clone(), budget: 1 }) {
                stats_a = Some(s);
                break;
            }
            let ctx = b.ctx();
            let (lock, split_locks) = b.block_on(async move {
                let Some(table) = ctx.root(0, "race-ht:stress").await.unwrap() else { return (0, 0) };
                let lock = ctx.read_u64(table.add(race_ht::layout::LOCK_WORD)).await.unwrap();
                (lock, split_locks_held(&ctx, table).await)
            });
            if split_locks > 0 && lock == 0 {
                seen += 1;
                if seen > round {
                    let ctx = b.ctx();
                    let taken = b.block_on(async move {
                        let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
                        ht.set_lease(LEASE);
                        ht.repair().await.unwrap();
                        ht.resize_stats().takeovers
                    });
                    assert_eq!(taken, 1, "round {round}: B did not take the stalled lock over");
                    stalls += 1;
                    break;
                }
            }
        }
        // A resumes: its split finds its lock taken, stops, and its insert
        // starts over; every insert is acknowledged.
        let stats_a =
            stats_a.unwrap_or_else(|| a.block_on(Step { inner: a_run.clone(), budget: u32::MAX }).expect("A finishes"));
        if seen > round {
            assert!(stats_a.lease_losses >= 1, "round {round}: {stats_a:?}");
        }
        let ctx = b.ctx();
        let (keys, lock, intent, split_locks) = b.block_on(async move {
            let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
            ht.set_lease(LEASE);
            ht.repair().await.unwrap();
            let keys = race_ht_scan(&ctx).await;
            let table = ctx.root(0, "race-ht:stress").await.unwrap().unwrap();
            let lock = ctx.read_u64(table.add(race_ht::layout::LOCK_WORD)).await.unwrap();
            let intent = ctx.read_u64(table.add(race_ht::layout::INTENT_WORD)).await.unwrap();
            (keys, lock, intent, split_locks_held(&ctx, table).await)
        });
        assert_eq!((lock, intent, split_locks), (0, 0, 0), "round {round}");
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "round {round}: a key stored twice");
        assert_eq!(sorted, (0..300).collect::<Vec<_>>(), "round {round}");
    }
    // Most rounds found their stall point (300 keys need many splits).
    assert!(stalls >= 10, "{stalls} stalls");
}

/// Splits of different subtables do not wait for each other: while A holds
/// one subtable's split lock (stalled mid-split, alive: its lease is long),
/// B splits other subtables to completion, without taking A's lock over;
/// then A finishes its own split. (With one lock per table, B waits for A
/// until the lease runs out and then takes the lock over.)
#[test]
fn splits_of_different_subtables_proceed_in_parallel() {
    const LONG: Duration = Duration::from_secs(20);
    let mut checked = 0;
    for round in 0..4u64 {
        let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
        let (mut a, a_run) = stepped_loader(&t, LONG);
        let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
        // Step A until it holds the split lock of a subtable of depth ≥ 1
        // (so that there are others), skipping `round` such moments.
        let (mut seen, mut held) = (0, None);
        while held.is_none() {
            let done = a.block_on(Step { inner: a_run.clone(), budget: 1 });
            assert!(done.is_none(), "round {round}: A finished without a stall point");
            let ctx = b.ctx();
            let h = b.block_on(async move {
                let table = ctx.root(0, "race-ht:stress").await.unwrap()?;
                let (at, w) = held_split(&ctx, table).await?;
                let header = ctx.read_u64(at).await.unwrap();
                ((header & 0xffff_ffff) >= 1).then_some((table, at, w, header))
            });
            if h.is_some() {
                seen += 1;
                if seen > round {
                    held = h;
                }
            }
        }
        let (table, at, word, header) = held.unwrap();
        let (ld, s) = ((header & 0xffff_ffff) as u32, header >> 32);
        // B inserts keys of other subtables until it has split twice.
        let ctx = b.ctx();
        let (b_stats, b_keys, still) = b.block_on(async move {
            let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
            ht.set_lease(LONG);
            let mut keys = Vec::new();
            for k in 10_000..20_000u64 {
                if layout::suffix(layout::hashes(&k.to_le_bytes()).0, ld) == s {
                    continue;
                }
                assert!(ht.insert(&k.to_le_bytes(), &value(k, 1)).await.unwrap());
                keys.push(k);
                if ht.resize_stats().splits >= 2 {
                    break;
                }
            }
            let still = ctx.read_u64(layout::split_lock(at, ctx.read_u64(table.add(16)).await.unwrap())).await.unwrap();
            (ht.resize_stats(), keys, still)
        });
        assert!(b_stats.splits >= 2, "round {round}: B split {b_stats:?}");
        assert_eq!((b_stats.takeovers, b_stats.lease_losses), (0, 0), "round {round}: {b_stats:?}");
        assert_eq!(still, word, "round {round}: A's split lock changed hands");
        // A resumes and finishes its split: it lost nothing.
        let stats_a = a.block_on(Step { inner: a_run.clone(), budget: u32::MAX }).expect("A finishes");
        assert_eq!((stats_a.takeovers, stats_a.lease_losses), (0, 0), "round {round}: {stats_a:?}");
        let ctx = b.ctx();
        let (keys, split_locks) = b.block_on(async move {
            let keys = race_ht_scan(&ctx).await;
            (keys, split_locks_held(&ctx, table).await)
        });
        assert_eq!(split_locks, 0, "round {round}");
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        let mut want: Vec<u64> = (0..300).chain(b_keys).collect();
        want.sort_unstable();
        assert_eq!(sorted, want, "round {round}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

/// A table dropped while a client is in the middle of a split (its halves
/// built and recorded): the drop gives the halves back with the table,
/// the split stops when it comes to publish, and the client's insert
/// fails with `Dropped` (it published nothing into the dropped table's
/// memory).
#[test]
fn a_split_being_built_when_the_table_is_dropped_stops_with_dropped() {
    let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
    let mut a = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = a.ctx();
    let body = async move {
        let mut ht = RaceHt::create(&ctx, "stress", tiny()).await.unwrap();
        for k in 0..300u64 {
            if let Err(e) = ht.insert(&k.to_le_bytes(), &value(k, 0)).await {
                return Some((k, e));
            }
        }
        None
    };
    let a_run = smart_testkit::die::shared(body);
    let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
    let live = loop {
        let done = a.block_on(Step { inner: a_run.clone(), budget: 1 });
        assert!(done.is_none(), "A finished without holding a split lock");
        let ctx = b.ctx();
        // Held, with both halves built and recorded, not published.
        let held = b.block_on(async move {
            let table = ctx.root(0, "race-ht:stress").await.unwrap()?;
            let lock = ctx.read_u64(table.add(layout::LOCK_WORD)).await.unwrap();
            let (at, _) = held_split(&ctx, table).await.filter(|_| lock == 0)?;
            let (groups, live) = live_subtables(&ctx, table).await;
            let halves = layout::split_halves(at, groups);
            let recorded = [ctx.read_u64(halves).await.unwrap(), ctx.read_u64(halves.add(8)).await.unwrap()];
            recorded.iter().all(|&w| w != 0).then_some(live.len())
        });
        if let Some(live) = held {
            break live;
        }
    };
    let ctx = b.ctx();
    let dropped = b.block_on(async move { RaceHt::drop_table(&ctx, "stress").await.unwrap() });
    // Every live subtable and both recorded halves are given back.
    assert_eq!(dropped.map(|d| d.subtables), Some(live + 2), "{dropped:?}");
    let failed = a.block_on(Step { inner: a_run.clone(), budget: u32::MAX }).expect("A ends");
    let (k, e) = failed.expect("an insert fails once the table is dropped");
    assert!(matches!(e, race_ht::RaceError::Dropped), "key {k}: {e}");
}

/// A lookup stalled (alive) for longer than the reclamation lease, after
/// it cached the directory and before it read the buckets: meanwhile
/// another client takes it for dead, splits the subtable the lookup is
/// about to read and reuses that memory for a new subtable. The lookup
/// must not trust what it then reads (a bucket header of another depth,
/// reported as corruption) but start over, and find the key.
#[test]
fn a_lookup_stalled_past_the_reclaim_lease_starts_over_instead_of_reading_reused_memory() {
    const RECLAIM: Duration = Duration::from_millis(60);
    let (mut stalled_rounds, mut retried) = (0, 0);
    for polls in 1..=12u32 {
        let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
        let mut a = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
        let ctx = a.ctx();
        let (ht_a, s0) = a.block_on(async move {
            let mut ht = RaceHt::create(&ctx, "lapse", tiny()).await.unwrap();
            ht.set_reclaim_lease(RECLAIM);
            for k in 0..5u64 {
                assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
            }
            let table = ctx.root(0, "race-ht:lapse").await.unwrap().unwrap();
            let (_, subtables) = live_subtables(&ctx, table).await;
            assert_eq!(subtables.len(), 1);
            (ht, subtables[0])
        });
        // A looks key 3 up (after a refresh period, so that the lookup
        // refreshes and re-checks its directory), and stalls after `polls`
        // polls.
        let ctx = a.ctx();
        let look = smart_testkit::die::shared(async move {
            let mut ht = ht_a;
            ctx.sleep_ns(2 * smart_core::reclaim::REFRESH_NS).await;
            let mut out = Vec::new();
            let found = ht.get(&3u64.to_le_bytes(), &mut out).await;
            (found, out, ht.resize_stats())
        });
        if a.block_on(Step { inner: look.clone(), budget: polls }).is_some() {
            continue;
        }
        stalled_rounds += 1;
        // B splits the subtable and goes on inserting for longer than the
        // lease, until the subtable's memory holds another subtable.
        let ctx = b.ctx();
        let reused = b.block_on(async move {
            let mut ht = RaceHt::open(&ctx, "lapse").await.unwrap();
            ht.set_reclaim_lease(RECLAIM);
            let t0 = std::time::Instant::now();
            let mut k = 1000u64;
            while t0.elapsed() < Duration::from_secs(10) {
                assert!(ht.insert(&k.to_le_bytes(), &value(k, 0)).await.unwrap());
                k += 1;
                if k % 16 == 0 {
                    ctx.sleep_ns(1_000_000).await;
                    if ctx.read_u64(s0).await.unwrap() != layout::bucket_header(0, 0) && t0.elapsed() > 2 * RECLAIM {
                        return true;
                    }
                }
            }
            false
        });
        assert!(reused, "polls {polls}: the split subtable's memory was never reused");
        // A resumes.
        let (found, out, stats) = a.block_on(Step { inner: look, budget: u32::MAX }).expect("A finishes");
        assert!(found.unwrap_or_else(|e| panic!("polls {polls}: {e}")), "polls {polls}: key 3 not found");
        assert_eq!(out, value(3, 0), "polls {polls}");
        retried += stats.lapse_retries;
    }
    eprintln!("{stalled_rounds} stalled lookups, {retried} started over");
    assert!(stalled_rounds >= 3 && retried >= stalled_rounds, "{stalled_rounds} stalled, {retried} started over");
}

/// A holder stalled past its lease while it holds the directory lock, at
/// each step of its publications in turn (also between its last renewal
/// and its directory writes): B takes the locks over, finishes the split
/// and inserts more keys into its halves; then A resumes. A's late writes
/// change nothing: every key of both is found once, and the split is
/// counted (and its subtable retired) once: live subtables = 1 + the
/// table's split counter = 1 + the splits A and B counted.
#[test]
fn a_publisher_stalled_past_its_lease_changes_nothing_when_it_resumes() {
    let mut stalls = 0;
    for round in 0..40u64 {
        let t = EmbeddedTransport::new(2, 32 << 20).unwrap();
        let (mut a, a_run) = stepped_loader(&t, LEASE);
        let mut b = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
        // Step A one poll at a time; stall it at the `round`-th poll it
        // makes holding the directory lock.
        let (mut seen, mut stats_a, mut stats_b) = (0, None, race_ht::ResizeStats::default());
        loop {
            if let Some(s) = a.block_on(Step { inner: a_run.clone(), budget: 1 }) {
                stats_a = Some(s);
                break;
            }
            let ctx = b.ctx();
            let lock = b.block_on(async move {
                let Some(table) = ctx.root(0, "race-ht:stress").await.unwrap() else { return 0 };
                ctx.read_u64(table.add(race_ht::layout::LOCK_WORD)).await.unwrap()
            });
            if lock != 0 {
                seen += 1;
                if seen > round {
                    let ctx = b.ctx();
                    stats_b = b.block_on(async move {
                        let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
                        ht.set_lease(LEASE);
                        ht.repair().await.unwrap();
                        for k in 1000..1100u64 {
                            assert!(ht.insert(&k.to_le_bytes(), &value(k, 1)).await.unwrap(), "key {k}");
                        }
                        ht.resize_stats()
                    });
                    assert!(stats_b.takeovers >= 1, "round {round}: B took no lock over: {stats_b:?}");
                    stalls += 1;
                    break;
                }
            }
        }
        let stats_a =
            stats_a.unwrap_or_else(|| a.block_on(Step { inner: a_run.clone(), budget: u32::MAX }).expect("A finishes"));
        let ctx = b.ctx();
        let (keys, words, subtables, more_b) = b.block_on(async move {
            let mut ht = RaceHt::open(&ctx, "stress").await.unwrap();
            ht.set_lease(LEASE);
            ht.repair().await.unwrap();
            let c = ht.check().await.unwrap();
            assert_eq!((c.duplicates, c.frozen_slots, c.misplaced, c.bad_headers), (0, 0, 0, 0), "{c:?}");
            let keys = race_ht_scan(&ctx).await;
            let table = ctx.root(0, "race-ht:stress").await.unwrap().unwrap();
            let mut words = [0u64; 3];
            for (w, off) in words.iter_mut().zip([layout::LOCK_WORD, layout::INTENT_WORD, layout::SPLITS_WORD]) {
                *w = ctx.read_u64(table.add(off)).await.unwrap();
            }
            (keys, words, live_subtables(&ctx, table).await.1.len() as u64, ht.resize_stats())
        });
        let [lock, intent, counter] = words;
        assert_eq!((lock, intent), (0, 0), "round {round}");
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "round {round}: a key stored twice");
        let want: Vec<u64> = (0..300).chain(if seen > round { 1000..1100 } else { 0..0 }).collect();
        assert_eq!(sorted, want, "round {round}");
        let counted = stats_a.splits + stats_b.splits + more_b.splits;
        assert_eq!((subtables, counter), (1 + counter, counted), "round {round}: A {stats_a:?}, B {stats_b:?}");
    }
    assert!(stalls >= 30, "{stalls} stalls");
}
