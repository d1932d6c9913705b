//! Conflict avoidance (ConflictAvoid of Smart, Ren et al., ASPLOS '24).
//!
//! Failed CAS retries waste IOPS, and they multiply under skew. After an
//! unsuccessful attempt a coroutine waits `random(0, min(cap, C0 · 2^k))`
//! before its k-th retry (truncated, randomized exponential backoff). The
//! cap adapts to the thread's retry rate p = retries / operations, measured
//! over fixed windows (1 ms):
//!
//! * p > p_high: cap ×= 2, up to `C0 · 2^10`.
//! * p < p_low: cap /= 2, down to C0.
//!
//! When the cap is pinned at a bound, the thread instead changes `n_max`,
//! the number of its coroutines allowed inside an operation at once. It
//! shrinks (to 1) under heavy retries and grows back (to the coroutine
//! count) when they stop.
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
    /// Retry rate above which the cap grows.
    pub p_high: f64,
    /// Retry rate below which the cap shrinks.
    pub p_low: f64,
    /// Whether coroutine throttling (`n_max`) is on.
    pub throttle_coroutines: bool,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base_ns: 2_000,
            calibrate_base: false,
            limit_shift: 10,
            window_ns: 1_000_000,
            p_high: 0.5,
            p_low: 0.1,
            throttle_coroutines: true,
        }
    }
}

/// The per-thread controller: the backoff cap and `n_max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    cfg: BackoffConfig,
    /// The cap is C0 · 2^cap_shift, cap_shift in [0, limit_shift].
    cap_shift: u32,
    n_max: usize,
    n_limit: usize,
    window_start: u64,
    ops: u64,
    retries: u64,
}

impl Backoff {
    /// A controller for a thread with `coroutines` coroutines, starting at
    /// cap C0 and `n_max` = `coroutines`.
    pub fn new(cfg: BackoffConfig, coroutines: usize, now_ns: u64) -> Backoff {
        let n = coroutines.max(1);
        Backoff { cap_shift: 0, n_max: n, n_limit: n, window_start: now_ns, ops: 0, retries: 0, cfg }
    }

    /// The cap now.
    pub fn cap_ns(&self) -> u64 {
        self.cfg.base_ns << self.cap_shift
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
        self.n_max
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

    /// Adapts at the end of each window; returns whether anything changed.
    pub fn tick(&mut self, now_ns: u64) -> bool {
        if now_ns < self.window_start + self.cfg.window_ns {
            return false;
        }
        let p = if self.ops == 0 {
            if self.retries == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            self.retries as f64 / self.ops as f64
        };
        let (shift, n) = (self.cap_shift, self.n_max);
        if p > self.cfg.p_high {
            if self.cap_shift < self.cfg.limit_shift {
                self.cap_shift += 1;
            } else if self.cfg.throttle_coroutines && self.n_max > 1 {
                self.n_max -= 1;
            }
        } else if p < self.cfg.p_low {
            if self.cap_shift > 0 {
                self.cap_shift -= 1;
            } else if self.cfg.throttle_coroutines && self.n_max < self.n_limit {
                self.n_max += 1;
            }
        }
        self.window_start = now_ns;
        self.ops = 0;
        self.retries = 0;
        shift != self.cap_shift || n != self.n_max
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

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
    fn skewed_updates_pin_the_cap_at_the_limit_then_throttle_coroutines() {
        let mut b = Backoff::new(BackoffConfig::default(), 16, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 10, 100, 300); // p = 3
        assert_eq!(b.cap_ns(), b.limit_ns(), "skewed → cap at C_limit");
        assert_eq!(b.n_max(), 16, "n_max moves only once the cap is pinned");
        drive(&mut b, &mut now, 30, 100, 300);
        assert_eq!(b.n_max(), 1, "pinned and still retrying → n_max shrinks to 1");
    }

    #[test]
    fn uniform_updates_keep_the_cap_at_the_base() {
        let mut b = Backoff::new(BackoffConfig::default(), 16, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 50, 1000, 20); // p = 0.02
        assert_eq!((b.cap_ns(), b.n_max()), (b.cfg.base_ns, 16));
        // Between the thresholds nothing moves.
        drive(&mut b, &mut now, 5, 100, 10);
        drive(&mut b, &mut now, 50, 100, 30); // p = 0.3
        assert_eq!((b.cap_ns(), b.n_max()), (b.cfg.base_ns, 16));
    }

    #[test]
    fn relaxes_on_time_alone_when_contention_stops() {
        let mut b = Backoff::new(BackoffConfig::default(), 8, 0);
        let mut now = 0;
        drive(&mut b, &mut now, 40, 100, 300);
        assert_eq!((b.cap_ns(), b.n_max()), (b.limit_ns(), 1));
        // No operations and no retries at all: windows still pass, and it relaxes.
        drive(&mut b, &mut now, 40, 0, 0);
        assert_eq!((b.cap_ns(), b.n_max()), (b.cfg.base_ns, 8));
    }

    #[test]
    fn waits_grow_exponentially_and_are_truncated_by_the_cap() {
        let cfg = BackoffConfig { calibrate_base: true, ..BackoffConfig::default() };
        let mut b = Backoff::new(cfg, 1, 0);
        b.cap_shift = 4;
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
