//! Running YCSB against any [`KvIndex`]: load, timed run, verification.
//!
//! Keys are `0..N`, written as [`KeyFormat`] says (8 big-endian bytes, or
//! YCSB's `user` and 20 decimal digits) and padded with zeros to the key
//! size, so that byte order is number order. A value
//! carries its key and a version (`[key u64][version u64]`, padded; in
//! values of 8 to 15 bytes, the key's low 40 bits and the version's low 24
//! bits share the first word), so `verify` can check every value read: a
//! value of another key, a torn value or a lost key counts as a violation.
//! Scans are checked for order and bounds, and for every key known to be
//! present for the whole scan: keys are inserted in a fixed order (loaded
//! `0..N`, then coroutine `c` of `n` inserts `N + c`, `N + c + n`, …), and
//! all keys below the *frontier* (the first key not yet known inserted)
//! are present, so a scan from `s` must return every key of `[s, frontier)`
//! up to where it stopped. After the run every key is read back and the
//! index is audited for keys stored twice.
//!
//! Workload d reads from YCSB's latest distribution: newest key (the
//! frontier − 1) minus a Zipfian rank, the Zipfian over all inserted keys.
//!
//! Each worker thread opens one handle on the index (its coroutines share
//! the handle's caches) through the harness's per-thread hook; the index's
//! per-thread counters are merged into the report.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smart_bench::harness::{self, Bench, RunConfig, RunReport, Tally, Worker};
use smart_core::index::Pairs;
use smart_core::{Ctx, IndexStats, KvIndex, Runtime, Transport};

use crate::{KeyChooser, Latest, Op, Workload};

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
    /// Key bytes (≥ 8; ≥ [`YCSB_KEY`] for YCSB's keys).
    pub key_size: usize,
    /// How keys are written.
    pub key_format: KeyFormat,
    /// Value bytes (≥ 16).
    pub value_size: usize,
    /// Check every value read, and read every key back afterwards.
    pub verify: bool,
    /// Keys the index is created for; it grows beyond them.
    pub capacity: u64,
    /// Whether keys are loaded before the run, and whether it runs.
    pub load: LoadMode,
}

/// What happens before (and instead of) the timed run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// Create the index if absent, insert every key absent from it, run.
    #[default]
    Load,
    /// Attach to an existing index as it is (an error if it is absent):
    /// nothing is inserted before the run, so `verify` reports every key
    /// of the key range that is missing.
    NoLoad,
    /// Create and load as with `Load`, then stop: no timed run.
    LoadOnly,
}

/// Where the index came from in this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableState {
    /// This run created it (and loaded it).
    Created,
    /// It existed; this run's load inserted the keys absent from it.
    LoadedIntoExisting,
    /// It existed and was used as it was (`LoadMode::NoLoad`).
    Attached,
}

impl TableState {
    /// Its name in the result record.
    pub fn as_str(self) -> &'static str {
        match self {
            TableState::Created => "created",
            TableState::LoadedIntoExisting => "loaded-into-existing",
            TableState::Attached => "attached",
        }
    }
}

/// Keys reported by name when a verification finds them missing (the count
/// is complete).
pub const LOST_KEYS_SHOWN: usize = 20;

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
    /// An error of a phase (set-up, load, timed run, read-back), named.
    #[error("{phase}: {cause}")]
    During {
        /// What the run was doing.
        phase: String,
        /// The error, with its causes.
        cause: String,
    },
}

impl<E: std::error::Error + 'static> YcsbError<E> {
    /// Names the phase of `r`'s error.
    fn during<T>(phase: impl FnOnce() -> String, r: Result<T, Self>) -> Result<T, Self> {
        r.map_err(|e| match e {
            // Already named as what it is.
            e @ (YcsbError::Config(_) | YcsbError::Interrupted(_) | YcsbError::During { .. }) => e,
            e => {
                let mut cause = e.to_string();
                let mut at: Option<&dyn std::error::Error> = std::error::Error::source(&e);
                while let Some(inner) = at {
                    cause = format!("{cause}: {inner}");
                    at = inner.source();
                }
                YcsbError::During { phase: phase(), cause }
            }
        })
    }
}

/// The outcome of a YCSB run.
#[derive(Debug)]
pub struct YcsbReport<I: KvIndex> {
    /// The timed run (`None` with `LoadMode::LoadOnly`).
    pub run: Option<RunReport>,
    /// Seconds the load phase took (0 when attached).
    pub load_s: f64,
    /// Whether the index existed before this run.
    pub existed: bool,
    /// Created, loaded into, or attached.
    pub state: TableState,
    /// Keys of `0..keys` the verification found missing or holding
    /// another key's value (the first [`LOST_KEYS_SHOWN`]; all counted in
    /// `violations`).
    pub lost_keys: Vec<u64>,
    /// How many keys the verification found missing or wrong.
    pub lost: u64,
    /// Keys deleted by the run (workload churn) that the verification still
    /// found (counted in `violations`).
    pub resurrected: u64,
    /// Keys the verification read back (0 without one).
    pub read_back: u64,
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

/// How YCSB's keys are written: both keep number order as byte order
/// (ordered inserts, where YCSB's default hashes the number first, so that
/// scans can be checked against the keys known present).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyFormat {
    /// The key number as 8 big-endian bytes.
    #[default]
    Binary,
    /// YCSB's own form: `user` and the key number in 20 decimal digits
    /// (zero-padded, as YCSB's `zeropadding` makes them): [`YCSB_KEY`]
    /// bytes.
    Ycsb,
}

/// Bytes of a key in YCSB's form.
pub const YCSB_KEY: usize = 24;

impl KeyFormat {
    /// Its name in the result record and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyFormat::Binary => "binary",
            KeyFormat::Ycsb => "ycsb",
        }
    }

    /// The least key size of this form.
    pub fn min_size(self) -> usize {
        match self {
            KeyFormat::Binary => 8,
            KeyFormat::Ycsb => YCSB_KEY,
        }
    }
}

/// Writes key number `k` in format `f`, padded with zeros to `size` bytes,
/// into `out`.
pub fn key_bytes(k: u64, size: usize, f: KeyFormat, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    match f {
        KeyFormat::Binary => out.extend_from_slice(&k.to_be_bytes()),
        KeyFormat::Ycsb => write!(out, "user{k:020}").expect("writing to a Vec"),
    }
    out.resize(size.max(out.len()), 0);
}

/// The key number of a key written by [`key_bytes`], if it is one.
pub fn key_number(key: &[u8], f: KeyFormat) -> Option<u64> {
    match f {
        KeyFormat::Binary => Some(u64::from_be_bytes(key.get(..8)?.try_into().ok()?)),
        KeyFormat::Ycsb => {
            let digits = key.get(4..YCSB_KEY).filter(|_| key.starts_with(b"user"))?;
            std::str::from_utf8(digits).ok()?.parse().ok()
        }
    }
}

/// Low bits of the key an 8-to-15-byte value carries.
const SHORT_KEY_BITS: u32 = 40;

pub(crate) fn value_bytes(k: u64, version: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    if size >= 16 {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
    } else {
        let key_part = k & ((1 << SHORT_KEY_BITS) - 1);
        out.extend_from_slice(&(key_part | version << SHORT_KEY_BITS).to_le_bytes());
    }
    out.resize(size, 0x5a);
}

pub(crate) fn holds_key(v: &[u8], k: u64) -> bool {
    match v.len() {
        16.. => v[..8] == k.to_le_bytes(),
        8..16 => {
            let w = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
            let mask = (1 << SHORT_KEY_BITS) - 1;
            w & mask == k & mask
        }
        _ => false,
    }
}

/// How far the inserts of the run have got: per coroutine, how many of its
/// inserts finished (see the module docs).
#[derive(Debug)]
struct Frontier {
    loaded: u64,
    done: Vec<AtomicU64>,
    /// Per coroutine, how many of its keys it deleted (workload churn).
    deleted: Vec<AtomicU64>,
}

impl Frontier {
    fn new(loaded: u64, coroutines: usize) -> Frontier {
        let zeros = || (0..coroutines).map(|_| AtomicU64::new(0)).collect();
        Frontier { loaded, done: zeros(), deleted: zeros() }
    }

    /// The `j`-th key coroutine `c` owns (workload churn): the loaded keys
    /// `c, c + n, …` below `loaded`, then the keys it inserts.
    fn owned(&self, c: u64, j: u64) -> u64 {
        let n = self.done.len() as u64;
        let loaded = self.loaded.saturating_sub(c).div_ceil(n);
        if j < loaded {
            c + j * n
        } else {
            self.loaded + c + (j - loaded) * n
        }
    }

    /// Coroutine `c`'s keys deleted, and its keys in all (loaded or
    /// inserted).
    fn owned_counts(&self, c: usize) -> (u64, u64) {
        let n = self.done.len() as u64;
        let loaded = self.loaded.saturating_sub(c as u64).div_ceil(n);
        (self.deleted[c].load(Ordering::Acquire), loaded + self.done[c].load(Ordering::Acquire))
    }

    /// Every key below the result is inserted.
    fn get(&self) -> u64 {
        let n = self.done.len() as u64;
        let done = |c: &AtomicU64| c.load(Ordering::Acquire);
        let m = self.done.iter().map(done).min().unwrap_or(0);
        let lead = self.done.iter().take_while(|c| done(c) > m).count() as u64;
        self.loaded + m * n + lead
    }

    fn inserted(&self, coroutine: usize) {
        self.done[coroutine].fetch_add(1, Ordering::Release);
    }
}

/// Operations between two reads of the frontier by one coroutine.
const FRONTIER_EVERY: u32 = 64;

/// Checks a scan from `start` for `count` pairs that returned `pairs`,
/// with every key below `frontier` present throughout: order, bounds, the
/// values' keys, and no known-present key missed. Returns the violations.
pub(crate) fn check_scan(pairs: &Pairs, start: u64, count: usize, frontier: u64, f: KeyFormat) -> u64 {
    let mut bad = 0;
    if pairs.len() > count {
        bad += 1;
    }
    let mut expect = start;
    let mut prev: Option<u64> = None;
    for (pk, pv) in pairs.iter() {
        let Some(k) = key_number(pk, f) else {
            bad += 1;
            continue;
        };
        if k < start || prev.is_some_and(|q| q >= k) || !holds_key(pv, k) {
            bad += 1;
        }
        if k < frontier {
            // Every key of [start, frontier) is there: they come in a row.
            if k != expect {
                bad += 1;
            }
            expect = k + 1;
        }
        prev = Some(k);
    }
    if pairs.len() < count && expect < frontier {
        // The scan ended before the end of the known keys.
        bad += 1;
    }
    bad
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
    frontier: Arc<Frontier>,
    _index: PhantomData<fn() -> I>,
}

impl<I: KvIndex> Bench for Phase<'_, I> {
    type Error = I::Error;
    type Thread = I;

    fn open_thread(&self, ctx: Ctx) -> impl Future<Output = Result<I, I::Error>> + 'static {
        let name = self.y.table.clone();
        let capacity = self.y.capacity;
        let (ksz, vsz) = (self.y.key_size, self.y.value_size);
        async move { I::open_or_create_sized(&ctx, &name, capacity, ksz, vsz).await.map(|(ix, _)| ix) }
    }

    fn coroutine(&self, w: Worker, ix: I) -> impl Future<Output = Result<(), I::Error>> + 'static {
        let (y, total, load) = (self.y.clone(), self.total, self.load);
        let (violations, frontier) = (self.violations.clone(), self.frontier.clone());
        async move {
            if load {
                load_keys(&w, ix, &y, total).await
            } else {
                run_ops(&w, ix, &y, (total, &frontier), Tally::new(&violations)).await
            }
        }
    }

    fn finish_thread(&self, ix: &I) -> impl Future<Output = Result<(), I::Error>> + 'static {
        let mut ix = ix.clone();
        async move { ix.close().await }
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
        key_bytes(k, y.key_size, y.key_format, &mut kb);
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
    (total, frontier): (u64, &Frontier),
    mut bad: Tally<'_>,
) -> Result<(), I::Error> {
    let me = (w.thread() * w.coroutines() + w.coroutine()) as u64;
    let mut rng = SmallRng::seed_from_u64(w.seed());
    let (mut kb, mut vb, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut pairs = Pairs::default();
    let mut version = 1u64;
    let mut next_insert = y.keys + me;
    let mut latest = y.workload.reads_latest().then(|| y.chooser.theta().map(|t| Latest::new(y.keys, t)));
    let (mut known, mut since) = (frontier.get(), 0);
    // A violation counts, and the first few of each coroutine say what
    // they were on stderr (so that a rare one, e.g. in CI, can be read).
    let mut said = 0u32;
    let mut wrong = |what: &str, found: bool, v: &[u8], k: u64| {
        let bad = y.verify && (!found || !holds_key(v, k));
        if bad && said < 3 {
            said += 1;
            let got = if found { "a value of another key (or torn)" } else { "nothing (not found)" };
            eprintln!("violation: thread {} coroutine {}: {what} of key {k} returned {got}", w.thread(), w.coroutine());
        }
        u64::from(bad)
    };
    // Each operation starts where the last one was recorded, unless the
    // coroutine idled in between (one clock read per operation).
    let mut t = w.now();
    let (mut inserted, mut deleted) = (0u64, 0u64);
    while w.running() {
        if w.idles() {
            w.idle().await;
            t = w.now();
        }
        let op = match y.workload.alternates() {
            true if inserted > deleted => Op::Delete,
            true => Op::Insert,
            false => y.workload.next_op(&mut rng),
        };
        since += 1;
        if since >= FRONTIER_EVERY {
            (known, since) = (frontier.get(), 0);
        }
        let k = match (op, &mut latest) {
            (Op::Insert, _) => next_insert,
            (Op::Delete, _) => frontier.owned(me, deleted),
            (Op::Read, Some(Some(l))) => l.next(known, &mut rng),
            (Op::Read, Some(None)) => rng.random_range(0..known),
            _ => y.chooser.next(&mut rng),
        };
        key_bytes(k, y.key_size, y.key_format, &mut kb);
        match op {
            Op::Read => {
                let found = ix.get(&kb, &mut out).await?;
                bad.n += wrong("a read", found, &out, k);
            }
            Op::Update | Op::ReadModifyWrite => {
                if op == Op::ReadModifyWrite {
                    let found = ix.get(&kb, &mut out).await?;
                    bad.n += wrong("a read-modify-write's read", found, &out, k);
                }
                value_bytes(k, version, y.value_size, &mut vb);
                version += 1;
                let updated = ix.update(&kb, &vb).await?;
                bad.n += wrong("an update", updated, &vb, k);
            }
            Op::Insert => {
                value_bytes(k, 0, y.value_size, &mut vb);
                ix.insert(&kb, &vb).await?;
                frontier.inserted(me as usize);
                next_insert += total;
                inserted += 1;
            }
            Op::Delete => {
                // Its own oldest key: present since it was loaded or
                // inserted, and nobody else deletes it.
                let was = ix.delete(&kb).await?;
                bad.n += u64::from(y.verify && !was);
                frontier.deleted[me as usize].fetch_add(1, Ordering::Release);
                deleted += 1;
            }
            Op::Scan => {
                let n = rng.random_range(1..=MAX_SCAN);
                let present = frontier.get();
                ix.scan(&kb, n, &mut pairs).await?;
                if y.verify {
                    bad.n += check_scan(&pairs, k, n, present, y.key_format);
                }
            }
        }
        t = w.lap(t, 1);
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
    if y.key_size < y.key_format.min_size() || y.value_size < 8 {
        return Err(YcsbError::Config(format!(
            "{} keys need at least {} bytes and values at least 8 (asked {} and {})",
            y.key_format.as_str(),
            y.key_format.min_size(),
            y.key_size,
            y.value_size
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
    let setting_up = || "setting up".to_string();
    let mut setup = YcsbError::during(setting_up, Runtime::new(transport, 0, cfg.runtime.clone()).map_err(Into::into))?;
    if y.load != LoadMode::NoLoad {
        YcsbError::during(setting_up, room_for_load::<I>(&mut setup, y))?;
    }
    let ctx = setup.ctx();
    let (name, capacity, attach) = (y.table.clone(), y.capacity, y.load == LoadMode::NoLoad);
    let (ksz, vsz) = (y.key_size, y.value_size);
    let existed = setup.block_on(async move {
        if attach && !I::exists(&ctx, &name).await? {
            return Ok(None);
        }
        I::open_or_create_sized(&ctx, &name, capacity, ksz, vsz).await.map(|(_, e)| Some(e))
    });
    let existed = YcsbError::during(setting_up, existed.map_err(YcsbError::Index))?.ok_or_else(|| {
        YcsbError::Config(format!(
            "--no-load: index {:?} does not exist on the blades ({} index); load it first",
            y.table,
            I::APP
        ))
    })?;
    let state = match (existed, attach) {
        (false, _) => TableState::Created,
        (true, false) => TableState::LoadedIntoExisting,
        (true, true) => TableState::Attached,
    };
    if state == TableState::LoadedIntoExisting {
        // Said even with --quiet: the load re-inserts keys, which hides any
        // that were lost before (use --no-load to verify the index as it is).
        eprintln!(
            "note: index {:?} already exists on the blades: loading into it as it is (keys absent from it are \
             inserted; --no-load attaches without inserting)",
            y.table
        );
    }

    let stats = Mutex::new(I::Stats::default());
    let violations = Arc::new(AtomicU64::new(0));
    let frontier = Arc::new(Frontier::new(y.keys, cfg.threads * cfg.coroutines));
    let phase = |load| Phase::<I> {
        load,
        y,
        total: (cfg.threads * cfg.coroutines) as u64,
        stats: &stats,
        violations: violations.clone(),
        frontier: frontier.clone(),
        _index: PhantomData,
    };
    let mut load_s = 0.0;
    if !attach {
        let t0 = Instant::now();
        let v0 = transport.simulation().map(|s| s.now_ns());
        if cfg.progress {
            eprintln!("loading {} keys", y.keys);
        }
        let load = harness::run_bench(transport, &cfg.for_load(), &phase(true));
        let load = YcsbError::during(|| "during the load".into(), load.map_err(Into::into))?;
        if let Some(e) = load.first_error {
            return Err(YcsbError::Load(e));
        }
        // Virtual seconds under a simulation.
        load_s = match (transport.simulation(), v0) {
            (Some(s), Some(v0)) => s.now_ns().saturating_sub(v0) as f64 / 1e9,
            _ => t0.elapsed().as_secs_f64(),
        };
        if load.interrupted {
            return Err(YcsbError::Interrupted(load_s));
        }
        if cfg.progress {
            eprintln!("loaded {} keys in {load_s:.1}s", y.keys);
        }
    }

    let run = match y.load {
        LoadMode::LoadOnly => None,
        _ => {
            let run = harness::run_bench(transport, cfg, &phase(false)).map_err(Into::into);
            Some(YcsbError::during(|| "during the timed run".into(), run)?)
        }
    };
    let interrupted = run.as_ref().is_some_and(|r| r.interrupted);

    let ctx = setup.ctx();
    // An interrupted run is reported as it ran, without the read-back.
    let verify_after = y.verify && !interrupted;
    if y.verify && interrupted && cfg.progress {
        eprintln!("interrupted: skipping the read-back of every key");
    }
    let (keys, ksz, kf, verify, name) = (y.keys, y.key_size, y.key_format, verify_after, y.table.clone());
    let churned = (y.workload.alternates() && run.is_some()).then(|| frontier.clone());
    let read_back = setup
        .block_on(async move {
            let (mut ix, _) = I::open_or_create(&ctx, &name, 1).await?;
            let (mut duplicates, mut lost, mut lost_keys, mut resurrected, mut read) = (0, 0, Vec::new(), 0, 0);
            if let (true, Some(f)) = (verify, churned) {
                // Every coroutine's keys: the ones it deleted are gone, the
                // rest hold their own values.
                let (mut kb, mut out) = (Vec::new(), Vec::new());
                for c in 0..f.done.len() {
                    let (deleted, owned) = f.owned_counts(c);
                    read += owned;
                    for j in 0..owned {
                        let k = f.owned(c as u64, j);
                        key_bytes(k, ksz, kf, &mut kb);
                        let found = ix.get(&kb, &mut out).await?;
                        if j < deleted && found {
                            resurrected += 1;
                        } else if j >= deleted && (!found || !holds_key(&out, k)) {
                            lost += 1;
                            if lost_keys.len() < LOST_KEYS_SHOWN {
                                lost_keys.push(k);
                            }
                        }
                    }
                }
                duplicates = ix.audit().await?.duplicates();
            } else if verify {
                read = keys;
                // Every key of the key range is there and holds its own key
                // (after a load, or as the attached index had it); no key is
                // stored twice (the audit also fails on a structural fault).
                let (mut kb, mut out) = (Vec::new(), Vec::new());
                for k in 0..keys {
                    key_bytes(k, ksz, kf, &mut kb);
                    if !ix.get(&kb, &mut out).await? || !holds_key(&out, k) {
                        lost += 1;
                        if lost_keys.len() < LOST_KEYS_SHOWN {
                            lost_keys.push(k);
                        }
                    }
                }
                duplicates = ix.audit().await?.duplicates();
            }
            let shape = ix.shape().await?;
            ix.close().await?;
            Ok((shape, duplicates, lost, lost_keys, resurrected, read))
        })
        .map_err(YcsbError::Index);
    let what = if verify_after { "reading back every key" } else { "reading the index's shape" };
    let (shape, duplicates, lost, lost_keys, resurrected, read_back) = YcsbError::during(
        || match &run {
            Some(r) => harness::after_run(what, r),
            None => format!("{what} after the load"),
        },
        read_back,
    )?;
    violations.fetch_add(lost + duplicates + resurrected, Ordering::Relaxed);
    let stats = stats.into_inner().expect("not poisoned");
    Ok(YcsbReport {
        run,
        load_s,
        existed,
        state,
        lost_keys,
        lost,
        resurrected,
        read_back,
        violations: violations.load(Ordering::Relaxed),
        duplicates,
        stats,
        shape,
    })
}

/// Refuses a load into a new index that the blades' free memory cannot
/// hold (before anything is allocated), saying what it needs and what the
/// blades have: a load that ran out of memory half-way left the blades
/// without room for anything else.
fn room_for_load<I: KvIndex>(rt: &mut Runtime, y: &YcsbConfig) -> Result<(), YcsbError<I::Error>> {
    let Some(need) = I::bytes_needed(y.capacity, y.keys, y.key_size, y.value_size) else { return Ok(()) };
    let (ctx, name) = (rt.ctx(), y.table.clone());
    let free = rt
        .block_on(async move {
            if I::exists(&ctx, &name).await? {
                // Loading into what exists: what is there already is unknown.
                return Ok(None);
            }
            let mut free = Vec::new();
            for b in 0..ctx.blades().len() as u16 {
                let heap = ctx.read_u64(smart_core::GlobalAddr::new(b, smart_core::layout::OFF_HEAP)).await?;
                free.push(ctx.blades()[usize::from(b)].size.saturating_sub(heap));
            }
            if free.iter().sum::<u64>() < need {
                // Then the free lists count too (a walk of every bag): their
                // objects, and the bags that list them (free once popped).
                for (b, f) in free.iter_mut().enumerate() {
                    let (objects, bags) = smart_core::reclaim::free_bytes(&ctx, b as u16).await?;
                    *f += objects + bags;
                }
            }
            Ok::<_, I::Error>(Some(free))
        })
        .map_err(YcsbError::Index)?;
    let Some(free) = free else { return Ok(()) };
    let total: u64 = free.iter().sum();
    if need > total {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let each: Vec<String> =
            free.iter().enumerate().map(|(b, f)| format!("blade {b}: {:.1} MiB", mib(*f))).collect();
        return Err(YcsbError::Config(format!(
            "loading {} keys of {} + {} bytes into a new {} index needs at least {:.1} MiB of blade memory; the \
             memory blades have {:.1} MiB free ({}): start them with a larger --size (--blade-size for embedded \
             blades), or load fewer --keys",
            y.keys,
            y.key_size,
            y.value_size,
            I::APP,
            mib(need),
            mib(total),
            each.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(keys: &[u64]) -> Pairs {
        let (mut v, mut p) = (Vec::new(), Pairs::default());
        for &k in keys {
            value_bytes(k, 3, 8, &mut v);
            p.push(&k.to_be_bytes(), &v);
        }
        p
    }

    #[test]
    fn keys_keep_number_order_as_byte_order_in_both_forms() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for f in [KeyFormat::Binary, KeyFormat::Ycsb] {
            for (x, y) in [(0u64, 1u64), (9, 10), (255, 256), (99_999, 100_000), (u64::MAX - 1, u64::MAX)] {
                key_bytes(x, 32, f, &mut a);
                key_bytes(y, 32, f, &mut b);
                assert!(a < b, "{f:?}: {x} and {y}");
                assert_eq!(a.len(), 32);
                assert_eq!((key_number(&a, f), key_number(&b, f)), (Some(x), Some(y)));
            }
        }
        key_bytes(42, 24, KeyFormat::Ycsb, &mut a);
        assert_eq!(a, b"user00000000000000000042");
        assert_eq!(key_number(b"usex00000000000000000042", KeyFormat::Ycsb), None);
    }

    #[test]
    fn short_values_carry_their_key() {
        let mut v = Vec::new();
        for size in [8, 12, 16, 40] {
            value_bytes(77, 5, size, &mut v);
            assert_eq!(v.len(), size);
            assert!(holds_key(&v, 77) && !holds_key(&v, 78), "{size}");
        }
        assert!(!holds_key(&[0; 4], 0));
    }

    #[test]
    fn a_scan_that_misses_a_known_key_or_leaves_order_is_caught() {
        // Keys below 100 are present throughout.
        assert_eq!(check_scan(&pairs(&[10, 11, 12]), 10, 3, 100, KeyFormat::Binary), 0);
        assert_eq!(
            check_scan(&pairs(&[98, 99, 105, 130]), 98, 4, 100, KeyFormat::Binary),
            0,
            "new keys past the frontier"
        );
        assert_eq!(check_scan(&pairs(&[98, 99]), 98, 10, 100, KeyFormat::Binary), 0, "the end of the index");
        assert_eq!(check_scan(&pairs(&[10, 12, 13]), 10, 3, 100, KeyFormat::Binary), 1, "11 missed");
        assert_eq!(check_scan(&pairs(&[11, 12]), 10, 2, 100, KeyFormat::Binary), 1, "10 missed");
        assert_eq!(check_scan(&pairs(&[10, 11]), 10, 5, 100, KeyFormat::Binary), 1, "stopped early");
        assert!(check_scan(&pairs(&[10, 10]), 10, 2, 100, KeyFormat::Binary) > 0, "a key twice");
        assert!(check_scan(&pairs(&[9]), 10, 1, 100, KeyFormat::Binary) > 0, "below the start");
        let mut wrong = Pairs::default();
        wrong.push(&10u64.to_be_bytes(), pairs(&[11]).get(0).1);
        assert_eq!(check_scan(&wrong, 10, 1, 100, KeyFormat::Binary), 1, "a value of another key");
    }

    #[test]
    fn the_frontier_is_the_first_key_not_known_inserted() {
        let f = Frontier::new(100, 3);
        assert_eq!(f.get(), 100);
        f.inserted(0); // 100
        assert_eq!(f.get(), 101);
        f.inserted(2); // 102, but 101 is not there yet
        assert_eq!(f.get(), 101);
        f.inserted(1); // 101
        assert_eq!(f.get(), 103);
        f.inserted(1); // 104
        assert_eq!(f.get(), 103);
    }
}
