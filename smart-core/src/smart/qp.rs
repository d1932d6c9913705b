//! Thread-aware resource allocation (ThdResAlloc of Smart, Ren et al.,
//! ASPLOS '24): which QP
//! each (thread, blade) pair uses, and which doorbell each QP rings.
//!
//! An RNIC context has few doorbell registers. The ConnectX-6 default is 16:
//! 4 *low-latency* ones, each bound to a single QP, and 12 *medium-latency*
//! ones shared by all later QPs. The user-space driver binds new QPs to them
//! in creation order: the first 4 QPs get the low-latency ones, the rest go
//! round-robin over the medium ones. A shared doorbell is guarded by a
//! spinlock, so threads whose QPs share a doorbell contend on it. That
//! contention was 74% of the time at 96 threads in the paper.
//!
//! The policies:
//!
//! * `shared`: one QP per blade, used by every thread (QP lock + doorbell).
//! * `multiplexed:K`: threads `gK..gK+K-1` share QP `g` of each blade.
//! * `per-thread-qp`: a QP per (thread, blade), doorbells bound by the
//!   driver's rule above, so threads share medium doorbells.
//! * `per-thread-db` (Smart): a QP per (thread, blade), all of a thread's
//!   QPs on a doorbell of its own, with no lock. On mlx5 this is a thread
//!   domain, or QPs created in an order that predicts the driver's binding.
//!
//! The plan is pure arithmetic, so the soft backends and the verbs backend
//! agree on it, and tests can check every binding.

use super::QpPolicy;

/// The doorbell registers of an emulated RNIC context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellConfig {
    /// Doorbells each bound to exactly one QP (taken by the first QPs).
    pub low_latency: usize,
    /// Doorbells shared round-robin by all later QPs.
    pub medium: usize,
}

impl Default for DoorbellConfig {
    /// ConnectX-6 defaults: 4 low-latency + 12 medium-latency.
    fn default() -> Self {
        DoorbellConfig { low_latency: 4, medium: 12 }
    }
}

/// A QP's place in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpBinding {
    /// Index of the QP (creation order).
    pub qp: usize,
    /// The doorbell it rings.
    pub doorbell: usize,
    /// Whether other threads post to the same QP (needs the QP lock).
    pub qp_shared: bool,
    /// Whether other QPs ring the same doorbell (needs the doorbell lock).
    pub doorbell_shared: bool,
}

/// The QP and doorbell plan for `threads` threads and `blades` blades.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpPlan {
    /// The policy.
    pub policy: QpPolicy,
    /// Worker threads.
    pub threads: usize,
    /// Memory blades.
    pub blades: usize,
    /// Doorbell registers.
    pub doorbells: DoorbellConfig,
    /// One CQ for all threads (polled under a lock, completions dispatched
    /// to their threads) instead of a CQ per thread.
    pub shared_cq: bool,
}

impl QpPlan {
    /// A plan.
    ///
    /// # Panics
    /// If there are no threads, no blades, or no medium doorbells.
    pub fn new(policy: QpPolicy, threads: usize, blades: usize, doorbells: DoorbellConfig) -> QpPlan {
        assert!(threads > 0 && blades > 0 && doorbells.medium > 0, "a plan needs threads, blades and medium doorbells");
        QpPlan { policy, threads, blades, doorbells, shared_cq: false }
    }

    /// The same plan with one CQ shared by all threads (`true`) or a CQ per
    /// thread (`false`, Smart's choice).
    pub fn with_shared_cq(mut self, shared: bool) -> QpPlan {
        self.shared_cq = shared;
        self
    }

    /// Threads that share one QP.
    fn group(&self) -> usize {
        match self.policy {
            QpPolicy::Shared => self.threads,
            QpPolicy::Multiplexed(k) => k.min(self.threads),
            QpPolicy::PerThreadQp | QpPolicy::PerThreadDb => 1,
        }
    }

    /// Number of QPs created.
    pub fn qps(&self) -> usize {
        self.threads.div_ceil(self.group()) * self.blades
    }

    /// Number of doorbells in use.
    pub fn doorbells_used(&self) -> usize {
        match self.policy {
            QpPolicy::PerThreadDb => self.threads,
            _ => {
                let n = self.qps();
                let low = self.doorbells.low_latency.min(n);
                low + (n - low).min(self.doorbells.medium)
            }
        }
    }

    /// The threads that post to QP `qp`.
    pub fn sharers(&self, qp: usize) -> std::ops::Range<usize> {
        let g = self.group();
        let first = (qp / self.blades) * g;
        first..(first + g).min(self.threads)
    }

    /// The doorbell QP `qp` is bound to.
    pub fn doorbell_of(&self, qp: usize) -> usize {
        match self.policy {
            // One doorbell per thread: all QPs of thread t ring doorbell t.
            QpPolicy::PerThreadDb => qp / self.blades,
            _ if qp < self.doorbells.low_latency => qp,
            _ => self.doorbells.low_latency + (qp - self.doorbells.low_latency) % self.doorbells.medium,
        }
    }

    /// QPs bound to doorbell `db`.
    pub fn qps_on_doorbell(&self, db: usize) -> usize {
        (0..self.qps()).filter(|&q| self.doorbell_of(q) == db).count()
    }

    /// Where thread `thread` posts WRs for blade `blade`.
    pub fn binding(&self, thread: usize, blade: usize) -> QpBinding {
        let qp = (thread / self.group()) * self.blades + blade;
        let doorbell = self.doorbell_of(qp);
        let doorbell_shared = match self.policy {
            QpPolicy::PerThreadDb => false,
            _ => doorbell >= self.doorbells.low_latency && self.qps_on_doorbell(doorbell) > 1,
        };
        QpBinding { qp, doorbell, qp_shared: self.sharers(qp).len() > 1, doorbell_shared }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn plan(policy: QpPolicy, threads: usize, blades: usize) -> QpPlan {
        QpPlan::new(policy, threads, blades, DoorbellConfig::default())
    }

    #[test]
    fn shared_and_multiplexed_group_threads_on_qps() {
        let p = plan(QpPolicy::Shared, 8, 2);
        assert_eq!(p.qps(), 2);
        assert_eq!(p.binding(0, 1).qp, p.binding(7, 1).qp);
        assert!(p.binding(3, 0).qp_shared);
        assert_eq!(p.sharers(0), 0..8);
        let m = plan(QpPolicy::Multiplexed(3), 8, 1);
        assert_eq!(m.qps(), 3);
        assert_eq!([0, 1, 2, 3, 5, 6, 7].map(|t| m.binding(t, 0).qp), [0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(m.sharers(2), 6..8, "the last group is short");
        assert!(!plan(QpPolicy::Shared, 1, 1).binding(0, 0).qp_shared, "one thread shares with nobody");
    }

    #[test]
    fn per_thread_qp_binds_doorbells_like_the_driver() {
        // 24 threads × 1 blade: QPs 0-3 get the 4 low-latency doorbells
        // alone, QPs 4.. go round-robin over the 12 medium ones.
        let p = plan(QpPolicy::PerThreadQp, 24, 1);
        assert_eq!(p.qps(), 24);
        for t in 0..4 {
            let s = p.binding(t, 0);
            assert_eq!((s.doorbell, s.doorbell_shared, s.qp_shared), (t, false, false));
        }
        assert_eq!(p.binding(4, 0).doorbell, 4);
        assert_eq!(p.binding(15, 0).doorbell, 15);
        assert_eq!(p.binding(16, 0).doorbell, 4, "wraps around the medium doorbells");
        assert!(p.binding(4, 0).doorbell_shared && p.binding(16, 0).doorbell_shared);
        // QPs 4..23 fill doorbells 4..15 then 4..11 again: 12..15 have one QP.
        assert!(p.binding(11, 0).doorbell_shared);
        assert!(!p.binding(15, 0).doorbell_shared);
        assert_eq!(p.doorbells_used(), 16);
        // Few threads: medium doorbells with one QP each are not contended.
        let small = plan(QpPolicy::PerThreadQp, 6, 1);
        assert!((0..6).all(|t| !small.binding(t, 0).doorbell_shared));
        // Two blades: one thread's two QPs may land on different doorbells,
        // and threads share doorbells sooner.
        let two = plan(QpPolicy::PerThreadQp, 10, 2);
        assert_eq!(two.binding(2, 0).qp, 4);
        assert_eq!(two.binding(2, 0).doorbell, 4);
        assert_eq!(two.binding(8, 0).doorbell, 4, "QP 16 wraps onto QP 4's doorbell");
        assert!(two.binding(8, 0).doorbell_shared);
    }

    #[test]
    fn per_thread_db_gives_each_thread_its_own_doorbell_for_any_count() {
        for threads in [1, 4, 16, 17, 96, 200] {
            let p = plan(QpPolicy::PerThreadDb, threads, 3);
            assert_eq!(p.doorbells_used(), threads);
            for t in 0..threads {
                let dbs: Vec<usize> = (0..3).map(|b| p.binding(t, b).doorbell).collect();
                assert_eq!(dbs, [t, t, t], "all of a thread's QPs on its doorbell");
                assert!((0..3).all(|b| !p.binding(t, b).doorbell_shared && !p.binding(t, b).qp_shared));
            }
        }
    }
}
