//! `memory-blade`: serves a region of memory to compute blades.
//!
//! Prints `ready HOST:PORT` on stdout once it accepts connections; stops
//! cleanly on SIGINT or SIGTERM, flushing its backing file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use smart_core::blade::BladeServer;
use smart_core::region::Region;
use smart_core::size::parse_size;

#[derive(Parser, Debug)]
#[command(version, about = "Smart-rs memory blade: serves one-sided verbs on its memory")]
struct Args {
    /// Address to listen on, e.g. 0.0.0.0:7000 (port 0 picks a free port).
    #[arg(long)]
    listen: String,
    /// Region size, e.g. 1GiB. Default 1GiB; with an existing backing file,
    /// the file's size.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Keep the region in this file: its contents survive a restart.
    #[arg(long)]
    backing_file: Option<PathBuf>,
    /// How compute blades reach the region.
    #[arg(long, value_enum, default_value_t = TransportArg::Tcp)]
    transport: TransportArg,
    /// RDMA device (with --transport verbs).
    #[arg(long)]
    device: Option<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportArg {
    Tcp,
    Verbs,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let TransportArg::Verbs = args.transport {
        bail!(
            "--transport verbs is not built yet (RDMA verbs backend: issue 5); \
             serve with --transport tcp, or run compute-blade without --blades for the embedded backend"
        );
    }
    if args.device.is_some() {
        bail!("--device applies to --transport verbs only");
    }
    let (region, what) = match &args.backing_file {
        Some(p) => (
            Region::file_backed(p, args.size).with_context(|| format!("opening backing file {}", p.display()))?,
            format!("file {}", p.display()),
        ),
        None => (
            Region::anonymous(args.size.unwrap_or(1 << 30)).context("mapping anonymous memory")?,
            "anonymous".to_string(),
        ),
    };
    let region = Arc::new(region);
    let server =
        BladeServer::bind(&args.listen, region.clone()).with_context(|| format!("listening on {}", args.listen))?;
    let stop = server.stop_flag();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let addr = server.local_addr()?;
    eprintln!("memory-blade: serving {} bytes ({what}) over tcp", region.len());
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {addr}")?;
    out.flush()?;
    drop(out);
    server.serve().context("accepting connections")?;
    region.flush().context("flushing the backing file")?;
    eprintln!("memory-blade: stopped");
    Ok(())
}
