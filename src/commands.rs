//! The subcommands: each runs its resolved job and reports; nothing here
//! parses or validates flags.

use std::sync::Arc;

use anyhow::{Context, Result};
use ford_dtx::recovery::Which;
use ford_dtx::Abort;
use race_ht::RaceHt;
use serde_json::json;
use sherman_bt::ShermanBt;
use smallbank_tatp::{Audited, Workload};
use smart_bench::micro::{self, MicroConfig};
use smart_core::{KvIndex, Transport};

use crate::cli::TableAction;
use crate::config::{App, Blades, DtxJob, DtxWorkload, RebuildJob, RecoverJob, Session, TableJob, YcsbJob};
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

/// Checks, before a subcommand reads anything, that remote memory blades
/// are, in the order listed, the set they were when first used together
/// ([`smart_core::Ctx::check_blade_set`]), and records the set on blades
/// used for the first time; so do simulated blades kept in a
/// `--sim-blade-dir` (one may be lost and replaced by a fresh one:
/// `--sim-fault blade-lost@MS:B`). Embedded blades, and simulated ones
/// without a directory, are made by this process and need no check.
///
/// # Errors
/// A blade restarted without its backing file, replaced, listed in another
/// order, or from another set, named with its address; verb errors.
pub fn check_blade_set(s: &Session, t: &dyn Transport) -> Result<()> {
    let addrs: Vec<String> = match &s.blades {
        Blades::Remote { addrs, .. } => addrs.clone(),
        Blades::Simulated(cfg) => match &cfg.blade_dir {
            Some(d) => (0..cfg.memory_blades)
                .map(|b| format!("simulated, {}", smart_sim::blade_image(d, b).display()))
                .collect(),
            None => return Ok(()),
        },
        Blades::Embedded { .. } => return Ok(()),
    };
    let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
    let ctx = rt.ctx();
    rt.block_on(async move { ctx.check_blade_set().await }).map_err(|e| match e {
        smart_core::Error::BladeSet { blade, what } => {
            let at = addrs.get(usize::from(blade)).map_or(String::new(), |a| format!(" ({a})"));
            // A lost blade whose FORD databases' copies can come back.
            let hint = if what.contains("restarted without its backing file or replaced") {
                " (the FORD databases' copies and catalogs it held can be rebuilt on a fresh blade in its place: \
                 `compute-blade rebuild --lost I[,J…]`, see the guide's Operations, \"A lost memory blade\")"
            } else {
                ""
            };
            anyhow::anyhow!("memory blade {blade}{at} {what}{hint}")
        }
        e => anyhow::Error::new(e).context("checking the memory blades"),
    })
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
        "phase_ms": m.phase_ms,
        "depth": m.depth,
        "latency_every": m.latency_every,
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
        App::Sherman => ycsb_on::<ShermanBt>(s, t, job),
    }
}

/// YCSB on index `I`: its shape and counters go into the record under its
/// name.
fn ycsb_on<I: KvIndex>(s: &Session, t: &dyn Transport, job: &YcsbJob) -> Result<Outcome>
where
    I::Error: Send + Sync,
{
    let y = &job.y;
    let heap = || -> Result<u64> {
        let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
        let ctx = rt.ctx();
        Ok(rt.block_on(async move { heap_used(&ctx).await })?.iter().sum())
    };
    let heap_before = heap()?;
    let rep = match ycsb::bench::run::<I>(t, &s.run, y) {
        Ok(rep) => rep,
        Err(e @ ycsb::bench::YcsbError::Interrupted(_)) => {
            eprintln!("compute-blade: {e}; no run, no record");
            return Ok(Outcome::Interrupted);
        }
        Err(e) => return Err(e.into()),
    };
    let index = report::merged([serde_json::to_value(&rep.shape)?, serde_json::to_value(&rep.stats)?]);
    let heap_after = heap()?;
    let extra = json!({
        "blade_heap_bytes_before": heap_before,
        "blade_heap_bytes_after": heap_after,
        "table": y.table,
        "table_existed": rep.existed,
        "table_state": rep.state.as_str(),
        "keys": y.keys,
        "distribution": job.distribution,
        "key_size": y.key_size,
        "key_format": y.key_format.as_str(),
        "value_size": y.value_size,
        "load_s": rep.load_s,
        "load_only": rep.run.is_none(),
        "verify": y.verify,
        "violations": rep.violations,
        "lost": rep.lost,
        "lost_keys": rep.lost_keys,
        "resurrected": rep.resurrected,
        "capacity": y.capacity,
        "duplicates": rep.duplicates,
        I::APP: index,
    });
    if rep.lost > 0 {
        eprintln!(
            "compute-blade: VIOLATION: {} keys missing or holding another key's value; first: {:?}",
            rep.lost, rep.lost_keys
        );
    }
    if rep.resurrected > 0 {
        eprintln!("compute-blade: VIOLATION: {} keys the run deleted are still there", rep.resurrected);
    }
    let what = Subject { bench: "ycsb", app: I::APP, workload: y.workload.name };
    let Some(run) = &rep.run else {
        // --load-only: no timed run, so no run fields.
        let mut rec = json!({ "bench": "ycsb", "app": I::APP, "workload": y.workload.name, "transport": t.name(),
            "blades": t.blades().len(), "threads": s.run.threads, "coroutines": s.run.coroutines, "seed": s.run.seed });
        if let (Some(r), serde_json::Value::Object(e)) = (rec.as_object_mut(), extra) {
            r.extend(e);
        }
        println!("loaded {} keys into {:?} in {:.1}s ({})", y.keys, y.table, rep.load_s, rep.state.as_str());
        if y.verify {
            println!("{}", verified_line(None, rep.read_back, rep.violations, rep.duplicates));
        }
        report::write(s, &rec)?;
        return Ok(Outcome::of(rep.violations == 0, false));
    };
    let rec = report::record(what, s, t, run, extra)?;
    report::finish(s, &rec, run)?;
    if y.verify {
        let keys = if run.interrupted { 0 } else { rep.read_back };
        println!("{}", verified_line(Some(run.ops), keys, rep.violations, rep.duplicates));
    }
    if rep.violations > rep.lost + rep.resurrected {
        eprintln!(
            "compute-blade: VIOLATION: {} values were wrong or lost",
            rep.violations - rep.lost - rep.resurrected
        );
    }
    Ok(Outcome::of(rep.violations == 0 && run.first_error.is_none(), run.interrupted))
}

/// The human line of a `--verify`: what was checked, and what was found.
/// `ops`: the timed run's operations, each checked as it completed (`None`
/// without a run); `keys`: keys read back after it (0 when skipped).
fn verified_line(ops: Option<u64>, keys: u64, violations: u64, duplicates: u64) -> String {
    let mut what = Vec::new();
    if let Some(n) = ops {
        what.push(format!("{} ops as they completed", group(n)));
    }
    if keys > 0 {
        what.push(format!("{} keys read back (each present once, holding its own value)", group(keys)));
    } else if ops.is_some() {
        what.push("no read-back (interrupted)".to_string());
    }
    let dup = if duplicates > 0 { format!(" ({duplicates} keys stored twice)") } else { String::new() };
    format!("verified {}: {violations} violations{dup}", what.join(" and "))
}

/// `n` with thin groups of three digits: 1,234,567.
fn group(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `compute-blade smallbank` and `compute-blade tatp`.
///
/// # Errors
/// Set-up, recovery, load or audit failures; a record that cannot be
/// written.
/// `absent`: the blades `t` goes without ([`crate::coord::absent`]).
pub fn dtx(s: &Session, t: Arc<dyn Transport>, job: &DtxJob, absent: &[u16], joining: &[u16]) -> Result<Outcome> {
    match &job.workload {
        DtxWorkload::SmallBank(w) => dtx_on(s, t, job, w, true, (absent, joining)),
        DtxWorkload::Tatp(w) => dtx_on(s, t, job, w, false, (absent, joining)),
    }
}

fn audit_line(a: &Audited) {
    let d = &a.db;
    let mut line = format!(
        "audit: {} violations | rows per table {:?} | locks held {} | replica mismatches {} | torn {}",
        a.violations, d.live, d.locks_held, d.replica_mismatches, d.torn
    );
    if d.gaps > 0 {
        line += &format!(" | rows after a gap {}", d.gaps);
    }
    let w = d.chain_words;
    if w.differ + w.missing > 0 {
        line += &format!(" | backup chain words differing {}, missing {}", w.differ, w.missing);
    }
    let m = &d.mirror;
    if m.present == Some(false) {
        line += &format!(
            " | no mirror on memory blades {} (a database made before mirrors were kept there: `recover --repair` \
             writes them)",
            ford_dtx::rebuild::blade_list(&m.missing_on)
        );
    }
    if m.violations() > 0 {
        line += &format!(
            " | mirrors: catalog {}, {} registrations missing (`recover --repair` writes them anew)",
            if m.catalog_differs { "differs or damaged" } else { "same" },
            m.registrations_missing
        );
    }
    match (a.balances, a.expected, a.ledger_txns, &a.money_unchecked) {
        (Some(b), _, _, Some(_)) => line += &format!(" | balances {b} cents (money not checked: see below)"),
        (Some(b), Some(e), Some(n), None) => {
            line += &format!(" | balances {b} cents, initial + ledgers {e} cents ({n} ledger transactions)");
        }
        _ => {}
    }
    println!("{line}");
    if let Some(why) = &a.money_unchecked {
        println!("audit: money not checked: {why}; the other checks ran");
    }
    if !a.running.is_empty() {
        let who: Vec<String> = a.running.iter().map(|(s, p)| format!("compute blade {s} (pid {p})")).collect();
        println!(
            "audit: {} still running when the audit stopped waiting (--audit-wait): its transactions in flight \
             (locks held, replicas part-written, records mid-write) are reported above, not counted; \
             `--audit-only` once it ends checks everything",
            who.join(", ")
        );
    }
    if !a.loaded {
        println!(
            "audit: the database's load never completed (it was interrupted): it lacks rows; the next smallbank or \
             tatp run on it loads the rest"
        );
    }
    if w.missing > 0 {
        println!(
            "audit: {} backup chain words are missing (a database made before chains were kept on every replica, or \
             an extension cut short): `compute-blade recover --repair` fills them in",
            w.missing
        );
    }
    for h in &d.held {
        let owner = h.owner.map_or("not a lock word".to_string(), |o| {
            format!("compute blade {} thread {} coroutine {}", o.blade, o.thread, o.coroutine)
        });
        println!(
            "audit: lock held on table {} key {} (state {}): word {:#x}, {owner}",
            h.table, h.key, h.state, h.word
        );
    }
}

fn dtx_on<W: Workload + Clone + 'static>(
    s: &Session,
    t: Arc<dyn Transport>,
    job: &DtxJob,
    w: &W,
    smallbank: bool,
    (absent, joining): (&[u16], &[u16]),
) -> Result<Outcome> {
    let name = w.name();
    // Under a coordinator: only on blades it trusts, as a member under a
    // lease whose lapse (or a later epoch) halts the transactions.
    // A run started while blades are out (after a failover, before their
    // rebuild) goes on without them, as the runs that failed over do.
    let mut entered = crate::coord::enter(s, &*t, absent)?;
    if let (true, Some(e)) = (job.audit_only, &entered) {
        let joining = e.v.config.joining();
        if !joining.is_empty() {
            anyhow::bail!(
                "{} joining the configuration (epoch {}): its copies are being made, and the audit compares every \
                 replica; audit once `compute-blade rebuild --online` took it in (run it again if it stopped)",
                ford_dtx::db::blades_are(&joining),
                e.v.config.epoch
            );
        }
    }
    if job.audit_only {
        let a = smallbank_tatp::workload::audit_waiting(&*t, &s.run, &job.cfg.db, smallbank, job.audit_wait)?;
        audit_line(&a);
        if let Some(p) = &s.json {
            let rec = json!({ "bench": name, "app": "ford", "workload": "audit-only", "db": job.cfg.db,
                "audit": a, "violations": a.violations });
            std::fs::write(p, serde_json::to_string_pretty(&rec)? + "\n")?;
        }
        if a.violations > 0 {
            eprintln!("compute-blade: VIOLATION: the audit of {:?} failed", job.cfg.db);
        }
        return Ok(Outcome::of(a.violations == 0, false));
    }
    // Under a coordinator, a failover that leaves blade 0 in is followed by
    // the next phase: the same workload, in the new configuration epoch,
    // over the other blades (backups promoted), for the time left.
    let (mut phase_t, mut run_cfg) = (t.clone(), s.run.clone());
    // Started while blades are out: every registration of an earlier epoch
    // is settled before this one's first transaction (a failover may be
    // settling them right now).
    let settle0 = match &entered {
        Some(e) if !absent.is_empty() || !joining.is_empty() => crate::coord::earlier_tags(&e.c, &e.v)?,
        Some(e) => {
            settle_mirror_leftovers(s, &*t, e, &job.cfg)?;
            Vec::new()
        }
        None => Vec::new(),
    };
    let (mut lost, mut joins, mut settle) = (absent.to_vec(), joining.to_vec(), settle0);
    let mut total: Option<smallbank_tatp::DtxReport> = None;
    let mut failovers = Vec::new();
    // When the last phase's measured time ended (for the gap to the next).
    let mut ended: Option<std::time::Instant> = None;
    loop {
        let member = match &entered {
            Some(e) => Some(crate::coord::join(e, format!("{name} on database {:?}", job.cfg.db), job.cfg.lease)?),
            None => None,
        };
        let watchdog = match &member {
            Some(m) => Some(crate::coord::Watchdog::start(
                s,
                phase_t.clone(),
                m.halt.clone(),
                std::time::Duration::from_millis(500),
                lost.clone(),
                entered.as_ref().filter(|_| lost.contains(&0) || joins.contains(&0)).map(|e| crate::coord::Reap {
                    s: s.clone(),
                    c: e.c.clone(),
                    v: e.v.clone(),
                    db: job.cfg.db.clone(),
                    joining: joins.clone(),
                    lease: job.cfg.lease.max(std::time::Duration::from_secs(1)),
                }),
            )?),
            None => None,
        };
        let cfg = smallbank_tatp::DtxConfig {
            halt: member.as_ref().map(|m| m.halt.clone()),
            fence_tag: member.as_ref().map(|m| m.fence_tag.clone()),
            fence_recorded: member.as_ref().map(|m| m.m.recorded_tag()),
            lost: lost.clone(),
            joining: joins.clone(),
            settle: settle.clone(),
            ..job.cfg.clone()
        };
        let result = smallbank_tatp::run(phase_t.clone(), &run_cfg, w, &cfg);
        let now = std::time::Instant::now();
        let dead = watchdog.and_then(crate::coord::Watchdog::stop);
        let (rep, error) = match result {
            Ok(rep) => {
                let error = rep.run.first_error.clone();
                (Some(rep), error)
            }
            Err(e @ smallbank_tatp::WorkloadError::Interrupted(_)) if total.is_none() => {
                eprintln!("compute-blade: {e}; no run, no record");
                return Ok(Outcome::Interrupted);
            }
            Err(e) => (None, Some(e.to_string())),
        };
        // The gap since the last phase's measured time ended.
        let gap = match (&rep, ended) {
            (Some(r), Some(t0)) => (now.duration_since(t0).as_secs_f64() - r.run.duration_s).max(0.0),
            _ => 0.0,
        };
        if let (Some(f), true) = (failovers.last_mut(), rep.is_some()) {
            let f: &mut serde_json::Value = f;
            f["resumed_after_s"] = json!(gap);
            if s.run.progress {
                let cause = f["cause"].as_str().unwrap_or("failover");
                eprintln!("{cause}: transactions resumed {gap:.2} s after the measured time stopped");
            }
        }
        ended = Some(now);
        let merge = |total: &mut Option<smallbank_tatp::DtxReport>, rep: Option<smallbank_tatp::DtxReport>| match (
            total.as_mut(),
            rep,
        ) {
            (Some(a), Some(b)) => a.then(b, gap),
            (None, Some(b)) => *total = Some(b),
            (_, None) => {}
        };
        let (Some(e), Some(m)) = (entered.as_mut(), member) else {
            // No coordinator: as before.
            match rep {
                Some(rep) => merge(&mut total, Some(rep)),
                None => return Err(anyhow::anyhow!(error.unwrap_or_default())),
            }
            break;
        };
        let Some(err) = error else {
            record_order(s, &*phase_t, e, &job.cfg.db);
            if let Err(x) = m.m.leave() {
                eprintln!("note: leaving the coordinator: {x} (the membership's lease runs out by itself)");
            }
            merge(&mut total, rep);
            break;
        };
        let measured =
            total.as_ref().map_or(0.0, |t| t.run.duration_s) + rep.as_ref().map_or(0.0, |r| r.run.duration_s + gap);
        let fo = coordinated_failure(s, &*phase_t, e, &m, &err, dead);
        let cause = fo.as_ref().map(|f| f.cause);
        let left = s.run.duration.as_secs_f64() - measured;
        let epoch = fo.as_ref().map(|f| f.v.config.epoch);
        let mut fo_spare = None;
        let next = match fo {
            // A phase that failed before it ran (its fence tag not
            // recorded before the configuration moved on) goes on too, once
            // an earlier one ran.
            Some(fo) if left > 0.5 && (rep.is_some() || total.is_some()) => {
                let r = go_on(s, &*phase_t, &fo, &job.cfg);
                fo_spare = Some(fo);
                r
            }
            Some(fo) => Err(anyhow::anyhow!(
                "transactions stop ({}): {}",
                if rep.is_none() { "the run failed before it ran" } else { "no time left" },
                crate::coord::rebuild_hint(s, &fo.removed())
            )),
            None => Err(anyhow::anyhow!("")),
        };
        match next {
            Ok(GoOn { transport: t2, removed, joining: joined, fenced }) => {
                // A spare listed: the compute blade that claims the copy
                // (one of those going on) starts it, a process of its own.
                match fo_spare.as_ref().map(|fo| crate::coord::start_spare_copy(s, &e.c, fo)) {
                    Some(Ok(Some(said))) => eprintln!("{said}"),
                    Some(Err(x)) => eprintln!("compute-blade: {x:#} (run `compute-blade rebuild --online` by hand)"),
                    _ => {}
                }
                failovers.push(json!({
                    "at_s": measured,
                    "cause": cause,
                    "error": err,
                    "epoch": epoch,
                    "removed": removed,
                    "joining": joined,
                    "fenced": fenced.len(),
                }));
                e.v = e.c.load()?.ok_or_else(|| anyhow::anyhow!("the configuration vanished from the coordinator"))?;
                if e.v.config.epoch != epoch.unwrap_or(0) {
                    // Moved again meanwhile: the next phase checks it.
                    eprintln!("note: the configuration moved on to epoch {} during the failover", e.v.config.epoch);
                }
                let _ = m.m.leave();
                // The blades where the configuration has them (a blade that
                // joined may listen elsewhere than --blades said).
                e.addrs = e.v.config.blades.iter().map(|b| b.addr.clone()).collect();
                (phase_t, lost, joins, settle) = (t2, removed, joined, fenced);
                run_cfg.duration = std::time::Duration::from_secs_f64(left);
                run_cfg.warmup = std::time::Duration::ZERO;
                merge(&mut total, rep);
            }
            Err(why) => {
                if !why.to_string().is_empty() {
                    eprintln!("compute-blade: {why:#}");
                }
                // It stops: its membership goes (its registration stays to
                // recovery, as after any failed run).
                let _ = m.m.leave();
                match rep {
                    Some(rep) => merge(&mut total, Some(rep)),
                    None => return Err(anyhow::anyhow!(err)),
                }
                break;
            }
        }
    }
    let rep = total.expect("a phase ran");
    let c = &rep.counts;
    let (attempted, committed) = (c.total_attempted(), c.total_committed());
    let secs = rep.run.duration_s.max(1e-9);
    let mut by_type = serde_json::Map::new();
    for (i, ty) in w.types().iter().enumerate() {
        let mut causes = serde_json::Map::new();
        for (k, a) in Abort::ALL.iter().enumerate() {
            causes.insert(a.name().into(), json!(c.aborts[i][k]));
        }
        by_type.insert(
            (*ty).into(),
            json!({ "attempted": c.attempted[i], "committed": c.committed[i], "aborts": causes }),
        );
    }
    let conflicts: u64 = Abort::ALL.iter().filter(|a| a.is_conflict()).map(|a| c.aborts_of(*a)).sum();
    let not_found = c.aborts_of(Abort::NotFound) + c.aborts_of(Abort::Exists);
    // n per d, 0 when there is no d.
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let rate = |n: u64| per(n, attempted);
    let wrs = rep.run.verbs.wrs;
    // Out of the configuration, a blade's copies are stale: the audit, which
    // compares every replica, waits for its rebuild.
    let audit_skipped = (job.audit && !(lost.is_empty() && joins.is_empty())).then(|| {
        if lost.is_empty() {
            format!(
                "not run: {} joining the configuration (its copies are being made); once `rebuild --online` took it \
                 in, run with --audit-only",
                ford_dtx::db::blades_are(&joins)
            )
        } else {
            format!(
                "not run: {} out of the configuration; {}, then run with --audit-only",
                ford_dtx::db::blades_are(&lost),
                crate::coord::rebuild_hint(s, &lost)
            )
        }
    });
    if let Some(why) = &audit_skipped {
        eprintln!("audit: {why}");
    }
    let audited = if job.audit && audit_skipped.is_none() && !rep.run.interrupted && rep.run.first_error.is_none() {
        let audit = smallbank_tatp::workload::audit_waiting(&*phase_t, &s.run, &job.cfg.db, smallbank, job.audit_wait);
        Some(audit.with_context(|| format!("auditing {:?} after the timed run", job.cfg.db))?)
    } else {
        None
    };
    let violations = audited.as_ref().map_or(0, |a| a.violations);
    let extra = json!({
        "db": job.cfg.db,
        "replicas": job.cfg.replicas,
        "retry_aborts": job.cfg.retry_aborts,
        "db_existed": rep.existed,
        "load_s": rep.load_s,
        "registry_slot": rep.slot,
        "coordinator": entered.as_ref().map(|e| json!({ "cluster": e.c.cluster(), "epoch": e.v.config.epoch })),
        "failovers": failovers,
        "recovered": rep.recovered,
        "committed": committed,
        "attempted": attempted,
        "committed_per_s": committed as f64 / secs,
        "attempted_per_s": attempted as f64 / secs,
        "abort_rate": rate(attempted - committed),
        "conflict_abort_rate": rate(conflicts),
        "not_found": not_found,
        "user_aborts": c.aborts_of(Abort::User),
        "mix": w.types().iter().zip(w.mix()).map(|(t, p)| ((*t).to_string(), json!(p))).collect::<serde_json::Map<_, _>>(),
        "aborts_by_type": by_type,
        "verbs_per_attempted": per(wrs, attempted),
        "verbs_per_committed": per(wrs, committed),
        "doorbells_per_committed": per(rep.run.verbs.doorbells, committed),
        "ford": rep.stats,
        "audit": audited,
        "audit_skipped": audit_skipped,
        "violations": violations,
    });
    let what = Subject { bench: name, app: "ford", workload: name };
    let rec = report::record(what, s, &*t, &rep.run, extra)?;
    report::finish(s, &rec, &rep.run)?;
    println!(
        "{name}: committed {:.0} txn/s, attempted {:.0} txn/s | abort rate {:.3} (conflicts {}, not found {}, user {}) | verbs/attempted {:.2} verbs/committed {:.2}",
        committed as f64 / secs,
        attempted as f64 / secs,
        rate(attempted - committed),
        conflicts,
        not_found,
        c.aborts_of(Abort::User),
        per(wrs, attempted),
        per(wrs, committed),
    );
    if let Some(a) = &audited {
        audit_line(a);
        if a.violations > 0 {
            eprintln!("compute-blade: VIOLATION: the audit of {:?} failed", job.cfg.db);
        }
    }
    Ok(Outcome::of(violations == 0 && rep.run.first_error.is_none(), rep.run.interrupted))
}

/// Says why a run under a coordinator failed: its membership halted it (a
/// later epoch, or its lease lapsed), or a memory blade failed, which it
/// then takes out of the configuration ([`crate::coord::fail_over`]).
/// Returns the failover, if one happened (by this compute blade's
/// proposal or another's).
fn coordinated_failure(
    s: &Session,
    t: &dyn Transport,
    e: &crate::coord::Entered,
    m: &crate::coord::Member,
    error: &str,
    dead: Option<(u16, String)>,
) -> Option<crate::coord::FailedOver> {
    let halted = m.m.why();
    let error = match (&dead, &halted) {
        (Some((b, why)), _) => format!("memory blade {b} failed a watchdog READ: {why}"),
        (None, Some(why)) => why.clone(),
        (None, None) => error.to_string(),
    };
    match crate::coord::fail_over(s, e, t, &error, dead.map(|d| d.0)) {
        Ok(Some(fo)) => {
            eprintln!("compute-blade: failover: {}", fo.said);
            Some(fo)
        }
        // No blade dead: the configuration may have moved (a blade joining
        // or taken in, one removed by hand), whether the membership saw it
        // first or the blades' fencing did.
        Ok(None) => match crate::coord::moved(s, e) {
            Ok(Some(fo)) => {
                eprintln!("compute-blade: {}", fo.said);
                Some(fo)
            }
            Ok(None) => {
                if let Some(why) = halted {
                    eprintln!("compute-blade: {why}");
                }
                None
            }
            Err(x) => {
                eprintln!("compute-blade: following the configuration failed: {x:#}");
                None
            }
        },
        Err(x) => {
            eprintln!("compute-blade: failover failed: {x:#}");
            None
        }
    }
}

/// The next phase after a failover (or another change of the
/// configuration).
struct GoOn {
    /// Over the blades in use, at the configuration's addresses.
    transport: Arc<dyn Transport>,
    /// The blades out of the configuration.
    removed: Vec<u16>,
    /// The blades joining it (written, not read).
    joining: Vec<u16>,
    /// The registrations settled.
    fenced: Vec<u64>,
}

/// After failover `fo` (or a change of the configuration `fo` describes):
/// a transport without the blades out of it, and the earlier epoch's
/// transactions settled (every compute blade of it was fenced: this one's
/// own registration too, whose in-flight transactions are settled as a
/// dead one's would be).
///
/// # Errors
/// A link other than TCP; the settling's errors.
fn go_on(s: &Session, t: &dyn Transport, fo: &crate::coord::FailedOver, d: &smallbank_tatp::DtxConfig) -> Result<GoOn> {
    let removed = fo.removed();
    let joining = fo.v.config.joining();
    let addrs: Vec<String> = fo.v.config.blades.iter().map(|b| b.addr.clone()).collect();
    let hint = || crate::coord::rebuild_hint(s, &removed);
    let t2 = s
        .blades
        .at(&addrs)
        .connect_without(&removed, Some(t.blades()))
        .with_context(|| format!("transactions stop; {}", hint()))?;
    let mut rt = smart_core::Runtime::new(&*t2, 0, s.run.runtime.clone())?;
    let ctx = rt.ctx();
    // The earlier epoch's registrations are in the registry it used: its
    // mirror while blade 0 was out or joining. Blade 0 taken in since is
    // settled as joining (written, its registry not read).
    let mut joins = joining.clone();
    let out = |b: &[u16], j: &[u16]| b.contains(&0) || j.contains(&0);
    if out(&d.lost, &d.joining) && !out(&removed, &joining) {
        joins.push(0);
    }
    let (name, lost, tags) = (d.db.clone(), removed.clone(), fo.fenced.clone());
    let wait_ms = ford_dtx::recovery::settle_wait_ms(d.lease);
    let rec = rt
        .block_on(async move {
            // Without blade 0, from the database's mirror on the first blade
            // read (its registry there).
            let Some(db) = ford_dtx::db::Db::open_view(&ctx, &name, &lost, &joins).await? else {
                return Err(ford_dtx::DtxError::Config(format!("database {name:?} is gone")));
            };
            ford_dtx::recovery::settle(&ctx, &db, &tags, wait_ms).await
        })
        .with_context(|| format!("transactions stop: settling the earlier epoch's transactions; {}", hint()))?;
    if s.run.progress {
        eprintln!(
            "{}: {} registration{} of the earlier epoch settled here ({})",
            fo.cause,
            rec.len(),
            if rec.len() == 1 { "" } else { "s" },
            crate::coord::settled(&rec)
        );
    }
    Ok(GoOn { transport: t2, removed, joining, fenced: fo.fenced.clone() })
}

/// Before a run with every blade in (under a coordinator): registrations
/// that blade 0's mirror still records from the epochs when it stood for
/// the registry, not settled when blade 0 was taken in
/// ([`ford_dtx::mirror::unsettled`]: everything that would have settled
/// them died first), are fenced on the blades in use (their tags revoked:
/// none of their verbs lands again, should one still run) and settled in
/// the mirror, so that their locks go and their slots serve again.
///
/// # Errors
/// Unreachable blades; fencing or settling that fails.
fn settle_mirror_leftovers(
    s: &Session,
    t: &dyn Transport,
    e: &crate::coord::Entered,
    d: &smallbank_tatp::DtxConfig,
) -> Result<()> {
    let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
    let (ctx, name) = (rt.ctx(), d.db.clone());
    let left = rt.block_on(async move {
        match ford_dtx::db::Db::open(&ctx, &name).await? {
            Some(db) => ford_dtx::mirror::unsettled(&ctx, &db).await,
            None => Ok(Vec::new()),
        }
    })?;
    if left.is_empty() {
        return Ok(());
    }
    // In the mirror: blade 0 as joining (written, its registry not read).
    let (fenced, rec) = crate::coord::fence_and_settle(s, &e.v, &mut rt, (&d.db, &[], &[0]), &left, d.lease)?;
    eprintln!(
        "{}: {} registration{} left in blade 0's mirror from before it was taken in (nothing settled {}): fenced on \
         memory blades {} and settled there ({})",
        d.db,
        left.len(),
        if left.len() == 1 { "" } else { "s" },
        if left.len() == 1 { "it" } else { "them" },
        ford_dtx::rebuild::blade_list(&fenced),
        crate::coord::settled(&rec)
    );
    Ok(())
}

/// Records database `name`'s replica order in the configuration (once).
fn record_order(s: &Session, t: &dyn Transport, e: &crate::coord::Entered, name: &str) {
    let order = (|| -> Result<Option<Vec<Vec<u16>>>> {
        let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
        let ctx = rt.ctx();
        let (n, out, joining) = (name.to_string(), e.v.config.removed(), e.v.config.joining());
        let Some(db) = rt.block_on(async move { ford_dtx::db::Db::open_view(&ctx, &n, &out, &joining).await })? else {
            return Ok(None);
        };
        Ok(Some(db.tables.iter().map(|t| t.base[..db.replicas].iter().map(|b| b.blade()).collect()).collect()))
    })();
    match order {
        Ok(Some(o)) => {
            if let Err(x) = crate::coord::record_db(e, name, o) {
                eprintln!("note: recording database {name:?} in the coordinator: {x}");
            }
        }
        Ok(None) => {}
        Err(x) => eprintln!("note: reading database {name:?}'s replica order: {x:#}"),
    }
}

/// `compute-blade recover`.
///
/// # Errors
/// Unreachable blades; a database of another shape; verb errors.
pub fn recover(s: &Session, t: Arc<dyn Transport>, job: &RecoverJob) -> Result<Outcome> {
    let mut rt = smart_core::Runtime::new(&*t, 0, s.run.runtime.clone())?;
    let mut all = Vec::new();
    let (mut left, mut left_unjudged) = (0, 0);
    for name in &job.dbs {
        let (ctx, name2) = (rt.ctx(), name.clone());
        let opened = rt
            .block_on(async move { ford_dtx::db::Db::open(&ctx, &name2).await })
            .map_err(|e| anyhow::anyhow!("recovering {name:?}: {e}"))?;
        let Some(db) = opened else {
            println!("{name}: no such database on these blades");
            continue;
        };
        let db = Arc::new(db);
        // Registrations whose lease runs: alive, or dead too recently to
        // tell. Said, waited for with --wait, never passed over in silence.
        let live = if job.slot.is_some() { Vec::new() } else { live_leases(&mut rt, &db, name)? };
        let unjudged = if job.wait { wait_for_leases(&mut rt, &db, name, live)? } else { live };
        for l in &unjudged {
            println!(
                "{name}: compute blade {} (pid {} on {}): lease live for {:.1} s more; not recovered (alive, or \
                 dead too recently to tell: `recover --wait` waits for its lease, then recovers it if it was not \
                 renewed)",
                l.slot,
                l.pid,
                l.host,
                l.left_ms as f64 / 1e3
            );
        }
        left_unjudged += unjudged.len();
        let (ctx, d, slot) = (rt.ctx(), db.clone(), job.slot);
        let r = rt.block_on(async move {
            let which = slot.map_or(Which::Expired, Which::Slot);
            let v = ford_dtx::recovery::recover(&ctx, &d, which).await?;
            // Reported after what recovery did, even if it fails.
            let orphans = ford_dtx::recovery::release_orphans(&ctx, &d).await;
            Ok((v, orphans))
        });
        let (v, orphans) = r.map_err(|e: ford_dtx::DtxError| anyhow::anyhow!("recovering {name:?}: {e}"))?;
        if v.is_empty() && unjudged.is_empty() {
            println!("{name}: no dead compute blade");
        }
        print_recovered(name, &v);
        let orphans = orphans.map_err(|e| {
            anyhow::anyhow!("recovering {name:?}: scanning for lock words no compute blade can hold: {e}")
        })?;
        print_orphans(name, &orphans);
        let repaired = if job.repair {
            let r = repair(&mut rt, &t, db, name)?;
            left += r.left_damaged();
            Some(r)
        } else {
            None
        };
        if !v.is_empty() || orphans.released > 0 || repaired.is_some() || !unjudged.is_empty() {
            let live: Vec<_> = unjudged
                .iter()
                .map(|l| json!({ "slot": l.slot, "pid": l.pid, "left_s": l.left_ms as f64 / 1e3 }))
                .collect();
            all.push(json!({ "db": name, "recovered": v, "orphan_locks": orphans, "repair": repaired, "live": live }));
        }
    }
    if let Some(p) = &s.json {
        std::fs::write(p, serde_json::to_string_pretty(&json!({ "bench": "recover", "databases": all }))? + "\n")?;
    }
    if left_unjudged > 0 {
        eprintln!(
            "compute-blade: recover left {left_unjudged} registration(s) whose lease runs (see above); exit status 1"
        );
    }
    Ok(Outcome::of(left == 0 && left_unjudged == 0, false))
}

/// A registration whose lease has not run out (with recovery's grace).
#[derive(Clone, Debug)]
struct Live {
    slot: u16,
    pid: u64,
    host: String,
    claim: u64,
    expiry_ms: u64,
    /// Milliseconds until recovery may take it (its expiry plus the grace).
    left_ms: u64,
}

/// The registrations of `db` whose lease (plus [`ford_dtx::recovery::GRACE_MS`])
/// has not run out, and that no recovery holds.
fn live_leases(rt: &mut smart_core::Runtime, db: &Arc<ford_dtx::db::Db>, name: &str) -> Result<Vec<Live>> {
    let (ctx, d) = (rt.ctx(), db.clone());
    let (slots, now) = rt
        .block_on(async move {
            let slots = ford_dtx::registry::slots_and_hosts(&ctx, &d).await?;
            Ok::<_, ford_dtx::DtxError>((slots, ford_dtx::registry::now_ms(&ctx)))
        })
        .map_err(|e| anyhow::anyhow!("recovering {name:?}: reading its registry: {e}"))?;
    Ok(slots
        .into_iter()
        .filter(|(s, _)| s.lease_runs(now))
        .map(|(s, host)| Live {
            slot: s.slot,
            pid: s.pid,
            host: host.unwrap_or_else(|| "host not recorded".into()),
            claim: s.claim,
            expiry_ms: s.expiry_ms,
            left_ms: (s.expiry_ms + ford_dtx::recovery::GRACE_MS).saturating_sub(now),
        })
        .collect())
}

/// `recover --wait`: waits until each of `live` is judged: its lease
/// renewed (its compute blade is alive: left alone), its registration
/// closed or taken by another recovery, or its lease run out with the
/// grace (then the recovery that follows takes it). Progress on stderr.
/// Returns those still unjudged (none: each lease ends or is renewed).
fn wait_for_leases(
    rt: &mut smart_core::Runtime,
    db: &Arc<ford_dtx::db::Db>,
    name: &str,
    mut live: Vec<Live>,
) -> Result<Vec<Live>> {
    let mut said = std::time::Instant::now() - std::time::Duration::from_secs(1);
    while !live.is_empty() {
        let now_live = live_leases(rt, db, name)?;
        live.retain(|l| {
            let Some(n) = now_live.iter().find(|n| n.slot == l.slot) else {
                // Run out (recovered next), closed, or being recovered.
                return false;
            };
            if n.claim != l.claim {
                println!(
                    "{name}: compute blade {} (pid {} on {}): registration ended while waiting",
                    l.slot, l.pid, l.host
                );
                return false;
            }
            if n.expiry_ms != l.expiry_ms {
                println!(
                    "{name}: compute blade {} (pid {} on {}): alive (its lease was renewed); not recovered",
                    l.slot, l.pid, l.host
                );
                return false;
            }
            true
        });
        for l in &mut live {
            if let Some(n) = now_live.iter().find(|n| n.slot == l.slot) {
                l.left_ms = n.left_ms;
            }
        }
        if live.is_empty() {
            break;
        }
        if said.elapsed() >= std::time::Duration::from_secs(1) {
            let each: Vec<String> = live
                .iter()
                .map(|l| {
                    format!("compute blade {} (pid {} on {}) {:.1} s", l.slot, l.pid, l.host, l.left_ms as f64 / 1e3)
                })
                .collect();
            eprintln!("recover: {name}: waiting for {} lease(s) to run out: {}", live.len(), each.join(", "));
            said = std::time::Instant::now();
        }
        let nap = live.iter().map(|l| l.left_ms).min().unwrap_or(0).clamp(50, 250);
        std::thread::sleep(std::time::Duration::from_millis(nap + 1));
    }
    Ok(live)
}

/// What recovery did for each dead compute blade of database `name`.
fn print_recovered(name: &str, v: &[ford_dtx::recovery::Recovered]) {
    for r in v {
        let cut = if r.chains_cut > 0 {
            format!(" ({} chains not scanned past a damaged link)", r.chains_cut)
        } else {
            String::new()
        };
        println!(
            "{name}: compute blade {} (pid {}): {}; {} log entries, {} rolled back, {} rolled forward, {} locks \
             released{cut}",
            r.slot,
            r.pid,
            r.fencing(),
            r.entries,
            r.rolled_back,
            r.rolled_forward,
            r.released
        );
    }
}

/// What the release of lock words no compute blade can hold did.
fn print_orphans(name: &str, orphans: &ford_dtx::recovery::Orphans) {
    if orphans.released > 0 {
        let shown: Vec<String> =
            orphans.shown.iter().map(|h| format!("table {} key {} word {:#x}", h.table, h.key, h.word)).collect();
        let more = if orphans.released > shown.len() as u64 { ", …" } else { "" };
        println!(
            "{name}: {} damaged lock words that no compute blade could hold released (of {} held): {}{more}",
            orphans.released,
            orphans.held,
            shown.join(", ")
        );
    }
    if orphans.chains_cut > 0 {
        println!(
            "{name}: {} chains not scanned for lock words past a damaged link or mirror: {}",
            orphans.chains_cut,
            orphans.first_cut.as_deref().unwrap_or("")
        );
    }
}

/// `recover --repair` of database `name`: registers a compute blade of one
/// coroutine (the repair's locks name it), repairs, reports, leaves.
fn repair(
    rt: &mut smart_core::Runtime,
    t: &Arc<dyn Transport>,
    db: Arc<ford_dtx::db::Db>,
    name: &str,
) -> Result<ford_dtx::repair::Repaired> {
    let (ctx, d) = (rt.ctx(), db.clone());
    let mirrored = rt
        .block_on(async move {
            let c = ford_dtx::mirror::check(&ctx, &d).await?;
            if c.violations() > 0 {
                return ford_dtx::mirror::rewrite(&ctx, &d).await.map(|w| w.then_some("written anew (one was wrong)"));
            }
            match c.present {
                Some(false) => ford_dtx::mirror::ensure(&ctx, &d).await.map(|w| w.then_some("written where missing")),
                _ => Ok(None),
            }
        })
        .map_err(|e| anyhow::anyhow!("repairing {name:?}: its mirrors: {e}"))?;
    if let Some(how) = mirrored {
        println!("{name}: repair: its mirrors on the other memory blades {how}: blade 0 can be rebuilt from them");
    }
    let lease = std::time::Duration::from_secs(10);
    let reg = ford_dtx::Registration::register(t.clone(), db.clone(), 1, 1, lease)
        .map_err(|e| anyhow::anyhow!("repairing {name:?}: registering: {e}"))?;
    // The repair's locks name the registration: its runtime does too.
    let mut rt = smart_core::Runtime::new(&**t, 0, reg.runtime_config(rt.ctx().config()))?;
    let ctx = rt.ctx();
    let (r, reg) = rt.block_on(async move { (ford_dtx::repair::repair(&ctx, &db, &reg).await, reg) });
    let r = r.map_err(|e| anyhow::anyhow!("repairing {name:?}: {e}"))?;
    reg.close(&**t).map_err(|e| anyhow::anyhow!("repairing {name:?}: {e}"))?;
    if r.links_filled > 0 {
        println!(
            "{name}: repair: {} backup chain words filled in (a database made before chains were kept on every \
             replica, or an extension cut short)",
            r.links_filled
        );
    }
    if r.damaged + r.gaps + r.chains_cut + r.links_repaired == 0 {
        println!("{name}: repair: no damaged record");
    } else {
        println!(
            "{name}: repair: {} damaged records, {} repaired ({} copies rewritten), {} chain words repaired; left: {} locked, {} unrepairable, {} after a gap, {} chains cut",
            r.damaged, r.repaired, r.copies_rewritten, r.links_repaired, r.busy, r.unrepairable, r.gaps, r.chains_cut
        );
    }
    for l in &r.left {
        let key = l.key.map_or(String::new(), |k| format!(" key {k}"));
        println!("{name}: not repaired: table {}{key} at {}: {}", l.table, l.at, l.why);
    }
    if r.left_damaged() > r.left.len() as u64 {
        println!("{name}: not repaired: {} more", r.left_damaged() - r.left.len() as u64);
    }
    if r.left_damaged() > 0 {
        eprintln!("compute-blade: the repair of {name:?} left damage: {} records or chains", r.left_damaged());
    }
    Ok(r)
}

/// What a rebuild did per database: the copies written, the recovery of
/// the dead compute blades, the orphan locks released.
type RebuiltDb = (ford_dtx::rebuild::Rebuilt, Vec<ford_dtx::recovery::Recovered>, ford_dtx::recovery::Orphans);

/// `compute-blade rebuild`.
///
/// # Errors
/// Blades that are not the set with fresh blades in the lost ones' places;
/// other indexes on the blades; a compute blade running; verb errors.
pub fn rebuild(s: &Session, t: &dyn Transport, job: &RebuildJob) -> Result<Outcome> {
    let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
    let lost = &job.lost;
    let list = ford_dtx::rebuild::blade_list(lost);
    let plural = if lost.len() > 1 { "s" } else { "" };
    // Under a coordinator: the configuration must take the lost blades for
    // lost and trust the others; they are taken in again once rebuilt.
    let entered = crate::coord::enter_rebuild(s, t, lost, job.online.is_some())?;
    if let (Some((rate, lease, share)), Some(e)) = (job.online, &entered) {
        return rebuild_online(s, t, job, e, (rate, share), lease);
    }
    let started = std::time::Instant::now();
    let (names, out) = if lost[0] == 0 { rebuild_blade0(&mut rt, s, job)? } else { rebuild_blade(&mut rt, s, job)? };
    let secs = started.elapsed().as_secs_f64();
    let mut settled = true;
    let mut records = Vec::new();
    for (name, (r, rec, orphans)) in names.iter().zip(out) {
        println!(
            "{name}: rebuilt on memory blade{plural} {list}: {} bucket arrays, {} overflow buckets ({} added while it \
             was out), {} bytes; undo log copies there: {} ({} written from another copy)",
            r.arrays, r.overflow, r.added, r.bytes, r.log_areas, r.log_copies
        );
        print_recovered(name, &rec);
        for x in &rec {
            if x.log_lost {
                settled = false;
                println!(
                    "{name}: compute blade {} (pid {}): every copy of its undo log was on the lost memory blades: a \
                     transaction of it that had begun writing when it died cannot be rolled back (audit the database)",
                    x.slot, x.pid
                );
            }
        }
        print_orphans(name, &orphans);
        records.push(json!({ "db": name, "rebuilt": r, "recovered": rec, "orphan_locks": orphans }));
    }
    if let Some(p) = &s.json {
        let rec = json!({ "bench": "rebuild", "lost": lost, "seconds": secs, "databases": records });
        std::fs::write(p, serde_json::to_string_pretty(&rec)? + "\n")?;
    }
    println!("rebuilt in {secs:.1} s");
    if let Some(e) = &entered {
        let v = crate::coord::readmit(s, e, t, lost)?;
        println!(
            "coordinator: memory blade{plural} {list} taken into the configuration: epoch {} ({})",
            v.config.epoch,
            v.config.describe_blades()
        );
    }
    if !settled {
        eprintln!("compute-blade: transactions in flight every copy of whose undo log was on the lost blades were not settled");
    }
    Ok(Outcome::of(settled, false))
}

/// Whether the set, which already holds every blade listed (it checks),
/// is a rebuild of `lost` that stopped after adopting them: its mark on
/// blade 0 names exactly those blades. Refuses anything else (blades that
/// were not lost are left alone).
async fn resuming(ctx: &smart_core::Ctx, lost: &[u16]) -> std::result::Result<(), ford_dtx::DtxError> {
    match ford_dtx::db::rebuilding(ctx).await? {
        Some(marked) if marked == lost => Ok(()),
        Some(marked) => Err(ford_dtx::DtxError::Config(format!(
            "the rebuild in progress is of memory blades {}: run it with --lost {}",
            ford_dtx::rebuild::blade_list(&marked),
            ford_dtx::rebuild::blade_list(&marked)
        ))),
        None if lost.len() == 1 => Err(ford_dtx::DtxError::Config(format!(
            "memory blade {} is the one this set had (or its rebuild finished): it was not lost, so nothing is \
             rebuilt on it",
            lost[0]
        ))),
        None => Err(ford_dtx::DtxError::Config(format!(
            "memory blades {} are the ones this set had (or their rebuild finished): they were not lost, so nothing \
             is rebuilt on them",
            ford_dtx::rebuild::blade_list(lost)
        ))),
    }
}

/// The FORD databases a rebuild of blades `job.lost` (not 0) writes again:
/// their names (`--db`, or every one on the blades). Refuses while RACE
/// tables or B+trees live on the blades (one copy of their data).
fn rebuilt_dbs(rt: &mut smart_core::Runtime, job: &RebuildJob) -> Result<Vec<String>> {
    let lost = job.lost.clone();
    let ctx = rt.ctx();
    let listed = rt.block_on(async move { list_indexes(&ctx).await })?;
    let others: Vec<String> = listed
        .iter()
        .filter(|l| l.kind == "race" || l.kind == "sherman")
        .map(|l| format!("{} {}", l.kind, l.name.as_deref().unwrap_or("(unnamed)")))
        .collect();
    if !others.is_empty() {
        anyhow::bail!(
            "these indexes also live on the blades: {}; they keep one copy of their data, so what they had on memory \
             blades {} is lost, and their addresses there could meet the rebuilt copies: drop them first \
             (`compute-blade table drop NAME`)",
            others.join(", "),
            ford_dtx::rebuild::blade_list(&lost)
        );
    }
    Ok(if job.dbs.is_empty() {
        listed.iter().filter(|l| l.kind == "ford").filter_map(|l| l.name.clone()).collect()
    } else {
        job.dbs.clone()
    })
}

/// The rebuild of blades `job.lost` (not 0): the databases found through
/// blade 0, which lives.
fn rebuild_blade(rt: &mut smart_core::Runtime, s: &Session, job: &RebuildJob) -> Result<(Vec<String>, Vec<RebuiltDb>)> {
    use ford_dtx::db::Db;
    let lost = job.lost.clone();
    let names = rebuilt_dbs(rt, job)?;
    let ctx = rt.ctx();
    let n2 = names.clone();
    let dbs = rt.block_on(async move {
        let mut dbs = Vec::new();
        for name in &n2 {
            let db = Db::open_unguarded(&ctx, name)
                .await?
                .ok_or_else(|| ford_dtx::DtxError::Config(format!("no database {name:?} on these blades")))?;
            // A compute blade still running would write over the rebuild.
            let now = ford_dtx::registry::now_ms(&ctx);
            for sl in ford_dtx::registry::slots(&ctx, &db).await? {
                if sl.claim != 0 && sl.expiry_ms.saturating_add(ford_dtx::recovery::GRACE_MS) >= now {
                    return Err(ford_dtx::DtxError::Config(format!(
                        "database {name}: the compute blade of registry slot {} (pid {}) holds a lease for {} ms more: \
                         stop it (or wait for its lease to expire, if it is dead) before the rebuild",
                        sl.slot,
                        sl.pid,
                        (sl.expiry_ms + ford_dtx::recovery::GRACE_MS).saturating_sub(now)
                    )));
                }
            }
            dbs.push(std::sync::Arc::new(db));
        }
        Ok::<_, ford_dtx::DtxError>(dbs)
    })?;
    if dbs.is_empty() {
        anyhow::bail!("no FORD database on these blades: nothing to rebuild");
    }
    let ctx = rt.ctx();
    let all = dbs.clone();
    let progress = s.run.progress;
    let out = rt.block_on(async move {
        let mut end = vec![0; lost.len()];
        for db in &all {
            let e = ford_dtx::rebuild::extents_on(&ctx, db, &lost).await?;
            end.iter_mut().zip(e).for_each(|(a, b)| *a = (*a).max(b));
        }
        let targets: Vec<u64> =
            end.iter().map(|e| (*e).max(smart_core::layout::HEAP_START).next_multiple_of(4096)).collect();
        if ctx.check_blade_set().await.is_ok() {
            // The set holds the blades: a rebuild of them that stopped after
            // adopting them resumes (its mark is still on blade 0).
            resuming(&ctx, &lost).await?;
        } else {
            fits(&ctx, &lost, &targets)?;
            mark_and_adopt(&ctx, &lost).await?;
        }
        reserve_lost(&ctx, &lost, &targets).await?;
        let out = rebuild_copies(&ctx, &all, &lost, progress).await?;
        ford_dtx::db::unmark_rebuilding(&ctx).await?;
        Ok::<_, ford_dtx::DtxError>(out)
    })?;
    Ok((names, out))
}

/// `rebuild --online --lost N` (blade N removed by a failover, a fresh
/// blade in its place) while compute blades run, under
/// the coordinator of `e` (see `ford_dtx::rejoin`): the fresh blade adopted
/// at its place, its heap reserved past what the databases had there; the
/// next epoch with it joining (the compute blades follow: every transaction
/// writes it); the earlier epoch settled; each database's copies made there
/// (buckets added while it was out first, then every slot under its lock,
/// at most `rate` bytes a second, and holding the compute blades at `share`
/// of their throughput before if one is given: [`crate::pace`]); then the
/// next epoch with it active. Run again, it resumes where the configuration
/// says it is.
///
/// Blade 0 is found through the mirrors, and gets back each catalog and
/// named root before it joins, its registry empty: the mirror on blade 1
/// stays the registry until it is taken in (the compute blades then settle
/// that epoch's registrations there, and register on blade 0 again).
fn rebuild_online(
    s: &Session,
    t: &dyn Transport,
    job: &RebuildJob,
    e: &crate::coord::Entered,
    (rate, share): (f64, Option<f64>),
    lease: std::time::Duration,
) -> Result<Outcome> {
    use ford_dtx::db::Db;
    use smart_coord::BladeState;
    let n = job.lost[0];
    let started = std::time::Instant::now();
    let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
    // Blade 0's databases are found through their mirrors, and opened as
    // they stand for it (its catalog and registry) until it is taken in.
    let mirrors = if n == 0 { blade0_mirrors(&mut rt)? } else { Vec::new() };
    let names = if n == 0 { mirrors.iter().map(|m| m.db.name.clone()).collect() } else { rebuilt_dbs(&mut rt, job)? };
    if names.is_empty() {
        anyhow::bail!("no FORD database on these blades: nothing to rebuild");
    }
    let ctx = rt.ctx();
    let n2 = names.clone();
    let dbs = rt.block_on(async move {
        let mut dbs = Vec::new();
        for name in &n2 {
            let db = if n == 0 { Db::open_view(&ctx, name, &[0], &[]).await? } else { Db::open(&ctx, name).await? };
            dbs.push(db.ok_or_else(|| ford_dtx::DtxError::Config(format!("no database {name:?} on these blades")))?);
        }
        Ok::<_, ford_dtx::DtxError>(dbs)
    })?;
    let resuming = matches!(e.v.config.blades[usize::from(n)].state, BladeState::Joining { .. });
    if !resuming {
        let ctx = rt.ctx();
        let (all, ms) = (dbs.clone(), mirrors.clone());
        rt.block_on(async move {
            let mut end = 0;
            for db in &all {
                end = end.max(ford_dtx::rebuild::extents_on(&ctx, &db.without(&[n])?, &[n]).await?[0]);
            }
            // Blade 0's catalogs, registries and the log areas there.
            end = ms.iter().map(ford_dtx::mirror::Mirror::end_on_blade0).fold(end, u64::max);
            let target = end.max(smart_core::layout::HEAP_START).next_multiple_of(4096);
            fits(&ctx, &[n], &[target])?;
            ctx.adopt_blades(&[n]).await?;
            reserve_lost(&ctx, &[n], &[target]).await
        })?;
    }
    if n == 0 {
        // Each catalog and named root back on blade 0, its registry empty:
        // the mirrors stay the registry while it joins (nothing on it is
        // read), and the registrations of those epochs are settled there
        // once it is taken in.
        let (ctx, ms) = (rt.ctx(), mirrors.clone());
        rt.block_on(async move {
            for m in &ms {
                ford_dtx::mirror::restore_joining(&ctx, m).await?;
            }
            Ok::<_, ford_dtx::DtxError>(())
        })?;
    }
    let joined = crate::coord::join_blade(s, e, t, n)?;
    let (fenced, tags) = crate::coord::fence_earlier(s, &e.c, &joined)?;
    let (epoch, blades) = (joined.config.epoch, joined.config.describe_blades());
    let what = if resuming {
        format!("is joining since epoch {epoch} (a copy to it stopped): copying again")
    } else {
        format!("joins: epoch {epoch}")
    };
    println!("coordinator: memory blade {n} {what} ({blades}); {fenced}");
    let member = crate::coord::join_under(e, &joined, format!("rebuild --online of memory blade {n}"), lease)?;
    let lost = joined.config.removed();
    let wait_ms = ford_dtx::recovery::settle_wait_ms(lease);
    let transport: Arc<dyn Transport> = s.blades.at(&e.addrs).connect_without(&lost, Some(t.blades()))?;
    let mut records = Vec::new();
    // With a share to hold, measured before the first copy (below).
    let (mut pace, mut measured) = (crate::pace::Pace::fixed(rate), share.is_none());
    for db in &dbs {
        let view = Arc::new(db.view(&lost, &[n])?);
        let reg = ford_dtx::Registration::register_halting(
            transport.clone(),
            view.clone(),
            1,
            1,
            lease,
            member.halt.clone(),
        )?;
        member.fence_tag.store(reg.fence_tag(), std::sync::atomic::Ordering::SeqCst);
        reg.await_recorded(&member.m.recorded_tag(), lease).context("the copier (run the rebuild again)")?;
        let mut crt = smart_core::Runtime::new(&*transport, 0, reg.runtime_config(&s.run.runtime))?;
        let ctx = crt.ctx();
        let who = ford_dtx::rejoin::Copier {
            lock: ford_dtx::layout::Owner { blade: reg.slot(), thread: 0, coroutine: 0 }.lock_word(0),
            patience_ms: 2 * lease.as_millis() as u64,
            give_up_ms: wait_ms,
        };
        let (v, tags2, name) = (view.clone(), tags.clone(), db.name.clone());
        let t0 = std::time::Instant::now();
        let (rec, added) = crt.block_on(async move {
            // No transaction of the earlier epoch writes without the blade
            // once this returns.
            let mut rec = ford_dtx::recovery::settle(&ctx, &v, &tags2, wait_ms).await?;
            // A copier that died here before (a copy that resumes) holds
            // slot locks until its recovery: once its lease ran out.
            rec.extend(ford_dtx::recovery::recover(&ctx, &v, ford_dtx::recovery::Which::Expired).await?);
            ford_dtx::mirror::ensure(&ctx, &v).await?;
            let added = ford_dtx::rejoin::add_copies(&ctx, &v, n).await?;
            Ok::<_, ford_dtx::DtxError>((rec, added))
        })?;
        // With a share to hold: the compute blades' throughput with the
        // blade joining (they followed the epoch: the earlier one is
        // settled), before any copy; what the copy costs them is measured
        // against it.
        if let (Some(f), false) = (share, measured) {
            pace = crate::pace::Pace::holding(transport.clone(), (*view).clone(), rate, f, s.run.progress)?;
            measured = true;
        }
        let (v, ctx) = (view.clone(), crt.ctx());
        let (progress, halt, mut pacer) = (s.run.progress, member.halt.clone(), pace.pacer());
        // Compute blades that die during the copy hold their locks: in a
        // mirror (blade 0 joining) nothing expires, so those whose
        // membership lapsed are fenced and settled when the copy waits on
        // them.
        let (s2, c2, v2) = (s.clone(), e.c.clone(), joined.clone());
        let dead = move || match crate::coord::reap(&s2, &c2, &v2) {
            Ok(tags) => tags,
            Err(x) => {
                eprintln!("note: finding dead compute blades in the coordinator: {x:#}");
                Vec::new()
            }
        };
        let copied = crt.block_on(async move {
            let mut said = std::time::Instant::now();
            let mut c = ford_dtx::rejoin::copy_reaping(
                &ctx,
                &v,
                n,
                who,
                |c| {
                    if halt.load(std::sync::atomic::Ordering::SeqCst) {
                        return Err(ford_dtx::DtxError::Config(
                            "the copy stops: the configuration moved on (a failure?) or the copier's lease lapsed"
                                .into(),
                        ));
                    }
                    // Sleeping this thread, which runs nothing else.
                    pacer.after(c.bytes);
                    if progress && said.elapsed() > std::time::Duration::from_secs(2) {
                        eprintln!(
                            "{name}: copying to memory blade {n}: {} buckets, {} bytes so far ({} slots held by \
                         transactions, retried{})",
                            c.buckets,
                            c.bytes,
                            c.busy,
                            pacer.said()
                        );
                        said = std::time::Instant::now();
                    }
                    Ok(())
                },
                dead,
            )
            .await?;
            c.added = added;
            Ok::<_, ford_dtx::DtxError>(c)
        })?;
        drop(crt);
        reg.close(&*transport)?;
        println!(
            "{}: copied to memory blade {n} while transactions ran: {} buckets ({} added while it was out), {} slots \
             under their locks ({} held by transactions, retried; {} dead compute blades' registrations settled), {} \
             records given their home, {} bytes in {:.1} s",
            db.name,
            copied.buckets,
            copied.added,
            copied.slots,
            copied.busy,
            copied.reaped,
            copied.rehomed,
            copied.bytes,
            t0.elapsed().as_secs_f64()
        );
        print_recovered(&db.name, &rec);
        records.push(json!({ "db": db.name, "copied": copied, "recovered": rec }));
    }
    let paced = pace.finish()?;
    if let Some(p) = &paced {
        println!("pace: {}", p.said(rate));
    }
    // Taken in: the compute blades follow to the next epoch, settling this
    // one's transactions (this rebuild settles them too).
    // For tests: `SMART_RS_TEST_TAKE_IN=die-after:MS` waits MS ms once the
    // copies are made, then aborts right after the take-in landed, before
    // this rebuild fences and settles the earlier epochs.
    let hook = std::env::var("SMART_RS_TEST_TAKE_IN").unwrap_or_default();
    let die = hook.strip_prefix("die-after:").and_then(|ms| ms.parse().ok());
    if let Some(ms) = die {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let v = crate::coord::take_in(e, n, &joined)?;
    if die.is_some() {
        eprintln!("compute-blade: SMART_RS_TEST_TAKE_IN: aborting right after taking memory blade {n} in");
        std::process::abort();
    }
    let (fenced, tags) = crate::coord::fence_earlier(s, &e.c, &v)?;
    let _ = member.m.leave();
    for db in &dbs {
        let view = db.view(&lost, &[n])?;
        let ctx = rt.ctx();
        let tags = tags.clone();
        let rec = rt.block_on(async move { ford_dtx::recovery::settle(&ctx, &view, &tags, wait_ms).await })?;
        print_recovered(&db.name, &rec);
    }
    let secs = started.elapsed().as_secs_f64();
    if let Some(p) = &s.json {
        let rec = json!({ "bench": "rebuild", "online": true, "lost": job.lost, "seconds": secs,
            "copy_rate_bytes_per_s": rate, "pace": paced, "epochs": [joined.config.epoch, v.config.epoch],
            "databases": records });
        std::fs::write(p, serde_json::to_string_pretty(&rec)? + "\n")?;
    }
    println!("rebuilt online in {secs:.1} s");
    println!(
        "coordinator: memory blade {n} taken into the configuration: epoch {} ({}); {fenced}",
        v.config.epoch,
        v.config.describe_blades()
    );
    Ok(Outcome::of(true, false))
}

/// The mirrors of every database, which blade 0 comes back with (`--db`
/// does not apply to it), read on blade 1 (a set has at least 2 blades,
/// and only blade 0 is lost).
///
/// # Errors
/// Verb errors.
fn blade0_mirrors(rt: &mut smart_core::Runtime) -> Result<Vec<ford_dtx::mirror::Mirror>> {
    let ctx = rt.ctx();
    Ok(rt.block_on(async move { ford_dtx::mirror::list(&ctx, 1).await })?)
}

/// Refuses a fresh blade of `lost` too small for what was lost there (up
/// to offset `targets[i]` on blade `lost[i]`).
fn fits(ctx: &smart_core::Ctx, lost: &[u16], targets: &[u64]) -> std::result::Result<(), ford_dtx::DtxError> {
    for (&b, &target) in lost.iter().zip(targets) {
        let size = ctx.blades()[usize::from(b)].size;
        if target > size {
            return Err(ford_dtx::DtxError::Config(format!(
                "memory blade {b} has {size} bytes; what was lost reached offset {target:#x}: start it with a larger \
                 --size"
            )));
        }
    }
    Ok(())
}

/// Sets the rebuild's mark on blade 0 (naming blades `lost`), then adopts
/// the fresh blades `lost`; a refused adoption changed nothing, so the mark
/// goes.
async fn mark_and_adopt(ctx: &smart_core::Ctx, lost: &[u16]) -> std::result::Result<(), ford_dtx::DtxError> {
    ford_dtx::db::mark_rebuilding(ctx, lost).await?;
    if let Err(e) = ctx.adopt_blades(lost).await {
        if matches!(e, smart_core::Error::BladeSet { .. }) {
            ford_dtx::db::unmark_rebuilding(ctx).await?;
        }
        return Err(e.into());
    }
    Ok(())
}

/// Marks each blade `lost[i]`'s heap in use up to `targets[i]`, unless a
/// rebuild of it that resumes did already (and may now find less: recovery
/// freed registrations whose log areas counted before).
async fn reserve_lost(
    ctx: &smart_core::Ctx,
    lost: &[u16],
    targets: &[u64],
) -> std::result::Result<(), ford_dtx::DtxError> {
    use smart_core::layout::{HEAP_START, OFF_HEAP};
    for (&b, &target) in lost.iter().zip(targets) {
        let heap = ctx.read_u64(smart_core::GlobalAddr::new(b, OFF_HEAP)).await?;
        if heap == HEAP_START {
            ctx.reserve_heap(b, target).await?;
        } else if heap < target {
            return Err(ford_dtx::DtxError::Config(format!(
                "memory blade {b}, being rebuilt, has its heap in use up to {heap:#x}, short of what was lost \
                 ({target:#x}): it was not reserved by this rebuild"
            )));
        }
    }
    Ok(())
}

/// Settles the transactions of dead compute blades, writes every
/// database's copies on blades `lost` again, releases orphan locks, and writes
/// again the mirrors that were on the lost blades (no compute blade is
/// registered now).
async fn rebuild_copies(
    ctx: &smart_core::Ctx,
    dbs: &[std::sync::Arc<ford_dtx::db::Db>],
    lost: &[u16],
    progress: bool,
) -> std::result::Result<Vec<RebuiltDb>, ford_dtx::DtxError> {
    let mut out = Vec::new();
    for db in dbs {
        if progress {
            eprintln!("{}: rebuilding its copies on memory blades {} …", db.name, ford_dtx::rebuild::blade_list(lost));
        }
        // The dead compute blades' transactions first settled on what
        // survives (as in a failover: the lost blades out of use), so that
        // the copies written next carry their outcome, also of records in
        // buckets added while a blade was out (which a transaction's undo
        // log knows no copy of on it). Blade 0 holds the registry: then
        // after the copies, from the rebuilt registry.
        let mut rec = if lost.contains(&0) {
            Vec::new()
        } else {
            ford_dtx::recovery::recover(ctx, &db.without(lost)?, Which::Expired).await?
        };
        let r = ford_dtx::rebuild::rebuild(ctx, db, lost).await?;
        rec.extend(ford_dtx::recovery::recover_after_loss(ctx, db, lost, Which::Expired).await?);
        let orphans = ford_dtx::recovery::release_orphans(ctx, db).await?;
        ford_dtx::mirror::ensure(ctx, db).await?;
        out.push((r, rec, orphans));
    }
    Ok(out)
}

/// The rebuild of blade 0, and of the other blades of `job.lost`: the
/// databases found through their mirrors on the first blade not lost
/// ([`ford_dtx::mirror`]). The blades are adopted (blade 0 taking the set's
/// identity) once the leases of the compute blades the mirrors name have
/// run out, marked as being rebuilt, and blade 0 given back each catalog,
/// registry and named root before the copies are rebuilt. Run again, it
/// resumes.
fn rebuild_blade0(
    rt: &mut smart_core::Runtime,
    s: &Session,
    job: &RebuildJob,
) -> Result<(Vec<String>, Vec<RebuiltDb>)> {
    use ford_dtx::mirror;
    use smart_core::layout::HEAP_START;
    let ctx = rt.ctx();
    let progress = s.run.progress;
    let wanted = job.dbs.clone();
    let lost = job.lost.clone();
    let (mirrors, adopted, targets) = rt.block_on(async move {
        let config = |m: String| Err(ford_dtx::DtxError::Config(m));
        // The mirrors of the first blade that was not lost.
        let Some(from) = mirror::blades(&ctx).find(|b| !lost.contains(b)) else {
            return config("every blade that keeps mirrors was lost: nothing says what blade 0 held".into());
        };
        let mirrors = mirror::list(&ctx, from).await?;
        if let Some(w) = wanted.iter().find(|w| !mirrors.iter().any(|m| &m.db.name == *w)) {
            return config(format!("no mirror of a database {w:?} on memory blade {from}"));
        }
        if mirrors.is_empty() {
            for k in mirror::blades(&ctx).filter(|b| *b != from && !lost.contains(b)) {
                if !mirror::list(&ctx, k).await?.is_empty() {
                    return config(format!(
                        "memory blade {from} keeps no database mirror, but memory blade {k} does: memory blade {from} \
                         was lost too, or is new (list every lost blade in one rebuild: --lost {},{from})",
                        ford_dtx::rebuild::blade_list(&lost)
                    ));
                }
            }
            return config(format!(
                "no FORD database keeps a mirror on memory blade {from}, so nothing says what blade 0 held (a \
                 database made before mirrors were kept there gets one from `compute-blade recover --repair`, run \
                 while blade 0 lives)"
            ));
        }
        let adopted = ctx.check_blade_set().await.is_ok();
        if adopted {
            // A set that has the blades: a rebuild of them that stopped
            // after adopting them resumes (its mark, or a catalog root not
            // back yet, says so); a blade 0 that was never lost is left
            // alone.
            let mut restored = true;
            for m in &mirrors {
                restored &= ctx.root(0, &ford_dtx::db::root_name(&m.db.name)).await?.is_some();
            }
            if restored || ford_dtx::db::rebuilding(&ctx).await?.is_some() {
                resuming(&ctx, &lost).await?;
            }
        }
        // What the databases had on the lost blades, read on the others
        // (blade 0's registry is empty until restored: the log areas come
        // from the mirrors).
        let mut end = vec![HEAP_START; lost.len()];
        for m in &mirrors {
            let e = ford_dtx::rebuild::extents_on(&ctx, &m.db, &lost).await?;
            for (i, (a, b)) in end.iter_mut().zip(e).enumerate() {
                *a = (*a).max(b).max(m.logs_end_on(lost[i]));
            }
            end[0] = end[0].max(m.end_on_blade0());
        }
        let targets: Vec<u64> = end.iter().map(|e| e.next_multiple_of(4096)).collect();
        if !adopted {
            fits(&ctx, &lost, &targets)?;
        }
        Ok((mirrors, adopted, targets))
    })?;
    if !adopted {
        // Every compute blade registered when blade 0 was lost fails its
        // next renewal there and fences itself: once the longest lease
        // (and recovery's grace) has passed, none locks or commits any more.
        let wait = mirrors.iter().map(mirror::Mirror::longest_lease_ms).max().unwrap_or(0);
        if wait > 0 {
            let wait = wait + ford_dtx::recovery::GRACE_MS;
            if progress {
                let k: usize = mirrors.iter().map(|m| m.slots.iter().filter(|s| s.claim != 0).count()).sum();
                eprintln!(
                    "waiting {:.1} s: {k} compute blades were registered; each fences itself within its lease once \
                     a renewal on blade 0 fails",
                    wait as f64 / 1e3
                );
            }
            // The runtime's clock: virtual on the simulator.
            let ctx = rt.ctx();
            rt.block_on(async move { ctx.sleep_ns(wait * 1_000_000).await });
        }
    }
    let ctx = rt.ctx();
    let lost = job.lost.clone();
    let out = rt.block_on(async move {
        // The mark first: from the adoption on, a compute blade that opened
        // a database before its catalog were back would create it anew.
        if adopted {
            ford_dtx::db::mark_rebuilding(&ctx, &lost).await?;
        } else {
            mark_and_adopt(&ctx, &lost).await?;
        }
        for m in &mirrors {
            mirror::restore(&ctx, m).await?;
        }
        reserve_lost(&ctx, &lost, &targets).await?;
        let dbs: Vec<_> = mirrors.iter().map(|m| std::sync::Arc::new(m.db.clone())).collect();
        let out = rebuild_copies(&ctx, &dbs, &lost, progress).await?;
        ford_dtx::db::unmark_rebuilding(&ctx).await?;
        Ok::<_, ford_dtx::DtxError>((mirrors.iter().map(|m| m.db.name.clone()).collect::<Vec<_>>(), out))
    })?;
    Ok(out)
}

/// One index found on the blades by `table list`.
#[derive(Debug, serde::Serialize)]
struct Listed {
    kind: &'static str,
    name: Option<String>,
    at: String,
    detail: String,
}

/// `compute-blade table list|drop|check|repair`.
///
/// # Errors
/// Verb errors; an index that cannot be read.
pub fn table(s: &Session, t: &dyn Transport, job: &TableJob) -> Result<Outcome> {
    let mut rt = smart_core::Runtime::new(t, 0, s.run.runtime.clone())?;
    let ctx = rt.ctx();
    // Without --app, the kind of the index of that name on the blades.
    let app = match job.app {
        Some(a) => a,
        None => {
            let (c, name) = (rt.ctx(), job.name.clone());
            let sherman = rt.block_on(async move {
                Ok::<_, smart_core::Error>(
                    c.root(0, &format!("race-ht:{name}")).await?.is_none()
                        && c.root(0, &format!("sherman:{name}")).await?.is_some(),
                )
            })?;
            if sherman {
                App::Sherman
            } else {
                App::Race
            }
        }
    };
    if let (TableAction::Repair, App::Sherman) = (job.action, app) {
        anyhow::bail!(
            "table repair is for RACE tables ({:?} is a sherman index): a B+tree's operations take a dead client's \
             lock over themselves",
            job.name
        );
    }
    let job = &TableJob { app: Some(app), ..job.clone() };
    let kind = match app {
        App::Race => "race",
        App::Sherman => "sherman",
    };
    match job.action {
        TableAction::List => {
            let listed = rt.block_on(async move { list_indexes(&ctx).await })?;
            for l in &listed {
                println!(
                    "{:<8} {:<20} at {:<16} {}",
                    l.kind,
                    l.name.as_deref().unwrap_or("(name not stored)"),
                    l.at,
                    l.detail
                );
            }
            if listed.is_empty() {
                println!("no index on these blades");
            }
            report::write(s, &json!({ "bench": "table", "action": "list", "indexes": listed }))?;
            Ok(Outcome::of(true, false))
        }
        TableAction::Drop => {
            let name = job.name.clone();
            let (found, reclaimed) = match app {
                App::Race => {
                    let name2 = name.clone();
                    let d = rt
                        .block_on(async move { RaceHt::drop_table(&ctx, &name2).await })
                        .map_err(|e| anyhow::anyhow!("dropping race index {name:?}: {e}"))?;
                    if let Some(d) = d {
                        println!(
                            "dropped race index {name:?}: {} subtables and {} KV blocks ({} bytes) retired for reuse",
                            d.subtables, d.blocks, d.bytes
                        );
                    }
                    (d.is_some(), d.map(serde_json::to_value).transpose()?)
                }
                App::Sherman => {
                    let name2 = name.clone();
                    let d = rt
                        .block_on(async move { ShermanBt::drop_tree(&ctx, &name2).await })
                        .map_err(|e| anyhow::anyhow!("dropping sherman index {name:?}: {e}"))?;
                    if let Some(d) = d {
                        println!(
                            "dropped sherman index {name:?}: {} pages and {} value blocks ({} bytes) retired for reuse",
                            d.pages, d.blocks, d.bytes
                        );
                    }
                    (d.is_some(), d.map(serde_json::to_value).transpose()?)
                }
            };
            if !found {
                println!("no {kind} index {name:?} on these blades");
            }
            report::write(
                s,
                &json!({ "bench": "table", "action": "drop", "app": kind, "name": job.name,
                "dropped": found, "reclaimed": reclaimed }),
            )?;
            Ok(Outcome::of(found, false))
        }
        TableAction::Repair => {
            let name = job.name.clone();
            let r = rt.block_on(async move {
                let mut ht = RaceHt::open(&ctx, &name).await?;
                let finished = ht.repair().await?;
                let stats = ht.resize_stats();
                let check = ht.check().await?;
                ht.close().await?;
                Ok::<_, race_ht::RaceError>((finished, stats, check))
            });
            let (finished, stats, c) = r.map_err(|e| anyhow::anyhow!("repairing race index {:?}: {e}", job.name))?;
            println!(
                "race {:?}: {} lock(s) taken over, {} split(s) finished; now {} faults, {}",
                job.name,
                stats.takeovers,
                stats.recovered,
                c.faults(),
                resize_locks(&c)
            );
            report::write(
                s,
                &json!({ "bench": "table", "action": "repair", "app": kind, "name": job.name,
                "finished_splits": stats.recovered, "takeovers": stats.takeovers, "any_finished": finished,
                "ok": c.faults() == 0, "check": c }),
            )?;
            Ok(Outcome::of(c.faults() == 0, false))
        }
        TableAction::Check => {
            let name = job.name.clone();
            // Damaged free lists are a finding of the check (the index is
            // still checked): that blade's free bytes count as 0.
            let (heap, free, damage) = {
                let ctx = ctx.clone();
                rt.block_on(async move {
                    let heap = heap_used(&ctx).await?;
                    let (mut free, mut damage) = (Vec::new(), Vec::new());
                    for b in 0..ctx.blades().len() as u16 {
                        match smart_core::reclaim::free_bytes(&ctx, b).await {
                            Ok((objects, bags)) => free.push(objects + bags),
                            Err(e @ smart_core::Error::Damaged { .. }) => {
                                println!("free lists: {e}");
                                damage.push(e.to_string());
                                free.push(0);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Ok::<_, smart_core::Error>((heap, free, damage))
                })?
            };
            let (heap_sum, free_sum) = (heap.iter().sum::<u64>(), free.iter().sum::<u64>());
            let (ok, detail) = match app {
                App::Race => {
                    let c = rt.block_on(async move {
                        let mut ht = RaceHt::open(&ctx, &name).await?;
                        let c = ht.check().await?;
                        ht.close().await?;
                        Ok::<_, race_ht::RaceError>(c)
                    });
                    let c = c.map_err(|e| anyhow::anyhow!("checking race index {:?}: {e}", job.name))?;
                    println!(
                        "race {:?}: {} keys in {} subtables (depth {}), {} faults: {} duplicates, {} frozen slots in live \
                         subtables, {} misplaced keys, {} undecodable blocks, {} bad bucket headers; {}; {} live bytes; \
                         blade heap: {} bytes in use, {} of them free-listed for reuse, \
                         {} neither (other objects, memory held by running clients or lost by killed ones)",
                        job.name,
                        c.keys,
                        c.subtables,
                        c.depth,
                        c.faults(),
                        c.duplicates,
                        c.frozen_slots,
                        c.misplaced,
                        c.undecodable,
                        c.bad_headers,
                        resize_locks(&c),
                        c.live_bytes,
                        heap_sum,
                        free_sum,
                        heap_sum.saturating_sub(free_sum + c.live_bytes)
                    );
                    (c.faults() == 0, serde_json::to_value(&c)?)
                }
                App::Sherman => {
                    let r = rt.block_on(async move {
                        if !ShermanBt::exists(&ctx, &name).await? {
                            return Err(sherman_bt::ShermanError::Config(format!("no sherman index {name:?}")));
                        }
                        let (mut tree, _) = ShermanBt::open_or_create(&ctx, &name).await?;
                        tree.walk().await.map(|(shape, _)| shape)
                    });
                    match r {
                        Ok(shape) => {
                            println!(
                                "sherman {:?}: sound; {shape:?}; blade heap: {heap_sum} bytes in use, {free_sum} of them \
                                 free-listed for reuse, {} neither (other objects, memory held by running clients or \
                                 lost by killed ones)",
                                job.name,
                                heap_sum.saturating_sub(free_sum + shape.live_bytes)
                            );
                            (true, serde_json::to_value(&shape)?)
                        }
                        Err(e) => {
                            println!("sherman {:?}: {e}", job.name);
                            (false, json!({ "fault": e.to_string() }))
                        }
                    }
                }
            };
            let ok = ok && damage.is_empty();
            report::write(
                s,
                &json!({ "bench": "table", "action": "check", "app": kind, "name": job.name,
                "ok": ok, "check": detail, "heap_used_per_blade": heap, "free_listed_per_blade": free,
                "free_list_damage": damage }),
            )?;
            Ok(Outcome::of(ok, false))
        }
    }
}

/// Bytes of each blade's heap handed out so far (its bump pointer).
async fn heap_used(ctx: &smart_core::Ctx) -> smart_core::Result<Vec<u64>> {
    let mut v = Vec::new();
    for b in 0..ctx.blades().len() as u16 {
        let ptr = ctx.read_u64(smart_core::GlobalAddr::new(b, smart_core::layout::OFF_HEAP)).await?;
        v.push(ptr.saturating_sub(smart_core::layout::HEAP_START));
    }
    Ok(v)
}

/// What a check found of resizing's shared state: the publication intent,
/// the directory lock and the live subtables' split locks.
fn resize_locks(c: &race_ht::TableCheck) -> String {
    format!(
        "publication intent {}, directory lock {}, {} split locks held",
        if c.split_intent { "set" } else { "clear" },
        if c.resize_lock_held { "held" } else { "free" },
        c.split_locks_held
    )
}

/// Every object a named root on blade 0 points to, classified by its magic.
async fn list_indexes(ctx: &smart_core::Ctx) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    // A FORD database's catalog has two roots once its load completed: its
    // own (`ford:NAME`) and the mark (`ford:NAME:loaded`); listed once,
    // after the loop.
    let mut catalogs: Vec<(smart_core::GlobalAddr, Vec<u64>)> = Vec::new();
    for (tag, at) in ctx.roots(0).await? {
        let mut head = [0u8; sherman_bt::layout::META];
        ctx.read(at, &mut head).await?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        // A stored name counts only if it hashes to the root's tag.
        let named = |prefix: &str, n: Option<String>| {
            n.filter(|n| smart_core::layout::root_tag(&format!("{prefix}{n}")) == tag)
        };
        let l = if word(0) == race_ht::layout::OLD_MAGIC || word(0) == race_ht::layout::OLDER_MAGIC {
            Listed {
                kind: "race",
                name: None,
                at: at.to_string(),
                detail: format!(
                    "an older format ({}), not readable by this version",
                    String::from_utf8_lossy(&head[..8])
                ),
            }
        } else if word(0) == race_ht::layout::TABLE_MAGIC {
            let name = named(
                "race-ht:",
                ctx.read_name(smart_core::GlobalAddr::from_raw(word(race_ht::layout::NAME_WORD as usize))).await?,
            );
            let (depth, _, _) = race_ht::layout::unpack_dir(word(race_ht::layout::DIR_WORD as usize));
            let splits = word(race_ht::layout::SPLITS_WORD as usize);
            Listed { kind: "race", name, at: at.to_string(), detail: format!("global depth {depth}, {splits} splits") }
        } else if let Some(m) = sherman_bt::layout::Meta::decode(&head) {
            let name = named("sherman:", ctx.read_name(m.name).await?);
            let (level, _) = sherman_bt::layout::unpack_root(m.root);
            Listed {
                kind: "sherman",
                name,
                at: at.to_string(),
                detail: format!("depth {}, {} blades", level + 1, m.locks.len()),
            }
        } else if word(0) == ford_dtx::layout::catalog::MAGIC {
            match catalogs.iter_mut().find(|(a, _)| *a == at) {
                Some((_, tags)) => tags.push(tag),
                None => catalogs.push((at, vec![tag])),
            }
            continue;
        } else {
            Listed { kind: "other", name: None, at: at.to_string(), detail: format!("root tag {tag:#018x}") }
        };
        out.push(l);
    }
    // Names are not stored: the workloads' default names are recognised by
    // their tags.
    for (at, tags) in &catalogs {
        let name = ["smallbank", "tatp"]
            .into_iter()
            .find(|n| tags.contains(&smart_core::layout::root_tag(&format!("ford:{n}"))));
        let db = match name {
            Some(n) => ford_dtx::db::Db::open(ctx, n).await.ok().flatten(),
            None => None,
        };
        let load = if tags.len() > 1 { "loaded" } else { "its load never completed" };
        let detail = match db {
            Some(db) => format!(
                "FORD database: {} tables, {} replicas over {} blades, {load}",
                db.tables.len(),
                db.replicas,
                db.blades
            ),
            None => format!("FORD database, {load}"),
        };
        out.push(Listed { kind: "ford", name: name.map(str::to_string), at: at.to_string(), detail });
    }
    Ok(out)
}
