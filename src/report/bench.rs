//! `llm-canary bench`: one pass of the plan against the configured targets (by default the
//! embedded simulators), step by step with a progress display and the servers' metrics sampled,
//! then the report and its files. A first stop request ends sending and drains the running step
//! (which is then left out); what finished is still reported.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::analysis::Report;
use super::progress::Progress;
use super::records::BenchSink;
use super::{BenchData, ReportError, RunInfo, SloVerdict, TargetInfo};
use crate::clock::unix_now;
use crate::config::{At, MAX_TIME_SCALE, WORKLOAD_NAMES};
use crate::export::metrics::Metrics;
use crate::model::Sink;
use crate::schedule::{Scheduler, TargetSource, plan_cycle};
use crate::scrape::ServerMetricsSink;
use crate::setup::Setup;
use crate::shutdown::Shutdown;
use crate::slo::SloEngine;
use crate::targets::Deployment;

/// What to run and where the files go.
pub struct BenchOptions {
    /// The validated setup (the embedded demo when no `--config`); its path names the config in
    /// the report and resolves its relative paths.
    pub setup: Setup,
    /// Only these workloads (empty: the config's whole cycle), in the cycle's order.
    pub workloads: Vec<String>,
    /// Overrides the config's `time_scale`.
    pub time_scale: Option<f64>,
    /// Directory for `summary.json`, `requests.jsonl`, one CSV per table and `report.html`.
    pub out: Option<PathBuf>,
    /// Record every content chunk's arrival in `requests.jsonl`.
    pub record_tokens: bool,
    /// Live progress bars (a terminal); plain log lines otherwise.
    pub live_progress: bool,
}

/// A finished (or interrupted) bench.
pub struct BenchOutcome {
    pub data: BenchData,
    pub report: Report,
    /// The files written to `--out`.
    pub files: Vec<PathBuf>,
}

/// The setup with `--time-scale` and `--workload` applied; a bad value is a usage error (exit 2).
pub fn effective_setup(
    setup: Setup,
    workloads: &[String],
    time_scale: Option<f64>,
) -> Result<Setup, ReportError> {
    if time_scale.is_none() && workloads.is_empty() {
        return Ok(setup);
    }
    let mut cfg = setup.config.clone();
    if let Some(f) = time_scale {
        // The config's own bound: an override can set no value the file could not.
        if !(f.is_finite() && f > 0.0 && f <= MAX_TIME_SCALE) {
            return Err(ReportError::Usage(format!(
                "--time-scale {f}: expected a number above 0 and at most {MAX_TIME_SCALE}"
            )));
        }
        cfg.time_scale = At::dflt(f);
    }
    if !workloads.is_empty() {
        let cycle = cfg.cycle();
        for w in workloads {
            if !WORKLOAD_NAMES.contains(&w.as_str()) {
                return Err(ReportError::Usage(format!(
                    "--workload {w}: expected one of {}",
                    WORKLOAD_NAMES.join(", ")
                )));
            }
            if !cycle.contains(&w.as_str()) {
                return Err(ReportError::Usage(format!(
                    "--workload {w}: the config does not run this workload (its cycle: {})",
                    cycle.join(", ")
                )));
            }
        }
        cfg.schedule.cycle = cycle
            .into_iter()
            .filter(|w| workloads.iter().any(|x| x == w))
            .map(|w| At::dflt(w.to_owned()))
            .collect();
    }
    // The overridden config passes the same validation as a file: an override that makes it
    // invalid (a step too short for its workload, say) is a usage error, never a run.
    let problems = cfg.validate(setup.base_dir());
    if !problems.is_empty() {
        let problems: Vec<String> = problems
            .iter()
            .map(|d| match &d.hint {
                Some(hint) => format!("{} (hint: {hint})", d.message),
                None => d.message.clone(),
            })
            .collect();
        return Err(ReportError::Usage(format!(
            "with --time-scale and --workload applied: {}",
            problems.join("; ")
        )));
    }
    setup
        .with_config(cfg)
        .map_err(|e| ReportError::Usage(format!("SLOs: {e}")))
}

/// Runs the bench: one cycle of the plan through the same scheduler as the daemon. A stop
/// (signals: [`crate::shutdown::OnSignal::StopThenCut`]) ends it after draining the running step (or, cut, at once). Nothing is
/// sent and no file is created when the options are bad.
pub async fn run_bench(opts: BenchOptions, stop: &Shutdown) -> Result<BenchOutcome, ReportError> {
    let setup = effective_setup(opts.setup, &opts.workloads, opts.time_scale)?;
    let cfg = &setup.config;
    if let Some(dir) = &opts.out {
        std::fs::create_dir_all(dir).map_err(ReportError::io(dir))?;
    }
    let jsonl = opts.out.as_ref().map(|d| d.join("requests.jsonl"));
    let sink = Arc::new(BenchSink::new(
        cfg.targets.len(),
        jsonl.as_deref(),
        opts.record_tokens,
    )?);
    let started_unix = unix_now();
    // Each target on its own: one that cannot be started is reported, the others measured.
    crate::targets::warn_on_descriptors(cfg, 0);
    let (deployment, failed) = Deployment::start_partial(cfg, setup.base_dir(), 3).await?;
    let metrics = Arc::new(Metrics::new(&setup.latency_thresholds()));
    // The config's SLOs, evaluated over this run only (no baselines from the daemon's runs).
    let slo = Arc::new(SloEngine::new(
        setup.slos.clone(),
        setup.domain.clone(),
        crate::slo::baseline::BaselineStore::in_memory(),
        None,
    ));
    let targets: Vec<TargetInfo> = deployment
        .targets
        .iter()
        .map(|t| TargetInfo {
            name: t.name.clone(),
            serving_mode: t.mode.as_str().to_owned(),
            cost_per_hour_usd: t.cost_per_hour_usd,
        })
        .collect();
    let steps = plan_cycle(cfg);
    let progress = Arc::new(Progress::new(
        opts.live_progress,
        steps.iter().map(|s| s.warmup + s.steady).collect(),
        targets.iter().map(|t| t.name.clone()).collect(),
        Arc::clone(&sink),
    ));
    let runner = deployment.assemble(
        cfg,
        vec![
            Arc::clone(&sink) as Arc<dyn Sink>,
            Arc::clone(&metrics) as Arc<dyn Sink>,
            Arc::clone(&slo) as Arc<dyn Sink>,
            Arc::clone(&progress) as Arc<dyn Sink>,
        ],
    );
    let source = TargetSource::fixed(deployment.target_set(cfg));
    let server_metrics: Arc<dyn ServerMetricsSink> = metrics.clone();
    let mut scheduler = Scheduler::new(
        runner,
        source,
        Some(server_metrics),
        cfg.export.server_metrics_interval.0,
    );
    let run = scheduler
        .run(|| steps.clone(), Duration::default, Some(1), stop)
        .await;
    progress.done(run.steps_finished);
    deployment.stop().await;
    sink.finish()?;

    let data = BenchData {
        run: RunInfo {
            version: env!("CARGO_PKG_VERSION"),
            config: setup.label(),
            time_scale: *cfg.time_scale,
            workloads: cfg.cycle().iter().map(|w| (*w).to_owned()).collect(),
            targets,
            started_unix,
            ended_unix: unix_now(),
            steps_planned: steps.len(),
            steps_finished: run.steps_finished,
            interrupted: run.interrupted,
            goodput: cfg.goodput.limits(),
            failed_targets: failed
                .iter()
                .map(|f| super::FailedTarget {
                    name: f.name.clone(),
                    error: f.error.clone(),
                })
                .collect(),
        },
        slo: slo
            .judge_run()
            .into_iter()
            .map(|(name, status)| SloVerdict {
                expr: setup
                    .slos
                    .iter()
                    .find(|d| d.name == name)
                    .map(|d| d.text())
                    .unwrap_or_default(),
                name,
                state: status.reading.state.as_str().to_owned(),
                value: status.reading.value,
                threshold: status.reading.threshold,
                reason: status.reason,
            })
            .collect(),
        steps: sink.take_results(),
        ttft_by_distribution: sink.take_ttft_by_distribution(),
    };
    let report = Report::build(&data);
    let mut files = jsonl.into_iter().collect::<Vec<_>>();
    if let Some(dir) = &opts.out {
        files.extend(write_files(dir, &data, &report)?);
    }
    Ok(BenchOutcome {
        data,
        report,
        files,
    })
}

/// Writes `summary.json`, one CSV per table and `report.html` into `dir`.
pub fn write_files(
    dir: &Path,
    data: &BenchData,
    report: &Report,
) -> Result<Vec<PathBuf>, ReportError> {
    let mut files = Vec::new();
    // Write-then-rename: an interrupted bench leaves a complete old file or a complete new one,
    // never half of one (a `*.partial` at most).
    let mut write = |name: String, body: String| -> Result<(), ReportError> {
        let path = dir.join(&name);
        let partial = dir.join(format!("{name}.partial"));
        std::fs::write(&partial, body).map_err(ReportError::io(&partial))?;
        std::fs::rename(&partial, &path).map_err(ReportError::io(&path))?;
        files.push(path);
        Ok(())
    };
    write(
        "summary.json".into(),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    for t in &report.tables {
        write(format!("{}.csv", t.id), t.to_csv())?;
    }
    write("report.html".into(), super::html::render(data, report))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_and_bad_ones_are_usage_errors() {
        let setup = effective_setup(
            Setup::demo(),
            &["prefix_cache".into(), "concurrency_sweep".into()],
            Some(0.01),
        )
        .unwrap();
        let cfg = &setup.config;
        assert_eq!(*cfg.time_scale, 0.01);
        // The cycle's order, not the command line's.
        assert_eq!(cfg.cycle(), vec!["concurrency_sweep", "prefix_cache"]);
        for (w, f) in [
            (vec![], Some(0.0)),
            (vec![], Some(f64::NAN)),
            (vec!["nope".to_owned()], None),
        ] {
            let e = effective_setup(Setup::demo(), &w, f).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
        }
        let mut only_sweep = Setup::demo();
        only_sweep.config.workloads.multi_turn = None;
        let e = effective_setup(only_sweep, &["multi_turn".into()], None).unwrap_err();
        assert!(e.to_string().contains("does not run"), "{e}");
    }
}
