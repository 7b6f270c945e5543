//! The checks one config value at a time: each problem becomes a [`Diagnostic`] at the value's
//! line and column with a hint, collected so `check` reports every problem at once.

use std::path::Path;

use super::at::{At, Dur};
use super::error::Diagnostic;
use super::limits::{MAX_OSL, MAX_RPS};
use super::workloads::{Cancel, Rate, TraceReplay};

pub(super) struct Check {
    pub(super) diags: Vec<Diagnostic>,
}

impl Check {
    pub(super) fn err(
        &mut self,
        pos: Option<(u64, u64)>,
        msg: impl Into<String>,
        hint: Option<String>,
    ) {
        let mut d = Diagnostic::new(pos, msg);
        d.hint = hint;
        self.diags.push(d);
    }

    /// A file the config names (relative to the config's folder): a regular file, readable,
    /// within `max` bytes. Checked here so `check` finds it, and `run` never binds its port with
    /// a key or certificate it cannot read.
    pub(super) fn file(&mut self, path: &At<String>, base_dir: &Path, key: &str, max: u64) {
        if let Err(e) = crate::files::read_bounded(&base_dir.join(path.as_str()), max) {
            self.err(
                path.pos,
                format!("`{key}` `{}`: {e}", **path),
                Some("give a readable file, relative to the config file or absolute".into()),
            );
        }
    }

    pub(super) fn range_u32(&mut self, v: &At<u32>, key: &str, lo: u32, hi: u32) {
        if **v < lo || **v > hi {
            self.err(
                v.pos,
                format!("`{key}` is {}, must be between {lo} and {hi}", **v),
                None,
            );
        }
    }

    pub(super) fn positive_dur(&mut self, v: &At<Dur>, key: &str) {
        if v.is_zero() {
            self.err(
                v.pos,
                format!("`{key}` must be longer than 0"),
                Some("write a duration such as `120s` or `5m`".into()),
            );
        }
    }

    pub(super) fn finite_in(&mut self, v: &At<f64>, key: &str, lo: f64, hi: f64, lo_open: bool) {
        let x = **v;
        let below = if lo_open { x <= lo } else { x < lo };
        if !x.is_finite() || below || x > hi {
            let lo_bracket = if lo_open { "(" } else { "[" };
            self.err(
                v.pos,
                format!("`{key}` is {x}, must be in {lo_bracket}{lo}, {hi}]"),
                None,
            );
        }
    }

    pub(super) fn url(&mut self, v: &At<String>, key: &str) {
        match url::Url::parse(v) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            Ok(u) => self.err(
                v.pos,
                format!("`{key}` `{}` is not an http(s) URL with a host", **v),
                Some(format!(
                    "scheme `{}` is not supported; write e.g. `http://host:8000`",
                    u.scheme()
                )),
            ),
            Err(e) => self.err(
                v.pos,
                format!("`{key}` `{}` is not a URL: {e}", **v),
                Some("write e.g. `http://dynamo-agg-frontend:8000`".into()),
            ),
        }
    }

    pub(super) fn label_safe_name(&mut self, v: &At<String>, what: &str) {
        let ok = !v.is_empty()
            && v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            self.err(
                v.pos,
                format!("{what} `{}` is not a valid name", **v),
                Some("use 1-63 characters from a-z, A-Z, 0-9, `-`, `_`, `.`".into()),
            );
        }
    }

    pub(super) fn rate(&mut self, rate: &Option<Rate>, workload: &str) {
        if let Some(r) = rate {
            let key = format!("{workload}.rate.rps");
            let rates = r.rps.rates();
            if rates.is_empty() {
                self.err(
                    r.rps.pos,
                    format!("`{key}` is an empty ladder"),
                    Some("write at least one rate, e.g. `rps: [1, 2, 4, 8]`".into()),
                );
            }
            for (i, &x) in rates.iter().enumerate() {
                let key = if r.rps.is_ladder() {
                    format!("{key}[{i}]")
                } else {
                    key.clone()
                };
                self.finite_in(
                    &At {
                        value: x,
                        pos: r.rps.pos,
                    },
                    &key,
                    0.0,
                    MAX_RPS,
                    true,
                );
            }
            for (j, x) in rates.iter().enumerate() {
                if let Some(i) = rates[..j].iter().position(|y| y == x) {
                    self.err(
                        r.rps.pos,
                        format!("`{key}` names the rate {x} twice ([{i}] and [{j}])"),
                        Some("each rate is one step, labelled by its rate: list each once".into()),
                    );
                }
            }
            self.range_u32(
                &r.max_inflight,
                &format!("{workload}.rate.max_inflight"),
                1,
                100_000,
            );
        }
    }

    pub(super) fn cancel(&mut self, cancel: &Cancel, workload: &str) {
        self.finite_in(
            &cancel.share,
            &format!("{workload}.cancel.share"),
            0.0,
            1.0,
            false,
        );
        if let Some(n) = &cancel.after_tokens {
            self.range_u32(n, &format!("{workload}.cancel.after_tokens"), 1, MAX_OSL);
        }
        if let Some(d) = &cancel.after {
            self.positive_dur(d, &format!("{workload}.cancel.after"));
        }
        match (&cancel.after_tokens, &cancel.after) {
            (Some(_), Some(after)) => self.err(
                after.pos,
                format!("`{workload}.cancel` has both `after_tokens` and `after`"),
                Some("a request is abandoned at one point: keep one of them".into()),
            ),
            (None, None) if *cancel.share > 0.0 => self.err(
                cancel.share.pos,
                format!("`{workload}.cancel.share` is set but not when to abandon a request"),
                Some("add `after_tokens: 8` (after 8 output tokens) or `after: 500ms`".into()),
            ),
            _ => {}
        }
    }

    /// The trace-replay workload: its numbers, and every trace loaded as the step will load it,
    /// so a bad file or row is reported by `check` (with the file's line) and never starts traffic.
    pub(super) fn trace_replay(&mut self, r: &TraceReplay, base_dir: &Path) {
        if r.traces.is_empty() {
            self.err(
                None,
                "`trace_replay.traces` is empty",
                Some("add `- { name: chat, path: traces/chat.jsonl }`".into()),
            );
        }
        let mut names = std::collections::HashSet::new();
        for t in &r.traces {
            let name = t.name.as_str();
            if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
                self.err(
                    t.name.pos,
                    format!("trace name {name:?} must be 1 to 64 printable characters"),
                    Some("it becomes the `trace` label".into()),
                );
            } else if !names.insert(name) {
                self.err(
                    t.name.pos,
                    format!("trace name `{name}` is used twice"),
                    None,
                );
            }
            self.range_u32(&t.block_size, "trace_replay.traces.block_size", 1, 65_536);
            if *t.block_size == 0 {
                continue;
            }
            let path = base_dir.join(t.path.as_str());
            use crate::workload::trace::{Trace, TraceError};
            let hint = || Some("see docs/METRICS.md, \"Trace replay\", for both formats".into());
            match Trace::load_any(&path, t.format, *t.block_size) {
                Ok(_) => {}
                // Every bad line its own problem, as every other problem of a config.
                Err(TraceError::Lines { path, lines, more }) => {
                    for (line, problem) in lines {
                        let at = path.display();
                        self.err(
                            t.path.pos,
                            format!("trace `{name}`: {at}:{line}: {problem}"),
                            hint(),
                        );
                    }
                    if more > 0 {
                        self.err(
                            t.path.pos,
                            format!(
                                "trace `{name}`: {}: and {more} more bad lines",
                                path.display()
                            ),
                            None,
                        );
                    }
                }
                Err(e) => self.err(t.path.pos, format!("trace `{name}`: {e}"), hint()),
            }
        }
        self.finite_in(&r.speed, "trace_replay.speed", 0.0, 1000.0, true);
        self.finite_in(&r.sample, "trace_replay.sample", 0.0, 1.0, true);
        if let Some(m) = &r.max_rows {
            self.range_u32(m, "trace_replay.max_rows", 1, u32::MAX);
        }
        self.range_u32(&r.max_inflight, "trace_replay.max_inflight", 1, 100_000);
        self.step_and_warmup(&r.step, &r.warmup, "trace_replay");
    }

    pub(super) fn step_and_warmup(&mut self, step: &At<Dur>, warmup: &At<Dur>, workload: &str) {
        self.positive_dur(step, &format!("{workload}.step"));
        if **warmup >= **step && !step.is_zero() {
            self.err(
                // A defaulted warmup has no position: point at the step that is too short.
                warmup.pos.or(step.pos),
                format!(
                    "`{workload}.warmup` ({}) must be shorter than the step ({})",
                    **warmup, **step
                ),
                Some("nothing would be measured; shorten the warmup or lengthen the step".into()),
            );
        }
    }
}
