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
//! Each subscriber has 1–4 access-info rows and 1–4 special facilities of
//! distinct types (85% active); each facility has a call-forwarding row
//! per start time in {0, 8, 16} with probability 1/2. Subscriber ids are
//! drawn with NURand(A, 1, S) (A = 65535 up to a million subscribers,
//! 1048575 up to ten million, else 2097151).
//!
//! | transaction | share | does |
//! |---|---|---|
//! | GetSubscriberData | 35% | read SUBSCRIBER |
//! | GetNewDestination | 10% | read SPECIAL_FACILITY and one CALL_FORWARDING |
//! | GetAccessData | 35% | read ACCESS_INFO |
//! | UpdateSubscriberData | 2% | write SUBSCRIBER bit 1 and SPECIAL_FACILITY data_a |
//! | UpdateLocation | 14% | read SECONDARY_SUBSCRIBER, write SUBSCRIBER vlr_location |
//! | InsertCallForwarding | 2% | read SECONDARY_SUBSCRIBER and SPECIAL_FACILITY, insert CALL_FORWARDING |
//! | DeleteCallForwarding | 2% | read SECONDARY_SUBSCRIBER, delete CALL_FORWARDING |
//!
//! A row that does not exist aborts the transaction (FORD's semantics);
//! such outcomes are reported apart from conflicts (`not_found`, `exists`).

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
/// with their activity, and call-forwarding start times per facility.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Population {
    /// ai_types present.
    pub ai: Vec<u64>,
    /// (sf_type, active, start times present).
    pub sf: Vec<(u64, bool, Vec<u64>)>,
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
                let starts = [0, 8, 16].into_iter().filter(|_| rng.random_bool(0.5)).collect();
                (t, active, starts)
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
            for (t, _, starts) in &p.sf {
                for st in starts {
                    cf.push((tx.insert(CALL_FORWARDING, cf_key(s, *t, *st)), *st));
                }
            }
            match tx.execute().await {
                // Loaded before, all of them (one transaction).
                Err(TxnError::Abort(Abort::Exists)) => return Ok(()),
                r => r?,
            }
            for (id, st) in cf {
                tx.write(id, &sixteen(st + 1 + s % 8, s));
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
                tx.read(SPECIAL_FACILITY, sf_key(s, t));
                tx.read(CALL_FORWARDING, cf_key(s, t, start));
                tx.execute().await?;
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
                tx.write(cf, &sixteen(start + 1 + d.salt % 8, d.salt));
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
