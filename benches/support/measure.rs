//! What the benchmark programs measure a process and a sample with: CPU time and memory from
//! `/proc`, the machine's load, quantiles, and a figure against its goal.

#![allow(dead_code)]

use std::io::Write;

/// Clock ticks per second of `/proc/*/stat` times (USER_HZ; 100 on every Linux we run on).
const USER_HZ: f64 = 100.0;

/// user + system CPU seconds of process `pid` ("self" for this one), including its exited threads.
pub fn process_cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may contain spaces; fields count from after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / USER_HZ
}

/// CPU seconds of the calling thread (`schedstat`, nanoseconds).
pub fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e9)
}

/// A `kB` field of `/proc/PID/status` ("self" for this process) (`VmRSS`, `VmHWM`) in MiB.
pub fn status_mib(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

pub fn machine_state() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{} cores, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.join(" ")
    )
}

pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p50 / p99 / max of `values` (sorted in place).
pub fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        quantile(values, 0.5),
        quantile(values, 0.99),
        values.last().copied().unwrap_or(f64::NAN),
    )
}

/// `value` against `goal` (`<=` when `lower_is_better`): "met" or how far off.
pub fn verdict(value: f64, goal: f64, lower_is_better: bool) -> String {
    let met = if lower_is_better {
        value <= goal
    } else {
        value >= goal
    };
    if met {
        "goal met".into()
    } else if lower_is_better {
        format!("MISSED by {:.2}x", value / goal)
    } else {
        format!("MISSED: {:.0} % of goal", value / goal * 100.0)
    }
}

pub fn emit_json(path: &Option<String>, line: serde_json::Value) {
    if let Some(path) = path {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("--json file opens");
        writeln!(file, "{line}").expect("--json file writes");
    }
}
