//! Optional TLS (rustls, through tonic) on the node's gRPC port: the node presents a PEM
//! certificate chain and key, and with a client CA it also requires the coordinator to present a
//! certificate signed by that CA (mutual TLS). Files are read and checked here, before the server
//! starts, so a wrong path or a file that is not PEM fails with a message naming the file.

use std::path::PathBuf;

use nightshift_proto::tls::{read_pem, TlsError};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Where the node's TLS material lives.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain the node presents (leaf first).
    pub cert: PathBuf,
    /// PEM private key of the leaf certificate.
    pub key: PathBuf,
    /// PEM CA bundle client certificates must chain to (mutual TLS); `None` accepts any client
    /// that completes the handshake (authenticate it with the shared token instead).
    pub client_ca: Option<PathBuf>,
}

/// The server-side TLS configuration for `files`.
pub fn server_config(files: &TlsFiles) -> Result<ServerTlsConfig, TlsError> {
    let cert = read_pem("certificate", &files.cert, "CERTIFICATE")?;
    let key = read_pem("key", &files.key, "PRIVATE KEY")?;
    let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = &files.client_ca {
        let ca = read_pem("client CA", ca, "CERTIFICATE")?;
        cfg = cfg.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(cfg)
}

/// The framed data link's TLS (`nightshift_proto::link`) for the same files: same certificate,
/// same client CA.
pub fn link_config(files: &TlsFiles) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
    let cert = read_pem("certificate", &files.cert, "CERTIFICATE")?;
    let key = read_pem("key", &files.key, "PRIVATE KEY")?;
    let ca = match &files.client_ca {
        Some(p) => Some(read_pem("client CA", p, "CERTIFICATE")?),
        None => None,
    };
    nightshift_proto::link::server_tls(&cert, &key, ca.as_deref())
        .map_err(|e| anyhow::anyhow!("the data link's TLS ({}): {e}", files.cert.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).expect("write");
        p
    }

    #[test]
    fn rejects_missing_and_non_pem_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = write(
            dir.path(),
            "cert.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let key = write(dir.path(), "key.der", "0\u{82} not pem");
        let files = TlsFiles {
            cert: cert.clone(),
            key,
            client_ca: None,
        };
        let e = server_config(&files)
            .expect_err("key is not PEM")
            .to_string();
        assert!(e.contains("key") && e.contains("PRIVATE KEY"), "{e}");
        let files = TlsFiles {
            cert,
            key: dir.path().join("absent.pem"),
            client_ca: None,
        };
        let e = server_config(&files).expect_err("missing key").to_string();
        assert!(
            e.starts_with("cannot read the TLS key") && e.contains("absent.pem"),
            "{e}"
        );
    }
}
