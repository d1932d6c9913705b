//! The backends every semantic test runs against.

use std::sync::Arc;

use smart_core::blade::{BladeHandle, BladeServer};
use smart_core::region::Region;
use smart_core::{ChaosConfig, EmbeddedTransport, TcpTransport, Transport};

/// A transport plus whatever keeps it alive (a blade server).
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) _blades: Vec<BladeHandle>,
}

pub(crate) fn embedded(blades: usize) -> Backend {
    Backend { name: "embedded", transport: Arc::new(EmbeddedTransport::new(blades, 8 << 20).unwrap()), _blades: vec![] }
}

pub(crate) fn chaos(blades: usize, seed: u64) -> Backend {
    let t = EmbeddedTransport::new(blades, 8 << 20).unwrap().with_chaos(ChaosConfig::new(seed));
    Backend { name: "embedded+chaos", transport: Arc::new(t), _blades: vec![] }
}

pub(crate) fn tcp(blades: usize) -> Backend {
    let handles: Vec<BladeHandle> = (0..blades)
        .map(|_| {
            let region = Arc::new(Region::anonymous(8 << 20).unwrap());
            BladeServer::bind("127.0.0.1:0", region).unwrap().spawn().unwrap()
        })
        .collect();
    let addrs: Vec<String> = handles.iter().map(|h| h.addr().to_string()).collect();
    Backend { name: "tcp", transport: Arc::new(TcpTransport::connect(&addrs).unwrap()), _blades: handles }
}

/// Every backend, with `blades` memory blades each.
pub(crate) fn all(blades: usize) -> Vec<Backend> {
    vec![embedded(blades), chaos(blades, 7), tcp(blades)]
}

/// Real RDMA: `blades` memory blades registered on the device named by
/// `SMART_RDMA_DEVICE` (GID index from `SMART_RDMA_GID_INDEX`), served on
/// loopback for connection setup. `None` when the variable is unset.
#[cfg(feature = "verbs")]
pub(crate) fn verbs(blades: usize) -> Option<Backend> {
    use smart_core::backend::verbs::{VerbsBlade, VerbsConfig, VerbsTransport};
    let device = std::env::var("SMART_RDMA_DEVICE").ok()?;
    let gid_index =
        std::env::var("SMART_RDMA_GID_INDEX").ok().map(|g| g.parse().expect("SMART_RDMA_GID_INDEX is a number"));
    let cfg = VerbsConfig { device: Some(device), gid_index };
    let handles: Vec<BladeHandle> = (0..blades)
        .map(|_| {
            let region = Arc::new(Region::anonymous(8 << 20).unwrap());
            let vb = VerbsBlade::open(region.clone(), &cfg).unwrap();
            BladeServer::bind("127.0.0.1:0", region).unwrap().with_verbs(Arc::new(vb)).spawn().unwrap()
        })
        .collect();
    let addrs: Vec<String> = handles.iter().map(|h| h.addr().to_string()).collect();
    let transport = Arc::new(VerbsTransport::connect(&addrs, &cfg).unwrap());
    Some(Backend { name: "verbs", transport, _blades: handles })
}
