//! End to end over TLS, as the README's "A TLS-only production setup" configures it: a private
//! PostgreSQL that accepts only TLS with a password (verify-full), an `outbox-relay run` process
//! (the full binary, where rustls has both ring and aws-lc-rs compiled in), and a private
//! TLS-only Redis that requires a client certificate and a password. The configuration is the
//! README's block with this test's hosts and files; both passwords come from files.

use std::time::Duration;

use outboxkit_harness::tls::{TestPki, CLIENT_NAME};
use outboxkit_harness::*;

/// The TOML block after the `tls-example` marker of the README.
fn readme_example() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("reading README.md");
    let after = readme
        .split("<!-- tls-example:")
        .nth(1)
        .expect("README.md has the tls-example block");
    let block = after.split("```toml\n").nth(1).expect("a toml block");
    block.split("```").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tls_setup_delivers_with_passwords_from_files() {
    let name = unique("e2e_tls");
    let dir = scratch_dir(&name);
    let pki = TestPki::create(&dir.join("pki"));
    let (db_password, redis_password) = ("db-s3cr3t-from-file", "redis-s3cr3t-from-file");

    let pg = PrivatePostgres::start(&name, &pki, ClientAuth::Password);
    pg.set_password(CLIENT_NAME, db_password);
    let redis_server = PrivateRedis::start(&name, &pki, true);
    let redis = redis_server.side(&name).await;
    redis.require_password(redis_password).await;

    let ca = pki.ca.display().to_string();
    let config = readme_example()
        .replace(
            "db.internal:5432/app",
            &format!("127.0.0.1:{}/test", pg.port()),
        )
        .replace("/etc/relay/tls/db-ca.pem", &ca)
        .replace("/etc/relay/tls/cache-ca.pem", &ca)
        .replace(
            "cache.internal:6380",
            &format!("127.0.0.1:{}", redis_server.port()),
        )
        .replace(
            "/etc/relay/tls/relay.crt",
            &pki.client.cert.display().to_string(),
        )
        .replace(
            "/etc/relay/tls/relay.key",
            &pki.client.key.display().to_string(),
        )
        .replace(
            "/run/secrets/db-password",
            &write_file(&dir, "db-password", &format!("{db_password}\n"))
                .display()
                .to_string(),
        )
        .replace(
            "/run/secrets/redis-password",
            &write_file(&dir, "redis-password", redis_password)
                .display()
                .to_string(),
        );
    let config = write_file(&dir, "relay.toml", &config);

    // The writers' side: the same server, as the same user, its own pool.
    let url = pg.url(
        &format!("{CLIENT_NAME}:{db_password}"),
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let store = PostgresSide::open_at(&url, "outbox").await;
    let (ok, out, err) = run_cli(&config, &["migrate"], &[]);
    assert!(ok, "migrate failed: {out}{err}");
    let (ok, out, err) = run_cli(&config, &["status"], &[]);
    assert!(ok, "status failed: {out}{err}");
    assert!(
        out.contains("table public.outbox, TLS TLSv1.3 (sslmode=verify-full)"),
        "{out}"
    );

    store.enqueue_many(&placed_events(120, 5)).await;
    let mut relay = RelayProcess::start(&config, &dir, "relay-tls", &[]);
    wait_for(
        "120 events published over TLS",
        Duration::from_secs(60),
        || {
            let store = store.clone();
            async move { store.pending().await == 0 }
        },
    )
    .await;
    assert!(
        relay.is_running(),
        "the relay stopped:\n{}",
        relay.log_text()
    );
    let entries = redis.entries("order").await;
    let mut got: Vec<u64> = entries
        .iter()
        .map(|e| {
            let payload: serde_json::Value =
                serde_json::from_slice(e.field("payload").expect("payload")).expect("JSON");
            payload["i"].as_u64().expect("i")
        })
        .collect();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got, (0..120).collect::<Vec<u64>>(), "every event arrived");
    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    assert!(log.contains("TLS TLSv1.3 (sslmode=verify-full)"), "{log}");
    for secret in [db_password, redis_password] {
        assert!(
            !log.contains(secret),
            "a password is in the relay's log:\n{log}"
        );
        assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
    }
    store.drop_tables().await;
}
