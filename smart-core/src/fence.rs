//! Fencing on the memory blade: refusing a compute blade that was taken for
//! dead.
//!
//! A lease alone cannot stop a compute blade that only seems dead: a
//! process paused (SIGSTOP, a VM frozen, a long page-fault storm) between
//! checking its lease and posting a WRITE, or a WRITE that a stalled
//! network delivers late, lands after a recovery elsewhere has already
//! repaired the records it touched. So the blade itself refuses it, the
//! way a fencing token works: a client names the owner of each connection
//! with a *tag* (a compute blade's registration nonce), and a recovery
//! *revokes* that tag on every blade before it repairs anything. From the
//! moment a revocation is answered, no request of a connection with that
//! tag runs on this blade: later batches are answered with
//! [`WcStatus::Fenced`](crate::WcStatus::Fenced) and the connection is
//! closed, and a new connection that names the tag is refused.
//!
//! The barrier between a connection and a revocation is two flags per
//! connection, written and read in the opposite orders (model-checked with
//! loom: `RUSTFLAGS="--cfg loom" cargo test -p smart-core --lib loom`). A
//! connection sets `busy`, then reads `revoked`, before it runs the
//! requests of one read from its socket, and clears `busy` after. A
//! revocation sets `revoked`, then waits until it reads `busy` clear. A
//! sequentially consistent fence sits between each side's store and load
//! (Dekker's pattern), so either the connection sees `revoked` and runs
//! nothing, or the revocation sees `busy` and waits for the requests that
//! had started. (Sequentially consistent stores and loads without the
//! fences would also do in the C++ model, but loom models such accesses as
//! acquire/release and cannot prove that form.) The connection does not
//! hold `busy` while it sends answers, so a client that stops reading
//! cannot hold a revocation up.
//!
//! An RDMA client's verbs run on the blade's RNIC without its CPU, so for a
//! QP that a verbs client connected under a tag, revocation moves the
//! blade's end of the QP to the error state ([`Revocable`]) before it is
//! answered: the RNIC then drops that QP's requests, and the client's
//! verbs never complete (their retries run out, or the client's request
//! time-out does).
//!
//! A revocation is never forgotten: a revoked owner may come back at any
//! time (a paused process resumed), so the blade keeps every revoked tag,
//! up to [`MAX_REVOKED`]; a revocation beyond that is refused (the
//! recovery that asked for it fails and says why) rather than forgetting
//! an older one. A blade with a
//! backing file also records each in a file beside it ([`log_path`]),
//! synced to the disk before the revocation is answered, and reads them
//! back when it restarts on that file: a compute blade taken for dead stays
//! refused across the restart (its connections closed with the old process,
//! and a new one, or a verbs QP it connects again after an error, names its
//! revoked tag). The file starts with the blade's identity, so a backing
//! file made anew starts with no revoked tags. An anonymous blade keeps
//! them in memory only: its data dies with it too.

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// What a compute blade is told when a memory blade refuses it.
pub const REFUSED: &str = "the memory blade refuses this compute blade (a recovery revoked its registration)";

/// Most revoked tags a blade keeps (8 MiB in its file); a revocation
/// beyond is refused, never one forgotten.
pub const MAX_REVOKED: usize = 1 << 20;

/// What a revocation must stop besides requests the blade's CPU runs: the
/// blade's end of a verbs client's QP.
pub trait Revocable: Send {
    /// Stops it for good (a QP: to the error state).
    ///
    /// # Errors
    /// Why it could not be stopped.
    fn revoke(&mut self) -> Result<(), String>;
}

/// One connection's (or verbs QP's) side of the barrier.
#[derive(Default)]
pub(crate) struct ConnFence {
    tag: AtomicU64,
    revoked: AtomicBool,
    busy: AtomicBool,
    /// Stopped by a revocation once the connection is quiescent.
    held: Mutex<Vec<Box<dyn Revocable>>>,
}

impl std::fmt::Debug for ConnFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnFence").field("tag", &self.tag).field("revoked", &self.revoked).finish_non_exhaustive()
    }
}

impl ConnFence {
    /// Before running requests: `false` if the connection's tag was revoked
    /// (it must run none, and close).
    pub(crate) fn enter(&self) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.revoked.load(Ordering::Relaxed) {
            self.busy.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// The owner it names (0: none yet).
    pub(crate) fn tag(&self) -> u64 {
        self.tag.load(Ordering::Relaxed)
    }

    /// After running them.
    pub(crate) fn leave(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// Keeps `r` until the connection ends, to be stopped if it is revoked.
    /// Call it between [`ConnFence::enter`] and [`ConnFence::leave`], so
    /// that a revocation either finds it or was seen by `enter`.
    pub(crate) fn hold(&self, r: Box<dyn Revocable>) {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).push(r);
    }

    /// Stops what it holds (after it was revoked and is quiescent).
    fn stop_held(&self) -> Result<(), String> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).iter_mut().try_for_each(|r| r.revoke())
    }

    /// Sets `revoked`; the caller then waits with [`quiesce`].
    fn revoke(&self) {
        self.revoked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Relaxed)
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// Waits until `other`, whose `revoked` is set, runs no request. Gives up
/// (`false`) if `me` is revoked meanwhile: two connections revoking each
/// other's tags must not wait for each other forever.
fn quiesce(other: &ConnFence, me: &ConnFence) -> bool {
    while other.is_busy() {
        if me.is_revoked() {
            return false;
        }
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        std::thread::yield_now();
    }
    true
}

#[derive(Debug, Default)]
struct State {
    revoked: HashSet<u64>,
    conns: Vec<Weak<ConnFence>>,
}

/// A blade's fences: its connections and the tags revoked.
#[derive(Debug, Default)]
pub(crate) struct Fences {
    state: Mutex<State>,
    /// Where revoked tags are recorded, if anywhere.
    log: Option<Mutex<TagLog>>,
}

/// The first 8 bytes of a file of revoked tags; then the blade's identity
/// (8 bytes, little-endian), then one 8-byte tag per revocation, oldest
/// first.
pub const LOG_MAGIC: &[u8; 8] = b"SRFENCE1";

/// The bytes before the first tag: the magic and the identity.
const LOG_HEADER: usize = 16;

/// The file of revoked tags of a blade whose backing file is `backing`:
/// beside it, named with `.revoked` added.
pub fn log_path(backing: &Path) -> PathBuf {
    let mut name = backing.as_os_str().to_owned();
    name.push(".revoked");
    PathBuf::from(name)
}

/// An open file of revoked tags.
#[derive(Debug)]
struct TagLog {
    file: std::fs::File,
    path: PathBuf,
}

impl TagLog {
    /// Opens (or makes) the file at `path` for the blade of `identity`:
    /// returns it and the tags it holds. A file of another identity (its
    /// backing file was made anew) is started again empty; a record cut
    /// short by a crash is dropped; a file holding more than
    /// [`MAX_REVOKED`] tags is refused (this blade would have to forget
    /// some).
    fn open(path: &Path, identity: u64) -> io::Result<(TagLog, Vec<u64>)> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
        let mut file = std::fs::OpenOptions::new().read(true).append(true).create(true).open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mine = bytes.len() >= LOG_HEADER && bytes[8..LOG_HEADER] == identity.to_le_bytes();
        if !bytes.is_empty() && (bytes.len() < LOG_HEADER || &bytes[..8] != LOG_MAGIC) {
            return Err(bad(format!(
                "not a file of revoked tags (it does not start with {:?}): move it away",
                String::from_utf8_lossy(LOG_MAGIC)
            )));
        }
        // Whole records of this blade's file (none of another's).
        let records = if mine { &bytes[LOG_HEADER..] } else { &[][..] };
        let whole = LOG_HEADER + records.len() / 8 * 8;
        let mut tags: Vec<u64> =
            records.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        // Each tag once (older files could name one twice).
        let mut seen = HashSet::new();
        tags.retain(|t| seen.insert(*t));
        if tags.len() > MAX_REVOKED {
            return Err(bad(format!(
                "it names {} revoked tags, more than the {MAX_REVOKED} a blade keeps: it was not written by this \
                 version; move it away only if none of those compute blades can come back",
                tags.len()
            )));
        }
        let mut log = TagLog { file, path: path.to_path_buf() };
        if !mine || tags.len() < records.len() / 8 {
            // Started again, or rewritten with each tag once.
            let mut all = LOG_MAGIC.to_vec();
            all.extend(std::iter::once(identity).chain(tags.iter().copied()).flat_map(u64::to_le_bytes));
            log.file.set_len(0)?;
            log.file.write_all(&all)?;
            log.file.sync_all()?;
        } else if whole < bytes.len() {
            log.file.set_len(whole as u64)?;
            log.file.sync_all()?;
        }
        Ok((log, tags))
    }

    /// Records `tag`, on the disk when it returns.
    fn append(&mut self, tag: u64) -> io::Result<()> {
        self.file.write_all(&tag.to_le_bytes())?;
        self.file.sync_data()
    }
}

impl Fences {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fences that record revoked tags in the file at `path` for the blade
    /// of `identity`, starting with the tags it holds (see [`TagLog`]):
    /// returns them and how many tags they remember.
    ///
    /// # Errors
    /// The file cannot be opened, read or written, or is not a file of
    /// revoked tags.
    pub(crate) fn persistent(path: &Path, identity: u64) -> io::Result<(Fences, usize)> {
        let (log, tags) = TagLog::open(path, identity)?;
        let n = tags.len();
        let state = State { revoked: tags.into_iter().collect(), conns: Vec::new() };
        Ok((Fences { state: Mutex::new(state), log: Some(Mutex::new(log)) }, n))
    }

    /// A new connection's fence.
    pub(crate) fn attach(&self) -> Arc<ConnFence> {
        let c = Arc::new(ConnFence::default());
        let mut s = self.state();
        s.conns.retain(|w| w.strong_count() > 0);
        s.conns.push(Arc::downgrade(&c));
        c
    }

    /// Names `c`'s owner `tag`: `false` (and `c` revoked) if that tag was
    /// revoked.
    pub(crate) fn tag(&self, c: &ConnFence, tag: u64) -> bool {
        let s = self.state();
        if s.revoked.contains(&tag) {
            c.revoke();
            return false;
        }
        c.tag.store(tag, Ordering::Relaxed);
        true
    }

    /// Revokes `tag`, for the connection `me` (which is running this
    /// request): returns once no other connection with that tag runs a
    /// request and what they hold is stopped.
    ///
    /// # Errors
    /// The blade keeps [`MAX_REVOKED`] tags already, `me` was revoked
    /// meanwhile, or something held could not be stopped.
    pub(crate) fn revoke(&self, tag: u64, me: &ConnFence) -> Result<(), String> {
        let (victims, new) = {
            let mut s = self.state();
            if s.revoked.len() >= MAX_REVOKED && !s.revoked.contains(&tag) {
                return Err(format!(
                    "this blade keeps {MAX_REVOKED} revoked tags, its most, and forgets none (a revoked compute \
                     blade could come back): move its data to a fresh blade"
                ));
            }
            let new = s.revoked.insert(tag);
            let v: Vec<Arc<ConnFence>> =
                s.conns.iter().filter_map(Weak::upgrade).filter(|c| c.tag.load(Ordering::Relaxed) == tag).collect();
            for c in &v {
                c.revoke();
            }
            (v, new)
        };
        if let (true, Some(log)) = (new, &self.log) {
            // On the disk before the answer: a restart reads it back.
            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
            log.append(tag).map_err(|e| format!("recording the revocation in {}: {e}", log.path.display()))?;
        }
        let others = || victims.iter().filter(|c| !std::ptr::eq(Arc::as_ptr(c), me));
        if !others().all(|c| quiesce(c, me)) {
            return Err("this connection was revoked while it waited".into());
        }
        others().try_for_each(|c| c.stop_held())
    }

    #[cfg(all(test, not(loom)))]
    fn remembers(&self, tag: u64) -> bool {
        self.state().revoked.contains(&tag)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_tag_stops_its_connections_and_refuses_new_ones() {
        let f = Fences::default();
        let (a, b, other, me) = (f.attach(), f.attach(), f.attach(), f.attach());
        assert!(f.tag(&a, 7) && f.tag(&b, 7) && f.tag(&other, 8));
        assert!(a.enter());
        a.leave();
        assert!(f.revoke(7, &me).is_ok());
        assert!(!a.enter() && !b.enter(), "a revoked connection runs nothing more");
        assert!(other.enter(), "another owner's connection is unaffected");
        other.leave();
        let late = f.attach();
        assert!(!f.tag(&late, 7), "a new connection naming a revoked tag is refused");
        assert!(!late.enter());
        assert!(me.enter(), "the revoking connection goes on");
    }

    #[test]
    fn a_connection_revoking_its_own_tag_does_not_wait_for_itself() {
        let f = Fences::default();
        let me = f.attach();
        assert!(f.tag(&me, 3));
        assert!(me.enter());
        assert!(f.revoke(3, &me).is_ok());
        me.leave();
        assert!(!me.enter());
    }

    #[test]
    fn a_revocation_waits_for_a_running_request_and_gives_up_if_revoked_itself() {
        let f = Arc::new(Fences::default());
        let (busy, me) = (f.attach(), f.attach());
        assert!(f.tag(&busy, 5) && f.tag(&me, 6));
        assert!(busy.enter());
        let (f2, me2) = (f.clone(), me.clone());
        let t = std::thread::spawn(move || f2.revoke(5, &me2).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "the revocation waits while the connection runs a request");
        busy.leave();
        assert!(t.join().unwrap());
        // Two connections revoking each other's tags: neither waits forever.
        let (x, y) = (f.attach(), f.attach());
        assert!(f.tag(&x, 10) && f.tag(&y, 11));
        assert!(x.enter() && y.enter());
        let (f3, y2) = (f.clone(), y.clone());
        let t = std::thread::spawn(move || f3.revoke(10, &y2).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(f.revoke(11, &x).is_err(), "x was revoked while it waited for y");
        assert!(!t.join().unwrap());
    }

    struct Stop(Arc<AtomicBool>, bool);

    impl Revocable for Stop {
        fn revoke(&mut self) -> Result<(), String> {
            self.0.store(true, Ordering::SeqCst);
            if self.1 {
                Ok(())
            } else {
                Err("cannot".into())
            }
        }
    }

    #[test]
    fn what_a_revoked_connection_holds_is_stopped_before_the_answer() {
        let f = Fences::default();
        let (qp, other, me) = (f.attach(), f.attach(), f.attach());
        let (stopped, untouched) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        assert!(qp.enter() && f.tag(&qp, 9));
        qp.hold(Box::new(Stop(stopped.clone(), true)));
        qp.leave();
        assert!(f.tag(&other, 10));
        other.hold(Box::new(Stop(untouched.clone(), true)));
        assert!(f.revoke(9, &me).is_ok());
        assert!(stopped.load(Ordering::SeqCst) && !untouched.load(Ordering::SeqCst));
        // A failure to stop it fails the revocation.
        let bad = f.attach();
        assert!(f.tag(&bad, 11));
        bad.hold(Box::new(Stop(Arc::new(AtomicBool::new(false)), false)));
        assert_eq!(f.revoke(11, &me), Err("cannot".to_string()));
    }

    /// A flood of revocations makes the blade refuse more, never forget
    /// the first (a fenced compute blade must not come back after it).
    #[test]
    fn no_revoked_tag_is_forgotten_however_many_come() {
        let f = Fences::default();
        let me = f.attach();
        for t in 1..=MAX_REVOKED as u64 {
            assert!(f.revoke(t, &me).is_ok());
        }
        let err = f.revoke(MAX_REVOKED as u64 + 1, &me).unwrap_err();
        assert!(err.contains("forgets none"), "{err}");
        assert!(f.remembers(1) && f.remembers(MAX_REVOKED as u64) && !f.remembers(MAX_REVOKED as u64 + 1));
        assert!(!f.tag(&f.attach(), 1), "the first revoked tag is still refused");
        assert!(f.revoke(2, &me).is_ok(), "revoking a kept tag again is no new one");
    }

    fn scratch(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("smart-fence-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn revoked_tags_recorded_in_a_file_are_refused_after_a_restart() {
        let p = scratch("restart");
        let (f, n) = Fences::persistent(&p, 0xabc).unwrap();
        assert_eq!(n, 0);
        let me = f.attach();
        assert!(f.revoke(7, &me).is_ok() && f.revoke(8, &me).is_ok() && f.revoke(7, &me).is_ok());
        drop(f);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 + 2 * 8, "each tag once");
        // A crash cut the last record short: it is dropped.
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(&[1, 2, 3]).unwrap();
        let (f, n) = Fences::persistent(&p, 0xabc).unwrap();
        assert_eq!(n, 2);
        let late = f.attach();
        assert!(!f.tag(&late, 7), "refused after the restart");
        assert!(f.tag(&f.attach(), 9));
        assert!(f.revoke(9, &me).is_ok());
        drop(f);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 + 3 * 8);
        // The backing file made anew (another identity): nothing revoked.
        let (f, n) = Fences::persistent(&p, 0xdef).unwrap();
        assert_eq!(n, 0);
        assert!(f.tag(&f.attach(), 7));
        drop(f);
        // Not such a file: refused, and left as it was.
        std::fs::write(&p, b"hello, world, this is text").unwrap();
        let err = Fences::persistent(&p, 0xdef).unwrap_err();
        assert!(err.to_string().contains("not a file of revoked tags"), "{err}");
        assert_eq!(std::fs::read(&p).unwrap(), b"hello, world, this is text");
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_file_naming_a_tag_twice_is_rewritten_with_each_once_and_one_past_the_limit_is_refused() {
        let p = scratch("compact");
        let tags: Vec<u8> = [1u64, 2, 1, 3, 2].iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&p, [&LOG_MAGIC[..], &5u64.to_le_bytes(), &tags].concat()).unwrap();
        let (f, n) = Fences::persistent(&p, 5).unwrap();
        assert_eq!(n, 3);
        assert!(f.remembers(1) && f.remembers(2) && f.remembers(3));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 + 8 * 3);
        drop(f);
        let tags: Vec<u8> = (1..=MAX_REVOKED as u64 + 1).flat_map(u64::to_le_bytes).collect();
        std::fs::write(&p, [&LOG_MAGIC[..], &5u64.to_le_bytes(), &tags].concat()).unwrap();
        let err = Fences::persistent(&p, 5).unwrap_err().to_string();
        assert!(err.contains("more than the"), "{err}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 + 8 * (MAX_REVOKED as u64 + 1), "left as it was");
        let _ = std::fs::remove_file(&p);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// No request runs after a revocation returns: a connection runs two
    /// reads' requests while another thread revokes its tag.
    #[test]
    fn loom_no_request_runs_after_a_revocation_returns() {
        loom::model(|| {
            let conn = Arc::new(ConnFence::default());
            let me = Arc::new(ConnFence::default());
            let done = Arc::new(AtomicBool::new(false));
            let (c, d) = (conn.clone(), done.clone());
            let t = thread::spawn(move || {
                for _ in 0..2 {
                    if !c.enter() {
                        return;
                    }
                    assert!(!d.load(Ordering::SeqCst), "a request ran after the revocation returned");
                    c.leave();
                }
            });
            conn.revoke();
            assert!(quiesce(&conn, &me));
            done.store(true, Ordering::SeqCst);
            t.join().unwrap();
        });
    }
}
