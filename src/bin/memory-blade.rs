//! `memory-blade`: serves a region of memory to compute blades.
//!
//! Prints `ready HOST:PORT` on stdout once it accepts connections; stops
//! cleanly on SIGINT or SIGTERM, flushing its backing file.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use smart::cli::MemoryCli;
use smart::config::Link;
use smart_core::blade::BladeServer;
use smart_core::region::Region;

fn main() {
    let args = MemoryCli::parse();
    smart::report::verbose_errors(args.verbose);
    let link = check(&args)
        .unwrap_or_else(|e| smart::report::fail("memory-blade", &e, args.verbose, smart::report::EXIT_USAGE));
    if let Err(e) = run(&args, link) {
        smart::report::fail("memory-blade", &e, args.verbose, smart::report::EXIT_FAILURE);
    }
}

/// The flags' values, checked together (a usage error otherwise).
fn check(args: &MemoryCli) -> Result<Link> {
    let link = Link::resolve(&args.link)?;
    if link == Link::Sim {
        anyhow::bail!(
            "--transport sim is compute-blade's: a simulated cluster has its memory blades inside it (run \
             compute-blade ... --transport sim)"
        );
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    if args.max_connections_per_peer == Some(0) {
        anyhow::bail!("--max-connections-per-peer must be at least 1");
    }
    if args.response_memory < 1 << 20 {
        anyhow::bail!("--response-memory must be at least 1MiB");
    }
    if !(args.idle_timeout > 0.0 && args.idle_timeout <= 1e6) {
        anyhow::bail!("--idle-timeout must be more than 0 and at most 1000000 seconds");
    }
    if let Some(size) = args.size {
        smart::config::check_blade_size("--size", size)?;
    }
    let verbs = link != Link::Tcp;
    if args.durable && args.backing_file.is_none() {
        anyhow::bail!("--durable needs --backing-file: an anonymous region has no disk to sync to");
    }
    if args.durable && verbs {
        anyhow::bail!(
            "--durable serves TCP only: an RDMA client's writes reach the region through the RNIC, without \
             this process, so it cannot sync them before they complete (that needs persistent memory and \
             RDMA FLUSH)"
        );
    }
    #[cfg(not(feature = "verbs"))]
    if verbs {
        anyhow::bail!("{}", smart_core::backend::verbs::NOT_BUILT);
    }
    Ok(link)
}

/// Serves until SIGINT or SIGTERM.
fn run(args: &MemoryCli, link: Link) -> Result<()> {
    let verbs = link != Link::Tcp;
    // A file this start creates is removed if the start fails.
    let new_file = args.backing_file.as_ref().filter(|p| !p.exists()).cloned();
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
    let server = match set_up(args, &link, &region) {
        Ok(s) => s,
        Err(e) => {
            drop(region);
            if let Some(p) = new_file {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };
    let stop = server.stop_flag();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let addr = server.local_addr()?;
    let how = if verbs { "RDMA verbs (connection setup on this port) and tcp" } else { "tcp" };
    // The identity that compute blades' set checks name in their messages.
    let id = region.load_u64(smart_core::layout::OFF_IDENTITY).context("reading the superblock")?;
    let durable = if args.durable { ", durable (writes on disk before they complete)" } else { "" };
    eprintln!("memory-blade: serving {} bytes ({what}) over {how}, identity {id:#018x}{durable}", region.len());
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {addr}")?;
    out.flush()?;
    drop(out);
    server.serve().context("accepting connections")?;
    region.flush().context("flushing the backing file")?;
    eprintln!("memory-blade: stopped");
    Ok(())
}

/// The server for `region` as the flags ask, not yet serving.
fn set_up(args: &MemoryCli, link: &Link, region: &Arc<Region>) -> Result<BladeServer> {
    let mut server = BladeServer::bind(&args.listen, region.clone())
        .with_context(|| format!("listening on {}", args.listen))?
        .with_max_connections(args.max_connections)
        .with_response_memory(usize::try_from(args.response_memory).unwrap_or(usize::MAX))
        .with_idle_timeout(std::time::Duration::from_secs_f64(args.idle_timeout));
    if let Some(n) = args.max_connections_per_peer {
        server = server.with_max_per_peer(n);
    }
    match smart::config::load_secret(args.secret_file.as_deref())? {
        Some(secret) => server = server.with_secret(secret),
        None => eprintln!(
            "memory-blade: warning: no --secret-file: anyone who reaches this port can read and write the region \
             and revoke compute blades"
        ),
    }
    if let (true, Some(p)) = (args.durable, &args.backing_file) {
        server = server.with_durable()?;
        // The file as formatted (superblock, identity) and its name in its
        // directory are on disk before the first compute blade connects.
        region.flush().with_context(|| format!("syncing backing file {}", p.display()))?;
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing directory {}", dir.display()))?;
    }
    // The device is opened before "ready", so a missing one fails at once.
    #[cfg(feature = "verbs")]
    if let Link::Verbs { device, gid_index } = link {
        use smart_core::backend::verbs::{VerbsBlade, VerbsConfig};
        let cfg = VerbsConfig { device: device.clone(), gid_index: *gid_index };
        let vb = VerbsBlade::open(region.clone(), &cfg).context("opening the RDMA device")?;
        eprintln!("memory-blade: region registered on RDMA device {}", vb.device());
        server = server.with_verbs(std::sync::Arc::new(vb));
    }
    #[cfg(not(feature = "verbs"))]
    let _ = link;
    if let Some(p) = &args.backing_file {
        // Last: a start that fails leaves no such file behind.
        let log = smart_core::fence::log_path(p);
        let (s, n) = server.with_fence_log(&log).with_context(|| format!("opening {}", log.display()))?;
        server = s;
        eprintln!("memory-blade: revoked compute blades recorded in {} ({n} refused from the start)", log.display());
    }
    Ok(server)
}
