//! The YAML document as a tree of positioned nodes, read apart from the typed config so that a
//! parse error can be explained: the key path at an error's line and column, where a key was
//! first written when it is written twice, and where an entry starts and ends so that reading can
//! leave it out and go on.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

/// One node: a scalar (its text is in the source, at its span), a sequence or a mapping.
#[derive(Debug)]
pub(super) enum Node {
    Scalar,
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<Node>, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

macro_rules! scalar {
    ($($name:ident: $ty:ty),*) => {$(
        fn $name<E: de::Error>(self, _: $ty) -> Result<Node, E> {
            Ok(Node::Scalar)
        }
    )*};
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    scalar!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
            visit_u128: u128, visit_f64: f64, visit_str: &str);

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key()? {
            entries.push((key, map.next_value()?));
        }
        Ok(Node::Map(entries))
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seg {
    Key(String),
    Index(usize),
}

/// A key path as messages write it: `workloads.concurrency_sweep.levels[2]`, `targets[0].url`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct KeyPath(pub(super) Vec<Seg>);

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

impl KeyPath {
    /// The last key of the path (`levels` for `…levels[2]`), if any.
    pub(super) fn last_key(&self) -> Option<&str> {
        self.0.iter().rev().find_map(|s| match s {
            Seg::Key(k) => Some(k.as_str()),
            Seg::Index(_) => None,
        })
    }

    /// Whether the path ends in a list index.
    pub(super) fn is_element(&self) -> bool {
        matches!(self.0.last(), Some(Seg::Index(_)))
    }

    /// The keys alone, dotted, as validation messages name them (`targets.url`).
    pub(super) fn keys(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter_map(|s| match s {
                Seg::Key(k) => Some(k.as_str()),
                Seg::Index(_) => None,
            })
            .collect()
    }
}

/// What is at a position: the node's path, whether the position is its key, and the entry's
/// extent in the source (character offsets, end exclusive).
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub(super) path: KeyPath,
    /// The position is the key of a mapping entry (an unknown or repeated key).
    pub(super) at_key: bool,
    /// Where the entry starts: its key, or the element itself in a sequence.
    pub(super) start: usize,
    /// Where the entry's value ends.
    pub(super) end: usize,
    /// Entries in the mapping or sequence that holds it.
    pub(super) siblings: usize,
    /// The container that holds it is written in flow style (`{…}`, `[…]`).
    pub(super) in_flow: bool,
    /// The holder is a mapping (else a sequence).
    pub(super) in_map: bool,
    /// For a key: where an earlier equal key of the same mapping is, if one is.
    pub(super) first_same_key: Option<(u64, u64)>,
}

/// What a document is at its top (a config is a mapping); places are 1-based lines and columns.
#[derive(Debug)]
pub(super) enum Top<'a> {
    /// No value: only comments, or `~`.
    Nothing,
    /// A value alone (`hello`), as written.
    Value {
        written: &'a str,
        place: (u64, u64),
    },
    List {
        place: (u64, u64),
    },
    Mapping(Vec<TopKey<'a>>),
}

/// A key of the top mapping.
#[derive(Debug)]
pub(super) struct TopKey<'a> {
    /// As written (a quoted key with its quotes).
    pub(super) key: &'a str,
    pub(super) place: (u64, u64),
    /// Its value as written, when that is a single value.
    pub(super) value: Option<&'a str>,
}

/// The document read as [`Node`]s, with its source.
pub(super) struct Outline<'a> {
    text: &'a str,
    /// Character offset → byte offset, for slicing `text` by the parser's character spans.
    chars: Vec<usize>,
    root: Spanned<Node>,
}

impl<'a> Outline<'a> {
    /// Reads `text` as plain YAML; `None` when it is not YAML at all (then only the parser's own
    /// message can be given). Repeated keys are kept, so they can be pointed at.
    pub(super) fn read(text: &'a str) -> Option<Outline<'a>> {
        let options = serde_saphyr::options! {
            duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        };
        let root = serde_saphyr::from_str_with_options::<Spanned<Node>>(text, options).ok()?;
        let mut chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        chars.push(text.len());
        Some(Outline { text, chars, root })
    }

    /// What the document is at its top.
    pub(super) fn top(&self) -> Top<'a> {
        let place = at(self.root.referenced);
        match &self.root.value {
            Node::Scalar => match self.source(self.root.referenced).trim() {
                "" | "~" | "null" | "Null" | "NULL" => Top::Nothing,
                written => Top::Value { written, place },
            },
            Node::Seq(_) => Top::List { place },
            Node::Map(entries) => Top::Mapping(
                entries
                    .iter()
                    .map(|(k, v)| TopKey {
                        key: self.source(k.referenced),
                        place: at(k.referenced),
                        value: matches!(v.value, Node::Scalar).then(|| self.source(v.referenced)),
                    })
                    .collect(),
            ),
        }
    }

    /// The source text of the node at `loc` (a scalar as written, quotes included).
    pub(super) fn source(&self, loc: Location) -> &'a str {
        let (start, len) = (loc.span().offset() as usize, loc.span().len() as usize);
        self.slice(start, start + len)
    }

    /// The source between two character offsets.
    pub(super) fn slice(&self, start: usize, end: usize) -> &'a str {
        let at = |i: usize| self.chars[i.min(self.chars.len() - 1)];
        &self.text[at(start)..at(end.max(start))]
    }

    /// The character at character offset `i`.
    fn char_at(&self, i: usize) -> Option<char> {
        self.slice(i, i + 1).chars().next()
    }

    /// The node or key written at `pos` (1-based line and column).
    pub(super) fn find(&self, pos: (u64, u64)) -> Option<Found> {
        let mut path = Vec::new();
        self.find_in(&self.root, pos, &mut path)
    }

    fn find_in(&self, node: &Spanned<Node>, pos: (u64, u64), path: &mut Vec<Seg>) -> Option<Found> {
        let flow = self.is_flow(node);
        match &node.value {
            Node::Scalar => None,
            Node::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(Seg::Index(i));
                    // Deeper first: a block mapping in a list starts where its first key does.
                    if let Some(found) = self.find_in(item, pos, path) {
                        return Some(found);
                    }
                    if at(item.referenced) == pos {
                        let start = self.element_start(item.referenced, flow);
                        return Some(Found {
                            path: KeyPath(path.clone()),
                            at_key: false,
                            start,
                            end: self.end(item),
                            siblings: items.len(),
                            in_flow: flow,
                            in_map: false,
                            first_same_key: None,
                        });
                    }
                    path.pop();
                }
                None
            }
            Node::Map(entries) => {
                for (i, (key, value)) in entries.iter().enumerate() {
                    path.push(Seg::Key(self.source(key.referenced).to_owned()));
                    let at_key = at(key.referenced) == pos;
                    if !at_key && let Some(found) = self.find_in(value, pos, path) {
                        return Some(found);
                    }
                    if at_key || at(value.referenced) == pos {
                        let name = self.source(key.referenced);
                        let first_same_key = entries[..i]
                            .iter()
                            .find(|(k, _)| self.source(k.referenced) == name)
                            .map(|(k, _)| at(k.referenced));
                        return Some(Found {
                            path: KeyPath(path.clone()),
                            at_key,
                            start: key.referenced.span().offset() as usize,
                            end: self.end(value).max(self.end(key)),
                            siblings: entries.len(),
                            in_flow: flow,
                            in_map: true,
                            first_same_key,
                        });
                    }
                    path.pop();
                }
                None
            }
        }
    }

    /// Whether a container is written in flow style: its span starts at its bracket.
    fn is_flow(&self, node: &Spanned<Node>) -> bool {
        let start = node.referenced.span().offset() as usize;
        matches!(self.char_at(start), Some('[' | '{'))
    }

    /// Where a sequence element starts: its `- ` in block style, itself in flow style.
    fn element_start(&self, loc: Location, flow: bool) -> usize {
        let start = loc.span().offset() as usize;
        if flow {
            return start;
        }
        let mut i = start;
        while i > 0 && self.char_at(i - 1) == Some(' ') {
            i -= 1;
        }
        if i > 0 && self.char_at(i - 1) == Some('-') {
            i - 1
        } else {
            start
        }
    }

    /// The character offset just past a node: a scalar's span; a block container's last
    /// descendant; a flow container's closing bracket.
    pub(super) fn end(&self, node: &Spanned<Node>) -> usize {
        let span = node.referenced.span();
        let own = (span.offset() + span.len()) as usize;
        let children = match &node.value {
            Node::Scalar => return own,
            Node::Seq(items) => items.iter().map(|n| self.end(n)).max(),
            Node::Map(entries) => entries
                .iter()
                .map(|(k, v)| self.end(k).max(self.end(v)))
                .max(),
        };
        let last = children.unwrap_or(own).max(own);
        if !self.is_flow(node) {
            return last;
        }
        // Past the children: blanks, commas and comments, then this container's bracket.
        let mut i = last;
        while let Some(c) = self.char_at(i) {
            match c {
                ']' | '}' => return i + 1,
                '#' => {
                    while self.char_at(i).is_some_and(|c| c != '\n') {
                        i += 1;
                    }
                }
                _ => i += 1,
            }
        }
        i
    }

    /// The extent to blank so that the entry of `found` is left out and the rest still reads
    /// the same: the entry, the comma that separated it in a flow collection, and for a block
    /// collection's only entry an empty `{}` or `[]` in its place. `None` when the entry
    /// cannot be cut out cleanly.
    pub(super) fn cut(&self, found: &Found) -> Option<(usize, usize, &'static str)> {
        let (mut start, mut end) = (found.start, found.end);
        if end <= start {
            return None;
        }
        if found.in_flow {
            let mut after = end;
            while self.char_at(after) == Some(' ') {
                after += 1;
            }
            if self.char_at(after) == Some(',') {
                end = after + 1;
            } else {
                let mut before = start;
                while before > 0 && self.char_at(before - 1) == Some(' ') {
                    before -= 1;
                }
                if before > 0 && self.char_at(before - 1) == Some(',') {
                    start = before - 1;
                }
            }
            return Some((start, end, ""));
        }
        let empty = match (found.siblings, found.in_map) {
            (1, true) => "{}",
            (1, false) => "[]",
            _ => "",
        };
        Some((start, end, empty))
    }
}

/// A value of a reference document, to show as an example.
#[derive(Debug, Clone)]
pub(super) struct Example {
    /// The value on one line, in flow style (`[1, 2, 4]`, `30s`).
    pub(super) value: String,
}

impl Example {
    /// As a hint writes it for `path`: the value alone for a list element, else `key: value`.
    pub(super) fn shown(&self, path: &KeyPath) -> String {
        match path.last_key() {
            Some(key) if !path.is_element() => format!("{key}: {}", self.value),
            _ => self.value.clone(),
        }
    }
}

/// The longest example or quoted value a message shows; longer ones end in `…`.
const SHOWN_CHARS: usize = 48;

/// `text` on one line (runs of blanks and line breaks made one space), cut at [`SHOWN_CHARS`].
pub(super) fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= SHOWN_CHARS {
        joined
    } else {
        let cut: String = joined.chars().take(SHOWN_CHARS - 1).collect();
        format!("{cut}…")
    }
}

impl Outline<'_> {
    /// What was written at `loc`, on one line and cut short: a scalar as written, a container
    /// up to its end.
    pub(super) fn written(&self, loc: Location) -> String {
        let start = loc.span().offset() as usize;
        let end = self
            .find((loc.line(), loc.column()))
            .filter(|f| !f.at_key)
            .map_or(start + loc.span().len() as usize, |f| f.end);
        one_line(self.slice(start, end))
    }

    /// The value of this (reference) document at `path`, a list index beyond its list read as
    /// its first element; `None` where it has none or the value is too long to show.
    pub(super) fn example(&self, path: &KeyPath) -> Option<Example> {
        let mut node = &self.root;
        for seg in &path.0 {
            node = match (&node.value, seg) {
                (Node::Map(entries), Seg::Key(k)) => {
                    &entries
                        .iter()
                        .find(|(key, _)| self.source(key.referenced) == k)?
                        .1
                }
                (Node::Seq(items), Seg::Index(i)) => items.get(*i).or(items.first())?,
                _ => return None,
            };
        }
        let value = self.flow(node);
        (value.chars().count() <= SHOWN_CHARS).then_some(Example { value })
    }

    /// A node in flow style on one line; a list or mapping too long to show keeps its first
    /// items and ends in `…`.
    fn flow(&self, node: &Spanned<Node>) -> String {
        let (items, open, close): (Vec<String>, _, _) = match &node.value {
            Node::Scalar => return one_line(self.source(node.referenced)),
            Node::Seq(items) => (items.iter().map(|n| self.flow(n)).collect(), "[", "]"),
            Node::Map(entries) => (
                entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", self.source(k.referenced), self.flow(v)))
                    .collect(),
                "{ ",
                " }",
            ),
        };
        let mut shown: Vec<&str> = Vec::new();
        let room = SHOWN_CHARS - open.len() - close.len() - ", …".len();
        for item in &items {
            let used: usize = shown.iter().map(|s| s.chars().count() + 2).sum();
            if used + item.chars().count() > room {
                break;
            }
            shown.push(item);
        }
        match shown.len() {
            n if n == items.len() => format!("{open}{}{close}", items.join(", ")),
            0 => format!("{open}…{close}"),
            _ => format!("{open}{}, …{close}", shown.join(", ")),
        }
    }
}

fn at(loc: Location) -> (u64, u64) {
    (loc.line(), loc.column())
}

/// `text` with the characters from `start` to `end` (character offsets) turned into spaces, line
/// breaks kept, and `fill` written at `start`: every other line and column stays where it was.
pub(super) fn blank(text: &str, start: usize, end: usize, fill: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fill = fill.chars();
    for (i, c) in text.chars().enumerate() {
        if i < start || i >= end || c == '\n' {
            out.push(c);
        } else {
            out.push(fill.next().unwrap_or(' '));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "targets:\n  - { name: agg, url: \"http://x:1\" }\nworkloads:\n  \
                       concurrency_sweep:\n    levels: [1, 2, \"many\"]\n    step: 2m\n";

    #[test]
    fn a_position_names_its_key_path() {
        let o = Outline::read(DOC).unwrap();
        let f = o.find((5, 20)).unwrap();
        assert_eq!(f.path.to_string(), "workloads.concurrency_sweep.levels[2]");
        assert!(f.in_flow && !f.in_map && !f.at_key);
        assert_eq!(o.slice(f.start, f.end), "\"many\"");
        let url = o.find((2, 23)).unwrap();
        assert_eq!(url.path.to_string(), "targets[0].url");
        let step = o.find((6, 5)).unwrap();
        assert!(step.at_key);
        assert_eq!(o.slice(step.start, step.end), "step: 2m");
        assert!(o.find((1, 2)).is_none());
    }

    #[test]
    fn a_repeated_key_points_at_the_first() {
        let o = Outline::read("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap();
        let f = o.find((4, 3)).unwrap();
        assert_eq!(f.path.to_string(), "b.c");
        assert_eq!(f.first_same_key, Some((3, 3)));
    }

    #[test]
    fn an_entry_cut_out_leaves_the_rest_in_place() {
        let o = Outline::read(DOC).unwrap();
        let f = o.find((5, 20)).unwrap();
        let (s, e, fill) = o.cut(&f).unwrap();
        let cut = blank(DOC, s, e, fill);
        assert!(cut.contains("levels: [1, 2        ]"), "{cut}");
        // A block mapping's only entry, with a flow value over two lines.
        let doc = "w:\n  sweep:\n    levels: [1,\n      2]\nx: 1\n";
        let o = Outline::read(doc).unwrap();
        let f = o.find((3, 5)).unwrap();
        let (s, e, fill) = o.cut(&f).unwrap();
        let cut = blank(doc, s, e, fill);
        assert_eq!(cut, "w:\n  sweep:\n    {}         \n        \nx: 1\n");
        assert!(Outline::read(&cut).is_some());
    }
}
