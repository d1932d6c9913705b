//! What to do: the flags of [`crate::cli`] resolved into typed, validated
//! configurations. Every check of the command line happens here, once, with
//! messages that name the flag; the libraries below never see a flag.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use smart_bench::harness::{RunConfig, StartGate};
use smart_bench::micro::MicroConfig;
use smart_core::runtime::{MAX_BATCH, MAX_TASKS};
use smart_core::smart::{BackoffConfig, ConflictParts, DoorbellConfig, SmartConfig, TunerConfig};
use smart_core::{EmbeddedTransport, Opcode, Runtime, RuntimeConfig, TcpTransport, Transport};
use ycsb::bench::YcsbConfig;

use crate::cli::{
    AppArg, Cmd, Common, ComputeCli, CqArg, DtxFlags, LinkFlags, MicroArgs, OpArg, RecordArg, RecoverArgs, TableAction,
    TableArgs, TransportArg, YcsbArgs,
};

/// How to reach the blades' memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// The software RNIC over TCP.
    Tcp,
    /// RDMA verbs on a device.
    Verbs {
        /// The device (default: the first with an active port).
        device: Option<String>,
        /// The GID index (RoCE).
        gid_index: Option<u32>,
    },
    /// A simulated cluster (compute-blade only).
    Sim,
}

impl Link {
    /// Resolves `--transport`, `--device`, `--gid-index`.
    ///
    /// # Errors
    /// Device flags without verbs.
    pub fn resolve(f: &LinkFlags) -> Result<Link> {
        match f.transport {
            TransportArg::Tcp | TransportArg::Sim if f.device.is_some() || f.gid_index.is_some() => {
                bail!("--device and --gid-index apply to --transport verbs only")
            }
            TransportArg::Tcp => Ok(Link::Tcp),
            TransportArg::Sim => Ok(Link::Sim),
            TransportArg::Verbs => Ok(Link::Verbs { device: f.device.clone(), gid_index: f.gid_index }),
        }
    }
}

/// Where the memory blades are.
#[derive(Clone, Debug, PartialEq)]
pub enum Blades {
    /// In this process.
    Embedded {
        /// How many.
        count: usize,
        /// Bytes each.
        size: u64,
    },
    /// A simulated cluster in virtual time.
    Simulated(Box<smart_sim::SimConfig>),
    /// `memory-blade` processes.
    Remote {
        /// Their HOST:PORT addresses.
        addrs: Vec<String>,
        /// How to reach them.
        link: Link,
        /// The file of the cluster secret to prove to them, if any.
        secret_file: Option<PathBuf>,
    },
}

impl Blades {
    /// Connects (or creates the embedded blades).
    ///
    /// # Errors
    /// Unreachable blades, a missing RDMA device, a failed mapping.
    pub fn connect(&self) -> Result<Arc<dyn Transport>> {
        Ok(match self {
            Blades::Embedded { count, size } => {
                Arc::new(EmbeddedTransport::new(*count, *size).context("creating the embedded blades")?)
            }
            Blades::Simulated(cfg) => {
                Arc::new(smart_sim::SimTransport::new((**cfg).clone()).context("building the simulated cluster")?)
            }
            Blades::Remote { addrs, link: Link::Tcp, secret_file } => {
                let secret = load_secret(secret_file.as_deref())?;
                Arc::new(TcpTransport::connect_with(addrs, secret).context("connecting to the memory blades")?)
            }
            Blades::Remote { link: Link::Sim, .. } => bail!("--transport sim simulates its own blades: no --blades"),
            Blades::Remote { addrs, link: Link::Verbs { device, gid_index }, secret_file } => {
                verbs_transport(addrs, device.clone(), *gid_index, load_secret(secret_file.as_deref())?)?
            }
        })
    }
}

impl Blades {
    /// These blades at `addrs` (a configuration's addresses: a blade
    /// rebuilt in a removed one's place may listen elsewhere).
    #[must_use]
    pub fn at(&self, addrs: &[String]) -> Blades {
        match self {
            Blades::Remote { link, secret_file, .. } => {
                Blades::Remote { addrs: addrs.to_vec(), link: link.clone(), secret_file: secret_file.clone() }
            }
            other => other.clone(),
        }
    }

    /// [`Blades::connect`] without the memory blades `absent` (a failover
    /// took them out of the configuration): each keeps its place, with its
    /// size from `like` (the transport that had it; without one, see
    /// [`TcpTransport::connect_without`]), and a verb to it fails at once.
    /// Over TCP only.
    ///
    /// # Errors
    /// Another link; as [`Blades::connect`].
    pub fn connect_without(
        &self,
        absent: &[u16],
        like: Option<&[smart_core::BladeInfo]>,
    ) -> Result<Arc<dyn Transport>> {
        let Blades::Remote { addrs, link: Link::Tcp, secret_file } = self else {
            bail!("going on without a memory blade is built over TCP only (not over RDMA verbs yet)")
        };
        let secret = load_secret(secret_file.as_deref())?;
        let gone: Vec<_> = absent
            .iter()
            .map(|b| {
                let info = like.map(|l| l[usize::from(*b)]);
                (*b, info, "taken out of the configuration by a failover".to_string())
            })
            .collect();
        Ok(Arc::new(TcpTransport::connect_without(addrs, secret, &gone).context("connecting to the memory blades")?))
    }
}

/// The secret in the file at `path` (`--secret-file`), if one is named.
///
/// # Errors
/// The file cannot be read, is readable by others, or holds no secret.
pub fn load_secret(path: Option<&std::path::Path>) -> Result<Option<smart_core::secret::Secret>> {
    path.map(|p| smart_core::secret::Secret::load(p).map_err(anyhow::Error::msg)).transpose()
}

#[cfg(feature = "verbs")]
fn verbs_transport(
    addrs: &[String],
    device: Option<String>,
    gid_index: Option<u32>,
    secret: Option<smart_core::secret::Secret>,
) -> Result<Arc<dyn Transport>> {
    use smart_core::backend::verbs::{VerbsConfig, VerbsTransport};
    let cfg = VerbsConfig { device, gid_index };
    Ok(Arc::new(VerbsTransport::connect_with(addrs, &cfg, secret).context("connecting over RDMA verbs")?))
}

#[cfg(not(feature = "verbs"))]
fn verbs_transport(
    _: &[String],
    _: Option<String>,
    _: Option<u32>,
    _: Option<smart_core::secret::Secret>,
) -> Result<Arc<dyn Transport>> {
    bail!("{}", smart_core::backend::verbs::NOT_BUILT)
}

/// What every subcommand resolves to.
#[derive(Clone, Debug)]
pub struct Session {
    /// The memory blades.
    pub blades: Blades,
    /// Threads, coroutines, times, runtime and Smart techniques.
    pub run: RunConfig,
    /// Where to write the result record.
    pub json: Option<PathBuf>,
    /// The coordinator's URL (`--coordinator`), checked.
    pub coordinator: Option<String>,
}

/// The ycsb subcommand, resolved.
#[derive(Clone, Debug)]
pub struct YcsbJob {
    /// The index.
    pub app: App,
    /// The workload.
    pub y: YcsbConfig,
    /// "uniform" or "zipf-THETA", for the record.
    pub distribution: String,
}

/// The indexes YCSB can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// The RACE hash table (`race-ht`).
    Race,
    /// The Sherman B+tree (`sherman-bt`).
    Sherman,
}

/// A subcommand, resolved.
#[derive(Clone, Debug)]
pub enum Job {
    /// `micro`.
    Micro(MicroConfig),
    /// `ycsb`.
    Ycsb(YcsbJob),
    /// `smallbank` or `tatp`.
    Dtx(DtxJob),
    /// `recover`.
    Recover(RecoverJob),
    /// `rebuild`.
    Rebuild(RebuildJob),
    /// `table`.
    Table(TableJob),
}

/// `table`, resolved.
#[derive(Clone, Debug)]
pub struct TableJob {
    /// What to do.
    pub action: TableAction,
    /// The index (`drop`, `check`).
    pub name: String,
    /// Its kind (`None`: the kind of the index of that name found on the
    /// blades).
    pub app: Option<App>,
}

/// A transaction workload.
#[derive(Clone, Debug)]
pub enum DtxWorkload {
    /// SmallBank.
    SmallBank(smallbank_tatp::SmallBank),
    /// TATP.
    Tatp(smallbank_tatp::Tatp),
}

/// `smallbank` or `tatp`, resolved.
#[derive(Clone, Debug)]
pub struct DtxJob {
    /// The workload.
    pub workload: DtxWorkload,
    /// Database, replicas, retries, lease.
    pub cfg: smallbank_tatp::DtxConfig,
    /// Audit after the run.
    pub audit: bool,
    /// Only audit.
    pub audit_only: bool,
    /// How long an audit waits for other running compute blades.
    pub audit_wait: Duration,
}

/// `recover`, resolved.
#[derive(Clone, Debug)]
pub struct RecoverJob {
    /// Databases to look at.
    pub dbs: Vec<String>,
    /// A slot to recover whatever its lease.
    pub slot: Option<u16>,
    /// Then repair damaged records from their replicas.
    pub repair: bool,
    /// First wait for the leases that run (`--wait`).
    pub wait: bool,
}

/// `rebuild`, resolved.
#[derive(Clone, Debug)]
pub struct RebuildJob {
    /// The lost blades' places (sorted, without repeats).
    pub lost: Vec<u16>,
    /// Databases to rebuild (empty: every FORD database on the blades).
    pub dbs: Vec<String>,
    /// While compute blades run (`--online`): the copy's pace, bytes per
    /// second, the copier's lease, and the foreground's share to hold.
    pub online: Option<(f64, std::time::Duration, Option<f64>)>,
}

/// A whole `compute-blade` command line, resolved.
#[derive(Clone, Debug)]
pub struct Config {
    /// The common part.
    pub session: Session,
    /// The subcommand.
    pub job: Job,
}

impl Config {
    /// Resolves and validates every flag.
    ///
    /// # Errors
    /// The first bad flag, named.
    pub fn from_cli(cli: &ComputeCli) -> Result<Config> {
        match &cli.cmd {
            Cmd::Micro(a) => {
                let session = Session::resolve(&a.common)?;
                let job = Job::Micro(micro(a, &session.run)?);
                Ok(Config { session, job })
            }
            Cmd::Ycsb(a) => {
                let job = ycsb(a)?;
                let mut session = Session::resolve(&a.common)?;
                let app = job.app;
                session.sim_app(&a.common, |c| if app == App::Race { c.race_ns } else { c.sherman_ns });
                Ok(Config { session, job: Job::Ycsb(job) })
            }
            Cmd::Smallbank(a) => {
                check_rows("--accounts", a.accounts)?;
                if a.hot == 0 || a.hot > a.accounts {
                    // Named with both values: --hot has a default (4 000) that
                    // a small --accounts alone falls under.
                    bail!("--hot must be 1 to --accounts ({}), not {}", a.accounts, a.hot);
                }
                let w = DtxWorkload::SmallBank(smallbank_tatp::SmallBank {
                    accounts: a.accounts,
                    hot: a.hot,
                    ledger: a.dtx.audit || a.dtx.audit_only,
                    mix: mix(a.mix.as_deref(), &smallbank_tatp::smallbank::TYPES, smallbank_tatp::smallbank::MIX)?,
                });
                dtx_config(&a.common, &a.dtx, &a.db, w)
            }
            Cmd::Tatp(a) => {
                check_rows("--subscribers", a.subscribers)?;
                let mix = mix(a.mix.as_deref(), &smallbank_tatp::tatp::TYPES, smallbank_tatp::tatp::MIX)?;
                dtx_config(
                    &a.common,
                    &a.dtx,
                    &a.db,
                    DtxWorkload::Tatp(smallbank_tatp::Tatp { subscribers: a.subscribers, mix }),
                )
            }
            Cmd::Recover(a) => recover_config(a),
            Cmd::Rebuild(a) => {
                let session = Session::resolve(&a.common.common())?;
                if a.db.iter().any(String::is_empty) {
                    bail!("--db has an empty name");
                }
                // A simulated cluster kept in a directory loses a blade to
                // `--sim-fault blade-lost@MS:B`, and finds a fresh one there.
                let (count, places) = match &session.blades {
                    Blades::Remote { addrs, .. } => (addrs.len(), "in --blades of the lost blades, where fresh ones now listen"),
                    Blades::Simulated(cfg) if cfg.blade_dir.is_some() => {
                        (cfg.memory_blades, "of the lost simulated blades (fresh ones are in their place)")
                    }
                    Blades::Simulated(_) => bail!(
                        "rebuild on the simulator needs --sim-blade-dir: the directory of the cluster that lost a blade"
                    ),
                    Blades::Embedded { .. } => {
                        bail!("rebuild needs --blades: embedded blades live and die with their process")
                    }
                };
                let mut lost = a.lost.clone();
                lost.sort_unstable();
                lost.dedup();
                if let Some(i) = lost.iter().find(|i| count < 2 || usize::from(**i) >= count) {
                    bail!(
                        "--lost {i}: give the places (0 to {}) {places} (a set of at least 2 blades: with one, \
                         nothing else keeps a copy)",
                        count.saturating_sub(1)
                    );
                }
                if lost.len() >= count {
                    bail!("--lost names every blade of the list: nothing is left to rebuild them from");
                }
                if lost[0] == 0 && !a.db.is_empty() {
                    bail!("--db does not apply to --lost 0: blade 0 held every database's catalog, and all come back");
                }
                let online = if a.online {
                    if session.coordinator.is_none() {
                        bail!("--online needs --coordinator: the compute blades learn from it that a blade joins");
                    }
                    if lost.len() > 1 {
                        bail!(
                            "--online rebuilds one memory blade at a time (each joins under an epoch of its own); \
                             --lost {}",
                            ford_dtx::rebuild::blade_list(&lost)
                        );
                    }
                    if !(a.copy_rate > 0.0 && a.copy_rate <= 1e6) {
                        bail!("--copy-rate must be positive, at most 1000000 MB/s");
                    }
                    if !(a.lease >= 2.0 && a.lease <= MAX_SECONDS) {
                        bail!("--lease must be 2 to {MAX_SECONDS} seconds (an etcd lease is at least 2 s)");
                    }
                    if let Some(f) = a.foreground_share.filter(|f| !(*f > 0.0 && *f < 1.0)) {
                        bail!("--foreground-share must be between 0 and 1 (a share of the throughput before the copy), not {f}");
                    }
                    Some((a.copy_rate * 1e6, std::time::Duration::from_secs_f64(a.lease), a.foreground_share))
                } else {
                    if a.foreground_share.is_some() {
                        bail!("--foreground-share applies to --online (an offline rebuild runs alone)");
                    }
                    None
                };
                Ok(Config { session, job: Job::Rebuild(RebuildJob { lost, dbs: a.db.clone(), online }) })
            }
            Cmd::Table(a) => table_config(a),
            Cmd::Merge(_) => bail!("merge reads records and needs no blades (run it as a command of its own)"),
            Cmd::VerbsInfo(_) => {
                bail!("verbs-info looks at this host and needs no blades (run it as a command of its own)")
            }
            Cmd::Secret(_) => bail!("secret writes a file and needs no blades (run it as a command of its own)"),
            Cmd::Coordinator(_) => {
                bail!("coordinator talks to etcd and needs no --blades (run it as a command of its own)")
            }
        }
        .and_then(|c: Config| {
            if c.session.coordinator.is_some() && !matches!(c.job, Job::Dtx(_) | Job::Rebuild(_)) {
                bail!(
                    "--coordinator applies to smallbank, tatp and rebuild (the replicated FORD databases; race-ht and \
                     sherman-bt are not replicated)"
                );
            }
            Ok(c)
        })
    }
}

/// Most worker threads (each opens a QP, a connection, per blade).
pub const MAX_THREADS: usize = 1024;
/// Most emulated doorbells of either kind.
pub const MAX_DOORBELLS: usize = 1024;
/// Longest `--duration` or `--warmup`, in seconds.
pub const MAX_SECONDS: f64 = 1e6;

fn parse_doorbells(s: &str) -> Result<DoorbellConfig> {
    let bad = || {
        anyhow::anyhow!("--doorbells {s:?}: use LOW:MEDIUM, e.g. 4:12, with 0 ≤ LOW ≤ {MAX_DOORBELLS} and 1 ≤ MEDIUM ≤ {MAX_DOORBELLS}")
    };
    let (l, m) = s.split_once(':').ok_or_else(bad)?;
    let (low_latency, medium): (usize, usize) =
        (l.trim().parse().map_err(|_| bad())?, m.trim().parse().map_err(|_| bad())?);
    if medium == 0 || medium > MAX_DOORBELLS || low_latency > MAX_DOORBELLS {
        return Err(bad());
    }
    Ok(DoorbellConfig { low_latency, medium })
}

/// The simulated blades' default size (4 GiB, taken only as touched).
const SIM_BLADE_BYTES: u64 = 4 << 30;

/// Refuses a blade of `size` bytes (given by `flag`) too small for its
/// superblock and a heap.
///
/// # Errors
/// Naming the flag and the least size.
pub fn check_blade_size(flag: &str, size: u64) -> Result<()> {
    if size <= smart_core::layout::HEAP_START {
        bail!(
            "{flag} {size} is too small: a memory blade needs more than {} bytes (its superblock, then the heap)",
            smart_core::layout::HEAP_START
        );
    }
    Ok(())
}

/// A count of rows or keys (`flag`): 1 to 2^40.
fn check_rows(flag: &str, n: u64) -> Result<()> {
    if n == 0 || n > 1 << 40 {
        bail!("{flag} must be 1 to 2^40, not {n}");
    }
    Ok(())
}

/// `--blades`: every address non-empty, none twice.
fn check_blades(addrs: &[String]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for a in addrs {
        let a = a.trim();
        if a.is_empty() {
            bail!("--blades has an empty address (a trailing or doubled comma?): give HOST:PORT[,HOST:PORT...]");
        }
        match a.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {}
            _ => bail!(
                "--blades {a}: expected HOST:PORT, a memory blade's address and port as `memory-blade --listen` \
                 printed it (e.g. 127.0.0.1:7000 or blade1:7000); several are separated by commas"
            ),
        }
        if !seen.insert(a) {
            bail!("--blades names {a} twice: each memory blade once");
        }
    }
    Ok(())
}

/// `--json`: checked writable before the run, not after it.
fn check_json(p: &std::path::Path) -> Result<()> {
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .with_context(|| format!("--json {}: cannot write the record there", p.display()))?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

impl Session {
    /// On the simulated transport, charges the application's own work per
    /// doorbell from the profile (`pick`), unless --sim-app-ns says.
    fn sim_app(&mut self, c: &Common, pick: impl Fn(&smart_sim::profile::App) -> u64) {
        if let Blades::Simulated(cfg) = &mut self.blades {
            if c.sim_run.sim_app_ns.is_none() {
                cfg.app_ns = pick(&cfg.profile.app);
            }
        }
    }

    /// Resolves the options every subcommand takes.
    ///
    /// # Errors
    /// The first bad flag, named.
    pub fn resolve(c: &Common) -> Result<Session> {
        let mut smart = SmartConfig::parse(&c.smart).map_err(|e| anyhow::anyhow!("--smart: {e}"))?;
        let parts: ConflictParts =
            c.conflict_avoid_parts.parse().map_err(|e| anyhow::anyhow!("--conflict-avoid-parts: {e}"))?;
        match (smart.conflict_avoid.as_mut(), c.conflict_avoid_controller.as_str()) {
            (_, "guarded") => {}
            (Some(bc), "paper") => *bc = BackoffConfig::paper(),
            (None, "paper") => bail!("--conflict-avoid-controller paper needs conflict-avoid in --smart"),
            (_, other) => bail!("--conflict-avoid-controller {other:?}: expected guarded or paper"),
        }
        match smart.conflict_avoid.as_mut() {
            Some(bc) => *bc = bc.with_parts(parts),
            None if parts != ConflictParts::All => {
                bail!("--conflict-avoid-parts {} needs conflict-avoid in --smart", parts.name())
            }
            None => {}
        }
        match smart.work_req_throt.as_mut() {
            Some(tc) => {
                match c.throttle_limit.as_str() {
                    "auto" => {}
                    "paper" => *tc = TunerConfig::paper(),
                    n => match n.parse::<u32>() {
                        Ok(l) if l > 0 => *tc = TunerConfig::fixed(l),
                        _ => bail!("--throttle-limit {n:?}: expected auto, paper or a number of WRs (at least 1)"),
                    },
                }
                if let Some(ms) = c.throttle_delta {
                    if !(ms > 0.0 && ms <= 1e6) {
                        bail!("--throttle-delta {ms}: expected milliseconds, more than 0");
                    }
                    tc.delta_ns = (ms * 1e6) as u64;
                }
            }
            None if c.throttle_limit != "auto" || c.throttle_delta.is_some() => {
                bail!("--throttle-limit and --throttle-delta need work-req-throt in --smart")
            }
            None => {}
        }
        smart.doorbells = parse_doorbells(&c.doorbells)?;
        smart.shared_cq = c.cq == CqArg::Shared;
        if let Some(p) = &c.qp_policy {
            smart.qp_policy = p.parse().map_err(|e| anyhow::anyhow!("--qp-policy: {e}"))?;
        }
        let link = Link::resolve(&c.target.link)?;
        if c.threads == 0 || c.coroutines == 0 {
            bail!("--threads and --coroutines must be at least 1");
        }
        if c.threads > MAX_THREADS {
            bail!("--threads must be at most {MAX_THREADS}");
        }
        if c.coroutines > MAX_TASKS {
            bail!("--coroutines must be at most {MAX_TASKS} per thread");
        }
        if !(c.duration > 0.0 && c.duration <= MAX_SECONDS && (0.0..=MAX_SECONDS).contains(&c.warmup)) {
            bail!("--duration must be positive and --warmup non-negative, both at most {MAX_SECONDS} seconds");
        }
        let seed = c.target.seed.unwrap_or_else(rand::random);
        let sim_flags_given = c.sim_run.sim_compute_blades != 1
            || c.target.sim.sim_memory_blades.is_some()
            || c.target.sim.sim_blade_dir.is_some()
            || c.sim_run.sim_app_ns.is_some()
            || c.target.sim.sim_profile != "connectx6"
            || !c.sim_run.sim_fault.is_empty()
            || c.sim_run.sim_fault_seed.is_some()
            || c.target.sim.sim_advance != 0.0;
        if sim_flags_given && link != Link::Sim {
            bail!("the --sim-* flags apply to --transport sim only");
        }
        let blades = if link == Link::Sim {
            if !c.target.blades.is_empty() {
                bail!("--transport sim simulates its own memory blades: drop --blades (or use --sim-memory-blades N)");
            }
            if c.target.embedded_blades.is_some() {
                bail!("--embedded-blades applies to embedded blades; a simulation takes --sim-memory-blades");
            }
            if c.barrier.is_some() {
                bail!("--barrier needs processes on real blades; a simulation runs its compute blades in one process (--sim-compute-blades)");
            }
            let profile = smart_sim::Profile::load(&c.target.sim.sim_profile).map_err(anyhow::Error::msg)?;
            // A blade directory made by an earlier run says how many blades it holds.
            let kept = c
                .target
                .sim
                .sim_blade_dir
                .as_ref()
                .map_or(0, |d| (0..).take_while(|b| smart_sim::blade_image(d, *b).exists()).count());
            let memory_blades = c.target.sim.sim_memory_blades.unwrap_or(kept.max(1));
            if memory_blades == 0 || memory_blades > smart_core::addr::MAX_BLADES {
                bail!("--sim-memory-blades must be 1 to {}", smart_core::addr::MAX_BLADES);
            }
            if c.sim_run.sim_compute_blades == 0 || c.sim_run.sim_compute_blades * c.threads > MAX_THREADS * 16 {
                bail!(
                    "--sim-compute-blades must be at least 1, and compute blades × --threads at most {}",
                    MAX_THREADS * 16
                );
            }
            if c.sim_run.sim_app_ns.is_some_and(|n| n > 1_000_000_000) {
                bail!("--sim-app-ns must be at most 1000000000 (1 s)");
            }
            // Simulated blades take memory only as it is touched (a
            // --sim-blade-dir file, though, takes its disk space up front):
            // large by default, so that 96 threads × many compute blades
            // never run out of a blade sized for two.
            let blade_bytes = c.target.blade_size.unwrap_or(SIM_BLADE_BYTES);
            check_blade_size("--blade-size", blade_bytes)?;
            let faults = c
                .sim_run
                .sim_fault
                .iter()
                .map(|f| smart_sim::Fault::parse(f))
                .collect::<Result<Vec<_>, _>>()
                .map_err(anyhow::Error::msg)?;
            if !(0.0..=MAX_SECONDS).contains(&c.target.sim.sim_advance) {
                bail!("--sim-advance must be 0 to {MAX_SECONDS} seconds");
            }
            if c.target.sim.sim_advance > 0.0 && c.target.sim.sim_blade_dir.is_none() {
                bail!("--sim-advance needs --sim-blade-dir (it moves the virtual clock kept there)");
            }
            Blades::Simulated(Box::new(smart_sim::SimConfig {
                profile,
                memory_blades,
                blade_bytes,
                compute_blades: c.sim_run.sim_compute_blades,
                threads_per_blade: c.threads,
                seed,
                blade_dir: c.target.sim.sim_blade_dir.clone(),
                app_ns: c.sim_run.sim_app_ns.unwrap_or(0),
                faults,
                fault_seed: c.sim_run.sim_fault_seed,
                survives_loss: false,
                fault_span_ns: ((c.warmup + c.duration) * 1e9) as u64,
                advance_ns: (c.target.sim.sim_advance * 1e9) as u64,
            }))
        } else if c.target.blades.is_empty() {
            if link != Link::Tcp {
                bail!("--transport verbs needs --blades");
            }
            let count = c.target.embedded_blades.unwrap_or(1);
            if count == 0 || count > smart_core::addr::MAX_BLADES {
                bail!("--embedded-blades must be 1 to {}", smart_core::addr::MAX_BLADES);
            }
            let size = c.target.blade_size.unwrap_or(256 << 20);
            check_blade_size("--blade-size", size)?;
            Blades::Embedded { count, size }
        } else {
            if c.target.blade_size.is_some() || c.target.embedded_blades.is_some() {
                bail!("--blade-size and --embedded-blades apply to embedded blades only, not with --blades");
            }
            check_blades(&c.target.blades)?;
            load_secret(c.target.secret_file.as_deref())?;
            let addrs = c.target.blades.iter().map(|a| a.trim().to_string()).collect();
            Blades::Remote { addrs, link, secret_file: c.target.secret_file.clone() }
        };
        if c.target.secret_file.is_some() && !matches!(blades, Blades::Remote { .. }) {
            bail!("--secret-file applies to --blades (memory-blade processes) only");
        }
        if let Some(p) = &c.target.json {
            check_json(p)?;
        }
        if !(0.0..=MAX_SECONDS).contains(&c.target.request_timeout) {
            bail!("--request-timeout must be 0 (none) to {MAX_SECONDS} seconds");
        }
        let request_timeout =
            (c.target.request_timeout > 0.0).then(|| Duration::from_secs_f64(c.target.request_timeout));
        if !(0.0..=1e6).contains(&c.idle_us) {
            bail!("--idle-us must be 0 to 1000000 microseconds");
        }
        let compute_blades = if matches!(blades, Blades::Simulated(_)) { c.sim_run.sim_compute_blades } else { 1 };
        let mut run = RunConfig {
            threads: c.threads * compute_blades,
            coroutines: c.coroutines,
            duration: Duration::from_secs_f64(c.duration),
            warmup: Duration::from_secs_f64(c.warmup),
            runtime: RuntimeConfig { smart, request_timeout, ..RuntimeConfig::default() },
            progress: !c.target.quiet,
            seed,
            interrupt: None,
            gate: None,
            idle: Duration::from_secs_f64(c.idle_us / 1e6),
            published: None,
        };
        if let Some(b) = &c.barrier {
            if c.target.blades.is_empty() {
                bail!("--barrier needs --blades (processes meet on a memory blade, not in an embedded one)");
            }
            if !(c.barrier_timeout > 0.0 && c.barrier_timeout <= MAX_SECONDS) {
                bail!("--barrier-timeout must be positive, at most {MAX_SECONDS} seconds");
            }
            run.gate = Some(barrier_gate(b, Duration::from_secs_f64(c.barrier_timeout), &run.runtime)?);
        }
        if let Some(u) = &c.target.coordinator {
            smart_coord::parse_url(u)?;
            if !matches!(blades, Blades::Remote { .. }) {
                bail!("--coordinator needs --blades: its configuration names memory-blade processes");
            }
        }
        Ok(Session { blades, run, json: c.target.json.clone(), coordinator: c.target.coordinator.clone() })
    }
}

/// `--barrier NAME:N` as the run's start gate: it prints when it arrives
/// and when it is released (on stderr).
fn barrier_gate(spec: &str, timeout: Duration, rc: &RuntimeConfig) -> Result<StartGate> {
    let (name, n) = spec
        .rsplit_once(':')
        .and_then(|(name, n)| Some((name.to_string(), n.parse::<u64>().ok()?)))
        .filter(|(name, n)| !name.is_empty() && *n >= 1 && name.len() <= 64)
        .ok_or_else(|| anyhow::anyhow!("--barrier {spec:?}: expected NAME:N (a name of up to 64 bytes, N ≥ 1)"))?;
    let rc = rc.clone();
    Ok(StartGate(Arc::new(move |t: &dyn Transport| {
        let mut rt = Runtime::new(t, 0, rc.clone())?;
        let ctx = rt.ctx();
        eprintln!("barrier {name}: arrived, waiting for {n} processes (at most {:.0}s)", timeout.as_secs_f64());
        let (name2, poll) = (name.clone(), Duration::from_millis(2));
        let a = rt.block_on(async move { smart_core::barrier::arrive(&ctx, &name2, n, timeout, poll).await })?;
        eprintln!(
            "barrier {name}: released after {:.3}s (ticket {}, generation {})",
            a.waited.as_secs_f64(),
            a.ticket,
            a.generation
        );
        Ok(())
    })))
}

fn micro(a: &MicroArgs, run: &RunConfig) -> Result<MicroConfig> {
    let op = match a.op {
        OpArg::Read => Opcode::Read,
        OpArg::Write => Opcode::Write,
        OpArg::Cas => Opcode::Cas,
        OpArg::Faa => Opcode::Faa,
    };
    let slot = run.runtime.slot_bytes as u64;
    if !op.is_atomic() && (a.size == 0 || a.size > slot) {
        bail!("--size must be 1 to {slot} bytes (one batch's local bytes)");
    }
    let size = if op.is_atomic() { 8 } else { a.size as u32 };
    if a.batch == 0 || a.batch > MAX_BATCH {
        bail!("--batch must be 1 to {MAX_BATCH}");
    }
    if a.contended && op == Opcode::Cas && a.batch != 1 {
        bail!("a contended CAS-increment is one CAS at a time: use --batch 1");
    }
    if u64::from(size) * a.batch as u64 > slot {
        bail!("--size × --batch must be at most {slot} bytes (one batch's local bytes)");
    }
    if a.area < u64::from(size).next_multiple_of(8) {
        bail!("--area must hold at least one WR of --size bytes");
    }
    if a.phase_ms == Some(0) || (a.phase_ms.is_some() && a.contended) {
        bail!("--phase-ms must be at least 1, and applies to uncontended runs only");
    }
    if a.depth.is_some_and(|d| d == 0 || d > 256) {
        bail!("--depth must be 1 to 256 batches per round");
    }
    if a.latency_every == 0 || a.latency_every > 1 << 20 {
        bail!("--latency-every must be 1 to {}", 1 << 20);
    }
    Ok(MicroConfig {
        op,
        size,
        batch: a.batch,
        contended: a.contended,
        area: a.area,
        phase_ms: a.phase_ms,
        latency_every: a.latency_every,
        depth: a.depth,
    })
}

fn ycsb(a: &YcsbArgs) -> Result<YcsbJob> {
    let app = match a.app {
        AppArg::Race => App::Race,
        AppArg::Sherman => App::Sherman,
    };
    let workload = ycsb::Workload::parse(&a.workload).map_err(|e| anyhow::anyhow!("--workload: {e}"))?;
    if workload.mix[3] > 0.0 && app == App::Race {
        bail!(
            "--workload {}: needs range scans, which the hash table (--app race) does not have; use --app sherman",
            workload.name
        );
    }
    let zipf_ok = a.zipf > 0.0 && (a.zipf - 1.0).abs() > 1e-9 && a.zipf.is_finite();
    if !a.uniform && !zipf_ok {
        bail!("--zipf must be a positive number other than 1 (the paper uses 0.99)");
    }
    check_rows("--keys", a.keys)?;
    let (key_format, (key_default, value_default)) = match a.record {
        RecordArg::Binary => (ycsb::bench::KeyFormat::Binary, (8, 8)),
        RecordArg::Ycsb => (ycsb::bench::KeyFormat::Ycsb, (ycsb::bench::YCSB_KEY as u64, 1000)),
    };
    let (key_size, value_size) = (a.key_size.unwrap_or(key_default), a.value_size.unwrap_or(value_default));
    if key_size < key_format.min_size() as u64 {
        bail!(
            "--key-size must be ≥ {} with --record {} (asked {key_size})",
            key_format.min_size(),
            key_format.as_str()
        );
    }
    if value_size < 8 {
        bail!("--value-size must be ≥ 8 (asked {value_size})");
    }
    if app == App::Sherman {
        let (k, v) = (sherman_bt::layout::MAX_KEY as u64, sherman_bt::layout::MAX_VALUE as u64);
        if key_size > k || value_size > v {
            bail!("--app sherman stores keys of up to {k} bytes and values of up to {v} (asked --key-size {key_size} --value-size {value_size})");
        }
    } else {
        let max = race_ht::RaceHt::max_kv_bytes(RuntimeConfig::default().slot_bytes) as u64;
        if key_size.saturating_add(value_size) > max {
            bail!("--key-size + --value-size must be at most {max} bytes (the largest entry the index stores)");
        }
    }
    if let Some(c) = a.capacity {
        check_rows("--capacity", c)?;
    }
    if a.table.is_empty() {
        bail!("--table must not be empty");
    }
    let chooser = if a.uniform { ycsb::KeyChooser::Uniform(a.keys) } else { ycsb::KeyChooser::zipfian(a.keys, a.zipf) };
    let y = YcsbConfig {
        table: a.table.clone(),
        keys: a.keys,
        workload,
        chooser,
        key_size: key_size as usize,
        key_format,
        value_size: value_size as usize,
        verify: a.verify,
        capacity: a.capacity.unwrap_or(a.keys),
        load: match (a.no_load, a.load_only) {
            (true, _) => ycsb::bench::LoadMode::NoLoad,
            (_, true) => ycsb::bench::LoadMode::LoadOnly,
            _ => ycsb::bench::LoadMode::Load,
        },
    };
    // Workload d's reads follow YCSB's latest distribution (the newest
    // inserted keys hottest), its inserts take new keys: named as such.
    let keys = if a.uniform { "uniform".to_string() } else { format!("zipf-{}", a.zipf) };
    let distribution = if workload.reads_latest() { format!("latest-{keys}") } else { keys };
    Ok(YcsbJob { app, y, distribution })
}

/// `--mix` of a workload with `types` (its default mix when absent).
fn mix<const N: usize>(spec: Option<&str>, types: &[&str; N], default: [u32; N]) -> Result<[u32; N]> {
    let Some(spec) = spec else { return Ok(default) };
    let mix = smallbank_tatp::parse_mix(spec, types).map_err(|e| anyhow::anyhow!("--mix {spec:?}: {e}"))?;
    Ok(mix.try_into().expect("one percentage per type"))
}

fn dtx_config(c: &Common, f: &DtxFlags, db: &str, workload: DtxWorkload) -> Result<Config> {
    let mut session = Session::resolve(c)?;
    let smallbank = matches!(workload, DtxWorkload::SmallBank(_));
    session.sim_app(c, |a| if smallbank { a.smallbank_ns } else { a.tatp_ns });
    let max = ford_dtx::layout::MAX_REPLICAS;
    if f.replicas == 0 || f.replicas > max {
        bail!("--replicas must be 1 to {max}");
    }
    // Embedded and simulated blades: as many as replicas unless told.
    match &mut session.blades {
        Blades::Embedded { count, .. } if c.target.embedded_blades.is_none() => *count = f.replicas,
        Blades::Simulated(cfg) if c.target.sim.sim_memory_blades.is_none() && cfg.memory_blades < f.replicas => {
            cfg.memory_blades = f.replicas
        }
        _ => {}
    }
    if let Blades::Simulated(cfg) = &mut session.blades {
        // Replicated, the database survives a memory blade lost (then
        // `rebuild --lost B`): a drawn fault may be one.
        cfg.survives_loss = f.replicas >= 2;
    }
    let blades = match &session.blades {
        Blades::Embedded { count, .. } => *count,
        Blades::Simulated(cfg) => cfg.memory_blades,
        Blades::Remote { addrs, .. } => addrs.len(),
    };
    if f.replicas > blades {
        bail!("--replicas {} needs at least as many memory blades (have {blades})", f.replicas);
    }
    if !(f.lease >= 0.1 && f.lease <= MAX_SECONDS) {
        bail!("--lease must be 0.1 to {MAX_SECONDS} seconds");
    }
    if !(f.audit_wait >= 0.0 && f.audit_wait <= MAX_SECONDS) {
        bail!("--audit-wait must be 0 to {MAX_SECONDS} seconds");
    }
    if db.is_empty() {
        bail!("--db must not be empty");
    }
    if session.run.threads > ford_dtx::layout::MAX_THREADS || session.run.coroutines > ford_dtx::layout::MAX_THREADS {
        bail!(
            "transactions name their thread and coroutine in 12 bits: at most {} each",
            ford_dtx::layout::MAX_THREADS
        );
    }
    let cfg = smallbank_tatp::DtxConfig {
        db: db.to_string(),
        replicas: f.replicas,
        retry_aborts: f.retry_aborts,
        lease: Duration::from_secs_f64(f.lease),
        halt: None,
        fence_tag: None,
        fence_recorded: None,
        lost: Vec::new(),
        joining: Vec::new(),
        settle: Vec::new(),
    };
    let audit_wait = Duration::from_secs_f64(f.audit_wait);
    Ok(Config {
        session,
        job: Job::Dtx(DtxJob { workload, cfg, audit: f.audit, audit_only: f.audit_only, audit_wait }),
    })
}

fn table_config(a: &TableArgs) -> Result<Config> {
    let session = Session::resolve(&a.common.common())?;
    let name = match (a.action, &a.name) {
        (TableAction::List, None) => String::new(),
        (TableAction::List, Some(_)) => bail!("table list takes no NAME"),
        (_, Some(n)) if !n.is_empty() => n.clone(),
        _ => bail!("table drop, check and repair need the index's NAME"),
    };
    let app = a.app.map(|k| match k {
        AppArg::Race => App::Race,
        AppArg::Sherman => App::Sherman,
    });
    if let (TableAction::Repair, Some(App::Sherman)) = (a.action, app) {
        bail!("table repair is for RACE tables: a B+tree's operations take a dead client's lock over themselves");
    }
    Ok(Config { session, job: Job::Table(TableJob { action: a.action, name, app }) })
}

fn recover_config(a: &RecoverArgs) -> Result<Config> {
    let session = Session::resolve(&a.common.common())?;
    if a.db.iter().any(String::is_empty) {
        bail!("--db has an empty name");
    }
    if a.slot == Some(0) {
        bail!("--slot: registry slots are numbered from 1");
    }
    if a.wait && a.slot.is_some() {
        bail!("--wait and --slot: --slot recovers its registration now, whatever its lease");
    }
    if a.wait && matches!(session.blades, Blades::Simulated(_)) {
        bail!("--wait waits in real time; a simulated cluster's leases run in virtual time (see --sim-advance)");
    }
    let dbs = if a.db.is_empty() { vec!["smallbank".into(), "tatp".into()] } else { a.db.clone() };
    Ok(Config { session, job: Job::Recover(RecoverJob { dbs, slot: a.slot, repair: a.repair, wait: a.wait }) })
}
