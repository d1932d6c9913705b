//! Online resizing: splitting a full subtable under its own split lock
//! (freeze, rehash into two halves), publishing the halves under the
//! table's short directory lock (in place, or by doubling the directory),
//! and finishing what a dead client left of either.

use std::collections::HashSet;
use std::time::Instant;

use smart_core::runtime::MAX_BATCH;
use smart_core::GlobalAddr;

use crate::config::{PAUSE_MAX_NS, PAUSE_NS, TORN_RETRIES};
use crate::directory::{blade_of, empty_subtable, slots_of, Watch};
use crate::layout::{self, Slot};
use crate::{RaceError, RaceHt, Result};

/// Freeze batches between two renewals of the split lock's lease.
const RENEW_EVERY: usize = 256;

/// Tries at stealing the split lock of a subtable whose publication a dead
/// client left (its word changes only while another client steals it too).
const STEAL_TRIES: usize = 16;

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
    /// Nanoseconds this thread spent splitting (from taking a split lock
    /// to releasing the directory lock).
    pub split_ns: u64,
    /// Nanoseconds of that spent waiting for the directory lock.
    pub dir_wait_ns: u64,
    /// Locks (split or directory) this thread took over from a holder whose
    /// lease ran out.
    pub takeovers: u64,
    /// Splits left unfinished by a dead client that this thread finished.
    pub recovered: u64,
    /// Splits this thread gave up because its lease ran out and another
    /// client took the lock over (it then finishes them).
    pub lease_losses: u64,
    /// Operations that ran while this thread may have been taken for dead
    /// by the reclamation registry (a stall longer than its lease), and
    /// started over: what they read may have been reused memory.
    pub lapse_retries: u64,
}

/// A lock (a subtable's split lock or the directory lock) as its holder
/// sees it: the word it last wrote.
#[derive(Debug)]
pub(crate) struct Lease {
    word: GlobalAddr,
    pub(crate) cur: u64,
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

/// A split built and not yet published: the halves are written, nothing
/// reaches them.
struct Prepared {
    base: GlobalAddr,
    ld: u32,
    s: u64,
    groups: u64,
    addrs: [GlobalAddr; 2],
    published: Published,
    /// Blocks that only the frozen subtable names once the halves are
    /// published (duplicates, and originals of blocks copied to another
    /// blade).
    retired: Vec<Slot>,
    /// Copies made on the halves' blades.
    copies: Vec<(GlobalAddr, u64)>,
}

impl RaceHt {
    /// This client's lock word with beat 0 (never [`layout::DROPPED_LOCK`]).
    fn lock_token(&self) -> u64 {
        (self.token % ((1 << (64 - layout::BEAT_BITS)) - 1)).max(1) << layout::BEAT_BITS
    }

    /// Takes the lock at `word` if it is free (`expect` = 0) or still holds
    /// `expect` (a dead holder's word).
    pub(crate) async fn lock(&self, word: GlobalAddr, expect: u64) -> Result<Option<Lease>> {
        let tok = self.lock_token();
        Ok((self.ctx.cas(word, expect, tok).await? == expect).then_some(Lease { word, cur: tok }))
    }

    /// Releases a lock.
    async fn unlock(&self, lease: Lease) -> Result<()> {
        let old = self.ctx.cas(lease.word, lease.cur, 0).await?;
        if old != lease.cur {
            return Err(RaceError::LeaseLost(old));
        }
        Ok(())
    }

    /// The split lock of the subtable at `base`.
    pub(crate) fn split_lock_of(&self, base: GlobalAddr) -> GlobalAddr {
        layout::split_lock(base, self.dir.borrow().groups)
    }

    /// Splits the subtable of `p` (whose two buckets are full) under its
    /// split lock. Returns `false`, having done nothing, if another client
    /// holds that lock.
    pub(crate) async fn grow(&mut self, p: &crate::directory::Place) -> Result<bool> {
        if p.depth >= layout::MAX_DEPTH {
            return Err(RaceError::Full);
        }
        let Some(mut lease) = self.lock(self.split_lock_of(p.base), 0).await? else { return Ok(false) };
        let split = self.split_subtable(p.base, &mut lease).await.map(drop);
        self.end_split(lease, split).await?;
        Ok(true)
    }

    /// After a waiter saw the split lock of the subtable at `base` hold
    /// `word` (0: free, while the subtable stayed frozen) for the whole
    /// lease: takes it over and finishes (or does) the split. Returns
    /// whether it took the lock.
    pub(crate) async fn take_over(&mut self, base: GlobalAddr, word: u64) -> Result<bool> {
        let Some(mut lease) = self.lock(self.split_lock_of(base), word).await? else { return Ok(false) };
        if word != 0 {
            self.bump(|s| s.takeovers += 1);
        }
        let r = self.split_subtable(base, &mut lease).await;
        if let Ok(true) = r {
            self.bump(|s| s.recovered += 1);
        }
        self.end_split(lease, r.map(drop)).await?;
        Ok(true)
    }

    /// Ends a turn with a split lock whose work ended with `work`. After a
    /// split (or when the subtable was found dead) the lock stays held: the
    /// subtable is dead, and no client splits it again. After an error the
    /// lock is released, so that the next client redoes the split (every
    /// step is idempotent), and the error returned. A lease lost meanwhile
    /// (another client took the lock over, and finishes the split) is
    /// counted, not an error: the caller's operation starts over.
    async fn end_split(&self, lease: Lease, work: Result<()>) -> Result<()> {
        let outcome = match work {
            Ok(()) => Ok(()),
            e @ Err(RaceError::LeaseLost(_) | RaceError::Dropped) => e,
            Err(e) => self.unlock(lease).await.and(Err(e)),
        };
        if let Err(RaceError::LeaseLost(_)) = outcome {
            self.bump(|s| s.lease_losses += 1);
            return Ok(());
        }
        outcome
    }

    /// Sets how long a lock may stay unchanged before this handle takes it
    /// over (default [`RESIZE_LEASE`](crate::RESIZE_LEASE); tests shorten
    /// it).
    pub fn set_lease(&mut self, lease: std::time::Duration) {
        self.lease = lease;
    }

    /// Sets how long another client's reclamation entry may stay the same
    /// before this handle's thread takes it for dead, and how long this
    /// thread may go silent before it counts itself lapsed (default
    /// [`LEASE`](smart_core::reclaim::LEASE); tests shorten it).
    pub fn set_reclaim_lease(&self, lease: std::time::Duration) {
        self.reclaim.set_lease(lease);
    }

    /// Takes the directory lock: at once when it is free; after the lease
    /// when its word stays the same (the holder died); never when the
    /// table was dropped. While it waits, it keeps `split`'s lease (the
    /// split lock the caller holds) alive, and fails if that was lost.
    pub(crate) async fn dir_lock(&self, mut split: Option<&mut Lease>) -> Result<Lease> {
        let word = self.table.add(layout::LOCK_WORD);
        let tok = self.lock_token();
        let mut seen: Option<(u64, Watch)> = None;
        let mut pause = PAUSE_NS;
        loop {
            let old = self.ctx.cas(word, 0, tok).await?;
            if old == 0 {
                return Ok(Lease { word, cur: tok });
            }
            if old == layout::DROPPED_LOCK {
                return Err(RaceError::Dropped);
            }
            match &mut seen {
                Some((w, watch)) if *w == old => {
                    if watch.look() >= self.lease {
                        if let Some(l) = self.lock(word, old).await? {
                            self.bump(|s| s.takeovers += 1);
                            return Ok(l);
                        }
                    }
                }
                _ => seen = Some((old, Watch::start())),
            }
            // A long wait keeps this thread's reclamation entry alive (its
            // operation's pin must hold while it waits).
            self.reclaim.tick(&self.ctx).await?;
            self.ctx.sleep_ns(pause).await;
            pause = (pause * 2).min(PAUSE_MAX_NS);
            if let Some(l) = split.as_deref_mut() {
                l.renew(&self.ctx).await?;
            }
        }
    }

    /// Repairs what dead clients left of resizing, without waiting for an
    /// operation to meet it:
    /// * the directory lock, if it stays the same for a lease (or is free
    ///   with a publication intent left): takes it over and finishes that
    ///   publication;
    /// * every live subtable whose split lock stays held and unchanged for
    ///   a lease, or is free while some of its slots are frozen: takes the
    ///   lock over and finishes the split.
    ///
    /// Reads every live subtable. Returns whether a split was finished.
    ///
    /// # Errors
    /// Verb errors; a malformed or dropped table.
    pub async fn repair(&mut self) -> Result<bool> {
        let _pin = self.begin().await?;
        let before = self.resize_stats().recovered;
        let lease_ns = self.lease.as_nanos() as u64;
        let word = self.table.add(layout::LOCK_WORD);
        let first = self.ctx.read_u64(word).await?;
        if first == layout::DROPPED_LOCK {
            return Err(RaceError::Dropped);
        }
        let stuck = if first != 0 {
            self.ctx.sleep_ns(lease_ns).await;
            self.ctx.read_u64(word).await? == first
        } else {
            self.ctx.read_u64(self.table.add(layout::INTENT_WORD)).await? != 0
        };
        if stuck {
            if let Some(mut dl) = self.lock(word, first).await? {
                if first != 0 {
                    self.bump(|s| s.takeovers += 1);
                }
                let r = self.finish_intent(GlobalAddr::NULL, &mut dl).await;
                match r {
                    Err(RaceError::LeaseLost(_)) => self.bump(|s| s.lease_losses += 1),
                    r => r.and(self.unlock(dl).await)?,
                }
            }
        }
        // Live subtables: held split locks (watched for a lease) and free
        // ones over frozen slots.
        self.reload_dir().await?;
        let (groups, subtables) = {
            let d = self.dir.borrow();
            (d.groups, d.subtables().map(|(_, _, at)| at).collect::<Vec<_>>())
        };
        let mut held = Vec::new();
        for at in subtables {
            let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
            self.ctx.read_all(at, &mut img).await?;
            let lock = crate::directory::word(&img, layout::bucket_bytes(groups) as usize);
            let frozen = slots_of(&img[..layout::bucket_bytes(groups) as usize]).any(|(_, sl)| sl.is_frozen());
            if lock != 0 {
                held.push((at, lock));
            } else if frozen {
                self.take_over(at, 0).await?;
            }
        }
        if !held.is_empty() {
            self.ctx.sleep_ns(lease_ns).await;
            for (at, lock) in held {
                if self.ctx.read_u64(layout::split_lock(at, groups)).await? == lock {
                    self.take_over(at, lock).await?;
                }
            }
        }
        self.reload_dir().await?;
        Ok(self.resize_stats().recovered > before)
    }

    /// Splits the subtable at `base`, whose split lock `lease` holds:
    /// builds the halves not yet published from its frozen image (see
    /// [`RaceHt::prepare`]), then publishes them under the directory lock.
    /// Returns `false`, having done nothing, if the directory no longer
    /// names the subtable (it was split already).
    async fn split_subtable(&mut self, base: GlobalAddr, lease: &mut Lease) -> Result<bool> {
        let t0 = Instant::now();
        let r = self.split_timed(base, lease).await;
        self.bump(|s| s.split_ns += t0.elapsed().as_nanos() as u64);
        r
    }

    /// [`RaceHt::split_subtable`]'s work.
    async fn split_timed(&mut self, base: GlobalAddr, lease: &mut Lease) -> Result<bool> {
        let Some(prep) = self.prepare(base, lease).await? else {
            // Published whole already; a publisher that died before
            // clearing its intent leaves it naming this subtable.
            if self.intent_names(base).await? {
                let dl = self.dir_lock(Some(lease)).await?;
                let r = self.clear_intent_of(base).await;
                r.and(self.unlock(dl).await)?;
            }
            return Ok(false);
        };
        let t0 = Instant::now();
        let mut dl = match self.dir_lock(Some(lease)).await {
            Ok(dl) => dl,
            Err(e) => {
                self.hand_back(&prep, &e);
                return Err(e);
            }
        };
        self.bump(|s| s.dir_wait_ns += t0.elapsed().as_nanos() as u64);
        let r = async {
            // A publication a dead client left comes first: no subtable of
            // its range may be split before it is whole.
            self.finish_intent(base, &mut dl).await?;
            // Still ours: nobody has taken this split over.
            lease.renew(&self.ctx).await?;
            self.publish(&prep, &mut dl).await
        }
        .await;
        let old_dir = match r {
            Ok(old_dir) => old_dir,
            Err(e) => {
                // (With our split lock taken, the directory lock is still
                // ours to release.)
                self.hand_back(&prep, &e);
                return self.unlock(dl).await.and(Err(e));
            }
        };
        let released = self.unlock(dl).await;
        self.retire_split(&prep, old_dir);
        self.bump(|st| st.splits += 1);
        if let Err(RaceError::LeaseLost(_)) = released {
            // Published; the directory lock was taken over meanwhile (a
            // stall longer than the lease): the taker finds nothing left.
            self.bump(|s| s.lease_losses += 1);
        } else {
            released?;
        }
        self.reload_dir().await?;
        Ok(true)
    }

    /// Under the directory lock: finishes the publication that the
    /// publication intent names, unless it is `own` (the caller is
    /// redoing it). Its publisher died, failed, or stalled past its lease
    /// (it held the directory lock, which is now ours), so its split lock
    /// is taken whatever it holds.
    pub(crate) async fn finish_intent(&mut self, own: GlobalAddr, dl: &mut Lease) -> Result<()> {
        let intent = self.ctx.read_u64(self.table.add(layout::INTENT_WORD)).await?;
        if intent == 0 {
            return Ok(());
        }
        let (_, t) = layout::unpack_entry(intent);
        if t == own {
            return Ok(());
        }
        let at = self.split_lock_of(t);
        let mut lease = None;
        for _ in 0..STEAL_TRIES {
            let w = self.ctx.read_u64(at).await?;
            if let Some(l) = self.lock(at, w).await? {
                if w != 0 {
                    self.bump(|s| s.takeovers += 1);
                }
                lease = Some(l);
                break;
            }
        }
        let Some(mut lease) = lease else {
            return Err(RaceError::Corrupt(format!(
                "the split lock of {t} kept changing while its publication was finished"
            )));
        };
        let prep = self.prepare(t, &mut lease).await?;
        let Some(prep) = prep else {
            // Published whole already (it died before clearing the intent).
            return self.clear_intent_of(t).await;
        };
        let old_dir = self.publish(&prep, dl).await?;
        self.retire_split(&prep, old_dir);
        self.bump(|s| s.recovered += 1);
        self.reload_dir().await
    }

    /// Whether the publication intent names the subtable at `base`.
    async fn intent_names(&self, base: GlobalAddr) -> Result<bool> {
        let intent = self.ctx.read_u64(self.table.add(layout::INTENT_WORD)).await?;
        Ok(intent != 0 && layout::unpack_entry(intent).1 == base)
    }

    /// Under the directory lock: clears an intent naming `base`, whose
    /// publication is complete in the directory, and bumps the split
    /// counter its publisher did not get to bump. That is the last step of
    /// a dead publisher's split, so it counts as a split finished
    /// (`recovered`).
    async fn clear_intent_of(&self, base: GlobalAddr) -> Result<()> {
        if self.intent_names(base).await? {
            self.ctx.write(self.table.add(layout::INTENT_WORD), &0u64.to_le_bytes()).await?;
            self.ctx.faa(self.table.add(layout::SPLITS_WORD), 1).await?;
            self.bump(|s| s.recovered += 1);
        }
        Ok(())
    }

    /// Builds the split of the subtable at `base` (its split lock held):
    /// freezes it, reads the blocks its slots name, builds and writes the
    /// halves not yet in the directory. Returns `None` if the directory no
    /// longer names the subtable. Idempotent from any point a client can
    /// die at: frozen slots never change, and no block a frozen slot names
    /// is retired before the halves are published.
    async fn prepare(&mut self, base: GlobalAddr, lease: &mut Lease) -> Result<Option<Prepared>> {
        let ctx = self.ctx.clone();
        let header = ctx.read_u64(base).await?;
        let (ld, s) = ((header & 0xffff_ffff) as u32, header >> 32);
        if header != layout::bucket_header(ld, s) || ld >= layout::MAX_DEPTH {
            return Err(RaceError::Corrupt(format!("a split of {base}, whose header is {header:#x}")));
        }
        self.reload_dir().await?;
        // Whether the directory still names it, and which halves a dead
        // client had already put there.
        let mut published: Published = [None, None];
        let mut named = false;
        let mut other = None;
        {
            let d = self.dir.borrow();
            if d.depth < ld {
                return Err(RaceError::Corrupt(format!(
                    "subtable {base} of depth {ld} under global depth {}",
                    d.depth
                )));
            }
            for i in (s..1 << d.depth).step_by(1 << ld) {
                let (l, a) = d.entries[i as usize];
                if a == base {
                    named = true;
                    continue;
                }
                let half = ((i >> ld) & 1) as usize;
                if l != ld + 1 || published[half].is_some_and(|x| x != a) {
                    // Not a half of this split: one split since.
                    other = Some((i, l, a));
                }
                published[half] = Some(a);
            }
        }
        if let (true, Some((i, l, a))) = (named, other) {
            return Err(RaceError::Corrupt(format!("entry {i} of subtable {base}'s range names ({l}, {a}) mid-split")));
        }
        // Still ours (a holder that stalled past its lease learns it here
        // at the latest, whether or not the taker finished the split).
        lease.renew(&ctx).await?;
        if !named {
            return Ok(None);
        }
        let groups = self.dir.borrow().groups;
        let img = self.freeze(base, groups, Some(lease)).await?;
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
        let copies = copies.iter().map(|(at, blk)| (*at, blk.len() as u64)).collect();
        Ok(Some(Prepared { base, ld, s, groups, addrs, published, retired, copies }))
    }

    /// After a split stopped before publishing anything (`e`: its lease
    /// lost, or the table dropped): hands back the halves it built and its
    /// copies (nobody can reach them).
    fn hand_back(&self, prep: &Prepared, e: &RaceError) {
        if !matches!(e, RaceError::LeaseLost(_) | RaceError::Dropped) {
            // Maybe partly published: kept (the next holder reuses them).
            return;
        }
        for (a, done) in prep.addrs.iter().zip(prep.published) {
            if done.is_none() {
                self.reclaim.retire(*a, layout::subtable_bytes(prep.groups));
            }
        }
        for &(at, len) in &prep.copies {
            self.reclaim.retire(at, len);
        }
    }

    /// Publishes a prepared split, with the directory lock `dl` held:
    /// writes the intent, puts the halves in the directory (in place when
    /// the subtable's depth is below the global depth, else a doubled
    /// directory swapped in by one WRITE of the dir word), clears the
    /// intent, bumps the split counter. Returns the replaced directory.
    async fn publish(&mut self, prep: &Prepared, dl: &mut Lease) -> Result<Option<(GlobalAddr, u64)>> {
        let ctx = self.ctx.clone();
        let (ld, s, addrs) = (prep.ld, prep.s, prep.addrs);
        // Under the directory lock nobody else changes the directory: this
        // copy is current.
        self.reload_dir().await?;
        let (gd, array) = {
            let d = self.dir.borrow();
            (d.depth, d.array)
        };
        // The last renewal before the directory changes: a holder whose
        // lease ran out stops here (nothing of this split is reachable).
        dl.renew(&ctx).await?;
        let intent = self.table.add(layout::INTENT_WORD);
        ctx.write(intent, &layout::pack_entry(ld, prep.base).to_le_bytes()).await?;
        let entry = |i: u64| layout::pack_entry(ld + 1, addrs[((i >> ld) & 1) as usize]).to_le_bytes();
        let mut old_dir = None;
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
        Ok(old_dir)
    }

    /// After a publication: the blocks only the frozen subtable names, the
    /// subtable itself and a replaced directory may be reused once no
    /// operation can reach them.
    fn retire_split(&self, prep: &Prepared, old_dir: Option<(GlobalAddr, u64)>) {
        for &sl in &prep.retired {
            self.retire(sl);
        }
        self.reclaim.retire(prep.base, layout::subtable_bytes(prep.groups));
        if let Some((at, bytes)) = old_dir {
            self.reclaim.retire(at, bytes);
        }
    }

    /// Freezes every slot of the subtable at `base` (CAS `w → w | 1`,
    /// retried with the value a failed CAS returns), renewing `lease` if
    /// given; returns the image of its buckets, all slots frozen.
    pub(crate) async fn freeze(&self, base: GlobalAddr, groups: u64, mut lease: Option<&mut Lease>) -> Result<Vec<u8>> {
        let mut img = vec![0u8; layout::bucket_bytes(groups) as usize];
        self.ctx.read_all(base, &mut img).await?;
        let mut pending: Vec<(usize, u64)> =
            slots_of(&img).filter(|(_, sl)| !sl.is_frozen()).map(|(off, sl)| (off, sl.0)).collect();
        while !pending.is_empty() {
            let mut again = Vec::new();
            for (n, chunk) in pending.chunks(MAX_BATCH).enumerate() {
                if n % RENEW_EVERY == RENEW_EVERY - 1 {
                    if let Some(l) = lease.as_deref_mut() {
                        l.renew(&self.ctx).await?;
                    }
                    self.reclaim.tick(&self.ctx).await?;
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
