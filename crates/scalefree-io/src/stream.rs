//! A text file in one gzip stream that one rank decompresses and others parse: a single
//! member cannot be split, so instead of every rank decompressing all of it (the fallback of
//! the share readers, see [`crate::gz`]), one rank reads the chunks ([`TextStream::chunks`])
//! and hands them out, and each receiver parses what it got ([`TextStream::parse`]). Every
//! rank opens the stream (reading its prologue: the dialect and where the body starts agree
//! everywhere). One type for every format: edges, ratings, svmlight rows.

use std::path::{Path, PathBuf};

use crate::edges::{EdgeFormat, EdgeOptions, Edges};
use crate::error::{ReadError, Result};
use crate::ratings::{RatingFormat, RatingShare};
use crate::share::{self, Format};
use crate::svmlight::{SvmlightFormat, SvmlightShare};
use crate::ReadOptions;

/// What a stream's lines are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Edges(EdgeOptions),
    Ratings,
    /// svmlight rows, indices at most `max_index`.
    Svmlight { max_index: u64 },
}

/// What a stream's parsed lines are, by kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    Edges(Edges),
    Ratings(RatingShare),
    Svmlight(SvmlightShare),
}

enum Parser {
    Edges(EdgeFormat),
    Ratings(RatingFormat),
    Svmlight(SvmlightFormat),
}

/// One text file, opened for one reader handing chunks to parsers (module doc).
pub struct TextStream {
    path: PathBuf,
    parser: Parser,
    body: Option<share::Body>,
}

fn open_body<F: Format>(path: &Path, format: &mut F, options: &ReadOptions) -> Result<share::Body> {
    format.start_part(path);
    share::open_part(path, 0, options, format)?.ok_or_else(|| share::no_data::<F>(path))
}

fn parse_chunk<F: Format>(path: &Path, format: &mut F, chunk: &[u8], lines_before: u64) -> Result<()> {
    format.parse(chunk).map_err(|bad| ReadError::Parse {
        path: path.to_path_buf(),
        line: lines_before + crate::line::count_newlines(&chunk[..bad.at]) + 1,
        msg: bad.msg,
    })
}

impl TextStream {
    /// Opens the file `path` (one file) and reads its prologue.
    pub fn open(path: &Path, kind: StreamKind, options: &ReadOptions) -> Result<TextStream> {
        let (parser, body) = match kind {
            StreamKind::Edges(eo) => {
                let mut f = EdgeFormat::<Edges>::new(&eo, options)?;
                let body = open_body(path, &mut f, options)?;
                (Parser::Edges(f), body)
            }
            StreamKind::Ratings => {
                let mut f = RatingFormat::new(options);
                let body = open_body(path, &mut f, options)?;
                (Parser::Ratings(f), body)
            }
            StreamKind::Svmlight { max_index } => {
                let mut f = SvmlightFormat::new(max_index, options);
                let body = open_body(path, &mut f, options)?;
                (Parser::Svmlight(f), body)
            }
        };
        Ok(TextStream { path: path.to_path_buf(), parser, body: Some(body) })
    }

    /// Whether the file is one gzip stream that cannot be split by members (the case for
    /// one reader handing out chunks).
    pub fn is_single_stream(&self) -> bool {
        matches!(&self.body, Some(share::Body::Gz(g)) if g.is_single_stream())
    }

    /// The decompressed body in chunks of about `chunk_bytes` cut at line ends (a single gzip
    /// stream only).
    pub fn chunks(&self, chunk_bytes: usize) -> Result<crate::gz::BodyChunks> {
        match &self.body {
            Some(share::Body::Gz(g)) if g.is_single_stream() => g.body_chunks(&self.path, chunk_bytes.max(1)),
            _ => Err(ReadError::InvalidArgument(format!("{} is not a single gzip stream", self.path.display()))),
        }
    }

    /// Parses a chunk of whole body lines; `lines_before`: the lines of the file before it
    /// (for the line numbers of errors).
    pub fn parse(&mut self, chunk: &[u8], lines_before: u64) -> Result<()> {
        let path = &self.path;
        match &mut self.parser {
            Parser::Edges(f) => parse_chunk(path, f, chunk, lines_before),
            Parser::Ratings(f) => parse_chunk(path, f, chunk, lines_before),
            Parser::Svmlight(f) => parse_chunk(path, f, chunk, lines_before),
        }
    }

    /// The lines parsed so far (the stream keeps none).
    pub fn take(&mut self) -> Parsed {
        match &mut self.parser {
            Parser::Edges(f) => Parsed::Edges(std::mem::take(&mut f.out)),
            Parser::Ratings(f) => Parsed::Ratings(std::mem::take(&mut f.out)),
            Parser::Svmlight(f) => Parsed::Svmlight(std::mem::take(&mut f.out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(path: &Path, text: &str) {
        let mut e = flate2::write::GzEncoder::new(std::fs::File::create(path).unwrap(), flate2::Compression::fast());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap();
    }

    /// Chunks handed to two parsers in turn give every line once, as the share reader does.
    #[test]
    fn chunks_parsed_elsewhere_are_the_whole() {
        let dir = std::env::temp_dir().join(format!("sf-io-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let o = ReadOptions::default();
        let mut text = String::from("user,item,rating\n");
        for k in 0..5000 {
            text.push_str(&format!("{},{},{}\n", k % 97, k % 13, (k % 5) + 1));
        }
        let p = dir.join("r.csv.gz");
        gz(&p, &text);
        let reader = TextStream::open(&p, StreamKind::Ratings, &o).unwrap();
        assert!(reader.is_single_stream());
        let mut parsers = [TextStream::open(&p, StreamKind::Ratings, &o).unwrap(), TextStream::open(&p, StreamKind::Ratings, &o).unwrap()];
        let mut chunks = reader.chunks(1000).unwrap();
        let mut k = 0;
        let mut got: Vec<RatingShare> = Vec::new();
        while let Some((before, c)) = chunks.next_chunk().unwrap() {
            let c = c.to_vec();
            parsers[k % 2].parse(&c, before).unwrap();
            let Parsed::Ratings(r) = parsers[k % 2].take() else { panic!() };
            got.push(r);
            k += 1;
        }
        assert!(k > 10);
        let users: Vec<i64> = got.iter().flat_map(|r| r.users.clone()).collect();
        let want = crate::read_ratings_share(&p, crate::Part::whole(), &o).unwrap();
        assert_eq!(users, want.users);
        // A bad line names the file and its line.
        let bad = dir.join("bad.txt.gz");
        gz(&bad, "1 2\n3 4\n5 x\n");
        let mut s = TextStream::open(&bad, StreamKind::Edges(EdgeOptions::default()), &o).unwrap();
        let mut c = s.chunks(1 << 20).unwrap();
        let (before, chunk) = c.next_chunk().unwrap().unwrap();
        let chunk = chunk.to_vec();
        let msg = s.parse(&chunk, before).unwrap_err().to_string();
        assert!(msg.contains("bad.txt.gz:3:"), "{msg}");
        let svm = dir.join("s.svm.gz");
        gz(&svm, "1 1:0.5 3:2\n-1 2:1\n");
        let mut s = TextStream::open(&svm, StreamKind::Svmlight { max_index: 10 }, &o).unwrap();
        let mut c = s.chunks(1 << 20).unwrap();
        let (before, chunk) = c.next_chunk().unwrap().unwrap();
        let chunk = chunk.to_vec();
        s.parse(&chunk, before).unwrap();
        let Parsed::Svmlight(r) = s.take() else { panic!() };
        assert_eq!(r.labels, vec![1.0, -1.0]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
