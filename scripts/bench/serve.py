"""`tidemark serve` at scale (issue 31), against the HTTP emulator, with the release build.

1. The first reconcile applies DEVICES x TOPICS memberships (a million by default) while /livez and
   /readyz are asked every 100 ms: their slowest answers are reported (target: under 100 ms).
2. Then CYCLES reconciles in which nothing changed: wall time and CPU of each (from the log and
   /proc), and the process's resident memory after each (it must not grow).
3. A device appended to the inventory: the delay until the emulator has it in every topic.

usage: python3 scripts/bench/serve.py BINARY [--devices 100000] [--topics 10] [--cycles 30]
                                             [--interval 5] [--qps 20000]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Emulator, make_project, token  # noqa: E402

PROJECT = "bench-serve"


def cpu_seconds(pid):
    """User and system CPU of `pid` so far, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def memory_kib(pid, field):
    """VmRSS or VmHWM of `pid`, in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--qps", type=int, default=20_000)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="tm-bench-serve-")
    log_path = os.path.join(work, "serve.log")
    try:
        with Emulator(args.binary, PROJECT, "--rate-limit", "0", "--auto-register") as emulator:
            make_project(work, PROJECT, args.devices, args.topics, "v1",
                         extra="qps: %d\nserve: {interval: %ds}\n" % (args.qps, args.interval))
            changes = args.devices * args.topics
            print("serve benchmark: %d devices x %d topics (%d memberships), interval %d s, release build" % (
                args.devices, args.topics, changes, args.interval), flush=True)
            log = open(log_path, "w")
            serve = subprocess.Popen([args.binary, "serve", "-C", work, "--listen", "127.0.0.1:0"],
                                     env=emulator.env, stdout=log, stderr=subprocess.STDOUT)

            def text():
                with open(log_path) as f:
                    return f.read()

            def reconciles():
                return re.findall(r"reconcile workspace=\S+ result=(\S+) seconds=([\d.]+)", text())

            deadline = time.monotonic() + 60
            port = None
            while time.monotonic() < deadline and port is None:
                match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text())
                port = int(match.group(1)) if match else None
                time.sleep(0.05)
            if port is None:
                print(text())
                return 1

            # 1. Health endpoints while the first reconcile applies every membership.
            slowest = {"/livez": 0.0, "/readyz": 0.0}
            latencies = []
            asked = [0]
            stop = threading.Event()

            def probe():
                while not stop.is_set():
                    for path in slowest:
                        started = time.monotonic()
                        try:
                            urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5).read()
                        except OSError:
                            pass
                        took = time.monotonic() - started
                        slowest[path] = max(slowest[path], took)
                        latencies.append(took)
                        asked[0] += 1
                    time.sleep(0.1)

            prober = threading.Thread(target=probe)
            prober.start()
            started = time.monotonic()
            while not reconciles() and serve.poll() is None and time.monotonic() - started < 3600:
                time.sleep(0.2)
            stop.set()
            prober.join()
            first = reconciles()
            if not first or first[0][0] != "success":
                print(text()[-3000:])
                return 1
            latencies.sort()
            print("first reconcile: %s in %.1f s (%.0f memberships/s); /livez and /readyz asked %d times "
                  "meanwhile: median %.1f ms, p99 %.1f ms, slowest %.1f ms (/livez) and %.1f ms (/readyz)" % (
                      first[0][0], float(first[0][1]), changes / float(first[0][1]), asked[0],
                      1000 * latencies[len(latencies) // 2], 1000 * latencies[int(len(latencies) * 0.99)],
                      1000 * slowest["/livez"], 1000 * slowest["/readyz"]), flush=True)

            # 2. Cycles with nothing changed.
            rows = []
            seen = 1
            cpu = cpu_seconds(serve.pid)
            while len(rows) < args.cycles and serve.poll() is None:
                done = reconciles()
                if len(done) > seen:
                    now_cpu = cpu_seconds(serve.pid)
                    rows.append((done[seen][0], float(done[seen][1]), now_cpu - cpu,
                                 memory_kib(serve.pid, "VmRSS")))
                    cpu = now_cpu
                    seen += 1
                time.sleep(0.05)
            peak = memory_kib(serve.pid, "VmHWM")
            walls = sorted(r[1] for r in rows)
            cpus = sorted(r[2] for r in rows)
            rss = [r[3] for r in rows]
            median = len(rows) // 2
            print("%d cycles with nothing changed: wall median %.2f s (max %.2f), CPU per cycle median %.2f s "
                  "(max %.2f; CPU counted between one cycle's end and the next, so it includes the idle wait)" % (
                      len(rows), walls[median], walls[-1], cpus[median], cpus[-1]))
            print("resident memory after cycles %s: %s MB; peak %.0f MB" % (
                ", ".join(str(n) for n in range(1, len(rss) + 1, 5)),
                ", ".join("%.0f" % (rss[n - 1] / 1024) for n in range(1, len(rss) + 1, 5)), peak / 1024))
            results = all(r[0] == "success" for r in rows)

            # 3. A new install: appended to the inventory, subscribed to every topic.
            new = token(args.devices + 1)
            with open(os.path.join(work, "manifests", "devices.csv"), "a") as f:
                f.write("d%07d,%s,all\n" % (args.devices + 1, new))
            appended = time.monotonic()
            delay = None
            while time.monotonic() - appended < 10 * args.interval + 120:
                if new in emulator.subscribers("bench-%d" % (args.topics - 1)):
                    delay = time.monotonic() - appended
                    break
                time.sleep(0.1)
            print("a device appended to the inventory was in its topics after %s (interval %d s)" % (
                "%.1f s" % delay if delay is not None else "never", args.interval))
            serve.terminate()
            serve.wait(60)
            log.close()
            healthy = slowest["/livez"] < 0.1 and slowest["/readyz"] < 0.1
            # Growth is judged over the second half of the cycles, once the allocator has settled.
            half = rss[len(rss) // 2]
            growing = rss[-1] > half * 1.05
            print("resident memory over the last %d cycles: %.0f MB to %.0f MB (%+.1f%%)" % (
                len(rss) - len(rss) // 2, half / 1024, rss[-1] / 1024, 100.0 * (rss[-1] - half) / half))
            print("verdict: health endpoints %s, memory %s, every cycle succeeded: %s" % (
                "under 100 ms" if healthy else "SLOWER than 100 ms",
                "GREW more than 5% over the second half" if growing else "steady", "yes" if results else "NO"))
            return 0 if healthy and not growing and results and delay is not None else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
