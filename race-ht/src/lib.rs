//! # race-ht: RACE hashing on one-sided verbs (Smart-HT)
//!
//! A lock-free hash table in disaggregated memory after RACE (ATC '21),
//! with Smart's change: back off after a failed slot CAS (ConflictAvoid,
//! through [`smart_core::runtime::Op::retry`]). Layout and round trips
//! follow APPS.md §1 (see [`layout`]).
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
//! is accepted only if the slot still holds the cached word and the block
//! decodes to the key. Otherwise the normal two-RTT path runs and refreshes
//! the cache.
//!
//! **Not built yet:** online resizing (the directory has a fixed global
//! depth, chosen at creation; a full pair of buckets returns
//! [`RaceError::Full`]), and subtables spread over blades by anything but
//! round-robin.

pub mod layout;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use layout::{Slot, BUCKET, COMBINED, DIR_HEADER, DIR_MAGIC, SLOTS};
use smart_core::{Ctx, GlobalAddr};

/// Errors of the table.
#[derive(Debug, thiserror::Error)]
pub enum RaceError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] smart_core::Error),
    /// Both candidate buckets of the key are full (no resizing yet).
    #[error("both buckets of the key are full: create the table with a larger --race-depth")]
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
    /// Global depth: 2^depth subtables.
    pub depth: u32,
    /// Bucket groups per subtable (2 main buckets each).
    pub groups: u64,
    /// How long a retired KV block waits before reuse.
    pub grace: Duration,
}

impl RaceConfig {
    /// A table for about `keys` keys at ~50% slot load.
    pub fn for_keys(keys: u64) -> RaceConfig {
        // 3 buckets × 7 slots per group; aim for 2× headroom.
        let groups_total = (keys * 2).div_ceil(21).max(16);
        let depth = (groups_total / 4096).next_power_of_two().trailing_zeros().min(12);
        RaceConfig { depth, groups: groups_total.div_ceil(1 << depth).max(4), grace: DEFAULT_GRACE }
    }
}

/// The cached directory.
#[derive(Debug)]
struct Directory {
    depth: u32,
    groups: u64,
    subtables: Vec<GlobalAddr>,
}

/// Where a key may live.
#[derive(Clone, Copy, Debug)]
struct Place {
    /// The key's first hash (also the speculation cache's tag).
    h1: u64,
    sub: usize,
    buckets: [GlobalAddr; 2],
    fp: u8,
}

/// Default grace period before a retired KV block is reused: orders of
/// magnitude longer than an operation (microseconds to a few milliseconds
/// with backoff), short enough that memory stays bounded at about
/// update rate × grace × block size per thread.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(100);

/// Most fingerprint-matching blocks read in one doorbell.
const READ_CHUNK: usize = 12;
/// Re-reads of a torn KV block before giving up.
const TORN_RETRIES: usize = 16;

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
/// thread's directory cache and recycler).
#[derive(Debug)]
pub struct RaceHt {
    ctx: Ctx,
    dir: Rc<Directory>,
    recycler: Rc<RefCell<Recycler>>,
    /// `Some` when the runtime's `spec_lookup` technique is on.
    spec: Option<Rc<RefCell<SpecCache>>>,
    grace: Duration,
    block: Vec<u8>,
    found: Vec<u8>,
}

impl Clone for RaceHt {
    fn clone(&self) -> Self {
        RaceHt {
            ctx: self.ctx.clone(),
            dir: self.dir.clone(),
            recycler: self.recycler.clone(),
            spec: self.spec.clone(),
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

impl RaceHt {
    /// Creates table `name` (unless it exists) with subtables spread
    /// round-robin over the blades; returns a handle.
    ///
    /// # Errors
    /// Verb and allocation errors; an existing object of another kind.
    pub async fn create(ctx: &Ctx, name: &str, cfg: RaceConfig) -> Result<RaceHt> {
        let root = format!("race-ht:{name}");
        if ctx.root(0, &root).await?.is_none() {
            let n = 1usize << cfg.depth;
            let dir = ctx.alloc(0, DIR_HEADER + 8 * n as u64, 64).await?;
            let sub_bytes = layout::subtable_bytes(cfg.groups);
            let chunk = ctx.config().slot_bytes / 2;
            let mut zeros = vec![0u8; chunk];
            let mut entries = Vec::with_capacity(n * 8);
            for s in 0..n {
                let blade = (s % ctx.blades().len()) as u16;
                let at = ctx.alloc(blade, sub_bytes, 64).await?;
                // Zero the subtable (the heap may hold old data on a
                // persistent blade), then write every bucket's header.
                let mut off = 0;
                while off < sub_bytes {
                    let len = (sub_bytes - off).min(chunk as u64) as usize;
                    ctx.write(at.add(off), &zeros[..len]).await?;
                    off += len as u64;
                }
                let header = (u64::from(cfg.depth) | (s as u64) << 32).to_le_bytes();
                for b in 0..cfg.groups * layout::GROUP_BUCKETS {
                    zeros[..8].copy_from_slice(&header);
                    ctx.write(at.add(b * BUCKET), &zeros[..8]).await?;
                }
                zeros[..8].fill(0);
                entries.extend_from_slice(&at.raw().to_le_bytes());
            }
            let mut head = Vec::with_capacity(32);
            for w in [DIR_MAGIC, u64::from(cfg.depth), cfg.groups, 0] {
                head.extend_from_slice(&w.to_le_bytes());
            }
            ctx.write(dir.add(DIR_HEADER), &entries).await?;
            ctx.write(dir, &head).await?;
            // The first creator wins; a loser's copy is left unused.
            ctx.set_root(0, &root, dir).await?;
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
        let dir = ctx.root(0, &root).await?.ok_or_else(|| RaceError::Corrupt(format!("{name:?} does not exist")))?;
        let mut head = [0u8; DIR_HEADER as usize];
        ctx.read(dir, &mut head).await?;
        let w = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if w(0) != DIR_MAGIC || w(1) > 20 || w(2) == 0 {
            return Err(RaceError::Corrupt(format!("{name:?}: bad directory header")));
        }
        let (depth, groups) = (w(1) as u32, w(2));
        let n = 1usize << depth;
        let mut entries = vec![0u8; n * 8];
        let chunk = ctx.config().slot_bytes / 2;
        for (i, c) in entries.chunks_mut(chunk).enumerate() {
            ctx.read(dir.add(DIR_HEADER + (i * chunk) as u64), c).await?;
        }
        let subtables = entries
            .chunks(8)
            .map(|c| GlobalAddr::from_raw(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .collect();
        Ok(RaceHt {
            ctx: ctx.clone(),
            dir: Rc::new(Directory { depth, groups, subtables }),
            recycler: Rc::default(),
            spec: ctx.config().smart.spec_lookup.then(|| Rc::new(RefCell::new(SpecCache::new()))),
            grace: DEFAULT_GRACE,
            block: Vec::new(),
            found: Vec::new(),
        })
    }

    fn place(&self, key: &[u8]) -> Place {
        let (h1, h2) = layout::hashes(key);
        let d = &self.dir;
        let sub = (h1 & ((1 << d.depth) - 1)) as usize;
        let mains = 2 * d.groups;
        let b1 = (h1 >> 20) % mains;
        let mut b2 = (h2 >> 20) % mains;
        if b2 == b1 {
            b2 = (b1 + 1) % mains;
        }
        let base = d.subtables[sub];
        Place {
            h1,
            sub,
            buckets: [base.add(layout::combined_offset(b1)), base.add(layout::combined_offset(b2))],
            fp: (h1 >> 56) as u8,
        }
    }

    /// One doorbell: optionally WRITE a block, then READ both combined
    /// buckets. Checks the bucket headers.
    async fn read_buckets(&self, p: &Place, write: Option<(GlobalAddr, &[u8])>) -> Result<Snapshot> {
        let mut b = self.ctx.batch();
        if let Some((at, data)) = write {
            b.write(at, data);
        }
        let r0 = b.read(p.buckets[0], COMBINED);
        let r1 = b.read(p.buckets[1], COMBINED);
        let done = b.post().await?;
        let mut slots = [(GlobalAddr::NULL, Slot::EMPTY); 4 * SLOTS];
        for (k, (r, base)) in [(r0, p.buckets[0]), (r1, p.buckets[1])].into_iter().enumerate() {
            let bytes = done.bytes(r);
            for bucket in 0..2 {
                let hb = &bytes[bucket * 64..bucket * 64 + 8];
                let header = u64::from_le_bytes(hb.try_into().expect("8 bytes"));
                if header as u32 != self.dir.depth || (header >> 32) as usize != p.sub {
                    return Err(RaceError::Corrupt(format!(
                        "bucket header {header:#x} at {}",
                        base.add(64 * bucket as u64)
                    )));
                }
                for s in 0..SLOTS {
                    let off = bucket * 64 + 8 + s * 8;
                    let v = u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes"));
                    slots[(k * 2 + bucket) * SLOTS + s] = (base.add(off as u64), Slot(v));
                }
            }
        }
        Ok(Snapshot { slots })
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
        let p = self.place(key);
        let h = p.h1;
        if self.speculate(h, key, out).await? {
            return Ok(true);
        }
        let snap = self.read_buckets(&p, None).await?;
        let m = self.matches(key, p.fp, &snap).await?;
        let Some(&(at, s)) = m.first() else {
            self.remember(h, None);
            return Ok(false);
        };
        self.remember(h, Some((at, s)));
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
    ///
    /// # Errors
    /// [`RaceError::Full`]; verb errors.
    pub async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.put(key, value, Mode::Insert).await
    }

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// [`RaceError::Full`]; verb errors.
    pub async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(key, value, Mode::Upsert).await.map(drop)
    }

    /// Insert, upsert and update share one loop: WRITE the new block with
    /// the bucket READs, then CAS it in over the key's slot (if the mode
    /// overwrites) or into an empty slot (if the mode inserts). Returns
    /// whether the table changed.
    async fn put(&mut self, key: &[u8], value: &[u8], mode: Mode) -> Result<bool> {
        let p = self.place(key);
        let (at, new) = self.new_block(key, value, p.fp, p.buckets[0].blade()).await?;
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        let block = std::mem::take(&mut self.block);
        let mut write = Some((at, &block[..]));
        let result = loop {
            let snap = self.read_buckets(&p, write.take()).await?;
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
                self.retire(new);
                self.block = block;
                return Err(RaceError::Full);
            };
            if ctx.cas(slot_at, 0, new.0).await? != 0 {
                op.retry().await;
                continue;
            }
            // Re-read to find duplicates of the key; keep the lowest slot.
            let snap = self.read_buckets(&p, None).await?;
            let m = self.matches(key, p.fp, &snap).await?;
            for &(dup_at, dup) in m.rest() {
                if ctx.cas(dup_at, dup.0, 0).await? == dup.0 {
                    self.retire(dup);
                }
            }
            break true;
        };
        self.block = block;
        Ok(result)
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
        let p = self.place(key);
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        loop {
            let snap = self.read_buckets(&p, None).await?;
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
}
