//! KV blocks: fresh or recycled after the grace period (see the crate docs
//! on reuse and ABA).
//!
//! The recycler is on every update's path, so it does no hashing and reads
//! no clock of its own: queues are indexed by blade and block size (in
//! 64-byte lines), and the caller passes the operation's one timestamp
//! (the runtime's cycle-counter clock, [`Ctx::now_ns`](smart_core::Ctx::now_ns)).

use std::collections::VecDeque;

use smart_core::GlobalAddr;

use crate::layout::{self, Slot};
use crate::{RaceHt, Result};

/// Blocks retired by this thread, reusable after the grace period: one
/// FIFO per (blade, block lines), oldest first, each entry stamped with its
/// retirement time in ns of the runtime clock.
#[derive(Debug, Default)]
pub(crate) struct Recycler {
    queues: Vec<Vec<VecDeque<(u64, GlobalAddr)>>>,
}

impl Recycler {
    fn queue(&mut self, blade: u16, lines: usize) -> &mut VecDeque<(u64, GlobalAddr)> {
        let b = usize::from(blade);
        if self.queues.len() <= b {
            self.queues.resize_with(b + 1, Vec::new);
        }
        let per = &mut self.queues[b];
        if per.len() <= lines {
            per.resize_with(lines + 1, VecDeque::new);
        }
        &mut per[lines]
    }

    /// The oldest block of `lines` lines on `blade` retired at least
    /// `grace_ns` before `now`.
    fn take(&mut self, blade: u16, lines: usize, now: u64, grace_ns: u64) -> Option<GlobalAddr> {
        let q = self.queues.get_mut(usize::from(blade))?.get_mut(lines)?;
        match q.front() {
            Some(&(t, a)) if now.saturating_sub(t) >= grace_ns => {
                q.pop_front();
                Some(a)
            }
            _ => None,
        }
    }
}

impl RaceHt {
    /// A fresh (or recycled) block for `key`/`value` on `blade`, encoded in
    /// `self.block`; returns its slot word. `now` is the operation's
    /// timestamp ([`Ctx::now_ns`](smart_core::Ctx::now_ns)).
    pub(crate) async fn new_block(
        &mut self,
        key: &[u8],
        value: &[u8],
        fp: u8,
        blade: u16,
        now: u64,
    ) -> Result<(GlobalAddr, Slot)> {
        layout::encode_block(key, value, &mut self.block);
        let len = self.block.len();
        let grace_ns = self.grace.as_nanos() as u64;
        let reuse = self.recycler.borrow_mut().take(blade, len / 64, now, grace_ns);
        let at = match reuse {
            Some(a) => a,
            None => self.ctx.alloc(blade, len as u64, 64).await?,
        };
        Ok((at, Slot::new(fp, (len / 64) as u64, at)))
    }

    /// Queues the block `s` names for reuse after the grace period, counted
    /// from `now`.
    pub(crate) fn retire(&self, s: Slot, now: u64) {
        self.recycler.borrow_mut().queue(s.addr().blade(), s.block_len() / 64).push_back((now, s.addr()));
    }
}
