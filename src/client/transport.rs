//! The measurement path's own HTTP/1.1 transport, over TCP for `http://` targets and over TLS
//! (rustls) for `https://` ones. The task that sends a request owns its connection and reads the
//! stream itself, into a buffer of fixed size, with chunked framing decoded in place: a token
//! costs one wake-up and one read, with no connection task and no channel between the socket and
//! the stamp, and a server that outpaces the client cannot grow the buffer. A [`Pool`] keeps idle
//! keep-alive connections per origin and opens them, TLS handshake included, ahead of a step,
//! ramped (docs/DESIGN.md §4).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use url::Url;

use super::record::Outcome;
use super::tls::TargetTls;

/// What one read may fill, and all a connection ever buffers of a body: a read hands its bytes
/// on before the next, so the buffer is reclaimed instead of grown.
pub const READ_BUF_BYTES: usize = 16 << 10;
/// The largest response head accepted.
const MAX_HEAD_BYTES: usize = 64 << 10;
const MAX_HEADERS: usize = 96;
/// The longest chunk-size line (hex digits and extensions).
const MAX_CHUNK_LINE: usize = 1024;

/// Why an exchange failed before or while reading its response.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot resolve {authority}: {source}")]
    Resolve {
        authority: String,
        source: std::io::Error,
    },
    #[error(
        "tcp connect to {authority} failed: {source}{advice}",
        advice = crate::fds::exhausted_advice(.source)
    )]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error(
        "TLS handshake with {authority} failed: {source}{advice}",
        advice = super::tls::advice_suffix(.source)
    )]
    Tls {
        authority: String,
        source: std::io::Error,
    },
    #[error("connect to {authority} timed out after {timeout:?}")]
    ConnectTimeout {
        authority: String,
        timeout: Duration,
    },
    #[error("the response head is not HTTP/1.1: {0}")]
    Head(String),
    #[error("the connection closed before a complete response head")]
    ClosedBeforeHead,
    #[error("the connection closed mid-body")]
    ClosedMidBody,
    #[error("bad chunked framing: {0}")]
    Framing(&'static str),
    /// A chunk-size line that is not hex digits (with an optional `;extension`): the server does
    /// not speak HTTP/1.1's chunked coding, or speaks it so that a proxy could read it otherwise.
    #[error("bad chunked framing: the chunk size {0:?} is not hex digits")]
    ChunkSize(String),
    /// Content-Length values that disagree, or one that is not a number: the body's end cannot
    /// be known (RFC 9112 §6.3).
    #[error("invalid Content-Length: {0}")]
    ContentLength(String),
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{name:?} is not a TLS server name: {source}")]
    ServerName {
        name: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("no host")]
    NoHost,
    #[error("an https:// URL needs a TLS config")]
    NoTlsConfig,
}

impl TransportError {
    /// The outcome of a request that ended with this error.
    pub fn outcome(&self) -> Outcome {
        match self {
            TransportError::Resolve { .. }
            | TransportError::Connect { .. }
            | TransportError::Tls { .. }
            | TransportError::ConnectTimeout { .. } => Outcome::Connect,
            // The server answered, but not in HTTP.
            TransportError::Head(_)
            | TransportError::ChunkSize(_)
            | TransportError::ContentLength(_) => Outcome::BadResponse,
            TransportError::ClosedBeforeHead
            | TransportError::ClosedMidBody
            | TransportError::Framing(_)
            | TransportError::Io(_) => Outcome::StreamTruncated,
            // An origin that cannot be set up is refused with the endpoint, before any request;
            // were one sent, it could not connect.
            TransportError::ServerName { .. }
            | TransportError::NoHost
            | TransportError::NoTlsConfig => Outcome::Connect,
        }
    }
}

/// Where a target's connections go and how they are made: `host:port`, and for an `https://`
/// target the TLS config and the name the server's certificate must carry.
#[derive(Debug, Clone)]
pub struct Origin {
    authority: String,
    /// The pool's key: connections of another TLS config (another CA, another client
    /// certificate) to the same host are never handed out for this one.
    key: String,
    tls: Option<(Arc<TargetTls>, ServerName<'static>)>,
}

impl Origin {
    /// The origin of `url`: TLS with `tls` for an `https://` URL (which then needs one), plain
    /// TCP for `http://`.
    pub fn new(url: &Url, tls: Option<Arc<TargetTls>>) -> Result<Self, TransportError> {
        let authority = authority(url);
        let tls =
            match (url.scheme(), tls) {
                ("https", Some(tls)) => {
                    let name =
                        match url.host() {
                            Some(url::Host::Domain(d)) => ServerName::try_from(d.to_owned())
                                .map_err(|source| TransportError::ServerName {
                                    name: d.to_owned(),
                                    source,
                                })?,
                            Some(url::Host::Ipv4(ip)) => ServerName::from(std::net::IpAddr::V4(ip)),
                            Some(url::Host::Ipv6(ip)) => ServerName::from(std::net::IpAddr::V6(ip)),
                            None => return Err(TransportError::NoHost),
                        };
                    Some((tls, name))
                }
                ("https", None) => return Err(TransportError::NoTlsConfig),
                _ => None,
            };
        let key = match &tls {
            Some((tls, _)) => format!("tls{}:{authority}", tls.id()),
            None => authority.clone(),
        };
        Ok(Origin {
            authority,
            key,
            tls,
        })
    }

    /// Whether connections to this origin are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// One connection: TCP, or TLS over TCP.
#[derive(Debug)]
enum Conn {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Conn {
    /// Whether an idle connection can take a request: nothing to read yet. Asked of the socket
    /// itself (a peek that never blocks), not of the runtime's readiness, which may not have
    /// seen the server's FIN yet; a close, an error or bytes nobody asked for make it unusable.
    /// A TLS connection first hands what arrived to its TLS session: a TLS 1.3 server sends its
    /// session tickets after the handshake, and those are not a reason to drop the connection.
    fn still_open(&mut self) -> bool {
        use rustix::io::Errno;
        use rustix::net::RecvFlags;
        match self {
            Conn::Tcp(tcp) => {
                let mut probe = [0u8; 1];
                matches!(
                    rustix::net::recv(&*tcp, &mut probe[..], RecvFlags::PEEK | RecvFlags::DONTWAIT),
                    Err(Errno::AGAIN)
                )
            }
            Conn::Tls(tls) => {
                let (tcp, session) = tls.get_mut();
                // Usable while the session holds no plaintext nobody asked for (what arrived
                // after a response, also from before it was idle) and no close from the peer.
                let quiet = |session: &mut rustls::ClientConnection| {
                    session.process_new_packets().is_ok_and(|state| {
                        state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed()
                    })
                };
                let mut records = [0u8; 4096];
                loop {
                    if !quiet(session) {
                        return false;
                    }
                    match rustix::net::recv(&*tcp, &mut records[..], RecvFlags::DONTWAIT) {
                        Err(Errno::AGAIN) => return true,
                        // The server closed, or the socket failed.
                        Ok((_, 0)) | Err(_) => return false,
                        Ok((got, _)) => {
                            let mut rest = &records[..got];
                            while !rest.is_empty() {
                                if session.read_tls(&mut rest).is_err() || !quiet(session) {
                                    return false;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Idle keep-alive connections per origin, newest last; shared by every request of a client.
#[derive(Debug)]
pub struct Pool {
    idle: Mutex<HashMap<String, VecDeque<(Conn, Instant)>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Whether the task that closes idle connections runs (started with the first one).
    reaper: std::sync::atomic::AtomicBool,
}

/// What [`Pool::prewarm`] did.
#[derive(Debug, Clone, Default)]
pub struct Prewarmed {
    /// Connections opened now (the rest were idle already).
    pub opened: usize,
    /// How long each new connection took to establish.
    pub connect_times: Vec<Duration>,
    /// The first connect error, when some could not be opened.
    pub error: Option<String>,
}

impl Pool {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        Pool {
            idle: Mutex::new(HashMap::new()),
            connect_timeout,
            idle_timeout,
            reaper: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Closes, every half idle timeout, the connections idle for longer: a canary that pauses
    /// or stops sending to a target holds no connection to it (a server counts them, and a
    /// proxy's idle timeout would break them anyway). The task ends with the pool.
    fn start_reaper(self: &std::sync::Arc<Self>) {
        if self.reaper.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let pool = std::sync::Arc::downgrade(self);
        let every = (self.idle_timeout / 2).max(Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = pool.upgrade() else { return };
                pool.expire(Instant::now());
            }
        });
    }

    fn expire(&self, now: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        for conns in idle.values_mut() {
            // The oldest are in front.
            while conns.front().is_some_and(|(_, since)| {
                now.saturating_duration_since(*since) >= self.idle_timeout
            }) {
                conns.pop_front();
            }
        }
        idle.retain(|_, conns| !conns.is_empty());
    }

    /// The newest idle connection to `origin` that is still open. An idle connection the
    /// server has closed (its keep-alive timeout) reads as end-of-file; one past the idle
    /// timeout is closed here, before the server's own timeout races a request.
    fn checkout(&self, origin: &Origin) -> Option<Conn> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.get_mut(&origin.key)?;
        while let Some((mut conn, since)) = conns.pop_back() {
            if now.saturating_duration_since(since) >= self.idle_timeout {
                // The rest are older still.
                conns.clear();
                return None;
            }
            if conn.still_open() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(self: &Arc<Self>, origin: &Origin, conn: Conn) {
        self.start_reaper();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(origin.key.clone()).or_default();
        conns.push_back((conn, Instant::now()));
    }

    /// Idle connections to `origin` now.
    pub fn idle_count(&self, origin: &Origin) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get(&origin.key).map_or(0, VecDeque::len)
    }

    /// A new connection to `origin`, ready for a request: the TCP connect, and for TLS the
    /// handshake, both within the connect timeout.
    async fn connect(&self, origin: &Origin) -> Result<Conn, TransportError> {
        let authority = &origin.authority;
        let connect = async {
            let mut last = None;
            let addrs = tokio::net::lookup_host(authority).await.map_err(|source| {
                TransportError::Resolve {
                    authority: authority.to_owned(),
                    source,
                }
            })?;
            let mut tcp = None;
            for addr in addrs {
                match TcpStream::connect(addr).await {
                    Ok(stream) => {
                        tcp = Some(stream);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            let tcp = tcp.ok_or_else(|| TransportError::Connect {
                authority: authority.to_owned(),
                source: last.unwrap_or_else(|| std::io::Error::other("no address")),
            })?;
            // Tokens are small writes: never let Nagle hold the request's tail.
            tcp.set_nodelay(true)?;
            let Some((tls, name)) = &origin.tls else {
                return Ok(Conn::Tcp(tcp));
            };
            let handshake = tokio_rustls::TlsConnector::from(Arc::clone(tls.config()))
                .connect(name.clone(), tcp)
                .await
                .map_err(|source| TransportError::Tls {
                    authority: authority.to_owned(),
                    source,
                })?;
            Ok(Conn::Tls(Box::new(handshake)))
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| TransportError::ConnectTimeout {
                authority: authority.to_owned(),
                timeout: self.connect_timeout,
            })?
    }

    /// Opens connections to `origin` until `n` are idle, at most `ramp` connects (and TLS
    /// handshakes) at a time, so a step's first requests neither pay for them nor flood the
    /// server's accept queue with `n` connects at once.
    pub async fn prewarm(self: &Arc<Self>, origin: &Origin, n: usize, ramp: usize) -> Prewarmed {
        let mut done = Prewarmed::default();
        let missing = n.saturating_sub(self.idle_count(origin));
        let mut left = missing;
        while left > 0 && done.error.is_none() {
            let batch = left.min(ramp.max(1));
            let opened = futures_util::future::join_all((0..batch).map(|_| async {
                let started = Instant::now();
                self.connect(origin).await.map(|s| (s, started.elapsed()))
            }))
            .await;
            for result in opened {
                match result {
                    Ok((conn, took)) => {
                        done.opened += 1;
                        done.connect_times.push(took);
                        self.checkin(origin, conn);
                    }
                    Err(e) => {
                        done.error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            left -= batch;
        }
        done
    }
}

/// `host:port` of `url` (the port its scheme implies when it names none).
pub fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    let port = url.port_or_known_default().unwrap_or(80);
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Sends a POST of `body` to `url` at `origin` with `headers` and reads the response head. A
/// reused connection is checked for a close before the request is written; once written, a
/// request is never sent twice.
pub async fn post(
    pool: &Arc<Pool>,
    origin: &Arc<Origin>,
    url: &Url,
    headers: &[(&str, &HeaderValue)],
    body: Bytes,
) -> Result<Response, TransportError> {
    let authority = &origin.authority;
    let mut head = Vec::with_capacity(256 + headers.len() * 48);
    head.extend_from_slice(b"POST ");
    head.extend_from_slice(url.path().as_bytes());
    if let Some(q) = url.query() {
        head.push(b'?');
        head.extend_from_slice(q.as_bytes());
    }
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(authority.as_bytes());
    for (name, value) in headers {
        head.extend_from_slice(b"\r\n");
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
    }
    head.extend_from_slice(b"\r\ncontent-length: ");
    head.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    head.extend_from_slice(b"\r\n\r\n");
    head.extend_from_slice(&body);

    let (mut stream, connect) = match pool.checkout(origin) {
        Some(stream) => (stream, None),
        None => {
            let started = Instant::now();
            let stream = pool.connect(origin).await?;
            (stream, Some(started.elapsed()))
        }
    };
    stream.write_all(&head).await?;
    // TLS holds what it encrypted until flushed; for TCP this does nothing.
    stream.flush().await?;
    let mut buf = BytesMut::with_capacity(READ_BUF_BYTES);
    let (status, headers) = read_head(&mut stream, &mut buf).await?;
    let header = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let chunked = header(http::header::TRANSFER_ENCODING)
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    // With chunked framing a Content-Length is ignored (RFC 9112 §6.3), also a broken one.
    let content_length = match content_length(&headers) {
        Ok(n) => n,
        Err(_) if chunked => None,
        Err(e) => return Err(e),
    };
    let keep_alive =
        !header(http::header::CONNECTION).is_some_and(|c| c.to_ascii_lowercase().contains("close"));
    let framing = match (chunked, content_length) {
        (true, _) => Framing::Chunked(ChunkState::Size),
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::Close,
    };
    let keep_alive = keep_alive && !matches!(framing, Framing::Close);
    Ok(Response {
        status,
        headers,
        content_length,
        stream: Some(stream),
        buf,
        framing,
        keep_alive,
        pool: Arc::clone(pool),
        origin: Arc::clone(origin),
        connect,
    })
}

/// The body length the `Content-Length` fields announce: every value (fields repeated, or one
/// field holding a list) must be the same run of digits, else the framing is invalid (RFC 9112
/// §6.3: conflicting lengths are an unrecoverable error; repeats of one value count once).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, TransportError> {
    let mut length = None;
    for field in headers.get_all(http::header::CONTENT_LENGTH) {
        let shown = || String::from_utf8_lossy(field.as_bytes()).into_owned();
        for value in field.as_bytes().split(|&b| b == b',') {
            let value = value.trim_ascii();
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    TransportError::ContentLength(format!("{:?} is not a length", shown()))
                })?;
            match length {
                Some(seen) if seen != n => {
                    return Err(TransportError::ContentLength(format!(
                        "two lengths, {seen} and {n}"
                    )));
                }
                _ => length = Some(n),
            }
        }
    }
    Ok(length)
}

/// The size of a chunk-size line (`1a`, `1a;name=value`, hex digits optionally followed by
/// spaces or tabs before an extension, as RFC 9112 §7.1 has it); `None` for anything else: a
/// sign, a `0x`, leading space, no digit, or a size over `u64`.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = &line[digits..];
    let after_space = rest.trim_ascii_start();
    let tail_ok = after_space.is_empty() || after_space[0] == b';';
    let spaces_ok = rest[..rest.len() - after_space.len()]
        .iter()
        .all(|b| matches!(b, b' ' | b'\t'));
    if digits == 0 || !tail_ok || !spaces_ok {
        return None;
    }
    // Hex digits are ASCII.
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

async fn read_head(
    stream: &mut Conn,
    buf: &mut BytesMut,
) -> Result<(StatusCode, HeaderMap), TransportError> {
    loop {
        let mut parsed = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut parsed);
        match resp.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = resp
                    .code
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .ok_or_else(|| TransportError::Head("no status code".into()))?;
                let mut headers = HeaderMap::with_capacity(resp.headers.len());
                for h in resp.headers.iter() {
                    let name = HeaderName::from_bytes(h.name.as_bytes())
                        .map_err(|e| TransportError::Head(e.to_string()))?;
                    let value = HeaderValue::from_bytes(h.value)
                        .map_err(|e| TransportError::Head(e.to_string()))?;
                    headers.append(name, value);
                }
                buf.advance(len);
                // An interim 1xx answer (100 Continue) is followed by the real head.
                if status.is_informational() {
                    continue;
                }
                return Ok((status, headers));
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(TransportError::Head(e.to_string())),
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(TransportError::Head(format!(
                "the head is over {} KiB",
                MAX_HEAD_BYTES >> 10
            )));
        }
        buf.reserve(READ_BUF_BYTES);
        if stream.read_buf(buf).await? == 0 {
            return Err(TransportError::ClosedBeforeHead);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Chunked(ChunkState),
    /// Content-Length: bytes left.
    Length(u64),
    /// Until the server closes.
    Close,
    /// The body is complete.
    Done,
}

/// A response whose body is read by the task that sent the request.
#[derive(Debug)]
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    content_length: Option<u64>,
    /// `None` once the body ended and the connection went back to the pool.
    stream: Option<Conn>,
    buf: BytesMut,
    framing: Framing,
    keep_alive: bool,
    pool: Arc<Pool>,
    origin: Arc<Origin>,
    /// How long opening the connection took, when this request opened it.
    connect: Option<Duration>,
}

impl Response {
    /// How long opening the connection took, when this request found none idle and opened it.
    pub fn connect_time(&self) -> Option<Duration> {
        self.connect
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// The next piece of the body (`None` at its end), reading the socket only when nothing
    /// complete is buffered. Bytes are handed out without a copy; the buffer they came from is
    /// reused once they are dropped.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        loop {
            if let Some(piece) = self.decode()? {
                return Ok(Some(piece));
            }
            if self.framing == Framing::Done {
                self.release();
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Ok(None);
            };
            if self.buf.capacity() - self.buf.len() < READ_BUF_BYTES / 4 {
                self.buf.reserve(READ_BUF_BYTES);
            }
            if stream.read_buf(&mut self.buf).await? == 0 {
                self.stream = None;
                if self.framing == Framing::Close {
                    self.framing = Framing::Done;
                    return Ok(None);
                }
                return Err(TransportError::ClosedMidBody);
            }
        }
    }

    /// Takes the next complete piece of body out of the buffer, advancing the framing.
    fn decode(&mut self) -> Result<Option<Bytes>, TransportError> {
        loop {
            match self.framing {
                Framing::Done => return Ok(None),
                Framing::Close => {
                    return Ok((!self.buf.is_empty()).then(|| self.buf.split().freeze()));
                }
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    return Ok(None);
                }
                Framing::Length(left) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (left as usize).min(self.buf.len());
                    self.framing = Framing::Length(left - n as u64);
                    return Ok(Some(self.buf.split_to(n).freeze()));
                }
                Framing::Chunked(ChunkState::Data(left)) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (left as usize).min(self.buf.len());
                    let rest = left - n as u64;
                    self.framing = Framing::Chunked(if rest == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(rest)
                    });
                    return Ok(Some(self.buf.split_to(n).freeze()));
                }
                Framing::Chunked(state) => {
                    let Some(end) = memchr::memmem::find(&self.buf, b"\r\n") else {
                        if self.buf.len() > MAX_CHUNK_LINE {
                            return Err(TransportError::Framing("a chunk line over 1 KiB"));
                        }
                        return Ok(None);
                    };
                    let line = self.buf.split_to(end + 2);
                    let line = &line[..end];
                    self.framing = match state {
                        ChunkState::Size => {
                            let size = chunk_size(line).ok_or_else(|| {
                                let shown = &line[..line.len().min(32)];
                                TransportError::ChunkSize(
                                    String::from_utf8_lossy(shown).into_owned(),
                                )
                            })?;
                            Framing::Chunked(if size == 0 {
                                ChunkState::Trailer
                            } else {
                                ChunkState::Data(size)
                            })
                        }
                        ChunkState::DataEnd if line.is_empty() => {
                            Framing::Chunked(ChunkState::Size)
                        }
                        ChunkState::DataEnd => {
                            return Err(TransportError::Framing("no CRLF after a chunk's data"));
                        }
                        ChunkState::Trailer if line.is_empty() => Framing::Done,
                        ChunkState::Trailer => Framing::Chunked(ChunkState::Trailer),
                        ChunkState::Data(_) => unreachable!("handled above"),
                    };
                }
            }
        }
    }

    /// At the body's end: the connection goes back to the pool when the server keeps it and
    /// sent nothing past the body.
    fn release(&mut self) {
        if let Some(stream) = self.stream.take()
            && self.keep_alive
            && self.buf.is_empty()
        {
            self.pool.checkin(&self.origin, stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::net::TcpListener;

    /// A server that answers each request on a connection with `reply`, written in `pieces`
    /// byte-sized writes, and counts the connections it accepted.
    async fn server(
        reply: &'static [u8],
        pieces: usize,
    ) -> (Url, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let mut got = Vec::new();
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            }
                        }
                        let step = reply.len().div_ceil(pieces.max(1));
                        for piece in reply.chunks(step) {
                            if s.write_all(piece).await.is_err() {
                                return;
                            }
                            s.flush().await.unwrap();
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/v1/x").parse().unwrap(), accepted)
    }

    fn origin(url: &Url) -> Arc<Origin> {
        Arc::new(Origin::new(url, None).unwrap())
    }

    fn pool() -> Arc<Pool> {
        Arc::new(Pool::new(Duration::from_secs(5), Duration::from_secs(90)))
    }

    async fn body(resp: &mut Response) -> Result<Vec<u8>, TransportError> {
        let mut all = Vec::new();
        while let Some(piece) = resp.chunk().await? {
            all.extend_from_slice(&piece);
        }
        Ok(all)
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";

    #[tokio::test]
    async fn chunked_bodies_decode_split_anywhere_and_the_connection_is_reused() {
        for pieces in [1, 7, CHUNKED.len()] {
            let (url, accepted) = server(CHUNKED, pieces).await;
            let pool = pool();
            for i in 0..3 {
                let mut resp = post(&pool, &origin(&url), &url, &[], Bytes::from_static(b"{}"))
                    .await
                    .unwrap();
                // Only the request that opened the connection paid for (and times) a connect.
                assert_eq!(resp.connect_time().is_some(), i == 0);
                assert_eq!(resp.status(), StatusCode::OK);
                assert_eq!(resp.headers()["content-type"], "text/event-stream");
                assert_eq!(body(&mut resp).await.unwrap(), b"hello, world");
            }
            assert_eq!(
                accepted.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "{pieces} pieces"
            );
        }
    }

    #[tokio::test]
    async fn content_length_and_close_delimited_bodies() {
        let (url, _) = server(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc", 2).await;
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(resp.content_length(), Some(3));
        assert_eq!(body(&mut resp).await.unwrap(), b"abc");

        let (url, _) = server(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end",
            3,
        )
        .await;
        let pool = pool();
        let mut resp = post(&pool, &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap();
        // The server keeps the socket open: the first piece arrives, the end would need a close.
        let first = resp.chunk().await.unwrap().unwrap();
        assert!(!first.is_empty());
        assert!(!resp.keep_alive);
    }

    #[tokio::test]
    async fn broken_framing_and_heads_are_errors_with_their_outcome() {
        let (url, _) = server(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            1,
        )
        .await;
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap();
        let err = body(&mut resp).await.unwrap_err();
        // A chunk size that is not hex is not HTTP/1.1's chunked coding: a bad response.
        assert_eq!(err.outcome(), Outcome::BadResponse, "{err}");

        let (url, _) = server(b"NOT HTTP AT ALL\r\n\r\n", 1).await;
        let err = post(&pool(), &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.outcome(), Outcome::BadResponse, "{err}");

        // Nothing listens on a port just released.
        let free = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let url: Url = format!("http://{free}/").parse().unwrap();
        let err = post(&pool(), &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap_err();
        assert_eq!(err.outcome(), Outcome::Connect, "{err}");
    }

    #[test]
    fn a_chunk_size_is_hex_digits_with_an_optional_extension_and_nothing_else() {
        for (line, size) in [
            (&b"1a"[..], 26),
            (b"1A", 26),
            (b"0", 0),
            (b"000f", 15),
            (b"5;ext=1", 5),
            (b"5 ;ext", 5),
            (b"5\t", 5),
            (b"ffffffffffffffff", u64::MAX),
        ] {
            assert_eq!(chunk_size(line), Some(size), "{:?}", line.escape_ascii());
        }
        for line in [
            &b"+1a"[..],
            b"-1",
            b"0x1a",
            b" 1a",
            b"1a x",
            b"1g",
            b"",
            b";ext",
            b"1a\r",
            b"\xef\xbc\x91",
            b"10000000000000000",
        ] {
            assert_eq!(chunk_size(line), None, "{:?}", line.escape_ascii());
        }
    }

    #[tokio::test]
    async fn a_chunk_size_with_a_sign_is_a_bad_response() {
        for reply in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
        ] {
            let (url, _) = server(reply, 1).await;
            let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new())
                .await
                .unwrap();
            let err = body(&mut resp).await.unwrap_err();
            assert_eq!(err.outcome(), Outcome::BadResponse, "{err}");
            assert!(err.to_string().contains("not hex digits"), "{err}");
        }
    }

    #[tokio::test]
    async fn conflicting_content_lengths_are_a_bad_response_and_repeats_of_one_are_not() {
        for head in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 5\r\n\r\nabcde"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 3, 5\r\n\r\nabcde",
            b"HTTP/1.1 200 OK\r\ncontent-length: +3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\ncontent-length: three\r\n\r\nabc",
        ] {
            let (url, _) = server(head, 1).await;
            let err = post(&pool(), &origin(&url), &url, &[], Bytes::new())
                .await
                .unwrap_err();
            assert_eq!(err.outcome(), Outcome::BadResponse, "{err}");
            assert!(err.to_string().contains("Content-Length"), "{err}");
        }
        for head in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\nabc",
        ] {
            let (url, _) = server(head, 1).await;
            let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new())
                .await
                .unwrap();
            assert_eq!(resp.content_length(), Some(3));
            assert_eq!(body(&mut resp).await.unwrap(), b"abc");
        }
        // Chunked framing wins over any Content-Length (RFC 9112 §6.3), a broken one included.
        let (url, _) = server(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 1, 2\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            1,
        )
        .await;
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(body(&mut resp).await.unwrap(), b"abc");
    }

    #[tokio::test]
    async fn prewarm_opens_what_is_missing_in_ramps_and_requests_use_them() {
        let (url, accepted) = server(CHUNKED, 1).await;
        let pool = pool();
        let done = pool.prewarm(&origin(&url), 10, 4).await;
        assert_eq!(done.opened, 10);
        assert_eq!(done.connect_times.len(), 10);
        assert!(done.error.is_none());
        assert_eq!(pool.idle_count(&origin(&url)), 10);
        // Already warm: nothing more to open.
        assert_eq!(pool.prewarm(&origin(&url), 10, 4).await.opened, 0);
        let mut resp = post(&pool, &origin(&url), &url, &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(body(&mut resp).await.unwrap(), b"hello, world");
        // It took a warm connection and gave it back: still 10, none opened for it.
        assert_eq!(pool.idle_count(&origin(&url)), 10);
        assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) <= 10);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_close_after_the_idle_timeout_without_traffic() {
        let (url, _) = server(CHUNKED, 1).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5), Duration::from_secs(10)));
        assert_eq!(pool.prewarm(&origin(&url), 3, 3).await.opened, 3);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(
            pool.idle_count(&origin(&url)),
            3,
            "still within the idle timeout"
        );
        // The reaper runs every 5 s: by 15 s every connection idle since 0 s is closed.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(pool.idle_count(&origin(&url)), 0);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_not_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Url = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let origin = origin(&url);
        let pool = pool();
        let closed = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        let open = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (_kept, _) = listener.accept().await.unwrap();
        let open_port = open.local_addr().unwrap().port();
        let (mut closed, mut open) = (Conn::Tcp(closed), Conn::Tcp(open));
        assert!(closed.still_open() && open.still_open());
        // The server closes one, as its keep-alive timeout would; readable once its FIN is in.
        drop(server_side);
        let Conn::Tcp(tcp) = &closed else {
            unreachable!()
        };
        tcp.readable().await.unwrap();
        assert!(!closed.still_open());
        // The closed one is the newest idle connection: it is passed over, the open one is taken.
        pool.checkin(&origin, open);
        pool.checkin(&origin, closed);
        let Some(Conn::Tcp(taken)) = pool.checkout(&origin) else {
            panic!("the open connection")
        };
        assert_eq!(taken.local_addr().unwrap().port(), open_port);
        assert!(pool.checkout(&origin).is_none());
    }
}
