//! Parsing and printing of the sizes and OST lists users type (`-S 1M`, `-o 0,2-3`).

use crate::LayoutError;

/// Parses `65536`, `64K`, `64k`, `1M`, `4G`, `1T` (binary units), optionally with a
/// trailing `B`/`iB`.
pub fn parse_size(s: &str) -> Result<u64, LayoutError> {
    let bad = || LayoutError::BadSize(s.to_string());
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some(c) if c.is_ascii_digit() => (t, 0),
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// Prints a size the way `lfs` does in human mode: the largest binary unit that keeps
/// one decimal (`1.5G`, `64K`, `512`).
pub fn format_size(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (unit, scale) in UNITS {
        if n >= scale {
            let v = n as f64 / scale as f64;
            return if n.is_multiple_of(scale) { format!("{}{unit}", n / scale) } else { format!("{v:.1}{unit}") };
        }
    }
    n.to_string()
}

/// Parses `0,2,5` and ranges `1-3` (Lustre's `-o` syntax).
pub fn parse_ost_list(s: &str) -> Result<Vec<u32>, LayoutError> {
    let bad = || LayoutError::BadOstList(s.to_string());
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().map_err(|_| bad())?;
            let b: u32 = b.trim().parse().map_err(|_| bad())?;
            if b < a || b - a > crate::STRIPE_COUNT_MAX {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|_| bad())?);
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert!(parse_size("").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(format_size(1 << 20), "1M");
        assert_eq!(format_size(3 << 29), "1.5G");
        assert_eq!(format_size(100), "100");
    }

    #[test]
    fn ost_lists() {
        assert_eq!(parse_ost_list("0,2-4").unwrap(), vec![0, 2, 3, 4]);
        assert!(parse_ost_list("3-1").is_err());
        assert!(parse_ost_list("a").is_err());
        assert!(parse_ost_list("").is_err());
    }
}
