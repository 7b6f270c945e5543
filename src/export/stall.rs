//! The write side of the HTTP surface's connections: a connection whose writes fail once the
//! peer stops reading, or once a response has taken longer to write than its size allows, so no
//! client can hold a connection and a response's buffers for longer than the limits say; each
//! such cut is counted as a refusal.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::TcpStream;

use super::limits::HttpLimits;
use super::refusals::{Refusal, Refusals};

/// A connection whose writes fail once the peer has not read for the stall limit, or once the
/// response being written is past its deadline: hyper has no write timeout of its own, and a
/// scraper that stops reading would otherwise hold its connection (and a response's buffers, and
/// a `/metrics` slot) until the drain.
pub(super) struct StallGuard {
    inner: TcpStream,
    /// Armed while a write waits for the peer.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Armed by a response's first write, disarmed by the next read (the next request): an
    /// HTTP/1 connection alternates them, so this bounds each response's whole writing.
    response_deadline: Option<tokio::time::Instant>,
    limits: HttpLimits,
    /// The size of the response about to be written, set by the service before hyper writes
    /// it (HTTP/1 answers one request at a time), so its deadline follows its size.
    response_bytes: Arc<AtomicU64>,
    refusals: Arc<Refusals>,
    peer: IpAddr,
    /// Whether this connection's cut was counted (hyper may poll a failed writer again).
    counted: bool,
}

impl StallGuard {
    pub(super) fn new(
        inner: TcpStream,
        limits: HttpLimits,
        response_bytes: Arc<AtomicU64>,
        refusals: Arc<Refusals>,
        peer: IpAddr,
    ) -> Self {
        Self {
            inner,
            stall: None,
            response_deadline: None,
            limits,
            response_bytes,
            refusals,
            peer,
            counted: false,
        }
    }

    /// Passes `poll` through, failing it once writes have waited for too long.
    fn guard<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: std::task::Poll<io::Result<T>>,
    ) -> std::task::Poll<io::Result<T>> {
        let deadline = *self.response_deadline.get_or_insert_with(|| {
            let bytes = self.response_bytes.load(Ordering::Acquire);
            tokio::time::Instant::now() + self.limits.write_deadline(bytes)
        });
        if tokio::time::Instant::now() >= deadline {
            return std::task::Poll::Ready(Err(self.cut(Refusal::WriteDeadline)));
        }
        if poll.is_ready() {
            self.stall = None;
            return poll;
        }
        // One timer for both limits: the stall limit from now, or the deadline if sooner (a
        // peer that reads nothing must be cut at its deadline, not at the stall limit).
        let wake = deadline.min(tokio::time::Instant::now() + self.limits.write_stall_timeout);
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake)));
        match stall.as_mut().poll(cx) {
            std::task::Poll::Ready(()) if tokio::time::Instant::now() >= deadline => {
                std::task::Poll::Ready(Err(self.cut(Refusal::WriteDeadline)))
            }
            std::task::Poll::Ready(()) => {
                std::task::Poll::Ready(Err(self.cut(Refusal::WriteStall)))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    /// The error that ends the connection, the cut counted once.
    fn cut(&mut self, why: Refusal) -> io::Error {
        if !self.counted {
            self.counted = true;
            self.refusals.refuse(why, self.peer);
        }
        io::Error::new(io::ErrorKind::TimedOut, why)
    }
}

impl tokio::io::AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if poll.is_ready() {
            self.response_deadline = None;
        }
        poll
    }
}

impl tokio::io::AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
