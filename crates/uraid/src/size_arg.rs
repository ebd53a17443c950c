//! Sizes on the command line: bytes with an optional K/M/G/T suffix (powers of 1024), as mdadm.

/// Parse "64K", "1M", "4096", "1.5G" (fractional only with a suffix) into bytes.
pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        Some('B') if t.len() > 1 => return parse_size_bytes(&t[..t.len() - 1]),
        _ => (t, 0),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_shl(shift)
            .filter(|v| v >> shift == n)
            .ok_or_else(|| format!("size {text:?} is too large"));
    }
    match num.parse::<f64>() {
        Ok(f) if shift > 0 && f.is_finite() && f >= 0.0 => Ok((f * (1u64 << shift) as f64) as u64),
        _ => Err(format!("size {text:?} is not a number with an optional K/M/G/T suffix")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size_bytes;
    #[test]
    fn suffixes() {
        assert_eq!(parse_size_bytes("4096"), Ok(4096));
        assert_eq!(parse_size_bytes("64K"), Ok(65536));
        assert_eq!(parse_size_bytes("64k"), Ok(65536));
        assert_eq!(parse_size_bytes("1M"), Ok(1 << 20));
        assert_eq!(parse_size_bytes("1.5G"), Ok(3 << 29));
        assert!(parse_size_bytes("x").is_err());
        assert!(parse_size_bytes("").is_err());
        assert!(parse_size_bytes("99999999999999T").is_err());
    }
}
