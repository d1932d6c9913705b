//! # ycsb
//!
//! The YCSB workloads as the Smart paper uses them (Ren et al., ASPLOS '24, §6; Cooper et al., SoCC '10):
//! a key space `0..N`, requests drawn from a **scrambled Zipfian**
//! distribution (Gray et al., as in YCSB's `ScrambledZipfianGenerator`, so
//! hot keys are spread over the key space) or uniformly, and the standard
//! operation mixes.
//!
//! ```
//! use ycsb::{KeyChooser, Workload, Op};
//! use rand::SeedableRng;
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
//! let keys = KeyChooser::zipfian(1000, 0.99);
//! let k = keys.next(&mut rng);
//! assert!(k < 1000);
//! let w = Workload::parse("a").unwrap();
//! assert!(matches!(w.next_op(&mut rng), Op::Read | Op::Update));
//! ```

#![warn(missing_docs)]

pub mod bench;

use rand::Rng;

/// Gray et al.'s Zipfian generator over `0..n` with exponent `theta`
/// ("Quickly generating billion-record synthetic databases", SIGMOD '94),
/// the algorithm of YCSB's `ZipfianGenerator`: rank 0 is the most popular.
#[derive(Clone, Debug)]
pub struct Zipfian {
    n: u64,
    zeta2: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

/// Terms of ζ(n, θ) summed one by one; past them the tail is integrated.
const ZETA_EXACT_TERMS: u64 = 1 << 20;

/// ζ(n, θ) = Σ_{i=1..n} i^-θ, the normalizing constant of the Zipfian.
/// Summed term by term up to 2^20 terms; beyond, the tail Σ_{i=m..n} f(i)
/// comes from the Euler–Maclaurin formula, ∫_m^n f + (f(m) + f(n))/2 +
/// (f'(n) − f'(m))/12 with f(x) = x^-θ, whose error (of the order of the
/// third derivative at m, about m^-(θ+3)) is far below a double's precision
/// of the sum. So any key count starts at once (summing 10^12 terms took
/// minutes).
fn zeta(n: u64, theta: f64) -> f64 {
    if n <= ZETA_EXACT_TERMS {
        return zeta_exact(1, n, theta);
    }
    let head = zeta_exact(1, ZETA_EXACT_TERMS - 1, theta);
    let (m, nf) = (ZETA_EXACT_TERMS as f64, n as f64);
    let f = |x: f64| x.powf(-theta);
    let df = |x: f64| -theta * x.powf(-theta - 1.0);
    let integral = (nf.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta);
    head + integral + (f(m) + f(nf)) / 2.0 + (df(nf) - df(m)) / 12.0
}

/// Σ_{i=from..=to} i^-θ, term by term (smallest terms first, for accuracy).
fn zeta_exact(from: u64, to: u64, theta: f64) -> f64 {
    (from..=to).rev().map(|i| (i as f64).powf(-theta)).sum()
}

impl Zipfian {
    /// A generator over `0..n`.
    ///
    /// # Panics
    /// If `n` is 0 or `theta` is not in (0, 1) ∪ (1, ∞).
    pub fn new(n: u64, theta: f64) -> Zipfian {
        assert!(n > 0, "Zipfian over an empty range");
        assert!(theta > 0.0 && (theta - 1.0).abs() > 1e-9, "theta must be > 0 and not 1");
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = Self::eta(n, theta, zeta2, zetan);
        Zipfian { n, zeta2, theta, alpha, zetan, eta }
    }

    fn eta(n: u64, theta: f64, zeta2: f64, zetan: f64) -> f64 {
        (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan)
    }

    /// Items in the range.
    pub fn items(&self) -> u64 {
        self.n
    }

    /// Extends the range to `0..n` (no-op if it is not larger), adding the
    /// new terms to ζ one by one, as YCSB's generator does when its item
    /// count grows: cheap for the small steps of a growing key space.
    pub fn grow(&mut self, n: u64) {
        if n > self.n {
            self.zetan += zeta_exact(self.n + 1, n, self.theta);
            self.n = n;
            self.eta = Self::eta(n, self.theta, self.zeta2, self.zetan);
        }
    }

    /// The next rank (0 = most popular).
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

/// FNV-1a over the 8 bytes of `v` (YCSB's `fnvhash64`), to scramble ranks.
pub fn fnv64(v: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// YCSB's `SkewedLatest` distribution: the newest keys are the hottest.
/// Over keys `0..n` (all inserted), it returns `n − 1 − r` for a Zipfian
/// rank `r` over `0..n`; the Zipfian grows with `n`.
#[derive(Clone, Debug)]
pub struct Latest {
    zipf: Zipfian,
}

impl Latest {
    /// Over `0..n` initially, with exponent `theta`.
    pub fn new(n: u64, theta: f64) -> Latest {
        Latest { zipf: Zipfian::new(n, theta) }
    }

    /// A key of `0..n` (`n` ≥ the last one asked), newest first.
    pub fn next(&mut self, n: u64, rng: &mut impl Rng) -> u64 {
        self.zipf.grow(n);
        let n = self.zipf.items();
        n - 1 - self.zipf.next(rng)
    }
}

/// How request keys are chosen.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    /// Uniform over `0..n`.
    Uniform(u64),
    /// Scrambled Zipfian over `0..n`: a Zipfian rank, hashed over the space.
    Zipfian(Zipfian),
}

impl KeyChooser {
    /// The Zipfian exponent (`None` for uniform).
    pub fn theta(&self) -> Option<f64> {
        match self {
            KeyChooser::Uniform(_) => None,
            KeyChooser::Zipfian(z) => Some(z.theta),
        }
    }
}

impl KeyChooser {
    /// Scrambled Zipfian over `0..n` with exponent `theta`.
    pub fn zipfian(n: u64, theta: f64) -> KeyChooser {
        KeyChooser::Zipfian(Zipfian::new(n, theta))
    }

    /// The next key.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        match self {
            KeyChooser::Uniform(n) => rng.random_range(0..*n),
            KeyChooser::Zipfian(z) => fnv64(z.next(rng)) % z.n,
        }
    }
}

/// One request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read a key.
    Read,
    /// Overwrite a key's value.
    Update,
    /// Insert a new key.
    Insert,
    /// Scan a short range from a key.
    Scan,
    /// Read, then write back a modified value.
    ReadModifyWrite,
    /// Delete the oldest key the coroutine still has (workload `churn`).
    Delete,
}

/// An operation mix (fractions sum to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    /// Its name (`a` … `f`, `update-only`).
    pub name: &'static str,
    /// Fractions of read, update, insert, scan, read-modify-write, delete.
    pub mix: [f64; 6],
}

impl Workload {
    /// `a` (50/50 read/update; alias write-heavy), `b` (95/5; read-heavy),
    /// `c` (100 read; read-only), `d` (95/5 read/insert, reads from the
    /// latest distribution), `e` (95/5 scan/insert), `f` (50/50
    /// read/read-modify-write), `update-only`, and `churn` (not YCSB's:
    /// 50/50 insert/delete, each coroutine deleting its oldest key after
    /// each insert, so that the key count stays and every key is replaced
    /// as the run goes: the memory a structure gives back).
    ///
    /// # Errors
    /// Names the known workloads.
    pub fn parse(s: &str) -> Result<Workload, String> {
        let (name, mix) = match s {
            "a" | "write-heavy" => ("a", [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]),
            "b" | "read-heavy" => ("b", [0.95, 0.05, 0.0, 0.0, 0.0, 0.0]),
            "c" | "read-only" => ("c", [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
            "d" => ("d", [0.95, 0.0, 0.05, 0.0, 0.0, 0.0]),
            "e" => ("e", [0.0, 0.0, 0.05, 0.95, 0.0, 0.0]),
            "f" => ("f", [0.5, 0.0, 0.0, 0.0, 0.5, 0.0]),
            "update-only" => ("update-only", [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
            "churn" => ("churn", [0.0, 0.0, 0.5, 0.0, 0.0, 0.5]),
            other => {
                return Err(format!(
                    "unknown workload {other:?}: use a, b, c, d, e, f, update-only, churn (or write-heavy, \
                     read-heavy, read-only)"
                ))
            }
        };
        Ok(Workload { name, mix })
    }

    /// Whether reads follow YCSB's latest distribution (workload d) rather
    /// than the request distribution.
    pub fn reads_latest(&self) -> bool {
        self.name == "d"
    }

    /// Whether each coroutine alternates inserting a new key and deleting
    /// its oldest (workload `churn`) rather than drawing from the mix.
    pub fn alternates(&self) -> bool {
        self.name == "churn"
    }

    /// Draws the next operation.
    pub fn next_op(&self, rng: &mut impl Rng) -> Op {
        let mut u: f64 = rng.random();
        let ops = [Op::Read, Op::Update, Op::Insert, Op::Scan, Op::ReadModifyWrite, Op::Delete];
        for (op, p) in ops.into_iter().zip(self.mix) {
            if u < p {
                return op;
            }
            u -= p;
        }
        Op::Read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zeta_tail_matches_the_exact_sum_and_any_key_count_starts_at_once() {
        for theta in [0.5, 0.99, 1.2] {
            for n in [ZETA_EXACT_TERMS + 1, 3 * ZETA_EXACT_TERMS + 17] {
                let exact = zeta_exact(1, n, theta);
                let fast = zeta(n, theta);
                assert!(((fast - exact) / exact).abs() < 1e-12, "θ {theta} n {n}: {fast} vs {exact}");
            }
        }
        // 10^12 keys: 2^20 terms and a closed-form tail (summing every term
        // would keep this test busy for minutes).
        let z = Zipfian::new(1_000_000_000_000, 0.99);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        assert!((0..1000).all(|_| z.next(&mut rng) < 1_000_000_000_000));
    }
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn zipfian_is_skewed_like_theta_099() {
        let z = Zipfian::new(10_000, 0.99);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = vec![0u64; 10_000];
        let n = 200_000;
        for _ in 0..n {
            counts[z.next(&mut rng) as usize] += 1;
        }
        // P(rank 0) = 1 / zeta(n, θ); about 10% for n = 10^4, θ = 0.99.
        let p0 = counts[0] as f64 / n as f64;
        let expect = 1.0 / zeta(10_000, 0.99);
        assert!((p0 - expect).abs() < 0.01, "p0 {p0} vs {expect}");
        // Rank 1 about half as popular as rank 0 (1/2^θ).
        let ratio = counts[1] as f64 / counts[0] as f64;
        assert!((ratio - 0.5f64.powf(0.99)).abs() < 0.05, "{ratio}");
        // The top 1% of ranks take roughly half of the requests.
        let top: u64 = counts[..100].iter().sum();
        assert!(top as f64 / n as f64 > 0.4, "{top}");
    }

    #[test]
    fn scrambling_spreads_hot_keys_and_stays_in_range() {
        let k = KeyChooser::zipfian(1_000_000, 0.99);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut hot = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let key = k.next(&mut rng);
            assert!(key < 1_000_000);
            *hot.entry(key).or_insert(0u32) += 1;
        }
        let mut top: Vec<_> = hot.into_iter().collect();
        top.sort_by_key(|e| std::cmp::Reverse(e.1));
        // The hottest keys are not the smallest ones (scrambled).
        assert!(top[..10].iter().any(|(k, _)| *k > 1000), "{:?}", &top[..10]);
        let u = KeyChooser::Uniform(10);
        assert!((0..1000).all(|_| u.next(&mut rng) < 10));
    }

    #[test]
    fn a_grown_zipfian_equals_one_built_at_that_size() {
        let mut z = Zipfian::new(1000, 0.99);
        z.grow(1500);
        z.grow(1200); // never shrinks
        let fresh = Zipfian::new(1500, 0.99);
        assert_eq!(z.items(), 1500);
        assert!((z.zetan - fresh.zetan).abs() < 1e-9 && (z.eta - fresh.eta).abs() < 1e-9);
    }

    #[test]
    fn latest_makes_the_newest_keys_hottest() {
        let mut rng = SmallRng::seed_from_u64(5);
        let mut l = Latest::new(10_000, 0.99);
        let mut newest = 0;
        for _ in 0..100_000 {
            let k = l.next(10_000, &mut rng);
            assert!(k < 10_000);
            newest += u64::from(k == 9_999);
        }
        // P(newest) = P(rank 0) = 1/ζ(10^4, 0.99), about 10%.
        assert!((newest as f64 / 100_000.0 - 1.0 / zeta(10_000, 0.99)).abs() < 0.01, "{newest}");
        // As keys are inserted, the hot spot moves with them.
        let k = (0..1000).map(|_| l.next(20_000, &mut rng)).max().unwrap();
        assert_eq!(k, 19_999);
    }

    #[test]
    fn mixes_follow_their_fractions() {
        let mut rng = SmallRng::seed_from_u64(3);
        let a = Workload::parse("write-heavy").unwrap();
        let updates = (0..100_000).filter(|_| a.next_op(&mut rng) == Op::Update).count();
        assert!((updates as f64 / 100_000.0 - 0.5).abs() < 0.01);
        let c = Workload::parse("read-only").unwrap();
        assert!((0..1000).all(|_| c.next_op(&mut rng) == Op::Read));
        assert_eq!(Workload::parse("update-only").unwrap().mix[1], 1.0);
        assert!(Workload::parse("z").unwrap_err().contains("unknown workload"));
    }
}
