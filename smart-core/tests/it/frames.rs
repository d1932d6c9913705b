//! The TCP blade against a shadow model: random batches of READ, WRITE, CAS
//! and FAA (in and out of bounds, misaligned, wrong keys, bad opcodes), with
//! resets after errors and malformed frames in between; every response must
//! be what the model says, byte for byte.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use proptest::prelude::*;
use smart_core::backend::tcp::handshake;
use smart_core::blade::BladeServer;
use smart_core::region::Region;
use smart_core::wire::{self, Header, WrDesc, HEADER_LEN};
use smart_core::{Opcode, WcStatus};

const SIZE: u64 = 64 << 10;

/// One WR as generated.
#[derive(Clone, Debug)]
enum Wr {
    Read(u64, u32),
    Write(u64, Vec<u8>),
    Cas(u64, u64, u64),
    Faa(u64, u64),
    /// With `true`, a READ with the wrong key; else a WR with the unknown
    /// opcode `.0`.
    Bad(u8, bool),
}

/// One step: a batch, or a malformed frame that must close the connection
/// and change nothing.
#[derive(Clone, Debug)]
enum Step {
    Batch(Vec<Wr>),
    Garbage(Vec<u8>),
}

fn offset() -> impl Strategy<Value = u64> {
    // Mostly in bounds, some at the edge and beyond; aligned or not.
    prop_oneof![
        6 => (0..SIZE / 8).prop_map(|w| w * 8),
        2 => 0..SIZE,
        1 => (SIZE - 64)..(SIZE + 64),
    ]
}

fn wr() -> impl Strategy<Value = Wr> {
    prop_oneof![
        3 => (offset(), 1u32..200).prop_map(|(o, l)| Wr::Read(o, l)),
        3 => (offset(), prop::collection::vec(any::<u8>(), 1..200)).prop_map(|(o, d)| Wr::Write(o, d)),
        // Expected values from a tiny set, so CASes sometimes succeed.
        2 => (offset(), 0u64..3, any::<u64>()).prop_map(|(o, c, s)| Wr::Cas(o, c, s)),
        2 => (offset(), any::<u64>()).prop_map(|(o, a)| Wr::Faa(o, a)),
        1 => (prop_oneof![Just(0u8), 5u8..=255], any::<bool>()).prop_map(|(op, key)| Wr::Bad(op, key)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => prop::collection::vec(wr(), 1..8).prop_map(Step::Batch),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Step::Garbage),
    ]
}

/// The model of one connection's QP and the region.
struct Model {
    mem: Vec<u8>,
    rkey: u32,
}

impl Model {
    fn check(&self, off: u64, len: u64) -> Result<(), WcStatus> {
        if off.checked_add(len).is_some_and(|e| e <= SIZE) {
            Ok(())
        } else {
            Err(WcStatus::RemoteAccess)
        }
    }

    fn word(&self, off: u64) -> u64 {
        u64::from_le_bytes(self.mem[off as usize..off as usize + 8].try_into().unwrap())
    }

    /// Runs one WR as the blade must; appends its response bytes.
    fn run(&mut self, w: &Wr, out: &mut Vec<u8>) -> Result<(), WcStatus> {
        match w {
            Wr::Bad(_, true) => Err(WcStatus::RemoteAccess),
            Wr::Bad(_, false) => Err(WcStatus::RemoteInvalidRequest),
            Wr::Read(o, l) => {
                self.check(*o, u64::from(*l))?;
                out.extend_from_slice(&self.mem[*o as usize..(*o + u64::from(*l)) as usize]);
                Ok(())
            }
            Wr::Write(o, d) => {
                self.check(*o, d.len() as u64)?;
                self.mem[*o as usize..*o as usize + d.len()].copy_from_slice(d);
                Ok(())
            }
            Wr::Cas(o, c, s) => {
                if o % 8 != 0 {
                    return Err(WcStatus::RemoteInvalidRequest);
                }
                self.check(*o, 8)?;
                let old = self.word(*o);
                if old == *c {
                    self.mem[*o as usize..*o as usize + 8].copy_from_slice(&s.to_le_bytes());
                }
                out.extend_from_slice(&old.to_le_bytes());
                Ok(())
            }
            Wr::Faa(o, a) => {
                if o % 8 != 0 {
                    return Err(WcStatus::RemoteInvalidRequest);
                }
                self.check(*o, 8)?;
                let old = self.word(*o);
                self.mem[*o as usize..*o as usize + 8].copy_from_slice(&old.wrapping_add(*a).to_le_bytes());
                out.extend_from_slice(&old.to_le_bytes());
                Ok(())
            }
        }
    }

    fn desc(&self, w: &Wr) -> (WrDesc, Vec<u8>) {
        let d = |op: Opcode, remote, len, compare_add, swap| WrDesc {
            op: op as u8,
            rkey: self.rkey,
            remote,
            len,
            compare_add,
            swap,
        };
        match w {
            Wr::Read(o, l) => (d(Opcode::Read, *o, *l, 0, 0), vec![]),
            Wr::Write(o, data) => (d(Opcode::Write, *o, data.len() as u32, 0, 0), data.clone()),
            Wr::Cas(o, c, s) => (d(Opcode::Cas, *o, 8, *c, *s), vec![]),
            Wr::Faa(o, a) => (d(Opcode::Faa, *o, 8, *a, 0), vec![]),
            Wr::Bad(_, true) => (WrDesc { rkey: self.rkey ^ 0x5a5a, ..d(Opcode::Read, 0, 8, 0, 0) }, vec![]),
            Wr::Bad(op, false) => (WrDesc { op: *op, ..d(Opcode::Read, 0, 8, 0, 0) }, vec![]),
        }
    }
}

fn response(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = Header::get(&h);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).unwrap();
    (h, body)
}

fn check_steps(steps: &[Step]) -> Result<(), TestCaseError> {
    let region = Arc::new(Region::anonymous(SIZE).unwrap());
    let blade = BladeServer::bind("127.0.0.1:0", region.clone()).unwrap().spawn().unwrap();
    let peer = blade.addr().to_string();
    let connect = || {
        let (s, info) = handshake(&peer, wire::PROTOCOL_VERSION).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        (s, info)
    };
    let (mut s, info) = connect();
    let mem = (0..SIZE / 8).flat_map(|w| region.load_u64(w * 8).unwrap().to_le_bytes()).collect();
    let mut m = Model { mem, rkey: info.rkey };
    for (i, st) in steps.iter().enumerate() {
        match st {
            Step::Garbage(g) => {
                // A header claiming an unknown kind: rejected whole.
                let mut f = Vec::new();
                Header { len: g.len() as u32, kind: 99, count: 0, wr_id: 0 }.put(&mut f);
                f.extend_from_slice(g);
                s.write_all(&f).unwrap();
                let mut b = [0u8; 1];
                prop_assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "step {}: the blade closed the connection", i);
                (s, _) = connect();
            }
            Step::Batch(wrs) => {
                let mut f = Vec::new();
                let descs: Vec<(WrDesc, Vec<u8>)> = wrs.iter().map(|w| m.desc(w)).collect();
                let body: usize = descs.iter().map(|(_, p)| wire::WR_DESC_LEN + p.len()).sum();
                Header { len: body as u32, kind: wire::KIND_BATCH, count: wrs.len() as u16, wr_id: i as u64 }
                    .put(&mut f);
                for (d, p) in &descs {
                    d.put(&mut f);
                    f.extend_from_slice(p);
                }
                s.write_all(&f).unwrap();
                let (mut want, mut status, mut failed) = (Vec::new(), Ok(()), 0u16);
                for (k, w) in wrs.iter().enumerate() {
                    if let Err(e) = m.run(w, &mut want) {
                        status = Err(e);
                        failed = k as u16;
                        break;
                    }
                }
                let (h, got) = response(&mut s);
                prop_assert_eq!(h.wr_id, i as u64);
                prop_assert_eq!(h.kind, wire::status_byte(status), "step {}: {:?}", i, wrs);
                if status.is_err() {
                    prop_assert_eq!(h.count, failed, "step {}: the failing WR", i);
                    // The QP is in the error state: reset it, as a client does.
                    let mut r = Vec::new();
                    Header { len: 0, kind: wire::KIND_RESET, count: 0, wr_id: 7 }.put(&mut r);
                    s.write_all(&r).unwrap();
                    let (rh, rb) = response(&mut s);
                    prop_assert_eq!((rh.kind, rh.wr_id, rb.len()), (0, 7, 0));
                }
                prop_assert_eq!(got, want, "step {}: response data of {:?}", i, wrs);
            }
        }
    }
    // And the region holds exactly the model's bytes.
    for w in 0..SIZE / 8 {
        prop_assert_eq!(region.load_u64(w * 8).unwrap(), m.word(w * 8), "word {} of the region", w);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_frames_match_a_shadow_model(steps in prop::collection::vec(step(), 1..60)) {
        check_steps(&steps)?;
    }
}
