"""Resilience checks for `tidemark apply` against the emulator (issue 5). Each prints what it tried
and what it found, and the script exits 1 if any finds a lost or extra membership or a replay.

  faults     30% 429s, 5% 500s, 5% per-token INTERNAL and added latency, over v1 and iid:
             one apply converges with no missing and no extra membership (checked via the admin API).
  kills      apply killed with SIGKILL at 20 random moments and rerun each time: it converges, and
             no operation the journal had finished is ever sent again (the emulator records changes).
  revert     an apply adding a topic is killed part-way, the change is reverted, and the next apply
             leaves no membership that is not declared (3 kill moments).
  narrow     an apply narrowing an authoritative topic is killed while its unsubscribes are in flight
             (FCM carries them out), the change is reverted, and the next apply loses no membership
             (v1, iid, and iid with PostgreSQL state).
  concurrent two applies at once: one proceeds, the other fails at once naming the lock holder.
  shared-quota (needs TIDEMARK_TEST_POSTGRES_URL) two applies in different PostgreSQL workspaces
             against one emulator project with quota Q: no 429s, and together at least 90% of Q.
  serve-takeover (needs TIDEMARK_TEST_POSTGRES_URL) two `tidemark serve` replicas on PostgreSQL state,
             scraped by a real Prometheus: the owner is SIGKILLed in the middle of an apply, the other
             takes the workspace over within the claim's expiry, finishes from the journal, sends no
             journaled change again, and the end state is exact; a row inserted into the PostgreSQL
             inventory table is then subscribed within an interval and one reconcile.
  state-mv   `tidemark state mv` SIGKILLed at random moments between two workspaces of a SQLite file
             (and from SQLite to PostgreSQL when a server is given) and run again: the topic is always in
             exactly one state, nothing is sent to FCM, and the next plans on both sides show no changes.
  serve-spread (needs TIDEMARK_TEST_POSTGRES_URL) two `tidemark serve` replicas and four workspaces on
             PostgreSQL state: the first, alone, owns all four; the second, started later, gets two by
             handovers between reconciles (no reconcile at once); SIGKILLed, its two go back to the first
             within the claim's expiry and the grace, and every workspace ends exact.
  serve-alerts (needs TIDEMARK_TEST_POSTGRES_URL) two `tidemark serve` replicas on PostgreSQL state
             (through a TCP relay that can be cut), the emulator and a real Prometheus loaded with
             examples/serve/alerts.yml: no alert pending or firing while healthy (first reconcile
             included) nor while suspended; FCM answering 503 to everything has TidemarkFCMFailing
             pending within 2 minutes, /status degraded and a warning in the log; the state store cut
             off (every replica up, none can claim) fires TidemarkNoOwner; every alert clears within
             2 minutes of each recovery.
"""

import argparse
import base64
import json
import re
import socket
import urllib.parse
import urllib.request
import os
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Emulator, Prometheus, make_project, stop_process, tidemark, token  # noqa: E402

PROJECT = "resilience"


def write_drift_topic(work, devices):
    """An authoritative topic declared for the even devices only; the emulator is seeded with odd ones too."""
    with open(os.path.join(work, "manifests", "drift.yaml"), "w") as f:
        f.write("topics:\n  - name: drift\n    mode: authoritative\n    members:\n")
        for i in range(0, devices, 2):
            f.write("      - device: d%07d\n" % i)
        f.write("groups:\n  - notification_key_name: family\n    members: [{device: d0000000}, {device: d0000001}]\n")


def expected_members(devices, topics):
    want = {"bench-%d" % t: set(token(i) for i in range(devices)) for t in range(topics)}
    want["drift"] = set(token(i) for i in range(0, devices, 2))
    return want


def compare(emulator, want):
    """(missing, extra) memberships over the declared topics, read through the admin API."""
    missing = extra = 0
    for topic, members in want.items():
        have = set(emulator.subscribers(topic))
        missing += len(members - have)
        extra += len(have - members)
    return missing, extra


def faults(binary, transport, devices=1000, topics=4):
    work = tempfile.mkdtemp(prefix="tm-faults-")
    flags = ["--fault-429", "0.3", "--fault-500", "0.05", "--fault-token-internal", "0.05", "--latency", "5",
             "--seed", "7"]
    try:
        with Emulator(binary, PROJECT, *flags) as emulator:
            tokens = make_project(work, PROJECT, devices, topics, transport)
            write_drift_topic(work, devices)
            emulator.register(tokens)
            # Drift: every odd device subscribed itself to the authoritative topic.
            emulator.project_admin("POST", "topics/drift/subscribers", {"tokens": tokens[1::2]})
            want = expected_members(devices, topics)
            print("faults/%s: %d devices, %d changes to make, with %s" % (
                transport, devices, devices * topics + devices // 2 + devices // 2, " ".join(flags)), flush=True)
            started = time.monotonic()
            status, out, err = tidemark(binary, work, ["apply", "--auto-approve"], emulator.env, check=False)
            traffic = emulator.traffic()
            emulator.admin("PATCH", "config", {"faults": {}})
            missing, extra = compare(emulator, want)
            members = set(next((g["members"] for g in emulator.project_admin("GET", "groups")["groups"]
                                 if g["name"] == "family"), []))
            plan_status, plan_out, _ = tidemark(binary, work, ["plan", "--detailed-exitcode"], emulator.env, check=False)
            print("  apply exit %d in %.1f s; emulator saw %d requests, %d answered 429, %d faults" % (
                status, time.monotonic() - started, traffic["requests"], traffic["rate_limited"], traffic["faults"]))
            print("  found: %d missing, %d extra memberships; group family has %d of 2 members; next plan exit %d" % (
                missing, extra, len(members & {token(0), token(1)}), plan_status))
            ok = status == 0 and missing == 0 and extra == 0 and members == {token(0), token(1)} and plan_status == 0
            if not ok:
                print(out[-1500:] + err[-1500:])
            return ok
    finally:
        shutil.rmtree(work, ignore_errors=True)


JOURNAL_MAGIC = b"tidemark-journal-plan-1\n"


def journal_operations(db, blob):
    """The operations of a journal's plan: whole JSON, or JournalPlan's compact form (the plan's JSON
    without tokens, then per operation a count and token ids of the tokens table, little-endian)."""
    blob = bytes(blob)
    if not blob.startswith(JOURNAL_MAGIC):
        return json.loads(blob)["operations"]
    offset = len(JOURNAL_MAGIC)
    (length,) = struct.unpack_from("<I", blob, offset)
    offset += 4
    operations = json.loads(blob[offset:offset + length])["operations"]
    offset += length
    tokens = dict(db.execute("SELECT id, token FROM tokens"))
    for op in operations:
        (count,) = struct.unpack_from("<I", blob, offset)
        offset += 4
        ids = struct.unpack_from("<%dI" % count, blob, offset)
        offset += 4 * count
        op["tokens"] = [tokens[i] for i in ids]
    if offset != len(blob):
        raise ValueError("the journal's plan has bytes after its last operation")
    return operations


def journal(work):
    """(apply id, plan operations, {index: tokens journaled as sent}) of the unfinished apply, or None.

    A finished operation counts all its tokens; one that got part of the way (apply_progress) its
    journaled prefix."""
    path = os.path.join(work, ".tidemark", "state.db")
    if not os.path.exists(path):
        return None
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        row = db.execute("SELECT id, plan FROM applies WHERE status = 'running' ORDER BY started_at DESC LIMIT 1"
                         ).fetchone()
        if row is None:
            return None
        operations = journal_operations(db, row[1])
        done = {}
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'apply_progress'").fetchone():
            for index, tokens in db.execute("SELECT idx, tokens_done FROM apply_progress WHERE apply_id = ?",
                                            (row[0],)):
                done[index] = tokens
        for (index,) in db.execute("SELECT idx FROM apply_operations WHERE apply_id = ?", (row[0],)):
            done[index] = len(operations[index]["tokens"])
        return row[0], operations, done
    except sqlite3.OperationalError:
        return None
    finally:
        db.close()


def kills(binary, rounds=20, devices=600, topics=30, seed=5):
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="tm-kills-")
    try:
        with Emulator(binary, PROJECT, "--record-changes", "--latency", "15") as emulator:
            tokens = make_project(work, PROJECT, devices, topics, "v1")
            emulator.register(tokens)
            want = expected_members(devices, topics)
            want.pop("drift")
            print("kills: %d devices x %d topics (%d changes), apply killed with SIGKILL %d times" % (
                devices, topics, devices * topics, rounds), flush=True)
            seen = 0
            replays = 0
            kills_done = 0
            resumed = 0
            for k in range(rounds + 10):
                before = journal(work)
                process = subprocess.Popen([binary, "apply", "--auto-approve", "--parallelism", "2", "--qps", "600",
                                            "-C", work], env=emulator.env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
                killed = False
                if kills_done < rounds:
                    time.sleep(rng.uniform(0.3, 2.0))
                    if process.poll() is None:
                        process.send_signal(signal.SIGKILL)
                        killed = True
                        kills_done += 1
                out, err = process.communicate()
                if "Resuming the apply" in err:
                    resumed += 1
                changes = emulator.project_admin("GET", "changes?after=%d" % seen)["changes"]
                if changes:
                    seen = changes[-1]["sequence"]
                if before:
                    _, operations, done = before
                    finished = {}
                    for index, sent in done.items():
                        op = operations[index]
                        for t in op["tokens"][:sent]:
                            finished[(op["kind"], op["target"], t)] = index
                    for change in changes:
                        for t in change["tokens"]:
                            if (change["operation"], change["topic"], t) in finished:
                                replays += 1
                if not killed:
                    if process.returncode != 0:
                        print("  an apply that was not killed exited %d:\n%s" % (process.returncode, err[-1500:]))
                        return False
                    if kills_done >= rounds:
                        break
            missing, extra = compare(emulator, want)
            plan_status, _, _ = tidemark(binary, work, ["plan", "--detailed-exitcode"], emulator.env, check=False)
            traffic = emulator.traffic()
            print("  %d kills, %d resumed runs; %d requests in all, %d subscription changes sent for %d needed" % (
                kills_done, resumed, traffic["requests"], traffic["tokens_changed"], devices * topics))
            print("  found: %d missing, %d extra memberships; %d journaled changes sent again; "
                  "next plan exit %d" % (missing, extra, replays, plan_status))
            return kills_done >= rounds and missing == 0 and extra == 0 and replays == 0 and plan_status == 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def revert(binary, rounds=3, devices=600, seed=11):
    """Kill an apply that adds a topic, revert the manifests, apply again: nothing undeclared stays."""
    rng = random.Random(seed)
    results = []
    for round in range(rounds):
        work = tempfile.mkdtemp(prefix="tm-revert-")
        try:
            with Emulator(binary, PROJECT, "--latency", "15") as emulator:
                tokens = make_project(work, PROJECT, devices, 2, "v1")
                emulator.register(tokens)
                tidemark(binary, work, ["apply", "--auto-approve"], emulator.env)
                launch = os.path.join(work, "manifests", "launch.yaml")
                with open(launch, "w") as f:
                    f.write("topics:\n  - name: launch\n    members: [{selector: {fleet: all}}]\n")
                process = subprocess.Popen([binary, "apply", "--auto-approve", "--qps", "600", "-C", work],
                                           env=emulator.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                time.sleep(rng.uniform(0.4, 1.2))
                killed = process.poll() is None
                if killed:
                    process.send_signal(signal.SIGKILL)
                process.communicate()
                made = len(emulator.subscribers("launch"))
                os.remove(launch)
                status, _, err = tidemark(binary, work, ["apply", "--auto-approve"], emulator.env, check=False)
                left = len(emulator.subscribers("launch"))
                missing, extra = compare(emulator, expected_members(devices, 2) | {"drift": set()})
                plan_status, _, _ = tidemark(binary, work, ["plan", "--detailed-exitcode"], emulator.env, check=False)
                print("revert %d: killed %s with %d of %d 'launch' memberships made; reverted apply exit %d; "
                      "%d undeclared left, %d missing, %d extra elsewhere; next plan exit %d" % (
                          round + 1, "part-way" if killed else "(too late: it had finished)", made, devices, status,
                          left, missing, extra, plan_status), flush=True)
                results.append(status == 0 and left == 0 and missing == 0 and extra == 0 and plan_status == 0)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return all(results)


def narrow(binary, transport, state_url=None, rounds=3, devices=2000, seed=17):
    """Narrow an authoritative topic; kill the apply while its unsubscribes are in flight (FCM carries
    them out, the answer is lost); revert the manifests; apply again: no membership lost, none extra.
    The killed apply is abandoned (the manifests changed), and what it had in flight is read again."""
    rng = random.Random(seed)
    results = []
    for round in range(rounds):
        work = tempfile.mkdtemp(prefix="tm-narrow-")
        try:
            # Slow calls, so the kill lands while one is in flight.
            latency = "400" if transport == "iid" else "30"
            with Emulator(binary, PROJECT, "--latency", latency) as emulator:
                extra = ""
                if state_url:
                    extra = "state: %s\nworkspace: narrow-%d-%d\n" % (state_url, os.getpid(), round)
                tokens = make_project(work, PROJECT, devices, 2, transport, extra=extra)
                emulator.register(tokens)
                tidemark(binary, work, ["apply", "--auto-approve", "--no-refresh"], emulator.env)
                topics = os.path.join(work, "manifests", "topics.yaml")
                with open(topics) as f:
                    original = f.read()
                kept = ", ".join("d%07d" % i for i in range(0, devices, 2))
                with open(topics, "w") as f:
                    f.write(original.replace("members: [{selector: {fleet: all}}]", "members: [{devices: [%s]}]" % kept, 1))
                baseline = emulator.traffic()["requests"]
                process = subprocess.Popen([binary, "apply", "--auto-approve", "--no-refresh", "-C", work],
                                           env=emulator.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                deadline = time.time() + 60
                while process.poll() is None and time.time() < deadline and emulator.traffic()["requests"] <= baseline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.05, 0.3))
                killed = process.poll() is None
                if killed:
                    process.send_signal(signal.SIGKILL)
                process.communicate()
                time.sleep(float(latency) / 1000 + 0.2)  # what was in flight lands
                removed = devices - len(emulator.subscribers("bench-0"))
                with open(topics, "w") as f:
                    f.write(original)
                status, _, err = tidemark(binary, work, ["apply", "--auto-approve"], emulator.env, check=False)
                want = expected_members(devices, 2)
                want.pop("drift")
                missing, extra_members = compare(emulator, want)
                plan_status, _, _ = tidemark(binary, work, ["plan", "--detailed-exitcode"], emulator.env, check=False)
                print("narrow/%s%s %d: killed %s with %d of %d removals made in FCM; reverted apply exit %d; "
                      "%d missing, %d extra; next plan exit %d" % (
                          transport, "+postgres" if state_url else "", round + 1,
                          "mid-flight" if killed else "(too late: it had finished)", removed, devices // 2, status,
                          missing, extra_members, plan_status), flush=True)
                if status != 0:
                    print(err[-1500:])
                results.append(status == 0 and missing == 0 and extra_members == 0 and plan_status == 0)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return all(results)


def concurrent(binary, devices=400, topics=20):
    work = tempfile.mkdtemp(prefix="tm-lock-")
    try:
        with Emulator(binary, PROJECT, "--latency", "20") as emulator:
            tokens = make_project(work, PROJECT, devices, topics, "v1")
            emulator.register(tokens)
            print("concurrent: two applies of %d changes at once" % (devices * topics), flush=True)
            first = subprocess.Popen([binary, "apply", "--auto-approve", "--qps", "1000", "-C", work],
                                     env=emulator.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lock = os.path.join(work, ".tidemark", "state.db.lock")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (os.path.exists(lock) and open(lock).read().strip()):
                time.sleep(0.02)
            started = time.monotonic()
            status, _, err = tidemark(binary, work, ["apply", "--auto-approve"], emulator.env, check=False)
            took = time.monotonic() - started
            out, first_err = first.communicate()
            message = next((l for l in err.splitlines() if "locked" in l), err.strip())
            names_holder = ("pid %d" % first.pid) in err
            missing, extra = compare(emulator, {"bench-%d" % t: set(tokens) for t in range(topics)})
            print("  second apply: exit %d after %.2f s: %s" % (status, took, message))
            print("  first apply: exit %d; found %d missing, %d extra memberships" % (first.returncode, missing, extra))
            return status == 1 and took < 5 and names_holder and first.returncode == 0 and missing == 0 and extra == 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def shared_quota(binary, url, quota=500, devices=500, topics=4):
    """Two workspaces, one FCM project: the ledger in PostgreSQL keeps them within its quota together."""
    works = [tempfile.mkdtemp(prefix="tm-quota-") for _ in range(2)]
    suffix = str(os.getpid())
    try:
        with Emulator(binary, PROJECT, "--rate-limit", str(quota)) as emulator:
            tokens = None
            for n, work in enumerate(works):
                tokens = make_project(work, PROJECT, devices, 0, "v1",
                                      extra="state: %s\nworkspace: quota-%s-%d\n" % (url, suffix, n))
                with open(os.path.join(work, "manifests", "topics.yaml"), "a") as f:
                    for t in range(topics):
                        f.write("  - name: side%d-%d\n    members: [{selector: {fleet: all}}]\n" % (n, t))
            emulator.register(tokens)
            emulator.admin("DELETE", "traffic")
            print("shared-quota: two workspaces apply %d changes each to one project with quota %d/s" % (
                devices * topics, quota), flush=True)
            processes = [subprocess.Popen([binary, "apply", "--auto-approve", "--qps", str(quota), "-C", work],
                                          env=emulator.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                         for work in works]
            results = [p.communicate() + (p.returncode,) for p in processes]
            traffic = emulator.traffic()
            window = (traffic.get("last_change_at") or 0) - (traffic.get("first_change_at") or 0)
            rate = traffic["tokens_changed"] / window if window > 0 else 0
            statuses = [r[2] for r in results]
            print("  applies exit %s; %d changes in %.2f s: %.0f/s combined (%.0f%% of the quota); %d answered 429" % (
                statuses, traffic["tokens_changed"], window, rate, 100 * rate / quota, traffic["rate_limited"]))
            for out, err, status in results:
                if status != 0:
                    print(err[-1500:])
            return (statuses == [0, 0] and traffic["rate_limited"] == 0 and rate >= 0.9 * quota
                    and traffic["tokens_changed"] == 2 * devices * topics)
    finally:
        for work in works:
            shutil.rmtree(work, ignore_errors=True)


def long_read(binary, url, devices=200, topics=2, groups=6, latency_ms=1500):
    """A run that only reads FCM for a long time keeps its PostgreSQL lease: every answer moves its
    work. `tidemark import` and `tidemark groups export` read every device's registration, at
    latency_ms each, under a lease of 6 s that lapses after 2 s of nothing moving (`stall=2`): both
    must end well, holding the lease throughout, however long the reads take."""
    work = tempfile.mkdtemp(prefix="tm-read-")
    try:
        with Emulator(binary, PROJECT) as emulator:
            emulator.register(make_project(work, PROJECT, devices, topics, "v1"))
            with open(os.path.join(work, "manifests", "groups.yaml"), "w") as f:
                f.write("groups:\n" + "".join("  - notification_key_name: family-%d\n    members: [{device: d%07d}]\n"
                                               % (g, g) for g in range(groups)))
            tidemark(binary, work, ["apply", "--auto-approve"], emulator.env)
            emulator.admin("PUT", "config", {"faults": {"latency_ms": latency_ms}})
            stalled = url + ("&" if "?" in url else "?") + "lease=6&stall=2"
            workspace = "read-%s" % os.path.basename(work)[8:].lower()
            ok = True
            for args in (["import"], ["groups", "export", "--out", os.path.join(work, "groups.ndjson")]):
                started = time.monotonic()
                status, out, err = tidemark(binary, work, args + ["--state", stalled, "--workspace", workspace],
                                            emulator.env, check=False)
                took = time.monotonic() - started
                what = "import read %d registrations" % devices if args[0] == "import" else \
                    "groups export read %d device groups" % groups
                print("long-read: tidemark %s at %d ms an answer under lease=6&stall=2: exit %d in %.1f s" % (
                    what, latency_ms, status, took), flush=True)
                # The import must outlast the stall limit twice over, or it proves nothing.
                if status != 0 or (args[0] == "import" and took < 4):
                    print((err or out)[-1500:])
                    ok = False
            return ok
    finally:
        shutil.rmtree(work, ignore_errors=True)


def psql(url, sql):
    """Rows of `sql` run by psql against `url` (tab-separated, unaligned)."""
    out = subprocess.run(["psql", url, "-AtF", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True,
                         capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def postgres_journal(url, workspace):
    """(apply id, operations, {index: tokens journaled as sent}) of the workspace's running apply, or None."""
    rows = psql(url, "SELECT id, translate(encode(plan, 'base64'), E'\\n', '') FROM tidemark_applies WHERE workspace = '%s' "
                     "AND status = 'running' ORDER BY started_at DESC LIMIT 1" % workspace)
    if not rows:
        return None
    apply_id, plan = rows[0]
    blob = base64.b64decode(plan)

    class Tokens:
        def execute(self, _):
            return psql(url, "SELECT id, token FROM tidemark_tokens WHERE workspace = '%s'" % workspace)
    tokens = {int(i): t for i, t in Tokens().execute(None)}

    class Db:
        def execute(self, _):
            return tokens.items()
    operations = journal_operations(Db(), blob)
    done = {}
    for index, sent in psql(url, "SELECT idx, tokens_done FROM tidemark_apply_progress WHERE workspace = '%s' "
                                 "AND apply_id = '%s'" % (workspace, apply_id)):
        done[int(index)] = int(sent)
    for (index,) in psql(url, "SELECT idx FROM tidemark_apply_operations WHERE workspace = '%s' "
                              "AND apply_id = '%s'" % (workspace, apply_id)):
        done[int(index)] = len(operations[int(index)]["tokens"])
    return apply_id, operations, done


class Serve:
    """`tidemark serve` in the background, its log kept in a file."""

    def __init__(self, binary, work, env, name):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tm-serve-%s-" % name, suffix=".log", delete=False)
        self.process = subprocess.Popen([binary, "serve", "-C", work, "--listen", "127.0.0.1:0",
                                         "--claim-duration", "6s"], env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.name = name
        match = self.wait_for(r"listening on http://127\.0\.0\.1:(\d+)")
        self.port = int(match.group(1))

    def text(self):
        with open(self.log.name) as f:
            return f.read()

    def wait_for(self, pattern, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match:
                return match
            if self.process.poll() is not None:
                raise RuntimeError("serve %s exited:\n%s" % (self.name, self.text()[-3000:]))
            time.sleep(0.05)
        raise RuntimeError("serve %s: no '%s' within %d s:\n%s" % (self.name, pattern, seconds, self.text()[-3000:]))

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=5) as response:
            return response.read().decode()

    def status(self):
        return json.loads(self.get("/status"))["workspaces"][0]

    def owned(self):
        """The workspaces this replica owns now, by its /status."""
        status = json.loads(self.get("/status"))
        return sorted(w["workspace"] for w in status["workspaces"]
                      if w["phase"] not in ("standby", "stopped") and w["replica"] == status["replica"])

    def stop(self):
        stop_process(self.process, 40)
        self.log.close()
        os.unlink(self.log.name)


class Relay:
    """A TCP relay on a loopback port to `host:port`; `cut()` closes every connection through it and
    refuses new ones until `restore()`, as a lost network path to the state store would."""

    def __init__(self, host, port):
        self.target = (host, port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open = []
        self.is_cut = False
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                refused = self.is_cut
            if refused:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self.lock:
            self.is_cut = True
            sockets, self.open = self.open, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def restore(self):
        with self.lock:
            self.is_cut = False

    def stop(self):
        self.stopped = True
        self.cut()
        self.listener.close()


def serve_takeover(binary, url, devices=600, topics=30):
    """Two serve replicas, one owner: SIGKILL it mid-apply; the other finishes, replaying nothing."""
    work = tempfile.mkdtemp(prefix="tm-takeover-")
    workspace = "takeover-%d" % os.getpid()
    table = "takeover_devices_%d" % os.getpid()
    replicas = []
    prometheus = None
    try:
        with Emulator(binary, PROJECT, "--record-changes", "--latency", "15", "--auto-register") as emulator:
            separator = "&" if "?" in url else "?"
            tokens = make_project(work, PROJECT, devices, topics, "v1", extra=(
                "state: %s%slease=5\nworkspace: %s\nserve: {interval: 20s, retry_interval: 1s}\n"
                % (url, separator, workspace)))
            emulator.register(tokens)
            want = expected_members(devices, topics)
            want.pop("drift")
            # A second inventory: a PostgreSQL table, empty for now, whose rows join topic 'fresh'.
            psql(url, "CREATE TABLE %s (device_id TEXT PRIMARY KEY, token TEXT NOT NULL)" % table)
            psql(url, "INSERT INTO %s VALUES ('d-first', '%s')" % (table, token(devices)))
            with open(os.path.join(work, "tidemark.yaml"), "a") as f:
                f.write("inventory:\n  - name: app\n    postgres:\n      url_env: TAKEOVER_INVENTORY_URL\n"
                        "      query: SELECT device_id, token, 'fresh'::text AS cohort FROM %s\n" % table)
            with open(os.path.join(work, "manifests", "topics.yaml"), "a") as f:
                f.write("  - name: fresh\n    members: [{selector: {cohort: fresh}}]\n")
            env = dict(emulator.env, TAKEOVER_INVENTORY_URL=url)
            print("serve-takeover: two replicas, %d devices x %d topics on PostgreSQL state; the owner is "
                  "SIGKILLed mid-apply" % (devices, topics), flush=True)
            first = Serve(binary, work, env, "a")
            replicas.append(first)
            first.wait_for(r"workspace=%s owned by this replica" % workspace)
            second = Serve(binary, work, env, "b")
            replicas.append(second)
            second.wait_for(r"workspace=%s standby" % workspace)
            prometheus = Prometheus([first.port, second.port])
            prometheus.wait_for('sum(tidemark_workspace_leader{workspace="%s"})' % workspace,
                                lambda r: r and float(r[0]["value"][1]) == 1)
            leaders = prometheus.query('tidemark_workspace_leader{workspace="%s"} == 1' % workspace)
            leader_ok = [r["metric"]["instance"] for r in leaders] == ["127.0.0.1:%d" % first.port]
            # The owner's truth from the owner only: the standby exports no phase, owner or readiness.
            for family in ("tidemark_workspace_owner", "tidemark_workspace_phase", "tidemark_workspace_ready"):
                instances = {r["metric"]["instance"] for r in prometheus.query('%s{workspace="%s"}' % (family, workspace))}
                if instances != {"127.0.0.1:%d" % first.port}:
                    print("  %s is exported by %s, not by the owner alone" % (family, sorted(instances)), flush=True)
                    leader_ok = False
            # Killed once the journal holds finished work.
            deadline = time.monotonic() + 60
            before = None
            while time.monotonic() < deadline:
                before = postgres_journal(url, workspace)
                if before and before[2]:
                    break
                time.sleep(0.05)
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            killed_at = time.monotonic()
            before = postgres_journal(url, workspace) or before
            seen = emulator.project_admin("GET", "changes?after=0")["changes"]
            last_seen = seen[-1]["sequence"] if seen else 0
            if not before or not before[2]:
                print("  the owner finished before it could be killed mid-apply; make the apply longer")
                return False
            _, operations, done = before
            print("  killed the owner with %d of %d operations journaled" % (len(done), len(operations)), flush=True)
            second.wait_for(r"workspace=%s owned by this replica" % workspace, seconds=30)
            takeover = time.monotonic() - killed_at
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and second.status().get("phase") != "ready":
                time.sleep(0.2)
            status = second.status()
            resumed = "finishing an interrupted apply" in second.text()
            finished = set()
            for index, sent in done.items():
                op = operations[index]
                for t in op["tokens"][:sent]:
                    finished.add((op["kind"], op["target"], t))
            replays = 0
            for change in emulator.project_admin("GET", "changes?after=%d" % last_seen)["changes"]:
                for t in change["tokens"]:
                    if (change["operation"], change["topic"], t) in finished:
                        replays += 1
            missing, extra = compare(emulator, want)
            last = status.get("last") or {}
            print("  replica b owned it %.1f s after the kill (claims last 6 s, renewed every 2 s), %s the "
                  "interrupted apply from the journal and reports '%s' (%s subscribed); %d journaled changes sent "
                  "again; %d missing, %d extra memberships" % (
                      takeover, "finished" if resumed else "DID NOT FINISH", status.get("phase"),
                      last.get("subscribed"), replays, missing, extra), flush=True)
            prometheus.wait_for('tidemark_workspace_leader{workspace="%s"} == 1' % workspace,
                                lambda r: [x["metric"]["instance"] for x in r] == ["127.0.0.1:%d" % second.port])
            # The new owner exports the owner's series; nothing is left of the dead one's.
            prometheus.wait_for('tidemark_workspace_owner{workspace="%s"}' % workspace,
                                lambda r: [x["metric"]["instance"] for x in r] == ["127.0.0.1:%d" % second.port])
            down = prometheus.wait_for('up{job="tidemark"} == 0', lambda r: len(r) == 1)
            print("  Prometheus: leader %s before the kill, replica b after; the dead replica shows up == 0 (%s)" % (
                "replica a" if leader_ok else "WRONG", down[0]["metric"]["instance"]), flush=True)
            check = subprocess.run(["promtool", "check", "metrics"], input=second.get("/metrics"), text=True,
                                   capture_output=True)
            # A new install: a row in the app's table joins 'fresh' within an interval and one reconcile.
            psql(url, "INSERT INTO %s VALUES ('d-new', '%s')" % (table, token(devices + 1)))
            inserted = time.monotonic()
            joined = None
            while time.monotonic() - inserted < 60:
                if token(devices + 1) in emulator.subscribers("fresh"):
                    joined = time.monotonic() - inserted
                    break
                time.sleep(0.2)
            print("  a row inserted into the inventory table was subscribed after %s (interval 20 s); "
                  "promtool check metrics: %s" % ("%.1f s" % joined if joined is not None else "never",
                                                 "ok" if check.returncode == 0 else check.stdout + check.stderr),
                  flush=True)
            return (leader_ok and takeover <= 6 + 3 and status.get("phase") == "ready" and resumed and replays == 0
                    and missing == 0 and extra == 0 and check.returncode == 0 and joined is not None
                    and joined <= 20 + 15)
    finally:
        for replica in replicas:
            replica.stop()
        if prometheus:
            prometheus.stop()
        try:
            psql(url, "DROP TABLE IF EXISTS %s" % table)
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(work, ignore_errors=True)


def serve_spread(binary, url, workspaces=4, devices=40):
    """Two serve replicas share four workspaces: two each by handovers; the survivor of a SIGKILL takes all."""
    work = tempfile.mkdtemp(prefix="tm-spread-")
    names = ["spread-%d-%d" % (os.getpid(), i) for i in range(workspaces)]
    replicas = []
    try:
        with Emulator(binary, PROJECT, "--auto-register") as emulator:
            os.makedirs(os.path.join(work, "manifests"))
            entries = []
            for name in names:
                directory = os.path.join(work, "manifests", name)
                os.makedirs(directory)
                with open(os.path.join(directory, "topics.yaml"), "w") as f:
                    f.write("inventory:\n  devices:\n")
                    for i in range(devices):
                        f.write("    - {id: %s-d%d, token: '%s', labels: {fleet: all}}\n"
                                % (name, i, token(i, prefix=name.replace("-", ""))))
                    f.write("topics:\n  - name: %s\n    members: [{selector: {fleet: all}}]\n" % name)
                entries.append("    - {name: %s, manifests: manifests/%s}\n" % (name, name))
            with open(os.path.join(work, "tidemark.yaml"), "w") as f:
                f.write("project: %s\nbackend: emulator\nstate: %s\n"
                        "serve:\n  interval: 10m\n  workspaces:\n%s" % (PROJECT, url, "".join(entries)))
            env = emulator.env
            print("serve-spread: two replicas, %d workspaces on PostgreSQL state" % workspaces, flush=True)
            first = Serve(binary, work, env, "a")
            replicas.append(first)

            def settle(check, seconds=60):
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    owned = [r.owned() if r.process.poll() is None else [] for r in replicas]
                    if check(owned):
                        return owned
                    time.sleep(0.2)
                return None

            alone = settle(lambda owned: owned[0] == sorted(names))
            second = Serve(binary, work, env, "b")
            replicas.append(second)
            started = time.monotonic()
            spread = settle(lambda owned: len(owned[0]) == 2 and len(owned[1]) == 2)
            took = time.monotonic() - started
            time.sleep(8)
            stable = settle(lambda owned: owned == spread, seconds=1)
            handed = len(re.findall(r"handed over to this replica", second.text()))
            reconciled = len(re.findall(r"reconcile workspace=", second.text()))
            print("  alone, replica a owned %s; with replica b, %s after %.1f s (%d handovers, %d reconciles "
                  "by b, one at each takeover), %s 8 s later" % (
                      "all %d" % workspaces if alone else "NOT ALL", "2 and 2" if spread else "NEVER 2 and 2", took,
                      handed, reconciled, "unchanged" if stable else "CHANGED"), flush=True)
            second.process.send_signal(signal.SIGKILL)
            second.process.wait()
            killed = time.monotonic()
            back = settle(lambda owned: owned[0] == sorted(names), seconds=60)
            back_after = time.monotonic() - killed
            exact = all(len(emulator.subscribers(name)) == devices for name in names)
            print("  replica b SIGKILLed: replica a owned all %d again after %.1f s (claims last 6 s); every "
                  "workspace's topic %s" % (workspaces, back_after, "exact" if exact else "NOT EXACT"), flush=True)
            # The new owner reconciles each workspace it was handed once, at once (a change made while it
            # changed hands is read), and not again within the 8 s: the schedule goes on from there.
            return (alone is not None and spread is not None and stable is not None and handed == 2
                    and reconciled == 2 and back is not None and back_after <= 6 + 6 + 4 and exact)
    finally:
        for replica in replicas:
            replica.stop()
        shutil.rmtree(work, ignore_errors=True)


def state_mv(binary, url=None, rounds=12, devices=200, topics=3, seed=23):
    """`tidemark state mv` SIGKILLed at random moments while a topic goes back and forth between two
    states, and run again each time: the topic is always in exactly one of them (never lost, never in
    two), nothing is sent to FCM, and the next plans on both sides show no changes."""
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="tm-mv-")
    try:
        with Emulator(binary, PROJECT, "--record-changes") as emulator:
            emulator.register(make_project(work, PROJECT, devices, topics, "v1"))
            tidemark(binary, work, ["apply", "--auto-approve"], emulator.env)
            here = ["--state", os.path.join(work, ".tidemark", "state.db"), "--workspace", "default"]
            there = ["--state", url, "--workspace", "mv-" + os.path.basename(work)[6:].lower()] if url else \
                ["--state", os.path.join(work, ".tidemark", "state.db"), "--workspace", "moved"]
            where = "PostgreSQL" if url else "another workspace of the file"
            print("state-mv: topic bench-0 (%d subscribers) moved between SQLite and %s %d times, each run "
                  "SIGKILLed at a random moment and run again" % (devices, where, rounds), flush=True)
            sent = emulator.traffic()["tokens_changed"]

            def holders():
                found = []
                for side in (here, there):
                    status, out, _ = tidemark(binary, work, ["state", "list", "--format", "json"] + side,
                                              emulator.env, check=False)
                    topics_ = json.loads(out)["topics"] if status == 0 else []
                    found.append(any(t["name"] == "bench-0" and t["managed"] > 0 for t in topics_))
                return found

            def move(source, target):
                to = ["--to-state", target[1], "--to-workspace", target[3]]
                return [binary, "state", "mv", "topic:bench-0"] + source + to + ["-C", work]

            # One run unkilled, to know how long a move lives.
            started = time.monotonic()
            subprocess.run(move(here, there), env=emulator.env, capture_output=True, check=True)
            span = time.monotonic() - started
            side = 1
            interrupted = finished = 0
            for _ in range(rounds):
                source, target = (there, here) if side == 1 else (here, there)
                process = subprocess.Popen(move(source, target), env=emulator.env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)
                time.sleep(rng.uniform(0.0, span))
                killed = process.poll() is None
                if killed:
                    process.send_signal(signal.SIGKILL)
                process.communicate()
                again = subprocess.run(move(source, target), env=emulator.env, capture_output=True, text=True)
                if "interrupted" in again.stderr:
                    print("  a command other than the same state mv was asked to finish it:\n" + again.stderr)
                    return False
                if again.stdout.startswith("Finished the interrupted move"):
                    finished += 1
                interrupted += killed
                held = holders()
                if held.count(True) != 1:
                    print("  after a kill the topic is held by %d states (here, there) = %s\n%s%s" % (
                        held.count(True), held, again.stdout, again.stderr))
                    return False
                side = 0 if held[0] else 1
            # The topic ends where the manifests say: only there; the rest stays here.
            if side == 0:
                subprocess.run(move(here, there), env=emulator.env, capture_output=True, check=True)
            manifests = os.path.join(work, "manifests")
            theirs = os.path.join(work, "theirs")
            os.makedirs(theirs)
            shutil.copy(os.path.join(manifests, "devices.csv"), theirs)
            with open(os.path.join(manifests, "topics.yaml")) as f:
                text = f.read()
            head, rest = text.split("  - name: bench-1", 1)
            with open(os.path.join(theirs, "topics.yaml"), "w") as f:
                f.write(head)
            with open(os.path.join(manifests, "topics.yaml"), "w") as f:
                f.write(head.split("topics:")[0] + "topics:\n  - name: bench-1" + rest)
            here_plan, _, _ = tidemark(binary, work, ["plan", "--detailed-exitcode", "--refresh", "all"] + here,
                                       emulator.env, check=False)
            there_plan, out, err = tidemark(binary, work, ["plan", "--detailed-exitcode", "--refresh", "all",
                                                           "--manifests", theirs] + there, emulator.env, check=False)
            extra = emulator.traffic()["tokens_changed"] - sent
            print("  %d runs killed before they ended, %d of them finished by the next run; the topic was in "
                  "exactly one state after each; %d changes sent to FCM; next plans exit %d (here) and %d (there)"
                  % (interrupted, finished, extra, here_plan, there_plan))
            if there_plan != 0:
                print(out + err)
            return extra == 0 and here_plan == 0 and there_plan == 0 and interrupted > 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def serve_changes(binary, url, rounds=20, kills=4, devices=50, seed=29):
    """`tidemark serve` following a PostgreSQL table (changes and LISTEN) with an interval of an hour:
    each insert, update and delete is planned on its own and reaches the emulator within seconds; the
    resync (every 5 s here) finds nothing the batches missed; serve SIGKILLed right after a change and
    started again loses nothing and leaves nothing to do."""
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="tm-changes-")
    table = "changes_devices_%d" % os.getpid()
    channel = "tidemark_%s" % table
    process = None
    log = None
    try:
        with Emulator(binary, PROJECT, "--auto-register") as emulator:
            psql(url, "CREATE TABLE %s (device_id TEXT PRIMARY KEY, token TEXT NOT NULL, cohort TEXT NOT NULL, "
                      "updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())" % table)
            rows = ", ".join("('d%d', '%s', 'fresh')" % (i, token(i, prefix="chg")) for i in range(devices))
            psql(url, "INSERT INTO %s (device_id, token, cohort) VALUES %s" % (table, rows))
            os.makedirs(os.path.join(work, "manifests"))
            with open(os.path.join(work, "tidemark.yaml"), "w") as f:
                f.write("project: %s\nbackend: emulator\nrefresh: none\nserve: {interval: 1h}\n"
                        "inventory:\n  - name: app\n    postgres:\n      url_env: CHANGES_INVENTORY_URL\n"
                        "      query: SELECT device_id, token, cohort FROM %s\n"
                        "      changes: {query: 'SELECT device_id, updated_at FROM %s', cursor: updated_at}\n"
                        "      listen: %s\n      resync: 5s\n    allow_empty: true\n" % (PROJECT, table, table, channel))
            with open(os.path.join(work, "manifests", "topics.yaml"), "w") as f:
                f.write("topics:\n  - name: fresh\n    members: [{selector: {cohort: fresh}}]\n")
            env = dict(emulator.env, CHANGES_INVENTORY_URL=url)
            _, sql, _ = tidemark(binary, work, ["inventory", "triggers", "app", "--table", table,
                                                "--id-column", "device_id"], env)
            subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1"], input=sql, text=True, check=True)
            log = tempfile.NamedTemporaryFile("w+", prefix="tm-serve-changes-", suffix=".log", delete=False)

            def start():
                return subprocess.Popen([binary, "serve", "-C", work, "--listen", "127.0.0.1:0"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT)

            def members():
                return set(s.get("token") if isinstance(s, dict) else s for s in emulator.subscribers("fresh"))

            def wanted():
                return set(t for (t,) in psql(url, "SELECT token FROM %s WHERE cohort = 'fresh'" % table))

            def wait_exact(seconds=30):
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    if members() == wanted():
                        return True
                    time.sleep(0.02)
                return False

            print("serve-changes: a PostgreSQL table followed by changes and LISTEN, interval 1h; %d single-row "
                  "changes, then %d SIGKILLs right after a change" % (rounds, kills), flush=True)
            process = start()
            first = wait_exact(60)
            time.sleep(1.5)  # the follower's cursor and LISTEN are in place after the first reconcile
            latencies = []
            next_id = devices
            for round in range(rounds):
                kind = round % 3
                if kind == 0:
                    psql(url, "INSERT INTO %s (device_id, token, cohort) VALUES ('d%d', '%s', 'fresh')"
                              % (table, next_id, token(next_id, prefix="chg")))
                    next_id += 1
                else:
                    # A device that is there: every change moves the topic's membership.
                    victim = rng.choice(sorted(d for (d,) in psql(url, "SELECT device_id FROM %s" % table)))
                    if kind == 1:
                        psql(url, "UPDATE %s SET cohort = CASE cohort WHEN 'fresh' THEN 'stale' ELSE 'fresh' END, "
                                  "updated_at = clock_timestamp() WHERE device_id = '%s'" % (table, victim))
                    else:
                        psql(url, "DELETE FROM %s WHERE device_id = '%s'" % (table, victim))
                committed = time.monotonic()
                latencies.append(time.monotonic() - committed if wait_exact(30) else float("inf"))
            latencies.sort()
            median = latencies[len(latencies) // 2]
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print("  %d changes (inserts, label updates, hard deletes) reached the emulator: median %.2f s, "
                  "p99 %.2f s, worst %.2f s"
                  % (len(latencies), median, p99, latencies[-1]), flush=True)
            # The resync (every 5 s) compares the whole read with what the batches brought; the rounds
            # above may end before the first one is due, so wait for it rather than hope it came.
            resync_deadline = time.monotonic() + 20
            log.flush()
            while time.monotonic() < resync_deadline and not re.search(
                    r"resync matched the batches|had memberships the batches", open(log.name).read()):
                time.sleep(0.2)
            killed_ok = 0
            for _ in range(kills):
                psql(url, "INSERT INTO %s (device_id, token, cohort) VALUES ('d%d', '%s', 'fresh')"
                          % (table, next_id, token(next_id, prefix="chg")))
                next_id += 1
                time.sleep(rng.uniform(0, 0.4))
                process.send_signal(signal.SIGKILL)
                process.wait()
                process = start()
                if wait_exact(60):
                    killed_ok += 1
            stop_process(process, 40)
            process = None
            code, out, err = tidemark(binary, work, ["plan", "--detailed-exitcode"], env, check=False)
            text = open(log.name).read()
            woke = len(re.findall(r"reconcile started by the inventory", text))
            alone = len(re.findall(r"changed devices? planned on their own", text))
            matched = len(re.findall(r"resync matched the batches", text))
            diverged = re.findall(r".*had memberships the batches of changed devices had not brought.*", text)
            print("  SIGKILLed %d times right after a change: %d of %d ended exact after the restart; the next "
                  "plan exits %d; %d reconciles were started by the inventory, %d planned their devices on their "
                  "own; %d resyncs matched the batches, %d found a divergence"
                  % (kills, killed_ok, kills, code, woke, alone, matched, len(diverged)), flush=True)
            if code != 0:
                print(out + err)
            for line in diverged:
                print("  " + line)
            return (first and p99 <= 5 and killed_ok == kills and code == 0 and woke >= rounds
                    and alone >= rounds // 2 and matched > 0 and not diverged)
    finally:
        if process is not None:
            stop_process(process, 10)
        if log is not None:
            log.close()
            os.unlink(log.name)
        try:
            psql(url, "DROP TABLE IF EXISTS %s CASCADE" % table)
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(work, ignore_errors=True)


def serve_alerts(binary, url, devices=120, topics=4):
    """Two replicas, a real Prometheus with the shipped rules: quiet while healthy and suspended; FCM
    down and the state store cut off each raise their alert; all clear within 2 minutes of recovery."""
    work = tempfile.mkdtemp(prefix="tm-alerts-")
    workspace = "alerts-%d" % os.getpid()
    rules = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "serve", "alerts.yml")
    parsed = urllib.parse.urlsplit(url)
    relay = Relay(parsed.hostname, parsed.port)
    relayed = urllib.parse.urlunsplit(parsed._replace(
        netloc="%s@127.0.0.1:%d" % (parsed.username, relay.port) if parsed.username else "127.0.0.1:%d" % relay.port))
    replicas = []
    prometheus = None
    ok = True

    def fail(message):
        nonlocal ok
        ok = False
        print("  FAILED: " + message, flush=True)

    def quiet_for(seconds, what):
        """No alert pending or firing at any moment of `seconds`."""
        started = time.monotonic()
        seen = {}
        while time.monotonic() - started < seconds:
            for alert in prometheus.alerts():
                seen.setdefault(alert, time.monotonic() - started)
            time.sleep(1)
        if seen:
            fail("alerts while %s: %s" % (what, ", ".join("%s %s at %.0f s" % (a[0], a[1], t) for a, t in seen.items())))
        return not seen

    def wait_alert(name, state, seconds):
        """Seconds until alert `name` is in `state` (pending, or firing) for the workspace; None if never."""
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            states = {s for (a, s, w) in prometheus.alerts() if a == name and w == workspace}
            if state in states or (state == "pending" and "firing" in states):
                return time.monotonic() - started
            time.sleep(1)
        return None

    def wait_clear(seconds):
        started = time.monotonic()
        last = None
        while time.monotonic() - started < seconds:
            last = prometheus.alerts()
            if not last:
                return time.monotonic() - started
            time.sleep(1)
        fail("alerts still up %d s after recovery: %s" % (seconds, sorted(last or [])))
        return None

    def phase(replica):
        return next((w for w in json.loads(replica.get("/status"))["workspaces"] if w["workspace"] == workspace), {})

    def owner():
        for replica in replicas:
            status = phase(replica)
            if status.get("phase") not in ("standby", "stopped", "failing", None) and status.get("replica") == \
                    json.loads(replica.get("/status"))["replica"]:
                return replica
        return None

    def wait_phase(want, seconds=90):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            current = owner()
            if current and phase(current).get("phase") == want:
                return current
            time.sleep(0.5)
        fail("no replica reports '%s' within %d s (%s)" % (
            want, seconds, [phase(r).get("phase") for r in replicas]))
        return None

    try:
        with Emulator(binary, PROJECT, "--auto-register", "--latency", "5") as emulator:
            tokens = make_project(work, PROJECT, devices, topics, "v1", extra=(
                "state: %s\nworkspace: %s\nrefresh: all\n"
                "serve: {interval: 15s, retry_interval: 5s}\n" % (relayed, workspace)))
            emulator.register(tokens)
            env = dict(emulator.env, TIDEMARK_STATE_URL=relayed)
            print("serve-alerts: two replicas, %d devices x %d topics, PostgreSQL state through a relay, "
                  "Prometheus with examples/serve/alerts.yml (scrape and rules every 1 s)" % (devices, topics),
                  flush=True)
            first = Serve(binary, work, env, "a")
            replicas.append(first)
            first.wait_for(r"workspace=%s owned by this replica" % workspace)
            second = Serve(binary, work, env, "b")
            replicas.append(second)
            second.wait_for(r"workspace=%s standby" % workspace)
            prometheus = Prometheus([first.port, second.port], rules=rules)
            prometheus.wait_for('count(tidemark_workspace_info{workspace="%s"})' % workspace,
                                lambda r: r and float(r[0]["value"][1]) == 2)
            # From the first rule evaluation that saw both replicas: one made between the two first
            # scrapes (an info without its owner yet) is Prometheus starting, not the deployment.
            time.sleep(3)

            # Healthy, the first reconcile included: nothing pending, nothing firing.
            quiet_for(45, "healthy")
            if wait_phase("ready"):
                print("  healthy for 45 s (first reconcile included): no alert pending or firing", flush=True)

            # Suspended on purpose: quiet too.
            tidemark(binary, work, ["suspend"], env)
            if wait_phase("suspended", 30):
                quiet = quiet_for(30, "suspended")
                print("  suspended for 30 s: %s" % ("no alert" if quiet else "ALERTS"), flush=True)
            tidemark(binary, work, ["resume"], env)
            wait_phase("ready")

            # FCM answers 503 to everything.
            retried_before = prometheus.query(
                'sum(tidemark_fcm_requests_total{workspace="%s",outcome="retried",code="5xx"})' % workspace)
            emulator.admin("PATCH", "config", {"faults": {"http_503": 1.0}})
            down = time.monotonic()
            pending = wait_alert("TidemarkFCMFailing", "pending", 150)
            current = owner()
            status = phase(current) if current else {}
            retried = prometheus.query(
                'sum(tidemark_fcm_requests_total{workspace="%s",outcome="retried",code="5xx"})' % workspace)
            warned = current is not None and re.search(
                r" warning tidemark\.serve.*workspace=%s degraded: every request to FCM has failed" % workspace,
                current.text()) is not None
            trouble = status.get("fcm_trouble") or {}
            print("  FCM answering 503: TidemarkFCMFailing pending after %s; /status phase '%s', fcm_trouble '%s'; "
                  "retried 5xx attempts %s -> %s; a warning 'degraded' in the owner's log: %s" % (
                      "%.0f s" % pending if pending is not None else "NEVER", status.get("phase"),
                      trouble.get("answer"), retried_before and retried_before[0]["value"][1],
                      retried and retried[0]["value"][1], warned), flush=True)
            if pending is None or pending > 120:
                fail("TidemarkFCMFailing not pending within 2 minutes of the 503s")
            if status.get("phase") != "degraded" or status.get("ready") or "503" not in trouble.get("answer", ""):
                fail("/status is not degraded naming the 503: %s" % json.dumps(status)[:600])
            if not warned:
                fail("no warning 'degraded' in the owner's log")
            emulator.admin("PATCH", "config", {"faults": {}})
            cleared = wait_clear(120)
            print("  FCM answers again after %.0f s of 503s: every alert clear after %s; phase '%s'" % (
                time.monotonic() - down, "%.0f s" % cleared if cleared is not None else "NEVER",
                (phase(owner()) if owner() else {}).get("phase")), flush=True)

            # The state store cut off: both replicas up, neither can claim.
            relay.cut()
            cut = time.monotonic()
            firing = wait_alert("TidemarkNoOwner", "firing", 200)
            print("  state store cut off (replicas up): TidemarkNoOwner firing after %s (the owner's last sample counts for 1m, then for: 1m)" % (
                "%.0f s" % firing if firing is not None else "NEVER"), flush=True)
            if firing is None:
                fail("TidemarkNoOwner never fired with no replica able to claim")
            relay.restore()
            cleared = wait_clear(120)
            wait_phase("ready")
            print("  state store back after %.0f s: every alert clear after %s" % (
                time.monotonic() - cut, "%.0f s" % cleared if cleared is not None else "NEVER"), flush=True)
            if not ok:
                for replica in replicas:
                    print("--- replica %s, its log's start and end" % replica.name)
                    text = replica.text()
                    print(text[:3000] + "\n...\n" + text[-3000:])
            return ok
    finally:
        for replica in replicas:
            replica.stop()
        if prometheus:
            prometheus.stop()
        relay.stop()
        shutil.rmtree(work, ignore_errors=True)


class Hooks:
    """A webhook receiver on a loopback port: keeps every event's JSON body."""

    def __init__(self):
        import http.server
        events = self.events = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                events.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def serve_held(binary, url, north=40, south=20):
    """`serve` following a PostgreSQL table: a manifest edit narrows an authoritative topic past serve's
    default rail; it is held while a device inserted afterwards joins its other topics within 5 s;
    `tidemark status` names it; reverting the edit releases it; a person's apply during a reconcile
    releases it again with no apply_failed event."""
    work = tempfile.mkdtemp(prefix="tm-held-")
    table = "held_devices_%d" % os.getpid()
    workspace = "held-%d" % os.getpid()
    hooks = Hooks()
    serve = None
    ok = True

    def fail(message):
        nonlocal ok
        ok = False
        print("  FAILED: " + message, flush=True)

    def topics(narrow):
        with open(os.path.join(work, "manifests", "topics.yaml"), "w") as f:
            f.write("topics:\n"
                    "  - name: north\n    mode: authoritative\n"
                    "    members: [{selector: {region: north%s}}]\n"
                    "  - name: everyone\n    members: [{selector: {region: north}}, {selector: {region: south}}]\n"
                    "  - name: ios\n    members: [{selector: {platform: ios}}]\n"
                    % (", platform: ios" if narrow else ""))

    def insert(device, number, region, platform):
        psql(url, "INSERT INTO %s (device_id, token, region, platform) VALUES ('%s', '%s', '%s', '%s')"
                  % (table, device, token(number, prefix="held"), region, platform))
        return token(number, prefix="held")

    def wanted(where):
        return set(t for (t,) in psql(url, "SELECT token FROM %s WHERE %s" % (table, where)))

    def members(topic):
        return set(s.get("token") if isinstance(s, dict) else s for s in emulator.subscribers(topic))

    def held():
        return [(h["subject"]["kind"], h["subject"]["name"], h["rail"]) for h in serve.status().get("held") or []]

    def wait(condition, seconds):
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if condition():
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    try:
        with Emulator(binary, PROJECT, "--auto-register") as emulator:
            psql(url, "CREATE TABLE %s (device_id TEXT PRIMARY KEY, token TEXT NOT NULL, region TEXT NOT NULL, "
                      "platform TEXT NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())" % table)
            rows = ["('n%d', '%s', 'north', '%s')" % (i, token(i, prefix="held"), "ios" if i < 10 else "android")
                    for i in range(north)]
            rows += ["('s%d', '%s', 'south', 'android')" % (i, token(north + i, prefix="held")) for i in range(south)]
            psql(url, "INSERT INTO %s (device_id, token, region, platform) VALUES %s" % (table, ", ".join(rows)))
            os.makedirs(os.path.join(work, "manifests"))
            with open(os.path.join(work, "tidemark.yaml"), "w") as f:
                f.write("project: %s\nbackend: emulator\nrefresh: none\nstate: %s\nworkspace: %s\n"
                        "serve:\n  interval: 3s\n  retry_interval: 2s\n"
                        "  notify: [{name: hook, url: 'http://127.0.0.1:%d/hook', secret_env: HELD_HOOK_SECRET}]\n"
                        "inventory:\n  - name: app\n    postgres:\n      url_env: HELD_INVENTORY_URL\n"
                        "      query: SELECT device_id, token, region, platform FROM %s\n"
                        "      changes: {query: 'SELECT device_id, updated_at FROM %s', cursor: updated_at}\n"
                        "      listen: tidemark_%s\n      resync: 30s\n"
                        % (PROJECT, url, workspace, hooks.port, table, table, table))
            topics(narrow=False)
            env = dict(emulator.env, HELD_INVENTORY_URL=url, HELD_HOOK_SECRET="held-secret")
            _, sql, _ = tidemark(binary, work, ["inventory", "triggers", "app", "--table", table,
                                                "--id-column", "device_id"], env)
            subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1"], input=sql, text=True, check=True)
            print("serve-held: serve follows a PostgreSQL table (%d devices); an edit narrows topic 'north' past "
                  "serve's default rail" % (north + south), flush=True)
            serve = Serve(binary, work, env, "held")
            before = wanted("region = 'north'")
            if wait(lambda: members("north") == before and members("everyone") == wanted("true"), 60) is None:
                fail("the first reconcile did not subscribe every device")
                return False
            topics(narrow=True)
            took = wait(lambda: held() == [("topic", "north", "rail.unattended")], 30)
            if took is None:
                fail("topic 'north' was not held within 30 s: %s" % serve.status())
                return False
            phase = serve.status()["phase"]
            print("  held after %.1f s (rail.unattended), phase %s; north keeps its %d members"
                  % (took, phase, len(members("north"))), flush=True)
            if phase != "ready":
                fail("phase %s with a held topic, not ready" % phase)
            new = insert("late", 5000, "north", "ios")
            joined = wait(lambda: new in members("everyone") and new in members("ios"), 5)
            print("  a device inserted while 'north' is held joined its other topics in %s; north has %d members "
                  "(the %d before)" % ("%.2f s" % joined if joined is not None else "NEVER (5 s)",
                                       len(members("north")), len(before)), flush=True)
            if joined is None:
                fail("the new device did not join 'everyone' and 'ios' within 5 s")
            if members("north") != before:
                fail("the held topic changed: %d members, %d before" % (len(members("north")), len(before)))
            _, out, _ = tidemark(binary, work, ["status"], env)
            line = next((l for l in out.splitlines() if "held:" in l), "")
            print("  tidemark status: " + line.strip(), flush=True)
            if "topic:north by rail.unattended at " not in line or "manifests/topics.yaml:2:11" not in line:
                fail("tidemark status does not name the held topic and its rail:\n" + out)
            topics(narrow=False)
            released = wait(lambda: not held() and members("north") == wanted("region = 'north'"), 30)
            print("  reverting the edit released it after %s" % ("%.1f s" % released if released else "NEVER"),
                  flush=True)
            if released is None or "topic:north is released" not in serve.text():
                fail("reverting the edit did not release 'north'")
            topics(narrow=True)
            if wait(lambda: held() == [("topic", "north", "rail.unattended")], 30) is None:
                fail("'north' was not held again")
            # A person applies the held topic, slowly, while serve's reconciles keep coming.
            person = subprocess.Popen([binary, "apply", "-C", work, "--auto-approve", "--qps", "4"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1)
            insert("during", 5001, "south", "android")
            out, err = person.communicate(timeout=120)
            if person.returncode != 0:
                fail("the person's apply failed (%d):\n%s%s" % (person.returncode, out, err))
            said = "owns workspace '%s'" % workspace in err
            print("  the person's apply (%d unsubscribes at 4 a second) said serve owns the workspace: %s"
                  % (len(before) - len(wanted("region = 'north' AND platform = 'ios'")), said), flush=True)
            if not said:
                fail("tidemark apply did not say serve owns the workspace:\n" + err)
            met = [l for l in serve.text().splitlines() if "is locked by" in l]
            print("  serve met the person's lock %d times while it applied (%s)"
                  % (len(met), met[0][:160] + "…" if met else "no reconcile overlapped"), flush=True)
            if not met:
                fail("no reconcile of serve met the person's apply: the check proves nothing about it")
            again = wait(lambda: not held() and serve.text().count("topic:north is released") >= 2, 30)
            if again is None:
                fail("the person's apply did not release 'north' at the next reconcile")
            if members("north") != wanted("region = 'north' AND platform = 'ios'"):
                fail("north is not what the person applied")
            time.sleep(2)
            events = [(e["event"], e["dedupe_key"]) for e in hooks.events]
            failed = [e for e in events if e[0] == "apply_failed"]
            blocked = [e for e in events if e[0] == "blocked"]
            print("  webhook events: %s" % ", ".join("%s %s" % e for e in events), flush=True)
            if failed:
                fail("apply_failed raised: %s" % failed)
            recovered = [e for e in events if e[0] == "recovered"]
            if len(recovered) != 2:
                fail("%d recovered events, not one per release (2): a reconcile beside the held topic is no "
                     "recovery" % len(recovered))
            if not blocked or any(key != "%s/blocked/topic:north" % workspace for _, key in blocked):
                fail("no blocked event naming topic:north, or another: %s" % blocked)
            return ok
    finally:
        if serve is not None:
            serve.stop()
        hooks.stop()
        try:
            psql(url, "DROP TABLE IF EXISTS %s CASCADE" % table)
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("checks", nargs="*",
                        default=["faults", "kills", "revert", "narrow", "concurrent", "shared-quota",
                                 "serve-takeover", "serve-spread", "state-mv", "serve-changes", "serve-alerts",
                                 "serve-held", "long-read"])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="smaller fault run, for the test suite")
    args = parser.parse_args()
    results = {}
    for check in args.checks:
        if check == "faults":
            for transport in ("v1", "iid"):
                size = dict(devices=300, topics=3) if args.quick else {}
                results["faults/" + transport] = faults(args.binary, transport, **size)
        elif check == "kills":
            results["kills"] = kills(args.binary, rounds=args.kills)
        elif check == "revert":
            results["revert"] = revert(args.binary)
        elif check == "narrow":
            for transport in ("v1", "iid"):
                results["narrow/" + transport] = narrow(args.binary, transport, rounds=1 if args.quick else 3)
            url = os.environ.get("TIDEMARK_TEST_POSTGRES_URL")
            if url:
                results["narrow/postgres"] = narrow(args.binary, "iid", state_url=url, rounds=1 if args.quick else 3)
        elif check == "concurrent":
            results["concurrent"] = concurrent(args.binary)
        elif check == "state-mv":
            results["state-mv/sqlite"] = state_mv(args.binary)
            url = os.environ.get("TIDEMARK_TEST_POSTGRES_URL")
            if url:
                results["state-mv/postgres"] = state_mv(args.binary, url=url)
        elif check in ("shared-quota", "serve-takeover", "serve-spread", "serve-changes", "serve-alerts",
                       "serve-held", "long-read"):
            url = os.environ.get("TIDEMARK_TEST_POSTGRES_URL")
            run = {"shared-quota": shared_quota, "serve-takeover": serve_takeover, "serve-spread": serve_spread,
                   "serve-changes": serve_changes, "serve-alerts": serve_alerts, "serve-held": serve_held,
                   "long-read": long_read}[check]
            if url:
                results[check] = run(args.binary, url)
            elif os.environ.get("TIDEMARK_REQUIRE_POSTGRES"):
                print("%s: no PostgreSQL server (TIDEMARK_TEST_POSTGRES_URL is not set)" % check)
                results[check] = False
            else:
                print("%s: skipped, no PostgreSQL server (scripts/test.sh starts one)" % check)
        else:
            parser.error("unknown check %s" % check)
    print()
    for name, ok in results.items():
        print("%-15s %s" % (name, "OK" if ok else "FAILED"))
    sys.exit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    main()
