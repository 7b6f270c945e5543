//! What a run is set up from: one config file (or the embedded demo) parsed and validated
//! completely, its SLOs compiled once against the label values the config can produce, and the
//! folder its relative paths resolve against. Every command loads its config here, so no other
//! place reads a config file or compiles an SLO, and a reload swaps one `Setup` for another.

use std::path::{Path, PathBuf};

use crate::config::{self, Config, ConfigError};
use crate::slo::{LabelDomain, SloDef};

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
        let mut cfg = Config::from_yaml(text, file)?;
        let domain = LabelDomain::of(&cfg);
        let mut diagnostics = cfg.validate(base_dir);
        diagnostics.extend(crate::slo::diagnostics(&cfg, &domain));
        if !diagnostics.is_empty() {
            return Err(ConfigError::Invalid {
                file: file.to_owned(),
                diagnostics,
            });
        }
        cfg.resolve_paths(base_dir);
        Setup::compiled(cfg, None, file)
    }

    /// The same setup with `cfg` in place of its config (the bench's `--workload` and
    /// `--time-scale` overrides); the SLOs are compiled again against it.
    pub fn with_config(self, cfg: Config) -> Result<Setup, ConfigError> {
        let file = self.label();
        Setup::compiled(cfg, self.path, &file)
    }

    fn compiled(cfg: Config, path: Option<PathBuf>, file: &str) -> Result<Setup, ConfigError> {
        let domain = LabelDomain::of(&cfg);
        // Validation compiled every expression already; an error here is a definition problem
        // that has no single position.
        let slos = crate::slo::compile_all(&cfg).map_err(|e| ConfigError::Invalid {
            file: file.to_owned(),
            diagnostics: vec![config::Diagnostic::new(None, e.to_string())],
        })?;
        let warnings = window_warnings(&cfg);
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
                    humantime::format_duration(s.window.0),
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
