#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests and benchmarks, on a free loopback port.
#
#   scripts/postgres.sh start DIR   installs PostgreSQL from Debian's packages when missing, creates a
#                                   cluster in DIR as an unprivileged user (postgres when run as root),
#                                   starts it on 127.0.0.1 and prints its URL on stdout
#   scripts/postgres.sh stop DIR    stops it and removes DIR
#
# The server trusts connections from 127.0.0.1 only and listens nowhere else.
set -euo pipefail

command="${1:?usage: scripts/postgres.sh start|stop DIR}"
dir="${2:?usage: scripts/postgres.sh start|stop DIR}"

find_bin() {
    for candidate in /usr/lib/postgresql/*/bin; do
        if [ -x "$candidate/pg_ctl" ]; then echo "$candidate"; return 0; fi
    done
    if command -v pg_ctl >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v pg_ctl)")"; return 0; fi
    return 1
}

# shellcheck source=lib/as-owner.sh
. "$(dirname "$0")/lib/as-owner.sh"

case "$command" in
start)
    if ! bin="$(find_bin)"; then
        echo "Installing PostgreSQL from Debian's packages ..." >&2
        if [ "$(id -u)" -eq 0 ]; then
            apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        else
            sudo apt-get update -qq >&2 && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        fi
        bin="$(find_bin)"
    fi
    if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /bin/sh postgres
    fi
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; fi
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    as_owner "$bin/initdb" -D "$dir/data" -U tidemark --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/data -c max_connections=200" start >&2 || {
        cat "$dir/data/server.log" >&2; exit 1; }
    echo "postgres://tidemark@127.0.0.1:$port/postgres?sslmode=disable"
    ;;
stop)
    if bin="$(find_bin)" && [ -d "$dir/data" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    fi
    rm -rf "$dir"
    ;;
*)
    echo "usage: scripts/postgres.sh start|stop DIR" >&2
    exit 64
    ;;
esac
