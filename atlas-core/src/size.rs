//! Byte sizes as the command lines take them (`--replica-memory`, `--memory-budget`): `123`,
//! `10G`, `10GiB`, `1.5T`, or `N%` of a whole the caller knows (e.g. the bytes of all experts).
//! One parser for the planner, the coordinator and the expert nodes.

/// A size that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("expected {what}, found {found:?} (sizes look like 123, 10G, 10GiB, 1.5T or 50%)")]
pub struct SizeError {
    pub what: &'static str,
    pub found: String,
}

/// Parses `s`; a percentage is of `full` bytes.
pub fn parse_size(s: &str, full: u64) -> Result<u64, SizeError> {
    let err = |what: &'static str| SizeError {
        what,
        found: s.to_string(),
    };
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let f: f64 = p.trim().parse().map_err(|_| err("a number before %"))?;
        if !(0.0..=10_000.0).contains(&f) {
            return Err(err("0% to 10000%"));
        }
        return Ok((full as f64 * f / 100.0) as u64);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return Err(err("a unit among K, M, G, T, KiB, MiB, GiB, TiB or %")),
    };
    let n: f64 = num.trim().parse().map_err(|_| err("a number"))?;
    if !(n >= 0.0 && n.is_finite()) {
        return Err(err("a non-negative size"));
    }
    Ok((n * mult as f64) as u64)
}

/// Parses `s` as [`parse_size`] does, or `auto` (any case): `None`, a size the caller works out
/// (`--cold-cache` on the coordinator and on expert nodes).
pub fn parse_size_or_auto(s: &str, full: u64) -> Result<Option<u64>, SizeError> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    parse_size(s, full).map(Some).map_err(|e| SizeError {
        what: "a size or auto",
        found: e.found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_percentages() {
        assert_eq!(parse_size("123", 0), Ok(123));
        assert_eq!(parse_size("10G", 0), Ok(10_000_000_000));
        assert_eq!(parse_size("1.5GiB", 0), Ok(3 << 29));
        assert_eq!(parse_size(" 50% ", 1000), Ok(500));
        for bad in ["", "x", "10Q", "-1", "50%%", "20000%", "NaN"] {
            assert!(parse_size(bad, 1000).is_err(), "{bad}");
        }
        let e = parse_size("10Q", 0).unwrap_err().to_string();
        assert!(e.contains("a unit among") && e.contains("\"10Q\""), "{e}");
    }

    #[test]
    fn auto_or_a_size() {
        assert_eq!(parse_size_or_auto(" Auto ", 1000), Ok(None));
        assert_eq!(parse_size_or_auto("10%", 1000), Ok(Some(100)));
        assert_eq!(parse_size_or_auto("0", 1000), Ok(Some(0)));
        let e = parse_size_or_auto("lots", 1000).unwrap_err().to_string();
        assert!(
            e.contains("a size or auto") && e.contains("\"lots\""),
            "{e}"
        );
    }
}
