//! TLS from pgtenant to servers: SSLRequest, then a rustls handshake (ring provider).

use std::sync::Arc;

use crate::net::TcpSocket;
use rustls::ClientConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::error::BackendError;
use crate::config::{ServerTlsConfig, ServerTlsMode};
use crate::net::Stream;

/// How pgtenant asks servers for TLS.
pub struct ServerTls {
    connector: TlsConnector,
    required: bool,
}

impl ServerTls {
    /// `None` when TLS to servers is disabled.
    pub fn from_config(config: &ServerTlsConfig) -> Result<Option<Self>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let client = match (&config.mode, &config.ca) {
            (ServerTlsMode::Disable, _) => return Ok(None),
            (_, Some(ca)) => {
                let mut roots = rustls::RootCertStore::empty();
                let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
                for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
                    let cert: CertificateDer = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
                    roots.add(cert).map_err(|e| e.to_string())?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            (_, None) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                .with_no_client_auth(),
        };
        Ok(Some(Self {
            connector: TlsConnector::from(Arc::new(client)),
            required: config.mode == ServerTlsMode::Require,
        }))
    }

    /// Sends SSLRequest and upgrades when the server agrees.
    pub async fn negotiate(
        &self,
        mut tcp: TcpSocket,
        host: &str,
        addr: &str,
    ) -> Result<Stream, BackendError> {
        let io_err = |source| BackendError::Io { addr: addr.to_string(), source };
        let mut req = bytes::BytesMut::new();
        postgres_protocol::message::frontend::ssl_request(&mut req);
        tcp.write_all(&req).await.map_err(io_err)?;
        let answer = tcp.read_u8().await.map_err(io_err)?;
        match answer {
            b'S' => {
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| BackendError::Tls { addr: addr.to_string(), message: e.to_string() })?;
                let tls = self
                    .connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| BackendError::Tls { addr: addr.to_string(), message: e.to_string() })?;
                Ok(Stream::TlsClient(Box::new(tls)))
            }
            b'N' if !self.required => Ok(Stream::Plain(tcp)),
            b'N' => {
                Err(BackendError::Tls { addr: addr.to_string(), message: "server does not offer TLS".into() })
            }
            _ => Err(BackendError::Protocol {
                addr: addr.to_string(),
                message: "bad answer to SSLRequest".into(),
            }),
        }
    }
}

/// For `prefer` / `require` without a CA: encryption without authentication of the server.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
