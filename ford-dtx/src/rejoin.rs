//! Re-replication while transactions run: a fresh memory blade, adopted in
//! the place of one a failover took out, receives that blade's copies of
//! the tables while compute blades go on, and then holds them whole.
//!
//! The blade is adopted at its place and its heap reserved past what the
//! database had there ([`crate::rebuild::extents_on`]), so that every copy
//! goes back to its old address, as in an offline rebuild. Then, in order:
//!
//! 1. **It joins** ([`crate::db::Db::view`]): every transaction writes its
//!    records' copies there too, and reads none there. The transactions of
//!    the earlier view are settled first ([`crate::recovery::settle`]), so
//!    that none of them writes without it.
//! 2. **Buckets added while it was out get a copy there** ([`add_copies`]):
//!    an overflow bucket that a transaction added while the blade was out
//!    names no copy on it (its header word is 0). One is allocated, and
//!    every copy's header names it. A transaction that read such a header
//!    before aborts rather than write without the blade's copy (it cannot
//!    know where it is), and reads the header again.
//! 3. **Each slot is copied under its lock** ([`copy`]): the copier locks
//!    every slot of a bucket on the primary in use (a CAS, as a
//!    transaction's lock), reads the bucket, writes the locked slots' records
//!    on the joining blade (lock words 0, as a backup's), waits for them to
//!    land, and unlocks. A transaction that writes a slot holds its lock
//!    from before its write until after its writes landed on every copy,
//!    the joining one included: a slot copied under its lock is therefore
//!    never overwritten by an older image, and every later write reaches the
//!    copy. A slot that a transaction holds is retried.
//!    Chain links on the joining blade are set with a CAS from 0 (a
//!    transaction that extends a chain links the same bucket there).
//!
//! Once every slot was copied, the copies on the joining blade are whole and
//! stay so; a compute blade may read them from the next view on (the
//! `compute-blade rebuild --online` command then takes the blade into the
//! cluster's configuration).
//!
//! **Blade 0** joins the same way, with what it alone held put back first:
//! each catalog and named root, written from the mirrors
//! ([`crate::mirror::restore_joining`]), and an empty registry. While it
//! joins, the database is opened from its mirror
//! ([`crate::db::Db::open_view`] with blade 0 joining): the mirror on blade
//! 1 stays the registry, as while blade 0 was out. Once it is taken in,
//! every registration that mirror holds is of an earlier epoch, fenced,
//! and is settled there (in a view where blade 0 joins); the next ones
//! claim blade 0's slots, leaving a slot a mirror still records
//! (`mirror::records_slot`), whose registration is not settled yet:
//! its own copy in the mirrors would write over that registration's.
//!
//! The copier locks as a registered compute blade ([`crate::Registration`]):
//! if it dies, recovery releases its locks like any dead compute blade's
//! (it logs nothing: it changes no record's value), and the copy is made
//! again by the next run, from the start.

use smart_core::{Ctx, GlobalAddr};

use crate::db::{stored_addr, Db, Table};
use crate::error::{DtxError, Result};
use crate::layout::{self, state, MAX_REPLICAS, SLOTS};
use crate::recovery::{self, Arrays, Which};

/// What [`add_copies`] and [`copy`] did on the joining blade.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Copied {
    /// Bucket copies written (bucket arrays' buckets and overflow buckets).
    pub buckets: u64,
    /// Slots copied, each under its lock.
    pub slots: u64,
    /// Overflow buckets added while the blade was out, given a copy there
    /// ([`add_copies`]).
    pub added: u64,
    /// Records that named no home (written in a bucket added while replica
    /// 0's blade was out), rewritten on every copy to name their copy on
    /// replica 0.
    pub rehomed: u64,
    /// Bytes of buckets copied.
    pub bytes: u64,
    /// Slot locks found held by a transaction, and retried.
    pub busy: u64,
    /// Registrations of dead compute blades settled because they held
    /// slots the copy waited for ([`copy_reaping`]).
    pub reaped: u64,
}

/// The position in `t`'s order of its replica on the joining blade `n`, if
/// it has one there.
fn joining_pos(t: &Table, n: u16) -> Option<usize> {
    (t.live..t.writes).find(|v| t.vbase[*v].blade() == n)
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Gives every overflow bucket of `db` (a view in which blade `n` joins:
/// [`Db::view`]) that has no copy on blade `n` one there: allocated, its
/// header naming every copy, and the word naming it written in each other
/// copy's header. Returns how many. No transaction of an earlier view may
/// run (they add buckets without the blade).
///
/// # Errors
/// A chain that names no bucket; allocation and verb errors.
pub async fn add_copies(ctx: &Ctx, db: &Db, n: u16) -> Result<u64> {
    let mut added = 0;
    let mut header = [0u8; layout::BUCKET_HEADER as usize];
    for t in &db.tables {
        let Some(vj) = joining_pos(t, n) else { continue };
        let (rn, r0) = (usize::from(t.order[vj]), usize::from(t.order[0]));
        let bb = t.bucket_bytes();
        let mut arrays = Arrays::of(t, r0..r0 + 1);
        while let Some((b, k)) = arrays.next(ctx, t).await? {
            for i in 0..k {
                let home = t.base[r0].add((b + i) * bb);
                let mut next = layout::header_of(arrays.bucket(r0, i)).0;
                let mut hops = 0;
                while next != 0 {
                    crate::db::chain_within(ctx.blades(), t, home, hops)?;
                    hops += 1;
                    let at = stored_addr(ctx.blades(), next, bb, || {
                        format!("table {}: the next bucket in the chain of {home}", t.id)
                    })?;
                    ctx.read(at, &mut header).await?;
                    let (link, named) = layout::copies_named(&header, r0, at);
                    if named[rn] == 0 {
                        let mine = ctx.alloc(n, bb, 64).await?;
                        let copies: [GlobalAddr; MAX_REPLICAS] =
                            std::array::from_fn(|r| if r == rn { mine } else { GlobalAddr::from_raw(named[r]) });
                        // Its own header first (its link is set by the copy),
                        // then the others name it.
                        ctx.write(mine, &layout::header_bytes(0, &copies, rn)).await?;
                        for v in 0..t.live {
                            let r = usize::from(t.order[v]);
                            let w = if rn == 0 { r } else { rn };
                            ctx.write(copies[r].add(8 * w as u64), &mine.raw().to_le_bytes()).await?;
                        }
                        added += 1;
                    }
                    next = link;
                }
            }
        }
    }
    Ok(added)
}

/// How [`copy`] locks: the lock word of the copier's registration, and how
/// long a slot held by others is waited for before the dead are recovered.
#[derive(Clone, Copy, Debug)]
pub struct Copier {
    /// The lock word (a registered compute blade's: [`crate::layout::Owner`]).
    pub lock: u64,
    /// Milliseconds a held slot is retried before recovery of expired
    /// registrations is run (a dead compute blade's lock), and again.
    pub patience_ms: u64,
    /// Milliseconds after which a slot still held fails the copy.
    pub give_up_ms: u64,
}

/// Copies every slot of `db`'s tables that have a replica on blade `n`
/// (joining in the view `db`: [`Db::view`]) from the primary in use, each
/// under its lock (see the module docs). `pace(bytes)` is called after each
/// bucket with the bytes copied so far (to throttle the copy and report
/// progress); it returns an error to stop.
///
/// # Errors
/// A bucket with no copy on `n` (run [`add_copies`] first); a slot held
/// past `give_up_ms`; a lock lost (the copier was fenced); verb errors.
pub async fn copy<P>(ctx: &Ctx, db: &Db, n: u16, who: Copier, pace: P) -> Result<Copied>
where
    P: FnMut(&Copied) -> Result<()>,
{
    copy_reaping(ctx, db, n, who, pace, Vec::new).await
}

/// [`copy`], with `dead()` asked, when a slot stayed held past
/// `who.patience_ms` and recovery of expired registrations did not free
/// it, for registrations known dead otherwise (and fenced: none of their
/// verbs lands again), which are then settled ([`recovery::settle`]).
/// Under a coordinator these are the compute blades whose membership
/// lapsed: a registration in a mirror ([`Db::mirror`], while blade 0 is out
/// or joining) has no expiry that recovery could find run out.
///
/// # Errors
/// As [`copy`].
pub async fn copy_reaping<P, D>(ctx: &Ctx, db: &Db, n: u16, who: Copier, mut pace: P, mut dead: D) -> Result<Copied>
where
    P: FnMut(&Copied) -> Result<()>,
    D: FnMut() -> Vec<u64>,
{
    let mut out = Copied::default();
    let mut bucket = Vec::new();
    for t in &db.tables {
        let Some(vj) = joining_pos(t, n) else { continue };
        let bb = t.bucket_bytes();
        bucket.resize(bb as usize, 0);
        for b in 0..t.buckets {
            let mut copies = t.array_mirrors(t.vbase[0].add(b * bb), db.replicas);
            let mut array = true;
            let mut hops = 0;
            loop {
                let next = copy_bucket(ctx, db, t, vj, (&copies, array), who, &mut dead, &mut bucket, &mut out).await?;
                pace(&out)?;
                if next == 0 {
                    break;
                }
                crate::db::chain_within(ctx.blades(), t, copies[0], hops)?;
                hops += 1;
                let at = stored_addr(ctx.blades(), next, bb, || {
                    format!("table {}: the next bucket after {}", t.id, copies[0])
                })?;
                let mut header = [0u8; layout::BUCKET_HEADER as usize];
                ctx.read(at, &mut header).await?;
                let then = t.overflow_loc(ctx.blades(), db.replicas, &header, at)?;
                if then[vj].is_null() {
                    return Err(DtxError::Config(format!(
                        "table {}: overflow bucket {at} has no copy on memory blade {n} (buckets added while it was \
                         out get theirs first)",
                        t.id
                    )));
                }
                // The link on the joining blade (a transaction extending the
                // chain sets the same).
                let old = ctx.cas(copies[vj], 0, then[vj].raw()).await?;
                if old != 0 && old != then[vj].raw() {
                    return Err(DtxError::Corrupt(format!(
                        "table {}: the copy on memory blade {n} of bucket {} links to {}, not {}",
                        t.id,
                        copies[0],
                        GlobalAddr::from_raw(old),
                        then[vj]
                    )));
                }
                copies = then;
                array = false;
            }
        }
    }
    Ok(out)
}

/// Copies bucket `copies[0]` (on the primary in use) to its copy at
/// position `vj`: every slot under its lock (those held by a transaction
/// retried until `who.give_up_ms`), the header's copy words. Returns the
/// primary's link.
#[allow(clippy::too_many_arguments, reason = "the copy's state, passed down")]
async fn copy_bucket(
    ctx: &Ctx,
    db: &Db,
    t: &Table,
    vj: usize,
    (copies, array): (&[GlobalAddr; MAX_REPLICAS], bool),
    who: Copier,
    dead: &mut dyn FnMut() -> Vec<u64>,
    bucket: &mut [u8],
    out: &mut Copied,
) -> Result<u64> {
    let rn = usize::from(t.order[vj]);
    // The header's copy words: 0 in an array (copies are positional);
    // each copy by the replica as created, for an overflow bucket.
    let by_replica: [GlobalAddr; MAX_REPLICAS] = std::array::from_fn(|r| {
        t.order.iter().position(|o| usize::from(*o) == r).map_or(GlobalAddr::NULL, |v| copies[v])
    });
    let words = if array { [0u8; layout::BUCKET_HEADER as usize] } else { layout::header_bytes(0, &by_replica, rn) };
    ctx.write(copies[vj].add(8), &words[8..]).await?;
    let mut todo: Vec<usize> = (0..SLOTS).collect();
    let started = ctx.clock().wall_ms();
    let mut recovered_at = started;
    let mut next = 0;
    let mut first = true;
    loop {
        let held = lock_slots(ctx, t, copies[0], &todo, who.lock).await?;
        let locked: Vec<usize> = todo.iter().zip(&held).filter(|(_, h)| **h).map(|(s, _)| *s).collect();
        let busy: Vec<usize> = todo.iter().zip(&held).filter(|(_, h)| !**h).map(|(s, _)| *s).collect();
        ctx.read(copies[0], bucket).await?;
        if first {
            next = word(bucket, 0);
            first = false;
        }
        let r = write_slots(ctx, t, vj, copies, &by_replica, &locked, who.lock, bucket, out).await;
        // Unlocked whatever the writes did.
        unlock_slots(ctx, t, copies[0], &locked, who.lock).await?;
        r?;
        out.busy += busy.len() as u64;
        if busy.is_empty() {
            break;
        }
        todo = busy;
        let now = ctx.clock().wall_ms();
        if now.saturating_sub(started) > who.give_up_ms {
            return Err(DtxError::Config(format!(
                "table {}: slots {todo:?} of bucket {} stayed locked for {} ms: the copy stops (run it again)",
                t.id, copies[0], who.give_up_ms
            )));
        }
        if now.saturating_sub(recovered_at) > who.patience_ms {
            // A dead compute blade's lock: its recovery releases it.
            recovery::recover(ctx, db, Which::Expired).await?;
            let gone = dead();
            if !gone.is_empty() {
                out.reaped += recovery::settle(ctx, db, &gone, who.give_up_ms).await?.len() as u64;
            }
            recovered_at = now;
        }
        ctx.sleep_ns(1_000_000).await;
    }
    out.buckets += 1;
    out.bytes += t.bucket_bytes();
    Ok(next)
}

/// CASes the lock word of each slot `slots` of the bucket at `at` from 0 to
/// `lw`; whether each was taken.
async fn lock_slots(ctx: &Ctx, t: &Table, at: GlobalAddr, slots: &[usize], lw: u64) -> Result<Vec<bool>> {
    let mut out = Vec::with_capacity(slots.len());
    for chunk in slots.chunks(smart_core::runtime::MAX_BATCH) {
        let mut b = ctx.batch();
        let refs: Vec<_> =
            chunk.iter().map(|s| b.cas(at.add(layout::slot_offset(t.value_size, *s) + layout::LOCK), 0, lw)).collect();
        let done = b.post().await?;
        out.extend(refs.iter().map(|r| done.old(*r) == 0));
    }
    Ok(out)
}

/// Releases the locks [`lock_slots`] took.
///
/// # Errors
/// [`DtxError::LeaseLost`] if one no longer held `lw` (the copier was
/// taken for dead and its locks released).
async fn unlock_slots(ctx: &Ctx, t: &Table, at: GlobalAddr, slots: &[usize], lw: u64) -> Result<()> {
    for chunk in slots.chunks(smart_core::runtime::MAX_BATCH) {
        let mut b = ctx.batch();
        let refs: Vec<_> =
            chunk.iter().map(|s| b.cas(at.add(layout::slot_offset(t.value_size, *s) + layout::LOCK), lw, 0)).collect();
        let done = b.post().await?;
        if refs.iter().any(|r| done.old(*r) != lw) {
            return Err(DtxError::LeaseLost);
        }
    }
    Ok(())
}

/// Writes the `locked` slots of `bucket` (as read on the primary in use,
/// under their locks) to the copy at position `vj`, then READs it back once
/// (the writes landed before the locks go). A record that names no home
/// (see [`Copied::rehomed`]) is rewritten on every copy.
#[allow(clippy::too_many_arguments, reason = "the copy's state, passed down")]
async fn write_slots(
    ctx: &Ctx,
    t: &Table,
    vj: usize,
    copies: &[GlobalAddr; MAX_REPLICAS],
    by_replica: &[GlobalAddr; MAX_REPLICAS],
    locked: &[usize],
    lw: u64,
    bucket: &[u8],
    out: &mut Copied,
) -> Result<()> {
    let rb = t.record_bytes();
    let vs = t.value_size;
    let mut rec = vec![0u8; rb];
    let mut image = vec![0u8; bucket.len()];
    // Runs of consecutive locked slots, each one WRITE.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &s in locked {
        let off = layout::slot_offset(vs, s) as usize;
        let src = &bucket[off..off + rb];
        let dst = &mut image[off..off + rb];
        match layout::decode(src, vs) {
            Ok(r) if r.state == state::FREE => dst.fill(0),
            Ok(r) => {
                let home = by_replica[0].add(off as u64);
                let value = r.value.to_vec();
                layout::encode(dst, vs, r.table, r.key, home, r.version, 0, r.state, &value);
                if r.home != home.raw() {
                    // Every copy read names it too (the primary keeps the
                    // copier's lock word until the unlock).
                    for (v, at) in copies.iter().enumerate().take(t.live) {
                        let lock = if v == 0 { lw } else { 0 };
                        layout::encode(&mut rec, vs, r.table, r.key, home, r.version, lock, r.state, &value);
                        ctx.write(at.add(off as u64), &rec).await?;
                    }
                    out.rehomed += 1;
                }
            }
            // Damaged (no transaction writes it while the copier holds its
            // lock): copied as it is, for the audit to report.
            Err(_) => {
                dst.copy_from_slice(src);
                dst[layout::LOCK as usize..layout::LOCK as usize + 8].fill(0);
            }
        }
        match runs.last_mut() {
            Some((_, end)) if *end == off => *end = off + rb,
            _ => runs.push((off, off + rb)),
        }
    }
    for (from, to) in &runs {
        ctx.write(copies[vj].add(*from as u64), &image[*from..*to]).await?;
    }
    if !runs.is_empty() {
        ctx.read_u64(copies[vj]).await?;
    }
    out.slots += locked.len() as u64;
    Ok(())
}

/// The foreground's progress as its compute blades publish it: per
/// registry slot, its registration's nonce and the transactions it
/// committed in its measured time so far ([`layout::registry::PROGRESS`],
/// written with each lease renewal: [`crate::Registration::register_publishing`]).
/// One READ of the registry.
///
/// # Errors
/// Verb errors.
pub async fn foreground(ctx: &Ctx, db: &Db) -> Result<Vec<(u16, u64, u64)>> {
    use layout::registry;
    let mut all = vec![0u8; (registry::SLOTS * registry::SLOT) as usize];
    ctx.read_all(db.registry, &mut all).await?;
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Ok((1..registry::SLOTS as u16)
        .filter_map(|i| {
            let b = &all[usize::from(i) * registry::SLOT as usize..][..registry::SLOT as usize];
            let claim = word(b, 0) & !registry::RECOVERING;
            (claim != 0).then(|| (i, claim, word(b, registry::PROGRESS)))
        })
        .collect())
}

/// The foreground's throughput from successive readings of [`foreground`]:
/// the transactions committed between them, summed over the registrations
/// seen in both (a registration is counted from its first reading on; one
/// whose count went back is read anew).
#[derive(Debug, Default)]
pub struct Throughput {
    last: rustc_hash::FxHashMap<(u16, u64), u64>,
    /// (seconds, transactions counted so far) per reading.
    seen: std::collections::VecDeque<(f64, u64)>,
    total: u64,
    /// Registrations of the latest reading that committed a transaction.
    live: usize,
}

impl Throughput {
    /// Adds the reading `slots` taken at `t_s` seconds.
    pub fn observe(&mut self, t_s: f64, slots: &[(u16, u64, u64)]) {
        let mut next = rustc_hash::FxHashMap::default();
        self.live = slots.iter().filter(|s| s.2 > 0).count();
        for &(slot, nonce, done) in slots {
            if let Some(&before) = self.last.get(&(slot, nonce)) {
                self.total += done.saturating_sub(before);
            }
            next.insert((slot, nonce), done);
        }
        self.last = next;
        self.seen.push_back((t_s, self.total));
        while self.seen.len() > 64 {
            self.seen.pop_front();
        }
    }

    /// The registrations of the latest reading that have committed
    /// transactions (0: no foreground to hold a share of; a copier's own
    /// registration publishes none).
    pub fn live(&self) -> usize {
        self.live
    }

    /// The transactions counted so far (from each registration's first
    /// reading on).
    pub fn counted(&self) -> u64 {
        self.total
    }

    /// Transactions a second over the last `window_s` seconds of readings
    /// (from the latest reading at least that old); `None` before two
    /// readings that far apart.
    pub fn rate(&self, window_s: f64) -> Option<f64> {
        let &(t1, n1) = self.seen.back()?;
        let &(t0, n0) = self.seen.iter().rev().find(|(t, _)| t1 - t >= window_s)?;
        Some((n1 - n0) as f64 / (t1 - t0))
    }
}

/// The copy's pace under a foreground share (`rebuild --online
/// --foreground-share`): additive increase, multiplicative decrease, as
/// TCP's congestion control. Each second the foreground's throughput is
/// compared with `share` × its throughput before the copy: below it, the
/// copy's rate halves (down to `cap` / 64, so that the copy always ends);
/// at or above it, the rate grows by `cap` / 16 (up to `cap`).
#[derive(Clone, Copy, Debug)]
pub struct Throttle {
    /// The most bytes a second (`--copy-rate`).
    pub cap: f64,
    /// The share of `before` the foreground is to keep.
    pub share: f64,
    /// The foreground's transactions a second before the copy.
    pub before: f64,
    /// The copy's bytes a second now.
    pub rate: f64,
}

impl Throttle {
    /// Starts at a quarter of the cap.
    pub fn new(cap: f64, share: f64, before: f64) -> Throttle {
        Throttle { cap, share, before, rate: cap / 4.0 }
    }

    /// The lowest rate.
    pub fn floor(&self) -> f64 {
        self.cap / 64.0
    }

    /// The rate after a second in which the foreground ran `now`
    /// transactions a second.
    pub fn adjust(&mut self, now: f64) -> f64 {
        self.rate = if now < self.share * self.before {
            (self.rate / 2.0).max(self.floor())
        } else {
            (self.rate + self.cap / 16.0).min(self.cap)
        };
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_counts_each_registration_from_its_first_reading() {
        let mut t = Throughput::default();
        t.observe(0.0, &[(1, 7, 100)]);
        assert_eq!(t.rate(0.5), None, "one reading");
        t.observe(1.0, &[(1, 7, 400), (2, 9, 5_000), (3, 4, 0)]);
        assert_eq!(t.rate(1.0), Some(300.0), "slot 2 counted from its first reading");
        assert_eq!(t.live(), 2, "slot 3 committed nothing");
        // Slot 1 re-registered (another nonce): counted anew; slot 2 on.
        t.observe(2.0, &[(1, 8, 50), (2, 9, 5_600)]);
        assert_eq!(t.rate(1.0), Some(600.0));
        assert_eq!(t.rate(2.0), Some(450.0));
        // A count that went back (a new timed run under the same nonce).
        t.observe(3.0, &[(1, 8, 10), (2, 9, 5_600)]);
        assert_eq!(t.rate(1.0), Some(0.0));
    }

    #[test]
    fn the_throttle_halves_below_the_share_and_grows_back_to_its_cap() {
        let mut th = Throttle::new(16e6, 0.8, 1_000.0);
        assert_eq!(th.rate, 4e6);
        assert_eq!(th.adjust(700.0), 2e6, "below 80 %: halved");
        for _ in 0..10 {
            th.adjust(100.0);
        }
        assert_eq!(th.rate, 0.25e6, "never below cap / 64");
        assert_eq!(th.adjust(800.0), 1.25e6, "at the share: + cap / 16");
        for _ in 0..20 {
            th.adjust(900.0);
        }
        assert_eq!(th.rate, 16e6, "never above the cap");
    }
}
