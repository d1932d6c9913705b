//! Conflict avoidance (ConflictAvoid of Smart, Ren et al., ASPLOS '24).
//!
//! Failed CAS retries waste IOPS, and they multiply under skew. After an
//! unsuccessful attempt a coroutine waits `random(0, min(cap, C0 · 2^k))`
//! before its k-th retry (truncated, randomized exponential backoff). The
//! thread's controller moves along one scale of *levels*: levels
//! 0..=`limit_shift` double the cap from C0 to C0 · 2^`limit_shift`; the
//! levels above keep the cap there and halve `n_max`, the number of its
//! coroutines allowed inside an operation at once, down to 1. By default a
//! level without any wait comes first (`no_wait_level`; cap 0, the
//! baseline's immediate retry), so the first wait is a trial too.
//!
//! As in the paper, the retry rate p = retries / operations over fixed
//! windows (1 ms) triggers the moves: p > p_high calls for a level up,
//! p < p_low for a level down. Unlike the paper, a level up is a *trial*
//! judged by goodput (operations finished per window): after `trial`
//! windows it is kept unless the thread finished clearly fewer operations
//! (by `margin`) than at the level below, in which case the controller goes
//! back and holds there for `hold` windows. So backing off continues only
//! while it does not cost goodput. Over a slow transport (TCP, a 20 µs
//! round trip), where the paper's ladder ended at `n_max` = 1 and halved
//! throughput, it stops where throughput peaks. While a level above 0
//! holds, every `hold` windows (doubling, up to 8×, while such probes lose)
//! a level down is tried too, and kept if it finishes clearly more
//! operations: the thread recovers when backing off stops helping even if
//! retries stay high. Above `p_collapse` retries per operation (default
//! 4) a level up needs no trial: a thread then finishes too few operations
//! for a trial to judge in reasonable time (at 96 threads × 8 coroutines on
//! the simulated ConnectX-6, about one per millisecond under RACE
//! update-only, where a trial counts 2 500), and the controller climbs a
//! level per window as the paper's does, up to the cap's last level (the
//! levels that throttle coroutines keep their trials). [`BackoffConfig::paper`] turns the
//! guard off.
//!
//! Both this controller and WorkReqThrot's tuner judge by throughput, so
//! each would take the other's moves for its own effect. When the tuner sets
//! a new credit limit, this controller abandons a trial in progress (not
//! counting it as lost) and measures afresh ([`Backoff::restart_measurement`]).
//! Before, contended CAS with all techniques sometimes settled at retry rates
//! ten times those of ConflictAvoid alone: level-up trials refused because
//! the tuner was measuring small limits at the same time, then held off.
//!
//! The controller is driven by time (the executor ticks it), not only by
//! retries, so a window without retries relaxes the cap even when no
//! coroutine retries any more. The original only adapted on retries, so the
//! cap never came back down. Times are in nanoseconds of a calibrated clock;
//! no CPU frequency is assumed.
//!
//! C0 is "about one round trip". The paper fixed it at 4096 cycles for its
//! RDMA NICs, and the default here is the same in real time: 2 µs. With
//! `calibrate_base`, the runtime instead sets C0 from the measured round
//! trip of the thread's batches. The cap is kept as a multiple of C0
//! (`C0 · 2^shift`), so it follows the calibration. Measured on the
//! contended counter, calibration did worse than the fixed 2 µs on both the
//! embedded and TCP backends (README), so it is off by default.

/// Parameters of conflict avoidance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffConfig {
    /// C0: the base wait, about one round trip (the paper: 4096 cycles).
    /// With `calibrate_base`, only the starting value.
    pub base_ns: u64,
    /// Set C0 from the measured round trip of the thread's batches.
    pub calibrate_base: bool,
    /// C_limit = C0 · 2^`limit_shift` (the paper: 2^10).
    pub limit_shift: u32,
    /// Adaptation window (the paper: 1 ms).
    pub window_ns: u64,
    /// Retry rate above which the controller goes a level up (the paper:
    /// 0.5; the default 0.2, since the goodput guard undoes a level up
    /// that costs throughput).
    pub p_high: f64,
    /// Retry rate below which it goes a level down (the paper: 0.1; the
    /// default 0.05).
    pub p_low: f64,
    /// Retry rate above which the guarded controller goes a level up at
    /// once, every window, without a trial, up to the cap's last level
    /// (default 4: four of five attempts fail). Under such contention a thread finishes too few
    /// operations for a trial to judge (at 96 threads in the simulator,
    /// about one per millisecond, where a trial needs `trial_ops`), and
    /// backing off cannot lose much goodput: there is little left to lose.
    pub p_collapse: f64,
    /// Whether coroutine throttling (`n_max`) is on.
    pub throttle_coroutines: bool,
    /// Whether levels are judged by goodput (off: the paper's controller,
    /// which moves on the retry rate alone).
    pub goodput_guard: bool,
    /// Windows a level is measured before it is judged.
    pub trial: u32,
    /// Operations a measurement must also count (while it takes at most
    /// `trial` × [`MAX_TRIAL_STRETCH`] windows): the count of n operations
    /// varies by about 1/√n, so a slow thread (tens of operations per
    /// window, as on TCP) needs more windows before `margin` means
    /// anything (2 500 operations: ±2 %).
    pub trial_ops: u64,
    /// Windows to stay after a level up was undone (doubling, up to 8×,
    /// while levels up keep losing), and between tries of a level down
    /// while retries stay high.
    pub hold: u32,
    /// Goodput difference that counts as clear (a fraction).
    pub margin: f64,
    /// Whether the scale starts with a level that does not wait at all (the
    /// baseline's immediate retry), below the cap C0, so that backing off
    /// at all must pay for itself in goodput. Off in the paper's controller,
    /// which starts at C0. Over TCP, waits of up to C0 = 2 µs cost the
    /// contended counter 12 % of its throughput: a retry that sleeps goes
    /// out a round of the executor later.
    pub no_wait_level: bool,
    /// Whether a thread's operations on the same key (see
    /// [`Ctx::op_on`](crate::Ctx::op_on)) run one at a time instead of
    /// colliding (not in the paper; see the runtime's `keygate` module).
    pub key_gate: bool,
    /// Whether the controller moves at all. Off, the cap stays at C_limit
    /// and every coroutine may enter an operation: plain truncated
    /// exponential backoff, the "+Backoff" step of the paper's figure 14.
    pub adaptive: bool,
}

/// Which parts of ConflictAvoid are on: the steps of the paper's figure 14,
/// each adding one part to the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictParts {
    /// "+Backoff": randomized exponential backoff, C0 · 2^k before the k-th
    /// retry, up to a fixed cap, C_limit; no controller, no coroutine
    /// throttling, no key gate. The Smart artifact's step left the cap
    /// unbounded (C0 · 2^20, about 2 s); here it stays where the dynamic
    /// limit's range ends, since an operation keeps its epoch pinned while
    /// it waits (race-ht), and waits of seconds held back the reclamation of
    /// memory that long (an update-only run on embedded blades ran out of a
    /// 256 MiB blade within 3 s).
    Backoff,
    /// "+DynLimit": the controller moves the cap between C0 and C_limit by
    /// the retry rate (and, unless [`BackoffConfig::paper`], goodput); no
    /// coroutine throttling, no key gate.
    DynLimit,
    /// "+CoroThrot": all of ConflictAvoid (the default): the controller also
    /// lowers `n_max`, and operations on one key wait at the key gate.
    All,
}

impl ConflictParts {
    /// The steps, in order.
    pub const ALL: [ConflictParts; 3] = [ConflictParts::Backoff, ConflictParts::DynLimit, ConflictParts::All];
    /// Their command-line names, in the same order.
    pub const NAMES: [&'static str; 3] = ["backoff", "dyn-limit", "all"];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl std::str::FromStr for ConflictParts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| format!("unknown parts {s:?}; use one of {}", Self::NAMES.join(", ")))
    }
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base_ns: 2_000,
            calibrate_base: false,
            limit_shift: 10,
            window_ns: 1_000_000,
            p_high: 0.2,
            p_low: 0.05,
            p_collapse: 4.0,
            throttle_coroutines: true,
            goodput_guard: true,
            trial: 8,
            trial_ops: 2_500,
            hold: 128,
            margin: 0.05,
            no_wait_level: true,
            key_gate: true,
            adaptive: true,
        }
    }
}

impl BackoffConfig {
    /// The paper's controller: its retry band [0.1, 0.5] alone moves the
    /// levels, and no key gate.
    pub fn paper() -> BackoffConfig {
        BackoffConfig {
            goodput_guard: false,
            p_high: 0.5,
            p_low: 0.1,
            no_wait_level: false,
            key_gate: false,
            ..BackoffConfig::default()
        }
    }

    /// This configuration with only `parts` of ConflictAvoid on (see
    /// [`ConflictParts`]); `All` leaves it as it is.
    pub fn with_parts(self, parts: ConflictParts) -> BackoffConfig {
        match parts {
            ConflictParts::All => self,
            ConflictParts::DynLimit => BackoffConfig { throttle_coroutines: false, key_gate: false, ..self },
            ConflictParts::Backoff => {
                BackoffConfig { throttle_coroutines: false, key_gate: false, adaptive: false, ..self }
            }
        }
    }

    /// Which parts of ConflictAvoid this configuration has on.
    pub fn parts(&self) -> ConflictParts {
        if !self.adaptive {
            ConflictParts::Backoff
        } else if !self.throttle_coroutines && !self.key_gate {
            ConflictParts::DynLimit
        } else {
            ConflictParts::All
        }
    }
}

/// How many times `trial` windows a measurement may stretch to count
/// `trial_ops` operations.
pub const MAX_TRIAL_STRETCH: u32 = 32;

/// A level being measured against the one it came from.
#[derive(Clone, Copy, Debug)]
struct Trial {
    /// The level to go back to.
    from: u32,
    /// Operations per window at `from`.
    before: f64,
    /// A level down (kept only if clearly better) rather than up (kept
    /// unless clearly worse).
    down: bool,
    windows: u32,
    ops: u64,
}

/// The per-thread controller: the backoff cap and `n_max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    cfg: BackoffConfig,
    /// The position on the scale (see the module docs).
    level: u32,
    max_level: u32,
    n_limit: usize,
    window_start: u64,
    ops: u64,
    retries: u64,
    /// Goodput at the current level: operations and windows since it was entered.
    level_ops: u64,
    level_windows: u32,
    trial: Option<Trial>,
    /// Windows until a level up may be tried again / a level down probed.
    hold: u32,
    probe_in: u32,
    /// Windows between probes of the level below: from `hold`, doubled
    /// (up to 8×) each time the probe loses.
    probe_every: u32,
    /// Windows to hold after a lost level up: from `hold`, doubled (up to
    /// 8×) each time a level up loses again, so that trials of a level that
    /// keeps losing (a wait over TCP) cost little of the time.
    hold_every: u32,
    /// The best goodput measured at the levels this climb passed (since the
    /// thread last moved down, or last probed the level below): a level up
    /// is judged against it, not only against the level just below, so
    /// losses within the margin cannot add up level after level.
    climb_best: f64,
}

impl Backoff {
    /// A controller for a thread with `coroutines` coroutines, starting at
    /// cap C0 and `n_max` = `coroutines`.
    pub fn new(cfg: BackoffConfig, coroutines: usize, now_ns: u64) -> Backoff {
        let n = coroutines.max(1);
        // Halvings of n_max down to 1.
        let halvings = if cfg.throttle_coroutines && cfg.adaptive { usize::BITS - (n - 1).leading_zeros() } else { 0 };
        let max_level = u32::from(cfg.no_wait_level) + cfg.limit_shift + halvings;
        Backoff {
            // Without the controller, the cap stays at C_limit.
            level: if cfg.adaptive { 0 } else { max_level },
            max_level,
            n_limit: n,
            window_start: now_ns,
            ops: 0,
            retries: 0,
            level_ops: 0,
            level_windows: 0,
            trial: None,
            hold: 0,
            probe_in: cfg.hold,
            probe_every: cfg.hold,
            hold_every: cfg.hold,
            climb_best: 0.0,
            cfg,
        }
    }

    /// The level on the scale that starts at C0 (the paper's), or `None`
    /// at the level without waits.
    fn waiting_level(&self) -> Option<u32> {
        self.level.checked_sub(u32::from(self.cfg.no_wait_level))
    }

    /// The cap now (0 at the level without waits).
    pub fn cap_ns(&self) -> u64 {
        self.waiting_level().map_or(0, |l| self.cfg.base_ns << l.min(self.cfg.limit_shift))
    }

    /// C0 now.
    pub fn base_ns(&self) -> u64 {
        self.cfg.base_ns
    }

    /// Sets C0 (from a measured round trip), if calibration is on.
    pub fn calibrate(&mut self, rtt_ns: u64) {
        if self.cfg.calibrate_base {
            self.cfg.base_ns = rtt_ns.max(100);
        }
    }

    /// C_limit.
    pub fn limit_ns(&self) -> u64 {
        self.cfg.base_ns << self.cfg.limit_shift
    }

    /// Coroutines allowed inside an operation at once.
    pub fn n_max(&self) -> usize {
        let halvings = self.waiting_level().unwrap_or(0).saturating_sub(self.cfg.limit_shift);
        (self.n_limit >> halvings).max(1)
    }

    /// Counts one finished operation.
    pub fn on_op(&mut self) {
        self.ops += 1;
    }

    /// Counts one retry; returns the upper bound of the wait before retry
    /// number `attempt` (1-based): min(cap, C0 · 2^attempt).
    pub fn on_retry(&mut self, attempt: u32) -> u64 {
        self.retries += 1;
        let exp = self.cfg.base_ns.saturating_mul(1u64 << attempt.min(self.cfg.limit_shift));
        exp.min(self.cap_ns())
    }

    /// The thread's throughput changed for another reason (WorkReqThrot set
    /// a new credit limit): the goodput figures measured so far no longer
    /// describe the levels. A trial in progress is abandoned (back to the
    /// level it came from, not counted as lost), and the current level and
    /// the climb are measured afresh. Without this, a level judged while the
    /// tuner was measuring other limits could be refused for the tuner's
    /// doing, and then held off for hundreds of windows.
    pub fn restart_measurement(&mut self) {
        match self.trial.take() {
            Some(t) => self.enter(t.from),
            None => self.enter(self.level),
        }
        self.climb_best = 0.0;
    }

    /// Moves to `level`, starting its goodput measurement afresh.
    fn enter(&mut self, level: u32) {
        self.level = level;
        self.level_ops = 0;
        self.level_windows = 0;
    }

    /// Adapts at the end of each window; returns whether anything changed.
    pub fn tick(&mut self, now_ns: u64) -> bool {
        if now_ns < self.window_start + self.cfg.window_ns {
            return false;
        }
        let (ops, retries) = (self.ops, self.retries);
        self.window_start = now_ns;
        self.ops = 0;
        self.retries = 0;
        let p = if ops == 0 {
            if retries == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            retries as f64 / ops as f64
        };
        let before = (self.cap_ns(), self.n_max());
        if !self.cfg.adaptive {
            return false;
        }
        if self.cfg.goodput_guard {
            self.guarded(ops, p);
        } else if p > self.cfg.p_high {
            self.enter((self.level + 1).min(self.max_level));
        } else if p < self.cfg.p_low {
            self.enter(self.level.saturating_sub(1));
        }
        before != (self.cap_ns(), self.n_max())
    }

    /// Whether `windows` windows with `ops` operations are a measurement.
    fn measured(&self, windows: u32, ops: u64) -> bool {
        windows >= self.cfg.trial
            && (ops >= self.cfg.trial_ops || windows >= self.cfg.trial.saturating_mul(MAX_TRIAL_STRETCH))
    }

    /// One window of the goodput-guarded controller.
    fn guarded(&mut self, ops: u64, p: f64) {
        self.hold = self.hold.saturating_sub(1);
        self.probe_in = self.probe_in.saturating_sub(1);
        // The collapse rule climbs the cap's levels only: the levels that
        // throttle coroutines still need a trial (over TCP, n_max = 1 halved
        // a contended counter's throughput).
        let top_cap = u32::from(self.cfg.no_wait_level) + self.cfg.limit_shift;
        if p > self.cfg.p_collapse && self.level < top_cap.min(self.max_level) {
            // Most attempts fail: climb now, as the paper's controller does
            // (a trial in progress, up or down, is moot).
            self.trial = None;
            self.climb_best = 0.0;
            self.enter(self.level + 1);
            return;
        }
        if let Some(mut t) = self.trial.take() {
            t.windows += 1;
            t.ops += ops;
            if !self.measured(t.windows, t.ops) {
                self.trial = Some(t);
                return;
            }
            let now = t.ops as f64 / f64::from(t.windows);
            let keep = if t.down {
                let keep = now > t.before * (1.0 + self.cfg.margin);
                // A climb starts afresh from a level kept down; after a lost
                // probe, from the two levels just measured (fresh figures,
                // so a stale best cannot block climbing for good).
                self.climb_best = if keep { 0.0 } else { now.max(t.before) };
                keep
            } else {
                self.climb_best = self.climb_best.max(t.before);
                now >= self.climb_best * (1.0 - self.cfg.margin)
            };
            if keep {
                // The trial's measurement is the new level's baseline.
                self.level_ops = t.ops;
                self.level_windows = t.windows;
            } else {
                self.enter(t.from);
            }
            if t.down {
                self.probe_every =
                    if keep { self.cfg.hold } else { (self.probe_every * 2).min(self.cfg.hold.saturating_mul(8)) };
                self.probe_in = self.probe_every;
            } else if keep {
                self.hold_every = self.cfg.hold;
            } else {
                self.hold = self.hold_every;
                self.hold_every = (self.hold_every * 2).min(self.cfg.hold.saturating_mul(8));
            }
            return;
        }
        self.level_ops += ops;
        self.level_windows += 1;
        let baseline = self.measured(self.level_windows, self.level_ops);
        let rate = self.level_ops as f64 / f64::from(self.level_windows.max(1));
        if p < self.cfg.p_low {
            // Contention is gone: relax without a trial.
            if self.level > 0 {
                self.enter(self.level - 1);
                self.climb_best = 0.0;
            }
            self.hold_every = self.cfg.hold;
            return;
        }
        if !baseline {
            return;
        }
        let down = self.level > 0 && self.probe_in == 0;
        if down || (p > self.cfg.p_high && self.level < self.max_level && self.hold == 0) {
            self.trial = Some(Trial { from: self.level, before: rate, down, windows: 0, ops: 0 });
            self.enter(if down { self.level - 1 } else { self.level + 1 });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The guarded controller as the models below need it: they count about
    /// 100 operations per window, so 8 windows are a measurement.
    fn model_cfg() -> BackoffConfig {
        BackoffConfig { trial_ops: 800, ..BackoffConfig::default() }
    }

    /// The cap at rest: none with the level without waits, else C0.
    fn rest(b: &Backoff) -> u64 {
        if b.cfg.no_wait_level {
            0
        } else {
            b.cfg.base_ns
        }
    }

    /// Runs `windows` windows, each with `ops` operations and `retries` retries.
    fn drive(b: &mut Backoff, now: &mut u64, windows: usize, ops: u64, retries: u64) {
        for _ in 0..windows {
            for _ in 0..ops {
                b.on_op();
            }
            for i in 0..retries {
                b.on_retry(1 + (i % 4) as u32);
            }
            *now += b.cfg.window_ns;
            b.tick(*now);
        }
    }

    #[test]
    fn the_paper_controller_pins_the_cap_at_the_limit_then_throttles_coroutines() {
        let mut b = Backoff::new(BackoffConfig::paper(), 16, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 10, 100, 300); // p = 3
        assert_eq!(b.cap_ns(), b.limit_ns(), "skewed → cap at C_limit");
        assert_eq!(b.n_max(), 16, "n_max moves only once the cap is pinned");
        drive(&mut b, &mut now, 2, 100, 300);
        assert_eq!(b.n_max(), 4, "pinned and still retrying → n_max halves");
        drive(&mut b, &mut now, 10, 100, 300);
        assert_eq!(b.n_max(), 1, "... down to 1");
    }

    /// A thread in collapse (ten retries per operation, one operation per
    /// window: too few for any trial) climbs a level per window, as the
    /// paper's controller would; without the collapse rule it would sit at
    /// the level without waits for 8 × 32 windows before its first trial.
    #[test]
    fn the_guarded_controller_climbs_at_once_when_most_attempts_fail() {
        for (p_collapse, climbs) in [(4.0, true), (f64::INFINITY, false)] {
            let mut b = Backoff::new(BackoffConfig { p_collapse, ..BackoffConfig::default() }, 8, 0);
            let mut now = 0;
            drive(&mut b, &mut now, 5, 1, 10);
            if climbs {
                assert_eq!(b.level, 5, "a level per window");
                assert!(b.cap_ns() > 0);
            } else {
                assert_eq!((b.level, b.cap_ns()), (0, 0), "no measurement yet, no move");
            }
        }
        // The climb stops where the cap is pinned at C_limit: throttling
        // coroutines still needs a trial.
        let mut b = Backoff::new(BackoffConfig::default(), 8, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 30, 1, 10);
        assert_eq!((b.cap_ns(), b.n_max()), (b.limit_ns(), 8), "level {}", b.level);
        // Once retries fall below the collapse rate, trials judge again.
        let mut b = Backoff::new(BackoffConfig::default(), 8, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 3, 1, 10);
        drive(&mut b, &mut now, 20, 1, 1);
        assert_eq!(b.level, 3, "p = 1: no climb without a measurement");
    }

    /// The ablation steps of figure 14: plain backoff never moves and never
    /// throttles; the dynamic limit moves the cap but keeps `n_max`.
    #[test]
    fn the_parts_of_conflict_avoid_switch_off_the_controller_and_the_throttling() {
        for base in [BackoffConfig::default(), BackoffConfig::paper()] {
            let plain = base.with_parts(ConflictParts::Backoff);
            assert_eq!(plain.parts(), ConflictParts::Backoff);
            let mut b = Backoff::new(plain, 16, 0);
            let mut now = 0;
            assert_eq!(b.cap_ns(), b.limit_ns(), "the cap at C_limit from the start");
            assert_eq!(b.on_retry(3), base.base_ns << 3, "C0 · 2^k before the k-th retry");
            assert_eq!(b.on_retry(40), b.limit_ns(), "... up to the cap");
            drive(&mut b, &mut now, 200, 100, 300);
            assert_eq!((b.cap_ns(), b.n_max()), (b.limit_ns(), 16), "skewed: nothing moves");
            drive(&mut b, &mut now, 200, 100, 0);
            assert_eq!(b.cap_ns(), b.limit_ns(), "calm: nothing moves either");

            let dynamic = base.with_parts(ConflictParts::DynLimit);
            assert_eq!((dynamic.parts(), dynamic.key_gate), (ConflictParts::DynLimit, false));
            let mut b = Backoff::new(BackoffConfig { trial_ops: 800, ..dynamic }, 16, 0);
            assert_eq!(b.cap_ns(), rest(&b), "the controller starts at rest");
            drive(&mut b, &mut now, 2_000, 100, 300);
            assert!(b.cap_ns() > rest(&b), "skewed: the cap rises");
            assert_eq!(b.n_max(), 16, "... and n_max never falls");
            assert_eq!(base.with_parts(ConflictParts::All), base);
            assert_eq!(base.parts(), ConflictParts::All);
        }
        assert_eq!("dyn-limit".parse(), Ok(ConflictParts::DynLimit));
        assert!("coro".parse::<ConflictParts>().unwrap_err().contains("backoff, dyn-limit, all"));
    }

    #[test]
    fn a_new_credit_limit_abandons_a_trial_without_counting_it_lost() {
        let mut b = Backoff::new(model_cfg(), 16, 0);
        let mut now = 0;
        // p = 1: level 0 is measured, then a trial of level 1 starts.
        drive(&mut b, &mut now, 8, 100, 100);
        assert_eq!((b.level, b.trial.is_some()), (1, true), "a trial of level 1 runs");
        b.restart_measurement();
        assert_eq!((b.level, b.trial.is_some()), (0, false), "the trial is abandoned");
        // Measured afresh, level 1 is tried again at once: no hold.
        drive(&mut b, &mut now, 8, 100, 100);
        assert_eq!((b.level, b.trial.is_some()), (1, true), "tried again without a hold");
        // Whereas a trial that loses is held off.
        drive(&mut b, &mut now, 10, 80, 80);
        assert_eq!((b.level, b.trial.is_some()), (0, false), "a losing trial goes back");
        drive(&mut b, &mut now, 8, 100, 100);
        assert_eq!((b.level, b.trial.is_some()), (0, false), "held off after a loss");
    }

    #[test]
    fn uniform_updates_keep_the_cap_at_the_base() {
        // p = 0.3 and 0.1: inside each controller's band.
        for (cfg, mid) in [(BackoffConfig::paper(), 30), (model_cfg(), 10)] {
            let mut b = Backoff::new(cfg, 16, 0);
            let mut now = 0;
            drive(&mut b, &mut now, 50, 1000, 20); // p = 0.02
            assert_eq!((b.cap_ns(), b.n_max()), (rest(&b), 16));
            // Between the thresholds nothing moves, not even a probe (level 0).
            drive(&mut b, &mut now, 500, 100, mid);
            assert_eq!((b.cap_ns(), b.n_max()), (rest(&b), 16));
        }
    }

    #[test]
    fn relaxes_on_time_alone_when_contention_stops() {
        for cfg in [BackoffConfig::paper(), model_cfg()] {
            let mut b = Backoff::new(cfg, 8, 0);
            let mut now = 0;
            drive(&mut b, &mut now, 600, 100, 300);
            assert_eq!((b.cap_ns(), b.n_max()), (b.limit_ns(), 1));
            // No operations and no retries at all: windows still pass, and it relaxes.
            drive(&mut b, &mut now, 40, 0, 0);
            assert_eq!((b.cap_ns(), b.n_max()), (rest(&b), 8));
        }
    }

    /// Runs `windows` windows of a thread under heavy retries (p = 3) whose
    /// goodput (operations per window) at each level is `goodput(level)`,
    /// with ±3 % of deterministic noise; returns the levels visited.
    fn contend(b: &mut Backoff, now: &mut u64, windows: usize, goodput: impl Fn(u32) -> f64) -> Vec<u32> {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut levels = Vec::with_capacity(windows);
        for _ in 0..windows {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let ops = (goodput(b.level) * (0.97 + 0.06 * (rng % 1000) as f64 / 1000.0)) as u64;
            b.ops += ops;
            b.retries += 3 * ops;
            *now += b.cfg.window_ns;
            b.tick(*now);
            levels.push(b.level);
        }
        levels
    }

    #[test]
    fn backing_off_continues_while_it_raises_goodput() {
        // Embedded-like: every level up finishes more operations.
        let mut b = Backoff::new(model_cfg(), 16, 0);
        let mut now = 0;
        contend(&mut b, &mut now, 400, |l| 100.0 * 1.2f64.powi(l as i32));
        let levels = contend(&mut b, &mut now, 2000, |l| 100.0 * 1.2f64.powi(l as i32));
        let top = levels.iter().filter(|&&l| l == b.max_level).count() as f64 / levels.len() as f64;
        assert!(top > 0.97, "at the top (n_max 1) {:.1} % of the time; probes below cost the rest", top * 100.0);
    }

    #[test]
    fn backing_off_stops_where_goodput_peaks() {
        // TCP-like: the cap helps up to level 6, then each level up costs 20 %.
        let peak = 6;
        let model =
            |l: u32| if l <= peak { 100.0 + 10.0 * f64::from(l) } else { 160.0 * 0.8f64.powi((l - peak) as i32) };
        let mut b = Backoff::new(model_cfg(), 16, 0);
        let mut now = 0;
        let levels = contend(&mut b, &mut now, 3000, model);
        let late = &levels[1000..];
        let at_peak = late.iter().filter(|&&l| l == peak).count() as f64 / late.len() as f64;
        assert!(at_peak > 0.9, "at the peak {:.0} % of the time", at_peak * 100.0);
        assert!(late.iter().all(|&l| l <= peak + 1), "never past a level up on trial");
        assert_eq!(b.n_max(), 16, "coroutines never throttled");
        // The paper's controller, on the same model, ends at n_max = 1.
        let mut paper = Backoff::new(BackoffConfig::paper(), 16, 0);
        contend(&mut paper, &mut now, 400, model);
        assert_eq!(paper.n_max(), 1);
    }

    #[test]
    fn waiting_at_all_is_a_trial_and_a_losing_one_is_seldom_retried() {
        // The contended counter over TCP: retries stay high, but any wait
        // costs 12 % (a retry that sleeps goes out a round later).
        let model = |l: u32| if l == 0 { 100.0 } else { 88.0 };
        let mut b = Backoff::new(model_cfg(), 16, 0);
        let mut now = 0;
        let levels = contend(&mut b, &mut now, 12_000, model);
        let late = &levels[2000..];
        let without = late.iter().filter(|&&l| l == 0).count() as f64 / late.len() as f64;
        assert!(without > 0.98, "without waits {:.1} % of the time", without * 100.0);
        assert_eq!((b.cap_ns(), b.n_max()), (0, 16));
    }

    #[test]
    fn a_measurement_counts_enough_operations_or_stretches_to_its_bound() {
        // 28 operations per window (a TCP thread): the level-0 baseline needs
        // ⌈2500 / 28⌉ = 90 windows before a level up is tried.
        let mut b = Backoff::new(BackoffConfig::default(), 16, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 89, 28, 84);
        assert_eq!(b.level, 0, "judged on too few operations");
        drive(&mut b, &mut now, 1, 28, 84);
        assert_eq!(b.level, 1, "the level up is on trial");
        // 1 operation per window: the measurement ends at its bound.
        let mut b = Backoff::new(BackoffConfig::default(), 16, 0);
        drive(&mut b, &mut now, 8 * MAX_TRIAL_STRETCH as usize - 1, 1, 3);
        assert_eq!(b.level, 0);
        drive(&mut b, &mut now, 1, 1, 3);
        assert_eq!(b.level, 1);
    }

    #[test]
    fn small_losses_per_level_do_not_add_up() {
        // Each level up costs 4 %: within the margin of the level below, but
        // two of them are not within the margin of the start.
        let model = |l: u32| 1000.0 * 0.96f64.powi(l as i32);
        let mut b = Backoff::new(BackoffConfig::default(), 16, 0);
        let mut now = 0;
        let levels = contend(&mut b, &mut now, 4000, model);
        let late = &levels[1000..];
        assert!(late.iter().all(|&l| l <= 2), "climbed to {}", late.iter().max().unwrap());
        let mean = late.iter().map(|&l| model(l)).sum::<f64>() / late.len() as f64;
        assert!(mean >= 0.95 * model(0), "goodput {:.1} % of the start", mean / model(0) * 100.0);
    }

    #[test]
    fn the_controller_raises_n_max_back_when_backing_off_stops_helping() {
        let mut b = Backoff::new(model_cfg(), 16, 0);
        let mut now = 0;
        contend(&mut b, &mut now, 200, |l| 100.0 * 1.2f64.powi(l as i32));
        assert_eq!(b.n_max(), 1);
        // Retries stay high, but now every level up costs 20 %: probes of the
        // level below win, one level at a time, back to the bottom.
        let levels = contend(&mut b, &mut now, 6000, |l| 1000.0 * 0.8f64.powi(l as i32));
        assert_eq!((b.cap_ns(), b.n_max()), (rest(&b), 16), "recovered");
        let late = &levels[4000..];
        assert!(late.iter().filter(|&&l| l == 0).count() * 10 > late.len() * 9, "stays recovered");
    }

    #[test]
    fn waits_grow_exponentially_and_are_truncated_by_the_cap() {
        let cfg = BackoffConfig { calibrate_base: true, ..BackoffConfig::default() };
        let mut b = Backoff::new(cfg, 1, 0);
        b.level = 5; // C0 · 2^4, above the level without waits
        assert_eq!(b.on_retry(1), 2 * cfg.base_ns);
        assert_eq!(b.on_retry(3), 8 * cfg.base_ns);
        assert_eq!(b.on_retry(9), 16 * cfg.base_ns);
        assert_eq!(b.on_retry(60), 16 * cfg.base_ns, "no shift overflow");
        // Calibration moves C0, and the cap with it.
        b.calibrate(30_000);
        assert_eq!((b.base_ns(), b.cap_ns()), (30_000, 16 * 30_000));
        let mut fixed = Backoff::new(BackoffConfig { calibrate_base: false, ..cfg }, 1, 0);
        fixed.calibrate(30_000);
        assert_eq!(fixed.base_ns(), cfg.base_ns);
    }
}
