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

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;

use super::{validate_batch, BladeInfo, Endpoint, LocalMem, Transport};
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
}

impl TcpTransport {
    /// Connects to each blade once to check that it is a compatible memory
    /// blade and to learn its size and rkey. Blade `i` of the result is
    /// `addrs[i]`.
    ///
    /// # Errors
    /// If a blade is unreachable, not a memory blade, or of another version.
    pub fn connect(addrs: &[String]) -> Result<TcpTransport> {
        if addrs.is_empty() || addrs.len() > crate::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!(
                "{} blade addresses: need 1 to {}",
                addrs.len(),
                crate::addr::MAX_BLADES
            )));
        }
        let mut infos = Vec::with_capacity(addrs.len());
        for a in addrs {
            let (_, info) = handshake(a, wire::PROTOCOL_VERSION)?;
            infos.push(info);
        }
        Ok(TcpTransport { peers: addrs.to_vec(), infos })
    }
}

/// Connects to `peer` and performs the versioned handshake.
///
/// # Errors
/// [`Error::Io`] if unreachable; [`Error::Handshake`] naming the mismatch.
pub fn handshake(peer: &str, version: u32) -> Result<(TcpStream, BladeInfo)> {
    let io = |source| Error::Io { peer: peer.to_string(), source };
    let hs = |reason: String| Error::Handshake { peer: peer.to_string(), reason };
    let addr = peer.to_socket_addrs().map_err(io)?.next().ok_or_else(|| hs("address resolves to nothing".into()))?;
    let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT)).map_err(io)?;
    s.write_all(&wire::hello(version)).map_err(io)?;
    let mut w = [0u8; wire::WELCOME_LEN];
    s.read_exact(&mut w).map_err(|e| hs(format!("no answer to the greeting ({e}); is this a memory-blade port?")))?;
    let welcome = Welcome::decode(&w).map_err(hs)?;
    if welcome.status != wire::STATUS_OK || welcome.version != version {
        return Err(hs(format!(
            "protocol version mismatch: this compute blade speaks {version}, the memory blade speaks {}; \
             run the same Smart-rs release on both sides",
            welcome.version
        )));
    }
    s.set_read_timeout(None).map_err(io)?;
    Ok((s, BladeInfo { size: welcome.size, rkey: welcome.rkey }))
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn blades(&self) -> &[BladeInfo] {
        &self.infos
    }

    fn open_thread(&self, _thread: usize, local_bytes: usize) -> Result<Box<dyn Endpoint>> {
        let mut conns = Vec::with_capacity(self.peers.len());
        for (peer, info) in self.peers.iter().zip(&self.infos) {
            let (stream, now) = handshake(peer, wire::PROTOCOL_VERSION)?;
            if now.size != info.size {
                return Err(Error::Handshake {
                    peer: peer.clone(),
                    reason: "blade changed size since the transport connected".into(),
                });
            }
            stream.set_nonblocking(true).map_err(|source| Error::Io { peer: peer.clone(), source })?;
            conns.push(Conn {
                stream,
                peer: peer.clone(),
                out: Vec::with_capacity(64 << 10),
                sent: 0,
                inb: vec![0; 256 << 10],
                start: 0,
                end: 0,
                sq: VecDeque::new(),
                batches: VecDeque::new(),
                broken: None,
            });
        }
        Ok(Box::new(TcpEndpoint { local: LocalMem::new(local_bytes)?, conns, failed: Vec::new(), fds: Vec::new() }))
    }
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
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
    /// (wr_id, WR count) of batches in flight, in order.
    batches: VecDeque<(u64, u16)>,
    /// Why the connection is unusable, once it is.
    broken: Option<String>,
}

#[derive(Debug)]
struct TcpEndpoint {
    local: Rc<LocalMem>,
    conns: Vec<Conn>,
    /// Completions produced at post time (batches to a broken connection).
    failed: Vec<Completion>,
    fds: Vec<libc::pollfd>,
}

impl Conn {
    /// Sends what the socket accepts now.
    fn flush(&mut self) -> std::io::Result<()> {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
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
    fn fail(&mut self, reason: String, out: &mut Vec<Completion>) {
        if self.broken.is_none() {
            eprintln!("smart-core: connection to memory blade {} lost: {reason}", self.peer);
            self.broken = Some(reason);
        }
        self.sq.clear();
        for (wr_id, _) in self.batches.drain(..) {
            if wr_id != RESET_WR_ID {
                out.push(Completion { wr_id, status: Err((WcStatus::Transport, 0)) });
            }
        }
    }

    /// Reads and dispatches every response that has arrived.
    fn receive(&mut self, local: &LocalMem, out: &mut Vec<Completion>) -> std::result::Result<(), String> {
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
            match self.stream.read(&mut self.inb[self.end..]) {
                Ok(0) => return Err("the memory blade closed the connection".into()),
                Ok(n) => self.end += n,
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
                let (wr_id, n) = self.batches.pop_front().ok_or("response without a request")?;
                if wr_id != h.wr_id {
                    return Err(format!("response for batch {:#x}, expected {wr_id:#x}", h.wr_id));
                }
                let status = match h.kind {
                    0 => Ok(()),
                    s => Err((WcStatus::from_u8(s).ok_or_else(|| format!("unknown status {s}"))?, h.count)),
                };
                let ok_wrs = match status {
                    Ok(()) => n,
                    Err((_, i)) => i.min(n),
                };
                let mut p = body_at;
                for i in 0..n {
                    let wr = self.sq.pop_front().ok_or("send queue out of step")?;
                    if i >= ok_wrs {
                        continue;
                    }
                    let len = WrDesc { op: wr.op as u8, len: wr.len, rkey: 0, remote: 0, compare_add: 0, swap: 0 }
                        .response_len();
                    let data = self
                        .inb
                        .get(p..p + len)
                        .filter(|_| p + len <= body_at + h.len as usize)
                        .ok_or("response shorter than its WRs")?;
                    p += len;
                    match wr.op {
                        // SAFETY: the range belongs to this in-flight batch's
                        // slot (validated at post); nothing else touches it.
                        Opcode::Read => unsafe { local.bytes_mut(wr.local_off, wr.len) }.copy_from_slice(data),
                        Opcode::Cas | Opcode::Faa => {
                            let v = u64::from_le_bytes(data.try_into().expect("8 bytes"));
                            // SAFETY: as above.
                            unsafe { local.bytes_mut(wr.local_off, 8) }.copy_from_slice(&v.to_ne_bytes());
                        }
                        Opcode::Write => {}
                    }
                }
                if p != body_at + h.len as usize {
                    return Err("response longer than its WRs".into());
                }
                if wr_id != RESET_WR_ID {
                    out.push(Completion { wr_id, status });
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
    fn local(&self) -> &Rc<LocalMem> {
        &self.local
    }

    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()> {
        let nconn = self.conns.len();
        let c = self.conns.get_mut(qp as usize).ok_or(Error::NoSuchBlade(qp, nconn))?;
        validate_batch(&self.local, qp, wrs)?;
        if c.broken.is_some() {
            self.failed.push(Completion { wr_id, status: Err((WcStatus::Transport, 0)) });
            return Ok(());
        }
        let body: usize =
            wrs.iter().map(|w| WR_DESC_LEN + if w.op == Opcode::Write { w.len as usize } else { 0 }).sum();
        if body > MAX_FRAME || wrs.len() > wire::MAX_WRS {
            return Err(Error::BatchTooLarge { what: format!("frame of {body} bytes"), knob: "slot_bytes" });
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
                // SAFETY: validated range of the batch's slot, not written
                // while the batch is in flight.
                c.out.extend_from_slice(unsafe { self.local.bytes(w.local_off, w.len) });
            }
        }
        c.sq.extend(wrs.iter().copied());
        c.batches.push_back((wr_id, wrs.len() as u16));
        // Sent by the next `poll`, together with the other frames of this
        // executor round; a frame too large to wait goes now.
        if c.out.len() >= SEND_NOW {
            if let Err(e) = c.flush() {
                c.fail(format!("sending: {e}"), &mut self.failed);
            }
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        out.append(&mut self.failed);
        for c in &mut self.conns {
            if c.broken.is_some() || c.batches.is_empty() {
                continue;
            }
            if !c.out.is_empty() {
                if let Err(e) = c.flush() {
                    c.fail(format!("sending: {e}"), out);
                    continue;
                }
            }
            if let Err(reason) = c.receive(&self.local, out) {
                c.fail(reason, out);
            }
        }
        out.len() - before
    }

    fn idle(&mut self) {
        self.fds.clear();
        for c in &self.conns {
            if c.broken.is_none() && !c.batches.is_empty() {
                let events = libc::POLLIN | if c.out.is_empty() { 0 } else { libc::POLLOUT };
                self.fds.push(libc::pollfd { fd: c.stream.as_raw_fd(), events, revents: 0 });
            }
        }
        if self.fds.is_empty() {
            return;
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs whose
        // descriptors stay open for the call (owned by `self.conns`).
        unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, 1) };
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        let nconn = self.conns.len();
        let c = self.conns.get_mut(qp as usize).ok_or(Error::NoSuchBlade(qp, nconn))?;
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
        c.batches.push_back((RESET_WR_ID, 0));
        if let Err(e) = c.flush() {
            c.fail(format!("sending: {e}"), &mut self.failed);
        }
        Ok(())
    }
}
