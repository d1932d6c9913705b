//! Chaos mode really tears multi-line READs, never 8-byte words, and
//! reorders completions across QPs but never within one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smart_core::{GlobalAddr, Opcode, Runtime, RuntimeConfig, ThreadSpec, WorkRequest};

use smart_testkit::backends;

#[test]
fn chaos_tears_multi_line_reads_but_never_words() {
    const WORDS: usize = 64; // 512 bytes = 8 cache lines
    let b = backends::chaos(1, 42);
    let t = b.transport.clone();
    let addr = GlobalAddr::new(0, 8192);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rt = Runtime::new(&*t, 1, RuntimeConfig::default()).unwrap();
            let ctx = rt.ctx();
            rt.block_on(async move {
                let mut v = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    // Every word of one WRITE carries the same value, and each
                    // word's bytes are all different, so a torn word would show.
                    let word = v.wrapping_mul(0x0101_0101_0101_0101) ^ 0x0001_0203_0405_0607;
                    let buf: Vec<u8> = std::iter::repeat_n(word.to_le_bytes(), WORDS).flatten().collect();
                    ctx.write(addr, &buf).await.unwrap();
                    v = v % 250 + 1;
                }
            });
        })
    };
    let mut rt = Runtime::new(&*t, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    let (torn, reads) = rt.block_on(async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut torn, mut reads) = (0u64, 0u64);
        let mut buf = vec![0u8; WORDS * 8];
        while Instant::now() < deadline && (torn < 20 || reads < 2000) {
            ctx.read(addr, &mut buf).await.unwrap();
            reads += 1;
            let words: Vec<u64> = buf.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
            for w in &words {
                if *w != 0 {
                    let v = (w ^ 0x0001_0203_0405_0607) & 0xff;
                    let expect = v.wrapping_mul(0x0101_0101_0101_0101) ^ 0x0001_0203_0405_0607;
                    assert_eq!(*w, expect, "an 8-byte word was torn: {w:#018x}");
                }
            }
            if words.iter().any(|w| *w != words[0]) {
                torn += 1;
            }
        }
        (torn, reads)
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(torn > 0, "no torn READ in {reads} reads: chaos mode does not tear");
    eprintln!("chaos: {torn} torn READs of {reads}");
}

#[test]
fn without_chaos_single_thread_reads_are_never_torn() {
    // The control: the same check with one thread finds nothing to flag,
    // so the torn count above is caused by concurrency under chaos.
    let b = backends::embedded(1);
    let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
    let ctx = rt.ctx();
    rt.block_on(async move {
        let a = GlobalAddr::new(0, 8192);
        for v in 1..200u64 {
            ctx.write(a, &v.to_le_bytes().repeat(64)).await.unwrap();
            let mut buf = vec![0u8; 512];
            ctx.read(a, &mut buf).await.unwrap();
            assert!(buf.chunks(8).all(|c| c == v.to_le_bytes()));
        }
    });
}

/// Posts 5 batches on each of 4 QPs per round, 200 rounds; checks
/// per-QP order and returns in how many rounds the QPs' first completions
/// came back in another order than 0, 1, 2, 3.
fn rounds_reordered_across_qps(b: &smart_testkit::backends::Backend) -> usize {
    let infos = b.transport.blades().to_vec();
    let mut ep = b.transport.open_thread(0, ThreadSpec { local_bytes: 4096, max_wrs: 64, fence_tag: 0 }).unwrap();
    let mut crossed = 0;
    let mut out = Vec::new();
    for round in 0..200u64 {
        for seq in 0..5u64 {
            for qp in 0..4u16 {
                let wr = WorkRequest {
                    op: Opcode::Faa,
                    local_off: 8 * u32::from(qp),
                    len: 8,
                    remote: GlobalAddr::new(qp, 4096),
                    rkey: infos[qp as usize].rkey,
                    compare_add: 1,
                    swap: 0,
                };
                ep.post(qp, u64::from(qp) << 32 | (round * 5 + seq), &[wr]).unwrap();
            }
        }
        out.clear();
        while out.len() < 20 {
            ep.poll(&mut out);
        }
        let mut last = [None::<u64>; 4];
        let mut first_seen = Vec::new();
        for c in &out {
            assert_eq!(c.status, Ok(()));
            let qp = (c.wr_id >> 32) as usize;
            let seq = c.wr_id & 0xffff_ffff;
            if let Some(prev) = last[qp] {
                assert!(seq > prev, "QP {qp}: completion {seq} after {prev}");
            }
            last[qp] = Some(seq);
            if !first_seen.contains(&qp) {
                first_seen.push(qp);
            }
        }
        if first_seen != [0, 1, 2, 3] {
            crossed += 1;
        }
    }
    crossed
}

#[test]
fn chaos_reorders_across_qps_never_within_one() {
    let crossed = rounds_reordered_across_qps(&backends::chaos(4, 3));
    assert!(crossed > 50, "completions across QPs were reordered in only {crossed} of 200 rounds");
    // Control: without chaos the embedded backend serves QPs in order.
    assert_eq!(rounds_reordered_across_qps(&backends::embedded(4)), 0);
}
