//! Value parsers for numeric flags. Each states the accepted range, so clap
//! refuses a bad value with the flag's name and the rule, before any work.
//! Negative numbers reach these parsers (see `parse_args` in `main.rs`).

fn whole(s: &str) -> Result<i128, String> {
    s.trim()
        .parse::<i128>()
        .map_err(|_| format!("expected a whole number, got {s:?}"))
}

fn number(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number, got {s:?}"))?;
    if !v.is_finite() {
        return Err(format!("expected a finite number, got {s:?}"));
    }
    Ok(v)
}

/// A count of 1 or more.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    let v = whole(s)?;
    if v < 1 {
        return Err(format!("must be at least 1, got {v}"));
    }
    usize::try_from(v).map_err(|_| format!("{v} is too large"))
}

/// A count of 0 or more.
pub fn count(s: &str) -> Result<usize, String> {
    let v = whole(s)?;
    if v < 0 {
        return Err(format!("must be 0 or more, got {v}"));
    }
    usize::try_from(v).map_err(|_| format!("{v} is too large"))
}

/// A number of 0 or more.
pub fn non_negative(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if v < 0.0 {
        return Err(format!("must be 0 or more, got {v}"));
    }
    Ok(v as f32)
}

/// A number greater than 0.
pub fn positive(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if v <= 0.0 {
        return Err(format!("must be greater than 0, got {v}"));
    }
    Ok(v as f32)
}

/// A number of 0 or more (double precision).
pub fn non_negative_f64(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v < 0.0 {
        return Err(format!("must be 0 or more, got {v}"));
    }
    Ok(v)
}

/// A probability in [0, 1].
pub fn fraction(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("must be from 0 to 1, got {v}"));
    }
    Ok(v as f32)
}

/// A probability in (0, 1].
pub fn positive_fraction(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!("must be greater than 0 and at most 1, got {v}"));
    }
    Ok(v as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").unwrap_err().contains("at least 1"));
        assert!(at_least_one("-2").unwrap_err().contains("at least 1"));
        assert!(count("-1").unwrap_err().contains("0 or more"));
        assert!(non_negative("-1").unwrap_err().contains("0 or more"));
        assert!(non_negative("nan").unwrap_err().contains("finite"));
        assert!(positive("0").is_err());
        assert!(fraction("1.5").is_err());
        assert!(positive_fraction("0").is_err());
        assert_eq!(positive_fraction("1"), Ok(1.0));
        assert!(at_least_one("abc").unwrap_err().contains("whole number"));
    }
}
