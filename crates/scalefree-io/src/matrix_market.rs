//! The Matrix Market header (`%%MatrixMarket` banner on line 1, then a `rows cols entries`
//! size line as the first line that is not a comment), shared by the edge and rating readers.

#[derive(Clone, Debug, Default)]
pub(crate) struct MatrixMarket {
    /// Line 1 was a Matrix Market banner.
    seen_banner: bool,
    seen_size: bool,
    /// The entry count of the size line.
    pub declared_entries: Option<u64>,
}

impl MatrixMarket {
    /// Whether the trimmed line `t` is the banner (only line 1 can be). `noun`: what the
    /// entries are, for the error on an array (not coordinate) file.
    pub fn banner(&mut self, t: &str, first_line: bool, noun: &str) -> Result<bool, String> {
        if !(first_line && t.starts_with("%%MatrixMarket")) {
            return Ok(false);
        }
        if !t.to_ascii_lowercase().contains("coordinate") {
            return Err(format!("only Matrix Market coordinate files hold {noun}"));
        }
        self.seen_banner = true;
        Ok(true)
    }

    /// Whether the trimmed data line `t` is the size line (the first one after a banner).
    pub fn size_line(&mut self, t: &str) -> Result<bool, String> {
        if !self.seen_banner || self.seen_size {
            return Ok(false);
        }
        self.seen_size = true;
        let f: Vec<&str> = t.split_whitespace().collect();
        if f.len() != 3 {
            return Err(format!("expected the Matrix Market size line `rows cols nnz`, got {t:?}"));
        }
        self.declared_entries = f[2].parse().ok();
        Ok(true)
    }
}
