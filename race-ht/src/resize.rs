//! Online resizing: splitting a full subtable under the resize lock
//! (freeze, rehash into two halves, publish), and directory doubling.

use std::collections::HashSet;
use std::time::Instant;

use smart_core::runtime::MAX_BATCH;
use smart_core::GlobalAddr;

use crate::config::TORN_RETRIES;
use crate::directory::{blade_of, empty_subtable, slots_of, Place};
use crate::layout::{self, Slot};
use crate::{RaceError, RaceHt, Result};

/// What one thread saw and did of resizing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResizeStats {
    /// Subtables this thread split.
    pub splits: u64,
    /// Directory doublings this thread did.
    pub doublings: u64,
    /// Times this thread re-read the directory.
    pub refreshes: u64,
    /// Operations that met a frozen subtable (being split, or split already
    /// and seen through a stale cache) and started over.
    pub waits: u64,
    /// Nanoseconds this thread spent splitting.
    pub split_ns: u64,
}

impl RaceHt {
    /// Splits the subtable of `p` (whose two buckets are full) under the
    /// table's resize lock. Returns `false`, having done nothing, if
    /// another client holds the lock.
    pub(crate) async fn grow(&mut self, p: &Place) -> Result<bool> {
        let lock = self.table.add(layout::LOCK_WORD);
        if self.ctx.cas(lock, 0, self.token).await? != 0 {
            return Ok(false);
        }
        let t0 = Instant::now();
        let split = self.split_locked(p).await;
        // Released even after an error: an error before the freeze leaves
        // the table whole (after it, see the crate docs).
        let released = self.ctx.cas(lock, self.token, 0).await;
        self.bump(|s| s.split_ns += t0.elapsed().as_nanos() as u64);
        split?;
        if released? != self.token {
            return Err(RaceError::Corrupt("the resize lock changed hands while this client held it".into()));
        }
        Ok(true)
    }

    /// The split itself (see the crate docs), with the resize lock held.
    pub(crate) async fn split_locked(&mut self, p: &Place) -> Result<()> {
        // Under the lock nobody else changes the directory: this copy is
        // current, and the split may already have been done.
        self.reload_dir().await?;
        let (gd, groups, array, ld, base) = {
            let d = self.dir.borrow();
            let (ld, base) = d.entries[layout::suffix(p.h1, d.depth) as usize];
            (d.depth, d.groups, d.array, ld, base)
        };
        if base != p.base {
            return Ok(());
        }
        if ld >= layout::MAX_DEPTH {
            return Err(RaceError::Full);
        }
        let ctx = self.ctx.clone();
        let s = layout::suffix(p.h1, ld);
        let img = self.freeze(base, groups).await?;

        // Every occupied slot, in address order, and its block.
        let occupied: Vec<(usize, Slot)> =
            slots_of(&img).map(|(off, sl)| (off, sl.thawed())).filter(|(_, sl)| !sl.is_empty()).collect();
        let blocks = self.read_blocks(base.blade(), &occupied).await?;

        // The two halves keep each entry's slot position.
        let suffixes = [s, s | 1 << ld];
        let mut halves = suffixes.map(|x| empty_subtable(groups, ld + 1, x));
        let mut addrs = [GlobalAddr::NULL; 2];
        for (a, x) in addrs.iter_mut().zip(suffixes) {
            *a = ctx.alloc(blade_of(x, ctx.blades().len()), layout::subtable_bytes(groups), 64).await?;
        }
        let mut kept: HashSet<&[u8]> = HashSet::new();
        let mut copies = Vec::new();
        for (&(off, sl), blk) in occupied.iter().zip(&blocks) {
            let (k, _) = layout::decode_block(blk).expect("read_blocks returns whole blocks");
            let h1 = layout::hashes(k).0;
            if layout::suffix(h1, ld) != s {
                return Err(RaceError::Corrupt(format!(
                    "a key of suffix {:#x} in subtable {base} of suffix {s:#x}",
                    layout::suffix(h1, ld)
                )));
            }
            if !kept.insert(k) {
                // A duplicate left by racing inserts: the lowest slot (seen
                // first) survives.
                self.retire(sl, self.ctx.now_ns());
                continue;
            }
            let half = ((h1 >> ld) & 1) as usize;
            let mut w = sl;
            if sl.addr().blade() != addrs[half].blade() {
                // Blocks live on their subtable's blade (one batch reads a
                // bucket's blocks): copy it over.
                let at = ctx.alloc(addrs[half].blade(), blk.len() as u64, 64).await?;
                copies.push((at, &blk[..]));
                w = Slot::new(sl.fp(), (blk.len() / 64) as u64, at);
                self.retire(sl, self.ctx.now_ns());
            }
            halves[half][off..off + 8].copy_from_slice(&w.0.to_le_bytes());
        }
        ctx.write_many(&copies).await?;
        for (a, h) in addrs.iter().zip(&halves) {
            ctx.write_all(*a, h).await?;
        }

        // Publish.
        let entry = |i: u64| layout::pack_entry(ld + 1, addrs[((i >> ld) & 1) as usize]).to_le_bytes();
        if ld == gd {
            let n = 1u64 << gd;
            let mut raw = Vec::with_capacity(16 * n as usize);
            {
                let d = self.dir.borrow();
                for i in 0..2 * n {
                    if layout::suffix(i, ld) == s {
                        raw.extend_from_slice(&entry(i));
                    } else {
                        let (l, a) = d.entries[(i % n) as usize];
                        raw.extend_from_slice(&layout::pack_entry(l, a).to_le_bytes());
                    }
                }
            }
            let doubled = ctx.alloc(0, 16 * n, 64).await?;
            ctx.write_all(doubled, &raw).await?;
            ctx.write(self.table.add(layout::DIR_WORD), &layout::pack_entry(gd + 1, doubled).to_le_bytes()).await?;
            self.bump(|st| st.doublings += 1);
        } else {
            let updates: Vec<(GlobalAddr, [u8; 8])> =
                (s..1 << gd).step_by(1 << ld).map(|i| (array.add(8 * i), entry(i))).collect();
            let updates: Vec<(GlobalAddr, &[u8])> = updates.iter().map(|(a, e)| (*a, &e[..])).collect();
            ctx.write_many(&updates).await?;
        }
        ctx.faa(self.table.add(layout::SPLITS_WORD), 1).await?;
        self.bump(|st| st.splits += 1);
        self.reload_dir().await
    }

    /// Freezes every slot of the subtable at `base` (CAS `w → w | 1`,
    /// retried with the value a failed CAS returns); returns the subtable's
    /// image, all slots frozen.
    pub(crate) async fn freeze(&self, base: GlobalAddr, groups: u64) -> Result<Vec<u8>> {
        let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
        self.ctx.read_all(base, &mut img).await?;
        let mut pending: Vec<(usize, u64)> =
            slots_of(&img).filter(|(_, sl)| !sl.is_frozen()).map(|(off, sl)| (off, sl.0)).collect();
        while !pending.is_empty() {
            let mut again = Vec::new();
            for chunk in pending.chunks(MAX_BATCH) {
                let mut b = self.ctx.batch();
                let refs: Vec<_> =
                    chunk.iter().map(|&(off, w)| b.cas(base.add(off as u64), w, w | Slot::FROZEN)).collect();
                let done = b.post().await?;
                for (r, &(off, w)) in refs.into_iter().zip(chunk) {
                    let old = done.old(r);
                    if old == w {
                        img[off..off + 8].copy_from_slice(&(w | Slot::FROZEN).to_le_bytes());
                    } else if Slot(old).is_frozen() {
                        img[off..off + 8].copy_from_slice(&old.to_le_bytes());
                    } else {
                        again.push((off, old));
                    }
                }
            }
            pending = again;
        }
        Ok(img)
    }

    /// READs the blocks the `slots` name (all on `blade`), in batches; each
    /// must decode (a published block is immutable), re-read a bounded
    /// number of times.
    pub(crate) async fn read_blocks(&self, blade: u16, slots: &[(usize, Slot)]) -> Result<Vec<Vec<u8>>> {
        if let Some((_, s)) = slots.iter().find(|(_, s)| s.addr().blade() != blade) {
            return Err(RaceError::Corrupt(format!("a slot on blade {blade} names a block at {}", s.addr())));
        }
        let room = self.ctx.config().slot_bytes;
        let mut out = vec![Vec::new(); slots.len()];
        let mut pending: Vec<usize> = (0..slots.len()).collect();
        for _ in 0..TORN_RETRIES {
            let mut torn = Vec::new();
            let mut i = 0;
            while i < pending.len() {
                let mut b = self.ctx.batch();
                let (mut refs, mut bytes) = (Vec::new(), 0);
                while i < pending.len() && refs.len() < MAX_BATCH && bytes + slots[pending[i]].1.block_len() <= room {
                    let s = slots[pending[i]].1;
                    refs.push((pending[i], b.read(s.addr(), s.block_len())));
                    bytes += s.block_len();
                    i += 1;
                }
                let done = b.post().await?;
                for (j, r) in refs {
                    let data = done.bytes(r);
                    if layout::decode_block(data).is_some() {
                        out[j] = data.to_vec();
                    } else {
                        torn.push(j);
                    }
                }
            }
            pending = torn;
            if pending.is_empty() {
                return Ok(out);
            }
        }
        Err(RaceError::Torn(slots[pending[0]].1.addr()))
    }
}
