//! The TLS offered to clients (rustls with the ring provider), and the channel
//! binding data of its certificate for SCRAM-SHA-256-PLUS.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio_rustls::TlsAcceptor;

/// TLS for clients.
pub struct ClientTls {
    pub acceptor: TlsAcceptor,
    /// `tls-server-end-point` channel binding data (RFC 5929): the hash of the server
    /// certificate. `None` when its signature algorithm names no hash to use (Ed25519,
    /// RSA-PSS), where PostgreSQL does not offer channel binding either.
    pub end_point: Option<Vec<u8>>,
}

/// Builds the client TLS from PEM certificate chain and key files.
pub fn client_tls(cert: &Path, key: &Path) -> Result<ClientTls, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let end_point = certs.first().and_then(|c| end_point_hash(c));
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())?;
    Ok(ClientTls { acceptor: TlsAcceptor::from(Arc::new(config)), end_point })
}

/// The certificate hashed with its signature's hash function, SHA-256 standing in
/// for MD5 and SHA-1 (RFC 5929, section 4.1).
fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    const RSA: [u8; 8] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: [u8; 5] = [0x2a, 0x86, 0x48, 0xce, 0x3d];
    let oid = signature_algorithm(cert)?;
    let hash = match oid {
        [rsa @ .., n] if rsa == RSA => match n {
            4 | 5 | 11 => Sha256::digest(cert).to_vec(),
            12 => Sha384::digest(cert).to_vec(),
            13 => Sha512::digest(cert).to_vec(),
            _ => return None,
        },
        [ecdsa @ .., 4, 1] if ecdsa == ECDSA => Sha256::digest(cert).to_vec(),
        [ecdsa @ .., 4, 3, n] if ecdsa == ECDSA => match n {
            2 => Sha256::digest(cert).to_vec(),
            3 => Sha384::digest(cert).to_vec(),
            4 => Sha512::digest(cert).to_vec(),
            _ => return None,
        },
        _ => return None,
    };
    Some(hash)
}

/// The OID (its DER content) of a certificate's `signatureAlgorithm`: the field after
/// `tbsCertificate` in `Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, ... }`.
fn signature_algorithm(cert: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (SEQUENCE, certificate, _) = der_item(cert, 0)? else { return None };
    let (SEQUENCE, _, tbs_end) = der_item(cert, certificate)? else { return None };
    let (SEQUENCE, algorithm, _) = der_item(cert, tbs_end)? else { return None };
    let (OID, oid, oid_end) = der_item(cert, algorithm)? else { return None };
    Some(&cert[oid..oid_end])
}

/// The DER item at `at`: its tag, and where its content starts and ends.
fn der_item(der: &[u8], at: usize) -> Option<(u8, usize, usize)> {
    let tag = *der.get(at)?;
    let first = *der.get(at + 1)?;
    let (len, start) = if first < 0x80 {
        (usize::from(first), at + 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = der.get(at + 2..at + 2 + n)?;
        (bytes.iter().fold(0usize, |len, b| len << 8 | usize::from(*b)), at + 2 + n)
    };
    let end = start.checked_add(len)?;
    (end <= der.len()).then_some((tag, start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(alg: &'static rcgen::SignatureAlgorithm) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn hashes_the_certificate_with_its_signature_hash() {
        let p256 = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(end_point_hash(&p256), Some(Sha256::digest(&p256).to_vec()));
        let p384 = self_signed(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(end_point_hash(&p384), Some(Sha384::digest(&p384).to_vec()));
        // Ed25519 signs without a separate hash: no channel binding, as in PostgreSQL.
        assert_eq!(end_point_hash(&self_signed(&rcgen::PKCS_ED25519)), None);
        for garbage in [&b""[..], b"\x30", b"\x30\x84\xff\xff\xff\xff", b"\x30\x03\x30\x01"] {
            assert_eq!(end_point_hash(garbage), None);
        }
    }
}
