//! Validated page reads and the descent from the root.

use std::cell::{Cell, RefCell};

use smart_core::runtime::OpGuard;
use smart_core::{Ctx, GlobalAddr};

use crate::layout::{show_key, Format, Key, PageRef};
use crate::{Local, Result, ShermanBt, ShermanError, TORN_RETRIES};

/// First pause after a torn read (doubling to [`TORN_PAUSE_MAX_NS`]).
const TORN_PAUSE_NS: u64 = 1_000;
const TORN_PAUSE_MAX_NS: u64 = 200_000;

/// READs page `at` and applies `f` to it once it validates (every line
/// intact and of one sequence number). A torn copy is read again, pausing
/// a little longer each time, at most [`TORN_RETRIES`] times.
///
/// # Errors
/// [`ShermanError::Torn`] when every copy was torn; verb errors.
pub(crate) async fn with_page<T>(
    ctx: &Ctx,
    local: &RefCell<Local>,
    read: &Cell<u64>,
    (at, fmt): (GlobalAddr, Format),
    f: impl FnOnce(PageRef<'_>) -> T,
) -> Result<T> {
    check_link(ctx, at, fmt.page)?;
    let mut pause = TORN_PAUSE_NS;
    for _ in 0..TORN_RETRIES {
        let mut b = ctx.batch();
        let r = b.read(at, fmt.page);
        let done = b.post().await?;
        read.set(read.get() + fmt.page as u64);
        if let Some(p) = PageRef::check(done.bytes(r), fmt) {
            return Ok(f(p));
        }
        drop(done);
        local.borrow_mut().stats.torn += 1;
        ctx.sleep_ns(pause).await;
        pause = (pause * 2).min(TORN_PAUSE_MAX_NS);
    }
    Err(ShermanError::Torn(at))
}

/// [`with_page`] for a page reached through a dead page's link when
/// `linked`: the page the link named may have been merged away, freed and
/// reused (as a block) since, so a copy that never validates is `None`
/// (the caller starts again from the root), not [`ShermanError::Torn`].
pub(crate) async fn with_linked_page<T>(
    ctx: &Ctx,
    local: &RefCell<Local>,
    read: &Cell<u64>,
    (at, fmt): (GlobalAddr, Format),
    linked: bool,
    f: impl FnOnce(PageRef<'_>) -> T,
) -> Result<Option<T>> {
    match with_page(ctx, local, read, (at, fmt), f).await {
        Err(ShermanError::Torn(_)) if linked => Ok(None),
        r => r.map(Some),
    }
}

/// `Err` unless the page address `at`, read from a page or the root word
/// (remote memory any client can write), lies whole in a blade's heap.
///
/// # Errors
/// [`ShermanError::Corrupt`] naming the address and what is wrong with it.
pub(crate) fn check_link(ctx: &Ctx, at: GlobalAddr, page: usize) -> Result<()> {
    smart_core::layout::check_heap_place(ctx.blades(), at, page as u64)
        .map_err(|why| ShermanError::Corrupt(format!("a page link holds {at}, which {why}")))
}

/// What a descent does at a page (on the stack: a key inline, no
/// allocation).
#[allow(clippy::large_enum_variant)]
enum Step {
    /// To the sibling, which starts at the key given (this page's end).
    Right(GlobalAddr, Key),
    /// A page merged away (starting at the key given): to the page that
    /// took its range.
    Left(GlobalAddr, Key),
    Down(GlobalAddr),
    Here,
    Restart,
}

/// Restarts from the root before a descent gives up.
const MAX_RESTARTS: u32 = 64;

impl ShermanBt {
    /// The page of `level` whose range holds `key`, found from the root by
    /// lock-free reads (moving right past pages that split meanwhile).
    /// Level-1 pages met on the way enter the index cache.
    ///
    /// A page merged away that a parent still names (its merger died, or
    /// could not remove the separator), whose link no longer leads to its
    /// keys (the page it names was merged away and freed since), is
    /// removed from the parent (with `op`, the caller's operation, or a new
    /// one) and freed; then the descent starts again.
    ///
    /// # Errors
    /// [`ShermanError::Corrupt`] if the tree is lower than `level` or keeps
    /// contradicting itself; verb errors.
    pub(crate) async fn descend(
        &mut self,
        key: &[u8],
        level: u8,
        mut op: Option<&mut OpGuard<'_>>,
    ) -> Result<GlobalAddr> {
        let mut restarts = 0;
        'root: loop {
            let (mut lvl, mut at) = self.root().await?;
            if lvl < level {
                return Err(ShermanError::Corrupt(format!("the tree has no level {level} (root at level {lvl})")));
            }
            let top = lvl;
            // Where the page moved right from ended: a right sibling starts
            // there (a link leading back restarts, never cycles).
            let mut min_low = Key::EMPTY;
            // A dead page reached from its parent: its address and lowest.
            let (mut came_down, mut via_dead) = (false, None);
            // Whether `at` is a dead page's link.
            let mut linked = false;
            loop {
                let local = &self.local;
                let step = with_linked_page(&self.ctx, local, &self.read, (at, self.f), linked, |p| {
                    use std::cmp::Ordering::{Greater, Less};
                    if p.is_dead() && p.level() == lvl {
                        Step::Left(p.link(), p.lowest())
                    } else if p.level() != lvl
                        || p.lowest_cmp(key) == Greater
                        || p.lowest_cmp(min_low.as_slice()) == Less
                    {
                        Step::Restart
                    } else if p.is_right_of(key) {
                        match (p.sibling(), p.highest()) {
                            (Some(s), Some(h)) => Step::Right(s, h),
                            _ => Step::Restart,
                        }
                    } else if lvl == level {
                        Step::Here
                    } else {
                        if lvl == 1 {
                            local.borrow_mut().cache.insert(p);
                        }
                        Step::Down(p.child_for(key))
                    }
                })
                .await?
                .unwrap_or(Step::Restart);
                match step {
                    Step::Here => return Ok(at),
                    Step::Down(c) => {
                        (at, min_low) = (c, Key::EMPTY);
                        lvl -= 1;
                        (came_down, via_dead, linked) = (true, None, false);
                    }
                    Step::Left(l, dead_low) => {
                        // Bounded like restarts: a link cannot send a
                        // descent round for ever.
                        restarts += 1;
                        self.local.borrow_mut().stats.left_hops += 1;
                        if restarts > MAX_RESTARTS {
                            return Err(ShermanError::Corrupt(format!(
                                "no page of level {level} holds key {} after {MAX_RESTARTS} moves and descents",
                                show_key(key)
                            )));
                        }
                        if came_down {
                            via_dead = Some((at, dead_low));
                        }
                        (at, min_low, came_down, linked) = (l, Key::EMPTY, false, true);
                    }
                    Step::Right(s, high) => {
                        (came_down, linked) = (false, false);
                        min_low = high;
                        self.local.borrow_mut().stats.sibling_hops += 1;
                        if lvl == top {
                            // The root split: a higher root will do better.
                            self.local.borrow_mut().root = None;
                        }
                        at = s;
                    }
                    Step::Restart => {
                        if let Some((dead, dead_low)) = via_dead.take() {
                            // Not a page that took the dead one's keys: the
                            // parent's entry goes.
                            self.local.borrow_mut().stats.dead_repairs += 1;
                            match op.as_deref_mut() {
                                Some(g) => {
                                    Box::pin(self.unlink(lvl, dead_low, dead, g)).await?;
                                }
                                None => {
                                    let ctx = self.ctx.clone();
                                    let mut g = ctx.op().await;
                                    Box::pin(self.unlink(lvl, dead_low, dead, &mut g)).await?;
                                }
                            }
                        }
                        restarts += 1;
                        self.local.borrow_mut().stats.restarts += 1;
                        self.local.borrow_mut().root = None;
                        if restarts > MAX_RESTARTS {
                            return Err(ShermanError::Corrupt(format!(
                                "no page of level {level} holds key {} after {MAX_RESTARTS} descents",
                                show_key(key)
                            )));
                        }
                        continue 'root;
                    }
                }
            }
        }
    }

    /// Whether `at`, a dead page's link, still holds a page (of any kind):
    /// read lock-free before a writer locks it, since the page the link
    /// named may have been freed and reused as a block since.
    pub(crate) async fn is_page(&self, at: GlobalAddr) -> Result<bool> {
        Ok(with_linked_page(&self.ctx, &self.local, &self.read, (at, self.f), true, |_| ()).await?.is_some())
    }

    /// Counts `n` bytes this handle read (a lookup's bytes are the
    /// difference across it).
    pub(crate) fn count_read(&self, n: usize) {
        self.read.set(self.read.get() + n as u64);
    }

    /// The root (level, page), from this thread's copy of the root word or
    /// read from the blade.
    pub(crate) async fn root(&mut self) -> Result<(u8, GlobalAddr)> {
        if let Some(r) = self.local.borrow().root {
            return Ok(crate::layout::unpack_root(r));
        }
        self.refresh_root().await
    }

    /// Reads the root word from the blade.
    pub(crate) async fn refresh_root(&mut self) -> Result<(u8, GlobalAddr)> {
        let w = self.ctx.read_u64(self.meta.add(crate::layout::ROOT_WORD)).await?;
        self.count_read(8);
        let (lvl, at) = crate::layout::unpack_root(w);
        if at.is_null() || lvl > crate::layout::MAX_LEVEL {
            return Err(ShermanError::Corrupt(format!("root word {w:#x}")));
        }
        self.local.borrow_mut().root = Some(w);
        Ok((lvl, at))
    }

    /// The leaf to start from for `key`: the index cache's child for it
    /// (one READ away), else a descent from the root. The leaf may have
    /// split since: callers move right.
    pub(crate) async fn leaf_for(&mut self, key: &[u8], op: Option<&mut OpGuard<'_>>) -> Result<GlobalAddr> {
        let hit = {
            let mut l = self.local.borrow_mut();
            let hit = l.cache.child(key);
            if hit.is_some() {
                l.stats.cache_hits += 1;
            } else {
                l.stats.cache_misses += 1;
            }
            hit
        };
        match hit {
            Some(a) => Ok(a),
            None => self.descend(key, 0, op).await,
        }
    }
}
