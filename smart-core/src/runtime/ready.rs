//! The executor's set of runnable tasks: a bitmask that wakers set and the
//! executor drains.
//!
//! A waker sets its task's bit with a `Release` `fetch_or`; the executor
//! takes a whole word with an `Acquire` `swap(0)`. So a wake is never lost
//! (a bit set before the swap is returned by it, one set after stays for the
//! next), and whatever the waker wrote before waking (a completion's status)
//! is visible to the executor that sees the bit. Both properties are
//! model-checked with loom (`RUSTFLAGS="--cfg loom" cargo test -p smart-core
//! --lib loom`).

use crate::primitive::{AtomicU64, Ordering};

/// Runnable-task bits, 64 tasks per word.
#[derive(Debug)]
pub(crate) struct ReadySet {
    words: Vec<AtomicU64>,
}

impl ReadySet {
    /// Room for `words` × 64 tasks.
    pub(crate) fn new(words: usize) -> ReadySet {
        ReadySet { words: (0..words).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Marks task `idx` runnable.
    #[inline]
    pub(crate) fn wake(&self, idx: usize) {
        self.words[idx / 64].fetch_or(1 << (idx % 64), Ordering::Release);
    }

    /// The runnable bits of word `w`, without taking them (a relaxed load:
    /// a bit set concurrently may show only at the next look, never be lost,
    /// since only [`ReadySet::take`] clears bits).
    #[inline]
    pub(crate) fn peek(&self, w: usize) -> u64 {
        self.words[w].load(Ordering::Relaxed)
    }

    /// Takes (and clears) the runnable bits of word `w`.
    #[inline]
    pub(crate) fn take(&self, w: usize) -> u64 {
        self.words[w].swap(0, Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ReadySet;

    #[test]
    fn wakes_accumulate_until_taken() {
        let r = ReadySet::new(2);
        r.wake(0);
        r.wake(63);
        r.wake(64);
        r.wake(0);
        assert_eq!(r.take(0), 1 | 1 << 63);
        assert_eq!(r.take(0), 0);
        assert_eq!(r.take(1), 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;
    use loom::thread;

    use super::ReadySet;
    use crate::primitive::Ordering;

    #[test]
    fn loom_no_wake_is_lost() {
        loom::model(|| {
            let set = Arc::new(ReadySet::new(2));
            let a = {
                let set = set.clone();
                thread::spawn(move || {
                    set.wake(3);
                    set.wake(70);
                })
            };
            let b = {
                let set = set.clone();
                thread::spawn(move || {
                    set.wake(3);
                    set.wake(5);
                })
            };
            // The executor drains concurrently, then once more after the wakers.
            let mut seen = [set.take(0), set.take(1)];
            a.join().unwrap();
            b.join().unwrap();
            seen[0] |= set.take(0);
            seen[1] |= set.take(1);
            assert_eq!(seen, [1 << 3 | 1 << 5, 1 << 6]);
        });
    }

    #[test]
    fn loom_data_written_before_a_wake_is_seen_by_the_executor() {
        loom::model(|| {
            let set = Arc::new(ReadySet::new(1));
            let status = Arc::new(AtomicU64::new(0));
            let waker = {
                let (set, status) = (set.clone(), status.clone());
                thread::spawn(move || {
                    status.store(42, Ordering::Relaxed);
                    set.wake(1);
                })
            };
            if set.take(0) & 2 != 0 {
                assert_eq!(status.load(Ordering::Relaxed), 42, "woken before the completion was visible");
            }
            waker.join().unwrap();
        });
    }
}
