//! Semantic validation of a parsed config: every value checked, every problem reported at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use thiserror::Error;

use super::at::{At, Dur};
use super::check::Check;
use super::error::{Diagnostic, did_you_mean};
use super::limits::*;
use super::schema::*;
use super::validate_workloads::validate_workloads;
use super::workloads::*;

/// Why a lifecycle token file cannot guard the lifecycle endpoints.
#[derive(Debug, Error)]
pub enum TokenError {
    #[error(transparent)]
    Read(#[from] crate::files::FileError),
    #[error("the token is shorter than 16 characters")]
    TooShort,
    #[error("the token has whitespace or control characters inside")]
    Whitespace,
}

/// The lifecycle token of `path`: the file's content without surrounding whitespace.
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    let text = crate::files::read_text(path, crate::files::MAX_SECRET_BYTES)?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(TokenError::TooShort);
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(TokenError::Whitespace);
    }
    Ok(token.to_owned())
}

/// Checks every value of `cfg`; returns all problems found (empty = valid), section by section
/// in the order below, the length of the plan's cycle last (it needs every other value valid).
pub fn validate(cfg: &Config, base_dir: &Path) -> Vec<Diagnostic> {
    let mut c = Check { diags: Vec::new() };
    validate_targets(&mut c, cfg, base_dir);
    validate_discovery(&mut c, cfg);
    validate_tokenizer(&mut c, cfg, base_dir);
    c.finite_in(&cfg.time_scale, "time_scale", 0.0, MAX_TIME_SCALE, true);
    validate_scaled_steps(&mut c, cfg);
    validate_client(&mut c, cfg);
    validate_budget(&mut c, &cfg.budget, "budget");
    validate_workloads(&mut c, &cfg.workloads);
    validate_requests(&mut c, cfg);
    super::validate_workloads::validate_context(&mut c, cfg);
    super::validate_workloads::validate_streams(&mut c, cfg);
    if let Some(r) = &cfg.workloads.trace_replay {
        c.trace_replay(r, base_dir);
    }
    if let Some(d) = &cfg.workloads.dataset {
        c.dataset(d, cfg, base_dir);
    }
    validate_schedule(&mut c, cfg);
    validate_slos(&mut c, cfg);
    validate_export(&mut c, &cfg.export, base_dir);
    if c.diags.is_empty() {
        // Only for an otherwise valid config: the plan behind this needs valid values.
        validate_cycle_length(&mut c, cfg);
    }
    c.diags
}

/// Every target's and workload's `request:` (`config::request`), against the marker header the
/// client sets too.
fn validate_requests(c: &mut Check, cfg: &Config) {
    let marker = cfg.client.marker().ok().flatten().map(|(name, _)| name);
    let marker = marker.as_ref().map(|n| n.as_str());
    for t in &cfg.targets {
        let at = format!("targets[{}].request", *t.name);
        c.diags
            .extend(super::request::problems(&t.request, &at, false, marker));
    }
    for name in WORKLOAD_NAMES {
        if let Some(r) = cfg.workloads.request(name) {
            let at = format!("workloads.{name}.request");
            c.diags
                .extend(super::request::problems(r, &at, true, marker));
        }
    }
}

/// Every step of the cycle lasts at least [`MIN_SCALED_STEP`] once `time_scale` has scaled it
/// (a `time_scale` of 1e-300 made every step 0 ns long). The shortest step is reported: at
/// `time_scale` when the scale shortened it, else at the step itself.
fn validate_scaled_steps(c: &mut Check, cfg: &Config) {
    let scale = *cfg.time_scale;
    if !(scale.is_finite() && scale > 0.0 && scale <= MAX_TIME_SCALE) {
        // Reported by its own check.
        return;
    }
    let w = &cfg.workloads;
    let shortest = cfg
        .cycle()
        .into_iter()
        .filter_map(|name| {
            let step = match name {
                "concurrency_sweep" => &w.concurrency_sweep.as_ref()?.step,
                "multi_turn" => &w.multi_turn.as_ref()?.duration,
                "sequence_distribution" => &w.sequence_distribution.as_ref()?.step,
                "prefix_cache" => &w.prefix_cache.as_ref()?.step,
                "trace_replay" => &w.trace_replay.as_ref()?.step,
                "dataset" => &w.dataset.as_ref()?.step,
                _ => return None,
            };
            // A step of 0 is reported as such.
            (!step.is_zero()).then_some((name, step))
        })
        .min_by_key(|(_, step)| step.0);
    let Some((name, step)) = shortest else {
        return;
    };
    // As the plan scales it (`Duration::mul_f64`), without its panic on a step too long to
    // scale, which is not short.
    let scaled = std::time::Duration::try_from_secs_f64(step.as_secs_f64() * scale);
    let Some(scaled) = scaled.ok().filter(|s| *s < MIN_SCALED_STEP) else {
        return;
    };
    let key = if name == "multi_turn" {
        "duration"
    } else {
        "step"
    };
    let pos = if scale < 1.0 {
        cfg.time_scale.pos.or(step.pos)
    } else {
        step.pos.or(cfg.time_scale.pos)
    };
    let least = MIN_SCALED_STEP.as_secs_f64() / step.as_secs_f64();
    let fix = if least <= MAX_TIME_SCALE {
        format!(
            "set `time_scale` to at least {}, or lengthen `{name}.{key}`",
            round_up(least)
        )
    } else {
        format!("lengthen `{name}.{key}`")
    };
    c.err(
        pos,
        format!(
            "`{name}.{key}` ({}) lasts {} at `time_scale` {}: a step needs at least {}",
            **step,
            Dur(scaled),
            shown(scale),
            Dur(MIN_SCALED_STEP)
        ),
        Some(format!(
            "a shorter step measures next to nothing, and steps of 0s would repeat without a \
             pause; {fix}"
        )),
    );
}

/// `x` as text, in scientific notation when tiny (1e-300, not 300 zeros).
fn shown(x: f64) -> String {
    if x != 0.0 && x.abs() < 1e-4 {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// `x` rounded up to two significant digits, as text.
fn round_up(x: f64) -> String {
    let decimals = (1 - x.log10().floor() as i32).max(0);
    let factor = 10f64.powi(decimals);
    // The epsilon keeps 0.01 at 0.010 where the product rounds to 10.000000000000002.
    let up = ((x * factor) - 1e-9).ceil() / factor;
    format!("{up:.prec$}", prec = decimals as usize)
}

/// Something to send to, and each target: a unique name, one source (URL or simulator), its
/// budget, model and key, the servers' metrics it names, its cost and its files.
fn validate_targets(c: &mut Check, cfg: &Config, base_dir: &Path) {
    if cfg.targets.is_empty() && cfg.discovery.is_none() {
        c.err(
            Some((1, 1)),
            "no targets",
            Some("add a `targets:` list, or enable `discovery.kubernetes`".into()),
        );
    }
    let mut seen: HashMap<&str, Option<(u64, u64)>> = HashMap::new();
    for t in &cfg.targets {
        target_name_and_source(c, t, &mut seen);
        validate_budget(c, &t.budget, &format!("targets[{}].budget", *t.name));
        if t.model.trim().is_empty() {
            c.err(
                t.name.pos,
                format!("target `{}` has an empty `model`", *t.name),
                Some("write `auto` to use the first id of /v1/models".into()),
            );
        }
        if let Some(env) = &t.api_key_env {
            api_key_env(c, t, env);
        }
        for u in &t.server_metrics {
            c.url(u, "server_metrics");
        }
        if let Some(cost) = &t.cost_per_hour_usd {
            c.finite_in(cost, "cost_per_hour_usd", 0.0, 1e6, false);
        }
        if let Some(m) = &t.max_input_tokens
            && **m < 2
        {
            c.err(
                m.pos,
                format!(
                    "`targets[{}].max_input_tokens` is {}: no request fits, each holds at least 2 tokens (ISL and OSL are at least 1)",
                    *t.name, **m
                ),
                Some("set the model's context length, or remove the key to use the one its /v1/models reports".into()),
            );
        }
        target_files(c, t, base_dir);
    }
}

/// A target's name (label-safe, unique) and where it is: a URL or the embedded simulator.
fn target_name_and_source<'a>(
    c: &mut Check,
    t: &'a TargetConfig,
    seen: &mut HashMap<&'a str, Option<(u64, u64)>>,
) {
    c.label_safe_name(&t.name, "target name");
    if let Some(first) = seen.insert(t.name.as_str(), t.name.pos) {
        let at = first
            .map(|(l, col)| format!(" (first at line {l}, column {col})"))
            .unwrap_or_default();
        c.err(
            t.name.pos,
            format!("duplicate target name `{}`{at}", *t.name),
            Some("target names are the `target` label and must be unique".into()),
        );
    }
    match (&t.url, &t.simulated) {
        (Some(u), None) => c.url(u, "url"),
        (None, Some(sim)) => {
            for problem in sim.validate() {
                c.err(sim.pos, format!("simulated: {problem}"), None);
            }
        }
        (Some(u), Some(_)) => c.err(
            u.pos,
            format!("target `{}` has both `url` and `simulated`", *t.name),
            Some(
                "keep one: `url` for a real deployment, `simulated` for the embedded simulator"
                    .into(),
            ),
        ),
        (None, None) => c.err(
            t.name.pos,
            format!("target `{}` has neither `url` nor `simulated`", *t.name),
            Some("add `url: http://host:port` or `simulated: {}`".into()),
        ),
    }
}

/// `api_key_env`: the name of a variable (never the key itself) that is set, and the key's only
/// source.
fn api_key_env(c: &mut Check, t: &TargetConfig, env: &At<String>) {
    let ok = !env.is_empty()
        && env
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
        && !env.starts_with(|ch: char| ch.is_ascii_digit());
    if !ok {
        c.err(
            env.pos,
            format!(
                "`api_key_env` `{}` is not an environment variable name",
                **env
            ),
            Some("name the variable, e.g. `OPENAI_API_KEY` — never the key itself".into()),
        );
    } else if std::env::var_os(env.as_str()).is_none_or(|v| v.is_empty()) {
        c.err(
            env.pos,
            format!("environment variable `{}` (api_key_env) is not set", **env),
            Some("set it in the canary's environment (the chart's `env`), or name a file with `api_key_file`".into()),
        );
    }
    if t.api_key_file.is_some() {
        c.err(
            env.pos,
            "`api_key_env` and `api_key_file` are both set",
            Some("keep one source for the key".into()),
        );
    }
}

/// The files a target names, each readable: its API key, its CA, client certificate and key
/// (the last two together).
fn target_files(c: &mut Check, t: &TargetConfig, base_dir: &Path) {
    if let Some(file) = &t.api_key_file {
        c.file(
            file,
            base_dir,
            "api_key_file",
            crate::files::MAX_SECRET_BYTES,
        );
    }
    if let Some(tls) = &t.tls {
        for (key, file) in [
            ("tls.ca_file", &tls.ca_file),
            ("tls.cert_file", &tls.cert_file),
            ("tls.key_file", &tls.key_file),
        ] {
            if let Some(file) = file {
                c.file(file, base_dir, key, crate::files::MAX_PEM_BYTES);
            }
        }
    }
    if let Some(tls) = &t.tls
        && tls.cert_file.is_some() != tls.key_file.is_some()
    {
        let pos = tls
            .cert_file
            .as_ref()
            .or(tls.key_file.as_ref())
            .and_then(|a| a.pos);
        c.err(
            pos,
            "`tls.cert_file` and `tls.key_file` go together",
            Some("a client certificate needs its key".into()),
        );
    }
}

/// Discovery that can find something, and the Kubernetes object names it writes.
fn validate_discovery(c: &mut Check, cfg: &Config) {
    if let Some(d) = &cfg.discovery
        && !d.kubernetes.dynamo_graph_deployments
        && cfg.targets.is_empty()
    {
        c.err(None, "discovery is on but finds nothing: `dynamo_graph_deployments` is false and there are no static targets", None);
    }
    if let Some(k) = cfg.discovery.as_ref().map(|d| &d.kubernetes) {
        let names = [
            ("state_configmap", k.state_configmap.as_ref()),
            (
                "prometheus_rule.name",
                k.prometheus_rule.as_ref().map(|r| &r.name),
            ),
        ];
        for (key, name) in names {
            let Some(name) = name else { continue };
            let dns = !name.is_empty()
                && name.len() <= 253
                && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && name.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')
                });
            if !dns {
                c.err(
                    name.pos,
                    format!("`{key}` `{}` is not a Kubernetes object name", **name),
                    Some("lower-case letters, digits, `-` and `.`, starting and ending with a letter or digit".into()),
                );
            }
        }
    }
}

/// A tokenizer named by path, found locally.
fn validate_tokenizer(c: &mut Check, cfg: &Config, base_dir: &Path) {
    if let Some(tok) = &cfg.tokenizer {
        let p = base_dir.join(tok.as_str());
        let ok = p.is_file() || p.join("tokenizer.json").is_file();
        if !ok {
            c.err(
                tok.pos,
                format!("tokenizer `{}` not found (looked for a tokenizer.json file or a directory holding one)", **tok),
                Some("give a local path, relative to the config file; hub names are not downloaded".into()),
            );
        }
    }
}

/// The client's timeouts and limits, with the probe stream's and the goodput's right after the
/// connect and request timeouts (the order `check` has always reported them in).
fn validate_client(c: &mut Check, cfg: &Config) {
    let cc = &cfg.client;
    c.positive_dur(&cc.connect_timeout, "client.connect_timeout");
    c.positive_dur(&cc.request_timeout, "client.request_timeout");
    validate_probe_stream(c, &cfg.probe_stream);
    validate_goodput(c, cfg);
    validate_client_limits(c, cc);
}

fn validate_probe_stream(c: &mut Check, ps: &ProbeStreamConfig) {
    if ps.interval.0 < std::time::Duration::from_secs(1) {
        c.err(
            ps.interval.pos,
            format!(
                "`probe_stream.interval` is {}, at least 1s is accepted",
                *ps.interval
            ),
            Some("a few probes a minute is the point: e.g. `20s`".into()),
        );
    }
    c.range_u32(&ps.isl, "probe_stream.isl", 1, MAX_ISL);
    c.range_u32(&ps.osl, "probe_stream.osl", 1, 64);
}

/// The run's goodput definition and each target's own.
fn validate_goodput(c: &mut Check, cfg: &Config) {
    c.positive_dur(&cfg.goodput.ttft, "goodput.ttft");
    c.positive_dur(&cfg.goodput.itl, "goodput.itl");
    for t in &cfg.targets {
        if let Some(g) = &t.goodput {
            c.positive_dur(&g.ttft, "goodput.ttft");
            c.positive_dur(&g.itl, "goodput.itl");
        }
    }
}

/// The client's other timeouts (each shorter than a request), event size, marker and user.
fn validate_client_limits(c: &mut Check, cc: &ClientConfig) {
    c.positive_dur(&cc.first_token_timeout, "client.first_token_timeout");
    c.positive_dur(&cc.stall_timeout, "client.stall_timeout");
    c.positive_dur(&cc.pool_idle_timeout, "client.pool_idle_timeout");
    if cc.request_timeout.0.as_secs_f64() > 3600.0 {
        c.err(
            cc.request_timeout.pos,
            format!(
                "`client.request_timeout` is {}, at most 1h is accepted",
                *cc.request_timeout
            ),
            Some("a request longer than its step is cut at the step's drain anyway".into()),
        );
    }
    for (v, key) in [
        (&cc.first_token_timeout, "client.first_token_timeout"),
        (&cc.stall_timeout, "client.stall_timeout"),
    ] {
        // A default longer than a shorter request timeout is simply capped by it.
        if v.pos.is_some() && **v > *cc.request_timeout {
            c.err(
                v.pos,
                format!(
                    "`{key}` ({}) is longer than `client.request_timeout` ({}), so it never applies",
                    **v, *cc.request_timeout
                ),
                Some("keep it at or below the request timeout".into()),
            );
        }
    }
    if *cc.max_event_bytes < 1024 || *cc.max_event_bytes > 64 << 20 {
        c.err(
            cc.max_event_bytes.pos,
            format!(
                "`client.max_event_bytes` is {}, must be between 1024 and 67108864",
                *cc.max_event_bytes
            ),
            None,
        );
    }

    if let Err(why) = cc.marker() {
        c.err(
            cc.marker_header.pos,
            format!("`client.marker_header` `{}`: {why}", *cc.marker_header),
            Some("write `Name: value`, e.g. `X-Canary: llm-canary`, or `\"\"` for none".into()),
        );
    }
    if cc.user.len() > 256 || cc.user.chars().any(char::is_control) {
        c.err(
            cc.user.pos,
            "`client.user` must be at most 256 characters without control characters",
            None,
        );
    }
}

fn validate_budget(c: &mut Check, b: &Budget, at: &str) {
    if let Some(n) = &b.max_inflight {
        c.range_u32(n, &format!("{at}.max_inflight"), 1, MAX_CONCURRENCY * 64);
    }
    if let Some(r) = &b.max_rps {
        c.finite_in(r, &format!("{at}.max_rps"), 0.0, MAX_RPS, true);
    }
    if let Some(t) = &b.max_output_tokens_per_hour
        && **t == 0
    {
        c.err(
            t.pos,
            format!("`{at}.max_output_tokens_per_hour` is 0: no request could be sent"),
            Some("give a positive number of tokens, or leave the key out for no limit".into()),
        );
    }
}

/// `schedule.active`: windows that compile, one of them long enough for the longest step.
fn validate_active_windows(c: &mut Check, cfg: &Config, active: &ActiveWindows) {
    match active.compile() {
        Err(diags) => c.diags.extend(diags),
        Ok(set) => {
            // A step starts only when the window outlasts it (warmup, steady, drain).
            let longest_step = cfg
                .cycle_plan()
                .iter()
                .filter(|(_, steps, _)| *steps > 0)
                .map(|(_, steps, total)| *total / *steps as u32)
                .max()
                .unwrap_or_default()
                + cfg.schedule.drain_grace.0;
            let longest_window = set
                .windows
                .iter()
                .map(|w| std::time::Duration::from_secs(u64::from(w.length_minutes()) * 60))
                .max()
                .unwrap_or_default();
            let touching = set.windows.len() > 1;
            if longest_window < longest_step && !touching {
                c.err(
                    active.time_zone.pos,
                    format!(
                        "no window of `schedule.active` is as long as the longest step with its drain ({}): no step would ever start",
                        Dur(longest_step)
                    ),
                    Some("lengthen a window, or shorten the steps (`step`, `duration`, `time_scale`)".into()),
                );
            }
        }
    }
}

fn validate_schedule(c: &mut Check, cfg: &Config) {
    let s = &cfg.schedule;
    if let Some(active) = &s.active {
        validate_active_windows(c, cfg, active);
    }
    for name in &s.cycle {
        if !WORKLOAD_NAMES.contains(&name.as_str()) {
            let hint = did_you_mean(name, WORKLOAD_NAMES)
                .map(|b| format!("did you mean `{b}`?"))
                .unwrap_or_else(|| format!("expected one of {}", WORKLOAD_NAMES.join(", ")));
            c.err(
                name.pos,
                format!("unknown workload `{}` in `schedule.cycle`", **name),
                Some(hint),
            );
        } else if !cfg.workloads.is_configured(name) {
            c.err(
                name.pos,
                format!(
                    "`schedule.cycle` names `{}` but `workloads` does not configure it",
                    **name
                ),
                Some(format!("add `{}:` under `workloads`", **name)),
            );
        }
    }
    c.positive_dur(&s.max_lag_p99, "schedule.max_lag_p99");
    if *s.drain_grace > Dur::secs(3600) {
        c.err(
            s.drain_grace.pos,
            "`schedule.drain_grace` is longer than an hour",
            None,
        );
    }
}

/// Labels the generated alerts set themselves; a config may not override them.
const RESERVED_ALERT_LABELS: [&str; 4] = ["alertname", "slo", "severity", "__name__"];

fn alert_labels(c: &mut Check, labels: &std::collections::BTreeMap<String, At<String>>, at: &str) {
    for (name, value) in labels {
        let valid = name.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !valid || name.starts_with("__") {
            c.err(
                value.pos,
                format!("`{at}.{name}` is not a Prometheus label name"),
                Some("letters, digits and `_`, not starting with a digit or `__`".into()),
            );
        } else if RESERVED_ALERT_LABELS.contains(&name.as_str()) {
            c.err(
                value.pos,
                format!("`{at}.{name}` is set by the generated rules"),
                Some(
                    "use the SLO's `severity` for severity; `slo` and `alertname` are fixed".into(),
                ),
            );
        }
    }
}

/// A burn-rate SLO: its SLI, a period no shorter than the window, an objective below 100 %, and
/// every request counted.
fn validate_burn_rate(c: &mut Check, s: &SloConfig, sli: &At<String>, obj: &At<f64>) {
    if sli.trim().is_empty() {
        c.err(sli.pos, "`sli` is empty", None);
    }
    if let Some(p) = &s.period
        && **p < *s.window
    {
        c.err(
            p.pos,
            format!(
                "`period` ({}) is shorter than `window` ({})",
                **p, *s.window
            ),
            None,
        );
    }
    c.finite_in(obj, "objective", 0.0, 100.0, true);
    if **obj >= 100.0 {
        c.err(
            obj.pos,
            "an objective of 100 % leaves no error budget",
            Some("use e.g. 99.0".into()),
        );
    }
    if let Some(p) = &s.period {
        c.positive_dur(p, "period");
    }
    if *s.saturated_steps != SaturatedSteps::Include {
        c.err(
            s.saturated_steps.pos,
            "a burn-rate SLO counts every request against its budget: \
             `saturated_steps` applies to `expr` SLOs",
            Some("remove it, or write the SLO as an `expr`".into()),
        );
    }
}

fn validate_slos(c: &mut Check, cfg: &Config) {
    alert_labels(c, &cfg.alerting.labels, "alerting.labels");
    if let Some(base) = &cfg.alerting.runbook_base_url
        && url::Url::parse(base).is_err()
    {
        c.err(
            base.pos,
            format!("`alerting.runbook_base_url` `{}` is not a URL", **base),
            Some("e.g. https://wiki.example.com/llm-canary/".into()),
        );
    }
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for s in &cfg.slos {
        c.label_safe_name(&s.name, "SLO name");
        alert_labels(c, &s.labels, "labels");
        if seen.insert(s.name.as_str(), ()).is_some() {
            c.err(
                s.name.pos,
                format!("duplicate SLO name `{}`", *s.name),
                None,
            );
        }
        match (&s.expr, &s.sli, &s.objective) {
            (Some(e), None, None) => {
                if e.trim().is_empty() {
                    c.err(e.pos, "`expr` is empty", None);
                }
            }
            (None, Some(sli), Some(obj)) => {
                validate_burn_rate(c, s, sli, obj);
            }
            _ => c.err(
                s.name.pos,
                format!("SLO `{}` needs either `expr` or both `sli` and `objective`", *s.name),
                Some("`expr` compares values; `sli` + `objective` (+ `period`) define a burn-rate SLO".into()),
            ),
        }
        c.positive_dur(&s.window, "window");
        if *s.min_samples == 0 {
            c.err(s.min_samples.pos, "`min_samples` must be at least 1", None);
        }
    }
}

/// The HTTP surface (listen address, lifecycle token) and the OTLP push.
fn validate_export(c: &mut Check, ex: &Export, base_dir: &Path) {
    if ex.listen.parse::<SocketAddr>().is_err() {
        c.err(
            ex.listen.pos,
            format!("`export.listen` `{}` is not an address", *ex.listen),
            Some("write IP:PORT, e.g. `127.0.0.1:9464` or `0.0.0.0:9464`".into()),
        );
    }
    c.positive_dur(
        &ex.server_metrics_interval,
        "export.server_metrics_interval",
    );
    if let Some(file) = &ex.lifecycle_token_file {
        if !ex.lifecycle {
            c.err(
                file.pos,
                "`export.lifecycle_token_file` is set but `export.lifecycle` is false: the token guards nothing",
                Some("set `export.lifecycle: true` to serve reload, pause and resume with the token".into()),
            );
        } else {
            match read_token(&base_dir.join(file.as_str())) {
                Ok(_) => {}
                Err(why) => c.err(
                    file.pos,
                    format!("`export.lifecycle_token_file` `{}`: {why}", **file),
                    Some("mount the Secret holding the token there (the chart's `lifecycle.tokenSecret`)".into()),
                ),
            }
        }
    }
    if let Some(o) = &ex.otlp {
        validate_otlp(c, o);
    }
}

fn validate_otlp(c: &mut Check, o: &Otlp) {
    c.url(&o.endpoint, "export.otlp.endpoint");
    c.positive_dur(&o.interval, "export.otlp.interval");
    if *o.protocol == OtlpProtocol::Grpc {
        let pos = o.protocol.pos.or(o.endpoint.pos);
        if !cfg!(feature = "otlp-grpc") {
            c.err(
                pos,
                "`export.otlp.protocol` is grpc, but this binary was built without the \
                 `otlp-grpc` feature",
                Some(
                    "use `protocol: http/protobuf` (a collector's port 4318), or build with \
                     `cargo build --release --features otlp-grpc`"
                        .into(),
                ),
            );
        } else if o.endpoint.starts_with("https:") {
            c.err(
                o.endpoint.pos,
                "`export.otlp.endpoint` is HTTPS, but OTLP over gRPC is plaintext only in this \
                 build",
                Some(
                    "use `protocol: http/protobuf`, which speaks HTTPS, or a plaintext \
                     `http://` gRPC endpoint"
                        .into(),
                ),
            );
        }
    }
}

/// One cycle of the plan within [`MAX_CYCLE`].
fn validate_cycle_length(c: &mut Check, cfg: &Config) {
    let cycle = cfg.cycle_upper_bound();
    if cycle > MAX_CYCLE {
        let w = &cfg.workloads;
        let pos = [
            w.concurrency_sweep
                .as_ref()
                .and_then(|s| s.step.pos.or(s.levels.pos)),
            w.multi_turn.as_ref().and_then(|m| m.duration.pos),
            w.sequence_distribution.as_ref().and_then(|d| d.step.pos),
            w.prefix_cache
                .as_ref()
                .and_then(|p| p.step.pos.or(p.hit_ratios.pos)),
        ]
        .into_iter()
        .flatten()
        .next();
        c.err(
            pos,
            format!(
                "one cycle of this plan takes up to {} h, longer than the {} h accepted",
                cycle.as_secs() / 3600,
                MAX_CYCLE.as_secs() / 3600
            ),
            Some("an always-on canary needs its verdicts more often: shorten the steps or use fewer of them".into()),
        );
    }
}
