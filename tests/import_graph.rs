//! The import graph between the files of `src/` has no cycle, and neither has the graph between
//! its top-level modules: a cycle means two files that can only change together.
//!
//! A file's module path comes from where it sits (`src/meter/engine.rs` is `crate::meter::engine`,
//! `mod.rs` is its directory). Every `crate::`, `super::` and `self::` path in it (in `use` lines
//! and inline) is an edge to the deepest file module the path names. Comments and string literals
//! are skipped; `super` inside an inline `mod x { .. }` counts from that module.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir`, with its module path below `crate`.
fn modules(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            modules(root, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).unwrap().with_extension("");
        let mut m: Module = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        match m.last().map(String::as_str) {
            Some("main") if m.len() == 1 => continue, // the binary is a crate of its own
            Some("mod" | "lib") => {
                m.pop();
            }
            _ => {}
        }
        out.insert(m, path);
    }
}

/// `src` with comments, string and char literals blanked out (lengths need not be kept).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == b'r' && !ident_before && matches!(b.get(i + 1), Some(b'"' | b'#')) {
            // A raw string r"..", r#".."#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a), which stays.
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            // Multi-byte UTF-8 only ever appears inside comments and strings in this code; copy
            // anything else byte-wise as ASCII or a space.
            out.push(if c.is_ascii() { c as char } else { ' ' });
            i += 1;
        }
    }
    out
}

/// Rust tokens enough for paths: identifiers, `::`, and single punctuation.
fn tokens(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(&s[start..i]);
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push("::");
            i += 2;
        } else {
            out.push(&s[i..i + 1]);
            i += 1;
        }
    }
    out
}

/// Expands the tree of a `use` (after `use`, up to `;`) into its paths.
fn use_paths(toks: &[&str], prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < toks.len() {
        match toks[i] {
            "::" => i += 1,
            "{" => {
                i += 1;
                loop {
                    i += use_paths(&toks[i..], &path, out);
                    match toks.get(i) {
                        Some(&",") => i += 1,
                        Some(&"}") => {
                            i += 1;
                            break;
                        }
                        _ => break,
                    }
                }
                return i;
            }
            "," | "}" | ";" => break,
            "as" => i += 2,
            t => {
                path.push(t.to_string());
                i += 1;
            }
        }
    }
    if path.len() > prefix.len() {
        out.push(path);
    }
    i
}

/// The paths a file names that start at `crate`, `super` or `self`, each made absolute.
fn referenced(module: &Module, src: &str) -> Vec<Module> {
    let stripped = strip(src);
    let toks = tokens(&stripped);
    let mut found = Vec::new();
    // Inline modules: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here: Module = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let resolve = |p: &[String]| -> Option<Module> {
            let mut abs = match p.first().map(String::as_str) {
                Some("crate") => Vec::new(),
                Some("super" | "self") => here.clone(),
                _ => return None,
            };
            let mut rest = if p[0] == "crate" { &p[1..] } else { p };
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        abs.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            abs.extend(rest.iter().cloned());
            Some(abs)
        };
        match toks[i] {
            "{" => {
                depth += 1;
                i += 1;
            }
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            "mod" if toks.get(i + 2) == Some(&"{") => {
                inline.push((toks[i + 1].to_string(), depth + 1));
                depth += 1;
                i += 3;
            }
            "use" => {
                let end = toks[i..]
                    .iter()
                    .position(|t| *t == ";")
                    .map_or(toks.len(), |e| i + e);
                let mut paths = Vec::new();
                use_paths(&toks[i + 1..end], &[], &mut paths);
                found.extend(paths.iter().filter_map(|p| resolve(p)));
                i = end + 1;
            }
            "crate" | "super" | "self" if toks.get(i + 1) == Some(&"::") => {
                let preceded_by_path = i > 0 && toks[i - 1] == "::";
                let mut p = vec![toks[i].to_string()];
                let mut j = i + 1;
                while toks.get(j) == Some(&"::")
                    && toks.get(j + 1).is_some_and(|t| {
                        t.as_bytes()[0].is_ascii_alphanumeric() || t.as_bytes()[0] == b'_'
                    })
                {
                    p.push(toks[j + 1].to_string());
                    j += 2;
                }
                if !preceded_by_path {
                    found.extend(resolve(&p));
                }
                i = j;
            }
            _ => i += 1,
        }
    }
    found
}

/// file -> files it imports from.
fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    modules(&root, &root, &mut files);
    let mut edges = BTreeMap::new();
    for (module, path) in &files {
        let src = std::fs::read_to_string(path).unwrap();
        let mut to = BTreeSet::new();
        for p in referenced(module, &src) {
            // The deepest prefix of the path that is a file.
            let target = (0..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|m| files.contains_key(m));
            if let Some(t) = target {
                if &t != module {
                    to.insert(t);
                }
            }
        }
        edges.insert(module.clone(), to);
    }
    edges
}

/// Some cycle in `edges`, as the path around it, if there is one.
fn find_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        mark: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        mark.insert(n.clone(), Mark::Open);
        stack.push(n.clone());
        for m in edges.get(n).into_iter().flatten() {
            match mark.get(m).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(m, edges, mark, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        mark.insert(n.clone(), Mark::Done);
        None
    }
    let mut mark = BTreeMap::new();
    for n in edges.keys() {
        if mark.get(n).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(n, edges, &mut mark, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn show(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "crate".to_string()
            } else {
                m.join("::")
            }
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn files_import_each_other_without_a_cycle() {
    let edges = graph();
    assert!(edges.len() > 50, "found only {} files", edges.len());
    if let Some(c) = find_cycle(&edges) {
        panic!("import cycle between files: {}", show(&c));
    }
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let mut top: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, tos) in graph() {
        let Some(a) = from.first() else { continue };
        for to in tos {
            if let Some(b) = to.first() {
                if a != b {
                    top.entry(vec![a.clone()])
                        .or_default()
                        .insert(vec![b.clone()]);
                }
            }
        }
    }
    if let Some(c) = find_cycle(&top) {
        panic!("import cycle between top-level modules: {}", show(&c));
    }
}

#[test]
fn the_checker_sees_cycles_and_paths() {
    let m = |s: &str| -> Module { s.split("::").map(str::to_string).collect() };
    // `use` trees, inline paths, `super` from an inline module, and what must not count.
    let src = r#"
        use crate::a::{b::{C, D}, e as f};
        use super::g;
        // use crate::commented::Out;
        const S: &str = "crate::in_string::X";
        fn x() { crate::inline::call(); let c = '"'; }
        mod tests { use super::*; use super::super::h::I; }
    "#;
    let got: BTreeSet<Module> = referenced(&m("p::q"), src).into_iter().collect();
    let want: BTreeSet<Module> = [
        "a::b::C",
        "a::b::D",
        "a::e",
        "p::g",
        "inline::call",
        "p::q::*",
        "p::h::I",
    ]
    .iter()
    .map(|s| m(s))
    .collect();
    assert_eq!(got, want);
    let mut edges = BTreeMap::new();
    edges.insert(m("a"), [m("b")].into_iter().collect());
    edges.insert(m("b"), [m("c")].into_iter().collect());
    assert_eq!(find_cycle(&edges), None);
    edges.insert(m("c"), [m("a")].into_iter().collect());
    assert_eq!(find_cycle(&edges).map(|c| c.len()), Some(4));
}
