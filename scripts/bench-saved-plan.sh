#!/usr/bin/env bash
# Saved-plan benchmark (issue 36): 1,000,000 membership changes (100,000 devices x 10 topics) applied
# on the embedded backend fresh, from a saved plan, and from a saved plan split into a million
# one-token operations; wall time and peak memory of each. Release build unless BUILD=debug.
#
# usage: scripts/bench-saved-plan.sh [--devices N] [--topics N]
set -euo pipefail
cd "$(dirname "$0")/.."
configuration="${BUILD:-release}"
swift build -c "$configuration" --product tidemark >/dev/null
BIN="$(swift build -c "$configuration" --show-bin-path)/tidemark"
exec python3 scripts/bench/saved_plan.py "$BIN" "$@"
