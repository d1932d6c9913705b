//! # smart-sim: a simulated RDMA cluster in virtual time
//!
//! Smart's effects live at 32–96 threads per compute blade on a ConnectX-6
//! (Ren et al., ASPLOS '24): threads contend on shared doorbells, too many
//! outstanding work requests thrash the RNIC's caches, contended CAS retries
//! waste the network. A laptop or a CI machine has two cores and no RDMA
//! NIC. This crate is a transport, like the embedded, TCP and verbs ones,
//! whose blades, NICs and network are simulated in **virtual time**: one OS
//! thread runs N compute blades × T threads × C coroutines against M memory
//! blades, each simulated thread running the **real** application code
//! (race-ht, ford-dtx, sherman-bt, micro) on a real runtime, against real
//! memory, byte for byte, with the consistency model of the other backends.
//! Only time is modelled.
//!
//! * **What is modelled** (each a component of [`model`], with the
//!   parameters of a [`Profile`], `profiles/connectx6.toml`): the posting
//!   thread's CPU (per doorbell, per WR, per poll, per completion, and the
//!   application's work per doorbell); the spinlock of a shared doorbell or
//!   QP, with the line transfer between cores and the slowdown of spinners;
//!   the compute RNIC's engines and its WQE cache, whose misses cost a PCIe
//!   round trip; links with bandwidth and per-packet headers, propagation
//!   through a switch; the memory RNIC's engines, its PCIe path to DRAM,
//!   and the lock table that serialises atomics on one address.
//! * **What emerges, never from a formula**: CAS retries, lock waits,
//!   aborts, the tuner's choices, backoff — the application code runs and
//!   meets them.
//! * **Virtual time is the only clock.** Every runtime on a simulated
//!   endpoint reads its thread's virtual time ([`smart_core::clock`]):
//!   timers, backoff, the tuner's epochs, leases, time-outs, latencies.
//! * **Deterministic.** Events run in (time, sequence) order on one OS
//!   thread; the same arguments and seed give the same record, bit for bit,
//!   whatever the host is doing.
//! * **Torn reads, as RC allows them.** A READ or WRITE that spans several
//!   64-byte lines moves them over its DMA transfer time: it executes in
//!   two parts, the lines before a boundary (drawn per WR) at the
//!   transfer's start and the rest at its end, so a READ can see half of
//!   a concurrent WRITE. Aligned 8-byte words are never torn, and atomics
//!   execute at one instant.
//! * **Not modelled**: the PCIe link of the compute blade beyond the WQE
//!   fetches, NUMA, the switch's buffers (the network is lossless, as RoCE
//!   with PFC), the OS (no preemption, interrupts or page faults), and
//!   tears at every line of a WR (one boundary per WR here; the chaos
//!   backend tears at any line).
//!
//! Threads interleave at every post in virtual-time order; a post computes
//! its WRs' whole path through the components at once, so requests posted
//! within one thread's step reserve the downstream components in posting
//! order (an approximation bounded by one step, well under a round trip).
//!
//! ```
//! use std::time::Duration;
//! use smart_bench::harness::{run, RunConfig};
//! use smart_core::{GlobalAddr, Transport};
//! use smart_sim::{SimConfig, SimTransport};
//!
//! // 16 simulated threads on one compute blade, one memory blade.
//! let sim = SimTransport::new(SimConfig { threads_per_blade: 16, ..SimConfig::default() }).unwrap();
//! let cfg = RunConfig {
//!     threads: 16,
//!     coroutines: 8,
//!     warmup: Duration::from_micros(100),
//!     duration: Duration::from_micros(500),
//!     ..RunConfig::default()
//! };
//! let at = GlobalAddr::new(0, 1 << 20);
//! let report = run(&sim, &cfg, move |w| async move {
//!     while w.running() {
//!         let t0 = w.now();
//!         w.ctx().read_u64(at).await?;
//!         w.record(t0, 1);
//!     }
//!     Ok(())
//! })
//! .unwrap();
//! assert!(report.ops > 1000, "0.5 ms of virtual time at 16 threads");
//! assert!((report.duration_s - 0.0005).abs() < 1e-9, "virtual seconds");
//! ```

#![warn(missing_docs)]

mod driver;
mod endpoint;
pub mod fault;
pub mod model;
pub mod profile;
mod queue;
mod world;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use smart_core::backend::{
    BackgroundTask, BladeInfo, Endpoint, LocalMem, SimSummary, Simulation, ThreadSpec, Transport,
};
use smart_core::region::Region;
use smart_core::smart::QpPlan;
use smart_core::{Error, Result, Runtime};

pub use fault::{Fault, FaultKind};
pub use profile::Profile;
pub use world::SimCounters;

use endpoint::{lock, SimEndpoint};
use world::World;

/// The shape of a simulated cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The hardware.
    pub profile: Profile,
    /// Memory blades.
    pub memory_blades: usize,
    /// Bytes of each memory blade.
    pub blade_bytes: u64,
    /// Compute blades: thread `t` of a run is on compute blade
    /// `t / threads_per_blade`, each blade with its own RNIC, doorbells
    /// and links.
    pub compute_blades: usize,
    /// Threads per compute blade.
    pub threads_per_blade: usize,
    /// Seed of the blades' keys (the simulation draws nothing else).
    pub seed: u64,
    /// Keep each memory blade in `DIR/blade-I.img` (created, or served
    /// as it is), so that a later run finds what an earlier one left.
    pub blade_dir: Option<PathBuf>,
    /// Application work per doorbell on top of the profile's `cpu.op_ns`.
    pub app_ns: u64,
    /// Faults injected into the timed run (see [`fault`]).
    pub faults: Vec<Fault>,
    /// One more fault, drawn from this seed ([`Fault::draw`]) over the
    /// first `fault_span_ns` of the timed run.
    pub fault_seed: Option<u64>,
    /// Whether the run's data survives a memory blade lost (it keeps
    /// replicas on other blades): only then is one drawn from
    /// `fault_seed`.
    pub survives_loss: bool,
    /// See `fault_seed`.
    pub fault_span_ns: u64,
    /// Virtual time that passes before this run starts, after the last run
    /// on the same `blade_dir` (as between two commands: e.g. for a lease
    /// to run out).
    pub advance_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            profile: Profile::connectx6(),
            memory_blades: 1,
            blade_bytes: 256 << 20,
            compute_blades: 1,
            threads_per_blade: 1,
            seed: 0,
            blade_dir: None,
            app_ns: 0,
            faults: Vec::new(),
            fault_seed: None,
            survives_loss: false,
            fault_span_ns: 0,
            advance_ns: 0,
        }
    }
}

/// In a `--sim-blade-dir` (`SimConfig::blade_dir`): memory blade `b`'s
/// image.
pub fn blade_image(dir: &std::path::Path, b: usize) -> PathBuf {
    dir.join(format!("blade-{b}.img"))
}

/// In a `--sim-blade-dir`: the virtual time the last run ended at (ns).
const CLOCK_FILE: &str = "clock";

/// A simulated cluster, as a transport (see the crate docs).
#[derive(Debug)]
pub struct SimTransport {
    world: Arc<Mutex<World>>,
    infos: Vec<BladeInfo>,
    cfg: SimConfig,
    built: std::time::Instant,
    next_background: std::sync::atomic::AtomicU64,
    /// Faults still to inject, by instant, and when the timed run started.
    pub(crate) faults: Mutex<(Vec<Fault>, Option<u64>)>,
    /// The virtual instant of the next fault (`u64::MAX`: none due), read
    /// at every step of the simulation without taking the lock.
    pub(crate) next_fault: std::sync::atomic::AtomicU64,
}

impl SimTransport {
    /// Builds the cluster: formats (or checks) its memory blades.
    ///
    /// # Errors
    /// Bad shapes (no blade, a blade too small), a blade file that cannot
    /// be made or served.
    pub fn new(cfg: SimConfig) -> Result<SimTransport> {
        if cfg.memory_blades == 0 || cfg.memory_blades > smart_core::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!(
                "{} simulated memory blades: need 1 to {}",
                cfg.memory_blades,
                smart_core::addr::MAX_BLADES
            )));
        }
        if cfg.compute_blades == 0 || cfg.threads_per_blade == 0 {
            return Err(Error::Unsupported("a simulated cluster needs compute blades with threads".into()));
        }
        cfg.profile.check().map_err(Error::Unsupported)?;
        // Virtual time goes on from where the last run on these blades left
        // it, as a wall clock would: leases recorded on them then mean what
        // they meant.
        let clock = cfg.blade_dir.as_ref().and_then(|dir| {
            let b = std::fs::read(dir.join(CLOCK_FILE)).ok()?;
            Some(u64::from_le_bytes(<[u8; 8]>::try_from(b.as_slice()).ok()?))
        });
        let mut regions = Vec::with_capacity(cfg.memory_blades);
        for b in 0..cfg.memory_blades {
            let r = match &cfg.blade_dir {
                None => Region::anonymous_lazy(cfg.blade_bytes),
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| Error::Io { peer: dir.display().to_string(), cause: e })?;
                    let path = blade_image(dir, b);
                    let size = if path.exists() { None } else { Some(cfg.blade_bytes) };
                    Region::file_backed(&path, size)
                }
            }
            .map_err(|e| Error::Io { peer: format!("{b} (simulated)"), cause: e })?;
            let formatted =
                smart_core::layout::format_or_check(&r).map_err(|cause| Error::Layout { blade: b as u16, cause })?;
            if formatted {
                // A blade identity from the seed instead of a random one, so
                // that a run leaves the same bytes every time (top 48 bits
                // not all zero, as the layout requires); and from the
                // virtual time, so that a blade made in the place of a lost
                // one is not taken for it.
                let id = smart_core::hash::mix64(
                    cfg.seed ^ 0x1d3a_5f7b ^ ((b as u64) << 48) ^ clock.map_or(0, smart_core::hash::mix64),
                ) | (1 << 63);
                r.store_u64(smart_core::layout::OFF_IDENTITY, id).expect("the superblock is in bounds");
            }
            regions.push(Arc::new(r));
        }
        let rkeys: Vec<u32> =
            (0..cfg.memory_blades).map(|b| smart_core::hash::mix64(cfg.seed ^ (b as u64 + 1)) as u32 | 1).collect();
        let infos = regions.iter().zip(&rkeys).map(|(r, &rkey)| BladeInfo { size: r.len(), rkey }).collect();
        let mut world = World::new(cfg.profile.clone(), regions, rkeys, cfg.compute_blades, cfg.threads_per_blade);
        world.app_ns = cfg.app_ns;
        world.now = clock.unwrap_or(0) + cfg.advance_ns;
        let mut faults = cfg.faults.clone();
        if let Some(seed) = cfg.fault_seed {
            let threads = cfg.compute_blades * cfg.threads_per_blade;
            let f = Fault::draw(seed, cfg.fault_span_ns, threads, cfg.memory_blades, cfg.survives_loss);
            eprintln!("smart-sim: fault drawn from seed {seed}: --sim-fault {f}");
            faults.push(f);
        }
        // Taken from the end: the earliest first, and of one instant, a
        // kill last (a memory blade lost with the compute blade is lost).
        faults.sort_by_key(|f| std::cmp::Reverse((f.at_ns, f.kind == fault::FaultKind::Kill)));
        Ok(SimTransport {
            world: Arc::new(Mutex::new(world)),
            infos,
            cfg,
            built: std::time::Instant::now(),
            next_background: std::sync::atomic::AtomicU64::new(1),
            faults: Mutex::new((faults, None)),
            next_fault: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// The cluster's shape.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// What the simulation counted so far.
    pub fn counters(&self) -> SimCounters {
        lock(&self.world).counters
    }

    /// Flushes file-backed blades, and records the virtual time reached
    /// beside them (also done when the transport is dropped).
    ///
    /// # Errors
    /// A failed write-back.
    pub fn flush(&self) -> Result<()> {
        let w = lock(&self.world);
        for (b, r) in w.regions.iter().enumerate() {
            r.flush().map_err(|e| Error::Io { peer: format!("{b} (simulated)"), cause: e })?;
        }
        drop(w);
        self.save_clock_to_dir()
    }

    /// Records the virtual time reached beside file-backed blades (a run
    /// killed afterwards leaves it there for the next).
    fn save_clock_to_dir(&self) -> Result<()> {
        let now = lock(&self.world).now;
        self.write_clock(now)
    }

    fn write_clock(&self, now: u64) -> Result<()> {
        if let Some(dir) = &self.cfg.blade_dir {
            std::fs::write(dir.join(CLOCK_FILE), now.to_le_bytes())
                .map_err(|e| Error::Io { peer: dir.display().to_string(), cause: e })?;
        }
        Ok(())
    }

    /// Empties memory blade `blade`'s image in the blade directory (a lost
    /// blade's memory is gone): truncated to nothing and extended again,
    /// so the next command finds an unformatted blade of the same size in
    /// its place, and formats it with a new identity. The mapping this
    /// process holds reads zeros from then on (no WR reaches the blade).
    pub(crate) fn empty_blade_image(&self, blade: u16) {
        let Some(dir) = &self.cfg.blade_dir else { return };
        let path = blade_image(dir, usize::from(blade));
        let emptied = std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| {
            let len = f.metadata()?.len();
            f.set_len(0)?;
            f.set_len(len)
        });
        if let Err(e) = emptied {
            eprintln!("smart-sim: emptying the image of lost memory blade {blade} ({}): {e}", path.display());
        }
    }

    pub(crate) fn save_clock_at(&self, now: u64) {
        if let Err(e) = self.write_clock(now) {
            eprintln!("smart-sim: {e}");
        }
    }

    pub(crate) fn save_clock(&self) {
        if let Err(e) = self.save_clock_to_dir() {
            eprintln!("smart-sim: {e}");
        }
    }
}

impl Drop for SimTransport {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            eprintln!("smart-sim: {e}");
        }
    }
}

impl Transport for SimTransport {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn blades(&self) -> &[BladeInfo] {
        &self.infos
    }

    fn open_thread(&self, thread: usize, spec: ThreadSpec) -> Result<Box<dyn Endpoint>> {
        let local = LocalMem::new(spec.local_bytes)?;
        let mut w = lock(&self.world);
        let id = w.open(thread, local.clone(), spec.fence_tag);
        let clock = w.eps[id as usize].clock.clone();
        Ok(Box::new(SimEndpoint { world: self.world.clone(), id, local, clock, blades: self.infos.len() }))
    }

    fn configure(&self, plan: QpPlan) -> Result<()> {
        if plan.shared_cq {
            return Err(Error::Unsupported("the simulator models a CQ per thread only (--cq per-thread)".into()));
        }
        lock(&self.world).configure(plan);
        Ok(())
    }

    fn simulation(&self) -> Option<&dyn Simulation> {
        Some(self)
    }
}

impl Simulation for SimTransport {
    fn drive(&self, runtimes: &mut [Runtime], control: &mut dyn FnMut(u64) -> u64) -> Result<()> {
        self.drive_runtimes(runtimes, control)
    }

    fn now_ns(&self) -> u64 {
        lock(&self.world).now
    }

    fn summary(&self) -> SimSummary {
        let w = lock(&self.world);
        let wall_s = self.built.elapsed().as_secs_f64();
        SimSummary {
            profile: self.cfg.profile.name.clone(),
            compute_blades: self.cfg.compute_blades,
            threads_per_compute_blade: self.cfg.threads_per_blade,
            memory_blades: self.cfg.memory_blades,
            virtual_s: w.now as f64 / 1e9,
            wall_s,
            events: w.counters.events,
            verbs: w.counters.verbs,
            verbs_per_wall_s: w.counters.verbs as f64 / wall_s.max(1e-9),
        }
    }

    fn spawn_background(&self, thread: usize, cfg: smart_core::RuntimeConfig, task: BackgroundTask) -> Result<u64> {
        self.spawn_bg(thread, cfg, task)
    }

    fn stop_background(&self, id: u64) {
        self.stop_bg(id);
    }

    fn timed_run_started(&self, now_ns: u64) {
        let mut f = self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.1.is_none() && !f.0.is_empty() {
            f.1 = Some(now_ns);
            let next = f.0.last().map_or(u64::MAX, |x| now_ns + x.at_ns);
            self.next_fault.store(next, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
