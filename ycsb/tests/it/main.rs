//! YCSB over the RACE hash table through the generic driver, verified.

use std::time::Duration;

use race_ht::RaceHt;
use smart_bench::harness::RunConfig;
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, RuntimeConfig, Transport};
use smart_testkit::backends;
use ycsb::bench::{self, YcsbConfig, YcsbError};
use ycsb::{KeyChooser, Workload};

fn run_cfg(threads: usize, coroutines: usize, ms: u64, smart: &str) -> RunConfig {
    RunConfig {
        threads,
        coroutines,
        duration: Duration::from_millis(ms),
        warmup: Duration::from_millis(ms / 6),
        runtime: RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() },
        progress: false,
        ..RunConfig::default()
    }
}

fn ycsb_cfg(keys: u64, workload: &str, capacity: u64) -> YcsbConfig {
    YcsbConfig {
        table: "ycsb".into(),
        keys,
        workload: Workload::parse(workload).unwrap(),
        chooser: KeyChooser::zipfian(keys, 0.99),
        key_size: 8,
        value_size: 16,
        verify: true,
        capacity,
    }
}

fn verified(t: &dyn Transport, w: &str, smart: &str, keys: u64) {
    let r = bench::run::<RaceHt>(t, &run_cfg(2, 4, 300, smart), &ycsb_cfg(keys, w, 100)).unwrap();
    assert!(r.run.ops > 100, "{w}: {} ops ({:?})", r.run.ops, r.run.first_error);
    assert_eq!(r.run.errors, 0, "{w}: {:?}", r.run.first_error);
    assert_eq!((r.violations, r.duplicates), (0, 0), "{w}");
    assert!(!r.existed, "{w}: a fresh blade has no table");
    assert!(r.shape.splits >= 4 && r.shape.subtables >= 5, "{w}: the table grew: {:?}", r.shape);
    assert!(r.stats.splits > 0, "{w}: the workers split it: {:?}", r.stats);
    if w == "c" && smart.contains("spec") {
        assert!(r.stats.spec_hits > r.stats.spec_misses, "read-only with spec-lookup mostly hits: {:?}", r.stats);
    }
}

#[test]
fn verified_runs_over_the_hash_table_have_no_violations() {
    for (w, smart) in [("a", "none"), ("c", "spec-lookup"), ("d", "all"), ("f", "none"), ("update-only", "all")] {
        // A fresh blade each time: the table is created, loaded and grown anew
        // (from 100 keys: the load and the inserts of d grow it).
        verified(&EmbeddedTransport::new(2, 64 << 20).unwrap(), w, smart, 2000);
    }
}

#[test]
fn verified_runs_over_tcp_have_no_violations() {
    for (w, smart) in [("a", "conflict-avoid"), ("d", "all")] {
        let b = backends::tcp_sized(2, 64 << 20);
        verified(&*b.transport, w, smart, 2000);
    }
}

#[test]
fn a_second_run_finds_the_table_and_says_so() {
    let t = EmbeddedTransport::new(1, 64 << 20).unwrap();
    let y = ycsb_cfg(500, "c", 500);
    assert!(!bench::run::<RaceHt>(&t, &run_cfg(1, 2, 60, "none"), &y).unwrap().existed);
    let again = bench::run::<RaceHt>(&t, &run_cfg(1, 2, 60, "none"), &y).unwrap();
    assert!(again.existed);
    assert_eq!(again.violations, 0);
}

#[test]
fn scans_on_a_hash_table_and_bad_sizes_are_refused() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let e = bench::run::<RaceHt>(&t, &run_cfg(1, 1, 10, "none"), &ycsb_cfg(10, "e", 100)).unwrap_err();
    assert!(matches!(e, YcsbError::Config(_)) && e.to_string().contains("range scans"), "{e}");
    let mut y = ycsb_cfg(10, "a", 100);
    y.value_size = 8;
    let e = bench::run::<RaceHt>(&t, &run_cfg(1, 1, 10, "none"), &y).unwrap_err();
    assert!(e.to_string().contains("values 16"), "{e}");
}
