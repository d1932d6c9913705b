//! A barrier across processes, through one FAA counter on blade 0.
//!
//! Several compute blades that measure together must start their timed
//! phase together: each calls [`arrive`] with the same name and party
//! count `n`, and returns once `n` parties arrived.
//!
//! The counter lives in an 8-byte area under the named root
//! `smart:barrier:NAME` on blade 0 and only grows. A party's FAA returns its
//! ticket `t`; it belongs to generation `t / n` and waits (polling with
//! READs) until the counter reaches `(t / n + 1) * n`. So the same name can
//! be used again for the next run of `n` parties without a reset, and a
//! party of a later generation never releases an earlier one early.
//!
//! A party that dies before arriving leaves the others waiting: they give
//! up after the time-out with an error saying how many arrived. A party that
//! dies after arriving counts as arrived (the others are released and the
//! dead one's share of the run is simply missing from the merge).

use std::time::{Duration, Instant};

use crate::runtime::Ctx;
use crate::{Error, Result};

/// The named root of barrier `name`.
pub fn root_name(name: &str) -> String {
    format!("smart:barrier:{name}")
}

/// Where a party stood when the barrier released it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// This party's ticket (0-based, counted over every generation).
    pub ticket: u64,
    /// Its generation: the how-many-th use of this name by `n` parties.
    pub generation: u64,
    /// How long it waited for the others.
    pub waited: Duration,
}

/// Arrives at barrier `name` of `n` parties and waits for the rest of its
/// generation, polling every `poll`.
///
/// # Errors
/// [`Error::Unsupported`] for `n == 0` or an empty name;
/// [`Error::BarrierTimeout`] when the others did not arrive within
/// `timeout`; verb errors.
pub async fn arrive(ctx: &Ctx, name: &str, n: u64, timeout: Duration, poll: Duration) -> Result<Arrival> {
    if n == 0 || name.is_empty() {
        return Err(Error::Unsupported("a barrier needs a name and at least one party".into()));
    }
    let root = root_name(name);
    let at = match ctx.root(0, &root).await? {
        Some(a) => a,
        None => {
            let fresh = ctx.alloc(0, 64, 64).await?;
            ctx.write(fresh, &[0u8; 8]).await?;
            // The first creator wins; a loser's area is left unused.
            ctx.set_root(0, &root, fresh).await?
        }
    };
    let start = Instant::now();
    let ticket = ctx.faa(at, 1).await?;
    let generation = ticket / n;
    let release = (generation + 1) * n;
    loop {
        let c = ctx.read_u64(at).await?;
        if c >= release {
            return Ok(Arrival { ticket, generation, waited: start.elapsed() });
        }
        if start.elapsed() >= timeout {
            return Err(Error::BarrierTimeout {
                name: name.to_string(),
                arrived: c - generation * n,
                parties: n,
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        ctx.sleep_ns(poll.as_nanos() as u64).await;
    }
}
