//! # race-ht: RACE hashing on one-sided verbs (Smart-HT)
//!
//! A lock-free extendible hash table in disaggregated memory after RACE
//! (ATC '21), with Smart's change: back off after a failed slot CAS
//! (ConflictAvoid, through [`smart_core::runtime::Op::retry`]). Layout and
//! round trips follow APPS.md §1 (see [`layout`]).
//!
//! * **Search**: READ both combined buckets (one doorbell), then READ the
//!   KV blocks whose fingerprint matches (one doorbell). 2 RTTs.
//! * **Insert**: WRITE the new KV block and READ both combined buckets (one
//!   doorbell); CAS an empty slot of the less-loaded choice; re-READ both
//!   buckets to find duplicates of the key. ≥ 3 RTTs.
//! * **Update**: WRITE the new block + READ buckets; READ matching blocks;
//!   CAS the slot old → new. 3 RTTs. **Delete**: READ; READ; CAS → empty.
//!
//! **Consistency.** Slots change only by 8-byte CAS, so a torn bucket read
//! still yields valid slot words. KV blocks are written out of place and
//! are immutable once published (their WRITE completes before the CAS that
//! publishes them), and every block carries a CRC: a reader that sees a
//! torn or in-flight block re-reads it, a bounded number of times, and then
//! fails with a clean error, never forever.
//!
//! **Duplicates.** Two concurrent inserts of one key can land in two slots.
//! After its CAS, an insert re-reads both buckets; every client keeps the
//! same survivor (the lowest slot address holding the key) and CASes the
//! others to empty. Visible effects, as in RACE: insert is not
//! last-writer-wins (the survivor may be the other insert's value), and an
//! update racing with the removal of a duplicate can be lost.
//!
//! **Online resizing** (extendible hashing). Each client caches the
//! directory (global depth GD, and per entry the subtable and its local
//! depth). When an insert finds both buckets of its key full, it takes the
//! table's resize lock (a CAS in the table header) and splits the subtable
//! `S` (local depth `L`, suffix `s`):
//! 1. *freeze* every slot of `S` by CAS (`w → w | 1`, empty `0 → 1`), so no
//!    other client's CAS can change `S` any more;
//! 2. read `S` and the blocks it names, rehash each key, and build two new
//!    subtables of depth `L + 1` (suffixes `s` and `s | 2^L`); an entry keeps
//!    its slot position, so nothing can overflow; duplicates of a key are
//!    dropped here too; a block whose new subtable is on another blade is
//!    copied there;
//! 3. WRITE both, then publish them in the directory: in place when
//!    `L < GD`, or by writing a doubled directory and swapping the dir word
//!    (depth and address in one 8-byte word) when `L = GD`; bump the split
//!    counter; release the lock.
//!
//! `S` is never changed again nor reused, so a client with a stale cache
//! that reaches it sees frozen slots and re-reads the directory. A client
//! that sees *any* frozen slot in the buckets it read treats the read as
//! void: it pauses, re-reads the directory and starts over. Why that is
//! enough: every slot of `S` is frozen before the new subtables become
//! reachable, so a bucket read whose slots were all unfrozen happened, slot
//! by slot, while `S` was still the only home of its keys; and a CAS that
//! succeeded on `S` succeeded before the freeze of its slot, so the split
//! carries its effect over. Bucket headers (local depth, suffix) never
//! change and are checked on every read against the key's hash and the
//! cached entry: a mismatch is reported as corruption.
//!
//! Limits of resizing: one split at a time per table (a global lock, not
//! RACE's per-subtable lock); readers and writers of a subtable being split
//! wait for the split (pausing 10 µs doubling to 1 ms, failing after
//! [`SPLIT_STALL`]); a client that dies holding the lock stops the table's
//! growth, and one that dies mid-split leaves that subtable frozen (there
//! is no lease or recovery); old subtables and directories are not reused
//! (dead memory stays below the live subtables' size); the depth stops at
//! [`layout::MAX_DEPTH`], after which a full bucket pair is
//! [`RaceError::Full`].
//!
//! **Reuse (ABA).** A replaced or deleted block is recycled by the thread
//! that retired it only after a grace period ([`RaceConfig::grace`],
//! default [`DEFAULT_GRACE`] = 100 ms), far longer than an operation, so a
//! stale CAS cannot succeed against a reused address with the same
//! fingerprint and length. Memory under a long update-heavy run is bounded
//! by about update rate × grace × block size per thread. The argument is
//! timing-based, not a proof: an operation stalled longer than the grace
//! (e.g. a thread descheduled for 100 ms mid-CAS) could still hit ABA.
//! Epoch-based reclamation would close that; it is not built.
//!
//! **Speculative search** (Smart's `spec-lookup`, on when the runtime's
//! `SmartConfig::spec_lookup` is): each thread caches where keys were last
//! found (slot address and slot word, direct-mapped, [`SPEC_ENTRIES`]); a
//! search then takes one doorbell, READ that slot word + READ its block, and
//! is accepted only if the slot still holds the cached word (a frozen slot
//! never does) and the block decodes to the key. Otherwise the normal
//! two-RTT path runs and refreshes the cache.

pub mod layout;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;
use std::time::{Duration, Instant};

use layout::{Slot, BUCKET, COMBINED, SLOTS, TABLE_HEADER, TABLE_MAGIC};
use smart_core::runtime::MAX_BATCH;
use smart_core::{Ctx, GlobalAddr};

/// Errors of the table.
#[derive(Debug, thiserror::Error)]
pub enum RaceError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// Both candidate buckets of the key are full and its subtable is at
    /// the largest depth.
    #[error("both buckets of the key are full and the table is at its largest depth ({})", layout::MAX_DEPTH)]
    Full,
    /// A KV block stayed torn or garbled over many re-reads.
    #[error("KV block at {0} failed its CRC on every re-read")]
    Torn(GlobalAddr),
    /// The remote structure is not what this table expects.
    #[error("table {0}")]
    Corrupt(String),
}

/// Result with [`RaceError`].
pub type Result<T, E = RaceError> = std::result::Result<T, E>;

/// Shape of a new table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaceConfig {
    /// Initial global depth: 2^depth subtables.
    pub depth: u32,
    /// Bucket groups per subtable (2 main buckets each), fixed for the
    /// table's life.
    pub groups: u64,
    /// How long a retired KV block waits before reuse.
    pub grace: Duration,
}

impl RaceConfig {
    /// A table sized for about `keys` keys at ~50% slot load (it grows
    /// beyond that by splitting subtables).
    pub fn for_keys(keys: u64) -> RaceConfig {
        // 3 buckets × 7 slots per group; aim for 2× headroom.
        let groups_total = (keys * 2).div_ceil(21).max(16);
        let depth = (groups_total / 4096).next_power_of_two().trailing_zeros().min(12);
        RaceConfig { depth, groups: groups_total.div_ceil(1 << depth).max(4), grace: DEFAULT_GRACE }
    }
}

/// The cached directory (shared by a thread's handles).
#[derive(Debug)]
struct Directory {
    /// Global depth.
    depth: u32,
    groups: u64,
    /// Where the directory array is.
    array: GlobalAddr,
    /// Per entry: local depth and subtable.
    entries: Vec<(u32, GlobalAddr)>,
    /// The split counter read before the array: an older read never
    /// replaces a newer one.
    epoch: u64,
    /// Bumped on every install, so a thread's coroutines re-read it once.
    version: u64,
}

/// Where a key may live.
#[derive(Clone, Copy, Debug)]
struct Place {
    /// The key's first hash (also the speculation cache's tag).
    h1: u64,
    /// Local depth and suffix of its subtable, per the cache.
    depth: u32,
    suffix: u64,
    base: GlobalAddr,
    buckets: [GlobalAddr; 2],
    fp: u8,
    /// The directory version it was computed from.
    version: u64,
}

impl Directory {
    /// Each subtable once: (suffix, local depth, address). A subtable of
    /// local depth L and suffix s first appears at entry s.
    fn subtables(&self) -> impl Iterator<Item = (u64, u32, GlobalAddr)> + '_ {
        self.entries.iter().enumerate().filter(|(i, (ld, _))| *i < 1 << ld).map(|(i, &(ld, at))| (i as u64, ld, at))
    }
}

/// What one thread saw and did of resizing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResizeStats {
    /// Subtables this thread split.
    pub splits: u64,
    /// Directory doublings this thread did.
    pub doublings: u64,
    /// Times this thread re-read the directory.
    pub refreshes: u64,
    /// Operations that met a frozen subtable (being split, or split already
    /// and seen through a stale cache) and started over.
    pub waits: u64,
    /// Nanoseconds this thread spent splitting.
    pub split_ns: u64,
}

/// The shape of a table, from its directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableShape {
    /// Global depth.
    pub depth: u32,
    /// Subtables.
    pub subtables: usize,
    /// Splits done by every client since creation.
    pub splits: u64,
    /// Subtables on each blade.
    pub per_blade: Vec<usize>,
}

/// Default grace period before a retired KV block is reused: orders of
/// magnitude longer than an operation (microseconds to a few milliseconds
/// with backoff), short enough that memory stays bounded at about
/// update rate × grace × block size per thread.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(100);

/// How long an operation waits for a frozen subtable to be replaced before
/// it fails (the splitting client has most likely died).
pub const SPLIT_STALL: Duration = Duration::from_secs(30);

/// First pause after meeting a frozen subtable (doubling to [`PAUSE_MAX_NS`]).
const PAUSE_NS: u64 = 10_000;
const PAUSE_MAX_NS: u64 = 1_000_000;

/// Most fingerprint-matching blocks read in one doorbell.
const READ_CHUNK: usize = 12;
/// Re-reads of a torn KV block before giving up.
const TORN_RETRIES: usize = 16;

/// An operation's waiting on frozen subtables.
#[derive(Debug, Default)]
struct Wait {
    start: Option<Instant>,
    rounds: u32,
}

/// Entries of the speculative-lookup cache (per thread, direct-mapped).
pub const SPEC_ENTRIES: usize = 8192;

/// Where keys were last found, for the speculative search path: per thread,
/// direct-mapped by hash, so bounded and allocation-free after creation.
#[derive(Debug)]
struct SpecCache {
    /// (key hash, slot address, slot word); hash 0 = empty entry.
    entries: Vec<(u64, GlobalAddr, Slot)>,
    hits: u64,
    misses: u64,
}

impl SpecCache {
    fn new() -> Self {
        SpecCache { entries: vec![(0, GlobalAddr::NULL, Slot::EMPTY); SPEC_ENTRIES], hits: 0, misses: 0 }
    }

    fn lookup(&self, h: u64) -> Option<(GlobalAddr, Slot)> {
        let e = self.entries[h as usize % SPEC_ENTRIES];
        (e.0 == h && h != 0).then_some((e.1, e.2))
    }

    fn put(&mut self, h: u64, at: GlobalAddr, s: Slot) {
        self.entries[h as usize % SPEC_ENTRIES] = (h, at, s);
    }

    fn forget(&mut self, h: u64) {
        let e = &mut self.entries[h as usize % SPEC_ENTRIES];
        if e.0 == h {
            e.0 = 0;
        }
    }
}

/// Blocks retired by this thread, reusable after the grace period: one
/// FIFO per (blade, block length), oldest first.
#[derive(Debug, Default)]
struct Recycler {
    queues: HashMap<(u16, usize), VecDeque<(Instant, GlobalAddr)>>,
}

/// A handle on a table for one coroutine (cheap to clone; clones share the
/// thread's directory cache, recycler and statistics).
#[derive(Debug)]
pub struct RaceHt {
    ctx: Ctx,
    /// The table header.
    table: GlobalAddr,
    dir: Rc<RefCell<Directory>>,
    recycler: Rc<RefCell<Recycler>>,
    /// `Some` when the runtime's `spec_lookup` technique is on.
    spec: Option<Rc<RefCell<SpecCache>>>,
    stats: Rc<Cell<ResizeStats>>,
    /// This client's resize-lock token (random, nonzero).
    token: u64,
    grace: Duration,
    block: Vec<u8>,
    found: Vec<u8>,
}

impl Clone for RaceHt {
    fn clone(&self) -> Self {
        RaceHt {
            ctx: self.ctx.clone(),
            table: self.table,
            dir: self.dir.clone(),
            recycler: self.recycler.clone(),
            spec: self.spec.clone(),
            stats: self.stats.clone(),
            token: self.token,
            grace: self.grace,
            block: Vec::new(),
            found: Vec::new(),
        }
    }
}

/// What [`RaceHt::put`] does with a present or absent key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Only if absent.
    Insert,
    /// Either way.
    Upsert,
    /// Only if present.
    Update,
}

/// Up to 28 (slot address, slot) pairs, without allocation.
#[derive(Clone, Copy)]
struct Matches {
    items: [(GlobalAddr, Slot); 4 * SLOTS],
    n: usize,
}

impl Default for Matches {
    fn default() -> Self {
        Matches { items: [(GlobalAddr::NULL, Slot::EMPTY); 4 * SLOTS], n: 0 }
    }
}

impl Matches {
    fn push(&mut self, at: GlobalAddr, s: Slot) {
        self.items[self.n] = (at, s);
        self.n += 1;
    }

    fn first(&self) -> Option<&(GlobalAddr, Slot)> {
        self.items[..self.n].first()
    }

    fn rest(&self) -> &[(GlobalAddr, Slot)] {
        &self.items[1.min(self.n)..self.n]
    }
}

/// The 28 slots of two combined buckets, with their addresses.
struct Snapshot {
    slots: [(GlobalAddr, Slot); 4 * SLOTS],
}

/// WRITEs each `(address, bytes)`, batched per blade (in order), up to a
/// slot's bytes per doorbell.
async fn write_many(ctx: &Ctx, items: &[(GlobalAddr, &[u8])]) -> Result<()> {
    let room = ctx.config().slot_bytes;
    let mut i = 0;
    while i < items.len() {
        let blade = items[i].0.blade();
        let mut b = ctx.batch();
        let mut bytes = 0;
        while i < items.len()
            && b.len() < MAX_BATCH
            && items[i].0.blade() == blade
            && (b.is_empty() || bytes + items[i].1.len() <= room)
        {
            b.write(items[i].0, items[i].1);
            bytes += items[i].1.len();
            i += 1;
        }
        b.post().await?;
    }
    Ok(())
}

/// WRITEs `data` at `at`, in pieces of half a slot, two per doorbell.
async fn write_all(ctx: &Ctx, at: GlobalAddr, data: &[u8]) -> Result<()> {
    let chunk = ctx.config().slot_bytes / 2;
    let pieces: Vec<(GlobalAddr, &[u8])> =
        data.chunks(chunk).enumerate().map(|(i, c)| (at.add((i * chunk) as u64), c)).collect();
    write_many(ctx, &pieces).await
}

/// READs `out.len()` bytes at `at` in pieces that fit a batch.
async fn read_all(ctx: &Ctx, at: GlobalAddr, out: &mut [u8]) -> Result<()> {
    let chunk = ctx.config().slot_bytes / 2;
    for (i, c) in out.chunks_mut(chunk).enumerate() {
        ctx.read(at.add((i * chunk) as u64), c).await?;
    }
    Ok(())
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A subtable image of `groups` groups whose buckets all carry the header
/// of local depth `depth` and suffix `suffix`, slots empty.
fn empty_subtable(groups: u64, depth: u32, suffix: u64) -> Vec<u8> {
    let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
    let header = layout::bucket_header(depth, suffix).to_le_bytes();
    for b in img.chunks_mut(BUCKET as usize) {
        b[..8].copy_from_slice(&header);
    }
    img
}

/// Every slot of a subtable image: (offset in the subtable, slot word).
fn slots_of(img: &[u8]) -> impl Iterator<Item = (usize, Slot)> + '_ {
    (0..img.len() / BUCKET as usize)
        .flat_map(|b| (0..SLOTS).map(move |i| b * BUCKET as usize + 8 + 8 * i))
        .map(|off| (off, Slot(word(img, off))))
}

/// Blade of the subtable with `suffix`: spreads subtables over the blades,
/// and a split's first half stays on its parent's blade.
fn blade_of(suffix: u64, blades: usize) -> u16 {
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
        let root = format!("race-ht:{name}");
        if ctx.root(0, &root).await?.is_none() {
            let n = 1u64 << cfg.depth;
            let table = ctx.alloc(0, TABLE_HEADER, 64).await?;
            let array = ctx.alloc(0, 8 * n, 64).await?;
            let sub_bytes = layout::subtable_bytes(cfg.groups);
            let mut entries = Vec::with_capacity(8 * n as usize);
            for s in 0..n {
                let at = ctx.alloc(blade_of(s, ctx.blades().len()), sub_bytes, 64).await?;
                // Every byte is written: the heap may hold old data on a
                // persistent blade.
                write_all(ctx, at, &empty_subtable(cfg.groups, cfg.depth, s)).await?;
                entries.extend_from_slice(&layout::pack_entry(cfg.depth, at).to_le_bytes());
            }
            write_all(ctx, array, &entries).await?;
            let mut head = Vec::with_capacity(TABLE_HEADER as usize);
            for w in [TABLE_MAGIC, layout::pack_entry(cfg.depth, array), cfg.groups, 0, 0, 0, 0, 0] {
                head.extend_from_slice(&w.to_le_bytes());
            }
            ctx.write(table, &head).await?;
            // The first creator wins; a loser's copy is left unused.
            ctx.set_root(0, &root, table).await?;
        }
        let mut t = Self::open(ctx, name).await?;
        t.grace = cfg.grace;
        Ok(t)
    }

    /// Opens table `name`, caching its directory.
    ///
    /// # Errors
    /// A missing or malformed table; verb errors.
    pub async fn open(ctx: &Ctx, name: &str) -> Result<RaceHt> {
        let root = format!("race-ht:{name}");
        let table = ctx.root(0, &root).await?.ok_or_else(|| RaceError::Corrupt(format!("{name:?} does not exist")))?;
        let dir = Self::read_dir(ctx, table).await?;
        let mut token = 0;
        while token == 0 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(ctx.thread());
            token = h.finish();
        }
        Ok(RaceHt {
            ctx: ctx.clone(),
            table,
            dir: Rc::new(RefCell::new(dir)),
            recycler: Rc::default(),
            spec: ctx.config().smart.spec_lookup.then(|| Rc::new(RefCell::new(SpecCache::new()))),
            stats: Rc::default(),
            token,
            grace: DEFAULT_GRACE,
            block: Vec::new(),
            found: Vec::new(),
        })
    }

    /// Reads the table header, then the directory it names.
    async fn read_dir(ctx: &Ctx, table: GlobalAddr) -> Result<Directory> {
        let mut head = [0u8; TABLE_HEADER as usize];
        ctx.read(table, &mut head).await?;
        let (depth, array) = layout::unpack_entry(word(&head, layout::DIR_WORD as usize));
        let (groups, epoch) = (word(&head, 16), word(&head, layout::SPLITS_WORD as usize));
        if word(&head, 0) != TABLE_MAGIC || depth > layout::MAX_DEPTH || groups == 0 || array.is_null() {
            return Err(RaceError::Corrupt(format!("at {table}: bad table header")));
        }
        let mut raw = vec![0u8; 8 << depth];
        read_all(ctx, array, &mut raw).await?;
        let mut entries = Vec::with_capacity(1 << depth);
        for (i, c) in raw.chunks(8).enumerate() {
            let (ld, at) = layout::unpack_entry(word(c, 0));
            if ld > depth || at.is_null() {
                return Err(RaceError::Corrupt(format!("at {table}: directory entry {i} is ({ld}, {at})")));
            }
            entries.push((ld, at));
        }
        Ok(Directory { depth, groups, array, entries, epoch, version: 0 })
    }

    /// Re-reads the directory; installs it unless a newer one is cached.
    async fn reload_dir(&mut self) -> Result<()> {
        let fresh = Self::read_dir(&self.ctx, self.table).await?;
        let mut d = self.dir.borrow_mut();
        if fresh.epoch >= d.epoch {
            let version = d.version + 1;
            *d = Directory { version, ..fresh };
        }
        drop(d);
        self.bump(|s| s.refreshes += 1);
        Ok(())
    }

    fn bump(&self, f: impl FnOnce(&mut ResizeStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// After meeting a frozen subtable: re-reads the directory right away
    /// the first time (a stale cache), then pauses before each re-read
    /// (a split in progress), unless another coroutine of this thread has
    /// re-read it since `seen`.
    async fn settle(&mut self, seen: u64, wait: &mut Wait) -> Result<()> {
        self.bump(|s| s.waits += 1);
        let start = *wait.start.get_or_insert_with(Instant::now);
        if start.elapsed() > SPLIT_STALL {
            return Err(RaceError::Corrupt(format!(
                "a subtable stayed frozen for {SPLIT_STALL:?}: the client splitting it stalled or died"
            )));
        }
        if wait.rounds > 0 {
            let pause = (PAUSE_NS << (wait.rounds - 1).min(10)).min(PAUSE_MAX_NS);
            self.ctx.sleep_ns(pause).await;
        }
        wait.rounds += 1;
        if self.dir.borrow().version == seen {
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

    fn place(&self, key: &[u8]) -> Place {
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

    /// One doorbell: optionally WRITE a block, then READ both combined
    /// buckets. Checks the bucket headers. `None` if a slot is frozen: the
    /// subtable is being split or was split, and the read is void.
    async fn read_buckets(&self, p: &Place, write: Option<(GlobalAddr, &[u8])>) -> Result<Option<Snapshot>> {
        let mut b = self.ctx.batch();
        if let Some((at, data)) = write {
            b.write(at, data);
        }
        let r0 = b.read(p.buckets[0], COMBINED);
        let r1 = b.read(p.buckets[1], COMBINED);
        let done = b.post().await?;
        let mut slots = [(GlobalAddr::NULL, Slot::EMPTY); 4 * SLOTS];
        let want = layout::bucket_header(p.depth, p.suffix);
        let mut frozen = false;
        for (k, (r, base)) in [(r0, p.buckets[0]), (r1, p.buckets[1])].into_iter().enumerate() {
            let bytes = done.bytes(r);
            for bucket in 0..2 {
                let header = word(bytes, bucket * 64);
                if header != want {
                    return Err(RaceError::Corrupt(format!(
                        "bucket header {header:#x} at {}, expected {want:#x}",
                        base.add(64 * bucket as u64)
                    )));
                }
                for s in 0..SLOTS {
                    let off = bucket * 64 + 8 + s * 8;
                    let v = Slot(word(bytes, off));
                    frozen |= v.is_frozen();
                    slots[(k * 2 + bucket) * SLOTS + s] = (base.add(off as u64), v);
                }
            }
        }
        Ok((!frozen).then_some(Snapshot { slots }))
    }

    /// Reads the blocks of fingerprint-matching slots; returns the matches of
    /// `key` sorted by slot address (the first is the survivor), and leaves
    /// the survivor's value in `self.found`. Fixed-size arrays: no
    /// allocation per operation.
    async fn matches(&mut self, key: &[u8], fp: u8, snap: &Snapshot) -> Result<Matches> {
        let mut cands = Matches::default();
        for &(at, s) in &snap.slots {
            if !s.is_empty() && s.fp() == fp && !cands.items[..cands.n].iter().any(|(a, _)| *a == at) {
                cands.push(at, s);
            }
        }
        cands.items[..cands.n].sort_unstable_by_key(|(a, _)| *a);
        let mut out = Matches::default();
        // The value kept is the lowest-address match's (the survivor's),
        // whatever order the blocks decode in.
        let mut found_at: Option<GlobalAddr> = None;
        let mut start = 0;
        while start < cands.n {
            let end = (start + READ_CHUNK).min(cands.n);
            let mut pending = Matches::default();
            for &(a, s) in &cands.items[start..end] {
                pending.push(a, s);
            }
            start = end;
            for _ in 0..TORN_RETRIES {
                if pending.n == 0 {
                    break;
                }
                let mut torn = Matches::default();
                // Blocks live on their bucket's blade (allocated and
                // recycled there), so one batch reads them all.
                let blade = pending.items[0].1.addr().blade();
                let mut b = self.ctx.batch();
                let mut refs = [None; READ_CHUNK];
                for (r, &(at, s)) in refs.iter_mut().zip(&pending.items[..pending.n]) {
                    if s.addr().blade() != blade || at.blade() != blade {
                        return Err(RaceError::Corrupt(format!(
                            "slot at {at} names a block on another blade: {}",
                            s.addr()
                        )));
                    }
                    *r = Some(b.read(s.addr(), s.block_len()));
                }
                let done = b.post().await?;
                for (r, &(at, s)) in refs.iter().zip(&pending.items[..pending.n]) {
                    match layout::decode_block(done.bytes(r.expect("every pending block was read"))) {
                        Some((k, v)) if k == key => {
                            if found_at.is_none_or(|f| at < f) {
                                self.found.clear();
                                self.found.extend_from_slice(v);
                                found_at = Some(at);
                            }
                            out.push(at, s);
                        }
                        Some(_) => {}
                        None => torn.push(at, s),
                    }
                }
                pending = torn;
            }
            if pending.n > 0 {
                return Err(RaceError::Torn(pending.items[0].1.addr()));
            }
        }
        out.items[..out.n].sort_unstable_by_key(|(a, _)| *a);
        Ok(out)
    }

    /// Looks `key` up; its value goes to `out`. Returns whether it exists.
    ///
    /// # Errors
    /// Verb errors; [`RaceError::Torn`] if a block never reads whole.
    pub async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let mut p = self.place(key);
        if self.speculate(p.h1, key, out).await? {
            return Ok(true);
        }
        let mut wait = Wait::default();
        let snap = loop {
            match self.read_buckets(&p, None).await? {
                Some(s) => break s,
                None => {
                    self.settle(p.version, &mut wait).await?;
                    p = self.place(key);
                }
            }
        };
        let m = self.matches(key, p.fp, &snap).await?;
        let Some(&(at, s)) = m.first() else {
            self.remember(p.h1, None);
            return Ok(false);
        };
        self.remember(p.h1, Some((at, s)));
        out.clear();
        out.extend_from_slice(&self.found);
        Ok(true)
    }

    /// The speculative search path (Smart's `spec-lookup`): if this thread
    /// knows where `key` was last found, one doorbell READs that slot word
    /// and the block it named. The value is accepted only if the slot still
    /// holds that word (so the block is the key's current one; blocks are
    /// immutable and reused only after the grace period) and the block
    /// decodes to `key`. Otherwise the normal path runs.
    async fn speculate(&mut self, h: u64, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let Some(spec) = &self.spec else { return Ok(false) };
        let Some((at, s)) = spec.borrow().lookup(h) else { return Ok(false) };
        let mut b = self.ctx.batch();
        let rs = b.read(at, 8);
        let rb = b.read(s.addr(), s.block_len());
        let done = b.post().await?;
        let word = u64::from_le_bytes(done.bytes(rs).try_into().expect("8 bytes"));
        let hit = match layout::decode_block(done.bytes(rb)) {
            Some((k, v)) if word == s.0 && k == key => {
                out.clear();
                out.extend_from_slice(v);
                true
            }
            _ => false,
        };
        let mut c = spec.borrow_mut();
        if hit {
            c.hits += 1;
        } else {
            c.misses += 1;
            c.forget(h);
        }
        Ok(hit)
    }

    /// Records where the key with hash `h` is now (or that it is gone).
    fn remember(&self, h: u64, at: Option<(GlobalAddr, Slot)>) {
        if let Some(spec) = &self.spec {
            match at {
                Some((a, s)) => spec.borrow_mut().put(h, a, s),
                None => spec.borrow_mut().forget(h),
            }
        }
    }

    /// Speculative lookups that hit and missed on this thread so far.
    pub fn spec_stats(&self) -> (u64, u64) {
        self.spec.as_ref().map_or((0, 0), |c| {
            let c = c.borrow();
            (c.hits, c.misses)
        })
    }

    /// A fresh (or recycled) block for `key`/`value` on `blade`, encoded in
    /// `self.block`; returns its slot word.
    async fn new_block(&mut self, key: &[u8], value: &[u8], fp: u8, blade: u16) -> Result<(GlobalAddr, Slot)> {
        layout::encode_block(key, value, &mut self.block);
        let len = self.block.len();
        let reuse = {
            let mut r = self.recycler.borrow_mut();
            match r.queues.get_mut(&(blade, len)) {
                Some(q) if q.front().is_some_and(|(t, _)| t.elapsed() >= self.grace) => q.pop_front().map(|(_, a)| a),
                _ => None,
            }
        };
        let at = match reuse {
            Some(a) => a,
            None => self.ctx.alloc(blade, len as u64, 64).await?,
        };
        Ok((at, Slot::new(fp, (len / 64) as u64, at)))
    }

    fn retire(&self, s: Slot) {
        let key = (s.addr().blade(), s.block_len());
        self.recycler.borrow_mut().queues.entry(key).or_default().push_back((Instant::now(), s.addr()));
    }

    /// Inserts `key` if absent. Returns `false` (and changes nothing) if it
    /// exists. With a racing insert of the same key, one value survives.
    /// Splits the key's subtable when its buckets are full.
    ///
    /// # Errors
    /// [`RaceError::Full`] at the largest depth; verb errors.
    pub async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.put(key, value, Mode::Insert).await
    }

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// As [`RaceHt::insert`].
    pub async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(key, value, Mode::Upsert).await.map(drop)
    }

    /// Insert, upsert and update share one loop: WRITE the new block with
    /// the bucket READs, then CAS it in over the key's slot (if the mode
    /// overwrites) or into an empty slot (if the mode inserts). Returns
    /// whether the table changed.
    async fn put(&mut self, key: &[u8], value: &[u8], mode: Mode) -> Result<bool> {
        let mut p = self.place(key);
        let (mut at, mut new) = self.new_block(key, value, p.fp, p.base.blade()).await?;
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        let mut block = std::mem::take(&mut self.block);
        let mut written = false;
        let mut wait = Wait::default();
        let result = loop {
            if at.blade() != p.base.blade() {
                // A split moved the key's subtable to another blade: the
                // block (not published yet) goes there too.
                self.retire(new);
                self.block = block;
                (at, new) = self.new_block(key, value, p.fp, p.base.blade()).await?;
                block = std::mem::take(&mut self.block);
                written = false;
            }
            let snap = self.read_buckets(&p, (!written).then_some((at, &block[..]))).await?;
            written = true;
            let Some(snap) = snap else {
                self.settle(p.version, &mut wait).await?;
                p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap).await?;
            if let Some(&(slot_at, old)) = m.first() {
                if mode == Mode::Insert {
                    self.retire(new);
                    break false;
                }
                if ctx.cas(slot_at, old.0, new.0).await? == old.0 {
                    self.retire(old);
                    self.remember(p.h1, Some((slot_at, new)));
                    break true;
                }
                op.retry().await;
                continue;
            }
            if mode == Mode::Update {
                self.retire(new);
                break false;
            }
            // Less-loaded choice first; an empty slot in it.
            let empty =
                |k: usize| snap.slots[k * 2 * SLOTS..(k + 1) * 2 * SLOTS].iter().filter(|(_, s)| s.is_empty()).count();
            let order = if empty(1) > empty(0) { [1, 0] } else { [0, 1] };
            let Some(&(slot_at, _)) = order
                .iter()
                .flat_map(|&k| snap.slots[k * 2 * SLOTS..(k + 1) * 2 * SLOTS].iter())
                .find(|(_, s)| s.is_empty())
            else {
                // Both buckets full: split the subtable, or wait for the
                // client that holds the resize lock.
                if !self.grow(&p).await? {
                    self.settle(p.version, &mut wait).await?;
                }
                p = self.place(key);
                continue;
            };
            if ctx.cas(slot_at, 0, new.0).await? != 0 {
                op.retry().await;
                continue;
            }
            self.remove_duplicates(key, &mut p).await?;
            break true;
        };
        self.block = block;
        Ok(result)
    }

    /// After an insert's CAS: re-read the key's buckets and empty every
    /// slot holding the key but the lowest (the survivor all clients keep).
    /// If the subtable is being split, the split drops duplicates itself,
    /// and the check runs again in the new subtable.
    async fn remove_duplicates(&mut self, key: &[u8], p: &mut Place) -> Result<()> {
        let mut wait = Wait::default();
        loop {
            let Some(snap) = self.read_buckets(p, None).await? else {
                self.settle(p.version, &mut wait).await?;
                *p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap).await?;
            for &(dup_at, dup) in m.rest() {
                if self.ctx.cas(dup_at, dup.0, 0).await? == dup.0 {
                    self.retire(dup);
                }
            }
            return Ok(());
        }
    }

    /// Overwrites `key` if it exists; returns whether it did.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.put(key, value, Mode::Update).await
    }

    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn delete(&mut self, key: &[u8]) -> Result<bool> {
        let mut p = self.place(key);
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        let mut wait = Wait::default();
        loop {
            let Some(snap) = self.read_buckets(&p, None).await? else {
                self.settle(p.version, &mut wait).await?;
                p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap).await?;
            let Some(&(slot_at, old)) = m.first() else {
                return Ok(false);
            };
            if ctx.cas(slot_at, old.0, 0).await? == old.0 {
                self.retire(old);
                self.remember(p.h1, None);
                return Ok(true);
            }
            op.retry().await;
        }
    }

    /// Every key in the table, read slot by slot from the current
    /// directory's subtables (a key in two slots appears twice), for
    /// checking a quiescent table: it fails on a frozen slot, a bucket
    /// header that disagrees with the directory, a key in the wrong
    /// subtable, or a block that does not decode.
    ///
    /// # Errors
    /// Those; verb errors.
    pub async fn scan(&mut self) -> Result<Vec<Vec<u8>>> {
        self.reload_dir().await?;
        let (groups, subtables) = {
            let d = self.dir.borrow();
            (d.groups, d.subtables().collect::<Vec<_>>())
        };
        let mut keys = Vec::new();
        for (suffix, ld, at) in subtables {
            let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
            read_all(&self.ctx, at, &mut img).await?;
            if let Some(b) = img.chunks(BUCKET as usize).position(|b| word(b, 0) != layout::bucket_header(ld, suffix)) {
                return Err(RaceError::Corrupt(format!("bucket {b} of subtable {at}: bad header")));
            }
            if slots_of(&img).any(|(_, sl)| sl.is_frozen()) {
                return Err(RaceError::Corrupt(format!("a frozen slot in live subtable {at}")));
            }
            let occupied: Vec<(usize, Slot)> = slots_of(&img).filter(|(_, sl)| !sl.is_empty()).collect();
            for blk in self.read_blocks(at.blade(), &occupied).await? {
                let (k, _) = layout::decode_block(&blk).expect("read_blocks returns whole blocks");
                if layout::suffix(layout::hashes(k).0, ld) != suffix {
                    return Err(RaceError::Corrupt(format!("a key in subtable {at} of the wrong suffix")));
                }
                keys.push(k.to_vec());
            }
        }
        Ok(keys)
    }

    /// Splits the subtable of `p` (whose two buckets are full) under the
    /// table's resize lock. Returns `false`, having done nothing, if
    /// another client holds the lock.
    async fn grow(&mut self, p: &Place) -> Result<bool> {
        let lock = self.table.add(layout::LOCK_WORD);
        if self.ctx.cas(lock, 0, self.token).await? != 0 {
            return Ok(false);
        }
        let t0 = Instant::now();
        let split = self.split_locked(p).await;
        // Released even after an error: an error before the freeze leaves
        // the table whole (after it, see the crate docs).
        let released = self.ctx.cas(lock, self.token, 0).await;
        self.bump(|s| s.split_ns += t0.elapsed().as_nanos() as u64);
        split?;
        if released? != self.token {
            return Err(RaceError::Corrupt("the resize lock changed hands while this client held it".into()));
        }
        Ok(true)
    }

    /// The split itself (see the crate docs), with the resize lock held.
    async fn split_locked(&mut self, p: &Place) -> Result<()> {
        // Under the lock nobody else changes the directory: this copy is
        // current, and the split may already have been done.
        self.reload_dir().await?;
        let (gd, groups, array, ld, base) = {
            let d = self.dir.borrow();
            let (ld, base) = d.entries[layout::suffix(p.h1, d.depth) as usize];
            (d.depth, d.groups, d.array, ld, base)
        };
        if base != p.base {
            return Ok(());
        }
        if ld >= layout::MAX_DEPTH {
            return Err(RaceError::Full);
        }
        let ctx = self.ctx.clone();
        let s = layout::suffix(p.h1, ld);
        let img = self.freeze(base, groups).await?;

        // Every occupied slot, in address order, and its block.
        let occupied: Vec<(usize, Slot)> =
            slots_of(&img).map(|(off, sl)| (off, sl.thawed())).filter(|(_, sl)| !sl.is_empty()).collect();
        let blocks = self.read_blocks(base.blade(), &occupied).await?;

        // The two halves keep each entry's slot position.
        let suffixes = [s, s | 1 << ld];
        let mut halves = suffixes.map(|x| empty_subtable(groups, ld + 1, x));
        let mut addrs = [GlobalAddr::NULL; 2];
        for (a, x) in addrs.iter_mut().zip(suffixes) {
            *a = ctx.alloc(blade_of(x, ctx.blades().len()), layout::subtable_bytes(groups), 64).await?;
        }
        let mut kept: HashSet<&[u8]> = HashSet::new();
        let mut copies = Vec::new();
        for (&(off, sl), blk) in occupied.iter().zip(&blocks) {
            let (k, _) = layout::decode_block(blk).expect("read_blocks returns whole blocks");
            let h1 = layout::hashes(k).0;
            if layout::suffix(h1, ld) != s {
                return Err(RaceError::Corrupt(format!(
                    "a key of suffix {:#x} in subtable {base} of suffix {s:#x}",
                    layout::suffix(h1, ld)
                )));
            }
            if !kept.insert(k) {
                // A duplicate left by racing inserts: the lowest slot (seen
                // first) survives.
                self.retire(sl);
                continue;
            }
            let half = ((h1 >> ld) & 1) as usize;
            let mut w = sl;
            if sl.addr().blade() != addrs[half].blade() {
                // Blocks live on their subtable's blade (one batch reads a
                // bucket's blocks): copy it over.
                let at = ctx.alloc(addrs[half].blade(), blk.len() as u64, 64).await?;
                copies.push((at, &blk[..]));
                w = Slot::new(sl.fp(), (blk.len() / 64) as u64, at);
                self.retire(sl);
            }
            halves[half][off..off + 8].copy_from_slice(&w.0.to_le_bytes());
        }
        write_many(&ctx, &copies).await?;
        for (a, h) in addrs.iter().zip(&halves) {
            write_all(&ctx, *a, h).await?;
        }

        // Publish.
        let entry = |i: u64| layout::pack_entry(ld + 1, addrs[((i >> ld) & 1) as usize]).to_le_bytes();
        if ld == gd {
            let n = 1u64 << gd;
            let mut raw = Vec::with_capacity(16 * n as usize);
            {
                let d = self.dir.borrow();
                for i in 0..2 * n {
                    if layout::suffix(i, ld) == s {
                        raw.extend_from_slice(&entry(i));
                    } else {
                        let (l, a) = d.entries[(i % n) as usize];
                        raw.extend_from_slice(&layout::pack_entry(l, a).to_le_bytes());
                    }
                }
            }
            let doubled = ctx.alloc(0, 16 * n, 64).await?;
            write_all(&ctx, doubled, &raw).await?;
            ctx.write(self.table.add(layout::DIR_WORD), &layout::pack_entry(gd + 1, doubled).to_le_bytes()).await?;
            self.bump(|st| st.doublings += 1);
        } else {
            let updates: Vec<(GlobalAddr, [u8; 8])> =
                (s..1 << gd).step_by(1 << ld).map(|i| (array.add(8 * i), entry(i))).collect();
            let updates: Vec<(GlobalAddr, &[u8])> = updates.iter().map(|(a, e)| (*a, &e[..])).collect();
            write_many(&ctx, &updates).await?;
        }
        ctx.faa(self.table.add(layout::SPLITS_WORD), 1).await?;
        self.bump(|st| st.splits += 1);
        self.reload_dir().await
    }

    /// Freezes every slot of the subtable at `base` (CAS `w → w | 1`,
    /// retried with the value a failed CAS returns); returns the subtable's
    /// image, all slots frozen.
    async fn freeze(&self, base: GlobalAddr, groups: u64) -> Result<Vec<u8>> {
        let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
        read_all(&self.ctx, base, &mut img).await?;
        let mut pending: Vec<(usize, u64)> =
            slots_of(&img).filter(|(_, sl)| !sl.is_frozen()).map(|(off, sl)| (off, sl.0)).collect();
        while !pending.is_empty() {
            let mut again = Vec::new();
            for chunk in pending.chunks(MAX_BATCH) {
                let mut b = self.ctx.batch();
                let refs: Vec<_> =
                    chunk.iter().map(|&(off, w)| b.cas(base.add(off as u64), w, w | Slot::FROZEN)).collect();
                let done = b.post().await?;
                for (r, &(off, w)) in refs.into_iter().zip(chunk) {
                    let old = done.old(r);
                    if old == w {
                        img[off..off + 8].copy_from_slice(&(w | Slot::FROZEN).to_le_bytes());
                    } else if Slot(old).is_frozen() {
                        img[off..off + 8].copy_from_slice(&old.to_le_bytes());
                    } else {
                        again.push((off, old));
                    }
                }
            }
            pending = again;
        }
        Ok(img)
    }

    /// READs the blocks the `slots` name (all on `blade`), in batches; each
    /// must decode (a published block is immutable), re-read a bounded
    /// number of times.
    async fn read_blocks(&self, blade: u16, slots: &[(usize, Slot)]) -> Result<Vec<Vec<u8>>> {
        if let Some((_, s)) = slots.iter().find(|(_, s)| s.addr().blade() != blade) {
            return Err(RaceError::Corrupt(format!("a slot on blade {blade} names a block at {}", s.addr())));
        }
        let room = self.ctx.config().slot_bytes;
        let mut out = vec![Vec::new(); slots.len()];
        let mut pending: Vec<usize> = (0..slots.len()).collect();
        for _ in 0..TORN_RETRIES {
            let mut torn = Vec::new();
            let mut i = 0;
            while i < pending.len() {
                let mut b = self.ctx.batch();
                let (mut refs, mut bytes) = (Vec::new(), 0);
                while i < pending.len() && refs.len() < MAX_BATCH && bytes + slots[pending[i]].1.block_len() <= room {
                    let s = slots[pending[i]].1;
                    refs.push((pending[i], b.read(s.addr(), s.block_len())));
                    bytes += s.block_len();
                    i += 1;
                }
                let done = b.post().await?;
                for (j, r) in refs {
                    let data = done.bytes(r);
                    if layout::decode_block(data).is_some() {
                        out[j] = data.to_vec();
                    } else {
                        torn.push(j);
                    }
                }
            }
            pending = torn;
            if pending.is_empty() {
                return Ok(out);
            }
        }
        Err(RaceError::Torn(slots[pending[0]].1.addr()))
    }
}
