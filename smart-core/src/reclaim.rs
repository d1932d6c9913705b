//! Memory that comes back: epoch-based reclamation across compute blades,
//! with free lists on the memory blades that every client and every later
//! process reuses.
//!
//! An application that replaces objects out of place (race-ht's KV blocks,
//! its subtables and directories) *retires* what it unlinked and allocates
//! through a [`Reclaimer`], one per thread. A retired object is handed out
//! again only when no client can still hold a reference to it, by the rule
//! of epoch-based reclamation (Fraser, "Practical lock-freedom", 2004),
//! with the epochs kept on blade 0 so that clients of every process take
//! part.
//!
//! ```text
//! epoch area   root "smart:epochs" on blade 0
//!              [magic u64][global epoch E u64][capacity u64]
//!              [high-water mark u64][0 u64 × 4]                     64 bytes
//!              capacity × [owner: token:40 | beat:24][published epoch p]
//!              (E starts at 1; an entry publishing 0 is being claimed or
//!              left, and has no operation; entries at or above the
//!              high-water mark were never claimed, so a refresh reads
//!              only the entries below it; an area whose capacity word is 0
//!              was made with 128 entries and no mark, and is read whole)
//! free area    root "smart:free" on every blade
//!              CLASSES × [lines u64][head: tag:24 | offset:40]
//!              class c in 1..=64 holds blocks of c 64-byte lines (its
//!              lines word is 0); class 0 holds spans of any length; classes
//!              65.. are claimed by CAS of their lines word, one per larger
//!              size, exactly
//! bag          [next offset u64][epoch u64][count u64][lines u64]
//!              count × [offset:40 | lines:24]                     1024 bytes
//! ```
//!
//! **The rule.** Every operation *pins* the epoch its thread last saw, `e`
//! (a local counter, no verb). Every [`REFRESH_NS`] a thread reads the
//! epoch area, publishes `p` = the oldest epoch it has pinned operations in
//! (or the current epoch if none) with a beat, and advances `E → E + 1` by
//! CAS when every live client published `p ≥ E`. An object retired while
//! the thread saw epoch `r` is reused once every live client published
//! `p ≥ r + 2`. Why that suffices: while a client has an operation pinned
//! at `e`, its published `p ≤ e`, so `E ≤ e + 1`; an operation that could
//! have reached the object started before it was unlinked, hence pinned at
//! most `r + 1`, and it is still running only if some client publishes
//! `p ≤ r + 1`. A reference kept *between* operations (a cached directory,
//! a cache of slot addresses) is the application's to validate once per
//! epoch: race-ht re-checks its directory when the epoch moves.
//!
//! **Dead clients.** A registry entry that stays exactly the same for
//! [`LEASE`] (3 s, by the observer's clock) belongs to a client that died
//! (its thread bumps the beat at every refresh, by CAS from the word it
//! last wrote, so it never writes over an entry freed and claimed since):
//! it is ignored and freed. Like every lease, this is a timing argument: a
//! thread stalled for longer than the lease in the middle of an operation
//! may have been taken for dead, and may have read memory reused
//! meanwhile. It counts a *lapse* ([`Reclaimer::lapses`]) when it finds
//! its entry taken, and also when it went a lease without publishing (from
//! the clock read before one publication to the end of the next), since a
//! client that read its entry in between may have taken it for dead. An
//! operation asks [`Reclaimer::lapsed_since`] before it trusts what it
//! read (no verb unless the thread has been silent for a lease): race-ht
//! then starts the operation over and drops its caches; a client that
//! re-registers after a lapse takes a free entry.
//!
//! **Free lists.** Each thread keeps retired objects locally, by blade and
//! size class, in bags stamped with their epoch; a bag whose epoch is safe
//! becomes the thread's free list. A thread with more free blocks than it
//! needs, and every thread at [`Reclaimer::flush`] (the end of its run),
//! pushes bags onto the blade's list of that class (a Treiber stack whose
//! head carries a 24-bit tag against ABA); a thread that runs out pops a
//! whole bag (3 round trips per up to [`BAG_ENTRIES`] objects), if its
//! epoch is safe. Fresh memory comes from spans of [`SPAN`] bytes that a
//! thread takes from the blade's heap or from the span list, and whatever
//! is left of them at `flush` goes back to the span list.
//!
//! **What is lost.** A client killed before `flush` loses what it held
//! locally: the rest of its spans (under [`SPAN`] per blade it used) and
//! its unpushed bags (at most a few epochs of retirements and two bags per
//! class). Nothing else: every object another client can reach is in the
//! application's structure or in a blade's free list.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::{layout, Ctx, Error, GlobalAddr, Result};

/// Name of the epoch area's root (on blade 0).
pub const EPOCH_ROOT: &str = "smart:epochs";
/// Name of the free area's root (on every blade).
pub const FREE_ROOT: &str = "smart:free";
/// Magic word of the epoch area.
pub const EPOCH_MAGIC: u64 = u64::from_le_bytes(*b"SMARTEPO");
/// Registry entries of a new epoch area (clients at once, over every
/// process: 6 compute blades × 96 threads fit).
pub const REGISTRY: usize = 1024;
/// Registry entries of an epoch area made before the capacity word (its
/// capacity word is 0).
pub const REGISTRY_V1: usize = 128;
/// Offset of the capacity word in the epoch area.
const CAPACITY_WORD: u64 = 16;
/// Offset of the high-water mark in the epoch area.
const HIGH_WORD: u64 = 24;
/// Entries read beyond the last high-water mark seen, so that a refresh
/// usually needs one READ even while clients register.
const READ_SLACK: usize = 32;
/// Bytes of the epoch area's header.
pub const EPOCH_HEADER: u64 = 64;
/// Offset of the global epoch in the epoch area.
pub const EPOCH_WORD: u64 = 8;
/// Bytes of a registry entry.
pub const ENTRY: u64 = 16;
/// Size-class slots of a free area.
pub const CLASSES: usize = 128;
/// Classes 1..=`SMALL_LINES` are blocks of that many 64-byte lines.
pub const SMALL_LINES: u64 = 64;
/// Bytes of a bag.
pub const BAG: u64 = 1024;
/// Bytes of a bag's header.
pub const BAG_HEADER: usize = 32;
/// Objects per bag.
pub const BAG_ENTRIES: usize = (BAG as usize - BAG_HEADER) / 8;
/// Bytes of a span of fresh memory.
pub const SPAN: u64 = 1 << 20;
/// How often a thread refreshes its view of the epochs.
pub const REFRESH_NS: u64 = 2_000_000;
/// How long [`Reclaimer::flush`] waits for what its thread retired to
/// become safe before it hands it over as it is.
pub const FLUSH_WAIT_NS: u64 = 100_000_000;
/// How long a registry entry may stay the same before its client counts as
/// dead.
pub const LEASE: std::time::Duration = std::time::Duration::from_secs(3);
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
const BEAT_BITS: u32 = 24;

/// What a thread's reclaimer did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimStats {
    /// Bytes retired.
    pub retired_bytes: u64,
    /// Bytes handed out again (from this thread's or a blade's free list).
    pub reused_bytes: u64,
    /// Bytes handed out from fresh spans.
    pub fresh_bytes: u64,
    /// Bytes taken from the blades' heaps (spans and large objects).
    pub heap_bytes: u64,
    /// Bags pushed to the blades' free lists.
    pub bags_pushed: u64,
    /// Bags popped from the blades' free lists.
    pub bags_popped: u64,
    /// Advances of the global epoch this thread made.
    pub advances: u64,
    /// Refreshes this thread made (every [`REFRESH_NS`] at most, each a
    /// few verbs of its own: tests that count an operation's verbs exactly
    /// measure windows without one).
    pub refreshes: u64,
    /// Registry entries of dead clients this thread freed.
    pub expired: u64,
    /// Times this thread found it may have been taken for dead (its entry
    /// freed, or silent for a lease): see [`Reclaimer::lapsed_since`].
    pub lapses: u64,
}

impl std::ops::AddAssign for ReclaimStats {
    fn add_assign(&mut self, o: Self) {
        self.retired_bytes += o.retired_bytes;
        self.reused_bytes += o.reused_bytes;
        self.fresh_bytes += o.fresh_bytes;
        self.heap_bytes += o.heap_bytes;
        self.bags_pushed += o.bags_pushed;
        self.bags_popped += o.bags_popped;
        self.advances += o.advances;
        self.refreshes += o.refreshes;
        self.expired += o.expired;
        self.lapses += o.lapses;
    }
}

/// Packs a free-list entry: offset and length in lines.
pub fn pack_free(offset: u64, lines: u64) -> u64 {
    assert!(offset <= OFFSET_MASK && lines < 1 << 24, "free entry {offset} {lines} does not fit");
    lines << OFFSET_BITS | offset
}

/// Unpacks [`pack_free`].
pub fn unpack_free(w: u64) -> (u64, u64) {
    (w & OFFSET_MASK, w >> OFFSET_BITS)
}

/// The class slot of blocks of `lines` lines, if it is a small class.
fn small_class(lines: u64) -> Option<usize> {
    (1..=SMALL_LINES).contains(&lines).then_some(lines as usize)
}

/// Objects of one size class on one blade, held by this thread.
#[derive(Debug, Default)]
struct Class {
    /// Reusable now (offsets).
    free: Vec<u64>,
    /// Retired, oldest first: (epoch, offsets); the last one fills.
    limbo: VecDeque<(u64, Vec<u64>)>,
    /// Emptied limbo vectors, kept so that retiring allocates nothing once
    /// warm.
    spare: Vec<Vec<u64>>,
    /// The refresh at which the blade's list was last found empty (or
    /// unsafe): no second look before the next refresh.
    dry_at: u64,
    /// A coroutine of this thread is popping a bag of this class: the
    /// others wait for it.
    popping: bool,
}

#[derive(Debug, Default)]
struct Blade {
    /// The free area, once resolved.
    area: Option<GlobalAddr>,
    small: Vec<Class>,
    big: HashMap<u64, Class>,
    /// Class slot of each large size (lines), once claimed.
    big_slots: HashMap<u64, Option<usize>>,
    /// The span being carved: [cur, end).
    span: (u64, u64),
    /// Other spans held (offset, lines), from the span list.
    spans: Vec<(u64, u64)>,
    /// A coroutine of this thread is getting a span: the others wait for
    /// it rather than take one each.
    refilling: bool,
}

impl Blade {
    /// Cuts the free object of `lines` lines at `at` into blocks of a bag's
    /// size, free for bags (the rest of a line count not a multiple of a
    /// bag's is left unused).
    fn cut_into_bags(&mut self, at: u64, lines: u64) {
        self.class(BAG / 64).free.extend((0..lines * 64 / BAG).map(|i| at + i * BAG));
    }

    fn class(&mut self, lines: u64) -> &mut Class {
        match small_class(lines) {
            Some(c) => {
                if self.small.len() <= c {
                    self.small.resize_with(c + 1, Class::default);
                }
                &mut self.small[c]
            }
            None => self.big.entry(lines).or_default(),
        }
    }
}

/// Per-epoch counts of pinned operations (in-flight epochs span at most
/// two values while the thread stays registered; four cells leave room).
#[derive(Debug, Default)]
struct Pins([(u64, u32); 4]);

impl Pins {
    /// Pins an operation at `epoch` (or, with every cell in use by other
    /// epochs, at the oldest pinned one: pinning older is always safe).
    fn pin(&mut self, epoch: u64) -> u64 {
        let cells = &mut self.0;
        let i = cells
            .iter()
            .position(|c| c.1 > 0 && c.0 == epoch)
            .or_else(|| cells.iter().position(|c| c.1 == 0))
            .unwrap_or_else(|| (0..4).min_by_key(|&i| cells[i].0).expect("four cells"));
        if cells[i].1 == 0 {
            cells[i].0 = epoch;
        }
        cells[i].1 += 1;
        cells[i].0
    }

    fn unpin(&mut self, epoch: u64) {
        let c = self.0.iter_mut().find(|c| c.1 > 0 && c.0 == epoch).expect("unpin of a pinned epoch");
        c.1 -= 1;
    }

    fn oldest(&self) -> Option<u64> {
        self.0.iter().filter(|c| c.1 > 0).map(|c| c.0).min()
    }
}

/// What this thread last saw of one registry entry, and since when.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    owner: u64,
    epoch: u64,
    since_ns: u64,
}

/// The smallest published epoch over the live entries of a registry
/// snapshot (`entries[i]` = (owner word, published epoch)), updating the
/// observer's `seen` record; entries unchanged for `lease_ns` are dead and
/// returned in `dead`. `own` is skipped (the caller adds its own epoch).
fn live_min(
    entries: &[(u64, u64)],
    seen: &mut [Seen],
    own: Option<usize>,
    now_ns: u64,
    lease_ns: u64,
    dead: &mut Vec<(usize, u64)>,
) -> Option<u64> {
    let mut min = None::<u64>;
    for (i, (&(owner, epoch), s)) in entries.iter().zip(seen.iter_mut()).enumerate() {
        if Some(i) == own || owner == 0 {
            *s = Seen::default();
            continue;
        }
        if s.owner != owner || s.epoch != epoch {
            *s = Seen { owner, epoch, since_ns: now_ns };
        } else if now_ns.saturating_sub(s.since_ns) >= lease_ns {
            dead.push((i, owner));
            continue;
        }
        // Epochs start at 1: a published 0 is a client between claiming its
        // entry and publishing (no operation yet), or one that died there.
        if epoch > 0 {
            min = Some(min.map_or(epoch, |m| m.min(epoch)));
        }
    }
    min
}

/// The epoch a thread publishes: the oldest it has operations pinned in,
/// or the one it last saw.
fn published_epoch(pins: &Pins, seen: u64) -> u64 {
    pins.oldest().map_or(seen, |o| o.min(seen))
}

/// The horizon: the smallest epoch published by any live client, this
/// thread's (`mine`) included.
fn horizon_of(other_min: Option<u64>, mine: u64) -> u64 {
    other_min.map_or(mine, |m| m.min(mine))
}

/// Whether an object retired at epoch `retired` may be reused under
/// `horizon` (the rule of the module docs: `retired + 2 ≤ horizon`).
fn reusable(retired: u64, horizon: u64) -> bool {
    retired.saturating_add(2) <= horizon
}

#[derive(Debug)]
struct State {
    token: u64,
    epochs: Option<GlobalAddr>,
    /// Entries of the epoch area (known once it is).
    capacity: usize,
    /// Its high-water mark when last read.
    high: usize,
    /// Registry entry and its current owner word.
    entry: Option<(usize, u64)>,
    beat: u64,
    /// The global epoch as last read.
    epoch: u64,
    /// The smallest epoch any live client published, as last computed:
    /// objects retired at `r` with `r + 2 ≤ horizon` are safe.
    horizon: u64,
    refreshes: u64,
    last_refresh_ns: Option<u64>,
    /// The clock just before this thread last published its entry
    /// (registration included), once that publication completed: no other
    /// client can take the entry for dead before this plus the lease.
    published_ns: Option<u64>,
    refreshing: bool,
    pins: Pins,
    seen: Vec<Seen>,
    lapses: u64,
    blades: Vec<Blade>,
    stats: ReclaimStats,
    lease_ns: u64,
}

/// A thread's part in reclamation (see the module docs): share it among the
/// thread's coroutines through an `Rc`.
#[derive(Debug)]
pub struct Reclaimer(RefCell<State>);

/// An operation's pin on its epoch; unpins on drop.
#[derive(Debug)]
pub struct Pin {
    r: Rc<Reclaimer>,
    epoch: u64,
}

impl Pin {
    /// The epoch this operation is pinned at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.r.0.borrow_mut().pins.unpin(self.epoch);
    }
}

/// Takes, or creates, the area named `root` on `blade` (`bytes` zeroed but
/// for its first words, `head`).
async fn area(ctx: &Ctx, blade: u16, root: &str, bytes: u64, head: &[u64]) -> Result<GlobalAddr> {
    if let Some(a) = ctx.root(blade, root).await? {
        return Ok(a);
    }
    let at = ctx.alloc(blade, bytes, 64).await?;
    let mut img = vec![0u8; bytes as usize];
    for (i, w) in head.iter().enumerate() {
        img[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    ctx.write_all(at, &img).await?;
    // The first creator wins; a loser's copy is left unused.
    ctx.set_root(blade, root, at).await
}

/// Bytes of a span on blade `b`: [`SPAN`], or 1/64 of a small blade.
fn span_bytes(ctx: &Ctx, b: usize) -> u64 {
    SPAN.min(ctx.blades()[b].size / 64).next_multiple_of(4096)
}

/// Checks that `bytes` bytes at `off` on `blade`, read from a free list,
/// are a 64-byte-aligned place in the blade's heap: a list damaged behind
/// the clients' backs is reported where it is read (never followed out of
/// bounds, nor handed out as memory to write).
fn in_heap(ctx: &Ctx, blade: u16, off: u64, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
    let size = ctx.blades()[usize::from(blade)].size;
    if off % 64 == 0 && layout::check_heap_place(ctx.blades(), GlobalAddr::new(blade, off), bytes).is_ok() {
        return Ok(());
    }
    Err(Error::Damaged {
        blade,
        what: format!(
            "{} at offset {off:#x} ({bytes} bytes), which is no place in the heap of a {size}-byte blade",
            what()
        ),
    })
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

impl Reclaimer {
    /// A reclaimer for a thread of `ctx`'s runtime (it registers on its
    /// first refresh).
    pub fn new(ctx: &Ctx) -> Rc<Reclaimer> {
        // Unique per client; reproducible under a simulation.
        let token = (ctx.clock().nonce(ctx.thread() as u64 ^ 0x7265_636c) & ((1 << (64 - BEAT_BITS)) - 1)).max(1);
        Rc::new(Reclaimer(RefCell::new(State {
            token,
            epochs: None,
            capacity: REGISTRY_V1,
            high: 0,
            entry: None,
            beat: 0,
            epoch: 0,
            horizon: 0,
            refreshes: 0,
            last_refresh_ns: None,
            published_ns: None,
            refreshing: false,
            pins: Pins::default(),
            seen: Vec::new(),
            lapses: 0,
            blades: (0..ctx.blades().len()).map(|_| Blade::default()).collect(),
            stats: ReclaimStats::default(),
            lease_ns: LEASE.as_nanos() as u64,
        })))
    }

    /// Sets how long another client's entry may stay the same before it
    /// counts as dead (default [`LEASE`]; tests shorten it).
    pub fn set_lease(&self, lease: std::time::Duration) {
        self.0.borrow_mut().lease_ns = lease.as_nanos() as u64;
    }

    /// Pins an operation: refreshes first when [`REFRESH_NS`] passed (or on
    /// first use), then counts the operation in the epoch last seen.
    ///
    /// # Errors
    /// Verb errors; [`Error::Unsupported`] when the registry is full.
    pub async fn pin(this: &Rc<Reclaimer>, ctx: &Ctx) -> Result<Pin> {
        this.tick(ctx).await?;
        let epoch = {
            let mut st = this.0.borrow_mut();
            let e = st.epoch;
            st.pins.pin(e)
        };
        Ok(Pin { r: this.clone(), epoch })
    }

    /// Refreshes if [`REFRESH_NS`] passed since the last refresh (an
    /// operation that waits long calls this to keep its thread's entry
    /// alive).
    ///
    /// # Errors
    /// As [`Reclaimer::pin`].
    pub async fn tick(&self, ctx: &Ctx) -> Result<()> {
        let due = {
            let st = self.0.borrow();
            !st.refreshing && st.last_refresh_ns.is_none_or(|t| ctx.now_ns().saturating_sub(t) >= REFRESH_NS)
        };
        if due || self.0.borrow().entry.is_none() {
            self.refresh(ctx).await?;
        }
        Ok(())
    }

    /// The epoch this thread last saw.
    pub fn epoch(&self) -> u64 {
        self.0.borrow().epoch
    }

    /// How many times this thread found itself expired (its entry taken as
    /// a dead client's): caches kept across operations must be dropped when
    /// this changes.
    pub fn lapses(&self) -> u64 {
        self.0.borrow().lapses
    }

    /// Whether this thread lapsed since it had `lapses` lapses
    /// ([`Reclaimer::lapses`]): an operation that began then may have used
    /// memory reused meanwhile, and must not trust what it read. Costs no
    /// verb unless the thread went without publishing its entry for a
    /// lease; then it refreshes (which counts that silence as a lapse).
    ///
    /// # Errors
    /// As [`Reclaimer::pin`].
    pub async fn lapsed_since(&self, ctx: &Ctx, lapses: u64) -> Result<bool> {
        let silent = {
            let st = self.0.borrow();
            st.lapses == lapses && st.published_ns.is_some_and(|t| ctx.now_ns().saturating_sub(t) >= st.lease_ns)
        };
        if silent {
            self.refresh(ctx).await?;
        }
        Ok(self.0.borrow().lapses != lapses)
    }

    /// What this thread did so far.
    pub fn stats(&self) -> ReclaimStats {
        let st = self.0.borrow();
        ReclaimStats { lapses: st.lapses, refreshes: st.refreshes, ..st.stats }
    }

    /// Reads the epochs, publishes this thread's, advances the global epoch
    /// when every live client is in it, and moves bags whose epoch became
    /// safe to the free lists (pushing surplus ones to the blades).
    ///
    /// # Errors
    /// As [`Reclaimer::pin`].
    pub async fn refresh(&self, ctx: &Ctx) -> Result<()> {
        if std::mem::replace(&mut self.0.borrow_mut().refreshing, true) {
            // Another coroutine of this thread is at it; wait for it, so
            // that no operation runs unregistered.
            while self.0.borrow().refreshing {
                ctx.sleep_ns(10_000).await;
            }
            return if self.0.borrow().entry.is_some() { Ok(()) } else { Box::pin(self.refresh(ctx)).await };
        }
        let r = self.refresh_inner(ctx).await;
        self.0.borrow_mut().refreshing = false;
        r
    }

    async fn refresh_inner(&self, ctx: &Ctx) -> Result<()> {
        let known = self.0.borrow().epochs;
        let epochs = match known {
            Some(a) => a,
            None => {
                let bytes = EPOCH_HEADER + ENTRY * REGISTRY as u64;
                let a = area(ctx, 0, EPOCH_ROOT, bytes, &[EPOCH_MAGIC, 1, REGISTRY as u64, 0]).await?;
                let cap = match ctx.read_u64(a.add(CAPACITY_WORD)).await? {
                    0 => REGISTRY_V1,
                    c if c as usize <= REGISTRY => c as usize,
                    c => {
                        return Err(Error::Unsupported(format!(
                            "the epoch area at {a} has {c} entries (at most {REGISTRY})"
                        )))
                    }
                };
                let mut st = self.0.borrow_mut();
                st.epochs = Some(a);
                st.capacity = cap;
                st.seen = vec![Seen::default(); cap];
                a
            }
        };
        let (cap, high) = {
            let st = self.0.borrow();
            (st.capacity, st.high)
        };
        // The entries below the high-water mark last seen, and some slack.
        let mut n = if cap == REGISTRY_V1 { cap } else { (high + READ_SLACK).min(cap) };
        let mut raw = vec![0u8; (EPOCH_HEADER + ENTRY * n as u64) as usize];
        ctx.read_all(epochs, &mut raw).await?;
        if word(&raw, 0) != EPOCH_MAGIC {
            return Err(Error::Unsupported(format!("the epoch area at {epochs} is not one (bad magic)")));
        }
        let high = if cap == REGISTRY_V1 { cap } else { (word(&raw, 3) as usize).min(cap) };
        if high > n {
            // More clients than last time: read up to the mark.
            raw.resize((EPOCH_HEADER + ENTRY * high as u64) as usize, 0);
            let from = (EPOCH_HEADER + ENTRY * n as u64) as usize;
            ctx.read_all(epochs.add(from as u64), &mut raw[from..]).await?;
            n = high;
        }
        self.0.borrow_mut().high = high;
        let e = word(&raw, 1);
        let entries: Vec<(u64, u64)> = (0..n).map(|i| (word(&raw, 8 + 2 * i), word(&raw, 9 + 2 * i))).collect();
        let now = ctx.now_ns();
        let (mine, other_min, dead) = {
            let mut st = self.0.borrow_mut();
            st.epoch = st.epoch.max(e);
            if let Some((i, w)) = st.entry {
                if entries[i].0 != w {
                    // Taken as dead while this thread was stalled.
                    st.entry = None;
                    st.lapses += 1;
                }
            }
            let mine = published_epoch(&st.pins, st.epoch);
            let own = st.entry.map(|(i, _)| i);
            let lease = st.lease_ns;
            let mut dead = Vec::new();
            let m = live_min(&entries, &mut st.seen, own, now, lease, &mut dead);
            (mine, m, dead)
        };
        for &(i, w) in &dead {
            // Best effort: free the dead client's entry.
            let at = epochs.add(EPOCH_HEADER + ENTRY * i as u64);
            if ctx.cas(at, w, 0).await? == w {
                self.0.borrow_mut().stats.expired += 1;
            }
        }
        // Publish (register first if needed).
        let entry = self.0.borrow().entry;
        let published = match entry {
            Some((i, old)) => {
                let w = {
                    let mut st = self.0.borrow_mut();
                    st.beat = (st.beat + 1) & ((1 << BEAT_BITS) - 1);
                    st.token << BEAT_BITS | st.beat
                };
                // By CAS from the word this thread last wrote: an entry
                // taken as dead since (and perhaps claimed by another
                // client) is left alone.
                match self.claim(ctx, epochs, i, old, w, mine).await? {
                    Some(sent) => sent,
                    None => {
                        {
                            let mut st = self.0.borrow_mut();
                            st.entry = None;
                            st.lapses += 1;
                        }
                        self.register(ctx, epochs, &entries, &dead, mine).await?
                    }
                }
            }
            None => self.register(ctx, epochs, &entries, &dead, mine).await?,
        };
        {
            // A thread silent for a lease (from the clock before one
            // publication to the end of the next) may have been taken for
            // dead by a client that read its entry in between, even if the
            // entry is still its own: that counts as a lapse too.
            let done = ctx.now_ns();
            let mut st = self.0.borrow_mut();
            if st.published_ns.is_some_and(|t| done.saturating_sub(t) >= st.lease_ns) {
                st.lapses += 1;
            }
            st.published_ns = Some(published);
        }
        let horizon = horizon_of(other_min, mine);
        if horizon >= e {
            // Everyone is in E: move it on.
            if ctx.cas(epochs.add(EPOCH_WORD), e, e + 1).await? == e {
                self.0.borrow_mut().stats.advances += 1;
            }
        }
        let surplus = {
            let mut st = self.0.borrow_mut();
            st.horizon = st.horizon.max(horizon);
            st.refreshes += 1;
            st.last_refresh_ns = Some(now);
            st.ripen()
        };
        for (blade, lines, offsets) in surplus {
            // A bag at a time: with no memory left for bags, the blocks not
            // pushed stay this thread's (it is short of memory, and will
            // use them).
            for (i, part) in offsets.chunks(BAG_ENTRIES).enumerate() {
                match self.push(ctx, blade, lines, part, 0).await {
                    Err(Error::OutOfMemory { .. }) => {
                        let rest = &offsets[i * BAG_ENTRIES..];
                        self.0.borrow_mut().blades[usize::from(blade)].class(lines).free.extend_from_slice(rest);
                        break;
                    }
                    r => r?,
                }
            }
        }
        Ok(())
    }

    /// Takes registry entry `i` for this thread by CAS of its owner word
    /// from `expect` to `w`, then publishes `mine` in it. Returns the clock
    /// read before the CAS, or `None` if the entry holds another word. (A
    /// CAS that returns `w` landed: an RNIC that ran a retried atomic
    /// twice answers with the second run, and `w` is this thread's own.)
    async fn claim(
        &self,
        ctx: &Ctx,
        epochs: GlobalAddr,
        i: usize,
        expect: u64,
        w: u64,
        mine: u64,
    ) -> Result<Option<u64>> {
        let at = epochs.add(EPOCH_HEADER + ENTRY * i as u64);
        let sent = ctx.now_ns();
        let got = ctx.cas(at, expect, w).await?;
        if got != expect && got != w {
            return Ok(None);
        }
        self.0.borrow_mut().entry = Some((i, w));
        ctx.write(at.add(8), &mine.to_le_bytes()).await?;
        Ok(Some(sent))
    }

    async fn register(
        &self,
        ctx: &Ctx,
        epochs: GlobalAddr,
        entries: &[(u64, u64)],
        dead: &[(usize, u64)],
        mine: u64,
    ) -> Result<u64> {
        let w = {
            let st = self.0.borrow();
            st.token << BEAT_BITS | st.beat
        };
        let cap = self.0.borrow().capacity;
        // Entries read and free, then those beyond what was read.
        let free = (0..cap).filter(|&i| entries.get(i).is_none_or(|e| e.0 == 0) || dead.iter().any(|d| d.0 == i));
        for i in free {
            if cap != REGISTRY_V1 {
                // Raise the high-water mark over the entry before taking it,
                // so that every refresh from then on reads it.
                let at = epochs.add(HIGH_WORD);
                let mut high = self.0.borrow().high as u64;
                while high <= i as u64 {
                    let got = ctx.cas(at, high, i as u64 + 1).await?;
                    if got == high || got > i as u64 {
                        break;
                    }
                    high = got;
                }
            }
            if let Some(sent) = self.claim(ctx, epochs, i, 0, w, mine).await? {
                return Ok(sent);
            }
        }
        Err(Error::Unsupported(format!(
            "the epoch registry on blade 0 is full ({cap} clients at once; dead ones are freed after {LEASE:?})"
        )))
    }

    /// Retires the object of `bytes` bytes at `at`: it is reused once no
    /// operation can still reach it.
    pub fn retire(&self, at: GlobalAddr, bytes: u64) {
        let mut st = self.0.borrow_mut();
        let e = st.epoch;
        st.stats.retired_bytes += bytes.next_multiple_of(64);
        let c = st.blades[usize::from(at.blade())].class(bytes.div_ceil(64).max(1));
        match c.limbo.back_mut() {
            Some((be, bag)) if bag.len() < BAG_ENTRIES => {
                *be = e;
                bag.push(at.offset());
            }
            _ => {
                let mut bag = c.spare.pop().unwrap_or_else(|| Vec::with_capacity(BAG_ENTRIES));
                bag.push(at.offset());
                c.limbo.push_back((e, bag));
            }
        }
    }

    /// Allocates `bytes` bytes (a multiple of 64, 64-aligned) on `blade`:
    /// from this thread's free list, else a safe bag from the blade's list,
    /// else fresh memory.
    ///
    /// # Errors
    /// Verb errors; [`Error::OutOfMemory`]; [`Error::Damaged`] for a free
    /// list that names no place in the blade's heap.
    pub async fn alloc(&self, ctx: &Ctx, blade: u16, bytes: u64) -> Result<GlobalAddr> {
        // Out of memory while what was retired is not safe yet (a client
        // killed a moment ago holds the epoch back for its lease): refresh
        // and try again, for at most a lease and a half from the first
        // failure (the clock is read only then, never on the usual path).
        let mut first_failure = None;
        loop {
            match self.alloc_once(ctx, blade, bytes).await {
                Err(e @ Error::OutOfMemory { .. }) if self.0.borrow().entry.is_some() => {
                    let now = ctx.now_ns();
                    if now.saturating_sub(*first_failure.get_or_insert(now)) >= self.0.borrow().lease_ns * 3 / 2 {
                        return Err(e);
                    }
                    ctx.sleep_ns(REFRESH_NS).await;
                    self.refresh(ctx).await?;
                }
                r => return r,
            }
        }
    }

    async fn alloc_once(&self, ctx: &Ctx, blade: u16, bytes: u64) -> Result<GlobalAddr> {
        let lines = bytes.div_ceil(64).max(1);
        let b = usize::from(blade);
        if b >= self.0.borrow().blades.len() {
            return Err(Error::NoSuchBlade(blade, self.0.borrow().blades.len()));
        }
        loop {
            if let Some(off) = self.take_free(b, lines) {
                return Ok(GlobalAddr::new(blade, off));
            }
            let (dry, busy) = {
                let mut st = self.0.borrow_mut();
                let r = st.refreshes;
                let c = st.blades[b].class(lines);
                let dry = c.dry_at == r + 1;
                let busy = !dry && std::mem::replace(&mut c.popping, true);
                (dry, busy)
            };
            if dry {
                break;
            }
            if busy {
                ctx.sleep_ns(1_000).await;
                continue;
            }
            let popped = self.pop(ctx, blade, lines).await;
            let mut st = self.0.borrow_mut();
            let r = st.refreshes;
            let c = st.blades[b].class(lines);
            c.popping = false;
            match popped? {
                Some(offsets) => c.free.extend(offsets),
                None => c.dry_at = r + 1,
            }
        }
        let at = self.fresh(ctx, blade, lines).await?;
        self.0.borrow_mut().stats.fresh_bytes += lines * 64;
        Ok(at)
    }

    fn take_free(&self, b: usize, lines: u64) -> Option<u64> {
        let mut st = self.0.borrow_mut();
        let off = st.blades[b].class(lines).free.pop()?;
        st.stats.reused_bytes += lines * 64;
        Some(off)
    }

    /// Fresh memory of `lines` lines: carved from this thread's span (large
    /// objects straight from the heap).
    async fn fresh(&self, ctx: &Ctx, blade: u16, lines: u64) -> Result<GlobalAddr> {
        let bytes = lines * 64;
        let b = usize::from(blade);
        let span = span_bytes(ctx, b);
        if bytes > span / 4 {
            return match ctx.alloc(blade, bytes, 64).await {
                Ok(at) => {
                    self.0.borrow_mut().stats.heap_bytes += bytes;
                    Ok(at)
                }
                // The heap is exhausted: the front of a larger free object
                // (the rest becomes a span of this thread).
                Err(e @ Error::OutOfMemory { .. }) => match self.cut_from_larger(ctx, blade, lines).await? {
                    Some(at) => Ok(at),
                    None => Err(e),
                },
                Err(e) => Err(e),
            };
        }
        loop {
            let wait = {
                let mut st = self.0.borrow_mut();
                let bl = &mut st.blades[b];
                let (cur, end) = bl.span;
                if cur + bytes <= end {
                    bl.span.0 += bytes;
                    return Ok(GlobalAddr::new(blade, cur));
                }
                // The rest of this span, if any, becomes a free block of
                // its size (or a span again); take the next span held.
                let rest = (end - cur) / 64;
                if rest > 0 {
                    match small_class(rest) {
                        Some(_) => bl.class(rest).free.push(cur),
                        None => bl.spans.push((cur, rest)),
                    }
                }
                bl.span = (0, 0);
                if let Some(i) = bl.spans.iter().position(|s| s.1 >= lines) {
                    let (off, l) = bl.spans.swap_remove(i);
                    bl.span = (off, off + l * 64);
                    continue;
                }
                std::mem::replace(&mut bl.refilling, true)
            };
            if wait {
                ctx.sleep_ns(1_000).await;
                continue;
            }
            let got = self.refill(ctx, blade, span).await;
            self.0.borrow_mut().blades[b].refilling = false;
            got?;
        }
    }

    /// Takes spans from `blade`'s span list, or a fresh `span` bytes from
    /// its heap, into this thread's spans.
    async fn refill(&self, ctx: &Ctx, blade: u16, span: u64) -> Result<()> {
        let b = usize::from(blade);
        match self.pop(ctx, blade, 0).await? {
            Some(s) if !s.is_empty() => {
                self.0.borrow_mut().blades[b].spans.extend(s.into_iter().map(unpack_free));
            }
            _ => match ctx.alloc(blade, span, 64).await {
                Ok(at) => {
                    let mut st = self.0.borrow_mut();
                    st.stats.heap_bytes += span;
                    st.blades[b].spans.push((at.offset(), span / 64));
                }
                // The heap is exhausted: a larger free object, whole, as a
                // span (cut by `fresh` into smaller objects).
                Err(e @ Error::OutOfMemory { .. }) => {
                    let at = self.cut_from_larger(ctx, blade, 1).await?.ok_or(e)?;
                    // `cut_from_larger` left the object's rest as a span: the
                    // first line joins it again.
                    let mut st = self.0.borrow_mut();
                    let spans = &mut st.blades[b].spans;
                    match spans.iter_mut().find(|s| s.0 == at.offset() + 64) {
                        Some(s) => *s = (at.offset(), s.1 + 1),
                        None => spans.push((at.offset(), 1)),
                    }
                }
                Err(e) => return Err(e),
            },
        }
        Ok(())
    }

    /// `lines` lines cut from the front of a safe free object of a larger
    /// size class on `blade`'s free lists (the smallest that fits), when the
    /// heap is exhausted: the object's rest becomes a span of this thread,
    /// the other objects of its bag join this thread's free blocks. `None`
    /// if no class holds a larger one (or none is safe yet).
    ///
    /// # Errors
    /// Verb errors; damaged free lists.
    async fn cut_from_larger(&self, ctx: &Ctx, blade: u16, lines: u64) -> Result<Option<GlobalAddr>> {
        let b = usize::from(blade);
        // This thread's own free objects first (the smallest larger one).
        {
            let mut st = self.0.borrow_mut();
            let bl = &mut st.blades[b];
            let smalls = bl.small.iter().enumerate().map(|(l, c)| (l as u64, c.free.len()));
            let bigs = bl.big.iter().map(|(&l, c)| (l, c.free.len()));
            if let Some(size) = smalls.chain(bigs).filter(|&(l, n)| l > lines && n > 0).map(|(l, _)| l).min() {
                let first = bl.class(size).free.pop().expect("a free object");
                bl.spans.push((first + lines * 64, size - lines));
                st.stats.reused_bytes += lines * 64;
                return Ok(Some(GlobalAddr::new(blade, first)));
            }
        }
        let area = self.free_area(ctx, blade).await?;
        let mut raw = vec![0u8; (ENTRY * CLASSES as u64) as usize];
        ctx.read_all(area, &mut raw).await?;
        // Every class with a non-empty list and objects of at least
        // `lines + 1` lines (small classes are their index), smallest first.
        let mut sizes: Vec<u64> = (1..CLASSES)
            .filter(|&i| word(&raw, 2 * i + 1) & OFFSET_MASK != 0)
            .map(|i| if i <= SMALL_LINES as usize { i as u64 } else { word(&raw, 2 * i) })
            .filter(|&l| l > lines)
            .collect();
        sizes.sort_unstable();
        for size in sizes {
            let Some(objects) = self.pop(ctx, blade, size).await? else { continue };
            let Some((&first, others)) = objects.split_first() else { continue };
            let mut st = self.0.borrow_mut();
            st.stats.reused_bytes += lines * 64;
            let bl = &mut st.blades[b];
            bl.class(size).free.extend_from_slice(others);
            bl.spans.push((first + lines * 64, size - lines));
            return Ok(Some(GlobalAddr::new(blade, first)));
        }
        Ok(None)
    }

    /// The free area of `blade`, resolved once.
    async fn free_area(&self, ctx: &Ctx, blade: u16) -> Result<GlobalAddr> {
        if let Some(a) = self.0.borrow().blades[usize::from(blade)].area {
            return Ok(a);
        }
        let a = area(ctx, blade, FREE_ROOT, ENTRY * CLASSES as u64, &[]).await?;
        self.0.borrow_mut().blades[usize::from(blade)].area = Some(a);
        Ok(a)
    }

    /// The class slot of `lines` (0 = spans) on `blade`, claiming one for a
    /// large size; `None` when every large slot is taken by other sizes.
    async fn slot(&self, ctx: &Ctx, blade: u16, lines: u64) -> Result<Option<usize>> {
        if lines == 0 {
            return Ok(Some(0));
        }
        if let Some(c) = small_class(lines) {
            return Ok(Some(c));
        }
        if let Some(&s) = self.0.borrow().blades[usize::from(blade)].big_slots.get(&lines) {
            return Ok(s);
        }
        let area = self.free_area(ctx, blade).await?;
        let mut raw = vec![0u8; (ENTRY * CLASSES as u64) as usize];
        ctx.read_all(area, &mut raw).await?;
        let first = SMALL_LINES as usize + 1;
        let mut found = (first..CLASSES).find(|&i| word(&raw, 2 * i) == lines);
        if found.is_none() {
            for i in (first..CLASSES).filter(|&i| word(&raw, 2 * i) == 0) {
                let old = ctx.cas(area.add(ENTRY * i as u64), 0, lines).await?;
                if old == 0 || old == lines {
                    found = Some(i);
                    break;
                }
            }
        }
        self.0.borrow_mut().blades[usize::from(blade)].big_slots.insert(lines, found);
        Ok(found)
    }

    /// Pops a bag of class `lines` (0 = spans) from `blade`'s list, if its
    /// epoch is safe; returns its entries (the bag's own memory joins this
    /// thread's free blocks of its size).
    async fn pop(&self, ctx: &Ctx, blade: u16, lines: u64) -> Result<Option<Vec<u64>>> {
        let Some(slot) = self.slot(ctx, blade, lines).await? else { return Ok(None) };
        let head = self.free_area(ctx, blade).await?.add(ENTRY * slot as u64 + 8);
        for _ in 0..16 {
            let h = ctx.read_u64(head).await?;
            let off = h & OFFSET_MASK;
            if off == 0 {
                return Ok(None);
            }
            in_heap(ctx, blade, off, BAG, || format!("free list {slot} names a bag"))?;
            let mut bag = [0u8; BAG as usize];
            ctx.read(GlobalAddr::new(blade, off), &mut bag).await?;
            let (next, epoch, count) = (word(&bag, 0), word(&bag, 1), word(&bag, 2) as usize);
            if !reusable(epoch, self.0.borrow().horizon) {
                return Ok(None);
            }
            if count > BAG_ENTRIES || next > OFFSET_MASK {
                // Read while another client reused it: the CAS would fail.
                continue;
            }
            let tag = (h >> OFFSET_BITS).wrapping_add(1) & ((1 << (64 - OFFSET_BITS)) - 1);
            if ctx.cas(head, h, tag << OFFSET_BITS | next).await? == h {
                // The bag was the list's head until this CAS (the head's tag
                // rules out a reuse in between): what it holds is what was
                // pushed, and must be blocks of the heap.
                let entries: Vec<u64> = (0..count).map(|i| word(&bag, BAG_HEADER / 8 + i)).collect();
                for &w in &entries {
                    let (o, l) = if lines == 0 { unpack_free(w) } else { (w & OFFSET_MASK, lines) };
                    in_heap(ctx, blade, o, l * 64, || {
                        format!("the bag at {off:#x} of free list {slot} names a block")
                    })?;
                }
                let mut st = self.0.borrow_mut();
                st.stats.bags_popped += 1;
                st.blades[usize::from(blade)].class(BAG / 64).free.push(off);
                return Ok(Some(if lines == 0 {
                    entries
                } else {
                    entries.into_iter().map(|w| w & OFFSET_MASK).collect()
                }));
            }
        }
        Ok(None)
    }

    /// Pushes `offsets` (objects of `lines` lines; spans packed with their
    /// lengths when `lines` is 0) as bags stamped `epoch` onto `blade`'s
    /// list of that class. Without a class slot (every large slot taken),
    /// the objects stay with this thread.
    async fn push(&self, ctx: &Ctx, blade: u16, lines: u64, offsets: &[u64], epoch: u64) -> Result<()> {
        let Some(slot) = self.slot(ctx, blade, lines).await? else {
            let mut st = self.0.borrow_mut();
            st.blades[usize::from(blade)].class(lines).free.extend_from_slice(offsets);
            return Ok(());
        };
        let head = self.free_area(ctx, blade).await?.add(ENTRY * slot as u64 + 8);
        for part in offsets.chunks(BAG_ENTRIES) {
            let bag_at = match self.take_free(usize::from(blade), BAG / 64) {
                Some(off) => GlobalAddr::new(blade, off),
                None => match self.fresh(ctx, blade, BAG / 64).await {
                    Ok(at) => at,
                    // The heap is exhausted (a table dropped to make room,
                    // say): bags are cut from a larger free object this
                    // thread holds.
                    Err(Error::OutOfMemory { .. }) if self.carve_bags(usize::from(blade)) => {
                        let off = self.take_free(usize::from(blade), BAG / 64).expect("bags just cut");
                        GlobalAddr::new(blade, off)
                    }
                    Err(e) => return Err(e),
                },
            };
            let mut bag = Vec::with_capacity(BAG_HEADER + 8 * part.len());
            for w in [0, epoch, part.len() as u64, lines] {
                bag.extend_from_slice(&w.to_le_bytes());
            }
            for &o in part {
                let w = if lines == 0 { o } else { pack_free(o, lines) };
                bag.extend_from_slice(&w.to_le_bytes());
            }
            let mut h = ctx.read_u64(head).await?;
            bag[..8].copy_from_slice(&(h & OFFSET_MASK).to_le_bytes());
            ctx.write(bag_at, &bag).await?;
            loop {
                let tag = (h >> OFFSET_BITS).wrapping_add(1) & ((1 << (64 - OFFSET_BITS)) - 1);
                let new = tag << OFFSET_BITS | bag_at.offset();
                let old = ctx.cas(head, h, new).await?;
                // (Our own new head back: the CAS landed and was run
                // twice; following it would link the bag to itself.)
                if old == h || old == new {
                    break;
                }
                h = old;
                ctx.write(bag_at, &(h & OFFSET_MASK).to_le_bytes()).await?;
            }
            self.0.borrow_mut().stats.bags_pushed += 1;
        }
        Ok(())
    }

    /// Cuts one safe free object this thread holds on blade `b` that is
    /// larger than a bag (the largest) into bag-size blocks, for bags when
    /// the heap is exhausted. Returns whether it found one.
    fn carve_bags(&self, b: usize) -> bool {
        let mut st = self.0.borrow_mut();
        let bl = &mut st.blades[b];
        let smalls = bl.small.iter().enumerate().map(|(l, c)| (l as u64, c.free.len()));
        let bigs = bl.big.iter().map(|(&l, c)| (l, c.free.len()));
        let Some(lines) = smalls.chain(bigs).filter(|&(l, n)| l > BAG / 64 && n > 0).map(|(l, _)| l).max() else {
            return false;
        };
        let donor = bl.class(lines).free.pop().expect("a free object");
        bl.cut_into_bags(donor, lines);
        true
    }

    /// Makes sure pushing `work` (this thread's objects of `blade`, largest
    /// first) finds its bags: when the blade's heap is too short of the
    /// bags it takes (a table dropped because the blade was full), the
    /// largest safe objects of `work` are cut into bags first, as few as
    /// needed; the pieces no bag takes go back to the free lists as blocks
    /// of a bag's size.
    ///
    /// # Errors
    /// Verb errors.
    async fn bags_for(&self, ctx: &Ctx, blade: u16, work: &mut [(u64, u64, Vec<u64>)]) -> Result<()> {
        let b = usize::from(blade);
        let needed: u64 = work.iter().map(|w| w.2.len().div_ceil(BAG_ENTRIES) as u64).sum::<u64>() + 1;
        let (held, horizon) = {
            let mut st = self.0.borrow_mut();
            let horizon = st.horizon;
            let bl = &mut st.blades[b];
            let in_spans: u64 = bl.spans.iter().map(|s| s.1 * 64 / BAG).sum::<u64>() + (bl.span.1 - bl.span.0) / BAG;
            (bl.class(BAG / 64).free.len() as u64 + in_spans, horizon)
        };
        if held >= needed {
            return Ok(());
        }
        let heap = ctx.read_u64(GlobalAddr::new(blade, layout::OFF_HEAP)).await?;
        let left = ctx.blades()[b].size.saturating_sub(heap) / BAG;
        let mut short = needed.saturating_sub(held + left);
        for (lines, epoch, offsets) in work.iter_mut() {
            if short == 0 {
                break;
            }
            if *lines < BAG / 64 || !(*epoch == 0 || reusable(*epoch, horizon)) {
                continue;
            }
            while short > 0 {
                let Some(donor) = offsets.pop() else { break };
                self.0.borrow_mut().blades[b].cut_into_bags(donor, *lines);
                short = short.saturating_sub(*lines * 64 / BAG);
            }
        }
        Ok(())
    }

    /// Hands everything this thread holds to the blades' free lists (safe
    /// or not: each bag keeps its epoch) and leaves the registry. Call it
    /// when the thread's work is done; a thread that never does (killed)
    /// loses what it held (see the module docs).
    ///
    /// # Errors
    /// Verb errors.
    pub async fn flush(&self, ctx: &Ctx) -> Result<()> {
        // Let what this thread retired become safe first (a few epochs,
        // milliseconds while every client refreshes), so that the next
        // process finds safe bags on top of the lists.
        let t0 = ctx.now_ns();
        while self.0.borrow().entry.is_some()
            && self.0.borrow().pending()
            && ctx.now_ns().saturating_sub(t0) < FLUSH_WAIT_NS
        {
            ctx.sleep_ns(REFRESH_NS).await;
            self.refresh(ctx).await?;
        }
        let blades = self.0.borrow().blades.len();
        for b in 0..blades {
            let blade = b as u16;
            // Every class: (lines, epoch, offsets).
            let mut work: Vec<(u64, u64, Vec<u64>)> = Vec::new();
            {
                let mut st = self.0.borrow_mut();
                let bl = &mut st.blades[b];
                let small = bl.small.iter_mut().enumerate().map(|(l, c)| (l as u64, c));
                for (lines, c) in small.chain(bl.big.iter_mut().map(|(&l, c)| (l, c))) {
                    if lines == BAG / 64 {
                        // Bag buffers last: pushing needs them.
                        continue;
                    }
                    if !c.free.is_empty() {
                        work.push((lines, 0, std::mem::take(&mut c.free)));
                    }
                    for (e, bag) in c.limbo.drain(..) {
                        work.push((lines, e, bag));
                    }
                }
            }
            // The largest first: with the heap exhausted, their safe
            // objects become the bags of the smaller (see `push`).
            work.sort_by_key(|w| std::cmp::Reverse(w.0));
            self.bags_for(ctx, blade, &mut work).await?;
            for (lines, e, offsets) in work.into_iter().filter(|w| !w.2.is_empty()) {
                self.push(ctx, blade, lines, &offsets, e).await?;
            }
            // Bag-sized blocks: what is left after the pushes above.
            let (free, limbo) = {
                let mut st = self.0.borrow_mut();
                let c = st.blades[b].class(BAG / 64);
                (std::mem::take(&mut c.free), c.limbo.drain(..).collect::<Vec<_>>())
            };
            for (e, bag) in limbo {
                self.push(ctx, blade, BAG / 64, &bag, e).await?;
            }
            if !free.is_empty() {
                // One of them carries the others.
                self.0.borrow_mut().blades[b].class(BAG / 64).free.push(free[0]);
                self.push(ctx, blade, BAG / 64, &free[1..], 0).await?;
            }
            // Spans: the one being carved and those held. Their bag comes
            // from the span itself if need be.
            let mut spans = {
                let mut st = self.0.borrow_mut();
                std::mem::take(&mut st.blades[b].spans)
            };
            let has_bag = {
                let mut st = self.0.borrow_mut();
                let bl = &mut st.blades[b];
                let (cur, end) = std::mem::take(&mut bl.span);
                if end > cur {
                    spans.push((cur, (end - cur) / 64));
                }
                if bl.class(BAG / 64).free.is_empty() {
                    // Cut the bag from a span (never a fresh one: that would
                    // be lost).
                    if let Some(s) = spans.iter_mut().find(|s| s.1 >= BAG / 64) {
                        bl.class(BAG / 64).free.push(s.0);
                        s.0 += BAG;
                        s.1 -= BAG / 64;
                    }
                }
                !bl.class(BAG / 64).free.is_empty()
            };
            let packed: Vec<u64> = spans.iter().filter(|s| s.1 > 0).map(|&(o, l)| pack_free(o, l)).collect();
            if has_bag && !packed.is_empty() {
                self.push(ctx, blade, 0, &packed[..packed.len().min(BAG_ENTRIES)], 0).await?;
            }
        }
        // Leave the registry.
        let (epochs, entry) = {
            let mut st = self.0.borrow_mut();
            (st.epochs, st.entry.take())
        };
        if let (Some(a), Some((i, w))) = (epochs, entry) {
            let at = a.add(EPOCH_HEADER + ENTRY * i as u64);
            if ctx.cas(at, w, 0).await? == w {
                ctx.write(at.add(8), &0u64.to_le_bytes()).await?;
            }
        }
        Ok(())
    }
}

/// Allocates `bytes` bytes aligned to `align` (a power of two up to 4096)
/// on `blade` from its heap ([`Ctx::alloc`]) or, when the heap is
/// exhausted, from the blade's free lists (memory that dropped tables and
/// retired objects gave back): for objects that are never retired
/// themselves (a table's first subtables, a benchmark's area). The
/// free-list path registers a [`Reclaimer`] for the time of the call.
///
/// # Errors
/// [`Error::OutOfMemory`] when neither has room; verb errors.
pub async fn alloc_anywhere(ctx: &Ctx, blade: u16, bytes: u64, align: u64) -> Result<GlobalAddr> {
    let whole = bytes.checked_add(align.saturating_sub(64));
    match ctx.alloc(blade, bytes, align).await {
        // Only what could fit the blade is looked for on its free lists.
        Err(Error::OutOfMemory { size, .. }) if whole.is_some_and(|w| w < size) => {}
        r => return r,
    }
    let r = Reclaimer::new(ctx);
    r.refresh(ctx).await?;
    let got = r.alloc(ctx, blade, whole.expect("checked above")).await;
    r.flush(ctx).await?;
    let at = got?;
    Ok(GlobalAddr::new(blade, at.offset().next_multiple_of(align)))
}

/// What the free lists of `blade` hold, walked from the blade (meant for a
/// quiescent blade; a list that changes under the walk is counted as it was
/// read): (bytes of objects, bytes of the bags listing them).
///
/// # Errors
/// Verb errors; a list longer than the blade can hold (a cycle);
/// [`Error::Damaged`] for a bag that is no place in the heap.
pub async fn free_bytes(ctx: &Ctx, blade: u16) -> Result<(u64, u64)> {
    let Some(area) = ctx.root(blade, FREE_ROOT).await? else { return Ok((0, 0)) };
    let mut raw = vec![0u8; (ENTRY * CLASSES as u64) as usize];
    ctx.read_all(area, &mut raw).await?;
    let most = ctx.blades()[usize::from(blade)].size / BAG;
    let (mut objects, mut bags) = (0, 0);
    for slot in 0..CLASSES {
        let mut off = word(&raw, 2 * slot + 1) & OFFSET_MASK;
        while off != 0 {
            if bags / BAG >= most {
                return Err(Error::Unsupported(format!("free list {slot} of blade {blade} does not end")));
            }
            in_heap(ctx, blade, off, BAG, || format!("free list {slot} names a bag"))?;
            let mut bag = [0u8; BAG as usize];
            ctx.read(GlobalAddr::new(blade, off), &mut bag).await?;
            let count = (word(&bag, 2) as usize).min(BAG_ENTRIES);
            objects += (0..count).map(|i| unpack_free(word(&bag, BAG_HEADER / 8 + i)).1 * 64).sum::<u64>();
            bags += BAG;
            off = word(&bag, 0) & OFFSET_MASK;
        }
    }
    Ok((objects, bags))
}

impl State {
    /// Whether any retired object waits for its epoch.
    fn pending(&self) -> bool {
        self.blades.iter().any(|b| b.small.iter().chain(b.big.values()).any(|c| !c.limbo.is_empty()))
    }

    /// Moves bags whose epoch is safe to the free lists; returns surplus
    /// free blocks to push to the blades (blade, lines, offsets).
    fn ripen(&mut self) -> Vec<(u16, u64, Vec<u64>)> {
        let horizon = self.horizon;
        let mut surplus = Vec::new();
        for (b, bl) in self.blades.iter_mut().enumerate() {
            let small = bl.small.iter_mut().enumerate().map(|(l, c)| (l as u64, c));
            for (lines, c) in small.chain(bl.big.iter_mut().map(|(&l, c)| (l, c))) {
                while c.limbo.front().is_some_and(|&(e, _)| reusable(e, horizon)) {
                    let (_, mut bag) = c.limbo.pop_front().expect("checked");
                    c.free.append(&mut bag);
                    c.spare.push(bag);
                }
                if c.free.len() > 3 * BAG_ENTRIES {
                    let keep = c.free.len() - 2 * BAG_ENTRIES;
                    surplus.push((b as u16, lines, c.free.split_off(keep)));
                }
            }
        }
        surplus
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layout_is_pinned() {
        assert_eq!((EPOCH_HEADER, ENTRY, BAG, BAG_HEADER, BAG_ENTRIES), (64, 16, 1024, 32, 124));
        assert_eq!(unpack_free(pack_free(0xff_ffff_ffc0, 3)), (0xff_ffff_ffc0, 3));
        assert_eq!(pack_free(4096, 1), 1 << 40 | 4096);
    }

    #[test]
    fn pins_count_per_epoch_and_pin_older_when_full() {
        let mut p = Pins::default();
        assert_eq!((p.pin(5), p.pin(5), p.pin(6)), (5, 5, 6));
        assert_eq!(p.oldest(), Some(5));
        p.unpin(5);
        p.unpin(5);
        assert_eq!(p.oldest(), Some(6));
        assert_eq!((p.pin(7), p.pin(8), p.pin(9)), (7, 8, 9));
        // Four epochs in use: a fifth pins at the oldest, never newer.
        assert_eq!(p.pin(10), 6);
        p.unpin(6);
        p.unpin(6);
        assert_eq!(p.oldest(), Some(7));
    }

    #[test]
    fn entries_unchanged_for_a_lease_are_dead_and_others_bound_the_horizon() {
        let mut seen = vec![Seen::default(); 4];
        let entries = [(7 << 24 | 1, 10), (0, 0), (9 << 24 | 4, 12), (5 << 24 | 2, 3)];
        let mut dead = Vec::new();
        assert_eq!(live_min(&entries, &mut seen, Some(3), 0, 100, &mut dead), Some(10));
        assert!(dead.is_empty());
        // Entry 0 moves on; entry 2 stays the same for the lease.
        let later = [(7 << 24 | 2, 11), (0, 0), (9 << 24 | 4, 12), (5 << 24 | 2, 3)];
        assert_eq!(live_min(&later, &mut seen, Some(3), 50, 100, &mut dead), Some(11));
        let again = [(7 << 24 | 3, 11), (0, 0), (9 << 24 | 4, 12), (5 << 24 | 2, 3)];
        assert_eq!(live_min(&again, &mut seen, Some(3), 100, 100, &mut dead), Some(11));
        assert_eq!(dead, vec![(2, 9 << 24 | 4)]);
        // An entry claimed but never published (its client died there)
        // bounds nothing, and expires like any other.
        let mut seen = vec![Seen::default(); 2];
        let (mut dead, half) = (Vec::new(), [(3 << 24, 0), (4 << 24 | 1, 20)]);
        assert_eq!(live_min(&half, &mut seen, None, 0, 100, &mut dead), Some(20));
        let on = [(3 << 24, 0), (4 << 24 | 2, 21)];
        assert_eq!(live_min(&on, &mut seen, None, 100, 100, &mut dead), Some(21));
        assert_eq!(dead, vec![(0, 3 << 24)]);
    }
}

/// The reclamation rule, model-checked: a reader and a reclaimer, each with
/// its own local epoch and [`Pins`], share the global epoch and two
/// registry entries (atomics standing for the words on blade 0). Each
/// refresh does what [`Reclaimer::refresh`] does, with this module's own
/// decision functions ([`published_epoch`], [`live_min`], [`horizon_of`],
/// [`reusable`]): read
/// the global epoch and the other's entry, publish the oldest pinned epoch
/// (or the local one), advance the global epoch by CAS when the horizon
/// reached it. Both refresh once first (a pin refreshes when due). The
/// reader pins an operation, takes a reference if the
/// object is still linked, may refresh while pinned (another coroutine's
/// tick), and then uses the reference; the reclaimer unlinks the object in
/// an operation, retires it at its local epoch, and refreshes until the
/// object is reusable. In no interleaving is it reused while the reader
/// still holds the reference.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicBool, AtomicU64};
    use loom::sync::Arc;
    use loom::thread;

    use super::{horizon_of, live_min, published_epoch, reusable, Pins, Seen};
    use crate::primitive::Ordering::SeqCst;

    struct Blade {
        epoch: AtomicU64,
        published: [AtomicU64; 2],
        linked: AtomicBool,
        reused: AtomicBool,
        registry_first: bool,
    }

    /// One refresh of client `me`; returns the horizon it computed. The
    /// epoch area is one READ, whose words an RNIC may read in any order:
    /// `b.registry_first` reads the entries before the global epoch.
    fn refresh(b: &Blade, me: usize, local: &mut u64, pins: &Pins) -> u64 {
        let read_entries = || -> Vec<(u64, u64)> { (0..2).map(|i| (1, b.published[i].load(SeqCst))).collect() };
        let (entries, e) = if b.registry_first {
            let entries = read_entries();
            (entries, b.epoch.load(SeqCst))
        } else {
            let e = b.epoch.load(SeqCst);
            (read_entries(), e)
        };
        *local = (*local).max(e);
        let mine = published_epoch(pins, *local);
        b.published[me].store(mine, SeqCst);
        let mut seen = vec![Seen::default(); 2];
        let other = live_min(&entries, &mut seen, Some(me), 0, u64::MAX, &mut Vec::new());
        let horizon = horizon_of(other, mine);
        if horizon >= e {
            let _ = b.epoch.compare_exchange(e, e + 1, SeqCst, SeqCst);
        }
        horizon
    }

    #[test]
    fn loom_a_retired_object_is_never_reused_under_a_reference() {
        model(false);
    }

    #[test]
    fn loom_a_retired_object_is_never_reused_under_a_reference_when_the_registry_is_read_first() {
        model(true);
    }

    fn model(registry_first: bool) {
        loom::model(move || {
            let b = Arc::new(Blade {
                registry_first,
                epoch: AtomicU64::new(1),
                published: [AtomicU64::new(1), AtomicU64::new(1)],
                linked: AtomicBool::new(true),
                reused: AtomicBool::new(false),
            });
            let reader = {
                let b = b.clone();
                thread::spawn(move || {
                    let (mut local, mut pins) = (1, Pins::default());
                    refresh(&b, 0, &mut local, &pins);
                    let e = pins.pin(local);
                    if b.linked.load(SeqCst) {
                        refresh(&b, 0, &mut local, &pins);
                        assert!(!b.reused.load(SeqCst), "reused under a reference pinned at {e}");
                    }
                    pins.unpin(e);
                    refresh(&b, 0, &mut local, &pins);
                })
            };
            let (mut local, mut pins) = (1, Pins::default());
            refresh(&b, 1, &mut local, &pins);
            let e = pins.pin(local);
            b.linked.store(false, SeqCst);
            let retired = local;
            pins.unpin(e);
            for _ in 0..3 {
                if reusable(retired, refresh(&b, 1, &mut local, &pins)) {
                    b.reused.store(true, SeqCst);
                    break;
                }
            }
            reader.join().unwrap();
        });
    }
}
