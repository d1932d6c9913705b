//! What the soft backends (embedded, tcp) share to emulate an RNIC
//! context's resources: the QP plan, the doorbell registers, QPs shared by
//! several threads, and the routing of completions between threads.
//!
//! **Doorbells.** Ringing a doorbell writes its record (one cache line per
//! doorbell). A doorbell bound to several QPs is guarded by a spinlock taken
//! around the post, as the mlx5 driver does. So threads whose QPs share a
//! doorbell really contend: the lock and the record's cache line bounce
//! between their cores. A doorbell of its own (low-latency, or per-thread
//! with `per-thread-db`) is rung without a lock.
//!
//! **Shared CQ.** With `shared_cq`, every completion passes through one CQ
//! for all threads: the poller takes its lock, drains it, and hands other
//! threads' completions to their inboxes.
//!
//! **Shared QPs.** A QP used by several threads (`shared`, `multiplexed:K`)
//! is one object behind a mutex (the QP lock). Whichever of its threads
//! polls executes or receives its completions. Read data and atomic results
//! go into the posting thread's registered memory (one MR for the process,
//! as Smart registers it), and the completion into that thread's inbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crossbeam_utils::CachePadded;

use super::LocalMem;
use crate::smart::{DoorbellConfig, QpBinding, QpPlan, QpPolicy};
use crate::verbs::Completion;
use crate::{Error, Result};

/// One doorbell register.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    lock: AtomicBool,
    record: AtomicU64,
}

impl Doorbell {
    /// Runs `post` (placing WQEs) and rings: under the doorbell's lock when
    /// it is shared by several QPs.
    #[inline]
    ///
    /// `exclusive`: only one thread ever rings it (its only QP is not
    /// shared), so the ring count needs no locked instruction.
    pub(crate) fn ring<R>(&self, locked: bool, exclusive: bool, post: impl FnOnce() -> R) -> R {
        if locked {
            while self.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
                while self.lock.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        }
        let r = post();
        if exclusive && !locked {
            // One writer: a plain store counts exactly and spares a locked
            // instruction per post.
            self.record.store(self.record.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.record.fetch_add(1, Ordering::Relaxed);
        }
        if locked {
            self.lock.store(false, Ordering::Release);
        }
        r
    }

    /// Times this doorbell was rung.
    pub(crate) fn rings(&self) -> u64 {
        self.record.load(Ordering::Relaxed)
    }
}

/// A thread's mailbox for completions that another thread received for it.
pub(crate) type Inbox = Mutex<Vec<Completion>>;

#[derive(Debug)]
struct EndpointShare {
    local: Arc<LocalMem>,
    inbox: Arc<Inbox>,
}

/// The emulated RNIC context of a soft transport; `Q` is its shared-QP type.
#[derive(Debug)]
pub(crate) struct SoftNic<Q> {
    plan: RwLock<QpPlan>,
    doorbells: Mutex<Vec<Arc<CachePadded<Doorbell>>>>,
    /// Shared QPs by QP index, created by their first thread.
    shared: Mutex<HashMap<usize, Arc<Mutex<Q>>>>,
    endpoints: RwLock<Vec<EndpointShare>>,
    next_endpoint: AtomicUsize,
    /// The CQ shared by all threads (used when the plan says so).
    cq: Mutex<Vec<(usize, Completion)>>,
}

/// What a thread's endpoint gets from the context.
#[derive(Debug)]
pub(crate) struct Attachment {
    /// This endpoint's id (the owner tag of its batches on shared QPs).
    pub(crate) id: usize,
    /// Its inbox.
    pub(crate) inbox: Arc<Inbox>,
    /// Where it posts for each blade.
    pub(crate) bindings: Vec<QpBinding>,
    /// The doorbell of each blade's QP (held, so ringing takes no lookup).
    pub(crate) doorbells: Vec<Arc<CachePadded<Doorbell>>>,
    /// Whether completions go through the shared CQ.
    pub(crate) shared_cq: bool,
    /// Whether completions may arrive in the inbox (shared QP or CQ).
    pub(crate) uses_inbox: bool,
}

fn unpoison<T>(r: std::result::Result<T, PoisonError<T>>) -> T {
    r.unwrap_or_else(PoisonError::into_inner)
}

impl<Q> SoftNic<Q> {
    pub(crate) fn new(blades: usize) -> Self {
        let plan = QpPlan::new(QpPolicy::PerThreadQp, 1, blades, DoorbellConfig::default());
        let nic = SoftNic {
            plan: RwLock::new(plan),
            doorbells: Mutex::new(Vec::new()),
            shared: Mutex::new(HashMap::new()),
            endpoints: RwLock::new(Vec::new()),
            next_endpoint: AtomicUsize::new(0),
            cq: Mutex::new(Vec::new()),
        };
        nic.size_doorbells(&plan);
        nic
    }

    fn size_doorbells(&self, plan: &QpPlan) {
        let need = (plan.doorbells.low_latency + plan.doorbells.medium).max(plan.threads);
        let mut dbs = unpoison(self.doorbells.lock());
        while dbs.len() < need {
            dbs.push(Arc::new(CachePadded::new(Doorbell::default())));
        }
    }

    /// Sets the plan for the threads opened from now on.
    pub(crate) fn configure(&self, plan: QpPlan) {
        self.size_doorbells(&plan);
        *unpoison(self.plan.write()) = plan;
    }

    /// The plan in force.
    pub(crate) fn plan(&self) -> QpPlan {
        *unpoison(self.plan.read())
    }

    /// Registers a thread's endpoint and computes its QP bindings.
    pub(crate) fn attach(&self, thread: usize, local: Arc<LocalMem>) -> Result<Attachment> {
        let plan = self.plan();
        if thread >= plan.threads && plan.policy != QpPolicy::PerThreadQp {
            return Err(Error::Unsupported(format!(
                "thread {thread} opened, but the QP plan ({}) was made for {} threads: configure the transport first",
                plan.policy, plan.threads
            )));
        }
        let bindings: Vec<QpBinding> = (0..plan.blades).map(|b| plan.binding(thread, b)).collect();
        let doorbells = {
            let dbs = unpoison(self.doorbells.lock());
            bindings
                .iter()
                .map(|s| {
                    dbs.get(s.doorbell).cloned().ok_or_else(|| {
                        Error::Unsupported(format!(
                            "thread {thread} is beyond the {} threads of the QP plan",
                            plan.threads
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?
        };
        let inbox = Arc::new(Mutex::new(Vec::new()));
        let mut eps = unpoison(self.endpoints.write());
        let id = self.next_endpoint.fetch_add(1, Ordering::Relaxed);
        debug_assert_eq!(id, eps.len());
        eps.push(EndpointShare { local, inbox: inbox.clone() });
        let uses_inbox = plan.shared_cq || bindings.iter().any(|s| s.qp_shared);
        Ok(Attachment { id, inbox, bindings, doorbells, shared_cq: plan.shared_cq, uses_inbox })
    }

    /// Times each doorbell was rung (for tests and reports).
    pub(crate) fn doorbell_rings(&self) -> Vec<u64> {
        unpoison(self.doorbells.lock()).iter().map(|d| d.rings()).collect()
    }

    /// The shared QP `qp`, created by `make` if this is its first thread.
    pub(crate) fn shared_qp(&self, qp: usize, make: impl FnOnce() -> Result<Q>) -> Result<Arc<Mutex<Q>>> {
        let mut m = unpoison(self.shared.lock());
        if let Some(q) = m.get(&qp) {
            return Ok(q.clone());
        }
        let q = Arc::new(Mutex::new(make()?));
        m.insert(qp, q.clone());
        Ok(q)
    }

    /// Local memory and inbox of endpoint `id`, for delivering its results.
    pub(crate) fn with_endpoint<R>(&self, id: usize, f: impl FnOnce(&LocalMem, &Inbox) -> R) -> R {
        let eps = unpoison(self.endpoints.read());
        let e = &eps[id];
        f(&e.local, &e.inbox)
    }
}

impl<Q> SoftNic<Q> {
    /// Passes the completions this poller produced (`out[from..]`, tagged
    /// with poster `me`) through the shared CQ, and takes from it every
    /// completion there: its own into `out`, other threads' to their inboxes.
    pub(crate) fn through_shared_cq(&self, me: usize, out: &mut Vec<Completion>, from: usize) {
        let mut cq = unpoison(self.cq.lock());
        cq.extend(out.drain(from..).map(|c| (me, c)));
        for (owner, c) in cq.drain(..) {
            if owner == me {
                out.push(c);
            } else {
                self.with_endpoint(owner, |_, inbox| unpoison(inbox.lock()).push(c));
            }
        }
    }
}

/// Locks a shared QP (a poisoned lock is still usable: QP state is valid
/// after every step).
pub(crate) fn lock<Q>(q: &Mutex<Q>) -> std::sync::MutexGuard<'_, Q> {
    unpoison(q.lock())
}

/// Moves the completions in `inbox` to `out`.
pub(crate) fn drain_inbox(inbox: &Inbox, out: &mut Vec<Completion>) {
    let mut i = unpoison(inbox.lock());
    out.append(&mut i);
}

/// A QP of a thread's endpoint: its own, or shared with other threads.
#[derive(Debug)]
pub(crate) enum QpRef<Q> {
    Own(Q),
    Shared(Arc<Mutex<Q>>),
}

impl<Q> QpRef<Q> {
    /// Whether this thread alone uses the QP.
    #[inline]
    pub(crate) fn is_own(&self) -> bool {
        matches!(self, QpRef::Own(_))
    }

    /// Runs `f` on the QP (under its lock when shared).
    #[inline]
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut Q) -> R) -> R {
        match self {
            QpRef::Own(q) => f(q),
            QpRef::Shared(q) => f(&mut lock(q)),
        }
    }

    /// Runs `f` on the QP unless another thread holds it right now (that
    /// thread then delivers our completions to our inbox).
    pub(crate) fn try_with<R>(&mut self, f: impl FnOnce(&mut Q) -> R) -> Option<R> {
        match self {
            QpRef::Own(q) => Some(f(q)),
            QpRef::Shared(q) => q.try_lock().ok().map(|mut g| f(&mut g)),
        }
    }
}

/// What every soft endpoint holds: its identity on the emulated NIC, its
/// memory and inbox, and per blade its QP binding, doorbell and QP.
#[derive(Debug)]
pub(crate) struct SoftPort<Q> {
    pub(crate) id: usize,
    pub(crate) local: Arc<LocalMem>,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) nic: Arc<SoftNic<Q>>,
    /// Completions may arrive in the inbox (shared QP or shared CQ).
    pub(crate) uses_inbox: bool,
    pub(crate) shared_cq: bool,
    pub(crate) bindings: Vec<QpBinding>,
    pub(crate) doorbells: Vec<Arc<CachePadded<Doorbell>>>,
    pub(crate) qps: Vec<QpRef<Q>>,
}

impl<Q> SoftPort<Q> {
    /// Attaches thread `thread` with `local_bytes` of local memory; `make(b)`
    /// creates a QP to blade `b` (once per shared QP, by its first thread).
    pub(crate) fn open(
        nic: &Arc<SoftNic<Q>>,
        thread: usize,
        local_bytes: usize,
        mut make: impl FnMut(usize) -> Result<Q>,
    ) -> Result<SoftPort<Q>> {
        let local = LocalMem::new(local_bytes)?;
        let att = nic.attach(thread, local.clone())?;
        let mut qps = Vec::with_capacity(att.bindings.len());
        for (b, binding) in att.bindings.iter().enumerate() {
            qps.push(if binding.qp_shared {
                QpRef::Shared(nic.shared_qp(binding.qp, || make(b))?)
            } else {
                QpRef::Own(make(b)?)
            });
        }
        Ok(SoftPort {
            id: att.id,
            local,
            inbox: att.inbox,
            nic: nic.clone(),
            uses_inbox: att.uses_inbox,
            shared_cq: att.shared_cq,
            bindings: att.bindings,
            doorbells: att.doorbells,
            qps,
        })
    }

    /// Posts to blade `b`'s QP with `post`, ringing its doorbell around it.
    pub(crate) fn ring<R>(&mut self, b: usize, post: impl FnOnce(&mut Q) -> R) -> R {
        let q = &mut self.qps[b];
        let binding = &self.bindings[b];
        self.doorbells[b].ring(binding.doorbell_shared, !binding.qp_shared, || q.with(post))
    }

    /// Ends a poll: passes this poll's completions (`out[before..]`) through
    /// the shared CQ if there is one, and collects the inbox.
    pub(crate) fn finish_poll(&self, out: &mut Vec<Completion>, before: usize) {
        if self.shared_cq {
            self.nic.through_shared_cq(self.id, out, before);
        }
        if self.uses_inbox {
            drain_inbox(&self.inbox, out);
        }
    }
}
