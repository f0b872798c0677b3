#!/usr/bin/env bash
# Builds PRODUCT… (default: tidemark) in release mode and prints the directory that holds the
# binaries; the benchmarks' one way to get a release build. Run from the repository root.
# TIDEMARK_SCRATCH: a build directory of its own (say .build-release), so a release build never
# waits for the debug one (default .build).
#
# usage: bin="$(bash scripts/lib/release-build.sh [PRODUCT…])"
set -euo pipefail
scratch="${TIDEMARK_SCRATCH:-.build}"
for product in "${@:-tidemark}"; do
    swift build -c release --scratch-path "$scratch" --product "$product" >/dev/null
done
swift build -c release --scratch-path "$scratch" --show-bin-path
