//! Connection data exchanged over the memory blade's TCP port for verbs.
//!
//! After the usual handshake (with [`FLAG_VERBS`] in the greeting's flags),
//! the blade sends a [`BladeVerbsInfo`]. Then, for each QP the compute side
//! wants, it sends a `KIND_QP_CONNECT` frame whose body is a [`QpEndpoint`]
//! (its QP), optionally followed by a non-zero fence tag (u64: the QP's
//! owner, see [`crate::fence`]); to a blade that requires proofs of the
//! cluster secret, always the endpoint, the tag (0: none) and a proof
//! ([`crate::secret`]). The blade answers with a frame whose
//! body is the blade's matching [`QpEndpoint`] (status 0), or with a
//! non-zero status and a UTF-8 reason. The blade keeps those QPs while the
//! control connection is open; a revocation of a QP's tag moves the
//! blade's end to the error state. All integers are little-endian.

/// Greeting flag: the client wants verbs connection data, not TCP verbs.
pub const FLAG_VERBS: u32 = 1;
/// Welcome status: the blade does not serve verbs.
pub const STATUS_NO_VERBS: u32 = 2;
/// Frame kind: connect one QP.
pub const KIND_QP_CONNECT: u8 = 3;
/// Bytes of an encoded [`QpEndpoint`].
pub const QP_ENDPOINT_LEN: usize = 32;
/// Bytes of a QP request with a fence tag.
pub const QP_TAGGED_LEN: usize = QP_ENDPOINT_LEN + 8;
/// Bytes of a QP request with a fence tag and a proof of the secret.
pub const QP_PROVEN_LEN: usize = QP_TAGGED_LEN + crate::secret::PROOF_LEN;
/// Bytes of an encoded [`BladeVerbsInfo`].
pub const BLADE_INFO_LEN: usize = 48;

/// One side of an RC connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number.
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Path MTU as an `ibv_mtu` value (1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// GID (RoCE, or routed InfiniBand).
    pub gid: [u8; 16],
}

impl QpEndpoint {
    /// Encodes it.
    pub fn encode(&self) -> [u8; QP_ENDPOINT_LEN] {
        let mut b = [0u8; QP_ENDPOINT_LEN];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10] = self.mtu;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Decodes it, checking what can be checked.
    ///
    /// # Errors
    /// A wrong length, a PSN over 24 bits, or an MTU code out of range.
    pub fn decode(b: &[u8]) -> Result<QpEndpoint, String> {
        if b.len() != QP_ENDPOINT_LEN {
            return Err(format!("QP endpoint of {} bytes, expected {QP_ENDPOINT_LEN}", b.len()));
        }
        let e = QpEndpoint {
            qpn: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            psn: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            lid: u16::from_le_bytes([b[8], b[9]]),
            mtu: b[10],
            gid: b[16..32].try_into().expect("16 bytes"),
        };
        if e.psn >= 1 << 24 {
            return Err(format!("PSN {:#x} does not fit 24 bits", e.psn));
        }
        if !(1..=5).contains(&e.mtu) {
            return Err(format!("MTU code {} is not 1 (256) to 5 (4096)", e.mtu));
        }
        Ok(e)
    }
}

/// What the blade tells a verbs client after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BladeVerbsInfo {
    /// Virtual address of the region's first byte (remote addresses are
    /// `base + offset`).
    pub base: u64,
    /// Region size.
    pub size: u64,
    /// The region's rkey.
    pub rkey: u32,
    /// The blade port's LID.
    pub lid: u16,
    /// The blade port's active MTU (`ibv_mtu` code).
    pub mtu: u8,
    /// The blade's GID at the chosen index.
    pub gid: [u8; 16],
}

impl BladeVerbsInfo {
    /// Encodes it.
    pub fn encode(&self) -> [u8; BLADE_INFO_LEN] {
        let mut b = [0u8; BLADE_INFO_LEN];
        b[0..8].copy_from_slice(&self.base.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b[20..22].copy_from_slice(&self.lid.to_le_bytes());
        b[22] = self.mtu;
        b[32..48].copy_from_slice(&self.gid);
        b
    }

    /// Decodes it.
    ///
    /// # Errors
    /// A wrong length or an MTU code out of range.
    pub fn decode(b: &[u8]) -> Result<BladeVerbsInfo, String> {
        if b.len() != BLADE_INFO_LEN {
            return Err(format!("blade info of {} bytes, expected {BLADE_INFO_LEN}", b.len()));
        }
        let i = BladeVerbsInfo {
            base: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            size: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            lid: u16::from_le_bytes([b[20], b[21]]),
            mtu: b[22],
            gid: b[32..48].try_into().expect("16 bytes"),
        };
        if !(1..=5).contains(&i.mtu) {
            return Err(format!("MTU code {} is not 1 (256) to 5 (4096)", i.mtu));
        }
        Ok(i)
    }

    /// The remote address of `offset` in the region.
    ///
    /// # Errors
    /// If `[offset, offset+len)` is not inside the region.
    pub fn remote(&self, offset: u64, len: u64) -> Result<u64, crate::WcStatus> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.base + offset),
            _ => Err(crate::WcStatus::RemoteAccess),
        }
    }
}

/// The smaller of two MTU codes (what a connection must use).
pub fn path_mtu(a: u8, b: u8) -> u8 {
    a.min(b)
}

/// A random 24-bit PSN.
pub fn random_psn() -> u32 {
    rand::random::<u32>() & 0x00ff_ffff
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn qp_endpoint_round_trips_and_validates() {
        let e = QpEndpoint { qpn: 0x1234, psn: 0xabcdef, lid: 7, mtu: 5, gid: [9; 16] };
        let b = e.encode();
        assert_eq!(&b[0..4], &[0x34, 0x12, 0, 0]);
        assert_eq!(QpEndpoint::decode(&b), Ok(e));
        assert!(QpEndpoint::decode(&b[..31]).unwrap_err().contains("31 bytes"));
        let mut bad = b;
        bad[7] = 1; // PSN over 24 bits
        assert!(QpEndpoint::decode(&bad).unwrap_err().contains("24 bits"));
        let mut bad = b;
        bad[10] = 9;
        assert!(QpEndpoint::decode(&bad).unwrap_err().contains("MTU"));
    }

    #[test]
    fn blade_info_round_trips_and_maps_addresses() {
        let i = BladeVerbsInfo { base: 0x7f00_0000_0000, size: 1 << 20, rkey: 0xdead, lid: 3, mtu: 3, gid: [1; 16] };
        assert_eq!(BladeVerbsInfo::decode(&i.encode()), Ok(i));
        assert_eq!(i.remote(64, 8), Ok(0x7f00_0000_0040));
        assert_eq!(i.remote((1 << 20) - 4, 8), Err(crate::WcStatus::RemoteAccess));
        assert_eq!(i.remote(u64::MAX, 8), Err(crate::WcStatus::RemoteAccess));
        assert_eq!(path_mtu(5, 3), 3);
        assert!(random_psn() < 1 << 24);
    }
}
