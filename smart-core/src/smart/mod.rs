//! The Smart techniques (Ren et al., ASPLOS '24), each switchable at run time.
//!
//! * [`QpPolicy`]: thread-aware resource allocation (ThdResAlloc). How the
//!   threads' QPs map onto connections and doorbells.
//! * [`throttle`]: adaptive work-request throttling (WorkReqThrot). Per-thread
//!   credits and the epoch tuner.
//! * [`backoff`]: conflict avoidance (ConflictAvoid). Truncated exponential
//!   backoff with an adaptive cap, plus coroutine throttling.
//! * `spec_lookup`: speculative lookup, used by the applications (the B+tree
//!   and the hash table). The flag travels with the config.

pub mod backoff;
pub mod qp;
pub mod throttle;

use std::fmt;
use std::str::FromStr;

pub use backoff::{Backoff, BackoffConfig, ConflictParts};
pub use qp::{DoorbellConfig, QpBinding, QpPlan};
pub use throttle::{CreditThrottle, Search, Tuner, TunerConfig};

/// How QPs are allocated to threads (paper §3.1 baselines and Smart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpPolicy {
    /// All threads share one QP per blade.
    Shared,
    /// Each QP (per blade) is shared by `k` threads.
    Multiplexed(usize),
    /// One QP per (thread, blade); doorbells are bound by the driver's
    /// round-robin, so threads share them.
    PerThreadQp,
    /// One QP per (thread, blade), all of a thread's QPs on a doorbell of
    /// its own (Smart's ThdResAlloc).
    PerThreadDb,
}

impl fmt::Display for QpPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpPolicy::Shared => f.write_str("shared"),
            QpPolicy::Multiplexed(k) => write!(f, "multiplexed:{k}"),
            QpPolicy::PerThreadQp => f.write_str("per-thread-qp"),
            QpPolicy::PerThreadDb => f.write_str("per-thread-db"),
        }
    }
}

impl FromStr for QpPolicy {
    type Err = String;

    /// ```
    /// use smart_core::smart::QpPolicy;
    /// assert_eq!("multiplexed:4".parse(), Ok(QpPolicy::Multiplexed(4)));
    /// assert_eq!("per-thread-db".parse::<QpPolicy>().unwrap().to_string(), "per-thread-db");
    /// assert!("multiplexed:0".parse::<QpPolicy>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "shared" => QpPolicy::Shared,
            "per-thread-qp" => QpPolicy::PerThreadQp,
            "per-thread-db" => QpPolicy::PerThreadDb,
            m => match m.strip_prefix("multiplexed:").map(str::parse::<usize>) {
                Some(Ok(k)) if k >= 1 => QpPolicy::Multiplexed(k),
                Some(_) => return Err(format!("{m:?}: K in multiplexed:K must be a whole number ≥ 1")),
                None => {
                    return Err(format!(
                        "unknown QP policy {m:?}: use shared, multiplexed:K, per-thread-qp or per-thread-db"
                    ))
                }
            },
        })
    }
}

/// Which Smart techniques are on, with their parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SmartConfig {
    /// QP allocation (`per-thread-db` is ThdResAlloc on).
    pub qp_policy: QpPolicy,
    /// The (emulated) doorbell registers of the RNIC context.
    pub doorbells: DoorbellConfig,
    /// One CQ shared by all threads instead of one per thread.
    pub shared_cq: bool,
    /// WorkReqThrot: credits and the tuner; `None` = unthrottled.
    pub work_req_throt: Option<TunerConfig>,
    /// ConflictAvoid: backoff and coroutine throttling; `None` = retry at once.
    pub conflict_avoid: Option<BackoffConfig>,
    /// Speculative lookup in the applications.
    pub spec_lookup: bool,
}

impl Default for SmartConfig {
    /// Everything off: the baseline.
    fn default() -> Self {
        SmartConfig {
            qp_policy: QpPolicy::PerThreadQp,
            doorbells: DoorbellConfig::default(),
            shared_cq: false,
            work_req_throt: None,
            conflict_avoid: None,
            spec_lookup: false,
        }
    }
}

/// The techniques by their command-line names.
pub const TECHNIQUES: [&str; 4] = ["thd-res-alloc", "work-req-throt", "conflict-avoid", "spec-lookup"];

impl SmartConfig {
    /// Parses `all`, `none` or a comma-separated list of [`TECHNIQUES`]
    /// (default parameters). `thd-res-alloc` selects the `per-thread-db` QP
    /// policy.
    ///
    /// # Errors
    /// Names an unknown technique.
    pub fn parse(s: &str) -> Result<SmartConfig, String> {
        let mut c = SmartConfig::default();
        let names: Vec<&str> = match s {
            "none" => vec![],
            "all" => TECHNIQUES.to_vec(),
            list => list.split(',').map(str::trim).collect(),
        };
        for n in names {
            match n {
                "thd-res-alloc" => c.qp_policy = QpPolicy::PerThreadDb,
                "work-req-throt" => c.work_req_throt = Some(TunerConfig::default()),
                "conflict-avoid" => c.conflict_avoid = Some(BackoffConfig::default()),
                "spec-lookup" => c.spec_lookup = true,
                other => {
                    return Err(format!(
                        "unknown technique {other:?}; use all, none, or a list of {}",
                        TECHNIQUES.join(",")
                    ))
                }
            }
        }
        Ok(c)
    }

    /// On/off of the four techniques, in [`TECHNIQUES`] order.
    pub fn flags(&self) -> [bool; 4] {
        [
            self.qp_policy == QpPolicy::PerThreadDb,
            self.work_req_throt.is_some(),
            self.conflict_avoid.is_some(),
            self.spec_lookup,
        ]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_technique_lists() {
        assert_eq!(SmartConfig::parse("none").unwrap(), SmartConfig::default());
        assert_eq!(SmartConfig::parse("all").unwrap().flags(), [true; 4]);
        let c = SmartConfig::parse("conflict-avoid, work-req-throt").unwrap();
        assert_eq!(c.flags(), [false, true, true, false]);
        assert!(SmartConfig::parse("warp-drive").unwrap_err().contains("unknown technique"));
        assert_eq!(QpPolicy::Multiplexed(3).to_string().parse(), Ok(QpPolicy::Multiplexed(3)));
    }
}
