//! The lexer of the SLO expression language: characters to tokens, each with its character
//! offset, so the parser's errors point at the exact column.

use super::ast::format_duration;

/// A problem in an expression, at a 0-based character offset into its text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("column {}: {message}", .offset + 1)]
pub struct ParseError {
    /// 0-based character (not byte) offset of the offending token.
    pub offset: usize,
    pub message: String,
}

pub(super) const FUNCTIONS: [&str; 8] = [
    "p50", "mean", "count", "rate", "r2", "slope", "baseline", "goodput",
];

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Number(f64),
    Duration(f64),
    Str(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    Comma,
    Plus,
    Minus,
    Star,
    Slash,
    Lt,
    Le,
    Gt,
    Ge,
    EqEq,
    Ne,
    Eq,
    Re,
    NotRe,
    Eof,
}

impl Tok {
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Number(n) => format!("number `{n}`"),
            Tok::Duration(d) => format!("duration `{}`", format_duration(*d)),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Eof => "the end of the expression".into(),
            other => format!("`{}`", other.symbol()),
        }
    }

    pub(super) fn symbol(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::EqEq => "==",
            Tok::Ne => "!=",
            Tok::Eq => "=",
            Tok::Re => "=~",
            Tok::NotRe => "!~",
            _ => "",
        }
    }
}

pub(super) fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError {
        offset,
        message: message.into(),
    })
}

/// `expected WHAT, found TOKEN` at `offset`.
pub(super) fn expected<T>(offset: usize, what: &str, found: &Tok) -> Result<T, ParseError> {
    err(
        offset,
        format!("expected {what}, found {}", found.describe()),
    )
}

/// Splits `text` into tokens with their character offsets.
pub(super) fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let (tok, end) = if c.is_ascii_alphabetic() || c == '_' {
            word(&chars, start)
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            number(&chars, start)?
        } else if c == '"' || c == '\'' {
            string(&chars, start)?
        } else {
            symbol(&chars, start)?
        };
        i = end;
        out.push((tok, start));
    }
    out.push((Tok::Eof, chars.len()));
    Ok(out)
}

/// The identifier at `start` and the offset after it.
fn word(chars: &[char], start: usize) -> (Tok, usize) {
    let mut i = start;
    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
        i += 1;
    }
    // `p99.9`: a quantile name may carry one decimal part.
    let word: String = chars[start..i].iter().collect();
    if is_quantile_word(&word)
        && chars.get(i) == Some(&'.')
        && chars.get(i + 1).is_some_and(char::is_ascii_digit)
    {
        i += 1;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
    }
    (Tok::Ident(chars[start..i].iter().collect()), i)
}

/// The number at `start`, a duration when a unit follows it, and the offset after it.
fn number(chars: &[char], start: usize) -> Result<(Tok, usize), ParseError> {
    let mut i = start;
    while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
        i += 1;
    }
    if matches!(chars.get(i), Some('e' | 'E'))
        && (chars.get(i + 1).is_some_and(char::is_ascii_digit)
            || (matches!(chars.get(i + 1), Some('+' | '-'))
                && chars.get(i + 2).is_some_and(char::is_ascii_digit)))
    {
        i += 2;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
    }
    let literal: String = chars[start..i].iter().collect();
    let Ok(n) = literal.parse::<f64>() else {
        return err(start, format!("`{literal}` is not a number"));
    };
    let unit_start = i;
    while i < chars.len() && chars[i].is_ascii_alphabetic() {
        i += 1;
    }
    let unit: String = chars[unit_start..i].iter().collect();
    let tok = match unit.as_str() {
        "" => Tok::Number(n),
        "ms" => Tok::Duration(n / 1000.0),
        "s" => Tok::Duration(n),
        "m" => Tok::Duration(n * 60.0),
        "h" => Tok::Duration(n * 3600.0),
        "d" => Tok::Duration(n * 86_400.0),
        "w" => Tok::Duration(n * 604_800.0),
        other => {
            return err(
                unit_start,
                format!("unknown duration unit `{other}`; use ms, s, m, h, d or w"),
            );
        }
    };
    Ok((tok, i))
}

/// The string quoted by the character at `start` (`"` or `'`), unescaped, and the offset after
/// its closing quote.
fn string(chars: &[char], start: usize) -> Result<(Tok, usize), ParseError> {
    let quote = chars[start];
    let mut i = start + 1;
    let mut s = String::new();
    loop {
        match chars.get(i) {
            None => return err(start, "string is not closed"),
            Some(&q) if q == quote => {
                i += 1;
                break;
            }
            Some('\\') => {
                let escaped = match chars.get(i + 1) {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('\\') => '\\',
                    Some('"') => '"',
                    Some('\'') => '\'',
                    _ => {
                        return err(i, "unknown escape; use \\\\, \\\", \\', \\n or \\t");
                    }
                };
                s.push(escaped);
                i += 2;
            }
            Some(&other) => {
                s.push(other);
                i += 1;
            }
        }
    }
    Ok((Tok::Str(s), i))
}

/// The operator or punctuation at `start` (two characters before one) and the offset after it.
fn symbol(chars: &[char], start: usize) -> Result<(Tok, usize), ParseError> {
    let c = chars[start];
    let two = |a: char, b: char| c == a && chars.get(start + 1) == Some(&b);
    let (tok, len) = if two('<', '=') {
        (Tok::Le, 2)
    } else if two('>', '=') {
        (Tok::Ge, 2)
    } else if two('=', '=') {
        (Tok::EqEq, 2)
    } else if two('!', '=') {
        (Tok::Ne, 2)
    } else if two('=', '~') {
        (Tok::Re, 2)
    } else if two('!', '~') {
        (Tok::NotRe, 2)
    } else {
        let t = match c {
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            '{' => Tok::LBrace,
            '}' => Tok::RBrace,
            ',' => Tok::Comma,
            '+' => Tok::Plus,
            '-' => Tok::Minus,
            '*' => Tok::Star,
            '/' => Tok::Slash,
            '<' => Tok::Lt,
            '>' => Tok::Gt,
            '=' => Tok::Eq,
            other => return err(start, format!("unexpected character `{other}`")),
        };
        (t, 1)
    };
    Ok((tok, start + len))
}

fn is_quantile_word(word: &str) -> bool {
    word.len() > 1 && word.starts_with('p') && word[1..].bytes().all(|b| b.is_ascii_digit())
}
