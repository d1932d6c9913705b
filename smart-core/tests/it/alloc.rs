//! The per-operation path allocates nothing once warm: a counting global
//! allocator (per thread, so concurrent tests do not interfere) watches a
//! coroutine posting batches on the embedded and TCP backends.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use smart_core::{Runtime, RuntimeConfig};

use smart_testkit::backends;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers to the system allocator; the counter is a const-initialized
// thread-local without destructor, so touching it never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn posting_and_polling_allocate_nothing_once_warm() {
    // The counter is live: an allocation on this thread shows.
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 10]));
    assert!(allocs() > before);
    for b in [backends::embedded(1), backends::tcp(1)] {
        let mut rt = Runtime::new(&*b.transport, 0, RuntimeConfig::default()).unwrap();
        let ctx = rt.ctx();
        let name = b.name;
        let delta = rt.block_on(async move {
            let a = ctx.alloc(0, 4096, 64).await.unwrap();
            let payload = [7u8; 256];
            let mut buf = [0u8; 256];
            let round = |i: u64| {
                let ctx = ctx.clone();
                async move {
                    let mut bt = ctx.batch();
                    bt.write(a, &payload);
                    let r = bt.read(a.add(256), 256);
                    let f = bt.faa(a.add(1024), 1);
                    let c = bt.cas(a.add(1032), i, i + 1);
                    let done = bt.post().await.unwrap();
                    (done.bytes(r)[0], done.old(f), done.old(c))
                }
            };
            for i in 0..200 {
                round(i).await;
            }
            let before = allocs();
            for i in 200..5200 {
                let (_, f, c) = round(i).await;
                assert_eq!((f, c), (i, i));
            }
            ctx.read(a, &mut buf).await.unwrap();
            assert_eq!(buf, payload);
            allocs() - before
        });
        assert_eq!(delta, 0, "{name}: {delta} allocations in 5000 batches");
    }
}
