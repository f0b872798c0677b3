#!/usr/bin/env bash
# Change-driven reconcile benchmark (issue 34): commit-to-FCM latency of single-row changes, idle CPU,
# memory, a burst's drain rate and resync divergences, with `tidemark serve` following a PostgreSQL
# table (changes + LISTEN) of a million devices. Release build, its own PostgreSQL, the HTTP emulator.
#
# usage: scripts/bench-changes.sh [--devices 1000000] [--topics 200] [--changes 200] [--every 2]
#                                 [--idle 300] [--soak 1800] [--burst 100000] [--qps 3000]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh jq git
BIN="$(bash scripts/lib/release-build.sh tidemark)/tidemark"
exec python3 scripts/bench/changes.py "$BIN" "$@"
