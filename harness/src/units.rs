//! Byte quantities as people type them: `4GiB`, `512M`, `1.5G`, `1073741824`.
//!
//! Suffixes are case-insensitive. `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` are powers
//! of 1024 (memory is counted in pages, and `free -g` and `/proc/meminfo` think in
//! binary units); `KB`, `MB`, `GB`, `TB` are powers of 1000. A bare number is bytes.

/// Why a byte quantity was not understood.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{input:?}: expected a byte count such as 4GiB, 512MiB, 1.5G or 1073741824 ({why})")]
pub struct BytesError {
    /// The text as given.
    pub input: String,
    /// What was wrong.
    pub why: String,
}

/// Parse a byte quantity; the result is rounded down to whole bytes.
pub fn parse_bytes(input: &str) -> Result<u64, BytesError> {
    let err = |why: &str| BytesError {
        input: input.to_string(),
        why: why.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return Err(err("no number"));
    }
    let mult: f64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(err(&format!("unknown unit {other:?}"))),
    };
    if !num.contains('.') && mult == 1.0 {
        return num.parse::<u64>().map_err(|_| err("number out of range"));
    }
    let v: f64 = num.parse().map_err(|_| err("not a number"))?;
    let bytes = v * mult;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("number out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_scale_by_their_base() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("4g"), Ok(4 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(3 << 29));
        assert_eq!(parse_bytes("2KB"), Ok(2000));
        assert_eq!(parse_bytes(" 123 "), Ok(123));
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_bytes("7 TiB"), Ok(7u64 << 40));
    }

    #[test]
    fn nonsense_is_refused_with_the_input_named() {
        for bad in [
            "",
            "GiB",
            "4 parsecs",
            "-1G",
            "1.2.3G",
            "99999999999999999999",
        ] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
