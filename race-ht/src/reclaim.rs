//! KV blocks, subtables and directories come from and go back to the
//! thread's [`Reclaimer`](smart_core::reclaim::Reclaimer): retired objects
//! are reused, by this thread or any client of any process, once no
//! operation can still reach them (epoch-based reclamation; see the crate
//! docs).

use smart_core::reclaim::{Pin, Reclaimer};
use smart_core::GlobalAddr;

use crate::directory::word;
use crate::layout::{self, Slot, SPLITS_WORD};
use crate::{RaceHt, Result};

impl RaceHt {
    /// A fresh (or reused) block for `key`/`value` on `blade`, encoded in
    /// `self.block`; returns its slot word.
    pub(crate) async fn new_block(
        &mut self,
        key: &[u8],
        value: &[u8],
        fp: u8,
        blade: u16,
    ) -> Result<(GlobalAddr, Slot)> {
        layout::encode_block(key, value, &mut self.block);
        let len = self.block.len();
        let at = self.reclaim.alloc(&self.ctx, blade, len as u64).await?;
        Ok((at, Slot::new(fp, (len / 64) as u64, at)))
    }

    /// Retires the block `s` names: reused once no operation can reach it.
    pub(crate) fn retire(&self, s: Slot) {
        self.reclaim.retire(s.addr(), s.block_len() as u64);
    }

    /// Starts an operation: pins the epoch, and makes sure the cached
    /// directory was checked in this epoch, since the subtables it names
    /// are references kept between operations: one READ of the split
    /// counter (the directory changes only before the counter moves); a
    /// changed counter reloads the directory. A thread that lapsed (taken
    /// for dead) drops its speculation cache and reloads.
    pub(crate) async fn begin(&mut self) -> Result<Pin> {
        let pin = Reclaimer::pin(&self.reclaim, &self.ctx).await?;
        let lapses = self.reclaim.lapses();
        let (checked, seen, counter) = {
            let d = self.dir.borrow();
            (d.checked, d.lapses, d.epoch)
        };
        if seen != lapses {
            if let Some(spec) = &self.spec {
                spec.borrow_mut().clear();
            }
            self.reload_dir().await?;
            let mut d = self.dir.borrow_mut();
            d.lapses = lapses;
            d.checked = pin.epoch();
        } else if checked < pin.epoch() {
            // The header up to the split counter: the magic says whether
            // the table was dropped.
            let mut head = [0u8; SPLITS_WORD as usize + 8];
            self.ctx.read(self.table, &mut head).await?;
            crate::drop::check_magic(word(&head, 0), self.table)?;
            if word(&head, SPLITS_WORD as usize) != counter {
                self.reload_dir().await?;
            }
            let mut d = self.dir.borrow_mut();
            d.checked = d.checked.max(pin.epoch());
        }
        Ok(pin)
    }

    /// Hands what this thread holds for reuse to the blades and leaves the
    /// epoch registry: call it when the thread is done with the table (a
    /// thread that never does holds back reuse for
    /// [`LEASE`](smart_core::reclaim::LEASE) and loses its unflushed blocks).
    ///
    /// # Errors
    /// Verb errors.
    pub async fn close(&self) -> Result<()> {
        Ok(self.reclaim.flush(&self.ctx).await?)
    }

    /// Runs one try of an operation, `once`, again while its thread lapsed
    /// during the try ([`Reclaimer::lapsed_since`]: it may have read memory
    /// reused while the thread was taken for dead); counts each restart.
    /// With `success_stands` (writes), a try that succeeded is kept
    /// whatever happened: each change it made was a CAS from a word it read.
    pub(crate) async fn unlapsed<T>(
        &mut self,
        success_stands: bool,
        mut once: impl AsyncFnMut(&mut Self) -> Result<T>,
    ) -> Result<T> {
        loop {
            let mark = self.reclaim.lapses();
            let r = once(self).await;
            if (success_stands && r.is_ok()) || !self.reclaim.lapsed_since(&self.ctx, mark).await? {
                return r;
            }
            self.bump(|s| s.lapse_retries += 1);
        }
    }

    /// What this thread's reclaimer did so far.
    pub fn reclaim_stats(&self) -> smart_core::reclaim::ReclaimStats {
        self.reclaim.stats()
    }
}
