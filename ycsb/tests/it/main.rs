//! YCSB over the RACE hash table and the Sherman B+tree through the generic
//! driver, verified.

use std::time::Duration;

use race_ht::RaceHt;
use sherman_bt::ShermanBt;
use smart_bench::harness::RunConfig;
use smart_core::smart::SmartConfig;
use smart_core::{EmbeddedTransport, RuntimeConfig, Transport};
use smart_testkit::backends;
use ycsb::bench::{self, LoadMode, TableState, YcsbConfig, YcsbError};
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
        key_format: Default::default(),
        value_size: 16,
        verify: true,
        capacity,
        load: LoadMode::Load,
    }
}

fn verified(t: &dyn Transport, w: &str, smart: &str, keys: u64) {
    let r = bench::run::<RaceHt>(t, &run_cfg(2, 4, 300, smart), &ycsb_cfg(keys, w, 100)).unwrap();
    let run = r.run.as_ref().expect("a timed run");
    assert!(run.ops > 100, "{w}: {} ops ({:?})", run.ops, run.first_error);
    assert_eq!(run.errors, 0, "{w}: {:?}", run.first_error);
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
    let first = bench::run::<RaceHt>(&t, &run_cfg(1, 2, 60, "none"), &y).unwrap();
    assert!(!first.existed);
    assert_eq!(first.state, TableState::Created);
    let again = bench::run::<RaceHt>(&t, &run_cfg(1, 2, 60, "none"), &y).unwrap();
    assert!(again.existed);
    assert_eq!(again.state, TableState::LoadedIntoExisting);
    assert_eq!(again.violations, 0);
}

#[test]
fn scans_on_a_hash_table_and_bad_sizes_are_refused() {
    let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
    let e = bench::run::<RaceHt>(&t, &run_cfg(1, 1, 10, "none"), &ycsb_cfg(10, "e", 100)).unwrap_err();
    assert!(matches!(e, YcsbError::Config(_)) && e.to_string().contains("range scans"), "{e}");
    let mut y = ycsb_cfg(10, "a", 100);
    y.value_size = 7;
    let e = bench::run::<RaceHt>(&t, &run_cfg(1, 1, 10, "none"), &y).map(drop).unwrap_err();
    assert!(e.to_string().contains("at least 8 bytes"), "{e}");
}

fn verified_tree(t: &dyn Transport, w: &str, smart: &str, keys: u64) -> bench::YcsbReport<ShermanBt> {
    let mut y = ycsb_cfg(keys, w, keys);
    y.value_size = 8;
    let r = bench::run::<ShermanBt>(t, &run_cfg(2, 4, 300, smart), &y).unwrap();
    let run = r.run.as_ref().expect("a timed run");
    assert!(run.ops > 100, "{w}: {} ops ({:?})", run.ops, run.first_error);
    assert_eq!(run.errors, 0, "{w}: {:?}", run.first_error);
    assert_eq!((r.violations, r.duplicates), (0, 0), "{w}");
    assert!(r.shape.depth >= 2 && r.shape.keys >= keys, "{w}: {:?}", r.shape);
    assert_eq!(r.shape.unlinked, 0, "{w}: {:?}", r.shape);
    r
}

#[test]
fn verified_runs_over_the_b_tree_have_no_violations() {
    for (w, smart) in
        [("a", "none"), ("b", "all"), ("c", "spec-lookup"), ("d", "all"), ("e", "none"), ("f", "conflict-avoid")]
    {
        let r = verified_tree(&EmbeddedTransport::new(2, 64 << 20).unwrap(), w, smart, 3000);
        if w == "c" {
            assert!(r.stats.spec_hit_rate() > 0.5, "read-only with spec-lookup mostly hits: {:?}", r.stats);
            assert!(r.stats.cache_hit_rate() > 0.5, "{:?}", r.stats);
        }
        if w == "d" || w == "e" {
            assert!(r.shape.keys > 3000, "{w} inserted keys: {:?}", r.shape);
        }
    }
    let b = backends::tcp_sized(2, 64 << 20);
    verified_tree(&*b.transport, "e", "all", 2000);
}

/// YCSB's own keys (`user` + 20 digits) at 24 bytes with one 100-byte
/// field, and padded to 64 bytes with a 1000-byte record (values out of the
/// leaves): every workload verified on both indexes.
#[test]
fn every_workload_is_verified_with_ycsb_keys_and_long_values_on_both_indexes() {
    for (ksz, vsz) in [(24, 100), (64, 1000)] {
        for (w, smart) in [("a", "none"), ("b", "all"), ("c", "spec-lookup"), ("d", "all"), ("e", "none"), ("f", "all")]
        {
            let mut y = ycsb_cfg(2000, w, 2000);
            (y.key_size, y.value_size, y.key_format) = (ksz, vsz, bench::KeyFormat::Ycsb);
            let t = EmbeddedTransport::new(2, 128 << 20).unwrap();
            let r = bench::run::<ShermanBt>(&t, &run_cfg(2, 4, 300, smart), &y).unwrap();
            let run = r.run.as_ref().expect("a timed run");
            assert!(run.ops > 100 && run.errors == 0, "{ksz}/{vsz} {w}: {:?}", run.first_error);
            assert_eq!((r.violations, r.duplicates), (0, 0), "{ksz}/{vsz} {w}");
            assert!(r.shape.depth >= 2 && r.shape.keys >= 2000, "{ksz}/{vsz} {w}: {:?}", r.shape);
            if vsz > 128 {
                assert!(r.stats.blocks_written >= 2000, "{ksz}/{vsz} {w}: values out of line: {:?}", r.stats);
            }
            if w != "e" {
                let r = bench::run::<RaceHt>(&t, &run_cfg(2, 4, 300, smart), &YcsbConfig { table: "race".into(), ..y })
                    .unwrap();
                assert_eq!((r.violations, r.run.as_ref().unwrap().errors), (0, 0), "race {ksz}/{vsz} {w}");
            }
        }
    }
}

/// Workload churn (insert a key, delete the coroutine's oldest) on both
/// indexes, at the paper's sizes and with values out of line: every
/// deleted key is gone, every other one holds its value; the B+tree
/// merges and frees the pages the deletes empty.
#[test]
fn churn_deletes_exactly_what_it_says_on_both_indexes() {
    for (ksz, vsz, kf) in [(8, 8, bench::KeyFormat::Binary), (24, 1000, bench::KeyFormat::Ycsb)] {
        let mut y = ycsb_cfg(3000, "churn", 3000);
        (y.key_size, y.value_size, y.key_format) = (ksz, vsz, kf);
        let t = EmbeddedTransport::new(2, 256 << 20).unwrap();
        let r = bench::run::<ShermanBt>(&t, &run_cfg(2, 4, 400, "all"), &y).unwrap();
        let run = r.run.as_ref().expect("a timed run");
        assert!(run.ops > 3000 && run.errors == 0, "{ksz}/{vsz}: {} ops, {:?}", run.ops, run.first_error);
        assert_eq!((r.violations, r.resurrected, r.lost), (0, 0, 0), "{ksz}/{vsz}");
        assert!(r.read_back > 3000, "{ksz}/{vsz}: {}", r.read_back);
        assert!(r.stats.merges > 0 && r.stats.pages_freed > 0, "{ksz}/{vsz}: {:?}", r.stats);
        let r =
            bench::run::<RaceHt>(&t, &run_cfg(2, 4, 400, "all"), &YcsbConfig { table: "race".into(), ..y }).unwrap();
        assert_eq!((r.violations, r.resurrected, r.run.as_ref().unwrap().errors), (0, 0, 0), "race {ksz}/{vsz}");
    }
}

#[test]
fn eight_byte_values_work_on_the_hash_table_too() {
    let mut y = ycsb_cfg(1000, "a", 100);
    y.value_size = 8;
    let r =
        bench::run::<RaceHt>(&EmbeddedTransport::new(1, 32 << 20).unwrap(), &run_cfg(1, 4, 200, "none"), &y).unwrap();
    assert_eq!((r.violations, r.run.unwrap().errors), (0, 0));
}

/// `--load-only` then `--no-load --verify` on a table whose key was deleted
/// behind the run's back: exactly that key is reported (the attached run
/// inserts nothing that could hide it); on both indexes.
fn attached_verify_reports_exactly_the_deleted_key<I: smart_core::KvIndex>(value_size: usize) {
    let t = EmbeddedTransport::new(2, 64 << 20).unwrap();
    let mut y = ycsb_cfg(3000, "c", 100);
    y.value_size = value_size;
    y.load = LoadMode::NoLoad;
    let e = bench::run::<I>(&t, &run_cfg(1, 2, 50, "none"), &y).map(drop).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    y.load = LoadMode::LoadOnly;
    let loaded = bench::run::<I>(&t, &run_cfg(2, 4, 50, "none"), &y).unwrap();
    assert!(loaded.run.is_none() && loaded.state == TableState::Created && loaded.violations == 0);
    // Another client deletes key 1234.
    let mut rt = smart_core::Runtime::new(&t, 7, Default::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let (mut ix, _) = I::open_or_create(&ctx, "ycsb", 1).await.unwrap();
        assert!(ix.delete(&1234u64.to_be_bytes()).await.unwrap());
    });
    y.load = LoadMode::NoLoad;
    let r = bench::run::<I>(&t, &run_cfg(2, 4, 100, "none"), &y).unwrap();
    assert_eq!(r.state, TableState::Attached);
    assert_eq!(r.load_s, 0.0);
    assert_eq!((r.lost, r.lost_keys.clone()), (1, vec![1234]), "{}", I::APP);
    // (The run's reads of key 1234 count as violations too.)
    assert!(r.violations >= 1);
    // A load into it puts the key back (and says it loaded into an existing table).
    y.load = LoadMode::Load;
    let r = bench::run::<I>(&t, &run_cfg(1, 2, 50, "none"), &y).unwrap();
    assert_eq!((r.state, r.lost, r.violations), (TableState::LoadedIntoExisting, 0, 0));
}

#[test]
fn an_attached_verify_reports_exactly_the_key_deleted_behind_its_back() {
    attached_verify_reports_exactly_the_deleted_key::<RaceHt>(16);
    attached_verify_reports_exactly_the_deleted_key::<ShermanBt>(8);
}
