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
