//! Fencing on the TCP memory blade: a revoked owner's verbs never run.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use smart_core::backend::tcp::{handshake, revoke};
use smart_core::blade::BladeServer;
use smart_core::region::Region;
use smart_core::wire::{self, Header, WrDesc};
use smart_core::{Fencing, Opcode, Runtime, RuntimeConfig, TcpTransport, Transport, WcStatus};
use smart_testkit::backends;

fn tagged(tag: u64) -> RuntimeConfig {
    // A verb the RNIC drops (verbs) fails after this at the latest.
    let request_timeout = Some(Duration::from_secs(3));
    RuntimeConfig { fence_tag: tag, slots: 8, request_timeout, ..RuntimeConfig::default() }
}

#[test]
fn a_revoked_owner_runs_no_verb_and_cannot_connect_again() {
    a_revoked_owner_runs_no_verb_and_cannot_connect_again_on(&backends::tcp(2), |e| e.is_wc(WcStatus::Fenced));
}

/// Over `b` (two blades): once owner 42 is revoked, its next verbs fail
/// (the first with an error that `fenced` accepts) and change nothing,
/// another owner's still run, and a new thread of owner 42 is refused.
pub(crate) fn a_revoked_owner_runs_no_verb_and_cannot_connect_again_on(
    b: &backends::Backend,
    fenced: impl Fn(&smart_core::Error) -> bool,
) {
    let t = &*b.transport;
    let mut dead = Runtime::new(t, 0, tagged(42)).unwrap();
    let mut other = Runtime::new(t, 1, tagged(43)).unwrap();
    let mut rec = Runtime::new(t, 2, tagged(0)).unwrap();
    let (dc, oc, rc) = (dead.ctx(), other.ctx(), rec.ctx());
    let (x, y) = rec.block_on(async move { (rc.alloc(0, 64, 8).await.unwrap(), rc.alloc(1, 64, 8).await.unwrap()) });
    let c = dc.clone();
    dead.block_on(async move {
        c.write(x, &1u64.to_le_bytes()).await.unwrap();
        c.write(y, &1u64.to_le_bytes()).await.unwrap();
    });
    assert_eq!(rec.ctx().revoke(42).unwrap(), Fencing::Enforced(2));
    let c = dc.clone();
    let err = dead.block_on(async move { c.write(x, &2u64.to_le_bytes()).await }).unwrap_err();
    assert!(fenced(&err), "{err}");
    eprintln!("a verb of the revoked owner: {err}");
    let c = dc.clone();
    assert!(dead.block_on(async move { c.faa(y, 5).await }).is_err());
    // Nothing of it ran; another owner's verbs still do.
    let c = oc.clone();
    other.block_on(async move { c.faa(y, 10).await.unwrap() });
    let c = rec.ctx();
    let (vx, vy) = rec.block_on(async move { (c.read_u64(x).await.unwrap(), c.read_u64(y).await.unwrap()) });
    assert_eq!((vx, vy), (1, 11));
    // A new thread of the revoked owner is refused, by name.
    let err = Runtime::new(t, 3, tagged(42)).unwrap_err();
    assert!(err.to_string().contains("revoked its registration"), "{err}");
    assert!(rec.ctx().revoke(0).unwrap_err().to_string().contains("tag 0"));
}

/// The write that a stalled network delivers late: the frame of a WRITE of
/// the revoked owner arrives (its second half) after the revocation was
/// answered, and does not run.
#[test]
fn a_write_delivered_after_the_revocation_does_not_land() {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region.clone()).unwrap().spawn().unwrap();
    let peer = blade.addr().to_string();
    let (mut s, info) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let mut f = Vec::new();
    Header { len: wire::TAG_LEN as u32, kind: wire::KIND_TAG, count: 0, wr_id: 0 }.put(&mut f);
    f.extend_from_slice(&77u64.to_le_bytes());
    s.write_all(&f).unwrap();
    let mut h = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    assert_eq!(Header::get(&h).kind, 0, "the tag is accepted");
    let at = 1u64 << 19;
    let d = WrDesc { op: Opcode::Write as u8, rkey: info.rkey, remote: at, len: 8, compare_add: 0, swap: 0 };
    let mut w = Vec::new();
    Header { len: (wire::WR_DESC_LEN + 8) as u32, kind: wire::KIND_BATCH, count: 1, wr_id: 9 }.put(&mut w);
    d.put(&mut w);
    w.extend_from_slice(&0xdead_beefu64.to_le_bytes());
    let half = w.len() / 2;
    s.write_all(&w[..half]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    revoke(&peer, 77).unwrap();
    s.write_all(&w[half..]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.read_exact(&mut h).unwrap();
    let h = Header::get(&h);
    assert_eq!((h.wr_id, h.kind), (9, WcStatus::Fenced as u8), "the late batch is answered as fenced");
    let mut rest = [0u8; 8];
    assert!(matches!(s.read(&mut rest), Ok(0) | Err(_)), "and the connection closes");
    let mut v = [0u8; 8];
    region.read(at, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 0, "the late WRITE did not land");
    // A connection names its owner once: a second, other tag closes it.
    let (mut s, _) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = [0u8; wire::HEADER_LEN];
    for tag in [5u64, 6] {
        let mut f = Vec::new();
        Header { len: wire::TAG_LEN as u32, kind: wire::KIND_TAG, count: 0, wr_id: 0 }.put(&mut f);
        f.extend_from_slice(&tag.to_le_bytes());
        s.write_all(&f).unwrap();
        if tag == 5 {
            s.read_exact(&mut h).unwrap();
            assert_eq!(Header::get(&h).kind, 0, "the first tag is accepted");
        }
    }
    assert!(matches!(s.read(&mut h), Ok(0) | Err(_)), "the second closes the connection");
    // The same blade still serves others.
    let t = TcpTransport::connect(&[peer]).unwrap();
    assert_eq!(t.blades().len(), 1);
}

/// A tag frame that names a revoked owner, and a WRITE batch sent behind it
/// in the same send: both are answered as fenced, the WRITE does not land,
/// and the connection closes.
#[test]
fn frames_behind_a_refused_tag_in_the_same_send_do_not_run() {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region.clone()).unwrap().spawn().unwrap();
    let peer = blade.addr().to_string();
    revoke(&peer, 91).unwrap();
    let (mut s, info) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
    let at = 1u64 << 19;
    let mut f = Vec::new();
    Header { len: wire::TAG_LEN as u32, kind: wire::KIND_TAG, count: 0, wr_id: 1 }.put(&mut f);
    f.extend_from_slice(&91u64.to_le_bytes());
    let d = WrDesc { op: Opcode::Write as u8, rkey: info.rkey, remote: at, len: 8, compare_add: 0, swap: 0 };
    Header { len: (wire::WR_DESC_LEN + 8) as u32, kind: wire::KIND_BATCH, count: 1, wr_id: 2 }.put(&mut f);
    d.put(&mut f);
    f.extend_from_slice(&0xbad_u64.to_le_bytes());
    s.write_all(&f).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for wr_id in [1, 2] {
        let mut h = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let h = Header::get(&h);
        assert_eq!((h.wr_id, h.kind), (wr_id, WcStatus::Fenced as u8), "frame {wr_id} is refused");
    }
    let mut rest = [0u8; 8];
    assert!(matches!(s.read(&mut rest), Ok(0) | Err(_)), "and the connection closes");
    let mut v = [0u8; 8];
    region.read(at, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 0, "the WRITE behind the refused tag did not land");
}
