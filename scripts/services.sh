#!/usr/bin/env bash
# Make sure the services the tests and the demo need are up on loopback:
# PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379), the PgBouncer binary, then every
# scripts/services.d/*.sh
# (MariaDB, Mosquitto, RabbitMQ, Kafka-API, SQS-API) — or, with arguments, only the ones named
# (`scripts/services.sh kafka sqs`). Starts what is stopped, installs
# what is missing (Debian packages), waits until each answers. Idempotent and quick when all
# is running.
set -euo pipefail

log_tag=services
. "$(dirname "$0")/services-common.sh"

wait_until() { # what, tries, command...
  local what=$1 tries=$2; shift 2
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "$what did not come up"; return 1
}

postgres_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

# PostgreSQL
if ! command -v pg_isready >/dev/null || ! command -v pg_ctlcluster >/dev/null; then
  log "installing PostgreSQL"; apt_install postgresql postgresql-client
fi
if ! postgres_up; then
  log "starting PostgreSQL"
  version=$(ls /etc/postgresql | sort -V | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_until "PostgreSQL" 60 postgres_up
fi
# The tests connect as postgres over TCP to database test, without a password.
if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
  log "creating database test"
  su postgres -c "psql -Atc 'create database test'" >/dev/null 2>&1 || true
  psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null || {
    log "cannot connect to postgres://postgres@127.0.0.1:5432/test without a password (pg_hba.conf needs trust for 127.0.0.1)"; exit 1; }
fi

# Redis
if ! command -v redis-server >/dev/null; then
  log "installing Redis"; apt_install redis-server
fi
if ! redis_up; then
  log "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_until "Redis" 60 redis_up
fi
log "PostgreSQL and Redis are up"

# PgBouncer: only the binary (tests/tests/pgbouncer.rs starts its own, in front of PostgreSQL).
if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
  log "installing PgBouncer (apt package pgbouncer)"; apt_install pgbouncer
fi

# iproute2's `ip`: tests/tests/partition.rs puts a relay in a network namespace of its own
# (which needs root, as the tests' private servers do).
if ! command -v ip >/dev/null && [ ! -x /usr/sbin/ip ] && [ ! -x /sbin/ip ]; then
  log "installing iproute2 (apt package iproute2)"; apt_install iproute2
fi

# Brokers and databases of other adapters: one script each, sourced in name order.
for script in "$(dirname "$0")"/services.d/*.sh; do
  [ -e "$script" ] || continue
  name=$(basename "$script" .sh)
  if [ "$#" -gt 0 ] && [[ " $* " != *" $name "* ]]; then
    continue
  fi
  bash "$script"
done
