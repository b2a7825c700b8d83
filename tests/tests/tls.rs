//! The relay against TLS-only databases (private servers with certificates made at run time,
//! `outboxkit_harness::tls`): it connects with full verification and delivers end to end; a
//! plain connection is refused by the server; a wrong CA, a wrong host name and an expired
//! certificate each fail at start with a configuration error naming what to fix; a client
//! certificate is required and accepted; the password never reaches the relay's output.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::tls::{TestPki, CLIENT_NAME, EXPIRED_ON, WRONG_NAME};
use outboxkit_harness::*;

/// A password the servers do not check (trust auth / no password), to look for in the output.
const PASSWORD: &str = "tls-test-s3cr3t";

/// The scenario's configuration with its store URL replaced by `url`, as a new file.
fn config_with_url(scenario: &Scenario, url: &str, name: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&scenario.config).unwrap();
    let mut out = String::new();
    let mut in_store = false;
    for line in text.lines() {
        if line.starts_with('[') {
            in_store = line.trim() == "[store]";
        }
        if in_store && line.starts_with("url = ") {
            out.push_str(&format!("url = \"{url}\"\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    write_file(&scenario.dir, name, &out)
}

/// `outbox-relay status` with the store at `url`: (success, stdout + stderr).
fn status_with(scenario: &Scenario, url: &str) -> (bool, String) {
    let config = config_with_url(scenario, url, "variant.toml");
    let (ok, out, err) = run_cli(&config, &["status"], &scenario.broker.relay_env());
    (ok, format!("{out}{err}"))
}

fn assert_refused(scenario: &Scenario, url: &str, expected: &[&str]) {
    let (ok, text) = status_with(scenario, url);
    assert!(!ok, "status succeeded with {url}:\n{text}");
    for part in expected {
        assert!(text.contains(part), "expected {part:?} in:\n{text}");
    }
    assert!(
        !text.contains(PASSWORD),
        "the password reached the output:\n{text}"
    );
}

/// `outbox-relay run` with the store at `url` must stop by itself, failing, within 30 s (a
/// configuration error at start, not a database outage retried forever).
fn assert_run_fails_at_start(scenario: &Scenario, url: &str, expected: &str) {
    let config = config_with_url(scenario, url, "run-variant.toml");
    let mut relay = RelayProcess::start(
        &config,
        &scenario.dir,
        "relay-bad-tls",
        &scenario.broker.relay_env(),
    );
    let exit = relay.exit_within(
        Duration::from_secs(30),
        &format!("the relay kept running with {url}"),
    );
    let log = relay.log_text();
    assert_eq!(
        exit.code(),
        Some(2),
        "a configuration error exits 2; log:\n{log}"
    );
    assert!(log.contains(expected), "expected {expected:?} in:\n{log}");
    assert!(
        !log.contains(PASSWORD),
        "the password reached the log:\n{log}"
    );
}

/// Enqueue 300 events, run one relay until they are published, read them back from Redis, and
/// check the relay's log for the TLS status and the absence of the password.
async fn deliver(scenario: &mut Scenario, redis: &RedisSide, tls: &str) {
    let (ok, text, err) = scenario.cli(&["status"]);
    assert!(ok, "status failed: {err}");
    assert!(text.contains(tls), "status does not say {tls:?}:\n{text}");
    scenario.store.enqueue_many(&placed_events(300, 9)).await;
    scenario.start_relay("relay-tls", &[]);
    scenario
        .drain("300 events published over TLS", Duration::from_secs(60))
        .await;
    let delivered = redis.read_stream(&redis.destination("order")).await;
    assert_eq!(delivered.len(), 300);
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    assert!(
        log.contains(tls),
        "the start line does not say {tls:?}:\n{log}"
    );
    assert!(
        !log.contains(PASSWORD),
        "the password reached the log:\n{log}"
    );
}

/// A scenario from `store` to the machine's Redis.
async fn to_redis(store: Arc<dyn StoreSide>) -> (Scenario, Arc<RedisSide>) {
    let redis = Arc::new(RedisSide::open(store.table()).await);
    let scenario = Scenario::prepare(store, redis.clone(), Settings::default()).await;
    (scenario, redis)
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_only_verify_full_delivers_and_bad_certificates_fail_at_start() {
    let name = unique("tls_pg");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let pg = PrivatePostgres::start(&name, &pki, ClientAuth::TlsOnly);
    let (ca, other) = (path(&pki.ca), path(&pki.other_ca));
    let verified = format!("sslmode=verify-full&sslrootcert={ca}");
    let user = format!("postgres:{PASSWORD}");
    let url = pg.url(&user, &verified);
    let (mut scenario, redis) = to_redis(Arc::new(PostgresSide::open_at(&url, &name).await)).await;
    deliver(&mut scenario, &redis, "TLS TLSv1.3 (sslmode=verify-full)").await;

    // The server refuses a connection without TLS.
    assert_refused(
        &scenario,
        &pg.url(&user, "sslmode=disable"),
        &["refused", "no encryption"],
    );
    // A CA that did not sign the server's certificate.
    let wrong_ca = pg.url(&user, &format!("sslmode=verify-full&sslrootcert={other}"));
    let message = format!("is not trusted by store.url's sslrootcert ({other})");
    assert_refused(&scenario, &wrong_ca, &[&message]);
    assert_run_fails_at_start(&scenario, &wrong_ca, &message);
    // No CA at all: the system's CAs do not know the test CA.
    assert_refused(
        &scenario,
        &pg.url(&user, "sslmode=verify-full"),
        &["is not trusted by the system's CA certificates: set sslrootcert"],
    );

    // A certificate for another host name: verify-full refuses it, verify-ca checks only who
    // signed it and accepts it (as libpq does; sqlx 0.8.6 refused it there too).
    pg.serve(&pki.wrong_name.cert, &pki.wrong_name.key);
    let wrong_name = format!("is for {WRONG_NAME}, not for 127.0.0.1");
    assert_refused(
        &scenario,
        &url,
        &[&wrong_name, "have it reissued for this host"],
    );
    let verify_ca = pg.url(&user, &format!("sslmode=verify-ca&sslrootcert={ca}"));
    let (ok, text) = status_with(&scenario, &verify_ca);
    assert!(ok, "verify-ca refused a certificate its CA signed:\n{text}");
    assert!(text.contains("(sslmode=verify-ca)"), "{text}");

    // An expired certificate.
    pg.serve(&pki.expired.cert, &pki.expired.key);
    assert_refused(&scenario, &url, &[&format!("expired on {EXPIRED_ON}")]);
    assert_run_fails_at_start(&scenario, &url, &format!("expired on {EXPIRED_ON}"));

    // Rotated back to a good certificate by a reload: accepted again, no restart.
    pg.serve(&pki.server.cert, &pki.server.key);
    let (ok, text) = status_with(&scenario, &url);
    assert!(ok, "{text}");
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_requires_and_accepts_a_client_certificate() {
    let name = unique("tls_pg_cert");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let pg = PrivatePostgres::start(&name, &pki, ClientAuth::VerifyFull);
    let verified = format!("sslmode=verify-full&sslrootcert={}", path(&pki.ca));
    let with_cert = format!(
        "{verified}&sslcert={}&sslkey={}",
        path(&pki.client.cert),
        path(&pki.client.key)
    );
    let url = pg.url(CLIENT_NAME, &with_cert);
    let (mut scenario, redis) = to_redis(Arc::new(PostgresSide::open_at(&url, &name).await)).await;
    deliver(&mut scenario, &redis, "TLS TLSv1.3 (sslmode=verify-full)").await;
    // Without the certificate the server refuses the user.
    assert_refused(
        &scenario,
        &pg.url(CLIENT_NAME, &verified),
        &["refused user \"relay\"", "certificate"],
    );
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_tls_only_verify_identity_delivers_and_bad_certificates_fail_at_start() {
    let name = unique("tls_my");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let db = PrivateMariaDb::create(&name).tls_only(&pki);
    db.start().await;
    let (ca, other) = (path(&pki.ca), path(&pki.other_ca));
    let base = db.url("test");
    let at = |query: &str| format!("{base}?{query}");
    let url = at(&format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"));
    let (mut scenario, redis) = to_redis(Arc::new(MySqlSide::open_at(&url, &name).await)).await;
    deliver(&mut scenario, &redis, "(ssl-mode=VERIFY_IDENTITY)").await;

    assert_refused(
        &scenario,
        &at("ssl-mode=DISABLED"),
        &["refused user \"root\""],
    );
    let wrong_ca = at(&format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={other}"));
    let message = format!("is not trusted by store.url's ssl-ca ({other})");
    assert_refused(&scenario, &wrong_ca, &[&message]);
    assert_run_fails_at_start(&scenario, &wrong_ca, &message);

    db.serve(&pki.wrong_name.cert, &pki.wrong_name.key).await;
    let wrong_name = format!("is for {WRONG_NAME}, not for 127.0.0.1");
    assert_refused(&scenario, &url, &[&wrong_name]);
    // The name the certificate holds, set apart from the address the URL connects to.
    let by_sni = format!("{url}&tls-sni-servername={WRONG_NAME}");
    let (ok, text) = status_with(&scenario, &by_sni);
    assert!(ok, "the certificate for the SNI name was refused:\n{text}");
    assert!(text.contains("(ssl-mode=VERIFY_IDENTITY)"), "{text}");
    let other_sni = format!("{url}&tls-sni-servername=db.other.test");
    let blamed = format!(
        "is for {WRONG_NAME}, not for db.other.test (store.url's tls-sni-servername): set \
         tls-sni-servername to a name the certificate holds"
    );
    assert_refused(&scenario, &other_sni, &[&blamed]);
    // VERIFY_CA checks only who signed it (see the PostgreSQL test).
    let (ok, text) = status_with(&scenario, &at(&format!("ssl-mode=VERIFY_CA&ssl-ca={ca}")));
    assert!(ok, "VERIFY_CA refused a certificate its CA signed:\n{text}");
    assert!(text.contains("(ssl-mode=VERIFY_CA)"), "{text}");
    db.serve(&pki.expired.cert, &pki.expired.key).await;
    assert_refused(&scenario, &url, &[&format!("expired on {EXPIRED_ON}")]);

    // A user that must present a certificate: refused without, accepted with it.
    db.serve(&pki.server.cert, &pki.server.key).await;
    let as_relay = |query: &str| {
        format!(
            "{}?{query}",
            base.replacen("root@", &format!("{CLIENT_NAME}@"), 1)
        )
    };
    let verified = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    assert_refused(&scenario, &as_relay(&verified), &["relay"]);
    let with_cert = format!(
        "{verified}&ssl-cert={}&ssl-key={}",
        path(&pki.client.cert),
        path(&pki.client.key)
    );
    let (ok, text) = status_with(&scenario, &as_relay(&with_cert));
    assert!(ok, "the client certificate was not accepted:\n{text}");
    scenario.cleanup().await;
}
