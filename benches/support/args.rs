//! How the benchmark programs read their command line. `cargo bench --bench NAME -- ARGS` runs a
//! program with `--bench` among its arguments; `cargo test --all-targets` builds and runs it
//! without, and then it only says how to run it (a benchmark is no test: its figures depend on
//! the machine, and it runs for minutes).

/// The arguments after the program name, `--bench` removed; `None` (after a note on stderr) when
/// the program was not started by `cargo bench`.
pub fn bench_args(usage: &str) -> Option<Vec<String>> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if !all.iter().any(|a| a == "--bench") {
        eprintln!("a benchmark, not a test; run it with: {usage}");
        return None;
    }
    Some(all.into_iter().filter(|a| a != "--bench").collect())
}
