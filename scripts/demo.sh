#!/usr/bin/env bash
# The main job on the demo manifests, against the embedded backend (no account needed):
# validate, plan, apply, and plan again to show there is nothing left to do.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
swift build --product tidemark
tidemark=".build/debug/tidemark"
set -x
"$tidemark" validate
"$tidemark" plan --detailed-exitcode || [ $? -eq 2 ]
"$tidemark" apply --auto-approve
"$tidemark" plan --detailed-exitcode
