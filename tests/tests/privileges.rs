//! The relay's database user with exactly the privileges the store READMEs list ("Privileges"),
//! their `GRANT` statements run as they are written there: one privilege fewer and `run` stops
//! at start naming it and the statement that gives it, where it used to start and retry for
//! ever (MySQL) or name the wrong table (PostgreSQL); with all of them `run` relays and `status`
//! finds nothing wrong.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

pub(super) const POSTGRES_README: &str = include_str!("../../outbox-store-postgres/README.md");
const MYSQL_README: &str = include_str!("../../outbox-store-mysql/README.md");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relays_with_the_privileges_its_readme_lists() {
    let name = unique("priv");
    let store = Arc::new(PostgresSide::open(&name).await);
    let grants = readme_grants(
        POSTGRES_README,
        &name,
        &[("app.", "public."), ("SCHEMA app", "SCHEMA public")],
    );
    let user = Restricted {
        create: format!("CREATE ROLE {name} LOGIN PASSWORD 'pw'"),
        revokes: vec![
            Revoke {
                revoke: format!("REVOKE DELETE ON {name} FROM {name}"),
                missing: format!("DELETE on \"public\".\"{name}\""),
                grant: format!("GRANT SELECT, UPDATE, DELETE ON \"public\".\"{name}\" TO {name};"),
            },
            // A relay that cannot read the pause table would publish through a pause.
            Revoke {
                revoke: format!("REVOKE SELECT ON outbox_relay_pause FROM {name}"),
                missing: "SELECT on \"public\".\"outbox_relay_pause\"".to_owned(),
                grant: format!("GRANT SELECT ON \"public\".\"outbox_relay_pause\" TO {name};"),
            },
        ],
        drop: vec![format!("DROP OWNED BY {name}"), format!("DROP ROLE {name}")],
        url: with_user(&postgres_url(), &name),
    };
    relays_with_the_listed_privileges(&name, store, &grants, &user).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_relays_with_the_privileges_its_readme_lists() {
    let name = unique("priv");
    let store = Arc::new(MySqlSide::open(&name).await);
    let grants = readme_grants(MYSQL_README, &name, &[("shop.", "")]);
    let user = Restricted {
        create: format!("CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'"),
        revokes: vec![
            // Without the membership rows a relay used to start, then retry its session for ever.
            Revoke {
                revoke: format!("REVOKE DELETE ON outbox_relay_members FROM {name}"),
                missing: "DELETE on `test`.`outbox_relay_members`".to_owned(),
                grant: format!(
                    "GRANT SELECT, INSERT, DELETE ON `test`.`outbox_relay_members` TO {name};"
                ),
            },
            Revoke {
                revoke: format!("REVOKE SELECT ON outbox_relay_pause FROM {name}"),
                missing: "SELECT on `test`.`outbox_relay_pause`".to_owned(),
                grant: format!("GRANT SELECT ON `test`.`outbox_relay_pause` TO {name};"),
            },
        ],
        drop: vec![format!("DROP USER '{name}'@'%'")],
        url: with_user(&mysql_url(), &name),
    };
    relays_with_the_listed_privileges(&name, store, &grants, &user).await;
}

/// A database user of the test's own, and what the test expects of it.
struct Restricted {
    create: String,
    /// Each takes one listed privilege away, in turn.
    revokes: Vec<Revoke>,
    drop: Vec<String>,
    /// The test server's URL, as this user.
    url: String,
}

/// One listed privilege taken away, and what `run` must say of it.
struct Revoke {
    revoke: String,
    /// How the error names the privilege taken away, and the statement it gives for it.
    missing: String,
    grant: String,
}

async fn relays_with_the_listed_privileges(
    name: &str,
    store: Arc<dyn StoreSide>,
    grants: &[String],
    user: &Restricted,
) {
    let redis = Arc::new(RedisSide::open(name).await);
    // Migrated by the test's (administrator) user, as a deployment would.
    let mut scenario = Scenario::prepare(store.clone(), redis.clone(), Settings::default()).await;
    store.exec_sql(&user.create).await;
    let grant_all = || async {
        for grant in grants {
            store.exec_sql(grant).await;
        }
    };
    let as_user = [("OUTBOX_STORE__URL", user.url.as_str())];
    for (i, revoke) in user.revokes.iter().enumerate() {
        grant_all().await;
        store.exec_sql(&revoke.revoke).await;
        let log = scenario.stopped_at_start(&format!("relay-lacking-{i}"), &as_user);
        assert!(
            log.contains(&format!("user \"{name}\" lacks privileges the relay needs"))
                && log.contains(&revoke.missing)
                && log.contains(&revoke.grant)
                && log.contains("\"Privileges\""),
            "the error names what is missing and how to grant it: {log}"
        );
    }

    grant_all().await;
    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let events: Vec<NewEvent> = (1..=10)
        .map(|n| event(if n % 2 == 0 { "A" } else { "B" }, n))
        .collect();
    scenario.store.enqueue_many(&events).await;
    scenario.start_relay("relay-granted", &as_user);
    let stream = redis.destination("order");
    wait_for("10 events in the stream", Duration::from_secs(30), || {
        let (redis, stream) = (redis.clone(), stream.clone());
        async move { redis.stream_len(&stream).await == 10 }
    })
    .await;
    let (ok, json, err) = run_cli(
        &scenario.config,
        &["status", "--json"],
        &[("OUTBOX_STORE__URL".to_owned(), user.url.clone())],
    );
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    assert!(status["problem"].is_null(), "{status}");

    let relay = &mut scenario.relays[user.revokes.len()];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "{}", relay.log_text());
    redis.delete(&[stream]).await;
    scenario.cleanup().await;
    for sql in &user.drop {
        store.exec_sql(sql).await;
    }
}

/// The `GRANT` statements of `readme`'s "Privileges" section, for the test's `table` and user
/// `table`: each `(from, to)` of `rename` replaced, then the README's table `outbox` and user
/// `relay` by the test's.
pub(super) fn readme_grants(readme: &str, table: &str, rename: &[(&str, &str)]) -> Vec<String> {
    let section = readme
        .split("### Privileges")
        .nth(1)
        .expect("the README has a \"Privileges\" section");
    let block = section
        .split("```sql\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section starts with its GRANT statements");
    block
        .lines()
        .filter(|line| line.starts_with("GRANT "))
        .map(|line| {
            let mut line = line.to_owned();
            for (from, to) in rename {
                line = line.replace(from, to);
            }
            line.replace("outbox TO relay;", &format!("{table} TO relay;"))
                .replace(" TO relay;", &format!(" TO {table};"))
        })
        .collect()
}

/// `url` with `user` (password `pw`) instead of its own user.
pub(super) fn with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:pw@{host}")
}

/// A PostgreSQL server that takes no writes (here a user with default_transaction_read_only;
/// a hot standby, a replica's address, is the same to the relay): `run` stops at start saying
/// so, where it used to claim, publish, fail to mark and claim again, sending the same events
/// thousands of times a second while /readyz said ready. Once running, a server that turns
/// read-only (a failover) gets no new session until it takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_read_only_server_instead_of_publishing_again_and_again() {
    let name = unique("ro");
    let store = Arc::new(PostgresSide::open(&name).await);
    let redis = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::prepare(store.clone(), redis.clone(), Settings::default()).await;
    store
        .exec_sql(&format!("CREATE ROLE {name} LOGIN PASSWORD 'pw'"))
        .await;
    let grants = readme_grants(
        POSTGRES_README,
        &name,
        &[("app.", "public."), ("SCHEMA app", "SCHEMA public")],
    );
    for grant in &grants {
        store.exec_sql(grant).await;
    }
    let url = with_user(&postgres_url(), &name);
    let read_only = async |on: bool| {
        let setting = match on {
            true => "SET default_transaction_read_only = on",
            false => "RESET default_transaction_read_only",
        };
        store
            .exec_sql(&format!("ALTER ROLE {name} {setting}"))
            .await;
    };
    let cut = async || {
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'"
        );
        store.exec_sql(&sql).await;
    };
    let stopped = ReadOnly {
        env: &[("OUTBOX_STORE__URL", url.as_str())],
        why: "default_transaction_read_only",
    };
    stopped.refused(&mut scenario, &redis, read_only, cut).await;
    scenario.cleanup().await;
    store.exec_sql(&format!("DROP OWNED BY {name}")).await;
    store.exec_sql(&format!("DROP ROLE {name}")).await;
}

/// A MariaDB server with `read_only` on (a replica, a primary being failed over): `run` stops at
/// start saying so, and `migrate` refuses too. `read_only` does not stop root (READ_ONLY ADMIN,
/// SUPER on MySQL): a relay as root used to claim from the replica, publish and mark its rows
/// there, breaking its replication while the primary kept them pending. Once running, a server
/// that turns read-only gets no new session until it takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_refuses_a_read_only_server_even_as_a_user_read_only_does_not_stop() {
    let name = unique("ro");
    let server = PrivateMariaDb::create(&name);
    server.start().await;
    let store = Arc::new(MySqlSide::open_at(&server.url("test"), &name).await);
    let redis = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::prepare(store.clone(), redis.clone(), Settings::default()).await;
    let read_only = async |on: bool| {
        store
            .exec_sql(&format!("SET GLOBAL read_only = {}", u8::from(on)))
            .await
    };
    let cut = async || server.cut_connections().await;
    // A user read_only does not stop would create the tables on a replica too.
    read_only(true).await;
    let (migrated, _, said) = scenario.cli(&["migrate"]);
    assert!(
        !migrated && said.contains("is read-only (read_only is ON"),
        "{said}"
    );
    let stopped = ReadOnly {
        env: &[],
        why: "read_only is ON: a replica",
    };
    stopped.refused(&mut scenario, &redis, read_only, cut).await;
    scenario.cleanup().await;
    store.pool().close().await;
    drop(server);
}

/// What a read-only test runs its relays with, and how their start error says why the server
/// is read-only.
struct ReadOnly<'a> {
    env: &'a [(&'a str, &'a str)],
    why: &'a str,
}

impl ReadOnly<'_> {
    /// With the server read-only (`read_only(true)`): `run` stops at start saying why, and
    /// nothing is published or marked. Writable again: a relay publishes.
    /// Read-only under it, its connections cut (`cut`): no session, no publish, the log says
    /// why; writable again: it goes on.
    async fn refused(
        &self,
        scenario: &mut Scenario,
        redis: &RedisSide,
        read_only: impl AsyncFn(bool),
        cut: impl AsyncFn(),
    ) {
        let events = |from: u32| -> Vec<NewEvent> {
            (from..from + 10)
                .map(|n| NewEvent::new("order", "A", "Changed", serde_json::json!({ "n": n })))
                .collect()
        };
        let stream = redis.destination("order");
        let published = async |n: u64| {
            wait_for(&format!("{n} events"), Duration::from_secs(30), || async {
                redis.stream_len(&stream).await == n
            })
            .await;
        };

        read_only(true).await;
        scenario.store.enqueue_many(&events(0)).await;
        let log = scenario.stopped_at_start("relay-read-only", self.env);
        assert!(
            log.contains("is read-only") && log.contains(self.why),
            "{log}"
        );
        assert_eq!(redis.stream_len(&stream).await, 0, "nothing was published");
        let pending = scenario.store.count_rows("published_at IS NULL").await;
        assert_eq!(pending, 10, "nothing was marked");

        read_only(false).await;
        let relay = scenario.start_relay("relay-writable", self.env);
        published(10).await;

        // Cut before the new events are written: a session already open may go on (a user
        // read_only does not stop; on PostgreSQL a role setting applies to new sessions only)
        // and would publish them before the cut.
        read_only(true).await;
        cut().await;
        scenario.store.enqueue_many(&events(10)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let log = scenario.relays[relay].log_text();
        assert_eq!(
            redis.stream_len(&stream).await,
            10,
            "no session, no publish: {log}"
        );
        assert!(log.contains("is read-only"), "{log}");
        read_only(false).await;
        published(20).await;

        let exit = scenario.relays[relay].terminate(Duration::from_secs(20));
        assert!(exit.success(), "{}", scenario.relays[relay].log_text());
        redis.delete(&[stream]).await;
    }
}
