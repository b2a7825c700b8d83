//! The consumer-side inbox on a real MySQL / MariaDB: the inbox cases of the store suite.

use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::store_suite::inbox::InboxHarness;
use outboxkit_store_mysql::sqlx::{self, MySql, MySqlPool};
use outboxkit_store_mysql::Inbox;
use uuid::Uuid;

fn url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// An inbox on a new table, and its pool.
#[derive(Debug, Clone)]
struct MySqlInbox {
    pool: MySqlPool,
    inbox: Inbox,
    table: String,
}

#[async_trait]
impl InboxHarness for MySqlInbox {
    type Tx = sqlx::Transaction<'static, MySql>;

    async fn fresh() -> Self {
        let url = url();
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("MySQL at {url} is unreachable: {e}"));
        let table = format!("inbox_t_{}", &Uuid::new_v4().simple().to_string()[..10]);
        let inbox = Inbox::new(&table).unwrap();
        inbox.migrate(&pool).await.unwrap();
        inbox.migrate(&pool).await.expect("migrate is idempotent");
        Self { pool, inbox, table }
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    async fn commit(&self, tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn rollback(&self, tx: Self::Tx) {
        tx.rollback().await.unwrap();
    }

    async fn try_mark_processed(&self, tx: &mut Self::Tx, consumer: &str, event: Uuid) -> bool {
        self.inbox
            .try_mark_processed(tx, consumer, event)
            .await
            .unwrap()
    }

    async fn mark_processed_now(&self, consumer: &str, event: Uuid) -> bool {
        let mut conn = self.pool.acquire().await.unwrap();
        self.inbox
            .try_mark_processed(&mut conn, consumer, event)
            .await
            .unwrap()
    }

    async fn purge_processed(&self, older_than: Duration, limit: u32) -> u64 {
        self.inbox
            .purge_processed(&self.pool, older_than, limit)
            .await
            .unwrap()
    }

    async fn drop_table(&self) {
        sqlx::query(&format!("DROP TABLE {}", self.table))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

outboxkit_core::inbox_suite!(MySqlInbox);
