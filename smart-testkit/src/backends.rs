//! The backend matrix every semantic test runs against: the embedded
//! backend, the same with chaos (tearing, delayed and reordered
//! completions), and a real `memory-blade` server on loopback TCP, in this
//! process.

use std::fmt;
use std::sync::Arc;

use smart_core::blade::{BladeHandle, BladeServer};
use smart_core::hash::mix64;
use smart_core::region::Region;
use smart_core::{ChaosConfig, EmbeddedTransport, TcpTransport, Transport};

/// Bytes of each blade unless a test asks for another size.
pub const DEFAULT_BLADE_BYTES: u64 = 8 << 20;

/// A transport plus whatever keeps it alive (blade servers, stopped when
/// the `Backend` is dropped).
pub struct Backend {
    /// "embedded", "embedded+chaos", "tcp" or "verbs", for messages.
    pub name: &'static str,
    /// The transport to open runtimes on.
    pub transport: Arc<dyn Transport>,
    _blades: Vec<BladeHandle>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).field("blades", &self.transport.blades().len()).finish()
    }
}

/// `blades` embedded blades of 8 MiB.
pub fn embedded(blades: usize) -> Backend {
    embedded_sized(blades, DEFAULT_BLADE_BYTES)
}

/// `blades` embedded blades of `bytes` each.
///
/// # Panics
/// If the blades cannot be mapped.
pub fn embedded_sized(blades: usize, bytes: u64) -> Backend {
    Backend { name: "embedded", transport: Arc::new(EmbeddedTransport::new(blades, bytes).unwrap()), _blades: vec![] }
}

/// The chaos seed a test asked for, or, with `SMART_CHAOS_SEED=S` in the
/// environment, one mixed from it and `S` (so a soak run, e.g.
/// `scripts/soak.sh`, sends every chaos test down new delays, reorders and
/// tears each round). Printed to stderr, which the test harness shows when
/// the test fails: the pair reproduces the failure.
///
/// # Panics
/// If `SMART_CHAOS_SEED` is set but is not a number.
pub fn chaos_seed(seed: u64) -> u64 {
    match std::env::var("SMART_CHAOS_SEED") {
        Ok(s) => {
            let s: u64 = s.trim().parse().expect("SMART_CHAOS_SEED is a number");
            let mixed = mix64(seed ^ mix64(s));
            eprintln!("chaos seed {mixed} (the test's {seed}, SMART_CHAOS_SEED={s})");
            mixed
        }
        Err(_) => seed,
    }
}

/// `blades` embedded blades of 8 MiB in chaos mode, seeded (see
/// [`chaos_seed`]).
pub fn chaos(blades: usize, seed: u64) -> Backend {
    chaos_sized(blades, DEFAULT_BLADE_BYTES, seed)
}

/// `blades` embedded blades of `bytes` each in chaos mode, seeded (see
/// [`chaos_seed`]).
///
/// # Panics
/// If the blades cannot be mapped.
pub fn chaos_sized(blades: usize, bytes: u64, seed: u64) -> Backend {
    chaos_with(blades, bytes, ChaosConfig::new(chaos_seed(seed)))
}

/// `blades` embedded blades of `bytes` each in chaos mode whose CAS and
/// FAA write back unconditionally, not atomically with respect to WRITEs
/// (see [`ChaosConfig::write_back_atomics`]: Soft-RoCE in Linux 6.1),
/// seeded (see [`chaos_seed`]).
///
/// # Panics
/// If the blades cannot be mapped.
pub fn chaos_write_back(blades: usize, bytes: u64, seed: u64) -> Backend {
    chaos_with(blades, bytes, ChaosConfig { write_back_atomics: true, ..ChaosConfig::new(chaos_seed(seed)) })
}

fn chaos_with(blades: usize, bytes: u64, cfg: ChaosConfig) -> Backend {
    let name = if cfg.write_back_atomics { "embedded+chaos+write-back-atomics" } else { "embedded+chaos" };
    let t = EmbeddedTransport::new(blades, bytes).unwrap().with_chaos(cfg);
    Backend { name, transport: Arc::new(t), _blades: vec![] }
}

/// `blades` memory-blade servers of 8 MiB on loopback TCP (in this
/// process, on threads), and a TCP transport to them.
pub fn tcp(blades: usize) -> Backend {
    tcp_sized(blades, DEFAULT_BLADE_BYTES)
}

/// `blades` memory-blade servers of `bytes` each on loopback TCP.
///
/// # Panics
/// If a server cannot bind 127.0.0.1 or the transport cannot connect.
pub fn tcp_sized(blades: usize, bytes: u64) -> Backend {
    let handles: Vec<BladeHandle> = (0..blades)
        .map(|_| {
            let region = Arc::new(Region::anonymous(bytes).unwrap());
            BladeServer::bind("127.0.0.1:0", region).unwrap().spawn().unwrap()
        })
        .collect();
    let addrs: Vec<String> = handles.iter().map(|h| h.addr().to_string()).collect();
    Backend { name: "tcp", transport: Arc::new(TcpTransport::connect(&addrs).unwrap()), _blades: handles }
}

/// Every backend, with `blades` memory blades of 8 MiB each.
pub fn all(blades: usize) -> Vec<Backend> {
    all_sized(blades, DEFAULT_BLADE_BYTES)
}

/// Every backend, with `blades` memory blades of `bytes` each.
pub fn all_sized(blades: usize, bytes: u64) -> Vec<Backend> {
    vec![embedded_sized(blades, bytes), chaos_sized(blades, bytes, 7), tcp_sized(blades, bytes)]
}

/// Real RDMA: `blades` memory blades registered on the device named by
/// `SMART_RDMA_DEVICE` (GID index from `SMART_RDMA_GID_INDEX`), served on
/// loopback for connection setup, with a cluster secret. `None` when the variable is unset.
///
/// # Panics
/// If the device or the loopback set-up fails.
#[cfg(feature = "verbs")]
pub fn verbs(blades: usize) -> Option<Backend> {
    use smart_core::backend::verbs::{VerbsBlade, VerbsConfig, VerbsTransport};
    let device = std::env::var("SMART_RDMA_DEVICE").ok()?;
    let gid_index =
        std::env::var("SMART_RDMA_GID_INDEX").ok().map(|g| g.parse().expect("SMART_RDMA_GID_INDEX is a number"));
    let cfg = VerbsConfig { device: Some(device), gid_index };
    // With a cluster secret: every QP request carries its proof.
    let secret = smart_core::secret::Secret::random();
    let handles: Vec<BladeHandle> = (0..blades)
        .map(|_| {
            let region = Arc::new(Region::anonymous(8 << 20).unwrap());
            let vb = VerbsBlade::open(region.clone(), &cfg).unwrap();
            let server = BladeServer::bind("127.0.0.1:0", region).unwrap().with_secret(secret.clone());
            server.with_verbs(Arc::new(vb)).spawn().unwrap()
        })
        .collect();
    let addrs: Vec<String> = handles.iter().map(|h| h.addr().to_string()).collect();
    let transport = Arc::new(VerbsTransport::connect_with(&addrs, &cfg, Some(secret)).unwrap());
    Some(Backend { name: "verbs", transport, _blades: handles })
}
