//! Number parsing shared by the readers (and by `scalefree-mf` through
//! [`crate::ratings::RatingSyntax`]): no allocation, one syntax per kind of number.

/// Why a token is not an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdError {
    /// Not an optional `+` followed by ASCII digits.
    NotInteger,
    /// Starts with `-`.
    Negative,
    /// Larger than the caller's bound.
    TooLarge,
}

/// A non-negative integer id with the syntax of Rust's `u64::from_str` (an optional `+`,
/// then ASCII digits, leading zeros allowed), at most `max`. A token starting with `-` is
/// [`IdError::Negative`] whatever follows.
#[inline]
pub fn parse_id(tok: &[u8], max: u64) -> Result<u64, IdError> {
    let digits = match tok {
        [b'-', ..] => return Err(IdError::Negative),
        [b'+', rest @ ..] => rest,
        _ => tok,
    };
    if digits.is_empty() {
        return Err(IdError::NotInteger);
    }
    let mut v: u64 = 0;
    let mut overflow = false;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err(IdError::NotInteger);
        }
        match v.checked_mul(10).and_then(|x| x.checked_add(d as u64)) {
            Some(x) => v = x,
            None => overflow = true,
        }
    }
    if overflow || v > max {
        return Err(IdError::TooLarge);
    }
    Ok(v)
}

/// Python's `int(tok)` for an ASCII token, for non-negative results: optional sign, digits
/// with single `_` between digits. `-0` is 0, as in Python. Errors as [`parse_id`].
pub fn parse_py_int(tok: &[u8], max: u64) -> Result<u64, IdError> {
    let (neg, body) = match tok {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, tok),
    };
    if !py_underscores_ok(body) {
        return Err(IdError::NotInteger);
    }
    let mut v: u64 = 0;
    let mut overflow = false;
    let mut any = false;
    for &b in body {
        if b == b'_' {
            continue;
        }
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err(IdError::NotInteger);
        }
        any = true;
        match v.checked_mul(10).and_then(|x| x.checked_add(d as u64)) {
            Some(x) => v = x,
            None => overflow = true,
        }
    }
    if !any {
        return Err(IdError::NotInteger);
    }
    if neg && (v != 0 || overflow) {
        return Err(IdError::Negative);
    }
    if overflow || v > max {
        return Err(IdError::TooLarge);
    }
    Ok(v)
}

/// Every `_` in `tok` stands between two ASCII digits (Python's rule for numeric literals
/// given to `int()` and `float()`).
fn py_underscores_ok(tok: &[u8]) -> bool {
    tok.iter().enumerate().all(|(k, &b)| {
        b != b'_' || (k > 0 && tok[k - 1].is_ascii_digit() && tok.get(k + 1).is_some_and(|c| c.is_ascii_digit()))
    })
}

/// Python's `float(tok)` for an ASCII token (sign, digits with `_` between digits, `.`,
/// exponent, `inf`/`infinity`/`nan` in any case), or None. The result may be infinite or
/// NaN: callers reject those with a message of their own.
pub fn parse_py_float(tok: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(tok).ok()?;
    if !tok.contains(&b'_') {
        return s.parse().ok();
    }
    if !py_underscores_ok(tok) {
        return None;
    }
    s.replace('_', "").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_u64_from_str() {
        for t in ["0", "7", "+7", "007", "18446744073709551615", "18446744073709551616", "", "+", "1a", " 1", "1 ", "99999999999999999999999", "0000000000000000000000000042", "١"] {
            let want = t.parse::<u64>().map_err(|e| match e.kind() {
                std::num::IntErrorKind::PosOverflow => IdError::TooLarge,
                _ => IdError::NotInteger,
            });
            assert_eq!(parse_id(t.as_bytes(), u64::MAX), want, "{t:?}");
        }
        assert_eq!(parse_id(b"-1", u64::MAX), Err(IdError::Negative));
        assert_eq!(parse_id(b"-x", u64::MAX), Err(IdError::Negative));
        assert_eq!(parse_id(b"4611686018427387903", (1 << 62) - 1), Ok((1 << 62) - 1));
        assert_eq!(parse_id(b"4611686018427387904", (1 << 62) - 1), Err(IdError::TooLarge));
    }

    #[test]
    fn python_int_and_float() {
        assert_eq!(parse_py_int(b"1_000", u64::MAX), Ok(1000));
        assert_eq!(parse_py_int(b"-0", u64::MAX), Ok(0));
        assert_eq!(parse_py_int(b"+5", u64::MAX), Ok(5));
        assert_eq!(parse_py_int(b"-5", u64::MAX), Err(IdError::Negative));
        for bad in ["", "_1", "1_", "1__0", "+", "-", "1.0", "0x1"] {
            assert_eq!(parse_py_int(bad.as_bytes(), u64::MAX), Err(IdError::NotInteger), "{bad:?}");
        }
        assert_eq!(parse_py_int(b"1099511627776", 1 << 31), Err(IdError::TooLarge));
        for (t, v) in [("1.5", 1.5), ("-2", -2.0), ("+.5", 0.5), ("5.", 5.0), ("1e3", 1e3), ("1_0.2_5", 10.25), ("1E-2", 0.01), ("1.e2", 100.0)] {
            assert_eq!(parse_py_float(t.as_bytes()), Some(v), "{t:?}");
        }
        for bad in ["", ".", "e5", "1e", "1_", "_1", "1__0", "1_.5", "1._5", "1e_5", "0x1", "1,5", "--1"] {
            assert_eq!(parse_py_float(bad.as_bytes()), None, "{bad:?}");
        }
        assert!(parse_py_float(b"NaN").unwrap().is_nan());
        assert_eq!(parse_py_float(b"-Infinity"), Some(f64::NEG_INFINITY));
    }
}
