//! Running YCSB against any [`KvIndex`]: load, timed run, verification.
//!
//! Keys are `0..N` as little-endian `u64`s padded to the key size. A value
//! carries its key and a version (`[key u64][version u64]`, padded), so
//! `verify` can check every value read: a value of another key, a torn
//! value or a lost key counts as a violation. After the run every key is
//! read back and the index is audited for keys stored twice.
//!
//! Each worker thread opens one handle on the index (its coroutines share
//! the handle's caches) through the harness's per-thread hook; the index's
//! per-thread counters are merged into the report.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_bench::harness::{self, Bench, RunConfig, RunReport, Tally, Worker};
use smart_core::{Ctx, IndexStats, KvIndex, Runtime, Transport};

use crate::{KeyChooser, Op, Workload};

/// Longest scan of workload e (lengths are uniform in 1..=this, as in YCSB).
pub const MAX_SCAN: usize = 100;

/// What to run.
#[derive(Clone, Debug)]
pub struct YcsbConfig {
    /// The index's name on the blades.
    pub table: String,
    /// Keys loaded before the run.
    pub keys: u64,
    /// The operation mix.
    pub workload: Workload,
    /// How request keys are drawn.
    pub chooser: KeyChooser,
    /// Key bytes (≥ 8).
    pub key_size: usize,
    /// Value bytes (≥ 16).
    pub value_size: usize,
    /// Check every value read, and read every key back afterwards.
    pub verify: bool,
    /// Keys the index is created for; it grows beyond them.
    pub capacity: u64,
}

/// Errors of a YCSB run.
#[derive(Debug, thiserror::Error)]
pub enum YcsbError<E: std::error::Error + 'static> {
    /// The configuration cannot run.
    #[error("{0}")]
    Config(String),
    /// The harness failed (a worker thread could not start).
    #[error(transparent)]
    Harness(#[from] smart_core::Error),
    /// The index failed while setting up or verifying.
    #[error(transparent)]
    Index(E),
    /// A coroutine of the load failed.
    #[error("load failed: {0}")]
    Load(String),
    /// The load was interrupted (every insert that started finished).
    #[error("interrupted during the load, after {0:.1} s")]
    Interrupted(f64),
}

/// The outcome of a YCSB run.
#[derive(Debug)]
pub struct YcsbReport<I: KvIndex> {
    /// The timed run.
    pub run: RunReport,
    /// Seconds the load phase took.
    pub load_s: f64,
    /// Whether the index existed before this run (loaded into as it was).
    pub existed: bool,
    /// Values of the wrong key, missing keys, failed updates of loaded
    /// keys, keys stored twice.
    pub violations: u64,
    /// Keys stored twice after the run (with `verify`; counted in
    /// `violations` too).
    pub duplicates: u64,
    /// The index's counters, summed over threads, load and run.
    pub stats: I::Stats,
    /// The index's shape after the run.
    pub shape: I::Shape,
}

pub(crate) fn key_bytes(k: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&k.to_le_bytes());
    out.resize(size, 0);
}

pub(crate) fn value_bytes(k: u64, version: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&k.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.resize(size, 0x5a);
}

pub(crate) fn holds_key(v: &[u8], k: u64) -> bool {
    v.len() >= 16 && v[..8] == k.to_le_bytes()
}

/// The load (coroutine i of n inserts keys i, i+n, i+2n, ...) or the timed
/// run, as a [`Bench`]: each thread opens one handle on the index, and its
/// counters are merged when the thread ends.
struct Phase<'a, I: KvIndex> {
    load: bool,
    y: &'a YcsbConfig,
    /// Coroutines in all (the load's stride, the inserts' stride).
    total: u64,
    stats: &'a Mutex<I::Stats>,
    violations: Arc<AtomicU64>,
    _index: PhantomData<fn() -> I>,
}

impl<I: KvIndex> Bench for Phase<'_, I> {
    type Error = I::Error;
    type Thread = I;

    fn open_thread(&self, ctx: Ctx) -> impl Future<Output = Result<I, I::Error>> + 'static {
        let name = self.y.table.clone();
        let capacity = self.y.capacity;
        async move { I::open_or_create(&ctx, &name, capacity).await.map(|(ix, _)| ix) }
    }

    fn coroutine(&self, w: Worker, ix: I) -> impl Future<Output = Result<(), I::Error>> + 'static {
        let (y, total, load) = (self.y.clone(), self.total, self.load);
        let violations = self.violations.clone();
        async move {
            if load {
                load_keys(&w, ix, &y, total).await
            } else {
                run_ops(&w, ix, &y, total, Tally::new(&violations)).await
            }
        }
    }

    fn close_thread(&self, ix: I) {
        self.stats.lock().expect("not poisoned").merge(&ix.stats());
    }
}

/// This coroutine's share of the load.
async fn load_keys<I: KvIndex>(w: &Worker, mut ix: I, y: &YcsbConfig, total: u64) -> Result<(), I::Error> {
    let (mut kb, mut vb) = (Vec::new(), Vec::new());
    let mut k = (w.thread() * w.coroutines() + w.coroutine()) as u64;
    // An interrupted load stops between inserts (never inside one).
    while k < y.keys && w.running() {
        let t = w.now();
        key_bytes(k, y.key_size, &mut kb);
        value_bytes(k, 0, y.value_size, &mut vb);
        ix.insert(&kb, &vb).await?;
        w.record(t, 1);
        k += total;
    }
    Ok(())
}

/// This coroutine's operations of the timed run; values that fail the
/// check go into `bad`.
async fn run_ops<I: KvIndex>(
    w: &Worker,
    mut ix: I,
    y: &YcsbConfig,
    total: u64,
    mut bad: Tally<'_>,
) -> Result<(), I::Error> {
    let me = (w.thread() * w.coroutines() + w.coroutine()) as u64;
    let mut rng = SmallRng::seed_from_u64(w.seed());
    let (mut kb, mut vb, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut pairs = Vec::new();
    let mut version = 1u64;
    let mut next_insert = y.keys + me;
    let mut check = |found: bool, v: &[u8], k: u64| {
        if y.verify && (!found || !holds_key(v, k)) {
            bad.n += 1;
        }
    };
    while w.running() {
        let t = w.now();
        let op = y.workload.next_op(&mut rng);
        let k = if op == Op::Insert { next_insert } else { y.chooser.next(&mut rng) };
        key_bytes(k, y.key_size, &mut kb);
        match op {
            Op::Read => {
                let found = ix.get(&kb, &mut out).await?;
                check(found, &out, k);
            }
            Op::Update | Op::ReadModifyWrite => {
                if op == Op::ReadModifyWrite {
                    let found = ix.get(&kb, &mut out).await?;
                    check(found, &out, k);
                }
                value_bytes(k, version, y.value_size, &mut vb);
                version += 1;
                let updated = ix.update(&kb, &vb).await?;
                check(updated, &vb, k);
            }
            Op::Insert => {
                value_bytes(k, 0, y.value_size, &mut vb);
                ix.insert(&kb, &vb).await?;
                next_insert += total;
            }
            Op::Scan => {
                let n = rng.random_range(1..=MAX_SCAN);
                ix.scan(&kb, n, &mut pairs).await?;
                for (pk, pv) in &pairs {
                    let pk = u64::from_le_bytes(pk[..8].try_into().expect("keys are ≥ 8 bytes"));
                    check(true, pv, pk);
                }
            }
        }
        w.record(t, 1);
    }
    Ok(())
}

/// Loads `y.keys` keys into index `y.table` (created for `y.capacity` keys
/// unless it exists) with every coroutine of `cfg`, runs the workload for
/// `cfg.duration`, and with `y.verify` reads every key back and audits the
/// index.
///
/// # Errors
/// A configuration the index cannot run (e.g. scans on a hash table); a
/// failed load; index and verb errors while setting up or verifying.
pub fn run<I: KvIndex>(
    transport: &dyn Transport,
    cfg: &RunConfig,
    y: &YcsbConfig,
) -> Result<YcsbReport<I>, YcsbError<I::Error>> {
    if y.key_size < 8 || y.value_size < 16 {
        return Err(YcsbError::Config(format!(
            "keys need at least 8 bytes and values 16 (asked {} and {})",
            y.key_size, y.value_size
        )));
    }
    if y.workload.mix[3] > 0.0 && !I::SCANS {
        return Err(YcsbError::Config(format!(
            "workload {} needs range scans, which the {} index does not have",
            y.workload.name,
            I::APP
        )));
    }
    if y.keys == 0 {
        return Err(YcsbError::Config("at least 1 key must be loaded".into()));
    }
    let mut setup = Runtime::new(transport, 0, cfg.runtime.clone())?;
    let ctx = setup.ctx();
    let (name, capacity) = (y.table.clone(), y.capacity);
    let existed = setup
        .block_on(async move { I::open_or_create(&ctx, &name, capacity).await.map(|(_, e)| e) })
        .map_err(YcsbError::Index)?;
    if existed && cfg.progress {
        eprintln!("note: index {:?} already exists on the blades (an earlier run): loading into it as it is", y.table);
    }

    let stats = Mutex::new(I::Stats::default());
    let violations = Arc::new(AtomicU64::new(0));
    let phase = |load| Phase::<I> {
        load,
        y,
        total: (cfg.threads * cfg.coroutines) as u64,
        stats: &stats,
        violations: violations.clone(),
        _index: PhantomData,
    };
    let t0 = Instant::now();
    if cfg.progress {
        eprintln!("loading {} keys", y.keys);
    }
    let load_cfg = RunConfig { duration: Duration::from_secs(24 * 3600), warmup: Duration::ZERO, ..cfg.clone() };
    let load = harness::run_bench(transport, &load_cfg, &phase(true))?;
    if let Some(e) = load.first_error {
        return Err(YcsbError::Load(e));
    }
    let load_s = t0.elapsed().as_secs_f64();
    if load.interrupted {
        return Err(YcsbError::Interrupted(load_s));
    }
    if cfg.progress {
        eprintln!("loaded {} keys in {load_s:.1}s", y.keys);
    }

    let run = harness::run_bench(transport, cfg, &phase(false))?;

    let ctx = setup.ctx();
    // An interrupted run is reported as it ran, without the read-back.
    let verify_after = y.verify && !run.interrupted;
    if y.verify && run.interrupted && cfg.progress {
        eprintln!("interrupted: skipping the read-back of every key");
    }
    let (keys, ksz, verify, name) = (y.keys, y.key_size, verify_after, y.table.clone());
    let (shape, duplicates, lost) = setup
        .block_on(async move {
            let (mut ix, _) = I::open_or_create(&ctx, &name, 1).await?;
            let (mut duplicates, mut lost) = (0, 0);
            if verify {
                // Every loaded key is still there and holds its own key; no
                // key is stored twice (the audit also fails on a structural
                // fault).
                let (mut kb, mut out) = (Vec::new(), Vec::new());
                for k in 0..keys {
                    key_bytes(k, ksz, &mut kb);
                    if !ix.get(&kb, &mut out).await? || !holds_key(&out, k) {
                        lost += 1;
                    }
                }
                duplicates = ix.audit().await?.duplicates();
            }
            Ok((ix.shape().await?, duplicates, lost))
        })
        .map_err(YcsbError::Index)?;
    violations.fetch_add(lost + duplicates, Ordering::Relaxed);
    let stats = stats.into_inner().expect("not poisoned");
    Ok(YcsbReport { run, load_s, existed, violations: violations.load(Ordering::Relaxed), duplicates, stats, shape })
}
