//! The exit codes each command can end with, as its `--help` lists them after the options
//! (docs/DESIGN.md §2 and the README keep the same list).

/// Every command: what the binary as a whole can end with.
pub const ALL: &str = "\
Exit codes:
  0    success; also a reader that closed stdout early (`| head`): nothing more is done
  1    a runtime failure, or a bench that was interrupted or could not measure a target
  2    bad usage or a bad config: every problem as FILE:LINE:COL, nothing sent, no port bound
  3    check --probe: a target is unreachable
  4    check --probe: a target answers, but not as configured
  5    compare --fail-on-regression: a measure got worse past the ratio
  130  run: a second SIGTERM or SIGINT while draining";

pub const RUN: &str = "\
Exit codes:
  0    stopped by SIGTERM or SIGINT, in-flight requests drained
  1    a runtime failure (e.g. the listen address is taken)
  2    bad usage or a bad config: every problem as FILE:LINE:COL, nothing sent, no port bound
  130  a second SIGTERM or SIGINT while draining";

pub const BENCH: &str = "\
Exit codes:
  0    the plan (or the search) ran to its end on every target
  1    a runtime failure, a target that could not be measured, or Ctrl-C (the report covers
       the steps that finished)
  2    bad usage or a bad config: every problem as FILE:LINE:COL, nothing sent";

pub const CHECK: &str = "\
Exit codes:
  0    the config is valid (warnings, if any, on stderr)
  1    a runtime failure (stdout could not be written, the probe could not start)
  2    bad usage or a bad config: every problem as FILE:LINE:COL
  3    --probe: a target is unreachable
  4    --probe: a target answers, but not as configured";

pub const RULES: &str = "\
Exit codes:
  0    the rules were printed
  1    stdout could not be written
  2    bad usage or a bad config: every problem as FILE:LINE:COL";

pub const SIM: &str = "\
Exit codes:
  0    stopped by Ctrl-C
  1    a runtime failure (e.g. the listen address is taken)
  2    bad usage: a bad flag, --faults or --variability (with its LINE:COL and the fix)";

/// `compare --fail-on-regression`: a measure got worse past the ratio.
pub const REGRESSION: u8 = 5;

pub const COMPARE: &str = "\
Exit codes:
  0    compared (and with --fail-on-regression, nothing got worse past the ratio)
  1    stdout or the --json file could not be written
  2    bad usage, or folders that cannot be compared: unreadable, a missing summary.json or
       requests.jsonl, written by an incompatible release, or without a step in common
  5    --fail-on-regression: a measure got worse past the ratio";
