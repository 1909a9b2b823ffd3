//! Mutual-TLS files for the cluster benchmarks (`cluster-report --netns`, `call-report`): a
//! fresh CA (rcgen), a node certificate for the given names and a coordinator certificate, as
//! PEM files in a directory, in the shapes the launcher and the remote backend take.

use std::path::{Path, PathBuf};

use anyhow::Context;
use nightshift_coordinator::cluster::{ClientTls, NodeTls};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// Writes a CA, a node certificate valid for `node_names` (DNS names or IP addresses) and a
/// coordinator certificate into `dir`; returns (the nodes' TLS, the coordinator's TLS), each
/// side requiring the other's certificate.
pub fn mutual_tls(dir: &Path, node_names: Vec<String>) -> anyhow::Result<(NodeTls, ClientTls)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "nightshift benchmark CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let write = |name: &str, text: String| -> anyhow::Result<PathBuf> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    };
    let ca_pem = write("ca.pem", ca.pem())?;
    let leaf = |stem: &str, names: Vec<String>| -> anyhow::Result<_> {
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(names)?.signed_by(&key, &ca)?;
        Ok((
            write(&format!("{stem}.pem"), cert.pem())?,
            write(&format!("{stem}-key.pem"), key.serialize_pem())?,
        ))
    };
    let (nc, nk) = leaf("node", node_names)?;
    let (cc, ck) = leaf("coordinator", vec!["coordinator".into()])?;
    let client = ClientTls::from_files(&ca_pem, None, Some((&cc, &ck)))?;
    Ok((
        NodeTls {
            cert: nc,
            key: nk,
            client_ca: Some(ca_pem),
        },
        client,
    ))
}
