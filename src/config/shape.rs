//! Whether a file is an llm-canary config at all. A file that is not one (a binary, a trace, a
//! list, a single word, a Markdown page, a Kubernetes manifest) would otherwise be read as a
//! config with every mistake at once: the parser's own words, or an "unknown key" for each of
//! its keys and a "no targets" after them. Such a file is one problem instead, naming what the
//! file is and what a config is.
//!
//! A file is taken for a config, and judged key by key as before, as soon as one of its top
//! keys is a config's or close to one (a misspelt `taregts:` is a config with a mistake).

use super::error::Diagnostic;
use super::outline::{Outline, Top, TopKey, one_line};
use super::schema::TOP_LEVEL_KEYS;

/// What every "not a config" problem says a config is.
pub(super) const WHAT_A_CONFIG_IS: &str = "an llm-canary config is a YAML mapping with a \
    `targets:` list of the deployments to measure and, optionally, `workloads:`, `slos:`, \
    `schedule:` and the other keys of docs/DESIGN.md §3; start from examples/demo.yaml";

/// The one problem of a file that is not a config (`Some`), or `None` for a file that is one,
/// however many mistakes it has.
pub(super) fn not_a_config(text: &str) -> Option<Diagnostic> {
    if text.trim().is_empty() {
        return Some(problem(None, "the file is empty"));
    }
    let Some(outline) = Outline::read(text) else {
        return not_yaml(text);
    };
    match outline.top() {
        Top::Nothing => Some(problem(None, "the file holds no value, only comments")),
        Top::Value { written, place } => Some(problem(
            Some(place),
            format!("the file is a single value ({})", quoted(written)),
        )),
        Top::List { place } => Some(problem(Some(place), "the file is a YAML list")),
        Top::Mapping(keys) => foreign_mapping(&keys),
    }
}

/// A problem saying the file is not a config because of `what`.
fn problem(place: Option<(u64, u64)>, what: impl AsRef<str>) -> Diagnostic {
    Diagnostic::new(
        place,
        format!("{}: this is not an llm-canary config", what.as_ref()),
    )
    .hint(WHAT_A_CONFIG_IS)
}

/// Whether `key` (as written, quotes and all) is a config's top key or a typo of one: a letter
/// wrong, missing, added or two swapped (two of them in a key of 8 letters or more). Closer
/// than the "did you mean" of an unknown key, which may guess at any key: `timestamp` of a
/// trace or `spec` of a manifest is no typo of `time_scale` or `seed`.
fn config_key(key: &str) -> bool {
    let key = key.trim().trim_matches(['"', '\'']);
    let typos = if key.chars().count() >= 8 { 2 } else { 1 };
    TOP_LEVEL_KEYS
        .iter()
        .any(|k| strsim::osa_distance(key, k) <= typos)
}

/// A mapping none of whose keys is a config's; `None` when one is (or it has none: an empty
/// mapping is a config without targets, which validation says).
fn foreign_mapping(keys: &[TopKey<'_>]) -> Option<Diagnostic> {
    let first = keys.first()?;
    if keys.iter().any(|k| config_key(k.key)) {
        return None;
    }
    let has = |name: &str| {
        keys.iter()
            .find(|k| k.key.trim_matches(['"', '\'']) == name)
    };
    let what = if let (Some(_), Some(kind)) = (has("apiVersion"), has("kind")) {
        let kind = kind
            .value
            .map(|v| format!(" ({})", quoted(&format!("kind: {v}"))));
        format!(
            "the file is a Kubernetes manifest{}",
            kind.unwrap_or_default()
        )
    } else if has("config").is_some() {
        "the file looks like the Helm chart's values (the config is what their `config:` holds)"
            .to_owned()
    } else if ["input_length", "output_length", "hash_ids"]
        .iter()
        .any(|k| has(k).is_some())
    {
        "the file looks like a request trace (a config names its traces under \
         `workloads.trace_replay.traces`)"
            .to_owned()
    } else {
        let mut names: Vec<String> = keys.iter().take(3).map(|k| quoted(k.key)).collect();
        if keys.len() > 3 {
            names.push("…".into());
        }
        format!(
            "none of the file's keys ({}) is a config's",
            names.join(", ")
        )
    };
    Some(problem(Some(first.place), what))
}

/// A text that does not read as YAML: a config with a syntax error when its first line of
/// content (past comments, Markdown's headings among them) starts with a config's key (then
/// `None`, and the parser's message is the problem), else not a config.
fn not_yaml(text: &str) -> Option<Diagnostic> {
    let content: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#') && !l.starts_with("---"))
        .collect();
    let (first_line, first) = *content.first()?;
    let key = first.trim_start_matches(['{', ' ']).split(':').next();
    if first.contains(':') && key.is_some_and(config_key) {
        return None;
    }
    if let Some(place) = control_character(text) {
        return Some(problem(
            Some(place),
            "the file is not text (it holds control characters)",
        ));
    }
    if content
        .iter()
        .all(|(_, l)| l.starts_with('{') && l.ends_with('}'))
    {
        return Some(problem(
            Some((first_line as u64 + 1, 1)),
            "the file is JSON lines (one object a line, as a request trace is)",
        ));
    }
    // The parser's words (an anchor, a mapping value "not allowed in this context") would
    // speak of YAML to someone who did not mean to write any: the line that is not is shown.
    Some(problem(
        Some((first_line as u64 + 1, 1)),
        format!("the file is text, not YAML ({})", quoted(first)),
    ))
}

/// The line and column of the first control character other than a tab or a line break.
fn control_character(text: &str) -> Option<(u64, u64)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let col = line
            .chars()
            .position(|c| c.is_control() && !matches!(c, '\t' | '\r'))?;
        Some((i as u64 + 1, col as u64 + 1))
    })
}

/// The problem of a file that is not UTF-8 text, at its first byte that is not (`valid_up_to`,
/// the bytes before it being text): a config saved in another encoding when it reads as one
/// otherwise, else not a config.
pub(super) fn not_utf8(bytes: &[u8], valid_up_to: usize) -> Diagnostic {
    let before = String::from_utf8_lossy(&bytes[..valid_up_to.min(bytes.len())]);
    let line = before.matches('\n').count() as u64 + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u64 + 1;
    if not_a_config(&String::from_utf8_lossy(bytes)).is_none() {
        return Diagnostic::new(Some((line, col)), "the file is not UTF-8 text")
            .hint("save it as UTF-8");
    }
    problem(
        Some((line, col)),
        "the file is not UTF-8 text (a binary file?)",
    )
}

/// Written text as a message quotes it: on one line, cut short, in backticks (in double quotes
/// when it has a backtick itself, as a Markdown page does).
fn quoted(written: &str) -> String {
    let text = one_line(written);
    if text.contains('`') {
        format!("\"{text}\"")
    } else {
        format!("`{text}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_top_keys_are_the_configs_fields() {
        let err = serde_saphyr::from_str::<Config>("not_a_key: 1\n").unwrap_err();
        let serde_saphyr::Error::SerdeUnknownField { expected, .. } = err.without_snippet() else {
            panic!("{err}");
        };
        assert_eq!(*expected, TOP_LEVEL_KEYS);
    }

    fn what(text: &str) -> String {
        let d = not_a_config(text).unwrap_or_else(|| panic!("{text:?} is taken for a config"));
        assert_eq!(d.hint.as_deref(), Some(WHAT_A_CONFIG_IS));
        let (line, col) = d.pos.unwrap_or((0, 0));
        format!("{line}:{col}: {}", d.message)
    }

    #[test]
    fn a_file_that_is_not_a_config_is_one_problem_saying_what_it_is() {
        let not = ": this is not an llm-canary config";
        assert_eq!(
            what("\0\x01binary"),
            format!("1:1: the file is not text (it holds control characters){not}")
        );
        assert_eq!(
            what("a: 1\nb: \x02\n"),
            format!("2:4: the file is not text (it holds control characters){not}")
        );
        assert_eq!(
            what("- a\n- b\n"),
            format!("1:1: the file is a YAML list{not}")
        );
        assert_eq!(
            what("hello\n"),
            format!("1:1: the file is a single value (`hello`){not}")
        );
        assert_eq!(
            what("# nothing yet\n"),
            format!("0:0: the file holds no value, only comments{not}")
        );
        assert_eq!(what(" \n"), format!("0:0: the file is empty{not}"));
        assert_eq!(
            what("{\"input_length\": 5}\n"),
            format!(
                "1:2: the file looks like a request trace (a config names its traces under `workloads.trace_replay.traces`){not}"
            )
        );
        assert_eq!(
            what(
                "{\"timestamp\": 0, \"input_length\": 5}\n{\"timestamp\": 9, \"input_length\": 7}\n"
            ),
            format!("1:1: the file is JSON lines (one object a line, as a request trace is){not}")
        );
        assert_eq!(
            what("apiVersion: v1\nkind: ConfigMap\nmetadata: { name: x }\n"),
            format!("1:1: the file is a Kubernetes manifest (`kind: ConfigMap`){not}")
        );
        assert_eq!(
            what("replicas: 2\nconfig:\n  targets: []\n"),
            format!(
                "1:1: the file looks like the Helm chart's values (the config is what their `config:` holds){not}"
            )
        );
        assert_eq!(
            what("{\"timestamp\": 0, \"input\": 5}\n"),
            format!(
                "1:2: none of the file's keys (`\"timestamp\"`, `\"input\"`) is a config's{not}"
            )
        );
        assert_eq!(
            what("name: x\nversion: 2\nowner: y\nmore: z\n"),
            format!(
                "1:1: none of the file's keys (`name`, `version`, `owner`, …) is a config's{not}"
            )
        );
        assert_eq!(
            what("# Title\n\nSome *text* here: yes.\n\n- item\n"),
            format!("3:1: the file is text, not YAML (`Some *text* here: yes.`){not}")
        );
        assert_eq!(
            what("# Title\n\n```sh\nrun it\n```\n"),
            format!("3:1: the file is text, not YAML (\"```sh\"){not}")
        );
    }

    #[test]
    fn a_config_with_mistakes_is_still_a_config() {
        for text in [
            "targets: [\n",
            "# a comment first\ntargets:\n  - { name: a\n",
            "taregts: []\n",
            "workload:\n  multi_turn: {}\n",
            "time-scale: 0.5\n",
            "time_scale: 1.0\n",
            "seed: 1\nnot_a_key: 2\n",
            "{}\n",
            "\"targets\": []\n",
        ] {
            assert_eq!(not_a_config(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_file_that_is_not_utf8_says_where() {
        // A config in Latin-1: a config, in the wrong encoding.
        let latin1 = b"targets:\n  - name: caf\xe9\n";
        // `targets:\n  - name: caf` is text: 22 bytes.
        let d = not_utf8(latin1, 22);
        assert_eq!(d.pos, Some((2, 14)));
        assert_eq!(d.message, "the file is not UTF-8 text");
        assert_eq!(d.hint.as_deref(), Some("save it as UTF-8"));
        // A gzip file.
        let d = not_utf8(b"\x1f\x8b\x08\x00\x00", 1);
        assert_eq!(d.pos, Some((1, 2)));
        assert!(
            d.message
                .ends_with("(a binary file?): this is not an llm-canary config")
        );
    }
}
