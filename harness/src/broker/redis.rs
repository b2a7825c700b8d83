//! Redis Streams: one stream per aggregate type, `<prefix>.<aggregate_type>`, read back with
//! XRANGE.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use uuid::Uuid;

use super::{BrokerSide, AGGREGATE_TYPES};
use crate::delivery::{Committed, Delivered};

/// Redis for tests: `OUTBOX_TEST_REDIS_URL`, default the machine's local server.
pub fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The Redis Streams side.
#[derive(Clone)]
pub struct RedisSide {
    url: String,
    prefix: String,
    connection: MultiplexedConnection,
}

impl std::fmt::Debug for RedisSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSide")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisSide {
    /// Streams `<prefix>.<aggregate_type>` on the test server ([`redis_url`]); fails the test,
    /// saying what to start, when it is unreachable.
    pub async fn open(prefix: &str) -> Self {
        Self::open_at(&redis_url(), prefix).await
    }

    /// The server at `url`.
    pub async fn open_at(url: &str, prefix: &str) -> Self {
        let url = url.to_owned();
        let client = redis::Client::open(url.as_str())
            .unwrap_or_else(|e| panic!("{url} is not a redis:// URL: {e}"));
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| {
                panic!("Redis at {url} is unreachable ({e}): start it (scripts/services.sh)")
            });
        Self {
            url,
            prefix: prefix.to_owned(),
            connection,
        }
    }

    /// A connection for a test's own commands.
    pub fn connection(&self) -> MultiplexedConnection {
        self.connection.clone()
    }

    /// XLEN of `stream`.
    pub async fn stream_len(&self, stream: &str) -> u64 {
        redis::cmd("XLEN")
            .arg(stream)
            .query_async::<u64>(&mut self.connection())
            .await
            .unwrap_or(0)
    }

    /// DEL `keys`.
    pub async fn delete(&self, keys: &[String]) {
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut self.connection())
            .await
            .expect("DEL");
    }

    /// Every entry of `stream` (XRANGE, 5,000 at a time): `headers` = the entry's fields but
    /// the payload, `meta["entry_id"]` = the entry id.
    pub async fn read_stream(&self, stream: &str) -> Vec<Delivered> {
        let mut connection = self.connection();
        let mut out = Vec::new();
        let mut cursor = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&cursor)
                .arg("+")
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut connection)
                .await
                .expect("XRANGE");
            for entry in &reply.ids {
                let mut headers: HashMap<String, String> = entry
                    .map
                    .iter()
                    .filter_map(|(k, v)| {
                        redis::from_redis_value_ref::<String>(v)
                            .ok()
                            .map(|s| (k.clone(), s))
                    })
                    .collect();
                let payload = headers.remove("payload").unwrap_or_default();
                out.push(Delivered {
                    event_id: headers
                        .get("event_id")
                        .and_then(|s| Uuid::parse_str(s).ok())
                        .unwrap_or_default(),
                    aggregate_id: headers.get("aggregate_id").cloned().unwrap_or_default(),
                    destination: stream.to_owned(),
                    payload,
                    headers,
                    meta: HashMap::from([("entry_id".to_owned(), entry.id.clone())]),
                });
            }
            match reply.ids.last() {
                Some(last) if reply.ids.len() == 5000 => cursor = format!("({}", last.id),
                _ => break,
            }
        }
        out
    }
}

#[async_trait]
impl BrokerSide for RedisSide {
    fn name(&self) -> String {
        "Redis Streams".to_owned()
    }

    fn sink_toml(&self) -> String {
        format!(
            "[sink]\nkind = \"redis-streams\"\ndestination = \"{}.{{aggregate_type}}\"\n\n\
             [sink.redis_streams]\nurl = \"{}\"\n",
            self.prefix, self.url
        )
    }

    async fn prepare(&self) {
        // Streams come into being with their first entry.
    }

    fn destination(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.prefix)
    }

    async fn read_back(&self, _expected: &HashSet<Uuid>, _timeout: Duration) -> Vec<Delivered> {
        let mut out = Vec::new();
        for t in AGGREGATE_TYPES {
            out.extend(self.read_stream(&self.destination(t)).await);
        }
        out
    }

    fn check_messages(&self, delivered: &[Delivered], _committed: &Committed) {
        // The event's headers travel as one JSON field.
        for m in delivered {
            assert!(m.header("headers").contains("traceparent"), "{m:?}");
        }
    }

    async fn cleanup(&self) {
        let streams: Vec<String> = AGGREGATE_TYPES
            .iter()
            .map(|t| self.destination(t))
            .collect();
        self.delete(&streams).await;
    }
}
