//! A database's mirrors on the other blades: what only blade 0 holds, kept
//! where a rebuild of blade 0 can find it.
//!
//! Every record and every chain has copies on k blades, but blade 0 alone
//! holds a database's catalog (where each table's replicas are), its
//! registry of compute blades (whose slots name their undo logs) and the
//! named roots that find them. Lost with blade 0, they would take the
//! whole database along, replicas and all. So each database over two or
//! more blades keeps a mirror on every other blade ([`blades`]; layout:
//! [`crate::layout::mirror`]), found by a named root `ford:NAME` there, so
//! that blade 0 can come back with any other blades lost beside it (the
//! rebuild reads the mirrors of the first blade that was not lost, and
//! finds there every database of the set, even one whose records were all
//! lost):
//! - the catalog's bytes and address, written once at creation (a catalog
//!   never changes);
//! - whether the load completed (the root `ford:NAME:loaded`);
//! - each registration: a compute blade writes its slot's copy (claim,
//!   lease length, log area, shape, pid) after claiming the slot and before
//!   its first lock; a clean exit and a recovery clear it after freeing the
//!   slot. So the mirror names every compute blade that may hold a lock.
//!
//! Lease renewals are not mirrored: after blade 0 is lost, every compute
//! blade's next renewal fails and it fences itself (see
//! [`crate::registry::Registration`]), so a rebuild waits one lease and
//! takes them all for dead.
//!
//! Under a coordinator, compute blades go on without blade 0: the mirror
//! on the first blade read stands for what blade 0 held
//! ([`Db::open_view`], [`Db::mirror`]). Its registrations are then the
//! registry: settled and freed there, new ones claimed there (each also
//! written to the other mirrors), with a lease length and no renewal (a
//! recovery's hold there is an expiry, as on blade 0). A rebuild of blade
//! 0 reads that mirror as any other. It stays the registry while a fresh
//! blade 0 joins online, until it is taken in ([`crate::rejoin`]).
//!
//! [`restore`] writes a mirror back onto a blade adopted as blade 0
//! ([`smart_core::Ctx::adopt_blades`]) at the old addresses; the tables'
//! copies there are then rebuilt as on any lost blade
//! ([`crate::rebuild`]). [`ensure`] writes the mirrors a database lacks:
//! one made before mirrors were kept, or kept on blade 1 alone, gets them
//! from its next run or `compute-blade recover --repair`, and a rebuilt
//! blade from the rebuild.

use smart_core::{Ctx, GlobalAddr};

use crate::db::{loaded_root, root_name, stored_addr, Db};
use crate::error::{DtxError, Result};
use crate::layout::{catalog, mirror, registry};
use crate::registry::SlotInfo;

/// The blades that hold mirrors: every blade but blade 0 (none over one
/// blade).
pub fn blades(ctx: &Ctx) -> std::ops::Range<u16> {
    1..ctx.blades().len() as u16
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Where database `name`'s mirror on `blade` is; `None` if it has none
/// there (one made before mirrors were kept there).
///
/// # Errors
/// [`DtxError::Corrupt`] if the root names no mirror; verb errors.
pub async fn find(ctx: &Ctx, blade: u16, name: &str) -> Result<Option<GlobalAddr>> {
    let Some(at) = ctx.root(blade, &root_name(name)).await? else { return Ok(None) };
    let at = stored_addr(ctx.blades(), at.raw(), mirror::BYTES as u64, || format!("the mirror of database {name}"))?;
    if ctx.read_u64(at).await? != mirror::MAGIC {
        return Err(DtxError::Corrupt(format!("the mirror of database {name} at {at} is not one")));
    }
    Ok(Some(at))
}

/// Writes `db`'s mirror on each blade of [`blades`] that has none; says
/// whether it wrote one. A mirror that is damaged (its root names no
/// mirror) is replaced. Under a race, one mirror wins and the others'
/// blocks are left unused. Registrations already in the registry are
/// copied with the time their lease has left as their lease.
///
/// # Errors
/// A database without its catalog root; allocation and verb errors.
pub async fn ensure(ctx: &Ctx, db: &Db) -> Result<bool> {
    let mut wrote = false;
    for blade in blades(ctx) {
        wrote |= match find(ctx, blade, &db.name).await {
            Ok(Some(_)) => false,
            Ok(None) => write(ctx, db, blade).await?,
            Err(DtxError::Corrupt(_)) => {
                ctx.drop_root(blade, &root_name(&db.name)).await?;
                write(ctx, db, blade).await?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(wrote)
}

/// Writes `db`'s mirrors anew, in place of those it has (a repair of
/// mirrors that [`check`] finds wrong); says whether these won.
///
/// # Errors
/// As [`ensure`].
pub async fn rewrite(ctx: &Ctx, db: &Db) -> Result<bool> {
    let mut won = false;
    for blade in blades(ctx) {
        ctx.drop_root(blade, &root_name(&db.name)).await?;
        won |= write(ctx, db, blade).await?;
    }
    Ok(won)
}

async fn write(ctx: &Ctx, db: &Db, blade: u16) -> Result<bool> {
    let Some(catalog_at) = ctx.root(0, &root_name(&db.name)).await? else {
        return Err(DtxError::Corrupt(format!("database {}: its root ford:{} is gone", db.name, db.name)));
    };
    let mut m = vec![0u8; mirror::BYTES];
    let loaded = ctx.root(0, &loaded_root(&db.name)).await?.is_some();
    let name = ctx.write_name(blade, &db.name).await?;
    for (i, v) in [mirror::MAGIC, catalog_at.raw(), u64::from(loaded), name.raw()].into_iter().enumerate() {
        m[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    ctx.read(catalog_at, &mut m[mirror::CATALOG..mirror::REGISTRY]).await?;
    let at = ctx.alloc(blade, mirror::BYTES as u64, 64).await?;
    ctx.write_all(at, &m).await?;
    if ctx.set_root(blade, &root_name(&db.name), at).await? != at {
        return Ok(false);
    }
    // The registrations already there, once the root is set: one that
    // comes later finds the root and writes its own copy.
    let now = crate::registry::now_ms(ctx);
    for s in crate::registry::slots(ctx, db).await? {
        if s.claim != 0 {
            let lease = s.expiry_ms.saturating_sub(now);
            ctx.write(at.add(slot_offset(s.slot) as u64), &s.bytes(s.nonce(), lease)).await?;
        }
    }
    Ok(true)
}

/// What the audit finds of a database's mirror.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MirrorCheck {
    /// Whether the database keeps its mirror on every other blade; `None`
    /// over one blade (where it has none to keep). A database made before
    /// mirrors were kept (or kept on blade 1 alone) lacks some until its
    /// next run or `compute-blade recover --repair`.
    pub present: Option<bool>,
    /// The blades without one.
    pub missing_on: Vec<u16>,
    /// A mirror is damaged, or its copy of the catalog is not the catalog
    /// (a violation: a rebuild of blade 0 would put wrong tables back).
    pub catalog_differs: bool,
    /// Registrations in the registry that a mirror does not name, counted
    /// per mirror (violations: a rebuild of blade 0 from it would not
    /// settle their transactions).
    pub registrations_missing: u64,
}

impl MirrorCheck {
    /// Its violations.
    pub fn violations(&self) -> u64 {
        u64::from(self.catalog_differs) + self.registrations_missing
    }
}

/// Checks `db`'s mirrors against blade 0: the catalog's copy, and every
/// registration in the registry named there.
///
/// # Errors
/// Verb errors.
pub async fn check(ctx: &Ctx, db: &Db) -> Result<MirrorCheck> {
    let mut out = MirrorCheck::default();
    if blades(ctx).is_empty() {
        return Ok(out);
    }
    let slots = crate::registry::slots(ctx, db).await?;
    let catalog_at = ctx.root(0, &root_name(&db.name)).await?;
    let mut c = vec![0u8; catalog::BYTES];
    if let Some(at) = catalog_at {
        ctx.read(at, &mut c).await?;
    }
    let mut m = vec![0u8; mirror::BYTES];
    for blade in blades(ctx) {
        let at = match find(ctx, blade, &db.name).await {
            Ok(Some(at)) => at,
            Ok(None) => {
                out.missing_on.push(blade);
                continue;
            }
            Err(DtxError::Corrupt(_)) => {
                out.catalog_differs = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        ctx.read_all(at, &mut m).await?;
        out.catalog_differs |=
            catalog_at.map(GlobalAddr::raw) != Some(word(&m, 8)) || c[..] != m[mirror::CATALOG..mirror::REGISTRY];
        for s in &slots {
            if s.claim != 0 && word(&m, slot_offset(s.slot)) != s.nonce() {
                out.registrations_missing += 1;
            }
        }
    }
    out.present = Some(out.missing_on.is_empty());
    Ok(out)
}

fn slot_offset(slot: u16) -> usize {
    mirror::REGISTRY + usize::from(slot) * registry::SLOT as usize
}

/// Where `db`'s mirrors are, on the blades that have one.
///
/// # Errors
/// As [`find`].
async fn all(ctx: &Ctx, db: &Db) -> Result<Vec<GlobalAddr>> {
    let mut out = Vec::new();
    for blade in blades(ctx).filter(|b| db.uses(*b)) {
        out.extend(find(ctx, blade, &db.name).await?);
    }
    Ok(out)
}

/// Records registration `s` (claim `s.claim`, a lease of `lease_ms`) in
/// `db`'s mirrors.
///
/// # Errors
/// Verb errors.
pub(crate) async fn register(ctx: &Ctx, db: &Db, s: &SlotInfo, lease_ms: u64) -> Result<()> {
    for m in all(ctx, db).await? {
        ctx.write(m.add(slot_offset(s.slot) as u64), &s.bytes(s.claim, lease_ms)).await?;
    }
    Ok(())
}

/// Whether a mirror of `db` records a registration in slot `slot`: one
/// claimed there while blade 0 was out or joining ([`Db::mirror`]) and not
/// settled yet, or one of blade 0's own between its claim there and its
/// release here. A compute blade claiming blade 0's slot `slot` leaves it
/// then, so that it never writes over the mirror's record of another
/// registration ([`crate::rejoin`]).
///
/// # Errors
/// Verb errors.
pub(crate) async fn records_slot(ctx: &Ctx, db: &Db, slot: u16) -> Result<bool> {
    for m in all(ctx, db).await? {
        if ctx.read_u64(m.add(slot_offset(slot) as u64)).await? != 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The registrations that the first of `db`'s mirrors records in a slot
/// that blade 0's registry holds free: ones claimed while the mirror stood
/// for the registry (blade 0 out, then joining: [`Db::mirror`]) that were
/// not settled when blade 0 was taken in (every compute blade of those
/// epochs and the copy died first), or one whose record outlived it (its
/// compute blade killed between freeing its slot on blade 0 and clearing
/// the mirrors). Their slots are left unused on blade 0 (`records_slot`)
/// until they are settled in a view where blade 0 joins. Empty for a
/// database opened from its mirror, and over one blade.
///
/// # Errors
/// Verb errors.
pub async fn unsettled(ctx: &Ctx, db: &Db) -> Result<Vec<u64>> {
    if db.mirror.is_some() {
        return Ok(Vec::new());
    }
    let Some(m) = all(ctx, db).await?.into_iter().next() else { return Ok(Vec::new()) };
    let mut r = vec![0u8; (registry::SLOTS * registry::SLOT) as usize];
    ctx.read_all(m.add(mirror::REGISTRY as u64), &mut r).await?;
    Ok(crate::registry::slots(ctx, db)
        .await?
        .iter()
        .filter(|s| s.claim == 0)
        .map(|s| word(&r, usize::from(s.slot) * registry::SLOT as usize) & !registry::RECOVERING)
        .filter(|n| *n != 0)
        .collect())
}

/// Clears slot `slot` in `db`'s mirrors that still record registration
/// `nonce` (after the slot was freed).
///
/// # Errors
/// Verb errors.
pub(crate) async fn unregister(ctx: &Ctx, db: &Db, slot: u16, nonce: u64) -> Result<()> {
    for m in all(ctx, db).await? {
        ctx.cas(m.add(slot_offset(slot) as u64), nonce, 0).await?;
    }
    Ok(())
}

/// Database `name` as its mirror at `at` (on blade `blade`) stands for
/// what blade 0 held ([`Db::mirror`]): its catalog's copy parsed, its
/// registrations as the registry.
///
/// # Errors
/// A catalog copy that is not one; verb errors.
pub(crate) async fn stand_in(ctx: &Ctx, at: GlobalAddr, blade: u16, name: &str) -> Result<Db> {
    let mut c = vec![0u8; catalog::BYTES];
    ctx.read(at.add(mirror::CATALOG as u64), &mut c).await?;
    let mut db = Db::parse(ctx.blades(), name, &c, &format!("the mirror of {name} on memory blade {blade}"))?;
    db.registry = at.add(mirror::REGISTRY as u64);
    db.mirror = Some(at);
    Ok(db)
}

/// Whether the database whose mirror is at `at` completed its load.
///
/// # Errors
/// Verb errors.
pub(crate) async fn loaded(ctx: &Ctx, at: GlobalAddr) -> Result<bool> {
    Ok(ctx.read_u64(at.add(mirror::LOADED as u64)).await? == 1)
}

/// Records in `db`'s mirrors that its load completed.
///
/// # Errors
/// Verb errors.
pub(crate) async fn mark_loaded(ctx: &Ctx, db: &Db) -> Result<()> {
    for m in all(ctx, db).await? {
        ctx.write(m.add(mirror::LOADED as u64), &1u64.to_le_bytes()).await?;
    }
    Ok(())
}

/// A mirror as read.
#[derive(Clone, Debug)]
pub struct Mirror {
    /// Where it is.
    pub at: GlobalAddr,
    /// The database, as its catalog's copy says.
    pub db: Db,
    /// Where the catalog was (on blade 0).
    pub catalog_at: GlobalAddr,
    /// Whether its load completed.
    pub loaded: bool,
    /// The registrations it names: each slot with its lease length (ms) in
    /// `expiry_ms`.
    pub slots: Vec<SlotInfo>,
}

impl Mirror {
    /// The end (an offset on blade 0) of the catalog, the registry and the
    /// registrations' undo log areas there.
    pub fn end_on_blade0(&self) -> u64 {
        (self.catalog_at.offset() + catalog::BYTES as u64)
            .max(self.db.registry.offset() + registry::SLOTS * registry::SLOT)
            .max(self.logs_end_on(0))
    }

    /// The end (an offset on `blade`) of the undo log areas there of the
    /// registrations it names; 0 if none (while blade 0 is lost, its
    /// registry cannot say where they are).
    pub fn logs_end_on(&self, blade: u16) -> u64 {
        let mut end = 0;
        for s in self.slots.iter().filter(|s| s.claim != 0) {
            for l in s.logs.iter().filter(|l| !l.is_null() && l.blade() == blade) {
                end = end.max(l.offset() + s.threads * s.coroutines * crate::registry::ring_bytes(&self.db));
            }
        }
        end
    }

    /// The longest lease among the registrations it names (ms). A slot a
    /// recovery held while it stood for the registry ([`Db::mirror`])
    /// keeps that recovery's hold, an expiry: it counts as one hold.
    pub fn longest_lease_ms(&self) -> u64 {
        let lease = |s: &SlotInfo| {
            if s.claim & registry::RECOVERING != 0 {
                crate::recovery::HOLD_MS
            } else {
                s.expiry_ms
            }
        };
        self.slots.iter().filter(|s| s.claim != 0).map(lease).max().unwrap_or(0)
    }
}

/// Every database mirror on `blade` (one of [`blades`]).
///
/// # Errors
/// A mirror whose name or catalog is damaged, as [`DtxError::Corrupt`];
/// verb errors.
pub async fn list(ctx: &Ctx, blade: u16) -> Result<Vec<Mirror>> {
    let mut out = Vec::new();
    for (tag, at) in ctx.roots(blade).await? {
        // Other roots name other objects (of any size, anywhere).
        if smart_core::layout::check_heap_place(ctx.blades(), at, 8).is_err()
            || ctx.read_u64(at).await? != mirror::MAGIC
        {
            continue;
        }
        let at = stored_addr(ctx.blades(), at.raw(), mirror::BYTES as u64, || "a database mirror".into())?;
        let mut m = vec![0u8; mirror::BYTES];
        ctx.read_all(at, &mut m).await?;
        let name = ctx
            .read_name(GlobalAddr::from_raw(word(&m, 24)))
            .await?
            .filter(|n| smart_core::layout::root_tag(&root_name(n)) == tag)
            .ok_or_else(|| DtxError::Corrupt(format!("the database mirror at {at} holds no name of its root")))?;
        let db = Db::parse(ctx.blades(), &name, &m[mirror::CATALOG..mirror::REGISTRY], &format!("the mirror at {at}"))?;
        let catalog_at = stored_addr(ctx.blades(), word(&m, 8), catalog::BYTES as u64, || {
            format!("the mirror of database {name}: the catalog's address")
        })?;
        if catalog_at.blade() != 0 {
            return Err(DtxError::Corrupt(format!(
                "the mirror of database {name}: the catalog was on blade {}",
                catalog_at.blade()
            )));
        }
        let slots = (1..registry::SLOTS as u16)
            .map(|i| SlotInfo::parse(i, &m[slot_offset(i)..][..registry::SLOT as usize]))
            .collect();
        out.push(Mirror { at, db, catalog_at, loaded: word(&m, mirror::LOADED) == 1, slots });
    }
    Ok(out)
}

/// Writes mirror `m` back on blade 0, at the old addresses: the catalog,
/// the registry (each registration it names with an expiry of 0, so that
/// recovery takes it for dead) and the named roots. Idempotent.
///
/// # Errors
/// Verb errors.
pub async fn restore(ctx: &Ctx, m: &Mirror) -> Result<()> {
    restore_with(ctx, m, true).await
}

/// [`restore`] for a blade 0 that joins while compute blades run
/// ([`crate::rejoin`]): the registry written empty. The mirror stays the
/// registry until blade 0 is taken in; then the registrations it holds
/// are all of earlier epochs, settled there, and the next ones claim
/// blade 0's slots. Idempotent while blade 0 joins (nothing reads it).
///
/// # Errors
/// Verb errors.
pub async fn restore_joining(ctx: &Ctx, m: &Mirror) -> Result<()> {
    restore_with(ctx, m, false).await
}

async fn restore_with(ctx: &Ctx, m: &Mirror, registrations: bool) -> Result<()> {
    let mut c = vec![0u8; catalog::BYTES];
    ctx.read(m.at.add(mirror::CATALOG as u64), &mut c).await?;
    ctx.write_all(m.catalog_at, &c).await?;
    let mut r = vec![0u8; (registry::SLOTS * registry::SLOT) as usize];
    for s in m.slots.iter().filter(|s| registrations && s.claim != 0) {
        r[usize::from(s.slot) * registry::SLOT as usize..][..registry::WORDS].copy_from_slice(&s.bytes(s.claim, 0));
    }
    ctx.write_all(m.db.registry, &r).await?;
    ctx.set_root(0, &root_name(&m.db.name), m.catalog_at).await?;
    if m.loaded {
        ctx.set_root(0, &loaded_root(&m.db.name), m.catalog_at).await?;
    }
    Ok(())
}
