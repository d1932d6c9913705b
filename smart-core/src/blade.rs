//! The memory-blade server of the TCP software RNIC.
//!
//! The blade stays passive, as in memory disaggregation: it runs no
//! application logic, only executes the one-sided verbs that arrive, in
//! order per connection (a connection is a QP), with real atomics on its
//! region. Each connection has its own thread; a batch arrives as one frame
//! and the responses to the frames of one `read` leave together in one
//! `write`, up to [`FLUSH_BYTES`]: past that they are sent before the next
//! frame runs, so whatever a client asks, a connection makes the blade hold
//! at most one frame's response (≤ 16 MiB) beyond that.
//!
//! Memory: all connections together hold at most
//! [`BladeServer::with_response_memory`] bytes of responses
//! ([`DEFAULT_RESPONSE_MEMORY`] by default) beyond a fixed
//! [`BASE_OUT`] each. A frame runs only once the room for its whole
//! response is taken from that budget; a connection that cannot get it
//! sends what it holds and then waits, reading nothing more from its
//! client (backpressure). A client that takes none of its responses for
//! [`HANDSHAKE_TIMEOUT`] is closed, which gives its share back.
//!
//! Durability: by default a WRITE completes once it is in the region (for a
//! file-backed region, in the page cache: it survives this process, not a
//! power loss). [`BladeServer::with_durable`] answers no batch before the
//! disk holds what it wrote.
//!
//! Limits: at most [`BladeServer::with_max_connections`] connections
//! ([`DEFAULT_MAX_CONNECTIONS`] by default: a compute blade at its largest,
//! 1024 threads, with its set-up and lease connections, and room for
//! others), and at most [`BladeServer::with_max_per_peer`] from one peer
//! (an IP address; by default [`ROOM_FOR_OTHERS`] fewer than the maximum,
//! so one host cannot take every connection); one beyond is told so in
//! its welcome and closed. An accept or
//! thread-start failure (e.g. out of file descriptors) is logged and
//! survived: the server backs off and keeps accepting. A handshake must be
//! complete within [`HANDSHAKE_TIMEOUT`] however slowly its bytes trickle;
//! a connection that sends no request within
//! [`BladeServer::with_idle_timeout`] of its handshake ([`IDLE_TIMEOUT`] by
//! default), or leaves part of a frame unsent for [`HANDSHAKE_TIMEOUT`], is
//! closed, so idle or stalled connections cannot keep clients out.
//!
//! Robustness: every WR is checked for bounds, alignment and region key; a
//! bad WR gets an error completion and puts only that connection's QP in the
//! error state (later batches are flushed until the client resets it). A
//! malformed, truncated or oversized frame, or a failed handshake, closes
//! only that connection, with the reason on stderr; the blade keeps serving.
//!
//! Fencing: a connection may name its owner (a tag frame), and a client
//! may revoke an owner; the blade then runs none of that owner's requests
//! any more (see [`crate::fence`]).
//!
//! Authentication: a blade given the cluster secret
//! ([`BladeServer::with_secret`]) runs nothing for a connection before it
//! proved it holds the secret, and takes tag and revoke frames only with a
//! proof (see [`crate::secret`]); without a secret, anyone who reaches the
//! port may do anything.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fence::{ConnFence, Fences, Revocable};
use crate::layout;
use crate::region::{NoPause, Region};
use crate::secret::Secret;
use crate::verbs::{Opcode, WcStatus};
use crate::wire::conn::{self, BladeVerbsInfo, QpEndpoint};
use crate::wire::{self, Header, Welcome, WrDesc, HEADER_LEN, MAX_FRAME, WR_DESC_LEN};

/// What the blade needs from an RDMA device to serve verbs clients (the
/// verbs backend implements it; the server itself stays device-free).
pub trait VerbsAcceptor: Send + Sync + std::fmt::Debug {
    /// The region's verbs information for clients.
    fn info(&self) -> BladeVerbsInfo;
    /// Creates a QP connected to `remote`; returns it (kept until the client
    /// disconnects; moved to the error state if its owner is revoked) and
    /// its own endpoint.
    ///
    /// # Errors
    /// A reason for the client.
    fn accept(&self, remote: &QpEndpoint) -> Result<(Box<dyn Revocable>, QpEndpoint), String>;
}

/// Responses held for one connection before they are sent mid-`read`.
pub const FLUSH_BYTES: usize = 1 << 20;

/// The whole handshake (greeting in) must take at most this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once unless configured otherwise: a compute blade
/// at its most threads (1024, one connection each per blade) plus its
/// set-up and lease connections, with room for 60 more.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024 + 64;

/// How long a connection may stay without its first request after its
/// handshake, unless configured otherwise.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Connections kept for other peers: one peer may hold this many fewer
/// than the maximum, unless configured otherwise.
pub const ROOM_FOR_OTHERS: usize = 32;

/// Bytes of responses all connections may hold together beyond
/// [`BASE_OUT`] each, unless configured otherwise: room for 16 of the
/// largest responses at once (ordinary batches need a few KiB).
pub const DEFAULT_RESPONSE_MEMORY: usize = 256 << 20;

/// Response buffer every connection keeps outside the shared budget.
pub const BASE_OUT: usize = 64 << 10;

/// Memory for responses shared by a blade's connections.
#[derive(Debug)]
struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    /// Takes `n` bytes if they fit (or if nothing is taken: one response
    /// can always be built, whatever the limit).
    fn try_take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur != 0 && cur + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A memory blade serving its region over TCP.
#[derive(Debug)]
pub struct BladeServer {
    listener: TcpListener,
    region: Arc<Region>,
    rkey: u32,
    stop: Arc<AtomicBool>,
    verbs: Option<Arc<dyn VerbsAcceptor>>,
    max_connections: usize,
    max_per_peer: Option<usize>,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    live: Arc<AtomicUsize>,
    durable: bool,
    fences: Arc<Fences>,
    budget: Arc<Budget>,
    secret: Option<Arc<Secret>>,
    /// The region's identity as the blade started (what proofs are bound
    /// to; a client WRITE of the superblock does not change it).
    identity: u64,
}

/// A blade server running on a background thread; stops when dropped, and
/// the drop returns once every connection's thread has let the region go
/// (at most 5 s), so that its backing file can be opened again at once.
#[derive(Debug)]
pub struct BladeHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
    live: Arc<AtomicUsize>,
}

impl BladeHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BladeHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Connection threads notice the stop within their 200 ms read
        // time-out; each lets the region go before it counts itself out.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.live.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl BladeServer {
    /// Binds `addr` (e.g. `127.0.0.1:0`) to serve `region`, formatting it if
    /// it is blank.
    ///
    /// # Errors
    /// If binding fails or the region holds an incompatible superblock.
    pub fn bind(addr: &str, region: Arc<Region>) -> io::Result<BladeServer> {
        layout::format_or_check(&region).map_err(io::Error::other)?;
        let identity = region.load_u64(layout::OFF_IDENTITY).map_err(io::Error::other)?;
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(BladeServer {
            listener,
            region,
            rkey: rand::random::<u32>() | 1,
            stop: Arc::new(AtomicBool::new(false)),
            verbs: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_peer: None,
            peers: Arc::default(),
            budget: Arc::new(Budget { used: AtomicUsize::new(0), limit: DEFAULT_RESPONSE_MEMORY }),
            secret: None,
            identity,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            live: Arc::new(AtomicUsize::new(0)),
            fences: Arc::new(Fences::default()),
            durable: false,
        })
    }

    /// Serves at most `n` connections at once (at least 1); one beyond is
    /// refused with [`wire::STATUS_FULL`] in its welcome.
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Serves only clients that prove they hold `secret` (see
    /// [`crate::secret`]).
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secret = Some(Arc::new(secret));
        self
    }

    /// Serves at most `n` connections from one peer (IP address) at once
    /// (at least 1; default: [`ROOM_FOR_OTHERS`] fewer than the maximum,
    /// or the maximum itself when it is at most twice that); one beyond is refused as when the blade is full.
    pub fn with_max_per_peer(mut self, n: usize) -> Self {
        self.max_per_peer = Some(n.max(1));
        self
    }

    /// The connections one peer may hold.
    pub fn max_per_peer(&self) -> usize {
        let most = self.max_connections;
        self.max_per_peer.unwrap_or(if most > 2 * ROOM_FOR_OTHERS { most - ROOM_FOR_OTHERS } else { most })
    }

    /// Lets all connections together hold at most `bytes` of responses
    /// beyond [`BASE_OUT`] each (default [`DEFAULT_RESPONSE_MEMORY`]); a
    /// connection whose next response does not fit waits, reading nothing
    /// more from its client, until others' responses are sent.
    pub fn with_response_memory(mut self, bytes: usize) -> Self {
        self.budget = Arc::new(Budget { used: AtomicUsize::new(0), limit: bytes });
        self
    }

    /// Bounds the whole handshake by `t` (default [`HANDSHAKE_TIMEOUT`]),
    /// and how long part of a frame may stay unsent.
    pub fn with_handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self
    }

    /// Closes a connection that sends no request within `t` of its
    /// handshake (default [`IDLE_TIMEOUT`]).
    pub fn with_idle_timeout(mut self, t: Duration) -> Self {
        self.idle_timeout = t;
        self
    }

    /// Answers no batch before the region's file holds what it wrote: the
    /// pages that a connection's WRITEs, CASes and FAAs changed are synced
    /// to the disk ([`Region::sync_data`]) before the responses that
    /// complete them are sent, so every completed verb survives a power
    /// loss, not only a crash of this process. Costs a disk flush per
    /// answer that completes a write. Serves TCP clients only: an RDMA
    /// client's writes reach the region without this process. As on
    /// persistent memory, visibility comes before durability: another
    /// connection's READ may return a write whose own batch is not answered
    /// yet (protocols that write under locks, as FORD's, never act on such
    /// a value).
    ///
    /// # Errors
    /// If the region is not backed by a file, or its file is on a file
    /// system kept in memory (tmpfs, ramfs), which a power loss empties.
    pub fn with_durable(mut self) -> io::Result<Self> {
        if !self.region.is_file_backed() {
            return Err(io::Error::other("durable serving needs a region backed by a file (--backing-file)"));
        }
        if let Some(fs) = self.region.memory_file_system()? {
            return Err(io::Error::other(format!(
                "the backing file is on {fs}, which keeps files in memory: nothing on it survives a power loss, \
                 so --durable would promise what it cannot keep; put the file on a disk"
            )));
        }
        self.durable = true;
        Ok(self)
    }

    /// Records the compute blades it refuses (revoked fence tags, see
    /// [`crate::fence`]) in the file at `path` too, and refuses those the
    /// file already names (a restart on the same backing file): use
    /// [`crate::fence::log_path`] of the backing file. Returns how many it
    /// refuses from the start.
    ///
    /// # Errors
    /// The file cannot be opened, read or written, or is not a file of
    /// revoked tags.
    pub fn with_fence_log(mut self, path: &std::path::Path) -> io::Result<(Self, usize)> {
        let identity = self.region.load_u64(layout::OFF_IDENTITY).map_err(io::Error::other)?;
        let (fences, n) = Fences::persistent(path, identity)?;
        self.fences = Arc::new(fences);
        Ok((self, n))
    }

    /// Also serves RDMA verbs clients: they get connection data for RC QPs
    /// through this port and then reach the region directly.
    pub fn with_verbs(mut self, verbs: Arc<dyn VerbsAcceptor>) -> Self {
        self.verbs = Some(verbs);
        self
    }

    /// The bound address.
    ///
    /// # Errors
    /// From the socket.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A flag that makes [`BladeServer::serve`] return when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Accepts and serves connections until the stop flag is set. Accept
    /// and thread-start failures are logged and survived (with a pause, so
    /// that an exhausted resource is not retried in a busy loop).
    ///
    /// # Errors
    /// None today; the signature leaves room for fatal listener errors.
    pub fn serve(&self) -> io::Result<()> {
        let mut last_complaint: Option<std::time::Instant> = None;
        let mut complain = |what: String| {
            // At most one line a second, however often it fails.
            if last_complaint.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                eprintln!("memory-blade: {what}; still serving");
                last_complaint = Some(std::time::Instant::now());
            }
        };
        while !self.stop.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.live.load(Ordering::Relaxed) >= self.max_connections {
                        refuse_full(stream);
                        complain(format!(
                            "refused a connection from {peer}: {} connections is the maximum",
                            self.max_connections
                        ));
                        continue;
                    }
                    let Some(from_peer) = PeerGuard::take(&self.peers, peer.ip(), self.max_per_peer()) else {
                        refuse_full(stream);
                        complain(format!(
                            "refused a connection from {peer}: {} connections from {} is the most one peer may hold",
                            self.max_per_peer(),
                            peer.ip()
                        ));
                        continue;
                    };
                    let region = self.region.clone();
                    let (rkey, stop, verbs) = (self.rkey, self.stop.clone(), self.verbs.clone());
                    let (live, deadline, durable) = (self.live.clone(), self.handshake_timeout, self.durable);
                    let idle_timeout = self.idle_timeout;
                    let (fences, budget) = (self.fences.clone(), self.budget.clone());
                    let (secret, identity) = (self.secret.clone(), self.identity);
                    live.fetch_add(1, Ordering::Relaxed);
                    let spawned = std::thread::Builder::new().name(format!("blade-{peer}")).spawn(move || {
                        // Declared first, dropped last: the connection counts
                        // itself out only after it let the region go.
                        let _live = LiveGuard(&live);
                        let _from_peer = from_peer;
                        let (region, verbs, fences, budget, secret) = (region, verbs, fences, budget, secret);
                        let how = Serving {
                            rkey,
                            verbs: verbs.as_deref(),
                            handshake_timeout: deadline,
                            idle_timeout,
                            durable,
                            fences: &fences,
                            budget: &budget,
                            secret: secret.as_deref(),
                            identity,
                        };
                        if let Err(reason) = serve_conn(stream, &region, &stop, how) {
                            eprintln!("memory-blade: closing connection from {peer}: {reason}");
                        }
                    });
                    if let Err(e) = spawned {
                        // The closure (and the stream) were dropped: the peer
                        // sees the connection close.
                        self.live.fetch_sub(1, Ordering::Relaxed);
                        complain(format!("cannot start a thread for {peer} ({e})"));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::Interrupted) => {}
                Err(e) => {
                    // E.g. out of file descriptors: back off, keep serving
                    // the connections there are.
                    complain(format!("accept failed ({e})"));
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Ok(())
    }

    /// Runs [`BladeServer::serve`] on a background thread.
    ///
    /// # Errors
    /// If the address cannot be read or the thread cannot start.
    pub fn spawn(self) -> io::Result<BladeHandle> {
        let addr = self.local_addr()?;
        let (stop, live) = (self.stop.clone(), self.live.clone());
        let thread = std::thread::Builder::new().name("blade-accept".into()).spawn(move || self.serve())?;
        Ok(BladeHandle { addr, stop, thread: Some(thread), live })
    }
}

/// Counts a connection as live while it is served.
struct LiveGuard<'a>(&'a AtomicUsize);

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Counts a connection against its peer's share while it is served.
struct PeerGuard {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerGuard {
    /// Counts one more connection from `ip`, unless it holds `most`.
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, most: usize) -> Option<PeerGuard> {
        let mut map = peers.lock().unwrap_or_else(PoisonError::into_inner);
        let n = map.entry(ip).or_insert(0);
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(PeerGuard { peers: peers.clone(), ip })
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut map = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Tells a connection beyond the maximum so, best effort, and closes it.
fn refuse_full(mut s: TcpStream) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
    let welcome =
        Welcome { version: wire::PROTOCOL_VERSION, status: wire::STATUS_FULL, size: 0, rkey: 0, flags: 0, identity: 0 };
    let _ = s.write_all(&welcome.encode());
}

/// Reads exactly `buf.len()` bytes before `deadline`, however slowly they
/// come.
fn read_until(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no complete greeting within the handshake time-out ({got} of {} bytes)", buf.len()));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err("connection closed during the handshake".into()),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) => return Err(format!("handshake: {e}")),
        }
    }
    Ok(())
}

/// How a connection is served (the server's settings).
struct Serving<'v> {
    rkey: u32,
    verbs: Option<&'v dyn VerbsAcceptor>,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    durable: bool,
    fences: &'v Fences,
    budget: &'v Budget,
    secret: Option<&'v Secret>,
    identity: u64,
}

/// Serves one connection; `Err` carries the reason for closing it early.
fn serve_conn(mut s: TcpStream, region: &Region, stop: &AtomicBool, how: Serving<'_>) -> Result<(), String> {
    let Serving { rkey, verbs, handshake_timeout, idle_timeout, durable, fences, budget, secret, identity } = how;
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut hello = [0u8; wire::HELLO_LEN];
    read_until(&mut s, &mut hello, Instant::now() + handshake_timeout)?;
    let (version, flags) = wire::parse_hello(&hello)?;
    let ok = version == wire::PROTOCOL_VERSION;
    let wants_verbs = flags & conn::FLAG_VERBS != 0;
    let status = match (ok, wants_verbs, verbs) {
        (false, _, _) => wire::STATUS_VERSION_MISMATCH,
        (true, true, None) => conn::STATUS_NO_VERBS,
        _ => wire::STATUS_OK,
    };
    let key = match (wants_verbs, verbs) {
        (true, Some(v)) => v.info().rkey,
        _ => rkey,
    };
    let flags = if secret.is_some() { wire::WELCOME_SECRET } else { 0 };
    let welcome = Welcome { version: wire::PROTOCOL_VERSION, status, size: region.len(), rkey: key, flags, identity };
    s.write_all(&welcome.encode()).map_err(|e| format!("handshake: {e}"))?;
    if !ok {
        return Err(format!("client speaks protocol version {version}, this blade speaks {}", wire::PROTOCOL_VERSION));
    }
    if wants_verbs {
        return match verbs {
            Some(v) => serve_verbs_control(s, v, stop, fences, secret.map(|k| (k, identity))),
            None => Err("client asked for RDMA verbs; this blade serves TCP only (--transport tcp)".into()),
        };
    }
    // Wake up now and then to notice a stop request; a client that takes
    // no responses for the handshake time-out is closed (its share of the
    // response budget comes back).
    s.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(handshake_timeout)).map_err(|e| e.to_string())?;
    let fence = fences.attach();
    // However this connection ends, it runs no request any more.
    let _left = Left(&fence);
    let mut conn = Conn {
        region,
        rkey,
        qp_error: false,
        out: Vec::with_capacity(BASE_OUT),
        held: 0,
        wanted: 0,
        budget,
        durable,
        wrote: false,
        fences,
        fence: &fence,
        refused: None,
        secret: secret.map(|k| (k, identity)),
        proven: secret.is_none(),
    };
    let mut buf = vec![0u8; 256 << 10];
    let (mut start, mut end) = (0usize, 0usize);
    // Since the handshake, while no request came; since a read brought
    // bytes that completed no frame, while none has completed.
    let (mut first_request, mut partial) = (Some(Instant::now()), None::<Instant>);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        if first_request.is_some_and(|t| t.elapsed() >= idle_timeout) && start == end {
            return Err(format!("no request within {idle_timeout:?} of the handshake (idle time-out)"));
        }
        if let Some(t) = partial.filter(|t| t.elapsed() >= handshake_timeout) {
            return Err(format!("{} bytes of a frame and not the rest for {:?} (time-out)", end - start, t.elapsed()));
        }
        if end == buf.len() {
            // Make room: drop consumed bytes, then grow up to one largest frame.
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
            if end == buf.len() {
                buf.resize((buf.len() * 2).min(HEADER_LEN + MAX_FRAME), 0);
            }
        }
        let n = match s.read(&mut buf[end..]) {
            Ok(0) if start == end => return Ok(()),
            Ok(0) => return Err(format!("connection closed inside a frame ({} bytes of it received)", end - start)),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(e) => return Err(e.to_string()),
        };
        end += n;
        let before = start;
        conn.out.clear();
        if !fence.enter() {
            return Err(fenced(&mut s, &buf[start..end]));
        }
        prefetch_frames(conn.region, conn.rkey, &buf[start..end]);
        while end - start >= HEADER_LEN {
            let h = Header::get(&buf[start..]);
            if h.len as usize > MAX_FRAME {
                return Err(format!("frame length {} exceeds the limit of {MAX_FRAME} bytes", h.len));
            }
            let total = HEADER_LEN + h.len as usize;
            if end - start < total {
                break;
            }
            let body = &buf[start + HEADER_LEN..start + total];
            if !conn.frame(h, body)? {
                // The budget has no room for its response: send what this
                // connection holds, then wait for room, reading nothing
                // more meanwhile, and run it.
                fence.leave();
                conn.send(&mut s)?;
                let mut pause = Duration::from_millis(1);
                while !conn.make_room(conn.wanted) {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                if !fence.enter() {
                    return Err(fenced(&mut s, &buf[start..end]));
                }
                let ran = conn.frame(h, body)?;
                debug_assert!(ran, "the room it waited for is taken");
            }
            start += total;
            if let Some(why) = conn.refused {
                // Its tag or credentials were refused: nothing after it runs.
                fence.leave();
                conn.send(&mut s)?;
                fenced(&mut s, &buf[start..end]);
                return Err(why.into());
            }
            if conn.out.len() >= FLUSH_BYTES {
                // Send before running more frames: the responses a client
                // can make the blade hold stay bounded. Not fenced while it
                // sends (a client that stops reading holds no revocation up).
                fence.leave();
                conn.send(&mut s)?;
                if !fence.enter() {
                    return Err(fenced(&mut s, &buf[start..end]));
                }
            }
        }
        fence.leave();
        if start != before {
            // Frames ran: the connection is in use, and no frame is stuck.
            first_request = None;
            partial = None;
        } else if start < end && partial.is_none() {
            // Bytes came that completed no frame: the clock of a stalled
            // frame starts (read only off the usual path).
            partial = Some(Instant::now());
        }
        if start == end {
            start = 0;
            end = 0;
        }
        if !conn.out.is_empty() {
            conn.send(&mut s)?;
        }
    }
}

/// Clears a connection's `busy` when it ends.
struct Left<'a>(&'a ConnFence);

impl Drop for Left<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Answers every complete request frame at the front of `bytes` with
/// [`WcStatus::Fenced`] (best effort: the connection closes next), and
/// says why it closes.
fn fenced(s: &mut TcpStream, bytes: &[u8]) -> String {
    let mut out = Vec::new();
    for (h, _) in complete_frames(bytes) {
        Header { len: 0, kind: WcStatus::Fenced as u8, count: 0, wr_id: h.wr_id }.put(&mut out);
    }
    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
    let _ = s.write_all(&out);
    REVOKED.into()
}

/// Hints the CPU to fetch the remote lines of every WR in the complete
/// frames at the front of `bytes`, before any of them runs: the batches that
/// arrive in one read (a compute thread's round) then wait for memory
/// together, as an RNIC works on many WRs at once, instead of one after
/// another. Malformed frames are left to `Conn::frame` to refuse.
fn prefetch_frames(region: &Region, rkey: u32, bytes: &[u8]) {
    for (h, mut body) in complete_frames(bytes).filter(|(h, _)| h.kind == wire::KIND_BATCH) {
        for _ in 0..usize::from(h.count).min(wire::MAX_WRS) {
            let Some(desc) = body.get(..WR_DESC_LEN) else { break };
            let d = WrDesc::get(desc);
            if d.rkey == rkey {
                region.prefetch(d.remote, u64::from(d.len));
            }
            let Some(rest) = body.get(WR_DESC_LEN + d.payload_len()..) else { break };
            body = rest;
        }
    }
}

/// The complete request frames at the front of `bytes` (header and body),
/// up to the first incomplete or oversized one.
fn complete_frames(mut bytes: &[u8]) -> impl Iterator<Item = (Header, &[u8])> {
    std::iter::from_fn(move || {
        let h = Header::get(bytes.get(..HEADER_LEN)?);
        let total = HEADER_LEN + h.len as usize;
        if h.len as usize > MAX_FRAME || bytes.len() < total {
            return None;
        }
        let body = &bytes[HEADER_LEN..total];
        bytes = &bytes[total..];
        Some((h, body))
    })
}

/// Answers a QP request that did not prove the secret with the reason
/// (best effort), and says why its connection closes.
fn refuse_unproven_qp(s: &mut TcpStream, wr_id: u64) -> String {
    let mut out = Vec::new();
    Header { len: UNPROVEN.len() as u32, kind: 1, count: 0, wr_id }.put(&mut out);
    out.extend_from_slice(UNPROVEN.as_bytes());
    let _ = s.write_all(&out);
    UNPROVEN.into()
}

/// Serves a verbs client's control connection: one QP per request, all
/// kept until it disconnects, each held by a fence of its own, which a
/// revocation of the tag it was requested under finds.
fn serve_verbs_control(
    mut s: TcpStream,
    v: &dyn VerbsAcceptor,
    stop: &AtomicBool,
    fences: &Fences,
    secret: Option<(&Secret, u64)>,
) -> Result<(), String> {
    s.write_all(&v.info().encode()).map_err(|e| format!("sending verbs info: {e}"))?;
    let mut qps: Vec<Arc<ConnFence>> = Vec::new();
    let mut hdr = [0u8; HEADER_LEN];
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        s.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
        match s.read(&mut hdr[..1]) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(e) => return Err(e.to_string()),
        }
        // A request has started: read the rest of it with a generous timeout.
        s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        s.read_exact(&mut hdr[1..]).map_err(|e| format!("reading a QP request: {e}"))?;
        let h = Header::get(&hdr);
        let n = h.len as usize;
        let sizes: &[usize] = match secret {
            None => &[conn::QP_ENDPOINT_LEN, conn::QP_TAGGED_LEN],
            Some(_) => &[conn::QP_PROVEN_LEN],
        };
        if h.kind != conn::KIND_QP_CONNECT || !sizes.contains(&n) {
            if secret.is_some() && h.kind == conn::KIND_QP_CONNECT && n <= conn::QP_TAGGED_LEN {
                return Err(refuse_unproven_qp(&mut s, h.wr_id));
            }
            return Err(format!("unexpected control frame (kind {}, {} bytes)", h.kind, h.len));
        }
        let mut request = [0u8; conn::QP_PROVEN_LEN];
        s.read_exact(&mut request[..n]).map_err(|e| format!("reading a QP request: {e}"))?;
        let mut body = [0u8; conn::QP_TAGGED_LEN];
        match secret {
            None => body[..n].copy_from_slice(&request[..n]),
            Some((key, identity)) => match key.verify(h.kind, &request[..n], identity) {
                Some(b) => body.copy_from_slice(b),
                None => return Err(refuse_unproven_qp(&mut s, h.wr_id)),
            },
        }
        let tag = u64::from_le_bytes(body[conn::QP_ENDPOINT_LEN..].try_into().expect("8 bytes"));
        // The QP is accepted inside its fence's barrier: a revocation of its
        // tag either refuses it here or finds it held.
        let fence = fences.attach();
        fence.enter();
        let answer = QpEndpoint::decode(&body[..conn::QP_ENDPOINT_LEN]).and_then(|remote| {
            if tag != 0 && !fences.tag(&fence, tag) {
                return Err(format!("{} (fence tag {tag:#x})", crate::fence::REFUSED));
            }
            v.accept(&remote)
        });
        let mut out = Vec::with_capacity(HEADER_LEN + 64);
        match answer {
            Ok((qp, mine)) => {
                fence.hold(qp);
                qps.push(fence.clone());
                Header { len: conn::QP_ENDPOINT_LEN as u32, kind: 0, count: 0, wr_id: h.wr_id }.put(&mut out);
                out.extend_from_slice(&mine.encode());
            }
            Err(reason) => {
                Header { len: reason.len() as u32, kind: 1, count: 0, wr_id: h.wr_id }.put(&mut out);
                out.extend_from_slice(reason.as_bytes());
            }
        }
        fence.leave();
        s.write_all(&out).map_err(|e| format!("answering a QP request: {e}"))?;
    }
}

struct Conn<'r> {
    region: &'r Region,
    rkey: u32,
    qp_error: bool,
    out: Vec<u8>,
    /// Bytes of `out`'s capacity beyond [`BASE_OUT`], taken from `budget`.
    held: usize,
    /// The room the frame that could not run needs.
    wanted: usize,
    budget: &'r Budget,
    /// Serving durably: answers wait until the disk holds their writes.
    durable: bool,
    /// This connection wrote since its last answer.
    wrote: bool,
    fences: &'r Fences,
    fence: &'r ConnFence,
    /// Why nothing after the frame just run may run (a tag frame named a
    /// revoked owner; a frame without the proof the blade requires).
    refused: Option<&'static str>,
    /// The secret that proofs must verify with, and this blade's identity.
    secret: Option<(&'r Secret, u64)>,
    /// Whether the connection proved it holds the secret (or none is
    /// required).
    proven: bool,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

/// Why a connection that named a revoked owner is closed.
const REVOKED: &str = "its owner was revoked (a recovery took that compute blade for dead): its requests are refused";

/// Why a connection that did not prove the cluster secret is closed.
const UNPROVEN: &str = "it did not prove it holds the cluster secret (this blade runs with --secret-file): refused";

impl Conn<'_> {
    /// Answers frame `h` with `status`, and nothing after it runs: the
    /// connection closes, for `why`.
    fn refuse(&mut self, h: Header, status: WcStatus, why: &'static str) -> Result<(), String> {
        Header { len: 0, kind: status as u8, count: 0, wr_id: h.wr_id }.put(&mut self.out);
        self.refused = Some(why);
        Ok(())
    }

    /// Makes `out` able to take `need` more bytes without growing past
    /// what the budget gave it: `false` if the budget has no room now.
    #[inline]
    fn make_room(&mut self, need: usize) -> bool {
        self.out.len() + need <= self.out.capacity() || self.grow(need)
    }

    /// [`Conn::make_room`] when `out` must grow.
    #[cold]
    fn grow(&mut self, need: usize) -> bool {
        let want = self.out.len() + need;
        let had = self.out.capacity();
        let more = want - had.max(BASE_OUT).min(want);
        if !self.budget.try_take(more) {
            return false;
        }
        self.out.reserve_exact(need);
        let grown = self.out.capacity().saturating_sub(BASE_OUT);
        if grown > self.held + more {
            // The allocator rounded up: count that too.
            self.budget.used.fetch_add(grown - self.held - more, Ordering::AcqRel);
            self.held = grown;
        } else {
            self.budget.give(self.held + more - grown);
            self.held = grown;
        }
        true
    }

    /// Sends the responses gathered, after syncing what they complete when
    /// serving durably: one `fdatasync` of the file, however many writes
    /// the answer completes (it also writes back pages other connections
    /// changed, which their own answers then find clean). A failed sync
    /// closes the connection unanswered: its client never sees a completion
    /// for a write the disk may not hold.
    fn send(&mut self, s: &mut TcpStream) -> Result<(), String> {
        if self.durable && self.wrote {
            self.region.sync_data().map_err(|e| {
                format!("syncing the backing file failed ({e}): the writes of this answer may not be on disk")
            })?;
        }
        self.wrote = false;
        s.write_all(&self.out).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                "its client took none of its responses for the handshake time-out".to_string()
            }
            _ => format!("sending responses: {e}"),
        })?;
        self.out.clear();
        if self.held > 0 {
            // A large response grew it: give the memory back.
            self.out = Vec::with_capacity(BASE_OUT);
            self.budget.give(self.held);
            self.held = 0;
        }
        Ok(())
    }

    /// Handles one request frame, appending its response to `out`:
    /// `Ok(false)`, and nothing done, when its response does not fit in
    /// what the budget gives now (it needs [`Conn::wanted`] more bytes).
    fn frame(&mut self, h: Header, body: &[u8]) -> Result<bool, String> {
        if !self.make_room(HEADER_LEN) {
            self.wanted = HEADER_LEN;
            return Ok(false);
        }
        if !self.proven && !matches!(h.kind, wire::KIND_TAG | wire::KIND_REVOKE) {
            return self.refuse(h, WcStatus::RemoteAccess, UNPROVEN).map(|()| true);
        }
        if h.kind == wire::KIND_BATCH {
            return self.batch(h, body);
        }
        self.control(h, body).map(|()| true)
    }

    /// A frame other than a batch (each answered with a header alone).
    fn control(&mut self, h: Header, body: &[u8]) -> Result<(), String> {
        match h.kind {
            wire::KIND_RESET => {
                if h.count != 0 || !body.is_empty() {
                    return Err("malformed reset frame".into());
                }
                self.qp_error = false;
                Header { len: 0, kind: 0, count: 0, wr_id: h.wr_id }.put(&mut self.out);
                Ok(())
            }
            wire::KIND_TAG | wire::KIND_REVOKE => {
                let body = match self.secret {
                    None => body,
                    Some((key, identity)) => match key.verify(h.kind, body, identity) {
                        Some(b) => {
                            self.proven = true;
                            b
                        }
                        None => return self.refuse(h, WcStatus::RemoteAccess, UNPROVEN),
                    },
                };
                let tag = match <[u8; wire::TAG_LEN]>::try_from(body) {
                    // With a proof, a tag frame may name no owner.
                    Ok(b)
                        if h.count == 0 && (u64::from_le_bytes(b) != 0 || self.proven && h.kind == wire::KIND_TAG) =>
                    {
                        u64::from_le_bytes(b)
                    }
                    _ => return Err("malformed tag or revoke frame (it carries one non-zero 8-byte tag)".into()),
                };
                if tag == 0 {
                    // Proved the secret, names no owner.
                    Header { len: 0, kind: 0, count: 0, wr_id: h.wr_id }.put(&mut self.out);
                    return Ok(());
                }
                let kind = if h.kind == wire::KIND_TAG {
                    let had = self.fence.tag();
                    if had != 0 && had != tag {
                        return Err("a connection names its owner once".into());
                    }
                    if self.fences.tag(self.fence, tag) {
                        0
                    } else {
                        return self.refuse(h, WcStatus::Fenced, REVOKED);
                    }
                } else {
                    match self.fences.revoke(tag, self.fence) {
                        Ok(()) => 0,
                        Err(why) => {
                            eprintln!("memory-blade: revoking fence tag {tag:#x} failed: {why}");
                            WcStatus::Transport as u8
                        }
                    }
                };
                Header { len: 0, kind, count: 0, wr_id: h.wr_id }.put(&mut self.out);
                Ok(())
            }
            k => Err(format!("unknown frame kind {k}")),
        }
    }

    /// Runs a batch: `Ok(false)`, and nothing run, if its response does
    /// not fit in what the budget gives now.
    fn batch(&mut self, h: Header, body: &[u8]) -> Result<bool, String> {
        let n = h.count as usize;
        if n == 0 || n > wire::MAX_WRS {
            return Err(format!("batch of {n} WRs (must be 1 to {})", wire::MAX_WRS));
        }
        // First pass: the frame's structure must be exact before any WR
        // runs, and its whole response must fit.
        let (mut p, mut need) = (0usize, HEADER_LEN);
        for _ in 0..n {
            let d = WrDesc::get(body.get(p..p + WR_DESC_LEN).ok_or("frame ends inside a WR descriptor")?);
            p += WR_DESC_LEN + d.payload_len();
            need += d.response_len();
            if p > body.len() {
                return Err("frame ends inside a WRITE payload".into());
            }
        }
        if p != body.len() {
            return Err(format!("frame has {} stray bytes after its WRs", body.len() - p));
        }
        let need = need.min(HEADER_LEN + MAX_FRAME);
        if !self.make_room(need) {
            self.wanted = need;
            return Ok(false);
        }
        let head = self.out.len();
        Header { len: 0, kind: 0, count: 0, wr_id: h.wr_id }.put(&mut self.out);
        let mut status = Ok(());
        let mut failed = 0u16;
        let mut p = 0usize;
        for i in 0..n {
            let d = WrDesc::get(&body[p..p + WR_DESC_LEN]);
            p += WR_DESC_LEN;
            let payload = &body[p..p + d.payload_len()];
            p += d.payload_len();
            let r = if self.qp_error { Err(WcStatus::Flushed) } else { self.execute(&d, payload, head) };
            if let Err(s) = r {
                self.qp_error = true;
                status = Err(s);
                failed = i as u16;
                break;
            }
        }
        let len = (self.out.len() - head - HEADER_LEN) as u32;
        let hdr = Header { len, kind: wire::status_byte(status), count: failed, wr_id: h.wr_id };
        self.out[head..head + HEADER_LEN].copy_from_slice(&hdr.encode());
        Ok(true)
    }

    fn execute(&mut self, d: &WrDesc, payload: &[u8], head: usize) -> Result<(), WcStatus> {
        let op = Opcode::from_u8(d.op).ok_or(WcStatus::RemoteInvalidRequest)?;
        if d.rkey != self.rkey {
            return Err(WcStatus::RemoteAccess);
        }
        match op {
            Opcode::Read => {
                self.region.check(d.remote, u64::from(d.len))?;
                let at = self.out.len();
                if at - head - HEADER_LEN + d.len as usize > MAX_FRAME {
                    return Err(WcStatus::RemoteInvalidRequest);
                }
                self.out.resize(at + d.len as usize, 0);
                self.region.read_into(d.remote, &mut self.out[at..], &mut NoPause);
            }
            Opcode::Write => {
                self.region.check(d.remote, u64::from(d.len))?;
                self.region.write_from(d.remote, payload, &mut NoPause);
                self.wrote = true;
            }
            Opcode::Cas | Opcode::Faa => {
                if d.len != 8 {
                    return Err(WcStatus::RemoteInvalidRequest);
                }
                let old = if op == Opcode::Cas {
                    self.region.cas(d.remote, d.compare_add, d.swap)?
                } else {
                    self.region.faa(d.remote, d.compare_add)?
                };
                self.wrote = true;
                self.out.extend_from_slice(&old.to_le_bytes());
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn batch(count: u16, descs: &[WrDesc], tail: &[u8], declared: Option<u32>) -> Vec<u8> {
        let mut body = Vec::new();
        for d in descs {
            d.put(&mut body);
        }
        body.extend_from_slice(tail);
        let mut f = Vec::new();
        let len = declared.unwrap_or(body.len() as u32);
        Header { len, kind: wire::KIND_BATCH, count, wr_id: 1 }.put(&mut f);
        f.extend_from_slice(&body);
        f
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The hints run on bytes no check has seen yet: whatever a client
        /// sends (junk, truncated frames, counts and lengths that lie, huge
        /// offsets), they must neither panic nor touch memory.
        #[test]
        fn prefetching_any_bytes_is_harmless(
            junk in proptest::collection::vec(any::<u8>(), 0..600),
            count in 0u16..40,
            remote in prop_oneof![Just(0u64), Just(4090), any::<u64>()],
            len in prop_oneof![Just(8u32), Just(5000), any::<u32>()],
            op in 0u8..6,
            declared in proptest::option::of(any::<u32>()),
            cut in 0usize..200,
        ) {
            let region = Region::anonymous(4096).unwrap();
            prefetch_frames(&region, 7, &junk);
            let d = WrDesc { op, rkey: 7, remote, len, compare_add: 0, swap: 0 };
            let mut f = batch(count, &[d, d], &junk[..junk.len().min(64)], declared);
            f.extend_from_slice(&junk);
            prefetch_frames(&region, 7, &f);
            prefetch_frames(&region, 7, &f[..f.len().saturating_sub(cut)]);
        }
    }

    /// A region that is not backed by a file cannot serve durably; a file's
    /// sync succeeds. (That a durable blade's answers wait for the disk is
    /// tested by a power loss, in the root package's
    /// `dtx::a_durable_blade_loses_no_committed_transaction_when_the_power_fails`.)
    #[test]
    fn durable_serving_needs_a_file_backed_region_whose_sync_succeeds() {
        let anon = Arc::new(Region::anonymous(1 << 20).unwrap());
        assert!(BladeServer::bind("127.0.0.1:0", anon).unwrap().with_durable().is_err());
        let path = std::env::temp_dir().join(format!("smart-durable-unit-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let region = Region::file_backed(&path, Some(1 << 20)).unwrap();
        region.store_u64(4096 * 200, 0x5eed).unwrap();
        region.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[4096 * 200..4096 * 200 + 8], 0x5eed_u64.to_le_bytes());
        drop(region);
        std::fs::remove_file(&path).unwrap();
    }
}
