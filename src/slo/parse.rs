//! The SLO expression parser: a recursive-descent parser over the tokens of [`super::lex`] that
//! checks types and names as it goes, so every error carries the exact column where the
//! expression went wrong.

use crate::config::did_you_mean;

use super::ast::*;

pub use super::lex::ParseError;
use super::lex::{FUNCTIONS, Tok, err, expected, lex};

/// A parsed sub-expression: a number-valued one or a condition.
enum Node {
    V(Value),
    C(Cond),
}

/// How deep parentheses, unary minus and function arguments may nest. Far above any real SLO,
/// and low enough that parsing, evaluating and dropping the tree cannot exhaust the stack (a
/// fuzzed expression of a thousand `(` and `-` did before this limit).
const MAX_NESTING: usize = 64;

struct Parser {
    toks: Vec<(Tok, usize)>,
    i: usize,
    /// Current nesting depth (see [`MAX_NESTING`]).
    depth: usize,
}

/// Parses an SLO expression: a condition such as `p50(ttft{...}) <= 0.8 * p50(ttft{...})`.
pub fn parse_condition(text: &str) -> Result<Cond, ParseError> {
    let mut p = Parser {
        toks: lex(text)?,
        i: 0,
        depth: 0,
    };
    if p.peek() == &Tok::Eof {
        return err(0, "the expression is empty");
    }
    let start = p.offset();
    let node = p.or()?;
    p.expect_eof()?;
    match node {
        Node::C(c) => {
            let mut cmps = Vec::new();
            c.comparisons(&mut cmps);
            if !cmps
                .iter()
                .any(|(_, a, b)| a.reads_data() || b.reads_data())
            {
                return err(
                    start,
                    "the expression reads no measurement, so it can never change",
                );
            }
            Ok(c)
        }
        Node::V(_) => err(
            start,
            "an SLO must be a comparison, e.g. `p50(ttft{...}) <= 2s`; this is only a value",
        ),
    }
}

/// Parses a burn-rate SLI: `ttft{...} < 2s` (or `<=`): a request is good when its value is at
/// most the threshold. Returns the selector and the threshold in seconds.
pub fn parse_sli(text: &str) -> Result<(Selector, f64), ParseError> {
    let mut p = Parser {
        toks: lex(text)?,
        i: 0,
        depth: 0,
    };
    if p.peek() == &Tok::Eof {
        return err(0, "the SLI is empty");
    }
    let at = p.offset();
    let Tok::Ident(name) = p.peek().clone() else {
        return err(
            at,
            "an SLI starts with a latency selector, e.g. `ttft{workload=\"concurrency_sweep\"} < 2s`",
        );
    };
    p.i += 1;
    let sel = p.selector_rest(&name, at)?;
    if sel.measure.histogram_family().is_none() {
        return err(
            at,
            format!(
                "`{}` has no Prometheus histogram; a burn-rate SLI uses ttft, itl or latency",
                sel.measure.name()
            ),
        );
    }
    let op_at = p.offset();
    match p.next() {
        Tok::Lt | Tok::Le => {}
        other => {
            return expected(op_at, "`<` or `<=` and a duration", &other);
        }
    }
    let d_at = p.offset();
    let seconds = match p.next() {
        Tok::Duration(d) if d > 0.0 && d.is_finite() => d,
        other => {
            return expected(d_at, "a positive duration such as `2s`", &other);
        }
    };
    check_bucket_threshold(seconds, d_at)?;
    p.expect_eof()?;
    Ok((sel, seconds))
}

/// Latency thresholds become histogram bucket bounds, written as `le` labels; keep them in the
/// range where the exposition and the generated rules print a bound the same way.
fn check_bucket_threshold(seconds: f64, at: usize) -> Result<(), ParseError> {
    if !(1e-4..=1e5).contains(&seconds) {
        return err(
            at,
            "a latency threshold must be between 100µs and about a day (it becomes a histogram bucket bound)",
        );
    }
    Ok(())
}

impl Parser {
    /// Runs `f` one nesting level deeper, or fails past [`MAX_NESTING`].
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        if self.depth >= MAX_NESTING {
            return err(
                self.offset(),
                format!("the expression nests deeper than {MAX_NESTING} levels"),
            );
        }
        self.depth += 1;
        let result = f(self);
        self.depth -= 1;
        result
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.i].0
    }

    fn offset(&self) -> usize {
        self.toks[self.i].1
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.i].0.clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Ident(w) if w == word)
    }

    fn expect(&mut self, tok: Tok, context: &str) -> Result<(), ParseError> {
        let at = self.offset();
        let found = self.next();
        if found == tok {
            Ok(())
        } else {
            err(
                at,
                format!(
                    "expected `{}` {context}, found {}",
                    tok.symbol(),
                    found.describe()
                ),
            )
        }
    }

    fn expect_eof(&mut self) -> Result<(), ParseError> {
        let at = self.offset();
        match self.peek() {
            Tok::Eof => Ok(()),
            Tok::Eq => err(at, "`=` compares labels only; compare values with `==`"),
            other => err(
                at,
                format!(
                    "unexpected {} after a complete expression",
                    other.describe()
                ),
            ),
        }
    }

    fn cond(&self, node: Node, at: usize, word: &str) -> Result<Cond, ParseError> {
        match node {
            Node::C(c) => Ok(c),
            Node::V(_) => err(
                at,
                format!("`{word}` joins comparisons; this side is a value, not a comparison"),
            ),
        }
    }

    fn value(&self, node: Node, at: usize, what: &str) -> Result<Value, ParseError> {
        match node {
            Node::V(v) => Ok(v),
            Node::C(_) => err(at, format!("{what} needs a value, not a comparison")),
        }
    }

    fn or(&mut self) -> Result<Node, ParseError> {
        self.logic_level("or", Cond::Or, Self::and)
    }

    fn and(&mut self) -> Result<Node, ParseError> {
        self.logic_level("and", Cond::And, Self::cmp)
    }

    /// One left-associative level of `and`/`or`: `next (word next)*`, both sides conditions.
    fn logic_level(
        &mut self,
        word: &str,
        join: fn(Box<Cond>, Box<Cond>) -> Cond,
        next: fn(&mut Self) -> Result<Node, ParseError>,
    ) -> Result<Node, ParseError> {
        let at = self.offset();
        let mut left = next(self)?;
        while self.is_word(word) {
            self.next();
            let rat = self.offset();
            let right = next(self)?;
            let l = self.cond(left, at, word)?;
            let r = self.cond(right, rat, word)?;
            left = Node::C(join(Box::new(l), Box::new(r)));
        }
        Ok(left)
    }

    fn cmp_op(&self) -> Option<CmpOp> {
        Some(match self.peek() {
            Tok::Lt => CmpOp::Lt,
            Tok::Le => CmpOp::Le,
            Tok::Gt => CmpOp::Gt,
            Tok::Ge => CmpOp::Ge,
            Tok::EqEq => CmpOp::Eq,
            Tok::Ne => CmpOp::Ne,
            _ => return None,
        })
    }

    fn cmp(&mut self) -> Result<Node, ParseError> {
        let at = self.offset();
        let left = self.add()?;
        if self.peek() == &Tok::Eq {
            return err(
                self.offset(),
                "`=` compares labels only; compare values with `==`",
            );
        }
        let Some(op) = self.cmp_op() else {
            return Ok(left);
        };
        self.next();
        let rat = self.offset();
        let right = self.add()?;
        let l = self.value(left, at, &format!("the left side of `{}`", op.as_str()))?;
        let r = self.value(right, rat, &format!("the right side of `{}`", op.as_str()))?;
        if self.cmp_op().is_some() {
            return err(
                self.offset(),
                "comparisons cannot be chained; join them with `and`",
            );
        }
        Ok(Node::C(Cond::Cmp(op, l, r)))
    }

    fn add(&mut self) -> Result<Node, ParseError> {
        self.binary_level(
            |t| match t {
                Tok::Plus => Some(BinOp::Add),
                Tok::Minus => Some(BinOp::Sub),
                _ => None,
            },
            Self::mul,
        )
    }

    fn mul(&mut self) -> Result<Node, ParseError> {
        self.binary_level(
            |t| match t {
                Tok::Star => Some(BinOp::Mul),
                Tok::Slash => Some(BinOp::Div),
                _ => None,
            },
            Self::unary,
        )
    }

    /// One left-associative level of arithmetic: `next (op next)*`, both sides values.
    fn binary_level(
        &mut self,
        op_of: fn(&Tok) -> Option<BinOp>,
        next: fn(&mut Self) -> Result<Node, ParseError>,
    ) -> Result<Node, ParseError> {
        let at = self.offset();
        let mut left = next(self)?;
        while let Some(op) = op_of(self.peek()) {
            self.next();
            let rat = self.offset();
            let right = next(self)?;
            let l = self.value(left, at, &format!("`{}`", op.as_str()))?;
            let r = self.value(right, rat, &format!("`{}`", op.as_str()))?;
            left = Node::V(Value::Binary(op, Box::new(l), Box::new(r)));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Node, ParseError> {
        if self.peek() == &Tok::Minus {
            self.next();
            let at = self.offset();
            let inner = self.nested(Self::unary)?;
            let v = self.value(inner, at, "`-`")?;
            return Ok(Node::V(Value::Neg(Box::new(v))));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Node, ParseError> {
        let at = self.offset();
        match self.next() {
            Tok::Number(n) => Ok(Node::V(Value::Number(n))),
            Tok::Duration(d) => Ok(Node::V(Value::Duration(d))),
            Tok::LParen => {
                let inner = self.nested(Self::or)?;
                self.expect(Tok::RParen, "to close the parenthesis")?;
                Ok(inner)
            }
            Tok::Ident(name) => {
                if matches!(name.as_str(), "and" | "or" | "by") {
                    return err(at, format!("expected a value before `{name}`"));
                }
                if self.peek() == &Tok::LParen {
                    self.next();
                    self.call(&name, at).map(Node::V)
                } else {
                    let sel = self.selector_rest(&name, at)?;
                    match sel.measure.kind() {
                        MeasureKind::Scalar => Ok(Node::V(Value::Scalar(sel))),
                        MeasureKind::Distribution => err(
                            at,
                            format!(
                                "`{}` is a distribution: wrap it in p50(...), p99(...), mean(...), count(...) or rate(...)",
                                sel.measure.name()
                            ),
                        ),
                        MeasureKind::Selection => err(
                            at,
                            "`requests` only selects requests, as the first argument of goodput(...)",
                        ),
                    }
                }
            }
            other => expected(at, "a value", &other),
        }
    }

    /// A function call; the opening parenthesis is consumed.
    fn call(&mut self, name: &str, at: usize) -> Result<Value, ParseError> {
        if let Some(agg) = aggregation(name, at)? {
            let sel = self.distribution_arg(name)?;
            self.expect(Tok::RParen, &format!("to close `{name}(`"))?;
            return Ok(Value::Agg(agg, sel));
        }
        match name {
            "r2" => self.fit(Fit::R2, name),
            "slope" => self.fit(Fit::Slope, name),
            "baseline" => self.baseline(),
            "goodput" => self.goodput(),
            _ => {
                let hint = did_you_mean(name, FUNCTIONS)
                    .map(|b| format!("; did you mean `{b}`?"))
                    .unwrap_or_else(|| {
                        "; functions are pNN, mean, count, rate, r2, slope, baseline, goodput"
                            .into()
                    });
                err(at, format!("unknown function `{name}`{hint}"))
            }
        }
    }

    /// `r2(...)` or `slope(...)` after its opening parenthesis: a measurement and the numeric
    /// label it is fitted over, `by` inside the parentheses or after them.
    fn fit(&mut self, fit: Fit, name: &str) -> Result<Value, ParseError> {
        let inner_at = self.offset();
        let inner = self.nested(Self::or)?;
        let inner = self.value(inner, inner_at, &format!("`{name}(...)`"))?;
        if !inner.reads_data() {
            return err(
                inner_at,
                format!("`{name}(...)` needs a measurement to fit"),
            );
        }
        if contains(&inner, &|v| {
            matches!(v, Value::Fit(..) | Value::Baseline(..))
        }) {
            return err(
                inner_at,
                format!("`{name}(...)` cannot hold another fit or a baseline"),
            );
        }
        // Both `r2(x by (l))` (DESIGN's form) and `r2(x) by (l)` (PromQL's) are read.
        let by_inside = self.is_word("by");
        if !by_inside {
            self.expect(Tok::RParen, &format!("to close `{name}(`"))?;
        }
        let by_at = self.offset();
        if !self.is_word("by") {
            return err(
                by_at,
                format!("`{name}(...)` needs `by (label)`, e.g. `by (prefix_ratio)`"),
            );
        }
        self.next();
        self.expect(Tok::LParen, "after `by`")?;
        let label = self.fit_label()?;
        self.expect(Tok::RParen, "to close `by (`")?;
        if by_inside {
            self.expect(Tok::RParen, &format!("to close `{name}(`"))?;
        }
        Ok(Value::Fit(fit, Box::new(inner), label))
    }

    /// The label of a fit's `by (...)`: a numeric step label.
    fn fit_label(&mut self) -> Result<String, ParseError> {
        let label_at = self.offset();
        let label = match self.next() {
            Tok::Ident(l) => l,
            other => {
                return expected(label_at, "a label name", &other);
            }
        };
        if !NUMERIC_LABELS.contains(&label.as_str()) {
            return err(
                label_at,
                format!(
                    "cannot fit over `{label}`: use a numeric step label ({})",
                    NUMERIC_LABELS.join(", ")
                ),
            );
        }
        Ok(label)
    }

    /// `baseline(...)` after its opening parenthesis: a measurement, then how far back (a
    /// duration) or a pinned baseline's name.
    fn baseline(&mut self) -> Result<Value, ParseError> {
        let inner_at = self.offset();
        let inner = self.nested(Self::or)?;
        let inner = self.value(inner, inner_at, "`baseline(...)`")?;
        if !inner.reads_data() {
            return err(inner_at, "`baseline(...)` needs a measurement");
        }
        if contains(&inner, &|v| matches!(v, Value::Baseline(..))) {
            return err(inner_at, "baselines cannot be nested");
        }
        self.expect(
            Tok::Comma,
            "and a duration such as `24h` (or a pinned baseline's name) in `baseline(...)`",
        )?;
        let d_at = self.offset();
        let past = match self.next() {
            Tok::Duration(d) if d > 0.0 && d.is_finite() => {
                BaselineRef::Span(d, self.baseline_offset()?)
            }
            Tok::Str(name) if valid_pin_name(&name) => BaselineRef::Pinned(name),
            Tok::Str(_) => {
                return err(
                    d_at,
                    "a pinned baseline's name has 1 to 63 letters, digits, `.`, `_` or `-`",
                );
            }
            other => {
                return expected(
                    d_at,
                    "a positive duration such as `24h` or a pinned baseline's name such as \"release-1.2\"",
                    &other,
                );
            }
        };
        self.expect(Tok::RParen, "to close `baseline(`")?;
        Ok(Value::Baseline(Box::new(inner), past))
    }

    /// An optional `offset DURATION` after a baseline's span: the span ends that long ago.
    fn baseline_offset(&mut self) -> Result<f64, ParseError> {
        if !matches!(self.peek(), Tok::Ident(w) if w == "offset") {
            return Ok(0.0);
        }
        self.i += 1;
        let at = self.offset();
        match self.next() {
            Tok::Duration(d) if d >= 0.0 && d.is_finite() => Ok(d),
            other => expected(
                at,
                "a duration such as `12h` after `offset` (the baseline's span ends that long ago)",
                &other,
            ),
        }
    }

    /// `goodput(...)` after its opening parenthesis: `requests{...}`, then one objective or more.
    fn goodput(&mut self) -> Result<Value, ParseError> {
        let sel_at = self.offset();
        let sel = match self.next() {
            Tok::Ident(n) => self.selector_rest(&n, sel_at)?,
            other => {
                return err(
                    sel_at,
                    format!(
                        "goodput's first argument selects requests, e.g. `requests{{workload=\"concurrency_sweep\"}}`; found {}",
                        other.describe()
                    ),
                );
            }
        };
        if sel.measure != Measure::Requests {
            return err(
                sel_at,
                "goodput's first argument is `requests{...}`; the objectives follow it",
            );
        }
        let mut objectives = Vec::new();
        while self.peek() == &Tok::Comma {
            self.next();
            objectives.push(self.objective()?);
        }
        if objectives.is_empty() {
            return err(
                self.offset(),
                "goodput needs at least one objective, e.g. `goodput(requests{...}, ttft <= 2s)`",
            );
        }
        self.expect(Tok::RParen, "to close `goodput(`")?;
        Ok(Value::Goodput(sel, objectives))
    }

    /// One goodput objective after its comma: `measure <= duration`.
    fn objective(&mut self) -> Result<Objective, ParseError> {
        let m_at = self.offset();
        let measure = match self.next() {
            Tok::Ident(n) => match Measure::by_name(&n) {
                Some(m) if m.kind() == MeasureKind::Distribution => m,
                _ => {
                    return err(
                        m_at,
                        format!(
                            "`{n}` is not a per-request latency; goodput objectives use ttft, itl, latency or a server-side timing"
                        ),
                    );
                }
            },
            other => {
                return expected(m_at, "an objective such as `ttft <= 2s`", &other);
            }
        };
        let op_at = self.offset();
        if !matches!(self.next(), Tok::Le | Tok::Lt) {
            return err(op_at, "a goodput objective is `measure <= duration`");
        }
        let d_at = self.offset();
        let seconds = match self.next() {
            Tok::Duration(d) if d > 0.0 && d.is_finite() => d,
            other => {
                return expected(d_at, "a positive duration", &other);
            }
        };
        check_bucket_threshold(seconds, d_at)?;
        Ok(Objective { measure, seconds })
    }

    fn distribution_arg(&mut self, func: &str) -> Result<Selector, ParseError> {
        let at = self.offset();
        let sel = match self.next() {
            Tok::Ident(n) => self.selector_rest(&n, at)?,
            other => {
                return err(
                    at,
                    format!(
                        "`{func}(...)` takes a selector such as `ttft{{...}}`, found {}",
                        other.describe()
                    ),
                );
            }
        };
        if sel.measure.kind() != MeasureKind::Distribution {
            return err(
                at,
                format!(
                    "`{func}(...)` needs a per-request distribution (ttft, itl, latency, server_ttft, prefill_time, prefill_wait, kv_transfer); `{}` is a single value per window",
                    sel.measure.name()
                ),
            );
        }
        Ok(sel)
    }

    /// The rest of a selector after its measure name.
    fn selector_rest(&mut self, name: &str, at: usize) -> Result<Selector, ParseError> {
        let Some(measure) = Measure::by_name(name) else {
            let names = Measure::ALL.map(Measure::name);
            let hint = did_you_mean(name, names)
                .map(|b| format!("; did you mean `{b}`?"))
                .unwrap_or_else(|| format!("; measurements are {}", names.join(", ")));
            return err(at, format!("unknown measurement `{name}`{hint}"));
        };
        let mut matchers = Vec::new();
        if self.peek() == &Tok::LBrace {
            self.next();
            loop {
                if self.peek() == &Tok::RBrace {
                    self.next();
                    break;
                }
                matchers.push(self.matcher()?);
                let sep_at = self.offset();
                match self.next() {
                    Tok::Comma => {}
                    Tok::RBrace => break,
                    other => {
                        return expected(sep_at, "`,` or `}` in the label matchers", &other);
                    }
                }
            }
        }
        Ok(Selector { measure, matchers })
    }

    fn matcher(&mut self) -> Result<Matcher, ParseError> {
        let at = self.offset();
        let label = match self.next() {
            Tok::Ident(l) => l,
            other => {
                return expected(at, "a label name", &other);
            }
        };
        if !LABELS.contains(&label.as_str()) {
            let hint = did_you_mean(&label, LABELS)
                .map(|b| format!("; did you mean `{b}`?"))
                .unwrap_or_else(|| format!("; labels are {}", LABELS.join(", ")));
            return err(at, format!("unknown label `{label}`{hint}"));
        }
        let op_at = self.offset();
        let op = match self.next() {
            Tok::Eq => MatchOp::Eq,
            Tok::Ne => MatchOp::Ne,
            Tok::Re => MatchOp::Re,
            Tok::NotRe => MatchOp::NotRe,
            Tok::Lt => MatchOp::Lt,
            Tok::Le => MatchOp::Le,
            Tok::Gt => MatchOp::Gt,
            Tok::Ge => MatchOp::Ge,
            Tok::EqEq => return err(op_at, "label matchers use `=`, not `==`"),
            other => {
                return expected(
                    op_at,
                    "a matcher operator (=, !=, =~, !~, <, <=, >, >=)",
                    &other,
                );
            }
        };
        let v_at = self.offset();
        let value = match self.next() {
            Tok::Str(s) => s,
            Tok::Number(n) => {
                return err(
                    v_at,
                    format!(
                        "label values are strings: write `{label}{}\"{n}\"`",
                        op.as_str()
                    ),
                );
            }
            other => {
                return expected(v_at, "a quoted label value", &other);
            }
        };
        if op.is_numeric() {
            if !NUMERIC_LABELS.contains(&label.as_str()) {
                return err(
                    op_at,
                    format!(
                        "`{label}` is not numeric; `{}` works on {}",
                        op.as_str(),
                        NUMERIC_LABELS.join(", ")
                    ),
                );
            }
            if !value.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                return err(v_at, format!("`{value}` is not a number"));
            }
        }
        if matches!(op, MatchOp::Re | MatchOp::NotRe)
            && let Err(e) = anchored_regex(&value)
        {
            return err(v_at, format!("invalid regular expression: {e}"));
        }
        Ok(Matcher { label, op, value })
    }
}

/// The aggregation a function name stands for (`pNN`, `mean`, `count`, `rate`); `None` for the
/// other functions.
fn aggregation(name: &str, at: usize) -> Result<Option<Agg>, ParseError> {
    if is_quantile_name(name) {
        let percent: f64 = name[1..].parse().unwrap_or(f64::NAN);
        if !(percent > 0.0 && percent < 100.0) {
            return err(
                at,
                format!("`{name}`: a quantile is between p0 and p100, exclusive"),
            );
        }
        return Ok(Some(Agg::Quantile(percent)));
    }
    Ok(match name {
        "mean" => Some(Agg::Mean),
        "count" => Some(Agg::Count),
        "rate" => Some(Agg::Rate),
        _ => None,
    })
}

fn is_quantile_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('p') else {
        return false;
    };
    let mut parts = rest.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let frac = parts.next();
    !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

fn contains(v: &Value, pred: &dyn Fn(&Value) -> bool) -> bool {
    if pred(v) {
        return true;
    }
    match v {
        Value::Fit(_, inner, _) | Value::Baseline(inner, _) | Value::Neg(inner) => {
            contains(inner, pred)
        }
        Value::Binary(_, a, b) => contains(a, pred) || contains(b, pred),
        _ => false,
    }
}

/// A pinned baseline's name: 1 to 63 letters, digits, `.`, `_` or `-` (it becomes part of URLs
/// and log lines).
pub fn valid_pin_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A label regex as PromQL reads it: anchored at both ends.
pub fn anchored_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(text: &str) -> (usize, String) {
        let e = parse_condition(text).expect_err(text);
        (e.offset + 1, e.message)
    }

    #[test]
    fn good_expressions_parse_to_the_expected_tree() {
        let c = parse_condition(
            r#"p50(ttft{serving_mode="disaggregated", concurrency>="32"}) <= 0.8 * p50(ttft{serving_mode="aggregated"})"#,
        )
        .unwrap();
        let Cond::Cmp(
            CmpOp::Le,
            Value::Agg(Agg::Quantile(q), sel),
            Value::Binary(BinOp::Mul, k, _),
        ) = &c
        else {
            panic!("{c:?}")
        };
        assert_eq!(*q, 50.0);
        assert_eq!(sel.measure, Measure::Ttft);
        assert_eq!(sel.matchers[1].op, MatchOp::Ge);
        assert_eq!(**k, Value::Number(0.8));

        for ok in [
            "p99.9(itl) < 50ms",
            "r2(p50(ttft{workload=\"prefix_cache\"}) by (prefix_ratio)) >= 0.9",
            "slope(mean(ttft{workload='prefix_cache'})) by (prefix_ratio) < 0",
            "p50(ttft{target=\"a\"}) <= 1.2 * baseline(p50(ttft{target=\"a\"}), 24h)",
            "p50(ttft) <= 1.1 * baseline(p50(ttft), 24h offset 12h)",
            "error_ratio{workload=~\"concurrency_.*\"} < 0.01 and output_tps > 100 or count(ttft) >= 1",
            "goodput(requests{concurrency=\"32\"}, ttft <= 2s, itl <= 40ms) > 1",
            "-(p50(ttft) - p50(ttft)) < 1e-3",
            "(cost_per_mtok{serving_mode=\"disaggregated\"}) <= cost_per_mtok{serving_mode=\"aggregated\",}",
        ] {
            parse_condition(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn a_baseline_span_may_end_an_offset_ago() {
        let c = parse_condition("p50(ttft) <= 1.1 * baseline(p50(ttft), 24h offset 12h)").unwrap();
        assert_eq!(
            c.to_string(),
            "p50(ttft) <= 1.1 * baseline(p50(ttft), 1d offset 12h)"
        );
        let Cond::Cmp(_, _, Value::Binary(_, _, b)) = &c else {
            panic!("{c:?}")
        };
        assert!(
            matches!(**b, Value::Baseline(_, BaselineRef::Span(s, o)) if s == 86_400.0 && o == 43_200.0),
            "{b:?}"
        );
        let e = parse_condition("p50(ttft) <= baseline(p50(ttft), 24h offset x)").unwrap_err();
        assert!(e.message.contains("after `offset`"), "{e:?}");
    }

    #[test]
    fn errors_point_at_the_exact_column() {
        let cases: [(&str, usize, &str); 18] = [
            ("p50(tft) < 1s", 5, "did you mean `ttft`"),
            ("p50(ttft{mode=\"x\"}) < 1s", 10, "unknown label `mode`"),
            ("ttft < 1s", 1, "is a distribution"),
            ("p50(ttft) < ", 13, "expected a value, found the end"),
            ("p50(ttft) < 1s)", 15, "unexpected `)`"),
            ("p50(ttft) = 1s", 11, "compare values with `==`"),
            ("p50(ttft) < 1x", 14, "unknown duration unit `x`"),
            (
                "p50(ttft{concurrency=32}) < 1s",
                22,
                "label values are strings",
            ),
            (
                "p50(ttft{workload>=\"1\"}) < 1s",
                18,
                "`workload` is not numeric",
            ),
            (
                "p50(ttft{concurrency>=\"x\"}) < 1s",
                23,
                "`x` is not a number",
            ),
            (
                "p50(ttft{target=~\"(\"}) < 1s",
                18,
                "invalid regular expression",
            ),
            ("p50(ttft) < 1s < 2s", 16, "cannot be chained"),
            ("p50(ttft) and p50(itl) < 1s", 1, "`and` joins comparisons"),
            (
                "mean(error_ratio) < 1",
                6,
                "needs a per-request distribution",
            ),
            ("p100(ttft) < 1s", 1, "between p0 and p100"),
            (
                "r2(p50(ttft)) by (target) > 0.9",
                19,
                "cannot fit over `target`",
            ),
            ("p5O(ttft) < 1s", 1, "unknown function `p5O`"),
            ("1 < 2", 1, "reads no measurement"),
        ];
        for (text, column, needle) in cases {
            let (got, message) = col(text);
            assert_eq!(got, column, "{text}: {message}");
            assert!(message.contains(needle), "{text}: {message}");
        }
        let e = parse_condition("p50(ttft{target=\"é\"}) < 1x").unwrap_err();
        assert_eq!(e.offset + 1, 26, "columns count characters, not bytes");
    }

    #[test]
    fn nesting_is_bounded_with_an_error_not_a_stack_overflow() {
        let wrap = |depth: usize, open: &str, close: &str| {
            format!(
                "{}p50(ttft{{}}){} < 2s",
                open.repeat(depth),
                close.repeat(depth)
            )
        };
        assert!(parse_condition(&wrap(MAX_NESTING, "(", ")")).is_ok());
        assert!(parse_condition(&wrap(MAX_NESTING, "-", "")).is_ok());
        for (open, close) in [("(", ")"), ("-", ""), ("-(", ")"), ("baseline(", ")")] {
            let (_, message) = col(&wrap(10_000, open, close));
            assert!(
                message.contains("nests deeper than 64"),
                "{open}: {message}"
            );
        }
        // The fuzzer's find (`fuzz/`, target slo_expr): a thousand `-` and `(`.
        let fuzzed = format!("8{}{}", "-".repeat(9), "(".repeat(1000) + &"-(".repeat(500));
        assert!(parse_condition(&fuzzed).is_err());
        assert!(parse_sli(&fuzzed).is_err());
    }

    #[test]
    fn slis_parse_and_reject_non_histograms() {
        let (sel, t) = parse_sli("ttft{workload=\"concurrency_sweep\"} < 2s").unwrap();
        assert_eq!((sel.measure, t), (Measure::Ttft, 2.0));
        assert_eq!(parse_sli("kv_transfer < 2s").unwrap_err().offset, 0);
        assert_eq!(parse_sli("ttft > 2s").unwrap_err().offset, 5);
        assert_eq!(parse_sli("ttft < 2").unwrap_err().offset, 7);
    }

    #[test]
    fn durations_and_quantile_names_print_canonically() {
        assert_eq!(format_duration(0.5), "500ms");
        assert_eq!(format_duration(2.0), "2s");
        assert_eq!(format_duration(86_400.0), "1d");
        assert_eq!(format_duration(90.0), "90s");
        assert_eq!(format_duration(0.0333), "0.0333s");
        assert_eq!(quantile_name(99.9), "p99.9");
        let c = parse_condition("p99.9(itl) < 24h").unwrap();
        assert_eq!(c.to_string(), "p99.9(itl) < 1d");
    }

    mod roundtrip {
        use super::super::*;
        use proptest::prelude::*;

        fn label_value() -> impl Strategy<Value = String> {
            "[a-z0-9_. \"\\\\é]{0,8}"
        }

        fn matcher() -> impl Strategy<Value = Matcher> {
            prop_oneof![
                (
                    prop::sample::select(LABELS.to_vec()),
                    prop::sample::select(vec![MatchOp::Eq, MatchOp::Ne]),
                    label_value()
                )
                    .prop_map(|(l, op, v)| Matcher {
                        label: l.to_owned(),
                        op,
                        value: v,
                    }),
                (
                    prop::sample::select(LABELS.to_vec()),
                    prop::sample::select(vec![MatchOp::Re, MatchOp::NotRe]),
                    "[a-z]{0,4}(\\.\\*)?"
                )
                    .prop_map(|(l, op, v)| Matcher {
                        label: l.to_owned(),
                        op,
                        value: v,
                    }),
                (
                    prop::sample::select(NUMERIC_LABELS.to_vec()),
                    prop::sample::select(vec![MatchOp::Lt, MatchOp::Le, MatchOp::Gt, MatchOp::Ge]),
                    0u32..100_000
                )
                    .prop_map(|(l, op, v)| Matcher {
                        label: l.to_owned(),
                        op,
                        value: (f64::from(v) / 100.0).to_string(),
                    }),
            ]
        }

        fn selector(measures: Vec<Measure>) -> impl Strategy<Value = Selector> {
            (
                prop::sample::select(measures),
                prop::collection::vec(matcher(), 0..3),
            )
                .prop_map(|(measure, matchers)| Selector { measure, matchers })
        }

        fn distributions() -> Vec<Measure> {
            Measure::ALL
                .into_iter()
                .filter(|m| m.kind() == MeasureKind::Distribution)
                .collect()
        }

        fn duration() -> impl Strategy<Value = f64> {
            prop::sample::select(vec![
                0.5, 2.0, 0.0333, 1.5, 86_400.0, 0.001, 90.0, 3600.0, 0.25,
            ])
        }

        /// Values that read data (what fits and baselines accept).
        fn data_leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                (
                    prop::sample::select(vec![50.0, 99.0, 99.9, 90.0, 0.1, 12.5]),
                    selector(distributions())
                )
                    .prop_map(|(q, s)| Value::Agg(Agg::Quantile(q), s)),
                (
                    prop::sample::select(vec![Agg::Mean, Agg::Count, Agg::Rate]),
                    selector(distributions())
                )
                    .prop_map(|(a, s)| Value::Agg(a, s)),
                selector(
                    Measure::ALL
                        .into_iter()
                        .filter(|m| m.kind() == MeasureKind::Scalar)
                        .collect()
                )
                .prop_map(Value::Scalar),
                (
                    selector(vec![Measure::Requests]),
                    prop::collection::vec(
                        (prop::sample::select(distributions()), duration())
                            .prop_map(|(measure, seconds)| Objective { measure, seconds }),
                        1..3
                    )
                )
                    .prop_map(|(s, o)| Value::Goodput(s, o)),
            ]
        }

        fn arith(leaf: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                leaf,
                (0u32..1_000_000).prop_map(|n| Value::Number(f64::from(n) / 1000.0)),
                duration().prop_map(Value::Duration),
            ];
            leaf.prop_recursive(3, 12, 2, |inner| {
                prop_oneof![
                    inner.clone().prop_map(|v| Value::Neg(Box::new(v))),
                    (
                        prop::sample::select(vec![BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div]),
                        inner.clone(),
                        inner
                    )
                        .prop_map(|(op, a, b)| Value::Binary(
                            op,
                            Box::new(a),
                            Box::new(b)
                        )),
                ]
            })
        }

        fn value() -> impl Strategy<Value = Value> {
            let with_data = arith(data_leaf().boxed())
                .prop_filter("reads data", Value::reads_data)
                .boxed();
            prop_oneof![
                3 => arith(data_leaf().boxed()),
                1 => (
                    prop::sample::select(vec![Fit::R2, Fit::Slope]),
                    with_data.clone(),
                    prop::sample::select(NUMERIC_LABELS.to_vec())
                )
                    .prop_map(|(f, v, l)| Value::Fit(f, Box::new(v), l.to_owned())),
                1 => (with_data.clone(), duration())
                    .prop_map(|(v, d)| Value::Baseline(Box::new(v), BaselineRef::Span(d, 0.0))),
                1 => (with_data, prop::sample::select(vec!["release-1.2", "good_v3"]))
                    .prop_map(|(v, n)| Value::Baseline(Box::new(v), BaselineRef::Pinned(n.to_owned()))),
            ]
        }

        fn cond() -> impl Strategy<Value = Cond> {
            let cmp = (
                prop::sample::select(vec![
                    CmpOp::Lt,
                    CmpOp::Le,
                    CmpOp::Gt,
                    CmpOp::Ge,
                    CmpOp::Eq,
                    CmpOp::Ne,
                ]),
                data_leaf(),
                value(),
            )
                .prop_map(|(op, a, b)| Cond::Cmp(op, a, b));
            cmp.prop_recursive(3, 8, 2, |inner| {
                prop_oneof![
                    (inner.clone(), inner.clone())
                        .prop_map(|(a, b)| Cond::And(Box::new(a), Box::new(b))),
                    (inner.clone(), inner).prop_map(|(a, b)| Cond::Or(Box::new(a), Box::new(b))),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(400))]
            #[test]
            fn printing_then_parsing_is_the_identity(c in cond()) {
                let text = c.to_string();
                let parsed = parse_condition(&text)
                    .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
                prop_assert_eq!(&parsed, &c, "{}", text);
                prop_assert_eq!(parsed.to_string(), text);
            }
        }
    }
}
