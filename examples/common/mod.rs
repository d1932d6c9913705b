//! What the examples share: their few flags and the transport they name.
//!
//! Every example runs on the embedded backend (memory blades inside this
//! process) unless `--blades HOST:PORT[,...]` names `memory-blade`
//! processes to use over TCP.

use std::sync::Arc;

use anyhow::{bail, Context as _};
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, TcpTransport, Transport};

/// The examples' flags.
#[derive(Debug)]
pub(crate) struct Args {
    /// `--blades`: memory blades over TCP (none: embedded).
    pub(crate) blades: Vec<String>,
    /// `--threads` (default 2).
    pub(crate) threads: usize,
    /// `--coroutines` per thread (default 8).
    pub(crate) coroutines: usize,
    /// `--ops`: operations per coroutine (default per example).
    pub(crate) ops: u64,
    /// `--smart all|none|LIST` (default all).
    pub(crate) smart: SmartConfig,
}

impl Args {
    /// Parses the command line; `ops` is the default of `--ops`.
    pub(crate) fn parse(ops: u64) -> anyhow::Result<Args> {
        let mut a = Args { blades: vec![], threads: 2, coroutines: 8, ops, smart: SmartConfig::parse("all").unwrap() };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--blades" => a.blades = value()?.split(',').map(str::to_string).collect(),
                "--threads" => a.threads = value()?.parse().context("--threads")?,
                "--coroutines" => a.coroutines = value()?.parse().context("--coroutines")?,
                "--ops" => a.ops = value()?.parse().context("--ops")?,
                "--smart" => a.smart = SmartConfig::parse(&value()?).map_err(anyhow::Error::msg)?,
                "-h" | "--help" => {
                    println!("flags: [--blades HOST:PORT,...] [--threads T] [--coroutines C] [--ops N] [--smart all|none|LIST]");
                    std::process::exit(0);
                }
                other => bail!("unknown flag {other:?} (try --help)"),
            }
        }
        if a.threads == 0 || a.coroutines == 0 {
            bail!("--threads and --coroutines must be at least 1");
        }
        Ok(a)
    }

    /// The memory blades: `--blades` over TCP, else one embedded blade of 256 MiB.
    pub(crate) fn transport(&self) -> anyhow::Result<Arc<dyn Transport>> {
        Ok(if self.blades.is_empty() {
            Arc::new(EmbeddedTransport::new(1, 256 << 20)?)
        } else {
            Arc::new(TcpTransport::connect(&self.blades)?)
        })
    }
}
