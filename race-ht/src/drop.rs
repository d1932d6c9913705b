//! Dropping a table and giving its memory back.

use std::collections::HashSet;

use smart_core::reclaim::Reclaimer;
use smart_core::{Ctx, GlobalAddr};

use crate::directory::slots_of;
use crate::layout::{self, DROPPED_LOCK, DROPPED_MAGIC, LOCK_WORD, OLDER_MAGIC, OLD_MAGIC, TABLE_MAGIC};
use crate::{RaceError, RaceHt, Result};

/// What [`RaceHt::drop_table`] gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// Subtables retired (with the directory array, and halves a split in
    /// progress had built).
    pub subtables: usize,
    /// KV blocks retired.
    pub blocks: usize,
    /// Bytes retired in all.
    pub bytes: u64,
}

impl RaceHt {
    /// Drops table `name`: takes its directory lock for good (waiting for a
    /// live publication to end, taking a dead holder's lock over after its
    /// lease, finishing a publication it left), freezes every slot so that no client changes the table any more,
    /// marks the header dropped, unsets the name, and retires every
    /// subtable, every block and the directory, to be reused once no
    /// operation can reach them. Clients that still hold the table get
    /// [`RaceError::Dropped`] at their next operation in a new epoch (the
    /// header is kept, as a tombstone). Returns `None` if there is no such
    /// table.
    ///
    /// # Errors
    /// Verb errors; a malformed table.
    pub async fn drop_table(ctx: &Ctx, name: &str) -> Result<Option<Dropped>> {
        let root = format!("race-ht:{name}");
        if ctx.root(0, &root).await?.is_none() {
            return Ok(None);
        }
        let mut t = Self::open(ctx, name).await?;
        let _pin = Reclaimer::pin(&t.reclaim, ctx).await?;
        // The directory lock, for good: no split is published any more (a
        // splitter that waits for it stops with `Dropped`). A publication a
        // dead client left is finished first, so that the directory names
        // every subtable.
        let mut dl = t.dir_lock(None).await?;
        t.finish_intent(GlobalAddr::NULL, &mut dl).await?;
        let old = ctx.cas(t.table.add(LOCK_WORD), dl.cur, DROPPED_LOCK).await?;
        if old != dl.cur {
            return Err(RaceError::LeaseLost(old));
        }
        t.reload_dir().await?;
        let (groups, depth, array, subtables) = {
            let d = t.dir.borrow();
            (d.groups, d.depth, d.array, d.subtables().map(|(_, _, at)| at).collect::<Vec<_>>())
        };
        let mut out = Dropped::default();
        let mut blocks = HashSet::new();
        for &at in &subtables {
            // Frozen, the slots are final: a client's CAS either landed
            // before (and its block is here) or fails.
            let img = t.freeze(at, groups, None).await?;
            for (_, sl) in slots_of(&img) {
                let sl = sl.thawed();
                if !sl.is_empty() && blocks.insert(sl.addr()) {
                    t.reclaim.retire(sl.addr(), sl.block_len() as u64);
                    out.blocks += 1;
                    out.bytes += sl.block_len() as u64;
                }
            }
        }
        // Halves a split in progress built and recorded but did not publish
        // (the directory lock is ours for good: it never will), with the
        // blocks it copied for them.
        let mut halves = Vec::new();
        for &at in &subtables {
            let mut line = [0u8; 16];
            ctx.read(layout::split_halves(at, groups), &mut line).await?;
            for c in line.chunks(8) {
                let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
                let half = layout::unpack_entry(w).1;
                if w != 0 && !subtables.contains(&half) && !halves.contains(&half) {
                    halves.push(half);
                }
            }
        }
        for &at in &halves {
            let img = t.freeze(at, groups, None).await?;
            for (_, sl) in slots_of(&img) {
                let sl = sl.thawed();
                if !sl.is_empty() && blocks.insert(sl.addr()) {
                    t.reclaim.retire(sl.addr(), sl.block_len() as u64);
                    out.blocks += 1;
                    out.bytes += sl.block_len() as u64;
                }
            }
            t.reclaim.retire(at, layout::subtable_bytes(groups));
            out.subtables += 1;
            out.bytes += layout::subtable_bytes(groups);
        }
        let old = ctx.cas(t.table, TABLE_MAGIC, DROPPED_MAGIC).await?;
        if old != TABLE_MAGIC {
            return Err(RaceError::Corrupt(format!("{name:?}: header magic {old:#x} while dropping")));
        }
        ctx.drop_root(0, &root).await?;
        for at in subtables {
            t.reclaim.retire(at, layout::subtable_bytes(groups));
            out.subtables += 1;
            out.bytes += layout::subtable_bytes(groups);
        }
        t.reclaim.retire(array, 8 << depth);
        out.bytes += 8 << depth;
        drop(_pin);
        t.close().await?;
        Ok(Some(out))
    }
}

/// Whether a header word says the table was dropped.
pub(crate) fn check_magic(magic: u64, table: GlobalAddr) -> Result<()> {
    match magic {
        TABLE_MAGIC => Ok(()),
        DROPPED_MAGIC => Err(RaceError::Dropped),
        OLD_MAGIC | OLDER_MAGIC => Err(RaceError::Corrupt(format!(
            "at {table}: a table of an older race-ht format ({}); drop the blade's data and load it again",
            String::from_utf8_lossy(&magic.to_le_bytes())
        ))),
        _ => Err(RaceError::Corrupt(format!("at {table}: bad table header"))),
    }
}
