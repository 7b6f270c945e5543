//! `bench --search` against two simulators of different capacity, under paused time: the search
//! finds a higher concurrency for the larger one, names the level whose p99 crossed the bound,
//! reports goodput there, lands on the same ladder level (within one) when run again, and
//! refuses a condition it cannot decide; a ladder above the traffic budget's `max_inflight` stops
//! there; off a terminal its progress is log lines, one as each probe starts and ends and one
//! per target found.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use llm_canary::report::ReportError;
use llm_canary::report::search::{
    LADDER, SearchOptions, SearchResult, parse_search, probes_at_most, run_search,
};
use llm_canary::setup::Setup;
use llm_canary::shutdown::Shutdown;

/// One simulated H200 running at most 4 sequences, one running 32; about 0.3 s per request of
/// 64 → 32 tokens, so beyond its slots a request waits about that long for its first token.
const TWO: &str = r#"
targets:
  - { name: small, serving_mode: aggregated, model: sim, simulated: { profile: default, max_running: 4 }, cost_per_hour_usd: 10 }
  - { name: large, serving_mode: disaggregated, model: sim, simulated: { profile: default, max_running: 32 }, cost_per_hour_usd: 20 }
workloads:
  concurrency_sweep: { levels: [1], isl: 64, osl: 32, step: 5s, warmup: 1s }
"#;

async fn search() -> SearchResult {
    let setup = Setup::parse(TWO, "search.yaml", Path::new(".")).unwrap();
    run_search(
        SearchOptions {
            setup,
            condition: "p99(ttft) < 200ms".into(),
            max_level: 64,
            out: None,
            live_progress: false,
        },
        &Shutdown::new(),
    )
    .await
    .unwrap()
}

fn level(c: Option<u32>) -> Option<usize> {
    LADDER.iter().position(|&l| Some(l) == c)
}

#[tokio::test(start_paused = true)]
async fn the_search_finds_each_targets_capacity_and_lands_there_again() {
    let first = search().await;
    assert_eq!(first.targets.len(), 2);
    let (small, large) = (&first.targets[0], &first.targets[1]);
    let (s, l) = (
        small.max_concurrency.unwrap(),
        large.max_concurrency.unwrap(),
    );
    // Past its 4 slots a request waits ~0.3 s for one: the small server holds 4 (8 queue for
    // a slot), the large one several times that.
    assert_eq!(s, 4, "{small:?}");
    assert!(l >= 16, "{large:?}");
    for t in &first.targets {
        // The answer sits right below the first failing level, which crossed the bound.
        let (max, failing) = (level(t.max_concurrency).unwrap(), t.first_failing);
        assert_eq!(failing, LADDER.get(max + 1).copied().filter(|&c| c <= 64));
        let best = t
            .probes
            .iter()
            .find(|p| Some(p.concurrency) == t.max_concurrency);
        let best = best.unwrap();
        assert!(best.meets && best.goodput > 0.0, "{best:?}");
        assert!(best.cost_per_million_good_tokens_usd.is_some());
        if let Some(f) = failing {
            let p = t.probes.iter().find(|p| p.concurrency == f).unwrap();
            assert!(!p.meets);
            assert!(
                p.crossed
                    .as_deref()
                    .unwrap()
                    .starts_with("p99(ttft) < 200ms"),
                "{p:?}"
            );
        }
        // A binary search over the 7 levels up to 64: at most 3 probes.
        assert!(t.probes.len() <= 3, "{:?}", t.probes);
    }
    let tables = first.tables();
    let text = tables[0].to_text();
    assert!(text.contains("small") && text.contains("large"), "{text}");

    let again = search().await;
    for (a, b) in first.targets.iter().zip(&again.targets) {
        let (x, y) = (
            level(a.max_concurrency).unwrap(),
            level(b.max_concurrency).unwrap(),
        );
        assert!(x.abs_diff(y) <= 1, "{}: {a:?} then {b:?}", a.target);
    }
}

#[test]
fn conditions_the_search_cannot_decide_are_usage_errors() {
    let limits = parse_search("p99(ttft) < 500ms and p90(itl) <= 50ms").unwrap();
    assert_eq!(limits.len(), 2);
    assert!(!limits[0].inclusive && limits[1].inclusive);
    assert_eq!((limits[0].quantile, limits[1].quantile), (99, 90));
    for bad in [
        "p99(ttft) < 500ms or p99(itl) < 50ms",
        "p95(ttft) < 500ms",
        "p99(ttft{serving_mode=\"aggregated\"}) < 500ms",
        "error_ratio < 0.01",
        "p99(ttft) > 500ms",
        "p99(ttft) <",
    ] {
        assert!(
            matches!(parse_search(bad), Err(ReportError::Usage(_))),
            "{bad}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_ladder_above_the_budgets_max_inflight_is_held_to_it() {
    // Both targets would meet the condition far above 8 streams (see TWO); the global budget
    // allows 8, and the large target's own budget 4.
    let text = TWO.replace(
        "max_running: 32 }",
        "max_running: 32 }, budget: { max_inflight: 4 }",
    ) + "budget: { max_inflight: 8 }\n";
    let setup = Setup::parse(&text, "search.yaml", Path::new(".")).unwrap();
    let result = run_search(
        SearchOptions {
            setup,
            condition: "p99(ttft) < 2s".into(),
            max_level: 256,
            out: None,
            live_progress: false,
        },
        &Shutdown::new(),
    )
    .await
    .unwrap();
    for (t, cap) in result.targets.iter().zip([8, 4]) {
        assert!(!t.probes.is_empty(), "{t:?}");
        assert!(t.probes.iter().all(|p| p.concurrency <= cap), "{t:?}");
        assert_eq!(t.budget_max_inflight, Some(cap), "{t:?}");
        assert_eq!(t.max_concurrency, Some(cap), "{t:?}");
        assert_eq!(t.first_failing, None, "{t:?}");
    }
    let text = result.tables()[0].to_text();
    assert!(text.contains("the budget's max_inflight"), "{text}");
}

/// The log records written while it is the default subscriber, as text.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `[probe K/≤N] TARGET: REST` as (K, N, TARGET, REST).
fn probe_line(line: &str) -> Option<(usize, usize, &str, &str)> {
    let rest = &line[line.find("[probe ")? + "[probe ".len()..];
    let (k, rest) = rest.split_once("/≤")?;
    let (n, rest) = rest.split_once("] ")?;
    let (target, rest) = rest.split_once(": ")?;
    Some((k.parse().ok()?, n.parse().ok()?, target, rest))
}

#[tokio::test(start_paused = true)]
async fn off_a_terminal_each_probe_is_logged_as_it_starts_and_ends() {
    let log = Capture::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let result = {
        let _guard = tracing::subscriber::set_default(subscriber);
        // While a single subscriber exists, tracing asks the default subscriber of whichever
        // thread logs first from a line whether it wants that line, once: another test's
        // thread, which has none, would answer no for every thread. With a second one it asks
        // all that exist.
        let _second = tracing::Dispatch::new(tracing_subscriber::registry());
        tracing::callsite::rebuild_interest_cache();
        search().await
    };
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    // Up to 64 the ladder has 7 levels: a bisection takes at most 3 probes.
    let bound = probes_at_most(7);
    assert_eq!(bound, 3);
    for t in &result.targets {
        let lines: Vec<(usize, usize, &str)> = text
            .lines()
            .filter_map(probe_line)
            .filter(|(_, _, target, _)| *target == t.target)
            .map(|(k, n, _, rest)| (k, n, rest))
            .collect();
        let starts: Vec<_> = lines
            .iter()
            .filter(|(.., rest)| rest.starts_with("concurrency "))
            .collect();
        let ends: Vec<_> = lines
            .iter()
            .filter(|(.., rest)| rest.starts_with("c="))
            .collect();
        assert_eq!(lines.len(), 2 * t.probes.len(), "{text}");
        assert_eq!(starts.len(), t.probes.len(), "{text}");
        assert_eq!(ends.len(), t.probes.len(), "{text}");
        for (i, ((k, n, start), (k2, n2, end))) in starts.iter().zip(&ends).enumerate() {
            // Numbered from 1, never past the bound, which never grows past the ladder's.
            assert_eq!((*k, *k2, *n), (i + 1, i + 1, *n2), "{text}");
            assert!(*k <= *n && *n <= bound, "{text}");
            // `concurrency C; 1s elapsed, about 12s left`, then `c=C: …, met` or `not met`.
            let c: u32 = start["concurrency ".len()..]
                .split(';')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                start.contains(" elapsed, about ") && start.ends_with(" left"),
                "{start}"
            );
            let probe = t.probes.iter().find(|p| p.concurrency == c).unwrap();
            assert!(end.starts_with(&format!("c={c}: p99(ttft) ")), "{end}");
            let verdict = if probe.meets { ", met" } else { ", not met" };
            assert!(end.ends_with(verdict), "{end} for {probe:?}");
        }
        let found = format!(
            "{}: found max concurrency {} ",
            t.target,
            t.max_concurrency.unwrap()
        );
        let found: Vec<&str> = text.lines().filter(|l| l.contains(&found)).collect();
        assert_eq!(found.len(), 1, "{text}");
        let probes = format!("; {} probes in ", t.probes.len());
        assert!(found[0].contains(&probes), "{}", found[0]);
    }
    let probes: usize = result.targets.iter().map(|t| t.probes.len()).sum();
    assert!(
        text.contains(&format!("search: {probes} probes on 2 targets in ")),
        "{text}"
    );
}
