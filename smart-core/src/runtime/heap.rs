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
        self.superblock(blade).await.map(|_| ())
    }

    /// Blade `blade`'s superblock words before its named roots (word `i` at
    /// offset `8 i`), read in one READ and checked as by
    /// [`Ctx::check_blade`].
    pub(crate) async fn superblock(&self, blade: u16) -> Result<[u64; 8]> {
        let size = self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?.size;
        let mut sb = [0u8; layout::OFF_ROOTS as usize];
        self.read(GlobalAddr::new(blade, 0), &mut sb).await?;
        let w: [u64; 8] =
            std::array::from_fn(|i| u64::from_le_bytes(sb[i * 8..i * 8 + 8].try_into().expect("8 bytes")));
        layout::check_words(w[0], w[1], w[2], size).map_err(|source| Error::Layout { blade, cause: source })?;
        Ok(w)
    }

    /// Marks the heap of a fresh blade `blade` (nothing allocated yet) in
    /// use up to offset `end` (rounded up to a page), so that what is
    /// written there keeps its addresses: for a lost blade's contents
    /// rebuilt in place from copies on other blades.
    ///
    /// # Errors
    /// [`Error::Damaged`] if something was allocated on the blade already;
    /// [`Error::OutOfMemory`] past its end; verb errors.
    pub async fn reserve_heap(&self, blade: u16, end: u64) -> Result<()> {
        let info = *self.0.blades.get(blade as usize).ok_or(Error::NoSuchBlade(blade, self.0.blades.len()))?;
        let end = end.max(layout::HEAP_START).next_multiple_of(4096);
        if end > info.size {
            return Err(Error::OutOfMemory { blade, bytes: end - layout::HEAP_START, size: info.size });
        }
        let old = self.cas(GlobalAddr::new(blade, layout::OFF_HEAP), layout::HEAP_START, end).await?;
        if old != layout::HEAP_START {
            return Err(Error::Damaged {
                blade,
                what: format!(
                    "its heap is in use up to {old:#x}: it is not fresh, so nothing is rebuilt in place on it"
                ),
            });
        }
        Ok(())
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
        // The heap pointer is remote memory any client can write: a value
        // below the heap or off a page boundary is damage, reported, never
        // handed out (it would overlap the superblock or earlier objects).
        let damaged = |v: u64| Error::Damaged {
            blade,
            what: format!(
                "its heap pointer (offset {}) holds {v:#x}: below the heap's start ({:#x}), off a 4 KiB \
                 boundary, or at the end of the address space, which no allocation leaves; nothing was allocated",
                layout::OFF_HEAP,
                layout::HEAP_START
            ),
        };
        let sane = |v: u64| v >= layout::HEAP_START && v % 4096 == 0;
        if size > chunk / 4 {
            // (A size within a page of 2^64 has no page-rounded length: it
            // fits no blade.)
            let take = size.checked_next_multiple_of(4096).ok_or_else(oom)?;
            let mut cur = self.read_u64(heap).await?;
            loop {
                if !sane(cur) {
                    return Err(damaged(cur));
                }
                let end = cur.checked_add(take).filter(|e| *e <= info.size).ok_or_else(oom)?;
                match self.cas(heap, cur, end).await? {
                    old if old == cur => return Ok(GlobalAddr::new(blade, cur)),
                    old => cur = old,
                }
            }
        }
        let fits = |(cur, end): (u64, u64)| {
            // (`at` cannot overflow: chunks end inside the blade.)
            let at = cur.next_multiple_of(align);
            (at + size <= end).then_some(at)
        };
        loop {
            {
                let mut chunks = self.0.chunks.borrow_mut();
                let c = &mut chunks[blade as usize];
                if let Some(at) = fits(*c) {
                    c.0 = at + size;
                    return Ok(GlobalAddr::new(blade, at));
                }
                if let Some(spare) = self.0.spare_chunks.borrow_mut()[blade as usize].pop() {
                    *c = spare;
                    continue;
                }
            }
            let off = self.faa(heap, chunk).await?;
            if off.checked_add(chunk).is_none() || !sane(off) {
                // This FAA moved a damaged pointer (near 2^64 it wrapped
                // round to the start of the heap, where the next
                // allocation would overlap what is there): it is put back
                // as it was found (unless another client moved it since),
                // and reported.
                let _ = self.cas(heap, off.wrapping_add(chunk), off).await?;
                return Err(damaged(off));
            }
            if off >= info.size {
                return Err(oom());
            }
            let fresh = (off, (off + chunk).min(info.size));
            let mut chunks = self.0.chunks.borrow_mut();
            if fits(chunks[blade as usize]).is_some() {
                // Another coroutine of this thread refilled meanwhile (all
                // of a round's coroutines can find the chunk used up at
                // once): keep this chunk for a later refill instead of
                // leaving it unused for good.
                self.0.spare_chunks.borrow_mut()[blade as usize].push(fresh);
            } else {
                chunks[blade as usize] = fresh;
            }
        }
    }

    /// Blade `blade`'s named-root table: (tag, address) per entry.
    async fn root_entries(&self, blade: u16) -> Result<[(u64, u64); layout::ROOT_ENTRIES as usize]> {
        let mut table = [0u8; (layout::ROOT_ENTRIES * layout::ROOT_ENTRY_SIZE) as usize];
        self.read(GlobalAddr::new(blade, layout::OFF_ROOTS), &mut table).await?;
        let word = |i: usize| u64::from_le_bytes(table[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(std::array::from_fn(|e| (word(2 * e), word(2 * e + 1))))
    }

    /// The entry of `name`'s tag in a root table, by the probe sequence
    /// [`Ctx::set_root`] claims entries in.
    fn find_root(entries: &[(u64, u64)], name: &str) -> Option<usize> {
        let tag = layout::root_tag(name);
        (0..layout::ROOT_ENTRIES)
            .map(|probe| ((tag + probe) % layout::ROOT_ENTRIES) as usize)
            .take_while(|&e| entries[e].0 != 0)
            .find(|&e| entries[e].0 == tag)
    }

    /// Looks up the named root `name` on `blade`.
    ///
    /// # Errors
    /// [`Error::Damaged`] if the root holds no address in a blade's heap;
    /// verb errors.
    pub async fn root(&self, blade: u16, name: &str) -> Result<Option<GlobalAddr>> {
        let entries = self.root_entries(blade).await?;
        let Some(at) = Self::find_root(&entries, name).map(|e| entries[e].1).filter(|&a| a != 0) else {
            return Ok(None);
        };
        let at = GlobalAddr::from_raw(at);
        // A root names an object in some blade's heap.
        match layout::check_heap_place(self.blades(), at, 1) {
            Ok(()) => Ok(Some(at)),
            Err(why) => Err(Error::Damaged {
                blade,
                what: format!("the named root {name:?} holds {at}, which {why}: it is in no blade's heap"),
            }),
        }
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

    /// Every named root set on `blade`: (name tag, address). The names
    /// themselves are not stored there (see [`Ctx::write_name`]).
    ///
    /// # Errors
    /// Verb errors.
    pub async fn roots(&self, blade: u16) -> Result<Vec<(u64, GlobalAddr)>> {
        let entries = self.root_entries(blade).await?;
        Ok(entries
            .iter()
            .filter(|&&(tag, a)| tag != 0 && a != 0)
            .map(|&(tag, a)| (tag, GlobalAddr::from_raw(a)))
            .collect())
    }

    /// Unsets the named root `name` on `blade` (its entry keeps the name's
    /// tag, so the name can be set again); returns the address it held.
    /// The object it named is not freed.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn drop_root(&self, blade: u16, name: &str) -> Result<Option<GlobalAddr>> {
        let entries = self.root_entries(blade).await?;
        let Some(e) = Self::find_root(&entries, name) else { return Ok(None) };
        let cur = entries[e].1;
        let at = GlobalAddr::new(blade, layout::root_entry(e as u64) + 8);
        Ok((cur != 0 && self.cas(at, cur, 0).await? == cur).then(|| GlobalAddr::from_raw(cur)))
    }

    /// Stores `name` in a small block on `blade` (`[length u64][bytes]`) and
    /// returns its address: objects keep their name there so that tools can
    /// list them (a named root holds only a hash of the name).
    ///
    /// # Errors
    /// Allocation and verb errors.
    pub async fn write_name(&self, blade: u16, name: &str) -> Result<GlobalAddr> {
        let mut b = (name.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        let at = self.alloc(blade, b.len() as u64, 8).await?;
        self.write_all(at, &b).await?;
        Ok(at)
    }

    /// Reads a name [`Ctx::write_name`] stored; `None` if `at` is null or
    /// does not hold a plausible name (at most 4 KiB of UTF-8).
    ///
    /// # Errors
    /// Verb errors.
    pub async fn read_name(&self, at: GlobalAddr) -> Result<Option<String>> {
        if at.is_null() {
            return Ok(None);
        }
        let len = self.read_u64(at).await?;
        if len == 0 || len > 4096 {
            return Ok(None);
        }
        let mut b = vec![0u8; len as usize];
        self.read_all(at.add(8), &mut b).await?;
        Ok(String::from_utf8(b).ok())
    }
}
