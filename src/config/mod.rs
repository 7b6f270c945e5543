//! The configuration: typed schema, strict parsing with source locations, validation that reports
//! every error as `FILE:LINE:COL: message`, and the defaults of the benchmark plan (docs/DESIGN.md §11).
//!
//! A file that is not a config at all (empty, binary, a list, a trace, a page of text) is one
//! problem saying so (`shape`). A config has every problem reported together: an entry that
//! cannot be read (a misspelt key, a wrong type, a repeated key) is reported and left out so the
//! rest is read (`read`), and what was read is then checked value by value.

mod at;
mod check;
mod check_dataset;
pub mod duration;
mod error;
mod limits;
mod outline;
mod read;
mod request;
mod schema;
mod shape;
pub mod sim;
mod summary;
mod target;
mod validate;
mod validate_workloads;
mod windows;
mod workloads;

use std::path::Path;

pub use at::{At, Dur};
pub use error::{ConfigError, Diagnostic, did_you_mean};
pub use limits::{MAX_CONCURRENCY, MAX_ISL, MAX_OSL, MAX_TIME_SCALE, MIN_SCALED_STEP};
pub use request::{
    ExtraBody, Headers, OWNED_BODY_FIELDS, OWNED_HEADERS, OWNED_NVEXT_FIELDS, RequestOptions,
    owned_body_field, owned_header, owned_nvext_field,
};
pub use schema::*;
pub use target::{Api, Dialect, LengthControl, MASK, ServingMode, display_url, display_url_text};
pub use validate::{TokenError, read_token};
pub use windows::{DAY_MINUTES, DAY_NAMES, DailyWindow, WindowSet};
pub use workloads::*;

/// The embedded demo: two simulated deployments (aggregated, disaggregated), all four workloads at
/// a compressed time scale. `llm-canary run` without `--config` runs this.
pub const DEMO_YAML: &str = include_str!("../../examples/demo.yaml");

/// Largest config file accepted; a config is a few KB, so anything near this is a mistake.
pub use crate::files::MAX_CONFIG_BYTES;

/// Reads a config file: a regular file of at most [`MAX_CONFIG_BYTES`], as UTF-8 (a device such
/// as `/dev/zero`, a FIFO or a huge file is refused, never read until memory runs out; a file
/// that is not UTF-8 is said to be so at its first byte that is not).
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    let invalid = |d: Diagnostic| ConfigError::Invalid {
        file: path.display().to_string(),
        diagnostics: vec![d],
    };
    match crate::files::read_bounded(path, MAX_CONFIG_BYTES) {
        Ok(bytes) => String::from_utf8(bytes).map_err(|e| {
            let valid = e.utf8_error().valid_up_to();
            invalid(shape::not_utf8(e.as_bytes(), valid))
        }),
        Err(crate::files::FileError::Io(source)) => Err(ConfigError::Io {
            path: path.to_owned(),
            source,
        }),
        Err(e) => Err(invalid(Diagnostic::new(None, e.to_string()))),
    }
}

impl Config {
    /// Reads, parses and validates a config file (its SLO expressions are compiled by
    /// `crate::setup`, which every command loads through).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_file(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, &path.display().to_string(), base)
    }

    /// The embedded demo config.
    pub fn demo() -> Config {
        Config::parse(DEMO_YAML, "<embedded demo.yaml>", Path::new("."))
            .expect("the embedded demo config is valid (tested)")
    }

    /// Parses and validates `text`; `file` names it in messages, `base_dir` resolves relative paths.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        Config::parse_checked(text, file, base_dir, |_| Vec::new())
    }

    /// [`Config::parse`] with `more` checks of the config read (the SLO expressions, which
    /// `crate::setup` compiles), reported with the rest. A text that is not a config at all is
    /// one problem saying so (`shape`); a config has every problem at once: the entries that
    /// could not be read (each left out so the rest is read, `read`), then what validation finds
    /// in the rest.
    pub fn parse_checked(
        text: &str,
        file: &str,
        base_dir: &Path,
        more: impl FnOnce(&Config) -> Vec<Diagnostic>,
    ) -> Result<Config, ConfigError> {
        let invalid = |diagnostics| ConfigError::Invalid {
            file: file.to_owned(),
            diagnostics,
        };
        if let Some(d) = shape::not_a_config(text) {
            return Err(invalid(vec![d]));
        }
        let mut reading = read::read(text);
        let Some(mut cfg) = reading.config.take() else {
            return Err(invalid(reading.diagnostics));
        };
        let mut later = cfg.validate(base_dir);
        later.extend(more(&cfg));
        let diagnostics = reading.with(later);
        if diagnostics.is_empty() {
            cfg.resolve_paths(base_dir);
            Ok(cfg)
        } else {
            Err(invalid(diagnostics))
        }
    }

    /// Parses `text` strictly (unknown keys, wrong types) without checking the values; every
    /// entry that cannot be read is reported.
    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let invalid = |diagnostics| ConfigError::Invalid {
            file: file.to_owned(),
            diagnostics,
        };
        if let Some(d) = shape::not_a_config(text) {
            return Err(invalid(vec![d]));
        }
        let reading = read::read(text);
        match reading.config {
            Some(cfg) if reading.diagnostics.is_empty() => Ok(cfg),
            _ => Err(invalid(reading.diagnostics)),
        }
    }

    /// Every problem with the values (empty = valid); relative paths resolve against `base_dir`.
    pub fn validate(&self, base_dir: &Path) -> Vec<Diagnostic> {
        validate::validate(self, base_dir)
    }

    /// Makes the paths the schedule reads at run time (trace and dataset files) absolute, against the
    /// config's folder, so a step finds them whatever the working directory.
    pub fn resolve_paths(&mut self, base_dir: &Path) {
        if let Some(r) = &mut self.workloads.trace_replay {
            for t in &mut r.traces {
                t.path.value = base_dir.join(t.path.as_str()).display().to_string();
            }
        }
        if let Some(d) = &mut self.workloads.dataset {
            d.path.value = base_dir.join(d.path.as_str()).display().to_string();
        }
    }

    /// The workloads of one cycle, in order.
    pub fn cycle(&self) -> Vec<&'static str> {
        if self.schedule.cycle.is_empty() {
            WORKLOAD_NAMES
                .into_iter()
                .filter(|w| self.workloads.is_configured(w))
                .collect()
        } else {
            self.schedule
                .cycle
                .iter()
                .filter_map(|n| WORKLOAD_NAMES.into_iter().find(|w| *w == n.as_str()))
                .collect()
        }
    }
}
