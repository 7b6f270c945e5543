//! The module graph of `src/` as docs/ARCHITECTURE.md draws it: every `use crate::…` of a module
//! (its code before its unit tests) names a module of a lower layer of the document's layer
//! table, so the imports follow the data and have no cycle; and every top-level module is in the
//! table exactly once. Inside a module the same holds for its files: the files of one folder
//! import each other without a cycle. And no function of `src/` is longer than a screenful or two
//! ([`MAX_FN_LINES`]), no file longer than one concern ([`MAX_FILE_LINES`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The layer of each module, from the table under `## Layers` in docs/ARCHITECTURE.md: rows of
/// `| N | `a`, `b` | … |`, layer 0 at the bottom.
fn layers() -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("\n## Layers")
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap();
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|c| c.parse::<u32>().ok()) else {
            continue;
        };
        for module in cells[2].split(',') {
            let module = module.trim().trim_matches('`').to_owned();
            assert!(
                out.insert(module.clone(), layer).is_none(),
                "`{module}` is in the layer table twice"
            );
        }
    }
    assert!(!out.is_empty(), "no layer rows under `## Layers`");
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module of each file and the top-level modules its non-test code names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let deps = edges.entry(top.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    deps.insert(name);
                }
            }
        }
    }
    edges
}

#[test]
fn every_import_points_down_the_documented_layers() {
    let layers = layers();
    let edges = imports();
    let modules: BTreeSet<&String> = edges.keys().collect();
    let documented: BTreeSet<&String> = layers.keys().collect();
    assert_eq!(
        modules, documented,
        "the modules of src/ and the layer table of docs/ARCHITECTURE.md differ"
    );
    let mut against = Vec::new();
    for (module, deps) in &edges {
        for dep in deps {
            match (layers.get(module), layers.get(dep)) {
                (Some(a), Some(b)) if b < a => {}
                (a, b) => against.push(format!(
                    "{module} (layer {a:?}) imports {dep} (layer {b:?})"
                )),
            }
        }
    }
    assert!(
        against.is_empty(),
        "imports against the documented order:\n{}",
        against.join("\n")
    );
}

#[test]
fn the_layers_follow_the_data_flow() {
    // What a request becomes flows upwards: the config shapes the client's requests, their
    // records become the model's step data, the schedule produces it, and the exporters, the
    // SLO engine and the report consume it.
    let l = layers();
    for (low, high) in [
        ("config", "client"),
        ("client", "model"),
        ("model", "schedule"),
        ("model", "slo"),
        ("schedule", "export"),
        ("slo", "export"),
        ("schedule", "report"),
        ("export", "daemon"),
        ("daemon", "cli"),
    ] {
        assert!(l[low] < l[high], "{low} should sit below {high}");
    }
}

/// `text` before its unit tests (`#[cfg(test)]`), with comments and the contents of string and
/// character literals left out and every line kept: code in rustfmt's layout, where a `crate::`
/// in a doc comment or a `}` in a string cannot be mistaken for code.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap();
    let s = text.as_bytes();
    let mut out = Vec::with_capacity(s.len());
    let newlines_of = |skipped: &[u8]| skipped.iter().filter(|&&b| b == b'\n').count();
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let after_ident = i > 0 && (s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_');
        let skip_to = if rest.starts_with(b"//") {
            // The line's end stays.
            rest.iter()
                .position(|&b| b == b'\n')
                .map_or(s.len(), |n| i + n)
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0, i);
            while j < s.len() {
                if s[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if s[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if let Some(end) = raw_string_end(s, i).filter(|_| !after_ident || s[i - 1] == b'b')
        {
            end
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == b'\'' {
            // A character literal, or else a lifetime or label (kept).
            let len = match rest.get(1) {
                Some(b'\\') => rest[2..].iter().position(|&b| b == b'\'').map(|n| n + 3),
                Some(_) => {
                    let c = text[i + 1..].chars().next().unwrap();
                    (rest.get(1 + c.len_utf8()) == Some(&b'\'')).then(|| c.len_utf8() + 2)
                }
                None => None,
            };
            match len {
                Some(len) => i + len,
                None => {
                    out.push(b'\'');
                    i += 1;
                    continue;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        let skip_to = skip_to.min(s.len());
        let literal = !rest.starts_with(b"//") && !rest.starts_with(b"/*");
        if literal {
            out.extend_from_slice(b"\"\"");
        }
        out.extend(std::iter::repeat_n(b'\n', newlines_of(&s[i..skip_to])));
        i = skip_to;
    }
    String::from_utf8(out).unwrap()
}

/// The end of a raw string literal (`r"…"`, `r#"…"#`) starting at `i`.
fn raw_string_end(s: &[u8], i: usize) -> Option<usize> {
    if s[i] != b'r' {
        return None;
    }
    let hashes = s[i + 1..].iter().take_while(|&&b| b == b'#').count();
    let open = i + 1 + hashes;
    if s.get(open) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let end = s[open + 1..]
        .windows(close.len())
        .position(|w| w == close)?;
    Some(open + 1 + end + close.len())
}

/// Every source file of `src/`, by its module path (`mod.rs` is its folder's module; `lib.rs`
/// and `main.rs` the crate's, the empty path).
fn module_files() -> BTreeMap<Vec<String>, PathBuf> {
    let src = root().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut out = BTreeMap::new();
    for path in files {
        let rel = path.strip_prefix(&src).unwrap();
        let mut module: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod")
            || (module.len() == 1 && (module[0] == "lib" || module[0] == "main"))
        {
            module.pop();
        }
        if !module.is_empty() {
            out.insert(module, rel.to_owned());
        }
    }
    out
}

/// Every path of `code` that starts with `crate::` or `super::`, as the module path it names
/// (from the crate's root) and as written, for code in module `module`. Groups (`a::{b, c::d}`)
/// give one path each; `super` inside an inline `mod x { … }` is that module's parent.
fn crate_paths(code: &str, module: &[String]) -> Vec<(Vec<String>, String)> {
    let s = code.as_bytes();
    let ident_at = |i: usize| -> &str {
        let n = s[i..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        &code[i..i + n]
    };
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Inline modules open around here, with the brace depth inside each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < s.len() {
        let boundary =
            i == 0 || !(s[i - 1].is_ascii_alphanumeric() || matches!(s[i - 1], b'_' | b':'));
        let word = if boundary { ident_at(i) } else { "" };
        match s[i] {
            b'{' => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
            }
            b'}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            b';' => pending_mod = None,
            _ => {}
        }
        if word == "mod" {
            let mut j = i + 3;
            while s.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
            pending_mod = Some(ident_at(j).to_owned());
            i = j;
            continue;
        }
        if (word == "crate" || word == "super") && code[i..].starts_with(&format!("{word}::")) {
            let mut here: Vec<String> = module.to_vec();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            let mut j = i;
            for segments in use_tree(s, &mut j) {
                let mut abs = if segments[0] == "crate" {
                    Vec::new()
                } else {
                    here.clone()
                };
                let mut rest = &segments[..];
                if rest[0] == "crate" {
                    rest = &rest[1..];
                }
                while rest.first().is_some_and(|s| s == "super") {
                    abs.pop();
                    rest = &rest[1..];
                }
                abs.extend(rest.iter().filter(|s| *s != "self").cloned());
                out.push((abs, segments.join("::")));
            }
            i = j;
            continue;
        }
        i += word.len().max(1);
    }
    out
}

/// The paths of one use tree (or path expression) starting at `*i`: `a::b::{c, d::e as f}` is
/// `a::b::c` and `a::b::d::e`.
fn use_tree(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    let skip_space = |i: &mut usize| {
        while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
            *i += 1;
        }
    };
    let mut segments = Vec::new();
    loop {
        skip_space(i);
        if s.get(*i) == Some(&b'{') {
            *i += 1;
            let mut out = Vec::new();
            loop {
                skip_space(i);
                match s.get(*i) {
                    None => break,
                    Some(b'}') => {
                        *i += 1;
                        break;
                    }
                    Some(b',') => *i += 1,
                    Some(_) => {
                        let start = *i;
                        for tail in use_tree(s, i) {
                            let mut path = segments.clone();
                            path.extend(tail);
                            out.push(path);
                        }
                        // `as name`, `*`: up to the next item.
                        while s.get(*i).is_some_and(|b| !matches!(b, b',' | b'}')) {
                            *i += 1;
                        }
                        if *i == start {
                            *i += 1;
                        }
                    }
                }
            }
            if out.is_empty() {
                out.push(segments);
            }
            return out;
        }
        let n = s[*i..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        if n == 0 {
            break;
        }
        segments.push(String::from_utf8_lossy(&s[*i..*i + n]).into_owned());
        *i += n;
        skip_space(i);
        if s[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            break;
        }
    }
    vec![segments]
}

/// The imports between the files of each folder: folder → file → (sibling → the paths that
/// name it). A path names the module of its longest prefix that is a file; that module's file
/// in the importing file's folder is the sibling (a folder of its own counts as one file). A
/// `mod.rs` is the folder itself, not a sibling: it imports its files as their parent.
type FileGraph = BTreeMap<String, BTreeMap<String, BTreeMap<String, BTreeSet<String>>>>;

fn file_imports() -> FileGraph {
    let files = module_files();
    let mut graph = FileGraph::new();
    for (module, rel) in &files {
        if rel.file_name().is_some_and(|f| f == "mod.rs") {
            continue;
        }
        let (me, folder) = module.split_last().unwrap();
        let folder_name = format!(
            "src/{}",
            folder.iter().map(|m| format!("{m}/")).collect::<String>()
        );
        let text = std::fs::read_to_string(root().join("src").join(rel)).unwrap();
        let deps = graph
            .entry(folder_name)
            .or_default()
            .entry(me.clone())
            .or_default();
        for (abs, written) in crate_paths(&code(&text), module) {
            let Some(target) = (0..=abs.len())
                .rev()
                .map(|n| &abs[..n])
                .find(|prefix| files.contains_key(*prefix))
            else {
                continue;
            };
            if target.len() > folder.len() && target.starts_with(folder) {
                let sibling = &target[folder.len()];
                if sibling != me {
                    deps.entry(sibling.clone()).or_default().insert(written);
                }
            }
        }
    }
    graph
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flat_map(|d| d.keys()) {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|x| *x == v).unwrap();
                let mut component: Vec<String> =
                    self.stack.drain(at..).map(str::to_owned).collect();
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn the_files_of_a_folder_import_each_other_without_a_cycle() {
    let mut found = Vec::new();
    for (folder, edges) in file_imports() {
        for component in cycles(&edges) {
            let mut text = format!("{folder}: {}", component.join(", "));
            for from in &component {
                for (to, paths) in &edges[from] {
                    if component.contains(to) {
                        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
                        text.push_str(&format!("\n  {from} -> {to} ({})", paths.join(", ")));
                    }
                }
            }
            found.push(text);
        }
    }
    println!("{} file-level cycles", found.len());
    for cycle in &found {
        println!("{cycle}");
    }
    assert!(
        found.is_empty(),
        "{} file-level cycles:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The longest function accepted outside the tests, in lines from `fn` to its closing brace.
const MAX_FN_LINES: usize = 120;

/// The name of the function a line of code declares, after its qualifiers (`pub(crate) const
/// async unsafe extern "C" fn name`).
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for q in [
            "pub(crate)",
            "pub(super)",
            "pub",
            "const",
            "async",
            "unsafe",
            "extern",
            "\"\"",
            "default",
        ] {
            if let Some(r) = rest
                .strip_prefix(q)
                .filter(|r| r.starts_with(char::is_whitespace))
            {
                rest = r.trim_start();
            }
        }
        if let Some(r) = rest.strip_prefix("pub(in ") {
            rest = r.split_once(')').map_or(r, |(_, r)| r).trim_start();
        }
        if rest == before {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let n = name
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (n > 0).then(|| &name[..n])
}

/// Each function of `code` (laid out by rustfmt) with its length: from its `fn` line to the
/// first later line that is `}` at the same indent. A one-line function is one line; a
/// declaration without a body (`fn f();` in a trait) is none.
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let at = indent(line);
        // The signature ends on its first line, or on a later one at the same indent (`) -> T {`,
        // a `where` clause's `{`); its parameters are indented further.
        let Some((end, last)) = lines[i..]
            .iter()
            .enumerate()
            .map(|(n, l)| (i + n, l.trim_end()))
            .filter(|(n, l)| *n == i || indent(l) == at)
            .find(|(_, l)| l.ends_with(['{', '}', ';']))
        else {
            continue;
        };
        let len = if last.ends_with(';') {
            continue;
        } else if last.ends_with('}') {
            end - i + 1
        } else {
            let close = format!("{}}}", " ".repeat(at));
            match lines[end + 1..].iter().position(|l| l.trim_end() == close) {
                Some(n) => end + 1 + n - i + 1,
                // No end found: up to the file's end, so a miscounted function is not missed.
                None => lines.len() - i,
            }
        };
        out.push((name.to_owned(), len));
    }
    out
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut long = Vec::new();
    for rel in module_files().values() {
        let text = std::fs::read_to_string(root().join("src").join(rel)).unwrap();
        for (name, len) in functions(&code(&text)) {
            if len > MAX_FN_LINES {
                long.push((
                    len,
                    format!("src/{}: fn {name} is {len} lines", rel.display()),
                ));
            }
        }
    }
    long.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let long: Vec<String> = long.into_iter().map(|(_, line)| line).collect();
    assert!(
        long.is_empty(),
        "{} functions are longer than {MAX_FN_LINES} lines; split them into named steps:\n{}",
        long.len(),
        long.join("\n")
    );
}

/// Most lines a source file may hold before its tests: past it, a file holds more than one
/// concern and a reader loses the thread.
const MAX_FILE_LINES: usize = 800;

#[test]
fn no_file_holds_more_than_the_limit_before_its_tests() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
            let n = before_tests.matches('\n').count();
            (n > MAX_FILE_LINES).then(|| format!("{}: {n} lines", path.display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "{} files hold more than {MAX_FILE_LINES} lines before their tests; split them by concern:\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn the_code_reader_sees_code_only() {
    let text = "fn a() {\n    let s = \"crate::x }\";\n    // crate::y\n    let c = '}';\n    let r = r#\"\n}\"#;\n    b'\\''; 'a: loop {}\n}\n#[cfg(test)]\nfn t() {}\n";
    let code = code(text);
    assert_eq!(code.lines().count(), 8, "{code}");
    assert!(!code.contains("crate::"), "{code}");
    assert_eq!(functions(&code), vec![("a".to_owned(), 8)]);
    let paths = crate_paths(
        "use super::{eval::Interval, store::{self, Store as S}};\nmod inner {\n    use super::x::Y;\n}\nfn f() { crate::a::b::c(); }",
        &["slo".to_owned(), "baseline".to_owned()],
    );
    let names: Vec<String> = paths.iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(
        names,
        [
            "slo::eval::Interval",
            "slo::store",
            "slo::store::Store",
            "slo::baseline::x::Y",
            "a::b::c"
        ]
    );
    assert_eq!(declared_fn("    pub(crate) async fn run("), Some("run"));
    assert_eq!(declared_fn("    let f: fn(u32) = g;"), None);
}
