//! Shared by the Redis integration tests: the test server's URL, an admin connection and a
//! raw stream reader.

#![allow(dead_code)]

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;

/// `OUTBOX_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A plain connection to the test server, for setting up and reading back. Panics (fails the
/// test) when Redis is unreachable.
pub async fn admin_connection() -> MultiplexedConnection {
    let url = redis_url();
    let client = redis::Client::open(url.as_str())
        .unwrap_or_else(|e| panic!("OUTBOX_TEST_REDIS_URL={url} is not a Redis URL: {e}"));
    match tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => panic!("Redis is unreachable at {url} (set OUTBOX_TEST_REDIS_URL): {e}"),
        Err(_) => panic!("Redis at {url} did not answer within 5s (set OUTBOX_TEST_REDIS_URL)"),
    }
}

/// A fresh name prefix for one test's keys.
pub fn unique_prefix() -> String {
    outboxkit_core::testkit::sink_suite::unique_prefix()
}

/// One stream entry with its fields in stream order.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    pub fn text(&self, name: &str) -> String {
        let bytes = self
            .field(name)
            .unwrap_or_else(|| panic!("entry {} has no field `{name}`", self.id));
        String::from_utf8(bytes.to_vec())
            .unwrap_or_else(|e| panic!("field `{name}` is not UTF-8: {e}"))
    }
}

/// `XRANGE stream - +`, every entry with its raw field bytes.
pub async fn xrange(connection: &mut MultiplexedConnection, stream: &str) -> Vec<Entry> {
    let reply: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(connection)
        .await
        .unwrap_or_else(|e| panic!("XRANGE {stream}: {e}"));
    let Value::Array(entries) = reply else {
        panic!("XRANGE {stream}: unexpected reply {reply:?}");
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(mut parts) = entry else {
                panic!("XRANGE {stream}: entry is not an array: {entry:?}");
            };
            assert_eq!(parts.len(), 2, "XRANGE {stream}: entry is [id, fields]");
            let fields = parts.pop().unwrap();
            let id = bytes(parts.pop().unwrap());
            let Value::Array(flat) = fields else {
                panic!("XRANGE {stream}: fields are not an array: {fields:?}");
            };
            let mut flat = flat.into_iter();
            let mut fields = Vec::new();
            while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                fields.push((String::from_utf8(bytes(name)).unwrap(), bytes(value)));
            }
            Entry {
                id: String::from_utf8(id).unwrap(),
                fields,
            }
        })
        .collect()
}

fn bytes(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// `XLEN stream`.
pub async fn xlen(connection: &mut MultiplexedConnection, stream: &str) -> u64 {
    redis::cmd("XLEN")
        .arg(stream)
        .query_async(connection)
        .await
        .unwrap_or_else(|e| panic!("XLEN {stream}: {e}"))
}

/// Let the test's keys expire a while after the test, so the shared server does not fill up.
pub async fn expire_soon(connection: &mut MultiplexedConnection, key: &str) {
    let _: i64 = redis::cmd("EXPIRE")
        .arg(key)
        .arg(600)
        .query_async(connection)
        .await
        .unwrap_or_else(|e| panic!("EXPIRE {key}: {e}"));
}
