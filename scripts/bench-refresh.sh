#!/usr/bin/env bash
# Refresh benchmark (issue 16): requests and wall time per refresh mode (all, touched, sample) for
# `plan --out` + `apply` after 1% of a converged fleet's devices got new tokens. Release build.
#
# usage: scripts/bench-refresh.sh [--devices 20000] [--topics 10] [--qps 3000] [--read-qps 3000]
#                                 [--budget 1000] [--modes all,touched,sample]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BIN="$(bash scripts/lib/release-build.sh tidemark)/tidemark"
exec python3 scripts/bench/refresh.py "$BIN" "$@"
