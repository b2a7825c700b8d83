#!/usr/bin/env bash
# Mosquitto (MQTT 5) for the MQTT sink example's tests (examples/mqtt-sink), on 127.0.0.1:1883
# with anonymous access (loopback only).
#
# - Installs the Debian package `mosquitto` when it is missing.
# - When nothing answers on 1883, starts a broker in the background with its own config
#   (listener on 127.0.0.1:1883, anonymous allowed; log in $MOSQUITTO_LOG) and waits for the port.
# Idempotent; takes well under a second when a broker already answers.
set -euo pipefail

log_tag=services/mosquitto
. "$(dirname "$0")/../services-common.sh"

HOST=127.0.0.1
PORT=${MOSQUITTO_PORT:-1883}
MOSQUITTO_CONF=${MOSQUITTO_CONF:-/etc/outbox-relay/mosquitto.conf}
MOSQUITTO_LOG=${MOSQUITTO_LOG:-/var/log/outbox-relay-mosquitto.log}

exit_if_listening "$HOST" "$PORT" "an MQTT broker already answers on $HOST:$PORT"

if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
  log "installing Mosquitto (apt package mosquitto)"
  apt_install mosquitto
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
  if listening "$HOST" "$PORT"; then
    log "Mosquitto is up on $HOST:$PORT"
    exit 0
  fi
  sleep 0.5
done
log "Mosquitto did not come up on $HOST:$PORT (see $MOSQUITTO_LOG)"
exit 1
