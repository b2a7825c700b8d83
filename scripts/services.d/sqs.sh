#!/usr/bin/env bash
# An SQS- and SNS-API server for the `sink-sqs` and `sink-sns` tests and the demo's `--sink sqs`
# and `--sink sns`: LocalStack (SQS and SNS, no Docker) on 127.0.0.1:4566. A LocalStack already
# running without SNS (started before SNS was needed) is stopped by the pid this script wrote
# and started again with both. Installs it once into a venv (Python >= 3.13 from
# pyenv), starts it when nothing answers on the port, waits until it serves SQS requests.
# Idempotent and quick when it already runs. Falls back to moto (Python 3) when LocalStack
# cannot be installed or started; see /work/shared/services/sqs.md for the differences.
#
# Overridable: OUTBOX_SQS_HOME (venvs, state and log; default /opt/outbox-relay),
# OUTBOX_SQS_PORT (default 4566).
set -euo pipefail

log_tag=services
. "$(dirname "$0")/../services-common.sh"

home=${OUTBOX_SQS_HOME:-/opt/outbox-relay}
port=${OUTBOX_SQS_PORT:-4566}
venv=$home/localstack-venv
moto_venv=$home/moto-venv
state=$home/localstack-state
logfile=$home/sqs-server.log
localstack_pins=("localstack-core[base-runtime]==2026.3.0" "cbor2<6" "pyopenssl<25")
moto_pins=("moto[server]==5.2.5")

# An SQS JSON-protocol request that any SQS server answers (200 with a QueueUrls list).
sqs_up() {
  curl -sf -m 3 -X POST "http://127.0.0.1:$port/" \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: AmazonSQS.ListQueues' \
    -H "Authorization: AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0" \
    -d '{}' >/dev/null 2>&1
}
# SNS is served when LocalStack's health endpoint lists it as available or running (moto serves
# every service, and has no such endpoint: counted as serving it).
sns_served() {
  local health
  health=$(curl -sf -m 3 "http://127.0.0.1:$port/_localstack/health" 2>/dev/null) || return 0
  printf '%s' "$health" | grep -Eq '"sns": *"(available|running)"'
}
port_open() { listening 127.0.0.1 "$port"; }

wait_until_up() { # what, seconds
  local what=$1 tries=$(( $2 * 2 ))
  for _ in $(seq "$tries"); do
    if sqs_up; then return 0; fi
    sleep 0.5
  done
  log "$what did not answer on 127.0.0.1:$port within $2 s (log: $logfile)"
  tail -n 20 "$logfile" >&2 || true
  return 1
}

# The newest pyenv Python >= 3.13 (empty when there is none).
python313() {
  local root
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  { ls -d "$root"/versions/3.1[3-9]* "$root"/versions/3.[2-9][0-9]* 2>/dev/null || true; } |
    sort -V | tail -1
}

install_localstack() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import localstack.runtime.main' 2>/dev/null && return 0
  local py
  py=$(python313)
  if [ -z "$py" ] || [ ! -x "$py/bin/python3" ]; then
    log "no Python >= 3.13 under \$(pyenv root)/versions: LocalStack cannot run"; return 1
  fi
  log "installing LocalStack (SQS) into $venv with $py/bin/python3 (~20 s)"
  rm -rf "$venv"
  "$py/bin/python3" -m venv "$venv" &&
    "$venv/bin/pip" install -q --disable-pip-version-check "${localstack_pins[@]}" >&2
}

start_localstack() {
  mkdir -p "$state/fs"
  log "starting LocalStack SQS and SNS on 127.0.0.1:$port"
  GATEWAY_SERVER=hypercorn GATEWAY_LISTEN=127.0.0.1:$port SERVICES=sqs,sns PERSISTENCE=0 \
    LOCALSTACK_TELEMETRY_DISABLED=1 SKIP_SSL_CERT_DOWNLOAD=1 DNS_ADDRESS=0 \
    SQS_ENDPOINT_STRATEGY=path LOCALSTACK_HOST=127.0.0.1:$port \
    LOCALSTACK_VOLUME_DIR="$state" FILESYSTEM_ROOT="$state/fs" \
    setsid nohup "$venv/bin/python" -m localstack.runtime.main >>"$logfile" 2>&1 </dev/null &
  echo $! >"$home/sqs-server.pid"
}

install_moto() {
  [ -x "$moto_venv/bin/moto_server" ] && return 0
  log "installing moto server into $moto_venv"
  rm -rf "$moto_venv"
  python3 -m venv "$moto_venv" &&
    "$moto_venv/bin/pip" install -q --disable-pip-version-check "${moto_pins[@]}" >&2
}

start_moto() {
  log "starting moto server (fallback) on 127.0.0.1:$port"
  setsid nohup "$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$port" >>"$logfile" 2>&1 </dev/null &
  echo $! >"$home/sqs-server.pid"
}

# Stop the LocalStack this script started (its pid file), waiting until the port is free.
stop_own_localstack() {
  local pid
  pid=$(cat "$home/sqs-server.pid" 2>/dev/null || true)
  if [ -z "$pid" ] || [ "$pid" -le 1 ] || ! grep -q localstack.runtime.main "/proc/$pid/cmdline" 2>/dev/null; then
    log "127.0.0.1:$port serves SQS without SNS, and not by a LocalStack this script started: stop it, then run this again"
    return 1
  fi
  log "LocalStack on 127.0.0.1:$port (pid $pid) serves no SNS: restarting it with SERVICES=sqs,sns"
  kill "$pid"
  for _ in $(seq 60); do port_open || return 0; sleep 0.5; done
  log "LocalStack (pid $pid) did not stop within 30 s"; return 1
}

if sqs_up; then
  if sns_served; then exit 0; fi
  stop_own_localstack
fi
if port_open; then
  # Something listens but does not answer yet (a server starting up, or one frozen by a test).
  if ! wait_until_up "the server already listening" 60; then
    log "127.0.0.1:$port is taken by something that does not answer SQS requests"; exit 1
  fi
  if sns_served; then exit 0; fi
  stop_own_localstack
fi
mkdir -p "$home"
if install_localstack && start_localstack && wait_until_up "LocalStack" 90; then
  log "LocalStack SQS and SNS is up on 127.0.0.1:$port"
  exit 0
fi
log "LocalStack failed; falling back to moto"
if [ -f "$home/sqs-server.pid" ]; then kill "$(cat "$home/sqs-server.pid")" 2>/dev/null || true; fi
install_moto && start_moto && wait_until_up "moto" 60
log "moto SQS is up on 127.0.0.1:$port (fallback: no FIFO dedup after delete, whole-batch failure on oversized entries)"
