//! Remote layout of the table (RACE, Zuo et al., ATC '21, as Smart-HT uses
//! it), declared once.
//!
//! ```text
//! table header  [magic u64][dir word u64][groups per subtable u64]
//!               [directory lock u64][splits u64][publication intent u64]
//!               [name block address u64][0 u64]                (64 bytes)
//! directory lock 0, or the holder's token:40 | beat:24; held only while a
//!               split is published in the directory (and for good, as
//!               DROPPED_LOCK, once the table is dropped)
//! publication intent 0, or local depth:8 | address:56 of the subtable
//!               whose split is being published (set by CAS from 0 under
//!               the directory lock before the first directory change,
//!               cleared by CAS after the last)
//! dir word      generation:3 (high bits) | global depth:5 | directory
//!               array address:56, whose low 6 bits (0 in a 64-aligned
//!               address) hold the generation's low bits; changed only by
//!               CAS: a doubling swaps the array in, a publication in place
//!               bumps the generation (mod 512) after its entry moves, so a
//!               doubler that copied the array before them fails its swap
//! directory     2^GD entries: local depth:8 | subtable address:56 (an
//!               entry changes only by CAS from a subtable to one of its
//!               recorded halves)
//! subtable      groups × [main0 | overflow | main1], 64-byte buckets,
//!               then a 64-byte split line:
//!               [split lock u64][half 0 u64][half 1 u64][0 × 5]
//! split lock    0, or the splitter's token:40 | beat:24 (its lease, bumped
//!               while it works); SPLIT_DONE once the split is published
//!               and counted: the subtable is then dead, and only the
//!               client whose CAS set SPLIT_DONE retires it
//! half 0/1      0, or local depth:8 | address:56 of the half (suffix bit
//!               L clear / set) chosen for this split: set by CAS by the
//!               first splitter to have built it, after writing it whole;
//!               every later splitter publishes that same half
//! bucket        [local depth u32][suffix u32] + 7 slots of 8 bytes
//! slot          fp:8 | len:8 (KV block length in 64-byte units) | blade:8
//!               | offset:40; bit 0 (always 0 in a 64-aligned offset) is
//!               the *frozen* bit a split sets on every slot it moves
//! KV block      [key len u32][value len u32][key][value][pad][crc32 u32], a
//!               multiple of 64 bytes; the CRC covers everything before it
//! ```
//! A *combined bucket* is a main bucket and the overflow bucket it shares:
//! main index `i` lives in group `i / 2`; even `i` reads buckets `[+0, +1]`
//! of the group, odd `i` reads `[+1, +2]`, one 128-byte READ either way.
//! (Smart's code read `[+0, +1]` for both parities, leaving a third of the
//! space unused.)
//!
//! Extendible hashing: a key's subtable is directory entry `h1 mod 2^GD`.
//! A subtable of local depth `L` and suffix `s` holds exactly the keys with
//! `h1 mod 2^L = s`, and every bucket header says so. A split never changes
//! a subtable in place: it freezes it and publishes two new ones.

use smart_core::GlobalAddr;

/// Bytes per bucket.
pub const BUCKET: u64 = 64;
/// Slots per bucket.
pub const SLOTS: usize = 7;
/// Buckets per group.
pub const GROUP_BUCKETS: u64 = 3;
/// Bytes of a combined bucket.
pub const COMBINED: usize = 128;
/// Bytes of the table header.
pub const TABLE_HEADER: u64 = 64;
/// Table magic ("RACEDIR4": per-subtable split locks, halves recorded in
/// the split line, publication by CAS).
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"RACEDIR4");
/// The magic of the previous format (publication by WRITE under the
/// directory lock alone), refused with a clear error.
pub const OLD_MAGIC: u64 = u64::from_le_bytes(*b"RACEDIR3");
/// The magic of the format before (one resize lock per table), refused
/// with a clear error.
pub const OLDER_MAGIC: u64 = u64::from_le_bytes(*b"RACEDIR2");
/// The magic of a dropped table's header (kept as a tombstone).
pub const DROPPED_MAGIC: u64 = u64::from_le_bytes(*b"RACEDROP");
/// Offset of the dir word in the table header.
pub const DIR_WORD: u64 = 8;
/// Offset of the directory lock in the table header.
pub const LOCK_WORD: u64 = 24;
/// The directory lock of a dropped table (held for good).
pub const DROPPED_LOCK: u64 = u64::MAX;
/// Offset of the split counter in the table header.
pub const SPLITS_WORD: u64 = 32;
/// Offset of the publication intent in the table header.
pub const INTENT_WORD: u64 = 40;
/// Offset of the address of the table's name (`Ctx::write_name`; 0 in
/// tables made before names were stored).
pub const NAME_WORD: u64 = 48;
/// A split lock's word once its split is published and counted (held for
/// good; never a token).
pub const SPLIT_DONE: u64 = u64::MAX - 1;
/// Bits of a lock's beat (its low bits).
pub const BEAT_BITS: u32 = 24;
/// Largest global (and local) depth: a directory of 2^20 entries (8 MiB).
pub const MAX_DEPTH: u32 = 20;
pub use smart_core::kvblock::KV_HEADER;
/// Largest offset a slot can hold (1 TiB per blade).
pub const MAX_OFFSET: u64 = (1 << 40) - 1;
/// Most bucket groups per subtable: a subtable (its buckets and split line,
/// [`subtable_bytes`]) lies within the offsets a slot can hold.
pub const MAX_GROUPS: u64 = (MAX_OFFSET + 1 - BUCKET) / (GROUP_BUCKETS * BUCKET);

/// Offset in the subtable of main bucket `i`'s combined bucket.
pub fn combined_offset(i: u64) -> u64 {
    ((i / 2) * GROUP_BUCKETS + (i % 2)) * BUCKET
}

/// Bytes of a subtable of `groups` groups: its buckets and its split line.
pub fn subtable_bytes(groups: u64) -> u64 {
    bucket_bytes(groups) + BUCKET
}

/// Bytes of a subtable's buckets (the split line follows them).
pub fn bucket_bytes(groups: u64) -> u64 {
    groups * GROUP_BUCKETS * BUCKET
}

/// Address of the split lock of the subtable at `base`.
pub fn split_lock(base: GlobalAddr, groups: u64) -> GlobalAddr {
    base.add(bucket_bytes(groups))
}

/// Address of the two recorded halves of the subtable at `base` (see the
/// split line above).
pub fn split_halves(base: GlobalAddr, groups: u64) -> GlobalAddr {
    split_lock(base, groups).add(8)
}

/// Generations of the dir word (it wraps).
pub const DIR_GENERATIONS: u64 = 512;

/// Packs the dir word: global depth, directory array (64-byte aligned),
/// generation (mod [`DIR_GENERATIONS`]).
///
/// # Panics
/// If the depth or the array does not fit.
pub fn pack_dir(depth: u32, array: GlobalAddr, generation: u64) -> u64 {
    assert!(array.offset() % 64 == 0 && depth < 32, "dir word {depth} {array} does not fit");
    let g = generation % DIR_GENERATIONS;
    (g >> 6) << 61 | pack_entry(depth, array) | (g & 63)
}

/// Unpacks [`pack_dir`]: global depth, array, generation.
pub fn unpack_dir(w: u64) -> (u32, GlobalAddr, u64) {
    let (depth, array) = unpack_entry(w & !(7 << 61));
    (depth, GlobalAddr::from_raw(array.raw() & !63), (w >> 61) << 6 | (w & 63))
}

/// Packs a depth and an address (blade < 256) into a dir word or a
/// directory entry.
///
/// # Panics
/// If the blade or depth does not fit.
pub fn pack_entry(depth: u32, addr: GlobalAddr) -> u64 {
    assert!(addr.blade() < 256 && depth < 256, "entry {depth} {addr} does not fit");
    u64::from(depth) << 56 | addr.raw()
}

/// Unpacks [`pack_entry`].
pub fn unpack_entry(w: u64) -> (u32, GlobalAddr) {
    ((w >> 56) as u32, GlobalAddr::from_raw(w & ((1 << 56) - 1)))
}

/// A bucket header word: local depth and suffix.
pub fn bucket_header(depth: u32, suffix: u64) -> u64 {
    u64::from(depth) | suffix << 32
}

/// The low `depth` bits of a hash.
pub fn suffix(h: u64, depth: u32) -> u64 {
    h & ((1u64 << depth) - 1)
}

/// A slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u64);

impl Slot {
    /// The empty slot.
    pub const EMPTY: Slot = Slot(0);
    /// The frozen bit (bit 0; block offsets are 64-byte aligned).
    pub const FROZEN: u64 = 1;

    /// A slot naming a KV block of `units` 64-byte units at `addr`.
    ///
    /// # Panics
    /// If the block is too long (≥ 256 units) or the address does not fit.
    pub fn new(fp: u8, units: u64, addr: GlobalAddr) -> Slot {
        assert!((1..256).contains(&units), "KV block of {units} units");
        assert!(addr.blade() < 256 && addr.offset() <= MAX_OFFSET, "address {addr} does not fit a slot");
        Slot(u64::from(fp) << 56 | units << 48 | u64::from(addr.blade()) << 40 | addr.offset())
    }

    /// Whether it is empty (and not frozen).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether a split has frozen it.
    pub fn is_frozen(self) -> bool {
        self.0 & Self::FROZEN != 0
    }

    /// The slot without its frozen bit.
    pub fn thawed(self) -> Slot {
        Slot(self.0 & !Self::FROZEN)
    }

    /// Fingerprint.
    pub fn fp(self) -> u8 {
        (self.0 >> 56) as u8
    }

    /// Length of the KV block in bytes.
    pub fn block_len(self) -> usize {
        ((self.0 >> 48) & 0xff) as usize * 64
    }

    /// Address of the KV block.
    pub fn addr(self) -> GlobalAddr {
        GlobalAddr::new(((self.0 >> 40) & 0xff) as u16, self.0 & MAX_OFFSET)
    }
}

pub use smart_core::kvblock::{block_len, decode_block, encode_block};

/// The two hashes of a key: `h1` picks the subtable, a main bucket and the
/// fingerprint; `h2` the second main bucket.
pub fn hashes(key: &[u8]) -> (u64, u64) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let h1 = fmix64(h);
    (h1, fmix64(h1 ^ 0x9e37_79b9_7f4a_7c15))
}

pub(crate) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn layout_is_pinned() {
        assert_eq!((combined_offset(0), combined_offset(1)), (0, 64), "group 0: [0,1] and [1,2]");
        assert_eq!((combined_offset(2), combined_offset(3)), (192, 256), "group 1");
        assert_eq!((bucket_bytes(4), subtable_bytes(4)), (768, 832));
        assert_eq!(split_lock(GlobalAddr::new(1, 4096), 4), GlobalAddr::new(1, 4096 + 768));
        assert_eq!(block_len(8, 8), 64);
        assert_eq!(block_len(8, 45), 128);
        assert_eq!(&TABLE_MAGIC.to_le_bytes(), b"RACEDIR4");
        let a = GlobalAddr::new(7, 0xabc_def0);
        assert_eq!(unpack_entry(pack_entry(13, a)), (13, a));
        let arr = GlobalAddr::new(0, 0x4b00);
        assert_eq!(pack_dir(5, arr, 0), pack_entry(5, arr));
        for g in [0, 1, 63, 64, 65, 300, 511, 512, 1000] {
            assert_eq!(unpack_dir(pack_dir(20, arr, g)), (20, arr, g % DIR_GENERATIONS), "generation {g}");
        }
        assert_ne!(pack_dir(3, arr, 64), pack_dir(3, arr, 0));
        assert_eq!((bucket_header(3, 5), suffix(0xff, 3)), (5 << 32 | 3, 7));
    }

    #[test]
    pub(crate) fn slots_pack_and_unpack() {
        let a = GlobalAddr::new(3, 0x12_3456_7890);
        let s = Slot::new(0xab, 2, a);
        assert_eq!((s.fp(), s.block_len(), s.addr()), (0xab, 128, a));
        assert!(!s.is_empty() && Slot::EMPTY.is_empty());
        let f = Slot(s.0 | Slot::FROZEN);
        assert!(f.is_frozen() && !s.is_frozen() && f.thawed() == s);
        assert!(!Slot(Slot::FROZEN).is_empty(), "a frozen empty slot is not free");
    }

    #[test]
    pub(crate) fn blocks_round_trip_and_reject_tears() {
        let mut b = Vec::new();
        encode_block(b"key", b"value", &mut b);
        assert_eq!(decode_block(&b), Some((&b"key"[..], &b"value"[..])));
        let mut torn = b.clone();
        torn[9] ^= 1;
        assert_eq!(decode_block(&torn), None, "a torn block fails its CRC");
        assert_eq!(decode_block(&[0u8; 64]), None, "an unwritten block is not valid");
        let (a1, a2) = hashes(b"k1");
        assert_ne!(a1, a2);
        assert_ne!(hashes(b"k1"), hashes(b"k2"));
    }
}
