//! The interface every disaggregated key-value index offers: what the
//! workloads (YCSB) and the test kit drive, so that a new index (the hash
//! table, the B+tree) plugs in with no new run loop.
//!
//! A `KvIndex` value is one worker thread's handle on a named index on the
//! memory blades: cheap to clone, and clones of one thread share that
//! thread's caches (directory, index cache, speculation) and counters.
//! Methods are `async fn`s run on the thread's [`Runtime`](crate::Runtime);
//! nothing is boxed or allocated per call by the trait itself.

use std::fmt;

use serde::Serialize;

use crate::Ctx;

/// Counters a thread's handle keeps (e.g. splits, speculative hits), merged
/// over threads and serialized into the result record under the index's
/// [`KvIndex::APP`] name.
pub trait IndexStats: Default + Clone + fmt::Debug + Serialize + Send + 'static {
    /// Adds `other` into `self`.
    fn merge(&mut self, other: &Self);
}

/// An index without counters of its own.
impl IndexStats for () {
    fn merge(&mut self, _: &Self) {}
}

/// What [`KvIndex::audit`] finds in a quiescent index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Every key stored, once per place it is stored in (a key stored twice
    /// appears twice).
    pub keys: Vec<Vec<u8>>,
}

impl Audit {
    /// Keys stored more than once.
    pub fn duplicates(&self) -> u64 {
        let mut k: Vec<&Vec<u8>> = self.keys.iter().collect();
        k.sort_unstable();
        let n = k.len();
        k.dedup();
        (n - k.len()) as u64
    }
}

/// Key-value pairs in two flat buffers: what a range scan returns, reused
/// from scan to scan without an allocation per pair.
///
/// ```
/// let mut p = smart_core::index::Pairs::default();
/// p.push(b"k1", b"v1");
/// p.push(b"k2", b"value2");
/// assert_eq!(p.len(), 2);
/// assert_eq!(p.get(1), (&b"k2"[..], &b"value2"[..]));
/// assert_eq!(p.iter().map(|(k, _)| k.to_vec()).collect::<Vec<_>>(), [b"k1".to_vec(), b"k2".to_vec()]);
/// p.clear();
/// assert!(p.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs {
    bytes: Vec<u8>,
    /// Per pair: where its key ends and where its value ends in `bytes`.
    ends: Vec<(usize, usize)>,
}

impl Pairs {
    /// Removes every pair (keeping the buffers).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Appends a pair.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.bytes.extend_from_slice(key);
        let k = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.ends.push((k, self.bytes.len()));
    }

    /// Pairs held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no pair.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Pair `i` (key, value).
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn get(&self, i: usize) -> (&[u8], &[u8]) {
        let start = if i == 0 { 0 } else { self.ends[i - 1].1 };
        let (k, v) = self.ends[i];
        (&self.bytes[start..k], &self.bytes[k..v])
    }

    /// The pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// A key-value index on disaggregated memory (see the module docs).
///
/// Keys and values are byte strings; an index may refuse sizes it cannot
/// store with an error.
// The runtime is single-threaded: these futures are never sent across
// threads, so the missing `Send` bound the lint warns about is intended.
#[allow(async_fn_in_trait)]
pub trait KvIndex: Clone + 'static {
    /// Short name of the application ("race", "sherman"): the `app` of the
    /// result record and the key its [`KvIndex::Stats`] go under.
    const APP: &'static str;

    /// Whether [`KvIndex::scan`] is supported (an ordered index).
    const SCANS: bool = false;

    /// The index's errors; verb errors convert into it.
    type Error: std::error::Error + From<crate::Error> + 'static;

    /// Per-thread counters.
    type Stats: IndexStats;

    /// The index's shape after a run (depth, nodes, ...), for the record.
    type Shape: Serialize + fmt::Debug;

    /// Opens index `name`, creating it first (sized for about `capacity`
    /// keys; it may grow beyond) if it does not exist. Returns the handle
    /// and whether the index existed before.
    ///
    /// # Errors
    /// Verb and allocation errors; an object of another kind under `name`.
    async fn open_or_create(ctx: &Ctx, name: &str, capacity: u64) -> Result<(Self, bool), Self::Error>;

    /// As [`KvIndex::open_or_create`], for keys of up to `key_size` and
    /// values of up to `value_size` bytes: an index that fixes its sizes
    /// when it is created (sherman-bt) is made for these; an existing one
    /// keeps its own. The default ignores the sizes.
    ///
    /// # Errors
    /// As [`KvIndex::open_or_create`]; sizes the index cannot store.
    async fn open_or_create_sized(
        ctx: &Ctx,
        name: &str,
        capacity: u64,
        key_size: usize,
        value_size: usize,
    ) -> Result<(Self, bool), Self::Error> {
        let _ = (key_size, value_size);
        Self::open_or_create(ctx, name, capacity).await
    }

    /// Whether index `name` exists on the blades.
    ///
    /// # Errors
    /// Verb errors.
    async fn exists(ctx: &Ctx, name: &str) -> Result<bool, Self::Error>;

    /// The least memory, in bytes over all blades, that creating the index
    /// for `capacity` keys and inserting `keys` keys of `key_size` +
    /// `value_size` bytes takes (a lower bound: what a load surely needs),
    /// or `None` if unknown (the default). A load checks it against the
    /// blades' free memory before it allocates anything.
    fn bytes_needed(capacity: u64, keys: u64, key_size: usize, value_size: usize) -> Option<u64> {
        let _ = (capacity, keys, key_size, value_size);
        None
    }

    /// Looks `key` up; its value goes to `out`. Returns whether it exists.
    ///
    /// # Errors
    /// Verb errors; a structure that stays inconsistent over re-reads.
    async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Self::Error>;

    /// Inserts `key` if absent; returns whether it did.
    ///
    /// # Errors
    /// As [`KvIndex::get`]; a full index.
    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Self::Error>;

    /// Overwrites `key` if present; returns whether it did.
    ///
    /// # Errors
    /// As [`KvIndex::get`].
    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Self::Error>;

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// As [`KvIndex::insert`].
    async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<(), Self::Error>;

    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// As [`KvIndex::get`].
    async fn delete(&mut self, key: &[u8]) -> Result<bool, Self::Error>;

    /// Up to `count` pairs whose keys are ≥ `start`, in key order, into
    /// `out` (cleared first); returns how many. Only where
    /// [`KvIndex::SCANS`].
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) from an index
    /// without order (the default); verb errors.
    async fn scan(&mut self, start: &[u8], count: usize, out: &mut Pairs) -> Result<usize, Self::Error> {
        let _ = (start, count, out);
        Err(crate::Error::Unsupported(format!("{} has no range scans", Self::APP)).into())
    }

    /// This thread's counters so far.
    fn stats(&self) -> Self::Stats;

    /// Ends this thread's use of the index: hands back what it holds (e.g.
    /// memory kept for reuse). Call it once per thread when done; the
    /// default does nothing.
    ///
    /// # Errors
    /// Verb errors.
    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Reads the whole index, which must be quiescent, and checks its
    /// structure; returns every key stored.
    ///
    /// # Errors
    /// A structural fault (naming it); verb errors.
    async fn audit(&mut self) -> Result<Audit, Self::Error>;

    /// The index's current shape, read from the blades.
    ///
    /// # Errors
    /// Verb errors; a malformed index.
    async fn shape(&mut self) -> Result<Self::Shape, Self::Error>;
}
