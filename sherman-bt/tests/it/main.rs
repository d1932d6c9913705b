//! sherman-bt against an oracle and under concurrency (one test binary, one
//! module per concern).

mod api;
mod concurrency;
mod merge;
mod oracle;
mod sizes;
mod spec;

use std::future::Future;
use std::time::Duration;

use sherman_bt::{ShermanBt, ShermanError, ShermanStats};
use smart_bench::harness::{run_bench, Bench, RunConfig, RunReport, Worker};
use smart_core::smart::SmartConfig;
use smart_core::{Ctx, IndexStats, Runtime, RuntimeConfig, Transport};

/// Runs `body` on a fresh runtime (thread `thread` of `t`) with a handle on
/// tree `name` (created if absent).
fn on_tree<T: 'static, Fut: Future<Output = T> + 'static>(
    t: &dyn Transport,
    thread: usize,
    smart: &str,
    name: &'static str,
    body: impl FnOnce(ShermanBt) -> Fut,
) -> T {
    let cfg = RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), ..RuntimeConfig::default() };
    let mut rt = Runtime::new(t, thread, cfg).unwrap();
    let ctx = rt.ctx();
    let tree = rt.block_on(async move { ShermanBt::open_or_create(&ctx, name).await.unwrap().0 });
    rt.block_on(body(tree))
}

/// A run where each thread opens one handle on tree `name` and its
/// coroutines share it (so they share the caches and the local locks).
struct TreeRun<F> {
    name: &'static str,
    body: F,
    stats: std::sync::Mutex<ShermanStats>,
}

impl<F, Fut> Bench for TreeRun<F>
where
    F: Fn(Worker, ShermanBt) -> Fut + Sync,
    Fut: Future<Output = Result<(), ShermanError>> + 'static,
{
    type Error = ShermanError;
    type Thread = ShermanBt;

    fn open_thread(&self, ctx: Ctx) -> impl Future<Output = Result<ShermanBt, ShermanError>> + 'static {
        let name = self.name;
        async move { ShermanBt::open_or_create(&ctx, name).await.map(|(t, _)| t) }
    }

    fn coroutine(&self, w: Worker, t: ShermanBt) -> impl Future<Output = Result<(), ShermanError>> + 'static {
        (self.body)(w, t)
    }

    fn close_thread(&self, t: ShermanBt) {
        self.stats.lock().unwrap().merge(&t.counters());
    }
}

/// Runs `body` on `threads` × `coroutines` coroutines (bounded by their own
/// loops; the run's clock is only a backstop). Returns the run and the
/// tree's counters summed over threads.
fn run_tree<F, Fut>(
    t: &dyn Transport,
    threads: usize,
    coroutines: usize,
    smart: &str,
    name: &'static str,
    body: F,
) -> (RunReport, ShermanStats)
where
    F: Fn(Worker, ShermanBt) -> Fut + Sync,
    Fut: Future<Output = Result<(), ShermanError>> + 'static,
{
    let cfg = RunConfig {
        threads,
        coroutines,
        duration: Duration::from_secs(120),
        warmup: Duration::ZERO,
        runtime: RuntimeConfig { smart: SmartConfig::parse(smart).unwrap(), coroutines, ..RuntimeConfig::default() },
        progress: false,
        ..RunConfig::default()
    };
    let run = TreeRun { name, body, stats: Default::default() };
    let r = run_bench(t, &cfg, &run).unwrap();
    assert_eq!(r.errors, 0, "{smart}: {:?}", r.first_error);
    (r, run.stats.into_inner().unwrap())
}

/// The structure check of tree `name`: returns its keys, sorted, after
/// checking that none is stored twice.
fn checked_keys(t: &dyn Transport, name: &'static str) -> (sherman_bt::TreeShape, Vec<u64>) {
    on_tree(t, 0, "none", name, |mut tree| async move {
        let (shape, keys) = tree.walk().await.unwrap();
        let mut keys: Vec<u64> =
            keys.iter().map(|k| u64::from_be_bytes(k.as_slice().try_into().expect("8-byte keys"))).collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key is stored twice");
        (shape, keys)
    })
}

/// The value a writer stores for `key` at `version`: the key's low 40 bits
/// and the version, so a value of another key is caught.
fn value(key: u64, version: u64) -> u64 {
    key & ((1 << 40) - 1) | version << 40
}

fn holds_key(v: u64, key: u64) -> bool {
    v & ((1 << 40) - 1) == key & ((1 << 40) - 1)
}

/// Heap in use on every blade (bytes below the heap pointer).
async fn heap_used(ctx: &Ctx) -> u64 {
    let mut sum = 0;
    for b in 0..ctx.blades().len() as u16 {
        let ptr = ctx.read_u64(smart_core::GlobalAddr::new(b, smart_core::layout::OFF_HEAP)).await.unwrap();
        sum += ptr - smart_core::layout::HEAP_START;
    }
    sum
}

/// Tree `name`'s meta and format, read raw (for tests that write pages by
/// hand).
async fn tree_meta(ctx: &Ctx, name: &str) -> (sherman_bt::layout::Meta, sherman_bt::Format) {
    use sherman_bt::layout::{Meta, META};
    let meta = ctx.root(0, &format!("sherman:{name}")).await.unwrap().unwrap();
    let mut mb = [0u8; META];
    ctx.read(meta, &mut mb).await.unwrap();
    let m = Meta::decode(&mb).unwrap();
    let f = m.format().unwrap();
    (m, f)
}

/// A copy of page `at` of a tree of format `f`, validated.
async fn read_page(ctx: &Ctx, f: sherman_bt::Format, at: smart_core::GlobalAddr) -> sherman_bt::layout::PageBuf {
    use sherman_bt::layout::{PageBuf, PageRef};
    let mut b = vec![0u8; f.page];
    ctx.read(at, &mut b).await.unwrap();
    PageBuf::from_page(PageRef::check(&b, f).expect("a page"))
}
