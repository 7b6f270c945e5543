//! `At<T>`: a config value together with where it was written, so validation can point at it.

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_saphyr::{Location, Spanned};

/// A value and the position (1-based line and column) it came from; defaults have no position.
#[derive(Clone, PartialEq)]
pub struct At<T> {
    pub value: T,
    pub pos: Option<(u64, u64)>,
}

impl<T> At<T> {
    /// A value that was not written in the file (a default).
    pub const fn dflt(value: T) -> Self {
        At { value, pos: None }
    }
}

impl At<String> {
    /// Where character `offset` of this scalar's value is in the file: the value's own position
    /// plus the offset on a single line. A value with line breaks is a block scalar (`|` or `>`
    /// with more-indented lines), whose content starts at `pos` on its own line: each kept line
    /// break is one line down, at the block's indentation. (Lines a `>` scalar folded into spaces
    /// cannot be told from spaces, so messages also name the column inside the value.)
    pub fn position_of_char(&self, offset: usize) -> Option<(u64, u64)> {
        let (line, col) = self.pos?;
        let before: Vec<char> = self.value.chars().take(offset).collect();
        let breaks = before.iter().filter(|c| **c == '\n').count() as u64;
        let since_break = before.iter().rev().take_while(|c| **c != '\n').count() as u64;
        Some((line + breaks, col + since_break))
    }
}

impl<T> Deref for At<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Default> Default for At<T> {
    fn default() -> Self {
        At::dflt(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for At<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: fmt::Display> fmt::Display for At<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

fn position(loc: Location) -> Option<(u64, u64)> {
    (loc != Location::UNKNOWN).then(|| (loc.line(), loc.column()))
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Spanned::<T>::deserialize(d)?;
        Ok(At {
            value: s.value,
            pos: position(s.referenced),
        })
    }
}

impl<T: Serialize> Serialize for At<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

/// A duration written as text in the grammar of [`super::duration`]: `500ms`, `30s`, `5m`,
/// `2h`, `1d`, `1h30m`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn secs(s: u64) -> Self {
        Dur(Duration::from_secs(s))
    }
    pub const fn millis(ms: u64) -> Self {
        Dur(Duration::from_millis(ms))
    }
}

impl Deref for Dur {
    type Target = Duration;
    fn deref(&self) -> &Duration {
        &self.0
    }
}

impl fmt::Debug for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// In the grammar it is read by, so a printed value (`check --output yaml`, a message) can be
/// pasted back into a config.
impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&super::duration::format(self.0))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        super::duration::parse(&text)
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(e.with_forms()))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}
