//! A database: its tables' hash stores on the memory blades, replicated,
//! found through a catalog at a named root.
//!
//! Table `t` of a database over `n` blades has its primary on blade
//! `t mod n` and its backups on the next `k - 1` blades, for any
//! `n ≥ k` (Smart-DTX handled at most two blades). While blades are out of
//! a cluster's configuration, [`Db::without`] promotes the first surviving
//! backup of each table whose primary was on one of them. Every replica has the
//! same bucket array; overflow buckets are allocated on every replica at
//! once and each bucket header names every replica's next bucket, so a
//! record's backup addresses are known from the chain walked on the
//! primary (FORD derived backup addresses from primary offsets, which is
//! wrong for overflow buckets).

use smart_core::{BladeInfo, Ctx, GlobalAddr};

use crate::error::{DtxError, Result};
use crate::layout::{self, catalog, registry, MAX_REPLICAS};

/// A table as a database declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// For messages.
    pub name: String,
    /// Bytes of every value.
    pub value_size: usize,
    /// Rows expected: the bucket array is sized for them at half load.
    pub rows: u64,
}

/// A database as created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbSpec {
    /// Its named root is `ford:NAME`.
    pub name: String,
    /// Table `i` has id `i`.
    pub tables: Vec<TableSpec>,
    /// Copies of every table, primary included (k).
    pub replicas: usize,
}

/// Where a table lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Table id.
    pub id: u32,
    /// Bytes of every value.
    pub value_size: usize,
    /// Buckets in the array.
    pub buckets: u64,
    /// The bucket array of each replica, as created (replica 0 is the
    /// primary while every blade is in the configuration).
    pub base: [GlobalAddr; MAX_REPLICAS],
    /// The replicas in the order transactions use them
    /// ([`Db::without`]): position 0 is the primary, then the backups, then
    /// the replicas on blades taken out of the configuration (not
    /// written). `[0, 1, 2, 3]` while every blade is in.
    pub order: [u8; MAX_REPLICAS],
    /// Replicas read and written: the first `live` of `order`.
    pub live: usize,
    /// Replicas written: the first `writes` of `order` (`live`, then those
    /// on blades joining the configuration, which receive every write but
    /// are read by nobody until their copies are whole: [`Db::view`]).
    pub writes: usize,
    /// `base` in `order`: the arrays transactions read and write.
    pub vbase: [GlobalAddr; MAX_REPLICAS],
}

impl Table {
    /// Table `id` over `replicas` replicas at `base`, every replica in use.
    pub fn new(id: u32, value_size: usize, buckets: u64, base: [GlobalAddr; MAX_REPLICAS], replicas: usize) -> Table {
        Table { id, value_size, buckets, base, order: [0, 1, 2, 3], live: replicas, writes: replicas, vbase: base }
    }

    /// The position, in [`Table::order`], of replica 0 as created: a record
    /// names its copy there as its home, whichever replica is primary.
    pub fn home_pos(&self) -> usize {
        self.order.iter().position(|r| *r == 0).expect("replica 0 is in the order")
    }

    /// Bytes of a record.
    pub fn record_bytes(&self) -> usize {
        layout::record_bytes(self.value_size)
    }

    /// Bytes of a bucket.
    pub fn bucket_bytes(&self) -> u64 {
        layout::bucket_bytes(self.value_size)
    }

    /// The first bucket, on the primary, of the chain of a key with hash
    /// `hash` ([`layout::key_hash`]); the backups' are at the same offset.
    pub fn home_bucket(&self, hash: u64) -> GlobalAddr {
        self.vbase[0].add(hash % self.buckets * self.bucket_bytes())
    }

    /// The index of the bucket of the primary's array that holds `at`.
    pub fn bucket_of(&self, at: GlobalAddr) -> u64 {
        (at.offset() - self.vbase[0].offset()) / self.bucket_bytes()
    }

    /// Which slot of its bucket the record at `at`, in the primary's
    /// array, is.
    pub fn slot_of(&self, at: GlobalAddr) -> usize {
        let in_bucket = (at.offset() - self.vbase[0].offset()) % self.bucket_bytes();
        ((in_bucket - layout::BUCKET_HEADER) / self.record_bytes() as u64) as usize
    }

    /// `at`, an address in the primary's bucket array, on each of the first
    /// `replicas` replicas in [`Table::order`] (each replica's array has the
    /// same layout).
    #[inline]
    pub fn array_mirrors(&self, at: GlobalAddr, replicas: usize) -> [GlobalAddr; MAX_REPLICAS] {
        let off = at.offset() - self.vbase[0].offset();
        std::array::from_fn(|r| if r < replicas { self.vbase[r].add(off) } else { GlobalAddr::NULL })
    }

    /// The copies, in [`Table::order`], of the overflow bucket read at `at`
    /// on the primary in use, whose header is `header`
    /// ([`layout::copies_named`]: a header names the copies by the replicas
    /// as created). Those read are checked to name a bucket
    /// ([`stored_addr`]: a bucket names its copies before it is linked, so
    /// one that names none was damaged); those only written (a joining
    /// blade's) too, but for a word 0 ([`GlobalAddr::NULL`]: a bucket added
    /// while their blade was out, whose copy there the re-replication has
    /// not made yet); those out of use are as named.
    ///
    /// # Errors
    /// [`DtxError::Corrupt`] for a copy in use that names no bucket.
    pub(crate) fn overflow_loc(
        &self,
        blades: &[BladeInfo],
        replicas: usize,
        header: &[u8],
        at: GlobalAddr,
    ) -> Result<[GlobalAddr; MAX_REPLICAS]> {
        let (_, named) = layout::copies_named(header, usize::from(self.order[0]), at);
        let mut out = [GlobalAddr::NULL; MAX_REPLICAS];
        out[0] = at;
        for (v, c) in out.iter_mut().enumerate().take(replicas).skip(1) {
            let raw = named[usize::from(self.order[v])];
            *c = if v < self.live || (v < self.writes && raw != 0) {
                stored_addr(blades, raw, self.bucket_bytes(), || {
                    format!("table {}: replica {} of overflow bucket {at}", self.id, self.order[v])
                })?
            } else {
                GlobalAddr::from_raw(raw)
            };
        }
        Ok(out)
    }

    /// The table's primary in use alone (a view of one replica, for scans
    /// of its lock words).
    pub fn primary_only(&self) -> Table {
        self.replica_only(0)
    }

    /// The table's replica at position `v` of [`Table::order`] alone (a
    /// view of one replica, its chains walked on it).
    pub fn replica_only(&self, v: usize) -> Table {
        let mut base = [GlobalAddr::NULL; MAX_REPLICAS];
        base[0] = self.vbase[v];
        Table::new(self.id, self.value_size, self.buckets, base, 1)
    }
}

/// An open database: what every compute thread needs to find its rows
/// (immutable once created; cheap to share).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Db {
    /// Its name.
    pub name: String,
    /// The tables, by id.
    pub tables: Vec<Table>,
    /// Copies of every table (k).
    pub replicas: usize,
    /// Blades when created (the placement depends on it).
    pub blades: usize,
    /// The registry of compute blades (on blade 0; in the mirror on the
    /// first blade read while blade 0 is out: [`Db::mirror`]).
    pub registry: GlobalAddr,
    /// The largest value of any table (sizes log entries).
    pub max_value: usize,
    /// Memory blades out of the cluster's configuration ([`Db::without`]):
    /// nothing is read from or written to them. Empty while every blade is
    /// in.
    pub lost: Vec<u16>,
    /// Memory blades joining the configuration ([`Db::view`]): written by
    /// every transaction, read by none. Empty but while one is.
    pub joining: Vec<u16>,
    /// While blade 0 is out of the configuration or joining it
    /// ([`Db::open_view`]): the mirror ([`crate::mirror`]) that stands for
    /// what blade 0 alone held. Its catalog is the catalog, its load mark
    /// the load mark, and its registrations the registry, whose slots keep
    /// a lease length in place of an expiry and are never renewed: under a
    /// coordinator, a compute blade's liveness is its membership there.
    /// `None` while blade 0 is in (once taken in again, its registry is
    /// blade 0's: see [`crate::rejoin`] for how the registrations move).
    pub mirror: Option<GlobalAddr>,
}

/// An address read from a blade (a replica's bucket array, a chain's next
/// bucket, a log area), checked to name `len` bytes of the heap of one of
/// the run's memory blades ([`smart_core::layout::check_heap_place`]):
/// memory changed behind the database's back (a damaged backing file, a
/// stray writer) is so reported where it is read, as a corrupt database
/// naming `what`, and not later as a verb to no blade or out of bounds.
///
/// # Errors
/// [`DtxError::Corrupt`] if it does not.
pub fn stored_addr(blades: &[BladeInfo], raw: u64, len: u64, what: impl FnOnce() -> String) -> Result<GlobalAddr> {
    let at = GlobalAddr::from_raw(raw);
    smart_core::layout::check_heap_place(blades, at, len)
        .map(|()| at)
        .map_err(|why| DtxError::Corrupt(format!("{}: address {at} {why}", what())))
}

/// Checks that a chain walked `hops` buckets past its first, the bucket
/// `home` of table `t`, is not longer than the blades could hold (a cycle
/// made by damage).
///
/// # Errors
/// [`DtxError::Corrupt`] if it is.
pub(crate) fn chain_within(blades: &[BladeInfo], t: &Table, home: GlobalAddr, hops: u64) -> Result<()> {
    if hops < blades.iter().map(|b| b.size).sum::<u64>() / t.bucket_bytes() {
        return Ok(());
    }
    Err(DtxError::Corrupt(format!("table {}: the chain of bucket {home} does not end", t.id)))
}

/// The named root on blade 0 that says a rebuild of the blade it names is
/// in progress (until it is done, no database opens but for the rebuild).
/// A rebuild of several blades names the first here, and each other one in
/// a root of its own ([`mark_rebuilding`]).
pub const REBUILDING: &str = "ford:rebuilding";

/// The named root (on blade 0) that says blade `i` is rebuilt together with
/// the one [`REBUILDING`] names.
fn rebuilding_also(i: u16) -> String {
    format!("{REBUILDING}:{i}")
}

/// Marks a rebuild of blades `lost` (sorted, at least one) as in progress,
/// on blade 0: [`REBUILDING`] names the first, set last.
///
/// # Errors
/// Verb errors; a full root directory.
pub async fn mark_rebuilding(ctx: &Ctx, lost: &[u16]) -> Result<()> {
    let n = ctx.blades().len() as u16;
    for i in (0..n).filter(|i| !lost[1..].contains(i)) {
        ctx.drop_root(0, &rebuilding_also(i)).await?;
    }
    for &i in &lost[1..] {
        ctx.set_root(0, &rebuilding_also(i), GlobalAddr::new(i, smart_core::layout::HEAP_START)).await?;
    }
    ctx.set_root(0, REBUILDING, GlobalAddr::new(lost[0], smart_core::layout::HEAP_START)).await?;
    Ok(())
}

/// Ends the mark of [`mark_rebuilding`]: [`REBUILDING`] first.
///
/// # Errors
/// Verb errors.
pub async fn unmark_rebuilding(ctx: &Ctx) -> Result<()> {
    ctx.drop_root(0, REBUILDING).await?;
    for i in 0..ctx.blades().len() as u16 {
        ctx.drop_root(0, &rebuilding_also(i)).await?;
    }
    Ok(())
}

/// The blades a rebuild in progress is rebuilding (sorted), if one is.
///
/// # Errors
/// Verb errors; a damaged root.
pub async fn rebuilding(ctx: &Ctx) -> Result<Option<Vec<u16>>> {
    let Some(first) = ctx.root(0, REBUILDING).await? else { return Ok(None) };
    let mut lost = vec![first.blade()];
    for i in 0..ctx.blades().len() as u16 {
        if i != first.blade() && ctx.root(0, &rebuilding_also(i)).await?.is_some() {
            lost.push(i);
        }
    }
    lost.sort_unstable();
    Ok(Some(lost))
}

/// "memory blade 1 is" or "memory blades 1,2 are", for messages.
pub fn blades_are(lost: &[u16]) -> String {
    match lost {
        [one] => format!("memory blade {one} is"),
        _ => format!("memory blades {} are", crate::rebuild::blade_list(lost)),
    }
}

/// The named root (on blade 0) of database `name`'s catalog, `ford:NAME`.
pub fn root_name(name: &str) -> String {
    format!("ford:{name}")
}

/// The named root (on blade 0) that says a database's load completed: it
/// names the catalog, as `ford:NAME` does.
pub(crate) fn loaded_root(name: &str) -> String {
    format!("ford:{name}:loaded")
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Buckets for `rows` rows at half load.
pub fn buckets_for(rows: u64) -> u64 {
    rows.div_ceil(layout::SLOTS as u64 / 2).max(1)
}

impl Db {
    /// Opens database `name`, if it exists.
    ///
    /// # Errors
    /// A catalog that is not one, or made for another number of blades;
    /// verb errors.
    pub async fn open(ctx: &Ctx, name: &str) -> Result<Option<Db>> {
        if let Some(lost) = rebuilding(ctx).await? {
            return Err(DtxError::Config(format!(
                "{} being rebuilt (a `compute-blade rebuild --lost {}` did not finish): run it again before anything \
                 else",
                blades_are(&lost),
                crate::rebuild::blade_list(&lost)
            )));
        }
        Db::open_unguarded(ctx, name).await
    }

    /// Database `name` as transactions use it while memory blades `lost`
    /// are out of the configuration and `joining` join it ([`Db::view`]);
    /// `None` if it does not exist (with blade 0 in).
    ///
    /// With blade 0 out or joining (its copies being made: nothing on it
    /// is read), what it alone held comes from the database's mirror on
    /// the first blade read ([`Db::mirror`]): the catalog's copy there, its
    /// load mark, and its registrations as the registry.
    ///
    /// # Errors
    /// As [`Db::open`] and [`Db::view`]; with blade 0 out, a database that
    /// keeps no mirror on that blade.
    pub async fn open_view(ctx: &Ctx, name: &str, lost: &[u16], joining: &[u16]) -> Result<Option<Db>> {
        if !lost.contains(&0) && !joining.contains(&0) {
            return match Db::open(ctx, name).await? {
                Some(whole) => whole.view(lost, joining).map(Some),
                None => Ok(None),
            };
        }
        let n = ctx.blades().len() as u16;
        let Some(h) = (1..n).find(|b| !lost.contains(b) && !joining.contains(b)) else {
            return Err(DtxError::Config(format!("database {name}: no memory blade is read without blade 0")));
        };
        let Some(at) = crate::mirror::find(ctx, h, name).await? else {
            // A database over one blade, made before mirrors were kept, or
            // none of that name: nothing on the blades read says which.
            return Err(DtxError::Config(format!(
                "database {name}: no mirror of it on memory blade {h}, so nothing read without memory blade 0 says \
                 where its tables are (it never existed, was made over one blade, or before mirrors were kept): \
                 rebuild blade 0 (`compute-blade rebuild --lost 0`)"
            )));
        };
        crate::mirror::stand_in(ctx, at, h, name).await?.view(lost, joining).map(Some)
    }

    /// [`Db::open`] while a rebuild is in progress (for the rebuild).
    ///
    /// # Errors
    /// As [`Db::open`].
    pub async fn open_unguarded(ctx: &Ctx, name: &str) -> Result<Option<Db>> {
        let Some(at) = ctx.root(0, &root_name(name)).await? else { return Ok(None) };
        let mut c = vec![0u8; catalog::BYTES];
        ctx.read(at, &mut c).await?;
        Db::parse(ctx.blades(), name, &c, &format!("root ford:{name} at {at}")).map(Some)
    }

    /// The database `name` whose catalog bytes are `c` (read at `where_`,
    /// for messages), checked as [`Db::open`] checks it.
    ///
    /// # Errors
    /// As [`Db::open`].
    pub(crate) fn parse(blades: &[BladeInfo], name: &str, c: &[u8], where_: &str) -> Result<Db> {
        if word(c, 0) == catalog::MAGIC_V1 {
            return Err(DtxError::Config(format!(
                "database {name} was made by an older version (records with CRC-32, now CRC-32C): \
                 restart its memory blades without their backing files to make it anew"
            )));
        }
        if word(c, 0) == catalog::MAGIC_V2 {
            return Err(DtxError::Config(format!(
                "database {name} was made by an older version (one copy of each undo log, now one per \
                 replica): restart its memory blades without their backing files to make it anew"
            )));
        }
        if word(c, 0) != catalog::MAGIC {
            return Err(DtxError::Corrupt(format!("{where_} holds no catalog")));
        }
        let run = blades;
        let (ntables, replicas, blades) = (word(c, 8) as usize, word(c, 16) as usize, word(c, 24) as usize);
        if blades != run.len() {
            return Err(DtxError::Config(format!(
                "database {name} was created over {blades} memory blades; this run has {}",
                run.len()
            )));
        }
        if ntables == 0 || ntables > catalog::MAX_TABLES || replicas == 0 || replicas > MAX_REPLICAS.min(blades) {
            return Err(DtxError::Corrupt(format!(
                "catalog of {name}: {ntables} tables, {replicas} replicas over {blades} memory blades"
            )));
        }
        let tables = (0..ntables)
            .map(|t| {
                let e = catalog::HEADER + t * catalog::TABLE;
                Table::new(
                    word(c, e) as u32,
                    word(c, e + 8) as usize,
                    word(c, e + 16),
                    std::array::from_fn(|r| GlobalAddr::from_raw(word(c, e + 32 + 8 * r))),
                    replicas.min(MAX_REPLICAS),
                )
            })
            .collect();
        let db = Db {
            name: name.to_string(),
            tables,
            replicas,
            blades,
            registry: GlobalAddr::from_raw(word(c, 32)),
            max_value: word(c, 56) as usize,
            lost: Vec::new(),
            joining: Vec::new(),
            mirror: None,
        };
        db.check_catalog(run)?;
        Ok(db)
    }

    /// Checks what the catalog says against what [`Db::create`] writes:
    /// tables numbered in order with values of 1 to [`layout::MAX_VALUE`]
    /// bytes, each replica's bucket array whole on its blade (table `t`'s
    /// replica `r` on blade `(t + r) mod n`), the registry on blade 0.
    fn check_catalog(&self, blades: &[BladeInfo]) -> Result<()> {
        let n = self.blades;
        let corrupt = |what: String| Err(DtxError::Corrupt(format!("catalog of {}: {what}", self.name)));
        for (i, t) in self.tables.iter().enumerate() {
            if t.id as usize != i || t.value_size == 0 || t.value_size > layout::MAX_VALUE || t.buckets == 0 {
                return corrupt(format!(
                    "entry {i} names table {} of {} buckets with values of {} bytes",
                    t.id, t.buckets, t.value_size
                ));
            }
            let Some(bytes) = t.buckets.checked_mul(t.bucket_bytes()) else {
                return corrupt(format!("table {i}: {} buckets overflow 64 bits", t.buckets));
            };
            for r in 0..self.replicas {
                let at = stored_addr(blades, t.base[r].raw(), bytes, || {
                    format!("catalog of {}: table {i}, replica {r}", self.name)
                })?;
                if at.blade() as usize != (i + r) % n {
                    return corrupt(format!(
                        "table {i}'s replica {r} is on blade {}; it belongs on blade {}",
                        at.blade(),
                        (i + r) % n
                    ));
                }
            }
        }
        let largest = self.tables.iter().map(|t| t.value_size).max().unwrap_or(0);
        if self.max_value != largest {
            return corrupt(format!("the largest value is {} bytes, not {}", largest, self.max_value));
        }
        let at = stored_addr(blades, self.registry.raw(), registry::SLOTS * registry::SLOT, || {
            format!("catalog of {}: the registry", self.name)
        })?;
        if at.blade() != 0 {
            return corrupt(format!("the registry is on blade {}, not 0", at.blade()));
        }
        Ok(())
    }

    /// Opens database `spec.name`, creating it (empty) unless it exists;
    /// says whether it existed. Under a race of creators one catalog wins
    /// and everyone opens it (the losers' allocations are left unused).
    ///
    /// # Errors
    /// A spec that cannot be placed (more replicas than blades, too many
    /// tables, values too large), an existing database of another shape,
    /// a blade out of memory; verb errors.
    pub async fn create(ctx: &Ctx, spec: &DbSpec) -> Result<(Db, bool)> {
        let n = ctx.blades().len();
        if spec.replicas == 0 || spec.replicas > MAX_REPLICAS || spec.replicas > n {
            return Err(DtxError::Config(format!(
                "{} replicas over {n} memory blades: need 1 ≤ replicas ≤ min(blades, {MAX_REPLICAS})",
                spec.replicas
            )));
        }
        if spec.tables.is_empty() || spec.tables.len() > catalog::MAX_TABLES {
            return Err(DtxError::Config(format!("1 to {} tables, not {}", catalog::MAX_TABLES, spec.tables.len())));
        }
        if let Some(t) = spec.tables.iter().find(|t| t.value_size == 0 || t.value_size > layout::MAX_VALUE) {
            return Err(DtxError::Config(format!(
                "table {}: values of {} bytes (1 to {})",
                t.name,
                t.value_size,
                layout::MAX_VALUE
            )));
        }
        if let Some(db) = Db::open(ctx, &spec.name).await? {
            db.check_shape(spec)?;
            crate::mirror::ensure(ctx, &db).await?;
            return Ok((db, true));
        }
        let max_value = spec.tables.iter().map(|t| t.value_size).max().unwrap_or(8);
        let mut tables = Vec::new();
        for (t, ts) in spec.tables.iter().enumerate() {
            let buckets = buckets_for(ts.rows);
            let Some(bytes) = buckets.checked_mul(layout::bucket_bytes(ts.value_size)) else {
                return Err(DtxError::Config(format!(
                    "table {}: {} rows need more than 2^64 bytes of buckets",
                    ts.name, ts.rows
                )));
            };
            let mut base = [GlobalAddr::NULL; MAX_REPLICAS];
            for (r, b) in base.iter_mut().enumerate().take(spec.replicas) {
                *b = ctx.alloc(((t + r) % n) as u16, bytes, 64).await?;
            }
            tables.push(Table::new(t as u32, ts.value_size, buckets, base, spec.replicas));
        }
        let registry = ctx.alloc(0, registry::SLOTS * registry::SLOT, 64).await?;
        let mut c = vec![0u8; catalog::BYTES];
        let put = |c: &mut [u8], i: usize, v: u64| c[i..i + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut c, 0, catalog::MAGIC);
        put(&mut c, 8, tables.len() as u64);
        put(&mut c, 16, spec.replicas as u64);
        put(&mut c, 24, n as u64);
        put(&mut c, 32, registry.raw());
        put(&mut c, 40, registry::SLOTS);
        put(&mut c, 56, max_value as u64);
        for t in &tables {
            let e = catalog::HEADER + t.id as usize * catalog::TABLE;
            put(&mut c, e, u64::from(t.id));
            put(&mut c, e + 8, t.value_size as u64);
            put(&mut c, e + 16, t.buckets);
            for r in 0..MAX_REPLICAS {
                put(&mut c, e + 32 + 8 * r, t.base[r].raw());
            }
        }
        let at = ctx.alloc(0, catalog::BYTES as u64, 64).await?;
        ctx.write(at, &c).await?;
        let won = ctx.set_root(0, &root_name(&spec.name), at).await?;
        let db = Db::open(ctx, &spec.name).await?.ok_or_else(|| DtxError::Corrupt("catalog vanished".into()))?;
        db.check_shape(spec)?;
        // Before anyone registers on it (registrations are mirrored too).
        crate::mirror::ensure(ctx, &db).await?;
        Ok((db, won != at))
    }

    fn check_shape(&self, spec: &DbSpec) -> Result<()> {
        let same = self.replicas == spec.replicas
            && self.tables.len() == spec.tables.len()
            && self.tables.iter().zip(&spec.tables).all(|(a, b)| a.value_size == b.value_size);
        if same {
            Ok(())
        } else {
            Err(DtxError::Config(format!(
                "database {} exists with another shape ({} replicas, value sizes {:?}): use another name or fresh blades",
                self.name,
                self.replicas,
                self.tables.iter().map(|t| t.value_size).collect::<Vec<_>>()
            )))
        }
    }

    /// This database as transactions use it while memory blades `lost`
    /// are out of the cluster's configuration (a failover took them out):
    /// each table keeps its replicas on the other blades, the first of them
    /// in the order created becoming its primary (a backup promoted), and
    /// nothing is read from or written to the lost blades. Records keep
    /// naming their copy on replica 0 as created as their home, and undo
    /// log entries name every replica as created, so that a rebuild of the
    /// lost blades in place ([`crate::rebuild`]) and the recovery of a
    /// transaction of either view find every copy.
    ///
    /// Transactions of a view must not overlap those of another: every
    /// transaction of the earlier view is settled first
    /// ([`crate::recovery::settle`]).
    ///
    /// # Errors
    /// [`DtxError::Config`] if blade 0 is lost (it alone holds the catalog
    /// and the registry of compute blades: a failover without it is not
    /// built), or every replica of a table was on the lost blades.
    pub fn without(&self, lost: &[u16]) -> Result<Db> {
        self.view(lost, &[])
    }

    /// [`Db::without`] the blades `lost`, with the blades `joining` (fresh
    /// blades in removed ones' places, adopted at their places so that every
    /// copy is at its old address: [`crate::rejoin`]) written by every
    /// transaction and read by none: each table's order is its replicas on
    /// the other blades (the first of them the primary), then those on
    /// joining blades, then the lost ones. A record written has its copy
    /// there written too, so that once the copy of what was there before is
    /// made (under each slot's lock), the blade's copies stay whole; a write
    /// whose copy there is not known yet (a bucket added while the blade was
    /// out, before the re-replication gave it one) aborts instead of going
    /// without it ([`crate::Abort::Validation`]).
    ///
    /// Blade 0 joins only in a database opened from its mirror
    /// ([`Db::open_view`]): its catalog and registry are the mirror's until
    /// it is taken in.
    ///
    /// # Errors
    /// As [`Db::without`]; blade 0 joining a database opened through it.
    pub fn view(&self, lost: &[u16], joining: &[u16]) -> Result<Db> {
        let mut lost = lost.to_vec();
        lost.sort_unstable();
        lost.dedup();
        let mut joining: Vec<u16> = joining.iter().copied().filter(|b| !lost.contains(b)).collect();
        joining.sort_unstable();
        joining.dedup();
        if joining.contains(&0) && self.mirror.is_none() {
            return Err(DtxError::Config(format!(
                "database {}: memory blade 0 joins only in the database as its mirror stands for it (Db::open_view): \
                 nothing on blade 0 is read before it is taken in",
                self.name
            )));
        }
        if lost.contains(&0) && self.mirror.is_none() {
            return Err(DtxError::Config(format!(
                "database {}: memory blade 0 holds the catalog and the registry of compute blades: without it, open \
                 the database from its mirror (Db::open_view)",
                self.name
            )));
        }
        let mut db = self.clone();
        for t in &mut db.tables {
            let on = |set: &[u16], r: &u8| set.contains(&t.base[usize::from(*r)].blade());
            let all: Vec<u8> = (0..self.replicas as u8).collect();
            let live: Vec<u8> = all.iter().copied().filter(|r| !on(&lost, r) && !on(&joining, r)).collect();
            let join: Vec<u8> = all.iter().copied().filter(|r| on(&joining, r)).collect();
            let gone: Vec<u8> = all.iter().copied().filter(|r| on(&lost, r)).collect();
            if live.is_empty() {
                return Err(DtxError::Config(format!(
                    "database {}: every replica of table {} was on memory blades {}",
                    self.name,
                    t.id,
                    crate::rebuild::blade_list(&[lost.clone(), joining.clone()].concat())
                )));
            }
            let mut order = [0, 1, 2, 3];
            for (v, r) in live.iter().chain(&join).chain(&gone).enumerate() {
                order[v] = *r;
            }
            t.order = order;
            t.live = live.len();
            t.writes = live.len() + join.len();
            t.vbase =
                std::array::from_fn(
                    |v| if v < self.replicas { t.base[usize::from(order[v])] } else { GlobalAddr::NULL },
                );
        }
        db.lost = lost;
        db.joining = joining;
        Ok(db)
    }

    /// Whether memory blade `b` is read ([`Db::view`]): neither out of
    /// the configuration nor joining it.
    pub fn reads(&self, b: u16) -> bool {
        !self.lost.contains(&b) && !self.joining.contains(&b)
    }

    /// Whether memory blade `b` is written ([`Db::without`]): not out of
    /// the configuration (a joining blade is written: [`Db::view`]).
    pub fn uses(&self, b: u16) -> bool {
        !self.lost.contains(&b)
    }

    /// Table `id`.
    ///
    /// # Panics
    /// If there is no such table.
    pub fn table(&self, id: u32) -> &Table {
        &self.tables[id as usize]
    }

    /// Whether the application that created the database recorded its load
    /// complete ([`Db::mark_loaded`]). A database whose load was interrupted
    /// (its loader killed, its blades lost) holds only some of its rows.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn is_loaded(&self, ctx: &Ctx) -> Result<bool> {
        if let Some(m) = self.mirror {
            return crate::mirror::loaded(ctx, m).await;
        }
        Ok(ctx.root(0, &loaded_root(&self.name)).await?.is_some())
    }

    /// Records that the database's load completed (a named root
    /// `ford:NAME:loaded` on blade 0, naming the catalog). Idempotent.
    ///
    /// # Errors
    /// A database without its catalog root; verb errors.
    pub async fn mark_loaded(&self, ctx: &Ctx) -> Result<()> {
        let Some(catalog) = ctx.root(0, &root_name(&self.name)).await? else {
            return Err(DtxError::Corrupt(format!("database {}: its root ford:{} is gone", self.name, self.name)));
        };
        ctx.set_root(0, &loaded_root(&self.name), catalog).await?;
        crate::mirror::mark_loaded(ctx, self).await
    }

    /// Registry slot `i`'s address.
    pub fn registry_slot(&self, i: u16) -> GlobalAddr {
        self.registry.add(u64::from(i) * registry::SLOT)
    }
}

/// The copies, on the first `replicas` replicas, of the overflow bucket of
/// table `t` whose copy on replica `r` is at `at` with header `header`
/// ([`layout::copies_named`]), each checked to name a bucket
/// ([`stored_addr`]); a copy on one of the `lost` blades that the header
/// names as 0 (the bucket was added while that blade was out of the
/// configuration: [`Db::without`]) is [`GlobalAddr::NULL`].
///
/// # Errors
/// [`DtxError::Corrupt`] for a copy word that names no bucket.
pub(crate) fn overflow_copies(
    blades: &[BladeInfo],
    t: &Table,
    replicas: usize,
    header: &[u8],
    (r, at): (usize, GlobalAddr),
    lost: &[u16],
) -> Result<[GlobalAddr; MAX_REPLICAS]> {
    let (_, named) = layout::copies_named(header, r, at);
    let mut out = [GlobalAddr::NULL; MAX_REPLICAS];
    for (j, c) in out.iter_mut().enumerate().take(replicas) {
        if named[j] == 0 && lost.contains(&t.base[j].blade()) {
            continue;
        }
        *c = stored_addr(blades, named[j], t.bucket_bytes(), || {
            let by = if r == 0 { String::new() } else { format!(" (named by its copy on replica {r})") };
            format!("table {}: replica {j} of overflow bucket {at}{by}", t.id)
        })?;
    }
    Ok(out)
}

/// The copies of bucket `at` (a bucket of table `t` on its primary in use)
/// on the first `replicas` replicas of [`Table::order`]: positional in the
/// bucket arrays, named by an overflow bucket's header
/// ([`Table::overflow_loc`]).
///
/// # Errors
/// A header that names no bucket; verb errors.
pub(crate) async fn bucket_copies(
    ctx: &Ctx,
    t: &Table,
    replicas: usize,
    at: GlobalAddr,
) -> Result<[GlobalAddr; MAX_REPLICAS]> {
    let array = t.vbase[0].blade() == at.blade()
        && (t.vbase[0].offset()..t.vbase[0].offset() + t.buckets * t.bucket_bytes()).contains(&at.offset());
    if array {
        return Ok(t.array_mirrors(at, replicas));
    }
    let mut header = [0u8; layout::BUCKET_HEADER as usize];
    ctx.read(at, &mut header).await?;
    t.overflow_loc(ctx.blades(), replicas, &header, at)
}

/// Allocates an overflow bucket on every replica in use and links it after
/// the chain's last bucket `last` (on the primary in use); returns the
/// chain's new last bucket there. Every copy of the new bucket names the
/// others before the primary's link publishes it; once linked, each
/// backup copy of `last` links to the new bucket's copy on its replica
/// (so every replica's chain can be walked on its own, and a damaged link
/// repaired from the others: [`crate::repair`]). An extension cut short
/// there leaves backup links 0, which the repair fills in. Under a race,
/// the loser's buckets are left unused and the winner's returned. While a
/// replica's blade is out of the configuration ([`Db::without`]), the new
/// bucket has no copy there (its word in the headers is 0): the rebuild of
/// that blade adds one ([`crate::rebuild`]).
///
/// # Errors
/// A blade out of memory; verb errors.
pub(crate) async fn extend_chain(ctx: &Ctx, t: &Table, replicas: usize, last: GlobalAddr) -> Result<GlobalAddr> {
    // By replica as created (the headers' words), then in `t.order`.
    let mut copies = [GlobalAddr::NULL; MAX_REPLICAS];
    for v in 0..t.writes {
        let r = usize::from(t.order[v]);
        copies[r] = ctx.alloc(t.base[r].blade(), t.bucket_bytes(), 64).await?;
    }
    for v in 0..t.writes {
        let r = usize::from(t.order[v]);
        ctx.write(copies[r], &layout::header_bytes(0, &copies, r)).await?;
    }
    let first = copies[usize::from(t.order[0])];
    let old = ctx.cas(last, 0, first.raw()).await?;
    if old != 0 {
        return stored_addr(ctx.blades(), old, t.bucket_bytes(), || {
            format!("table {}: the next bucket after {last}", t.id)
        });
    }
    let lasts = bucket_copies(ctx, t, replicas, last).await?;
    // A joining blade's copy of `last` may not be made yet (null): the
    // re-replication links it when it makes it.
    for v in (1..t.writes).filter(|v| !lasts[*v].is_null()) {
        ctx.write(lasts[v], &copies[usize::from(t.order[v])].raw().to_le_bytes()).await?;
    }
    Ok(first)
}
