//! A memory blade with the cluster secret: only holders of the secret run
//! verbs or revoke compute blades there.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use smart_core::backend::tcp::{greet, revoke, revoke_with};
use smart_core::blade::BladeServer;
use smart_core::region::Region;
use smart_core::secret::Secret;
use smart_core::wire::{self, Header, WrDesc};
use smart_core::{Fencing, Opcode, Runtime, RuntimeConfig, TcpTransport, Transport, WcStatus};

fn blade_with(secret: &Secret) -> (Arc<Region>, smart_core::blade::BladeHandle) {
    let region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region.clone()).unwrap().with_secret(secret.clone()).spawn().unwrap();
    (region, blade)
}

/// The answers' (wr_id, status) to `frames` sent in one write on `s`, as
/// many as come before the blade closes it.
fn answers(s: &mut TcpStream, frames: &[u8]) -> Vec<(u64, u8)> {
    s.write_all(frames).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut h = [0u8; wire::HEADER_LEN];
    while s.read_exact(&mut h).is_ok() {
        let h = Header::get(&h);
        let mut body = vec![0u8; h.len as usize];
        s.read_exact(&mut body).unwrap();
        got.push((h.wr_id, h.kind));
    }
    got
}

fn write_frame(rkey: u32, at: u64, v: u64, wr_id: u64) -> Vec<u8> {
    let mut f = Vec::new();
    let d = WrDesc { op: Opcode::Write as u8, rkey, remote: at, len: 8, compare_add: 0, swap: 0 };
    Header { len: (wire::WR_DESC_LEN + 8) as u32, kind: wire::KIND_BATCH, count: 1, wr_id }.put(&mut f);
    d.put(&mut f);
    f.extend_from_slice(&v.to_le_bytes());
    f
}

fn word(region: &Region, at: u64) -> u64 {
    let mut v = [0u8; 8];
    region.read(at, &mut v).unwrap();
    u64::from_le_bytes(v)
}

/// Without the secret, or with another, nothing runs: no connection, no
/// WRITE, no revocation; with it, everything does.
#[test]
fn only_holders_of_the_secret_run_verbs_or_revoke() {
    let (secret, other) = (Secret::random(), Secret::random());
    let (region, blade) = blade_with(&secret);
    let peer = blade.addr().to_string();
    let at = 1u64 << 19;

    // A compute blade without the secret is told what it lacks.
    let err = TcpTransport::connect(std::slice::from_ref(&peer)).unwrap_err();
    assert!(err.to_string().contains("--secret-file"), "{err}");
    // One with another secret is refused when its thread connects.
    let t = TcpTransport::connect_with(std::slice::from_ref(&peer), Some(other.clone())).unwrap();
    let err = Runtime::new(&t, 0, RuntimeConfig::default()).unwrap_err();
    assert!(err.to_string().contains("another secret"), "{err}");

    // A raw client that skips the proof: its WRITE is refused, the
    // connection closes, the word is unchanged.
    let (mut s, w) = greet(&peer, wire::PROTOCOL_VERSION, 0).unwrap();
    assert!(w.wants_secret());
    assert_eq!(answers(&mut s, &write_frame(w.rkey, at, 0xbad, 1)), vec![(1, WcStatus::RemoteAccess as u8)]);
    assert_eq!(word(&region, at), 0);
    // A proof made for another blade (identity) does not verify here.
    let (mut s, w) = greet(&peer, wire::PROTOCOL_VERSION, 0).unwrap();
    let mut body = 0u64.to_le_bytes().to_vec();
    secret.prove(wire::KIND_TAG, &mut body, w.identity ^ 1);
    let mut f = Vec::new();
    Header { len: body.len() as u32, kind: wire::KIND_TAG, count: 0, wr_id: 2 }.put(&mut f);
    f.extend_from_slice(&body);
    f.extend_from_slice(&write_frame(w.rkey, at, 0xbad, 3));
    let got = answers(&mut s, &f);
    assert_eq!(got[0], (2, WcStatus::RemoteAccess as u8), "{got:?}");
    assert!(got.iter().skip(1).all(|&(_, st)| st != 0), "nothing behind a refused proof runs: {got:?}");
    assert_eq!(word(&region, at), 0);

    // With the secret: verbs run, tagged; a revocation without the secret
    // is refused and changes nothing; with it, the owner is fenced.
    let t = TcpTransport::connect_with(std::slice::from_ref(&peer), Some(secret.clone())).unwrap();
    let cfg =
        RuntimeConfig { fence_tag: 42, slots: 8, request_timeout: Some(Duration::from_secs(3)), ..Default::default() };
    let mut owner = Runtime::new(&t, 0, cfg).unwrap();
    let c = owner.ctx();
    let x = owner.block_on(async move {
        let x = c.alloc(0, 64, 8).await.unwrap();
        c.write(x, &1u64.to_le_bytes()).await.unwrap();
        x
    });
    let err = revoke(&peer, 42).unwrap_err();
    assert!(err.to_string().contains("--secret-file"), "{err}");
    let err = revoke_with(&peer, 42, Some(&other)).unwrap_err();
    assert!(err.to_string().contains("another secret"), "{err}");
    let c = owner.ctx();
    owner.block_on(async move { c.write(x, &2u64.to_le_bytes()).await.unwrap() });
    assert_eq!(word(&region, x.offset()), 2, "the owner was not revoked by those");
    let rec = Runtime::new(&t, 1, RuntimeConfig::default()).unwrap();
    assert_eq!(rec.ctx().revoke(42).unwrap(), Fencing::Enforced(1));
    let c = owner.ctx();
    let err = owner.block_on(async move { c.write(x, &3u64.to_le_bytes()).await }).unwrap_err();
    assert!(err.is_wc(WcStatus::Fenced), "{err}");
    assert_eq!(word(&region, x.offset()), 2);
    assert_eq!(t.blades().len(), 1);
}
