//! The dialect of a delimited text file: its field delimiter and whether it starts with a
//! header line, detected from the file or given by the caller (`--delimiter`, `--header`).
//!
//! Detection looks at the first line of the first part that is not blank, a comment or a
//! Matrix Market header line — every rank reads that line (it is in the prologue), so every
//! rank decides alike, and no rank reads more than the prologue to decide:
//! - delimiter: `,` if the line holds a comma, `;` if it holds a semicolon, else runs of
//!   blanks (spaces and tabs; `tab` and `space` name this too, ids and numbers never hold
//!   blanks). A line with both `,` and `;`, or a tab beside either, is ambiguous: an error
//!   asking for `--delimiter`.
//! - header: the line is a header when its first field is not a number (the format says
//!   what a number is); `Header::Present` skips it whatever it holds, `Header::Absent` reads
//!   it as data.
//!
//! A file of several parts (a part directory) has the header of its first part at the top of
//! every part; a part that starts with another line is an error naming that part and line.

use std::path::Path;

use crate::line::{is_blank, quote};

/// What separates the fields of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delimiter {
    /// Runs of spaces and tabs.
    Blanks,
    Comma,
    Semicolon,
    /// `::` (MovieLens `ratings.dat`; rating files only).
    DoubleColon,
}

impl Delimiter {
    /// The delimiter a name stands for: `tab`, `space`, `whitespace` (all [`Delimiter::Blanks`]),
    /// `comma`, `semicolon`, `::`, or the character itself (`,`, `;`, a tab, a space).
    pub fn from_name(name: &str) -> Option<Delimiter> {
        match name.to_ascii_lowercase().as_str() {
            "tab" | "\t" | "\\t" | "space" | " " | "whitespace" | "blank" | "blanks" => Some(Delimiter::Blanks),
            "comma" | "," => Some(Delimiter::Comma),
            "semicolon" | ";" => Some(Delimiter::Semicolon),
            "::" | "doublecolon" => Some(Delimiter::DoubleColon),
            _ => None,
        }
    }

    /// The fields of `line`, trimmed of blanks (for [`Delimiter::Blanks`], the non-empty runs
    /// of non-blanks).
    pub fn fields<'a>(self, line: &'a [u8]) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
        match self {
            Delimiter::Blanks => Box::new(line.split(|&b| is_blank(b)).filter(|t| !t.is_empty())),
            Delimiter::Comma => Box::new(line.split(|&b| b == b',').map(trim)),
            Delimiter::Semicolon => Box::new(line.split(|&b| b == b';').map(trim)),
            Delimiter::DoubleColon => Box::new(DoubleColonFields(Some(line)).map(trim)),
        }
    }

    /// The single byte of a comma or semicolon delimiter.
    pub(crate) fn byte(self) -> Option<u8> {
        match self {
            Delimiter::Comma => Some(b','),
            Delimiter::Semicolon => Some(b';'),
            _ => None,
        }
    }
}

struct DoubleColonFields<'a>(Option<&'a [u8]>);

impl<'a> Iterator for DoubleColonFields<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.0?;
        match memchr::memmem::find(s, b"::") {
            Some(k) => {
                self.0 = Some(&s[k + 2..]);
                Some(&s[..k])
            }
            None => {
                self.0 = None;
                Some(s)
            }
        }
    }
}

/// `s` without leading and trailing blanks (and a trailing `\r`).
pub(crate) fn trim(s: &[u8]) -> &[u8] {
    let s = s.strip_suffix(b"\r").unwrap_or(s);
    let a = s.iter().position(|&b| !is_blank(b)).unwrap_or(s.len());
    let e = s.iter().rposition(|&b| !is_blank(b)).map_or(a, |k| k + 1);
    &s[a..e.max(a)]
}

/// Whether the first line is a header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Header {
    /// A header when its first field is not a number.
    #[default]
    Auto,
    Present,
    Absent,
}

impl Header {
    /// `auto`, `yes`/`true`/`present`, `no`/`false`/`absent`.
    pub fn from_name(name: &str) -> Option<Header> {
        match name.to_ascii_lowercase().as_str() {
            "auto" => Some(Header::Auto),
            "yes" | "true" | "present" | "1" => Some(Header::Present),
            "no" | "false" | "absent" | "none" | "0" => Some(Header::Absent),
            _ => None,
        }
    }
}

/// The delimiter `line` shows, or why it is ambiguous. `double_colon`: `::` is a candidate
/// (rating files).
pub fn detect_delimiter(line: &[u8], double_colon: bool) -> Result<Delimiter, String> {
    if double_colon && memchr::memmem::find(line, b"::").is_some() {
        return Ok(Delimiter::DoubleColon);
    }
    let comma = memchr::memchr(b',', line).is_some();
    let semi = memchr::memchr(b';', line).is_some();
    let tab = memchr::memchr(b'\t', line).is_some();
    let what = match (comma, semi, tab) {
        (true, true, _) => "both ',' and ';'",
        (true, false, true) => "both ',' and a tab",
        (false, true, true) => "both ';' and a tab",
        (true, false, false) => return Ok(Delimiter::Comma),
        (false, true, false) => return Ok(Delimiter::Semicolon),
        (false, false, _) => return Ok(Delimiter::Blanks),
    };
    Err(format!("ambiguous delimiter: {} holds {what} (pass --delimiter)", quote(line)))
}

/// The dialect as the caller gives it and as the readers decide it (module doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct Dialect {
    pub delimiter: Option<Delimiter>,
    header_mode: Header,
    /// Decided on the first part: `Some(None)` no header, `Some(Some(line))` that header.
    header: Option<Option<Vec<u8>>>,
    /// The part the header was decided on, for errors in later parts.
    first_part: String,
    part: String,
    /// The first candidate line of the current part is still to come.
    fresh: bool,
}

impl Dialect {
    pub fn new(delimiter: Option<Delimiter>, header: Header) -> Dialect {
        Dialect { delimiter, header_mode: header, fresh: true, ..Dialect::default() }
    }

    /// A new part starts (its prologue is about to be read).
    pub fn start_part(&mut self, path: &Path) {
        self.part = path.display().to_string();
        self.fresh = true;
    }

    /// Whether the first line of the current part has been seen.
    pub fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// The dialect has seen its first line (a format whose header is fixed, such as a
    /// Matrix Market file, says so).
    pub fn settle(&mut self) {
        self.fresh = false;
        if self.header.is_none() {
            self.header = Some(None);
            self.first_part = self.part.clone();
        }
    }

    /// The first line of the current part that is not blank or a comment: decides the
    /// delimiter and the header on the first part, checks the header on the others.
    /// Returns whether the line is the header (to skip). `is_number`: whether a field is a
    /// number of the format.
    pub fn first_line(&mut self, line: &[u8], double_colon: bool, is_number: impl Fn(&[u8]) -> bool) -> Result<bool, String> {
        self.fresh = false;
        let line = trim(line);
        let delimiter = match self.delimiter {
            Some(d) => d,
            None => *self.delimiter.insert(detect_delimiter(line, double_colon)?),
        };
        match &self.header {
            None => {
                let first = delimiter.fields(line).next().unwrap_or_default();
                let is_header = match self.header_mode {
                    Header::Present => true,
                    Header::Absent => false,
                    Header::Auto => !is_number(first),
                };
                self.header = Some(is_header.then(|| line.to_vec()));
                self.first_part = self.part.clone();
                Ok(is_header)
            }
            Some(Some(h)) if h.as_slice() == line => Ok(true),
            Some(Some(h)) => Err(format!("the part starts with {}, not the header {} of {}", quote(line), quote(h), self.first_part)),
            Some(None) => Ok(false),
        }
    }
}

/// Whether `tok` is a number as Python's `float` reads it (for header detection).
pub(crate) fn is_float(tok: &[u8]) -> bool {
    crate::number::parse_py_float(tok).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection() {
        assert_eq!(detect_delimiter(b"1,2", false), Ok(Delimiter::Comma));
        assert_eq!(detect_delimiter(b"1 ; 2", false), Ok(Delimiter::Semicolon));
        assert_eq!(detect_delimiter(b"1\t2", false), Ok(Delimiter::Blanks));
        assert_eq!(detect_delimiter(b"1  2", false), Ok(Delimiter::Blanks));
        assert_eq!(detect_delimiter(b"1::2::5", true), Ok(Delimiter::DoubleColon));
        assert!(detect_delimiter(b"1,2;3", false).unwrap_err().contains("ambiguous delimiter"));
        assert!(detect_delimiter(b"1,2\t3", false).is_err());
        let f: Vec<&[u8]> = Delimiter::Comma.fields(b" a , b,").collect();
        assert_eq!(f, [&b"a"[..], b"b", b""]);
        let f: Vec<&[u8]> = Delimiter::DoubleColon.fields(b"1::2::3").collect();
        assert_eq!(f, [&b"1"[..], b"2", b"3"]);
        assert_eq!(trim(b" \tx y \r"), b"x y");
        assert_eq!(trim(b"  "), b"");
    }

    #[test]
    fn header_per_part() {
        let num = |t: &[u8]| t.iter().all(u8::is_ascii_digit) && !t.is_empty();
        let mut d = Dialect::new(None, Header::Auto);
        d.start_part(Path::new("p0"));
        assert_eq!(d.first_line(b"src,dst", false, num), Ok(true));
        d.start_part(Path::new("p1"));
        assert_eq!(d.first_line(b"src,dst\r", false, num), Ok(true));
        d.start_part(Path::new("p2"));
        let e = d.first_line(b"a,b", false, num).unwrap_err();
        assert!(e.contains("not the header 'src,dst' of p0"), "{e}");
        let mut d = Dialect::new(None, Header::Auto);
        d.start_part(Path::new("p0"));
        assert_eq!(d.first_line(b"1 2", false, num), Ok(false));
        d.start_part(Path::new("p1"));
        assert_eq!(d.first_line(b"3 4", false, num), Ok(false));
        let mut d = Dialect::new(Some(Delimiter::Comma), Header::Present);
        d.start_part(Path::new("p0"));
        assert_eq!(d.first_line(b"1,2", false, num), Ok(true));
        let mut d = Dialect::new(None, Header::Absent);
        d.start_part(Path::new("p0"));
        assert_eq!(d.first_line(b"x,y", false, num), Ok(false));
    }
}
