//! Remote layout of the tree (Sherman, Wang et al., SIGMOD '22, with
//! Smart-BT's per-line sequence numbers, Ren et al., ASPLOS '24), declared
//! once.
//!
//! ```text
//! page (1 KiB)   16 lines of 64 bytes
//! line           [seq u32][check u32][56 payload bytes]
//! seq            page sequence number << 1 | 1 if the page is a leaf; the
//!                same in every line of a consistent page
//! check          a 32-bit hash of (seq, line index, payload): a line torn
//!                inside itself fails it
//! line 0 payload [magic u32 "SBTP"][level u8][flags u8][count u16]
//!                [lowest u64][highest u64][sibling u64][leftmost u64][0 × 16]
//!                flags bit 0: highest is +∞ (the last page of its level)
//! lines 1..16    3 entries of 18 bytes each at payload offsets 0, 18, 36:
//!                [key u64][value or child u64][meta u16] (meta bit 0: valid)
//! ```
//! A page covers the keys `[lowest, highest)`; its right sibling (B-link, on
//! every level) covers `[highest, …)`. A page's `lowest` never changes: a
//! split keeps the lower half in place and moves the upper half to a new
//! right sibling. Internal pages (level ≥ 1) hold `count` entries sorted by
//! key: `leftmost` covers `[lowest, key₀)`, the child of entry `i` covers
//! `[keyᵢ, keyᵢ₊₁)`. Leaves (level 0) hold up to [`ENTRIES`] entries in any
//! order; an entry is live when its valid bit is set.
//!
//! ```text
//! tree meta (256 bytes, named root "sherman:NAME" on blade 0)
//!                [magic u64 "SHERMAN1"][root word u64][blades u64]
//!                [lock table address u64 × blades] … at 240: [name block u64]
//! root word      root level:8 | root page address:56 (changed by CAS)
//! lock table     LOCK_SLOTS words of 8 bytes on every blade; the lock of
//!                page P is word hash(P) mod LOCK_SLOTS on P's blade;
//!                0 = free, else the holder's tag (client id:32 | count:32)
//! ```
//!
//! Why the check beside the sequence number: Smart-BT relies on a 64-byte
//! line being read and written as one unit by the RNIC (a PCIe cache-line
//! transfer). smart-core's consistency model promises only 8-byte words
//! (its chaos backend copies word by word), so a line may tear inside
//! itself; the check catches that, the equal sequence numbers catch a page
//! torn across lines.

use smart_core::GlobalAddr;

/// Bytes per page.
pub const PAGE: usize = 1024;
/// Bytes per line.
pub const LINE: usize = 64;
/// Lines per page.
pub const LINES: usize = PAGE / LINE;
/// Bytes of a line's header (sequence number and check).
pub const LINE_HEADER: usize = 8;
/// Bytes of an entry.
pub const ENTRY: usize = 18;
/// Entries per line.
pub const PER_LINE: usize = 3;
/// Entries per page (leaf entries; internal pages hold this many keys plus
/// `leftmost`).
pub const ENTRIES: usize = (LINES - 1) * PER_LINE;
/// Page magic "SBTP".
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"SBTP");
/// Tree meta magic "SHERMAN1".
pub const META_MAGIC: u64 = u64::from_le_bytes(*b"SHERMAN1");
/// Bytes of the tree meta.
pub const META: usize = 256;
/// Offset of the root word in the meta.
pub const ROOT_WORD: u64 = 8;
/// Offset of the name block's address in the meta.
pub const NAME_WORD: usize = META - 16;
/// Most blades a tree spans (lock-table addresses the meta holds).
pub const MAX_BLADES: usize = (NAME_WORD - 24) / 8;
/// Lock words per blade.
pub const LOCK_SLOTS: u64 = 32_768;
/// Deepest tree (levels above the leaves), far beyond any realistic size.
pub const MAX_LEVEL: u8 = 32;

const _: () = assert!(LINE_HEADER + PER_LINE * ENTRY <= LINE);

// Line-0 payload fields (offsets in the page).
const OFF_MAGIC: usize = 8;
const OFF_LEVEL: usize = 12;
const OFF_FLAGS: usize = 13;
const OFF_COUNT: usize = 14;
const OFF_LOWEST: usize = 16;
const OFF_HIGHEST: usize = 24;
const OFF_SIBLING: usize = 32;
const OFF_LEFTMOST: usize = 40;
const FLAG_HIGH_INF: u8 = 1;
const META_VALID: u16 = 1;

/// Line and offset in the page of entry `i`.
#[inline]
pub const fn entry_offset(i: usize) -> usize {
    (1 + i / PER_LINE) * LINE + LINE_HEADER + (i % PER_LINE) * ENTRY
}

/// The line (0..16) that holds entry `i`.
#[inline]
pub const fn entry_line(i: usize) -> usize {
    1 + i / PER_LINE
}

#[inline]
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

#[inline]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

#[inline]
fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}

/// The check of line `i` (64 bytes) carrying sequence number `seq`.
#[inline]
pub fn line_check(line: &[u8], i: usize, seq: u32) -> u32 {
    let mut h: u64 = u64::from(seq) ^ (i as u64) << 32 ^ 0x243f_6a88_85a3_08d3;
    for w in line[LINE_HEADER..LINE].chunks_exact(8) {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    (h ^ h >> 32) as u32
}

/// Whether line `i` (64 bytes) is intact: its check matches. Returns its
/// sequence number.
#[inline]
pub fn line_seq(line: &[u8], i: usize) -> Option<u32> {
    let seq = u32_at(line, 0);
    (u32_at(line, 4) == line_check(line, i, seq)).then_some(seq)
}

/// Whether a sequence number marks a leaf.
#[inline]
pub const fn seq_is_leaf(seq: u32) -> bool {
    seq & 1 == 1
}

/// One entry of a page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: u64,
    /// The value (leaf) or the child page's raw address (internal).
    pub value: u64,
    /// Whether the entry is live (leaves; internal entries below `count`
    /// are always live).
    pub valid: bool,
}

/// Decodes entry `slot` (0..3) of a 64-byte line.
#[inline]
pub fn line_entry(line: &[u8], slot: usize) -> Entry {
    let o = LINE_HEADER + slot * ENTRY;
    Entry { key: u64_at(line, o), value: u64_at(line, o + 8), valid: u16_at(line, o + 16) & META_VALID != 0 }
}

/// A read-only view of a validated page.
#[derive(Clone, Copy, Debug)]
pub struct PageRef<'a>(&'a [u8]);

impl<'a> PageRef<'a> {
    /// Validates `b` (one page): every line intact, every line with the same
    /// sequence number, the magic right. `None` if the read was torn (or
    /// the bytes are not a page).
    pub fn check(b: &'a [u8]) -> Option<PageRef<'a>> {
        if b.len() != PAGE {
            return None;
        }
        let seq = line_seq(&b[..LINE], 0)?;
        for i in 1..LINES {
            if line_seq(&b[i * LINE..(i + 1) * LINE], i)? != seq {
                return None;
            }
        }
        (u32_at(b, OFF_MAGIC) == PAGE_MAGIC).then_some(PageRef(b))
    }

    /// A view of bytes validated before (a cached copy).
    pub(crate) fn trusted(b: &'a [u8]) -> PageRef<'a> {
        debug_assert_eq!(b.len(), PAGE);
        PageRef(b)
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The sequence number (with the leaf bit).
    pub fn seq(&self) -> u32 {
        u32_at(self.0, 0)
    }

    /// The level (0 = leaf).
    pub fn level(&self) -> u8 {
        self.0[OFF_LEVEL]
    }

    /// Whether this is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }

    /// Entries in use (internal pages).
    pub fn count(&self) -> usize {
        usize::from(u16_at(self.0, OFF_COUNT)).min(ENTRIES)
    }

    /// The lowest key the page covers.
    pub fn lowest(&self) -> u64 {
        u64_at(self.0, OFF_LOWEST)
    }

    /// The first key above the page's range, `None` for +∞.
    pub fn highest(&self) -> Option<u64> {
        (self.0[OFF_FLAGS] & FLAG_HIGH_INF == 0).then(|| u64_at(self.0, OFF_HIGHEST))
    }

    /// The right sibling, `None` for the last page of a level.
    pub fn sibling(&self) -> Option<GlobalAddr> {
        let s = u64_at(self.0, OFF_SIBLING);
        (s != 0).then(|| GlobalAddr::from_raw(s))
    }

    /// The child covering keys below the first entry (internal pages).
    pub fn leftmost(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.0, OFF_LEFTMOST))
    }

    /// Whether `key` is in `[lowest, highest)`.
    pub fn covers(&self, key: u64) -> bool {
        key >= self.lowest() && self.highest().is_none_or(|h| key < h)
    }

    /// Whether `key` is at or beyond `highest` (then it is to the right).
    pub fn is_right_of(&self, key: u64) -> bool {
        self.highest().is_some_and(|h| key >= h)
    }

    /// Entry `i`.
    #[inline]
    pub fn entry(&self, i: usize) -> Entry {
        let o = entry_offset(i);
        Entry { key: u64_at(self.0, o), value: u64_at(self.0, o + 8), valid: u16_at(self.0, o + 16) & META_VALID != 0 }
    }

    /// The live entries: every valid one of a leaf, the first `count` of an
    /// internal page.
    pub fn live(&self) -> impl Iterator<Item = (usize, Entry)> + 'a {
        let p = *self;
        let n = if p.is_leaf() { ENTRIES } else { p.count() };
        (0..n).map(move |i| (i, p.entry(i))).filter(move |(_, e)| !p.is_leaf() || e.valid)
    }

    /// A leaf's entry holding `key`, if any.
    #[inline]
    pub fn find(&self, key: u64) -> Option<(usize, u64)> {
        (0..ENTRIES).find_map(|i| {
            let e = self.entry(i);
            (e.valid && e.key == key).then_some((i, e.value))
        })
    }

    /// An internal page's child covering `key` (which the page covers).
    pub fn child_for(&self, key: u64) -> GlobalAddr {
        let n = self.count();
        // The last entry whose key ≤ `key`, by binary search over the
        // sorted entries.
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.entry(mid).key <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            self.leftmost()
        } else {
            GlobalAddr::from_raw(self.entry(lo - 1).value)
        }
    }
}

/// A page being built or modified, sealed (sequence numbers and checks
/// written) before it is written.
#[derive(Clone)]
pub struct PageBuf(pub Box<[u8; PAGE]>);

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.view();
        f.debug_struct("PageBuf").field("level", &p.level()).field("lowest", &p.lowest()).finish_non_exhaustive()
    }
}

impl PageBuf {
    /// An empty page of `level` covering `[lowest, highest)` (`None`: +∞).
    pub fn new(level: u8, lowest: u64, highest: Option<u64>, sibling: Option<GlobalAddr>) -> PageBuf {
        let mut p = PageBuf(Box::new([0; PAGE]));
        p.reset(level, lowest, highest, sibling);
        p
    }

    /// Empties this buffer into a new page (see [`PageBuf::new`]).
    pub fn reset(&mut self, level: u8, lowest: u64, highest: Option<u64>, sibling: Option<GlobalAddr>) {
        self.0.fill(0);
        self.0[OFF_MAGIC..OFF_MAGIC + 4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
        self.0[OFF_LEVEL] = level;
        self.set_lowest(lowest);
        self.set_highest(highest);
        self.set_sibling(sibling);
    }

    /// A copy of a validated page.
    pub fn from_page(p: PageRef<'_>) -> PageBuf {
        let mut b = PageBuf(Box::new([0; PAGE]));
        b.0.copy_from_slice(p.bytes());
        b
    }

    /// Copies a validated page into this buffer.
    pub fn copy_from(&mut self, p: PageRef<'_>) {
        self.0.copy_from_slice(p.bytes());
    }

    /// A view (not validated: the buffer is this client's own).
    pub fn view(&self) -> PageRef<'_> {
        PageRef(&self.0[..])
    }

    /// Sets the lowest key.
    pub fn set_lowest(&mut self, k: u64) {
        self.0[OFF_LOWEST..OFF_LOWEST + 8].copy_from_slice(&k.to_le_bytes());
    }

    /// Sets the highest key (`None`: +∞).
    pub fn set_highest(&mut self, h: Option<u64>) {
        self.0[OFF_HIGHEST..OFF_HIGHEST + 8].copy_from_slice(&h.unwrap_or(0).to_le_bytes());
        if h.is_some() {
            self.0[OFF_FLAGS] &= !FLAG_HIGH_INF;
        } else {
            self.0[OFF_FLAGS] |= FLAG_HIGH_INF;
        }
    }

    /// Sets the right sibling.
    pub fn set_sibling(&mut self, s: Option<GlobalAddr>) {
        self.0[OFF_SIBLING..OFF_SIBLING + 8].copy_from_slice(&s.map_or(0, GlobalAddr::raw).to_le_bytes());
    }

    /// Sets the leftmost child.
    pub fn set_leftmost(&mut self, c: GlobalAddr) {
        self.0[OFF_LEFTMOST..OFF_LEFTMOST + 8].copy_from_slice(&c.raw().to_le_bytes());
    }

    /// Sets the entry count (internal pages).
    pub fn set_count(&mut self, n: usize) {
        assert!(n <= ENTRIES, "{n} entries do not fit a page");
        self.0[OFF_COUNT..OFF_COUNT + 2].copy_from_slice(&(n as u16).to_le_bytes());
    }

    /// Sets entry `i`.
    #[inline]
    pub fn set_entry(&mut self, i: usize, e: Entry) {
        let o = entry_offset(i);
        self.0[o..o + 8].copy_from_slice(&e.key.to_le_bytes());
        self.0[o + 8..o + 16].copy_from_slice(&e.value.to_le_bytes());
        self.0[o + 16..o + 18].copy_from_slice(&u16::from(e.valid).to_le_bytes());
    }

    /// Replaces an internal page's entries by `entries` (sorted).
    pub fn set_sorted(&mut self, entries: &[(u64, u64)]) {
        for i in 0..ENTRIES {
            let e = entries.get(i).map_or(Entry::default(), |&(key, value)| Entry { key, value, valid: true });
            self.set_entry(i, e);
        }
        self.set_count(entries.len());
    }

    /// Writes sequence number `seq` (the leaf bit is set from the level)
    /// and every line's check: the page is ready to be written.
    pub fn seal(&mut self, seq: u32) {
        let seq = (seq & !1) | u32::from(self.0[OFF_LEVEL] == 0);
        for i in 0..LINES {
            let line = &mut self.0[i * LINE..(i + 1) * LINE];
            line[..4].copy_from_slice(&seq.to_le_bytes());
            let c = line_check(line, i, seq);
            line[4..8].copy_from_slice(&c.to_le_bytes());
        }
    }

    /// Seals with the sequence number after `seq` (a page's number as read).
    pub fn seal_after(&mut self, seq: u32) {
        self.seal(seq.wrapping_add(2));
    }

    /// Seals with the sequence number after the current one.
    pub fn seal_next(&mut self) {
        self.seal_after(u32_at(&self.0[..], 0));
    }
}

/// Packs the root's level and page address into the root word.
///
/// # Panics
/// If the page's blade does not fit 8 bits.
pub fn root_word(level: u8, page: GlobalAddr) -> u64 {
    assert!(page.blade() < 256, "root page on blade {} does not fit the root word", page.blade());
    u64::from(level) << 56 | page.raw()
}

/// Unpacks [`root_word`].
pub fn unpack_root(w: u64) -> (u8, GlobalAddr) {
    ((w >> 56) as u8, GlobalAddr::from_raw(w & ((1 << 56) - 1)))
}

/// The lock word index of page `p` on its blade.
#[inline]
pub fn lock_slot(p: GlobalAddr) -> u64 {
    // Pages are 1 KiB aligned: hash the page number (Fibonacci hashing:
    // the product's top bits).
    (p.offset() / PAGE as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - LOCK_SLOTS.trailing_zeros())
}

/// The tree meta as read from the blade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The root word.
    pub root: u64,
    /// Lock table per blade.
    pub locks: Vec<GlobalAddr>,
    /// The tree's name (`Ctx::write_name`), null if not stored.
    pub name: GlobalAddr,
}

impl Meta {
    /// Encodes the meta.
    pub fn encode(&self) -> [u8; META] {
        let mut b = [0u8; META];
        b[..8].copy_from_slice(&META_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&(self.locks.len() as u64).to_le_bytes());
        for (i, l) in self.locks.iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&l.raw().to_le_bytes());
        }
        b[NAME_WORD..NAME_WORD + 8].copy_from_slice(&self.name.raw().to_le_bytes());
        b
    }

    /// Decodes the meta; `None` if it is not a tree's.
    pub fn decode(b: &[u8]) -> Option<Meta> {
        if b.len() < META || u64_at(b, 0) != META_MAGIC {
            return None;
        }
        let n = usize::try_from(u64_at(b, 16)).ok().filter(|n| (1..=MAX_BLADES).contains(n))?;
        Some(Meta {
            root: u64_at(b, 8),
            locks: (0..n).map(|i| GlobalAddr::from_raw(u64_at(b, 24 + 8 * i))).collect(),
            name: GlobalAddr::from_raw(u64_at(b, NAME_WORD)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_pinned() {
        assert_eq!((PAGE, LINE, LINES, ENTRIES), (1024, 64, 16, 45));
        assert_eq!(entry_offset(0), 72);
        assert_eq!(entry_offset(1), 90);
        assert_eq!(entry_offset(2), 108);
        assert_eq!(entry_offset(3), 136);
        assert_eq!(entry_offset(44), 15 * 64 + 8 + 36);
        assert!(entry_offset(44) + ENTRY <= PAGE);
        assert_eq!(entry_line(44), 15);
        assert_eq!((MAX_BLADES, NAME_WORD), (27, 240));
        assert_eq!(&PAGE_MAGIC.to_le_bytes(), b"SBTP");
    }

    #[test]
    fn a_sealed_page_validates_and_any_changed_word_does_not() {
        let mut p = PageBuf::new(0, 10, Some(99), Some(GlobalAddr::new(1, 4096)));
        p.set_entry(7, Entry { key: 42, value: 4242, valid: true });
        p.seal(6);
        let v = PageRef::check(&p.0[..]).expect("valid");
        assert_eq!(v.seq(), 7, "a leaf's sequence number has bit 0 set");
        assert!(seq_is_leaf(v.seq()));
        assert_eq!((v.lowest(), v.highest(), v.sibling()), (10, Some(99), Some(GlobalAddr::new(1, 4096))));
        assert_eq!(v.find(42), Some((7, 4242)));
        assert!(v.covers(10) && v.covers(98) && !v.covers(99) && !v.covers(9));
        // A torn line: one word of the new version inside an old line.
        for word in 0..PAGE / 8 {
            let mut t = p.clone();
            t.0[word * 8] ^= 0x40;
            assert!(PageRef::check(&t.0[..]).is_none(), "word {word} changed yet the page validated");
        }
        // Two consistent versions mixed line by line.
        let mut q = p.clone();
        q.set_entry(0, Entry { key: 1, value: 1, valid: true });
        q.seal_next();
        let mut mixed = p.clone();
        mixed.0[LINE..2 * LINE].copy_from_slice(&q.0[LINE..2 * LINE]);
        assert!(PageRef::check(&mixed.0[..]).is_none(), "lines of two versions were accepted");
        assert!(PageRef::check(&[0u8; PAGE]).is_none(), "a zero page is not a page");
    }

    #[test]
    fn internal_pages_route_keys_by_their_sorted_entries() {
        let mut p = PageBuf::new(1, 0, None, None);
        p.set_leftmost(GlobalAddr::new(0, 1024));
        p.set_sorted(&[(10, GlobalAddr::new(0, 2048).raw()), (20, GlobalAddr::new(0, 3072).raw())]);
        p.seal(2);
        let v = PageRef::check(&p.0[..]).unwrap();
        assert!(!seq_is_leaf(v.seq()));
        assert_eq!(v.child_for(0).offset(), 1024);
        assert_eq!(v.child_for(9).offset(), 1024);
        assert_eq!(v.child_for(10).offset(), 2048);
        assert_eq!(v.child_for(19).offset(), 2048);
        assert_eq!(v.child_for(u64::MAX).offset(), 3072);
        assert_eq!(v.live().count(), 2);
    }

    #[test]
    fn meta_and_root_word_round_trip() {
        let m = Meta {
            root: root_word(3, GlobalAddr::new(2, 8192)),
            locks: vec![GlobalAddr::new(0, 4096); 3],
            name: GlobalAddr::new(0, 640),
        };
        assert_eq!(Meta::decode(&m.encode()), Some(m.clone()));
        assert_eq!(unpack_root(m.root), (3, GlobalAddr::new(2, 8192)));
        assert!(Meta::decode(&[0u8; META]).is_none());
        assert!(lock_slot(GlobalAddr::new(0, 1 << 30)) < LOCK_SLOTS);
        // Consecutive pages spread over the lock table.
        let slots: std::collections::HashSet<u64> =
            (0..LOCK_SLOTS).map(|i| lock_slot(GlobalAddr::new(0, 4096 + i * PAGE as u64))).collect();
        assert!(slots.len() as u64 > LOCK_SLOTS / 2, "{} distinct slots", slots.len());
    }
}
