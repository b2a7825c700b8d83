//! The consumer-side inbox on the real PostgreSQL: the inbox cases of the store suite.

use crate::common;

outboxkit_store_sql::sql_inbox_suite!(outboxkit_store_postgres, Postgres, common::SERVER);
