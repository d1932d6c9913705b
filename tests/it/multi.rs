//! Several compute blades in one run: a barrier on the blade, one record
//! merged from theirs, and the provenance every record carries.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli::{compute, record, tmp, Blade, COMPUTE};

fn run_args<'a>(blade: &'a str, json: &'a str, barrier: &'a str) -> Vec<&'a str> {
    vec![
        "ycsb",
        "--blades",
        blade,
        "--keys",
        "5000",
        "--no-load",
        "--workload",
        "c",
        "--threads",
        "1",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--quiet",
        "--barrier",
        barrier,
        "--json",
        json,
    ]
}

#[test]
fn two_compute_blades_meet_at_a_barrier_and_their_records_merge_exactly() {
    let blade = Blade::start(&["--size", "128MiB"]);
    let load = compute(&["ycsb", "--blades", &blade.addr, "--keys", "5000", "--load-only", "--quiet"]);
    assert!(load.status.success(), "{}", String::from_utf8_lossy(&load.stderr));
    let (j1, j2, jm) = (tmp("multi-1.json"), tmp("multi-2.json"), tmp("multi-m.json"));
    // The second process starts 1.5 s after the first: the first must wait
    // at the barrier for it, so both measure at the same time.
    let mut first = Command::new(COMPUTE)
        .args(run_args(&blade.addr, j1.to_str().unwrap(), "t:2"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(first.try_wait().unwrap().is_none(), "the first process did not wait for the second");
    let second = compute(&run_args(&blade.addr, j2.to_str().unwrap(), "t:2"));
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(t0.elapsed() >= Duration::from_millis(2500), "the first process measured before the second arrived");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("barrier t: released after"), "{said}");
    let m = compute(&["merge", j1.to_str().unwrap(), j2.to_str().unwrap(), "--json", jm.to_str().unwrap()]);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    let (a, b, m) = (record(&j1), record(&j2), record(&jm));
    assert_eq!(m["ops"].as_u64().unwrap(), a["ops"].as_u64().unwrap() + b["ops"].as_u64().unwrap());
    assert_eq!(m["processes"], 2);
    // The merged p99 is the p99 of the merged histograms.
    let mut h = smart_bench::latency::empty_hdr();
    let mut max = 0;
    for r in [&a, &b] {
        let part: smart_bench::latency::LatencyHistogram = serde_json::from_value(r["latency_hist"].clone()).unwrap();
        h.add(part.decode().unwrap()).unwrap();
        max = max.max(part.max);
    }
    assert_eq!(m["latency_us"]["p99"].as_f64().unwrap(), smart_bench::latency::summary_of(&h, max).p99);
    assert!(a["ops"].as_u64().unwrap() > 0 && b["ops"].as_u64().unwrap() > 0);
    // Provenance: the command line, the commit, the host.
    for r in [&a, &m] {
        let p = &r["provenance"];
        assert!(p["command"].as_array().unwrap().len() > 2, "{p}");
        assert!(p["commit"].as_str().unwrap().len() >= 7, "{p}");
        assert!(p["cores"].as_u64().unwrap() >= 1 && p["date"].as_str().unwrap().ends_with('Z'), "{p}");
        // The clocksource, as sysfs names it (null where it does not).
        assert_eq!(p["clocksource"].as_str().map(String::from), smart::report::clocksource(), "{p}");
    }
    assert_eq!(a["provenance"]["command"][1], "ycsb");
    // A barrier used again by the next pair of processes: a new generation.
    let (c1, c2) = std::thread::scope(|s| {
        let x = s.spawn(|| compute(&run_args(&blade.addr, j1.to_str().unwrap(), "t:2")));
        let y = s.spawn(|| compute(&run_args(&blade.addr, j2.to_str().unwrap(), "t:2")));
        (x.join().unwrap(), y.join().unwrap())
    });
    for c in [c1, c2] {
        let e = String::from_utf8_lossy(&c.stderr);
        assert!(c.status.success() && e.contains("generation 1"), "{e}");
    }
    for f in [j1, j2, jm] {
        std::fs::remove_file(f).unwrap();
    }
}

#[test]
fn a_barrier_the_others_never_reach_fails_saying_how_many_arrived() {
    let blade = Blade::start(&["--size", "64MiB"]);
    let out = compute(&[
        "micro",
        "--blades",
        &blade.addr,
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--quiet",
        "--barrier",
        "lonely:3",
        "--barrier-timeout",
        "1",
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("barrier \"lonely\": 1 of 3 processes arrived"), "{e}");
    for bad in ["nocount", ":3", "x:0", "x:y"] {
        let out = compute(&["micro", "--blades", &blade.addr, "--barrier", bad]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAME:N"), "{bad}");
    }
    let out = compute(&["micro", "--barrier", "x:2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--barrier needs --blades"));
}

#[test]
fn version_names_the_commit() {
    for bin in [COMPUTE, crate::cli::BLADE] {
        let out = Command::new(bin).arg("--version").output().unwrap();
        let v = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && v.contains("(commit "), "{v}");
    }
}

#[test]
fn idle_time_between_operations_bounds_the_offered_load() {
    // One coroutine idling 20 ms before each operation can finish at most
    // one operation per 20 ms of the run (plus the one in flight).
    let json = tmp("idle.json");
    let out = compute(&[
        "micro",
        "--coroutines",
        "1",
        "--duration",
        "0.5",
        "--warmup",
        "0",
        "--quiet",
        "--idle-us",
        "20000",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = record(&json);
    let ops = r["ops"].as_u64().unwrap();
    let bound = (r["duration_s"].as_f64().unwrap() / 0.02).ceil() as u64 + 1;
    assert!(ops >= 1 && ops <= bound, "{ops} operations in {}s with 20 ms idle each", r["duration_s"]);
    assert_eq!(r["idle_us"].as_f64().unwrap(), 20000.0);
    assert!(!compute(&["micro", "--idle-us", "-1"]).status.success());
    std::fs::remove_file(json).unwrap();
}
