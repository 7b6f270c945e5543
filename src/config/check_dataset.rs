//! The dataset workload's check: its numbers, and the file read, measured and selected as the
//! step will (docs/METRICS.md, "Datasets"), so a bad file or row is reported by `check` with
//! the file's line or array index, and never starts traffic.

use std::path::Path;

use super::check::Check;
use super::limits::{MAX_CONCURRENCY, MAX_ISL, MAX_OSL, MAX_TURNS};
use super::schema::Config;
use super::workloads::DatasetWorkload;
use crate::workload::dataset::{Dataset, DatasetError};
use crate::workload::tokenizer::TokenModel;

impl Check {
    pub(super) fn dataset(&mut self, d: &DatasetWorkload, cfg: &Config, base_dir: &Path) {
        let numbers_before = self.diags.len();
        self.range_u32(&d.concurrency, "dataset.concurrency", 1, MAX_CONCURRENCY);
        self.range_u32(&d.max_turns, "dataset.max_turns", 1, MAX_TURNS);
        if let Some(o) = &d.osl {
            self.range_u32(o, "dataset.osl", 1, MAX_OSL);
        }
        if let Some(m) = &d.max_rows {
            self.range_u32(m, "dataset.max_rows", 1, u32::MAX);
        }
        if let Some(r) = &d.isl {
            self.range_u32(&r.min, "dataset.isl.min", 1, MAX_ISL);
            self.range_u32(&r.max, "dataset.isl.max", 1, MAX_ISL);
            if *r.min > *r.max {
                self.err(
                    r.min.pos,
                    format!(
                        "`dataset.isl.min` ({}) is above `dataset.isl.max` ({})",
                        *r.min, *r.max
                    ),
                    None,
                );
            }
        }
        self.step_and_warmup(&d.step, &d.warmup, "dataset");
        if self.diags.len() > numbers_before {
            // The selection is made of these numbers: the file is read once they are right.
            return;
        }
        let tokens = match &cfg.tokenizer {
            None => std::sync::Arc::new(TokenModel::approximate()),
            // Read once: the run's start-up takes the same reading.
            Some(t) => match TokenModel::load_shared(Some(&base_dir.join(t.as_str()))) {
                Ok(tokens) => tokens,
                Err(_) => {
                    // The tokenizer's own problem is reported at `tokenizer`.
                    self.err(
                        d.path.pos,
                        format!(
                            "dataset `{}`: its prompts cannot be measured without the configured tokenizer",
                            *d.path
                        ),
                        Some(
                            "fix `tokenizer`, or leave it out to count with the built-in approximation"
                                .into(),
                        ),
                    );
                    return;
                }
            },
        };
        let path = base_dir.join(d.path.as_str());
        let hint = || Some("see docs/METRICS.md, \"Datasets\", for both formats".to_owned());
        match Dataset::load_shared(&path, d.format, &tokens, &d.selection(cfg.seed)) {
            Ok(_) => {}
            // Every bad row its own problem, as every other problem of a config.
            Err(DatasetError::Rows { path, rows, more }) => {
                for (place, problem) in rows {
                    self.err(
                        d.path.pos,
                        format!("dataset {}: {place}: {problem}", path.display()),
                        hint(),
                    );
                }
                if more > 0 {
                    self.err(
                        d.path.pos,
                        format!("dataset {}: and {more} more bad rows", path.display()),
                        None,
                    );
                }
            }
            Err(e @ DatasetError::Empty { .. }) => self.err(
                d.path.pos,
                e.to_string(),
                Some("widen `isl`, or give `osl` to send the rows that have no reply".into()),
            ),
            Err(e) => self.err(d.path.pos, e.to_string(), hint()),
        }
    }
}
