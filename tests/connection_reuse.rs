//! Reusing a kept-alive connection never costs a request its outcome (docs/RELIABILITY.md rows
//! 24 and 25). Servers and proxies hang up kept-alive connections without a `Connection: close`
//! (a limit on requests per connection, an idle timeout), and an HTTP/1.0 server keeps none
//! unless it says `keep-alive`; none of that is the target failing. A request that failed on a
//! reused connection before any byte of an answer arrived is sent once more on a new connection
//! and counted as retried; a connection the response says or implies is closing is never reused.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use llm_canary::client::{
    ClientConfig, Endpoint, Outcome, Prompt, RequestRecord, StreamClient, StreamRequest,
};
use llm_canary::config::{Api, Dialect};
use llm_canary::export::metrics::Metrics;
use llm_canary::model::{Finished, Phase, RecordContext, Sink};
use llm_canary::request::{GoodputLimits, RequestLabels, ServingMode};
use support::{Hangup, KeepAliveServer, keep_alive_server, sse_reply};

fn client() -> StreamClient {
    StreamClient::new(ClientConfig {
        request_timeout: Duration::from_secs(20),
        first_token_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    })
    .unwrap()
}

fn endpoint(server: &KeepAliveServer) -> Endpoint {
    Endpoint::new(
        &format!("http://{}", server.addr),
        Api::Chat,
        "m",
        Dialect::Openai,
    )
    .unwrap()
}

async fn send(client: &StreamClient, endpoint: &Endpoint, id: String) -> RequestRecord {
    let request = StreamRequest {
        request_id: id,
        prompt: Prompt::Text("hello".into()),
        osl: 4,
    };
    client
        .send(endpoint, &request, tokio::time::Instant::now())
        .await
}

/// `sequential` requests one after another, then `tasks` tasks sending `each` one after another
/// at the same time, all through one client (one pool).
async fn traffic(
    server: &KeepAliveServer,
    sequential: usize,
    tasks: usize,
    each: usize,
) -> Vec<RequestRecord> {
    let (client, endpoint) = (client(), endpoint(server));
    let mut records = Vec::new();
    for i in 0..sequential {
        records.push(send(&client, &endpoint, format!("seq-{i}")).await);
    }
    let concurrent = (0..tasks).map(|t| {
        let (client, endpoint) = (client.clone(), endpoint.clone());
        tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..each {
                mine.push(send(&client, &endpoint, format!("task-{t}-{i}")).await);
            }
            mine
        })
    });
    for task in futures_util::future::join_all(concurrent).await {
        records.extend(task.unwrap());
    }
    records
}

/// What the requests came to: the failed ones (outcome and error) and how many were retried.
/// A retried request was measured as any other: from its intended send, its new connection's
/// connect inside its TTFT.
fn tally(records: &[RequestRecord]) -> (Vec<String>, usize) {
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.outcome != Outcome::Ok)
        .map(|r| {
            format!(
                "{} {}: {}",
                r.request_id,
                r.outcome.as_str(),
                r.error.as_deref().unwrap_or("")
            )
        })
        .collect();
    let retried: Vec<&RequestRecord> = records.iter().filter(|r| r.retried).collect();
    for r in &retried {
        let connect = r.connect.expect("a retry opens a new connection, timed");
        let ttft = r
            .ttft()
            .expect("a retried request that succeeded has a first token");
        assert!(connect <= ttft, "{connect:?} {ttft:?}");
        assert!(r.intended <= r.sent);
    }
    (failed, retried.len())
}

/// `llm_canary_connection_retries_total{target}` once `records` reached the exporter as the
/// recorder hands every finished request on.
fn exported_retries(records: &[RequestRecord]) -> f64 {
    let metrics = Metrics::new(&[]);
    let labels = RequestLabels::new("t", ServingMode::Aggregated, "concurrency_sweep");
    for rec in records {
        let request = StreamRequest {
            request_id: rec.request_id.clone(),
            prompt: Prompt::Text("hello".into()),
            osl: 4,
        };
        let ctx = RecordContext {
            target_index: 0,
            isl: 0,
            labels: &labels,
            phase: Phase::Steady,
            osl: 4,
            shared_prefix_tokens: 0,
            request: &request,
            goodput: GoodputLimits {
                ttft: 2.0,
                itl: 0.1,
            },
        };
        metrics.request(&Finished::new(&ctx, rec));
    }
    let text = metrics.encode().unwrap();
    support::metrics::sample(
        &text,
        "llm_canary_connection_retries_total",
        &[("target", "t")],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_hangs_up_after_three_responses_costs_no_request() {
    for hangup in [Hangup::OnRequestAfter(3), Hangup::AfterResponses(3)] {
        let server = keep_alive_server(sse_reply("m", 4, "HTTP/1.1 200 OK"), hangup).await;
        let records = traffic(&server, 30, 6, 5).await;
        let (failed, retried) = tally(&records);
        let accepted = server.accepted.load(Ordering::SeqCst);
        eprintln!(
            "{hangup:?}: {} requests, {} failed, {retried} retried, {accepted} connections",
            records.len(),
            failed.len()
        );
        assert!(failed.is_empty(), "{hangup:?}: {failed:#?}");
        // Each request was answered once: a retry only follows an attempt nobody answered.
        assert_eq!(server.answered.load(Ordering::SeqCst), 60, "{hangup:?}");
        assert!(
            retried <= accepted,
            "{retried} retries, {accepted} connections"
        );
        assert_eq!(exported_retries(&records), retried as f64);
        if let Hangup::OnRequestAfter(_) = hangup {
            // The sequential requests alone: the 4th, 7th, ... 28th found their connection
            // hung up on them.
            assert!(retried >= 9, "{retried} retried");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_response_closes_is_never_reused() {
    // HTTP/1.0 without keep-alive, and HTTP/1.1 with `close` in a second `Connection` field:
    // each connection ends with its response; the server would hang up on a second request.
    for head in [
        "HTTP/1.0 200 OK",
        "HTTP/1.1 200 OK\r\nconnection: upgrade\r\nConnection: Keep-Alive, CLOSE",
    ] {
        let server = keep_alive_server(sse_reply("m", 4, head), Hangup::OnRequestAfter(1)).await;
        let records = traffic(&server, 20, 4, 5).await;
        let (failed, retried) = tally(&records);
        let accepted = server.accepted.load(Ordering::SeqCst);
        eprintln!(
            "{head:?}: {} requests, {} failed, {retried} retried, {accepted} connections",
            records.len(),
            failed.len()
        );
        assert!(failed.is_empty(), "{head:?}: {failed:#?}");
        assert_eq!(
            retried, 0,
            "{head:?}: no connection was reused, none had to be retried"
        );
        assert_eq!(accepted, 40, "{head:?}: one connection per request");
    }
    // HTTP/1.0 with keep-alive keeps its connection.
    let server = keep_alive_server(
        sse_reply("m", 4, "HTTP/1.0 200 OK\r\nconnection: keep-alive"),
        Hangup::Never,
    )
    .await;
    let records = traffic(&server, 10, 0, 0).await;
    assert_eq!(tally(&records), (Vec::new(), 0));
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_timeout_racing_the_next_request_costs_no_request() {
    // The server closes a connection idle for 200 ms, which takes it 200 ms more; the client
    // waits 100 ms (served), 300 ms (its request lands in the closing: lost) or 500 ms (the
    // close is in: a new connection) between requests.
    let (idle, closing) = (Duration::from_millis(200), Duration::from_millis(200));
    let server = keep_alive_server(
        sse_reply("m", 4, "HTTP/1.1 200 OK"),
        Hangup::IdleTimeout { idle, closing },
    )
    .await;
    let (client, endpoint) = (client(), endpoint(&server));
    let mut records = Vec::new();
    for i in 0..12u64 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(100 + 200 * (i % 3))).await;
        }
        records.push(send(&client, &endpoint, format!("idle-{i}")).await);
    }
    let (failed, retried) = tally(&records);
    eprintln!(
        "idle timeout: {} requests, {} failed, {retried} retried, {} connections",
        records.len(),
        failed.len(),
        server.accepted.load(Ordering::SeqCst)
    );
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(server.answered.load(Ordering::SeqCst), 12);
    // Four requests were sent into the closing; on a machine too busy to keep 100 ms apart
    // some may find the close instead, but not all.
    assert!(retried >= 1, "{retried} retried");
}
