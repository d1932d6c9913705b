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
