//! # race-ht: RACE hashing on one-sided verbs (Smart-HT)
//!
//! A lock-free extendible hash table in disaggregated memory after RACE
//! (ATC '21), with Smart's change: back off after a failed slot CAS
//! (ConflictAvoid, through [`smart_core::runtime::OpGuard::retry`]). Layout and
//! round trips follow RACE's (see [`layout`]).
//!
//! * **Search**: READ both combined buckets (one doorbell), then READ the
//!   KV blocks whose fingerprint matches (one doorbell). 2 RTTs.
//! * **Insert**: WRITE the new KV block and READ both combined buckets (one
//!   doorbell); CAS an empty slot of the less-loaded choice; re-READ both
//!   buckets to find duplicates of the key. ≥ 3 RTTs.
//! * **Update**: WRITE the new block + READ buckets; READ matching blocks;
//!   CAS the slot old → new. 3 RTTs. **Delete**: READ; READ; CAS → empty.
//!
//! **Consistency.** Slots change only by 8-byte CAS, so a torn bucket read
//! still yields valid slot words. KV blocks are written out of place and
//! are immutable once published (their WRITE completes before the CAS that
//! publishes them), and every block carries a CRC: a reader that sees a
//! torn or in-flight block re-reads it, a bounded number of times, and then
//! fails with a clean error, never forever.
//!
//! **Duplicates.** Two concurrent inserts of one key can land in two slots.
//! After its CAS, an insert re-reads both buckets; every client keeps the
//! same survivor (the lowest slot address holding the key) and CASes the
//! others to empty. Visible effects, as in RACE: insert is not
//! last-writer-wins (the survivor may be the other insert's value), and an
//! update racing with the removal of a duplicate can be lost.
//!
//! **Online resizing** (extendible hashing). Each client caches the
//! directory (global depth GD, and per entry the subtable and its local
//! depth). When an insert finds both buckets of its key full, it splits
//! the subtable `S` (local depth `L`, suffix `s`) under `S`'s own *split
//! lock* (a CAS on a word after `S`'s buckets), as RACE does: splits of
//! different subtables proceed in parallel.
//! 1. *freeze* every slot of `S` by CAS (`w → w | 1`, empty `0 → 1`), so no
//!    other client's CAS can change `S` any more;
//! 2. read `S` and the blocks it names, rehash each key, and build two new
//!    subtables of depth `L + 1` (suffixes `s` and `s | 2^L`); an entry keeps
//!    its slot position, so nothing can overflow; duplicates of a key are
//!    dropped here too; a block whose new subtable is on another blade is
//!    copied there;
//! 3. WRITE both and record them in `S`'s split line (a CAS each; a half
//!    another client recorded first is used instead), then publish them
//!    in the directory under the table's *directory lock* (held for a few
//!    verbs), each change a CAS from what it replaces: set a *publication
//!    intent* (`S` and `L`) in the table header, then move the entries
//!    from `S` to its halves in place and bump the dir word's generation
//!    when `L < GD`, or swap in a doubled directory by one CAS of the dir
//!    word (depth, address and generation in one 8-byte word) when
//!    `L = GD`; clear the intent, release the directory lock, and
//!    *conclude*: CAS `S`'s split lock to `SPLIT_DONE`, then bump the split
//!    counter and retire `S`, which is dead.
//!
//! The directory lock makes publications (and doublings, which copy every
//! entry) serial; the work of a split (freezing, reading, rehashing,
//! writing the halves) is not.
//!
//! `S` is never changed again nor reused, so a client with a stale cache
//! that reaches it sees frozen slots and re-reads the directory. A client
//! that sees *any* frozen slot in the buckets it read treats the read as
//! void: it pauses, re-reads the directory and starts over. Why that is
//! enough: every slot of `S` is frozen before the new subtables become
//! reachable, so a bucket read whose slots were all unfrozen happened, slot
//! by slot, while `S` was still the only home of its keys; and a CAS that
//! succeeded on `S` succeeded before the freeze of its slot, so the split
//! carries its effect over. Bucket headers (local depth, suffix) never
//! change and are checked on every read against the key's hash and the
//! cached entry: a mismatch is reported as corruption.
//!
//! **A client that dies mid-split** (SIGKILL at any instant) is finished
//! by the next. Both locks hold the holder's token and a beat that the
//! holder bumps between the steps of its work (its lease, renewed every
//! few milliseconds). A client waiting on a frozen subtable (or on a full
//! one whose split lock is held) watches that subtable's split lock: the
//! same word for [`RESIZE_LEASE`] (2 s) of continuous watching (a watcher
//! that was itself stalled for more than 250 ms between two looks starts
//! its clock again: the holder may have been stalled just as long, as when
//! a whole emulated machine pauses) means the holder died (or, with
//! the lock free while the subtable stays frozen, that it failed), and it
//! takes the lock over by CAS from that word and finishes the split. A
//! publisher waiting for the directory lock takes it over the same way;
//! whoever holds the directory lock first finishes the publication that
//! a publication intent names, taking that subtable's split lock whatever
//! it holds (its publisher held the directory lock, so it is dead or gave
//! up), before it publishes its own: no subtable of a half-published range
//! is split before the range is whole. [`RaceHt::repair`] does all of this
//! without waiting for an operation to meet it. A split is finished from
//! `S`'s frozen image:
//! * each half is built once and *recorded* in `S`'s split line by CAS
//!   (after it is written whole); a later splitter (a taker, or a holder
//!   that stalled) uses the recorded half and gives its own back, so every
//!   publisher of a split publishes the same halves;
//! * halves already recorded are kept as they are (they may be published
//!   already, and written to since); their keys' blocks in `S` are
//!   skipped, and may not even decode any more;
//! * no block that a slot of `S` names is reused before the split is
//!   concluded (retirement waits until then), so the blocks of the keys
//!   being built are intact.
//!
//! Every step is idempotent, so a client that dies while recovering is
//! recovered in turn. **Publication is by CAS only**, so that a holder
//! stalled for longer than the lease (a paused VM, SIGSTOP) and taken over
//! changes nothing when it resumes, wherever it stalled: the intent is set
//! by CAS from 0 (a late one finds the taker's intent, or is cleared by
//! the next holder once its split is concluded); each directory entry moves
//! by CAS from `S` to its recorded half (so a stale publisher never
//! overwrites a later split of a half); a doubling swaps the dir word by
//! CAS from the word it read with the array; an in-place publication bumps
//! the dir word's generation by CAS after its moves, so a doubling that
//! copied the array before them fails its swap and starts again, and an
//! in-place publisher whose bump fails (the array replaced) moves its
//! entries again in the new array. The split is
//! *concluded* by a CAS of `S`'s split lock from the holder's word to
//! `SPLIT_DONE`: only the client whose CAS lands counts the split and
//! retires `S` and its blocks, so nothing is retired twice. What a
//! stalled holder can still cost: the blocks its own recorded halves made
//! unreachable are not retired if its taker concludes the split (a bounded
//! leak); and a doubler stalled between reading the array and its swap
//! while exactly a multiple of [`layout::DIR_GENERATIONS`] in-place
//! publications (and no doubling) happen would pass its CAS with a stale
//! copy, the generation having wrapped. A
//! holder that was only slow finds at its next renewal that the lock
//! changed hands: it stops, keeps the halves it recorded for the taker,
//! and its operation starts over while the taker finishes the split
//! ([`RaceError::LeaseLost`], counted as `lease_losses`). A split lock
//! that a dead client took before freezing anything leaves its subtable
//! working as before; the subtable's next grower takes it over after the
//! lease.
//!
//! Limits of resizing: publications are serial (the directory lock);
//! readers and writers of a subtable being split wait for its split
//! (pausing 10 µs doubling to 1 ms, failing after [`SPLIT_STALL`] if the
//! holder keeps renewing and never finishes); the depth stops at
//! [`layout::MAX_DEPTH`], after which a full bucket pair is
//! [`RaceError::Full`].
//!
//! **Memory that comes back (and ABA).** Replaced and deleted KV blocks,
//! frozen subtables once their split is published, and directories
//! replaced by a doubling are *retired* to the thread's
//! [`Reclaimer`] and reused, by any client
//! of any process, once no operation can reach them: epoch-based
//! reclamation with the epochs on blade 0 (the rule and its argument are
//! in [`smart_core::reclaim`]). Every operation pins its epoch. So a CAS
//! never meets a reused address (no ABA), a bucket READ never meets a
//! reused subtable, and memory stays bounded under any run. Caches kept
//! between operations are checked once per epoch: the directory by one
//! READ of the split counter ([`RaceHt`] reloads it when it moved), the
//! speculation cache by accepting only slots inside the subtable the
//! checked directory names. A thread should [`RaceHt::close`] its handle
//! when done: that hands its free and retired blocks to the blades' free
//! lists and leaves the registry. A thread stalled for longer than the
//! reclamation lease in the middle of an operation may have been taken for
//! dead and read reused memory (a bucket header of another depth, a block
//! of another key): a lookup or scan that ran while its thread lapsed
//! starts over, and so does a write that failed then (an insert whose CAS
//! had landed redoes only its duplicate check); the count is
//! `lapse_retries`. A client killed instead loses what it
//! held locally (under a span of 1 MiB per blade plus a few milliseconds
//! of retirements) and holds back reuse for
//! [`LEASE`](smart_core::reclaim::LEASE). [`RaceHt::drop_table`] gives a
//! whole table back: it freezes every slot first, so the set of blocks it
//! retires is final, and leaves the header as a tombstone that clients
//! still holding the table see at their next per-epoch check.
//!
//! **Speculative search** (Smart's `spec-lookup`, on when the runtime's
//! `SmartConfig::spec_lookup` is): each thread caches where keys were last
//! found (slot address and slot word, direct-mapped, [`SPEC_ENTRIES`]); a
//! search then takes one doorbell, READ that slot word + READ its block, and
//! is accepted only if the slot still holds the cached word (a frozen slot
//! never does) and the block decodes to the key. Otherwise the normal
//! two-RTT path runs and refreshes the cache. An update or upsert of a
//! cached key takes two doorbells instead of three: [WRITE its new block,
//! READ the slot word, READ the block the cached word names], then, if the
//! slot still holds that word and the block is the key's, a CAS from the
//! cached word (otherwise, or if the CAS fails, the normal path runs).
//!
//! ## Example
//!
//! A table on an embedded blade, used through [`smart_core::KvIndex`] as the
//! workloads use it:
//!
//! ```
//! use smart_core::{EmbeddedTransport, KvIndex, Runtime, RuntimeConfig};
//! let t = EmbeddedTransport::new(1, 32 << 20).unwrap();
//! let mut rt = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap();
//! let ctx = rt.ctx();
//! rt.block_on(async move {
//!     let (mut table, existed) = race_ht::RaceHt::open_or_create(&ctx, "doc", 1000).await.unwrap();
//!     assert!(!existed);
//!     assert!(table.insert(b"user:1", b"alice").await.unwrap());
//!     assert!(table.update(b"user:1", b"alicia").await.unwrap());
//!     let mut v = Vec::new();
//!     assert!(table.get(b"user:1", &mut v).await.unwrap());
//!     assert_eq!(v, b"alicia");
//!     assert!(table.delete(b"user:1").await.unwrap());
//!     assert!(!table.get(b"user:1", &mut v).await.unwrap());
//!     table.close().await.unwrap();
//! });
//! ```

#![warn(missing_docs)]

pub mod layout;

mod config;
mod directory;
mod drop;
mod error;
mod index;
mod reclaim;
mod resize;
mod scan;
mod search;
mod spec;
mod write;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use smart_core::{Ctx, GlobalAddr};

pub use config::{RaceConfig, RESIZE_LEASE, SPLIT_STALL};
pub use directory::TableShape;
pub use drop::Dropped;
pub use error::{RaceError, Result};
pub use index::RaceStats;
pub use resize::ResizeStats;
pub use scan::TableCheck;
pub use spec::SPEC_ENTRIES;

use directory::Directory;
use smart_core::reclaim::Reclaimer;
use spec::SpecCache;

/// A handle on a table for one coroutine (cheap to clone; clones share the
/// thread's directory cache, reclaimer and statistics).
#[derive(Debug)]
pub struct RaceHt {
    pub(crate) ctx: Ctx,
    /// The table header.
    pub(crate) table: GlobalAddr,
    pub(crate) dir: Rc<RefCell<Directory>>,
    pub(crate) reclaim: Rc<Reclaimer>,
    /// `Some` when the runtime's `spec_lookup` technique is on.
    pub(crate) spec: Option<Rc<RefCell<SpecCache>>>,
    pub(crate) stats: Rc<Cell<ResizeStats>>,
    /// This client's lock token (random, nonzero).
    pub(crate) token: u64,
    /// How long a split lock or the directory lock may stay the same
    /// before this client takes it over ([`RESIZE_LEASE`] unless set).
    pub(crate) lease: Duration,
    pub(crate) block: Vec<u8>,
}

impl Clone for RaceHt {
    fn clone(&self) -> Self {
        RaceHt {
            ctx: self.ctx.clone(),
            table: self.table,
            dir: self.dir.clone(),
            reclaim: self.reclaim.clone(),
            spec: self.spec.clone(),
            stats: self.stats.clone(),
            token: self.token,
            lease: self.lease,
            block: Vec::new(),
        }
    }
}
