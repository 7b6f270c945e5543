//! Reading a config file into the typed schema without stopping at its first problem. The YAML
//! deserializer stops at the first entry it cannot read (a wrong type, an unknown or repeated key,
//! a duration outside the grammar); each such entry becomes a diagnostic naming its key path, is
//! then left out of the text (blanked, so every other line and column stays where it was), and
//! the file is read again, until it reads. Validation then judges what was read, so one `check`
//! lists every problem of a file that is YAML at all.

use std::sync::OnceLock;

use super::error::{Diagnostic, describe, position};
use super::outline::{KeyPath, Outline, blank};
use super::schema::Config;

/// How many unreadable entries are left out before reading gives up (a file that is mostly
/// wrong gains nothing from more).
const MAX_LEFT_OUT: usize = 50;

/// A config as far as it could be read.
pub(super) struct Reading {
    /// `None` when an entry could not be left out cleanly (or the file is not YAML): the
    /// diagnostics are then all there is.
    pub(super) config: Option<Config>,
    pub(super) diagnostics: Vec<Diagnostic>,
    /// The key paths of the entries left out.
    left_out: Vec<KeyPath>,
}

impl Reading {
    /// The reading's diagnostics followed by `later` (validation's), less those that name a
    /// left-out key: such a key holds its default in the config that was validated, and a
    /// problem found with that default would only mislead.
    pub(super) fn with(mut self, later: Vec<Diagnostic>) -> Vec<Diagnostic> {
        let names: Vec<String> = self
            .left_out
            .iter()
            .flat_map(|p| {
                let keys = p.keys();
                // `workloads.concurrency_sweep.warmup` is `concurrency_sweep.warmup` and
                // `warmup` in validation's messages.
                (0..keys.len())
                    .map(|i| format!("`{}", keys[i..].join(".")))
                    .collect::<Vec<_>>()
            })
            .collect();
        let names_left_out = |d: &Diagnostic| {
            names.iter().any(|n| {
                [format!("{n}`"), format!("{n}.")]
                    .iter()
                    .any(|full| d.message.contains(full.as_str()))
            })
        };
        self.diagnostics
            .extend(later.into_iter().filter(|d| !names_left_out(d)));
        self.diagnostics
    }
}

/// Reads `text` into a [`Config`], leaving out each entry it cannot read (see the module).
pub(super) fn read(text: &str) -> Reading {
    let mut current = text.to_owned();
    let mut reading = Reading {
        config: None,
        diagnostics: Vec::new(),
        left_out: Vec::new(),
    };
    for _ in 0..=MAX_LEFT_OUT {
        let err = match serde_saphyr::from_str::<Config>(&current) {
            Ok(config) => {
                reading.config = Some(config);
                return reading;
            }
            Err(e) => e,
        };
        let outline = Outline::read(&current);
        let found = outline
            .as_ref()
            .zip(position(&err))
            .and_then(|(o, p)| o.find(p));
        if let serde_saphyr::Error::SerdeMissingField { field, .. } = err.without_snippet()
            && was_left_out(&reading.left_out, found.as_ref().map(|f| &f.path), field)
        {
            // The key is missing because its entry was left out, which is reported already.
            return reading;
        }
        reading
            .diagnostics
            .push(describe(&err, outline.as_ref(), reference()));
        let cut = match (&outline, &found) {
            (Some(o), Some(f)) if can_leave_out(&err) => o.cut(f).map(|c| (c, f)),
            _ => None,
        };
        let Some(((start, end, fill), found)) = cut else {
            return reading;
        };
        let path = found.path.clone();
        if reading.left_out.contains(&path) {
            // Cut out once already and still in the way: reading cannot get past it.
            return reading;
        }
        current = blank(&current, start, end, fill);
        if found.siblings == 1 {
            // The entry was its mapping's or list's only one: the holder is empty now, and
            // what validation says of it is about the left-out entry too.
            let holder = &path.0[..path.0.len().saturating_sub(1)];
            reading.left_out.push(KeyPath(holder.to_vec()));
        }
        reading.left_out.push(path);
    }
    reading
}

/// Whether a missing `field`, reported at `at` (the mapping, or an entry in it, where the
/// parser noticed), belongs to an entry that was left out.
fn was_left_out(left_out: &[KeyPath], at: Option<&KeyPath>, field: &str) -> bool {
    left_out.iter().any(|p| {
        let parent = &p.0[..p.0.len().saturating_sub(1)];
        p.last_key() == Some(field) && at.is_none_or(|a| a.0.starts_with(parent))
    })
}

/// Errors of one entry, which the rest of the file can be read without: the entry's type, its
/// value, its key. Anything else (broken YAML, a missing key, a limit) stops reading.
fn can_leave_out(err: &serde_saphyr::Error) -> bool {
    use serde_saphyr::Error as E;
    matches!(
        err.without_snippet(),
        E::Message { .. }
            | E::Unexpected { .. }
            | E::InvalidScalar { .. }
            | E::InvalidBooleanStrict { .. }
            | E::NullIntoString { .. }
            | E::SerdeInvalidType { .. }
            | E::SerdeInvalidValue { .. }
            | E::SerdeInvalidLength { .. }
            | E::SerdeUnknownVariant { .. }
            | E::SerdeUnknownField { .. }
            | E::DuplicateMappingKey { .. }
    )
}

/// The embedded demo with every default filled in, read as an outline: the example a hint
/// shows for a wrong value is the demo's value at the same key path.
fn reference() -> Option<&'static Outline<'static>> {
    static TEXT: OnceLock<Option<String>> = OnceLock::new();
    static OUTLINE: OnceLock<Option<Outline<'static>>> = OnceLock::new();
    OUTLINE
        .get_or_init(|| {
            // Read directly, not through `read`: a problem in the demo must not come back here.
            let text = TEXT.get_or_init(|| {
                let demo: Config = serde_saphyr::from_str(super::DEMO_YAML).ok()?;
                serde_saphyr::to_string(&demo).ok()
            });
            Outline::read(text.as_deref()?)
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: &str =
        "targets:\n  - { name: agg, serving_mode: aggregated, url: \"http://127.0.0.1:8000\" }\n";

    fn messages(extra: &str) -> Vec<String> {
        let r = read(&format!("{TARGET}{extra}"));
        r.diagnostics
            .iter()
            .map(|d| {
                let (line, col) = d.pos.unwrap_or((0, 0));
                let hint = d.hint.as_deref().unwrap_or("");
                format!("{line}:{col}: {} | {hint}", d.message)
            })
            .collect()
    }

    #[test]
    fn a_wrong_type_names_the_key_path_the_type_and_an_example() {
        let m = messages("workloads:\n  concurrency_sweep:\n    levels: [1, 2, \"many\"]\n");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].starts_with(
                "5:20: `workloads.concurrency_sweep.levels[2]` must be a whole number from 0 to \
                 4294967295, not `\"many\"` | e.g. `"
            ),
            "{m:?}"
        );
        let m = messages("workloads:\n  concurrency_sweep:\n    isl: [1]\n");
        assert!(
            m[0].starts_with(
                "5:10: `workloads.concurrency_sweep.isl` must be a whole number, not `[1]` | \
                 e.g. `isl: "
            ),
            "{m:?}"
        );
        let m = messages("export:\n  lifecycle: yes please\n");
        assert_eq!(
            m,
            [
                "4:14: `export.lifecycle` must be `true` or `false`, not `yes please` | e.g. \
              `lifecycle: false`"
            ]
        );
        let m = messages("workloads:\n  multi_turn: 3\n");
        assert!(
            m[0].starts_with("4:15: `workloads.multi_turn` must be a mapping, not `3` | e.g. `"),
            "{m:?}"
        );
    }

    #[test]
    fn every_unreadable_entry_is_listed_and_the_rest_is_read() {
        let r = read(&format!(
            "{TARGET}time_scale: fast\nseed: 7\nworkloads:\n  concurrency_sweep:\n    \
             levels: [1, x]\n    step: 15mins\n    warmup: 5s\n  multi_turn: {{ turns: lots, \
             conversations: 2 }}\nexport: {{ listen: \"127.0.0.1:0\", lifecycle: maybe }}\n"
        ));
        let at: Vec<_> = r.diagnostics.iter().map(|d| d.pos.unwrap()).collect();
        assert_eq!(
            at,
            [(3, 13), (7, 17), (8, 11), (10, 24), (11, 45)],
            "{:?}",
            r.diagnostics
        );
        assert!(
            r.diagnostics[2]
                .message
                .contains("`15mins` is not a duration")
        );
        assert!(
            r.diagnostics[2]
                .hint
                .as_deref()
                .unwrap()
                .contains("`1h30m`")
        );
        let cfg = r.config.expect("the rest reads");
        assert_eq!(cfg.seed, 7);
        let sweep = cfg.workloads.concurrency_sweep.unwrap();
        assert_eq!(
            (sweep.levels.as_slice(), sweep.warmup.as_secs()),
            (&[1][..], 5)
        );
        assert_eq!(*cfg.workloads.multi_turn.unwrap().conversations, 2);
    }

    #[test]
    fn a_repeated_key_is_our_own_message_with_the_first_place() {
        let m = messages("workloads:\n  concurrency_sweep:\n    isl: 5\n    isl: 6\n");
        assert_eq!(
            m,
            [
                "6:5: `workloads.concurrency_sweep.isl` is written twice (first at line 5, column \
              5) | a key holds one value: keep one of the two"
            ]
        );
        assert!(!m[0].contains("DuplicateKeyPolicy"));
    }

    #[test]
    fn a_key_missing_because_its_entry_was_left_out_is_not_reported_again() {
        let r = read("targets:\n  - { name: agg, serving_mode: agregated, url: \"http://x:1\" }\n");
        assert_eq!(r.diagnostics.len(), 1, "{:?}", r.diagnostics);
        assert!(
            r.diagnostics[0]
                .message
                .contains("unknown value `agregated`")
        );
        assert!(r.config.is_none());
    }

    #[test]
    fn a_file_that_is_not_yaml_gets_the_parser_message() {
        let r = read("targets: [\n");
        assert_eq!(r.diagnostics.len(), 1);
        assert!(r.config.is_none());
    }
}
