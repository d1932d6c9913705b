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

/// How the tuner's update phase picks the limits it measures.
#[derive(Clone, Debug, PartialEq)]
pub enum Search {
    /// The paper's tuner: each limit of a fixed set for Δ, in order; the one
    /// that completed the most WRs is kept. [`TunerConfig::paper`] uses
    /// 4, 6, 8, 10, 12, chosen for a ConnectX-6 with ~2 µs round trips.
    Fixed(Vec<u32>),
    /// A search scaled to the thread and the transport, between `min` and
    /// `max`, where `max` throttles nothing (0: the thread's bound on WRs
    /// in flight, which the runtime fills in). See [`Tuner`].
    Range {
        /// The smallest limit tried.
        min: u32,
        /// The largest limit, tried first; 0 = the thread's bound.
        max: u32,
    },
}

/// Parameters of the tuner.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerConfig {
    /// The limits the update phase measures.
    pub search: Search,
    /// Time each limit is measured (the paper: Δ = 8 ms).
    pub delta_ns: u64,
    /// Length of the stable phase in Δ (the paper: 60, i.e. 480 ms). The
    /// range search doubles it, up to 8 times, while its choice holds.
    pub stable_deltas: u32,
    /// Range search: a smaller limit replaces a larger one only if it
    /// completed this fraction more WRs per Δ (a noise margin that keeps
    /// the thread unthrottled unless throttling clearly pays).
    pub margin: f64,
    /// Range search: the stable phase ends early when two windows of 4 Δ
    /// in a row complete this fraction more or fewer WRs than the chosen
    /// limit did when it was measured (the workload changed).
    pub shift: f64,
}

impl Default for TunerConfig {
    /// The range search from the thread's bound down to 1, Δ = 8 ms, stable phases of 60 Δ.
    fn default() -> Self {
        TunerConfig {
            search: Search::Range { min: 1, max: 0 },
            delta_ns: 8_000_000,
            stable_deltas: 60,
            margin: 0.05,
            shift: 0.25,
        }
    }
}

impl TunerConfig {
    /// The paper's tuner, for faithful comparisons: candidates 4, 6, 8, 10,
    /// 12, Δ = 8 ms, stable phases of 60 Δ.
    pub fn paper() -> TunerConfig {
        TunerConfig { search: Search::Fixed(vec![4, 6, 8, 10, 12]), ..TunerConfig::default() }
    }

    /// A constant limit.
    pub fn fixed(limit: u32) -> TunerConfig {
        TunerConfig { search: Search::Fixed(vec![limit]), ..TunerConfig::default() }
    }

    /// Checks the parameters, filling in an automatic `max` with `bound`
    /// (the thread's most WRs in flight).
    ///
    /// # Errors
    /// What is out of range.
    pub fn resolve(mut self, bound: u32) -> Result<TunerConfig, String> {
        if self.delta_ns == 0 {
            return Err("work-req-throt needs Δ > 0".into());
        }
        if !(0.0..1.0).contains(&self.margin) || !(0.0..10.0).contains(&self.shift) || self.shift == 0.0 {
            return Err(format!("work-req-throt: margin {} or shift {} out of range", self.margin, self.shift));
        }
        match &mut self.search {
            Search::Fixed(c) if c.is_empty() || c.contains(&0) => {
                Err("work-req-throt needs non-zero candidate limits".into())
            }
            Search::Range { min, max } => {
                if *max == 0 {
                    *max = bound.max(*min);
                }
                if *min == 0 || *min > *max {
                    return Err(format!("work-req-throt range {min}..={max} is empty or starts at 0"));
                }
                Ok(self)
            }
            Search::Fixed(_) => Ok(self),
        }
    }
}

/// Δ per window of the stable phase's check for a changed workload: long
/// enough that scheduling noise rarely moves two windows in a row.
const SHIFT_WINDOW: u64 = 4;

/// Where the range search is within an update phase.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// Halving from `max`, until the completions drop clearly.
    Descend,
    /// Trying the limits between the best and its measured neighbours.
    Refine { left: usize },
    /// Measuring `max` again, then the best again, before throttling.
    Confirm { max_done: Option<u64> },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Measuring `limit` since `since`, with `done` completed WRs then.
    Update { since: u64, done: u64 },
    /// Keeping `limit` until `until`; the current window started at
    /// `since` with `done` completed WRs; `off` windows in a row were off
    /// the reference.
    Stable { until: u64, since: u64, done: u64, off: u32 },
}

/// The epoch tuner of WorkReqThrot: an update phase measures limits for Δ
/// each and keeps the one that completed the most WRs; a stable phase keeps
/// it; repeat. The application runs throughout.
///
/// With [`Search::Fixed`] the update phase tries the given limits in order
/// (the paper's tuner). Those suit an RNIC whose round trip is ~2 µs; where
/// it is 20 µs (TCP), capping a thread at 12 WRs starves its pipeline.
/// [`Search::Range`] (the default) adapts to the transport and workload:
///
/// 1. Descend: measure `max` (nothing throttled), then halve, down to
///    `min`, stopping once a limit completes clearly fewer WRs (10 %) than
///    the best so far. Limits above the thread's real demand cost nothing,
///    so only the last one or two steps throttle.
/// 2. Refine: measure the midpoints between the best and the neighbours
///    measured beside it (¾ and 1½ of the best).
/// 3. Confirm: if the best is below `max`, measure `max` and the best again
///    and throttle only if the best still wins by `margin`.
/// 4. Stable: keep the choice for `stable_deltas` Δ, doubled (up to 8×)
///    while the choice holds from epoch to epoch. Two windows of 4 Δ in a
///    row whose completions differ by `shift` from the choice's
///    measurement end it early: the workload changed, so the next update
///    phase starts at once.
///
/// A smaller limit replaces a larger one only when it completed `margin`
/// more, so when throttling does not clearly help the thread stays
/// unthrottled: turning the technique on then costs only the few Δ of each
/// update phase spent below the demand.
#[derive(Clone, Debug)]
pub struct Tuner {
    cfg: TunerConfig,
    phase: Phase,
    limit: u32,
    /// Fixed search: index of the candidate being measured.
    idx: usize,
    /// Range search: where the update phase is.
    step: Step,
    /// Limits measured in this update phase.
    measured: Vec<u32>,
    /// The best so far in this update phase (limit, WRs per Δ).
    best: (u32, u64),
    /// The last epoch's choice, and the current stable length in Δ.
    chosen: Option<u32>,
    stable_deltas: u64,
}

impl Tuner {
    /// A tuner that starts an update phase at `now_ns`; returns it and the
    /// first limit to apply.
    ///
    /// # Panics
    /// If the search has no candidates, or `max` is still 0 (see
    /// [`TunerConfig::resolve`]), or Δ is zero.
    pub fn new(cfg: TunerConfig, now_ns: u64, completed: u64) -> (Tuner, u32) {
        assert!(cfg.delta_ns > 0, "tuner needs Δ > 0");
        let first = match &cfg.search {
            Search::Fixed(c) => *c.first().expect("tuner needs candidates"),
            Search::Range { min, max } => {
                assert!(*max >= *min && *min > 0, "tuner range resolved");
                *max
            }
        };
        let t = Tuner {
            phase: Phase::Update { since: now_ns, done: completed },
            limit: first,
            idx: 0,
            step: Step::Descend,
            measured: Vec::with_capacity(32),
            best: (first, 0),
            chosen: None,
            stable_deltas: u64::from(cfg.stable_deltas),
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
        let delta = self.cfg.delta_ns;
        match self.phase {
            Phase::Update { since, done } => {
                if now_ns < since + delta {
                    return None;
                }
                let n = completed - done;
                let next = match self.cfg.search {
                    Search::Fixed(_) => self.next_fixed(n),
                    Search::Range { .. } => self.next_range(n),
                };
                match next {
                    Some(l) => {
                        self.phase = Phase::Update { since: now_ns, done: completed };
                        self.set(l)
                    }
                    None => self.stabilize(now_ns, completed),
                }
            }
            Phase::Stable { until, since, done, off } => {
                if now_ns >= until {
                    return self.restart(now_ns, completed);
                }
                if matches!(self.cfg.search, Search::Fixed(_)) || now_ns < since + SHIFT_WINDOW * delta {
                    return None;
                }
                // One window of the stable phase: still what was measured?
                let n = (completed - done) as f64;
                let reference = (SHIFT_WINDOW * self.best.1) as f64;
                let moved = (n - reference).abs() > self.cfg.shift * reference.max(1.0);
                let off = if moved { off + 1 } else { 0 };
                if off >= 2 {
                    self.stable_deltas = u64::from(self.cfg.stable_deltas);
                    self.chosen = None;
                    return self.restart(now_ns, completed);
                }
                self.phase = Phase::Stable { until, since: now_ns, done: completed, off };
                None
            }
        }
    }

    /// Applies `limit`; returns it when the executor must set it: when it
    /// changed, and at every step of the paper's tuner (as in the original).
    fn set(&mut self, limit: u32) -> Option<u32> {
        let announce = limit != self.limit || matches!(self.cfg.search, Search::Fixed(_));
        self.limit = limit;
        announce.then_some(limit)
    }

    /// A new update phase.
    fn restart(&mut self, now_ns: u64, completed: u64) -> Option<u32> {
        self.phase = Phase::Update { since: now_ns, done: completed };
        self.idx = 0;
        self.step = Step::Descend;
        self.measured.clear();
        let first = match &self.cfg.search {
            Search::Fixed(c) => c[0],
            Search::Range { max, .. } => *max,
        };
        self.best = (first, 0);
        self.set(first)
    }

    /// Ends the update phase on the best limit.
    fn stabilize(&mut self, now_ns: u64, completed: u64) -> Option<u32> {
        let choice = self.best.0;
        if matches!(self.cfg.search, Search::Range { .. }) {
            let base = u64::from(self.cfg.stable_deltas);
            self.stable_deltas =
                if self.chosen == Some(choice) { (self.stable_deltas * 2).min(base * 8) } else { base };
            self.chosen = Some(choice);
        }
        let until = now_ns + self.cfg.delta_ns * self.stable_deltas;
        self.phase = Phase::Stable { until, since: now_ns, done: completed, off: 0 };
        self.set(choice)
    }

    /// The paper's update phase: the next candidate, or `None` when done.
    fn next_fixed(&mut self, n: u64) -> Option<u32> {
        let Search::Fixed(c) = &self.cfg.search else { unreachable!() };
        if n > self.best.1 || self.idx == 0 {
            self.best = (c[self.idx], n);
        }
        self.idx += 1;
        c.get(self.idx).copied()
    }

    /// Whether `(limit, n)` should replace the best: a smaller limit must
    /// win by the margin, a larger one may lose by it.
    fn better(&self, limit: u32, n: u64) -> bool {
        let (bl, bn) = (self.best.0, self.best.1 as f64);
        let n = n as f64;
        if limit < bl {
            n > bn * (1.0 + self.cfg.margin)
        } else {
            n >= bn * (1.0 - self.cfg.margin)
        }
    }

    /// The range search's update phase: the next limit, or `None` when done.
    fn next_range(&mut self, n: u64) -> Option<u32> {
        let Search::Range { min, max } = self.cfg.search else { unreachable!() };
        let l = self.limit;
        match self.step {
            Step::Descend => {
                self.measured.push(l);
                if l == max || self.better(l, n) {
                    self.best = (l, n);
                }
                let dropped = (n as f64) < self.best.1 as f64 * 0.9;
                if !dropped && l > min {
                    return Some((l / 2).max(min));
                }
                self.step = Step::Refine { left: 2 };
                self.next_refinement()
            }
            Step::Refine { left } => {
                self.measured.push(l);
                if self.better(l, n) {
                    self.best = (l, n);
                }
                self.step = Step::Refine { left: left.saturating_sub(1) };
                self.next_refinement()
            }
            Step::Confirm { max_done: None } => {
                self.step = Step::Confirm { max_done: Some(n) };
                Some(self.best.0)
            }
            Step::Confirm { max_done: Some(at_max) } => {
                let best = self.best.0;
                self.best = if n as f64 > at_max as f64 * (1.0 + self.cfg.margin) { (best, n) } else { (max, at_max) };
                None
            }
        }
    }

    /// The next midpoint to measure around the best, then the confirmation.
    fn next_refinement(&mut self) -> Option<u32> {
        let Search::Range { min, max } = self.cfg.search else { unreachable!() };
        if let Step::Refine { left } = self.step {
            if left > 0 {
                let b = self.best.0;
                let tried = |x: u32| self.measured.contains(&x);
                let below = (b - b / 4).max(min);
                let above = (b + b / 2).min(max);
                for c in [above, below] {
                    if c != b && !tried(c) {
                        return Some(c);
                    }
                }
            }
        }
        if self.best.0 < max {
            self.step = Step::Confirm { max_done: None };
            return Some(max);
        }
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Drives a paper tuner against a synthetic throughput curve (WRs per Δ
    /// as a function of the limit); returns the limits chosen for each
    /// stable phase.
    fn converge(curve: impl Fn(u32) -> u64, epochs: usize) -> Vec<u32> {
        let cfg = TunerConfig::paper();
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
    fn the_paper_tuner_picks_the_peak_of_its_candidates() {
        // A cache-thrashing curve peaking at 8, and one preferring depth.
        assert_eq!(converge(|l| 1000 - (i64::from(l) - 8).unsigned_abs() * 100, 3), [8, 8, 8]);
        assert_eq!(converge(|l| u64::from(l) * 100, 2), [12, 12]);
        assert_eq!(converge(|l| 10_000 / u64::from(l), 2), [4, 4]);
    }

    #[test]
    fn the_paper_tuner_follows_a_workload_change_at_the_next_epoch() {
        let cfg = TunerConfig::paper();
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

    /// The ceiling of the range-search tests (the thread's bound on WRs in flight).
    const CEILING: u32 = 256;

    /// WRs per Δ of a thread whose throughput peaks at `peak` outstanding WRs
    /// (rising linearly to it, then falling as the RNIC's cache thrashes).
    fn thrash(peak: u32) -> impl Fn(u32) -> f64 {
        move |l| {
            let (l, p) = (f64::from(l), f64::from(peak));
            if l <= p {
                1000.0 * l / p
            } else {
                (1000.0 - (l - p) * 400.0 / p).max(100.0)
            }
        }
    }

    /// WRs per Δ of a thread that never has more than `demand` WRs out:
    /// limits above it change nothing (a pipeline over a slow transport).
    fn demand(demand: u32) -> impl Fn(u32) -> f64 {
        move |l| 1000.0 * f64::from(l.min(demand)) / f64::from(demand)
    }

    /// Simulates `seconds` of a thread under the range tuner, in steps of
    /// Δ/4, with ±3 % of deterministic noise on every step; `curve(t_ns)`
    /// gives the throughput curve in force at time t. Returns the limit in
    /// force at each step and the WRs completed in all.
    fn simulate<C: Fn(u32) -> f64>(curve: impl Fn(u64) -> C, seconds: u64) -> (Vec<(u64, u32)>, f64) {
        let cfg = TunerConfig { search: Search::Range { min: 1, max: CEILING }, ..TunerConfig::default() };
        let delta = cfg.delta_ns;
        let (mut t, mut limit) = Tuner::new(cfg, 0, 0);
        let (mut now, mut done, mut total) = (0u64, 0u64, 0.0);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut trace = Vec::new();
        while now < seconds * 1_000_000_000 {
            now += delta / 4;
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let noise = 0.97 + 0.06 * (rng % 1000) as f64 / 1000.0;
            let n = curve(now)(limit) / 4.0 * noise;
            total += n;
            done += n as u64;
            if let Some(l) = t.tick(now, done) {
                limit = l;
            }
            trace.push((now, limit));
        }
        (trace, total)
    }

    /// Share of the steps after `from_ns` whose limit yields at least 95 % of
    /// the curve's peak.
    fn near_peak(trace: &[(u64, u32)], from_ns: u64, curve: impl Fn(u32) -> f64) -> f64 {
        let peak = (1..=CEILING).map(&curve).fold(0.0, f64::max);
        let after: Vec<_> = trace.iter().filter(|s| s.0 >= from_ns).collect();
        after.iter().filter(|s| curve(s.1) >= 0.95 * peak).count() as f64 / after.len() as f64
    }

    #[test]
    fn the_range_search_finds_a_peak_at_8_at_48_and_at_the_ceiling() {
        for (name, curve) in [
            ("peak at 8", Box::new(thrash(8)) as Box<dyn Fn(u32) -> f64>),
            ("peak at 48", Box::new(thrash(48))),
            ("peak at the ceiling", Box::new(demand(CEILING))),
        ] {
            let (trace, total) = simulate(|_| &curve, 10);
            let share = near_peak(&trace, 1_000_000_000, &curve);
            assert!(share > 0.95, "{name}: near the peak {:.1} % of the time after 1 s", share * 100.0);
            let ideal = (1..=CEILING).map(&curve).fold(0.0, f64::max) * 10.0 * 125.0;
            assert!(total > 0.9 * ideal, "{name}: {:.1} % of the ideal", total / ideal * 100.0);
        }
    }

    #[test]
    fn where_throttling_cannot_help_the_range_search_costs_under_2_percent() {
        // A thread with 32 WRs out at most: every limit ≥ 32 is as good as
        // none. Each update phase spends about one Δ below the demand.
        let curve = demand(32);
        let (trace, total) = simulate(|_| &curve, 10);
        let unthrottled = 1000.0 * 10.0 * 125.0;
        assert!(total > 0.98 * unthrottled, "{:.2} % of unthrottled", total / unthrottled * 100.0);
        assert!(near_peak(&trace, 0, &curve) > 0.98);
        // It stays unthrottled: noise never makes a smaller limit win.
        let (_, last) = trace[trace.len() - 1];
        assert!(last >= 32, "settled on {last}");
    }

    #[test]
    fn the_range_search_moves_when_the_best_depth_stops_being_best() {
        // Peak at 8 for 3 s, then a demand-bound workload (best unthrottled)
        // for 3 s, then a peak at 48.
        let (a, b, c) = (thrash(8), demand(CEILING), thrash(48));
        let phase = |t: u64| t / 3_000_000_000;
        let curve = |t: u64| -> &dyn Fn(u32) -> f64 {
            match phase(t) {
                0 => &a,
                1 => &b,
                _ => &c,
            }
        };
        let (trace, _) = simulate(curve, 9);
        let window = |from: u64, to: u64| -> Vec<(u64, u32)> {
            trace.iter().copied().filter(|s| s.0 >= from && s.0 < to).collect()
        };
        // Half a second after each change the tuner is near the new peak.
        let s = 1_000_000_000;
        assert!(near_peak(&window(s, 3 * s), 0, &a) > 0.9);
        assert!(near_peak(&window(3 * s + s / 2, 6 * s), 0, &b) > 0.9, "after the first change");
        assert!(near_peak(&window(6 * s + s / 2, 9 * s), 0, &c) > 0.9, "after the second change");
    }

    #[test]
    fn resolving_fills_in_the_ceiling_and_refuses_bad_ranges() {
        let c = TunerConfig::default().resolve(4096).unwrap();
        assert_eq!(c.search, Search::Range { min: 1, max: 4096 });
        assert!(TunerConfig { search: Search::Range { min: 0, max: 8 }, ..TunerConfig::default() }
            .resolve(64)
            .is_err());
        assert!(TunerConfig { search: Search::Range { min: 9, max: 8 }, ..TunerConfig::default() }
            .resolve(64)
            .is_err());
        assert!(TunerConfig { search: Search::Fixed(vec![]), ..TunerConfig::default() }.resolve(64).is_err());
        assert!(TunerConfig { delta_ns: 0, ..TunerConfig::paper() }.resolve(64).is_err());
        assert_eq!(TunerConfig::paper().resolve(64).unwrap(), TunerConfig::paper());
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
