//! The TCP backend: a software RNIC talking to `memory-blade` processes.
//!
//! Each worker thread opens one connection per memory blade (its QP to that
//! blade). Posting encodes the batch as one frame into the connection's send
//! buffer (the doorbell); the runtime's next CQ poll, which follows the
//! executor round in which coroutines posted, sends all frames queued on a
//! connection with one `write` — so a batch never costs more than one
//! syscall, and the coroutines of a thread share them, the way doorbell
//! batching lets WRs share an MMIO. (Sending each frame at once made the
//! blade thread wake per frame; measured in the README.) Polling then reads
//! whatever responses have arrived, without blocking, and scatters READ data
//! and atomic results into the thread's local memory. When the runtime is idle it blocks in `poll(2)`
//! for up to a millisecond instead of spinning, which matters on machines
//! where the blade and the compute threads share few cores.
//!
//! A broken connection completes every batch in flight on it, and every
//! later one, with [`WcStatus::Transport`]; nothing waits forever.
//!
//! QPs follow the transport's [`crate::smart::QpPlan`]. A QP shared
//! by several threads (`shared`, `multiplexed:K`) is one connection behind a
//! lock: any of its threads sends the queued frames and receives responses,
//! delivering each to the thread that posted it (see
//! `softnic`). Every post rings the QP's emulated doorbell.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use super::softnic::{self, SoftNic, SoftPort};
use super::{validate_batch, BladeInfo, Endpoint, LocalMem, Silence, ThreadSpec, Transport};
use crate::secret::Secret;
use crate::smart::QpPlan;
use crate::verbs::{Completion, Opcode, WcStatus, WorkRequest};
use crate::wire::{self, Header, Welcome, WrDesc, HEADER_LEN, MAX_FRAME, WR_DESC_LEN};
use crate::{Error, Result};

/// How long connecting and the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Queued request bytes past which `post` sends at once.
const SEND_NOW: usize = 256 << 10;

/// wr_id of the internal reset frame (never a runtime wr_id, whose top 16
/// bits are zero).
const RESET_WR_ID: u64 = u64::MAX;

/// Connections to memory blades over TCP.
#[derive(Debug)]
pub struct TcpTransport {
    peers: Vec<String>,
    infos: Vec<BladeInfo>,
    nic: Arc<SoftNic<Conn>>,
    silence: Arc<Silence>,
    /// The cluster secret, to prove to blades that require it.
    secret: Option<Arc<Secret>>,
    /// What each blade said in its welcome (its identity, whether it
    /// requires proofs).
    welcomes: Vec<Welcome>,
    /// Why each blade is absent ([`TcpTransport::connect_without`]), or
    /// `None`.
    absent: Vec<Option<String>>,
}

impl TcpTransport {
    /// Connects to each blade once to check that it is a compatible memory
    /// blade and to learn its size and rkey. Blade `i` of the result is
    /// `addrs[i]`.
    ///
    /// # Errors
    /// If a blade is unreachable, not a memory blade, or of another version.
    pub fn connect(addrs: &[String]) -> Result<TcpTransport> {
        Self::connect_with(addrs, None)
    }

    /// [`TcpTransport::connect`], proving `secret` (see [`crate::secret`])
    /// to the blades that require it.
    ///
    /// # Errors
    /// As [`TcpTransport::connect`]; a blade that requires a secret when
    /// `secret` is `None`.
    pub fn connect_with(addrs: &[String], secret: Option<Secret>) -> Result<TcpTransport> {
        Self::connect_without(addrs, secret, &[])
    }

    /// [`TcpTransport::connect_with`] without the blades of `absent`, each
    /// given with its size and rkey as an earlier transport learned them
    /// ([`Transport::blades`]; `None`: unknown, then the largest other
    /// blade's size, which serves only to check addresses, none of which
    /// is used on an absent blade) and why it is absent: no connection is
    /// made to them, and every batch to one fails at once (a transport
    /// error naming why), so that a run goes on over the other blades with
    /// every address unchanged (a blade taken out of a cluster's
    /// configuration after it failed).
    ///
    /// # Errors
    /// As [`TcpTransport::connect_with`] for the other blades; an absent
    /// blade that is not one of `addrs`.
    pub fn connect_without(
        addrs: &[String],
        secret: Option<Secret>,
        absent: &[(u16, Option<BladeInfo>, String)],
    ) -> Result<TcpTransport> {
        if let Some((b, ..)) = absent.iter().find(|(b, ..)| usize::from(*b) >= addrs.len()) {
            return Err(Error::NoSuchBlade(*b, addrs.len()));
        }
        if addrs.is_empty() || addrs.len() > crate::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!(
                "{} blade addresses: need 1 to {}",
                addrs.len(),
                crate::addr::MAX_BLADES
            )));
        }
        let (mut infos, mut welcomes) = (Vec::with_capacity(addrs.len()), Vec::with_capacity(addrs.len()));
        let mut gone = vec![None; addrs.len()];
        let out = |i: usize| absent.iter().find(|(b, ..)| usize::from(*b) == i);
        for (i, a) in addrs.iter().enumerate() {
            let w = match out(i) {
                // Its size and rkey filled in below, once the present
                // blades' are known.
                Some((_, _, why)) => {
                    gone[i] = Some(format!("memory blade {i} ({a}) is absent: {why}"));
                    Welcome { version: wire::PROTOCOL_VERSION, status: 0, size: 0, rkey: 0, flags: 0, identity: 0 }
                }
                None => {
                    let (_, w) = greet(a, wire::PROTOCOL_VERSION, 0)?;
                    needs_secret(a, &w, secret.as_ref())?;
                    w
                }
            };
            welcomes.push(w);
        }
        let largest = welcomes.iter().map(|w| w.size).max().unwrap_or(0);
        for (i, w) in welcomes.iter_mut().enumerate() {
            if let Some((_, info, _)) = out(i) {
                let info = info.unwrap_or(BladeInfo { size: largest, rkey: 0 });
                (w.size, w.rkey) = (info.size, info.rkey);
            }
            infos.push(BladeInfo { size: w.size, rkey: w.rkey });
        }
        let nic = Arc::new(SoftNic::new(addrs.len()));
        let (peers, silence, secret) = (addrs.to_vec(), Silence::new(addrs.len()), secret.map(Arc::new));
        Ok(TcpTransport { peers, infos, nic, silence, secret, welcomes, absent: gone })
    }
}

/// Connects to `peer` and performs the versioned handshake.
///
/// # Errors
/// [`Error::Io`] if unreachable; [`Error::Handshake`] naming the mismatch.
pub fn handshake(peer: &str, version: u32) -> Result<(TcpStream, BladeInfo)> {
    handshake_with(peer, version, 0)
}

/// [`handshake`] with greeting `flags`; a verbs client reads the blade's
/// verbs information from the stream next.
///
/// # Errors
/// As [`handshake`]; a blade that does not serve verbs is named as such.
pub fn handshake_with(peer: &str, version: u32, flags: u32) -> Result<(TcpStream, BladeInfo)> {
    let (s, w) = greet(peer, version, flags)?;
    Ok((s, BladeInfo { size: w.size, rkey: w.rkey }))
}

/// What a client is told when a blade requires the cluster secret and it
/// has none.
pub const NEEDS_SECRET: &str = "this memory blade serves only holders of the cluster secret (it runs with \
     --secret-file): pass the same file with --secret-file";

/// `Err` if the blade at `peer`, which said `w`, requires a secret and
/// there is none.
///
/// # Errors
/// As said.
pub fn needs_secret(peer: &str, w: &Welcome, secret: Option<&Secret>) -> Result<()> {
    if w.wants_secret() && secret.is_none() {
        return Err(Error::Handshake { peer: peer.to_string(), reason: NEEDS_SECRET.into() });
    }
    Ok(())
}

/// [`handshake_with`], returning the blade's whole welcome (its identity,
/// whether it requires proofs of the secret).
///
/// # Errors
/// As [`handshake_with`].
pub fn greet(peer: &str, version: u32, flags: u32) -> Result<(TcpStream, Welcome)> {
    let io = |source| Error::Io { peer: peer.to_string(), cause: source };
    let hs = |reason: String| Error::Handshake { peer: peer.to_string(), reason };
    let addr = peer.to_socket_addrs().map_err(io)?.next().ok_or_else(|| hs("address resolves to nothing".into()))?;
    let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT)).map_err(io)?;
    s.write_all(&wire::hello_with(version, flags)).map_err(io)?;
    let mut w = [0u8; wire::WELCOME_LEN];
    s.read_exact(&mut w).map_err(|e| {
        let why = if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            format!("no answer to the greeting within {CONNECT_TIMEOUT:?} (time-out)")
        } else {
            format!("no answer to the greeting ({e})")
        };
        hs(format!("{why}; is this a memory-blade port?"))
    })?;
    let welcome = Welcome::decode(&w).map_err(hs)?;
    if welcome.status == wire::STATUS_FULL {
        return Err(hs(
            "the memory blade refuses: it serves its maximum number of connections (its --max-connections); \
             use fewer threads or raise the limit"
                .into(),
        ));
    }
    if welcome.status == crate::wire::conn::STATUS_NO_VERBS {
        return Err(hs("this memory blade serves TCP only: start it with --transport verbs".into()));
    }
    if welcome.status != wire::STATUS_OK || welcome.version != version {
        return Err(hs(format!(
            "protocol version mismatch: this compute blade speaks {version}, the memory blade speaks {}; \
             run the same Smart-rs release on both sides",
            welcome.version
        )));
    }
    s.set_read_timeout(None).map_err(io)?;
    Ok((s, welcome))
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
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

    fn silence(&self) -> Option<Arc<Silence>> {
        Some(self.silence.clone())
    }

    fn open_thread(&self, thread: usize, spec: ThreadSpec) -> Result<Box<dyn Endpoint>> {
        let port = SoftPort::open(&self.nic, thread, spec.local_bytes, |b| self.connect_qp(b, spec.fence_tag))?;
        // One pollfd per QP at most: sized now, so that waiting never
        // allocates (the first wait may come long after warm-up).
        let fds = Vec::with_capacity(port.qps.len());
        Ok(Box::new(TcpEndpoint { port, failed: Vec::new(), fds, secret: self.secret.clone() }))
    }
}

impl TcpTransport {
    /// Opens one QP (connection) to blade `b`, naming its owner `tag` (0:
    /// none).
    fn connect_qp(&self, b: usize, tag: u64) -> Result<Conn> {
        if let Some(why) = &self.absent[b] {
            return Ok(Conn::absent(&self.peers[b], b as u16, why.clone(), self.silence.clone()));
        }
        // A blade found silent gets no new connection (it would wait for
        // the handshake's time-out).
        self.silence.check(b as u16)?;
        let peer = &self.peers[b];
        let (mut stream, now) = greet(peer, wire::PROTOCOL_VERSION, 0)?;
        if now.size != self.infos[b].size || now.identity != self.welcomes[b].identity {
            return Err(Error::Handshake {
                peer: peer.clone(),
                reason: "another blade (size or identity) than when the transport connected".into(),
            });
        }
        let proof = now.wants_secret().then(|| self.secret.as_deref().map(|k| (k, now.identity))).flatten();
        if tag != 0 || proof.is_some() {
            // To a blade that requires it, a connection proves the secret
            // first, naming its owner or none.
            let status = control(&mut stream, peer, wire::KIND_TAG, tag, CONNECT_TIMEOUT, proof)?;
            if status == WcStatus::Fenced as u8 {
                return Err(Error::Handshake {
                    peer: peer.clone(),
                    reason: format!("{} (fence tag {tag:#x})", crate::fence::REFUSED),
                });
            }
            if status != 0 {
                return Err(Error::Handshake { peer: peer.clone(), reason: format!("tag refused (status {status})") });
            }
        }
        stream.set_nonblocking(true).map_err(|source| Error::Io { peer: peer.clone(), cause: source })?;
        Ok(Conn {
            stream: Some(stream),
            peer: peer.clone(),
            out: Vec::with_capacity(64 << 10),
            sent: 0,
            inb: vec![0; 256 << 10],
            start: 0,
            end: 0,
            sq: VecDeque::new(),
            batches: VecDeque::new(),
            broken: None,
            fenced: false,
            blade: b as u16,
            silence: self.silence.clone(),
        })
    }
}

/// How long a revocation may take on one blade: it waits for the requests
/// that the owner's connections are running there.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends a tag or revoke frame on a blocking stream, with a proof of the
/// secret for the blade of the identity given, and returns the status of
/// its answer.
fn control(
    s: &mut TcpStream,
    peer: &str,
    kind: u8,
    tag: u64,
    timeout: Duration,
    proof: Option<(&Secret, u64)>,
) -> Result<u8> {
    let io = |source| Error::Io { peer: peer.to_string(), cause: source };
    let mut body = tag.to_le_bytes().to_vec();
    if let Some((key, identity)) = proof {
        key.prove(kind, &mut body, identity);
    }
    let mut f = Vec::with_capacity(HEADER_LEN + body.len());
    Header { len: body.len() as u32, kind, count: 0, wr_id: 0 }.put(&mut f);
    f.extend_from_slice(&body);
    s.write_all(&f).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).map_err(io)?;
    s.set_read_timeout(None).map_err(io)?;
    let h = Header::get(&h);
    if h.len != 0 || h.wr_id != 0 {
        return Err(Error::Handshake { peer: peer.to_string(), reason: "malformed answer to a control frame".into() });
    }
    if h.kind == WcStatus::RemoteAccess as u8 {
        return Err(Error::Handshake {
            peer: peer.to_string(),
            reason: "the memory blade refused this compute blade's proof of the cluster secret: its --secret-file \
                     holds another secret"
                .into(),
        });
    }
    Ok(h.kind)
}

/// Makes memory blade `peer` refuse every connection whose owner is `tag`
/// (see [`crate::fence`]): returns once none of them runs a request there.
///
/// # Errors
/// An unreachable blade, one that does not answer within
/// [`REVOKE_TIMEOUT`], or an older blade that does not know the request.
pub fn revoke(peer: &str, tag: u64) -> Result<()> {
    revoke_with(peer, tag, None)
}

/// [`revoke`], proving `secret` to a blade that requires it.
///
/// # Errors
/// As [`revoke`]; a blade that requires a secret when `secret` is `None`
/// or refuses the one given.
pub fn revoke_with(peer: &str, tag: u64, secret: Option<&Secret>) -> Result<()> {
    let (mut s, w) = greet(peer, wire::PROTOCOL_VERSION, 0)?;
    needs_secret(peer, &w, secret)?;
    let proof = secret.filter(|_| w.wants_secret()).map(|k| (k, w.identity));
    match control(&mut s, peer, wire::KIND_REVOKE, tag, REVOKE_TIMEOUT, proof)? {
        0 => Ok(()),
        st => Err(Error::Handshake { peer: peer.to_string(), reason: format!("revocation refused (status {st})") }),
    }
}

#[derive(Debug)]
struct Conn {
    /// `None` for an absent blade (then `broken` says why).
    stream: Option<TcpStream>,
    peer: String,
    /// Encoded frames not yet accepted by the socket.
    out: Vec<u8>,
    sent: usize,
    /// Received bytes not yet parsed: `inb[start..end]`.
    inb: Vec<u8>,
    start: usize,
    end: usize,
    /// WRs of batches in flight, in order (to scatter responses).
    sq: VecDeque<WorkRequest>,
    /// (wr_id, WR count, posting endpoint) of batches in flight, in order.
    batches: VecDeque<(u64, u16, usize)>,
    /// Why the connection is unusable, once it is.
    broken: Option<String>,
    /// The blade answered a batch as fenced (it closes the connection next).
    fenced: bool,
    /// Which blade it reaches, and the transport's silent blades (bytes
    /// from it make it answering again).
    blade: u16,
    silence: Arc<Silence>,
}

#[derive(Debug)]
struct TcpEndpoint {
    /// The cluster secret, for revocations.
    secret: Option<Arc<Secret>>,
    port: SoftPort<Conn>,
    /// Completions produced at post time (batches to a broken connection).
    failed: Vec<Completion>,
    fds: Vec<libc::pollfd>,
}

/// Where a completion for endpoint `owner` goes.
fn deliver(me: usize, nic: &SoftNic<Conn>, owner: usize, c: Completion, out: &mut Vec<Completion>) {
    if owner == me {
        out.push(c);
    } else {
        nic.with_endpoint(owner, |_, inbox| softnic::lock(inbox).push(c));
    }
}

impl Conn {
    /// The connection to an absent blade: broken from the start, for `why`.
    fn absent(peer: &str, blade: u16, why: String, silence: Arc<Silence>) -> Conn {
        Conn {
            stream: None,
            peer: peer.to_string(),
            out: Vec::new(),
            sent: 0,
            inb: Vec::new(),
            start: 0,
            end: 0,
            sq: VecDeque::new(),
            batches: VecDeque::new(),
            broken: Some(why),
            fenced: false,
            blade,
            silence,
        }
    }

    /// Sends what the socket accepts now.
    fn flush(&mut self) -> std::io::Result<()> {
        let Some(stream) = &mut self.stream else { return Err(ErrorKind::NotConnected.into()) };
        while self.sent < self.out.len() {
            match stream.write(&self.out[self.sent..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
        Ok(())
    }

    /// Marks the connection broken and fails everything in flight.
    fn fail(&mut self, reason: String, me: usize, nic: &SoftNic<Conn>, out: &mut Vec<Completion>) {
        if self.broken.is_none() {
            eprintln!("smart-core: connection to memory blade {} lost: {reason}", self.peer);
            self.broken = Some(reason);
        }
        self.sq.clear();
        for (wr_id, _, owner) in self.batches.drain(..) {
            if wr_id != RESET_WR_ID {
                deliver(me, nic, owner, Completion { wr_id, status: Err((WcStatus::Transport, 0)) }, out);
            }
        }
    }

    /// Sends queued frames and receives responses; a failure breaks the
    /// connection.
    fn progress(&mut self, me: usize, local: &LocalMem, nic: &SoftNic<Conn>, out: &mut Vec<Completion>) {
        if self.broken.is_some() || self.batches.is_empty() {
            return;
        }
        if !self.out.is_empty() {
            if let Err(e) = self.flush() {
                self.fail(format!("sending: {e}"), me, nic, out);
                return;
            }
        }
        if let Err(reason) = self.receive(me, local, nic, out) {
            self.fail(reason, me, nic, out);
        }
    }

    /// Reads and dispatches every response that has arrived.
    fn receive(
        &mut self,
        me: usize,
        local: &LocalMem,
        nic: &SoftNic<Conn>,
        out: &mut Vec<Completion>,
    ) -> std::result::Result<(), String> {
        loop {
            if self.end == self.inb.len() {
                self.inb.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if self.end == self.inb.len() {
                    let grown = (self.inb.len() * 2).min(HEADER_LEN + MAX_FRAME);
                    self.inb.resize(grown, 0);
                }
            }
            let Some(stream) = &mut self.stream else { return Err("no connection".into()) };
            match stream.read(&mut self.inb[self.end..]) {
                Ok(0) if self.fenced => return Err(format!("{}, and closed the connection", crate::fence::REFUSED)),
                Ok(0) => return Err("the memory blade closed the connection".into()),
                Ok(n) => {
                    self.end += n;
                    self.silence.heard(self.blade);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.to_string()),
            }
            while self.end - self.start >= HEADER_LEN {
                let h = Header::get(&self.inb[self.start..]);
                if h.len as usize > MAX_FRAME {
                    return Err(format!("response of {} bytes exceeds the limit", h.len));
                }
                let total = HEADER_LEN + h.len as usize;
                if self.end - self.start < total {
                    break;
                }
                let body_at = self.start + HEADER_LEN;
                self.start += total;
                let (wr_id, n, owner) = self.batches.pop_front().ok_or("response without a request")?;
                if wr_id != h.wr_id {
                    return Err(format!("response for batch {:#x}, expected {wr_id:#x}", h.wr_id));
                }
                let status = match h.kind {
                    0 => Ok(()),
                    s => Err((WcStatus::from_u8(s).ok_or_else(|| format!("unknown status {s}"))?, h.count)),
                };
                self.fenced |= matches!(status, Err((WcStatus::Fenced, _)));
                let ok_wrs = match status {
                    Ok(()) => n,
                    Err((_, i)) => i.min(n),
                };
                let body = body_at..body_at + h.len as usize;
                let (sq, inb) = (&mut self.sq, &self.inb);
                let mut scatter = |local: &LocalMem| -> std::result::Result<(), String> {
                    let mut p = body.start;
                    for i in 0..n {
                        let wr = sq.pop_front().ok_or("send queue out of step")?;
                        if i >= ok_wrs {
                            continue;
                        }
                        let len = match wr.op {
                            Opcode::Read => wr.len as usize,
                            Opcode::Cas | Opcode::Faa => 8,
                            Opcode::Write => 0,
                        };
                        let data = inb
                            .get(p..p + len)
                            .filter(|_| p + len <= body.end)
                            .ok_or("response shorter than its WRs")?;
                        p += len;
                        match wr.op {
                            // SAFETY: the range belongs to this in-flight
                            // batch's slot in its poster's memory (validated
                            // at post); nothing else touches it meanwhile.
                            Opcode::Read => unsafe { local.bytes_mut(wr.local_off, wr.len) }.copy_from_slice(data),
                            Opcode::Cas | Opcode::Faa => {
                                let v = u64::from_le_bytes(data.try_into().expect("8 bytes"));
                                // SAFETY: as above.
                                unsafe { local.bytes_mut(wr.local_off, 8) }.copy_from_slice(&v.to_ne_bytes());
                            }
                            Opcode::Write => {}
                        }
                    }
                    if p != body.end {
                        return Err("response longer than its WRs".into());
                    }
                    Ok(())
                };
                if owner == me {
                    scatter(local)?;
                } else {
                    nic.with_endpoint(owner, |theirs, _| scatter(theirs))?;
                }
                if wr_id != RESET_WR_ID {
                    deliver(me, nic, owner, Completion { wr_id, status }, out);
                }
            }
            if self.start == self.end {
                self.start = 0;
                self.end = 0;
            }
        }
        Ok(())
    }
}

impl Endpoint for TcpEndpoint {
    fn local(&self) -> &Arc<LocalMem> {
        &self.port.local
    }

    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()> {
        let b = qp as usize;
        if b >= self.port.qps.len() {
            return Err(Error::NoSuchBlade(qp, self.port.qps.len()));
        }
        validate_batch(&self.port.local, qp, wrs)?;
        let body: usize =
            wrs.iter().map(|w| WR_DESC_LEN + if w.op == Opcode::Write { w.len as usize } else { 0 }).sum();
        if body > MAX_FRAME || wrs.len() > wire::MAX_WRS {
            return Err(Error::BatchTooLarge { what: format!("frame of {body} bytes"), knob: "slot_bytes" });
        }
        let failed = &mut self.failed;
        let SoftPort { id: me, local, nic, bindings, doorbells, qps, .. } = &mut self.port;
        let (me, conn) = (*me, &mut qps[b]);
        doorbells[b].ring(bindings[b].doorbell_shared, !bindings[b].qp_shared, || {
            conn.with(|c| {
                if c.broken.is_some() {
                    failed.push(Completion { wr_id, status: Err((WcStatus::Transport, 0)) });
                    return;
                }
                Header { len: body as u32, kind: wire::KIND_BATCH, count: wrs.len() as u16, wr_id }.put(&mut c.out);
                for w in wrs {
                    WrDesc {
                        op: w.op as u8,
                        rkey: w.rkey,
                        remote: w.remote.offset(),
                        len: w.len,
                        compare_add: w.compare_add,
                        swap: w.swap,
                    }
                    .put(&mut c.out);
                    if w.op == Opcode::Write {
                        // SAFETY: validated range of the batch's slot, not
                        // written while the batch is in flight.
                        c.out.extend_from_slice(unsafe { local.bytes(w.local_off, w.len) });
                    }
                }
                c.sq.extend(wrs.iter().copied());
                c.batches.push_back((wr_id, wrs.len() as u16, me));
                // Sent by the next `poll`, together with the other frames of this
                // executor round; a frame too large to wait goes now.
                if c.out.len() >= SEND_NOW {
                    if let Err(e) = c.flush() {
                        c.fail(format!("sending: {e}"), me, nic, failed);
                    }
                }
            })
        });
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        out.append(&mut self.failed);
        let SoftPort { id, local, nic, qps, .. } = &mut self.port;
        for c in qps.iter_mut() {
            c.try_with(|c| c.progress(*id, local, nic, out));
        }
        self.port.finish_poll(out, before);
        out.len() - before
    }

    fn idle(&mut self) {
        self.fds.clear();
        for c in &mut self.port.qps {
            // A shared connection someone else is receiving on: do not block.
            let Some((fd, waiting, sending)) = c.try_with(|c| {
                (
                    c.stream.as_ref().map(|s| s.as_raw_fd()),
                    c.broken.is_none() && !c.batches.is_empty(),
                    !c.out.is_empty(),
                )
            }) else {
                return;
            };
            if let (Some(fd), true) = (fd, waiting) {
                let events = libc::POLLIN | if sending { libc::POLLOUT } else { 0 };
                self.fds.push(libc::pollfd { fd, events, revents: 0 });
            }
        }
        if self.fds.is_empty() {
            return;
        }
        // A shared QP's response may be received by another thread: then do
        // not sleep, so its delivery to our inbox is noticed at once.
        let timeout = if self.port.uses_inbox { 0 } else { 1 };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs whose
        // descriptors stay open for the call (owned by the connections).
        unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, timeout) };
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        let (me, nic) = (self.port.id, self.port.nic.clone());
        let failed = &mut self.failed;
        let conn = self.port.qps.get_mut(qp as usize).ok_or(Error::NoSuchBlade(qp, self.port.bindings.len()))?;
        conn.with(|c| {
            if !c.batches.is_empty() {
                return Err(Error::QpBusy(qp));
            }
            if let Some(reason) = &c.broken {
                return Err(Error::Handshake {
                    peer: c.peer.clone(),
                    reason: format!("connection lost ({reason}); reconnect"),
                });
            }
            Header { len: 0, kind: wire::KIND_RESET, count: 0, wr_id: RESET_WR_ID }.put(&mut c.out);
            c.batches.push_back((RESET_WR_ID, 0, me));
            if let Err(e) = c.flush() {
                c.fail(format!("sending: {e}"), me, &nic, failed);
            }
            Ok(())
        })
    }

    fn revoke(&mut self, tag: u64) -> Result<crate::Fencing> {
        // Not on absent blades (`TcpTransport::connect_without`): nothing
        // of the owner's reaches them through this transport.
        let peers: Vec<String> =
            self.port.qps.iter_mut().filter_map(|c| c.with(|c| c.stream.is_some().then(|| c.peer.clone()))).collect();
        for p in &peers {
            revoke_with(p, tag, self.secret.as_deref())?;
        }
        Ok(crate::Fencing::Enforced(peers.len()))
    }
}
