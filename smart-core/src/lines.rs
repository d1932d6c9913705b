//! Zeroed arrays of cache lines of atomic words on transparent huge pages:
//! the large local tables a compute blade indexes at random (an address
//! cache of millions of rows, shared by its threads).
//!
//! A `Vec` of that size sits on 4 KiB pages (unless the system gives huge
//! pages to every mapping), so nearly every random access also misses the
//! TLB: its page walk stalls even a prefetch. Here the array is a mapping of
//! its own, 2 MiB aligned, advised for huge pages, faulted in lazily (an
//! untouched line costs no memory).

use std::io;
use std::ops::Deref;
use std::sync::atomic::AtomicU64;

use memmap2::{MmapMut, MmapOptions};

/// One 64-byte cache line of eight atomic words, zero to start with.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Line(pub [AtomicU64; 8]);

/// Bytes of a huge page (x86-64 and most others' 2 MiB).
const HUGE: usize = 2 << 20;

/// A zeroed array of [`Line`]s on transparent huge pages where the system
/// allows them (best effort: on normal pages otherwise).
///
/// ```
/// use std::sync::atomic::Ordering;
/// let lines = smart_core::lines::HugeLines::new(100_000).unwrap();
/// assert_eq!(lines.len(), 100_000);
/// lines[99_999].0[7].store(5, Ordering::Relaxed);
/// assert_eq!(lines[0].0[0].load(Ordering::Relaxed), 0);
/// ```
#[derive(Debug)]
pub struct HugeLines {
    map: MmapMut,
    /// Byte offset of line 0 in the mapping (2 MiB aligned in memory).
    off: usize,
    n: usize,
}

impl HugeLines {
    /// `n` zeroed lines.
    ///
    /// # Errors
    /// If the memory cannot be mapped.
    pub fn new(n: usize) -> io::Result<HugeLines> {
        let bytes = n.checked_mul(size_of::<Line>()).ok_or_else(|| io::Error::other("too many lines"))?;
        // Room to start at a huge page boundary (arrays smaller than a huge
        // page are not worth the slack).
        let slack = if bytes >= HUGE { HUGE } else { 0 };
        let map = MmapOptions::new().len((bytes + slack).max(1)).map_anon()?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let off = (map.as_ptr() as usize).next_multiple_of(if slack > 0 { HUGE } else { 1 }) - map.as_ptr() as usize;
        Ok(HugeLines { map, off, n })
    }
}

impl Deref for HugeLines {
    type Target = [Line];

    fn deref(&self) -> &[Line] {
        // SAFETY: `off + n * 64` bytes lie inside the mapping (`off` is at
        // most the slack), which is page aligned, so 64-byte aligned at
        // `off` too (a multiple of 2 MiB from a page boundary, or 0); the
        // mapping is zero-filled and lives as long as `self`, and a zeroed
        // `Line` is valid (atomics of 0). Every access is through atomics,
        // so shared references are sound.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.off).cast::<Line>(), self.n) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn lines_are_zeroed_aligned_and_writable_at_both_ends() {
        for n in [0, 1, 1000, (HUGE / 64) + 3] {
            let l = HugeLines::new(n).unwrap();
            assert_eq!(l.len(), n);
            if n == 0 {
                continue;
            }
            assert_eq!(l.as_ptr() as usize % 64, 0);
            if n * 64 >= HUGE {
                assert_eq!(l.as_ptr() as usize % HUGE, 0, "a large array starts at a huge page");
            }
            assert!([&l[0], &l[n - 1]].iter().all(|line| line.0.iter().all(|w| w.load(Ordering::Relaxed) == 0)));
            for line in [&l[0], &l[n - 1]] {
                line.0[7].store(u64::MAX, Ordering::Relaxed);
                assert_eq!(line.0[7].load(Ordering::Relaxed), u64::MAX);
            }
        }
    }
}
