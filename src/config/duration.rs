//! The one duration grammar of the config file, the simulator flags and the HTTP API: a number
//! and a unit, several such terms from the largest unit down (`500ms`, `30s`, `5m`, `2h`, `1d`,
//! `1h30m`, `2.5ms`); anything else (`120 seconds`, `15mins`, `5`) is refused with the accepted
//! forms, never read as whatever a lenient parser guesses.

use std::time::Duration;

use thiserror::Error;

/// The units, largest first, with their length in nanoseconds. `us` and `µs` are the same unit.
const UNITS: [(&str, u128); 7] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("µs", 1_000),
];

/// What every duration message ends with: the grammar in one line.
pub const FORMS: &str = "a number and a unit — ms, s, m, h or d (us for microseconds) — such as \
                         `500ms`, `30s`, `5m`, `2h`, `1d`, several from the largest down \
                         (`1h30m`), or `0`";

/// What joins a duration error to [`FORMS`] in a deserializer's message, so that the config's
/// diagnostics can show the forms as the hint.
pub const FORMS_SEPARATOR: &str = "; write ";

/// Why a text is not a duration of the grammar.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    #[error("`{text}` is not a duration: it is empty")]
    Empty { text: String },
    #[error("`{text}` is not a duration: `{term}` has no unit")]
    NoUnit { text: String, term: String },
    #[error("`{text}` is not a duration: write the unit right after its number (`{term}{unit}`)")]
    Spaced {
        text: String,
        term: String,
        unit: String,
    },
    #[error("`{text}` is not a duration: `{term}` is not a number")]
    Number { text: String, term: String },
    #[error("`{text}` is not a duration: a duration is never negative")]
    Negative { text: String },
    #[error("`{text}` is not a duration: `{unit}` is not a unit")]
    Unit { text: String, unit: String },
    #[error("`{text}` is not a duration: a unit needs a number before it")]
    NoNumber { text: String },
    #[error("`{text}` is not a duration: `{unit}` comes after a smaller or equal unit")]
    Order { text: String, unit: String },
    #[error("`{text}` is not a duration: it is longer than this program can count")]
    TooLong { text: String },
}

impl DurationError {
    /// The message followed by the accepted forms, as config diagnostics and flags print it.
    pub fn with_forms(&self) -> String {
        format!("{self}{FORMS_SEPARATOR}{FORMS}")
    }
}

/// Reads `text` (surrounding whitespace ignored) by the grammar of this module.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty { text: text.into() });
    }
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = t;
    let mut nanos: u128 = 0;
    // The index in UNITS of the last unit read: each next one must be smaller.
    let mut last: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() {
            return Err(if after.starts_with('-') {
                DurationError::Negative { text: text.into() }
            } else if after.starts_with(|c: char| c.is_alphabetic()) {
                DurationError::NoNumber { text: text.into() }
            } else {
                DurationError::Unit {
                    text: text.into(),
                    unit: after.chars().take_while(|c| !c.is_ascii_digit()).collect(),
                }
            });
        }
        let unit_len = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            // `120 s` or `120 seconds`: name the word if it is no unit at all.
            let word: String = after
                .trim_start_matches(' ')
                .chars()
                .take_while(|c| c.is_alphabetic())
                .collect();
            return Err(if word.is_empty() {
                DurationError::NoUnit {
                    text: text.into(),
                    term: number.into(),
                }
            } else if UNITS.iter().any(|(u, _)| *u == word) {
                DurationError::Spaced {
                    text: text.into(),
                    term: number.into(),
                    unit: word,
                }
            } else {
                DurationError::Unit {
                    text: text.into(),
                    unit: word,
                }
            });
        }
        let Some(index) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(DurationError::Unit {
                text: text.into(),
                unit: unit.into(),
            });
        };
        // `us` and `µs` share one rank.
        let rank = index.min(5);
        if last.is_some_and(|l| rank <= l) {
            return Err(DurationError::Order {
                text: text.into(),
                unit: unit.into(),
            });
        }
        last = Some(rank);
        let term = term_nanos(number, UNITS[index].1).ok_or_else(|| DurationError::Number {
            text: text.into(),
            term: number.into(),
        })?;
        nanos = nanos
            .checked_add(term)
            .ok_or_else(|| DurationError::TooLong { text: text.into() })?;
        // Terms may be written together (`1h30m`) or one space apart (`1h 30m`).
        rest = after.strip_prefix(' ').unwrap_or(after);
        if rest.starts_with(' ') {
            return Err(DurationError::Unit {
                text: text.into(),
                unit: " ".into(),
            });
        }
    }
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| DurationError::TooLong { text: text.into() })?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// `number` (digits, at most one `.`) times `unit` nanoseconds, exactly: decimal digits beyond a
/// nanosecond are dropped. `None` for a malformed number (`1.2.3`, `.`).
fn term_nanos(number: &str, unit: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(unit)?;
    let mut scale = unit;
    for digit in fraction.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        nanos = nanos.checked_add(u128::from(digit - b'0') * scale)?;
    }
    Some(nanos)
}

/// `d` in the grammar, terms one space apart from the largest unit down (`1h 30m`, `2s 500ms`,
/// `0s`); [`parse`] reads it back to the same duration.
pub fn format(d: Duration) -> String {
    let mut nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let mut terms = Vec::new();
    for (unit, size) in UNITS.iter().take(6) {
        let n = nanos / size;
        nanos %= size;
        if *unit == "us" && nanos > 0 {
            // Below a microsecond: the last term carries the rest as decimals.
            terms.push(format!("{}us", trim_decimal(n, nanos, 3)));
            nanos = 0;
        } else if n > 0 {
            terms.push(format!("{n}{unit}"));
        }
    }
    terms.join(" ")
}

/// `whole.fraction` with `digits` fraction digits, trailing zeros dropped.
fn trim_decimal(whole: u128, fraction: u128, digits: usize) -> String {
    let f = format!("{fraction:0digits$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_reads_each_unit_and_combinations_from_the_largest_down() {
        let cases: [(&str, Duration); 12] = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("2h", Duration::from_secs(7200)),
            ("1d", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5400)),
            ("1h 3m 40s", Duration::from_secs(3820)),
            ("2.5ms", Duration::from_micros(2500)),
            ("250us", Duration::from_micros(250)),
            (" 0.1s ", Duration::from_millis(100)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        assert_eq!(parse("250µs"), Ok(Duration::from_micros(250)));
    }

    #[test]
    fn spellings_outside_the_grammar_are_refused_with_the_reason() {
        for (text, reason) in [
            ("120 seconds", "`seconds` is not a unit"),
            ("15mins", "`mins` is not a unit"),
            ("5", "`5` has no unit"),
            ("120", "`120` has no unit"),
            ("ten seconds", "a unit needs a number before it"),
            ("30m1h", "`h` comes after a smaller or equal unit"),
            ("5s5s", "`s` comes after a smaller or equal unit"),
            ("-5s", "never negative"),
            ("1.2.3s", "`1.2.3` is not a number"),
            ("120 s", "write the unit right after its number (`120s`)"),
            ("1h  30m", "` ` is not a unit"),
            ("", "it is empty"),
            (
                "99999999999999999999d",
                "longer than this program can count",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.to_string().contains(reason), "{text}: {err}");
            assert!(err.with_forms().contains("`1h30m`"), "{text}");
        }
    }

    #[test]
    fn what_format_writes_parses_back_to_the_same_duration() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(2500),
            Duration::from_millis(1500),
            Duration::from_secs(3820),
            Duration::from_secs(86_400 + 61),
            Duration::new(7, 123_456_789),
        ] {
            assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
        }
        assert_eq!(format(Duration::from_secs(3820)), "1h 3m 40s");
        assert_eq!(format(Duration::from_micros(2500)), "2ms 500us");
        assert_eq!(format(Duration::new(0, 1_500)), "1.5us");
        assert_eq!(format(Duration::from_secs(90_000)), "1d 1h");
    }
}
