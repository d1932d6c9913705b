//! Online resizing: splitting a full subtable under the resize lock
//! (freeze, rehash into two halves, publish), and directory doubling.

use std::collections::HashSet;
use std::time::Instant;

use smart_core::runtime::MAX_BATCH;
use smart_core::GlobalAddr;

use crate::config::TORN_RETRIES;
use crate::directory::{blade_of, empty_subtable, slots_of, Place};
use crate::layout::{self, Slot};
use crate::{RaceError, RaceHt, Result};

/// Freeze batches between two renewals of the resize lock's lease.
const RENEW_EVERY: usize = 256;

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
    /// Resize locks this thread took over from a holder whose lease ran
    /// out.
    pub takeovers: u64,
    /// Splits left unfinished by a dead client that this thread finished.
    pub recovered: u64,
    /// Splits this thread gave up because its lease ran out and another
    /// client took the lock over (it then finishes them).
    pub lease_losses: u64,
}

/// The resize lock as its holder sees it: the word it last wrote.
#[derive(Debug)]
pub(crate) struct Lease {
    word: GlobalAddr,
    cur: u64,
}

impl Lease {
    /// Bumps the beat, proving this holder alive; fails if the lock was
    /// taken over meanwhile.
    pub(crate) async fn renew(&mut self, ctx: &smart_core::Ctx) -> Result<()> {
        let beat_mask = (1u64 << layout::BEAT_BITS) - 1;
        let next = (self.cur & !beat_mask) | ((self.cur + 1) & beat_mask);
        let old = ctx.cas(self.word, self.cur, next).await?;
        if old != self.cur {
            return Err(RaceError::LeaseLost(old));
        }
        self.cur = next;
        Ok(())
    }
}

/// The halves of a split that are already in the directory (a dead
/// client's partial publication), by the bit that tells them apart.
type Published = [Option<GlobalAddr>; 2];

impl RaceHt {
    /// This client's resize-lock word with beat 0.
    fn lock_token(&self) -> u64 {
        (self.token & ((1 << (64 - layout::BEAT_BITS)) - 1)).max(1) << layout::BEAT_BITS
    }

    /// Takes the resize lock if it is free (`expect` = 0) or still holds
    /// `expect` (a dead holder's word).
    pub(crate) async fn lock(&self, expect: u64) -> Result<Option<Lease>> {
        let word = self.table.add(layout::LOCK_WORD);
        let tok = self.lock_token();
        Ok((self.ctx.cas(word, expect, tok).await? == expect).then_some(Lease { word, cur: tok }))
    }

    /// Releases the resize lock.
    async fn unlock(&self, lease: Lease) -> Result<()> {
        let old = self.ctx.cas(lease.word, lease.cur, 0).await?;
        if old != lease.cur {
            return Err(RaceError::LeaseLost(old));
        }
        Ok(())
    }

    /// Splits the subtable of `p` (whose two buckets are full) under the
    /// table's resize lock. Returns `false`, having done nothing, if
    /// another client holds the lock.
    pub(crate) async fn grow(&mut self, p: &Place) -> Result<bool> {
        let Some(mut lease) = self.lock(0).await? else { return Ok(false) };
        let t0 = Instant::now();
        let split = async {
            // A split a dead client left half done comes first.
            if self.recover_split(&mut lease).await? {
                return Ok(());
            }
            self.split_locked(p, &mut lease).await
        }
        .await;
        self.bump(|s| s.split_ns += t0.elapsed().as_nanos() as u64);
        // An error before the intent is written leaves the table whole;
        // after it, the intent stays and the next holder finishes the split.
        self.release(lease, split).await?;
        Ok(true)
    }

    /// After a waiter saw the resize lock hold `word` for the whole lease:
    /// takes it over, finishes whatever split its holder left, releases it.
    /// Returns whether it took the lock.
    pub(crate) async fn take_over(&mut self, word: u64) -> Result<bool> {
        let Some(mut lease) = self.lock(word).await? else { return Ok(false) };
        if word != 0 {
            self.bump(|s| s.takeovers += 1);
        }
        let r = self.recover_split(&mut lease).await.map(drop);
        // On an error the intent stays: the next holder redoes the recovery
        // (it is idempotent).
        self.release(lease, r).await?;
        Ok(true)
    }

    /// Ends a turn with the resize lock whose work ended with `work`:
    /// releases the lock, even after an error, and returns the work's
    /// error. A lease lost meanwhile (another client took the lock over,
    /// and finishes the split) is counted, not an error: the lock is no
    /// longer ours to release, and the caller's operation starts over.
    async fn release(&self, lease: Lease, work: Result<()>) -> Result<()> {
        let outcome = match work {
            lost @ Err(RaceError::LeaseLost(_)) => lost,
            work => {
                let released = self.unlock(lease).await;
                work.and(released)
            }
        };
        if let Err(RaceError::LeaseLost(_)) = outcome {
            self.bump(|s| s.lease_losses += 1);
            return Ok(());
        }
        outcome
    }

    /// Sets how long the resize lock may stay unchanged before this handle
    /// takes it over (default [`RESIZE_LEASE`](crate::RESIZE_LEASE); tests
    /// shorten it).
    pub fn set_lease(&mut self, lease: std::time::Duration) {
        self.lease = lease;
    }

    /// Repairs what a dead client left of resizing, without waiting for an
    /// operation to meet it: watches the resize lock for one lease and takes
    /// it over if it stayed the same; takes a free lock if a split intent is
    /// left. Either way finishes that client's split. Returns whether a
    /// split was finished.
    ///
    /// # Errors
    /// Verb errors; a malformed table.
    pub async fn repair(&mut self) -> Result<bool> {
        let _pin = self.begin().await?;
        let word = self.table.add(layout::LOCK_WORD);
        let first = self.ctx.read_u64(word).await?;
        if first != 0 {
            self.ctx.sleep_ns(self.lease.as_nanos() as u64).await;
            if self.ctx.read_u64(word).await? != first {
                return Ok(false);
            }
        }
        let before = self.resize_stats().recovered;
        self.take_over(first).await?;
        self.reload_dir().await?;
        Ok(self.resize_stats().recovered > before)
    }

    /// Finishes the split named by the table's split intent, if any (a
    /// client died between writing it and clearing it). Returns whether
    /// there was one.
    pub(crate) async fn recover_split(&mut self, lease: &mut Lease) -> Result<bool> {
        let intent = self.ctx.read_u64(self.table.add(layout::INTENT_WORD)).await?;
        if intent == 0 {
            return Ok(false);
        }
        let (ld, base) = layout::unpack_entry(intent);
        let header = self.ctx.read_u64(base).await?;
        let s = header >> 32;
        if header != layout::bucket_header(ld, s) {
            return Err(RaceError::Corrupt(format!(
                "split intent names {base} at depth {ld}, whose header is {header:#x}"
            )));
        }
        self.reload_dir().await?;
        // Which halves the dead client had already put in the directory.
        let mut published: Published = [None, None];
        {
            let d = self.dir.borrow();
            if d.depth > ld {
                for i in (s..1 << d.depth).step_by(1 << ld) {
                    let (l, a) = d.entries[i as usize];
                    if a == base {
                        continue;
                    }
                    let half = ((i >> ld) & 1) as usize;
                    if l != ld + 1 || published[half].is_some_and(|x| x != a) {
                        return Err(RaceError::Corrupt(format!(
                            "entry {i} of subtable {base}'s range names ({l}, {a}) mid-split"
                        )));
                    }
                    published[half] = Some(a);
                }
            }
        }
        self.split_subtable(base, ld, s, published, lease).await?;
        self.bump(|st| st.recovered += 1);
        Ok(true)
    }

    /// The split of `p`'s subtable (see the crate docs), with the resize
    /// lock held.
    pub(crate) async fn split_locked(&mut self, p: &Place, lease: &mut Lease) -> Result<()> {
        // Under the lock nobody else changes the directory: this copy is
        // current, and the split may already have been done.
        self.reload_dir().await?;
        let (ld, base) = {
            let d = self.dir.borrow();
            d.entries[layout::suffix(p.h1, d.depth) as usize]
        };
        if base != p.base {
            return Ok(());
        }
        if ld >= layout::MAX_DEPTH {
            return Err(RaceError::Full);
        }
        self.split_subtable(base, ld, layout::suffix(p.h1, ld), [None, None], lease).await
    }

    /// Splits subtable `base` (local depth `ld`, suffix `s`): writes the
    /// intent, freezes it, builds the halves not yet `published` from its
    /// frozen image, publishes them, clears the intent. Idempotent from any
    /// point a client can die at, given the intent: frozen slots never
    /// change, and no block a frozen slot names is retired before the
    /// halves are published.
    async fn split_subtable(
        &mut self,
        base: GlobalAddr,
        ld: u32,
        s: u64,
        published: Published,
        lease: &mut Lease,
    ) -> Result<()> {
        let ctx = self.ctx.clone();
        let intent = self.table.add(layout::INTENT_WORD);
        ctx.write(intent, &layout::pack_entry(ld, base).to_le_bytes()).await?;
        let groups = self.dir.borrow().groups;
        let img = self.freeze(base, groups, lease).await?;
        lease.renew(&ctx).await?;

        // Every occupied slot, in address order, and its block.
        let occupied: Vec<(usize, Slot)> =
            slots_of(&img).map(|(off, sl)| (off, sl.thawed())).filter(|(_, sl)| !sl.is_empty()).collect();
        // Blocks of keys in a published half may have been replaced and
        // reused since (their home is live): those may not decode, and are
        // skipped. Blocks of keys in unpublished halves are intact.
        let tolerant = published.iter().any(Option::is_some);
        let blocks = self.read_blocks(base.blade(), &occupied, tolerant).await?;
        lease.renew(&ctx).await?;

        // The halves to build keep each entry's slot position.
        let suffixes = [s, s | 1 << ld];
        let mut halves = suffixes.map(|x| empty_subtable(groups, ld + 1, x));
        let mut addrs = [GlobalAddr::NULL; 2];
        for ((a, x), done) in addrs.iter_mut().zip(suffixes).zip(published) {
            *a = match done {
                Some(at) => at,
                None => {
                    self.reclaim.alloc(&ctx, blade_of(x, ctx.blades().len()), layout::subtable_bytes(groups)).await?
                }
            };
        }
        let mut kept: HashSet<&[u8]> = HashSet::new();
        let (mut copies, mut retired) = (Vec::new(), Vec::new());
        for (&(off, sl), blk) in occupied.iter().zip(&blocks) {
            let Some(blk) = blk else { continue };
            let (k, _) = layout::decode_block(blk).expect("read_blocks returns whole blocks");
            let h1 = layout::hashes(k).0;
            let half = ((h1 >> ld) & 1) as usize;
            if published[half].is_some() {
                continue;
            }
            if layout::suffix(h1, ld) != s {
                if tolerant {
                    // A reused block of a published half's key.
                    continue;
                }
                return Err(RaceError::Corrupt(format!(
                    "a key of suffix {:#x} in subtable {base} of suffix {s:#x}",
                    layout::suffix(h1, ld)
                )));
            }
            if !kept.insert(k) {
                // A duplicate left by racing inserts: the lowest slot (seen
                // first) survives.
                retired.push(sl);
                continue;
            }
            let mut w = sl;
            if sl.addr().blade() != addrs[half].blade() {
                // Blocks live on their subtable's blade (one batch reads a
                // bucket's blocks): copy it over.
                let at = self.reclaim.alloc(&ctx, addrs[half].blade(), blk.len() as u64).await?;
                copies.push((at, &blk[..]));
                w = Slot::new(sl.fp(), (blk.len() / 64) as u64, at);
                retired.push(sl);
            }
            halves[half][off..off + 8].copy_from_slice(&w.0.to_le_bytes());
        }
        ctx.write_many(&copies).await?;
        for ((a, h), done) in addrs.iter().zip(&halves).zip(published) {
            if done.is_none() {
                ctx.write_all(*a, h).await?;
            }
        }
        // The last renewal before the directory changes: a holder whose
        // lease ran out stops here, handing back what it built (nobody can
        // reach it: it was never published).
        if let Err(e) = lease.renew(&ctx).await {
            for (a, done) in addrs.iter().zip(published) {
                if done.is_none() {
                    self.reclaim.retire(*a, layout::subtable_bytes(groups));
                }
            }
            for (at, blk) in &copies {
                self.reclaim.retire(*at, blk.len() as u64);
            }
            return Err(e);
        }

        // Publish.
        let mut old_dir = None;
        let (gd, array) = {
            let d = self.dir.borrow();
            (d.depth, d.array)
        };
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
            let doubled = self.reclaim.alloc(&ctx, 0, 16 * n).await?;
            ctx.write_all(doubled, &raw).await?;
            ctx.write(self.table.add(layout::DIR_WORD), &layout::pack_entry(gd + 1, doubled).to_le_bytes()).await?;
            old_dir = Some((array, 8 * n));
            self.bump(|st| st.doublings += 1);
        } else {
            let updates: Vec<(GlobalAddr, [u8; 8])> =
                (s..1 << gd).step_by(1 << ld).map(|i| (array.add(8 * i), entry(i))).collect();
            let updates: Vec<(GlobalAddr, &[u8])> = updates.iter().map(|(a, e)| (*a, &e[..])).collect();
            ctx.write_many(&updates).await?;
        }
        ctx.write(intent, &0u64.to_le_bytes()).await?;
        ctx.faa(self.table.add(layout::SPLITS_WORD), 1).await?;
        // Only now may the blocks that frozen slots name, the frozen
        // subtable and a replaced directory be reused (once no operation
        // can reach them).
        for sl in retired {
            self.retire(sl);
        }
        self.reclaim.retire(base, layout::subtable_bytes(groups));
        if let Some((at, bytes)) = old_dir {
            self.reclaim.retire(at, bytes);
        }
        self.bump(|st| st.splits += 1);
        self.reload_dir().await
    }

    /// Freezes every slot of the subtable at `base` (CAS `w → w | 1`,
    /// retried with the value a failed CAS returns); returns the subtable's
    /// image, all slots frozen.
    pub(crate) async fn freeze(&self, base: GlobalAddr, groups: u64, lease: &mut Lease) -> Result<Vec<u8>> {
        let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
        self.ctx.read_all(base, &mut img).await?;
        let mut pending: Vec<(usize, u64)> =
            slots_of(&img).filter(|(_, sl)| !sl.is_frozen()).map(|(off, sl)| (off, sl.0)).collect();
        while !pending.is_empty() {
            let mut again = Vec::new();
            for (n, chunk) in pending.chunks(MAX_BATCH).enumerate() {
                if n % RENEW_EVERY == RENEW_EVERY - 1 {
                    lease.renew(&self.ctx).await?;
                }
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
    /// number of times. With `tolerant`, a block that never decodes is
    /// `None` instead of an error.
    pub(crate) async fn read_blocks(
        &self,
        blade: u16,
        slots: &[(usize, Slot)],
        tolerant: bool,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        if let Some((_, s)) = slots.iter().find(|(_, s)| s.addr().blade() != blade) {
            return Err(RaceError::Corrupt(format!("a slot on blade {blade} names a block at {}", s.addr())));
        }
        let room = self.ctx.config().slot_bytes;
        let mut out = vec![None; slots.len()];
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
                        out[j] = Some(data.to_vec());
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
        if tolerant {
            return Ok(out);
        }
        Err(RaceError::Torn(slots[pending[0]].1.addr()))
    }
}
