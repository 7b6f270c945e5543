//! A raw HTTP/1.1 server on loopback answering canned bytes (for what no real server sends), a
//! keep-alive server that ends its connections the ways real servers and proxies do, and a canned
//! SSE chat completion.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What [`raw_server`] answers to one request.
pub enum RawReply {
    /// These bytes (head and body), then the connection closes.
    Bytes(Vec<u8>),
    /// `head`, then `chunk` over and over until the client goes away (a server that streams
    /// forever, or one endless line).
    Endless { head: Vec<u8>, chunk: Vec<u8> },
    /// These bytes, then the connection stays open, silent, until the client closes it.
    Hold(Vec<u8>),
}

/// An HTTP/1.1 server on loopback that answers every request with `reply(request head)` and
/// keeps every request head it saw (to check what the client sent). Each connection serves one
/// request.
pub async fn raw_server(
    reply: impl Fn(&str) -> RawReply + Send + Sync + 'static,
) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&heads);
    let reply = std::sync::Arc::new(reply);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let reply = std::sync::Arc::clone(&reply);
            let seen = std::sync::Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let Some(head) = read_request(&mut stream, &mut buf).await else {
                    return;
                };
                seen.lock().unwrap().push(head.clone());
                match reply(&head) {
                    RawReply::Bytes(b) => {
                        let _ = stream.write_all(&b).await;
                    }
                    RawReply::Endless { head, chunk } => {
                        if stream.write_all(&head).await.is_err() {
                            return;
                        }
                        while stream.write_all(&chunk).await.is_ok() {}
                    }
                    RawReply::Hold(b) => {
                        if stream.write_all(&b).await.is_err() {
                            return;
                        }
                        // Read (and drop) until the client goes away.
                        let mut tmp = [0u8; 4096];
                        while matches!(stream.read(&mut tmp).await, Ok(n) if n > 0) {}
                    }
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, heads)
}

/// Reads one HTTP/1.1 request from `stream`, after what `buf` already holds: its head, then as
/// much body as its Content-Length says. Returns the head and leaves in `buf` what follows the
/// request (a kept-alive connection's next one); `None` when the connection ends first.
pub async fn read_request<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Option<String> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        read_more(stream, buf).await?;
    }
    buf.drain(..head_end + length);
    Some(head)
}

/// One read from `stream` appended to `buf`; `None` at its end or on an error.
async fn read_more<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Option<()> {
    use tokio::io::AsyncReadExt;
    let mut tmp = [0u8; 4096];
    let n = stream.read(&mut tmp).await.ok().filter(|n| *n > 0)?;
    buf.extend_from_slice(&tmp[..n]);
    Some(())
}

/// A complete SSE chat-completion response of `tokens` one-word chunks, with usage, after which
/// the server closes (`connection: close`).
pub fn sse_ok(model: &str, tokens: usize) -> Vec<u8> {
    sse_reply(model, tokens, "HTTP/1.1 200 OK\r\nconnection: close")
}

/// The response of [`sse_ok`] under the status line and fields of `head` (no CRLF at its end;
/// `content-type` and `content-length` are added).
pub fn sse_reply(model: &str, tokens: usize, head: &str) -> Vec<u8> {
    let mut body = String::new();
    for i in 0..tokens {
        let chunk = serde_json::json!({"id": "r1", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": format!("w{i} ")}, "finish_reason": null}]});
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    let last = serde_json::json!({"id": "r1", "object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens}});
    body.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
    format!(
        "{head}\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The value of the request's `Authorization` header ("" without one), as a server that echoes
/// it reads it.
pub fn authorization_of(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default()
}

/// A refusal that repeats the request's `Authorization` header in its body, as some gateways'
/// error pages do: 401 with `{"error": {...}, "received": "<the header's value>", "filler":
/// "<pad bytes>", "again": "<the header's value>"}` (the filler moves the second copy as far into
/// the body as a test wants).
pub fn echo_authorization_401(head: &str, pad: usize) -> RawReply {
    let sent = serde_json::Value::String(authorization_of(head));
    let body = format!(
        r#"{{"error":{{"message":"invalid credentials","type":"invalid_request_error"}},"received":{sent},"filler":"{}","again":{sent}}}"#,
        "f".repeat(pad),
    );
    RawReply::Bytes(
        format!(
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// How a [`keep_alive_server`] ends its connections; none says so with `Connection: close`.
#[derive(Debug, Clone, Copy)]
pub enum Hangup {
    /// Never: every connection serves requests until the client closes it.
    Never,
    /// Closed at once after this many responses (a request-count keep-alive limit): whether the
    /// client sees the close before it reuses the connection is the network's race.
    AfterResponses(usize),
    /// After this many responses the next request is read and left unanswered, and the
    /// connection closed: the race above, always lost by the client.
    OnRequestAfter(usize),
    /// A connection idle for `idle` after a response is closed, which takes the server `closing`
    /// more: a request that arrives in that time is lost with the connection, unanswered (the
    /// server's idle timeout racing the client's next request).
    IdleTimeout { idle: Duration, closing: Duration },
}

/// A [`keep_alive_server`] and what it counted.
pub struct KeepAliveServer {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub accepted: Arc<AtomicUsize>,
    /// Requests answered, counted as the answer is written (a request lost to a hangup is not).
    pub answered: Arc<AtomicUsize>,
}

/// A server on loopback that answers every request with `reply` (a whole response, framed by its
/// Content-Length) on connections it keeps until `hangup` ends them.
pub async fn keep_alive_server(reply: Vec<u8>, hangup: Hangup) -> KeepAliveServer {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = KeepAliveServer {
        addr: listener.local_addr().unwrap(),
        accepted: Arc::default(),
        answered: Arc::default(),
    };
    let (accepted, answered) = (Arc::clone(&server.accepted), Arc::clone(&server.answered));
    let reply: Arc<[u8]> = reply.into();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let (answered, reply) = (Arc::clone(&answered), Arc::clone(&reply));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for served in 0usize.. {
                    let next = match hangup {
                        Hangup::AfterResponses(n) if served == n => return,
                        Hangup::OnRequestAfter(n) if served == n => {
                            // Whatever arrives (or the end) closes it, unanswered.
                            let _ = read_more(&mut stream, &mut buf).await;
                            return;
                        }
                        Hangup::IdleTimeout { idle, closing } if served > 0 => {
                            let next = read_request(&mut stream, &mut buf);
                            match tokio::time::timeout(idle, next).await {
                                Ok(head) => head,
                                Err(_) => {
                                    tokio::time::sleep(closing).await;
                                    return;
                                }
                            }
                        }
                        _ => read_request(&mut stream, &mut buf).await,
                    };
                    if next.is_none() {
                        return;
                    }
                    // Counted before the answer goes out: once it is out, the client may finish
                    // and read the count before this task runs again.
                    answered.fetch_add(1, Ordering::SeqCst);
                    if stream.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    server
}
