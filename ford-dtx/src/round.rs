//! A round trip of a transaction: one batch per blade (more when one
//! would exceed a batch's WRs or bytes), all posted together.

use smart_core::runtime::{post_all, Batch, Done, MAX_BATCH};
use smart_core::Ctx;

use crate::error::{DtxError, TxnError};

/// Most batches in one round trip: a blade per replica (at most 4), and
/// two batches to a blade for the largest transactions.
pub(crate) const ROUND: usize = 8;

/// A round trip: one batch per blade (more when one would exceed a
/// batch's WRs or bytes), all posted together.
pub(crate) struct Round<'a> {
    ctx: &'a Ctx,
    blades: [u16; ROUND],
    bytes: [usize; ROUND],
    pub(crate) batches: [Option<Batch<'a>>; ROUND],
    pub(crate) n: usize,
    /// The completed batches, by index, once posted (kept here rather than
    /// returned: moving the array through a `Result` copied it twice per
    /// round).
    done: Landed<'a>,
}

/// The completed batches of a round, by index.
type Landed<'a> = [Option<Done<'a>>; ROUND];

impl<'a> Round<'a> {
    pub(crate) fn new(ctx: &'a Ctx) -> Self {
        Round {
            ctx,
            blades: [0; ROUND],
            bytes: [0; ROUND],
            batches: std::array::from_fn(|_| None),
            n: 0,
            done: std::array::from_fn(|_| None),
        }
    }

    /// The batch to `blade` with room for `wrs` more WRs of `bytes` local
    /// bytes (8-byte aligned each).
    pub(crate) fn batch(&mut self, blade: u16, wrs: usize, bytes: usize) -> Result<(usize, &mut Batch<'a>), TxnError> {
        let room = self.ctx.config().slot_bytes;
        let last = self.blades[..self.n].iter().rposition(|b| *b == blade);
        let i = match last {
            Some(i)
                if self.batches[i].as_ref().is_some_and(|b| b.len() + wrs <= MAX_BATCH)
                    && self.bytes[i] + bytes <= room =>
            {
                i
            }
            _ if self.n < ROUND && wrs <= MAX_BATCH && bytes <= room => {
                self.blades[self.n] = blade;
                self.bytes[self.n] = 0;
                self.batches[self.n] = Some(self.ctx.batch());
                self.n += 1;
                self.n - 1
            }
            _ => return Err(too_large("WRs")),
        };
        self.bytes[i] += bytes;
        Ok((i, self.batches[i].as_mut().expect("made above")))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Posts the round and waits for all of it; then [`Round::landed`]
    /// gives each batch's completion.
    pub(crate) async fn post(&mut self) -> Result<(), TxnError> {
        let done = &mut self.done;
        // The futures and results of `post_all` are arrays of its `N`: the
        // smallest that holds the round.
        match self.n {
            1 => {
                // The common case: one doorbell, awaited directly.
                let b = self.batches[0].as_mut().expect("one batch");
                done[0] = Some(b.post().await?);
                Ok(())
            }
            2 => Self::land(post_all(first::<2>(&mut self.batches)).await, done),
            3 | 4 => Self::land(post_all(first::<4>(&mut self.batches)).await, done),
            _ => Self::land(post_all(&mut self.batches).await, done),
        }
    }

    /// The completion of batch `i` of the posted round.
    pub(crate) fn landed(&self, i: usize) -> &Done<'a> {
        self.done[i].as_ref().expect("posted")
    }

    /// Moves `post_all`'s results into `done`; the first error, if any.
    fn land<const N: usize>(
        out: [Option<smart_core::Result<Done<'a>>>; N],
        done: &mut Landed<'a>,
    ) -> Result<(), TxnError> {
        let mut first_err = None;
        for (d, o) in done.iter_mut().zip(out) {
            match o {
                Some(Ok(x)) => *d = Some(x),
                Some(Err(e)) => first_err = first_err.or(Some(e)),
                None => {}
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// The first `N` batches of a round, as an array.
fn first<'r, 'a, const N: usize>(batches: &'r mut [Option<Batch<'a>>; ROUND]) -> &'r mut [Option<Batch<'a>>; N] {
    (&mut batches[..N]).try_into().expect("N <= ROUND")
}

#[cold]
#[inline(never)]
pub(crate) fn too_large(what: &str) -> TxnError {
    TxnError::Dtx(DtxError::Config(format!("transaction too large: more {what} than one round trip carries")))
}
