//! TATP (the Telecom Application Transaction Processing benchmark, as FORD
//! runs it): five tables, seven transactions, ~80% read-only.
//!
//! | table | key | value |
//! |---|---|---|
//! | SUBSCRIBER | s_id (1..=S) | 40 B: vlr_location u32, msc_location u32, bits u64, hex and byte fields |
//! | SECONDARY_SUBSCRIBER | sub_nbr (s_id tagged) | 8 B: s_id |
//! | ACCESS_INFO | s_id·4 + ai_type − 1 | 16 B: data1..4 |
//! | SPECIAL_FACILITY | s_id·4 + sf_type − 1 | 8 B: is_active, error_cntrl, data_a, data_b |
//! | CALL_FORWARDING | (s_id·4 + sf_type − 1)·3 + start_time/8 | 16 B: end_time u64, numberx u64 |
//!
//! The population follows the TATP specification's rules: each subscriber
//! has 1–4 access-info rows and 1–4 special facilities of distinct types
//! (85% active); each facility has 0–3 call-forwarding rows (uniform), of
//! distinct start times in {0, 8, 16}, each ending at start + 1..8
//! (uniform). Subscriber ids are drawn with NURand(A, 1, S) (A = 65535 up
//! to a million subscribers, 1048575 up to ten million, else 2097151).
//!
//! | transaction | share | does |
//! |---|---|---|
//! | GetSubscriberData | 35% | read SUBSCRIBER |
//! | GetNewDestination | 10% | the specification's query: SPECIAL_FACILITY (s, sf_type) active, and a CALL_FORWARDING row of it with start ≤ the drawn start time (of {0, 8, 16}) ending after the drawn end time (1..24) |
//! | GetAccessData | 35% | read ACCESS_INFO |
//! | UpdateSubscriberData | 2% | write SUBSCRIBER bit 1 and SPECIAL_FACILITY data_a |
//! | UpdateLocation | 14% | read SECONDARY_SUBSCRIBER, write SUBSCRIBER vlr_location |
//! | InsertCallForwarding | 2% | read SECONDARY_SUBSCRIBER and SPECIAL_FACILITY, insert CALL_FORWARDING |
//! | DeleteCallForwarding | 2% | read SECONDARY_SUBSCRIBER, delete CALL_FORWARDING |
//!
//! A row that does not exist aborts the transaction (FORD's semantics), as
//! does a GetNewDestination whose query selects nothing; such outcomes are
//! reported apart from conflicts (`not_found`, `exists`).
//!
//! Success rates: the specification states GetNewDestination succeeds in
//! about 23.9% of the cases. Its own population rules give less: with 1–4
//! facilities per subscriber (a drawn type exists 62.5% of the time), 85%
//! active, and the call-forwarding rows above, the query selects a row for
//! 27.8% of existing active facilities, 14.8% in all
//! ([`get_new_destination_odds`] computes it exactly, and the tests check
//! runs against it). FORD and the Smart artifact populate
//! call forwarding at a steady state instead (each start time present with
//! probability 1/2, end times 1..24 unrelated to the start), which gives
//! 22%; we follow the specification's population, as its inserts then
//! move the table towards that steady state (an insert's end time is
//! drawn 1..24, as the specification's InsertCallForwarding draws it).

use ford_dtx::{Abort, Txn, TxnError};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use smart_bench::below;

use crate::workload::{pick, Draw, Workload};

/// Table ids.
pub const SUBSCRIBER: u32 = 0;
/// sub_nbr → s_id.
pub const SECONDARY_SUBSCRIBER: u32 = 1;
/// Access info.
pub const ACCESS_INFO: u32 = 2;
/// Special facilities.
pub const SPECIAL_FACILITY: u32 = 3;
/// Call forwarding.
pub const CALL_FORWARDING: u32 = 4;

/// Transaction types, in report order.
pub const TYPES: [&str; 7] = [
    "get_subscriber_data",
    "get_new_destination",
    "get_access_data",
    "update_subscriber_data",
    "update_location",
    "insert_call_forwarding",
    "delete_call_forwarding",
];
/// Their shares of the benchmark's mix, in percent (the default of
/// [`Tatp::mix`]).
pub const MIX: [u32; 7] = [35, 10, 35, 2, 14, 2, 2];

const SUB_NBR_TAG: u64 = 1 << 48;

/// The sub_nbr key of subscriber `s`.
pub fn sub_nbr(s: u64) -> u64 {
    s | SUB_NBR_TAG
}

/// ACCESS_INFO key.
pub fn ai_key(s: u64, ai_type: u64) -> u64 {
    s * 4 + ai_type - 1
}

/// SPECIAL_FACILITY key.
pub fn sf_key(s: u64, sf_type: u64) -> u64 {
    s * 4 + sf_type - 1
}

/// CALL_FORWARDING key.
pub fn cf_key(s: u64, sf_type: u64, start: u64) -> u64 {
    sf_key(s, sf_type) * 3 + start / 8
}

/// The TATP workload.
#[derive(Clone, Debug)]
pub struct Tatp {
    /// Subscribers (ids 1..=S).
    pub subscribers: u64,
    /// Percent of each transaction type drawn, in [`TYPES`] order (summing
    /// to 100; [`MIX`] is the benchmark's).
    pub mix: [u32; 7],
}

/// One subscriber's rows as loaded: access-info types, facility types
/// with their activity, and call-forwarding rows per facility.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Population {
    /// ai_types present.
    pub ai: Vec<u64>,
    /// (sf_type, active, call-forwarding rows).
    pub sf: Vec<(u64, bool, Vec<Forwarding>)>,
}

/// A call-forwarding row: (start time, end time).
pub type Forwarding = (u64, u64);

/// Whether GetNewDestination's query selects a row among a facility's
/// call-forwarding `rows` ((start, end) pairs), for the drawn start time
/// and end time: some row starts at or before `start` and ends after
/// `end`.
pub fn forwards(rows: impl IntoIterator<Item = (u64, u64)>, start: u64, end: u64) -> bool {
    rows.into_iter().any(|(st, et)| st <= start && end < et)
}

/// The probability, exact over this population's rules and the query's
/// draws, that GetNewDestination selects a row: (given an existing active
/// facility, over all draws).
pub fn get_new_destination_odds() -> (f64, f64) {
    // Every set of start times, each set size 0..=3 equally likely and the
    // sets of one size equally likely; every end offset 1..=8; every draw.
    let starts = [0u64, 8, 16];
    let (mut hit, mut all) = (0.0, 0.0);
    for mask in 0u32..8 {
        let rows: Vec<u64> = (0..3).filter(|i| mask >> i & 1 == 1).map(|i| starts[i]).collect();
        let k = rows.len() as u32;
        let sets_of_size = [1.0, 3.0, 3.0, 1.0][k as usize];
        let p_set = 0.25 / sets_of_size;
        for offsets in 0..8u32.pow(k) {
            let p = p_set / f64::from(8u32.pow(k));
            let ends =
                rows.iter().enumerate().map(|(i, st)| (*st, st + 1 + u64::from(offsets / 8u32.pow(i as u32) % 8)));
            let ends: Vec<_> = ends.collect();
            for start in starts {
                for end in 1..=24 {
                    let q = p / 3.0 / 24.0;
                    all += q;
                    if forwards(ends.iter().copied(), start, end) {
                        hit += q;
                    }
                }
            }
        }
    }
    let given = hit / all;
    (given, given * 0.625 * 0.85)
}

/// `n` distinct types out of 1..=4, `n` uniform in 1..=4.
fn types(rng: &mut SmallRng) -> Vec<u64> {
    let mut all = vec![1, 2, 3, 4];
    let n = rng.random_range(1..=4);
    for i in 0..n {
        let j = rng.random_range(i..4);
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

impl Tatp {
    /// TATP over `subscribers` subscribers with the benchmark's mix.
    pub fn new(subscribers: u64) -> Tatp {
        Tatp { subscribers, mix: MIX }
    }

    /// NURand's A for this many subscribers.
    pub fn nurand_a(&self) -> u64 {
        match self.subscribers {
            0..=1_000_000 => 65_535,
            1_000_001..=10_000_000 => 1_048_575,
            _ => 2_097_151,
        }
    }

    /// A subscriber id by NURand(A, 1, S).
    pub fn subscriber(&self, rng: &mut impl Rng) -> u64 {
        let s = self.subscribers;
        ((below(rng.next_u64(), self.nurand_a() + 1) | (1 + below(rng.next_u64(), s))) % s) + 1
    }

    /// Subscriber `s`'s rows (the same for every loader: seeded by `s`).
    pub fn population(s: u64) -> Population {
        let mut rng = SmallRng::seed_from_u64(s.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let ai = types(&mut rng);
        let sf = types(&mut rng)
            .into_iter()
            .map(|t| {
                let active = rng.random_bool(0.85);
                // 0..=3 rows of distinct start times, each ending 1..=8
                // after its start.
                let mut starts = [0u64, 8, 16];
                let n = rng.random_range(0..=3);
                for i in 0..n {
                    let j = rng.random_range(i..3);
                    starts.swap(i, j);
                }
                let mut rows: Vec<_> = starts[..n].iter().map(|&st| (st, st + rng.random_range(1..=8))).collect();
                rows.sort_unstable();
                (t, active, rows)
            })
            .collect();
        Population { ai, sf }
    }

    /// Subscriber `s`'s rows but call forwarding, in one transaction.
    async fn load_main(&self, tx: &mut Txn, s: u64, p: &Population) -> Result<(), TxnError> {
        tx.begin();
        let sub = tx.insert(SUBSCRIBER, s);
        let ss = tx.insert(SECONDARY_SUBSCRIBER, sub_nbr(s));
        let ai: Vec<_> = p.ai.iter().map(|t| tx.insert(ACCESS_INFO, ai_key(s, *t))).collect();
        let sf: Vec<_> = p.sf.iter().map(|(t, _, _)| tx.insert(SPECIAL_FACILITY, sf_key(s, *t))).collect();
        tx.execute().await?;
        tx.write(sub, &Tatp::subscriber_value(s));
        tx.write(ss, &s.to_le_bytes());
        for (id, t) in ai.into_iter().zip(&p.ai) {
            tx.write(id, &sixteen(s ^ t, *t));
        }
        for (id, (t, active, _)) in sf.into_iter().zip(&p.sf) {
            tx.write(id, &[u8::from(*active), 0, (*t as u8) ^ (s as u8), 0, 0, 0, 0, 0]);
        }
        tx.commit().await
    }

    fn subscriber_value(s: u64) -> [u8; 40] {
        let mut v = [0u8; 40];
        v[..4].copy_from_slice(&(s as u32).to_le_bytes());
        v[4..8].copy_from_slice(&((s as u32).wrapping_mul(7)).to_le_bytes());
        v[8..16].copy_from_slice(&s.rotate_left(17).to_le_bytes());
        for (i, b) in v[16..].iter_mut().enumerate() {
            *b = (s as u8).wrapping_add(i as u8);
        }
        v
    }
}

fn sixteen(a: u64, b: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&a.to_le_bytes());
    v[8..].copy_from_slice(&b.to_le_bytes());
    v
}

impl Workload for Tatp {
    fn name(&self) -> &'static str {
        "tatp"
    }

    fn tables(&self) -> Vec<(String, usize, u64)> {
        let s = self.subscribers;
        vec![
            ("subscriber".into(), 40, s),
            ("secondary_subscriber".into(), 8, s),
            ("access_info".into(), 16, 5 * s / 2),
            ("special_facility".into(), 8, 5 * s / 2),
            ("call_forwarding".into(), 16, 4 * s),
        ]
    }

    fn types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn mix(&self) -> &[u32] {
        &self.mix
    }

    fn rows(&self) -> u64 {
        self.subscribers
    }

    fn draw(&self, rng: &mut SmallRng) -> Draw {
        let ty = pick(&self.mix, rng);
        Draw {
            ty,
            keys: [self.subscriber(rng), 1 + below(rng.next_u64(), 4), 8 * below(rng.next_u64(), 3)],
            salt: rng.next_u64(),
        }
    }

    async fn load(&self, tx: &mut Txn, row: u64) -> Result<(), TxnError> {
        let s = row + 1;
        let p = Tatp::population(s);
        // Two transactions; a retry after the second aborted finds the
        // first's rows (Exists): they are loaded.
        match self.load_main(tx, s, &p).await {
            Err(TxnError::Abort(Abort::Exists)) | Ok(()) => {}
            Err(e) => return Err(e),
        }
        if p.sf.iter().any(|(_, _, st)| !st.is_empty()) {
            tx.begin();
            let mut cf = Vec::new();
            for (t, _, rows) in &p.sf {
                for &(st, end) in rows {
                    cf.push((tx.insert(CALL_FORWARDING, cf_key(s, *t, st)), end));
                }
            }
            match tx.execute().await {
                // Loaded before, all of them (one transaction).
                Err(TxnError::Abort(Abort::Exists)) => return Ok(()),
                r => r?,
            }
            for (id, end) in cf {
                tx.write(id, &sixteen(end, s));
            }
            tx.commit().await?;
        }
        Ok(())
    }

    async fn prepare(&self, _tx: &mut Txn, _me: u64) -> Result<(), TxnError> {
        Ok(())
    }

    async fn run(&self, tx: &mut Txn, d: &Draw, _me: u64) -> Result<(), TxnError> {
        let [s, t, start] = d.keys;
        tx.begin();
        match d.ty {
            0 => {
                tx.read(SUBSCRIBER, s);
                tx.execute().await?;
            }
            1 => {
                // The facility must exist (a missing row aborts) and be
                // active; its call-forwarding rows that start at or before
                // the drawn start time are read in the same round trip,
                // each possibly missing.
                let end = 1 + d.salt % 24;
                let sf = tx.read(SPECIAL_FACILITY, sf_key(s, t));
                let mut cf = [None; 3];
                for (i, c) in cf.iter_mut().enumerate().take(start as usize / 8 + 1) {
                    *c = Some((i as u64 * 8, tx.read_if_any(CALL_FORWARDING, cf_key(s, t, i as u64 * 8))));
                }
                tx.execute().await?;
                let rows = cf.into_iter().flatten().filter(|(_, id)| tx.exists(*id));
                let rows =
                    rows.map(|(st, id)| (st, u64::from_le_bytes(tx.value(id)[..8].try_into().expect("8 bytes"))));
                if tx.value(sf)[0] != 1 || !forwards(rows, start, end) {
                    tx.abort().await?;
                    return Err(TxnError::Abort(Abort::NotFound));
                }
            }
            2 => {
                tx.read(ACCESS_INFO, ai_key(s, t));
                tx.execute().await?;
            }
            3 => {
                let (sub, sf) = (tx.update(SUBSCRIBER, s), tx.update(SPECIAL_FACILITY, sf_key(s, t)));
                tx.execute().await?;
                let mut v = [0u8; 40];
                v.copy_from_slice(tx.value(sub));
                v[8] = (v[8] & !1) | (d.salt & 1) as u8;
                tx.write(sub, &v);
                let mut f = [0u8; 8];
                f.copy_from_slice(tx.value(sf));
                f[2] = (d.salt >> 8) as u8;
                tx.write(sf, &f);
            }
            4 => {
                let ss = tx.read(SECONDARY_SUBSCRIBER, sub_nbr(s));
                tx.execute().await?;
                let id = u64::from_le_bytes(tx.value(ss)[..8].try_into().expect("8 bytes"));
                let sub = tx.update(SUBSCRIBER, id);
                tx.execute().await?;
                let mut v = [0u8; 40];
                v.copy_from_slice(tx.value(sub));
                v[..4].copy_from_slice(&(d.salt as u32).to_le_bytes());
                tx.write(sub, &v);
            }
            5 => {
                let ss = tx.read(SECONDARY_SUBSCRIBER, sub_nbr(s));
                tx.execute().await?;
                let id = u64::from_le_bytes(tx.value(ss)[..8].try_into().expect("8 bytes"));
                tx.read(SPECIAL_FACILITY, sf_key(id, t));
                let cf = tx.insert(CALL_FORWARDING, cf_key(id, t, start));
                tx.execute().await?;
                tx.write(cf, &sixteen(1 + d.salt % 24, d.salt));
            }
            _ => {
                let ss = tx.read(SECONDARY_SUBSCRIBER, sub_nbr(s));
                tx.execute().await?;
                let id = u64::from_le_bytes(tx.value(ss)[..8].try_into().expect("8 bytes"));
                tx.delete(CALL_FORWARDING, cf_key(id, t, start));
                tx.execute().await?;
            }
        }
        tx.commit().await
    }
}
