#!/usr/bin/env bash
# RabbitMQ for the RabbitMQ sink's tests and `outbox-relay demo --sink rabbitmq`, on
# 127.0.0.1:5672 with the default guest/guest user (guest may only log in from loopback).
#
# - Installs the Debian package `rabbitmq-server` when it is missing (and, on a fresh install,
#   makes it listen on loopback only).
# - When nothing answers on 5672: if the node runs with its application stopped (after
#   `rabbitmqctl stop_app`, e.g. a broker-restart test that died half-way), `start_app`;
#   otherwise start the server with `rabbitmq-server -detached`. Then waits with
#   `rabbitmqctl await_startup` and a TCP check.
# Idempotent; takes well under a second when the broker already answers.
set -euo pipefail

log_tag=services/rabbitmq
. "$(dirname "$0")/../services-common.sh"

HOST=127.0.0.1
PORT=5672

exit_if_listening "$HOST" "$PORT" "RabbitMQ already answers on $HOST:$PORT"

if ! command -v rabbitmq-server >/dev/null || ! command -v rabbitmqctl >/dev/null; then
  log "installing RabbitMQ (apt package rabbitmq-server)"
  fresh_config=
  [ -e /etc/rabbitmq/rabbitmq.conf ] || fresh_config=1
  apt_install rabbitmq-server
  if [ -n "$fresh_config" ]; then
    mkdir -p /etc/rabbitmq
    echo "listeners.tcp.local = $HOST:$PORT" >/etc/rabbitmq/rabbitmq.conf
  fi
fi

if timeout 30 rabbitmqctl -q ping >/dev/null 2>&1; then
  log "the RabbitMQ node runs but its application is stopped: rabbitmqctl start_app"
  timeout 120 rabbitmqctl -q start_app
else
  log "starting RabbitMQ (rabbitmq-server -detached)"
  rabbitmq-server -detached
fi

# The node registers first (ping), then boots the application (await_startup), then listens.
deadline=$((SECONDS + 120))
until timeout 10 rabbitmqctl -q ping >/dev/null 2>&1; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "the RabbitMQ node did not start (see /var/log/rabbitmq/)"; exit 1
  fi
  sleep 1
done
timeout 120 rabbitmqctl -q await_startup --timeout 110 >/dev/null 2>&1 || true
until listening "$HOST" "$PORT"; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "RabbitMQ did not come up on $HOST:$PORT (see /var/log/rabbitmq/)"; exit 1
  fi
  sleep 0.5
done
log "RabbitMQ answers on $HOST:$PORT"
