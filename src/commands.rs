//! The subcommands: each runs its resolved job and reports; nothing here
//! parses or validates flags.

use anyhow::Result;
use race_ht::RaceHt;
use serde_json::json;
use smart_bench::micro::{self, MicroConfig};
use smart_core::{KvIndex, Transport};

use crate::config::{App, Session, YcsbJob};
use crate::report::{self, Subject};

/// How a subcommand ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It ran to its end with no violation or failed coroutine.
    Clean,
    /// Violations or failed coroutines (reported on stderr and in the record).
    Failed,
    /// A signal stopped it; the record holds what ran.
    Interrupted,
}

impl Outcome {
    /// The process's exit status: 0, 1, or 130 (as after SIGINT).
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Clean => 0,
            Outcome::Failed => 1,
            Outcome::Interrupted => 130,
        }
    }

    fn of(clean: bool, interrupted: bool) -> Outcome {
        match (clean, interrupted) {
            (false, _) => Outcome::Failed,
            (true, true) => Outcome::Interrupted,
            (true, false) => Outcome::Clean,
        }
    }
}

/// `compute-blade micro`.
///
/// # Errors
/// Set-up failures; a record that cannot be written.
pub fn micro(s: &Session, t: &dyn Transport, m: &MicroConfig) -> Result<Outcome> {
    let rep = micro::run(t, &s.run, m)?;
    let name = format!("{:?}", m.op).to_lowercase();
    let workload = format!("{name}-{}{}", m.size, if m.contended { "-contended" } else { "" });
    let extra = json!({
        "op": name,
        "size": m.size,
        "batch": m.batch,
        "contended": m.contended,
        "increments": rep.increments,
        "counter": rep.counter,
        "violations": rep.violations,
    });
    let rec = report::record(Subject { bench: "micro", app: "micro", workload: &workload }, s, t, &rep.run, extra)?;
    report::finish(s, &rec, &rep.run)?;
    if rep.violations > 0 {
        eprintln!("compute-blade: VIOLATION: counter is {} but {} increments completed", rep.counter, rep.increments);
    }
    Ok(Outcome::of(rep.violations == 0 && rep.run.first_error.is_none(), rep.run.interrupted))
}

/// `compute-blade ycsb`.
///
/// # Errors
/// Set-up, load or verification failures; a record that cannot be written.
pub fn ycsb(s: &Session, t: &dyn Transport, job: &YcsbJob) -> Result<Outcome> {
    match job.app {
        App::Race => ycsb_on::<RaceHt>(s, t, job),
    }
}

/// YCSB on index `I`: its shape and counters go into the record under its
/// name.
fn ycsb_on<I: KvIndex>(s: &Session, t: &dyn Transport, job: &YcsbJob) -> Result<Outcome>
where
    I::Error: Send + Sync,
{
    let y = &job.y;
    let rep = match ycsb::bench::run::<I>(t, &s.run, y) {
        Ok(rep) => rep,
        Err(e @ ycsb::bench::YcsbError::Interrupted(_)) => {
            eprintln!("compute-blade: {e}; no run, no record");
            return Ok(Outcome::Interrupted);
        }
        Err(e) => return Err(e.into()),
    };
    let index = report::merged([serde_json::to_value(&rep.shape)?, serde_json::to_value(&rep.stats)?]);
    let extra = json!({
        "table": y.table,
        "table_existed": rep.existed,
        "keys": y.keys,
        "distribution": job.distribution,
        "key_size": y.key_size,
        "value_size": y.value_size,
        "load_s": rep.load_s,
        "verify": y.verify,
        "violations": rep.violations,
        "capacity": y.capacity,
        "duplicates": rep.duplicates,
        I::APP: index,
    });
    let what = Subject { bench: "ycsb", app: I::APP, workload: y.workload.name };
    let rec = report::record(what, s, t, &rep.run, extra)?;
    report::finish(s, &rec, &rep.run)?;
    if rep.violations > 0 {
        eprintln!("compute-blade: VIOLATION: {} values were wrong or lost", rep.violations);
    }
    Ok(Outcome::of(rep.violations == 0 && rep.run.first_error.is_none(), rep.run.interrupted))
}
