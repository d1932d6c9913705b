//! `--transport sim`: every subcommand on the simulated cluster, the
//! applications verified at the paper's scale (96 threads × 8 coroutines),
//! a record that says it is simulated, and determinism across processes.

use std::path::Path;

use serde_json::Value;

use super::cli::{compute, record, tmp};

/// A short simulated run's common flags: 96 × 8, 0.5 ms of warm-up and
/// 2 ms measured (virtual), a fixed seed.
const SCALE: [&str; 12] = [
    "--transport",
    "sim",
    "--threads",
    "96",
    "--coroutines",
    "8",
    "--warmup",
    "0.0005",
    "--duration",
    "0.002",
    "--quiet",
    "--seed",
];

fn run(args: &[&str], json: &Path) -> Value {
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--json", json.to_str().unwrap()]);
    let out = compute(&a);
    assert!(
        out.status.success(),
        "compute-blade {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = record(json);
    std::fs::remove_file(json).ok();
    r
}

/// The record without what differs between two runs of one command: where
/// and when it ran, and how long the host took.
fn comparable(mut r: Value) -> Value {
    let o = r.as_object_mut().unwrap();
    o.remove("provenance");
    let sim = o.get_mut("sim").unwrap().as_object_mut().unwrap();
    sim.remove("wall_s");
    sim.remove("verbs_per_wall_s");
    r
}

#[test]
fn micro_on_the_simulator_is_deterministic_and_says_it_is_simulated() {
    let json = tmp("sim-micro.json");
    let args: Vec<&str> = ["micro"].into_iter().chain(SCALE).chain(["11"]).collect();
    let a = run(&args, &json);
    assert_eq!(a["transport"], "sim");
    assert_eq!(a["threads"], 96);
    let sim = &a["sim"];
    assert_eq!(sim["profile"], "connectx6");
    assert_eq!(sim["compute_blades"], 1);
    assert!(sim["verbs"].as_u64().unwrap() > 100_000, "{sim}");
    assert!(sim["virtual_s"].as_f64().unwrap() >= 0.0025, "{sim}");
    assert!((a["duration_s"].as_f64().unwrap() - 0.002).abs() < 1e-9, "virtual seconds: {}", a["duration_s"]);
    let b = run(&args, &json);
    assert_eq!(comparable(a.clone()), comparable(b), "same seed, same record");
    let other: Vec<&str> = ["micro"].into_iter().chain(SCALE).chain(["12", "--op", "faa", "--contended"]).collect();
    let c = run(&other, &json);
    assert_eq!(c["violations"], 0, "the contended counter is exact");
}

#[test]
fn ycsb_over_both_indexes_verifies_at_96_threads() {
    let json = tmp("sim-ycsb.json");
    for (app, workload) in [("race", "a"), ("race", "update-only"), ("sherman", "e"), ("sherman", "a")] {
        let args: Vec<&str> = ["ycsb", "--app", app, "--workload", workload, "--keys", "20000", "--verify"]
            .into_iter()
            .chain(SCALE)
            .chain(["5"])
            .collect();
        let r = run(&args, &json);
        assert_eq!(r["violations"], 0, "{app} {workload}");
        assert_eq!(r["duplicates"], 0, "{app} {workload}");
        assert!(r["ops"].as_u64().unwrap() > 1000, "{app} {workload}: {}", r["ops"]);
        assert_eq!(r["transport"], "sim");
    }
}

/// Two simulated compute blades of 96 threads on two memory blades: 192
/// clients of race-ht's epoch registry (more than its first 128 entries).
#[test]
fn ycsb_over_two_compute_blades_verifies() {
    let json = tmp("sim-ycsb-2cb.json");
    let args: Vec<&str> = ["ycsb", "--app", "race", "--workload", "a", "--keys", "20000", "--verify"]
        .into_iter()
        .chain(["--sim-compute-blades", "2", "--sim-memory-blades", "2"])
        .chain(SCALE)
        .chain(["8"])
        .collect();
    let r = run(&args, &json);
    assert_eq!((r["violations"].as_u64(), r["duplicates"].as_u64()), (Some(0), Some(0)));
    assert_eq!(r["sim"]["compute_blades"], 2);
    assert!(r["ops"].as_u64().unwrap() > 1000, "{}", r["ops"]);
}

#[test]
fn smallbank_and_tatp_audit_clean_at_96_threads() {
    let json = tmp("sim-dtx.json");
    for (w, size) in [("smallbank", ["--accounts", "20000"]), ("tatp", ["--subscribers", "5000"])] {
        let args: Vec<&str> = [w, "--audit"].into_iter().chain(size).chain(SCALE).chain(["6"]).collect();
        let r = run(&args, &json);
        assert_eq!(r["violations"], 0, "{w}: {}", r["audit"]);
        assert!(r["committed"].as_u64().unwrap() > 1000, "{w}: {}", r["committed"]);
        assert_eq!(r["sim"]["memory_blades"], 2, "as many simulated blades as replicas");
    }
}

#[test]
fn a_blade_directory_keeps_the_simulated_cluster_between_commands() {
    let dir = tmp("sim-blades");
    let d = dir.to_str().unwrap();
    let common = ["--transport", "sim", "--sim-blade-dir", d, "--seed", "4", "--quiet"];
    let step = |args: &[&str]| {
        let a: Vec<&str> = args.iter().copied().chain(common).collect();
        let out = compute(&a);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    step(&["tatp", "--subscribers", "2000", "--threads", "4", "--warmup", "0.0005", "--duration", "0.001"]);
    step(&["ycsb", "--app", "race", "--keys", "5000", "--load-only"]);
    let listed = step(&["table", "list"]);
    assert!(listed.contains("tatp") && listed.contains("ycsb"), "{listed}");
    let audit = step(&["tatp", "--subscribers", "2000", "--audit-only"]);
    assert!(audit.contains("0 violations"), "{audit}");
    let check = step(&["table", "check", "ycsb"]);
    assert!(check.contains("0 faults"), "{check}");
    step(&["recover"]);
    // Virtual time went on across the commands.
    let clock = std::fs::read(dir.join("clock")).unwrap();
    assert!(u64::from_le_bytes(clock.try_into().unwrap()) > 1_000_000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sim_flags_are_refused_where_they_mean_nothing() {
    let refused = |args: &[&str], says: &str| {
        let out = compute(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    };
    refused(&["micro", "--transport", "sim", "--blades", "127.0.0.1:1"], "drop --blades");
    refused(&["micro", "--sim-compute-blades", "2"], "apply to --transport sim only");
    refused(&["micro", "--transport", "sim", "--sim-profile", "/nonexistent.toml"], "not a built-in profile");
    let out = std::process::Command::new(super::cli::BLADE)
        .args(["--listen", "127.0.0.1:0", "--transport", "sim"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("compute-blade"));
}

/// Deterministic simulation testing: one fault of each kind at a virtual
/// instant, at 96 × 8, then the application's recovery and its own checks
/// on the blades the run left (what `scripts/soak.sh --sim` does for drawn
/// faults). A killed run leaves the same blades, byte for byte, every time.
#[test]
fn injected_faults_leave_the_applications_recoverable() {
    let scale = ["--threads", "96", "--coroutines", "8", "--warmup", "0.0005", "--duration", "0.002", "--quiet"];
    let step = |dir: &Path, args: &[&str], ok: &[i32]| -> String {
        let d = dir.to_str().unwrap();
        let a: Vec<&str> =
            args.iter().copied().chain(["--transport", "sim", "--sim-blade-dir", d, "--seed", "9"]).collect();
        let out = compute(&a);
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        let code = out.status.code().unwrap_or(-1);
        assert!(ok.contains(&code), "{args:?} exited with {code}, expected one of {ok:?}: {text}");
        text
    };
    let transport_failure = |text: &str| text.contains("memory blade is unreachable") || text.contains("error state");

    // A compute blade killed in the middle of SmallBank: it dies with
    // locks held and logs written; recovery, once their leases run out,
    // rolls back or forward, and the audit is clean. Twice, the same bytes.
    let mut images = Vec::new();
    for n in 0..2 {
        let dir = tmp(&format!("sim-fault-kill-{n}"));
        let run: Vec<&str> =
            ["smallbank", "--accounts", "20000", "--audit", "--blade-size", "64MiB", "--sim-fault", "kill@1"]
                .into_iter()
                .chain(scale)
                .collect();
        let text = step(&dir, &run, &[137]);
        assert!(text.contains("fault kill@1: the compute blade dies"), "{text}");
        let blades: Vec<Vec<u8>> = (0..2).map(|b| std::fs::read(dir.join(format!("blade-{b}.img"))).unwrap()).collect();
        images.push((blades, std::fs::read(dir.join("clock")).unwrap()));
        let rec = step(&dir, &["recover", "--db", "smallbank", "--sim-advance", "12"], &[0]);
        let audit = step(&dir, &["smallbank", "--accounts", "20000", "--audit-only"], &[0]);
        assert!(audit.contains("audit: 0 violations") && audit.contains("locks held 0"), "{rec}\n{audit}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert!(images[0] == images[1], "the same kill leaves the same blades and clock");

    // A memory blade lost with its memory under SmallBank (k = 2): the run
    // fails with transport errors; a fresh blade is in its place, which
    // every command refuses (a blade of the set replaced) until `rebuild
    // --lost 1` makes the database's copies there from the survivor and
    // recovers the dead run's transactions from their replicated undo
    // logs: the audit is clean.
    let dir = tmp("sim-fault-lost");
    let run: Vec<&str> = ["smallbank", "--accounts", "20000", "--audit", "--blade-size", "64MiB"]
        .into_iter()
        .chain(["--sim-fault", "blade-lost@1:1"])
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[1]);
    assert!(transport_failure(&text) && text.contains("memory blade 1 is lost"), "{text}");
    let refused = step(&dir, &["smallbank", "--accounts", "20000", "--audit-only"], &[1]);
    assert!(refused.contains("memory blade 1") && refused.contains("rebuild --lost"), "{refused}");
    let rebuilt = step(&dir, &["rebuild", "--lost", "1", "--sim-advance", "12"], &[0]);
    assert!(
        rebuilt.contains("rebuilt on memory blade 1") && rebuilt.contains("fenced on 2 memory blades"),
        "{rebuilt}"
    );
    let audit = step(&dir, &["smallbank", "--accounts", "20000", "--audit-only"], &[0]);
    assert!(audit.contains("audit: 0 violations") && audit.contains("locks held 0"), "{rebuilt}\n{audit}");
    std::fs::remove_dir_all(&dir).unwrap();

    // The compute blade and memory blade 0 (the catalog, the registry, the
    // first copy of every undo log) lost at the same instant under TATP:
    // blade 0 comes back from its mirror on blade 1, the dead run is
    // recovered, and the audit is clean.
    let dir = tmp("sim-fault-lost-0");
    let run: Vec<&str> = ["tatp", "--subscribers", "20000", "--audit", "--blade-size", "64MiB"]
        .into_iter()
        .chain(["--sim-fault", "kill@1", "--sim-fault", "blade-lost@1:0"])
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[137]);
    assert!(text.contains("memory blade 0 is lost") && text.contains("the compute blade dies"), "{text}");
    let rebuilt = step(&dir, &["rebuild", "--lost", "0"], &[0]);
    assert!(rebuilt.contains("rebuilt on memory blade 0"), "{rebuilt}");
    let audit = step(&dir, &["tatp", "--subscribers", "20000", "--audit-only"], &[0]);
    assert!(audit.contains("audit: 0 violations") && audit.contains("locks held 0"), "{rebuilt}\n{audit}");
    std::fs::remove_dir_all(&dir).unwrap();

    // A memory blade down for 0.5 ms under RACE: the run fails with
    // transport errors; the table, repaired once the leases run out, is
    // sound and holds every acknowledged write.
    let dir = tmp("sim-fault-blade");
    let run: Vec<&str> = ["ycsb", "--app", "race", "--workload", "a", "--keys", "20000", "--verify"]
        .into_iter()
        .chain(["--sim-fault", "blade-down@0.5:0:0.5"])
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[1]);
    assert!(transport_failure(&text), "{text}");
    step(&dir, &["table", "repair", "ycsb", "--sim-advance", "3"], &[0]);
    let check = step(&dir, &["table", "check", "ycsb"], &[0]);
    assert!(check.contains(" 0 faults"), "{check}");
    let verify = ["ycsb", "--app", "race", "--keys", "20000", "--no-load", "--verify", "--threads", "8"];
    let v: Vec<&str> = verify.into_iter().chain(["--warmup", "0", "--duration", "0.001"]).collect();
    step(&dir, &v, &[0]);
    std::fs::remove_dir_all(&dir).unwrap();

    // One thread's QP dropped under Sherman: its coroutines fail, the
    // others go on; the tree stays sound.
    let dir = tmp("sim-fault-qp");
    let run: Vec<&str> = ["ycsb", "--app", "sherman", "--workload", "a", "--keys", "20000", "--verify"]
        .into_iter()
        .chain(["--sim-fault", "drop-qp@0.5:3:0"])
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[1]);
    assert!(transport_failure(&text) && text.contains("thread 3"), "{text}");
    let check = step(&dir, &["table", "check", "ycsb", "--app", "sherman", "--sim-advance", "3"], &[0]);
    assert!(check.contains("sound"), "{check}");
    let v: Vec<&str> = ["ycsb", "--app", "sherman", "--keys", "20000", "--no-load", "--verify", "--threads", "8"]
        .into_iter()
        .chain(["--warmup", "0", "--duration", "0.001"])
        .collect();
    step(&dir, &v, &[0]);
    std::fs::remove_dir_all(&dir).unwrap();

    // A memory blade stalled for 1 ms under RACE: requests wait, none
    // fails; the run verifies clean.
    let dir = tmp("sim-fault-blade-stall");
    let run: Vec<&str> = ["ycsb", "--app", "race", "--workload", "a", "--keys", "20000", "--verify"]
        .into_iter()
        .chain(["--sim-fault", "blade-stall@0.5:0:1"])
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[0]);
    assert!(text.contains("errors 0"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();

    // A thread stalled for 3 s of virtual time under TATP, past every
    // lease: the others take its locks over; when it wakes its writes are
    // fenced, and the audit is clean.
    let dir = tmp("sim-fault-stall");
    let run: Vec<&str> = ["tatp", "--subscribers", "5000", "--audit", "--sim-fault", "stall@0.5:5:3000"]
        .into_iter()
        .chain(scale)
        .collect();
    let text = step(&dir, &run, &[0]);
    assert!(text.contains("audit: 0 violations"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Soak seed 199 found it: a thread of a Sherman run stalled for 2.9 s of
/// virtual time while it held a page lock, a waiter took the lock over
/// after its 2 s lease, and the stalled thread then wrote the page under
/// the lock it had lost (the tree's level 1 named a page missing from level
/// 0's chain). Here twelve threads stall past the lease in the middle of
/// the run: locks are taken over from them, and the tree still verifies
/// and checks clean. (That a holder whose lock was taken over writes
/// nothing: `lock::tests` in sherman-bt, deterministically.)
#[test]
fn sherman_threads_stalled_past_their_lock_lease_leave_a_sound_tree() {
    let dir = tmp("sim-sherman-stall");
    let d = dir.to_str().unwrap();
    let mut args = vec![
        "ycsb",
        "--app",
        "sherman",
        "--workload",
        "e",
        "--keys",
        "20000",
        "--verify",
        "--threads",
        "96",
        "--coroutines",
        "8",
        "--duration",
        "0.004",
        "--warmup",
        "0.001",
        "--seed",
        "199",
        "--quiet",
        "--transport",
        "sim",
        "--sim-blade-dir",
        d,
        "--blade-size",
        "1GiB",
    ];
    let stalls: Vec<String> = (0..96).step_by(8).map(|t| format!("stall@2.0:{t}:2900")).collect();
    for s in &stalls {
        args.extend(["--sim-fault", s.as_str()]);
    }
    let r = run(&args, &tmp("sim-sherman-stall.json"));
    assert_eq!(r["violations"], 0, "{r}");
    assert!(r["sherman"]["lock_steals"].as_u64().unwrap() >= 1, "no lock was taken over: {}", r["sherman"]);
    let out = compute(&["table", "check", "ycsb", "--transport", "sim", "--sim-blade-dir", d]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    std::fs::remove_dir_all(&dir).ok();
}
