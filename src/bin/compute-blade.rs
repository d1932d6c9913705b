//! `compute-blade`: runs benchmarks against memory blades.
//!
//! Without `--blades` the memory blade is embedded in this process.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use smart::cli::{Cmd, ComputeCli};
use smart::commands::{self, Outcome};
use smart::config::{Config, Job};

fn main() {
    let cli = ComputeCli::parse();
    smart::report::verbose_errors(cli.verbose);
    let code = match Config::from_cli(&cli) {
        Err(e) if !matches!(cli.cmd, Cmd::Merge(_) | Cmd::VerbsInfo(_) | Cmd::Secret(_) | Cmd::Coordinator(_)) => {
            smart::report::fail("compute-blade", &e, cli.verbose, smart::report::EXIT_USAGE)
        }
        cfg => run(&cli, cfg)
            .unwrap_or_else(|e| smart::report::fail("compute-blade", &e, cli.verbose, smart::report::EXIT_FAILURE)),
    };
    std::process::exit(code);
}

/// Runs what `cli` asks; `cfg` is its resolved configuration (unused, and an
/// error, for the commands that need no blades). Returns the exit status.
fn run(cli: &ComputeCli, cfg: Result<Config>) -> Result<i32> {
    if let Cmd::Merge(m) = &cli.cmd {
        // The parts keep their own provenance; the merged record gets the merge's.
        smart::report::emit(&smart::merge::merge_files(&m.records)?, m.json.as_deref())?;
        return Ok(0);
    }
    if let Cmd::VerbsInfo(v) = &cli.cmd {
        smart::verbs_info::run(v)?;
        return Ok(0);
    }
    if let Cmd::Coordinator(a) = &cli.cmd {
        return smart::coord::command(a);
    }
    if let Cmd::Secret(a) = &cli.cmd {
        smart_core::secret::Secret::generate(&a.file)
            .with_context(|| format!("writing a new secret to {}", a.file.display()))?;
        println!(
            "wrote a new cluster secret to {} (mode 600): pass it to every blade with --secret-file",
            a.file.display()
        );
        return Ok(0);
    }
    let mut cfg = cfg?;
    if let Some(w) = smart::report::clocksource().as_deref().and_then(smart::report::slow_clock_warning) {
        eprintln!("{w}");
    }
    // SIGINT or SIGTERM stops the run cleanly: coroutines finish their
    // current operation, the summary and the record of what ran are written,
    // and the exit status is 130.
    let interrupt = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupt.clone()).context("installing signal handlers")?;
    }
    cfg.session.run.interrupt = Some(interrupt);
    // SmallBank and TATP under a coordinator whose configuration holds
    // blades out (a failover, no rebuild yet) run without them: no
    // connection to them, and the configuration's identities check the
    // others (in `commands::dtx`) instead of the blade set's words.
    let (absent, joining) = match &cfg.job {
        Job::Dtx(d) if !d.audit_only => smart::coord::absent(&cfg.session)?,
        _ => (Vec::new(), Vec::new()),
    };
    let transport = if absent.is_empty() {
        cfg.session.blades.connect()?
    } else {
        cfg.session.blades.connect_without(&absent, None)?
    };
    // `micro` touches only memory it allocates on each blade, found again
    // through that blade's own roots: it runs on any blades, in any order.
    // `rebuild` checks the set itself, with a fresh blade in the lost one's
    // place.
    if !matches!(cfg.job, Job::Micro(_) | Job::Rebuild(_)) && absent.is_empty() {
        commands::check_blade_set(&cfg.session, &*transport)?;
    }
    let outcome = match &cfg.job {
        Job::Micro(m) => commands::micro(&cfg.session, &*transport, m)?,
        Job::Ycsb(y) => commands::ycsb(&cfg.session, &*transport, y)?,
        Job::Dtx(d) => commands::dtx(&cfg.session, transport.clone(), d, &absent, &joining)?,
        Job::Recover(r) => commands::recover(&cfg.session, transport.clone(), r)?,
        Job::Rebuild(r) => commands::rebuild(&cfg.session, &*transport, r)?,
        Job::Table(j) => commands::table(&cfg.session, &*transport, j)?,
    };
    if outcome == Outcome::Interrupted {
        eprintln!("compute-blade: interrupted; the record holds what ran");
    }
    Ok(outcome.exit_code())
}
