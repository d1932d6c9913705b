//! The binaries as a user runs them: processes over loopback TCP.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub(crate) const BLADE: &str = env!("CARGO_BIN_EXE_memory-blade");
pub(crate) const COMPUTE: &str = env!("CARGO_BIN_EXE_compute-blade");

/// A memory-blade process, killed when dropped.
pub(crate) struct Blade {
    pub(crate) child: Child,
    pub(crate) addr: String,
}

impl Blade {
    pub(crate) fn start(args: &[&str]) -> Blade {
        let mut child = Command::new(BLADE)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start memory-blade");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.strip_prefix("ready ").unwrap_or_else(|| panic!("first line {line:?}")).trim().to_string();
        Blade { child, addr }
    }

    /// SIGTERM, then wait (bounded) for a clean exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.child, "-TERM");
        wait_bounded(&mut self.child, Duration::from_secs(10), "memory-blade ignored SIGTERM")
    }
}

impl Drop for Blade {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn compute(args: &[&str]) -> Output {
    // Bounded: a run that hangs fails its test (killed, by its PID) instead
    // of holding the suite.
    let mut child = Command::new(COMPUTE)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run compute-blade");
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|o| Box::new(o) as _));
    let err = drain(child.stderr.take().map(|e| Box::new(e) as _));
    let status = wait_bounded(&mut child, COMPUTE_LIMIT, &format!("compute-blade {args:?} ran past {COMPUTE_LIMIT:?}"));
    Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// The longest a `compute-blade` command of a test may run.
const COMPUTE_LIMIT: Duration = Duration::from_secs(600);

/// Starts `compute-blade args`, its output discarded.
pub(crate) fn spawn_compute(args: &[&str]) -> Child {
    Command::new(COMPUTE).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start compute-blade")
}

/// Waits for `child` to exit, at most `limit`; on a time-out it kills it
/// and fails with `what`.
pub(crate) fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends signal `sig` (`-KILL`, `-STOP`, `-INT`, …) to a child.
pub(crate) fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success());
}

/// SIGKILLs a child that must still be running, and reaps it.
pub(crate) fn kill9(child: &mut Child) {
    assert!(child.try_wait().unwrap().is_none(), "the run ended before it was killed");
    signal(child, "-KILL");
    child.wait().unwrap();
}

/// The `i`-th kill point of a test, in `base..base + span` ms: from the
/// process id, so that reruns kill elsewhere.
pub(crate) fn kill_point(i: u64, base: u64, span: u64) -> u64 {
    base + u64::from(std::process::id()).wrapping_mul(2654435761).wrapping_add(i * 977) % span
}

/// Runs `compute-blade args` and SIGKILLs it after `ms`; `false` (nothing
/// killed) if it had ended by then.
pub(crate) fn run_killed(args: &[&str], ms: u64) -> bool {
    let mut child = spawn_compute(args);
    std::thread::sleep(Duration::from_millis(ms));
    if child.try_wait().unwrap().is_some() {
        return false;
    }
    kill9(&mut child);
    true
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("smart-cli-{}-{name}", std::process::id()))
}

pub(crate) fn record(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn micro_over_tcp_writes_a_complete_record() {
    let blade = Blade::start(&["--size", "64MiB"]);
    let json = tmp("tcp.json");
    let out = compute(&[
        "micro",
        "--blades",
        &blade.addr,
        "--op",
        "faa",
        "--contended",
        "--threads",
        "2",
        "--coroutines",
        "4",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Mop/s"), "no progress line: {stderr}");
    let r = record(&json);
    for key in [
        "bench",
        "app",
        "workload",
        "transport",
        "threads",
        "coroutines",
        "smart",
        "qp_policy",
        "duration_s",
        "ops",
        "throughput_mops",
        "latency_us",
        "verbs_per_op",
        "doorbells_per_op",
        "retries_per_op",
        "errors",
        "violations",
    ] {
        assert!(r.get(key).is_some(), "record lacks {key}: {r}");
    }
    assert_eq!(r["transport"], "tcp");
    assert_eq!(r["threads"], 2);
    assert_eq!(r["violations"], 0);
    assert_eq!(r["errors"], 0);
    assert!(r["ops"].as_u64().unwrap() > 0);
    assert_eq!(r["counter"], r["increments"]);
    for p in ["p50", "p99", "p999", "max"] {
        assert!(r["latency_us"][p].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_file(json).unwrap();
}

#[test]
fn embedded_default_runs_each_verb() {
    for op in ["read", "write", "cas", "faa"] {
        let json = tmp(&format!("emb-{op}.json"));
        let out = compute(&[
            "micro",
            "--op",
            op,
            "--size",
            "256",
            "--batch",
            "4",
            "--duration",
            "0.3",
            "--warmup",
            "0",
            "--quiet",
            "--blade-size",
            "32MiB",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{op}: {}", String::from_utf8_lossy(&out.stderr));
        let r = record(&json);
        assert_eq!(r["transport"], "embedded");
        // Batches in flight when measuring starts or stops count their ops on
        // one side of the boundary and their doorbell on the other: ratios
        // hold to within a few batches in millions.
        let near = |k: &str, v: f64| (r[k].as_f64().unwrap() - v).abs() < 1e-3 * v;
        assert!(near("doorbells_per_op", 0.25), "{op}: 4 WRs per doorbell: {}", r["doorbells_per_op"]);
        assert!(near("verbs_per_op", 1.0), "{op}: {}", r["verbs_per_op"]);
        std::fs::remove_file(json).unwrap();
    }
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["micro", "--op", "nope"], "invalid value"),
        (&["micro", "--size", "12 parsecs"], "unknown unit"),
        (&["micro", "--batch", "0"], "--batch"),
        (&["micro", "--threads", "0"], "--threads"),
        (&["micro", "--smart", "warp-drive"], "unknown technique"),
        (&["micro", "--conflict-avoid-parts", "some"], "use one of backoff, dyn-limit, all"),
        (&["micro", "--smart", "none", "--conflict-avoid-parts", "backoff"], "needs conflict-avoid in --smart"),
        (&["micro", "--qp-policy", "bogus"], "--qp-policy"),
        (&["micro", "--qp-policy", "multiplexed:0"], "multiplexed:K"),
        (&["micro", "--doorbells", "4:0"], "--doorbells"),
        (&["micro", "--op", "cas", "--contended", "--batch", "2"], "--batch 1"),
        (&["micro", "--blades", "127.0.0.1:1"], "connecting"),
        (&["micro", "--device", "mlx5_0"], "--transport verbs only"),
        // Limits said up front, never a panic or a hang later.
        (&["micro", "--coroutines", "4097"], "at most 4096"),
        (&["micro", "--threads", "100000"], "at most 1024"),
        (&["micro", "--duration", "1e20"], "--duration"),
        (&["micro", "--warmup", "inf"], "--warmup"),
        (&["micro", "--doorbells", "100000:1"], "--doorbells"),
        (&["micro", "--size", "20KiB"], "1 to 16384 bytes"),
        (&["micro", "--size", "8KiB", "--batch", "4"], "at most 16384"),
        (&["micro", "--blades", "127.0.0.1:1,"], "empty address"),
        (&["micro", "--blades", "127.0.0.1:1,127.0.0.1:1"], "twice"),
        (&["micro", "--blades", "127.0.0.1:1", "--blade-size", "1GiB"], "embedded blades only"),
        (&["micro", "--json", "/nonexistent-dir-of-smart-rs/x.json"], "--json"),
        (&["ycsb", "--value-size", "16320"], "at most 16116"),
        (&["ycsb", "--key-size", "8KiB", "--value-size", "8KiB"], "at most 16116"),
        (&["ycsb", "--workload", "e"], "range scans"),
        (&["micro", "--blade-size", "1MiB"], "larger --blade-size"),
        (&["micro", "--blade-size", "0"], "--blade-size 0 is too small"),
        (&["micro", "--area", "18446744073709551615"], "asked 18446744073709551615 bytes"),
        // (Above any test machine's memory: refused before anything is
        // mapped.)
        (&["micro", "--blade-size", "200TiB"], "memory blade 0 (embedded): 219902325555200 bytes asked, more than"),
        (&["ycsb", "--keys", "18446744073709551615"], "--keys must be 1 to 2^40"),
        (&["ycsb", "--capacity", "1099511627777"], "--capacity must be 1 to 2^40"),
        (&["tatp", "--blade-size", "4KiB"], "--blade-size 4096 is too small"),
        (&["micro", "--request-timeout=-1"], "--request-timeout"),
        (&["rebuild", "--blades", "127.0.0.1:1,127.0.0.1:2", "--lost", "2"], "--lost 2: give the places (0 to 1)"),
        (&["rebuild", "--blades", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--lost", "2,1,0"], "names every blade"),
        (
            &["rebuild", "--blades", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--lost", "0,2", "--db", "x"],
            "--db does not",
        ),
    ];
    // The failures of a run that started (exit status 1); every other case
    // is a usage error (2, as clap's own).
    let failures = ["connecting", "larger --blade-size", "asked 18446744073709551615", "memory blade 0 (embedded)"];
    for (args, needle) in cases {
        // A user error prints its message chain, never a backtrace.
        let out = Command::new(COMPUTE).args(*args).env("RUST_BACKTRACE", "1").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        let code = if failures.iter().any(|f| needle.contains(f)) { 1 } else { 2 };
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(!err.contains("Stack backtrace") && !err.contains("stack backtrace"), "{args:?}: {err}");
    }
    // --verbose adds the report with its backtrace.
    let out = compute(&["micro", "--threads", "0", "--verbose"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Stack backtrace"), "{out:?}");
    // --blades wants HOST:PORT, and says so.
    for bad in ["localhost", "127.0.0.1", ":7000", "host:port", "h:0"] {
        let out = compute(&["micro", "--blades", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(2) && err.contains("expected HOST:PORT"), "{bad}: {err}");
    }
    // memory-blade's usage errors are 2 as well.
    let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--max-connections", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // A cause is said once, not repeated by the error chain.
    let out = compute(&["micro", "--blades", "127.0.0.1:1"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr).matches("Connection refused").count(), 1);
    let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--size", "1KiB"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("too small"));
}

#[test]
fn benchmark_scripts_refuse_bad_arguments_before_building_anything() {
    let root = env!("CARGO_MANIFEST_DIR");
    for (script, args, says) in [
        ("bench-dtx.sh", &["abc"][..], "SECONDS must be a positive number of seconds, not \"abc\""),
        ("bench-dtx.sh", &["3", "embedded rdma"][..], "BACKENDS: \"rdma\" is not one of: embedded tcp"),
        ("bench-dtx.sh", &["3", "embedded", "0"][..], "ROUNDS must be a positive whole number, not \"0\""),
        ("bench-btree.sh", &["1", "100", "a z"][..], "WORKLOADS: \"z\" is not one of"),
        ("bench-ycsb.sh", &["1", "2e5"][..], "KEYS must be a positive whole number, not \"2e5\""),
        ("bench-smart-matrix.sh", &["2", "-1"][..], "SECONDS must be a positive number"),
        ("bench-hotpath.sh", &["no-such-rev-of-smart-rs"][..], "no commit \"no-such-rev-of-smart-rs\""),
    ] {
        // (Bounded: a script that went on would build and run for minutes.)
        let out = Command::new("timeout")
            .args(["120", "bash", &format!("{root}/scripts/{script}")])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{script} {args:?}: {err}");
        assert!(err.contains(says), "{script} {args:?}: {err}");
    }
}

#[test]
fn blade_flushes_its_backing_file_on_sigterm_and_restarts_with_the_data() {
    use smart_core::{Runtime, RuntimeConfig, TcpTransport};
    let file = tmp("backing");
    let _ = std::fs::remove_file(&file);
    let f = file.to_str().unwrap();
    let blade = Blade::start(&["--backing-file", f, "--size", "8MiB"]);
    let t = TcpTransport::connect(std::slice::from_ref(&blade.addr)).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let a = rt.block_on(async move {
        let a = ctx.alloc(0, 4096, 64).await.unwrap();
        ctx.write(a, &[0x5a; 4096]).await.unwrap();
        ctx.set_root(0, "cli", a).await.unwrap();
        a
    });
    drop(rt);
    drop(t);
    assert!(blade.terminate().success(), "memory-blade did not exit cleanly on SIGTERM");
    // A size that disagrees with the file is refused ...
    let out =
        Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--backing-file", f, "--size", "4MiB"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("8388608"));
    // ... and without --size the file is served as it is.
    let blade = Blade::start(&["--backing-file", f]);
    let t = TcpTransport::connect(std::slice::from_ref(&blade.addr)).unwrap();
    let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let (root, data) = rt.block_on(async move {
        let root = ctx.root(0, "cli").await.unwrap();
        let mut data = vec![0u8; 4096];
        ctx.read(a, &mut data).await.unwrap();
        (root, data)
    });
    assert_eq!(root, Some(a));
    assert!(data.iter().all(|b| *b == 0x5a));
    // A second blade on the file being served is refused: the file is locked.
    let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--backing-file", f]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another memory-blade"));
    drop(blade);
    std::fs::remove_file(&file).unwrap();
}

/// A memory blade records the compute blades it refuses beside its backing
/// file: SIGKILLed and restarted on the file, it still refuses a revoked
/// one (a new connection naming it) and serves the others. A backing file
/// made anew starts with none refused.
#[test]
fn a_blade_restarted_on_its_backing_file_still_refuses_a_revoked_compute_blade() {
    use smart_core::{Fencing, Runtime, RuntimeConfig, TcpTransport};
    let file = tmp("fenced.img");
    let log = smart_core::fence::log_path(&file);
    let _ = (std::fs::remove_file(&file), std::fs::remove_file(&log));
    let f = file.to_str().unwrap();
    let tagged = |tag| RuntimeConfig { fence_tag: tag, ..RuntimeConfig::default() };
    let connect = |b: &Blade| TcpTransport::connect(std::slice::from_ref(&b.addr)).unwrap();
    let mut blade = Blade::start(&["--backing-file", f, "--size", "8MiB"]);
    let t = connect(&blade);
    let owner = Runtime::new(&t, 0, tagged(42)).unwrap();
    let rec = Runtime::new(&t, 1, tagged(0)).unwrap();
    assert_eq!(rec.ctx().revoke(42).unwrap(), Fencing::Enforced(1));
    drop((owner, rec, t));
    kill9(&mut blade.child);
    let blade = Blade::start(&["--backing-file", f]);
    let t = connect(&blade);
    let err = Runtime::new(&t, 0, tagged(42)).unwrap_err();
    assert!(err.to_string().contains("a recovery revoked its registration"), "{err}");
    let mut other = Runtime::new(&t, 1, tagged(43)).unwrap();
    let ctx = other.ctx();
    let v = other.block_on(async move {
        let a = ctx.alloc(0, 64, 8).await.unwrap();
        ctx.write(a, &7u64.to_le_bytes()).await.unwrap();
        ctx.read_u64(a).await.unwrap()
    });
    assert_eq!(v, 7, "another compute blade is served");
    drop((other, t, blade));
    // The backing file made anew (the old one's data gone too).
    std::fs::remove_file(&file).unwrap();
    let blade = Blade::start(&["--backing-file", f, "--size", "8MiB"]);
    let t = connect(&blade);
    assert!(Runtime::new(&t, 0, tagged(42)).is_ok(), "a new blade refuses nobody");
    drop((t, blade));
    let _ = (std::fs::remove_file(&file), std::fs::remove_file(&log));
}

#[test]
fn a_blade_refuses_bad_backing_files_and_sizes_without_leaving_files_behind() {
    let file = tmp("never-created");
    let _ = std::fs::remove_file(&file);
    let out = Command::new(BLADE)
        .args(["--listen", "127.0.0.1:0", "--backing-file", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --size"));
    assert!(!file.exists(), "no empty file is left behind");
    for size in ["0", "4096"] {
        let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--size", size]).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("too small") && err.contains("more than 4096"), "{size}: {err}");
        assert!(!err.contains("listening"), "the message names the size, not the listener: {err}");
    }
    // More than the machine has: refused up front, not populated until the
    // OOM killer steps in.
    let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0", "--size", "200TiB"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("219902325555200 bytes asked, more than the") && err.contains("available"), "{err}");
    // --durable needs a file to sync to, and a blade that sees the writes.
    let f = file.to_str().unwrap();
    for (args, says) in [
        (&["--size", "8MiB", "--durable"][..], "--durable needs --backing-file"),
        (
            &["--size", "8MiB", "--durable", "--backing-file", f, "--transport", "verbs"][..],
            "--durable serves TCP only",
        ),
    ] {
        let out = Command::new(BLADE).args(["--listen", "127.0.0.1:0"]).args(args).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!file.exists(), "no file is left behind");
    }
    // A file on tmpfs does not survive a power loss: --durable refuses it,
    // and removes the file it created.
    let shm = std::path::Path::new("/dev/shm").join(format!("smart-cli-{}-durable", std::process::id()));
    let out = Command::new(BLADE)
        .args(["--listen", "127.0.0.1:0", "--size", "8MiB", "--durable", "--backing-file", shm.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is on tmpfs") && err.contains("power loss"), "{err}");
    assert!(!shm.exists(), "no file is left behind");
    // A start that fails after the file was created (its port is taken)
    // removes it too.
    let taken = Blade::start(&["--size", "8MiB"]);
    let out = Command::new(BLADE)
        .args(["--listen", &taken.addr, "--size", "8MiB", "--backing-file", file.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Address already in use"), "{err}");
    assert!(!file.exists(), "no file is left behind");
}

#[test]
fn smart_techniques_and_qp_policies_show_in_the_record() {
    for (args, policy, flags, parts) in [
        (&[][..], "per-thread-db", [true, true, true, true], Some("all")),
        (&["--smart", "all"][..], "per-thread-db", [true, true, true, true], Some("all")),
        (&["--smart", "none"][..], "per-thread-qp", [false, false, false, false], None),
        (
            &["--smart", "conflict-avoid", "--qp-policy", "multiplexed:2", "--cq", "shared"][..],
            "multiplexed:2",
            [false, false, true, false],
            Some("all"),
        ),
        (
            &["--smart", "conflict-avoid", "--conflict-avoid-parts", "backoff", "--qp-policy", "shared"][..],
            "shared",
            [false, false, true, false],
            Some("backoff"),
        ),
    ] {
        let json = tmp(&format!("smart-{policy}.json"));
        let mut a =
            vec!["micro", "--op", "cas", "--contended", "--threads", "2", "--coroutines", "4", "--duration", "0.3"];
        a.extend(["--warmup", "0", "--quiet", "--blade-size", "64MiB", "--json", json.to_str().unwrap()]);
        a.extend(args);
        let out = compute(&a);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let r = record(&json);
        assert_eq!(r["qp_policy"], policy);
        let names = ["thd_res_alloc", "work_req_throt", "conflict_avoid", "spec_lookup"];
        for (n, f) in names.iter().zip(flags) {
            assert_eq!(r["smart"][n], f, "{args:?}: {n}");
        }
        assert_eq!(r["smart"]["conflict_avoid_parts"].as_str(), parts, "{args:?}");
        assert_eq!(r["violations"], 0);
        assert_eq!(r["smart_state"].as_array().unwrap().len(), 2);
        if parts == Some("backoff") {
            // The cap stays at C_limit (C0 · 2^10 = 2.048 ms), and no
            // coroutine is throttled, however many retries.
            for t in r["smart_state"].as_array().unwrap() {
                assert_eq!((t["backoff_cap_ns"].as_u64(), t["n_max"].as_u64()), (Some(2_048_000), Some(4)), "{t}");
            }
        }
        assert_eq!(r["cq"], if policy == "multiplexed:2" { "shared" } else { "per-thread" });
        assert!(!r["timeline"].as_array().unwrap().is_empty());
        assert!(r["doorbell_rings"].as_array().unwrap().iter().any(|v| v.as_u64().unwrap() > 0));
        std::fs::remove_file(json).unwrap();
    }
}

#[test]
fn verbs_without_a_device_or_feature_fails_fast_naming_the_alternatives() {
    // Built without the feature: says how to build it. With the feature on a
    // machine without RDMA (like CI): says there is no device and names the
    // alternatives. Either way quickly, and non-zero.
    let expect = if cfg!(feature = "verbs") { "no RDMA device" } else { "--features verbs" };
    let t0 = Instant::now();
    let out = Command::new(BLADE)
        .args(["--listen", "127.0.0.1:0", "--size", "8MiB", "--transport", "verbs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expect) && err.contains("--transport tcp"), "{err}");
    let blade = Blade::start(&["--size", "8MiB"]);
    let out = compute(&["micro", "--blades", &blade.addr, "--transport", "verbs", "--duration", "0.2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expect) && err.contains("embedded"), "{err}");
    // verbs-info fails alike, after saying what it could of this host.
    let out = compute(&["verbs-info"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expect), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("locked memory limit: "));
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
}

#[test]
fn ycsb_over_the_hash_table_verifies_on_embedded_and_tcp() {
    let blade = Blade::start(&["--size", "256MiB"]);
    for (backend, extra) in [("embedded", vec![]), ("tcp", vec!["--blades", blade.addr.as_str()])] {
        for workload in ["a", "update-only", "d"] {
            let json = tmp(&format!("ycsb-{backend}-{workload}.json"));
            // Created for 500 keys: the load (and d's inserts) grow it.
            let mut a = vec!["ycsb", "--app", "race", "--workload", workload, "--keys", "5000", "--capacity", "500"];
            a.push("--verify");
            a.extend(["--threads", "2", "--coroutines", "4", "--duration", "0.5", "--warmup", "0.1", "--quiet"]);
            a.extend(["--smart", "conflict-avoid", "--json", json.to_str().unwrap()]);
            a.extend(extra.iter().copied());
            let out = compute(&a);
            assert!(out.status.success(), "{backend} {workload}: {}", String::from_utf8_lossy(&out.stderr));
            let r = record(&json);
            assert_eq!(
                (r["bench"].as_str(), r["app"].as_str(), r["workload"].as_str()),
                (Some("ycsb"), Some("race"), Some(workload))
            );
            assert_eq!(r["transport"], backend);
            assert_eq!((&r["violations"], &r["duplicates"]), (&json!(0), &json!(0)));
            assert!(r["ops"].as_u64().unwrap() > 0);
            assert!(r["race"]["splits"].as_u64().unwrap() >= 4, "the table grew: {}", r["race"]);
            assert!(r["race"]["subtables"].as_u64().unwrap() > 4);
            std::fs::remove_file(json).unwrap();
        }
    }
    let out = compute(&["ycsb", "--workload", "e", "--keys", "100", "--duration", "0.1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("range scans") && err.contains("--app sherman"), "{err}");
}

#[test]
fn ycsb_over_the_b_tree_verifies_scans_and_records_its_hit_rates() {
    let blade = Blade::start(&["--size", "256MiB"]);
    for (backend, extra) in [("embedded", vec![]), ("tcp", vec!["--blades", blade.addr.as_str()])] {
        for (workload, smart) in [("e", "all"), ("c", "spec-lookup"), ("d", "none")] {
            let json = tmp(&format!("ycsb-bt-{backend}-{workload}.json"));
            let mut a = vec!["ycsb", "--app", "sherman", "--workload", workload, "--keys", "5000", "--verify"];
            a.extend(["--threads", "2", "--coroutines", "4", "--duration", "0.5", "--warmup", "0.1", "--quiet"]);
            a.extend(["--smart", smart, "--table", workload, "--json", json.to_str().unwrap()]);
            a.extend(extra.iter().copied());
            let out = compute(&a);
            assert!(out.status.success(), "{backend} {workload}: {}", String::from_utf8_lossy(&out.stderr));
            let r = record(&json);
            assert_eq!((r["app"].as_str(), r["workload"].as_str()), (Some("sherman"), Some(workload)));
            assert_eq!((&r["violations"], &r["duplicates"]), (&json!(0), &json!(0)), "{backend} {workload}");
            let bt = &r["sherman"];
            assert!(bt["depth"].as_u64().unwrap() >= 3 && bt["keys"].as_u64().unwrap() >= 5000, "{bt}");
            assert!(r["bytes_read_per_op"].as_f64().unwrap() > 0.0);
            if workload == "c" {
                let hit = bt["spec_hit_rate"].as_f64().unwrap();
                assert!(hit > 0.5 && bt["bytes_per_lookup"].as_f64().unwrap() < 1024.0, "{bt}");
            } else {
                assert!(bt["cache_hit_rate"].as_f64().unwrap() > 0.5, "{bt}");
            }
            std::fs::remove_file(json).unwrap();
        }
    }
    // YCSB's standard record (24-byte string keys, 1000-byte values out of
    // the leaves) over TCP, scans verified.
    let json = tmp("ycsb-bt-record.json");
    let mut a = vec!["ycsb", "--app", "sherman", "--record", "ycsb", "--workload", "e", "--keys", "3000", "--verify"];
    a.extend(["--threads", "2", "--coroutines", "4", "--duration", "0.5", "--warmup", "0.1", "--quiet"]);
    a.extend(["--table", "record", "--json", json.to_str().unwrap(), "--blades", blade.addr.as_str()]);
    let out = compute(&a);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = record(&json);
    assert_eq!((&r["violations"], &r["duplicates"]), (&json!(0), &json!(0)));
    assert_eq!((&r["key_format"], &r["key_size"], &r["value_size"]), (&json!("ycsb"), &json!(24), &json!(1000)));
    assert!(r["sherman"]["blocks_written"].as_u64().unwrap() >= 3000, "{}", r["sherman"]);
    std::fs::remove_file(json).unwrap();
    for (args, says) in [
        (vec!["--value-size", "5000"], "keys of up to 256 bytes and values of up to 4096"),
        (vec!["--key-size", "300"], "keys of up to 256 bytes and values of up to 4096"),
        (vec!["--record", "ycsb", "--key-size", "16"], "--key-size must be ≥ 24 with --record ycsb"),
    ] {
        let mut a = vec!["ycsb", "--app", "sherman", "--keys", "10", "--duration", "0.1"];
        a.extend(args);
        let out = compute(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
    }
}

#[test]
fn the_largest_entry_the_flags_accept_works_with_every_technique() {
    // 8 + 16 108 bytes: the largest --key-size + --value-size accepted. With
    // spec-lookup, an update once wrote the new block and read the old one
    // in one batch, more than its local slot holds.
    for smart in ["all", "none", "spec-lookup"] {
        for workload in ["a", "d", "f"] {
            let args = ["ycsb", "--keys", "300", "--value-size", "16108", "--workload", workload, "--verify"];
            let run = ["--smart", smart, "--threads", "2", "--coroutines", "4", "--duration", "0.3", "--warmup", "0"];
            let out = compute(&[&args[..], &run[..], &["--quiet"]].concat());
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{smart} {workload}: {said} {}", String::from_utf8_lossy(&out.stderr));
            assert!(said.contains("errors 0") && said.contains(": 0 violations"), "{smart} {workload}: {said}");
        }
    }
}

/// Resident memory of process `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_client_cannot_make_the_blade_hold_unbounded_responses() {
    use smart_core::backend::tcp::handshake;
    use smart_core::wire::{self, Header, WrDesc};
    use smart_core::Opcode;
    // 100 frames of 56 bytes, each asking a 16 MiB READ, sent at once and
    // never read back: the blade may hold one frame's response and a bounded
    // buffer, not all 1.6 GiB.
    let blade = Blade::start(&["--size", "64MiB"]);
    let before = rss_kib(blade.child.id());
    let (mut s, info) = handshake(&blade.addr, wire::PROTOCOL_VERSION).unwrap();
    let mut frames = Vec::new();
    for i in 0..100u64 {
        let d =
            WrDesc { op: Opcode::Read as u8, rkey: info.rkey, remote: 8192, len: 16 << 20, compare_add: 0, swap: 0 };
        Header { len: wire::WR_DESC_LEN as u32, kind: wire::KIND_BATCH, count: 1, wr_id: i }.put(&mut frames);
        d.put(&mut frames);
    }
    s.write_all(&frames).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_kib(blade.child.id()).saturating_sub(before);
    assert!(grown < 200 << 10, "the blade grew by {} MiB", grown >> 10);
    drop(s);
    // And it still serves.
    let out = compute(&["micro", "--blades", &blade.addr, "--duration", "0.2", "--warmup", "0", "--quiet"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_blade_out_of_file_descriptors_keeps_serving() {
    // Under a 48-descriptor limit, 80 idle connections exhaust the blade's
    // descriptors; accept failures are logged and survived, and once they
    // close the blade serves a compute blade as usual.
    let mut child = Command::new("sh")
        .args(["-c", &format!("ulimit -n 48 && exec {BLADE} --listen 127.0.0.1:0 --size 64MiB")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.strip_prefix("ready ").unwrap().trim().to_string();
    let idle: Vec<std::net::TcpStream> = (0..80).filter_map(|_| std::net::TcpStream::connect(&addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the blade died when out of descriptors");
    drop(idle);
    std::thread::sleep(Duration::from_millis(500));
    let out = compute(&["micro", "--blades", &addr, "--duration", "0.2", "--warmup", "0", "--quiet"]);
    let _ = child.kill();
    let blade_out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&blade_out.stderr);
    assert!(err.contains("accept failed") && err.contains("still serving"), "{err}");
}

/// Sends SIGINT to `child` after `after`, then waits (bounded) for its exit.
fn interrupt(mut child: Child, after: Duration) -> std::process::ExitStatus {
    std::thread::sleep(after);
    signal(&child, "-INT");
    wait_bounded(&mut child, Duration::from_secs(20), "compute-blade ignored SIGINT")
}

#[test]
fn sigint_stops_a_run_cleanly_with_its_record_and_status_130() {
    for (name, args) in [
        ("micro", vec!["micro", "--threads", "2"]),
        ("ycsb", vec!["ycsb", "--keys", "2000", "--verify", "--threads", "2", "--coroutines", "4"]),
    ] {
        let json = tmp(&format!("sigint-{name}.json"));
        // Progress lines on stderr say when the timed run has begun (after
        // the load, for ycsb); the signal comes a second into it.
        let mut child = Command::new(COMPUTE)
            .args(&args)
            .args(["--duration", "120", "--warmup", "0", "--json", json.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let begun = lines.by_ref().map_while(Result::ok).any(|l| l.contains("Mop/s"));
        assert!(begun, "{name}: no progress line");
        // Keep draining stderr so the child never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        let st = interrupt(child, Duration::from_millis(1000));
        assert_eq!(st.code(), Some(130), "{name}: {st:?}");
        let r = record(&json);
        assert_eq!(r["interrupted"], json!(true), "{name}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{name}");
        assert!(r["duration_s"].as_f64().unwrap() < 60.0, "{name}: stopped early");
        assert_eq!(r["errors"], json!(0), "{name}: operations finished, not cut");
        if name == "ycsb" {
            assert_eq!(r["violations"], json!(0));
        }
        std::fs::remove_file(json).unwrap();
    }
}

#[test]
fn concurrent_contended_runs_on_one_blade_each_check_their_own_counter() {
    let blade = Blade::start(&["--size", "64MiB"]);
    let run = || {
        Command::new(COMPUTE)
            .args(["micro", "--blades", &blade.addr, "--op", "faa", "--contended", "--threads", "2"])
            .args(["--duration", "1.5", "--warmup", "0", "--quiet"])
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(run);
        let b = s.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    for out in [a, b] {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!String::from_utf8_lossy(&out.stderr).contains("VIOLATION"));
    }
}

#[test]
fn the_seed_is_recorded_and_differs_by_default() {
    let seed_of = |extra: &[&str]| {
        let json = tmp(&format!("seed-{}.json", extra.len()));
        let mut a = vec!["micro", "--duration", "0.1", "--warmup", "0", "--quiet", "--json", json.to_str().unwrap()];
        a.extend(extra);
        assert!(compute(&a).status.success());
        let s = record(&json)["seed"].as_u64().unwrap();
        std::fs::remove_file(json).unwrap();
        s
    };
    assert_eq!(seed_of(&["--seed", "42"]), 42);
    assert_ne!(seed_of(&[]), seed_of(&[]), "two runs without --seed draw different seeds");
}

/// A peer that completes every handshake and then never answers a batch
/// (a frozen blade); stops when dropped.
struct Mute {
    addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Mute {
    fn start() -> Mute {
        use smart_core::wire;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        use std::io::Read;
                        s.set_nonblocking(false).unwrap();
                        let mut hello = [0u8; wire::HELLO_LEN];
                        if s.read_exact(&mut hello).is_ok() {
                            let w = wire::Welcome {
                                version: wire::PROTOCOL_VERSION,
                                status: wire::STATUS_OK,
                                size: 64 << 20,
                                rkey: 1,
                                flags: 0,
                                identity: 1,
                            };
                            let _ = s.write_all(&w.encode());
                            held.push(s);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Mute { addr, stop }
    }
}

impl Drop for Mute {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_blade_that_never_answers_is_a_timeout_naming_it_not_a_hang() {
    let mute = Mute::start();
    let t0 = Instant::now();
    let out = compute(&["micro", "--blades", &mute.addr, "--request-timeout", "1", "--duration", "60", "--quiet"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("memory blade 0 did not answer"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(50), "gave up on the time-out, not at the end of the run");
}

#[test]
fn a_default_blade_serves_a_compute_blade_of_the_most_threads_allowed() {
    // 1024 threads (the most `--threads` accepts) and the set-up
    // connection: a default memory blade serves them all.
    let blade = Blade::start(&["--size", "64MiB"]);
    let out = compute(&[
        "micro",
        "--blades",
        &blade.addr,
        "--threads",
        "1024",
        "--coroutines",
        "1",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
