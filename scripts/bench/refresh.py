"""Refresh benchmark (issue 16): a converged project of N devices x T topics, 1% of devices replaced
in the inventory (new tokens), then `plan --out` and `apply PLAN` against the emulator at a write
quota of Q changes/s, once per refresh mode. Prints reads, writes, wall time and whether the end
state is exact, next to the minimum (the changes themselves at the quota)."""

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Emulator, make_project, tidemark, token  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("binary")
parser.add_argument("--devices", type=int, default=20_000)
parser.add_argument("--topics", type=int, default=10)
parser.add_argument("--qps", type=int, default=3000, help="the emulator's write quota and tidemark's --qps")
parser.add_argument("--read-qps", type=int, default=3000, help="tidemark's --read-qps")
parser.add_argument("--churn", type=float, default=0.01, help="share of devices given a new token")
parser.add_argument("--budget", default="1000", help="refresh_budget for sample")
parser.add_argument("--modes", default="all,touched,sample")
args = parser.parse_args()


def replace_devices(work, devices, replaced):
    """Rewrites the inventory with new tokens for the devices in `replaced`; returns the new token list."""
    tokens = []
    with open(os.path.join(work, "manifests", "devices.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["device_id", "token", "fleet"])
        for i in range(devices):
            t = token(i, prefix="new") if i in replaced else token(i)
            tokens.append(t)
            writer.writerow(["d%07d" % i, t, "all"])
    return tokens


rows = []
for mode in args.modes.split(","):
    work = tempfile.mkdtemp(prefix="tm-bench-refresh-")
    try:
        with Emulator(args.binary, "tidemark-bench", "--rate-limit", "0") as emulator:
            tokens = make_project(work, "tidemark-bench", args.devices, args.topics,
                                  extra="refresh_budget: %s\n" % args.budget)
            emulator.register(tokens)
            # Converge fast: subscribe through the admin API, then adopt it into state with import.
            for t in range(args.topics):
                for start in range(0, len(tokens), 10000):
                    emulator.project_admin("POST", "topics/bench-%d/subscribers" % t,
                                           {"tokens": tokens[start:start + 10000]})
            tidemark(args.binary, work, ["import"], emulator.env)
            step = max(1, int(round(1 / args.churn)))
            replaced = set(range(0, args.devices, step))
            new_tokens = replace_devices(work, args.devices, replaced)
            emulator.register([new_tokens[i] for i in sorted(replaced)])
            changes = 2 * len(replaced) * args.topics
            emulator.admin("PATCH", "config", {"rate_limit": {"per_second": args.qps}})
            emulator.admin("DELETE", "traffic")
            plan_file = os.path.join(work, "plan.json")
            flags = ["--refresh", mode, "--read-qps", str(args.read_qps)]
            started = time.monotonic()
            _, _, plan_err = tidemark(args.binary, work, ["plan", "--out", plan_file] + flags, emulator.env)
            planned = time.monotonic() - started
            _, _, apply_err = tidemark(
                args.binary, work, ["apply", "--auto-approve", "--qps", str(args.qps), plan_file]
                + (["--refresh", mode] if mode == "all" else []) + ["--read-qps", str(args.read_qps)], emulator.env)
            wall = time.monotonic() - started
            if os.environ.get("TIDEMARK_TRACE_PHASES") == "1":
                # Where the time went (see docs/limits.md): plan's phases, then apply's.
                for name, err in (("plan", plan_err), ("apply", apply_err)):
                    for line in err.splitlines():
                        if line.startswith("[phase"):
                            print("  %s %s" % (name, line), flush=True)
            traffic = emulator.traffic()
            writes = traffic["tokens_changed"]
            reads = traffic["requests"] - writes
            want = set(new_tokens)
            exact = all(set(emulator.subscribers("bench-%d" % t)) == want for t in range(args.topics))
            budget = int(args.budget) if mode == "sample" else 0
            minimum = changes / args.qps
            target = 1.2 * (changes / args.qps + budget / args.read_qps) + 2
            rows.append((mode, reads, writes, changes, planned, wall, minimum, exact, traffic["rate_limited"],
                         budget, target))
            print("%s: %s reads, %s writes (%s changes needed), plan %.2f s, plan+apply %.2f s, %d answered 429, "
                  "end state %s" % (mode, format(reads, ","), format(writes, ","), format(changes, ","), planned, wall,
                                    traffic["rate_limited"], "exact" if exact else "WRONG"), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

print()
print("%d devices x %d topics, %.0f%% of devices replaced; write quota %d/s, read rate %d/s, sample budget %s" % (
    args.devices, args.topics, 100 * args.churn, args.qps, args.read_qps, args.budget))
print("| refresh | reads | writes | requests | plan s | plan+apply s | minimum s | end state |")
print("|---|--:|--:|--:|--:|--:|--:|---|")
for (mode, reads, writes, changes, planned, wall, minimum, exact, limited, budget, target) in rows:
    print("| %s | %s | %s | %s | %.2f | %.2f | %.2f | %s |" % (
        mode, format(reads, ","), format(writes, ","), format(reads + writes, ","), planned, wall, minimum,
        "exact" if exact else "WRONG"))
ok = True
for (mode, reads, writes, changes, planned, wall, minimum, exact, limited, budget, target) in rows:
    if mode != "sample":
        ok = ok and exact
        continue
    requests_ok = reads + writes <= 1.2 * changes + budget
    wall_ok = wall <= target
    print("target (sample): requests %s <= 1.2 x %s + %d = %s -> %s; wall %.2f s <= %.2f s -> %s; end state %s" % (
        format(reads + writes, ","), format(changes, ","), budget, format(int(1.2 * changes + budget), ","),
        "OK" if requests_ok else "MISSED", wall, target, "OK" if wall_ok else "MISSED",
        "exact" if exact else "WRONG"))
    ok = ok and requests_ok and wall_ok and exact
sys.exit(0 if ok else 1)
