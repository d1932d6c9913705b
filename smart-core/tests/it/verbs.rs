//! The verbs backend on a real RDMA device: the same semantic suite as the
//! other backends. These tests need a device, so they are ignored by
//! default. Run them on a host with RDMA (or Soft-RoCE, see README):
//!
//! ```sh
//! SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_
//! ```
//!
//! Without a device, the backend must refuse quickly and say why; that part
//! runs everywhere the feature is built.

use std::time::{Duration, Instant};

use smart_core::backend::verbs::{VerbsConfig, VerbsTransport, NO_DEVICE_HELP};

use smart_testkit::backends;

use crate::semantics;

const HOW: &str = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_";

fn device_backend(blades: usize) -> backends::Backend {
    backends::verbs(blades).expect("set SMART_RDMA_DEVICE to an RDMA device (e.g. rxe0) to run the device tests")
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_semantic_suite() {
    let _ = HOW;
    let b = device_backend(2);
    semantics::verbs_behave_like_rdma_on_every_backend_on(&b);
    semantics::bad_batches_are_refused_before_posting_on(&b);
    semantics::named_roots_have_one_winner_on(&b);
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_error_completions_and_reset() {
    let b = device_backend(2);
    semantics::bad_wrs_get_error_completions_and_error_only_their_qp_on(&b);
    let b = device_backend(1);
    semantics::runtime_reports_error_completions_and_recovers_after_reset_on(&b);
}

#[test]
fn without_a_device_connecting_fails_fast_and_names_the_alternatives() {
    if std::env::var("SMART_RDMA_DEVICE").is_ok() {
        return; // a device is configured: the device tests cover this host
    }
    let t0 = Instant::now();
    let e = VerbsTransport::connect(&["127.0.0.1:1".to_string()], &VerbsConfig::default()).unwrap_err().to_string();
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    // On a machine with RDMA but nothing listening, the error is about the blade instead.
    assert!(e.contains(&NO_DEVICE_HELP[..20]) || e.contains("127.0.0.1:1"), "{e}");
    if e.contains(&NO_DEVICE_HELP[..20]) {
        assert!(e.contains("--transport tcp") && e.contains("rdma link add"), "{e}");
    }
}
