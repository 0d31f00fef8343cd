//! The documentation stays true to the tree: every relative link of README.md, ARCHITECTURE.md
//! and `docs/` resolves, every repository path ARCHITECTURE.md names exists, and the protocol
//! version it states is the code's. `make docs` (MkDocs, `--strict`) checks the site as well;
//! this test needs no Python, so it runs in every `cargo test`.

use std::fs;
use std::path::{Path, PathBuf};

/// The repository root (this crate is one level below it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit has a parent folder").to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

fn is_file(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file())
}

fn is_present(path: &Path) -> bool {
    fs::metadata(path).is_ok()
}

/// Every `.md` file under `dir`, recursively (bounded by the tree's size).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|error| panic!("listing {}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            out.push(path);
        }
    }
}

/// The documents the test covers: README.md, ARCHITECTURE.md and every page of `docs/`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    markdown_files(&root.join("docs"), &mut docs);
    docs.sort();
    docs
}

/// The text outside fenced code blocks (links and code spans in examples are not references).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of inline links and images, `[text](target)` / `![alt](target)`, without
/// any `"title"`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("").trim_matches(['<', '>']);
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.is_empty()
        || target.starts_with('#')
        || target.starts_with("http://")
        || target.starts_with("https://")
        || target.starts_with("mailto:")
}

/// The files a page pulls in with pymdownx.snippets (`--8<-- "FILE"`), relative to the root.
fn snippet_includes(text: &str) -> Vec<String> {
    text.lines().filter_map(|line| line.trim().strip_prefix("--8<--")).map(|name| name.trim().trim_matches('"').to_string()).collect()
}

#[test]
fn every_relative_link_in_the_docs_resolves_to_a_file() {
    let root = repo_root();
    let docs_dir = root.join("docs");
    let mut broken = Vec::new();
    for doc in documents(&root) {
        let text = read(&doc);
        let folder = doc.parent().expect("a document has a folder");
        for target in link_targets(&prose(&text)) {
            if is_external(&target) {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            let resolved = folder.join(file);
            if !is_file(&resolved) {
                broken.push(format!("{}: {target} (no such file)", doc.display()));
            } else if doc.starts_with(&docs_dir) && !resolved.canonicalize().is_ok_and(|p| p.starts_with(&docs_dir)) {
                // MkDocs serves docs/ only: a page that links outside it breaks the site.
                broken.push(format!("{}: {target} (outside docs/; the site cannot serve it)", doc.display()));
            }
        }
        // Files included into a page are rendered from that page's folder: relative links in
        // them would point elsewhere on the site than in the repository.
        for include in snippet_includes(&text) {
            let included = root.join(&include);
            assert!(is_file(&included), "{} includes {include}, which does not exist", doc.display());
            for target in link_targets(&prose(&read(&included))) {
                if !is_external(&target) {
                    broken.push(format!("{include}: {target} (a relative link in a file that {} includes)", doc.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken documentation links:\n{}", broken.join("\n"));
}

/// The code spans of a text (`like/this`), outside fenced code blocks.
fn code_spans(text: &str) -> Vec<String> {
    prose(text).split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn every_repository_path_in_architecture_md_exists() {
    let root = repo_root();
    let top_level: Vec<String> = fs::read_dir(&root)
        .expect("the repository root")
        .map(|entry| entry.expect("a directory entry"))
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.') && name != "target")
        .collect();
    let text = read(&root.join("ARCHITECTURE.md"));
    let mut checked = 0;
    let mut missing = Vec::new();
    for span in code_spans(&text) {
        let looks_like_path = span.contains('/')
            && !span.contains(char::is_whitespace)
            && !span.contains(['<', '>', '*', '{', '}', '|', ':'])
            && span.split('/').next().is_some_and(|first| top_level.iter().any(|dir| dir == first));
        if !looks_like_path {
            continue;
        }
        checked += 1;
        if !is_present(&root.join(&span)) {
            missing.push(span);
        }
    }
    assert!(checked > 10, "ARCHITECTURE.md names only {checked} repository paths: is the code map gone?");
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that do not exist:\n{}", missing.join("\n"));
}

/// The `PROTOCOL_VERSION` constant, read from whichever file under `common/` defines it.
fn protocol_version_in_code(root: &Path) -> (u32, PathBuf) {
    const DECLARATION: &str = "pub const PROTOCOL_VERSION: u32 = ";
    let mut found = Vec::new();
    let mut stack = vec![root.join("common")];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|error| panic!("listing {}: {error}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                for line in read(&path).lines() {
                    if let Some(value) = line.trim().strip_prefix(DECLARATION) {
                        let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
                        let version = digits.parse().unwrap_or_else(|_| panic!("{}: {line}", path.display()));
                        found.push((version, path.clone()));
                    }
                }
            }
        }
    }
    assert_eq!(found.len(), 1, "expected one `{DECLARATION}` under common/, found {found:?}");
    found.remove(0)
}

/// Every number that follows `marker` in `text`.
fn numbers_after(text: &str, marker: &str) -> Vec<u32> {
    text.match_indices(marker)
        .filter_map(|(at, _)| {
            let digits: String = text[at + marker.len()..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

#[test]
fn architecture_md_states_the_protocol_version_of_the_code() {
    let root = repo_root();
    let (version, source) = protocol_version_in_code(&root);
    let text = read(&root.join("ARCHITECTURE.md"));
    let alpns = numbers_after(&text, "stoker/");
    let stated: Vec<u32> = alpns
        .iter()
        .chain(&numbers_after(&text, "`PROTOCOL_VERSION` is "))
        .chain(&numbers_after(&text.to_lowercase(), "protocol version "))
        .copied()
        .collect();
    assert!(!alpns.is_empty(), "ARCHITECTURE.md should state the ALPN (`stoker/{version}`)");
    assert!(
        stated.iter().all(|&n| n == version),
        "ARCHITECTURE.md states protocol versions {stated:?}; {} says {version}",
        source.display()
    );
}
