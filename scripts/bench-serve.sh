#!/usr/bin/env bash
# `tidemark serve` benchmark (issue 31): health endpoints during a million-change apply, wall time,
# CPU and memory of 30 reconciles with nothing changed, and the delay from a new inventory row to its
# subscriptions. Release build, against the HTTP emulator.
#
# usage: scripts/bench-serve.sh [--devices 100000] [--topics 10] [--cycles 30] [--interval 5] [--qps 20000]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BIN="$(bash scripts/lib/release-build.sh tidemark)/tidemark"
exec python3 scripts/bench/serve.py "$BIN" "$@"
