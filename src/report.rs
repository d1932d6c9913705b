//! Reporting a run: the summary line, the result record (JSON) with the
//! fields every record carries, then the subcommand's own.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use smart_bench::harness::RunReport;
use smart_core::Transport;

use crate::config::Session;

/// `--version`: the crate version and the git commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("SMART_RS_COMMIT"), ")");

/// The kernel's clocksource (`tsc`, `kvm-clock`, `hpet`, ...), if sysfs
/// tells.
pub fn clocksource() -> Option<String> {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
}

/// This host's name (the kernel's, else `HOSTNAME`, else "unknown"): for
/// records and for what a compute blade says of itself in etcd.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Clocksources that user space cannot read without a system call (and a
/// device read, under emulation): every clock read of the runtimes is then
/// one, which slows them down (see the guide's "Soft-RoCE in a VM", "What
/// the script does").
pub const SLOW_CLOCKSOURCES: [&str; 5] = ["hpet", "acpi_pm", "pit", "jiffies", "refined-jiffies"];

/// The warning for a slow clocksource `c`, if it is one.
pub fn slow_clock_warning(c: &str) -> Option<String> {
    SLOW_CLOCKSOURCES.contains(&c).then(|| {
        format!(
            "compute-blade: the kernel keeps time with {c}, not the TSC: every clock read is a system call, \
             and throughput will be lower (boot with clocksource=tsc: see the guide's 'Soft-RoCE in a VM')"
        )
    })
}

/// Where a record came from: the command line, the build (commit and
/// features), the host, its cores and clocksource, the date (UTC), and the
/// hash of the cluster file the launcher ran it from
/// (`SMART_RS_CLUSTER_SHA256`, set by `scripts/cluster`; null when run by
/// hand).
pub fn provenance() -> Value {
    let host = host_name();
    let mut features = Vec::new();
    if cfg!(feature = "verbs") {
        features.push("verbs");
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "commit": env!("SMART_RS_COMMIT"),
        "version": env!("CARGO_PKG_VERSION"),
        "features": features,
        "host": host,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "clocksource": clocksource(),
        "pid": std::process::id(),
        "date": utc_date(now.as_secs()),
        "cluster_file_sha256": std::env::var("SMART_RS_CLUSTER_SHA256").ok(),
    })
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_date(secs: u64) -> String {
    // Days to civil date (Hinnant's algorithm, proleptic Gregorian).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// What a record is about.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// "micro", "ycsb".
    pub bench: &'a str,
    /// "micro", "race".
    pub app: &'a str,
    /// The workload's name.
    pub workload: &'a str,
}

/// The record: the fields every record carries, the run's measured fields,
/// then `extra` (an object).
///
/// # Errors
/// If a part does not serialize.
pub fn record(what: Subject<'_>, s: &Session, t: &dyn Transport, r: &RunReport, extra: Value) -> Result<Value> {
    let smart = &s.run.runtime.smart;
    let flags = smart.flags();
    let sim = t.simulation().map(|s| s.summary());
    // A simulation's compute blades run in one process: `threads` is per
    // compute blade, as in the records of real compute blades.
    let threads = sim.as_ref().map_or(s.run.threads, |x| x.threads_per_compute_blade);
    let mut v = json!({
        "bench": what.bench,
        "app": what.app,
        "workload": what.workload,
        "transport": t.name(),
        "blades": t.blades().len(),
        "threads": threads,
        "coroutines": s.run.coroutines,
        "smart": {
            "thd_res_alloc": flags[0],
            "work_req_throt": flags[1],
            "conflict_avoid": flags[2],
            "conflict_avoid_parts": smart.conflict_avoid.map(|bc| bc.parts().name()),
            "spec_lookup": flags[3],
        },
        "qp_policy": smart.qp_policy.to_string(),
        "cq": if smart.shared_cq { "shared" } else { "per-thread" },
        "doorbells": format!("{}:{}", smart.doorbells.low_latency, smart.doorbells.medium),
        "doorbell_rings": t.doorbell_rings(),
        "seed": s.run.seed,
        "idle_us": s.run.idle.as_secs_f64() * 1e6,
        "interrupted": r.interrupted,
        "first_error": r.first_error,
    });
    if let Some(sim) = sim {
        v["sim"] = serde_json::to_value(sim)?;
    }
    let obj = v.as_object_mut().expect("object");
    for val in [serde_json::to_value(r.record())?, extra] {
        if let Value::Object(m) = val {
            obj.extend(m);
        }
    }
    Ok(v)
}

/// Merges objects (later keys win), for an index's shape and counters.
pub fn merged(parts: impl IntoIterator<Item = Value>) -> Value {
    let mut out = Map::new();
    for p in parts {
        if let Value::Object(m) = p {
            out.extend(m);
        }
    }
    Value::Object(out)
}

/// Prints the summary line and any failure, and writes the record.
///
/// # Errors
/// If the record cannot be written.
pub fn finish(s: &Session, rec: &Value, r: &RunReport) -> Result<()> {
    println!("{}", r.summary_line());
    if let Some(e) = &r.first_error {
        eprintln!("compute-blade: during the timed run, {} coroutine(s) failed; first: {e}", r.errors);
    }
    write(s, rec)
}

/// Writes the record where `--json` says (if it does).
///
/// # Errors
/// If the record cannot be written.
pub fn write(s: &Session, rec: &Value) -> Result<()> {
    match &s.json {
        Some(p) => emit(rec, Some(p)),
        None => Ok(()),
    }
}

/// Writes `rec`, with this process's [`provenance`] unless it has one, to
/// `to` (standard output when `None`).
///
/// # Errors
/// If the record cannot be written.
pub fn emit(rec: &Value, to: Option<&std::path::Path>) -> Result<()> {
    let mut rec = rec.clone();
    if let Some(o) = rec.as_object_mut() {
        o.entry("provenance").or_insert_with(provenance);
    }
    let text = serde_json::to_string_pretty(&rec)? + "\n";
    match to {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Exit status of a usage error: a flag's value is wrong (as clap's own).
pub const EXIT_USAGE: i32 = 2;
/// Exit status of a failure: the run could not do its work.
pub const EXIT_FAILURE: i32 = 1;

/// Reports `err` the way a user reads it and exits with `code`: the message
/// chain on one line (`binary: error: what: why`), never a backtrace unless
/// `verbose` (then anyhow's full report, with the backtrace when one was
/// captured, which `--verbose` turns on). A panic still prints Rust's own
/// report.
pub fn fail(binary: &str, err: &anyhow::Error, verbose: bool, code: i32) -> ! {
    if verbose {
        eprintln!("{binary}: error: {err:?}");
    } else {
        eprintln!("{binary}: error: {err:#}");
    }
    if code == EXIT_USAGE {
        eprintln!("\nFor more information, try '--help'.");
    }
    std::process::exit(code)
}

/// Turns on backtrace capture for errors when `verbose` (`--verbose`); call
/// first in `main`, before any thread starts.
pub fn verbose_errors(verbose: bool) {
    if verbose {
        std::env::set_var("RUST_LIB_BACKTRACE", "1");
    }
}

#[cfg(test)]
mod tests {
    use super::{slow_clock_warning, utc_date};

    #[test]
    fn only_clocksources_read_by_system_call_are_warned_about() {
        for c in ["hpet", "acpi_pm", "jiffies"] {
            assert!(slow_clock_warning(c).is_some_and(|w| w.contains(c)), "{c}");
        }
        for c in ["tsc", "kvm-clock", "arch_sys_counter", "hyperv_clocksource_tsc_page"] {
            assert_eq!(slow_clock_warning(c), None, "{c}");
        }
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_date(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_date(1_795_444_199), "2026-11-23T14:29:59Z");
    }
}
