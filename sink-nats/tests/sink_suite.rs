//! The sink conformance suite of `outboxkit-core` against the real NATS server
//! (`OUTBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`, JetStream on), read back by the
//! harness's NATS side: each destination gets a stream of its own, deleted once read back.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ConfigHarness, ReceivedMessage, SuiteConsumer};
use outboxkit_harness::{nats_url, NatsSide};
use outboxkit_sink_nats::{NatsConfig, NatsSink};

/// The suite's templates are one token (`suite<hex>_{aggregate_type}`), so the sink's start-up
/// check looks for a stream capturing `*`: `prepare_template` makes one for the template's
/// `probe` subject before the sink checks, as an operator makes the stream before starting the
/// relay; it is deleted when the case ends.
struct ProbingSide {
    side: NatsSide,
    probes: Mutex<Vec<String>>,
}

impl Drop for ProbingSide {
    fn drop(&mut self) {
        let probes = std::mem::take(&mut *self.probes.lock().unwrap());
        if probes.is_empty() {
            return;
        }
        // Dropped inside the case's runtime: delete from a thread with a runtime of its own.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let side = NatsSide::open("suite").await;
                for stream in probes {
                    side.delete_stream(&stream).await;
                }
            });
        })
        .join()
        .expect("deleting the probe streams");
    }
}

#[async_trait]
impl SuiteConsumer for ProbingSide {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        self.side.read_back(to, expected, wait).await
    }

    async fn prepare_destination(&self, to: &str) {
        self.side.prepare_destination(to).await;
    }

    async fn prepare_template(&self, template: &str) {
        let probe = ["{aggregate_type}", "{event_type}", "{aggregate_id}"]
            .iter()
            .fold(template.to_owned(), |t, p| t.replace(p, "probe"));
        let stream = outboxkit_harness::nats_stream_name(&probe);
        self.side
            .create_stream(&stream, std::slice::from_ref(&probe), None)
            .await;
        self.probes.lock().unwrap().push(stream);
    }
}

async fn harness() -> ConfigHarness<NatsConfig, ProbingSide> {
    let unreachable = NatsConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..NatsConfig::new("nats://127.0.0.1:1")
    };
    let config = NatsConfig::new(nats_url());
    let reader = ProbingSide {
        side: NatsSide::open("suite").await,
        probes: Mutex::new(Vec::new()),
    };
    ConfigHarness::new(config, unreachable, NatsSink::connect_lazy, reader)
}

outboxkit_core::sink_suite!(harness().await);
