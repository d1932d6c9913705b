//! Repair of damaged records and chains from their other replicas.
//!
//! Every record has k copies (the primary and k − 1 backups), written
//! together by every commit and every recovery: when no transaction is in
//! flight on a record, its copies are equal. Copies that differ, or one
//! that fails its check, are damage (a backing file edited or half-restored
//! from an older copy, a stray writer). [`repair`] finds such records and,
//! where the copies can say what the record was, writes it back to the
//! others:
//!
//! - a copy **counts** if it passes its CRC and is this slot's: its table,
//!   and its primary address (`home`, which every copy records) are the
//!   slot's. A free copy (all zero) counts as a free slot;
//! - of the counting copies that hold a row, the one of the **highest
//!   version** wins: a record's version counts its writes (commits and
//!   recoveries both raise it), so it is the latest. Two such copies of the
//!   same version that differ cannot be told apart: not repaired;
//! - when no copy holds a row and one is free, or a free slot comes before
//!   it in its chain (so it held no row: rows never follow a free slot), the
//!   slot is made free again, but only if no row follows it in its chain
//!   (free slots are always a chain's tail: a free slot before a row would
//!   end searches short of it);
//! - when every copy fails, but each in other words (bit rot, stray
//!   writes), the record is rebuilt word by word: of the combinations of
//!   the copies' words, the one that passes the check, as a row (a
//!   CRC-32C, so a wrong one passes with odds of 2^-32 per try; at most 256
//!   are tried) or as a free slot (then made free, at its chain's tail, as
//!   above). Two combinations that pass: not repaired;
//! - otherwise, when no copy counts, the record is lost: not repaired,
//!   reported.
//!
//! The winner is written to every copy that differs from it (outside the
//! lock word) while the repair holds the primary's lock, taken like a
//! transaction's (a lock word naming the repair's own registration), so a
//! repair may run beside transactions: a record whose lock is held is left
//! alone and reported (run the repair again). A repair that dies leaves its
//! locks to recovery, like any compute blade.
//!
//! **Chains** first: every replica keeps the chain (see [`crate::layout`]):
//! each copy of a bucket links to the next bucket's copy on its replica,
//! and each copy of an overflow bucket names the others. Walking the
//! chains of all replicas together, each link and each header is a witness
//! of where the chain goes; the copies that most witnesses name (at least
//! two, and more than any other candidate) are written to every link and
//! header that differs (the primary's link by CAS). A backup's link or
//! header that is 0 is filled in, not counted as damage (a database made
//! before chains were kept on every replica, or an extension cut short
//! between its links). A primary link that nothing explains is set to 0
//! when a slot of the chain is free: a chain grows only when it is full,
//! so such a bucket is its last.
//!
//! Not repaired: a record after a gap (a free slot earlier in its chain,
//! whose lost row no copy names); a link, or an overflow bucket's copy
//! word, damaged on every replica, and the damaged primary link of a full
//! bucket whose backups say the chain ends there (an extension cut short
//! between its links leaves the same backups: not guessed), past which
//! the chain is not checked; the catalog and the registry.

use std::collections::HashMap;

use smart_core::{Ctx, GlobalAddr};

use crate::db::{chain_within, stored_addr, Db, Table};
use crate::error::{DtxError, Result};
use crate::layout::{self, state, Owner, BUCKET_HEADER, MAX_REPLICAS};
use crate::recovery::{scan_past, Arrays, SlotView, HELD_SHOWN};
use crate::registry::Registration;

/// What [`repair`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Repaired {
    /// Records whose copies differed, or one of which failed its check.
    pub damaged: u64,
    /// Of those, repaired: every copy now holds the winner.
    pub repaired: u64,
    /// Copies rewritten by the repairs.
    pub copies_rewritten: u64,
    /// Damaged records left alone because a transaction held their lock.
    pub busy: u64,
    /// Damaged records that no copy could restore.
    pub unrepairable: u64,
    /// Rows after a free slot of their chain (see
    /// [`SlotView::after_free`]): not repaired.
    pub gaps: u64,
    /// Damaged chain words repaired: links and copy words set to what the
    /// other replicas' chains say, and primary links of buckets that have a
    /// free slot set to 0 (the chain ends there: see
    /// [`Cut::has_free`](crate::recovery::Cut::has_free)).
    pub links_repaired: u64,
    /// Chain words of backups that were missing (0), written: a database
    /// made before chains were kept on every replica, or an extension cut
    /// short between the primary's link and the backups'. Not damage.
    pub links_filled: u64,
    /// Chains whose link or copy word is damaged, and not repaired: their
    /// slots past it are not checked.
    pub chains_cut: u64,
    /// The first [`HELD_SHOWN`] records not repaired, and why.
    pub left: Vec<LeftDamaged>,
}

impl Repaired {
    /// Damage the repair left: records busy, unrepairable, or after a gap,
    /// and chains cut.
    pub fn left_damaged(&self) -> u64 {
        self.busy + self.unrepairable + self.gaps + self.chains_cut
    }

    /// Names damage left, among the first [`HELD_SHOWN`].
    fn leave(&mut self, table: u32, at: GlobalAddr, key: Option<u64>, why: String) {
        if self.left.len() < HELD_SHOWN {
            self.left.push(LeftDamaged { table, at: at.to_string(), key, why });
        }
    }
}

/// Damage that [`repair`] did not repair.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LeftDamaged {
    /// Table.
    pub table: u32,
    /// The primary copy's address (of a cut chain: its home bucket).
    pub at: String,
    /// Its key, if a copy that counts names it.
    pub key: Option<u64>,
    /// Why it was not repaired.
    pub why: String,
}

/// What one copy of a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Says {
    /// A free slot.
    Free,
    /// A row (live or deleted) of this version.
    Row(u64),
    /// Fails its CRC, or is another slot's record.
    Bad,
}

/// What copy `rec` of the record whose primary is at `primary` says.
pub(crate) fn copy_of(t: &Table, rec: &[u8], primary: GlobalAddr) -> Says {
    match layout::decode(rec, t.value_size) {
        Ok(r) if r.state == state::FREE => Says::Free,
        Ok(r) if r.table == u64::from(t.id) && r.home == primary.raw() && r.value.len() == t.value_size => {
            Says::Row(r.version)
        }
        _ => Says::Bad,
    }
}

/// Whether two copies of a record of `rb` bytes are equal outside the lock
/// word.
fn same(a: &[u8], b: &[u8], rb: usize) -> bool {
    a[..layout::LOCK as usize] == b[..layout::LOCK as usize]
        && a[layout::RECORD_HEADER..rb] == b[layout::RECORD_HEADER..rb]
}

/// The key of the first copy of `v` that holds a row of its slot.
pub(crate) fn row_key(t: &Table, v: &SlotView<'_>) -> Option<u64> {
    v.recs
        .iter()
        .find(|c| !c.is_empty() && matches!(copy_of(t, c, v.primary()), Says::Row(_)))
        .map(|c| layout::key_of(c).0)
}

/// Whether copy `r` of a record differs from `want` (outside the primary's
/// lock word: a backup's is always 0).
pub(crate) fn differs(copy: &[u8], want: &[u8], r: usize, rb: usize) -> bool {
    !same(copy, want, rb) || (r > 0 && layout::lock_of(copy) != 0)
}

/// Whether a record whose copies are `recs` (the primary's, at `primary`,
/// first) needs a repair: a copy fails, or differs from the primary's.
fn damaged<C: AsRef<[u8]>>(t: &Table, recs: &[C], primary: GlobalAddr) -> bool {
    let rb = t.record_bytes();
    let p = recs[0].as_ref();
    recs.iter().enumerate().any(|(r, c)| copy_of(t, c.as_ref(), primary) == Says::Bad || differs(c.as_ref(), p, r, rb))
}

/// The record that wins (see the module docs), or why none does. `tail`:
/// no later slot of its chain holds a row; `after_free`: a free slot comes
/// before it (so it held no row either).
fn winner(
    t: &Table,
    copies: &[Vec<u8>],
    primary: GlobalAddr,
    tail: bool,
    after_free: bool,
) -> std::result::Result<Vec<u8>, String> {
    let rb = t.record_bytes();
    let kinds: Vec<Says> = copies.iter().map(|c| copy_of(t, c, primary)).collect();
    let best = kinds.iter().filter_map(|k| if let Says::Row(v) = k { Some(*v) } else { None }).max();
    if let Some(v) = best {
        let tops: Vec<usize> = (0..copies.len()).filter(|r| kinds[*r] == Says::Row(v)).collect();
        if let Some(other) = tops.iter().find(|r| !same(&copies[tops[0]], &copies[**r], rb)) {
            return Err(format!("copies {} and {other} both hold version {v}, and differ", tops[0]));
        }
        return Ok(copies[tops[0]].clone());
    }
    let mut free = kinds.contains(&Says::Free) || after_free;
    if !free {
        match merged(t, copies, primary) {
            Some((rec, Says::Row(_))) => return Ok(rec),
            Some(_) => free = true,
            None => {}
        }
    }
    match (free, tail) {
        (true, true) => Ok(vec![0; rb]),
        (true, false) => Err("no copy holds a row, and rows follow it in its chain: it cannot be made free".into()),
        (false, _) => Err("no copy passes its check (a row lost, or a free slot: no copy says which)".into()),
    }
}

/// Most combinations of words [`merged`] tries.
const MERGES: usize = 256;

/// A record rebuilt from copies that all fail their check, each damaged in
/// other words: every 8-byte word taken from one of the copies, the one
/// combination that passes the check (a row of this slot, or a free slot).
/// `None` if no combination does, if more than one does, or if the copies
/// differ in too many words to try them all ([`MERGES`]).
fn merged(t: &Table, copies: &[Vec<u8>], primary: GlobalAddr) -> Option<(Vec<u8>, Says)> {
    let rb = t.record_bytes();
    let lock = layout::LOCK as usize / 8;
    let word = |c: &[u8], w: usize| u64::from_le_bytes(c[8 * w..8 * w + 8].try_into().expect("8 bytes"));
    let choices: Vec<Vec<u64>> = (0..rb / 8)
        .map(|w| {
            let mut v: Vec<u64> = if w == lock { vec![0] } else { copies.iter().map(|c| word(c, w)).collect() };
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let combos = choices.iter().try_fold(1usize, |n, c| n.checked_mul(c.len()).filter(|n| *n <= MERGES))?;
    let mut found: Option<(Vec<u8>, Says)> = None;
    let mut rec = vec![0u8; rb];
    for mut k in 0..combos {
        for (w, c) in choices.iter().enumerate() {
            rec[8 * w..8 * w + 8].copy_from_slice(&c[k % c.len()].to_le_bytes());
            k /= c.len();
        }
        let kind = copy_of(t, &rec, primary);
        if kind != Says::Bad {
            if found.is_some() {
                return None;
            }
            found = Some((rec.clone(), kind));
        }
    }
    found
}

/// A damaged record found by the scan (not a row after a gap).
struct Suspect {
    at: [GlobalAddr; MAX_REPLICAS],
    chain: GlobalAddr,
    pos: u32,
    after_free: bool,
}

/// Finds the damaged records of every table of `db` and repairs those whose
/// copies can (see the module docs), holding each one's primary lock under
/// `reg`'s name while it does.
///
/// # Errors
/// [`DtxError::LeaseLost`] if `reg`'s lease may have expired (recovery may
/// then be releasing the repair's locks; run it again); as
/// [`scan`](crate::recovery::scan); verb errors.
pub async fn repair(ctx: &Ctx, db: &Db, reg: &Registration) -> Result<Repaired> {
    let owner = Owner { blade: reg.slot(), thread: 0, coroutine: 0 };
    let mut out = Repaired::default();
    let mut seq = 0u64;
    for t in &db.tables {
        if db.replicas > 1 {
            repair_chains(ctx, t, db.replicas, reg, &mut out).await?;
        }
        let mut suspects = Vec::new();
        // The last slot of every chain seen of which a copy holds a row.
        let mut last = HashMap::new();
        let found = |v: &SlotView<'_>| {
            let key = row_key(t, v);
            if key.is_some() {
                last.insert(v.chain.raw(), v.pos);
            }
            if v.after_free && key.is_some() {
                out.gaps += 1;
                let why = "a free slot comes before it in its chain: searches never reach it";
                out.leave(t.id, v.primary(), key, why.into());
            } else if damaged(t, &v.recs[..db.replicas], v.primary()) {
                suspects.push(Suspect { at: v.at, chain: v.chain, pos: v.pos, after_free: v.after_free });
            }
        };
        let mut cuts = Vec::new();
        scan_past(ctx, t, db.replicas, found, |c| {
            cuts.push(c);
            Ok(())
        })
        .await?;
        for c in cuts {
            if !c.mirror && c.has_free {
                // The chain's last bucket (see `Cut::has_free`): it links nowhere.
                if reg.lease_lost() {
                    return Err(DtxError::LeaseLost);
                }
                if ctx.cas(c.bucket, c.link, 0).await? == c.link {
                    out.links_repaired += 1;
                    continue;
                }
            }
            out.chains_cut += 1;
            // The chain's slots are not all known, nor where its free tail is.
            last.insert(c.home.raw(), u32::MAX);
            out.leave(t.id, c.home, None, c.error.to_string());
        }
        for s in suspects {
            seq += 1;
            let tail = last.get(&s.chain.raw()).is_none_or(|p| *p <= s.pos);
            repair_one(ctx, db, t, &s, owner.lock_word(seq), tail, reg, &mut out).await?;
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments, reason = "the repair's state, passed down once per record")]
async fn repair_one(
    ctx: &Ctx,
    db: &Db,
    t: &Table,
    s: &Suspect,
    lw: u64,
    tail: bool,
    reg: &Registration,
    out: &mut Repaired,
) -> Result<()> {
    let primary = s.at[0];
    let lock = primary.add(layout::LOCK);
    let rb = t.record_bytes();
    if reg.lease_lost() {
        return Err(DtxError::LeaseLost);
    }
    let held = ctx.cas(lock, 0, lw).await?;
    if held != 0 {
        out.damaged += 1;
        out.busy += 1;
        let why = format!("its lock is held (word {held:#x}): run the repair again once it is released");
        out.leave(t.id, primary, None, why);
        return Ok(());
    }
    // Read again under the lock: what the scan saw may have changed.
    let mut copies = vec![vec![0u8; rb]; db.replicas];
    for (r, c) in copies.iter_mut().enumerate() {
        ctx.read(s.at[r], c).await?;
    }
    if damaged(t, &copies, primary) {
        out.damaged += 1;
        match winner(t, &copies, primary, tail, s.after_free) {
            Ok(mut rec) => {
                let lock_at = layout::LOCK as usize;
                let mut n = 0;
                let differ: Vec<usize> = (0..db.replicas).filter(|r| differs(&copies[*r], &rec, *r, rb)).collect();
                for r in differ.into_iter().rev() {
                    if reg.lease_lost() {
                        return Err(DtxError::LeaseLost);
                    }
                    if r == 0 {
                        // Around the lock word, which stays the repair's.
                        ctx.write(primary, &rec[..lock_at]).await?;
                        ctx.write(primary.add(layout::RECORD_HEADER as u64), &rec[layout::RECORD_HEADER..]).await?;
                    } else {
                        rec[lock_at..lock_at + 8].fill(0);
                        ctx.write(s.at[r], &rec).await?;
                    }
                    n += 1;
                }
                out.repaired += 1;
                out.copies_rewritten += n;
            }
            Err(why) => {
                out.unrepairable += 1;
                let key =
                    copies.iter().find(|c| matches!(copy_of(t, c, primary), Says::Row(_))).map(|c| layout::key_of(c).0);
                out.leave(t.id, primary, key, why);
            }
        }
    }
    ctx.cas(lock, lw, 0).await?;
    Ok(())
}

/// Headers of buckets, read once each.
struct Headers<'a> {
    ctx: &'a Ctx,
    read: HashMap<u64, [u8; BUCKET_HEADER as usize]>,
}

impl Headers<'_> {
    async fn of(&mut self, at: GlobalAddr) -> Result<[u8; BUCKET_HEADER as usize]> {
        if let Some(h) = self.read.get(&at.raw()) {
            return Ok(*h);
        }
        let mut h = [0u8; BUCKET_HEADER as usize];
        self.ctx.read(at, &mut h).await?;
        self.read.insert(at.raw(), h);
        Ok(h)
    }

    /// Writes header `h` at `at` (and remembers it).
    async fn write(&mut self, at: GlobalAddr, h: [u8; BUCKET_HEADER as usize]) -> Result<()> {
        self.ctx.write(at, &h).await?;
        self.read.insert(at.raw(), h);
        Ok(())
    }
}

/// Whether link `raw` names a bucket of table `t` on one of the blades.
fn names_bucket(ctx: &Ctx, t: &Table, raw: u64) -> bool {
    raw != 0 && stored_addr(ctx.blades(), raw, t.bucket_bytes(), String::new).is_ok()
}

/// The copies of the bucket after one whose copies link to `links` (one
/// word per replica), as the replicas' chains say. Each replica's link, and
/// each copy's header (which names the other copies), is a witness; of the
/// candidates (the copies named by each valid link and the header it
/// leads to) the one with the most witnesses wins, if it has at least two
/// and no other candidate has as many. `None`: no candidate does.
async fn next_copies(
    ctx: &Ctx,
    t: &Table,
    k: usize,
    links: &[u64; MAX_REPLICAS],
    heads: &mut Headers<'_>,
) -> Result<Option<[GlobalAddr; MAX_REPLICAS]>> {
    let ok = |raw: u64| names_bucket(ctx, t, raw);
    let mut cands: Vec<[GlobalAddr; MAX_REPLICAS]> = Vec::new();
    for (r, link) in links.iter().enumerate().take(k) {
        if !ok(*link) {
            continue;
        }
        let at = GlobalAddr::from_raw(*link);
        let (_, named) = layout::copies_named(&heads.of(at).await?, r, at);
        let v: [GlobalAddr; MAX_REPLICAS] =
            std::array::from_fn(|j| if j < k { GlobalAddr::from_raw(named[j]) } else { GlobalAddr::NULL });
        let distinct = (0..k).all(|a| (a + 1..k).all(|b| v[a] != v[b]));
        if (0..k).all(|j| ok(v[j].raw())) && distinct && !cands.contains(&v) {
            cands.push(v);
        }
    }
    let mut best: Option<([GlobalAddr; MAX_REPLICAS], usize)> = None;
    let mut tie = false;
    for v in cands {
        let mut score = 0;
        for j in 0..k {
            score += usize::from(links[j] == v[j].raw());
            let (_, named) = layout::copies_named(&heads.of(v[j]).await?, j, v[j]);
            score += usize::from((0..k).all(|i| named[i] == v[i].raw()));
        }
        match best {
            Some((_, s)) if s > score => {}
            Some((_, s)) if s == score => tie = true,
            _ => {
                best = Some((v, score));
                tie = false;
            }
        }
    }
    Ok(best.filter(|(_, s)| *s >= 2 && !tie).map(|(v, _)| v))
}

/// Walks every chain of table `t` on its `k` replicas and makes every copy
/// of every link and header agree with what the replicas' chains say
/// (see [`next_copies`]). A primary link that no candidate explains is
/// left to the record scan (which ends it if its bucket has a free slot,
/// or reports the chain cut).
async fn repair_chains(ctx: &Ctx, t: &Table, k: usize, reg: &Registration, out: &mut Repaired) -> Result<()> {
    let bb = t.bucket_bytes();
    let mut heads = Headers { ctx, read: HashMap::new() };
    let mut arrays = Arrays::new(t, k);
    while let Some((b, n)) = arrays.next(ctx, t).await? {
        for i in 0..n {
            let home = t.base[0].add((b + i) * bb);
            let mut cur = t.array_mirrors(home, k);
            let link = |h: &[u8]| layout::header_of(h).0;
            let mut links: [u64; MAX_REPLICAS] =
                std::array::from_fn(|r| if r < k { link(arrays.bucket(r, i)) } else { 0 });
            let mut hops = 0;
            while links[..k].iter().any(|l| *l != 0) && chain_within(ctx.blades(), t, home, hops).is_ok() {
                hops += 1;
                heads.read.clear();
                let Some(next) = next_copies(ctx, t, k, &links, &mut heads).await? else {
                    // No candidate: a backup's link that names no bucket is
                    // never right (its chain ends here, or its next bucket
                    // is lost to it either way).
                    for r in 1..k {
                        if links[r] != 0 && !names_bucket(ctx, t, links[r]) {
                            ctx.write(cur[r], &0u64.to_le_bytes()).await?;
                            out.links_repaired += 1;
                        }
                    }
                    break;
                };
                if reg.lease_lost() {
                    return Err(DtxError::LeaseLost);
                }
                // The primary's first, by CAS: an extension of this bucket
                // CASes it from 0 (and a link that changed meanwhile ends
                // this walk).
                if links[0] != next[0].raw() {
                    if ctx.cas(cur[0], links[0], next[0].raw()).await? != links[0] {
                        break;
                    }
                    out.links_repaired += 1;
                }
                for r in 1..k {
                    if links[r] != next[r].raw() {
                        ctx.write(cur[r], &next[r].raw().to_le_bytes()).await?;
                        if links[r] == 0 {
                            out.links_filled += 1;
                        } else {
                            out.links_repaired += 1;
                        }
                    }
                }
                // The next bucket's copies name each other.
                for r in 0..k {
                    let h = heads.of(next[r]).await?;
                    let mut want = layout::header_bytes(0, &next, r);
                    want[..8].copy_from_slice(&h[..8]);
                    if want != h {
                        let missing = r > 0 && h[8..].iter().all(|b| *b == 0);
                        heads.write(next[r], want).await?;
                        if missing {
                            out.links_filled += 1;
                        } else {
                            out.links_repaired += 1;
                        }
                    }
                }
                cur = next;
                for r in 0..k {
                    links[r] = link(&heads.of(cur[r]).await?);
                }
            }
        }
    }
    Ok(())
}
