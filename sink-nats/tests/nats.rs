//! What is particular to the NATS JetStream sink, against real servers: the machine's
//! (`OUTBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`) and private `nats-server`s of a
//! test (TLS, credentials, a small `max_payload`). Each test names its own streams and
//! subjects and deletes its streams.

use std::time::Duration;

use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, check_binary, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{
    assert_all_failed, assert_all_published, describe_outcomes, sample_batch, sample_event,
    whole_call_error,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Sink};
use outboxkit_harness::tls::TestPki;
use outboxkit_harness::{nats_url, scratch_dir, unique, BrokerSide, NatsSide, PrivateNats};
use outboxkit_sink_nats::{
    NatsConfig, NatsSink, Storage, StreamDeclaration, TlsConfig, EVENT_HEADERS, MSG_ID_HEADER,
};

/// A side with its stream capturing `<prefix>.>` (made), and a sink config publishing to
/// `<prefix>.{aggregate_type}` on the machine's server.
async fn setup(name: &str, max_msg_size: Option<i32>) -> (NatsSide, NatsConfig) {
    let prefix = unique(name);
    let side = NatsSide::open(&prefix).await;
    side.create_stream(&side.stream(), &[format!("{prefix}.>")], max_msg_size)
        .await;
    let config = NatsConfig {
        subject: format!("{prefix}.{{aggregate_type}}"),
        ..NatsConfig::new(nats_url())
    };
    (side, config)
}

async fn checked(config: NatsConfig) -> NatsSink {
    let sink = NatsSink::connect_lazy(config).expect("a valid configuration");
    sink.check().await.unwrap_or_else(|e| panic!("check: {e}"));
    sink
}

async fn publish(sink: &NatsSink, batch: &[OutboxEvent]) -> Vec<Outcome> {
    sink.publish(batch)
        .await
        .unwrap_or_else(|e| panic!("publish failed as a whole: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_carry_the_event_and_msg_id() {
    let (side, config) = setup("nats_headers", None).await;
    let sink = checked(config).await;
    let mut event = sample_event(1, "order", "agg-1", "OrderPlaced");
    event.headers.insert("tenant-id".into(), "t-9".into());
    assert_all_published(&publish(&sink, std::slice::from_ref(&event)).await);
    let messages = side
        .messages(&side.stream(), ">", 1, Duration::from_secs(10))
        .await;
    assert_eq!(messages.len(), 1);
    let m = &messages[0];
    assert_eq!(m.subject, side.destination("order"));
    assert_eq!(m.payload, event.payload);
    assert_eq!(m.header(MSG_ID_HEADER), event.event_id.to_string());
    assert_eq!(m.header("traceparent"), event.headers["traceparent"]);
    assert_eq!(m.header("tenant-id"), "t-9");
    let values = [
        event.event_id.to_string(),
        event.event_type.clone(),
        event.aggregate_type.clone(),
        event.aggregate_id.clone(),
    ];
    for (name, value) in EVENT_HEADERS.iter().zip(values) {
        assert_eq!(m.header(name), value, "{name}");
    }
    assert!(m.header("created_at").ends_with('Z'), "{m:?}");
    side.cleanup().await;
}

/// A re-publish of an event (same `Nats-Msg-Id`) within the stream's duplicate window is
/// acknowledged and dropped: the stream holds it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_within_the_duplicate_window_is_dropped() {
    let (side, config) = setup("nats_dedup", None).await;
    let sink = checked(config).await;
    let batch = sample_batch(1, 5, "order", 5);
    assert_all_published(&publish(&sink, &batch).await);
    assert_all_published(&publish(&sink, &batch).await);
    assert_all_published(&publish(&sink, &batch[..2]).await);
    assert_eq!(side.count(&side.stream()).await, 5);
    side.cleanup().await;
}

/// An event over the stream's `max_msg_size` is rejected (dead) with the server's error, the
/// others of the call are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_stream_max_msg_size_is_rejected_alone() {
    let (side, config) = setup("nats_too_large", Some(2048)).await;
    let sink = checked(config).await;
    let mut batch = sample_batch(1, 3, "order", 3);
    batch[1].payload = vec![b'x'; 4096];
    let result = sink.publish(&batch).await;
    assert!(whole_call_error(&result).is_none(), "{result:?}");
    let outcomes = result.unwrap();
    assert!(outcomes[0].is_published() && outcomes[2].is_published());
    match &outcomes[1] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::MessageTooLarge, "{e}");
            assert!(
                e.message().contains("message size exceeds maximum allowed"),
                "{e}"
            );
        }
        other => panic!("{}", describe_outcomes(std::slice::from_ref(other))),
    }
    assert_eq!(side.count(&side.stream()).await, 2);
    side.cleanup().await;
}

/// An event over the server's `max_payload` (headers included) is never sent — the server
/// would close the connection — and is rejected naming the limit; the connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_server_max_payload_is_rejected_alone() {
    let dir = scratch_dir(&unique("nats_max_payload"));
    let conf = outboxkit_harness::write_file(&dir, "nats.conf", "max_payload: 4096\n");
    let server = PrivateNats::start(
        &unique("nats_max_payload"),
        &["-c".into(), conf.display().to_string()],
    );
    let side = NatsSide::open_at(&server.url(), "big").await;
    side.prepare().await;
    let config = NatsConfig {
        subject: "big.{aggregate_type}".into(),
        ..NatsConfig::new(server.url())
    };
    let sink = checked(config).await;
    let mut batch = sample_batch(1, 3, "order", 3);
    batch[0].payload = vec![b'x'; 5000];
    let outcomes = publish(&sink, &batch).await;
    match &outcomes[0] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::MessageTooLarge, "{e}");
            assert!(e.message().contains("max_payload (4096 bytes)"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(outcomes[1].is_published() && outcomes[2].is_published());
    assert_all_published(&publish(&sink, &sample_batch(10, 3, "order", 3)).await);
    assert_eq!(side.count(&side.stream()).await, 5);
}

/// Without a stream for the template's subjects, the start-up check fails naming the subject
/// and the key; a publish to such a subject retries each event, as unroutable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_is_a_configuration_error() {
    let prefix = unique("nats_nostream");
    let sink = NatsSink::connect_lazy(NatsConfig {
        subject: format!("{prefix}.{{aggregate_type}}"),
        ..NatsConfig::new(nats_url())
    })
    .unwrap();
    let e = sink.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(
        e.message().starts_with(&format!(
            "no stream for subject `{prefix}.*` (sink.nats.subject"
        )),
        "{e}"
    );
    // Published all the same, each event is retried on its own (see the next test).
    let outcomes = sink.publish(&sample_batch(1, 2, "order", 2)).await.unwrap();
    for outcome in &outcomes {
        match outcome {
            Outcome::Retry(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                assert!(e.message().contains("no responders"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A subject no stream captures (here a row's `destination`) retries only its events, as a
/// missing topic or queue does on the other brokers; the other events of the call are
/// published, and the call is no whole-call failure (which would back off every aggregate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_without_stream_retries_its_events_while_others_flow() {
    let (side, config) = setup("nats_unrouted", None).await;
    let sink = checked(config).await;
    let mut batch = sample_batch(1, 3, "order", 3);
    let lost = unique("nats_nowhere");
    batch[1].destination = Some(format!("{lost}.order"));
    let outcomes = sink.publish(&batch).await.unwrap();
    assert!(
        whole_call_error(&Ok(outcomes.clone())).is_none(),
        "{}",
        describe_outcomes(&outcomes)
    );
    assert!(outcomes[0].is_published() && outcomes[2].is_published());
    match &outcomes[1] {
        Outcome::Retry(e) => {
            assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
            assert!(
                e.message().starts_with(&format!(
                    "no stream for subject `{lost}.order` (no responders)"
                )),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    side.cleanup().await;
}

/// `declare_stream` creates the stream at start (subjects from the template by default), and
/// updates it when it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_stream_creates_the_stream() {
    let prefix = unique("nats_declare");
    let side = NatsSide::open(&prefix).await;
    let declaration = StreamDeclaration {
        name: side.stream(),
        subjects: Vec::new(),
        storage: Storage::Memory,
        duplicate_window: Duration::from_secs(60),
        max_msg_size: Some(100_000),
    };
    let config = NatsConfig {
        subject: format!("{prefix}.{{aggregate_type}}"),
        declare_stream: Some(declaration),
        ..NatsConfig::new(nats_url())
    };
    let sink = checked(config.clone()).await;
    assert_all_published(&publish(&sink, &sample_batch(1, 4, "order", 2)).await);
    assert_eq!(side.count(&side.stream()).await, 4);
    // A second relay starting with the same declaration updates it in place.
    checked(config).await;
    assert_eq!(side.count(&side.stream()).await, 4);
    side.cleanup().await;
}

/// A declaration whose subjects another stream already has is refused by the server with
/// "subjects overlap"; the error names that stream and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_overlapping_another_stream_names_that_stream() {
    let (side, config) = setup("nats_overlap", None).await;
    // The declared subjects: the template's, each placeholder as `*`.
    let declared = config.subject.replace("{aggregate_type}", "*");
    let config = NatsConfig {
        declare_stream: Some(StreamDeclaration {
            name: format!("{}_OTHER", side.stream()),
            subjects: Vec::new(),
            storage: Storage::Memory,
            duplicate_window: Duration::from_secs(60),
            max_msg_size: None,
        }),
        ..config
    };
    let sink = NatsSink::connect_lazy(config).expect("a valid configuration");
    let e = sink.check().await.unwrap_err();
    side.cleanup().await;
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(!e.is_retryable(), "{e}");
    let message = e.message();
    assert!(message.contains("subjects overlap"), "{e}");
    assert!(
        message.contains(&format!(
            "stream `{}` already captures subjects of `{declared}`; leave \
             sink.nats.declare_stream out to publish into `{}`",
            side.stream(),
            side.stream()
        )),
        "{e}"
    );
}

/// A rendered subject NATS cannot carry (a space in a field) rejects that event only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_rendered_subject_rejects_that_event() {
    let (side, config) = setup("nats_subject", None).await;
    let sink = checked(config).await;
    let mut batch = sample_batch(1, 2, "order", 2);
    batch.push(sample_event(3, "bad type", "agg-3", "X"));
    let mut bad_header = sample_event(4, "order", "agg-4", "X");
    bad_header.headers.insert("a:b".into(), "v".into());
    batch.push(bad_header);
    let outcomes = publish(&sink, &batch).await;
    assert!(outcomes[0].is_published() && outcomes[1].is_published());
    assert_all_failed(&outcomes[2..], ErrorKind::InvalidMessage, false);
    assert_eq!(side.count(&side.stream()).await, 2);
    side.cleanup().await;
}

/// `format = "cloudevents"`: binary content mode, `ce-<attribute>` headers, `content-type` =
/// `datacontenttype`, the payload byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode() {
    let (side, config) = setup("nats_ce", None).await;
    let sink = checked(NatsConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..config
    })
    .await;
    let events = sample_events(1, "order");
    assert_all_published(&publish(&sink, &events).await);
    let messages = side
        .messages(&side.stream(), ">", events.len(), Duration::from_secs(10))
        .await;
    assert_eq!(messages.len(), events.len());
    for event in &events {
        let id = event.event_id.to_string();
        let m = messages
            .iter()
            .find(|m| m.header("ce-id") == id)
            .unwrap_or_else(|| panic!("no message with ce-id {id}"));
        let headers = m.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        check_binary(event, headers, "ce-", m.header("content-type"), &m.payload);
        assert!(!m.headers.contains_key("traceparent"), "{m:?}");
        assert_eq!(m.header(MSG_ID_HEADER), id);
    }
    side.cleanup().await;
}

#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = NatsConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..NatsConfig::default()
    };
    assert_bad_source_refused(
        NatsSink::connect_lazy(config),
        "sink.nats.cloudevents_source",
    );
}

/// A configuration for a private server at `url` publishing to `<prefix>.{aggregate_type}` and
/// declaring the stream `<PREFIX>` over `<prefix>.>` on `storage` (a one-minute duplicate window,
/// no message size limit).
fn private_config(url: String, prefix: &str, storage: Storage) -> NatsConfig {
    let declaration = StreamDeclaration {
        name: prefix.to_uppercase(),
        subjects: vec![format!("{prefix}.>")],
        storage,
        duplicate_window: Duration::from_secs(60),
        max_msg_size: None,
    };
    NatsConfig {
        subject: format!("{prefix}.{{aggregate_type}}"),
        declare_stream: Some(declaration),
        ..NatsConfig::new(url)
    }
}

/// A private TLS-only server: the sink connects trusting the test CA (`tls://` URL), and a
/// sink trusting only the system's CAs is refused at start as a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_test_ca() {
    let name = unique("nats_tls");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let args = [
        "--tls".to_owned(),
        "--tlscert".to_owned(),
        pki.server.cert.display().to_string(),
        "--tlskey".to_owned(),
        pki.server.key.display().to_string(),
    ];
    let server = PrivateNats::start(&name, &args);
    let url = format!("tls://127.0.0.1:{}", server.port());
    let config = NatsConfig {
        tls: TlsConfig {
            required: true,
            ca_file: Some(pki.ca.clone()),
            ..TlsConfig::default()
        },
        ..private_config(url, "tls", Storage::File)
    };
    let sink = checked(config.clone()).await;
    assert_all_published(&publish(&sink, &sample_batch(1, 3, "order", 3)).await);
    let untrusted = NatsSink::connect_lazy(NatsConfig {
        tls: TlsConfig {
            required: true,
            ..TlsConfig::default()
        },
        ..config
    })
    .unwrap();
    let e = untrusted.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.message().contains("sink.nats.tls"), "{e}");
}

/// A private server with a user and password, and one with a token: the right credentials
/// work, wrong ones are refused as unauthorized, and no error shows a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_used_and_never_shown() {
    let name = unique("nats_auth");
    let args = ["--user", "relay", "--pass", "pa55-s3cr3t"].map(String::from);
    let server = PrivateNats::start(&name, &args);
    let at = |credentials: &str, port: u16| {
        let url = format!("nats://{credentials}@127.0.0.1:{port}");
        private_config(url, "auth", Storage::Memory)
    };
    let sink = checked(at("relay:pa55-s3cr3t", server.port())).await;
    assert_all_published(&publish(&sink, &sample_batch(1, 2, "order", 2)).await);
    let wrong = NatsSink::connect_lazy(at("relay:wr0ng-s3cr3t", server.port())).unwrap();
    let e = wrong.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    for shown in [e.to_string(), format!("{e:?}"), format!("{wrong:?}")] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
    drop(server);

    let name = unique("nats_token");
    let server = PrivateNats::start(&name, &["--auth".into(), "t0ken-s3cr3t".into()]);
    let with_token = |token: &str| NatsConfig {
        token: Some(token.into()),
        url: server.url(),
        ..at("unused:unused", 1)
    };
    checked(with_token("t0ken-s3cr3t")).await;
    let wrong = NatsSink::connect_lazy(with_token("wr0ng-s3cr3t")).unwrap();
    let e = wrong.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    for shown in [e.to_string(), format!("{wrong:?}")] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
}
