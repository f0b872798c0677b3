#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# GRDB links the system SQLite, gzip inventories the system zlib; their headers come from Debian.
# jq: the CI recipes' shell steps use it, and the recipe test runs them.
# prometheus: its promtool checks the exposition of `tidemark serve`'s /metrics, and a real Prometheus
# scrapes two replicas in the takeover check. git: manifests fetched from a repository by serve.
bash scripts/deps.sh jq prometheus git openssl
# The schema check uses jsonschema and PyYAML; the emulator's compatibility test uses the
# official firebase-admin SDK from PyPI, unmodified.
# check-jsonschema ships GitHub's workflow and action schemas and GitLab CI's, for the recipes.
if ! python3 -c "import jsonschema, yaml, firebase_admin" 2>/dev/null || ! python3 -c "import check_jsonschema" 2>/dev/null; then
    python3 -m pip install --quiet jsonschema pyyaml "firebase-admin>=7.7.0" check-jsonschema
fi

# PostgreSQL state is tested against a real server: installed from Debian's packages when missing,
# started in a temporary directory on a free loopback port as an unprivileged user, stopped on exit.
PG_DIR="$(mktemp -d /tmp/tidemark-pg-XXXXXX)"
BOUNCER_DIR="$(mktemp -d /tmp/tidemark-pgbouncer-XXXXXX)"
trap 'bash scripts/pgbouncer.sh stop "$BOUNCER_DIR"; bash scripts/postgres.sh stop "$PG_DIR"' EXIT
TIDEMARK_TEST_POSTGRES_URL="$(bash scripts/postgres.sh start "$PG_DIR")"
export TIDEMARK_TEST_POSTGRES_URL
# The same server through PgBouncer in transaction pooling, as managed PostgreSQL is often reached.
TIDEMARK_TEST_PGBOUNCER_URL="$(bash scripts/pgbouncer.sh start "$BOUNCER_DIR" "$TIDEMARK_TEST_POSTGRES_URL")"
export TIDEMARK_TEST_PGBOUNCER_URL
# With these set, the PostgreSQL and PgBouncer tests fail when no server answers (they never skip here).
export TIDEMARK_REQUIRE_POSTGRES=1
export TIDEMARK_REQUIRE_PGBOUNCER=1

# The code follows .swift-format (the formatter ships with the Swift toolchain).
swift format lint --strict -r Sources Tests Package.swift
swift build --build-tests
# Two test processes: the CLI tests wait on the processes they start (a blocking wait that holds one of
# the few threads Swift concurrency runs on), so beside them the library tests' time bounds would
# measure starvation. Each process must report a passing run.
for part in library cli; do
    if [ "$part" = library ]; then selection=(--skip TidemarkCLITests); else selection=(--filter TidemarkCLITests); fi
    swift test --skip-build "${selection[@]}" 2>&1 | tee "/tmp/tidemark-test-$part.log" \
        | grep -E "^(✘|✔ Test run|✘ Test run)|error:" || true
    if ! grep -q "✔ Test run with .* passed" "/tmp/tidemark-test-$part.log"; then
        echo "swift test failed ($part tests); the full log is in /tmp/tidemark-test-$part.log"
        exit 1
    fi
done
python3 scripts/check-schema.py
# tidemark.yaml's schema: its reference page is current, and the docs' and the chart's examples pass.
python3 scripts/tidemark-yaml-reference.py --check
python3 scripts/layers.py --check
# Every public declaration of these targets says what it is.
python3 scripts/undocumented.py TidemarkCore TidemarkRuntime TidemarkServe TidemarkAuth TidemarkStore TidemarkFCM TidemarkBackendTesting TidemarkTesting TidemarkEmulator --strict
# The CI recipes against the schemas GitHub and GitLab publish (bundled with check-jsonschema).
python3 -m check_jsonschema --builtin-schema vendor.github-workflows examples/github/tidemark.yml
python3 -m check_jsonschema --builtin-schema vendor.github-actions examples/github/actions/install-tidemark/action.yml
python3 -m check_jsonschema --builtin-schema vendor.gitlab-ci examples/gitlab/.gitlab-ci.yml
BIN="$(swift build --show-bin-path)/tidemark"
# The plan-only recipes 'tidemark init --ci ... --serve' writes, against the same schemas.
serve_recipes="$(mktemp -d)"
"$BIN" init -C "$serve_recipes/github" --ci github --serve > /dev/null
"$BIN" init -C "$serve_recipes/gitlab" --ci gitlab --serve > /dev/null
python3 -m check_jsonschema --builtin-schema vendor.github-workflows "$serve_recipes/github/.github/workflows/tidemark.yml"
python3 -m check_jsonschema --builtin-schema vendor.gitlab-ci "$serve_recipes/gitlab/.gitlab-ci.yml"
rm -rf "$serve_recipes"
TIDEMARK_BIN="$BIN" python3 Tests/compat/test_firebase_admin.py
# tidemark's HTTP client against an independent fake of FCM (not tidemark's emulator).
TIDEMARK_BIN="$BIN" python3 Tests/compat/test_fake_fcm.py
# Keyless credentials (workload identity federation, the metadata server) and proxies, end to end.
TIDEMARK_BIN="$BIN" python3 Tests/compat/test_keyless.py
# The Firestore inventory example (examples/firestore/) against a fake of Firestore's REST API.
TIDEMARK_BIN="$BIN" python3 Tests/compat/test_firestore_example.py
# The GitHub recipe's jobs run step by step against the emulator, with a fake gh (Tests/recipes/).
TIDEMARK_BIN="$BIN" python3 Tests/recipes/test_github_workflow.py
# Faults, 20 SIGKILLs with resume and concurrent applies against the emulator (scripts/resilience.sh), and
# two `tidemark serve` replicas on PostgreSQL, scraped by Prometheus, whose owner is SIGKILLed mid-apply,
# and two replicas spreading four workspaces (the survivor of a SIGKILL takes them all back).
python3 scripts/idle-serve.py "$BIN"
# The Helm chart, its rules and the dashboard, offline: helm lint and template (helm v4 pinned, from
# PyPI), the rendered objects against Kubernetes' schemas, promtool on the rendered rules, and every
# dashboard query's metrics against a live serve laid out as the chart lays it out.
python3 scripts/deploy-check.py "$BIN"
python3 scripts/resilience/run.py "$BIN" --quick
# What tidemark says while things go wrong: a closed port, an unknown host, a silent server, error
# pages, the state server stopped mid-apply; each ends in under 30 s naming the cause and the setting.
python3 scripts/failure-drills.py "$BIN"
echo "All tests passed."
