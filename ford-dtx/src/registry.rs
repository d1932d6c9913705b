//! Compute blades register on the database with a lease: a registry slot
//! whose number names them in lock words, their log area, and an expiry
//! time a heartbeat thread keeps pushing forward. A slot whose lease
//! expired belongs to a dead compute blade, for [`crate::recovery`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use smart_core::runtime::RuntimeConfig;
use smart_core::{Ctx, GlobalAddr, Runtime, Transport};

use crate::db::Db;
use crate::error::{DtxError, Result};
use crate::layout::{self, log, registry, MAX_REPLICAS};

/// Wall-clock milliseconds since the Unix epoch, as `ctx`'s clock tells
/// them (a simulation's virtual time under a simulated transport: see
/// [`smart_core::clock::Clock::wall_ms`]).
pub fn now_ms(ctx: &Ctx) -> u64 {
    ctx.clock().wall_ms()
}

/// A registry slot as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    /// Slot number (the owner id in lock words).
    pub slot: u16,
    /// Claim word: 0 free, else the holder's nonce (bit 63: recovering).
    pub claim: u64,
    /// Lease expiry, Unix ms.
    pub expiry_ms: u64,
    /// The holder's undo log area, one copy per replica (copy `j` on
    /// blade `(slot + j) mod n`, the blades a failover took out skipped;
    /// [`GlobalAddr::NULL`] past the last).
    pub logs: [GlobalAddr; MAX_REPLICAS],
    /// Its worker threads.
    pub threads: u64,
    /// Its coroutines per thread.
    pub coroutines: u64,
    /// Its process id (for messages).
    pub pid: u64,
}

impl SlotInfo {
    pub(crate) fn parse(slot: u16, b: &[u8]) -> SlotInfo {
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        SlotInfo {
            slot,
            claim: w(0),
            expiry_ms: w(8),
            logs: std::array::from_fn(|j| match j {
                0 => GlobalAddr::from_raw(w(16)),
                j => GlobalAddr::from_raw(w(registry::LOG_COPIES + 8 * (j - 1))),
            }),
            threads: w(24),
            coroutines: w(32),
            pid: w(40),
        }
    }

    /// The slot's words as [`SlotInfo::parse`] reads them, with `claim` and
    /// `second` in place of the claim and the expiry (the mirror keeps a
    /// lease length there, see [`crate::mirror`]).
    pub(crate) fn bytes(&self, claim: u64, second: u64) -> [u8; registry::WORDS] {
        let mut b = [0u8; registry::WORDS];
        for (i, v) in
            [claim, second, self.logs[0].raw(), self.threads, self.coroutines, self.pid].into_iter().enumerate()
        {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (j, a) in self.logs[1..].iter().enumerate() {
            b[registry::LOG_COPIES + 8 * j..][..8].copy_from_slice(&a.raw().to_le_bytes());
        }
        b
    }

    /// Whether a registration holds the slot and its lease (with
    /// recovery's [`GRACE_MS`](crate::recovery::GRACE_MS)) runs at `now`
    /// (Unix ms), no recovery holding it: a compute blade alive, or dead
    /// too recently to tell.
    pub fn lease_runs(&self, now: u64) -> bool {
        self.claim != 0
            && self.claim & registry::RECOVERING == 0
            && self.expiry_ms.saturating_add(crate::recovery::GRACE_MS) >= now
    }

    /// The registration nonce (the claim without the recovering bit).
    pub fn nonce(&self) -> u64 {
        self.claim & !registry::RECOVERING
    }

    /// The copies of the slot's undo log area (one per replica, copy 0
    /// first) and their bytes; empty if it has none. Checked against what a
    /// registration writes: 1 to [`layout::MAX_THREADS`] threads and
    /// coroutines, every copy whole on one of the database's blades, no two
    /// on one blade.
    ///
    /// # Errors
    /// [`DtxError::Corrupt`] if the slot says otherwise.
    pub fn log_areas(&self, ctx: &Ctx, db: &Db) -> Result<Vec<(GlobalAddr, u64)>> {
        if self.logs[0].is_null() {
            return Ok(Vec::new());
        }
        let max = layout::MAX_THREADS as u64;
        if !(1..=max).contains(&self.threads) || !(1..=max).contains(&self.coroutines) {
            return Err(DtxError::Corrupt(format!(
                "registry slot {}: {} threads × {} coroutines (1 to {max} each)",
                self.slot, self.threads, self.coroutines
            )));
        }
        let bytes = self.threads * self.coroutines * ring_bytes(db);
        let mut out: Vec<(GlobalAddr, u64)> = Vec::new();
        for (j, a) in self.logs.iter().enumerate().take_while(|(_, a)| !a.is_null()) {
            let at = crate::db::stored_addr(ctx.blades(), a.raw(), bytes, || {
                format!("registry slot {}: copy {j} of the log area", self.slot)
            })?;
            if out.iter().any(|(o, _)| o.blade() == at.blade()) {
                return Err(DtxError::Corrupt(format!(
                    "registry slot {}: two copies of the log area on memory blade {}",
                    self.slot,
                    at.blade()
                )));
            }
            out.push((at, bytes));
        }
        Ok(out)
    }
}

/// Reads every registry slot.
///
/// # Errors
/// Verb errors.
pub async fn slots(ctx: &Ctx, db: &Db) -> Result<Vec<SlotInfo>> {
    Ok(slots_and_hosts(ctx, db).await?.into_iter().map(|(s, _)| s).collect())
}

/// Reads every registry slot (one READ), each with the host name its
/// holder recorded (`None` where none was: a free slot, or a build before
/// host names were kept).
///
/// # Errors
/// Verb errors.
pub async fn slots_and_hosts(ctx: &Ctx, db: &Db) -> Result<Vec<(SlotInfo, Option<String>)>> {
    let mut all = vec![0u8; (registry::SLOTS * registry::SLOT) as usize];
    ctx.read_all(db.registry, &mut all).await?;
    Ok((1..registry::SLOTS as u16)
        .map(|i| {
            let b = &all[i as usize * registry::SLOT as usize..][..registry::SLOT as usize];
            let host = &b[HOST..HOST + 16];
            let end = host.iter().position(|&c| c == 0).unwrap_or(16);
            let mut s = SlotInfo::parse(i, b);
            // A registry in a mirror ([`Db::mirror`]) keeps lease lengths,
            // never renewed: whether its holder lives is the coordinator's
            // to say, so it is not taken for dead by its expiry here. A
            // recovery's hold is an expiry, as on blade 0.
            if db.mirror.is_some() && s.claim != 0 && s.claim & registry::RECOVERING == 0 {
                s.expiry_ms = u64::MAX;
            }
            (s, (end > 0).then(|| String::from_utf8_lossy(&host[..end]).into_owned()))
        })
        .collect())
}

/// Offset in a registry slot of its holder's host name (16 bytes).
const HOST: usize = registry::HOST;

/// This compute blade's host name as a registry slot keeps it: its first
/// 16 bytes, zero-padded (`simulated` under a simulation).
fn host_bytes(ctx: &Ctx) -> [u8; 16] {
    let name = if ctx.clock().is_virtual() {
        "simulated".to_string()
    } else {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| h.trim().to_string())
    };
    let mut b = [0u8; 16];
    let n = name.len().min(16);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    b
}

/// Bytes of one coroutine's log ring in a database.
pub fn ring_bytes(db: &Db) -> u64 {
    log::ENTRIES * log::entry_bytes(db.max_value) as u64
}

/// Where coroutine `coroutine` of thread `thread` of a registration of
/// `coroutines` per thread keeps its log ring in each copy `logs` of its log
/// area.
pub(crate) fn rings(
    logs: &[GlobalAddr; MAX_REPLICAS],
    coroutines: u64,
    db: &Db,
    thread: usize,
    coroutine: usize,
) -> [GlobalAddr; MAX_REPLICAS] {
    let i = (thread as u64) * coroutines + coroutine as u64;
    logs.map(|l| if l.is_null() { l } else { l.add(i * ring_bytes(db)) })
}

/// A fresh nonce: non-zero, bit 63 clear.
fn nonce(ctx: &Ctx) -> u64 {
    (ctx.clock().nonce(ctx.thread() as u64) & !registry::RECOVERING).max(1)
}

/// Claims a free registry slot for a compute blade of `threads` ×
/// `coroutines` and allocates its log area; returns the slot and nonce.
pub(crate) async fn claim(
    ctx: &Ctx,
    db: &Db,
    threads: usize,
    coroutines: usize,
    lease: Duration,
) -> Result<(SlotInfo, u64)> {
    if threads > layout::MAX_THREADS || coroutines > layout::MAX_THREADS {
        return Err(DtxError::Config(format!("at most {} threads and coroutines per thread", layout::MAX_THREADS)));
    }
    let me = nonce(ctx);
    for s in slots(ctx, db).await? {
        if s.claim != 0 || ctx.cas(db.registry_slot(s.slot), 0, me).await? != 0 {
            continue;
        }
        // On blade 0, a slot some mirror still records is left: a
        // registration of the epochs when the mirror stood for the registry
        // (blade 0 out, then joining), not settled yet, holds it there.
        if db.mirror.is_none() && crate::mirror::records_slot(ctx, db, s.slot).await? {
            ctx.cas(db.registry_slot(s.slot), me, 0).await?;
            continue;
        }
        let bytes = (threads * coroutines) as u64 * ring_bytes(db);
        let n = ctx.blades().len();
        // On the blades read only (all but those a failover took out,
        // [`Db::without`], and those joining, [`Db::view`]: recovery reads
        // logs only where it reads records), each copy on another.
        let homes: Vec<u16> =
            (0..n).map(|j| ((s.slot as usize + j) % n) as u16).filter(|b| db.reads(*b)).take(db.replicas).collect();
        let copies = homes.len();
        // A slot's earlier log areas are reused when there are as many, on
        // the blades this slot's copies go to, each large enough: recovery
        // left no live entry in them, and entries carry the nonce of their
        // registration, so old ones are ignored. A damaged slot's areas are
        // not reused (new ones are allocated).
        let mut logs = [GlobalAddr::NULL; MAX_REPLICAS];
        let home = |j: usize| homes[j];
        match s.log_areas(ctx, db) {
            Ok(old)
                if old.len() == copies
                    && old.iter().enumerate().all(|(j, (at, b))| *b >= bytes && at.blade() == home(j)) =>
            {
                for (j, (at, _)) in old.into_iter().enumerate() {
                    logs[j] = at;
                }
            }
            _ => {
                for (j, l) in logs.iter_mut().enumerate().take(copies) {
                    *l = ctx.alloc(home(j), bytes, 64).await?;
                }
            }
        }
        // The slot records this registration's shape (the area may be
        // larger; a later registration then sees only this much).
        let info = SlotInfo {
            slot: s.slot,
            claim: me,
            expiry_ms: now_ms(ctx) + lease.as_millis() as u64,
            logs,
            threads: threads as u64,
            coroutines: coroutines as u64,
            pid: u64::from(ctx.clock().pid()),
        };
        // All but the claim, which the CAS above wrote; then the host name
        // (for messages). A registry in a mirror keeps the lease's length.
        let second = if db.mirror.is_some() { lease.as_millis() as u64 } else { info.expiry_ms };
        ctx.write(db.registry_slot(s.slot).add(8), &info.bytes(me, second)[8..]).await?;
        ctx.write(db.registry_slot(s.slot).add(HOST as u64), &host_bytes(ctx)).await?;
        // Before the first lock: a rebuild of blade 0 finds this compute
        // blade's undo log through the mirror.
        crate::mirror::register(ctx, db, &info, lease.as_millis() as u64).await?;
        return Ok((info, me));
    }
    Err(DtxError::RegistryFull(registry::SLOTS - 1))
}

/// This compute blade's registration: its slot, its log area, and the
/// heartbeat thread that renews its lease.
///
/// [`Registration::close`] frees the slot at a clean end. Dropped without
/// it (a failed run), the heartbeat stops and the slot stays claimed: its
/// lease expires and the next recovery repairs whatever the run left.
#[derive(Debug)]
pub struct Registration {
    /// The database.
    pub db: Arc<Db>,
    /// The slot as claimed.
    pub info: SlotInfo,
    /// Worker threads and coroutines the log area serves.
    pub threads: usize,
    /// Coroutines per thread.
    pub coroutines: usize,
    stop: Arc<AtomicBool>,
    /// Set once the lease may have expired (a renewal came late or failed):
    /// from then on this compute blade's transactions refuse to lock or
    /// commit, because recovery may be repairing them (self-fencing).
    lost: Arc<AtomicBool>,
    heartbeat: Option<Heartbeat>,
    /// The address cache's prints, shared by this compute blade's threads.
    pub(crate) prints: Arc<crate::cache::Prints>,
}

/// What renews a registration's lease.
enum Heartbeat {
    /// A thread of this process, renewing the word at `at`, and the
    /// transport's silent blades (if it keeps track).
    Thread {
        thread: JoinHandle<std::result::Result<(), String>>,
        at: GlobalAddr,
        silence: Option<Arc<smart_core::backend::Silence>>,
    },
    /// A simulated thread of the simulation behind `transport`.
    Simulated {
        transport: Arc<dyn Transport>,
        id: u64,
        /// Why it stopped renewing, if it failed.
        failed: Arc<std::sync::Mutex<Option<String>>>,
    },
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Heartbeat::Thread { .. } => f.write_str("Heartbeat::Thread"),
            Heartbeat::Simulated { id, .. } => write!(f, "Heartbeat::Simulated({id})"),
        }
    }
}

/// A simulated heartbeat: renews the lease word at `at` every `every`
/// until `stop`, in virtual time; fails (and the caller fences the compute
/// blade) when a renewal comes after the expiry it extends, or fails.
async fn renew_until_stopped(
    ctx: &Ctx,
    at: GlobalAddr,
    mut expires: u64,
    (lease, every): (Duration, Duration),
    stop: &AtomicBool,
    progress: &AtomicU64,
) -> std::result::Result<(), String> {
    let every_ns = every.as_nanos() as u64;
    // Wakes in steps of at most 5 ms, to notice the stop.
    let step = every_ns.min(5_000_000);
    let mut next = ctx.now_ns();
    while !stop.load(Ordering::Relaxed) {
        if ctx.now_ns() >= next {
            let now = now_ms(ctx);
            if now >= expires {
                // Renewed too late: a recovery may have begun.
                return Err(format!("lease expired {} ms before its renewal", now - expires));
            }
            let new = now + lease.as_millis() as u64;
            renew(ctx, at, new, progress.load(Ordering::Relaxed)).await.map_err(|e| e.to_string())?;
            expires = new;
            next += every_ns;
        }
        ctx.sleep_ns(step.min(next.saturating_sub(ctx.now_ns())).max(1)).await;
    }
    Ok(())
}

/// One renewal: the new expiry at `at` (a slot's expiry word) and the
/// holder's progress in the same slot, in one doorbell.
async fn renew(ctx: &Ctx, at: GlobalAddr, expiry: u64, progress: u64) -> smart_core::Result<()> {
    let (e, p) = (expiry.to_le_bytes(), progress.to_le_bytes());
    let mut b = ctx.batch();
    b.write(at, &e);
    b.write(at.add((registry::PROGRESS - 8) as u64), &p);
    b.post().await?;
    Ok(())
}

/// Heartbeat runtimes are small: two 8-byte WRITEs at a time.
fn small_runtime() -> RuntimeConfig {
    RuntimeConfig { slots: 4, slot_bytes: 4096, coroutines: 1, ..RuntimeConfig::default() }
}

impl Registration {
    /// Claims a registry slot for `threads` × `coroutines` transactions at
    /// once, and starts renewing its `lease` every quarter lease.
    ///
    /// # Errors
    /// A full registry, too many threads or coroutines; verb errors.
    pub fn register(
        transport: Arc<dyn Transport>,
        db: Arc<Db>,
        threads: usize,
        coroutines: usize,
        lease: Duration,
    ) -> Result<Registration> {
        Self::register_halting(transport, db, threads, coroutines, lease, Arc::new(AtomicBool::new(false)))
    }

    /// [`Registration::register`] with `halt` as its lost flag: raised from
    /// outside (a coordinator's membership that lapsed, or a configuration
    /// that moved on), it stops this compute blade's transactions from
    /// locking and committing as a lost lease does.
    ///
    /// # Errors
    /// As [`Registration::register`].
    pub fn register_halting(
        transport: Arc<dyn Transport>,
        db: Arc<Db>,
        threads: usize,
        coroutines: usize,
        lease: Duration,
        halt: Arc<AtomicBool>,
    ) -> Result<Registration> {
        Self::register_publishing(transport, db, (threads, coroutines), lease, halt, Arc::new(AtomicU64::new(0)))
    }

    /// [`Registration::register_halting`] that publishes `progress` (the
    /// transactions this compute blade committed so far: e.g. a timed
    /// run's `published` count, `smart_bench::RunConfig::published`) in its
    /// slot with each renewal ([`registry::PROGRESS`]), where an online
    /// copy reads it to hold the foreground's share
    /// ([`crate::rejoin::foreground`]).
    ///
    /// # Errors
    /// As [`Registration::register`].
    pub fn register_publishing(
        transport: Arc<dyn Transport>,
        db: Arc<Db>,
        (threads, coroutines): (usize, usize),
        lease: Duration,
        halt: Arc<AtomicBool>,
        progress: Arc<AtomicU64>,
    ) -> Result<Registration> {
        let mut rt = Runtime::new(&*transport, 0, small_runtime())?;
        let ctx = rt.ctx();
        let d = db.clone();
        let (info, _) = rt.block_on(async move { claim(&ctx, &d, threads, coroutines, lease).await })?;
        drop(rt);
        let stop = Arc::new(AtomicBool::new(false));
        let lost = halt;
        let at = db.registry_slot(info.slot).add(8);
        let tag = info.claim;
        let expires = info.expiry_ms;
        let every = (lease / 4).max(Duration::from_millis(10));
        // A renewal is given half a lease to complete. It starts at least
        // three quarters of a lease before the expiry it extends, so one
        // that hangs (the path to the registry's blade stalls while this
        // process and the blade live) fences this compute blade a quarter
        // lease before that expiry, not after the run's request time-out
        // (10 s by default, as long as the default lease): until then its
        // transactions would go on locking and committing while recovery,
        // elsewhere, could take them for dead. Tagged: once a recovery
        // revoked this registration, the blades refuse its renewals too.
        let cfg = RuntimeConfig { request_timeout: Some(lease / 2), fence_tag: tag, ..small_runtime() };
        let heartbeat = if db.mirror.is_some() {
            // Registered in a mirror while blade 0 is out: nothing renews
            // there. This compute blade acts under a coordinator's
            // membership, whose lapse raises `halt`, and every failover
            // fences its registration ([`Db::mirror`]).
            None
        } else if let Some(sim) = transport.simulation() {
            // A simulated compute blade renews on a simulated thread of its
            // own, in virtual time.
            let failed = Arc::new(std::sync::Mutex::new(None));
            let (st, lo, fa, pr) = (stop.clone(), lost.clone(), failed.clone(), progress.clone());
            let task: smart_core::backend::BackgroundTask = Box::new(move |ctx: Ctx| {
                Box::pin(async move {
                    if let Err(e) = renew_until_stopped(&ctx, at, expires, (lease, every), &st, &pr).await {
                        lo.store(true, Ordering::SeqCst);
                        *fa.lock().expect("not poisoned") = Some(e);
                    }
                })
            });
            let id = sim.spawn_background(0, cfg, task)?;
            Some(Heartbeat::Simulated { transport: transport.clone(), id, failed })
        } else {
            let silence = transport.silence();
            let (st, lo, mut expires, pr) = (stop.clone(), lost.clone(), expires, progress.clone());
            let thread = std::thread::Builder::new()
                .name(format!("lease-{}", info.slot))
                .spawn(move || {
                    let fence = |e: String| {
                        lo.store(true, Ordering::SeqCst);
                        e
                    };
                    let mut rt = Runtime::new(&*transport, 0, cfg).map_err(|e| fence(e.to_string()))?;
                    let ctx = rt.ctx();
                    // The OS thread sleeps between renewals (a runtime
                    // waiting on a timer would spin).
                    let mut next = std::time::Instant::now();
                    while !st.load(Ordering::Relaxed) {
                        if std::time::Instant::now() >= next {
                            let now = now_ms(&ctx);
                            if now >= expires {
                                // Renewed too late: a recovery may have begun.
                                return Err(fence(format!("lease expired {} ms before its renewal", now - expires)));
                            }
                            let new = now + lease.as_millis() as u64;
                            let (c, done) = (ctx.clone(), pr.load(Ordering::Relaxed));
                            rt.block_on(async move { renew(&c, at, new, done).await })
                                .map_err(|e| fence(e.to_string()))?;
                            expires = new;
                            next += every;
                        }
                        std::thread::sleep(Duration::from_millis(5).min(every));
                    }
                    Ok(())
                })
                .map_err(|e| DtxError::Config(format!("starting the lease thread: {e}")))?;
            Some(Heartbeat::Thread { thread, at, silence })
        };
        let prints = Arc::new(crate::cache::Prints::new(&db));
        Ok(Registration { db, info, threads, coroutines, stop, lost, heartbeat, prints })
    }

    /// The fence tag of this registration (its nonce): the runtimes that
    /// lock or commit for it must name it ([`Registration::runtime_config`]),
    /// so that a recovery that takes this compute blade for dead makes the
    /// memory blades refuse their verbs ([`smart_core::fence`]).
    pub fn fence_tag(&self) -> u64 {
        self.info.claim
    }

    /// Waits, before the first lock, until `recorded` holds this
    /// registration's fence tag (a coordinator recorded it, so that a
    /// failover from then on fences this compute blade, however it stalls),
    /// at most `within`.
    ///
    /// # Errors
    /// [`DtxError::Config`] if its lost flag rose meanwhile (the
    /// configuration moved on before the tag was recorded under its epoch:
    /// no lock under it), or the time ran out.
    pub fn await_recorded(&self, recorded: &std::sync::atomic::AtomicU64, within: Duration) -> Result<()> {
        let until = std::time::Instant::now() + within;
        while recorded.load(Ordering::SeqCst) != self.fence_tag() {
            if self.lease_lost() {
                return Err(DtxError::Config(
                    "the configuration moved on before this compute blade's fence tag was recorded".into(),
                ));
            }
            if std::time::Instant::now() > until {
                return Err(DtxError::Config(format!(
                    "the coordinator did not record this compute blade's fence tag within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// `base` with this registration's [`Registration::fence_tag`]: the
    /// configuration of every runtime whose transactions use it.
    pub fn runtime_config(&self, base: &RuntimeConfig) -> RuntimeConfig {
        RuntimeConfig { fence_tag: self.fence_tag(), ..base.clone() }
    }

    /// Whether the lease may have been lost (see [`DtxError::LeaseLost`]).
    pub fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn lost_flag(&self) -> Arc<AtomicBool> {
        self.lost.clone()
    }

    /// The registry slot (owner id in lock words).
    pub fn slot(&self) -> u16 {
        self.info.slot
    }

    /// The process id it recorded (0 under a simulation).
    pub fn pid(&self) -> u64 {
        self.info.pid
    }

    /// Where coroutine `c` of thread `t` keeps its log ring: one address
    /// per copy of the log ([`GlobalAddr::NULL`] past the last).
    pub fn ring(&self, thread: usize, coroutine: usize) -> [GlobalAddr; MAX_REPLICAS] {
        rings(&self.info.logs, self.info.coroutines, &self.db, thread, coroutine)
    }

    fn stop_heartbeat(&mut self) -> std::result::Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.heartbeat.take() {
            Some(Heartbeat::Thread { thread, at, silence }) => {
                // A renewal in flight to a blade found silent can only time
                // out: the thread is left to it (it ends then), not waited
                // for.
                while !thread.is_finished() {
                    if let Some(Err(e)) = silence.as_ref().map(|s| s.check(at.blade())) {
                        return Err(format!("its renewal waits for a blade that stopped answering: {e}"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                thread.join().unwrap_or_else(|_| Err("the lease thread panicked".into()))
            }
            Some(Heartbeat::Simulated { transport, id, failed }) => {
                if let Some(sim) = transport.simulation() {
                    sim.stop_background(id);
                }
                failed.lock().expect("not poisoned").take().map_or(Ok(()), Err)
            }
            None => Ok(()),
        }
    }

    /// Ends the registration cleanly: stops the heartbeat and frees the
    /// slot. Call it only when no transaction of this compute blade holds
    /// a lock (every worker finished).
    ///
    /// # Errors
    /// A failed heartbeat (the lease may have expired meanwhile); verb
    /// errors.
    pub fn close(mut self, transport: &dyn Transport) -> Result<()> {
        self.stop_heartbeat().map_err(|e| DtxError::Config(format!("lease heartbeat failed: {e}")))?;
        let mut rt = Runtime::new(transport, 0, self.runtime_config(&small_runtime()))?;
        let ctx = rt.ctx();
        let (at, me) = (self.db.registry_slot(self.info.slot), self.info.claim);
        let (db, slot) = (self.db.clone(), self.info.slot);
        let old = rt.block_on(async move {
            let old = ctx.cas(at, me, 0).await?;
            if old == me {
                crate::mirror::unregister(&ctx, &db, slot, me).await?;
            }
            Ok::<_, DtxError>(old)
        })?;
        if old != me {
            return Err(DtxError::Config(format!(
                "registry slot {} was taken over (claim {old:#x}): this compute blade's lease had expired",
                self.info.slot
            )));
        }
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.stop_heartbeat();
    }
}
