//! Global addresses: (memory blade, offset) packed into 64 bits.

use std::fmt;

/// Bits of a [`GlobalAddr`] that hold the offset inside a blade (256 TiB).
pub const OFFSET_BITS: u32 = 48;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// The largest number of memory blades a [`GlobalAddr`] can name.
pub const MAX_BLADES: usize = 1 << (64 - OFFSET_BITS);

/// An address in disaggregated memory: which memory blade, and the byte
/// offset inside that blade's registered region.
///
/// The blade id sits in the top 16 bits and the offset in the low 48, so a
/// `GlobalAddr` fits an 8-byte word that remote structures can store and CAS.
/// The raw value 0 (blade 0, offset 0) is the blade's superblock and is never
/// handed out by the allocator, so applications may use 0 as "null".
///
/// ```
/// use smart_core::GlobalAddr;
/// let a = GlobalAddr::new(3, 4096);
/// assert_eq!((a.blade(), a.offset()), (3, 4096));
/// assert_eq!(GlobalAddr::from_raw(a.raw()), a);
/// assert_eq!(a.add(8).offset(), 4104);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GlobalAddr(u64);

impl GlobalAddr {
    /// The null address (blade 0, offset 0).
    pub const NULL: GlobalAddr = GlobalAddr(0);

    /// Builds an address.
    ///
    /// # Panics
    /// If `blade` does not fit 16 bits or `offset` does not fit 48 bits.
    #[inline]
    pub const fn new(blade: u16, offset: u64) -> Self {
        assert!(offset <= OFFSET_MASK, "offset does not fit 48 bits");
        GlobalAddr(((blade as u64) << OFFSET_BITS) | offset)
    }

    /// Rebuilds an address from its 64-bit encoding.
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        GlobalAddr(raw)
    }

    /// The 64-bit encoding, to store in remote memory.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The memory blade this address lives on.
    #[inline]
    pub const fn blade(self) -> u16 {
        (self.0 >> OFFSET_BITS) as u16
    }

    /// The byte offset inside the blade's region.
    #[inline]
    pub const fn offset(self) -> u64 {
        self.0 & OFFSET_MASK
    }

    /// Whether this is [`GlobalAddr::NULL`].
    #[inline]
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on the same blade.
    ///
    /// # Panics
    /// If the offset would leave the 48-bit range.
    #[inline]
    pub const fn add(self, bytes: u64) -> Self {
        GlobalAddr::new(self.blade(), self.offset() + bytes)
    }
}

impl fmt::Debug for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}:{:#x}", self.blade(), self.offset())
    }
}

impl fmt::Display for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn packs_blade_and_offset() {
        let a = GlobalAddr::new(u16::MAX, OFFSET_MASK);
        assert_eq!(a.blade(), u16::MAX);
        assert_eq!(a.offset(), OFFSET_MASK);
        assert_eq!(a.raw(), u64::MAX);
        assert!(GlobalAddr::NULL.is_null());
        assert_eq!(format!("{:?}", GlobalAddr::new(2, 0x40)), "b2:0x40");
    }

    #[test]
    #[should_panic(expected = "48 bits")]
    fn offset_overflow_panics() {
        let _ = GlobalAddr::new(0, 1 << 48);
    }
}
