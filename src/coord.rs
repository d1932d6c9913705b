//! `--coordinator`: the FORD subcommands under the cluster's configuration
//! in etcd ([`smart_coord`]).
//!
//! - [`enter`]: before a run, the configuration is read (created at epoch 1
//!   over the run's blades if there is none) and the run's blades are
//!   checked against it: a blade that was removed is refused, even if it
//!   comes back with its data, and so is a blade restarted without it.
//! - [`Member`] of a run: an etcd lease held while it runs; if etcd lets it
//!   lapse, or the configuration moves to a later epoch, the run's
//!   transactions stop locking and committing.
//! - [`fail_over`]: a run whose verbs to a memory blade failed, with the
//!   blade found dead (its port refuses connections, or it stopped
//!   answering), proposes the configuration without it (one proposal wins),
//!   then fences every compute blade of the earlier epoch on the surviving
//!   blades (their registrations are revoked there: none of their verbs
//!   lands again). The run then settles the earlier epoch's transactions
//!   and goes on without the blade, a backup promoted where a primary was
//!   lost (the `smallbank`/`tatp` command's loop; without blade 0, the
//!   database's mirror on the next blade stands for its catalog and
//!   registry: [`ford_dtx::db::Db::open_view`]); `compute-blade rebuild --lost N --coordinator
//!   URL` later writes a fresh blade's copies in the lost one's place and
//!   takes it into the configuration ([`readmit`]).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use smart_coord::{BladeState, Config, Coordinator, Versioned};
use smart_core::runtime::RuntimeConfig;
use smart_core::{Runtime, Transport};

use crate::config::{Blades, Session};

/// A run under the configuration.
#[derive(Debug)]
pub struct Entered {
    /// The connection to etcd.
    pub c: Coordinator,
    /// The configuration the run acts under.
    pub v: Versioned,
    /// The run's blades' addresses.
    pub addrs: Vec<String>,
}

/// The time-out of coordinator requests: the run's request time-out (10 s
/// when it has none).
fn timeout(s: &Session) -> Duration {
    s.run.runtime.request_timeout.unwrap_or(Duration::from_secs(10))
}

/// Connects to the coordinator of `s` (if any), creates the configuration
/// over the run's blades if there is none, and checks the run's blades
/// against it.
///
/// # Errors
/// etcd unreachable; blades the configuration does not trust; verb errors.
pub fn enter(s: &Session, t: &dyn Transport, absent: &[u16]) -> Result<Option<Entered>> {
    let Some(url) = &s.coordinator else { return Ok(None) };
    let Blades::Remote { addrs, .. } = &s.blades else { bail!("--coordinator needs --blades") };
    let c = Coordinator::connect(url, timeout(s))?;
    let (v, created) = if absent.is_empty() {
        let ids = identities(s, t, &[])?;
        let run: Vec<(String, u64)> = addrs.iter().cloned().zip(ids).collect();
        let (v, created) = c.create_or_load(&Config::new(&run))?;
        v.config.check_run(&run)?;
        (v, created)
    } else {
        // Started while blades are out ([`absent`]): the others must be
        // the ones the configuration names, and those out, out.
        let Some(v) = c.load()? else { bail!("the coordinator's configuration is gone") };
        let run: Vec<(String, u64)> = addrs.iter().cloned().zip(identities(s, t, absent)?).collect();
        v.config.check_run_without(&run, absent)?;
        (v, false)
    };
    if s.run.progress {
        eprintln!(
            "coordinator: cluster {:?} at {}: configuration epoch {}{} ({})",
            c.cluster(),
            c.url(),
            v.config.epoch,
            if created { ", created now" } else { "" },
            v.config.describe_blades()
        );
    }
    Ok(Some(Entered { c, v, addrs: addrs.clone() }))
}

/// The memory blades the configuration of `s`'s coordinator holds out
/// (removed by a failover, not rebuilt yet), and those joining it (a
/// `rebuild --online` copying to them), for a SmallBank or TATP run that
/// starts meanwhile: it goes on without the first, as the runs that failed
/// over do (a transport without them: the blade set's check is the
/// configuration's identities), and writes to the second. Empty without a
/// coordinator or a configuration, and for another number of blades. With
/// blade 0 out, the run finds the database through its mirror on the first
/// blade read ([`ford_dtx::db::Db::open_view`]).
///
/// # Errors
/// etcd unreachable.
pub fn absent(s: &Session) -> Result<(Vec<u16>, Vec<u16>)> {
    let (Some(url), Blades::Remote { addrs, .. }) = (&s.coordinator, &s.blades) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let c = Coordinator::connect(url, timeout(s))?;
    let Some(v) = c.load()? else { return Ok((Vec::new(), Vec::new())) };
    if v.config.blades.len() != addrs.len() {
        return Ok((Vec::new(), Vec::new()));
    }
    Ok((v.config.removed(), v.config.joining()))
}

/// Each blade's identity, read from its superblock (0 for the blades of
/// `absent`, which are not asked).
fn identities(s: &Session, t: &dyn Transport, absent: &[u16]) -> Result<Vec<u64>> {
    let mut rt = Runtime::new(t, 0, s.run.runtime.clone())?;
    let ctx = rt.ctx();
    let absent = absent.to_vec();
    Ok(rt.block_on(async move { ctx.blade_identities(&absent).await })?)
}

/// A run's membership: the flags its transactions and its record share.
#[derive(Debug)]
pub struct Member {
    /// Raised when the membership lapses or the epoch moves.
    pub halt: Arc<AtomicBool>,
    /// The registration's fence tag, once registered.
    pub fence_tag: Arc<AtomicU64>,
    /// The membership itself.
    pub m: smart_coord::Membership,
}

/// Joins as a member running `what`, with a lease of `lease`.
///
/// # Errors
/// etcd errors.
pub fn join(e: &Entered, what: String, lease: Duration) -> Result<Member> {
    join_under(e, &e.v, what, lease)
}

/// [`join`] under configuration `v` (one `e`'s run made since it entered).
///
/// # Errors
/// etcd errors.
pub fn join_under(e: &Entered, v: &Versioned, what: String, lease: Duration) -> Result<Member> {
    let (halt, fence_tag) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let host = crate::report::host_name();
    let me = smart_coord::Member { what, host, pid: std::process::id(), epoch: 0, fence_tag: 0, lease: 0 };
    let m = e.c.join(&me, lease, v.config.epoch, halt.clone(), fence_tag.clone())?;
    Ok(Member { halt, fence_tag, m })
}

/// Watches the memory blades while a run goes on: every `period`, one
/// 8-byte READ of each blade's superblock (a runtime of its own, on its own
/// thread). A READ that fails or times out (the run's request time-out)
/// marks the blade dead and raises the run's halt flag, so that a compute
/// blade whose transactions never reach a dead blade (every one of them
/// aborting on a lock that a paused compute blade holds, say) still stops
/// and fails over.
#[derive(Debug)]
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    dead: Arc<std::sync::Mutex<Option<(u16, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a [`Watchdog`] also does while blade 0 is out of the configuration
/// or joining it: registrations in the database's mirror never expire, so a
/// compute blade that dies there would hold its locks until the next change
/// of the configuration. Every `lease`, the registrations claimed in the
/// mirror whose compute blade's membership is gone without its leaving
/// ([`dead_tags`]) are fenced on the blades in use and settled there.
#[derive(Debug)]
pub struct Reap {
    /// The session (the blades' secret, the time-out).
    pub s: Session,
    /// The coordinator.
    pub c: Coordinator,
    /// The configuration the run acts under.
    pub v: Versioned,
    /// The database.
    pub db: String,
    /// The blades joining.
    pub joining: Vec<u16>,
    /// How often, and the settling's wait (from the run's lease).
    pub lease: Duration,
}

impl Reap {
    /// One round: the registrations settled (none if blade 0 is in).
    fn once(&self, rt: &mut Runtime, out: &[u16]) -> Result<usize> {
        let (ctx, name, o, joining) = (rt.ctx(), self.db.clone(), out.to_vec(), self.joining.clone());
        let Some(db) = rt.block_on(async move { ford_dtx::db::Db::open_view(&ctx, &name, &o, &joining).await })? else {
            return Ok(0);
        };
        if db.mirror.is_none() {
            return Ok(0);
        }
        let ctx = rt.ctx();
        let d = db.clone();
        let claimed: Vec<u64> =
            rt.block_on(async move { ford_dtx::registry::slots(&ctx, &d).await })?.iter().map(|s| s.nonce()).collect();
        let dead: Vec<u64> = dead_tags(&self.c)?.into_iter().filter(|t| claimed.contains(t)).collect();
        if dead.is_empty() {
            return Ok(0);
        }
        let at = (self.db.as_str(), out, self.joining.as_slice());
        Ok(fence_and_settle(&self.s, &self.v, rt, at, &dead, self.lease)?.1.len())
    }
}

impl Watchdog {
    /// Starts watching the blades of `t` but those of `skip` (out of the
    /// configuration), and reaping with `reap` (if given).
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn start(
        s: &Session,
        t: Arc<dyn Transport>,
        halt: Arc<AtomicBool>,
        period: Duration,
        skip: Vec<u16>,
        reap: Option<Reap>,
    ) -> Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let dead = Arc::new(std::sync::Mutex::new(None));
        let cfg = RuntimeConfig {
            slots: 4,
            slot_bytes: 4096,
            coroutines: 1,
            request_timeout: Some(timeout(s)),
            ..RuntimeConfig::default()
        };
        let (st, de) = (stop.clone(), dead.clone());
        let big = RuntimeConfig { request_timeout: Some(timeout(s)), ..RuntimeConfig::default() };
        let thread = std::thread::Builder::new().name("blade-watchdog".into()).spawn(move || {
            let Ok(mut rt) = Runtime::new(&*t, 0, cfg) else { return };
            let ctx = rt.ctx();
            let n = ctx.blades().len() as u16;
            let mut reaped_at = std::time::Instant::now();
            let mut reaper: Option<Runtime> = None;
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(r) = reap.as_ref().filter(|r| reaped_at.elapsed() >= r.lease) {
                    reaped_at = std::time::Instant::now();
                    if reaper.is_none() {
                        reaper = Runtime::new(&*t, 0, big.clone()).ok();
                    }
                    if let Some(rrt) = reaper.as_mut() {
                        match r.once(rrt, &skip) {
                            Ok(0) => {}
                            Ok(k) => eprintln!(
                                "{}: {k} dead compute blade{} settled in blade 0's mirror (membership lapsed; fenced \
                                 on the blades in use)",
                                r.db,
                                if k == 1 { "" } else { "s" }
                            ),
                            Err(x) => eprintln!("note: settling dead compute blades in blade 0's mirror: {x:#}"),
                        }
                    }
                }
                for b in (0..n).filter(|b| !skip.contains(b)) {
                    let c = ctx.clone();
                    if let Err(e) = rt.block_on(async move { c.read_u64(smart_core::GlobalAddr::new(b, 0)).await }) {
                        *de.lock().expect("not poisoned") = Some((b, e.to_string()));
                        halt.store(true, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                }
                let until = std::time::Instant::now() + period;
                while std::time::Instant::now() < until && !st.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })?;
        Ok(Watchdog { stop, dead, thread: Some(thread) })
    }

    /// Stops watching; the blade it found dead, if any, and what failed.
    pub fn stop(mut self) -> Option<(u16, String)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.dead.lock().expect("not poisoned").clone()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Records database `name`'s replica order (each table's blades, primary
/// first) in the configuration, unless it is there.
///
/// # Errors
/// etcd errors.
pub fn record_db(e: &Entered, name: &str, order: Vec<Vec<u16>>) -> Result<()> {
    e.c.update(|c| {
        Ok((!c.databases.contains_key(name)).then(|| {
            let mut next = c.clone();
            next.databases.insert(name.to_string(), order.clone());
            next
        }))
    })?;
    Ok(())
}

/// The blades of `addrs` that look dead: those whose port refuses a
/// connection (or does not take one within a second), and those the run's
/// transport marked silent (a batch to them went unanswered past the
/// request time-out: [`smart_core::backend::Silence`]).
pub fn failed_blades(addrs: &[String], silence: Option<&smart_core::backend::Silence>) -> Vec<u16> {
    let mut out = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let silent = silence.is_some_and(|s| s.check(i as u16).is_err());
        let refused = match a.to_socket_addrs().ok().and_then(|mut x| x.next()) {
            Some(sa) => TcpStream::connect_timeout(&sa, Duration::from_secs(1)).is_err(),
            None => true,
        };
        if silent || refused {
            out.push(i as u16);
        }
    }
    out
}

/// What a failover did.
#[derive(Debug)]
pub struct FailedOver {
    /// What to tell the user.
    pub said: String,
    /// The configuration after it.
    pub v: Versioned,
    /// The fence tags (registrations) of the earlier epochs' compute blades,
    /// fenced on every active blade: their transactions are to be settled
    /// before any of the new epoch runs.
    pub fenced: Vec<u64>,
    /// "failover" (a blade failed) or "reconfiguration" (the configuration
    /// moved otherwise: [`moved`]), for messages and records.
    pub cause: &'static str,
    /// This compute blade's proposal made the change.
    pub proposed: bool,
}

impl FailedOver {
    /// The blades the configuration took out (removed at any epoch).
    pub fn removed(&self) -> Vec<u16> {
        self.v.config.removed()
    }
}

/// After a run failed with `error`: if a blade of the configuration is
/// found dead (or is `known` dead: the [`Watchdog`] found it), takes it out of the configuration (unless another compute
/// blade did first) and fences the earlier epochs' compute blades on the
/// others. Returns what it did, `None` if no blade was found dead.
///
/// # Errors
/// etcd errors; fencing that fails on a surviving blade.
pub fn fail_over(
    s: &Session,
    e: &Entered,
    t: &dyn Transport,
    error: &str,
    known: Option<u16>,
) -> Result<Option<FailedOver>> {
    let mut dead = failed_blades(&e.addrs, t.silence().as_deref());
    if let Some(b) = known.filter(|b| !dead.contains(b)) {
        dead.push(b);
        dead.sort_unstable();
    }
    // Blades already out (a run going on without them) are not news; a
    // joining blade that dies is taken out again.
    let active = e.v.config.in_use();
    dead.retain(|b| active.contains(b));
    if dead.is_empty() {
        return Ok(None);
    }
    let why = format!("compute blade pid {} saw: {error}", std::process::id());
    // For tests: `SMART_RS_TEST_PROPOSAL=delay:MS` waits before proposing
    // (so that another compute blade proposes first), `die` aborts the
    // process right after its proposal landed, before any fencing (a
    // proposer killed mid-proposal).
    let hook = std::env::var("SMART_RS_TEST_PROPOSAL").unwrap_or_default();
    if let Some(ms) = hook.strip_prefix("delay:").and_then(|m| m.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    // Whether this proposal is the one that stuck (another compute blade
    // may have moved the configuration first).
    let mut proposed = false;
    let v = e.c.update(|c| {
        // Only from the epoch this run acted under: a configuration that
        // moved on was decided by others, and what this run saw since may
        // be its own stall (a paused process finds every request late).
        if c.epoch != e.v.config.epoch {
            proposed = false;
            return Ok(None);
        }
        // The dead blades still in use, in one epoch; never the last one.
        let active = c.in_use();
        let mut gone: Vec<u16> = dead.iter().copied().filter(|b| active.contains(b)).collect();
        gone.truncate(active.len().saturating_sub(1));
        proposed = !gone.is_empty();
        if proposed {
            c.without(&gone, &why).map(Some)
        } else {
            Ok(None)
        }
    })?;
    if proposed && hook == "die" {
        eprintln!("compute-blade: SMART_RS_TEST_PROPOSAL=die: aborting right after proposing epoch {}", v.config.epoch);
        std::process::abort();
    }
    let (fenced, tags) = fence_earlier(s, &e.c, &v)?;
    let removed: Vec<String> = dead.iter().map(|b| format!("{b} ({})", e.addrs[usize::from(*b)])).collect();
    let said = if proposed {
        format!(
            "memory blade{} {} failed: the configuration is now epoch {} ({}); {fenced}",
            if dead.len() > 1 { "s" } else { "" },
            removed.join(", "),
            v.config.epoch,
            v.config.describe_blades(),
        )
    } else {
        format!(
            "memory blade{} {} failed; the configuration had moved to epoch {} ({}) by another compute blade's \
             proposal (this one acted under epoch {}); {fenced}",
            if dead.len() > 1 { "s" } else { "" },
            removed.join(", "),
            v.config.epoch,
            v.config.describe_blades(),
            e.v.config.epoch,
        )
    };
    Ok(Some(FailedOver { said, v, fenced: tags, cause: "failover", proposed }))
}

/// After a run was halted with no blade found dead: if the configuration
/// moved to a later epoch (a blade joining or taken in by `rebuild
/// --online`, one removed by hand or by another compute blade), fences the
/// earlier epochs' compute blades on the blades in use (as the proposer
/// did: it may have died before) and returns the change, for the run to go
/// on under it. `None` if the configuration did not move.
///
/// # Errors
/// etcd errors; fencing that fails on a blade in use.
pub fn moved(s: &Session, e: &Entered) -> Result<Option<FailedOver>> {
    let Some(v) = e.c.load()? else { bail!("the configuration vanished from the coordinator") };
    if v.config.epoch <= e.v.config.epoch {
        return Ok(None);
    }
    let (fenced, tags) = fence_earlier(s, &e.c, &v)?;
    let said = format!(
        "the configuration moved to epoch {} ({}; this compute blade acted under epoch {}); {fenced}",
        v.config.epoch,
        v.config.describe_blades(),
        e.v.config.epoch
    );
    Ok(Some(FailedOver { said, v, fenced: tags, cause: "reconfiguration", proposed: false }))
}

/// After failover `fo` (this compute blade's proposal, or another's): if
/// the configuration lists a spare and no blade joins, claims the copy in
/// etcd (`claims/spare-copy-N@EPOCH`: of the compute blades that go on
/// after the failover, one does, so that the copy starts even when the
/// proposer died right after its proposal), and the one that did starts
/// `compute-blade rebuild --online` (this executable, a process of its own
/// that outlives this run) onto the first spare, in the place of the first
/// blade `fo` removed. Its output goes to a file; returns
/// what to tell the user, `None` if nothing was started here.
///
/// # Errors
/// The claim or the process cannot be made.
pub fn start_spare_copy(s: &Session, coordinator: &Coordinator, fo: &FailedOver) -> Result<Option<String>> {
    let c = &fo.v.config;
    let (Some(url), Blades::Remote { secret_file, .. }) = (&s.coordinator, &s.blades) else { return Ok(None) };
    let Some(spare) = c.spares.first() else { return Ok(None) };
    let Some(&n) = c.removed().first() else { return Ok(None) };
    if !c.joining().is_empty() {
        return Ok(None);
    }
    let me = format!("compute blade pid {} on {}", std::process::id(), crate::report::host_name());
    if !coordinator.claim(&format!("spare-copy-{n}@{}", c.epoch), &me).context("claiming the copy onto the spare")? {
        return Ok(None);
    }
    let mut addrs: Vec<String> = c.blades.iter().map(|b| b.addr.clone()).collect();
    addrs[usize::from(n)] = spare.clone();
    let log = std::env::temp_dir().join(format!("smart-rs-spare-{}-{n}.log", std::process::id()));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["rebuild", "--online", "--lost", &n.to_string(), "--blades", &addrs.join(","), "--coordinator", url]);
    cmd.args(["--request-timeout", &timeout(s).as_secs_f64().to_string()]);
    if let Some(f) = secret_file {
        cmd.arg("--secret-file").arg(f);
    }
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting `compute-blade rebuild --online` onto the spare")?;
    Ok(Some(format!(
        "spare: copying memory blade {n} onto the spare {spare}: `compute-blade rebuild --online` started (pid {}, \
         output in {})",
        child.id(),
        log.display()
    )))
}

/// What to do once transactions stopped for the blades `removed`: start a
/// fresh memory blade in each one's place and rebuild it.
pub fn rebuild_hint(s: &Session, removed: &[u16]) -> String {
    format!(
        "start a fresh memory blade in {} place and run `compute-blade rebuild --lost {} --coordinator {}` with the \
         new --blades",
        if removed.len() > 1 { "their" } else { "its" },
        removed.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
        s.coordinator.as_deref().unwrap_or_default(),
    )
}

/// Revokes, on every active blade of `v`, the fence tags of the members
/// that act under an earlier epoch; says what it did.
///
/// # Errors
/// etcd errors; a blade that cannot be reached or refuses.
pub fn fence_earlier(s: &Session, c: &Coordinator, v: &Versioned) -> Result<(String, Vec<u64>)> {
    fence_members(c, v, secret_of(s).as_deref(), timeout(s))
}

/// The secret file of the session's blades, if it names one.
fn secret_of(s: &Session) -> Option<std::path::PathBuf> {
    match &s.blades {
        Blades::Remote { secret_file, .. } => secret_file.clone(),
        _ => None,
    }
}

/// The fence tags of the registrations of epochs before `v`'s (members,
/// and tag records of runs that did not leave cleanly).
///
/// # Errors
/// etcd errors.
pub fn earlier_tags(c: &Coordinator, v: &Versioned) -> Result<Vec<u64>> {
    let mut tags: Vec<u64> = c
        .fence_records()?
        .into_iter()
        .chain(c.members()?)
        .filter(|m| m.epoch < v.config.epoch && m.fence_tag != 0)
        .map(|m| m.fence_tag)
        .collect();
    tags.sort_unstable();
    tags.dedup();
    Ok(tags)
}

fn fence_members(
    c: &Coordinator,
    v: &Versioned,
    secret: Option<&std::path::Path>,
    t: Duration,
) -> Result<(String, Vec<u64>)> {
    // Every registration that did not leave cleanly (its lease may have
    // lapsed: a paused process is fenced too).
    let tags = earlier_tags(c, v)?;
    if tags.is_empty() {
        return Ok(("no compute blade of an earlier epoch had registered to fence".into(), tags));
    }
    let active = revoke_in_use(v, &tags, secret, t)?;
    let said = format!(
        "{} compute blade{} of earlier epochs fenced on memory blade{} {}",
        tags.len(),
        if tags.len() > 1 { "s" } else { "" },
        if active.len() > 1 { "s" } else { "" },
        active.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
    );
    Ok((said, tags))
}

/// Fences registrations `tags` on every memory blade `v` has in use, then
/// settles them in database `name` as the view with blades `out` out and
/// `joining` joining reads it (its mirror while blade 0 is out or joins).
/// Returns the blades fenced and what was settled (nothing if the
/// database does not exist).
///
/// # Errors
/// A blade that cannot be reached or refuses; the settling's errors.
pub fn fence_and_settle(
    s: &Session,
    v: &Versioned,
    rt: &mut Runtime,
    (name, out, joining): (&str, &[u16], &[u16]),
    tags: &[u64],
    lease: Duration,
) -> Result<(Vec<u16>, Vec<ford_dtx::recovery::Recovered>)> {
    let fenced = revoke_tags(s, v, tags)?;
    let (ctx, name, out, joining) = (rt.ctx(), name.to_string(), out.to_vec(), joining.to_vec());
    let (tags, wait_ms) = (tags.to_vec(), ford_dtx::recovery::settle_wait_ms(lease));
    let rec = rt.block_on(async move {
        let Some(db) = ford_dtx::db::Db::open_view(&ctx, &name, &out, &joining).await? else { return Ok(Vec::new()) };
        ford_dtx::recovery::settle(&ctx, &db, &tags, wait_ms).await
    })?;
    Ok((fenced, rec))
}

/// What settling did, for messages: `R rolled back, F rolled forward, L
/// locks released`.
pub fn settled(rec: &[ford_dtx::recovery::Recovered]) -> String {
    let sum = |f: fn(&ford_dtx::recovery::Recovered) -> u64| rec.iter().map(f).sum::<u64>();
    format!(
        "{} rolled back, {} rolled forward, {} locks released",
        sum(|r| r.rolled_back),
        sum(|r| r.rolled_forward),
        sum(|r| r.released)
    )
}

/// The fence tags of compute blades that registered and whose membership
/// is gone without their leaving: dead, or halted (a compute blade whose
/// etcd lease lapses stops locking and committing before it could have
/// expired), or paused.
///
/// # Errors
/// etcd errors.
pub fn dead_tags(c: &Coordinator) -> Result<Vec<u64>> {
    let live: std::collections::HashSet<u64> = c.members()?.iter().map(|m| m.fence_tag).collect();
    let mut dead: Vec<u64> =
        c.fence_records()?.into_iter().map(|m| m.fence_tag).filter(|t| *t != 0 && !live.contains(t)).collect();
    dead.sort_unstable();
    dead.dedup();
    Ok(dead)
}

/// [`dead_tags`], revoked on every memory blade `v` has in use, so that
/// none of their verbs lands again: their registrations may then be
/// settled like a failover's earlier epoch.
///
/// # Errors
/// etcd errors; a blade that cannot be reached or refuses.
pub fn reap(s: &Session, c: &Coordinator, v: &Versioned) -> Result<Vec<u64>> {
    let dead = dead_tags(c)?;
    if !dead.is_empty() {
        revoke_tags(s, v, &dead)?;
    }
    Ok(dead)
}

/// Revokes `tags` on every memory blade `v` has in use (a connection of
/// its own to each); returns those.
///
/// # Errors
/// A blade that cannot be reached or refuses.
pub fn revoke_tags(s: &Session, v: &Versioned, tags: &[u64]) -> Result<Vec<u16>> {
    revoke_in_use(v, tags, secret_of(s).as_deref(), timeout(s))
}

/// Revokes `tags` on every memory blade `v` has in use; returns those.
fn revoke_in_use(v: &Versioned, tags: &[u64], secret: Option<&std::path::Path>, t: Duration) -> Result<Vec<u16>> {
    let active = v.config.in_use();
    for b in &active {
        let addr = &v.config.blades[usize::from(*b)].addr;
        revoke_on(addr, tags, secret, t).with_context(|| format!("fencing on memory blade {b} ({addr})"))?;
    }
    Ok(active)
}

/// Revokes `tags` on the memory blade at `addr` (a connection of its own).
fn revoke_on(addr: &str, tags: &[u64], secret: Option<&std::path::Path>, t: Duration) -> Result<()> {
    let one = Blades::Remote {
        addrs: vec![addr.to_string()],
        link: crate::config::Link::Tcp,
        secret_file: secret.map(std::path::Path::to_path_buf),
    };
    let transport = one.connect()?;
    let rt = Runtime::new(&*transport, 0, RuntimeConfig { request_timeout: Some(t), ..RuntimeConfig::default() })?;
    let ctx = rt.ctx();
    for tag in tags {
        ctx.revoke(*tag)?;
    }
    Ok(())
}

/// After `rebuild` wrote the `lost` blades again: each now the blade at its
/// address in `s` with its identity, active, in the next epoch.
///
/// # Errors
/// etcd errors; verb errors.
pub fn readmit(s: &Session, e: &Entered, t: &dyn Transport, lost: &[u16]) -> Result<Versioned> {
    let ids = identities(s, t, &[])?;
    let back: Vec<(u16, String, u64)> =
        lost.iter().map(|b| (*b, e.addrs[usize::from(*b)].clone(), ids[usize::from(*b)])).collect();
    Ok(e.c.update(|c| c.readmit(&back).map(Some))?)
}

/// Before an online rebuild copies to blade `n` (adopted in its place):
/// blade `n` is now the blade at its address in `s` with its identity,
/// joining, in the next epoch; unless it is already (a copy that resumes).
///
/// # Errors
/// etcd errors; verb errors; a blade that is not a removed one.
pub fn join_blade(s: &Session, e: &Entered, t: &dyn Transport, n: u16) -> Result<Versioned> {
    let id = identities(s, t, &[])?[usize::from(n)];
    let addr = e.addrs[usize::from(n)].clone();
    Ok(e.c.update(|c| match &c.blades[usize::from(n)] {
        b if matches!(b.state, BladeState::Joining { .. }) && b.identity == id => Ok(None),
        _ => c.join(n, &addr, id).map(Some),
    })?)
}

/// After an online rebuild copied everything to blade `n`, joining since
/// the configuration `joined`: the blade active, in the next epoch, if the
/// configuration did not move meanwhile (a failure during the copy makes
/// another epoch, and the copy is not trusted).
///
/// # Errors
/// etcd errors; a configuration that moved.
pub fn take_in(e: &Entered, n: u16, joined: &Versioned) -> Result<Versioned> {
    let b = joined.config.blades[usize::from(n)].clone();
    let v = e.c.update(|c| {
        if c.epoch != joined.config.epoch {
            return Ok(None);
        }
        c.readmit(&[(n, b.addr.clone(), b.identity)]).map(Some)
    })?;
    if v.config.epoch != joined.config.epoch + 1 || v.config.blades[usize::from(n)].state != BladeState::Active {
        bail!(
            "the configuration moved during the copy (epoch {} now: {}): memory blade {n} is not taken in; run the \
             rebuild again",
            v.config.epoch,
            v.config.describe_blades()
        );
    }
    Ok(v)
}

/// Checks, before a rebuild of `lost` under a coordinator, that the
/// configuration takes them for lost (removed, or a new identity in their
/// place) and trusts the other blades as they are.
///
/// # Errors
/// etcd errors; a configuration that does not agree.
pub fn enter_rebuild(s: &Session, t: &dyn Transport, lost: &[u16], online: bool) -> Result<Option<Entered>> {
    let Some(url) = &s.coordinator else { return Ok(None) };
    let Blades::Remote { addrs, .. } = &s.blades else { bail!("--coordinator needs --blades") };
    let ids = identities(s, t, &[])?;
    let c = Coordinator::connect(url, timeout(s))?;
    let Some(v) = c.load()? else {
        bail!("the coordinator holds no configuration for cluster {:?}: nothing to rebuild under it", c.cluster())
    };
    if v.config.blades.len() != addrs.len() {
        bail!(
            "--blades names {} memory blades; the configuration (epoch {}) has {}",
            addrs.len(),
            v.config.epoch,
            v.config.blades.len()
        );
    }
    for (i, (b, id)) in v.config.blades.iter().zip(&ids).enumerate() {
        let is_lost = lost.contains(&(i as u16));
        match (&b.state, is_lost) {
            (BladeState::Active, true) if b.identity == *id => bail!(
                "--lost {i}: memory blade {i} ({}) is active in the configuration (epoch {}) and still the same \
                 blade: it is not lost",
                addrs[i],
                v.config.epoch
            ),
            (BladeState::Joining { epoch }, true) if !online => bail!(
                "--lost {i}: memory blade {i} ({}) is joining the configuration since epoch {epoch} (a `rebuild \
                 --online` copying to it did not finish): run that again to resume it",
                addrs[i]
            ),
            (BladeState::Joining { .. }, true) if b.identity != *id => bail!(
                "--lost {i}: memory blade {i} ({}) is not the blade joining the configuration (identity {id:#018x}, \
                 not {:#018x} at {}): list that one",
                addrs[i],
                b.identity,
                b.addr
            ),
            (BladeState::Removed { .. }, true) if b.identity == *id => bail!(
                "--lost {i}: memory blade {i} ({}) is the blade that was removed (identity {id:#018x}): a removed \
                 blade is not trusted again; start a fresh one (without its backing file) in its place",
                addrs[i]
            ),
            (_, true) => {}
            (BladeState::Removed { epoch, .. }, false) => {
                bail!("memory blade {i} ({}) was removed at epoch {epoch}: rebuild it too (--lost)", addrs[i])
            }
            (BladeState::Joining { .. }, false) => bail!(
                "memory blade {i} ({}) is joining the configuration (a `rebuild --online` of it did not finish): run \
                 that again first",
                addrs[i]
            ),
            (BladeState::Active, false) if b.identity != *id => bail!(
                "memory blade {i} ({}) is not the blade the configuration names (identity {id:#018x}, not {:#018x}): \
                 rebuild it too (--lost)",
                addrs[i],
                b.identity
            ),
            (BladeState::Active, false) => {}
        }
    }
    // Online, the compute blades follow the epochs of the copy instead.
    if !online && lost.contains(&0) && matches!(v.config.blades[0].state, BladeState::Removed { .. }) {
        blade0_quiet(s, &c, &v)?;
    }
    Ok(Some(Entered { c, v, addrs: addrs.clone() }))
}

/// Before blade 0, which a failover took out, is rebuilt: the compute
/// blades that went on without it registered in a database mirror and
/// renew no lease on the blades (a lease the rebuild could wait out), so
/// none may run (their memberships say which do), and every registration
/// that did not leave cleanly is fenced on the blades in use: none of its
/// verbs lands while, and after, the rebuild settles it.
///
/// # Errors
/// Compute blades running; etcd errors; fencing that fails.
fn blade0_quiet(s: &Session, c: &Coordinator, v: &Versioned) -> Result<()> {
    let running = c.members()?;
    if !running.is_empty() {
        let who: Vec<String> =
            running.iter().map(|m| format!("{} (pid {} on {}, epoch {})", m.what, m.pid, m.host, m.epoch)).collect();
        bail!(
            "--lost 0: {} compute blade{} run{} under the configuration (epoch {}): {}; without memory blade 0 they \
             registered in its mirror and renew no lease a rebuild could wait out: stop them (or let them end), then \
             rebuild",
            running.len(),
            if running.len() == 1 { "" } else { "s" },
            if running.len() == 1 { "s" } else { "" },
            v.config.epoch,
            who.join(", ")
        );
    }
    // No member runs: every recorded tag is a dead one's.
    reap(s, c, v)?;
    Ok(())
}

/// `compute-blade coordinator`.
///
/// # Errors
/// etcd errors; a blade to remove that the configuration does not have.
pub fn command(a: &crate::cli::CoordinatorArgs) -> Result<i32> {
    use crate::cli::CoordinatorAction;
    if !(a.timeout > 0.0 && a.timeout <= 3600.0) {
        bail!("--timeout must be positive, at most 3600 seconds");
    }
    let t = Duration::from_secs_f64(a.timeout);
    let c = Coordinator::connect(&a.coordinator, t)?;
    match a.action {
        CoordinatorAction::Show => {
            if a.blade.is_some() {
                bail!("--blade applies to `coordinator remove`");
            }
            if a.addr.is_some() {
                bail!("--addr applies to `coordinator spare` and `unspare`");
            }
            let v = c.load()?;
            let members = c.members()?;
            match &v {
                None => println!("cluster {:?} at {}: no configuration yet", c.cluster(), c.url()),
                Some(v) => {
                    println!("cluster {:?} at {}: epoch {}", c.cluster(), c.url(), v.config.epoch);
                    for (i, b) in v.config.blades.iter().enumerate() {
                        let state = match &b.state {
                            BladeState::Active => "active".to_string(),
                            BladeState::Removed { epoch, why } => format!("removed at epoch {epoch}: {why}"),
                            BladeState::Joining { epoch } => format!("joining since epoch {epoch}"),
                        };
                        println!("  memory blade {i}: {} identity {:#018x} {state}", b.addr, b.identity);
                    }
                    for s in &v.config.spares {
                        println!("  spare memory blade: {s}");
                    }
                    for (name, order) in &v.config.databases {
                        let o: Vec<String> = order.iter().map(|r| format!("{r:?}")).collect();
                        println!("  database {name:?}: replicas per table {}", o.join(" "));
                    }
                }
            }
            for m in &members {
                println!(
                    "  member: {} on {} pid {} under epoch {} (lease {:x}, fence tag {:#x})",
                    m.what, m.host, m.pid, m.epoch, m.lease, m.fence_tag
                );
            }
            if let Some(p) = &a.json {
                let rec =
                    serde_json::json!({ "cluster": c.cluster(), "config": v.map(|v| v.config), "members": members });
                std::fs::write(p, serde_json::to_string_pretty(&rec)? + "\n")?;
            }
            Ok(0)
        }
        CoordinatorAction::Spare | CoordinatorAction::Unspare => {
            let Some(addr) = &a.addr else { bail!("coordinator spare and unspare need --addr HOST:PORT") };
            if a.blade.is_some() {
                bail!("--blade applies to `coordinator remove`");
            }
            let add = matches!(a.action, CoordinatorAction::Spare);
            if add && addr.to_socket_addrs().map_or(true, |mut x| x.next().is_none()) {
                bail!("--addr {addr}: not a HOST:PORT that resolves");
            }
            let v = c.update(|cfg| if add { cfg.with_spare(addr) } else { cfg.without_spare(addr) }.map(Some))?;
            println!(
                "spares of the configuration (epoch {}): {}",
                v.config.epoch,
                if v.config.spares.is_empty() { "none".to_string() } else { v.config.spares.join(", ") }
            );
            Ok(0)
        }
        CoordinatorAction::Remove => {
            if a.addr.is_some() {
                bail!("--addr applies to `coordinator spare` and `unspare`");
            }
            let Some(b) = a.blade else { bail!("coordinator remove needs --blade N") };
            let v = c.update(|cfg| cfg.without(&[b], &a.why).map(Some))?;
            let (fenced, _) = fence_members(&c, &v, a.secret_file.as_deref(), t)?;
            println!(
                "memory blade {b} removed: the configuration is now epoch {} ({}); {fenced}",
                v.config.epoch,
                v.config.describe_blades()
            );
            Ok(0)
        }
    }
}
