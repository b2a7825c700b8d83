//! `amqps://` with `[sink.rabbitmq.tls]`: the local broker speaks plain AMQP, so the test puts
//! an in-process TLS proxy in front of it, with a certificate signed by a CA made for the test
//! (the harness's [`TestPki`]).

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::testkit::sink_suite::{publish_all, sample_batch};
use outboxkit_core::ErrorKind;
use outboxkit_harness::tls::{Leaf, TestPki};
use outboxkit_harness::{rabbitmq_address, rabbitmq_url, scratch_dir, unique, RabbitMqSide};
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink, TlsConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

/// The durable topic exchange the tests publish to (each test uses its own routing keys).
const TEST_EXCHANGE: &str = "outbox.tests";

/// Listen for TLS on a free loopback port and forward each connection to the broker.
async fn tls_proxy(server: &Leaf) -> u16 {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&server.cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let upstream = rabbitmq_address();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                if let Ok(mut broker) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_publishes_and_an_untrusted_server_is_refused() {
    let prefix = unique("rabbitmq");
    let pki = TestPki::create(&scratch_dir(&prefix).join("pki"));
    let port = tls_proxy(&pki.server).await;
    let broker = RabbitMqSide::open(TEST_EXCHANGE).await;
    broker.declare_exchange().await;
    let queue = format!("{prefix}.order");
    broker.bind_queue(&queue, &queue, &[]).await;
    let plain = url::Url::parse(&rabbitmq_url()).unwrap();
    let url = format!(
        "amqps://{}:{}@127.0.0.1:{port}{}",
        plain.username(),
        plain.password().unwrap_or("guest"),
        plain.path()
    );
    let base = RabbitMqConfig {
        routing_key: format!("{prefix}.{{aggregate_type}}"),
        connect_timeout: Duration::from_secs(10),
        ..RabbitMqConfig::new(&url, TEST_EXCHANGE)
    };

    // The CA given in tls.ca_file makes the server trusted.
    let sink = RabbitMqSink::connect(RabbitMqConfig {
        tls: TlsConfig {
            ca_file: Some(pki.ca.clone()),
            ..TlsConfig::default()
        },
        ..base.clone()
    })
    .await
    .unwrap_or_else(|e| panic!("connecting over TLS: {e}"));
    let batch = sample_batch(1, 5, "order", 5);
    publish_all(&sink, &batch).await;
    assert_eq!(
        broker.drain(&queue, 5, Duration::from_secs(10)).await.len(),
        5
    );

    // Without it, the certificate is not trusted: a configuration error naming the server and
    // the key to set, as for every adapter (not a broker down, tried again for ever).
    let e = RabbitMqSink::connect(base.clone()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of RabbitMQ at 127.0.0.1:{port} is not trusted by the system's CA \
             certificates: set sink.rabbitmq.tls.ca_file to the CA that signed it"
        )
    );

    // amqps:// to the broker's plain port: said so, not "received corrupt message".
    let plain_port = plain.port().unwrap_or(5672);
    let e = RabbitMqSink::connect(RabbitMqConfig {
        url: url.replace(&format!(":{port}"), &format!(":{plain_port}")),
        ..base
    })
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "RabbitMQ at 127.0.0.1:{plain_port} answered in plain text, not TLS \
             (sink.rabbitmq.tls)"
        )),
        "{e}"
    );
    broker.delete_queue(&queue).await;
    let _ = std::fs::remove_dir_all(&pki.dir);
}
