//! The crate's files import one another without a circle (docs/architecture.md, "Rooms"):
//! state types sit in leaf files, the engine above them, each room above the engine. This
//! test reads the sources and fails naming the files of any circle it finds.
//!
//! An edge runs from a file to the file of every module it names through `crate::`,
//! `super::`, `self::` or a child module's name, in `use` trees and inline paths alike.
//! Declaring a child (`mod x;`) is ownership, not an import; unit-test modules are left
//! out, as they may import anything: one inline at a file's end (`#[cfg(test)] mod x {`)
//! and a file declared `#[cfg(test)] mod x;`.
//!
//! The same file is the walk of the other crates: `uraid-sim` includes it as a test module
//! of its library and `uraid` as an integration test (`tests/layering.rs`), each with
//! `#[path]`, so `no_import_circle_inside_the_crate` walks the `src` of the crate that runs
//! it (`CARGO_MANIFEST_DIR`); a binary's `main.rs` is its root as `lib.rs` is a library's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type ModPath = Vec<String>;

/// Every `.rs` file under `src` as (path relative to `src` without `.rs`, text).
fn read_sources(src: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src").with_extension("");
            let rel: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            let text = std::fs::read_to_string(&path).expect("read source");
            out.push((rel.join("/"), text));
        }
    }
    out
}

/// The files keyed by module path (`lib`, `main` and `x/mod` name their folder), with
/// their text; the files of test-only modules (`#[cfg(test)] mod x;`) left out.
fn modules(files: Vec<(String, String)>) -> BTreeMap<ModPath, (String, String)> {
    let mut out = BTreeMap::new();
    for (rel, text) in files {
        let mut m: ModPath = rel.split('/').map(String::from).collect();
        let root = m.len() == 1 && matches!(m[0].as_str(), "lib" | "main");
        if root || m.last().is_some_and(|s| s == "mod") {
            m.pop();
        }
        out.insert(m, (rel, text));
    }
    let test_only: Vec<ModPath> = out
        .iter()
        .flat_map(|(m, (_, text))| {
            test_modules(text).into_iter().filter(|(_, _, inline)| !inline).map(|(_, name, _)| {
                let mut child = m.clone();
                child.push(name);
                child
            })
        })
        .collect();
    for m in test_only {
        out.remove(&m);
    }
    out
}

/// The `#[cfg(test)]` modules a file declares: where each begins, its name, and whether
/// it is inline (`{`) rather than a file of its own (`;`).
fn test_modules(text: &str) -> Vec<(usize, String, bool)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("#[cfg(test)]") {
        let mut rest = &text[at + "#[cfg(test)]".len()..];
        // Other attributes (`#[path = ...]`) may come between.
        loop {
            rest = rest.trim_start();
            match rest.strip_prefix("#[").and_then(|r| r.find(']').map(|e| &r[e + 1..])) {
                Some(after) => rest = after,
                None => break,
            }
        }
        let Some(after_mod) = rest.strip_prefix("mod ") else { continue };
        let name: String = after_mod.trim_start().chars().take_while(|&c| is_ident(c)).collect();
        let tail = after_mod.trim_start()[name.len()..].trim_start();
        if !name.is_empty() && (tail.starts_with('{') || tail.starts_with(';')) {
            out.push((at, name, tail.starts_with('{')));
        }
    }
    out
}

/// The text without line comments and without an inline `#[cfg(test)] mod` (at a file's
/// end: everything from it on is left out).
fn code_of(text: &str) -> String {
    let text = match test_modules(text).into_iter().find(|(_, _, inline)| *inline) {
        Some((i, _, _)) => &text[..i],
        None => text,
    };
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses a path or use tree at `s` (after its first segment's base is known): returns
/// every full path it names and how many bytes it spans.
fn paths_at(s: &str, base: &ModPath, out: &mut Vec<ModPath>) -> usize {
    let mut segs = base.clone();
    let mut i = 0;
    loop {
        let rest = &s[i..];
        let trimmed = rest.trim_start();
        i += rest.len() - trimmed.len();
        if let Some(inner) = trimmed.strip_prefix('{') {
            i += 1;
            let mut pos = 0;
            loop {
                let t = &inner[pos..];
                let t2 = t.trim_start();
                pos += t.len() - t2.len();
                if t2.starts_with('}') {
                    pos += 1;
                    break;
                }
                if t2.starts_with(',') {
                    pos += 1;
                    continue;
                }
                if t2.is_empty() {
                    break;
                }
                pos += paths_at(&inner[pos..], &segs, out).max(1);
            }
            return i + pos;
        }
        let ident: String = trimmed.chars().take_while(|&c| is_ident(c)).collect();
        if ident.is_empty() {
            out.push(segs);
            return i;
        }
        i += ident.len();
        match ident.as_str() {
            "super" => {
                segs.pop();
            }
            "self" | "crate" => {}
            _ => segs.push(ident),
        }
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(segs);
            return i;
        }
    }
}

/// The file each module path of `names` falls in: its longest prefix that is a module.
fn file_of<'a>(mods: &'a BTreeMap<ModPath, (String, String)>, path: &ModPath) -> Option<&'a str> {
    (0..=path.len()).rev().find_map(|n| mods.get(&path[..n]).map(|(f, _)| f.as_str()))
}

fn import_edges(mods: &BTreeMap<ModPath, (String, String)>) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, (file, text)) in mods {
        let code = code_of(text);
        let targets = edges.entry(file.clone()).or_default();
        let mut found = Vec::new();
        let bytes: Vec<(usize, char)> = code.char_indices().collect();
        for (k, &(at, c)) in bytes.iter().enumerate() {
            let starts_word = is_ident(c) && (k == 0 || !is_ident(bytes[k - 1].1));
            let after_path = k >= 2 && bytes[k - 1].1 == ':' && bytes[k - 2].1 == ':';
            if !starts_word || after_path {
                continue;
            }
            let word: String = code[at..].chars().take_while(|&ch| is_ident(ch)).collect();
            if !code[at + word.len()..].starts_with("::") {
                continue;
            }
            let mut child = m.clone();
            child.push(word.clone());
            let base = match word.as_str() {
                "crate" => Vec::new(),
                "super" | "self" => m.clone(),
                _ if mods.contains_key(&child) => m.clone(),
                _ => continue,
            };
            paths_at(&code[at..], &base, &mut found);
        }
        for p in found {
            if let Some(f) = file_of(mods, &p) {
                if f != file {
                    targets.insert(f.to_string());
                }
            }
        }
    }
    edges
}

/// The strongly connected groups of more than one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for t in w.edges.get(v).into_iter().flatten() {
            let t = t.as_str();
            if !w.index.contains_key(t) {
                visit(w, t);
                let l = w.low[t].min(w.low[v]);
                w.low.insert(v, l);
            } else if w.stack.contains(&t) {
                let l = w.index[t].min(w.low[v]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let at = w.stack.iter().position(|&x| x == v).expect("on stack");
            let group: Vec<String> = w.stack.drain(at..).map(String::from).collect();
            if group.len() > 1 {
                w.out.push(group);
            }
        }
    }
    let mut w =
        Walk { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), out: Vec::new() };
    for v in edges.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.out
}

/// Each circle of files under `src`, as "file -> the files of its circle it imports; ...".
fn import_circles(src: &Path) -> Vec<String> {
    let mods = modules(read_sources(src));
    let edges = import_edges(&mods);
    circles(&edges)
        .into_iter()
        .map(|mut g| {
            g.sort();
            g.iter()
                .map(|f| {
                    let to: Vec<&str> =
                        edges[f].iter().filter(|t| g.contains(t)).map(String::as_str).collect();
                    format!("{f} -> {}", to.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect()
}

/// Circles not untangled yet, by crate, as [`import_circles`] names them: the walk lets
/// exactly these pass, and fails when one is gone so that its entry goes too.
const KNOWN_CIRCLES: &[(&str, &str)] = &[];

#[test]
fn no_import_circle_inside_the_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known: Vec<&str> =
        KNOWN_CIRCLES.iter().filter(|(c, _)| *c == env!("CARGO_PKG_NAME")).map(|&(_, g)| g).collect();
    let found = import_circles(&src);
    let new: Vec<&String> = found.iter().filter(|g| !known.contains(&g.as_str())).collect();
    assert!(
        new.is_empty(),
        "import circles in {}:\n{}",
        src.display(),
        new.iter().map(|g| g.as_str()).collect::<Vec<_>>().join("\n")
    );
    let gone: Vec<&&str> = known.iter().filter(|k| !found.iter().any(|g| g == *k)).collect();
    assert!(gone.is_empty(), "no longer a circle, so no longer in KNOWN_CIRCLES: {gone:?}");
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(name, text)| (name.to_string(), text.to_string())).collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_walk_finds_a_planted_circle() {
    let mods = modules(files(&[
        ("lib", "mod a; mod b; mod c;"),
        ("a", "use crate::b::{X, y::Z};"),
        ("b", "fn f() -> super::c::T { todo!() }"),
        ("b/y", ""),
        ("c", "use crate::{d, a::W};\n#[cfg(test)]\nmod tests { use crate::b; }"),
    ]));
    let edges = import_edges(&mods);
    assert_eq!(edges["a"], names(&["b", "b/y"]));
    assert_eq!(edges["c"], names(&["a", "lib"]), "tests left out");
    let mut found = circles(&edges);
    found.iter_mut().for_each(|g| g.sort());
    assert_eq!(found, vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
}

#[test]
fn a_binary_root_and_test_only_files_are_walked_as_the_compiler_sees_them() {
    let mods = modules(files(&[
        ("main", "mod a; mod b;\n#[cfg(test)]\nmod t;\nfn main() { a::run() }"),
        ("a", "pub fn run() { crate::helper() }"),
        ("b", "#[cfg(test)]\n#[path = \"../x.rs\"]\nmod x;\nuse crate::a::run;"),
        ("t", "use crate::b;"),
    ]));
    assert!(!mods.contains_key(&vec!["t".to_string()]), "a test-only file is not walked");
    let edges = import_edges(&mods);
    assert_eq!(edges["main"], names(&["a"]), "main.rs is the root");
    assert_eq!(edges["b"], names(&["a"]), "what follows a test module's declaration is read");
    let mut found = circles(&edges);
    found.iter_mut().for_each(|g| g.sort());
    assert_eq!(found, vec![vec!["a".to_string(), "main".to_string()]]);
}
