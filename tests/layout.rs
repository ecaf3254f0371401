//! The house's shape, kept (issue 36): every file of `src/` sits in a layer and imports only its
//! own layer or lower ones, no files import each other in a loop, and no file is over 600 lines
//! of code. The layers are ARCHITECTURE.md's; a new file takes the layer of the longest prefix
//! below that matches its path.
//!
//! An import is a `use` (also `pub use`, re-exports included) or an inline path in code
//! (`crate::…`, `super::…`, `self::…`, or a child module's name), followed through the
//! re-exports of the module it names to the file that defines the item. Comments (intra-doc
//! links included), string literals and test-only items (`#[cfg(test)]`, wherever they sit in
//! the file) do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Layers from the bottom up: (name, path prefixes under `src/`).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "error.rs",
            "names.rs",
            "stop.rs",
            "envelope/",
            "codec.rs",
            "codec/",
            "codecs/",
            "observe.rs",
            "observe/",
            "health.rs",
            "health/",
            "wire/",
            "outcome.rs",
            "ticket.rs",
            "intercept.rs",
            "trace.rs",
        ],
    ),
    (
        "transport",
        &["connection/", "transport/", "credentials.rs", "test_ca.rs"],
    ),
    ("engine", &["publish/", "publish.rs", "consume/"]),
    (
        "stores",
        &[
            "sql/",
            "patterns/idempotency/",
            "patterns/outbox/",
            "patterns/schema_registry",
            "patterns/acknowledged/store",
            "patterns/acknowledged/counter",
        ],
    ),
    // `patterns/outbox/mod.rs` is the outbox module's public face: it re-exports the relay too.
    (
        "patterns",
        &[
            "patterns/",
            "patterns/outbox/relay/",
            "patterns/outbox/mod.rs",
        ],
    ),
    // What a service exposes about itself (feature `actuator`), how it is configured
    // (`settings/`) and the host that runs one (`service/`): they read every layer below.
    (
        "service",
        &["actuator/", "settings/", "service/", "topology/"],
    ),
    ("tools", &["testing/", "fuzzing.rs"]),
];

/// Lines a file may have, its test-only items not counted.
const MAX_CODE_LINES: usize = 600;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(rel: &str) -> (usize, &'static str) {
    if rel == "lib.rs" {
        return (0, "root");
    }
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (index, (name, prefixes)) in LAYERS.iter().enumerate() {
        for prefix in *prefixes {
            if rel.starts_with(prefix) && best.is_none_or(|(_, len, _)| prefix.len() > len) {
                best = Some((index, prefix.len(), name));
            }
        }
    }
    let (index, _, name) = best.unwrap_or_else(|| {
        panic!("src/{rel} is in no layer: add its path to LAYERS in tests/layout.rs and to ARCHITECTURE.md")
    });
    (index, name)
}

/// Every `.rs` file under `src/`, relative to it (`consume/owner.rs`).
fn files() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                // `src/bin/` holds other crates' roots, not the library's modules.
                if path != root.join("bin") {
                    walk(&path, root, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, fs::read_to_string(&path).expect("read a source file"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src(), &src(), &mut out);
    out
}

/// The text without its test-only items: every item under `#[cfg(test)]` (or
/// `#[cfg(all(test, …))]`) wherever it sits — a `mod tests { … }` block in the middle of a file
/// as well as at its end, a `mod x;`, a `use`, a `fn` — with its other attributes. Lines are
/// dropped, so what is left counts as the file's code. Run it on [`code_only`]'s output, so that
/// braces in comments and literals do not count.
fn without_test_items(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut keep = vec![true; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        let attribute = lines[i].trim();
        let test_only = attribute == "#[cfg(test)]"
            || (attribute.starts_with("#[cfg(all(test") && attribute.ends_with(")]"));
        if !test_only {
            i += 1;
            continue;
        }
        // The item runs to its first `;` outside braces, or to the brace closing its first `{`.
        let mut depth = 0usize;
        let mut j = i + 1;
        'item: while j < lines.len() {
            for c in lines[j].chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            break 'item;
                        }
                    }
                    ';' if depth == 0 => break 'item,
                    _ => {}
                }
            }
            j += 1;
        }
        for k in keep.iter_mut().take((j + 1).min(lines.len())).skip(i) {
            *k = false;
        }
        i = j + 1;
    }
    lines
        .iter()
        .zip(keep)
        .filter(|(_, kept)| *kept)
        .map(|(line, _)| *line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Code with comments, string and char literals blanked out (lines kept).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !prev_is_ident(&chars, i)
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < chars.len() {
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime / label ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `a::{b, c::{d, e as f}}` → [a, b], [a, c, d], [a, c, e].
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        parts
    }
    fn rec(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        if let (Some(open), true) = (s.find('{'), s.ends_with('}')) {
            let mut next: Vec<String> = prefix.to_vec();
            next.extend(
                s[..open]
                    .split("::")
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from),
            );
            for part in split_top(&s[open + 1..s.len() - 1]) {
                rec(&next, part, out);
            }
        } else {
            let s = s.split(" as ").next().unwrap_or(s);
            let mut path: Vec<String> = prefix.to_vec();
            path.extend(
                s.split("::")
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from),
            );
            out.push(path);
        }
    }
    let mut out = Vec::new();
    rec(&[], tree, &mut out);
    out
}

/// The module path of a file: `consume/owner.rs` → [consume, owner]; `consume/mod.rs` →
/// [consume]; `lib.rs` → [].
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

struct Crate {
    /// Module path → file.
    modules: BTreeMap<Vec<String>, String>,
    /// File → its code (comments, literals and the trailing test module gone).
    code: BTreeMap<String, String>,
    /// File → name → the absolute path it re-exports (`pub use` / `pub(crate) use`).
    reexports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn read() -> Crate {
        let files = files();
        let mut modules = BTreeMap::new();
        let mut code = BTreeMap::new();
        for (rel, text) in &files {
            modules.insert(module_of(rel), rel.clone());
            code.insert(rel.clone(), without_test_items(&code_only(text)));
        }
        let mut krate = Crate {
            modules,
            code,
            reexports: BTreeMap::new(),
        };
        let mut reexports = BTreeMap::new();
        for rel in files.keys() {
            let mut map = BTreeMap::new();
            for (public, path) in krate.uses(rel) {
                if public {
                    if let Some(last) = path.last() {
                        map.insert(last.clone(), path);
                    }
                }
            }
            reexports.insert(rel.clone(), map);
        }
        krate.reexports = reexports;
        krate
    }

    /// Absolute paths of every `use` in a file, and whether it re-exports.
    fn uses(&self, rel: &str) -> Vec<(bool, Vec<String>)> {
        let code = &self.code[rel];
        let mut out = Vec::new();
        let mut rest = code.as_str();
        while let Some(at) = find_word(rest, "use") {
            let before = &rest[..at];
            let line_start = before.rfind('\n').map_or(0, |n| n + 1);
            let head = before[line_start..].trim();
            let public = head.starts_with("pub");
            let after = &rest[at + 3..];
            let Some(end) = after.find(';') else { break };
            for path in expand_use(&after[..end]) {
                if let Some(absolute) = self.absolute(rel, &path) {
                    out.push((public, absolute));
                }
            }
            rest = &after[end..];
        }
        out
    }

    /// A path as written in `rel` made absolute from the crate root, or None when it names
    /// something outside the crate (std, a dependency).
    fn absolute(&self, rel: &str, path: &[String]) -> Option<Vec<String>> {
        let here = module_of(rel);
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some(path[1..].to_vec()),
            "self" => Some([here, path[1..].to_vec()].concat()),
            "super" => {
                let mut base = here;
                let mut rest = path;
                while rest.first().is_some_and(|p| p == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                Some([base, rest.to_vec()].concat())
            }
            _ => {
                // A child module of this one, named without `self::` (2018 paths).
                let mut child = here.clone();
                child.push(first.clone());
                self.modules
                    .contains_key(&child)
                    .then(|| [here, path.to_vec()].concat())
            }
        }
    }

    /// The file defining what an absolute path names, following re-exports.
    fn resolve(&self, path: &[String], depth: usize) -> Option<String> {
        for split in (0..=path.len()).rev() {
            if let Some(file) = self.modules.get(&path[..split]) {
                let rest = &path[split..];
                if let (Some(name), true) = (rest.first(), depth < 16) {
                    if let Some(target) = self.reexports[file].get(name) {
                        if target.as_slice() != path {
                            let mut next = target.clone();
                            next.extend(rest[1..].iter().cloned());
                            return self.resolve(&next, depth + 1);
                        }
                    }
                }
                return Some(file.clone());
            }
        }
        None
    }

    /// File → the files it imports.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for rel in self.code.keys() {
            let mut targets = BTreeSet::new();
            let mut paths: Vec<Vec<String>> =
                self.uses(rel).into_iter().map(|(_, path)| path).collect();
            for inline in inline_paths(&self.code[rel]) {
                if let Some(absolute) = self.absolute(rel, &inline) {
                    paths.push(absolute);
                }
            }
            for path in paths {
                if let Some(target) = self.resolve(&path, 0) {
                    if &target != rel && target != "lib.rs" {
                        targets.insert(target);
                    }
                }
            }
            graph.insert(rel.clone(), targets);
        }
        graph
    }
}

fn find_word(haystack: &str, word: &str) -> Option<usize> {
    let bytes = haystack.as_bytes();
    let mut from = 0;
    while let Some(found) = haystack[from..].find(word) {
        let at = from + found;
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len()).copied();
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        if !before.is_some_and(ident) && after.is_some_and(|b| b.is_ascii_whitespace()) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// `crate::a::b`, `super::a`, `self::a` written inline in code.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start) {
            let at = from + found;
            let preceded = code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            let tail: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            from = at + start.len();
            // `crate::a::{…}` or `super::*` is a `use` tree, read (item by item) by `uses`; a
            // visibility, `pub(in crate::a)`, names where an item may be seen, not an import.
            let visibility = code[..at].trim_end().ends_with("(in");
            if preceded || visibility || tail.ends_with("::") {
                continue;
            }
            let path: Vec<String> = tail
                .split("::")
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            out.push(path);
        }
    }
    out
}

/// Loops of files importing each other (strongly connected components of two or more).
fn loops(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v.as_str()) {
            tarjan.visit(v);
        }
    }
    tarjan.found
}

#[test]
fn imports_point_down_the_layers() {
    let krate = Crate::read();
    let mut upward = Vec::new();
    for (file, targets) in krate.imports() {
        // The crate root is the façade over every layer: its re-exports are the public names.
        if file == "lib.rs" {
            continue;
        }
        let (from, from_name) = layer_of(&file);
        for target in targets {
            let (to, to_name) = layer_of(&target);
            if to > from {
                upward.push(format!(
                    "src/{file} ({from_name}) imports src/{target} ({to_name})"
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports must point down the layers (base → transport → engine → stores → patterns → \
         tools, ARCHITECTURE.md); these point up:\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn no_files_import_each_other_in_a_loop() {
    let krate = Crate::read();
    let graph = krate.imports();
    let found = loops(&graph);
    // Each loop with its arrows (which file imports which of the others), so the one to cut
    // can be seen.
    let arrows = |members: &Vec<String>| {
        members
            .iter()
            .flat_map(|from| {
                graph[from]
                    .iter()
                    .filter(|to| members.contains(to))
                    .map(move |to| format!("    {from} → {to}"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        found.is_empty(),
        "files of src/ that import each other in a loop (move what they share into a file both \
         import):\n  {}",
        found
            .iter()
            .map(|l| format!("{}\n{}", l.join(" ⇄ "), arrows(l)))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn no_file_is_over_600_lines_of_code() {
    let mut over: Vec<String> = files()
        .iter()
        .filter_map(|(rel, text)| {
            let lines = without_test_items(&code_only(text)).lines().count();
            (lines > MAX_CODE_LINES).then(|| format!("src/{rel}: {lines} lines"))
        })
        .collect();
    over.sort();
    assert!(
        over.is_empty(),
        "files over {MAX_CODE_LINES} lines (test-only items not counted): split \
         them by job:\n  {}",
        over.join("\n  ")
    );
}

/// Only the AMQP transport (`src/transport/amqp/`) knows which AMQP client is underneath: every
/// other file, the base's data types and the in-process broker included, speaks the crate's own
/// types (`crate::wire`, the seam's in `crate::transport`), so a third transport is a folder
/// beside it. Comments may still say what the AMQP transport does; test-only items may name it
/// (the contract tests open a raw amiquip connection to compare with).
#[test]
fn only_the_amqp_transport_names_amiquip() {
    let mut naming: Vec<String> = files()
        .iter()
        .filter(|(rel, _)| !rel.starts_with("transport/amqp/"))
        .filter(|(_, text)| find_word(&code_only(text), "amiquip").is_some())
        .map(|(rel, _)| format!("src/{rel}"))
        .collect();
    naming.sort();
    assert!(
        naming.is_empty(),
        "these files name amiquip in code; only src/transport/amqp/ may (use crate::wire's \
         and the seam's types instead):\n  {}",
        naming.join("\n  ")
    );
}

/// The checks above can fail: a loop, an upward arrow and an oversize file written on purpose
/// are each found.
#[test]
fn the_layout_checks_find_what_they_guard_against() {
    let mut graph = BTreeMap::new();
    graph.insert("a.rs".to_string(), BTreeSet::from(["b.rs".to_string()]));
    graph.insert("b.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    assert_eq!(
        loops(&graph),
        vec![vec!["a.rs".to_string(), "b.rs".to_string()]]
    );

    assert!(layer_of("error.rs").0 < layer_of("patterns/replay.rs").0);
    assert_eq!(layer_of("patterns/outbox/relay/sweep.rs").1, "patterns");
    assert_eq!(layer_of("patterns/outbox/sql/store.rs").1, "stores");

    let code = code_only(
        "use crate::patterns::replay::Report; // crate::testing::x\nlet s = \"crate::sql\";\npub(in crate::consume) fn f() {}\n",
    );
    assert_eq!(
        inline_paths(&code),
        vec![vec!["crate", "patterns", "replay", "Report"]]
    );
    assert_eq!(
        expand_use("crate::a::{b, c::{d, e as f}}"),
        vec![
            vec!["crate", "a", "b"],
            vec!["crate", "a", "c", "d"],
            vec!["crate", "a", "c", "e"]
        ]
    );

    let long = format!("{}#[cfg(test)]\nmod tests {{\n}}\n", "x\n".repeat(10));
    assert_eq!(without_test_items(&long).lines().count(), 10);
    // A test module in the middle is dropped and the code after it is kept (issue 49: the
    // impls after `codec.rs`'s test module were never read).
    let middle = "use a;\n#[cfg(test)]\nmod tests {\n    fn f() { let x = 1; }\n}\nimpl X for crate::Y {}\n#[cfg(test)]\nmod more;\nfn g() {}\n";
    assert_eq!(
        without_test_items(middle),
        "use a;\nimpl X for crate::Y {}\nfn g() {}"
    );
}
