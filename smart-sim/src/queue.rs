//! A monotone priority queue of virtual times (a radix heap, Ahuja et al.,
//! "Faster algorithms for the shortest path problem", JACM 1990) for the
//! simulation's events: no event is ever made for a time before the last
//! one run, which a radix heap exploits to push and pop in amortised O(1)
//! instead of a binary heap's O(log n) cache misses.
//!
//! Keys are kept in 65 buckets by the highest bit in which they differ from
//! the last key popped; each bucket remembers its smallest key, so that
//! [`TimeQueue::peek`] reads the earliest time without moving anything (new
//! keys may still come in below it, as long as they are not below the last
//! key popped). A key pushed below the last key popped is taken as that one
//! (the simulation never makes one; the clamp keeps the queue well-formed).
//! Among equal keys the order is the one the pushes and pops make: always
//! the same for the same operations, so runs stay deterministic.

/// A radix heap of `(time, value)`.
#[derive(Debug)]
pub(crate) struct TimeQueue<V> {
    buckets: Vec<Vec<(u64, V)>>,
    /// The smallest key of each bucket (`u64::MAX` when empty).
    mins: [u64; 65],
    /// Bit b set: bucket b holds keys.
    nonempty: u128,
    /// The last key popped: every queued key is at least this.
    last: u64,
    len: usize,
    /// An empty vector with capacity, swapped in for a bucket being spread
    /// (so that no bucket loses its capacity: no allocation once warm).
    spare: Vec<(u64, V)>,
}

fn bucket(key: u64, last: u64) -> usize {
    64 - (key ^ last).leading_zeros() as usize
}

impl<V> TimeQueue<V> {
    pub(crate) fn new() -> TimeQueue<V> {
        TimeQueue {
            buckets: (0..65).map(|_| Vec::new()).collect(),
            mins: [u64::MAX; 65],
            nonempty: 0,
            last: 0,
            len: 0,
            spare: Vec::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn put(&mut self, key: u64, value: V) {
        let b = bucket(key, self.last);
        self.buckets[b].push((key, value));
        self.mins[b] = self.mins[b].min(key);
        self.nonempty |= 1 << b;
    }

    /// Queues `value` at `key` (or at the last key popped, if that is later).
    pub(crate) fn push(&mut self, key: u64, value: V) {
        self.put(key.max(self.last), value);
        self.len += 1;
    }

    /// The earliest key queued.
    pub(crate) fn peek(&self) -> Option<u64> {
        (self.nonempty != 0).then(|| self.mins[self.nonempty.trailing_zeros() as usize])
    }

    /// Takes an entry with the earliest key.
    pub(crate) fn pop(&mut self) -> Option<(u64, V)> {
        if self.nonempty == 0 {
            return None;
        }
        if self.nonempty & 1 == 0 {
            // The earliest bucket's smallest key becomes the new base; its
            // keys spread over the buckets below it.
            let b = self.nonempty.trailing_zeros() as usize;
            self.last = self.mins[b];
            let mut items = std::mem::take(&mut self.spare);
            std::mem::swap(&mut items, &mut self.buckets[b]);
            self.mins[b] = u64::MAX;
            self.nonempty &= !(1 << b);
            for (k, v) in items.drain(..) {
                self.put(k, v);
            }
            self.spare = items;
        }
        let e = self.buckets[0].pop().expect("bucket 0 holds the earliest keys");
        if self.buckets[0].is_empty() {
            self.mins[0] = u64::MAX;
            self.nonempty &= !1;
        }
        self.len -= 1;
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::TimeQueue;

    #[test]
    fn pops_in_time_order_like_a_sorted_list() {
        let mut q = TimeQueue::new();
        let mut want = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut now = 0;
        for round in 0..200u64 {
            for _ in 0..7 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let t = now + (x >> 40) % 10_000;
                q.push(t, round);
                want.push(t);
            }
            for _ in 0..5 {
                want.sort_unstable();
                assert_eq!(q.peek(), Some(want[0]), "peek sees the smallest");
                let (t, _) = q.pop().unwrap();
                assert!(t >= now, "monotone");
                now = t;
                assert_eq!(want.remove(0), t, "the smallest");
            }
        }
        while let Some((t, _)) = q.pop() {
            want.sort_unstable();
            assert_eq!(want.remove(0), t);
        }
        assert!(want.is_empty() && q.len() == 0 && q.peek().is_none());
    }

    #[test]
    fn keys_may_come_in_below_the_earliest_queued_but_not_below_the_last_popped() {
        let mut q = TimeQueue::new();
        q.push(300, 0u32);
        assert_eq!(q.pop(), Some((300, 0)));
        q.push(50_000, 1);
        assert_eq!(q.peek(), Some(50_000));
        q.push(2_500, 2);
        assert_eq!(q.peek(), Some(2_500), "below the earliest queued: fine");
        q.push(2_600, 3);
        assert_eq!(q.pop(), Some((2_500, 2)));
        q.push(100, 4);
        assert_eq!(q.pop(), Some((2_500, 4)), "below the last popped: taken as it");
        assert_eq!(q.pop(), Some((2_600, 3)));
        assert_eq!(q.pop(), Some((50_000, 1)));
    }
}

/// The simulated threads' next instants: one entry per thread, whose key
/// is moved in place when the thread is rescheduled (an indexed 4-ary
/// heap, keys kept beside the threads for locality), ordered by
/// (time, thread) so that ties go to the lower thread.
#[derive(Debug)]
pub(crate) struct ThreadQueue {
    /// The heap: (time, thread).
    heap: Vec<(u64, u32)>,
    /// Per thread: its place in `heap`, or `u32::MAX` when not queued.
    pos: Vec<u32>,
}

const ARITY: usize = 4;

impl ThreadQueue {
    /// A queue for threads `0..n`, none queued.
    pub(crate) fn new(n: usize) -> ThreadQueue {
        ThreadQueue { heap: Vec::with_capacity(n), pos: vec![u32::MAX; n] }
    }

    #[inline]
    fn place(&mut self, i: usize, e: (u64, u32)) {
        self.heap[i] = e;
        self.pos[e.1 as usize] = i as u32;
    }

    fn up(&mut self, mut i: usize) {
        let e = self.heap[i];
        while i > 0 {
            let p = (i - 1) / ARITY;
            if self.heap[p] <= e {
                break;
            }
            let pe = self.heap[p];
            self.place(i, pe);
            i = p;
        }
        self.place(i, e);
    }

    fn down(&mut self, mut i: usize) {
        let e = self.heap[i];
        let n = self.heap.len();
        loop {
            let first = ARITY * i + 1;
            if first >= n {
                break;
            }
            let (mut m, mut me) = (first, self.heap[first]);
            for c in first + 1..(first + ARITY).min(n) {
                if self.heap[c] < me {
                    (m, me) = (c, self.heap[c]);
                }
            }
            if e <= me {
                break;
            }
            self.place(i, me);
            i = m;
        }
        self.place(i, e);
    }

    /// The time thread `t` is queued at, if it is.
    #[inline]
    pub(crate) fn at(&self, t: usize) -> Option<u64> {
        let p = self.pos[t];
        (p != u32::MAX).then(|| self.heap[p as usize].0)
    }

    /// Queues thread `t` at `key`, or moves it there.
    pub(crate) fn set(&mut self, t: usize, key: u64) {
        match self.at(t) {
            None => {
                self.heap.push((key, t as u32));
                let i = self.heap.len() - 1;
                self.pos[t] = i as u32;
                self.up(i);
            }
            Some(old) => {
                let i = self.pos[t] as usize;
                self.heap[i].0 = key;
                if key < old {
                    self.up(i);
                } else {
                    self.down(i);
                }
            }
        }
    }

    /// The earliest (time, thread).
    #[inline]
    pub(crate) fn peek(&self) -> Option<(u64, usize)> {
        self.heap.first().map(|&(k, t)| (k, t as usize))
    }

    /// Takes the earliest (time, thread) off the queue.
    pub(crate) fn pop(&mut self) -> Option<(u64, usize)> {
        let top = self.peek()?;
        let last = self.heap.pop().expect("non-empty");
        self.pos[top.1] = u32::MAX;
        if !self.heap.is_empty() {
            self.heap[0] = last;
            self.down(0);
        }
        Some(top)
    }
}

#[cfg(test)]
mod thread_tests {
    use super::ThreadQueue;

    #[test]
    fn threads_come_out_by_time_then_index_and_move_in_place() {
        let mut q = ThreadQueue::new(5);
        q.set(3, 50);
        q.set(1, 70);
        q.set(4, 50);
        q.set(0, 90);
        assert_eq!(q.peek(), Some((50, 3)), "ties: the lower thread");
        q.set(0, 10);
        assert_eq!(q.at(0), Some(10));
        assert_eq!(q.pop(), Some((10, 0)));
        q.set(1, 200);
        assert_eq!(q.pop(), Some((50, 3)));
        assert_eq!(q.pop(), Some((50, 4)));
        assert_eq!(q.pop(), Some((200, 1)));
        assert_eq!(q.pop(), None);
        assert_eq!(q.at(1), None);
    }
}
