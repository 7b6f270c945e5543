//! When each request reached the simulator's host: the kernel's receive stamp of the first
//! segment of a request on a connection (`client::arrival`'s stamped reads), for the send log.
//! The simulator shares its cores with the client in every benchmark, so it may read a request
//! well after it came; its own clock starts when it does, and a send log that began a request
//! there would charge the simulator's lateness to the client (docs/PERFORMANCE.md, "What users
//! run: the product path", the TTFT error).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::client::arrival::StampedTcp;

/// The arrival of the oldest read on a connection not yet taken by a request.
#[derive(Debug, Default)]
pub(super) struct Arrivals(Mutex<Option<Instant>>);

impl Arrivals {
    /// The arrival of the oldest untaken read, forgetting it: taken as a request's head is
    /// handed over (its first read), and again once its body is read, so a request never takes
    /// the arrival of the one before it.
    pub(super) fn take(&self) -> Option<Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn offer(&self, at: Option<Instant>) {
        let mut first = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = at;
        }
    }
}

/// A server connection whose reads tell [`Arrivals`] when their bytes came.
#[derive(Debug)]
pub(super) struct ArrivalIo {
    tcp: StampedTcp,
    arrivals: Arc<Arrivals>,
}

impl ArrivalIo {
    pub(super) fn new(tcp: TcpStream) -> (ArrivalIo, Arc<Arrivals>) {
        let arrivals = Arc::new(Arrivals::default());
        let io = ArrivalIo {
            tcp: StampedTcp::new(tcp),
            arrivals: Arc::clone(&arrivals),
        };
        (io, arrivals)
    }
}

impl AsyncRead for ArrivalIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.tcp).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.arrivals.offer(this.tcp.arrived());
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ArrivalIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A request that waits in the socket while the server is busy keeps the time it came, and
    /// the next request on the connection never takes the one before it.
    #[tokio::test]
    async fn a_request_read_late_keeps_its_arrival_and_the_next_takes_its_own() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut client = client.unwrap();
        let (mut io, arrivals) = ArrivalIo::new(server.unwrap().0);
        let mut buf = [0u8; 64];

        let written = Instant::now();
        client.write_all(b"first").await.unwrap();
        // The server reads late on purpose. Whether the stamp is the kernel's (the arrival,
        // `client::arrival`'s tests hold that) or, before the kernel turns stamping on, the
        // read's own time, it lies between the write and the read.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let n = io.read(&mut buf).await.unwrap();
        let read = Instant::now();
        assert_eq!(&buf[..n], b"first");
        let first = arrivals.take().expect("a read offers its arrival");
        assert!(first + Duration::from_millis(1) >= written && first <= read);
        assert_eq!(arrivals.take(), None, "taken once");

        // Two reads before the next take: the older one is the request's arrival.
        client.write_all(b"head").await.unwrap();
        io.read_exact(&mut buf[..4]).await.unwrap();
        let head = arrivals.take().unwrap();
        assert!(head >= first);
        client.write_all(b"body").await.unwrap();
        io.read_exact(&mut buf[..4]).await.unwrap();
        let before_more = Instant::now();
        client.write_all(b"more").await.unwrap();
        io.read_exact(&mut buf[..4]).await.unwrap();
        let body = arrivals.take().unwrap();
        assert!(
            body >= head && body <= before_more,
            "the newer read's arrival was kept"
        );
        assert_eq!(arrivals.take(), None);
    }
}
