//! A compute thread's handle on the database ([`Dtx`]): the address cache
//! its coroutines share, and its counters.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};
use rustc_hash::{FxHashMap, FxHashSet};
use smart_core::{Ctx, GlobalAddr};

use crate::db::{Db, Table};
use crate::layout::{self, Owner, MAX_REPLICAS, SLOTS};
use crate::registry::Registration;
use crate::txn::Txn;

/// A record's address on every replica (primary first).
pub type Loc = [GlobalAddr; MAX_REPLICAS];

/// Counters of a thread's transactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DtxStats {
    /// Address-cache hits (items found without reading their bucket).
    pub cache_hits: u64,
    /// Address-cache misses.
    pub cache_misses: u64,
    /// Cached addresses that held another key (a fingerprint shared by two
    /// keys): the item's bucket was read instead, or, for a locked item, the
    /// transaction aborted (counted as a validation abort).
    pub cache_stale: u64,
    /// Overflow buckets this thread added.
    pub chains_extended: u64,
}

impl DtxStats {
    /// Adds `o`.
    pub fn merge(&mut self, o: &DtxStats) {
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.cache_stale += o.cache_stale;
        self.chains_extended += o.chains_extended;
    }
}

pub(crate) struct Shared {
    pub(crate) ctx: Ctx,
    pub(crate) db: Arc<Db>,
    pub(crate) owner: u16,
    pub(crate) nonce: u64,
    pub(crate) log: GlobalAddr,
    pub(crate) log_coroutines: u64,
    pub(crate) cache: RefCell<AddrCache>,
    pub(crate) stats: RefCell<DtxStats>,
    pub(crate) lost: Arc<std::sync::atomic::AtomicBool>,
}

/// Where keys live: which slot of its home bucket holds a key, as a 16-bit
/// fingerprint of the key per slot of each table's bucket array (2 bytes
/// per slot, allocated lazily: untouched pages cost nothing), and the few
/// keys in overflow buckets in an exact map. A thread's cache may hold every
/// row it ever touched; this way a lookup reads one or two cache lines at a
/// computed place instead of chasing a hash map of a million entries.
///
/// A fingerprint is a hint: another key with the same fingerprint may hold
/// the slot. The transaction checks the key of every record it reads through
/// the cache ([`Txn`]'s fetch); a key that was sent to another key's slot is
/// marked [`stale`](Self::stale) and never trusts a print again (there are
/// few: about one key in 6 000 shares its print with another of its bucket).
/// Two equal prints in one bucket are not trusted at all (a miss). A record in a bucket array has its mirrors at the same offset of
/// each replica's array; those in overflow buckets keep theirs apart.
#[derive(Default)]
pub(crate) struct AddrCache {
    /// Per table id: one fingerprint per slot of the bucket array (0 =
    /// none), native-endian `u16`s.
    prints: Vec<Option<MmapMut>>,
    overflow: FxHashMap<(u32, u64), Loc>,
    /// Keys whose print matched another key's slot.
    colliders: FxHashSet<(u32, u64)>,
    /// Bytes of the print arrays (mapped, not all touched).
    print_bytes: usize,
}

/// Print arrays larger than this (about a core's share of L2) are mostly
/// out of the CPU's caches: their lookups are worth overlapping.
const OVERLAP_ABOVE: usize = 2 << 20;

/// A key's home bucket and its nonzero fingerprint (from one hash: the
/// bucket from the hash modulo the buckets, the print from its top bits).
fn home_and_print(t: &Table, key: u64) -> (u64, u16) {
    let h = crate::layout::murmur64a(key, crate::layout::HASH_SEED);
    let p = (h >> 48) as u16;
    (h % t.buckets, if p == 0 { 1 } else { p })
}

impl AddrCache {
    /// `at`'s offset in table `t`'s bucket array, if it lies there.
    fn in_array(t: &Table, at: GlobalAddr) -> Option<u64> {
        let off = at.offset().wrapping_sub(t.base[0].offset());
        (at.blade() == t.base[0].blade() && off < t.buckets * t.bucket_bytes()).then_some(off)
    }

    /// Where `key` is, if this thread has seen it: exact for keys in
    /// overflow buckets, a hint to check for those in the array.
    pub(crate) fn get(&self, t: &Table, replicas: usize, key: u64) -> Option<Loc> {
        let (b, p) = home_and_print(t, key);
        if let Some(Some(prints)) = self.prints.get(t.id as usize) {
            let first = b as usize * SLOTS * 2;
            let slots = &prints[first..first + SLOTS * 2];
            let mut hit = None;
            let mut hits = 0;
            for (s, q) in slots.chunks_exact(2).enumerate() {
                if u16::from_ne_bytes([q[0], q[1]]) == p {
                    hit = Some(s);
                    hits += 1;
                }
            }
            if let (Some(s), 1) = (hit, hits) {
                if !self.colliders.is_empty() && self.colliders.contains(&(t.id, key)) {
                    return None;
                }
                let off = b * t.bucket_bytes() + layout::slot_offset(t.value_size, s);
                return Some(std::array::from_fn(|r| if r < replicas { t.base[r].add(off) } else { GlobalAddr::NULL }));
            }
        }
        if self.overflow.is_empty() {
            return None;
        }
        self.overflow.get(&(t.id, key)).copied()
    }

    /// Whether lookups should be overlapped with other coroutines' work
    /// ([`prefetch`](Self::prefetch), yield, then [`get`](Self::get)): the
    /// prints are too large to stay in the CPU's caches.
    pub(crate) fn overlap(&self) -> bool {
        self.print_bytes > OVERLAP_ABOVE
    }

    /// Starts loading the line [`get`](Self::get) will read for `key`.
    pub(crate) fn prefetch(&self, t: &Table, key: u64) {
        if let Some(Some(prints)) = self.prints.get(t.id as usize) {
            let first = home_and_print(t, key).0 as usize * SLOTS * 2;
            smart_core::runtime::prefetch_local(&prints[first..first + SLOTS * 2]);
        }
    }

    /// Remembers that `key` lives at `loc` (slots keep their keys for good).
    pub(crate) fn insert(&mut self, t: &Table, key: u64, loc: Loc) {
        let Some(off) = Self::in_array(t, loc[0]) else {
            self.overflow.insert((t.id, key), loc);
            return;
        };
        let (b, p) = home_and_print(t, key);
        let bb = t.bucket_bytes();
        debug_assert_eq!(off / bb, b, "a key in the array lies in its home bucket");
        let s = ((off % bb - layout::BUCKET_HEADER) / t.record_bytes() as u64) as usize;
        let id = t.id as usize;
        if self.prints.len() <= id {
            self.prints.resize_with(id + 1, || None);
        }
        let Some(prints) = &mut self.prints[id] else {
            // Zeroed anonymous memory, its pages mapped as they are touched,
            // on huge pages where the system allows (lookups are random: TLB
            // misses would cost more than the cache misses). Without memory
            // for it the key simply stays uncached.
            let len = t.buckets as usize * SLOTS * 2;
            let Ok(map) = MmapOptions::new().len(len).map_anon() else { return };
            self.print_bytes += len;
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            self.prints[id] = Some(map);
            return self.insert(t, key, loc);
        };
        let at = (b as usize * SLOTS + s) * 2;
        prints[at..at + 2].copy_from_slice(&p.to_ne_bytes());
    }

    /// Marks `key` as one whose print led to another key's slot.
    pub(crate) fn stale(&mut self, t: &Table, key: u64) {
        self.colliders.insert((t.id, key));
    }
}

/// A compute thread's handle on the database: the address cache its
/// coroutines share, and its place in the registration. Cheap to clone.
#[derive(Clone)]
pub struct Dtx(pub(crate) Rc<Shared>);

impl std::fmt::Debug for Dtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dtx").field("owner", &self.0.owner).field("thread", &self.0.ctx.thread()).finish()
    }
}

impl Registration {
    /// The handle of worker thread `ctx.thread()` of this compute blade.
    ///
    /// # Panics
    /// If the thread is beyond those registered.
    pub fn open_thread(&self, ctx: Ctx) -> Dtx {
        assert!(ctx.thread() < self.info.threads as usize, "thread {} was not registered", ctx.thread());
        Dtx(Rc::new(Shared {
            ctx,
            db: self.db.clone(),
            owner: self.info.slot,
            nonce: self.info.claim,
            log: self.info.log,
            log_coroutines: self.info.coroutines,
            cache: RefCell::new(AddrCache::default()),
            stats: RefCell::new(DtxStats::default()),
            lost: self.lost_flag(),
        }))
    }
}

impl Dtx {
    /// The runtime handle.
    pub fn ctx(&self) -> &Ctx {
        &self.0.ctx
    }

    /// The database.
    pub fn db(&self) -> &Arc<Db> {
        &self.0.db
    }

    /// Counters so far.
    pub fn stats(&self) -> DtxStats {
        *self.0.stats.borrow()
    }

    /// Coroutine `coroutine`'s transaction object (reused for every
    /// transaction the coroutine runs).
    ///
    /// # Panics
    /// If the coroutine is beyond those registered.
    pub fn txn(&self, coroutine: usize) -> Txn {
        assert!((coroutine as u64) < self.0.log_coroutines, "coroutine {coroutine} was not registered");
        let s = &self.0;
        let ring = (s.ctx.thread() as u64) * s.log_coroutines + coroutine as u64;
        let ring = s.log.add(ring * crate::registry::ring_bytes(&s.db));
        let owner = Owner { blade: s.owner, thread: s.ctx.thread() as u16, coroutine: coroutine as u16 };
        Txn::new(self.clone(), owner, ring)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use smart_core::{Runtime, RuntimeConfig, Transport};

    use super::*;
    use crate::db::{DbSpec, TableSpec};
    use crate::{Abort, TxnError};

    /// The first `n` pairs of keys of `t` with the same home bucket and the
    /// same fingerprint.
    fn twins(t: &Table, n: usize) -> Vec<(u64, u64)> {
        let mut seen = std::collections::HashMap::new();
        let mut pairs = Vec::new();
        for k in 1..10_000_000u64 {
            if let Some(o) = seen.remove(&home_and_print(t, k)) {
                pairs.push((o, k));
                if pairs.len() == n {
                    return pairs;
                }
            } else {
                seen.insert(home_and_print(t, k), k);
            }
        }
        unreachable!("16-bit prints collide long before")
    }

    fn table(buckets: u64) -> Table {
        let base = [GlobalAddr::new(0, 1 << 20), GlobalAddr::new(1, 1 << 20), GlobalAddr::NULL, GlobalAddr::NULL];
        Table { id: 1, value_size: 8, buckets, base }
    }

    /// `key`'s slot `s` of its home bucket, on both replicas.
    fn slot(t: &Table, key: u64, s: usize) -> Loc {
        let off = home_and_print(t, key).0 * t.bucket_bytes() + layout::slot_offset(t.value_size, s);
        [t.base[0].add(off), t.base[1].add(off), GlobalAddr::NULL, GlobalAddr::NULL]
    }

    #[test]
    fn the_cache_finds_array_slots_by_print_and_overflow_slots_exactly() {
        let t = table(100);
        let mut c = AddrCache::default();
        assert_eq!(c.get(&t, 2, 5), None);
        c.insert(&t, 5, slot(&t, 5, 3));
        assert_eq!(c.get(&t, 2, 5), Some(slot(&t, 5, 3)), "mirrors at the same offset");
        assert_eq!(c.get(&t, 1, 5).map(|l| l[1]), Some(GlobalAddr::NULL), "one replica");
        let far = [GlobalAddr::new(0, 1 << 30), GlobalAddr::new(1, 1 << 29), GlobalAddr::NULL, GlobalAddr::NULL];
        c.insert(&t, 6, far);
        assert_eq!(c.get(&t, 2, 6), Some(far), "overflow slots keep their own mirrors");
        let other = Table { id: 0, ..t.clone() };
        assert_eq!(c.get(&other, 2, 5), None, "tables apart");
        c.stale(&other, 5);
        assert_eq!(c.get(&t, 2, 5), Some(slot(&t, 5, 3)));
        c.stale(&t, 5);
        assert_eq!(c.get(&t, 2, 5), None, "a stale key trusts no print");
    }

    #[test]
    fn equal_prints_in_a_bucket_are_not_trusted() {
        let t = table(7);
        let (a, b) = twins(&t, 1)[0];
        let mut c = AddrCache::default();
        c.insert(&t, a, slot(&t, a, 0));
        // `b` shares the hint: a stale address, for the fetch to catch.
        assert_eq!(c.get(&t, 2, b), Some(slot(&t, a, 0)));
        c.insert(&t, b, slot(&t, b, 4));
        assert_eq!(c.get(&t, 2, a), None, "two slots match: neither is trusted");
        assert_eq!(c.get(&t, 2, b), None);
    }

    fn open(rows: u64) -> (Arc<dyn Transport>, Runtime, Arc<Db>, crate::Registration) {
        let t: Arc<dyn Transport> = smart_testkit::backends::embedded(1).transport;
        let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
        let spec = DbSpec {
            name: "hints".into(),
            tables: vec![TableSpec { name: "t".into(), value_size: 8, rows }],
            replicas: 1,
        };
        let ctx = rt.ctx();
        let db = Arc::new(rt.block_on(async move { Db::create(&ctx, &spec).await }).unwrap().0);
        let reg = crate::Registration::register(t.clone(), db.clone(), 1, 1, Duration::from_secs(30)).unwrap();
        (t, rt, db, reg)
    }

    fn abort_of(r: Result<(), TxnError>) -> Abort {
        match r {
            Err(TxnError::Abort(a)) => a,
            other => panic!("expected an abort, got {other:?}"),
        }
    }

    #[test]
    fn a_hint_naming_another_keys_slot_is_caught_by_the_fetch() {
        let (t, mut rt, db, reg) = open(44);
        let pairs = twins(db.table(0), 2);
        let dtx = reg.open_thread(rt.ctx());
        rt.block_on(async move {
            let mut tx = dtx.txn(0);
            for &(_, b) in &pairs {
                tx.begin();
                let i = tx.insert(0, b);
                tx.execute().await.unwrap();
                tx.write(i, &b.to_le_bytes());
                tx.commit().await.unwrap();
            }
            let ((a, b), (c, d)) = (pairs[0], pairs[1]);
            // `b`'s slot carries `a`'s print: updating `a` locks `b`'s
            // record, sees `b` and aborts, releasing that lock.
            tx.begin();
            tx.update(0, a);
            assert_eq!(abort_of(tx.execute().await), Abort::Validation);
            assert_eq!(dtx.stats().cache_stale, 1);
            tx.begin();
            let i = tx.update(0, b);
            tx.execute().await.expect("b's lock was released");
            tx.write(i, &2u64.to_le_bytes());
            tx.commit().await.unwrap();
            // `a` no longer trusts prints: the truth, from its bucket.
            tx.begin();
            tx.update(0, a);
            assert_eq!(abort_of(tx.execute().await), Abort::NotFound);
            // Reading `c` goes to `d`'s slot, sees `d`, reads the bucket.
            tx.begin();
            tx.read(0, c);
            assert_eq!(abort_of(tx.execute().await), Abort::NotFound);
            assert_eq!(dtx.stats().cache_stale, 2);
            for k in [a, c] {
                tx.begin();
                let i = tx.insert(0, k);
                tx.execute().await.unwrap();
                tx.write(i, &k.to_le_bytes());
                tx.commit().await.unwrap();
            }
            for _ in 0..2 {
                tx.begin();
                let items = [a, b, c, d].map(|k| tx.read(0, k));
                tx.execute().await.unwrap();
                let got = items.map(|i| u64::from_le_bytes(tx.value(i).try_into().unwrap()));
                assert_eq!(got, [a, 2, c, d]);
                tx.commit().await.unwrap();
            }
            assert_eq!(dtx.stats().cache_stale, 2);
        });
        reg.close(&*t).unwrap();
    }
}
