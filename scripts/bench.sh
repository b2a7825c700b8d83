#!/usr/bin/env bash
# The benchmark: builds the relay and the benchmark in release mode, makes sure the services
# run, and measures every pair; writes docs/BENCHMARKS.md, docs/bench/results.json and the
# plots. Extra flags go to outboxkit-bench (see --help), e.g. scripts/bench.sh --runs 5
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --release -p outboxkit-relay -p outboxkit-bench
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/outboxkit-bench" --relay-bin "$target_dir/release/outbox-relay" "$@"
