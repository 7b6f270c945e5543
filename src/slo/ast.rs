//! The syntax tree of SLO expressions and its printer: printing then parsing gives the same tree,
//! so the canonical text (in status, logs and generated rules) always means what was written.

use std::fmt;

/// The label names a selector may match on: the request and step labels of docs/DESIGN.md §5.
pub const LABELS: [&str; 10] = crate::request::REQUEST_LABELS;

/// Step labels whose values are numbers, so `by (...)` fits and numeric matchers can use them.
pub const NUMERIC_LABELS: [&str; 5] = ["concurrency", "turn", "isl_bucket", "prefix_ratio", "rate"];

/// What a selector measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Measure {
    /// Time to first token, seconds (client).
    Ttft,
    /// Per-request mean inter-token latency, seconds (client).
    Itl,
    /// Request latency, seconds (client).
    Latency,
    /// Server-side TTFT from `nvext.timing.ttft_ms`.
    ServerTtft,
    /// Server-side prefill time from `nvext.timing.prefill_time_ms`.
    PrefillTime,
    /// Server-side queueing before prefill from `nvext.timing.prefill_wait_time_ms`.
    PrefillWait,
    /// Server-side KV transfer estimate from `nvext.timing.kv_transfer_estimated_latency_ms`.
    KvTransfer,
    /// Cached prompt tokens / prompt tokens.
    CacheHitRatio,
    /// Failed requests / requests.
    ErrorRatio,
    /// Output tokens per second of steady time.
    OutputTps,
    /// Completed requests per second of steady time.
    Throughput,
    /// Cost of one million output tokens, USD.
    CostPerMtok,
    /// Only as the first argument of `goodput(...)`: which requests count.
    Requests,
}

/// How a measure may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeasureKind {
    /// Per-request samples in seconds: only inside `pNN`, `mean`, `count`, `rate`.
    Distribution,
    /// A number per window; a bare selector is its value.
    Scalar,
    /// Only `goodput(requests{...}, ...)`.
    Selection,
}

impl Measure {
    pub const ALL: [Measure; 13] = [
        Measure::Ttft,
        Measure::Itl,
        Measure::Latency,
        Measure::ServerTtft,
        Measure::PrefillTime,
        Measure::PrefillWait,
        Measure::KvTransfer,
        Measure::CacheHitRatio,
        Measure::ErrorRatio,
        Measure::OutputTps,
        Measure::Throughput,
        Measure::CostPerMtok,
        Measure::Requests,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Measure::Ttft => "ttft",
            Measure::Itl => "itl",
            Measure::Latency => "latency",
            Measure::ServerTtft => "server_ttft",
            Measure::PrefillTime => "prefill_time",
            Measure::PrefillWait => "prefill_wait",
            Measure::KvTransfer => "kv_transfer",
            Measure::CacheHitRatio => "cache_hit_ratio",
            Measure::ErrorRatio => "error_ratio",
            Measure::OutputTps => "output_tps",
            Measure::Throughput => "throughput",
            Measure::CostPerMtok => "cost_per_mtok",
            Measure::Requests => "requests",
        }
    }

    pub fn by_name(name: &str) -> Option<Measure> {
        Measure::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn kind(self) -> MeasureKind {
        match self {
            Measure::Ttft
            | Measure::Itl
            | Measure::Latency
            | Measure::ServerTtft
            | Measure::PrefillTime
            | Measure::PrefillWait
            | Measure::KvTransfer => MeasureKind::Distribution,
            Measure::CacheHitRatio
            | Measure::ErrorRatio
            | Measure::OutputTps
            | Measure::Throughput
            | Measure::CostPerMtok => MeasureKind::Scalar,
            Measure::Requests => MeasureKind::Selection,
        }
    }

    /// Measured by the server (Dynamo's `nvext.timing`), not exported as a Prometheus histogram.
    pub fn is_server_side(self) -> bool {
        matches!(
            self,
            Measure::ServerTtft | Measure::PrefillTime | Measure::PrefillWait | Measure::KvTransfer
        )
    }

    /// The client latency histogram family in Prometheus, without `_bucket`/`_sum`/`_count`.
    pub fn histogram_family(self) -> Option<&'static str> {
        match self {
            Measure::Ttft => Some("llm_canary_time_to_first_token_seconds"),
            Measure::Itl => Some("llm_canary_inter_token_latency_seconds"),
            Measure::Latency => Some("llm_canary_request_duration_seconds"),
            _ => None,
        }
    }
}

/// A label matcher operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchOp {
    Eq,
    Ne,
    Re,
    NotRe,
    /// Numeric comparisons of a label value with a number written as a string (`concurrency>="32"`).
    Lt,
    Le,
    Gt,
    Ge,
}

impl MatchOp {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchOp::Eq => "=",
            MatchOp::Ne => "!=",
            MatchOp::Re => "=~",
            MatchOp::NotRe => "!~",
            MatchOp::Lt => "<",
            MatchOp::Le => "<=",
            MatchOp::Gt => ">",
            MatchOp::Ge => ">=",
        }
    }

    pub fn is_numeric(self) -> bool {
        matches!(self, MatchOp::Lt | MatchOp::Le | MatchOp::Gt | MatchOp::Ge)
    }
}

/// `label op "value"`.
#[derive(Debug, Clone, PartialEq)]
pub struct Matcher {
    pub label: String,
    pub op: MatchOp,
    pub value: String,
}

/// `measure{matchers}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    pub measure: Measure,
    pub matchers: Vec<Matcher>,
}

/// Functions over a distribution's samples in the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Agg {
    /// `pNN` / `pNN.N`: the quantile in percent as written (50 for `p50`, 99.9 for `p99.9`).
    Quantile(f64),
    Mean,
    Count,
    /// Samples per second over the window.
    Rate,
}

/// Fits of a value over a numeric step label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fit {
    /// Coefficient of determination of the least-squares line.
    R2,
    /// Slope of the least-squares line (value per unit of the label).
    Slope,
}

impl Fit {
    pub fn name(self) -> &'static str {
        match self {
            Fit::R2 => "r2",
            Fit::Slope => "slope",
        }
    }
}

/// A goodput objective: `ttft <= 2s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    pub measure: Measure,
    /// The bound in seconds; a request is good when its value is at most this.
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    pub fn as_str(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
        }
    }

    fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl CmpOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
        }
    }
}

/// A numeric expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    /// A duration literal, in seconds (`2s`, `500ms`).
    Duration(f64),
    /// A scalar measure (`error_ratio{...}`).
    Scalar(Selector),
    /// `pNN(sel)`, `mean(sel)`, `count(sel)`, `rate(sel)`.
    Agg(Agg, Selector),
    /// `goodput(requests{...}, ttft <= 2s, ...)`: good requests per second of steady time.
    Goodput(Selector, Vec<Objective>),
    /// `r2(expr) by (label)`, `slope(expr) by (label)`.
    Fit(Fit, Box<Value>, String),
    /// `baseline(expr, 24h)`: the same expression over the completed cycles of the last 24 h
    /// (`24h offset 12h`: of the 24 h that ended 12 h ago); `baseline(expr, "name")`: its value
    /// in the baseline pinned as `name`.
    Baseline(Box<Value>, BaselineRef),
    Neg(Box<Value>),
    Binary(BinOp, Box<Value>, Box<Value>),
}

/// Which past a `baseline(...)` compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum BaselineRef {
    /// The rolling baseline over the cycles of a span of seconds that ended an offset of
    /// seconds ago (0: now).
    Span(f64, f64),
    /// The baseline pinned under this name.
    Pinned(String),
}

impl fmt::Display for BaselineRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BaselineRef::Span(s, 0.0) => f.write_str(&format_duration(*s)),
            BaselineRef::Span(s, off) => {
                write!(
                    f,
                    "{} offset {}",
                    format_duration(*s),
                    format_duration(*off)
                )
            }
            BaselineRef::Pinned(name) => f.write_str(&quote(name)),
        }
    }
}

/// A condition: what an SLO asserts.
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Cmp(CmpOp, Value, Value),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
}

impl Value {
    /// Visits every selector, including those inside functions and fits.
    pub fn selectors<'a>(&'a self, out: &mut Vec<&'a Selector>) {
        match self {
            Value::Number(_) | Value::Duration(_) => {}
            Value::Scalar(s) | Value::Agg(_, s) | Value::Goodput(s, _) => out.push(s),
            Value::Fit(_, v, _) | Value::Baseline(v, _) | Value::Neg(v) => v.selectors(out),
            Value::Binary(_, a, b) => {
                a.selectors(out);
                b.selectors(out);
            }
        }
    }

    /// Whether the value reads any measurement (a constant side needs no data).
    pub fn reads_data(&self) -> bool {
        let mut s = Vec::new();
        self.selectors(&mut s);
        !s.is_empty()
    }
}

impl Cond {
    /// The comparisons, left to right.
    pub fn comparisons<'a>(&'a self, out: &mut Vec<(CmpOp, &'a Value, &'a Value)>) {
        match self {
            Cond::Cmp(op, a, b) => out.push((*op, a, b)),
            Cond::And(a, b) | Cond::Or(a, b) => {
                a.comparisons(out);
                b.comparisons(out);
            }
        }
    }
}

/// Writes a duration with the largest unit that keeps it a whole number (`500ms`, `2s`, `24h`),
/// or in seconds with a fraction.
pub fn format_duration(seconds: f64) -> String {
    const UNITS: [(&str, f64); 5] = [
        ("w", 604_800.0),
        ("d", 86_400.0),
        ("h", 3_600.0),
        ("m", 60.0),
        ("s", 1.0),
    ];
    // The parser computes `n` units as `n * size` (and milliseconds as `n / 1000`); a form is
    // used only when reading it back gives exactly `seconds`.
    for (unit, size) in UNITS {
        let n = seconds / size;
        if n >= 1.0 && n.fract() == 0.0 && n * size == seconds {
            return format!("{n}{unit}");
        }
    }
    let ms = seconds * 1000.0;
    if seconds < 1.0 && ms.fract() == 0.0 && ms / 1000.0 == seconds && ms >= 1.0 {
        format!("{ms}ms")
    } else {
        format!("{seconds}s")
    }
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A quantile function's name from its percent: 50 → `p50`, 99.9 → `p99.9`.
pub fn quantile_name(percent: f64) -> String {
    format!("p{percent}")
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.measure.name())?;
        if self.matchers.is_empty() {
            return Ok(());
        }
        f.write_str("{")?;
        for (i, m) in self.matchers.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}{}{}", m.label, m.op.as_str(), quote(&m.value))?;
        }
        f.write_str("}")
    }
}

impl Value {
    /// 3 = atom (never needs parentheses), 2 = product, 1 = sum.
    fn precedence(&self) -> u8 {
        match self {
            Value::Binary(op, ..) => op.precedence(),
            // `-a * b` parses as `(-a) * b`, so a negation binds tighter than any operator.
            _ => 3,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Number(n) => write!(f, "{n}"),
            Value::Duration(s) => f.write_str(&format_duration(*s)),
            Value::Scalar(s) => write!(f, "{s}"),
            Value::Agg(agg, s) => match agg {
                Agg::Quantile(q) => write!(f, "{}({s})", quantile_name(*q)),
                Agg::Mean => write!(f, "mean({s})"),
                Agg::Count => write!(f, "count({s})"),
                Agg::Rate => write!(f, "rate({s})"),
            },
            Value::Goodput(s, objectives) => {
                write!(f, "goodput({s}")?;
                for o in objectives {
                    write!(
                        f,
                        ", {} <= {}",
                        o.measure.name(),
                        format_duration(o.seconds)
                    )?;
                }
                f.write_str(")")
            }
            Value::Fit(fit, v, label) => write!(f, "{}({v}) by ({label})", fit.name()),
            Value::Baseline(v, r) => write!(f, "baseline({v}, {r})"),
            Value::Neg(v) => {
                if v.precedence() < 3 || matches!(**v, Value::Neg(_)) {
                    write!(f, "-({v})")
                } else {
                    write!(f, "-{v}")
                }
            }
            Value::Binary(op, a, b) => {
                let p = op.precedence();
                if a.precedence() < p {
                    write!(f, "({a})")?;
                } else {
                    write!(f, "{a}")?;
                }
                write!(f, " {} ", op.as_str())?;
                // Left-associative: an equal-precedence right operand keeps its parentheses.
                if b.precedence() <= p {
                    write!(f, "({b})")
                } else {
                    write!(f, "{b}")
                }
            }
        }
    }
}

impl Cond {
    fn precedence(&self) -> u8 {
        match self {
            Cond::Or(..) => 1,
            Cond::And(..) => 2,
            Cond::Cmp(..) => 3,
        }
    }
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cond::Cmp(op, a, b) => write!(f, "{a} {} {b}", op.as_str()),
            Cond::And(a, b) | Cond::Or(a, b) => {
                let p = self.precedence();
                let word = if p == 1 { "or" } else { "and" };
                if a.precedence() < p {
                    write!(f, "({a})")?;
                } else {
                    write!(f, "{a}")?;
                }
                write!(f, " {word} ")?;
                if b.precedence() <= p {
                    write!(f, "({b})")
                } else {
                    write!(f, "{b}")
                }
            }
        }
    }
}
