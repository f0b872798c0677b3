"""Change-driven reconcile at scale (issue 34), release build, against the HTTP emulator.

A PostgreSQL inventory table (its own server, started here) of DEVICES devices in 40 cohorts and
TOPICS topics, each taking one cohort (TOPICS / 40 topics a device: 5 with 200 topics, about
5,000,000 memberships at a million), converged through the emulator's admin API and
`tidemark import` into PostgreSQL state; then `tidemark serve` with an interval of an hour, following
the table through `changes` and `listen` at a write quota of QPS, reading it in full (a resync,
compared with what the batches built) every RESYNC:

1. latency: CHANGES single-row changes (inserts and cohort updates), one every EVERY seconds: the
   time from each commit to the device's topics in the emulator being exactly the declared ones;
2. idle: serve's CPU over IDLE seconds with nothing changing;
3. memory: serve's resident memory, sampled through every phase, split into the samples taken while
   a whole reconcile (a resync) ran and those between resyncs; over SOAK seconds of SOAK_RATE
   changes a second, the growth between the first and last minute;
4. burst: BURST rows' cohort changed in one statement: how long until every one is applied, against
   the quota (each device leaves TOPICS/40 topics and joins as many);
5. divergences: every resync's verdict in serve's log, and tidemark_resync_divergences_total, after
   a last resync asked for at the end.

Each figure is printed with its target, next to a whole reconcile's duration (what every change
cost before serve planned changed devices on their own).

usage: python3 scripts/bench/changes.py BINARY [--devices 1000000] [--topics 200] [--changes 200]
           [--every 2] [--idle 300] [--soak 0] [--soak-rate 10] [--burst 100000] [--qps 3000]
           [--resync 15m] [--keep DIR]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Emulator, stop_process, tidemark  # noqa: E402

PROJECT = "bench-changes"
COHORTS = 40
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def token_sql(expression):
    """SQL for the harness's token of the integer `expression` (harness.token(i, prefix="chg"))."""
    return "'chg' || lpad((%s)::text, 7, '0') || ':APA91b' || repeat('T', 140)" % expression


def token(i):
    return "chg%07d:APA91b%s" % (i, "T" * 140)


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Postgres:
    """A PostgreSQL server of its own (scripts/postgres.sh), in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-bench-pg-")
        out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "postgres.sh"), "start", self.dir],
                             check=True, capture_output=True, text=True).stdout
        self.url = out.strip().splitlines()[-1]

    def sql(self, statement):
        out = subprocess.run(["psql", self.url, "-qAt", "-v", "ON_ERROR_STOP=1", "-c", statement], check=True,
                             capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line]

    def stop(self):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "postgres.sh"), "stop", self.dir],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--devices", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--soak", type=int, default=0, help="seconds of --soak-rate changes a second (30 min: 1800)")
    parser.add_argument("--soak-rate", type=float, default=10.0)
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--qps", type=int, default=3000)
    parser.add_argument("--resync", default="15m", help="postgres.resync of the followed source")
    parser.add_argument("--keep", help="a directory that keeps serve's log and the memory samples (seconds, phase, MiB)")
    args = parser.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    per_device = max(1, args.topics // COHORTS)

    work = tempfile.mkdtemp(prefix="tm-bench-changes-")
    postgres = Postgres()
    serve = None
    log_path = os.path.join(work, "serve.log")
    results = []

    def report(name, value, target, ok):
        results.append((name, value, target, ok))
        print("  %-44s %-22s target %-14s %s" % (name, value, target, "met" if ok else "MISSED"), flush=True)

    try:
        with Emulator(args.binary, PROJECT, "--auto-register", "--rate-limit", str(args.qps)) as emulator:
            print("change-driven reconcile: %d devices, %d topics (%d a device, %d memberships), inventory and "
                  "state in PostgreSQL, quota %d/s, release build" % (
                      args.devices, args.topics, per_device, args.devices * per_device, args.qps), flush=True)
            started = time.monotonic()
            postgres.sql("CREATE TABLE app_devices (device_id text PRIMARY KEY, token text NOT NULL, "
                         "platform text NOT NULL, cohort int NOT NULL, "
                         "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())")
            postgres.sql("INSERT INTO app_devices (device_id, token, platform, cohort) SELECT 'd' || i, %s, "
                         "CASE WHEN i %% 3 = 0 THEN 'ios' ELSE 'android' END, i %% %d "
                         "FROM generate_series(0, %d) i" % (token_sql("i"), COHORTS, args.devices - 1))
            postgres.sql("CREATE INDEX app_devices_updated ON app_devices (updated_at)")
            postgres.sql("ANALYZE app_devices")
            os.makedirs(os.path.join(work, "manifests"))
            with open(os.path.join(work, "tidemark.yaml"), "w") as f:
                f.write("project: %s\nbackend: emulator\nrefresh: none\nqps: %d\nstate: %s\n"
                        "serve: {interval: 1h}\n"
                        "inventory:\n  - name: app\n    postgres:\n      url_env: BENCH_INVENTORY_URL\n"
                        "      query: SELECT device_id, token, platform, cohort FROM app_devices\n"
                        "      changes: {query: 'SELECT device_id, updated_at FROM app_devices', cursor: updated_at}\n"
                        "      listen: bench_devices\n      resync: %s\n" % (PROJECT, args.qps, postgres.url, args.resync))
            with open(os.path.join(work, "manifests", "topics.yaml"), "w") as f:
                f.write("topics:\n")
                for t in range(args.topics):
                    f.write("  - name: bench-%d\n    members: [{selector: {cohort: '%d'}}]\n" % (t, t % COHORTS))
            env = dict(emulator.env, BENCH_INVENTORY_URL=postgres.url)
            _, triggers, _ = tidemark(args.binary, work, ["inventory", "triggers", "app", "--table", "app_devices",
                                                           "--id-column", "device_id"], env)
            subprocess.run(["psql", postgres.url, "-q", "-v", "ON_ERROR_STOP=1"], input=triggers, text=True,
                           check=True)
            # Converged fast: subscribed through the admin API, then adopted into state by import.
            emulator.admin("PUT", "config", {"rate_limit": {"per_second": 0}})
            for t in range(args.topics):
                cohort = t % COHORTS
                members = [token(i) for i in range(cohort, args.devices, COHORTS)]
                for start in range(0, len(members), 50_000):
                    emulator.project_admin("POST", "topics/bench-%d/subscribers" % t,
                                           {"tokens": members[start:start + 50_000]})
            tidemark(args.binary, work, ["import"], env)
            emulator.admin("PUT", "config", {"rate_limit": {"per_second": args.qps}})
            code, out, err = tidemark(args.binary, work, ["plan", "--detailed-exitcode"], env, check=False)
            print("set up in %.0f s; the first plan exits %d (0: converged)" % (time.monotonic() - started, code),
                  flush=True)

            log = open(log_path, "w")
            serve = subprocess.Popen([args.binary, "serve", "-C", work, "--listen", "127.0.0.1:0"], env=env,
                                     stdout=log, stderr=subprocess.STDOUT)

            def text():
                with open(log_path) as f:
                    return f.read()

            def reconciles():
                return [float(s) for s in re.findall(r"reconcile workspace=\S+ result=\S+ seconds=([\d.]+)", text())]

            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not reconciles():
                if serve.poll() is not None:
                    raise RuntimeError("serve exited:\n" + text()[-3000:])
                time.sleep(0.2)
            first = reconciles()
            print("serve's first reconcile (a full read and plan): %.2f s; resident memory %.0f MiB" % (
                first[0] if first else float("nan"), rss_mib(serve.pid)), flush=True)
            time.sleep(2)

            # Serve's reconcile lines, each with the span in which it was written, and memory samples: a
            # sample taken while a whole reconcile (a resync) ran counts for the resync's peak.
            seen, samples, position = [], [], [0, time.monotonic()]

            def poll_log():
                with open(log_path, "rb") as f:
                    f.seek(position[0])
                    chunk = f.read()
                end = chunk.rfind(b"\n")
                now = time.monotonic()
                if end >= 0:
                    position[0] += end + 1
                    for line in chunk[:end].decode(errors="replace").splitlines():
                        if re.search(r"reconcile workspace=\S+ result=", line):
                            seen.append((position[1], now, line))
                position[1] = now

            def sample(phase):
                poll_log()
                samples.append((time.monotonic(), phase, rss_mib(serve.pid)))
                if args.keep:
                    with open(os.path.join(args.keep, "samples.tsv"), "a") as f:
                        f.write("%.1f\t%s\t%.0f\n" % samples[-1])

            def resync_spans():
                spans = []
                for after, before, line in seen:
                    took = re.search(r"seconds=([\d.]+)", line)
                    if took and "planned on their own" not in line:
                        spans.append((after - float(took.group(1)) - 0.5, before + 0.5))
                return spans

            def in_resync(t):
                return any(start <= t <= end for start, end in resync_spans())

            poll_log()

            def topics_of(i):
                try:
                    answer = emulator.project_admin("GET", "registrations/%s" % urllib.parse.quote(token(i)))
                except urllib.error.HTTPError:
                    return None
                return set(answer.get("topics", []))

            def wanted(cohort):
                return set("bench-%d" % t for t in range(args.topics) if t % COHORTS == cohort)

            # 1. latency
            latencies = []
            next_id = args.devices
            for n in range(args.changes):
                tick = time.monotonic()
                if n % 2 == 0:
                    device, cohort = next_id, n % COHORTS
                    next_id += 1
                    postgres.sql("INSERT INTO app_devices (device_id, token, platform, cohort) VALUES "
                                 "('d%d', %s, 'ios', %d)" % (device, token_sql(str(device)), cohort))
                else:
                    device = (n * 7919) % args.devices
                    cohort = (device % COHORTS + 1 + n) % COHORTS
                    postgres.sql("UPDATE app_devices SET cohort = %d, updated_at = clock_timestamp() "
                                 "WHERE device_id = 'd%d'" % (cohort, device))
                committed = time.monotonic()
                expected = wanted(cohort)
                while time.monotonic() - committed < 60 and topics_of(device) != expected:
                    time.sleep(0.01)
                latencies.append(time.monotonic() - committed)
                sample("latency")
                time.sleep(max(0.0, args.every - (time.monotonic() - tick)))
            cycles = reconciles()[1:]
            batches = [float(s) for s in re.findall(
                r"reconcile workspace=\S+ result=success seconds=([\d.]+) [^:]*: \d+ changed devices? planned on their own",
                text())]
            print("latency phase: %d changes, %d reconciles, %d of them batches of changed devices planned on their "
                  "own (median %.3f s, max %.3f s); a whole reconcile takes %.2f s" % (
                      len(latencies), len(cycles), len(batches), percentile(batches, 0.5),
                      max(batches) if batches else float("nan"), first[0] if first else float("nan")), flush=True)
            report("commit to FCM, median", "%.2f s" % percentile(latencies, 0.5), "<= 1 s",
                   percentile(latencies, 0.5) <= 1)
            report("commit to FCM, p99", "%.2f s" % percentile(latencies, 0.99), "<= 3 s",
                   percentile(latencies, 0.99) <= 3)

            # 2. idle
            time.sleep(5)
            poll_log()
            before, wall = cpu_seconds(serve.pid), time.monotonic()
            while time.monotonic() - wall < args.idle:
                time.sleep(1)
                sample("idle")
            idle = (cpu_seconds(serve.pid) - before) / (time.monotonic() - wall)
            whole = [1 for start, end in resync_spans() if end > wall]
            report("idle CPU over %d s" % args.idle, "%.2f%% of a core" % (100 * idle), "<= 1%", idle <= 0.01)
            if whole:
                print("  (a resync ran in the idle window: the figure includes it)", flush=True)

            # 3. memory, and the soak
            if args.soak:
                start = time.monotonic()
                end = start + args.soak
                n = 0
                while time.monotonic() < end:
                    device = (n * 104_729) % args.devices
                    postgres.sql("UPDATE app_devices SET cohort = (cohort + 1) %% %d, updated_at = clock_timestamp() "
                                 "WHERE device_id = 'd%d'" % (COHORTS, device))
                    n += 1
                    sample("soak")
                    time.sleep(max(0.0, start + n / args.soak_rate - time.monotonic()))
                poll_log()
                soaked = [(t, rss) for t, phase, rss in samples if phase == "soak" and not in_resync(t)]
                first_minute = [rss for t, rss in soaked if t - start < 60]
                last_minute = [rss for t, rss in soaked if end - t < 60]
                growth = max(last_minute or [0]) - max(first_minute or [0])
                report("memory growth over the %d s soak" % args.soak, "%+.0f MiB" % growth, "none (<= 50 MiB)",
                       growth <= 50)
                print("  (%d changes in the soak, %.1f a second; %d resyncs in it)" % (
                    n, n / args.soak, sum(1 for a, b in resync_spans() if start < a < end)), flush=True)
                # Where memory settles after each whole reconcile: a step at each one (a heap left larger
                # by the read) or growth between them (something kept per change) tell different stories.
                settled = []
                for a, b in resync_spans():
                    if start < a < end:
                        after = [rss for t, rss in soaked if b < t < min(b + 120, end)]
                        if after:
                            settled.append("%.0f" % max(after))
                print("  (resident memory: %.0f MiB in the soak's first minute; in the 2 minutes after each "
                      "resync in it: %s MiB)" % (max(first_minute or [0]), ", ".join(settled) or "none"), flush=True)

            # 4. burst
            burst = min(args.burst, args.devices)
            traffic_before = emulator.traffic().get("tokens_changed", 0)
            postgres.sql("UPDATE app_devices SET cohort = (cohort + 1) %% %d, updated_at = clock_timestamp() "
                         "WHERE device_id IN (SELECT 'd' || i FROM generate_series(0, %d) i)" % (COHORTS, burst - 1))
            committed = time.monotonic()
            changes = burst * per_device * 2
            checked = [(i * 7) % burst for i in range(20)] + [burst - 1]
            # The clock stops when the emulator has counted every change; then a plan checks nothing is left.
            drained = None
            while time.monotonic() - committed < 3600:
                if emulator.traffic().get("tokens_changed", 0) - traffic_before >= changes:
                    drained = time.monotonic() - committed
                    break
                sample("burst")
                time.sleep(0.2)
            cohorts = dict(line.split("|") for line in postgres.sql(
                "SELECT device_id, cohort FROM app_devices WHERE device_id IN (%s)" % ", ".join(
                    "'d%d'" % i for i in checked)))
            exact = all(topics_of(i) == wanted(int(cohorts["d%d" % i])) for i in checked)
            code, _, _ = tidemark(args.binary, work, ["plan", "--detailed-exitcode"], env, check=False)
            changed = emulator.traffic().get("tokens_changed", 0) - traffic_before
            rate = changes / drained if drained else 0.0
            report("burst of %d rows (%d changes)" % (burst, changes),
                   "%.0f s, %.0f/s" % (drained or float("nan"), rate), ">= %d/s" % int(0.95 * args.qps),
                   rate >= 0.95 * args.qps and exact and code == 0)
            print("  (the emulator counted %d tokens changed; the sampled devices are %s and the next plan exits %d)"
                  % (changed, "exact" if exact else "NOT exact", code), flush=True)

            # 5. divergences: a resync asked for now (a whole reconcile compares with what the batches built)
            tidemark(args.binary, work, ["reconcile", "default", "--timeout", "10m"], env, check=False)
            sample("resync")

            # 3. memory, split by the samples taken while a resync ran
            poll_log()
            between = [(rss, phase) for t, phase, rss in samples if not in_resync(t)]
            during = [rss for t, phase, rss in samples if in_resync(t)]
            for phase in ("latency", "idle", "soak", "burst"):
                of_phase = [rss for rss, p in between if p == phase]
                if of_phase:
                    print("  resident memory, %s phase: max %.0f MiB over %d samples" % (
                        phase, max(of_phase), len(of_phase)), flush=True)
            peak = max(rss for rss, _ in between)
            report("resident memory between resyncs", "%.0f MiB" % peak, "<= 1536 MiB", peak <= 1536)
            if during:
                report("resident memory at a resync's peak", "%.0f MiB" % max(during), "<= 2560 MiB",
                       max(during) <= 2560)
            resyncs = re.findall(r"resync matched the batches|resync: \d+ devices? the changes had not brought", text())
            print("  resyncs: %d (%s)" % (len(resyncs), "; ".join(sorted(set(resyncs)))), flush=True)
            with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % re.search(
                    r"listening on http://127\.0\.0\.1:(\d+)", text()).group(1), timeout=10) as response:
                metrics = response.read().decode()
            divergences = re.findall(r"^tidemark_resync_divergences_total\{[^}]*\} (\S+)", metrics, re.M)
            if divergences:
                total = sum(float(v) for v in divergences)
                report("resync divergences", "%d" % total, "0", total == 0)
            else:
                print("  resync divergences: not counted (this serve reads in full at every reconcile: no resync)",
                      flush=True)
        print()
        missed = [r for r in results if not r[3]]
        print("%d of %d targets met" % (len(results) - len(missed), len(results)))
    finally:
        if serve is not None:
            stop_process(serve, 30)
        postgres.stop()
        if args.keep and os.path.exists(log_path):
            shutil.copy(log_path, os.path.join(args.keep, "serve.log"))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
