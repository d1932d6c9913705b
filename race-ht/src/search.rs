//! Search: READ both combined buckets in one doorbell, then the KV blocks
//! whose fingerprint matches in one more (2 round trips).

use smart_core::GlobalAddr;

use crate::config::{READ_CHUNK, TORN_RETRIES};
use crate::directory::{word, Place, Wait};
use crate::layout::{self, Slot, COMBINED, SLOTS};
use crate::{RaceError, RaceHt, Result};

/// Up to 28 (slot address, slot) pairs, without allocation.
#[derive(Clone, Copy)]
pub(crate) struct Matches {
    pub(crate) items: [(GlobalAddr, Slot); 4 * SLOTS],
    pub(crate) n: usize,
}

impl Default for Matches {
    fn default() -> Self {
        Matches { items: [(GlobalAddr::NULL, Slot::EMPTY); 4 * SLOTS], n: 0 }
    }
}

impl Matches {
    pub(crate) fn push(&mut self, at: GlobalAddr, s: Slot) {
        self.items[self.n] = (at, s);
        self.n += 1;
    }

    pub(crate) fn first(&self) -> Option<&(GlobalAddr, Slot)> {
        self.items[..self.n].first()
    }

    pub(crate) fn rest(&self) -> &[(GlobalAddr, Slot)] {
        &self.items[1.min(self.n)..self.n]
    }
}

/// The 28 slots of two combined buckets, with their addresses.
pub(crate) struct Snapshot {
    pub(crate) slots: [(GlobalAddr, Slot); 4 * SLOTS],
}

impl RaceHt {
    /// One doorbell: optionally WRITE a block, then READ both combined
    /// buckets. Checks the bucket headers. `None` if a slot is frozen: the
    /// subtable is being split or was split, and the read is void.
    pub(crate) async fn read_buckets(&self, p: &Place, write: Option<(GlobalAddr, &[u8])>) -> Result<Option<Snapshot>> {
        let mut b = self.ctx.batch();
        if let Some((at, data)) = write {
            b.write(at, data);
        }
        let r0 = b.read(p.buckets[0], COMBINED);
        let r1 = b.read(p.buckets[1], COMBINED);
        let done = b.post().await?;
        let mut slots = [(GlobalAddr::NULL, Slot::EMPTY); 4 * SLOTS];
        let want = layout::bucket_header(p.depth, p.suffix);
        let mut frozen = false;
        for (k, (r, base)) in [(r0, p.buckets[0]), (r1, p.buckets[1])].into_iter().enumerate() {
            let bytes = done.bytes(r);
            for bucket in 0..2 {
                let header = word(bytes, bucket * 64);
                if header != want {
                    return Err(RaceError::Corrupt(format!(
                        "bucket header {header:#x} at {}, expected {want:#x}",
                        base.add(64 * bucket as u64)
                    )));
                }
                for s in 0..SLOTS {
                    let off = bucket * 64 + 8 + s * 8;
                    let v = Slot(word(bytes, off));
                    frozen |= v.is_frozen();
                    slots[(k * 2 + bucket) * SLOTS + s] = (base.add(off as u64), v);
                }
            }
        }
        Ok((!frozen).then_some(Snapshot { slots }))
    }

    /// Reads the blocks of fingerprint-matching slots; returns the matches of
    /// `key` sorted by slot address (the first is the survivor), and leaves
    /// the survivor's value in `value` when one is asked for (copied once,
    /// straight from the completed READ). Fixed-size arrays: no
    /// allocation per operation.
    pub(crate) async fn matches(
        &self,
        key: &[u8],
        fp: u8,
        snap: &Snapshot,
        mut value: Option<&mut Vec<u8>>,
    ) -> Result<Matches> {
        let mut cands = Matches::default();
        for &(at, s) in &snap.slots {
            if !s.is_empty() && s.fp() == fp && !cands.items[..cands.n].iter().any(|(a, _)| *a == at) {
                cands.push(at, s);
            }
        }
        cands.items[..cands.n].sort_unstable_by_key(|(a, _)| *a);
        let mut out = Matches::default();
        // The value kept is the lowest-address match's (the survivor's),
        // whatever order the blocks decode in.
        let mut found_at: Option<GlobalAddr> = None;
        let mut start = 0;
        let room = self.ctx.config().slot_bytes;
        while start < cands.n {
            // Up to READ_CHUNK blocks, and no more bytes than a batch holds.
            let mut end = start + 1;
            let mut bytes = cands.items[start].1.block_len();
            while end < cands.n && end - start < READ_CHUNK && bytes + cands.items[end].1.block_len() <= room {
                bytes += cands.items[end].1.block_len();
                end += 1;
            }
            let mut pending = Matches::default();
            for &(a, s) in &cands.items[start..end] {
                pending.push(a, s);
            }
            start = end;
            for _ in 0..TORN_RETRIES {
                if pending.n == 0 {
                    break;
                }
                let mut torn = Matches::default();
                // Blocks live on their bucket's blade (allocated and
                // recycled there), so one batch reads them all.
                let blade = pending.items[0].1.addr().blade();
                let mut b = self.ctx.batch();
                let mut refs = [None; READ_CHUNK];
                for (r, &(at, s)) in refs.iter_mut().zip(&pending.items[..pending.n]) {
                    if s.addr().blade() != blade || at.blade() != blade {
                        return Err(RaceError::Corrupt(format!(
                            "slot at {at} names a block on another blade: {}",
                            s.addr()
                        )));
                    }
                    *r = Some(b.read(s.addr(), s.block_len()));
                }
                let done = b.post().await?;
                for (r, &(at, s)) in refs.iter().zip(&pending.items[..pending.n]) {
                    match layout::decode_block(done.bytes(r.expect("every pending block was read"))) {
                        Some((k, v)) if k == key => {
                            if found_at.is_none_or(|f| at < f) {
                                if let Some(out) = value.as_deref_mut() {
                                    out.clear();
                                    out.extend_from_slice(v);
                                }
                                found_at = Some(at);
                            }
                            out.push(at, s);
                        }
                        Some(_) => {}
                        None => torn.push(at, s),
                    }
                }
                pending = torn;
            }
            if pending.n > 0 {
                return Err(RaceError::Torn(pending.items[0].1.addr()));
            }
        }
        out.items[..out.n].sort_unstable_by_key(|(a, _)| *a);
        Ok(out)
    }

    /// Looks `key` up; its value goes to `out`. Returns whether it exists.
    /// If the thread lapsed while the lookup ran (stalled for longer than
    /// the reclamation lease, so another client may have reused memory it
    /// read), the lookup starts over.
    ///
    /// # Errors
    /// Verb errors; [`RaceError::Torn`] if a block never reads whole.
    pub async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.unlapsed(false, async |ht| ht.get_once(key, out).await).await
    }

    async fn get_once(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let _pin = self.begin().await?;
        let mut p = self.place(key);
        if self.speculate(p.h1, key, out).await? {
            return Ok(true);
        }
        let mut wait = Wait::default();
        let snap = loop {
            match self.read_buckets(&p, None).await? {
                Some(s) => break s,
                None => {
                    self.settle(&p, &mut wait).await?;
                    p = self.place(key);
                }
            }
        };
        let m = self.matches(key, p.fp, &snap, Some(out)).await?;
        let Some(&(at, s)) = m.first() else {
            self.remember(p.h1, None);
            return Ok(false);
        };
        self.remember(p.h1, Some((at, s)));
        Ok(true)
    }
}
