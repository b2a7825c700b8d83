//! The consumer-side inbox on a real MySQL / MariaDB: the inbox cases of the store suite.

use crate::common;

outboxkit_store_sql::sql_inbox_suite!(outboxkit_store_mysql, MySql, common::SERVER);
