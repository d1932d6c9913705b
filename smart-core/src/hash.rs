//! Seed mixing shared by the workspace, and a hash of byte strings for
//! data structures built on smart-core.

/// splitmix64's output function (Steele, Lea and Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014): a bijection of `u64`
/// whose outputs look independent even for neighbouring inputs. Seeds of
/// threads, coroutines, phases and test runs are derived with it.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 64-bit hash of `key` (its 8-byte words folded through [`mix64`], the
/// length mixed in): for placing keys in a remote table. Not keyed, so not
/// for tables that adversaries fill.
pub fn bytes(key: &[u8]) -> u64 {
    let h = key.chunks(8).fold(0x51_7cc1_b727_220a ^ key.len() as u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        mix64(h ^ u64::from_le_bytes(w))
    });
    mix64(h)
}

#[cfg(test)]
mod tests {
    use super::{bytes, mix64};

    #[test]
    fn bytes_differ_by_content_and_length() {
        assert_ne!(bytes(b"a"), bytes(b"b"));
        assert_ne!(bytes(b"a"), bytes(b"a\0"), "a zero byte more is another key");
        assert_ne!(bytes(b""), bytes(b"\0"));
        assert_eq!(bytes(b"key-1"), bytes(b"key-1"));
    }

    #[test]
    fn mix64_is_splitmix64s_output_function() {
        // splitmix64 seeded with 0 first adds its increment, then mixes:
        // its first output is the published 0xe220a8397b1dcdaf.
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }
}
