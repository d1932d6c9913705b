//! The scheduler: runs many simulated threads' runtimes on one OS thread,
//! in virtual-time order.
//!
//! Each simulated thread is a real [`Runtime`] running the real application
//! code. The driver keeps every thread's next instant and the world's next
//! event in one order, ties broken by a fixed rule (events before threads,
//! then the lower thread index), and always does the earliest:
//!
//! * an event (a WR reaching memory, a completion reaching a CQ), which may
//!   wake an idle thread at that instant;
//! * one executor round of the earliest thread, which ends right after a
//!   coroutine posts (the endpoint preempts), so threads interleave at every
//!   post in time order; a thread that did work runs again at its new time,
//!   one that found nothing to do sleeps until a completion or its next
//!   timer.
//!
//! Background threads ([`Simulation::spawn_background`], e.g. a lease's
//! heartbeat) run beside the driven ones while any of those lives; they are
//! kept between drives in a thread-local list, so they belong to the OS
//! thread that spawned them.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smart_core::backend::BackgroundTask;
use smart_core::clock::Clock;
use smart_core::runtime::Round;
use smart_core::{Error, Result, Runtime, RuntimeConfig};

use crate::endpoint::{lend, lock, WorldRef};
use crate::queue::ThreadQueue;
use crate::{Fault, FaultKind, SimTransport};

/// A background simulated thread.
struct Background {
    /// The simulation it runs in (its world's address).
    sim: usize,
    id: u64,
    rt: Runtime,
}

thread_local! {
    static BACKGROUND: RefCell<Vec<Background>> = const { RefCell::new(Vec::new()) };
}

impl SimTransport {
    fn key(&self) -> usize {
        Arc::as_ptr(&self.world) as *const () as usize
    }

    pub(crate) fn spawn_bg(&self, thread: usize, cfg: RuntimeConfig, task: BackgroundTask) -> Result<u64> {
        let mut rt = Runtime::new(self, thread, cfg)?;
        let ctx = rt.ctx();
        rt.spawn(task(ctx));
        let id = self.next_background.fetch_add(1, Ordering::Relaxed);
        BACKGROUND.with(|b| b.borrow_mut().push(Background { sim: self.key(), id, rt }));
        Ok(id)
    }

    pub(crate) fn stop_bg(&self, id: u64) {
        let key = self.key();
        let gone = BACKGROUND.with(|b| {
            let mut b = b.borrow_mut();
            b.iter().position(|x| x.sim == key && x.id == id).map(|i| b.swap_remove(i))
        });
        drop(gone);
    }

    /// The next fault, if it is due by `next` (virtual ns): taken off the
    /// list, with its absolute instant.
    fn due_fault(&self, next: u64) -> Option<(u64, Fault)> {
        if self.next_fault.load(std::sync::atomic::Ordering::Relaxed) > next {
            return None;
        }
        let mut f = self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = f.1?;
        let at = start + f.0.last()?.at_ns;
        if at > next {
            return None;
        }
        let fault = f.0.pop().expect("a fault");
        let after = f.0.last().map_or(u64::MAX, |x| start + x.at_ns);
        self.next_fault.store(after, std::sync::atomic::Ordering::Relaxed);
        Some((at, fault))
    }

    pub(crate) fn drive_runtimes(&self, rts: &mut [Runtime], control: &mut dyn FnMut(u64) -> u64) -> Result<()> {
        let key = self.key();
        let mut bg: Vec<Background> = BACKGROUND.with(|b| {
            let mut b = b.borrow_mut();
            let (mine, others) = std::mem::take(&mut *b).into_iter().partition(|x| x.sim == key);
            *b = others;
            mine
        });
        let n = rts.len();
        let r = {
            let mut all: Vec<&mut Runtime> = rts.iter_mut().chain(bg.iter_mut().map(|b| &mut b.rt)).collect();
            self.drive_all(&mut all, n, control)
        };
        // Background threads that finished are dropped; the others wait for
        // the next drive.
        bg.retain(|b| b.rt.live_tasks() > 0);
        BACKGROUND.with(|b| b.borrow_mut().extend(bg));
        r
    }

    /// Drives `all` (the first `main` of them are the caller's; the rest run
    /// in the background) until the first `main` have no coroutine left.
    fn drive_all(&self, all: &mut [&mut Runtime], main: usize, control: &mut dyn FnMut(u64) -> u64) -> Result<()> {
        let n = all.len();
        let mut clocks = Vec::with_capacity(n);
        let mut ep_of = Vec::with_capacity(n);
        {
            let mut w = lock(&self.world);
            for (i, rt) in all.iter().enumerate() {
                let Clock::Virtual { time, .. } = rt.clock() else {
                    return Err(Error::Unsupported("a runtime not opened on this simulation".into()));
                };
                let e = w
                    .eps
                    .iter()
                    .position(|e| !e.closed && Arc::ptr_eq(&e.clock, time))
                    .ok_or_else(|| Error::Unsupported("a runtime not opened on this simulation".into()))?;
                w.eps[e].driver = Some(i as u32);
                clocks.push(time.clone());
                ep_of.push(e as u32);
            }
        }
        let start = (0..main).map(|i| clocks[i].get()).min().unwrap_or_else(|| lock(&self.world).now);
        for c in &clocks[main..] {
            // A background thread idle since the last drive resumes now.
            c.set(c.get().max(start));
        }
        // Each thread's next round, by (time, thread).
        let mut queue = ThreadQueue::new(n);
        let mut live = 0;
        for (i, rt) in all.iter().enumerate() {
            if rt.live_tasks() > 0 {
                live += usize::from(i < main);
                queue.set(i, clocks[i].get());
            }
        }
        let mut next_control = control(start);
        let mut woken = Vec::new();
        // The world stays locked but while a thread runs (its endpoint locks
        // it) and while the control runs: one lock per step.
        let mut w = lock(&self.world);
        // A thread that is still the earliest after its round, run again.
        let mut again: Option<(u64, usize)> = None;
        while live > 0 {
            let (t, i) = match again.take() {
                Some(x) => x,
                None => {
                    let next_thread = queue.peek().map(|(t, _)| t);
                    let next_event = w.next_event();
                    let next = match (next_thread, next_event) {
                        (Some(a), Some(b)) => a.min(b),
                        (a, b) => a.or(b).unwrap_or(u64::MAX),
                    };
                    if let Some((at, fault)) = self.due_fault(next) {
                        match fault.kind {
                            FaultKind::Kill => {
                                eprintln!(
                                    "smart-sim: fault {fault}: the compute blade dies at {:.6} s (virtual)",
                                    at as f64 / 1e9
                                );
                                w.now = w.now.max(at);
                                let now = w.now;
                                w.finish_begun();
                                for r in &w.regions {
                                    let _ = r.flush();
                                }
                                drop(w);
                                self.save_clock_at(now);
                                std::process::exit(137);
                            }
                            FaultKind::BladeDown { blade, down_ns } => {
                                if let Some(d) = w.blade_down.get_mut(blade as usize) {
                                    *d = (at, at + down_ns);
                                }
                            }
                            FaultKind::BladeLost { blade } => {
                                if let Some(d) = w.blade_down.get_mut(blade as usize) {
                                    *d = (at, u64::MAX);
                                    eprintln!(
                                        "smart-sim: fault {fault}: memory blade {blade} is lost at {:.6} s (virtual), \
                                         and its memory with it",
                                        at as f64 / 1e9
                                    );
                                    self.empty_blade_image(blade);
                                }
                            }
                            FaultKind::BladeStall { blade, pause_ns } => {
                                if let Some(d) = w.blade_stall.get_mut(blade as usize) {
                                    *d = (at, at + pause_ns);
                                }
                            }
                            FaultKind::Stall { thread, pause_ns } => {
                                if thread < main && all[thread].live_tasks() > 0 {
                                    let t = clocks[thread].get().max(at) + pause_ns;
                                    clocks[thread].set(t);
                                    if queue.at(thread).is_some() {
                                        queue.set(thread, t);
                                    }
                                }
                            }
                            FaultKind::DropQp { thread, blade } => {
                                if thread < main && (blade as usize) < w.regions.len() {
                                    w.drop_qp(ep_of[thread], blade);
                                }
                            }
                        }
                        continue;
                    }
                    if next_control != u64::MAX && next_control <= next {
                        drop(w);
                        next_control = control(next_control);
                        self.save_clock();
                        w = lock(&self.world);
                        continue;
                    }
                    if next == u64::MAX {
                        return Err(Error::Unsupported(format!(
                    "the simulation stalled: {live} simulated threads wait for a completion or a timer and none is due \
                     (a deadlock)"
                )));
                    }
                    if next_event.is_some_and(|e| e <= next_thread.unwrap_or(u64::MAX)) {
                        w.run_next();
                        std::mem::swap(&mut woken, &mut w.woken);
                        for (j, when) in woken.drain(..) {
                            let j = j as usize;
                            if j < n && queue.at(j).is_none_or(|a| a > when) && all[j].live_tasks() > 0 {
                                let t = clocks[j].get().max(when);
                                clocks[j].set(t);
                                queue.set(j, t);
                            }
                        }
                        continue;
                    }
                    queue.pop().expect("a thread is due")
                }
            };
            if clocks[i].get() < t {
                clocks[i].set(t);
            }
            let round = {
                let rt = &mut *all[i];
                match &mut w {
                    WorldRef::Locked(g) => lend(&self.world, g, || rt.sim_round()),
                    WorldRef::Lent(_) => rt.sim_round(),
                }
            };
            // Completions the round's poll delivered to other threads.
            std::mem::swap(&mut woken, &mut w.woken);
            for (j, when) in woken.drain(..) {
                let j = j as usize;
                if j != i && j < n && queue.at(j).is_none_or(|a| a > when) && all[j].live_tasks() > 0 {
                    let t = clocks[j].get().max(when);
                    clocks[j].set(t);
                    queue.set(j, t);
                }
            }
            if all[i].live_tasks() == 0 {
                live -= usize::from(i < main);
                continue;
            }
            let me = clocks[i].get();
            let next = match round {
                Round::Preempted | Round::Worked => Some(me),
                // Its poll took every completion due: it sleeps until the
                // next one (which wakes it) or its next timer.
                Round::Idle => all[i].next_wake_raw().map(|w| w.max(me)),
            };
            if let Some(t) = next {
                // Still the earliest thing to do: run it again without
                // going through the queue (ties go to events, then to the
                // lower thread, as the queue would order them).
                let before_event = w.next_event().is_none_or(|e| t < e);
                let before_threads = queue.peek().is_none_or(|(qt, qi)| (t, i) < (qt, qi));
                let before_control = next_control == u64::MAX || t < next_control;
                if before_event && before_threads && before_control {
                    again = Some((t, i));
                } else {
                    queue.set(i, t);
                }
            }
        }
        drop(w);
        let mut w = lock(&self.world);
        for e in &mut w.eps {
            e.driver = None;
        }
        drop(w);
        self.save_clock();
        Ok(())
    }
}
