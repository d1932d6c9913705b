//! The verbs backend on a real RDMA device: the same semantic and error-path
//! suites as the other backends, each part on fresh blades. These tests need
//! a device, so they are ignored by default. Run them on a host with RDMA,
//! or in the Soft-RoCE VM (`scripts/softroce-vm.sh`, see README):
//!
//! ```sh
//! SMART_RDMA_DEVICE=rxe0 [SMART_RDMA_GID_INDEX=1] cargo test --release -p smart-core --features verbs -- --ignored verbs_
//! ```
//!
//! Without a device, the backend must refuse quickly and say why; that part
//! runs everywhere the feature is built.

use std::time::{Duration, Instant};

use smart_core::backend::verbs::{VerbsConfig, VerbsTransport, NO_DEVICE_HELP};

use smart_testkit::backends;

use crate::semantics;

/// Fresh blades registered on the device: no part depends on what an
/// earlier one left behind.
fn device_backend(blades: usize) -> backends::Backend {
    backends::verbs(blades).expect("set SMART_RDMA_DEVICE to an RDMA device (e.g. rxe0) to run the device tests")
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_semantic_suite() {
    semantics::verbs_behave_like_rdma_on_every_backend_on(&device_backend(2));
    semantics::bad_batches_are_refused_before_posting_on(&device_backend(2));
    semantics::named_roots_have_one_winner_on(&device_backend(1));
    semantics::batches_posted_before_a_poll_execute_in_posting_order_on(&device_backend(1));
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_error_completions_and_reset() {
    // Out of bounds, offset overflow, wrong rkey: one completion per failed
    // batch with the failing WR's index, later batches flushed, the other
    // thread's QP and the other blade unaffected, reset brings the QP back.
    semantics::bad_wrs_get_error_completions_and_error_only_their_qp_on(&device_backend(2));
    semantics::runtime_reports_error_completions_and_recovers_after_reset_on(&device_backend(1));
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_dropped_future_and_teardown_in_flight() {
    semantics::dropped_future_keeps_its_slot_until_completion_on(&device_backend(1));
    semantics::teardown_with_wrs_in_flight_is_clean_on(device_backend(2));
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_a_revoked_owner_runs_no_verb() {
    // The blade moves its ends of the owner's QPs to the error state: the
    // RNIC drops their requests, and the client's verbs never complete
    // (Soft-RoCE under emulation: the request time-out) or their retries
    // run out.
    crate::fence::a_revoked_owner_runs_no_verb_and_cannot_connect_again_on(&device_backend(2), |e| {
        matches!(e, smart_core::Error::Wc { .. } | smart_core::Error::Timeout { .. })
    });
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
