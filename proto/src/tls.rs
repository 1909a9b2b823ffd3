//! TLS material shared by both ends of the `nightshift.v1` link: reading PEM files with errors
//! that name the file, before tonic/rustls sees them (their own errors do not say which file).

use std::path::Path;

/// Errors of reading TLS material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("the TLS {what} {path} holds no PEM {expected} block")]
    NotPem {
        what: &'static str,
        path: String,
        expected: &'static str,
    },
}

/// Reads `path` (described as `what` in errors) and checks it holds at least one PEM block whose
/// label contains `expected` (`CERTIFICATE`, `PRIVATE KEY`).
pub fn read_pem(
    what: &'static str,
    path: &Path,
    expected: &'static str,
) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-----BEGIN "))
        .any(|label| label.contains(expected));
    if !found {
        return Err(TlsError::NotPem {
            what,
            path: path.display().to_string(),
            expected,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_label_must_match() {
        let dir = std::env::temp_dir().join(format!("nightshift-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("k.pem");
        std::fs::write(
            &p,
            "-----BEGIN EC PRIVATE KEY-----\nAA==\n-----END EC PRIVATE KEY-----\n",
        )
        .expect("write");
        assert!(read_pem("key", &p, "PRIVATE KEY").is_ok());
        let e = read_pem("certificate", &p, "CERTIFICATE").expect_err("a key is not a certificate");
        assert_eq!(
            e.to_string(),
            format!(
                "the TLS certificate {} holds no PEM CERTIFICATE block",
                p.display()
            )
        );
        let e = read_pem("key", &dir.join("absent.pem"), "PRIVATE KEY").expect_err("missing");
        assert!(e.to_string().starts_with("cannot read the TLS key"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
