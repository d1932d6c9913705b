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

/// The device of `SMART_RDMA_DEVICE`, with `SMART_RDMA_GID_INDEX`.
fn device_config() -> VerbsConfig {
    let device = std::env::var("SMART_RDMA_DEVICE").expect("set SMART_RDMA_DEVICE to an RDMA device (e.g. rxe0)");
    let gid_index =
        std::env::var("SMART_RDMA_GID_INDEX").ok().map(|g| g.parse().expect("SMART_RDMA_GID_INDEX is a number"));
    VerbsConfig { device: Some(device), gid_index }
}

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
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_a_client_without_the_secret_gets_no_qp() {
    use std::sync::Arc;

    use smart_core::backend::verbs::VerbsBlade;
    use smart_core::blade::BladeServer;
    use smart_core::region::Region;
    use smart_core::secret::Secret;
    use smart_core::{Runtime, RuntimeConfig};

    let cfg = device_config();
    let secret = Secret::random();
    let region = Arc::new(Region::anonymous(8 << 20).unwrap());
    let vb = VerbsBlade::open(region.clone(), &cfg).unwrap();
    let server = BladeServer::bind("127.0.0.1:0", region).unwrap().with_secret(secret.clone());
    let h = server.with_verbs(Arc::new(vb)).spawn().unwrap();
    let addrs = [h.addr().to_string()];
    let err = VerbsTransport::connect(&addrs, &cfg).unwrap_err();
    assert!(err.to_string().contains("--secret-file"), "{err}");
    let t = VerbsTransport::connect_with(&addrs, &cfg, Some(Secret::random())).unwrap();
    let err = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap_err();
    assert!(err.to_string().contains("cluster secret"), "{err}");
    let t = VerbsTransport::connect_with(&addrs, &cfg, Some(secret)).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let v = rt.block_on(async move {
        let a = ctx.alloc(0, 64, 8).await.unwrap();
        ctx.faa(a, 7).await.unwrap();
        ctx.read_u64(a).await.unwrap()
    });
    assert_eq!(v, 7);
}

#[test]
#[ignore = "needs an RDMA device: SMART_RDMA_DEVICE=rxe0 cargo test --release -p smart-core --features verbs -- --ignored verbs_"]
fn verbs_device_a_revoked_owner_is_refused_after_the_blade_restarts() {
    use std::sync::Arc;

    use smart_core::backend::verbs::VerbsBlade;
    use smart_core::blade::BladeServer;
    use smart_core::region::Region;
    use smart_core::{Fencing, Runtime, RuntimeConfig};

    let cfg = device_config();
    let file = std::env::temp_dir().join(format!("smart-verbs-fenced-{}.img", std::process::id()));
    let log = smart_core::fence::log_path(&file);
    let _ = (std::fs::remove_file(&file), std::fs::remove_file(&log));
    let tagged = |tag| RuntimeConfig {
        fence_tag: tag,
        request_timeout: Some(Duration::from_secs(3)),
        ..RuntimeConfig::default()
    };
    // A blade on the file, with its record of revoked owners beside it.
    let start = |size| {
        let region = Arc::new(Region::file_backed(&file, size).unwrap());
        let vb = VerbsBlade::open(region.clone(), &cfg).unwrap();
        let (server, refused) =
            BladeServer::bind("127.0.0.1:0", region).unwrap().with_verbs(Arc::new(vb)).with_fence_log(&log).unwrap();
        let h = server.spawn().unwrap();
        let t = VerbsTransport::connect(&[h.addr().to_string()], &cfg).unwrap();
        (h, t, refused)
    };
    let (h, t, refused) = start(Some(8 << 20));
    assert_eq!(refused, 0);
    let owner = Runtime::new(&t, 0, tagged(42)).unwrap();
    let rec = Runtime::new(&t, 1, tagged(0)).unwrap();
    assert_eq!(rec.ctx().revoke(42).unwrap(), Fencing::Enforced(1));
    drop((owner, rec, t, h));
    // Started again on the file: owner 42's QPs are refused, others run.
    let (h, t, refused) = start(None);
    assert_eq!(refused, 1);
    let err = Runtime::new(&t, 0, tagged(42)).unwrap_err();
    assert!(err.to_string().contains("revoked its registration"), "{err}");
    let mut other = Runtime::new(&t, 1, tagged(43)).unwrap();
    let ctx = other.ctx();
    let v = other.block_on(async move {
        let a = ctx.alloc(0, 64, 8).await.unwrap();
        ctx.faa(a, 5).await.unwrap();
        ctx.read_u64(a).await.unwrap()
    });
    assert_eq!(v, 5);
    drop((other, t, h));
    let _ = (std::fs::remove_file(&file), std::fs::remove_file(&log));
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
