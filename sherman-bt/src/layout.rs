//! Remote layout of the tree (Sherman, Wang et al., SIGMOD '22, with
//! Smart-BT's per-line sequence numbers, Ren et al., ASPLOS '24), declared
//! once. Every size follows from the tree's [`Format`]: the longest key
//! (8 to 256 bytes) and the longest value (8 bytes to 4 KiB) it stores,
//! fixed when the tree is created and kept in its meta.
//!
//! ```text
//! page           P bytes = lines of 64 bytes (P a power of two, 1 to 8 KiB:
//!                the least that holds MIN_FANOUT entries of either kind)
//! line           [seq u32][check u32][56 payload bytes]
//! seq            page sequence number << 1 | 1 if the page is a leaf; the
//!                same in every line of a consistent page
//! check          a 32-bit hash of (seq, line index, payload): a line torn
//!                inside itself fails it
//! payload        the lines' payloads in a row, offsets s ↦ byte
//!                (s / 56) · 64 + 8 + s mod 56 of the page
//!   at 0         [magic u32 "SBT2"][level u8][flags u8][count u16]
//!                [sibling u64][leftmost u64][lowest len u16]
//!                [highest len u16][0 u32][link u64]              40 bytes
//!   at 40        [lowest: K bytes][highest: K bytes]    (K = longest key)
//!                flags bit 0: highest is +∞ (the last page of its level);
//!                bit 1 dead, bit 2 merging, bit 3 absorbing (a merge, see
//!                the crate docs; link names the other page of it)
//! entries        from the first line after the header; an entry of E ≤ 56
//!                bytes never crosses a line (⌊56/E⌋ per line), a longer
//!                one starts a line and takes ⌈E/56⌉ lines
//! leaf entry     [key len u16, bit 15: valid][key: K][value len u16,
//!                bit 15: out of line][value: C]
//!                C = V (the longest value) if V ≤ INLINE_MAX, else 8: a
//!                value of up to C bytes is inline, a longer one lives in a
//!                KV block (smart_core::kvblock) whose address is the first
//!                8 bytes of the value field
//! internal entry [key len u16, bit 15: valid][key: K][child u64]
//! ```
//! Keys are byte strings compared lexicographically (a shorter key that is
//! a prefix of a longer one comes first; the empty key is the least). A
//! page covers the keys `[lowest, highest)`; its right sibling (B-link, on
//! every level) covers `[highest, …)`. A page's `lowest` never changes: a
//! split keeps the lower half in place and moves the upper half to a new
//! right sibling. Internal pages (level ≥ 1) hold `count` entries sorted by
//! key: `leftmost` covers `[lowest, key₀)`, the child of entry `i` covers
//! `[keyᵢ, keyᵢ₊₁)`. Leaves (level 0) hold their entries in any slot; an
//! entry is live when its valid bit is set.
//!
//! ```text
//! tree meta (256 bytes, named root "sherman:NAME" on blade 0)
//!                [magic u64 "SHERMAN2"][root word u64][blades u64]
//!                [lock table address u64 × blades] …
//!                at 232: [longest key u16][longest value u16][0 u32]
//!                at 240: [name block u64]
//!                at 248: [pages freed u64] (FAA before each page is retired)
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
//! (or an entry spanning lines) torn across lines.

use std::cmp::Ordering;

use smart_core::GlobalAddr;

/// Bytes per line.
pub const LINE: usize = 64;
/// Bytes of a line's header (sequence number and check).
pub const LINE_HEADER: usize = 8;
/// Payload bytes per line.
pub const PAYLOAD: usize = LINE - LINE_HEADER;
/// Bytes of a page header before its fence keys.
pub const HEADER: usize = 40;
/// Shortest longest-key a tree is made for.
pub const MIN_KEY: usize = 8;
/// Longest key any tree stores.
pub const MAX_KEY: usize = 256;
/// Shortest longest-value a tree is made for.
pub const MIN_VALUE: usize = 8;
/// Longest value any tree stores.
pub const MAX_VALUE: usize = 4096;
/// Longest values kept inline in the leaves: a tree made for longer values
/// keeps values of up to 8 bytes inline and longer ones out of line.
pub const INLINE_MAX: usize = 128;
/// Entries a page of either kind holds at least (the page size grows until
/// it does).
pub const MIN_FANOUT: usize = 16;
/// Smallest page.
pub const MIN_PAGE: usize = 1024;
/// Largest page.
pub const MAX_PAGE: usize = 8192;
/// Page magic "SBT2".
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"SBT2");
/// Tree meta magic "SHERMAN2".
pub const META_MAGIC: u64 = u64::from_le_bytes(*b"SHERMAN2");
/// The meta magic of trees of 8-byte keys made before byte-string keys.
pub const OLD_META_MAGIC: u64 = u64::from_le_bytes(*b"SHERMAN1");
/// Bytes of the tree meta.
pub const META: usize = 256;
/// Offset of the root word in the meta.
pub const ROOT_WORD: u64 = 8;
/// Offset of the format word (longest key, longest value) in the meta.
pub const FORMAT_WORD: usize = META - 24;
/// Offset of the name block's address in the meta.
pub const NAME_WORD: usize = META - 16;
/// Offset of the count of pages freed in the meta: a client that sees it
/// move drops its caches (they may name a freed page).
pub const FREES_WORD: u64 = (META - 8) as u64;
/// The meta magic of a dropped tree (kept as a tombstone).
pub const DROPPED_MAGIC: u64 = u64::from_le_bytes(*b"SHERMAN-");
/// Most blades a tree spans (lock-table addresses the meta holds).
pub const MAX_BLADES: usize = (FORMAT_WORD - 24) / 8;
/// Lock words per blade.
pub const LOCK_SLOTS: u64 = 32_768;
/// Deepest tree (levels above the leaves), far beyond any realistic size.
pub const MAX_LEVEL: u8 = 32;

// Header fields (payload offsets; all inside line 0).
const P_MAGIC: usize = 0;
const P_LEVEL: usize = 4;
const P_FLAGS: usize = 5;
const P_COUNT: usize = 6;
const P_SIBLING: usize = 8;
const P_LEFTMOST: usize = 16;
const P_LOW_LEN: usize = 24;
const P_HIGH_LEN: usize = 26;
const P_LINK: usize = 32;
const FLAG_HIGH_INF: u8 = 1;
/// A page merged into its left neighbour: empty, its link names the page
/// that took its range.
pub const FLAG_DEAD: u8 = 2;
/// A page being merged into its left neighbour (named by its link): no
/// writer changes it before the merge is finished.
pub const FLAG_MERGING: u8 = 4;
/// A page that took its right neighbour's entries (named by its link) in
/// a merge not finished yet: no writer changes it before then.
pub const FLAG_ABSORBING: u8 = 8;
const VALID: u16 = 1 << 15;
const OUT_OF_LINE: u16 = 1 << 15;
const LEN_MASK: u16 = 0x1fff;

const _: () = assert!(HEADER <= PAYLOAD);

/// Byte of the page holding payload offset `s`.
#[inline]
const fn at(s: usize) -> usize {
    (s / PAYLOAD) * LINE + LINE_HEADER + s % PAYLOAD
}

/// Where one kind of entry lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    /// Bytes of an entry.
    pub bytes: usize,
    /// Entries per line (entries of at most 56 bytes), else 0.
    pub per_line: usize,
    /// Lines an entry spans.
    pub lines: usize,
    /// Entries a page holds.
    pub count: usize,
}

impl Slots {
    fn new(bytes: usize, first: usize, page_lines: usize) -> Slots {
        let free = page_lines.saturating_sub(first);
        if bytes <= PAYLOAD {
            let per = PAYLOAD / bytes;
            Slots { bytes, per_line: per, lines: 1, count: free * per }
        } else {
            let lines = bytes.div_ceil(PAYLOAD);
            Slots { bytes, per_line: 0, lines, count: free / lines }
        }
    }
}

/// A tree's sizes and everything that follows from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Longest key (bytes).
    pub key_max: usize,
    /// Longest value (bytes).
    pub value_max: usize,
    /// Bytes of the value field of a leaf entry (inline capacity).
    pub inline: usize,
    /// Bytes per page.
    pub page: usize,
    /// Lines per page.
    pub lines: usize,
    /// The first line of entries.
    pub first: usize,
    /// Leaf entries.
    pub leaf: Slots,
    /// Internal entries.
    pub internal: Slots,
}

impl Format {
    /// The format of a tree storing keys of up to `key_max` and values of
    /// up to `value_max` bytes.
    ///
    /// # Errors
    /// Sizes outside 8..=256 (keys) or 8..=4096 (values), named.
    pub fn new(key_max: usize, value_max: usize) -> Result<Format, String> {
        if !(MIN_KEY..=MAX_KEY).contains(&key_max) {
            return Err(format!("the B+tree stores keys of {MIN_KEY} to {MAX_KEY} bytes at most (asked {key_max})"));
        }
        if !(MIN_VALUE..=MAX_VALUE).contains(&value_max) {
            return Err(format!(
                "the B+tree stores values of {MIN_VALUE} to {MAX_VALUE} bytes at most (asked {value_max})"
            ));
        }
        let inline = if value_max <= INLINE_MAX { value_max } else { 8 };
        let first = (HEADER + 2 * key_max).div_ceil(PAYLOAD);
        let (leaf_bytes, internal_bytes) = (2 + key_max + 2 + inline, 2 + key_max + 8);
        let mut page = MIN_PAGE;
        loop {
            let lines = page / LINE;
            let leaf = Slots::new(leaf_bytes, first, lines);
            let internal = Slots::new(internal_bytes, first, lines);
            if (leaf.count >= MIN_FANOUT && internal.count >= MIN_FANOUT) || page == MAX_PAGE {
                assert!(leaf.count >= MIN_FANOUT && internal.count >= MIN_FANOUT, "sizes checked above");
                assert!(leaf.count <= 255 && internal.count <= 255, "an entry index fits 8 bits");
                return Ok(Format { key_max, value_max, inline, page, lines, first, leaf, internal });
            }
            page *= 2;
        }
    }

    /// The paper's setting: 8-byte keys and values.
    pub fn paper() -> Format {
        Format::new(8, 8).expect("valid sizes")
    }

    /// The slots of a page of `level`.
    #[inline]
    pub fn slots(&self, level: u8) -> &Slots {
        if level == 0 {
            &self.leaf
        } else {
            &self.internal
        }
    }

    /// Payload offset of entry `i` of a page of `level`.
    #[inline]
    pub fn entry_at(&self, level: u8, i: usize) -> usize {
        let s = self.slots(level);
        match (i.checked_div(s.per_line), i.checked_rem(s.per_line)) {
            (Some(line), Some(k)) => (self.first + line) * PAYLOAD + k * s.bytes,
            _ => (self.first + i * s.lines) * PAYLOAD,
        }
    }

    /// The lines `[first, first + n)` that leaf entry `i` spans.
    #[inline]
    pub fn leaf_entry_lines(&self, i: usize) -> (usize, usize) {
        (self.entry_at(0, i) / PAYLOAD, self.leaf.lines)
    }

    /// Whether a value of `len` bytes goes out of line.
    #[inline]
    pub fn out_of_line(&self, len: usize) -> bool {
        len > self.inline
    }
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

/// A key of up to [`MAX_KEY`] bytes, kept without allocation.
#[derive(Clone, Copy)]
pub struct Key {
    len: u16,
    b: [u8; MAX_KEY],
}

impl Key {
    /// The empty key (the least).
    pub const EMPTY: Key = Key { len: 0, b: [0; MAX_KEY] };

    /// A copy of `k`.
    ///
    /// # Panics
    /// If `k` is longer than [`MAX_KEY`] (callers check sizes first).
    pub fn new(k: &[u8]) -> Key {
        let mut key = Key::EMPTY;
        key.b[..k.len()].copy_from_slice(k);
        key.len = k.len() as u16;
        key
    }

    /// The bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.b[..usize::from(self.len)]
    }

    /// The greatest key of at most `max` bytes that orders before this one
    /// (`None` for the empty key, the least): no key of a tree whose keys
    /// are at most `max` long lies strictly between the two.
    pub fn before(&self, max: usize) -> Option<Key> {
        let k = self.as_slice();
        let (&last, head) = k.split_last()?;
        if last == 0 {
            return Some(Key::new(head));
        }
        let mut out = Key::new(k);
        out.b[k.len() - 1] = last - 1;
        let end = max.clamp(k.len(), MAX_KEY);
        out.b[k.len()..end].fill(0xff);
        out.len = end as u16;
        Some(out)
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.as_slice().cmp(o.as_slice())
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        show_key(self.as_slice()).fmt(f)
    }
}

/// A key for messages: printable ASCII as text, else hex.
pub fn show_key(k: &[u8]) -> String {
    if k.iter().all(|c| c.is_ascii_graphic()) {
        format!("{:?}", String::from_utf8_lossy(k))
    } else {
        let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
        format!("0x{hex}")
    }
}

/// A leaf entry's value field as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// The value itself.
    Inline(&'a [u8]),
    /// A KV block of `len` value bytes at the address.
    Block(GlobalAddr, usize),
}

/// A read-only view of validated lines of a page: the whole page, or the
/// lines of one entry (a speculative read).
#[derive(Clone, Copy, Debug)]
pub struct PageRef<'a> {
    b: &'a [u8],
    /// The first line `b` holds.
    base: usize,
    f: Format,
}

impl<'a> PageRef<'a> {
    /// Validates `b` (one page of format `f`): every line intact, every
    /// line with the same sequence number, the magic right. `None` if the
    /// read was torn (or the bytes are not a page).
    pub fn check(b: &'a [u8], f: Format) -> Option<PageRef<'a>> {
        if b.len() != f.page {
            return None;
        }
        lines_seq(b, 0)?;
        (u32_at(b, at(P_MAGIC)) == PAGE_MAGIC).then_some(PageRef { b, base: 0, f })
    }

    /// Validates the lines of a leaf entry read alone (lines from `base`):
    /// intact, of one sequence number, and that number a leaf's.
    pub fn check_lines(b: &'a [u8], base: usize, f: Format) -> Option<PageRef<'a>> {
        let seq = lines_seq(b, base)?;
        seq_is_leaf(seq).then_some(PageRef { b, base, f })
    }

    /// A view of bytes validated before (a cached copy).
    pub(crate) fn trusted(b: &'a [u8], f: Format) -> PageRef<'a> {
        debug_assert_eq!(b.len(), f.page);
        PageRef { b, base: 0, f }
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.b
    }

    /// The tree's format.
    pub fn format(&self) -> &Format {
        &self.f
    }

    /// Copies payload bytes `[s, s + out.len())` into `out`.
    #[inline]
    fn read(&self, mut s: usize, out: &mut [u8]) {
        if let Some(b) = self.slice(s, out.len()) {
            out.copy_from_slice(b);
            return;
        }
        let mut done = 0;
        while done < out.len() {
            let room = PAYLOAD - s % PAYLOAD;
            let n = room.min(out.len() - done);
            let o = at(s) - self.base * LINE;
            out[done..done + n].copy_from_slice(&self.b[o..o + n]);
            done += n;
            s += n;
        }
    }

    /// Payload bytes `[s, s + n)` when they lie in one line.
    #[inline]
    fn slice(&self, s: usize, n: usize) -> Option<&'a [u8]> {
        (s % PAYLOAD + n <= PAYLOAD).then(|| {
            let o = at(s) - self.base * LINE;
            &self.b[o..o + n]
        })
    }

    #[inline]
    fn u16(&self, s: usize) -> u16 {
        match self.slice(s, 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => {
                let mut w = [0; 2];
                self.read(s, &mut w);
                u16::from_le_bytes(w)
            }
        }
    }

    #[inline]
    fn u64(&self, s: usize) -> u64 {
        match self.slice(s, 8) {
            Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            None => {
                let mut w = [0; 8];
                self.read(s, &mut w);
                u64::from_le_bytes(w)
            }
        }
    }

    /// Compares the fence key at payload offset `s` (its length word at
    /// `lw`) with `key`, without copying when it lies in one line.
    #[inline]
    fn fence_cmp(&self, s: usize, lw: usize, key: &[u8]) -> Ordering {
        let len = usize::from(u16_at(self.b, at(lw))).min(self.f.key_max);
        match self.slice(s, len) {
            Some(b) => b.cmp(key),
            None => self.key_at(s, len).as_slice().cmp(key),
        }
    }

    /// Compares the page's lowest key with `key`.
    #[inline]
    pub fn lowest_cmp(&self, key: &[u8]) -> Ordering {
        self.fence_cmp(HEADER, P_LOW_LEN, key)
    }

    /// The key at payload offset `s` whose length word says `len`.
    fn key_at(&self, s: usize, len: usize) -> Key {
        let mut k = Key { len: 0, b: [0; MAX_KEY] };
        let len = len.min(self.f.key_max);
        self.read(s, &mut k.b[..len]);
        k.len = len as u16;
        k
    }

    /// Whether the key at `s` of length `len` is `key`, without copying
    /// when it lies in one line.
    #[inline]
    fn key_is(&self, s: usize, len: usize, key: &[u8]) -> bool {
        if len != key.len() {
            return false;
        }
        match self.slice(s, len) {
            Some(b) => eq(b, key),
            None => self.key_at(s, len).as_slice() == key,
        }
    }

    /// The sequence number (with the leaf bit).
    pub fn seq(&self) -> u32 {
        u32_at(self.b, 0)
    }

    /// The level (0 = leaf).
    pub fn level(&self) -> u8 {
        self.b[at(P_LEVEL)]
    }

    /// Whether this is a leaf.
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }

    /// Entries in use (internal pages).
    pub fn count(&self) -> usize {
        usize::from(u16_at(self.b, at(P_COUNT))).min(self.f.internal.count)
    }

    /// Entry slots of this page.
    pub fn slots(&self) -> usize {
        self.f.slots(self.level()).count
    }

    /// The lowest key the page covers.
    pub fn lowest(&self) -> Key {
        self.key_at(HEADER, usize::from(u16_at(self.b, at(P_LOW_LEN))))
    }

    /// The first key above the page's range, `None` for +∞.
    pub fn highest(&self) -> Option<Key> {
        (self.b[at(P_FLAGS)] & FLAG_HIGH_INF == 0)
            .then(|| self.key_at(HEADER + self.f.key_max, usize::from(u16_at(self.b, at(P_HIGH_LEN)))))
    }

    /// The merge flags ([`FLAG_DEAD`], [`FLAG_MERGING`], [`FLAG_ABSORBING`]).
    pub fn merge_flags(&self) -> u8 {
        self.b[at(P_FLAGS)] & (FLAG_DEAD | FLAG_MERGING | FLAG_ABSORBING)
    }

    /// Whether the page was merged away (its link names where its range went).
    pub fn is_dead(&self) -> bool {
        self.b[at(P_FLAGS)] & FLAG_DEAD != 0
    }

    /// The other page of a merge (see the flags).
    pub fn link(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.b, at(P_LINK)))
    }

    /// The right sibling, `None` for the last page of a level.
    pub fn sibling(&self) -> Option<GlobalAddr> {
        let s = u64_at(self.b, at(P_SIBLING));
        (s != 0).then(|| GlobalAddr::from_raw(s))
    }

    /// The child covering keys below the first entry (internal pages).
    pub fn leftmost(&self) -> GlobalAddr {
        GlobalAddr::from_raw(u64_at(self.b, at(P_LEFTMOST)))
    }

    /// Whether `key` is in `[lowest, highest)`.
    #[inline]
    pub fn covers(&self, key: &[u8]) -> bool {
        self.lowest_cmp(key) != Ordering::Greater && !self.is_right_of(key)
    }

    /// Whether `key` is at or beyond `highest` (then it is to the right).
    #[inline]
    pub fn is_right_of(&self, key: &[u8]) -> bool {
        self.b[at(P_FLAGS)] & FLAG_HIGH_INF == 0
            && self.fence_cmp(HEADER + self.f.key_max, P_HIGH_LEN, key) != Ordering::Greater
    }

    /// The length word of entry `i` (leaf or internal).
    #[inline]
    fn entry_word(&self, i: usize) -> u16 {
        self.u16(self.f.entry_at(self.level(), i))
    }

    /// Whether entry `i` is live: a valid leaf entry, or one of the first
    /// `count` of an internal page.
    #[inline]
    pub fn is_live(&self, i: usize) -> bool {
        if self.is_leaf() {
            self.entry_word(i) & VALID != 0
        } else {
            i < self.count()
        }
    }

    /// The key of entry `i`.
    pub fn key(&self, i: usize) -> Key {
        let s = self.f.entry_at(self.level(), i);
        self.key_at(s + 2, usize::from(self.u16(s) & LEN_MASK))
    }

    /// The key of entry `i` where it lies in one line, without a copy.
    #[inline]
    pub fn key_slice(&self, i: usize) -> Option<&'a [u8]> {
        let s = self.f.entry_at(self.level(), i);
        let len = usize::from(self.u16(s) & LEN_MASK).min(self.f.key_max);
        self.slice(s + 2, len)
    }

    /// The inline value of leaf entry `i` where it lies in one line;
    /// `None` for a value out of line (or across lines).
    #[inline]
    pub fn inline_slice(&self, i: usize) -> Option<&'a [u8]> {
        let s = self.f.entry_at(0, i) + 2 + self.f.key_max;
        let w = self.u16(s);
        if w & OUT_OF_LINE != 0 {
            return None;
        }
        self.slice(s + 2, usize::from(w & LEN_MASK).min(self.f.inline))
    }

    /// The child of internal entry `i`.
    pub fn child(&self, i: usize) -> GlobalAddr {
        GlobalAddr::from_raw(self.u64(self.f.entry_at(self.level(), i) + 2 + self.f.key_max))
    }

    /// The value of leaf entry `i`: inline bytes are copied into `buf`.
    pub fn value<'b>(&self, i: usize, buf: &'b mut [u8; INLINE_MAX]) -> Value<'b> {
        let s = self.f.entry_at(0, i) + 2 + self.f.key_max;
        let w = self.u16(s);
        let len = usize::from(w & LEN_MASK);
        if w & OUT_OF_LINE != 0 {
            Value::Block(GlobalAddr::from_raw(self.u64(s + 2)), len)
        } else {
            let len = len.min(self.f.inline);
            self.read(s + 2, &mut buf[..len]);
            Value::Inline(&buf[..len])
        }
    }

    /// The raw value field of leaf entry `i` (length word and value bytes),
    /// moved as it is by a split.
    pub(crate) fn value_field(&self, i: usize, out: &mut [u8]) {
        let s = self.f.entry_at(0, i) + 2 + self.f.key_max;
        self.read(s, &mut out[..2 + self.f.inline]);
    }

    /// The live entries' indexes: every valid one of a leaf, the first
    /// `count` of an internal page.
    pub fn live(&self) -> impl Iterator<Item = usize> + 'a {
        let p = *self;
        let n = if p.is_leaf() { p.slots() } else { p.count() };
        (0..n).filter(move |&i| p.is_live(i))
    }

    /// The first leaf slot for which `f(payload offset)` holds, walking
    /// the slots line by line (no division per slot).
    #[inline]
    fn find_slot(&self, mut f: impl FnMut(usize) -> bool) -> Option<usize> {
        let s = self.f.leaf;
        if let Some(lines) = s.count.checked_div(s.per_line) {
            let mut i = 0;
            for line in 0..lines {
                let base = (self.f.first + line) * PAYLOAD;
                for k in 0..s.per_line {
                    if f(base + k * s.bytes) {
                        return Some(i);
                    }
                    i += 1;
                }
            }
            None
        } else {
            (0..s.count).find(|&i| f((self.f.first + i * s.lines) * PAYLOAD))
        }
    }

    /// A leaf's entry holding `key`, if any.
    #[inline]
    pub fn find(&self, key: &[u8]) -> Option<usize> {
        let s = self.f.leaf;
        let lines = match s.count.checked_div(s.per_line) {
            Some(l) if self.base == 0 => l,
            _ => return self.find_slot(|s| self.entry_is_at(s, key)),
        };
        // Entries within lines: straight over the page's bytes.
        let (b, n) = (self.b, key.len());
        let want = u16::try_from(n).ok()? | VALID;
        let mut i = 0;
        for line in 0..lines {
            let mut o = (self.f.first + line) * LINE + LINE_HEADER;
            for _ in 0..s.per_line {
                if u16::from_le_bytes([b[o], b[o + 1]]) & (VALID | LEN_MASK) == want && eq(&b[o + 2..o + 2 + n], key) {
                    return Some(i);
                }
                o += s.bytes;
                i += 1;
            }
        }
        None
    }

    /// Whether leaf entry `i` is live and holds `key`.
    #[inline]
    pub fn entry_is(&self, i: usize, key: &[u8]) -> bool {
        self.entry_is_at(self.f.entry_at(0, i), key)
    }

    #[inline]
    fn entry_is_at(&self, s: usize, key: &[u8]) -> bool {
        let w = self.u16(s);
        w & VALID != 0 && self.key_is(s + 2, usize::from(w & LEN_MASK), key)
    }

    /// A leaf's first free slot.
    pub fn free_slot(&self) -> Option<usize> {
        self.find_slot(|s| self.u16(s) & VALID == 0)
    }

    /// Compares internal entry `i`'s key with `key`.
    #[inline]
    fn cmp_key(&self, i: usize, key: &[u8]) -> Ordering {
        let s = self.f.entry_at(self.level(), i);
        let len = usize::from(self.u16(s) & LEN_MASK).min(self.f.key_max);
        match self.slice(s + 2, len) {
            // 8-byte keys compared as words (a call to memcmp costs more).
            Some(b) if len == 8 && key.len() == 8 => {
                u64::from_be_bytes(b.try_into().expect("8 bytes")).cmp(&u64::from_be_bytes(key.try_into().expect("8")))
            }
            Some(b) => b.cmp(key),
            None => self.key_at(s + 2, len).as_slice().cmp(key),
        }
    }

    /// An internal page's child covering `key` (which the page covers).
    pub fn child_for(&self, key: &[u8]) -> GlobalAddr {
        // The last entry whose key ≤ `key`, by binary search over the
        // sorted entries.
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.cmp_key(mid, key) != Ordering::Greater {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            self.leftmost()
        } else {
            self.child(lo - 1)
        }
    }
}

/// Whether two byte strings of equal length are equal; 8 bytes as one word
/// (a call to memcmp costs more than the comparison).
#[inline]
fn eq(a: &[u8], b: &[u8]) -> bool {
    match (<[u8; 8]>::try_from(a), <[u8; 8]>::try_from(b)) {
        (Ok(x), Ok(y)) => u64::from_ne_bytes(x) == u64::from_ne_bytes(y),
        _ => a == b,
    }
}

/// The sequence number shared by every line of `b` (lines from `base`),
/// each intact; `None` otherwise.
fn lines_seq(b: &[u8], base: usize) -> Option<u32> {
    if b.is_empty() || b.len() % LINE != 0 {
        return None;
    }
    let seq = line_seq(&b[..LINE], base)?;
    for (j, line) in b.chunks_exact(LINE).enumerate().skip(1) {
        if line_seq(line, base + j)? != seq {
            return None;
        }
    }
    Some(seq)
}

/// A page being built or modified, sealed (sequence numbers and checks
/// written) before it is written.
#[derive(Clone)]
pub struct PageBuf {
    /// The page's bytes.
    pub b: Box<[u8]>,
    f: Format,
}

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.view();
        f.debug_struct("PageBuf").field("level", &p.level()).field("lowest", &p.lowest()).finish_non_exhaustive()
    }
}

/// A leaf entry's value field to store: the length word and the bytes
/// (inline value, or the block address).
#[derive(Clone, Copy, Debug)]
pub struct Field {
    word: u16,
    bytes: [u8; INLINE_MAX],
}

impl Field {
    /// An inline value (at most the format's inline capacity).
    pub fn inline(v: &[u8]) -> Field {
        let mut f = Field { word: v.len() as u16, bytes: [0; INLINE_MAX] };
        f.bytes[..v.len()].copy_from_slice(v);
        f
    }

    /// A value of `len` bytes in the KV block at `at`.
    pub fn block(at: GlobalAddr, len: usize) -> Field {
        let mut f = Field { word: len as u16 | OUT_OF_LINE, bytes: [0; INLINE_MAX] };
        f.bytes[..8].copy_from_slice(&at.raw().to_le_bytes());
        f
    }

    /// A field as read by [`PageRef::value_field`].
    pub(crate) fn raw(b: &[u8]) -> Field {
        let mut f = Field { word: u16_at(b, 0), bytes: [0; INLINE_MAX] };
        let n = (b.len() - 2).min(INLINE_MAX);
        f.bytes[..n].copy_from_slice(&b[2..2 + n]);
        f
    }

    /// The inline value's bytes (nothing for a block).
    pub fn inline_bytes(&self) -> &[u8] {
        if self.word & OUT_OF_LINE != 0 {
            return &[];
        }
        &self.bytes[..usize::from(self.word & LEN_MASK).min(INLINE_MAX)]
    }

    /// The block this field names, if out of line (with its value length).
    pub fn block_of(&self) -> Option<(GlobalAddr, usize)> {
        (self.word & OUT_OF_LINE != 0)
            .then(|| (GlobalAddr::from_raw(u64_at(&self.bytes, 0)), usize::from(self.word & LEN_MASK)))
    }
}

impl PageBuf {
    /// An empty page of format `f` and `level` covering
    /// `[lowest, highest)` (`None`: +∞).
    pub fn new(f: Format, level: u8, lowest: &[u8], highest: Option<&[u8]>, sibling: Option<GlobalAddr>) -> PageBuf {
        let mut p = PageBuf { b: vec![0; f.page].into_boxed_slice(), f };
        p.reset(level, lowest, highest, sibling);
        p
    }

    /// An empty buffer of format `f` (a level-0 page from the empty key).
    pub fn empty(f: Format) -> PageBuf {
        PageBuf::new(f, 0, &[], None, None)
    }

    /// Empties this buffer into a new page (see [`PageBuf::new`]).
    pub fn reset(&mut self, level: u8, lowest: &[u8], highest: Option<&[u8]>, sibling: Option<GlobalAddr>) {
        self.b.fill(0);
        self.b[at(P_MAGIC)..at(P_MAGIC) + 4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
        self.b[at(P_LEVEL)] = level;
        self.set_lowest(lowest);
        self.set_highest(highest);
        self.set_sibling(sibling);
    }

    /// Copies a validated page into this buffer.
    pub fn copy_from(&mut self, p: PageRef<'_>) {
        self.b.copy_from_slice(p.bytes());
    }

    /// A copy of a validated page.
    pub fn from_page(p: PageRef<'_>) -> PageBuf {
        PageBuf { b: p.bytes().into(), f: p.f }
    }

    /// A view (not validated: the buffer is this client's own).
    pub fn view(&self) -> PageRef<'_> {
        PageRef { b: &self.b[..], base: 0, f: self.f }
    }

    /// The format.
    pub fn format(&self) -> &Format {
        &self.f
    }

    fn write(&mut self, mut s: usize, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let n = (PAYLOAD - s % PAYLOAD).min(data.len() - done);
            let o = at(s);
            self.b[o..o + n].copy_from_slice(&data[done..done + n]);
            done += n;
            s += n;
        }
    }

    fn put_key(&mut self, s: usize, k: &[u8]) {
        assert!(k.len() <= self.f.key_max, "key of {} bytes in a tree of {}", k.len(), self.f.key_max);
        let mut b = [0u8; MAX_KEY];
        b[..k.len()].copy_from_slice(k);
        self.write(s, &b[..self.f.key_max]);
    }

    /// Sets the lowest key.
    pub fn set_lowest(&mut self, k: &[u8]) {
        self.put_key(HEADER, k);
        self.write(P_LOW_LEN, &(k.len() as u16).to_le_bytes());
    }

    /// Sets the highest key (`None`: +∞).
    pub fn set_highest(&mut self, h: Option<&[u8]>) {
        let k = h.unwrap_or(&[]);
        self.put_key(HEADER + self.f.key_max, k);
        self.write(P_HIGH_LEN, &(k.len() as u16).to_le_bytes());
        if h.is_some() {
            self.b[at(P_FLAGS)] &= !FLAG_HIGH_INF;
        } else {
            self.b[at(P_FLAGS)] |= FLAG_HIGH_INF;
        }
    }

    /// Sets the right sibling.
    pub fn set_sibling(&mut self, s: Option<GlobalAddr>) {
        self.write(P_SIBLING, &s.map_or(0, GlobalAddr::raw).to_le_bytes());
    }

    /// Sets the merge flags and the link (see [`PageRef::merge_flags`]).
    pub fn set_merge(&mut self, flags: u8, link: GlobalAddr) {
        let keep = self.b[at(P_FLAGS)] & FLAG_HIGH_INF;
        self.b[at(P_FLAGS)] = keep | flags;
        self.write(P_LINK, &link.raw().to_le_bytes());
    }

    /// Sets the leftmost child.
    pub fn set_leftmost(&mut self, c: GlobalAddr) {
        self.write(P_LEFTMOST, &c.raw().to_le_bytes());
    }

    /// Sets the entry count (internal pages).
    pub fn set_count(&mut self, n: usize) {
        assert!(n <= self.f.internal.count, "{n} entries do not fit a page");
        self.write(P_COUNT, &(n as u16).to_le_bytes());
    }

    /// Sets leaf entry `i` to `key` → `value`.
    pub fn set_leaf(&mut self, i: usize, key: &[u8], value: &Field) {
        let s = self.f.entry_at(0, i);
        self.write(s, &(key.len() as u16 | VALID).to_le_bytes());
        self.put_key(s + 2, key);
        let s = s + 2 + self.f.key_max;
        self.write(s, &value.word.to_le_bytes());
        let n = self.f.inline;
        self.write(s + 2, &value.bytes[..n]);
    }

    /// Clears leaf entry `i` (its bytes too).
    pub fn clear_leaf(&mut self, i: usize) {
        let s = self.f.entry_at(0, i);
        let zero = [0u8; 2 + MAX_KEY + 2 + INLINE_MAX];
        self.write(s, &zero[..self.f.leaf.bytes]);
    }

    /// Sets internal entry `i` to `key` → `child`.
    fn set_internal(&mut self, i: usize, key: &[u8], child: GlobalAddr) {
        let level = self.view().level();
        let s = self.f.entry_at(level, i);
        self.write(s, &(key.len() as u16 | VALID).to_le_bytes());
        self.put_key(s + 2, key);
        self.write(s + 2 + self.f.key_max, &child.raw().to_le_bytes());
    }

    /// Replaces an internal page's entries by `entries` (sorted).
    pub fn set_sorted(&mut self, entries: &[(Key, GlobalAddr)]) {
        let level = self.view().level();
        let s = self.f.entry_at(level, 0);
        let end = self.f.entry_at(level, self.f.internal.count - 1) + self.f.internal.bytes;
        let mut zero = [0u8; PAYLOAD];
        let mut at_ = s;
        while at_ < end {
            let n = (end - at_).min(PAYLOAD);
            zero[..n].fill(0);
            self.write(at_, &zero[..n]);
            at_ += n;
        }
        for (i, (k, c)) in entries.iter().enumerate() {
            self.set_internal(i, k.as_slice(), *c);
        }
        self.set_count(entries.len());
    }

    /// Writes sequence number `seq` (the leaf bit is set from the level)
    /// and every line's check: the page is ready to be written.
    pub fn seal(&mut self, seq: u32) {
        let seq = (seq & !1) | u32::from(self.b[at(P_LEVEL)] == 0);
        for (i, line) in self.b.chunks_exact_mut(LINE).enumerate() {
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
        self.seal_after(u32_at(&self.b[..], 0));
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
    // Pages are at least 1 KiB and aligned to their size: hash the offset
    // in KiB (Fibonacci hashing: the product's top bits).
    (p.offset() / MIN_PAGE as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - LOCK_SLOTS.trailing_zeros())
}

/// The tree meta as read from the blade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The root word.
    pub root: u64,
    /// Lock table per blade.
    pub locks: Vec<GlobalAddr>,
    /// Longest key and value.
    pub sizes: (usize, usize),
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
        b[FORMAT_WORD..FORMAT_WORD + 2].copy_from_slice(&(self.sizes.0 as u16).to_le_bytes());
        b[FORMAT_WORD + 2..FORMAT_WORD + 4].copy_from_slice(&(self.sizes.1 as u16).to_le_bytes());
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
            sizes: (usize::from(u16_at(b, FORMAT_WORD)), usize::from(u16_at(b, FORMAT_WORD + 2))),
            name: GlobalAddr::from_raw(u64_at(b, NAME_WORD)),
        })
    }

    /// The tree's format.
    ///
    /// # Errors
    /// Sizes no tree is made with (a damaged meta).
    pub fn format(&self) -> Result<Format, String> {
        Format::new(self.sizes.0, self.sizes.1)
    }
}

#[cfg(test)]
mod tests;
