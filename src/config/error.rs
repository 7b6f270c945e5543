//! Config errors: every problem as `FILE:LINE:COL: message`, with a hint where one helps.

use std::fmt;
use std::path::PathBuf;

use serde_saphyr::Location;
use thiserror::Error;

use super::outline::{KeyPath, Outline};

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    /// 1-based line and column; `None` when the problem has no single place (e.g. a missing key).
    pub pos: Option<(u64, u64)>,
    pub message: String,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(pos: Option<(u64, u64)>, message: impl Into<String>) -> Self {
        Diagnostic {
            pos,
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", render(file, diagnostics))]
    Invalid {
        file: String,
        diagnostics: Vec<Diagnostic>,
    },
}

impl ConfigError {
    /// The problems, for callers that present them themselves.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ConfigError::Io { .. } => &[],
            ConfigError::Invalid { diagnostics, .. } => diagnostics,
        }
    }
}

fn render(file: &str, diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for (i, d) in diagnostics.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&DiagnosticLine { file, d }.to_string());
    }
    out
}

struct DiagnosticLine<'a> {
    file: &'a str,
    d: &'a Diagnostic,
}

impl fmt::Display for DiagnosticLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.d.pos {
            Some((line, col)) => write!(f, "{}:{line}:{col}: {}", self.file, self.d.message)?,
            None => write!(f, "{}: {}", self.file, self.d.message)?,
        }
        if let Some(hint) = &self.d.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}

/// The closest candidate to a misspelt name, if one is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// A parse error of serde-saphyr as a diagnostic, explained against `text`, the document it came
/// from: the key path at its position, the type the key takes and, from `example` (a valid
/// document of the same schema), an example value.
pub fn from_yaml_error(err: &serde_saphyr::Error, text: &str, example: Option<&str>) -> Diagnostic {
    let example = example.and_then(Outline::read);
    describe(err, Outline::read(text).as_ref(), example.as_ref())
}

/// The 1-based line and column of a parse error, when it has one.
pub(super) fn position(err: &serde_saphyr::Error) -> Option<(u64, u64)> {
    err.location()
        .filter(|l| *l != Location::UNKNOWN)
        .map(|l| (l.line(), l.column()))
}

/// A parse error as a diagnostic. `outline` is the document read as plain YAML (absent when it
/// is not YAML at all); `reference` a valid document of the same schema, whose value at the same
/// key path is the example a wrong value's hint shows.
pub(super) fn describe(
    err: &serde_saphyr::Error,
    outline: Option<&Outline<'_>>,
    reference: Option<&Outline<'_>>,
) -> Diagnostic {
    use serde_saphyr::Error as E;
    let pos = position(err);
    let found = outline.zip(pos).and_then(|(o, p)| o.find(p));
    let path = found.as_ref().map(|f| f.path.clone());
    // serde-saphyr wraps errors with a source snippet; the structured variant is inside.
    let inner = err.without_snippet();
    match inner {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            let d = Diagnostic::new(pos, format!("unknown key `{field}`{}", within(&path)));
            match did_you_mean(field, expected.iter().copied()) {
                Some(best) => d.hint(format!("did you mean `{best}`?")),
                None => d.hint(format!("expected one of {}", quoted(expected))),
            }
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => {
            let name = path.map(|p| format!(" for `{p}`")).unwrap_or_default();
            let d = Diagnostic::new(pos, format!("unknown value `{variant}`{name}"));
            match did_you_mean(variant, expected.iter().copied()) {
                Some(best) => d.hint(format!("did you mean `{best}`?")),
                None => d.hint(format!("expected one of {}", quoted(expected))),
            }
        }
        E::SerdeMissingField { field, .. } => {
            Diagnostic::new(pos, format!("missing key `{field}`"))
                .hint(format!("add `{field}:` to this entry"))
        }
        E::DuplicateMappingKey { key, .. } => {
            let name = match (&path, key) {
                (Some(p), _) => format!("`{p}`"),
                (None, Some(k)) => format!("`{k}`"),
                (None, None) => "a key".to_owned(),
            };
            let first = found
                .as_ref()
                .and_then(|f| f.first_same_key)
                .map(|(line, col)| format!(" (first at line {line}, column {col})"))
                .unwrap_or_default();
            Diagnostic::new(pos, format!("{name} is written twice{first}"))
                .hint("a key holds one value: keep one of the two")
        }
        inner => match (path, outline, found.as_ref()) {
            (Some(path), Some(outline), Some(found)) if !found.at_key => {
                wrong_value(inner, pos, &path, outline, reference)
            }
            _ => Diagnostic::new(pos, bare_message(inner)),
        },
    }
}

/// ` in `PARENT`` for a key path with a parent, else nothing.
fn within(path: &Option<KeyPath>) -> String {
    match path {
        Some(p) if p.0.len() > 1 => {
            format!(" in `{}`", KeyPath(p.0[..p.0.len() - 1].to_vec()))
        }
        _ => String::new(),
    }
}

/// A value of the wrong type or outside its grammar at `path`: the path, what it takes, what was
/// written, and an example.
fn wrong_value(
    err: &serde_saphyr::Error,
    pos: Option<(u64, u64)>,
    path: &KeyPath,
    outline: &Outline<'_>,
    reference: Option<&Outline<'_>>,
) -> Diagnostic {
    use serde_saphyr::Error as E;
    let written = err
        .location()
        .map(|l| outline.written(l))
        .unwrap_or_default();
    let example = reference.and_then(|r| r.example(path));
    let message = bare_message(err);
    // Our own value errors (a duration outside the grammar) say what is wrong themselves; the
    // accepted forms are the hint.
    if let Some((what, forms)) = message.split_once(super::duration::FORMS_SEPARATOR) {
        return Diagnostic::new(pos, format!("`{path}`: {what}")).hint(format!("write {forms}"));
    }
    let expected = match err {
        E::InvalidScalar { ty, .. } => scalar_type(ty),
        E::Unexpected { expected, .. } if expected.starts_with("sequence") => "a list".into(),
        E::Unexpected { expected, .. } if expected.starts_with("mapping") => "a mapping".into(),
        E::SerdeInvalidType { expected, .. } | E::SerdeInvalidValue { expected, .. } => {
            expected.clone()
        }
        E::SerdeInvalidLength { expected, .. } => expected.clone(),
        // A scalar was wanted ("string scalar"): which kind, the reference tells.
        E::Unexpected { .. } => example
            .as_ref()
            .map_or("a single value".into(), |e| kind_of(&e.value)),
        _ => return Diagnostic::new(pos, format!("`{path}`: {message}")),
    };
    let d = Diagnostic::new(pos, format!("`{path}` must be {expected}, not `{written}`"));
    let example = example
        .map(|e| e.shown(path))
        .or_else(|| fallback_example(&expected));
    match example {
        Some(e) => d.hint(format!("e.g. `{e}`")),
        None => d,
    }
}

/// What serde-saphyr's scalar type names mean to someone writing YAML.
fn scalar_type(ty: &str) -> String {
    let max = match ty {
        "u8" => Some(u64::from(u8::MAX)),
        "u16" => Some(u64::from(u16::MAX)),
        "u32" => Some(u64::from(u32::MAX)),
        "u64" | "usize" => Some(u64::MAX),
        _ => None,
    };
    if let Some(max) = max {
        return format!("a whole number from 0 to {max}");
    }
    match ty {
        t if t.starts_with('i') => "a whole number".into(),
        t if t.starts_with('f') || t.contains("float") => "a number".into(),
        t if t.starts_with("bool") => "`true` or `false`".into(),
        "char" => "a single character".into(),
        other => format!("a value of type {other}"),
    }
}

/// The kind of value a reference scalar is, for a message.
fn kind_of(value: &str) -> String {
    if value.parse::<u64>().is_ok() {
        "a whole number".into()
    } else if value.parse::<f64>().is_ok() {
        "a number".into()
    } else if value == "true" || value == "false" {
        "`true` or `false`".into()
    } else if super::duration::parse(value).is_ok() {
        "a duration".into()
    } else if value.starts_with('[') {
        "a list".into()
    } else if value.starts_with('{') {
        "a mapping".into()
    } else {
        "a single value".into()
    }
}

/// An example by type alone, where the reference document has no value at the key.
fn fallback_example(expected: &str) -> Option<String> {
    let e = match expected {
        e if e.starts_with("a whole number") => "16",
        "a number" => "0.5",
        "`true` or `false`" => "true",
        "a duration" => "30s",
        _ => return None,
    };
    Some(e.into())
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error's text without serde-saphyr's own location suffix and source snippet (we print the
/// position ourselves, in the `FILE:LINE:COL` form editors and CI annotations understand).
fn bare_message(err: &serde_saphyr::Error) -> String {
    let rendered = err.without_snippet().to_string();
    let first = rendered.lines().next().unwrap_or("").trim();
    // Strip a trailing " at line N column M" that some variants append.
    match first.rfind(" at line ") {
        Some(i) => first[..i].to_owned(),
        None => first.to_owned(),
    }
}
