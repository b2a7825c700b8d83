#!/usr/bin/env bash
# MariaDB for the MySQL store's tests and `outbox-relay demo --store mysql`:
# 127.0.0.1:3306, user root without a password, database `test`.
#
# Installs mariadb-server (Debian package) when missing, starts mariadbd in the background
# when it does not answer, waits until it does, and creates the database `test`.
# Idempotent; takes well under a second when the server already runs.
set -euo pipefail

log_tag=services/mariadb
. "$(dirname "$0")/../services-common.sh"

mariadb_up() { mariadb -h127.0.0.1 -uroot -e 'select 1' >/dev/null 2>&1; }

if mariadb_up && mariadb -h127.0.0.1 -uroot test -e 'select 1' >/dev/null 2>&1; then
  exit 0
fi

if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
  log "installing MariaDB"
  apt_install mariadb-server mariadb-client
fi

mariadb_socket_up() { mariadb -uroot -e 'select 1' >/dev/null 2>&1; }

if ! mariadb_up && ! mariadb_socket_up; then
  log "starting MariaDB"
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 120); do
    if mariadb_up || mariadb_socket_up; then break; fi
    sleep 0.5
  done
fi
if ! mariadb_up; then
  # A fresh Debian install lets root in through the Unix socket only: allow root over TCP on
  # loopback without a password, as the tests expect (test machines only).
  if mariadb_socket_up; then
    log "allowing root@127.0.0.1 without a password"
    mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; \
      GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; \
      ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
  fi
  mariadb_up || { log "MariaDB did not come up on 127.0.0.1:3306 for root without a password (see the server log, e.g. /var/log/mysql/error.log)"; exit 1; }
fi

# The tests connect as root over TCP without a password, to database test.
mariadb -h127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS test' >/dev/null
log "MariaDB is up on 127.0.0.1:3306"
