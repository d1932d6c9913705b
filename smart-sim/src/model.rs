//! The hardware components, each a small queueing model with the few
//! parameters of its [`Profile`](crate::Profile) section. They are pure:
//! a component is asked when a request that arrives at time `t` leaves it,
//! and remembers what it is busy with. Requests are offered in the order
//! the simulation posts them, which is virtual-time order up to one
//! simulated thread's step (see the crate docs).
//!
//! Each has a closed form that its unit tests check: an uncontended request
//! costs exactly its service time; N requests at once on a serial resource
//! leave one service time apart; a pool of k servers takes k at once.

use std::collections::VecDeque;

use crate::profile;

/// The spinlock a post takes on a shared doorbell or a shared QP (Smart
/// §3.1: QPs of different threads bound to one doorbell contend on its
/// lock; the doorbell's MMIO is written under it).
///
/// A post that asks for the lock at `t` gets it when it is free, holds it
/// for `lock_ns`, plus `line_transfer_ns` when the previous holder was
/// another thread (the lock's line moves between cores), plus
/// `waiter_penalty_ns` for every other post still holding or waiting at
/// `t` (spinners slow the hand-over of the line).
#[derive(Debug, Default)]
pub struct SpinLock {
    /// End times of the holds granted and not yet over, oldest first.
    holds: VecDeque<u64>,
    last_owner: Option<u32>,
    /// Posts that waited for the lock.
    pub contended: u64,
    /// Posts.
    pub acquisitions: u64,
    /// The most posts holding or waiting that a post found.
    pub max_waiters: u64,
}

impl SpinLock {
    /// A post by thread `owner` wanting the lock at `t`: the time its post
    /// leaves the lock (the posting thread spins until then).
    pub fn acquire(&mut self, t: u64, owner: u32, p: &profile::Doorbell) -> u64 {
        while self.holds.front().is_some_and(|&end| end <= t) {
            self.holds.pop_front();
        }
        let waiters = self.holds.len() as u64;
        self.max_waiters = self.max_waiters.max(waiters);
        let start = self.holds.back().map_or(t, |&end| end.max(t));
        let mut hold = p.lock_ns + waiters * p.waiter_penalty_ns;
        if self.last_owner.is_some_and(|o| o != owner) {
            hold += p.line_transfer_ns;
        }
        self.last_owner = Some(owner);
        self.acquisitions += 1;
        self.contended += u64::from(waiters > 0);
        let end = start + hold;
        self.holds.push_back(end);
        end
    }
}

/// A pool of identical servers (an RNIC's processing units): a request
/// takes the server that frees first.
#[derive(Debug)]
pub struct Engines {
    free_at: Vec<u64>,
}

impl Engines {
    /// `k` idle servers.
    pub fn new(k: usize) -> Engines {
        Engines { free_at: vec![0; k.max(1)] }
    }

    /// A request arriving at `t` that needs `service` ns: when it starts.
    #[inline]
    pub fn reserve(&mut self, t: u64, service: u64) -> u64 {
        let (i, &free) = self.free_at.iter().enumerate().min_by_key(|&(_, &f)| f).expect("at least one server");
        let start = free.max(t);
        self.free_at[i] = start + service;
        start
    }
}

/// A serial resource with a bandwidth: a link direction, a PCIe path.
/// Kept in picoseconds, so that small packets do not round up.
#[derive(Debug)]
pub struct Link {
    free_at_ps: u64,
    ps_per_byte: u64,
    /// Bytes carried.
    pub bytes: u64,
}

impl Link {
    /// A link of `gbps` Gbit/s.
    pub fn new(gbps: f64) -> Link {
        // 8 bits per byte, 1000 ps per ns: 8000 / Gbit/s ps per byte.
        Link { free_at_ps: 0, ps_per_byte: (8000.0 / gbps).round().max(1.0) as u64, bytes: 0 }
    }

    /// `bytes` ready to go at `t`: when the last of them has left (ns).
    #[inline]
    pub fn send(&mut self, t: u64, bytes: u64) -> u64 {
        let start = self.free_at_ps.max(t * 1000);
        self.free_at_ps = start + bytes * self.ps_per_byte;
        self.bytes += bytes;
        self.free_at_ps.div_ceil(1000)
    }
}

/// The RNIC's on-chip cache of WQEs and QP contexts: while more WRs are
/// outstanding than it holds, that share of them misses and waits for a
/// PCIe round trip (Smart §3.2; Kalia et al., ATC '16).
#[derive(Debug)]
pub struct WqeCache {
    /// WRs posted and not yet completed.
    pub outstanding: u64,
    capacity: u64,
    miss_ns: u64,
    /// Misses charged, in thousandths of a WR.
    pub misses_milli: u64,
}

impl WqeCache {
    /// A cache of `capacity` WRs whose misses cost `miss_ns`.
    pub fn new(capacity: u64, miss_ns: u64) -> WqeCache {
        WqeCache { outstanding: 0, capacity: capacity.max(1), miss_ns, misses_milli: 0 }
    }

    /// The extra engine time of one WR now: the miss share times the miss
    /// cost (an expected value, so runs stay deterministic and smooth).
    #[inline]
    pub fn miss_cost(&mut self) -> u64 {
        if self.outstanding <= self.capacity {
            return 0;
        }
        let over = self.outstanding - self.capacity;
        self.misses_milli += over * 1000 / self.outstanding;
        self.miss_ns * over / self.outstanding
    }
}

/// The responder's lock table for atomics: an atomic holds its slot for a
/// read-modify-write; atomics whose addresses share a slot serialise
/// (addresses `8 × slots` bytes apart share one).
#[derive(Debug)]
pub struct Atomics {
    free_at: Vec<u64>,
}

impl Atomics {
    /// A table of `slots` slots (a power of two).
    pub fn new(slots: usize) -> Atomics {
        Atomics { free_at: vec![0; slots] }
    }

    /// An atomic on `offset`, ready at `t`, holding its slot `hold` ns:
    /// when it starts.
    #[inline]
    pub fn hold(&mut self, offset: u64, t: u64, hold: u64) -> u64 {
        let slot = (offset >> 3) as usize & (self.free_at.len() - 1);
        let start = self.free_at[slot].max(t);
        self.free_at[slot] = start + hold;
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> profile::Doorbell {
        profile::Doorbell { lock_ns: 50, line_transfer_ns: 100, waiter_penalty_ns: 10 }
    }

    #[test]
    fn an_uncontended_lock_costs_its_hold_and_posts_of_one_thread_do_not_move_its_line() {
        let mut l = SpinLock::default();
        assert_eq!(l.acquire(1_000, 7, &db()), 1_050);
        assert_eq!(l.acquire(2_000, 7, &db()), 2_050, "same owner: no line transfer");
        assert_eq!(l.acquire(3_000, 8, &db()), 3_150, "another owner: the line moves");
        assert_eq!(l.contended, 0);
    }

    #[test]
    fn n_threads_on_one_lock_serialise() {
        // N posts at the same instant, from N threads: each waits for all
        // before it, and pays the transfer and one penalty per post behind
        // which it queued.
        let mut l = SpinLock::default();
        let n = 8;
        let mut ends = Vec::new();
        for i in 0..n {
            ends.push(l.acquire(0, i, &db()));
        }
        // Hold i = 50 + 10 i (+100 for i > 0); the end of post i is the sum.
        let mut want = 0;
        for i in 0..n as u64 {
            want += 50 + 10 * i + if i > 0 { 100 } else { 0 };
            assert_eq!(ends[i as usize], want);
        }
        assert_eq!(l.contended, n as u64 - 1);
    }

    #[test]
    fn a_pool_of_k_engines_serves_k_at_once_then_queues() {
        let mut e = Engines::new(4);
        let starts: Vec<u64> = (0..9).map(|_| e.reserve(100, 70)).collect();
        assert_eq!(starts, [100, 100, 100, 100, 170, 170, 170, 170, 240]);
    }

    #[test]
    fn a_link_serialises_bytes_at_its_bandwidth() {
        // 200 Gbit/s = 25 bytes/ns = 40 ps per byte.
        let mut l = Link::new(200.0);
        assert_eq!(l.send(0, 1000), 40);
        assert_eq!(l.send(0, 1000), 80, "queued behind the first");
        assert_eq!(l.send(1_000, 25), 1_001, "idle link: its own serialisation only");
        // Small packets do not round up one by one: 100 × 72 bytes = 288 ns.
        let mut l = Link::new(200.0);
        let last = (0..100).map(|_| l.send(0, 72)).last().unwrap();
        assert_eq!(last, 288);
    }

    #[test]
    fn outstanding_wrs_beyond_the_cache_miss_in_proportion() {
        let mut c = WqeCache::new(100, 1000);
        c.outstanding = 100;
        assert_eq!(c.miss_cost(), 0, "a full cache still hits");
        c.outstanding = 200;
        assert_eq!(c.miss_cost(), 500, "half the WRs miss");
        c.outstanding = 400;
        assert_eq!(c.miss_cost(), 750);
    }

    #[test]
    fn atomics_on_one_address_serialise_and_4_kib_apart_collide() {
        let mut a = Atomics::new(512);
        assert_eq!(a.hold(64, 0, 500), 0);
        assert_eq!(a.hold(64, 0, 500), 500, "same address waits");
        assert_eq!(a.hold(72, 0, 500), 0, "the next word has its own slot");
        assert_eq!(a.hold(64 + 4096, 0, 500), 1000, "4 KiB apart: the same slot (Ziegler et al.)");
    }
}
