//! The measurement path's own HTTP/1.1 transport, over TCP for `http://` targets and over TLS
//! (rustls) for `https://` ones. The task that sends a request owns its connection and reads the
//! stream itself, into a buffer of fixed size, with chunked framing decoded in place: a token
//! costs one wake-up and one read, with no connection task and no channel between the socket and
//! the stamp, and a server that outpaces the client cannot grow the buffer. A [`Pool`] keeps idle
//! keep-alive connections per origin and opens them, TLS handshake included, ahead of a step,
//! ramped (docs/DESIGN.md §4); [`post`] reuses them, and sends a request once more on a new
//! connection when a reused one was lost before any byte of an answer. The bytes of a response
//! are read as [`super::wire`] frames them.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use url::Url;

use super::arrival::StampedTcp;
use super::record::Outcome;
use super::tls::TargetTls;
use super::wire::{self, BodyDecoder, ResponseHead, WireError};

/// What one read may fill, and all a connection ever buffers of a body: a read hands its bytes
/// on before the next, so the buffer is reclaimed instead of grown.
pub const READ_BUF_BYTES: usize = super::arrival::MAX_READ_BYTES;

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
    #[error("the connection closed before a complete response head")]
    ClosedBeforeHead,
    #[error("the connection closed mid-body")]
    ClosedMidBody,
    /// Bytes that are not an HTTP/1.1 response, or not one way.
    #[error(transparent)]
    Wire(#[from] WireError),
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
            TransportError::Wire(e) => e.outcome(),
            TransportError::ClosedBeforeHead
            | TransportError::ClosedMidBody
            | TransportError::Io(_) => Outcome::StreamTruncated,
            // An origin that cannot be set up is refused with the endpoint, before any request;
            // were one sent, it could not connect.
            TransportError::ServerName { .. }
            | TransportError::NoHost
            | TransportError::NoTlsConfig => Outcome::Connect,
        }
    }

    /// Whether the connection was lost (an I/O error, or its end before a response head): what
    /// a server's close of an idle connection does to a request sent on it.
    fn is_connection_loss(&self) -> bool {
        matches!(
            self,
            TransportError::Io(_) | TransportError::ClosedBeforeHead
        )
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
    Tcp(StampedTcp),
    Tls(Box<tokio_rustls::client::TlsStream<StampedTcp>>),
}

impl Conn {
    /// When the bytes of the connection's newest read arrived (client::arrival).
    fn arrived(&self) -> Option<Instant> {
        match self {
            Conn::Tcp(tcp) => tcp.arrived(),
            Conn::Tls(tls) => tls.get_ref().0.arrived(),
        }
    }

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
                    rustix::net::recv(
                        tcp.tcp(),
                        &mut probe[..],
                        RecvFlags::PEEK | RecvFlags::DONTWAIT
                    ),
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
                    match rustix::net::recv(tcp.tcp(), &mut records[..], RecvFlags::DONTWAIT) {
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
            let tcp = StampedTcp::new(tcp);
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

/// Sends a POST of `body` to `url` at `origin` with `headers` and reads the response head.
///
/// A request on a reused connection that fails before any byte of an answer arrives (the write
/// fails, or the connection resets or ends before the status line) is sent once more, on a new
/// connection, and `retried` is set as that begins: the server closed the idle connection as the
/// request went out (a keep-alive limit or idle timeout, which it need not announce), so the
/// failure is the transport's, not the target's. A request the server may have begun answering,
/// or one that failed on a new connection, is never sent again.
pub async fn post(
    pool: &Arc<Pool>,
    origin: &Arc<Origin>,
    url: &Url,
    headers: &[(&str, &HeaderValue)],
    body: Bytes,
    retried: &mut bool,
) -> Result<Response, TransportError> {
    let request = request_bytes(&origin.authority, url, headers, &body);
    // A request that asks for the close gets it, whatever the answer says (RFC 9112 §9.6).
    let closes = headers.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case("connection") && wire::lists_option(value.as_bytes(), "close")
    });
    let respond = |(conn, buf, head): (Conn, BytesMut, ResponseHead), connect| Response {
        status: head.status,
        content_length: head.content_length,
        keep_alive: head.persistent && !closes,
        headers: head.headers,
        body: head.body,
        arrived: conn.arrived(),
        stream: Some(conn),
        buf,
        pool: Arc::clone(pool),
        origin: Arc::clone(origin),
        connect,
    };
    if let Some(conn) = pool.checkout(origin) {
        match exchange(conn, &request).await {
            Ok(sent) => return Ok(respond(sent, None)),
            Err(Failed {
                error,
                answered: false,
            }) if error.is_connection_loss() => {
                tracing::debug!(
                    authority = %origin.authority,
                    error = %error,
                    "a reused connection failed before any byte of an answer: sending once more on a new one"
                );
                *retried = true;
            }
            Err(failed) => return Err(failed.error),
        }
    }
    let started = Instant::now();
    let conn = pool.connect(origin).await?;
    let connect = started.elapsed();
    let sent = exchange(conn, &request).await.map_err(|f| f.error)?;
    Ok(respond(sent, Some(connect)))
}

/// The bytes of a POST of `body` to `url` with `headers`.
fn request_bytes(
    authority: &str,
    url: &Url,
    headers: &[(&str, &HeaderValue)],
    body: &[u8],
) -> Vec<u8> {
    let mut head = Vec::with_capacity(256 + headers.len() * 48 + body.len());
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
    head.extend_from_slice(body);
    head
}

/// An exchange that failed, and whether any byte of an answer had arrived.
struct Failed {
    error: TransportError,
    answered: bool,
}

/// Writes `request` on `conn` and reads the response head: the connection, the buffer holding
/// what followed the head, and the head.
async fn exchange(
    mut conn: Conn,
    request: &[u8],
) -> Result<(Conn, BytesMut, ResponseHead), Failed> {
    let mut buf = BytesMut::with_capacity(READ_BUF_BYTES);
    let mut answered = false;
    let result = async {
        conn.write_all(request).await?;
        // TLS holds what it encrypted until flushed; for TCP this does nothing.
        conn.flush().await?;
        read_head(&mut conn, &mut buf, &mut answered).await
    }
    .await;
    match result {
        Ok(head) => Ok((conn, buf, head)),
        Err(error) => Err(Failed { error, answered }),
    }
}

/// Reads until `buf` holds a complete response head; `answered` is set by the first byte.
async fn read_head(
    stream: &mut Conn,
    buf: &mut BytesMut,
    answered: &mut bool,
) -> Result<ResponseHead, TransportError> {
    loop {
        if let Some(head) = wire::parse_head(buf)? {
            return Ok(head);
        }
        buf.reserve(READ_BUF_BYTES);
        if stream.read_buf(buf).await? == 0 {
            return Err(TransportError::ClosedBeforeHead);
        }
        *answered = true;
    }
}

/// A response whose body is read by the task that sent the request.
#[derive(Debug)]
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    content_length: Option<u64>,
    /// `None` once the body ended and the connection went back to the pool.
    stream: Option<Conn>,
    /// When the bytes of the newest read arrived: the head's, then each body read's.
    arrived: Option<Instant>,
    buf: BytesMut,
    body: BodyDecoder,
    /// Whether the connection may carry another request once the body is read.
    keep_alive: bool,
    pool: Arc<Pool>,
    origin: Arc<Origin>,
    /// How long opening the connection took, when this request opened it.
    connect: Option<Duration>,
}

impl Response {
    /// When the bytes of the newest read arrived, the kernel's receive time where it gives one
    /// (client::arrival): the head's until the body is read, then the read that completed the
    /// piece [`Response::chunk`] returned last (a piece is handed out as soon as its last byte is
    /// read, so its bytes end in the newest read).
    pub fn arrived(&self) -> Option<Instant> {
        self.arrived
    }

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
            if let Some(piece) = self.body.decode(&mut self.buf)? {
                return Ok(Some(piece));
            }
            if self.body.is_done() {
                self.release();
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Ok(None);
            };
            if self.buf.capacity() - self.buf.len() < READ_BUF_BYTES / 4 {
                self.buf.reserve(READ_BUF_BYTES);
            }
            let n = stream.read_buf(&mut self.buf).await?;
            self.arrived = stream.arrived().or(self.arrived);
            if n == 0 {
                self.stream = None;
                if self.body.closed() {
                    return Ok(None);
                }
                return Err(TransportError::ClosedMidBody);
            }
        }
    }

    /// At the body's end: the connection goes back to the pool when both sides keep it and the
    /// server sent nothing past the body.
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

    /// What a [`scripted`] server does with one request.
    #[derive(Clone, Copy)]
    enum Act {
        /// Answers it, and keeps the connection.
        Answer,
        /// Closes the connection without a byte of answer.
        Close,
        /// Writes these bytes of an answer, then closes.
        Partial(&'static [u8]),
    }

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// A server that does `script(connection, request)` with each request (both counted from 0)
    /// and counts the connections it accepted.
    async fn scripted(
        script: fn(usize, usize) -> Act,
    ) -> (Url, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let conn = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    for request in 0.. {
                        let mut got = Vec::new();
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            }
                        }
                        let reply = match script(conn, request) {
                            Act::Answer => ANSWER,
                            Act::Close => return,
                            Act::Partial(bytes) => bytes,
                        };
                        if s.write_all(reply).await.is_err() {
                            return;
                        }
                        if let Act::Partial(_) = script(conn, request) {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/v1/x").parse().unwrap(), accepted)
    }

    /// Two requests in turn through one pool, the first answered: whether the second was, and
    /// whether it was sent again.
    async fn two_requests(url: &Url, request_headers: &[(&str, &HeaderValue)]) -> (bool, bool) {
        let (pool, origin) = (pool(), origin(url));
        let mut first = post(
            &pool,
            &origin,
            url,
            request_headers,
            Bytes::new(),
            &mut false,
        )
        .await
        .unwrap();
        assert_eq!(body(&mut first).await.unwrap(), b"ok");
        let mut retried = false;
        let second = post(
            &pool,
            &origin,
            url,
            request_headers,
            Bytes::new(),
            &mut retried,
        )
        .await;
        let ok = match second {
            Ok(mut resp) => body(&mut resp).await.is_ok_and(|b| b == b"ok"),
            Err(_) => false,
        };
        (ok, retried)
    }

    #[tokio::test]
    async fn a_reused_connection_lost_before_any_answer_is_retried_once_on_a_new_one() {
        // The server hangs up on the second request of its first connection, unanswered.
        let (url, accepted) = scripted(|conn, request| match (conn, request) {
            (0, 1) => Act::Close,
            _ => Act::Answer,
        })
        .await;
        assert_eq!(two_requests(&url, &[]).await, (true, true));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_the_server_began_answering_or_sent_on_a_new_connection_is_never_retried() {
        // Part of a status line, then the close: the server had the request.
        let (url, accepted) = scripted(|conn, request| match (conn, request) {
            (0, 1) => Act::Partial(b"HTTP/1.1 2"),
            _ => Act::Answer,
        })
        .await;
        assert_eq!(two_requests(&url, &[]).await, (false, false));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A request on a connection of its own that is lost: the target's failure, as it is.
        let (url, accepted) = scripted(|_, _| Act::Close).await;
        let mut retried = false;
        let err = post(
            &pool(),
            &origin(&url),
            &url,
            &[],
            Bytes::new(),
            &mut retried,
        )
        .await
        .unwrap_err();
        assert!(matches!(err, TransportError::ClosedBeforeHead), "{err}");
        assert!(!retried);
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Lost on its retry too: one retry, then the failure.
        let (url, accepted) = scripted(|conn, request| match (conn, request) {
            (0, 0) => Act::Answer,
            _ => Act::Close,
        })
        .await;
        assert_eq!(two_requests(&url, &[]).await, (false, true));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_request_that_asked_for_the_close_does_not_keep_its_connection() {
        let (url, accepted) = scripted(|_, _| Act::Answer).await;
        let close = HeaderValue::from_static("Close");
        assert_eq!(
            two_requests(&url, &[("Connection", &close)]).await,
            (true, false)
        );
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";

    #[tokio::test]
    async fn chunked_bodies_decode_split_anywhere_and_the_connection_is_reused() {
        for pieces in [1, 7, CHUNKED.len()] {
            let (url, accepted) = server(CHUNKED, pieces).await;
            let pool = pool();
            for i in 0..3 {
                let mut resp = post(
                    &pool,
                    &origin(&url),
                    &url,
                    &[],
                    Bytes::from_static(b"{}"),
                    &mut false,
                )
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
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let mut resp = post(&pool, &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
            .await
            .unwrap();
        let err = body(&mut resp).await.unwrap_err();
        // A chunk size that is not hex is not HTTP/1.1's chunked coding: a bad response.
        assert_eq!(err.outcome(), Outcome::BadResponse, "{err}");

        let (url, _) = server(b"NOT HTTP AT ALL\r\n\r\n", 1).await;
        let err = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let err = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
            .await
            .unwrap_err();
        assert_eq!(err.outcome(), Outcome::Connect, "{err}");
    }

    #[tokio::test]
    async fn a_chunk_size_with_a_sign_is_a_bad_response() {
        for reply in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
        ] {
            let (url, _) = server(reply, 1).await;
            let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
            let err = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
            let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let mut resp = post(&pool(), &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let mut resp = post(&pool, &origin(&url), &url, &[], Bytes::new(), &mut false)
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
        let (mut closed, mut open) = (
            Conn::Tcp(StampedTcp::new(closed)),
            Conn::Tcp(StampedTcp::new(open)),
        );
        assert!(closed.still_open() && open.still_open());
        // The server closes one, as its keep-alive timeout would; readable once its FIN is in.
        drop(server_side);
        let Conn::Tcp(tcp) = &closed else {
            unreachable!()
        };
        tcp.tcp().readable().await.unwrap();
        assert!(!closed.still_open());
        // The closed one is the newest idle connection: it is passed over, the open one is taken.
        pool.checkin(&origin, open);
        pool.checkin(&origin, closed);
        let Some(Conn::Tcp(taken)) = pool.checkout(&origin) else {
            panic!("the open connection")
        };
        assert_eq!(taken.tcp().local_addr().unwrap().port(), open_port);
        assert!(pool.checkout(&origin).is_none());
    }
}
