//! Client authentication against the configured users: SCRAM-SHA-256, md5,
//! cleartext or trust. An unknown user goes through the same exchange and fails at
//! the same point, so the answer does not reveal which users exist.

use base64::Engine;
use bytes::Buf;

use super::error::FrontendError;
use super::scram::{Binding, ScramExchange, ScramVerifier};
use crate::config::{AuthMethod, UserConfig};
use crate::net::Duplex;
use crate::protocol;

/// How one user is checked; derived once at start.
#[derive(Clone)]
pub struct UserAuth {
    pub method: AuthMethod,
    pub password: Option<String>,
    pub verifier: Option<ScramVerifier>,
}

impl UserAuth {
    pub fn from_config(user: &UserConfig) -> Self {
        let verifier = user.scram_secret.as_deref().and_then(ScramVerifier::parse).or_else(|| {
            user.password
                .as_deref()
                .map(|p| ScramVerifier::from_password(p, rand::random::<[u8; 16]>().to_vec(), 4096))
        });
        Self { method: user.auth, password: user.password.clone(), verifier }
    }
}

/// Runs the exchange; on success AuthenticationOk has been queued. `binding`: the
/// channel binding data of the client's TLS connection, which SCRAM-SHA-256-PLUS is
/// offered with.
pub async fn authenticate(
    io: &mut Duplex,
    user: &str,
    auth: Option<&UserAuth>,
    binding: Option<&[u8]>,
    max_len: usize,
) -> Result<(), FrontendError> {
    let failed = || FrontendError::AuthFailed { user: user.to_string() };
    let method = auth.map(|a| a.method).unwrap_or(AuthMethod::ScramSha256);
    match method {
        AuthMethod::Trust if auth.is_some() => {}
        AuthMethod::Trust => return Err(failed()),
        AuthMethod::ScramSha256 => {
            let verifier = auth.and_then(|a| a.verifier.clone()).unwrap_or_else(|| ScramVerifier::mock(user));
            let mechanisms: &[u8] = match binding {
                Some(_) => b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0",
                None => b"SCRAM-SHA-256\0\0",
            };
            protocol::authentication(&mut io.wbuf, 10, mechanisms);
            io.flush().await?;
            let first = read_password_message(io, max_len).await?;
            let (mechanism, data) = sasl_initial(&first)
                .ok_or_else(|| FrontendError::Protocol("malformed SASLInitialResponse".into()))?;
            let binding = match (mechanism, binding) {
                (b"SCRAM-SHA-256-PLUS", Some(data)) => Binding::Required(data),
                (b"SCRAM-SHA-256", Some(_)) => Binding::Declined,
                (b"SCRAM-SHA-256", None) => Binding::NotOffered,
                _ => return Err(FrontendError::Protocol("unsupported SASL mechanism".into())),
            };
            let nonce = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 18]>());
            let (exchange, server_first) = ScramExchange::start(verifier, binding, data, &nonce)
                .map_err(|e| FrontendError::Protocol(e.to_string()))?;
            protocol::authentication(&mut io.wbuf, 11, server_first.as_bytes());
            io.flush().await?;
            let last = read_password_message(io, max_len).await?;
            let server_final = exchange.finish(&last).map_err(|_| failed())?;
            if auth.is_none() {
                return Err(failed());
            }
            protocol::authentication(&mut io.wbuf, 12, server_final.as_bytes());
        }
        AuthMethod::Md5 => {
            let salt = rand::random::<[u8; 4]>();
            protocol::authentication(&mut io.wbuf, 5, &salt);
            io.flush().await?;
            let answer = read_password_message(io, max_len).await?;
            let expected = auth
                .and_then(|a| a.password.as_deref())
                .map(|p| postgres_protocol::authentication::md5_hash(user.as_bytes(), p.as_bytes(), salt));
            if expected.is_none_or(|e| answer.strip_suffix(b"\0") != Some(e.as_bytes())) {
                return Err(failed());
            }
        }
        AuthMethod::Cleartext => {
            protocol::authentication(&mut io.wbuf, 3, b"");
            io.flush().await?;
            let answer = read_password_message(io, max_len).await?;
            let expected = auth.and_then(|a| a.password.as_deref());
            if expected.is_none_or(|e| answer.strip_suffix(b"\0") != Some(e.as_bytes())) {
                return Err(failed());
            }
        }
    }
    protocol::authentication(&mut io.wbuf, 0, b"");
    Ok(())
}

async fn read_password_message(io: &mut Duplex, max_len: usize) -> Result<Vec<u8>, FrontendError> {
    let frame = io
        .read_frame(max_len.min(64 * 1024))
        .await?
        .ok_or_else(|| FrontendError::Protocol("client closed during authentication".into()))?;
    if frame.tag != b'p' {
        return Err(FrontendError::Protocol(format!(
            "expected a password message, got '{}'",
            frame.tag as char
        )));
    }
    Ok(frame.body().to_vec())
}

/// SASLInitialResponse: mechanism name, then a length-prefixed initial response.
fn sasl_initial(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mechanism, mut rest) = protocol::split_cstr(body)?;
    if rest.len() < 4 {
        return None;
    }
    let len = rest.get_i32();
    let data = if len < 0 { &[][..] } else { rest.get(..len as usize)? };
    Some((mechanism, data))
}
