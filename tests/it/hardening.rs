//! The memory blade under peers that misbehave on purpose: its memory
//! stays within what its flags say, and real clients still get served.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use smart_core::backend::tcp::handshake;
use smart_core::wire::{self, Header, WrDesc};
use smart_core::Opcode;

use crate::cli::{compute, Blade};

/// A field of `/proc/PID/status` in KiB (e.g. `VmHWM`, the peak RSS).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 48 connections each ask for four 16 MiB responses (16 one-MiB READs a
/// frame, 2.6 KB of requests) and read none: the blade's peak memory stays
/// within its region, its response budget and a fixed cost per
/// connection, not 48 × 16 MiB; a real client is served meanwhile.
#[test]
fn many_amplifying_connections_share_a_bounded_response_memory() {
    let blade = Blade::start(&["--size", "32MiB", "--response-memory", "40MiB"]);
    let pid = blade.child.id();
    let before = status_kib(pid, "VmRSS");
    let mut frame = Vec::new();
    let mut conns: Vec<TcpStream> = Vec::new();
    for c in 0..48 {
        let (mut s, info) = handshake(&blade.addr, wire::PROTOCOL_VERSION).unwrap();
        if frame.is_empty() {
            for f in 0..4u64 {
                Header { len: 16 * wire::WR_DESC_LEN as u32, kind: wire::KIND_BATCH, count: 16, wr_id: f }
                    .put(&mut frame);
                for r in 0..16u64 {
                    let remote = (r % 8) << 20;
                    WrDesc { op: Opcode::Read as u8, rkey: info.rkey, remote, len: 1 << 20, compare_add: 0, swap: 0 }
                        .put(&mut frame);
                }
            }
        }
        s.write_all(&frame).unwrap_or_else(|e| panic!("connection {c}: {e}"));
        conns.push(s);
    }
    // Let every connection run as far as the budget lets it.
    std::thread::sleep(Duration::from_secs(3));
    // A real client is served while they hold their share.
    let out =
        compute(&["micro", "--blades", &blade.addr, "--threads", "1", "--duration", "1", "--request-timeout", "5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let peak = status_kib(pid, "VmHWM");
    // Region 32 MiB, budget 40 MiB, per connection 64 KiB out, 256 KiB in
    // and a stack's touched pages; 40 MiB for the rest of the process.
    let bound = before + (32 + 40 + 40) * 1024 + 48 * 400;
    eprintln!("memory-blade: {before} KiB before, peak {peak} KiB, bound {bound} KiB");
    assert!(peak <= bound, "peak RSS {peak} KiB exceeds {bound} KiB: the responses are not bounded");
    drop(conns);
}

/// Runs `compute-blade args` on a fresh blade, SIGSTOPs the blade `delay`
/// after the compute blade printed a stderr line starting with `marker`,
/// and returns how long the compute blade took to exit after that, its
/// exit code and its stderr.
fn frozen_in(args: &[&str], marker: &str, delay: Duration) -> (Duration, Option<i32>, String) {
    use std::io::BufRead;
    let blade = Blade::start(&["--size", "1GiB"]);
    let mut child = std::process::Command::new(crate::cli::COMPUTE)
        .args(args)
        .args(["--blades", &blade.addr, "--request-timeout", "3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        said += &line;
        said.push('\n');
        if line.starts_with(marker) {
            break;
        }
    }
    assert!(said.lines().any(|l| l.starts_with(marker)), "{args:?} never printed {marker:?}: {said}");
    std::thread::sleep(delay);
    assert!(child.try_wait().unwrap().is_none(), "{args:?} ended before the blade froze: {said}");
    crate::cli::signal(&blade.child, "-STOP");
    let t0 = std::time::Instant::now();
    let rest = std::thread::spawn(move || lines.map(|l| l.unwrap() + "\n").collect::<String>());
    let status = crate::cli::wait_bounded(&mut child, Duration::from_secs(60), "no exit with the blade frozen");
    let took = t0.elapsed();
    (took, status.code(), said + &rest.join().unwrap())
}

/// A frozen (SIGSTOPped) memory blade is detected within 1.2 × the
/// request time-out (3 s here) in every phase, and the error names the
/// phase: nothing after the first time-out waits for that blade again.
#[test]
fn a_frozen_blade_is_detected_within_the_request_timeout_in_every_phase() {
    let limit = Duration::from_secs_f64(1.2 * 3.0);
    let cases: [(&[&str], &str, u64, &str); 5] = [
        (&["micro", "--threads", "2", "--duration", "30"], "warming up", 1500, "during the timed run"),
        (&["ycsb", "--threads", "2", "--keys", "2000000", "--duration", "30"], "loading", 300, "load failed"),
        (&["ycsb", "--threads", "2", "--keys", "20000", "--duration", "30"], "warming up", 1500, "after the timed run"),
        (
            // The read-back (one coroutine, 200,000 keys) starts 2 s after
            // the warm-up starts and lasts seconds.
            &["ycsb", "--threads", "2", "--keys", "200000", "--duration", "1", "--verify"],
            "warming up",
            2400,
            "reading back every key after the timed run",
        ),
        (
            &["smallbank", "--threads", "2", "--replicas", "1", "--duration", "30"],
            "warming up",
            1500,
            "during the timed run",
        ),
    ];
    for (args, marker, delay, phase) in cases {
        let (took, code, said) = frozen_in(args, marker, Duration::from_millis(delay));
        eprintln!("{args:?}: exited {code:?} {:.2} s after the blade froze", took.as_secs_f64());
        assert_eq!(code, Some(1), "{args:?}: {said}");
        assert!(took <= limit, "{args:?}: {:.2} s after the freeze, more than {limit:?}: {said}", took.as_secs_f64());
        assert!(said.contains(phase) && said.contains("did not answer"), "{args:?} does not name {phase:?}: {said}");
    }
}

/// `compute-blade secret` writes a private secret file; a memory blade
/// started with it serves only compute blades that pass it: a run without
/// it, or with another, fails and says why; with it, runs, recovery (which
/// revokes) and table listing work.
#[test]
fn a_blade_with_a_secret_serves_only_compute_blades_that_hold_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::cli::tmp("secret");
    std::fs::create_dir_all(&dir).unwrap();
    let (file, other) = (dir.join("cluster.secret"), dir.join("other.secret"));
    for f in [&file, &other] {
        let _ = std::fs::remove_file(f);
        let out = compute(&["secret", f.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::metadata(f).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let again = compute(&["secret", file.to_str().unwrap()]);
    assert!(!again.status.success(), "an existing secret file is never overwritten");
    let (file, other) = (file.to_str().unwrap(), other.to_str().unwrap());
    let blade = Blade::start(&["--size", "256MiB", "--secret-file", file]);
    let micro = |extra: &[&str]| {
        let mut args = vec!["micro", "--blades", &blade.addr, "--threads", "1", "--duration", "0.3", "--quiet"];
        args.extend_from_slice(extra);
        compute(&args)
    };
    let out = micro(&[]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("serves only holders of the cluster secret"), "{said}");
    let out = micro(&["--secret-file", other]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("holds another secret"), "{said}");
    let out = micro(&["--secret-file", file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let blades = ["--blades", &blade.addr, "--secret-file", file];
    let out = compute(
        &[&["smallbank", "--threads", "1", "--duration", "0.3", "--replicas", "1", "--quiet"], &blades[..]].concat(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = compute(&[&["recover", "--db", "smallbank"], &blades[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = compute(&[&["table", "list"], &blades[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Without blades, a secret is a usage error.
    assert_eq!(compute(&["micro", "--secret-file", file, "--duration", "0.1"]).status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}
