//! Linearizability of register histories, and a history of one key of any
//! [`KvIndex`] to check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smart_bench::harness::{self, RunConfig};
use smart_core::{KvIndex, Transport};

/// One completed operation on a register, with real-time bounds (ns).
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// When the operation was invoked.
    pub start: u128,
    /// When it returned.
    pub end: u128,
    /// A write (else a read).
    pub write: bool,
    /// The value written, or the value read.
    pub value: u64,
}

/// Whether a history of one register with unique written values is
/// linearizable (Gibbons & Korach's zone test). The initial value `init`
/// counts as written before everything.
///
/// Group each write with the reads that returned its value (a *cluster*).
/// A cluster's zone runs from its earliest response to its latest
/// invocation: *forward* when the earliest response comes first, else
/// *backward*. The history is linearizable iff no read ends before its
/// write starts, no read returns a value never written, no two forward
/// zones overlap, and no backward zone lies inside a forward zone.
///
/// # Errors
/// A message naming the first violation found.
pub fn linearizable(history: &[Event], init: u64) -> Result<(), String> {
    let mut clusters: HashMap<u64, (u128, u128)> = HashMap::new(); // value → (min end, max start)
    let writes: HashMap<u64, Event> = history.iter().filter(|e| e.write).map(|e| (e.value, *e)).collect();
    clusters.insert(init, (0, 0));
    for w in writes.values() {
        clusters.insert(w.value, (w.end, w.start));
    }
    for r in history.iter().filter(|e| !e.write) {
        let c = clusters.get_mut(&r.value).ok_or_else(|| format!("read {r:?} returned a value never written"))?;
        if let Some(w) = writes.get(&r.value) {
            if r.end < w.start {
                return Err(format!("read {r:?} ended before its write {w:?} began"));
            }
        }
        c.0 = c.0.min(r.end);
        c.1 = c.1.max(r.start);
    }
    let forward: Vec<(u128, u128)> = clusters.values().filter(|(e, s)| e < s).copied().collect();
    let backward: Vec<(u128, u128)> = clusters.values().filter(|(e, s)| e >= s).map(|(e, s)| (*s, *e)).collect();
    for (i, a) in forward.iter().enumerate() {
        for b in &forward[i + 1..] {
            if a.0 < b.1 && b.0 < a.1 {
                return Err(format!("forward zones {a:?} and {b:?} overlap"));
            }
        }
        for b in &backward {
            if a.0 < b.0 && b.1 < a.1 {
                return Err(format!("backward zone {b:?} lies inside forward zone {a:?}"));
            }
        }
    }
    Ok(())
}

/// Runs `ops` operations on one key of the index `name` (created for
/// `capacity` keys) from every coroutine of `cfg` (its threads, coroutines
/// and runtime; no time limit): one in three an upsert of a value unique to
/// the coroutine and step, the others reads. Returns the history, for
/// [`linearizable`] with initial value 0.
///
/// # Errors
/// The first error of an operation, or of the run.
pub fn register_history<I: KvIndex>(
    transport: &dyn Transport,
    cfg: &RunConfig,
    name: &str,
    capacity: u64,
    ops: u64,
) -> Result<Vec<Event>, String> {
    let history = Arc::new(Mutex::new(Vec::new()));
    let (h, t0, name) = (history.clone(), Instant::now(), name.to_string());
    let cfg = RunConfig { duration: Duration::from_secs(3600), warmup: Duration::ZERO, ..cfg.clone() };
    let report = harness::run(transport, &cfg, move |w| {
        let (h, name) = (h.clone(), name.clone());
        async move {
            let (mut ix, _) = I::open_or_create(w.ctx(), &name, capacity)
                .await
                .map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
            let mut out = Vec::new();
            for i in 0..ops {
                // Unique values: thread, coroutine and step in one word.
                let value = (w.thread() as u64) << 40 | (w.coroutine() as u64) << 20 | (i + 1);
                let start = t0.elapsed().as_nanos();
                let (write, v) = if i % 3 == 0 {
                    ix.upsert(b"the-key", &value.to_le_bytes())
                        .await
                        .map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
                    (true, value)
                } else {
                    let found = ix
                        .get(b"the-key", &mut out)
                        .await
                        .map_err(|e| smart_core::Error::Unsupported(e.to_string()))?;
                    (false, if found { u64::from_le_bytes(out[..8].try_into().expect("8-byte values")) } else { 0 })
                };
                let end = t0.elapsed().as_nanos();
                h.lock().expect("history").push(Event { start, end, write, value: v });
            }
            Ok(())
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = report.first_error {
        return Err(e);
    }
    let h = history.lock().expect("history").clone();
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linearizability_checker_rejects_what_it_should() {
        // Real events start after time 0, where the initial value was "written".
        let ev = |start, end, write, value| Event { start, end, write, value };
        // Sequential and overlapping, fine.
        assert!(linearizable(
            &[ev(1, 10, true, 1), ev(20, 30, false, 1), ev(25, 40, true, 2), ev(35, 50, false, 2)],
            0
        )
        .is_ok());
        assert!(
            linearizable(&[ev(1, 10, true, 1), ev(5, 6, false, 0)], 0).is_ok(),
            "a read overlapping a write may see the old value"
        );
        // A read of a value written only after the read ended.
        assert!(linearizable(&[ev(1, 10, false, 1), ev(20, 30, true, 1)], 0).is_err());
        // New then old: two sequential reads see 2 and then 1, after both writes ended.
        let h = [ev(1, 10, true, 1), ev(20, 30, true, 2), ev(40, 50, false, 2), ev(60, 70, false, 1)];
        assert!(linearizable(&h, 0).is_err());
        // A stale read of the initial value after a completed write.
        assert!(linearizable(&[ev(1, 10, true, 1), ev(20, 30, false, 0)], 0).is_err());
        assert!(linearizable(&[ev(1, 10, false, 9)], 0).is_err());
    }
}
