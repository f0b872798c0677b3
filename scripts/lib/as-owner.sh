# Sourced by scripts/postgres.sh and scripts/pgbouncer.sh.
# Runs a program as the unprivileged owner of the throwaway servers: postgres when we are root
# (initdb and PgBouncer refuse to run as root), else ourselves.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    else
        "$@"
    fi
}
