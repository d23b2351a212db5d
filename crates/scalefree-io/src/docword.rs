//! Bag-of-words counts (`docword`): `doc word count` triples, 1-based ids, as the UCI
//! bag-of-words files hold them after their three header lines D (documents), W (words) and
//! NNZ (entries) — or as a pipeline exports them, without those lines: the delimiter
//! detected (blanks, comma, semicolon; see [`crate::dialect`]), an optional header line
//! (`doc,word,count`), one file or a part directory, plain or gzip.
//!
//! The UCI lines are recognised at the top of the first part: its first lines that are one
//! integer each (all three must be there). Then docIDs must lie in `1..=D`, wordIDs in
//! `1..=W`, and the caller checks that a whole read holds NNZ entries. Without them, the
//! caller takes D and W from the largest ids. Blank lines and lines starting with `#` or
//! `%` are skipped. Counts are finite numbers.

use std::path::{Path, PathBuf};

use crate::dialect::{is_float, trim, Delimiter, Dialect};
use crate::error::{BadLine, Result};
use crate::line::{is_blank_line, is_comment, line_at, not_text, quote};
use crate::number::{parse_id, parse_py_float};
use crate::share::{self, Format, Part};
use crate::ReadOptions;

/// One rank's entries, in file order: 0-based document and word ids and their counts, and
/// the UCI header (D, W, NNZ) when the input has one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DocwordShare {
    pub docs: Vec<u64>,
    pub words: Vec<u64>,
    pub counts: Vec<f64>,
    pub declared: Option<[u64; 3]>,
}

struct DocwordFormat {
    dialect: Dialect,
    /// The UCI header lines read so far (first part only).
    header_lines: Vec<u64>,
    /// Parts started so far.
    parts: usize,
    out: DocwordShare,
}

/// The one integer a line holds, if it holds just that.
fn single_integer(line: &[u8]) -> Option<u64> {
    let t = trim(line);
    if t.is_empty() || t.iter().any(|&b| !b.is_ascii_digit()) {
        return None;
    }
    parse_id(t, u64::MAX).ok()
}

const NAMES: [&str; 3] = ["the document count D", "the vocabulary size W", "the entry count NNZ"];

impl DocwordFormat {
    fn id(&self, tok: &[u8], what: &str, bound: Option<u64>) -> std::result::Result<u64, String> {
        let v = parse_id(tok, u64::MAX).map_err(|_| format!("{what} {} is not a positive integer", quote(tok)))?;
        match bound {
            Some(b) if v == 0 || v > b => Err(format!("{what} {v} is outside 1..={b}")),
            None if v == 0 => Err(format!("{what} 0: ids are 1-based")),
            _ => Ok(v - 1),
        }
    }

    fn entry(&mut self, line: &[u8]) -> std::result::Result<(), String> {
        if let Some(why) = not_text(line) {
            return Err(why);
        }
        let delimiter = self.dialect.delimiter.unwrap_or(Delimiter::Blanks);
        let mut f = delimiter.fields(line);
        let (a, b, c) = (f.next(), f.next(), f.next());
        let (Some(a), Some(b), Some(c)) = (a, b, c) else {
            return Err(format!("expected docID wordID count, got {}", quote(trim(line))));
        };
        if f.next().is_some() {
            return Err(format!("too many fields in {} (expected docID wordID count)", quote(trim(line))));
        }
        let (docs, words) = match self.out.declared {
            Some([d, w, _]) => (Some(d), Some(w)),
            None => (None, None),
        };
        let doc = self.id(a, "docID", docs)?;
        let word = self.id(b, "wordID", words)?;
        let count = parse_py_float(c).ok_or_else(|| format!("cannot read the count from {}", quote(c)))?;
        if !count.is_finite() {
            return Err(format!("the count {} is not finite", quote(c)));
        }
        self.out.docs.push(doc);
        self.out.words.push(word);
        self.out.counts.push(count);
        Ok(())
    }
}

impl Format for DocwordFormat {
    const NOUN: &'static str = "entries";

    fn start_part(&mut self, path: &Path) {
        self.dialect.start_part(path);
        self.parts += 1;
    }

    fn is_body(&mut self, line: &[u8], _at_file_start: bool) -> std::result::Result<bool, String> {
        if is_blank_line(line) || is_comment(line) {
            return Ok(false);
        }
        let collecting = self.parts == 1 && self.out.declared.is_none() && self.dialect.is_fresh();
        if collecting {
            match single_integer(line) {
                Some(v) if self.header_lines.len() < 3 => {
                    self.header_lines.push(v);
                    if let [d, w, n] = self.header_lines[..] {
                        self.out.declared = Some([d, w, n]);
                    }
                    return Ok(false);
                }
                _ if !self.header_lines.is_empty() => {
                    let k = self.header_lines.len();
                    return Err(format!("expected {} (UCI docword header: D, W, NNZ on lines of their own), got {}", NAMES[k], quote(trim(line))));
                }
                _ => {}
            }
        }
        if self.dialect.is_fresh() {
            let header = self.dialect.first_line(line, false, is_float)?;
            return Ok(!header);
        }
        Ok(true)
    }

    fn parse(&mut self, s: &[u8]) -> std::result::Result<(), BadLine> {
        let mut i = 0;
        while i < s.len() {
            let (line, next) = line_at(s, i);
            if !(is_blank_line(line) || is_comment(line)) {
                self.entry(line).map_err(|msg| BadLine::new(i, msg))?;
            }
            i = next;
        }
        Ok(())
    }
}

/// Reads rank `part.rank`'s share of the docword input `path` (a file, plain or gzip, or a
/// part directory).
pub fn read_docword_share(path: &Path, part: Part, options: &ReadOptions) -> Result<DocwordShare> {
    read_docword_parts(&crate::source::resolve_parts(path)?, part, options)
}

/// Reads rank `part.rank`'s share of the docword input made of the files `parts`, in order.
/// A UCI header that ends before its third line is an error naming the file.
pub fn read_docword_parts(parts: &[PathBuf], part: Part, options: &ReadOptions) -> Result<DocwordShare> {
    let dialect = Dialect::new(options.delimiter, options.header);
    let mut f = DocwordFormat { dialect, header_lines: Vec::new(), parts: 0, out: DocwordShare::default() };
    let got = share::read(parts, part, options, &mut f);
    if matches!(got, Ok(()) | Err(crate::ReadError::Format { .. })) && !f.header_lines.is_empty() && f.out.declared.is_none() {
        let k = f.header_lines.len();
        return Err(crate::ReadError::Format { path: parts[0].clone(), msg: format!("missing {} (UCI docword header: D, W, NNZ)", NAMES[k]) });
    }
    match got {
        // A UCI file without entries (NNZ = 0) is an empty corpus, not an error.
        Err(crate::ReadError::Format { .. }) if f.out.declared.is_some_and(|d| d[2] == 0) && f.out.docs.is_empty() => Ok(f.out),
        Err(e) => Err(e),
        Ok(()) => Ok(f.out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sf-io-docword-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn whole(p: &Path) -> Result<DocwordShare> {
        read_docword_share(p, Part::whole(), &ReadOptions::default())
    }

    #[test]
    fn uci_csv_and_parts_agree() {
        let d = tmp("agree");
        let uci = d.join("docword.a.txt");
        std::fs::write(&uci, "3\n4\n4\n1 2 3\n1 4 1\n3 1 2\n3 2 5\n").unwrap();
        let a = whole(&uci).unwrap();
        assert_eq!(a.declared, Some([3, 4, 4]));
        assert_eq!((a.docs.clone(), a.words.clone(), a.counts.clone()), (vec![0, 0, 2, 2], vec![1, 3, 0, 1], vec![3.0, 1.0, 2.0, 5.0]));
        let csv = d.join("bow.csv");
        std::fs::write(&csv, "doc,word,count\n1,2,3\n1,4,1\n3,1,2\n3,2,5\n").unwrap();
        let b = whole(&csv).unwrap();
        assert_eq!(b.declared, None);
        assert_eq!((&b.docs, &b.words, &b.counts), (&a.docs, &a.words, &a.counts));
        let parts = d.join("parts");
        std::fs::create_dir(&parts).unwrap();
        std::fs::write(parts.join("part-00000.csv"), "doc;word;count\n1;2;3\n1;4;1\n").unwrap();
        std::fs::write(parts.join("part-00001.csv"), "doc;word;count\n3;1;2\n3;2;5\n").unwrap();
        std::fs::write(parts.join("_SUCCESS"), "").unwrap();
        let c = whole(&parts).unwrap();
        assert_eq!((&c.docs, &c.words, &c.counts), (&a.docs, &a.words, &a.counts));
        // Every rank count: the shares in rank order are the whole.
        for size in 1..=4 {
            let mut docs = Vec::new();
            for r in 0..size {
                docs.extend(read_docword_share(&parts, Part::new(r, size, 0).unwrap(), &ReadOptions::default()).unwrap().docs);
            }
            assert_eq!(docs, a.docs, "{size}");
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn errors_name_file_and_line() {
        let d = tmp("err");
        let parts = d.join("parts");
        std::fs::create_dir(&parts).unwrap();
        std::fs::write(parts.join("part-00000.csv"), "doc,word,count\n1,2,3\n").unwrap();
        std::fs::write(parts.join("part-00001.csv"), "document,word,n\n3,1,2\n").unwrap();
        let cases: Vec<(PathBuf, &str)> = vec![
            (d.join("a.txt"), "2\n3\n2\n1 1 4\n1 4 1\n"),
            (d.join("b.txt"), "2\n3\n"),
            (d.join("c.txt"), "2\n3\n1 1 4\n"),
            (d.join("e.csv"), "1,2\n"),
            (d.join("f.csv"), "1,2,x\n"),
            (d.join("g.csv"), "0,2,1\n"),
            (d.join("h.csv"), "1,2,nan\n"),
        ];
        let want = [
            "a.txt:5: wordID 4 is outside 1..=3",
            "b.txt: missing the entry count NNZ",
            "c.txt:3: expected the entry count NNZ",
            "e.csv:1: expected docID wordID count",
            "f.csv:1: cannot read the count",
            "g.csv:1: docID 0: ids are 1-based",
            "h.csv:1: the count 'nan' is not finite",
        ];
        for ((p, text), want) in cases.iter().zip(want) {
            std::fs::write(p, text).unwrap();
            let msg = whole(p).unwrap_err().to_string();
            assert!(msg.contains(want), "{msg} / {want}");
        }
        let msg = whole(&parts).unwrap_err().to_string();
        assert!(msg.contains("part-00001.csv:1") && msg.contains("not the header"), "{msg}");
        // An empty UCI corpus is fine.
        let e = d.join("docword.e.txt");
        std::fs::write(&e, "0\n0\n0\n").unwrap();
        assert_eq!(whole(&e).unwrap().declared, Some([0, 0, 0]));
        std::fs::remove_dir_all(d).unwrap();
    }
}
