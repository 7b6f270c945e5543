//! The module graph of `src/` as docs/ARCHITECTURE.md draws it: every `use crate::…` of a module
//! (its code before its unit tests) names a module of a lower layer of the document's layer
//! table, so the imports follow the data and have no cycle; and every top-level module is in the
//! table exactly once.

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
