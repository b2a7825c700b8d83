#!/usr/bin/env bash
# The demo: order events written in business transactions on the local PostgreSQL, relayed to
# the local Redis by two `outbox-relay run` processes, read back and checked. Extra flags go to
# the demo tool `outbox-demo` (package outboxkit-harness; see `--help`), e.g.
# scripts/demo.sh --events 20000 --relays 3, or --store mysql --sink kafka.
# Builds the relay with only the store and the sink of the chosen pair, and the demo tool with
# only the harness sides of that pair.
set -euo pipefail
cd "$(dirname "$0")/.."
store=postgres
sink=redis-streams
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --store) store=${args[i + 1]:-$store} ;;
    --store=*) store=${args[i]#--store=} ;;
    --sink) sink=${args[i + 1]:-$sink} ;;
    --sink=*) sink=${args[i]#--sink=} ;;
  esac
done
# Only the services this demo run needs (a new machine need not install them all first).
needed=()
case "$sink" in kafka | sqs | rabbitmq) needed+=("$sink") ;; sns) needed+=(sqs) ;; esac
[ "$store" = mysql ] && needed+=(mariadb)
scripts/services.sh "${needed[@]:-none}"
cargo build --release -p outboxkit-relay --bin outbox-relay -p outboxkit-harness --bin outbox-demo \
  --no-default-features \
  --features "outboxkit-relay/store-$store,outboxkit-relay/sink-$sink,outboxkit-harness/$store,outboxkit-harness/$sink"
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/outbox-demo" --relay-bin "$target_dir/release/outbox-relay" "$@"
