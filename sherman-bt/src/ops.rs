//! The operations: lookup (speculative or not), range scan, and the writes
//! with their splits.

use smart_core::runtime::OpGuard;
use smart_core::GlobalAddr;

use crate::layout::{self, Entry, PageBuf, PageRef, ENTRIES, LINE, PER_LINE};
use crate::lock::Held;
use crate::read::with_page;
use crate::{Result, ShermanBt, ShermanError};

/// Restarts from the root before an operation gives up.
const MAX_RESTARTS: u32 = 64;

/// What a write does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Insert,
    Update,
    Upsert,
    Delete,
}

/// What a reader does at a leaf.
enum AtLeaf<T> {
    Here(T),
    /// To the sibling, which starts at the key given (this page's end).
    Right(GlobalAddr, u64),
    Restart,
}

/// Classifies a page reached while looking for `key`'s leaf, moving right
/// from a page that ended at `min_low` (0: reached from above). A page
/// that starts below `min_low` is no right sibling: a link that leads
/// back (damaged, or written by a hostile client) restarts the reader
/// instead of sending it round a cycle.
fn at_leaf<T>(p: PageRef<'_>, key: u64, min_low: u64, here: impl FnOnce(PageRef<'_>) -> T) -> AtLeaf<T> {
    if !p.is_leaf() || p.lowest() > key || p.lowest() < min_low {
        AtLeaf::Restart
    } else if p.is_right_of(key) {
        match (p.sibling(), p.highest()) {
            (Some(s), Some(h)) => AtLeaf::Right(s, h),
            _ => AtLeaf::Restart,
        }
    } else {
        AtLeaf::Here(here(p))
    }
}

impl ShermanBt {
    /// Looks `key` up.
    ///
    /// # Errors
    /// Verb errors; a page torn on every re-read; a tree that contradicts
    /// itself.
    pub async fn get_u64(&mut self, key: u64) -> Result<Option<u64>> {
        let before = self.read.get();
        let r = self.lookup(key).await;
        let mut l = self.local.borrow_mut();
        l.stats.lookups += 1;
        l.stats.lookup_bytes += self.read.get() - before;
        r
    }

    async fn lookup(&mut self, key: u64) -> Result<Option<u64>> {
        if let Some(v) = self.speculate(key).await? {
            return Ok(Some(v));
        }
        let mut at = self.leaf_for(key).await?;
        let (mut restarts, mut min_low) = (0, 0);
        loop {
            let step = with_page(&self.ctx, &self.local, &self.read, at, |p| at_leaf(p, key, min_low, |p| p.find(key)))
                .await?;
            match step {
                AtLeaf::Here(found) => {
                    self.remember(key, found.map(|(i, _)| (at, i)));
                    return Ok(found.map(|(_, v)| v));
                }
                AtLeaf::Right(s, high) => {
                    self.moved_right(key);
                    (at, min_low) = (s, high);
                }
                AtLeaf::Restart => (at, min_low) = (self.restart(key, &mut restarts).await?, 0),
            }
        }
    }

    /// The leaf a stale path led to was not the key's: start from the root.
    async fn restart(&mut self, key: u64, restarts: &mut u32) -> Result<GlobalAddr> {
        *restarts += 1;
        {
            let mut l = self.local.borrow_mut();
            l.stats.restarts += 1;
            l.cache.invalidate(key);
        }
        if *restarts > MAX_RESTARTS {
            return Err(ShermanError::Corrupt(format!("no leaf holds key {key} after {MAX_RESTARTS} descents")));
        }
        self.descend(key, 0).await
    }

    /// A leaf split since the path to it was cached: the next lookup
    /// fetches a fresh level-1 page.
    fn moved_right(&self, key: u64) {
        let mut l = self.local.borrow_mut();
        l.stats.sibling_hops += 1;
        l.cache.invalidate(key);
    }

    /// Records where `key` is (or that it is nowhere) for speculation.
    fn remember(&self, key: u64, at: Option<(GlobalAddr, usize)>) {
        if let Some(spec) = self.local.borrow_mut().spec.as_mut() {
            match at {
                Some((leaf, i)) => spec.put(key, leaf, i),
                None => spec.forget(key),
            }
        }
    }

    /// Smart-BT's speculative lookup: READ the one line where `key` was
    /// last seen; accept it if it passes its check, marks a leaf, and holds
    /// `key` in a valid entry.
    async fn speculate(&mut self, key: u64) -> Result<Option<u64>> {
        let guess = match self.local.borrow_mut().spec.as_mut() {
            Some(s) => s.get(key),
            None => return Ok(None),
        };
        let Some((leaf, i)) = guess else {
            // Nothing known about the key: the normal path (and it counts as
            // a miss, so the hit rate is over every lookup).
            self.local.borrow_mut().stats.spec_misses += 1;
            return Ok(None);
        };
        let line = layout::entry_line(i);
        let mut b = self.ctx.batch();
        let r = b.read(leaf.add((line * LINE) as u64), LINE);
        let done = b.post().await?;
        let bytes = done.bytes(r);
        let hit = match layout::line_seq(bytes, line) {
            Some(seq) if layout::seq_is_leaf(seq) => {
                let e = layout::line_entry(bytes, i % PER_LINE);
                (e.valid && e.key == key).then_some(e.value)
            }
            _ => None,
        };
        drop(done);
        let mut l = self.local.borrow_mut();
        self.count_read(LINE);
        if hit.is_some() {
            l.stats.spec_hits += 1;
        } else {
            l.stats.spec_misses += 1;
            l.stats.spec_stale += 1;
            if let Some(s) = l.spec.as_mut() {
                s.forget(key);
            }
        }
        Ok(hit)
    }

    /// Up to `count` pairs with keys ≥ `start`, in key order, into `out`
    /// (cleared first). See the crate docs for the guarantees.
    ///
    /// # Errors
    /// As [`ShermanBt::get_u64`].
    pub async fn scan_u64(&mut self, start: u64, count: usize, out: &mut Vec<(u64, u64)>) -> Result<()> {
        out.clear();
        if count == 0 {
            return Ok(());
        }
        let mut at = self.leaf_for(start).await?;
        let (mut from, mut first, mut restarts, mut min_low) = (start, true, 0, 0);
        loop {
            let mut buf = [(0u64, 0u64); ENTRIES];
            let mut n = 0;
            let step = with_page(&self.ctx, &self.local, &self.read, at, |p| {
                at_leaf(p, from, min_low, |p| {
                    for (_, e) in p.live() {
                        if e.key >= from {
                            buf[n] = (e.key, e.value);
                            n += 1;
                        }
                    }
                    (p.highest(), p.sibling())
                })
            })
            .await?;
            match step {
                AtLeaf::Here((high, sibling)) => {
                    buf[..n].sort_unstable_by_key(|e| e.0);
                    out.extend(buf[..n].iter().take(count - out.len()));
                    let Some(high) = high else { return Ok(()) };
                    if out.len() >= count {
                        return Ok(());
                    }
                    at = sibling
                        .ok_or_else(|| ShermanError::Corrupt(format!("leaf {at} ends at {high} but has no sibling")))?;
                    (from, min_low) = (high, high);
                    first = false;
                }
                AtLeaf::Right(s, high) => {
                    self.moved_right(from);
                    (at, min_low) = (s, high);
                }
                AtLeaf::Restart if first => (at, min_low) = (self.restart(from, &mut restarts).await?, 0),
                AtLeaf::Restart => {
                    return Err(ShermanError::Corrupt(format!(
                        "the sibling {at} of a leaf ending at {from} does not start there"
                    )))
                }
            }
        }
    }

    /// Inserts, updates, upserts or deletes `key` (see [`Kind`]); returns
    /// whether it changed the tree.
    pub(crate) async fn modify(&mut self, key: u64, value: u64, kind: Kind) -> Result<bool> {
        // A lock lost to a waiter while this client stalled (nothing was
        // written under it): the operation starts over.
        let mut lost = 0;
        loop {
            match self.modify_once(key, value, kind).await {
                Err(ShermanError::LeaseLost(_)) if lost < MAX_RESTARTS => lost += 1,
                r => return r,
            }
        }
    }

    async fn modify_once(&mut self, key: u64, value: u64, kind: Kind) -> Result<bool> {
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        let mut at = self.leaf_for(key).await?;
        let (mut restarts, mut min_low) = (0, 0);
        loop {
            let held = self.lock_read(at, &mut op).await?;
            let step = at_leaf(self.page.view(), key, min_low, |p| {
                let found = p.find(key);
                let free = (0..ENTRIES).find(|&i| !p.entry(i).valid);
                (found, free)
            });
            let (found, free) = match step {
                AtLeaf::Here(x) => x,
                AtLeaf::Right(s, high) => {
                    self.unlock(held, false).await?;
                    self.moved_right(key);
                    (at, min_low) = (s, high);
                    continue;
                }
                AtLeaf::Restart => {
                    self.unlock(held, false).await?;
                    (at, min_low) = (self.restart(key, &mut restarts).await?, 0);
                    continue;
                }
            };
            let live = Entry { key, value, valid: true };
            return match (found, kind) {
                (Some((i, _)), Kind::Insert) => {
                    self.unlock(held, false).await?;
                    self.remember(key, Some((at, i)));
                    Ok(false)
                }
                (None, Kind::Update | Kind::Delete) => {
                    self.unlock(held, false).await?;
                    Ok(false)
                }
                (Some((i, _)), Kind::Update | Kind::Upsert) => {
                    self.page.set_entry(i, live);
                    self.unlock(held, true).await?;
                    self.remember(key, Some((at, i)));
                    Ok(true)
                }
                (Some((i, _)), Kind::Delete) => {
                    self.page.set_entry(i, Entry::default());
                    self.unlock(held, true).await?;
                    self.remember(key, None);
                    Ok(true)
                }
                (None, Kind::Insert | Kind::Upsert) => match free {
                    Some(i) => {
                        self.page.set_entry(i, live);
                        self.unlock(held, true).await?;
                        self.remember(key, Some((at, i)));
                        Ok(true)
                    }
                    None => {
                        self.split_leaf(held, key, value, &mut op).await?;
                        Ok(true)
                    }
                },
            };
        }
    }

    /// Passes `r` through; if it is an error, first releases the lock
    /// `held` (without writing the page).
    async fn or_unlock<T>(&mut self, held: Held, r: Result<T>) -> Result<T> {
        if r.is_err() {
            // The error wins; a failed release is left to the lease.
            let _ = self.unlock(held, false).await;
        }
        r
    }

    /// Writes the new right sibling of a split from `self.split`: a fresh
    /// page, unreachable until the split page is rewritten.
    async fn write_new_page(&mut self) -> Result<GlobalAddr> {
        let at = self.alloc_page().await?;
        let p = self.split.as_mut().expect("a split page is built");
        p.seal(0);
        self.ctx.write(at, &p.0[..]).await?;
        Ok(at)
    }

    /// Splits the full leaf in `self.page` (locked) while inserting `key`:
    /// sorted, the upper half moves to a new right sibling, written before
    /// the leaf that links it; then the separator goes up.
    async fn split_leaf(&mut self, held: Held, key: u64, value: u64, op: &mut OpGuard<'_>) -> Result<()> {
        let p = self.page.view();
        let mut es = [(0u64, 0u64); ENTRIES + 1];
        let mut n = 0;
        for (_, e) in p.live() {
            es[n] = (e.key, e.value);
            n += 1;
        }
        es[n] = (key, value);
        n += 1;
        es[..n].sort_unstable_by_key(|e| e.0);
        let mid = n / 2;
        let sep = es[mid].0;
        let (lowest, high, sibling) = (p.lowest(), p.highest(), p.sibling());
        let mut r = self.split.take().unwrap_or_else(|| PageBuf::new(0, 0, None, None));
        r.reset(0, sep, high, sibling);
        for (j, &(k, v)) in es[mid..n].iter().enumerate() {
            r.set_entry(j, Entry { key: k, value: v, valid: true });
        }
        self.split = Some(r);
        let right = self.write_new_page().await;
        let right = self.or_unlock(held, right).await?;
        self.page.reset(0, lowest, Some(sep), Some(right));
        for (j, &(k, v)) in es[..mid].iter().enumerate() {
            self.page.set_entry(j, Entry { key: k, value: v, valid: true });
        }
        self.page.seal_after(held.seq);
        self.unlock_sealed(held).await?;
        self.local.borrow_mut().stats.leaf_splits += 1;
        let at = if key >= sep {
            (right, es[mid..n].iter().position(|e| e.0 == key))
        } else {
            (held.page, es[..mid].iter().position(|e| e.0 == key))
        };
        self.remember(key, at.1.map(|i| (at.0, i)));
        self.insert_parent(1, sep, right, held.page, op).await
    }

    /// Puts separator `sep` → `child` into the page of `level` covering it
    /// (`left` is the page that split), splitting upward and growing the
    /// root as needed.
    async fn insert_parent(
        &mut self,
        mut level: u8,
        mut sep: u64,
        mut child: GlobalAddr,
        mut left: GlobalAddr,
        op: &mut OpGuard<'_>,
    ) -> Result<()> {
        let mut restarts = 0;
        loop {
            if level > layout::MAX_LEVEL {
                return Err(ShermanError::Corrupt(format!("the tree grew past level {}", layout::MAX_LEVEL)));
            }
            let (rl, _) = self.root().await?;
            if rl < level {
                let (rl, root) = self.refresh_root().await?;
                if rl < level {
                    let entry = (root == left).then_some((sep, child.raw()));
                    if self.grow(rl, root, entry).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
            let mut at = self.descend(sep, level).await?;
            let mut min_low = 0;
            let held = loop {
                let held = self.lock_read(at, op).await?;
                let p = self.page.view();
                if p.level() == level && p.lowest() <= sep && p.lowest() >= min_low {
                    if !p.is_right_of(sep) {
                        break Some(held);
                    }
                    if let (Some(s), Some(h)) = (p.sibling(), p.highest()) {
                        self.unlock(held, false).await?;
                        (at, min_low) = (s, h);
                        continue;
                    }
                }
                self.unlock(held, false).await?;
                break None;
            };
            let Some(held) = held else {
                restarts += 1;
                self.local.borrow_mut().root = None;
                if restarts > MAX_RESTARTS {
                    return Err(ShermanError::Corrupt(format!("no page of level {level} takes separator {sep}")));
                }
                continue;
            };
            let p = self.page.view();
            let n = p.count();
            let mut es = [(0u64, 0u64); ENTRIES + 1];
            for (i, e) in p.live() {
                es[i] = (e.key, e.value);
            }
            let pos = es[..n].partition_point(|e| e.0 < sep);
            if pos < n && es[pos].0 == sep {
                // Already there (a split is published once; be idempotent).
                return self.unlock(held, false).await;
            }
            es.copy_within(pos..n, pos + 1);
            es[pos] = (sep, child.raw());
            let n = n + 1;
            if n <= ENTRIES {
                self.page.set_sorted(&es[..n]);
                self.page.seal_next();
                self.cache_level1();
                match self.unlock_sealed(held).await {
                    // Taken over while this client stalled, nothing written:
                    // the separator is put in again.
                    Err(ShermanError::LeaseLost(_)) if restarts < MAX_RESTARTS => {
                        restarts += 1;
                        continue;
                    }
                    r => return r,
                }
            }
            // Split the internal page: the middle entry's key goes up, its
            // child becomes the new page's leftmost.
            let mid = n / 2;
            let (sep2, c2) = es[mid];
            let (lowest, high, sibling, leftmost) = (p.lowest(), p.highest(), p.sibling(), p.leftmost());
            let mut r = self.split.take().unwrap_or_else(|| PageBuf::new(0, 0, None, None));
            r.reset(level, sep2, high, sibling);
            r.set_leftmost(GlobalAddr::from_raw(c2));
            r.set_sorted(&es[mid + 1..n]);
            self.split = Some(r);
            let right = self.write_new_page().await;
            let right = self.or_unlock(held, right).await?;
            self.page.reset(level, lowest, Some(sep2), Some(right));
            self.page.set_leftmost(leftmost);
            self.page.set_sorted(&es[..mid]);
            self.page.seal_after(held.seq);
            self.cache_level1();
            match self.unlock_sealed(held).await {
                // As above; the new right page is left unlinked (leaked).
                Err(ShermanError::LeaseLost(_)) if restarts < MAX_RESTARTS => {
                    restarts += 1;
                    continue;
                }
                r => r?,
            }
            self.local.borrow_mut().stats.internal_splits += 1;
            (level, sep, child, left) = (level + 1, sep2, right, held.page);
        }
    }

    /// Writes a new root of level `rl + 1` above the current root `root`
    /// (with `entry` when the current root is the page that split) and
    /// CASes the root word to it. Returns whether it won and `entry` was in
    /// it.
    async fn grow(&mut self, rl: u8, root: GlobalAddr, entry: Option<(u64, u64)>) -> Result<bool> {
        let mut r = self.split.take().unwrap_or_else(|| PageBuf::new(0, 0, None, None));
        r.reset(rl + 1, 0, None, None);
        r.set_leftmost(root);
        r.set_sorted(entry.as_slice());
        self.split = Some(r);
        let at = self.write_new_page().await?;
        let old = layout::root_word(rl, root);
        let new = layout::root_word(rl + 1, at);
        let got = self.ctx.cas(self.meta.add(layout::ROOT_WORD), old, new).await?;
        let mut l = self.local.borrow_mut();
        if got == old {
            l.root = Some(new);
            l.stats.root_grows += 1;
            Ok(entry.is_some())
        } else {
            // Another client grew the tree first: its root is the one.
            l.root = Some(got);
            l.stats.root_races += 1;
            Ok(false)
        }
    }

    /// Puts the level-1 page in `self.page` (sealed) into the index cache.
    fn cache_level1(&self) {
        let p = self.page.view();
        if p.level() == 1 {
            self.local.borrow_mut().cache.insert(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use smart_core::{EmbeddedTransport, Runtime, RuntimeConfig};

    use crate::layout::root_word;
    use crate::ShermanBt;

    #[test]
    fn a_grow_that_loses_its_cas_adopts_the_winners_root_and_changes_nothing() {
        let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut a, _) = ShermanBt::open_or_create(&ctx, "g").await.unwrap();
            let (_, leaf) = a.refresh_root().await.unwrap();
            for k in 0..100 {
                a.insert_u64(k, k).await.unwrap();
            }
            let (level, root) = a.refresh_root().await.unwrap();
            assert_eq!(level, 1, "100 keys need two levels");
            // A client that still sees the first leaf as the root splits it
            // and tries to put a new root above it: the CAS fails.
            assert!(!a.grow(0, leaf, Some((50, leaf.raw()))).await.unwrap());
            assert_eq!(a.local.borrow().root, Some(root_word(1, root)), "the winner's root is adopted");
            assert_eq!(a.counters().root_races, 1);
            let (shape, keys) = a.walk().await.unwrap();
            assert_eq!((shape.depth, keys.len()), (2, 100));
            for k in 0..100 {
                assert_eq!(a.get_u64(k).await.unwrap(), Some(k));
            }
        });
    }

    /// Page links are remote memory any client can write: a leaf whose
    /// sibling link leads back to itself, or into the superblock, ends a
    /// scan with an error naming it, never a cycle or a read of the
    /// superblock as a page.
    #[test]
    fn a_sibling_link_that_leads_back_or_out_of_the_heap_is_an_error() {
        use crate::layout::{PageBuf, PageRef, PAGE};
        use crate::ShermanError;
        use smart_core::GlobalAddr;

        let t = EmbeddedTransport::new(1, 16 << 20).unwrap();
        let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut a, _) = ShermanBt::open_or_create(&ctx, "links").await.unwrap();
            for k in 0..200 {
                a.insert_u64(k, k).await.unwrap();
            }
            let first = a.descend(0, 0).await.unwrap();
            let mut out = Vec::new();
            a.scan_u64(0, 200, &mut out).await.unwrap();
            assert_eq!(out.len(), 200);
            for (link, says) in [(first, "does not start there"), (GlobalAddr::new(0, 16), "below the heap")] {
                let mut bytes = vec![0u8; PAGE];
                ctx.read(first, &mut bytes).await.unwrap();
                let mut page = PageBuf::from_page(PageRef::check(&bytes).unwrap());
                assert!(page.view().highest().is_some(), "the first leaf has a right sibling");
                page.set_sibling(Some(link));
                page.seal_next();
                ctx.write(first, &page.0[..]).await.unwrap();
                let err = a.scan_u64(0, 200, &mut out).await.unwrap_err();
                assert!(matches!(err, ShermanError::Corrupt(_)) && err.to_string().contains(says), "{err}");
            }
        });
    }
}
