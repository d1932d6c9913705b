//! SmallBank (Alomari et al., ICDE '08, as FORD runs it): savings and
//! checking accounts, six transactions.
//!
//! Balances are integer cents (`i64`; FORD kept an `f32`, which cannot be
//! audited exactly). Every account starts with [`START_CENTS`] in each
//! table. Each transaction flips one coin for its accounts, as FORD's and
//! the Smart artifact's SmallBank do: with probability 90% they are drawn
//! from the first `hot`, else uniformly from all; a pair is distinct and
//! both hot or both not. (A coin per account would make a pair both hot
//! with probability 0.81 only, and mix hot and cold accounts.)
//!
//! | transaction | share | items | money in |
//! |---|---|---|---|
//! | Amalgamate(a, b) | 15% | savings a, checking a, checking b (all written) | 0 |
//! | Balance(a) | 15% | savings a, checking a (read) | 0 |
//! | DepositChecking(a) | 15% | checking a | +1.30 |
//! | SendPayment(a, b) | 25% | checking a, checking b (aborts if a has < 5.00) | 0 |
//! | TransactSavings(a) | 15% | savings a | +20.20 |
//! | WriteCheck(a) | 15% | savings a (read), checking a | −5.00, or −6.00 if a has < 5.00 in all |
//!
//! **Audit.** With a ledger, each coroutine keeps the running total of the
//! money its committed transactions brought in, and their number, in a row
//! of the LEDGER table (`[cents i64][transactions u64]`) that the same
//! transactions update; so at every consistent state, even after a crash,
//! Σ balances = initial sum + Σ ledger cents, and Σ ledger transactions
//! counts every committed DepositChecking, TransactSavings and WriteCheck.

use ford_dtx::{Abort, Txn, TxnError};
use rand::{Rng, RngCore};
use smart_bench::below;

use crate::workload::{pick, Draw, Workload};

/// Table ids.
pub const SAVINGS: u32 = 0;
/// Checking accounts.
pub const CHECKING: u32 = 1;
/// One row per coroutine ever run with a ledger: its money brought in.
pub const LEDGER: u32 = 2;
/// The key of the LEDGER table's mark of a run without a ledger (above
/// every coroutine's ledger key): balances changed that no ledger counts,
/// so an audit can no longer check the money (it says so instead).
pub const UNLEDGERED: u64 = 1 << 40;
/// Starting balance of every account in each table, in cents.
pub const START_CENTS: i64 = 1_000_000;

/// Transaction types, in report order.
pub const TYPES: [&str; 6] =
    ["amalgamate", "balance", "deposit_checking", "send_payment", "transact_savings", "write_check"];
/// Their shares of the benchmark's mix, in percent (the default of
/// [`SmallBank::mix`]).
pub const MIX: [u32; 6] = [15, 15, 15, 25, 15, 15];

/// The SmallBank workload.
#[derive(Clone, Debug)]
pub struct SmallBank {
    /// Accounts.
    pub accounts: u64,
    /// Hot accounts (drawn with probability 90%).
    pub hot: u64,
    /// Keep the ledger (for the audit).
    pub ledger: bool,
    /// Percent of each transaction type drawn, in [`TYPES`] order (summing
    /// to 100; [`MIX`] is the benchmark's).
    pub mix: [u32; 6],
}

/// Balance in cents.
pub fn cents(v: &[u8]) -> i64 {
    i64::from_le_bytes(v[..8].try_into().expect("8-byte values"))
}

/// A ledger row: (cents brought in, committed transactions).
pub fn ledger_row(v: &[u8]) -> (i64, u64) {
    (cents(v), u64::from_le_bytes(v[8..16].try_into().expect("16-byte ledger rows")))
}

fn ledger_value(cents: i64, n: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&cents.to_le_bytes());
    v[8..].copy_from_slice(&n.to_le_bytes());
    v
}

fn put(tx: &mut Txn, id: ford_dtx::ItemId, c: i64) {
    tx.write(id, &c.to_le_bytes());
}

impl SmallBank {
    /// The range a transaction draws its accounts from: one coin per
    /// transaction, as FORD's and the Smart artifact's SmallBank flip it:
    /// 90% the hot set, else every account. Both accounts of a pair come
    /// from it (both hot or both not).
    fn range(&self, rng: &mut impl Rng) -> u64 {
        if below(rng.next_u64(), 10) < 9 {
            self.hot.min(self.accounts)
        } else {
            self.accounts
        }
    }

    /// The initial sum of all balances.
    pub fn initial_sum(&self) -> i64 {
        2 * self.accounts as i64 * START_CENTS
    }
}

impl Workload for SmallBank {
    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn tables(&self) -> Vec<(String, usize, u64)> {
        vec![("savings".into(), 8, self.accounts), ("checking".into(), 8, self.accounts), ("ledger".into(), 16, 4096)]
    }

    fn types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn mix(&self) -> &[u32] {
        &self.mix
    }

    fn rows(&self) -> u64 {
        self.accounts
    }

    fn draw(&self, rng: &mut rand::rngs::SmallRng) -> Draw {
        let ty = pick(&self.mix, rng);
        // A second account distinct from the first, from the same range
        // (from every account when that range holds one).
        let mut range = self.range(rng);
        let a = below(rng.next_u64(), range);
        if range == 1 {
            range = self.accounts;
        }
        let mut b = below(rng.next_u64(), range);
        while b == a && range > 1 {
            b = below(rng.next_u64(), range);
        }
        Draw { ty, keys: [a, b, 0], salt: 0 }
    }

    async fn load(&self, tx: &mut Txn, row: u64) -> Result<(), TxnError> {
        tx.begin();
        let s = tx.insert(SAVINGS, row);
        let c = tx.insert(CHECKING, row);
        match tx.execute().await {
            // Loaded before (a load that resumes an interrupted one): kept as
            // it is. Both rows go in one transaction, so both are there.
            Err(TxnError::Abort(Abort::Exists)) => return Ok(()),
            r => r?,
        }
        put(tx, s, START_CENTS);
        put(tx, c, START_CENTS);
        tx.commit().await
    }

    async fn prepare(&self, tx: &mut Txn, me: u64) -> Result<(), TxnError> {
        if !self.ledger {
            // The database remembers that this run changes balances without
            // ledgers (marked once, by its first coroutine, before any
            // transaction of it).
            if me & 0xff_ffff != 0 {
                return Ok(());
            }
            tx.begin();
            let m = tx.insert(LEDGER, UNLEDGERED);
            match tx.execute().await {
                Err(TxnError::Abort(Abort::Exists)) => return Ok(()),
                r => r?,
            }
            tx.write(m, &ledger_value(0, 0));
            return tx.commit().await;
        }
        tx.begin();
        let l = tx.insert(LEDGER, me);
        match tx.execute().await {
            // An earlier process's row under the same owner: kept, added to.
            Err(TxnError::Abort(Abort::Exists)) => return Ok(()),
            r => r?,
        }
        tx.write(l, &[0; 16]);
        tx.commit().await
    }

    async fn run(&self, tx: &mut Txn, d: &Draw, me: u64) -> Result<(), TxnError> {
        let [a, b, _] = d.keys;
        tx.begin();
        // The ledger row goes in the transaction's first round.
        let ledger = (self.ledger && matches!(d.ty, 2 | 4 | 5)).then(|| tx.update(LEDGER, me));
        let delta = match d.ty {
            0 => {
                let (sa, ca, cb) = (tx.update(SAVINGS, a), tx.update(CHECKING, a), tx.update(CHECKING, b));
                tx.execute().await?;
                let total = cents(tx.value(sa)) + cents(tx.value(ca));
                let to = cents(tx.value(cb)) + total;
                put(tx, sa, 0);
                put(tx, ca, 0);
                put(tx, cb, to);
                0
            }
            1 => {
                tx.read(SAVINGS, a);
                tx.read(CHECKING, a);
                tx.execute().await?;
                0
            }
            2 => {
                let c = tx.update(CHECKING, a);
                tx.execute().await?;
                let v = cents(tx.value(c)) + 130;
                put(tx, c, v);
                130
            }
            3 => {
                let (ca, cb) = (tx.update(CHECKING, a), tx.update(CHECKING, b));
                tx.execute().await?;
                let (va, vb) = (cents(tx.value(ca)), cents(tx.value(cb)));
                if va < 500 {
                    tx.abort().await?;
                    return Err(TxnError::Abort(Abort::User));
                }
                put(tx, ca, va - 500);
                put(tx, cb, vb + 500);
                0
            }
            4 => {
                let s = tx.update(SAVINGS, a);
                tx.execute().await?;
                let v = cents(tx.value(s)) + 2020;
                put(tx, s, v);
                2020
            }
            _ => {
                let (s, c) = (tx.read(SAVINGS, a), tx.update(CHECKING, a));
                tx.execute().await?;
                let total = cents(tx.value(s)) + cents(tx.value(c));
                let take = if total < 500 { 600 } else { 500 };
                let v = cents(tx.value(c)) - take;
                put(tx, c, v);
                -take
            }
        };
        if let Some(l) = ledger {
            let (c, n) = ledger_row(tx.value(l));
            tx.write(l, &ledger_value(c + delta, n + 1));
        }
        tx.commit().await
    }
}
