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
    /// RDMA device (with --transport verbs; default: the first with an active port).
    #[arg(long)]
    device: Option<String>,
    /// GID index (with --transport verbs on RoCE; default 0).
    #[arg(long)]
    gid_index: Option<u32>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportArg {
    Tcp,
    Verbs,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let verbs = matches!(args.transport, TransportArg::Verbs);
    if !verbs && (args.device.is_some() || args.gid_index.is_some()) {
        bail!("--device and --gid-index apply to --transport verbs only");
    }
    #[cfg(not(feature = "verbs"))]
    if verbs {
        bail!("{}", smart_core::backend::verbs::NOT_BUILT);
    }
    let (region, what) = match &args.backing_file {
        Some(p) => (
            Region::file_backed(p, args.size).with_context(|| format!("opening backing file {}", p.display()))?,
            format!("file {}", p.display()),
        ),
        None if verbs => {
            // The RNIC translates every access: huge pages keep its caches warm.
            let (r, huge) = Region::anonymous_huge(args.size.unwrap_or(1 << 30)).context("mapping anonymous memory")?;
            if !huge {
                eprintln!(
                    "memory-blade: no 2 MiB huge pages for the region (size not a multiple of 2 MiB, or none reserved); \
                     using normal pages"
                );
            }
            (r, if huge { "anonymous, 2 MiB huge pages" } else { "anonymous" }.to_string())
        }
        None => (
            Region::anonymous(args.size.unwrap_or(1 << 30)).context("mapping anonymous memory")?,
            "anonymous".to_string(),
        ),
    };
    let region = Arc::new(region);
    #[allow(unused_mut)]
    let mut server =
        BladeServer::bind(&args.listen, region.clone()).with_context(|| format!("listening on {}", args.listen))?;
    // The device is opened before "ready", so a missing one fails at once.
    #[cfg(feature = "verbs")]
    if verbs {
        use smart_core::backend::verbs::{VerbsBlade, VerbsConfig};
        let cfg = VerbsConfig { device: args.device.clone(), gid_index: args.gid_index };
        let vb = VerbsBlade::open(region.clone(), &cfg).context("opening the RDMA device")?;
        eprintln!("memory-blade: region registered on RDMA device {}", vb.device());
        server = server.with_verbs(std::sync::Arc::new(vb));
    }
    let stop = server.stop_flag();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let addr = server.local_addr()?;
    let how = if verbs { "RDMA verbs (connection setup on this port) and tcp" } else { "tcp" };
    eprintln!("memory-blade: serving {} bytes ({what}) over {how}", region.len());
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {addr}")?;
    out.flush()?;
    drop(out);
    server.serve().context("accepting connections")?;
    region.flush().context("flushing the backing file")?;
    eprintln!("memory-blade: stopped");
    Ok(())
}
