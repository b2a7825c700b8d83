//! The Redis Streams sink over TLS (`rediss://`), against private TLS-only Redis servers (one per
//! test, `PrivateRedis`: no plain TCP port) with certificates made by the harness's test PKI.
//! Certificate failures are configuration errors of `check()` that name the key to fix.

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::{publish_all, sample_batch};
use outboxkit_core::{Error, ErrorKind, Sink};
use outboxkit_harness::tls::{Leaf, TestPki, EXPIRED_ON, WRONG_NAME};
use outboxkit_harness::{scratch_dir, unique, PrivateRedis, RedisSide};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink, TlsConfig};

/// A private TLS server (client certificate required or not) and a name for the test's keys.
fn server(client_cert_required: bool) -> (PrivateRedis, String) {
    let name = unique("redis_tls");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    (PrivateRedis::start(&name, &pki, client_cert_required), name)
}

/// `rediss://` to `server`, trusting the test CA, short timeouts.
fn config(server: &PrivateRedis, stream: &str) -> RedisStreamsConfig {
    RedisStreamsConfig {
        stream: stream.to_owned(),
        connect_timeout: Duration::from_secs(3),
        response_timeout: Duration::from_secs(5),
        tls: TlsConfig {
            ca_file: Some(server.pki().ca.clone()),
            ..TlsConfig::default()
        },
        ..RedisStreamsConfig::new(server.url())
    }
}

fn with_client_certificate(
    mut config: RedisStreamsConfig,
    server: &PrivateRedis,
) -> RedisStreamsConfig {
    config.tls.client_cert_file = Some(server.pki().client.cert.clone());
    config.tls.client_key_file = Some(server.pki().client.key.clone());
    config
}

/// Build the sink (no I/O) and `check()` it, as the relay does at start.
async fn check(config: RedisStreamsConfig) -> Result<RedisStreamsSink, Error> {
    let sink = RedisStreamsSink::connect_lazy(config)?;
    sink.check().await.map(|()| sink)
}

/// `check()` fails with a configuration error (not retryable) naming the server and saying
/// `says`.
async fn assert_config_error(
    config: RedisStreamsConfig,
    server: &PrivateRedis,
    says: impl AsRef<str>,
) {
    let error = check(config)
        .await
        .map(drop)
        .expect_err("check() must fail");
    assert_eq!(
        error.kind(),
        ErrorKind::Config,
        "{error}\nserver log:\n{}",
        server.log()
    );
    assert!(!error.is_retryable(), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("Redis at 127.0.0.1:{}", server.port())),
        "{message}"
    );
    assert!(message.contains(says.as_ref()), "{message}");
}

/// Publish a batch with `sink` and read it back with the harness's TLS side `side`.
async fn publishes(sink: &RedisStreamsSink, side: &RedisSide, prefix: &str) {
    let stream = format!("{prefix}.order");
    let batch = sample_batch(1, 20, "order", 4);
    publish_all(sink, &batch).await;
    let got: Vec<String> = side
        .entries(&stream)
        .await
        .iter()
        .map(|e| e.text("event_id"))
        .collect();
    let expected: Vec<String> = batch.iter().map(|e| e.event_id.to_string()).collect();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn publishes_over_rediss_with_the_ca_file() {
    let (server, prefix) = server(false);
    let sink = RedisStreamsSink::connect(config(&server, &format!("{prefix}.{{aggregate_type}}")))
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}\nserver log:\n{}", server.log()));
    sink.check().await.expect("check over TLS");
    publishes(&sink, &server.side(&prefix).await, &prefix).await;
}

#[tokio::test]
async fn plain_redis_url_to_the_tls_server_fails() {
    let (server, _) = server(false);
    let plain = RedisStreamsConfig {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(3),
        ..RedisStreamsConfig::new(server.plain_url())
    };
    let error = RedisStreamsSink::connect(plain.clone())
        .await
        .map(drop)
        .expect_err("plain TCP to a TLS-only port");
    assert!(
        error
            .to_string()
            .contains(&format!("Redis at 127.0.0.1:{}", server.port())),
        "{error}"
    );
    let error = check(plain).await.map(drop).expect_err("check() fails too");
    assert!(
        matches!(error.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{error}"
    );
}

#[tokio::test]
async fn a_ca_file_without_the_servers_ca_is_a_config_error() {
    let (server, prefix) = server(false);
    let other_ca = server.pki().other_ca.clone();
    let mut wrong = config(&server, &prefix);
    wrong.tls.ca_file = Some(other_ca.clone());
    assert_config_error(
        wrong,
        &server,
        format!(
            "is not trusted by sink.redis_streams.tls.ca_file ({})",
            other_ca.display()
        ),
    )
    .await;
}

#[tokio::test]
async fn without_a_ca_file_the_system_cas_do_not_trust_the_test_ca() {
    let (server, prefix) = server(false);
    let mut system = config(&server, &prefix);
    system.tls.ca_file = None;
    assert_config_error(
        system,
        &server,
        "is not trusted by the system's CA certificates: set sink.redis_streams.tls.ca_file",
    )
    .await;
}

/// The server presents the certificate `leaf` picks from its test PKI: `check()` fails with a
/// configuration error saying `says`.
async fn assert_certificate_refused(leaf: fn(&TestPki) -> &Leaf, says: String) {
    let (server, prefix) = server(false);
    server.serve(leaf(server.pki())).await;
    assert_config_error(config(&server, &prefix), &server, says).await;
}

#[tokio::test]
async fn a_certificate_for_another_host_is_a_config_error() {
    assert_certificate_refused(
        |pki| &pki.wrong_name,
        format!("is for {WRONG_NAME}, not for 127.0.0.1 (the host of sink.redis_streams.url)"),
    )
    .await;
}

#[tokio::test]
async fn an_expired_certificate_is_a_config_error_with_its_date() {
    let expired_on = format!("expired on {EXPIRED_ON}");
    assert_certificate_refused(|pki| &pki.expired, expired_on).await;
}

#[tokio::test]
async fn a_required_client_certificate_is_named_when_missing_and_works_when_given() {
    let (server, prefix) = server(true);
    let without = config(&server, &format!("{prefix}.{{aggregate_type}}"));
    assert_config_error(
        without.clone(),
        &server,
        "sink.redis_streams.tls.client_cert_file",
    )
    .await;
    let sink = check(with_client_certificate(without, &server))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "with the client certificate: {e}\nserver log:\n{}",
                server.log()
            )
        });
    publishes(&sink, &server.side(&prefix).await, &prefix).await;
}

/// `password` authenticates (overriding a wrong one in the URL) and never shows in `Debug`.
#[tokio::test]
async fn the_password_key_overrides_the_urls_and_never_shows() {
    let (server, prefix) = server(false);
    let password = "tls-s3cr3t-pw";
    let side = server.side(&prefix).await;
    side.require_password(password).await;
    let stream = format!("{prefix}.{{aggregate_type}}");

    let no_password = config(&server, &stream);
    let error = check(no_password).await.map(drop).expect_err("NOAUTH");
    assert_eq!(error.kind(), ErrorKind::Unauthorized, "{error}");

    let mut with_password = config(&server, &stream);
    with_password.url = format!("rediss://:wrong-in-url@127.0.0.1:{}", server.port());
    with_password.password = Some(password.to_owned());
    let debug = format!("{with_password:?}");
    assert!(!debug.contains(password), "{debug}");
    assert!(!debug.contains("wrong-in-url"), "{debug}");
    let sink = check(with_password)
        .await
        .unwrap_or_else(|e| panic!("with the password key: {e}"));
    let debug = format!("{sink:?}");
    assert!(!debug.contains(password), "{debug}");
    // `side` connected before the password was set: it stays authenticated.
    publishes(&sink, &side, &prefix).await;
}
