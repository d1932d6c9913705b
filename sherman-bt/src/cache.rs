//! The compute side's caches: Sherman's index cache of level-1 pages and
//! Smart-BT's speculative-lookup cache. Both are per thread, bounded, and
//! only ever a hint: whatever they lead to is validated on the blade.

use std::collections::BTreeMap;

use smart_core::GlobalAddr;

use crate::layout::{Format, PageRef};

/// Most bytes of level-1 pages the index cache holds (8 MiB: 8 192 pages
/// of 1 KiB).
pub const INDEX_CACHE_BYTES: usize = 8 << 20;

/// Entries of the speculative-lookup cache (16 bytes each): sets of
/// [`SPEC_WAYS`].
pub const SPEC_ENTRIES: usize = 1 << 18;

/// Ways per set of the speculative-lookup cache.
pub const SPEC_WAYS: usize = 4;

/// Level-1 pages keyed by their `lowest`, each with its range: the leaf for
/// a key is one READ away. A page found stale (the leaf it names no longer
/// holds the key) is dropped by the caller. In a tree of keys of at most 8
/// bytes the map's keys are numbers (the key's bytes, zero-padded, big
/// endian, then its length: the same order as the bytes'), so a lookup
/// compares words, not byte strings.
#[derive(Debug)]
pub(crate) struct IndexCache {
    f: Format,
    pages: Pages,
    /// Pages it holds at most.
    most: usize,
}

#[derive(Debug)]
enum Pages {
    Short(BTreeMap<u128, Box<[u8]>>),
    Long(BTreeMap<Vec<u8>, Box<[u8]>>),
}

/// A key of at most 8 bytes as a number in the same order (a longer one,
/// which such a tree never holds, after every key with its first 8 bytes).
#[inline]
fn short(k: &[u8]) -> u128 {
    let mut b = [0u8; 8];
    let n = k.len().min(8);
    b[..n].copy_from_slice(&k[..n]);
    u128::from(u64::from_be_bytes(b)) << 8 | k.len().min(255) as u128
}

/// The map key of a cached page, to drop it.
enum At<'a> {
    Short(u128),
    Long(&'a [u8]),
}

/// [`At`], owned.
enum At2 {
    Short(u128),
    Long(Vec<u8>),
}

impl IndexCache {
    pub(crate) fn new(f: Format) -> IndexCache {
        let pages = if f.key_max <= 8 { Pages::Short(BTreeMap::new()) } else { Pages::Long(BTreeMap::new()) };
        IndexCache { f, pages, most: (INDEX_CACHE_BYTES / f.page).max(1) }
    }

    fn len_(&self) -> usize {
        match &self.pages {
            Pages::Short(m) => m.len(),
            Pages::Long(m) => m.len(),
        }
    }

    /// Caches a validated level-1 page. When full, the victim is the page
    /// after the newcomer in key order (the first after the last): one
    /// lookup, no bookkeeping per hit.
    pub(crate) fn insert(&mut self, p: PageRef<'_>) {
        use std::ops::Bound;
        let low = p.lowest();
        let full = self.len_() >= self.most;
        match &mut self.pages {
            Pages::Short(m) => {
                let k = short(low.as_slice());
                if let Some(old) = m.get_mut(&k) {
                    old.copy_from_slice(p.bytes());
                    return;
                }
                if full {
                    let v = m.range((Bound::Excluded(k), Bound::Unbounded)).next().or_else(|| m.iter().next());
                    if let Some(v) = v.map(|(v, _)| *v) {
                        m.remove(&v);
                    }
                }
                m.insert(k, p.bytes().into());
            }
            Pages::Long(m) => {
                if let Some(old) = m.get_mut(low.as_slice()) {
                    old.copy_from_slice(p.bytes());
                    return;
                }
                if full {
                    let after = m.range::<[u8], _>((Bound::Excluded(low.as_slice()), Bound::Unbounded)).next();
                    if let Some(v) = after.or_else(|| m.iter().next()).map(|(v, _)| v.clone()) {
                        m.remove(&v);
                    }
                }
                m.insert(low.as_slice().to_vec(), p.bytes().into());
            }
        }
    }

    /// The cached page whose range holds `key`, and its map key.
    fn covering(&self, key: &[u8]) -> Option<(At<'_>, PageRef<'_>)> {
        use std::ops::Bound;
        let (at, b) = match &self.pages {
            Pages::Short(m) => {
                let (k, b) = m.range(..=short(key)).next_back()?;
                (At::Short(*k), b)
            }
            Pages::Long(m) => {
                let (k, b) = m.range::<[u8], _>((Bound::Unbounded, Bound::Included(key))).next_back()?;
                (At::Long(k), b)
            }
        };
        let p = PageRef::trusted(&b[..], self.f);
        p.covers(key).then_some((at, p))
    }

    /// Forgets every page.
    pub(crate) fn clear(&mut self) {
        match &mut self.pages {
            Pages::Short(m) => m.clear(),
            Pages::Long(m) => m.clear(),
        }
    }

    /// The leaf a cached page names for `key`.
    pub(crate) fn child(&self, key: &[u8]) -> Option<GlobalAddr> {
        self.covering(key).map(|(_, p)| p.child_for(key))
    }

    /// Drops the cached page covering `key`.
    pub(crate) fn invalidate(&mut self, key: &[u8]) {
        let at = match self.covering(key) {
            Some((At::Short(k), _)) => At2::Short(k),
            Some((At::Long(k), _)) => At2::Long(k.to_vec()),
            None => return,
        };
        match (&mut self.pages, at) {
            (Pages::Short(m), At2::Short(k)) => {
                m.remove(&k);
            }
            (Pages::Long(m), At2::Long(k)) => {
                m.remove(&k);
            }
            _ => {}
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len_()
    }
}

/// Where keys were last seen: key (by a 64-bit hash; the entry read
/// names the key it holds) → (leaf, entry), set-associative (a
/// direct-mapped table lost a fifth of YCSB C's lookups at Zipf 0.99 to
/// hot keys sharing a slot). Within a set, a new key enters first and the
/// last one leaves; a hit moves its key one place forward, so hot keys
/// stay.
#[derive(Debug)]
pub(crate) struct SpecCache {
    /// (key hash, entry index:8 | leaf address:56); a zero location is
    /// empty.
    entries: Vec<(u64, u64)>,
}

/// The first entry of `key`'s set: Fibonacci hashing, the product's top
/// bits (its middle bits spread consecutive keys over few sets).
fn set(key: u64) -> usize {
    const SETS_LOG2: u32 = (SPEC_ENTRIES / SPEC_WAYS).trailing_zeros();
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SETS_LOG2)) as usize * SPEC_WAYS
}

impl SpecCache {
    pub(crate) fn new() -> Self {
        SpecCache { entries: vec![(0, 0); SPEC_ENTRIES] }
    }

    /// Where the key of hash `key` was last seen.
    pub(crate) fn get(&mut self, key: u64) -> Option<(GlobalAddr, usize)> {
        let s = set(key);
        let ways = &mut self.entries[s..s + SPEC_WAYS];
        let w = ways.iter().position(|&(k, loc)| k == key && loc != 0)?;
        let loc = ways[w].1;
        if w > 0 {
            ways.swap(w, w - 1);
        }
        Some((GlobalAddr::from_raw(loc & ((1 << 56) - 1)), (loc >> 56) as usize))
    }

    /// Remembers that `key` is in entry `i` of leaf `leaf`.
    pub(crate) fn put(&mut self, key: u64, leaf: GlobalAddr, i: usize) {
        if leaf.blade() >= 256 {
            return;
        }
        let loc = (i as u64) << 56 | leaf.raw();
        let s = set(key);
        let ways = &mut self.entries[s..s + SPEC_WAYS];
        match ways.iter().position(|&(k, l)| k == key && l != 0) {
            Some(w) => ways[w].1 = loc,
            None => {
                ways.rotate_right(1);
                ways[0] = (key, loc);
            }
        }
    }

    /// Forgets `key`.
    pub(crate) fn forget(&mut self, key: u64) {
        let s = set(key);
        for e in &mut self.entries[s..s + SPEC_WAYS] {
            if e.0 == key {
                *e = (0, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PageBuf;

    fn level1(lowest: u64, highest: Option<u64>, child: u64) -> PageBuf {
        let high = highest.map(u64::to_be_bytes);
        let mut p = PageBuf::new(Format::paper(), 1, &lowest.to_be_bytes(), high.as_ref().map(|h| &h[..]), None);
        p.set_leftmost(GlobalAddr::new(0, child));
        p.seal(2);
        p
    }

    #[test]
    fn the_index_cache_finds_pages_by_range_and_stays_bounded() {
        let mut c = IndexCache::new(Format::paper());
        let a = level1(0, Some(100), 4096);
        let b = level1(100, None, 8192);
        c.insert(a.view());
        c.insert(b.view());
        let k = u64::to_be_bytes;
        assert_eq!(c.child(&k(5)).map(|g| g.offset()), Some(4096));
        assert_eq!(c.child(&k(100)).map(|g| g.offset()), Some(8192));
        assert_eq!(c.child(&k(u64::MAX)).map(|g| g.offset()), Some(8192));
        assert_eq!(c.child(&[0xff; 20]).map(|g| g.offset()), Some(8192), "a longer key after every 8-byte one");
        c.invalidate(&k(50));
        assert_eq!(c.child(&k(5)), None);
        let most = INDEX_CACHE_BYTES / 1024;
        for i in 0..(most as u64 + 10) {
            c.insert(level1(1000 + i * 10, Some(1000 + i * 10 + 10), 4096).view());
        }
        assert!(c.len() <= most);
        assert!(c.child(&k(1000 + (most as u64 + 9) * 10)).is_some(), "the newest page is in");
    }

    #[test]
    fn the_spec_cache_keeps_hot_keys_of_a_set() {
        let mut s = SpecCache::new();
        // Keys of one set.
        let same: Vec<u64> = (0..1_000_000u64).filter(|&k| set(k) == set(1)).take(SPEC_WAYS + 2).collect();
        for &k in &same[..SPEC_WAYS] {
            s.put(k, GlobalAddr::new(0, 4096), 1);
        }
        // The first key is used, then newcomers arrive: it stays.
        for &k in &same[SPEC_WAYS..] {
            assert!(s.get(same[0]).is_some());
            assert!(s.get(same[0]).is_some());
            s.put(k, GlobalAddr::new(0, 8192), 2);
        }
        assert!(s.get(same[0]).is_some(), "a hot key survived newcomers");
        assert!(s.get(same[SPEC_WAYS + 1]).is_some(), "the newest is in");
        assert_eq!(s.entries[set(1)..set(1) + SPEC_WAYS].iter().filter(|e| e.1 != 0).count(), SPEC_WAYS);
    }

    #[test]
    fn consecutive_keys_spread_over_the_sets() {
        let mut s = SpecCache::new();
        let n = (SPEC_ENTRIES / 2) as u64;
        for k in 0..n {
            s.put(k, GlobalAddr::new(0, 4096 * (k + 1)), (k % 45) as usize);
        }
        let found =
            (0..n).filter(|&k| s.get(k) == Some((GlobalAddr::new(0, 4096 * (k + 1)), (k % 45) as usize))).count();
        assert!(found as f64 > 0.95 * n as f64, "{found} of {n} kept at half load");
    }

    #[test]
    fn the_spec_cache_remembers_and_forgets() {
        let mut s = SpecCache::new();
        assert_eq!(s.get(7), None);
        s.put(7, GlobalAddr::new(3, 1 << 20), 44);
        assert_eq!(s.get(7), Some((GlobalAddr::new(3, 1 << 20), 44)));
        s.forget(7);
        assert_eq!(s.get(7), None);
    }
}
