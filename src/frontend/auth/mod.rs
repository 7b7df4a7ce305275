//! Client authentication against the configured users (`[[users]]`) or logins from
//! the database (`database`): SCRAM-SHA-256, md5, cleartext or trust. An unknown user
//! goes through the same exchange and fails at the same point, so the answer does not
//! reveal which users exist; repeated failures of a name are answered more slowly.

pub mod database;
pub mod scram;

use std::time::Duration;

use base64::Engine;
use bytes::Buf;

use super::error::FrontendError;
use crate::config::{AuthMethod, UserConfig};
use crate::net::Duplex;
use crate::protocol;
use crate::protocol::scram::ScramKeys;
use scram::{Binding, ScramExchange, ScramVerifier};

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

/// Runs the exchange; on success AuthenticationOk has been queued, and a SCRAM login
/// returns the keys its proof gives (for SCRAM passthrough). `binding`: the channel
/// binding data of the client's TLS connection, which SCRAM-SHA-256-PLUS is offered with.
pub async fn authenticate(
    io: &mut Duplex,
    user: &str,
    auth: Option<&UserAuth>,
    binding: Option<&[u8]>,
    max_len: usize,
) -> Result<Option<ScramKeys>, FrontendError> {
    let mut keys = None;
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
            let (server_final, proved) = exchange.finish(&last).map_err(|_| failed())?;
            if auth.is_none() {
                return Err(failed());
            }
            protocol::authentication(&mut io.wbuf, 12, server_final.as_bytes());
            keys = Some(proved);
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
    Ok(keys)
}

/// Names whose recent failed logins are counted, at most.
const MAX_FAILING_NAMES: u64 = 10_000;

/// Failed logins per name over the last minute: each after the first is answered a
/// little later (200 ms more each, at most 2 s), which slows guessing a password
/// without holding anything but the failing client's own connection.
pub struct FailedLogins(moka::sync::Cache<String, u32>);

impl Default for FailedLogins {
    fn default() -> Self {
        Self(
            moka::sync::Cache::builder()
                .max_capacity(MAX_FAILING_NAMES)
                .time_to_live(Duration::from_secs(60))
                .build(),
        )
    }
}

impl FailedLogins {
    /// Counts a failed login of `name`; how long to wait before answering it.
    pub fn delay(&self, name: &str) -> Duration {
        let before = self.0.get(name).unwrap_or(0);
        self.0.insert(name.to_string(), before.saturating_add(1));
        Duration::from_millis(200 * u64::from(before.min(10)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_of_a_name_are_answered_later_and_capped() {
        let failed = FailedLogins::default();
        let delays: Vec<u64> = (0..13).map(|_| failed.delay("mallory").as_millis() as u64).collect();
        assert_eq!(&delays[..4], &[0, 200, 400, 600]);
        assert_eq!(delays[12], 2000, "at most 2 s");
        assert_eq!(failed.delay("alice"), Duration::ZERO, "another name is not slowed");
    }
}
