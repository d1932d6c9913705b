//! The simulated cluster: memory blades' regions, compute blades' NICs,
//! the links between them, and the event queue that carries every work
//! request from its post to its completion in virtual time.
//!
//! A post computes, at once, the whole path of each of its WRs through the
//! components (doorbell lock, NIC engine and WQE cache, uplink, switch,
//! downlink, responder engine and PCIe or atomics unit, and back), and
//! schedules two kinds of events: each WR's *execution* at the memory blade
//! (where it reads or changes memory, byte for byte, in event order) and
//! the batch's *completion* at the compute blade. Events run in time order
//! (ties in the order the queue keeps, itself deterministic), so a run is
//! deterministic.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use smart_core::backend::LocalMem;
use smart_core::clock::VirtualTime;
use smart_core::region::Region;
use smart_core::smart::{QpBinding, QpPlan, QpPolicy};
use smart_core::{Completion, Opcode, WcStatus, WorkRequest};

use crate::model::{Atomics, Engines, Link, SpinLock, WqeCache};
use crate::profile::Profile;
use crate::queue::TimeQueue;

/// A simulated thread's endpoint, as the world sees it.
#[derive(Debug)]
pub(crate) struct Ep {
    pub(crate) clock: Arc<VirtualTime>,
    pub(crate) local: Arc<LocalMem>,
    /// The thread's index within its compute blade.
    pub(crate) thread: usize,
    pub(crate) cblade: usize,
    pub(crate) fence_tag: u64,
    /// Completions delivered and not yet polled.
    pub(crate) cq: VecDeque<Completion>,
    /// Per memory blade: where this thread posts.
    pub(crate) bindings: Vec<QpBinding>,
    /// Batches posted and not completed, per memory blade.
    pub(crate) in_flight: Vec<u32>,
    /// The runtime a driver runs on this endpoint (its index in the
    /// driver's slice), while one does.
    pub(crate) driver: Option<u32>,
    pub(crate) closed: bool,
}

/// A QP's ordering and error state.
#[derive(Debug, Default, Clone, Copy)]
struct QpState {
    last_exec: u64,
    last_done: u64,
    error: bool,
}

/// A compute blade's RNIC and its doorbells.
#[derive(Debug)]
struct ComputeNic {
    plan: QpPlan,
    engines: Engines,
    cache: WqeCache,
    tx: Link,
    rx: Link,
    doorbell_locks: Vec<SpinLock>,
    qp_locks: Vec<SpinLock>,
    qps: Vec<QpState>,
}

/// A memory blade's RNIC and DMA path.
#[derive(Debug)]
struct MemNic {
    engines: Engines,
    pcie: Link,
    rx: Link,
    tx: Link,
    atomics: Atomics,
}

/// A batch between its post and its completion.
#[derive(Debug)]
struct BatchRec {
    ep: u32,
    qp: u32,
    blade: u16,
    wr_id: u64,
    wrs: u16,
    /// WRs that reached memory.
    executed: u16,
    /// Bit i: WR i's first part executed, so its packet is at the memory
    /// blade and the rest of its DMA completes whatever happens to the QP,
    /// the compute blade or the blade's availability meanwhile.
    begun: u32,
    status: Result<(), (WcStatus, u16)>,
}

#[derive(Debug)]
enum Kind {
    /// WR `index` of `batch` reaches memory: all of it, or (a READ or
    /// WRITE over several cache lines) its first `split` bytes (`first`)
    /// or the rest.
    Exec { batch: u32, index: u16, wr: WorkRequest, split: u32, first: bool },
    /// `batch`'s completion reaches its thread's CQ.
    Done { batch: u32 },
}

/// What the simulation counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Events run.
    pub events: u64,
    /// WRs posted.
    pub verbs: u64,
    /// Doorbells (batches) posted.
    pub doorbells: u64,
    /// Posts that waited for a doorbell or QP lock.
    pub lock_waits: u64,
    /// WQE cache misses (in WRs, rounded down).
    pub wqe_misses: u64,
}

/// Everything simulated.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) p: Profile,
    /// The latest virtual time anything reached (ns).
    pub(crate) now: u64,
    /// Events by time; the values say where their kinds are kept.
    events: TimeQueue<u32>,
    /// The kinds of the events queued, by the key's index.
    kinds: Vec<Option<Kind>>,
    free_kinds: Vec<u32>,
    pub(crate) regions: Vec<Arc<Region>>,
    pub(crate) rkeys: Vec<u32>,
    pub(crate) eps: Vec<Ep>,
    cnics: Vec<ComputeNic>,
    mnics: Vec<MemNic>,
    batches: Vec<Option<BatchRec>>,
    free_batches: Vec<u32>,
    pub(crate) threads_per_blade: usize,
    revoked: BTreeSet<u64>,
    pub(crate) counters: SimCounters,
    /// Endpoints (by their driver's index) that received completions since
    /// the driver last looked, and when.
    pub(crate) woken: Vec<(u32, u64)>,
    /// Extra application work per doorbell on top of the profile's (ns).
    pub(crate) app_ns: u64,
    /// Per memory blade: when it is down (from, until), a fault.
    pub(crate) blade_down: Vec<(u64, u64)>,
    /// Per memory blade, a stall window: requests arriving in it wait to its end.
    pub(crate) blade_stall: Vec<(u64, u64)>,
}

impl World {
    pub(crate) fn new(
        p: Profile,
        regions: Vec<Arc<Region>>,
        rkeys: Vec<u32>,
        compute_blades: usize,
        threads_per_blade: usize,
    ) -> World {
        let blades = regions.len();
        let plan = QpPlan::new(QpPolicy::PerThreadQp, threads_per_blade.max(1), blades, Default::default());
        let cnics = (0..compute_blades.max(1)).map(|_| Self::compute_nic(&p, plan)).collect();
        let mnics = (0..blades)
            .map(|_| MemNic {
                engines: Engines::new(p.memory.engines),
                pcie: Link::new(p.memory.pcie_gbps),
                rx: Link::new(p.network.bandwidth_gbps),
                tx: Link::new(p.network.bandwidth_gbps),
                atomics: Atomics::new(p.memory.atomic_slots),
            })
            .collect();
        World {
            p,
            now: 0,
            events: TimeQueue::new(),
            kinds: Vec::with_capacity(4096),
            free_kinds: Vec::new(),
            regions,
            rkeys,
            eps: Vec::new(),
            cnics,
            mnics,
            batches: Vec::new(),
            free_batches: Vec::new(),
            threads_per_blade: threads_per_blade.max(1),
            revoked: BTreeSet::new(),
            counters: SimCounters::default(),
            woken: Vec::new(),
            app_ns: 0,
            blade_down: vec![(0, 0); blades],
            blade_stall: vec![(0, 0); blades],
        }
    }

    fn compute_nic(p: &Profile, plan: QpPlan) -> ComputeNic {
        ComputeNic {
            plan,
            engines: Engines::new(p.nic.engines),
            cache: WqeCache::new(p.nic.cache_wrs, p.nic.miss_ns),
            tx: Link::new(p.network.bandwidth_gbps),
            rx: Link::new(p.network.bandwidth_gbps),
            doorbell_locks: (0..plan.doorbells_used().max(1)).map(|_| SpinLock::default()).collect(),
            qp_locks: (0..plan.qps()).map(|_| SpinLock::default()).collect(),
            qps: vec![QpState::default(); plan.qps()],
        }
    }

    /// Sets every compute blade's QP plan (for its own threads) before the
    /// threads open their endpoints.
    pub(crate) fn configure(&mut self, plan: QpPlan) {
        let plan = QpPlan::new(plan.policy, self.threads_per_blade, self.regions.len(), plan.doorbells);
        for c in &mut self.cnics {
            if c.plan != plan {
                *c = Self::compute_nic(&self.p, plan);
            }
        }
    }

    /// A new endpoint for thread `thread` (global index: compute blade
    /// `thread / threads_per_blade`); its clock starts at the world's now.
    pub(crate) fn open(&mut self, thread: usize, local: Arc<LocalMem>, fence_tag: u64) -> u32 {
        let cblade = (thread / self.threads_per_blade).min(self.cnics.len() - 1);
        let t = thread % self.threads_per_blade;
        let plan = self.cnics[cblade].plan;
        let bindings = (0..self.regions.len()).map(|b| plan.binding(t % plan.threads, b)).collect();
        self.eps.push(Ep {
            clock: VirtualTime::with_id(self.now, self.eps.len() as u64),
            local,
            thread: t,
            cblade,
            fence_tag,
            cq: VecDeque::new(),
            bindings,
            in_flight: vec![0; self.regions.len()],
            driver: None,
            closed: false,
        });
        (self.eps.len() - 1) as u32
    }

    fn push(&mut self, at: u64, kind: Kind) {
        // The time queue is monotone: nothing happens before what already ran.
        assert!(at >= self.now, "an event at {at} ns, before the world's now ({} ns)", self.now);
        let i = match self.free_kinds.pop() {
            Some(i) => {
                self.kinds[i as usize] = Some(kind);
                i
            }
            None => {
                self.kinds.push(Some(kind));
                (self.kinds.len() - 1) as u32
            }
        };
        self.events.push(at, i);
    }

    /// The time of the next event, if any.
    pub(crate) fn next_event(&mut self) -> Option<u64> {
        self.events.peek()
    }

    /// Runs every event due by `t`.
    pub(crate) fn run_until(&mut self, t: u64) {
        while self.events.peek().is_some_and(|at| at <= t) {
            self.run_next();
        }
        self.now = self.now.max(t);
    }

    /// Runs the next event.
    pub(crate) fn run_next(&mut self) {
        let Some((at, i)) = self.events.pop() else { return };
        let kind = self.kinds[i as usize].take().expect("a queued event's kind");
        self.free_kinds.push(i);
        self.now = self.now.max(at);
        self.counters.events += 1;
        match kind {
            Kind::Exec { batch, index, wr, split, first } => self.execute(batch, index, &wr, split, first),
            Kind::Done { batch } => self.complete(batch),
        }
    }

    fn new_batch(&mut self, rec: BatchRec) -> u32 {
        match self.free_batches.pop() {
            Some(i) => {
                self.batches[i as usize] = Some(rec);
                i
            }
            None => {
                self.batches.push(Some(rec));
                (self.batches.len() - 1) as u32
            }
        }
    }

    /// Posts a batch of endpoint `ep` to memory blade `blade` at the
    /// endpoint's time; advances its clock by the CPU the post costs.
    pub(crate) fn post(&mut self, ep: u32, blade: u16, wr_id: u64, wrs: &[WorkRequest]) {
        let e = &self.eps[ep as usize];
        let (cb, bind, owner) = (e.cblade, e.bindings[blade as usize], e.thread as u32);
        let n = wrs.len() as u64;
        let qp = bind.qp as u32;
        let batch =
            self.new_batch(BatchRec { ep, qp, blade, wr_id, wrs: n as u16, executed: 0, begun: 0, status: Ok(()) });
        let p = &self.p;
        let e = &self.eps[ep as usize];
        // A thread never acts before what the world already ran: one whose
        // clock fell behind (another runtime, alone, let virtual time pass
        // to its next event) catches up first.
        if e.clock.get() < self.now {
            e.clock.set(self.now);
        }
        let mut t = e.clock.get() + p.cpu.op_ns + self.app_ns + p.cpu.post_doorbell_ns + p.cpu.post_wr_ns * (n - 1);
        let nic = &mut self.cnics[cb];
        let before = t;
        if bind.qp_shared {
            t = nic.qp_locks[bind.qp].acquire(t, owner, &p.doorbell);
        } else if bind.doorbell_shared {
            t = nic.doorbell_locks[bind.doorbell].acquire(t, owner, &p.doorbell);
        }
        if t > before + p.doorbell.lock_ns + p.doorbell.line_transfer_ns {
            self.counters.lock_waits += 1;
        }
        self.eps[ep as usize].clock.set(t);
        self.eps[ep as usize].in_flight[blade as usize] += 1;
        self.counters.verbs += n;
        self.counters.doorbells += 1;
        let nic = &mut self.cnics[cb];
        if nic.qps[bind.qp].error {
            // An errored QP flushes what is posted to it, at once.
            let rec = self.batches[batch as usize].as_mut().expect("live batch");
            rec.status = Err((WcStatus::Flushed, 0));
            let done = t + p.nic.cqe_dma_ns;
            self.push(done, Kind::Done { batch });
            return;
        }
        nic.cache.outstanding += n;
        let miss = nic.cache.miss_cost();
        let service = p.nic.wqe_ns + miss;
        let start = nic.engines.reserve(t, service * n);
        let mem = &mut self.mnics[blade as usize];
        let net = &p.network;
        let packets = |bytes: u64| bytes.div_ceil(net.mtu_bytes).max(1);
        let mut done = 0;
        // (first part's instant, last part's instant, split) per WR.
        let mut execs = [(0u64, 0u64, 0u32); smart_core::runtime::MAX_BATCH];
        for (i, wr) in wrs.iter().enumerate() {
            let leave = start + service * (i as u64 + 1);
            let len = u64::from(wr.len);
            let (req, resp) = match wr.op {
                Opcode::Read => (net.header_bytes, len + packets(len) * net.header_bytes),
                Opcode::Write => (len + packets(len) * net.header_bytes, net.header_bytes),
                Opcode::Cas | Opcode::Faa => (net.header_bytes + 16, net.header_bytes + 8),
            };
            let mut arrive = nic.tx.send(leave, req) + net.latency_ns;
            let (stall_from, stall_until) = self.blade_stall[blade as usize];
            if (stall_from..stall_until).contains(&arrive) {
                arrive = stall_until;
            }
            let at_mem = mem.rx.send(arrive, req);
            let s = mem.engines.reserve(at_mem, p.memory.op_ns) + p.memory.op_ns;
            // The DMA moves a READ's or WRITE's cache lines in address
            // order over its transfer time: one spanning several lines
            // executes in two parts, the lines before a boundary (drawn
            // from the WR, deterministically) at the transfer's start and
            // the rest at its end, so that a concurrent WRITE can land in
            // between: a torn read, as RC allows (atomicity holds only
            // within an aligned 8-byte word, and here within a line).
            let split = split_at(wr, self.now);
            let (exec, last, ready) = match wr.op {
                Opcode::Read => {
                    let dma = mem.pcie.send(s, len);
                    let last = if split > 0 { dma.max(s + 1) } else { s };
                    (s, last, (s + p.memory.dma_read_ns).max(dma))
                }
                Opcode::Write => {
                    let dma = mem.pcie.send(s, len);
                    let first =
                        if split > 0 { dma.saturating_sub(p.memory.transfer_ns(len)).max(s).min(dma - 1) } else { dma };
                    (first, dma, dma)
                }
                Opcode::Cas | Opcode::Faa => {
                    let a = mem.atomics.hold(wr.remote.offset(), s, p.memory.atomic_ns);
                    let at = a + p.memory.atomic_ns / 2;
                    (at, at, a + p.memory.atomic_ns)
                }
            };
            // A QP executes its WRs in posting order.
            let q = &mut nic.qps[bind.qp];
            let shift = q.last_exec.saturating_sub(exec);
            let (exec, last) = (exec + shift, last + shift);
            q.last_exec = last;
            let back = mem.tx.send(ready.max(last), resp) + net.latency_ns;
            done = done.max(nic.rx.send(back, resp) + p.nic.cqe_dma_ns);
            execs[i] = (exec, last, split);
        }
        let q = &mut nic.qps[bind.qp];
        let done = done.max(q.last_done);
        q.last_done = done;
        self.counters.wqe_misses = self.cnics.iter().map(|c| c.cache.misses_milli / 1000).sum();
        for (i, wr) in wrs.iter().enumerate() {
            let (first, last, split) = execs[i];
            let index = i as u16;
            if split > 0 {
                self.push(first, Kind::Exec { batch, index, wr: *wr, split, first: true });
            }
            self.push(last, Kind::Exec { batch, index, wr: *wr, split, first: false });
        }
        self.push(done, Kind::Done { batch });
    }

    fn execute(&mut self, batch: u32, index: u16, wr: &WorkRequest, split: u32, first: bool) {
        let rec = self.batches[batch as usize].as_mut().expect("a WR's batch lives until its completion");
        // The rest of a WR whose packet reached the blade: its DMA completes.
        let begun_rest = !first && split > 0 && rec.begun & (1 << index) != 0;
        if rec.status.is_err() && !begun_rest {
            return; // flushed behind the WR that failed
        }
        let e = &self.eps[rec.ep as usize];
        let blade = rec.blade as usize;
        let (down_from, down_until) = self.blade_down[blade];
        // A blade lost (down for good) takes nothing more, not even the
        // rest of a WR whose packet had reached it: its memory is gone.
        let lost = down_until == u64::MAX && self.now >= down_from;
        let r = if lost {
            Err(WcStatus::Transport)
        } else if begun_rest {
            Ok(())
        } else if (down_from..down_until).contains(&self.now) {
            Err(WcStatus::Transport)
        } else if e.fence_tag != 0 && self.revoked.contains(&e.fence_tag) {
            Err(WcStatus::Fenced)
        } else {
            let part = match (split, first) {
                (0, _) => *wr,
                (n, true) => WorkRequest { len: n, ..*wr },
                (n, false) => WorkRequest {
                    len: wr.len - n,
                    local_off: wr.local_off + n,
                    remote: wr.remote.add(u64::from(n)),
                    ..*wr
                },
            };
            execute(&self.regions[blade], self.rkeys[blade], &part, &e.local)
        };
        let r = match (r, begun_rest) {
            (Ok(()), true) => {
                let rest = WorkRequest {
                    len: wr.len - split,
                    local_off: wr.local_off + split,
                    remote: wr.remote.add(u64::from(split)),
                    ..*wr
                };
                execute(&self.regions[blade], self.rkeys[blade], &rest, &e.local)
            }
            (r, _) => r,
        };
        match r {
            Ok(()) if first => rec.begun |= 1 << index,
            Ok(()) => {
                rec.executed += 1;
                // A failure recorded at this WR (the QP dropped, the blade
                // gone) came after its packet: it took effect.
                if let Err((_, at)) = &mut rec.status {
                    if *at == index {
                        *at += 1;
                    }
                }
            }
            Err(s) => {
                rec.status = Err((s, index));
                self.cnics[e.cblade].qps[rec.qp as usize].error = true;
            }
        }
    }

    fn complete(&mut self, batch: u32) {
        let rec = self.batches[batch as usize].take().expect("completed once");
        self.free_batches.push(batch);
        let e = &mut self.eps[rec.ep as usize];
        e.in_flight[rec.blade as usize] -= 1;
        let nic = &mut self.cnics[e.cblade];
        nic.cache.outstanding = nic.cache.outstanding.saturating_sub(u64::from(rec.wrs));
        if !e.closed {
            e.cq.push_back(Completion { wr_id: rec.wr_id, status: rec.status });
            if let Some(d) = e.driver {
                self.woken.push((d, self.now));
            }
        }
    }

    /// A compute blade dies: the WRs whose packets already reached a memory
    /// blade (their first part executed) complete there; nothing else runs.
    pub(crate) fn finish_begun(&mut self) {
        while let Some((at, i)) = self.events.pop() {
            if let Some(Kind::Exec { batch, index, wr, split, first: false }) = self.kinds[i as usize].take() {
                let begun = self.batches[batch as usize].as_ref().is_some_and(|r| r.begun & (1 << index) != 0);
                if split > 0 && begun {
                    self.now = self.now.max(at);
                    self.execute(batch, index, &wr, split, false);
                }
            }
        }
    }

    /// Whether endpoint `ep`'s QP to `blade` has nothing in flight.
    pub(crate) fn reset_qp(&mut self, ep: u32, blade: u16) -> bool {
        let e = &self.eps[ep as usize];
        if e.in_flight[blade as usize] > 0 {
            return false;
        }
        let qp = e.bindings[blade as usize].qp;
        self.cnics[e.cblade].qps[qp].error = false;
        true
    }

    /// Breaks endpoint `ep`'s QP to `blade` (a fault): its batches in flight
    /// fail at their first WR that had not reached memory, and the QP stays
    /// in the error state until reset.
    pub(crate) fn drop_qp(&mut self, ep: u32, blade: u16) {
        let e = &self.eps[ep as usize];
        let (cb, qp) = (e.cblade, e.bindings[blade as usize].qp as u32);
        self.cnics[cb].qps[qp as usize].error = true;
        let eps = &self.eps;
        for rec in self.batches.iter_mut().flatten() {
            if rec.qp == qp && eps[rec.ep as usize].cblade == cb && rec.blade == blade && rec.status.is_ok() {
                rec.status = Err((WcStatus::Transport, rec.executed));
            }
        }
    }

    /// The memory blades refuse owner `tag` from now on.
    pub(crate) fn revoke(&mut self, tag: u64) {
        self.revoked.insert(tag);
    }
}

/// Where a READ or WRITE over several 64-byte lines splits (bytes before a
/// line boundary, drawn from the WR and the time), or 0: the WR executes
/// at one instant (one line, or an atomic).
fn split_at(wr: &WorkRequest, now: u64) -> u32 {
    const LINE: u64 = 64;
    if !matches!(wr.op, Opcode::Read | Opcode::Write) || wr.len == 0 {
        return 0;
    }
    let (start, end) = (wr.remote.offset(), wr.remote.offset() + u64::from(wr.len));
    let (first_line, last_line) = (start / LINE, (end - 1) / LINE);
    if first_line == last_line {
        return 0;
    }
    let h = smart_core::hash::mix64(now ^ start.rotate_left(17) ^ u64::from(wr.len) << 40);
    let k = 1 + h % (last_line - first_line);
    ((first_line + k) * LINE - start) as u32
}

/// Executes one WR against a region, with `local` as the local side (as an
/// RNIC's responder and its DMA would, at the WR's execution instant).
fn execute(region: &Region, rkey: u32, wr: &WorkRequest, local: &LocalMem) -> Result<(), WcStatus> {
    if wr.rkey != rkey {
        return Err(WcStatus::RemoteAccess);
    }
    let off = wr.remote.offset();
    match wr.op {
        Opcode::Read => {
            region.check(off, u64::from(wr.len))?;
            // SAFETY: the range was validated at post and belongs to the
            // in-flight batch's slot, which nothing else touches until this
            // batch's completion is delivered.
            let dst = unsafe { local.bytes_mut(wr.local_off, wr.len) };
            region.read(off, dst)?;
        }
        Opcode::Write => {
            region.check(off, u64::from(wr.len))?;
            // SAFETY: as above; the slot's payload is not written while in flight.
            let src = unsafe { local.bytes(wr.local_off, wr.len) };
            region.write(off, src)?;
        }
        Opcode::Cas | Opcode::Faa => {
            if wr.len != 8 {
                return Err(WcStatus::RemoteInvalidRequest);
            }
            let old = if wr.op == Opcode::Cas {
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

#[cfg(test)]
mod tests {
    use super::*;
    use smart_core::smart::DoorbellConfig;
    use smart_core::GlobalAddr;

    fn world(p: Profile, threads: usize) -> World {
        let r = Arc::new(Region::anonymous(1 << 20).unwrap());
        smart_core::layout::format_or_check(&r).unwrap();
        World::new(p, vec![r], vec![7], 1, threads)
    }

    fn read(len: u32) -> WorkRequest {
        WorkRequest {
            op: Opcode::Read,
            local_off: 0,
            len,
            remote: GlobalAddr::new(0, 8192),
            rkey: 7,
            compare_add: 0,
            swap: 0,
        }
    }

    /// Runs every event; returns when each completion of endpoint `ep` arrived.
    fn completions(w: &mut World, ep: u32) -> Vec<u64> {
        let mut at = Vec::new();
        while let Some(t) = w.next_event() {
            w.run_next();
            let cq = &mut w.eps[ep as usize].cq;
            at.extend(std::iter::repeat_n(t, cq.len()));
            cq.clear();
        }
        at
    }

    #[test]
    fn a_lone_read_takes_the_sum_of_its_path() {
        let p = Profile::connectx6();
        let mut w = world(p.clone(), 1);
        let ep = w.open(0, LocalMem::new(4096).unwrap(), 0);
        w.post(ep, 0, 1, &[read(8)]);
        let (c, n, m) = (&p.cpu, &p.network, &p.memory);
        // CPU: the application's work, the post; the NIC engine; the request
        // (headers only) on two links and the wire; the responder's engine;
        // the DMA read; the response (8 bytes + headers) on two links and
        // the wire; the CQE.
        let ser = |bytes: u64| bytes * 40; // ps at 200 Gbit/s
        let posted = c.op_ns + c.post_doorbell_ns;
        assert_eq!(w.eps[ep as usize].clock.get(), posted, "the post's CPU is charged to the thread");
        let leave = posted + p.nic.wqe_ns;
        let at_mem = ((leave * 1000 + ser(n.header_bytes)).div_ceil(1000) + n.latency_ns) * 1000 + ser(n.header_bytes);
        let exec = at_mem.div_ceil(1000) + m.op_ns;
        let ready = exec + m.dma_read_ns;
        let resp = 8 + n.header_bytes;
        let back = (ready * 1000 + ser(resp)).div_ceil(1000) + n.latency_ns;
        let done = (back * 1000 + ser(resp)).div_ceil(1000) + p.nic.cqe_dma_ns;
        assert_eq!(completions(&mut w, ep), [done]);
        // About 2.4 µs: an RDMA READ's round trip on this class of hardware.
        assert!((2_000..3_000).contains(&done), "{done} ns");
    }

    /// A WRITE over several lines whose packet reached the blade completes
    /// there whatever happens next: its QP dropped, or its compute blade
    /// killed (never half a page left behind by a dead writer).
    #[test]
    fn a_write_that_reached_the_blade_completes_even_if_its_sender_fails() {
        for kill in [false, true] {
            let p = Profile::connectx6();
            let mut w = world(p, 1);
            let local = LocalMem::new(4096).unwrap();
            // SAFETY: nothing is in flight yet.
            unsafe { local.bytes_mut(0, 512) }.fill(0xab);
            let ep = w.open(0, local, 0);
            let write = WorkRequest { op: Opcode::Write, len: 512, ..read(512) };
            w.post(ep, 0, 1, &[write]);
            // Run events until the WRITE's first part is in memory.
            let on_blade = |w: &World| {
                let mut b = [0u8; 512];
                w.regions[0].read(8192, &mut b).unwrap();
                b.iter().filter(|&&x| x == 0xab).count()
            };
            while on_blade(&w) == 0 {
                w.run_next();
            }
            assert!(on_blade(&w) < 512, "the WRITE executes in two parts");
            if kill {
                w.finish_begun();
            } else {
                w.drop_qp(ep, 0);
                while w.next_event().is_some() {
                    w.run_next();
                }
                let c = w.eps[ep as usize].cq.pop_front().unwrap();
                assert_eq!(c.status, Err((WcStatus::Transport, 1)), "failed after the WRITE, which took effect");
            }
            assert_eq!(on_blade(&w), 512, "the whole WRITE landed (kill: {kill})");
        }
    }

    #[test]
    fn a_stalled_blade_holds_a_request_to_the_end_of_the_stall() {
        let p = Profile::connectx6();
        let lone = {
            let mut w = world(p.clone(), 1);
            let ep = w.open(0, LocalMem::new(4096).unwrap(), 0);
            w.post(ep, 0, 1, &[read(8)]);
            completions(&mut w, ep)[0]
        };
        let mut w = world(p.clone(), 1);
        let ep = w.open(0, LocalMem::new(4096).unwrap(), 0);
        w.blade_stall[0] = (0, 1_000_000);
        w.post(ep, 0, 1, &[read(8)]);
        let done = completions(&mut w, ep);
        // It arrives at the blade within the stall and waits for its end;
        // the rest of its path is the lone READ's after the blade.
        let arrive = lone - p.memory.op_ns - p.memory.dma_read_ns - 2 * p.network.latency_ns - p.nic.cqe_dma_ns;
        assert!(done[0] > 1_000_000 && done[0] < 1_000_000 + lone, "{done:?} (lone {lone}, arrival ~{arrive})");
    }

    #[test]
    fn threads_on_one_shared_doorbell_serialise_and_own_doorbells_do_not() {
        let p = Profile::connectx6();
        let d = &p.doorbell;
        for (policy, shared) in [(QpPolicy::PerThreadQp, true), (QpPolicy::PerThreadDb, false)] {
            let mut w = world(p.clone(), 4);
            // No low-latency doorbell, one medium one: every QP shares it.
            w.configure(QpPlan::new(policy, 4, 1, DoorbellConfig { low_latency: 0, medium: 1 }));
            let eps: Vec<u32> = (0..4).map(|t| w.open(t, LocalMem::new(4096).unwrap(), 0)).collect();
            for &e in &eps {
                w.post(e, 0, 1, &[read(8)]);
            }
            let cpu = p.cpu.op_ns + p.cpu.post_doorbell_ns;
            let after: Vec<u64> = eps.iter().map(|&e| w.eps[e as usize].clock.get()).collect();
            if shared {
                // Post i waits for the i before it, each holding the lock
                // lock_ns, + the line transfer, + a penalty per waiter.
                let mut end = cpu;
                for (i, &a) in after.iter().enumerate() {
                    let i = i as u64;
                    end += d.lock_ns + i * d.waiter_penalty_ns + if i > 0 { d.line_transfer_ns } else { 0 };
                    assert_eq!(a, end, "post {i}");
                }
            } else {
                assert_eq!(after, [cpu; 4], "a doorbell each: nobody waits");
            }
        }
    }

    #[test]
    fn outstanding_wrs_beyond_the_wqe_cache_miss_and_slow_the_engines() {
        let mut p = Profile::connectx6();
        p.nic.cache_wrs = 4;
        p.nic.engines = 1;
        // Slow enough that the engine, not the posting CPU, sets the pace.
        p.nic.wqe_ns = 2_000;
        let mut w = world(p.clone(), 1);
        let ep = w.open(0, LocalMem::new(4096).unwrap(), 0);
        // Eight batches in a row, none completed meanwhile: the fifth and
        // later ones find more outstanding WRs than the cache holds.
        for i in 0..8 {
            w.post(ep, 0, i, &[read(8)]);
        }
        let misses: u64 = w.cnics[0].cache.misses_milli;
        // Outstanding 5..8 over a capacity of 4: 1/5 + 2/6 + 3/7 + 4/8.
        let want = 1000 / 5 + 2000 / 6 + 3000 / 7 + 4000 / 8;
        assert_eq!(misses, want);
        let done = completions(&mut w, ep);
        // With one busy engine, completions come one service time apart,
        // and each WR past the fourth takes its expected miss time more.
        let gaps: Vec<u64> = done.windows(2).map(|x| x[1] - x[0]).collect();
        let (s, m) = (p.nic.wqe_ns, p.nic.miss_ns);
        assert_eq!(gaps, [s, s, s, s + m / 5, s + 2 * m / 6, s + 3 * m / 7, s + 4 * m / 8]);
    }

    #[test]
    fn atomics_on_one_word_serialise_at_the_responder() {
        let p = Profile::connectx6();
        let mut w = world(p.clone(), 8);
        w.configure(QpPlan::new(QpPolicy::PerThreadDb, 8, 1, DoorbellConfig::default()));
        let eps: Vec<u32> = (0..8).map(|t| w.open(t, LocalMem::new(4096).unwrap(), 0)).collect();
        let faa = WorkRequest { op: Opcode::Faa, len: 8, compare_add: 1, ..read(8) };
        for &e in &eps {
            w.post(e, 0, 1, &[faa]);
        }
        let mut all: Vec<u64> = Vec::new();
        while let Some(t) = w.next_event() {
            w.run_next();
            for &e in &eps {
                let cq = &mut w.eps[e as usize].cq;
                all.extend(std::iter::repeat_n(t, cq.len()));
                cq.clear();
            }
        }
        all.sort_unstable();
        // One after the other, atomic_ns apart, and the word counts them all.
        assert!(all.windows(2).all(|x| x[1] - x[0] == p.memory.atomic_ns), "{all:?}");
        assert_eq!(w.regions[0].load_u64(8192).unwrap(), 8);
    }
}
