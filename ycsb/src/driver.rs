//! Running YCSB against the hash table: load, timed run, verification.
//!
//! Keys are `0..N` as little-endian `u64`s padded to the key size. A value
//! carries its key and a version (`[key u64][version u64]`, padded), so
//! `--verify` can check every value read: a value of another key, a torn
//! value or a lost key counts as a violation. After the run every key is
//! read back.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use race_ht::{RaceConfig, RaceHt, ResizeStats, TableShape};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use smart_core::driver::{self, RunConfig, RunReport};
use smart_core::{Error, Runtime, Transport};

use crate::{KeyChooser, Op, Workload};

/// What to run.
#[derive(Clone, Debug)]
pub struct YcsbConfig {
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
    /// Keys the table is created for; it grows beyond them by splitting
    /// subtables (during the load or the run).
    pub capacity: u64,
}

/// The outcome of a YCSB run.
#[derive(Clone, Debug)]
pub struct YcsbReport {
    /// The timed run.
    pub run: RunReport,
    /// Seconds the load phase took.
    pub load_s: f64,
    /// Values of the wrong key, missing keys, failed updates of loaded keys.
    pub violations: u64,
    /// Speculative lookups that hit and missed (with `spec-lookup`).
    pub spec: (u64, u64),
    /// Keys found in two slots after the run (with `--verify`; counted in
    /// `violations` too).
    pub duplicates: u64,
    /// The table's shape after the run.
    pub shape: TableShape,
    /// Resizing as the worker threads saw it, summed over load and run.
    pub resize: ResizeStats,
}

fn key_bytes(k: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&k.to_le_bytes());
    out.resize(size, 0);
}

fn value_bytes(k: u64, version: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&k.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.resize(size, 0x5a);
}

fn holds_key(v: &[u8], k: u64) -> bool {
    v.len() >= 16 && v[..8] == k.to_le_bytes()
}

thread_local! {
    /// This worker thread's table handle: its coroutines share one directory
    /// cache, block recycler and speculative-lookup cache.
    static TABLE: std::cell::RefCell<Option<RaceHt>> = const { std::cell::RefCell::new(None) };
}

/// The thread's handle on table "ycsb" (opened by the first coroutine).
async fn thread_table(ctx: &smart_core::Ctx) -> smart_core::Result<RaceHt> {
    if let Some(t) = TABLE.with(|t| t.borrow().clone()) {
        return Ok(t);
    }
    let t = RaceHt::open(ctx, "ycsb").await.map_err(wrap)?;
    // Another coroutine of this thread may have opened it meanwhile: the
    // first handle stored is the one everybody shares.
    Ok(TABLE.with(|slot| slot.borrow_mut().get_or_insert(t).clone()))
}

fn wrap(e: race_ht::RaceError) -> Error {
    match e {
        race_ht::RaceError::Verbs(e) => e,
        other => Error::Unsupported(other.to_string()),
    }
}

/// Loads `y.keys` keys in parallel, runs the workload, verifies.
///
/// # Errors
/// Bad parameters, table or verb errors.
pub fn run_race(transport: &dyn Transport, cfg: &RunConfig, y: &YcsbConfig) -> smart_core::Result<YcsbReport> {
    if y.key_size < 8 || y.value_size < 16 {
        return Err(Error::Unsupported("--key-size must be ≥ 8 and --value-size ≥ 16".into()));
    }
    if y.workload.mix[3] > 0.0 {
        return Err(Error::Unsupported(
            "workload e needs range scans, which a hash table does not have (use --app sherman when it exists)".into(),
        ));
    }
    if y.keys == 0 {
        return Err(Error::Unsupported("--keys must be at least 1".into()));
    }
    // Sized for `capacity` keys; inserts beyond split subtables.
    let table = RaceConfig::for_keys(y.capacity.max(1));
    let mut setup = Runtime::new(transport, 0, cfg.runtime.clone())?;
    let ctx = setup.ctx();
    let existed = setup.block_on(async move {
        let existed = ctx.root(0, "race-ht:ycsb").await?.is_some();
        RaceHt::create(&ctx, "ycsb", table).await.map_err(wrap)?;
        Ok::<_, Error>(existed)
    })?;
    if existed && cfg.progress {
        eprintln!("note: table \"ycsb\" already exists on the blades (an earlier run): loading into it as it is");
    }

    // Load: coroutine i of n inserts keys i, i+n, i+2n, ...
    let total = (cfg.threads * cfg.coroutines) as u64;
    let violations = Arc::new(AtomicU64::new(0));
    let resize: Arc<Mutex<ResizeStats>> = Arc::default();
    let add_resize = |r: &Mutex<ResizeStats>, s: ResizeStats| {
        let mut r = r.lock().expect("not poisoned");
        r.splits += s.splits;
        r.doublings += s.doublings;
        r.refreshes += s.refreshes;
        r.waits += s.waits;
        r.split_ns += s.split_ns;
    };
    let t0 = Instant::now();
    if cfg.progress {
        eprintln!("loading {} keys", y.keys);
    }
    let load_cfg = RunConfig { duration: Duration::from_secs(24 * 3600), warmup: Duration::ZERO, ..cfg.clone() };
    let load = driver::run(transport, &load_cfg, |w| {
        let (y, resize) = (y.clone(), resize.clone());
        async move {
            let mut ht = thread_table(w.ctx()).await?;
            let me = (w.thread() * w.coroutines() + w.coroutine()) as u64;
            let (mut kb, mut vb) = (Vec::new(), Vec::new());
            let mut k = me;
            while k < y.keys {
                let t = w.now();
                key_bytes(k, y.key_size, &mut kb);
                value_bytes(k, 0, y.value_size, &mut vb);
                ht.insert(&kb, &vb).await.map_err(wrap)?;
                w.record(t, 1);
                k += total;
            }
            if w.coroutine() == 0 {
                // The thread's coroutines share these statistics.
                add_resize(&resize, ht.resize_stats());
            }
            Ok(())
        }
    })?;
    if let Some(e) = load.first_error {
        return Err(Error::Unsupported(format!("load failed: {e}")));
    }
    let load_s = t0.elapsed().as_secs_f64();
    if cfg.progress {
        eprintln!("loaded {} keys in {load_s:.1}s", y.keys);
    }

    // The timed run.
    let spec = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let run = driver::run(transport, cfg, |w| {
        let (y, violations, spec, resize) = (y.clone(), violations.clone(), spec.clone(), resize.clone());
        async move {
            let mut ht = thread_table(w.ctx()).await?;
            let me = (w.thread() * w.coroutines() + w.coroutine()) as u64;
            let mut rng = SmallRng::seed_from_u64(me ^ 0x5eed);
            let (mut kb, mut vb, mut out) = (Vec::new(), Vec::new(), Vec::new());
            let version = Cell::new(1u64);
            let mut next_insert = y.keys + me;
            let bad = Rc::new(Cell::new(0u64));
            while w.running() {
                let t = w.now();
                let op = y.workload.next_op(&mut rng);
                let k = if op == Op::Insert { next_insert } else { y.chooser.next(&mut rng) };
                key_bytes(k, y.key_size, &mut kb);
                match op {
                    Op::Read => {
                        let found = ht.get(&kb, &mut out).await.map_err(wrap)?;
                        if y.verify && (!found || !holds_key(&out, k)) {
                            bad.set(bad.get() + 1);
                        }
                    }
                    Op::Update | Op::ReadModifyWrite => {
                        if op == Op::ReadModifyWrite {
                            let found = ht.get(&kb, &mut out).await.map_err(wrap)?;
                            if y.verify && (!found || !holds_key(&out, k)) {
                                bad.set(bad.get() + 1);
                            }
                        }
                        value_bytes(k, version.get(), y.value_size, &mut vb);
                        version.set(version.get() + 1);
                        if !ht.update(&kb, &vb).await.map_err(wrap)? && y.verify {
                            bad.set(bad.get() + 1);
                        }
                    }
                    Op::Insert => {
                        value_bytes(k, 0, y.value_size, &mut vb);
                        ht.insert(&kb, &vb).await.map_err(wrap)?;
                        next_insert += total;
                    }
                    Op::Scan => unreachable!("refused above"),
                }
                w.record(t, 1);
            }
            violations.fetch_add(bad.get(), Ordering::Relaxed);
            if w.coroutine() == 0 {
                // The cache is per thread: one coroutine reports it (the
                // others ended too, or end with it, at the stop).
                let (h, m) = ht.spec_stats();
                spec.0.fetch_add(h, Ordering::Relaxed);
                spec.1.fetch_add(m, Ordering::Relaxed);
                add_resize(&resize, ht.resize_stats());
            }
            Ok(())
        }
    })?;

    let ctx = setup.ctx();
    let (keys, ksz, verify) = (y.keys, y.key_size, y.verify);
    let (shape, duplicates, lost) = setup.block_on(async move {
        let mut ht = RaceHt::open(&ctx, "ycsb").await.map_err(wrap)?;
        let (mut duplicates, mut lost) = (0, 0);
        if verify {
            // Every loaded key is still there and holds its own key; no
            // key is in two slots (scan also fails on a frozen slot, a
            // misplaced key or a bad block).
            let (mut kb, mut out) = (Vec::new(), Vec::new());
            for k in 0..keys {
                key_bytes(k, ksz, &mut kb);
                if !ht.get(&kb, &mut out).await.map_err(wrap)? || !holds_key(&out, k) {
                    lost += 1;
                }
            }
            let mut all = ht.scan().await.map_err(wrap)?;
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            duplicates = (n - all.len()) as u64;
        }
        Ok::<_, Error>((ht.current_shape().await.map_err(wrap)?, duplicates, lost))
    })?;
    violations.fetch_add(lost + duplicates, Ordering::Relaxed);
    let spec = (spec.0.load(Ordering::Relaxed), spec.1.load(Ordering::Relaxed));
    let resize = *resize.lock().expect("not poisoned");
    Ok(YcsbReport { run, load_s, violations: violations.load(Ordering::Relaxed), spec, duplicates, shape, resize })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smart_core::{EmbeddedTransport, RuntimeConfig};

    #[test]
    fn verified_run_over_the_hash_table_has_no_violations() {
        for (w, smart) in [("a", "none"), ("c", "spec-lookup"), ("d", "all"), ("f", "none"), ("update-only", "all")] {
            // A fresh blade each time: the table is created, loaded and grown anew.
            let t = EmbeddedTransport::new(2, 64 << 20).unwrap();
            let cfg = RunConfig {
                threads: 2,
                coroutines: 4,
                duration: Duration::from_millis(300),
                warmup: Duration::from_millis(50),
                runtime: RuntimeConfig {
                    smart: smart_core::smart::SmartConfig::parse(smart).unwrap(),
                    ..RuntimeConfig::default()
                },
                progress: false,
            };
            let y = YcsbConfig {
                keys: 2000,
                workload: Workload::parse(w).unwrap(),
                chooser: KeyChooser::zipfian(2000, 0.99),
                key_size: 8,
                value_size: 16,
                verify: true,
                // Created for 100 keys: the load and the inserts of d grow it.
                capacity: 100,
            };
            let r = run_race(&t, &cfg, &y).unwrap();
            assert!(r.run.ops > 100, "{w}: {} ops ({:?})", r.run.ops, r.run.first_error);
            assert_eq!(r.run.errors, 0, "{w}: {:?}", r.run.first_error);
            assert_eq!((r.violations, r.duplicates), (0, 0), "{w}");
            assert!(r.shape.splits >= 4 && r.shape.subtables >= 5, "{w}: the table grew: {:?}", r.shape);
            assert!(r.resize.splits > 0, "{w}: the workers split it: {:?}", r.resize);
            if w == "c" {
                assert!(r.spec.0 > r.spec.1, "read-only with spec-lookup mostly hits: {:?}", r.spec);
            }
        }
        assert!(run_race(
            &EmbeddedTransport::new(1, 16 << 20).unwrap(),
            &RunConfig {
                threads: 1,
                coroutines: 1,
                duration: Duration::from_millis(10),
                warmup: Duration::ZERO,
                runtime: RuntimeConfig::default(),
                progress: false,
            },
            &YcsbConfig {
                keys: 10,
                workload: Workload::parse("e").unwrap(),
                chooser: KeyChooser::Uniform(10),
                key_size: 8,
                value_size: 16,
                verify: false,
                capacity: 100
            }
        )
        .unwrap_err()
        .to_string()
        .contains("range scans"));
    }
}
