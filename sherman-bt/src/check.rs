//! The structural check of a quiescent tree: every level walked along its
//! sibling chain.

use rustc_hash::FxHashMap;
use serde::Serialize;
use smart_core::GlobalAddr;

use crate::layout::{Key, PageBuf};
use crate::read::with_page;
use crate::{Result, ShermanBt, ShermanError};

/// A tree's shape, read from the blades.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TreeShape {
    /// Levels (1 for a single leaf).
    pub depth: u32,
    /// Pages per level, leaves first.
    pub pages_per_level: Vec<u64>,
    /// Live keys.
    pub keys: u64,
    /// Live entries over leaf capacity.
    pub leaf_fill: f64,
    /// Pages on their level's chain that no parent names (a split whose
    /// separator was never inserted: its client died, or it is in flight).
    pub unlinked: u64,
    /// Pages merged away that a parent still names (a merge whose client
    /// died before it removed the separator): readers pass through them.
    pub dead_named: u64,
    /// Pages in a merge not finished (its client died, or it is in
    /// flight): the next writer to lock one finishes it.
    pub merging: u64,
    /// Bytes of the tree's pages (dead ones still named included) and of
    /// its out-of-line values' blocks.
    pub live_bytes: u64,
}

/// What a walk collects besides the keys.
#[derive(Default)]
pub(crate) struct Collect {
    /// Every page (on a chain, or merged away and still named).
    pub(crate) pages: Vec<GlobalAddr>,
    /// Every out-of-line value's block (address, bytes).
    pub(crate) blocks: Vec<(GlobalAddr, u64)>,
}

/// Most pages a level may have before the walk calls it a cycle.
const MAX_PAGES: u64 = 1 << 40;

impl ShermanBt {
    /// Walks the whole tree (which should be quiescent) and checks it:
    /// every level's chain starts at key 0 and ends at +∞ with each page's
    /// `lowest` equal to its left neighbour's `highest`; levels step down by
    /// one; internal entries are sorted and inside their page's range;
    /// every child a parent names is on the level below, starting at the
    /// separator that names it; every leaf key lies in its leaf's range.
    /// Returns the shape and every live key (a key stored twice appears
    /// twice).
    ///
    /// # Errors
    /// [`ShermanError::Corrupt`] naming the first fault; verb errors.
    pub async fn walk(&mut self) -> Result<(TreeShape, Vec<Vec<u8>>)> {
        self.walk_collecting(None).await
    }

    /// [`ShermanBt::walk`], also collecting every page and value block.
    pub(crate) async fn walk_collecting(&mut self, mut all: Option<&mut Collect>) -> Result<(TreeShape, Vec<Vec<u8>>)> {
        let (top, root) = self.refresh_root().await?;
        let mut shape = TreeShape { depth: u32::from(top) + 1, ..TreeShape::default() };
        let mut keys = Vec::new();
        // Children named by the level above: address → the lowest key
        // they must start at.
        let mut named: FxHashMap<u64, Key> = FxHashMap::default();
        named.insert(root.raw(), Key::EMPTY);
        let mut first = root;
        let mut buf = PageBuf::empty(self.f);
        let bad = |m: String| Err(ShermanError::Corrupt(m));
        for level in (0..=top).rev() {
            let mut below: FxHashMap<u64, Key> = FxHashMap::default();
            // Pages that pages of this chain are absorbing (a merge cut
            // between the absorbing page's WRITE and the merged one's).
            let mut absorbed: Vec<GlobalAddr> = Vec::new();
            let (mut at, mut expect_low, mut pages, mut next_first) = (Some(first), Key::EMPTY, 0u64, None);
            while let Some(a) = at {
                pages += 1;
                if pages > MAX_PAGES {
                    return bad(format!("level {level} does not end (a sibling cycle?)"));
                }
                with_page(&self.ctx, &self.local, &self.read, (a, self.f), |p| buf.copy_from(p)).await?;
                let p = buf.view();
                if let Some(c) = all.as_deref_mut() {
                    c.pages.push(a);
                }
                shape.live_bytes += self.f.page as u64;
                if p.is_dead() {
                    return bad(format!("page {a} on the chain of level {level} was merged away"));
                }
                if p.merge_flags() != 0 {
                    shape.merging += 1;
                }
                if p.merge_flags() == crate::layout::FLAG_ABSORBING {
                    absorbed.push(p.link());
                }
                if p.level() != level {
                    return bad(format!("page {a} on the chain of level {level} says level {}", p.level()));
                }
                if p.lowest() != expect_low {
                    return bad(format!(
                        "page {a} of level {level} starts at {:?} after a page ending at {expect_low:?}",
                        p.lowest()
                    ));
                }
                match named.remove(&a.raw()) {
                    Some(low) if low != p.lowest() => {
                        return bad(format!("page {a} is named for keys from {low:?} but starts at {:?}", p.lowest()))
                    }
                    Some(_) => {}
                    None => shape.unlinked += 1,
                }
                if level == 0 {
                    for i in p.live() {
                        let k = p.key(i);
                        if !p.covers(k.as_slice()) {
                            return bad(format!("leaf {a} holds key {k:?} outside its range"));
                        }
                        keys.push(k.as_slice().to_vec());
                        let mut vb = [0u8; crate::layout::INLINE_MAX];
                        if let crate::layout::Value::Block(at, len) = p.value(i, &mut vb) {
                            let n = smart_core::kvblock::block_len(k.as_slice().len(), len) as u64;
                            shape.live_bytes += n;
                            if let Some(c) = all.as_deref_mut() {
                                c.blocks.push((at, n));
                            }
                        }
                    }
                } else {
                    let mut prev: Option<Key> = None;
                    below.insert(p.leftmost().raw(), p.lowest());
                    next_first.get_or_insert(p.leftmost());
                    for i in p.live() {
                        let k = p.key(i);
                        if prev.is_some_and(|q| q >= k) || !p.covers(k.as_slice()) {
                            return bad(format!("internal page {a} has entry {k:?} out of order or range"));
                        }
                        prev = Some(k);
                        below.insert(p.child(i).raw(), k);
                    }
                }
                match (p.highest(), p.sibling()) {
                    (None, None) => at = None,
                    (Some(h), Some(s)) if h > p.lowest() => {
                        expect_low = h;
                        at = Some(s);
                    }
                    (h, s) => return bad(format!("page {a} ends at {h:?} with sibling {s:?}")),
                }
            }
            // Named but not on the chain: only a page merged away whose
            // separator is still in its parent may be, or one a page of
            // the chain is absorbing (still marked merging).
            for (&a, _) in named.iter() {
                let a = GlobalAddr::from_raw(a);
                let (dead, merging) = with_page(&self.ctx, &self.local, &self.read, (a, self.f), |p| {
                    (p.is_dead() && p.level() == level, p.merge_flags() == crate::layout::FLAG_MERGING)
                })
                .await?;
                if merging && absorbed.contains(&a) {
                    shape.merging += 1;
                } else if dead {
                    shape.dead_named += 1;
                } else {
                    return bad(format!("page {a} named by level {} is not on level {level}'s chain", level + 1));
                }
                shape.live_bytes += self.f.page as u64;
                if let Some(c) = all.as_deref_mut() {
                    c.pages.push(a);
                }
            }
            shape.pages_per_level.push(pages);
            if level == 0 {
                shape.keys = keys.len() as u64;
                shape.leaf_fill = keys.len() as f64 / (pages as f64 * self.f.leaf.count as f64);
            } else {
                first = next_first.expect("an internal level has pages");
                named = below;
            }
        }
        shape.pages_per_level.reverse();
        // The root itself is named by the root word, not by a parent.
        Ok((shape, keys))
    }
}
