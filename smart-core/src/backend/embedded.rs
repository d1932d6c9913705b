//! The embedded backend: memory blades living in this process.
//!
//! Posting enqueues the batch on its QP's send queue; the thread's next
//! `poll` executes queued batches in order against the blade's region and
//! produces their completions, the way an RNIC processes a send queue
//! between doorbell and CQE. A QP of its own (not shared with other
//! threads) outside chaos mode takes a shorter path: the doorbell stages
//! the batch in the endpoint's own list (no lock, no send-queue copy) and
//! hints the CPU to fetch the remote lines it touches; the next `poll`
//! executes the staged batches in posting order. Like an RNIC working on
//! several WRs at once, the memory latencies of the batches the thread's
//! coroutines posted in one round then overlap instead of adding up (the
//! blades of a large run live in DRAM, not in the caches). When 8 or more
//! batches were staged since the last poll, the newest 2 wait for the next
//! one (a batch waits at most once): their prefetches were issued just
//! before the poll and would not have landed. With no
//! contention this path takes no lock, allocates nothing once warm and
//! makes no syscall.
//!
//! QPs follow the transport's [`crate::smart::QpPlan`]: a QP of its
//! own per blade, or a QP shared with other threads (`shared`,
//! `multiplexed:K`) behind a lock, executed by whichever of its threads
//! polls. Every post rings the QP's emulated doorbell (see
//! `softnic`).
//!
//! **Chaos mode** ([`ChaosConfig`]) exists for tests: multi-line READs and
//! WRITEs are copied one 8-byte word at a time with random pauses between
//! cache lines (READs sometimes top-down), so concurrent writers really tear
//! what readers see; completions are randomly delayed to later polls; and QPs
//! are served in random order, so completions of different QPs are reordered
//! (never within one QP).

use std::collections::VecDeque;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::softnic::{self, QpRef, SoftNic, SoftPort};
use super::{validate_batch, BladeInfo, Endpoint, LocalMem, ThreadSpec, Transport};
use crate::layout;
use crate::region::{LinePacer, NoPause, Region};
use crate::smart::QpPlan;
use crate::verbs::{Completion, Opcode, WcStatus, WorkRequest};
use crate::{Error, Result};

/// Parameters of chaos mode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChaosConfig {
    /// Seed of the per-thread random generators (thread i uses seed ^ i).
    pub seed: u64,
    /// Upper bound of the spin pause between two cache lines, in spin-loop
    /// iterations.
    pub max_line_pause: u32,
    /// Probability of yielding the OS thread between two cache lines.
    pub yield_prob: f64,
    /// Probability that a QP's pending batches are left for a later poll.
    pub delay_prob: f64,
    /// CAS and FAA as some RNICs execute them: read, pause, write back,
    /// under a lock that WRITEs do not take, the write back even when a
    /// CAS's compare fails (Soft-RoCE's rxe in Linux 6.1). Atomics stay
    /// atomic with respect to each other, but a WRITE to the word that
    /// lands meanwhile is lost. Off by default.
    pub write_back_atomics: bool,
}

impl ChaosConfig {
    /// Defaults that tear often yet keep tests fast.
    pub fn new(seed: u64) -> Self {
        ChaosConfig { seed, max_line_pause: 200, yield_prob: 0.05, delay_prob: 0.3, write_back_atomics: false }
    }
}

/// Memory blades in this process.
#[derive(Debug)]
pub struct EmbeddedTransport {
    regions: Vec<Arc<Region>>,
    infos: Vec<BladeInfo>,
    chaos: Option<ChaosConfig>,
    nic: Arc<SoftNic<Qp>>,
}

impl EmbeddedTransport {
    /// `blades` anonymous blades of `size` bytes each, formatted.
    ///
    /// # Errors
    /// If mapping fails or `size` cannot hold a superblock.
    pub fn new(blades: usize, size: u64) -> Result<Self> {
        let regions = (0..blades)
            .map(|b| {
                Region::anonymous(size)
                    .map(Arc::new)
                    .map_err(|e| Error::Io { peer: format!("{b} (embedded)"), cause: e })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::from_regions(regions)
    }

    /// Serves existing regions (formatting any that are zero).
    ///
    /// # Errors
    /// If a region holds a foreign or mismatched superblock.
    pub fn from_regions(regions: Vec<Arc<Region>>) -> Result<Self> {
        if regions.is_empty() || regions.len() > crate::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!("{} blades: need 1 to {}", regions.len(), crate::addr::MAX_BLADES)));
        }
        let mut infos = Vec::with_capacity(regions.len());
        for (i, r) in regions.iter().enumerate() {
            layout::format_or_check(r).map_err(|source| Error::Layout { blade: i as u16, cause: source })?;
            infos.push(BladeInfo { size: r.len(), rkey: rand::random::<u32>() | 1 });
        }
        let nic = Arc::new(SoftNic::new(regions.len()));
        Ok(EmbeddedTransport { regions, infos, chaos: None, nic })
    }

    /// Turns chaos mode on for every endpoint opened afterwards.
    pub fn with_chaos(mut self, chaos: ChaosConfig) -> Self {
        self.chaos = Some(chaos);
        self
    }

    /// The region of blade `i` (for local inspection in tests and loaders).
    pub fn region(&self, i: usize) -> &Arc<Region> {
        &self.regions[i]
    }

    fn new_qp(&self, blade: usize) -> Qp {
        Qp {
            region: self.regions[blade].clone(),
            info: self.infos[blade],
            sq: VecDeque::new(),
            batches: VecDeque::new(),
            error: false,
        }
    }
}

impl Transport for EmbeddedTransport {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn blades(&self) -> &[BladeInfo] {
        &self.infos
    }

    fn configure(&self, plan: QpPlan) -> Result<()> {
        self.nic.configure(plan);
        Ok(())
    }

    fn doorbell_rings(&self) -> Vec<u64> {
        self.nic.doorbell_rings()
    }

    fn open_thread(&self, thread: usize, spec: ThreadSpec) -> Result<Box<dyn Endpoint>> {
        let local_bytes = spec.local_bytes;
        let port = SoftPort::open(&self.nic, thread, local_bytes, |b| Ok(self.new_qp(b)))?;
        let chaos = self.chaos.map(|cfg| Chaos {
            cfg,
            rng: SmallRng::seed_from_u64(cfg.seed ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        });
        Ok(Box::new(EmbeddedEndpoint {
            port,
            chaos,
            order: Vec::new(),
            staged: Vec::with_capacity(local_bytes / 64),
            staged_wrs: Vec::with_capacity(local_bytes / 64),
            carried: 0,
        }))
    }
}

/// Staged batches new since the last poll from which a poll leaves the
/// newest [`HOLD`] for the next one.
const HOLD_FROM: usize = 8;
/// See [`HOLD_FROM`].
const HOLD: usize = 2;

/// A send queue and its execution state (one RC QP to one blade).
#[derive(Debug)]
pub(crate) struct Qp {
    region: Arc<Region>,
    info: BladeInfo,
    /// The send queue: WRs of posted batches, in order.
    sq: VecDeque<WorkRequest>,
    /// (wr_id, WR count, posting endpoint) of each posted batch, in order.
    batches: VecDeque<(u64, u16, usize)>,
    error: bool,
}

#[derive(Debug)]
struct Chaos {
    cfg: ChaosConfig,
    rng: SmallRng,
}

impl LinePacer for Chaos {
    fn between_lines(&mut self) {
        let spins = self.rng.random_range(0..=self.cfg.max_line_pause);
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        if self.rng.random_bool(self.cfg.yield_prob) {
            std::thread::yield_now();
        }
    }

    fn reverse_read(&mut self) -> bool {
        self.rng.random_bool(0.5)
    }

    fn write_back_atomics(&self) -> bool {
        self.cfg.write_back_atomics
    }
}

/// One thread's endpoint on the embedded blades.
#[derive(Debug)]
struct EmbeddedEndpoint {
    port: SoftPort<Qp>,
    chaos: Option<Chaos>,
    order: Vec<usize>,
    /// Batches posted to QPs of this thread's own, in posting order, for the
    /// next poll to execute: (QP, wr_id, WR count); a QP with one is busy
    /// for `reset_qp`.
    staged: Vec<(u16, u64, u16)>,
    /// Their WRs, in the same order.
    staged_wrs: Vec<WorkRequest>,
    /// Staged batches the last poll left for this one.
    carried: usize,
}

impl Qp {
    #[inline]
    fn push(&mut self, wr_id: u64, wrs: &[WorkRequest], owner: usize) {
        // One WR at a time: cheaper than `extend` for the usual 1-3 WRs.
        for wr in wrs {
            self.sq.push_back(*wr);
        }
        self.batches.push_back((wr_id, wrs.len() as u16, owner));
    }

    /// Executes the next queued batch with `local` as its poster's memory.
    fn run_batch(&mut self, local: &LocalMem, pacer: &mut impl LinePacer) -> Option<Completion> {
        let (wr_id, n, _) = self.batches.pop_front()?;
        let mut status = Ok(());
        for i in 0..n {
            let wr = self.sq.pop_front().expect("send queue holds every posted WR");
            if status.is_ok() {
                status = self.execute_one(&wr, i, local, pacer);
            }
        }
        Some(Completion { wr_id, status })
    }

    /// Hints the CPU to fetch the remote lines `wrs` will touch.
    #[inline]
    fn prefetch(&self, wrs: &[WorkRequest]) {
        for wr in wrs {
            if wr.rkey == self.info.rkey {
                self.region.prefetch(wr.remote.offset(), u64::from(wr.len));
            }
        }
    }

    /// Executes a staged batch (the fast path of an unshared QP without
    /// chaos: nothing else can be queued on it).
    #[inline]
    fn run_now(&mut self, wr_id: u64, wrs: &[WorkRequest], local: &LocalMem) -> Completion {
        debug_assert!(self.batches.is_empty());
        let mut status = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            status = self.execute_one(wr, i as u16, local, &mut NoPause);
            if status.is_err() {
                break;
            }
        }
        Completion { wr_id, status }
    }

    /// Executes WR number `i` of a batch, or flushes it if the QP is in the
    /// error state; a failure puts the QP in the error state.
    #[inline]
    fn execute_one(
        &mut self,
        wr: &WorkRequest,
        i: u16,
        local: &LocalMem,
        pacer: &mut impl LinePacer,
    ) -> Result<(), (WcStatus, u16)> {
        let r =
            if self.error { Err(WcStatus::Flushed) } else { execute(&self.region, self.info.rkey, wr, local, pacer) };
        r.map_err(|s| {
            self.error = true;
            (s, i)
        })
    }

    /// Runs queued batches (all, or until chaos delays the rest), handing
    /// each completion to its poster: `me` gets it in `out`, others through
    /// their inbox.
    fn run(
        &mut self,
        me: usize,
        local: &LocalMem,
        nic: &SoftNic<Qp>,
        out: &mut Vec<Completion>,
        chaos: &mut Option<Chaos>,
    ) {
        while let Some(&(_, _, owner)) = self.batches.front() {
            if let Some(c) = chaos.as_mut() {
                if c.rng.random_bool(c.cfg.delay_prob) {
                    return;
                }
            }
            if owner == me {
                let c = match chaos {
                    Some(ch) => self.run_batch(local, ch),
                    None => self.run_batch(local, &mut NoPause),
                };
                out.extend(c);
            } else {
                nic.with_endpoint(owner, |theirs, inbox| {
                    let c = match chaos {
                        Some(ch) => self.run_batch(theirs, ch),
                        None => self.run_batch(theirs, &mut NoPause),
                    };
                    softnic::lock(inbox).extend(c);
                });
            }
        }
    }
}
/// Executes one WR against a region, with `local` as the local side.
fn execute(
    region: &Region,
    rkey: u32,
    wr: &WorkRequest,
    local: &LocalMem,
    pacer: &mut impl LinePacer,
) -> Result<(), WcStatus> {
    if wr.rkey != rkey {
        return Err(WcStatus::RemoteAccess);
    }
    let off = wr.remote.offset();
    match wr.op {
        Opcode::Read => {
            region.check(off, u64::from(wr.len))?;
            // SAFETY: the range was validated at post and belongs to the
            // in-flight batch's slot, which nobody else touches until this
            // completion is delivered.
            let dst = unsafe { local.bytes_mut(wr.local_off, wr.len) };
            region.read_into(off, dst, pacer);
        }
        Opcode::Write => {
            region.check(off, u64::from(wr.len))?;
            // SAFETY: as above; the slot's bytes are not written while in flight.
            let src = unsafe { local.bytes(wr.local_off, wr.len) };
            region.write_from(off, src, pacer);
        }
        Opcode::Cas | Opcode::Faa => {
            if wr.len != 8 {
                return Err(WcStatus::RemoteInvalidRequest);
            }
            let old = if pacer.write_back_atomics() {
                region.write_back_atomic(off, wr.op == Opcode::Cas, wr.compare_add, wr.swap, pacer)?
            } else if wr.op == Opcode::Cas {
                region.cas(off, wr.compare_add, wr.swap)?
            } else {
                region.faa(off, wr.compare_add)?
            };
            // SAFETY: as above.
            unsafe { local.bytes_mut(wr.local_off, 8) }.copy_from_slice(&old.to_ne_bytes());
        }
    }
    Ok(())
}

impl Endpoint for EmbeddedEndpoint {
    fn local(&self) -> &Arc<LocalMem> {
        &self.port.local
    }

    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()> {
        let b = qp as usize;
        if b >= self.port.qps.len() {
            return Err(Error::NoSuchBlade(qp, self.port.qps.len()));
        }
        validate_batch(&self.port.local, qp, wrs)?;
        if self.chaos.is_none() && self.port.qps[b].is_own() {
            // Nobody else posts to this QP and nothing is queued on it: the
            // batch is staged for the next poll, and its remote lines are
            // on their way meanwhile.
            // (The staging list is the thread's own: the doorbell's lock,
            // when it has one, is taken for the ring alone.)
            let SoftPort { qps, doorbells, bindings, .. } = &mut self.port;
            if let QpRef::Own(q) = &qps[b] {
                q.prefetch(wrs);
            }
            // One WR at a time: cheaper than a copy call for the usual 1-3.
            for wr in wrs {
                self.staged_wrs.push(*wr);
            }
            self.staged.push((qp, wr_id, wrs.len() as u16));
            doorbells[b].ring(bindings[b].doorbell_shared, true, || ());
            return Ok(());
        }
        let me = self.port.id;
        self.port.ring(b, |q| q.push(wr_id, wrs, me));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        if !self.staged.is_empty() {
            let SoftPort { local, qps, .. } = &mut self.port;
            // The newest batches of a full round wait for the next poll, so
            // that the lines their doorbells prefetched arrive meanwhile; a
            // batch waits at most once.
            let fresh = self.staged.len() - self.carried;
            let hold = if fresh >= HOLD_FROM { HOLD } else { 0 };
            let run = self.staged.len() - hold;
            let mut first = 0;
            out.extend(self.staged[..run].iter().map(|&(qp, wr_id, n)| {
                let wrs = &self.staged_wrs[first..first + n as usize];
                first += n as usize;
                qps[qp as usize].with(|q| q.run_now(wr_id, wrs, local))
            }));
            self.staged.drain(..run);
            self.staged_wrs.drain(..first);
            self.carried = hold;
        }
        if self.chaos.is_none() && !self.port.uses_inbox {
            // Every QP is the thread's own and, without chaos, only ever
            // holds staged batches: no send queue to serve, no inbox.
            return out.len() - before;
        }
        let n = self.port.qps.len();
        if let Some(chaos) = &mut self.chaos {
            self.order.clear();
            self.order.extend(0..n);
            for i in (1..n).rev() {
                let j = chaos.rng.random_range(0..=i);
                self.order.swap(i, j);
            }
        }
        let SoftPort { id, local, nic, qps, .. } = &mut self.port;
        for k in 0..n {
            let i = if self.chaos.is_some() { self.order[k] } else { k };
            qps[i].try_with(|q| q.run(*id, local, nic, out, &mut self.chaos));
        }
        self.port.finish_poll(out, before);
        out.len() - before
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        let q = self.port.qps.get_mut(qp as usize).ok_or(Error::NoSuchBlade(qp, self.port.bindings.len()))?;
        let undelivered = self.staged.iter().any(|&(q, ..)| q == qp);
        q.with(|q| {
            if !q.batches.is_empty() || undelivered {
                return Err(Error::QpBusy(qp));
            }
            q.error = false;
            Ok(())
        })
    }

    fn revoke(&mut self, _tag: u64) -> Result<crate::Fencing> {
        Ok(crate::Fencing::NotEnforced(
            "the embedded backend's blades live in the compute process: a compute blade that stops, stops its verbs",
        ))
    }
}
