//! Reading every key of a quiescent table, checking its structure.

use crate::directory::{slots_of, word};
use crate::layout::{self, Slot, BUCKET};
use crate::{RaceError, RaceHt, Result};

impl RaceHt {
    /// Every key in the table, read slot by slot from the current
    /// directory's subtables (a key in two slots appears twice), for
    /// checking a quiescent table: it fails on a frozen slot, a bucket
    /// header that disagrees with the directory, a key in the wrong
    /// subtable, or a block that does not decode.
    ///
    /// # Errors
    /// Those; verb errors.
    pub async fn keys(&mut self) -> Result<Vec<Vec<u8>>> {
        self.reload_dir().await?;
        let (groups, subtables) = {
            let d = self.dir.borrow();
            (d.groups, d.subtables().collect::<Vec<_>>())
        };
        let mut keys = Vec::new();
        for (suffix, ld, at) in subtables {
            let mut img = vec![0u8; layout::subtable_bytes(groups) as usize];
            self.ctx.read_all(at, &mut img).await?;
            if let Some(b) = img.chunks(BUCKET as usize).position(|b| word(b, 0) != layout::bucket_header(ld, suffix)) {
                return Err(RaceError::Corrupt(format!("bucket {b} of subtable {at}: bad header")));
            }
            if slots_of(&img).any(|(_, sl)| sl.is_frozen()) {
                return Err(RaceError::Corrupt(format!("a frozen slot in live subtable {at}")));
            }
            let occupied: Vec<(usize, Slot)> = slots_of(&img).filter(|(_, sl)| !sl.is_empty()).collect();
            for blk in self.read_blocks(at.blade(), &occupied).await? {
                let (k, _) = layout::decode_block(&blk).expect("read_blocks returns whole blocks");
                if layout::suffix(layout::hashes(k).0, ld) != suffix {
                    return Err(RaceError::Corrupt(format!("a key in subtable {at} of the wrong suffix")));
                }
                keys.push(k.to_vec());
            }
        }
        Ok(keys)
    }
}
