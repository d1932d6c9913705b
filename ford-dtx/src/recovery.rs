//! Recovery after compute blades die, and the audit of a quiescent
//! database.
//!
//! A compute blade that dies (SIGKILL at any instant) leaves, at worst, per
//! coroutine one transaction in flight: locks on primaries that name it,
//! perhaps a durable undo log entry, perhaps some of its record WRITEs.
//! [`recover`] finds the registry slots whose lease expired (or the one it
//! is told), and for each:
//! 0. revokes its registration on every memory blade ([`Ctx::revoke`]):
//!    over TCP and RDMA verbs the blades refuse its verbs from then on, so
//!    a compute blade that only seemed dead (paused, or behind a stalled
//!    network) cannot write over what recovery repairs;
//! 1. reads every log entry of that registration (its nonce, CRC-checked);
//!    for each, reads the primaries' lock words of its items:
//!    - all still held by it: the transaction was not acknowledged (it
//!      returns only after releasing its locks) and may have written some
//!      records: every replica gets the old image back (with a new version;
//!      an inserted key stays in its slot, DELETED), then the locks go;
//!    - some released: it had flushed every record on every replica before
//!      releasing any lock, so it committed: the rest are released;
//!    - none: nothing to do;
//! 2. scans every table's primary for locks that still name the dead
//!    blade: transactions that died before their log entry was durable,
//!    so they wrote nothing: released (by CAS, never over another's lock).
//!    A chain whose link is damaged is scanned up to the damage, and
//!    counted ([`Recovered::chains_cut`]);
//! 3. frees the slot.
//!
//! Every step is idempotent, so a recovery that dies is simply run again.
//! [`release_orphans`] then releases locks that no registered compute blade
//! could hold (damage), which nothing else would ever release.
//! Committed transactions stay (nothing rolls them back); uncommitted ones
//! leave nothing behind.

use smart_core::{Ctx, Fencing, GlobalAddr};

use crate::db::{chain_within, overflow_copies, stored_addr, Db, Table};
use crate::error::Result;
use crate::layout::{self, log, registry, state, Owner, MAX_REPLICAS};
use crate::registry::{now_ms, slots, SlotInfo};

/// How long after its lease expired a slot counts as dead: covers a claim
/// whose expiry is not written yet, and clock skew between compute blades.
pub const GRACE_MS: u64 = 2_000;

/// How long a recovery holds the slot it recovers (its lease there): a
/// recovery that dies is taken over once this (and [`GRACE_MS`]) ran out.
pub const HOLD_MS: u64 = 60_000;

/// How long [`settle`] waits, for compute blades of leases `lease`: long
/// enough to take over a settling that another compute blade began and died
/// in (recovery's hold and grace, plus twice the lease).
pub fn settle_wait_ms(lease: std::time::Duration) -> u64 {
    HOLD_MS + GRACE_MS + 2 * lease.as_millis() as u64
}

/// What recovery did for one dead compute blade.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Recovered {
    /// Its registry slot.
    pub slot: u16,
    /// Its process id.
    pub pid: u64,
    /// Valid log entries found.
    pub entries: u64,
    /// Transactions rolled back (old images restored).
    pub rolled_back: u64,
    /// Transactions rolled forward (their remaining locks released).
    pub rolled_forward: u64,
    /// Locks of transactions without a log entry, released.
    pub released: u64,
    /// Its undo log was on a lost memory blade
    /// ([`recover_after_loss`]): its transactions in flight, if any had
    /// begun writing, could not be rolled back.
    pub log_lost: bool,
    /// Chains not scanned for its locks past a damaged link or mirror. Locks
    /// there that name it are released by [`release_orphans`] once the
    /// chain is whole again (its slot is then free).
    pub chains_cut: u64,
    /// Whether the memory blades refuse its verbs now (see [`Ctx::revoke`]).
    pub fenced: Fencing,
}

impl Recovered {
    /// How the memory blades treat it now, for messages.
    pub fn fencing(&self) -> String {
        match self.fenced {
            Fencing::Enforced(n) => format!("fenced on {n} memory blades"),
            Fencing::NotEnforced(why) => format!("not fenced on the memory blades ({why})"),
        }
    }
}

/// Which registrations to recover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Those whose lease expired more than [`GRACE_MS`] ago.
    Expired,
    /// This slot, whatever its lease says (the caller knows it is dead).
    Slot(u16),
}

/// Recovers the dead compute blades of `db` (see the module docs).
///
/// # Errors
/// A corrupt log; verb errors (recovery can then be run again).
pub async fn recover(ctx: &Ctx, db: &Db, which: Which) -> Result<Vec<Recovered>> {
    recover_all(ctx, db, which, &[]).await
}

/// [`recover`] of registrations `which` after memory blades `lost` were
/// lost and their copies rebuilt ([`crate::rebuild`]): the lock words of
/// primaries that were on them are lost, so a transaction whose items'
/// primaries were all there is decided by its surviving copies instead:
/// if some surviving copy still has an item's old version, the write did
/// not finish, and it is rolled back; else it had written every surviving
/// copy (or is long finished), and it stands. (With some primaries
/// surviving, their locks decide as in [`recover`].) A registration whose
/// log area was on a lost blade lost its undo log: its locks are
/// released, and it is reported ([`Recovered::log_lost`]): a transaction of
/// it that was writing when it died cannot be rolled back.
///
/// # Errors
/// As [`recover`].
pub async fn recover_after_loss(ctx: &Ctx, db: &Db, lost: &[u16], which: Which) -> Result<Vec<Recovered>> {
    recover_all(ctx, db, which, lost).await
}

/// Settles the transactions of registrations `nonces`: the compute blades
/// of an earlier configuration epoch after a failover, every one of them
/// fenced on the memory blades in use, live or dead alike (none of their
/// verbs lands again, so their state is what the blades and their
/// replicated undo logs hold). Each slot one of them still claims is
/// recovered as a dead compute blade's ([`recover_after_loss`] of the
/// blades `db` does without: [`Db::without`]); a slot that another
/// recovery holds is waited for, and taken over once that recovery's
/// lease runs out. Returns when none of them claims a slot (what this call
/// recovered), so that no transaction of the earlier epoch overlaps one of
/// the next.
///
/// # Errors
/// Slots still claimed after `wait_ms` milliseconds; as [`recover`].
pub async fn settle(ctx: &Ctx, db: &Db, nonces: &[u64], wait_ms: u64) -> Result<Vec<Recovered>> {
    let until = now_ms(ctx) + wait_ms;
    let mut out = Vec::new();
    loop {
        let pending: Vec<SlotInfo> =
            slots(ctx, db).await?.into_iter().filter(|s| s.claim != 0 && nonces.contains(&s.nonce())).collect();
        if pending.is_empty() {
            return Ok(out);
        }
        for s in pending.iter().filter(|s| s.claim & registry::RECOVERING == 0) {
            out.extend(recover_all(ctx, db, Which::Slot(s.slot), &[]).await?);
        }
        // Held by another recovery: taken over if it died (its lease ran
        // out).
        out.extend(recover_all(ctx, db, Which::Expired, &[]).await?);
        if now_ms(ctx) > until {
            let p: Vec<String> = pending.iter().map(|s| format!("{} (pid {})", s.slot, s.pid)).collect();
            return Err(crate::DtxError::Config(format!(
                "registry slots {} of the earlier epoch are still claimed after {wait_ms} ms (another compute blade \
                 recovering them)",
                p.join(", ")
            )));
        }
        ctx.sleep_ns(20_000_000).await;
    }
}

async fn recover_all(ctx: &Ctx, db: &Db, which: Which, lost: &[u16]) -> Result<Vec<Recovered>> {
    // Lock words on the blades a failover took out are lost too; a joining
    // blade's copies are written (restores reach them) but not read: its
    // copies may not be made yet.
    let lost: Vec<u16> = lost.iter().chain(&db.lost).chain(&db.joining).copied().collect();
    let lost = &lost[..];
    let now = now_ms(ctx);
    let mut out = Vec::new();
    for s in slots(ctx, db).await? {
        let dead = match which {
            Which::Expired => s.claim != 0 && s.expiry_ms.saturating_add(GRACE_MS) < now,
            Which::Slot(i) => s.slot == i && s.claim != 0,
        };
        if !dead {
            continue;
        }
        let at = db.registry_slot(s.slot);
        let mine = s.nonce() | registry::RECOVERING;
        if ctx.cas(at, s.claim, mine).await? != s.claim {
            continue; // claimed by another recovery, or renewed
        }
        // Hold the slot against other recoveries while this one runs.
        ctx.write(at.add(8), &(now_ms(ctx) + HOLD_MS).to_le_bytes()).await?;
        // Before anything is repaired: no verb of the dead compute blade
        // runs on a memory blade from here on (where the backend can
        // refuse them).
        let fenced = ctx.revoke(s.nonce())?;
        out.push(recover_slot(ctx, db, &s, lost, fenced).await?);
        ctx.write(at.add(8), &now_ms(ctx).to_le_bytes()).await?;
        if ctx.cas(at, mine, 0).await? == mine {
            crate::mirror::unregister(ctx, db, s.slot, s.nonce()).await?;
        }
    }
    Ok(out)
}

/// A valid log entry's items: (table, old state, key, old version, loc,
/// old value).
struct EntryItem {
    table: u32,
    old_state: u8,
    /// The replica (as created) whose copy held the lock: the primary in
    /// use when the transaction ran ([`Db::without`]).
    primary: usize,
    key: u64,
    old_version: u64,
    loc: [GlobalAddr; MAX_REPLICAS],
    value: Vec<u8>,
}

fn parse_entry(e: &[u8], nonce: u64, db: &Db) -> Option<(u64, Vec<EntryItem>)> {
    let w = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
    if w(0) != log::MAGIC || w(8) != nonce {
        return None;
    }
    let (items, len) = ((w(32) & 0xffff_ffff) as usize, (w(32) >> 32) as usize);
    let item_bytes = log::ITEM_HEADER + layout::value_cap(db.max_value);
    if items > log::MAX_WRITES || len != log::HEADER + items * item_bytes || len > e.len() {
        return None;
    }
    if u32::from_le_bytes(e[40..44].try_into().expect("4 bytes")) != log::crc(&e[..len]) {
        return None;
    }
    let mut out = Vec::with_capacity(items);
    for k in 0..items {
        let o = log::HEADER + k * item_bytes;
        let (table, vs) = ((w(o) & 0xffff_ffff) as u32, w(o + 24) as usize);
        let primary = ((w(o) >> 40) & 0xff) as usize;
        if table as usize >= db.tables.len() || vs != db.table(table).value_size || primary >= db.replicas {
            return None;
        }
        out.push(EntryItem {
            table,
            old_state: (w(o) >> 32) as u8,
            primary,
            key: w(o + 8),
            old_version: w(o + 16),
            loc: std::array::from_fn(|r| GlobalAddr::from_raw(w(o + 32 + 8 * r))),
            value: e[o + log::ITEM_HEADER..o + log::ITEM_HEADER + vs].to_vec(),
        });
    }
    Some((w(24), out))
}

async fn recover_slot(ctx: &Ctx, db: &Db, s: &SlotInfo, lost: &[u16], fenced: Fencing) -> Result<Recovered> {
    let mut rep = Recovered {
        slot: s.slot,
        pid: s.pid,
        entries: 0,
        rolled_back: 0,
        rolled_forward: 0,
        released: 0,
        log_lost: false,
        chains_cut: 0,
        fenced,
    };
    let entry_bytes = log::entry_bytes(db.max_value);
    let on_lost = |a: GlobalAddr| lost.contains(&a.blade());
    // The first copy of the log on a blade not lost: every entry that
    // matters is on each copy (a transaction writes its records only once
    // its entry landed on all of them); a copy may lack the entry of a
    // transaction that died while logging, which wrote nothing.
    let areas = s.log_areas(ctx, db)?;
    let area = areas.iter().copied().find(|(at, _)| !on_lost(*at));
    rep.log_lost = !areas.is_empty() && area.is_none();
    if let Some((at, bytes)) = area {
        let mut area = vec![0u8; bytes as usize];
        ctx.read_all(at, &mut area).await?;
        for e in area.chunks(entry_bytes) {
            let Some((lw, items)) = parse_entry(e, s.nonce(), db) else { continue };
            rep.entries += 1;
            // Whether each item's primary still holds the lock (None: the
            // primary was on a lost blade, and its lock word with it).
            let mut held = Vec::with_capacity(items.len());
            for it in &items {
                let holder = it.loc[it.primary];
                held.push(if on_lost(holder) {
                    None
                } else {
                    Some(ctx.read_u64(holder.add(layout::LOCK)).await? == lw)
                });
            }
            let known: Vec<bool> = held.iter().flatten().copied().collect();
            let back = if known.is_empty() {
                // Every primary was lost: did the writes finish?
                unfinished(ctx, db, &items, lost).await?
            } else {
                known.iter().all(|h| *h)
            };
            if back && !items.is_empty() {
                for it in &items {
                    restore(ctx, db, it, lw).await?;
                }
                rep.rolled_back += 1;
            } else if known.iter().any(|h| *h) {
                rep.rolled_forward += 1;
            }
            for (it, h) in items.iter().zip(&held) {
                let holder = it.loc[it.primary];
                if *h != Some(false) && db.uses(holder.blade()) {
                    ctx.cas(holder.add(layout::LOCK), lw, 0).await?;
                }
            }
        }
    }
    for t in &db.tables {
        let mut locks = Vec::new();
        let found = &mut |v: &SlotView<'_>| {
            let lock = layout::lock_of(v.recs[0]);
            if Owner::of(lock).is_some_and(|o| o.blade == s.slot) {
                locks.push((v.primary(), lock));
            }
        };
        // On every replica read, each walked on its own: a lock is taken
        // on the primary in use, which a view change moves (a backup
        // promoted while a blade is out, `Db::without`; replica 0 primary
        // again once it is back), and the registration may have run under
        // another view than this one. Backups' lock words are 0.
        for v in 0..t.live {
            scan_past(ctx, &t.replica_only(v), 1, &mut *found, |_| {
                rep.chains_cut += 1;
                Ok(())
            })
            .await?;
        }
        for (at, lock) in locks {
            if ctx.cas(at.add(layout::LOCK), lock, 0).await? == lock {
                rep.released += 1;
            }
        }
    }
    Ok(rep)
}

/// Whether some surviving copy (on none of the `lost` blades) of an item of
/// a logged transaction still has the item's old version: its writes did
/// not finish.
async fn unfinished(ctx: &Ctx, db: &Db, items: &[EntryItem], lost: &[u16]) -> Result<bool> {
    for it in items {
        for at in it.loc.iter().take(db.replicas).filter(|a| !a.is_null() && !lost.contains(&a.blade())) {
            if ctx.read_u64(at.add(layout::VERSION)).await? == it.old_version {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// What [`release_orphans`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Orphans {
    /// Locks held on the tables' primaries when scanned.
    pub held: u64,
    /// Of those, released: no registered compute blade could hold them.
    pub released: u64,
    /// The first [`HELD_SHOWN`] released, to say what they were.
    pub shown: Vec<HeldLock>,
    /// Chains not scanned past a damaged link or mirror (their locks
    /// there are not seen).
    pub chains_cut: u64,
    /// What the first of them says.
    pub first_cut: Option<String>,
}

/// Whether a registered compute blade could hold lock word `w`, by the
/// registry as read: it names a claimed slot (recovering or not), and a
/// thread and coroutine within that slot's shape.
fn ownable(w: u64, slots: &[SlotInfo]) -> bool {
    Owner::of(w).is_some_and(|o| {
        slots.iter().any(|s| {
            s.slot == o.blade
                && s.claim != 0
                && u64::from(o.thread) < s.threads
                && u64::from(o.coroutine) < s.coroutines
        })
    })
}

/// Releases the locks that no compute blade can hold (in every chain, but
/// past a damaged link: see [`Orphans::chains_cut`]): words without the
/// LOCKED bit, and words naming a registry slot that is free or a thread or
/// coroutine beyond its registration's shape. No transaction writes such a
/// word (a compute blade registers before it locks, releases its locks
/// before it frees its slot, and recovery releases a dead one's before
/// freeing it), so they are damage: a backing file edited or half-restored,
/// a stray writer. A record under one is not changed, only unlocked (its
/// CRC and the audit say whether it is whole).
///
/// Safe while compute blades run: the registry is read before and after the
/// scan, and a lock is released only if neither read shows a registration
/// that could hold it. A transaction locks only after its compute blade
/// registered, so a lock it took during the scan names a slot the second
/// read shows claimed; the release is a CAS from the word scanned, which
/// the holder of a released lock could not have replaced. Locks of dead
/// compute blades whose slots are still claimed are [`recover`]'s.
///
/// # Errors
/// As [`scan`]; verb errors.
pub async fn release_orphans(ctx: &Ctx, db: &Db) -> Result<Orphans> {
    let before = slots(ctx, db).await?;
    let mut held = Vec::new();
    let (mut chains_cut, mut first_cut) = (0, None);
    for t in &db.tables {
        let found = |v: &SlotView<'_>| {
            let word = layout::lock_of(v.recs[0]);
            if word != 0 {
                let state = layout::decode(v.recs[0], t.value_size).map_or(u8::MAX, |r| r.state);
                held.push((v.primary(), HeldLock::of(t, v.recs[0], state, word)));
            }
        };
        scan_past(ctx, t, 1, found, |c| {
            chains_cut += 1;
            first_cut.get_or_insert_with(|| c.error.to_string());
            Ok(())
        })
        .await?;
    }
    let after = slots(ctx, db).await?;
    let mut out = Orphans { held: held.len() as u64, chains_cut, first_cut, ..Orphans::default() };
    for (at, lock) in held {
        if ownable(lock.word, &before) || ownable(lock.word, &after) {
            continue;
        }
        if ctx.cas(at.add(layout::LOCK), lock.word, 0).await? == lock.word {
            out.released += 1;
            if out.shown.len() < HELD_SHOWN {
                out.shown.push(lock);
            }
        }
    }
    Ok(out)
}

/// Writes an item's old image to every replica in use (the copy that held
/// the lock keeping the dead transaction's lock word, released after), at
/// [`layout::recovery_version`] of its old version. The old image of an
/// insert (a free slot) is restored as the key DELETED: once the dead
/// transaction wrote the key there, another insert into the chain may have
/// taken the next slot, and a free slot before it would end every search
/// short of it (a slot keeps its key for good).
async fn restore(ctx: &Ctx, db: &Db, it: &EntryItem, lw: u64) -> Result<()> {
    let t = db.table(it.table);
    let mut rec = vec![0u8; t.record_bytes()];
    let old_state = if it.old_state == state::FREE { state::DELETED } else { it.old_state };
    // Not a copy out of use, nor one the transaction did not know (a bucket
    // added while its blade was out has none there: 0).
    for r in (0..db.replicas).rev().filter(|r| !it.loc[*r].is_null() && db.uses(it.loc[*r].blade())) {
        let lock = if r == it.primary { lw } else { 0 };
        layout::encode(
            &mut rec,
            t.value_size,
            u64::from(it.table),
            it.key,
            it.loc[0],
            layout::recovery_version(it.old_version),
            lock,
            old_state,
            &it.value,
        );
        ctx.write_all(it.loc[r], &rec).await?;
    }
    Ok(())
}

/// A slot of a table as [`scan`] read it.
#[derive(Clone, Copy, Debug)]
pub struct SlotView<'a> {
    /// The record on each replica read (the primary's first); empty past
    /// them.
    pub recs: [&'a [u8]; MAX_REPLICAS],
    /// Where each replica's record is (null past the replicas read).
    pub at: [GlobalAddr; MAX_REPLICAS],
    /// The home bucket of the slot's chain (on the primary).
    pub chain: GlobalAddr,
    /// The slot's position in its chain (0: the home bucket's first).
    pub pos: u32,
    /// A free slot comes before this one in its chain. Free slots are
    /// always a chain's tail (inserts take the first free slot; no slot
    /// turns free again), so this is damage: of this slot, if no copy holds
    /// a row (a free slot's copy damaged); else of the free slot before it,
    /// a row lost there, and searches stop there and never reach this one.
    pub after_free: bool,
}

impl SlotView<'_> {
    /// The primary's address of the record.
    pub fn primary(&self) -> GlobalAddr {
        self.at[0]
    }
}

/// Whether a copy of a record is a free slot: all zero (a held lock word
/// on the primary is an insert's, which locks a free slot before it
/// writes it).
fn is_free(rec: &[u8]) -> bool {
    rec.iter().all(|b| *b == 0)
}

/// Calls `f` for every slot of table `t` that is not free on every one of
/// the first `replicas` replicas (read in large pieces; the primary's
/// first), following overflow chains. Every slot of a chain is visited:
/// slots after a free one are damage, and flagged
/// ([`SlotView::after_free`]).
///
/// # Errors
/// A chain that names no mirror; verb errors.
pub async fn scan<F>(ctx: &Ctx, t: &Table, replicas: usize, f: F) -> Result<()>
where
    F: FnMut(&SlotView<'_>),
{
    scan_past(ctx, t, replicas, f, |c| Err(c.error)).await.map(|_| ())
}

/// Where [`scan_past`] met a chain's damaged link or mirror.
#[derive(Debug)]
pub struct Cut {
    /// The chain's home bucket (on the primary).
    pub home: GlobalAddr,
    /// The bucket (on the primary) whose link is damaged, or that links to
    /// a bucket whose mirrors are.
    pub bucket: GlobalAddr,
    /// Its link as read.
    pub link: u64,
    /// The damage is in the next bucket's mirrors, not in the link.
    pub mirror: bool,
    /// A slot of the chain up to `bucket` is free on every replica read. A
    /// chain grows only when it has no free slot left, and a slot never
    /// turns free again: so `bucket` is the chain's last, and its link
    /// must be 0.
    pub has_free: bool,
    /// What [`scan`] fails with ([`DtxError::Corrupt`](crate::DtxError::Corrupt)).
    pub error: crate::DtxError,
}

/// [`scan`], which calls `broken` where a chain's link or mirror is
/// damaged, and goes on with the next chain if it returns `Ok`: the slots
/// past the damage are not visited.
///
/// # Errors
/// What `broken` returns; verb errors.
pub async fn scan_past<F, B>(ctx: &Ctx, t: &Table, replicas: usize, mut f: F, mut broken: B) -> Result<ChainWords>
where
    F: FnMut(&SlotView<'_>),
    B: FnMut(Cut) -> Result<()>,
{
    let bb = t.bucket_bytes();
    let mut arrays = Arrays::new(t, replicas);
    let mut chain: Vec<Vec<u8>> = vec![vec![0; bb as usize]; replicas];
    let mut words = ChainWords::default();
    while let Some((b, n)) = arrays.next(ctx, t).await? {
        for i in 0..n {
            let views: [&[u8]; MAX_REPLICAS] =
                std::array::from_fn(|r| if r < replicas { arrays.bucket(r, i) } else { &[][..] });
            let home = t.base[0].add((b + i) * bb);
            let at = std::array::from_fn(|r| if r < replicas { t.base[r].add((b + i) * bb) } else { GlobalAddr::NULL });
            let mut walk = Walk { chain: home, pos: 0, free_seen: false };
            each_slot(t, at, views, &mut walk, &mut f);
            let mut next = layout::header_of(views[0]).0;
            // The backups' links out of the bucket just visited.
            let mut back = links_of(&views, replicas);
            let (mut from, mut hops) = (home, 0);
            let mut ended = true;
            while next != 0 {
                let link = chain_within(ctx.blades(), t, home, hops).and_then(|()| {
                    stored_addr(ctx.blades(), next, bb, || format!("table {}: the next bucket after {from}", t.id))
                });
                // The next bucket and its copies, or the damage (in the
                // link, or in the copies its header names).
                let step = match link {
                    Ok(at0) => {
                        hops += 1;
                        ctx.read(at0, &mut chain[0]).await?;
                        overflow_copies(ctx.blades(), t, replicas, &chain[0], (0, at0), &[])
                            .map(|at| (at0, at))
                            .map_err(|e| (true, e))
                    }
                    Err(e) => Err((false, e)),
                };
                let (at0, at) = match step {
                    Ok(s) => s,
                    Err((mirror, error)) => {
                        let has_free = walk.free_seen;
                        broken(Cut { home, bucket: from, link: next, mirror, has_free, error })?;
                        ended = false;
                        break;
                    }
                };
                let nx = layout::header_of(&chain[0]).0;
                for r in 1..replicas {
                    ctx.read(at[r], &mut chain[r]).await?;
                }
                let views: [&[u8]; MAX_REPLICAS] =
                    std::array::from_fn(|r| if r < replicas { &chain[r][..] } else { &[][..] });
                words.check(&back, &at, &views, replicas);
                each_slot(t, at, views, &mut walk, &mut f);
                back = links_of(&views, replicas);
                (from, next) = (at0, nx);
            }
            if ended {
                // The primary's chain ends here: so do the backups'.
                words.differ += back[1..replicas.max(1)].iter().filter(|l| **l != 0).count() as u64;
            }
        }
    }
    Ok(words)
}

/// How the backups' chain words (their links, and their overflow copies'
/// words naming the other copies) compare with the primary's chain, as
/// [`scan_past`] walked it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChainWords {
    /// Words that differ from what the primary's chain says (damage).
    pub differ: u64,
    /// Words that are 0 where the primary's chain says otherwise: a
    /// database made before chains were kept on every replica, or an
    /// extension cut short between its links (`recover --repair` fills
    /// them in).
    pub missing: u64,
}

impl ChainWords {
    /// Checks the backups' links `back` to, and the headers `views` of, an
    /// overflow bucket whose copies are `at`.
    fn check(
        &mut self,
        back: &[u64; MAX_REPLICAS],
        at: &[GlobalAddr; MAX_REPLICAS],
        views: &[&[u8]; MAX_REPLICAS],
        replicas: usize,
    ) {
        for r in 1..replicas {
            // The link to this copy, then the header's words naming the others.
            let want = layout::header_bytes(at[r].raw(), at, r);
            let mut got = [0u8; layout::BUCKET_HEADER as usize];
            got[..8].copy_from_slice(&back[r].to_le_bytes());
            got[8..].copy_from_slice(&views[r][8..layout::BUCKET_HEADER as usize]);
            for (g, w) in got.chunks(8).zip(want.chunks(8)) {
                match (g == w, g.iter().all(|b| *b == 0)) {
                    (true, _) => {}
                    (false, true) => self.missing += 1,
                    (false, false) => self.differ += 1,
                }
            }
        }
    }
}

/// The links of a bucket's copies (0 past `replicas`).
fn links_of(views: &[&[u8]; MAX_REPLICAS], replicas: usize) -> [u64; MAX_REPLICAS] {
    std::array::from_fn(|r| if r < replicas { layout::header_of(views[r]).0 } else { 0 })
}

/// A table's bucket arrays on some of its replicas, read in pieces of
/// about 256 KiB.
pub(crate) struct Arrays {
    bufs: Vec<Vec<u8>>,
    from: usize,
    next: u64,
    per: u64,
    bb: u64,
}

impl Arrays {
    /// Before the first piece of table `t`'s arrays on its first `replicas`
    /// replicas.
    pub(crate) fn new(t: &Table, replicas: usize) -> Arrays {
        Arrays::of(t, 0..replicas)
    }

    /// Before the first piece of table `t`'s arrays on replicas `which`.
    pub(crate) fn of(t: &Table, which: std::ops::Range<usize>) -> Arrays {
        let bb = t.bucket_bytes();
        let (from, n) = (which.start, which.len());
        Arrays { bufs: vec![Vec::new(); from + n], from, next: 0, per: (256 << 10) / bb.max(1) + 1, bb }
    }

    /// Reads the next piece: its first bucket and its number of buckets
    /// (`None` past the last).
    pub(crate) async fn next(&mut self, ctx: &Ctx, t: &Table) -> Result<Option<(u64, u64)>> {
        if self.next >= t.buckets {
            return Ok(None);
        }
        let (b, n) = (self.next, self.per.min(t.buckets - self.next));
        for (r, buf) in self.bufs.iter_mut().enumerate().skip(self.from) {
            buf.resize((n * self.bb) as usize, 0);
            ctx.read_all(t.base[r].add(b * self.bb), buf).await?;
        }
        self.next += n;
        Ok(Some((b, n)))
    }

    /// The piece read last, on replica `r`.
    pub(crate) fn piece(&self, r: usize) -> &[u8] {
        &self.bufs[r]
    }

    /// Bucket `i` of the piece read last, on replica `r`.
    pub(crate) fn bucket(&self, r: usize, i: u64) -> &[u8] {
        &self.bufs[r][(i * self.bb) as usize..((i + 1) * self.bb) as usize]
    }
}

/// Where [`scan`] is in a chain.
struct Walk {
    chain: GlobalAddr,
    pos: u32,
    free_seen: bool,
}

fn each_slot<F: FnMut(&SlotView<'_>)>(
    t: &Table,
    bucket: [GlobalAddr; MAX_REPLICAS],
    views: [&[u8]; MAX_REPLICAS],
    walk: &mut Walk,
    f: &mut F,
) {
    let rb = t.record_bytes();
    for s in 0..layout::SLOTS {
        let off = layout::slot_offset(t.value_size, s) as usize;
        let recs: [&[u8]; MAX_REPLICAS] =
            std::array::from_fn(|r| if views[r].is_empty() { &[][..] } else { &views[r][off..off + rb] });
        let free = recs.iter().all(|rec| is_free(rec));
        if free {
            walk.free_seen = true;
        } else {
            let at = bucket.map(|a| if a.is_null() { a } else { a.add(off as u64) });
            f(&SlotView { recs, at, chain: walk.chain, pos: walk.pos, after_free: walk.free_seen });
        }
        walk.pos += 1;
    }
}

/// The audit of a quiescent database (no transaction running).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditReport {
    /// Visible rows per table.
    pub live: Vec<u64>,
    /// Locks held (a quiescent database holds none).
    pub locks_held: u64,
    /// Backup copies that differ from their primary (outside the primary's
    /// lock word; a backup's is always 0).
    pub replica_mismatches: u64,
    /// Records that fail their CRC.
    pub torn: u64,
    /// Rows after a free slot of their chain, which no search reaches (see
    /// [`SlotView::after_free`]).
    pub gaps: u64,
    /// The backups' chain words against the primary's chain (see
    /// [`ChainWords`]); those that differ are violations.
    pub chain_words: ChainWords,
    /// The first [`HELD_SHOWN`] locks held, to say whose they are.
    pub held: Vec<HeldLock>,
    /// The mirrors on the other blades against the catalog and the registry (see
    /// [`crate::mirror::check`]); what differs is a violation.
    pub mirror: crate::mirror::MirrorCheck,
}

/// How many held locks an [`AuditReport`] names.
pub const HELD_SHOWN: usize = 8;

/// A lock that a quiescent database still holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HeldLock {
    /// Table.
    pub table: u32,
    /// The slot's key (0 in a free slot).
    pub key: u64,
    /// The slot's state (see [`layout::state`]).
    pub state: u8,
    /// The lock word.
    pub word: u64,
    /// Its owner (none if the word is not a lock word).
    pub owner: Option<Owner>,
}

impl HeldLock {
    /// Lock word `word` of record `rec` of table `t`, whose state is `state`
    /// (`u8::MAX` if the record fails its check).
    fn of(t: &Table, rec: &[u8], state: u8, word: u64) -> HeldLock {
        HeldLock { table: t.id, key: layout::key_of(rec).0, state, word, owner: Owner::of(word) }
    }
}

impl AuditReport {
    /// Violations: locks held, replicas that differ, torn records, records
    /// after a gap, backup chain words that differ.
    pub fn violations(&self) -> u64 {
        self.locks_held
            + self.replica_mismatches
            + self.torn
            + self.gaps
            + self.chain_words.differ
            + self.mirror.violations()
    }
}

/// Audits every table: replicas agree (records and chains), no lock held,
/// every record intact;
/// calls `row(table, key, value)` for every visible row (to check the
/// application's invariants).
///
/// # Errors
/// Verb errors.
pub async fn audit<F: FnMut(u32, u64, &[u8])>(ctx: &Ctx, db: &Db, mut row: F) -> Result<AuditReport> {
    let mut rep = AuditReport { live: vec![0; db.tables.len()], ..AuditReport::default() };
    for t in &db.tables {
        let found = |v: &SlotView<'_>| {
            let rb = t.record_bytes();
            let (p, recs) = (v.recs[0], v.recs);
            if v.after_free && crate::repair::row_key(t, v).is_some() {
                rep.gaps += 1;
            }
            let word = layout::lock_of(p);
            let rec = layout::decode(p, t.value_size);
            if word != 0 {
                rep.locks_held += 1;
                if rep.held.len() < HELD_SHOWN {
                    let state = rec.as_ref().map_or(u8::MAX, |r| r.state);
                    rep.held.push(HeldLock::of(t, p, state, word));
                }
            }
            for (r, copy) in recs.iter().enumerate().take(db.replicas).skip(1) {
                if crate::repair::differs(copy, p, r, rb) {
                    rep.replica_mismatches += 1;
                }
            }
            match rec {
                Ok(rec) if rec.state == state::LIVE => {
                    rep.live[t.id as usize] += 1;
                    row(t.id, rec.key, rec.value);
                }
                Ok(_) => {}
                Err(_) => rep.torn += 1,
            }
        };
        let words = scan_past(ctx, t, db.replicas, found, |c| Err(c.error)).await?;
        rep.chain_words.differ += words.differ;
        rep.chain_words.missing += words.missing;
    }
    rep.mirror = crate::mirror::check(ctx, db).await?;
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::Table;

    fn db() -> Db {
        let t = Table::new(0, 8, 1, [GlobalAddr::new(0, 4096); MAX_REPLICAS], MAX_REPLICAS);
        Db {
            name: "t".into(),
            tables: vec![t],
            replicas: 2,
            blades: 2,
            registry: GlobalAddr::new(0, 8192),
            max_value: 8,
            lost: Vec::new(),
            joining: Vec::new(),
            mirror: None,
        }
    }

    /// An entry of one item as `Txn` writes it.
    fn entry(nonce: u64) -> Vec<u8> {
        let item = log::ITEM_HEADER + 8;
        let len = log::HEADER + item;
        let mut e = vec![0u8; log::entry_bytes(8)];
        let put = |e: &mut [u8], i: usize, v: u64| e[i..i + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut e, 0, log::MAGIC);
        put(&mut e, 8, nonce);
        put(&mut e, 16, 7);
        put(&mut e, 24, 0xabcd | 1);
        put(&mut e, 32, 1 | (len as u64) << 32);
        let o = log::HEADER;
        put(&mut e, o, u64::from(state::LIVE) << 32);
        put(&mut e, o + 8, 42);
        put(&mut e, o + 16, 3);
        put(&mut e, o + 24, 8);
        put(&mut e, o + 32, GlobalAddr::new(0, 4096 + 32).raw());
        put(&mut e, o + 40, GlobalAddr::new(1, 4096 + 32).raw());
        put(&mut e, o + 64, 99);
        let c = log::crc(&e[..len]);
        e[40..44].copy_from_slice(&c.to_le_bytes());
        e
    }

    #[test]
    fn log_entries_parse_only_when_whole_and_ours() {
        let db = db();
        let e = entry(5);
        let (lw, items) = parse_entry(&e, 5, &db).expect("a valid entry");
        assert_eq!(lw, 0xabcd | 1);
        assert_eq!((items[0].key, items[0].old_version, items[0].old_state), (42, 3, state::LIVE));
        assert_eq!(items[0].loc[1], GlobalAddr::new(1, 4096 + 32));
        assert_eq!(items[0].value, 99u64.to_le_bytes());
        // Another registration's entry, a torn one, a foreign table: ignored.
        assert!(parse_entry(&e, 6, &db).is_none());
        for off in [16, 24, log::HEADER + 8, log::HEADER + 64] {
            let mut t = e.clone();
            t[off] ^= 1;
            assert!(parse_entry(&t, 5, &db).is_none(), "change at {off} not caught");
        }
        let mut t = e.clone();
        t[log::HEADER] = 1; // table 1 does not exist
        let c = log::crc(&t[..log::HEADER + log::ITEM_HEADER + 8]);
        t[40..44].copy_from_slice(&c.to_le_bytes());
        assert!(parse_entry(&t, 5, &db).is_none());
    }
}
