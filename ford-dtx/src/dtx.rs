//! A compute thread's handle on the database ([`Dtx`]): its view of the
//! address cache (see `cache`), which its coroutines share,
//! and its counters.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use smart_core::{Ctx, GlobalAddr};

use crate::cache::AddrCache;
use crate::db::Db;
use crate::layout::{Owner, MAX_REPLICAS};
use crate::registry::Registration;
use crate::txn::Txn;

/// A record's address on every replica (primary first).
pub type Loc = [GlobalAddr; MAX_REPLICAS];

/// Counters of a thread's transactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DtxStats {
    /// Address-cache hits (items found without reading their bucket).
    pub cache_hits: u64,
    /// Address-cache misses.
    pub cache_misses: u64,
    /// Cached addresses that held another key (a fingerprint shared by two
    /// keys): the item's bucket was read instead, or, for a locked item, the
    /// transaction aborted (counted as a validation abort).
    pub cache_stale: u64,
    /// Misses that READ one slot instead of the bucket: the first slot of
    /// the key's bucket whose key the cache did not know (free: the key is
    /// missing).
    pub slot_probes: u64,
    /// Probes that found another key's slot and read the bucket after all.
    pub slot_probes_taken: u64,
    /// Overflow buckets this thread added.
    pub chains_extended: u64,
    /// Transactions aborted (as validation aborts) because a written
    /// record's copy on a joining blade was not known yet
    /// ([`crate::db::Db::view`]).
    pub copies_unknown: u64,
}

impl DtxStats {
    /// Adds `o`.
    pub fn merge(&mut self, o: &DtxStats) {
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.cache_stale += o.cache_stale;
        self.slot_probes += o.slot_probes;
        self.slot_probes_taken += o.slot_probes_taken;
        self.chains_extended += o.chains_extended;
        self.copies_unknown += o.copies_unknown;
    }
}

pub(crate) struct Shared {
    pub(crate) ctx: Ctx,
    pub(crate) db: Arc<Db>,
    pub(crate) owner: u16,
    pub(crate) nonce: u64,
    pub(crate) logs: [GlobalAddr; crate::layout::MAX_REPLICAS],
    pub(crate) log_coroutines: u64,
    pub(crate) cache: RefCell<AddrCache>,
    pub(crate) stats: RefCell<DtxStats>,
    pub(crate) lost: Arc<std::sync::atomic::AtomicBool>,
}

/// A compute thread's handle on the database: the address cache its
/// coroutines share, and its place in the registration. Cheap to clone.
#[derive(Clone)]
pub struct Dtx(pub(crate) Rc<Shared>);

impl std::fmt::Debug for Dtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dtx").field("owner", &self.0.owner).field("thread", &self.0.ctx.thread()).finish()
    }
}

impl Registration {
    /// The handle of worker thread `ctx.thread()` of this compute blade.
    /// Make its runtime with [`Registration::runtime_config`], so that the
    /// memory blades can refuse its verbs once a recovery took this compute
    /// blade for dead (without it, they cannot: [`smart_core::fence`]).
    ///
    /// # Panics
    /// If the thread is beyond those registered.
    pub fn open_thread(&self, ctx: Ctx) -> Dtx {
        assert!(ctx.thread() < self.info.threads as usize, "thread {} was not registered", ctx.thread());
        Dtx(Rc::new(Shared {
            ctx,
            db: self.db.clone(),
            owner: self.info.slot,
            nonce: self.info.claim,
            logs: self.info.logs,
            log_coroutines: self.info.coroutines,
            cache: RefCell::new(AddrCache::new(self.prints.clone())),
            stats: RefCell::new(DtxStats::default()),
            lost: self.lost_flag(),
        }))
    }
}

impl Dtx {
    /// The runtime handle.
    pub fn ctx(&self) -> &Ctx {
        &self.0.ctx
    }

    /// The database.
    pub fn db(&self) -> &Arc<Db> {
        &self.0.db
    }

    /// Counters so far.
    pub fn stats(&self) -> DtxStats {
        *self.0.stats.borrow()
    }

    /// Coroutine `coroutine`'s transaction object (reused for every
    /// transaction the coroutine runs).
    ///
    /// # Panics
    /// If the coroutine is beyond those registered.
    pub fn txn(&self, coroutine: usize) -> Txn {
        assert!((coroutine as u64) < self.0.log_coroutines, "coroutine {coroutine} was not registered");
        let s = &self.0;
        let ring = crate::registry::rings(&s.logs, s.log_coroutines, &s.db, s.ctx.thread(), coroutine);
        let owner = Owner { blade: s.owner, thread: s.ctx.thread() as u16, coroutine: coroutine as u16 };
        Txn::new(self.clone(), owner, ring)
    }
}
