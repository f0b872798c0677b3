#!/usr/bin/env bash
# Apply benchmark (issue 5): 1,000,000 membership changes (100,000 devices x 10 topics) applied to
# the emulator with a quota of Q changes/s (FCM's 3000, and a higher Q to find the client's own
# ceiling), over the v1 and iid transports; then a 100,000-registration refresh. Release build.
#
# usage: scripts/bench-apply.sh [--devices N] [--topics N] [--qps 3000,20000] [--transports v1,iid]
set -euo pipefail
cd "$(dirname "$0")/.."
swift build -c release --product tidemark >/dev/null
BIN="$(swift build -c release --show-bin-path)/tidemark"
exec python3 scripts/bench/apply.py "$BIN" "$@"
