//! `compute-blade verbs-info`: what this host offers the verbs backend,
//! for a person before a run and for `scripts/cluster preflight`.
//!
//! Every RDMA device (ports, GIDs, limits, atomics, thread domains), the
//! locked-memory limit registration needs, and the huge pages reserved.
//! Fails (exit 1) when no device, or not the one named, has an active port.

use anyhow::{bail, Result};
use serde_json::json;

use crate::cli::VerbsInfoArgs;

/// The limit on locked memory (`ulimit -l`) of this process, in bytes:
/// `None` when unlimited, from `/proc/self/limits`.
fn memlock(limits: &str) -> Option<Option<u64>> {
    let line = limits.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        Some(None)
    } else {
        soft.parse().ok().map(Some)
    }
}

/// `HugePages_Total` and `HugePages_Free` of `/proc/meminfo`.
fn huge_pages(meminfo: &str) -> (u64, u64) {
    let get = |key: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("HugePages_Total:"), get("HugePages_Free:"))
}

/// The host's lines: locked memory and huge pages. `scripts/cluster
/// preflight` reads them (`locked memory limit: … under 1 GiB`, `huge pages
/// (2 MiB): 0 reserved`): keep their wording.
fn host_lines(memlock: Option<Option<u64>>, huge: (u64, u64)) -> String {
    let lock = match memlock {
        Some(None) => "unlimited".to_string(),
        Some(Some(b)) if b < 1 << 30 => {
            format!("{b} bytes, under 1 GiB: registering a blade's region may fail (raise it: ulimit -l unlimited)")
        }
        Some(Some(b)) => format!("{b} bytes"),
        None => "unknown".to_string(),
    };
    format!(
        "locked memory limit: {lock}\nhuge pages (2 MiB): {} reserved, {} free{}\n",
        huge.0,
        huge.1,
        if huge.0 == 0 { " (optional: regions and buffers then use normal pages)" } else { "" }
    )
}

/// Runs `compute-blade verbs-info`.
///
/// # Errors
/// No verbs backend in this build; no device, or none (or not the one
/// named) with an active port; a device that cannot be queried.
pub fn run(args: &VerbsInfoArgs) -> Result<()> {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (lock, huge) = (memlock(&limits), huge_pages(&meminfo));
    let devices = probe();
    for d in devices.iter().flatten() {
        print!("{}", d.text());
    }
    print!("{}", host_lines(lock, huge));
    let devices = devices?;
    let descs: Vec<_> = devices.iter().map(|d| d.desc()).collect();
    let chosen = smart_core::backend::verbs::device::choose(&descs, args.device.as_deref());
    if let Some(path) = &args.json {
        let rec = json!({
            "devices": devices,
            "chosen": chosen.as_ref().ok().map(|(i, port)| json!({"device": descs[*i].name, "port": port})),
            "memlock_bytes": lock.flatten(),
            "memlock_unlimited": lock == Some(None),
            "hugepages_total": huge.0,
            "hugepages_free": huge.1,
        });
        crate::report::emit(&rec, Some(path))?;
    }
    match chosen {
        Ok((i, port)) => {
            println!("a run would use {} port {port}", descs[i].name);
            Ok(())
        }
        Err(why) => bail!("{why}"),
    }
}

#[cfg(feature = "verbs")]
fn probe() -> Result<Vec<smart_core::backend::verbs::device::DeviceReport>> {
    Ok(smart_core::backend::verbs::probe()?)
}

#[cfg(not(feature = "verbs"))]
fn probe() -> Result<Vec<smart_core::backend::verbs::device::DeviceReport>> {
    bail!("{}", smart_core::backend::verbs::NOT_BUILT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locked_memory_limit_and_huge_pages_are_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max locked memory         8388608              8388608              bytes\n";
        assert_eq!(memlock(limits), Some(Some(8_388_608)));
        let unlimited = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(memlock(unlimited), Some(None));
        assert_eq!(memlock("nothing"), None);
        let meminfo = "MemTotal: 1 kB\nHugePages_Total:     400\nHugePages_Free:      398\n";
        assert_eq!(huge_pages(meminfo), (400, 398));
        let text = host_lines(Some(Some(8_388_608)), (0, 0));
        assert!(text.contains("8388608 bytes, under 1 GiB: registering"), "{text}");
        assert!(text.contains("0 reserved, 0 free (optional"), "{text}");
        assert!(host_lines(Some(None), (400, 398)).starts_with("locked memory limit: unlimited\n"));
    }
}
