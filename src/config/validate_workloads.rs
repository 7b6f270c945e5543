//! Semantic validation of the `workloads` section: at least one workload, and each one's
//! levels, lengths, shapes, ratios, steps, rate and cancellation in range.

use super::At;
use super::check::Check;
use super::limits::*;
use super::workloads::*;

pub(super) fn validate_workloads(c: &mut Check, w: &Workloads) {
    if w.concurrency_sweep.is_none()
        && w.multi_turn.is_none()
        && w.sequence_distribution.is_none()
        && w.prefix_cache.is_none()
        && w.trace_replay.is_none()
        && w.dataset.is_none()
    {
        c.err(
            None,
            "`workloads` names no workload",
            Some(format!("add one of {}", WORKLOAD_NAMES.join(", "))),
        );
    }
    if let Some(s) = &w.concurrency_sweep {
        validate_sweep(c, s);
    }
    if let Some(m) = &w.multi_turn {
        validate_multi_turn(c, m);
    }
    if let Some(d) = &w.sequence_distribution {
        validate_distribution(c, d);
    }
    if let Some(p) = &w.prefix_cache {
        validate_prefix_cache(c, p);
    }
}

fn validate_sweep(c: &mut Check, s: &ConcurrencySweep) {
    if s.levels.is_empty() {
        c.err(
            s.levels.pos,
            "`concurrency_sweep.levels` is empty",
            Some("e.g. `[1, 2, 4, 8, 16, 32, 64]`".into()),
        );
    }
    if s.levels.len() > MAX_LEVELS {
        c.err(
            s.levels.pos,
            format!(
                "`concurrency_sweep.levels` has {} levels, at most {MAX_LEVELS} are accepted",
                s.levels.len()
            ),
            Some("a sweep of powers of two from 1 to 4096 has 13".into()),
        );
    }
    for &l in s.levels.iter().take(MAX_LEVELS) {
        if l == 0 || l > MAX_CONCURRENCY {
            c.err(
                s.levels.pos,
                format!("concurrency level {l} must be between 1 and {MAX_CONCURRENCY}"),
                None,
            );
        }
    }
    c.range_u32(&s.isl, "concurrency_sweep.isl", 1, MAX_ISL);
    c.range_u32(&s.osl, "concurrency_sweep.osl", 1, MAX_OSL);
    c.step_and_warmup(&s.step, &s.warmup, "concurrency_sweep");
    c.rate(&s.rate, "concurrency_sweep");
    c.cancel(&s.cancel, "concurrency_sweep");
}

fn validate_multi_turn(c: &mut Check, m: &MultiTurn) {
    c.range_u32(&m.turns, "multi_turn.turns", 1, MAX_TURNS);
    c.range_u32(
        &m.conversations,
        "multi_turn.conversations",
        1,
        MAX_CONCURRENCY,
    );
    c.range_u32(&m.isl, "multi_turn.isl", 1, MAX_ISL);
    c.range_u32(&m.osl, "multi_turn.osl", 1, MAX_OSL);
    c.positive_dur(&m.duration, "multi_turn.duration");
    let context = u64::from(*m.turns) * (u64::from(*m.isl) + u64::from(*m.osl));
    if context > u64::from(MAX_ISL) {
        c.err(m.turns.pos, format!("the last turn's context would be {context} tokens (turns × (isl + osl)), above {MAX_ISL}"), Some("use fewer turns or shorter messages".into()));
    }
}

fn validate_distribution(c: &mut Check, d: &SequenceDistribution) {
    if d.distributions.is_empty() {
        c.err(
            d.distributions.pos,
            "`sequence_distribution.distributions` is empty",
            Some("e.g. `[uniform, zipf, lognormal]`".into()),
        );
    }
    let mut kinds = d.distributions.to_vec();
    kinds.sort_by_key(|k| k.as_str());
    kinds.dedup();
    if kinds.len() != d.distributions.len() {
        c.err(
            d.distributions.pos,
            "`sequence_distribution.distributions` names a distribution twice",
            None,
        );
    }
    for (r, key, hi) in [(&d.isl, "isl", MAX_ISL), (&d.osl, "osl", MAX_OSL)] {
        c.range_u32(&r.min, &format!("sequence_distribution.{key}.min"), 1, hi);
        c.range_u32(&r.max, &format!("sequence_distribution.{key}.max"), 1, hi);
        if *r.min > *r.max {
            c.err(
                r.min.pos,
                format!(
                    "`sequence_distribution.{key}.min` ({}) is above `max` ({})",
                    *r.min, *r.max
                ),
                Some("swap them".into()),
            );
        }
    }
    c.range_u32(
        &d.concurrency,
        "sequence_distribution.concurrency",
        1,
        MAX_CONCURRENCY,
    );
    c.step_and_warmup(&d.step, &d.warmup, "sequence_distribution");
    validate_distribution_shapes(c, d);
    c.rate(&d.rate, "sequence_distribution");
    c.cancel(&d.cancel, "sequence_distribution");
}

/// The parameters of the zipf and lognormal length distributions.
fn validate_distribution_shapes(c: &mut Check, d: &SequenceDistribution) {
    c.finite_in(
        &d.zipf_exponent,
        "sequence_distribution.zipf_exponent",
        0.0,
        10.0,
        true,
    );
    c.finite_in(
        &d.lognormal_sigma,
        "sequence_distribution.lognormal_sigma",
        0.0,
        5.0,
        true,
    );
    for (m, r, key) in [
        (&d.lognormal_isl_median, &d.isl, "lognormal_isl_median"),
        (&d.lognormal_osl_median, &d.osl, "lognormal_osl_median"),
    ] {
        if let Some(m) = m {
            c.finite_in(
                m,
                &format!("sequence_distribution.{key}"),
                f64::from(*r.min),
                f64::from(*r.max),
                false,
            );
        }
    }
}

fn validate_prefix_cache(c: &mut Check, p: &PrefixCache) {
    if p.hit_ratios.is_empty() {
        c.err(
            p.hit_ratios.pos,
            "`prefix_cache.hit_ratios` is empty",
            Some("e.g. `[0.0, 0.25, 0.5, 0.75, 1.0]`".into()),
        );
    }
    for &r in p.hit_ratios.iter() {
        if !(0.0..=1.0).contains(&r) {
            c.err(
                p.hit_ratios.pos,
                format!("hit ratio {r} is outside [0, 1]"),
                Some("ratios are fractions: 0.25, not 25".into()),
            );
        }
    }
    c.range_u32(&p.isl, "prefix_cache.isl", 1, MAX_ISL);
    c.range_u32(&p.osl, "prefix_cache.osl", 1, MAX_OSL);
    c.range_u32(
        &p.concurrency,
        "prefix_cache.concurrency",
        1,
        MAX_CONCURRENCY,
    );
    c.range_u32(&p.pool_size, "prefix_cache.pool_size", 1, 1024);
    c.range_u32(&p.block_size, "prefix_cache.block_size", 1, 1024);
    if *p.block_size > *p.isl {
        c.err(
            p.block_size.pos,
            format!(
                "`prefix_cache.block_size` ({}) is larger than the ISL ({})",
                *p.block_size, *p.isl
            ),
            Some("no whole block could be shared".into()),
        );
    }
    c.step_and_warmup(&p.step, &p.warmup, "prefix_cache");
    c.rate(&p.rate, "prefix_cache");
    c.cancel(&p.cancel, "prefix_cache");
}

/// Each target's `max_input_tokens` against the lengths the workloads ask for where the config
/// alone tells them: a request whose prompt plus `max_tokens` is above it would be skipped at
/// run time (never sent), so a workload that asks for such requests is refused here with the
/// key to change.
/// A non-streaming request has no tokens to count until it ends, so a workload that abandons
/// its requests after some tokens (`cancel.after_tokens`) must stream on every target; the
/// `stream: false` that stops it (the workload's, else a target's) is reported.
pub(super) fn validate_streams(c: &mut Check, cfg: &super::Config) {
    let w = &cfg.workloads;
    let cancelling = [
        (
            "concurrency_sweep",
            w.concurrency_sweep
                .as_ref()
                .map(|s| (&s.cancel, &s.request)),
        ),
        (
            "sequence_distribution",
            w.sequence_distribution
                .as_ref()
                .map(|s| (&s.cancel, &s.request)),
        ),
        (
            "prefix_cache",
            w.prefix_cache.as_ref().map(|s| (&s.cancel, &s.request)),
        ),
    ];
    for (name, settings) in cancelling {
        let Some((cancel, request)) = settings else {
            continue;
        };
        if cancel.after_tokens.is_none() || *cancel.share <= 0.0 {
            continue;
        }
        let off = |s: &&At<bool>| !***s;
        let (pos, key) = match &request.stream {
            Some(own) if off(&own) => (own.pos, format!("{name}.request.stream")),
            Some(_) => continue,
            None => match cfg.targets.iter().find_map(|t| {
                t.request
                    .stream
                    .as_ref()
                    .filter(off)
                    .map(|s| (s.pos, &t.name))
            }) {
                Some((pos, target)) => (pos, format!("targets[{}].request.stream", **target)),
                None => continue,
            },
        };
        c.err(
            pos,
            format!("`{key}: false` with `{name}.cancel.after_tokens`: a request that does not stream has no tokens to count before its answer ends"),
            Some(format!("abandon by time (`{name}.cancel.after: 500ms`), or set `{name}.request.stream: true`")),
        );
    }
}

pub(super) fn validate_context(c: &mut Check, cfg: &super::Config) {
    for t in &cfg.targets {
        let Some(bound) = &t.max_input_tokens else {
            continue;
        };
        let key = format!("targets[{}].max_input_tokens", *t.name);
        for (pos, what, tokens, fix) in asked_lengths(cfg) {
            if tokens > u64::from(**bound) {
                c.err(
                    pos,
                    format!(
                        "{what} asks for {tokens} tokens (prompt + max_tokens), above `{key}` ({}): such requests would be skipped on `{}`, never sent",
                        **bound, *t.name
                    ),
                    Some(format!("lower {fix}, or raise `{key}` if the model's context allows it")),
                );
            }
        }
    }
}

/// The longest request (prompt + output tokens) of a workload, where the config tells it: its
/// place, the workload's name, the tokens and the keys that set them.
type Asked = (Option<(u64, u64)>, String, u64, String);

/// The longest requests each configured workload asks for.
fn asked_lengths(cfg: &super::Config) -> Vec<Asked> {
    let w = &cfg.workloads;
    let sum = |a: &At<u32>, b: &At<u32>| u64::from(**a) + u64::from(**b);
    let mut out = Vec::new();
    if let Some(s) = &w.concurrency_sweep {
        out.push((
            s.isl.pos,
            "`concurrency_sweep`".to_owned(),
            sum(&s.isl, &s.osl),
            "`concurrency_sweep.isl` or `osl`".to_owned(),
        ));
    }
    if let Some(m) = &w.multi_turn {
        out.push((
            m.turns.pos,
            "`multi_turn`'s last turn".to_owned(),
            u64::from(*m.turns) * sum(&m.isl, &m.osl),
            "`multi_turn.turns`, `isl` or `osl` (the last turn holds turns × (isl + osl))"
                .to_owned(),
        ));
    }
    if let Some(d) = &w.sequence_distribution {
        out.push((
            d.isl.max.pos,
            "`sequence_distribution` at its longest".to_owned(),
            sum(&d.isl.max, &d.osl.max),
            "`sequence_distribution.isl.max` or `osl.max`".to_owned(),
        ));
    }
    if let Some(p) = &w.prefix_cache {
        out.push((
            p.isl.pos,
            "`prefix_cache`".to_owned(),
            sum(&p.isl, &p.osl),
            "`prefix_cache.isl` or `osl`".to_owned(),
        ));
    }
    let ps = &cfg.probe_stream;
    if ps.enabled {
        out.push((
            ps.isl.pos,
            "`probe_stream`".to_owned(),
            sum(&ps.isl, &ps.osl),
            "`probe_stream.isl` or `osl`".to_owned(),
        ));
    }
    out
}
