//! # sherman-bt: the Sherman B+tree on one-sided verbs (Smart-BT)
//!
//! A B+tree in disaggregated memory after Sherman (Wang et al., SIGMOD
//! '22), with Smart-BT's changes (Ren et al., ASPLOS '24): per-line
//! sequence numbers for torn-read safety and speculative lookup. Layout in
//! [`layout`]; keys and values are 8 bytes (see [Limits](#limits)).
//!
//! * **Pages** of 1 KiB spread round-robin over the memory blades; B-link
//!   right siblings on every level; internal pages sorted, leaves unsorted;
//!   the root word (level and page) in a named root, changed by CAS.
//! * **Reads are lock-free**: a page is accepted only when every 64-byte
//!   line carries the same sequence number and passes its check; a torn
//!   copy is read again ([`TORN_RETRIES`] times at most, then
//!   [`ShermanError::Torn`]). A writer rewrites the whole page with the
//!   next sequence number.
//! * **Search**: the index cache (level-1 pages by key range, per thread)
//!   names the leaf: one READ; else a descent from the root. A reader that
//!   finds its key at or beyond the page's `highest` follows the sibling
//!   (the page split meanwhile) and drops the stale cache entry.
//! * **Writes** (insert, update, upsert, delete): lock the leaf with HOCL
//!   ([`lock`]) and read it in one doorbell [CAS, READ]; modify; write the
//!   page and release the lock in one doorbell [WRITE page, CAS tag → 0]
//!   (Sherman's command combination; Sherman releases with a WRITE of 0,
//!   see [`lock`] for why a CAS), or hand the lock to a local waiter.
//!   A page is never modified by a client that does not hold its lock, and
//!   a client never holds two locks.
//! * **Splits**: a full leaf is sorted and its upper half moved to a new
//!   right sibling, which is written (and the WRITE completed) before the
//!   page that links it; then the separator goes into the parent level the
//!   same way, splitting upward as needed. When the level above does not
//!   exist yet, the splitter writes a new root whose leftmost child is the
//!   current root and CASes the root word from the current one; whoever
//!   loses the CAS uses the winner's root. So any number of writers can
//!   grow a tree from one empty leaf (Sherman's issue #26 was a root split
//!   racing inserts in a small tree).
//! * **Delete** clears the entry's valid bit. Pages never merge and are
//!   never freed (as in Sherman): an emptied leaf stays in the chain.
//! * **Range scan** walks the leaf chain from the leaf holding `start`,
//!   reading each leaf once. Guarantees: keys come in strictly increasing
//!   order, each leaf's part is one consistent snapshot of that leaf, and a
//!   key present for the whole scan is returned (each leaf is read after
//!   its left neighbour, whose `highest` equals its `lowest`, and a split
//!   only moves keys to a page further right, which the walk reaches).
//!   A scan is not one snapshot across leaves: a key inserted or deleted
//!   during the scan may or may not appear.
//! * **Speculative lookup** (`spec-lookup` in the runtime's Smart
//!   techniques): a per-thread cache key → (leaf, entry); a lookup READs
//!   only that entry's 64-byte line and accepts it when the line passes its
//!   check, its sequence number marks a leaf, and the entry is valid and
//!   holds the key. Why that is enough: pages are never freed, a key lives
//!   in exactly one live entry (a split writes the moved half to the new
//!   leaf before the rewrite of the old leaf clears it there, and nobody
//!   can change the new leaf before that rewrite links it), and a line that
//!   passes its check is one version of the line. Otherwise the normal path
//!   runs and refreshes the cache.
//!
//! **A client that dies** (SIGKILL at any instant) can leave: a lock word
//! held, taken over by the next waiter after [`LOCK_LEASE`]; a new page
//! written but not linked (leaked memory); a split linked on its level but
//! its separator missing in the parent (searches still find every key
//! through the sibling chain; [`ShermanBt::walk`] counts such pages); a new
//! root written but not installed (leaked). Page WRITEs are single WRs; a
//! memory blade applies each request whole (TCP) or the RNIC completes it,
//! so no torn page is left behind on those transports. The takeover is a
//! timing argument like every lease. A holder renews its lock word (a new
//! tag, by CAS from its own) before a page WRITE when half a lease passed
//! since its tag was written, and if the lock was taken over meanwhile (it
//! stalled and was taken for dead) it writes nothing and starts its
//! operation over ([`ShermanError::LeaseLost`], counted in `lease_losses`);
//! only a stall between that check and the WRITE, which have no wait in
//! between, could still overwrite a page another client took over.
//!
//! ## Limits
//! * Keys and values are exactly 8 bytes (the paper's setting); keys are
//!   little-endian `u64`s ordered as numbers. Other sizes are refused with
//!   [`ShermanError::Size`] (Sherman breaks on values of 512 bytes or more;
//!   out-of-place values are not built).
//! * At most [`layout::MAX_BLADES`] memory blades per tree (lock tables
//!   named in the tree meta).
//! * The index cache, the local lock table and the speculative cache are
//!   per thread, where Sherman's are per compute blade. The index cache holds
//!   at most [`cache::INDEX_CACHE_PAGES`] level-1 pages (about 8 MiB, the
//!   parents of some ten million keys' leaves); a larger tree's lookups
//!   descend from the root more often. The speculative cache holds
//!   [`cache::SPEC_ENTRIES`] keys (4 MiB).
//!
//! ## Example
//!
//! A tree on an embedded blade, used through [`smart_core::KvIndex`]: 8-byte
//! keys (little-endian `u64`s, in numeric order) and 8-byte values.
//!
//! ```
//! use smart_core::index::Pairs;
//! use smart_core::{EmbeddedTransport, KvIndex, Runtime, RuntimeConfig};
//! let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
//! let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
//! let ctx = rt.ctx();
//! rt.block_on(async move {
//!     let (mut tree, _) = sherman_bt::ShermanBt::open_or_create(&ctx, "doc").await.unwrap();
//!     for k in 0u64..100 {
//!         tree.insert(&k.to_le_bytes(), &(k * 10).to_le_bytes()).await.unwrap();
//!     }
//!     let mut out = Pairs::default();
//!     let n = tree.scan(&40u64.to_le_bytes(), 5, &mut out).await.unwrap();
//!     assert_eq!(n, 5);
//!     assert_eq!(out.get(0).1, &400u64.to_le_bytes()[..]);
//! });
//! ```

#![warn(missing_docs)]

pub mod cache;
pub mod layout;
pub mod lock;

mod check;
mod error;
mod index;
mod ops;
mod read;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use smart_core::{Ctx, GlobalAddr};

pub use check::TreeShape;
pub use error::{Result, ShermanError};
pub use index::ShermanStats;
pub use lock::{LOCK_LEASE, MAX_HANDOVERS};

use cache::{IndexCache, SpecCache};
use layout::{Meta, PageBuf, PAGE};
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
}

/// A handle on a tree for one coroutine (cheap to clone; clones share the
/// thread's caches, local locks and counters).
#[derive(Debug)]
pub struct ShermanBt {
    pub(crate) ctx: Ctx,
    /// The tree meta.
    pub(crate) meta: GlobalAddr,
    /// Lock table per blade.
    pub(crate) locks: Rc<[GlobalAddr]>,
    pub(crate) local: Rc<RefCell<Local>>,
    /// This thread's id in lock words (random, nonzero).
    pub(crate) client: u32,
    /// The page this handle is modifying.
    pub(crate) page: PageBuf,
    /// The new sibling of a split (allocated at the first split).
    pub(crate) split: Option<PageBuf>,
    /// Bytes this handle has read (its share of the thread's counter).
    pub(crate) read: Cell<u64>,
    /// The pairs of the last scan (reused).
    pub(crate) scanned: Vec<(u64, u64)>,
}

impl Clone for ShermanBt {
    fn clone(&self) -> Self {
        ShermanBt {
            ctx: self.ctx.clone(),
            meta: self.meta,
            locks: self.locks.clone(),
            local: self.local.clone(),
            client: self.client,
            page: PageBuf::new(0, 0, None, None),
            split: None,
            read: Cell::new(0),
            scanned: Vec::new(),
        }
    }
}

fn root_name(name: &str) -> String {
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

    /// Opens tree `name`, creating it (one empty leaf, a lock table on
    /// every blade) if it does not exist. Concurrent creators agree on one
    /// tree. Returns the handle and whether the tree existed.
    ///
    /// # Errors
    /// More blades than [`layout::MAX_BLADES`]; another object under the
    /// name; verb and allocation errors.
    pub async fn open_or_create(ctx: &Ctx, name: &str) -> Result<(ShermanBt, bool)> {
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
                let mine = Self::create(ctx, name).await?;
                let won = ctx.set_root(0, &root, mine).await?;
                (won, won != mine)
            }
        };
        let mut b = [0u8; layout::META];
        ctx.read(meta, &mut b).await?;
        let m = Meta::decode(&b).ok_or_else(|| ShermanError::Corrupt(format!("{root:?} is not a B+tree")))?;
        if m.locks.len() > blades {
            return Err(ShermanError::Config(format!(
                "tree {name:?} spans {} blades but only {blades} are connected",
                m.locks.len()
            )));
        }
        let client = (ctx.clock().nonce(ctx.thread() as u64) as u32).max(1);
        let spec = ctx.config().smart.spec_lookup.then(SpecCache::new);
        let local = Local {
            cache: IndexCache::default(),
            spec,
            locks: LocalLocks::default(),
            stats: ShermanStats::default(),
            root: None,
            next_blade: ctx.thread(),
            acquisitions: 0,
        };
        let t = ShermanBt {
            ctx: ctx.clone(),
            meta,
            locks: m.locks.into(),
            local: Rc::new(RefCell::new(local)),
            client,
            page: PageBuf::new(0, 0, None, None),
            split: None,
            read: Cell::new(0),
            scanned: Vec::new(),
        };
        Ok((t, existed))
    }

    /// Writes a new tree (lock tables, one empty leaf as the root, the
    /// meta) and returns its meta, not yet published.
    async fn create(ctx: &Ctx, name: &str) -> Result<GlobalAddr> {
        let mut locks = Vec::new();
        let zero = vec![0u8; (layout::LOCK_SLOTS * 8) as usize];
        for b in 0..ctx.blades().len() {
            let t = ctx.alloc(b as u16, layout::LOCK_SLOTS * 8, 4096).await?;
            // Heap memory is zero when first handed out; written anyway, so
            // a tree never depends on that.
            ctx.write_all(t, &zero).await?;
            locks.push(t);
        }
        let leaf = ctx.alloc(0, PAGE as u64, PAGE as u64).await?;
        let mut p = PageBuf::new(0, 0, None, None);
        p.seal(0);
        ctx.write(leaf, &p.0[..]).await?;
        let meta = Meta { root: layout::root_word(0, leaf), locks, name: ctx.write_name(0, name).await? };
        let at = ctx.alloc(0, layout::META as u64, 64).await?;
        ctx.write(at, &meta.encode()).await?;
        Ok(at)
    }

    /// Checks that a key and a value are ones this tree stores.
    pub(crate) fn key_of(key: &[u8], value: Option<&[u8]>) -> Result<u64> {
        match (key.len(), value.map(<[u8]>::len)) {
            (8, None | Some(8)) => Ok(u64::from_le_bytes(key.try_into().expect("8 bytes"))),
            (k, v) => Err(ShermanError::Size { key: k, value: v.unwrap_or(8) }),
        }
    }

    /// A new page's address: blades in turn.
    pub(crate) async fn alloc_page(&mut self) -> Result<GlobalAddr> {
        let blade = {
            let mut l = self.local.borrow_mut();
            l.next_blade = (l.next_blade + 1) % self.locks.len();
            l.next_blade
        };
        Ok(self.ctx.alloc(blade as u16, PAGE as u64, PAGE as u64).await?)
    }
}
