#!/usr/bin/env bash
# The whole test suite: starts the services it needs, then builds and runs every test of the
# workspace against real services. Building the tests builds the relay binary the end-to-end tests
# run as child processes too (cargo builds a package's binaries for its integration tests, and
# relay-bin has some), with the same features, so it is not built on its own first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-}"

scripts/services.sh

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@"
  cargo test --workspace --doc --all-features
else
  # One test at a time: without nextest's groups, tests that restart or reconfigure the
  # machine's RabbitMQ would run beside others that use it.
  RUST_TEST_THREADS=1 cargo test --workspace --all-features --no-fail-fast "$@"
fi
