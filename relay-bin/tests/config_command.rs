//! `outbox-relay config`: the configuration as the relay reads it, through the real binary. It
//! connects to nothing: no service is needed.

#![cfg(all(feature = "store-postgres", feature = "sink-redis-streams"))]

use crate::binary::{with_config, TempConfig};

const SECRET: &str = "s3cr3t-pw";

#[test]
fn prints_what_the_file_and_the_environment_set_with_secrets_hidden() {
    let secret_file = TempConfig::new(&format!("{SECRET}\n"));
    let config = TempConfig::new(&format!(
        "[relay]\nbatch_size = 100\npoll_interval_min = \"50ms\"\n\n\
         [store]\nkind = \"postgres\"\nurl = \"postgres://app@db.internal/app\"\n\
         password_file = \"{}\"\ntable = \"billing.outbox\"\n\n\
         [sink]\nkind = \"redis-streams\"\n\n[sink.redis_streams]\nstream = \"events\"\n\n\
         [server]\nlisten = \"127.0.0.1:0\"\n",
        secret_file.display()
    ));
    let out = with_config(
        &config,
        "config",
        &[
            ("OUTBOX_RELAY__BATCH_SIZE", "200"),
            (
                "OUTBOX_SINK__REDIS_STREAMS__URL",
                &format!("redis://relay:{SECRET}@cache:6379"),
            ),
        ],
    );
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert!(!out.stdout.contains(SECRET), "{}", out.stdout);
    assert!(!out.stderr.contains(SECRET), "{}", out.stderr);
    let file = config.display();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "# The configuration as the relay reads it: {file}, with the OUTBOX_ environment \
             variables over it."
        )
    );
    // Every value, where it was set: the variable wins over the file.
    for (key, value, origin) in [
        ("batch_size", "\"200\"", "OUTBOX_RELAY__BATCH_SIZE"),
        ("poll_interval_min", "\"50ms\"", file.as_str()),
        ("kind", "\"postgres\"", file.as_str()),
        ("url", "\"postgres://app@db.internal/app\"", file.as_str()),
        (
            "password_file",
            &format!("\"{}\"", secret_file.display()),
            file.as_str(),
        ),
        ("table", "\"billing.outbox\"", file.as_str()),
        ("stream", "\"events\"", file.as_str()),
        (
            "url",
            "\"redis://relay:***@cache:6379\"",
            "OUTBOX_SINK__REDIS_STREAMS__URL",
        ),
        ("listen", "\"127.0.0.1:0\"", file.as_str()),
    ] {
        let found = lines.iter().any(|line| {
            line.strip_prefix(&format!("{key} = {value}"))
                .is_some_and(|rest| rest.trim_start() == format!("# {origin}"))
        });
        assert!(
            found,
            "no line `{key} = {value}  # {origin}` in:\n{}",
            out.stdout
        );
    }
    for table in [
        "[relay]",
        "[store]",
        "[sink]",
        "[sink.redis_streams]",
        "[server]",
    ] {
        assert!(lines.contains(&table), "no {table} in:\n{}", out.stdout);
    }

    // What it printed is a configuration the relay reads (the secret stands as `***`).
    let printed = TempConfig::new(&out.stdout);
    let check_offline =
        crate::binary::relay(&["--config", &printed.display(), "check", "--offline"], &[]);
    assert_eq!(
        check_offline.code,
        Some(0),
        "check --offline of the printed configuration: {}",
        check_offline.stderr
    );
}

#[test]
fn one_pipeline_of_several_and_the_errors_of_other_commands() {
    let config = TempConfig::new(
        "[sink]\nkind = \"redis-streams\"\n\n\
         [pipelines.billing.store]\nkind = \"postgres\"\nurl = \"postgres://db/billing\"\n\n\
         [pipelines.orders.store]\nkind = \"postgres\"\nurl = \"postgres://db/orders\"\n",
    );
    let path = config.display();
    let out = crate::binary::relay(&["--config", &path, "--pipeline", "orders", "config"], &[]);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    assert!(
        out.stdout.contains("\n[pipelines.orders.store]\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("\n[sink]\n"), "{}", out.stdout);
    assert!(!out.stdout.contains("billing"), "{}", out.stdout);

    let out = crate::binary::relay(&["--config", &path, "--pipeline", "tenants", "config"], &[]);
    assert_eq!(out.code, Some(2), "stdout: {}", out.stdout);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        out.stderr.contains("tenants") && out.stderr.contains("billing, orders"),
        "{}",
        out.stderr
    );

    // A configuration the relay cannot read prints nothing but the error `check` gives.
    let broken = TempConfig::new("[relay]\nbatch_siz = 10\n");
    let out = with_config(&broken, "config", &[]);
    let check = with_config(&broken, "check", &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert_eq!(out.stderr, check.stderr);
    assert!(
        out.stderr.contains("did you mean `batch_size`?"),
        "{}",
        out.stderr
    );
}
