//! The write side of the HTTP surface's connections: a connection whose writes fail once the
//! peer stops reading, or once a response has taken too long to write, so no client can hold a
//! connection and a response's buffers for longer than the limits say.

use std::io;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::TcpStream;

/// A connection whose writes fail once the peer has not read for `limit`: hyper has no write
/// timeout of its own, and a scraper that stops reading would otherwise hold its connection (and
/// a response's buffers) until the drain.
pub(super) struct StallGuard {
    pub(super) inner: TcpStream,
    /// Armed while a write waits for the peer.
    pub(super) stall: Option<Pin<Box<tokio::time::Sleep>>>,
    pub(super) limit: Duration,
    /// Armed by a response's first write, disarmed by the next read (the next request): an
    /// HTTP/1 connection alternates them, so this bounds each response's whole writing.
    pub(super) response_deadline: Option<tokio::time::Instant>,
    pub(super) response_limit: Duration,
}

impl StallGuard {
    /// Passes `poll` through, failing it once writes have waited for too long.
    fn guard<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        poll: std::task::Poll<io::Result<T>>,
    ) -> std::task::Poll<io::Result<T>> {
        let deadline = *self
            .response_deadline
            .get_or_insert_with(|| tokio::time::Instant::now() + self.response_limit);
        if tokio::time::Instant::now() >= deadline {
            return std::task::Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took too long to read the response",
            )));
        }
        if poll.is_ready() {
            self.stall = None;
            return poll;
        }
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.limit)));
        match stall.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading the response",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
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
