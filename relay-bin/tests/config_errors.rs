//! Bad configuration never panics: the real binary prints one line `error: ...` naming the key
//! (or the host it could not reach) and exits with 2 (configuration) or 1 (unreachable service).
//!
//! The cases that reach a service need the local PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); they fail, never skip, when it is down.

#![cfg(all(feature = "store-postgres", feature = "sink-redis-streams"))]

use std::process::{Command, Stdio};

use crate::binary::{relay, with_config, Outcome, TempConfig, BIN};

const PASSWORD: &str = "s3cr3t-pw";

fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `tables` (a store or the pipelines' stores), then the `[sink]` (Redis Streams) and the
/// `[server]` (any free port) every configuration of these tests has.
fn with_sink_and_server(tables: &str) -> String {
    format!("{tables}\n[sink]\nkind = \"redis-streams\"\n\n[server]\nlisten = \"127.0.0.1:0\"\n")
}

/// The table `[key]` (`store`, `pipelines.<name>.store`) of a PostgreSQL store on the test
/// server, with `lines` after its URL.
fn postgres_store(key: &str, lines: &str) -> String {
    format!(
        "[{key}]\nkind = \"postgres\"\nurl = \"{}\"\n{lines}",
        postgres_url()
    )
}

/// A valid configuration, apart from what a test appends (TOML allows reopening no table, so
/// tests append whole tables or write their own file).
fn valid() -> String {
    with_sink_and_server(&postgres_store("store", ""))
}

/// [`valid`] with a `[relay]` table holding `lines`.
fn with_relay(lines: &str) -> String {
    format!("{}\n[relay]\n{lines}\n", valid())
}

/// [`valid`] with a store URL where nothing listens: for errors found before connecting, and for
/// the unreachable store.
fn unreachable_store() -> String {
    valid().replace(&postgres_url(), "postgres://postgres@127.0.0.1:1/test")
}

/// Check the failure's shape: exit `code`, stderr exactly one line `error: ...`, no panic;
/// returns that line.
fn error_line(out: &Outcome, code: i32) -> String {
    let stderr = &out.stderr;
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    assert_eq!(out.code, Some(code), "exit code; stderr:\n{stderr}");
    let line = stderr.strip_suffix('\n').unwrap_or(stderr);
    assert!(!line.contains('\n'), "stderr must be one line:\n{stderr}");
    assert!(line.starts_with("error: "), "stderr: {stderr}");
    line.to_owned()
}

/// A configuration error (exit 2) whose line contains every piece of `expected`.
fn config_error(
    config: &TempConfig,
    command: &str,
    env: &[(&str, &str)],
    expected: &[&str],
) -> String {
    let line = error_line(&with_config(config, command, env), 2);
    for piece in expected {
        assert!(line.contains(piece), "expected `{piece}` in: {line}");
    }
    line
}

/// [`config_error`] of `command` run with no environment on a new file holding `contents`;
/// returns the file (for its name) and the line.
fn file_error(contents: &str, command: &str, expected: &[&str]) -> (TempConfig, String) {
    let config = TempConfig::new(contents);
    let line = config_error(&config, command, &[], expected);
    (config, line)
}

#[test]
fn unknown_top_level_key() {
    let (config, line) = file_error(
        &format!("bogus = 1\n{}", valid()),
        "run",
        &[
            "bogus: unknown key",
            "(expected one of: store, relay, sink, pipelines, server, log)",
        ],
    );
    assert!(
        line.starts_with("error: invalid configuration: bogus: "),
        "{line}"
    );
    assert!(line.ends_with(&config.named()), "{line}");
}

#[test]
fn unknown_key_in_relay() {
    let (config, line) = file_error(
        &with_relay("batch_sise = 100"),
        "run",
        &["relay.batch_sise: unknown key", "batch_size"],
    );
    assert!(
        line.starts_with("error: invalid configuration: relay.batch_sise: unknown key (expected one of: batch_size, "),
        "{line}"
    );
    assert!(line.ends_with(&config.named()), "{line}");
    assert!(
        !line.contains("default."),
        "no profile name in the key: {line}"
    );
}

#[test]
fn unknown_key_in_store() {
    let config = TempConfig::new(&valid().replace("[sink]", "tabel = \"events\"\n\n[sink]"));
    config_error(
        &config,
        "status",
        &[],
        &["store.tabel: unknown key", "table", &config.display()],
    );
}

#[test]
fn wrong_type() {
    file_error(
        &with_relay("batch_size = \"many\""),
        "run",
        &["relay.batch_size: expected usize, found string \"many\""],
    );
}

/// A log level tracing would take for a target name (`warning`) is refused, where it was set:
/// accepted, it silenced every line of the relay's, errors included.
#[test]
fn log_level_that_is_no_level() {
    let expected = "`warning` is not a level (error, warn, info, debug, trace or off)";
    let (config, line) = file_error(
        &format!("{}\n[log]\nlevel = \"warning\"\n", valid()),
        "run",
        &[&format!("log.level: {expected}")],
    );
    assert!(line.ends_with(&config.named()), "{line}");
    let config = TempConfig::new(&valid());
    config_error(
        &config,
        "status",
        &[("OUTBOX_LOG__LEVEL", "warning")],
        &[
            &format!("log.level: {expected}"),
            "(from environment variable OUTBOX_LOG__LEVEL)",
        ],
    );
    config_error(
        &config,
        "migrate",
        &[("RUST_LOG", "info,warning")],
        &[&format!("RUST_LOG: {expected}")],
    );
}

#[test]
fn missing_store_url() {
    file_error(
        "[store]\nkind = \"postgres\"\n\n[sink]\nkind = \"redis-streams\"\n",
        "status",
        &["store.url: missing required key", "OUTBOX_STORE__URL"],
    );
}

#[test]
fn empty_store_url() {
    let (config, line) = file_error(
        "[store]\nkind = \"postgres\"\nurl = \"\"\n\n[sink]\nkind = \"redis-streams\"\n",
        "run",
        &["store.url: must not be empty"],
    );
    assert!(line.ends_with(&config.named()), "{line}");
}

#[test]
fn missing_store_table() {
    let config = TempConfig::new("[sink]\nkind = \"redis-streams\"\n");
    config_error(
        &config,
        "run",
        &[],
        &["store: missing required table [store]", &config.display()],
    );
}

#[test]
fn missing_sink_kind() {
    file_error(
        &valid().replace(
            "kind = \"redis-streams\"",
            "destination = \"{aggregate_type}\"",
        ),
        "run",
        &["sink.kind: missing required key"],
    );
}

#[test]
fn invalid_duration() {
    file_error(
        &with_relay("backoff_initial = \"soon\""),
        "run",
        &["relay.backoff_initial: expected a duration such as \"500ms\", \"30s\", \"5m\" or \"7d\", found string \"soon\""],
    );
}

#[test]
fn invalid_retention() {
    let (_, line) = file_error(
        &with_relay("retention = \"forever\""),
        "run",
        &[
            "relay.retention: expected \"delete\" or a duration",
            "\"forever\"",
        ],
    );
    assert!(
        !line.contains("retention: retention"),
        "the key is named once: {line}"
    );
}

#[test]
fn unknown_sink_kind_lists_known_kinds() {
    file_error(
        &valid().replace("redis-streams", "carrier-pigeon"),
        "run",
        &[
            "sink.kind = \"carrier-pigeon\" is not a known kind of outbox-relay",
            "(known: ",
            "redis-streams",
            "): a kind of your own runs in your own binary, which registers it with \
             `registry.sink::<…>()`",
        ],
    );
}

/// Only meaningful in a binary built without some shipped adapters (e.g.
/// `--no-default-features --features store-postgres,sink-redis-streams`); the registry's own
/// unit tests cover the message whatever the features.
#[test]
#[cfg(not(all(feature = "sink-kafka", feature = "store-mysql")))]
fn shipped_kind_not_compiled_in_names_the_feature() {
    #[cfg(not(feature = "sink-kafka"))]
    {
        file_error(
            &valid().replace("redis-streams", "kafka"),
            "run",
            &["sink.kind = \"kafka\"", "--features sink-kafka"],
        );
    }
    #[cfg(not(feature = "store-mysql"))]
    {
        file_error(
            &valid().replace("kind = \"postgres\"", "kind = \"mysql\""),
            "status",
            &["store.kind = \"mysql\"", "--features store-mysql"],
        );
    }
}

#[test]
fn unknown_sink_sub_table() {
    file_error(
        &format!(
            "{}\n[sink.redis]\nurl = \"redis://127.0.0.1:6379\"\n",
            valid()
        ),
        "run",
        &["sink.redis: unknown key", "redis_streams"],
    );
}

#[test]
fn cloudevents_keys_flow_from_the_file_and_the_environment() {
    // Checked before connecting: the store is unreachable here and is never tried.
    let section =
        "[sink.redis_streams]\nformat = \"cloudevents\"\ncloudevents_source = \"/orders here\"";
    file_error(
        &format!("{}\n{section}\n", unreachable_store()),
        "run",
        &["sink.redis_streams.cloudevents_source = `/orders here` does not render to a URI-reference"],
    );
    let config = TempConfig::new(&unreachable_store());
    config_error(
        &config,
        "run",
        &[
            ("OUTBOX_SINK__REDIS_STREAMS__FORMAT", "cloudevents"),
            ("OUTBOX_SINK__REDIS_STREAMS__CLOUDEVENTS_SOURCE", "a%2"),
        ],
        &[
            "sink.redis_streams.cloudevents_source = `a%2`",
            "not followed by two hex digits",
        ],
    );
    config_error(
        &config,
        "run",
        &[("OUTBOX_SINK__REDIS_STREAMS__FORMAT", "xml")],
        &["sink.redis_streams.format", "raw", "cloudevents"],
    );
}

#[test]
fn unknown_key_in_sink_section() {
    // Reported before connecting: the store is unreachable here and is never tried.
    let (config, line) = file_error(
        &format!(
            "{}\n[sink.redis_streams]\nulr = \"redis://127.0.0.1:6379\"\n",
            unreachable_store()
        ),
        "run",
        &[
            "sink.redis_streams.ulr: unknown key",
            "url, password, stream",
        ],
    );
    assert!(line.ends_with(&config.named()), "{line}");
}

#[test]
fn a_destination_the_sink_refuses_is_named_as_sink_destination() {
    // Checked before connecting: the store is unreachable here and is never tried. The sink
    // checks its template under its own key (`sink.nats.subject`), which these files never set.
    let nats = unreachable_store().replace("kind = \"redis-streams\"", "kind = \"nats\"");
    let (config, line) = file_error(
        &nats.replace(
            "[sink]\n",
            "[sink]\ndestination = \"a..{aggregate_type}\"\n",
        ),
        "run",
        &["sink.destination: `a..{aggregate_type}` has an empty token"],
    );
    assert!(line.ends_with(&config.named()), "{line}");
    let config = TempConfig::new(&nats);
    config_error(
        &config,
        "run",
        &[("OUTBOX_SINK__DESTINATION", "orders.>")],
        &[
            "sink.destination: `orders.>` holds the wildcard `>`",
            "(from environment variable OUTBOX_SINK__DESTINATION)",
        ],
    );
    // The sink's own key, when that is what is refused.
    config_error(
        &config,
        "run",
        &[("OUTBOX_SINK__NATS__SUBJECT", "a..b")],
        &[
            "sink.nats.subject: `a..b`",
            "(from environment variable OUTBOX_SINK__NATS__SUBJECT)",
        ],
    );
    file_error(
        &format!(
            "{}\n[pipelines.orders.sink]\nkind = \"nats\"\ndestination = \"{{aggregate_type}} x\"\n",
            two_pipelines("b.outbox").replace(&postgres_url(), "postgres://postgres@127.0.0.1:1/test")
        ),
        "run",
        &["pipelines.orders.sink.destination: `{aggregate_type} x` holds whitespace", "(in "],
    );
}

#[test]
fn config_file_that_does_not_exist() {
    let path = std::env::temp_dir().join(format!(
        "outbox-relay-no-such-file-{}.toml",
        std::process::id()
    ));
    let path = path.to_str().expect("UTF-8 path");
    let line = error_line(&relay(&["--config", path, "run"], &[]), 2);
    assert!(
        line.contains(&format!("configuration file {path} does not exist")),
        "{line}"
    );
}

#[test]
fn toml_syntax_error_names_the_file() {
    let config = TempConfig::new(&format!(
        "[store\nkind = \"postgres\"\nurl = \"postgres://postgres:{PASSWORD}@127.0.0.1:1/test\n"
    ));
    let line = config_error(
        &config,
        "run",
        &[],
        &["TOML syntax error at line 1", &config.display()],
    );
    assert!(!line.contains(PASSWORD), "{line}");
}

#[test]
fn environment_overrides_the_file() {
    let config = TempConfig::new(&with_relay("batch_size = 10"));
    let line = config_error(
        &config,
        "status",
        &[("OUTBOX_RELAY__BATCH_SIZE", "0")],
        &["relay.batch_size: must be between 1 and 100000, got 0"],
    );
    assert!(
        line.ends_with("(from environment variable OUTBOX_RELAY__BATCH_SIZE)"),
        "{line}"
    );

    config_error(
        &config,
        "run",
        &[("OUTBOX_SINK__REDIS_STREAMS__MAXLEN", "lots")],
        &[
            "sink.redis_streams.maxlen: expected u64, found string \"lots\"",
            "OUTBOX_SINK__REDIS_STREAMS__MAXLEN",
        ],
    );
    // A numeric-looking value of a string key stays a string; the store names the key.
    config_error(
        &config,
        "status",
        &[("OUTBOX_STORE__TABLE", "123")],
        &[
            "store.table: \"123\" is not a valid table name",
            "OUTBOX_STORE__TABLE",
        ],
    );
}

/// An unknown key names the one meant when it is close: a variable that nests with one `_`
/// where `__` separates keys, a misspelled key or value, a sink table or kind spelled another
/// way.
#[test]
fn an_unknown_key_or_kind_names_the_one_meant() {
    let config = TempConfig::new(&valid());
    config_error(
        &config,
        "check",
        &[("OUTBOX_STORE_URL", "postgres://db/app")],
        &[
            "store_url: unknown key (expected one of: ",
            "): did you mean `store.url`? (environment variables separate keys with `__`: \
             OUTBOX_STORE__URL) (from environment variable OUTBOX_STORE_URL)",
        ],
    );
    config_error(
        &config,
        "check",
        &[("OUTBOX_RELAY__BATCH_SIZ", "10")],
        &[
            "relay.batch_siz: unknown key (expected one of: batch_size, ",
            "did you mean `batch_size`?",
        ],
    );
    config_error(
        &config,
        "check",
        &[("OUTBOX_SINK__REDIS_STREAMS__FORMAT", "cloudevent")],
        &[
            "sink.redis_streams.format: unknown value `cloudevent` (expected one of: raw, \
           cloudevents): did you mean `cloudevents`?",
        ],
    );
    let hyphen = TempConfig::new(&format!("{}\n[sink.redis-streams]\nmaxlen = 10\n", valid()));
    config_error(
        &hyphen,
        "check",
        &[],
        &[
            "sink.redis-streams: unknown key (expected one of: ",
            "did you mean `redis_streams`?",
        ],
    );
    let short = TempConfig::new(&valid().replace("\"redis-streams\"", "\"redis\""));
    config_error(
        &short,
        "check",
        &[],
        &[
            "sink.kind = \"redis\" is not a known kind",
            "did you mean \"redis-streams\"?",
        ],
    );
}

#[test]
fn unreachable_database() {
    let config = TempConfig::new(&unreachable_store());
    for command in ["status", "run"] {
        let line = error_line(&with_config(&config, command, &[]), 1);
        assert!(line.contains("127.0.0.1:1"), "{command}: {line}");
        assert!(line.contains("PostgreSQL"), "{command}: {line}");
    }
}

#[test]
fn unreachable_redis() {
    let config = TempConfig::new(&format!(
        "{}\n[sink.redis_streams]\nurl = \"redis://127.0.0.1:1\"\n",
        valid()
    ));
    let line = error_line(&with_config(&config, "run", &[]), 1);
    assert!(
        !line.contains("PostgreSQL"),
        "PostgreSQL must be reachable at {} (set OUTBOX_TEST_POSTGRES_URL): {line}",
        postgres_url()
    );
    assert!(
        line.contains("Redis") && line.contains("127.0.0.1:1"),
        "{line}"
    );
}

#[test]
fn passwords_never_appear() {
    let store_url = format!("postgres://relay:{PASSWORD}@127.0.0.1:1/test");
    let redis_url = format!("redis://:{PASSWORD}@127.0.0.1:1");
    let check = |out: &Outcome, what: &str| {
        assert!(!out.stderr.contains("panicked"), "{what}:\n{}", out.stderr);
        assert!(
            !out.stderr.contains(PASSWORD) && !out.stdout.contains(PASSWORD),
            "{what}: the password leaked:\n{}{}",
            out.stdout,
            out.stderr
        );
    };

    // In the file, then in the environment; with every log on.
    let config = TempConfig::new(&valid().replace(&postgres_url(), &store_url));
    for command in ["status", "run"] {
        let out = with_config(&config, command, &[("RUST_LOG", "trace")]);
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        check(&out, command);
        let out = with_config(&config, command, &[]);
        assert!(
            error_line(&out, 1).contains("127.0.0.1:1"),
            "{}",
            out.stderr
        );
    }
    let config = TempConfig::new(&valid());
    let out = with_config(
        &config,
        "run",
        &[("OUTBOX_STORE__URL", &store_url), ("RUST_LOG", "trace")],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    check(&out, "OUTBOX_STORE__URL");

    // A Redis password (the store is reachable, Redis is not).
    let out = with_config(
        &config,
        "run",
        &[
            ("OUTBOX_SINK__REDIS_STREAMS__URL", &redis_url),
            ("RUST_LOG", "trace"),
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    check(&out, "OUTBOX_SINK__REDIS_STREAMS__URL");

    // Invalid URLs are named without their password.
    let config = TempConfig::new(
        &valid().replace(&postgres_url(), &format!("mysql://relay:{PASSWORD}@db/app")),
    );
    let out = with_config(&config, "status", &[]);
    assert!(error_line(&out, 2).contains("store.url"), "{}", out.stderr);
    check(&out, "invalid store.url");
    let out = with_config(
        &TempConfig::new(&valid()),
        "run",
        &[(
            "OUTBOX_SINK__REDIS_STREAMS__URL",
            &format!("http://u:{PASSWORD}@cache"),
        )],
    );
    assert!(
        error_line(&out, 2).contains("sink.redis_streams.url"),
        "{}",
        out.stderr
    );
    check(&out, "invalid sink.redis_streams.url");
}

/// A password with `@`, `:` or `/` written into a URL as it is makes the URL unparsable
/// ("invalid port number"): the error says to percent-encode, and shows no password.
#[test]
fn an_unencoded_password_in_a_url_is_explained() {
    let config = TempConfig::new(&valid());
    for (var, url, key) in [
        (
            "OUTBOX_STORE__URL",
            "postgres://app:p@ss:w/rd@127.0.0.1:5432/test",
            "store.url",
        ),
        (
            "OUTBOX_SINK__REDIS_STREAMS__URL",
            "redis://relay:p@ss:w/rd@127.0.0.1:6379",
            "sink.redis_streams.url",
        ),
    ] {
        let line = config_error(
            &config,
            "run",
            &[(var, url)],
            &[
                &format!("{key}: "),
                "must be percent-encoded (`@` as `%40`",
                &format!("(from environment variable {var})"),
            ],
        );
        assert!(!line.contains("w/rd"), "{line}");
    }
}

/// sqlx ignores a URL option it does not know (with a warning, or silently for MySQL): a
/// misspelt `sslmode` connected without the TLS it asked for. The relay refuses it, before
/// connecting, naming the option it is closest to; and an option's bad value is not blamed
/// on percent-encoding.
#[test]
fn a_misspelt_url_option_is_refused_not_ignored() {
    let config = TempConfig::new(&unreachable_store());
    let at = |query: &str| format!("postgres://postgres@127.0.0.1:1/test?{query}");
    config_error(
        &config,
        "run",
        &[("OUTBOX_STORE__URL", &at("sslmod=require"))],
        &[
            "store.url: unknown option `sslmod`: did you mean `sslmode`?",
            "(from environment variable OUTBOX_STORE__URL)",
        ],
    );
    let line = config_error(
        &config,
        "status",
        &[("OUTBOX_STORE__URL", &at("sslmode=verify-fulll"))],
        &[
            "store.url: sslmode=verify-fulll is not a TLS mode PostgreSQL knows (one of disable, \
             allow, prefer, require, verify-ca, verify-full): did you mean sslmode=verify-full?",
        ],
    );
    assert!(!line.contains("percent-encoded"), "{line}");
}

/// `server.listen` takes an IP address: a host name or a bare port is refused before anything
/// connects, with what to write instead.
#[test]
fn a_listen_address_that_is_no_ip_address_says_what_to_write() {
    let config = TempConfig::new(&unreachable_store());
    for listen in ["localhost:9464", ":9464", "9464"] {
        config_error(
            &config,
            "run",
            &[("OUTBOX_SERVER__LISTEN", listen)],
            &[
                &format!("server.listen: \"{listen}\" is not an IP address and port like 127.0.0.1:9464: write 127.0.0.1:9464 for this host only, or 0.0.0.0:9464 for every interface"),
                "(from environment variable OUTBOX_SERVER__LISTEN)",
            ],
        );
    }
    let line = config_error(
        &config,
        "run",
        &[("OUTBOX_SERVER__LISTEN", "metrics")],
        &["server.listen: \"metrics\" is not an IP address and port like 127.0.0.1:9464"],
    );
    assert!(!line.contains("write"), "{line}");
}

#[test]
fn version_names_the_adapters_compiled_in() {
    let out = relay(&["--version"], &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let version = out.stdout.trim();
    assert!(version.starts_with("outbox-relay "), "{version}");
    assert!(
        version.contains("stores: ") && version.contains("postgres"),
        "{version}"
    );
    assert!(
        version.contains("sinks: ") && version.contains("redis-streams"),
        "{version}"
    );
}

/// Run `sql` on the test PostgreSQL server.
fn postgres_execute(sql: &str) -> Result<(), outboxkit_store_postgres::sqlx::Error> {
    use outboxkit_store_postgres::sqlx::{self, Connection};
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let mut db = sqlx::PgConnection::connect(&postgres_url()).await?;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut db)
            .await
            .map(drop)
    })
}

/// The first column of every row `sql` returns on the test PostgreSQL server, as text.
fn postgres_texts(sql: &str) -> Vec<String> {
    use outboxkit_store_postgres::sqlx::{self, Connection};
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime
        .block_on(async {
            let mut db = sqlx::PgConnection::connect(&postgres_url()).await?;
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut db)
                .await
        })
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `migrate --print-sql` connects to nothing (the store's URL points where nothing listens) and
/// prints SQL that, applied by hand, makes the table `migrate` makes: the same columns,
/// indexes, storage settings and bookkeeping row; `check` accepts it and `migrate` leaves it.
#[test]
fn migrate_print_sql_writes_what_migrate_makes() {
    let by_hand = format!("print_sql_{}", std::process::id());
    let by_migrate = format!("print_sql_ref_{}", std::process::id());
    let with_table = |config: String, table: &str| {
        TempConfig::new(&config.replace(
            "[sink]",
            &format!("table = \"{table}\"\nshards = 16\npayload_type = \"text\"\n\n[sink]"),
        ))
    };
    let offline = with_table(unreachable_store(), &by_hand);
    let printed = relay(
        &["--config", &offline.display(), "migrate", "--print-sql"],
        &[],
    );
    assert_eq!(printed.code, Some(0), "stderr:\n{}", printed.stderr);
    assert!(
        printed.stdout.starts_with(&format!(
            "-- outbox-relay: table {by_hand} at schema version 1, 16 shards, payload text;"
        )),
        "{}",
        printed.stdout
    );
    let applied = {
        use outboxkit_store_postgres::sqlx::{self, Connection};
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            let mut db = sqlx::PgConnection::connect(&postgres_url()).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(printed.stdout.as_str()))
                .execute(&mut db)
                .await
                .map(drop)
        })
    };
    let reference = with_table(valid(), &by_migrate);
    migrated(&reference);
    let by_hand_config = with_table(valid(), &by_hand);
    let checked = with_config(&by_hand_config, "check", &[]);
    let migrate = with_config(&by_hand_config, "migrate", &[]);
    let shape = |table: &str| {
        let columns = postgres_texts(&format!(
            "SELECT concat_ws(' ', column_name, data_type, is_nullable, column_default, \
             generation_expression) FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = '{table}' ORDER BY ordinal_position"
        ));
        let indexes = postgres_texts(&format!(
            "SELECT replace(indexdef, '{table}', 'T') FROM pg_indexes \
             WHERE schemaname = 'public' AND tablename = '{table}' ORDER BY indexname"
        ));
        let settings = postgres_texts(&format!(
            "SELECT concat_ws(' ', array_to_string(reloptions, ','), obj_description(oid)) \
             FROM pg_class WHERE oid = 'public.{table}'::regclass"
        ));
        let row = postgres_texts(&format!(
            "SELECT concat_ws(' ', version, shard_count) FROM outbox_relay_schema \
             WHERE table_name = '{table}'"
        ));
        (columns, indexes, settings, row)
    };
    let (hand, reference_shape) = (shape(&by_hand), shape(&by_migrate));
    for table in [&by_hand, &by_migrate] {
        drop_migrated(table).expect("dropping the test table");
    }
    applied.expect("applying the printed SQL");
    assert_eq!(
        checked.code,
        Some(0),
        "check: {}{}",
        checked.stdout,
        checked.stderr
    );
    assert_eq!(migrate.code, Some(0), "migrate: {}", migrate.stderr);
    assert_eq!(hand.0.len(), 15, "{:?}", hand.0);
    assert_eq!(hand.3, vec!["1 16".to_owned()]);
    assert_eq!(hand, reference_shape);
}

/// `migrate --print-sql` of a pattern, and of log-based capture of a table without its schema:
/// refused naming the key, since a pattern is no one table, and log-based capture's script
/// names the schema (in the slot and the messages) that no connection resolved.
/// (`tests/tests/postgres_logical.rs` applies the script of a qualified table.)
#[test]
fn migrate_print_sql_refuses_a_pattern_and_an_unqualified_logical_table() {
    for (store, expected) in [
        (
            "table = \"t_*.outbox\"",
            "store.table: `t_*.outbox` is a pattern; --print-sql writes one table's SQL",
        ),
        (
            "capture = \"logical\"",
            "store.table: \"outbox\" has no schema, and with store.capture = \"logical\" the \
             script names it",
        ),
    ] {
        let config =
            TempConfig::new(&unreachable_store().replace("[sink]", &format!("{store}\n\n[sink]")));
        let out = relay(
            &["--config", &config.display(), "migrate", "--print-sql"],
            &[],
        );
        let line = error_line(&out, 2);
        assert!(line.contains(expected), "{line}");
        assert_eq!(out.stdout, "", "nothing printed");
    }
}

/// Drop the table `migrate` made in the test database's `public` schema, and its schema row.
fn drop_migrated(table: &str) -> Result<(), outboxkit_store_postgres::sqlx::Error> {
    postgres_execute(&format!("DROP TABLE IF EXISTS {table} CASCADE"))?;
    postgres_execute(&format!(
        "DELETE FROM outbox_relay_schema WHERE table_name = '{table}'"
    ))
}

/// A table of the configured name that the relay did not create (a team's own `outbox`, say):
/// every command says so and that `migrate` is no way out, instead of a SQL error (`status`,
/// `dead`) or "run `outbox-relay migrate`" (`run`), which would refuse it.
#[test]
fn a_table_the_relay_did_not_create_is_named_so_by_every_command() {
    let table = format!("not_ours_{}", std::process::id());
    let created = postgres_execute(&format!("CREATE TABLE {table} (id bigint, payload text)"));
    let config =
        TempConfig::new(&valid().replace("[sink]", &format!("table = \"{table}\"\n\n[sink]")));
    let runs: Vec<(&str, Outcome)> = [&["status"][..], &["dead", "list"], &["migrate"], &["run"]]
        .into_iter()
        .map(|command| {
            let path = config.display();
            let args: Vec<&str> = ["--config", path.as_str()]
                .into_iter()
                .chain(command.iter().copied())
                .collect();
            (command[0], relay(&args, &[]))
        })
        .collect();
    let dropped = postgres_execute(&format!("DROP TABLE IF EXISTS {table}"));
    created.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL must be reachable at {} (set OUTBOX_TEST_POSTGRES_URL): {e}",
            postgres_url()
        )
    });
    dropped.expect("dropping the test table");
    for (command, out) in &runs {
        let line = error_line(out, 1);
        assert!(
            line.contains(&format!(
                "table public.{table} exists but was not created by outbox-relay (it has no row \
                 in outbox_relay_schema), and `outbox-relay migrate` leaves it alone: rename it \
                 or set store.table to another name"
            )),
            "{command}: {line}"
        );
    }
}

/// With `sink.destination` setting the template, a sink's message about it names
/// `sink.destination`, the key the file has, not the sink's own (`sink.nats.subject`): the file
/// does not set that one, and setting it would change nothing, `sink.destination` overrides it.
#[test]
fn a_destination_the_broker_refuses_is_named_as_sink_destination() {
    let table = format!("destination_key_{}", std::process::id());
    let subject = format!("no_stream_{}", std::process::id());
    let nats = std::env::var("OUTBOX_TEST_NATS_URL")
        .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let config = TempConfig::new(&format!(
        "{}\n[sink]\nkind = \"nats\"\ndestination = \"{subject}.{{aggregate_type}}\"\n\n\
         [sink.nats]\nurl = \"{nats}\"\n\n[server]\nlisten = \"127.0.0.1:0\"\n",
        postgres_store("store", &format!("table = \"{table}\"\n")),
    ));
    let migrated = with_config(&config, "migrate", &[]);
    let out = with_config(&config, "run", &[]);
    let dropped = drop_migrated(&table);
    assert_eq!(
        migrated.code,
        Some(0),
        "migrate needs PostgreSQL at {} (set OUTBOX_TEST_POSTGRES_URL):\n{}",
        postgres_url(),
        migrated.stderr
    );
    dropped.expect("dropping the test table");
    // The sink's connection logs come first: the failure is the last line.
    assert_eq!(out.code, Some(2), "exit code; stderr:\n{}", out.stderr);
    let line = out.stderr.lines().last().unwrap_or_default();
    assert!(line.starts_with("error: "), "{}", out.stderr);
    assert!(
        line.contains(&format!(
            "no stream for subject `{subject}.*` (sink.destination = `{subject}.{{aggregate_type}}`)"
        )),
        "the missing stream's error, naming sink.destination (NATS at {nats}, \
         OUTBOX_TEST_NATS_URL): {line}"
    );
    assert!(!line.contains("sink.nats.subject"), "{line}");
}

/// Logs written to a pipe or a file (containers, log collectors) carry no ANSI colour codes,
/// whatever the level; `NO_COLOR` is honoured on terminals (unit-tested in cli.rs).
#[test]
fn logs_to_a_pipe_have_no_colour() {
    let table = format!("ansi_check_{}", std::process::id());
    let config =
        TempConfig::new(&valid().replace("[sink]", &format!("table = \"{table}\"\n\n[sink]")));
    let out = with_config(&config, "migrate", &[("RUST_LOG", "debug")]);
    let dropped = drop_migrated(&table);
    assert_eq!(
        out.code,
        Some(0),
        "migrate needs PostgreSQL at {} (set OUTBOX_TEST_POSTGRES_URL):\n{}",
        postgres_url(),
        out.stderr
    );
    dropped.expect("dropping the test table");
    assert!(out.stderr.contains("INFO"), "no log line:\n{}", out.stderr);
    assert!(
        !out.stderr.contains('\u{1b}'),
        "ANSI escapes in piped logs:\n{}",
        out.stderr.escape_debug()
    );
}

/// With JSON logs every line on stderr is a JSON log record, the last one (why the relay
/// stopped) too: level `ERROR`, the exit code among its fields, whatever `log.level` says.
#[test]
fn with_json_logs_the_failure_is_a_json_line() {
    fn last_record(out: &Outcome, code: u8) -> serde_json::Value {
        assert_eq!(
            out.code,
            Some(i32::from(code)),
            "exit code; stderr:\n{}",
            out.stderr
        );
        let records: Vec<serde_json::Value> = out
            .stderr
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
            })
            .collect();
        let last = records.last().expect("a line on stderr").clone();
        assert_eq!(last["level"], "ERROR", "{last}");
        assert_eq!(last["fields"]["exit_code"], code, "{last}");
        last
    }
    // `--log-format json`, and an error found while reading the configuration.
    let config = TempConfig::new(&unreachable_store());
    let path = config.display();
    let out = relay(
        &["--config", &path, "--log-format", "json", "run"],
        &[("OUTBOX_RELAY__BATCH_SIZE", "0")],
    );
    let record = last_record(&out, 2);
    let message = record["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("invalid configuration: relay.batch_size: ")
            && message.contains("(from environment variable OUTBOX_RELAY__BATCH_SIZE)"),
        "{record}"
    );
    // `log.format = "json"` in the file, logging off, and the unreachable database.
    let config = TempConfig::new(&format!(
        "{}\n[log]\nformat = \"json\"\nlevel = \"off\"\n",
        unreachable_store()
    ));
    let record = last_record(&with_config(&config, "run", &[]), 1);
    let message = record["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("PostgreSQL") && message.contains("127.0.0.1:1"),
        "{record}"
    );
    // `log.format` read, the log filter refused: logging never started, the line is JSON.
    let record = last_record(
        &with_config(&config, "run", &[("OUTBOX_LOG__LEVEL", "warning")]),
        2,
    );
    let message = record["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("log.level: `warning` is not a level"),
        "{record}"
    );
}

/// Two pipelines on one PostgreSQL server, tables `a.outbox` and `table_b`, and a shared sink.
fn two_pipelines(table_b: &str) -> String {
    with_sink_and_server(&format!(
        "{}\n{}",
        postgres_store("pipelines.billing.store", "table = \"a.outbox\"\n"),
        postgres_store(
            "pipelines.orders.store",
            &format!("table = \"{table_b}\"\n")
        )
    ))
}

/// A refusal that is no configuration error still names the key as the pipeline has it: a
/// role the server does not know is `pipelines.billing.store.url`, not a `store.url` that the
/// file does not have.
#[test]
fn a_named_pipelines_refused_login_names_its_own_key() {
    let mut url = url::Url::parse(&postgres_url()).unwrap();
    url.set_username("no_such_role_for_outbox").unwrap();
    let config = TempConfig::new(&with_sink_and_server(
        &postgres_store("pipelines.billing.store", "").replace(&postgres_url(), url.as_str()),
    ));
    for command in ["status", "run"] {
        let line = error_line(&with_config(&config, command, &[]), 1);
        assert!(
            line.contains("refused user \"no_such_role_for_outbox\" (pipelines.billing.store.url)"),
            "{command}: {line}"
        );
    }
}

#[test]
fn two_pipelines_on_one_table_are_refused_naming_both() {
    file_error(
        &two_pipelines("a.outbox"),
        "run",
        &[
            "pipelines.billing.store and pipelines.orders.store: pipelines `billing` and \
             `orders` both relay the table postgres 127.0.0.1:5432/test a.outbox: give each \
             its own table",
        ],
    );
    // Checked before connecting: the server is unreachable here and never tried.
    file_error(
        &two_pipelines("a.outbox").replace(&postgres_url(), "postgres://x@127.0.0.1:1/test"),
        "run",
        &["both relay the table"],
    );
}

#[test]
fn pipeline_keys_are_named_with_their_pipeline() {
    file_error(
        &two_pipelines("Bad-Name"),
        "run",
        &["pipelines.orders.store.table: \"Bad-Name\"", "(in "],
    );
    let config = TempConfig::new(&two_pipelines("b.outbox"));
    config_error(
        &config,
        "run",
        &[("OUTBOX_PIPELINES__BILLING__STORE__SHARDS", "0")],
        &[
            "pipelines.billing.store.shards:",
            "(from environment variable OUTBOX_PIPELINES__BILLING__STORE__SHARDS)",
        ],
    );
    // A key the sink itself finds missing: where to set it in this pipeline.
    #[cfg(feature = "sink-kafka")]
    file_error(
        &format!(
            "{}\n[pipelines.orders.sink]\nkind = \"kafka\"\n",
            two_pipelines("b.outbox")
        ),
        "run",
        &[
            "pipelines.orders.sink.kafka.\"bootstrap.servers\": missing required key: the Kafka \
             brokers as host:port[,host:port...] (in ",
            ", or set OUTBOX_PIPELINES__ORDERS__SINK__KAFKA__BOOTSTRAP__SERVERS)",
        ],
    );
    file_error(
        &format!(
            "{}\n[pipelines.Orders.store]\nkind = \"postgres\"\n",
            two_pipelines("b.outbox")
        ),
        "run",
        &["pipelines.Orders: \"Orders\" is not a valid pipeline name"],
    );
    // migrate goes on past a pipeline that fails, says why each failed, and exits with the
    // worst code: here 2, billing's table name.
    let config = TempConfig::new(&two_pipelines("b.outbox").replacen("a.outbox", "Bad-Name", 1));
    let out = with_config(
        &config,
        "migrate",
        &[(
            "OUTBOX_PIPELINES__ORDERS__STORE__URL",
            "postgres://x@127.0.0.1:1/test",
        )],
    );
    let line = error_line(&out, 2);
    assert_eq!(
        line,
        "error: migrate failed for pipeline(s) billing, orders (see above)"
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(
        lines[0].starts_with(
            "pipeline billing: not migrated: invalid configuration: \
             pipelines.billing.store.table: \"Bad-Name\""
        ),
        "{}",
        out.stdout
    );
    assert!(
        lines[1]
            .starts_with("pipeline orders: not migrated: cannot reach PostgreSQL at 127.0.0.1:1"),
        "{}",
        out.stdout
    );

    // The same with standard output closed before the first line (`| head -0`): the lines are
    // dropped, not a panic, and both pipelines are still tried.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = Command::new(BIN)
        .args(["--config", &config.display(), "migrate"])
        .env(
            "OUTBOX_PIPELINES__ORDERS__STORE__URL",
            "postgres://x@127.0.0.1:1/test",
        )
        .stdin(Stdio::null())
        .stdout(writer)
        .output()
        .expect("run outbox-relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr,
        "error: migrate failed for pipeline(s) billing, orders (see above)\n"
    );

    let config = TempConfig::new(&two_pipelines("b.outbox"));
    let path = config.display();
    let line = error_line(&relay(&["--config", &path, "dead", "list"], &[]), 2);
    assert!(
        line.contains(
            "dead: there are 2 pipelines (billing, orders): choose one with --pipeline NAME"
        ),
        "{line}"
    );
    let line = error_line(
        &relay(&["--config", &path, "--pipeline", "nope", "status"], &[]),
        2,
    );
    assert!(
        line.contains("--pipeline nope: no such pipeline (configured: billing, orders)"),
        "{line}"
    );
}

#[test]
fn a_pattern_that_must_match_and_matches_nothing_stops_the_start() {
    let toml = with_sink_and_server(&postgres_store(
        "pipelines.tenants.store",
        "table = \"no_such_tenant_*.outbox\"\nrequire_match = true\n",
    ));
    file_error(
        &toml,
        "run",
        &[
            "pipelines.tenants.store.table: the pattern matches no table yet, and \
           pipelines.tenants.store.require_match is true",
        ],
    );
    file_error(
        &toml.replace("no_such_tenant_*.outbox", "no*such.outbox.x"),
        "run",
        &["pipelines.tenants.store.table: \"no*such.outbox.x\" is not a valid pattern"],
    );
}

/// `check` of `config` (with `args` after it): the outcome, the table dropped whatever it says.
fn check_then_drop(config: &TempConfig, args: &[&str], tables: &[&str]) -> Outcome {
    let path = config.display();
    let mut all = vec!["--config", path.as_str(), "check"];
    all.extend_from_slice(args);
    let out = relay(&all, &[]);
    for table in tables {
        drop_migrated(table).expect("dropping the test table");
    }
    out
}

/// `check`'s output lines, which must be `count`.
fn check_lines(out: &Outcome, count: usize) -> Vec<&str> {
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), count, "{}", out.stdout);
    lines
}

/// That `line` starts with `head` and holds every one of `parts`.
fn assert_check_line(line: &str, head: &str, parts: &[&str]) {
    assert!(
        line.starts_with(head) && parts.iter().all(|part| line.contains(part)),
        "expected `{head}` and {parts:?} in: {line}"
    );
}

/// `migrate` of `config`, which must succeed (the database is the local one).
fn migrated(config: &TempConfig) {
    let out = with_config(config, "migrate", &[]);
    assert_eq!(
        out.code,
        Some(0),
        "migrate (PostgreSQL must be reachable at {}, set OUTBOX_TEST_POSTGRES_URL): {}",
        postgres_url(),
        out.stderr
    );
}

/// `check` connects as `run` does, once: a migrated table and a broker that answers pass, with a
/// line for each side and exit code 0.
#[test]
fn check_passes_when_the_table_is_migrated_and_the_broker_answers() {
    let table = format!("check_ok_{}", std::process::id());
    let config =
        TempConfig::new(&valid().replace("[sink]", &format!("table = \"{table}\"\n\n[sink]")));
    migrated(&config);
    let out = check_then_drop(&config, &[], &[&table]);
    assert_eq!(
        out.code,
        Some(0),
        "stdout:\n{}stderr:\n{}",
        out.stdout,
        out.stderr
    );
    let lines = check_lines(&out, 2);
    let table = format!(", table public.{table}");
    assert_check_line(lines[0], "store: ok: PostgreSQL ", &[&table]);
    assert_eq!(lines[1], "sink: ok: redis-streams");
}

/// What keeps `run` from relaying, `check` reports and fails on: every side's failure on a line
/// of its own (naming the key, and what to do), one `error:` line, exit code 1.
#[test]
fn check_fails_naming_each_side_that_cannot_relay() {
    let table = format!("check_unmigrated_{}", std::process::id());
    let config = TempConfig::new(&format!(
        "{}\n[sink.redis_streams]\nurl = \"redis://127.0.0.1:1\"\n",
        valid().replace("[sink]", &format!("table = \"{table}\"\n\n[sink]"))
    ));
    let out = check_then_drop(&config, &[], &[]);
    let line = error_line(&out, 1);
    assert_eq!(line, "error: check failed (see above)");
    let lines = check_lines(&out, 2);
    let missing = format!("table public.{table} does not exist");
    assert_check_line(lines[0], "store: FAILED: ", &[&missing, "migrate"]);
    assert_check_line(lines[1], "sink: FAILED: ", &["Redis", "127.0.0.1:1"]);
}

/// Two pipelines on the test server, `billing` (table `ok`, migrated here) and `orders` (table
/// `missing`, never migrated), with `more` TOML after them.
fn billing_migrated_orders_not(ok: &str, missing: &str, more: &str) -> TempConfig {
    let config = TempConfig::new(&format!(
        "{}\n{more}",
        with_sink_and_server(&format!(
            "{}\n{}",
            postgres_store("pipelines.billing.store", &format!("table = \"{ok}\"\n")),
            postgres_store(
                "pipelines.orders.store",
                &format!("table = \"{missing}\"\n")
            )
        ))
    ));
    let path = config.display();
    let migrate = relay(
        &["--config", &path, "--pipeline", "billing", "migrate"],
        &[],
    );
    assert_eq!(migrate.code, Some(0), "migrate: {}", migrate.stderr);
    config
}

/// With several pipelines, each line names its pipeline, one that fails does not hide the
/// others, and the last line names those that did not pass.
#[test]
fn check_of_two_pipelines_names_the_one_that_fails() {
    let ok = format!("check_billing_{}", std::process::id());
    let missing = format!("check_orders_{}", std::process::id());
    let config = billing_migrated_orders_not(&ok, &missing, "");
    let out = check_then_drop(&config, &[], &[&ok]);
    let line = error_line(&out, 1);
    assert_eq!(
        line,
        "error: check failed for pipeline(s) orders (see above)"
    );
    let lines = check_lines(&out, 4);
    assert_check_line(lines[0], "pipeline billing: store: ok: ", &[]);
    assert_eq!(lines[1], "pipeline billing: sink: ok: redis-streams");
    let missing = format!("table public.{missing} does not exist");
    assert_check_line(lines[2], "pipeline orders: store: FAILED: ", &[&missing]);
    assert_eq!(lines[3], "pipeline orders: sink: ok: redis-streams");
}

/// `check --json` prints one document with every pipeline's sides (what answered, or the error
/// and its exit code) and keeps the exit code and the last line of the text form.
#[test]
fn check_json_reports_every_side_of_every_pipeline() {
    let ok = format!("check_json_billing_{}", std::process::id());
    let missing = format!("check_json_orders_{}", std::process::id());
    let config = billing_migrated_orders_not(
        &ok,
        &missing,
        "[pipelines.orders.sink]\nkind = \"redis-streams\"\n\n\
         [pipelines.orders.sink.redis_streams]\nurl = \"redis://127.0.0.1:1\"\n",
    );
    let out = check_then_drop(&config, &["--json"], &[&ok]);
    let line = error_line(&out, 1);
    assert_eq!(
        line,
        "error: check failed for pipeline(s) orders (see above)"
    );
    let report: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", out.stdout));
    assert_eq!(report["ok"], false, "{report:#}");
    assert_eq!(report["offline"], false, "{report:#}");
    let billing = &report["pipelines"]["billing"];
    assert_eq!(billing["ok"], true, "{report:#}");
    assert_eq!(billing["store_kind"], "postgres");
    assert_eq!(billing["sink_kind"], "redis-streams");
    let store = &billing["stores"][0];
    assert_eq!(store["ok"], true, "{report:#}");
    let found = store["found"].as_str().unwrap_or_default();
    assert!(
        found.starts_with("PostgreSQL ") && found.contains(&format!(", table public.{ok}")),
        "{report:#}"
    );
    assert_eq!(
        billing["sink"],
        serde_json::json!({ "ok": true, "found": "redis-streams" })
    );
    let orders = &report["pipelines"]["orders"];
    assert_eq!(orders["ok"], false, "{report:#}");
    let store = &orders["stores"][0];
    assert_eq!(store["ok"], false, "{report:#}");
    assert_eq!(store["exit_code"], 1, "{report:#}");
    let error = store["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("table public.{missing} does not exist"))
            && error.contains("migrate"),
        "{report:#}"
    );
    let sink = &orders["sink"];
    assert_eq!(sink["ok"], false, "{report:#}");
    assert_eq!(sink["exit_code"], 1, "{report:#}");
    let error = sink["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("Redis") && error.contains("127.0.0.1:1"),
        "{report:#}"
    );
    // Offline: the pipelines read, nothing connected, no sides.
    let out = check_then_drop(&config, &["--offline", "--json"], &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", out.stdout));
    let unchecked = serde_json::json!({
        "ok": true, "store_kind": "postgres", "sink_kind": "redis-streams"
    });
    assert_eq!(
        report,
        serde_json::json!({
            "ok": true,
            "offline": true,
            "pipelines": { "billing": unchecked, "orders": unchecked }
        })
    );
}

/// `check --offline` reads the configuration as `run` does and connects to nothing: it passes
/// with services that do not answer, and fails with exit code 2 naming the key on a
/// configuration error.
#[test]
fn check_offline_reads_the_configuration_and_connects_to_nothing() {
    let config = TempConfig::new(&format!(
        "{}\n[sink.redis_streams]\nurl = \"redis://127.0.0.1:1\"\n",
        unreachable_store()
    ));
    let out = check_then_drop(&config, &["--offline"], &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.stdout,
        "configuration valid: 1 pipeline (default: postgres → redis-streams); connections not \
         checked (--offline)\n"
    );
    let bad = TempConfig::new(&with_relay("batch_size = 0"));
    let line = error_line(&check_then_drop(&bad, &["--offline"], &[]), 2);
    assert!(line.contains("relay.batch_size"), "{line}");
}

/// A pattern that matches no table passes (`run` waits for one), unless `require_match` says
/// `run` would refuse to start: then it fails as a configuration error.
#[test]
fn check_of_a_pattern_that_matches_nothing_fails_only_with_require_match() {
    let pattern = format!("check_none_{}_*.outbox", std::process::id());
    let config =
        TempConfig::new(&valid().replace("[sink]", &format!("table = \"{pattern}\"\n\n[sink]")));
    let out = check_then_drop(&config, &[], &[]);
    assert_eq!(out.code, Some(0), "stderr:\n{}", out.stderr);
    assert_eq!(
        out.stdout,
        "store: no table matches its pattern (`run` waits for one)\nsink: ok: redis-streams\n"
    );
    let out = with_config(&config, "check", &[("OUTBOX_STORE__REQUIRE_MATCH", "true")]);
    error_line(&out, 2);
    assert_eq!(
        out.stdout,
        "store: FAILED: no table matches its pattern, and store.require_match is true\nsink: ok: \
         redis-streams\n"
    );
}

/// Relay settings the store cannot honour, which `run` refuses once connected, `check` refuses
/// too: `relay.on_dead = "hold"` with log-based capture.
#[test]
fn check_refuses_relay_settings_the_store_cannot_honour() {
    let table = format!("check_hold_{}", std::process::id());
    let config = TempConfig::new(&format!(
        "{}\n[relay]\non_dead = \"hold\"\n",
        valid().replace(
            "[sink]",
            &format!("table = \"{table}\"\ncapture = \"logical\"\n\n[sink]")
        )
    ));
    let out = check_then_drop(&config, &[], &[]);
    error_line(&out, 2);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(
            "store: FAILED: invalid configuration: relay.on_dead: \"hold\" is not available with \
             store.capture = \"logical\""
        ),
        "{}",
        out.stdout
    );
}
