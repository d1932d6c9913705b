//! The memory blade's layout: a superblock at offset 0, then the heap.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "SMARTBLD"
//!      8     8  layout version
//!     16     8  region size in bytes
//!     24     8  heap bump pointer (next free offset; compute blades FAA it)
//!     32     8  identity: a random word, never 0, drawn when the region is
//!               first served (kept in a backing file across restarts)
//!     40     8  place in its set: the top 48 bits of the identity of the
//!               set's blade 0, then this blade's index (16 bits); 0 until
//!               a compute blade first uses the blade
//!     48     8  the identity of the set's next blade (index + 1) when first
//!               used with one; 0 until then
//!     56     8  reserved
//!     64  1024  named roots: 64 entries of {name tag u64, GlobalAddr u64}
//!   4096     -  heap (chunks handed out by the bump pointer)
//! ```
//! The memory blade formats a zero region once; afterwards only compute
//! blades change it, through verbs. A named root is claimed in two CASes: the
//! entry's tag (an FNV-1a hash of the name, never 0) from 0, then its address
//! from 0; whoever's address CAS wins defines the root, and everyone else
//! learns the winner from the CAS's old value.
//!
//! Compute blades address memory as (blade index, offset), so data made
//! over a list of blades is meaningful only over the same blades in the same
//! order. The identity and set words let a compute blade check that before
//! it reads anything ([`crate::Ctx::check_blade_set`]): a blade restarted
//! without its backing file, or listed in another order, or from another
//! set, is refused instead of read as if it held the data.

use crate::region::Region;

/// "SMARTBLD" as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SMARTBLD");
/// Version of this layout; a blade with another version is refused.
pub const LAYOUT_VERSION: u64 = 1;
/// Offset of the magic word.
pub const OFF_MAGIC: u64 = 0;
/// Offset of the layout version.
pub const OFF_VERSION: u64 = 8;
/// Offset of the region size.
pub const OFF_SIZE: u64 = 16;
/// Offset of the heap bump pointer.
pub const OFF_HEAP: u64 = 24;
/// Offset of the blade's identity.
pub const OFF_IDENTITY: u64 = 32;
/// Offset of the blade's place in its set.
pub const OFF_SET_PLACE: u64 = 40;
/// Offset of the identity of the set's next blade.
pub const OFF_SET_NEXT: u64 = 48;
/// Offset of the named-root table.
pub const OFF_ROOTS: u64 = 64;
/// Entries in the named-root table.
pub const ROOT_ENTRIES: u64 = 64;
/// Bytes per named-root entry.
pub const ROOT_ENTRY_SIZE: u64 = 16;
/// First heap byte.
pub const HEAP_START: u64 = 4096;

/// Checks that `len` bytes at `at` lie in the heap of one of `blades`:
/// what every address a client stored on a blade names. Memory damaged
/// behind the clients' backs is so caught where such an address is read.
///
/// # Errors
/// Why not, as words to follow the address in a message ("is null", "is on
/// memory blade 9, and there are 2", …).
pub fn check_heap_place(blades: &[crate::BladeInfo], at: crate::GlobalAddr, len: u64) -> Result<(), String> {
    let Some(b) = blades.get(usize::from(at.blade())) else {
        return Err(format!("is on memory blade {}, and there are {}", at.blade(), blades.len()));
    };
    if at.is_null() {
        Err("is null".into())
    } else if at.offset() < HEAP_START {
        Err(format!("is below the heap of memory blade {} (at {HEAP_START})", at.blade()))
    } else if at.offset().checked_add(len).is_none_or(|end| end > b.size) {
        Err(format!("and its {len} bytes pass the end of memory blade {} ({} bytes)", at.blade(), b.size))
    } else {
        Ok(())
    }
}

const _: () = assert!(OFF_ROOTS + ROOT_ENTRIES * ROOT_ENTRY_SIZE <= HEAP_START);

/// What went wrong with a blade's superblock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The region is too small to hold a superblock and any heap.
    #[error("region of {0} bytes is too small (need more than {HEAP_START})")]
    TooSmall(u64),
    /// The region holds something other than a Smart-rs blade.
    #[error("region is not a Smart-rs memory blade (magic {0:#018x})")]
    BadMagic(u64),
    /// The blade was formatted by another layout version.
    #[error("blade layout version {found}, this build speaks {LAYOUT_VERSION}")]
    Version {
        /// The version found.
        found: u64,
    },
    /// The recorded size disagrees with the region.
    #[error("superblock records {recorded} bytes but the region has {actual}")]
    Size {
        /// Size in the superblock.
        recorded: u64,
        /// Size of the region.
        actual: u64,
    },
}

/// Formats `region` if it is all-zero at the superblock, else checks it.
/// Returns whether it formatted.
///
/// # Errors
/// If the region is too small, or holds a foreign or mismatched superblock.
pub fn format_or_check(region: &Region) -> Result<bool, LayoutError> {
    if region.len() <= HEAP_START {
        return Err(LayoutError::TooSmall(region.len()));
    }
    let word = |off| region.load_u64(off).expect("superblock in bounds");
    let magic = word(OFF_MAGIC);
    if magic == 0 {
        let put = |off, v| region.store_u64(off, v).expect("superblock in bounds");
        put(OFF_VERSION, LAYOUT_VERSION);
        put(OFF_SIZE, region.len());
        put(OFF_HEAP, HEAP_START);
        put(OFF_IDENTITY, new_identity());
        put(OFF_MAGIC, MAGIC);
        return Ok(true);
    }
    check_words(magic, word(OFF_VERSION), word(OFF_SIZE), region.len())?;
    if word(OFF_IDENTITY) == 0 {
        // Formatted by a build that left the word reserved: the blade has
        // not been checked as part of a set either, so it joins one afresh.
        region.store_u64(OFF_IDENTITY, new_identity()).expect("superblock in bounds");
    }
    Ok(false)
}

/// A blade identity: random, with its top 48 bits (what a set place keeps
/// of blade 0's) not all zero.
fn new_identity() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id >> 16 != 0 {
            return id;
        }
    }
}

/// The set-place word of the blade at `index` of a set whose blade 0 has
/// identity `head`.
pub fn set_place(head: u64, index: u16) -> u64 {
    (head & !0xffff) | u64::from(index)
}

/// Checks the first three superblock words against what the peer reported.
///
/// # Errors
/// As [`format_or_check`].
pub fn check_words(magic: u64, version: u64, size: u64, actual: u64) -> Result<(), LayoutError> {
    if magic != MAGIC {
        return Err(LayoutError::BadMagic(magic));
    }
    if version != LAYOUT_VERSION {
        return Err(LayoutError::Version { found: version });
    }
    if size != actual {
        return Err(LayoutError::Size { recorded: size, actual });
    }
    Ok(())
}

/// The tag under which a named root is stored: FNV-1a of the name, never 0.
pub fn root_tag(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// Offset of root-table entry `i`.
pub fn root_entry(i: u64) -> u64 {
    OFF_ROOTS + (i % ROOT_ENTRIES) * ROOT_ENTRY_SIZE
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn superblock_offsets_are_pinned() {
        assert_eq!((OFF_MAGIC, OFF_VERSION, OFF_SIZE, OFF_HEAP, OFF_ROOTS), (0, 8, 16, 24, 64));
        assert_eq!((OFF_IDENTITY, OFF_SET_PLACE, OFF_SET_NEXT), (32, 40, 48));
        assert_eq!(set_place(0x1234_5678_9abc_def0, 3), 0x1234_5678_9abc_0003);
        assert_eq!(root_entry(0), 64);
        assert_eq!(root_entry(ROOT_ENTRIES), 64);
        assert_eq!(root_entry(63), 64 + 63 * 16);
        assert_eq!(&MAGIC.to_le_bytes(), b"SMARTBLD");
    }

    #[test]
    fn format_then_check() {
        let r = Region::anonymous(1 << 20).unwrap();
        assert_eq!(format_or_check(&r), Ok(true));
        assert_eq!(format_or_check(&r), Ok(false));
        assert_eq!(r.load_u64(OFF_HEAP), Ok(HEAP_START));
        // An identity is drawn once and kept; a blade formatted before the
        // word existed gets one when next served.
        let id = r.load_u64(OFF_IDENTITY).unwrap();
        assert_ne!(id >> 16, 0);
        assert_eq!(format_or_check(&r), Ok(false));
        assert_eq!(r.load_u64(OFF_IDENTITY), Ok(id));
        r.store_u64(OFF_IDENTITY, 0).unwrap();
        assert_eq!(format_or_check(&r), Ok(false));
        assert_ne!(r.load_u64(OFF_IDENTITY).unwrap() >> 16, 0);
        assert_ne!(
            Region::anonymous(1 << 20).map(|r2| (format_or_check(&r2), r2.load_u64(OFF_IDENTITY))).unwrap().1,
            Ok(id)
        );
        r.store_u64(OFF_VERSION, 99).unwrap();
        assert_eq!(format_or_check(&r), Err(LayoutError::Version { found: 99 }));
        r.store_u64(OFF_MAGIC, 7).unwrap();
        assert_eq!(format_or_check(&r), Err(LayoutError::BadMagic(7)));
        assert_eq!(format_or_check(&Region::anonymous(4096).unwrap()), Err(LayoutError::TooSmall(4096)));
    }

    #[test]
    fn root_tags_are_nonzero_and_distinct() {
        assert_ne!(root_tag(""), 0);
        assert_ne!(root_tag("race"), root_tag("ford"));
    }
}
