//! A simulated thread's endpoint: the runtime's view of the simulation.
//!
//! Posting charges the thread's virtual clock for the CPU the post costs
//! (and the doorbell lock it waits for), and hands the WRs to the world.
//! Polling first runs the events due by the thread's time, then takes its
//! completions, charging the poll. On its own (a runtime in `block_on`, not
//! driven with others) an endpoint that has nothing to do jumps its clock to
//! the next event: the simulation advances as that one thread waits.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use smart_core::backend::{validate_batch, Endpoint, LocalMem};
use smart_core::clock::{Clock, VirtualTime};
use smart_core::{Completion, Error, Fencing, Result, WorkRequest};

use crate::world::World;

/// The world, locked, or lent by the driver that holds its lock.
pub(crate) enum WorldRef<'a> {
    /// Locked here.
    Locked(MutexGuard<'a, World>),
    /// Lent for the round the driver runs on this OS thread (see [`lend`]).
    Lent(&'a mut World),
}

impl Deref for WorldRef<'_> {
    type Target = World;
    fn deref(&self) -> &World {
        match self {
            WorldRef::Locked(g) => g,
            WorldRef::Lent(w) => w,
        }
    }
}

impl DerefMut for WorldRef<'_> {
    fn deref_mut(&mut self) -> &mut World {
        match self {
            WorldRef::Locked(g) => g,
            WorldRef::Lent(w) => w,
        }
    }
}

impl Drop for WorldRef<'_> {
    fn drop(&mut self) {
        if let WorldRef::Lent(_) = self {
            LENT.with(|l| l.in_use.set(false));
        }
    }
}

/// What the driver lends while a simulated thread's round runs: the world
/// it holds locked, so that the thread's endpoint reaches it without
/// locking again (two atomic operations per post and per poll, a tenth of
/// the simulator's time at 96 threads).
struct Lent {
    mutex: Cell<*const Mutex<World>>,
    world: Cell<*mut World>,
    in_use: Cell<bool>,
}

thread_local! {
    static LENT: Lent = const {
        Lent { mutex: Cell::new(std::ptr::null()), world: Cell::new(std::ptr::null_mut()), in_use: Cell::new(false) }
    };
}

/// Runs `f` with `guard`'s world lent to [`lock`] calls for `mutex` on this
/// OS thread. `guard` must be the lock of `mutex`; the world is not touched
/// through it while `f` runs.
pub(crate) fn lend<R>(mutex: &Mutex<World>, guard: &mut MutexGuard<'_, World>, f: impl FnOnce() -> R) -> R {
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            LENT.with(|l| {
                l.mutex.set(std::ptr::null());
                l.world.set(std::ptr::null_mut());
                l.in_use.set(false);
            });
        }
    }
    let world: *mut World = &mut **guard;
    LENT.with(|l| {
        assert!(l.mutex.get().is_null(), "the world is lent once at a time");
        l.mutex.set(mutex);
        l.world.set(world);
    });
    let _clear = Clear;
    f()
}

/// The world of `w`: lent by the driver running this round on this OS
/// thread, else locked.
pub(crate) fn lock(w: &Mutex<World>) -> WorldRef<'_> {
    let lent = LENT.with(|l| {
        if !std::ptr::eq(l.mutex.get(), w) {
            return None;
        }
        assert!(!l.in_use.replace(true), "the lent world is borrowed twice");
        Some(l.world.get())
    });
    match lent {
        // SAFETY: the driver holds `w`'s lock for as long as the world is
        // lent and does not touch it meanwhile; `in_use` makes this the
        // only reference to it until the WorldRef drops.
        Some(p) => WorldRef::Lent(unsafe { &mut *p }),
        // A panic while the world was locked (a bug in a model) poisons it;
        // the simulation is over then, but reports keep the first panic.
        None => WorldRef::Locked(w.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
    }
}

/// One simulated thread's endpoint.
#[derive(Debug)]
pub(crate) struct SimEndpoint {
    pub(crate) world: Arc<Mutex<World>>,
    pub(crate) id: u32,
    pub(crate) local: Arc<LocalMem>,
    pub(crate) clock: Arc<VirtualTime>,
    pub(crate) blades: usize,
}

impl Endpoint for SimEndpoint {
    fn local(&self) -> &Arc<LocalMem> {
        &self.local
    }

    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()> {
        if qp as usize >= self.blades {
            return Err(Error::NoSuchBlade(qp, self.blades));
        }
        validate_batch(&self.local, qp, wrs)?;
        lock(&self.world).post(self.id, qp, wr_id, wrs);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut w = lock(&self.world);
        w.run_until(self.clock.get());
        let p = &w.p.cpu;
        let (poll_ns, cqe_ns) = (p.poll_ns, p.cqe_ns);
        let cq = &mut w.eps[self.id as usize].cq;
        let n = cq.len();
        out.extend(cq.drain(..));
        self.clock.advance(poll_ns + cqe_ns * n as u64);
        n
    }

    fn idle(&mut self) {
        // Only a runtime on its own gets here (a driver never lets a round
        // idle twice): let virtual time pass to the next event.
        let mut w = lock(&self.world);
        if let Some(at) = w.next_event() {
            if at > self.clock.get() {
                self.clock.set(at);
            }
            w.run_until(at);
        }
    }

    fn clock(&self) -> Option<Clock> {
        Some(Clock::virtual_time(self.clock.clone()))
    }

    fn preempts(&self) -> bool {
        true
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        if qp as usize >= self.blades {
            return Err(Error::NoSuchBlade(qp, self.blades));
        }
        if lock(&self.world).reset_qp(self.id, qp) {
            Ok(())
        } else {
            Err(Error::QpBusy(qp))
        }
    }

    fn revoke(&mut self, tag: u64) -> Result<Fencing> {
        if tag == 0 {
            return Err(Error::Unsupported("fence tag 0 names nobody".into()));
        }
        lock(&self.world).revoke(tag);
        Ok(Fencing::Enforced(self.blades))
    }
}

impl Drop for SimEndpoint {
    fn drop(&mut self) {
        // Completions still due are dropped on arrival; the WRs still execute,
        // as an RNIC's would after the thread died.
        let mut w = lock(&self.world);
        let e = &mut w.eps[self.id as usize];
        e.closed = true;
        e.driver = None;
        e.cq.clear();
    }
}
