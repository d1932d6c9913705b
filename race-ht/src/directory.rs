//! The directory: creating and opening a table, the per-thread cached copy
//! of its directory, and where a key lives (extendible hashing: the low GD
//! bits of a key's hash pick a directory entry, which names a subtable of
//! local depth L ≤ GD).

use std::cell::RefCell;
use std::rc::Rc;

use smart_core::{Ctx, GlobalAddr};

use crate::config::{PAUSE_MAX_NS, PAUSE_NS, WATCH_GAP};
use crate::layout::{self, Slot, BUCKET, SLOTS, TABLE_HEADER, TABLE_MAGIC};
use crate::spec::SpecCache;
use crate::{RaceConfig, RaceError, RaceHt, ResizeStats, Result, RESIZE_LEASE, SPLIT_STALL};
use smart_core::reclaim::Reclaimer;

/// The cached directory (shared by a thread's handles).
#[derive(Debug)]
pub(crate) struct Directory {
    /// Global depth.
    pub(crate) depth: u32,
    pub(crate) groups: u64,
    /// Where the directory array is.
    pub(crate) array: GlobalAddr,
    /// The dir word this was read from (its generation included).
    pub(crate) dir_word: u64,
    /// Per entry: local depth and subtable.
    pub(crate) entries: Vec<(u32, GlobalAddr)>,
    /// The split counter read before the array: an older read never
    /// replaces a newer one.
    pub(crate) epoch: u64,
    /// Bumped on every install, so a thread's coroutines re-read it once.
    pub(crate) version: u64,
    /// The reclamation epoch in which it was last known current (see
    /// `RaceHt::begin`), and the reclaimer's lapses seen.
    pub(crate) checked: u64,
    pub(crate) lapses: u64,
}

/// Where a key may live.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    /// The key's first hash (also the speculation cache's tag).
    pub(crate) h1: u64,
    /// Local depth and suffix of its subtable, per the cache.
    pub(crate) depth: u32,
    pub(crate) suffix: u64,
    pub(crate) base: GlobalAddr,
    pub(crate) buckets: [GlobalAddr; 2],
    pub(crate) fp: u8,
    /// The directory version it was computed from.
    pub(crate) version: u64,
}

impl Directory {
    /// Each subtable once: (suffix, local depth, address). A subtable of
    /// local depth L and suffix s first appears at entry s.
    pub(crate) fn subtables(&self) -> impl Iterator<Item = (u64, u32, GlobalAddr)> + '_ {
        self.entries.iter().enumerate().filter(|(i, (ld, _))| *i < 1 << ld).map(|(i, &(ld, at))| (i as u64, ld, at))
    }
}

/// The shape of a table, from its directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableShape {
    /// Global depth.
    pub depth: u32,
    /// Subtables.
    pub subtables: usize,
    /// Splits done by every client since creation.
    pub splits: u64,
    /// Subtables on each blade.
    #[serde(rename = "subtables_per_blade")]
    pub per_blade: Vec<usize>,
}

/// An operation's waiting on frozen subtables.
#[derive(Debug, Default)]
pub(crate) struct Wait {
    /// When the wait began, on the thread's clock (ns).
    pub(crate) start: Option<u64>,
    pub(crate) rounds: u32,
    /// The split lock being watched (its address and word), since when it
    /// holds that word, and when it was last read.
    pub(crate) lock: Option<(GlobalAddr, u64, Watch)>,
}

/// Watching a lock word for a lease: how long it stayed the same while the
/// watcher kept looking (a gap longer than [`WATCH_GAP`] between two looks
/// restarts the clock: the watcher itself was stalled, and so may have been
/// the holder).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Watch {
    /// Times on the thread's clock ([`Ctx::now_ns`]): the host's, or a
    /// simulation's virtual time.
    since: u64,
    last: u64,
}

impl Watch {
    pub(crate) fn start(ctx: &Ctx) -> Watch {
        let now = ctx.now_ns();
        Watch { since: now, last: now }
    }

    /// Records one more look at an unchanged word; returns how long it has
    /// been watched without a gap.
    pub(crate) fn look(&mut self, ctx: &Ctx) -> std::time::Duration {
        let now = ctx.now_ns();
        if now.saturating_sub(self.last) > WATCH_GAP.as_nanos() as u64 {
            self.since = now;
        }
        self.last = now;
        std::time::Duration::from_nanos(now - self.since)
    }
}

pub(crate) fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A subtable image of `groups` groups whose buckets all carry the header
/// of local depth `depth` and suffix `suffix`, slots empty, split lock
/// free.
pub(crate) fn empty_subtable(groups: u64, depth: u32, suffix: u64) -> Vec<u8> {
    let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
    let header = layout::bucket_header(depth, suffix).to_le_bytes();
    for b in img[..layout::bucket_bytes(groups) as usize].chunks_mut(BUCKET as usize) {
        b[..8].copy_from_slice(&header);
    }
    img
}

/// Every slot of an image of a subtable's buckets: (offset in the
/// subtable, slot word).
pub(crate) fn slots_of(img: &[u8]) -> impl Iterator<Item = (usize, Slot)> + '_ {
    (0..img.len() / BUCKET as usize)
        .flat_map(|b| (0..SLOTS).map(move |i| b * BUCKET as usize + 8 + 8 * i))
        .map(|off| (off, Slot(word(img, off))))
}

/// Blade of the subtable with `suffix`: spreads subtables over the blades,
/// and a split's first half stays on its parent's blade.
pub(crate) fn blade_of(suffix: u64, blades: usize) -> u16 {
    (suffix % blades as u64) as u16
}

impl RaceHt {
    /// Creates table `name` (unless it exists) with 2^`cfg.depth` subtables
    /// spread over the blades; returns a handle.
    ///
    /// # Errors
    /// Verb and allocation errors; a bad shape; an existing object of
    /// another kind.
    pub async fn create(ctx: &Ctx, name: &str, cfg: RaceConfig) -> Result<RaceHt> {
        if cfg.depth > layout::MAX_DEPTH || cfg.groups == 0 || ctx.blades().len() > 256 {
            return Err(RaceError::Corrupt(format!(
                "{name:?}: bad shape (depth {} of at most {}, {} groups, {} blades of at most 256)",
                cfg.depth,
                layout::MAX_DEPTH,
                cfg.groups,
                ctx.blades().len()
            )));
        }
        if cfg.groups > layout::MAX_GROUPS {
            return Err(RaceError::Corrupt(format!(
                "{name:?}: bad shape ({} groups per subtable: more than the {} bytes a blade addresses)",
                cfg.groups,
                layout::MAX_OFFSET + 1
            )));
        }
        let root = format!("race-ht:{name}");
        if ctx.root(0, &root).await?.is_none() {
            // What this creation allocated goes back to the free lists if it
            // fails half-way (out of memory, say) or loses the race to
            // another creator: nothing else can reach it.
            let mut made = Vec::new();
            let built = Self::build(ctx, name, &root, cfg, &mut made).await;
            if !matches!(built, Ok(true)) {
                let r = Reclaimer::new(ctx);
                r.refresh(ctx).await?;
                for &(at, bytes) in &made {
                    r.retire(at, bytes);
                }
                r.flush(ctx).await?;
            }
            built?;
        }
        Self::open(ctx, name).await
    }

    /// Allocates and writes table `name`'s header, directory and
    /// subtables, and publishes it under `root`; every allocation is
    /// recorded in `made`. Returns whether this copy won (another creator's
    /// may have been published first).
    async fn build(
        ctx: &Ctx,
        name: &str,
        root: &str,
        cfg: RaceConfig,
        made: &mut Vec<(GlobalAddr, u64)>,
    ) -> Result<bool> {
        let n = 1u64 << cfg.depth;
        let mut alloc = async |blade: u16, bytes: u64| -> Result<GlobalAddr> {
            // From the heap, or from what dropped tables gave back once the
            // heap is exhausted.
            let at = smart_core::reclaim::alloc_anywhere(ctx, blade, bytes, 64).await?;
            made.push((at, bytes));
            Ok(at)
        };
        let table = alloc(0, TABLE_HEADER).await?;
        let array = alloc(0, 8 * n).await?;
        let sub_bytes = layout::subtable_bytes(cfg.groups);
        let mut entries = Vec::with_capacity(8 * n as usize);
        for s in 0..n {
            let at = alloc(blade_of(s, ctx.blades().len()), sub_bytes).await?;
            // Every byte is written: the heap may hold old data on a
            // persistent blade.
            ctx.write_all(at, &empty_subtable(cfg.groups, cfg.depth, s)).await?;
            entries.extend_from_slice(&layout::pack_entry(cfg.depth, at).to_le_bytes());
        }
        ctx.write_all(array, &entries).await?;
        let named = ctx.write_name(0, name).await?;
        let mut head = Vec::with_capacity(TABLE_HEADER as usize);
        for w in [TABLE_MAGIC, layout::pack_dir(cfg.depth, array, 0), cfg.groups, 0, 0, 0, named.raw(), 0] {
            head.extend_from_slice(&w.to_le_bytes());
        }
        ctx.write(table, &head).await?;
        // The first creator wins.
        Ok(ctx.set_root(0, root, table).await? == table)
    }

    /// Whether table `name` exists on the blades.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn exists(ctx: &Ctx, name: &str) -> Result<bool> {
        Ok(ctx.root(0, &format!("race-ht:{name}")).await?.is_some())
    }

    /// Opens table `name`, caching its directory.
    ///
    /// # Errors
    /// A missing or malformed table; verb errors.
    pub async fn open(ctx: &Ctx, name: &str) -> Result<RaceHt> {
        let root = format!("race-ht:{name}");
        let table = ctx.root(0, &root).await?.ok_or_else(|| RaceError::Corrupt(format!("{name:?} does not exist")))?;
        let dir = Self::read_dir(ctx, table).await?;
        // Unique per client; reproducible under a simulation.
        let token = ctx.clock().nonce(ctx.thread() as u64).max(1);
        Ok(RaceHt {
            ctx: ctx.clone(),
            table,
            dir: Rc::new(RefCell::new(dir)),
            reclaim: Reclaimer::new(ctx),
            spec: ctx.config().smart.spec_lookup.then(|| Rc::new(RefCell::new(SpecCache::new()))),
            stats: Rc::default(),
            token,
            lease: RESIZE_LEASE,
            block: Vec::new(),
        })
    }

    /// Reads the table header, then the directory it names.
    pub(crate) async fn read_dir(ctx: &Ctx, table: GlobalAddr) -> Result<Directory> {
        let mut head = [0u8; TABLE_HEADER as usize];
        ctx.read(table, &mut head).await?;
        let dir_word = word(&head, layout::DIR_WORD as usize);
        let (depth, array, _) = layout::unpack_dir(dir_word);
        let (groups, epoch) = (word(&head, 16), word(&head, layout::SPLITS_WORD as usize));
        crate::drop::check_magic(word(&head, 0), table)?;
        if depth > layout::MAX_DEPTH || groups == 0 || groups > layout::MAX_GROUPS || array.is_null() {
            return Err(RaceError::Corrupt(format!(
                "at {table}: bad table header (depth {depth}, {groups} groups, directory at {array})"
            )));
        }
        // The header and the directory are remote memory any client can
        // write: every address they hold must lie whole in a blade's heap
        // before anything is read or written there.
        let place = |what: String, at: GlobalAddr, len: u64| {
            smart_core::layout::check_heap_place(ctx.blades(), at, len)
                .map_err(|why| RaceError::Corrupt(format!("at {table}: {what} holds {at}, which {why}")))
        };
        place("the header's directory pointer".into(), array, 8 << depth)?;
        let mut raw = vec![0u8; 8 << depth];
        ctx.read_all(array, &mut raw).await?;
        let mut entries = Vec::with_capacity(1 << depth);
        for (i, c) in raw.chunks(8).enumerate() {
            let (ld, at) = layout::unpack_entry(word(c, 0));
            if ld > depth || at.is_null() {
                return Err(RaceError::Corrupt(format!("at {table}: directory entry {i} is ({ld}, {at})")));
            }
            place(format!("directory entry {i}"), at, layout::subtable_bytes(groups))?;
            entries.push((ld, at));
        }
        Ok(Directory { depth, groups, array, dir_word, entries, epoch, version: 0, checked: 0, lapses: 0 })
    }

    /// Re-reads the directory; installs it unless a newer one is cached.
    pub(crate) async fn reload_dir(&mut self) -> Result<()> {
        let fresh = Self::read_dir(&self.ctx, self.table).await?;
        let mut d = self.dir.borrow_mut();
        if fresh.epoch >= d.epoch {
            let (version, checked, lapses) = (d.version + 1, d.checked, d.lapses);
            *d = Directory { version, checked, lapses, ..fresh };
        }
        drop(d);
        self.bump(|s| s.refreshes += 1);
        Ok(())
    }

    pub(crate) fn bump(&self, f: impl FnOnce(&mut ResizeStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// After meeting a frozen subtable (or a full one whose split lock is
    /// held): re-reads the directory right away the first time (a stale
    /// cache), then pauses before each re-read (a split in progress),
    /// unless another coroutine of this thread has re-read it since `p`
    /// was placed. A split lock of `p`'s subtable that holds the same word
    /// for the whole lease (its holder died; or free, while the subtable
    /// stayed frozen: its holder failed) is taken over and the split
    /// finished.
    pub(crate) async fn settle(&mut self, p: &Place, wait: &mut Wait) -> Result<()> {
        self.bump(|s| s.waits += 1);
        // A long wait keeps this thread's reclamation entry alive.
        self.reclaim.tick(&self.ctx).await?;
        let now = self.ctx.now_ns();
        let start = *wait.start.get_or_insert(now);
        if now - start > SPLIT_STALL.as_nanos() as u64 {
            return Err(RaceError::Corrupt(format!(
                "a subtable stayed frozen for {SPLIT_STALL:?}: the client splitting it stalled or died"
            )));
        }
        if wait.rounds > 0 {
            let pause = (PAUSE_NS << (wait.rounds - 1).min(10)).min(PAUSE_MAX_NS);
            self.ctx.sleep_ns(pause).await;
            let at = self.split_lock_of(p.base);
            let held = self.ctx.read_u64(at).await?;
            match &mut wait.lock {
                Some((a, w, watch)) if *a == at && *w == held => {
                    if watch.look(&self.ctx) >= self.lease && self.take_over(p.base, held).await? {
                        wait.lock = None;
                        wait.start = None;
                    }
                }
                _ => wait.lock = Some((at, held, Watch::start(&self.ctx))),
            }
        }
        wait.rounds += 1;
        if self.dir.borrow().version == p.version {
            self.reload_dir().await?;
        }
        Ok(())
    }

    /// Re-reads the directory and returns the table's shape: global depth,
    /// subtables, and splits so far (by every client).
    ///
    /// # Errors
    /// Verb errors; a malformed table.
    pub async fn current_shape(&mut self) -> Result<TableShape> {
        self.reload_dir().await?;
        let (depth, subtables) = self.shape();
        let d = self.dir.borrow();
        let mut per_blade = vec![0; self.ctx.blades().len()];
        for (_, _, at) in d.subtables() {
            per_blade[usize::from(at.blade())] += 1;
        }
        Ok(TableShape { depth, subtables, splits: d.epoch, per_blade })
    }

    /// What this thread saw and did of resizing so far.
    pub fn resize_stats(&self) -> ResizeStats {
        self.stats.get()
    }

    /// The cached global depth and number of subtables.
    pub fn shape(&self) -> (u32, usize) {
        let d = self.dir.borrow();
        (d.depth, d.subtables().count())
    }

    pub(crate) fn place(&self, key: &[u8]) -> Place {
        let (h1, h2) = layout::hashes(key);
        let d = self.dir.borrow();
        let (depth, base) = d.entries[layout::suffix(h1, d.depth) as usize];
        let mains = 2 * d.groups;
        let b1 = (h1 >> 20) % mains;
        let mut b2 = (h2 >> 20) % mains;
        if b2 == b1 {
            b2 = (b1 + 1) % mains;
        }
        Place {
            h1,
            depth,
            suffix: layout::suffix(h1, depth),
            base,
            buckets: [base.add(layout::combined_offset(b1)), base.add(layout::combined_offset(b2))],
            fp: (h1 >> 56) as u8,
            version: d.version,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Watch;
    use std::time::Duration;

    #[test]
    fn a_watch_restarts_after_a_gap_in_looking() {
        let t = smart_core::EmbeddedTransport::new(1, 1 << 20).unwrap();
        let rt = smart_core::Runtime::new(&t, 0, smart_core::RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        let mut w = Watch::start(&ctx);
        std::thread::sleep(Duration::from_millis(60));
        assert!(w.look(&ctx) >= Duration::from_millis(60), "looks closer than the gap accumulate");
        std::thread::sleep(super::WATCH_GAP + Duration::from_millis(50));
        assert!(w.look(&ctx) < Duration::from_millis(10), "a gap longer than WATCH_GAP restarts the clock");
    }

    /// The table header and directory are remote memory any client can
    /// write: a directory entry or directory pointer that leads into the
    /// superblock (or past the blade) makes opening the table fail, naming
    /// it, before anything is read or written there.
    #[test]
    fn a_directory_that_leads_out_of_the_heap_is_refused_by_name() {
        use crate::layout;
        use crate::{RaceConfig, RaceHt};
        use smart_core::GlobalAddr;

        let t = smart_core::EmbeddedTransport::new(1, 16 << 20).unwrap();
        let mut rt = smart_core::Runtime::new(&t, 0, smart_core::RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let ht = RaceHt::create(&ctx, "dir", RaceConfig::for_keys(1000)).await.unwrap();
            let table = ht.table;
            let dir_word = ctx.read_u64(table.add(layout::DIR_WORD)).await.unwrap();
            let (depth, array, _) = layout::unpack_dir(dir_word);
            let entry = ctx.read_u64(array).await.unwrap();
            let (ld, _) = layout::unpack_entry(entry);
            // Entry 0 into the superblock.
            ctx.write(array, &layout::pack_entry(ld, GlobalAddr::new(0, 16)).to_le_bytes()).await.unwrap();
            let err = RaceHt::open(&ctx, "dir").await.expect_err("refused");
            assert!(
                err.to_string().contains("directory entry 0 holds") && err.to_string().contains("below the heap"),
                "{err}"
            );
            ctx.write(array, &entry.to_le_bytes()).await.unwrap();
            assert!(RaceHt::open(&ctx, "dir").await.is_ok());
            // The directory pointer into the superblock.
            let far = layout::pack_dir(depth, GlobalAddr::new(0, 64), 0);
            ctx.write(table.add(layout::DIR_WORD), &far.to_le_bytes()).await.unwrap();
            let err = RaceHt::open(&ctx, "dir").await.expect_err("refused");
            assert!(err.to_string().contains("directory pointer"), "{err}");
        });
    }
}
