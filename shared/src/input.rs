//! Text typed into the page's fields, read as a command's values or
//! refused with the reason, before anything is sent: a field never falls
//! back to a default or silently drops what it cannot read.

use crate::error::Invalid;
use crate::units::MIB;
use std::ops::RangeInclusive;

/// A whole number in `range`; `what` names the field in the message.
pub fn whole(text: &str, what: &str, range: RangeInclusive<u64>) -> Result<u64, Invalid> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Invalid(format!("{what}: type a whole number")));
    }
    let n: u64 = text
        .parse()
        .map_err(|_| Invalid(format!("{what}: \"{text}\" is not a whole number")))?;
    if !range.contains(&n) {
        return Err(Invalid(format!(
            "{what} must be {} to {}, not {n}",
            range.start(),
            range.end()
        )));
    }
    Ok(n)
}

/// As [`whole`]; an empty field is `None` (the setting is not set).
pub fn optional_whole(
    text: &str,
    what: &str,
    range: RangeInclusive<u64>,
) -> Result<Option<u64>, Invalid> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    whole(text, what, range).map(Some)
}

/// A positive decimal number no larger than `max`.
pub fn positive(text: &str, what: &str, max: f64) -> Result<f64, Invalid> {
    let text = text.trim();
    let v = decimal(text)
        .filter(|v| v.is_finite())
        .ok_or_else(|| Invalid(format!("{what}: \"{text}\" is not a number")))?;
    if v <= 0.0 || v > max {
        return Err(Invalid(format!(
            "{what} must be more than 0 and at most {max}, not {v}"
        )));
    }
    Ok(v)
}

/// A decimal number as Python writes one (`2`, `0.5`, `.5`, `1.`,
/// `1e-3`, `+7`, `007.5`); `None` for anything else. Read by the JSON
/// number reader the page already carries, so that the page holds one
/// reader of decimals, not two.
pub fn decimal(text: &str) -> Option<f64> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let negative = text.starts_with('-');
    let (mantissa, exponent) =
        unsigned.split_at(unsigned.find(['e', 'E']).unwrap_or(unsigned.len()));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) || (whole.is_empty() && fraction.is_empty()) {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    let json = format!(
        "{}{}.{}{exponent}",
        if negative { "-" } else { "" },
        if whole.is_empty() { "0" } else { whole },
        if fraction.is_empty() { "0" } else { fraction },
    );
    serde_json::from_str(&json).ok()
}

/// A size in MiB (decimals allowed) as bytes, at least one byte.
pub fn mib(text: &str, what: &str, max_bytes: u64) -> Result<u64, Invalid> {
    let v = positive(text, what, (max_bytes / MIB) as f64)?;
    Ok(((v * MIB as f64) as u64).max(1))
}

/// A fraction in (0, 1]; an empty field is `None`.
pub fn optional_fraction(text: &str, what: &str) -> Result<Option<f64>, Invalid> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    positive(text, what, 1.0).map(Some)
}

/// The most dimensions a tensor's shape may have.
pub const MAX_DIMS: usize = 8;

/// A tensor's shape written `1024, 1024` or `1024x1024`; empty: `None`.
/// Every dimension a whole number from 1.
pub fn shape(text: &str) -> Result<Option<Vec<u64>>, Invalid> {
    // `x` joins two numbers (`2x3`, `2 x 3`); a word with an `x` not
    // between two numbers is no dimension.
    let joined: Vec<&str> = text.split(['x', '×']).map(str::trim).collect();
    let joined = joined.join("x");
    let words = joined.split(|c: char| c == ',' || c.is_whitespace());
    let mut dims = Vec::new();
    for word in words.filter(|w| !w.is_empty()) {
        match word.split('x').any(str::is_empty) {
            true => dims.push(word),
            false => dims.extend(word.split('x')),
        }
    }
    if dims.is_empty() {
        return Ok(None);
    }
    if dims.len() > MAX_DIMS {
        return Err(Invalid(format!(
            "shape: at most {MAX_DIMS} dimensions, not {}",
            dims.len()
        )));
    }
    dims.iter()
        .map(|d| match d.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(Invalid(format!(
                "shape: \"{d}\" is not a dimension (whole numbers from 1, as in 1024, 1024)"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_as_python_writes_them() {
        for (text, v) in [
            ("2", 2.0),
            ("0.5", 0.5),
            (".5", 0.5),
            ("1.", 1.0),
            ("1e-3", 1e-3),
            ("2.5E+2", 250.0),
            ("+7", 7.0),
            ("-2.5", -2.5),
            ("007.5", 7.5),
            ("0", 0.0),
        ] {
            assert_eq!(decimal(text), Some(v), "{text}");
        }
        for text in [
            "", ".", "-", "+", "--5", "1e", "e5", "inf", "nan", "1_0", "abc", "1.2.3", "1e400",
            " 1",
        ] {
            assert_eq!(decimal(text), None, "{text}");
        }
    }

    #[test]
    fn decimals_equal_the_exact_reading() {
        for text in [
            "0.001", "3e-4", "0.1", "0.2", "0.3", "123.456", "2.5e-5", "0.9", "1e-8", "0.999",
            "4096.75", "6e-5", "0.01",
        ] {
            assert_eq!(decimal(text), text.parse::<f64>().ok(), "{text}");
        }
    }

    #[test]
    fn whole_numbers_in_range_or_the_reason() {
        assert_eq!(whole(" 12 ", "steps", 1..=100), Ok(12));
        assert_eq!(
            whole("ten", "steps", 1..=100),
            Err("steps: \"ten\" is not a whole number".into())
        );
        assert_eq!(
            whole("100000", "layers", 1..=1024),
            Err("layers must be 1 to 1024, not 100000".into())
        );
        assert_eq!(
            whole("", "batch", 1..=8),
            Err("batch: type a whole number".into())
        );
        assert_eq!(
            whole("-3", "batch", 1..=8),
            Err("batch: \"-3\" is not a whole number".into())
        );
        assert_eq!(optional_whole(" ", "max_split_size_mb", 1..=9), Ok(None));
        assert_eq!(optional_whole("4", "max_split_size_mb", 1..=9), Ok(Some(4)));
    }

    #[test]
    fn sizes_are_positive_and_bounded() {
        assert_eq!(mib("64", "MiB", 1 << 40), Ok(64 * MIB));
        assert_eq!(mib("0.5", "MiB", 1 << 40), Ok(MIB / 2));
        assert_eq!(
            mib("-5", "MiB", 1 << 40),
            Err("MiB must be more than 0 and at most 1048576, not -5".into())
        );
        assert_eq!(
            mib("abc", "MiB", 1 << 40),
            Err("MiB: \"abc\" is not a number".into())
        );
        assert!(mib("NaN", "MiB", 1 << 40).is_err());
        assert!(mib("inf", "MiB", 1 << 40).is_err());
        assert_eq!(optional_fraction("0.5", "fraction"), Ok(Some(0.5)));
        assert!(optional_fraction("1.5", "fraction").is_err());
    }

    #[test]
    fn shapes_are_whole_positive_dimensions() {
        assert_eq!(shape(""), Ok(None));
        assert_eq!(shape("1024, 1024"), Ok(Some(vec![1024, 1024])));
        assert_eq!(shape("2x3 x4"), Ok(Some(vec![2, 3, 4])));
        assert_eq!(
            shape("foo"),
            Err(
                "shape: \"foo\" is not a dimension (whole numbers from 1, as in 1024, 1024)".into()
            )
        );
        assert!(shape("-1, 5").unwrap_err().0.contains("\"-1\""));
        assert!(shape("0, 5").unwrap_err().0.contains("\"0\""));
        assert!(shape("1024, x").unwrap_err().0.contains("\"x\""));
        assert!(shape("2x").unwrap_err().0.contains("\"2x\""));
        assert_eq!(shape("2 x 3"), Ok(Some(vec![2, 3])));
        assert_eq!(shape("2×3"), Ok(Some(vec![2, 3])));
        assert!(shape("1,1,1,1,1,1,1,1,1")
            .unwrap_err()
            .0
            .contains("at most 8"));
    }
}
