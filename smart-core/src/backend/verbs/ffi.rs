//! The FFI to libibverbs: RAII handles around the raw objects.
//!
//! This is the only module that calls into libibverbs. Each handle owns one
//! object and holds an `Arc` of what it was created from (a QP holds its PD
//! and CQ, a PD its context), so the objects are destroyed children first,
//! by construction. Errors carry the call that failed and `errno`.

use std::ffi::CStr;
use std::io;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::*;

use super::device::{DeviceDesc, LinkLayer, PortDesc};
use super::plan::PlannedWr;
use crate::wire::conn::QpEndpoint;
use crate::{Error, Result};

fn fail(call: &'static str) -> Error {
    Error::Io { peer: format!("libibverbs {call}"), cause: io::Error::last_os_error() }
}

fn check(call: &'static str, rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        // Verbs calls return the errno value itself, or -1 with errno set.
        let source = if rc > 0 { io::Error::from_raw_os_error(rc) } else { io::Error::last_os_error() };
        Err(Error::Io { peer: format!("libibverbs {call}"), cause: source })
    }
}

/// The list of RDMA devices.
pub(crate) struct DeviceList {
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices (an empty list when there are none).
    pub(crate) fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            Some(list) => Ok(DeviceList { list, len: n.max(0) as usize }),
            // No kernel support at all (no /sys/class/infiniband) also lands here.
            None => Err(Error::Unsupported(format!("{} ({})", super::NO_DEVICE_HELP, io::Error::last_os_error()))),
        }
    }

    fn device(&self, i: usize) -> *mut ibv_device {
        assert!(i < self.len);
        // SAFETY: `i` is within the `len` entries the library returned.
        unsafe { *self.list.as_ptr().add(i) }
    }

    /// The devices' names.
    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len)
            .map(|i| {
                // SAFETY: a listed device has a NUL-terminated name that
                // lives as long as the list.
                unsafe { CStr::from_ptr(ibv_get_device_name(self.device(i))) }.to_string_lossy().into_owned()
            })
            .collect()
    }

    /// Opens device `i`.
    pub(crate) fn open(&self, i: usize) -> Result<Arc<Context>> {
        // SAFETY: a listed device; the context is closed in Drop.
        let ctx = unsafe { ibv_open_device(self.device(i)) };
        NonNull::new(ctx).map(|ctx| Arc::new(Context { ctx })).ok_or_else(|| fail("ibv_open_device"))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// An open device context.
pub(crate) struct Context {
    ctx: NonNull<ibv_context>,
}

// SAFETY: libibverbs contexts may be used from any thread.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take &self and libibverbs locks internally.
unsafe impl Sync for Context {}

impl Context {
    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// Device limits.
    pub(crate) fn query_device(&self) -> Result<ibv_device_attr> {
        // SAFETY: zeroed is a valid ibv_device_attr (plain integers).
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        check("ibv_query_device", unsafe { ibv_query_device(self.as_ptr(), &mut attr) })?;
        Ok(attr)
    }

    /// One port's attributes.
    pub(crate) fn query_port(&self, port: u8) -> Result<ibv_port_attr> {
        // SAFETY: zeroed is a valid ibv_port_attr (plain integers).
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        check("ibv_query_port", unsafe { ___ibv_query_port(self.as_ptr(), port, &mut attr) })?;
        Ok(attr)
    }

    /// The GID at `index` of `port`.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: valid context and out-pointer.
        check("ibv_query_gid", unsafe { ibv_query_gid(self.as_ptr(), port, index as i32, &mut gid) })?;
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }

    /// The non-zero GIDs of `port` among its first `len` entries (at most
    /// 256), with their indexes; entries that cannot be read are skipped.
    pub(crate) fn gid_table(&self, port: u8, len: u32) -> Vec<(u32, [u8; 16])> {
        (0..len.min(256))
            .filter_map(|i| self.query_gid(port, i).ok().filter(|g| *g != [0; 16]).map(|g| (i, g)))
            .collect()
    }

    /// A description for [`super::device::choose`].
    pub(crate) fn describe(&self, name: String) -> Result<DeviceDesc> {
        let ports = self.query_device()?.phys_port_cnt;
        let mut out = Vec::new();
        for num in 1..=ports {
            let p = self.query_port(num)?;
            out.push(PortDesc {
                num,
                active: p.state == ibv_port_state::IBV_PORT_ACTIVE,
                link: LinkLayer::from_raw(p.link_layer),
                gids: p.gid_tbl_len.max(0) as u32,
            });
        }
        Ok(DeviceDesc { name, ports: out })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every child holds an Arc to us,
        // so none is left.
        unsafe { ibv_close_device(self.as_ptr()) };
    }
}

/// A protection domain (or a parent domain over a thread domain).
pub(crate) struct Pd {
    pd: NonNull<ibv_pd>,
    td: Option<NonNull<ibv_td>>,
    parent: Option<Arc<Pd>>,
    ctx: Arc<Context>,
}

// SAFETY: PDs may be used from any thread; a parent domain with a thread
// domain is only used by the thread it was made for (the endpoint owns it).
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>> {
        // SAFETY: valid context; deallocated in Drop.
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| fail("ibv_alloc_pd"))?;
        Ok(Arc::new(Pd { pd, td: None, parent: None, ctx: ctx.clone() }))
    }

    /// A parent domain over `base` with a new thread domain: QPs created on
    /// it get a doorbell of their own, rung without a lock. `Ok(None)` if the
    /// provider has no thread domains.
    pub(crate) fn thread_domain(base: &Arc<Pd>) -> Result<Option<Arc<Pd>>> {
        let ctx = &base.ctx;
        let mut td_attr = ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: valid context and attribute.
        let td = match unsafe { ibv_alloc_td(ctx.as_ptr(), &mut td_attr) } {
            Some(td) if !td.is_null() => td,
            _ => return Ok(None),
        };
        // SAFETY: zeroed is a valid attribute (null pointers, no callbacks).
        let mut attr: ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        attr.pd = base.pd.as_ptr();
        attr.td = td;
        // SAFETY: valid context, PD and TD.
        let pd = match unsafe { ibv_alloc_parent_domain(ctx.as_ptr(), &mut attr) } {
            Some(pd) if !pd.is_null() => pd,
            _ => {
                // SAFETY: the TD was allocated above and is unused.
                unsafe { ibv_dealloc_td(td) };
                return Ok(None);
            }
        };
        Ok(Some(Arc::new(Pd {
            pd: NonNull::new(pd).expect("checked"),
            td: NonNull::new(td),
            parent: Some(base.clone()),
            ctx: ctx.clone(),
        })))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` or `thread_domain`; QPs and MRs hold an
        // Arc, so none is left. A parent domain goes before its TD.
        unsafe {
            ibv_dealloc_pd(self.as_ptr());
            if let Some(td) = self.td {
                ibv_dealloc_td(td.as_ptr());
            }
        }
        let _ = &self.parent; // dropped after us: the base PD outlives its parent domain
    }
}

/// A registered memory region.
pub(crate) struct Mr {
    mr: NonNull<ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: an MR is an immutable registration usable from any thread.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `[addr, addr+len)` for local write and remote read, write
    /// and atomics.
    ///
    /// # Safety
    /// The memory must stay mapped while the MR lives.
    pub(crate) unsafe fn register(pd: &Arc<Pd>, addr: *mut u8, len: usize) -> Result<Mr> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: valid PD; the caller keeps the memory mapped.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access.0 as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| fail("ibv_reg_mr"))?;
        Ok(Mr { mr, _pd: pd.clone() })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    pub(crate) fn addr(&self) -> u64 {
        // SAFETY: a live MR.
        unsafe { (*self.mr.as_ptr()).addr as u64 }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue.
pub(crate) struct Cq {
    cq: NonNull<ibv_cq>,
    _ctx: Arc<Context>,
}

// SAFETY: CQs may be used from any thread (a thread's CQ is polled by it only).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl Cq {
    pub(crate) fn new(ctx: &Arc<Context>, depth: i32) -> Result<Arc<Cq>> {
        // SAFETY: valid context; no channel; destroyed in Drop.
        let cq = unsafe { ibv_create_cq(ctx.as_ptr(), depth, ptr::null_mut(), ptr::null_mut(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| fail("ibv_create_cq"))?;
        Ok(Arc::new(Cq { cq, _ctx: ctx.clone() }))
    }

    /// Polls up to `wcs.len()` completions; hands each one's wr_id, status
    /// and QP number to `each`.
    pub(crate) fn poll(&self, wcs: &mut [ibv_wc], mut each: impl FnMut(u64, u32, u32)) -> Result<usize> {
        // SAFETY: valid CQ; `wcs` has room for the count passed.
        let n = unsafe { ibv_poll_cq(self.cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(fail("ibv_poll_cq"));
        }
        for wc in &wcs[..n as usize] {
            each(wc.wr_id, wc.status, wc.qp_num);
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in `new`; QPs hold an Arc, so none uses it now.
        unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// An RC queue pair.
pub(crate) struct Qp {
    qp: NonNull<ibv_qp>,
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
    /// Scratch for one batch: WRs and SGEs, so posting allocates nothing.
    wrs: Box<[ibv_send_wr]>,
    sges: Box<[ibv_sge]>,
}

// SAFETY: a QP is used by one thread at a time (its endpoint owns it).
unsafe impl Send for Qp {}

/// Limits of a new QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_inline: u32,
}

impl Qp {
    /// Creates an RC QP on `pd` (a parent domain gives it the thread's
    /// doorbell) with `cq` for both queues.
    pub(crate) fn new(pd: &Arc<Pd>, cq: &Arc<Cq>, caps: QpCaps, max_batch: usize) -> Result<Qp> {
        // SAFETY: zeroed is a valid init attribute to fill in.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.cq.as_ptr();
        attr.recv_cq = cq.cq.as_ptr();
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: caps.max_inline,
        };
        // SAFETY: valid PD and attribute; destroyed in Drop.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| fail("ibv_create_qp"))?;
        // SAFETY: zeroed ibv_send_wr/ibv_sge are valid (null pointers, zeros).
        let wrs = (0..max_batch).map(|_| unsafe { std::mem::zeroed::<ibv_send_wr>() }).collect();
        let sges = vec![ibv_sge { addr: 0, length: 0, lkey: 0 }; max_batch].into_boxed_slice();
        Ok(Qp { qp, _pd: pd.clone(), _cq: cq.clone(), wrs, sges })
    }

    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, call: &'static str) -> Result<()> {
        // SAFETY: valid QP and attribute.
        check(call, unsafe { ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) })
    }

    /// RESET → INIT on `port`, allowing remote read, write and atomics.
    pub(crate) fn to_init(&self, port: u8) -> Result<()> {
        // SAFETY: zeroed is a valid attribute to fill in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = port;
        a.pkey_index = 0;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        use ibv_qp_attr_mask as m;
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )
    }

    /// INIT → RTR towards `remote`, then RTR → RTS with our `psn`.
    pub(crate) fn connect(
        &self,
        remote: &QpEndpoint,
        port: u8,
        gid_index: Option<u32>,
        mtu: u8,
        psn: u32,
        rd_atomic: u8,
    ) -> Result<()> {
        // SAFETY: zeroed is a valid attribute to fill in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = u32::from(mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = rd_atomic;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = port;
        if let Some(idx) = gid_index {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = idx as u8;
            a.ah_attr.grh.hop_limit = 64;
        }
        use ibv_qp_attr_mask as m;
        let rtr = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, rtr, "ibv_modify_qp(RTR)")?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = psn;
        a.max_rd_atomic = rd_atomic;
        let rts = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, rts, "ibv_modify_qp(RTS)")
    }

    /// Moves the QP to the error state: every WR still outstanding completes
    /// as flushed, so its CQEs can be drained before the QP is destroyed.
    pub(crate) fn to_error(&self) -> Result<()> {
        // SAFETY: zeroed is a valid attribute to fill in.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "ibv_modify_qp(ERR)")
    }

    /// Posts a planned batch as one chained WR list (one doorbell).
    pub(crate) fn post(&mut self, planned: &[PlannedWr]) -> Result<()> {
        let n = planned.len();
        assert!(n > 0 && n <= self.wrs.len(), "batch fits the scratch");
        for (i, p) in planned.iter().enumerate() {
            self.sges[i] = ibv_sge { addr: p.local_addr, length: p.length, lkey: p.lkey };
        }
        let sges = self.sges.as_mut_ptr();
        let wrs = self.wrs.as_mut_ptr();
        for (i, p) in planned.iter().enumerate() {
            let w = &mut self.wrs[i];
            w.wr_id = p.wr_id;
            // SAFETY: `i + 1 < n` stays inside the scratch array.
            w.next = if i + 1 < n { unsafe { wrs.add(i + 1) } } else { ptr::null_mut() };
            // SAFETY: `i` is inside the SGE scratch array.
            w.sg_list = unsafe { sges.add(i) };
            w.num_sge = 1;
            w.opcode = p.opcode;
            w.send_flags = p.send_flags;
            if p.opcode == super::plan::WR_ATOMIC_CMP_AND_SWP || p.opcode == super::plan::WR_ATOMIC_FETCH_AND_ADD {
                w.wr.atomic =
                    atomic_t { remote_addr: p.remote_addr, compare_add: p.compare_add, swap: p.swap, rkey: p.rkey };
            } else {
                w.wr.rdma = rdma_t { remote_addr: p.remote_addr, rkey: p.rkey };
            }
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: a live QP; the chain and its SGEs live in our scratch for
        // the call (the NIC copies or reads them before returning, and
        // inline data is copied at post).
        check("ibv_post_send", unsafe { ibv_post_send(self.qp.as_ptr(), wrs, &mut bad) })
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created in `new`; destroyed once, before its PD and CQ
        // (which we hold).
        unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
    }
}
