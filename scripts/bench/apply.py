"""Apply benchmark (issue 5): 1,000,000 membership changes to the emulator under a quota of Q
changes/s, over each transport; then a refresh of every registration. Prints the figures."""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Emulator, make_project, parse_apply, tidemark  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("binary")
parser.add_argument("--devices", type=int, default=100_000)
parser.add_argument("--topics", type=int, default=10)
parser.add_argument("--qps", default="3000,20000", help="comma-separated quotas Q")
parser.add_argument("--transports", default="v1,iid")
parser.add_argument("--state", help="a postgres:// URL: journal the applies in PostgreSQL (a workspace per run)")
args = parser.parse_args()

changes = args.devices * args.topics
rows = []
for transport in args.transports.split(","):
    for q in [int(x) for x in args.qps.split(",")]:
        work = tempfile.mkdtemp(prefix="tm-bench-apply-")
        try:
            with Emulator(args.binary, "tidemark-bench", "--rate-limit", str(q), "--auto-register") as emulator:
                extra = ("state: %s\nworkspace: bench-%d-%s-%d\n" % (args.state, os.getpid(), transport, q)
                         if args.state else "")
                tokens = make_project(work, "tidemark-bench", args.devices, args.topics, transport, extra=extra)
                emulator.register(tokens)
                print("%s, Q=%d: applying %s changes (%d devices x %d topics) ..." % (
                    transport, q, format(changes, ","), args.devices, args.topics), flush=True)
                started = time.monotonic()
                _, out, err = tidemark(args.binary, work, ["apply", "--auto-approve", "--qps", str(q)], emulator.env)
                wall = time.monotonic() - started
                subscribed, _, requests, seconds = parse_apply(out)
                traffic = emulator.traffic()
                failed = [line for line in err.splitlines() if "failed with" in line]
                minimum = changes if transport == "v1" else args.topics * -(-args.devices // 1000)
                rate = subscribed / seconds
                # The refresh: one read per registration.
                started = time.monotonic()
                status, _, refresh_err = tidemark(args.binary, work, ["plan", "--detailed-exitcode"], emulator.env)
                refresh_wall = time.monotonic() - started
                refresh_line = next((l for l in refresh_err.splitlines() if l.startswith("Refreshed")), "")
                rows.append((transport, q, subscribed, seconds, rate, requests, minimum, traffic["rate_limited"],
                             len(failed), wall, status, refresh_line, refresh_wall))
                print("  +%s subscribed in %.1f s (apply wall %.1f s): %.0f changes/s = %.1f%% of Q; %s requests "
                      "(minimum %s), %d answered 429, %d failure lines" % (
                          format(subscribed, ","), seconds, wall, rate, 100 * rate / q, format(requests, ","),
                          format(minimum, ","), traffic["rate_limited"], len(failed)), flush=True)
                print("  refresh: %s (plan wall %.1f s, exit %d after apply)" % (refresh_line, refresh_wall, status),
                      flush=True)
                for line in failed:
                    print("  " + line)
        finally:
            shutil.rmtree(work, ignore_errors=True)

print()
print("| transport | Q | changes | seconds | changes/s | % of Q | requests | minimum | 429s | failures | refresh |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (transport, q, subscribed, seconds, rate, requests, minimum, limited, failed, _, status, refresh, _) in rows:
    print("| %s | %d | %s | %.1f | %.0f | %.1f%% | %s | %s | %d | %d | %s |" % (
        transport, q, format(subscribed, ","), seconds, rate, 100 * rate / q, format(requests, ","),
        format(minimum, ","), limited, failed, refresh.replace("Refreshed ", "")))
ok = all(r[4] >= 0.9 * r[1] and r[8] == 0 and r[2] == changes for r in rows if r[1] <= 3000)
print("target (Q=3000): >= 90%% of Q, zero failed operations -> %s" % ("OK" if ok else "MISSED"))
