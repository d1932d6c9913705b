//! A lost memory blade (SIGKILLed, without a backing file) rebuilt from the
//! other replicas onto a fresh one: `compute-blade rebuild`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cli::{compute, wait_bounded, Blade, COMPUTE};
use crate::dtx::run_json;

/// Three anonymous memory blades and their `--blades` list.
fn three() -> (Vec<Blade>, Vec<String>) {
    let b: Vec<Blade> = (0..3).map(|_| Blade::start(&["--size", "64MiB"])).collect();
    let addrs = b.iter().map(|b| b.addr.clone()).collect();
    (b, addrs)
}

/// `--audit-only` of `workload` on `list`: its exit status and record.
fn audit(workload: &str, list: &str, name: &str) -> (Option<i32>, Value) {
    let j = crate::cli::tmp(name);
    let out = Command::new(COMPUTE)
        .args([workload, "--blades", list, "--audit-only", "--quiet", "--json", j.to_str().unwrap()])
        .output()
        .unwrap();
    let r = if j.exists() { crate::cli::record(&j) } else { Value::Null };
    let _ = std::fs::remove_file(&j);
    (out.status.code(), r)
}

/// Runs `compute-blade rebuild` until no live lease holds it back (at most
/// 30 s): its exit status and output.
fn rebuild(list: &str, lost: &str) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        let out = compute(&["rebuild", "--blades", list, "--lost", lost]);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        if !text.contains("holds a lease") || start.elapsed() > Duration::from_secs(30) {
            return (out.status.code(), text);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_lost_memory_blade_is_rebuilt_from_the_other_replicas() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--audit"];
    let sb = run_json("rb-sb.json", &[&["smallbank", "--accounts", "2000", "--hot", "50"], &q[..]].concat());
    let ta = run_json("rb-tatp.json", &[&["tatp", "--subscribers", "2000"], &q[..]].concat());
    assert_eq!((sb["violations"].as_u64(), ta["violations"].as_u64()), (Some(0), Some(0)));
    // Blade 1 dies with its memory; a fresh one takes its place.
    drop(blades.remove(1));
    let fresh = Blade::start(&["--size", "64MiB"]);
    addrs[1] = fresh.addr.clone();
    blades.insert(1, fresh);
    let list = addrs.join(",");
    let (code, _) = audit("smallbank", &list, "rb-refused.json");
    assert_ne!(code, Some(0), "a replaced blade is refused until rebuilt");
    let out = compute(&["rebuild", "--blades", &list, "--lost", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("blade 0"), "{out:?}");
    let (code, text) = rebuild(&list, "1");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("smallbank: rebuilt on memory blade 1: 2 bucket arrays"), "{text}");
    for (w, before) in [("smallbank", &sb), ("tatp", &ta)] {
        let (code, r) = audit(w, &list, "rb-audit.json");
        assert_eq!(code, Some(0), "{w}: {r}");
        assert_eq!(r["audit"]["db"]["live"], before["audit"]["db"]["live"], "{w}: every row is back");
    }
    // The rebuilt blade serves transactions.
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0", "--quiet", "--audit"];
    let again = run_json("rb-again.json", &[&["smallbank", "--accounts", "2000", "--hot", "50"], &q[..]].concat());
    assert_eq!(again["violations"].as_u64(), Some(0), "{again}");
}

#[test]
fn a_memory_blade_lost_under_running_transactions_is_rebuilt_and_the_money_kept() {
    let (mut blades, mut addrs) = three();
    let list = addrs.join(",");
    let db = ["--accounts", "2000", "--hot", "50", "--quiet", "--audit"];
    let q = ["--blades", &list, "--duration", "0.3", "--warmup", "0"];
    assert_eq!(run_json("rbl-load.json", &[&["smallbank"][..], &db, &q].concat())["violations"], 0);
    // Blade 2 (the ledger's primary, a backup of the checking accounts)
    // dies under a run of 2 threads with a 1 s lease.
    let mut run = Command::new(COMPUTE)
        .args(["smallbank", "--blades", &list, "--threads", "2", "--duration", "20", "--warmup", "0", "--lease", "1"])
        .args(db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    drop(blades.remove(2));
    let st = wait_bounded(&mut run, Duration::from_secs(60), "the run whose memory blade died");
    assert_eq!(st.code(), Some(1), "the run fails: its memory blade is unreachable");
    let fresh = Blade::start(&["--size", "64MiB"]);
    addrs[2] = fresh.addr.clone();
    blades.push(fresh);
    let list = addrs.join(",");
    // Refused while the dead compute blade's lease runs; then rebuilt, and
    // its transactions settled from what survives.
    let (code, text) = rebuild(&list, "2");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("rolled back") && !text.contains("cannot be rolled back"), "{text}");
    eprintln!("{text}");
    let (code, r) = audit("smallbank", &list, "rbl-audit.json");
    assert_eq!(code, Some(0), "money conserved, no lock held, replicas equal: {r}");
    assert_eq!(r["audit"]["balances"], r["audit"]["expected"], "{r}");
}
