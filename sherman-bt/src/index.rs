//! The tree as a [`KvIndex`]: what the workloads drive.

use serde::Serialize;
use smart_core::index::Pairs;
use smart_core::{Audit, Ctx, IndexStats, KvIndex};

use crate::ops::Kind;
use crate::{Result, ShermanBt, ShermanError, TreeShape};

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
    /// Torn page copies read again.
    pub torn: u64,
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
    torn: u64,
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
            torn: s.torn,
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
        self.torn += o.torn;
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
    /// As [`ShermanBt::get_u64`]; allocation errors.
    pub async fn insert_u64(&mut self, key: u64, value: u64) -> Result<bool> {
        self.modify(key, value, Kind::Insert).await
    }

    /// Overwrites `key` if present; returns whether it did.
    ///
    /// # Errors
    /// As [`ShermanBt::get_u64`].
    pub async fn update_u64(&mut self, key: u64, value: u64) -> Result<bool> {
        self.modify(key, value, Kind::Update).await
    }

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// As [`ShermanBt::insert_u64`].
    pub async fn upsert_u64(&mut self, key: u64, value: u64) -> Result<()> {
        self.modify(key, value, Kind::Upsert).await.map(drop)
    }

    /// Removes `key`; returns whether it was there.
    ///
    /// # Errors
    /// As [`ShermanBt::get_u64`].
    pub async fn delete_u64(&mut self, key: u64) -> Result<bool> {
        self.modify(key, 0, Kind::Delete).await
    }
}

fn val(v: &[u8]) -> u64 {
    u64::from_le_bytes(v.try_into().expect("checked: 8 bytes"))
}

impl KvIndex for ShermanBt {
    const APP: &'static str = "sherman";
    const SCANS: bool = true;
    type Error = ShermanError;
    type Stats = ShermanStats;
    type Shape = TreeShape;

    /// Full leaves for `keys` keys (inner nodes and half-full leaves not
    /// counted).
    fn bytes_needed(_capacity: u64, keys: u64, _key_size: usize, _value_size: usize) -> Option<u64> {
        Some(keys.div_ceil(crate::layout::ENTRIES as u64).saturating_mul(crate::layout::PAGE as u64))
    }

    async fn open_or_create(ctx: &Ctx, name: &str, _capacity: u64) -> Result<(Self, bool)> {
        ShermanBt::open_or_create(ctx, name).await
    }

    async fn exists(ctx: &Ctx, name: &str) -> Result<bool> {
        ShermanBt::exists(ctx, name).await
    }

    async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let k = Self::key_of(key, None)?;
        Ok(match self.get_u64(k).await? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(&v.to_le_bytes());
                true
            }
            None => false,
        })
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        let k = Self::key_of(key, Some(value))?;
        self.insert_u64(k, val(value)).await
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        let k = Self::key_of(key, Some(value))?;
        self.update_u64(k, val(value)).await
    }

    async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let k = Self::key_of(key, Some(value))?;
        self.upsert_u64(k, val(value)).await
    }

    async fn delete(&mut self, key: &[u8]) -> Result<bool> {
        let k = Self::key_of(key, None)?;
        self.delete_u64(k).await
    }

    async fn scan(&mut self, start: &[u8], count: usize, out: &mut Pairs) -> Result<usize> {
        let k = Self::key_of(start, None)?;
        let mut pairs = std::mem::take(&mut self.scanned);
        let r = self.scan_u64(k, count, &mut pairs).await;
        out.clear();
        for (k, v) in &pairs {
            out.push(&k.to_le_bytes(), &v.to_le_bytes());
        }
        self.scanned = pairs;
        r.map(|()| out.len())
    }

    fn stats(&self) -> ShermanStats {
        self.counters()
    }

    async fn audit(&mut self) -> Result<Audit> {
        let (_, keys) = self.walk().await?;
        Ok(Audit { keys: keys.into_iter().map(|k| k.to_le_bytes().to_vec()).collect() })
    }

    async fn shape(&mut self) -> Result<TreeShape> {
        Ok(self.walk().await?.0)
    }
}
