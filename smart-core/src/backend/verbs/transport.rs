//! The verbs transport (compute side) and the verbs memory blade.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};

use memmap2::{MmapMut, MmapOptions};
use rdma_sys::ibv_wc;

use super::device;
use super::ffi::{Context, Cq, DeviceList, Mr, Pd, Qp, QpCaps};
use super::plan::{self, PlannedWr};
use super::status;
use crate::backend::tcp::handshake_with;
use crate::backend::{validate_batch, BladeInfo, Endpoint, LocalMem, Transport};
use crate::blade::VerbsAcceptor;
use crate::region::Region;
use crate::runtime::MAX_BATCH;
use crate::smart::{QpPlan, QpPolicy};
use crate::verbs::{Completion, WorkRequest};
use crate::wire::conn::{self, BladeVerbsInfo, QpEndpoint};
use crate::wire::{self, Header, HEADER_LEN};
use crate::{Error, Result};

/// Bytes of each registered slab of compute-side local memory.
const SLAB_BYTES: usize = 64 << 20;
/// WRITEs up to this many bytes are sent inline.
const MAX_INLINE: u32 = 64;
/// Send-queue depth of each QP.
const SQ_DEPTH: u32 = 1024;
/// CQ depth of each thread.
const CQ_DEPTH: i32 = 4096;

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
            name: descs[i].name.clone(),
            ctx,
        })
    }

    fn caps(&self) -> QpCaps {
        QpCaps { max_send_wr: SQ_DEPTH, max_inline: MAX_INLINE }
    }
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
        Ok(VerbsBlade { nic, cq, mr, size: region.len(), _region: region })
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

    fn accept(&self, remote: &QpEndpoint) -> std::result::Result<(Box<dyn Send>, QpEndpoint), String> {
        let qp = Qp::new(&self.nic.pd, &self.cq, self.nic.caps(), 1).map_err(|e| e.to_string())?;
        qp.to_init(self.nic.port).map_err(|e| e.to_string())?;
        let psn = conn::random_psn();
        let mtu = conn::path_mtu(self.nic.mtu, remote.mtu);
        qp.connect(remote, self.nic.port, self.nic.gid_index, mtu, psn, self.nic.rd_atomic)
            .map_err(|e| e.to_string())?;
        let mine = QpEndpoint { qpn: qp.qpn(), psn, lid: self.nic.lid, mtu, gid: self.nic.gid };
        Ok((Box::new(qp), mine))
    }
}

/// The control connection to one blade and what it told us.
struct BladeLink {
    peer: String,
    ctrl: Mutex<TcpStream>,
    info: BladeVerbsInfo,
}

impl BladeLink {
    /// Asks the blade for a QP connected to `mine`.
    fn connect_qp(&self, mine: &QpEndpoint) -> Result<QpEndpoint> {
        let io = |source| Error::Io { peer: self.peer.clone(), cause: source };
        let mut s = self.ctrl.lock().unwrap_or_else(PoisonError::into_inner);
        let mut req = Vec::with_capacity(HEADER_LEN + conn::QP_ENDPOINT_LEN);
        Header { len: conn::QP_ENDPOINT_LEN as u32, kind: conn::KIND_QP_CONNECT, count: 0, wr_id: 0 }.put(&mut req);
        req.extend_from_slice(&mine.encode());
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
        if addrs.is_empty() || addrs.len() > crate::addr::MAX_BLADES {
            return Err(Error::Unsupported(format!(
                "{} blade addresses: need 1 to {}",
                addrs.len(),
                crate::addr::MAX_BLADES
            )));
        }
        let nic = Nic::open(cfg)?;
        let mut links = Vec::with_capacity(addrs.len());
        let mut infos = Vec::with_capacity(addrs.len());
        for peer in addrs {
            let (mut s, _) = handshake_with(peer, wire::PROTOCOL_VERSION, conn::FLAG_VERBS)?;
            let mut b = [0u8; conn::BLADE_INFO_LEN];
            s.read_exact(&mut b).map_err(|source| Error::Io { peer: peer.clone(), cause: source })?;
            let info = BladeVerbsInfo::decode(&b).map_err(|reason| Error::Handshake { peer: peer.clone(), reason })?;
            infos.push(BladeInfo { size: info.size, rkey: info.rkey });
            links.push(Arc::new(BladeLink { peer: peer.clone(), ctrl: Mutex::new(s), info }));
        }
        let plan = QpPlan::new(QpPolicy::PerThreadQp, 1, addrs.len(), Default::default());
        Ok(VerbsTransport {
            nic: Arc::new(nic),
            links,
            infos,
            plan: Mutex::new(plan),
            pool: Mutex::new(Pool { slabs: Vec::new(), used: 0 }),
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

    fn open_thread(&self, _thread: usize, local_bytes: usize) -> Result<Box<dyn Endpoint>> {
        let plan = *self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        let (local, mr) = self.local_slice(local_bytes)?;
        let cq = Cq::new(&self.nic.ctx, CQ_DEPTH)?;
        // per-thread-db: a thread domain gives this thread's QPs a doorbell
        // of their own without a lock. Without provider support the QPs use
        // the context's doorbells as the driver binds them.
        let pd = match plan.policy {
            QpPolicy::PerThreadDb => match Pd::thread_domain(&self.nic.pd)? {
                Some(td) => td,
                None => {
                    eprintln!(
                        "smart-core: {} has no thread domains; per-thread-db falls back to driver-bound doorbells",
                        self.nic.name
                    );
                    self.nic.pd.clone()
                }
            },
            _ => self.nic.pd.clone(),
        };
        let mut qps = Vec::with_capacity(self.links.len());
        for link in &self.links {
            qps.push(connect_qp(&self.nic, &pd, &cq, link)?);
        }
        // SAFETY: zeroed ibv_wc structs are valid (plain integers and a union of integers).
        let wcs = (0..64).map(|_| unsafe { std::mem::zeroed::<ibv_wc>() }).collect();
        Ok(Box::new(VerbsEndpoint {
            local,
            mr,
            pd,
            cq,
            qps,
            blades: self.links.iter().map(|l| l.info).collect(),
            planned: [PlannedWr::default(); MAX_BATCH],
            wcs,
            nic: self.nic.clone(),
            links: self.links.clone(),
        }))
    }
}

/// Creates an RC QP on `pd`/`cq` and connects it to a new QP of the blade
/// behind `link` (INIT, exchange, RTR, RTS).
fn connect_qp(nic: &Nic, pd: &Arc<Pd>, cq: &Arc<Cq>, link: &BladeLink) -> Result<Qp> {
    let qp = Qp::new(pd, cq, nic.caps(), MAX_BATCH)?;
    qp.to_init(nic.port)?;
    let psn = conn::random_psn();
    let mine = QpEndpoint { qpn: qp.qpn(), psn, lid: nic.lid, mtu: nic.mtu, gid: nic.gid };
    let remote = link.connect_qp(&mine)?;
    let mtu = conn::path_mtu(nic.mtu, remote.mtu);
    qp.connect(&remote, nic.port, nic.gid_index, mtu, psn, nic.rd_atomic)?;
    Ok(qp)
}

/// One thread's CQ, QPs and slice of registered memory.
struct VerbsEndpoint {
    local: Arc<LocalMem>,
    mr: Arc<Mr>,
    pd: Arc<Pd>,
    cq: Arc<Cq>,
    qps: Vec<Qp>,
    blades: Vec<BladeVerbsInfo>,
    planned: [PlannedWr; MAX_BATCH],
    wcs: Vec<ibv_wc>,
    nic: Arc<Nic>,
    /// The control links, to reconnect a QP after an error.
    links: Vec<Arc<BladeLink>>,
}

impl std::fmt::Debug for VerbsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEndpoint").field("qps", &self.qps.len()).finish()
    }
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
        let n = plan::plan_batch(
            wrs,
            wr_id,
            self.local.as_ptr() as u64,
            self.mr.lkey(),
            &self.blades[b],
            MAX_INLINE,
            &mut self.planned,
        );
        self.qps[b].post(&self.planned[..n])
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let before = out.len();
        let r = self.cq.poll(&mut self.wcs, |wr_id, code| {
            let (batch, index) = plan::split_wr_id(wr_id);
            let status = status::map(code).map_err(|s| (s, index));
            if code != status::SUCCESS && code != status::WR_FLUSH_ERR {
                eprintln!("smart-core: verbs completion error: {} (code {code})", status::name(code));
            }
            out.push(Completion { wr_id: batch, status });
        });
        if let Err(e) = r {
            eprintln!("smart-core: polling the CQ failed: {e}");
        }
        out.len() - before
    }

    fn reset_qp(&mut self, qp: u16) -> Result<()> {
        let b = qp as usize;
        if b >= self.qps.len() {
            return Err(Error::NoSuchBlade(qp, self.qps.len()));
        }
        // An errored RC QP is replaced by a fresh pair: both ends may have
        // left RTS, so reconnecting is the one reliable way back.
        let fresh = connect_qp(&self.nic, &self.pd, &self.cq, &self.links[b])?;
        self.qps[b] = fresh;
        Ok(())
    }
}
