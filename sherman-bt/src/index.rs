//! The tree as a [`KvIndex`]: what the workloads drive.

use serde::Serialize;
use smart_core::index::Pairs;
use smart_core::{Audit, Ctx, IndexStats, KvIndex};

use crate::ops::Kind;
use crate::{Format, Result, ShermanBt, ShermanError, TreeShape};

/// A thread's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(into = "StatsRecord")]
pub struct ShermanStats {
    /// Lookups (`get`).
    pub lookups: u64,
    /// Bytes lookups read (speculative lines, pages, root words).
    pub lookup_bytes: u64,
    /// Speculative lookups accepted (one line read).
    pub spec_hits: u64,
    /// Lookups that took the normal path with speculation on: nothing known
    /// about the key, or a guess refused.
    pub spec_misses: u64,
    /// Guesses refused (the line no longer held the key).
    pub spec_stale: u64,
    /// Leaves found through the index cache.
    pub cache_hits: u64,
    /// Leaves found by a descent from the root.
    pub cache_misses: u64,
    /// Leaf splits.
    pub leaf_splits: u64,
    /// Internal page splits.
    pub internal_splits: u64,
    /// New roots installed.
    pub root_grows: u64,
    /// New roots written but not installed: another client's came first.
    pub root_races: u64,
    /// Failed lock CASes.
    pub lock_retries: u64,
    /// Locks taken over from a holder whose lease ran out.
    pub lock_steals: u64,
    /// Locks this client found taken over before it wrote under them
    /// (it stalled for a lease): the operation started over.
    pub lease_losses: u64,
    /// Locks handed over to a local waiter.
    pub handovers: u64,
    /// Moves to a right sibling (a page split since it was found).
    pub sibling_hops: u64,
    /// Descents started over from the root.
    pub restarts: u64,
    /// Moves from a page merged away to the page that took its range.
    pub left_hops: u64,
    /// Pages merged away removed from a parent that still named them after
    /// their link stopped leading to their keys.
    pub dead_repairs: u64,
    /// Torn page copies read again.
    pub torn: u64,
    /// KV blocks written (values too long for the leaves).
    pub blocks_written: u64,
    /// KV blocks retired (replaced, deleted, or never linked).
    pub blocks_retired: u64,
    /// Value blocks read that held another key (the entry changed since
    /// it was read): the read went again.
    pub stale_blocks: u64,
    /// Pages merged into their left neighbour by this thread.
    pub merges: u64,
    /// Merges a client left unfinished, finished (or undone) by this thread.
    pub merges_helped: u64,
    /// Pages freed (unlinked from their parent, then retired).
    pub pages_freed: u64,
    /// Times this thread dropped its caches because pages were freed.
    pub cache_drops: u64,
}

/// The record's form of [`ShermanStats`]: the counters and the rates.
#[derive(Serialize)]
struct StatsRecord {
    lookups: u64,
    bytes_per_lookup: f64,
    spec_hits: u64,
    spec_misses: u64,
    spec_stale: u64,
    spec_hit_rate: f64,
    cache_hits: u64,
    cache_misses: u64,
    cache_hit_rate: f64,
    leaf_splits: u64,
    internal_splits: u64,
    root_grows: u64,
    root_races: u64,
    lock_retries: u64,
    lock_steals: u64,
    lease_losses: u64,
    handovers: u64,
    sibling_hops: u64,
    restarts: u64,
    left_hops: u64,
    dead_repairs: u64,
    torn: u64,
    blocks_written: u64,
    blocks_retired: u64,
    stale_blocks: u64,
    merges: u64,
    merges_helped: u64,
    pages_freed: u64,
    cache_drops: u64,
}

fn rate(a: u64, b: u64) -> f64 {
    if a + b == 0 {
        0.0
    } else {
        a as f64 / (a + b) as f64
    }
}

impl ShermanStats {
    /// Accepted over attempted speculative lookups.
    pub fn spec_hit_rate(&self) -> f64 {
        rate(self.spec_hits, self.spec_misses)
    }

    /// Index-cache hits over leaf searches.
    pub fn cache_hit_rate(&self) -> f64 {
        rate(self.cache_hits, self.cache_misses)
    }

    /// Mean bytes read per lookup.
    pub fn bytes_per_lookup(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.lookup_bytes as f64 / self.lookups as f64
        }
    }
}

impl From<ShermanStats> for StatsRecord {
    fn from(s: ShermanStats) -> Self {
        StatsRecord {
            lookups: s.lookups,
            bytes_per_lookup: s.bytes_per_lookup(),
            spec_hits: s.spec_hits,
            spec_misses: s.spec_misses,
            spec_stale: s.spec_stale,
            spec_hit_rate: s.spec_hit_rate(),
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_hit_rate: s.cache_hit_rate(),
            leaf_splits: s.leaf_splits,
            internal_splits: s.internal_splits,
            root_grows: s.root_grows,
            root_races: s.root_races,
            lock_retries: s.lock_retries,
            lock_steals: s.lock_steals,
            lease_losses: s.lease_losses,
            handovers: s.handovers,
            sibling_hops: s.sibling_hops,
            restarts: s.restarts,
            left_hops: s.left_hops,
            dead_repairs: s.dead_repairs,
            torn: s.torn,
            blocks_written: s.blocks_written,
            blocks_retired: s.blocks_retired,
            stale_blocks: s.stale_blocks,
            merges: s.merges,
            merges_helped: s.merges_helped,
            pages_freed: s.pages_freed,
            cache_drops: s.cache_drops,
        }
    }
}

impl IndexStats for ShermanStats {
    fn merge(&mut self, o: &Self) {
        self.lookups += o.lookups;
        self.lookup_bytes += o.lookup_bytes;
        self.spec_hits += o.spec_hits;
        self.spec_misses += o.spec_misses;
        self.spec_stale += o.spec_stale;
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.leaf_splits += o.leaf_splits;
        self.internal_splits += o.internal_splits;
        self.root_grows += o.root_grows;
        self.root_races += o.root_races;
        self.lock_retries += o.lock_retries;
        self.lock_steals += o.lock_steals;
        self.lease_losses += o.lease_losses;
        self.handovers += o.handovers;
        self.sibling_hops += o.sibling_hops;
        self.restarts += o.restarts;
        self.left_hops += o.left_hops;
        self.dead_repairs += o.dead_repairs;
        self.torn += o.torn;
        self.blocks_written += o.blocks_written;
        self.blocks_retired += o.blocks_retired;
        self.stale_blocks += o.stale_blocks;
        self.merges += o.merges;
        self.merges_helped += o.merges_helped;
        self.pages_freed += o.pages_freed;
        self.cache_drops += o.cache_drops;
    }
}

impl ShermanBt {
    /// This thread's counters so far.
    pub fn counters(&self) -> ShermanStats {
        self.local.borrow().stats
    }

    /// Inserts `key` if absent; returns whether it did.
    ///
    /// # Errors
    /// A key or value longer than the tree's; as [`ShermanBt::get`];
    /// allocation errors.
    pub async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.modify(key, value, Kind::Insert).await
    }

    /// Overwrites `key` if present; returns whether it did.
    ///
    /// # Errors
    /// As [`ShermanBt::insert`].
    pub async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.modify(key, value, Kind::Update).await
    }

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// As [`ShermanBt::insert`].
    pub async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.modify(key, value, Kind::Upsert).await.map(drop)
    }

    /// Removes `key`; returns whether it was there.
    ///
    /// # Errors
    /// As [`ShermanBt::get`].
    pub async fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.modify(key, &[], Kind::Delete).await
    }

    /// Hands what the thread holds for reuse (freed pages and value blocks)
    /// back to the blades and leaves the epoch registry; call it once per
    /// thread when done (a thread that never does holds back reuse for a
    /// lease and loses what it held).
    ///
    /// # Errors
    /// Verb errors.
    pub async fn close(&self) -> Result<()> {
        Ok(self.reclaim.flush(&self.ctx).await?)
    }

    /// [`ShermanBt::get`] with a `u64` key (stored as 8 big-endian bytes, so
    /// that numeric order is byte order) and an 8-byte value (little-endian).
    ///
    /// # Errors
    /// As [`ShermanBt::get`]; a stored value that is not 8 bytes.
    pub async fn get_u64(&mut self, key: u64) -> Result<Option<u64>> {
        let mut out = Vec::new();
        if !self.get(&key.to_be_bytes(), &mut out).await? {
            return Ok(None);
        }
        let v: [u8; 8] = out
            .as_slice()
            .try_into()
            .map_err(|_| ShermanError::Corrupt(format!("key {key} holds a value of {} bytes, not a u64", out.len())))?;
        Ok(Some(u64::from_le_bytes(v)))
    }

    /// [`ShermanBt::insert`] with a `u64` key and value (see
    /// [`ShermanBt::get_u64`]).
    ///
    /// # Errors
    /// As [`ShermanBt::insert`].
    pub async fn insert_u64(&mut self, key: u64, value: u64) -> Result<bool> {
        self.insert(&key.to_be_bytes(), &value.to_le_bytes()).await
    }

    /// [`ShermanBt::update`] with a `u64` key and value.
    ///
    /// # Errors
    /// As [`ShermanBt::insert`].
    pub async fn update_u64(&mut self, key: u64, value: u64) -> Result<bool> {
        self.update(&key.to_be_bytes(), &value.to_le_bytes()).await
    }

    /// [`ShermanBt::upsert`] with a `u64` key and value.
    ///
    /// # Errors
    /// As [`ShermanBt::insert`].
    pub async fn upsert_u64(&mut self, key: u64, value: u64) -> Result<()> {
        self.upsert(&key.to_be_bytes(), &value.to_le_bytes()).await
    }

    /// [`ShermanBt::delete`] with a `u64` key.
    ///
    /// # Errors
    /// As [`ShermanBt::get`].
    pub async fn delete_u64(&mut self, key: u64) -> Result<bool> {
        self.delete(&key.to_be_bytes()).await
    }

    /// [`ShermanBt::scan`] with `u64` keys and values, into `out` (cleared
    /// first).
    ///
    /// # Errors
    /// As [`ShermanBt::get_u64`].
    pub async fn scan_u64(&mut self, start: u64, count: usize, out: &mut Vec<(u64, u64)>) -> Result<()> {
        let mut pairs = Pairs::default();
        self.scan(&start.to_be_bytes(), count, &mut pairs).await?;
        out.clear();
        for (k, v) in pairs.iter() {
            let (Ok(k), Ok(v)) = (<[u8; 8]>::try_from(k), <[u8; 8]>::try_from(v)) else {
                return Err(ShermanError::Corrupt("a scan of u64 pairs met a longer key or value".into()));
            };
            out.push((u64::from_be_bytes(k), u64::from_le_bytes(v)));
        }
        Ok(())
    }
}

impl KvIndex for ShermanBt {
    const APP: &'static str = "sherman";
    const SCANS: bool = true;
    type Error = ShermanError;
    type Stats = ShermanStats;
    type Shape = TreeShape;

    /// Full leaves for `keys` keys, and a block per key whose value goes
    /// out of line (inner nodes and half-full leaves not counted).
    fn bytes_needed(_capacity: u64, keys: u64, key_size: usize, value_size: usize) -> Option<u64> {
        let f = Format::new(key_size, value_size).ok()?;
        let leaves = keys.div_ceil(f.leaf.count as u64).saturating_mul(f.page as u64);
        let blocks = if f.out_of_line(value_size) {
            keys.saturating_mul(smart_core::kvblock::block_len(key_size, value_size) as u64)
        } else {
            0
        };
        Some(leaves.saturating_add(blocks))
    }

    async fn open_or_create(ctx: &Ctx, name: &str, _capacity: u64) -> Result<(Self, bool)> {
        ShermanBt::open_or_create(ctx, name).await
    }

    /// Creates the tree for keys of up to `key_size` and values of up to
    /// `value_size` bytes (an existing tree keeps its sizes).
    async fn open_or_create_sized(
        ctx: &Ctx,
        name: &str,
        _capacity: u64,
        key_size: usize,
        value_size: usize,
    ) -> Result<(Self, bool)> {
        let f = Format::new(key_size, value_size).map_err(ShermanError::Config)?;
        ShermanBt::open_or_create_with(ctx, name, f).await
    }

    async fn exists(ctx: &Ctx, name: &str) -> Result<bool> {
        ShermanBt::exists(ctx, name).await
    }

    async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        ShermanBt::get(self, key, out).await
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        ShermanBt::insert(self, key, value).await
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        ShermanBt::update(self, key, value).await
    }

    async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        ShermanBt::upsert(self, key, value).await
    }

    async fn delete(&mut self, key: &[u8]) -> Result<bool> {
        ShermanBt::delete(self, key).await
    }

    async fn scan(&mut self, start: &[u8], count: usize, out: &mut Pairs) -> Result<usize> {
        ShermanBt::scan(self, start, count, out).await
    }

    fn stats(&self) -> ShermanStats {
        self.counters()
    }

    async fn close(&mut self) -> Result<()> {
        ShermanBt::close(self).await
    }

    async fn audit(&mut self) -> Result<Audit> {
        let (_, keys) = self.walk().await?;
        Ok(Audit { keys })
    }

    async fn shape(&mut self) -> Result<TreeShape> {
        Ok(self.walk().await?.0)
    }
}
