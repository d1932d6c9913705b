//! Dropping a tree and giving its memory back.

use serde::Serialize;
use smart_core::Ctx;

use crate::check::Collect;
use crate::layout::{self, DROPPED_MAGIC, META_MAGIC};
use crate::{root_name, Result, ShermanBt, ShermanError};

/// What [`ShermanBt::drop_tree`] gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Dropped {
    /// Pages retired (every level, and pages merged away still named).
    pub pages: usize,
    /// Out-of-line value blocks retired.
    pub blocks: usize,
    /// Bytes retired in all (with the lock tables).
    pub bytes: u64,
}

/// How long a drop waits for every client to see an epoch after it: more
/// than the reclamation lease, after which a client that does not publish
/// is taken for dead.
const WAIT_NS: u64 = 3 * smart_core::reclaim::LEASE.as_nanos() as u64;

impl ShermanBt {
    /// Drops tree `name`: marks its meta dropped (the meta stays, as a
    /// tombstone), waits until every client has seen two epochs after that
    /// (so no operation that began before still runs, and every later one
    /// fails with [`ShermanError::Dropped`] when it checks the meta, at its
    /// first operation in a new epoch), then retires every page, every
    /// value block and the lock tables, to be reused once no operation can
    /// reach them, and unsets the name. Returns `None` if there is no such
    /// tree.
    ///
    /// # Errors
    /// [`ShermanError::Dropped`] if another client is dropping it; clients
    /// that keep the epoch from moving for longer than three reclamation
    /// leases; a malformed tree; verb errors.
    pub async fn drop_tree(ctx: &Ctx, name: &str) -> Result<Option<Dropped>> {
        let root = root_name(name);
        if ctx.root(0, &root).await?.is_none() {
            return Ok(None);
        }
        let (mut t, _) = Self::open_or_create(ctx, name).await?;
        let old = ctx.cas(t.meta, META_MAGIC, DROPPED_MAGIC).await?;
        if old != META_MAGIC {
            return Err(ShermanError::Dropped);
        }
        t.reclaim.refresh(ctx).await?;
        let (target, t0) = (t.reclaim.epoch() + 2, ctx.now_ns());
        while t.reclaim.epoch() < target {
            if ctx.now_ns().saturating_sub(t0) > WAIT_NS {
                return Err(ShermanError::Config(format!(
                    "tree {name:?} is marked dropped, but its pages are not retired: clients kept the reclamation \
                     epoch from moving for {} s",
                    WAIT_NS / 1_000_000_000
                )));
            }
            ctx.sleep_ns(1_000_000).await;
            t.reclaim.refresh(ctx).await?;
        }
        let mut all = Collect::default();
        t.walk_collecting(Some(&mut all)).await?;
        let mut out = Dropped::default();
        for &at in &all.pages {
            t.reclaim.retire(at, t.f.page as u64);
            out.pages += 1;
            out.bytes += t.f.page as u64;
        }
        for &(at, n) in &all.blocks {
            t.reclaim.retire(at, n);
            out.blocks += 1;
            out.bytes += n;
        }
        for &at in t.locks.iter() {
            t.reclaim.retire(at, layout::LOCK_SLOTS * 8);
            out.bytes += layout::LOCK_SLOTS * 8;
        }
        ctx.drop_root(0, &root).await?;
        t.close().await?;
        Ok(Some(out))
    }
}
