//! The table as a [`KvIndex`]: what the workloads drive.

use serde::Serialize;
use smart_core::reclaim::ReclaimStats;
use smart_core::{Audit, Ctx, IndexStats, KvIndex};

use crate::{RaceConfig, RaceError, RaceHt, ResizeStats, TableShape};

/// A thread's counters: resizing as it saw it, and its speculative lookups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(into = "StatsRecord")]
pub struct RaceStats {
    /// Subtables this thread split.
    pub splits: u64,
    /// Directory doublings this thread did.
    pub doublings: u64,
    /// Times this thread re-read the directory.
    pub dir_refreshes: u64,
    /// Operations that met a frozen subtable and started over.
    pub waits: u64,
    /// Seconds this thread spent splitting.
    pub split_s: f64,
    /// Seconds of that spent waiting for the directory lock.
    pub dir_wait_s: f64,
    /// Split or directory locks taken over from a dead holder.
    pub takeovers: u64,
    /// Splits left unfinished by a dead client and finished by this thread.
    pub recovered_splits: u64,
    /// Splits this thread gave up because a stall outlasted its lease and
    /// another client took the lock over.
    pub lease_losses: u64,
    /// Operations started over because the thread lapsed while they ran
    /// (see [`crate::ResizeStats::lapse_retries`]).
    pub lapse_retries: u64,
    /// Speculative lookups that hit (`spec-lookup`).
    pub spec_hits: u64,
    /// Speculative lookups that missed and took the normal path.
    pub spec_misses: u64,
    /// What the thread's reclaimer did (memory retired, reused, fresh).
    pub reclaim: ReclaimStats,
}

/// The record's form of [`RaceStats`]: the counters and the hit rate.
#[derive(Serialize)]
struct StatsRecord {
    /// Beside the shape's `splits` (by every client since creation).
    splits_by_run: u64,
    doublings: u64,
    dir_refreshes: u64,
    waits: u64,
    split_s: f64,
    dir_wait_s: f64,
    takeovers: u64,
    recovered_splits: u64,
    lease_losses: u64,
    lapse_retries: u64,
    spec_hits: u64,
    spec_misses: u64,
    spec_hit_rate: f64,
    reclaim: ReclaimStats,
}

impl From<RaceStats> for StatsRecord {
    fn from(s: RaceStats) -> Self {
        StatsRecord {
            splits_by_run: s.splits,
            doublings: s.doublings,
            dir_refreshes: s.dir_refreshes,
            waits: s.waits,
            split_s: s.split_s,
            dir_wait_s: s.dir_wait_s,
            takeovers: s.takeovers,
            recovered_splits: s.recovered_splits,
            lease_losses: s.lease_losses,
            lapse_retries: s.lapse_retries,
            spec_hits: s.spec_hits,
            spec_misses: s.spec_misses,
            spec_hit_rate: s.spec_hit_rate(),
            reclaim: s.reclaim,
        }
    }
}

impl RaceStats {
    /// Hits over attempted speculative lookups (0 when none).
    pub fn spec_hit_rate(&self) -> f64 {
        let n = self.spec_hits + self.spec_misses;
        if n == 0 {
            0.0
        } else {
            self.spec_hits as f64 / n as f64
        }
    }
}

impl IndexStats for RaceStats {
    fn merge(&mut self, o: &Self) {
        self.splits += o.splits;
        self.doublings += o.doublings;
        self.dir_refreshes += o.dir_refreshes;
        self.waits += o.waits;
        self.split_s += o.split_s;
        self.dir_wait_s += o.dir_wait_s;
        self.takeovers += o.takeovers;
        self.recovered_splits += o.recovered_splits;
        self.lease_losses += o.lease_losses;
        self.lapse_retries += o.lapse_retries;
        self.spec_hits += o.spec_hits;
        self.spec_misses += o.spec_misses;
        self.reclaim += o.reclaim;
    }
}

impl RaceStats {
    fn of(r: ResizeStats, (spec_hits, spec_misses): (u64, u64), reclaim: ReclaimStats) -> Self {
        RaceStats {
            splits: r.splits,
            doublings: r.doublings,
            dir_refreshes: r.refreshes,
            waits: r.waits,
            split_s: r.split_ns as f64 / 1e9,
            dir_wait_s: r.dir_wait_ns as f64 / 1e9,
            takeovers: r.takeovers,
            recovered_splits: r.recovered,
            lease_losses: r.lease_losses,
            lapse_retries: r.lapse_retries,
            spec_hits,
            spec_misses,
            reclaim,
        }
    }
}

impl KvIndex for RaceHt {
    const APP: &'static str = "race";
    type Error = RaceError;
    type Stats = RaceStats;
    type Shape = TableShape;

    /// The subtables and directory made for `capacity` keys, and a KV block
    /// per key (splits not counted).
    fn bytes_needed(capacity: u64, keys: u64, key_size: usize, value_size: usize) -> Option<u64> {
        let c = RaceConfig::for_keys(capacity.max(1));
        let subtables = (1u64 << c.depth) * (crate::layout::subtable_bytes(c.groups) + 8);
        Some(subtables.saturating_add(keys.saturating_mul(crate::layout::block_len(key_size, value_size) as u64)))
    }

    async fn open_or_create(ctx: &Ctx, name: &str, capacity: u64) -> Result<(Self, bool), RaceError> {
        let existed = RaceHt::exists(ctx, name).await?;
        let t = RaceHt::create(ctx, name, RaceConfig::for_keys(capacity.max(1))).await?;
        Ok((t, existed))
    }

    async fn exists(ctx: &Ctx, name: &str) -> Result<bool, RaceError> {
        RaceHt::exists(ctx, name).await
    }

    async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, RaceError> {
        RaceHt::get(self, key, out).await
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool, RaceError> {
        RaceHt::insert(self, key, value).await
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool, RaceError> {
        RaceHt::update(self, key, value).await
    }

    async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<(), RaceError> {
        RaceHt::upsert(self, key, value).await
    }

    async fn delete(&mut self, key: &[u8]) -> Result<bool, RaceError> {
        RaceHt::delete(self, key).await
    }

    async fn close(&mut self) -> Result<(), RaceError> {
        RaceHt::close(self).await
    }

    fn stats(&self) -> RaceStats {
        RaceStats::of(self.resize_stats(), self.spec_stats(), self.reclaim_stats())
    }

    async fn audit(&mut self) -> Result<Audit, RaceError> {
        Ok(Audit { keys: self.keys().await? })
    }

    async fn shape(&mut self) -> Result<TableShape, RaceError> {
        self.current_shape().await
    }
}
