//! Remote layouts of the database, declared once (FORD, Zhang et al.,
//! FAST '22, as Smart-DTX uses it; the log, the registry and the catalog
//! are ours).
//!
//! ```text
//! record      @0  table id u64        @8  value size u64
//!             @16 key u64             @24 home u64 (the primary copy's GlobalAddr)
//!             @32 version u64         @40 lock u64
//!             @48 value [value cap]   (value size rounded up to 8)
//!             @48+cap trailer u64: state u8 | 0 u8 | 0 u16 | crc32c u32
//!             64 B with 8-byte values (SmallBank), 96 B with 40-byte (TATP)
//! bucket      next u64 (the chain's next bucket on this replica, 0 = none)
//!             | copy u64 × 3 (an overflow bucket's copies on replicas 1..3;
//!             on a backup, the word of its own replica names the primary's
//!             copy instead; 0 in the bucket arrays)
//!             then 22 records
//! hash store  per table and replica, an array of buckets; a key's bucket
//!             is MurmurHash64A(key, seed) mod buckets, the same on every
//!             replica; overflow buckets are chained on every replica, each
//!             copy naming the others (written before the primary's link
//!             publishes the bucket, so a linked bucket always names them;
//!             the backups' links follow it). Transactions walk the
//!             primary's chain; the backups' let a damaged link or copy
//!             word be repaired from the others'.
//! lock word   bit 0 LOCKED | owner u16 @1 | thread u12 @17
//!             | coroutine u12 @29 | transaction seq u23 @41
//! ```
//! The CRC covers the record's first 40 bytes, the value and the state byte
//! (not the lock, which CASes change alone): a READ of a record is
//! self-verifying, so a read torn by a concurrent commit is detected by the
//! READ itself. A free slot is all zero except perhaps its lock.
//!
//! **Visibility.** A slot is FREE until a transaction inserts a key into it;
//! from then on it holds that key for good, LIVE or DELETED (FORD's
//! invisible bit). Inserts take the first slot of the key's chain that is
//! free or holds the key, so the free slots of a chain are always its tail.
//! Recovery keeps this: an insert it rolls back leaves its slot DELETED
//! under the key, not FREE (another insert may have taken the next slot
//! meanwhile, and a free slot ends every search).
//!
//! **Versions.** A record's version counts its writes: the committing
//! transaction holds the lock and writes read version + 1, and recovery,
//! restoring an old image, writes the old version + 2 (past the version the
//! dead transaction may have written). So a record never shows the same
//! version twice, whichever compute blade wrote it (FORD drew versions from
//! a per-process counter, which two compute blades could repeat), and a
//! validation never mistakes a rolled-back write for a committed one.

use smart_core::crc::crc32c_spans;
use smart_core::GlobalAddr;

/// Most replicas of a table (primary included).
pub const MAX_REPLICAS: usize = 4;
/// Records per bucket.
pub const SLOTS: usize = 22;
/// Bytes of a bucket's header (next pointer and mirrors).
pub const BUCKET_HEADER: u64 = 8 * MAX_REPLICAS as u64;
/// Bytes of a record before its value.
pub const RECORD_HEADER: usize = 48;
/// Offset of the version in a record.
pub const VERSION: u64 = 32;
/// Offset of the lock word in a record.
pub const LOCK: u64 = 40;
/// Largest value a record holds.
pub const MAX_VALUE: usize = 256;
/// Seed of the bucket hash (FORD's).
pub const HASH_SEED: u64 = 0xdead_beef;

/// Lock word bit: held.
pub const LOCKED: u64 = 1;

/// Slot states.
pub mod state {
    /// Never held a key.
    pub const FREE: u8 = 0;
    /// Holds a visible row.
    pub const LIVE: u8 = 1;
    /// Holds a deleted (invisible) row of its key.
    pub const DELETED: u8 = 2;
}

/// Value capacity of a record for `value_size` bytes.
pub const fn value_cap(value_size: usize) -> usize {
    value_size.next_multiple_of(8)
}

/// The version recovery gives a restored old image of version `old`: past
/// `old + 1`, which the dead transaction may have written (a reader that
/// saw that write then fails validation, even after a later commit).
pub const fn recovery_version(old: u64) -> u64 {
    old + 2
}

/// Bytes of a record for `value_size`-byte values.
pub const fn record_bytes(value_size: usize) -> usize {
    RECORD_HEADER + value_cap(value_size) + 8
}

/// Bytes of a bucket of records for `value_size`-byte values.
pub const fn bucket_bytes(value_size: usize) -> u64 {
    BUCKET_HEADER + (SLOTS * record_bytes(value_size)) as u64
}

/// Offset of slot `i` in its bucket.
pub const fn slot_offset(value_size: usize, i: usize) -> u64 {
    BUCKET_HEADER + (i * record_bytes(value_size)) as u64
}

/// A key's hash: its home bucket is the hash modulo the table's buckets
/// (the same on every replica).
pub fn key_hash(key: u64) -> u64 {
    murmur64a(key, HASH_SEED)
}

/// MurmurHash64A (Appleby) of an 8-byte key.
pub fn murmur64a(key: u64, seed: u64) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = seed ^ 8u64.wrapping_mul(M);
    let mut k = key.wrapping_mul(M);
    k ^= k >> R;
    k = k.wrapping_mul(M);
    h ^= k;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The owner fields of a lock word: whose transaction holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Owner {
    /// The compute blade's registry slot (1-based).
    pub blade: u16,
    /// Worker thread.
    pub thread: u16,
    /// Coroutine of the thread.
    pub coroutine: u16,
}

/// Most threads and coroutines a lock word can name.
pub const MAX_THREADS: usize = 1 << 12;
/// Bits of the transaction sequence in a lock word.
pub const SEQ_BITS: u32 = 23;

impl Owner {
    /// The lock word of this owner's transaction `seq` (its low 23 bits).
    pub fn lock_word(self, seq: u64) -> u64 {
        debug_assert!((self.thread as usize) < MAX_THREADS && (self.coroutine as usize) < MAX_THREADS);
        LOCKED
            | u64::from(self.blade) << 1
            | u64::from(self.thread) << 17
            | u64::from(self.coroutine) << 29
            | (seq & ((1 << SEQ_BITS) - 1)) << 41
    }

    /// The owner named by a held lock word.
    pub fn of(lock: u64) -> Option<Owner> {
        (lock & LOCKED != 0).then_some(Owner {
            blade: (lock >> 1) as u16,
            thread: ((lock >> 17) & 0xfff) as u16,
            coroutine: ((lock >> 29) & 0xfff) as u16,
        })
    }
}

fn word(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn put(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// A record decoded and verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Table id.
    pub table: u64,
    /// Key.
    pub key: u64,
    /// The primary copy's address.
    pub home: u64,
    /// Committed writes so far.
    pub version: u64,
    /// The lock word (as read; not covered by the CRC).
    pub lock: u64,
    /// FREE, LIVE or DELETED.
    pub state: u8,
    /// The value (its recorded size).
    pub value: &'a [u8],
}

/// The record's bytes failed their check: read while being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Torn;

/// CRC-32C of a record's bytes but its lock word and its CRC.
fn crc(rec: &[u8], cap: usize) -> u32 {
    crc32c_spans(&[&rec[..40], &rec[RECORD_HEADER..RECORD_HEADER + cap + 1]])
}

/// A record's key and table words, unverified (each is read whole).
pub fn key_of(rec: &[u8]) -> (u64, u64) {
    (word(rec, 16), word(rec, 0))
}

/// A record's lock word (0: free).
pub fn lock_of(rec: &[u8]) -> u64 {
    word(rec, LOCK as usize)
}

/// Decodes and verifies a record of a table with `value_size`-byte values.
///
/// # Errors
/// [`Torn`] if its CRC fails or its trailer's padding is not zero, or a
/// free slot is not all zero.
pub fn decode(rec: &[u8], value_size: usize) -> Result<Record<'_>, Torn> {
    let cap = value_cap(value_size);
    let trailer = RECORD_HEADER + cap;
    let st = rec[trailer];
    if st == state::FREE {
        let zero = rec[..40].iter().chain(&rec[RECORD_HEADER..trailer + 8]).all(|b| *b == 0);
        return if zero {
            Ok(Record { table: 0, key: 0, home: 0, version: 0, lock: word(rec, 40), state: st, value: &[] })
        } else {
            Err(Torn)
        };
    }
    let stored = u32::from_le_bytes(rec[trailer + 4..trailer + 8].try_into().expect("4 bytes"));
    let size = word(rec, 8) as usize;
    // The trailer's bytes between the state and the CRC are zero (the CRC
    // does not cover them).
    let pad = u32::from_le_bytes(rec[trailer..trailer + 4].try_into().expect("4 bytes")) >> 8;
    if st > state::DELETED || pad != 0 || stored != crc(rec, cap) || size > cap {
        return Err(Torn);
    }
    Ok(Record {
        table: word(rec, 0),
        key: word(rec, 16),
        home: word(rec, 24),
        version: word(rec, 32),
        lock: word(rec, 40),
        state: st,
        value: &rec[RECORD_HEADER..RECORD_HEADER + size],
    })
}

/// Encodes a record (with its CRC) into `out` (`record_bytes(value.len())`
/// bytes for a table of `value_size`-byte values).
#[allow(clippy::too_many_arguments, reason = "one argument per field of the declared layout")]
pub fn encode(
    out: &mut [u8],
    value_size: usize,
    table: u64,
    key: u64,
    home: GlobalAddr,
    version: u64,
    lock: u64,
    st: u8,
    value: &[u8],
) {
    let cap = value_cap(value_size);
    assert!(value.len() == value_size && out.len() >= record_bytes(value_size), "record of the wrong size");
    put(out, 0, table);
    put(out, 8, value_size as u64);
    put(out, 16, key);
    put(out, 24, home.raw());
    put(out, 32, version);
    put(out, 40, lock);
    out[RECORD_HEADER..RECORD_HEADER + value_size].copy_from_slice(value);
    out[RECORD_HEADER + value_size..RECORD_HEADER + cap].fill(0);
    let t = RECORD_HEADER + cap;
    out[t..t + 8].fill(0);
    out[t] = st;
    let c = crc(out, cap);
    out[t + 4..t + 8].copy_from_slice(&c.to_le_bytes());
}

/// A primary bucket header's next pointer (0: the chain ends) and its
/// mirrors (`mirrors[r]` is the bucket on replica `r`, for `r ≥ 1`; 0 in
/// the bucket arrays, where mirrors are at the same index of each
/// replica's array).
pub fn header_of(bucket: &[u8]) -> (u64, [u64; MAX_REPLICAS]) {
    (word(bucket, 0), std::array::from_fn(|r| if r == 0 { 0 } else { word(bucket, 8 * r) }))
}

/// The copies of an overflow bucket named by its header as read on replica
/// `r` (whose own word names the primary's copy), `copies[r]` being where
/// it was read; and its next pointer.
pub fn copies_named(header: &[u8], r: usize, at: GlobalAddr) -> (u64, [u64; MAX_REPLICAS]) {
    let copies = std::array::from_fn(|j| match j {
        _ if j == r => at.raw(),
        0 => word(header, 8 * r),
        _ => word(header, 8 * j),
    });
    (word(header, 0), copies)
}

/// The header of copy `r` of an overflow bucket whose copies are `copies`,
/// linking to `next` (see [`copies_named`]).
pub fn header_bytes(next: u64, copies: &[GlobalAddr; MAX_REPLICAS], r: usize) -> [u8; BUCKET_HEADER as usize] {
    let mut h = [0u8; BUCKET_HEADER as usize];
    h[..8].copy_from_slice(&next.to_le_bytes());
    for j in 1..MAX_REPLICAS {
        let w = if j == r { copies[0] } else { copies[j] };
        h[8 * j..8 * j + 8].copy_from_slice(&w.raw().to_le_bytes());
    }
    h
}

/// The undo log (ours; FORD's logs had no recovery and wrapped).
///
/// Each coroutine owns a ring of [`ENTRIES`](log::ENTRIES) entries; the
/// transaction with sequence `s` writes entry `s mod ENTRIES` in one WRITE
/// once every item it writes is locked and validated, and waits for it
/// before it writes any record. An entry holds each written item's old
/// image (state, version, value) and every replica's address: an undo log.
/// While a transaction's primaries all still hold its locks it has not
/// returned, and recovery restores the old images; once it released a lock,
/// every record WRITE was flushed, so it committed, and recovery releases
/// the rest. A restored image takes a version two past the old one (see
/// [`crate::layout::recovery_version`]). An entry is dead once its
/// transaction released its locks, before the next transaction of the
/// coroutine starts, so the ring never wraps over a live entry. A
/// transaction whose validation fails after its entry landed zeroes the
/// entry's magic on every copy before it releases its locks: recovery
/// never takes it for one that died while writing (which, where every
/// primary of its items is lost, it could only tell by the surviving
/// copies' versions, and others may have written them since).
///
/// ```text
/// entry   @0 magic u64   @8 registration nonce u64   @16 seq u64
///         @24 lock word u64   @32 items u32 | bytes u32   @40 crc32c u32 | 0
///         @48 0 u64 × 2, then items
/// item    @0 table u32 | old state u8 | lock's replica u8 | 0 u16
///         @8 key u64   @16 old version u64   @24 value size u64
///         @32 addresses u64 × 4 (by replica as created)
///         @64 value [value cap]
/// ```
/// The lock's replica is the primary in use when the transaction ran: 0,
/// or the backup promoted while the blade of replica 0 was out of the
/// configuration ([`crate::db::Db::without`]).
pub mod log {
    /// Entries per coroutine ring.
    pub const ENTRIES: u64 = 4;
    /// Bytes of an entry's header.
    pub const HEADER: usize = 64;
    /// Bytes of an item before its value.
    pub const ITEM_HEADER: usize = 64;
    /// Most written items per transaction.
    pub const MAX_WRITES: usize = 12;
    /// "FORDLOG2" (version 2: CRC-32C; version 1 had CRC-32).
    pub const MAGIC: u64 = u64::from_le_bytes(*b"FORDLOG2");

    /// Bytes of an entry with room for [`MAX_WRITES`] values of `max_value`.
    pub const fn entry_bytes(max_value: usize) -> usize {
        HEADER + MAX_WRITES * (ITEM_HEADER + super::value_cap(max_value))
    }

    /// The CRC-32C of an entry of `bytes` bytes (the CRC field counts as 0).
    pub fn crc(entry: &[u8]) -> u32 {
        super::crc32c_spans(&[&entry[..40], &[0; 8], &entry[48..]])
    }
}

/// The catalog: a named root per database on blade 0.
///
/// ```text
/// @0 magic "FORDCAT3"  @8 tables u64  @16 replicas u64  @24 blades u64
/// @32 registry GlobalAddr u64  @40 registry slots u64  @48 log bytes per coroutine u64
/// @56 largest value u64
/// @64 per table, 64 B: id u64 | value size u64 | buckets u64 | 0 u64
///                      | base GlobalAddr u64 × 4 (per replica)
/// ```
pub mod catalog {
    /// "FORDCAT3": records and log entries with CRC-32C, registry slots of
    /// 128 bytes naming the undo log's copies.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"FORDCAT3");
    /// "FORDCAT2": a database whose registry slots name one undo log copy
    /// (64-byte slots), which this version refuses to open.
    pub const MAGIC_V2: u64 = u64::from_le_bytes(*b"FORDCAT2");
    /// "FORDCAT1": a database of records with CRC-32 (before CRC-32C),
    /// which this version refuses to open.
    pub const MAGIC_V1: u64 = u64::from_le_bytes(*b"FORDCAT1");
    /// Bytes of the catalog's header.
    pub const HEADER: usize = 64;
    /// Bytes per table entry.
    pub const TABLE: usize = 64;
    /// Most tables of a database.
    pub const MAX_TABLES: usize = 16;
    /// Bytes of the catalog.
    pub const BYTES: usize = HEADER + MAX_TABLES * TABLE;
}

/// The registry of compute blades: one 128-byte slot each, slot 0 unused
/// (owner 0 would make a lock word indistinguishable from a bare bit).
///
/// ```text
/// slot  @0 claim u64 (0 free, else the holder's nonce; bit 63: recovering)
///       @8 lease expiry, Unix ms u64   @16 undo log area, copy 0, GlobalAddr u64
///       @24 threads u64   @32 coroutines u64   @40 pid u64
///       @48 host u8 × 16 (the holder's host name, its first 16 bytes, zero-padded;
///           not mirrored)
///       @64 undo log area, copies 1..3, GlobalAddr u64 × 3 (0 past the k-th)
///       @88 progress u64 (the holder's transactions committed in its measured
///           time so far, written with each renewal; not mirrored)
///       @96..@128 0
/// ```
/// The undo log area has one copy per replica (k), copy `j` on blade
/// `(slot + j) mod n`: a transaction writes its log entry to every copy in
/// its validation round, so any k − 1 lost memory blades leave every
/// compute blade's log readable.
/// A compute blade claims a free slot by CAS, renews its lease with a
/// WRITE every third of the lease, and frees the slot at a clean exit. A
/// slot whose lease expired belongs to a dead compute blade: recovery
/// claims it (sets bit 63 and its own lease), repairs, and frees it.
/// Leases compare wall clocks: compute blades must have synchronized
/// clocks (NTP) to within a small part of the lease.
pub mod registry {
    /// Bytes per slot.
    pub const SLOT: u64 = 128;
    /// Offset of the host name.
    pub const HOST: usize = 48;
    /// Offset of the undo log's copies 1..[`MAX_REPLICAS`](super::MAX_REPLICAS).
    pub const LOG_COPIES: usize = 64;
    /// Offset of the holder's progress (transactions committed so far),
    /// which an online copy reads to hold the foreground's share.
    pub const PROGRESS: usize = 88;
    /// Bytes of a slot's words that a registration writes and a mirror
    /// keeps (the host name in them zero).
    pub const WORDS: usize = LOG_COPIES + 8 * (super::MAX_REPLICAS - 1);
    /// Slots (owners 1..SLOTS).
    pub const SLOTS: u64 = 256;
    /// Claim word bit: a recovery holds the slot.
    pub const RECOVERING: u64 = 1 << 63;
}

/// A database's mirror on a blade other than 0 (see [`crate::mirror`]): what a
/// rebuild of blade 0 needs that only blade 0 holds.
///
/// ```text
/// @0 magic "FORDMIR2"   @8 the catalog's address (on blade 0)
/// @16 1 once the load completed (the root ford:NAME:loaded), else 0
/// @24 the database's name (a block written by Ctx::write_name, on the mirror's blade)
/// @32..@64 0
/// @64 the catalog's bytes (catalog::BYTES)
/// @64 + catalog::BYTES  the registry's slots as registered (registry::SLOTS
///     × registry::SLOT): claim, lease (ms, not an expiry), log area copy 0,
///     threads, coroutines, pid, 0 × 16, log area copies 1..3
/// ```
pub mod mirror {
    /// "FORDMIR2" (version 2: 128-byte registry slots).
    pub const MAGIC: u64 = u64::from_le_bytes(*b"FORDMIR2");
    /// Bytes of the header.
    pub const HEADER: usize = 64;
    /// Offset of the load mark (1 once the load completed).
    pub const LOADED: usize = 16;
    /// Offset of the catalog's copy.
    pub const CATALOG: usize = HEADER;
    /// Offset of the registry's copy.
    pub const REGISTRY: usize = CATALOG + super::catalog::BYTES;
    /// Bytes of a mirror.
    pub const BYTES: usize = REGISTRY + (super::registry::SLOTS * super::registry::SLOT) as usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_copy_of_an_overflow_bucket_names_the_others() {
        let copies = [GlobalAddr::new(1, 4096), GlobalAddr::new(2, 8192), GlobalAddr::new(0, 64), GlobalAddr::NULL];
        for r in 0..3 {
            let h = header_bytes(77, &copies, r);
            let (next, named) = copies_named(&h, r, copies[r]);
            assert_eq!(next, 77);
            assert_eq!(named, copies.map(GlobalAddr::raw), "copy {r}");
            // The word of a backup's own replica names the primary.
            let own = u64::from_le_bytes(h[8 * r..8 * r + 8].try_into().unwrap());
            assert_eq!(own, if r == 0 { 77 } else { copies[0].raw() });
        }
        assert_eq!(header_of(&header_bytes(5, &copies, 0)), (5, [0, copies[1].raw(), copies[2].raw(), 0]));
    }

    #[test]
    fn record_sizes_are_fords() {
        assert_eq!(record_bytes(8), 64, "SmallBank");
        assert_eq!(record_bytes(40), 96, "TATP");
        assert_eq!(bucket_bytes(8), 32 + 22 * 64);
        assert_eq!(slot_offset(8, 1), 32 + 64);
    }

    #[test]
    fn records_round_trip_and_tears_are_caught() {
        let mut r = vec![0u8; record_bytes(12)];
        let home = GlobalAddr::new(1, 4096);
        encode(&mut r, 12, 3, 77, home, 5, 0, state::LIVE, b"hello world!");
        let d = decode(&r, 12).unwrap();
        assert_eq!(
            (d.table, d.key, d.home, d.version, d.state, d.value),
            (3, 77, home.raw(), 5, 1, &b"hello world!"[..])
        );
        // The lock is outside the CRC.
        r[40] = 1;
        assert_eq!(decode(&r, 12).unwrap().lock, 1);
        // Any other 8-byte piece changed is a tear.
        for off in (0..r.len() - 8).step_by(8).filter(|o| *o != 40) {
            let mut t = r.clone();
            t[off] ^= 0x10;
            assert_eq!(decode(&t, 12), Err(Torn), "change at {off} not caught");
        }
        // A free slot is all zero (its lock aside); anything else is a
        // half-written insert.
        let mut f = vec![0u8; record_bytes(8)];
        f[40] = 1;
        assert_eq!(decode(&f, 8).unwrap().state, state::FREE);
        f[16] = 9;
        assert_eq!(decode(&f, 8), Err(Torn));
    }

    #[test]
    fn lock_words_name_their_owner() {
        let o = Owner { blade: 65535, thread: 4095, coroutine: 4095 };
        let w = o.lock_word(u64::MAX);
        assert_eq!(Owner::of(w), Some(o));
        assert_eq!(Owner::of(w & !LOCKED), None);
        let a = Owner { blade: 1, thread: 0, coroutine: 0 };
        assert_ne!(a.lock_word(1), a.lock_word(2));
        assert_eq!(a.lock_word(1), a.lock_word(1 + (1 << SEQ_BITS)));
    }

    #[test]
    fn murmur_spreads_keys() {
        // Consecutive keys land in buckets about evenly.
        let mut counts = [0u32; 64];
        for k in 0..64_000u64 {
            counts[(murmur64a(k, HASH_SEED) % 64) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert_ne!(murmur64a(1, HASH_SEED), murmur64a(1, HASH_SEED + 1));
    }

    #[test]
    fn log_entries_fit_a_batch() {
        assert!(log::entry_bytes(MAX_VALUE) <= 8 << 10);
        assert_eq!(catalog::BYTES, 64 + 16 * 64);
    }

    #[test]
    fn the_mirror_layout_is_pinned() {
        assert_eq!(mirror::MAGIC.to_le_bytes(), *b"FORDMIR2");
        assert_eq!(
            (mirror::HEADER, mirror::CATALOG, mirror::REGISTRY, mirror::BYTES),
            (64, 64, 1152, 1152 + 256 * 128)
        );
    }

    #[test]
    fn the_registry_layout_is_pinned() {
        assert_eq!(catalog::MAGIC.to_le_bytes(), *b"FORDCAT3");
        assert_eq!((registry::SLOT, registry::HOST, registry::LOG_COPIES, registry::WORDS), (128, 48, 64, 88));
        assert_eq!(registry::PROGRESS, registry::WORDS, "right after what a mirror keeps");
    }
}
