#!/usr/bin/env bash
# Debian packages the build links: the system SQLite (GRDB) and zlib (gzip inventories).
# Installs only what is missing; used by scripts/demo.sh and scripts/test.sh, which also asks for
# the tools its tests run (given as arguments).
set -euo pipefail
for package in libsqlite3-dev zlib1g-dev "$@"; do
    if ! dpkg -s "$package" >/dev/null 2>&1; then
        echo "Installing $package ..." >&2
        if [ "$(id -u)" -eq 0 ]; then apt-get update -qq >&2 && apt-get install -y -qq "$package" >&2
        else sudo apt-get update -qq >&2 && sudo apt-get install -y -qq "$package" >&2; fi
    fi
done
