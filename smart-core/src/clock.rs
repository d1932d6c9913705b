//! Where time comes from: the host's cycle counter, or a simulator's
//! virtual time.
//!
//! Everything in the runtime that reads a clock (the executor's rounds,
//! timers and backoff windows, the techniques' tick, request time-outs,
//! leases, latency stamps) reads a [`Clock`]. On the embedded, TCP and
//! verbs backends it is the calibrated cycle counter (`quanta`); under a
//! simulated transport it is the virtual time of the simulated thread the
//! runtime belongs to, which only the simulation advances. A backend says
//! which through [`Endpoint::clock`](crate::backend::Endpoint::clock).
//!
//! ```
//! use smart_core::clock::{Clock, VirtualTime};
//! let vt = VirtualTime::new(1_000);
//! let c = Clock::virtual_time(vt.clone());
//! let t0 = c.raw();
//! vt.advance(250);
//! assert_eq!(c.delta_ns(t0, c.raw()), 250);
//! assert_eq!(c.now_ns(), 250, "ns since the clock was made");
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Virtual time in nanoseconds, shared by a simulated thread's runtime and
/// the simulation that advances it.
#[derive(Debug, Default)]
pub struct VirtualTime {
    now: AtomicU64,
    id: u64,
}

impl VirtualTime {
    /// A virtual clock at `ns`.
    pub fn new(ns: u64) -> Arc<VirtualTime> {
        VirtualTime::with_id(ns, 0)
    }

    /// A virtual clock at `ns` for the simulated thread `id` (distinct
    /// among the threads of one simulation): [`Clock::nonce`] mixes it in.
    pub fn with_id(ns: u64, id: u64) -> Arc<VirtualTime> {
        Arc::new(VirtualTime { now: AtomicU64::new(ns), id })
    }

    /// The time now, in ns since the simulation began.
    #[inline]
    pub fn get(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// Sets the time (the simulation only ever moves it forward).
    #[inline]
    pub fn set(&self, ns: u64) {
        self.now.store(ns, Ordering::Relaxed);
    }

    /// Moves the time forward by `ns` (CPU time spent by the thread).
    #[inline]
    pub fn advance(&self, ns: u64) {
        self.set(self.get() + ns);
    }
}

/// A runtime's clock (see the module docs).
#[derive(Clone)]
pub enum Clock {
    /// The host's calibrated cycle counter, from `start`.
    Host {
        /// The counter.
        clock: quanta::Clock,
        /// When the clock was made.
        start: quanta::Instant,
    },
    /// A simulation's virtual time, from `start` (ns).
    Virtual {
        /// The simulated thread's time.
        time: Arc<VirtualTime>,
        /// Its value when the clock was made.
        start: u64,
    },
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Clock::Host { .. } => f.write_str("Clock::Host"),
            Clock::Virtual { time, start } => write!(f, "Clock::Virtual(now {} ns, start {start} ns)", time.get()),
        }
    }
}

impl Clock {
    /// The host's cycle counter, starting now.
    pub fn host() -> Clock {
        let clock = quanta::Clock::new();
        let start = clock.now();
        Clock::Host { clock, start }
    }

    /// Virtual time, starting at its current value.
    pub fn virtual_time(time: Arc<VirtualTime>) -> Clock {
        let start = time.get();
        Clock::Virtual { time, start }
    }

    /// Whether the clock is a simulation's.
    pub fn is_virtual(&self) -> bool {
        matches!(self, Clock::Virtual { .. })
    }

    /// Nanoseconds since the clock was made.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Host { clock, start } => clock.now().saturating_duration_since(*start).as_nanos() as u64,
            Clock::Virtual { time, start } => time.get().saturating_sub(*start),
        }
    }

    /// A raw timestamp (cycle counts, or virtual ns), cheap to take; only
    /// differences between two of them mean anything ([`Clock::delta_ns`]).
    #[inline]
    pub fn raw(&self) -> u64 {
        match self {
            Clock::Host { clock, .. } => clock.raw(),
            Clock::Virtual { time, .. } => time.get(),
        }
    }

    /// The time of day in ms since the Unix epoch: what leases stored on
    /// the blades compare. Under a simulation its virtual time stands for
    /// it (ms since the simulation's epoch), so that leases run and expire
    /// in virtual time, whatever the host's clock does.
    pub fn wall_ms(&self) -> u64 {
        match self {
            Clock::Host { .. } => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
            }
            Clock::Virtual { time, .. } => time.get() / 1_000_000,
        }
    }

    /// A number for identities that must differ between processes (a
    /// registration's nonce, a lock owner's id): on the host, from the time
    /// of day in ns, the process id and `salt`; under a simulation, from
    /// the virtual time, the simulated thread and `salt`, so that a
    /// simulated run, and what it leaves on the blades, is the same every
    /// time. Two draws of one process never give the same number by the
    /// same inputs: a process-wide count is mixed in. Only identity, never
    /// secrecy: not for keys.
    pub fn nonce(&self, salt: u64) -> u64 {
        // Successive draws differ even at one instant (a process-wide count:
        // deterministic under a simulation, whose threads run on one OS
        // thread in a fixed order).
        static DRAWS: AtomicU64 = AtomicU64::new(0);
        let n = DRAWS.fetch_add(1, Ordering::Relaxed);
        let salt = salt ^ n.wrapping_mul(0xd6e8_feb8_6659_fd93);
        let seed = match self {
            Clock::Host { .. } => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                t ^ u64::from(std::process::id()).rotate_left(32)
            }
            Clock::Virtual { time, .. } => time.get() ^ time.id.rotate_left(40) ^ 0x51ed_270b_2e9d_1c7f,
        };
        crate::hash::mix64(seed ^ crate::hash::mix64(salt ^ 0x9e37_79b9_7f4a_7c15))
    }

    /// The process id recorded where a compute blade registers: the host's,
    /// or 0 under a simulation (its compute blades are not processes).
    pub fn pid(&self) -> u32 {
        match self {
            Clock::Host { .. } => std::process::id(),
            Clock::Virtual { .. } => 0,
        }
    }

    /// Nanoseconds from raw timestamp `a` to `b`.
    #[inline]
    pub fn delta_ns(&self, a: u64, b: u64) -> u64 {
        match self {
            Clock::Host { clock, .. } => clock.delta_as_nanos(a, b),
            Clock::Virtual { .. } => b.saturating_sub(a),
        }
    }
}
