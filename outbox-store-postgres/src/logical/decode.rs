//! What the log carries, decoded: the outbox table's inserts (pgoutput `Relation` and `Insert`
//! messages, binary values) and the emit function's messages (our envelope).

use std::collections::HashMap;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use outboxkit_core::{Headers, OutboxEvent, PayloadType};
use outboxkit_store_sql::session::parse_headers;

/// Version of the message envelope written by the emit function.
pub(crate) const ENVELOPE_VERSION: u64 = 1;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A reader over a pgoutput message.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "message cut short: {n} bytes wanted, {} left",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn cstr(&mut self) -> Result<String, String> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or("string without its terminating zero")?;
        let text = String::from_utf8_lossy(&self.bytes[..end]).into_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(text)
    }
}

/// A table as a `Relation` message describes it: where it lives and its columns' names.
#[derive(Debug, Clone)]
pub(crate) struct Relation {
    pub schema: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// One column value of an `Insert`: `None` for SQL NULL; `text` tells the format.
#[derive(Debug, Clone, Copy)]
struct Value<'a> {
    bytes: &'a [u8],
    text: bool,
}

/// What one pgoutput message means to the relay.
#[derive(Debug)]
pub(crate) enum Change {
    /// A table's description (sent before its first change in each session).
    Relation(u32, Relation),
    /// A row inserted into the table with this relation id: each column's value by name.
    Insert(u32, Vec<(String, Option<Vec<u8>>, bool)>),
    /// Anything else (types, origins, updates, deletes, truncates).
    Other,
}

/// Decode one pgoutput message.
pub(crate) fn decode(data: &[u8], relations: &HashMap<u32, Relation>) -> Result<Change, String> {
    let mut r = Reader { bytes: data };
    match r.u8()? {
        b'R' => {
            let oid = r.u32()?;
            let schema = r.cstr()?;
            let name = r.cstr()?;
            let _replica_identity = r.u8()?;
            let n = r.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let _flags = r.u8()?;
                columns.push(r.cstr()?);
                let _type_oid = r.u32()?;
                let _type_modifier = r.i32()?;
            }
            Ok(Change::Relation(
                oid,
                Relation {
                    schema,
                    name,
                    columns,
                },
            ))
        }
        b'I' => {
            let oid = r.u32()?;
            if r.u8()? != b'N' {
                return Err("insert without its new tuple".to_owned());
            }
            let relation = relations
                .get(&oid)
                .ok_or_else(|| format!("insert into relation {oid} before its description"))?;
            let n = r.i16()?.max(0) as usize;
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                let name = relation.columns.get(i).cloned().unwrap_or_default();
                match r.u8()? {
                    b'n' | b'u' => values.push((name, None, false)),
                    kind @ (b't' | b'b') => {
                        let len = r.i32()?.max(0) as usize;
                        let bytes = r.take(len)?.to_vec();
                        values.push((name, Some(bytes), kind == b't'));
                    }
                    other => return Err(format!("unknown column kind {:?}", other as char)),
                }
            }
            Ok(Change::Insert(oid, values))
        }
        _ => Ok(Change::Other),
    }
}

fn text(v: Value<'_>, column: &str) -> Result<String, String> {
    String::from_utf8(v.bytes.to_vec()).map_err(|_| format!("column {column} is not UTF-8"))
}

/// A jsonb value's text (binary: a version byte, then the text).
fn jsonb_text(v: Value<'_>, column: &str) -> Result<String, String> {
    if v.text {
        return text(v, column);
    }
    match v.bytes.split_first() {
        Some((1, rest)) => {
            String::from_utf8(rest.to_vec()).map_err(|_| format!("column {column} is not UTF-8"))
        }
        _ => Err(format!("column {column}: unknown jsonb format")),
    }
}

fn int(v: Value<'_>, column: &str) -> Result<i64, String> {
    if v.text {
        return text(v, column)?
            .parse()
            .map_err(|e| format!("column {column}: {e}"));
    }
    match v.bytes.len() {
        8 => Ok(i64::from_be_bytes(v.bytes.try_into().expect("8 bytes"))),
        4 => Ok(i64::from(i32::from_be_bytes(
            v.bytes.try_into().expect("4 bytes"),
        ))),
        2 => Ok(i64::from(i16::from_be_bytes(
            v.bytes.try_into().expect("2 bytes"),
        ))),
        n => Err(format!("column {column}: an integer of {n} bytes")),
    }
}

fn uuid(v: Value<'_>, column: &str) -> Result<Uuid, String> {
    if v.text {
        return Uuid::parse_str(&text(v, column)?).map_err(|e| format!("column {column}: {e}"));
    }
    Uuid::from_slice(v.bytes).map_err(|e| format!("column {column}: {e}"))
}

fn timestamp(v: Value<'_>, column: &str) -> Result<DateTime<Utc>, String> {
    if v.text {
        let text = text(v, column)?;
        return DateTime::parse_from_str(&format!("{text}00"), "%Y-%m-%d %H:%M:%S%.f%z")
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| format!("column {column}: \"{text}\": {e}"));
    }
    let micros = int(v, column)?;
    Utc.timestamp_micros(micros.saturating_add(POSTGRES_EPOCH_MICROS))
        .single()
        .ok_or_else(|| format!("column {column}: timestamp out of range"))
}

fn bytea(v: Value<'_>, column: &str) -> Result<Vec<u8>, String> {
    if !v.text {
        return Ok(v.bytes.to_vec());
    }
    let text = text(v, column)?;
    let hex = text
        .strip_prefix("\\x")
        .ok_or_else(|| format!("column {column}: bytea not in hex format"))?;
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("column {column}: bad hex"))
}

/// The event of an inserted row of the outbox table (`shard` 0: the slot is one unit of
/// ownership).
pub(crate) fn event_of_row(
    values: &[(String, Option<Vec<u8>>, bool)],
    payload_type: PayloadType,
) -> Result<OutboxEvent, String> {
    let get = |name: &str| -> Option<Value<'_>> {
        values
            .iter()
            .find(|(n, _, _)| n == name)
            .and_then(|(_, v, text)| v.as_deref().map(|bytes| Value { bytes, text: *text }))
    };
    let need = |name: &str| get(name).ok_or_else(|| format!("column {name} is missing or null"));
    let payload = need("payload")?;
    Ok(OutboxEvent {
        id: int(need("id")?, "id")?,
        event_id: uuid(need("event_id")?, "event_id")?,
        aggregate_type: text(need("aggregate_type")?, "aggregate_type")?,
        aggregate_id: text(need("aggregate_id")?, "aggregate_id")?,
        event_type: text(need("event_type")?, "event_type")?,
        payload: match payload_type {
            PayloadType::Json => jsonb_text(payload, "payload")?.into_bytes(),
            PayloadType::Text => text(payload, "payload")?.into_bytes(),
            PayloadType::Binary => bytea(payload, "payload")?,
        },
        payload_type,
        headers: match get("headers") {
            Some(v) => parse_headers(&jsonb_text(v, "headers")?).map_err(|e| e.to_string())?,
            None => Headers::new(),
        },
        destination: get("destination")
            .map(|v| text(v, "destination"))
            .transpose()?,
        created_at: match get("created_at") {
            Some(v) => timestamp(v, "created_at")?,
            None => Utc::now(),
        },
        attempts: 0,
        shard: 0,
    })
}

/// The header of a message's envelope, as the emit function writes it.
#[derive(Debug, serde::Deserialize)]
struct Envelope {
    v: u64,
    event_id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    #[serde(default)]
    headers: Option<serde_json::Value>,
    #[serde(default)]
    destination: Option<String>,
    /// Microseconds since the Unix epoch, the database's clock.
    created_at: i64,
}

/// The event of an emit function's message: a JSON header line, then the payload's bytes.
/// `id` is the message's position in the log (unique; it orders nothing).
pub(crate) fn event_of_message(
    id: i64,
    content: &[u8],
    payload_type: PayloadType,
) -> Result<OutboxEvent, String> {
    let split = content
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no header line")?;
    let (header, payload) = (&content[..split], &content[split + 1..]);
    let envelope: Envelope = serde_json::from_slice(header).map_err(|e| format!("header: {e}"))?;
    if envelope.v != ENVELOPE_VERSION {
        return Err(format!(
            "envelope version {} (this relay reads {ENVELOPE_VERSION}): upgrade the relay",
            envelope.v
        ));
    }
    let headers = match envelope.headers {
        None | Some(serde_json::Value::Null) => Headers::new(),
        Some(value) => parse_headers(&value.to_string()).map_err(|e| e.to_string())?,
    };
    if payload_type != PayloadType::Binary && std::str::from_utf8(payload).is_err() {
        return Err(format!("a {payload_type} payload that is not UTF-8"));
    }
    Ok(OutboxEvent {
        id,
        event_id: envelope.event_id,
        aggregate_type: envelope.aggregate_type,
        aggregate_id: envelope.aggregate_id,
        event_type: envelope.event_type,
        payload: payload.to_vec(),
        payload_type,
        headers,
        destination: envelope.destination,
        created_at: Utc
            .timestamp_micros(envelope.created_at)
            .single()
            .unwrap_or_else(Utc::now),
        attempts: 0,
        shard: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16384u32.to_be_bytes());
        m.extend(b"app\0outbox\0");
        m.push(b'd');
        let columns: [&str; 4] = ["id", "event_id", "payload", "created_at"];
        m.extend((columns.len() as i16).to_be_bytes());
        for c in columns {
            m.push(0);
            m.extend(c.as_bytes());
            m.push(0);
            m.extend(0u32.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    #[test]
    fn inserts_are_read_by_column_name() {
        let mut relations = HashMap::new();
        let Change::Relation(oid, rel) = decode(&relation(), &relations).unwrap() else {
            panic!("a relation")
        };
        assert_eq!((rel.schema.as_str(), rel.name.as_str()), ("app", "outbox"));
        relations.insert(oid, rel);

        let id = Uuid::new_v4();
        let mut m = vec![b'I'];
        m.extend(16384u32.to_be_bytes());
        m.push(b'N');
        m.extend(4i16.to_be_bytes());
        m.push(b'b');
        m.extend(8i32.to_be_bytes());
        m.extend(42i64.to_be_bytes());
        m.push(b'b');
        m.extend(16i32.to_be_bytes());
        m.extend(id.as_bytes());
        m.push(b'b');
        m.extend(3i32.to_be_bytes());
        m.extend([0, 159, 1]);
        m.push(b'b');
        m.extend(8i32.to_be_bytes());
        m.extend(0i64.to_be_bytes());
        let Change::Insert(_, values) = decode(&m, &relations).unwrap() else {
            panic!("an insert")
        };
        // Missing columns are refused by name.
        let e = event_of_row(&values, PayloadType::Binary).unwrap_err();
        assert!(e.contains("aggregate_type"), "{e}");
        let mut values = values;
        for (name, v) in [
            ("aggregate_type", "order"),
            ("aggregate_id", "7"),
            ("event_type", "E"),
        ] {
            values.push((name.to_owned(), Some(v.as_bytes().to_vec()), false));
        }
        let event = event_of_row(&values, PayloadType::Binary).unwrap();
        assert_eq!(event.id, 42);
        assert_eq!(event.event_id, id);
        assert_eq!(event.payload, vec![0, 159, 1], "bytes as written");
        assert_eq!(event.created_at.timestamp(), 946_684_800);
        assert!(decode(&m[..10], &relations).is_err(), "cut short");
    }

    #[test]
    fn messages_carry_a_header_line_then_the_payload() {
        let id = Uuid::new_v4();
        let content = format!(
            "{{\"v\":1,\"event_id\":\"{id}\",\"aggregate_type\":\"order\",\"aggregate_id\":\"7\",\
             \"event_type\":\"E\",\"headers\":{{\"k\":\"v\"}},\"destination\":null,\
             \"created_at\":1700000000000000}}\n{{\"a\": 1}}\n"
        );
        let event = event_of_message(5, content.as_bytes(), PayloadType::Text).unwrap();
        assert_eq!(
            event.payload, b"{\"a\": 1}\n",
            "byte for byte, newlines included"
        );
        assert_eq!(event.headers.get("k").map(String::as_str), Some("v"));
        assert_eq!(event.created_at.timestamp(), 1_700_000_000);
        for bad in ["", "{}", "{\"v\":2}\nx", "not json\nx"] {
            assert!(
                event_of_message(1, bad.as_bytes(), PayloadType::Text).is_err(),
                "{bad}"
            );
        }
        let mut binary = content.into_bytes();
        binary.push(0xff);
        assert!(event_of_message(1, &binary, PayloadType::Text).is_err());
        assert!(event_of_message(1, &binary, PayloadType::Binary).is_ok());
    }
}
