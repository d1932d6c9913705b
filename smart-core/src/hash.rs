//! Seed mixing shared by the workspace.

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

#[cfg(test)]
mod tests {
    use super::mix64;

    #[test]
    fn mix64_is_splitmix64s_output_function() {
        // splitmix64 seeded with 0 first adds its increment, then mixes:
        // its first output is the published 0xe220a8397b1dcdaf.
        assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix64(0), 0);
    }
}
