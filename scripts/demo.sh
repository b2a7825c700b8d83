#!/usr/bin/env bash
# The demo: order events written in business transactions on the local PostgreSQL, relayed to
# the local Redis by two relays, read back and checked. Extra flags go to `outbox-relay demo`
# (see `--help`), e.g. scripts/demo.sh --events 20000 --relays 3
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --release -p outbox-relay
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/outbox-relay" demo "$@"
