//! The startup phase before authentication: SSLRequest (answered strictly: no byte
//! may follow it before the TLS handshake), GSSENCRequest (refused), CancelRequest,
//! and the StartupMessage. Packets are read with exact reads, so nothing sent
//! before the handshake can be buffered and later mistaken for TLS-protected data.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use super::error::FrontendError;
use crate::net::Stream;
use crate::protocol::{StartupPacket, read_startup_frame};

/// The longest startup packet PostgreSQL accepts.
const MAX_STARTUP_PACKET: u32 = 10_000;

pub enum Negotiated {
    Login {
        stream: Stream,
        minor: u16,
        params: Vec<(String, String)>,
    },
    /// The stream is kept to be closed once the cancel has gone on: over TLS, with a
    /// close_notify, or libpq 17+ (which encrypts cancels) reports the cancel as failed.
    Cancel {
        stream: Stream,
        pid: u32,
        key: u32,
    },
}

pub async fn negotiate(stream: Stream, tls: Option<&TlsAcceptor>) -> Result<Negotiated, FrontendError> {
    let mut stream = stream;
    let mut encrypted = false;
    loop {
        let len = stream.read_u32().await?;
        if !(8..=MAX_STARTUP_PACKET).contains(&len) {
            return Err(FrontendError::Protocol(format!("invalid startup packet length {len}")));
        }
        let mut body = vec![0u8; len as usize - 4];
        stream.read_exact(&mut body).await?;
        match read_startup_frame(&body)? {
            StartupPacket::SslRequest if encrypted => {
                return Err(FrontendError::Protocol("SSLRequest on an encrypted connection".into()));
            }
            StartupPacket::SslRequest => {
                let tcp = match stream {
                    Stream::Plain(tcp) => tcp,
                    // As PostgreSQL: no TLS over a Unix socket (libpq's sslmode=prefer
                    // then goes on in the clear).
                    Stream::Unix(mut unix) => {
                        unix.write_all(b"N").await?;
                        stream = Stream::Unix(unix);
                        continue;
                    }
                    _ => return Err(FrontendError::Protocol("SSLRequest on an encrypted connection".into())),
                };
                let Some(acceptor) = tls else {
                    let mut tcp = tcp;
                    tcp.write_all(b"N").await?;
                    stream = Stream::Plain(tcp);
                    continue;
                };
                if tcp.has_unread_bytes() {
                    return Err(FrontendError::Protocol("received unencrypted data after SSLRequest".into()));
                }
                let mut tcp = tcp;
                tcp.write_all(b"S").await?;
                let tls = acceptor
                    .accept(tcp)
                    .await
                    .map_err(|e| FrontendError::Protocol(format!("TLS handshake: {e}")))?;
                stream = Stream::TlsServer(Box::new(tls));
                encrypted = true;
            }
            StartupPacket::GssEncRequest => {
                stream.write_all(b"N").await?;
            }
            StartupPacket::CancelRequest { pid, key } => {
                return Ok(Negotiated::Cancel { stream, pid, key });
            }
            StartupPacket::Startup { minor, params } => {
                return Ok(Negotiated::Login { stream, minor, params });
            }
            StartupPacket::Unsupported { version } => {
                return Err(FrontendError::Unsupported(format!(
                    "unsupported frontend protocol {}.{}: pgtenant speaks 3.0",
                    version >> 16,
                    version & 0xffff
                )));
            }
        }
    }
}
