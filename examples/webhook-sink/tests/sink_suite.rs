//! The sink conformance suite of `outboxkit-core` against a local HTTP server (one per case):
//! a destination is a path under the server's `/hooks`, and reading back a destination means
//! the requests the server accepted there.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use common::TestServer;
use outboxkit_core::testkit::sink_suite::{ConfigHarness, ReceivedMessage, SuiteConsumer};
use outboxkit_webhook_sink::{WebhookSink, WebhookSinkConfig};
use serde_json::value::RawValue;
use uuid::Uuid;

/// The sink under test posting to a new local server, which the suite reads back.
async fn harness() -> ConfigHarness<WebhookSinkConfig, Accepted> {
    let server = TestServer::start().await;
    let config = WebhookSinkConfig::new(format!("{}/hooks", server.url()));
    let unreachable = WebhookSinkConfig {
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        ..WebhookSinkConfig::new(format!("http://127.0.0.1:{}/hooks", common::free_port()))
    };
    ConfigHarness::new(config, unreachable, WebhookSink::new, Accepted(server))
}

/// The requests the server accepted, as a consumer of the webhook reads them.
struct Accepted(TestServer);

/// What a consumer reads from one accepted request: the event's fields from the JSON body, the
/// payload's exact bytes, and the HTTP headers (where the event's headers travel).
fn received(request: &common::Recorded) -> ReceivedMessage {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        event_id: Uuid,
        aggregate_id: String,
        event_type: String,
        content_type: String,
        #[serde(borrow)]
        payload: Option<&'a RawValue>,
        payload_text: Option<String>,
        payload_base64: Option<String>,
    }
    let body: Body<'_> = serde_json::from_slice(&request.body).unwrap_or_else(|e| {
        panic!(
            "{}: body is not the event document ({e}): {}",
            request.path,
            String::from_utf8_lossy(&request.body)
        )
    });
    assert_eq!(
        request.header("idempotency-key"),
        Some(body.event_id.to_string().as_str()),
        "{}: Idempotency-Key is the event_id",
        request.path
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    let mut headers: BTreeMap<String, String> = request.headers.clone();
    // The event's content type travels in the document (the request's is the document's).
    headers.insert("content-type".to_owned(), body.content_type);
    let payload = match (body.payload, body.payload_text, body.payload_base64) {
        (Some(json), None, None) => json.get().as_bytes().to_vec(),
        (None, Some(text), None) => text.into_bytes(),
        (None, None, Some(base64)) => BASE64.decode(base64).expect("payload_base64 is base64"),
        _ => panic!("{}: not exactly one payload field", request.path),
    };
    ReceivedMessage {
        event_id: body.event_id,
        aggregate_id: body.aggregate_id,
        event_type: body.event_type,
        payload,
        headers,
    }
}

#[async_trait]
impl SuiteConsumer for Accepted {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let path = format!("/hooks/{to}");
        let deadline = Instant::now() + wait;
        let accepted = loop {
            let accepted = self.0.accepted_at(&path);
            if accepted.len() >= expected || Instant::now() >= deadline {
                break accepted;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        accepted.iter().map(received).collect()
    }
}

outboxkit_core::sink_suite!(harness().await);
