//! The cluster secret: who may use a memory blade.
//!
//! A memory blade started with a secret (`memory-blade --secret-file`)
//! serves only clients that prove they hold it. Every connection proves it
//! once, before anything else runs: a TCP connection with an authenticated
//! tag frame (its owner's tag, or 0 for none), a verbs client with each QP
//! request; a revocation is authenticated the same way. The proof is a
//! MAC, HMAC-SHA256 keyed by the secret, over the frame's kind, its body
//! (the tag, a fresh random nonce, a verbs client's QP endpoint) and the
//! blade's identity, which the blade names in its welcome: a proof made
//! for one blade is worth nothing on another. A frame whose MAC does not
//! verify is answered [`WcStatus::RemoteAccess`](crate::WcStatus) and its
//! connection closed; so is a batch on a connection that has not proved
//! it.
//!
//! A blade without a secret serves anyone who reaches its port, as before,
//! and says so when it starts. See the guide's threat model for what the
//! secret protects and what it cannot (RDMA packets themselves are not
//! authenticated: a party that can forge them on the fabric and knows a
//! QP number and the rkey is not stopped by it).
//!
//! The secret is 32 random bytes, kept in a file as 64 hexadecimal digits
//! ([`Secret::generate`] writes one, `compute-blade secret FILE` from the
//! command line); the file must be readable by its owner only.

use std::io::Write;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of a proof's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;
/// What a proof adds to a frame's body: the nonce and the MAC.
pub const PROOF_LEN: usize = NONCE_LEN + MAC_LEN;

/// Domain of the MAC (a MAC of this protocol is no other protocol's).
const DOMAIN: &[u8] = b"smart-rs control frame v1";

/// A cluster's secret.
#[derive(Clone)]
pub struct Secret([u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from its bytes.
    pub fn from_bytes(b: [u8; SECRET_LEN]) -> Secret {
        Secret(b)
    }

    /// A new random secret.
    pub fn random() -> Secret {
        Secret(rand::random())
    }

    /// Writes a new random secret to a new file at `path`, readable and
    /// writable by its owner only; never overwrites a file.
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn generate(path: &Path) -> std::io::Result<Secret> {
        use std::os::unix::fs::OpenOptionsExt;
        let s = Secret::random();
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
        writeln!(f, "{}", s.0.iter().map(|b| format!("{b:02x}")).collect::<String>())?;
        f.sync_all()?;
        Ok(s)
    }

    /// Reads the secret in the file at `path`.
    ///
    /// # Errors
    /// The file cannot be read, is readable by its group or others, or does
    /// not hold 64 hexadecimal digits.
    pub fn load(path: &Path) -> Result<Secret, String> {
        use std::os::unix::fs::PermissionsExt;
        let at = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("secret file {at}: {e}"))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "secret file {at} can be read by others (mode {:o}): chmod 600 it",
                meta.permissions().mode() & 0o777
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("secret file {at}: {e}"))?;
        let hex = text.trim();
        let bad = || {
            format!("secret file {at} does not hold a secret (64 hexadecimal digits, as `compute-blade secret` writes)")
        };
        if hex.len() != 2 * SECRET_LEN || !hex.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Secret(b))
    }

    fn mac(&self, kind: u8, body: &[u8], identity: u64) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(DOMAIN);
        m.update(&[kind]);
        m.update(&(body.len() as u64).to_le_bytes());
        m.update(body);
        m.update(&identity.to_le_bytes());
        m
    }

    /// Appends a proof to `body` (a frame of `kind` to the blade of
    /// `identity`): a fresh nonce, then the MAC over the kind, the body
    /// with that nonce, and the identity.
    pub fn prove(&self, kind: u8, body: &mut Vec<u8>, identity: u64) {
        body.extend_from_slice(&rand::random::<[u8; NONCE_LEN]>());
        let tag = self.mac(kind, body, identity).finalize().into_bytes();
        body.extend_from_slice(&tag);
    }

    /// Checks the proof at the end of `body` (as [`Secret::prove`] made
    /// it): the body before the proof, or `None` if it does not verify
    /// (compared in constant time).
    pub fn verify<'b>(&self, kind: u8, body: &'b [u8], identity: u64) -> Option<&'b [u8]> {
        let signed_len = body.len().checked_sub(MAC_LEN)?;
        let (signed, mac) = body.split_at(signed_len);
        signed.len().checked_sub(NONCE_LEN)?;
        self.mac(kind, signed, identity).verify_slice(mac).ok()?;
        Some(&signed[..signed.len() - NONCE_LEN])
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_proof_verifies_only_with_its_secret_kind_body_and_blade() {
        let (s, other) = (Secret::random(), Secret::random());
        let mut body = 42u64.to_le_bytes().to_vec();
        s.prove(5, &mut body, 7);
        assert_eq!(body.len(), 8 + PROOF_LEN);
        assert_eq!(s.verify(5, &body, 7), Some(&42u64.to_le_bytes()[..]));
        assert_eq!(other.verify(5, &body, 7), None, "another secret");
        assert_eq!(s.verify(4, &body, 7), None, "another kind");
        assert_eq!(s.verify(5, &body, 8), None, "another blade");
        let mut changed = body.clone();
        changed[0] ^= 1;
        assert_eq!(s.verify(5, &changed, 7), None, "another tag");
        assert_eq!(s.verify(5, &body[..20], 7), None, "cut short");
        assert_eq!(s.verify(5, &[], 7), None);
        let mut again = 42u64.to_le_bytes().to_vec();
        s.prove(5, &mut again, 7);
        assert_ne!(again, body, "a fresh nonce each time");
    }

    #[test]
    fn a_generated_secret_file_is_private_and_reads_back() {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("smart-secret-unit-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let s = Secret::generate(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Secret::load(&p).unwrap().0, s.0);
        assert!(Secret::generate(&p).is_err(), "never overwritten");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Secret::load(&p).unwrap_err().contains("chmod 600"));
        std::fs::write(&p, "not hex\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Secret::load(&p).unwrap_err().contains("64 hexadecimal digits"));
        std::fs::remove_file(&p).unwrap();
    }
}
