#!/usr/bin/env bash
# Emulator throughput on loopback (release build): sustained v1 subscribe requests/s, v1 list
# requests/s and 1000-token IID batchAdd calls/s, measured with wrk.
#
# usage: scripts/bench-emulator.sh [--data] [--duration SECONDS] [--connections N]
#   --data   keep state in SQLite (--data DIR) instead of memory
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10
CONNECTIONS=64
WITH_DATA=0
while [ $# -gt 0 ]; do
    case "$1" in
        --data) WITH_DATA=1 ;;
        --duration) DURATION="$2"; shift ;;
        --connections) CONNECTIONS="$2"; shift ;;
        *) echo "unknown option $1" >&2; exit 1 ;;
    esac
    shift
done
REGISTRATIONS=100000

command -v wrk >/dev/null || { echo "Installing wrk ..."; apt-get install -y -qq wrk >/dev/null; }
python3 -c "import google.oauth2.service_account" 2>/dev/null || python3 -m pip install --quiet "firebase-admin>=7.7.0"
swift build -c release --product tidemark >/dev/null
BIN="$(swift build -c release --show-bin-path)/tidemark"

WORK=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
ARGS=(emulator serve --port 0 --project bench --rate-limit 0)
if [ "$WITH_DATA" = 1 ]; then ARGS+=(--data "$WORK/data"); fi
"$BIN" "${ARGS[@]}" >"$WORK/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do grep -q "Press Ctrl-C" "$WORK/serve.log" 2>/dev/null && break; sleep 0.1; done
BASE=$(grep -o 'http://[0-9.:]*' "$WORK/serve.log" | head -1)
KEY=$(sed -n 's/.*GOOGLE_APPLICATION_CREDENTIALS=//p' "$WORK/serve.log")

# Register the app instances, and get an access token the way Google's auth library does.
python3 - "$BASE" "$REGISTRATIONS" <<'PY'
import json, sys, urllib.request
base, count = sys.argv[1], int(sys.argv[2])
for start in range(0, count, 10000):
    regs = [{"token": "b%07d:APA91b%s" % (i, "x" * 140)} for i in range(start, min(count, start + 10000))]
    req = urllib.request.Request(base + "/emulator/v1/projects/bench/registrations",
                                 data=json.dumps({"registrations": regs}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req).read()
PY
export BENCH_TOKEN=$(python3 - "$KEY" <<'PY'
import sys
from google.oauth2 import service_account
from google.auth.transport.requests import Request
c = service_account.Credentials.from_service_account_file(
    sys.argv[1], scopes=["https://www.googleapis.com/auth/firebase.messaging"])
c.refresh(Request())
print(c.token)
PY
)
export BENCH_PROJECT=bench BENCH_REGISTRATIONS=$REGISTRATIONS

run() {
    local label=$1 script=$2 connections=$3
    local out
    out=$(wrk -t1 -c"$connections" -d"${DURATION}s" --latency -s "scripts/bench/$script" "$BASE" 2>&1)
    local rate p99 errors
    rate=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
    errors=$(echo "$out" | awk '/Non-2xx/ {print $5}')
    printf '%-34s %10s /s   p99 %-8s non-2xx %s\n' "$label" "$rate" "$p99" "${errors:-0}"
}

echo "tidemark emulator on $BASE ($([ "$WITH_DATA" = 1 ] && echo "SQLite --data" || echo "in memory"), $(nproc) cores, ${DURATION}s per run)"
run "v1 subscribe (create) requests" v1-subscribe.lua "$CONNECTIONS"
run "v1 list requests" v1-list.lua "$CONNECTIONS"
run "IID batchAdd (1000 tokens) calls" iid-batch-add.lua 8
curl -s "$BASE/emulator/v1/projects/bench/topics" | python3 -c \
    "import json,sys; t=json.load(sys.stdin)['topics']; print('subscriptions made:', sum(x['subscribers'] for x in t))"
