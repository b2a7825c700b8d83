//! docs/CONFIGURATION.md cannot drift from the configuration types: every key of every section
//! compiled in has a row with its environment variable, and the defaults of the typed sections
//! match.

use std::collections::BTreeMap;

use outboxkit_relay::settings::{LogSettings, ServerSettings};
use outboxkit_store_postgres::PostgresStoreConfig;

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIGURATION.md");
    std::fs::read_to_string(path).expect("reading docs/CONFIGURATION.md")
}

/// Rows of the doc's tables: key → (default cell, environment variable cell).
fn rows() -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for line in doc().lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 6 || !cells[1].starts_with('`') {
            continue;
        }
        let key = cells[1].trim_matches('`').to_owned();
        out.insert(
            key,
            (
                cells[3].trim_matches('`').to_owned(),
                cells[4].trim_matches('`').to_owned(),
            ),
        );
    }
    out
}

/// The keys a `deny_unknown_fields` type accepts, read from the error it gives for a key it
/// does not know.
fn keys_of<T: serde::de::DeserializeOwned>() -> Vec<String> {
    let probe = serde_json::json!({ "__not_a_key__": 0 });
    let error = match serde_json::from_value::<T>(probe) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the type accepted an unknown key: it must deny unknown fields"),
    };
    let expected = error
        .split("expected one of ")
        .nth(1)
        .or_else(|| error.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("unexpected error shape: {error}"));
    expected
        .split(", ")
        .flat_map(|part| part.split(" or "))
        .map(|k| k.trim().trim_matches('`').to_owned())
        .filter(|k| !k.is_empty())
        .collect()
}

fn env_name(key: &str) -> String {
    format!("OUTBOX_{}", key.replace('.', "__").to_uppercase())
}

/// Every key of `keys` under `section` has a row with its environment variable.
fn check_rows(section: &str, keys: &[String], rows: &BTreeMap<String, (String, String)>) {
    for key in keys {
        let full = format!("{section}.{key}");
        let (_, env) = rows
            .get(&full)
            .unwrap_or_else(|| panic!("docs/CONFIGURATION.md has no row for `{full}`"));
        assert_eq!(env, &env_name(&full), "environment variable of `{full}`");
    }
}

/// The section `[section]` has exactly the keys `keys`: a row for each ([`check_rows`]), and
/// no row for another.
fn check_section(section: &str, keys: &[String], rows: &BTreeMap<String, (String, String)>) {
    assert!(!keys.is_empty(), "no keys found for [{section}]");
    check_rows(section, keys, rows);
    // No row for a key that does not exist.
    for documented in rows.keys().filter(|k| {
        k.strip_prefix(section)
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|r| !r.contains('.'))
    }) {
        let key = &documented[section.len() + 1..];
        assert!(
            keys.iter().any(|k| k == key),
            "docs/CONFIGURATION.md documents `{documented}`, which [{section}] does not have"
        );
    }
}

/// Defaults of a serializable section must be what the doc says.
fn check_defaults(
    section: &str,
    defaults: serde_json::Value,
    rows: &BTreeMap<String, (String, String)>,
) {
    for (key, value) in defaults.as_object().expect("a table") {
        let full = format!("{section}.{key}");
        let (doc_default, _) = &rows[&full];
        let expected = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        assert!(
            doc_default == &expected || doc_default.starts_with(&format!("{expected} ")),
            "default of `{full}`: the doc says `{doc_default}`, the code `{expected}`"
        );
    }
}

#[test]
fn every_key_is_documented_with_its_variable_and_default() {
    let rows = rows();
    // `[store]` is `kind` plus the store's own keys; both SQL stores have the same ones.
    let mut store_keys = keys_of::<PostgresStoreConfig>();
    #[cfg(feature = "store-mysql")]
    {
        let mut mysql = keys_of::<outboxkit_store_mysql::MySqlStoreConfig>();
        let mut postgres = store_keys.clone();
        mysql.sort();
        postgres.sort();
        assert_eq!(
            mysql, postgres,
            "the doc lists one set of [store] keys for both SQL stores"
        );
    }
    store_keys.push("kind".to_owned());
    // Each section's keys; the sinks' when their feature is compiled in.
    #[allow(unused_mut)]
    let mut sections = vec![
        ("store", store_keys),
        ("relay", keys_of::<outboxkit_core::RelayConfig>()),
        ("server", keys_of::<ServerSettings>()),
        ("log", keys_of::<LogSettings>()),
        ("sink", vec!["kind".to_owned(), "destination".to_owned()]),
        (
            "pipelines.<name>",
            keys_of::<outboxkit_relay::settings::PipelineSettings>(),
        ),
        (
            "store.logical",
            keys_of::<outboxkit_store_postgres::LogicalSettings>(),
        ),
    ];
    #[cfg(feature = "sink-rabbitmq")]
    sections.extend([
        (
            "sink.rabbitmq",
            keys_of::<outboxkit_sink_rabbitmq::RabbitMqConfig>(),
        ),
        (
            "sink.rabbitmq.tls",
            keys_of::<outboxkit_sink_rabbitmq::TlsConfig>(),
        ),
    ]);
    #[cfg(feature = "sink-sqs")]
    sections.push(("sink.sqs", keys_of::<outboxkit_sink_sqs::SqsConfig>()));
    #[cfg(feature = "sink-sns")]
    sections.push(("sink.sns", keys_of::<outboxkit_sink_sns::SnsConfig>()));
    #[cfg(feature = "sink-redis-streams")]
    sections.extend([
        (
            "sink.redis_streams",
            keys_of::<outboxkit_sink_redis_streams::RedisStreamsConfig>(),
        ),
        (
            "sink.redis_streams.tls",
            keys_of::<outboxkit_sink_redis_streams::TlsConfig>(),
        ),
    ]);
    for (section, keys) in &sections {
        check_section(section, keys, &rows);
    }
    // Any other key of `[sink.kafka]` is a librdkafka property: the sink's own keys are listed
    // by the crate, and only they have rows.
    #[cfg(feature = "sink-kafka")]
    {
        let mut keys: Vec<String> = outboxkit_sink_kafka::OWN_KEYS
            .iter()
            .map(|k| k.to_string())
            .collect();
        keys.push("bootstrap.servers".to_owned());
        check_rows("sink.kafka", &keys, &rows);
    }

    let mut store = serde_json::to_value(PostgresStoreConfig::new("postgres://x")).unwrap();
    store.as_object_mut().unwrap().remove("url");
    let logical = store.as_object_mut().unwrap().remove("logical").unwrap();
    for (section, defaults) in [
        (
            "relay",
            serde_json::to_value(outboxkit_core::RelayConfig::default()).unwrap(),
        ),
        (
            "server",
            serde_json::to_value(ServerSettings::default()).unwrap(),
        ),
        ("log", serde_json::to_value(LogSettings::default()).unwrap()),
        ("store", store),
        ("store.logical", logical),
    ] {
        check_defaults(section, defaults, &rows);
    }
}

/// The first TOML example after `heading` in the file `doc`, read, resolved into pipelines and
/// checked as `run` checks them before connecting.
fn pipelines_of_example(doc: &str, heading: &str) -> Vec<outboxkit_relay::pipeline::Pipeline> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let text = std::fs::read_to_string(format!("{path}/{doc}")).expect("reading the doc");
    let section = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("{doc} has no {heading}"));
    let example = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_else(|| panic!("no TOML example after {heading} in {doc}"));
    let file = std::env::temp_dir().join(format!(
        "outbox-relay-doc-example-{}-{}.toml",
        std::process::id(),
        doc.replace('/', "_")
    ));
    std::fs::write(&file, example).unwrap();
    let (settings, figment) = outboxkit_relay::settings::load(Some(&file)).unwrap();
    let pipelines = outboxkit_relay::pipeline::resolve(&settings, &figment, Some(&file)).unwrap();
    // Every store and sink section is valid as `run` checks it before connecting.
    let registry = outboxkit_relay::Registry::builtin();
    for pipeline in &pipelines {
        registry
            .check_config(outboxkit_relay::FactoryContext {
                pipeline,
                figment: &figment,
                file: Some(&file),
            })
            .unwrap_or_else(|e| panic!("{doc}: pipeline {}: {e}", pipeline.name));
    }
    std::fs::remove_file(&file).unwrap();
    pipelines
}

/// The log-based capture example of docs/CONFIGURATION.md is valid as written.
#[test]
fn the_log_capture_example_is_valid() {
    for (doc, heading) in [
        ("docs/CONFIGURATION.md", "### Log-based capture"),
        ("README.md", "### Choosing a capture mode"),
    ] {
        let pipelines = pipelines_of_example(doc, heading);
        assert_eq!(pipelines.len(), 1, "{doc}");
        assert_eq!(pipelines[0].store_kind, "postgres", "{doc}");
    }
}

/// The multi-pipeline examples of docs/CONFIGURATION.md and the README read as they say.
#[test]
fn the_pipelines_examples_read_as_documented() {
    let pipelines = pipelines_of_example("docs/CONFIGURATION.md", "## `[pipelines.<name>]`");
    let names: Vec<&str> = pipelines.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["billing", "orders", "stock"]);
    let [billing, orders, stock] = &pipelines[..] else {
        unreachable!()
    };
    assert_eq!(billing.relay.batch_size, 500);
    assert_eq!(orders.relay.batch_size, 2000);
    assert_eq!(billing.sink.kind, "redis-streams");
    assert_eq!(stock.sink.kind, "kafka");
    assert_eq!(stock.store_kind, "mysql");

    let pipelines = pipelines_of_example("README.md", "### Many outboxes in one relay");
    let names: Vec<&str> = pipelines.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["billing", "stock", "tenants"]);
    assert_eq!(pipelines[2].relay.batch_size, 200);
    assert_eq!(pipelines[0].sink.kind, "redis-streams");
    assert_eq!(pipelines[1].sink.kind, "kafka");
}
