//! HOCL, Sherman's hierarchical on-chip lock: a global lock word per page
//! hash on the page's blade (CAS 0 → tag to acquire, CAS tag → 0 to
//! release, the release riding in the doorbell that writes the page back;
//! Sherman releases with a WRITE of 0, but an RNIC's atomics are atomic
//! only with respect to other atomics: Soft-RoCE in Linux 6.1 writes a
//! failing CAS's word back, which would undo a WRITE that landed
//! meanwhile and leave the lock held until its lease ran out), and a
//! local lock per lock word on the compute side, so that coroutines of one
//! thread wanting the same lock queue locally instead of spinning on the
//! blade. A holder with local waiters hands the global lock straight to the
//! next of them, at most [`MAX_HANDOVERS`] times in a row, before it
//! releases it on the blade (fairness to other compute blades).
//!
//! The local table is per thread (shared by the thread's coroutines),
//! where Sherman's is per compute blade: threads of one process meet on the
//! global word like separate processes do.
//!
//! A client holds at most one page lock at a time (locks are shared by
//! hash, so holding two could deadlock). A lock word names its holder and
//! the acquisition (client id, count), so a waiter that sees the very same
//! word for [`LOCK_LEASE`] concludes that the holder died and takes the
//! lock over by CAS from that word.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rustc_hash::FxHashMap;
use smart_core::runtime::OpGuard;
use smart_core::GlobalAddr;

use crate::layout::{self, PageRef};
use crate::{Local, Result, ShermanBt, ShermanError};

/// Failed CASes on one lock before a waiter starts pausing between them
/// (besides ConflictAvoid's backoff when that is on).
const SPIN_LIMIT: u32 = 64;

/// Local hand-overs in a row before the global lock is released.
pub const MAX_HANDOVERS: u32 = 8;

/// How long a lock word may stay the same (one acquisition) before a waiter
/// takes it over: orders of magnitude above a holder's three round trips.
pub const LOCK_LEASE: Duration = Duration::from_secs(2);

/// The local queue of one lock word (a ticket lock).
#[derive(Debug, Default)]
struct Queue {
    next: u64,
    serving: u64,
    /// Whether the ticket being served holds the global lock (handed over).
    global: bool,
    /// The global word's value while this thread holds it: the tag of the
    /// acquisition that took it on the blade.
    tag: u64,
    /// When that tag was written (this thread's clock, ns): a waiter
    /// elsewhere may take the lock over a lease after it.
    since: u64,
    handovers: u32,
    wakers: VecDeque<(u64, Waker)>,
    abandoned: Vec<u64>,
}

impl Queue {
    fn advance(&mut self) {
        self.serving += 1;
        while let Some(i) = self.abandoned.iter().position(|&t| t == self.serving) {
            self.abandoned.swap_remove(i);
            self.serving += 1;
        }
        if let Some(i) = self.wakers.iter().position(|(t, _)| *t == self.serving) {
            if let Some((_, w)) = self.wakers.remove(i) {
                w.wake();
            }
        }
    }

    fn idle(&self) -> bool {
        self.next == self.serving && !self.global
    }
}

/// The thread's local lock table.
#[derive(Debug, Default)]
pub(crate) struct LocalLocks {
    queues: FxHashMap<u64, Queue>,
}

impl LocalLocks {
    /// Whether no lock has a local queue (none held or waited for).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    fn ticket(&mut self, id: u64) -> u64 {
        let q = self.queues.entry(id).or_default();
        q.next += 1;
        q.next - 1
    }

    /// Decides the release of lock `id`, whose global word holds `tag`:
    /// `true` if the global word must be released (no local waiter, or too
    /// many hand-overs in a row).
    fn plan_release(&mut self, id: u64, tag: u64, since: u64) -> bool {
        let q = self.queues.get_mut(&id).expect("a held lock has a queue");
        q.tag = tag;
        q.since = since;
        q.handovers += 1;
        let waiters = q.next > q.serving + 1 + q.abandoned.len() as u64;
        if waiters && q.handovers < MAX_HANDOVERS {
            q.global = true;
            false
        } else {
            q.global = false;
            q.handovers = 0;
            true
        }
    }

    /// Passes lock `id` to the next local waiter. Returns `true` if the
    /// global word is still held with nobody to take it (the waiter it was
    /// planned for was dropped): the caller must release it.
    fn finish_release(&mut self, id: u64) -> bool {
        let q = self.queues.get_mut(&id).expect("a held lock has a queue");
        q.advance();
        let orphaned = q.global && q.next == q.serving;
        if orphaned {
            q.global = false;
            q.handovers = 0;
        }
        if q.idle() {
            self.queues.remove(&id);
        }
        orphaned
    }
}

/// Waits for a ticket's turn in a local queue; yields the global word's tag
/// and when it was written, if the global lock came with it (handed over).
struct Turn<'a> {
    local: &'a RefCell<Local>,
    id: u64,
    ticket: u64,
    done: bool,
}

impl Future for Turn<'_> {
    type Output = Option<(u64, u64)>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<(u64, u64)>> {
        let mut l = self.local.borrow_mut();
        let q = l.locks.queues.get_mut(&self.id).expect("a waited lock has a queue");
        if q.serving == self.ticket {
            let g = q.global.then_some((q.tag, q.since));
            drop(l);
            self.done = true;
            return Poll::Ready(g);
        }
        match q.wakers.iter_mut().find(|(t, _)| *t == self.ticket) {
            Some((_, w)) => w.clone_from(cx.waker()),
            None => q.wakers.push_back((self.ticket, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped while waiting: give the ticket up so later ones advance.
        // (If its turn had come with the global lock, that lock stays held
        // on the blade until a waiter's lease runs out.)
        let mut l = self.local.borrow_mut();
        if let Some(q) = l.locks.queues.get_mut(&self.id) {
            q.wakers.retain(|(t, _)| *t != self.ticket);
            if q.serving == self.ticket {
                q.global = false;
                q.advance();
            } else {
                q.abandoned.push(self.ticket);
            }
            if q.idle() {
                l.locks.queues.remove(&self.id);
            }
        }
    }
}

/// A page lock this handle holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub(crate) page: GlobalAddr,
    pub(crate) word: GlobalAddr,
    /// The global word's value: the tag of the acquisition that took it.
    pub(crate) tag: u64,
    /// When the tag was written (this thread's clock, ns).
    since: u64,
    /// The page's sequence number as read under the lock.
    pub(crate) seq: u32,
}

impl ShermanBt {
    /// The lock word of page `p`.
    pub(crate) fn lock_word(&self, p: GlobalAddr) -> Result<GlobalAddr> {
        let table = self
            .locks
            .get(usize::from(p.blade()))
            .ok_or_else(|| ShermanError::Corrupt(format!("page {p} is on a blade the tree has no lock table for")))?;
        Ok(table.add(layout::lock_slot(p) * 8))
    }

    fn next_tag(&self) -> u64 {
        let mut l = self.local.borrow_mut();
        l.acquisitions = l.acquisitions.wrapping_add(1);
        u64::from(self.client) << 32 | u64::from(l.acquisitions)
    }

    /// Locks page `at` (local queue, then the global word) and reads it into
    /// `self.page`. The global CAS and the page READ share one doorbell
    /// (same QP, so the READ sees the page as the lock's last holder left
    /// it); under contention the CAS alone is retried, with ConflictAvoid's
    /// backoff, and the page is read after it succeeds.
    pub(crate) async fn lock_read(&mut self, at: GlobalAddr, op: &mut OpGuard<'_>) -> Result<Held> {
        let word = self.lock_word(at)?;
        let id = word.raw();
        let ticket = self.local.borrow_mut().locks.ticket(id);
        let handed = Turn { local: &self.local, id, ticket, done: false }.await;
        let (tag, since) = handed.unwrap_or((0, 0));
        let mut held = Held { page: at, word, tag, since, seq: 0 };
        if handed.is_some() {
            self.local.borrow_mut().stats.handovers += 1;
            if let Err(e) = self.read_locked(at).await {
                self.release(held, false).await?;
                return Err(e);
            }
            held.seq = self.page.view().seq();
            return Ok(held);
        }
        let tag = self.next_tag();
        held.tag = tag;
        match self.acquire(at, word, tag, op).await {
            Ok(since) => {
                held.since = since;
                held.seq = self.page.view().seq();
                Ok(held)
            }
            Err(e) => {
                // Not acquired: pass the local turn on.
                let mut l = self.local.borrow_mut();
                let q = l.locks.queues.get_mut(&id).expect("queue");
                q.global = false;
                l.locks.finish_release(id);
                Err(e)
            }
        }
    }

    /// Takes the global word of page `at` (CAS to `tag`) and reads the page;
    /// returns when the tag was written (before the CAS was posted).
    async fn acquire(&mut self, at: GlobalAddr, word: GlobalAddr, tag: u64, op: &mut OpGuard<'_>) -> Result<u64> {
        crate::read::check_link(&self.ctx, at, self.f.page)?;
        let mut expect = 0;
        let mut seen = (0u64, 0u64);
        let mut first = true;
        let (mut failures, mut pause) = (0u32, 1_000u64);
        let ctx = self.ctx.clone();
        loop {
            let mut b = ctx.batch();
            let c = b.cas(word, expect, tag);
            let since = ctx.now_ns();
            if first {
                let r = b.read(at, self.f.page);
                let done = b.post().await?;
                if done.old(c) == expect {
                    if let Some(p) = PageRef::check(done.bytes(r), self.f) {
                        self.page.copy_from(p);
                        self.count_read(self.f.page);
                        return Ok(since);
                    }
                    drop(done);
                    self.local.borrow_mut().stats.torn += 1;
                    return self.read_acquired(at, word, tag).await.map(|()| since);
                }
                expect = done.old(c);
            } else {
                let done = b.post().await?;
                if done.old(c) == expect {
                    drop(done);
                    return self.read_acquired(at, word, tag).await.map(|()| since);
                }
                expect = done.old(c);
            }
            first = false;
            // `expect` now holds the word seen. The same acquisition for
            // longer than the lease: its holder is gone; CAS from it.
            let now = self.ctx.now_ns();
            if expect != seen.0 {
                seen = (expect, now);
                expect = 0;
            } else if now.saturating_sub(seen.1) >= LOCK_LEASE.as_nanos() as u64 {
                self.local.borrow_mut().stats.lock_steals += 1;
                seen = (0, now);
                // Keep `expect` = the dead holder's word for the next CAS.
            } else {
                expect = 0;
            }
            self.local.borrow_mut().stats.lock_retries += 1;
            failures += 1;
            op.retry().await;
            if failures > SPIN_LIMIT {
                // A holder this long is likely descheduled: stop taking
                // the CPU it needs (and the blade's attention).
                self.ctx.sleep_ns(pause).await;
                pause = (pause * 2).min(100_000);
            }
        }
    }

    /// [`ShermanBt::read_locked`] of a page just acquired (`word` holds
    /// `tag`): if no copy validates (no page is there any more), the word
    /// is released again before the error, not left to its lease.
    async fn read_acquired(&mut self, at: GlobalAddr, word: GlobalAddr, tag: u64) -> Result<()> {
        let r = self.read_locked(at).await;
        if r.is_err() {
            let _ = self.ctx.cas(word, tag, 0).await;
        }
        r
    }

    /// READs page `at` (locked by this client) into `self.page`, re-reading
    /// a torn copy a bounded number of times.
    pub(crate) async fn read_locked(&mut self, at: GlobalAddr) -> Result<()> {
        let page = &mut self.page;
        crate::read::with_page(&self.ctx, &self.local, &self.read, (at, self.f), |p| page.copy_from(p)).await
    }

    /// Releases a lock, first writing `self.page` back (sealed with the
    /// next sequence number) when `write`: one doorbell [WRITE page, CAS
    /// unlock], or the page alone when the lock goes to a local waiter.
    pub(crate) async fn unlock(&mut self, h: Held, write: bool) -> Result<()> {
        if write {
            self.page.seal_next();
        }
        self.release(h, write).await
    }

    /// Writes `self.page`, sealed by the caller, and releases the lock.
    pub(crate) async fn unlock_sealed(&mut self, h: Held) -> Result<()> {
        self.release(h, true).await
    }

    /// Before a page WRITE under lock `h`: if half a lease passed since its
    /// tag was written, writes a new tag (CAS from the old), so that a
    /// waiter's lease starts again; returns the lock as held now, or
    /// [`ShermanError::LeaseLost`] (nothing written, the local turn passed
    /// on) if a waiter took the lock over meanwhile (this client stalled
    /// for a lease, and was taken for dead).
    pub(crate) async fn still_held(&mut self, mut h: Held) -> Result<Held> {
        let half = LOCK_LEASE.as_nanos() as u64 / 2;
        while self.ctx.now_ns().saturating_sub(h.since) >= half {
            let (new, since) = (self.next_tag(), self.ctx.now_ns());
            let old = self.ctx.cas(h.word, h.tag, new).await?;
            if old != h.tag {
                let id = h.word.raw();
                let mut l = self.local.borrow_mut();
                l.stats.lease_losses += 1;
                let q = l.locks.queues.get_mut(&id).expect("a held lock has a queue");
                q.global = false;
                q.handovers = 0;
                l.locks.finish_release(id);
                return Err(ShermanError::LeaseLost(h.page));
            }
            (h.tag, h.since) = (new, since);
        }
        Ok(h)
    }

    pub(crate) async fn release(&mut self, h: Held, write: bool) -> Result<()> {
        let h = if write { self.still_held(h).await? } else { h };
        let id = h.word.raw();
        let remote = self.local.borrow_mut().locks.plan_release(id, h.tag, h.since);
        let result = async {
            let mut b = self.ctx.batch();
            if write {
                b.write(h.page, &self.page.b[..]);
            }
            if remote {
                // After the page WRITE on the same QP: the next holder
                // reads the page as written.
                b.cas(h.word, h.tag, 0);
            }
            if !b.is_empty() {
                b.post().await?;
            }
            Ok::<(), ShermanError>(())
        }
        .await;
        let orphaned = self.local.borrow_mut().locks.finish_release(id);
        if orphaned {
            self.ctx.cas(h.word, h.tag, 0).await?;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_handed_over_at_most_max_handovers_times_in_a_row() {
        let mut l = LocalLocks::default();
        let id = 7;
        let first = l.ticket(id);
        assert_eq!(first, 0);
        // Ten waiters queue behind the holder.
        for _ in 0..10 {
            l.ticket(id);
        }
        let mut remote = Vec::new();
        for _ in 0..11 {
            remote.push(l.plan_release(id, 7, 0));
            assert!(!l.finish_release(id));
        }
        // Hand-overs 1..7 keep the word; the 8th releases it; then the count
        // restarts; the last holder has no waiter and releases.
        let expect: Vec<bool> = (1..=11).map(|i| i == 8 || i == 11).collect();
        assert_eq!(remote, expect);
        assert!(l.queues.is_empty(), "an idle lock leaves no queue behind");
    }

    /// A holder whose lock a waiter took over (after the lease: the holder
    /// stalled) writes nothing under it and says so; one whose lock is
    /// only old renews it, writes, and releases it.
    #[test]
    fn a_holder_that_lost_its_lock_to_a_waiter_writes_nothing() {
        use crate::layout::Field;
        use smart_core::{Runtime, RuntimeConfig};
        let b = smart_testkit::backends::embedded(1);
        let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut t, _) = ShermanBt::open_or_create(&ctx, "lease").await.unwrap();
            let (_, leaf) = t.root().await.unwrap();
            let mut before = vec![0u8; t.f.page];
            ctx.read(leaf, &mut before).await.unwrap();
            for taken_over in [true, false] {
                let mut op = ctx.op().await;
                let held = t.lock_read(leaf, &mut op).await.unwrap();
                // Held for half a lease, as by a client that stalled.
                ctx.sleep_ns(LOCK_LEASE.as_nanos() as u64 / 2).await;
                if taken_over {
                    // A waiter's takeover: a CAS from the holder's word.
                    assert_eq!(ctx.cas(held.word, held.tag, 0xdead_beef).await.unwrap(), held.tag);
                }
                t.page.set_leaf(0, &7u64.to_be_bytes(), &Field::inline(&7u64.to_le_bytes()));
                let r = t.unlock(held, true).await;
                let mut after = vec![0u8; t.f.page];
                ctx.read(leaf, &mut after).await.unwrap();
                let word = ctx.read_u64(held.word).await.unwrap();
                if taken_over {
                    assert!(matches!(r, Err(ShermanError::LeaseLost(p)) if p == leaf), "{r:?}");
                    assert_eq!(after, before, "a page was written under a lost lock");
                    assert_eq!(word, 0xdead_beef, "the new holder's word was touched");
                    assert_eq!(t.local.borrow().stats.lease_losses, 1);
                    ctx.write(held.word, &0u64.to_le_bytes()).await.unwrap();
                } else {
                    r.unwrap();
                    assert_ne!(after, before, "the renewed lock's page was written");
                    assert_eq!(word, 0, "released");
                }
            }
        });
    }

    #[test]
    fn a_handover_planned_for_a_dropped_waiter_is_reported() {
        let mut l = LocalLocks::default();
        l.ticket(1);
        l.ticket(1);
        assert!(!l.plan_release(1, 7, 0), "one waiter: hand over");
        // The waiter gives up before its turn.
        l.queues.get_mut(&1).unwrap().abandoned.push(1);
        assert!(l.finish_release(1), "nobody to take the global lock");
        assert!(l.queues.is_empty());
    }
}
