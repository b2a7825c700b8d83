#!/usr/bin/env bash
# The demo: order events written in business transactions on the local PostgreSQL, relayed to
# the local Redis by two relays, read back and checked. Extra flags go to `outbox-relay demo`
# (see `--help`), e.g. scripts/demo.sh --events 20000 --relays 3
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the services this demo run needs (a new machine need not install them all first).
needed=()
case " $* " in *" kafka "*|*"=kafka "*) needed+=(kafka) ;; esac
case " $* " in *" sqs "*|*"=sqs "*) needed+=(sqs) ;; esac
case " $* " in *" rabbitmq "*|*"=rabbitmq "*) needed+=(rabbitmq) ;; esac
case " $* " in *" mysql "*|*"=mysql "*) needed+=(mariadb) ;; esac
scripts/services.sh "${needed[@]:-none}"
cargo build --release -p outboxkit-relay
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/outbox-relay" demo "$@"
