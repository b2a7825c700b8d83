//! `outbox-relay config`: the configuration as the relay reads it (the `--config` file with the
//! `OUTBOX_` environment variables over it) printed as TOML, every value with where it was set
//! and every secret hidden.
//!
//! What it prints is what was set, not the defaults of the keys left out (those are in
//! docs/CONFIGURATION.md): a value given through the environment prints as the string the
//! variable holds, as the relay reads it. A value is hidden (`"***"`) when its key is one of
//! [`SECRET_KEYS`] or its name says it holds one (`password`, `secret`, `token`, `credential`,
//! `passphrase`, `private`, `api_key`), or when it holds a private key; a URL keeps everything but
//! its password. A `<secret>_file` key shows its path: the file is not read.

use std::fmt::Write as _;
use std::path::Path;

use figment::value::{Dict, Value};
use figment::Figment;
use outboxkit_core::redact::hide_password;

use crate::settings::{set_in, SetIn, SECRET_KEYS};

/// What a hidden value prints as.
const HIDDEN: &str = "***";

/// The top-level tables, in the order they are printed.
const TOP_LEVEL: &[&str] = &["store", "relay", "sink", "pipelines", "server", "log"];

/// Parts of a key's name that mark it as holding a secret, beside [`SECRET_KEYS`] (for the keys
/// of a third party's store or sink).
const SECRET_WORDS: &[&str] = &[
    "password",
    "secret",
    "token",
    "credential",
    "passphrase",
    "private",
    "api_key",
    "apikey",
];

/// The document: a header saying where the values come from, then the tables. With the name of
/// a `pipeline`, of the pipelines' tables only its own (and the shared `[relay]` and `[sink]`).
pub fn render(figment: &Figment, file: Option<&Path>, pipeline: Option<&str>) -> String {
    let mut root = figment
        .find_value("")
        .ok()
        .and_then(Value::into_dict)
        .unwrap_or_default();
    if let Some(name) = pipeline.filter(|name| *name != outboxkit_core::DEFAULT_PIPELINE) {
        // The top-level `[store]` is the pipeline `default`; `[relay]` and `[sink]` are shared.
        root.remove("store");
        if let Some(Value::Dict(_, pipelines)) = root.get_mut("pipelines") {
            pipelines.retain(|key, _| key == name);
        }
    }
    let mut out = String::new();
    let from = match file {
        Some(file) => format!(
            "{}, with the OUTBOX_ environment variables over it",
            file.display()
        ),
        None => "the OUTBOX_ environment variables (no --config file)".to_owned(),
    };
    let _ = writeln!(out, "# The configuration as the relay reads it: {from}.");
    let _ = writeln!(
        out,
        "# Keys not shown take their defaults (docs/CONFIGURATION.md); \"{HIDDEN}\" stands for a secret."
    );
    let writer = Writer { figment, file };
    writer.table(&mut out, &[], &root);
    out
}

struct Writer<'a> {
    figment: &'a Figment,
    file: Option<&'a Path>,
}

impl Writer<'_> {
    /// The table at `path` (the root when empty): its header, its values, then its sub-tables.
    fn table(&self, out: &mut String, path: &[&str], dict: &Dict) {
        let lines: Vec<(String, String)> = dict
            .iter()
            .filter(|(_, value)| !matches!(value, Value::Dict(..)))
            .map(|(key, value)| {
                let mut full = path.to_vec();
                full.push(key);
                let line = format!("{} = {}", toml_key(key), self.value(key, value));
                (line, self.origin(&full, value))
            })
            .collect();
        let mut subtables: Vec<(&String, &Dict)> = dict
            .iter()
            .filter_map(|(key, value)| match value {
                Value::Dict(_, inner) => Some((key, inner)),
                _ => None,
            })
            .collect();
        if path.is_empty() {
            // The top-level tables in the order of docs/CONFIGURATION.md.
            let rank = |key: &str| TOP_LEVEL.iter().position(|k| *k == key);
            subtables.sort_by_key(|(key, _)| rank(key).unwrap_or(TOP_LEVEL.len()));
        }
        // A table shows its header when it holds values, or nothing at all (`[sink.kafka]` left
        // empty still says the section is there).
        if !path.is_empty() && (!lines.is_empty() || subtables.is_empty()) {
            let header: Vec<String> = path.iter().map(|p| toml_key(p)).collect();
            let _ = writeln!(out, "\n[{}]", header.join("."));
        }
        let width = lines
            .iter()
            .map(|(line, _)| line.chars().count())
            .filter(|&n| n <= 48)
            .max()
            .unwrap_or(0);
        for (line, origin) in lines {
            let _ = writeln!(out, "{line:width$}  # {origin}");
        }
        for (key, inner) in subtables {
            let mut full = path.to_vec();
            full.push(key);
            self.table(out, &full, inner);
        }
    }

    /// Where the value at `path` was set: the file, or the environment variable.
    fn origin(&self, path: &[&str], value: &Value) -> String {
        let Some(md) = self.figment.get_metadata(value.tag()) else {
            return "set in code".to_owned();
        };
        match set_in(md, &path.join("."), self.file) {
            Some(SetIn::Variable(name) | SetIn::File(name)) => name,
            None => md.name.to_string(),
        }
    }

    /// `value` as TOML, hidden when `key` or the value says it is a secret.
    fn value(&self, key: &str, value: &Value) -> String {
        match value {
            Value::String(_, text) if is_secret(key, text) => toml_string(HIDDEN),
            Value::String(_, text) => toml_string(&hide_password(text)),
            Value::Char(_, c) => toml_string(&c.to_string()),
            Value::Bool(_, b) => b.to_string(),
            Value::Num(_, num) => match num.to_f64() {
                Some(f) if f.is_nan() => "nan".to_owned(),
                Some(f) if f.is_infinite() => if f > 0.0 { "inf" } else { "-inf" }.to_owned(),
                Some(f) => format!("{f:?}"),
                None => num
                    .to_i128()
                    .map(|i| i.to_string())
                    .or_else(|| num.to_u128().map(|u| u.to_string()))
                    .unwrap_or_default(),
            },
            Value::Empty(..) => toml_string(""),
            Value::Array(_, items) => {
                let items: Vec<String> = items.iter().map(|v| self.value(key, v)).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Dict(_, dict) => {
                let pairs: Vec<String> = dict
                    .iter()
                    .map(|(k, v)| format!("{} = {}", toml_key(k), self.value(k, v)))
                    .collect();
                format!("{{ {} }}", pairs.join(", "))
            }
        }
    }
}

/// Whether the value of `key` holds a secret, by the key's name (not a `<name>_file` key, which
/// holds the path of a file) or by the value's text (a private key).
fn is_secret(key: &str, text: &str) -> bool {
    let name = key.to_ascii_lowercase();
    let named = !name.ends_with("_file")
        && (SECRET_KEYS.contains(&name.as_str())
            || SECRET_WORDS.iter().any(|word| name.contains(word)));
    named || text.contains("PRIVATE KEY")
}

/// A key as TOML writes it: bare when it can be, quoted otherwise (`"linger.ms"`).
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        toml_string(key)
    }
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
#[cfg(test)]
mod tests {
    use figment::providers::{Format, Toml};

    use super::*;

    /// [`render`] of `toml` as `relay.toml` with `env` set, of one `pipeline` or all.
    fn rendered(toml: &str, env: &[(&str, &str)], pipeline: Option<&str>) -> String {
        let mut out = String::new();
        figment::Jail::expect_with(|jail| {
            jail.create_file("relay.toml", toml)?;
            for (key, value) in env {
                jail.set_env(key, value);
            }
            let file = Path::new("relay.toml");
            out = render(&crate::settings::figment(Some(file)), Some(file), pipeline);
            Ok(())
        });
        out
    }

    fn assert_holds(out: &str, pieces: &[&str]) {
        for piece in pieces {
            assert!(out.contains(piece), "no `{piece}` in:\n{out}");
        }
    }

    #[test]
    fn every_value_says_where_it_was_set_and_reads_back_as_toml() {
        let out = rendered(
            "[relay]\nbatch_size = 100\npoll_interval_min = \"50ms\"\n\n\
             [store]\nkind = \"postgres\"\nurl = \"postgres://app@db/app\"\ntable = \"outbox\"\n\n\
             [sink]\nkind = \"kafka\"\n\n[sink.kafka]\n\"linger.ms\" = \"5\"\n",
            &[("OUTBOX_RELAY__BATCH_SIZE", "200")],
            None,
        );
        assert_holds(
            &out,
            &[
                "batch_size = \"200\"          # OUTBOX_RELAY__BATCH_SIZE\n",
                "poll_interval_min = \"50ms\"  # relay.toml\n",
                "\n[sink.kafka]\n\"linger.ms\" = \"5\"",
                "url = \"postgres://app@db/app\"",
            ],
        );
        // Read back, it is the configuration the relay read.
        let back: Dict = Figment::from(Toml::string(&out)).extract().unwrap();
        let value = |key: &str| Value::from(back.clone()).find(key).unwrap();
        assert_eq!(value("relay.batch_size").as_str(), Some("200"));
        assert_eq!(value("relay.poll_interval_min").as_str(), Some("50ms"));
        assert_eq!(value("store.table").as_str(), Some("outbox"));
        assert_eq!(
            back["sink"].as_dict().unwrap()["kafka"].as_dict().unwrap()["linger.ms"].as_str(),
            Some("5")
        );
    }

    #[test]
    fn secrets_are_hidden_by_key_by_name_and_in_urls() {
        let out = rendered(
            "[store]\nkind = \"postgres\"\nurl = \"postgres://app:s3cr3t@db/app?password=s3cr3t\"\n\
             password = \"s3cr3t\"\n\n[sink]\nkind = \"kafka\"\n\n[sink.kafka]\n\
             \"sasl.password\" = \"s3cr3t\"\n\"ssl.key.pem\" = \"-----BEGIN PRIVATE KEY-----s3cr3t\"\n\
             \"bootstrap.servers\" = \"user:s3cr3t@broker:9092\"\n\n[sink.custom]\n\
             api_key = \"s3cr3t\"\nauth_token = \"s3cr3t\"\npassword_file = \"/run/secrets/pw\"\n\
             urls = [\"amqp://u:s3cr3t@mq\", \"amqp://mq\"]\n",
            &[("OUTBOX_SINK__NATS__TOKEN", "s3cr3t")],
            None,
        );
        assert!(!out.contains("s3cr3t"), "{out}");
        assert_holds(
            &out,
            &[
                "url = \"postgres://app:***@db/app?password=***\"",
                "password = \"***\"",
                "\"ssl.key.pem\" = \"***\"",
                "\"bootstrap.servers\" = \"***@broker:9092\"",
                "api_key = \"***\"",
                "auth_token = \"***\"",
                "token = \"***\"  # OUTBOX_SINK__NATS__TOKEN",
                "password_file = \"/run/secrets/pw\"",
                "urls = [\"amqp://u:***@mq\", \"amqp://mq\"]",
            ],
        );
    }

    #[test]
    fn one_pipeline_of_several() {
        let toml = "[store]\nkind = \"postgres\"\nurl = \"postgres://db/app\"\n\n\
                    [sink]\nkind = \"redis-streams\"\n\n\
                    [pipelines.billing.store]\nkind = \"postgres\"\nurl = \"postgres://db/billing\"\n\n\
                    [pipelines.orders.store]\nkind = \"postgres\"\nurl = \"postgres://db/orders\"\n";
        let out = rendered(toml, &[], Some("billing"));
        assert!(out.contains("[pipelines.billing.store]"), "{out}");
        assert!(!out.contains("orders"), "{out}");
        assert!(!out.contains("[store]"), "{out}");
        assert!(out.contains("[sink]\nkind = \"redis-streams\""), "{out}");
    }

    /// A value as `config` shows it, secrets aside.
    fn shown(raw: &str) -> String {
        hide_password(raw).into_owned()
    }

    #[test]
    fn strings_and_keys_are_escaped() {
        type Render = fn(&str) -> String;
        let cases: [(Render, &str, &str); 5] = [
            (
                toml_string,
                "a\"b\\c\nd\u{7f}",
                "\"a\\\"b\\\\c\\nd\\u007F\"",
            ),
            (toml_key, "linger.ms", "\"linger.ms\""),
            (toml_key, "batch_size", "batch_size"),
            (shown, "http://localhost:4566", "http://localhost:4566"),
            (shown, "{aggregate_type}", "{aggregate_type}"),
        ];
        for (render, input, expected) in cases {
            assert_eq!(render(input), expected, "{input}");
        }
    }
}
