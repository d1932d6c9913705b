//! The blade's heap and named roots as a compute blade uses them: chunks
//! taken by FAA and sub-allocated per thread, roots claimed by CAS (the
//! layout is [`crate::layout`]'s).

use super::Ctx;
use crate::{layout, Error, GlobalAddr, Result};

impl Ctx {
    /// Checks blade `blade`'s superblock (magic, layout version, size).
    ///
    /// # Errors
    /// [`Error::Layout`] naming what is wrong; verb errors.
    pub async fn check_blade(&self, blade: u16) -> Result<()> {
        let size = self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?.size;
        let mut sb = [0u8; 24];
        self.read(GlobalAddr::new(blade, 0), &mut sb).await?;
        let w = |i: usize| u64::from_le_bytes(sb[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        layout::check_words(w(0), w(1), w(2), size).map_err(|source| Error::Layout { blade, cause: source })
    }

    /// Allocates `size` bytes aligned to `align` (a power of two ≤ 4096) on
    /// blade `blade`. Small allocations come from a chunk this thread took
    /// from the blade's heap with one FAA (the last chunk may be partial);
    /// large ones (over a quarter chunk) are cut with a CAS loop that never
    /// moves the heap pointer past the end, so a failed large request leaves
    /// the rest of the heap usable. Chunks are at most 1/64 of the blade.
    /// Memory is never returned to the blade (applications recycle it).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the blade's heap is exhausted.
    pub async fn alloc(&self, blade: u16, size: u64, align: u64) -> Result<GlobalAddr> {
        let info = *self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?;
        assert!(align.is_power_of_two() && align <= 4096, "align must be a power of two up to 4096");
        let size = size.max(1);
        let chunk = self.0.cfg.chunk_bytes.min(info.size / 64).next_multiple_of(4096);
        let oom = || Error::OutOfMemory { blade, bytes: size, size: info.size };
        let heap = GlobalAddr::new(blade, layout::OFF_HEAP);
        if size > chunk / 4 {
            let take = size.next_multiple_of(4096);
            let mut cur = self.read_u64(heap).await?;
            loop {
                let end = cur.checked_add(take).filter(|e| *e <= info.size).ok_or_else(oom)?;
                match self.cas(heap, cur, end).await? {
                    old if old == cur => return Ok(GlobalAddr::new(blade, cur)),
                    old => cur = old,
                }
            }
        }
        loop {
            {
                let mut chunks = self.0.chunks.borrow_mut();
                let (cur, end) = &mut chunks[blade as usize];
                let at = cur.next_multiple_of(align);
                if at + size <= *end {
                    // (`at` cannot overflow: chunks end inside the blade.)
                    *cur = at + size;
                    return Ok(GlobalAddr::new(blade, at));
                }
            }
            let off = self.faa(heap, chunk).await?;
            if off >= info.size {
                return Err(oom());
            }
            // Another coroutine of this thread may have refilled meanwhile;
            // the newest chunk wins and the rest of the older one is left.
            self.0.chunks.borrow_mut()[blade as usize] = (off, (off + chunk).min(info.size));
        }
    }

    /// Looks up the named root `name` on `blade`.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn root(&self, blade: u16, name: &str) -> Result<Option<GlobalAddr>> {
        let tag = layout::root_tag(name);
        let mut table = [0u8; (layout::ROOT_ENTRIES * layout::ROOT_ENTRY_SIZE) as usize];
        self.read(GlobalAddr::new(blade, layout::OFF_ROOTS), &mut table).await?;
        let word = |i: u64| u64::from_le_bytes(table[i as usize * 8..i as usize * 8 + 8].try_into().expect("8 bytes"));
        for probe in 0..layout::ROOT_ENTRIES {
            let e = (tag + probe) % layout::ROOT_ENTRIES;
            match word(2 * e) {
                0 => return Ok(None),
                t if t == tag => {
                    let a = word(2 * e + 1);
                    return Ok((a != 0).then(|| GlobalAddr::from_raw(a)));
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Sets the named root `name` on `blade` to `addr` unless it is set
    /// already; returns the root's value (the winner's, under a race).
    ///
    /// # Errors
    /// [`Error::RootsFull`]; verb errors.
    pub async fn set_root(&self, blade: u16, name: &str, addr: GlobalAddr) -> Result<GlobalAddr> {
        assert!(!addr.is_null(), "a root cannot be null");
        let tag = layout::root_tag(name);
        for probe in 0..layout::ROOT_ENTRIES {
            let e = layout::root_entry(tag + probe);
            let old = self.cas(GlobalAddr::new(blade, e), 0, tag).await?;
            if old == 0 || old == tag {
                let prev = self.cas(GlobalAddr::new(blade, e + 8), 0, addr.raw()).await?;
                return Ok(if prev == 0 { addr } else { GlobalAddr::from_raw(prev) });
            }
        }
        Err(Error::RootsFull(blade))
    }
}
