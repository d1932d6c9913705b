//! The verbs transport (compute side) and the verbs memory blade.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use memmap2::{MmapMut, MmapOptions};
use rdma_sys::ibv_wc;

use super::device;
use super::ffi::{Context, Cq, DeviceList, Mr, Pd, Qp, QpCaps};
use super::plan::{self, PlannedWr};
use super::status;
use super::track::{Cqe, QpTrack};
use crate::backend::tcp::{greet, needs_secret};
use crate::backend::{validate_batch, BladeInfo, Endpoint, LocalMem, ThreadSpec, Transport};
use crate::blade::VerbsAcceptor;
use crate::region::Region;
use crate::runtime::MAX_BATCH;
use crate::secret::Secret;
use crate::smart::{QpPlan, QpPolicy};
use crate::verbs::{Completion, WorkRequest};
use crate::wire::conn::{self, BladeVerbsInfo, QpEndpoint};
use crate::wire::{self, Header, HEADER_LEN};
use crate::{Error, Result};

/// Bytes of each registered slab of compute-side local memory.
const SLAB_BYTES: usize = 64 << 20;
/// WRITEs up to this many bytes are sent inline.
const MAX_INLINE: u32 = 64;
/// Send-queue depth of a memory blade's QPs (they only respond).
const BLADE_SQ_DEPTH: u32 = 16;
/// Errored QPs replaced by `reset_qp` whose last CQEs are still awaited;
/// beyond this many the oldest is destroyed without waiting.
const MAX_RETIRED: usize = 64;
/// How long `post` waits for send-queue room on a device whose queues are
/// smaller than the runtime's bound on WRs in flight.
const ROOM_WAIT: Duration = Duration::from_secs(30);

/// How to pick the RDMA device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`--device`); the first with an active port if `None`.
    pub device: Option<String>,
    /// GID index (`--gid-index`); RoCE default 0, InfiniBand uses LIDs.
    pub gid_index: Option<u32>,
}

/// The opened device: context, PD, port and addressing.
struct Nic {
    ctx: Arc<Context>,
    pd: Arc<Pd>,
    port: u8,
    gid_index: Option<u32>,
    lid: u16,
    gid: [u8; 16],
    mtu: u8,
    rd_atomic: u8,
    /// Device limits: WRs per send queue, CQEs per CQ.
    max_qp_wr: usize,
    max_cqe: usize,
    name: String,
}

impl Nic {
    fn open(cfg: &VerbsConfig) -> Result<Nic> {
        let list = DeviceList::get()?;
        let names = list.names();
        let mut descs = Vec::with_capacity(names.len());
        let mut ctxs = Vec::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            let ctx = list.open(i)?;
            descs.push(ctx.describe(n.clone())?);
            ctxs.push(ctx);
        }
        let (i, port) = device::choose(&descs, cfg.device.as_deref()).map_err(Error::Unsupported)?;
        let desc = descs[i].ports.iter().find(|p| p.num == port).expect("chosen port exists").clone();
        let gid_index = device::gid_index(&desc, cfg.gid_index).map_err(Error::Unsupported)?;
        let ctx = ctxs.swap_remove(i);
        let attr = ctx.query_port(port)?;
        let gid = match gid_index {
            Some(g) => ctx.query_gid(port, g)?,
            None => [0; 16],
        };
        let dev = ctx.query_device()?;
        let rd_atomic = dev.max_qp_rd_atom.clamp(1, 16) as u8;
        let pd = Pd::new(&ctx)?;
        Ok(Nic {
            pd,
            port,
            gid_index,
            lid: attr.lid,
            gid,
            mtu: attr.active_mtu as u8,
            rd_atomic,
            max_qp_wr: usize::try_from(dev.max_qp_wr).unwrap_or(0).max(1),
            max_cqe: usize::try_from(dev.max_cqe).unwrap_or(0).max(1),
            name: descs[i].name.clone(),
            ctx,
        })
    }

    fn caps(&self, sq_depth: usize) -> QpCaps {
        QpCaps { max_send_wr: sq_depth.min(self.max_qp_wr) as u32, max_inline: MAX_INLINE }
    }
}

/// Every RDMA device of this host, as `compute-blade verbs-info` shows it:
/// ports and their GIDs, limits, atomics, and whether the provider has
/// thread domains (tried: a thread domain and a parent domain are
/// allocated and freed).
///
/// # Errors
/// No device support at all ([`Error::Unsupported`]); a device that cannot
/// be opened or queried.
pub fn probe() -> Result<Vec<device::DeviceReport>> {
    let list = DeviceList::get()?;
    let mut out = Vec::new();
    for (i, name) in list.names().into_iter().enumerate() {
        let ctx = list.open(i)?;
        let desc = ctx.describe(name.clone())?;
        let dev = ctx.query_device()?;
        let mut ports = Vec::new();
        for p in &desc.ports {
            let gids = ctx.gid_table(p.num, p.gids).iter().map(|(i, g)| (*i, device::gid_text(g))).collect();
            ports.push(device::PortReport { num: p.num, active: p.active, link: p.link, gid_table: p.gids, gids });
        }
        let pd = Pd::new(&ctx)?;
        let thread_domains = Pd::thread_domain(&pd)?.is_some();
        out.push(device::DeviceReport {
            name,
            ports,
            max_qp: u64::try_from(dev.max_qp).unwrap_or(0),
            max_cq: u64::try_from(dev.max_cq).unwrap_or(0),
            max_qp_wr: u64::try_from(dev.max_qp_wr).unwrap_or(0),
            max_mr_size: dev.max_mr_size,
            atomics: dev.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
            thread_domains,
        });
    }
    Ok(out)
}

/// Maps memory on 2 MiB huge pages when the system has them, else normal
/// pages (saying so once).
fn map_huge(len: usize, what: &str) -> Result<MmapMut> {
    let huge = len.next_multiple_of(2 << 20);
    if let Ok(m) = MmapOptions::new().len(huge).huge(Some(21)).map_anon() {
        return Ok(m);
    }
    eprintln!("smart-core: no 2 MiB huge pages for {what}; using normal pages (see README, 'Huge pages')");
    MmapOptions::new().len(len.max(1)).map_anon().map_err(|e| Error::Io { peer: what.into(), cause: e })
}

/// A memory blade's region registered with the RNIC.
pub struct VerbsBlade {
    nic: Nic,
    /// The port's non-zero GIDs (RoCE), to answer each client from a GID
    /// of its family.
    gids: Vec<(u32, [u8; 16])>,
    cq: Arc<Cq>,
    mr: Mr,
    size: u64,
    _region: Arc<Region>,
}

impl std::fmt::Debug for VerbsBlade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsBlade").field("device", &self.nic.name).field("port", &self.nic.port).finish()
    }
}

impl VerbsBlade {
    /// Opens the device and registers `region` once.
    ///
    /// # Errors
    /// No device (with the alternatives), or a failed verbs call.
    pub fn open(region: Arc<Region>, cfg: &VerbsConfig) -> Result<VerbsBlade> {
        let nic = Nic::open(cfg)?;
        let cq = Cq::new(&nic.ctx, 16)?;
        // SAFETY: the region stays mapped while we hold its Arc, and the MR
        // is dropped before it (field order: `mr` before `_region`).
        let mr = unsafe { Mr::register(&nic.pd, region.as_ptr(), region.len() as usize)? };
        let gids = match nic.gid_index {
            Some(_) => nic.ctx.gid_table(nic.port, nic.ctx.query_port(nic.port)?.gid_tbl_len.max(0) as u32),
            None => Vec::new(),
        };
        Ok(VerbsBlade { nic, gids, cq, mr, size: region.len(), _region: region })
    }

    /// The device in use.
    pub fn device(&self) -> &str {
        &self.nic.name
    }
}

impl VerbsAcceptor for VerbsBlade {
    fn info(&self) -> BladeVerbsInfo {
        BladeVerbsInfo {
            base: self.mr.addr(),
            size: self.size,
            rkey: self.mr.rkey(),
            lid: self.nic.lid,
            mtu: self.nic.mtu,
            gid: self.nic.gid,
        }
    }

    fn accept(
        &self,
        remote: &QpEndpoint,
    ) -> std::result::Result<(Box<dyn crate::fence::Revocable>, QpEndpoint), String> {
        // RoCE v2 needs both ends' GIDs of one family: answer from a GID of
        // the client's (which its --gid-index chose).
        let (gid_index, gid) = match self.nic.gid_index {
            Some(pref) if remote.gid != [0; 16] => {
                device::matching_gid(&self.gids, pref, &remote.gid).map(|(i, g)| (Some(i), g)).ok_or_else(|| {
                    format!(
                        "{} has no GID of the client's family ({}); give the client another --gid-index",
                        self.nic.name,
                        if device::is_ipv4_mapped(&remote.gid) { "IPv4" } else { "IPv6" }
                    )
                })?
            }
            _ => (self.nic.gid_index, self.nic.gid),
        };
        let qp =
            Qp::new(&self.nic.pd, &self.cq, self.nic.caps(BLADE_SQ_DEPTH as usize), 1).map_err(|e| e.to_string())?;
        qp.to_init(self.nic.port).map_err(|e| e.to_string())?;
        let psn = conn::random_psn();
        let mtu = conn::path_mtu(self.nic.mtu, remote.mtu);
        qp.connect(remote, self.nic.port, gid_index, mtu, psn, self.nic.rd_atomic).map_err(|e| e.to_string())?;
        let mine = QpEndpoint { qpn: qp.qpn(), psn, lid: self.nic.lid, mtu, gid };
        Ok((Box::new(qp), mine))
    }
}

impl crate::fence::Revocable for Qp {
    fn revoke(&mut self) -> std::result::Result<(), String> {
        self.to_error().map_err(|e| e.to_string())
    }
}

/// The control connection to one blade and what it told us.
struct BladeLink {
    peer: String,
    ctrl: Mutex<TcpStream>,
    info: BladeVerbsInfo,
    /// The secret to prove with each QP request, and the blade's identity,
    /// when the blade requires proofs.
    proof: Option<(Arc<Secret>, u64)>,
}

impl BladeLink {
    /// Asks the blade for a QP connected to `mine`, owned by `tag` (0:
    /// none; see [`crate::fence`]).
    fn connect_qp(&self, mine: &QpEndpoint, tag: u64) -> Result<QpEndpoint> {
        let io = |source| Error::Io { peer: self.peer.clone(), cause: source };
        let mut s = self.ctrl.lock().unwrap_or_else(PoisonError::into_inner);
        let mut body = mine.encode().to_vec();
        if tag != 0 || self.proof.is_some() {
            body.extend_from_slice(&tag.to_le_bytes());
        }
        if let Some((key, identity)) = &self.proof {
            key.prove(conn::KIND_QP_CONNECT, &mut body, *identity);
        }
        let mut req = Vec::with_capacity(HEADER_LEN + body.len());
        Header { len: body.len() as u32, kind: conn::KIND_QP_CONNECT, count: 0, wr_id: 0 }.put(&mut req);
        req.extend_from_slice(&body);
        s.write_all(&req).map_err(io)?;
        let mut hdr = [0u8; HEADER_LEN];
        s.read_exact(&mut hdr).map_err(io)?;
        let h = Header::get(&hdr);
        if h.len as usize > 4096 {
            return Err(Error::Handshake { peer: self.peer.clone(), reason: "oversized QP answer".into() });
        }
        let mut body = vec![0u8; h.len as usize];
        s.read_exact(&mut body).map_err(io)?;
        if h.kind != 0 {
            let reason = String::from_utf8_lossy(&body).into_owned();
            return Err(Error::Handshake {
                peer: self.peer.clone(),
                reason: format!("blade could not connect a QP: {reason}"),
            });
        }
        QpEndpoint::decode(&body).map_err(|reason| Error::Handshake { peer: self.peer.clone(), reason })
    }
}

/// Registered local memory carved into per-thread slices.
struct Pool {
    slabs: Vec<(Arc<MmapMut>, Arc<Mr>)>,
    used: usize,
}

/// RDMA verbs to memory blades started with `--transport verbs`.
pub struct VerbsTransport {
    nic: Arc<Nic>,
    links: Vec<Arc<BladeLink>>,
    infos: Vec<BladeInfo>,
    plan: Mutex<QpPlan>,
    pool: Mutex<Pool>,
    /// The fallback from thread domains was reported.
    said_no_td: AtomicBool,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport").field("device", &self.nic.name).field("blades", &self.infos.len()).finish()
    }
}

impl VerbsTransport {
    /// Opens the device, then the control connection to each blade.
    ///
    /// # Errors
    /// No device (fails at once, naming the alternatives); a blade that is
    /// unreachable, of another version, or serving TCP only.
    pub fn connect(addrs: &[String], cfg: &VerbsConfig) -> Result<VerbsTransport> {
        Self::connect_with(addrs, cfg, None)
    }

    /// [`VerbsTransport::connect`], proving `secret` (see
    /// [`crate::secret`]) to the blades that require it.
    ///
    /// # Errors
    /// As [`VerbsTransport::connect`]; a blade that requires a secret when
    /// `secret` is `None`.
    pub fn connect_with(addrs: &[String], cfg: &VerbsConfig, secret: Option<Secret>) -> Result<VerbsTransport> {
        if addrs.is_empty() || addrs.len() > crate::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!(
                "{} blade addresses: need 1 to {}",
                addrs.len(),
                crate::addr::MAX_BLADES
            )));
        }
        let nic = Nic::open(cfg)?;
        let secret = secret.map(Arc::new);
        let mut links = Vec::with_capacity(addrs.len());
        let mut infos = Vec::with_capacity(addrs.len());
        for peer in addrs {
            let (mut s, welcome) = greet(peer, wire::PROTOCOL_VERSION, conn::FLAG_VERBS)?;
            needs_secret(peer, &welcome, secret.as_deref())?;
            let proof = secret.clone().filter(|_| welcome.wants_secret()).map(|k| (k, welcome.identity));
            let mut b = [0u8; conn::BLADE_INFO_LEN];
            s.read_exact(&mut b).map_err(|source| Error::Io { peer: peer.clone(), cause: source })?;
            let info = BladeVerbsInfo::decode(&b).map_err(|reason| Error::Handshake { peer: peer.clone(), reason })?;
            infos.push(BladeInfo { size: info.size, rkey: info.rkey });
            links.push(Arc::new(BladeLink { peer: peer.clone(), ctrl: Mutex::new(s), info, proof }));
        }
        let plan = QpPlan::new(QpPolicy::PerThreadQp, 1, addrs.len(), Default::default());
        Ok(VerbsTransport {
            nic: Arc::new(nic),
            links,
            infos,
            plan: Mutex::new(plan),
            pool: Mutex::new(Pool { slabs: Vec::new(), used: 0 }),
            said_no_td: AtomicBool::new(false),
        })
    }

    /// A slice of registered memory for one thread.
    fn local_slice(&self, len: usize) -> Result<(Arc<LocalMem>, Arc<Mr>)> {
        let len = len.next_multiple_of(4096);
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = pool.slabs.last().is_some_and(|(m, _)| pool.used + len <= m.len());
        if !fits {
            let mut map = map_huge(len.max(SLAB_BYTES), "local buffers")?;
            // SAFETY: the mapping is kept (Arc) as long as the MR and every
            // LocalMem carved from it.
            let mr = unsafe { Mr::register(&self.nic.pd, map.as_mut_ptr(), map.len())? };
            pool.slabs.push((Arc::new(map), Arc::new(mr)));
            pool.used = 0;
        }
        let (map, mr) = pool.slabs.last().expect("a slab").clone();
        let off = pool.used;
        pool.used += len;
        Ok((LocalMem::within(map, off, len), mr))
    }
}

impl Transport for VerbsTransport {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn blades(&self) -> &[BladeInfo] {
        &self.infos
    }

    fn configure(&self, plan: QpPlan) -> Result<()> {
        if !matches!(plan.policy, QpPolicy::PerThreadQp | QpPolicy::PerThreadDb) || plan.shared_cq {
            return Err(Error::Unsupported(format!(
                "the verbs backend runs per-thread QPs and CQs (per-thread-qp, per-thread-db); \
                 QP policy {} / shared CQ {} are baselines of the soft backends",
                plan.policy, plan.shared_cq
            )));
        }
        *self.plan.lock().unwrap_or_else(PoisonError::into_inner) = plan;
        Ok(())
    }

    fn open_thread(&self, _thread: usize, spec: ThreadSpec) -> Result<Box<dyn Endpoint>> {
        let plan = *self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        let (local, mr) = self.local_slice(spec.local_bytes)?;
        // Sized so that neither queue overflows: a QP holds at most the
        // thread's WRs in flight; the CQ holds a CQE for each of them (an
        // errored QP flushes every WR) and as many trailing CQEs of QPs
        // replaced by `reset_qp`.
        let max_wrs = spec.max_wrs.max(MAX_BATCH);
        let sq_depth = max_wrs.min(self.nic.max_qp_wr);
        let cq = Cq::new(&self.nic.ctx, (2 * max_wrs + 64).min(self.nic.max_cqe).min(i32::MAX as usize) as i32)?;
        // per-thread-db: a thread domain gives this thread's QPs a doorbell
        // of their own without a lock. Without provider support the QPs use
        // the context's doorbells as the driver binds them.
        let pd = match plan.policy {
            QpPolicy::PerThreadDb => match Pd::thread_domain(&self.nic.pd)? {
                Some(td) => td,
                None => {
                    if !self.said_no_td.swap(true, Ordering::Relaxed) {
                        eprintln!(
                            "smart-core: {} has no thread domains; per-thread-db falls back to driver-bound doorbells",
                            self.nic.name
                        );
                    }
                    self.nic.pd.clone()
                }
            },
            _ => self.nic.pd.clone(),
        };
        let mut qps = Vec::with_capacity(self.links.len());
        for link in &self.links {
            qps.push(QpLink::new(connect_qp(&self.nic, &pd, &cq, link, sq_depth, spec.fence_tag)?, sq_depth));
        }
        // SAFETY: zeroed ibv_wc structs are valid (plain integers and a union of integers).
        let wcs = (0..64).map(|_| unsafe { std::mem::zeroed::<ibv_wc>() }).collect();
        Ok(Box::new(VerbsEndpoint {
            qps,
            retired: Vec::new(),
            local,
            mr,
            pd,
            cq,
            sq_depth,
            pending: Vec::new(),
            blades: self.links.iter().map(|l| l.info).collect(),
            planned: [PlannedWr::default(); MAX_BATCH],
            wcs,
            nic: self.nic.clone(),
            links: self.links.clone(),
            strays: 0,
            fence_tag: spec.fence_tag,
        }))
    }
}

/// Creates an RC QP on `pd`/`cq` and connects it to a new QP of the blade
/// behind `link` (INIT, exchange, RTR, RTS).
fn connect_qp(nic: &Nic, pd: &Arc<Pd>, cq: &Arc<Cq>, link: &BladeLink, sq_depth: usize, tag: u64) -> Result<Qp> {
    let qp = Qp::new(pd, cq, nic.caps(sq_depth), MAX_BATCH)?;
    qp.to_init(nic.port)?;
    let psn = conn::random_psn();
    let mine = QpEndpoint { qpn: qp.qpn(), psn, lid: nic.lid, mtu: nic.mtu, gid: nic.gid };
    let remote = link.connect_qp(&mine, tag)?;
    let mtu = conn::path_mtu(nic.mtu, remote.mtu);
    qp.connect(&remote, nic.port, nic.gid_index, mtu, psn, nic.rd_atomic)?;
    Ok(qp)
}

/// A QP and its outstanding batches.
struct QpLink {
    qp: Qp,
    qpn: u32,
    track: QpTrack,
}

impl QpLink {
    /// A QP whose send queue holds `sq_depth` WRs (so at most that many
    /// batches are outstanding on it).
    fn new(qp: Qp, sq_depth: usize) -> QpLink {
        QpLink { qpn: qp.qpn(), qp, track: QpTrack::with_capacity(sq_depth) }
    }
}

/// One thread's CQ, QPs and slice of registered memory.
///
/// Field order is drop order: the QPs are destroyed first, so no WR can
/// touch the CQ, the memory registration or the buffers after them, even
/// when the endpoint is dropped with WRs in flight.
struct VerbsEndpoint {
    qps: Vec<QpLink>,
    /// QPs replaced by `reset_qp`, kept until their last CQEs arrive.
    retired: Vec<QpLink>,
    local: Arc<LocalMem>,
    mr: Arc<Mr>,
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    /// WRs each send queue holds.
    sq_depth: usize,
    /// Completions found while waiting for send-queue room, or of retired
    /// QPs destroyed early: handed out by the next `poll`.
    pending: Vec<Completion>,
    blades: Vec<BladeVerbsInfo>,
    planned: [PlannedWr; MAX_BATCH],
    wcs: Vec<ibv_wc>,
    nic: Arc<Nic>,
    /// The control links, to reconnect a QP after an error.
    links: Vec<Arc<BladeLink>>,
    /// CQEs that matched no outstanding batch.
    strays: u64,
    /// The owner its QPs name to the blades (0: none).
    fence_tag: u64,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint").field("qps", &self.qps.len()).field("retired", &self.retired.len()).finish()
    }
}

impl VerbsEndpoint {
    /// Polls the CQ once, turning CQEs into one completion per batch
    /// ([`QpTrack`]); destroys retired QPs whose last CQE came.
    fn drain_cq(&mut self, out: &mut Vec<Completion>) {
        let VerbsEndpoint { qps, retired, cq, wcs, strays, .. } = self;
        let r = cq.poll(wcs, |wr_id, code, qpn| {
            let (batch, index) = plan::split_wr_id(wr_id);
            let link = match qps.iter_mut().find(|l| l.qpn == qpn) {
                Some(l) => l,
                None => match retired.iter_mut().find(|l| l.qpn == qpn) {
                    Some(l) => l,
                    None => {
                        stray(strays, qpn, batch, index, code);
                        return;
                    }
                },
            };
            match link.track.cqe(batch, index, code) {
                Cqe::Completes(c) => {
                    if code != status::SUCCESS && code != status::WR_FLUSH_ERR {
                        eprintln!("smart-core: verbs batch failed at WR {index}: {} (code {code})", status::name(code));
                    }
                    out.push(c);
                }
                Cqe::Trailing => {}
                Cqe::Stray => stray(strays, qpn, batch, index, code),
            }
        });
        if let Err(e) = r {
            eprintln!("smart-core: polling the CQ failed: {e}");
        }
        if !self.retired.is_empty() {
            self.retired.retain(|l| !l.track.drained());
        }
    }

    /// Waits until QP `b`'s send queue has room for `n` more WRs (only on a
    /// device whose queues are smaller than the runtime's bound).
    fn make_room(&mut self, b: usize, n: usize) -> Result<()> {
        let deadline = Instant::now() + ROOM_WAIT;
        let mut found = std::mem::take(&mut self.pending);
        while self.qps[b].track.wrs() + n > self.sq_depth {
            if Instant::now() > deadline {
                self.pending = found;
                return Err(Error::Timeout { blade: b as u16, waited_ms: ROOM_WAIT.as_millis() as u64 });
            }
            self.drain_cq(&mut found);
            std::hint::spin_loop();
        }
        self.pending = found;
        Ok(())
    }
}

/// Reports a CQE that belongs to no outstanding batch (the first one, then
/// every 1024th).
fn stray(strays: &mut u64, qpn: u32, batch: u64, index: u16, code: u32) {
    if *strays % 1024 == 0 {
        eprintln!(
            "smart-core: a verbs completion matched no outstanding batch (QP {qpn}, batch {batch}, WR {index}, {}); \
             {} so far",
            status::name(code),
            *strays + 1
        );
    }
    *strays += 1;
}

impl Endpoint for VerbsEndpoint {
    fn local(&self) -> &Arc<LocalMem> {
        &self.local
    }

    fn post(&mut self, qp: u16, wr_id: u64, wrs: &[WorkRequest]) -> Result<()> {
        let b = qp as usize;
        if b >= self.qps.len() {
            return Err(Error::NoSuchBlade(qp, self.qps.len()));
        }
        validate_batch(&self.local, qp, wrs)?;
        if self.qps[b].track.wrs() + wrs.len() > self.sq_depth {
            self.make_room(b, wrs.len())?;
        }
        let n = plan::plan_batch(
            wrs,
            wr_id,
            self.local.as_ptr() as u64,
            self.mr.lkey(),
            &self.blades[b],
            MAX_INLINE,
            &mut self.planned,
        );
        let link = &mut self.qps[b];
        link.qp.post(&self.planned[..n])?;
        link.track.posted(wr_id, n as u16);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        if !self.pending.is_empty() {
            out.append(&mut self.pending);
        }
        self.drain_cq(out);
        out.len() - before
    }

    fn revoke(&mut self, tag: u64) -> Result<crate::Fencing> {
        // Over each blade's TCP port: the blade moves its ends of the QPs
        // that the owner connected under `tag` to the error state.
        for link in &self.links {
            crate::backend::tcp::revoke_with(&link.peer, tag, link.proof.as_ref().map(|(k, _)| &**k))?;
        }
        Ok(crate::Fencing::Enforced(self.links.len()))
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        let b = qp as usize;
        if b >= self.qps.len() {
            return Err(Error::NoSuchBlade(qp, self.qps.len()));
        }
        if self.qps[b].track.in_flight() {
            return Err(Error::QpBusy(qp));
        }
        // An errored RC QP is replaced by a fresh pair: both ends may have
        // left RTS, so reconnecting is the one reliable way back.
        let fresh = connect_qp(&self.nic, &self.pd, &self.cq, &self.links[b], self.sq_depth, self.fence_tag)?;
        let old = std::mem::replace(&mut self.qps[b], QpLink::new(fresh, self.sq_depth));
        if !old.track.drained() {
            // Flushed CQEs of the failed batch may still come: keep the old
            // QP (in the error state, so they do) until they have.
            let _ = old.qp.to_error();
            if self.retired.len() >= MAX_RETIRED {
                let mut oldest = self.retired.remove(0);
                oldest.track.abandon(&mut self.pending);
            }
            self.retired.push(old);
        }
        Ok(())
    }
}
