//! The collectives use the transport through its backend-neutral API (`Device`, `Channel`,
//! the `Backend` trait and its capabilities): no code here names a backend. Comments may
//! still describe how a backend behaves.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line: what precedes a `//` comment.
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

#[test]
fn collectives_never_name_a_backend() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5, "found the crate's sources under {}", src.display());
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let c = code(line).to_ascii_lowercase();
            if c.contains("ucx") || c.contains("backends::") || c.contains("shm::") {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "collectives name a transport backend:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_code_not_comments() {
    assert_eq!(code("use x::ucx::Window; // over UCX"), "use x::ucx::Window; ");
    assert_eq!(code("//! over UCX"), "");
}
