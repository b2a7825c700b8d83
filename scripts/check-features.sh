#!/usr/bin/env bash
# Each adapter feature of the relay binary, alone, compiles its own driver and no other
# adapter's (checked on `cargo tree`, normal dependencies only). Prints the dependency count of
# each single-feature build, of the PostgreSQL -> Redis binary and of the full binary.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A driver=(
  [store-postgres]=sqlx-postgres
  [store-mysql]=sqlx-mysql
  [sink-kafka]=rdkafka
  [sink-rabbitmq]=lapin
  [sink-redis-streams]=redis
  [sink-sqs]=aws-sdk-sqs
)

tree() { cargo tree -q -p outboxkit-relay -e normal --prefix none "$@" | sort -u; }

failed=0
for feature in store-postgres store-mysql sink-kafka sink-rabbitmq sink-redis-streams sink-sqs; do
  deps=$(tree --no-default-features --features "$feature")
  for other in "${!driver[@]}"; do
    name=${driver[$other]}
    if grep -q "^$name " <<<"$deps"; then present=yes; else present=no; fi
    if [ "$other" = "$feature" ] && [ "$present" = no ]; then
      echo "FAIL: --features $feature does not compile its own driver $name"; failed=1
    elif [ "$other" != "$feature" ] && [ "$present" = yes ]; then
      echo "FAIL: --features $feature also compiles $name, the driver of $other"; failed=1
    fi
  done
  echo "--features $feature: $(wc -l <<<"$deps") crates, adapter drivers: ${driver[$feature]}"
done
echo "--features store-postgres,sink-redis-streams: $(tree --no-default-features --features store-postgres,sink-redis-streams | wc -l) crates"
echo "default (every adapter): $(tree | wc -l) crates"
exit "$failed"
