//! Rebuilding a lost memory blade's copies from the other replicas.
//!
//! A memory blade that is lost (restarted without its backing file, or
//! replaced) takes with it its copies of the tables placed on it: the
//! bucket arrays and overflow buckets of the tables whose primary or backup
//! it held, and the undo logs of the compute blades registered on it. Every
//! record and every chain has copies on other blades (k ≥ 2), so the lost
//! ones can be written again, **in place**: on a fresh blade adopted in the
//! lost one's place ([`smart_core::Ctx::adopt_blade`]), whose heap is first
//! marked in use up to the end of what the database had there
//! ([`extents_on`], [`smart_core::Ctx::reserve_heap`]), every copy goes back
//! to the address it had, so no address stored anywhere changes.
//!
//! [`rebuild`] copies each lost bucket array and overflow bucket from a
//! surviving replica (walking the chains on it, which every replica keeps),
//! lock words cleared (the locks of dead transactions on a lost primary
//! are lost with it: recovery decides those transactions by what survives,
//! see [`crate::recovery::recover_after_loss`]), each copy's chain words
//! its own.
//!
//! Blade 0 also held the catalog, the registry and the named roots: a
//! rebuild of blade 0 first writes them back from the database's mirror on
//! another blade ([`crate::mirror::restore`]).
//!
//! Several blades lost together are rebuilt at once, each copy from a
//! replica on none of them: with k replicas, any k − 1 blades (blade 0's
//! catalog and registry come back from the mirrors on a blade that was not
//! lost, see [`crate::mirror`]). A table all of whose copies were on the
//! lost blades is refused by name.
//!
//! Limits: a database with one replica cannot be rebuilt; a chain whose
//! surviving copies do not link (a database made before chains were kept on
//! every replica, whose primary was lost) is reported and not rebuilt past
//! that point.

use smart_core::{Ctx, GlobalAddr};

use crate::db::{overflow_copies, stored_addr, Db, Table};
use crate::error::{DtxError, Result};
use crate::layout::{self, MAX_REPLICAS, SLOTS};
use crate::recovery::Arrays;
use crate::registry::slots;

/// What [`rebuild`] wrote on the lost blades.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rebuilt {
    /// Bucket arrays written again (a table's copy on the lost blade).
    pub arrays: u64,
    /// Overflow buckets written again.
    pub overflow: u64,
    /// Of those, the ones that had no copy on the lost blade (added while
    /// it was out of the configuration): allocated there now.
    pub added: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Copies of registry slots' undo log areas that were on a lost blade,
    /// written again.
    pub log_areas: u64,
    /// Of those, the ones copied from a surviving copy (the others were
    /// written empty: every copy was lost, and a dead compute blade's
    /// entries with them).
    pub log_copies: u64,
}

/// The replicas of table `t` on the `lost` blades, and the one to copy
/// them from (the first on none of them); `None` if it has none there.
///
/// # Errors
/// [`DtxError::Config`] if every replica was on a lost blade.
fn lost_and_source(db: &Db, t: &Table, lost: &[u16]) -> Result<Option<(Vec<usize>, usize)>> {
    let on_lost: Vec<usize> = (0..db.replicas).filter(|r| lost.contains(&t.base[*r].blade())).collect();
    if on_lost.is_empty() {
        return Ok(None);
    }
    let Some(s) = (0..db.replicas).find(|r| !lost.contains(&t.base[*r].blade())) else {
        return Err(DtxError::Config(format!(
            "database {}: every copy of table {} ({} replicas, on memory blades {}) was on the lost blades: its \
             records are lost",
            db.name,
            t.id,
            db.replicas,
            blade_list(&t.base[..db.replicas].iter().map(|b| b.blade()).collect::<Vec<_>>())
        )));
    };
    Ok(Some((on_lost, s)))
}

/// Blade indexes as a list for messages and `--lost`: `1,2`.
pub fn blade_list(blades: &[u16]) -> String {
    blades.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
}

/// The copies of registry slots' undo log areas that are on the `lost`
/// blades, each with a copy on a blade not lost to write it from (`None`
/// if every copy was lost).
async fn logs_on(ctx: &Ctx, db: &Db, lost: &[u16]) -> Result<Vec<(GlobalAddr, u64, Option<GlobalAddr>)>> {
    let mut out = Vec::new();
    for s in slots(ctx, db).await? {
        let areas = s.log_areas(ctx, db)?;
        let source = areas.iter().find(|(a, _)| !lost.contains(&a.blade())).map(|(a, _)| *a);
        out.extend(areas.iter().filter(|(a, _)| lost.contains(&a.blade())).map(|(a, b)| (*a, *b, source)));
    }
    Ok(out)
}

/// Every chain of table `t`, as the copies of each bucket (the home bucket
/// first), walked on replica `s` (which has none on a lost blade). Calls
/// `f(chain)` per home bucket whose chain has an overflow bucket. A copy on
/// a `lost` blade that a header names as 0 (a bucket added while that
/// blade was out of the configuration: [`crate::db::Db::without`]) is
/// [`GlobalAddr::NULL`].
async fn chains<F>(ctx: &Ctx, t: &Table, replicas: usize, s: usize, lost: &[u16], mut f: F) -> Result<()>
where
    F: FnMut(&[[GlobalAddr; MAX_REPLICAS]]),
{
    let bb = t.bucket_bytes();
    let mut arrays = Arrays::of(t, s..s + 1);
    let mut header = [0u8; layout::BUCKET_HEADER as usize];
    while let Some((b, n)) = arrays.next(ctx, t).await? {
        for i in 0..n {
            let home = t.base[0].add((b + i) * bb);
            let mut chain = vec![t.array_mirrors(home, replicas)];
            let mut next = layout::header_of(arrays.bucket(s, i)).0;
            while next != 0 {
                crate::db::chain_within(ctx.blades(), t, home, chain.len() as u64 - 1)?;
                let at = stored_addr(ctx.blades(), next, bb, || {
                    format!("table {}: replica {s}'s next bucket after {}", t.id, chain[chain.len() - 1][s])
                })?;
                ctx.read(at, &mut header).await?;
                chain.push(overflow_copies(ctx.blades(), t, replicas, &header, (s, at), lost)?);
                next = layout::header_of(&header).0;
            }
            if chain.len() > 1 {
                f(&chain);
            }
        }
    }
    Ok(())
}

/// The end (an offset) of what database `db` has on each of the `lost`
/// blades (in that order): its bucket arrays, overflow buckets and undo log
/// areas there (the log areas as the registry on blade 0 names them); 0
/// where nothing.
///
/// # Errors
/// [`DtxError::Config`] if the database has one replica, or a table kept
/// every copy on the lost blades; a chain that cannot be walked on a
/// surviving replica; verb errors.
pub async fn extents_on(ctx: &Ctx, db: &Db, lost: &[u16]) -> Result<Vec<u64>> {
    refuse_unrebuildable(db, lost)?;
    let mut end = vec![0; lost.len()];
    let mut grow = |at: GlobalAddr, bytes: u64| {
        if let Some(i) = lost.iter().position(|b| *b == at.blade()) {
            end[i] = end[i].max(at.offset() + bytes);
        }
    };
    for t in &db.tables {
        let Some((on_lost, s)) = lost_and_source(db, t, lost)? else { continue };
        let bb = t.bucket_bytes();
        for r in on_lost {
            grow(t.base[r], t.buckets * bb);
        }
        chains(ctx, t, db.replicas, s, lost, |chain| {
            for c in chain.iter().flatten().filter(|c| !c.is_null()) {
                grow(*c, bb);
            }
        })
        .await?;
    }
    for (at, bytes, _) in logs_on(ctx, db, lost).await? {
        grow(at, bytes);
    }
    Ok(end)
}

fn refuse_unrebuildable(db: &Db, lost: &[u16]) -> Result<()> {
    if db.replicas < 2 {
        return Err(DtxError::Config(format!(
            "database {} keeps one copy of each record (--replicas 1): what was on memory blades {} is lost",
            db.name,
            blade_list(lost)
        )));
    }
    Ok(())
}

/// Writes what database `db` had on the `lost` blades again, in place, from
/// the other replicas (see the module docs). The blades must have been
/// adopted and their heaps reserved past [`extents_on`]. No compute blade
/// may run on the database meanwhile.
///
/// # Errors
/// As [`extents_on`]; verb errors. Idempotent: run again after a failure.
pub async fn rebuild(ctx: &Ctx, db: &Db, lost: &[u16]) -> Result<Rebuilt> {
    refuse_unrebuildable(db, lost)?;
    let mut out = Rebuilt::default();
    for t in &db.tables {
        let Some((on_lost, s)) = lost_and_source(db, t, lost)? else { continue };
        let bb = t.bucket_bytes();
        // The arrays: the source's buckets, lock words and headers cleared
        // (the chain words are written below).
        let mut arrays = Arrays::of(t, s..s + 1);
        while let Some((b, _)) = arrays.next(ctx, t).await? {
            let mut piece = arrays.piece(s).to_vec();
            for bucket in piece.chunks_mut(bb as usize) {
                clear_for_copy(t, bucket);
            }
            for r in &on_lost {
                ctx.write_all(t.base[*r].add(b * bb), &piece).await?;
                out.bytes += piece.len() as u64;
            }
        }
        out.arrays += on_lost.len() as u64;
        // The chains: overflow buckets, and the links to them.
        let mut work = Vec::new();
        chains(ctx, t, db.replicas, s, lost, |chain| work.push(chain.to_vec())).await?;
        let mut bucket = vec![0u8; bb as usize];
        for mut chain in work {
            // A bucket added while the lost blade was out has no copy
            // there: one is allocated now, and every copy's header names
            // it.
            let mut added = vec![false; chain.len()];
            for (j, copies) in chain.iter_mut().enumerate().skip(1) {
                for r in &on_lost {
                    if copies[*r].is_null() {
                        copies[*r] = ctx.alloc(t.base[*r].blade(), bb, 64).await?;
                        added[j] = true;
                        out.added += 1;
                    }
                }
            }
            for (j, copies) in chain.iter().enumerate().skip(1).filter(|(j, _)| added[*j]) {
                let link = |r: usize| chain.get(j + 1).map_or(0, |n| n[r].raw());
                for r in (0..db.replicas).filter(|r| !on_lost.contains(r)) {
                    ctx.write(copies[r], &layout::header_bytes(link(r), copies, r)).await?;
                    if on_lost.contains(&0) {
                        // Its records name their copy on replica 0 as their
                        // home: the one made now.
                        rehome(ctx, t, copies[r], copies[0], &mut bucket).await?;
                    }
                }
            }
            for (j, copies) in chain.iter().enumerate() {
                let link = |r: usize| chain.get(j + 1).map_or(0, |n| n[r].raw());
                if j == 0 {
                    // A home bucket (its records came with the array): only
                    // its link.
                    for r in &on_lost {
                        ctx.write(copies[*r], &link(*r).to_le_bytes()).await?;
                    }
                    continue;
                }
                ctx.read(copies[s], &mut bucket).await?;
                clear_for_copy(t, &mut bucket);
                for r in &on_lost {
                    bucket[..layout::BUCKET_HEADER as usize].copy_from_slice(&layout::header_bytes(
                        link(*r),
                        copies,
                        *r,
                    ));
                    ctx.write_all(copies[*r], &bucket).await?;
                    out.overflow += 1;
                    out.bytes += bb;
                }
            }
        }
    }
    // Each lost copy of an undo log from a surviving one (so that a compute
    // blade that dies later is recovered from any copy), or zeros where
    // every copy was lost (its entries are lost: recovery says so).
    for (at, bytes, source) in logs_on(ctx, db, lost).await? {
        let mut area = vec![0u8; bytes as usize];
        if let Some(src) = source {
            ctx.read_all(src, &mut area).await?;
            out.log_copies += 1;
        }
        ctx.write_all(at, &area).await?;
        out.log_areas += 1;
    }
    Ok(out)
}

/// Rewrites the records of the bucket copy at `at` to name their copies in
/// the bucket at `home` (on replica 0) as their home (a bucket added while
/// replica 0's blade was out named none).
async fn rehome(ctx: &Ctx, t: &Table, at: GlobalAddr, home: GlobalAddr, bucket: &mut [u8]) -> Result<()> {
    ctx.read(at, bucket).await?;
    let rb = t.record_bytes();
    let mut rec = vec![0u8; rb];
    for slot in 0..SLOTS {
        let off = layout::slot_offset(t.value_size, slot);
        let Ok(r) = layout::decode(&bucket[off as usize..off as usize + rb], t.value_size) else { continue };
        if r.state == layout::state::FREE {
            continue;
        }
        let value = r.value.to_vec();
        layout::encode(&mut rec, t.value_size, r.table, r.key, home.add(off), r.version, r.lock, r.state, &value);
        ctx.write(at.add(off), &rec).await?;
    }
    Ok(())
}

/// A bucket read from one replica, made ready to be another's copy: its
/// header cleared and its records' lock words (a backup's are 0; a lost
/// primary's held locks are lost).
fn clear_for_copy(t: &Table, bucket: &mut [u8]) {
    bucket[..layout::BUCKET_HEADER as usize].fill(0);
    for slot in 0..SLOTS {
        let at = (layout::slot_offset(t.value_size, slot) + layout::LOCK) as usize;
        bucket[at..at + 8].fill(0);
    }
}
