#!/usr/bin/env bash
# Mosquitto (MQTT 5) for the MQTT sink example's tests (examples/mqtt-sink), on 127.0.0.1:1883
# with anonymous access (loopback only).
#
# - Installs the Debian package `mosquitto` when it is missing.
# - When nothing answers on 1883, starts a broker in the background with its own config
#   (listener on 127.0.0.1:1883, anonymous allowed; log in $MOSQUITTO_LOG) and waits for the port.
# Idempotent; takes well under a second when a broker already answers.
set -euo pipefail

log() { printf '[services/mosquitto] %s\n' "$*" >&2; }

HOST=127.0.0.1
PORT=${MOSQUITTO_PORT:-1883}
MOSQUITTO_CONF=${MOSQUITTO_CONF:-/etc/outbox-relay/mosquitto.conf}
MOSQUITTO_LOG=${MOSQUITTO_LOG:-/var/log/outbox-relay-mosquitto.log}

mqtt_up() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

if mqtt_up; then
  log "an MQTT broker already answers on $HOST:$PORT"
  exit 0
fi

if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
  log "installing Mosquitto (apt package mosquitto)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null
fi
mosquitto_bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)

mkdir -p "$(dirname "$MOSQUITTO_CONF")"
cat >"$MOSQUITTO_CONF" <<CONF
listener $PORT $HOST
allow_anonymous true
persistence false
log_dest file $MOSQUITTO_LOG
CONF
log "starting Mosquitto on $HOST:$PORT (log in $MOSQUITTO_LOG)"
"$mosquitto_bin" -c "$MOSQUITTO_CONF" -d

for _ in $(seq 60); do
  if mqtt_up; then
    log "Mosquitto is up on $HOST:$PORT"
    exit 0
  fi
  sleep 0.5
done
log "Mosquitto did not come up on $HOST:$PORT (see $MOSQUITTO_LOG)"
exit 1
