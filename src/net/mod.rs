//! Socket I/O shared by both sides: a stream that is plain TCP, TLS or a Unix socket
//! (`socket`: registered for reading only, direct system calls), and `Duplex`,
//! which owns a stream with its read and write buffers and makes progress on both
//! directions in one poll, so a session never blocks a write while the peer waits
//! for its own output to be read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::protocol::{Frame, FrameError, try_parse_frame};

pub mod client_threads;
mod socket;

pub use socket::{LocalSocket, TcpSocket};

/// A connection that may have been upgraded to TLS, or a Unix socket to a local server.
pub enum Stream {
    /// Registered for reading only, as all of these (see `socket`).
    Plain(TcpSocket),
    Unix(LocalSocket),
    TlsServer(Box<tokio_rustls::server::TlsStream<TcpSocket>>),
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpSocket>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::TlsServer(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::TlsServer(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::TlsServer(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::TlsServer(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsServer(_) | Stream::TlsClient(_))
    }

    /// An accepted (not yet upgraded) socket taken out of the runtime it was accepted
    /// on, to be served on another thread (`Unregistered::register`).
    pub fn unregister(self) -> io::Result<Unregistered> {
        match self {
            Stream::Plain(s) => Ok(Unregistered::Tcp(s.into_std())),
            Stream::Unix(s) => Ok(Unregistered::Unix(s.into_std())),
            Stream::TlsServer(_) | Stream::TlsClient(_) => {
                Err(io::Error::other("a TLS stream cannot move to another runtime"))
            }
        }
    }
}

impl Stream {
    /// Registers the socket again, with the runtime of the caller: its readiness then
    /// wakes the caller's thread instead of the one it was registered on. A duplicate
    /// of the descriptor takes the old one's place (five system calls: dup,
    /// non-blocking, two epoll_ctl, close); TLS state stays as it is. On an error (no
    /// descriptor left) the stream is as before, and still works from any thread.
    pub fn rehome(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.rehome(),
            Stream::TlsServer(s) => s.get_mut().0.rehome(),
            Stream::TlsClient(s) => s.get_mut().0.rehome(),
            Stream::Unix(s) => s.rehome(),
        }
    }
}

/// A socket registered with no runtime (non-blocking, as tokio left it).
pub enum Unregistered {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Unregistered {
    /// Registers the socket with the runtime of the caller.
    pub fn register(self) -> io::Result<Stream> {
        match self {
            Unregistered::Tcp(s) => TcpSocket::new(s).map(Stream::Plain),
            Unregistered::Unix(s) => LocalSocket::new(s).map(Stream::Unix),
        }
    }
}

/// What a poll of a `Duplex` produced.
#[derive(Debug)]
pub enum IoEvent {
    /// New bytes are in the read buffer.
    Read,
    /// The peer closed its side.
    Closed,
    /// The write buffer fell below a mark the caller watches (reported by the caller's
    /// poll wrapper, never by `poll_io`), so it may read from the other side again.
    Drained,
}

/// A stream with its buffers.
pub struct Duplex {
    pub stream: Stream,
    pub rbuf: BytesMut,
    pub wbuf: BytesMut,
    needs_flush: bool,
    /// Bytes read and written so far.
    pub bytes_read: u64,
    pub bytes_written: u64,
}

const READ_CHUNK: usize = 16 * 1024;
/// A client's first read buffer; reads reserve `READ_CHUNK` once less than
/// `READ_ROOM` is free.
const CLIENT_READ_START: usize = 1024;
const READ_ROOM: usize = 512;
/// Below this much room a read first tries to rewind the buffer (`rewind_if_empty`).
const REWIND_ROOM: usize = READ_ROOM + READ_ROOM / 2;

/// Moves an emptied read buffer back to its start, unless a frame split off it is
/// still held (a session may read while it handles a request). Each request is read a
/// little further into the buffer, and once less than `READ_ROOM` was left the next
/// read reserved `READ_CHUNK` more: a client's 1 KiB read buffer became 16 KiB after a
/// few dozen small requests, for as long as it stayed connected (docs/benchmarks.md
/// "Memory"). Tried by the reads that find less than `REWIND_ROOM` left (the last few
/// before the buffer would grow, each a chance to find it empty), not by every read:
/// on every read the check cost about 190 instructions per INSERT. No allocation. (A
/// write buffer needs none: its reserve reclaims the room before its start when it is
/// empty.)
fn rewind_if_empty(buf: &mut BytesMut) {
    if buf.is_empty() {
        // Asking for one byte more than is free from here reclaims the bytes before
        // the start (there are some unless the buffer already starts at its beginning).
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
}

impl Duplex {
    pub fn new(stream: Stream) -> Self {
        Self::with_buffers(stream, READ_CHUNK, READ_CHUNK)
    }

    /// A client's: small buffers that grow with the first large message or answer and
    /// keep that size. Most clients send small requests, and many sit idle: a page
    /// each of two 16 KiB buffers was most of an idle client's memory.
    pub fn for_client(stream: Stream) -> Self {
        Self::with_buffers(stream, CLIENT_READ_START, 0)
    }

    fn with_buffers(stream: Stream, read: usize, write: usize) -> Self {
        Self {
            stream,
            rbuf: BytesMut::with_capacity(read),
            wbuf: BytesMut::with_capacity(write),
            needs_flush: false,
            bytes_read: 0,
            bytes_written: 0,
        }
    }

    /// Writes what is buffered and, when `read` is set, reads more.
    /// Ready only when bytes were read, the peer closed, or an error happened.
    pub fn poll_io(&mut self, cx: &mut Context<'_>, read: bool) -> Poll<io::Result<IoEvent>> {
        while !self.wbuf.is_empty() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.wbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.wbuf.advance(n);
                    self.bytes_written += n as u64;
                    self.needs_flush = self.stream.is_tls();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        if self.wbuf.is_empty() && self.needs_flush {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.needs_flush = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        if read {
            if self.rbuf.capacity() - self.rbuf.len() < REWIND_ROOM {
                rewind_if_empty(&mut self.rbuf);
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_ROOM {
                self.rbuf.reserve(READ_CHUNK);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.rbuf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(IoEvent::Closed)),
                Poll::Ready(Ok(n)) => {
                    self.bytes_read += n as u64;
                    return Poll::Ready(Ok(IoEvent::Read));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }

    /// Reads until at least one more byte arrives (or the peer closes).
    pub async fn read_more(&mut self) -> io::Result<IoEvent> {
        std::future::poll_fn(|cx| self.poll_io(cx, true)).await
    }

    /// Writes everything buffered.
    pub async fn flush(&mut self) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        while !self.wbuf.is_empty() {
            let n = self.stream.write(&self.wbuf).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.wbuf.advance(n);
            self.bytes_written += n as u64;
        }
        self.stream.flush().await?;
        self.needs_flush = false;
        Ok(())
    }

    /// Splits the next complete message off the read buffer.
    pub fn next_frame(&mut self, max_len: usize) -> Result<Option<Frame>, FrameError> {
        try_parse_frame(&mut self.rbuf, max_len)
    }

    /// Reads until a complete message is buffered; `None` when the peer closed first.
    pub async fn read_frame(&mut self, max_len: usize) -> io::Result<Option<Frame>> {
        loop {
            match self.next_frame(max_len) {
                Ok(Some(f)) => return Ok(Some(f)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            if let IoEvent::Closed = self.read_more().await? {
                return Ok(None);
            }
        }
    }

    /// Whether the peer closed or sent something while the connection sat idle.
    /// Used on pooled connections that should be silent.
    pub fn is_disturbed(&mut self) -> bool {
        let mut probe = [0u8; 1];
        // A plain socket's readiness is checked without registering a waker (this runs
        // at every checkout); a TLS stream may hold decrypted bytes, so it is polled.
        let quiet = match &self.stream {
            Stream::Plain(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
            Stream::TlsServer(_) | Stream::TlsClient(_) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                return Pin::new(&mut self.stream).poll_read(&mut cx, &mut buf).is_ready();
            }
        };
        !matches!(quiet, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A TCP and a Unix socket registered on a runtime that has ended, and their peers.
    fn orphaned() -> (Stream, std::net::TcpStream, Stream, std::os::unix::net::UnixStream) {
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let tcp = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let tcp = TcpSocket::from_tokio(tcp).unwrap();
            let (tcp_peer, _) = listener.accept().await.unwrap();
            let (unix, unix_peer) = tokio::net::UnixStream::pair().unwrap();
            let unix = LocalSocket::from_tokio(unix).unwrap();
            let peers = (tcp_peer.into_std().unwrap(), unix_peer.into_std().unwrap());
            peers.0.set_nonblocking(false).unwrap();
            peers.1.set_nonblocking(false).unwrap();
            (Stream::Plain(tcp), peers.0, Stream::Unix(unix), peers.1)
        })
    }

    /// A socket rehomed on another runtime works there after the first is gone; without
    /// the rehome its reads fail with the first runtime's driver (a write goes to the
    /// socket directly and needs no driver until the socket is full).
    #[test]
    fn a_rehomed_stream_works_on_its_new_runtime_alone() {
        use std::io::{Read, Write};
        let (mut tcp, mut tcp_peer, mut unix, mut unix_peer) = orphaned();
        let (mut unmoved, mut unmoved_peer, _, _) = orphaned();
        unmoved_peer.write_all(b"x").unwrap();
        let second = runtime();
        second.block_on(async {
            let mut byte = [0u8; 1];
            assert!(unmoved.read(&mut byte).await.is_err(), "the ended runtime's driver still serves it");
            tcp.rehome().unwrap();
            unix.rehome().unwrap();
            tcp.write_all(b"ping").await.unwrap();
            unix.write_all(b"unix").await.unwrap();
        });
        let mut got = [0u8; 4];
        tcp_peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        unix_peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"unix");
        tcp_peer.write_all(b"pong").unwrap();
        unix_peer.write_all(b"back").unwrap();
        second.block_on(async {
            tcp.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"pong");
            unix.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"back");
        });
    }

    /// A client's read buffer keeps its first size through many small requests, each
    /// dropped before the next arrives; frames still held make the reads go on past
    /// them, into a buffer grown for the purpose, and lose nothing.
    #[test]
    fn a_client_read_buffer_keeps_its_size_through_small_requests() {
        use std::io::Write;
        runtime().block_on(async {
            let (ours, peer) = tokio::net::UnixStream::pair().unwrap();
            let mut duplex = Duplex::for_client(Stream::Unix(LocalSocket::from_tokio(ours).unwrap()));
            let mut peer = peer.into_std().unwrap();
            peer.set_nonblocking(false).unwrap();
            let message = |body: &[u8]| {
                let mut raw = vec![b'Q'];
                raw.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
                raw.extend_from_slice(body);
                raw
            };
            let body = [b'x'; 95];
            for _ in 0..200 {
                peer.write_all(&message(&body)).unwrap();
                let frame = duplex.read_frame(1 << 20).await.unwrap().unwrap();
                assert_eq!(frame.body(), body);
                assert!(duplex.rbuf.capacity() <= CLIENT_READ_START, "grew to {}", duplex.rbuf.capacity());
            }
            let mut held = Vec::new();
            for i in 0..20u8 {
                peer.write_all(&message(&[i; 95])).unwrap();
                held.push(duplex.read_frame(1 << 20).await.unwrap().unwrap());
            }
            for (i, frame) in held.iter().enumerate() {
                assert_eq!(frame.body(), [i as u8; 95]);
            }
        });
    }
}
