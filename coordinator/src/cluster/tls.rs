//! TLS between the coordinator and its expert nodes (rustls through tonic): the CA bundle the
//! coordinator trusts node certificates with, the name it checks them against, and optionally its
//! own certificate for nodes that require mutual TLS. Files are read once, when the cluster is set
//! up, with errors naming the file; every (re)connection then reuses the bytes.

use std::path::Path;

use nightshift_proto::tls::{read_pem, TlsError};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The coordinator's side of TLS to nodes.
#[derive(Clone)]
pub struct ClientTls {
    ca: Vec<u8>,
    domain: Option<String>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("ClientTls")
            .field("domain", &self.domain)
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// Trust node certificates chaining to the PEM bundle `ca`; check them against `domain`
    /// (default: the host of each node's address); present `cert`/`key` when both are given.
    pub fn from_files(
        ca: &Path,
        domain: Option<String>,
        client: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, TlsError> {
        let ca = read_pem("CA bundle", ca, "CERTIFICATE")?;
        let identity = match client {
            Some((cert, key)) => Some((
                read_pem("client certificate", cert, "CERTIFICATE")?,
                read_pem("client key", key, "PRIVATE KEY")?,
            )),
            None => None,
        };
        Ok(ClientTls {
            ca,
            domain,
            identity,
        })
    }

    /// True when the coordinator presents a certificate of its own.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// The tonic configuration for one connection.
    /// The name node certificates must carry, when set (else the host dialled).
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The same material for the framed data links (`nightshift_proto::link`).
    pub fn link_config(
        &self,
    ) -> Result<std::sync::Arc<rustls::ClientConfig>, nightshift_proto::link::LinkError> {
        let identity = self
            .identity
            .as_ref()
            .map(|(c, k)| (c.as_slice(), k.as_slice()));
        nightshift_proto::link::client_tls(&self.ca, identity)
    }

    pub fn config(&self) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        if let Some(d) = &self.domain {
            cfg = cfg.domain_name(d.clone());
        }
        if let Some((cert, key)) = &self.identity {
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        cfg
    }
}
