//! The Prometheus text exposition format (0.0.4) and OpenMetrics text, both ways: the escaping
//! of label values every writer of an exposition or a PromQL string uses ([`escape_into`],
//! [`quoted`]), and the one parser of sample lines: for reading a serving engine's own
//! `/metrics` ([`parse`]), and for looking samples up by name and labels ([`sample`], [`sum`],
//! [`lines_named`]), as the tests of every exposition the canary and its simulator serve do.
//!
//! Only what those readers need is kept: each sample's name, labels and value.
//! `# HELP`/`# TYPE`/`# UNIT` lines, timestamps and exemplars are skipped. The input is
//! server-controlled, so a line that does not parse is counted and skipped rather than failing the
//! scrape, and nothing here panics on any input (property-tested below).
//!
//! Why not a crate: `prometheus-parse` (0.2.5, last released 2023) pulls in regex, chrono and
//! lazy_static and builds owned maps for every line; `openmetrics-parser` is LGPL-3.0. This
//! parser borrows from the input and allocates only for escaped label values.

use std::borrow::Cow;

/// Appends `value` escaped as a label value of the text formats (and a PromQL string): `\\`,
/// `\"` and a line break as `\n`; everything else as it is.
pub fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `value` escaped and in double quotes.
pub fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    escape_into(&mut out, value);
    out.push('"');
    out
}

/// One sample line: `name{label="value",...} value [timestamp] [# exemplar]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Labels<'a>,
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }

    /// Whether the sample has every `k="v"` of `labels` (and maybe others); as in Prometheus, an
    /// absent label is `""`.
    pub fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(k, v)| self.label(k).unwrap_or("") == *v)
    }
}

/// Every sample of an exposition, and how many non-comment lines could not be parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition<'a> {
    pub samples: Vec<Sample<'a>>,
    pub malformed_lines: usize,
}

/// Parses every line of `text`. Never fails: malformed lines are counted in
/// [`Exposition::malformed_lines`].
pub fn parse(text: &str) -> Exposition<'_> {
    let mut out = Exposition::default();
    for line in text.lines() {
        let line = line.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(sample) => out.samples.push(sample),
            None => out.malformed_lines += 1,
        }
    }
    out
}

/// The sample lines of `text` named exactly `name` (`x_total` is not `x`), in order, unparsed:
/// a reader that treats a malformed one as an error parses each with [`parse_line`].
pub fn lines_named<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> {
    text.lines().filter(move |l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']))
    })
}

/// The value of the first sample of `name` in `text` that has every `k="v"` of `labels` (an
/// absent label matches `""`); lines that do not parse are skipped.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    lines_named(text, name)
        .filter_map(parse_line)
        .find(|s| s.has(labels))
        .map(|s| s.value)
}

/// The sum of the samples of `name` in `text` that have every `k="v"` of `labels` (0 without
/// any); lines that do not parse are skipped.
pub fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    lines_named(text, name)
        .filter_map(parse_line)
        .filter(|s| s.has(labels))
        .map(|s| s.value)
        .sum()
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    is_name_start(b) || b.is_ascii_digit()
}

/// Splits a metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) off the front of `s`.
fn take_name(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    if !bytes.first().copied().is_some_and(is_name_start) {
        return None;
    }
    let end = bytes
        .iter()
        .position(|b| !is_name_char(*b))
        .unwrap_or(bytes.len());
    Some(s.split_at(end))
}

/// Parses a quoted label value at the front of `s` (which starts after the opening quote);
/// returns the unescaped value and the rest after the closing quote.
fn take_label_value(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut owned: Option<String> = None;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let value = match owned {
                    Some(o) => Cow::Owned(o),
                    None => Cow::Borrowed(&s[..i]),
                };
                return Some((value, &s[i + 1..]));
            }
            b'\\' => {
                let buf = owned.get_or_insert_with(|| s[..i].to_owned());
                let unescaped = match bytes.get(i + 1)? {
                    b'\\' => '\\',
                    b'"' => '"',
                    b'n' => '\n',
                    _ => return None,
                };
                buf.push(unescaped);
                i += 2;
            }
            _ => {
                // Copy the whole UTF-8 character; `i` always sits on a character boundary here
                // because the escape bytes and the quote are ASCII.
                let ch_len = s[i..].chars().next().map_or(1, char::len_utf8);
                if let Some(buf) = owned.as_mut() {
                    buf.push_str(&s[i..i + ch_len]);
                }
                i += ch_len;
            }
        }
    }
    None
}

/// A sample's labels as parsed: key and unescaped value.
type Labels<'a> = Vec<(&'a str, Cow<'a, str>)>;

fn parse_labels(mut s: &str) -> Option<(Labels<'_>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', '\t']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = take_name(s)?;
        let rest = rest.trim_start_matches([' ', '\t']).strip_prefix('=')?;
        let rest = rest.trim_start_matches([' ', '\t']).strip_prefix('"')?;
        let (value, rest) = take_label_value(rest)?;
        labels.push((key, value));
        s = rest.trim_start_matches([' ', '\t']);
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

/// A sample value: a float, or `+Inf`/`-Inf`/`NaN` in any case.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => {
            // Rust also accepts `infinity` and `nan` spelt otherwise; the format does not.
            if s.bytes()
                .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E')
            {
                return None;
            }
            s.parse().ok()
        }
    }
}

/// Parses one sample line (no surrounding blanks); `None` when it is not one.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let (name, rest) = take_name(line)?;
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => parse_labels(inner)?,
        None => (Vec::new(), rest),
    };
    // At least one blank between the name (or labels) and the value.
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let mut fields = rest.split([' ', '\t']).filter(|f| !f.is_empty());
    let value = parse_value(fields.next()?)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_simulators_shapes() {
        let text = "# HELP vllm:prefix_cache_hits_total Prompt tokens found.\n\
                    # TYPE vllm:prefix_cache_hits_total counter\n\
                    vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 1234\n\
                    dynamo_frontend_time_to_first_token_seconds_bucket{model=\"m\",le=\"+Inf\"} 7\n\
                    dynamo_frontend_time_to_first_token_seconds_sum{model=\"m\"} 0.5e1\n\
                    up 1 1712345678000\n\
                    openmetrics_total{a=\"b\",} 3 # {trace_id=\"x\"} 1.0\n\
                    nan_gauge NaN\n\
                    # EOF\n";
        let e = parse(text);
        assert_eq!(e.malformed_lines, 0);
        assert_eq!(e.samples.len(), 6);
        assert_eq!(e.samples[0].name, "vllm:prefix_cache_hits_total");
        assert_eq!(e.samples[0].label("engine"), Some("0"));
        assert_eq!(e.samples[0].value, 1234.0);
        assert_eq!(e.samples[1].label("le"), Some("+Inf"));
        assert_eq!(e.samples[2].value, 5.0);
        assert_eq!(e.samples[3].value, 1.0);
        assert_eq!(e.samples[4].value, 3.0);
        assert!(e.samples[5].value.is_nan());
    }

    #[test]
    fn unescapes_label_values() {
        let e = parse(r#"m{a="x\"y\\z\nw",b="é"} -Inf"#);
        assert_eq!(e.samples[0].label("a"), Some("x\"y\\z\nw"));
        assert_eq!(e.samples[0].label("b"), Some("é"));
        assert_eq!(e.samples[0].value, f64::NEG_INFINITY);
    }

    #[test]
    fn counts_malformed_lines_and_keeps_the_rest() {
        let text = "ok 1\n9bad 1\nm{a=\"unterminated} 1\nm{a=b} 1\nm 1x\nm{a=\"\\q\"} 1\nm{} infinity\nm\nlast 2\n";
        let e = parse(text);
        assert_eq!(e.samples.len(), 2, "{e:?}");
        assert_eq!(e.malformed_lines, 7);
        assert_eq!(e.samples[1].name, "last");
    }

    fn escape(v: &str) -> String {
        let mut out = String::new();
        escape_into(&mut out, v);
        out
    }

    proptest! {
        #[test]
        fn never_panics_on_any_input(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn never_panics_on_near_miss_lines(text in "[a-z_:]{1,5}(\\{([a-z]{1,3}=\"[^\"]{0,4}\"?,?){0,3}\\}?)? ?[-+0-9.eEInfa]{0,8}") {
            let _ = parse(&text);
        }

        #[test]
        fn rendered_samples_parse_back(
            name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
            labels in proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "\\PC{0,12}"), 0..4),
            value in proptest::num::f64::NORMAL | proptest::num::f64::ZERO,
            timestamp in proptest::option::of(0u64..u64::MAX),
        ) {
            let mut line = name.clone();
            if !labels.is_empty() {
                let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
                line.push('{');
                line.push_str(&pairs.join(","));
                line.push('}');
            }
            line.push_str(&format!(" {value:e}"));
            if let Some(ts) = timestamp {
                line.push_str(&format!(" {ts}"));
            }
            let e = parse(&line);
            prop_assert_eq!(e.malformed_lines, 0, "{}", line);
            prop_assert_eq!(e.samples.len(), 1);
            let s = &e.samples[0];
            prop_assert_eq!(s.name, name.as_str());
            prop_assert_eq!(s.value, value);
            let got: Vec<(String, String)> = s.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prop_assert_eq!(got, labels);
        }
    }
}
