//! Adaptive work-request throttling (WorkReqThrot; Ren et al., ASPLOS '24,
//! Algorithm 1).
//!
//! Too many outstanding WRs thrash the RNIC's WQE cache, and the best depth
//! depends on threads and workload. So each thread holds credits:
//! posting a batch of `n` WRs takes `n` credits (waiting while there are
//! too few), its completion gives them back, and a tuner moves the limit
//! `C_max` at run time.
//!
//! One fix over the original: a batch larger than the whole limit would
//! wait forever there (it blocked when tuning was off and the limit small).
//! Here such a batch is admitted when nothing else is outstanding, so it
//! can never stall.

use crate::primitive::{AtomicI64, Ordering};

/// Per-thread credits. Atomic, so posting and polling may run on different
/// threads (a shared CQ); model-checked with loom.
#[derive(Debug)]
pub struct CreditThrottle {
    limit: AtomicI64,
    credit: AtomicI64,
}

impl CreditThrottle {
    /// Credits for `limit` outstanding WRs.
    pub fn new(limit: u32) -> Self {
        CreditThrottle { limit: AtomicI64::new(i64::from(limit)), credit: AtomicI64::new(i64::from(limit)) }
    }

    /// Takes `n` credits if there are enough, or if nothing is outstanding
    /// (so an oversized batch still goes, alone). Returns whether it took them.
    pub fn try_acquire(&self, n: u32) -> bool {
        let n = i64::from(n);
        let mut c = self.credit.load(Ordering::Acquire);
        loop {
            if c < n && c < self.limit.load(Ordering::Acquire) {
                return false;
            }
            match self.credit.compare_exchange_weak(c, c - n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => c = now,
            }
        }
    }

    /// Gives back `n` credits (a batch of `n` WRs completed).
    pub fn release(&self, n: u32) {
        self.credit.fetch_add(i64::from(n), Ordering::AcqRel);
    }

    /// `update_cmax(t)`: credit += t − C_max; C_max = t.
    pub fn set_limit(&self, t: u32) {
        let old = self.limit.swap(i64::from(t), Ordering::AcqRel);
        self.credit.fetch_add(i64::from(t) - old, Ordering::AcqRel);
    }

    /// The current limit `C_max`.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Acquire) as u32
    }

    /// Credits available now (negative right after the limit was lowered).
    pub fn available(&self) -> i64 {
        self.credit.load(Ordering::Acquire)
    }
}

/// Parameters of the tuner.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerConfig {
    /// Limits tried in each update phase (the paper: 4, 6, 8, 10, 12).
    pub candidates: Vec<u32>,
    /// Time each candidate is measured (the paper: Δ = 8 ms).
    pub delta_ns: u64,
    /// Length of the stable phase in Δ (the paper: 60, i.e. 480 ms).
    pub stable_deltas: u32,
    /// Limit before the first update phase ends.
    pub initial: u32,
}

impl Default for TunerConfig {
    fn default() -> Self {
        TunerConfig { candidates: vec![4, 6, 8, 10, 12], delta_ns: 8_000_000, stable_deltas: 60, initial: 8 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Measuring `candidates[idx]` since `since`, with `done` completed WRs then.
    Update { idx: usize, since: u64, done: u64, best: (u32, u64) },
    /// Keeping `limit` until `until`.
    Stable { until: u64 },
}

/// The epoch tuner: an update phase tries each candidate limit for Δ and
/// keeps the one that completed the most WRs; a stable phase keeps it for
/// `stable_deltas` × Δ; repeat. The application runs throughout.
#[derive(Clone, Debug)]
pub struct Tuner {
    cfg: TunerConfig,
    phase: Phase,
    limit: u32,
}

impl Tuner {
    /// A tuner that starts an update phase at `now_ns`; returns it and the
    /// first limit to apply.
    ///
    /// # Panics
    /// If there are no candidates or Δ is zero.
    pub fn new(cfg: TunerConfig, now_ns: u64, completed: u64) -> (Tuner, u32) {
        assert!(!cfg.candidates.is_empty() && cfg.delta_ns > 0, "tuner needs candidates and Δ > 0");
        let first = cfg.candidates[0];
        let t = Tuner {
            phase: Phase::Update { idx: 0, since: now_ns, done: completed, best: (first, 0) },
            limit: first,
            cfg,
        };
        (t, first)
    }

    /// The limit in force.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Advances with the time and the thread's running count of completed
    /// WRs; returns a new limit to apply when it changes.
    pub fn tick(&mut self, now_ns: u64, completed: u64) -> Option<u32> {
        match self.phase {
            Phase::Update { idx, since, done, best } => {
                if now_ns < since + self.cfg.delta_ns {
                    return None;
                }
                let n = completed - done;
                let best = if n > best.1 || idx == 0 { (self.cfg.candidates[idx], n) } else { best };
                let next = if idx + 1 < self.cfg.candidates.len() {
                    self.phase = Phase::Update { idx: idx + 1, since: now_ns, done: completed, best };
                    self.cfg.candidates[idx + 1]
                } else {
                    self.phase =
                        Phase::Stable { until: now_ns + self.cfg.delta_ns * u64::from(self.cfg.stable_deltas) };
                    best.0
                };
                self.limit = next;
                Some(next)
            }
            Phase::Stable { until } => {
                if now_ns < until {
                    return None;
                }
                let first = self.cfg.candidates[0];
                self.phase = Phase::Update { idx: 0, since: now_ns, done: completed, best: (first, 0) };
                self.limit = first;
                Some(first)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Drives a tuner against a synthetic throughput curve (WRs per Δ as a
    /// function of the limit); returns the limits chosen for each stable phase.
    fn converge(curve: impl Fn(u32) -> u64, epochs: usize) -> Vec<u32> {
        let cfg = TunerConfig::default();
        let delta = cfg.delta_ns;
        let (mut t, mut limit) = Tuner::new(cfg, 0, 0);
        let (mut now, mut done) = (0u64, 0u64);
        let mut chosen = Vec::new();
        while chosen.len() < epochs {
            now += delta / 4;
            done += curve(limit) / 4;
            if let Some(l) = t.tick(now, done) {
                if matches!(t.phase, Phase::Stable { .. }) {
                    chosen.push(l);
                }
                limit = l;
            }
        }
        chosen
    }

    #[test]
    fn picks_the_peak_of_the_throughput_curve() {
        // A cache-thrashing curve peaking at 8, and one preferring depth.
        assert_eq!(converge(|l| 1000 - (i64::from(l) - 8).unsigned_abs() * 100, 3), [8, 8, 8]);
        assert_eq!(converge(|l| u64::from(l) * 100, 2), [12, 12]);
        assert_eq!(converge(|l| 10_000 / u64::from(l), 2), [4, 4]);
    }

    #[test]
    fn follows_a_workload_change_at_the_next_epoch() {
        let cfg = TunerConfig::default();
        let (delta, stable) = (cfg.delta_ns, u64::from(cfg.stable_deltas));
        let (mut t, mut limit) = Tuner::new(cfg, 0, 0);
        let (mut now, mut done) = (0u64, 0u64);
        let mut history = Vec::new();
        // Peak at 6 for the first 1.5 epochs, then at 12.
        let change = (5 + stable) * delta * 3 / 2;
        while now < 4 * (5 + stable) * delta {
            now += delta / 2;
            let peak = if now < change { 6 } else { 12 };
            done += 1000 - (i64::from(limit) - peak).unsigned_abs() * 50;
            if let Some(l) = t.tick(now, done) {
                limit = l;
                if matches!(t.phase, Phase::Stable { .. }) {
                    history.push(l);
                }
            }
        }
        assert_eq!(history.first(), Some(&6));
        assert_eq!(history.last(), Some(&12));
    }

    #[test]
    fn credits_follow_algorithm_1() {
        let c = CreditThrottle::new(8);
        assert!(c.try_acquire(5));
        assert!(!c.try_acquire(4), "5 + 4 > 8");
        assert!(c.try_acquire(3));
        assert_eq!(c.available(), 0);
        c.set_limit(4); // credit += 4 − 8
        assert_eq!(c.available(), -4);
        c.release(5);
        assert!(!c.try_acquire(2), "1 credit left");
        c.release(3);
        assert_eq!(c.available(), c.limit() as i64);
        // An oversized batch goes alone instead of stalling forever.
        assert!(c.try_acquire(16));
        assert!(!c.try_acquire(1));
        c.release(16);
        assert_eq!(c.available(), 4);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::AtomicI64;
    use loom::sync::Arc;
    use loom::thread;

    use super::CreditThrottle;
    use crate::primitive::Ordering;

    /// Two posters and a tuner race; credits are conserved, the limit is
    /// respected (an oversized batch only alone), and nothing deadlocks.
    /// Preemptions are bounded (3) to keep the search to seconds.
    #[test]
    fn loom_credit_accounting() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let c = Arc::new(CreditThrottle::new(4));
            let inflight = Arc::new(AtomicI64::new(0));
            let poster = |n: u32| {
                let (c, inflight) = (c.clone(), inflight.clone());
                thread::spawn(move || {
                    while !c.try_acquire(n) {
                        thread::yield_now();
                    }
                    let now = inflight.fetch_add(i64::from(n), Ordering::AcqRel) + i64::from(n);
                    assert!(now <= 6 || now == i64::from(n), "{now} WRs outstanding");
                    inflight.fetch_sub(i64::from(n), Ordering::AcqRel);
                    c.release(n);
                })
            };
            let a = poster(3);
            let b = poster(5); // larger than the initial limit: goes alone
            c.set_limit(6); // the tuner, on the main thread
            a.join().unwrap();
            b.join().unwrap();
            assert_eq!(c.limit(), 6);
            assert_eq!(c.available(), 6, "credits leaked or were invented");
        });
    }
}
