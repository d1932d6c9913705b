//! Running a transaction workload on ford-dtx: create or open the
//! database, recover dead compute blades, register, load in parallel, run
//! timed, audit.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ford_dtx::db::{Db, DbSpec, TableSpec};
use ford_dtx::recovery::{self, AuditReport, Recovered, Which};
use ford_dtx::{Abort, Dtx, DtxError, DtxStats, Registration, Txn, TxnError};
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use smart_bench::below;
use smart_bench::harness::{self, Bench, RunConfig, RunReport, Worker};
use smart_core::{Ctx, Runtime, Transport};

/// One drawn transaction: its type and parameters (kept to retry it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    /// Index into [`Workload::types`].
    pub ty: usize,
    /// Keys and parameters.
    pub keys: [u64; 3],
    /// Randomness for new values.
    pub salt: u64,
}

/// A transaction mix from the command line: `spec` is either one
/// percentage per type of `types`, in their order (`35,10,35,2,14,2,2`), or
/// `TYPE=PCT` pairs, the types not named getting 0
/// (`get_subscriber_data=100`). The percentages must sum to 100.
///
/// # Errors
/// A message naming what is wrong (an unknown or repeated type, a count
/// that is not the number of types, a bad number, a sum other than 100).
pub fn parse_mix(spec: &str, types: &[&str]) -> Result<Vec<u32>, String> {
    let pct = |s: &str| -> Result<u32, String> {
        s.trim()
            .parse::<u32>()
            .ok()
            .filter(|p| *p <= 100)
            .ok_or_else(|| format!("{s:?} is not a percentage (0 to 100)"))
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let mix = if spec.contains('=') {
        let mut mix = vec![None; types.len()];
        for part in parts {
            let (name, p) =
                part.split_once('=').ok_or_else(|| format!("{part:?}: use TYPE=PCT for every type named"))?;
            let name = name.trim();
            let i = types
                .iter()
                .position(|t| *t == name)
                .ok_or_else(|| format!("no transaction type {name:?} (the types: {})", types.join(", ")))?;
            if mix[i].replace(pct(p)?).is_some() {
                return Err(format!("{name} is named twice"));
            }
        }
        mix.into_iter().map(|p| p.unwrap_or(0)).collect()
    } else {
        if parts.len() != types.len() {
            return Err(format!(
                "{} percentages for {} transaction types ({}); or name them, TYPE=PCT",
                parts.len(),
                types.len(),
                types.join(", ")
            ));
        }
        parts.into_iter().map(pct).collect::<Result<Vec<u32>, String>>()?
    };
    let sum: u32 = mix.iter().sum();
    if sum != 100 {
        return Err(format!("the percentages sum to {sum}, not 100"));
    }
    Ok(mix)
}

/// A transaction type drawn from a mix of percentages (summing to 100).
pub fn pick(mix: &[u32], rng: &mut SmallRng) -> usize {
    let mut p = below(rng.next_u64(), 100) as u32;
    let mut ty = 0;
    while p >= mix[ty] {
        p -= mix[ty];
        ty += 1;
    }
    ty
}

/// A transaction workload.
///
/// Its futures run on one thread's runtime and need not be `Send`.
#[allow(async_fn_in_trait, reason = "futures run on a single-threaded runtime; no Send bound is wanted")]
pub trait Workload: Sync {
    /// "smallbank" or "tatp".
    fn name(&self) -> &'static str;
    /// (name, value bytes, expected rows) per table, by id.
    fn tables(&self) -> Vec<(String, usize, u64)>;
    /// Transaction types, by [`Draw::ty`].
    fn types(&self) -> &'static [&'static str];
    /// The percentage of each type that [`Workload::draw`] draws.
    fn mix(&self) -> &[u32];
    /// Units the load inserts (accounts, subscribers).
    fn rows(&self) -> u64;
    /// Draws the next transaction.
    fn draw(&self, rng: &mut SmallRng) -> Draw;
    /// Loads unit `row` (every row of it, in one or more transactions).
    async fn load(&self, tx: &mut Txn, row: u64) -> Result<(), TxnError>;
    /// Once per coroutine before its run, with its ledger key `me`.
    async fn prepare(&self, tx: &mut Txn, me: u64) -> Result<(), TxnError>;
    /// Runs one attempt of `d`.
    async fn run(&self, tx: &mut Txn, d: &Draw, me: u64) -> Result<(), TxnError>;
}

/// How to run a workload.
#[derive(Clone, Debug)]
pub struct DtxConfig {
    /// The database's name.
    pub db: String,
    /// Copies of every table (primary included).
    pub replicas: usize,
    /// Retry a transaction that aborted on a conflict (else draw a new one,
    /// as FORD does).
    pub retry_aborts: bool,
    /// This compute blade's lease.
    pub lease: Duration,
    /// Raised from outside (a coordinator's membership), it stops the
    /// transactions from locking and committing, as a lost lease does
    /// (`None`: only the lease does).
    pub halt: Option<Arc<AtomicBool>>,
    /// Set to the registration's fence tag once registered (for a
    /// coordinator's membership record, so that a failover can fence it).
    pub fence_tag: Option<Arc<AtomicU64>>,
    /// With `fence_tag`: the tag the coordinator has recorded. The run
    /// waits (up to its lease) until it is this registration's, before its
    /// first lock.
    pub fence_recorded: Option<Arc<AtomicU64>>,
    /// Memory blades a failover took out of the cluster's configuration:
    /// the run goes on over the others, a backup promoted for each table
    /// whose primary was there ([`Db::without`]). The database must exist,
    /// loaded. Empty: every blade is in.
    pub lost: Vec<u16>,
    /// Memory blades joining the configuration: written by every
    /// transaction, read by none, while their copies are made
    /// ([`Db::view`], `ford_dtx::rejoin`).
    pub joining: Vec<u16>,
    /// The registrations (fence tags) of the compute blades of the earlier
    /// configuration epoch, fenced by the failover: their transactions are
    /// settled ([`recovery::settle`]) before this run registers.
    pub settle: Vec<u64>,
}

/// Outcomes per transaction type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Attempts (retries count again).
    pub attempted: Vec<u64>,
    /// Commits.
    pub committed: Vec<u64>,
    /// Aborts per cause ([`Abort::ALL`] order).
    pub aborts: Vec<[u64; 6]>,
}

impl Counts {
    fn new(types: usize) -> Self {
        Counts { attempted: vec![0; types], committed: vec![0; types], aborts: vec![[0; 6]; types] }
    }

    /// Adds `o`.
    pub fn merge(&mut self, o: &Counts) {
        for (i, c) in o.attempted.iter().enumerate() {
            self.attempted[i] += c;
            self.committed[i] += o.committed[i];
            for (a, b) in self.aborts[i].iter_mut().zip(&o.aborts[i]) {
                *a += b;
            }
        }
    }

    /// All attempts.
    pub fn total_attempted(&self) -> u64 {
        self.attempted.iter().sum()
    }

    /// All commits.
    pub fn total_committed(&self) -> u64 {
        self.committed.iter().sum()
    }

    /// Aborts of `cause`, over all types.
    pub fn aborts_of(&self, cause: Abort) -> u64 {
        let i = Abort::ALL.iter().position(|a| *a == cause).expect("a cause");
        self.aborts.iter().map(|a| a[i]).sum()
    }
}

fn cause_index(a: Abort) -> usize {
    Abort::ALL.iter().position(|c| *c == a).expect("a cause")
}

/// Errors of a workload run.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The database failed while setting up, recovering or auditing.
    #[error(transparent)]
    Dtx(#[from] DtxError),
    /// A worker thread could not start.
    #[error(transparent)]
    Harness(#[from] smart_core::Error),
    /// A coroutine of the load failed.
    #[error("load failed: {0}")]
    Load(String),
    /// The load was interrupted.
    #[error("interrupted during the load, after {0:.1} s")]
    Interrupted(f64),
}

/// The outcome of a run.
#[derive(Debug)]
pub struct DtxReport {
    /// The timed run (its operations are committed transactions).
    pub run: RunReport,
    /// Seconds the load took (0 when the database existed).
    pub load_s: f64,
    /// Whether the database existed (then it was not loaded).
    pub existed: bool,
    /// What recovery did at start.
    pub recovered: Vec<Recovered>,
    /// Outcomes per type, measured phase only.
    pub counts: Counts,
    /// The transaction layer's counters.
    pub stats: DtxStats,
    /// The registry slot this run held.
    pub slot: u16,
}

impl DtxReport {
    /// This run followed, after `gap_s` seconds without transactions (a
    /// failover), by `next` (the same compute blade going on in the next
    /// configuration epoch): one report of both. The measured time counts
    /// the gap, so that rates over it say what the failover cost; the
    /// timeline's samples of `next` are placed after it; the error, the
    /// Smart state and the slot are `next`'s.
    pub fn then(&mut self, next: DtxReport, gap_s: f64) {
        let offset = self.run.duration_s + gap_s;
        let r = &mut self.run;
        r.duration_s = offset + next.run.duration_s;
        r.ops += next.run.ops;
        r.verbs.merge(&next.run.verbs);
        r.latency.merge(&next.run.latency);
        r.smart = next.run.smart;
        r.timeline.extend(next.run.timeline.into_iter().map(|mut s| {
            s.t_s += offset;
            s
        }));
        (r.errors, r.first_error, r.interrupted) = (next.run.errors, next.run.first_error, next.run.interrupted);
        self.recovered.extend(next.recovered);
        self.counts.merge(&next.counts);
        self.stats.merge(&next.stats);
        self.slot = next.slot;
    }
}

/// The ledger key of a coroutine.
pub fn ledger_key(slot: u16, thread: usize, coroutine: usize) -> u64 {
    u64::from(slot) << 24 | (thread as u64) << 12 | coroutine as u64
}

fn spec<W: Workload>(w: &W, d: &DtxConfig) -> DbSpec {
    DbSpec {
        name: d.db.clone(),
        tables: w.tables().into_iter().map(|(name, value_size, rows)| TableSpec { name, value_size, rows }).collect(),
        replicas: d.replicas,
    }
}

/// A database as [`open`] found it.
#[derive(Debug)]
pub struct Opened {
    /// The database.
    pub db: Arc<Db>,
    /// Whether it existed (made by an earlier run, or by another compute
    /// blade just now).
    pub existed: bool,
    /// Whether this compute blade must load it: it is new, or its load
    /// never completed and no other compute blade can be loading it now.
    pub load: bool,
    /// What recovery did.
    pub recovered: Vec<Recovered>,
}

/// Creates (or opens) the database and recovers dead compute blades. A
/// database that exists but whose load never completed ([`Db::is_loaded`])
/// is waited for while another registered compute blade may be loading it
/// (its lease runs); once none can be, the dead are recovered and this
/// compute blade loads the rest (rows already there are kept). Call it
/// before registering, so that compute blades waiting here never wait for
/// each other.
///
/// # Errors
/// As [`Db::create`] and [`recovery::recover`].
pub fn open<W: Workload>(
    transport: &dyn Transport,
    cfg: &RunConfig,
    w: &W,
    d: &DtxConfig,
) -> Result<Opened, WorkloadError> {
    let mut rt = Runtime::new(transport, 0, cfg.runtime.clone())?;
    let ctx = rt.ctx();
    let spec = spec(w, d);
    if !d.lost.is_empty() || !d.joining.is_empty() || !d.settle.is_empty() {
        return open_without(&mut rt, cfg, d);
    }
    let (db, existed, mut recovered) = rt.block_on(async move {
        let (db, existed) = Db::create(&ctx, &spec).await?;
        let rec = recovery::recover(&ctx, &db, Which::Expired).await?;
        Ok::<_, DtxError>((db, existed, rec))
    })?;
    let db = Arc::new(db);
    let load = !existed || unfinished_load(&mut rt, &db, cfg, d, &mut recovered)?;
    Ok(Opened { db, existed, load, recovered })
}

/// [`open`] after a failover took memory blades `d.lost` out (or a later
/// change of the configuration: blades `d.joining` joining, or taken in
/// again): the database as transactions use it in that view ([`Db::view`]),
/// once the earlier
/// epoch's transactions are settled (waiting for those another compute
/// blade is settling, and taking them over if it died: up to recovery's
/// hold and grace, plus twice the lease).
fn open_without(rt: &mut Runtime, cfg: &RunConfig, d: &DtxConfig) -> Result<Opened, WorkloadError> {
    let ctx = rt.ctx();
    let (name, lost, joining, settle) = (d.db.clone(), d.lost.clone(), d.joining.clone(), d.settle.clone());
    let wait_ms = recovery::settle_wait_ms(d.lease);
    let (db, recovered) = rt.block_on(async move {
        // Without blade 0, from its mirror on the first blade read.
        let Some(db) = Db::open_view(&ctx, &name, &lost, &joining).await? else {
            return Err(DtxError::Config(format!("database {name:?} does not exist: nothing to go on with")));
        };
        if !db.is_loaded(&ctx).await? {
            return Err(DtxError::Config(format!("database {name:?} was never fully loaded: nothing to go on with")));
        }
        let mut rec = recovery::settle(&ctx, &db, &settle, wait_ms).await?;
        rec.extend(recovery::recover(&ctx, &db, Which::Expired).await?);
        Ok::<_, DtxError>((db, rec))
    })?;
    if cfg.progress && !(db.lost.is_empty() && db.joining.is_empty()) {
        let promoted: Vec<String> = db
            .tables
            .iter()
            .filter(|t| t.order[0] != 0)
            .map(|t| format!("table {} on memory blade {}", t.id, t.vbase[0].blade()))
            .collect();
        let mut line = if db.lost.is_empty() {
            "going on".to_string()
        } else {
            format!(
                "going on without memory blade{} {}",
                if db.lost.len() == 1 { "" } else { "s" },
                ford_dtx::rebuild::blade_list(&db.lost)
            )
        };
        if !db.joining.is_empty() {
            line += &format!(
                ", writing to memory blade{} {} as {} joins (read once its copies are made)",
                if db.joining.len() == 1 { "" } else { "s" },
                ford_dtx::rebuild::blade_list(&db.joining),
                if db.joining.len() == 1 { "it" } else { "they" }
            );
        }
        eprintln!(
            "{line}: {}{}",
            if promoted.is_empty() {
                "no primary was there".to_string()
            } else {
                format!("backups promoted: {}", promoted.join(", "))
            },
            if recovered.is_empty() { String::new() } else { format!("; {} registrations recovered", recovered.len()) }
        );
    }
    Ok(Opened { db: Arc::new(db), existed: true, load: false, recovered })
}

/// For a database that existed: whether this compute blade must finish its
/// load (see [`open`]). Waits while a registered compute blade may be
/// loading it; recovers the dead before saying yes.
fn unfinished_load(
    rt: &mut Runtime,
    db: &Arc<Db>,
    cfg: &RunConfig,
    d: &DtxConfig,
    recovered: &mut Vec<Recovered>,
) -> Result<bool, WorkloadError> {
    let ctx = rt.ctx();
    let (mut said, mut quiet_since) = (None::<Instant>, None::<u64>);
    loop {
        let (c, b) = (ctx.clone(), db.clone());
        let (loaded, slots) = rt.block_on(async move {
            Ok::<_, DtxError>((b.is_loaded(&c).await?, ford_dtx::registry::slots(&c, &b).await?))
        })?;
        if loaded {
            return Ok(false);
        }
        let now = ford_dtx::registry::now_ms(&ctx);
        // A claimed slot whose lease has not run out (recovery's grace
        // included) may belong to a compute blade loading the database.
        let live = slots.iter().find(|s| s.claim != 0 && s.expiry_ms.saturating_add(recovery::GRACE_MS) >= now);
        if let Some(s) = live {
            match said {
                None if cfg.progress => {
                    eprintln!(
                        "waiting: database {:?} is not fully loaded, and compute blade {} (pid {}) registered on it \
                         may be loading it (its lease runs {:.1} s more, renewed while it lives)",
                        d.db,
                        s.slot,
                        s.pid,
                        s.expiry_ms.saturating_sub(now) as f64 / 1000.0
                    );
                    said = Some(Instant::now());
                }
                // A line every 30 s while the wait lasts.
                Some(t) if cfg.progress && t.elapsed() >= Duration::from_secs(30) => {
                    eprintln!(
                        "waiting: still, for database {:?}: compute blade {} (pid {}) is registered on it",
                        d.db, s.slot, s.pid
                    );
                    said = Some(Instant::now());
                }
                _ => {}
            }
            quiet_since = None;
            pause(rt, 100);
            continue;
        }
        // The compute blade that created the database registers just
        // after: only a quarter of a second without any is an interrupted
        // load.
        let now_ns = ctx.now_ns();
        let since = *quiet_since.get_or_insert(now_ns);
        if now_ns - since < 250_000_000 {
            pause(rt, 50);
            continue;
        }
        let (c, b) = (ctx.clone(), db.clone());
        recovered.extend(rt.block_on(async move { recovery::recover(&c, &b, Which::Expired).await })?);
        if cfg.progress {
            eprintln!(
                "note: database {:?} exists, but its load never completed (it was interrupted): loading the rest \
                 (rows already there are kept)",
                d.db
            );
        }
        return Ok(true);
    }
}

struct Phase<'a, W: Workload> {
    w: &'a W,
    reg: &'a Registration,
    load: bool,
    retry: bool,
    total: u64,
    counts: &'a Mutex<Counts>,
    stats: &'a Mutex<DtxStats>,
}

#[derive(Clone)]
struct ThreadState {
    dtx: Dtx,
    counts: Rc<RefCell<Counts>>,
}

impl<W: Workload + Clone + 'static> Bench for Phase<'_, W> {
    type Error = TxnError;
    type Thread = ThreadState;

    fn open_thread(&self, ctx: Ctx) -> impl Future<Output = Result<ThreadState, TxnError>> + 'static {
        let st = ThreadState {
            dtx: self.reg.open_thread(ctx),
            counts: Rc::new(RefCell::new(Counts::new(self.w.types().len()))),
        };
        async move { Ok(st) }
    }

    fn coroutine(&self, wk: Worker, st: ThreadState) -> impl Future<Output = Result<(), TxnError>> + 'static {
        let (w, load, retry, total, slot) = (self.w.clone(), self.load, self.retry, self.total, self.reg.slot());
        async move {
            let mut tx = st.dtx.txn(wk.coroutine());
            let me = ledger_key(slot, wk.thread(), wk.coroutine());
            let ctx = st.dtx.ctx().clone();
            // The load and the preparation run once: their futures are boxed
            // (type-erased) so that their code stays out of the transaction
            // loop's, which is all the instruction cache should hold.
            if load {
                let rows: Pin<Box<dyn Future<Output = _> + '_>> = Box::pin(async {
                    let mut row = (wk.thread() * wk.coroutines() + wk.coroutine()) as u64;
                    while row < w.rows() && wk.running() {
                        let t = wk.now();
                        until_no_conflict(&ctx, wk.seed() ^ row, async || w.load(&mut tx, row).await).await?;
                        wk.record(t, 1);
                        row += total;
                    }
                    Ok(())
                });
                return rows.await;
            }
            // Coroutines that insert their ledger rows into one bucket at
            // once choose the same free slot: again.
            let prepare: Pin<Box<dyn Future<Output = _> + '_>> =
                Box::pin(until_no_conflict(&ctx, wk.seed(), async || w.prepare(&mut tx, me).await));
            prepare.await?;
            let mut rng = SmallRng::seed_from_u64(wk.seed());
            while wk.running() {
                wk.idle().await;
                let d = w.draw(&mut rng);
                let t = wk.now();
                let mut op = ctx.op().await;
                loop {
                    let r = w.run(&mut tx, &d, me).await;
                    let counting = wk.measuring();
                    if counting {
                        st.counts.borrow_mut().attempted[d.ty] += 1;
                    }
                    match r {
                        Ok(()) => {
                            if counting {
                                st.counts.borrow_mut().committed[d.ty] += 1;
                            }
                            // The same reading of the phase for both counts.
                            wk.record_if(counting, t, 1);
                            break;
                        }
                        Err(TxnError::Abort(a)) => {
                            if counting {
                                st.counts.borrow_mut().aborts[d.ty][cause_index(a)] += 1;
                            }
                            if !a.is_conflict() {
                                break;
                            }
                            // ConflictAvoid backs off after a conflict,
                            // retried or not.
                            op.retry().await;
                            if !retry || !wk.running() {
                                break;
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        }
    }

    fn close_thread(&self, st: ThreadState) {
        self.counts.lock().expect("not poisoned").merge(&st.counts.borrow());
        self.stats.lock().expect("not poisoned").merge(&st.dtx.stats());
    }
}

/// Runs `f` again while it aborts on a conflict (two inserts that chose
/// the same free slot), up to 10 000 times.
///
/// After a conflict it waits a random time below a bound that doubles per
/// conflict (2 µs to 1 ms): coroutines that keep taking the same lock in
/// the same order would otherwise collide again and again (a livelock that
/// a deterministic simulation at 96 threads × 8 coroutines makes happen
/// every time, and real hardware only now and then).
async fn until_no_conflict(
    ctx: &Ctx,
    seed: u64,
    mut f: impl AsyncFnMut() -> Result<(), TxnError>,
) -> Result<(), TxnError> {
    let mut tries = 0u32;
    let mut x = smart_core::hash::mix64(seed) | 1;
    loop {
        match f().await {
            Err(TxnError::Abort(a)) if a.is_conflict() && tries < 10_000 => {
                tries += 1;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let bound = (2_000u64 << tries.min(9)).min(1_000_000);
                ctx.sleep_ns(below(x, bound)).await;
            }
            r => return r,
        }
    }
}

/// Waits `ms` on the runtime's clock: the OS thread sleeps on a real
/// backend; under a simulation, virtual time passes.
fn pause(rt: &mut Runtime, ms: u64) {
    let ctx = rt.ctx();
    if ctx.clock().is_virtual() {
        rt.block_on(async move { ctx.sleep_ns(ms * 1_000_000).await });
    } else {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Loads the workload unless the database exists, then runs it for
/// `cfg.duration` on `cfg.threads` × `cfg.coroutines` coroutines, as one
/// registered compute blade.
///
/// # Errors
/// Set-up, recovery or load failures.
pub fn run<W: Workload + Clone + 'static>(
    transport: Arc<dyn Transport>,
    cfg: &RunConfig,
    w: &W,
    d: &DtxConfig,
) -> Result<DtxReport, WorkloadError> {
    let Opened { db, existed, load, recovered } = open(&*transport, cfg, w, d)?;
    let loading = db.clone();
    if cfg.progress {
        for r in &recovered {
            eprintln!(
                "recovered dead compute blade {} (pid {}): {}; {} rolled back, {} rolled forward, {} locks released",
                r.slot,
                r.pid,
                r.fencing(),
                r.rolled_back,
                r.rolled_forward,
                r.released
            );
        }
    }
    let halt = d.halt.clone().unwrap_or_default();
    // The timed run's committed transactions, published in the registry
    // slot with each renewal (an online copy throttles by them).
    let published = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reg = Registration::register_publishing(
        transport.clone(),
        db,
        (cfg.threads, cfg.coroutines),
        d.lease,
        halt,
        published.clone(),
    )?;
    if let Some(t) = &d.fence_tag {
        t.store(reg.fence_tag(), Ordering::SeqCst);
        // Before the first lock, the coordinator knows the tag: a failover
        // from then on fences this compute blade, however it stalls.
        if let Some(r) = &d.fence_recorded {
            reg.await_recorded(r, d.lease).map_err(|e| WorkloadError::Load(e.to_string()))?;
        }
    }
    if cfg.progress {
        eprintln!("registered as compute blade {} of database {:?} (pid {})", reg.slot(), d.db, reg.pid());
    }
    // Every runtime that locks or commits for this registration names it, so
    // that a recovery that takes this compute blade for dead fences it on
    // the memory blades.
    let cfg = &RunConfig { runtime: reg.runtime_config(&cfg.runtime), published: Some(published), ..cfg.clone() };
    let counts = Mutex::new(Counts::new(w.types().len()));
    let stats = Mutex::new(DtxStats::default());
    let phase = |load| Phase {
        w,
        reg: &reg,
        load,
        retry: d.retry_aborts,
        total: (cfg.threads * cfg.coroutines) as u64,
        counts: &counts,
        stats: &stats,
    };
    let mut load_s = 0.0;
    if !load {
        if cfg.progress && d.lost.is_empty() && d.joining.is_empty() && d.settle.is_empty() {
            eprintln!("note: database {:?} exists on the blades (an earlier run): running on it as it is", d.db);
        }
    } else {
        if cfg.progress {
            eprintln!("loading {} {} rows", w.rows(), w.name());
        }
        let t0 = Instant::now();
        let v0 = transport.simulation().map(|s| s.now_ns());
        let load = harness::run_bench(&*transport, &cfg.for_load(), &phase(true))?;
        // Virtual seconds under a simulation.
        load_s = match (transport.simulation(), v0) {
            (Some(s), Some(v0)) => s.now_ns().saturating_sub(v0) as f64 / 1e9,
            _ => t0.elapsed().as_secs_f64(),
        };
        if let Some(e) = load.first_error {
            return Err(WorkloadError::Load(e));
        }
        if load.interrupted {
            // Every coroutine finished its row (none holds a lock): the
            // slot is freed now, so that the next run finishes the load
            // without waiting for this lease to run out.
            if let Err(e) = reg.close(&*transport) {
                eprintln!("note: the registry slot stays taken ({e}): the next run waits for its lease to run out");
            }
            return Err(WorkloadError::Interrupted(load_s));
        }
        // Every row is there: later runs use the database as it is.
        let mut rt = Runtime::new(&*transport, 0, cfg.runtime.clone())?;
        let ctx = rt.ctx();
        rt.block_on(async move { loading.mark_loaded(&ctx).await })?;
        if cfg.progress {
            eprintln!("loaded in {load_s:.1}s");
        }
    }
    // The record counts the run's transactions alone.
    *counts.lock().expect("not poisoned") = Counts::new(w.types().len());
    *stats.lock().expect("not poisoned") = DtxStats::default();
    let run = harness::run_bench(&*transport, cfg, &phase(false))?;
    let slot = reg.slot();
    // A run whose coroutines failed may hold locks: leave the slot to
    // recovery (its lease expires) rather than free it.
    if run.first_error.is_none() {
        reg.close(&*transport)?;
    }
    Ok(DtxReport {
        run,
        load_s,
        existed,
        recovered,
        counts: counts.into_inner().expect("not poisoned"),
        stats: stats.into_inner().expect("not poisoned"),
        slot,
    })
}

/// The audit of a quiescent database: the layer's (replicas agree, no lock
/// held, records intact) and the workload's invariant.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Audited {
    /// The transaction layer's audit.
    pub db: AuditReport,
    /// SmallBank: Σ balances found, in cents.
    pub balances: Option<i64>,
    /// SmallBank: initial sum + Σ ledgers, in cents.
    pub expected: Option<i64>,
    /// SmallBank: Σ ledger transactions (committed DepositChecking,
    /// TransactSavings and WriteCheck of runs with a ledger).
    pub ledger_txns: Option<u64>,
    /// Whether its load completed ([`Db::is_loaded`]); a database whose
    /// load was interrupted lacks rows.
    pub loaded: bool,
    /// SmallBank: why the money was not checked (`None`: it was): a run
    /// without a ledger changed balances (the database remembers it), or
    /// other compute blades were running.
    pub money_unchecked: Option<String>,
    /// Registrations (slot, pid) whose compute blades were still running
    /// when the audit read the database, after it waited
    /// [`AUDIT_WAIT`] for them: what their transactions had in flight
    /// (locks held, replicas part-written, records mid-write, money
    /// between rows) is reported, not counted.
    pub running: Vec<(u16, u64)>,
    /// Locks held, replica mismatches, torn records, 1 if the workload's
    /// invariant fails, and 1 if the load never completed (in-flight
    /// counts excepted while other compute blades ran: see `running`).
    pub violations: u64,
}

/// How long an audit waits for other compute blades that are running on
/// the database (their leases renewed) to end before it reads it anyway.
pub const AUDIT_WAIT: Duration = Duration::from_secs(60);

/// The registrations of `db` other than recovering ones whose lease (with
/// recovery's grace) runs at `now`: (slot, pid).
fn running_now(slots: &[ford_dtx::registry::SlotInfo], now: u64) -> Vec<(u16, u64)> {
    slots.iter().filter(|s| s.lease_runs(now)).map(|s| (s.slot, s.pid)).collect()
}

/// Audits database `name` (which must exist), waiting at most
/// [`AUDIT_WAIT`] for other compute blades running on it: see [`Audited`].
///
/// # Errors
/// A missing database; verb errors.
pub fn audit(
    transport: &dyn Transport,
    cfg: &RunConfig,
    name: &str,
    smallbank: bool,
) -> Result<Audited, WorkloadError> {
    audit_waiting(transport, cfg, name, smallbank, AUDIT_WAIT)
}

/// [`audit`], waiting at most `wait` for other running compute blades.
///
/// # Errors
/// As [`audit`].
pub fn audit_waiting(
    transport: &dyn Transport,
    cfg: &RunConfig,
    name: &str,
    smallbank: bool,
    wait: Duration,
) -> Result<Audited, WorkloadError> {
    let mut rt = Runtime::new(transport, 0, cfg.runtime.clone())?;
    let ctx = rt.ctx();
    let name = name.to_string();
    let simulated = transport.simulation().is_some();
    Ok(rt.block_on(async move {
        let db = Db::open(&ctx, &name)
            .await?
            .ok_or_else(|| DtxError::Config(format!("no database {name:?} on these blades")))?;
        // Other compute blades running on the database: waited for (their
        // transactions in flight are not violations), at most AUDIT_WAIT.
        // A dead one's lease runs out, and its locks then count (recovery
        // releases them). Under simulation no other process runs.
        let started = Instant::now();
        let mut said = None::<Instant>;
        let running = loop {
            let now = ford_dtx::registry::now_ms(&ctx);
            let running = running_now(&ford_dtx::registry::slots(&ctx, &db).await?, now);
            if simulated {
                // Every registration left is a dead process's.
                break Vec::new();
            }
            if running.is_empty() || started.elapsed() >= wait {
                break running;
            }
            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                let who: Vec<String> = running.iter().map(|(s, p)| format!("compute blade {s} (pid {p})")).collect();
                eprintln!(
                    "audit: {name}: waiting for {} to end (running on the database; at most {} s more)",
                    who.join(", "),
                    wait.saturating_sub(started.elapsed()).as_secs()
                );
                said = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let (mut sum, mut ledgers, mut txns, mut unledgered) = (0i64, 0i64, 0u64, false);
        let rep = recovery::audit(&ctx, &db, |t, key, v| {
            // Only SmallBank's tables are money (TATP's ids mean other tables).
            if !smallbank {
                return;
            }
            match t {
                crate::smallbank::SAVINGS | crate::smallbank::CHECKING => sum += crate::smallbank::cents(v),
                crate::smallbank::LEDGER if key == crate::smallbank::UNLEDGERED => unledgered = true,
                crate::smallbank::LEDGER => {
                    let (c, n) = crate::smallbank::ledger_row(v);
                    ledgers += c;
                    txns += n;
                }
                _ => {}
            }
        })
        .await?;
        let loaded = db.is_loaded(&ctx).await?;
        let mut violations = rep.violations() + u64::from(!loaded);
        if !running.is_empty() {
            violations -= rep.locks_held + rep.replica_mismatches + rep.torn;
        }
        let mut out = Audited { violations, loaded, running, ..Audited::default() };
        if smallbank {
            let accounts = rep.live[crate::smallbank::SAVINGS as usize] as i64;
            let expected = 2 * accounts * crate::smallbank::START_CENTS + ledgers;
            out.balances = Some(sum);
            out.expected = Some(expected);
            out.ledger_txns = Some(txns);
            out.money_unchecked = if unledgered {
                Some(
                    "a run without --audit changed balances without keeping ledgers (the database remembers it), \
                     so no sum of ledgers says what they should be"
                        .into(),
                )
            } else if !out.running.is_empty() {
                Some("other compute blades were running: money was in flight between rows".into())
            } else {
                None
            };
            if out.money_unchecked.is_none() && sum != expected {
                out.violations += 1;
            }
            if rep.live[0] != rep.live[1] {
                out.violations += 1;
            }
        }
        out.db = rep;
        Ok::<_, DtxError>(out)
    })?)
}
