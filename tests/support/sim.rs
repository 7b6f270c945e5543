//! The embedded simulator on loopback, alone or with a scraper of its `/metrics`.

use std::sync::Arc;

use llm_canary::config::ServingMode;
use llm_canary::export::Metrics;
use llm_canary::scrape::{ScrapeTarget, ServerScraper};
use llm_canary::sim::{SimHandle, SimSpec};

/// A simulator of `spec` serving as `mode` on a free loopback port.
pub async fn start_sim(spec: SimSpec, mode: ServingMode) -> SimHandle {
    llm_canary::sim::start(spec, mode, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// The `fast` profile, nothing else set.
pub fn fast() -> SimSpec {
    SimSpec {
        profile: "fast".into(),
        ..SimSpec::default()
    }
}

/// `n` words `{salt}0 {salt}1 …`: a prompt no other salt shares a prefix with.
pub fn words(n: usize, salt: &str) -> String {
    (0..n)
        .map(|i| format!("{salt}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A scraper of `targets` (name, `/metrics` URL) publishing into fresh metrics.
pub fn scraper(targets: &[(&str, String)]) -> (Arc<Metrics>, ServerScraper) {
    let metrics = Arc::new(Metrics::new(&[]));
    let scraper = ServerScraper::new(
        targets
            .iter()
            .map(|(name, url)| ScrapeTarget {
                name: (*name).into(),
                urls: vec![url.clone()],
            })
            .collect(),
        metrics.clone(),
        llm_canary::client::DEFAULT_POOL_IDLE_TIMEOUT,
    )
    .unwrap();
    (metrics, scraper)
}

/// A simulator on loopback, its base URL, and a scraper of its `/metrics` as target `sim`
/// publishing into fresh metrics.
pub async fn scraped_sim(
    spec: SimSpec,
    mode: ServingMode,
) -> (SimHandle, String, Arc<Metrics>, ServerScraper) {
    let sim = start_sim(spec, mode).await;
    let base = sim.base_url();
    let (metrics, scraper) = scraper(&[("sim", format!("{base}/metrics"))]);
    (sim, base, metrics, scraper)
}
