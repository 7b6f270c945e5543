//! Every fault the simulator injects is seen by the project's own streaming client as its own
//! outcome class, with an error latency (docs/DESIGN.md §4 error kinds; the simulator's fault matrix).

mod support;

use std::time::Duration;

use llm_canary::client::{ClientConfig, Endpoint, Outcome, Prompt, StreamClient, StreamRequest};
use llm_canary::config::{Api, Dialect, ServingMode};
use llm_canary::sim::SimSpec;
use tokio::time::Instant;

fn spec(faults: &str) -> SimSpec {
    let yaml = format!("profile: fast\nfaults: {faults}\n");
    serde_saphyr::from_str(&yaml).unwrap()
}

async fn one(faults: &str, timeout: Duration) -> llm_canary::client::RequestRecord {
    let sim = support::sim::start_sim(spec(faults), ServingMode::Aggregated).await;
    let client = StreamClient::new(ClientConfig {
        request_timeout: timeout,
        ..ClientConfig::default()
    })
    .unwrap();
    let endpoint = Endpoint::new(&sim.base_url(), Api::Chat, "m", Dialect::Dynamo).unwrap();
    let req = StreamRequest {
        request_id: "fault-1".into(),
        prompt: Prompt::Text("one two three four five six seven eight".into()),
        osl: 16,
    };
    let rec = client.send(&endpoint, &req, Instant::now()).await;
    sim.shutdown().await;
    rec
}

#[tokio::test]
async fn every_fault_kind_has_its_own_outcome() {
    let long = Duration::from_secs(10);
    let cases: &[(&str, Duration, Outcome)] = &[
        ("{}", long, Outcome::Ok),
        ("{ error: { status: 429 } }", long, Outcome::Http429),
        ("{ error: { status: 500 } }", long, Outcome::Http5xx),
        ("{ error: { status: 503 } }", long, Outcome::Http5xx),
        ("{ error: { status: 400 } }", long, Outcome::Http4xx),
        (
            "{ stall: { after_tokens: 4, duration: 5s } }",
            Duration::from_millis(400),
            Outcome::Timeout,
        ),
        (
            "{ truncate: { after_tokens: 4 } }",
            long,
            Outcome::StreamTruncated,
        ),
        (
            "{ truncate: { after_tokens: 4, abrupt: true } }",
            long,
            Outcome::StreamTruncated,
        ),
        (
            "{ malformed_chunk: { after_tokens: 4 } }",
            long,
            Outcome::BadResponse,
        ),
        (
            "{ error_event: { after_tokens: 4 } }",
            long,
            Outcome::StreamError,
        ),
        (
            "{ slow_first_byte: { delay: 5s } }",
            Duration::from_millis(400),
            Outcome::Timeout,
        ),
        (
            "{ refuse_connections: stop_accepting }",
            long,
            Outcome::Connect,
        ),
    ];
    for (faults, timeout, want) in cases {
        let rec = one(faults, *timeout).await;
        assert_eq!(rec.outcome, *want, "fault {faults}: {:?}", rec.error);
        if *want != Outcome::Ok {
            assert!(
                rec.error_latency().is_some(),
                "fault {faults}: error latency recorded"
            );
            assert!(rec.error.is_some(), "fault {faults}: error message kept");
        } else {
            assert_eq!(rec.output_tokens(), 16);
        }
        if faults.contains("after_tokens: 4") {
            // What arrived before the fault is kept: four tokens and their TTFT.
            assert_eq!(rec.client_tokens(), 4, "fault {faults}");
            assert!(rec.ttft().is_some(), "fault {faults}");
        }
    }
    // A slow first byte within the timeout is a slow, successful request: TTFT shows the delay.
    let rec = one("{ slow_first_byte: { delay: 300ms } }", long).await;
    assert_eq!(rec.outcome, Outcome::Ok);
    assert!(rec.ttft().unwrap() >= Duration::from_millis(300));
}
