//! The demo against a TLS-only Redis that requires a client certificate: its relays publish
//! over `rediss://` and its own reader reads back over TLS, with the same files.

use std::process::Command;

use outboxkit_harness::tls::TestPki;
use outboxkit_harness::{relay_binary, scratch_dir, unique, PrivateRedis};

#[test]
fn the_demo_runs_over_rediss_with_a_client_certificate() {
    let name = unique("demo_tls");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let redis = PrivateRedis::start(&name, &pki, true);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-demo"))
        .args([
            "--events",
            "400",
            "--aggregates",
            "20",
            "--writers",
            "2",
            "--relays",
            "1",
        ])
        .args(["--store", "postgres", "--sink", "redis-streams"])
        .arg("--broker-url")
        .arg(redis.url())
        .arg("--broker-ca-file")
        .arg(&pki.ca)
        .arg("--broker-client-cert")
        .arg(&pki.client.cert)
        .arg("--broker-client-key")
        .arg(&pki.client.key)
        .arg("--relay-bin")
        .arg(relay_binary())
        .output()
        .expect("running outbox-demo");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the demo failed:\n{text}");
    for line in [
        "events published     400",
        "duplicates           0",
        "order violations     0",
        "still pending        0",
    ] {
        assert!(text.contains(line), "expected {line:?} in:\n{text}");
    }

    // Without the CA file the demo says what to give.
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-demo"))
        .arg("--broker-url")
        .arg(redis.url())
        .arg("--relay-bin")
        .arg(relay_binary())
        .output()
        .expect("running outbox-demo");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --broker-ca-file"));
}
