//! The FORD protocol: a compute thread's handle ([`Dtx`]) and a coroutine's
//! transaction ([`Txn`]).
//!
//! A transaction declares items (read, update, insert, delete), then
//! [`Txn::execute`] fetches them in round trips of one doorbell per blade
//! (several rounds when the application's next items depend on values):
//! - a read item with a cached address: READ the record;
//! - a written item with a cached address: [CAS lock, READ record] (1 RTT),
//!   aborting if the lock is held;
//! - without a cached address: READ the key's bucket (and the overflow
//!   chain), then lock in a second round; where the cache knows the keys
//!   of the bucket's first slots and none is this key, READ only the next
//!   slot instead: a free one proves the key missing.
//!
//! A cached address is a hint (the cache keeps 16-bit fingerprints): a
//! record read through it that holds another key sends a read item to its
//! bucket, and aborts a written one (validation); either way the key stops
//! trusting the cache's prints.
//!
//! [`Txn::commit`] then
//! 1. writes the undo log entry (old images and every replica's address)
//!    and, in the same round, validates the read items: a 16-byte READ of
//!    version **and** lock, aborting if either moved (FORD read only the
//!    version, which let two transactions that each read what the other
//!    writes both commit: write skew). A transaction of one read item needs
//!    no validation: its READ is self-verifying (the record's CRC), so it
//!    saw one state, and it aborts ([`Abort::Locked`]) if that record's
//!    lock was held: the holder's write is committed only once the lock is
//!    released (recovery rolls back a dead holder whose locks all remain);
//! 2. commits: on every replica, [WRITE record with version + 1, ...,
//!    READ 8 bytes] in one doorbell per blade; the trailing READ flushes
//!    the WRITEs before it on that QP (on persistent memory, to the
//!    persistence domain), and every QP that carried a commit WRITE gets
//!    one (FORD flushed only the last item's QP);
//! 3. releases its locks with a CAS each (its lock word → 0, not a WRITE
//!    of 0: see the private `release`), and returns once they landed.
//!
//! An abort releases exactly the locks its CASes acquired (FORD added items
//! to the locked set before the CAS returned, so an abort could release
//! another transaction's lock).
//!
//! **Crash recovery** ([`crate::recovery`]): a dead compute blade's locks
//! name it. A transaction whose primaries all still hold its locks, and
//! whose log entry is durable, may have written some records but was not
//! acknowledged: recovery restores the old images. One that released a lock
//! had flushed every WRITE: recovery releases the rest. Locks without a log
//! entry belong to transactions that wrote nothing: recovery releases them.

use smart_core::runtime::{AtomicRef, Batch, ReadRef};
use smart_core::GlobalAddr;

use crate::cache::Lookup;
use crate::db::{chain_within, extend_chain, stored_addr, Db, Table};
use crate::dtx::{Dtx, Loc};
use crate::error::{Abort, DtxError, TxnError};
use crate::layout::{self, log, state, Owner, MAX_REPLICAS};
use crate::round::{too_large, Round, ROUND};

/// What a transaction does with an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Read only (validated at commit).
    Read,
    /// Read and write (locked).
    Update,
    /// Insert a new row (locked; its value set with [`Txn::write`]).
    Insert,
    /// Delete an existing row (locked; made invisible).
    Delete,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Nothing fetched yet.
    Start,
    /// READ the record at the known address.
    Fetch,
    /// CAS the lock and READ the record.
    Lock,
    /// READ this bucket of the chain, the `hop`-th after the bucket array's
    /// (0: of the array).
    Bucket { at: GlobalAddr, hop: u32 },
    /// READ the slot at `at` of the home bucket, the first whose key the
    /// cache does not know (see [`crate::cache`]): free, the key is missing;
    /// the key's, found; another key's, READ the bucket.
    Probe { at: GlobalAddr },
    /// The chain is full: add an overflow bucket after `last`.
    Extend { last: GlobalAddr },
    /// Fetched (and locked if written).
    Done,
}

/// Where an item's WRs went in a round.
#[derive(Clone, Copy, Debug)]
struct Posted {
    batch: usize,
    read: ReadRef,
    cas: Option<AtomicRef>,
}

#[derive(Debug)]
struct Item {
    table: u32,
    key: u64,
    /// [`layout::key_hash`] of the key (its home bucket, its cache print).
    hash: u64,
    kind: Kind,
    step: Step,
    loc: Loc,
    cached: bool,
    version: u64,
    state: u8,
    locked: bool,
    /// A read item whose record's lock was held (by another transaction)
    /// when it was read.
    held: bool,
    value: Vec<u8>,
    new: Vec<u8>,
    written: bool,
    posted: Option<Posted>,
    /// A read that does not abort when the key is missing
    /// ([`Txn::read_if_any`]).
    maybe: bool,
    /// Such a read found no live row.
    absent: bool,
}

impl Step {
    /// Whether this step is a round trip (exhaustive, like [`Item::room`]
    /// and [`Item::push`], so that a new step is placed in all three).
    #[inline]
    fn trip(self) -> bool {
        match self {
            Step::Fetch | Step::Probe { .. } | Step::Lock | Step::Bucket { .. } => true,
            Step::Start | Step::Extend { .. } | Step::Done => false,
        }
    }
}

impl Item {
    /// The room this item's next step takes in a batch: its blade, WRs and
    /// local bytes (`None`: the step is no round trip).
    fn room(&self, db: &Db) -> Option<(u16, usize, usize)> {
        let t = db.table(self.table);
        match self.step {
            Step::Fetch => Some((self.loc[0].blade(), 1, t.record_bytes())),
            Step::Probe { at } => Some((at.blade(), 1, t.record_bytes())),
            Step::Lock => Some((self.loc[0].blade(), 2, 8 + t.record_bytes())),
            Step::Bucket { at, .. } => Some((at.blade(), 1, t.bucket_bytes() as usize)),
            Step::Start | Step::Extend { .. } | Step::Done => None,
        }
    }

    /// Adds the WRs of this item's next step (a round trip, see
    /// [`Step::trip`]) to `b`: the READ, and the lock's CAS (to `lw`) if
    /// it locks.
    #[inline]
    fn push<'a>(&self, b: &mut Batch<'a>, t: &Table, lw: u64) -> (ReadRef, Option<AtomicRef>) {
        match self.step {
            Step::Fetch => (b.read(self.loc[0], t.record_bytes()), None),
            Step::Probe { at } => (b.read(at, t.record_bytes()), None),
            Step::Lock => {
                let cas = b.cas(self.loc[0].add(layout::LOCK), 0, lw);
                (b.read(self.loc[0], t.record_bytes()), Some(cas))
            }
            Step::Bucket { at, .. } => (b.read(at, t.bucket_bytes() as usize), None),
            Step::Start | Step::Extend { .. } | Step::Done => unreachable!("pushed only with a trip"),
        }
    }

    /// Takes the fetched record `r` of this item's key: done.
    fn take(&mut self, r: &layout::Record<'_>) {
        self.version = r.version;
        self.state = r.state;
        self.held = r.lock & layout::LOCKED != 0;
        self.value.clear();
        self.value.extend_from_slice(r.value);
        self.step = Step::Done;
    }

    /// The key has no live row: a [`Txn::read_if_any`] item takes that as
    /// its result; any other aborts.
    fn missing(&mut self) -> Result<(), Abort> {
        if self.kind != Kind::Read || !self.maybe {
            return Err(Abort::NotFound);
        }
        (self.absent, self.version, self.state, self.held, self.step) = (true, 0, 0, false, Step::Done);
        self.value.clear();
        Ok(())
    }
}

/// A handle on item of a transaction, from the call that declared it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemId(usize);

/// A declared item as the transaction saw it (for tests and histories).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Table.
    pub table: u32,
    /// Key.
    pub key: u64,
    /// What the transaction did.
    pub kind: Kind,
    /// The version it read (a written item's new version is this + 1).
    pub version: u64,
}

/// A coroutine's transaction: declare items, [`execute`](Txn::execute),
/// read and write values, [`commit`](Txn::commit). Reused: [`Txn::begin`]
/// starts the next one.
pub struct Txn {
    d: Dtx,
    owner: Owner,
    ring: [GlobalAddr; MAX_REPLICAS],
    seq: u64,
    items: Vec<Item>,
    n: usize,
    executed: usize,
    entry: Vec<u8>,
    images: Vec<u8>,
}

impl std::fmt::Debug for Txn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txn").field("owner", &self.owner).field("seq", &self.seq).field("items", &self.n).finish()
    }
}

/// Why [`Txn::settle`] stopped: an abort, or damage read in the database
/// (rare, so boxed: the common result stays small).
enum Unsettled {
    Abort(Abort),
    Corrupt(Box<DtxError>),
}

impl Unsettled {
    #[cold]
    fn corrupt(e: DtxError) -> Unsettled {
        Unsettled::Corrupt(Box::new(e))
    }
}

impl From<Abort> for Unsettled {
    fn from(a: Abort) -> Self {
        Unsettled::Abort(a)
    }
}

impl From<Unsettled> for TxnError {
    fn from(u: Unsettled) -> Self {
        match u {
            Unsettled::Abort(a) => TxnError::Abort(a),
            Unsettled::Corrupt(e) => TxnError::Dtx(*e),
        }
    }
}

/// The error of a release that found another lock word than ours (kept out
/// of the release's code: it is never taken in a sound run).
#[cold]
#[inline(never)]
fn lock_not_ours(it: &Item, old: u64, lw: u64) -> TxnError {
    TxnError::Dtx(DtxError::Corrupt(format!(
        "the lock of ({}, {}) held {old:#x} at release, not this transaction's {lw:#x}",
        it.table, it.key
    )))
}

/// The mirrors of a slot at `at` in a bucket whose mirrors are `bucket`
/// (a bucket without a copy on a replica, added while its blade was out,
/// gives none there: null, not an offset from null).
fn slot_loc(at: GlobalAddr, bucket_off: u64, mirrors: &Loc, replicas: usize) -> Loc {
    std::array::from_fn(|r| match r {
        0 => at,
        r if r < replicas && !mirrors[r].is_null() => mirrors[r].add(bucket_off),
        _ => GlobalAddr::NULL,
    })
}

impl Txn {
    /// Coroutine `owner.coroutine`'s transaction object, logging to `ring`.
    pub(crate) fn new(d: Dtx, owner: Owner, ring: [GlobalAddr; MAX_REPLICAS]) -> Txn {
        let entry = vec![0; log::entry_bytes(d.0.db.max_value)];
        Txn { d, owner, ring, seq: 0, items: Vec::new(), n: 0, executed: 0, entry, images: Vec::new() }
    }

    /// Starts the next transaction (forgetting the last one's items).
    pub fn begin(&mut self) {
        self.seq += 1;
        self.n = 0;
        self.executed = 0;
    }

    /// This transaction's lock word.
    pub fn lock_word(&self) -> u64 {
        self.owner.lock_word(self.seq)
    }

    fn add(&mut self, table: u32, key: u64, kind: Kind) -> ItemId {
        assert!((table as usize) < self.d.0.db.tables.len(), "no table {table}");
        if let Some(i) = self.items[..self.n].iter().position(|it| it.table == table && it.key == key) {
            assert!(self.items[i].kind == kind, "item ({table}, {key}) declared twice with different kinds");
            return ItemId(i);
        }
        assert!(self.n < 4 * log::MAX_WRITES, "too many items in one transaction");
        if self.n == self.items.len() {
            self.items.push(Item {
                table,
                key,
                hash: layout::key_hash(key),
                kind,
                step: Step::Start,
                loc: [GlobalAddr::NULL; MAX_REPLICAS],
                cached: false,
                version: 0,
                state: 0,
                locked: false,
                held: false,
                value: Vec::new(),
                new: Vec::new(),
                written: false,
                posted: None,
                maybe: false,
                absent: false,
            });
        } else {
            let it = &mut self.items[self.n];
            (it.table, it.key, it.hash, it.kind, it.step) = (table, key, layout::key_hash(key), kind, Step::Start);
            (it.cached, it.version, it.state, it.locked, it.written, it.posted) = (false, 0, 0, false, false, None);
            (it.held, it.maybe, it.absent) = (false, false, false);
            it.value.clear();
            it.new.clear();
        }
        self.n += 1;
        ItemId(self.n - 1)
    }

    /// Declares a read of `key` in `table`.
    pub fn read(&mut self, table: u32, key: u64) -> ItemId {
        self.add(table, key, Kind::Read)
    }

    /// Declares a read of `key` in `table` that, unlike [`Txn::read`], does
    /// not abort the transaction when the key has no live row:
    /// [`Txn::exists`] then says `false` and its value is empty (as FORD's
    /// reads of absent keys). A row found is validated at commit as any
    /// read; an absence is not (a row inserted after it was seen missing
    /// does not abort the transaction).
    pub fn read_if_any(&mut self, table: u32, key: u64) -> ItemId {
        let id = self.add(table, key, Kind::Read);
        self.items[id.0].maybe = true;
        id
    }

    /// Whether an executed read found its key (always, but for a
    /// [`Txn::read_if_any`] of a missing key).
    pub fn exists(&self, id: ItemId) -> bool {
        !self.items[id.0].absent
    }

    /// Declares a read-modify-write of `key` in `table`.
    pub fn update(&mut self, table: u32, key: u64) -> ItemId {
        self.add(table, key, Kind::Update)
    }

    /// Declares an insert of `key` into `table` (set its value with
    /// [`Txn::write`] before committing).
    pub fn insert(&mut self, table: u32, key: u64) -> ItemId {
        self.add(table, key, Kind::Insert)
    }

    /// Declares a delete of `key` from `table`.
    pub fn delete(&mut self, table: u32, key: u64) -> ItemId {
        self.add(table, key, Kind::Delete)
    }

    /// The value of an executed item (empty for an insert).
    pub fn value(&self, id: ItemId) -> &[u8] {
        &self.items[id.0].value
    }

    /// Sets the new value of an executed update or insert.
    ///
    /// # Panics
    /// On a read or delete item, or a value of the wrong size.
    pub fn write(&mut self, id: ItemId, value: &[u8]) {
        let vs = self.d.0.db.table(self.items[id.0].table).value_size;
        let it = &mut self.items[id.0];
        assert!(matches!(it.kind, Kind::Update | Kind::Insert), "write() on a {:?} item", it.kind);
        assert_eq!(value.len(), vs, "value of {} bytes for a table of {vs}-byte values", value.len());
        it.new.clear();
        it.new.extend_from_slice(value);
        it.written = true;
    }

    /// The items as this transaction saw them.
    pub fn footprint(&self) -> impl Iterator<Item = Footprint> + '_ {
        self.items[..self.n].iter().map(|it| Footprint {
            table: it.table,
            key: it.key,
            kind: it.kind,
            version: it.version,
        })
    }

    /// Fetches (and locks) the items declared since the last execute.
    ///
    /// # Errors
    /// [`TxnError::Abort`] (every lock released first); verb errors.
    pub async fn execute(&mut self) -> Result<(), TxnError> {
        match self.fetch().await {
            Ok(()) => {
                self.executed = self.n;
                Ok(())
            }
            Err(TxnError::Abort(a)) => {
                self.release().await?;
                Err(TxnError::Abort(a))
            }
            Err(e) => Err(e),
        }
    }

    /// Aborts at the application's request, releasing every lock.
    ///
    /// # Errors
    /// Verb errors while releasing.
    pub async fn abort(&mut self) -> Result<(), TxnError> {
        self.release().await
    }

    /// Refuses once the lease may be lost (recovery may own our locks).
    fn fenced(&self) -> Result<(), TxnError> {
        if self.d.0.lost.load(std::sync::atomic::Ordering::SeqCst) {
            Err(TxnError::Dtx(DtxError::LeaseLost))
        } else {
            Ok(())
        }
    }

    async fn fetch(&mut self) -> Result<(), TxnError> {
        self.fenced()?;
        let d = self.d.clone();
        let (ctx, db) = (&d.0.ctx, &*d.0.db);
        // Addresses from the cache; where its lookups would miss the CPU's
        // caches, their lines are fetched while the thread's other
        // coroutines run.
        let overlap = {
            let cache = self.d.0.cache.borrow();
            let overlap = cache.overlap();
            if overlap {
                for it in self.items[self.executed..self.n].iter().filter(|it| it.step == Step::Start) {
                    cache.prefetch(db.table(it.table), it.hash);
                }
            }
            overlap
        };
        if overlap {
            smart_core::runtime::yield_now().await;
        }
        {
            let cache = self.d.0.cache.borrow();
            let mut st = self.d.0.stats.borrow_mut();
            for it in &mut self.items[self.executed..self.n] {
                if it.step != Step::Start {
                    continue;
                }
                let t = db.table(it.table);
                it.step = match cache.lookup(t, db.replicas, it.key, it.hash) {
                    Lookup::At(loc) => {
                        st.cache_hits += 1;
                        it.loc = loc;
                        it.cached = true;
                        if it.kind == Kind::Read {
                            Step::Fetch
                        } else {
                            Step::Lock
                        }
                    }
                    miss => {
                        st.cache_misses += 1;
                        let home = t.home_bucket(it.hash);
                        match miss {
                            // An insert reads the bucket for a free slot its
                            // other inserts did not claim.
                            Lookup::Probe(s) if it.kind != Kind::Insert => {
                                st.slot_probes += 1;
                                Step::Probe { at: home.add(layout::slot_offset(t.value_size, s)) }
                            }
                            _ => Step::Bucket { at: home, hop: 0 },
                        }
                    }
                };
            }
        }
        let lw = self.lock_word();
        loop {
            let mut pending =
                (self.executed..self.n).filter(|&i| !matches!(self.items[i].step, Step::Start | Step::Done));
            let one = match (pending.next(), pending.next()) {
                // Done: no item needs another round trip.
                (None, _) => return Ok(()),
                (Some(i), None) if self.items[i].step.trip() => Some(i),
                _ => None,
            };
            if let Some(i) = one {
                // One item needs a round trip (most fetches): its batch is
                // posted alone, without a round's arrays.
                let t = db.table(self.items[i].table);
                let mut b = ctx.batch();
                let (read, cas) = self.items[i].push(&mut b, t, lw);
                let done = b.post().await?;
                if let Some(cas) = cas {
                    self.items[i].locked = done.old(cas) == 0;
                    if !self.items[i].locked {
                        return Err(TxnError::Abort(Abort::Locked));
                    }
                }
                self.settle(i, t, db.replicas, done.bytes(read)).map_err(TxnError::from)?;
                continue;
            }
            // Chains to extend first (rare: only inserts into full chains).
            for i in self.executed..self.n {
                if let Step::Extend { last } = self.items[i].step {
                    let t = db.table(self.items[i].table);
                    // Rare (an insert into a full chain): its future is
                    // boxed so that its code stays out of every fetch's.
                    let ext: std::pin::Pin<Box<dyn std::future::Future<Output = _> + '_>> =
                        Box::pin(extend_chain(ctx, t, db.replicas, last));
                    let at = ext.await?;
                    self.d.0.stats.borrow_mut().chains_extended += 1;
                    self.items[i].step = Step::Bucket { at, hop: 1 };
                }
            }
            let mut round = Round::new(ctx);
            for it in &mut self.items[self.executed..self.n] {
                it.posted = match it.room(db) {
                    Some((blade, wrs, bytes)) => {
                        let (batch, b) = round.batch(blade, wrs, bytes)?;
                        let (read, cas) = it.push(b, db.table(it.table), lw);
                        Some(Posted { batch, read, cas })
                    }
                    None => None,
                };
            }
            debug_assert!(!round.is_empty(), "an item needed a round trip");
            round.post().await?;
            // Every lock acquired is recorded before any abort is decided,
            // so that the abort releases exactly those.
            let mut abort = None;
            for it in &mut self.items[self.executed..self.n] {
                if let Some(Posted { batch, cas: Some(cas), .. }) = it.posted {
                    let d = round.landed(batch);
                    it.locked = d.old(cas) == 0;
                    if !it.locked {
                        abort = Some(Abort::Locked);
                    }
                }
            }
            if let Some(a) = abort {
                return Err(TxnError::Abort(a));
            }
            for i in self.executed..self.n {
                let Some(p) = self.items[i].posted.take() else { continue };
                let bytes = round.landed(p.batch).bytes(p.read);
                let t = db.table(self.items[i].table);
                match self.settle(i, t, db.replicas, bytes) {
                    Ok(()) => {}
                    Err(Unsettled::Abort(a)) => abort = abort.or(Some(a)),
                    Err(Unsettled::Corrupt(e)) => return Err(TxnError::Dtx(*e)),
                }
            }
            if let Some(a) = abort {
                return Err(TxnError::Abort(a));
            }
        }
    }

    /// Takes a fetched record or bucket into item `i`, choosing its next
    /// step.
    fn settle(&mut self, i: usize, t: &Table, replicas: usize, bytes: &[u8]) -> Result<(), Unsettled> {
        // The other items, to see which free slots this transaction's other
        // inserts chose already (two inserts into one chain take
        // successive free slots).
        let (before, rest) = self.items[..self.n].split_at_mut(i);
        let (it, after) = rest.split_first_mut().expect("item i exists");
        let claimed = |at: GlobalAddr| {
            before
                .iter()
                .chain(after.iter())
                .any(|o| o.kind == Kind::Insert && matches!(o.step, Step::Lock | Step::Done) && o.loc[0] == at)
        };
        let vs = t.value_size;
        match it.step {
            Step::Fetch | Step::Lock => {
                let r = layout::decode(bytes, vs).map_err(|_| Abort::Torn)?;
                if it.cached && (r.state == state::FREE || r.key != it.key || r.table != u64::from(it.table)) {
                    // The cache's hint named another key's slot: this key
                    // stops trusting prints. A read item reads its bucket
                    // instead; a locked one aborts (its lock, held on the
                    // wrong record, is released with the others).
                    self.d.0.cache.borrow_mut().stale(t, it.key);
                    self.d.0.stats.borrow_mut().cache_stale += 1;
                    it.cached = false;
                    if it.step == Step::Lock {
                        return Err(Abort::Validation.into());
                    }
                    it.step = Step::Bucket { at: t.home_bucket(it.hash), hop: 0 };
                    return Ok(());
                }
                let ours = r.state == state::FREE || r.key == it.key;
                if it.kind == Kind::Read && (r.state != state::LIVE || !ours) {
                    return it.missing().map_err(Unsettled::Abort);
                }
                match it.kind {
                    Kind::Read | Kind::Update | Kind::Delete if r.state != state::LIVE || !ours => {
                        return Err(Abort::NotFound.into())
                    }
                    Kind::Insert if r.state == state::LIVE && r.key == it.key => return Err(Abort::Exists.into()),
                    // Another key took the free slot since we read its bucket.
                    Kind::Insert if !ours => return Err(Abort::Validation.into()),
                    _ => {}
                }
                it.take(&r);
            }
            Step::Probe { at } => {
                let (key, table) = layout::key_of(bytes);
                let ours = key == it.key && table == u64::from(it.table);
                // A free slot is all zero, and key 0 is a key too: the
                // state tells them apart, after the CRC.
                if ours || key == 0 {
                    let r = layout::decode(bytes, vs).map_err(|_| Abort::Torn)?;
                    if r.state == state::FREE {
                        // The chain's free tail starts before any slot of
                        // this key.
                        return it.missing().map_err(Unsettled::Abort);
                    }
                    if ours {
                        return Self::found(&self.d, t, it, t.array_mirrors(at, replicas), &r)
                            .map_err(Unsettled::Abort);
                    }
                }
                // Another key's slot (the cache did not know it yet): the
                // bucket is read.
                self.d.0.cache.borrow().learn(t, t.bucket_of(at), t.slot_of(at), key);
                self.d.0.stats.borrow_mut().slot_probes_taken += 1;
                it.step = Step::Bucket { at: t.home_bucket(it.hash), hop: 0 };
            }
            Step::Bucket { at, hop } => {
                let home = hop == 0;
                let next = layout::header_of(bytes).0;
                // The bucket's copies in the table's order of replicas (the
                // primary in use first: see `Db::without`).
                let mirrors: Loc = if home {
                    t.array_mirrors(at, replicas)
                } else {
                    t.overflow_loc(self.d.0.ctx.blades(), replicas, bytes, at).map_err(Unsettled::corrupt)?
                };
                let rb = t.record_bytes();
                let mut free = None;
                for s in 0..layout::SLOTS {
                    let off = layout::slot_offset(vs, s);
                    let rec = &bytes[off as usize..off as usize + rb];
                    // A slot's key word changes once (0 → its key) and is
                    // read whole: a slot that names another key is that
                    // key's for good and needs no CRC check; the slot of
                    // this key, and a free one, are checked in full.
                    let (key, table) = layout::key_of(rec);
                    if (key != it.key || table != u64::from(it.table)) && key != 0 {
                        if home {
                            // Its print, so that the probes of missing keys
                            // of this bucket can pass it.
                            self.d.0.cache.borrow().learn(t, t.bucket_of(at), s, key);
                        }
                        continue;
                    }
                    let r = layout::decode(rec, vs).map_err(|_| Abort::Torn)?;
                    if r.state == state::FREE {
                        if it.kind == Kind::Insert && claimed(at.add(off)) {
                            continue;
                        }
                        free = Some(off);
                        break;
                    }
                    if r.key != it.key || r.table != u64::from(it.table) {
                        continue;
                    }
                    let loc = slot_loc(at.add(off), off, &mirrors, replicas);
                    return Self::found(&self.d, t, it, loc, &r).map_err(Unsettled::Abort);
                }
                match (free, it.kind) {
                    (Some(off), Kind::Insert) => {
                        it.loc = slot_loc(at.add(off), off, &mirrors, replicas);
                        it.step = Step::Lock;
                    }
                    (Some(_), _) => return it.missing().map_err(Unsettled::Abort),
                    (None, _) if next != 0 => {
                        let blades = self.d.0.ctx.blades();
                        let next = stored_addr(blades, next, t.bucket_bytes(), || {
                            format!("table {}: the next bucket after {at}", t.id)
                        })
                        .map_err(Unsettled::corrupt)?;
                        chain_within(blades, t, t.home_bucket(it.hash), u64::from(hop)).map_err(Unsettled::corrupt)?;
                        it.step = Step::Bucket { at: next, hop: hop.saturating_add(1) };
                    }
                    (None, Kind::Insert) => it.step = Step::Extend { last: at },
                    (None, _) => return it.missing().map_err(Unsettled::Abort),
                }
            }
            Step::Start | Step::Extend { .. } | Step::Done => unreachable!("settled only after a fetch"),
        }
        Ok(())
    }

    /// Item `it` is at `loc`, whose record `r` holds its key (read through
    /// its bucket or a probe): caches the address and takes the record.
    fn found(d: &Dtx, t: &Table, it: &mut Item, loc: Loc, r: &layout::Record<'_>) -> Result<(), Abort> {
        it.loc = loc;
        // A slot keeps its key for good: cache it.
        d.0.cache.borrow_mut().insert(t, it.key, it.hash, loc);
        match it.kind {
            Kind::Read if r.state == state::LIVE => it.take(r),
            Kind::Read => return it.missing(),
            Kind::Insert if r.state == state::LIVE => return Err(Abort::Exists),
            _ => it.step = Step::Lock,
        }
        Ok(())
    }

    /// Releases every lock this transaction acquired (and only those), each
    /// with a CAS from this transaction's lock word to 0.
    ///
    /// Not a WRITE of 0 (as FORD does): an RNIC's atomics are atomic only
    /// with respect to other atomics, and some execute a CAS as read,
    /// compare, write back under a lock that WRITEs do not take, even when
    /// the compare fails (Soft-RoCE's rxe in Linux 6.1 does). A WRITE of 0
    /// that lands during another transaction's failing CAS on the same word
    /// is then overwritten with the old lock word, and the lock stays held
    /// for good. A CAS also never clears a lock that is no longer ours.
    ///
    /// # Errors
    /// [`DtxError::LeaseLost`] or [`DtxError::Corrupt`] if a lock word no
    /// longer held this transaction's word; verb errors.
    async fn release(&mut self) -> Result<(), TxnError> {
        if !self.items[..self.n].iter().any(|it| it.locked) {
            // Nothing locked (every abort of a read, e.g. a key not found).
            return Ok(());
        }
        let ctx = self.d.0.ctx.clone();
        let lw = self.lock_word();
        let mut round = Round::new(&ctx);
        let mut cases = [None; 4 * log::MAX_WRITES];
        for (i, it) in self.items[..self.n].iter().enumerate() {
            if it.locked {
                let (batch, b) = round.batch(it.loc[0].blade(), 1, 8)?;
                cases[i] = Some((batch, b.cas(it.loc[0].add(layout::LOCK), lw, 0)));
            }
        }
        round.post().await?;
        for it in &mut self.items[..self.n] {
            it.locked = false;
        }
        for (i, c) in cases[..self.n].iter().enumerate() {
            let Some((batch, cas)) = c else { continue };
            let old = round.landed(*batch).old(*cas);
            if old != lw {
                self.fenced()?;
                return Err(lock_not_ours(&self.items[i], old, lw));
            }
        }
        Ok(())
    }

    fn writes(&self) -> usize {
        self.items[..self.n].iter().filter(|it| it.kind != Kind::Read).count()
    }

    /// Validates, logs, commits and unlocks (see the module docs).
    ///
    /// # Errors
    /// [`TxnError::Abort`] (every lock released first); verb errors (locks
    /// may be left for recovery).
    ///
    /// # Panics
    /// If items declared since the last [`Txn::execute`] were not executed,
    /// or an update or insert has no new value.
    pub async fn commit(&mut self) -> Result<(), TxnError> {
        assert_eq!(self.executed, self.n, "commit() before execute() of every item");
        let writes = self.writes();
        let validate = self.n > 1 || writes > 0;
        if writes > log::MAX_WRITES {
            self.release().await?;
            return Err(too_large("written items"));
        }
        if let Some(it) =
            self.items[..self.n].iter().find(|it| matches!(it.kind, Kind::Update | Kind::Insert) && !it.written)
        {
            panic!("item ({}, {}) is written without a value: call write()", it.table, it.key);
        }
        if writes == 0 && !validate {
            // One read item: its READ verified itself, unless the record
            // was locked: its holder may be committing a write that
            // recovery rolls back if its compute blade dies before it
            // releases the lock, so what was read is not known committed.
            return if self.n == 1 && self.items[0].held { Err(TxnError::Abort(Abort::Locked)) } else { Ok(()) };
        }
        if writes > 0 {
            // Before the commit point: a fenced transaction writes nothing
            // (its locks are recovery's to release).
            self.fenced()?;
            if !self.d.0.db.joining.is_empty() {
                self.copies_known().await?;
            }
        }
        match self.validate_and_log(validate, writes).await {
            Ok(()) => {}
            Err(TxnError::Abort(a)) => {
                if writes > 0 {
                    // Its log entry landed with the failed validation: voided
                    // before any lock goes (see `unlog`).
                    self.unlog().await?;
                }
                self.release().await?;
                return Err(TxnError::Abort(a));
            }
            Err(e) => return Err(e),
        }
        if writes == 0 {
            return Ok(());
        }
        self.write_records().await?;
        self.release().await?;
        // Inserted keys are in their slots for good now.
        let mut cache = self.d.0.cache.borrow_mut();
        for it in self.items[..self.n].iter().filter(|it| it.kind == Kind::Insert && !it.cached) {
            cache.insert(self.d.0.db.table(it.table), it.key, it.hash, it.loc);
        }
        Ok(())
    }

    /// While a blade joins ([`Db::view`]): every written item's copy there
    /// must be known, or the blade's copy would miss this write (a bucket
    /// added while the blade was out has no copy there until the
    /// re-replication makes one, and an address read before that names
    /// none). Aborts otherwise, its locks released and the item's cached
    /// address forgotten, so that the retry reads the bucket's header anew.
    #[cold]
    async fn copies_known(&mut self) -> Result<(), TxnError> {
        let db = self.d.0.db.clone();
        let unknown = self.items[..self.n]
            .iter()
            .filter(|it| it.kind != Kind::Read)
            .find(|it| (0..db.table(it.table).writes).any(|v| it.loc[v].is_null()))
            .map(|it| (it.table, it.key));
        let Some((table, key)) = unknown else { return Ok(()) };
        self.d.0.cache.borrow_mut().forget(db.table(table), key);
        self.d.0.stats.borrow_mut().copies_unknown += 1;
        self.release().await?;
        Err(TxnError::Abort(Abort::Validation))
    }

    /// Round 1 of the commit: the log entry WRITE and the read items'
    /// version-and-lock READs, together.
    async fn validate_and_log(&mut self, validate: bool, writes: usize) -> Result<(), TxnError> {
        let ctx = self.d.0.ctx.clone();
        let entry_len = if writes > 0 { self.encode_entry() } else { 0 };
        let mut round = Round::new(&ctx);
        let mut checks = [None; 4 * log::MAX_WRITES];
        if validate {
            for (i, it) in self.items[..self.n].iter().enumerate() {
                if it.kind == Kind::Read && !it.absent {
                    let (batch, b) = round.batch(it.loc[0].blade(), 1, 16)?;
                    checks[i] = Some((batch, b.read(it.loc[0].add(layout::VERSION), 16)));
                }
            }
        }
        let slot = self.seq % log::ENTRIES;
        if entry_len > 0 {
            // One WRITE per copy of the log, each in its blade's doorbell.
            for ring in self.ring.iter().take_while(|r| !r.is_null()) {
                let at = ring.add(slot * log::entry_bytes(self.d.0.db.max_value) as u64);
                round.batch(at.blade(), 1, entry_len.next_multiple_of(8))?.1.write(at, &self.entry[..entry_len]);
            }
        }
        if round.is_empty() {
            return Ok(());
        }
        round.post().await?;
        for (i, c) in checks[..self.n].iter().enumerate() {
            if let Some((batch, r)) = c {
                let b = round.landed(*batch).bytes(*r);
                let version = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                let lock = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
                if version != self.items[i].version || lock & layout::LOCKED != 0 {
                    return Err(TxnError::Abort(Abort::Validation));
                }
            }
        }
        Ok(())
    }

    /// Voids this transaction's log entry on every copy (its magic zeroed),
    /// once its validation failed: it wrote no record, and must not be
    /// taken for one that died while writing. Where every primary of its
    /// items is lost, recovery can tell the two only by the surviving
    /// copies' versions, and an aborted transaction's items may have been
    /// written since by others (its locks released): rolling it back would
    /// undo their commits. Posted and awaited before its locks are
    /// released, so that an entry still valid belongs to a transaction
    /// that holds its locks (or released them after writing everything).
    #[cold]
    async fn unlog(&mut self) -> Result<(), TxnError> {
        let ctx = self.d.0.ctx.clone();
        let slot = self.seq % log::ENTRIES;
        let mut round = Round::new(&ctx);
        for ring in self.ring.iter().take_while(|r| !r.is_null()) {
            let at = ring.add(slot * log::entry_bytes(self.d.0.db.max_value) as u64);
            round.batch(at.blade(), 1, 8)?.1.write(at, &[0u8; 8]);
        }
        round.post().await?;
        Ok(())
    }

    /// Encodes the undo log entry; returns its length.
    fn encode_entry(&mut self) -> usize {
        let db = &self.d.0.db;
        let item_bytes = log::ITEM_HEADER + layout::value_cap(db.max_value);
        let e = &mut self.entry;
        let put = |e: &mut [u8], i: usize, v: u64| e[i..i + 8].copy_from_slice(&v.to_le_bytes());
        let mut k = 0;
        for it in self.items[..self.n].iter().filter(|it| it.kind != Kind::Read) {
            let o = log::HEADER + k * item_bytes;
            let vs = db.table(it.table).value_size;
            let t = db.table(it.table);
            put(e, o, u64::from(it.table) | u64::from(it.state) << 32 | u64::from(t.order[0]) << 40);
            put(e, o + 8, it.key);
            put(e, o + 16, it.version);
            put(e, o + 24, vs as u64);
            // Every replica's copy by the replicas as created.
            for v in 0..MAX_REPLICAS {
                put(e, o + 32 + 8 * usize::from(t.order[v]), it.loc[v].raw());
            }
            let v = &mut e[o + log::ITEM_HEADER..o + item_bytes];
            v.fill(0);
            if it.state != state::FREE {
                v[..vs].copy_from_slice(&it.value);
            }
            k += 1;
        }
        let len = log::HEADER + k * item_bytes;
        put(e, 0, log::MAGIC);
        put(e, 8, self.d.0.nonce);
        put(e, 16, self.seq);
        put(e, 24, self.owner.lock_word(self.seq));
        put(e, 32, k as u64 | (len as u64) << 32);
        e[40..64].fill(0);
        let c = log::crc(&e[..len]);
        e[40..44].copy_from_slice(&c.to_le_bytes());
        len
    }

    /// Round 2: every replica's new record, and a flush READ per blade.
    async fn write_records(&mut self) -> Result<(), TxnError> {
        // One Rc clone (no atomic, as an Arc<Db> clone would be) holds the
        // context and the database while `self` is borrowed.
        let d = self.d.clone();
        let (ctx, db) = (&d.0.ctx, &*d.0.db);
        let lw = self.lock_word();
        let rb_max = layout::record_bytes(db.max_value);
        self.images.resize(self.n * MAX_REPLICAS * rb_max, 0);
        for (i, it) in self.items[..self.n].iter().enumerate() {
            if it.kind == Kind::Read {
                continue;
            }
            let t = db.table(it.table);
            let (st, value) = match it.kind {
                Kind::Delete => (state::DELETED, &it.value),
                _ => (state::LIVE, &it.new),
            };
            let home = it.loc[t.home_pos()];
            for r in 0..t.writes {
                let out = &mut self.images[(i * MAX_REPLICAS + r) * rb_max..][..t.record_bytes()];
                let lock = if r == 0 { lw } else { 0 };
                layout::encode(out, t.value_size, u64::from(it.table), it.key, home, it.version + 1, lock, st, value);
            }
        }
        let mut round = Round::new(ctx);
        let mut last = [GlobalAddr::NULL; ROUND];
        for (i, it) in self.items[..self.n].iter().enumerate() {
            if it.kind == Kind::Read {
                continue;
            }
            let t = db.table(it.table);
            let rb = t.record_bytes();
            for r in 0..t.writes {
                // Room for the flush READ too.
                let (batch, b) = round.batch(it.loc[r].blade(), 2, rb + 8)?;
                b.write(it.loc[r], &self.images[(i * MAX_REPLICAS + r) * rb_max..][..rb]);
                last[batch] = it.loc[r];
            }
        }
        for (batch, at) in last.iter().enumerate().take(round.n) {
            round.batches[batch].as_mut().expect("made").read(*at, 8);
        }
        round.post().await?;
        Ok(())
    }
}
