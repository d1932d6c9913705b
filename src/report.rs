//! Reporting a run: the summary line, the result record (JSON) with the
//! fields every record carries, then the subcommand's own.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use smart_bench::harness::RunReport;
use smart_core::Transport;

use crate::config::Session;

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
    let mut v = json!({
        "bench": what.bench,
        "app": what.app,
        "workload": what.workload,
        "transport": t.name(),
        "blades": t.blades().len(),
        "threads": s.run.threads,
        "coroutines": s.run.coroutines,
        "smart": {
            "thd_res_alloc": flags[0],
            "work_req_throt": flags[1],
            "conflict_avoid": flags[2],
            "spec_lookup": flags[3],
        },
        "qp_policy": smart.qp_policy.to_string(),
        "cq": if smart.shared_cq { "shared" } else { "per-thread" },
        "doorbells": format!("{}:{}", smart.doorbells.low_latency, smart.doorbells.medium),
        "doorbell_rings": t.doorbell_rings(),
        "seed": s.run.seed,
        "interrupted": r.interrupted,
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
        eprintln!("compute-blade: {} coroutine(s) failed; first: {e}", r.errors);
    }
    write(s, rec)
}

/// Writes the record where `--json` says (if it does).
///
/// # Errors
/// If the record cannot be written.
pub fn write(s: &Session, rec: &Value) -> Result<()> {
    if let Some(p) = &s.json {
        std::fs::write(p, serde_json::to_string_pretty(rec)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
