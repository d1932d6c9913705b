//! CRC-32C (Castagnoli), the check applications put in records that a READ
//! may catch half-written (a torn read fails it).
//!
//! Records are short (tens of bytes) and checked on every READ, so the call
//! itself must be cheap: on x86-64 with SSE 4.2 this is one `crc32`
//! instruction per 8 bytes, inlined into one loop; elsewhere it is the
//! `crc32c` crate (which has its own hardware paths). ford-dtx's records
//! and log entries use it; race-ht's KV blocks keep CRC-32 (crc32fast):
//! their table format was fixed before this module, and switching them
//! measured no faster.

/// The CRC-32C of the concatenation of `spans`, in one call (a record is
/// checked in parts, around the words its CRC leaves out; one span for
/// contiguous bytes).
#[inline]
pub fn crc32c_spans(spans: &[&[u8]]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2, checked just above.
        return unsafe { sse42_spans(spans) };
    }
    spans.iter().fold(0, |c, s| crc32c::crc32c_append(c, s))
}

/// [`crc32c_spans`] with the `crc32` instruction.
///
/// # Safety
/// The CPU must have SSE 4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn sse42_spans(spans: &[&[u8]]) -> u32 {
    let mut c = 0;
    for s in spans {
        // SAFETY: SSE 4.2 is enabled for this function, so for the callee.
        c = unsafe { sse42(c, s) };
    }
    c
}

/// The CRC-32C of `data` continuing the CRC `crc` of the bytes before it,
/// with the `crc32` instruction.
///
/// # Safety
/// The CPU must have SSE 4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
#[inline]
#[allow(unused_unsafe, reason = "the intrinsics are unsafe to call before Rust 1.87 (our MSRV is 1.85)")]
unsafe fn sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        // SAFETY: SSE 4.2 is enabled for this function.
        c = unsafe { _mm_crc32_u64(c, u64::from_le_bytes(w.try_into().expect("8 bytes"))) };
    }
    let mut c = c as u32;
    for &b in words.remainder() {
        // SAFETY: as above.
        c = unsafe { _mm_crc32_u8(c, b) };
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_value_and_the_portable_crate_agree() {
        // The standard check value of CRC-32C ("123456789").
        assert_eq!(crc32c_spans(&[b"123456789"]), 0xe306_9283);
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in 0..data.len() {
            for start in [0, 1, 5] {
                let d = &data[start.min(len)..len];
                assert_eq!(crc32c_spans(&[d]), crc32c::crc32c(d), "{} bytes from {start}", d.len());
                let (a, b) = d.split_at(d.len() / 3);
                assert_eq!(crc32c_spans(&[a, b]), crc32c::crc32c(d), "in two spans");
                let (b, c) = b.split_at(b.len() / 2);
                assert_eq!(crc32c_spans(&[a, b, c]), crc32c::crc32c(d), "in three spans");
            }
        }
    }
}
