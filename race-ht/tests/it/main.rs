//! race-ht against an oracle and under concurrency (one test binary, one
//! module per concern).

mod api;
mod growth;
mod lin;
mod oracle;
mod recovery;
mod stress;

use race_ht::{RaceConfig, RaceHt};

/// A small table of 4 subtables × 16 groups.
fn small() -> RaceConfig {
    RaceConfig { depth: 2, groups: 16 }
}

/// One subtable of one group (21 slots): grows by splitting almost at once.
fn tiny() -> RaceConfig {
    RaceConfig { depth: 0, groups: 1 }
}

/// Value of `key` at `version`: both encoded, then padding.
fn value(key: u64, version: u64) -> [u8; 24] {
    let mut v = [0xee; 24];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    v
}

/// Every key stored in table "stress", by reading all of its buckets.
async fn race_ht_scan(ctx: &smart_core::Ctx) -> Vec<u64> {
    let mut ht = RaceHt::open(ctx, "stress").await.unwrap();
    ht.keys().await.unwrap().iter().map(|k| u64::from_le_bytes(k[..8].try_into().unwrap())).collect()
}

/// Maps a table error into the closure harness's error type.
fn wrap(e: race_ht::RaceError) -> smart_core::Error {
    smart_core::Error::Unsupported(e.to_string())
}
