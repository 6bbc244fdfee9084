//! The core's modules import bottom-up: each module is in a layer of
//! [`LAYERS`], and a module may use only modules of its own layer or lower
//! ones, with no cycle among them. The data a module hands on (observations
//! into rings, rings into the drain, the drain's records into statistics and
//! consumers) is defined below the code that receives it.
//!
//! The check reads `src/` itself: every `use crate::…`/`use super::…` and
//! every `crate::…`/`super::…` path in code (comments, strings and
//! `#[cfg(test)]`/loom-only items are left out: tests may reach anywhere), resolved
//! to the module that defines it. A module may always use its own parent
//! and children (a directory module's `mod.rs` is both its children's shared
//! base and their facade). A module missing from [`LAYERS`] fails the check,
//! so a new one is placed deliberately.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom-up. Within `primitives`, the shared pieces come before the
/// primitives built on them.
const LAYERS: &[&[&str]] = &[
    &["sync", "clock", "hooks"],
    &["instance_id", "observation"],
    &["ring", "stats"],
    &["segment", "lease", "site"],
    &["announce", "registry"],
    &["drain", "site_stats"],
    &["sidecar"],
    &[
        "primitives",
        "primitives::sampling",
        "primitives::counting",
        "primitives::op_counts",
        "primitives::reader_bias",
        "primitives::held",
        "primitives::holder",
        "primitives::spin",
    ],
    &[
        "primitives::mutex",
        "primitives::rwlock",
        "primitives::semaphore",
        "primitives::channel",
        "primitives::barrier",
        "primitives::condvar",
    ],
    &["primitives::adaptive"],
    &["primitives::tokio"],
];

/// Known exceptions, each an edge the check lets through and the reason
/// it is still here; any other edge against the order still fails.
///
/// `site.rs` (the call-site table) holds both the table's layout, which
/// `segment` sizes and maps, and the interning of a call site, which writes
/// into the process segment through the registry. Split into the layout
/// (below `segment`) and the interning (above `registry`), it would need
/// neither; it is being extended for stack sites (issue 26) and is left whole
/// until that lands.
const KNOWN: &[(&str, &str)] = &[("site", "segment"), ("site", "registry")];

#[test]
fn core_modules_import_bottom_up() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = check(&src);
    assert!(
        problems.is_empty(),
        "subetha-core's import layering is broken:\n  {}",
        problems.join("\n  ")
    );
}

/// The check itself must be able to fail: an upward import and a cycle
/// within one layer are both reported.
#[test]
fn an_upward_import_and_a_cycle_are_caught() {
    let dir = std::env::temp_dir().join(format!("subetha-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("primitives")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write(
        "lib.rs",
        "pub mod ring;\npub mod stats;\npub mod registry;\npub mod primitives;\n",
    );
    // ring (layer 2) reaching up into the registry (layer 4).
    write(
        "ring.rs",
        "use crate::registry::Instance;\nuse crate::stats::{self as s};\n// crate::sidecar in a comment\n",
    );
    // stats and ring (one layer) using each other.
    write("stats.rs", "fn f() { let _ = crate::ring::X; }\n");
    write(
        "registry.rs",
        "#[cfg(test)]\nmod tests { use crate::primitives::Mutex; }\n\
         const S: &str = \"crate::primitives\";\n",
    );
    write("primitives/mod.rs", "pub mod mutex;\npub mod adaptive;\n");
    write("primitives/mutex.rs", "use super::adaptive::spin;\n");
    write("primitives/adaptive.rs", "use super::{mutex::{self, Mutex}};\n");
    let problems = check(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let text = problems.join("\n");
    assert!(text.contains("ring -> registry"), "{text}");
    assert!(
        text.contains("primitives::mutex -> primitives::adaptive"),
        "{text}"
    );
    assert!(text.contains("cycle"), "{text}");
    assert!(text.contains("stats") && text.contains("ring"), "{text}");
    assert!(
        !text.contains("registry -> primitives"),
        "test code and strings are not imports: {text}"
    );
}

/// Everything wrong with the tree under `src`, one line each.
fn check(src: &Path) -> Vec<String> {
    let modules = read_modules(src);
    let reexports = root_reexports(&modules);
    let known: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let mut edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for (module, code) in &modules {
        if module.is_empty() {
            continue;
        }
        for path in references(module, code) {
            let Some(target) = resolve(&path, &known, &reexports) else {
                continue;
            };
            let (from, to) = (unit(module), unit(&target));
            if from == to || related(module, &target) {
                continue;
            }
            edges
                .entry((from, to))
                .or_insert_with(|| format!("{module}: {}", path.join("::")));
        }
    }
    let mut problems = Vec::new();
    for module in modules.keys().filter(|m| !m.is_empty()) {
        let unit = unit(module);
        if layer(&unit).is_none() {
            problems.push(format!(
                "{unit} is not in LAYERS (place it in tests/module_layers.rs)"
            ));
        }
    }
    let allowed = |from: &str, to: &str| KNOWN.iter().any(|&(f, t)| f == from && t == to);
    for ((from, to), example) in &edges {
        if allowed(from, to) {
            continue;
        }
        if let (Some(a), Some(b)) = (layer(from), layer(to))
            && b > a
        {
            problems.push(format!("{from} -> {to}: upward import ({example})"));
        }
    }
    // Cycles, among the edges that are not known exceptions.
    let graph: BTreeMap<&str, Vec<&str>> =
        edges
            .keys()
            .filter(|(f, t)| !allowed(f, t))
            .fold(BTreeMap::new(), |mut g, (f, t)| {
                g.entry(f.as_str()).or_default().push(t.as_str());
                g
            });
    for start in graph.keys() {
        if let Some(cycle) = cycle_from(start, &graph) {
            let line = format!("cycle: {}", cycle.join(" -> "));
            if !problems.contains(&line) {
                problems.push(line);
            }
        }
    }
    problems
}

/// The shortest path from `start` back to itself, if any.
fn cycle_from<'a>(start: &'a str, graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Option<Vec<&'a str>> {
    let mut queue = std::collections::VecDeque::from([vec![start]]);
    let mut seen = BTreeSet::new();
    while let Some(path) = queue.pop_front() {
        for &next in graph.get(path.last().unwrap()).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start);
                // Report each cycle once, from its smallest member.
                return (cycle.iter().min() == Some(&start)).then_some(cycle);
            }
            if seen.insert(next) {
                let mut longer = path.clone();
                longer.push(next);
                queue.push_back(longer);
            }
        }
    }
    None
}

fn layer(unit: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&unit))
}

/// The entry of [`LAYERS`] a module belongs to: the longest one that is the
/// module or one of its ancestors (a lock's `raw`, `word` … files are the
/// lock's).
fn unit(module: &str) -> String {
    let mut best = module.split("::").next().unwrap_or("").to_string();
    for layer in LAYERS {
        for &name in *layer {
            if (module == name || module.starts_with(&format!("{name}::"))) && name.len() > best.len() {
                best = name.to_string();
            }
        }
    }
    best
}

/// Whether one module is the other's parent.
fn related(a: &str, b: &str) -> bool {
    parent(a) == Some(b) || parent(b) == Some(a)
}

fn parent(module: &str) -> Option<&str> {
    if module.is_empty() {
        None
    } else {
        Some(module.rsplit_once("::").map_or("", |(p, _)| p))
    }
}

/// Module path ("" for the crate root) to its code with comments, strings and
/// test-only items removed. Files of test-only modules are left out.
fn read_modules(src: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    let mut files = Vec::new();
    collect(src, src, &mut files);
    files.sort();
    for (module, path) in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let (code, test_children) = strip(&text);
        for child in test_children {
            test_only.insert(if module.is_empty() {
                child
            } else {
                format!("{module}::{child}")
            });
        }
        modules.insert(module, code);
    }
    modules.retain(|m, _| {
        !test_only
            .iter()
            .any(|t| m == t || m.starts_with(&format!("{t}::")))
    });
    modules
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, std::path::PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            out.push((parts.join("::"), path));
        }
    }
}

/// The code with comments and string/char literals blanked, items under a
/// test or loom `cfg` removed; and the names of child modules declared
/// (`mod name;`) under such a `cfg`.
fn strip(text: &str) -> (String, Vec<String>) {
    let code = blank_comments_and_literals(text);
    let mut out = String::new();
    let mut test_children = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(") {
        out.push_str(&rest[..at]);
        let attr_end = at + rest[at..].find(")]").map_or(rest.len() - at, |e| e + 2);
        let condition = &rest[at + 6..attr_end.saturating_sub(2)];
        let test_only = (condition.contains("test") && !condition.contains("not(test"))
            || condition.trim() == "loom"
            || (condition.starts_with("all(")
                && condition.contains("loom")
                && !condition.contains("not(loom"));
        if !test_only {
            out.push_str(&rest[at..attr_end]);
            rest = &rest[attr_end..];
            continue;
        }
        // The item: up to its `;` or its matching `}`.
        let item = &rest[attr_end..];
        let semi = item.find(';').unwrap_or(item.len());
        let brace = item.find('{').unwrap_or(item.len());
        let end = if semi < brace {
            let decl = item[..semi].split_whitespace().collect::<Vec<_>>();
            if let Some(i) = decl.iter().position(|w| *w == "mod") {
                test_children.push(decl[i + 1].to_string());
            }
            semi + 1
        } else {
            let mut depth = 0usize;
            let mut end = item.len();
            for (i, c) in item[brace..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = brace + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        rest = &item[end.min(item.len())..];
    }
    out.push_str(rest);
    (out, test_children)
}

fn blank_comments_and_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
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
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && (i == 0 || !is_ident(b[i - 1])) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i += 2 + hashes;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                    out.push_str("' '");
                } else if let Some(len) = text[i + 1..].chars().next().map(char::len_utf8)
                    && b.get(i + 1 + len) == Some(&b'\'')
                {
                    i += 2 + len;
                    out.push_str("' '");
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            _ => {
                let len = text[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&text[i..i + len]);
                i += len;
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path this module's code names through `crate`, `super` or `self`,
/// made absolute (from the crate root), and every path its `use` items
/// import (relative ones resolved against the module).
fn references(module: &str, code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    // `use` trees, braces and all.
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        let tail = &rest[at + 3..];
        let end = tail.find(';').unwrap_or(tail.len());
        for path in expand_use(tail[..end].trim()) {
            paths.push(path);
        }
        rest = &tail[end..];
    }
    // Inline paths: `crate::a::b`, `super::x`.
    for start in ["crate", "super", "self"] {
        let mut rest = code;
        while let Some(at) = find_word(rest, start) {
            let tail = &rest[at..];
            let len = path_len(tail);
            let path: Vec<String> = tail[..len]
                .trim_end_matches(':')
                .split("::")
                .map(str::to_string)
                .collect();
            if path.len() > 1 {
                paths.push(path);
            }
            rest = &tail[len.max(1)..];
        }
    }
    paths.into_iter().filter_map(|p| absolute(module, p)).collect()
}

/// The length of the `a::b::c` path `text` starts with.
fn path_len(text: &str) -> usize {
    let b = text.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if b[i..].starts_with(b"::") && b.get(i + 2).is_some_and(|&c| is_ident(c)) {
            i += 2;
        } else {
            return i;
        }
    }
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before = at == 0 || !is_ident(b[at - 1]) && b[at - 1] != b':';
        let after = b.get(at + word.len()).is_none_or(|&c| !is_ident(c));
        if before && after {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// `crate::{a, b::{self, C}}` into `crate::a`, `crate::b`, `crate::b::C`.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    // Renames (`X as Y`) import X.
    let mut words: Vec<&str> = tree.split_whitespace().collect();
    while let Some(i) = words.iter().position(|w| *w == "as") {
        words.drain(i..(i + 2).min(words.len()));
    }
    let tree: String = words.concat();
    let mut out = Vec::new();
    expand_into(&tree, &mut Vec::new(), &mut out);
    out
}

fn expand_into(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let (head, group) = match tree.find('{') {
        Some(open) if tree.ends_with('}') => (&tree[..open], Some(&tree[open + 1..tree.len() - 1])),
        _ => (tree, None),
    };
    let head = head.trim_end_matches("::");
    let base = prefix.len();
    for part in head.split("::").filter(|p| !p.is_empty()) {
        if part != "self" || prefix.is_empty() {
            prefix.push(part.to_string());
        }
    }
    match group {
        None => out.push(prefix.clone()),
        Some(group) => {
            for item in split_top(group) {
                expand_into(item, prefix, out);
            }
        }
    }
    prefix.truncate(base);
}

fn split_top(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items.into_iter().filter(|s| !s.is_empty()).collect()
}

/// The path from the crate root, or `None` for one outside the crate.
fn absolute(module: &str, path: Vec<String>) -> Option<Vec<String>> {
    let mut here: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let mut rest = path.as_slice();
    match rest.first().map(String::as_str) {
        Some("crate") => {
            here.clear();
            rest = &rest[1..];
        }
        Some("super" | "self") => {
            while let Some(step) = rest.first() {
                match step.as_str() {
                    "super" => {
                        here.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        // A relative `use child::…` of one of the module's children; other
        // relative paths (std, external crates) are not this crate's.
        _ => {}
    }
    here.extend(rest.iter().cloned());
    Some(here)
}

/// Names the crate root re-exports (`pub use observation::{Observation, …}`),
/// to the module that defines them.
fn root_reexports(modules: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let Some(root) = modules.get("") else { return map };
    let mut rest = root.as_str();
    while let Some(at) = rest.find("pub use") {
        let tail = &rest[at + 7..];
        let end = tail.find(';').unwrap_or(tail.len());
        for path in expand_use(tail[..end].trim()) {
            if let Some((name, module)) = path.split_last() {
                map.insert(name.clone(), module.join("::"));
            }
        }
        rest = &tail[end..];
    }
    map
}

/// The module of this crate an absolute path points into, if it is one.
fn resolve(path: &[String], known: &BTreeSet<&str>, reexports: &BTreeMap<String, String>) -> Option<String> {
    if path.len() == 1
        && let Some(module) = reexports.get(&path[0])
    {
        return Some(module.clone());
    }
    (0..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| known.contains(m.as_str()))
}
