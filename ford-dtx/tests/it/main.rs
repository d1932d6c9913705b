//! ford-dtx: the protocol on every backend, the defects of FORD fixed,
//! serializability under chaos, an oracle, and crash recovery.

mod api;
mod damage;
mod defects;
mod failover;
mod mirror;
mod oracle;
mod recovery;
mod rejoin;
mod serial;

use std::sync::Arc;
use std::time::Duration;

use ford_dtx::db::{Db, DbSpec, TableSpec};
use ford_dtx::{Registration, TxnError};
use smart_core::{Runtime, RuntimeConfig, Transport};

/// A database of `tables` (value sizes) × `rows` rows, `replicas` copies.
fn spec(name: &str, tables: &[usize], rows: u64, replicas: usize) -> DbSpec {
    DbSpec {
        name: name.into(),
        tables: tables
            .iter()
            .enumerate()
            .map(|(i, v)| TableSpec { name: format!("t{i}"), value_size: *v, rows })
            .collect(),
        replicas,
    }
}

/// Creates the database and registers a compute blade of `threads` ×
/// `coroutines`; returns a runtime (thread 0), the database and the
/// registration.
fn open(t: &Arc<dyn Transport>, s: &DbSpec, threads: usize, coroutines: usize) -> (Runtime, Arc<Db>, Registration) {
    let mut rt = Runtime::new(&**t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let s2 = s.clone();
    let db = Arc::new(rt.block_on(async move { Db::create(&ctx, &s2).await }).unwrap().0);
    let reg = Registration::register(t.clone(), db.clone(), threads, coroutines, Duration::from_secs(30)).unwrap();
    (rt, db, reg)
}

/// Another compute blade on `db`: one thread × one coroutine, a 30 s lease.
fn join(t: &Arc<dyn Transport>, db: &Arc<Db>) -> Registration {
    Registration::register(t.clone(), db.clone(), 1, 1, Duration::from_secs(30)).unwrap()
}

/// Inserts `key` into `table` with the 8-byte `value`, in one transaction
/// of coroutine 0.
async fn insert_one(dtx: &ford_dtx::Dtx, table: u32, key: u64, value: u64) -> Result<(), TxnError> {
    let mut tx = dtx.txn(0);
    tx.begin();
    let i = tx.insert(table, key);
    tx.execute().await?;
    tx.write(i, &value.to_le_bytes());
    tx.commit().await
}

/// Reads `key` of `table` in a one-item transaction: its value, or `None`
/// if it is not there.
async fn read_one(dtx: &ford_dtx::Dtx, table: u32, key: u64) -> Option<u64> {
    let mut tx = dtx.txn(0);
    tx.begin();
    let i = tx.read(table, key);
    match tx.execute().await {
        Ok(()) => {
            tx.commit().await.unwrap();
            Some(u(tx.value(i)))
        }
        Err(TxnError::Abort(ford_dtx::Abort::NotFound)) => None,
        Err(e) => panic!("read of ({table}, {key}): {e}"),
    }
}

/// Inserts each key of `keys` into table 0 (8-byte values) with value
/// `value(key)`, one transaction each, with coroutine 0's transaction (one
/// `Txn`, so the transactions take successive sequence numbers).
async fn insert_rows(dtx: &ford_dtx::Dtx, keys: std::ops::Range<u64>, value: impl Fn(u64) -> u64) {
    let mut tx = dtx.txn(0);
    for k in keys {
        tx.begin();
        let a = tx.insert(0, k);
        tx.execute().await.unwrap();
        tx.write(a, &value(k).to_le_bytes());
        tx.commit().await.unwrap();
    }
}

fn u(v: &[u8]) -> u64 {
    u64::from_le_bytes(v[..8].try_into().unwrap())
}

/// The audit of the whole database (every replica read): no violation, and
/// every copy naming replica 0's as its home (what repairs check),
/// whichever replica was primary when it was written. Returns the sum of
/// every value (wrapping: balances may go below 0).
async fn audited(ctx: &smart_core::Ctx, db: &Db, what: &str) -> u64 {
    let mut sum = 0u64;
    let rep = ford_dtx::recovery::audit(ctx, db, |_, _, v| sum = sum.wrapping_add(u(v))).await.unwrap();
    assert_eq!(rep.violations(), 0, "{what}: {rep:?}");
    for t in &db.tables {
        let mut homes = Vec::new();
        ford_dtx::recovery::scan(ctx, t, db.replicas, |v| {
            for r in 0..db.replicas {
                if let Ok(rec) = ford_dtx::layout::decode(v.recs[r], t.value_size) {
                    homes.push((rec.home, v.at[0].raw()));
                }
            }
        })
        .await
        .unwrap();
        assert!(homes.iter().all(|(h, want)| h == want), "{what}: table {} has records of another home", t.id);
    }
    sum
}

fn abort_of<T: std::fmt::Debug>(r: Result<T, TxnError>) -> ford_dtx::Abort {
    match r {
        Err(TxnError::Abort(a)) => a,
        other => panic!("expected an abort, got {other:?}"),
    }
}
