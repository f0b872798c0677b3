#!/usr/bin/env bash
# Inventory benchmark: the same 1,000,000 devices read from a CSV file, a gzip CSV and a PostgreSQL
# table (a 'postgres:' source in tidemark.yaml, streamed through a server-side cursor), each planned
# with 'plan --no-refresh' against the same state. Targets (issue 15): PostgreSQL adds <= 3 s over the
# CSV run, with peak memory <= 1.5x the CSV run's.
# A throwaway PostgreSQL server is started on a free loopback port (scripts/postgres.sh) and stopped.
#
# usage: scripts/bench-inventory.sh [DEVICES] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
devices="${1:-1000000}"
runs="${2:-3}"
bash scripts/deps.sh
# TIDEMARK_SCRATCH: a build directory of its own (say .build-release); see scripts/lib/release-build.sh.
bin="$(bash scripts/lib/release-build.sh tidemark tidemark-bench)"
work="$(mktemp -d /tmp/tidemark-bench-inventory-XXXXXX)"
pg="$(mktemp -d /tmp/tidemark-bench-pg-XXXXXX)"
trap 'bash scripts/postgres.sh stop "$pg"; rm -rf "$work"' EXIT
url="$(bash scripts/postgres.sh start "$pg")"
echo "Generating $devices devices in $work/csv ..."
"$bin/tidemark-bench" generate "$work/csv" --devices "$devices" --churn 0.01
echo "Loading them into PostgreSQL (bench_tokens) ..."
psql "$url" -v ON_ERROR_STOP=1 -q <<SQL
CREATE TABLE bench_tokens (device_id text primary key, token text not null, region text, team text,
    lang text, cohort text, platform text, active boolean not null default true);
\copy bench_tokens (device_id, token, region, team, lang, cohort, platform) from '$work/csv/manifests/devices.csv' csv header
VACUUM ANALYZE bench_tokens;
SQL
# The same project three ways: the CSV, the CSV gzipped, and the table.
for variant in gz pg; do
    mkdir -p "$work/$variant/manifests" "$work/$variant/.tidemark"
    cp "$work/csv/.tidemark/state.db" "$work/$variant/.tidemark/state.db"
done
gzip -c "$work/csv/manifests/devices.csv" > "$work/gz/manifests/devices.csv.gz"
sed 's/devices\.csv/devices.csv.gz/' "$work/csv/manifests/topics.yaml" > "$work/gz/manifests/topics.yaml"
sed '1,2d' "$work/csv/manifests/topics.yaml" > "$work/pg/manifests/topics.yaml"
cat > "$work/pg/tidemark.yaml" <<YAML
inventory:
  - name: app-db
    postgres:
      url_env: BENCH_APP_DATABASE_URL
      query: select device_id, token, region, team, lang, cohort, platform from bench_tokens where active
YAML
BENCH_APP_DATABASE_URL="$url" python3 - "$bin/tidemark" "$work" "$runs" <<'PY'
import os, subprocess, sys, time
binary, work, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])

def run(variant):
    """One 'plan --no-refresh' in its own process: wall time and that process's peak RSS."""
    start = time.monotonic()
    proc = subprocess.Popen([binary, "plan", "--no-refresh", "--detailed-exitcode", "-C", os.path.join(work, variant)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    took = time.monotonic() - start
    # communicate() reaped it; resource usage of this child alone comes from wait4 on a fresh run below.
    if proc.returncode not in (0, 2):
        print(out[-2000:], err[-2000:]); sys.exit(1)
    return took, out

def peak(variant):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1); os.dup2(devnull, 2)
        os.execv(binary, [binary, "plan", "--no-refresh", "-C", os.path.join(work, variant)])
    _, status, usage = os.wait4(pid, 0)
    return usage.ru_maxrss / 1024  # MiB

results = {}
verdicts = {}
for variant, label in [("csv", "CSV file"), ("gz", "gzip CSV"), ("pg", "PostgreSQL query")]:
    times = []
    for _ in range(runs):
        took, out = run(variant)
        times.append(took)
    memory = peak(variant)
    results[variant] = (min(times), memory)
    verdicts[variant] = out.splitlines()[0] if out else ""
    print(f"{label:17} best {min(times):6.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}), peak {memory:7.0f} MiB; {verdicts[variant]}")
csv_time, csv_mem = results["csv"]
pg_time, pg_mem = results["pg"]
same = verdicts["csv"] == verdicts["pg"] == verdicts["gz"]
print(f"PostgreSQL adds {pg_time - csv_time:+.2f} s (target <= 3 s) -> {'OK' if pg_time - csv_time <= 3 else 'MISSED'}")
print(f"PostgreSQL memory {pg_mem / csv_mem:.2f}x the CSV run (target <= 1.5x) -> {'OK' if pg_mem <= 1.5 * csv_mem else 'MISSED'}")
print(f"Same plan from all three: {'yes' if same else 'NO'}")
if not same: sys.exit(1)
PY
