//! A memory blade's registered region and the execution of verbs on it.
//!
//! Every access goes through atomic loads and stores of 8-byte words (bytes
//! at unaligned edges), so concurrent READs, WRITEs and atomics from many
//! threads are free of data races in Rust's memory model, and a multi-word
//! READ or WRITE can tear exactly as on an RNIC: at 8-byte granularity, never
//! inside an aligned word (Ziegler et al., "Design Guidelines for Correct,
//! Efficient, and Scalable One-Sided RDMA", SIGMOD '23). Only CAS and FAA are
//! atomic as wholes.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use memmap2::{MmapMut, MmapOptions};

use crate::verbs::WcStatus;

/// Bytes per cache line: the unit in which chaos mode pauses while copying.
pub const CACHE_LINE: usize = 64;

/// The most cache lines [`Region::prefetch`] hints per range (a 2 KiB
/// bucket; the hardware prefetcher follows longer sequential copies).
pub(crate) const PREFETCH_LINES: u64 = 32;

/// A contiguous region of blade memory (anonymous or backed by a file).
#[derive(Debug)]
pub struct Region {
    map: MmapMut,
    file: Option<File>,
    /// A sync of the file failed: no later one proves anything.
    sync_failed: AtomicBool,
}

/// How a multi-word copy is paced, so tests can make tearing happen.
pub(crate) trait LinePacer {
    /// Whether `between_lines` does anything. Copies paced by a pacer that
    /// does not take the straight word loop, with no per-word checks.
    const PAUSES: bool = true;
    /// Called between two cache lines of one READ or WRITE.
    fn between_lines(&mut self);
    /// Whether a READ should copy its lines from the highest address down
    /// (an RNIC does not promise address order for READs).
    fn reverse_read(&mut self) -> bool;
    /// Whether CAS and FAA run as read, pause, write back under a lock
    /// that only atomics take, the write back even when a CAS's compare
    /// fails: atomic with respect to each other but not to WRITEs, as
    /// Soft-RoCE's in Linux 6.1.
    fn write_back_atomics(&self) -> bool {
        false
    }
}

/// No pauses: the fast path.
pub(crate) struct NoPause;

impl LinePacer for NoPause {
    const PAUSES: bool = false;
    #[inline]
    fn between_lines(&mut self) {}
    #[inline]
    fn reverse_read(&mut self) -> bool {
        false
    }
}

/// The memory the kernel reports available (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where it does not say.
#[cfg(target_os = "linux")]
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Region {
    /// An anonymous, zero-filled region of `size` bytes.
    ///
    /// # Errors
    /// If the mapping fails, or (on Linux) `size` is more than the memory
    /// the kernel says is available: every page is populated up front, and
    /// populating more than that would wake the OOM killer (which may kill
    /// another process) instead of failing here.
    pub fn anonymous(size: u64) -> io::Result<Region> {
        let len = usize::try_from(size).map_err(|_| io::Error::other("size too large"))?;
        #[cfg(target_os = "linux")]
        if let Some(avail) = mem_available() {
            if size > avail {
                return Err(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "{size} bytes asked, more than the {avail} bytes of memory available \
                         (MemAvailable in /proc/meminfo): the region is populated up front"
                    ),
                ));
            }
        }
        let map = MmapOptions::new().len(len.max(1)).map_anon()?;
        // Transparent huge pages where the system allows them (RNIC drivers
        // register blade memory on huge pages too): a blade's random
        // accesses then miss the TLB far less. Best effort.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        // Populated up front, as registering memory with an RNIC pins it:
        // no page fault, and no copy-on-write of the zero page with its TLB
        // shootdown, on the first WRITE to each page in the middle of a run.
        #[cfg(target_os = "linux")]
        let populated = map.advise(memmap2::Advice::PopulateWrite).is_ok();
        #[cfg(not(target_os = "linux"))]
        let populated = false;
        let region = Region { map, file: None, sync_failed: AtomicBool::new(false) };
        if !populated {
            // Kernels before 5.14: touch every page (a zero store keeps the
            // contents).
            for page in (0..region.len()).step_by(4096) {
                region.byte(page).store(0, Ordering::Relaxed);
            }
        }
        Ok(region)
    }

    /// An anonymous zero region whose pages come on first touch, never
    /// populated up front: for a simulator, which charges virtual time for
    /// its accesses and whose blades may be far larger than what a run
    /// touches.
    ///
    /// # Errors
    /// If the mapping fails.
    pub fn anonymous_lazy(size: u64) -> io::Result<Region> {
        let len = usize::try_from(size).map_err(|_| io::Error::other("size too large"))?;
        let map = MmapOptions::new().len(len.max(1)).map_anon()?;
        Ok(Region { map, file: None, sync_failed: AtomicBool::new(false) })
    }

    /// An anonymous region on 2 MiB huge pages when the system has them
    /// reserved (fewer translation misses on the RNIC), else on normal pages.
    /// Returns the region and whether it got huge pages.
    ///
    /// # Errors
    /// If even the normal mapping fails.
    pub fn anonymous_huge(size: u64) -> io::Result<(Region, bool)> {
        let len = usize::try_from(size).map_err(|_| io::Error::other("size too large"))?;
        match MmapOptions::new().len(len.max(1).next_multiple_of(2 << 20)).huge(Some(21)).map_anon() {
            Ok(map) if len % (2 << 20) == 0 => {
                Ok((Region { map, file: None, sync_failed: AtomicBool::new(false) }, true))
            }
            _ => Ok((Region::anonymous(size)?, false)),
        }
    }

    /// A region backed by the file at `path`, created (zero-filled) with
    /// `size` bytes if it does not exist. An existing file keeps its contents
    /// and size; `size`, if given, must then match it.
    ///
    /// # Errors
    /// If the file cannot be opened or mapped, or its size differs from `size`.
    pub fn file_backed(path: &Path, size: Option<u64>) -> io::Result<Region> {
        if size.is_none() && !path.exists() {
            // Refused before anything is created: no empty file left behind.
            return Err(io::Error::other(format!(
                "backing file {} does not exist: give --size to create it",
                path.display()
            )));
        }
        let created = !path.exists();
        let opened = Self::open_locked(path, size);
        if opened.is_err() && created {
            let _ = std::fs::remove_file(path);
        }
        opened
    }

    fn open_locked(path: &Path, size: Option<u64>) -> io::Result<Region> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        // One memory-blade per backing file: an exclusive advisory lock, held
        // as long as the file is open (the region's life).
        // SAFETY: flock on a file descriptor this function owns (open above).
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                io::Error::other(format!(
                    "backing file {} is in use by another memory-blade (it holds the file's lock)",
                    path.display()
                ))
            } else {
                e
            });
        }
        let existing = file.metadata()?.len();
        let len = match (existing, size) {
            (0, Some(s)) => {
                file.set_len(s)?;
                s
            }
            (0, None) => {
                return Err(io::Error::other(format!("backing file {} is empty: give --size", path.display())))
            }
            (e, Some(s)) if e != s => {
                return Err(io::Error::other(format!(
                    "backing file {} holds {e} bytes but --size asks for {s}; \
                     omit --size to reuse the file as it is",
                    path.display()
                )))
            }
            (e, _) => e,
        };
        // Every byte gets its disk space now: a write through the mapping to
        // a hole that the file system cannot fill (the disk is full) would
        // kill the blade with SIGBUS in the middle of a run. A file made
        // sparse (by an older build) gets its holes filled here.
        let len_off = libc::off_t::try_from(len)
            .map_err(|_| io::Error::other(format!("backing file {}: {len} bytes is too large", path.display())))?;
        // SAFETY: posix_fallocate on a file descriptor this function owns.
        let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, len_off) };
        if rc != 0 {
            let cause = io::Error::from_raw_os_error(rc);
            return Err(io::Error::new(
                cause.kind(),
                format!(
                    "backing file {}: cannot reserve its {len} bytes on its file system ({cause}); free space there, \
                     or give a smaller --size for a new file",
                    path.display()
                ),
            ));
        }
        // SAFETY: the file is ours for the life of the process by convention
        // (one memory-blade per backing file); all access to the mapping goes
        // through atomics, so a concurrent external writer could change values
        // but never cause a data race in this process's view.
        let map = unsafe { MmapOptions::new().len(len as usize).map_mut(&file)? };
        Ok(Region { map, file: Some(file), sync_failed: AtomicBool::new(false) })
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Writes the mapping back to its file (no-op when anonymous).
    ///
    /// # Errors
    /// If `msync` or `fsync` fails.
    pub fn flush(&self) -> io::Result<()> {
        if let Some(f) = &self.file {
            self.map.flush()?;
            f.sync_all()?;
        }
        Ok(())
    }

    /// Whether the region is backed by a file.
    pub fn is_file_backed(&self) -> bool {
        self.file.is_some()
    }

    /// The kind of file system that holds the backing file, when it keeps
    /// files in memory only (`tmpfs`, `ramfs`): nothing there survives a
    /// power loss, whatever is synced. `None` for a region on another file
    /// system, or an anonymous one.
    ///
    /// # Errors
    /// If `fstatfs` fails.
    pub fn memory_file_system(&self) -> io::Result<Option<&'static str>> {
        let Some(f) = &self.file else { return Ok(None) };
        // SAFETY: a zeroed statfs is a valid out-parameter.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatfs on a descriptor this region owns, into `st`.
        if unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(f), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        #[allow(clippy::unnecessary_cast, reason = "f_type is i64 on x86-64, other widths elsewhere")]
        Ok(match st.f_type as i64 {
            TMPFS_MAGIC => Some("tmpfs"),
            RAMFS_MAGIC => Some("ramfs"),
            _ => None,
        })
    }

    /// Writes every page of the mapping changed since the last sync back to
    /// the file and waits until the disk holds them (`fdatasync`: the file
    /// system also commits what it needs to read them back, and the disk's
    /// write cache is flushed once). A no-op when the region is anonymous.
    ///
    /// Once a sync has failed, every later one fails too: the kernel reports
    /// a failed write-back once, to the first sync after it, and may drop
    /// the pages it could not write, so a later sync that succeeds would not
    /// mean that they are on disk.
    ///
    /// # Errors
    /// If `fdatasync` fails (e.g. EIO: the disk refused the write), now or
    /// before.
    pub fn sync_data(&self) -> io::Result<()> {
        let Some(f) = &self.file else { return Ok(()) };
        if self.sync_failed.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "an earlier sync of this file failed, and writes it held may be lost: no later sync can say \
                 they are on disk (restart the blade on the file after checking the disk)",
            ));
        }
        f.sync_data().inspect_err(|_| self.sync_failed.store(true, Ordering::Release))
    }

    /// Makes every later [`Region::sync_data`] fail as after a failed
    /// write-back: for tests of what depends on syncs.
    #[doc(hidden)]
    pub fn fail_syncs(&self) {
        self.sync_failed.store(true, Ordering::Release);
    }

    fn base(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// The region's first byte, for registration with an RNIC (which then
    /// reads and writes it by DMA, as remote verbs do).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base()
    }

    /// Checks that `[off, off+len)` lies inside the region.
    #[inline]
    pub fn check(&self, off: u64, len: u64) -> Result<(), WcStatus> {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(WcStatus::RemoteAccess),
        }
    }

    #[inline]
    fn word(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len());
        // SAFETY: `off` is in bounds and 8-aligned (the map is page-aligned),
        // the mapping lives as long as `self`, and every access to the region
        // is atomic, so shared references to atomics over it are sound.
        unsafe { AtomicU64::from_ptr(self.base().add(off as usize).cast()) }
    }

    #[inline]
    fn byte(&self, off: u64) -> &AtomicU8 {
        debug_assert!(off < self.len());
        // SAFETY: in bounds, and all access is atomic (see `word`).
        unsafe { AtomicU8::from_ptr(self.base().add(off as usize)) }
    }

    /// Hints the CPU to start loading the cache lines of `[off, off+len)`
    /// (at most the first [`PREFETCH_LINES`]), so that the copy that
    /// follows later does not wait for memory line by line. Out-of-range
    /// bytes are not touched; on other architectures this does nothing.
    #[inline]
    pub(crate) fn prefetch(&self, off: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            if self.check(off, len).is_err() || len == 0 {
                return;
            }
            let hint = |a: u64| {
                // SAFETY: `a` lies inside the mapping (checked above); a
                // prefetch reads nothing architecturally and never faults.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        self.base().wrapping_add(a as usize) as *const i8,
                    )
                }
            };
            if len <= CACHE_LINE as u64 {
                // The usual small READ or atomic: its line, and the next if
                // it crosses into it (a second hint of a line being fetched
                // waits for it).
                hint(off);
                let last = off + len - 1;
                if last / CACHE_LINE as u64 != off / CACHE_LINE as u64 {
                    hint(last);
                }
                return;
            }
            let first = off / CACHE_LINE as u64;
            let last = ((off + len - 1) / CACHE_LINE as u64).min(first + PREFETCH_LINES - 1);
            for line in first..=last {
                hint((line * CACHE_LINE as u64).max(off));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, len);
    }

    /// Reads `dst.len()` bytes at `off` (bounds already checked).
    #[inline]
    pub(crate) fn read_into(&self, off: u64, dst: &mut [u8], pacer: &mut impl LinePacer) {
        if dst.len() == 8 && off % 8 == 0 {
            // One aligned word (the most common READ of the applications'
            // metadata): a single atomic load.
            dst.copy_from_slice(&self.word(off).load(Ordering::Relaxed).to_ne_bytes());
            return;
        }
        if dst.len() <= CACHE_LINE || !pacer.reverse_read() {
            self.read_span(off, dst, pacer);
            return;
        }
        // Copy line-aligned pieces from the top down.
        let mut end = dst.len();
        while end > 0 {
            let abs_end = off + end as u64;
            let line_start = if abs_end % CACHE_LINE as u64 == 0 {
                abs_end - CACHE_LINE as u64
            } else {
                abs_end - abs_end % CACHE_LINE as u64
            };
            let start = line_start.max(off) - off;
            self.read_span(off + start, &mut dst[start as usize..end], &mut NoPause);
            end = start as usize;
            if end > 0 {
                pacer.between_lines();
            }
        }
    }

    fn read_span<P: LinePacer>(&self, off: u64, dst: &mut [u8], pacer: &mut P) {
        if !P::PAUSES {
            // Bytes up to the first aligned word, then whole words with no
            // per-word checks, then the bytes after the last word.
            let head = ((8 - off % 8) % 8).min(dst.len() as u64) as usize;
            let (head_dst, rest) = dst.split_at_mut(head);
            for (i, b) in head_dst.iter_mut().enumerate() {
                *b = self.byte(off + i as u64).load(Ordering::Relaxed);
            }
            let mut a = off + head as u64;
            let mut words = rest.chunks_exact_mut(8);
            for w in &mut words {
                w.copy_from_slice(&self.word(a).load(Ordering::Relaxed).to_ne_bytes());
                a += 8;
            }
            for (i, b) in words.into_remainder().iter_mut().enumerate() {
                *b = self.byte(a + i as u64).load(Ordering::Relaxed);
            }
            return;
        }
        let mut i = 0usize;
        let n = dst.len();
        while i < n {
            let a = off + i as u64;
            if a % 8 == 0 && n - i >= 8 {
                let v = self.word(a).load(Ordering::Relaxed);
                dst[i..i + 8].copy_from_slice(&v.to_ne_bytes());
                i += 8;
            } else {
                dst[i] = self.byte(a).load(Ordering::Relaxed);
                i += 1;
            }
            if i < n && (off + i as u64) % CACHE_LINE as u64 == 0 {
                pacer.between_lines();
            }
        }
    }

    /// Writes `src` at `off` in address order (bounds already checked).
    #[inline]
    pub(crate) fn write_from<P: LinePacer>(&self, off: u64, src: &[u8], pacer: &mut P) {
        if !P::PAUSES {
            let head = ((8 - off % 8) % 8).min(src.len() as u64) as usize;
            let (head_src, rest) = src.split_at(head);
            for (i, &b) in head_src.iter().enumerate() {
                self.byte(off + i as u64).store(b, Ordering::Relaxed);
            }
            let mut a = off + head as u64;
            let mut words = rest.chunks_exact(8);
            for w in &mut words {
                self.word(a).store(u64::from_ne_bytes(w.try_into().expect("8 bytes")), Ordering::Relaxed);
                a += 8;
            }
            for (i, &b) in words.remainder().iter().enumerate() {
                self.byte(a + i as u64).store(b, Ordering::Relaxed);
            }
            return;
        }
        let mut i = 0usize;
        let n = src.len();
        while i < n {
            let a = off + i as u64;
            if a % 8 == 0 && n - i >= 8 {
                let v = u64::from_ne_bytes(src[i..i + 8].try_into().expect("8 bytes"));
                self.word(a).store(v, Ordering::Relaxed);
                i += 8;
            } else {
                self.byte(a).store(src[i], Ordering::Relaxed);
                i += 1;
            }
            if i < n && (off + i as u64) % CACHE_LINE as u64 == 0 {
                pacer.between_lines();
            }
        }
    }

    /// Atomic compare-and-swap of the aligned word at `off`; returns the old
    /// value whether or not the swap happened.
    #[inline]
    pub fn cas(&self, off: u64, compare: u64, swap: u64) -> Result<u64, WcStatus> {
        self.check_atomic(off)?;
        Ok(match self.word(off).compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) | Err(v) => v,
        })
    }

    /// Atomic fetch-and-add of the aligned word at `off`; returns the old value.
    #[inline]
    pub fn faa(&self, off: u64, add: u64) -> Result<u64, WcStatus> {
        self.check_atomic(off)?;
        Ok(self.word(off).fetch_add(add, Ordering::AcqRel))
    }

    /// A CAS (`cas`: compare `compare_add`, swap `swap`) or FAA (add
    /// `compare_add`) executed as read, pause, write back under a lock that
    /// only these take, the write back unconditional: atomic with respect
    /// to other such atomics, not to WRITEs (see
    /// [`LinePacer::write_back_atomics`]). Returns the old value.
    pub(crate) fn write_back_atomic(
        &self,
        off: u64,
        cas: bool,
        compare_add: u64,
        swap: u64,
        pacer: &mut impl LinePacer,
    ) -> Result<u64, WcStatus> {
        static ATOMICS: std::sync::Mutex<()> = std::sync::Mutex::new(());
        self.check_atomic(off)?;
        let _g = ATOMICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = self.word(off).load(Ordering::Acquire);
        pacer.between_lines();
        let new = match cas {
            true if old == compare_add => swap,
            true => old,
            false => old.wrapping_add(compare_add),
        };
        self.word(off).store(new, Ordering::Release);
        Ok(old)
    }

    /// Atomic load of the aligned word at `off` (local access by the blade).
    pub fn load_u64(&self, off: u64) -> Result<u64, WcStatus> {
        self.check_atomic(off)?;
        Ok(self.word(off).load(Ordering::Acquire))
    }

    /// Atomic store of the aligned word at `off` (local access by the blade).
    pub fn store_u64(&self, off: u64, v: u64) -> Result<(), WcStatus> {
        self.check_atomic(off)?;
        self.word(off).store(v, Ordering::Release);
        Ok(())
    }

    #[inline]
    fn check_atomic(&self, off: u64) -> Result<(), WcStatus> {
        if off % 8 != 0 {
            return Err(WcStatus::RemoteInvalidRequest);
        }
        self.check(off, 8)
    }

    /// Copies `dst.len()` bytes at `off` with bounds checking (blade-local).
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`] if out of bounds.
    pub fn read(&self, off: u64, dst: &mut [u8]) -> Result<(), WcStatus> {
        self.check(off, dst.len() as u64)?;
        self.read_into(off, dst, &mut NoPause);
        Ok(())
    }

    /// Writes `src` at `off` with bounds checking (blade-local).
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`] if out of bounds.
    pub fn write(&self, off: u64, src: &[u8]) -> Result<(), WcStatus> {
        self.check(off, src.len() as u64)?;
        self.write_from(off, src, &mut NoPause);
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Counts the pauses between lines; reads backwards if `reverse`.
    struct Counting {
        pauses: usize,
        reverse: bool,
    }
    impl Counting {
        fn new(reverse: bool) -> Counting {
            Counting { pauses: 0, reverse }
        }
    }
    impl LinePacer for Counting {
        fn between_lines(&mut self) {
            self.pauses += 1;
        }
        fn reverse_read(&mut self) -> bool {
            self.reverse
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_region_larger_than_the_available_memory_is_refused() {
        // 256 TiB: above any machine's available memory, and above the
        // user address space, so that the mapping fails even if the check
        // did not (nothing is populated either way).
        let e = Region::anonymous(1 << 48).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
        let m = e.to_string();
        assert!(m.contains("281474976710656 bytes asked, more than the") && m.contains("MemAvailable"), "{m}");
        assert!(mem_available().is_some_and(|a| a > 0));
    }

    #[test]
    fn unaligned_and_reverse_copies_round_trip() {
        let r = Region::anonymous(4096).unwrap();
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        r.write(13, &src).unwrap();
        let mut fwd = vec![0; 300];
        r.read(13, &mut fwd).unwrap();
        assert_eq!(fwd, src);
        let mut rev = vec![0; 300];
        let mut p = Counting::new(true);
        r.read_into(13, &mut rev, &mut p);
        assert_eq!(rev, src);
        assert!(p.pauses >= 4, "a 300-byte unaligned read spans at least 5 lines");
    }

    #[test]
    fn the_straight_word_loop_copies_what_the_paced_loop_copies() {
        // Every head (offset mod 8) and tail (length mod 8), across lines.
        let r = Region::anonymous(4096).unwrap();
        r.write_from(0, &[0xEE; 4096], &mut Counting::new(false));
        for off in 0..17u64 {
            for len in 0..150usize {
                let src: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + off * 7 + 1) as u8).collect();
                r.write(off, &src).unwrap();
                let mut fast = vec![0; len];
                r.read(off, &mut fast).unwrap();
                assert_eq!(fast, src, "unpaced read at {off}, {len} bytes");
                let mut paced = vec![0; len];
                r.read_into(off, &mut paced, &mut Counting::new(false));
                assert_eq!(paced, src, "paced read at {off}, {len} bytes");
                // The bytes around the written span are untouched.
                let mut around = [0u8; 1];
                if off > 0 {
                    r.read(off - 1, &mut around).unwrap();
                    assert_eq!(around[0], 0xEE, "byte before {off}");
                }
                r.read(off + len as u64, &mut around).unwrap();
                assert_eq!(around[0], 0xEE, "byte after {off}+{len}");
                r.write_from(off, &vec![0xEE; len], &mut Counting::new(false));
            }
        }
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        let r = Region::anonymous(4096).unwrap();
        assert_eq!(r.read(4090, &mut [0; 8]), Err(WcStatus::RemoteAccess));
        assert_eq!(r.write(u64::MAX - 2, &[0; 8]), Err(WcStatus::RemoteAccess));
        assert_eq!(r.cas(4, 0, 1), Err(WcStatus::RemoteInvalidRequest));
        assert_eq!(r.faa(4096, 1), Err(WcStatus::RemoteAccess));
        assert_eq!(r.cas(8, 0, 5), Ok(0));
        assert_eq!(r.cas(8, 0, 6), Ok(5));
        assert_eq!(r.faa(8, 2), Ok(5));
        assert_eq!(r.load_u64(8), Ok(7));
    }

    #[test]
    fn huge_page_region_works_either_way() {
        // Whether or not huge pages are reserved here, the region works.
        let (r, _huge) = Region::anonymous_huge(4 << 20).unwrap();
        assert_eq!(r.len(), 4 << 20);
        r.store_u64(8, 7).unwrap();
        assert_eq!(r.load_u64(8), Ok(7));
        let (odd, huge) = Region::anonymous_huge(4096 * 3).unwrap();
        assert!(!huge, "a size that is not a multiple of 2 MiB gets normal pages");
        assert_eq!(odd.len(), 4096 * 3);
    }

    #[test]
    fn file_backed_region_checks_sizes() {
        let dir = std::env::temp_dir().join(format!("smart-region-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        assert!(Region::file_backed(&dir, None).is_err());
        {
            let r = Region::file_backed(&dir, Some(8192)).unwrap();
            r.store_u64(64, 42).unwrap();
            r.flush().unwrap();
        }
        let e = Region::file_backed(&dir, Some(4096)).unwrap_err();
        assert!(e.to_string().contains("8192"), "{e}");
        let r = Region::file_backed(&dir, None).unwrap();
        assert_eq!(r.load_u64(64), Ok(42));
        std::fs::remove_file(&dir).unwrap();
    }
}
