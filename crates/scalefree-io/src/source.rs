//! What a reader reads for a path: the file itself, or the part files of a directory as
//! Spark, Dask and Hive write them (`part-00000-….csv`, `0.part`, `000000_0`, plain or `.gz`).
//!
//! [`resolve_parts`] is the one place that decides which files of a directory are data: every
//! regular file (or link to one) in it, in byte order of the names, except markers and
//! hidden files — names starting with `_` (`_SUCCESS`, `_committed_…`, `_temporary`) or `.`
//! (`.part-00000.crc`, `.DS_Store`) and names ending in `.crc`. A subdirectory that is not a
//! marker is an error (a partitioned dataset, `key=value/`, is not read). The parts of a
//! directory are read as one body: see [`crate::share`].

use std::path::{Path, PathBuf};

use crate::error::{ReadError, Result};

/// Whether a directory entry named `name` is a marker or hidden file, not data.
pub fn is_marker(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('.') || name.ends_with(".crc")
}

/// The data files of `path`: `[path]` for a file; for a directory its part files, sorted by
/// name, markers skipped (module doc). A directory without part files, a missing path and
/// a subdirectory among the parts are errors naming the path.
pub fn resolve_parts(path: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| ReadError::Io { path: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut parts = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name_str) = name.to_str() else {
            return Err(ReadError::Format { path: entry.path(), msg: "a part name that is not UTF-8".into() });
        };
        if is_marker(name_str) {
            continue;
        }
        let p = entry.path();
        let m = std::fs::metadata(&p).map_err(|source| ReadError::Io { path: p.clone(), source })?;
        if m.is_dir() {
            return Err(ReadError::Format { path: p, msg: "a subdirectory among the parts (partitioned datasets are not read; pass the subdirectory)".into() });
        }
        parts.push(p);
    }
    if parts.is_empty() {
        return Err(ReadError::Format { path: path.to_path_buf(), msg: "the directory holds no part files".into() });
    }
    parts.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_sorted_and_markers_skipped() {
        let dir = std::env::temp_dir().join(format!("sf-io-parts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("_temporary")).unwrap();
        for name in ["part-00001.csv", "part-00000.csv.gz", "_SUCCESS", ".part-00000.csv.crc", "part-00002.csv.crc", ".hidden"] {
            std::fs::write(dir.join(name), b"1,2\n").unwrap();
        }
        let got = resolve_parts(&dir).unwrap();
        let names: Vec<_> = got.iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names, ["part-00000.csv.gz", "part-00001.csv"]);
        assert_eq!(resolve_parts(&dir.join("part-00001.csv")).unwrap(), vec![dir.join("part-00001.csv")]);
        std::fs::create_dir(dir.join("year=2020")).unwrap();
        assert!(resolve_parts(&dir).unwrap_err().to_string().contains("subdirectory"));
        let empty = dir.join("_temporary");
        assert!(resolve_parts(&empty).unwrap_err().to_string().contains("no part files"));
        assert!(matches!(resolve_parts(&dir.join("missing")), Err(ReadError::Io { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
