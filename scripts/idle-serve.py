#!/usr/bin/env python3
"""An idle `tidemark serve` costs the machine next to nothing.

Runs `serve` on a copy of the demo manifests (the embedded backend, SQLite state, the manifests'
files watched, no change following), waits for its first reconcile, then counts, over its threads,
the voluntary context switches it makes while nothing changes (from /proc/PID/task/*/status) and the
state-store connections it keeps open (the state database's file descriptors). Prints both and
fails when the switches reach the limit (a replica with nothing to do should wake only for its
timers: the claim's reads and renewals, the settings file; it should not poll) or when it keeps more
than one connection to its workspace's state between reconciles.

    python3 scripts/idle-serve.py BINARY [--seconds 20] [--limit 20]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def switches(pid):
    """Voluntary and involuntary context switches summed over the process's threads, and the threads."""
    voluntary = involuntary = threads = 0
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/status" % (pid, task)) as status:
                text = status.read()
        except FileNotFoundError:
            continue  # a thread that ended between the listing and the read
        threads += 1
        voluntary += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
        involuntary += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
    return voluntary, involuntary, threads


def state_connections(pid, database):
    """The process's file descriptors open on the state database itself (one per SQLite connection)."""
    count = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == database:
                count += 1
        except OSError:
            pass
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--limit", type=float, default=20, help="voluntary context switches a second")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="tidemark-idle-")
    log_path = os.path.join(work, "serve.log")
    process = None
    try:
        shutil.copytree(os.path.join(ROOT, "manifests"), os.path.join(work, "manifests"))
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [os.path.abspath(args.binary), "serve", "--allow-embedded", "--listen", "127.0.0.1:0"], cwd=work, stdout=log,
                stderr=subprocess.STDOUT)

        def said():
            with open(log_path) as log:
                return log.read()

        deadline = time.monotonic() + 120
        port = None
        while port is None:
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", said())
            if match:
                port = int(match.group(1))
            elif process.poll() is not None or time.monotonic() > deadline:
                print("serve did not start listening within 120 s; its log:\n" + said())
                return 1
            else:
                time.sleep(0.2)
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/status" % port, timeout=5) as answer:
                    workspaces = json.load(answer)["workspaces"]
                if workspaces and all(w["phase"] == "ready" for w in workspaces):
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                print("serve's workspace was not ready within 120 s; its log:\n" + said())
                return 1
            time.sleep(0.5)
        time.sleep(3)  # what the first reconcile set off settles
        before = switches(process.pid)
        time.sleep(args.seconds)
        after = switches(process.pid)
        voluntary = (after[0] - before[0]) / args.seconds
        involuntary = (after[1] - before[1]) / args.seconds
        connections = state_connections(process.pid, os.path.join(work, ".tidemark", "state.db"))
        reconciles = len(re.findall(r"reconcile workspace=", said()))
        print("idle serve (the demo: SQLite state, manifests watched, no change following), %.0f s over %d "
              "threads: %.1f voluntary context switches a second (limit %g), %.1f involuntary; %d "
              "state-store connection(s) open; %d reconcile(s) in all" % (
                  args.seconds, after[2], voluntary, args.limit, involuntary, connections, reconciles))
        if connections > 1:
            print("serve keeps %d connections to the state of its one workspace between reconciles; it "
                  "should keep at most one (each runtime it loads shares the workspace's store)" % connections)
            return 1
        if reconciles != 1:
            print("an idle serve reconciled more than once: its log:\n" + said())
            return 1
        return 0 if voluntary < args.limit else 1
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
