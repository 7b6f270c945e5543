//! When a response's bytes reached this host: the kernel's receive timestamp of each read of a
//! measurement connection (`SO_TIMESTAMPNS`, read through `recvmsg`). A read's stamp is the
//! arrival of the newest segment it took, so a token's time is when it came off the network, not
//! when the canary's runtime got round to reading it: a canary busy with a thousand streams on
//! two cores delays its reads, never its measurements (docs/METRICS.md, "The request record").
//! Where the kernel gives no stamp (it does not support it, or the socket refused the option), a
//! read is stamped when it returns, as before. The kernel stamps in `CLOCK_REALTIME`; the stamp becomes a
//! monotonic [`Instant`] by its age against the wall clock read beside the monotonic one, and a
//! stamp that a wall-clock step would put in the future, or more than [`MAX_AGE`] back, is
//! replaced by the read's own time, so a clock step can only make a stamp as late as before.
//! A server can share [`FirstArrival`] with a connection to learn when each request came: the
//! simulator's send log does (`sim::server`).

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, setsockopt, sockopt};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The most one read of a measurement connection takes (the transport's buffer reserves this
/// much for a read, `transport::READ_BUF_BYTES`): a stamped read's scratch is as large, so a read
/// is never cut short here.
pub const MAX_READ_BYTES: usize = 16 << 10;

/// The oldest a kernel stamp may be against the read that returns it: beyond it the wall clock
/// more likely stepped than the bytes waited, and the read's own time is used.
pub const MAX_AGE: Duration = Duration::from_secs(10);

thread_local! {
    /// Where a stamped read lands before it is copied into the caller's buffer: `recvmsg` wants
    /// initialised memory, a response buffer's spare capacity is not, and zeroing it for every
    /// read would cost more than copying the bytes that came. One per runtime thread: a read
    /// begins and ends within one poll.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; MAX_READ_BYTES].into_boxed_slice());
}

/// Room for one `SCM_TIMESTAMPNS` control message (`CMSG_SPACE(sizeof(struct timespec))` is 32
/// bytes on 64-bit Linux), aligned as control messages must be.
#[repr(C, align(8))]
struct ControlBuf([u8; 64]);

/// A TCP connection whose reads are stamped with the arrival of what they took.
#[derive(Debug)]
pub struct StampedTcp {
    tcp: TcpStream,
    /// Whether the kernel was asked to stamp this socket's segments (and accepted).
    kernel: bool,
    /// The newest read's arrival; never earlier than the read before it.
    arrived: Option<Instant>,
    /// Whether the newest read carried the kernel's stamp. The kernel turns receive stamping on
    /// for the whole host a moment after the first socket asks (deferred work), so the first
    /// segments after start-up may come unstamped and are stamped when the read returns.
    kernel_stamped: bool,
    /// Where each read offers its arrival, when a server asked ([`StampedTcp::sharing_first_arrival`]).
    first: Option<Arc<FirstArrival>>,
    /// The `recvmsg` calls made, for the test that a short read costs no second one.
    #[cfg(test)]
    recvs: std::cell::Cell<u32>,
}

impl StampedTcp {
    /// `tcp`, with the kernel asked to stamp what it receives.
    pub fn new(tcp: TcpStream) -> StampedTcp {
        let kernel = match setsockopt(&tcp, sockopt::ReceiveTimestampns, &true) {
            Ok(()) => true,
            Err(err) => {
                static TOLD: std::sync::Once = std::sync::Once::new();
                TOLD.call_once(|| {
                    tracing::warn!(
                        error = %err,
                        "the kernel does not stamp received segments (SO_TIMESTAMPNS): token arrival is stamped when each read returns, which a busy canary delays"
                    );
                });
                false
            }
        };
        StampedTcp {
            tcp,
            kernel,
            arrived: None,
            kernel_stamped: false,
            first: None,
            #[cfg(test)]
            recvs: std::cell::Cell::new(0),
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// When the bytes of the newest read arrived; `None` before the first read.
    pub fn arrived(&self) -> Option<Instant> {
        self.arrived
    }

    /// Whether reads carry the kernel's stamps (else each read's own return time).
    #[cfg(test)]
    pub fn kernel_stamps(&self) -> bool {
        self.kernel
    }

    /// Whether the newest read carried the kernel's stamp.
    #[cfg(test)]
    pub fn last_read_kernel_stamped(&self) -> bool {
        self.kernel_stamped
    }

    /// This connection, its reads also offering their arrival to the [`FirstArrival`] returned.
    pub fn sharing_first_arrival(mut self) -> (StampedTcp, Arc<FirstArrival>) {
        let first = Arc::new(FirstArrival::default());
        self.first = Some(Arc::clone(&first));
        (self, first)
    }

    fn note(&mut self, at: Instant) {
        let at = self.arrived.map_or(at, |before| before.max(at));
        self.arrived = Some(at);
        if let Some(first) = &self.first {
            first.offer(at);
        }
    }

    /// One `recvmsg` into `buf`: the number of bytes and the kernel's stamp of them, if any.
    fn recv_stamped(&self, buf: &mut ReadBuf<'_>) -> std::io::Result<(usize, Option<SystemTime>)> {
        #[cfg(test)]
        self.recvs.set(self.recvs.get() + 1);
        SCRATCH.with_borrow_mut(|scratch| {
            let room = buf.remaining().min(scratch.len());
            let mut control = ControlBuf([0; 64]);
            let mut iov = [std::io::IoSliceMut::new(&mut scratch[..room])];
            let msg = recvmsg::<()>(
                self.tcp.as_raw_fd(),
                &mut iov,
                Some(&mut control.0[..]),
                MsgFlags::empty(),
            )
            .map_err(std::io::Error::from)?;
            let n = msg.bytes;
            let stamp = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::ScmTimestampns(ts) => {
                        let secs = u64::try_from(ts.tv_sec()).ok()?;
                        let nanos = u32::try_from(ts.tv_nsec()).ok()?;
                        UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
                    }
                    _ => None,
                })
            });
            buf.put_slice(&scratch[..n]);
            Ok((n, stamp))
        })
    }
}

/// The arrival of the oldest read of a connection not yet taken: a server takes it as a
/// request's head is handed over (its first read) and again once the body is read, so a request
/// never takes the arrival of the one before it. What counts from it counts from the request's
/// arrival at the host, not from the moment the server got round to reading it.
#[derive(Debug, Default)]
pub struct FirstArrival(Mutex<Option<Instant>>);

impl FirstArrival {
    /// The arrival of the oldest untaken read, forgetting it.
    pub fn take(&self) -> Option<Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn offer(&self, at: Instant) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(at);
    }
}

/// The monotonic instant of a kernel stamp `stamp`: `now` less the stamp's age on the wall clock
/// `wall`, read just before `now` (so the age is never more than the truth); `now` itself when
/// the age is negative or over [`MAX_AGE`] (a clock step).
pub fn instant_of(stamp: SystemTime, now: Instant, wall: SystemTime) -> Instant {
    match wall.duration_since(stamp) {
        Ok(age) if age <= MAX_AGE => now.checked_sub(age).unwrap_or(now),
        _ => now,
    }
}

impl AsyncRead for StampedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.kernel {
            ready!(Pin::new(&mut this.tcp).poll_read(cx, buf))?;
            this.note(Instant::now());
            return Poll::Ready(Ok(()));
        }
        loop {
            ready!(this.tcp.poll_read_ready(cx))?;
            // `try_io` clears the socket's readiness on `WouldBlock` (against the readiness it
            // saw before the read, so bytes that come after it still wake the reader), and the
            // next `poll_read_ready` waits for the kernel to say there is more. A read shorter
            // than it asked for emptied the socket: it clears the readiness too, as tokio's own
            // reads do, by handing its bytes over beside a `WouldBlock`; otherwise every read
            // (one per token against a server that writes each token on its own) would cost a
            // second `recvmsg` that finds nothing.
            let mut short = None;
            let read = this.tcp.try_io(Interest::READABLE, || {
                let room = buf.remaining().min(MAX_READ_BYTES);
                let (n, stamp) = this.recv_stamped(buf)?;
                if 0 < n && n < room {
                    short = Some((n, stamp));
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                Ok((n, stamp))
            });
            match short.map_or(read, Ok) {
                Ok((n, stamp)) => {
                    // The wall clock first: if the thread is preempted between the two reads,
                    // the stamp's age reads short and the stamp late, as a read's return time
                    // would be, never early (the other order would put it before its segment).
                    let wall = SystemTime::now();
                    let now = Instant::now();
                    let stamp = stamp.filter(|_| n > 0);
                    this.kernel_stamped = stamp.is_some();
                    let at = stamp.map_or(now, |s| instant_of(s, now, wall));
                    this.note(at);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for StampedTcp {
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Both ends of a loopback TCP connection: the client's and the server's.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), server.unwrap().0)
    }

    #[test]
    fn a_stamp_is_placed_by_its_age_and_a_clock_step_never_makes_it_earlier_than_now() {
        let now = Instant::now();
        let wall = SystemTime::now();
        let ms = Duration::from_millis;
        assert_eq!(instant_of(wall - ms(7), now, wall), now - ms(7));
        assert_eq!(instant_of(wall, now, wall), now);
        // The wall clock stepped back after the segment came: the stamp is "in the future".
        assert_eq!(instant_of(wall + ms(3), now, wall), now);
        // Stepped forward by more than any read waits: not believed.
        assert_eq!(instant_of(wall - MAX_AGE - ms(1), now, wall), now);
    }

    /// A read that empties the socket leaves the next one to wait for the kernel's word: one
    /// `recvmsg` per read, not a second that finds nothing; and bytes that come after it are
    /// still read.
    #[tokio::test]
    async fn a_short_read_costs_one_recvmsg_and_misses_nothing_after_it() {
        let (client, mut server) = connected().await;
        let mut client = StampedTcp::new(client);
        let mut buf = [0u8; 64];
        for (i, token) in [&b"one"[..], b"two", b"three"].into_iter().enumerate() {
            // The read starts on an empty socket (`join!` polls it first), as a stream's reader
            // waits for its next token; the token is written once it waits.
            let (read, ()) = tokio::join!(client.read(&mut buf), async {
                tokio::task::yield_now().await;
                server.write_all(token).await.unwrap();
            });
            assert_eq!(&buf[..read.unwrap()], token);
            assert_eq!(
                client.recvs.get(),
                i as u32 + 1,
                "a read after a short one tried the empty socket"
            );
        }
    }

    /// A server's connection hands each request the arrival of its first read, once, and the
    /// next request on the connection never takes the one before it.
    #[tokio::test]
    async fn a_request_takes_its_first_reads_arrival_once_never_the_previous_ones() {
        let (mut client, server) = connected().await;
        let (mut io, arrivals) = StampedTcp::new(server).sharing_first_arrival();
        let mut buf = [0u8; 64];

        let written = Instant::now();
        client.write_all(b"first").await.unwrap();
        // Whether the stamp is the kernel's (that it keeps a late read's arrival is
        // `a_late_read_keeps_the_arrival_of_its_bytes`'s to hold) or, before the kernel turns
        // stamping on, the read's own time, it lies between the write and the read.
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

    /// Bytes that wait in the socket while the reader is busy keep the time they arrived.
    #[tokio::test]
    async fn a_late_read_keeps_the_arrival_of_its_bytes() {
        let (client, mut server) = connected().await;
        let mut client = StampedTcp::new(client);
        assert!(
            client.kernel_stamps(),
            "the kernel refused SO_TIMESTAMPNS on a TCP socket"
        );
        // The kernel turns stamping on a moment after the option is first set (deferred work,
        // with nothing to wait on): until a read carries a stamp, a byte at a time, for at most
        // 5 s.
        let mut byte = [0u8; 1];
        for _ in 0..500 {
            server.write_all(b".").await.unwrap();
            client.read_exact(&mut byte).await.unwrap();
            if client.last_read_kernel_stamped() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            client.last_read_kernel_stamped(),
            "no read was stamped by the kernel in 5 s"
        );
        let written = Instant::now();
        server.write_all(b"first token").await.unwrap();
        // The reader is late on purpose: what is measured is that its lateness does not count.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut buf = Vec::new();
        let n = client.read_buf(&mut buf).await.unwrap();
        let read = Instant::now();
        assert_eq!(&buf[..n], b"first token");
        let arrived = client.arrived().unwrap();
        // (The two clocks are read a few nanoseconds apart: a millisecond covers it.)
        assert!(
            arrived + Duration::from_millis(1) >= written,
            "stamped before it was written"
        );
        assert!(
            arrived < written + Duration::from_millis(200),
            "stamped {:?} after the write: the read's own time, not the arrival",
            arrived - written
        );
        assert!(read - arrived >= Duration::from_millis(300));
        // A second read without new bytes never moves the stamp back.
        server.write_all(b"second").await.unwrap();
        let mut more = Vec::new();
        client.read_buf(&mut more).await.unwrap();
        assert!(client.arrived().unwrap() >= arrived);
    }
}
