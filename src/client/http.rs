//! The HTTP side of the client: how every HTTP client of the crate is built (TLS provider, no
//! proxies, redirects only within one origin, the `User-Agent` that names the canary), how a
//! failed exchange is classified and told (the outcome of a request without a response head,
//! error texts without credentials, the setting that stops a server rejecting a field), and
//! reading what follows a decided outcome.

use tokio::time::Instant;

use super::record::Outcome;
use reqwest::header::{
    ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE, HeaderValue,
    USER_AGENT as USER_AGENT_NAME,
};

use super::secret::Secrets;
use super::{ClientConfig, Endpoint, RESPONSE_BYTES_PER_TOKEN, StreamClient, transport};

/// What every request of the canary is sent with as `User-Agent`: measured requests, model
/// lookups, scrapes of a server's metrics, the OTLP push. A server's access log and its
/// operators can then tell the canary's synthetic traffic from users' (beside the traffic
/// marker, which a config may turn off).
pub const USER_AGENT: &str = concat!("llm-canary/", env!("CARGO_PKG_VERSION"));

/// The one way this crate builds an HTTP client (measurement, model lookup, server-metrics
/// scraping): installs the TLS crypto provider reqwest needs, ignores environment proxies,
/// through which latency would measure the proxy rather than the target, and follows a redirect
/// only to the same scheme, host and port (at most [`MAX_REDIRECTS`]): a target's `/v1/models`
/// or `/metrics` must not send the canary, with its API key, to another host. Its requests name
/// the canary ([`USER_AGENT`]).
pub fn http_client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .no_proxy()
        .redirect(same_origin_redirects())
}

/// The most bytes after the end of a stream worth reading to keep its connection.
pub(super) const MAX_TAIL_BYTES: u64 = 64 << 10;

/// Redirects a client built by [`http_client_builder`] follows.
pub const MAX_REDIRECTS: usize = 3;

pub(super) fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt.previous().first().is_some_and(|first| {
            first.scheme() == attempt.url().scheme()
                && first.host_str() == attempt.url().host_str()
                && first.port_or_known_default() == attempt.url().port_or_known_default()
        });
        if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else if same {
            attempt.follow()
        } else {
            let to = crate::config::display_url(attempt.url());
            attempt.error(format!("redirect to another host refused: {to}"))
        }
    })
}

/// The blocking counterpart of [`http_client_builder`], for the OTLP exporter, whose periodic
/// reader sends from a thread without a Tokio reactor; its requests name the canary too.
pub fn blocking_http_client_builder() -> reqwest::blocking::ClientBuilder {
    install_crypto_provider();
    reqwest::blocking::Client::builder()
        .user_agent(USER_AGENT)
        .no_proxy()
}

pub(super) fn install_crypto_provider() {
    // reqwest is built without a bundled TLS crypto provider and refuses to build a client
    // until one is installed; ring is the one this crate links. Losing the race to another
    // installer is fine: a provider is then installed.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// An HTTP error with its causes, as one line, with any credentials in its URL replaced by `***`
/// (reqwest's message repeats the URL).
pub fn error_text(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if let Some(advice) = super::tls::ca_as_server_advice(err) {
        text.push_str(": ");
        text.push_str(advice);
    }
    match err.url() {
        Some(url) => text.replace(url.as_str(), &crate::config::display_url(url)),
        None => text,
    }
}

/// The most body bytes one request may receive (see [`ClientConfig::max_response_bytes`]).
pub(super) fn response_limit(config: &ClientConfig, osl: u32) -> usize {
    let per_request = (osl as usize)
        .saturating_mul(RESPONSE_BYTES_PER_TOKEN)
        .saturating_add(1 << 20);
    config
        .max_response_bytes
        .min(per_request)
        .max(config.max_event_bytes)
}

/// Phrases with which servers reject request fields they do not know: `transformers serve`
/// ("Unexpected fields in the request"), OpenAI ("Unrecognized request argument supplied"),
/// pydantic models that forbid extras ("Extra inputs are not permitted"), and similar.
pub(super) const UNKNOWN_FIELD_PHRASES: &[&str] = &[
    "unexpected field",
    "unrecognized request argument",
    "unrecognized field",
    "unknown field",
    "unknown parameter",
    "unsupported parameter",
    "extra inputs are not permitted",
    "extra fields not permitted",
];

/// For a 400/422 answer that rejects fields this client adds to the body (the length recipe,
/// `nvext`, the `user` marker when `user` was sent), the setting that stops sending them; `None`
/// for any other error.
pub(super) fn rejected_fields_hint(
    status: u16,
    body: &str,
    endpoint: &Endpoint,
    user: bool,
) -> Option<String> {
    if !matches!(status, 400 | 422) {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    if !UNKNOWN_FIELD_PHRASES.iter().any(|p| lower.contains(p)) {
        return None;
    }
    let names = |field: &str| {
        lower.match_indices(field).any(|(at, _)| {
            let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !word(lower[..at].chars().next_back())
                && !word(lower[at + field.len()..].chars().next())
        })
    };
    let lc = endpoint.length_control;
    let length_fields = [
        ("max_tokens", lc.max_tokens),
        ("max_completion_tokens", lc.max_completion_tokens),
        ("min_tokens", lc.min_tokens),
        ("ignore_eos", lc.ignore_eos),
    ];
    let rejected: Vec<&str> = length_fields
        .iter()
        .filter(|(field, sent)| *sent && names(field))
        .map(|(field, _)| *field)
        .collect();
    let mut fixes = Vec::new();
    if !rejected.is_empty() {
        let keep = |field: &str, sent: bool| sent && !rejected.contains(&field);
        fixes.push(format!(
            "the server rejects the length field(s) {}: set the target's `length_control` to the \
             fields it accepts, e.g. `length_control: {{ max_tokens: {}, max_completion_tokens: {}, \
             min_tokens: {}, ignore_eos: {} }}` (or pick the target's `dialect`: dynamo, vllm, \
             sglang, openai or transformers); without `min_tokens`/`ignore_eos` the output length is not forced \
             and `llm_canary_osl_mismatch_total` counts the requests that end early",
            rejected.join(", "),
            keep("max_tokens", lc.max_tokens),
            keep("max_completion_tokens", lc.max_completion_tokens),
            keep("min_tokens", lc.min_tokens),
            keep("ignore_eos", lc.ignore_eos),
        ));
    }
    if endpoint.nvext && names("nvext") {
        fixes.push(
            "the server rejects `nvext`, which only Dynamo understands: set the target's \
             `dialect` to vllm, sglang, openai or transformers"
                .to_owned(),
        );
    }
    let added: Vec<&str> = endpoint
        .extra_fields
        .keys()
        .map(String::as_str)
        .filter(|field| names(&field.to_ascii_lowercase()))
        .collect();
    if !added.is_empty() {
        fixes.push(format!(
            "the server rejects {}, which the config adds: remove it from the target's or the \
             workload's `request.extra_body`",
            added
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if user && names("user") {
        fixes.push(
            "the server rejects the OpenAI `user` field, the canary's traffic marker: set \
             `client.user: \"\"` (the `client.marker_header` still marks the requests)"
                .to_owned(),
        );
    }
    (!fixes.is_empty()).then(|| fixes.join("; "))
}

/// Why an exchange failed.
#[derive(Debug)]
pub(super) enum ExchangeError {
    Transport(transport::TransportError),
    /// The request could not be formed; nothing reached the server.
    Request(String),
}

impl ExchangeError {
    /// The outcome of a request that got no response head.
    pub(super) fn send_outcome(&self) -> Outcome {
        match self {
            ExchangeError::Transport(e) => e.outcome(),
            ExchangeError::Request(_) => Outcome::BadResponse,
        }
    }

    /// The error as one line, without credentials (the transport's errors name `host:port`
    /// only).
    pub(super) fn text(&self) -> String {
        match self {
            ExchangeError::Transport(e) => e.to_string(),
            ExchangeError::Request(message) => message.clone(),
        }
    }
}

/// `Authorization: Basic` for credentials written in a target URL (`https://user:pass@host`),
/// percent-decoded as browsers and curl do; `None` without them.
pub(super) fn basic_authorization(url: &url::Url) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Basic {}", basic_token(url)?)).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// The base64 of `user:password` of the credentials in `url`; `None` without them.
fn basic_token(url: &url::Url) -> Option<String> {
    use base64::Engine;
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let mut pair = percent_decoded(url.username());
    pair.push(b':');
    pair.extend(percent_decoded(url.password().unwrap_or("")));
    Some(base64::engine::general_purpose::STANDARD.encode(pair))
}

fn percent_decoded(s: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(s).collect()
}

/// The secrets of credentials in `url`: the password as written and percent-decoded, and the
/// Basic authorization they make. (The user name is an identity, not a secret.)
pub(super) fn url_secrets(url: &url::Url) -> Secrets {
    let mut secrets = Secrets::none();
    if let Some(password) = url.password() {
        secrets = secrets
            .with(password)
            .with(&String::from_utf8_lossy(&percent_decoded(password)));
    }
    if let Some(token) = basic_token(url) {
        secrets = secrets.with(&token);
    }
    secrets
}

/// POSTs `body` to `endpoint` over the client's own transport and reads the response head;
/// `retried` is set when the request is sent a second time (see [`transport::post`]).
pub(super) async fn post(
    client: &StreamClient,
    endpoint: &Endpoint,
    request_id: &str,
    body: bytes::Bytes,
    retried: &mut bool,
) -> Result<transport::Response, ExchangeError> {
    let json = HeaderValue::from_static("application/json");
    let sse = HeaderValue::from_static("text/event-stream");
    // Token arrival is stamped as bytes arrive: a compressed stream would delay them.
    let identity = HeaderValue::from_static("identity");
    let agent = HeaderValue::from_static(USER_AGENT);
    let id = HeaderValue::from_str(request_id).map_err(|_| {
        ExchangeError::Request(format!("request id {request_id:?} is not a header value"))
    })?;
    let mut headers: Vec<(&str, &HeaderValue)> = vec![
        (CONTENT_TYPE.as_str(), &json),
        (ACCEPT.as_str(), &sse),
        (ACCEPT_ENCODING.as_str(), &identity),
        ("x-request-id", &id),
        (USER_AGENT_NAME.as_str(), &agent),
    ];
    if let Some(authorization) = &endpoint.authorization {
        headers.push((AUTHORIZATION.as_str(), authorization));
    }
    if let Some((name, value)) = &client.config.marker.header {
        headers.push((name.as_str(), value));
    }
    // A config's own headers (`request.headers`), none of which is one of the above.
    headers.extend(endpoint.headers.iter().map(|(n, v)| (n.as_str(), v)));
    transport::post(
        &client.pool,
        &endpoint.origin,
        &endpoint.url,
        &headers,
        body,
        retried,
    )
    .await
    .map_err(ExchangeError::Transport)
}

/// Up to `limit` bytes of an error body, read until `deadline`, with `secrets` masked (a secret
/// the limit cut through included).
pub(super) async fn read_error_body(
    response: &mut transport::Response,
    deadline: Instant,
    limit: usize,
    secrets: &Secrets,
) -> String {
    let mut collected = Vec::new();
    while collected.len() < limit {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                let room = limit - collected.len();
                collected.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&collected);
    // A body that filled the limit may go on past it, through a secret.
    if collected.len() >= limit {
        secrets.mask_cut(&text).into_owned()
    } else {
        secrets.mask(&text).into_owned()
    }
}

/// Reads and discards the rest of a body until it ends or `deadline` passes.
pub(super) async fn drain(response: &mut transport::Response, deadline: Instant) {
    while let Ok(Ok(Some(_))) = tokio::time::timeout_at(deadline, response.chunk()).await {}
}

/// Sleeps until `at`, or forever when there is no instant: a `select!` branch that only some
/// requests have (a cancellation time).
pub(super) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
