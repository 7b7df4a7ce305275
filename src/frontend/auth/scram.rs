//! SCRAM-SHA-256 (RFC 5802 / 7677) as a server: the verifier a user is checked
//! against, and the two-step exchange as a sans-IO state machine with the server
//! nonce passed in, with `tls-server-end-point` channel binding (SCRAM-SHA-256-PLUS).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use sha2::{Digest, Sha256};

use crate::protocol::scram::{ScramKeys, hmac, same_bytes};

/// What the server stores for a user: salt, iterations and the two derived keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl ScramVerifier {
    /// Derives a verifier from a cleartext password, SASLprep-normalised (RFC 4013) as
    /// PostgreSQL and libpq do, or as it is when it has characters SASLprep prohibits.
    pub fn from_password(password: &str, salt: Vec<u8>, iterations: u32) -> Self {
        let keys = ScramKeys::from_password(password, salt, iterations);
        Self {
            iterations,
            salt: keys.salt,
            stored_key: Sha256::digest(keys.client_key).into(),
            server_key: keys.server_key,
        }
    }

    /// A verifier no password matches, for a user that does not exist (or has no
    /// password): the exchange runs as for a real user and fails at the proof. Its salt
    /// is derived from the name and a per-process secret, so repeated attempts see the
    /// same salt (as PostgreSQL's mock salt); and unlike a verifier derived from a
    /// random password, it costs no key stretching, so such attempts are as cheap as
    /// real ones: neither the timing tells which users exist, nor can a flood of them
    /// hold the proxy busy.
    pub fn mock(user: &str) -> Self {
        static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        let secret = SECRET.get_or_init(rand::random);
        let keyed = |label: &str| hmac(secret, format!("{label}\0{user}").as_bytes());
        Self {
            iterations: 4096,
            salt: keyed("salt")[..16].to_vec(),
            stored_key: keyed("stored key"),
            server_key: keyed("server key"),
        }
    }

    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (as in pg_authid).
    pub fn parse(secret: &str) -> Option<Self> {
        let rest = secret.strip_prefix("SCRAM-SHA-256$")?;
        let (iter_salt, keys) = rest.split_once('$')?;
        let (iterations, salt) = iter_salt.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        Some(Self {
            iterations: iterations.parse().ok()?,
            salt: B64.decode(salt).ok()?,
            stored_key: B64.decode(stored).ok()?.try_into().ok()?,
            server_key: B64.decode(server).ok()?.try_into().ok()?,
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message")]
    Malformed,
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("SCRAM nonce mismatch")]
    Nonce,
    #[error("wrong password")]
    WrongPassword,
}

/// Channel binding, as the mechanism the client chose settles it.
#[derive(Clone, Copy, Debug)]
pub enum Binding<'a> {
    /// SCRAM-SHA-256 where SCRAM-SHA-256-PLUS was not offered (no TLS).
    NotOffered,
    /// SCRAM-SHA-256 although SCRAM-SHA-256-PLUS was offered: fine for a client that
    /// cannot bind ("n"); one that can ("y") was made to believe it was not offered.
    Declined,
    /// SCRAM-SHA-256-PLUS, with this connection's `tls-server-end-point` data.
    Required(&'a [u8]),
}

/// The exchange after the client-first message.
pub struct ScramExchange {
    verifier: ScramVerifier,
    client_first_bare: String,
    server_first: String,
    /// The `c=` attribute the client-final message must carry: the GS2 header and the
    /// channel binding data, base64.
    channel: String,
    nonce: String,
}

impl ScramExchange {
    /// Reads the client-first message and returns the server-first message to send.
    pub fn start(
        verifier: ScramVerifier,
        binding: Binding,
        client_first: &[u8],
        server_nonce: &str,
    ) -> Result<(Self, String), ScramError> {
        let text = std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed)?;
        let (gs2_flag, rest) = text.split_once(',').ok_or(ScramError::Malformed)?;
        let binding_data = match (gs2_flag, binding) {
            ("n", Binding::NotOffered | Binding::Declined) | ("y", Binding::NotOffered) => &[][..],
            ("p=tls-server-end-point", Binding::Required(data)) => data,
            ("n" | "y", _) => return Err(ScramError::ChannelBinding),
            (f, _) if f.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed),
        };
        let (_authzid, bare) = rest.split_once(',').ok_or(ScramError::Malformed)?;
        let client_nonce = bare
            .split(',')
            .find_map(|attr| attr.strip_prefix("r="))
            .filter(|n| !n.is_empty())
            .ok_or(ScramError::Malformed)?;
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&verifier.salt), verifier.iterations);
        let gs2_header = format!("{gs2_flag},{},", rest.split_once(',').map(|(a, _)| a).unwrap_or(""));
        let mut channel = gs2_header.into_bytes();
        channel.extend_from_slice(binding_data);
        let exchange = Self {
            verifier,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            channel: B64.encode(channel),
            nonce,
        };
        Ok((exchange, server_first))
    }

    /// Checks the client-final message; on success returns the server-final message and
    /// the keys that log in to a server holding the same verifier as this role (SCRAM
    /// passthrough: the ClientKey the client proved, recovered from its proof).
    pub fn finish(self, client_final: &[u8]) -> Result<(String, ScramKeys), ScramError> {
        let text = std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed)?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or(ScramError::Malformed)?;
        let mut channel = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            if let Some(c) = attr.strip_prefix("c=") {
                channel = Some(c);
            } else if let Some(r) = attr.strip_prefix("r=") {
                nonce = Some(r);
            }
        }
        if channel != Some(self.channel.as_str()) {
            return Err(ScramError::ChannelBinding);
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err(ScramError::Nonce);
        }
        let proof = B64.decode(proof).map_err(|_| ScramError::Malformed)?;
        if proof.len() != 32 {
            return Err(ScramError::Malformed);
        }
        let auth_message = format!("{},{},{}", self.client_first_bare, self.server_first, without_proof);
        let signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; 32];
        for ((k, p), s) in client_key.iter_mut().zip(proof.iter()).zip(signature.iter()) {
            *k = p ^ s;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        if !same_bytes(&stored, &self.verifier.stored_key) {
            return Err(ScramError::WrongPassword);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        let keys = ScramKeys {
            iterations: self.verifier.iterations,
            salt: self.verifier.salt,
            client_key,
            server_key: self.verifier.server_key,
        };
        Ok((format!("v={}", B64.encode(server_signature)), keys))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

    fn run(password_on_server: &str, password_of_client: &str) -> Result<(), ScramError> {
        run_bound(password_on_server, password_of_client, ChannelBinding::unsupported(), Binding::NotOffered)
    }

    fn run_bound(
        password_on_server: &str,
        password_of_client: &str,
        client_binding: ChannelBinding,
        server_binding: Binding,
    ) -> Result<(), ScramError> {
        let verifier = ScramVerifier::from_password(password_on_server, b"0123456789abcdef".to_vec(), 4096);
        let mut client = ScramSha256::new(password_of_client.as_bytes(), client_binding);
        let (exchange, server_first) =
            ScramExchange::start(verifier, server_binding, client.message(), "SERVERNONCE")?;
        client.update(server_first.as_bytes()).map_err(|_| ScramError::Malformed)?;
        let (server_final, _) = exchange.finish(client.message())?;
        client.finish(server_final.as_bytes()).map_err(|_| ScramError::Malformed)
    }

    #[test]
    fn rust_postgres_client_authenticates() {
        assert_eq!(run("app", "app"), Ok(()));
        assert_eq!(run("app", "wrong"), Err(ScramError::WrongPassword));
    }

    #[test]
    fn passwords_are_compared_as_saslprep_normalises_them() {
        // A soft hyphen maps to nothing, a no-break space to a space, and NFKC composes
        // "e" and a combining acute: clients hash the normalised form.
        assert_eq!(run("pass\u{AD}word", "password"), Ok(()));
        assert_eq!(run("pass\u{A0}word", "pass word"), Ok(()));
        assert_eq!(run("cafe\u{301}", "caf\u{E9}"), Ok(()));
        assert_eq!(run("password", "passw0rd"), Err(ScramError::WrongPassword));
    }

    #[test]
    fn binds_to_the_tls_certificate_and_refuses_a_downgrade() {
        let cert_hash = b"hash of the certificate".to_vec();
        let plus = |client_data: &[u8]| ChannelBinding::tls_server_end_point(client_data.to_vec());
        assert_eq!(run_bound("app", "app", plus(&cert_hash), Binding::Required(&cert_hash)), Ok(()));
        assert_eq!(
            run_bound("app", "wrong", plus(&cert_hash), Binding::Required(&cert_hash)),
            Err(ScramError::WrongPassword)
        );
        // A client that saw another certificate (a man in the middle).
        assert_eq!(
            run_bound("app", "app", plus(b"another certificate"), Binding::Required(&cert_hash)),
            Err(ScramError::ChannelBinding)
        );
        // A client that cannot bind may pick plain SCRAM-SHA-256 over TLS; one that could
        // ("y": it believes the server offers no binding) was downgraded on the way.
        assert_eq!(run_bound("app", "app", ChannelBinding::unsupported(), Binding::Declined), Ok(()));
        assert_eq!(
            run_bound("app", "app", ChannelBinding::unrequested(), Binding::Declined),
            Err(ScramError::ChannelBinding)
        );
        assert_eq!(run_bound("app", "app", ChannelBinding::unrequested(), Binding::NotOffered), Ok(()));
        // SCRAM-SHA-256-PLUS chosen, but no binding in the message.
        assert_eq!(
            run_bound("app", "app", ChannelBinding::unsupported(), Binding::Required(&cert_hash)),
            Err(ScramError::ChannelBinding)
        );
    }

    #[test]
    fn a_mock_verifier_refuses_every_password_with_a_stable_salt_per_user() {
        let mock = ScramVerifier::mock("nobody");
        assert_eq!(mock.salt, ScramVerifier::mock("nobody").salt, "the same salt on every attempt");
        assert_ne!(mock.salt, ScramVerifier::mock("somebody").salt);
        assert_eq!(mock.iterations, 4096);
        for password in ["", "app", "nobody"] {
            let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
            let (exchange, server_first) =
                ScramExchange::start(mock.clone(), Binding::NotOffered, client.message(), "N").unwrap();
            assert!(server_first.contains(&format!("s={}", B64.encode(&mock.salt))));
            client.update(server_first.as_bytes()).unwrap();
            assert_eq!(exchange.finish(client.message()), Err(ScramError::WrongPassword));
        }
    }

    #[test]
    fn parses_pg_authid_verifiers() {
        let v = ScramVerifier::from_password("pw", b"salt".to_vec(), 4096);
        let text = format!(
            "SCRAM-SHA-256$4096:{}${}:{}",
            B64.encode(&v.salt),
            B64.encode(v.stored_key),
            B64.encode(v.server_key)
        );
        assert_eq!(ScramVerifier::parse(&text), Some(v));
        assert_eq!(ScramVerifier::parse("md5abc"), None);
    }

    #[test]
    fn rejects_channel_binding_and_garbage() {
        let v = ScramVerifier::from_password("pw", b"salt".to_vec(), 1);
        assert!(matches!(
            ScramExchange::start(v.clone(), Binding::NotOffered, b"p=tls-server-end-point,,n=,r=abc", "x"),
            Err(ScramError::ChannelBinding)
        ));
        assert!(matches!(
            ScramExchange::start(v, Binding::NotOffered, b"\xff\xfe", "x"),
            Err(ScramError::Malformed)
        ));
    }

    /// SCRAM passthrough: the keys a client's proof gives log in to a server holding
    /// the same verifier, and to no server whose verifier has another salt.
    #[test]
    fn the_recovered_client_key_logs_in_where_the_verifier_is_the_same() {
        use crate::protocol::scram::{PassthroughError, ScramClient};
        let verifier = ScramVerifier::from_password("pw", b"0123456789abcdef".to_vec(), 4096);
        let login = |verifier: ScramVerifier, keys: &ScramKeys| {
            let (mut ours, first) = ScramClient::start("PGTENANTNONCE".into());
            let (exchange, server_first) =
                ScramExchange::start(verifier, Binding::NotOffered, &first, "SERVERNONCE").unwrap();
            let last = ours.proof(keys, server_first.as_bytes())?;
            let (server_final, again) =
                exchange.finish(&last).map_err(|_| PassthroughError::ServerSignature)?;
            assert_eq!(&again, keys, "the server recovers the same ClientKey");
            ours.finish(server_final.as_bytes())
        };
        let mut client = ScramSha256::new(b"pw", ChannelBinding::unsupported());
        let (exchange, server_first) =
            ScramExchange::start(verifier.clone(), Binding::NotOffered, client.message(), "N1").unwrap();
        client.update(server_first.as_bytes()).unwrap();
        let (_, keys) = exchange.finish(client.message()).unwrap();
        assert_eq!(login(verifier.clone(), &keys), Ok(()));
        let elsewhere = ScramVerifier::from_password("pw", b"another salt....".to_vec(), 4096);
        assert_eq!(login(elsewhere, &keys), Err(PassthroughError::OtherVerifier));
        let other_password = ScramVerifier { stored_key: [7; 32], ..verifier };
        assert!(login(other_password, &keys).is_err(), "a server with another password refuses the proof");
        assert_eq!(format!("{keys:?}"), "ScramKeys { iterations: 4096, .. }", "no key in a log line");
        // The keys a password gives under the verifier's salt are the ones a client's
        // proof gives: a server login with a password derives them once per salt.
        assert_eq!(ScramKeys::from_password("pw", b"0123456789abcdef".to_vec(), 4096), keys);
        let normalised = ScramVerifier::from_password("p\u{00AD}w", b"0123456789abcdef".to_vec(), 4096);
        assert_eq!(login(normalised, &keys), Ok(()), "SASLprep maps the soft hyphen to nothing");
    }
}
