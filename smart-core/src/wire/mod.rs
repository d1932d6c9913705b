//! The wire protocol of the TCP software RNIC (compute blade ↔ memory blade).
//!
//! All integers little-endian.
//!
//! **Handshake.** The client sends [`HELLO_LEN`] bytes: magic `SMRTRNIC`,
//! protocol version u32, flags u32 (0). The blade answers [`WELCOME_LEN`]
//! bytes: magic `SMRTBLAD`, its protocol version u32, status u32 (0 accepted,
//! 1 version mismatch, 3 full), region size u64, rkey u32, flags u32 (bit 0:
//! the blade requires proofs of the cluster secret, see [`crate::secret`]),
//! identity u64 (what proofs for it are bound to). On a mismatch it closes
//! after answering; on a wrong magic it closes at once.
//!
//! **Request frame** (client → blade): header `len u32` (body bytes),
//! `kind u8` (1 batch, 2 reset QP, 4 tag, 5 revoke), `reserved u8`, `nwr
//! u16`, `wr_id u64`;
//! then `nwr` WR descriptors of [`WR_DESC_LEN`] bytes: `op u8`, 3 reserved,
//! `rkey u32`, `remote offset u64`, `len u32`, reserved u32, `compare_add
//! u64`, `swap u64`; a WRITE's descriptor is followed by its `len` payload
//! bytes.
//!
//! **Response frame** (blade → client): header `len u32`, `status u8` (0 ok
//! or a [`WcStatus`]), reserved u8, `failed u16` (index of the failing WR),
//! `wr_id u64`; then, for every WR that succeeded, in order: a READ's data or
//! an atomic's 8-byte old value (WRITEs add nothing).
//!
//! **Fencing.** A tag frame (body: a non-zero `tag u64`; to a blade that
//! requires proofs, `tag u64` (0: no owner), then a proof: a 16-byte nonce
//! and a 32-byte MAC, see [`crate::secret`]) names the owner of
//! the connection, e.g. a compute blade's registration; it is answered with
//! an empty response, status 0, or [`WcStatus::Fenced`] if that tag was
//! revoked. A revoke frame (body as a tag frame's, the tag non-zero) makes the blade refuse every
//! connection with that tag from then on: it is answered (status 0) only
//! once none of them is running a request, and the blade answers their
//! later batches with [`WcStatus::Fenced`] and closes them.

pub mod conn;

use crate::verbs::{Opcode, WcStatus};

/// Client greeting magic.
pub const HELLO_MAGIC: [u8; 8] = *b"SMRTRNIC";
/// Blade greeting magic.
pub const WELCOME_MAGIC: [u8; 8] = *b"SMRTBLAD";
/// Version of this protocol; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 3;
/// Bytes of the client greeting.
pub const HELLO_LEN: usize = 16;
/// Bytes of the blade's answer.
pub const WELCOME_LEN: usize = 40;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 16;
/// Bytes of one WR descriptor.
pub const WR_DESC_LEN: usize = 40;
/// Largest frame body either side accepts (request or response).
pub const MAX_FRAME: usize = 16 << 20;
/// Most WRs in one frame.
pub const MAX_WRS: usize = 1024;
/// Frame kind: a batch of WRs.
pub const KIND_BATCH: u8 = 1;
/// Frame kind: reset the connection's QP from the error state.
pub const KIND_RESET: u8 = 2;
/// Frame kind: name the connection's owner (body: the tag, u64).
pub const KIND_TAG: u8 = 4;
/// Frame kind: refuse every connection with a tag (body: the tag, u64).
pub const KIND_REVOKE: u8 = 5;
/// Bytes of a tag or revoke frame's body (without a proof).
pub const TAG_LEN: usize = 8;
/// Welcome flag: the blade requires proofs of the cluster secret.
pub const WELCOME_SECRET: u32 = 1;
/// Welcome status: accepted.
pub const STATUS_OK: u32 = 0;
/// Welcome status: protocol versions differ.
pub const STATUS_VERSION_MISMATCH: u32 = 1;
/// Welcome status: the blade serves its maximum number of connections.
pub const STATUS_FULL: u32 = 3;

/// Encodes the client greeting.
pub fn hello(version: u32) -> [u8; HELLO_LEN] {
    hello_with(version, 0)
}

/// Encodes the client greeting with `flags` (e.g. the verbs flag).
pub fn hello_with(version: u32, flags: u32) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..8].copy_from_slice(&HELLO_MAGIC);
    b[8..12].copy_from_slice(&version.to_le_bytes());
    b[12..16].copy_from_slice(&flags.to_le_bytes());
    b
}

/// Decodes a greeting: `Ok((version, flags))`, or `Err` if it is not a
/// Smart client.
pub fn parse_hello(b: &[u8; HELLO_LEN]) -> Result<(u32, u32), String> {
    if b[..8] != HELLO_MAGIC {
        return Err(format!("not a Smart-rs client (greeting starts {:02x?})", &b[..8]));
    }
    Ok((le32(&b[8..12]), le32(&b[12..16])))
}

/// The blade's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The blade's protocol version.
    pub version: u32,
    /// [`STATUS_OK`] or [`STATUS_VERSION_MISMATCH`].
    pub status: u32,
    /// Region size.
    pub size: u64,
    /// Region key.
    pub rkey: u32,
    /// [`WELCOME_SECRET`] or 0.
    pub flags: u32,
    /// The blade's identity (its superblock's, read when it started).
    pub identity: u64,
}

impl Welcome {
    /// Whether the blade requires proofs of the cluster secret.
    pub fn wants_secret(&self) -> bool {
        self.flags & WELCOME_SECRET != 0
    }

    /// Encodes it.
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[..8].copy_from_slice(&WELCOME_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b[28..32].copy_from_slice(&self.flags.to_le_bytes());
        b[32..40].copy_from_slice(&self.identity.to_le_bytes());
        b
    }

    /// Decodes it, or says why the peer is not a Smart-rs memory blade.
    pub fn decode(b: &[u8; WELCOME_LEN]) -> Result<Welcome, String> {
        if b[..8] != WELCOME_MAGIC {
            return Err(format!("peer is not a Smart-rs memory blade (answer starts {:02x?})", &b[..8]));
        }
        Ok(Welcome {
            version: le32(&b[8..12]),
            status: le32(&b[12..16]),
            size: le64(&b[16..24]),
            rkey: le32(&b[24..28]),
            flags: le32(&b[28..32]),
            identity: le64(&b[32..40]),
        })
    }
}

/// A frame header (request or response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Body bytes after the header.
    pub len: u32,
    /// Request: kind. Response: status.
    pub kind: u8,
    /// Request: WR count. Response: index of the failed WR.
    pub count: u16,
    /// The batch's id.
    pub wr_id: u64,
}

impl Header {
    /// The encoding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4] = self.kind;
        b[6..8].copy_from_slice(&self.count.to_le_bytes());
        b[8..16].copy_from_slice(&self.wr_id.to_le_bytes());
        b
    }

    /// Appends the encoding to `out`.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }

    /// Decodes the first [`HEADER_LEN`] bytes of `b`.
    pub fn get(b: &[u8]) -> Header {
        Header { len: le32(&b[0..4]), kind: b[4], count: u16::from_le_bytes([b[6], b[7]]), wr_id: le64(&b[8..16]) }
    }
}

/// A decoded WR descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrDesc {
    /// Opcode byte (validated by the executor, not the parser).
    pub op: u8,
    /// Region key.
    pub rkey: u32,
    /// Remote offset.
    pub remote: u64,
    /// Length.
    pub len: u32,
    /// CAS expected value / FAA addend.
    pub compare_add: u64,
    /// CAS new value.
    pub swap: u64,
}

impl WrDesc {
    /// Appends the encoding to `out`.
    pub fn put(&self, out: &mut Vec<u8>) {
        out.push(self.op);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&self.rkey.to_le_bytes());
        out.extend_from_slice(&self.remote.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.compare_add.to_le_bytes());
        out.extend_from_slice(&self.swap.to_le_bytes());
    }

    /// Decodes [`WR_DESC_LEN`] bytes.
    pub fn get(b: &[u8]) -> WrDesc {
        WrDesc {
            op: b[0],
            rkey: le32(&b[4..8]),
            remote: le64(&b[8..16]),
            len: le32(&b[16..20]),
            compare_add: le64(&b[24..32]),
            swap: le64(&b[32..40]),
        }
    }

    /// Bytes of payload that follow this descriptor in a request.
    pub fn payload_len(&self) -> usize {
        if self.op == Opcode::Write as u8 {
            self.len as usize
        } else {
            0
        }
    }

    /// Bytes this WR adds to a successful response.
    pub fn response_len(&self) -> usize {
        match Opcode::from_u8(self.op) {
            Some(Opcode::Read) => self.len as usize,
            Some(Opcode::Cas | Opcode::Faa) => 8,
            _ => 0,
        }
    }
}

/// Encodes a response status byte.
pub fn status_byte(s: Result<(), WcStatus>) -> u8 {
    match s {
        Ok(()) => 0,
        Err(s) => s as u8,
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_pinned() {
        let mut v = Vec::new();
        Header { len: 0x0102_0304, kind: KIND_BATCH, count: 7, wr_id: 9 }.put(&mut v);
        assert_eq!(v.len(), HEADER_LEN);
        assert_eq!(&v[..8], &[4, 3, 2, 1, 1, 0, 7, 0]);
        assert_eq!(Header::get(&v), Header { len: 0x0102_0304, kind: KIND_BATCH, count: 7, wr_id: 9 });
        v.clear();
        let d = WrDesc { op: 3, rkey: 5, remote: 64, len: 8, compare_add: 1, swap: 2 };
        d.put(&mut v);
        assert_eq!(v.len(), WR_DESC_LEN);
        assert_eq!(WrDesc::get(&v), d);
        assert_eq!(d.response_len(), 8);
        assert_eq!(d.payload_len(), 0);
        let w = Welcome { version: 1, status: STATUS_OK, size: 1 << 30, rkey: 77, flags: 1, identity: 0xabc };
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
        assert_eq!(parse_hello(&hello(3)), Ok((3, 0)));
        assert_eq!(parse_hello(&hello_with(1, 5)), Ok((1, 5)));
        assert!(parse_hello(&[b'G'; HELLO_LEN]).unwrap_err().contains("not a Smart-rs client"));
    }
}
