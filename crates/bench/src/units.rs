//! Sizes as benchmark users write them (`4k`, `1m`, `2g`, `3901`), parsed and printed the way
//! IOR and mdtest do: suffixes are binary (k = 1024), a bare number is bytes.

/// Parses `N[kKmMgGtT][iB|B]` into bytes. Suffixes are powers of 1024, as in IOR.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let without_b = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (digits, shift) = match without_b.chars().last() {
        Some('k') => (&without_b[..without_b.len() - 1], 10),
        Some('m') => (&without_b[..without_b.len() - 1], 20),
        Some('g') => (&without_b[..without_b.len() - 1], 30),
        Some('t') => (&without_b[..without_b.len() - 1], 40),
        _ => (without_b, 0),
    };
    let number: u64 = digits.parse().map_err(|_| format!("'{trimmed}' is not a size (examples: 3901, 4k, 1m, 2g)"))?;
    number.checked_mul(1u64 << shift).ok_or_else(|| format!("'{trimmed}' is too large"))
}

/// Prints bytes with the largest binary unit that divides them exactly (`1048576` -> `1m`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "t"), (30, "g"), (20, "m"), (10, "k")];
    for (shift, suffix) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{}", bytes / unit, suffix);
        }
    }
    bytes.to_string()
}

/// Bytes per second in MiB/s.
pub fn mib_per_s(bytes: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    bytes as f64 / (1024.0 * 1024.0) / seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ior_style_sizes() {
        assert_eq!(parse_size("3901"), Ok(3901));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("1x").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_size(3901), "3901");
        assert_eq!(format_size(4096), "4k");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(3 << 20), "3m");
        assert_eq!(format_size(2 << 30), "2g");
        for text in ["4k", "1m", "17", "64g"] {
            assert_eq!(format_size(parse_size(text).unwrap()), text);
        }
    }
}
