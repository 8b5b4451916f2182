//! The house's rule that arrows point one way, checked on the source: within each
//! crate, no file below the crate root imports (through `crate::` or `super::` paths
//! outside comments and test modules) a file that imports it back, directly or
//! through others. A newcomer
//! following a request from the FUSE handler to the disk never climbs back up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`mdt::schema`; the crate root is "") → its file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read a source directory") {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src").with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            out.insert(parts.join("::"), p);
        }
    }
    out
}

/// The modules of this crate that `file` (module `name`) refers to.
fn refs(name: &str, file: &Path, mods: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).expect("read a source file");
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let parent: Vec<&str> = name.rsplit_once("::").map_or(vec![], |(p, _)| p.split("::").collect());
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (base, rest) in [("crate::", 0), ("super::", 1)]
            .iter()
            .flat_map(|(b, k)| line.match_indices(b).map(move |(i, _)| (*k, &line[i + b.len()..])))
        {
            let idents: Vec<&str> = rest
                .split("::")
                .map(|s| s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or(""))
                .take_while(|s| !s.is_empty() && s.starts_with(|c: char| c.is_ascii_lowercase()))
                .collect();
            let mut full: Vec<&str> = if base == 1 { parent.clone() } else { vec![] };
            full.extend(idents);
            if let Some(m) = (1..=full.len()).rev().map(|k| full[..k].join("::")).find(|m| mods.contains_key(m)) {
                if m != name {
                    out.insert(m);
                }
            }
        }
    }
    out
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for c in std::fs::read_dir(&crates).expect("the workspace's crates") {
        let src = c.expect("crate").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mods = modules(&src);
        // The crate root is left out: in most crates it only declares and re-exports
        // its modules, but `client`'s holds the `Client` itself, which `io`, `objio`
        // and `path` extend and import (a known exception, not checked here).
        let graph: BTreeMap<String, BTreeSet<String>> =
            mods.iter().filter(|(n, _)| !n.is_empty()).map(|(n, f)| (n.clone(), refs(n, f, &mods))).collect();
        if let Some(c) = cycle(&graph) {
            panic!("import cycle in {}: {}", src.display(), c.join(" -> "));
        }
        checked += graph.len();
    }
    assert!(checked > 50, "only {checked} modules found: is the workspace where this test looks?");
}

#[test]
fn the_checker_finds_a_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycle(&g).expect("a cycle"), ["a", "b", "c", "a"]);
    g.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&g), None);
}
