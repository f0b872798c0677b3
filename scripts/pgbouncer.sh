#!/usr/bin/env bash
# A throwaway PgBouncer in transaction pooling in front of a test PostgreSQL server, on a free
# loopback port: what managed PostgreSQL services (Supabase, RDS Proxy, Cloud SQL with PgBouncer)
# put between tidemark and the database.
#
#   scripts/pgbouncer.sh start DIR POSTGRES_URL   installs PgBouncer from Debian's packages when
#                                                 missing, starts it as an unprivileged user
#                                                 (postgres when run as root) in DIR and prints the
#                                                 URL to reach POSTGRES_URL's database through it
#   scripts/pgbouncer.sh stop DIR                 stops it and removes DIR
#
# Transaction pooling hands each transaction (or lone statement) to any server connection, so
# session state (advisory locks, SET, named prepared statements) does not survive between them.
set -euo pipefail
cd "$(dirname "$0")/.."

command="${1:?usage: scripts/pgbouncer.sh start DIR POSTGRES_URL | stop DIR}"
dir="${2:?usage: scripts/pgbouncer.sh start DIR POSTGRES_URL | stop DIR}"

# shellcheck source=lib/as-owner.sh
. scripts/lib/as-owner.sh

case "$command" in
start)
    url="${3:?usage: scripts/pgbouncer.sh start DIR POSTGRES_URL}"
    bash scripts/deps.sh pgbouncer
    bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
    # postgres://USER@HOST:PORT/DB?…
    read -r user host port db < <(python3 -c '
import sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
print(u.username or "postgres", u.hostname or "127.0.0.1", u.port or 5432, (u.path or "/postgres").lstrip("/") or "postgres")
' "$url")
    listen="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    mkdir -p "$dir"
    chmod 700 "$dir"
    printf '"%s" ""\n' "$user" >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$db = host=$host port=$port dbname=$db user=$user
* = host=$host port=$port user=$user

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 8
max_client_conn = 400
; A test process starved of CPU (the whole suite on two cores) can take long to finish a
; transaction; clients waiting for a server connection wait, rather than fail after 120 s.
query_wait_timeout = 900
ignore_startup_parameters = extra_float_digits,options,application_name
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres "$dir"; fi
    as_owner "$bin" -d "$dir/pgbouncer.ini" >&2 || { cat "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
    for _ in $(seq 1 100); do
        if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$listen" \
            2>/dev/null; then
            echo "postgres://$user@127.0.0.1:$listen/$db?sslmode=disable"
            exit 0
        fi
        sleep 0.1
    done
    echo "PgBouncer did not start listening on 127.0.0.1:$listen" >&2
    cat "$dir/pgbouncer.log" >&2 2>/dev/null || true
    exit 1
    ;;
stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
        kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$(cat "$dir/pgbouncer.pid" 2>/dev/null)" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -rf "$dir"
    ;;
*)
    echo "usage: scripts/pgbouncer.sh start DIR POSTGRES_URL | stop DIR" >&2
    exit 64
    ;;
esac
