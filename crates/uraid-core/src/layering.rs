//! The crate's files import one another without a circle (docs/architecture.md, "Rooms"):
//! state types sit in leaf files, the engine above them, each room above the engine. This
//! test reads the sources and fails naming the files of any circle it finds.
//!
//! An edge runs from a file to the file of every module it names through `crate::`,
//! `super::`, `self::` or a child module's name, in `use` trees and inline paths alike.
//! Declaring a child (`mod x;`) is ownership, not an import; unit-test modules at a file's
//! end are left out, as they may import anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type ModPath = Vec<String>;

/// Every `.rs` file under `src`, keyed by its module path (`lib.rs` and `x/mod.rs` name
/// their folder), with its text.
fn sources(src: &Path) -> BTreeMap<ModPath, (String, String)> {
    let mut out = BTreeMap::new();
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
            let mut m: ModPath = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
                m.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            out.insert(m, (rel.to_string_lossy().into_owned(), text));
        }
    }
    out
}

/// The text without line comments and without a trailing `#[cfg(test)] mod`.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
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

#[test]
fn no_import_circle_inside_the_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = sources(&src);
    let edges = import_edges(&mods);
    let found: Vec<String> = circles(&edges)
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
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_walk_finds_a_planted_circle() {
    let file = |name: &str, text: &str| (name.to_string(), text.to_string());
    let mods: BTreeMap<ModPath, (String, String)> = [
        (vec![], file("lib", "mod a; mod b; mod c;")),
        (vec!["a".to_string()], file("a", "use crate::b::{X, y::Z};")),
        (vec!["b".to_string()], file("b", "fn f() -> super::c::T { todo!() }")),
        (vec!["b".to_string(), "y".to_string()], file("b/y", "")),
        (
            vec!["c".to_string()],
            file("c", "use crate::{d, a::W};\n#[cfg(test)]\nmod tests { use crate::b; }"),
        ),
    ]
    .into_iter()
    .collect();
    let edges = import_edges(&mods);
    assert_eq!(edges["a"], ["b".to_string(), "b/y".to_string()].into());
    assert_eq!(edges["c"], ["a".to_string(), "lib".to_string()].into(), "tests left out");
    let mut found = circles(&edges);
    found.iter_mut().for_each(|g| g.sort());
    assert_eq!(found, vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
}
