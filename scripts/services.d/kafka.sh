#!/usr/bin/env bash
# Kafka-API broker for the Kafka sink's tests and `outbox-relay demo --sink kafka`.
#
# There is no Kafka (and no Docker, no JVM build tooling) on the test machines, so we run
# tansu (https://crates.io/crates/tansu), a Kafka-API-compatible broker written in Rust, with
# its in-memory storage engine on 127.0.0.1:9092.
#
# - Installs tansu into $TANSU_ROOT (default /opt/outbox-relay/tansu) with
#   `cargo install tansu --locked --features dynostore` only when the binary is missing
#   (~12-14 minutes of CPU on 2 cores, paid once per machine). The build uses its own target
#   dir so it never holds the workspace's cargo lock.
# - Starts it in the background when nothing listens on 127.0.0.1:9092 (log in
#   $TANSU_LOG, pid in $TANSU_PID_FILE) and waits until the port answers. It logs warnings
#   and errors (RUST_LOG=$TANSU_RUST_LOG, default warn): a refused produce (an idempotent
#   producer's sequence out of order or duplicate...) is a warning, and the end-to-end tests
#   quote these lines when an event goes missing.
# Idempotent; takes well under a second when the broker already runs.
#
# The memory engine forgets every topic and message when the process ends. To simulate an
# outage without losing data, freeze it: `kill -STOP "$(cat $TANSU_PID_FILE)"`, then
# `kill -CONT ...`.
set -euo pipefail

log_tag=services/kafka
. "$(dirname "$0")/../services-common.sh"

TANSU_ROOT=${TANSU_ROOT:-/opt/outbox-relay/tansu}
TANSU_BIN="$TANSU_ROOT/bin/tansu"
TANSU_BUILD_DIR=${TANSU_BUILD_DIR:-/var/cache/outbox-relay/tansu-build}
TANSU_LOG=${TANSU_LOG:-/var/log/outbox-relay-tansu.log}
TANSU_PID_FILE=${TANSU_PID_FILE:-/run/outbox-relay-tansu.pid}
TANSU_RUST_LOG=${TANSU_RUST_LOG:-warn}
TANSU_VERSION=${TANSU_VERSION:-}   # empty: newest on crates.io; set e.g. 0.5.0 to pin
HOST=127.0.0.1
PORT=9092

exit_if_listening "$HOST" "$PORT" "a Kafka-API broker already listens on $HOST:$PORT"

if [ ! -x "$TANSU_BIN" ]; then
  if ! command -v cargo >/dev/null; then
    log "cargo is needed to install tansu (the Kafka-API broker); install Rust first"; exit 1
  fi
  log "installing tansu into $TANSU_ROOT (one-time build, ~12-14 min on 2 cores)"
  mkdir -p "$TANSU_ROOT" "$TANSU_BUILD_DIR"
  version_args=()
  [ -n "$TANSU_VERSION" ] && version_args=(--version "$TANSU_VERSION")
  CARGO_TARGET_DIR="$TANSU_BUILD_DIR" cargo install tansu --locked --features dynostore \
    "${version_args[@]}" --root "$TANSU_ROOT"
  log "tansu installed: $("$TANSU_BIN" --version 2>/dev/null || echo "$TANSU_BIN")"
fi

log "starting tansu on $HOST:$PORT (memory storage, log $TANSU_LOG)"
mkdir -p "$(dirname "$TANSU_LOG")" "$(dirname "$TANSU_PID_FILE")"
# setsid: its own session, so it outlives the shell (and the Ctrl-C) that started it.
RUST_LOG="$TANSU_RUST_LOG" setsid nohup "$TANSU_BIN" broker \
  --listener-url "tcp://$HOST:$PORT" \
  --advertised-listener-url "tcp://$HOST:$PORT" \
  --storage-engine memory://tansu/ \
  >>"$TANSU_LOG" 2>&1 </dev/null &
echo $! >"$TANSU_PID_FILE"

for _ in $(seq 120); do
  if listening "$HOST" "$PORT"; then
    log "tansu is up (pid $(cat "$TANSU_PID_FILE"))"
    exit 0
  fi
  if ! kill -0 "$(cat "$TANSU_PID_FILE")" 2>/dev/null; then
    log "tansu exited at start; last lines of $TANSU_LOG:"; tail -n 20 "$TANSU_LOG" >&2; exit 1
  fi
  sleep 0.5
done
log "tansu did not answer on $HOST:$PORT within 60 s; see $TANSU_LOG"; exit 1
