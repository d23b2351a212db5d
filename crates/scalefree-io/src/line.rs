//! Line helpers shared by the split, the gzip chunker and the formats.

/// The line starting at `pos`: its bytes without the `\n` and without one `\r` before it,
/// and the start of the next line (`bytes.len()` after a final line without `\n`).
pub(crate) fn line_at(bytes: &[u8], pos: usize) -> (&[u8], usize) {
    let (end, next) = match memchr::memchr(b'\n', &bytes[pos..]) {
        Some(k) => (pos + k, pos + k + 1),
        None => (bytes.len(), bytes.len()),
    };
    (strip_cr(&bytes[pos..end]), next)
}

/// `line` without one trailing `\r` (CRLF line ends).
pub(crate) fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Number of `\n` in `bytes` (a loop the compiler vectorises; only on error paths and per
/// gzip chunk).
pub(crate) fn count_newlines(bytes: &[u8]) -> u64 {
    let mut n = 0u64;
    for c in bytes.chunks(1 << 16) {
        n += c.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    n
}

/// Spaces and tabs: the field separators of edge lists.
#[inline(always)]
pub(crate) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// The first non-blank byte of `line` is `#` or `%`.
pub(crate) fn is_comment(line: &[u8]) -> bool {
    matches!(line.iter().find(|&&b| !is_blank(b)), Some(b'#' | b'%'))
}

/// `line` holds only spaces and tabs.
pub(crate) fn is_blank_line(line: &[u8]) -> bool {
    line.iter().all(|&b| is_blank(b))
}

/// `bytes` for an error message: quoted, non-printable bytes escaped (so the message stays
/// one line), cut after 60 bytes.
pub(crate) fn quote(bytes: &[u8]) -> String {
    const MAX: usize = 60;
    let cut = &bytes[..bytes.len().min(MAX)];
    let more = if bytes.len() > MAX { "..." } else { "" };
    format!("'{}{more}'", cut.escape_ascii())
}

/// Why `line` is not text, if it is not: a NUL byte or bytes that are not UTF-8.
pub(crate) fn not_text(line: &[u8]) -> Option<String> {
    if let Some(k) = memchr::memchr(0, line) {
        return Some(format!("binary data (NUL byte at column {}), not a text file", k + 1));
    }
    match std::str::from_utf8(line) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "binary data (byte 0x{:02x} at column {} is not UTF-8), not a text file",
            line[e.valid_up_to()],
            e.valid_up_to() + 1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_counts() {
        let b = b"a\r\nbc\n\nd";
        assert_eq!(line_at(b, 0), (&b"a"[..], 3));
        assert_eq!(line_at(b, 3), (&b"bc"[..], 6));
        assert_eq!(line_at(b, 6), (&b""[..], 7));
        assert_eq!(line_at(b, 7), (&b"d"[..], 8));
        assert_eq!(count_newlines(b), 3);
        assert!(is_comment(b"  \t# x") && is_comment(b"%x") && !is_comment(b" 1 # x"));
        assert_eq!(quote(b"a\0b'"), "'a\\x00b\\''");
        assert!(not_text(b"ab\0").unwrap().contains("NUL byte at column 3"));
        assert!(not_text(b"a\xff").unwrap().contains("0xff at column 2"));
        assert!(not_text("é".as_bytes()).is_none());
    }
}
