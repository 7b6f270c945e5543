//! The command line (docs/DESIGN.md §2): six subcommands, their flags, and the exit codes
//! 0 success, 1 runtime failure, 2 bad usage or bad config, 3 and 4 a `check --probe` that found
//! a target unreachable or misconfigured, 5 a `compare --fail-on-regression` that found a
//! regression (`exit` lists them per command, as `--help` shows them). A stdout closed early (`| head`) ends a command quietly with 0. Every subcommand's help
//! has one layout: each flag described on its own line, its values and default inline.

mod exit;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::sim::FaultSpec;
use crate::config::{ConfigError, ServingMode};
use crate::setup::Setup;
use crate::shutdown::{OnSignal, Shutdown};

/// An always-on canary for LLM serving: synthetic streaming traffic, client-side TTFT/ITL,
/// Prometheus/OTLP export and SLOs that compare aggregated with disaggregated serving.
#[derive(Debug, Parser)]
#[command(name = "llm-canary", version, about, long_about = None, after_help = exit::ALL)]
pub struct Cli {
    /// How log records are written to stderr: text (one line each, for people) or json (one
    /// JSON object per line, for a log pipeline).
    #[arg(long, global = true, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The form of the log on stderr (`--log-format`). Either way a record is one line: what the
/// canary logs is written on one line where it is logged (a probe's checks, a config's
/// problems one record each), and the JSON encoder escapes any line break a value still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    // Plain comments, not doc comments: clap would list each value's help on lines of its own,
    // a layout no other flag has.
    // `TIMESTAMP LEVEL target: message key=value…`, coloured on a terminal.
    Text,
    // `{"timestamp": …, "level": …, "fields": {"message": …, <fields>}, "target": …}`.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The daemon. Without --config: the embedded demo (two simulated deployments, all workloads).
    #[command(after_help = exit::RUN)]
    Run(RunArgs),
    /// One pass of the plan, then exit with the benchmark plan's result tables.
    #[command(after_help = exit::BENCH)]
    Bench(BenchArgs),
    /// Parse and validate a config; print a normalised summary (exit 0) or every error (exit 2).
    #[command(after_help = exit::CHECK)]
    Check(CheckArgs),
    /// Print the Prometheus rules generated from the config's SLOs.
    #[command(after_help = exit::RULES)]
    Rules(RulesArgs),
    /// Run one simulated serving deployment as a standalone OpenAI-compatible server.
    #[command(after_help = exit::SIM)]
    Sim(SimArgs),
    /// Compare two `bench --out` folders step by step: each measure in A and in B, the change B/A
    /// with its 95 % interval and a verdict (better, worse, no detectable change).
    #[command(after_help = exit::COMPARE)]
    Compare(CompareArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Config file (YAML). Absent: the embedded demo.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Address of /metrics and the HTTP API; overrides `export.listen`. Port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchFormat {
    Table,
    Markdown,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Config file (YAML). Absent: the embedded simulators at a compressed time scale.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Run only these workloads (repeatable).
    #[arg(long = "workload", value_parser = clap::builder::PossibleValuesParser::new(crate::config::WORKLOAD_NAMES))]
    pub workloads: Vec<String>,
    /// Multiply every duration by F (overrides `time_scale`).
    #[arg(long, value_name = "F")]
    pub time_scale: Option<f64>,
    /// How stdout shows the tables: aligned text, Markdown to paste into a report, or JSON.
    #[arg(long, value_enum, default_value_t = BenchFormat::Table)]
    pub format: BenchFormat,
    /// Directory for summary.json, requests.jsonl, CSV tables and report.html.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record the arrival time of every content chunk in requests.jsonl.
    #[arg(long)]
    pub record_tokens: bool,
    /// Instead of the plan: find, per target, the highest concurrency that meets COND, e.g.
    /// 'p99(ttft) < 500ms and p99(itl) < 50ms' (bisection over closed-loop steps of the
    /// concurrency_sweep's shape), with its goodput and $ per 1M good tokens.
    #[arg(long, value_name = "COND")]
    pub search: Option<String>,
    /// The highest concurrency the search tries.
    #[arg(long, value_name = "N", default_value_t = crate::report::search::DEFAULT_SEARCH_MAX, requires = "search")]
    pub search_max: u32,
}

// The values are described in the flag's help, not each on its own: clap would switch the whole
// page to its long layout for them, unlike the other commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckOutput {
    Summary,
    Yaml,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Config file (YAML) to parse and validate.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// What stdout shows of a valid config: a short summary (its traffic and cost per hour), or
    /// the whole effective config as YAML, defaults filled in.
    #[arg(long, value_enum, default_value_t = CheckOutput::Summary)]
    pub output: CheckOutput,
    /// Also send one short request to every target and scrape its server metrics once; exit 3
    /// when a target is unreachable, 4 when one answers but not as configured.
    #[arg(long)]
    pub probe: bool,
}

// Described in the flag's help, as `CheckOutput` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RulesFormat {
    Rules,
    PrometheusRule,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RulesArgs {
    /// Config file (YAML) whose SLOs become rules. Absent: the embedded demo's.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// A plain Prometheus rule file, or one wrapped in a monitoring.coreos.com/v1 PrometheusRule.
    #[arg(long, value_enum, default_value_t = RulesFormat::Rules)]
    pub format: RulesFormat,
    /// Only the canary's own health alerts, with the config's `alerting` labels and runbook base
    /// (every rule file holds them; `rules/canary-health.yaml` is this without a config).
    #[arg(long)]
    pub health: bool,
}

// Described in the flag's help, as `CheckOutput` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    Markdown,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The baseline: a folder written by `llm-canary bench --out`.
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// The candidate, compared with A.
    #[arg(value_name = "B")]
    pub b: PathBuf,
    /// What stdout shows: Markdown (for a pull-request comment) or the comparison as JSON.
    #[arg(long, value_enum, default_value_t = CompareFormat::Markdown)]
    pub format: CompareFormat,
    /// Also write the comparison as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Exit 5 when a measure is worse (its whole interval on the bad side of 1) and its change
    /// B/A is past RATIO in the bad direction: above RATIO for latencies and the error ratio,
    /// below 1/RATIO for throughput, goodput and the cache hit ratio. RATIO ≥ 1, e.g. 1.1.
    #[arg(long, value_name = "RATIO")]
    pub fail_on_regression: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimMode {
    Aggregated,
    Disaggregated,
}

impl From<SimMode> for ServingMode {
    fn from(m: SimMode) -> Self {
        match m {
            SimMode::Aggregated => ServingMode::Aggregated,
            SimMode::Disaggregated => ServingMode::Disaggregated,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Serving mode: one pool of workers, or prefill and decode workers with a KV handoff.
    #[arg(long, value_enum, default_value_t = SimMode::Aggregated)]
    pub mode: SimMode,
    /// Address of the OpenAI-compatible API and its /metrics. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Timing profile: default, fast, fixed, or a GPU profile.
    #[arg(long, default_value = "default")]
    pub profile: String,
    /// Workers per pool (aggregated: workers; disaggregated: prefill and decode workers each).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Answer 400 to request fields the OpenAI API does not define (`min_tokens`, `nvext`, ...).
    #[arg(long)]
    pub reject_unknown_fields: bool,
    /// Append one JSON line per completion request (headers, `user` field) to FILE.
    #[arg(long, value_name = "FILE")]
    pub request_log: Option<PathBuf>,
    /// Append one JSON line per finished completion to FILE: its x-request-id, arrival and every
    /// token's send instant (CLOCK_MONOTONIC ns), to line up with the bench's requests.jsonl.
    #[arg(long, value_name = "FILE")]
    pub send_log: Option<PathBuf>,
    /// Faults to inject, as a YAML mapping in the schema of a target's `simulated.faults` (e.g.
    /// '{error: {status: 503, rate: 0.02}, stall: {after_tokens: 8, duration: 3s, rate: 0.01}}'):
    /// a deployment that misbehaves on purpose, for alert routing and soak tests.
    #[arg(long, value_name = "YAML")]
    pub faults: Option<String>,
    /// Run-to-run variability of the deployment's speed, as a YAML mapping in the schema of a
    /// target's `simulated.variability` (e.g. '{period: 2m, bimodal: {probability: 0.4, factor:
    /// 1.4}}', or '{drift_per_hour: 0.01}'): a deployment whose speed changes between runs.
    #[arg(long, value_name = "YAML")]
    pub variability: Option<String>,
    /// Write every SSE event on its own (each token its own HTTP chunk and write), as vLLM's and
    /// Dynamo's frontends do; by default the events already waiting share a write.
    #[arg(long)]
    pub write_per_event: bool,
    /// Stream the first N output tokens of each chat completion as reasoning
    /// (`delta.reasoning_content`, as vLLM with a reasoning parser does), the rest as the answer.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub reasoning_tokens: u32,
    /// Runtime threads (default: one per core). One makes the cheapest zero-delay server: its
    /// connections write what a pass produced together, instead of a second thread writing each
    /// token as the engine emits it; more answer requests sooner when many arrive at once.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
}

/// Parses the command line and runs it; the process exit code follows docs/DESIGN.md §2.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let command = cli.command.unwrap_or(Command::Run(RunArgs {
        config: None,
        listen: None,
    }));
    match command {
        Command::Check(args) => check(&args),
        Command::Compare(args) => compare(&args),
        other => runtime(other),
    }
}

/// `llm-canary compare A B`: the comparison on stdout (and in `--json`); exit 2 for folders
/// that cannot be compared, 5 for a regression past `--fail-on-regression`.
fn compare(args: &CompareArgs) -> ExitCode {
    if let Some(r) = args.fail_on_regression
        && !(r.is_finite() && r >= 1.0)
    {
        eprintln!(
            "llm-canary compare: --fail-on-regression {r}: expected a ratio of at least 1, e.g. 1.1 for 10 % worse"
        );
        return ExitCode::from(2);
    }
    let comparison = match crate::report::compare::compare_dirs(&args.a, &args.b) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("llm-canary compare: {e}");
            return ExitCode::from(2);
        }
    };
    let json = match serde_json::to_string_pretty(&comparison) {
        Ok(j) => j + "\n",
        Err(e) => {
            eprintln!("llm-canary compare: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(path) = &args.json
        && let Err(e) = std::fs::write(path, &json)
    {
        eprintln!("llm-canary compare: {}: {e}", path.display());
        return ExitCode::from(1);
    }
    let printed = match args.format {
        CompareFormat::Markdown => out(&comparison.to_markdown()),
        CompareFormat::Json => out(&json),
    };
    if let Err(code) = printed {
        return code;
    }
    let Some(ratio) = args.fail_on_regression else {
        return ExitCode::SUCCESS;
    };
    let regressions = comparison.regressions(ratio);
    for r in &regressions {
        eprintln!(
            "llm-canary compare: regression: {}: {} changed ×{:.3} (past {ratio})",
            r.step.step,
            r.change.name,
            r.change.change.unwrap_or(f64::NAN)
        );
    }
    if regressions.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::REGRESSION)
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => log
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // The record's fields (its message among them) under `fields`, not beside the
        // record's own keys: a field named `target` (a canary target's name, on many records)
        // would repeat the key `target` (where the record was logged), which a JSON reader
        // keeps one of. The canary logs no spans.
        LogFormat::Json => log
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .with_ansi(false)
            .try_init(),
    };
}

/// Writes `text` to stdout, the one way the commands print there. A reader that went away
/// (`llm-canary check | head -1`) is no failure: `Err(0)` ends the command quietly, writing and
/// doing nothing more, as command-line tools do (Rust ignores SIGPIPE, so the write fails with
/// `BrokenPipe` where `print!` would panic). Any other write error is `Err(1)`, said on stderr.
fn out(text: &str) -> Result<(), ExitCode> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("llm-canary: cannot write to stdout: {e}");
            Err(ExitCode::from(1))
        }
    }
}

/// Prints a config error the way editors and CI annotations read it and picks the exit code.
pub fn report_config_error(err: &ConfigError) -> ExitCode {
    eprintln!("{err}");
    match err {
        ConfigError::Io { .. } | ConfigError::Invalid { .. } => ExitCode::from(2),
    }
}

fn check(args: &CheckArgs) -> ExitCode {
    match Setup::load(&args.config) {
        Ok(setup) => {
            let cfg = &setup.config;
            for w in setup.warning_lines() {
                eprintln!("{w}");
            }
            // Against the hard limit: `run` and `bench` raise the soft one to it.
            let port = crate::export::HttpLimits::default().max_connections as u64;
            let descriptors = crate::schedule::cost::descriptors(cfg, port);
            let hard = crate::fds::Limits::now().hard;
            if let Some(text) = crate::fds::shortfall(descriptors.total(), hard) {
                eprintln!("{}: warning: {text}", args.config.display());
            }
            let printed = match args.output {
                CheckOutput::Summary => out(&format!(
                    "{}: OK\n{}{}{}",
                    args.config.display(),
                    cfg.summary(),
                    crate::schedule::cost::render(cfg),
                    crate::schedule::cost::render_descriptors(&descriptors, hard)
                )),
                CheckOutput::Yaml => match serde_saphyr::to_string(cfg) {
                    Ok(text) => out(&text),
                    Err(e) => {
                        eprintln!("cannot print the config: {e}");
                        return ExitCode::from(1);
                    }
                },
            };
            if let Err(code) = printed {
                return code;
            }
            if args.probe {
                return probe(&setup);
            }
            ExitCode::SUCCESS
        }
        Err(e) => report_config_error(&e),
    }
}

/// `check --probe`: the preflight of every configured target.
fn probe(setup: &Setup) -> ExitCode {
    let rt = match async_runtime(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(crate::probe::probe_config(&setup.config, setup.base_dir())) {
        Ok(reports) => match out(&crate::probe::render(&reports)) {
            Ok(()) => ExitCode::from(crate::probe::exit_code(&reports)),
            Err(code) => code,
        },
        Err(e) => {
            eprintln!("llm-canary check --probe: {e}");
            ExitCode::from(1)
        }
    }
}

/// The multi-threaded runtime of the async commands, with `threads` workers (default: the
/// count in `TOKIO_WORKER_THREADS`, else one per core); exit 1 (said on stderr) when it cannot
/// start, exit 2 when `TOKIO_WORKER_THREADS` is set but not a positive whole number (tokio itself
/// would panic on it).
fn async_runtime(threads: Option<u16>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let threads = match threads {
        Some(n) => Some(usize::from(n)),
        None => env_worker_threads()?,
    };
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    // Every command that opens sockets runs here: each stream is one, and a distribution's
    // default soft limit (1024) is below a large plan's peak (crate::fds).
    crate::fds::raise_soft_limit();
    builder.enable_all().build().map_err(|e| {
        eprintln!("cannot start the async runtime: {e}");
        ExitCode::from(1)
    })
}

/// The environment variable tokio reads for its worker count.
const WORKER_THREADS_VAR: &str = "TOKIO_WORKER_THREADS";

/// The worker count set in [`WORKER_THREADS_VAR`]; `None` when unset.
fn env_worker_threads() -> Result<Option<usize>, ExitCode> {
    let Some(v) = std::env::var_os(WORKER_THREADS_VAR) else {
        return Ok(None);
    };
    match v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => {
            eprintln!(
                "{WORKER_THREADS_VAR}={v:?} is not a positive whole number of worker threads: \
                 set one (e.g. {WORKER_THREADS_VAR}=2), or unset it for one worker per core"
            );
            Err(ExitCode::from(2))
        }
    }
}

/// Commands that need the async runtime.
fn runtime(command: Command) -> ExitCode {
    let threads = match &command {
        Command::Sim(args) => args.threads,
        _ => None,
    };
    let rt = match async_runtime(threads) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(async move {
        match command {
            Command::Run(args) => run(args).await,
            Command::Bench(args) => bench(args).await,
            Command::Rules(args) => rules(&args),
            Command::Sim(args) => sim(args).await,
            Command::Check(_) | Command::Compare(_) => {
                unreachable!("check and compare run without the runtime")
            }
        }
    })
}

/// `llm-canary rules`: the Prometheus rules of the config's SLOs on stdout.
fn rules(args: &RulesArgs) -> ExitCode {
    let (setup, source) = match &args.config {
        Some(path) => match Setup::load(path) {
            Ok(setup) => {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| path.display().to_string());
                (setup, name)
            }
            Err(e) => return report_config_error(&e),
        },
        None => (Setup::demo(), "the embedded demo config".to_owned()),
    };
    let format = match args.format {
        RulesFormat::Rules => crate::slo::rules::Format::Rules,
        RulesFormat::PrometheusRule => crate::slo::rules::Format::PrometheusRule,
    };
    let rules = if args.health {
        crate::slo::rules::generate_health(&setup.rules_options(), format)
    } else {
        crate::slo::rules::generate(
            &setup.slos,
            &setup.domain,
            &setup.rules_options(),
            &source,
            format,
        )
    };
    match out(&rules) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// The setup of `--config`, or the embedded demo without one.
fn load(config: Option<&Path>) -> Result<Setup, ExitCode> {
    match config {
        Some(path) => Setup::load(path).map_err(|e| report_config_error(&e)),
        None => Ok(Setup::demo()),
    }
}

async fn run(args: RunArgs) -> ExitCode {
    let setup = match load(args.config.as_deref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match crate::daemon::run(setup, args.listen).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A config's problems are one line each: one record each.
            for line in e.to_string().lines() {
                tracing::error!("{line}");
            }
            ExitCode::from(1)
        }
    }
}

/// One pass of the plan; the tables on stdout, progress and logs on stderr, files in `--out`.
/// Exit 0 when the plan ran to the end, 1 when it failed, was interrupted or a target could not
/// be measured (the others were, and the files are written), 2 for bad options.
async fn bench(args: BenchArgs) -> ExitCode {
    let setup = match load(args.config.as_deref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Some(condition) = args.search.clone() {
        return search(setup, condition, args).await;
    }
    let opts = crate::report::BenchOptions {
        setup,
        workloads: args.workloads,
        time_scale: args.time_scale,
        out: args.out,
        record_tokens: args.record_tokens,
        live_progress: crate::report::live_on_terminal(),
    };
    let stop = Shutdown::new();
    stop.on_signals(OnSignal::StopThenCut);
    let outcome = match crate::report::run_bench(opts, &stop).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("llm-canary bench: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let report = &outcome.report;
    let printed = match args.format {
        BenchFormat::Table => out(&report.to_text()),
        BenchFormat::Markdown => out(&report.to_markdown()),
        BenchFormat::Json => match serde_json::to_string_pretty(report) {
            Ok(json) => out(&format!("{json}\n")),
            Err(e) => {
                eprintln!("llm-canary bench: {e}");
                return ExitCode::from(1);
            }
        },
    };
    if let Err(code) = printed {
        return code;
    }
    for f in &outcome.files {
        tracing::info!("wrote {}", f.display());
    }
    for f in &report.run.failed_targets {
        eprintln!(
            "llm-canary bench: target {} could not be measured: {}",
            f.name, f.error
        );
    }
    if !report.run.failed_targets.is_empty() {
        return ExitCode::from(1);
    }
    if report.run.interrupted {
        eprintln!(
            "llm-canary bench: interrupted; the report covers the {} of {} steps that finished",
            report.run.steps_finished, report.run.steps_planned
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// `bench --search`: the tables on stdout, `search.json` and CSVs in `--out`. Exit 0 when every
/// target was searched to the end, 1 otherwise, 2 for bad options.
async fn search(setup: crate::setup::Setup, condition: String, args: BenchArgs) -> ExitCode {
    let setup = match crate::report::bench::effective_setup(setup, &[], args.time_scale) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("llm-canary bench: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let targets = setup.config.targets.len();
    let opts = crate::report::search::SearchOptions {
        setup,
        condition,
        max_level: args.search_max,
        out: args.out,
        live_progress: crate::report::live_on_terminal(),
    };
    let stop = Shutdown::new();
    stop.on_signals(OnSignal::StopThenCut);
    let result = match crate::report::search::run_search(opts, &stop).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("llm-canary bench: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let tables = result.tables();
    let text = match args.format {
        BenchFormat::Table => tables
            .iter()
            .map(|t| format!("{}\n", t.to_text()))
            .collect::<String>(),
        BenchFormat::Markdown => tables
            .iter()
            .map(|t| format!("{}\n", t.to_markdown()))
            .collect::<String>(),
        BenchFormat::Json => match serde_json::to_string_pretty(&result) {
            Ok(json) => format!("{json}\n"),
            Err(e) => {
                eprintln!("llm-canary bench: {e}");
                return ExitCode::from(1);
            }
        },
    };
    if let Err(code) = out(&text) {
        return code;
    }
    if stop.stopping() || result.targets.len() < targets {
        eprintln!("llm-canary bench: the search did not finish on every target");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

async fn sim(args: SimArgs) -> ExitCode {
    let faults = args
        .faults
        .as_deref()
        .map(|t| FaultSpec::parse(t, "--faults"));
    let faults = match faults.transpose() {
        Ok(faults) => faults.unwrap_or_default(),
        Err(e) => {
            eprintln!("llm-canary sim: {e}");
            return ExitCode::from(2);
        }
    };
    let variability = args
        .variability
        .as_deref()
        .map(|t| crate::sim::Variability::parse(t, "--variability"));
    let variability = match variability.transpose() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("llm-canary sim: {e}");
            return ExitCode::from(2);
        }
    };
    let spec = crate::sim::SimSpec {
        profile: args.profile.clone(),
        workers: args.workers,
        prefill_workers: args.workers,
        decode_workers: args.workers,
        reject_unknown_fields: args.reject_unknown_fields,
        request_log: args.request_log.clone(),
        send_log: args.send_log.clone(),
        write_per_event: args.write_per_event,
        reasoning_tokens: args.reasoning_tokens,
        faults,
        variability,
        ..crate::sim::SimSpec::default()
    };
    let problems = spec.validate();
    if !problems.is_empty() {
        for p in problems {
            eprintln!("llm-canary sim: {p}");
        }
        return ExitCode::from(2);
    }
    let handle = match crate::sim::start(spec, args.mode.into(), args.listen).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("llm-canary sim: {e}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(mode = ?args.mode, profile = %args.profile, "listening on {}", handle.local_addr());
    let _ = tokio::signal::ctrl_c().await;
    handle.shutdown().await;
    ExitCode::SUCCESS
}
