//! Rating files (`user item rating` triples): the syntax of `scalefree-mf`'s reader, which
//! uses [`RatingSyntax`] for its lines too, so the two accept the same files.
//!
//! MovieLens `u.data` and LIBMF text (whitespace separated, extra fields such as a
//! timestamp ignored), MovieLens `ratings.dat` (`::`), `ratings.csv` (commas, header lines
//! before the first rating skipped), Matrix Market coordinate (banner on line 1, size line);
//! semicolons; blank lines and lines starting with `#` or `%` are skipped; the separator is
//! the one of the first data line of the file (a line holding two candidates is an error
//! asking for `--delimiter`), or the caller's. Header lines (a first field that is not a
//! number) before the first rating are skipped, unless the caller says there is no header. Ratings must be finite. Every rank reads the prologue
//! (everything before the first rating), so a header can only be at the start of the file
//! and every rank agrees on the separator.

use std::path::{Path, PathBuf};

use crate::dialect::{detect_delimiter, is_float, Delimiter, Dialect, Header};
use crate::error::{BadLine, Result};
use crate::matrix_market::MatrixMarket;
use crate::number::{parse_id, IdError};
use crate::share::{self, Format, Part};
use crate::ReadOptions;

/// The first three fields (trimmed) and the number of fields.
fn first_three<'a>(fields: impl Iterator<Item = &'a str>) -> ([&'a str; 3], usize) {
    let mut out = [""; 3];
    let mut n = 0;
    for x in fields {
        if n < 3 {
            out[n] = x.trim();
        }
        n += 1;
    }
    (out, n)
}

/// What one line of a rating file is.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum RatingLine {
    /// Blank, comment, Matrix Market banner or size line, CSV header.
    Skip,
    Rating { user: u64, item: u64, rating: f32 },
}

/// The line-by-line syntax of rating files (state: Matrix Market header, separator, whether
/// a rating was seen — header lines are only skipped before the first one).
#[derive(Clone, Debug)]
pub struct RatingSyntax {
    mm: MatrixMarket,
    sep: Option<Delimiter>,
    header: Header,
    seen_rating: bool,
    max_id: u64,
    /// Accept `user item` lines without a rating (returned with a NaN rating).
    pairs: bool,
}

impl RatingSyntax {
    /// `max_id`: the largest id accepted (`u64::MAX`, or `i64::MAX` for int64 output).
    pub fn new(max_id: u64) -> Self {
        RatingSyntax { mm: MatrixMarket::default(), sep: None, header: Header::Auto, seen_rating: false, max_id, pairs: false }
    }

    /// Also accept `user item` lines (for prediction input); their rating is NaN.
    pub fn with_pairs(mut self) -> Self {
        self.pairs = true;
        self
    }

    /// The caller's delimiter (None: detected) and header rule.
    pub fn with_dialect(mut self, delimiter: Option<Delimiter>, header: Header) -> Self {
        self.sep = delimiter;
        self.header = header;
        self
    }

    /// A new file (part) starts: its header lines are skipped again.
    pub fn start_part(&mut self) {
        self.mm = MatrixMarket::default();
        self.seen_rating = false;
    }

    /// The entry count of a Matrix Market size line, once read.
    pub fn declared_entries(&self) -> Option<u64> {
        self.mm.declared_entries
    }

    fn id(&self, tok: &str, what: &str) -> std::result::Result<u64, String> {
        parse_id(tok.as_bytes(), self.max_id).map_err(|e| match e {
            IdError::Negative => format!("negative {what} id {tok:?}"),
            IdError::TooLarge if self.max_id == u64::MAX => format!("{what} id {tok:?} overflows 64 bits"),
            IdError::TooLarge => format!("{what} id {tok:?} is larger than {}", self.max_id),
            IdError::NotInteger => format!("{what} id {tok:?} is not a non-negative integer"),
        })
    }

    /// One line (with or without its line end); `first_line`: it is line 1 of the file.
    /// Errors are the message without file and line.
    pub fn line(&mut self, line: &str, first_line: bool) -> std::result::Result<RatingLine, String> {
        let t = line.trim();
        if self.mm.banner(t, first_line, "ratings")? {
            return Ok(RatingLine::Skip);
        }
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            return Ok(RatingLine::Skip);
        }
        if self.mm.size_line(t)? {
            return Ok(RatingLine::Skip);
        }
        let sep = match self.sep {
            Some(d) => d,
            None => *self.sep.insert(detect_delimiter(t.as_bytes(), true)?),
        };
        let (fields, nf) = match sep {
            Delimiter::DoubleColon => first_three(t.split("::")),
            Delimiter::Comma => first_three(t.split(',')),
            Delimiter::Semicolon => first_three(t.split(';')),
            Delimiter::Blanks => first_three(t.split_whitespace()),
        };
        // A header: a data line before the first rating whose first field is not numeric
        // (or, with `Header::Present`, whatever it holds).
        if !self.seen_rating && nf >= 1 {
            let skip = match self.header {
                Header::Auto => fields[0].parse::<f64>().is_err() && !fields[0].starts_with('-'),
                Header::Present => true,
                Header::Absent => false,
            };
            if skip {
                if self.header == Header::Present {
                    self.seen_rating = true; // one header line
                }
                return Ok(RatingLine::Skip);
            }
        }
        if nf == 2 && self.pairs {
            let user = self.id(fields[0], "user")?;
            let item = self.id(fields[1], "item")?;
            self.seen_rating = true;
            return Ok(RatingLine::Rating { user, item, rating: f32::NAN });
        }
        if nf < 3 {
            return Err(format!("expected `user item rating`, got {t:?}"));
        }
        let user = self.id(fields[0], "user")?;
        let item = self.id(fields[1], "item")?;
        let rating: f32 = fields[2].parse().map_err(|_| format!("rating {:?} is not a number", fields[2]))?;
        if !rating.is_finite() {
            return Err(format!("rating {:?} is not finite", fields[2]));
        }
        self.seen_rating = true;
        Ok(RatingLine::Rating { user, item, rating })
    }
}

/// One rank's ratings, in file order, with the ids as written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RatingShare {
    pub users: Vec<i64>,
    pub items: Vec<i64>,
    pub ratings: Vec<f32>,
}

pub(crate) struct RatingFormat {
    syntax: RatingSyntax,
    /// Checks that every part starts with the header of the first.
    dialect: Dialect,
    pub(crate) out: RatingShare,
}

fn text(bytes: &[u8]) -> std::result::Result<&str, BadLine> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        BadLine::new(at, format!("binary data (byte 0x{:02x} is not UTF-8), not a text file", bytes[at]))
    })
}

impl Format for RatingFormat {
    const NOUN: &'static str = "ratings";

    fn start_part(&mut self, path: &Path) {
        self.dialect.start_part(path);
        self.syntax.start_part();
    }

    fn is_body(&mut self, line: &[u8], at_file_start: bool) -> std::result::Result<bool, String> {
        let t = text(line).map_err(|b| b.msg)?;
        let trimmed = t.trim();
        let candidate = !(trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('%'));
        let got = self.syntax.line(t, at_file_start)?;
        if candidate && self.dialect.is_fresh() {
            if trimmed.starts_with("%%MatrixMarket") || self.syntax.declared_entries().is_some() {
                self.dialect.settle();
            } else {
                // The header check across parts (the syntax has skipped or read the line).
                self.dialect.delimiter = self.syntax.sep;
                self.dialect.first_line(trimmed.as_bytes(), true, is_float)?;
            }
        }
        Ok(matches!(got, RatingLine::Rating { .. }))
    }

    fn parse(&mut self, bytes: &[u8]) -> std::result::Result<(), BadLine> {
        let s = text(bytes)?;
        let mut at = 0;
        for line in s.split_inclusive('\n') {
            // The prologue has been read, so no line here is line 1.
            match self.syntax.line(line, false).map_err(|msg| BadLine::new(at, msg))? {
                RatingLine::Skip => {}
                RatingLine::Rating { user, item, rating } => {
                    self.out.users.push(user as i64);
                    self.out.items.push(item as i64);
                    self.out.ratings.push(rating);
                }
            }
            at += line.len();
        }
        Ok(())
    }
}

/// Reads rank `part.rank`'s share of the rating file `path` (plain or gzip, or a part
/// directory). Ids are at most `i64::MAX`. A Matrix Market entry count is not checked here
/// (each rank sees only its share); a file without ratings is an error on every rank.
pub fn read_ratings_share(path: &Path, part: Part, options: &ReadOptions) -> Result<RatingShare> {
    read_ratings_parts(&crate::source::resolve_parts(path)?, part, options)
}

/// Reads rank `part.rank`'s share of the ratings made of the files `parts`, in order.
pub fn read_ratings_parts(parts: &[PathBuf], part: Part, options: &ReadOptions) -> Result<RatingShare> {
    let mut f = RatingFormat::new(options);
    share::read(parts, part, options, &mut f)?;
    Ok(f.out)
}

impl RatingFormat {
    pub(crate) fn new(options: &ReadOptions) -> RatingFormat {
        let syntax = RatingSyntax::new(i64::MAX as u64).with_dialect(options.delimiter, options.header);
        let dialect = Dialect::new(options.delimiter, options.header);
        RatingFormat { syntax, dialect, out: RatingShare::default() }
    }
}
