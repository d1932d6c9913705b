//! Reading every key of a quiescent table, checking its structure.

use serde::Serialize;

use crate::directory::{slots_of, word};
use crate::layout::{self, Slot, BUCKET, TABLE_HEADER};
use crate::{RaceError, RaceHt, Result};

/// What [`RaceHt::check`] finds in a table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TableCheck {
    /// Global depth.
    pub depth: u32,
    /// Live subtables.
    pub subtables: usize,
    /// Keys stored (a key stored twice counts twice).
    pub keys: u64,
    /// Keys stored more than once.
    pub duplicates: u64,
    /// Frozen slots in live subtables (a split left unfinished).
    pub frozen_slots: u64,
    /// Keys in a subtable their hash does not lead to.
    pub misplaced: u64,
    /// Slots naming a block that does not decode.
    pub undecodable: u64,
    /// Buckets whose header disagrees with the directory.
    pub bad_headers: u64,
    /// A publication intent is set (a split being published, or one a dead
    /// client left: the next client to publish a split, or `repair`,
    /// finishes it).
    pub split_intent: bool,
    /// The directory lock is held (a split being published, or a dead
    /// publisher's lock: taken over after the lease by the next publisher).
    pub resize_lock_held: bool,
    /// Live subtables whose split lock is held (a split in progress, or a
    /// dead splitter's lock: taken over after the lease by the next client
    /// that meets the subtable frozen or full, or by `repair`). Not a
    /// fault by itself: a subtable with no frozen slot works as before.
    pub split_locks_held: u64,
    /// Bytes the table uses: header, directory, live subtables, the
    /// blocks their slots name.
    pub live_bytes: u64,
}

impl TableCheck {
    /// Faults found (0 for a sound, quiescent table).
    pub fn faults(&self) -> u64 {
        self.duplicates + self.frozen_slots + self.misplaced + self.undecodable + self.bad_headers
    }
}

impl RaceHt {
    /// Every key in the table, read slot by slot from the current
    /// directory's subtables (a key in two slots appears twice), for
    /// checking a quiescent table: it fails on a frozen slot, a bucket
    /// header that disagrees with the directory, a key in the wrong
    /// subtable, or a block that does not decode.
    ///
    /// # Errors
    /// Those (with [`TableCheck`]'s counts); verb errors.
    pub async fn keys(&mut self) -> Result<Vec<Vec<u8>>> {
        let (c, keys) = self.scan_all().await?;
        if c.faults() > c.duplicates {
            return Err(RaceError::Corrupt(format!(
                "{} frozen slots in live subtables, {} misplaced keys, {} undecodable blocks, {} bad bucket headers",
                c.frozen_slots, c.misplaced, c.undecodable, c.bad_headers
            )));
        }
        Ok(keys)
    }

    /// Reads every live subtable and every block its slots name, and counts
    /// what is wrong instead of stopping at the first fault (see
    /// [`TableCheck`]); meant for a quiescent table.
    ///
    /// # Errors
    /// Verb errors; a malformed header or directory.
    pub async fn check(&mut self) -> Result<TableCheck> {
        Ok(self.scan_all().await?.0)
    }

    /// The check and every key stored (a key stored twice, twice).
    /// Started over if the thread lapsed meanwhile (see [`RaceHt::get`]).
    async fn scan_all(&mut self) -> Result<(TableCheck, Vec<Vec<u8>>)> {
        self.unlapsed(false, async |ht| ht.scan_once().await).await
    }

    async fn scan_once(&mut self) -> Result<(TableCheck, Vec<Vec<u8>>)> {
        let _pin = self.begin().await?;
        self.reload_dir().await?;
        let (groups, depth, subtables) = {
            let d = self.dir.borrow();
            (d.groups, d.depth, d.subtables().collect::<Vec<_>>())
        };
        let mut c = TableCheck { depth, subtables: subtables.len(), ..TableCheck::default() };
        c.live_bytes = TABLE_HEADER + (8u64 << depth) + subtables.len() as u64 * layout::subtable_bytes(groups);
        let mut keys = Vec::new();
        for (suffix, ld, at) in subtables {
            let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
            self.ctx.read_all(at, &mut img).await?;
            let split_line = img.split_off(layout::bucket_bytes(groups) as usize);
            c.split_locks_held += u64::from(word(&split_line, 0) != 0);
            c.bad_headers +=
                img.chunks(BUCKET as usize).filter(|b| word(b, 0) != layout::bucket_header(ld, suffix)).count() as u64;
            c.frozen_slots += slots_of(&img).filter(|(_, sl)| sl.is_frozen()).count() as u64;
            let occupied: Vec<(usize, Slot)> =
                slots_of(&img).map(|(off, sl)| (off, sl.thawed())).filter(|(_, sl)| !sl.is_empty()).collect();
            for (blk, (_, sl)) in self.read_blocks(at.blade(), &occupied, true).await?.into_iter().zip(&occupied) {
                c.live_bytes += sl.block_len() as u64;
                let Some(blk) = blk else {
                    c.undecodable += 1;
                    continue;
                };
                let (k, _) = layout::decode_block(&blk).expect("read_blocks returns whole blocks");
                if layout::suffix(layout::hashes(k).0, ld) != suffix {
                    c.misplaced += 1;
                }
                keys.push(k.to_vec());
            }
        }
        c.keys = keys.len() as u64;
        let audit = smart_core::Audit { keys };
        c.duplicates = audit.duplicates();
        let keys = audit.keys;
        c.split_intent = self.ctx.read_u64(self.table.add(layout::INTENT_WORD)).await? != 0;
        c.resize_lock_held = self.ctx.read_u64(self.table.add(layout::LOCK_WORD)).await? != 0;
        Ok((c, keys))
    }
}
