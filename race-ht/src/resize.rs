//! Online resizing: splitting a full subtable under its own split lock
//! (freeze, rehash into two halves), publishing the halves under the
//! table's short directory lock (in place, or by doubling the directory),
//! and finishing what a dead client left of either.

use std::collections::HashSet;

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
        // (`next` back: our CAS landed, and an RNIC that ran the retried
        // atomic twice answered with the second run. The word holds our
        // token, so nobody else wrote it.)
        if old != self.cur && old != next {
            return Err(RaceError::LeaseLost(old));
        }
        self.cur = next;
        Ok(())
    }
}

/// Per half of a split (by the bit that tells them apart): its address,
/// if known.
type Halves = [Option<GlobalAddr>; 2];

/// A split built and not yet published: both halves are written and
/// recorded in the subtable's split line; the directory may name some of
/// them already (a dead or stalled client's partial publication).
struct Prepared {
    base: GlobalAddr,
    ld: u32,
    s: u64,
    addrs: [GlobalAddr; 2],
    /// Blocks that only the frozen subtable names once the halves this
    /// client recorded are published (duplicates, and originals of blocks
    /// copied to another blade). Those of a half another client recorded
    /// are that client's to retire.
    retired: Vec<Slot>,
}

/// How a publication ended.
enum Publication {
    /// The directory names both halves; the array this client replaced by
    /// doubling, if any (its to retire).
    Done(Option<(GlobalAddr, u64)>),
    /// Another publication's intent was set first (by a holder whose lease
    /// ran out): that one is to be finished before this one.
    Busy,
}

impl RaceHt {
    /// This client's lock word with beat 0 (never [`layout::DROPPED_LOCK`]).
    fn lock_token(&self) -> u64 {
        (self.token % ((1 << (64 - layout::BEAT_BITS)) - 1)).max(1) << layout::BEAT_BITS
    }

    /// Takes the lock at `word` if it is free (`expect` = 0) or still holds
    /// `expect` (a dead holder's word).
    pub(crate) async fn lock(&self, word: GlobalAddr, expect: u64) -> Result<Option<Lease>> {
        if expect == layout::SPLIT_DONE || expect == layout::DROPPED_LOCK {
            // Held for good.
            return Ok(None);
        }
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
    /// split (or when the subtable was found dead) the lock holds
    /// [`layout::SPLIT_DONE`] for good: the subtable is dead, and no client
    /// splits it again. After an error the
    /// lock is released, so that the next client redoes the split (every
    /// step is idempotent), and the error returned. A lease lost meanwhile
    /// (another client took the lock over, and finishes the split) is
    /// counted, not an error: the caller's operation starts over.
    async fn end_split(&self, lease: Lease, work: Result<()>) -> Result<()> {
        let outcome = match work {
            Ok(()) => Ok(()),
            e @ Err(RaceError::LeaseLost(_) | RaceError::Dropped) => e,
            // (A split concluded keeps its lock for good.)
            e @ Err(_) if lease.cur == layout::SPLIT_DONE => e,
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
                    if watch.look(&self.ctx) >= self.lease {
                        if let Some(l) = self.lock(word, old).await? {
                            self.bump(|s| s.takeovers += 1);
                            return Ok(l);
                        }
                    }
                }
                _ => seen = Some((old, Watch::start(&self.ctx))),
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
    /// builds the halves not yet recorded from its frozen image (see
    /// [`RaceHt::prepare`]), publishes them under the directory lock, and
    /// concludes the split. If the directory no longer names the subtable
    /// (published by a client that died or stalled before concluding),
    /// only concludes it. Returns whether this client concluded it.
    async fn split_subtable(&mut self, base: GlobalAddr, lease: &mut Lease) -> Result<bool> {
        let t0 = self.ctx.now_ns();
        let r = self.split_timed(base, lease).await;
        let spent = self.ctx.now_ns() - t0;
        self.bump(|s| s.split_ns += spent);
        r
    }

    /// [`RaceHt::split_subtable`]'s work.
    async fn split_timed(&mut self, base: GlobalAddr, lease: &mut Lease) -> Result<bool> {
        let Some(prep) = self.prepare(base, lease).await? else {
            // Published whole already (by a holder that died or stalled
            // before concluding): its intent, if left, is cleared, and the
            // split concluded here.
            self.clear_intent_of(base).await?;
            return self.conclude(base, lease, &[]).await;
        };
        let t0 = self.ctx.now_ns();
        let mut dl = self.dir_lock(Some(lease)).await?;
        let waited = self.ctx.now_ns() - t0;
        self.bump(|s| s.dir_wait_ns += waited);
        let r = async {
            for _ in 0..STEAL_TRIES {
                // A publication a dead client left comes first: no
                // subtable of its range may be split before it is whole.
                self.finish_intent(base, &mut dl).await?;
                // Still ours: nobody has taken this split over.
                lease.renew(&self.ctx).await?;
                if let Publication::Done(old_dir) = self.publish(&prep, &mut dl).await? {
                    return Ok(old_dir);
                }
            }
            Err(RaceError::Corrupt(format!("the publication intent kept changing while {base} was published")))
        }
        .await;
        let old_dir = match r {
            Ok(old_dir) => old_dir,
            // (With our split lock taken, the directory lock is still ours
            // to release; the halves stay recorded for the next splitter.)
            Err(e) => return self.unlock(dl).await.and(Err(e)),
        };
        let released = self.unlock(dl).await;
        if let Some((at, bytes)) = old_dir {
            // Unreachable since our CAS of the dir word.
            self.reclaim.retire(at, bytes);
        }
        let concluded = self.conclude(base, lease, &prep.retired).await?;
        if let Err(RaceError::LeaseLost(_)) = released {
            // Published; the directory lock was taken over meanwhile (a
            // stall longer than the lease): the taker finds nothing left.
            self.bump(|s| s.lease_losses += 1);
        } else {
            released?;
        }
        self.reload_dir().await?;
        Ok(concluded)
    }

    /// Concludes the published split of the subtable at `base` with its
    /// split lock `lease`: sets that lock to [`layout::SPLIT_DONE`] by CAS;
    /// only the client whose CAS lands counts the split (the table's split
    /// counter, which tells caches the directory moved) and retires the
    /// subtable and the blocks `retired` (so each is retired once, even
    /// when a holder stalled past its lease and its taker both published).
    /// Returns whether it concluded; a lease lost meanwhile is
    /// [`RaceError::LeaseLost`].
    async fn conclude(&self, base: GlobalAddr, lease: &mut Lease, retired: &[Slot]) -> Result<bool> {
        let old = self.ctx.cas(lease.word, lease.cur, layout::SPLIT_DONE).await?;
        if old != lease.cur {
            return Err(RaceError::LeaseLost(old));
        }
        lease.cur = layout::SPLIT_DONE;
        self.ctx.faa(self.table.add(layout::SPLITS_WORD), 1).await?;
        for &sl in retired {
            self.retire(sl);
        }
        self.reclaim.retire(base, layout::subtable_bytes(self.dir.borrow().groups));
        self.bump(|st| st.splits += 1);
        Ok(true)
    }

    /// Under the directory lock: finishes the publication that the
    /// publication intent names, unless it is `own` (the caller is
    /// redoing it). Its publisher died, failed, or stalled past its lease
    /// (it held the directory lock, which is now ours), so its split lock
    /// is taken whatever it holds (unless the split was concluded: then
    /// only the intent is left to clear).
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
            if w == layout::SPLIT_DONE {
                // Concluded (its intent set late by a stalled holder, or
                // left by one that died after concluding).
                self.ctx.cas(self.table.add(layout::INTENT_WORD), intent, 0).await?;
                return Ok(());
            }
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
        let r = async {
            let Some(prep) = self.prepare(t, &mut lease).await? else {
                // Published whole already (it died before concluding).
                self.clear_intent_of(t).await?;
                return self.conclude(t, &mut lease, &[]).await;
            };
            match self.publish(&prep, dl).await? {
                Publication::Done(old_dir) => {
                    if let Some((at, bytes)) = old_dir {
                        self.reclaim.retire(at, bytes);
                    }
                    self.conclude(t, &mut lease, &prep.retired).await
                }
                // The intent changed meanwhile: the caller looks again.
                Publication::Busy => Ok(false),
            }
        }
        .await;
        match r {
            Ok(true) => self.bump(|s| s.recovered += 1),
            Ok(false) => self.unlock(lease).await?,
            Err(RaceError::LeaseLost(_)) => self.bump(|s| s.lease_losses += 1),
            Err(e) => {
                if lease.cur != layout::SPLIT_DONE {
                    self.unlock(lease).await?;
                }
                return Err(e);
            }
        }
        self.reload_dir().await
    }

    /// Clears a publication intent naming `base`, whose publication is
    /// complete in the directory (by CAS: an intent set since is kept).
    async fn clear_intent_of(&self, base: GlobalAddr) -> Result<()> {
        let at = self.table.add(layout::INTENT_WORD);
        let intent = self.ctx.read_u64(at).await?;
        if intent != 0 && layout::unpack_entry(intent).1 == base {
            self.ctx.cas(at, intent, 0).await?;
        }
        Ok(())
    }

    /// Builds the split of the subtable at `base` (its split lock held):
    /// freezes it, reads the blocks its slots name, builds and writes the
    /// halves not yet recorded in its split line, and records them (by
    /// CAS: a half another client recorded first is used instead, and ours
    /// given back). Returns `None` if the directory no longer names the
    /// subtable. Idempotent from any point a client can die at: frozen
    /// slots never change, a recorded half is whole, and no block a frozen
    /// slot names is retired before the split is concluded.
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
        let mut published: Halves = [None, None];
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
        let record = layout::split_halves(base, groups);
        let mut line = [0u8; 16];
        ctx.read(record, &mut line).await?;
        let mut done: Halves = [None, None];
        for (h, d) in done.iter_mut().enumerate() {
            let w = u64::from_le_bytes(line[8 * h..8 * h + 8].try_into().expect("8 bytes"));
            let recorded = (w != 0).then(|| layout::unpack_entry(w).1);
            *d = match (recorded, published[h]) {
                (Some(r), Some(p)) if r != p => {
                    return Err(RaceError::Corrupt(format!(
                        "subtable {base}'s half {h} is recorded as {r} but published as {p}"
                    )))
                }
                (r, p) => r.or(p),
            };
        }
        let img = self.freeze(base, groups, Some(lease)).await?;
        lease.renew(&ctx).await?;

        // Every occupied slot, in address order, and its block.
        let occupied: Vec<(usize, Slot)> =
            slots_of(&img).map(|(off, sl)| (off, sl.thawed())).filter(|(_, sl)| !sl.is_empty()).collect();
        // Blocks of keys in a published half may have been replaced and
        // reused since (their home is live): those may not decode, and are
        // skipped. Blocks of keys in halves not yet recorded are intact.
        let tolerant = done.iter().any(Option::is_some);
        let blocks = self.read_blocks(base.blade(), &occupied, tolerant).await?;
        lease.renew(&ctx).await?;

        // The halves to build keep each entry's slot position.
        let suffixes = [s, s | 1 << ld];
        let mut halves = suffixes.map(|x| empty_subtable(groups, ld + 1, x));
        let mut addrs = [GlobalAddr::NULL; 2];
        for ((a, x), d) in addrs.iter_mut().zip(suffixes).zip(done) {
            *a = match d {
                Some(at) => at,
                None => {
                    self.reclaim.alloc(&ctx, blade_of(x, ctx.blades().len()), layout::subtable_bytes(groups)).await?
                }
            };
        }
        let mut kept: HashSet<&[u8]> = HashSet::new();
        // Per half: blocks to retire once it is published, copies made.
        let (mut copies, mut retired) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for (&(off, sl), blk) in occupied.iter().zip(&blocks) {
            let Some(blk) = blk else { continue };
            let (k, _) = layout::decode_block(blk).expect("read_blocks returns whole blocks");
            let h1 = layout::hashes(k).0;
            let half = ((h1 >> ld) & 1) as usize;
            if done[half].is_some() {
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
                retired[half].push(sl);
                continue;
            }
            let mut w = sl;
            if sl.addr().blade() != addrs[half].blade() {
                // Blocks live on their subtable's blade (one batch reads a
                // bucket's blocks): copy it over.
                let at = self.reclaim.alloc(&ctx, addrs[half].blade(), blk.len() as u64).await?;
                copies[half].push((at, &blk[..]));
                w = Slot::new(sl.fp(), (blk.len() / 64) as u64, at);
                retired[half].push(sl);
            }
            halves[half][off..off + 8].copy_from_slice(&w.0.to_le_bytes());
        }
        let all: Vec<(GlobalAddr, &[u8])> = copies.iter().flatten().copied().collect();
        ctx.write_many(&all).await?;
        let mut mine = Vec::new();
        for h in 0..2 {
            if done[h].is_some() {
                continue;
            }
            ctx.write_all(addrs[h], &halves[h]).await?;
            // Whole: recorded, unless another splitter recorded its own.
            let w = layout::pack_entry(ld + 1, addrs[h]);
            let old = ctx.cas(record.add(8 * h as u64), 0, w).await?;
            // (`w` names our fresh half: only our CAS can have put it there.)
            if old == 0 || old == w {
                mine.append(&mut retired[h]);
            } else {
                // Nobody can reach ours: given back.
                self.reclaim.retire(addrs[h], layout::subtable_bytes(groups));
                for &(at, blk) in &copies[h] {
                    self.reclaim.retire(at, blk.len() as u64);
                }
                addrs[h] = layout::unpack_entry(old).1;
            }
        }
        Ok(Some(Prepared { base, ld, s, addrs, retired: mine }))
    }

    /// Publishes a prepared split, with the directory lock `dl` held. Every
    /// change is a CAS from what it replaces, so a holder that stalled past
    /// its lease (and whose split was finished by its taker) changes
    /// nothing when it resumes: sets the intent; then, from the current
    /// directory, either swaps in a doubled copy of the array (CAS of the
    /// dir word read with the array) or moves each entry of the
    /// subtable's range from it to its half (CAS) and bumps the dir word's
    /// generation (CAS), doing both again if the word changed meanwhile;
    /// clears the intent.
    async fn publish(&mut self, prep: &Prepared, dl: &mut Lease) -> Result<Publication> {
        let ctx = self.ctx.clone();
        let (ld, s, addrs, base) = (prep.ld, prep.s, prep.addrs, prep.base);
        // The last renewal before the directory changes: a holder whose
        // lease ran out stops here (nothing of this split is reachable).
        dl.renew(&ctx).await?;
        let intent_at = self.table.add(layout::INTENT_WORD);
        let intent = layout::pack_entry(ld, base);
        let old = ctx.cas(intent_at, 0, intent).await?;
        if old != 0 && old != intent {
            return Ok(Publication::Busy);
        }
        let from = intent;
        let to = |i: u64| layout::pack_entry(ld + 1, addrs[((i >> ld) & 1) as usize]);
        let dir_at = self.table.add(layout::DIR_WORD);
        let (mut old_dir, mut whole) = (None, false);
        for _ in 0..=layout::MAX_DEPTH + STEAL_TRIES as u32 {
            self.reload_dir().await?;
            let (gd, array, current) = {
                let d = self.dir.borrow();
                (d.depth, d.array, d.dir_word)
            };
            let generation = layout::unpack_dir(current).2 + 1;
            if ld == gd {
                let n = 1u64 << gd;
                let mut raw = Vec::with_capacity(16 * n as usize);
                {
                    let d = self.dir.borrow();
                    for i in 0..2 * n {
                        let (l, a) = d.entries[(i % n) as usize];
                        let e = layout::pack_entry(l, a);
                        let e = if layout::suffix(i, ld) == s && e == from { to(i) } else { e };
                        raw.extend_from_slice(&e.to_le_bytes());
                    }
                }
                let doubled = self.reclaim.alloc(&ctx, 0, 16 * n).await?;
                ctx.write_all(doubled, &raw).await?;
                // Fails if the array was replaced, or changed in place
                // (its generation bumped), since we read it: then again.
                let swapped = layout::pack_dir(gd + 1, doubled, generation);
                let got = ctx.cas(dir_at, current, swapped).await?;
                // (`swapped` names our fresh array: only our CAS put it there.)
                if got != current && got != swapped {
                    // Never reachable.
                    self.reclaim.retire(doubled, 16 * n);
                    continue;
                }
                old_dir = Some((array, 8 * n));
                self.bump(|st| st.doublings += 1);
                whole = true;
                break;
            }
            let moves: Vec<(GlobalAddr, u64, u64)> =
                (s..1 << gd).step_by(1 << ld).map(|i| (array.add(8 * i), from, to(i))).collect();
            self.cas_all(&moves).await?;
            // Done once the generation is bumped from the word we read:
            // a doubling that copied the array before our moves then fails
            // its swap. If the word changed meanwhile (the array replaced by
            // a doubling that may lack our moves), the moves again.
            if ctx.cas(dir_at, current, layout::pack_dir(gd, array, generation)).await? == current {
                whole = true;
                break;
            }
        }
        if !whole {
            return Err(RaceError::Corrupt(format!("the directory kept changing while {base}'s split was published")));
        }
        ctx.cas(intent_at, intent, 0).await?;
        Ok(Publication::Done(old_dir))
    }

    /// CAS `expect → new` at every address, in batches (a CAS that fails
    /// leaves what another client put there).
    async fn cas_all(&self, cases: &[(GlobalAddr, u64, u64)]) -> Result<()> {
        for chunk in cases.chunks(MAX_BATCH) {
            let mut b = self.ctx.batch();
            for &(at, expect, new) in chunk {
                b.cas(at, expect, new);
            }
            b.post().await?;
        }
        Ok(())
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
