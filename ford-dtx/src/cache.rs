//! The address cache: where a compute blade's transactions find their
//! records without reading buckets.
//!
//! FORD keeps, per thread, a map from every row the thread touched to its
//! address. Here a compute-blade process keeps [`Prints`], shared by its
//! threads: for each slot of each table's bucket array, a 16-bit print of
//! the key that holds it (a slot keeps its key for good). A key's home
//! bucket is computed from the key, so a lookup reads the one cache line of
//! that bucket's prints (64 bytes a bucket, about 6 bytes a row at half
//! load) and scans its 22 prints. Threads write prints with relaxed atomic
//! updates of their lanes; a lost or racing update only costs a miss.
//!
//! A print is a hint: another key with the same print may hold the slot
//! (about one key in 6 000 shares its print with another of its bucket).
//! The transaction checks the key of every record it reads through the
//! cache, and a key that was sent to another key's slot is marked stale in
//! its thread's [`AddrCache`] and never trusts a print again. Two equal
//! prints in one bucket are not trusted at all. The few keys that prints
//! cannot serve (those with a print shared in their bucket, and those in
//! overflow buckets) are kept exactly, per thread, with their mirrors (a
//! record in a bucket array has its mirrors at the same offset of each
//! replica's array; an overflow bucket names its own).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use rustc_hash::{FxHashMap, FxHashSet};
use smart_core::GlobalAddr;

use crate::db::{Db, Table};
use crate::dtx::Loc;
use crate::layout::{self, SLOTS};

/// One bucket's prints: 4 lanes of 16 bits per word, lanes 0..22 used.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line([AtomicU64; 8]);

const WORDS: usize = SLOTS.div_ceil(4);
const _: () = assert!(WORDS <= 8, "a bucket's prints fit one line");

/// Lane 0 of each of a word's four 16-bit lanes.
const LANES: u64 = 0x0001_0001_0001_0001;

/// Per word of a line: the top bits of its lanes that are slots.
const USED: [u64; WORDS] = {
    let mut used = [0; WORDS];
    let mut s = 0;
    while s < SLOTS {
        used[s / 4] |= 0x8000 << (16 * (s % 4));
        s += 1;
    }
    used
};

/// The top bit of every 16-bit lane of `x` that is zero, and no other bit
/// (exact: adding 0x7fff to a lane's low 15 bits carries into its top bit
/// unless they are all zero, and never into the next lane).
fn zero_lanes(x: u64) -> u64 {
    const LOW: u64 = 0x7fff_7fff_7fff_7fff;
    !(((x & LOW) + LOW) | x | LOW)
}

/// What one pass over a bucket's prints found for a print: the slots with
/// it, and the last of them.
struct Scan {
    hits: usize,
    hit: usize,
}

/// Where a lookup sends a key (see [`AddrCache::lookup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// At this address.
    At(Loc),
    /// To this slot of its home bucket.
    Probe(usize),
    /// To its bucket.
    Bucket,
}

/// Print arrays larger than this (about a core's share of L2) are mostly
/// out of the CPU's caches: their lookups are worth overlapping.
const OVERLAP_ABOVE: usize = 2 << 20;

/// The prints of every table of a database, shared by a process's threads
/// (each table's array is allocated at its first insert).
#[derive(Debug)]
pub(crate) struct Prints {
    /// Per table: its lines, or `None` if there was no memory for them (its
    /// keys then stay uncached).
    tables: Vec<OnceLock<Option<Box<[Line]>>>>,
    bytes: AtomicUsize,
}

impl Prints {
    pub(crate) fn new(db: &Db) -> Prints {
        Prints { tables: db.tables.iter().map(|_| OnceLock::new()).collect(), bytes: AtomicUsize::new(0) }
    }

    fn table(&self, t: &Table) -> Option<&[Line]> {
        self.tables.get(t.id as usize)?.get()?.as_deref()
    }

    fn table_or_new(&self, t: &Table) -> Option<&[Line]> {
        let cell = self.tables.get(t.id as usize)?;
        cell.get_or_init(|| {
            let n = usize::try_from(t.buckets).ok()?;
            let mut lines = Vec::new();
            lines.try_reserve_exact(n).ok()?;
            lines.resize_with(n, Line::default);
            self.bytes.fetch_add(n * size_of::<Line>(), Ordering::Relaxed);
            Some(lines.into_boxed_slice())
        })
        .as_deref()
    }
}

/// The home bucket and the nonzero print of a key with hash `h`
/// ([`layout::key_hash`]): the bucket from the hash modulo the buckets, the
/// print from its top bits.
fn home_and_print(t: &Table, h: u64) -> (u64, u16) {
    let p = (h >> 48) as u16;
    (h % t.buckets, if p == 0 { 1 } else { p })
}

/// Sets the print of slot `s` of bucket `b` to `print()` if it is unknown
/// (a slot keeps its key for good, so a known print never changes; `print`
/// is not called then).
fn set_print(lines: &[Line], b: u64, s: usize, print: impl FnOnce() -> u16) {
    let (word, shift) = (&lines[b as usize].0[s / 4], 16 * (s % 4));
    if (word.load(Ordering::Relaxed) >> shift) as u16 != 0 {
        return;
    }
    let p = u64::from(print());
    let _ = word
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| ((v >> shift) as u16 == 0).then_some(v | p << shift));
}

/// A thread's view of the cache: the shared prints, and its own exact
/// entries and stale keys.
#[derive(Debug)]
pub(crate) struct AddrCache {
    prints: Arc<Prints>,
    /// Keys in overflow buckets, and keys whose print is not theirs alone
    /// in their bucket.
    exact: FxHashMap<(u32, u64), Loc>,
    /// Keys whose print matched another key's slot.
    colliders: FxHashSet<(u32, u64)>,
}

impl AddrCache {
    pub(crate) fn new(prints: Arc<Prints>) -> AddrCache {
        AddrCache { prints, exact: FxHashMap::default(), colliders: FxHashSet::default() }
    }

    /// `at`'s offset in table `t`'s bucket array, if it lies there.
    fn in_array(t: &Table, at: GlobalAddr) -> Option<u64> {
        let off = at.offset().wrapping_sub(t.base[0].offset());
        (at.blade() == t.base[0].blade() && off < t.buckets * t.bucket_bytes()).then_some(off)
    }

    /// One pass over bucket `b` of `t`'s prints, for print `p`: each word's
    /// four lanes are compared at once (see [`zero_lanes`]).
    fn scan(&self, t: &Table, b: u64, p: u16) -> Scan {
        let mut scan = Scan { hits: 0, hit: 0 };
        let Some(lines) = self.prints.table(t) else {
            return scan;
        };
        let wanted = u64::from(p) * LANES;
        for (w, word) in lines[b as usize].0[..WORDS].iter().enumerate() {
            // Lanes past the last slot stay 0, which no print is.
            let hits = zero_lanes(word.load(Ordering::Relaxed) ^ wanted);
            if hits != 0 {
                scan.hits += hits.count_ones() as usize;
                scan.hit = 4 * w + (63 - hits.leading_zeros() as usize) / 16;
            }
        }
        scan
    }

    /// The first slot of bucket `b` of `t` whose print is unknown (0 when
    /// the table has no prints), if any: asked only when no print matched,
    /// so not on the usual hit.
    fn unknown_slot(&self, t: &Table, b: u64) -> Option<usize> {
        let Some(lines) = self.prints.table(t) else {
            return Some(0);
        };
        lines[b as usize].0[..WORDS].iter().zip(USED).enumerate().find_map(|(w, (word, used))| {
            let unknown = zero_lanes(word.load(Ordering::Relaxed)) & used;
            (unknown != 0).then(|| 4 * w + unknown.trailing_zeros() as usize / 16)
        })
    }

    /// Where the transaction finds `key` (of hash `h`):
    /// - [`Lookup::At`]: a hint to check for a key found by its print,
    ///   exact for one of this thread's exact keys;
    /// - [`Lookup::Probe`]: this process has not seen the key, and no known
    ///   print of its home bucket is its: the first slot whose print is
    ///   unknown. Slots keep their keys for good and the free slots of a
    ///   chain are its tail, so the key is in its chain only if that slot is
    ///   taken: a READ of that one record tells a missing key (a free slot)
    ///   from a present one (FORD reads the whole bucket);
    /// - [`Lookup::Bucket`]: otherwise (a print shared in the bucket, a
    ///   stale key, or every slot's print known: the chain may go on).
    pub(crate) fn lookup(&self, t: &Table, replicas: usize, key: u64, h: u64) -> Lookup {
        let (b, p) = home_and_print(t, h);
        let scan = self.scan(t, b, p);
        if scan.hits == 1 && (self.colliders.is_empty() || !self.colliders.contains(&(t.id, key))) {
            let off = b * t.bucket_bytes() + layout::slot_offset(t.value_size, scan.hit);
            return Lookup::At(t.array_mirrors(t.vbase[0].add(off), replicas));
        }
        if !self.exact.is_empty() {
            if let Some(loc) = self.exact.get(&(t.id, key)) {
                return Lookup::At(*loc);
            }
        }
        // The first unknown slot is looked for only when no print matched.
        match (scan.hits == 0).then(|| self.unknown_slot(t, b)).flatten() {
            Some(s) => Lookup::Probe(s),
            None => Lookup::Bucket,
        }
    }

    /// Whether lookups should be overlapped with other coroutines' work
    /// ([`prefetch`](Self::prefetch), yield, then [`lookup`](Self::lookup)): the
    /// prints are too large to stay in the CPU's caches.
    pub(crate) fn overlap(&self) -> bool {
        self.prints.bytes.load(Ordering::Relaxed) > OVERLAP_ABOVE
    }

    /// Starts loading the line [`lookup`](Self::lookup) will read for a key of
    /// hash `h`.
    pub(crate) fn prefetch(&self, t: &Table, h: u64) {
        if let Some(lines) = self.prints.table(t) {
            smart_core::runtime::prefetch_local(&lines[home_and_print(t, h).0 as usize]);
        }
    }

    /// Remembers that `key` (of hash `h`) lives at `loc` (slots keep their
    /// keys for good).
    pub(crate) fn insert(&mut self, t: &Table, key: u64, h: u64, loc: Loc) {
        let Some(off) = Self::in_array(t, loc[0]) else {
            self.exact.insert((t.id, key), loc);
            return;
        };
        let (b, p) = home_and_print(t, h);
        debug_assert_eq!(off / t.bucket_bytes(), b, "a key in the array lies in its home bucket");
        let s = t.slot_of(loc[0]);
        let Scan { hits, hit } = self.scan(t, b, p);
        if (hits > 0 && (hits, hit) != (1, s)) || self.colliders.contains(&(t.id, key)) {
            // Its print will not serve it: another slot has it too.
            self.exact.insert((t.id, key), loc);
        }
        if let Some(lines) = self.prints.table_or_new(t) {
            set_print(lines, b, s, || p);
        }
    }

    /// Records that slot `s` of table `t`'s bucket `b` (in the array) holds
    /// `key`, seen in passing while reading that bucket for another key, if
    /// its print is not known yet.
    pub(crate) fn learn(&self, t: &Table, b: u64, s: usize, key: u64) {
        if let Some(lines) = self.prints.table_or_new(t) {
            set_print(lines, b, s, || {
                let (hb, p) = home_and_print(t, layout::key_hash(key));
                debug_assert_eq!(hb, b, "a key in the array lies in its home bucket");
                p
            });
        }
    }

    /// Forgets `key`'s exact address (an overflow slot's), so that its next
    /// lookup reads its bucket again.
    pub(crate) fn forget(&mut self, t: &Table, key: u64) {
        self.exact.remove(&(t.id, key));
    }

    /// Marks `key` as one whose print led to another key's slot.
    pub(crate) fn stale(&mut self, t: &Table, key: u64) {
        self.colliders.insert((t.id, key));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use smart_core::{Runtime, RuntimeConfig, Transport};

    use super::*;
    use crate::db::{DbSpec, TableSpec};
    use crate::{Abort, TxnError};

    fn kh(key: u64) -> u64 {
        layout::key_hash(key)
    }

    /// The lookups' two questions, apart.
    impl AddrCache {
        fn get(&self, t: &Table, replicas: usize, key: u64, h: u64) -> Option<Loc> {
            match self.lookup(t, replicas, key, h) {
                Lookup::At(loc) => Some(loc),
                _ => None,
            }
        }

        fn first_unknown(&self, t: &Table, h: u64) -> Option<usize> {
            match self.lookup(t, 1, u64::MAX, h) {
                Lookup::Probe(s) => Some(s),
                _ => None,
            }
        }
    }

    /// The first `n` pairs of keys of `t` with the same home bucket and the
    /// same print.
    fn twins(t: &Table, n: usize) -> Vec<(u64, u64)> {
        let mut seen = std::collections::HashMap::new();
        let mut pairs = Vec::new();
        for k in 1..10_000_000u64 {
            if let Some(o) = seen.remove(&home_and_print(t, kh(k))) {
                pairs.push((o, k));
                if pairs.len() == n {
                    return pairs;
                }
            } else {
                seen.insert(home_and_print(t, kh(k)), k);
            }
        }
        unreachable!("16-bit prints collide long before")
    }

    /// Two tables (ids 0 and 1) of `buckets` buckets on blades 0 and 1.
    fn db(buckets: u64) -> Db {
        let base = [GlobalAddr::new(0, 1 << 20), GlobalAddr::new(1, 1 << 20), GlobalAddr::NULL, GlobalAddr::NULL];
        let t = |id| Table::new(id, 8, buckets, base, 2);
        Db {
            name: "t".into(),
            tables: vec![t(0), t(1)],
            replicas: 2,
            blades: 2,
            registry: GlobalAddr::new(0, 0),
            max_value: 8,
            lost: Vec::new(),
            joining: Vec::new(),
            mirror: None,
        }
    }

    /// `key`'s slot `s` of its home bucket, on both replicas.
    fn slot(t: &Table, key: u64, s: usize) -> Loc {
        let off = home_and_print(t, kh(key)).0 * t.bucket_bytes() + layout::slot_offset(t.value_size, s);
        [t.base[0].add(off), t.base[1].add(off), GlobalAddr::NULL, GlobalAddr::NULL]
    }

    #[test]
    fn a_scan_finds_what_a_lane_by_lane_pass_finds() {
        use rand::{Rng, SeedableRng};
        let db = db(1);
        let t = &db.tables[0];
        let c = AddrCache::new(Arc::new(Prints::new(&db)));
        let lines = c.prints.table_or_new(t).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..20_000 {
            // Lanes from a few prints (0: unknown), so that hits, repeats
            // and unknown slots are common; prints with the top bit set too.
            let p: u16 = [1, 0x7fff, 0x8000, 0xffff, 0x1234][rng.random_range(0..5)];
            let mut lanes = [0u16; 4 * WORDS];
            for l in lanes.iter_mut().take(SLOTS) {
                *l = [0, p, p ^ 1, p ^ 0x8000, p.wrapping_add(1)][rng.random_range(0..5)];
            }
            for (w, word) in lines[0].0[..WORDS].iter().enumerate() {
                let v = (0..4).fold(0u64, |v, l| v | u64::from(lanes[4 * w + l]) << (16 * l));
                word.store(v, Ordering::Relaxed);
            }
            let got = c.scan(t, 0, p);
            let hits: Vec<usize> = (0..SLOTS).filter(|&s| lanes[s] == p).collect();
            assert_eq!(got.hits, hits.len(), "{lanes:x?} for {p:#x}");
            if let Some(&last) = hits.last() {
                assert_eq!(got.hit, last, "{lanes:x?} for {p:#x}");
            }
            assert_eq!(c.unknown_slot(t, 0), (0..SLOTS).find(|&s| lanes[s] == 0), "{lanes:x?}");
        }
    }

    #[test]
    fn the_cache_finds_array_slots_by_print_and_overflow_slots_exactly() {
        let db = db(100);
        let (t, other) = (&db.tables[1], &db.tables[0]);
        for s in [0, 3, 4, SLOTS - 1] {
            let mut c = AddrCache::new(Arc::new(Prints::new(&db)));
            c.insert(t, 5, kh(5), slot(t, 5, s));
            assert_eq!(c.get(t, 2, 5, kh(5)), Some(slot(t, 5, s)), "slot {s}, mirrors at the same offset");
        }
        let mut c = AddrCache::new(Arc::new(Prints::new(&db)));
        assert_eq!(c.get(t, 2, 5, kh(5)), None);
        c.insert(t, 5, kh(5), slot(t, 5, 3));
        assert_eq!(c.get(t, 1, 5, kh(5)).map(|l| l[1]), Some(GlobalAddr::NULL), "one replica");
        let far = [GlobalAddr::new(0, 1 << 30), GlobalAddr::new(1, 1 << 29), GlobalAddr::NULL, GlobalAddr::NULL];
        c.insert(t, 6, kh(6), far);
        assert_eq!(c.get(t, 2, 6, kh(6)), Some(far), "overflow slots keep their own mirrors");
        assert_eq!(c.get(other, 2, 5, kh(5)), None, "tables apart");
        c.stale(other, 5);
        assert!(c.get(t, 2, 5, kh(5)).is_some());
        c.stale(t, 5);
        assert_eq!(c.get(t, 2, 5, kh(5)), None, "a stale key trusts no print");
    }

    #[test]
    fn threads_share_prints_but_not_their_stale_keys() {
        let db = db(100);
        let t = &db.tables[0];
        let prints = Arc::new(Prints::new(&db));
        let (mut a, mut b) = (AddrCache::new(prints.clone()), AddrCache::new(prints));
        a.insert(t, 5, kh(5), slot(t, 5, 2));
        assert_eq!(b.get(t, 2, 5, kh(5)), Some(slot(t, 5, 2)));
        b.stale(t, 5);
        assert_eq!(b.get(t, 2, 5, kh(5)), None);
        assert_eq!(a.get(t, 2, 5, kh(5)), Some(slot(t, 5, 2)));
        // Neighbouring lanes of one word are set independently.
        let keys: Vec<u64> =
            (6..).filter(|&k| home_and_print(t, kh(k)).0 == home_and_print(t, kh(5)).0).take(4).collect();
        for (s, &k) in keys.iter().enumerate() {
            b.insert(t, k, kh(k), slot(t, k, 4 + s));
        }
        for (s, &k) in keys.iter().enumerate() {
            assert_eq!(a.get(t, 2, k, kh(k)), Some(slot(t, k, 4 + s)));
        }
    }

    #[test]
    fn a_probe_goes_to_the_first_unknown_slot_only_past_other_keys_prints() {
        let db = db(7);
        let t = &db.tables[0];
        let mut c = AddrCache::new(Arc::new(Prints::new(&db)));
        let home = home_and_print(t, kh(1)).0;
        let keys: Vec<u64> = (2..).filter(|&k| home_and_print(t, kh(k)).0 == home).take(SLOTS + 1).collect();
        let (probe, rest) = keys.split_last().unwrap();
        assert_eq!(c.first_unknown(t, kh(1)), Some(0), "no prints yet: slot 0");
        // Slots learned out of order: the first unknown one counts.
        c.learn(t, home, 1, rest[1]);
        assert_eq!(c.first_unknown(t, kh(1)), Some(0));
        c.insert(t, rest[0], kh(rest[0]), slot(t, rest[0], 0));
        assert_eq!(c.first_unknown(t, kh(1)), Some(2));
        assert_eq!(c.first_unknown(t, kh(rest[1])), None, "a key whose print is known is not probed for");
        for (s, &k) in rest.iter().enumerate().skip(2) {
            c.learn(t, home, s, k);
        }
        assert_eq!(c.first_unknown(t, kh(*probe)), None, "every slot known: the chain may go on");
        // Learning never overwrites a print.
        c.learn(t, home, 0, *probe);
        assert_eq!(c.get(t, 2, rest[0], kh(rest[0])), Some(slot(t, rest[0], 0)));
    }

    #[test]
    fn equal_prints_in_a_bucket_are_not_trusted() {
        let db = db(7);
        let t = &db.tables[0];
        let (a, b) = twins(t, 1)[0];
        let mut c = AddrCache::new(Arc::new(Prints::new(&db)));
        c.insert(t, a, kh(a), slot(t, a, 0));
        // `b` shares the hint: a stale address, for the fetch to catch.
        assert_eq!(c.get(t, 2, b, kh(b)), Some(slot(t, a, 0)));
        c.insert(t, b, kh(b), slot(t, b, 4));
        assert_eq!(c.get(t, 2, b, kh(b)), Some(slot(t, b, 4)), "found where its print is not alone: kept exactly");
        let d = AddrCache::new(c.prints.clone());
        assert_eq!(d.get(t, 2, a, kh(a)), None, "two slots match: neither is trusted");
        assert_eq!(d.get(t, 2, b, kh(b)), None);
        assert_eq!((d.first_unknown(t, kh(a)), d.first_unknown(t, kh(b))), (None, None), "nor probed past");
        // A thread that meets `a` again keeps it exactly too.
        c.insert(t, a, kh(a), slot(t, a, 0));
        assert_eq!((c.get(t, 2, a, kh(a)), c.get(t, 2, b, kh(b))), (Some(slot(t, a, 0)), Some(slot(t, b, 4))));
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

    async fn put(d: &crate::Dtx, k: u64) {
        let mut tx = d.txn(0);
        tx.begin();
        let i = tx.insert(0, k);
        tx.execute().await.unwrap();
        tx.write(i, &k.to_le_bytes());
        tx.commit().await.unwrap();
    }

    async fn get(d: &crate::Dtx, k: u64) -> Option<u64> {
        let mut tx = d.txn(0);
        tx.begin();
        let i = tx.read(0, k);
        match tx.execute().await {
            Ok(()) => {
                tx.commit().await.unwrap();
                Some(u64::from_le_bytes(tx.value(i).try_into().unwrap()))
            }
            Err(TxnError::Abort(Abort::NotFound)) => None,
            Err(e) => panic!("read of {k}: {e}"),
        }
    }

    #[test]
    fn a_missing_key_costs_one_slot_and_keys_the_cache_never_saw_are_found() {
        let (t, mut rt, db, reg) = open(200);
        let other = crate::Registration::register(t.clone(), db.clone(), 1, 1, Duration::from_secs(30)).unwrap();
        let (dtx, dtx2) = (reg.open_thread(rt.ctx()), other.open_thread(rt.ctx()));
        let ctx = rt.ctx();
        let (rb, bb) = (db.table(0).record_bytes() as u64, db.table(0).bucket_bytes());
        let (t2, db2) = (t.clone(), db.clone());
        rt.block_on(async move {
            // This compute blade inserts, so its prints know every slot.
            for k in 0..100 {
                put(&dtx, k).await;
            }
            let missing = async |dtx: &crate::Dtx| {
                let (s, read) = (dtx.stats(), ctx.stats().bytes_read);
                for k in 1000..1100 {
                    assert_eq!(get(dtx, k).await, None, "key {k}");
                }
                let now = dtx.stats();
                assert_eq!((now.slot_probes - s.slot_probes, now.slot_probes_taken - s.slot_probes_taken), (100, 0));
                assert_eq!(ctx.stats().bytes_read - read, 100 * rb, "a record per missing key, not a bucket ({bb} B)");
            };
            missing(&dtx).await;
            // Another compute blade adds keys behind those slots: this one's
            // probes meet them (in reverse order, a later key's probe meets
            // an earlier one), and its bucket reads find them.
            for k in 100..160 {
                put(&dtx2, k).await;
            }
            for k in (0..160).rev() {
                assert_eq!(get(&dtx, k).await, Some(k), "key {k}");
            }
            assert!(dtx.stats().slot_probes_taken > 0);
            // Those bucket reads learned the slots they passed.
            missing(&dtx).await;
            // A compute blade that never saw a slot finds every key.
            let fresh = crate::Registration::register(t2.clone(), db2, 1, 1, Duration::from_secs(30)).unwrap();
            let dtx3 = fresh.open_thread(ctx.clone());
            for k in (0..160).rev() {
                assert_eq!(get(&dtx3, k).await, Some(k), "key {k}");
            }
            assert_eq!(get(&dtx3, 5000).await, None);
            fresh.close(&*t2).unwrap();
        });
        other.close(&*t).unwrap();
        reg.close(&*t).unwrap();
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
