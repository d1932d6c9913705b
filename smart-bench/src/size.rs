//! Byte sizes with suffixes, as the command line takes them.

/// Parses `4096`, `64KiB`, `64K`, `1.5GiB`, `10MB`: binary suffixes
/// (K, KiB, M, MiB, G, GiB, T, TiB) multiply by powers of 1024, decimal ones
/// (KB, MB, GB, TB) by powers of 1000; `B` or nothing means bytes. Case of
/// the letters does not matter.
///
/// ```
/// use smart_bench::size::parse_size;
/// assert_eq!(parse_size("64MiB"), Ok(64 << 20));
/// assert_eq!(parse_size("2k"), Ok(2048));
/// assert_eq!(parse_size("1.5KB"), Ok(1500));
/// assert!(parse_size("12 parsecs").is_err());
/// ```
///
/// # Errors
/// A message naming what is wrong with the text.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("size {text:?} does not start with a number"));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => return Err(format!("size {text:?} has unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| format!("size {text:?} overflows 64 bits"));
    }
    let f: f64 = num.parse().map_err(|_| format!("size {text:?} has a malformed number"))?;
    let v = f * mult as f64;
    if v.fract() != 0.0 || v >= u64::MAX as f64 {
        return Err(format!("size {text:?} is not a whole number of bytes"));
    }
    Ok(v as u64)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::parse_size;

    #[test]
    fn units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("3 MB"), Ok(3_000_000));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("0.3B").is_err());
        assert!(parse_size("99999999999T").unwrap_err().contains("overflow"));
    }
}
