#!/usr/bin/env bash
# Each adapter feature of the relay binary, alone, compiles its own driver and no other
# adapter's (checked on `cargo tree`, normal dependencies only); so does each side feature of
# the harness (the demo tool `outbox-demo` is built with the two of its pair). Prints the
# dependency count of each single-feature build, of the PostgreSQL -> Redis binary and of the
# full binary.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A driver=(
  [postgres]=sqlx-postgres
  [mysql]=sqlx-mysql
  [kafka]=rdkafka
  [rabbitmq]=lapin
  [redis-streams]=redis
  [sqs]=aws-sdk-sqs
  [sns]=aws-sdk-sns
  [nats]=async-nats
)
adapters=(postgres mysql kafka rabbitmq redis-streams sqs sns nats)
# The harness's SNS side reads topics through SQS queues: it needs the SQS client too.
declare -A also_needs=([outboxkit-harness:sns]=sqs)

tree() { cargo tree -q -p "$package" -e normal --prefix none "$@" | sort -u; }

# feature name of an adapter in $package: store-<a>/sink-<a> for the relay, <a> for the harness
feature_of() {
  if [ "$package" = outboxkit-relay ]; then
    case "$1" in postgres | mysql) echo "store-$1" ;; *) echo "sink-$1" ;; esac
  else
    echo "$1"
  fi
}

failed=0
for package in outboxkit-relay outboxkit-harness; do
  for adapter in "${adapters[@]}"; do
    feature=$(feature_of "$adapter")
    deps=$(tree --no-default-features --features "$feature")
    for other in "${adapters[@]}"; do
      name=${driver[$other]}
      if grep -q "^$name " <<<"$deps"; then present=yes; else present=no; fi
      if [ "$other" = "$adapter" ] && [ "$present" = no ]; then
        echo "FAIL: $package --features $feature does not compile its own driver $name"; failed=1
      elif [ "$other" != "$adapter" ] && [ "$present" = yes ] &&
        [ "${also_needs[$package:$adapter]:-}" != "$other" ]; then
        echo "FAIL: $package --features $feature also compiles $name, the driver of $(feature_of "$other")"
        failed=1
      fi
    done
    echo "$package --features $feature: $(wc -l <<<"$deps") crates, adapter drivers: ${driver[$adapter]}"
  done
done
package=outboxkit-relay
echo "outboxkit-relay --features store-postgres,sink-redis-streams: $(tree --no-default-features --features store-postgres,sink-redis-streams | wc -l) crates"
echo "outboxkit-relay default (every adapter): $(tree | wc -l) crates"
exit "$failed"
