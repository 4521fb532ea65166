//! TLS on both sides, with rustls (no OpenSSL): the listeners' certificate, reloadable on SIGHUP,
//! and the trust and client certificate of the connector that reaches `https://` upstreams.
//!
//! Both halves are self-contained: the listener takes a [`ListenerTls`] and accepts through it,
//! the forwarder takes an [`UpstreamConnector`] from [`upstream_connector`] whatever else it does.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{bail, Context};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use serde::{Deserialize, Serialize};

/// TLS for the listeners: PEM files, read at start and again on SIGHUP.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenTlsConfig {
    /// Certificate chain, leaf first (PEM).
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Whether `admin_listen` uses the same certificate (it carries the stats token).
    pub admin: bool,
}

impl Default for ListenTlsConfig {
    fn default() -> Self {
        ListenTlsConfig {
            cert_file: None,
            key_file: None,
            admin: true,
        }
    }
}

impl ListenTlsConfig {
    /// The certificate and key files, when TLS is on.
    pub fn files(&self) -> Option<(&std::path::Path, &std::path::Path)> {
        Some((self.cert_file.as_deref()?, self.key_file.as_deref()?))
    }
}

/// TLS towards an `https://` upstream.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// CA certificates to trust (PEM) instead of the built-in public roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain to present (PEM).
    pub client_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub client_key_file: Option<PathBuf>,
}

/// The connector every upstream client uses: plain TCP for `http://`, rustls for `https://`.
pub type UpstreamConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// The one crypto provider, named rather than left to process-wide defaults.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file, in order (leaf first for a chain).
fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificates in {}", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no PEM certificate in it", path.display());
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("reading a PEM private key from {}", path.display()))
}

/// A listener's TLS settings from a certificate chain and key file, offering only `http/1.1`.
pub fn server_config(cert_file: &Path, key_file: &Path) -> anyhow::Result<ServerConfig> {
    let certs = read_certs(cert_file)?;
    let key = read_key(key_file)?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "{} and {} do not make a usable certificate and key",
                cert_file.display(),
                key_file.display()
            )
        })?;
    // The proxy speaks HTTP/1.1 only; a client offering h2 alone fails the handshake cleanly.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A listener's certificate, swapped whole on reload: a handshake uses the settings current when
/// it starts, and connections already open keep theirs.
pub struct ListenerTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl ListenerTls {
    /// Loads the certificate chain and key.
    pub fn load(cert_file: &Path, key_file: &Path) -> anyhow::Result<ListenerTls> {
        let cfg = server_config(cert_file, key_file)?;
        Ok(ListenerTls {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current: RwLock::new(Arc::new(cfg)),
        })
    }

    /// An acceptor with the current certificate (one per connection, before its handshake).
    pub fn acceptor(&self) -> TlsAcceptor {
        let cfg = match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        TlsAcceptor::from(cfg)
    }

    /// Reads the files again; on any error the old certificate stays and the error is returned.
    pub fn reload(&self) -> anyhow::Result<()> {
        let cfg = Arc::new(server_config(&self.cert_file, &self.key_file)?);
        match self.current.write() {
            Ok(mut g) => *g = cfg,
            Err(poisoned) => *poisoned.into_inner() = cfg,
        }
        Ok(())
    }
}

/// The client TLS settings for `https://` upstreams: the built-in public roots (Mozilla's, from
/// `webpki-roots`, so an image without a CA bundle works) unless `ca_file` names the roots to
/// trust instead, and a client certificate when one is configured.
pub fn client_config(tls: &UpstreamTlsConfig) -> anyhow::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            for cert in read_certs(ca)? {
                roots
                    .add(cert)
                    .with_context(|| format!("{}: not a usable CA certificate", ca.display()))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    // No ALPN here: HTTP/1.1 is the default without it, and the connector builder insists on
    // setting ALPN itself.
    Ok(match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .context("the upstream client certificate and key do not match")?,
        (None, None) => builder.with_no_client_auth(),
        _ => bail!("upstream_tls: client_cert_file and client_key_file go together"),
    })
}

/// A connector for `http://` and `https://` upstreams with `tls`'s trust, TCP_NODELAY and the
/// connect timeout. Cheap to clone: clones share the TLS settings (each serving thread's client
/// takes one; pooled connections belong to the client, not the connector).
pub fn upstream_connector(
    tls: &UpstreamTlsConfig,
    connect_timeout: Duration,
) -> anyhow::Result<UpstreamConnector> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // The TLS layer decides by scheme; the TCP layer must let `https://` through to it.
    http.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(tls)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// A short, secret-free cause when `err`'s chain holds a TLS failure (for 502 bodies and logs).
pub fn tls_failure(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(match r {
                rustls::Error::InvalidCertificate(_) => {
                    "the upstream's TLS certificate is not trusted"
                }
                rustls::Error::AlertReceived(_) => "the upstream refused the TLS handshake",
                _ => "the TLS handshake with the upstream failed",
            });
        }
        // An io::Error's `source` skips the error it wraps (and the connector wraps one io::Error
        // in another), so step into it by hand.
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}
