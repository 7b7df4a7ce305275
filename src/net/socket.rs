//! A socket of ours (TCP or Unix) registered with the runtime for reading only, read
//! and written with direct system calls.
//!
//! tokio registers a socket for both directions. A Unix socket reports room to write
//! each time its peer reads (the kernel's `unix_write_space`; TCP does so only after a
//! send found its buffer full), so a socket registered for writing gets an event for
//! every message the peer reads: one more entry in the runtime's event list per
//! request, and a wake-up of a sleeping worker when nothing else is ready, the cost
//! paid by the peer (PostgreSQL's backend, on whose read the wake-up runs). PgBouncer
//! asks for write readiness only while a write waits; so does this: writes go to the
//! socket directly, and only one that finds the buffer full registers a duplicate of
//! the descriptor for write readiness, dropped again once a write goes through.
//!
//! The reads and writes are `recv` and `send` made by `rustix` itself, not through the
//! C library: once a process has a second thread (the runtime's blocking pool, the
//! long-statement parser), glibc brackets each of these calls with two locked
//! compare-and-swaps on the thread's cancellation state (3 % of the proxy's user-time
//! samples under TPC-B; docs/benchmarks.md, "Socket calls without the C library").
//! PgBouncer, single-threaded, never pays them.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rustix::net::{RecvFlags, SendFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// What a read offers the kernel, at least and at most. The offered bytes are zeroed
/// first (a read into memory never written is `unsafe`, which this crate forbids), so
/// the offer follows what reads find: it doubles while reads fill it (a large answer
/// streaming in, fewer system calls) and halves while they use less than a quarter
/// (small answers, less to zero). At the least offer a read goes to a buffer of the
/// thread's (`SMALL_READS`), zeroed once, and what it got is copied on: a short
/// answer costs the copy of its bytes, not the zeroing (and the cache lines) of the
/// whole offer.
const MIN_OFFER: usize = 2 * 1024;
const MAX_OFFER: usize = 64 * 1024;

/// A non-blocking socket: `std`'s TCP or Unix stream.
pub struct Socket<S: AsRawFd> {
    /// Registered for readable (and hang-up) events only.
    socket: AsyncFd<S>,
    /// A duplicate of the descriptor, registered for write readiness while a write
    /// waits for room.
    write_wait: Option<AsyncFd<OwnedFd>>,
    /// How many bytes the next read offers (see `MIN_OFFER`).
    offer: usize,
}

/// A Unix socket (to a local server, or a client on `unix_socket_dir`).
pub type LocalSocket = Socket<StdUnixStream>;
/// A TCP socket (a client's, or a server's over the network).
pub type TcpSocket = Socket<std::net::TcpStream>;

thread_local! {
    /// Where a read of `MIN_OFFER` bytes goes (zeroed once), one per thread: what a
    /// read got is copied on at once, so all the sockets a thread serves share it (one
    /// per socket was 2 KiB more memory for each server connection).
    static SMALL_READS: RefCell<[u8; MIN_OFFER]> = const { RefCell::new([0; MIN_OFFER]) };
}

fn recv(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::net::recv(fd, buf, RecvFlags::empty())?.0)
}

/// No SIGPIPE for a peer gone: the write fails with `EPIPE` instead, as `std`'s do.
fn send(fd: impl AsFd, data: &[u8]) -> io::Result<usize> {
    Ok(rustix::net::send(fd, data, SendFlags::NOSIGNAL)?)
}

impl<S: AsFd + AsRawFd + From<OwnedFd>> Socket<S> {
    /// Registers a socket with the caller's runtime (made non-blocking here).
    fn register_new(socket: S) -> io::Result<Self> {
        rustix::io::ioctl_fionbio(&socket, true)?;
        Ok(Self { socket: register(socket, Interest::READABLE)?, write_wait: None, offer: MIN_OFFER })
    }

    /// Registers the socket again with the caller's runtime (see `Stream::rehome`).
    pub fn rehome(&mut self) -> io::Result<()> {
        let fd = self.socket.get_ref().as_fd().try_clone_to_owned()?;
        *self = Self::register_new(S::from(fd))?;
        Ok(())
    }

    /// Takes the socket off the runtime.
    pub fn into_std(self) -> S {
        self.socket.into_inner()
    }

    /// The socket itself (its addresses and options).
    pub fn get_ref(&self) -> &S {
        self.socket.get_ref()
    }

    /// Reads what is there without waiting (`WouldBlock` when nothing is; without a
    /// system call when no event said something came since the last read found none).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.try_io(Interest::READABLE, |socket| recv(socket, buf))
    }

    /// Whether bytes are waiting to be read (left where they are).
    pub fn has_unread_bytes(&self) -> bool {
        let mut probe = [0u8; 1];
        let peeked =
            rustix::net::recv(self.socket.get_ref(), &mut probe[..], RecvFlags::PEEK | RecvFlags::DONTWAIT);
        matches!(peeked, Ok((n, _)) if n > 0)
    }
}

impl LocalSocket {
    /// Registers a Unix socket with the caller's runtime.
    pub fn new(socket: StdUnixStream) -> io::Result<Self> {
        Self::register_new(socket)
    }

    /// A socket of tokio's, registered again for reading only (three system calls: off
    /// the runtime, non-blocking, on again).
    pub fn from_tokio(socket: tokio::net::UnixStream) -> io::Result<Self> {
        Self::new(socket.into_std()?)
    }
}

impl TcpSocket {
    /// Registers a TCP socket with the caller's runtime.
    pub fn new(socket: std::net::TcpStream) -> io::Result<Self> {
        Self::register_new(socket)
    }

    /// A socket of tokio's (just accepted or connected), registered again for reading
    /// only.
    pub fn from_tokio(socket: tokio::net::TcpStream) -> io::Result<Self> {
        Self::new(socket.into_std()?)
    }
}

/// Registers `fd` with the caller's runtime for `interest`. tokio deprecated its safe
/// registration for a type that may not own its descriptor; the replacement is
/// `unsafe`, which this crate forbids. All types registered here (`UnixStream`,
/// `TcpStream`, `OwnedFd`) own theirs and keep it open while registered: the
/// replacement's contract.
#[allow(deprecated)]
fn register<T: AsRawFd>(fd: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    AsyncFd::with_interest(fd, interest)
}

impl<S: AsFd + AsRawFd + Unpin> AsyncRead for Socket<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let Socket { socket, offer, .. } = self.get_mut();
        loop {
            let mut guard = ready!(socket.poll_read_ready(cx))?;
            let room = buf.remaining().min(*offer);
            let outcome = if *offer == MIN_OFFER {
                SMALL_READS.with_borrow_mut(|scratch| {
                    let outcome = guard.try_io(|socket| recv(socket, &mut scratch[..room]));
                    if let Ok(Ok(n)) = outcome {
                        buf.put_slice(&scratch[..n]);
                    }
                    outcome
                })
            } else {
                let outcome = guard.try_io(|socket| recv(socket, buf.initialize_unfilled_to(room)));
                if let Ok(Ok(n)) = outcome {
                    buf.advance(n);
                }
                outcome
            };
            match outcome {
                Ok(Ok(n)) => {
                    if n == *offer {
                        *offer = (*offer * 2).min(MAX_OFFER);
                    } else if n < *offer / 4 {
                        *offer = (*offer / 2).max(MIN_OFFER);
                    }
                    if n < room {
                        // Less than offered: nothing more is there (as tokio's own
                        // sockets judge), so the next read waits for an event instead
                        // of a system call that finds nothing.
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl<S: AsFd + AsRawFd + Unpin> AsyncWrite for Socket<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write_wait.is_none() {
            match send(this.socket.get_ref(), data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
            // The buffer is full: watch for room. A fresh registration reports the
            // state at once, so room made since the failed write is not missed.
            let dup = this.socket.get_ref().as_fd().try_clone_to_owned()?;
            this.write_wait = Some(register(dup, Interest::WRITABLE)?);
        }
        let done = match &this.write_wait {
            Some(waiter) => loop {
                let mut guard = ready!(waiter.poll_write_ready(cx))?;
                if let Ok(done) = guard.try_io(|_| send(this.socket.get_ref(), data)) {
                    break done;
                }
            },
            None => send(this.socket.get_ref(), data),
        };
        // Written (or failed): stop watching for room until a write finds none again.
        this.write_wait = None;
        Poll::Ready(done)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(
            rustix::net::shutdown(self.socket.get_ref(), rustix::net::Shutdown::Write).map_err(Into::into),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn pair() -> (LocalSocket, StdUnixStream) {
        let (ours, peer) = StdUnixStream::pair().unwrap();
        (LocalSocket::new(ours).unwrap(), peer)
    }

    /// More than the socket's buffer holds: the writer waits for room (the duplicate
    /// registered for it) and goes on as the peer reads, losing and repeating nothing.
    #[tokio::test]
    async fn a_write_larger_than_the_buffer_waits_for_the_peer_to_read() {
        let (mut ours, peer) = pair();
        let sent: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let mut peer = peer;
            let mut got = Vec::new();
            let mut chunk = [0u8; 1000];
            while got.len() < 4_000_000 {
                let n = peer.read(&mut chunk).unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        ours.write_all(&sent).await.unwrap();
        assert!(ours.write_wait.is_none(), "the room watch ends with the write that found room");
        assert_eq!(reader.join().unwrap(), sent);
    }

    /// Reads wake on data and see the peer's close; a probe finds nothing waiting; the
    /// offer grows while reads fill it and shrinks back for small answers.
    #[tokio::test]
    async fn reads_see_data_then_the_close() {
        let (mut ours, mut peer) = pair();
        let mut probe = [0u8; 1];
        assert_eq!(ours.try_read(&mut probe).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        // Within the socket's buffer: all of it is there before the first read.
        peer.write_all(&[7u8; 20_000]).unwrap();
        let mut got = bytes::BytesMut::with_capacity(1 << 20);
        while got.len() < 20_000 {
            assert!(ours.read_buf(&mut got).await.unwrap() > 0);
        }
        assert!(got.iter().all(|b| *b == 7));
        assert!(ours.offer > MIN_OFFER, "reads that filled the offer made it grow");
        let grown = ours.offer;
        peer.write_all(b"hello").unwrap();
        assert_eq!(ours.read_buf(&mut got).await.unwrap(), 5);
        assert!(ours.offer < grown, "a small answer shrinks it");
        drop(peer);
        assert_eq!(ours.read_buf(&mut got).await.unwrap(), 0, "the peer's close");
    }
}
