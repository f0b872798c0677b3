#!/usr/bin/env bash
# State benchmark: SQLite against PostgreSQL state on the same machine and run.
#   1. planning from state: generates 1,000,000 devices / 200 topics / ~5,300,000 memberships (1%
#      churn), moves the SQLite state into PostgreSQL with 'tidemark state migrate', and times
#      'plan --no-refresh' from each (target: PostgreSQL within 1.5x of SQLite);
#   2. apply at FCM's quota with the journal in each store (target: >= 95% of Q with PostgreSQL).
# A throwaway PostgreSQL server is started on a free loopback port (scripts/postgres.sh) and stopped.
#
# usage: scripts/bench-state.sh [DEVICES] [APPLY_DEVICES] [Q]
set -euo pipefail
cd "$(dirname "$0")/.."
devices="${1:-1000000}"
apply_devices="${2:-20000}"
quota="${3:-3000}"
# TIDEMARK_SCRATCH: a build directory of its own (say .build-release); see scripts/lib/release-build.sh.
bin="$(bash scripts/lib/release-build.sh tidemark tidemark-bench)"
work="$(mktemp -d /tmp/tidemark-bench-state-XXXXXX)"
pg="$(mktemp -d /tmp/tidemark-bench-pg-XXXXXX)"
trap 'bash scripts/postgres.sh stop "$pg"; rm -rf "$work"' EXIT
url="$(bash scripts/postgres.sh start "$pg")"
echo "Generating $devices devices in $work ..."
"$bin/tidemark-bench" generate "$work" --devices "$devices" --churn 0.01 >/dev/null
python3 - "$bin/tidemark" "$work" "$url" <<'PY'
import subprocess, sys, time
binary, work, url = sys.argv[1:4]

def timed(args, env=None):
    start = time.monotonic()
    proc = subprocess.run([binary] + args + ["-C", work], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - start
    if proc.returncode not in (0, 2):
        print(proc.stdout[-2000:], proc.stderr[-2000:]); sys.exit(1)
    return took, proc

took, _ = timed(["state", "migrate", "--to", url, "--to-workspace", "bench"])
print(f"state migrate SQLite -> PostgreSQL: {took:.1f} s")
results = {}
for name, extra in [("SQLite", []), ("PostgreSQL", ["--state", url, "--workspace", "bench"])]:
    runs = []
    for _ in range(3):
        took, proc = timed(["plan", "--no-refresh", "--detailed-exitcode"] + extra)
        runs.append(took)
    results[name] = min(runs)
    print(f"plan --no-refresh from {name}: best {min(runs):.2f} s (runs {', '.join(f'{r:.2f}' for r in runs)}); "
          f"verdict: {proc.stdout.splitlines()[0]}")
ratio = results["PostgreSQL"] / results["SQLite"]
print(f"PostgreSQL / SQLite: {ratio:.2f}x (target <= 1.5x) -> {'OK' if ratio <= 1.5 else 'MISSED'}")
PY
echo
echo "Apply at Q=$quota: $apply_devices devices x 10 topics, journal in SQLite, then in PostgreSQL"
python3 scripts/bench/apply.py "$bin/tidemark" --devices "$apply_devices" --topics 10 --qps "$quota" --transports v1 \
    | grep -E "^\| v1|subscribed in"
python3 scripts/bench/apply.py "$bin/tidemark" --devices "$apply_devices" --topics 10 --qps "$quota" --transports v1 \
    --state "$url" | grep -E "^\| v1|subscribed in"
