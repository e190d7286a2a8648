//! TLS on the client port (rustls with the `ring` provider), for a proxy serving HTTPS.
//!
//! The Python proxy owns the certificate files: it loads and checks them (the key decrypted with
//! `ssl_keyfile_password`), watches them for a rotation (files on disk, a Kubernetes Secret's
//! volume) and pushes each pair that loads here over the control socket, in memory (`{"op":
//! "tls", "cert_pem", "key_pem", "ca_pem"}`); nothing is written to disk. Each new handshake takes
//! the newest pair pushed ([`Tls::current`]); established connections keep the keys they agreed.
//!
//! As the Python proxy's TLS (`kubeserve.runtime.tls`): TLS 1.2 and 1.3, no ALPN (HTTP/1.1 only,
//! an HTTP/2 client falls back to it), a handshake aborted after [`HANDSHAKE_TIMEOUT`], and given
//! a CA bundle every client must present a certificate it signed (required, not optional).
//!
//! [`ClientStream`] is what the serve loop reads and writes: a plain TCP connection or one behind
//! TLS, one type, so that requests are served (and handed off, decrypted) the same way.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its handshake (the Python proxy's `HANDSHAKE_TIMEOUT_S`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// The first byte of a TLS record carrying a handshake (a ClientHello's record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The largest PEM text accepted for one field of a push (a certificate chain, a CA bundle).
const MAX_PEM: usize = 1 << 20;

/// The client port's TLS: off (plain HTTP), or on with the newest pair pushed.
///
/// Invariant: when `required`, no connection is served before a pair was pushed ([`Tls::ready`]),
/// so a proxy serving HTTPS never answers plain HTTP, even in its first instant.
pub struct Tls {
    required: bool,
    current: RefCell<Option<TlsAcceptor>>,
    installed: Notify,
    /// how many pairs were installed (the first included)
    pub installs: std::cell::Cell<u64>,
}

impl Tls {
    pub fn new(required: bool) -> Self {
        Tls {
            required,
            current: RefCell::new(None),
            installed: Notify::new(),
            installs: std::cell::Cell::new(0),
        }
    }

    /// Returns once connections may be accepted: at once for plain HTTP, else once a pair is in.
    pub async fn ready(&self) {
        while self.required && self.current.borrow().is_none() {
            self.installed.notified().await;
        }
    }

    /// The acceptor for the next handshake (`None`: plain HTTP).
    pub fn current(&self) -> Option<TlsAcceptor> {
        self.current.borrow().clone()
    }

    /// Install a pair pushed by the Python proxy: new handshakes use it. On an error nothing
    /// changes (the previous pair keeps serving).
    pub fn install(
        &self,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: Option<&str>,
    ) -> Result<(), String> {
        if !self.required {
            return Err("tls: this process serves plain HTTP (started without --tls)".into());
        }
        let config = server_config(
            cert_pem.as_bytes(),
            key_pem.as_bytes(),
            ca_pem.map(str::as_bytes),
        )?;
        *self.current.borrow_mut() = Some(TlsAcceptor::from(Arc::new(config)));
        self.installs.set(self.installs.get() + 1);
        self.installed.notify_waiters();
        Ok(())
    }
}

/// A rustls server configuration serving `cert_pem` (the chain, leaf first) with `key_pem` (not
/// encrypted: PKCS#8, PKCS#1 or SEC1), requiring client certificates signed by `ca_pem` if given.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: Option<&[u8]>,
) -> Result<ServerConfig, String> {
    if cert_pem.len() > MAX_PEM
        || key_pem.len() > MAX_PEM
        || ca_pem.is_some_and(|c| c.len() > MAX_PEM)
    {
        return Err(format!("tls: a PEM field is larger than {MAX_PEM} bytes"));
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cert_pem: {e}"))?;
    if chain.is_empty() {
        return Err("cert_pem: no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key_pem: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?;
    let builder = match ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| format!("ca_pem: {e}"))?;
                roots.add(cert).map_err(|e| format!("ca_pem: {e}"))?;
            }
            if roots.is_empty() {
                return Err("ca_pem: no certificate".into());
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("ca_pem: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // checks that the key is usable by ring and is the leaf certificate's
    builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("key_pem: {e}"))
}

/// A client connection as the serve loop sees it: plain, or decrypted TLS.
pub enum ClientStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientStream {
    /// The connection as served: plain when `acceptor` is `None`, else after a TLS handshake
    /// (`None` when the handshake fails or times out: the connection is closed, as the Python
    /// proxy does).
    pub async fn accept(acceptor: Option<TlsAcceptor>, tcp: TcpStream) -> Option<ClientStream> {
        let Some(acceptor) = acceptor else {
            return Some(ClientStream::Plain(tcp));
        };
        let handshake = async {
            // Not a TLS handshake record (plain HTTP sent to the HTTPS port, say): closed without
            // an answer, as the Python proxy closes it; no TLS alert (bytes a plain client would
            // read as a malformed status line), and what was sent is read first so that the
            // close is a FIN, not a reset.
            let mut first = [0u8; 1];
            if tcp.peek(&mut first).await.ok()? == 0 || first[0] != TLS_HANDSHAKE_RECORD {
                let mut sink = [0u8; 4096];
                while matches!(tcp.try_read(&mut sink), Ok(n) if n > 0) {}
                let mut tcp = tcp;
                let _ = tcp.shutdown().await;
                return None;
            }
            acceptor.accept(tcp).await.ok()
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Some(tls)) => Some(ClientStream::Tls(Box::new(tls))),
            Ok(None) | Err(_) => None,
        }
    }

    /// Write all of `buf`; over TLS its records are on the socket when this returns.
    pub async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.write_all(buf).await,
            ClientStream::Tls(s) => {
                s.write_all(buf).await?;
                s.flush().await
            }
        }
    }

    /// Whether the client speaks TLS (for what is told to the Python proxy on a hand-off).
    #[allow(dead_code)]
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// The client's certificate chain (leaf first), when it presented one.
    #[allow(dead_code)]
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            ClientStream::Plain(_) => None,
            ClientStream::Tls(s) => s.get_ref().1.peer_certificates(),
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_that_serves_nothing_is_refused_with_the_field() {
        let err = server_config(b"not pem", b"", None).unwrap_err();
        assert!(err.starts_with("cert_pem: no certificate"), "{err}");
        let cert = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let err = server_config(cert, b"nothing", None).unwrap_err();
        assert!(err.starts_with("key_pem:"), "{err}");
        let tls = Tls::new(false);
        assert!(tls.install("", "", None).is_err() && tls.current().is_none());
    }
}
