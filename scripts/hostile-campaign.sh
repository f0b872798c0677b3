#!/usr/bin/env bash
# Hostile-input campaign (issue 36): the inputs the second campaign found broken, run against the CLI;
# prints one line per case (exit, seconds, peak memory) and the counts of crashes, hangs, blow-ups,
# reads outside the project, wrong verdicts and raw dumps. Release build unless BUILD=debug.
#
# usage: scripts/hostile-campaign.sh [--only SUBSTRING]
set -euo pipefail
cd "$(dirname "$0")/.."
configuration="${BUILD:-release}"
swift build -c "$configuration" --product tidemark >/dev/null
BIN="$(swift build -c "$configuration" --show-bin-path)/tidemark"
exec python3 scripts/hostile/campaign.py "$BIN" "$@"
