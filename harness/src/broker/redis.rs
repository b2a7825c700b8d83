//! Redis Streams: one stream per aggregate type, `<prefix>.<aggregate_type>`, read back with
//! XRANGE.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{sink_tables, BrokerSide, AGGREGATE_TYPES};
use crate::delivery::{Committed, Delivered};
use crate::util::first_line;
#[cfg(feature = "sink-suite")]
use outboxkit_core::testkit::sink_suite::ReceivedMessage;

/// Redis for tests: `OUTBOX_TEST_REDIS_URL`, default the machine's local server.
pub fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A [`Blackhole`](crate::proxy::Blackhole) in front of the test server ([`redis_url`], a plain
/// `redis://host:port`), and the `redis://` URL that goes through it: a test cuts the network
/// to Redis with it.
pub async fn redis_behind_blackhole() -> (crate::proxy::Blackhole, String) {
    let upstream = redis_url().trim_start_matches("redis://").to_owned();
    let proxy = crate::proxy::Blackhole::to(upstream).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    (proxy, url)
}

/// The TLS files a side connects with (`rediss://`), and that its [`BrokerSide::sink_toml`]
/// gives the relay.
#[derive(Debug, Clone)]
struct TlsFiles {
    ca: PathBuf,
    client: Option<(PathBuf, PathBuf)>,
}

/// The Redis Streams side.
#[derive(Clone)]
pub struct RedisSide {
    url: String,
    prefix: String,
    tls: Option<TlsFiles>,
    /// The client `connection` came from, with the TLS files when the side has them: a
    /// connection of its own (the watcher's) is opened as the side's was.
    client: redis::Client,
    connection: MultiplexedConnection,
}

impl std::fmt::Debug for RedisSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSide")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl RedisSide {
    /// Streams `<prefix>.<aggregate_type>` on the test server ([`redis_url`]); fails the test,
    /// saying what to start, when it is unreachable.
    pub async fn open(prefix: &str) -> Self {
        Self::open_at(&redis_url(), prefix).await
    }

    /// A [`Scenario`](crate::Scenario) of `store` → streams `<name>.<aggregate_type>`, its relays
    /// serving HTTP on a free port, with `relay` added to `[relay]`: the side, the scenario and
    /// the port.
    pub async fn scenario(
        name: &str,
        store: std::sync::Arc<dyn crate::StoreSide>,
        relay: &str,
    ) -> (std::sync::Arc<Self>, crate::Scenario, u16) {
        let redis = std::sync::Arc::new(Self::open(name).await);
        let port = crate::free_port();
        let settings = crate::Settings::default().listen_on(port).relay(relay);
        let scenario = crate::Scenario::prepare(store, redis.clone(), settings).await;
        (redis, scenario, port)
    }

    /// The server at `url`.
    pub async fn open_at(url: &str, prefix: &str) -> Self {
        let url = url.to_owned();
        let client = redis::Client::open(url.as_str())
            .unwrap_or_else(|e| panic!("{url} is not a redis:// URL: {e}"));
        let connection = consumer_connection(&client).await.unwrap_or_else(|e| {
            panic!("Redis at {url} is unreachable ({e}): start it (scripts/services.sh)")
        });
        Self {
            url,
            prefix: prefix.to_owned(),
            tls: None,
            client,
            connection,
        }
    }

    /// The TLS server at `rediss_url`, its certificate verified against the CAs of `ca_file`
    /// only; with `client` = (certificate, key) files, a client certificate is presented.
    pub async fn open_tls(
        rediss_url: &str,
        prefix: &str,
        ca_file: &Path,
        client: Option<(&Path, &Path)>,
    ) -> Self {
        let url = rediss_url.to_owned();
        let read = |path: &Path| {
            std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        };
        let certificates = redis::TlsCertificates {
            client_tls: client.map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: read(cert),
                client_key: read(key),
            }),
            root_cert: Some(read(ca_file)),
        };
        install_crypto_provider();
        let tls_client = redis::Client::build_with_tls(url.as_str(), certificates)
            .unwrap_or_else(|e| panic!("{url} with the TLS files given: {e}"));
        let connection = consumer_connection(&tls_client)
            .await
            .unwrap_or_else(|e| panic!("Redis at {url} is unreachable over TLS: {e}"));
        Self {
            url,
            prefix: prefix.to_owned(),
            tls: Some(TlsFiles {
                ca: ca_file.to_owned(),
                client: client.map(|(c, k)| (c.to_owned(), k.to_owned())),
            }),
            client: tls_client,
            connection,
        }
    }

    /// A connection for a test's own commands (30 s per command: a large `XRANGE` on a
    /// machine busy with other tests outlasts the client's default).
    pub fn connection(&self) -> MultiplexedConnection {
        self.connection.clone()
    }

    /// `command`'s answer on the side's connection; panics naming the command if it fails.
    pub async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        command
            .query_async(&mut self.connection())
            .await
            .unwrap_or_else(|e| {
                let name = command.args_iter().next();
                let name = match name {
                    Some(redis::Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                    _ => "a command".to_owned(),
                };
                panic!("{name} on the test Redis: {e}")
            })
    }

    /// `CONFIG SET requirepass password`: from now on the server requires `password` of new
    /// connections (the side's own stays authenticated). For a private server only.
    pub async fn require_password(&self, password: &str) {
        let mut config_set = redis::cmd("CONFIG");
        config_set.arg("SET").arg("requirepass").arg(password);
        let () = self.query(&config_set).await;
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

    /// Every entry of `stream` (see [`Self::entries`]): `headers` = the entry's UTF-8 fields
    /// but the payload, `meta["entry_id"]` = the entry id.
    pub async fn read_stream(&self, stream: &str) -> Vec<Delivered> {
        let entries = self.entries(stream).await;
        let to_delivered = |entry: StreamEntry| {
            let payload = entry.field("payload").unwrap_or_default().to_vec();
            let headers: HashMap<String, String> = entry
                .fields
                .into_iter()
                .filter(|(k, _)| k != "payload")
                .filter_map(|(k, v)| Some((k, String::from_utf8(v).ok()?)))
                .collect();
            Delivered {
                event_id: headers
                    .get("event_id")
                    .and_then(|s| Uuid::parse_str(s).ok())
                    .unwrap_or_default(),
                aggregate_id: headers.get("aggregate_id").cloned().unwrap_or_default(),
                destination: stream.to_owned(),
                payload,
                headers,
                meta: HashMap::from([("entry_id".to_owned(), entry.id)]),
            }
        };
        entries.into_iter().map(to_delivered).collect()
    }

    /// Every entry of `stream` in stream order (XRANGE, 5,000 at a time), each with its fields
    /// in entry order and their raw bytes. Fails the test when XRANGE fails.
    pub async fn entries(&self, stream: &str) -> Vec<StreamEntry> {
        let mut connection = self.connection();
        let mut out: Vec<StreamEntry> = Vec::new();
        let mut cursor = "-".to_owned();
        loop {
            let reply: Value = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&cursor)
                .arg("+")
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut connection)
                .await
                .unwrap_or_else(|e| panic!("XRANGE {stream}: {e}"));
            let Value::Array(entries) = reply else {
                panic!("XRANGE {stream}: unexpected reply {reply:?}");
            };
            let full = entries.len() == 5000;
            out.extend(
                entries
                    .into_iter()
                    .map(|e| StreamEntry::from_reply(stream, e)),
            );
            match out.last() {
                Some(last) if full => cursor = format!("({}", last.id),
                _ => break,
            }
        }
        out
    }

    /// [`Self::entries`] once `stream` has at least `expected` of them, or when `timeout`
    /// passed (then what it has).
    pub async fn entries_when(
        &self,
        stream: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<StreamEntry> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let entries = self.entries(stream).await;
            if entries.len() >= expected || std::time::Instant::now() >= deadline {
                return entries;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// EXPIRE `key` in `seconds`: a test's keys go away a while after it, so the shared
    /// server does not fill up.
    pub async fn expire(&self, key: &str, seconds: u64) {
        let _: i64 = redis::cmd("EXPIRE")
            .arg(key)
            .arg(seconds)
            .query_async(&mut self.connection())
            .await
            .unwrap_or_else(|e| panic!("EXPIRE {key}: {e}"));
    }
}

/// Install ring as rustls' process-default crypto provider unless one is: the redis crate builds
/// its TLS configuration with the process default, and with both ring and aws-lc-rs compiled in
/// (every side on) rustls cannot pick one by itself.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread installing one first is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// One stream entry as XRANGE gives it: the id and the fields in entry order, raw bytes.
#[derive(Debug, Clone)]
pub struct StreamEntry {
    pub id: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

impl StreamEntry {
    /// The field `name`'s bytes.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The field `name` as text; fails the test when it is missing or not UTF-8.
    pub fn text(&self, name: &str) -> String {
        let bytes = self
            .field(name)
            .unwrap_or_else(|| panic!("entry {} has no field `{name}`", self.id));
        String::from_utf8(bytes.to_vec())
            .unwrap_or_else(|e| panic!("field `{name}` is not UTF-8: {e}"))
    }

    fn from_reply(stream: &str, entry: Value) -> Self {
        let Value::Array(mut parts) = entry else {
            panic!("XRANGE {stream}: entry is not an array: {entry:?}");
        };
        assert_eq!(parts.len(), 2, "XRANGE {stream}: entry is [id, fields]");
        let Some(Value::Array(flat)) = parts.pop() else {
            panic!("XRANGE {stream}: the fields are not an array");
        };
        let id = text_of(parts.pop().expect("an entry id"));
        let mut flat = flat.into_iter();
        let mut fields = Vec::new();
        while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
            fields.push((text_of(name), bytes_of(value)));
        }
        Self { id, fields }
    }
}

fn bytes_of(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        other => panic!("expected a string, got {other:?}"),
    }
}

fn text_of(value: Value) -> String {
    String::from_utf8(bytes_of(value)).expect("UTF-8")
}

#[async_trait]
impl BrokerSide for RedisSide {
    fn name(&self) -> String {
        "Redis Streams".to_owned()
    }

    /// `redis-server --version` of the machine.
    fn server_version(&self) -> String {
        first_line("redis-server", &["--version"])
    }

    fn sink_toml(&self) -> String {
        let mut toml = sink_tables(
            "redis-streams",
            Some(&self.prefix),
            &format!("url = \"{}\"\n", self.url),
        );
        // An inline table, so that lines a test adds (`Settings::sink`) stay in
        // `[sink.redis_streams]`.
        if let Some(tls) = &self.tls {
            let mut keys = format!("ca_file = \"{}\"", tls.ca.display());
            if let Some((cert, key)) = &tls.client {
                keys.push_str(&format!(
                    ", client_cert_file = \"{}\", client_key_file = \"{}\"",
                    cert.display(),
                    key.display()
                ));
            }
            toml.push_str(&format!("tls = {{ {keys} }}\n"));
        }
        toml
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

    /// XLEN of the streams (the relay appends once the event is published).
    async fn held(&self, _expected: u64, _timeout: Duration) -> u64 {
        let mut n = 0;
        for t in AGGREGATE_TYPES {
            n += self.stream_len(&self.destination(t)).await;
        }
        n
    }

    /// XREAD BLOCK on the streams after their newest entry at the call, on a connection of its
    /// own (XREAD BLOCK holds it) with the consumer's response timeout (a stall past redis-rs's
    /// 500 ms default would end the watch). Each XREAD names the last entry id seen, never `$`:
    /// `$` is re-read at every call, and an entry added between one XREAD's timeout and the next
    /// would be skipped.
    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        let mut connection = consumer_connection(&self.client)
            .await
            .unwrap_or_else(|e| panic!("Redis at {} is unreachable: {e}", self.url));
        let streams: Vec<String> = AGGREGATE_TYPES
            .iter()
            .map(|t| self.destination(t))
            .collect();
        let mut last = Vec::with_capacity(streams.len());
        for stream in &streams {
            let newest: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
                .arg(stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut connection)
                .await
                .unwrap_or_else(|e| panic!("XREVRANGE {stream} on Redis at {}: {e}", self.url));
            last.push(
                newest
                    .ids
                    .first()
                    .map_or("0-0".to_owned(), |e| e.id.clone()),
            );
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let reply: Result<Option<redis::streams::StreamReadReply>, _> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("BLOCK")
                    .arg(200)
                    .arg("STREAMS")
                    .arg(&streams)
                    .arg(&last)
                    .query_async(&mut connection)
                    .await;
                let Ok(reply) = reply else { return };
                let now = Instant::now();
                for key in reply.map(|r| r.keys).unwrap_or_default() {
                    let i = streams.iter().position(|s| *s == key.key).unwrap_or(0);
                    for entry in key.ids {
                        let id: String = entry.get("event_id").unwrap_or_default();
                        if let Ok(id) = Uuid::parse_str(&id) {
                            if tx.send((id, now)).is_err() {
                                return;
                            }
                        }
                        last[i] = entry.id;
                    }
                }
            }
        });
        rx
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

/// The sink conformance suite's consumer: XRANGE of the stream, waiting for `expected` entries;
/// the fields the Redis Streams sink writes (`headers` is a JSON object). Streams that got
/// entries expire ten minutes later.
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for RedisSide {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let entries = self.entries_when(to, expected, wait).await;
        if !entries.is_empty() {
            self.expire(to, 600).await;
        }
        let received = |entry: &StreamEntry| ReceivedMessage {
            event_id: Uuid::parse_str(&entry.text("event_id")).expect("event_id is a UUID"),
            aggregate_id: entry.text("aggregate_id"),
            event_type: entry.text("event_type"),
            payload: entry.field("payload").expect("payload field").to_vec(),
            headers: serde_json::from_str(&entry.text("headers"))
                .expect("headers field is a JSON object of strings"),
        };
        entries.iter().map(received).collect()
    }
}

/// The consumer's connection: the client's defaults but for the response timeout, 30 s rather
/// than redis-rs's default, which a 5,000-entry `XRANGE` can outlast on a loaded machine.
async fn consumer_connection(client: &redis::Client) -> redis::RedisResult<MultiplexedConnection> {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::unique;

    async fn add(side: &RedisSide, id: Uuid) {
        let () = redis::cmd("XADD")
            .arg(side.destination("order"))
            .arg("*")
            .arg("event_id")
            .arg(id.to_string())
            .query_async(&mut side.connection.clone())
            .await
            .unwrap();
    }

    /// An entry added between two of the watch's XREADs (the first timed out, the next not yet
    /// sent) is reported: the watch reads through a proxy that holds the timed-out answer
    /// while the entry is added. Entries from before the watch are not reported.
    #[tokio::test]
    async fn the_watch_reports_an_entry_added_between_two_of_its_reads() {
        let direct = RedisSide::open(&unique("watch")).await;
        let (proxy, through_proxy) = redis_behind_blackhole().await;
        let watched = RedisSide::open_at(&through_proxy, &direct.prefix).await;
        let before = Uuid::now_v7();
        add(&direct, before).await;
        let mut watch = watched.watch().await;

        proxy.partition();
        // The XREAD at the server times out (BLOCK 200); its empty answer waits in the proxy.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let between = Uuid::now_v7();
        add(&direct, between).await;
        proxy.heal();
        let after = Uuid::now_v7();
        add(&direct, after).await;

        let mut seen = Vec::new();
        while seen.len() < 2 {
            let (id, _) = tokio::time::timeout(Duration::from_secs(5), watch.recv())
                .await
                .unwrap_or_else(|_| panic!("the watch reported only {seen:?}"))
                .expect("the watch runs");
            seen.push(id);
        }
        assert_eq!(seen, [between, after], "before the watch: {before}");
        direct.cleanup().await;
    }

    /// A side opened over TLS watches over TLS too, with its CA and client certificate (a
    /// private server that requires one).
    #[tokio::test]
    async fn a_tls_side_watches_over_tls() {
        let name = unique("watch_tls");
        let pki = crate::tls::TestPki::create(&crate::util::scratch_dir(&name).join("pki"));
        let server = crate::PrivateRedis::start(&name, &pki, true);
        let side = server.side(&name).await;
        let mut watch = side.watch().await;
        let id = Uuid::now_v7();
        add(&side, id).await;
        let (seen, _) = tokio::time::timeout(Duration::from_secs(5), watch.recv())
            .await
            .unwrap_or_else(|_| panic!("the watch reported nothing; server log:\n{}", server.log()))
            .expect("the watch runs");
        assert_eq!(seen, id);
    }
}
