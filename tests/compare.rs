//! `llm-canary compare` end to end: the binary benches the embedded simulator three times (twice
//! the same fixed-timing server, once one whose TTFT is 50 % longer), then compares the folders:
//! the slower server's TTFT reads worse and fails `--fail-on-regression`, a folder against itself
//! reads no detectable change, two runs of the same server pass the gate, and folders that cannot
//! be compared exit 2 with the reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_llm-canary");

/// One closed-loop step of a simulator with a fixed TTFT: short requests, so its 2.4 s window
/// holds dozens of them.
fn config(ttft_ms: u32) -> String {
    format!(
        r#"
targets:
  - {{ name: agg, serving_mode: aggregated, simulated: {{ profile: fixed, fixed_ttft: {ttft_ms}ms, fixed_itl: 5ms }} }}
time_scale: 0.02
workloads:
  concurrency_sweep: {{ levels: [4], isl: 256, osl: 24, step: 120s, warmup: 20s }}
schedule: {{ drain_grace: 5s }}
"#
    )
}

/// Benches a server with this TTFT into `dir/name`; returns the folder.
fn bench(dir: &Path, name: &str, ttft_ms: u32) -> PathBuf {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, config(ttft_ms)).unwrap();
    let out = dir.join(name);
    let output = support::bench::bench(&file, &out, &[]);
    assert!(
        output.status.success(),
        "bench {name}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

struct Runs {
    dir: tempfile::TempDir,
    /// Two runs of the same server, and one of a server 50 % slower to its first token.
    a: PathBuf,
    again: PathBuf,
    slower: PathBuf,
}

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let a = bench(dir.path(), "a", 50);
        let again = bench(dir.path(), "again", 50);
        let slower = bench(dir.path(), "slower", 75);
        Runs {
            dir,
            a,
            again,
            slower,
        }
    })
}

fn compare(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(BIN)
        .arg("compare")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The change of `measure` in the comparison's only step.
fn change<'a>(json: &'a Value, measure: &str) -> &'a Value {
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{json}");
    assert_eq!(steps[0]["step"], "agg concurrency_sweep concurrency=4");
    steps[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["measure"] == measure)
        .unwrap_or_else(|| panic!("no {measure} in {json}"))
}

#[test]
fn a_slower_server_reads_worse_and_fails_the_gate() {
    let r = runs();
    let json_file = r.dir.path().join("compare.json");
    let out = compare(&[
        r.a.as_os_str(),
        r.slower.as_os_str(),
        "--json".as_ref(),
        json_file.as_os_str(),
        "--fail-on-regression".as_ref(),
        "1.2".as_ref(),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("## llm-canary compare\n"), "{stdout}");
    assert!(
        stdout.contains("### agg concurrency_sweep concurrency=4 ("),
        "{stdout}"
    );
    assert!(
        stdout.contains("| measure | A | B | B/A [95 % interval] | verdict |"),
        "{stdout}"
    );
    assert!(stdout.contains("| TTFT p50 (ms) |"), "{stdout}");
    assert!(stdout.contains("**worse**"), "{stdout}");
    assert!(
        stderr.contains("regression: agg concurrency_sweep concurrency=4: TTFT p50 changed ×"),
        "{stderr}"
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    let p50 = change(&json, "ttft_p50");
    assert_eq!(p50["verdict"], "worse", "{p50}");
    assert_eq!(p50["higher_is"], "worse");
    assert_eq!(p50["method"], "order statistics and block bootstrap");
    let ratio = p50["change"].as_f64().unwrap();
    assert!((1.3..1.8).contains(&ratio), "75 ms over 50 ms: {p50}");
    assert!(p50["lower"].as_f64().unwrap() > 1.0, "{p50}");
    assert!(p50["a"].as_f64().unwrap() < p50["b"].as_f64().unwrap());
    assert_eq!(json["only_in_a"], serde_json::json!([]));
    // A smaller regression than the gate's ratio passes it.
    let lenient = compare(&[
        r.a.as_os_str(),
        r.slower.as_os_str(),
        "--fail-on-regression".as_ref(),
        "3".as_ref(),
    ]);
    assert_eq!(lenient.status.code(), Some(0), "{}", text(&lenient.stderr));
    // The other way round it is better, and JSON on stdout.
    let back = compare(&[
        r.slower.as_os_str(),
        r.a.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(back.status.code(), Some(0), "{}", text(&back.stderr));
    let json: Value = serde_json::from_slice(&back.stdout).unwrap();
    assert_eq!(change(&json, "ttft_p50")["verdict"], "better");
}

#[test]
fn the_same_server_reads_no_change_against_itself_and_passes_the_gate_twice() {
    let r = runs();
    let out = compare(&[
        r.a.as_os_str(),
        r.a.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    for c in json["steps"][0]["changes"].as_array().unwrap() {
        assert_eq!(c["verdict"], "no detectable change", "{c}");
        if !c["change"].is_null() {
            assert_eq!(c["change"], 1.0, "{c}");
        }
    }
    // Two runs of one server: whatever a busy machine shifts, nothing near 50 % worse.
    let out = compare(&[
        r.a.as_os_str(),
        r.again.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
        "--fail-on-regression".as_ref(),
        "1.5".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ratio = change(&json, "ttft_p50")["change"].as_f64().unwrap();
    assert!((0.8..1.25).contains(&ratio), "{json}");
    // No request was skipped: the bench tables have no `skipped` column.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(r.a.join("summary.json")).unwrap()).unwrap();
    for t in summary["tables"].as_array().unwrap() {
        assert!(
            t["columns"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["name"] != "skipped"),
            "{}",
            t["id"]
        );
    }
}

/// A copy of a run's folder with its `summary.json` changed by `edit`.
fn edited(from: &Path, to: &Path, edit: impl Fn(&mut Value)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("requests.jsonl"), to.join("requests.jsonl")).unwrap();
    let mut summary: Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("summary.json")).unwrap()).unwrap();
    edit(&mut summary);
    std::fs::write(to.join("summary.json"), summary.to_string()).unwrap();
    to.to_owned()
}

#[test]
fn folders_that_cannot_be_compared_exit_2_with_the_reason() {
    let r = runs();
    let expect = |b: &Path, args: &[&str], said: &str| {
        let mut all = vec![r.a.as_os_str(), b.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        let out = compare(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(said), "expected {said:?} in {stderr}");
        assert!(out.stdout.is_empty());
    };
    let empty = r.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    expect(&empty, &[], "empty/summary.json");
    let newer = edited(&r.a, &r.dir.path().join("newer"), |s| {
        s["run"]["version"] = "9.0.0".into();
    });
    expect(&newer, &[], "written by llm-canary 9.0.0");
    let other = edited(&r.a, &r.dir.path().join("other"), |s| {
        for step in s["steps"].as_array_mut().unwrap() {
            step["target"] = "other".into();
        }
    });
    expect(&other, &[], "no steps in common");
    let no_requests = r.dir.path().join("no_requests");
    edited(&r.a, &no_requests, |_| {});
    std::fs::remove_file(no_requests.join("requests.jsonl")).unwrap();
    expect(&no_requests, &[], "requests.jsonl");
    expect(&r.again, &["--fail-on-regression", "0.9"], "at least 1");
}
