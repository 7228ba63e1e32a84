//! TLS settings: Redis's `tls-*` configuration turned into a rustls server
//! configuration, built at start-up and again whenever CONFIG SET changes a `tls-*`
//! setting. Connections take the configuration in force when they are accepted, so a
//! reload never touches connections already open.

use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::config::Config;

/// The configuration new TLS connections get; None while `tls-port` is 0.
static CURRENT: Mutex<Option<Arc<ServerConfig>>> = Mutex::new(None);

/// The settings new TLS connections are accepted with.
pub fn current() -> Option<Arc<ServerConfig>> {
    CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A byte stream the replication link reads and writes: plain TCP or TLS over it.
pub trait AsyncIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> AsyncIo for T {}

/// Opens TLS over `tcp` to a master (`tls-replication yes`), presenting
/// `tls-client-cert-file` (or `tls-cert-file`) and trusting `tls-ca-cert-file` /
/// `tls-ca-cert-dir`, as Redis's outgoing links do.
pub async fn connect(
    config: &Config,
    host: &str,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let client = client_config(config)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("bad master name {host}: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

fn client_config(config: &Config) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(crypto_provider(config)?);
    let versions = protocol_versions(config.get("tls-protocols"))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS protocols: {e}"))?
        .with_root_certificates(ca_roots(config)?);
    let (cert, key) = match config.get("tls-client-cert-file") {
        "" => (config.get("tls-cert-file"), config.get("tls-key-file")),
        c => (c, config.get("tls-client-key-file")),
    };
    if cert.is_empty() || key.is_empty() {
        return Ok(builder.with_no_client_auth());
    }
    let certs = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("Failed to load private key: {key}: {e}"))?;
    builder
        .with_client_auth_cert(certs, key)
        .map_err(|e| format!("Invalid client certificate or key: {e}"))
}

/// The CAs of `tls-ca-cert-file` and `tls-ca-cert-dir`.
fn ca_roots(config: &Config) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let ca_file = config.get("tls-ca-cert-file");
    let ca_dir = config.get("tls-ca-cert-dir");
    if ca_file.is_empty() && ca_dir.is_empty() {
        return Err(
            "Either tls-ca-cert-file or tls-ca-cert-dir must be specified when tls-cluster, tls-replication or tls-auth-clients are enabled!".into(),
        );
    }
    if !ca_file.is_empty() {
        for c in read_certs(ca_file)? {
            roots.add(c).map_err(|e| {
                format!("Failed to configure CA certificate(s) file/directory: {e}")
            })?;
        }
    }
    if !ca_dir.is_empty() {
        let dir = std::fs::read_dir(ca_dir).map_err(|e| {
            format!("Failed to configure CA certificate(s) file/directory: {ca_dir}: {e}")
        })?;
        for entry in dir.flatten() {
            // Hashed links (`<hash>.0`) and plain PEM files alike; others are skipped.
            if let Ok(certs) = read_certs(&entry.path().to_string_lossy()) {
                for c in certs {
                    let _ = roots.add(c);
                }
            }
        }
    }
    Ok(roots)
}

/// The `tls-*` settings whose change rebuilds the configuration.
pub fn is_tls_setting(name: &str) -> bool {
    name.starts_with("tls-")
}

/// Builds the configuration from the settings and puts it in force (when `tls-port`
/// is set). The error says what is wrong, as Redis's log would.
pub fn reload(config: &Config) -> Result<(), String> {
    if config.get_i64("tls-port") == 0 {
        *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
        return Ok(());
    }
    let built = build(config)?;
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(built));
    Ok(())
}

fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("Failed to load certificate: {path}: {e}"))?
        .collect();
    let certs = certs.map_err(|e| format!("Failed to load certificate: {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "Failed to load certificate: {path}: no certificate found"
        ));
    }
    Ok(certs)
}

fn build(config: &Config) -> Result<ServerConfig, String> {
    let cert_file = config.get("tls-cert-file");
    let key_file = config.get("tls-key-file");
    if cert_file.is_empty() || key_file.is_empty() {
        return Err("No tls-cert-file or tls-key-file configured".into());
    }
    let certs = read_certs(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("Failed to load private key: {key_file}: {e}"))?;

    let provider = Arc::new(crypto_provider(config)?);
    let versions = protocol_versions(config.get("tls-protocols"))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("TLS protocols: {e}"))?;

    let auth = config.get("tls-auth-clients");
    let builder = if auth == "no" {
        builder.with_no_client_auth()
    } else {
        let roots = ca_roots(config)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = if auth == "optional" {
            verifier.allow_unauthenticated()
        } else {
            verifier
        };
        let verifier = verifier
            .build()
            .map_err(|e| format!("Failed to configure client verification: {e}"))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut server = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("Invalid certificate or private key: {e}"))?;
    server.ignore_client_order = config.get_bool("tls-prefer-server-ciphers");
    Ok(server)
}

/// `tls-protocols`: "TLSv1.2 TLSv1.3" by default; TLSv1 and TLSv1.1 are not offered.
fn protocol_versions(
    setting: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    if setting.trim().is_empty() {
        return Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12]);
    }
    let mut v = Vec::new();
    for word in setting.split_whitespace() {
        match word.to_ascii_lowercase().as_str() {
            "tlsv1.2" => v.push(&rustls::version::TLS12),
            "tlsv1.3" => v.push(&rustls::version::TLS13),
            "tlsv1" | "tlsv1.1" => {
                tracing::warn!("tls-protocols: {word} is not supported, ignored");
            }
            _ => return Err(format!("Invalid tls-protocols specified: {setting}")),
        }
    }
    if v.is_empty() {
        return Err(format!("No supported protocol in tls-protocols: {setting}"));
    }
    Ok(v)
}

/// The ring provider, narrowed to `tls-ciphersuites` (TLS 1.3 names) and `tls-ciphers`
/// (TLS 1.2, OpenSSL names) when they are set.
fn crypto_provider(config: &Config) -> Result<rustls::crypto::CryptoProvider, String> {
    let mut provider = rustls::crypto::ring::default_provider();
    let suites13 = config.get("tls-ciphersuites");
    let suites12 = config.get("tls-ciphers");
    if suites13.is_empty() && suites12.is_empty() {
        return Ok(provider);
    }
    let wanted13: Vec<String> = suites13
        .split(':')
        .filter(|s| !s.is_empty())
        .map(|s| s.to_ascii_uppercase())
        .collect();
    let wanted12: Vec<String> = suites12
        .split(':')
        .filter(|s| !s.is_empty())
        .map(|s| openssl_to_iana(&s.to_ascii_uppercase()))
        .collect();
    provider.cipher_suites.retain(|s| {
        // rustls spells TLS 1.3 suites `TLS13_...`; IANA (and Redis) `TLS_...`.
        let debug = format!("{:?}", s.suite());
        let name = match debug.strip_prefix("TLS13_") {
            Some(rest) => format!("TLS_{rest}"),
            None => debug,
        };
        match s.version().version {
            rustls::ProtocolVersion::TLSv1_3 => wanted13.is_empty() || wanted13.contains(&name),
            _ => wanted12.is_empty() || wanted12.contains(&name),
        }
    });
    if provider.cipher_suites.is_empty() {
        return Err("None of tls-ciphersuites / tls-ciphers is supported".into());
    }
    Ok(provider)
}

/// OpenSSL's names for the TLS 1.2 suites rustls implements, as IANA names.
fn openssl_to_iana(name: &str) -> String {
    match name {
        "ECDHE-ECDSA-AES128-GCM-SHA256" => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384" => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256" => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES256-GCM-SHA384" => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-CHACHA20-POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        other => other,
    }
    .to_string()
}
