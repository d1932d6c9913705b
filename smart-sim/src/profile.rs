//! The hardware a simulation models, as a profile: every parameter of every
//! component, with its unit, read from TOML (`profiles/*.toml`).
//!
//! The built-in profile, [`Profile::connectx6`], is the Smart paper's
//! testbed (200 Gbps ConnectX-6, 96-thread compute blades), calibrated on
//! the Smart artifact's micro-benchmarks. A profile for another NIC is a
//! copy of `profiles/connectx6.toml` with other values; every field must be
//! present, and an unknown field is refused (a typo would otherwise be
//! ignored).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The built-in profile's text.
pub const CONNECTX6: &str = include_str!("../profiles/connectx6.toml");

/// A complete hardware profile (see `profiles/connectx6.toml` for what each
/// field means and where its value comes from).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The profile's name, recorded with every simulated run.
    pub name: String,
    /// The compute blade's CPU.
    pub cpu: Cpu,
    /// Doorbell and QP locks.
    pub doorbell: Doorbell,
    /// The compute blade's RNIC.
    pub nic: Nic,
    /// The network.
    pub network: Network,
    /// The memory blade's RNIC and DMA path.
    pub memory: Memory,
    /// The applications' own CPU work per doorbell.
    pub app: App,
}

/// The applications' own work between two doorbells of a coroutine (ns),
/// beyond what `cpu.op_ns` charges every doorbell (micro's loop): hashing,
/// parsing buckets and pages, a transaction's bookkeeping. Charged by the
/// command line to the application it runs (`--sim-app-ns` overrides).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct App {
    /// race-ht under YCSB.
    pub race_ns: u64,
    /// sherman-bt under YCSB.
    pub sherman_ns: u64,
    /// ford-dtx under SmallBank.
    pub smallbank_ns: u64,
    /// ford-dtx under TATP.
    pub tatp_ns: u64,
}

/// CPU costs of a posting thread, in ns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    /// Building a WQE and ringing the doorbell, per doorbell.
    pub post_doorbell_ns: u64,
    /// Each further WR of a batch.
    pub post_wr_ns: u64,
    /// One poll of the CQ.
    pub poll_ns: u64,
    /// Per completion taken from the CQ.
    pub cqe_ns: u64,
    /// The application's work per doorbell.
    pub op_ns: u64,
}

/// The spinlock of a shared doorbell or QP, in ns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Doorbell {
    /// Hold time of an uncontended post.
    pub lock_ns: u64,
    /// The lock's line moving from another thread's core.
    pub line_transfer_ns: u64,
    /// Extra hold per thread spinning at hand-over.
    pub waiter_penalty_ns: u64,
}

/// The compute blade's RNIC.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// Processing units.
    pub engines: usize,
    /// Engine time per WR, cache hit (ns).
    pub wqe_ns: u64,
    /// Outstanding WRs that fit in the on-chip cache.
    pub cache_wrs: u64,
    /// Extra engine time of a WR whose WQE missed the cache (ns).
    pub miss_ns: u64,
    /// Writing a CQE and the data into host memory (ns).
    pub cqe_dma_ns: u64,
}

/// Links and propagation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Bandwidth per direction, Gbit/s.
    pub bandwidth_gbps: f64,
    /// One-way latency without serialisation (ns).
    pub latency_ns: u64,
    /// Header bytes per packet.
    pub header_bytes: u64,
    /// Path MTU (bytes of payload per packet).
    pub mtu_bytes: u64,
}

/// The memory blade's RNIC and its DMA path to DRAM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Responder processing units.
    pub engines: usize,
    /// Engine time per request (ns).
    pub op_ns: u64,
    /// PCIe bandwidth to DRAM, Gbit/s.
    pub pcie_gbps: f64,
    /// A READ's DMA round trip (ns).
    pub dma_read_ns: u64,
    /// An atomic's read-modify-write, during which its address is held (ns).
    pub atomic_ns: u64,
    /// Slots of the atomics' lock table.
    pub atomic_slots: usize,
}

impl Memory {
    /// Time to move `bytes` over the PCIe path at full bandwidth (ns, at
    /// least 1).
    pub fn transfer_ns(&self, bytes: u64) -> u64 {
        ((bytes as f64 * 8.0 / self.pcie_gbps).ceil() as u64).max(1)
    }
}

impl Profile {
    /// The built-in, calibrated ConnectX-6 profile.
    ///
    /// # Panics
    /// Never: the built-in text is checked by a test.
    pub fn connectx6() -> Profile {
        Profile::parse(CONNECTX6).expect("the built-in profile parses")
    }

    /// A profile from TOML text, checked ([`Profile::check`]).
    ///
    /// # Errors
    /// Bad TOML, a missing or unknown field, or a value out of range.
    pub fn parse(text: &str) -> Result<Profile, String> {
        let p: Profile = toml::from_str(text).map_err(|e| e.to_string())?;
        p.check()?;
        Ok(p)
    }

    /// `connectx6` (the built-in one), or a TOML file.
    ///
    /// # Errors
    /// An unknown name that is no readable file; a bad file.
    pub fn load(name_or_file: &str) -> Result<Profile, String> {
        if name_or_file == "connectx6" {
            return Ok(Profile::connectx6());
        }
        let path = Path::new(name_or_file);
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "simulation profile {name_or_file:?}: not a built-in profile (connectx6), and not a readable file: {e}"
            )
        })?;
        Profile::parse(&text).map_err(|e| format!("simulation profile {}: {e}", path.display()))
    }

    /// Checks the values' ranges.
    ///
    /// # Errors
    /// Names the first value out of range.
    pub fn check(&self) -> Result<(), String> {
        let positive = |what: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(format!("{what} must be positive"))
            }
        };
        positive("nic.engines", self.nic.engines as f64)?;
        positive("nic.wqe_ns", self.nic.wqe_ns as f64)?;
        positive("nic.cache_wrs", self.nic.cache_wrs as f64)?;
        positive("network.bandwidth_gbps", self.network.bandwidth_gbps)?;
        positive("network.mtu_bytes", self.network.mtu_bytes as f64)?;
        positive("memory.engines", self.memory.engines as f64)?;
        positive("memory.pcie_gbps", self.memory.pcie_gbps)?;
        positive("memory.atomic_slots", self.memory.atomic_slots as f64)?;
        if self.nic.engines > 1024 || self.memory.engines > 1024 {
            return Err("at most 1024 engines".into());
        }
        if !self.memory.atomic_slots.is_power_of_two() {
            return Err("memory.atomic_slots must be a power of two".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_profile_parses_and_unknown_or_missing_fields_are_refused() {
        let p = Profile::connectx6();
        assert_eq!(p.name, "connectx6");
        let typo = CONNECTX6.replace("wqe_ns", "wqe_nss");
        assert!(Profile::parse(&typo).unwrap_err().contains("wqe_nss"), "unknown field named");
        let missing = CONNECTX6.replace("miss_ns = ", "# miss_ns = ");
        assert!(Profile::parse(&missing).unwrap_err().contains("miss_ns"), "missing field named");
        let mut zero = Profile::connectx6();
        zero.nic.engines = 0;
        assert!(zero.check().unwrap_err().contains("nic.engines"));
        assert!(Profile::load("no-such-nic").unwrap_err().contains("not a built-in profile"));
    }
}
