//! One semantic suite, run against every backend.

use std::future::Future;

use smart_core::backend::Endpoint;
use smart_core::{Completion, Error, GlobalAddr, Opcode, Runtime, RuntimeConfig, ThreadSpec, WcStatus, WorkRequest};

use smart_testkit::backends::{self, Backend};

fn runtime(b: &Backend) -> Runtime {
    Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap()
}

#[test]
fn verbs_behave_like_rdma_on_every_backend() {
    for b in backends::all(2) {
        verbs_behave_like_rdma_on_every_backend_on(&b);
    }
}

/// The body of [`verbs_behave_like_rdma_on_every_backend`] for one backend (also run by the verbs device tests).
pub(crate) fn verbs_behave_like_rdma_on_every_backend_on(b: &Backend) {
    let mut rt = runtime(b);
    let ctx = rt.ctx();
    let name = b.name;
    rt.block_on(async move {
        for blade in 0..2u16 {
            ctx.check_blade(blade).await.unwrap();
            let a = ctx.alloc(blade, 4096, 64).await.unwrap();
            assert_eq!(a.blade(), blade);
            // READ after WRITE, multi-line and unaligned.
            let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 + u32::from(blade)) as u8).collect();
            ctx.write(a.add(3), &data).await.unwrap();
            let mut back = vec![0u8; 1000];
            ctx.read(a.add(3), &mut back).await.unwrap();
            assert_eq!(back, data, "{name}: read after write");
            // CAS success and failure both return the old value.
            let w = a.add(2048);
            ctx.write(w, &5u64.to_le_bytes()).await.unwrap();
            assert_eq!(ctx.cas(w, 5, 9).await.unwrap(), 5, "{name}: successful CAS");
            assert_eq!(ctx.cas(w, 5, 11).await.unwrap(), 9, "{name}: failed CAS");
            assert_eq!(ctx.read_u64(w).await.unwrap(), 9, "{name}: failed CAS changed nothing");
            // FAA returns the old value.
            assert_eq!(ctx.faa(w, 3).await.unwrap(), 9, "{name}: FAA");
            assert_eq!(ctx.faa(w, u64::MAX).await.unwrap(), 12, "{name}: FAA wraps");
            assert_eq!(ctx.read_u64(w).await.unwrap(), 11);
            // A batch executes in order: each WR sees the effect of the last.
            let hundred = 100u64.to_le_bytes();
            let mut bt = ctx.batch();
            bt.write(w, &hundred);
            let f1 = bt.faa(w, 1);
            let c1 = bt.cas(w, 101, 200);
            let r1 = bt.read(w, 8);
            let f2 = bt.faa(w, 5);
            let r2 = bt.read(w, 8);
            let done = bt.post().await.unwrap();
            assert_eq!(done.old(f1), 100, "{name}: batch order");
            assert_eq!(done.old(c1), 101);
            assert_eq!(done.bytes(r1), &200u64.to_le_bytes());
            assert_eq!(done.old(f2), 200);
            assert_eq!(done.bytes(r2), &205u64.to_le_bytes());
        }
    });
}

#[test]
fn bad_batches_are_refused_before_posting() {
    for b in backends::all(2) {
        bad_batches_are_refused_before_posting_on(&b);
    }
}

/// The body of [`bad_batches_are_refused_before_posting`] for one backend (also run by the verbs device tests).
pub(crate) fn bad_batches_are_refused_before_posting_on(b: &Backend) {
    let mut rt = runtime(b);
    let ctx = rt.ctx();
    rt.block_on(async move {
        let mut bt = ctx.batch();
        bt.read(GlobalAddr::new(0, 4096), 8);
        bt.read(GlobalAddr::new(1, 4096), 8);
        assert!(matches!(bt.post().await, Err(Error::BatchSpansBlades(0, 1))));
        let mut bt = ctx.batch();
        bt.read(GlobalAddr::new(7, 4096), 8);
        assert!(matches!(bt.post().await, Err(Error::NoSuchBlade(7, 2))));
        let mut bt = ctx.batch();
        bt.read(GlobalAddr::new(0, 4096), 1 << 20);
        assert!(matches!(bt.post().await, Err(Error::BatchTooLarge { .. })));
        assert!(matches!(ctx.batch().post().await, Err(Error::InvalidWr(_))));
        let mut bt = ctx.batch();
        bt.faa(GlobalAddr::new(0, 4096), 1);
        bt.cas(GlobalAddr::new(0, 4100), 0, 1);
        assert!(matches!(bt.post().await, Err(Error::InvalidWr(m)) if m.contains("aligned")));
        // The runtime still works after refusals.
        assert_eq!(ctx.faa(GlobalAddr::new(0, 4096), 1).await.unwrap(), 0);
    });
}

/// Polls `ep` until `n` completions came (10 s at most), calling `before`
/// ahead of each poll; exactly `n` must come.
fn poll_n(ep: &mut dyn Endpoint, n: usize, mut before: impl FnMut(&mut dyn Endpoint)) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.len() < n {
        assert!(std::time::Instant::now() < deadline, "{} of {n} completions within 10 s", out.len());
        before(&mut *ep);
        if ep.poll(&mut out) == 0 {
            ep.idle();
        }
    }
    assert_eq!(out.len(), n, "more completions than batches: {out:?}");
    out
}

/// Posts raw WRs to an endpoint and waits for the completion.
fn post_wait(ep: &mut dyn Endpoint, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Completion {
    ep.post(qp, wr_id, wrs).unwrap();
    poll_n(ep, 1, |_| {})[0]
}

#[test]
fn bad_wrs_get_error_completions_and_error_only_their_qp() {
    for b in backends::all(2) {
        bad_wrs_get_error_completions_and_error_only_their_qp_on(&b);
    }
}

/// The body of [`bad_wrs_get_error_completions_and_error_only_their_qp`] for one backend (also run by the verbs device tests).
pub(crate) fn bad_wrs_get_error_completions_and_error_only_their_qp_on(b: &Backend) {
    let name = b.name;
    let info = b.transport.blades()[0];
    let mut ep = b.transport.open_thread(0, ThreadSpec { local_bytes: 4096, max_wrs: 64, fence_tag: 0 }).unwrap();
    let mut other = b.transport.open_thread(1, ThreadSpec { local_bytes: 4096, max_wrs: 64, fence_tag: 0 }).unwrap();
    let wr = |op, off: u64, len, rkey| WorkRequest {
        op,
        local_off: 0,
        len,
        remote: GlobalAddr::new(0, off),
        rkey,
        compare_add: 1,
        swap: 1,
    };
    let good = wr(Opcode::Faa, 4096, 8, info.rkey);
    let cases = [
        ("out of bounds read", wr(Opcode::Read, info.size - 4, 8, info.rkey), WcStatus::RemoteAccess),
        ("offset overflow", wr(Opcode::Write, (1 << 48) - 1, 16, info.rkey), WcStatus::RemoteAccess),
        ("wrong rkey", wr(Opcode::Read, 4096, 8, info.rkey ^ 0x55), WcStatus::RemoteAccess),
    ];
    for (i, (what, bad, status)) in cases.into_iter().enumerate() {
        // [good, bad, good]: the first takes effect, the error names index 1.
        let c = post_wait(&mut *ep, 0, i as u64, &[good, bad, good]);
        assert_eq!(c.wr_id, i as u64);
        assert_eq!(c.status, Err((status, 1)), "{name}: {what}");
        // The QP is now in the error state: later batches are flushed ...
        let c = post_wait(&mut *ep, 0, 100, &[good]);
        assert_eq!(c.status, Err((WcStatus::Flushed, 0)), "{name}: {what}: flushed");
        // ... while another thread's QP to the same blade, and this
        // thread's QP to the other blade, keep working.
        assert_eq!(post_wait(&mut *other, 0, 7, &[good]).status, Ok(()), "{name}: other QP");
        let good1 = WorkRequest { remote: GlobalAddr::new(1, 4096), rkey: b.transport.blades()[1].rkey, ..good };
        assert_eq!(post_wait(&mut *ep, 1, 8, &[good1]).status, Ok(()), "{name}: other blade");
        ep.reset_qp(0).unwrap();
        assert_eq!(post_wait(&mut *ep, 0, 9, &[good]).status, Ok(()), "{name}: after reset");
    }
    // Exactly the good FAAs landed: 2 per case before/after reset, 1 on the other thread.
    let c = post_wait(&mut *ep, 0, 10, &[wr(Opcode::Faa, 4096, 8, info.rkey)]);
    assert_eq!(c.status, Ok(()));
    // SAFETY: the batch completed, and nothing else is in flight on this endpoint.
    let old = u64::from_ne_bytes(unsafe { ep.local().bytes(0, 8) }.try_into().unwrap());
    assert_eq!(old, 3 * 3, "{name}: FAAs that took effect");
    // Local ranges outside local memory, and atomics that are not 8 aligned
    // bytes, are refused at post, before anything reaches the blade.
    let far = WorkRequest { local_off: 4090, ..good };
    assert!(matches!(ep.post(0, 11, &[far]), Err(Error::InvalidWr(_))), "{name}");
    for (what, bad) in [
        ("misaligned CAS", wr(Opcode::Cas, 4100, 8, info.rkey)),
        ("short FAA", wr(Opcode::Faa, 4096, 4, info.rkey)),
        ("long CAS", wr(Opcode::Cas, 4096, 16, info.rkey)),
    ] {
        let e = ep.post(0, 12, &[good, bad]).unwrap_err();
        assert!(matches!(e, Error::InvalidWr(m) if m.contains("atomic")), "{name}: {what}: {e}");
    }
    let c = post_wait(&mut *ep, 0, 13, &[good]);
    assert_eq!(c.status, Ok(()), "{name}: the QP is unharmed by refused batches");
    // SAFETY: as above.
    let old = u64::from_ne_bytes(unsafe { ep.local().bytes(0, 8) }.try_into().unwrap());
    assert_eq!(old, 3 * 3 + 1, "{name}: refused batches did not run their good WR");
}

#[test]
fn runtime_reports_error_completions_and_recovers_after_reset() {
    for b in backends::all(1) {
        runtime_reports_error_completions_and_recovers_after_reset_on(&b);
    }
}

/// The body of [`runtime_reports_error_completions_and_recovers_after_reset`] for one backend (also run by the verbs device tests).
pub(crate) fn runtime_reports_error_completions_and_recovers_after_reset_on(b: &Backend) {
    let mut rt = runtime(b);
    let ctx = rt.ctx();
    let size = b.transport.blades()[0].size;
    rt.block_on(async move {
        let e = ctx.read_u64(GlobalAddr::new(0, size)).await.unwrap_err();
        assert!(e.is_wc(WcStatus::RemoteAccess), "{e}");
        let e = ctx.read_u64(GlobalAddr::new(0, 4096)).await.unwrap_err();
        assert!(e.is_wc(WcStatus::Flushed), "{e}");
        ctx.reset_qp(0).unwrap();
        assert_eq!(ctx.faa(GlobalAddr::new(0, 4096), 1).await.unwrap(), 0);
        assert_eq!(ctx.stats().error_completions, 2);
    });
}

#[test]
fn named_roots_have_one_winner() {
    for b in backends::all(1) {
        named_roots_have_one_winner_on(&b);
    }
}

/// The body of [`named_roots_have_one_winner`] for one backend (also run by the verbs device tests).
pub(crate) fn named_roots_have_one_winner_on(b: &Backend) {
    let mut rt = runtime(b);
    let ctx = rt.ctx();
    rt.block_on(async move {
        assert_eq!(ctx.root(0, "table").await.unwrap(), None);
        let a = GlobalAddr::new(0, 8192);
        let c = GlobalAddr::new(0, 16384);
        assert_eq!(ctx.set_root(0, "table", a).await.unwrap(), a);
        assert_eq!(ctx.set_root(0, "table", c).await.unwrap(), a, "second setter learns the winner");
        assert_eq!(ctx.set_root(0, "other", c).await.unwrap(), c);
        assert_eq!(ctx.root(0, "table").await.unwrap(), Some(a));
        assert_eq!(ctx.root(0, "other").await.unwrap(), Some(c));
    });
}

#[test]
fn dropped_future_keeps_its_slot_until_completion() {
    for b in backends::all(1) {
        dropped_future_keeps_its_slot_until_completion_on(&b);
    }
}

/// The body of [`dropped_future_keeps_its_slot_until_completion`] for one backend (also run by the verbs device tests).
pub(crate) fn dropped_future_keeps_its_slot_until_completion_on(b: &Backend) {
    // A coroutine drops its post future while the READ is in flight; the
    // slot must not be reused until the completion lands, or the late READ
    // data would overwrite the next batch's buffers.
    {
        let cfg = RuntimeConfig { slots: 1, ..RuntimeConfig::default() };
        let mut rt = Runtime::new(&*b.transport, 0, cfg).unwrap();
        let ctx = rt.ctx();
        let name = b.name;
        rt.block_on(async move {
            let a = ctx.alloc(0, 64, 8).await.unwrap();
            ctx.write(a, &[0xee; 64]).await.unwrap();
            {
                let mut bt = ctx.batch();
                bt.read(a, 64);
                let mut fut = std::pin::pin!(bt.post());
                // Poll once: posts the batch, then drop it in flight.
                std::future::poll_fn(|cx| {
                    assert!(fut.as_mut().poll(cx).is_pending());
                    std::task::Poll::Ready(())
                })
                .await;
            }
            // The only slot is orphaned: this batch waits for it, then runs.
            let mut bt = ctx.batch();
            let r = bt.read(a.add(8), 8);
            let f = bt.faa(a.add(16), 1);
            let done = bt.post().await.unwrap();
            assert_eq!(done.bytes(r), &[0xee; 8], "{name}");
            assert_eq!(done.old(f), 0xeeee_eeee_eeee_eeee, "{name}");
        });
    }
}

#[test]
fn batches_posted_before_a_poll_execute_in_posting_order() {
    for b in backends::all(2) {
        batches_posted_before_a_poll_execute_in_posting_order_on(&b);
    }
}

/// The body of [`batches_posted_before_a_poll_execute_in_posting_order`] for one backend.
///
/// Five batches on one QP, posted back to back before any poll (the way a
/// thread's coroutines post in one round): each sees the effect of the ones
/// posted before it, their completions come back in posting order, and the
/// QP is busy for a reset until all of them were polled.
pub(crate) fn batches_posted_before_a_poll_execute_in_posting_order_on(b: &Backend) {
    let name = b.name;
    let info = b.transport.blades()[0];
    let mut ep = b.transport.open_thread(0, ThreadSpec { local_bytes: 4096, max_wrs: 64, fence_tag: 0 }).unwrap();
    let at = 8192u64;
    let wr = |op, local_off: u32, compare_add, swap| WorkRequest {
        op,
        local_off,
        len: 8,
        remote: GlobalAddr::new(0, at),
        rkey: info.rkey,
        compare_add,
        swap,
    };
    // SAFETY: nothing is in flight on this endpoint yet.
    unsafe { ep.local().bytes_mut(0, 8) }.copy_from_slice(&40u64.to_ne_bytes());
    let batches = [
        [wr(Opcode::Write, 0, 0, 0)], // x = 40
        [wr(Opcode::Faa, 8, 2, 0)],   // old 40, x = 42
        [wr(Opcode::Cas, 16, 42, 7)], // old 42, x = 7
        [wr(Opcode::Cas, 24, 42, 9)], // old 7: fails
        [wr(Opcode::Read, 32, 0, 0)], // 7
    ];
    for (i, batch) in batches.iter().enumerate() {
        ep.post(0, i as u64, batch).unwrap();
    }
    let out = poll_n(&mut *ep, batches.len(), |ep| {
        assert!(matches!(ep.reset_qp(0), Err(Error::QpBusy(0))), "{name}: reset with unpolled batches");
    });
    let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4], "{name}: completion order");
    assert!(out.iter().all(|c| c.status.is_ok()), "{name}: {out:?}");
    // SAFETY: every batch completed; nothing is in flight.
    let word = |off: u32| u64::from_ne_bytes(unsafe { ep.local().bytes(off, 8) }.try_into().unwrap());
    assert_eq!([word(8), word(16), word(24), word(32)], [40, 42, 7, 7], "{name}: results in posting order");
    ep.reset_qp(0).unwrap();
}

#[test]
fn teardown_with_wrs_in_flight_is_clean() {
    for b in backends::all(2) {
        teardown_with_wrs_in_flight_is_clean_on(b);
    }
}

/// The body of [`teardown_with_wrs_in_flight_is_clean`] for one backend (also run by the verbs device tests).
pub(crate) fn teardown_with_wrs_in_flight_is_clean_on(b: Backend) {
    let name = b.name;
    let info = b.transport.blades()[0];
    let spec = ThreadSpec { local_bytes: 4 << 20, max_wrs: 64, fence_tag: 0 };
    let read = |i: u32| WorkRequest {
        op: Opcode::Read,
        local_off: i << 20,
        len: 1 << 20,
        remote: GlobalAddr::new(0, u64::from(i) << 20),
        rkey: info.rkey,
        compare_add: 0,
        swap: 0,
    };
    // A thread ends with 4 MiB of READs in flight, never polled.
    let mut ep = b.transport.open_thread(0, spec).unwrap();
    for i in 0..4 {
        ep.post(0, u64::from(i), &[read(i)]).unwrap();
    }
    drop(ep);
    // The transport and the blade serve the next thread as before.
    let mut ep = b.transport.open_thread(1, spec).unwrap();
    let faa = WorkRequest { op: Opcode::Faa, len: 8, compare_add: 1, ..read(0) };
    assert_eq!(post_wait(&mut *ep, 0, 1, &[faa]).status, Ok(()), "{name}: after a thread ended mid-flight");
    // The whole backend goes away with WRs in flight on both blades.
    for i in 0..4 {
        ep.post(0, 10 + u64::from(i), &[read(i)]).unwrap();
    }
    let far = WorkRequest { remote: GlobalAddr::new(1, 0), rkey: b.transport.blades()[1].rkey, ..read(0) };
    ep.post(1, 20, &[far]).unwrap();
    drop(b);
    drop(ep);
}
