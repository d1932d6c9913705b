//! Merging pages that deletes left nearly empty, and freeing the pages
//! merged away (see the crate docs for the protocol and why it is safe).

use smart_core::runtime::OpGuard;
use smart_core::GlobalAddr;

use crate::layout::{self, Field, Key, PageBuf, PageRef, FLAG_ABSORBING, FLAG_DEAD, FLAG_MERGING, INLINE_MAX};
use crate::lock::Held;
use crate::read::with_page;
use crate::{Result, ShermanBt, ShermanError};

/// A page merges when fewer than this share of its slots are live.
pub const MERGE_BELOW: f64 = 0.25;
/// Two pages merge only if their entries fill at most this share of one.
pub const MERGE_FILL: f64 = 0.75;
/// Pages walked right from a merge's link to find the left neighbour.
const MAX_HOPS: usize = 64;

/// Two pages locked together (one lock word when both hash to it).
pub(crate) struct Pair {
    left: (GlobalAddr, Held, PageBuf),
    /// The right page; `None` for its lock when it shares the left's.
    right: (GlobalAddr, Option<Held>, PageBuf),
    /// The locks (left, right) a waiter took over while this client
    /// stalled ([`ShermanError::LeaseLost`]): their local turns were passed
    /// on then, so [`ShermanBt::release_pair`] must not release them again
    /// (a second release would advance their local queue past a waiter's
    /// ticket: two local holders, then a ticket never served).
    lost: (bool, bool),
}

impl ShermanBt {
    /// Whether a page of `level` with `live` entries should merge.
    pub(crate) fn underfull(&self, level: u8, live: usize) -> bool {
        (live as f64) < MERGE_BELOW * self.f.slots(level).count as f64
    }

    /// Locks pages `l` and `r` (in lock-word order, so that two mergers
    /// never wait for each other) and reads both.
    async fn lock_pair(&mut self, l: GlobalAddr, r: GlobalAddr, op: &mut OpGuard<'_>) -> Result<Pair> {
        let (wl, wr) = (self.lock_word(l)?, self.lock_word(r)?);
        if wl == wr {
            let h = self.lock_read(l, op).await?;
            let lp = self.page.clone();
            if let Err(e) = self.read_locked(r).await {
                let _ = self.release(h, false).await;
                return Err(e);
            }
            return Ok(Pair { left: (l, h, lp), right: (r, None, self.page.clone()), lost: (false, false) });
        }
        let (first, second) = if wl.raw() < wr.raw() { (l, r) } else { (r, l) };
        let h1 = self.lock_read(first, op).await?;
        let p1 = self.page.clone();
        let h2 = match self.lock_read(second, op).await {
            Ok(h) => h,
            Err(e) => {
                let _ = self.release(h1, false).await;
                return Err(e);
            }
        };
        let p2 = self.page.clone();
        Ok(if first == l {
            Pair { left: (l, h1, p1), right: (r, Some(h2), p2), lost: (false, false) }
        } else {
            Pair { left: (l, h2, p2), right: (r, Some(h1), p1), lost: (false, false) }
        })
    }

    async fn release_pair(&mut self, p: Pair) -> Result<()> {
        let a = if p.lost.0 { Ok(()) } else { self.release(p.left.1, false).await };
        if let (Some(h), false) = (p.right.1, p.lost.1) {
            self.release(h, false).await?;
        }
        a
    }

    /// Writes `buf` to the left (`left`) or right page of `pair` under its
    /// lock, renewing the lock first if half a lease passed.
    async fn write_locked(&mut self, pair: &mut Pair, left: bool) -> Result<()> {
        let shared = pair.right.1.is_none();
        let held = if left || shared { pair.left.1 } else { pair.right.1.expect("its own lock") };
        let held = self.still_held(held).await.inspect_err(|e| {
            if matches!(e, ShermanError::LeaseLost(_)) {
                *(if left || shared { &mut pair.lost.0 } else { &mut pair.lost.1 }) = true;
            }
        })?;
        if left || shared {
            pair.left.1 = held;
        } else {
            pair.right.1 = Some(held);
        }
        let (at, buf) = if left { (pair.left.0, &pair.left.2) } else { (pair.right.0, &pair.right.2) };
        self.ctx.write(at, &buf.b[..]).await?;
        Ok(())
    }

    /// Whether the entries of `l` and `r` (pages of one level, `r` right
    /// of `l`) fit one page filled to [`MERGE_FILL`].
    fn fits(&self, l: PageRef<'_>, r: PageRef<'_>) -> bool {
        let n = if l.is_leaf() { l.live().count() + r.live().count() } else { l.count() + 1 + r.count() };
        (n as f64) <= MERGE_FILL * self.f.slots(l.level()).count as f64
    }

    /// `l` with the entries and range of `r` (its right sibling) added.
    fn absorbed(&self, l: PageRef<'_>, r: PageRef<'_>) -> PageBuf {
        let mut out = PageBuf::from_page(l);
        if l.is_leaf() {
            let mut raw = [0u8; 2 + INLINE_MAX];
            for i in r.live() {
                let slot = out.view().free_slot().expect("checked: the entries fit");
                r.value_field(i, &mut raw);
                out.set_leaf(slot, r.key(i).as_slice(), &Field::raw(&raw[..2 + self.f.inline]));
            }
        } else {
            let mut es: Vec<(Key, GlobalAddr)> = l.live().map(|i| (l.key(i), l.child(i))).collect();
            es.push((r.lowest(), r.leftmost()));
            es.extend(r.live().map(|i| (r.key(i), r.child(i))));
            out.set_sorted(&es);
        }
        out.set_highest(r.highest().as_ref().map(Key::as_slice));
        out.set_sibling(r.sibling());
        out
    }

    /// Takes the merge of the right page of `pair` into its left page as
    /// far as it goes, from whatever state it is in (fresh, or left by a
    /// client that died): R marked merging, L absorbing R's entries, R dead
    /// (empty, linked to L), L plain again. Each step is one page WRITE,
    /// completed before the next. Returns whether R is dead at the end.
    async fn merge_locked(&mut self, pair: &mut Pair, fresh: bool) -> Result<bool> {
        let (l, r) = (pair.left.0, pair.right.0);
        let (lf, rf) = (pair.left.2.view().merge_flags(), pair.right.2.view().merge_flags());
        let (l_seq, r_seq) = (pair.left.2.view().seq(), pair.right.2.view().seq());
        let absorbing = lf == FLAG_ABSORBING && pair.left.2.view().link() == r;
        if rf == FLAG_DEAD {
            if absorbing {
                pair.left.2.set_merge(0, GlobalAddr::NULL);
                pair.left.2.seal_after(l_seq);
                self.write_locked(pair, true).await?;
            }
            return Ok(pair.right.2.view().link() == l);
        }
        let (lv, rv) = (pair.left.2.view(), pair.right.2.view());
        let linked = lv.sibling() == Some(r) && lv.highest() == Some(rv.lowest()) && lv.level() == rv.level();
        if !absorbing && (!linked || lf == FLAG_DEAD) {
            // L is not R's left neighbour (any more).
            return Ok(false);
        }
        let fits = self.fits(lv, rv);
        if fresh && (lf != 0 || rf != 0 || !fits) {
            return Ok(false);
        }
        if !absorbing && (lf != 0 || !fits) {
            // A merge a dead client began, and since then L took inserts
            // (R no longer fits) or is in a merge of its own: undone. L is
            // live and linked to R, so no page holds R's entries but R.
            if rf == FLAG_MERGING {
                pair.right.2.set_merge(0, GlobalAddr::NULL);
                pair.right.2.seal_after(r_seq);
                self.write_locked(pair, false).await?;
            }
            return Ok(false);
        }
        let mut r_seq = r_seq;
        if rf != FLAG_MERGING {
            pair.right.2.set_merge(FLAG_MERGING, l);
            pair.right.2.seal_after(r_seq);
            self.write_locked(pair, false).await?;
            r_seq = pair.right.2.view().seq();
        }
        if !absorbing {
            let mut a = self.absorbed(pair.left.2.view(), pair.right.2.view());
            a.set_merge(FLAG_ABSORBING, r);
            a.seal_after(l_seq);
            pair.left.2 = a;
            self.write_locked(pair, true).await?;
        }
        let rv = pair.right.2.view();
        let (level, low, high, sib) = (rv.level(), rv.lowest(), rv.highest(), rv.sibling());
        let mut dead = PageBuf::new(self.f, level, low.as_slice(), high.as_ref().map(Key::as_slice), sib);
        dead.set_merge(FLAG_DEAD, l);
        dead.seal_after(r_seq);
        pair.right.2 = dead;
        self.write_locked(pair, false).await?;
        let l_seq = pair.left.2.view().seq();
        pair.left.2.set_merge(0, GlobalAddr::NULL);
        pair.left.2.seal_after(l_seq);
        self.write_locked(pair, true).await?;
        Ok(true)
    }

    /// After a delete left page `u` of `level` (covering keys from `low`)
    /// underfull: merges it with its neighbour under the same parent (the
    /// right one into the left one), frees the page merged away, and goes
    /// on with the parent if that left it underfull.
    pub(crate) async fn try_merge(
        &mut self,
        mut u: GlobalAddr,
        mut low: Key,
        mut level: u8,
        op: &mut OpGuard<'_>,
    ) -> Result<()> {
        loop {
            let (rl, _) = self.root().await?;
            if rl <= level {
                return Ok(());
            }
            let parent = self.descend(low.as_slice(), level + 1, Some(&mut *op)).await?;
            let pick = with_page(&self.ctx, &self.local, &self.read, (parent, self.f), |p| {
                if p.merge_flags() != 0 || !p.covers(low.as_slice()) {
                    return None;
                }
                if p.leftmost() == u {
                    return (p.count() >= 1).then(|| (u, p.child(0), p.key(0)));
                }
                (0..p.count())
                    .find(|&i| p.child(i) == u)
                    .map(|i| (if i == 0 { p.leftmost() } else { p.child(i - 1) }, u, p.key(i)))
            })
            .await?;
            let Some((l, r, sep)) = pick else { return Ok(()) };
            let mut pair = self.lock_pair(l, r, op).await?;
            let was_dead = pair.right.2.view().is_dead();
            let dead = match self.merge_locked(&mut pair, true).await {
                Ok(d) => d,
                Err(ShermanError::LeaseLost(_)) => {
                    // This client stalled and lost a lock: a helper finishes.
                    let _ = self.release_pair(pair).await;
                    return Ok(());
                }
                Err(e) => {
                    let _ = self.release_pair(pair).await;
                    return Err(e);
                }
            };
            self.release_pair(pair).await?;
            if !dead {
                return Ok(());
            }
            if !was_dead {
                self.local.borrow_mut().stats.merges += 1;
            }
            match self.unlink(level, sep, r, op).await? {
                Some((p, plow, live)) if self.underfull(level + 1, live) => (u, low, level) = (p, plow, level + 1),
                _ => return Ok(()),
            }
        }
    }

    /// Removes dead page `r` (named by separator `sep`) from its parent of
    /// `level + 1`, then frees it. Returns the parent (address, lowest,
    /// entries left), or `None` if the entry was not found (the parent
    /// changed, or is in a merge itself): the dead page then stays where it
    /// is, its link leading readers on (counted by [`ShermanBt::walk`]).
    pub(crate) async fn unlink(
        &mut self,
        level: u8,
        sep: Key,
        r: GlobalAddr,
        op: &mut OpGuard<'_>,
    ) -> Result<Option<(GlobalAddr, Key, usize)>> {
        let mut at = self.descend(sep.as_slice(), level + 1, Some(&mut *op)).await?;
        let mut min_low = Key::EMPTY;
        for _ in 0..MAX_HOPS {
            let held = self.lock_read(at, op).await?;
            let p = self.page.view();
            let plow = p.lowest();
            if p.is_dead() && p.level() == level + 1 {
                // The parent was merged away: on to the page that took it.
                let l = p.link();
                self.unlock(held, false).await?;
                if !self.is_page(l).await? {
                    return Ok(None);
                }
                (at, min_low) = (l, Key::EMPTY);
                continue;
            }
            if p.merge_flags() != 0 || p.level() != level + 1 || plow > sep || plow < min_low {
                self.unlock(held, false).await?;
                return Ok(None);
            }
            if p.is_right_of(sep.as_slice()) {
                let next = (p.sibling(), p.highest());
                self.unlock(held, false).await?;
                match next {
                    (Some(s), Some(h)) => (at, min_low) = (s, h),
                    _ => return Ok(None),
                }
                continue;
            }
            let mut es: Vec<(Key, GlobalAddr)> = p.live().map(|i| (p.key(i), p.child(i))).collect();
            let Some(i) = es.iter().position(|e| e.0 == sep && e.1 == r) else {
                self.unlock(held, false).await?;
                return Ok(None);
            };
            es.remove(i);
            self.page.set_sorted(&es);
            self.page.seal_next();
            match self.unlock_sealed(held).await {
                Err(ShermanError::LeaseLost(_)) => return Ok(None),
                r => r?,
            }
            self.local.borrow_mut().cache.invalidate(sep.as_slice());
            self.free_page(r).await?;
            return Ok(Some((at, plow, es.len())));
        }
        Ok(None)
    }

    /// Frees a page no longer reachable from the tree: counted in the meta
    /// first (clients that see the count move drop their caches, which may
    /// name it), then retired (reused once no operation can reach it).
    pub(crate) async fn free_page(&mut self, at: GlobalAddr) -> Result<()> {
        self.ctx.faa(self.meta.add(layout::FREES_WORD), 1).await?;
        self.reclaim.retire(at, self.f.page as u64);
        self.local.borrow_mut().stats.pages_freed += 1;
        Ok(())
    }

    /// The left neighbour of page `at` (`v`, marked merging): the page on
    /// its level that links to it or absorbs it, found by its keys (a
    /// descent to the greatest key before `at`'s range, then right). Not
    /// through the mark's link: the page it names may have split, or been
    /// merged away and freed, since the client that marked `at` died.
    /// `None` if `at` is no longer marked merging.
    async fn left_of(&mut self, at: GlobalAddr, v: PageRef<'_>, op: &mut OpGuard<'_>) -> Result<Option<GlobalAddr>> {
        let (low, level) = (v.lowest(), v.level());
        let Some(before) = low.before(self.f.key_max) else {
            return Err(ShermanError::Corrupt(format!("page {at}, the first of level {level}, is marked merging")));
        };
        let mut l = self.descend(before.as_slice(), level, Some(&mut *op)).await?;
        for _ in 0..MAX_HOPS {
            let step = with_page(&self.ctx, &self.local, &self.read, (l, self.f), |q| {
                let leads = q.sibling() == Some(at) || (q.merge_flags() == FLAG_ABSORBING && q.link() == at);
                (leads, q.sibling(), q.lowest_cmp(low.as_slice()) == std::cmp::Ordering::Less)
            })
            .await?;
            match step {
                (true, ..) => return Ok(Some(l)),
                (false, Some(s), true) => l = s,
                _ => break,
            }
        }
        let marked = with_page(&self.ctx, &self.local, &self.read, (at, self.f), |p| {
            p.merge_flags() == FLAG_MERGING && p.lowest() == low
        })
        .await?;
        if marked {
            return Err(ShermanError::Corrupt(format!(
                "page {at} of level {level} is marked merging but no page on its level leads to it"
            )));
        }
        Ok(None)
    }

    /// A writer found page `at` (locked, now released) in a merge a client
    /// left unfinished: finishes it (or undoes it), so that the writer can
    /// go on.
    pub(crate) async fn help_merge(&mut self, at: GlobalAddr, p: &PageBuf, op: &mut OpGuard<'_>) -> Result<()> {
        let v = p.view();
        let (l, r) = if v.merge_flags() == FLAG_ABSORBING {
            (at, v.link())
        } else {
            match self.left_of(at, v, op).await? {
                Some(l) => (l, at),
                // Finished or undone meanwhile.
                None => return Ok(()),
            }
        };
        let sep = v.lowest();
        let level = v.level();
        let mut pair = self.lock_pair(l, r, op).await?;
        let dead = match self.merge_locked(&mut pair, false).await {
            Ok(d) => d,
            Err(e) => {
                let _ = self.release_pair(pair).await;
                return Err(e);
            }
        };
        let sep = if v.merge_flags() == FLAG_ABSORBING { pair.right.2.view().lowest() } else { sep };
        self.release_pair(pair).await?;
        self.local.borrow_mut().stats.merges_helped += 1;
        if dead {
            self.unlink(level, sep, r, op).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LOCK_LEASE;
    use smart_core::{Runtime, RuntimeConfig};

    /// Marks `r` merging into `l` as a merger would, then stops (dies).
    async fn mark_merging(t: &mut ShermanBt, l: GlobalAddr, r: GlobalAddr) {
        let ctx = t.ctx.clone();
        let mut op = ctx.op().await;
        let mut pair = t.lock_pair(l, r, &mut op).await.unwrap();
        let seq = pair.right.2.view().seq();
        pair.right.2.set_merge(FLAG_MERGING, l);
        pair.right.2.seal_after(seq);
        t.write_locked(&mut pair, false).await.unwrap();
        t.release_pair(pair).await.unwrap();
    }

    /// A merger that died after marking R merging into L (before L took
    /// R's entries) leaves L plain: L may then be merged into its own left
    /// neighbour LL and freed, or be marked merging into LL by another
    /// merger that died too. The next writer to R finds R's left neighbour
    /// by its keys, not through the mark's link, and finishes R's merge
    /// (into LL) or undoes it (L is in a merge of its own); the tree walks
    /// clean and keeps every key.
    #[test]
    fn a_merge_whose_left_page_was_merged_away_since_is_finished_by_the_next_writer() {
        let b = smart_testkit::backends::embedded(1);
        let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            for l_merged_away in [true, false] {
                let name = if l_merged_away { "orphan" } else { "chained" };
                let (mut t, _) = ShermanBt::open_or_create(&ctx, name).await.unwrap();
                let n = 3_000u64;
                for k in 0..n {
                    t.insert_u64(k, k).await.unwrap();
                }
                let parent = t.descend(&0u64.to_be_bytes(), 1, None).await.unwrap();
                let (ll, l, r, l_low, r_low) = with_page(&ctx, &t.local, &t.read, (parent, t.f), |p| {
                    (p.leftmost(), p.child(0), p.child(1), p.key(0), p.key(1))
                })
                .await
                .unwrap();
                let key = |k: &Key| u64::from_be_bytes(k.as_slice().try_into().unwrap());
                let (l_low, r_low) = (key(&l_low), key(&r_low));
                mark_merging(&mut t, l, r).await;
                let mut kept = n;
                if l_merged_away {
                    // Deletes empty LL and L: L is merged into LL and freed.
                    for k in 0..r_low {
                        assert!(t.delete_u64(k).await.unwrap(), "key {k}");
                    }
                    kept -= r_low;
                    let dead = with_page(&ctx, &t.local, &t.read, (l, t.f), |p| p.is_dead()).await.unwrap();
                    assert!(dead, "L ({l}, keys from {l_low}) merged into LL ({ll})");
                } else {
                    mark_merging(&mut t, ll, l).await;
                }
                // A writer to R: it finishes or undoes R's merge first.
                assert!(t.update_u64(r_low, 7).await.unwrap(), "R's first key updated");
                let marked = with_page(&ctx, &t.local, &t.read, (r, t.f), |p| p.merge_flags()).await.unwrap();
                if l_merged_away {
                    assert_eq!(marked, FLAG_DEAD, "R merged into LL");
                } else {
                    assert_eq!(marked, 0, "R's merge undone: L is in one of its own");
                    // A writer to L finishes L's.
                    assert!(t.update_u64(l_low, 8).await.unwrap());
                    assert_eq!(t.get_u64(l_low).await.unwrap(), Some(8));
                }
                let (shape, keys) = t.walk().await.unwrap();
                assert_eq!(shape.merging, 0, "no page left in a merge");
                assert_eq!(keys.len() as u64, kept, "every key kept");
                assert_eq!(t.get_u64(r_low).await.unwrap(), Some(7));
                assert_eq!(t.get_u64(n - 1).await.unwrap(), Some(n - 1));
            }
        });
    }

    /// A merger whose lock on one page of the pair a waiter took over (it
    /// stalled) releases only the other: the lost lock's local turn was
    /// passed on already. Released twice, it would skip a local waiter's
    /// ticket (two local holders, then a ticket never served: a coroutine
    /// waiting forever with no verb in flight), or find its queue gone.
    #[test]
    fn a_merger_that_lost_one_lock_of_its_pair_releases_only_the_other() {
        let b = smart_testkit::backends::embedded(1);
        let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        rt.block_on(async move {
            let (mut t, _) = ShermanBt::open_or_create(&ctx, "pair").await.unwrap();
            for k in 0..2_000u64 {
                t.insert_u64(k, k).await.unwrap();
            }
            let (level, root) = t.root().await.unwrap();
            assert!(level > 0, "the leaves split");
            let (l, r) = with_page(&ctx, &t.local, &t.read, (root, t.f), |p| (p.leftmost(), p.child(0))).await.unwrap();
            assert_ne!(t.lock_word(l).unwrap(), t.lock_word(r).unwrap(), "two lock words");
            for lose_left in [true, false] {
                let mut op = ctx.op().await;
                let mut pair = t.lock_pair(l, r, &mut op).await.unwrap();
                // Held for half a lease (a stall), then taken over.
                ctx.sleep_ns(LOCK_LEASE.as_nanos() as u64 / 2).await;
                let (lost, kept) =
                    if lose_left { (pair.left.1, pair.right.1.unwrap()) } else { (pair.right.1.unwrap(), pair.left.1) };
                assert_eq!(ctx.cas(lost.word, lost.tag, 0xdead_beef).await.unwrap(), lost.tag);
                let w = t.write_locked(&mut pair, lose_left).await;
                assert!(matches!(w, Err(ShermanError::LeaseLost(_))), "{w:?}");
                t.release_pair(pair).await.unwrap();
                assert!(t.local.borrow().locks.is_empty(), "a local queue left behind");
                assert_eq!(ctx.read_u64(kept.word).await.unwrap(), 0, "the kept lock released");
                assert_eq!(ctx.read_u64(lost.word).await.unwrap(), 0xdead_beef, "the new holder's word untouched");
                ctx.write(lost.word, &0u64.to_le_bytes()).await.unwrap();
                // Both lock again, and release.
                let pair = t.lock_pair(l, r, &mut op).await.unwrap();
                t.release_pair(pair).await.unwrap();
                assert!(t.local.borrow().locks.is_empty());
            }
        });
    }
}
