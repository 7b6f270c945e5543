//! Config errors: every problem as `FILE:LINE:COL: message`, with a hint where one helps.

use std::fmt;
use std::path::PathBuf;

use serde_saphyr::Location;
use thiserror::Error;

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

/// A parse error of serde-saphyr as a diagnostic: its location, its message, and a typo hint.
pub fn from_yaml_error(err: &serde_saphyr::Error) -> Diagnostic {
    use serde_saphyr::Error as E;
    let pos = err
        .location()
        .filter(|l| *l != Location::UNKNOWN)
        .map(|l| (l.line(), l.column()));
    // serde-saphyr wraps errors with a source snippet; the structured variant is inside.
    match err.without_snippet() {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            let d = Diagnostic::new(pos, format!("unknown key `{field}`"));
            match did_you_mean(field, expected.iter().copied()) {
                Some(best) => d.hint(format!("did you mean `{best}`?")),
                None => d.hint(format!("expected one of {}", quoted(expected))),
            }
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => {
            let d = Diagnostic::new(pos, format!("unknown value `{variant}`"));
            match did_you_mean(variant, expected.iter().copied()) {
                Some(best) => d.hint(format!("did you mean `{best}`?")),
                None => d.hint(format!("expected one of {}", quoted(expected))),
            }
        }
        E::SerdeMissingField { field, .. } => {
            Diagnostic::new(pos, format!("missing key `{field}`"))
                .hint(format!("add `{field}:` to this entry"))
        }
        inner => Diagnostic::new(pos, bare_message(inner)),
    }
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
