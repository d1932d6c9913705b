//! # sherman-bt: the Sherman B+tree on one-sided verbs (Smart-BT)
//!
//! A B+tree in disaggregated memory after Sherman (Wang et al., SIGMOD
//! '22), with Smart-BT's changes (Ren et al., ASPLOS '24): per-line
//! sequence numbers for torn-read safety and speculative lookup; and what
//! an index for real data needs beyond the papers: byte-string keys of up
//! to 256 bytes, values of up to 4 KiB (long ones out of line), pages
//! merged and freed after deletes, and dropped trees reclaimed. Layout in
//! [`layout`].
//!
//! * **Sizes** are the tree's, fixed when it is created ([`Format`]: the
//!   longest key, 8 to 256 bytes, and the longest value, 8 bytes to 4 KiB;
//!   [`ShermanBt::open_or_create_with`]). Keys are byte strings of any
//!   length up to that, ordered lexicographically (the `*_u64` helpers
//!   store numbers as 8 big-endian bytes, so number order is byte order).
//!   The page size follows from the sizes: the least power of two, 1 to
//!   8 KiB, that holds [`layout::MIN_FANOUT`] entries of either kind.
//! * **Values** of up to [`layout::INLINE_MAX`] bytes live in the leaf
//!   (when the tree's longest value is that small); longer ones live in a
//!   KV block ([`smart_core::kvblock`]: key, value, CRC) written whole
//!   before the leaf entry that names it and never changed after; an
//!   update writes a new block and retires the old one, a delete retires
//!   it. A reader checks the block's CRC and that it holds its key: a
//!   block of another key means the entry changed since it was read, and
//!   the lookup starts again.
//! * **Pages** spread round-robin over the memory blades; B-link right
//!   siblings on every level; internal pages sorted, leaves unsorted; the
//!   root word (level and page) in a named root, changed by CAS.
//! * **Reads are lock-free**: a page is accepted only when every 64-byte
//!   line carries the same sequence number and passes its check; a torn
//!   copy is read again ([`TORN_RETRIES`] times at most, then
//!   [`ShermanError::Torn`]). A writer rewrites the whole page with the
//!   next sequence number. An entry longer than a line spans lines, each
//!   checked.
//! * **Search**: the index cache (level-1 pages by key range, per thread)
//!   names the leaf: one READ; else a descent from the root. A reader that
//!   finds its key at or beyond the page's `highest` follows the sibling
//!   (the page split meanwhile) and drops the stale cache entry.
//! * **Writes** (insert, update, upsert, delete): lock the leaf with HOCL
//!   ([`lock`]) and read it in one doorbell [CAS, READ]; modify; write the
//!   page and release the lock in one doorbell [WRITE page, CAS tag → 0]
//!   (Sherman's command combination; Sherman releases with a WRITE of 0,
//!   see [`lock`] for why a CAS), or hand the lock to a local waiter.
//!   A page is never modified by a client that does not hold its lock; a
//!   client holds two locks only to merge, taken in lock-word order.
//! * **Splits**: a full leaf is sorted and its upper half moved to a new
//!   right sibling, which is written (and the WRITE completed) before the
//!   page that links it; then the separator goes into the parent level the
//!   same way, splitting upward as needed. When the level above does not
//!   exist yet, the splitter writes a new root whose leftmost child is the
//!   current root and CASes the root word from the current one; whoever
//!   loses the CAS uses the winner's root. So any number of writers can
//!   grow a tree from one empty leaf (Sherman's issue #26 was a root split
//!   racing inserts in a small tree).
//! * **Merges**: a delete that leaves a page with fewer than
//!   [`MERGE_BELOW`] of its slots live merges it with its neighbour under
//!   the same parent, right into left, when their entries fill at most
//!   [`MERGE_FILL`] of one page (no borrowing); a parent left underfull by
//!   the separator's removal merges the same way, up to the level below
//!   the root (the tree never gets lower). Holding both pages' locks, the
//!   merger writes, each WRITE completed before the next: R marked
//!   *merging* (linked to L); L with R's entries, range and sibling, marked
//!   *absorbing* (linked to R); R *dead* (empty, linked to L); L plain.
//!   Then it removes R's separator from the parent and frees R. Readers
//!   read merging and absorbing pages as any page (neither changes until
//!   the merge ends, and both hold the same entries for R's range), and
//!   pass from a dead page to the page its link names, which covers its
//!   range. A writer that locks a marked page finishes the merge first (or
//!   undoes it, if L took inserts since and R no longer fits, or L is in a
//!   merge of its own), finding R's left neighbour by its keys, not
//!   through R's link (L may have split, or been merged away and freed,
//!   since the merger that marked R died).
//! * **Freeing**: a page merged away and unlinked from its parent is
//!   counted in the tree meta (pages freed), then retired to smart-core's
//!   reclamation ([`smart_core::reclaim`]): reused, as a page or a block,
//!   once no operation that could reach it runs. Every operation pins the
//!   epoch; at the first operation of a thread in a new epoch it reads the
//!   meta and, if pages were freed since, drops its index cache (page
//!   addresses kept between operations). The speculative cache needs no
//!   dropping: what it names is accepted only as lines of a leaf holding
//!   the key in a valid entry. [`ShermanBt::drop_tree`] marks the meta
//!   dropped, waits until every client has seen two epochs after that,
//!   and retires every page, block and lock table.
//! * **Range scan** walks the leaf chain from the leaf holding `start`,
//!   reading each leaf once (its out-of-line values in one doorbell per
//!   blade). Guarantees: keys come in strictly increasing byte order, each
//!   leaf's part is one consistent snapshot of that leaf, and a key present
//!   for the whole scan is returned (each leaf is read after its left
//!   neighbour, whose `highest` equals its `lowest`; a split only moves
//!   keys to a page further right, which the walk reaches; a merge moves
//!   them left only into a page whose range grows over them, which a reader
//!   arriving at the dead page is sent back to). A scan is not one
//!   snapshot across leaves: a key inserted or deleted during the scan may
//!   or may not appear.
//! * **Speculative lookup** (`spec-lookup` in the runtime's Smart
//!   techniques): a per-thread cache key (by hash) → (leaf, entry); a
//!   lookup READs only that entry's line(s) and accepts them when they
//!   pass their checks, carry one sequence number that marks a leaf, and
//!   hold the key in a valid entry. Why that is enough: a key lives in one
//!   live entry (a split writes the moved half to the new leaf before the
//!   rewrite of the old leaf clears it there, and nobody can change the new
//!   leaf before that rewrite links it; a merge's copies are frozen until
//!   the dead page is cleared), and lines that pass their checks with one
//!   number are one version. Otherwise the normal path runs and refreshes
//!   the cache.
//!
//! **A client that dies** (SIGKILL at any instant) can leave: a lock word
//! held, taken over by the next waiter after [`LOCK_LEASE`]; a new page
//! written but not linked, or a value block written but not named (leaked
//! memory); a split linked on its level but its separator missing in the
//! parent (searches still find every key through the sibling chain;
//! [`ShermanBt::walk`] counts such pages); a new root written but not
//! installed (leaked); a merge cut after any step (its pages marked: the
//! next writer to lock one finishes it; [`TreeShape::merging`]); a page
//! merged away whose separator is still in its parent (readers pass
//! through it; [`TreeShape::dead_named`]: once its link no longer leads
//! to its keys, because the page it names was merged away and freed in
//! turn, the first descent that meets it removes the separator and frees
//! it, counted in `dead_repairs`); retired
//! blocks and pages it held for reuse (its reclaimer's local bags). Page
//! WRITEs are single WRs; a memory blade applies each request whole (TCP)
//! or the RNIC completes it, so no torn page is left behind on those
//! transports. The takeover is a timing argument like every lease. A
//! holder renews its lock word (a new tag, by CAS from its own) before a
//! page WRITE when half a lease passed since its tag was written, and if
//! the lock was taken over meanwhile (it stalled and was taken for dead)
//! it writes nothing and starts its operation over
//! ([`ShermanError::LeaseLost`], counted in `lease_losses`); only a stall
//! between that check and the WRITE, which have no wait in between, could
//! still overwrite a page another client took over.
//!
//! ## Limits
//! * A tree's sizes are fixed at creation; a key or value beyond them is
//!   refused with [`ShermanError::Size`].
//! * No borrowing between neighbours, no merging across parents, and the
//!   root never goes down a level: a tree emptied by deletes keeps its
//!   height and one page per level.
//! * At most [`layout::MAX_BLADES`] memory blades per tree (lock tables
//!   named in the tree meta).
//! * The index cache, the local lock table and the speculative cache are
//!   per thread, where Sherman's are per compute blade. The index cache holds
//!   at most [`cache::INDEX_CACHE_BYTES`] of level-1 pages (8 MiB, the
//!   parents of some ten million keys' leaves at the paper's sizes); a
//!   larger tree's lookups descend from the root more often. Frees in a
//!   delete-heavy run drop it about once per epoch (2 ms). The speculative
//!   cache holds [`cache::SPEC_ENTRIES`] keys (4 MiB).
//! * A thread stalled for longer than the reclamation lease in the middle
//!   of an operation may be taken for dead and read a page reused
//!   meanwhile; page checks catch all but a reused page that is a valid
//!   page again (then its range check decides), as for race-ht's blocks.
//!
//! ## Example
//!
//! A tree on an embedded blade for keys of up to 24 bytes and values of up
//! to 1 000 (longer than 128 bytes: out of line), used through
//! [`smart_core::KvIndex`].
//!
//! ```
//! use smart_core::index::Pairs;
//! use smart_core::{EmbeddedTransport, KvIndex, Runtime, RuntimeConfig};
//! let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
//! let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
//! let ctx = rt.ctx();
//! rt.block_on(async move {
//!     let f = sherman_bt::Format::new(24, 1000).unwrap();
//!     let (mut tree, _) = sherman_bt::ShermanBt::open_or_create_with(&ctx, "doc", f).await.unwrap();
//!     for k in 0u64..100 {
//!         let value = vec![k as u8; 10 + k as usize * 9];
//!         tree.insert(format!("user{k:03}").as_bytes(), &value).await.unwrap();
//!     }
//!     let mut out = Pairs::default();
//!     let n = KvIndex::scan(&mut tree, b"user04", 5, &mut out).await.unwrap();
//!     assert_eq!(n, 5);
//!     assert_eq!(out.get(0).0, b"user040");
//!     assert_eq!(out.get(0).1, &vec![40u8; 370][..]);
//! });
//! ```

#![warn(missing_docs)]

pub mod cache;
pub mod layout;
pub mod lock;

mod check;
mod drop;
mod error;
mod index;
mod merge;
mod ops;
mod read;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use smart_core::reclaim::Reclaimer;
use smart_core::{Ctx, GlobalAddr};

pub use check::TreeShape;
pub use drop::Dropped;
pub use error::{Result, ShermanError};
pub use index::ShermanStats;
pub use layout::Format;
pub use lock::{LOCK_LEASE, MAX_HANDOVERS};
pub use merge::{MERGE_BELOW, MERGE_FILL};

use cache::{IndexCache, SpecCache};
use layout::{Meta, PageBuf};
use lock::LocalLocks;

/// Re-reads of a torn page before giving up.
pub const TORN_RETRIES: usize = 256;

/// What a thread's handles share: caches, the local lock table, counters.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) cache: IndexCache,
    pub(crate) spec: Option<SpecCache>,
    pub(crate) locks: LocalLocks,
    pub(crate) stats: ShermanStats,
    /// This thread's copy of the root word.
    pub(crate) root: Option<u64>,
    pub(crate) next_blade: usize,
    pub(crate) acquisitions: u32,
    /// The epoch at which the meta was last checked (freed pages, drop).
    pub(crate) checked_epoch: u64,
    /// The lapses of the reclaimer then.
    pub(crate) lapses: u64,
    /// The meta's count of pages freed then.
    pub(crate) frees: u64,
}

/// A handle on a tree for one coroutine (cheap to clone; clones share the
/// thread's caches, local locks and counters).
#[derive(Debug)]
pub struct ShermanBt {
    pub(crate) ctx: Ctx,
    /// The tree meta.
    pub(crate) meta: GlobalAddr,
    /// The tree's sizes and layout.
    pub(crate) f: Format,
    /// Lock table per blade.
    pub(crate) locks: Rc<[GlobalAddr]>,
    pub(crate) local: Rc<RefCell<Local>>,
    /// Where pages and the KV blocks of out-of-line values come from and go
    /// back to.
    pub(crate) reclaim: Rc<Reclaimer>,
    /// This thread's id in lock words (random, nonzero).
    pub(crate) client: u32,
    /// The page this handle is modifying.
    pub(crate) page: PageBuf,
    /// The new sibling of a split (allocated at the first split).
    pub(crate) split: Option<PageBuf>,
    /// Bytes this handle has read (its share of the thread's counter).
    pub(crate) read: Cell<u64>,
    /// A KV block being written or read (reused).
    pub(crate) block: Vec<u8>,
    /// Entries of a leaf being split or scanned (reused).
    pub(crate) scratch: Vec<(layout::Key, layout::Field)>,
}

impl Clone for ShermanBt {
    fn clone(&self) -> Self {
        ShermanBt {
            ctx: self.ctx.clone(),
            meta: self.meta,
            f: self.f,
            locks: self.locks.clone(),
            local: self.local.clone(),
            reclaim: self.reclaim.clone(),
            client: self.client,
            page: PageBuf::empty(self.f),
            split: None,
            read: Cell::new(0),
            block: Vec::new(),
            scratch: Vec::new(),
        }
    }
}

pub(crate) fn root_name(name: &str) -> String {
    format!("sherman:{name}")
}

impl ShermanBt {
    /// Whether tree `name` exists on the blades.
    ///
    /// # Errors
    /// Verb errors.
    pub async fn exists(ctx: &Ctx, name: &str) -> Result<bool> {
        Ok(ctx.root(0, &root_name(name)).await?.is_some())
    }

    /// Opens tree `name`, creating it for the paper's sizes (8-byte keys
    /// and values) if it does not exist; see
    /// [`ShermanBt::open_or_create_with`].
    ///
    /// # Errors
    /// As [`ShermanBt::open_or_create_with`].
    pub async fn open_or_create(ctx: &Ctx, name: &str) -> Result<(ShermanBt, bool)> {
        Self::open_or_create_with(ctx, name, Format::paper()).await
    }

    /// Opens tree `name`, creating it with format `f` (one empty leaf, a
    /// lock table on every blade) if it does not exist. Concurrent creators
    /// agree on one tree. An existing tree keeps the sizes it was made
    /// with, whatever `f` says. Returns the handle and whether the tree
    /// existed.
    ///
    /// # Errors
    /// More blades than [`layout::MAX_BLADES`]; another object under the
    /// name, or a tree of an older layout; verb and allocation errors.
    pub async fn open_or_create_with(ctx: &Ctx, name: &str, f: Format) -> Result<(ShermanBt, bool)> {
        let blades = ctx.blades().len();
        if blades > layout::MAX_BLADES {
            return Err(ShermanError::Config(format!(
                "a tree spans at most {} memory blades ({blades} given)",
                layout::MAX_BLADES
            )));
        }
        let root = root_name(name);
        let (meta, existed) = match ctx.root(0, &root).await? {
            Some(m) => (m, true),
            None => {
                let mine = Self::create(ctx, name, f).await?;
                let won = ctx.set_root(0, &root, mine).await?;
                (won, won != mine)
            }
        };
        let mut b = [0u8; layout::META];
        ctx.read(meta, &mut b).await?;
        if b[..8] == layout::OLD_META_MAGIC.to_le_bytes() {
            return Err(ShermanError::Config(format!(
                "{root:?} is a B+tree of the layout before byte-string keys: drop it and load it again"
            )));
        }
        let m = Meta::decode(&b).ok_or_else(|| ShermanError::Corrupt(format!("{root:?} is not a B+tree")))?;
        let f = m.format().map_err(|e| ShermanError::Corrupt(format!("{root:?}: {e}")))?;
        if m.locks.len() > blades {
            return Err(ShermanError::Config(format!(
                "tree {name:?} spans {} blades but only {blades} are connected",
                m.locks.len()
            )));
        }
        let client = (ctx.clock().nonce(ctx.thread() as u64) as u32).max(1);
        let spec = ctx.config().smart.spec_lookup.then(SpecCache::new);
        let local = Local {
            cache: IndexCache::new(f),
            spec,
            locks: LocalLocks::default(),
            stats: ShermanStats::default(),
            root: None,
            next_blade: ctx.thread(),
            acquisitions: 0,
            checked_epoch: u64::MAX,
            lapses: 0,
            frees: 0,
        };
        let reclaim = Reclaimer::new(ctx);
        let t = ShermanBt {
            ctx: ctx.clone(),
            meta,
            f,
            locks: m.locks.into(),
            local: Rc::new(RefCell::new(local)),
            reclaim,
            client,
            page: PageBuf::empty(f),
            split: None,
            read: Cell::new(0),
            block: Vec::new(),
            scratch: Vec::new(),
        };
        Ok((t, existed))
    }

    /// The tree's sizes and layout.
    pub fn format(&self) -> &Format {
        &self.f
    }

    /// Writes a new tree (lock tables, one empty leaf as the root, the
    /// meta) and returns its meta, not yet published.
    async fn create(ctx: &Ctx, name: &str, f: Format) -> Result<GlobalAddr> {
        let mut locks = Vec::new();
        let zero = vec![0u8; (layout::LOCK_SLOTS * 8) as usize];
        for b in 0..ctx.blades().len() {
            let t = ctx.alloc(b as u16, layout::LOCK_SLOTS * 8, 4096).await?;
            // Heap memory is zero when first handed out; written anyway, so
            // a tree never depends on that.
            ctx.write_all(t, &zero).await?;
            locks.push(t);
        }
        let leaf = ctx.alloc(0, f.page as u64, f.page.min(4096) as u64).await?;
        let mut p = PageBuf::empty(f);
        p.seal(0);
        ctx.write(leaf, &p.b[..]).await?;
        let meta = Meta {
            root: layout::root_word(0, leaf),
            locks,
            sizes: (f.key_max, f.value_max),
            name: ctx.write_name(0, name).await?,
        };
        let at = ctx.alloc(0, layout::META as u64, 64).await?;
        ctx.write(at, &meta.encode()).await?;
        Ok(at)
    }

    /// Checks that a key (and a value) are ones this tree stores.
    pub(crate) fn check_sizes(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        let v = value.map_or(0, <[u8]>::len);
        if key.len() > self.f.key_max || v > self.f.value_max {
            return Err(ShermanError::Size {
                key: key.len(),
                value: v,
                key_max: self.f.key_max,
                value_max: self.f.value_max,
            });
        }
        Ok(())
    }

    /// A new page's address (a freed page reused, or fresh memory): blades
    /// in turn.
    pub(crate) async fn alloc_page(&mut self) -> Result<GlobalAddr> {
        let blade = self.next_blade();
        Ok(self.reclaim.alloc(&self.ctx, blade, self.f.page as u64).await?)
    }

    /// The next blade in this thread's turn.
    pub(crate) fn next_blade(&self) -> u16 {
        let mut l = self.local.borrow_mut();
        l.next_blade = (l.next_blade + 1) % self.locks.len();
        l.next_blade as u16
    }
}
