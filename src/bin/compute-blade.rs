//! `compute-blade`: runs benchmarks against memory blades.
//!
//! Without `--blades` the memory blade is embedded in this process.

use anyhow::Result;
use clap::Parser;
use smart::cli::ComputeCli;
use smart::commands;
use smart::config::{Config, Job};

fn main() -> Result<()> {
    let cfg = Config::from_cli(&ComputeCli::parse())?;
    let transport = cfg.session.blades.connect()?;
    let ok = match &cfg.job {
        Job::Micro(m) => commands::micro(&cfg.session, &*transport, m)?,
        Job::Ycsb(y) => commands::ycsb(&cfg.session, &*transport, y)?,
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
