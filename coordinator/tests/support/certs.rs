//! A test certificate authority (rcgen) for the TLS cluster tests: a CA written as
//! `<name>-ca.pem` that issues leaf certificates into a directory.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA, writing `<name>-ca.pem`, that issues certificates into `dir`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: PathBuf,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
        let pem = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&pem, issuer.pem()).expect("write ca");
        Ca { issuer, pem }
    }

    /// A leaf certificate for `names`; returns (cert.pem, key.pem).
    pub fn issue<S: AsRef<str>>(&self, dir: &Path, stem: &str, names: &[S]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|s| s.as_ref().to_string()).collect();
        let params = CertificateParams::new(names).expect("params");
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (c, k) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}-key.pem")),
        );
        std::fs::write(&c, cert.pem()).expect("write cert");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}
