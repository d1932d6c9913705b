//! The operations: lookup (speculative or not), range scan, and the writes
//! with their splits.

use smart_core::index::Pairs;
use smart_core::kvblock;
use smart_core::reclaim::{Pin, Reclaimer};
use smart_core::runtime::OpGuard;
use smart_core::GlobalAddr;

use crate::layout::{self, show_key, Field, Key, PageBuf, PageRef, Value, INLINE_MAX, LINE};
use crate::lock::Held;
use crate::read::with_linked_page;
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

/// What a reader does at a leaf (on the stack: a key inline, no
/// allocation).
#[allow(clippy::large_enum_variant)]
enum AtLeaf<T> {
    Here(T),
    /// To the sibling, which starts at the key given (this page's end).
    Right(GlobalAddr, Key),
    /// A page merged away: to the page that took its range.
    Left(GlobalAddr),
    Restart,
}

/// Classifies a page reached while looking for `key`'s leaf, moving right
/// from a page that ended at `min_low` (the empty key: reached from
/// above). A page that starts below `min_low` is no right sibling: a link
/// that leads back (damaged, or written by a hostile client) restarts the
/// reader instead of sending it round a cycle.
fn at_leaf<T>(p: PageRef<'_>, key: &[u8], min_low: &Key, here: impl FnOnce(PageRef<'_>) -> T) -> AtLeaf<T> {
    use std::cmp::Ordering::{Greater, Less};
    if p.is_leaf() && p.is_dead() {
        AtLeaf::Left(p.link())
    } else if !p.is_leaf() || p.lowest_cmp(key) == Greater || p.lowest_cmp(min_low.as_slice()) == Less {
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

/// Where a lookup found its key's value.
enum Found {
    /// Copied into the caller's buffer.
    Inline,
    /// In a KV block of `.1` value bytes.
    Block(GlobalAddr, usize),
}

/// The value at leaf entry `i`, inline ones copied into `out`.
fn take_value(p: PageRef<'_>, i: usize, out: &mut Vec<u8>) -> Found {
    let mut buf = [0u8; INLINE_MAX];
    match p.value(i, &mut buf) {
        Value::Inline(v) => {
            out.clear();
            out.extend_from_slice(v);
            Found::Inline
        }
        Value::Block(at, len) => Found::Block(at, len),
    }
}

/// The hash a key is remembered under by the speculative cache.
fn spec_hash(key: &[u8]) -> u64 {
    smart_core::hash::bytes(key)
}

impl ShermanBt {
    /// Pins the reclamation epoch for an operation (freed pages and value
    /// blocks are reused only when no operation can still read them). When
    /// the epoch moved since the last check, reads the tree meta (one
    /// READ): a tree dropped is an error; pages freed since (or a lapse of
    /// this thread) drop the index cache, whose page addresses are
    /// references kept between operations.
    pub(crate) async fn pin(&self) -> Result<Pin> {
        let pin = Reclaimer::pin(&self.reclaim, &self.ctx).await?;
        let (epoch, lapses) = (pin.epoch(), self.reclaim.lapses());
        if self.local.borrow().checked_epoch == epoch && self.local.borrow().lapses == lapses {
            return Ok(pin);
        }
        let mut meta = [0u8; layout::META];
        self.ctx.read(self.meta, &mut meta).await?;
        let word = |o: usize| u64::from_le_bytes(meta[o..o + 8].try_into().expect("8 bytes"));
        if word(0) == layout::DROPPED_MAGIC {
            return Err(ShermanError::Dropped);
        }
        let frees = word(layout::FREES_WORD as usize);
        let mut l = self.local.borrow_mut();
        if frees != l.frees || lapses != l.lapses {
            // (The speculative cache needs no dropping: what it names is
            // read as lines that must hold the key in a valid leaf entry,
            // which a page reused for anything else does not.)
            l.cache.clear();
            l.frees = frees;
            l.stats.cache_drops += 1;
        }
        (l.checked_epoch, l.lapses) = (epoch, lapses);
        Ok(pin)
    }

    /// Looks `key` up; its value goes to `out`. Returns whether it exists.
    ///
    /// # Errors
    /// A key longer than the tree's; verb errors; a page torn on every
    /// re-read; a tree that contradicts itself.
    pub async fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.check_sizes(key, None)?;
        let before = self.read.get();
        let r = self.lookup(key, out).await;
        let mut l = self.local.borrow_mut();
        l.stats.lookups += 1;
        l.stats.lookup_bytes += self.read.get() - before;
        r
    }

    async fn lookup(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let _pin = self.pin().await?;
        for _ in 0..MAX_RESTARTS {
            let found = match self.speculate(key, out).await? {
                Some(f) => Some(f),
                None => self.lookup_leaf(key, out).await?,
            };
            match found {
                None => return Ok(false),
                Some(Found::Inline) => return Ok(true),
                Some(Found::Block(at, len)) => {
                    if self.read_block(at, key, len, out).await? {
                        return Ok(true);
                    }
                    // The entry changed since it was read (its block is no
                    // longer this key's): look again.
                    self.forget(key);
                }
            }
        }
        Err(ShermanError::Corrupt(format!(
            "key {}: every one of {MAX_RESTARTS} entries read named a block of another key",
            show_key(key)
        )))
    }

    /// The leaf path of a lookup: the leaf holding `key`'s range, read
    /// whole.
    async fn lookup_leaf(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Found>> {
        let mut at = self.leaf_for(key, None).await?;
        let (mut restarts, mut min_low, mut linked) = (0, Key::EMPTY, false);
        loop {
            let step = with_linked_page(&self.ctx, &self.local, &self.read, (at, self.f), linked, |p| {
                at_leaf(p, key, &min_low, |p| p.find(key).map(|i| (i, take_value(p, i, out))))
            })
            .await?
            .unwrap_or(AtLeaf::Restart);
            linked = matches!(step, AtLeaf::Left(_));
            match step {
                AtLeaf::Here(found) => {
                    self.remember(key, found.as_ref().map(|(i, _)| (at, *i)));
                    return Ok(found.map(|(_, f)| f));
                }
                AtLeaf::Right(s, high) => {
                    self.moved_right(key);
                    (at, min_low) = (s, high);
                }
                AtLeaf::Left(l) => (at, min_low) = (self.moved_left(key, l, &mut restarts, None).await?, Key::EMPTY),
                AtLeaf::Restart => (at, min_low) = (self.restart(key, &mut restarts, None).await?, Key::EMPTY),
            }
        }
    }

    /// A page merged away: on to `l`, which took its range (counted like a
    /// restart, so links cannot send an operation round for ever; past the
    /// bound, from the root).
    async fn moved_left(
        &mut self,
        key: &[u8],
        l: GlobalAddr,
        restarts: &mut u32,
        op: Option<&mut OpGuard<'_>>,
    ) -> Result<GlobalAddr> {
        {
            let mut s = self.local.borrow_mut();
            s.stats.left_hops += 1;
            s.cache.invalidate(key);
        }
        if *restarts >= MAX_RESTARTS / 2 {
            return self.restart(key, restarts, op).await;
        }
        *restarts += 1;
        Ok(l)
    }

    /// READs the KV block at `at` of `key` and a value of `len` bytes into
    /// `out`; `false` if it holds another key (reused since the entry that
    /// named it was read).
    ///
    /// # Errors
    /// A block address outside the heap; a block that fails its CRC (blocks
    /// are written whole before they are linked and never changed); verb
    /// errors.
    async fn read_block(&mut self, at: GlobalAddr, key: &[u8], len: usize, out: &mut Vec<u8>) -> Result<bool> {
        let n = kvblock::block_len(key.len(), len);
        smart_core::layout::check_heap_place(self.ctx.blades(), at, n as u64).map_err(|why| {
            ShermanError::Corrupt(format!(
                "the entry of key {} names a value block at {at}, which {why}",
                show_key(key)
            ))
        })?;
        let mut b = self.ctx.batch();
        let r = b.read(at, n);
        let done = b.post().await?;
        self.count_read(n);
        let ok = match kvblock::decode_block(done.bytes(r)) {
            Some((k, v)) if k == key && v.len() == len => {
                out.clear();
                out.extend_from_slice(v);
                true
            }
            Some(_) => false,
            None => {
                return Err(ShermanError::Corrupt(format!(
                    "the value block of key {} at {at} fails its CRC",
                    show_key(key)
                )))
            }
        };
        if !ok {
            self.local.borrow_mut().stats.stale_blocks += 1;
        }
        Ok(ok)
    }

    /// The leaf a stale path led to was not the key's: start from the root.
    async fn restart(&mut self, key: &[u8], restarts: &mut u32, op: Option<&mut OpGuard<'_>>) -> Result<GlobalAddr> {
        *restarts += 1;
        {
            let mut l = self.local.borrow_mut();
            l.stats.restarts += 1;
            l.cache.invalidate(key);
        }
        if *restarts > MAX_RESTARTS {
            return Err(ShermanError::Corrupt(format!(
                "no leaf holds key {} after {MAX_RESTARTS} descents",
                show_key(key)
            )));
        }
        self.descend(key, 0, op).await
    }

    /// A leaf split since the path to it was cached: the next lookup
    /// fetches a fresh level-1 page.
    fn moved_right(&self, key: &[u8]) {
        let mut l = self.local.borrow_mut();
        l.stats.sibling_hops += 1;
        l.cache.invalidate(key);
    }

    /// Records where `key` is (or that it is nowhere) for speculation.
    fn remember(&self, key: &[u8], at: Option<(GlobalAddr, usize)>) {
        if let Some(spec) = self.local.borrow_mut().spec.as_mut() {
            match at {
                Some((leaf, i)) => spec.put(spec_hash(key), leaf, i),
                None => spec.forget(spec_hash(key)),
            }
        }
    }

    fn forget(&self, key: &[u8]) {
        self.remember(key, None);
    }

    /// Smart-BT's speculative lookup: READ the line(s) of the entry where
    /// `key` was last seen; accept them if they pass their checks, carry
    /// one sequence number that marks a leaf, and hold `key` in a valid
    /// entry.
    async fn speculate(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Found>> {
        let guess = match self.local.borrow_mut().spec.as_mut() {
            Some(s) => s.get(spec_hash(key)),
            None => return Ok(None),
        };
        let Some((leaf, i)) = guess else {
            // Nothing known about the key: the normal path (and it counts as
            // a miss, so the hit rate is over every lookup).
            self.local.borrow_mut().stats.spec_misses += 1;
            return Ok(None);
        };
        if i >= self.f.leaf.count {
            self.forget(key);
            return Ok(None);
        }
        let (line, n) = self.f.leaf_entry_lines(i);
        let mut b = self.ctx.batch();
        let r = b.read(leaf.add((line * LINE) as u64), n * LINE);
        let done = b.post().await?;
        let hit = match PageRef::check_lines(done.bytes(r), line, self.f) {
            Some(p) if p.entry_is(i, key) => Some(take_value(p, i, out)),
            _ => None,
        };
        drop(done);
        self.count_read(n * LINE);
        let mut l = self.local.borrow_mut();
        if hit.is_some() {
            l.stats.spec_hits += 1;
        } else {
            l.stats.spec_misses += 1;
            l.stats.spec_stale += 1;
            if let Some(s) = l.spec.as_mut() {
                s.forget(spec_hash(key));
            }
        }
        Ok(hit)
    }

    /// Up to `count` pairs with keys ≥ `start`, in byte order, into `out`
    /// (cleared first); returns how many. See the crate docs for the
    /// guarantees.
    ///
    /// # Errors
    /// As [`ShermanBt::get`].
    pub async fn scan(&mut self, start: &[u8], count: usize, out: &mut Pairs) -> Result<usize> {
        out.clear();
        self.check_sizes(start, None)?;
        if count == 0 {
            return Ok(0);
        }
        let _pin = self.pin().await?;
        let mut es = std::mem::take(&mut self.scratch);
        let r = self.scan_leaves(start, count, out, &mut es).await;
        self.scratch = es;
        r.map(|()| out.len())
    }

    async fn scan_leaves(
        &mut self,
        start: &[u8],
        count: usize,
        out: &mut Pairs,
        es: &mut Vec<(Key, Field)>,
    ) -> Result<()> {
        let mut at = self.leaf_for(start, None).await?;
        let (mut from, mut first, mut restarts, mut min_low) = (Key::new(start), true, 0, Key::EMPTY);
        let (mut stale, mut linked) = (0, false);
        loop {
            es.clear();
            let want = count - out.len();
            let step = with_linked_page(&self.ctx, &self.local, &self.read, (at, self.f), linked, |p| {
                at_leaf(p, from.as_slice(), &min_low, |p| {
                    // The entries from `from`, sorted in place by index; when
                    // their keys and values lie in the page, straight out
                    // (no copy of a key or a value field).
                    let mut ks: [(&[u8], u8); 256] = [(&[], 0); 256];
                    let mut n = 0;
                    let mut in_page = true;
                    for i in p.live() {
                        match p.key_slice(i) {
                            Some(k) if in_page => {
                                if k >= from.as_slice() {
                                    ks[n] = (k, i as u8);
                                    n += 1;
                                }
                            }
                            _ => {
                                in_page = false;
                                break;
                            }
                        }
                    }
                    if in_page {
                        let ks = &mut ks[..n];
                        ks.sort_unstable_by(|a, b| a.0.cmp(b.0));
                        let ks = &ks[..n.min(want)];
                        in_page = ks.iter().all(|&(_, i)| p.inline_slice(usize::from(i)).is_some());
                        if in_page {
                            for &(k, i) in ks {
                                out.push(k, p.inline_slice(usize::from(i)).expect("checked"));
                            }
                        }
                    }
                    if !in_page {
                        // Keys across lines or values out of line: copied,
                        // sorted, and the blocks read after.
                        let mut field = [0u8; 2 + INLINE_MAX];
                        for i in p.live() {
                            let k = p.key(i);
                            if k >= from {
                                p.value_field(i, &mut field);
                                es.push((k, Field::raw(&field[..2 + p.format().inline])));
                            }
                        }
                        #[allow(clippy::unnecessary_sort_by)] // by reference: a key is 258 bytes to copy
                        es.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                        es.truncate(want);
                    }
                    (p.highest(), p.sibling())
                })
            })
            .await?;
            let Some(step) = step else {
                // A link to memory reused since: from the root.
                (at, min_low, linked) = (self.restart(from.as_slice(), &mut restarts, None).await?, Key::EMPTY, false);
                continue;
            };
            linked = matches!(step, AtLeaf::Left(_));
            match step {
                AtLeaf::Here((high, sibling)) => {
                    es.truncate(count - out.len());
                    if !self.emit(es, out).await? {
                        // A block reused since the leaf was read: read the
                        // leaf again.
                        stale += 1;
                        if stale > MAX_RESTARTS {
                            return Err(ShermanError::Corrupt(format!("leaf {at}: its value blocks keep changing")));
                        }
                        continue;
                    }
                    let Some(high) = high else { return Ok(()) };
                    if out.len() >= count {
                        return Ok(());
                    }
                    at = sibling.ok_or_else(|| {
                        ShermanError::Corrupt(format!("leaf {at} ends at {high:?} but has no sibling"))
                    })?;
                    (from, min_low) = (high, high);
                    first = false;
                }
                AtLeaf::Right(s, high) => {
                    self.moved_right(from.as_slice());
                    (at, min_low) = (s, high);
                }
                AtLeaf::Left(l) => {
                    (at, min_low) = (self.moved_left(from.as_slice(), l, &mut restarts, None).await?, Key::EMPTY)
                }
                AtLeaf::Restart if first => {
                    (at, min_low) = (self.restart(from.as_slice(), &mut restarts, None).await?, Key::EMPTY)
                }
                AtLeaf::Restart => {
                    return Err(ShermanError::Corrupt(format!(
                        "the sibling {at} of a leaf ending at {from:?} does not start there"
                    )))
                }
            }
        }
    }

    /// Appends the pairs `es` (sorted) to `out`, reading the out-of-line
    /// values' blocks (one doorbell per blade and batch's worth); `false`
    /// (nothing appended) if a block holds another key.
    async fn emit(&mut self, es: &[(Key, Field)], out: &mut Pairs) -> Result<bool> {
        if es.iter().all(|(_, f)| f.block_of().is_none()) {
            for (k, f) in es {
                out.push(k.as_slice(), f.inline_bytes());
            }
            return Ok(true);
        }
        // The values read, end to end, and where each entry's is.
        let mut arena = std::mem::take(&mut self.block);
        arena.clear();
        let mut spans = vec![(0usize, 0usize); es.len()];
        let r = self.read_values(es, &mut arena, &mut spans).await;
        if let Ok(true) = r {
            for (j, (k, f)) in es.iter().enumerate() {
                match f.block_of() {
                    Some(_) => out.push(k.as_slice(), &arena[spans[j].0..spans[j].0 + spans[j].1]),
                    None => out.push(k.as_slice(), f.inline_bytes()),
                }
            }
        }
        self.block = arena;
        r
    }

    /// Reads the blocks the entries `es` name, the values into `arena` at
    /// `spans`; `false` if one holds another key.
    async fn read_values(
        &mut self,
        es: &[(Key, Field)],
        arena: &mut Vec<u8>,
        spans: &mut [(usize, usize)],
    ) -> Result<bool> {
        let room = self.ctx.config().slot_bytes;
        let mut todo: Vec<(usize, GlobalAddr, usize)> = Vec::new();
        for (j, (k, f)) in es.iter().enumerate() {
            if let Some((at, len)) = f.block_of() {
                let n = kvblock::block_len(k.as_slice().len(), len);
                smart_core::layout::check_heap_place(self.ctx.blades(), at, n as u64).map_err(|why| {
                    ShermanError::Corrupt(format!("the entry of key {k:?} names a value block at {at}, which {why}"))
                })?;
                todo.push((j, at, n));
            }
        }
        todo.sort_unstable_by_key(|&(_, at, _)| at.blade());
        let mut i = 0;
        while i < todo.len() {
            let blade = todo[i].1.blade();
            let mut b = self.ctx.batch();
            let (mut refs, mut bytes) = (Vec::new(), 0);
            while i < todo.len()
                && todo[i].1.blade() == blade
                && refs.len() < smart_core::runtime::MAX_BATCH
                && (refs.is_empty() || bytes + todo[i].2 <= room)
            {
                refs.push((todo[i], b.read(todo[i].1, todo[i].2)));
                bytes += todo[i].2;
                i += 1;
            }
            let done = b.post().await?;
            self.count_read(bytes);
            for ((j, at, _), r) in refs {
                match kvblock::decode_block(done.bytes(r)) {
                    Some((k, v)) if k == es[j].0.as_slice() => {
                        spans[j] = (arena.len(), v.len());
                        arena.extend_from_slice(v);
                    }
                    Some(_) => {
                        self.local.borrow_mut().stats.stale_blocks += 1;
                        return Ok(false);
                    }
                    None => {
                        return Err(ShermanError::Corrupt(format!(
                            "the value block of key {:?} at {at} fails its CRC",
                            es[j].0
                        )))
                    }
                }
            }
        }
        Ok(true)
    }

    /// Inserts, updates, upserts or deletes `key` (see [`Kind`]); returns
    /// whether it changed the tree.
    pub(crate) async fn modify(&mut self, key: &[u8], value: &[u8], kind: Kind) -> Result<bool> {
        self.check_sizes(key, (kind != Kind::Delete).then_some(value))?;
        let _pin = self.pin().await?;
        let field = match kind {
            Kind::Delete => Field::inline(&[]),
            _ => self.value_field(key, value).await?,
        };
        // A lock lost to a waiter while this client stalled (nothing was
        // written under it): the operation starts over.
        let mut lost = 0;
        let r = loop {
            match self.modify_once(key, &field, kind).await {
                Err(ShermanError::LeaseLost(_)) if lost < MAX_RESTARTS => lost += 1,
                r => break r,
            }
        };
        match r {
            Ok((changed, old)) => {
                if let Some((at, len)) = old {
                    self.retire(at, key.len(), len);
                }
                if !changed || kind == Kind::Delete {
                    // Not linked: nobody can have read it.
                    if let Some((at, len)) = field.block_of() {
                        self.retire(at, key.len(), len);
                    }
                }
                Ok(changed)
            }
            Err(e) => {
                // Whether a page write under a failed operation landed is
                // unknown: the block stays (a leak at worst, never a block
                // reused under a live entry).
                Err(e)
            }
        }
    }

    /// The value field for `value`: inline, or a KV block written now
    /// (before any entry can name it).
    async fn value_field(&mut self, key: &[u8], value: &[u8]) -> Result<Field> {
        if !self.f.out_of_line(value.len()) {
            return Ok(Field::inline(value));
        }
        let blade = self.next_blade();
        kvblock::encode_block(key, value, &mut self.block);
        let at = self.reclaim.alloc(&self.ctx, blade, self.block.len() as u64).await?;
        self.ctx.write(at, &self.block).await?;
        let mut l = self.local.borrow_mut();
        l.stats.blocks_written += 1;
        Ok(Field::block(at, value.len()))
    }

    /// Retires the block of a `key_len`-byte key and `len`-byte value at
    /// `at`: reused once no operation can still read it.
    fn retire(&self, at: GlobalAddr, key_len: usize, len: usize) {
        self.reclaim.retire(at, kvblock::block_len(key_len, len) as u64);
        self.local.borrow_mut().stats.blocks_retired += 1;
    }

    /// One try of [`ShermanBt::modify`]: returns whether it changed the
    /// tree and the block of the value it replaced or deleted, if any.
    async fn modify_once(
        &mut self,
        key: &[u8],
        field: &Field,
        kind: Kind,
    ) -> Result<(bool, Option<(GlobalAddr, usize)>)> {
        let ctx = self.ctx.clone();
        let mut op = ctx.op().await;
        let mut at = self.leaf_for(key, Some(&mut op)).await?;
        let (mut restarts, mut min_low) = (0, Key::EMPTY);
        loop {
            let held = self.lock_read(at, &mut op).await?;
            if self.page.view().merge_flags() & (layout::FLAG_MERGING | layout::FLAG_ABSORBING) != 0 {
                // A merge a client left unfinished: finished first.
                let p = self.page.clone();
                self.unlock(held, false).await?;
                self.help_merge(at, &p, &mut op).await?;
                restarts += 1;
                if restarts > MAX_RESTARTS {
                    return Err(ShermanError::Corrupt(format!("page {at} stays in a merge")));
                }
                continue;
            }
            let step = at_leaf(self.page.view(), key, &min_low, |p| {
                let found = p.find(key).map(|i| {
                    let mut raw = [0u8; 2 + INLINE_MAX];
                    p.value_field(i, &mut raw);
                    (i, Field::raw(&raw[..2 + p.format().inline]).block_of())
                });
                (found, p.free_slot())
            });
            let (found, free) = match step {
                AtLeaf::Here(x) => x,
                AtLeaf::Right(s, high) => {
                    self.unlock(held, false).await?;
                    self.moved_right(key);
                    (at, min_low) = (s, high);
                    continue;
                }
                AtLeaf::Left(l) => {
                    self.unlock(held, false).await?;
                    at = self.moved_left(key, l, &mut restarts, Some(&mut op)).await?;
                    if !self.is_page(at).await? {
                        at = self.restart(key, &mut restarts, Some(&mut op)).await?;
                    }
                    min_low = Key::EMPTY;
                    continue;
                }
                AtLeaf::Restart => {
                    self.unlock(held, false).await?;
                    (at, min_low) = (self.restart(key, &mut restarts, Some(&mut op)).await?, Key::EMPTY);
                    continue;
                }
            };
            return match (found, kind) {
                (Some((i, _)), Kind::Insert) => {
                    self.unlock(held, false).await?;
                    self.remember(key, Some((at, i)));
                    Ok((false, None))
                }
                (None, Kind::Update | Kind::Delete) => {
                    self.unlock(held, false).await?;
                    Ok((false, None))
                }
                (Some((i, old)), Kind::Update | Kind::Upsert) => {
                    self.page.set_leaf(i, key, field);
                    self.unlock(held, true).await?;
                    self.remember(key, Some((at, i)));
                    Ok((true, old))
                }
                (Some((i, old)), Kind::Delete) => {
                    self.page.clear_leaf(i);
                    self.unlock(held, true).await?;
                    self.forget(key);
                    let p = self.page.view();
                    if self.underfull(0, p.live().count()) {
                        let low = p.lowest();
                        self.try_merge(at, low, 0, &mut op).await?;
                    }
                    Ok((true, old))
                }
                (None, Kind::Insert | Kind::Upsert) => match free {
                    Some(i) => {
                        self.page.set_leaf(i, key, field);
                        self.unlock(held, true).await?;
                        self.remember(key, Some((at, i)));
                        Ok((true, None))
                    }
                    None => {
                        self.split_leaf(held, key, field, &mut op).await?;
                        Ok((true, None))
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
        self.ctx.write(at, &p.b[..]).await?;
        Ok(at)
    }

    /// The split buffer, reset to an empty page of `level`.
    fn split_buf(&mut self, level: u8, lowest: &[u8], high: Option<&[u8]>, sibling: Option<GlobalAddr>) -> PageBuf {
        let mut r = self.split.take().unwrap_or_else(|| PageBuf::empty(self.f));
        r.reset(level, lowest, high, sibling);
        r
    }

    /// Splits the full leaf in `self.page` (locked) while inserting `key`:
    /// sorted, the upper half moves to a new right sibling, written before
    /// the leaf that links it; then the separator goes up.
    async fn split_leaf(&mut self, held: Held, key: &[u8], field: &Field, op: &mut OpGuard<'_>) -> Result<()> {
        let mut es = std::mem::take(&mut self.scratch);
        es.clear();
        let p = self.page.view();
        let mut raw = [0u8; 2 + INLINE_MAX];
        for i in p.live() {
            p.value_field(i, &mut raw);
            es.push((p.key(i), Field::raw(&raw[..2 + self.f.inline])));
        }
        es.push((Key::new(key), *field));
        #[allow(clippy::unnecessary_sort_by)] // by reference: a key is 258 bytes to copy
        es.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let n = es.len();
        let mid = n / 2;
        let sep = es[mid].0;
        let (lowest, high, sibling) = (p.lowest(), p.highest(), p.sibling());
        let mut r = self.split_buf(0, sep.as_slice(), high.as_ref().map(Key::as_slice), sibling);
        for (j, (k, f)) in es[mid..].iter().enumerate() {
            r.set_leaf(j, k.as_slice(), f);
        }
        self.split = Some(r);
        let right = self.write_new_page().await;
        let right = match self.or_unlock(held, right).await {
            Ok(r) => r,
            Err(e) => {
                self.scratch = es;
                return Err(e);
            }
        };
        self.page.reset(0, lowest.as_slice(), Some(sep.as_slice()), Some(right));
        for (j, (k, f)) in es[..mid].iter().enumerate() {
            self.page.set_leaf(j, k.as_slice(), f);
        }
        self.page.seal_after(held.seq);
        let at = if key >= sep.as_slice() {
            (right, es[mid..].iter().position(|e| e.0.as_slice() == key))
        } else {
            (held.page, es[..mid].iter().position(|e| e.0.as_slice() == key))
        };
        self.scratch = es;
        self.unlock_sealed(held).await?;
        self.local.borrow_mut().stats.leaf_splits += 1;
        self.remember(key, at.1.map(|i| (at.0, i)));
        self.insert_parent(1, sep, right, held.page, op).await
    }

    /// Puts separator `sep` → `child` into the page of `level` covering it
    /// (`left` is the page that split), splitting upward and growing the
    /// root as needed.
    async fn insert_parent(
        &mut self,
        mut level: u8,
        mut sep: Key,
        mut child: GlobalAddr,
        mut left: GlobalAddr,
        op: &mut OpGuard<'_>,
    ) -> Result<()> {
        let mut restarts = 0;
        let mut es: Vec<(Key, GlobalAddr)> = Vec::new();
        loop {
            if level > layout::MAX_LEVEL {
                return Err(ShermanError::Corrupt(format!("the tree grew past level {}", layout::MAX_LEVEL)));
            }
            let (rl, _) = self.root().await?;
            if rl < level {
                let (rl, root) = self.refresh_root().await?;
                if rl < level {
                    let entry = (root == left).then_some((sep, child));
                    if self.grow(rl, root, entry).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
            let mut at = self.descend(sep.as_slice(), level, Some(&mut *op)).await?;
            let mut min_low = Key::EMPTY;
            let held = loop {
                let held = self.lock_read(at, op).await?;
                let p = self.page.view();
                if p.merge_flags() & (layout::FLAG_MERGING | layout::FLAG_ABSORBING) != 0 {
                    let p = self.page.clone();
                    self.unlock(held, false).await?;
                    self.help_merge(at, &p, op).await?;
                    break None;
                }
                if p.is_dead() && p.level() == level {
                    let l = p.link();
                    self.unlock(held, false).await?;
                    (at, min_low) = (l, Key::EMPTY);
                    restarts += 1;
                    if restarts > MAX_RESTARTS || !self.is_page(l).await? {
                        break None;
                    }
                    continue;
                }
                let low = p.lowest();
                if p.level() == level && low <= sep && low >= min_low {
                    if !p.is_right_of(sep.as_slice()) {
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
                    return Err(ShermanError::Corrupt(format!("no page of level {level} takes separator {sep:?}")));
                }
                continue;
            };
            let p = self.page.view();
            es.clear();
            es.extend(p.live().map(|i| (p.key(i), p.child(i))));
            let n = es.len();
            let pos = es.partition_point(|e| e.0 < sep);
            if pos < n && es[pos].0 == sep {
                // Already there (a split is published once; be idempotent).
                return self.unlock(held, false).await;
            }
            es.insert(pos, (sep, child));
            let n = n + 1;
            if n <= self.f.internal.count {
                self.page.set_sorted(&es);
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
            let mut r = self.split_buf(level, sep2.as_slice(), high.as_ref().map(Key::as_slice), sibling);
            r.set_leftmost(c2);
            r.set_sorted(&es[mid + 1..n]);
            self.split = Some(r);
            let right = self.write_new_page().await;
            let right = self.or_unlock(held, right).await?;
            self.page.reset(level, lowest.as_slice(), Some(sep2.as_slice()), Some(right));
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
    async fn grow(&mut self, rl: u8, root: GlobalAddr, entry: Option<(Key, GlobalAddr)>) -> Result<bool> {
        let mut r = self.split_buf(rl + 1, &[], None, None);
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
mod tests;
