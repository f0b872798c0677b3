#!/usr/bin/env bash
# Resilience checks of `tidemark apply` against the emulator: injected faults, 20 SIGKILLs with
# resume, concurrent applies. Prints what each tried and found; exits 1 on any lost or extra
# membership or replayed batch.
#
# usage: scripts/resilience.sh [faults] [kills] [concurrent] [--kills N]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${TIDEMARK_CONFIGURATION:-release}"
swift build -c "$CONFIG" --product tidemark >/dev/null
BIN="$(swift build -c "$CONFIG" --show-bin-path)/tidemark"
exec python3 scripts/resilience/run.py "$BIN" "$@"
