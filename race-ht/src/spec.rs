//! Speculative search (Smart's `spec-lookup`): a per-thread cache of where
//! keys were last found, so a lookup takes one doorbell when it hits.

use smart_core::runtime::{Batch, Done, OpGuard, ReadRef};
use smart_core::GlobalAddr;

use crate::layout::{self, Slot};
use crate::{RaceHt, Result};

/// Entries of the speculative-lookup cache (per thread, direct-mapped).
pub const SPEC_ENTRIES: usize = 8192;

/// Where keys were last found, for the speculative search path: per thread,
/// direct-mapped by hash, so bounded and allocation-free after creation.
#[derive(Debug)]
pub(crate) struct SpecCache {
    /// (key hash, slot address, slot word); hash 0 = empty entry.
    pub(crate) entries: Vec<(u64, GlobalAddr, Slot)>,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl SpecCache {
    pub(crate) fn new() -> Self {
        SpecCache { entries: vec![(0, GlobalAddr::NULL, Slot::EMPTY); SPEC_ENTRIES], hits: 0, misses: 0 }
    }

    pub(crate) fn lookup(&self, h: u64) -> Option<(GlobalAddr, Slot)> {
        let e = self.entries[h as usize % SPEC_ENTRIES];
        (e.0 == h && h != 0).then_some((e.1, e.2))
    }

    pub(crate) fn put(&mut self, h: u64, at: GlobalAddr, s: Slot) {
        self.entries[h as usize % SPEC_ENTRIES] = (h, at, s);
    }

    pub(crate) fn clear(&mut self) {
        self.entries.iter_mut().for_each(|e| e.0 = 0);
    }

    pub(crate) fn forget(&mut self, h: u64) {
        let e = &mut self.entries[h as usize % SPEC_ENTRIES];
        if e.0 == h {
            e.0 = 0;
        }
    }
}

/// What [`RaceHt::spec_update`] did.
#[derive(Debug)]
pub(crate) enum SpecUpdate {
    /// Nothing known about the key: nothing posted.
    NotTried,
    /// The new block is written, but the remembered slot no longer names
    /// the key's block: the normal path must run (without writing again).
    Missed,
    /// The remembered slot went from `old` to the new block (and is
    /// remembered so).
    Done { old: Slot },
}

/// Adds the READs of the remembered slot at `at` and of the block its word
/// `s` names (in this order: one QP executes them in order).
fn read_remembered(b: &mut Batch<'_>, at: GlobalAddr, s: Slot) -> (ReadRef, ReadRef) {
    (b.read(at, 8), b.read(s.addr(), s.block_len()))
}

/// The value of `key` if those READs show the slot still holding `s` and
/// the block decoding to `key`.
fn still_named<'d>(done: &'d Done<'_>, (rs, rb): (ReadRef, ReadRef), s: Slot, key: &[u8]) -> Option<&'d [u8]> {
    let word = u64::from_le_bytes(done.bytes(rs).try_into().expect("8 bytes"));
    match layout::decode_block(done.bytes(rb)) {
        Some((k, v)) if word == s.0 && k == key => Some(v),
        _ => None,
    }
}

impl RaceHt {
    /// The speculative search path (Smart's `spec-lookup`): if this thread
    /// knows where `key` was last found, one doorbell READs that slot word
    /// and the block it named. The value is accepted only if the slot still
    /// holds that word and the block decodes to `key`. Why that is the
    /// key's current value: the slot is in the subtable the directory
    /// (checked in this operation's epoch) names for the key, so its memory
    /// is not reused during the operation; the two READs execute in order
    /// (one QP), so the block is read after the slot held its word, while
    /// it was live, and it is not reused before the operation ends.
    /// Otherwise the normal path runs.
    pub(crate) async fn speculate(&mut self, h: u64, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let Some(spec) = &self.spec else { return Ok(false) };
        let Some((at, s)) = self.spec_entry(h) else {
            // Nothing known about the key: the normal path, counted as a
            // miss (so the hit rate is over every lookup, as sherman-bt's).
            spec.borrow_mut().misses += 1;
            return Ok(false);
        };
        let mut b = self.ctx.batch();
        let reads = read_remembered(&mut b, at, s);
        let done = b.post().await?;
        let hit = match still_named(&done, reads, s, key) {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                true
            }
            None => false,
        };
        let mut c = spec.borrow_mut();
        if hit {
            c.hits += 1;
        } else {
            c.misses += 1;
            c.forget(h);
        }
        Ok(hit)
    }

    /// Where this thread last found the key with hash `h`, if that slot
    /// lies in the subtable the directory (checked in this operation's
    /// epoch) names for it.
    fn spec_entry(&self, h: u64) -> Option<(GlobalAddr, Slot)> {
        let cached = self.spec.as_ref()?.borrow().lookup(h);
        cached.filter(|(at, _)| {
            let d = self.dir.borrow();
            let (_, base) = d.entries[layout::suffix(h, d.depth) as usize];
            at.blade() == base.blade()
                && (base.offset()..base.offset() + layout::bucket_bytes(d.groups)).contains(&at.offset())
        })
    }

    /// The speculative update path (with `spec-lookup`): if this thread
    /// knows where `key` was last found, one doorbell WRITEs the new block
    /// `new` (encoded in `block`) and makes [`RaceHt::speculate`]'s two
    /// READs; if they show the slot still naming a block of `key`, a CAS
    /// from the remembered word to `new` replaces it: two round trips
    /// instead of three (bucket READ, key check, CAS). A CAS that succeeds
    /// is the normal path's update, for `speculate`'s reasons: the slot is
    /// in the key's subtable as of this operation's epoch (a split freezes
    /// the slots it moves, so a CAS on a moved slot fails), and the block
    /// was read while the slot named it, so it is not reused before the CAS
    /// (a block retired before this operation began could be: the word is
    /// read again rather than trusted from the cache).
    pub(crate) async fn spec_update(
        &mut self,
        h: u64,
        key: &[u8],
        new: (GlobalAddr, Slot),
        block: &[u8],
        op: &mut OpGuard<'_>,
    ) -> Result<SpecUpdate> {
        let (at, s) = match self.spec_entry(h) {
            Some((at, s)) if s.addr().blade() == new.0.blade() => (at, s),
            _ => return Ok(SpecUpdate::NotTried),
        };
        // The new block and the remembered one must fit one batch's local
        // slot together: with the largest values they do not (each may take
        // almost half of it), and the normal path writes the block alone.
        if block.len() + 8 + s.block_len() > self.ctx.config().slot_bytes {
            return Ok(SpecUpdate::NotTried);
        }
        let mut b = self.ctx.batch();
        b.write(new.0, block);
        let reads = read_remembered(&mut b, at, s);
        let done = b.post().await?;
        let ours = still_named(&done, reads, s, key).is_some();
        drop(done);
        if !ours {
            self.remember(h, None);
            return Ok(SpecUpdate::Missed);
        }
        if self.commit_update(op, h, at, s, new.1).await? {
            return Ok(SpecUpdate::Done { old: s });
        }
        // Another update won the slot: where the key is now is not known.
        self.remember(h, None);
        Ok(SpecUpdate::Missed)
    }

    /// Records where the key with hash `h` is now (or that it is gone).
    pub(crate) fn remember(&self, h: u64, at: Option<(GlobalAddr, Slot)>) {
        if let Some(spec) = &self.spec {
            match at {
                Some((a, s)) => spec.borrow_mut().put(h, a, s),
                None => spec.borrow_mut().forget(h),
            }
        }
    }

    /// Speculative lookups that hit and missed on this thread so far.
    pub fn spec_stats(&self) -> (u64, u64) {
        self.spec.as_ref().map_or((0, 0), |c| {
            let c = c.borrow();
            (c.hits, c.misses)
        })
    }
}

#[cfg(test)]
mod tests {
    use smart_core::smart::SmartConfig;
    use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};

    use crate::{RaceConfig, RaceHt};

    #[test]
    fn a_speculative_update_never_replaces_another_keys_block() {
        let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
        let smart = SmartConfig { spec_lookup: true, ..SmartConfig::default() };
        let mut rt = Runtime::new(&t, 0, RuntimeConfig { smart, ..RuntimeConfig::default() }).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            // One subtable: both keys' slots lie where the directory names.
            let mut ht = RaceHt::create(&ctx, "wrong", RaceConfig { depth: 0, groups: 16 }).await.unwrap();
            let mut out = Vec::new();
            ht.insert(b"a", b"1").await.unwrap();
            ht.insert(b"b", b"2").await.unwrap();
            assert!(ht.get(b"b", &mut out).await.unwrap());
            // The entry for `a` names `b`'s slot and word (as a reused
            // block or a hash collision could): the key check must refuse.
            let (ha, hb) = (ht.place(b"a").h1, ht.place(b"b").h1);
            let spec = ht.spec.clone().unwrap();
            let (at, s) = spec.borrow().lookup(hb).unwrap();
            spec.borrow_mut().put(ha, at, s);
            assert!(ht.update(b"a", b"3").await.unwrap());
            for (k, v) in [(&b"a"[..], &b"3"[..]), (b"b", b"2")] {
                assert!(ht.get(k, &mut out).await.unwrap(), "{k:?} is there");
                assert_eq!(out, v);
            }
        });
    }
}
