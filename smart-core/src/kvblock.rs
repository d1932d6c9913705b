//! The KV block: a key and its value out of line, written whole before the
//! word that links it and never changed after, so a reader checks it by
//! CRC alone. race-ht keeps every pair in one; sherman-bt keeps values
//! too long for its leaves in one.
//!
//! ```text
//! KV block   [key len u32][value len u32][key][value][pad][crc32 u32], a
//!            multiple of 64 bytes; the CRC (crc32, IEEE) covers
//!            everything before it
//! ```
//! A reader that finds the block's key different from the one it looked
//! up has followed a link to a block reused since: the structure changed
//! under it (or the block is garbage), never a value to return.

/// Bytes of a KV block's header.
pub const KV_HEADER: usize = 8;

/// Bytes of the KV block for a key and value (a multiple of 64).
pub fn block_len(key: usize, value: usize) -> usize {
    (KV_HEADER + key + value + 4).next_multiple_of(64)
}

/// Encodes a KV block into `out` (resized to its length).
pub fn encode_block(key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    let len = block_len(key.len(), value.len());
    out.clear();
    out.resize(len, 0);
    out[0..4].copy_from_slice(&(key.len() as u32).to_le_bytes());
    out[4..8].copy_from_slice(&(value.len() as u32).to_le_bytes());
    out[8..8 + key.len()].copy_from_slice(key);
    out[8 + key.len()..8 + key.len() + value.len()].copy_from_slice(value);
    let crc = crc32fast::hash(&out[..len - 4]);
    out[len - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a KV block: `Some((key, value))` if its lengths fit and its CRC
/// matches, `None` if it is torn, in flight, or garbage.
pub fn decode_block(b: &[u8]) -> Option<(&[u8], &[u8])> {
    if b.len() < 64 || b.len() % 64 != 0 {
        return None;
    }
    let k = u32::from_le_bytes(b[0..4].try_into().ok()?) as usize;
    let v = u32::from_le_bytes(b[4..8].try_into().ok()?) as usize;
    if k > b.len() || v > b.len() || block_len(k, v) != b.len() {
        return None;
    }
    let crc = u32::from_le_bytes(b[b.len() - 4..].try_into().ok()?);
    if crc32fast::hash(&b[..b.len() - 4]) != crc {
        return None;
    }
    Some((&b[8..8 + k], &b[8 + k..8 + k + v]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_any_changed_byte_is_refused() {
        let mut b = Vec::new();
        encode_block(b"user42", &[7u8; 100], &mut b);
        assert_eq!(b.len(), 128);
        assert_eq!(decode_block(&b), Some((&b"user42"[..], &[7u8; 100][..])));
        for i in 0..b.len() {
            let mut t = b.clone();
            t[i] ^= 1;
            assert!(decode_block(&t).is_none(), "byte {i} changed yet the block decoded");
        }
        assert!(decode_block(&[0u8; 63]).is_none());
        // Lengths beyond the block (a huge key length) are refused, not
        // computed with overflow.
        let mut t = b.clone();
        t[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_block(&t).is_none());
    }
}
