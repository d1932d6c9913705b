//! What was typed: the command-line flags of both binaries, as clap parses
//! them. Nothing here is validated beyond its type; [`crate::config`] turns
//! flags into what to do.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use smart_bench::size::parse_size;

/// How a binary reaches the memory blades' region: flags both binaries take.
#[derive(Args, Debug, Clone)]
pub struct LinkFlags {
    /// Transport: tcp (the software RNIC), verbs (RDMA), or sim (compute-blade
    /// only: a simulated cluster in virtual time, without --blades).
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp)]
    pub transport: TransportArg,
    /// RDMA device (with --transport verbs; default: the first with an active port).
    #[arg(long)]
    pub device: Option<String>,
    /// GID index (with --transport verbs on RoCE; default 0).
    #[arg(long)]
    pub gid_index: Option<u32>,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum TransportArg {
    /// Verbs over TCP to a `memory-blade` process.
    Tcp,
    /// RDMA verbs (cargo feature `verbs`).
    Verbs,
    /// A simulated RDMA cluster in virtual time (smart-sim); compute-blade only.
    Sim,
}

/// `memory-blade`'s flags.
#[derive(Parser, Debug)]
#[command(name = "memory-blade", version = crate::report::VERSION, about = "Smart-rs memory blade: serves one-sided verbs on its memory")]
pub struct MemoryCli {
    /// Address to listen on, e.g. 0.0.0.0:7000 (port 0 picks a free port).
    #[arg(long)]
    pub listen: String,
    /// Region size, e.g. 1GiB. Default 1GiB; with an existing backing file,
    /// the file's size.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Keep the region in this file: its contents survive a restart.
    #[arg(long)]
    pub backing_file: Option<PathBuf>,
    /// With --backing-file: answer no batch before the disk holds what it
    /// wrote (its pages synced to the file), so completed writes survive a
    /// power loss, not only a crash of this process. Costs a disk flush per
    /// answer that completes a write. TCP only.
    #[arg(long)]
    pub durable: bool,
    /// Most connections served at once (a compute thread opens one per
    /// blade; the default holds a compute blade of 1024 threads with its
    /// set-up and lease connections, and 60 more); one beyond is told so
    /// and closed.
    #[arg(long, default_value_t = smart_core::blade::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Most connections from one peer (IP address) at once; default: 32
    /// fewer than --max-connections (room kept for other peers), or all of
    /// them when that is at most 64.
    #[arg(long)]
    pub max_connections_per_peer: Option<usize>,
    /// Memory all connections' responses may hold together, beyond 64 KiB
    /// each (at least 1MiB): a connection whose next response does not fit
    /// sends what it holds and reads no more requests until there is room;
    /// a client that takes no responses for 10 s is closed. The blade's
    /// memory is then bounded by its region, this, and per connection 64
    /// KiB out, 256 KiB in (more only while a client sends a frame larger
    /// than that) and a thread's stack.
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub response_memory: u64,
    /// Seconds a connection may stay without its first request after its
    /// handshake before it is closed (idle connections cannot keep clients
    /// out); part of a frame left unsent for 10 s closes it too.
    #[arg(long, default_value_t = 60.0)]
    pub idle_timeout: f64,
    /// The cluster secret (a file `compute-blade secret` wrote): serve only
    /// clients that prove they hold it, and take revocations only from
    /// them. Without it, anyone who reaches the port may read, write and
    /// revoke (a warning says so).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// How compute blades reach the region.
    #[command(flatten)]
    pub link: LinkFlags,
    /// On an error, also print its full report with a backtrace.
    #[arg(long)]
    pub verbose: bool,
}

/// `compute-blade`'s flags.
#[derive(Parser, Debug)]
#[command(name = "compute-blade", version = crate::report::VERSION, about = "Smart-rs compute blade: benchmarks over one-sided verbs")]
pub struct ComputeCli {
    /// The benchmark.
    #[command(subcommand)]
    pub cmd: Cmd,
    /// On an error, also print its full report with a backtrace (errors
    /// otherwise print their message chain only).
    #[arg(long, global = true)]
    pub verbose: bool,
}

/// `compute-blade`'s subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Verbs micro-benchmark: READ, WRITE, CAS or FAA as fast as possible.
    Micro(MicroArgs),
    /// YCSB over a disaggregated index (the RACE hash table or the Sherman
    /// B+tree).
    Ycsb(YcsbArgs),
    /// SmallBank transactions (FORD on disaggregated memory).
    Smallbank(SmallbankArgs),
    /// TATP transactions (FORD on disaggregated memory).
    Tatp(TatpArgs),
    /// Roll back or forward the transactions of dead compute blades.
    Recover(RecoverArgs),
    /// Write lost memory blades' copies of the FORD databases again, from
    /// the other replicas, onto fresh memory blades in their places.
    Rebuild(RebuildArgs),
    /// List the indexes on the blades, or drop or check one.
    Table(TableArgs),
    /// Merge the records of compute blades that ran together (ops summed,
    /// latency from the merged histograms) into one.
    Merge(MergeArgs),
    /// What this host offers the verbs backend: RDMA devices, ports, GIDs,
    /// limits, atomics, thread domains, locked memory, huge pages (fails if
    /// no device, or not the one named, has an active port).
    VerbsInfo(VerbsInfoArgs),
    /// Write a new cluster secret to a file (readable by its owner only;
    /// never overwrites one), for --secret-file on every blade.
    Secret(SecretArgs),
    /// Show the cluster's configuration in the coordinator (etcd), or take
    /// a memory blade out of it.
    Coordinator(CoordinatorArgs),
}

/// What `compute-blade coordinator` does.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CoordinatorAction {
    /// The configuration (epoch, memory blades, databases' replica orders)
    /// and the compute blades whose membership runs.
    Show,
    /// Take memory blade --blade out of the configuration (the next epoch)
    /// and fence the compute blades of earlier epochs on the others.
    Remove,
    /// List the fresh memory blade at --addr as a spare: after a failover,
    /// a compute blade that goes on (the one that claims the copy in etcd)
    /// starts `rebuild --online` onto it in the removed blade's place.
    Spare,
    /// Take the spare at --addr off the list.
    Unspare,
}

/// `compute-blade coordinator`.
#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// What to do.
    #[arg(value_enum)]
    pub action: CoordinatorAction,
    /// The coordinator: http://HOST:PORT[/CLUSTER], or
    /// http://HOST:PORT,HOST:PORT,…[/CLUSTER] (every member of an etcd
    /// cluster).
    #[arg(long, required = true)]
    pub coordinator: String,
    /// The memory blade to remove (its index).
    #[arg(long)]
    pub blade: Option<u16>,
    /// Why it is removed (recorded in the configuration).
    #[arg(long, default_value = "removed by hand")]
    pub why: String,
    /// The spare's address, HOST:PORT (spare and unspare).
    #[arg(long)]
    pub addr: Option<String>,
    /// The cluster secret, for fencing on blades that run with --secret-file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Seconds to wait for etcd and for each memory blade.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// Also write what `show` prints as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `compute-blade secret`.
#[derive(Args, Debug)]
pub struct SecretArgs {
    /// The file to create.
    pub file: PathBuf,
}

/// `compute-blade verbs-info`.
#[derive(Args, Debug)]
pub struct VerbsInfoArgs {
    /// The device a run would use (default: the first with an active port).
    #[arg(long)]
    pub device: Option<String>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `compute-blade merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The records (each a `--json` file of a timed run).
    #[arg(required = true)]
    pub records: Vec<PathBuf>,
    /// Write the merged record here (default: standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Options every subcommand takes.
#[derive(Args, Debug)]
pub struct Common {
    /// Worker threads.
    #[arg(long, default_value_t = 1, help_heading = "Run shape")]
    pub threads: usize,
    /// Coroutines per worker thread.
    #[arg(long, default_value_t = 8, help_heading = "Run shape")]
    pub coroutines: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0, help_heading = "Run shape")]
    pub duration: f64,
    /// Seconds of warmup before measuring.
    #[arg(long, default_value_t = 1.0, help_heading = "Run shape")]
    pub warmup: f64,
    /// Start the timed run together with other processes: NAME:N waits
    /// (after any load) until N processes arrived at barrier NAME, through
    /// a FAA counter on blade 0. Needs --blades.
    #[arg(long, help_heading = "Run shape")]
    pub barrier: Option<String>,
    /// Microseconds each coroutine idles between its operations, to offer
    /// less than the full load (latency against throughput; 0: none).
    #[arg(long, default_value_t = 0.0, help_heading = "Run shape")]
    pub idle_us: f64,
    /// Seconds to wait at the --barrier for the others before failing.
    #[arg(long, default_value_t = 60.0, help_heading = "Run shape")]
    pub barrier_timeout: f64,
    /// Smart techniques to enable: all (the default), none (the baseline),
    /// or a list of thd-res-alloc, work-req-throt, conflict-avoid,
    /// spec-lookup.
    #[arg(long, default_value = "all", help_heading = "Smart techniques")]
    pub smart: String,
    /// The parts of conflict-avoid that are on, as the steps of the paper's
    /// figure 14: backoff (randomized exponential backoff, the cap fixed at
    /// C_limit), dyn-limit (+ the controller that moves the cap), all (+
    /// coroutine throttling and the key gate). Needs conflict-avoid in --smart.
    #[arg(long, default_value = "all", help_heading = "Smart techniques")]
    pub conflict_avoid_parts: String,
    /// conflict-avoid's controller: guarded (levels up are trials judged by
    /// goodput) or paper (the paper's: the retry rate alone moves the
    /// levels, every 1 ms window; no key gate). Needs conflict-avoid in
    /// --smart.
    #[arg(long, default_value = "guarded", help_heading = "Smart techniques")]
    pub conflict_avoid_controller: String,
    /// work-req-throt's limit on a thread's outstanding WRs: auto (the
    /// tuner's range search, from the thread's bound down to 1), paper (the
    /// paper's tuner: the best of 4, 6, 8, 10, 12), or a number (fixed; no
    /// tuning). Needs work-req-throt in --smart.
    #[arg(long, default_value = "auto", help_heading = "Smart techniques")]
    pub throttle_limit: String,
    /// The tuner's measuring window Δ in milliseconds (the paper: 8); the
    /// stable phase lasts 60 Δ. Needs work-req-throt in --smart.
    #[arg(long, help_heading = "Smart techniques")]
    pub throttle_delta: Option<f64>,
    /// QP policy: shared, multiplexed:K, per-thread-qp, per-thread-db
    /// (default: per-thread-db with thd-res-alloc, else per-thread-qp).
    #[arg(long, help_heading = "Smart techniques")]
    pub qp_policy: Option<String>,
    /// Completion queues: one per thread (Smart) or one shared by all threads.
    #[arg(long, value_enum, default_value_t = CqArg::PerThread, help_heading = "Smart techniques")]
    pub cq: CqArg,
    /// Emulated doorbell registers of the soft backends, LOW:MEDIUM
    /// (ConnectX-6: 4:12). Fewer doorbells make sharing show at few threads.
    #[arg(long, default_value = "4:12", help_heading = "Smart techniques")]
    pub doorbells: String,
    /// The memory blades, the output and the seed, as every subcommand
    /// takes them.
    #[command(flatten)]
    pub target: BladeArgs,
    /// The simulation's flags of a workload (with --transport sim).
    #[command(flatten)]
    pub sim_run: SimRunFlags,
}

/// How a subcommand reaches the memory blades, its output and its seed: all
/// that `recover`, `rebuild` and `table` take, and part of [`Common`].
#[derive(Args, Debug, Clone)]
pub struct BladeArgs {
    /// Memory blades (HOST:PORT,...); omit for an embedded blade in this process.
    #[arg(long, value_delimiter = ',', help_heading = "Memory blades")]
    pub blades: Vec<String>,
    /// Transport to the --blades.
    #[command(flatten, next_help_heading = "Memory blades")]
    pub link: LinkFlags,
    /// Size of each embedded blade (without --blades; default 256MiB), or
    /// of each simulated one (--transport sim; default 4GiB, whose memory
    /// and blade files are taken only as they are touched).
    #[arg(long, value_parser = parse_size, help_heading = "Memory blades")]
    pub blade_size: Option<u64>,
    /// Number of embedded blades (without --blades; default 1).
    #[arg(long, help_heading = "Memory blades")]
    pub embedded_blades: Option<usize>,
    /// Seconds a batch may wait for its completion before the command fails
    /// with a time-out naming the blade (0: wait forever).
    #[arg(long, default_value_t = 10.0, help_heading = "Memory blades")]
    pub request_timeout: f64,
    /// The cluster secret (a file `compute-blade secret` wrote), proved to
    /// the --blades that run with --secret-file (they serve no one else).
    #[arg(long, help_heading = "Memory blades")]
    pub secret_file: Option<PathBuf>,
    /// The coordinator (etcd) holding the cluster's configuration:
    /// http://HOST:PORT[/CLUSTER], or http://HOST:PORT,HOST:PORT,…[/CLUSTER]
    /// (every member of an etcd cluster). smallbank, tatp and rebuild then run
    /// only on the blades it trusts, as members under an etcd lease; a run
    /// whose blade fails removes it from the configuration and fences the
    /// other compute blades.
    #[arg(long, help_heading = "Memory blades")]
    pub coordinator: Option<String>,
    /// Write the result record (JSON) to this file.
    #[arg(long, help_heading = "Output")]
    pub json: Option<PathBuf>,
    /// No progress lines (a run's are per second).
    #[arg(long, help_heading = "Output")]
    pub quiet: bool,
    /// Seed of every random choice (recorded; under --transport sim the same
    /// seed repeats a command bit for bit); default: a fresh one per run, so
    /// concurrent processes do not replay the same keys.
    #[arg(long, help_heading = "Run shape")]
    pub seed: Option<u64>,
    /// The simulated blades (with --transport sim).
    #[command(flatten)]
    pub sim: SimBladeFlags,
}

/// The simulated cluster's memory blades (`--transport sim`).
#[derive(Args, Debug, Clone)]
pub struct SimBladeFlags {
    /// Hardware profile: connectx6 (the built-in, calibrated one) or a TOML
    /// file of the same fields.
    #[arg(long, default_value = "connectx6", help_heading = "Simulation (--transport sim)")]
    pub sim_profile: String,
    /// Simulated memory blades (default 1; smallbank and tatp: --replicas).
    #[arg(long, help_heading = "Simulation (--transport sim)")]
    pub sim_memory_blades: Option<usize>,
    /// Keep the simulated memory blades in DIR/blade-I.img, so that a later
    /// command (table, recover, --audit-only, --no-load) finds what this one
    /// left.
    #[arg(long, help_heading = "Simulation (--transport sim)")]
    pub sim_blade_dir: Option<PathBuf>,
    /// Virtual seconds that pass before this command, after the last one on
    /// the same --sim-blade-dir (e.g. for a dead compute blade's lease to
    /// run out before recover).
    #[arg(long, default_value_t = 0.0, help_heading = "Simulation (--transport sim)")]
    pub sim_advance: f64,
}

impl BladeArgs {
    /// These options with every workload option at its default, as clap
    /// gives it (what a command that runs no workload resolves its session
    /// from).
    pub fn common(&self) -> Common {
        /// Only to take [`Common`]'s defaults from clap.
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            common: Common,
        }
        let mut c = Defaults::parse_from(["defaults"]).common;
        c.target = self.clone();
        c
    }
}

/// The simulation's flags that only a workload takes (`--transport sim`).
#[derive(Args, Debug, Clone)]
pub struct SimRunFlags {
    /// Simulated compute blades, each with --threads threads, its own RNIC
    /// and links (default 1).
    #[arg(long, default_value_t = 1, help_heading = "Simulation (--transport sim)")]
    pub sim_compute_blades: usize,
    /// Nanoseconds of application work per doorbell on top of the profile's
    /// cpu.op_ns (default: the profile's `app` value for the application run:
    /// race_ns, sherman_ns, smallbank_ns or tatp_ns; 0 for micro, recover
    /// and table).
    #[arg(long, help_heading = "Simulation (--transport sim)")]
    pub sim_app_ns: Option<u64>,
    /// Inject a fault, counted in virtual ms from the start of the timed run:
    /// kill@MS (this compute blade dies, exit status 137), blade-down@MS:BLADE:FOR_MS,
    /// blade-lost@MS:BLADE (with its memory: then `rebuild --lost BLADE`),
    /// blade-stall@MS:BLADE:FOR_MS, stall@MS:THREAD:FOR_MS, drop-qp@MS:THREAD:BLADE.
    /// Repeatable.
    #[arg(long, help_heading = "Simulation (--transport sim)")]
    pub sim_fault: Vec<String>,
    /// Inject one fault drawn from this seed (kind, instant within the
    /// warm-up and measured time, thread or blade); printed on stderr.
    #[arg(long, help_heading = "Simulation (--transport sim)")]
    pub sim_fault_seed: Option<u64>,
}

/// `--cq`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum CqArg {
    /// A CQ per worker thread.
    PerThread,
    /// One CQ shared by all threads.
    Shared,
}

/// `micro --op`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OpArg {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// Compare-and-swap.
    Cas,
    /// Fetch-and-add.
    Faa,
}

/// `compute-blade micro`.
#[derive(Args, Debug)]
pub struct MicroArgs {
    /// The verb.
    #[arg(long, value_enum, default_value_t = OpArg::Read)]
    pub op: OpArg,
    /// Bytes per READ or WRITE (atomics are 8).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    pub size: u64,
    /// WRs per batch (one doorbell).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// All WRs on one 8-byte word (CAS becomes a CAS-increment loop).
    #[arg(long)]
    pub contended: bool,
    /// Bytes per blade that uncontended WRs spread over.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub area: u64,
    /// A changing workload (the paper's table 1): every this many ms a new
    /// number of threads (37.5% to 100% of --threads) is active; the others
    /// idle.
    #[arg(long)]
    pub phase_ms: Option<u64>,
    /// Time one batch in N (drawn at random) for the latency percentiles;
    /// every batch is counted. 1 times every batch.
    #[arg(long, default_value_t = 8)]
    pub latency_every: u32,
    /// Post in rounds, as the Smart artifact's test_rdma does: each
    /// coroutine posts D batches (a doorbell each) and waits for all of them
    /// before the next round (default: each coroutine keeps one batch in
    /// flight).
    #[arg(long)]
    pub depth: Option<usize>,
    /// Options of every subcommand.
    #[command(flatten)]
    pub common: Common,
}

/// `ycsb --record`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecordArg {
    /// Keys as 8 big-endian bytes, 8-byte values.
    Binary,
    /// YCSB's standard record: 24-byte string keys, 10 × 100-byte values.
    Ycsb,
}

/// `ycsb --app`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AppArg {
    /// The RACE hash table.
    Race,
    /// The Sherman B+tree.
    Sherman,
}

/// `compute-blade ycsb`.
#[derive(Args, Debug)]
pub struct YcsbArgs {
    /// The index.
    #[arg(long, value_enum, default_value_t = AppArg::Race)]
    pub app: AppArg,
    /// a, b, c, d, e, f, update-only (or write-heavy, read-heavy, read-only).
    #[arg(long, default_value = "a")]
    pub workload: String,
    /// Name of the index on the blades.
    #[arg(long, default_value = "ycsb")]
    pub table: String,
    /// Keys loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Zipfian exponent of the request distribution.
    #[arg(long, default_value_t = 0.99, conflicts_with = "uniform")]
    pub zipf: f64,
    /// Uniform requests instead of Zipfian.
    #[arg(long)]
    pub uniform: bool,
    /// The record: `binary` (keys are the key number as 8 big-endian bytes;
    /// default sizes 8 and 8) or `ycsb` (YCSB's standard record: keys
    /// `user` + 20 digits, 24 bytes; values of 10 fields × 100 bytes).
    /// --key-size and --value-size change the sizes of either.
    #[arg(long, value_enum, default_value = "binary")]
    pub record: RecordArg,
    /// Key bytes (≥ 8, ≥ 24 with --record ycsb; at most 256 with --app
    /// sherman; default from --record; suffixes as for sizes).
    #[arg(long, value_parser = parse_size)]
    pub key_size: Option<u64>,
    /// Value bytes (≥ 8; at most 4 KiB with --app sherman; default from
    /// --record; suffixes as for sizes).
    #[arg(long, value_parser = parse_size)]
    pub value_size: Option<u64>,
    /// Check every value read and read every key back after the run.
    #[arg(long)]
    pub verify: bool,
    /// Keys the hash table is created for (default: --keys); it grows
    /// beyond by splitting subtables. (The B+tree grows from one leaf.)
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Attach to the existing index as it is: no load (with --verify, every
    /// key of 0..--keys missing from it is reported).
    #[arg(long, conflicts_with = "load_only")]
    pub no_load: bool,
    /// Create and load the index, then stop (no timed run).
    #[arg(long)]
    pub load_only: bool,
    /// Options of every subcommand.
    #[command(flatten)]
    pub common: Common,
}

/// Options of both transaction workloads.
#[derive(Args, Debug)]
pub struct DtxFlags {
    /// Copies of every table, primary included (k ≤ blades; Smart used 2).
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Retry a transaction that aborted on a conflict (default: draw a new
    /// one, as FORD does).
    #[arg(long)]
    pub retry_aborts: bool,
    /// This compute blade's lease on the database, in seconds: after it
    /// expires unrenewed (the process died), recovery repairs its
    /// transactions.
    #[arg(long, default_value_t = 10.0)]
    pub lease: f64,
    /// After the run, audit the database (with the workers stopped).
    #[arg(long)]
    pub audit: bool,
    /// Only audit the existing database; no load, no run.
    #[arg(long, conflicts_with = "audit")]
    pub audit_only: bool,
    /// Seconds an audit waits for other compute blades running on the
    /// database to end (0: none); after it, their transactions in flight
    /// are reported, not counted.
    #[arg(long, default_value_t = 60.0)]
    pub audit_wait: f64,
}

/// `compute-blade smallbank`.
#[derive(Args, Debug)]
pub struct SmallbankArgs {
    /// Accounts (1 to 2^40).
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u64,
    /// Hot accounts, drawn with probability 90%.
    #[arg(long, default_value_t = 4_000)]
    pub hot: u64,
    /// Transaction mix: a percentage per type in report order
    /// (amalgamate, balance, deposit_checking, send_payment,
    /// transact_savings, write_check), or TYPE=PCT pairs with the others at
    /// 0; summing to 100 (default: SmallBank's 15,15,15,25,15,15).
    #[arg(long)]
    pub mix: Option<String>,
    /// Name of the database on the blades.
    #[arg(long, default_value = "smallbank")]
    pub db: String,
    /// Transaction options.
    #[command(flatten)]
    pub dtx: DtxFlags,
    /// Options of every subcommand.
    #[command(flatten)]
    pub common: Common,
}

/// `compute-blade tatp`.
#[derive(Args, Debug)]
pub struct TatpArgs {
    /// Subscribers (1 to 2^40).
    #[arg(long, default_value_t = 100_000)]
    pub subscribers: u64,
    /// Transaction mix: a percentage per type in report order
    /// (get_subscriber_data, get_new_destination, get_access_data,
    /// update_subscriber_data, update_location, insert_call_forwarding,
    /// delete_call_forwarding), or TYPE=PCT pairs with the others at 0;
    /// summing to 100 (default: TATP's 35,10,35,2,14,2,2).
    #[arg(long)]
    pub mix: Option<String>,
    /// Name of the database on the blades.
    #[arg(long, default_value = "tatp")]
    pub db: String,
    /// Transaction options.
    #[command(flatten)]
    pub dtx: DtxFlags,
    /// Options of every subcommand.
    #[command(flatten)]
    pub common: Common,
}

/// `compute-blade recover`.
#[derive(Args, Debug)]
pub struct RecoverArgs {
    /// Databases to recover (default: smallbank and tatp, those that exist).
    #[arg(long, value_delimiter = ',')]
    pub db: Vec<String>,
    /// Recover this registry slot even if its lease has not expired (only
    /// when its process is known to be dead).
    #[arg(long)]
    pub slot: Option<u16>,
    /// Then repair damaged records: where a record's copies differ or one
    /// fails its check, write the copy that wins (it passes its check and
    /// holds the highest version) to the others; report what no copy can
    /// restore (exit status 1).
    #[arg(long)]
    pub repair: bool,
    /// First wait for the registrations whose lease still runs (a compute
    /// blade killed a moment ago, or one alive): each is recovered once its
    /// lease and a 2 s grace have run out without renewal, or left alone
    /// once renewed (it is alive). Progress on standard error. Without it,
    /// such registrations are listed and the exit status is 1.
    #[arg(long)]
    pub wait: bool,
    /// The memory blades and the output.
    #[command(flatten)]
    pub common: BladeArgs,
}

/// `compute-blade rebuild`.
#[derive(Args, Debug)]
pub struct RebuildArgs {
    /// The places in --blades of the lost memory blades, where fresh ones
    /// now listen (or, with --transport sim --sim-blade-dir, the simulated
    /// blades lost to --sim-fault blade-lost@MS:B) (blade 0 too: its
    /// catalogs and registries come back from their mirrors on the other
    /// blades). Several lost blades are rebuilt together
    /// (`--lost 1,2`), each copy from a replica on none of them.
    #[arg(long, value_delimiter = ',', required = true)]
    pub lost: Vec<u16>,
    /// Databases to rebuild (default: every FORD database on the blades).
    #[arg(long, value_delimiter = ',')]
    pub db: Vec<String>,
    /// Copy while compute blades run (under --coordinator, one blade
    /// removed by a failover; blade 0 gets its catalogs back from the
    /// mirrors): the fresh blade joins (every transaction writes it), each
    /// slot is copied under its lock, then it is taken in. Run again, it
    /// resumes.
    #[arg(long)]
    pub online: bool,
    /// With --online: the most bytes of buckets copied per second, in MB/s
    /// (the copy's pace, so that transactions keep most of the blades).
    #[arg(long, default_value_t = 16.0)]
    pub copy_rate: f64,
    /// With --online: the share (0 to 1, e.g. 0.8) of their throughput
    /// before the copy that the compute blades are to keep during it. The
    /// copy then paces itself by what they publish in the registry: each
    /// second below the share halves its rate (down to --copy-rate / 16, so
    /// that it ends), each second at or above it adds --copy-rate / 8 (up to
    /// --copy-rate). Without it, the copy goes at --copy-rate.
    #[arg(long)]
    pub foreground_share: Option<f64>,
    /// With --online: the copier's lease on the database and in the
    /// coordinator, in seconds (its locks are released once it lapses, if
    /// it dies).
    #[arg(long, default_value_t = 5.0)]
    pub lease: f64,
    /// The memory blades and the output.
    #[command(flatten)]
    pub common: BladeArgs,
}

/// What `compute-blade table` does.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TableAction {
    /// Every index on the blades (by its named root), with its kind and name.
    List,
    /// Unset an index's name and give its memory back (every RACE subtable and block, every B+tree page
    /// and value block), once no client can still be using it.
    Drop,
    /// Read an index whole and report what is wrong with it.
    Check,
    /// Finish what dead clients left of a RACE table's resizing (splits and
    /// publications whose locks stay unchanged for the 2 s lease).
    Repair,
}

/// `compute-blade table`.
#[derive(Args, Debug)]
pub struct TableArgs {
    /// list, drop, check or repair.
    #[arg(value_enum)]
    pub action: TableAction,
    /// The index (drop, check and repair).
    pub name: Option<String>,
    /// Its kind (drop, check and repair; default: the kind of the index
    /// of that name on the blades, race if none).
    #[arg(long, value_enum)]
    pub app: Option<AppArg>,
    /// The memory blades and the output.
    #[command(flatten)]
    pub common: BladeArgs,
}
