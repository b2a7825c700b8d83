//! Certificates made at run time for the TLS tests: a test CA, a second CA nobody trusts, and
//! leaf certificates signed by the test CA — a good server certificate for `localhost` and
//! `127.0.0.1`, one for another host name, an expired one, and a client certificate.
//!
//! Files are PEM, written to a scratch directory with mode 0600 keys (PostgreSQL refuses a key
//! others can read).

use std::path::{Path, PathBuf};

use rcgen::{
    date_time_ymd, BasicConstraints, Certificate, CertificateParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A test PKI: see the module's documentation.
#[derive(Debug, Clone)]
pub struct TestPki {
    pub dir: PathBuf,
    /// The CA that signed every leaf.
    pub ca: PathBuf,
    /// A CA that signed nothing here: trusting only it must fail.
    pub other_ca: PathBuf,
    /// For `localhost` and `127.0.0.1`, valid now.
    pub server: Leaf,
    /// For `db.elsewhere.test` only, valid now.
    pub wrong_name: Leaf,
    /// For `localhost` and `127.0.0.1`, expired on [`EXPIRED_ON`].
    pub expired: Leaf,
    /// A client certificate whose common name is [`CLIENT_NAME`].
    pub client: Leaf,
}

/// The day the expired certificate's validity ended (YYYY-MM-DD).
pub const EXPIRED_ON: &str = "2021-01-01";
/// The host name of [`TestPki::wrong_name`].
pub const WRONG_NAME: &str = "db.elsewhere.test";
/// The common name of the client certificate (a database user for `clientcert=verify-full`).
pub const CLIENT_NAME: &str = "relay";

fn ca(name: &str) -> (Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if name.ends_with(".key") { 0o600 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    path
}

impl TestPki {
    /// Make every certificate, in `dir` (created).
    pub fn create(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let (ca_cert, ca_key) = ca("outbox relay test CA");
        let (other_cert, _) = ca("a CA nobody here trusts");
        let leaf = |file: &str, names: &[&str], cn: &str, client: bool, expired: bool| {
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![if client {
                ExtendedKeyUsagePurpose::ClientAuth
            } else {
                ExtendedKeyUsagePurpose::ServerAuth
            }];
            if expired {
                params.not_before = date_time_ymd(2020, 1, 1);
                params.not_after = date_time_ymd(2021, 1, 1);
            } else {
                params.not_before = date_time_ymd(2024, 1, 1);
                params.not_after = date_time_ymd(2099, 1, 1);
            }
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
            Leaf {
                cert: write(dir, &format!("{file}.crt"), &cert.pem()),
                key: write(dir, &format!("{file}.key"), &key.serialize_pem()),
            }
        };
        let local = ["localhost", "127.0.0.1"];
        Self {
            dir: dir.to_owned(),
            ca: write(dir, "ca.crt", &ca_cert.pem()),
            other_ca: write(dir, "other-ca.crt", &other_cert.pem()),
            server: leaf("server", &local, "localhost", false, false),
            wrong_name: leaf("wrong-name", &[WRONG_NAME], WRONG_NAME, false, false),
            expired: leaf("expired", &local, "localhost", false, true),
            client: leaf("client", &[], CLIENT_NAME, true, false),
        }
    }

    /// Copy `leaf` over the files `name.crt` / `name.key` that a server was started with (a
    /// certificate rotation: the server picks it up on reload).
    pub fn install(&self, leaf: &Leaf, cert: &Path, key: &Path) {
        std::fs::copy(&leaf.cert, cert).unwrap();
        std::fs::copy(&leaf.key, key).unwrap();
    }
}
