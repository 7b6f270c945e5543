//! What a run is set up from: one config file (or the embedded demo) parsed and validated
//! completely, its SLOs compiled once against the label values the config can produce, and the
//! folder its relative paths resolve against. Every command loads its config here, so no other
//! place reads a config file or compiles an SLO, and a reload swaps one `Setup` for another.

use std::path::{Path, PathBuf};

use std::time::Duration;

use crate::config::{self, Config, ConfigError};
use crate::measure::stats::Z_95;
use crate::request::PROBE_WORKLOAD;
use crate::sim::estimate::StepShape;
use crate::slo::ast::{MatchOp, Selector};
use crate::slo::{LabelDomain, SloDef, SloKind};

/// A validated config and its compiled SLOs.
#[derive(Debug, Clone)]
pub struct Setup {
    pub config: Config,
    /// The config's SLOs, compiled, in the config's order.
    pub slos: Vec<SloDef>,
    /// The label values the config's workloads and targets produce (SLO selectors match these).
    pub domain: LabelDomain,
    /// The file it came from; `None` for the embedded demo.
    pub path: Option<PathBuf>,
    /// What the config does that works but may not be what was meant, each at its place
    /// (`check` prints them, `run` logs them).
    pub warnings: Vec<config::Diagnostic>,
    /// The file's name in messages.
    file: String,
}

impl Setup {
    /// Reads, parses and validates `path`, SLO expressions included; every problem is reported
    /// together, each at its line and column.
    pub fn load(path: &Path) -> Result<Setup, ConfigError> {
        let text = config::read_file(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut setup = Setup::parse(&text, &path.display().to_string(), base)?;
        setup.path = Some(path.to_owned());
        Ok(setup)
    }

    /// The embedded demo (`examples/demo.yaml`, compiled in).
    pub fn demo() -> Setup {
        Setup::parse(config::DEMO_YAML, "<embedded demo.yaml>", Path::new("."))
            .expect("the embedded demo config is valid (tested)")
    }

    /// Parses and validates `text`; `file` names it in messages, `base_dir` resolves relative
    /// paths. The result has no path: [`Setup::load`] sets it.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Setup, ConfigError> {
        let cfg = Config::parse_checked(text, file, base_dir, |cfg| {
            crate::slo::diagnostics(cfg, &LabelDomain::of(cfg))
        })?;
        Setup::compiled(cfg, None, file, base_dir)
    }

    /// The same setup with `cfg` in place of its config (the bench's `--workload` and
    /// `--time-scale` overrides); the SLOs are compiled again against it.
    pub fn with_config(self, cfg: Config) -> Result<Setup, ConfigError> {
        let file = self.label();
        let base_dir = self.base_dir().to_owned();
        Setup::compiled(cfg, self.path, &file, &base_dir)
    }

    fn compiled(
        cfg: Config,
        path: Option<PathBuf>,
        file: &str,
        base_dir: &Path,
    ) -> Result<Setup, ConfigError> {
        let domain = LabelDomain::of(&cfg);
        // Validation compiled every expression already; an error here is a definition problem
        // that has no single position.
        let slos = crate::slo::compile_all(&cfg).map_err(|e| ConfigError::Invalid {
            file: file.to_owned(),
            diagnostics: vec![config::Diagnostic::new(None, e.to_string())],
        })?;
        let mut warnings = window_warnings(&cfg);
        warnings.extend(probe_warnings(&cfg, &slos));
        warnings.extend(quantile_warnings(&cfg, &slos));
        warnings.extend(drain_warnings(&cfg));
        warnings.extend(trace_warnings(&cfg, base_dir));
        warnings.extend(dataset_warnings(&cfg));
        Ok(Setup {
            config: cfg,
            slos,
            domain,
            path,
            warnings,
            file: file.to_owned(),
        })
    }

    /// The warnings as `FILE:LINE:COL: warning: …` lines.
    pub fn warning_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for w in &self.warnings {
            let err = ConfigError::Invalid {
                file: self.file.clone(),
                diagnostics: vec![w.clone()],
            };
            out.push(err.to_string());
        }
        out
    }

    /// The folder relative paths in the config (tokenizer, key files, CA files) resolve against.
    pub fn base_dir(&self) -> &Path {
        self.path
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."))
    }

    /// Where the config came from, for messages and reports: its path or `<embedded demo>`.
    pub fn label(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "<embedded demo>".to_owned(),
        }
    }

    /// What the generated rules need of the config besides its SLOs: the routing labels, where
    /// runbooks live, and how long a cycle takes.
    pub fn rules_options(&self) -> crate::slo::rules::RulesOptions {
        let a = &self.config.alerting;
        crate::slo::rules::RulesOptions {
            labels: a
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.value.clone()))
                .collect(),
            runbook_base_url: a.runbook_base_url.as_ref().map(|u| u.value.clone()),
            cycle: self.config.cycle_upper_bound(),
            resolution: self.config.export.resolution,
        }
    }

    /// Every latency threshold of the SLOs, sorted and without duplicates: each becomes an exact
    /// histogram bucket bound, so the generated rules' `le` selectors hit a bucket.
    pub fn latency_thresholds(&self) -> Vec<f64> {
        let mut out = Vec::new();
        for def in &self.slos {
            def.latency_thresholds(&mut out);
        }
        out.sort_by(f64::total_cmp);
        out.dedup();
        out
    }
}

/// An SLO window shorter than the cycle cannot see every step once per cycle: between a step's
/// runs the SLO reads its latest run, held (see docs/SLO.md "Verdicts across the cycle"). That
/// keeps the verdict steady, but it is worth saying: such a window never averages a cycle.
fn window_warnings(cfg: &Config) -> Vec<config::Diagnostic> {
    let cycle = cfg.cycle_upper_bound();
    let mut out = Vec::new();
    for s in &cfg.slos {
        if s.window.0 >= cycle {
            continue;
        }
        let pos = s.window.pos.or(s.name.pos);
        let minutes = |d: std::time::Duration| (d.as_secs_f64() / 60.0).ceil() as u64;
        out.push(
            config::Diagnostic::new(
                pos,
                format!(
                    "warning: SLO `{}`: window {} is shorter than the cycle (up to {} min): between the runs of a step it selects, the SLO reads that step's latest run, held until the next",
                    *s.name,
                    config::duration::format(s.window.0),
                    minutes(cycle)
                ),
            )
            .hint(format!(
                "a window of at least {}m covers a whole cycle; see docs/SLO.md, verdicts across the cycle",
                minutes(cycle)
            )),
        );
    }
    out
}

/// A quantile's interval is bounded on both sides only from a number of samples on (p99: 368):
/// below it, the SLO can fail but never pass. `min_samples` under that number lets the SLO read
/// such data without a word, so say it here (the held runs a tail quantile pools reach it in
/// time; docs/SLO.md, "Run-to-run variation").
fn quantile_warnings(cfg: &Config, slos: &[SloDef]) -> Vec<config::Diagnostic> {
    let mut out = Vec::new();
    for (s, def) in cfg.slos.iter().zip(slos) {
        for pct in def.quantiles() {
            let Some(need) = crate::measure::stats::samples_to_bound(pct / 100.0) else {
                continue;
            };
            if need <= def.min_samples {
                continue;
            }
            let pos = s.min_samples.pos.or(s.name.pos);
            let name = format!("p{pct}");
            out.push(
                config::Diagnostic::new(
                    pos,
                    format!(
                        "warning: SLO `{}`: {name} has a bounded 95 % interval from {need} samples on; with min_samples {} it reads fewer, and until its window (with the runs it pools) holds {need} it can fail but not pass",
                        *s.name, def.min_samples
                    ),
                )
                .hint(format!("set min_samples: {need}, or read a lower quantile")),
            );
        }
    }
    out
}

/// An SLO that reads only the probe stream sees one request per target and probe interval. A
/// window that holds fewer than the SLO needs (`min_samples`, and for a burn-rate SLO the
/// requests without which a clear pass is impossible at its objective) leaves it
/// `insufficient_data` for good, or unable ever to pass: said here, where the numbers are known.
fn probe_warnings(cfg: &Config, slos: &[SloDef]) -> Vec<config::Diagnostic> {
    let probe_only = |sel: &&Selector| {
        sel.matchers
            .iter()
            .any(|m| m.label == "workload" && m.op == MatchOp::Eq && m.value == PROBE_WORKLOAD)
    };
    let mut out = Vec::new();
    for (s, def) in cfg.slos.iter().zip(slos) {
        let selectors = def.selectors();
        if selectors.is_empty() || !selectors.iter().all(probe_only) {
            continue;
        }
        let pos = s.window.pos.or(s.name.pos);
        let probe = &cfg.probe_stream;
        if !probe.enabled {
            out.push(config::Diagnostic::new(
                s.name.pos,
                format!("warning: SLO `{}` reads only the probe stream, which `probe_stream.enabled: false` turns off", def.name),
            ).hint("enable the probe stream, or select the steps' requests"));
            continue;
        }
        // The static targets every selector accepts by name and serving mode (discovered ones
        // are not known here: then one).
        let targets = cfg
            .targets
            .iter()
            .filter(|t| {
                selectors.iter().all(|sel| {
                    sel.matchers.iter().all(|m| match m.label.as_str() {
                        "target" => crate::slo::matcher_accepts(m, &t.name),
                        "serving_mode" => crate::slo::matcher_accepts(m, t.serving_mode.as_str()),
                        _ => true,
                    })
                })
            })
            .count()
            .max(1) as u64;
        let interval = probe.interval.0.as_secs_f64();
        let in_window = (def.window.as_secs_f64() / interval).floor() as u64 * targets;
        let pass = match def.kind {
            // With no bad request at all, the Wilson interval's upper end is z²/(n + z²): under
            // the budget b only once n > z²(1 − b)/b.
            SloKind::BurnRate { objective, .. } if objective < 100.0 => {
                let budget = (100.0 - objective) / 100.0;
                Some((
                    objective,
                    (Z_95 * Z_95 * (1.0 - budget) / budget).floor() as u64 + 1,
                ))
            }
            _ => None,
        };
        let (needed, why) = match pass {
            _ if in_window < def.min_samples => (
                def.min_samples,
                format!(
                    "`min_samples` is {}, so it stays insufficient_data",
                    def.min_samples
                ),
            ),
            Some((objective, n)) if in_window < n => (
                n,
                format!(
                    "a clear pass at {objective} % needs {n}, so it can never pass (it holds insufficient_data until a clear fail)"
                ),
            ),
            _ => continue,
        };
        let window =
            std::time::Duration::from_secs_f64((needed as f64 / targets as f64).ceil() * interval);
        out.push(
            config::Diagnostic::new(
                pos,
                format!(
                    "warning: SLO `{}` reads only the probe stream: its window {} holds {in_window} probes ({targets} target(s), one each every {}), and {why}",
                    def.name,
                    config::duration::format(def.window),
                    config::duration::format(probe.interval.0),
                ),
            )
            .hint(format!(
                "a window of at least {} holds {needed}; or a shorter `probe_stream.interval`",
                config::duration::format(window)
            )),
        );
    }
    out
}

/// A workload, the longest request of its steps as `sim::estimate` reads it, and where the config
/// writes its output length.
type WorkloadShape = (&'static str, StepShape, Option<(u64, u64)>);

/// The [`WorkloadShape`] of every workload of the cycle whose lengths the config states.
fn step_shapes(cfg: &Config) -> Vec<WorkloadShape> {
    let w = &cfg.workloads;
    let streams = |rate: &Option<config::Rate>, closed: u32| {
        rate.as_ref().map_or(closed, |r| *r.max_inflight)
    };
    let mut out = Vec::new();
    for name in cfg.cycle() {
        let shape = match name {
            "concurrency_sweep" => w.concurrency_sweep.as_ref().map(|s| {
                let top = s.levels.iter().copied().max().unwrap_or(1);
                (
                    shape(*s.isl, *s.osl, streams(&s.rate, top), *s.isl + *s.osl / 2),
                    s.osl.pos,
                )
            }),
            // The last turn resends every earlier exchange.
            "multi_turn" => w.multi_turn.as_ref().map(|m| {
                let exchange = *m.isl + *m.osl;
                let isl = *m.turns * exchange - *m.osl;
                let held = (*m.turns).div_ceil(2) * exchange;
                (shape(isl, *m.osl, *m.conversations, held), m.osl.pos)
            }),
            "sequence_distribution" => w.sequence_distribution.as_ref().map(|d| {
                let held = (*d.isl.min + *d.isl.max) / 2 + (*d.osl.min + *d.osl.max) / 4;
                let top = streams(&d.rate, *d.concurrency);
                (shape(*d.isl.max, *d.osl.max, top, held), d.osl.max.pos)
            }),
            "prefix_cache" => w.prefix_cache.as_ref().map(|p| {
                let top = streams(&p.rate, *p.concurrency);
                (shape(*p.isl, *p.osl, top, *p.isl + *p.osl / 2), p.osl.pos)
            }),
            // A trace's and a dataset's lengths are their rows': not estimated.
            _ => None,
        };
        if let Some((shape, pos)) = shape {
            out.push((name, shape, pos));
        }
    }
    out
}

fn shape(isl: u32, osl: u32, streams: u32, held_tokens: u32) -> StepShape {
    StepShape {
        isl,
        osl,
        streams,
        held_tokens,
    }
}

/// How long the longest request of `shape` takes on target `t`, and on what the estimate rests:
/// a simulated target's timing model; for a real one the slowest request its `goodput` limits
/// still call good, where the config writes them (the defaults are the plan's objectives, not
/// a statement about the deployment, so they are no estimate).
fn request_time(
    cfg: &Config,
    t: &config::TargetConfig,
    shape: StepShape,
) -> Option<(Duration, String)> {
    if let Some(sim) = &t.simulated {
        let time = crate::sim::estimate::request_time(sim, t.serving_mode, shape, None)?;
        return Some((
            time,
            format!("the simulator's timing model, {} streams", shape.streams),
        ));
    }
    let goodput = t.goodput.as_ref().or_else(|| {
        let g = &cfg.goodput;
        (g.ttft.pos.is_some() || g.itl.pos.is_some()).then_some(g)
    })?;
    let (ttft, itl) = (goodput.ttft.0, goodput.itl.0);
    let time = ttft + itl * shape.osl.saturating_sub(1);
    let why = format!(
        "within `goodput` (TTFT {}, ITL {})",
        config::duration::format(ttft),
        config::duration::format(itl)
    );
    Some((time, why))
}

/// A trace whose long quiet gaps loading compresses (`workload::trace::QuietGap`) replays
/// another timeline than the file's: said at the trace's `path`, each gap. A trace that does
/// not load is validation's error, not a warning.
fn trace_warnings(cfg: &Config, base_dir: &Path) -> Vec<config::Diagnostic> {
    let Some(replay) = &cfg.workloads.trace_replay else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in &replay.traces {
        let path = base_dir.join(t.path.as_str());
        let Ok(trace) = crate::workload::trace::Trace::load_any(&path, t.format, *t.block_size)
        else {
            continue;
        };
        for gap in &trace.quiet_gaps {
            out.push(
                config::Diagnostic::new(t.path.pos, format!("warning: trace `{}`: {gap}", *t.name))
                    .hint("see docs/METRICS.md, \"Trace replay\""),
            );
        }
    }
    out
}

/// A dataset's rows its filters dropped and turns they cut, counted from the reading validation
/// made (the file is not read again), and a dataset measured without the model's tokenizer: said
/// at the dataset's `path`. A dataset that does not load is validation's error, not a warning.
fn dataset_warnings(cfg: &Config) -> Vec<config::Diagnostic> {
    let Some(d) = &cfg.workloads.dataset else {
        return Vec::new();
    };
    let hint = || "see docs/METRICS.md, \"Datasets\"";
    let mut out = Vec::new();
    if cfg.tokenizer.is_none() {
        out.push(
            config::Diagnostic::new(
                d.path.pos,
                format!(
                    "warning: dataset `{}`: no `tokenizer` is configured, so its prompts' ISL is the built-in approximation's count, not the model's",
                    *d.path
                ),
            )
            .hint("set `tokenizer:` to the served model's tokenizer.json or its model directory"),
        );
    }
    let reading = crate::workload::dataset::Dataset::kept_reading(
        Path::new(d.path.as_str()),
        d.format,
        &d.selection(cfg.seed),
    );
    if let Some(r) = reading.map(|r| r.report)
        && r.outside_isl + r.without_turn + r.turns_cut > 0
    {
        out.push(
            config::Diagnostic::new(d.path.pos, format!("warning: dataset `{}`: {r}", *d.path))
                .hint(hint()),
        );
    }
    out
}

/// A drain grace shorter than the requests a step sends cuts them at every step's end, and each
/// counts as a `timeout` (docs/METRICS.md, "Steps and windows"): said per workload, for the target whose
/// longest request takes longest, where the estimate is known (`request_time`).
fn drain_warnings(cfg: &Config) -> Vec<config::Diagnostic> {
    let drain = cfg.schedule.drain_grace.0;
    let mut out = Vec::new();
    for (workload, shape, osl_pos) in step_shapes(cfg) {
        let slowest = cfg
            .targets
            .iter()
            .filter_map(|t| Some((t, request_time(cfg, t, shape)?)))
            .max_by_key(|(_, (time, _))| *time);
        let Some((target, (time, why))) = slowest.filter(|(_, (time, _))| *time > drain) else {
            continue;
        };
        let secs = |d: Duration| {
            config::duration::format(Duration::from_secs(d.as_secs_f64().ceil() as u64))
        };
        out.push(
            config::Diagnostic::new(
                cfg.schedule.drain_grace.pos.or(osl_pos),
                format!(
                    "warning: `schedule.drain_grace` ({}) is shorter than the slowest request of `{workload}` on `{}`: about {} (up to {} output tokens; {why}): requests still in flight when a step ends count as `timeout`, and may mark the step faulted",
                    config::duration::format(drain),
                    *target.name,
                    secs(time),
                    shape.osl,
                ),
            )
            .hint(format!(
                "a drain_grace of at least {} covers it with a tenth to spare (requests under load take longer); see docs/METRICS.md, \"Steps and windows\"",
                secs(time.mul_f64(1.1))
            )),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_expression_errors_come_with_the_config_errors_at_their_columns() {
        let text = "targets:\n  - { name: a, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }\n\
                    time_scale: 0\n\
                    slos:\n  - name: x\n    expr: p99(ttft) < 2 parsecs\n";
        let err = Setup::parse(text, "t.yaml", Path::new(".")).unwrap_err();
        let rendered = err.to_string();
        assert_eq!(err.diagnostics().len(), 2, "{rendered}");
        assert!(rendered.contains("t.yaml:3:"), "{rendered}");
        assert!(rendered.contains("t.yaml:6:"), "{rendered}");
    }

    #[test]
    fn a_window_shorter_than_the_cycle_is_a_warning_at_its_place() {
        let text = "targets:\n  - { name: a, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }\n\
                    workloads:\n  concurrency_sweep: { levels: [1, 2], step: 10m }\n\
                    slos:\n  - name: x\n    expr: p50(ttft) < 2s\n    window: 5m\n\
                    \x20 - name: y\n    expr: p50(ttft) < 2s\n    window: 30m\n";
        let setup = Setup::parse(text, "t.yaml", Path::new(".")).unwrap();
        let lines = setup.warning_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("t.yaml:8:13: warning: SLO `x`"),
            "{lines:?}"
        );
        assert!(lines[0].contains("window 5m") && lines[0].contains("cycle (up to 21 min)"));
    }

    /// The probe-stream warnings of a config with two targets, a cycle of one minute (so no
    /// window is shorter than it) and `slos`.
    fn probe_warning_lines(probe: &str, slos: &str) -> Vec<String> {
        let text = format!(
            "targets:\n  - {{ name: a, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }}\n\
             \x20 - {{ name: b, serving_mode: disaggregated, url: \"http://127.0.0.1:2\" }}\n\
             workloads:\n  concurrency_sweep: {{ levels: [1], step: 1m }}\n\
             probe_stream: {probe}\nslos:\n{slos}"
        );
        // The probe stream's warnings only (a p99 also draws the quantile's).
        Setup::parse(&text, "t.yaml", Path::new("."))
            .unwrap()
            .warning_lines()
            .into_iter()
            .filter(|l| l.contains("probe"))
            .collect()
    }

    #[test]
    fn an_slo_over_the_probe_stream_that_cannot_reach_a_verdict_is_a_warning() {
        let burn = |window: &str, sel: &str| {
            format!(
                "  - name: avail\n    objective: 99.0\n    sli: ttft{{workload=\"probe\"{sel}}} < 2s\n    window: {window}\n"
            )
        };
        // 1 h holds 180 probes per target, 360 of both; a clear pass at 99 % needs 381.
        let lines = probe_warning_lines("{}", &burn("1h", ""));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("t.yaml:11:13: warning: SLO `avail` reads only the probe stream"),
            "{lines:?}"
        );
        assert!(
            lines[0].contains("holds 360 probes (2 target(s), one each every 20s)")
                && lines[0].contains("a clear pass at 99 % needs 381, so it can never pass")
                && lines[0].contains("a window of at least 1h 3m 40s holds 381"),
            "{lines:?}"
        );
        // 6 h holds enough; so does 1 h at a probe every 5 s.
        assert_eq!(
            probe_warning_lines("{}", &burn("6h", "")),
            Vec::<String>::new()
        );
        assert_eq!(
            probe_warning_lines("{ interval: 5s }", &burn("1h", "")),
            Vec::<String>::new()
        );
        // One target selected: half the probes.
        let lines = probe_warning_lines("{ interval: 5s }", &burn("30m", ", target=\"a\""));
        assert!(
            lines.len() == 1 && lines[0].contains("holds 360 probes (1 target(s)"),
            "{lines:?}"
        );
        // Fewer than `min_samples` in the window.
        let expr = "  - name: p99\n    expr: p99(ttft{workload=\"probe\"}) < 2s\n    window: 10m\n    min_samples: 100\n";
        let lines = probe_warning_lines("{}", expr);
        assert!(
            lines.len() == 1
                && lines[0].contains("holds 60 probes")
                && lines[0].contains("`min_samples` is 100, so it stays insufficient_data"),
            "{lines:?}"
        );
        // Steps' requests too: no warning.
        let steps =
            "  - name: p99\n    expr: p99(ttft) < 2s\n    window: 10m\n    min_samples: 100\n";
        assert_eq!(probe_warning_lines("{}", steps), Vec::<String>::new());
        // The probe stream off.
        let lines = probe_warning_lines("{ enabled: false }", &burn("6h", ""));
        assert!(
            lines.len() == 1 && lines[0].contains("turns off"),
            "{lines:?}"
        );
    }

    /// The drain warnings of two targets (a simulated disaggregated deployment as the demo's,
    /// and one with a URL) with `extra` appended to the config.
    fn drain_warning_lines(extra: &str) -> Vec<String> {
        let text = format!(
            "targets:\n\
             \x20 - name: sim-disagg\n    serving_mode: disaggregated\n\
             \x20   simulated: {{ prefill_workers: 4, decode_workers: 4, prefill: {{ gpu: a100, tp: 4 }}, decode: {{ gpu: l40s, tp: 2 }} }}\n\
             \x20 - {{ name: real, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }}\n\
             workloads:\n\
             \x20 concurrency_sweep: {{ levels: [1, 64], isl: 1024, osl: 512, step: 20m }}\n\
             \x20 sequence_distribution: {{ isl: {{ min: 128, max: 4096 }}, osl: {{ min: 64, max: 2048 }}, concurrency: 16, step: 20m }}\n\
             {extra}"
        );
        Setup::parse(&text, "t.yaml", Path::new("."))
            .unwrap()
            .warning_lines()
            .into_iter()
            .filter(|l| l.contains("drain_grace"))
            .collect()
    }

    #[test]
    fn a_traces_long_quiet_gap_is_a_warning_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut rows: Vec<u64> = vec![0, 100, 200];
        rows.extend((0..20).map(|i| 33_200 + i * 200));
        let text: String = rows
            .iter()
            .map(|t| {
                format!("{{\"timestamp\": {t}, \"input_length\": 16, \"output_length\": 1}}\n")
            })
            .collect();
        std::fs::write(dir.path().join("gap.jsonl"), text).unwrap();
        let config = "targets:\n  - { name: real, serving_mode: aggregated, url: \"http://127.0.0.1:1\" }\n\
                      workloads:\n  trace_replay:\n    traces: [{ name: gap, path: gap.jsonl, block_size: 16 }]\n";
        let lines = Setup::parse(config, "t.yaml", dir.path())
            .unwrap()
            .warning_lines();
        let gaps: Vec<&String> = lines.iter().filter(|l| l.contains("trace `gap`")).collect();
        assert_eq!(gaps.len(), 1, "{lines:?}");
        assert!(
            gaps[0].starts_with("t.yaml:5:") && gaps[0].contains(": warning: trace `gap`: 33.0 s without a request after its first 3 request(s) (at 0.2 s) is replayed as 0.200 s"),
            "{gaps:?}"
        );
    }

    #[test]
    fn a_drain_grace_shorter_than_a_steps_slowest_request_is_a_warning_at_its_place() {
        // The default 30 s covers the sweep (about 10 s at 64 streams on L40S decode), not the
        // distribution's 2,048-token answers (about 38 s); the key is not written, so the
        // warning points at the output length that needs it.
        let lines = drain_warning_lines("");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("t.yaml:8:") && lines[0].contains(": warning: `schedule.drain_grace` (30s) is shorter than the slowest request of `sequence_distribution` on `sim-disagg`: about 3"),
            "{lines:?}"
        );
        assert!(
            lines[0]
                .contains("(up to 2048 output tokens; the simulator's timing model, 16 streams)")
                && lines[0].contains("count as `timeout`")
                && lines[0].contains("hint: a drain_grace of at least 4"),
            "{lines:?}"
        );
        // 10 s: the sweep too, at the key's own place.
        let lines = drain_warning_lines("schedule: { drain_grace: 10s }\n");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with("t.yaml:9:26: warning: `schedule.drain_grace` (10s)")
                && lines[0].contains("`concurrency_sweep` on `sim-disagg`: about 11s"),
            "{lines:?}"
        );
        // Long enough: nothing to say.
        assert_eq!(
            drain_warning_lines("schedule: { drain_grace: 45s }\n"),
            Vec::<String>::new()
        );
        // A target with a URL is estimated from a `goodput` the config writes: 2,048 tokens at
        // 50 ms are 104 s.
        let lines = drain_warning_lines("schedule: { drain_grace: 45s }\ngoodput: { itl: 50ms }\n");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("`sequence_distribution` on `real`: about 1m 45s (up to 2048 output tokens; within `goodput` (TTFT 2s, ITL 50ms))"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_demo_compiles_its_slos_once_with_their_thresholds() {
        let demo = Setup::demo();
        assert_eq!(demo.slos.len(), demo.config.slos.len());
        assert!(!demo.slos.is_empty());
        let t = demo.latency_thresholds();
        assert!(t.windows(2).all(|w| w[0] < w[1]), "{t:?}");
        assert_eq!(demo.label(), "<embedded demo>");
        assert!(demo.warnings.is_empty(), "{:?}", demo.warning_lines());
        assert_eq!(demo.base_dir(), Path::new("."));
    }
}
