//! SCRAM-SHA-256 primitives both sides use, and the client side of a login with keys
//! (`ScramClient`). The keys come from a password (`ScramKeys::from_password`: the key
//! stretching, done once per salt and kept by the caller) or, in SCRAM passthrough,
//! from a client's proof: logging in to a server as a role whose password pgtenant
//! never saw, with the ClientKey recovered from that role's client's proof (RFC 5802:
//! ClientKey = proof XOR HMAC(StoredKey, AuthMessage)) and the ServerKey of the role's
//! stored verifier. Sans-IO: the caller moves the messages.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Compares without an early exit on the first differing byte.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What logs in to a server as a role without its password: the salt and iterations
/// of the verifier the keys belong to (a server must offer the same), the ClientKey a
/// client proved, and the ServerKey that checks the server's signature.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl ScramKeys {
    /// The keys `password` gives under a verifier's `salt` and `iterations` (RFC 5802:
    /// SaltedPassword = Hi(password, salt, i), ClientKey and ServerKey HMACs of it), the
    /// password SASLprep-normalised (RFC 4013) as PostgreSQL and libpq do, or as it is
    /// when it has characters SASLprep prohibits. Costs `iterations` HMACs (4096 by
    /// default, about a millisecond).
    pub fn from_password(password: &str, salt: Vec<u8>, iterations: u32) -> Self {
        let password = stringprep::saslprep(password).unwrap_or(std::borrow::Cow::Borrowed(password));
        let salted = salted_password(password.as_bytes(), &salt, iterations);
        Self {
            iterations,
            salt,
            client_key: hmac(&salted, b"Client Key"),
            server_key: hmac(&salted, b"Server Key"),
        }
    }
}

/// Hi(password, salt, i) of RFC 5802: PBKDF2 with HMAC-SHA-256, one block.
fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    out
}

/// The salt and iteration count a server-first message names: which keys its verifier
/// takes.
pub fn server_salt(server_first: &[u8]) -> Result<(Vec<u8>, u32), PassthroughError> {
    let text = std::str::from_utf8(server_first).map_err(|_| PassthroughError::Malformed)?;
    let attr = |name: &str| text.split(',').find_map(|a| a.strip_prefix(name));
    let salt = attr("s=").and_then(|s| B64.decode(s).ok()).ok_or(PassthroughError::Malformed)?;
    let iterations: u32 = attr("i=").and_then(|i| i.parse().ok()).ok_or(PassthroughError::Malformed)?;
    Ok((salt, iterations))
}

/// The keys are secrets: never in a log line.
impl std::fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramKeys").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PassthroughError {
    #[error("malformed SCRAM message from the server")]
    Malformed,
    #[error("the server's nonce does not extend pgtenant's")]
    Nonce,
    /// The role's verifier on this server has another salt or iteration count than the
    /// one its client proved against: the ClientKey is not this server's.
    #[error(
        "the role's password verifier on this server is not the one its client logged in with (another salt or iteration count): give the role the same SCRAM verifier on every server"
    )]
    OtherVerifier,
    #[error("the server's SCRAM signature is wrong")]
    ServerSignature,
    /// The server wants a password (md5 or cleartext), which pgtenant does not have.
    #[error(
        "the server asks for a password (md5 or cleartext authentication); a login from the database logs in with SCRAM-SHA-256 only (pg_hba.conf: scram-sha-256)"
    )]
    PasswordAsked,
}

/// A login with keys in progress.
pub struct ScramClient {
    client_first_bare: String,
    nonce: String,
    /// The server signature to expect, once the client-final message is sent.
    expected: Option<[u8; 32]>,
}

impl ScramClient {
    /// Starts the exchange; returns the client-first message (no channel binding to the
    /// server: `n,,`).
    pub fn start(nonce: String) -> (Self, Vec<u8>) {
        let client_first_bare = format!("n=,r={nonce}");
        let first = format!("n,,{client_first_bare}").into_bytes();
        (Self { client_first_bare, nonce, expected: None }, first)
    }

    /// Reads the server-first message; returns the client-final message with the proof
    /// made with `keys`, which must be those of the salt and iterations the server names.
    pub fn proof(&mut self, keys: &ScramKeys, server_first: &[u8]) -> Result<Vec<u8>, PassthroughError> {
        let text = std::str::from_utf8(server_first).map_err(|_| PassthroughError::Malformed)?;
        let nonce = text.split(',').find_map(|a| a.strip_prefix("r=")).ok_or(PassthroughError::Malformed)?;
        let (salt, iterations) = server_salt(server_first)?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(PassthroughError::Nonce);
        }
        if salt != keys.salt || iterations != keys.iterations {
            return Err(PassthroughError::OtherVerifier);
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let stored_key: [u8; 32] = Sha256::digest(keys.client_key).into();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = keys.client_key.iter().zip(signature.iter()).map(|(k, s)| k ^ s).collect();
        self.expected = Some(hmac(&keys.server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message's signature.
    pub fn finish(&self, server_final: &[u8]) -> Result<(), PassthroughError> {
        let text = std::str::from_utf8(server_final).map_err(|_| PassthroughError::Malformed)?;
        let signature = text
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .and_then(|v| B64.decode(v).ok())
            .ok_or(PassthroughError::Malformed)?;
        match self.expected {
            Some(expected) if same_bytes(&signature, &expected) => Ok(()),
            _ => Err(PassthroughError::ServerSignature),
        }
    }
}
