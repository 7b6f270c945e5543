//! Plain HTTP to loopback servers (the daemon, the simulator, a serving engine): a client, `GET`
//! as text or JSON, and a `/metrics` scrape.

use std::time::Duration;

/// The crate's HTTP client (no proxy, a TLS provider installed), with `timeout` per request.
pub fn http_client(timeout: Option<Duration>) -> reqwest::Client {
    let builder = llm_canary::client::http_client_builder();
    match timeout {
        Some(t) => builder.timeout(t),
        None => builder,
    }
    .build()
    .unwrap()
}

/// The body of `GET url` as text.
pub async fn get_text(client: &reqwest::Client, url: &str) -> reqwest::Result<String> {
    client.get(url).send().await?.text().await
}

/// The body of `GET url` as JSON; `Err` says what failed.
pub async fn get_json(client: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    let body = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?
        .bytes()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
}

/// `base`'s `/metrics` text (`base` as `http://host:port`); panics when the scrape fails.
pub async fn scrape(client: &reqwest::Client, base: &str) -> String {
    get_text(client, &format!("{base}/metrics"))
        .await
        .unwrap_or_else(|e| panic!("scrape {base}/metrics: {e}"))
}
