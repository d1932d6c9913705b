//! `compute-blade`: runs benchmarks against memory blades.
//!
//! Without `--blades` the memory blade is embedded in this process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use smart_core::driver::{RunConfig, RunReport};
use smart_core::micro::{self, MicroConfig};
use smart_core::size::parse_size;
use smart_core::smart::{DoorbellConfig, SmartConfig};
use smart_core::{EmbeddedTransport, Opcode, RuntimeConfig, TcpTransport, Transport};

#[derive(Parser, Debug)]
#[command(version, about = "Smart-rs compute blade: benchmarks over one-sided verbs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Verbs micro-benchmark: READ, WRITE, CAS or FAA as fast as possible.
    Micro(MicroArgs),
    /// YCSB over a disaggregated index (the RACE hash table).
    Ycsb(YcsbArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AppArg {
    Race,
    Sherman,
}

#[derive(Args, Debug)]
struct YcsbArgs {
    #[command(flatten)]
    common: Common,
    /// The index.
    #[arg(long, value_enum, default_value_t = AppArg::Race)]
    app: AppArg,
    /// a, b, c, d, e, f, update-only (or write-heavy, read-heavy, read-only).
    #[arg(long, default_value = "a")]
    workload: String,
    /// Keys loaded before the run.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Zipfian exponent of the request distribution.
    #[arg(long, default_value_t = 0.99, conflicts_with = "uniform")]
    zipf: f64,
    /// Uniform requests instead of Zipfian.
    #[arg(long)]
    uniform: bool,
    /// Key bytes (≥ 8).
    #[arg(long, default_value_t = 8)]
    key_size: usize,
    /// Value bytes (≥ 16).
    #[arg(long, default_value_t = 16)]
    value_size: usize,
    /// Check every value read and read every key back after the run.
    #[arg(long)]
    verify: bool,
    /// Keys the hash table is created for (default: --keys); it grows
    /// beyond by splitting subtables.
    #[arg(long)]
    capacity: Option<u64>,
}

/// Options every subcommand takes.
#[derive(Args, Debug)]
struct Common {
    /// Memory blades (HOST:PORT,...); omit for an embedded blade in this process.
    #[arg(long, value_delimiter = ',')]
    blades: Vec<String>,
    /// Transport to the --blades.
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp)]
    transport: TransportArg,
    /// RDMA device (with --transport verbs; default: the first with an active port).
    #[arg(long)]
    device: Option<String>,
    /// GID index (with --transport verbs on RoCE; default 0).
    #[arg(long)]
    gid_index: Option<u32>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Coroutines per worker thread.
    #[arg(long, default_value_t = 8)]
    coroutines: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of warmup before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Smart techniques to enable: all, none, or a list of thd-res-alloc,
    /// work-req-throt, conflict-avoid, spec-lookup.
    #[arg(long, default_value = "none")]
    smart: String,
    /// QP policy: shared, multiplexed:K, per-thread-qp, per-thread-db
    /// (default: per-thread-db with thd-res-alloc, else per-thread-qp).
    #[arg(long)]
    qp_policy: Option<String>,
    /// Completion queues: one per thread (Smart) or one shared by all threads.
    #[arg(long, value_enum, default_value_t = CqArg::PerThread)]
    cq: CqArg,
    /// Emulated doorbell registers of the soft backends, LOW:MEDIUM
    /// (ConnectX-6: 4:12). Fewer doorbells make sharing show at few threads.
    #[arg(long, default_value = "4:12")]
    doorbells: String,
    /// Write the result record (JSON) to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Size of each embedded blade (without --blades).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    blade_size: u64,
    /// Number of embedded blades (without --blades).
    #[arg(long, default_value_t = 1)]
    embedded_blades: usize,
    /// No per-second progress lines.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportArg {
    Tcp,
    Verbs,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum CqArg {
    PerThread,
    Shared,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OpArg {
    Read,
    Write,
    Cas,
    Faa,
}

#[derive(Args, Debug)]
struct MicroArgs {
    #[command(flatten)]
    common: Common,
    /// The verb.
    #[arg(long, value_enum, default_value_t = OpArg::Read)]
    op: OpArg,
    /// Bytes per READ or WRITE (atomics are 8).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    size: u64,
    /// WRs per batch (one doorbell).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// All WRs on one 8-byte word (CAS becomes a CAS-increment loop).
    #[arg(long)]
    contended: bool,
    /// Bytes per blade that uncontended WRs spread over.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    area: u64,
}

/// What the common options resolve to.
struct Setup {
    transport: Arc<dyn Transport>,
    run: RunConfig,
}

fn parse_doorbells(s: &str) -> Result<DoorbellConfig> {
    let bad = || anyhow::anyhow!("--doorbells {s:?}: use LOW:MEDIUM, e.g. 4:12, with MEDIUM ≥ 1");
    let (l, m) = s.split_once(':').ok_or_else(bad)?;
    let (low_latency, medium) = (l.trim().parse().map_err(|_| bad())?, m.trim().parse().map_err(|_| bad())?);
    if medium == 0 {
        return Err(bad());
    }
    Ok(DoorbellConfig { low_latency, medium })
}

#[cfg(feature = "verbs")]
fn verbs_transport(c: &Common) -> Result<Arc<dyn Transport>> {
    use smart_core::backend::verbs::{VerbsConfig, VerbsTransport};
    let cfg = VerbsConfig { device: c.device.clone(), gid_index: c.gid_index };
    Ok(Arc::new(VerbsTransport::connect(&c.blades, &cfg).context("connecting over RDMA verbs")?))
}

#[cfg(not(feature = "verbs"))]
fn verbs_transport(_: &Common) -> Result<Arc<dyn Transport>> {
    bail!("{}", smart_core::backend::verbs::NOT_BUILT)
}

fn resolve(c: &Common) -> Result<Setup> {
    let mut smart = SmartConfig::parse(&c.smart).map_err(|e| anyhow::anyhow!("--smart: {e}"))?;
    smart.doorbells = parse_doorbells(&c.doorbells)?;
    smart.shared_cq = c.cq == CqArg::Shared;
    if let Some(p) = &c.qp_policy {
        smart.qp_policy = p.parse().map_err(|e| anyhow::anyhow!("--qp-policy: {e}"))?;
    }
    if !matches!(c.transport, TransportArg::Verbs) && (c.device.is_some() || c.gid_index.is_some()) {
        bail!("--device and --gid-index apply to --transport verbs only");
    }
    if c.threads == 0 || c.coroutines == 0 {
        bail!("--threads and --coroutines must be at least 1");
    }
    if !(c.duration > 0.0 && c.duration.is_finite() && c.warmup >= 0.0 && c.warmup.is_finite()) {
        bail!("--duration must be positive and --warmup non-negative");
    }
    let transport: Arc<dyn Transport> = if c.blades.is_empty() {
        if let TransportArg::Verbs = c.transport {
            bail!("--transport verbs needs --blades");
        }
        Arc::new(EmbeddedTransport::new(c.embedded_blades, c.blade_size).context("creating the embedded blade")?)
    } else {
        match c.transport {
            TransportArg::Tcp => Arc::new(TcpTransport::connect(&c.blades).context("connecting to the memory blades")?),
            TransportArg::Verbs => verbs_transport(c)?,
        }
    };
    let run = RunConfig {
        threads: c.threads,
        coroutines: c.coroutines,
        duration: Duration::from_secs_f64(c.duration),
        warmup: Duration::from_secs_f64(c.warmup),
        runtime: RuntimeConfig { smart, ..RuntimeConfig::default() },
        progress: !c.quiet,
    };
    Ok(Setup { transport, run })
}

/// The fields every result record carries, then the bench's own.
fn record(bench: &str, app: &str, workload: &str, s: &Setup, r: &RunReport, extra: Value) -> Result<Value> {
    let flags = s.run.runtime.smart.flags();
    let mut v = json!({
        "bench": bench,
        "app": app,
        "workload": workload,
        "transport": s.transport.name(),
        "blades": s.transport.blades().len(),
        "threads": s.run.threads,
        "coroutines": s.run.coroutines,
        "smart": {
            "thd_res_alloc": flags[0],
            "work_req_throt": flags[1],
            "conflict_avoid": flags[2],
            "spec_lookup": flags[3],
        },
        "qp_policy": s.run.runtime.smart.qp_policy.to_string(),
        "cq": if s.run.runtime.smart.shared_cq { "shared" } else { "per-thread" },
        "doorbells": format!("{}:{}", s.run.runtime.smart.doorbells.low_latency, s.run.runtime.smart.doorbells.medium),
        "doorbell_rings": s.transport.doorbell_rings(),
        "first_error": r.first_error,
    });
    let obj = v.as_object_mut().expect("object");
    for val in [serde_json::to_value(r.record())?, extra] {
        if let Value::Object(m) = val {
            obj.extend(m);
        }
    }
    Ok(v)
}

fn finish(c: &Common, rec: &Value, r: &RunReport) -> Result<()> {
    println!("{}", r.summary_line());
    if let Some(e) = &r.first_error {
        eprintln!("compute-blade: {} coroutine(s) failed; first: {e}", r.errors);
    }
    if let Some(p) = &c.json {
        std::fs::write(p, serde_json::to_string_pretty(rec)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn micro_cmd(a: &MicroArgs) -> Result<bool> {
    let s = resolve(&a.common)?;
    let op = match a.op {
        OpArg::Read => Opcode::Read,
        OpArg::Write => Opcode::Write,
        OpArg::Cas => Opcode::Cas,
        OpArg::Faa => Opcode::Faa,
    };
    let size = u32::try_from(a.size).context("--size must fit 32 bits")?;
    let m = MicroConfig { op, size, batch: a.batch, contended: a.contended, area: a.area };
    let rep = micro::run(&*s.transport, &s.run, &m)?;
    let name = format!("{:?}", a.op).to_lowercase();
    let workload =
        format!("{name}-{}{}", if op.is_atomic() { 8 } else { size }, if a.contended { "-contended" } else { "" });
    let extra = json!({
        "op": name,
        "size": if op.is_atomic() { 8 } else { size },
        "batch": a.batch,
        "contended": a.contended,
        "increments": rep.increments,
        "counter": rep.counter,
        "violations": rep.violations,
    });
    let rec = record("micro", "micro", &workload, &s, &rep.run, extra)?;
    finish(&a.common, &rec, &rep.run)?;
    if rep.violations > 0 {
        eprintln!("compute-blade: VIOLATION: counter is {} but {} increments completed", rep.counter, rep.increments);
    }
    Ok(rep.violations == 0 && rep.run.first_error.is_none())
}

fn ycsb_cmd(a: &YcsbArgs) -> Result<bool> {
    if let AppArg::Sherman = a.app {
        bail!("--app sherman: the Sherman B+tree is not built yet; use --app race");
    }
    let workload = ycsb::Workload::parse(&a.workload).map_err(anyhow::Error::msg)?;
    let zipf_ok = a.zipf > 0.0 && (a.zipf - 1.0).abs() > 1e-9 && a.zipf.is_finite();
    if !a.uniform && !zipf_ok {
        bail!("--zipf must be a positive number other than 1 (the paper uses 0.99)");
    }
    if a.keys == 0 {
        bail!("--keys must be at least 1");
    }
    let s = resolve(&a.common)?;
    let chooser = if a.uniform { ycsb::KeyChooser::Uniform(a.keys) } else { ycsb::KeyChooser::zipfian(a.keys, a.zipf) };
    let y = ycsb::driver::YcsbConfig {
        keys: a.keys,
        workload,
        chooser,
        key_size: a.key_size,
        value_size: a.value_size,
        verify: a.verify,
        capacity: a.capacity.unwrap_or(a.keys),
    };
    let rep = ycsb::driver::run_race(&*s.transport, &s.run, &y)?;
    let extra = json!({
        "keys": a.keys,
        "distribution": if a.uniform { "uniform".to_string() } else { format!("zipf-{}", a.zipf) },
        "key_size": a.key_size,
        "value_size": a.value_size,
        "load_s": rep.load_s,
        "verify": a.verify,
        "violations": rep.violations,
        "capacity": y.capacity,
        "duplicates": rep.duplicates,
        "race_depth": rep.shape.depth,
        "race_subtables": rep.shape.subtables,
        "race_splits": rep.shape.splits,
        "race_subtables_per_blade": rep.shape.per_blade,
        "race_doublings": rep.resize.doublings,
        "race_split_s": rep.resize.split_ns as f64 / 1e9,
        "race_waits": rep.resize.waits,
        "race_dir_refreshes": rep.resize.refreshes,
        "spec_hits": rep.spec.0,
        "spec_misses": rep.spec.1,
        "spec_hit_rate": if rep.spec.0 + rep.spec.1 > 0 { rep.spec.0 as f64 / (rep.spec.0 + rep.spec.1) as f64 } else { 0.0 },
    });
    let rec = record("ycsb", "race", workload.name, &s, &rep.run, extra)?;
    finish(&a.common, &rec, &rep.run)?;
    if rep.violations > 0 {
        eprintln!("compute-blade: VIOLATION: {} values were wrong or lost", rep.violations);
    }
    Ok(rep.violations == 0 && rep.run.first_error.is_none())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let ok = match &cli.cmd {
        Cmd::Micro(a) => micro_cmd(a)?,
        Cmd::Ycsb(a) => ycsb_cmd(a)?,
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
