//! Faults injected at virtual instants (deterministic simulation testing,
//! after FoundationDB's): a compute blade killed, a memory blade down for a
//! while and back on its memory, a memory blade lost with its memory, a
//! memory blade or a simulated thread stalled, a QP broken.
//! After one, the application's own invariants are checked by the next
//! commands (`recover`, `--audit-only`, `table check`, `ycsb --no-load
//! --verify`); `scripts/soak.sh --sim SEEDS` runs many seeds.
//!
//! A fault's instant counts from the start of the run's timed part (its
//! warm-up), so that it falls while the workload runs, not in its load.

use std::fmt;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The compute-blade process dies, as by SIGKILL: it exits at once with
    /// status 137. WRs it posted that had not reached memory are lost with
    /// it (as packets in its NIC); those whose packet reached a memory blade
    /// complete there, whole; the memory blades keep what they hold (use
    /// `--sim-blade-dir` to look at them afterwards).
    Kill,
    /// Memory blade `blade` stops answering for `down_ns`, then serves its
    /// memory again as it was (a restart on its backing file): WRs that
    /// reach it meanwhile fail with a transport error, and their QP goes to
    /// the error state.
    BladeDown {
        /// The memory blade.
        blade: u16,
        /// How long it is down (virtual ns).
        down_ns: u64,
    },
    /// Memory blade `blade` dies and its memory with it (its host lost):
    /// WRs that reach it from then on fail with a transport error, for the
    /// rest of the run; with `--sim-blade-dir`, its image is emptied, so
    /// that the next command finds a fresh, unformatted blade in its place
    /// (formatted with a new identity), as when a new memory-blade process
    /// replaces a lost one.
    BladeLost {
        /// The memory blade.
        blade: u16,
    },
    /// Memory blade `blade` stalls for `pause_ns` (its host paused, its
    /// NIC's firmware busy): requests that reach it meanwhile wait and run
    /// at the end, none fails; a stall past the request time-out (10 s by
    /// default) ends in time-outs.
    BladeStall {
        /// The memory blade.
        blade: u16,
        /// How long it stalls (virtual ns).
        pause_ns: u64,
    },
    /// Simulated thread `thread` stops for `pause_ns` (descheduled, paged
    /// out, SIGSTOPped), while the others go on.
    Stall {
        /// The thread (its index in the run).
        thread: usize,
        /// How long (virtual ns).
        pause_ns: u64,
    },
    /// Thread `thread`'s QP to memory blade `blade` breaks: its batches in
    /// flight complete with a transport error (those of their WRs that had
    /// reached memory took effect), and it stays in the error state until
    /// it is reset.
    DropQp {
        /// The thread.
        thread: usize,
        /// The memory blade.
        blade: u16,
    },
}

/// A fault and its instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Virtual ns after the start of the timed run (its warm-up).
    pub at_ns: u64,
    /// What happens.
    pub kind: FaultKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        match self.kind {
            FaultKind::Kill => write!(f, "kill@{}", ms(self.at_ns)),
            FaultKind::BladeDown { blade, down_ns } => {
                write!(f, "blade-down@{}:{blade}:{}", ms(self.at_ns), ms(down_ns))
            }
            FaultKind::BladeLost { blade } => write!(f, "blade-lost@{}:{blade}", ms(self.at_ns)),
            FaultKind::BladeStall { blade, pause_ns } => {
                write!(f, "blade-stall@{}:{blade}:{}", ms(self.at_ns), ms(pause_ns))
            }
            FaultKind::Stall { thread, pause_ns } => write!(f, "stall@{}:{thread}:{}", ms(self.at_ns), ms(pause_ns)),
            FaultKind::DropQp { thread, blade } => write!(f, "drop-qp@{}:{thread}:{blade}", ms(self.at_ns)),
        }
    }
}

impl Fault {
    /// Parses `kill@MS`, `blade-down@MS:BLADE:FOR_MS`, `blade-lost@MS:BLADE`,
    /// `blade-stall@MS:BLADE:FOR_MS`, `stall@MS:THREAD:FOR_MS` or
    /// `drop-qp@MS:THREAD:BLADE` (times in virtual milliseconds, fractions
    /// allowed).
    ///
    /// # Errors
    /// Says what is malformed.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "--sim-fault {s:?}: expected kill@MS, blade-down@MS:BLADE:FOR_MS, blade-lost@MS:BLADE, \
                 blade-stall@MS:BLADE:FOR_MS, stall@MS:THREAD:FOR_MS or drop-qp@MS:THREAD:BLADE"
            )
        };
        let (kind, rest) = s.split_once('@').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let ns = |t: &str| -> Result<u64, String> {
            let v: f64 = t.parse().map_err(|_| bad())?;
            if !(0.0..=1e9).contains(&v) {
                return Err(format!("--sim-fault {s:?}: {t} ms is out of range"));
            }
            Ok((v * 1e6) as u64)
        };
        let int = |t: &str| t.parse::<u64>().map_err(|_| bad());
        let at_ns = ns(parts[0])?;
        let kind = match (kind, parts.len()) {
            ("kill", 1) => FaultKind::Kill,
            ("blade-down", 3) => FaultKind::BladeDown { blade: int(parts[1])? as u16, down_ns: ns(parts[2])? },
            ("blade-lost", 2) => FaultKind::BladeLost { blade: int(parts[1])? as u16 },
            ("blade-stall", 3) => FaultKind::BladeStall { blade: int(parts[1])? as u16, pause_ns: ns(parts[2])? },
            ("stall", 3) => FaultKind::Stall { thread: int(parts[1])? as usize, pause_ns: ns(parts[2])? },
            ("drop-qp", 3) => FaultKind::DropQp { thread: int(parts[1])? as usize, blade: int(parts[2])? as u16 },
            _ => return Err(bad()),
        };
        Ok(Fault { at_ns, kind })
    }

    /// One fault drawn from `seed`, at an instant within the first
    /// `span_ns` of a run of `threads` threads over `blades` memory blades.
    /// A memory blade lost is drawn (one seed in six) only if the run's
    /// data survives one (`survives_loss`: replicated on other blades);
    /// the other seeds draw as if it could not, so that a seed's fault
    /// stays what it was.
    pub fn draw(seed: u64, span_ns: u64, threads: usize, blades: usize, survives_loss: bool) -> Fault {
        let r = |i: u64| smart_core::hash::mix64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let at_ns = span_ns / 10 + r(1) % (span_ns * 8 / 10).max(1);
        let thread = (r(2) % threads.max(1) as u64) as usize;
        let blade = (r(3) % blades.max(1) as u64) as u16;
        if survives_loss && blades > 1 && r(7) % 6 == 0 {
            return Fault { at_ns, kind: FaultKind::BladeLost { blade } };
        }
        let long = span_ns / 4 + r(4) % span_ns.max(1);
        let kind = match r(0) % 5 {
            0 => FaultKind::Kill,
            1 => FaultKind::BladeDown { blade, down_ns: long },
            // Long enough to pass leases now and then: up to 3 s.
            2 => FaultKind::Stall { thread, pause_ns: (r(5) % 3_000_000_000).max(long) },
            3 => FaultKind::BladeStall { blade, pause_ns: long },
            _ => FaultKind::DropQp { thread, blade },
        };
        Fault { at_ns, kind }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_print_back() {
        for s in [
            "kill@1.5",
            "blade-down@2:1:0.5",
            "blade-lost@1:2",
            "blade-stall@2:0:1.5",
            "stall@0.25:7:3000",
            "drop-qp@1:3:0",
        ] {
            let f = Fault::parse(s).unwrap();
            assert_eq!(Fault::parse(&f.to_string()).unwrap(), f, "{s}");
        }
        assert_eq!(Fault::parse("kill@2").unwrap(), Fault { at_ns: 2_000_000, kind: FaultKind::Kill });
        assert!(Fault::parse("explode@1").is_err());
        assert!(Fault::parse("stall@1:2").is_err());
        assert!(Fault::parse("blade-lost@1:2:3").is_err());
        assert!(Fault::parse("kill@-1").is_err());
    }

    #[test]
    fn drawn_faults_depend_on_the_seed_only_and_fall_in_the_span() {
        let a: Vec<Fault> = (0..50).map(|s| Fault::draw(s, 2_000_000, 96, 2, false)).collect();
        let b: Vec<Fault> = (0..50).map(|s| Fault::draw(s, 2_000_000, 96, 2, false)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|f| (200_000..1_800_000).contains(&f.at_ns)));
        let kinds: std::collections::HashSet<_> = a.iter().map(|f| std::mem::discriminant(&f.kind)).collect();
        assert_eq!(kinds.len(), 5, "every kind but a blade lost comes up");
        // Where a blade lost is survivable, some seeds draw it; the others
        // draw what they drew before.
        let c: Vec<Fault> = (0..50).map(|s| Fault::draw(s, 2_000_000, 96, 2, true)).collect();
        let lost = c.iter().filter(|f| matches!(f.kind, FaultKind::BladeLost { .. })).count();
        assert!((3..=15).contains(&lost), "{lost} of 50 lost");
        for (x, y) in a.iter().zip(&c) {
            assert!(x == y || matches!(y.kind, FaultKind::BladeLost { blade } if blade < 2), "{x} became {y}");
        }
        assert_eq!(Fault::draw(3, 2_000_000, 96, 1, true), Fault::draw(3, 2_000_000, 96, 1, false), "one blade");
    }
}
