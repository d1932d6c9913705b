//! Writes: insert, upsert, update (one loop: WRITE the new block with the
//! bucket READs, then CAS it in) and delete; duplicate removal after an
//! insert.

use smart_core::runtime::OpGuard;
use smart_core::GlobalAddr;

use crate::directory::{Place, Wait};
use crate::layout::{self, Slot, SLOTS};
use crate::spec::SpecUpdate;
use crate::{RaceError, RaceHt, Result};

/// What [`RaceHt::put`] does with a present or absent key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Only if absent.
    Insert,
    /// Either way.
    Upsert,
    /// Only if present.
    Update,
}

impl RaceHt {
    /// Most key + value bytes one entry can have with local slots of
    /// `slot_bytes` (the runtime's [`RuntimeConfig::slot_bytes`](smart_core::RuntimeConfig::slot_bytes)):
    /// the block (header, key, value, CRC, in 64-byte units) must fit the
    /// slot word's 8-bit length (at most 255 units) and, with the two
    /// bucket READs it is written with, one batch.
    pub fn max_kv_bytes(slot_bytes: usize) -> usize {
        let by_layout = 255 * 64;
        let by_batch = slot_bytes.saturating_sub(2 * layout::COMBINED) / 64 * 64;
        by_layout.min(by_batch).saturating_sub(layout::KV_HEADER + 4)
    }

    /// Inserts `key` if absent. Returns `false` (and changes nothing) if it
    /// exists. With a racing insert of the same key, one value survives.
    /// Splits the key's subtable when its buckets are full.
    ///
    /// # Errors
    /// [`RaceError::Full`] at the largest depth; verb errors.
    pub async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.put(key, value, Mode::Insert).await
    }

    /// Inserts or overwrites `key`.
    ///
    /// # Errors
    /// As [`RaceHt::insert`].
    pub async fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put(key, value, Mode::Upsert).await.map(drop)
    }

    /// Insert, upsert and update share one loop: WRITE the new block with
    /// the bucket READs, then CAS it in over the key's slot (if the mode
    /// overwrites) or into an empty slot (if the mode inserts). Returns
    /// whether the table changed.
    ///
    /// A failure while the thread lapsed (see [`RaceHt::get`]) starts the
    /// operation over; if its insert had landed, only the duplicate check
    /// is redone. A success stands: every change it made was a CAS from
    /// the slot word it read.
    pub(crate) async fn put(&mut self, key: &[u8], value: &[u8], mode: Mode) -> Result<bool> {
        let max = Self::max_kv_bytes(self.ctx.config().slot_bytes);
        if key.len() + value.len() > max {
            return Err(RaceError::TooLarge { key: key.len(), value: value.len(), max });
        }
        let mut landed = false;
        self.unlapsed(true, async |ht| {
            if landed {
                ht.recheck_duplicates(key).await.map(|()| true)
            } else {
                ht.put_once(key, value, mode, &mut landed).await
            }
        })
        .await
    }

    /// The duplicate check of an insert that landed, on its own.
    async fn recheck_duplicates(&mut self, key: &[u8]) -> Result<()> {
        let _pin = self.begin().await?;
        let mut p = self.place(key);
        self.remove_duplicates(key, &mut p).await
    }

    /// One try of [`RaceHt::put`]; `landed` is set once an insert's CAS
    /// landed.
    async fn put_once(&mut self, key: &[u8], value: &[u8], mode: Mode, landed: &mut bool) -> Result<bool> {
        let _pin = self.begin().await?;
        let mut p = self.place(key);
        let (mut at, mut new) = self.new_block(key, value, p.fp, p.base.blade()).await?;
        let ctx = self.ctx.clone();
        let mut op = ctx.op_on(p.h1).await;
        let mut block = std::mem::take(&mut self.block);
        let mut written = false;
        let mut wait = Wait::default();
        if mode != Mode::Insert && at.blade() == p.base.blade() && self.spec.is_some() {
            match self.spec_update(p.h1, key, (at, new), &block, &mut op).await {
                Ok(SpecUpdate::NotTried) => {}
                Ok(SpecUpdate::Missed) => written = true,
                Ok(SpecUpdate::Done { old }) => {
                    self.retire(old);
                    self.block = block;
                    return Ok(true);
                }
                Err(e) => {
                    self.block = block;
                    return Err(e);
                }
            }
        }
        let result = loop {
            if at.blade() != p.base.blade() {
                // A split moved the key's subtable to another blade: the
                // block (not published yet) goes there too.
                self.retire(new);
                self.block = block;
                (at, new) = self.new_block(key, value, p.fp, p.base.blade()).await?;
                block = std::mem::take(&mut self.block);
                written = false;
            }
            let snap = self.read_buckets(&p, (!written).then_some((at, &block[..]))).await?;
            written = true;
            let Some(snap) = snap else {
                self.settle(&p, &mut wait).await?;
                p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap, None).await?;
            if let Some(&(slot_at, old)) = m.first() {
                if mode == Mode::Insert {
                    self.retire(new);
                    break false;
                }
                if self.commit_update(&mut op, p.h1, slot_at, old, new).await? {
                    self.retire(old);
                    break true;
                }
                op.retry().await;
                continue;
            }
            if mode == Mode::Update {
                self.retire(new);
                break false;
            }
            // Less-loaded choice first; an empty slot in it.
            let empty =
                |k: usize| snap.slots[k * 2 * SLOTS..(k + 1) * 2 * SLOTS].iter().filter(|(_, s)| s.is_empty()).count();
            let order = if empty(1) > empty(0) { [1, 0] } else { [0, 1] };
            let Some(&(slot_at, _)) = order
                .iter()
                .flat_map(|&k| snap.slots[k * 2 * SLOTS..(k + 1) * 2 * SLOTS].iter())
                .find(|(_, s)| s.is_empty())
            else {
                // Both buckets full: split the subtable, or wait for the
                // client that holds its split lock.
                if !self.grow(&p).await? {
                    self.settle(&p, &mut wait).await?;
                }
                p = self.place(key);
                continue;
            };
            if op.commit(ctx.cas(slot_at, 0, new.0)).await? != 0 {
                op.retry().await;
                continue;
            }
            *landed = true;
            self.remove_duplicates(key, &mut p).await?;
            break true;
        };
        self.block = block;
        Ok(result)
    }

    /// CASes the key's slot at `at` from `old` to `new` as `op`'s commit;
    /// returns whether it did, and remembers the new word for speculative
    /// lookups if so.
    ///
    /// Where `op` holds the key's gate, the key's next operation on this
    /// thread may start as soon as the CAS is posted (see
    /// `OpGuard::commit`), so the new word is remembered before: a
    /// speculative lookup checks what it finds, and a CAS that fails
    /// forgets the key again. Without the gate, siblings race for the key
    /// anyway, and a word remembered before its CAS won would send them to
    /// blocks that never become the key's: it is remembered after.
    pub(crate) async fn commit_update(
        &self,
        op: &mut OpGuard<'_>,
        h: u64,
        at: GlobalAddr,
        old: Slot,
        new: Slot,
    ) -> Result<bool> {
        let early = op.gated();
        if early {
            self.remember(h, Some((at, new)));
        }
        let won = op.commit(self.ctx.cas(at, old.0, new.0)).await? == old.0;
        match (early, won) {
            (false, true) => self.remember(h, Some((at, new))),
            (true, false) => self.remember(h, None),
            _ => {}
        }
        Ok(won)
    }

    /// After an insert's CAS: re-read the key's buckets and empty every
    /// slot holding the key but the lowest (the survivor all clients keep).
    /// If the subtable is being split, the split drops duplicates itself,
    /// and the check runs again in the new subtable.
    pub(crate) async fn remove_duplicates(&mut self, key: &[u8], p: &mut Place) -> Result<()> {
        let mut wait = Wait::default();
        loop {
            let Some(snap) = self.read_buckets(p, None).await? else {
                self.settle(p, &mut wait).await?;
                *p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap, None).await?;
            for &(dup_at, dup) in m.rest() {
                if self.ctx.cas(dup_at, dup.0, 0).await? == dup.0 {
                    self.retire(dup);
                }
            }
            return Ok(());
        }
    }

    /// Overwrites `key` if it exists; returns whether it did.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.put(key, value, Mode::Update).await
    }

    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// Verb errors.
    ///
    /// A failure while the thread lapsed starts it over, as for
    /// [`RaceHt::insert`].
    pub async fn delete(&mut self, key: &[u8]) -> Result<bool> {
        self.unlapsed(true, async |ht| ht.delete_once(key).await).await
    }

    async fn delete_once(&mut self, key: &[u8]) -> Result<bool> {
        let _pin = self.begin().await?;
        let mut p = self.place(key);
        let ctx = self.ctx.clone();
        let mut op = ctx.op_on(p.h1).await;
        let mut wait = Wait::default();
        loop {
            let Some(snap) = self.read_buckets(&p, None).await? else {
                self.settle(&p, &mut wait).await?;
                p = self.place(key);
                continue;
            };
            let m = self.matches(key, p.fp, &snap, None).await?;
            let Some(&(slot_at, old)) = m.first() else {
                return Ok(false);
            };
            self.remember(p.h1, None);
            if op.commit(ctx.cas(slot_at, old.0, 0)).await? == old.0 {
                self.retire(old);
                return Ok(true);
            }
            op.retry().await;
        }
    }
}
